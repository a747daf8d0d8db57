//! The RunSupervisor: one per release, the run's state machine.
//!
//! stored result? cancelled? → in-flight lock → load evidence → EvidenceGuard (via its
//! actor) → Repair → EvidenceGuard → SemanticGuard → decision → store result and audit
//! together → unlock → reply. The whole pipeline is one future spawned in this actor's
//! context; `Cancel` drops it, aborts the children's pending model calls, stores and
//! answers CANCELLED. Once a result is decided (publishing), a late Cancel changes nothing.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use actix::{
    Actor, ActorContext, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message,
    ResponseFuture, SpawnHandle, WrapFuture,
};
use tokio::sync::oneshot;
use tracing::Instrument;

use super::budget::BudgetActor;
use super::evidence_guard::{CheckDraft, CheckRepair, Checked, EvidenceGuardActor};
use super::registry::{RunEnded, RunRegistry};
use super::repair::{RepairActor, RepairDraft};
use super::semantic_guard::{Judge, SemanticGuardActor};
use super::{AbortChild, Harness, ReleaseError, ReleaseRequest, Released, StepOutcome, StopChild};
use crate::domain::audit::{
    millis, AttemptOutcome, Audit, BudgetUse, CancelSource, ModelAttempt, ModelRole, RepairAudit,
};
use crate::domain::release::{after_judgement, DraftInput, Judgement, ReleaseResult, Step};
use crate::model::prompts::UsableCallRef;
use crate::telemetry;

/// The run's children, started with the supervisor and stopped with it.
struct Children {
    evidence_guard: Addr<EvidenceGuardActor>,
    repair: Option<Addr<RepairActor>>,
    semantic: Option<Addr<SemanticGuardActor>>,
    budget: Addr<BudgetActor>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for `Run`.
    Idle,
    /// The pipeline runs; a Cancel aborts it.
    Running,
    /// A result is decided and being stored; Cancel is too late.
    Publishing,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LockState {
    None,
    /// SET NX was sent; whether it took is unknown until it answers.
    Requested(String),
    Held(String),
}

/// What the pipeline ends with.
enum Decided {
    /// A stored result of an earlier release (no new release ran, nothing is written).
    Stored(String),
    Cancelled(CancelSource),
    Result(Box<ReleaseResult>),
}

pub struct RunSupervisor {
    id: u64,
    request: Option<ReleaseRequest>,
    harness: Harness,
    registry: Addr<RunRegistry>,
    audit: Rc<RefCell<Audit>>,
    lock: Rc<RefCell<LockState>>,
    began: Instant,
    phase: Phase,
    /// The pipeline future; cancelling it drops whatever it awaits.
    pipeline: Option<SpawnHandle>,
    /// Who waits for the answer (the registry's caller). Dropping it answers nothing.
    reply: Option<oneshot::Sender<Result<Released, ReleaseError>>>,
    children: Option<Children>,
    /// A model attempt sent and not yet recorded: on Cancel it is recorded as cancelled.
    attempt_in_flight: Option<(AttemptStarted, Instant)>,
}

impl RunSupervisor {
    pub fn new(
        id: u64,
        request: ReleaseRequest,
        harness: Harness,
        registry: Addr<RunRegistry>,
    ) -> Self {
        let mut audit = Audit::new(&request.run_id, request.stop_reason);
        let limits = harness.config.budget_limits();
        audit.budget = BudgetUse {
            max_model_calls: limits.max_model_calls,
            max_tokens: limits.max_tokens,
            max_bytes: limits.max_bytes,
            ..BudgetUse::default()
        };
        RunSupervisor {
            id,
            request: Some(request),
            harness,
            registry,
            audit: Rc::new(RefCell::new(audit)),
            lock: Rc::new(RefCell::new(LockState::None)),
            began: Instant::now(),
            phase: Phase::Idle,
            pipeline: None,
            reply: None,
            children: None,
            attempt_in_flight: None,
        }
    }

    fn run_id(&self) -> String {
        self.audit.borrow().run_id.clone()
    }

    fn start_children(&mut self, ctx: &mut Context<Self>) {
        let config = &self.harness.config;
        let budget = BudgetActor::new(config.budget_limits()).start();
        let attempt_context =
            |role: ModelRole, client: &crate::model::ModelClient| super::attempt::AttemptContext {
                role,
                run_id: self.run_id(),
                client: client.clone(),
                store: self.harness.store.clone(),
                budget: budget.clone(),
                started: ctx.address().recipient(),
                recorded: ctx.address().recipient(),
            };
        let (repair, semantic) = match &self.harness.model {
            Some(client) => (
                Some(
                    RepairActor::new(
                        attempt_context(ModelRole::Repair, client),
                        config.repair.clone(),
                        config.model.name.clone(),
                        config.model.structured_output,
                    )
                    .start(),
                ),
                Some(
                    SemanticGuardActor::new(
                        attempt_context(ModelRole::Semantic, client),
                        config.semantic_guard.clone(),
                        config.model.name.clone(),
                        config.model.structured_output,
                    )
                    .start(),
                ),
            ),
            None => (None, None),
        };
        self.children = Some(Children {
            evidence_guard: EvidenceGuardActor.start(),
            repair,
            semantic,
            budget,
        });
    }

    fn stop_children(&mut self, abort: bool) {
        if let Some(children) = self.children.take() {
            if abort {
                children.evidence_guard.do_send(AbortChild);
                children.budget.do_send(AbortChild);
                if let Some(r) = children.repair {
                    r.do_send(AbortChild);
                }
                if let Some(s) = children.semantic {
                    s.do_send(AbortChild);
                }
            } else {
                children.evidence_guard.do_send(StopChild);
                children.budget.do_send(StopChild);
                if let Some(r) = children.repair {
                    r.do_send(StopChild);
                }
                if let Some(s) = children.semantic {
                    s.do_send(StopChild);
                }
            }
        }
    }

    /// The pipeline ended (not by Cancel).
    fn decided(&mut self, decided: Result<Decided, ReleaseError>, ctx: &mut Context<Self>) {
        self.pipeline = None;
        match decided {
            Ok(Decided::Stored(json)) => {
                let answer = serde_json::from_str::<ReleaseResult>(&json)
                    .map(|result| Released {
                        result,
                        json,
                        replayed: true,
                    })
                    .map_err(|e| ReleaseError::StoredResultUnreadable(e.to_string()));
                self.finish(answer, ctx);
            }
            Ok(Decided::Cancelled(source)) => self.cancelled(source, ctx),
            Ok(Decided::Result(result)) => self.publish(*result, None, ctx),
            Err(e) => self.finish(Err(e), ctx),
        }
    }

    /// Cancel, by any route, while the pipeline runs.
    fn cancelled(&mut self, source: CancelSource, ctx: &mut Context<Self>) {
        if let Some(handle) = self.pipeline.take() {
            ctx.cancel_future(handle);
        }
        self.stop_children(true);
        if let Some((started, at)) = self.attempt_in_flight.take() {
            let attempt = ModelAttempt {
                role: started.role,
                attempt: started.attempt,
                outcome: AttemptOutcome::Cancelled,
                detail: Some("the run was cancelled while the call was pending".into()),
                latency_ms: millis(at.elapsed()),
                prompt_tokens: None,
                completion_tokens: None,
                request_bytes: started.request_bytes,
                response_bytes: 0,
            };
            telemetry::model_attempt(attempt.role, attempt.outcome, at.elapsed(), None, None);
            self.audit.borrow_mut().model_attempts.push(attempt);
        }
        let run_id = self.run_id();
        self.publish(ReleaseResult::cancelled(&run_id), Some(source), ctx);
    }

    /// Stores the result and audit under the in-flight lock (taking it first if a cancel came
    /// before this release held it), frees the lock, answers.
    fn publish(
        &mut self,
        result: ReleaseResult,
        cancel: Option<CancelSource>,
        ctx: &mut Context<Self>,
    ) {
        self.phase = Phase::Publishing;
        let total = self.began.elapsed();
        let json = match serde_json::to_string(&result) {
            Ok(json) => json,
            Err(e) => return self.finish(Err(ReleaseError::Internal(e.to_string())), ctx),
        };
        let audit_json = {
            let mut audit = self.audit.borrow_mut();
            audit.outcome = Some(result.outcome);
            audit.fallback_type = result.fallback_type;
            audit.cancelled_by = cancel;
            let model_wait = audit.model_wait_ms();
            audit.timings.total_ms = millis(total);
            audit.timings.model_wait_ms = model_wait;
            audit.timings.overhead_ms = (millis(total) - model_wait).max(0.0);
            for v in audit.violations.iter() {
                telemetry::guard_violation(v.rule);
            }
            for e in audit.excluded_references.iter() {
                telemetry::guard_violation(e.rule);
            }
            if let Some(repair) = &audit.repair {
                for v in &repair.violations_after {
                    telemetry::guard_violation(v.rule);
                }
            }
            serde_json::to_string(&*audit).unwrap_or_else(|_| "{}".into())
        };
        let store = self.harness.store.clone();
        let run_id = self.run_id();
        let lock = std::mem::replace(&mut *self.lock.borrow_mut(), LockState::None);
        let overhead = total.saturating_sub(Duration::from_secs_f64(
            self.audit.borrow().model_wait_ms() / 1000.0,
        ));
        let released = Released {
            result,
            json: json.clone(),
            replayed: false,
        };
        let lock_ttl = self.harness.config.lock_ttl();
        let work = async move {
            let token = match lock {
                LockState::Held(token) => token,
                // A cancel that came before this release held the lock: take it now so the
                // CANCELLED result is stored like any other. If another release holds the
                // run, that release stores its own result; a result stored meanwhile stands.
                other => {
                    if let LockState::Requested(token) = other {
                        let _ = store.unlock(&run_id, &token).await;
                    }
                    let token = new_lock_token();
                    if !matches!(store.try_lock(&run_id, &token, lock_ttl).await, Ok(true)) {
                        return Ok(());
                    }
                    if !matches!(store.get_result(&run_id).await, Ok(None)) {
                        let _ = store.unlock(&run_id, &token).await;
                        return Ok(());
                    }
                    token
                }
            };
            let stored = store.put_result(&run_id, &json, &audit_json).await;
            let _ = store.unlock(&run_id, &token).await;
            stored.map_err(ReleaseError::from)
        };
        ctx.spawn(work.into_actor(self).map(move |stored, actor, ctx| {
            let answer = stored.map(|()| {
                telemetry::release_finished(
                    released.result.outcome,
                    released.result.fallback_type,
                    total,
                    overhead,
                );
                if let Some(source) = cancel {
                    telemetry::cancelled(source);
                }
                released
            });
            actor.finish(answer, ctx);
        }));
    }

    /// Answers the caller and stops the run, freeing a lock the release still holds
    /// (publishing has already freed its own).
    fn finish(&mut self, answer: Result<Released, ReleaseError>, ctx: &mut Context<Self>) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(answer);
        }
        self.stop_children(false);
        let lock = std::mem::replace(&mut *self.lock.borrow_mut(), LockState::None);
        match lock {
            LockState::Held(token) | LockState::Requested(token) => {
                let store = self.harness.store.clone();
                let run_id = self.run_id();
                ctx.spawn(
                    async move {
                        let _ = store.unlock(&run_id, &token).await;
                    }
                    .into_actor(self)
                    .map(|_, _, ctx| ctx.stop()),
                );
            }
            LockState::None => ctx.stop(),
        }
    }
}

impl Actor for RunSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        super::actor_started();
        self.start_children(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.stop_children(true);
        self.registry.do_send(RunEnded {
            run_id: self.run_id(),
            supervisor: self.id,
        });
        super::actor_stopped();
    }
}

/// Sent by the registry once: run the release. Answers its result (or why there is none).
#[derive(Message)]
#[rtype(result = "Result<Released, ReleaseError>")]
pub struct Run;

/// Sent by the registry when a cancel for this run arrives (HTTP, pub/sub).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Cancel(pub CancelSource);

/// Sent by a model-calling child just before a request goes out.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct AttemptStarted {
    pub role: ModelRole,
    pub attempt: u32,
    pub request_bytes: u64,
}

/// Sent by a model-calling child when an attempt ended or was denied: for the audit and
/// the metrics, with the run's budget use after it.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct AttemptRecorded {
    pub attempt: ModelAttempt,
    pub budget: BudgetUse,
}

impl Handler<AttemptStarted> for RunSupervisor {
    type Result = ();
    fn handle(&mut self, msg: AttemptStarted, _: &mut Self::Context) {
        self.attempt_in_flight = Some((msg, Instant::now()));
    }
}

impl Handler<AttemptRecorded> for RunSupervisor {
    type Result = ();
    fn handle(&mut self, msg: AttemptRecorded, _: &mut Self::Context) {
        self.attempt_in_flight = None;
        let a = &msg.attempt;
        telemetry::model_attempt(
            a.role,
            a.outcome,
            Duration::from_secs_f64(a.latency_ms / 1000.0),
            a.prompt_tokens,
            a.completion_tokens,
        );
        tracing::info!(
            run_id = %self.run_id(),
            role = a.role.as_str(),
            attempt = a.attempt,
            result = a.outcome.as_str(),
            latency_ms = a.latency_ms,
            "model attempt"
        );
        let mut audit = self.audit.borrow_mut();
        audit.budget = msg.budget;
        audit.model_attempts.push(msg.attempt);
    }
}

impl Handler<Cancel> for RunSupervisor {
    type Result = ();
    fn handle(&mut self, msg: Cancel, ctx: &mut Self::Context) {
        if self.phase == Phase::Running {
            tracing::info!(run_id = %self.run_id(), source = msg.0.as_str(), "release cancelled");
            self.cancelled(msg.0, ctx);
        }
    }
}

impl Handler<Run> for RunSupervisor {
    type Result = ResponseFuture<Result<Released, ReleaseError>>;

    fn handle(&mut self, _: Run, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        let Some(request) = self.request.take() else {
            return Box::pin(async { Err(ReleaseError::Internal("Run sent twice".into())) });
        };
        self.reply = Some(tx);
        self.phase = Phase::Running;
        let Some(children) = self.children.as_ref() else {
            return Box::pin(async { Err(ReleaseError::Internal("children not started".into())) });
        };
        let span = tracing::info_span!("release", run_id = %request.run_id);
        let work = pipeline(
            request,
            self.harness.clone(),
            children.evidence_guard.clone(),
            children.repair.clone(),
            children.semantic.clone(),
            self.audit.clone(),
            self.lock.clone(),
        )
        .instrument(span);
        let handle = ctx.spawn(
            work.into_actor(self)
                .map(|decided, actor, ctx| actor.decided(decided, ctx)),
        );
        self.pipeline = Some(handle);
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(ReleaseError::Internal(
                    "the release ended without an answer".into(),
                ))
            })
        })
    }
}

/// A fresh in-flight lock token: only its holder may free the lock.
fn new_lock_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn mailbox(e: actix::MailboxError) -> ReleaseError {
    ReleaseError::Internal(format!("a run actor is gone: {e}"))
}

/// The release itself. It touches actor state only through the shared audit and lock cells.
async fn pipeline(
    request: ReleaseRequest,
    harness: Harness,
    evidence_guard: Addr<EvidenceGuardActor>,
    repair: Option<Addr<RepairActor>>,
    semantic: Option<Addr<SemanticGuardActor>>,
    audit: Rc<RefCell<Audit>>,
    lock: Rc<RefCell<LockState>>,
) -> Result<Decided, ReleaseError> {
    let store = &harness.store;
    let config = &harness.config;
    let run_id = request.run_id.as_str();
    audit.borrow_mut().timings.started_at = chrono::Utc::now().to_rfc3339();

    // A stored result is answered without the lock; everything else (a CANCELLED result
    // included) is decided and stored under it.
    if let Some(stored) = store.preflight(run_id).await?.stored_result {
        return Ok(Decided::Stored(stored));
    }
    let token = new_lock_token();
    *lock.borrow_mut() = LockState::Requested(token.clone());
    if !store.try_lock(run_id, &token, config.lock_ttl()).await? {
        *lock.borrow_mut() = LockState::None;
        return Err(ReleaseError::InFlight);
    }
    *lock.borrow_mut() = LockState::Held(token);
    // Another replica may have finished, or a cancel landed, between the check and the lock.
    let preflight = store.preflight(run_id).await?;
    if let Some(stored) = preflight.stored_result {
        return Ok(Decided::Stored(stored));
    }
    if preflight.cancelled {
        return Ok(Decided::Cancelled(CancelSource::Marker));
    }

    let cited = match &request.draft {
        DraftInput::Parsed(d) if !request.stop_reason.is_controlled_stop() => d.cited_call_ids(),
        _ => Vec::new(),
    };
    let mut evidence = store
        .load_evidence(run_id, &cited, config.progress.max_calls)
        .await?;
    let policy = config.release_policy();
    let Checked { step, notes } = evidence_guard
        .send(CheckDraft {
            run_id: run_id.to_string(),
            stop_reason: request.stop_reason,
            draft: request.draft,
            evidence: evidence.clone(),
            policy,
        })
        .await
        .map_err(mailbox)?;
    audit.borrow_mut().absorb(notes);

    let step = match step {
        Step::Repair { draft, violations } => match &repair {
            None => {
                audit.borrow_mut().repair =
                    Some(RepairAudit::not_run("no model is configured".into()));
                Step::Finish(ReleaseResult::evidence_validation_failed(run_id))
            }
            Some(repair) => {
                let run = evidence.resolve(&[]);
                let usable = run
                    .usable_in_call_order()
                    .into_iter()
                    .map(|c| UsableCallRef {
                        tool_call_id: c.tool_call_id.clone(),
                        tool: c.tool,
                        evidence_status: c.evidence_status,
                    })
                    .collect();
                let candidate = match repair
                    .send(RepairDraft {
                        draft: draft.clone(),
                        violations,
                        usable,
                    })
                    .await
                    .map_err(mailbox)?
                {
                    StepOutcome::Done(candidate) => candidate,
                    StepOutcome::Cancelled(source) => return Ok(Decided::Cancelled(source)),
                    StepOutcome::Store(e) => return Err(e.into()),
                };
                if let Ok(candidate) = &candidate {
                    store
                        .complete_evidence(&mut evidence, &candidate.cited_call_ids())
                        .await?;
                }
                let Checked { step, notes } = evidence_guard
                    .send(CheckRepair {
                        run_id: run_id.to_string(),
                        stop_reason: request.stop_reason,
                        original: draft,
                        candidate,
                        evidence,
                        policy,
                    })
                    .await
                    .map_err(mailbox)?;
                audit.borrow_mut().absorb(notes);
                step
            }
        },
        other => other,
    };

    let result = match step {
        Step::Finish(result) => result,
        // after_repair never asks for a second repair; fail closed if it ever did.
        Step::Repair { .. } => ReleaseResult::evidence_validation_failed(run_id),
        Step::Judge(judged) => {
            let judgement = match &semantic {
                None => Judgement::Unavailable,
                Some(semantic) => match semantic
                    .send(Judge {
                        query: request.query.clone(),
                        judged: (*judged).clone(),
                    })
                    .await
                    .map_err(mailbox)?
                {
                    StepOutcome::Done(judgement) => judgement,
                    StepOutcome::Cancelled(source) => return Ok(Decided::Cancelled(source)),
                    StepOutcome::Store(e) => return Err(e.into()),
                },
            };
            after_judgement(run_id, judgement, &judged, &mut audit.borrow_mut())
        }
    };
    Ok(Decided::Result(Box::new(result)))
}
