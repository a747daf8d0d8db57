//! The in-memory store: `check` fills it from a run bundle; unit tests use it directly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::agent_records::RecordFields;
use super::{Appended, Begin, CallsList, Commit, Committed, LoadedRecords, Watch, Watched};
use crate::domain::audit::CancelSource;
use crate::domain::decision::{self, DecisionRecord, StreamId};
use crate::domain::invocation::{RawRecord, MAX_CALL_ID_BYTES, RECORD_FIELDS};

#[derive(Debug, Default)]
struct Data {
    calls: HashMap<String, Vec<String>>,
    records: HashMap<(String, String), RecordFields>,
    /// Cancel markers and their values.
    cancelled: HashMap<String, String>,
    results: HashMap<String, (String, String)>,
    locks: HashMap<String, String>,
    /// The decision stream, oldest first: entry id and flat field/value pairs.
    decisions: std::collections::VecDeque<(StreamId, Vec<String>)>,
}

/// A process-local store with the same meaning as the Redis one. Cloning shares the data.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    data: Arc<Mutex<Data>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        MemoryStore::default()
    }

    fn data(&self) -> MutexGuard<'_, Data> {
        // A panic while holding this lock leaves plain maps behind; keep using them.
        self.data
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stores a record under `P:run:{run}:call:{call}` (as the agent's tool layer would).
    pub fn insert_record(&self, run: &str, call: &str, record: RecordFields) {
        self.data()
            .records
            .insert((run.to_string(), call.to_string()), record);
    }

    /// Replaces the run's calls list.
    pub fn set_calls(&self, run: &str, calls: Vec<String>) {
        self.data().calls.insert(run.to_string(), calls);
    }

    pub(super) fn begin(&self, run: &str, token: &str, reading: super::Reading<'_>) -> Begin {
        let mut data = self.data();
        if let Some((result, _)) = data.results.get(run) {
            return Begin::Stored(result.clone());
        }
        match data.locks.get(run) {
            Some(holder) if holder != token => Begin::Locked {
                token: holder.clone(),
                remaining: std::time::Duration::ZERO,
            },
            _ => {
                data.locks.insert(run.to_string(), token.to_string());
                if data.cancelled.contains_key(run) {
                    return Begin::Cancelled;
                }
                drop(data);
                let (calls, loaded) = self.load(run, reading);
                Begin::Taken(Box::new(super::evidence(run, calls, loaded)))
            }
        }
    }

    /// The calls list as the Redis store reads it; its size in the store is counted as
    /// each id's bytes plus 8 (Redis's MEMORY USAGE differs by its nodes' overhead).
    pub(super) fn calls(&self, run: &str, max_calls: usize, max_list_bytes: u64) -> CallsList {
        let data = self.data();
        let calls = data.calls.get(run).map(Vec::as_slice).unwrap_or_default();
        let size: u64 = calls.iter().map(|id| id.len() as u64 + 8).sum();
        if size > max_list_bytes {
            return super::calls_too_large(size);
        }
        CallsList::Ids(
            calls[calls.len().saturating_sub(max_calls.max(1))..]
                .iter()
                .filter(|id| !id.is_empty() && id.len() <= MAX_CALL_ID_BYTES)
                .cloned()
                .collect(),
        )
    }

    /// The calls list and the records of the cited ids and of the listed calls (most
    /// recent first), as the Redis store's scripts read them.
    pub(super) fn load(
        &self,
        run: &str,
        reading: super::Reading<'_>,
    ) -> (CallsList, LoadedRecords) {
        let (cited, limits) = (reading.cited, reading.limits);
        let calls = self.calls(run, reading.max_calls, limits.max_calls_list_bytes);
        let listed = match &calls {
            CallsList::Ids(ids) => ids.as_slice(),
            CallsList::Unreadable(_) => &[],
        };
        let ids = super::lookup_ids(cited.iter().chain(listed.iter().rev()));
        let loaded = self.records(run, &ids, limits.max_record_bytes, limits.max_release_bytes);
        (calls, loaded)
    }

    /// The guard's fields of each record, within the same limits as the Redis store.
    pub(super) fn records(
        &self,
        run: &str,
        ids: &[String],
        max_record_bytes: u64,
        mut budget: u64,
    ) -> LoadedRecords {
        let data = self.data();
        let mut loaded = LoadedRecords::default();
        for id in ids {
            let Some(stored) = data.records.get(&(run.to_string(), id.clone())) else {
                continue;
            };
            let record: RawRecord = RECORD_FIELDS
                .iter()
                .filter_map(|f| Some((*f, stored.get(*f)?.clone())))
                .collect();
            let size = record.len_bytes();
            if size > max_record_bytes {
                let why = super::record_too_large(size, max_record_bytes);
                loaded.unreadable.insert(id.clone(), why);
            } else if size > budget {
                loaded
                    .unreadable
                    .insert(id.clone(), super::record_over_budget(size));
            } else {
                budget -= size;
                loaded.bytes += size;
                loaded.records.insert(id.clone(), record);
            }
        }
        loaded
    }

    pub(super) fn is_cancelled(&self, run: &str) -> bool {
        self.data().cancelled.contains_key(run)
    }

    pub(super) fn cancel(&self, run: &str, marker: &str) -> super::CancelAnswer {
        let mut data = self.data();
        if let Some((result, _)) = data.results.get(run) {
            return super::CancelAnswer::AlreadyStored(result.clone());
        }
        data.cancelled.insert(run.to_string(), marker.to_string());
        super::CancelAnswer::Marked
    }

    /// Sets a marker as the agent's tool layer would (any value but the cancel route's).
    pub fn set_cancel_marker(&self, run: &str, value: &str) {
        self.data()
            .cancelled
            .insert(run.to_string(), value.to_string());
    }

    pub(super) fn get_result(&self, run: &str) -> Option<String> {
        self.data().results.get(run).map(|(r, _)| r.clone())
    }

    pub(super) fn get_audit(&self, run: &str) -> Option<String> {
        self.data().results.get(run).map(|(_, a)| a.clone())
    }

    pub(super) fn commit(&self, run: &str, token: &str, commit: &Commit) -> (Committed, Appended) {
        let mut data = self.data();
        let stored = data.results.get(run).map(|(r, _)| r.clone());
        if data.locks.get(run).map(String::as_str) != Some(token) {
            return (Committed::LockLost { stored }, Appended::Done);
        }
        data.locks.remove(run);
        if let Some(stored) = stored {
            return (Committed::AlreadyStored(stored), Appended::Done);
        }
        let marker = data
            .cancelled
            .get(run)
            .map(|value| super::marker_source(value.as_bytes()));
        let (result, audit) = match marker {
            Some(CancelSource::Http) => (
                commit.cancelled_result,
                super::cancelled_by_http(&commit.audit.cancelled_record()),
            ),
            Some(_) => (commit.cancelled_result, commit.audit.cancelled_record()),
            None => (commit.result, commit.audit.decided_record()),
        };
        data.results
            .insert(run.to_string(), (result.to_string(), audit));
        if let Some(entry) = commit.decision {
            push_decision(
                &mut data,
                entry.max_len,
                &decision::flat(entry.values, marker.is_some()),
            );
        }
        let committed = match marker {
            Some(source) => Committed::Cancelled(source),
            None => Committed::Decided,
        };
        (committed, Appended::Done)
    }

    pub(super) fn append_decision(&self, max_len: u64, fields: &[String]) {
        push_decision(&mut self.data(), max_len, fields);
    }

    /// At most `count` entries from `end` down to `start` (both inclusive), newest first.
    pub(super) fn read_decisions(
        &self,
        end: Option<StreamId>,
        start: Option<StreamId>,
        count: usize,
    ) -> Vec<DecisionRecord> {
        let data = self.data();
        data.decisions
            .iter()
            .rev()
            .filter(|(id, _)| end.is_none_or(|end| *id <= end))
            .take_while(|(id, _)| start.is_none_or(|start| *id >= start))
            .take(count)
            .map(|(id, flat)| {
                let pairs = flat.chunks(2).filter_map(|pair| match pair {
                    [name, value] => Some((name.as_str(), value.as_str())),
                    _ => None,
                });
                DecisionRecord::from_fields(&id.to_string(), pairs)
            })
            .collect()
    }

    pub(super) fn watch(&self, runs: &[Watched]) -> Vec<Watch> {
        let data = self.data();
        runs.iter()
            .map(|run| Watch {
                cancelled: data.cancelled.contains_key(&run.run_id),
                renewed: run
                    .renew
                    .as_ref()
                    .map(|token| data.locks.get(&run.run_id) == Some(token)),
            })
            .collect()
    }

    pub(super) fn unlock(&self, run: &str, token: &str) {
        let mut data = self.data();
        if data.locks.get(run).map(String::as_str) == Some(token) {
            data.locks.remove(run);
        }
    }
}

/// Appends an entry with the next id (the clock's ms, as Redis makes them), keeping about
/// `max_len` entries.
fn push_decision(data: &mut Data, max_len: u64, fields: &[String]) {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let id = match data.decisions.back() {
        Some((last, _)) if last.ms >= ms => StreamId {
            ms: last.ms,
            seq: last.seq + 1,
        },
        _ => StreamId { ms, seq: 0 },
    };
    data.decisions.push_back((id, fields.to_vec()));
    while data.decisions.len() as u64 > max_len.max(1) {
        data.decisions.pop_front();
    }
}
