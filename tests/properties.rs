//! Property tests over the pure domain API and the SemanticGuard request builder.
//!
//! Each `proptest!` below states one promise of CONTRACT §1-§4 and checks it on generated
//! inputs: the strict parsers never panic, the repair comparison rejects every
//! user-visible change and accepts every consistent renaming of ids, and nothing a release
//! can publish (results, the verified snapshot, the SemanticGuard request) ever carries a
//! tool call id, a raw response, a Redis key, an uncited call's data or the guard's reason.
//! Generators build their own canonical records; the crate's record helpers are test-only.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;
use serde_json::{json, Value};

use release_harness::config::StructuredOutput;
use release_harness::domain::audit::Audit;
use release_harness::domain::bounded::{json_len, Redactor};
use release_harness::domain::draft::{
    ActionItem, Analysis, AnalysisKind, Conclusion, Draft, Recommendation,
};
use release_harness::domain::evidence_guard::RunEvidence;
use release_harness::domain::identifiers::RunIdentifiers;
use release_harness::domain::invocation::RawRecord;
use release_harness::domain::release::{
    self, after_judgement, DraftInput, Judgement, ReleasePolicy, ReleaseResult, Step, StopReason,
};
use release_harness::domain::repair_check::compare;
use release_harness::domain::request::{in_two_steps, parse_release};
use release_harness::domain::snapshot::{ProgressSnapshot, SnapshotLimits};
use release_harness::model::prompts::{semantic_request, RequestShape};

// ---------------------------------------------------------------------------------------
// Shared generators
// ---------------------------------------------------------------------------------------

/// Free text of a report or a query: lower case, non-blank, with a little non-ASCII. It has
/// no `_`, `{` or upper case, so it can never spell a canary, `tool_call_id` or `run:{`.
fn text() -> impl Strategy<Value = String> {
    "[a-z0-9éü–][a-z0-9 .,;éü–-]{0,24}"
}

fn kind() -> impl Strategy<Value = AnalysisKind> {
    prop_oneof![
        Just(AnalysisKind::Normal),
        Just(AnalysisKind::NegativeObservation)
    ]
}

/// 1 to 3 picks among the analyses; resolved against the ids once they exist.
fn picks() -> impl Strategy<Value = Vec<Index>> {
    prop::collection::vec(any::<Index>(), 1..4)
}

/// The picked items, in pick order, without repeats.
fn pick<T: Clone + PartialEq>(items: &[T], picks: &[Index]) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for p in picks {
        let item = p.get(items).clone();
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

prop_compose! {
    /// A Draft that is structurally valid (unique non-blank ids, non-blank texts, every
    /// reference known and non-empty); its tool call ids point at no records.
    fn valid_draft()(
        prefix in "[A-Z]{1,2}",
        analyses in prop::collection::vec(
            (kind(), text(), prop::collection::vec("c-[a-z0-9]{1,6}", 1..4)),
            1..=6,
        ),
        conclusion in prop::option::of((text(), picks())),
        action_plan in prop::collection::vec((text(), picks(), any::<bool>()), 0..4),
        recommendations in prop::collection::vec((text(), picks()), 0..4),
        limitations in prop::collection::vec(text(), 0..3),
        missing_context in prop::collection::vec(text(), 0..3),
    ) -> Draft {
        let analyses: Vec<Analysis> = analyses
            .into_iter()
            .enumerate()
            .map(|(i, (kind, text, tool_call_ids))| Analysis {
                id: format!("{prefix}{}", i + 1),
                kind,
                text,
                tool_call_ids,
            })
            .collect();
        let ids: Vec<String> = analyses.iter().map(|a| a.id.clone()).collect();
        Draft {
            conclusion: conclusion.map(|(text, p)| Conclusion {
                text,
                analysis_refs: pick(&ids, &p),
            }),
            analyses,
            action_plan: action_plan
                .into_iter()
                .map(|(text, p, confirm)| ActionItem {
                    text,
                    analysis_refs: pick(&ids, &p),
                    requires_human_confirmation: confirm,
                })
                .collect(),
            recommendations: recommendations
                .into_iter()
                .map(|(text, p)| Recommendation {
                    text,
                    analysis_refs: pick(&ids, &p),
                })
                .collect(),
            limitations,
            missing_context,
        }
    }
}

// ---------------------------------------------------------------------------------------
// a. Parsers never panic
// ---------------------------------------------------------------------------------------

const DRAFT_WORDS: &[&str] = &[
    "conclusion",
    "analyses",
    "action_plan",
    "recommendations",
    "limitations",
    "missing_context",
    "text",
    "analysis_refs",
    "id",
    "kind",
    "tool_call_ids",
    "requires_human_confirmation",
    "NORMAL",
    "NEGATIVE_OBSERVATION",
    "query",
    "draft",
    "stop_reason",
    "FINAL_ANSWER",
    "BUDGET_EXHAUSTED",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(DRAFT_WORDS).prop_map(str::to_string),
        1 => "[a-z_]{0,10}",
    ]
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop::sample::select(DRAFT_WORDS).prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ]
}

fn json_any() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// One local damage to a JSON document, applied at the end of a random path.
#[derive(Debug, Clone)]
enum Damage {
    Replace(Value),
    InsertKey(String, Value),
    RemoveChild(Index),
    Stringify,
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        json_any().prop_map(Damage::Replace),
        (key(), json_any()).prop_map(|(k, v)| Damage::InsertKey(k, v)),
        any::<Index>().prop_map(Damage::RemoveChild),
        Just(Damage::Stringify),
    ]
}

fn apply_damage(node: &mut Value, path: &[Index], damage: &Damage) {
    if let Some((step, rest)) = path.split_first() {
        let child = match node {
            Value::Object(map) if !map.is_empty() => {
                let i = step.index(map.len());
                map.values_mut().nth(i)
            }
            Value::Array(items) if !items.is_empty() => {
                let i = step.index(items.len());
                items.get_mut(i)
            }
            _ => None,
        };
        if let Some(child) = child {
            return apply_damage(child, rest, damage);
        }
    }
    match damage {
        Damage::Replace(v) => *node = v.clone(),
        Damage::InsertKey(k, v) => match node {
            Value::Object(map) => {
                map.insert(k.clone(), v.clone());
            }
            Value::Array(items) => items.push(v.clone()),
            other => *other = json!({ k.clone(): v.clone() }),
        },
        Damage::RemoveChild(i) => match node {
            Value::Object(map) if !map.is_empty() => {
                let k = map.keys().nth(i.index(map.len())).cloned();
                if let Some(k) = k {
                    map.remove(&k);
                }
            }
            Value::Array(items) if !items.is_empty() => {
                items.remove(i.index(items.len()));
            }
            other => *other = Value::Null,
        },
        Damage::Stringify => *node = Value::String(node.to_string()),
    }
}

prop_compose! {
    /// A valid Draft as JSON, damaged 0 to 3 times at random depths.
    fn near_valid_draft_json()(
        draft in valid_draft(),
        damages in prop::collection::vec(
            (prop::collection::vec(any::<Index>(), 0..5), damage()),
            0..4,
        ),
    ) -> Value {
        let mut value = serde_json::to_value(&draft).unwrap_or(Value::Null);
        for (path, d) in &damages {
            apply_damage(&mut value, path, d);
        }
        value
    }
}

fn draft_field() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => near_valid_draft_json(),
        1 => json_any(),
        1 => near_valid_draft_json().prop_map(|v| Value::String(v.to_string())),
    ]
}

prop_compose! {
    /// A release body around a (near-)valid Draft, with fields sometimes wrong or extra.
    fn near_valid_body()(
        query in prop_oneof![3 => text().prop_map(Value::from), 1 => json_leaf()],
        draft in draft_field(),
        stop in prop_oneof![
            3 => prop::sample::select(&["FINAL_ANSWER", "INFORMATION_SATURATION", "BUDGET_EXHAUSTED", "GAVE_UP"][..])
                .prop_map(Value::from),
            1 => json_leaf(),
        ],
        extra in prop::option::of((key(), json_leaf())),
        drop in prop::option::of(0usize..3),
    ) -> Value {
        let mut body = serde_json::Map::new();
        body.insert("query".into(), query);
        body.insert("draft".into(), draft);
        body.insert("stop_reason".into(), stop);
        if let Some(d) = drop {
            let k = ["query", "draft", "stop_reason"][d];
            body.remove(k);
        }
        if let Some((k, v)) = extra {
            body.insert(k, v);
        }
        Value::Object(body)
    }
}

/// Bytes that look a little like JSON more often than uniform noise does.
fn jsonish_bytes() -> impl Strategy<Value = Vec<u8>> {
    let alphabet: Vec<u8> = b"{}[]\":,. \n\\-0123456789eEtrufalsn".to_vec();
    prop::collection::vec(
        prop_oneof![
            2 => any::<u8>(),
            3 => prop::sample::select(alphabet),
        ],
        0..256,
    )
}

/// Every parser entry point on one input. A Draft that parses must survive a round trip.
fn parse_everything(text: &str) -> Result<(), TestCaseError> {
    let strict = Draft::parse_text(text);
    let submitted = Draft::parse_submitted(text);
    let _ = Draft::parse_submitted(&Value::String(text.to_string()).to_string());
    for parsed in [strict, submitted].into_iter().flatten() {
        let again =
            serde_json::to_string(&parsed).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(Draft::parse_text(&again), Ok(parsed));
    }
    // Cut at a random-ish char boundary: truncated JSON must be an error, not a panic.
    let mid = text
        .char_indices()
        .nth(text.chars().count() / 2)
        .map_or(0, |(i, _)| i);
    let _ = Draft::parse_text(&text[..mid]);
    Ok(())
}

/// A body's request: the one-pass parse answers exactly what the two steps answer.
fn parse_body(bytes: &[u8]) -> Result<(), TestCaseError> {
    let two_steps = in_two_steps("r-42", bytes);
    prop_assert_eq!(parse_release("r-42", bytes), two_steps);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn draft_parser_never_panics_on_arbitrary_bytes(
        bytes in prop_oneof![prop::collection::vec(any::<u8>(), 0..512), jsonish_bytes()],
        near_valid_draft in draft_field(),
        near_valid_body in near_valid_body(),
    ) {
        let lossy = String::from_utf8_lossy(&bytes);
        parse_everything(&lossy)?;
        parse_body(&bytes)?;

        let draft_text = near_valid_draft.to_string();
        parse_everything(&draft_text)?;
        // A duplicated key is the one JSON defect a `Value` cannot hold: splice one in.
        if let Some(rest) = draft_text.strip_prefix('{') {
            parse_everything(&format!("{{\"conclusion\":null,{rest}"))?;
        }

        let body_text = near_valid_body.to_string();
        parse_body(body_text.as_bytes())?;
        parse_body(&body_text.as_bytes()[..body_text.len() / 2])?;
    }
}

// ---------------------------------------------------------------------------------------
// b. Every user-visible change is rejected by the repair comparison
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum TextSite {
    Conclusion,
    Analysis(usize),
    Action(usize),
    Recommendation(usize),
    Limitation(usize),
    MissingContext(usize),
}

fn text_sites(d: &Draft) -> Vec<TextSite> {
    let mut sites = Vec::new();
    if d.conclusion.is_some() {
        sites.push(TextSite::Conclusion);
    }
    sites.extend((0..d.analyses.len()).map(TextSite::Analysis));
    sites.extend((0..d.action_plan.len()).map(TextSite::Action));
    sites.extend((0..d.recommendations.len()).map(TextSite::Recommendation));
    sites.extend((0..d.limitations.len()).map(TextSite::Limitation));
    sites.extend((0..d.missing_context.len()).map(TextSite::MissingContext));
    sites
}

fn text_at(d: &mut Draft, site: TextSite) -> Option<&mut String> {
    match site {
        TextSite::Conclusion => d.conclusion.as_mut().map(|c| &mut c.text),
        TextSite::Analysis(i) => d.analyses.get_mut(i).map(|a| &mut a.text),
        TextSite::Action(i) => d.action_plan.get_mut(i).map(|a| &mut a.text),
        TextSite::Recommendation(i) => d.recommendations.get_mut(i).map(|r| &mut r.text),
        TextSite::Limitation(i) => d.limitations.get_mut(i),
        TextSite::MissingContext(i) => d.missing_context.get_mut(i),
    }
}

/// Replaces, deletes or inserts exactly one char; the text always ends up different.
fn edit_one_char(text: &mut String, edit: u8, pos: Index, ch: char) {
    let mut chars: Vec<char> = text.chars().collect();
    match edit % 3 {
        0 if !chars.is_empty() => {
            let i = pos.index(chars.len());
            chars[i] = match (chars[i] == ch, ch == 'x') {
                (false, _) => ch,
                (true, false) => 'x',
                (true, true) => 'y',
            };
        }
        1 if !chars.is_empty() => {
            chars.remove(pos.index(chars.len()));
        }
        _ => chars.insert(pos.index(chars.len() + 1), ch),
    }
    *text = chars.into_iter().collect();
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    Analyses,
    ActionPlan,
    Recommendations,
    Limitations,
    MissingContext,
}

const SECTIONS: [Section; 5] = [
    Section::Analyses,
    Section::ActionPlan,
    Section::Recommendations,
    Section::Limitations,
    Section::MissingContext,
];

fn section_len(d: &Draft, s: Section) -> usize {
    match s {
        Section::Analyses => d.analyses.len(),
        Section::ActionPlan => d.action_plan.len(),
        Section::Recommendations => d.recommendations.len(),
        Section::Limitations => d.limitations.len(),
        Section::MissingContext => d.missing_context.len(),
    }
}

/// What a person sees of item `i` of a section (ids and references excluded).
fn visible_item(d: &Draft, s: Section, i: usize) -> String {
    match s {
        Section::Analyses => format!("{}|{}", d.analyses[i].kind.as_str(), d.analyses[i].text),
        Section::ActionPlan => format!(
            "{}|{}",
            d.action_plan[i].requires_human_confirmation, d.action_plan[i].text
        ),
        Section::Recommendations => d.recommendations[i].text.clone(),
        Section::Limitations => d.limitations[i].clone(),
        Section::MissingContext => d.missing_context[i].clone(),
    }
}

fn swap_items(d: &mut Draft, s: Section, i: usize, j: usize) {
    match s {
        Section::Analyses => d.analyses.swap(i, j),
        Section::ActionPlan => d.action_plan.swap(i, j),
        Section::Recommendations => d.recommendations.swap(i, j),
        Section::Limitations => d.limitations.swap(i, j),
        Section::MissingContext => d.missing_context.swap(i, j),
    }
}

fn drop_item(d: &mut Draft, s: Section, i: usize) {
    match s {
        Section::Analyses => drop(d.analyses.remove(i)),
        Section::ActionPlan => drop(d.action_plan.remove(i)),
        Section::Recommendations => drop(d.recommendations.remove(i)),
        Section::Limitations => drop(d.limitations.remove(i)),
        Section::MissingContext => drop(d.missing_context.remove(i)),
    }
}

fn add_item(d: &mut Draft, s: Section, text: String) {
    let refs = vec![d.analyses[0].id.clone()];
    match s {
        Section::Analyses => d.analyses.push(Analysis {
            id: "ZZ99".into(),
            kind: AnalysisKind::Normal,
            text,
            tool_call_ids: vec!["c-new".into()],
        }),
        Section::ActionPlan => d.action_plan.push(ActionItem {
            text,
            analysis_refs: refs,
            requires_human_confirmation: false,
        }),
        Section::Recommendations => d.recommendations.push(Recommendation {
            text,
            analysis_refs: refs,
        }),
        Section::Limitations => d.limitations.push(text),
        Section::MissingContext => d.missing_context.push(text),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MutationKind {
    EditText,
    FlipKind,
    FlipConfirmation,
    Swap,
    Drop,
    Add,
    ToggleConclusion,
}

/// The random choices behind one mutation; which ones apply depends on the Draft.
#[derive(Debug, Clone)]
struct MutationChoice {
    kind: Index,
    site: Index,
    item: Index,
    edit: u8,
    pos: Index,
    ch: char,
    new_text: String,
}

prop_compose! {
    fn mutation_choice()(
        kind in any::<Index>(),
        site in any::<Index>(),
        item in any::<Index>(),
        edit in any::<u8>(),
        pos in any::<Index>(),
        ch in any::<char>(),
        new_text in ".{0,16}",
    ) -> MutationChoice {
        MutationChoice { kind, site, item, edit, pos, ch, new_text }
    }
}

/// Applies one user-visible mutation and says which.
fn mutate(original: &Draft, m: &MutationChoice) -> (Draft, String) {
    let mut d = original.clone();
    let swaps: Vec<(Section, usize, usize)> = SECTIONS
        .iter()
        .flat_map(|&s| {
            let n = section_len(original, s);
            (0..n).flat_map(move |i| (i + 1..n).map(move |j| (s, i, j)))
        })
        .filter(|&(s, i, j)| visible_item(original, s, i) != visible_item(original, s, j))
        .collect();
    let mut kinds = vec![
        MutationKind::EditText,
        MutationKind::FlipKind,
        MutationKind::Drop,
        MutationKind::Add,
        MutationKind::ToggleConclusion,
    ];
    if !d.action_plan.is_empty() {
        kinds.push(MutationKind::FlipConfirmation);
    }
    if !swaps.is_empty() {
        kinds.push(MutationKind::Swap);
    }
    let kind = *m.kind.get(&kinds);
    let described = match kind {
        MutationKind::EditText => {
            let site = *m.site.get(&text_sites(&d));
            if let Some(text) = text_at(&mut d, site) {
                edit_one_char(text, m.edit, m.pos, m.ch);
            }
            format!("edit one char ({}) of {site:?}", m.edit % 3)
        }
        MutationKind::FlipKind => {
            let i = m.site.index(d.analyses.len());
            d.analyses[i].kind = match d.analyses[i].kind {
                AnalysisKind::Normal => AnalysisKind::NegativeObservation,
                _ => AnalysisKind::Normal,
            };
            format!("flip the kind of analyses[{i}]")
        }
        MutationKind::FlipConfirmation => {
            let i = m.site.index(d.action_plan.len());
            d.action_plan[i].requires_human_confirmation ^= true;
            format!("flip requires_human_confirmation of action_plan[{i}]")
        }
        MutationKind::Swap => {
            let (s, i, j) = *m.site.get(&swaps);
            swap_items(&mut d, s, i, j);
            format!("swap {s:?}[{i}] and [{j}]")
        }
        MutationKind::Drop => {
            let non_empty: Vec<Section> = SECTIONS
                .into_iter()
                .filter(|&s| section_len(&d, s) > 0)
                .collect();
            let s = *m.site.get(&non_empty);
            let i = m.item.index(section_len(&d, s));
            drop_item(&mut d, s, i);
            format!("drop {s:?}[{i}]")
        }
        MutationKind::Add => {
            let s = *m.site.get(&SECTIONS);
            add_item(&mut d, s, m.new_text.clone());
            format!("add an item to {s:?}")
        }
        MutationKind::ToggleConclusion => {
            d.conclusion = match d.conclusion {
                Some(_) => None,
                None => Some(Conclusion {
                    text: m.new_text.clone(),
                    analysis_refs: vec![d.analyses[0].id.clone()],
                }),
            };
            "add or remove the conclusion".to_string()
        }
    };
    (d, described)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn a_text_mutation_is_always_rejected_by_the_repair_comparison(
        original in valid_draft(),
        choice in mutation_choice(),
    ) {
        let (mutated, described) = mutate(&original, &choice);
        prop_assert_ne!(
            serde_json::to_value(original.user_visible()).ok(),
            serde_json::to_value(mutated.user_visible()).ok(),
            "generator bug: {} left the user-visible Draft unchanged", described
        );
        prop_assert!(
            compare(&original, &mutated).is_err(),
            "the repair comparison accepted: {}", described
        );
    }
}

// ---------------------------------------------------------------------------------------
// c. A consistent renaming of ids is accepted
// ---------------------------------------------------------------------------------------

fn rename_refs(refs: &mut [String], map: &HashMap<String, String>) {
    for r in refs {
        if let Some(new) = map.get(r.as_str()) {
            *r = new.clone();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn a_consistent_id_renaming_is_accepted_by_the_repair_comparison(
        (original, permutation) in valid_draft().prop_flat_map(|d| {
            let order: Vec<usize> = (0..d.analyses.len()).collect();
            (Just(d), Just(order).prop_shuffle())
        }),
        suffix in "[a-z0-9]{0,3}",
        call_prefix in "[a-z]{1,4}-",
        reverse_calls in any::<bool>(),
    ) {
        let old: Vec<String> = original.analyses.iter().map(|a| a.id.clone()).collect();
        // A permutation of distinct ids plus a common suffix: injective by construction.
        let map: HashMap<String, String> = old
            .iter()
            .zip(&permutation)
            .map(|(id, &j)| (id.clone(), format!("{}{suffix}", old[j])))
            .collect();
        let distinct: HashSet<&String> = map.values().collect();
        prop_assert_eq!(distinct.len(), old.len(), "generator bug: renaming is not injective");

        let mut renamed = original.clone();
        for analysis in &mut renamed.analyses {
            analysis.id = map[&analysis.id].clone();
            analysis.tool_call_ids = analysis
                .tool_call_ids
                .iter()
                .map(|c| format!("{call_prefix}{c}"))
                .collect();
            if reverse_calls {
                analysis.tool_call_ids.reverse();
            }
        }
        if let Some(c) = &mut renamed.conclusion {
            rename_refs(&mut c.analysis_refs, &map);
        }
        for item in &mut renamed.action_plan {
            rename_refs(&mut item.analysis_refs, &map);
        }
        for item in &mut renamed.recommendations {
            rename_refs(&mut item.analysis_refs, &map);
        }
        prop_assert_eq!(compare(&original, &renamed), Ok(()));
    }
}

// ---------------------------------------------------------------------------------------
// d. Nothing published carries a call id, a raw response, a key, uncited data or a reason
// ---------------------------------------------------------------------------------------

const CALL_CANARY: &str = "CALLCANARY";
const RAW_CANARY: &str = "RAWCANARY";
const UNCITED_CANARY: &str = "UNCITEDCANARY";
const REASON_CANARY: &str = "REASONCANARY";

/// One generated tool call: which tool, whether it found anything, and its content.
#[derive(Debug, Clone)]
struct CallSpec {
    tool: u8,
    found: bool,
    hex: String,
    items: usize,
    words: String,
}

fn call_spec(found: impl Strategy<Value = bool>) -> impl Strategy<Value = CallSpec> {
    (
        0u8..3,
        found,
        "[0-9a-f]{12}",
        1usize..4,
        "[a-z]{3,8}( [a-z]{2,6}){0,2}",
    )
        .prop_map(|(tool, found, hex, items, words)| CallSpec {
            tool,
            found,
            hex,
            items,
            words,
        })
}

/// A canonical invocation record (CONTRACT §1) for `spec`, whose excerpts, log messages or
/// first MySQL cells are `content(k)`.
fn record(
    run_id: &str,
    call_id: &str,
    spec: &CallSpec,
    lifecycle: &str,
    content: impl Fn(usize) -> String,
) -> RawRecord {
    let n = if spec.found { spec.items } else { 0 };
    let status = if spec.found {
        "EVIDENCE_FOUND"
    } else {
        "NO_EVIDENCE"
    };
    let (tool, projection) = match spec.tool {
        0 => (
            "rag_search",
            json!({"tool": "rag_search", "tool_call_id": call_id, "evidence_status": status,
                   "scope": {"query": spec.words, "index": "runbooks", "top_k": 5},
                   "hits": (0..n).map(|k| json!({
                       "doc_id": format!("kb-{k}"), "title": spec.words, "excerpt": content(k),
                       "updated_at": "2026-11-01T00:00:00Z", "score": 0.5})).collect::<Vec<_>>()}),
        ),
        1 => (
            "log_search",
            json!({"tool": "log_search", "tool_call_id": call_id, "evidence_status": status,
                   "scope": {"service": format!("svc-{}", spec.hex.chars().take(4).collect::<String>()), "query": spec.words,
                             "from": "2026-12-01T10:00:00Z", "to": "2026-12-01T11:00:00Z", "limit": 50},
                   "total_matches": n * 7,
                   "entries": (0..n).map(|k| json!({
                       "timestamp": "2026-12-01T10:05:03Z", "host": "h-1", "level": "ERROR",
                       "message": content(k)})).collect::<Vec<_>>()}),
        ),
        _ => (
            "mysql_query",
            json!({"tool": "mysql_query", "tool_call_id": call_id, "evidence_status": status,
                   "scope": {"datasource": "orders-db", "statement": spec.words,
                             "params": {"min_ms": 500}, "from": "2026-12-01T10:00:00Z",
                             "to": "2026-12-01T11:00:00Z", "max_rows": 100},
                   "columns": ["table", "count"],
                   "rows": (0..n).map(|k| json!([content(k), k])).collect::<Vec<_>>(),
                   "row_count": n}),
        ),
    };
    [
        ("run_id", run_id.to_string()),
        ("tool_call_id", call_id.to_string()),
        ("tool_name", tool.to_string()),
        ("lifecycle", lifecycle.to_string()),
        ("evidence_status", status.to_string()),
        ("agent_result", projection.to_string()),
        ("raw_response", format!("{RAW_CANARY}{}", spec.hex)),
        ("started_at", "2026-12-01T10:05:00Z".to_string()),
        ("finished_at", "2026-12-01T10:05:01Z".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// A run whose concluded Draft passes EvidenceGuard, plus uncited calls full of canaries.
#[derive(Debug, Clone)]
struct Scenario {
    run_id: String,
    query: String,
    draft: Draft,
    evidence: RunEvidence,
    reason: String,
}

prop_compose! {
    fn scenario()(
        run_hex in "[0-9a-f]{8}",
        cited in prop::collection::vec(call_spec(any::<bool>()), 1..8),
        uncited in prop::collection::vec((call_spec(Just(true)), any::<bool>()), 0..4),
        analyses in prop::collection::vec((any::<bool>(), prop::collection::vec(any::<Index>(), 1..4), text()), 1..=6),
        conclusion in (text(), picks()),
        action_plan in prop::collection::vec((text(), picks(), any::<bool>()), 0..3),
        recommendations in prop::collection::vec((text(), picks()), 0..3),
        limitations in prop::collection::vec(text(), 0..2),
        missing_context in prop::collection::vec(text(), 0..2),
        query in text(),
        reason_hex in "[0-9a-f]{12}",
    ) -> Scenario {
        let run_id = format!("r-{run_hex}");
        let mut records = foldhash::HashMap::default();
        // (sort key, id): the calls list interleaves cited and uncited calls pseudo-randomly.
        let mut calls: Vec<(String, String)> = Vec::new();
        let mut found_ids = Vec::new();
        let mut none_ids = Vec::new();
        for (i, spec) in cited.iter().enumerate() {
            let id = format!("{CALL_CANARY}{}x{i}", spec.hex);
            let words = spec.words.clone();
            records.insert(id.clone(), record(&run_id, &id, spec, "READY", |k| format!("{words} {k}")));
            calls.push((spec.hex.clone(), id.clone()));
            if spec.found { found_ids.push(id) } else { none_ids.push(id) }
        }
        for (i, (spec, usable)) in uncited.iter().enumerate() {
            let id = format!("{CALL_CANARY}{}u{i}", spec.hex);
            let lifecycle = if *usable { "READY" } else { "PROJECTING" };
            let hex = spec.hex.clone();
            records.insert(id.clone(), record(&run_id, &id, spec, lifecycle, |k| format!("{UNCITED_CANARY}{hex}n{k}")));
            calls.push((spec.hex.clone(), id));
        }
        calls.sort();

        let analyses: Vec<Analysis> = analyses
            .into_iter()
            .enumerate()
            .map(|(i, (wants_found, p, text))| {
                // There is at least one cited call, so one of the two kinds always has calls.
                let found = if found_ids.is_empty() { false } else if none_ids.is_empty() { true } else { wants_found };
                let (kind, pool) = if found {
                    (AnalysisKind::Normal, &found_ids)
                } else {
                    (AnalysisKind::NegativeObservation, &none_ids)
                };
                Analysis { id: format!("A{}", i + 1), kind, text, tool_call_ids: pick(pool, &p) }
            })
            .collect();
        let ids: Vec<String> = analyses.iter().map(|a| a.id.clone()).collect();
        let draft = Draft {
            conclusion: Some(Conclusion { text: conclusion.0, analysis_refs: pick(&ids, &conclusion.1) }),
            analyses,
            action_plan: action_plan
                .into_iter()
                .map(|(text, p, confirm)| ActionItem { text, analysis_refs: pick(&ids, &p), requires_human_confirmation: confirm })
                .collect(),
            recommendations: recommendations
                .into_iter()
                .map(|(text, p)| Recommendation { text, analysis_refs: pick(&ids, &p) })
                .collect(),
            limitations,
            missing_context,
        };
        Scenario {
            evidence: RunEvidence {
                run_id: run_id.clone(),
                calls: calls.into_iter().map(|(_, id)| id).collect(),
                records,
                ..RunEvidence::default()
            },
            run_id,
            query,
            draft,
            reason: format!("{REASON_CANARY}{reason_hex}"),
        }
    }
}

fn assert_clean(what: &str, text: &str, forbidden: &[&str]) -> Result<(), TestCaseError> {
    for f in forbidden {
        prop_assert!(!text.contains(f), "{} contains {:?}: {}", what, f, text);
    }
    Ok(())
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, TestCaseError> {
    serde_json::to_string(value).map_err(|e| TestCaseError::fail(e.to_string()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn no_snapshot_result_or_prompt_ever_contains_a_call_id_or_raw_response(
        s in scenario(),
        (max_excerpt_chars, max_excerpt_bytes, max_entries_per_call, max_rows_per_call) in (1usize..600, 1usize..600, 1usize..10, 1usize..20),
        max_facts in 1usize..=20,
    ) {
        // Random bounds, so that truncated excerpts and omitted entries are covered too.
        let snapshot = SnapshotLimits { max_excerpt_chars, max_excerpt_bytes, max_entries_per_call, max_rows_per_call };
        let policy = ReleasePolicy { snapshot, max_facts, ..ReleasePolicy::defaults() };
        let mut audit = Audit::new(&s.run_id, StopReason::FinalAnswer);
        let step = release::begin(
            StopReason::FinalAnswer,
            DraftInput::Parsed(s.draft.clone()),
            &s.evidence,
            &policy,
            &mut audit,
        );
        let judged: std::sync::Arc<_> = match step {
            Step::Judge(judged) => (*judged).into(),
            other => return Err(TestCaseError::fail(format!("expected Step::Judge, got {other:?}"))),
        };
        // The snapshot holds exactly the cited evidence, so the checks below are not vacuous.
        for (group, analysis) in judged.snapshot.analyses.iter().zip(&s.draft.analyses) {
            prop_assert_eq!(group.evidence.len(), analysis.tool_call_ids.len());
        }

        let mut results: Vec<(&str, ReleaseResult)> = vec![
            ("SUCCESS", after_judgement(&s.run_id, Judgement::Supported { reason: s.reason.clone() }, judged.clone(), &mut audit)),
            ("SEMANTIC_UNSUPPORTED", after_judgement(&s.run_id, Judgement::Unsupported { reason: s.reason.clone() }, judged.clone(), &mut audit)),
            ("SEMANTIC_UNAVAILABLE", after_judgement(&s.run_id, Judgement::Unavailable, judged.clone(), &mut audit)),
            ("EVIDENCE_VALIDATION_FAILED", ReleaseResult::evidence_validation_failed(&s.run_id)),
            ("CANCELLED", ReleaseResult::cancelled(&s.run_id)),
        ];
        prop_assert_eq!(results[0].1.report.as_ref(), Some(&s.draft.user_visible()));
        let run = s.evidence.resolve(&[]);
        let ids = RunIdentifiers::of_run(&run, &policy.key_prefix);
        let progress = ReleaseResult::insufficient_evidence(
            &s.run_id,
            ProgressSnapshot::build(&run, policy.max_facts, &Redactor::new(&ids, policy.copy)),
        );
        let mut stop_audit = Audit::new(&s.run_id, StopReason::BudgetExhausted);
        let controlled = match release::begin(
            StopReason::BudgetExhausted,
            DraftInput::Parsed(s.draft.clone()),
            &s.evidence,
            &policy,
            &mut stop_audit,
        ) {
            Step::Finish(result) => result,
            other => return Err(TestCaseError::fail(format!("expected Step::Finish, got {other:?}"))),
        };

        let secret = [CALL_CANARY, RAW_CANARY, "tool_call_id", "run:{", REASON_CANARY];
        let secret_or_uncited = [CALL_CANARY, RAW_CANARY, "tool_call_id", "run:{", REASON_CANARY, UNCITED_CANARY];
        for (name, result) in &results {
            // Built from the verified snapshot only: no uncited call either.
            assert_clean(name, &to_json(result)?, &secret_or_uncited)?;
        }
        // Built from every usable call of the run, cited or not: their summaries may show.
        results.push(("INSUFFICIENT_EVIDENCE", progress));
        results.push(("INSUFFICIENT_EVIDENCE (controlled stop)", controlled));
        for (name, result) in &results[results.len() - 2..] {
            assert_clean(name, &to_json(result)?, &secret)?;
        }

        assert_clean("verified snapshot", &to_json(&judged.snapshot)?, &secret_or_uncited)?;
        assert_clean(
            "verified sources",
            &to_json(&judged.snapshot.verified_sources())?,
            &secret_or_uncited,
        )?;

        let shape = RequestShape {
            model: "m",
            structured_output: StructuredOutput::JsonSchema,
            max_output_tokens: 512,
        };
        let request = semantic_request(&shape, &s.query, &judged.draft, &judged.snapshot, "n0nce")
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let body = &request.body().to_text();
        assert_clean("SemanticGuard request", body, &secret_or_uncited)?;
        // And it does carry what the judge needs.
        prop_assert!(body.contains(&s.query));
        for analysis in &s.draft.analyses {
            prop_assert!(body.contains(&analysis.text), "{} missing", analysis.text);
        }
    }
}

/// The record generator must produce usable records, or property d would prove nothing.
#[test]
fn generated_records_are_canonical() {
    for tool in 0..3 {
        for found in [true, false] {
            let spec = CallSpec {
                tool,
                found,
                hex: "abc".into(),
                items: 2,
                words: "timeout".into(),
            };
            let rec = record("r-1", "c-1", &spec, "READY", |k| format!("m{k}"));
            let evidence = RunEvidence {
                run_id: "r-1".into(),
                calls: vec!["c-1".into()],
                records: [("c-1".to_string(), rec)].into_iter().collect(),
                ..RunEvidence::default()
            };
            let run = evidence.resolve(&[]);
            assert!(
                run.usable.contains_key("c-1"),
                "{tool} {found}: {:?}",
                run.rejected
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// e. Hostile records: what the harness writes stays bounded and masked, and a Draft naming
//    one of the run's identifiers never reaches the judge
// ---------------------------------------------------------------------------------------

const HOSTILE_RUN: &str = "r-hostile";

/// The run's call ids as they appear in hostile text (`hc-0` .. `hc-29`).
fn hostile_id(i: usize) -> String {
    format!("hc-{i}")
}

/// Text as costly as possible to copy: control characters (6 bytes each once escaped),
/// quotes and backslashes (2), multi-byte characters, the run's call ids next to cuts, and
/// its Redis keys.
fn hostile_text() -> impl Strategy<Value = String> {
    (0u8..7, 0usize..1200, 0usize..30).prop_map(|(kind, len, id)| match kind {
        0 => "\u{1}".repeat(len),
        1 => "\"\\".repeat(len / 2),
        2 => "é€😀".repeat(len / 3),
        3 => format!(
            "see {} in aiops:run:{{{HOSTILE_RUN}}}:call:{} {}",
            hostile_id(id),
            hostile_id(id),
            "x".repeat(len)
        ),
        4 => format!("{} {}0", "y".repeat(len % 300), hostile_id(id)),
        5 => format!("aiops:release:{{{HOSTILE_RUN}}}{}", "k".repeat(len)),
        _ => "order-api".into(),
    })
}

fn hostile_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        hostile_text().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(Value::Null),
    ];
    leaf.prop_recursive(6, 120, 12, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..12).prop_map(Value::Array),
            prop::collection::vec((hostile_text(), inner), 0..12)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// One found call of a hostile run: its tool and the text and values it is built from.
#[derive(Debug, Clone)]
struct HostileCall {
    tool: u8,
    texts: Vec<String>,
    params: Value,
    items: usize,
}

fn hostile_call() -> impl Strategy<Value = HostileCall> {
    (
        0u8..3,
        prop::collection::vec(hostile_text(), 6),
        hostile_value(),
        1usize..12,
    )
        .prop_map(|(tool, texts, params, items)| HostileCall {
            tool,
            texts,
            params,
            items,
        })
}

fn hostile_record(call_id: &str, call: &HostileCall) -> RawRecord {
    let t = |i: usize| call.texts[i % call.texts.len()].clone();
    let n = call.items;
    let (tool, projection) = match call.tool {
        0 => (
            "rag_search",
            json!({"tool": "rag_search", "tool_call_id": call_id, "evidence_status": "EVIDENCE_FOUND",
                   "scope": {"query": t(0), "index": t(1), "top_k": 5},
                   "hits": (0..n).map(|k| json!({"doc_id": format!("{k}{}", t(2)), "title": t(3),
                       "excerpt": t(4), "updated_at": t(5)})).collect::<Vec<_>>()}),
        ),
        1 => (
            "log_search",
            json!({"tool": "log_search", "tool_call_id": call_id, "evidence_status": "EVIDENCE_FOUND",
                   "scope": {"service": t(0), "query": t(1), "from": t(2), "to": t(3), "limit": 50},
                   "total_matches": n,
                   "entries": (0..n).map(|_| json!({"timestamp": t(4), "host": t(5), "level": t(0),
                       "message": t(1)})).collect::<Vec<_>>()}),
        ),
        _ => {
            let params = match &call.params {
                Value::Object(map) => Value::Object(map.clone()),
                other => json!({ "p": other }),
            };
            (
                "mysql_query",
                json!({"tool": "mysql_query", "tool_call_id": call_id, "evidence_status": "EVIDENCE_FOUND",
                       "scope": {"datasource": t(0), "statement": t(1), "params": params,
                                 "from": t(2), "to": t(3), "max_rows": 100},
                       "columns": [t(4), t(5)],
                       "rows": (0..n).map(|_| json!([t(0), {"nested": [t(1)]}])).collect::<Vec<_>>(),
                       "row_count": n}),
            )
        }
    };
    [
        ("run_id", HOSTILE_RUN.to_string()),
        ("tool_call_id", call_id.to_string()),
        ("tool_name", tool.to_string()),
        ("lifecycle", "READY".to_string()),
        ("evidence_status", "EVIDENCE_FOUND".to_string()),
        ("agent_result", projection.to_string()),
        ("raw_response", format!("{RAW_CANARY}{call_id}")),
        ("started_at", "2026-12-01T10:05:00Z".to_string()),
        ("finished_at", t(2)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// A run of hostile calls and a concluded Draft citing each of them once.
fn hostile_run(calls: &[HostileCall]) -> (RunEvidence, Draft) {
    let ids: Vec<String> = (0..calls.len()).map(hostile_id).collect();
    let records = ids
        .iter()
        .zip(calls)
        .map(|(id, call)| (id.clone(), hostile_record(id, call)))
        .collect();
    let analyses: Vec<Analysis> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| Analysis {
            id: format!("A{}", i + 1),
            kind: AnalysisKind::Normal,
            text: format!("finding {i}"),
            tool_call_ids: vec![id.clone()],
        })
        .collect();
    let draft = Draft {
        conclusion: Some(Conclusion {
            text: "the pool is exhausted".into(),
            analysis_refs: vec!["A1".into()],
        }),
        analyses,
        action_plan: vec![],
        recommendations: vec![],
        limitations: vec![],
        missing_context: vec![],
    };
    let evidence = RunEvidence {
        run_id: HOSTILE_RUN.into(),
        calls: ids,
        records,
        ..RunEvidence::default()
    };
    (evidence, draft)
}

/// Whether `text` holds `id` as a whole token (written independently of the harness's own
/// matcher, so that the two check each other).
fn holds_token(text: &str, id: &str) -> bool {
    let token =
        |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    text.match_indices(id).any(|(at, _)| {
        !token(text[..at].chars().next_back()) && !token(text[at + id.len()..].chars().next())
    })
}

fn assert_no_identifiers(what: &str, text: &str, calls: usize) -> Result<(), TestCaseError> {
    for key in ["aiops:run:", "aiops:release:"] {
        prop_assert!(!text.contains(key), "{} holds a Redis key", what);
    }
    for i in 0..calls {
        prop_assert!(
            !holds_token(text, &hostile_id(i)),
            "{} holds call id {}",
            what,
            hostile_id(i)
        );
    }
    Ok(())
}

/// What the harness writes into a result from records: its sources and facts, in bytes.
fn written_bytes(result: &ReleaseResult) -> Result<(usize, usize), TestCaseError> {
    Ok((
        to_json(&result.verified_sources)?.len(),
        to_json(&result.observed_facts)?.len(),
    ))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn what_the_harness_writes_stays_under_256_kb_and_masked_whatever_the_records_hold(
        calls in prop::collection::vec(hostile_call(), 1..26),
    ) {
        let (evidence, draft) = hostile_run(&calls);
        let policy = ReleasePolicy::defaults();
        let mut results: Vec<(&str, ReleaseResult)> = Vec::new();
        let mut audit = Audit::new(HOSTILE_RUN, StopReason::BudgetExhausted);
        match release::begin(StopReason::BudgetExhausted, DraftInput::Absent, &evidence, &policy, &mut audit) {
            Step::Finish(result) => results.push(("controlled stop", result)),
            other => return Err(TestCaseError::fail(format!("expected Step::Finish, got {other:?}"))),
        }
        let mut audit = Audit::new(HOSTILE_RUN, StopReason::FinalAnswer);
        match release::begin(StopReason::FinalAnswer, DraftInput::Parsed(draft), &evidence, &policy, &mut audit) {
            Step::Judge(judged) => {
                let shape = RequestShape { model: "m", structured_output: StructuredOutput::JsonSchema, max_output_tokens: 512 };
                let request = semantic_request(&shape, QUERY_TEXT, &judged.draft, &judged.snapshot, "n0nce")
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                assert_no_identifiers("SemanticGuard request", &request.body().to_text(), calls.len())?;
                results.push(("SUCCESS", after_judgement(HOSTILE_RUN, Judgement::Supported { reason: "ok".into() }, std::sync::Arc::new(*judged), &mut audit)));
            }
            Step::Finish(result) => {
                // Only when the sources would not fit: the release fails closed.
                prop_assert_eq!(audit.violations[0].rule.as_str(), "sources_too_large");
                results.push(("sources too large", result));
            }
            Step::Repair { violations, .. } => return Err(TestCaseError::fail(format!("unexpected violations {violations:?}"))),
        }
        for (name, result) in &results {
            let (sources, facts) = written_bytes(result)?;
            prop_assert!(sources <= policy.copy.max_written_bytes, "{}: sources {}", name, sources);
            prop_assert!(facts <= policy.copy.max_written_bytes, "{}: facts {}", name, facts);
            prop_assert!(sources + facts < 256 * 1024, "{}: {} bytes", name, sources + facts);
            assert_no_identifiers(name, &to_json(result)?, calls.len())?;
        }
    }

    #[test]
    fn a_draft_naming_a_call_id_or_key_of_the_run_never_reaches_the_judge(
        s in scenario(),
        site in any::<Index>(),
        which in any::<Index>(),
        use_key in any::<bool>(),
    ) {
        let sites = text_sites(&s.draft);
        let site = *site.get(&sites);
        let name = if use_key {
            format!("aiops:run:{{{}}}:calls", s.run_id)
        } else {
            which.get(&s.evidence.calls).clone()
        };
        let mut draft = s.draft.clone();
        if let Some(text) = text_at(&mut draft, site) {
            text.push_str(&format!(" ({name})"));
        }
        let mut audit = Audit::new(&s.run_id, StopReason::FinalAnswer);
        let step = release::begin(StopReason::FinalAnswer, DraftInput::Parsed(draft), &s.evidence, &ReleasePolicy::defaults(), &mut audit);
        let result = match step {
            Step::Finish(result) => result,
            other => return Err(TestCaseError::fail(format!("expected Step::Finish, got {other:?}"))),
        };
        prop_assert_eq!(result.fallback_type.map(|f| f.as_str()), Some("EVIDENCE_VALIDATION_FAILED"));
        prop_assert!(audit.violations.iter().any(|v| v.rule.as_str() == "draft_names_identifier"));
        prop_assert!(audit.repair.as_ref().is_some_and(|r| !r.ran), "no repair call");
        for v in &audit.violations {
            prop_assert!(!v.detail.contains(&s.run_id), "the detail quotes the text: {}", v.detail);
        }
    }
}

const QUERY_TEXT: &str = "Why are order-api requests timing out?";

/// The worst the defaults allow: 20 facts of maximal MySQL scopes and RAG calls with a
/// hundred long hits, every string of control characters.
#[test]
fn the_written_part_of_a_result_is_bounded_by_the_defaults_in_the_worst_case() {
    // 300 control characters escape to 1800 bytes: as long as any string gets once cut.
    let controls = "\u{1}".repeat(300);
    let key = |i: usize| format!("{i}{controls}");
    let level3: Value = Value::Object(
        (0..9)
            .map(|i| (key(i), Value::from(controls.clone())))
            .collect(),
    );
    let params: Value = Value::Object((0..9).map(|i| (key(i), level3.clone())).collect());
    let calls: Vec<HostileCall> = (0..40)
        .map(|i| HostileCall {
            tool: if i % 2 == 0 { 2 } else { 0 },
            // Distinct per call, or equal sources would collapse into one.
            texts: vec![format!("{i}{controls}"); 6],
            params: params.clone(),
            items: if i % 2 == 0 { 1 } else { 100 },
        })
        .collect();
    let (evidence, draft) = hostile_run(&calls);
    let policy = ReleasePolicy::defaults();
    let mut audit = Audit::new(HOSTILE_RUN, StopReason::InformationSaturation);
    let Step::Finish(result) = release::begin(
        StopReason::InformationSaturation,
        DraftInput::Absent,
        &evidence,
        &policy,
        &mut audit,
    ) else {
        panic!("a controlled stop finishes at once");
    };
    let (sources, facts) = (
        json_len(&result.verified_sources),
        json_len(&result.observed_facts),
    );
    assert!(sources <= 98304 && facts <= 98304, "{sources} {facts}");
    assert!(sources > 64 * 1024, "the case is near the limit: {sources}");
    assert!(sources + facts < 256 * 1024);
    assert!(
        !result.observed_facts.is_empty(),
        "the most recent facts that fit are kept"
    );
    assert!(audit.facts_dropped > 0, "older facts were dropped to fit");

    let mut audit = Audit::new(HOSTILE_RUN, StopReason::FinalAnswer);
    let step = release::begin(
        StopReason::FinalAnswer,
        DraftInput::Parsed(draft),
        &evidence,
        &policy,
        &mut audit,
    );
    let Step::Finish(result) = step else {
        panic!("forty maximal sources cannot fit: the release fails closed");
    };
    assert_eq!(
        result.fallback_type.map(|f| f.as_str()),
        Some("EVIDENCE_VALIDATION_FAILED")
    );
    assert!(result.verified_sources.is_empty());
    assert_eq!(audit.violations[0].rule.as_str(), "sources_too_large");
    assert!(audit.repair.is_some_and(|r| !r.ran));
}
