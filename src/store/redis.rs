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

use super::{Keys, Preflight, StoreError};
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

#[derive(Clone)]
pub struct RedisStore {
    client: Client,
    conn: ConnectionManager,
    keys: Keys,
    result_ttl_seconds: u64,
    unlock: Script,
}

fn failed(op: &'static str) -> impl FnOnce(RedisError) -> StoreError {
    move |e| {
        telemetry::store_error(op);
        tracing::warn!(op, error = %e, "redis operation failed");
        StoreError {
            op,
            message: e.to_string(),
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
        })
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub(super) async fn preflight(&self, run: &str) -> Result<Preflight, StoreError> {
        let mut conn = self.conn.clone();
        let (stored_result, cancelled): (Option<String>, bool) = redis::pipe()
            .get(self.keys.release(run))
            .exists(self.keys.cancelled(run))
            .query_async(&mut conn)
            .await
            .map_err(failed("preflight"))?;
        Ok(Preflight {
            stored_result,
            cancelled,
        })
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
            .map_err(failed("cancel"))?;
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

    pub(super) async fn put_result(
        &self,
        run: &str,
        result: &str,
        audit: &str,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: () = redis::pipe()
            .atomic()
            .set_ex(self.keys.release(run), result, self.result_ttl_seconds)
            .ignore()
            .set_ex(self.keys.audit(run), audit, self.result_ttl_seconds)
            .ignore()
            .query_async(&mut conn)
            .await
            .map_err(failed("put_result"))?;
        Ok(())
    }

    pub(super) async fn try_lock(
        &self,
        run: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let set: Option<String> = redis::cmd("SET")
            .arg(self.keys.lock(run))
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(&mut conn)
            .await
            .map_err(failed("lock"))?;
        Ok(set.is_some())
    }

    pub(super) async fn unlock(&self, run: &str, token: &str) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: i64 = self
            .unlock
            .key(self.keys.lock(run))
            .arg(token)
            .invoke_async(&mut conn)
            .await
            .map_err(failed("unlock"))?;
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
