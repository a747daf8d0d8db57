//! The per-run actor tree (ARCHITECTURE.md): a [`RunRegistry`] per HTTP worker starts one
//! [`RunSupervisor`] per release; the supervisor decides EvidenceGuard itself (a pure
//! domain call), starts the run's Repair, SemanticGuard and Budget actors when it first
//! needs them, owns every pending model future through them, and stops them all when the
//! run ends. `Cancel` aborts pending model calls (their HTTP requests are dropped) and
//! answers CANCELLED.
//!
//! Imports run one way: registry → supervisor → repair, semantic_guard, budget → attempt.
//! Messages are small named types next to the actor that handles them, except those a
//! lower actor sends up (the attempt's reports, the supervisor's notices), which live with
//! their sender so that it need not know its receiver.

/// The lifecycle every child actor of a run shares, written once: it counts in
/// [`live_actors`] while it runs, and stops on [`StopChild`]. A child that owns a pending
/// model call (`run_child!(Type, owns_pending_call)`, see [`attempt::OwnsPendingCall`])
/// drops that call first when the stop aborts.
macro_rules! run_child {
    ($child:ty) => {
        run_child!(@actor $child);
        impl actix::Handler<$crate::actors::StopChild> for $child {
            type Result = ();
            fn handle(&mut self, _: $crate::actors::StopChild, ctx: &mut Self::Context) {
                actix::ActorContext::stop(ctx);
            }
        }
    };
    ($child:ty, owns_pending_call) => {
        run_child!(@actor $child);
        impl actix::Handler<$crate::actors::StopChild> for $child {
            type Result = ();
            fn handle(&mut self, stop: $crate::actors::StopChild, ctx: &mut Self::Context) {
                if stop.abort {
                    $crate::actors::attempt::abort_pending_call(self, ctx);
                } else {
                    actix::ActorContext::stop(ctx);
                }
            }
        }
    };
    (@actor $child:ty) => {
        impl actix::Actor for $child {
            type Context = actix::Context<Self>;
            fn started(&mut self, _: &mut Self::Context) {
                $crate::actors::actor_started();
            }
            fn stopped(&mut self, _: &mut Self::Context) {
                $crate::actors::actor_stopped();
            }
        }
    };
}

pub mod admission;
mod attempt;
pub mod budget;
pub mod cancel_listener;
pub mod registry;
pub mod repair;
pub mod semantic_guard;
pub mod shards;
pub mod supervisor;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub use admission::{Admission, Admitted};
pub use cancel_listener::CancelListener;
pub use registry::{CancelRun, Drain, InFlight, RunRegistry, StartRelease};
pub use shards::Shards;

use crate::config::Config;
use crate::domain::audit::CancelSource;
use crate::domain::release::ReleaseResult;
pub use crate::domain::request::ReleaseRequest;
use crate::model::{ClientError, ModelClient, ModelGate};
use crate::store::{RecordLimits, Store, StoreError};

/// What every run shares: configuration, the store, the model client (None when
/// `model.base_url` is empty) and this replica's name (in lock tokens and 409 answers).
#[derive(Clone)]
pub struct Harness {
    pub config: Arc<Config>,
    pub store: Store,
    pub model: Option<ModelClient>,
    /// The replica's one model gate (`model.max_concurrent_calls`, cooldown, circuit),
    /// shared by every worker.
    pub gate: Arc<ModelGate>,
    /// The replica's admission count (`server.max_in_flight`), shared by every worker.
    pub admission: Admission,
    pub replica: Arc<str>,
}

/// Why the shared parts of the runs could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error(transparent)]
    Model(#[from] ClientError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Harness {
    pub fn new(config: Config, store: Store) -> Result<Harness, HarnessError> {
        let model = if config.model_configured() {
            Some(ModelClient::new(&config.model)?)
        } else {
            None
        };
        Ok(Harness {
            replica: replica_name(&config).into(),
            gate: ModelGate::new(
                config.model.max_concurrent_calls.get(),
                crate::model::gate::BreakerSettings::of(&config.model),
            ),
            admission: Admission::new(config.server.max_in_flight.get()),
            config: Arc::new(config),
            store,
            model,
        })
    }

    /// A copy for one HTTP worker, whose releases run on its thread: Redis connections and
    /// a model client of its own, so that their I/O is driven on that thread too.
    pub fn for_worker(&self) -> Result<Harness, HarnessError> {
        let model = match self.model {
            Some(_) => Some(ModelClient::new(&self.config.model)?),
            None => None,
        };
        Ok(Harness {
            config: self.config.clone(),
            store: self.store.for_worker(&self.config.redis)?,
            model,
            gate: self.gate.clone(),
            admission: self.admission.clone(),
            replica: self.replica.clone(),
        })
    }
}

/// The bounds on reading the agent's records (`evidence.max_record_bytes`,
/// `evidence.max_release_bytes`, `evidence.max_calls_list_bytes`): configuration read for
/// the store, here, where both meet.
pub fn record_limits(config: &Config) -> RecordLimits {
    RecordLimits {
        max_record_bytes: config.evidence.max_record_bytes.get(),
        max_release_bytes: config.evidence.max_release_bytes.get(),
        max_calls_list_bytes: config.evidence.max_calls_list_bytes.get(),
    }
}

/// `server.replica_name`, or this host's name and the process id.
fn replica_name(config: &Config) -> String {
    if !config.server.replica_name.is_empty() {
        return config.server.replica_name.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "harness".into());
    format!("{host}:{}", std::process::id())
}

/// A release that produced no result: nothing was stored by it, unless the error is a
/// store error whose outcome is unknown (a retry then answers what was stored, if anything).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    /// Another release of the run holds its lock (`holder`: which replica, if known) for
    /// `retry_after` more at most.
    #[error("a release of this run is already in flight")]
    InFlight {
        holder: Option<String>,
        retry_after: std::time::Duration,
    },
    /// This release's lease ran out or was taken over before it could commit: nothing was
    /// stored by it.
    #[error(
        "the release lost its lock before it could store its result; nothing was stored by it"
    )]
    LockLost,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the stored release result cannot be read: {0}")]
    StoredResultUnreadable(String),
    #[error("the service is shutting down")]
    ShuttingDown,
    /// The replica has `server.max_in_flight` releases in flight: nothing was done.
    #[error("this replica is at its limit of releases in flight")]
    Overloaded { retry_after: std::time::Duration },
    #[error("internal error: {0}")]
    Internal(String),
}

/// The answer to a release: the result and its JSON exactly as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Released {
    pub result: ReleaseResult,
    pub json: String,
    /// True when this is a stored result returned again (no new release ran).
    pub replayed: bool,
    /// Where the release's time went (the answer's `Server-Timing`).
    pub times: StepTimes,
}

/// Where a release's time went, for the `Server-Timing` header of its answer (CONTRACT
/// §3). A replayed result spent it all in `evidence` (the begin script found it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepTimes {
    /// The begin script (lock, marker, the run's records) and EvidenceGuard.
    pub evidence: std::time::Duration,
    /// The one repair call and EvidenceGuard on its candidate.
    pub repair: std::time::Duration,
    /// SemanticGuard, every attempt.
    pub judge: std::time::Duration,
    /// The fenced commit.
    pub commit: std::time::Duration,
    /// The harness's own time: the whole release less the time spent waiting on the model.
    pub harness: std::time::Duration,
}

impl StepTimes {
    /// The `Server-Timing` value: `evidence;dur=1.234, repair;dur=0, …` in milliseconds.
    pub fn header(&self) -> String {
        use std::fmt::Write;
        let mut header = String::with_capacity(96);
        for (i, (name, d)) in [
            ("evidence", self.evidence),
            ("repair", self.repair),
            ("judge", self.judge),
            ("commit", self.commit),
            ("harness", self.harness),
        ]
        .into_iter()
        .enumerate()
        {
            if i > 0 {
                header.push_str(", ");
            }
            let micros = d.as_micros();
            let _ = write!(header, "{name};dur={}.{:03}", micros / 1000, micros % 1000);
        }
        header
    }
}

/// How a model step ended for the supervisor.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome<T> {
    Done(T),
    Cancelled(CancelSource),
    Store(StoreError),
}

/// Live actors of the run tree, for the leak checks of tests and soak runs.
static LIVE_ACTORS: AtomicUsize = AtomicUsize::new(0);

pub fn live_actors() -> usize {
    LIVE_ACTORS.load(Ordering::SeqCst)
}

fn actor_started() {
    LIVE_ACTORS.fetch_add(1, Ordering::SeqCst);
}

fn actor_stopped() {
    LIVE_ACTORS.fetch_sub(1, Ordering::SeqCst);
}

/// Asks a child to stop (sent by the supervisor when its run ends). With `abort` (on
/// Cancel or a lost lock) its pending model future, if any, is dropped first, which drops
/// the call's HTTP request and closes its connection.
#[derive(actix::Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct StopChild {
    pub abort: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn server_timing_names_every_step_in_milliseconds() {
        let times = StepTimes {
            evidence: Duration::from_micros(1234),
            repair: Duration::ZERO,
            judge: Duration::from_millis(250),
            commit: Duration::from_micros(7),
            harness: Duration::from_micros(1500),
        };
        assert_eq!(
            times.header(),
            "evidence;dur=1.234, repair;dur=0.000, judge;dur=250.000, commit;dur=0.007, harness;dur=1.500"
        );
    }
}
