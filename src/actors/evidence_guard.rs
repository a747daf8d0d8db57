//! The EvidenceGuard actor: runs the deterministic release decision of the domain for one
//! run (first decision, and the decision after a repair). It holds no state; each answer
//! carries the audit notes the domain wrote.

use std::sync::Arc;

use actix::{Actor, ActorContext, Context, Handler, Message, MessageResult};

use super::{AbortChild, StopChild};
use crate::domain::audit::Audit;
use crate::domain::draft::Draft;
use crate::domain::evidence_guard::{ResolvedRun, RunEvidence};
use crate::domain::release::{self, DraftInput, ReleasePolicy, RepairFailure, Step, StopReason};

#[derive(Default)]
pub struct EvidenceGuardActor;

impl Actor for EvidenceGuardActor {
    type Context = Context<Self>;
    fn started(&mut self, _: &mut Self::Context) {
        super::actor_started();
    }
    fn stopped(&mut self, _: &mut Self::Context) {
        super::actor_stopped();
    }
}

/// The decision and the audit notes written while making it.
pub struct Checked {
    pub step: Step,
    pub notes: Audit,
}

/// Sent by the supervisor with the run's evidence: decide the first step of the release
/// (deterministic result, repair, or semantic review).
#[derive(Message)]
#[rtype(result = "Checked")]
pub struct CheckDraft {
    pub run_id: String,
    pub stop_reason: StopReason,
    pub draft: DraftInput,
    /// Shared with the supervisor, not copied.
    pub evidence: Arc<RunEvidence>,
    pub policy: ReleasePolicy,
}

/// Sent by the supervisor after the repair: compare the candidate with the original and
/// run EvidenceGuard on it.
#[derive(Message)]
#[rtype(result = "Checked")]
pub struct CheckRepair {
    pub run_id: String,
    pub stop_reason: StopReason,
    pub original: Draft,
    pub candidate: Result<Draft, RepairFailure>,
    pub evidence: Arc<RunEvidence>,
    /// The run as judged for the original Draft (its calls are not parsed again).
    pub judged: Box<ResolvedRun>,
    pub policy: ReleasePolicy,
}

impl Handler<CheckDraft> for EvidenceGuardActor {
    type Result = MessageResult<CheckDraft>;
    fn handle(&mut self, msg: CheckDraft, _: &mut Self::Context) -> Self::Result {
        let mut notes = Audit::new(&msg.run_id, msg.stop_reason);
        let step = release::begin(
            msg.stop_reason,
            msg.draft,
            &msg.evidence,
            &msg.policy,
            &mut notes,
        );
        MessageResult(Checked { step, notes })
    }
}

impl Handler<CheckRepair> for EvidenceGuardActor {
    type Result = MessageResult<CheckRepair>;
    fn handle(&mut self, msg: CheckRepair, _: &mut Self::Context) -> Self::Result {
        let mut notes = Audit::new(&msg.run_id, msg.stop_reason);
        let step = release::after_repair_reusing(
            &msg.original,
            msg.candidate,
            &msg.evidence,
            *msg.judged,
            &msg.policy,
            &mut notes,
        );
        MessageResult(Checked { step, notes })
    }
}

impl Handler<StopChild> for EvidenceGuardActor {
    type Result = ();
    fn handle(&mut self, _: StopChild, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl Handler<AbortChild> for EvidenceGuardActor {
    type Result = ();
    fn handle(&mut self, _: AbortChild, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
