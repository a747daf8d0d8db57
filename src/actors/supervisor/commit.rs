//! How a release ends: a Cancel (by any route) or a lost lease while it decides, the fenced
//! commit of its result, and the answer to its caller, after which the run stops (freeing a
//! lock it may still hold).

use actix::{ActorContext, ActorFutureExt, AsyncContext, Context, WrapFuture};

use super::{Lock, RunEvent, RunNotice, RunSupervisor, Stage};
use crate::actors::{ReleaseError, Released, StepTimes};
use crate::domain::audit::{millis, AttemptOutcome, AuditEnd, CancelSource, ModelAttempt};
use crate::domain::decision::{self, Decision};
use crate::domain::json;
use crate::domain::release::ReleaseResult;
use crate::store::{Appended, Commit, Committed, DecisionEntry};
use crate::telemetry;

impl RunSupervisor {
    /// Cancel, by any route, while the lock is held and the decision runs (or before it).
    pub(super) fn cancelled(&mut self, source: CancelSource, ctx: &mut Context<Self>) {
        tracing::info!(run_id = %self.run_id, source = source.as_str(), "release cancelled");
        let (step, attempt) = match self.deciding() {
            Some(deciding) => (deciding.step.take(), deciding.attempt.take()),
            None => (None, None),
        };
        if let Some(handle) = step {
            ctx.cancel_future(handle);
        }
        self.stop_children(true);
        if let Some((started, at)) = attempt {
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
                queued_ms: 0.0,
            };
            telemetry::model_attempt(attempt.role, attempt.outcome, at.elapsed(), None, None);
            self.audit.model_attempts.push(attempt);
        }
        let result = ReleaseResult::cancelled(&self.run_id);
        self.commit(result, Some(source), ctx);
    }

    /// The lease was lost (expired while Redis paused, or the key replaced): this release
    /// can never store, so it stops now.
    pub(super) fn lock_lost(&mut self, ctx: &mut Context<Self>) {
        tracing::warn!(run_id = %self.run_id, "the release lost its lock; nothing is stored");
        if let Some(handle) = self.deciding().and_then(|deciding| deciding.step.take()) {
            ctx.cancel_future(handle);
        }
        self.stop_children(true);
        self.lock = Lock::None;
        self.finish(Err(ReleaseError::LockLost), ctx);
    }

    /// The fenced commit: stores `result` (or CANCELLED, if the marker is set by then) with
    /// its audit record while this release still holds the lock, frees it, answers.
    pub(super) fn commit(
        &mut self,
        result: ReleaseResult,
        cancel: Option<CancelSource>,
        ctx: &mut Context<Self>,
    ) {
        self.stage = Stage::Ending;
        let total = self.began.elapsed();
        let cancelled = ReleaseResult::cancelled(&self.run_id);
        let (json, cancelled_json) = match (
            json::to_string_sized(&result, 4096),
            json::to_string(&cancelled),
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
        let decision = Decision {
            run_id: &self.run_id,
            outcome: result.outcome,
            fallback_type: result.fallback_type,
            replica: &self.harness.replica,
            time: &self.audit.timings.started_at,
            total_ms: self.audit.timings.total_ms,
            overhead_ms: self.audit.timings.overhead_ms,
            verdict: self.audit.verdict.as_ref().map(|v| v.verdict),
            model_attempts: self.audit.model_attempts.len(),
        };
        let values = decision.values();
        let max_len = self.harness.config.decisions.max_len;
        let store = self.harness.store.clone();
        let token = self.token.clone();
        let run_id = self.run_id.clone();
        let work = async move {
            let commit = Commit {
                result: &json,
                cancelled_result: &cancelled_json,
                audit: &audit_json,
                decision: Some(DecisionEntry {
                    max_len: max_len.get(),
                    values: &values,
                }),
            };
            let began = std::time::Instant::now();
            let committed = store.commit(&run_id, &token, &commit).await;
            let took = began.elapsed();
            let deferred = match &committed {
                Ok((Committed::Decided, Appended::Deferred)) => {
                    Some(decision::flat(&values, false))
                }
                Ok((Committed::Cancelled(_), Appended::Deferred)) => {
                    Some(decision::flat(&values, true))
                }
                _ => None,
            };
            (
                committed.map(|(c, _)| c),
                json,
                cancelled_json,
                took,
                deferred,
            )
        };
        ctx.spawn(work.into_actor(self).map(
            move |(committed, json, cancelled_json, took, deferred), actor, ctx| {
                actor.lock = Lock::None;
                actor.times.commit = took;
                actor.deferred_decision = deferred;
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
                            times: StepTimes::default(),
                        })
                    }
                    Ok(Committed::Cancelled(marker)) => {
                        // The cancel route's marker says `http`, however this release
                        // noticed the cancel first (the marker, or pub/sub from the replica
                        // that answered the route).
                        let source = match marker {
                            CancelSource::Http => CancelSource::Http,
                            _ => cancel.unwrap_or(CancelSource::Marker),
                        };
                        tracing::info!(run_id = %actor.run_id, source = source.as_str(), "cancel marker found at the commit; CANCELLED stored");
                        telemetry::release_finished(cancelled.outcome, None, total, overhead);
                        telemetry::cancelled(source);
                        Ok(Released {
                            result: cancelled,
                            json: cancelled_json,
                            replayed: false,
                            times: StepTimes::default(),
                        })
                    }
                };
                actor.finish(answer, ctx);
            },
        ));
    }

    /// Tells the registry this release is over (once).
    pub(super) fn forget(&mut self) {
        if !self.forgotten {
            self.forgotten = true;
            self.owner.do_send(RunNotice {
                run_id: self.run_id.clone(),
                supervisor: self.id,
                event: RunEvent::Ended,
            });
        }
    }

    /// Answers the caller and stops the run, freeing a lock this release may still hold.
    pub(super) fn finish(
        &mut self,
        answer: Result<Released, ReleaseError>,
        ctx: &mut Context<Self>,
    ) {
        self.stage = Stage::Ending;
        // The registry forgets the run before the caller hears the answer: a retry that
        // follows at once starts a new release (which finds what is stored) instead of
        // meeting this one while it frees its lock.
        self.forget();
        let model_wait = std::time::Duration::from_secs_f64(self.audit.model_wait_ms() / 1000.0);
        self.times.harness = self.began.elapsed().saturating_sub(model_wait);
        let answer = answer.map(|mut released| {
            released.times = self.times;
            released
        });
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(answer);
        }
        self.stop_children(false);
        // On a Redis Cluster the decision entry goes to its own slot after the caller has
        // the answer: the release never waits for it, and the run stops once it is sent.
        if let Some(fields) = self.deferred_decision.take() {
            let store = self.harness.store.clone();
            let max_len = self.harness.config.decisions.max_len;
            ctx.spawn(
                async move {
                    store.append_decision(max_len.get(), &fields).await;
                }
                .into_actor(self)
                .map(|_, _, ctx| ctx.stop()),
            );
            return;
        }
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

/// A stored result, answered again (no new release ran).
pub(super) fn replay(json: String) -> Result<Released, ReleaseError> {
    serde_json::from_str::<ReleaseResult>(&json)
        .map(|result| Released {
            result,
            json,
            replayed: true,
            times: StepTimes::default(),
        })
        .map_err(|e| ReleaseError::StoredResultUnreadable(e.to_string()))
}
