//! The RunSupervisor's steps, in the order a release takes them: the begin script's answer
//! (with the run's evidence), EvidenceGuard, Repair (then EvidenceGuard on the candidate)
//! and SemanticGuard.
//! Each step's answer comes back to the next method here; every step ends in
//! [`RunSupervisor::commit`] or [`RunSupervisor::finish`] (`commit.rs`).

use std::sync::Arc;

use actix::Context;

use super::commit::replay;
use super::{tell, Lock, Phase, RunSupervisor};
use crate::actors::evidence_guard::{CheckDraft, CheckRepair, Checked};
use crate::actors::registry::LockTaken;
use crate::actors::repair::RepairDraft;
use crate::actors::semantic_guard::Judge;
use crate::actors::{ReleaseError, StepOutcome};
use crate::domain::audit::{CancelSource, RepairAudit};
use crate::domain::draft::Draft;
use crate::domain::evidence_guard::{ResolvedRun, RunEvidence, Violation};
use crate::domain::release::{after_judgement, Judgeable, Judgement, ReleaseResult, Step};
use crate::model::prompts::UsableCallRef;
use crate::store::{lock_holder, Begin, StoreError};

/// How the repair step ended: cancelled, or the EvidenceGuard's decision on the candidate
/// (with the evidence, completed with the records the candidate cites).
enum Repaired {
    Cancelled(CancelSource),
    Checked(Box<Checked>, Arc<RunEvidence>),
}

impl RunSupervisor {
    /// The begin script answered.
    pub(super) fn begun(&mut self, begun: Result<Begin, StoreError>, ctx: &mut Context<Self>) {
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
            Ok(Begin::Cancelled) => {
                self.lock_taken();
                self.cancelled(CancelSource::Marker, ctx);
            }
            Ok(Begin::Taken(evidence)) => {
                self.lock_taken();
                match self.cancel_requested.take() {
                    Some(source) => self.cancelled(source, ctx),
                    None => self.decide(*evidence, ctx),
                }
            }
        }
    }

    /// The begin script took the lock: the registry renews its lease from now on.
    fn lock_taken(&mut self) {
        self.lock = Lock::Held;
        self.phase = Phase::Deciding;
        self.registry.do_send(LockTaken {
            run_id: self.run_id.clone(),
            supervisor: self.id,
        });
    }

    /// The evidence is in (read with the lock): EvidenceGuard decides the first step.
    fn decide(&mut self, evidence: RunEvidence, ctx: &mut Context<Self>) {
        let Some(request) = self.request.take() else {
            return self.finish(
                Err(ReleaseError::Internal("the release has no request".into())),
                ctx,
            );
        };
        let evidence = Arc::new(evidence);
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
                judged,
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
                let result = after_judgement(&self.run_id, judgement, judged, &mut self.audit);
                self.commit(result, None, ctx);
            }
            Ok(StepOutcome::Cancelled(source)) => self.cancelled(source, ctx),
            Ok(StepOutcome::Store(e)) => self.finish(Err(e.into()), ctx),
            Err(e) => self.finish(Err(mailbox(e)), ctx),
        }
    }
}

pub(super) fn mailbox(e: actix::MailboxError) -> ReleaseError {
    ReleaseError::Internal(format!("a run actor is gone: {e}"))
}
