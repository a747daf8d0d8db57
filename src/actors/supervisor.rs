//! The RunSupervisor: one per release, the run's state machine.
//!
//! begin (one script: stored result? lock taken? cancel marker?) → load (one script:
//! marker, calls list, records) → EvidenceGuard (its actor) → Repair → EvidenceGuard →
//! SemanticGuard → decision → fenced commit (one script: result or CANCELLED, audit,
//! unlock, only while this release still holds the lock) → reply.
//!
//! Each step is one future spawned in this actor's context; its answer comes back to a
//! method of the actor, which alone changes the run's state (audit, lock, phase) and starts
//! the next step. `Cancel` drops the step in progress, aborts the children's pending model
//! calls and commits CANCELLED. The registry renews the lease and polls the marker;
//! `LockLost` from it ends the release with nothing stored. Once the commit is sent a
//! Cancel changes nothing here: the commit itself checks the marker.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{
    Actor, ActorContext, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message,
    ResponseFuture, SpawnHandle, WrapFuture,
};
use tokio::sync::oneshot;

use super::budget::BudgetActor;
use super::evidence_guard::{CheckDraft, CheckRepair, Checked, EvidenceGuardActor};
use super::registry::{LockTaken, RunEnded, RunRegistry};
use super::repair::{RepairActor, RepairDraft};
use super::semantic_guard::{Judge, SemanticGuardActor};
use super::{AbortChild, Harness, ReleaseError, ReleaseRequest, Released, StepOutcome, StopChild};
use crate::domain::audit::{
    millis, AttemptOutcome, Audit, AuditEnd, BudgetUse, CancelSource, ModelAttempt, ModelRole,
    RepairAudit,
};
use crate::domain::draft::Draft;
use crate::domain::evidence_guard::{ResolvedRun, RunEvidence, Violation};
use crate::domain::release::{
    after_judgement, DraftInput, Judgeable, Judgement, ReleaseResult, Step,
};
use crate::model::prompts::UsableCallRef;
use crate::store::{lock_holder, Begin, Commit, Committed, Loaded, StoreError};
use crate::telemetry;

/// The run's children, each started when the release first needs it (a replayed or
/// refused release starts none, a deterministic one only the EvidenceGuard) and all
/// stopped with the supervisor.
#[derive(Default)]
struct Children {
    evidence_guard: Option<Addr<EvidenceGuardActor>>,
    repair: Option<Addr<RepairActor>>,
    semantic: Option<Addr<SemanticGuardActor>>,
    budget: Option<Addr<BudgetActor>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for `Run`.
    Idle,
    /// The begin script is out; a Cancel is remembered and applied once it answers.
    Beginning,
    /// The lock is held and the decision runs; a Cancel aborts it.
    Deciding,
    /// The fenced commit is out (or the answer is given); Cancel is too late here.
    Committing,
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

/// How the repair step ended: cancelled, or the EvidenceGuard's decision on the candidate
/// (with the evidence, completed with the records the candidate cites).
enum Repaired {
    Cancelled(CancelSource),
    Checked(Box<Checked>, Arc<RunEvidence>),
}

pub struct RunSupervisor {
    id: u64,
    run_id: String,
    request: Option<ReleaseRequest>,
    harness: Harness,
    registry: Addr<RunRegistry>,
    /// This release's lock token (from the registry, which renews the lease with it).
    token: String,
    lock: Lock,
    audit: Audit,
    began: Instant,
    phase: Phase,
    /// A cancel that arrived while the begin script was out.
    cancel_requested: Option<CancelSource>,
    /// The step in progress; cancelling it drops whatever it awaits.
    step: Option<SpawnHandle>,
    /// Who waits for the answer (the registry's caller). Dropping it answers nothing.
    reply: Option<oneshot::Sender<Result<Released, ReleaseError>>>,
    children: Children,
    /// A model attempt sent and not yet recorded: on Cancel it is recorded as cancelled.
    attempt_in_flight: Option<(AttemptStarted, Instant)>,
    /// The operator's question, for the judge.
    query: String,
    /// The run's evidence as loaded, shared with the EvidenceGuard actor (never copied).
    evidence: Option<Arc<RunEvidence>>,
    /// A repair ran: the marker the load read is no longer fresh, and no second repair.
    repaired: bool,
    /// The registry was told the release is over.
    forgotten: bool,
}

impl RunSupervisor {
    pub fn new(
        id: u64,
        request: ReleaseRequest,
        token: String,
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
            run_id: request.run_id.clone(),
            request: Some(request),
            harness,
            registry,
            token,
            lock: Lock::None,
            audit,
            began: Instant::now(),
            phase: Phase::Idle,
            cancel_requested: None,
            step: None,
            reply: None,
            children: Children::default(),
            attempt_in_flight: None,
            query: String::new(),
            evidence: None,
            repaired: false,
            forgotten: false,
        }
    }

    fn evidence_guard(&mut self) -> Addr<EvidenceGuardActor> {
        self.children
            .evidence_guard
            .get_or_insert_with(|| EvidenceGuardActor.start())
            .clone()
    }

    /// What a model-calling child needs from its run (the run's one Budget actor, started
    /// with the first of them).
    fn attempt_context(
        &mut self,
        role: ModelRole,
        client: crate::model::ModelClient,
        ctx: &mut Context<Self>,
    ) -> super::attempt::AttemptContext {
        let limits = self.harness.config.budget_limits();
        let budget = self
            .children
            .budget
            .get_or_insert_with(|| BudgetActor::new(limits).start())
            .clone();
        super::attempt::AttemptContext {
            role,
            run_id: self.run_id.clone(),
            client,
            store: self.harness.store.clone(),
            budget,
            started: ctx.address().recipient(),
            recorded: ctx.address().recipient(),
        }
    }

    /// The Repair actor (None when no model is configured).
    fn repair_actor(&mut self, ctx: &mut Context<Self>) -> Option<Addr<RepairActor>> {
        if self.children.repair.is_none() {
            let client = self.harness.model.clone()?;
            let context = self.attempt_context(ModelRole::Repair, client, ctx);
            let config = &self.harness.config;
            let actor = RepairActor::new(
                context,
                config.repair.clone(),
                config.model.name.clone(),
                config.model.structured_output,
            );
            self.children.repair = Some(actor.start());
        }
        self.children.repair.clone()
    }

    /// The SemanticGuard actor (None when no model is configured).
    fn semantic_actor(&mut self, ctx: &mut Context<Self>) -> Option<Addr<SemanticGuardActor>> {
        if self.children.semantic.is_none() {
            let client = self.harness.model.clone()?;
            let context = self.attempt_context(ModelRole::Semantic, client, ctx);
            let config = &self.harness.config;
            let actor = SemanticGuardActor::new(
                context,
                config.semantic_guard.clone(),
                config.model.name.clone(),
                config.model.structured_output,
            );
            self.children.semantic = Some(actor.start());
        }
        self.children.semantic.clone()
    }

    fn stop_children(&mut self, abort: bool) {
        let children = std::mem::take(&mut self.children);
        tell(children.evidence_guard, abort);
        tell(children.budget, abort);
        tell(children.repair, abort);
        tell(children.semantic, abort);
    }

    /// Spawns one step of the release; its output goes to `then`, unless a Cancel or a
    /// lost lock drops it first.
    fn spawn_step<T: 'static>(
        &mut self,
        ctx: &mut Context<Self>,
        work: impl std::future::Future<Output = T> + 'static,
        then: fn(&mut Self, T, &mut Context<Self>),
    ) {
        let handle = ctx.spawn(work.into_actor(self).map(move |output, actor, ctx| {
            actor.step = None;
            then(actor, output, ctx);
        }));
        self.step = Some(handle);
    }

    /// The begin script answered.
    fn begun(&mut self, begun: Result<Begin, StoreError>, ctx: &mut Context<Self>) {
        match begun {
            Err(e) => {
                // It may have taken the lock before failing: free it on the way out.
                self.lock = Lock::Maybe;
                self.finish(Err(e.into()), ctx);
            }
            Ok(Begin::Stored(json)) => self.finish(replay(json), ctx),
            Ok(Begin::Locked { token, remaining }) => self.finish(
                Err(ReleaseError::InFlight {
                    holder: lock_holder(&token).map(str::to_string),
                    retry_after: remaining,
                }),
                ctx,
            ),
            Ok(Begin::Taken { cancelled }) => {
                self.lock = Lock::Held;
                self.registry.do_send(LockTaken {
                    run_id: self.run_id.clone(),
                    supervisor: self.id,
                });
                let cancel = if cancelled {
                    Some(CancelSource::Marker)
                } else {
                    self.cancel_requested.take()
                };
                match cancel {
                    Some(source) => self.cancelled(source, ctx),
                    None => self.load(ctx),
                }
            }
        }
    }

    /// Under the lock: reads the marker, the calls list and the records in one step.
    fn load(&mut self, ctx: &mut Context<Self>) {
        self.phase = Phase::Deciding;
        let Some(request) = self.request.as_ref() else {
            return self.finish(
                Err(ReleaseError::Internal("the release has no request".into())),
                ctx,
            );
        };
        let cited = match &request.draft {
            DraftInput::Parsed(d) if !request.stop_reason.is_controlled_stop() => {
                d.cited_call_ids()
            }
            _ => Vec::new(),
        };
        let store = self.harness.store.clone();
        let config = self.harness.config.clone();
        let run_id = self.run_id.clone();
        let work = async move {
            store
                .load(
                    &run_id,
                    &cited,
                    config.progress.max_calls,
                    config.record_limits(),
                )
                .await
        };
        self.spawn_step(ctx, work, Self::loaded);
    }

    /// The evidence is in: EvidenceGuard decides the first step.
    fn loaded(&mut self, loaded: Result<Loaded, StoreError>, ctx: &mut Context<Self>) {
        let loaded = match loaded {
            Ok(loaded) => loaded,
            Err(e) => return self.finish(Err(e.into()), ctx),
        };
        if loaded.cancelled {
            return self.cancelled(CancelSource::Marker, ctx);
        }
        let Some(request) = self.request.take() else {
            return self.finish(
                Err(ReleaseError::Internal("the release has no request".into())),
                ctx,
            );
        };
        let evidence = Arc::new(loaded.evidence);
        self.evidence = Some(evidence.clone());
        self.query = request.query;
        let checked = self.evidence_guard().send(CheckDraft {
            run_id: self.run_id.clone(),
            stop_reason: request.stop_reason,
            draft: request.draft,
            evidence,
            policy: self.harness.config.release_policy(),
        });
        self.spawn_step(ctx, checked, Self::checked);
    }

    /// EvidenceGuard decided (first, or after the repair).
    fn checked(&mut self, checked: Result<Checked, actix::MailboxError>, ctx: &mut Context<Self>) {
        match checked {
            Ok(Checked { step, notes }) => {
                self.audit.absorb(notes);
                self.next(step, ctx);
            }
            Err(e) => self.finish(Err(mailbox(e)), ctx),
        }
    }

    fn next(&mut self, step: Step, ctx: &mut Context<Self>) {
        match step {
            Step::Finish(result) => self.commit(result, None, ctx),
            Step::Judge(judged) => self.judge(Arc::from(judged), ctx),
            // after_repair never asks for a second repair; fail closed if it ever did.
            Step::Repair { .. } if self.repaired => {
                let result = ReleaseResult::evidence_validation_failed(&self.run_id);
                self.commit(result, None, ctx);
            }
            Step::Repair {
                draft,
                violations,
                run,
            } => self.repair(draft, violations, run, ctx),
        }
    }

    /// One repair call, then EvidenceGuard on the candidate.
    fn repair(
        &mut self,
        draft: Draft,
        violations: Vec<Violation>,
        judged: Box<ResolvedRun>,
        ctx: &mut Context<Self>,
    ) {
        self.repaired = true;
        let Some(evidence) = self.evidence.take() else {
            return self.finish(
                Err(ReleaseError::Internal("the release has no evidence".into())),
                ctx,
            );
        };
        let Some(repair) = self.repair_actor(ctx) else {
            self.audit.repair = Some(RepairAudit::not_run("no model is configured".into()));
            let result = ReleaseResult::evidence_validation_failed(&self.run_id);
            return self.commit(result, None, ctx);
        };
        let evidence_guard = self.evidence_guard();
        let usable = judged
            .usable_in_call_order()
            .into_iter()
            .map(|c| UsableCallRef {
                tool_call_id: c.tool_call_id.clone(),
                tool: c.tool,
                evidence_status: c.evidence_status,
            })
            .collect();
        let store = self.harness.store.clone();
        let config = self.harness.config.clone();
        let run_id = self.run_id.clone();
        let stop_reason = self.audit.stop_reason;
        let work = async move {
            let asked = RepairDraft {
                draft: draft.clone(),
                violations,
                usable,
            };
            let candidate = match repair.send(asked).await.map_err(mailbox)? {
                StepOutcome::Done(candidate) => candidate,
                StepOutcome::Cancelled(source) => return Ok(Repaired::Cancelled(source)),
                StepOutcome::Store(e) => return Err(e.into()),
            };
            let mut evidence = evidence;
            if let Ok(candidate) = &candidate {
                store
                    .complete_evidence(
                        Arc::make_mut(&mut evidence),
                        &candidate.cited_call_ids(),
                        config.record_limits(),
                    )
                    .await?;
            }
            let checked = evidence_guard
                .send(CheckRepair {
                    run_id,
                    stop_reason,
                    original: draft,
                    candidate,
                    evidence: evidence.clone(),
                    judged,
                    policy: config.release_policy(),
                })
                .await
                .map_err(mailbox)?;
            Ok(Repaired::Checked(Box::new(checked), evidence))
        };
        self.spawn_step(ctx, work, Self::repaired);
    }

    fn repaired(&mut self, repaired: Result<Repaired, ReleaseError>, ctx: &mut Context<Self>) {
        match repaired {
            Ok(Repaired::Cancelled(source)) => self.cancelled(source, ctx),
            Ok(Repaired::Checked(checked, evidence)) => {
                self.evidence = Some(evidence);
                self.checked(Ok(*checked), ctx);
            }
            Err(e) => self.finish(Err(e), ctx),
        }
    }

    /// SemanticGuard reviews the Draft against its snapshot.
    fn judge(&mut self, judged: Arc<Judgeable>, ctx: &mut Context<Self>) {
        // The evidence served EvidenceGuard and the snapshot; a parked release keeps only
        // what it releases (and the EvidenceGuard actor has nothing left to decide).
        self.evidence = None;
        tell(self.children.evidence_guard.take(), false);
        let Some(semantic) = self.semantic_actor(ctx) else {
            let result = after_judgement(
                &self.run_id,
                Judgement::Unavailable,
                &judged,
                &mut self.audit,
            );
            return self.commit(result, None, ctx);
        };
        let asked = semantic.send(Judge {
            query: std::mem::take(&mut self.query),
            judged: judged.clone(),
            marker_read: !self.repaired,
        });
        let work = async move { (asked.await, judged) };
        self.spawn_step(ctx, work, Self::judged);
    }

    fn judged(
        &mut self,
        (answer, judged): (
            Result<StepOutcome<Judgement>, actix::MailboxError>,
            Arc<Judgeable>,
        ),
        ctx: &mut Context<Self>,
    ) {
        match answer {
            Ok(StepOutcome::Done(judgement)) => {
                let result = after_judgement(&self.run_id, judgement, &judged, &mut self.audit);
                self.commit(result, None, ctx);
            }
            Ok(StepOutcome::Cancelled(source)) => self.cancelled(source, ctx),
            Ok(StepOutcome::Store(e)) => self.finish(Err(e.into()), ctx),
            Err(e) => self.finish(Err(mailbox(e)), ctx),
        }
    }

    /// Cancel, by any route, while the lock is held and the decision runs (or before it).
    fn cancelled(&mut self, source: CancelSource, ctx: &mut Context<Self>) {
        tracing::info!(run_id = %self.run_id, source = source.as_str(), "release cancelled");
        if let Some(handle) = self.step.take() {
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
            self.audit.model_attempts.push(attempt);
        }
        let result = ReleaseResult::cancelled(&self.run_id);
        self.commit(result, Some(source), ctx);
    }

    /// The lease was lost (expired while Redis paused, or the key replaced): this release
    /// can never store, so it stops now.
    fn lock_lost(&mut self, ctx: &mut Context<Self>) {
        tracing::warn!(run_id = %self.run_id, "the release lost its lock; nothing is stored");
        if let Some(handle) = self.step.take() {
            ctx.cancel_future(handle);
        }
        self.stop_children(true);
        self.lock = Lock::None;
        self.finish(Err(ReleaseError::LockLost), ctx);
    }

    /// The fenced commit: stores `result` (or CANCELLED, if the marker is set by then) with
    /// its audit record while this release still holds the lock, frees it, answers.
    fn commit(
        &mut self,
        result: ReleaseResult,
        cancel: Option<CancelSource>,
        ctx: &mut Context<Self>,
    ) {
        self.phase = Phase::Committing;
        let total = self.began.elapsed();
        let cancelled = ReleaseResult::cancelled(&self.run_id);
        let (json, cancelled_json) = match (
            serde_json::to_string(&result),
            serde_json::to_string(&cancelled),
        ) {
            (Ok(json), Ok(cancelled)) => (json, cancelled),
            (Err(e), _) | (_, Err(e)) => {
                return self.finish(Err(ReleaseError::Internal(e.to_string())), ctx)
            }
        };
        for rule in self.audit.violation_rules() {
            telemetry::guard_violation(rule);
        }
        let end = AuditEnd::of(result.outcome, result.fallback_type, cancel);
        let (audit_json, overhead) = self.audit.finish(total, &end);
        let store = self.harness.store.clone();
        let token = self.token.clone();
        let run_id = self.run_id.clone();
        let work = async move {
            let commit = Commit {
                result: &json,
                audit_head: &audit_json.head,
                audit_tail: &audit_json.tail,
                cancelled_result: &cancelled_json,
                cancelled_audit_tail: &audit_json.cancelled_tail,
            };
            let committed = store.commit(&run_id, &token, &commit).await;
            (committed, json, cancelled_json)
        };
        ctx.spawn(work.into_actor(self).map(
            move |(committed, json, cancelled_json), actor, ctx| {
                actor.lock = Lock::None;
                let answer = match committed {
                    Err(e) => {
                        // The commit may or may not have run: free the lock if it did not.
                        actor.lock = Lock::Maybe;
                        Err(e.into())
                    }
                    Ok(Committed::AlreadyStored(stored))
                    | Ok(Committed::LockLost {
                        stored: Some(stored),
                    }) => replay(stored),
                    Ok(Committed::LockLost { stored: None }) => Err(ReleaseError::LockLost),
                    Ok(Committed::Decided) => {
                        telemetry::release_finished(
                            result.outcome,
                            result.fallback_type,
                            total,
                            overhead,
                        );
                        if let Some(source) = cancel {
                            telemetry::cancelled(source);
                        }
                        Ok(Released {
                            result,
                            json,
                            replayed: false,
                        })
                    }
                    Ok(Committed::Cancelled) => {
                        tracing::info!(run_id = %actor.run_id, "cancel marker found at the commit; CANCELLED stored");
                        let source = cancel.unwrap_or(CancelSource::Marker);
                        telemetry::release_finished(cancelled.outcome, None, total, overhead);
                        telemetry::cancelled(source);
                        Ok(Released {
                            result: cancelled,
                            json: cancelled_json,
                            replayed: false,
                        })
                    }
                };
                actor.finish(answer, ctx);
            },
        ));
    }

    /// Tells the registry this release is over (once).
    fn forget(&mut self) {
        if !self.forgotten {
            self.forgotten = true;
            self.registry.do_send(RunEnded {
                run_id: self.run_id.clone(),
                supervisor: self.id,
            });
        }
    }

    /// Answers the caller and stops the run, freeing a lock this release may still hold.
    fn finish(&mut self, answer: Result<Released, ReleaseError>, ctx: &mut Context<Self>) {
        self.phase = Phase::Committing;
        // The registry forgets the run before the caller hears the answer: a retry that
        // follows at once starts a new release (which finds what is stored) instead of
        // meeting this one while it frees its lock.
        self.forget();
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(answer);
        }
        self.stop_children(false);
        match std::mem::replace(&mut self.lock, Lock::None) {
            Lock::Held | Lock::Maybe => {
                let store = self.harness.store.clone();
                let run_id = self.run_id.clone();
                let token = self.token.clone();
                ctx.spawn(
                    async move {
                        let _ = store.unlock(&run_id, &token).await;
                    }
                    .into_actor(self)
                    .map(|_, _, ctx| ctx.stop()),
                );
            }
            Lock::None => ctx.stop(),
        }
    }
}

/// Stops a child that was started: `AbortChild` drops its pending model call first.
fn tell<A>(child: Option<Addr<A>>, abort: bool)
where
    A: Handler<AbortChild> + Handler<StopChild>,
    A::Context: actix::dev::ToEnvelope<A, AbortChild> + actix::dev::ToEnvelope<A, StopChild>,
{
    match (child, abort) {
        (Some(child), true) => child.do_send(AbortChild),
        (Some(child), false) => child.do_send(StopChild),
        (None, _) => {}
    }
}

/// A stored result, answered again (no new release ran).
fn replay(json: String) -> Result<Released, ReleaseError> {
    serde_json::from_str::<ReleaseResult>(&json)
        .map(|result| Released {
            result,
            json,
            replayed: true,
        })
        .map_err(|e| ReleaseError::StoredResultUnreadable(e.to_string()))
}

fn mailbox(e: actix::MailboxError) -> ReleaseError {
    ReleaseError::Internal(format!("a run actor is gone: {e}"))
}

impl Actor for RunSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Self::Context) {
        super::actor_started();
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.stop_children(true);
        self.forget();
        super::actor_stopped();
    }
}

/// Sent by the registry once: run the release. Answers its result (or why there is none).
#[derive(Message)]
#[rtype(result = "Result<Released, ReleaseError>")]
pub struct Run;

/// Sent by the registry when a cancel for this run arrives (HTTP, pub/sub, marker poll).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Cancel(pub CancelSource);

/// Sent by the registry when renewing this release's lease found the lock gone.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct LockLost;

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
        match self.phase {
            Phase::Idle | Phase::Beginning => {
                self.cancel_requested.get_or_insert(msg.0);
            }
            Phase::Deciding => self.cancelled(msg.0, ctx),
            Phase::Committing => {}
        }
    }
}

impl Handler<LockLost> for RunSupervisor {
    type Result = ();
    fn handle(&mut self, _: LockLost, ctx: &mut Self::Context) {
        if self.phase == Phase::Deciding && self.lock == Lock::Held {
            self.lock_lost(ctx);
        }
    }
}

impl Handler<Run> for RunSupervisor {
    type Result = ResponseFuture<Result<Released, ReleaseError>>;

    fn handle(&mut self, _: Run, ctx: &mut Self::Context) -> Self::Result {
        if self.phase != Phase::Idle {
            return Box::pin(async { Err(ReleaseError::Internal("Run sent twice".into())) });
        }
        let (tx, rx) = oneshot::channel();
        self.reply = Some(tx);
        self.phase = Phase::Beginning;
        self.audit.timings.started_at = chrono::Utc::now().to_rfc3339();
        let store = self.harness.store.clone();
        let run_id = self.run_id.clone();
        let token = self.token.clone();
        let lease = self.harness.config.lock_lease();
        let begin = async move { store.begin(&run_id, &token, lease).await };
        self.spawn_step(ctx, begin, Self::begun);
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(ReleaseError::Internal(
                    "the release ended without an answer".into(),
                ))
            })
        })
    }
}
