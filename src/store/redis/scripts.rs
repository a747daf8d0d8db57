//! The Lua scripts (`scripts/*.lua`, compiled in with `include_str!`) and one typed argument
//! builder per script: each builder's fields are the script's `KEYS` and `ARGV` positions,
//! named once here and once at the top of the `.lua` file, in the same order. Entry points:
//! [`Scripts`], the `*Args` builders' `command`, and [`invoke`].

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, Script};

use crate::domain::decision::{CANCELLED_FIELDS, FIELDS};
use crate::domain::invocation::RECORD_FIELDS;
use crate::store::DecisionEntry;

const UNLOCK: &str = include_str!("scripts/unlock.lua");
const RENEW: &str = include_str!("scripts/renew.lua");
const COMMIT: &str = include_str!("scripts/commit.lua");
const CANCEL: &str = include_str!("scripts/cancel.lua");
/// `record_reader.lua` opens both record-reading scripts: `put` and `read_record`.
const BEGIN: &str = concat!(
    include_str!("scripts/record_reader.lua"),
    include_str!("scripts/begin.lua")
);
const RECORDS: &str = concat!(
    include_str!("scripts/record_reader.lua"),
    include_str!("scripts/records.lua")
);

/// The scripts sent by hash, loaded into Redis by their first use (EVALSHA, then SCRIPT
/// LOAD and EVALSHA again if the node forgot them). Shared by every clone of the store.
pub(super) struct Scripts {
    pub unlock: Script,
    pub begin: Script,
    pub commit: Script,
    pub records: Script,
    pub cancel: Script,
}

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            unlock: Script::new(UNLOCK),
            begin: Script::new(BEGIN),
            commit: Script::new(COMMIT),
            records: Script::new(RECORDS),
            cancel: Script::new(CANCEL),
        }
    }
}

/// `begin.lua`: the stored result, or the lock's holder, or the lock taken and the run read.
pub(super) struct BeginArgs<'a> {
    // KEYS
    pub release: String,
    pub lock: String,
    pub cancelled: String,
    pub calls: String,
    /// The record keys of the cited ids, in priority order (KEYS[5..]).
    pub cited: Vec<String>,
    // ARGV
    pub token: &'a str,
    pub lease_ms: u64,
    pub max_calls: usize,
    pub max_id_bytes: usize,
    pub max_list_bytes: u64,
    pub max_record_bytes: u64,
    pub budget: u64,
    pub batch: Batch,
    /// The run's record key prefix (`P:run:{RUN}:call:`); a record's key is it + the id.
    pub record_prefix: String,
    // ARGV[11..]: RECORD_FIELDS
}

/// How much one script call reads at most (`read_records` in `record_reader.lua`): the
/// records it answers, and the bytes of fields it copies (one record of up to
/// `evidence.max_record_bytes` is always read). Measured with Redis's own clock
/// (tests/store_redis.rs, `scripts/redis_script_times.sh`): a call of 32 records or
/// 128 KiB takes about 1.5 ms of Redis's time, a 256 KiB record about 2.5 ms.
#[derive(Debug, Clone, Copy)]
pub(super) struct Batch {
    pub records: usize,
    pub bytes: u64,
}

impl Batch {
    pub const PER_CALL: Batch = Batch {
        records: 32,
        bytes: 128 * 1024,
    };
}

impl BeginArgs<'_> {
    pub fn command(&self, script: &Script) -> Cmd {
        let keys = [&self.release, &self.lock, &self.cancelled, &self.calls];
        let bytes = keys.iter().map(|k| k.len()).sum::<usize>()
            + self.cited.iter().map(String::len).sum::<usize>()
            + self.token.len()
            + self.record_prefix.len()
            + 300;
        let mut cmd = evalsha(
            script,
            keys.len() + self.cited.len(),
            keys.len() + self.cited.len() + 10 + RECORD_FIELDS.len(),
            bytes,
        );
        cmd.arg(&keys[..])
            .arg(&self.cited)
            .arg(self.token)
            .arg(self.lease_ms)
            .arg(self.max_calls)
            .arg(self.max_id_bytes)
            .arg(self.max_list_bytes)
            .arg(self.max_record_bytes)
            .arg(self.budget)
            .arg(self.batch.records)
            .arg(self.batch.bytes)
            .arg(&self.record_prefix)
            .arg(&RECORD_FIELDS[..]);
        cmd
    }
}

/// `records.lua`: the guard's fields of the records of `keys`, within `budget`.
pub(super) struct RecordsArgs {
    // KEYS
    pub keys: Vec<String>,
    // ARGV
    pub max_record_bytes: u64,
    pub budget: u64,
    pub batch: Batch,
    pub record_prefix: String,
    // ARGV[6..]: RECORD_FIELDS
}

impl RecordsArgs {
    pub fn command(&self, script: &Script) -> Cmd {
        let bytes =
            self.keys.iter().map(String::len).sum::<usize>() + self.record_prefix.len() + 200;
        let mut cmd = evalsha(
            script,
            self.keys.len(),
            self.keys.len() + 5 + RECORD_FIELDS.len(),
            bytes,
        );
        cmd.arg(&self.keys)
            .arg(self.max_record_bytes)
            .arg(self.budget)
            .arg(self.batch.records)
            .arg(self.batch.bytes)
            .arg(&self.record_prefix)
            .arg(&RECORD_FIELDS[..]);
        cmd
    }
}

/// `commit.lua`: the fenced commit of a result and its audit record (the record's head, sent
/// once, followed by the end of the result stored).
pub(super) struct CommitArgs<'a> {
    // KEYS
    pub lock: String,
    pub release: String,
    pub audit: String,
    pub cancelled: String,
    // ARGV
    pub token: &'a str,
    pub ttl_seconds: u64,
    pub result: &'a str,
    pub audit_head: &'a str,
    pub audit_end: &'a str,
    pub cancelled_result: &'a str,
    pub cancelled_audit_end: &'a str,
    /// KEYS[5] and ARGV[8..]: the decision stream and the entry to append to it (the
    /// decided entry's pairs, then the pairs the CANCELLED entry replaces), on a single node
    /// only (a cluster script may not touch the stream's slot).
    pub decision: Option<(String, DecisionEntry<'a>)>,
}

impl CommitArgs<'_> {
    pub fn command(&self, script: &Script) -> Cmd {
        let keys = [&self.lock, &self.release, &self.audit, &self.cancelled];
        let texts = [
            self.token,
            self.result,
            self.audit_head,
            self.audit_end,
            self.cancelled_result,
            self.cancelled_audit_end,
        ];
        let entry_bytes = self.decision.as_ref().map_or(0, |(key, entry)| {
            key.len()
                + FIELDS.iter().map(|f| f.len()).sum::<usize>()
                + entry.values.iter().map(String::len).sum::<usize>()
                + CANCELLED_FIELDS
                    .iter()
                    .map(|(f, v)| f.len() + v.len())
                    .sum::<usize>()
                + 32
        });
        let bytes = keys.iter().map(|k| k.len()).sum::<usize>()
            + texts.iter().map(|t| t.len()).sum::<usize>()
            + entry_bytes
            + 64;
        let (entry_keys, entry_args) = self.decision.as_ref().map_or((0, 0), |_| {
            (1, 2 + 2 * FIELDS.len() + 2 * CANCELLED_FIELDS.len())
        });
        let mut cmd = evalsha(
            script,
            keys.len() + entry_keys,
            keys.len() + entry_keys + texts.len() + 1 + entry_args,
            bytes,
        );
        cmd.arg(&keys[..]);
        if let Some((key, _)) = &self.decision {
            cmd.arg(key);
        }
        cmd.arg(self.token)
            .arg(self.ttl_seconds)
            .arg(self.result)
            .arg(self.audit_head)
            .arg(self.audit_end)
            .arg(self.cancelled_result)
            .arg(self.cancelled_audit_end);
        if let Some((_, entry)) = &self.decision {
            cmd.arg(entry.max_len).arg(FIELDS.len());
            for (name, value) in FIELDS.iter().zip(entry.values) {
                cmd.arg(*name).arg(value);
            }
            for (name, value) in CANCELLED_FIELDS {
                cmd.arg(name).arg(value);
            }
        }
        cmd
    }
}

/// `cancel.lua`: a stored result, or the cancel marker set.
pub(super) struct CancelArgs<'a> {
    // KEYS
    pub release: String,
    pub cancelled: String,
    // ARGV
    pub marker: &'a str,
    pub ttl_seconds: u64,
}

impl CancelArgs<'_> {
    pub fn command(&self, script: &Script) -> Cmd {
        let bytes = self.release.len() + self.cancelled.len() + self.marker.len() + 64;
        let mut cmd = evalsha(script, 2, 4, bytes);
        cmd.arg(&self.release)
            .arg(&self.cancelled)
            .arg(self.marker)
            .arg(self.ttl_seconds);
        cmd
    }
}

/// `unlock.lua`: frees the lock if this token holds it.
pub(super) struct UnlockArgs<'a> {
    // KEYS
    pub lock: String,
    // ARGV
    pub token: &'a str,
}

impl UnlockArgs<'_> {
    pub fn command(&self, script: &Script) -> Cmd {
        let mut cmd = evalsha(script, 1, 2, self.lock.len() + self.token.len() + 64);
        cmd.arg(&self.lock).arg(self.token);
        cmd
    }
}

/// `renew.lua`: renews the lease if this token holds it. Sent as EVAL with the script's
/// text (not EVALSHA) inside the watch pipeline, so a Redis that forgot its scripts needs
/// no second trip; the script is small.
pub(super) struct RenewArgs<'a> {
    // KEYS
    pub lock: String,
    // ARGV
    pub token: &'a str,
    pub lease_ms: u64,
}

impl RenewArgs<'_> {
    pub fn command(&self) -> Cmd {
        let mut cmd = Cmd::new();
        cmd.arg("EVAL")
            .arg(RENEW)
            .arg(1)
            .arg(&self.lock)
            .arg(self.token)
            .arg(self.lease_ms);
        cmd
    }
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

/// Sends `cmd` (a builder's command for `script`). A node that does not know the script
/// yet (a fresh, restarted or promoted master) ran nothing: it gets the script, then `cmd`
/// again.
pub(super) async fn invoke<T: redis::FromRedisValue>(
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
pub(super) fn forgot_script(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::decision::Decision;
    use crate::domain::release::Outcome;

    /// The number of positions each `.lua` file names at its top matches its builder.
    #[test]
    fn every_script_names_the_positions_its_builder_writes() {
        let args = |cmd: &Cmd| cmd.args_iter().count();
        let begin = BeginArgs {
            release: "r".into(),
            lock: "l".into(),
            cancelled: "c".into(),
            calls: "k".into(),
            cited: vec!["x".into(), "y".into()],
            token: "t",
            lease_ms: 1,
            max_calls: 1,
            max_id_bytes: 1,
            max_list_bytes: 1,
            max_record_bytes: 1,
            budget: 1,
            batch: Batch::PER_CALL,
            record_prefix: "p".into(),
        };
        // EVALSHA, hash, number of keys, 4 + 2 keys, 10 arguments, the fields.
        assert_eq!(
            args(&begin.command(&Scripts::new().begin)),
            3 + 6 + 10 + RECORD_FIELDS.len()
        );
        assert!(BEGIN.contains("local FIRST_CITED = 5"));
        assert!(BEGIN.contains("local FIRST_FIELD = 11") && BEGIN.contains("ARGV[10]"));
        let records = RecordsArgs {
            keys: vec!["k".into()],
            max_record_bytes: 1,
            budget: 1,
            batch: Batch::PER_CALL,
            record_prefix: "p".into(),
        };
        assert_eq!(
            args(&records.command(&Scripts::new().records)),
            3 + 1 + 5 + RECORD_FIELDS.len()
        );
        assert!(RECORDS.contains("local FIRST_FIELD = 6") && RECORDS.contains("ARGV[5]"));
        let commit = CommitArgs {
            lock: "l".into(),
            release: "r".into(),
            audit: "a".into(),
            cancelled: "c".into(),
            token: "t",
            ttl_seconds: 1,
            result: "{}",
            audit_head: "{",
            audit_end: "}",
            cancelled_result: "{}",
            cancelled_audit_end: "}",
            decision: None,
        };
        assert_eq!(args(&commit.command(&Scripts::new().commit)), 3 + 4 + 7);
        let values = Decision {
            run_id: "r",
            outcome: Outcome::Success,
            fallback_type: None,
            replica: "h",
            time: "t",
            total_ms: 1.0,
            overhead_ms: 1.0,
            verdict: None,
            model_attempts: 0,
        }
        .values();
        let with_entry = CommitArgs {
            decision: Some((
                "d".into(),
                DecisionEntry {
                    max_len: 10,
                    values: &values,
                },
            )),
            ..commit
        };
        // Then the stream key, its length, the number of pairs, the decided entry's pairs
        // and the CANCELLED entry's two.
        assert_eq!(
            args(&with_entry.command(&Scripts::new().commit)),
            3 + 5 + 7 + 2 + 2 * 9 + 2 * 2
        );
        assert!(COMMIT.contains("KEYS[5]") && COMMIT.contains("ARGV[9]"));
        assert!(COMMIT.contains("local FIRST_PAIR = 10"));
        let cancel = CancelArgs {
            release: "r".into(),
            cancelled: "c".into(),
            marker: "http",
            ttl_seconds: 1,
        };
        assert_eq!(args(&cancel.command(&Scripts::new().cancel)), 3 + 2 + 2);
        assert!(CANCEL.contains("ARGV[2]") && !CANCEL.contains("ARGV[3]"));
    }
}
