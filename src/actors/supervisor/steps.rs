//! The RunSupervisor's steps, in the order a release takes them: the begin script's answer
//! (with the run's evidence), EvidenceGuard, Repair (then EvidenceGuard on the candidate)
//! and SemanticGuard.
//! Each step's answer comes back to the next method here; every step ends in
//! [`RunSupervisor::commit`] or [`RunSupervisor::finish`] (`commit.rs`).
//!
//! EvidenceGuard is the domain's pure decision ([`release::begin`],
//! [`release::after_repair_reusing`]), called here: it needs no actor of its own, as it
//! holds no state and awaits nothing.

use std::sync::Arc;

use actix::Context;

use super::commit::replay;
use super::{Deciding, Lock, RunEvent, RunNotice, RunSupervisor, Stage};
use crate::actors::repair::RepairDraft;
use crate::actors::semantic_guard::Judge;
use crate::actors::{ReleaseError, ReleaseRequest, StepOutcome};
use crate::domain::audit::{CancelSource, RepairAudit, ViewPart};
use crate::domain::draft::Draft;
use crate::domain::evidence_guard::{ResolvedRun, RunEvidence, Violation};
use crate::domain::identifiers::RunIdentifiers;
use crate::domain::json;
use crate::domain::release::{
    self, after_judgement, cites_too_many, DraftInput, Judgeable, Judgement, ReleaseResult,
    RepairFailure, Step,
};
use crate::model::prompts::UsableCallRef;
use crate::store::{lock_holder, Begin, StoreError};

/// How the repair call ended: cancelled, or a candidate (or why there is none) with what
/// EvidenceGuard needs to decide on it: the original, the run as judged for it, and the
/// evidence completed with the records the candidate cites.
#[allow(clippy::large_enum_variant)] // moved once, from the repair step to `repaired`
enum Repaired {
    Cancelled(CancelSource),
    Candidate {
        candidate: Result<Draft, RepairFailure>,
        original: Draft,
        judged: Box<ResolvedRun>,
        evidence: Arc<RunEvidence>,
    },
}

impl RunSupervisor {
    /// The begin script answered.
    pub(super) fn begun(&mut self, begun: Result<Begin, StoreError>, ctx: &mut Context<Self>) {
        self.times.evidence = self.began.elapsed();
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
            Ok(Begin::Taken(evidence)) => match self.lock_taken() {
                Some((_, Some(source))) => self.cancelled(source, ctx),
                Some((request, None)) => self.decide(request, *evidence, ctx),
                None => self.finish(
                    Err(ReleaseError::Internal("the release has no request".into())),
                    ctx,
                ),
            },
        }
    }

    /// The begin script took the lock: the release is deciding, and the registry renews its
    /// lease from now on. Answers the request and a Cancel that arrived while beginning.
    fn lock_taken(&mut self) -> Option<(ReleaseRequest, Option<CancelSource>)> {
        self.lock = Lock::Held;
        self.owner.do_send(RunNotice {
            run_id: self.run_id.clone(),
            supervisor: self.id,
            event: RunEvent::LockTaken,
        });
        let deciding = Stage::Deciding(Deciding {
            query: String::new(),
            evidence: None,
            repaired: false,
            step: None,
            attempt: None,
        });
        match std::mem::replace(&mut self.stage, deciding) {
            Stage::Beginning { request, cancel } => Some((request, cancel)),
            Stage::Deciding(_) | Stage::Ending => None,
        }
    }

    /// The evidence is in (read with the lock): EvidenceGuard decides the first step.
    fn decide(&mut self, request: ReleaseRequest, evidence: RunEvidence, ctx: &mut Context<Self>) {
        let ReleaseRequest {
            query,
            stop_reason,
            draft,
            ..
        } = request;
        self.audit.view.set_query(&query);
        let policy = self.harness.config.release_policy();
        if let DraftInput::Parsed(parsed) = &draft {
            if let Ok(json) = json::to_string_sized(parsed, 1024) {
                // The audit may name call ids (the console shows what each analysis
                // cites) but never quotes a Redis key: keys in the Draft's text are masked.
                let keys = RunIdentifiers::new(std::iter::empty::<&str>(), &policy.key_prefix);
                self.audit.view.put(ViewPart::Draft, keys.mask_owned(json));
            }
        }
        let step = release::begin(stop_reason, draft, &evidence, &policy, &mut self.audit);
        self.times.evidence = self.began.elapsed();
        if let Some(deciding) = self.deciding() {
            deciding.query = query;
            deciding.evidence = Some(Arc::new(evidence));
        }
        self.next(step, ctx);
    }

    fn next(&mut self, step: Step, ctx: &mut Context<Self>) {
        let repaired = self.deciding().is_some_and(|d| d.repaired);
        match step {
            Step::Finish(result) => self.commit(result, None, ctx),
            Step::Judge(judged) => self.judge(Arc::from(judged), ctx),
            // after_repair never asks for a second repair; fail closed if it ever did.
            Step::Repair { .. } if repaired => {
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
        self.step_began = std::time::Instant::now();
        let Some(evidence) = self.deciding().and_then(|d| {
            d.repaired = true;
            d.evidence.take()
        }) else {
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
        let limits = self.record_limits();
        let max_cited_calls = self.harness.config.evidence.max_cited_calls;
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
                let cited = candidate.cited_call_ids();
                // A candidate citing too many calls fails EvidenceGuard on its own: its ids
                // are not read.
                if !cites_too_many(cited.len(), max_cited_calls.get()) {
                    store
                        .complete_evidence(Arc::make_mut(&mut evidence), &cited, limits)
                        .await?;
                }
            }
            Ok(Repaired::Candidate {
                candidate,
                original: draft,
                judged,
                evidence,
            })
        };
        self.spawn_step(ctx, work, Self::repaired);
    }

    /// The repair answered: EvidenceGuard decides on its candidate.
    fn repaired(&mut self, repaired: Result<Repaired, ReleaseError>, ctx: &mut Context<Self>) {
        self.times.repair = self.step_began.elapsed();
        match repaired {
            Ok(Repaired::Cancelled(source)) => self.cancelled(source, ctx),
            Ok(Repaired::Candidate {
                candidate,
                original,
                judged,
                evidence,
            }) => {
                let policy = self.harness.config.release_policy();
                let step = release::after_repair_reusing(
                    &original,
                    candidate,
                    &evidence,
                    *judged,
                    &policy,
                    &mut self.audit,
                );
                if let Some(deciding) = self.deciding() {
                    deciding.evidence = Some(evidence);
                }
                self.next(step, ctx);
            }
            Err(e) => self.finish(Err(e), ctx),
        }
    }

    /// SemanticGuard reviews the Draft against its snapshot.
    fn judge(&mut self, judged: Arc<Judgeable>, ctx: &mut Context<Self>) {
        // The evidence served EvidenceGuard and the snapshot; a parked release keeps only
        // what it releases.
        let (query, repaired) = match self.deciding() {
            Some(deciding) => {
                deciding.evidence = None;
                (std::mem::take(&mut deciding.query), deciding.repaired)
            }
            None => (String::new(), false),
        };
        self.step_began = std::time::Instant::now();
        if let Ok(json) = json::to_string_sized(&judged.snapshot, 2048) {
            self.audit.view.put(ViewPart::Evidence, json);
        }
        if repaired {
            if let Ok(json) = json::to_string_sized(&judged.draft, 1024) {
                self.audit.view.put(ViewPart::RepairedDraft, json);
            }
        }
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
            query,
            judged: judged.clone(),
            marker_read: !repaired,
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
        self.times.judge = self.step_began.elapsed();
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
