//! The per-replica model gate: every model request (judge and repair alike) passes it.
//!
//! Entry point: [`ModelGate::enter`] waits, in arrival order, for one of
//! `model.max_concurrent_calls` slots until the caller's deadline; it also holds every
//! attempt back while the model server has said "come back after T" (a `429`/`503` with
//! `Retry-After`: a cooldown shared by every run of the replica), and fails attempts fast
//! while a run of connection failures has opened the circuit (then lets one probe through).
//! The [`Slot`] it hands out is given back when dropped (the request ended or was
//! cancelled); [`Slot::finished`] tells the gate how the request went.
//!
//! Dropping the future of `enter` (a cancelled run) leaves the queue at once: the slot
//! semaphore is fair (first come, first served) and forgets a waiter that is dropped.
//! The state machine itself ([`Signals`]) takes the time as an argument, so that its rules
//! are tested without a clock.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::telemetry;

/// The longest cooldown a server's `Retry-After` may impose: a broken or hostile header
/// (a date years ahead) must not close the gate for good.
pub const MAX_COOLDOWN: Duration = Duration::from_secs(600);

/// The circuit breaker's settings (`model.circuit_failures`, `model.circuit_open_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Connection failures in a row (no HTTP answer at all) that open the circuit; 0 = never.
    pub failures: u32,
    /// How long the circuit stays open before one probe attempt is let through.
    pub open_for: Duration,
}

impl BreakerSettings {
    /// The settings of `model.circuit_failures` and `model.circuit_open_ms` (read here, so
    /// that the configuration does not import the model adapter).
    pub fn of(model: &crate::config::ModelConfig) -> BreakerSettings {
        BreakerSettings {
            failures: model.circuit_failures,
            open_for: Duration::from_millis(model.circuit_open_ms.get()),
        }
    }
}

/// Why the gate did not let an attempt through (it sent nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The deadline passed while the attempt waited for a slot (or a cooldown).
    Deadline { waited: Duration },
    /// The server asked to come back after a time past the attempt's deadline.
    Cooldown { remaining: Duration },
    /// The circuit is open (or its one probe is out): the model is not asked.
    CircuitOpen,
}

impl Refused {
    /// The `reason` label of `harness_model_gate_refused_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Refused::Deadline { .. } => "deadline",
            Refused::Cooldown { .. } => "cooldown",
            Refused::CircuitOpen => "circuit_open",
        }
    }

    /// A short, data-free account for the audit.
    pub fn detail(self) -> String {
        match self {
            Refused::Deadline { waited } => format!(
                "not sent: the total deadline passed after {} ms waiting for a model slot",
                waited.as_millis()
            ),
            Refused::Cooldown { remaining } => format!(
                "not sent: the model server asked to come back in {} ms, past the total deadline",
                remaining.as_millis()
            ),
            Refused::CircuitOpen => {
                "not sent: the circuit is open after repeated connection failures".to_string()
            }
        }
    }
}

/// How a request that went through the gate ended, as far as the gate cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// The server answered (any HTTP status) without asking for a pause.
    Answered,
    /// The server answered `429`/`503` with a `Retry-After` of this long.
    ComeBackIn(Duration),
    /// No HTTP answer at all: connection refused, reset, or a transport error.
    ConnectionFailed,
    /// No answer within the attempt's timeout: says nothing about the connection.
    TimedOut,
}

/// The cooldown and circuit-breaker rules, with the time passed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signals {
    breaker: BreakerSettings,
    /// No attempt is sent before this (a server's `Retry-After`).
    cooldown_until: Option<Instant>,
    /// Connection failures in a row.
    failures: u32,
    /// The circuit is open until this; past it, one probe goes through.
    open_until: Option<Instant>,
    /// The circuit's probe is out: others still fail fast.
    probing: bool,
}

/// What [`Signals::admit`] says to an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Send now; `probe` when this is the open circuit's one probe.
    Send {
        probe: bool,
    },
    /// Wait until then (the cooldown), then ask again.
    WaitUntil(Instant),
    Refuse(Refused),
}

impl Signals {
    pub fn new(breaker: BreakerSettings) -> Signals {
        Signals {
            breaker,
            cooldown_until: None,
            failures: 0,
            open_until: None,
            probing: false,
        }
    }

    /// May an attempt whose deadline is `deadline` be sent at `now`?
    pub fn admit(&mut self, now: Instant, deadline: Instant) -> Admit {
        if let Some(until) = self.cooldown_until {
            if until > now {
                return match until <= deadline {
                    true => Admit::WaitUntil(until),
                    false => Admit::Refuse(Refused::Cooldown {
                        remaining: until - now,
                    }),
                };
            }
            self.cooldown_until = None;
        }
        match self.open_until {
            None => Admit::Send { probe: false },
            Some(until) if until > now || self.probing => Admit::Refuse(Refused::CircuitOpen),
            Some(_) => {
                self.probing = true;
                Admit::Send { probe: true }
            }
        }
    }

    /// A request let through by [`Signals::admit`] ended as `sent` at `now`.
    pub fn finished(&mut self, now: Instant, sent: Sent, probe: bool) {
        if probe {
            self.probing = false;
        }
        match sent {
            Sent::Answered | Sent::ComeBackIn(_) => {
                // The server answered: the connection works, whoever's request it was.
                self.failures = 0;
                if self.open_until.take().is_some() {
                    telemetry::model_circuit(false);
                }
                if let Sent::ComeBackIn(after) = sent {
                    let until = now + after.min(MAX_COOLDOWN);
                    if self.cooldown_until.is_none_or(|current| current < until) {
                        self.cooldown_until = Some(until);
                    }
                }
            }
            Sent::ConnectionFailed => {
                self.failures = self.failures.saturating_add(1);
                let trips = self.breaker.failures > 0 && self.failures >= self.breaker.failures;
                if probe || (trips && self.open_until.is_none()) {
                    if self.open_until.is_none() {
                        telemetry::model_circuit(true);
                    }
                    self.open_until = Some(now + self.breaker.open_for);
                }
            }
            Sent::TimedOut => {}
        }
    }

    /// The probe ended without an answer either way (its run was cancelled): the next
    /// attempt may probe.
    pub fn probe_dropped(&mut self) {
        self.probing = false;
    }

    /// How long the cooldown still runs at `now` (zero when none).
    pub fn cooldown_remaining(&self, now: Instant) -> Duration {
        self.cooldown_until
            .map_or(Duration::ZERO, |until| until.saturating_duration_since(now))
    }

    pub fn circuit_open(&self) -> bool {
        self.open_until.is_some()
    }
}

/// The gate of one replica, shared by every worker's runs.
#[derive(Debug)]
pub struct ModelGate {
    /// `model.max_concurrent_calls` permits, handed out first come, first served.
    slots: Arc<Semaphore>,
    signals: Mutex<Signals>,
}

/// A slot: the request may be sent. Dropping it frees the slot for the next in line.
#[derive(Debug)]
pub struct Slot {
    gate: Arc<ModelGate>,
    /// Held while the request is open; dropping it wakes the next waiter.
    _permit: OwnedSemaphorePermit,
    probe: bool,
    reported: bool,
}

impl ModelGate {
    pub fn new(max_concurrent_calls: usize, breaker: BreakerSettings) -> Arc<ModelGate> {
        Arc::new(ModelGate {
            slots: Arc::new(Semaphore::new(max_concurrent_calls.max(1))),
            signals: Mutex::new(Signals::new(breaker)),
        })
    }

    fn signals(&self) -> std::sync::MutexGuard<'_, Signals> {
        self.signals.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot, in arrival order, and for the end of a cooldown, both until
    /// `deadline`; refuses at once while the circuit is open or when a cooldown ends past
    /// the deadline. The wait is recorded in `harness_model_queue_wait_seconds`.
    pub async fn enter(self: &Arc<Self>, deadline: Instant) -> Result<Slot, Refused> {
        let began = Instant::now();
        let outcome = self.wait_for_slot(deadline, began).await;
        let waited = began.elapsed();
        telemetry::model_queue_wait(waited);
        match outcome {
            Ok(slot) => {
                telemetry::model_call_opened();
                Ok(slot)
            }
            Err(refused) => {
                telemetry::model_gate_refused(refused.reason());
                self.publish();
                Err(refused)
            }
        }
    }

    async fn wait_for_slot(
        self: &Arc<Self>,
        deadline: Instant,
        began: Instant,
    ) -> Result<Slot, Refused> {
        // A cooldown or an open circuit that refuses the attempt does so before it queues.
        let first = self.signals().admit(Instant::now(), deadline);
        match first {
            Admit::Refuse(refused) => return Err(refused),
            Admit::WaitUntil(until) => tokio::time::sleep_until(until).await,
            Admit::Send { probe: true } => self.signals().probe_dropped(),
            Admit::Send { probe: false } => {}
        }
        let permit =
            match tokio::time::timeout_at(deadline, self.slots.clone().acquire_owned()).await {
                Ok(Ok(permit)) => permit,
                // The semaphore is never closed; a deadline passed.
                _ => {
                    return Err(Refused::Deadline {
                        waited: began.elapsed(),
                    })
                }
            };
        // Signals may have changed while it queued: ask again, now holding the slot.
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(Refused::Deadline {
                    waited: began.elapsed(),
                });
            }
            let admit = self.signals().admit(now, deadline);
            match admit {
                Admit::Send { probe } => {
                    return Ok(Slot {
                        gate: self.clone(),
                        _permit: permit,
                        probe,
                        reported: false,
                    })
                }
                Admit::WaitUntil(until) => tokio::time::sleep_until(until).await,
                Admit::Refuse(refused) => return Err(refused),
            }
        }
    }

    /// Sets the cooldown and circuit gauges from the state now (also called before each
    /// `/metrics` scrape, so the cooldown gauge falls to zero when it ends).
    pub fn publish(&self) {
        let signals = self.signals();
        telemetry::model_cooldown(signals.cooldown_remaining(Instant::now()));
    }
}

impl Slot {
    /// Tells the gate how the request went (a 429/503's `Retry-After` starts the cooldown;
    /// connection failures count towards the circuit).
    pub fn finished(mut self, sent: Sent) {
        self.reported = true;
        self.gate
            .signals()
            .finished(Instant::now(), sent, self.probe);
        if matches!(sent, Sent::ComeBackIn(_)) {
            self.gate.publish();
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.probe && !self.reported {
            self.gate.signals().probe_dropped();
        }
        telemetry::model_call_closed();
    }
}

/// A `Retry-After` value (RFC 9110: whole seconds, or an HTTP date) as a duration from
/// `now`; None when it is neither. A date in the past is zero.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(
            value.parse::<u64>().unwrap_or(u64::MAX),
        ));
    }
    let date = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let at = SystemTime::from(date.with_timezone(&chrono::Utc));
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> BreakerSettings {
        BreakerSettings {
            failures: 3,
            open_for: Duration::from_secs(5),
        }
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_an_http_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:00 GMT", now),
            Some(Duration::ZERO),
            "a date in the past"
        );
        assert_eq!(parse_retry_after("-1", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("", now), None);
    }

    #[test]
    fn a_cooldown_holds_attempts_that_fit_and_refuses_those_that_do_not() {
        let mut s = Signals::new(breaker());
        let t0 = Instant::now();
        assert_eq!(
            s.admit(t0, t0 + Duration::from_secs(60)),
            Admit::Send { probe: false }
        );
        s.finished(t0, Sent::ComeBackIn(Duration::from_secs(2)), false);
        assert_eq!(
            s.admit(t0, t0 + Duration::from_secs(10)),
            Admit::WaitUntil(t0 + Duration::from_secs(2))
        );
        assert_eq!(
            s.admit(
                t0 + Duration::from_secs(1),
                t0 + Duration::from_millis(1500)
            ),
            Admit::Refuse(Refused::Cooldown {
                remaining: Duration::from_secs(1)
            })
        );
        // A shorter Retry-After never shortens a cooldown already set.
        s.finished(t0, Sent::ComeBackIn(Duration::from_secs(1)), false);
        assert_eq!(s.cooldown_remaining(t0), Duration::from_secs(2));
        assert_eq!(
            s.admit(t0 + Duration::from_secs(2), t0 + Duration::from_secs(3)),
            Admit::Send { probe: false }
        );
        assert_eq!(
            s.cooldown_remaining(t0 + Duration::from_secs(2)),
            Duration::ZERO
        );
        // A hostile date years ahead is capped.
        s.finished(t0, Sent::ComeBackIn(Duration::from_secs(1 << 40)), false);
        assert_eq!(s.cooldown_remaining(t0), MAX_COOLDOWN);
    }

    #[test]
    fn connection_failures_in_a_row_open_the_circuit_then_one_probe_decides() {
        let mut s = Signals::new(breaker());
        let t0 = Instant::now();
        let far = t0 + Duration::from_secs(600);
        for _ in 0..2 {
            s.finished(t0, Sent::ConnectionFailed, false);
        }
        s.finished(t0, Sent::Answered, false);
        s.finished(t0, Sent::ConnectionFailed, false);
        s.finished(t0, Sent::ConnectionFailed, false);
        assert!(!s.circuit_open(), "an answer in between resets the run");
        s.finished(t0, Sent::TimedOut, false);
        s.finished(t0, Sent::ConnectionFailed, false);
        assert!(s.circuit_open(), "three in a row (a timeout says nothing)");
        assert_eq!(s.admit(t0, far), Admit::Refuse(Refused::CircuitOpen));
        let later = t0 + Duration::from_secs(5);
        assert_eq!(s.admit(later, far), Admit::Send { probe: true });
        assert_eq!(
            s.admit(later, far),
            Admit::Refuse(Refused::CircuitOpen),
            "one probe at a time"
        );
        s.finished(later, Sent::ConnectionFailed, true);
        assert_eq!(
            s.admit(later + Duration::from_secs(1), far),
            Admit::Refuse(Refused::CircuitOpen),
            "a failed probe opens it again"
        );
        let again = later + Duration::from_secs(5);
        assert_eq!(s.admit(again, far), Admit::Send { probe: true });
        s.probe_dropped();
        assert_eq!(
            s.admit(again, far),
            Admit::Send { probe: true },
            "a cancelled probe"
        );
        s.finished(again, Sent::Answered, true);
        assert!(!s.circuit_open());
        assert_eq!(s.admit(again, far), Admit::Send { probe: false });
    }

    #[test]
    fn no_breaker_when_its_threshold_is_zero() {
        let mut s = Signals::new(BreakerSettings {
            failures: 0,
            open_for: Duration::from_secs(5),
        });
        let t0 = Instant::now();
        for _ in 0..100 {
            s.finished(t0, Sent::ConnectionFailed, false);
        }
        assert!(!s.circuit_open());
    }

    #[tokio::test(start_paused = true)]
    async fn slots_go_in_arrival_order_and_a_dropped_waiter_leaves_the_queue() {
        let gate = ModelGate::new(1, breaker());
        let deadline = Instant::now() + Duration::from_secs(60);
        let first = gate.enter(deadline).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for n in 0..3 {
            let (gate, tx) = (gate.clone(), tx.clone());
            waiters.push(tokio::spawn(async move {
                let slot = gate.enter(deadline).await;
                tx.send((n, slot.is_ok())).unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(slot);
            }));
            tokio::task::yield_now().await;
        }
        waiters[1].abort();
        drop(first);
        assert_eq!(rx.recv().await, Some((0, true)));
        assert_eq!(
            rx.recv().await,
            Some((2, true)),
            "the aborted waiter left the queue"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_that_passes_in_the_queue_refuses_the_attempt() {
        let gate = ModelGate::new(1, breaker());
        let _held = gate
            .enter(Instant::now() + Duration::from_secs(60))
            .await
            .unwrap();
        let refused = gate
            .enter(Instant::now() + Duration::from_secs(2))
            .await
            .unwrap_err();
        assert_eq!(
            refused,
            Refused::Deadline {
                waited: Duration::from_secs(2)
            }
        );
    }
}
