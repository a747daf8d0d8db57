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
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{AsyncCommands, Client, Cmd, IntoConnectionInfo, Pipeline, RedisError, Script, Value};

use super::{
    Begin, CallsList, Commit, Committed, Keys, LoadedRecords, Reading, StoreError, Watch, Watched,
};
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

/// What both record-reading scripts share: `put` appends one item of the answer (see
/// [`Items`]), `read_record` appends one record's answer. Its guard fields (`fields`) are
/// read whole only when they total at most `max_record` bytes and fit in `budget`; it
/// answers the budget left. A record answer is `ok` SIZE fields... | `missing` |
/// `wrong_type` TYPE | `too_large` SIZE | `over_budget` SIZE.
macro_rules! record_reader_lua {
    () => {
        r#"
local out = {}
local function put(s)
  if s then
    s = tostring(s)
    out[#out + 1] = #s .. ":"
    out[#out + 1] = s
  else
    out[#out + 1] = "-"
  end
end
local function read_record(key, fields, max_record, budget)
  local kind = redis.call("TYPE", key)["ok"]
  if kind == "none" then put("missing") return budget end
  if kind ~= "hash" then put("wrong_type") put(kind) return budget end
  local size = 0
  for _, f in ipairs(fields) do size = size + redis.call("HSTRLEN", key, f) end
  if size > max_record then put("too_large") put(size) return budget end
  if size > budget then put("over_budget") put(size) return budget end
  put("ok")
  put(size)
  local values = redis.call("HMGET", key, unpack(fields))
  for j = 1, #fields do put(values[j]) end
  return budget - size
end
"#
    };
}

/// The start of a release, in one step: a stored result is answered as it is; a lock held
/// by another token answers that token and how long its lease has left; otherwise the lock
/// is taken (or kept, for the same token) for one lease and, unless the cancel marker is
/// set, the run's evidence is read at once, so that a release needs no second round trip
/// before it decides.
///
/// The evidence: the calls list (bounded: its most recent ARGV[3] ids, each at most ARGV[4]
/// bytes; longer ones are answered as "" and not looked up) and the guard's fields of the
/// records of the cited ids (KEYS[5..]) and then of the listed calls, most recent first
/// (their keys are ARGV[7] followed by the id: the run's own key prefix, so every key is in
/// the run's slot). Ids that are not UTF-8, blank (Unicode white space only), over-long or
/// repeated are not looked up, as [`super::lookup_ids`] does for the cited ones. A record
/// whose fields total more than ARGV[5] bytes, or that would take the release past its
/// budget ARGV[6], is answered by its size only; other types by their type.
///
/// KEYS: release, lock, cancelled, calls, cited record keys.
/// ARGV: token, lease ms, max calls, max id bytes, max record bytes, budget, record key
/// prefix, the fields.
/// The answer is one string of items ([`Items`]: `LEN:BYTES`, or `-` for nil), which costs
/// far less to read than nested replies: `stored` RESULT | `locked` TOKEN MS | `cancelled`
/// | `taken`, then the calls (`ok` N ids... | `missing` | `wrong_type` TYPE) and the
/// records as [`read_records`] reads them.
const BEGIN_SCRIPT: &str = concat!(
    record_reader_lua!(),
    r#"
local stored = redis.call("GET", KEYS[1])
if stored then
  put("stored")
  put(stored)
  return table.concat(out)
end
local holder = redis.call("GET", KEYS[2])
if holder and holder ~= ARGV[1] then
  put("locked")
  put(holder)
  put(math.max(0, redis.call("PTTL", KEYS[2])))
  return table.concat(out)
end
redis.call("SET", KEYS[2], ARGV[1], "PX", ARGV[2])
if redis.call("EXISTS", KEYS[3]) == 1 then
  put("cancelled")
  return table.concat(out)
end
put("taken")
local function utf8(s)
  local i, n = 1, #s
  while i <= n do
    local c, len = s:byte(i), 0
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then len = 3
    elseif c >= 0xF0 and c <= 0xF4 then len = 4
    else return false end
    if i + len - 1 > n then return false end
    for j = i + 1, i + len - 1 do
      local d = s:byte(j)
      if d < 0x80 or d > 0xBF then return false end
    end
    local d = s:byte(i + 1)
    if (c == 0xE0 and d < 0xA0) or (c == 0xED and d > 0x9F)
      or (c == 0xF0 and d < 0x90) or (c == 0xF4 and d > 0x8F) then return false end
    i = i + len
  end
  return true
end
local function blank(id)
  local rest = id:gsub("[\t-\r ]", "")
  rest = rest:gsub("\194[\133\160]", ""):gsub("\225\154\128", "")
  rest = rest:gsub("\226\128[\128-\138\168\169\175]", ""):gsub("\226\129\159", "")
  rest = rest:gsub("\227\128\128", "")
  return #rest == 0
end
local max_calls, max_id = tonumber(ARGV[3]), tonumber(ARGV[4])
local max_record, budget = tonumber(ARGV[5]), tonumber(ARGV[6])
local prefix = ARGV[7]
local fields = {}
for i = 8, #ARGV do fields[#fields + 1] = ARGV[i] end
local listed = {}
local t = redis.call("TYPE", KEYS[4])["ok"]
if t == "none" then
  put("missing")
elseif t ~= "list" then
  put("wrong_type")
  put(t)
else
  listed = redis.call("LRANGE", KEYS[4], -max_calls, -1)
  put("ok")
  put(#listed)
  for i, id in ipairs(listed) do
    if #id > max_id then listed[i] = "" end
    put(listed[i])
  end
end
local ids, keys, seen = {}, {}, {}
for i = 5, #KEYS do
  local id = string.sub(KEYS[i], #prefix + 1)
  if not seen[id] then
    seen[id] = true
    ids[#ids + 1] = id
    keys[#keys + 1] = KEYS[i]
  end
end
for i = #listed, 1, -1 do
  local id = listed[i]
  if id ~= "" and not seen[id] and utf8(id) and not blank(id) then
    seen[id] = true
    ids[#ids + 1] = id
    keys[#keys + 1] = prefix .. id
  end
end
put(#ids)
for i, key in ipairs(keys) do
  put(ids[i])
  budget = read_record(key, fields, max_record, budget)
end
return table.concat(out)
"#
);

/// The guard's fields of the records of KEYS (in priority order; the ids a repaired Draft
/// cites that the begin script did not read), bounded and answered as [`BEGIN_SCRIPT`]
/// reads records. ARGV: max record bytes, budget, the run's record key prefix, the fields.
const RECORDS_SCRIPT: &str = concat!(
    record_reader_lua!(),
    r#"
local max_record, budget, prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
put(#KEYS)
for _, key in ipairs(KEYS) do
  put(string.sub(key, #prefix + 1))
  budget = read_record(key, fields, max_record, budget)
end
return table.concat(out)
"#
);

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
        // Commands are small and answered one by one: Nagle's algorithm would only hold a
        // command back while an earlier one of the multiplexed connection is unacknowledged
        // (redis-rs leaves TCP_NODELAY off unless told).
        let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
        if config.cluster_nodes.is_empty() {
            let info = config
                .url
                .as_str()
                .into_connection_info()
                .map_err(failed("connect"))?
                .set_tcp_settings(tcp);
            let client = Client::open(info).map_err(failed("connect"))?;
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
            .tcp_settings(tcp)
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
    /// Shared by every clone (a clone per release step): the scripts' texts are large.
    scripts: Arc<Scripts>,
}

/// The Lua scripts, loaded into Redis by their first use (EVALSHA, then EVAL if missing).
struct Scripts {
    unlock: Script,
    begin: Script,
    commit: Script,
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
        let (conn, commit_conn) = RedisStore::open_connections(config)?;
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
            scripts: Arc::new(Scripts {
                unlock: Script::new(UNLOCK_SCRIPT),
                begin: Script::new(BEGIN_SCRIPT),
                commit: Script::new(COMMIT_SCRIPT),
                records: Script::new(RECORDS_SCRIPT),
            }),
        })
    }

    /// The same store on connections of its own, for one HTTP worker: they connect on first
    /// use, so their I/O is driven on the thread whose releases use them, and a command does
    /// not hop to the thread that opened a shared connection and back. The scripts and the
    /// pub/sub seeds stay shared.
    pub fn with_own_connections(&self, config: &RedisConfig) -> Result<RedisStore, StoreError> {
        let (conn, commit_conn) = RedisStore::open_connections(config)?;
        Ok(RedisStore {
            conn,
            commit_conn,
            ..self.clone()
        })
    }

    /// The command connection and the commits' connection (see `commit_conn`), not yet
    /// connected.
    fn open_connections(
        config: &RedisConfig,
    ) -> Result<(RedisConnection, RedisConnection), StoreError> {
        let conn = RedisConnection::open(config)?;
        let commit_conn = match config.min_replicas_ack {
            0 => conn.clone(),
            _ => RedisConnection::open(config)?,
        };
        Ok((conn, commit_conn))
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The begin script ([`BEGIN_SCRIPT`]): the stored result, or who holds the lock, or
    /// the lock taken and, unless the marker is set, the run read as `reading` asks.
    pub(super) async fn begin(
        &self,
        run: &str,
        token: &str,
        lease: Duration,
        reading: Reading<'_>,
    ) -> Result<Begin, StoreError> {
        let script = &self.scripts.begin;
        let call_prefix = self.keys.call(run, "");
        let cited = reading.cited;
        let cited_bytes: usize = cited.iter().map(|id| call_prefix.len() + id.len()).sum();
        let mut cmd = evalsha(
            script,
            4 + cited.len(),
            4 + cited.len() + 7 + RECORD_FIELDS.len(),
            5 * call_prefix.len() + cited_bytes + token.len() + 300,
        );
        cmd.arg(self.keys.release(run))
            .arg(self.keys.lock(run))
            .arg(self.keys.cancelled(run))
            .arg(self.keys.calls(run));
        for id in cited {
            cmd.arg(self.keys.call(run, id));
        }
        cmd.arg(token)
            .arg(lease.as_millis() as u64)
            .arg(reading.max_calls.max(1))
            .arg(MAX_CALL_ID_BYTES)
            .arg(reading.limits.max_record_bytes)
            .arg(reading.limits.max_release_bytes)
            .arg(call_prefix)
            .arg(&RECORD_FIELDS[..]);
        let mut conn = self.conn.clone();
        let answer: Vec<u8> = invoke(script, &cmd, &mut conn)
            .await
            .map_err(failed("begin"))?;
        read_begin(&answer, run, reading.limits.max_record_bytes).map_err(|what| {
            telemetry::store_error("begin");
            StoreError::unavailable("begin", format!("unexpected {what} from the begin script"))
        })
    }

    /// The records of `ids` within `budget` bytes ([`RECORDS_SCRIPT`]; the ids a repaired
    /// Draft cites that the begin script did not read).
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
        let script = &self.scripts.records;
        let call_prefix = self.keys.call(run, "");
        let keys_bytes: usize = ids.iter().map(|id| call_prefix.len() + id.len()).sum();
        let mut cmd = evalsha(
            script,
            ids.len(),
            ids.len() + 3 + RECORD_FIELDS.len(),
            keys_bytes + call_prefix.len() + 200,
        );
        for id in ids {
            cmd.arg(self.keys.call(run, id));
        }
        cmd.arg(max_record_bytes)
            .arg(budget)
            .arg(call_prefix)
            .arg(&RECORD_FIELDS[..]);
        let mut conn = self.conn.clone();
        let answer: Vec<u8> = invoke(script, &cmd, &mut conn)
            .await
            .map_err(failed("load_records"))?;
        let mut items = Items::new(&answer);
        read_records(&mut items, max_record_bytes)
            .and_then(|loaded| items.end().map(|()| loaded))
            .map_err(|what| {
                telemetry::store_error("load_records");
                StoreError::unavailable(
                    "load_records",
                    format!("unexpected {what} from the records script"),
                )
            })
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
            .invoke_acked(&self.scripts.commit, &keys, &args)
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
            let bytes = keys.iter().map(String::len).sum::<usize>()
                + args.iter().map(|a| a.len()).sum::<usize>();
            let mut cmd = evalsha(script, keys.len(), keys.len() + args.len(), bytes);
            cmd.arg(keys).arg(args);
            return Ok((invoke(script, &cmd, &mut conn).await?, None));
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
            Err(e) if forgot_script(&e) => {
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
        let script = &self.scripts.unlock;
        let mut cmd = evalsha(script, 1, 2, run.len() + token.len() + 64);
        cmd.arg(self.keys.lock(run)).arg(token);
        let _: i64 = invoke(script, &cmd, &mut conn)
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

/// The items of a record-reading script's answer: `LEN:BYTES`, or `-` for nil.
struct Items<'a> {
    answer: &'a [u8],
    /// The whole answer as text, when it is UTF-8 (nearly always): every item is then text
    /// too, and is taken from it without checking its bytes again. An item sits between
    /// ASCII (the `:` before it, the next item's length or `-`, or the end), so it begins
    /// and ends on character boundaries of a UTF-8 answer.
    text: Option<&'a str>,
    /// Where the next item starts.
    at: usize,
}

impl<'a> Items<'a> {
    fn new(answer: &'a [u8]) -> Items<'a> {
        Items {
            answer,
            text: std::str::from_utf8(answer).ok(),
            at: 0,
        }
    }

    /// Where the next item is in the answer (None for nil), or `what` if the answer ends
    /// or is malformed here. One pass over its length's digits up to the `:`, rather than
    /// finding the `:` first and reading the digits after.
    fn next_range(&mut self, what: &'static str) -> Result<Option<Range<usize>>, &'static str> {
        let answer = self.answer;
        let mut at = self.at;
        if answer.get(at) == Some(&b'-') {
            self.at = at + 1;
            return Ok(None);
        }
        let mut len = 0usize;
        loop {
            match answer.get(at) {
                // At least one digit before the `:`.
                Some(b':') if at > self.at => break,
                Some(&byte) => len = then_digit(len, byte).ok_or(what)?,
                None => return Err(what),
            }
            at += 1;
        }
        let start = at + 1;
        let end = start
            .checked_add(len)
            .filter(|end| *end <= answer.len())
            .ok_or(what)?;
        self.at = end;
        Ok(Some(start..end))
    }

    /// The next item (None for nil), or `what` if the answer ends or is malformed here.
    fn next(&mut self, what: &'static str) -> Result<Option<Item<'a>>, &'static str> {
        let Some(range) = self.next_range(what)? else {
            return Ok(None);
        };
        let item = match self.text.and_then(|text| text.get(range.clone())) {
            Some(text) => Item::Text(text),
            None => Item::Bytes(&self.answer[range]),
        };
        Ok(Some(item))
    }

    /// The next item, which must be there.
    fn item(&mut self, what: &'static str) -> Result<Item<'a>, &'static str> {
        self.next(what)?.ok_or(what)
    }

    fn text(&mut self, what: &'static str) -> Result<&'a str, &'static str> {
        self.item(what)?.text().ok_or(what)
    }

    fn number(&mut self, what: &'static str) -> Result<u64, &'static str> {
        let range = self.next_range(what)?.ok_or(what)?;
        decimal(&self.answer[range])
            .and_then(|n| u64::try_from(n).ok())
            .ok_or(what)
    }

    /// Nothing may follow the last item.
    fn end(&self) -> Result<(), &'static str> {
        if self.at == self.answer.len() {
            Ok(())
        } else {
            Err("trailing bytes")
        }
    }
}

/// An item of an answer: text, or bytes that are not UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item<'a> {
    Text(&'a str),
    Bytes(&'a [u8]),
}

impl<'a> Item<'a> {
    /// The item as text, if it is UTF-8.
    fn text(self) -> Option<&'a str> {
        match self {
            Item::Text(text) => Some(text),
            Item::Bytes(bytes) => std::str::from_utf8(bytes).ok(),
        }
    }
}

/// `digits` as a number: one or more ASCII digits, nothing else, no overflow.
fn decimal(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0usize, |n, &d| then_digit(n, d))
}

/// `n` with the ASCII digit `byte` written after it; None for any other byte or an
/// overflow.
fn then_digit(n: usize, byte: u8) -> Option<usize> {
    let digit = byte.checked_sub(b'0').filter(|d| *d <= 9)?;
    n.checked_mul(10)?.checked_add(usize::from(digit))
}

/// `EVALSHA` of `script` with `keys` keys, which follow with `.arg`, then the arguments:
/// the command `Script::prepare_invoke` sends, written straight into one `Cmd` (the
/// invocation first copied every key and argument into a `Vec` of its own, then all of them
/// again into the command). On a cluster it is routed by its first key, as the invocation was.
/// `args` and `bytes` size the command for the keys and arguments that follow (their
/// number and a bound on their bytes), so that it is not grown as they are added.
fn evalsha(script: &Script, keys: usize, args: usize, bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 + args, 64 + bytes);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    cmd
}

/// Sends `cmd` (an [`evalsha`] of `script`). A node that does not know the script yet (a
/// fresh, restarted or promoted master) ran nothing: it gets the script, then `cmd` again.
async fn invoke<T: redis::FromRedisValue>(
    script: &Script,
    cmd: &Cmd,
    conn: &mut impl ConnectionLike,
) -> Result<T, RedisError> {
    match cmd.query_async(conn).await {
        Err(e) if forgot_script(&e) => {
            script.load_async(conn).await?;
            cmd.query_async(conn).await
        }
        other => other,
    }
}

/// `NOSCRIPT`: the node does not know the script (fresh, restarted or promoted) and ran
/// nothing, so it is safe to load it and send the command again.
fn forgot_script(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// The begin script's answer ([`BEGIN_SCRIPT`]).
fn read_begin(answer: &[u8], run: &str, max_record_bytes: u64) -> Result<Begin, &'static str> {
    let mut items = Items::new(answer);
    let begin = match items.text("begin answer")? {
        "stored" => Begin::Stored(items.text("stored result")?.to_string()),
        "locked" => Begin::Locked {
            token: items.text("lock holder")?.to_string(),
            remaining: Duration::from_millis(items.number("lease left")?),
        },
        "cancelled" => Begin::Cancelled,
        "taken" => {
            let (calls, loaded) = read_run(&mut items, max_record_bytes)?;
            Begin::Taken(Box::new(super::evidence(run, calls, loaded)))
        }
        _ => return Err("begin answer"),
    };
    items.end()?;
    Ok(begin)
}

/// The evidence [`BEGIN_SCRIPT`] read: the calls list, then the records.
fn read_run(
    items: &mut Items<'_>,
    max_record_bytes: u64,
) -> Result<(CallsList, LoadedRecords), &'static str> {
    let calls = match items.text("calls answer")? {
        "ok" => {
            let n = items.number("number of calls")?;
            let mut ids = Vec::with_capacity(n.min(4096) as usize);
            for _ in 0..n {
                // Over-long ids come as "", ids that are not UTF-8 are left out: neither
                // can name a record.
                if let Some(id) = items.item("call id")?.text() {
                    if !id.is_empty() {
                        ids.push(id.to_string());
                    }
                }
            }
            CallsList::Ids(ids)
        }
        "missing" => CallsList::Ids(Vec::new()),
        "wrong_type" => CallsList::Unreadable(CallRejection::new(
            Rule::CallsWrongType,
            format!(
                "the run's calls key is a {}, not a list",
                items.text("calls type")?
            ),
        )),
        _ => return Err("calls answer"),
    };
    let loaded = read_records(items, max_record_bytes)?;
    Ok((calls, loaded))
}

/// The records of a script's answer ([`record_reader_lua`]): their number, then per
/// record its id and its answer. A missing record is left out; an unreadable one is an
/// unusable call with its rule.
fn read_records(
    items: &mut Items<'_>,
    max_record_bytes: u64,
) -> Result<LoadedRecords, &'static str> {
    let mut loaded = LoadedRecords::default();
    for _ in 0..items.number("number of records")? {
        let id = items.text("record id")?.to_string();
        let why = match items.text("record answer")? {
            "missing" => continue,
            "ok" => {
                let size = items.number("record size")?;
                // `size` is what the fields read hold (the script answers no more than
                // evidence.max_record_bytes of them): the record's one allocation.
                let capacity = usize::try_from(size.min(max_record_bytes)).unwrap_or(0);
                let mut record = RawRecord::with_capacity(capacity);
                let mut not_utf8 = None;
                for (index, field) in RECORD_FIELDS.into_iter().enumerate() {
                    if let Some(value) = items.next("record field")? {
                        match value.text() {
                            Some(text) => record.set(index, text),
                            None => {
                                not_utf8.get_or_insert(field);
                            }
                        }
                    }
                }
                match not_utf8 {
                    None => {
                        loaded.bytes += size;
                        loaded.records.insert(id, record);
                        continue;
                    }
                    Some(field) => CallRejection::new(
                        Rule::RecordNotUtf8,
                        format!("the record's {field} is not UTF-8"),
                    ),
                }
            }
            "wrong_type" => CallRejection::new(
                Rule::RecordWrongType,
                format!("the record is a {}, not a hash", items.text("record type")?),
            ),
            "too_large" => super::record_too_large(items.number("record size")?, max_record_bytes),
            "over_budget" => super::record_over_budget(items.number("record size")?),
            _ => return Err("record answer"),
        };
        loaded.unreadable.insert(id, why);
    }
    Ok(loaded)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Items as a script writes them: `LEN:BYTES`, or `-` for `None`.
    fn answer(items: &[Option<&[u8]>]) -> Vec<u8> {
        let mut out = Vec::new();
        for item in items {
            match item {
                Some(bytes) => {
                    out.extend_from_slice(format!("{}:", bytes.len()).as_bytes());
                    out.extend_from_slice(bytes);
                }
                None => out.push(b'-'),
            }
        }
        out
    }

    /// One record's items: its id, `ok`, its size and the seven fields, `-` for the last.
    fn record_items<'a>(id: &'a [u8], field: &'a [u8]) -> Vec<Option<&'a [u8]>> {
        let mut items = vec![Some(id), Some(&b"ok"[..]), Some(&b"10"[..])];
        items.extend(std::iter::repeat_n(Some(field), RECORD_FIELDS.len() - 1));
        items.push(None);
        items
    }

    fn read(items: &[Option<&[u8]>]) -> Result<LoadedRecords, &'static str> {
        let bytes = answer(items);
        let mut items = Items::new(&bytes);
        let loaded = read_records(&mut items, 1 << 20)?;
        items.end().map(|()| loaded)
    }

    #[test]
    fn characters_at_the_edges_of_items_are_read_whole() {
        let mut items = vec![Some(&b"2"[..])];
        items.extend(record_items("é-1".as_bytes(), "é mid €".as_bytes()));
        items.extend(record_items(b"c-2", "€".as_bytes()));
        let loaded = read(&items).unwrap();
        assert!(loaded.unreadable.is_empty());
        assert_eq!(loaded.records["é-1"].get("run_id"), Some("é mid €"));
        assert_eq!(loaded.records["é-1"].get("finished_at"), None);
        assert_eq!(loaded.records["c-2"].get("agent_result"), Some("€"));
        assert_eq!(loaded.bytes, 20);
    }

    #[test]
    fn a_record_that_is_not_utf8_is_unreadable_and_the_others_are_read() {
        let euro = "€".as_bytes();
        for bad in [&b"\xff"[..], &euro[..1], &euro[1..]] {
            let mut items = vec![Some(&b"2"[..])];
            items.extend(record_items(b"c-bin", bad));
            items.extend(record_items(b"c-ok", b"text"));
            let loaded = read(&items).unwrap();
            assert_eq!(
                loaded.unreadable["c-bin"].rule,
                Rule::RecordNotUtf8,
                "{bad:?}"
            );
            assert_eq!(loaded.records["c-ok"].get("tool_name"), Some("text"));
            assert!(!loaded.records.contains_key("c-bin"));
        }
        // A character split over two items is not UTF-8 in either.
        let mut items = vec![Some(&b"1"[..]), Some(&b"c-split"[..])];
        items.extend([Some(&b"ok"[..]), Some(&b"3"[..]), Some(&euro[..2])]);
        items.push(Some(&euro[2..]));
        items.extend(std::iter::repeat_n(None, RECORD_FIELDS.len() - 2));
        let loaded = read(&items).unwrap();
        assert_eq!(loaded.unreadable["c-split"].rule, Rule::RecordNotUtf8);
    }

    #[test]
    fn a_malformed_answer_is_an_error() {
        let good = answer(&[Some(&b"0"[..])]);
        assert_eq!(good, b"1:0");
        for bad in [
            &b""[..],
            b"x:0",
            b":0",
            b"+1:0",
            b"2:0",
            b"1:0trailing",
            b"1:1",
            b"99999999999999999999999:0",
        ] {
            let mut items = Items::new(bad);
            let read = read_records(&mut items, 1 << 20).and_then(|_| items.end());
            assert!(read.is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    /// The reader as it was: find the `:`, then read the digits before it.
    fn next_range_by_search(answer: &[u8], at: usize) -> Result<Option<Range<usize>>, ()> {
        let rest = &answer[at..];
        if rest.first() == Some(&b'-') {
            return Ok(None);
        }
        let colon = memchr::memchr(b':', rest).ok_or(())?;
        let len = decimal(&rest[..colon]).ok_or(())?;
        let start = at + colon + 1;
        let end = start.checked_add(len).ok_or(())?;
        if end > answer.len() {
            return Err(());
        }
        Ok(Some(start..end))
    }

    proptest::proptest! {
        /// Items are read as finding the `:` first read them, from any bytes: answers as
        /// written, and the same with bytes changed, cut off or long digit runs put in.
        #[test]
        fn items_are_read_as_before(
            items in proptest::collection::vec(proptest::option::of(proptest::collection::vec(proptest::num::u8::ANY, 0..12)), 0..6),
            edits in proptest::collection::vec((proptest::num::usize::ANY, proptest::sample::select(b"0123456789:-x\xff".to_vec())), 0..3),
            digits in proptest::option::of("[0-9]{15,25}"),
            cut in proptest::num::usize::ANY,
        ) {
            let items: Vec<Option<&[u8]>> = items.iter().map(|i| i.as_deref()).collect();
            let mut bytes = answer(&items);
            if let Some(digits) = digits {
                bytes.splice(0..0, digits.bytes().chain(*b":"));
            }
            for (at, byte) in edits {
                if !bytes.is_empty() {
                    let i = at % bytes.len();
                    bytes[i] = byte;
                }
            }
            bytes.truncate(cut % (bytes.len() + 1).max(1) + bytes.len() / 2);
            let mut items = Items::new(&bytes);
            loop {
                let at = items.at;
                let before = next_range_by_search(&bytes, at);
                let now = items.next_range("item").map_err(|_| ());
                proptest::prop_assert_eq!(&now, &before, "at {} of {:?}", at, bytes);
                if now.is_err() || items.at >= bytes.len() {
                    break;
                }
                if now == Ok(None) {
                    proptest::prop_assert_eq!(items.at, at + 1);
                }
            }
        }
    }
}
