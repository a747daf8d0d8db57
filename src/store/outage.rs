//! While Redis fails, one WARN per [`INTERVAL`] that names it (URL without password, or the
//! cluster's seeds), how many operations failed since the last one and which; not one line
//! per failed operation (a replica with Redis gone would otherwise log several a second
//! without saying which Redis it tries). The first answer after a failure logs one INFO.
//!
//! Entry points: [`set_target`] (the store's name, once at start-up), [`failed`] and
//! [`answered`] (every Redis operation's end, from the store adapter).

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// At most one WARN per interval while Redis fails.
pub const INTERVAL: Duration = Duration::from_secs(5);

/// What the next report says, and when the last WARN was.
#[derive(Debug, Default)]
struct Outage {
    last_warn: Option<Instant>,
    failed_since: u64,
    ops: BTreeSet<&'static str>,
    /// Failed operations since the last success (0 = Redis answers).
    failing: u64,
}

/// A WARN to write now: the operations that failed since the last one (this one included).
#[derive(Debug, PartialEq, Eq)]
struct Report {
    failed: u64,
    ops: Vec<&'static str>,
}

impl Outage {
    fn failed(&mut self, op: &'static str, now: Instant) -> Option<Report> {
        self.failed_since += 1;
        self.failing += 1;
        self.ops.insert(op);
        if self
            .last_warn
            .is_some_and(|last| now.duration_since(last) < INTERVAL)
        {
            return None;
        }
        self.last_warn = Some(now);
        let report = Report {
            failed: std::mem::take(&mut self.failed_since),
            ops: std::mem::take(&mut self.ops).into_iter().collect(),
        };
        Some(report)
    }

    /// Answers how many operations had failed when Redis answers again after failures.
    fn answered(&mut self) -> Option<u64> {
        if self.failing == 0 {
            return None;
        }
        let failed = std::mem::take(&mut self.failing);
        self.last_warn = None;
        self.failed_since = 0;
        self.ops.clear();
        Some(failed)
    }
}

static TARGET: Mutex<String> = Mutex::new(String::new());
static OUTAGE: Mutex<Outage> = Mutex::new(Outage {
    last_warn: None,
    failed_since: 0,
    ops: BTreeSet::new(),
    failing: 0,
});

/// Names the Redis the reports speak of ([`crate::config::Config::redis_target`]).
pub fn set_target(target: String) {
    *TARGET.lock().unwrap_or_else(PoisonError::into_inner) = target;
}

fn target() -> String {
    TARGET
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// A Redis operation failed: a WARN if none was written within [`INTERVAL`], else DEBUG.
pub fn failed(op: &'static str, error: &dyn std::fmt::Display) {
    let report = OUTAGE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .failed(op, Instant::now());
    match report {
        Some(report) => tracing::warn!(
            redis = %target(),
            failed_operations = report.failed,
            ops = %report.ops.join(","),
            error = %error,
            "redis unreachable or failing (at most one such line every {} s)",
            INTERVAL.as_secs()
        ),
        None => tracing::debug!(op, error = %error, "redis operation failed"),
    }
}

/// A Redis operation answered: after failures, one INFO that Redis is back.
pub fn answered() {
    let back = OUTAGE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .answered();
    if let Some(failed) = back {
        tracing::info!(redis = %target(), failed_operations = failed, "redis answers again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_report_per_interval_however_many_operations_fail() {
        let mut outage = Outage::default();
        let t0 = Instant::now();
        let first = outage.failed("ping", t0).unwrap();
        assert_eq!(
            first,
            Report {
                failed: 1,
                ops: vec!["ping"]
            }
        );
        // Forty failures within the interval: no report.
        for i in 0..40u64 {
            let op = if i % 2 == 0 { "begin" } else { "subscribe" };
            assert_eq!(outage.failed(op, t0 + Duration::from_millis(100 * i)), None);
        }
        let next = outage.failed("ping", t0 + INTERVAL).unwrap();
        assert_eq!(next.failed, 41, "the suppressed ones are counted");
        assert_eq!(next.ops, vec!["begin", "ping", "subscribe"]);
        // Back: one line, and the next failure is reported at once.
        assert_eq!(outage.answered(), Some(42));
        assert_eq!(outage.answered(), None);
        assert!(outage.failed("get_result", t0 + INTERVAL).is_some());
    }
}
