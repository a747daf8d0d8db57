//! One entry of the decision stream `P:decisions` (CONTRACT §1): what a consumer outside
//! the harness (a review queue, a data pipeline, the console) reads of a committed release.
//!
//! Entry points: [`Decision::values`] and [`CANCELLED_FIELDS`] (what the fenced commit
//! writes; [`flat`] the field/value pairs of either entry), [`DecisionRecord::from_fields`] (an entry as read back, leniently: the
//! stream is a shared key anyone with Redis access may write) and [`DecisionFilter`].

use serde::Serialize;

use super::release::{FallbackType, Outcome};

/// The stream's field names, in the order the harness writes them.
pub const FIELDS: [&str; 9] = [
    "run_id",
    "outcome",
    "fallback_type",
    "replica",
    "time",
    "total_ms",
    "overhead_ms",
    "verdict",
    "model_attempts",
];

/// Longest value kept of a field read back from the stream, in bytes (the harness writes
/// short values; anything longer was written by someone else).
const MAX_FIELD_BYTES: usize = 256;

/// A committed release, as the stream tells it.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision<'a> {
    pub run_id: &'a str,
    pub outcome: Outcome,
    pub fallback_type: Option<FallbackType>,
    pub replica: &'a str,
    /// When the release began (RFC 3339, the audit's `timings.started_at`).
    pub time: &'a str,
    pub total_ms: f64,
    pub overhead_ms: f64,
    /// SemanticGuard's verdict, if it gave one.
    pub verdict: Option<&'a str>,
    pub model_attempts: usize,
}

/// The fields in which the entry of a release stored CANCELLED (the cancel marker found at
/// the commit) differs from its decided entry, with their values there: outcome CANCELLED,
/// no fallback type, everything else as decided. The commit sends one entry's values and
/// these, not two entries.
pub const CANCELLED_FIELDS: [(&str, &str); 2] =
    [("outcome", "CANCELLED"), ("fallback_type", "none")];

/// An entry's values, in [`FIELDS`] order.
pub type Values = [String; FIELDS.len()];

impl Decision<'_> {
    /// The entry's values, in [`FIELDS`] order. Absent values are `none`.
    pub fn values(&self) -> Values {
        [
            self.run_id.to_string(),
            self.outcome.as_str().to_string(),
            self.fallback_type
                .map_or("none", FallbackType::as_str)
                .to_string(),
            self.replica.to_string(),
            self.time.to_string(),
            format!("{:.3}", self.total_ms),
            format!("{:.3}", self.overhead_ms),
            self.verdict.unwrap_or("none").to_string(),
            self.model_attempts.to_string(),
        ]
    }
}

/// An entry's field/value pairs, flat (`name, value, name, value, …`), in [`FIELDS`] order:
/// the decided entry of `values`, or with `cancelled` its CANCELLED entry
/// ([`CANCELLED_FIELDS`] in place).
pub fn flat(values: &Values, cancelled: bool) -> Vec<String> {
    let mut flat = Vec::with_capacity(2 * FIELDS.len());
    for (name, value) in FIELDS.iter().zip(values) {
        let value = CANCELLED_FIELDS
            .iter()
            .find(|(field, _)| cancelled && field == name)
            .map_or(value.as_str(), |(_, v)| v);
        flat.push((*name).to_string());
        flat.push(value.to_string());
    }
    flat
}

/// A stream entry as read back and answered by `GET /v1/decisions`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecisionRecord {
    /// The stream entry id (`MS-SEQ`): the paging cursor.
    pub id: String,
    pub run_id: String,
    pub outcome: String,
    pub fallback_type: Option<String>,
    pub replica: String,
    pub time: String,
    pub total_ms: Option<f64>,
    pub overhead_ms: Option<f64>,
    pub verdict: Option<String>,
    pub model_attempts: Option<u64>,
}

impl DecisionRecord {
    /// An entry from its id and field/value pairs. Unknown fields are ignored, missing ones
    /// empty, long values cut: whoever else writes to the stream cannot make it unreadable.
    pub fn from_fields<'v>(id: &str, pairs: impl IntoIterator<Item = (&'v str, &'v str)>) -> Self {
        let mut record = DecisionRecord {
            id: id.to_string(),
            run_id: String::new(),
            outcome: String::new(),
            fallback_type: None,
            replica: String::new(),
            time: String::new(),
            total_ms: None,
            overhead_ms: None,
            verdict: None,
            model_attempts: None,
        };
        let optional = |v: &str| (v != "none" && !v.is_empty()).then(|| cut(v));
        for (name, value) in pairs {
            match name {
                "run_id" => record.run_id = cut(value),
                "outcome" => record.outcome = cut(value),
                "fallback_type" => record.fallback_type = optional(value),
                "replica" => record.replica = cut(value),
                "time" => record.time = cut(value),
                "total_ms" => record.total_ms = value.parse().ok().filter(|v: &f64| v.is_finite()),
                "overhead_ms" => {
                    record.overhead_ms = value.parse().ok().filter(|v: &f64| v.is_finite())
                }
                "verdict" => record.verdict = optional(value),
                "model_attempts" => record.model_attempts = value.parse().ok(),
                _ => {}
            }
        }
        record
    }
}

/// `value`, at most [`MAX_FIELD_BYTES`] of it (cut at a character boundary).
fn cut(value: &str) -> String {
    let mut end = value.len().min(MAX_FIELD_BYTES);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    value[..end].to_string()
}

/// Which decisions a reader asks for (`GET /v1/decisions`'s `outcome` and `fallback_type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecisionFilter {
    pub outcome: Option<Outcome>,
    pub fallback_type: Option<FallbackType>,
}

impl DecisionFilter {
    pub fn matches(&self, record: &DecisionRecord) -> bool {
        self.outcome.is_none_or(|o| record.outcome == o.as_str())
            && self
                .fallback_type
                .is_none_or(|f| record.fallback_type.as_deref() == Some(f.as_str()))
    }
}

/// A stream entry id, `MS-SEQ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct StreamId {
    pub ms: u64,
    pub seq: u64,
}

impl StreamId {
    /// `MS-SEQ` with both parts decimal, or None.
    pub fn parse(text: &str) -> Option<StreamId> {
        let (ms, seq) = text.split_once('-')?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(ms) || !digits(seq) {
            return None;
        }
        Some(StreamId {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }

    /// The id just before this one (None before `0-0`): `before` is exclusive, and an
    /// exclusive range (`(id`) is only known to Redis 6.2 and later.
    pub fn previous(self) -> Option<StreamId> {
        match (self.ms, self.seq) {
            (0, 0) => None,
            (ms, 0) => Some(StreamId {
                ms: ms - 1,
                seq: u64::MAX,
            }),
            (ms, seq) => Some(StreamId { ms, seq: seq - 1 }),
        }
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// Per-outcome counts of the decisions in a time window (the console's header).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OutcomeCounts {
    #[serde(rename = "SUCCESS")]
    pub success: u64,
    #[serde(rename = "FALLBACK")]
    pub fallback: u64,
    #[serde(rename = "CANCELLED")]
    pub cancelled: u64,
}

impl OutcomeCounts {
    pub fn add(&mut self, outcome: &str) {
        match outcome {
            "SUCCESS" => self.success += 1,
            "FALLBACK" => self.fallback += 1,
            "CANCELLED" => self.cancelled += 1,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision() -> Decision<'static> {
        Decision {
            run_id: "r-1",
            outcome: Outcome::Fallback,
            fallback_type: Some(FallbackType::SemanticUnsupported),
            replica: "h-1",
            time: "2026-12-07T10:00:00Z",
            total_ms: 12.5,
            overhead_ms: 1.25,
            verdict: Some("UNSUPPORTED"),
            model_attempts: 1,
        }
    }

    fn fields(decision: &Decision<'_>) -> Vec<String> {
        flat(&decision.values(), false)
    }

    fn read(flat: &[String]) -> DecisionRecord {
        let pairs = flat.chunks(2).map(|p| (p[0].as_str(), p[1].as_str()));
        DecisionRecord::from_fields("5-0", pairs)
    }

    #[test]
    fn an_entry_reads_back_as_written() {
        let record = read(&fields(&decision()));
        assert_eq!(record.run_id, "r-1");
        assert_eq!(record.outcome, "FALLBACK");
        assert_eq!(
            record.fallback_type.as_deref(),
            Some("SEMANTIC_UNSUPPORTED")
        );
        assert_eq!(record.total_ms, Some(12.5));
        assert_eq!(record.overhead_ms, Some(1.25));
        assert_eq!(record.verdict.as_deref(), Some("UNSUPPORTED"));
        assert_eq!(record.model_attempts, Some(1));
        let cancelled = read(&flat(&decision().values(), true));
        assert_eq!(cancelled.outcome, "CANCELLED");
        assert_eq!(cancelled.fallback_type, None);
    }

    #[test]
    fn the_cancelled_entry_is_the_decided_one_with_the_cancelled_fields_in_place() {
        for outcome in [Outcome::Success, Outcome::Fallback, Outcome::Cancelled] {
            for fallback_type in [None, Some(FallbackType::SemanticUnsupported)] {
                let decided = Decision {
                    outcome,
                    fallback_type,
                    verdict: None,
                    ..decision()
                };
                // The same release, stored CANCELLED instead.
                let cancelled = Decision {
                    outcome: Outcome::Cancelled,
                    fallback_type: None,
                    ..decided.clone()
                };
                assert_eq!(
                    flat(&decided.values(), true),
                    fields(&cancelled),
                    "{outcome:?} {fallback_type:?}"
                );
            }
        }
        for (name, _) in CANCELLED_FIELDS {
            assert!(FIELDS.contains(&name), "{name}");
        }
    }

    #[test]
    fn entries_written_by_others_are_read_leniently() {
        let long = "é".repeat(400);
        let pairs = [
            ("outcome", "SUCCESS"),
            ("total_ms", "NaN"),
            ("model_attempts", "-1"),
            ("extra", "x"),
            ("run_id", long.as_str()),
        ];
        let record = DecisionRecord::from_fields("1-1", pairs);
        assert_eq!(record.total_ms, None);
        assert_eq!(record.model_attempts, None);
        assert!(record.run_id.len() <= MAX_FIELD_BYTES);
        assert!(record.run_id.starts_with('é'));
    }

    #[test]
    fn filters_match_outcome_and_fallback_type() {
        let record = read(&fields(&decision()));
        let mut filter = DecisionFilter::default();
        assert!(filter.matches(&record));
        filter.outcome = Some(Outcome::Fallback);
        assert!(filter.matches(&record));
        filter.fallback_type = Some(FallbackType::SemanticUnavailable);
        assert!(!filter.matches(&record));
        filter.outcome = Some(Outcome::Success);
        filter.fallback_type = None;
        assert!(!filter.matches(&record));
    }

    #[test]
    fn stream_ids_parse_and_step_back() {
        assert_eq!(StreamId::parse("12-3"), Some(StreamId { ms: 12, seq: 3 }));
        for bad in [
            "",
            "1",
            "1-",
            "-1",
            "a-1",
            "1-2-3",
            "+1-0",
            "99999999999999999999-0",
        ] {
            assert_eq!(StreamId::parse(bad), None, "{bad}");
        }
        let id = |ms, seq| StreamId { ms, seq };
        assert_eq!(id(12, 3).previous(), Some(id(12, 2)));
        assert_eq!(id(12, 0).previous(), Some(id(11, u64::MAX)));
        assert_eq!(id(0, 0).previous(), None);
        assert_eq!(id(7, 1).to_string(), "7-1");
    }
}
