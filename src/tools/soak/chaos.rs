//! The integrity checks after a soak under injected faults (`soak --chaos`, driven by
//! `scripts/chaos.sh`, which kills and restarts replicas, pauses Redis and cuts pub/sub):
//! every answer is what is stored (so no stored result ever changed under it), a replay
//! answers the same again, no run whose cancel marker was set before its request was
//! released as anything but CANCELLED, and no lock is left behind once the leases ran out.

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::run::Shared;

/// A 200 answer the soak received.
#[derive(Debug, Clone)]
pub struct Answered {
    pub run: String,
    pub answer: Value,
    /// The marker was set before the request was sent.
    pub marker_before: bool,
}

/// What the checks found (every count but the `*_checked` ones must be 0).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Integrity {
    pub runs_checked: u64,
    /// Answered 200, yet nothing stored.
    pub stored_missing: u64,
    /// The stored result differs from the answer.
    pub stored_differs: u64,
    pub cancelled_before_checked: u64,
    /// Marker set before the request, yet not CANCELLED.
    pub cancelled_before_released: u64,
    pub replays_checked: u64,
    /// A later release of the run answered something else.
    pub replays_differ: u64,
    /// Lock keys right after the last answer (informational: a killed replica's lease).
    pub locks_at_drain: u64,
    /// Lock keys once one lease (+1 s) has passed.
    pub locks_left: u64,
}

/// How many runs are released again to check that the stored result answers.
const REPLAYS: usize = 200;

pub(super) async fn check(shared: &Shared, lease: Duration) -> Integrity {
    let answers = shared.answers.lock().map(|a| a.clone()).unwrap_or_default();
    let mut found = Integrity {
        locks_at_drain: count_locks(shared).await,
        ..Integrity::default()
    };
    for chunk in answers.chunks(500) {
        // MGET, which a cluster connection splits per slot and answers in order.
        let mut mget = redis::cmd("MGET");
        for a in chunk {
            mget.arg(format!("{}:release:{{{}}}", shared.prefix, a.run));
        }
        let mut conn = shared.redis.clone();
        let stored: Vec<Option<String>> = match mget.query_async(&mut conn).await {
            Ok(stored) => stored,
            Err(e) => {
                shared.violation(format!("integrity: cannot read stored results: {e}"));
                return found;
            }
        };
        for (a, stored) in chunk.iter().zip(stored) {
            found.runs_checked += 1;
            let stored = stored.and_then(|s| serde_json::from_str::<Value>(&s).ok());
            match stored {
                None => {
                    found.stored_missing += 1;
                    shared.violation(format!("{}: answered 200 but nothing is stored", a.run));
                }
                Some(stored) if stored != a.answer => {
                    found.stored_differs += 1;
                    shared.violation(format!(
                        "{}: the stored result differs from the answer",
                        a.run
                    ));
                }
                Some(_) => {}
            }
            if a.marker_before {
                found.cancelled_before_checked += 1;
                if a.answer["outcome"] != "CANCELLED" {
                    found.cancelled_before_released += 1;
                    shared.violation(format!(
                        "{}: cancelled before its request, yet answered {}",
                        a.run, a.answer["outcome"]
                    ));
                }
            }
        }
    }
    let step = (answers.len() / REPLAYS).max(1);
    for (i, a) in answers.iter().step_by(step).take(REPLAYS).enumerate() {
        let url = format!(
            "{}/v1/runs/{}/release",
            shared.targets[i % shared.targets.len()],
            a.run
        );
        // The body does not matter: a stored result answers whatever is asked.
        let body = serde_json::json!({"query": "replay", "stop_reason": "INFORMATION_SATURATION"});
        let replay = shared
            .client(i as u64)
            .post(url)
            .bearer_auth(&shared.token)
            .json(&body)
            .send()
            .await;
        let Ok(replay) = replay else { continue };
        let Ok(replayed) = replay.json::<Value>().await else {
            continue;
        };
        found.replays_checked += 1;
        if replayed != a.answer {
            found.replays_differ += 1;
            shared.violation(format!("{}: a replay answered something else", a.run));
        }
    }
    tokio::time::sleep(lease + Duration::from_secs(1)).await;
    found.locks_left = count_locks(shared).await;
    if found.locks_left > 0 {
        shared.violation(format!(
            "{} lock(s) left behind one lease after the last answer",
            found.locks_left
        ));
    }
    found
}

/// Lock keys of this soak's prefix.
async fn count_locks(shared: &Shared) -> u64 {
    let mut conn = shared.redis.clone();
    let pattern = format!("{}:release:{{*}}:lock", shared.prefix);
    if let crate::store::RedisConnection::Cluster(_) = conn {
        // KEYS goes to every master and their answers are combined (a test tool's cluster).
        let keys: Result<Vec<String>, _> = redis::cmd("KEYS")
            .arg(&pattern)
            .query_async(&mut conn)
            .await;
        return keys.map(|k| k.len() as u64).unwrap_or(0);
    }
    let mut cursor = 0u64;
    let mut count = 0u64;
    loop {
        let scanned: Result<(u64, Vec<String>), _> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await;
        let Ok((next, keys)) = scanned else {
            return count;
        };
        count += keys.len() as u64;
        if next == 0 {
            return count;
        }
        cursor = next;
    }
}
