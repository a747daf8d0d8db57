//! The repair comparison: a repaired Draft may differ from the original only in
//! analysis ids, tool call ids and analysis references.
//!
//! Entry points: [`compare`], and [`repair_output_limits`] (how long the one repair answer
//! may be). Everything a person reads (every text, every kind, the order
//! and number of items, `requires_human_confirmation`, limitations, missing context) must
//! be identical, or the candidate is rejected with the first difference found.

use serde::Serialize;

use super::draft::Draft;

/// The first user-visible difference between the original and the repaired Draft.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum RepairRejection {
    #[error("the conclusion was added, removed or reworded")]
    ConclusionChanged,
    #[error("the number of {section} changed from {before} to {after}")]
    CountChanged {
        section: &'static str,
        before: usize,
        after: usize,
    },
    #[error("the text of {section}[{index}] changed")]
    TextChanged { section: &'static str, index: usize },
    #[error("the kind of analyses[{index}] changed")]
    KindChanged { index: usize },
    #[error("requires_human_confirmation of action_plan[{index}] changed")]
    ConfirmationChanged { index: usize },
    #[error("the limitations changed")]
    LimitationsChanged,
    #[error("the missing context changed")]
    MissingContextChanged,
}

fn same_count(section: &'static str, before: usize, after: usize) -> Result<(), RepairRejection> {
    if before == after {
        Ok(())
    } else {
        Err(RepairRejection::CountChanged {
            section,
            before,
            after,
        })
    }
}

fn same_text(section: &'static str, index: usize, a: &str, b: &str) -> Result<(), RepairRejection> {
    if a == b {
        Ok(())
    } else {
        Err(RepairRejection::TextChanged { section, index })
    }
}

/// Accepts `candidate` only if it changes nothing but ids and references.
pub fn compare(original: &Draft, candidate: &Draft) -> Result<(), RepairRejection> {
    match (&original.conclusion, &candidate.conclusion) {
        (None, None) => {}
        (Some(a), Some(b)) if a.text == b.text => {}
        _ => return Err(RepairRejection::ConclusionChanged),
    }

    same_count(
        "analyses",
        original.analyses.len(),
        candidate.analyses.len(),
    )?;
    for (index, (a, b)) in original
        .analyses
        .iter()
        .zip(&candidate.analyses)
        .enumerate()
    {
        same_text("analyses", index, &a.text, &b.text)?;
        if a.kind != b.kind {
            return Err(RepairRejection::KindChanged { index });
        }
    }

    same_count(
        "action_plan",
        original.action_plan.len(),
        candidate.action_plan.len(),
    )?;
    for (index, (a, b)) in original
        .action_plan
        .iter()
        .zip(&candidate.action_plan)
        .enumerate()
    {
        same_text("action_plan", index, &a.text, &b.text)?;
        if a.requires_human_confirmation != b.requires_human_confirmation {
            return Err(RepairRejection::ConfirmationChanged { index });
        }
    }

    same_count(
        "recommendations",
        original.recommendations.len(),
        candidate.recommendations.len(),
    )?;
    for (index, (a, b)) in original
        .recommendations
        .iter()
        .zip(&candidate.recommendations)
        .enumerate()
    {
        same_text("recommendations", index, &a.text, &b.text)?;
    }

    if original.limitations != candidate.limitations {
        return Err(RepairRejection::LimitationsChanged);
    }
    if original.missing_context != candidate.missing_context {
        return Err(RepairRejection::MissingContextChanged);
    }
    Ok(())
}

/// The bounds of the one repair answer: `max_tokens` of the request and the largest
/// accepted content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepairOutputLimits {
    pub max_tokens: u32,
    pub max_bytes: u64,
}

/// A repair changes ids and references only, so its answer is about as long as the Draft
/// it was sent: the limits derive from the Draft's JSON size (half again plus a margin
/// for the bytes, about one token per 2 bytes plus a margin for the tokens), within the
/// configured caps. A model that loops stops near the Draft's size instead of at the cap.
pub fn repair_output_limits(
    draft_bytes: u64,
    cap_tokens: u32,
    cap_bytes: u64,
) -> RepairOutputLimits {
    let tokens = draft_bytes / 2 + 128;
    RepairOutputLimits {
        max_tokens: u32::try_from(tokens).unwrap_or(u32::MAX).min(cap_tokens),
        max_bytes: (draft_bytes + draft_bytes / 2 + 1024).min(cap_bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::draft::AnalysisKind;
    use crate::domain::evidence_guard::tests::good_draft;

    #[test]
    fn ids_and_references_may_change() {
        let original = good_draft();
        let mut repaired = original.clone();
        repaired.analyses[0].id = "B1".into();
        repaired.analyses[0].tool_call_ids = vec!["c-log-2".into()];
        repaired.conclusion.as_mut().unwrap().analysis_refs = vec!["B1".into()];
        repaired.action_plan[0].analysis_refs = vec!["B1".into(), "A2".into()];
        repaired.recommendations[0].analysis_refs.clear();
        assert_eq!(compare(&original, &repaired), Ok(()));
    }

    #[test]
    fn every_user_visible_change_is_rejected() {
        let original = good_draft();
        type Mutation = Box<dyn Fn(&mut Draft)>;
        let cases: Vec<(Mutation, RepairRejection)> = vec![
            (
                Box::new(|d| d.conclusion.as_mut().unwrap().text.push('!')),
                RepairRejection::ConclusionChanged,
            ),
            (
                Box::new(|d| d.conclusion = None),
                RepairRejection::ConclusionChanged,
            ),
            (
                Box::new(|d| d.analyses[1].text = "Slow queries found.".into()),
                RepairRejection::TextChanged {
                    section: "analyses",
                    index: 1,
                },
            ),
            (
                Box::new(|d| d.analyses[1].kind = AnalysisKind::Normal),
                RepairRejection::KindChanged { index: 1 },
            ),
            (
                Box::new(|d| d.analyses.swap(0, 1)),
                RepairRejection::TextChanged {
                    section: "analyses",
                    index: 0,
                },
            ),
            (
                Box::new(|d| {
                    d.analyses.pop();
                }),
                RepairRejection::CountChanged {
                    section: "analyses",
                    before: 2,
                    after: 1,
                },
            ),
            (
                Box::new(|d| d.action_plan[0].requires_human_confirmation = false),
                RepairRejection::ConfirmationChanged { index: 0 },
            ),
            (
                Box::new(|d| d.action_plan[0].text = "Restart the database.".into()),
                RepairRejection::TextChanged {
                    section: "action_plan",
                    index: 0,
                },
            ),
            (
                Box::new(|d| d.recommendations[0].text.clear()),
                RepairRejection::TextChanged {
                    section: "recommendations",
                    index: 0,
                },
            ),
            (
                Box::new(|d| d.limitations.clear()),
                RepairRejection::LimitationsChanged,
            ),
            (
                Box::new(|d| d.missing_context.push("x".into())),
                RepairRejection::MissingContextChanged,
            ),
        ];
        for (mutate, expected) in cases {
            let mut repaired = original.clone();
            mutate(&mut repaired);
            assert_eq!(compare(&original, &repaired), Err(expected));
        }
    }

    #[test]
    fn repair_limits_follow_the_drafts_size_within_the_caps() {
        assert_eq!(
            repair_output_limits(2_000, 4_096, 65_536),
            RepairOutputLimits {
                max_tokens: 1_128,
                max_bytes: 4_024
            }
        );
        assert_eq!(
            repair_output_limits(100_000, 4_096, 65_536),
            RepairOutputLimits {
                max_tokens: 4_096,
                max_bytes: 65_536
            }
        );
        let small = repair_output_limits(0, 4_096, 65_536);
        assert!(small.max_tokens >= 128 && small.max_bytes >= 1_024);
    }
}
