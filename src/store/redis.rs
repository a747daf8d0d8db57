//! The Redis store (CONTRACT §1): reads the agent's records, keeps results, audit records,
//! cancel markers and in-flight locks, and carries cancels between replicas on `P:cancel`.
//!
//! Commands go through one lazily connected [`ConnectionManager`] (it reconnects by itself,
//! so the service starts and recovers while Redis is down); pub/sub has its own connection.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, Client, RedisError, Script};

use super::{Begin, Commit, Committed, Keys, StoreError, Watch, Watched};
use crate::config::RedisConfig;
use crate::domain::invocation::RawRecord;
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

/// Renews a lease only while the lock still holds this token. Sent as EVAL (not EVALSHA)
/// inside the watch pipeline, so a Redis that forgot its scripts needs no second trip.
/// KEYS: lock. ARGV: token, lease ms. Answers 1 if renewed.
const RENEW_SCRIPT: &str = r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
"#;

#[derive(Clone)]
pub struct RedisStore {
    client: Client,
    conn: ConnectionManager,
    keys: Keys,
    result_ttl_seconds: u64,
    unlock: Script,
    begin: Script,
    commit: Script,
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
        let client = Client::open(config.url.as_str()).map_err(failed("connect"))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(Duration::from_millis(config.response_timeout_ms)))
            .set_connection_timeout(Some(Duration::from_millis(config.connection_timeout_ms)))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config)
            .map_err(failed("connect"))?;
        Ok(RedisStore {
            client,
            conn,
            keys: Keys::new(&config.key_prefix),
            result_ttl_seconds: config.result_ttl_seconds,
            unlock: Script::new(UNLOCK_SCRIPT),
            begin: Script::new(BEGIN_SCRIPT),
            commit: Script::new(COMMIT_SCRIPT),
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

    pub(super) async fn calls(
        &self,
        run: &str,
        max_calls: usize,
    ) -> Result<Vec<String>, StoreError> {
        let mut conn = self.conn.clone();
        let start = -(max_calls.max(1) as isize);
        conn.lrange(self.keys.calls(run), start, -1)
            .await
            .map_err(failed("load_calls"))
    }

    pub(super) async fn records(
        &self,
        run: &str,
        ids: &[String],
    ) -> Result<HashMap<String, RawRecord>, StoreError> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.hgetall(self.keys.call(run, id));
        }
        let mut conn = self.conn.clone();
        let found: Vec<RawRecord> = pipe
            .query_async(&mut conn)
            .await
            .map_err(failed("load_records"))?;
        Ok(ids
            .iter()
            .cloned()
            .zip(found)
            .filter(|(_, record)| !record.is_empty())
            .collect())
    }

    pub(super) async fn is_cancelled(&self, run: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        conn.exists(self.keys.cancelled(run))
            .await
            .map_err(failed("cancel_marker"))
    }

    pub(super) async fn cancel(&self, run: &str) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: () = redis::pipe()
            .set_ex(self.keys.cancelled(run), "1", self.result_ttl_seconds)
            .ignore()
            .publish(self.keys.cancel_channel(), run)
            .ignore()
            .query_async(&mut conn)
            .await
            .map_err(failed_write("cancel"))?;
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
        let mut conn = self.conn.clone();
        let (what, stored): (String, String) = self
            .commit
            .key(self.keys.lock(run))
            .key(self.keys.release(run))
            .key(self.keys.audit(run))
            .key(self.keys.cancelled(run))
            .arg(token)
            .arg(self.result_ttl_seconds)
            .arg(commit.result)
            .arg(commit.audit_head)
            .arg(commit.audit_tail)
            .arg(commit.cancelled_result)
            .arg(commit.cancelled_audit_tail)
            .invoke_async(&mut conn)
            .await
            .map_err(failed_write("commit"))?;
        let stored = Some(stored).filter(|s| !s.is_empty());
        match (what.as_str(), stored) {
            ("decided", _) => Ok(Committed::Decided),
            ("cancelled", _) => Ok(Committed::Cancelled),
            ("stored", Some(stored)) => Ok(Committed::AlreadyStored(stored)),
            ("lost", stored) => Ok(Committed::LockLost { stored }),
            (other, _) => Err(StoreError::outcome_unknown(
                "commit",
                format!("unexpected answer {other:?} from the commit script"),
            )),
        }
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
        let mut pipe = redis::pipe();
        for run in runs {
            pipe.exists(self.keys.cancelled(&run.run_id));
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
        let answers: Vec<i64> = pipe.query_async(&mut conn).await.map_err(failed("watch"))?;
        let mut answers = answers.into_iter();
        let watched = runs
            .iter()
            .map(|run| {
                let cancelled = answers.next() == Some(1);
                let renewed = run.renew.as_ref().map(|_| answers.next() == Some(1));
                Watch { cancelled, renewed }
            })
            .collect();
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

    /// Opens a dedicated pub/sub connection subscribed to `P:cancel`.
    pub async fn subscribe_cancels(&self) -> Result<CancelSubscription, StoreError> {
        let mut pubsub = self
            .client
            .get_async_pubsub()
            .await
            .map_err(failed("subscribe"))?;
        pubsub
            .subscribe(self.keys.cancel_channel())
            .await
            .map_err(failed("subscribe"))?;
        Ok(CancelSubscription { pubsub })
    }
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
