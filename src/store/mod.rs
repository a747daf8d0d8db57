//! The store: where invocation records are read and release results are kept.
//!
//! [`Store`] is either [`RedisStore`] (the service; CONTRACT §1 key schema) or
//! [`MemoryStore`] (`check` and unit tests). Both answer the same questions with the same
//! meaning; the key schema lives in [`Keys`]. A failed operation is a [`StoreError`] and
//! changes nothing the caller relies on.

pub mod agent_records;
mod memory;
pub mod outage;
mod redis;

use std::time::Duration;

pub use self::memory::MemoryStore;
pub use self::redis::{CancelSubscription, RedisConnection, RedisStore};

/// The holder part of a lock token (`replica/random`), for the 409 message.
pub fn lock_holder(token: &str) -> Option<&str> {
    token
        .rsplit_once('/')
        .map(|(holder, _)| holder)
        .filter(|h| !h.is_empty())
}

/// A fresh lock token for a release on `replica`: only its holder may renew or free the
/// lock, and it says which replica holds the run.
pub fn new_lock_token(replica: &str) -> String {
    let mut token = String::with_capacity(replica.len() + 33);
    token.push_str(replica);
    token.push('/');
    crate::domain::identifiers::push_hex(&mut token, rand::random());
    token
}

use crate::domain::audit::{AuditJson, CancelSource};
use crate::domain::decision::{DecisionFilter, DecisionRecord, StreamId, Values};
use crate::domain::evidence_guard::{Rule, RunEvidence};
use crate::domain::invocation::{CallRejection, RawRecord, MAX_CALL_ID_BYTES};
use crate::telemetry;

/// The key schema (CONTRACT §1). The run id sits in `{}` so every key of a run shares a
/// Redis Cluster slot.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: std::sync::Arc<str>,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Keys {
            prefix: prefix.into(),
        }
    }

    /// `P` + `middle` + `{run}` + `suffix` (keys are built per release step: no format!).
    fn key(&self, middle: &str, run: &str, suffix: &[&str]) -> String {
        let len = self.prefix.len() + middle.len() + run.len() + 2;
        let mut key = String::with_capacity(len + suffix.iter().map(|s| s.len()).sum::<usize>());
        key.push_str(&self.prefix);
        key.push_str(middle);
        key.push('{');
        key.push_str(run);
        key.push('}');
        for part in suffix {
            key.push_str(part);
        }
        key
    }

    pub fn calls(&self, run: &str) -> String {
        self.key(":run:", run, &[":calls"])
    }
    pub fn call(&self, run: &str, call: &str) -> String {
        self.key(":run:", run, &[":call:", call])
    }
    pub fn cancelled(&self, run: &str) -> String {
        self.key(":run:", run, &[":cancelled"])
    }
    pub fn release(&self, run: &str) -> String {
        self.key(":release:", run, &[])
    }
    pub fn audit(&self, run: &str) -> String {
        self.key(":release:", run, &[":audit"])
    }
    /// The in-flight lock (a lease holding its release's token, taken by the begin script);
    /// not part of the contract's table, same slot.
    pub fn lock(&self, run: &str) -> String {
        self.key(":release:", run, &[":lock"])
    }
    pub fn cancel_channel(&self) -> String {
        format!("{}:cancel", self.prefix)
    }
    /// The decision stream `P:decisions`: no hash tag, so on a Redis Cluster it is one key
    /// in a slot of its own.
    pub fn decisions(&self) -> String {
        format!("{}:decisions", self.prefix)
    }
}

/// A store operation that failed; the `op` is the metric label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("store operation {op} failed: {message}")]
pub struct StoreError {
    pub op: &'static str,
    pub message: String,
    /// A write that may have run before it failed (a timeout or dropped connection after
    /// it was sent); false when nothing the caller relies on was done.
    pub outcome_unknown: bool,
}

impl StoreError {
    pub fn unavailable(op: &'static str, message: String) -> StoreError {
        StoreError {
            op,
            message,
            outcome_unknown: false,
        }
    }

    pub fn outcome_unknown(op: &'static str, message: String) -> StoreError {
        StoreError {
            op,
            message,
            outcome_unknown: true,
        }
    }
}

/// How the start of a release went ([`Store::begin`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Begin {
    /// A result is stored: it is the answer, nothing else happens.
    Stored(String),
    /// Another release holds the run's lock (its token) for `remaining` more at most.
    Locked { token: String, remaining: Duration },
    /// This release holds the lock now, and the run's cancel marker is set: nothing was read.
    Cancelled,
    /// This release holds the lock now and the marker is not set: the run's evidence, read
    /// in the same step as [`Store::begin`]'s `reading` asked.
    Taken(Box<RunEvidence>),
}

/// What a release reads of its run when it takes the lock ([`Store::begin`]): the
/// records of the `cited` ids and of the calls list's most recent `max_calls`, within
/// `limits`.
#[derive(Debug, Clone, Copy)]
pub struct Reading<'a> {
    pub cited: &'a [String],
    pub max_calls: usize,
    pub limits: RecordLimits,
}

/// What a release stores in its fenced commit: the decided result and its audit record
/// and, for a cancel marker found at that moment, the CANCELLED ones. Each result is a
/// whole JSON text, stored as it is; the audit record is stored as its head followed by the
/// end of the result stored ([`AuditJson`]), the head sent once.
#[derive(Debug, Clone, Copy)]
pub struct Commit<'a> {
    pub result: &'a str,
    pub cancelled_result: &'a str,
    pub audit: &'a AuditJson,
    /// The decision stream's entry of the result stored ([`DecisionEntry`]), appended after
    /// the result is stored, never for a result already stored.
    pub decision: Option<DecisionEntry<'a>>,
}

/// The entry a commit appends to `P:decisions` (`XADD … MAXLEN ~ max_len`) with the result it
/// stores: the decided entry's `values`, or for the CANCELLED result the same with
/// [`CANCELLED_FIELDS`](crate::domain::decision::CANCELLED_FIELDS) in place
/// ([`decision::flat`](crate::domain::decision::flat)).
#[derive(Debug, Clone, Copy)]
pub struct DecisionEntry<'a> {
    pub max_len: u64,
    pub values: &'a Values,
}

/// What became of a commit's decision entry ([`Store::commit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Appended {
    /// Appended in the commit's own step (or none was asked, or nothing was stored).
    Done,
    /// The append failed (counted in `harness_store_errors_total{op="append_decision"}`
    /// and logged); the result stands.
    Failed(String),
    /// Not appended yet: on a Redis Cluster the stream is in a slot of its own, which the
    /// commit script cannot touch; the caller appends it after answering
    /// ([`Store::append_decision`]).
    Deferred,
}

/// A page of `GET /v1/decisions`: the entries, newest first, and the cursor of the next
/// page (None: the stream holds nothing older).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DecisionPage {
    pub decisions: Vec<DecisionRecord>,
    pub next_before: Option<String>,
}

/// At most this many stream entries are read for one page or one count, whatever the
/// filters: a filter that matches little answers a short page with a cursor, rather than
/// reading the whole stream.
pub const MAX_DECISIONS_SCANNED: usize = 5000;

/// The value the cancel route writes into a run's cancel marker, so that a release that
/// finds the marker (at its begin, in the poll, at its commit, on any replica) knows the
/// cancel came from the HTTP API (`source="http"`). Any other value (the agent's tool layer
/// writes its own) is a `marker` cancel. CONTRACT §1 says only that the key is present.
pub const HTTP_CANCEL_MARKER: &str = "http";

/// Who set a cancel marker, from its value ([`HTTP_CANCEL_MARKER`]).
pub fn marker_source(value: &[u8]) -> CancelSource {
    match value == HTTP_CANCEL_MARKER.as_bytes() {
        true => CancelSource::Http,
        false => CancelSource::Marker,
    }
}

/// The CANCELLED audit record of a release whose commit found the cancel route's marker:
/// its `cancelled_by` (the record's last key, see
/// [`AuditEnd`](crate::domain::audit::AuditEnd)) becomes `"http"`, however the release
/// first noticed the cancel (the marker at its begin or in the poll, or pub/sub). The
/// commit script does the same in Lua.
pub fn cancelled_by_http(audit: &str) -> String {
    match audit.rfind("\"cancelled_by\":") {
        Some(at) => format!("{}\"cancelled_by\":\"http\"}}", &audit[..at]),
        None => audit.to_string(),
    }
}

/// What the cancel route did ([`Store::cancel`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelAnswer {
    /// The marker is set (and the run id published): the release, wherever it runs or
    /// whenever it starts, ends CANCELLED.
    Marked,
    /// A result is stored for the run: it never changes, so nothing was marked. The
    /// stored result's JSON.
    AlreadyStored(String),
}

/// How a fenced commit ended ([`Store::commit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Committed {
    /// The decided result is stored.
    Decided,
    /// The cancel marker was set: the CANCELLED result is stored instead; who set it.
    Cancelled(CancelSource),
    /// A result was already stored (it stands; it is the answer).
    AlreadyStored(String),
    /// The lock no longer holds this release's token: nothing was written. `stored` is the
    /// result stored by whoever took over, if any.
    LockLost { stored: Option<String> },
}

/// A run in flight on this replica, for [`Store::watch`]: its marker is checked, and its
/// lease renewed when `renew` holds its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    pub run_id: String,
    pub renew: Option<String>,
}

/// What [`Store::watch`] found for one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watch {
    pub cancelled: bool,
    /// Whether the lease was renewed (None: no renewal was asked); false = lost.
    pub renewed: Option<bool>,
}

/// Bounds on reading the agent's records (`evidence.max_record_bytes`,
/// `evidence.max_release_bytes`, `evidence.max_calls_list_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordLimits {
    pub max_record_bytes: u64,
    pub max_release_bytes: u64,
    pub max_calls_list_bytes: u64,
}

/// A run's calls list as read: the ids (most recent `max_calls`; ids that cannot name a
/// record left out), or why the list cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallsList {
    Ids(Vec<String>),
    Unreadable(CallRejection),
}

/// Records as read: the guard's fields of each readable record, the unreadable ones with
/// their rule, and the bytes loaded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadedRecords {
    pub records: foldhash::HashMap<String, RawRecord>,
    pub unreadable: foldhash::HashMap<String, CallRejection>,
    pub bytes: u64,
}

/// A record whose guard fields total `size` bytes, over `evidence.max_record_bytes`.
pub(crate) fn record_too_large(size: u64, max_record_bytes: u64) -> CallRejection {
    CallRejection::new(
        Rule::RecordTooLarge,
        format!("the record's fields hold {size} bytes, over evidence.max_record_bytes ({max_record_bytes})"),
    )
}

/// A calls list that takes `size` bytes in the store, over `evidence.max_calls_list_bytes`:
/// not read, so every call of the run is unusable.
pub(crate) fn calls_too_large(size: u64) -> CallsList {
    CallsList::Unreadable(CallRejection::new(
        Rule::CallsTooLarge,
        format!("the run's calls list takes {size} bytes, over evidence.max_calls_list_bytes"),
    ))
}

/// A record whose `size` bytes do not fit in what is left of the release's budget.
pub(crate) fn record_over_budget(size: u64) -> CallRejection {
    CallRejection::new(
        Rule::RecordOverBudget,
        format!(
            "the record's {size} bytes are past the release's budget (evidence.max_release_bytes)"
        ),
    )
}

/// The `harness_bad_records_total` reason of an unreadable record's rule.
fn bad_record_reason(rule: Rule) -> &'static str {
    match rule {
        Rule::RecordNotUtf8 => "not_utf8",
        Rule::RecordWrongType => "wrong_type",
        Rule::RecordTooLarge => "too_large",
        Rule::RecordOverBudget => "over_budget",
        Rule::CallsWrongType => "calls_wrong_type",
        Rule::CallsTooLarge => "calls_too_large",
        _ => "other",
    }
}

fn count_bad_records(loaded: &LoadedRecords) {
    for why in loaded.unreadable.values() {
        telemetry::bad_record(bad_record_reason(why.rule));
    }
}

/// A run's evidence as read: an unusable calls list and unreadable records are counted in
/// `harness_bad_records_total`.
pub(crate) fn evidence(run: &str, calls: CallsList, loaded: LoadedRecords) -> RunEvidence {
    let (calls, calls_unreadable) = match calls {
        CallsList::Ids(ids) => (ids, None),
        CallsList::Unreadable(why) => {
            telemetry::bad_record(bad_record_reason(why.rule));
            (Vec::new(), Some(why))
        }
    };
    count_bad_records(&loaded);
    RunEvidence {
        run_id: run.to_string(),
        calls,
        records: loaded.records,
        unreadable: loaded.unreadable,
        calls_unreadable,
        loaded_bytes: loaded.bytes,
    }
}

/// Ids that can name a record, in the order given, each once: blank and over-long ids
/// never reach the store.
fn lookup_ids<'a>(ids: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut seen = foldhash::HashSet::default();
    ids.filter(|id| !id.trim().is_empty() && id.len() <= MAX_CALL_ID_BYTES)
        .filter(|id| seen.insert(id.as_str()))
        .cloned()
        .collect()
}

/// The store a process uses; one per process, cloned per run (the Redis variant is larger,
/// which does not matter at this count).
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum Store {
    Memory(MemoryStore),
    Redis(RedisStore),
}

impl Store {
    /// This store for one HTTP worker's thread: Redis on connections of its own
    /// ([`RedisStore::with_own_connections`]); the in-memory store shared.
    pub fn for_worker(&self, config: &crate::config::RedisConfig) -> Result<Store, StoreError> {
        match self {
            Store::Memory(memory) => Ok(Store::Memory(memory.clone())),
            Store::Redis(redis) => Ok(Store::Redis(redis.with_own_connections(config)?)),
        }
    }

    /// The start of a release, in one round trip: the stored result, or who holds the
    /// run's lock, or the lock taken for `lease` and, unless the cancel marker is set, the
    /// run read as `reading` asks: the run's calls list (its most recent `max_calls`) and
    /// the records of the cited ids and of those calls (cited first, then the most recent
    /// calls, within `limits.max_release_bytes`). Records that are not hashes, not UTF-8 or
    /// over a limit are unusable calls, and a calls key that is not a list makes every call
    /// unusable: the agent's data, counted in `harness_bad_records_total`, never a store
    /// error.
    pub async fn begin(
        &self,
        run: &str,
        token: &str,
        lease: Duration,
        reading: Reading<'_>,
    ) -> Result<Begin, StoreError> {
        let cited = lookup_ids(reading.cited.iter());
        let reading = Reading {
            cited: &cited,
            ..reading
        };
        match self {
            Store::Memory(s) => Ok(s.begin(run, token, reading)),
            Store::Redis(s) => s.begin(run, token, lease, reading).await,
        }
    }

    /// Adds the records of `ids` that `evidence` does not hold yet (a repaired Draft may
    /// cite other ids), within what is left of the release's byte budget.
    pub async fn complete_evidence(
        &self,
        evidence: &mut RunEvidence,
        ids: &[String],
        limits: RecordLimits,
    ) -> Result<(), StoreError> {
        let missing = lookup_ids(ids.iter().filter(|id| {
            !evidence.records.contains_key(*id) && !evidence.unreadable.contains_key(*id)
        }));
        if missing.is_empty() {
            return Ok(());
        }
        let budget = limits
            .max_release_bytes
            .saturating_sub(evidence.loaded_bytes);
        let loaded = self
            .load_records(&evidence.run_id, &missing, limits, budget)
            .await?;
        evidence.records.extend(loaded.records);
        evidence.unreadable.extend(loaded.unreadable);
        evidence.loaded_bytes += loaded.bytes;
        Ok(())
    }

    async fn load_records(
        &self,
        run: &str,
        ids: &[String],
        limits: RecordLimits,
        budget: u64,
    ) -> Result<LoadedRecords, StoreError> {
        let loaded = match self {
            Store::Memory(s) => s.records(run, ids, limits.max_record_bytes, budget),
            Store::Redis(s) => s.records(run, ids, limits.max_record_bytes, budget).await?,
        };
        count_bad_records(&loaded);
        Ok(loaded)
    }

    pub async fn is_cancelled(&self, run: &str) -> Result<bool, StoreError> {
        match self {
            Store::Memory(s) => Ok(s.is_cancelled(run)),
            Store::Redis(s) => s.is_cancelled(run).await,
        }
    }

    /// Whether each run's cancel marker is set, in one pipelined round trip (one per slot on
    /// a cluster, sent at once).
    pub async fn cancel_markers(&self, runs: &[String]) -> Result<Vec<bool>, StoreError> {
        match self {
            Store::Memory(s) => Ok(runs.iter().map(|run| s.is_cancelled(run)).collect()),
            Store::Redis(s) => s.cancel_markers(runs).await,
        }
    }

    /// The cancel route: unless a result is stored, sets the durable cancel marker (value
    /// [`HTTP_CANCEL_MARKER`]) and publishes the run id on `P:cancel`. Checking the result
    /// and setting the marker is one atomic step, as the commit checks the marker.
    pub async fn cancel(&self, run: &str) -> Result<CancelAnswer, StoreError> {
        match self {
            Store::Memory(s) => Ok(s.cancel(run, HTTP_CANCEL_MARKER)),
            Store::Redis(s) => s.cancel(run).await,
        }
    }

    pub async fn get_result(&self, run: &str) -> Result<Option<String>, StoreError> {
        match self {
            Store::Memory(s) => Ok(s.get_result(run)),
            Store::Redis(s) => s.get_result(run).await,
        }
    }

    pub async fn get_audit(&self, run: &str) -> Result<Option<String>, StoreError> {
        match self {
            Store::Memory(s) => Ok(s.get_audit(run)),
            Store::Redis(s) => s.get_audit(run).await,
        }
    }

    /// The fenced commit, one atomic step: while `token` still holds the run's lock and
    /// nothing is stored, stores the result (CANCELLED if the marker is set) and its audit
    /// record, and frees the lock. A stored result's decision entry is appended in the same
    /// step where the store allows it (one node, memory), else [`Appended::Deferred`].
    pub async fn commit(
        &self,
        run: &str,
        token: &str,
        commit: &Commit<'_>,
    ) -> Result<(Committed, Appended), StoreError> {
        match self {
            Store::Memory(s) => Ok(s.commit(run, token, commit)),
            Store::Redis(s) => s.commit(run, token, commit).await,
        }
    }

    /// Appends one decision entry (flat field/value pairs) to `P:decisions`, after a
    /// commit that could not append it itself. A failure is counted and logged.
    pub async fn append_decision(&self, max_len: u64, fields: &[String]) -> Appended {
        match self {
            Store::Memory(s) => {
                s.append_decision(max_len, fields);
                Appended::Done
            }
            Store::Redis(s) => s.append_decision(max_len, fields).await,
        }
    }

    /// The newest `limit` decisions before `before` (exclusive) that pass `filter`, reading
    /// at most [`MAX_DECISIONS_SCANNED`] entries.
    pub async fn decisions(
        &self,
        limit: usize,
        before: Option<StreamId>,
        filter: DecisionFilter,
    ) -> Result<DecisionPage, StoreError> {
        let limit = limit.max(1);
        let mut end = match before {
            Some(id) => match id.previous() {
                Some(end) => Some(end),
                None => {
                    return Ok(DecisionPage {
                        decisions: Vec::new(),
                        next_before: None,
                    })
                }
            },
            None => None,
        };
        let mut decisions = Vec::with_capacity(limit.min(1000));
        let mut scanned = 0;
        loop {
            let batch = (2 * limit)
                .clamp(50, 1000)
                .min(MAX_DECISIONS_SCANNED - scanned);
            let read = self.read_decisions(end, None, batch).await?;
            scanned += read.len();
            let exhausted = read.len() < batch;
            let mut last = None;
            for record in read {
                last = StreamId::parse(&record.id);
                if filter.matches(&record) {
                    decisions.push(record);
                    if decisions.len() == limit {
                        let next_before = decisions.last().map(|r| r.id.clone());
                        return Ok(DecisionPage {
                            decisions,
                            next_before,
                        });
                    }
                }
            }
            if exhausted {
                return Ok(DecisionPage {
                    decisions,
                    next_before: None,
                });
            }
            let Some(previous) = last.and_then(StreamId::previous) else {
                return Ok(DecisionPage {
                    decisions,
                    next_before: None,
                });
            };
            if scanned >= MAX_DECISIONS_SCANNED {
                // Scanned enough for one answer: the next page goes on from here.
                return Ok(DecisionPage {
                    decisions,
                    next_before: last.map(|id| id.to_string()),
                });
            }
            end = Some(previous);
        }
    }

    /// The decisions since `since_ms` (Unix ms), newest first, at most `max` of them
    /// (answers whether there may be more).
    pub async fn decisions_since(
        &self,
        since_ms: u64,
        max: usize,
    ) -> Result<(Vec<DecisionRecord>, bool), StoreError> {
        let start = StreamId {
            ms: since_ms,
            seq: 0,
        };
        let read = self.read_decisions(None, Some(start), max + 1).await?;
        let more = read.len() > max;
        Ok((read.into_iter().take(max).collect(), more))
    }

    /// At most `count` entries from `end` (inclusive; None = newest) down to `start`
    /// (inclusive; None = oldest), newest first.
    async fn read_decisions(
        &self,
        end: Option<StreamId>,
        start: Option<StreamId>,
        count: usize,
    ) -> Result<Vec<DecisionRecord>, StoreError> {
        match self {
            Store::Memory(s) => Ok(s.read_decisions(end, start, count)),
            Store::Redis(s) => s.read_decisions(end, start, count).await,
        }
    }

    /// Checks the cancel markers of `runs` and renews the leases asked for, in one
    /// pipelined round trip.
    pub async fn watch(&self, runs: &[Watched], lease: Duration) -> Result<Vec<Watch>, StoreError> {
        match self {
            Store::Memory(s) => Ok(s.watch(runs)),
            Store::Redis(s) => s.watch(runs, lease).await,
        }
    }

    /// Frees the lock if `token` still holds it (after a failed commit or begin).
    pub async fn unlock(&self, run: &str, token: &str) -> Result<(), StoreError> {
        match self {
            Store::Memory(s) => {
                s.unlock(run, token);
                Ok(())
            }
            Store::Redis(s) => s.unlock(run, token).await,
        }
    }

    /// Whether the store answers (`/readyz`).
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            Store::Memory(_) => Ok(()),
            Store::Redis(s) => s.ping().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cancel_routes_marker_makes_the_cancelled_tail_say_http() {
        use crate::domain::audit::{Audit, AuditEnd, CancelSource, ViewPart};
        use crate::domain::release::{FallbackType, Outcome, StopReason};
        let mut audit = Audit::new("r", StopReason::FinalAnswer);
        // The console's view comes before the end's keys, whatever it holds.
        audit.view.set_query("q");
        let evidence = r#"[{"scope":{"cancelled_by":"x"}}]"#;
        audit.view.put(ViewPart::Evidence, evidence.into());
        for first_noticed in [CancelSource::Marker, CancelSource::Pubsub] {
            let decided = AuditEnd::of(
                Outcome::Fallback,
                Some(FallbackType::SemanticUnavailable),
                None,
            );
            let noticed = AuditEnd::of(Outcome::Cancelled, None, Some(first_noticed));
            for record in [
                audit.commit_json(&decided).cancelled_record(),
                audit.to_json(&noticed),
            ] {
                let rewritten: serde_json::Value =
                    serde_json::from_str(&cancelled_by_http(&record)).unwrap();
                assert_eq!(rewritten["cancelled_by"], "http", "{record}");
                assert_eq!(rewritten["outcome"], "CANCELLED");
                assert_eq!(rewritten["run_id"], "r");
                assert_eq!(
                    rewritten["view"]["evidence"],
                    serde_json::from_str::<serde_json::Value>(evidence).unwrap()
                );
            }
        }
        assert_eq!(marker_source(b"http"), CancelSource::Http);
        assert_eq!(marker_source(b"1"), CancelSource::Marker);
    }

    #[test]
    fn keys_follow_the_contract_with_hash_tags() {
        let k = Keys::new("aiops");
        assert_eq!(k.calls("r-42"), "aiops:run:{r-42}:calls");
        assert_eq!(k.call("r-42", "c-7"), "aiops:run:{r-42}:call:c-7");
        assert_eq!(k.cancelled("r-42"), "aiops:run:{r-42}:cancelled");
        assert_eq!(k.release("r-42"), "aiops:release:{r-42}");
        assert_eq!(k.audit("r-42"), "aiops:release:{r-42}:audit");
        assert_eq!(k.cancel_channel(), "aiops:cancel");
    }

    #[test]
    fn blank_over_long_and_repeated_ids_are_not_looked_up() {
        let ids = [
            "a".to_string(),
            " ".into(),
            "b".into(),
            "a".into(),
            "x".repeat(MAX_CALL_ID_BYTES + 1),
        ];
        assert_eq!(lookup_ids(ids.iter()), vec!["a", "b"]);
    }
}
