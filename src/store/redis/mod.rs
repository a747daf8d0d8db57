//! The Redis store (CONTRACT §1): reads the agent's records, keeps results, audit records,
//! cancel markers and in-flight locks, and carries cancels between replicas on `P:cancel`.
//!
//! Its parts: [`connection`] (one node or a Redis Cluster), [`scripts`] (the Lua scripts in
//! `scripts/*.lua` and one typed argument builder per script), [`answer`] (the reader of the
//! record-reading scripts' answers), and here the operations, each written once against the
//! connection: each script and pipeline touches one run's keys only (one slot); the watch
//! pipeline, which spans runs, is split per slot in cluster mode. Pub/sub has its own
//! connection to one node (a seed node in cluster mode, the next one after a failure): a
//! classic PUBLISH reaches every node of a cluster.

mod answer;
mod connection;
mod scripts;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use redis::{AsyncCommands, Client, RedisError, Script, Value};

use self::answer::{read_begin, read_records, Begun, Items};
pub use self::connection::RedisConnection;
use self::scripts::{
    forgot_script, invoke, Batch, BeginArgs, CancelArgs, CommitArgs, RecordsArgs, RenewArgs,
    Scripts, UnlockArgs,
};
use super::{
    Appended, Begin, CallsList, Commit, Committed, Keys, LoadedRecords, Reading, RecordLimits,
    StoreError, Watch, Watched,
};
use crate::config::RedisConfig;
use crate::domain::decision::{DecisionRecord, StreamId};
use crate::domain::invocation::MAX_CALL_ID_BYTES;
use crate::telemetry;

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

/// A failed read, or a write that did nothing a caller relies on.
pub(super) fn failed(op: &'static str) -> impl FnOnce(RedisError) -> StoreError {
    move |e| {
        telemetry::store_error(op);
        super::outage::failed(op, &e);
        StoreError::unavailable(op, e.to_string())
    }
}

/// A failed write that may have run: unless the connection was refused (nothing was
/// sent), a timeout or a dropped connection leaves its outcome unknown.
fn failed_write(op: &'static str) -> impl FnOnce(RedisError) -> StoreError {
    move |e| {
        telemetry::store_error(op);
        super::outage::failed(op, &e);
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
        super::outage::set_target(config.target());
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
            result_ttl_seconds: config.result_ttl_seconds.get(),
            min_replicas_ack: config.min_replicas_ack,
            min_replicas_ack_timeout_ms: config.min_replicas_ack_timeout_ms,
            connection_timeout: Duration::from_millis(config.connection_timeout_ms.get()),
            scripts: Arc::new(Scripts::new()),
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

    /// The begin script (`begin.lua`): the stored result, or who holds the lock, or the
    /// lock taken and, unless the marker is set, the run read as `reading` asks. The script
    /// reads one batch of records ([`Batch::PER_CALL`]); the records it left (a long run,
    /// large records, listed ids that are not ASCII) are read with the records script, one
    /// batch per call, so that no call holds Redis long whatever the agent wrote.
    pub(super) async fn begin(
        &self,
        run: &str,
        token: &str,
        lease: Duration,
        reading: Reading<'_>,
    ) -> Result<Begin, StoreError> {
        let script = &self.scripts.begin;
        let limits = reading.limits;
        let args = BeginArgs {
            release: self.keys.release(run),
            lock: self.keys.lock(run),
            cancelled: self.keys.cancelled(run),
            calls: self.keys.calls(run),
            cited: reading
                .cited
                .iter()
                .map(|id| self.keys.call(run, id))
                .collect(),
            token,
            lease_ms: lease.as_millis() as u64,
            max_calls: reading.max_calls.max(1),
            max_id_bytes: MAX_CALL_ID_BYTES,
            max_list_bytes: limits.max_calls_list_bytes,
            max_record_bytes: limits.max_record_bytes,
            budget: limits.max_release_bytes,
            batch: Batch::PER_CALL,
            record_prefix: self.keys.call(run, ""),
        };
        let mut conn = self.conn.clone();
        let answer: Value = invoke(script, &args.command(script), &mut conn)
            .await
            .map_err(failed("begin"))?;
        let begun = read_begin(&answer, limits.max_record_bytes).map_err(|what| {
            telemetry::store_error("begin");
            StoreError::unavailable("begin", format!("unexpected {what} from the begin script"))
        })?;
        let (calls, mut loaded, answered, more) = match begun {
            Begun::Done(begin) => return Ok(begin),
            Begun::Taken {
                calls,
                loaded,
                answered,
                more,
            } => (calls, loaded, answered, more),
        };
        if more {
            // The ids in the order the script looks them up (and the memory store reads
            // them): the script answered the first `answered` of them.
            let listed = match &calls {
                CallsList::Ids(ids) => ids.as_slice(),
                CallsList::Unreadable(_) => &[],
            };
            let order = super::lookup_ids(reading.cited.iter().chain(listed.iter().rev()));
            let rest = order.get(answered..).unwrap_or_default();
            self.read_all(run, rest, limits, &mut loaded, "begin")
                .await?;
        }
        Ok(Begin::Taken(Box::new(super::evidence(run, calls, loaded))))
    }

    /// The records of `ids` within `budget` bytes (the ids a repaired Draft cites that the
    /// begin script did not read), one batch per call of the records script.
    pub(super) async fn records(
        &self,
        run: &str,
        ids: &[String],
        max_record_bytes: u64,
        budget: u64,
    ) -> Result<LoadedRecords, StoreError> {
        let mut loaded = LoadedRecords::default();
        let limits = RecordLimits {
            max_record_bytes,
            max_release_bytes: budget,
            max_calls_list_bytes: 0,
        };
        self.read_all(run, ids, limits, &mut loaded, "load_records")
            .await?;
        Ok(loaded)
    }

    /// Reads the records of `ids` into `loaded`, in order, with the records script: one
    /// batch per call, each within what is left of `limits.max_release_bytes`.
    async fn read_all(
        &self,
        run: &str,
        mut ids: &[String],
        limits: RecordLimits,
        loaded: &mut LoadedRecords,
        op: &'static str,
    ) -> Result<(), StoreError> {
        let script = &self.scripts.records;
        let unexpected = |what: &str| {
            telemetry::store_error(op);
            StoreError::unavailable(op, format!("unexpected {what} from the records script"))
        };
        let mut conn = self.conn.clone();
        while !ids.is_empty() {
            let batch = &ids[..ids.len().min(Batch::PER_CALL.records)];
            let args = RecordsArgs {
                keys: batch.iter().map(|id| self.keys.call(run, id)).collect(),
                max_record_bytes: limits.max_record_bytes,
                budget: limits.max_release_bytes.saturating_sub(loaded.bytes),
                batch: Batch::PER_CALL,
                record_prefix: self.keys.call(run, ""),
            };
            let answer: Vec<u8> = invoke(script, &args.command(script), &mut conn)
                .await
                .map_err(failed(op))?;
            let mut items = Items::new(&answer);
            let (read, answered) = read_records(&mut items, limits.max_record_bytes)
                .and_then(|read| items.end().map(|()| read))
                .map_err(unexpected)?;
            // Every call answers at least one record: anything else would never end.
            if answered == 0 || answered > batch.len() {
                return Err(unexpected("number of records"));
            }
            loaded.records.extend(read.records);
            loaded.unreadable.extend(read.unreadable);
            loaded.bytes += read.bytes;
            ids = &ids[answered..];
        }
        Ok(())
    }

    pub(super) async fn is_cancelled(&self, run: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        conn.exists(self.keys.cancelled(run))
            .await
            .map_err(failed("cancel_marker"))
    }

    /// The markers of `runs`: EXISTS each, in one pipeline per slot group, sent at once.
    pub(super) async fn cancel_markers(&self, runs: &[String]) -> Result<Vec<bool>, StoreError> {
        let markers: Vec<String> = runs.iter().map(|run| self.keys.cancelled(run)).collect();
        let groups = self.conn.pipeline_groups(&markers);
        let sent = groups.iter().map(|group| {
            let mut pipe = redis::pipe();
            for &i in group {
                pipe.exists(&markers[i]);
            }
            let mut conn = self.conn.clone();
            async move { pipe.query_async::<Vec<i64>>(&mut conn).await }
        });
        let replies = futures::future::try_join_all(sent)
            .await
            .map_err(failed("cancel_marker"))?;
        let mut cancelled = vec![false; runs.len()];
        for (group, answers) in groups.iter().zip(replies) {
            for (&i, answer) in group.iter().zip(answers) {
                cancelled[i] = answer == 1;
            }
        }
        Ok(cancelled)
    }

    /// The cancel route: `cancel.lua` answers a stored result (then nothing is marked), or
    /// sets the marker (value [`super::HTTP_CANCEL_MARKER`]) in the same atomic step; then
    /// the publish: a second command, since on a cluster the channel and the run's keys live
    /// in different slots (a cancel is rare; two round trips). The marker is the truth: if
    /// only the publish fails, every replica still finds the marker within one
    /// `cancel.poll_interval_ms`, so the cancel is accepted.
    pub(super) async fn cancel(&self, run: &str) -> Result<super::CancelAnswer, StoreError> {
        let mut conn = self.conn.clone();
        let args = CancelArgs {
            release: self.keys.release(run),
            cancelled: self.keys.cancelled(run),
            marker: super::HTTP_CANCEL_MARKER,
            ttl_seconds: self.result_ttl_seconds,
        };
        let script = &self.scripts.cancel;
        let stored: Option<String> = invoke(script, &args.command(script), &mut conn)
            .await
            .map_err(failed_write("cancel"))?;
        if let Some(stored) = stored {
            return Ok(super::CancelAnswer::AlreadyStored(stored));
        }
        let published: Result<i64, RedisError> =
            conn.publish(self.keys.cancel_channel(), run).await;
        if let Err(e) = published {
            telemetry::store_error("cancel");
            tracing::warn!(error = %e, "cancel marker set, publish failed: the poll will find it");
        }
        Ok(super::CancelAnswer::Marked)
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
    ) -> Result<(Committed, Appended), StoreError> {
        // On one node the decision entry is appended by the commit script itself: no round
        // trip of its own. A cluster script may only touch one slot, and the stream has its
        // own: the caller appends it after answering.
        let inline = match (&commit.decision, &self.commit_conn) {
            (Some(entry), RedisConnection::Single(_)) => Some((self.keys.decisions(), *entry)),
            _ => None,
        };
        let inlined = inline.is_some();
        let args = CommitArgs {
            lock: self.keys.lock(run),
            release: self.keys.release(run),
            audit: self.keys.audit(run),
            cancelled: self.keys.cancelled(run),
            token,
            ttl_seconds: self.result_ttl_seconds,
            result: commit.result,
            audit_head: &commit.audit.head,
            audit_end: &commit.audit.decided,
            cancelled_result: commit.cancelled_result,
            cancelled_audit_end: &commit.audit.cancelled,
            decision: inline,
        };
        let script = &self.scripts.commit;
        let (answer, acked) = self
            .invoke_acked(script, args.command(script))
            .await
            .map_err(failed_write("commit"))?;
        let (what, stored, appended): (String, String, String) = redis::from_redis_value(answer)
            .map_err(|e| StoreError::outcome_unknown("commit", e.to_string()))?;
        let stored = Some(stored).filter(|s| !s.is_empty());
        let committed = match (what.as_str(), stored) {
            ("decided", _) => Committed::Decided,
            ("cancelled", marker) => Committed::Cancelled(super::marker_source(
                marker.as_deref().unwrap_or_default().as_bytes(),
            )),
            ("stored", Some(stored)) => Committed::AlreadyStored(stored),
            ("lost", stored) => return Ok((Committed::LockLost { stored }, Appended::Done)),
            (other, _) => {
                return Err(StoreError::outcome_unknown(
                    "commit",
                    format!("unexpected answer {other:?} from the commit script"),
                ))
            }
        };
        let appended = match (&committed, appended.as_str()) {
            (Committed::AlreadyStored(_), _) => Appended::Done,
            _ if commit.decision.is_none() => Appended::Done,
            _ if !inlined => Appended::Deferred,
            (_, "ok") => Appended::Done,
            (_, error) => {
                telemetry::store_error("append_decision");
                tracing::warn!(
                    op = "append_decision",
                    run_id = run,
                    error,
                    "the decision entry was not appended; the result stands"
                );
                Appended::Failed(error.to_string())
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
            _ => Ok((committed, appended)),
        }
    }

    /// `XADD P:decisions MAXLEN ~ max_len * fields…`, sent once more if the first try fails
    /// (at least once: a consumer may see an entry twice, and tells them apart by run id).
    /// A failure is counted and logged, and changes nothing else.
    pub(super) async fn append_decision(&self, max_len: u64, fields: &[String]) -> Appended {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.keys.decisions())
            .arg("MAXLEN")
            .arg("~")
            .arg(max_len)
            .arg("*")
            .arg(fields);
        let mut error = String::new();
        for _ in 0..2 {
            let mut conn = self.conn.clone();
            match cmd.query_async::<Value>(&mut conn).await {
                Ok(_) => return Appended::Done,
                Err(e) => error = e.to_string(),
            }
        }
        telemetry::store_error("append_decision");
        tracing::warn!(op = "append_decision", error = %error, "the decision entry was not appended; the result stands");
        Appended::Failed(error)
    }

    /// `XREVRANGE P:decisions END START COUNT count`, read leniently.
    pub(super) async fn read_decisions(
        &self,
        end: Option<StreamId>,
        start: Option<StreamId>,
        count: usize,
    ) -> Result<Vec<DecisionRecord>, StoreError> {
        let end = end.map_or_else(|| "+".to_string(), |id| id.to_string());
        let start = start.map_or_else(|| "-".to_string(), |id| id.to_string());
        let mut conn = self.conn.clone();
        let entries: Vec<(Vec<u8>, Vec<Vec<u8>>)> = redis::cmd("XREVRANGE")
            .arg(self.keys.decisions())
            .arg(end)
            .arg(start)
            .arg("COUNT")
            .arg(count.max(1))
            .query_async(&mut conn)
            .await
            .map_err(failed("read_decisions"))?;
        Ok(entries
            .iter()
            .map(|(id, flat)| {
                let text: Vec<std::borrow::Cow<'_, str>> =
                    flat.iter().map(|v| String::from_utf8_lossy(v)).collect();
                let pairs = text.chunks(2).filter_map(|pair| match pair {
                    [name, value] => Some((name.as_ref(), value.as_ref())),
                    _ => None,
                });
                DecisionRecord::from_fields(&String::from_utf8_lossy(id), pairs)
            })
            .collect())
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
        cmd: redis::Cmd,
    ) -> Result<(Value, Option<i64>), RedisError> {
        let mut conn = self.commit_conn.clone();
        if self.min_replicas_ack == 0 {
            return Ok((invoke(script, &cmd, &mut conn).await?, None));
        }
        let mut pipe = redis::pipe();
        pipe.add_command(cmd)
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
                    let renew = RenewArgs {
                        lock: self.keys.lock(&run.run_id),
                        token,
                        lease_ms: lease.as_millis() as u64,
                    };
                    pipe.add_command(renew.command());
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
        let args = UnlockArgs {
            lock: self.keys.lock(run),
            token,
        };
        let _: i64 = invoke(script, &args.command(script), &mut conn)
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
        super::outage::answered();
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
