//! The RunSupervisor: one per release, the run's state machine.
//!
//! begin (one script: stored result? lock taken? cancel marker? then the calls list and
//! the records) → EvidenceGuard (the domain's pure decision, called here) → Repair →
//! EvidenceGuard → SemanticGuard → decision → fenced commit (one script: result or
//! CANCELLED, audit, unlock, only while this release still holds the lock) → reply.
//!
//! Each step is one future spawned in this actor's context; its answer comes back to a
//! method of the actor, which alone changes the run's state (audit, lock, [`Stage`]) and
//! starts the next step. `Cancel` drops the step in progress, aborts the children's pending
//! model calls and commits CANCELLED. The registry renews the lease and polls the marker;
//! `LockLost` from it ends the release with nothing stored. Once the commit is sent a
//! Cancel changes nothing here: the commit itself checks the marker.
//!
//! The state and its messages live here; `steps` holds the decision's steps (begin with the
//! load, EvidenceGuard, Repair, SemanticGuard) and `commit` how a release ends (Cancel, a lost
//! lock, the fenced commit, the answer). The supervisor tells the registry that started it
//! what it needs to know through [`RunNotice`], defined here, so it does not import the
//! registry.

mod commit;
mod steps;
#[cfg(test)]
pub(super) mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{
    Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, Recipient, SpawnHandle,
    WrapFuture,
};
use tokio::sync::oneshot;

use super::attempt::{AttemptContext, AttemptRecorded, AttemptStarted, CheckMarker, ModelJob};
use super::budget::BudgetActor;
use super::repair::RepairActor;
use super::semantic_guard::SemanticGuardActor;
use super::{Harness, ReleaseError, ReleaseRequest, Released, StepTimes, StopChild};
use crate::domain::audit::{Audit, BudgetUse, CancelSource, ModelRole};
use crate::domain::evidence_guard::RunEvidence;
use crate::domain::release::{cites_too_many, DraftInput};
use crate::store::{Reading, RecordLimits};
use crate::telemetry;

/// The run's children, each started when the release first needs it (a replayed, refused
/// or deterministic release starts none) and all stopped with the supervisor.
#[derive(Default)]
struct Children {
    repair: Option<Addr<RepairActor>>,
    semantic: Option<Addr<SemanticGuardActor>>,
    budget: Option<Addr<BudgetActor>>,
}

/// Where the release is. What only one stage needs lives in its variant.
enum Stage {
    /// From the start until the begin script answers: the request, and a Cancel that
    /// arrived meanwhile (applied once the script answers).
    Beginning {
        request: ReleaseRequest,
        cancel: Option<CancelSource>,
    },
    /// The lock is held and the decision runs; a Cancel aborts it.
    Deciding(Deciding),
    /// The fenced commit is out, or the answer is given; a Cancel is too late here.
    Ending,
}

/// What the decision needs while it runs.
struct Deciding {
    /// The operator's question, for the judge.
    query: String,
    /// The run's evidence as loaded, until the judge (a parked release keeps only what it
    /// releases).
    evidence: Option<Arc<RunEvidence>>,
    /// A repair ran: the marker the begin script read is no longer fresh, and no second
    /// repair.
    repaired: bool,
    /// The step in progress; cancelling it drops whatever it awaits.
    step: Option<SpawnHandle>,
    /// A model attempt sent and not yet recorded: on Cancel it is recorded as cancelled.
    attempt: Option<(AttemptStarted, Instant)>,
}

/// What this release knows of the run's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lock {
    /// Not held (never taken, freed by the commit, or lost).
    None,
    /// A step that takes or frees it failed midway: it may be held; unlock on the way out.
    Maybe,
    Held,
}

pub struct RunSupervisor {
    id: u64,
    run_id: String,
    harness: Harness,
    /// The registry that started this release, told when the lock is taken and when the
    /// release is over.
    owner: Recipient<RunNotice>,
    /// The same registry, which reads cancel markers for the run's model-calling children.
    markers: Recipient<CheckMarker>,
    /// This release's lock token (from the registry, which renews the lease with it).
    token: String,
    lock: Lock,
    audit: Audit,
    began: Instant,
    stage: Stage,
    /// Who waits for the answer (the registry's caller). Dropping it answers nothing.
    reply: Option<oneshot::Sender<Result<Released, ReleaseError>>>,
    children: Children,
    /// The registry was told the release is over.
    forgotten: bool,
    /// Where the time went so far (the answer's `Server-Timing`).
    times: StepTimes,
    /// When the step in progress (repair, judge, commit) began.
    step_began: Instant,
    /// A decision entry the commit could not append itself (Redis Cluster): appended
    /// after the caller has its answer, before the run stops.
    deferred_decision: Option<Vec<String>>,
}

impl RunSupervisor {
    pub fn new(
        id: u64,
        request: ReleaseRequest,
        token: String,
        harness: Harness,
        (owner, markers): (Recipient<RunNotice>, Recipient<CheckMarker>),
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
            run_id: request.run_id.clone(),
            harness,
            owner,
            markers,
            token,
            lock: Lock::None,
            audit,
            began: Instant::now(),
            stage: Stage::Beginning {
                request,
                cancel: None,
            },
            reply: None,
            children: Children::default(),
            forgotten: false,
            times: StepTimes::default(),
            step_began: Instant::now(),
            deferred_decision: None,
        }
    }

    /// The decision's state, when the release is deciding.
    fn deciding(&mut self) -> Option<&mut Deciding> {
        match &mut self.stage {
            Stage::Deciding(deciding) => Some(deciding),
            Stage::Beginning { .. } | Stage::Ending => None,
        }
    }

    /// The bounds on reading the agent's records, from `evidence.*`.
    fn record_limits(&self) -> RecordLimits {
        super::record_limits(&self.harness.config)
    }

    /// What a model-calling child needs, with its role's `settings` (the run's one Budget
    /// actor is started with the first of them); None when no model is configured.
    fn model_job<S>(
        &mut self,
        role: ModelRole,
        settings: S,
        ctx: &mut Context<Self>,
    ) -> Option<ModelJob<S>> {
        let client = self.harness.model.clone()?;
        let limits = self.harness.config.budget_limits();
        let budget = self
            .children
            .budget
            .get_or_insert_with(|| BudgetActor::new(limits).start())
            .clone();
        let context = AttemptContext {
            role,
            run_id: self.run_id.clone(),
            client,
            gate: self.harness.gate.clone(),
            markers: self.markers.clone(),
            budget,
            started: ctx.address().recipient(),
            recorded: ctx.address().recipient(),
        };
        let model = &self.harness.config.model;
        Some(ModelJob {
            context,
            settings,
            model_name: model.name.clone(),
            structured_output: model.structured_output,
        })
    }

    /// The Repair actor (None when no model is configured).
    fn repair_actor(&mut self, ctx: &mut Context<Self>) -> Option<Addr<RepairActor>> {
        if self.children.repair.is_none() {
            let settings = self.harness.config.repair.clone();
            let job = self.model_job(ModelRole::Repair, settings, ctx)?;
            self.children.repair = Some(RepairActor::new(job).start());
        }
        self.children.repair.clone()
    }

    /// The SemanticGuard actor (None when no model is configured).
    fn semantic_actor(&mut self, ctx: &mut Context<Self>) -> Option<Addr<SemanticGuardActor>> {
        if self.children.semantic.is_none() {
            let settings = self.harness.config.semantic_guard.clone();
            let job = self.model_job(ModelRole::Semantic, settings, ctx)?;
            self.children.semantic = Some(SemanticGuardActor::new(job).start());
        }
        self.children.semantic.clone()
    }

    /// Stops every child started; with `abort`, their pending model calls are dropped first.
    fn stop_children(&mut self, abort: bool) {
        let Children {
            repair,
            semantic,
            budget,
        } = std::mem::take(&mut self.children);
        let stop = StopChild { abort };
        if let Some(child) = budget {
            child.do_send(stop);
        }
        if let Some(child) = repair {
            child.do_send(stop);
        }
        if let Some(child) = semantic {
            child.do_send(stop);
        }
    }

    /// Spawns one step of the release; its output goes to `then`, unless a Cancel or a
    /// lost lock drops it first (only a deciding release's steps can be dropped).
    fn spawn_step<T: 'static>(
        &mut self,
        ctx: &mut Context<Self>,
        work: impl std::future::Future<Output = T> + 'static,
        then: fn(&mut Self, T, &mut Context<Self>),
    ) {
        let handle = ctx.spawn(work.into_actor(self).map(move |output, actor, ctx| {
            if let Some(deciding) = actor.deciding() {
                deciding.step = None;
            }
            then(actor, output, ctx);
        }));
        if let Some(deciding) = self.deciding() {
            deciding.step = Some(handle);
        }
    }
}

impl Actor for RunSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        super::actor_started();
        self.begin(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.stop_children(true);
        self.forget();
        super::actor_stopped();
    }
}

/// Sent by the registry when a cancel for this run arrives (HTTP, pub/sub, marker poll).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Cancel(pub CancelSource);

/// Sent by the registry when renewing this release's lease found the lock gone.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct LockLost;

/// Sent by a supervisor to the registry that started it.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct RunNotice {
    pub run_id: String,
    /// Which release of the run (a later one of the same run has another id).
    pub supervisor: u64,
    pub event: RunEvent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEvent {
    /// The begin script took the run's lock: renew its lease from now on.
    LockTaken,
    /// The release is over: forget the run.
    Ended,
}

impl Handler<AttemptStarted> for RunSupervisor {
    type Result = ();
    fn handle(&mut self, msg: AttemptStarted, _: &mut Self::Context) {
        if let Some(deciding) = self.deciding() {
            deciding.attempt = Some((msg, Instant::now()));
        }
    }
}

impl Handler<AttemptRecorded> for RunSupervisor {
    type Result = ();
    fn handle(&mut self, msg: AttemptRecorded, _: &mut Self::Context) {
        if let Some(deciding) = self.deciding() {
            deciding.attempt = None;
        }
        let a = &msg.attempt;
        telemetry::model_attempt(
            a.role,
            a.outcome,
            Duration::from_secs_f64(a.latency_ms / 1000.0),
            a.prompt_tokens,
            a.completion_tokens,
        );
        tracing::info!(
            run_id = %self.run_id,
            role = a.role.as_str(),
            attempt = a.attempt,
            result = a.outcome.as_str(),
            latency_ms = a.latency_ms,
            "model attempt"
        );
        self.audit.budget = msg.budget;
        self.audit.model_attempts.push(msg.attempt);
    }
}

impl Handler<Cancel> for RunSupervisor {
    type Result = ();
    fn handle(&mut self, msg: Cancel, ctx: &mut Self::Context) {
        match &mut self.stage {
            Stage::Beginning { cancel, .. } => {
                cancel.get_or_insert(msg.0);
            }
            Stage::Deciding(_) => self.cancelled(msg.0, ctx),
            Stage::Ending => {}
        }
    }
}

impl Handler<LockLost> for RunSupervisor {
    type Result = ();
    fn handle(&mut self, _: LockLost, ctx: &mut Self::Context) {
        if matches!(self.stage, Stage::Deciding(_)) && self.lock == Lock::Held {
            self.lock_lost(ctx);
        }
    }
}

impl RunSupervisor {
    /// Who waits for this release's answer (the caller of `StartRelease`, whose reply the
    /// registry hands over): the supervisor answers it itself, with nothing in between.
    pub fn answering(
        mut self,
        reply: Option<oneshot::Sender<Result<Released, ReleaseError>>>,
    ) -> Self {
        self.reply = reply;
        self
    }

    /// Starts the release (when the actor starts): the begin script.
    fn begin(&mut self, ctx: &mut Context<Self>) {
        self.audit.timings.started_at = chrono::Utc::now().to_rfc3339();
        // The begin script also reads the run, for the Draft's citations: a release that
        // takes the lock has its evidence in the same round trip.
        let cited = match &self.stage {
            Stage::Beginning {
                request:
                    ReleaseRequest {
                        stop_reason,
                        draft: DraftInput::Parsed(d),
                        ..
                    },
                ..
            } if !stop_reason.is_controlled_stop() => d.cited_call_ids(),
            _ => Vec::new(),
        };
        // A Draft citing too many calls fails EvidenceGuard on its own: none of its ids is
        // sent to Redis.
        let cited = match cites_too_many(
            cited.len(),
            self.harness.config.evidence.max_cited_calls.get(),
        ) {
            true => Vec::new(),
            false => cited,
        };
        let store = self.harness.store.clone();
        let run_id = self.run_id.clone();
        let token = self.token.clone();
        let config = &self.harness.config;
        let (lease, max_calls, limits) = (
            config.lock_lease(),
            config.progress.max_calls,
            self.record_limits(),
        );
        let begin = async move {
            let reading = Reading {
                cited: &cited,
                max_calls: max_calls.get(),
                limits,
            };
            store.begin(&run_id, &token, lease, reading).await
        };
        self.spawn_step(ctx, begin, Self::begun);
    }
}
