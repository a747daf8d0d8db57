//! The Redis store (CONTRACT §1): reads the agent's records, keeps results, audit records,
//! cancel markers and in-flight locks, and carries cancels between replicas on `P:cancel`.
//!
//! Commands go through one lazily connected [`RedisConnection`]: a [`ConnectionManager`] on a
//! single node (`redis.url`) or a Redis Cluster connection (`redis.cluster_nodes`) that routes
//! each command to the master of its key's slot. Both reconnect by themselves, so the service
//! starts and recovers while Redis is down. Every command and script below is written once,
//! against that connection: each script and pipeline touches one run's keys only (one slot);
//! the watch pipeline, which spans runs, is split per slot in cluster mode. Pub/sub has its
//! own connection to one node (a seed node in cluster mode, the next one after a failure):
//! a classic PUBLISH reaches every node of a cluster.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{AsyncCommands, Client, Cmd, Pipeline, RedisError, Script, Value};

use super::{Begin, CallsList, Commit, Committed, Keys, LoadedRecords, StoreError, Watch, Watched};
use crate::config::RedisConfig;
use crate::domain::evidence_guard::Rule;
use crate::domain::invocation::{CallRejection, RawRecord, MAX_CALL_ID_BYTES, RECORD_FIELDS};
use crate::telemetry;

/// Deletes the lock only if this release still holds it.
const UNLOCK_SCRIPT: &str = r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
"#;

/// The start of a release, in one step: a stored result is answered as it is; a lock held
/// by another token answers that token and how long its lease has left; otherwise the lock
/// is taken (or kept, for the same token) for one lease and the cancel marker is reported.
/// KEYS: release, lock, cancelled. ARGV: token, lease ms. Answers {what, text, number}.
const BEGIN_SCRIPT: &str = r#"
local stored = redis.call("GET", KEYS[1])
if stored then return {"stored", stored, 0} end
local holder = redis.call("GET", KEYS[2])
if holder and holder ~= ARGV[1] then
  return {"locked", holder, redis.call("PTTL", KEYS[2])}
end
redis.call("SET", KEYS[2], ARGV[1], "PX", ARGV[2])
return {"taken", "", redis.call("EXISTS", KEYS[3])}
"#;

/// The fenced commit: only while the lock still holds this token, and only if nothing is
/// stored yet, stores the decided result (or, if the cancel marker is present now, the
/// CANCELLED one) and its audit record with their TTL, and frees the lock.
/// KEYS: lock, release, audit, cancelled.
/// ARGV: token, ttl s, result, audit head, audit tail, cancelled result, cancelled tail.
/// Answers {what, stored result or ""}.
const COMMIT_SCRIPT: &str = r#"
local stored = redis.call("GET", KEYS[2])
if redis.call("GET", KEYS[1]) ~= ARGV[1] then
  return {"lost", stored or ""}
end
if stored then
  redis.call("DEL", KEYS[1])
  return {"stored", stored}
end
local what, result, tail = "decided", ARGV[3], ARGV[5]
if redis.call("EXISTS", KEYS[4]) == 1 then
  what, result, tail = "cancelled", ARGV[6], ARGV[7]
end
redis.call("SET", KEYS[2], result, "EX", ARGV[2])
redis.call("SET", KEYS[3], ARGV[4] .. tail, "EX", ARGV[2])
redis.call("DEL", KEYS[1])
return {what, ""}
"#;

/// A run's calls list, bounded: its most recent ARGV[1] ids, each at most ARGV[2] bytes
/// (longer ones are answered as "" and left out), or why it cannot be read.
/// KEYS: calls. Answers {"ok", {ids}} | {"missing"} | {"wrong_type", type}.
const CALLS_SCRIPT: &str = r#"
local t = redis.call("TYPE", KEYS[1])["ok"]
if t == "none" then return {"missing"} end
if t ~= "list" then return {"wrong_type", t} end
local ids = redis.call("LRANGE", KEYS[1], -tonumber(ARGV[1]), -1)
local max = tonumber(ARGV[2])
for i, id in ipairs(ids) do
  if #id > max then ids[i] = "" end
end
return {"ok", ids}
"#;

/// The guard's fields of each record (KEYS, in priority order), bounded: a record whose
/// fields total more than ARGV[1] bytes, or that would take the release past its budget
/// ARGV[2], is answered by its size only; other types by their type. ARGV[3..]: the fields.
/// Answers per key {"ok", size, {values}} | {"missing"} | {"wrong_type", type} |
/// {"too_large", size} | {"over_budget", size}.
const RECORDS_SCRIPT: &str = r#"
local max_record = tonumber(ARGV[1])
local budget = tonumber(ARGV[2])
local fields = {}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
local out = {}
for i, key in ipairs(KEYS) do
  local t = redis.call("TYPE", key)["ok"]
  if t == "none" then
    out[i] = {"missing"}
  elseif t ~= "hash" then
    out[i] = {"wrong_type", t}
  else
    local size = 0
    for _, f in ipairs(fields) do size = size + redis.call("HSTRLEN", key, f) end
    if size > max_record then
      out[i] = {"too_large", size}
    elseif size > budget then
      out[i] = {"over_budget", size}
    else
      budget = budget - size
      out[i] = {"ok", size, redis.call("HMGET", key, unpack(fields))}
    end
  end
end
return out
"#;

/// Renews a lease only while the lock still holds this token. Sent as EVAL (not EVALSHA)
/// inside the watch pipeline, so a Redis that forgot its scripts needs no second trip.
/// KEYS: lock. ARGV: token, lease ms. Answers 1 if renewed.
const RENEW_SCRIPT: &str = r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
"#;

/// The command connection, one node or a Redis Cluster; cheap to clone (clones share it).
#[derive(Clone)]
pub enum RedisConnection {
    /// `redis.url`: one node, one multiplexed connection that reconnects by itself.
    Single(ConnectionManager),
    /// `redis.cluster_nodes`: a connection per master, each command routed to the master of
    /// its first key's slot (MOVED/ASK followed, the slot map refreshed after a failover).
    Cluster(ClusterConnection),
}

impl RedisConnection {
    /// The connection the configuration selects, built without connecting: the first
    /// command connects.
    pub fn open(config: &RedisConfig) -> Result<RedisConnection, StoreError> {
        let response_timeout = Duration::from_millis(config.response_timeout_ms);
        let connection_timeout = Duration::from_millis(config.connection_timeout_ms);
        if config.cluster_nodes.is_empty() {
            let client = Client::open(config.url.as_str()).map_err(failed("connect"))?;
            let manager_config = ConnectionManagerConfig::new()
                .set_response_timeout(Some(response_timeout))
                .set_connection_timeout(Some(connection_timeout))
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(Duration::from_millis(500));
            let conn = ConnectionManager::new_lazy_with_config(client, manager_config)
                .map_err(failed("connect"))?;
            return Ok(RedisConnection::Single(conn));
        }
        // A command is retried (after a slot refresh) while a failover promotes a replica,
        // but never for longer than one response timeout overall: past it the caller answers
        // 503 as on a single node, and a retry of the release is safe.
        let client = ClusterClientBuilder::new(config.cluster_nodes.iter().map(String::as_str))
            .connection_timeout(connection_timeout)
            .response_timeout(response_timeout)
            .overall_response_timeout(Some(response_timeout))
            .retries(6)
            .min_retry_wait(50)
            .max_retry_wait(500)
            .build()
            .map_err(failed("connect"))?;
        let cluster_config = ClusterConfig::new()
            .set_connection_timeout(connection_timeout)
            .set_response_timeout(response_timeout);
        Ok(RedisConnection::Cluster(
            client.get_pending_async_connection_with_config(cluster_config),
        ))
    }

    /// The groups in which commands on `keys` may share a pipeline: all together on one
    /// node; per hash slot on a cluster (a pipeline is sent to one master, and a script or
    /// transaction may only touch one slot). Indices into `keys`, in order.
    fn pipeline_groups(&self, keys: &[String]) -> Vec<Vec<usize>> {
        match self {
            RedisConnection::Single(_) => vec![(0..keys.len()).collect()],
            RedisConnection::Cluster(_) => {
                let mut by_slot: HashMap<Slot, Vec<usize>> = HashMap::new();
                for (i, key) in keys.iter().enumerate() {
                    by_slot
                        .entry(Slot::for_key(key.as_bytes()))
                        .or_default()
                        .push(i);
                }
                by_slot.into_values().collect()
            }
        }
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a Cmd,
    ) -> BoxFuture<'a, redis::RedisResult<Value>> {
        match self {
            RedisConnection::Single(c) => c.req_packed_command(cmd),
            RedisConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> BoxFuture<'a, redis::RedisResult<Vec<Value>>> {
        match self {
            RedisConnection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConnection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(c) => c.get_db(),
            RedisConnection::Cluster(c) => c.get_db(),
        }
    }
}

#[derive(Clone)]
pub struct RedisStore {
    /// Where pub/sub subscribes: the one node, or every seed node of the cluster, tried in
    /// turn from `next_pubsub_node` (a subscription that fails moves it on).
    pubsub_nodes: Arc<Vec<Client>>,
    next_pubsub_node: Arc<AtomicUsize>,
    conn: RedisConnection,
    /// The commits' connection: `conn` itself, or with `redis.min_replicas_ack` > 0 one of
    /// their own, because WAIT blocks the connection it is sent on (on the server, every later
    /// command of that connection waits for it) and must not hold up begins, loads and the
    /// lease renewals of the watch tick.
    commit_conn: RedisConnection,
    keys: Keys,
    result_ttl_seconds: u64,
    /// `redis.min_replicas_ack` and its WAIT timeout: 0 = the commit does not wait.
    min_replicas_ack: u32,
    min_replicas_ack_timeout_ms: u64,
    /// Bounds a subscription attempt on one node, so a seed that does not answer at all
    /// does not hold the listener back from the next one.
    connection_timeout: Duration,
    unlock: Script,
    begin: Script,
    commit: Script,
    calls: Script,
    records: Script,
}

/// A failed read, or a write that did nothing a caller relies on.
fn failed(op: &'static str) -> impl FnOnce(RedisError) -> StoreError {
    move |e| {
        telemetry::store_error(op);
        tracing::warn!(op, error = %e, "redis operation failed");
        StoreError::unavailable(op, e.to_string())
    }
}

/// A failed write that may have run: unless the connection was refused (nothing was
/// sent), a timeout or a dropped connection leaves its outcome unknown.
fn failed_write(op: &'static str) -> impl FnOnce(RedisError) -> StoreError {
    move |e| {
        telemetry::store_error(op);
        tracing::warn!(op, error = %e, "redis write failed");
        if e.is_connection_refusal() {
            StoreError::unavailable(op, e.to_string())
        } else {
            StoreError::outcome_unknown(op, e.to_string())
        }
    }
}

impl RedisStore {
    /// Builds the store without connecting: the first command connects.
    pub fn new(config: &RedisConfig) -> Result<RedisStore, StoreError> {
        let conn = RedisConnection::open(config)?;
        let pubsub_nodes = if config.cluster_nodes.is_empty() {
            vec![Client::open(config.url.as_str()).map_err(failed("connect"))?]
        } else {
            config
                .cluster_nodes
                .iter()
                .map(|node| Client::open(node.as_str()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(failed("connect"))?
        };
        let commit_conn = match config.min_replicas_ack {
            0 => conn.clone(),
            _ => RedisConnection::open(config)?,
        };
        Ok(RedisStore {
            pubsub_nodes: Arc::new(pubsub_nodes),
            next_pubsub_node: Arc::new(AtomicUsize::new(0)),
            conn,
            commit_conn,
            keys: Keys::new(&config.key_prefix),
            result_ttl_seconds: config.result_ttl_seconds,
            min_replicas_ack: config.min_replicas_ack,
            min_replicas_ack_timeout_ms: config.min_replicas_ack_timeout_ms,
            connection_timeout: Duration::from_millis(config.connection_timeout_ms),
            unlock: Script::new(UNLOCK_SCRIPT),
            begin: Script::new(BEGIN_SCRIPT),
            commit: Script::new(COMMIT_SCRIPT),
            calls: Script::new(CALLS_SCRIPT),
            records: Script::new(RECORDS_SCRIPT),
        })
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub(super) async fn begin(
        &self,
        run: &str,
        token: &str,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        let mut conn = self.conn.clone();
        let (what, text, number): (String, String, i64) = self
            .begin
            .key(self.keys.release(run))
            .key(self.keys.lock(run))
            .key(self.keys.cancelled(run))
            .arg(token)
            .arg(lease.as_millis() as u64)
            .invoke_async(&mut conn)
            .await
            .map_err(failed("begin"))?;
        match what.as_str() {
            "stored" => Ok(Begin::Stored(text)),
            "locked" => Ok(Begin::Locked {
                token: text,
                remaining: Duration::from_millis(number.max(0) as u64),
            }),
            "taken" => Ok(Begin::Taken {
                cancelled: number == 1,
            }),
            other => Err(StoreError::unavailable(
                "begin",
                format!("unexpected answer {other:?} from the begin script"),
            )),
        }
    }

    pub(super) async fn calls(&self, run: &str, max_calls: usize) -> Result<CallsList, StoreError> {
        let mut conn = self.conn.clone();
        let answer: redis::Value = self
            .calls
            .key(self.keys.calls(run))
            .arg(max_calls.max(1))
            .arg(MAX_CALL_ID_BYTES)
            .invoke_async(&mut conn)
            .await
            .map_err(failed("load_calls"))?;
        let mut parts = array(answer).into_iter();
        match text(parts.next()).as_deref() {
            Some("ok") => Ok(CallsList::Ids(
                array(parts.next().unwrap_or(redis::Value::Nil))
                    .into_iter()
                    .filter_map(|id| bytes(id).and_then(|b| String::from_utf8(b).ok()))
                    .filter(|id| !id.is_empty())
                    .collect(),
            )),
            Some("missing") => Ok(CallsList::Ids(Vec::new())),
            Some("wrong_type") => Ok(CallsList::Unreadable(CallRejection::new(
                Rule::CallsWrongType,
                format!(
                    "the run's calls key is a {}, not a list",
                    text(parts.next()).unwrap_or_default()
                ),
            ))),
            other => Err(StoreError::unavailable(
                "load_calls",
                format!("unexpected answer {other:?} from the calls script"),
            )),
        }
    }

    pub(super) async fn records(
        &self,
        run: &str,
        ids: &[String],
        max_record_bytes: u64,
        budget: u64,
    ) -> Result<LoadedRecords, StoreError> {
        if ids.is_empty() {
            return Ok(LoadedRecords::default());
        }
        let mut invocation = self.records.prepare_invoke();
        for id in ids {
            invocation.key(self.keys.call(run, id));
        }
        invocation.arg(max_record_bytes).arg(budget);
        for field in RECORD_FIELDS {
            invocation.arg(field);
        }
        let mut conn = self.conn.clone();
        let answer: redis::Value = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(failed("load_records"))?;
        let mut loaded = LoadedRecords::default();
        for (id, found) in ids.iter().zip(array(answer)) {
            let mut parts = array(found).into_iter();
            let status = text(parts.next()).unwrap_or_default();
            let unreadable = |rule: Rule, detail: String| CallRejection::new(rule, detail);
            let why = match status.as_str() {
                "missing" => continue,
                "ok" => {
                    let size = number(parts.next());
                    let values = array(parts.next().unwrap_or(redis::Value::Nil));
                    match decode_fields(values) {
                        Ok(record) => {
                            loaded.bytes += size;
                            loaded.records.insert(id.clone(), record);
                            continue;
                        }
                        Err(field) => unreadable(
                            Rule::RecordNotUtf8,
                            format!("the record's {field} is not UTF-8"),
                        ),
                    }
                }
                "wrong_type" => unreadable(
                    Rule::RecordWrongType,
                    format!(
                        "the record is a {}, not a hash",
                        text(parts.next()).unwrap_or_default()
                    ),
                ),
                "too_large" => super::record_too_large(number(parts.next()), max_record_bytes),
                "over_budget" => super::record_over_budget(number(parts.next())),
                other => {
                    return Err(StoreError::unavailable(
                        "load_records",
                        format!("unexpected answer {other:?} from the records script"),
                    ))
                }
            };
            loaded.unreadable.insert(id.clone(), why);
        }
        Ok(loaded)
    }

    pub(super) async fn is_cancelled(&self, run: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        conn.exists(self.keys.cancelled(run))
            .await
            .map_err(failed("cancel_marker"))
    }

    /// The marker, then the publish: two commands, since on a cluster the channel and the
    /// run's marker live in different slots (a cancel is rare; two round trips). The marker
    /// is the truth: if only the publish fails, every replica still finds the marker within
    /// one `cancel.poll_interval_ms`, so the cancel is accepted.
    pub(super) async fn cancel(&self, run: &str) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: () = conn
            .set_ex(self.keys.cancelled(run), "1", self.result_ttl_seconds)
            .await
            .map_err(failed_write("cancel"))?;
        let published: Result<i64, RedisError> =
            conn.publish(self.keys.cancel_channel(), run).await;
        if let Err(e) = published {
            telemetry::store_error("cancel");
            tracing::warn!(error = %e, "cancel marker set, publish failed: the poll will find it");
        }
        Ok(())
    }

    pub(super) async fn get_result(&self, run: &str) -> Result<Option<String>, StoreError> {
        let mut conn = self.conn.clone();
        conn.get(self.keys.release(run))
            .await
            .map_err(failed("get_result"))
    }

    pub(super) async fn get_audit(&self, run: &str) -> Result<Option<String>, StoreError> {
        let mut conn = self.conn.clone();
        conn.get(self.keys.audit(run))
            .await
            .map_err(failed("get_audit"))
    }

    pub(super) async fn commit(
        &self,
        run: &str,
        token: &str,
        commit: &Commit<'_>,
    ) -> Result<Committed, StoreError> {
        let keys = [
            self.keys.lock(run),
            self.keys.release(run),
            self.keys.audit(run),
            self.keys.cancelled(run),
        ];
        let ttl = self.result_ttl_seconds.to_string();
        let args = [
            token,
            ttl.as_str(),
            commit.result,
            commit.audit_head,
            commit.audit_tail,
            commit.cancelled_result,
            commit.cancelled_audit_tail,
        ];
        let (answer, acked) = self
            .invoke_acked(&self.commit, &keys, &args)
            .await
            .map_err(failed_write("commit"))?;
        let (what, stored): (String, String) = redis::from_redis_value(answer)
            .map_err(|e| StoreError::outcome_unknown("commit", e.to_string()))?;
        let stored = Some(stored).filter(|s| !s.is_empty());
        let committed = match (what.as_str(), stored) {
            ("decided", _) => Committed::Decided,
            ("cancelled", _) => Committed::Cancelled,
            ("stored", Some(stored)) => Committed::AlreadyStored(stored),
            ("lost", stored) => return Ok(Committed::LockLost { stored }),
            (other, _) => {
                return Err(StoreError::outcome_unknown(
                    "commit",
                    format!("unexpected answer {other:?} from the commit script"),
                ))
            }
        };
        // A result is answered only once `redis.min_replicas_ack` replicas have it: the
        // master alone may die before replicating it, and a retry would decide again.
        match acked {
            Some(acked) if acked < i64::from(self.min_replicas_ack) => {
                telemetry::store_error("commit");
                let message = format!(
                    "the result is on the master, but {acked} of {} replicas acknowledged it within {} ms",
                    self.min_replicas_ack, self.min_replicas_ack_timeout_ms
                );
                tracing::warn!(op = "commit", "{message}");
                Err(StoreError::outcome_unknown("commit", message))
            }
            _ => Ok(committed),
        }
    }

    /// Runs a write script. With `redis.min_replicas_ack` = 0 that is all (one round trip).
    /// Otherwise `WAIT n timeout` follows in the same pipeline: still one round trip, and on
    /// the same connection to the same master (WAIT counts the replicas that have every write
    /// of its own connection so far, so it must share the script's connection; on a cluster
    /// the pipeline goes to the master of the script's first key, WAIT having no key). Answers
    /// the script's reply and how many replicas acknowledged (None: not asked).
    async fn invoke_acked(
        &self,
        script: &Script,
        keys: &[String],
        args: &[&str],
    ) -> Result<(Value, Option<i64>), RedisError> {
        let mut conn = self.commit_conn.clone();
        if self.min_replicas_ack == 0 {
            let mut invocation = script.prepare_invoke();
            for key in keys {
                invocation.key(key);
            }
            for arg in args {
                invocation.arg(*arg);
            }
            return Ok((invocation.invoke_async(&mut conn).await?, None));
        }
        let mut pipe = redis::pipe();
        pipe.cmd("EVALSHA")
            .arg(script.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args)
            .cmd("WAIT")
            .arg(self.min_replicas_ack)
            .arg(self.min_replicas_ack_timeout_ms);
        let answered: Result<(Value, i64), RedisError> = pipe.query_async(&mut conn).await;
        let (answer, acked) = match answered {
            // A node that does not know the script yet (a fresh or promoted master) ran
            // nothing: load it (on every node) and send the pipeline again.
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                script.load_async(&mut conn).await?;
                pipe.query_async(&mut conn).await?
            }
            other => other?,
        };
        Ok((answer, Some(acked)))
    }

    /// One pipeline for all the runs in flight here: each run's cancel marker, and the
    /// lease renewals that are due.
    pub(super) async fn watch(
        &self,
        runs: &[Watched],
        lease: Duration,
    ) -> Result<Vec<Watch>, StoreError> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        // One pipeline on a single node. On a cluster one per hash slot (a run's marker and
        // lock share its slot), all sent at once: each goes to its slot's master, so the
        // tick still takes one round trip, per master in parallel.
        let markers: Vec<String> = runs
            .iter()
            .map(|run| self.keys.cancelled(&run.run_id))
            .collect();
        let groups = self.conn.pipeline_groups(&markers);
        let sent = groups.iter().map(|group| {
            let mut pipe = redis::pipe();
            for &i in group {
                let run = &runs[i];
                pipe.exists(&markers[i]);
                if let Some(token) = &run.renew {
                    pipe.cmd("EVAL")
                        .arg(RENEW_SCRIPT)
                        .arg(1)
                        .arg(self.keys.lock(&run.run_id))
                        .arg(token)
                        .arg(lease.as_millis() as u64);
                }
            }
            let mut conn = self.conn.clone();
            async move { pipe.query_async::<Vec<i64>>(&mut conn).await }
        });
        let replies = futures::future::try_join_all(sent)
            .await
            .map_err(failed("watch"))?;
        let mut watched = vec![
            Watch {
                cancelled: false,
                renewed: None,
            };
            runs.len()
        ];
        for (group, answers) in groups.iter().zip(replies) {
            let mut answers = answers.into_iter();
            for &i in group {
                let cancelled = answers.next() == Some(1);
                let renewed = runs[i].renew.as_ref().map(|_| answers.next() == Some(1));
                watched[i] = Watch { cancelled, renewed };
            }
        }
        Ok(watched)
    }

    pub(super) async fn unlock(&self, run: &str, token: &str) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: i64 = self
            .unlock
            .key(self.keys.lock(run))
            .arg(token)
            .invoke_async(&mut conn)
            .await
            .map_err(failed_write("unlock"))?;
        Ok(())
    }

    pub(super) async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(failed("ping"))?;
        Ok(())
    }

    /// Opens a dedicated pub/sub connection subscribed to `P:cancel`. On a cluster it goes
    /// to one seed node, master or replica (a classic PUBLISH reaches every node over the
    /// cluster bus); each call starts at the seed after the last one used, and tries every
    /// seed, so a subscription lost with its node moves to another one.
    pub async fn subscribe_cancels(&self) -> Result<CancelSubscription, StoreError> {
        let nodes = self.pubsub_nodes.len().max(1);
        let start = self.next_pubsub_node.fetch_add(1, Ordering::Relaxed);
        let mut failure = StoreError::unavailable("subscribe", "no node to subscribe on".into());
        for i in 0..nodes {
            let Some(client) = self.pubsub_nodes.get((start + i) % nodes) else {
                continue;
            };
            let subscribed = async {
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(self.keys.cancel_channel()).await?;
                Ok::<_, RedisError>(pubsub)
            };
            match tokio::time::timeout(self.connection_timeout, subscribed).await {
                Ok(Ok(pubsub)) => return Ok(CancelSubscription { pubsub }),
                Ok(Err(e)) => failure = failed("subscribe")(e),
                Err(_) => {
                    failure = failed("subscribe")(RedisError::from((
                        redis::ErrorKind::Io,
                        "subscribing timed out",
                    )))
                }
            }
        }
        Err(failure)
    }
}

/// The items of an array reply (nothing for any other reply).
fn array(value: redis::Value) -> Vec<redis::Value> {
    match value {
        redis::Value::Array(items) => items,
        _ => Vec::new(),
    }
}

/// The bytes of a string reply.
fn bytes(value: redis::Value) -> Option<Vec<u8>> {
    match value {
        redis::Value::BulkString(b) => Some(b),
        redis::Value::SimpleString(s) => Some(s.into_bytes()),
        _ => None,
    }
}

/// A short status word from a script (always ASCII).
fn text(value: Option<redis::Value>) -> Option<String> {
    value
        .and_then(bytes)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn number(value: Option<redis::Value>) -> u64 {
    match value {
        Some(redis::Value::Int(n)) => n.max(0) as u64,
        _ => 0,
    }
}

/// The record's fields (in `RECORD_FIELDS` order; nil = absent) decoded as UTF-8, or the
/// name of the first field that is not.
fn decode_fields(values: Vec<redis::Value>) -> Result<RawRecord, &'static str> {
    let mut record = RawRecord::new();
    for (field, value) in RECORD_FIELDS.iter().zip(values) {
        if let Some(b) = bytes(value) {
            let text = String::from_utf8(b).map_err(|_| *field)?;
            record.insert((*field).to_string(), text);
        }
    }
    Ok(record)
}

/// A live subscription to `P:cancel`; dropping it closes its connection.
pub struct CancelSubscription {
    pubsub: redis::aio::PubSub,
}

impl CancelSubscription {
    /// The next published run id; `None` when the connection is gone (re-subscribe then).
    pub async fn next_run_id(&mut self) -> Option<String> {
        loop {
            let msg = self.pubsub.on_message().next().await?;
            match msg.get_payload::<String>() {
                Ok(run) => return Some(run),
                Err(_) => continue,
            }
        }
    }
}
