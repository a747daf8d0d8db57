//! The agent's records as its tool layer writes them (CONTRACT §1), for everything in this
//! crate that plays the agent: the `seed` and `check` commands, the soak, tests and
//! benchmarks. One type, [`AgentRecords`], read from invocations in bundle form, and one
//! writer per store.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::{Keys, MemoryStore};

/// One invocation in bundle form: the record's fields, all optional (a field left out is
/// absent from the record), and the run whose key holds it when that is not its own.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Invocation {
    pub run_id: Option<String>,
    pub tool_call_id: Option<String>,
    pub tool_name: Option<String>,
    pub lifecycle: Option<String>,
    pub evidence_status: Option<String>,
    /// The projection as the agent wrote it: JSON text, so a string here (an object is the
    /// commonest mistake, and its error says so).
    #[serde(default, deserialize_with = "projection_text")]
    pub agent_result: Option<String>,
    pub raw_response: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// Store under this run's key instead of the record's own `run_id`.
    pub stored_under: Option<String>,
}

/// `agent_result`: a string (the projection's JSON text) or null; anything else is an error
/// that says what is expected.
fn projection_text<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    struct Text;
    impl serde::de::Visitor<'_> for Text {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON string holding the projection (its JSON written as one string: \"{\\\"tool\\\": ...}\")")
        }
        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
            Ok(Some(text.to_string()))
        }
        fn visit_string<E: serde::de::Error>(self, text: String) -> Result<Self::Value, E> {
            Ok(Some(text))
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    deserializer.deserialize_any(Text)
}

/// The fields of a record as the agent writes them, `raw_response` and `started_at` too
/// (the harness reads only [`RECORD_FIELDS`](crate::domain::invocation::RECORD_FIELDS) of
/// them, into a [`RawRecord`](crate::domain::invocation::RawRecord)).
pub type RecordFields = BTreeMap<String, String>;

/// One record: the run whose key holds it, its call id and its fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRecord {
    pub run: String,
    pub call: String,
    pub fields: RecordFields,
}

/// How a writer treats a run's calls list that exists already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallsLists {
    /// Replaced (replaying a recorded run).
    Replace,
    /// Appended to (a tool layer adding calls as they start).
    Append,
}

/// Why invocations in bundle form make no records.
#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    /// Every record is stored under its call's id.
    #[error("invocations[{0}] has no tool_call_id")]
    NoToolCallId(usize),
    /// A JSON invocation is not in bundle form (an unknown field, a value of the wrong type).
    #[error("an invocation: {0}")]
    NotAnInvocation(#[source] serde_json::Error),
}

/// Records and the calls list of each run they belong to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentRecords {
    pub records: Vec<AgentRecord>,
    pub calls: BTreeMap<String, Vec<String>>,
}

impl AgentRecords {
    /// The records of `invocations`, each stored under `stored_under`, else its `run_id`,
    /// else `default_run`; each run's calls list is its records in order, unless `calls`
    /// names it.
    pub fn new(
        invocations: &[Invocation],
        default_run: &str,
        calls: &BTreeMap<String, Vec<String>>,
    ) -> Result<AgentRecords, RecordsError> {
        let mut out = AgentRecords::default();
        for (i, inv) in invocations.iter().enumerate() {
            let call = inv
                .tool_call_id
                .clone()
                .ok_or(RecordsError::NoToolCallId(i))?;
            let run = inv
                .stored_under
                .clone()
                .or_else(|| inv.run_id.clone())
                .unwrap_or_else(|| default_run.to_string());
            let fields = [
                ("run_id", &inv.run_id),
                ("tool_call_id", &inv.tool_call_id),
                ("tool_name", &inv.tool_name),
                ("lifecycle", &inv.lifecycle),
                ("evidence_status", &inv.evidence_status),
                ("agent_result", &inv.agent_result),
                ("raw_response", &inv.raw_response),
                ("started_at", &inv.started_at),
                ("finished_at", &inv.finished_at),
            ];
            let fields: RecordFields = fields
                .into_iter()
                .filter_map(|(k, v)| v.clone().map(|v| (k.to_string(), v)))
                .collect();
            out.calls.entry(run.clone()).or_default().push(call.clone());
            out.records.push(AgentRecord { run, call, fields });
        }
        for (run, list) in calls {
            out.calls.insert(run.clone(), list.clone());
        }
        Ok(out)
    }

    /// From invocations as JSON objects (the soak's and the tests' fixtures).
    pub fn from_json(
        invocations: &[Value],
        default_run: &str,
    ) -> Result<AgentRecords, RecordsError> {
        let parsed = invocations
            .iter()
            .map(|v| Invocation::deserialize(v).map_err(RecordsError::NotAnInvocation))
            .collect::<Result<Vec<_>, _>>()?;
        AgentRecords::new(&parsed, default_run, &BTreeMap::new())
    }

    /// Into the in-memory store.
    pub fn write_memory(&self, store: &MemoryStore) {
        for r in &self.records {
            store.insert_record(&r.run, &r.call, r.fields.clone());
        }
        for (run, calls) in &self.calls {
            store.set_calls(run, calls.clone());
        }
    }

    /// Into a Redis pipeline (send it with `.query_async`): each record's HASH replaced,
    /// each run's calls list replaced or appended to.
    pub fn write_redis(&self, pipe: &mut redis::Pipeline, keys: &Keys, lists: CallsLists) {
        for run in self.runs() {
            self.write_run(pipe, keys, lists, run);
        }
    }

    /// Sets a TTL on every record and calls list written (the soak's runs expire with their
    /// results; the agent's own records are the agent's business).
    pub fn expire_redis(&self, pipe: &mut redis::Pipeline, keys: &Keys, ttl_seconds: u64) {
        let ttl = i64::try_from(ttl_seconds).unwrap_or(i64::MAX);
        for r in &self.records {
            pipe.expire(keys.call(&r.run, &r.call), ttl).ignore();
        }
        for run in self.calls.keys() {
            pipe.expire(keys.calls(run), ttl).ignore();
        }
    }

    /// The same writes as one transaction per run (a run's keys share a Redis Cluster
    /// slot; different runs' may not).
    pub fn redis_transactions(&self, keys: &Keys, lists: CallsLists) -> Vec<redis::Pipeline> {
        self.runs()
            .into_iter()
            .map(|run| {
                let mut pipe = redis::pipe();
                pipe.atomic();
                self.write_run(&mut pipe, keys, lists, run);
                pipe
            })
            .collect()
    }

    /// Every run that has a record or a calls list.
    fn runs(&self) -> std::collections::BTreeSet<&str> {
        self.records
            .iter()
            .map(|r| r.run.as_str())
            .chain(self.calls.keys().map(String::as_str))
            .collect()
    }

    fn write_run(&self, pipe: &mut redis::Pipeline, keys: &Keys, lists: CallsLists, run: &str) {
        for r in self.records.iter().filter(|r| r.run == run) {
            let key = keys.call(&r.run, &r.call);
            pipe.del(&key).ignore();
            let fields: Vec<(&String, &String)> = r.fields.iter().collect();
            if !fields.is_empty() {
                pipe.hset_multiple(&key, &fields).ignore();
            }
        }
        if let Some(calls) = self.calls.get(run) {
            if lists == CallsLists::Replace {
                pipe.del(keys.calls(run)).ignore();
            }
            if !calls.is_empty() {
                pipe.rpush(keys.calls(run), calls).ignore();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn records_go_under_their_run_or_stored_under_and_make_the_calls_lists() {
        let records = AgentRecords::from_json(
            &[
                json!({"run_id": "r-1", "tool_call_id": "c-1", "lifecycle": "READY"}),
                json!({"run_id": "r-2", "tool_call_id": "c-2", "stored_under": "r-1"}),
                json!({"tool_call_id": "c-3"}),
            ],
            "r-9",
        )
        .unwrap();
        let runs: Vec<_> = records.records.iter().map(|r| r.run.as_str()).collect();
        assert_eq!(runs, ["r-1", "r-1", "r-9"]);
        assert_eq!(records.calls["r-1"], ["c-1", "c-2"]);
        assert_eq!(records.calls["r-9"], ["c-3"]);
        assert_eq!(records.records[0].fields.len(), 3);
        assert!(!records.records[1].fields.contains_key("stored_under"));
        let error = |invocation| {
            AgentRecords::from_json(&[invocation], "r")
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            error(json!({"run_id": "r"})),
            "invocations[0] has no tool_call_id"
        );
        assert!(error(json!({"tool_call_id": 7})).starts_with("an invocation: invalid type"));
    }
}
