//! One model attempt under the run's guards, shared by the Repair and SemanticGuard
//! actors: the cancel marker is checked, the per-call input limit and the run budget must
//! allow it, the replica's model gate lets it through (a slot, no cooldown, a closed
//! circuit) before the role's deadline, the call is bounded by a timeout that starts when
//! it is sent, and the attempt is reported to the supervisor (audit and metrics) whatever
//! its end.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix::dev::{MessageResponse, OneshotSender};
use actix::{
    Actor, ActorContext, ActorFutureExt, Addr, AsyncContext, Context, Message, Recipient,
    SpawnHandle, WrapFuture,
};

use tokio::time::Instant;

use super::budget::{BudgetActor, Refund, Reserve, Settle, Usage};
use crate::config::StructuredOutput;
use crate::domain::audit::{
    millis, AttemptOutcome, BudgetUse, CancelSource, ModelAttempt, ModelRole,
};
use crate::domain::budget::{estimate_tokens, Cost};
use crate::model::exchange::{self, Bounds};
use crate::model::gate::Refused;
use crate::model::verdict::AnswerError;
use crate::model::{ModelClient, ModelGate, PreparedRequest};
use crate::store::StoreError;

/// An actor that owns at most one pending model call (Repair, SemanticGuard).
pub trait OwnsPendingCall: Actor<Context = Context<Self>> {
    /// The pending call's handle; an aborting `StopChild` cancels it, which drops the HTTP
    /// request.
    fn pending(&mut self) -> &mut Option<SpawnHandle>;
}

/// Spawns `work` in the actor's own context and keeps its handle, so that the actor can
/// drop it on an aborting `StopChild`; answers `work`'s output, or `aborted` if it was dropped.
pub fn own_pending_call<A, T>(
    actor: &mut A,
    ctx: &mut Context<A>,
    work: impl std::future::Future<Output = T> + 'static,
    aborted: T,
) -> PendingCall<T>
where
    A: OwnsPendingCall,
    T: 'static,
{
    let reply = Rc::new(Cell::new(None));
    let answer = Answer {
        reply: reply.clone(),
        aborted: Some(aborted),
    };
    let handle = ctx.spawn(work.into_actor(actor).map(move |output, actor: &mut A, _| {
        *actor.pending() = None;
        answer.send(output);
    }));
    *actor.pending() = Some(handle);
    PendingCall::Spawned(reply)
}

/// The answer to a message whose work is its actor's pending call: the caller's reply is
/// handed to the call's own future, which answers it when the call ends (or with the
/// `aborted` answer if the call is dropped). No task waits between the call and its caller.
pub enum PendingCall<T> {
    /// Answered at once, with no call.
    Ready(T),
    /// Where the call's future finds the caller's reply (filled as the message is handled,
    /// before the future first runs).
    Spawned(Rc<Cell<Option<OneshotSender<T>>>>),
}

impl<A, M, T> MessageResponse<A, M> for PendingCall<T>
where
    A: Actor,
    M: Message<Result = T>,
    T: 'static,
{
    fn handle(self, _: &mut A::Context, reply: Option<OneshotSender<T>>) {
        match self {
            PendingCall::Ready(answer) => {
                if let Some(reply) = reply {
                    let _ = reply.send(answer);
                }
            }
            PendingCall::Spawned(slot) => slot.set(reply),
        }
    }
}

/// Held by a pending call's future: answers the caller with the call's output, or with
/// `aborted` when the future is dropped first.
struct Answer<T> {
    reply: Rc<Cell<Option<OneshotSender<T>>>>,
    aborted: Option<T>,
}

impl<T> Answer<T> {
    fn send(self, output: T) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(output);
        }
    }
}

impl<T> Drop for Answer<T> {
    fn drop(&mut self) {
        if let (Some(reply), Some(aborted)) = (self.reply.take(), self.aborted.take()) {
            let _ = reply.send(aborted);
        }
    }
}

/// The aborting `StopChild` of a call-owning actor: drop the pending call, then stop.
pub fn abort_pending_call<A: OwnsPendingCall>(actor: &mut A, ctx: &mut Context<A>) {
    if let Some(handle) = actor.pending().take() {
        ctx.cancel_future(handle);
    }
    ctx.stop();
}

/// Sent by a model-calling child to its run's registry before an attempt that does not
/// follow the begin script's read at once: is the run's cancel marker set? Checks asked for
/// together share one pipelined round trip (several when one is already out: each waits
/// for the next).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<bool, StoreError>")]
pub struct CheckMarker(pub String);

/// Sent by a model-calling child to its supervisor just before a request goes out.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct AttemptStarted {
    pub role: ModelRole,
    pub attempt: u32,
    pub request_bytes: u64,
}

/// Sent by a model-calling child to its supervisor when an attempt ended or was denied:
/// for the audit and the metrics, with the run's budget use after it.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct AttemptRecorded {
    pub attempt: ModelAttempt,
    pub budget: BudgetUse,
}

/// What an attempt needs from its run.
#[derive(Clone)]
pub struct AttemptContext {
    pub role: ModelRole,
    pub run_id: String,
    pub client: ModelClient,
    /// The replica's model gate, shared by every run.
    pub gate: Arc<ModelGate>,
    /// The worker's registry, which reads the cancel markers asked for together in one
    /// pipeline.
    pub markers: Recipient<CheckMarker>,
    pub budget: Addr<BudgetActor>,
    pub started: Recipient<AttemptStarted>,
    pub recorded: Recipient<AttemptRecorded>,
}

/// What a model-calling actor (Repair, SemanticGuard) needs besides its message: its
/// run's [`AttemptContext`], its role's settings and the model's name and structured-output
/// mode. The actor keeps it in an `Rc` that its pending call's future shares: a release
/// waiting on the model holds it once, not copied into the future.
pub struct ModelJob<S> {
    pub context: AttemptContext,
    pub settings: S,
    pub model_name: String,
    pub structured_output: StructuredOutput,
}

/// Per-call bounds.
#[derive(Debug, Clone, Copy)]
pub struct AttemptLimits {
    pub max_input_bytes: u64,
    pub max_output_bytes: u64,
    /// The attempt's own timeout, from the moment its request is sent.
    pub timeout: Duration,
    /// The role's total deadline: a wait for the gate spends it, and the attempt's timeout
    /// never runs past it.
    pub deadline: Instant,
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptResult<T> {
    /// A valid answer.
    Answer(T),
    /// A technical failure: timeout, transport, parse or schema.
    Failed(AttemptOutcome),
    /// The gate sent nothing (the deadline passed in its queue, a cooldown past the
    /// deadline, an open circuit): a technical failure no later attempt of the role can
    /// get past before its deadline, except an open circuit's probe.
    NotSent(Refused),
    /// A limit or the run budget forbade sending.
    Denied,
    Cancelled(CancelSource),
    Store(StoreError),
}

/// Runs attempt `number`: marker (unless the caller read it just before), limit, budget,
/// send within `limits.timeout`, parse. The request is given up (its bytes are let go as
/// they are sent); a caller that tries again writes it again.
pub async fn attempt<T>(
    ctx: &AttemptContext,
    number: u32,
    check_marker: bool,
    request: PreparedRequest,
    limits: AttemptLimits,
    parse: impl Fn(&str) -> Result<T, AnswerError>,
) -> AttemptResult<T> {
    if check_marker {
        match ctx.markers.send(CheckMarker(ctx.run_id.clone())).await {
            Ok(Ok(true)) => return AttemptResult::Cancelled(CancelSource::Marker),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => return AttemptResult::Store(e),
            Err(_) => {
                return AttemptResult::Store(StoreError::unavailable(
                    "cancel_marker",
                    "the registry is gone".into(),
                ))
            }
        }
    }
    let request_bytes = request.len_bytes();
    let denied = |detail: String| ModelAttempt {
        role: ctx.role,
        attempt: number,
        outcome: AttemptOutcome::BudgetDenied,
        detail: Some(detail),
        latency_ms: 0.0,
        prompt_tokens: None,
        completion_tokens: None,
        request_bytes,
        response_bytes: 0,
        queued_ms: 0.0,
    };
    if request_bytes > limits.max_input_bytes {
        let usage = ctx.budget.send(Usage).await.unwrap_or_default();
        ctx.recorded.do_send(AttemptRecorded {
            attempt: denied(crate::domain::audit::over_input_limit(
                ctx.role,
                request_bytes,
                limits.max_input_bytes,
            )),
            budget: usage,
        });
        return AttemptResult::Denied;
    }
    let estimate = Cost {
        tokens: estimate_tokens(request_bytes) + u64::from(request.max_output_tokens),
        bytes: request_bytes + limits.max_output_bytes,
    };
    let reservation = match ctx.budget.send(Reserve(estimate)).await {
        Ok(Ok(r)) => r,
        Ok(Err(why)) => {
            let usage = ctx.budget.send(Usage).await.unwrap_or_default();
            ctx.recorded.do_send(AttemptRecorded {
                attempt: denied(why.to_string()),
                budget: usage,
            });
            return AttemptResult::Denied;
        }
        Err(_) => return AttemptResult::Denied,
    };

    ctx.started.do_send(AttemptStarted {
        role: ctx.role,
        attempt: number,
        request_bytes,
    });
    // In line for a slot (a cancel drops this future, which leaves the line at once).
    let queued = Instant::now();
    let slot = match ctx.gate.enter(limits.deadline).await {
        Ok(slot) => slot,
        Err(refused) => {
            let budget = ctx
                .budget
                .send(Refund(reservation))
                .await
                .unwrap_or_default();
            let outcome = match refused {
                Refused::Deadline { .. } => AttemptOutcome::Timeout,
                Refused::Cooldown { .. } | Refused::CircuitOpen => AttemptOutcome::Transport,
            };
            ctx.recorded.do_send(AttemptRecorded {
                attempt: ModelAttempt {
                    role: ctx.role,
                    attempt: number,
                    outcome,
                    detail: Some(refused.detail()),
                    latency_ms: 0.0,
                    prompt_tokens: None,
                    completion_tokens: None,
                    request_bytes,
                    response_bytes: 0,
                    queued_ms: millis(queued.elapsed()),
                },
                budget,
            });
            return AttemptResult::NotSent(refused);
        }
    };
    let queued = queued.elapsed();
    let began = Instant::now();
    let timeout = limits
        .timeout
        .min(limits.deadline.saturating_duration_since(began));
    let bounds = Bounds {
        timeout,
        request_bytes,
        max_output_tokens: request.max_output_tokens,
        max_output_bytes: limits.max_output_bytes,
    };
    let sending = ctx.client.send_capped(request, limits.max_output_bytes);
    let sent = tokio::time::timeout(timeout, sending).await.ok();
    let latency = began.elapsed();
    let exchange = exchange::read(sent, &bounds, parse);
    slot.finished(exchange.signal);

    let actual = match (exchange.prompt_tokens, exchange.completion_tokens) {
        (Some(p), Some(c)) => Some(Cost {
            tokens: p.saturating_add(c),
            bytes: request_bytes + exchange.response_bytes,
        }),
        _ => None,
    };
    let budget = ctx
        .budget
        .send(Settle {
            reservation,
            actual,
        })
        .await
        .unwrap_or_default();
    ctx.recorded.do_send(AttemptRecorded {
        attempt: ModelAttempt {
            role: ctx.role,
            attempt: number,
            outcome: exchange.outcome,
            detail: exchange.detail,
            latency_ms: millis(latency),
            prompt_tokens: exchange.prompt_tokens,
            completion_tokens: exchange.completion_tokens,
            request_bytes,
            response_bytes: exchange.response_bytes,
            queued_ms: millis(queued),
        },
        budget,
    });
    match exchange.answer {
        Some(value) => AttemptResult::Answer(value),
        None => AttemptResult::Failed(exchange.outcome),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix::Handler;

    /// An actor whose one call waits on `gate` (or forever without one).
    #[derive(Default)]
    struct Caller {
        pending: Option<SpawnHandle>,
    }

    impl Actor for Caller {
        type Context = Context<Self>;
    }

    impl OwnsPendingCall for Caller {
        fn pending(&mut self) -> &mut Option<SpawnHandle> {
            &mut self.pending
        }
    }

    #[derive(Message)]
    #[rtype(result = "u32")]
    struct Call(Option<tokio::sync::oneshot::Receiver<u32>>);

    impl Handler<Call> for Caller {
        type Result = PendingCall<u32>;
        fn handle(&mut self, msg: Call, ctx: &mut Self::Context) -> PendingCall<u32> {
            match msg.0 {
                None => PendingCall::Ready(1),
                Some(gate) => {
                    own_pending_call(self, ctx, async move { gate.await.unwrap_or(2) }, 0)
                }
            }
        }
    }

    #[derive(Message)]
    #[rtype(result = "()")]
    struct Abort;

    impl Handler<Abort> for Caller {
        type Result = ();
        fn handle(&mut self, _: Abort, ctx: &mut Self::Context) {
            abort_pending_call(self, ctx);
        }
    }

    #[actix_rt::test]
    async fn a_pending_call_answers_its_caller_itself() {
        let caller = Caller::default().start();
        assert_eq!(caller.send(Call(None)).await.unwrap(), 1);
        let (open, gate) = tokio::sync::oneshot::channel();
        let answer = caller.send(Call(Some(gate)));
        open.send(42).unwrap();
        assert_eq!(answer.await.unwrap(), 42);
    }

    #[actix_rt::test]
    async fn an_aborted_call_answers_its_aborted_value() {
        let caller = Caller::default().start();
        let (_open, gate) = tokio::sync::oneshot::channel();
        let answer = actix_rt::spawn(caller.send(Call(Some(gate))));
        tokio::task::yield_now().await;
        caller.send(Abort).await.unwrap();
        assert_eq!(answer.await.unwrap().unwrap(), 0);
    }
}
