//! The SemanticGuard actor: an isolated single-turn judge. It sends the same request bytes
//! (written again for each attempt, with one nonce) at most `semantic_guard.max_attempts`
//! times (retrying only timeout, transport, parse and schema failures) within
//! `semantic_guard.total_timeout_ms`, and owns the pending call: an aborting [`super::StopChild`] drops it,
//! closing its HTTP connection.

use std::rc::Rc;
use std::time::Duration;

use actix::{Handler, Message, SpawnHandle};
use tokio::time::Instant;

use super::attempt::{
    attempt, own_pending_call, AttemptLimits, AttemptResult, ModelJob, OwnsPendingCall, PendingCall,
};
use super::StepOutcome;
use crate::config::SemanticGuardConfig;
use crate::domain::audit::AttemptOutcome;
use crate::domain::release::{Judgeable, Judgement};
use crate::model::prompts::{new_nonce, semantic_request, RequestShape};
use crate::model::verdict::parse_verdict;

pub struct SemanticGuardActor {
    job: Rc<ModelJob<SemanticGuardConfig>>,
    /// The pending judgement future; cancelling it drops the HTTP request in flight.
    pending: Option<SpawnHandle>,
}

impl SemanticGuardActor {
    pub fn new(job: ModelJob<SemanticGuardConfig>) -> Self {
        SemanticGuardActor {
            job: Rc::new(job),
            pending: None,
        }
    }
}

run_child!(SemanticGuardActor, owns_pending_call);

/// Sent by the supervisor once EvidenceGuard passed: judge this Draft against its
/// snapshot. Answers the judgement after all permitted attempts, or how it was cut short.
#[derive(Message)]
#[rtype(result = "StepOutcome<Judgement>")]
pub struct Judge {
    pub query: String,
    /// Shared with the supervisor, which builds the result from it.
    pub judged: std::sync::Arc<Judgeable>,
    /// The release read the cancel marker right before this (its begin script, with
    /// nothing but computation since): the first attempt does not read it again.
    pub marker_read: bool,
}

async fn judge(job: Rc<ModelJob<SemanticGuardConfig>>, msg: Judge) -> StepOutcome<Judgement> {
    let ModelJob {
        context,
        settings,
        model_name,
        structured_output,
    } = &*job;
    let shape = RequestShape {
        model: model_name,
        structured_output: *structured_output,
        max_output_tokens: settings.max_output_tokens.get(),
    };
    // Every attempt sends the same bytes: one nonce, and the writers are deterministic. A
    // sent request's bytes are let go as they leave (a release waiting on the model holds
    // none of them), so each attempt writes them.
    let nonce = new_nonce();
    let deadline = Instant::now() + Duration::from_millis(settings.total_timeout_ms.get());
    let attempt_timeout = Duration::from_millis(settings.attempt_timeout_ms.get());
    for number in 1..=settings.max_attempts.get() {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            break;
        }
        let limits = AttemptLimits {
            max_input_bytes: settings.max_input_bytes,
            max_output_bytes: settings.max_output_bytes,
            timeout: attempt_timeout,
            deadline,
        };
        // A request that cannot be written leaves the guard unavailable.
        let Ok(request) = semantic_request(
            &shape,
            &msg.query,
            &msg.judged.draft,
            &msg.judged.snapshot,
            &nonce,
        ) else {
            break;
        };
        let check_marker = number > 1 || !msg.marker_read;
        match attempt(
            context,
            number,
            check_marker,
            request,
            limits,
            parse_verdict,
        )
        .await
        {
            AttemptResult::Answer(verdict) if verdict.supported => {
                return StepOutcome::Done(Judgement::Supported {
                    reason: verdict.reason,
                })
            }
            AttemptResult::Answer(verdict) => {
                return StepOutcome::Done(Judgement::Unsupported {
                    reason: verdict.reason,
                })
            }
            // The server refused the request as invalid: the same bytes would be refused
            // again, so the guard is unavailable at once.
            AttemptResult::Failed(AttemptOutcome::Rejected) => break,
            AttemptResult::Failed(_) => continue,
            // The gate sent nothing: the deadline is spent, or the server asked for a pause
            // past it, or the circuit is open; a later attempt before the deadline would be
            // refused the same way, so the guard is unavailable at once.
            AttemptResult::NotSent(_) => break,
            AttemptResult::Denied => return StepOutcome::Done(Judgement::Unavailable),
            AttemptResult::Cancelled(source) => return StepOutcome::Cancelled(source),
            AttemptResult::Store(e) => return StepOutcome::Store(e),
        }
    }
    StepOutcome::Done(Judgement::Unavailable)
}

impl Handler<Judge> for SemanticGuardActor {
    type Result = PendingCall<StepOutcome<Judgement>>;

    fn handle(&mut self, msg: Judge, ctx: &mut Self::Context) -> Self::Result {
        let work = judge(self.job.clone(), msg);
        own_pending_call(self, ctx, work, StepOutcome::Done(Judgement::Unavailable))
    }
}

impl OwnsPendingCall for SemanticGuardActor {
    fn pending(&mut self) -> &mut Option<SpawnHandle> {
        &mut self.pending
    }
}
