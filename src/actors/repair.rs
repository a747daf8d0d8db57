//! The Repair actor: at most one direct, no-tool model call that may fix ids and
//! references of a concluded Draft that failed EvidenceGuard, with `max_tokens` and a byte
//! limit derived from the Draft's size (`repair.max_output_*` are the caps). It owns the
//! pending call; an aborting [`super::StopChild`] drops it.

use std::rc::Rc;
use std::time::Duration;

use actix::{Handler, Message, SpawnHandle};

use super::attempt::{
    attempt, own_pending_call, AttemptLimits, AttemptResult, ModelJob, OwnsPendingCall, PendingCall,
};
use super::StepOutcome;
use crate::config::RepairConfig;
use crate::domain::draft::Draft;
use crate::domain::evidence_guard::Violation;
use crate::domain::release::RepairFailure;
use crate::domain::repair_check::repair_output_limits;
use crate::model::prompts::{new_nonce, repair_request, RequestShape, UsableCallRef};
use crate::model::verdict::parse_repaired_draft;

pub struct RepairActor {
    job: Rc<ModelJob<RepairConfig>>,
    /// Set once the one repair has been asked for: a second request is refused.
    used: bool,
    /// The pending repair future; cancelling it drops the HTTP request in flight.
    pending: Option<SpawnHandle>,
}

impl RepairActor {
    pub fn new(job: ModelJob<RepairConfig>) -> Self {
        RepairActor {
            job: Rc::new(job),
            used: false,
            pending: None,
        }
    }
}

run_child!(RepairActor, owns_pending_call);

/// Sent by the supervisor after the first EvidenceGuard failure of a concluded Draft.
/// Answers the candidate Draft (parsed strictly, not yet compared) or why there is none.
#[derive(Message)]
#[rtype(result = "StepOutcome<Result<Draft, RepairFailure>>")]
pub struct RepairDraft {
    pub draft: Draft,
    pub violations: Vec<Violation>,
    pub usable: Vec<UsableCallRef>,
}

async fn repair(
    job: Rc<ModelJob<RepairConfig>>,
    msg: RepairDraft,
) -> StepOutcome<Result<Draft, RepairFailure>> {
    let ModelJob {
        context,
        settings,
        model_name,
        structured_output,
    } = &*job;
    let draft_bytes = serde_json::to_vec(&msg.draft).map_or(0, |v| v.len() as u64);
    let bounds = repair_output_limits(
        draft_bytes,
        settings.max_output_tokens.get(),
        settings.max_output_bytes,
    );
    let shape = RequestShape {
        model: model_name,
        structured_output: *structured_output,
        max_output_tokens: bounds.max_tokens,
    };
    let request = match repair_request(
        &shape,
        &msg.draft,
        &msg.violations,
        &msg.usable,
        &new_nonce(),
    ) {
        Ok(r) => r,
        Err(e) => {
            return StepOutcome::Done(Err(RepairFailure(format!("cannot build the request: {e}"))))
        }
    };
    // The one repair call's timeout is also its deadline: a wait for a model slot spends it.
    let timeout = Duration::from_millis(settings.timeout_ms.get());
    let limits = AttemptLimits {
        max_input_bytes: settings.max_input_bytes,
        max_output_bytes: bounds.max_bytes,
        timeout,
        deadline: tokio::time::Instant::now() + timeout,
    };
    match attempt(context, 1, true, request, limits, parse_repaired_draft).await {
        AttemptResult::Answer(draft) => StepOutcome::Done(Ok(draft)),
        AttemptResult::Failed(class) => StepOutcome::Done(Err(RepairFailure(format!(
            "the repair call failed ({})",
            class.as_str()
        )))),
        AttemptResult::NotSent(refused) => StepOutcome::Done(Err(RepairFailure(format!(
            "the repair call was not sent ({})",
            refused.reason()
        )))),
        AttemptResult::Denied => StepOutcome::Done(Err(RepairFailure(
            "a limit or the run budget denied the repair call".into(),
        ))),
        AttemptResult::Cancelled(source) => StepOutcome::Cancelled(source),
        AttemptResult::Store(e) => StepOutcome::Store(e),
    }
}

impl Handler<RepairDraft> for RepairActor {
    type Result = PendingCall<StepOutcome<Result<Draft, RepairFailure>>>;

    fn handle(&mut self, msg: RepairDraft, ctx: &mut Self::Context) -> Self::Result {
        if std::mem::replace(&mut self.used, true) {
            return PendingCall::Ready(StepOutcome::Done(Err(RepairFailure(
                "the one repair was already used".into(),
            ))));
        }
        let work = repair(self.job.clone(), msg);
        own_pending_call(
            self,
            ctx,
            work,
            StepOutcome::Done(Err(RepairFailure("the repair was aborted".into()))),
        )
    }
}

impl OwnsPendingCall for RepairActor {
    fn pending(&mut self) -> &mut Option<SpawnHandle> {
        &mut self.pending
    }
}
