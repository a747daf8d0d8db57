//! The RunSupervisor: one per release, the run's state machine.
//!
//! begin (one script: stored result? lock taken? cancel marker?) → load evidence →
//! EvidenceGuard (via its actor) → Repair → EvidenceGuard → SemanticGuard → decision →
//! fenced commit (one script: result or CANCELLED, audit, unlock, only while this release
//! still holds the lock) → reply. The decision is one future spawned in this actor's
//! context; `Cancel` drops it, aborts the children's pending model calls and commits
//! CANCELLED. The registry renews the lease and polls the marker; `LockLost` from it ends
//! the release with nothing stored. Once the commit is sent a Cancel changes nothing here:
//! the commit itself checks the marker.

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
use super::registry::{LockTaken, RunEnded, RunRegistry};
use super::repair::{RepairActor, RepairDraft};
use super::semantic_guard::{Judge, SemanticGuardActor};
use super::{AbortChild, Harness, ReleaseError, ReleaseRequest, Released, StepOutcome, StopChild};
use crate::domain::audit::{
    millis, AttemptOutcome, Audit, AuditEnd, BudgetUse, CancelSource, ModelAttempt, ModelRole,
    RepairAudit,
};
use crate::domain::release::{after_judgement, DraftInput, Judgement, ReleaseResult, Step};
use crate::model::prompts::UsableCallRef;
use crate::store::{lock_holder, Begin, Commit, Committed, StoreError};
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

/// What the decision ends with.
enum Decided {
    Cancelled(CancelSource),
    Result(Box<ReleaseResult>),
}

pub struct RunSupervisor {
    id: u64,
    request: Option<ReleaseRequest>,
    harness: Harness,
    registry: Addr<RunRegistry>,
    /// This release's lock token (from the registry, which renews the lease with it).
    token: String,
    lock: Lock,
    audit: Rc<RefCell<Audit>>,
    began: Instant,
    phase: Phase,
    /// A cancel that arrived while the begin script was out.
    cancel_requested: Option<CancelSource>,
    /// The decision future; cancelling it drops whatever it awaits.
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
            request: Some(request),
            harness,
            registry,
            token,
            lock: Lock::None,
            audit: Rc::new(RefCell::new(audit)),
            began: Instant::now(),
            phase: Phase::Idle,
            cancel_requested: None,
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

    /// The begin script answered.
    fn begun(&mut self, begun: Result<Begin, StoreError>, ctx: &mut Context<Self>) {
        self.pipeline = None;
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
                    run_id: self.run_id(),
                    supervisor: self.id,
                });
                let cancel = if cancelled {
                    Some(CancelSource::Marker)
                } else {
                    self.cancel_requested.take()
                };
                match cancel {
                    Some(source) => self.cancelled(source, ctx),
                    None => self.decide(ctx),
                }
            }
        }
    }

    /// Runs the decision under the lock.
    fn decide(&mut self, ctx: &mut Context<Self>) {
        self.phase = Phase::Deciding;
        let (Some(request), Some(children)) = (self.request.take(), self.children.as_ref()) else {
            return self.finish(
                Err(ReleaseError::Internal("the release has no request".into())),
                ctx,
            );
        };
        let span = tracing::info_span!("release", run_id = %request.run_id);
        let work = pipeline(
            request,
            self.harness.clone(),
            children.evidence_guard.clone(),
            children.repair.clone(),
            children.semantic.clone(),
            self.audit.clone(),
        )
        .instrument(span);
        let handle = ctx.spawn(
            work.into_actor(self)
                .map(|decided, actor, ctx| actor.decided(decided, ctx)),
        );
        self.pipeline = Some(handle);
    }

    /// The decision ended (not by Cancel).
    fn decided(&mut self, decided: Result<Decided, ReleaseError>, ctx: &mut Context<Self>) {
        self.pipeline = None;
        match decided {
            Ok(Decided::Cancelled(source)) => self.cancelled(source, ctx),
            Ok(Decided::Result(result)) => self.commit(*result, None, ctx),
            Err(e) => self.finish(Err(e), ctx),
        }
    }

    /// Cancel, by any route, while the lock is held and the decision runs (or before it).
    fn cancelled(&mut self, source: CancelSource, ctx: &mut Context<Self>) {
        tracing::info!(run_id = %self.run_id(), source = source.as_str(), "release cancelled");
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
        self.commit(ReleaseResult::cancelled(&run_id), Some(source), ctx);
    }

    /// The lease was lost (expired while Redis paused, or the key replaced): this release
    /// can never store, so it stops now.
    fn lock_lost(&mut self, ctx: &mut Context<Self>) {
        tracing::warn!(run_id = %self.run_id(), "the release lost its lock; nothing is stored");
        if let Some(handle) = self.pipeline.take() {
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
        let run_id = self.run_id();
        let (json, cancelled_json) = match (
            serde_json::to_string(&result),
            serde_json::to_string(&ReleaseResult::cancelled(&run_id)),
        ) {
            (Ok(json), Ok(cancelled)) => (json, cancelled),
            (Err(e), _) | (_, Err(e)) => {
                return self.finish(Err(ReleaseError::Internal(e.to_string())), ctx)
            }
        };
        let (audit_json, overhead) = {
            let mut audit = self.audit.borrow_mut();
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
            let end = AuditEnd::of(result.outcome, result.fallback_type, cancel);
            let overhead = total.saturating_sub(Duration::from_secs_f64(model_wait / 1000.0));
            (audit.commit_json(&end), overhead)
        };
        let store = self.harness.store.clone();
        let token = self.token.clone();
        let work = {
            let run_id = run_id.clone();
            let json = json.clone();
            let cancelled_json = cancelled_json.clone();
            async move {
                let commit = Commit {
                    result: &json,
                    audit_head: &audit_json.head,
                    audit_tail: &audit_json.tail,
                    cancelled_result: &cancelled_json,
                    cancelled_audit_tail: &audit_json.cancelled_tail,
                };
                store.commit(&run_id, &token, &commit).await
            }
        };
        ctx.spawn(work.into_actor(self).map(move |committed, actor, ctx| {
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
                    tracing::info!(run_id = %run_id, "cancel marker found at the commit; CANCELLED stored");
                    let source = cancel.unwrap_or(CancelSource::Marker);
                    let result = ReleaseResult::cancelled(&run_id);
                    telemetry::release_finished(result.outcome, None, total, overhead);
                    telemetry::cancelled(source);
                    Ok(Released {
                        result,
                        json: cancelled_json,
                        replayed: false,
                    })
                }
            };
            actor.finish(answer, ctx);
        }));
    }

    /// Answers the caller and stops the run, freeing a lock this release may still hold.
    fn finish(&mut self, answer: Result<Released, ReleaseError>, ctx: &mut Context<Self>) {
        self.phase = Phase::Committing;
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(answer);
        }
        self.stop_children(false);
        match std::mem::replace(&mut self.lock, Lock::None) {
            Lock::Held | Lock::Maybe => {
                let store = self.harness.store.clone();
                let run_id = self.run_id();
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
        self.audit.borrow_mut().timings.started_at = chrono::Utc::now().to_rfc3339();
        let store = self.harness.store.clone();
        let run_id = self.run_id();
        let token = self.token.clone();
        let lease = self.harness.config.lock_lease();
        let begin = async move { store.begin(&run_id, &token, lease).await };
        let handle = ctx.spawn(
            begin
                .into_actor(self)
                .map(|begun, actor, ctx| actor.begun(begun, ctx)),
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

fn mailbox(e: actix::MailboxError) -> ReleaseError {
    ReleaseError::Internal(format!("a run actor is gone: {e}"))
}

/// The decision, under the lock. It touches actor state only through the shared audit.
async fn pipeline(
    request: ReleaseRequest,
    harness: Harness,
    evidence_guard: Addr<EvidenceGuardActor>,
    repair: Option<Addr<RepairActor>>,
    semantic: Option<Addr<SemanticGuardActor>>,
    audit: Rc<RefCell<Audit>>,
) -> Result<Decided, ReleaseError> {
    let store = &harness.store;
    let config = &harness.config;
    let run_id = request.run_id.as_str();

    let cited = match &request.draft {
        DraftInput::Parsed(d) if !request.stop_reason.is_controlled_stop() => d.cited_call_ids(),
        _ => Vec::new(),
    };
    let mut evidence = store
        .load_evidence(
            run_id,
            &cited,
            config.progress.max_calls,
            config.record_limits(),
        )
        .await?;
    let policy = config.release_policy();
    let Checked { step, notes } = evidence_guard
        .send(CheckDraft {
            run_id: run_id.to_string(),
            stop_reason: request.stop_reason,
            draft: request.draft,
            evidence: evidence.clone(),
            policy: policy.clone(),
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
                        .complete_evidence(
                            &mut evidence,
                            &candidate.cited_call_ids(),
                            config.record_limits(),
                        )
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
