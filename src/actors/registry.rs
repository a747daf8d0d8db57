//! The RunRegistry: one per HTTP worker (each worker's releases run on its thread; a
//! [`super::Shards`] routes cancels to all of them), and one for `check`. It maps run ids to their supervisors, starts a
//! supervisor per release with its lock token, refuses a second release of a run in flight
//! here (the Redis lock refuses it across replicas), routes cancels, and forgets runs when
//! they end.
//!
//! It also watches its runs in flight: every `cancel.poll_interval_ms` one pipelined store
//! command checks all their cancel markers and renews the leases that are due (every third
//! of `redis.lock_lease_ms`). A marker found cancels the run (a cancel without a publish is
//! not lost); a renewal that finds the lock gone tells the supervisor it can never commit.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::dev::{MessageResponse, OneshotSender};
use actix::{
    Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, MessageResult,
    ResponseFuture, WrapFuture,
};
use tokio::sync::oneshot;

use super::attempt::CheckMarker;
use super::supervisor::{Cancel, LockLost, RunEvent, RunNotice, RunSupervisor};
use super::{Harness, ReleaseError, ReleaseRequest, Released};
use crate::domain::audit::CancelSource;
use crate::store::{new_lock_token, StoreError, Watch, Watched};
use crate::telemetry;

/// A release in flight here.
struct InFlightRun {
    /// Tells a restarted release of the same run apart.
    supervisor: u64,
    addr: Addr<RunSupervisor>,
    token: String,
    /// The lock is held (the begin script took it): its lease is renewed from now on.
    held: bool,
    renewed_at: Instant,
    /// Its place under `server.max_in_flight`, freed when the run is forgotten.
    _admitted: super::Admitted,
    /// When the release started here (the console's runs in flight).
    started: Instant,
}

pub struct RunRegistry {
    harness: Harness,
    runs: HashMap<String, InFlightRun>,
    next_id: u64,
    /// Set on shutdown: new releases are refused, running ones finish.
    draining: bool,
    /// A watch command is out; the next tick waits for it.
    watching: bool,
    /// Marker checks asked for ([`CheckMarker`]) and not yet sent: they go together in the
    /// next pipeline, so checks that fall due at once cost Redis one round trip.
    marker_checks: Vec<(String, oneshot::Sender<Result<bool, StoreError>>)>,
    /// A pipeline of marker checks is out; those asked meanwhile wait for it.
    checking_markers: bool,
}

impl RunRegistry {
    pub fn new(harness: Harness) -> Self {
        RunRegistry {
            harness,
            runs: HashMap::new(),
            next_id: 0,
            draining: false,
            watching: false,
            marker_checks: Vec::new(),
            checking_markers: false,
        }
    }

    /// Sends every marker check asked for so far in one pipeline, unless one is out (then
    /// they go when it answers).
    fn check_markers(&mut self, ctx: &mut Context<Self>) {
        if self.checking_markers || self.marker_checks.is_empty() {
            return;
        }
        let asked = std::mem::take(&mut self.marker_checks);
        self.checking_markers = true;
        let runs: Vec<String> = asked.iter().map(|(run, _)| run.clone()).collect();
        let store = self.harness.store.clone();
        let work = async move { store.cancel_markers(&runs).await };
        ctx.spawn(work.into_actor(self).map(move |found, registry, ctx| {
            registry.checking_markers = false;
            match found {
                Ok(found) => {
                    for ((_, reply), cancelled) in asked.into_iter().zip(found) {
                        let _ = reply.send(Ok(cancelled));
                    }
                }
                Err(e) => {
                    for (_, reply) in asked {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
            registry.check_markers(ctx);
        }));
    }

    /// One watch of every run in flight: markers, and the renewals that are due.
    fn watch(&mut self, ctx: &mut Context<Self>) {
        if self.watching || self.runs.is_empty() {
            return;
        }
        let now = Instant::now();
        let renew_every = self.harness.config.lock_renew_every();
        let watched: Vec<Watched> = self
            .runs
            .iter()
            .map(|(run_id, run)| Watched {
                run_id: run_id.clone(),
                renew: (run.held && now.duration_since(run.renewed_at) >= renew_every)
                    .then(|| run.token.clone()),
            })
            .collect();
        self.watching = true;
        let store = self.harness.store.clone();
        let lease = self.harness.config.lock_lease();
        let work = async move {
            let found = store.watch(&watched, lease).await;
            (watched, found)
        };
        ctx.spawn(
            work.into_actor(self)
                .map(move |(watched, found), registry, _| {
                    registry.watching = false;
                    if let Ok(found) = found {
                        registry.watched(&watched, &found, now);
                    }
                }),
        );
    }

    fn watched(&mut self, watched: &[Watched], found: &[Watch], asked_at: Instant) {
        for (asked, found) in watched.iter().zip(found) {
            let Some(run) = self.runs.get_mut(&asked.run_id) else {
                continue;
            };
            // A later release of the same run has its own token: this answer is not for it.
            if asked
                .renew
                .as_ref()
                .is_some_and(|token| *token != run.token)
            {
                continue;
            }
            if found.cancelled {
                run.addr.do_send(Cancel(CancelSource::Marker));
            }
            match found.renewed {
                Some(true) => run.renewed_at = asked_at,
                Some(false) => run.addr.do_send(LockLost),
                None => {}
            }
        }
    }
}

impl Actor for RunRegistry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(
            self.harness.config.cancel_poll_interval(),
            |registry, ctx| registry.watch(ctx),
        );
    }
}

/// Sent by the HTTP API and `check`: release one run. Answers its result, `InFlight`
/// (409) if a release of this run is running, or a store error (503).
#[derive(Message)]
#[rtype(result = "Result<Released, ReleaseError>")]
pub struct StartRelease(pub ReleaseRequest);

/// Sent by the HTTP API (cancel route) and the CancelListener (pub/sub). Answers whether
/// the run's release was in flight on this replica.
#[derive(Message, Debug, Clone)]
#[rtype(result = "bool")]
pub struct CancelRun {
    pub run_id: String,
    pub source: CancelSource,
}

/// Sent by the CancelListener after it (re)subscribed: check the markers of every run in
/// flight now, since a cancel published while it was not subscribed was lost.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct WatchNow;

/// How many releases are in flight here (tests, soak checks, shutdown).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "usize")]
pub struct InFlight;

/// A release in flight here, as the console lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RunInFlight {
    pub run_id: String,
    /// Milliseconds since the release started.
    pub running_ms: u64,
    /// Whether the release holds the run's lock (false: its begin script is still out).
    pub lock_held: bool,
}

/// Which releases are in flight here (the console): at most `max` of them, oldest first.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Vec<RunInFlight>")]
pub struct RunsInFlight {
    pub max: usize,
}

impl Handler<RunsInFlight> for RunRegistry {
    type Result = MessageResult<RunsInFlight>;
    fn handle(&mut self, msg: RunsInFlight, _: &mut Self::Context) -> Self::Result {
        let mut runs: Vec<RunInFlight> = self
            .runs
            .iter()
            .map(|(run_id, run)| RunInFlight {
                run_id: run_id.clone(),
                running_ms: run.started.elapsed().as_millis() as u64,
                lock_held: run.held,
            })
            .collect();
        runs.sort_by_key(|run| std::cmp::Reverse(run.running_ms));
        runs.truncate(msg.max);
        MessageResult(runs)
    }
}

/// Sent on shutdown: refuse new releases from now on. Answers the releases still in flight.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "usize")]
pub struct Drain;

impl Handler<StartRelease> for RunRegistry {
    type Result = Starting;

    fn handle(&mut self, msg: StartRelease, ctx: &mut Self::Context) -> Starting {
        if self.draining {
            return Starting::Answer(Err(ReleaseError::ShuttingDown));
        }
        let run_id = msg.0.run_id.clone();
        if self.runs.contains_key(&run_id) {
            return Starting::Answer(Err(ReleaseError::InFlight {
                holder: Some(self.harness.replica.to_string()),
                retry_after: Duration::from_secs(1),
            }));
        }
        let Some(admitted) = self.harness.admission.try_admit() else {
            return Starting::Answer(Err(ReleaseError::Overloaded {
                retry_after: Duration::from_secs(
                    self.harness.config.server.overloaded_retry_after_s.get(),
                ),
            }));
        };
        self.next_id += 1;
        let id = self.next_id;
        let token = new_lock_token(&self.harness.replica);
        // The supervisor runs once the caller's reply is handed to it (`Starting::handle`);
        // its address exists before, so that the run is registered first.
        let context = Context::new();
        let now = Instant::now();
        self.runs.insert(
            run_id,
            InFlightRun {
                supervisor: id,
                addr: context.address(),
                token: token.clone(),
                held: false,
                renewed_at: now,
                _admitted: admitted,
                started: now,
            },
        );
        let owners = (ctx.address().recipient(), ctx.address().recipient());
        let supervisor = RunSupervisor::new(id, msg.0, token, self.harness.clone(), owners);
        telemetry::run_started();
        Starting::Run(supervisor, context)
    }
}

/// The registry's answer to [`StartRelease`]: at once (shutting down, or a release of the
/// run in flight here), or by the run's supervisor, which is given the caller's reply and
/// answers it itself when the release ends. No task waits between them.
#[allow(clippy::large_enum_variant)] // moved once, from the handler to `handle`; boxing the supervisor would cost an allocation per release
pub enum Starting {
    Answer(Result<Released, ReleaseError>),
    Run(RunSupervisor, Context<RunSupervisor>),
}

impl MessageResponse<RunRegistry, StartRelease> for Starting {
    fn handle(
        self,
        _: &mut Context<RunRegistry>,
        reply: Option<OneshotSender<Result<Released, ReleaseError>>>,
    ) {
        match self {
            Starting::Answer(answer) => {
                if let Some(reply) = reply {
                    let _ = reply.send(answer);
                }
            }
            Starting::Run(supervisor, context) => {
                context.run(supervisor.answering(reply));
            }
        }
    }
}

impl Handler<CancelRun> for RunRegistry {
    type Result = bool;
    fn handle(&mut self, msg: CancelRun, _: &mut Self::Context) -> bool {
        match self.runs.get(&msg.run_id) {
            Some(run) => {
                run.addr.do_send(Cancel(msg.source));
                true
            }
            None => false,
        }
    }
}

impl Handler<RunNotice> for RunRegistry {
    type Result = ();
    fn handle(&mut self, msg: RunNotice, _: &mut Self::Context) {
        let Some(run) = self.runs.get_mut(&msg.run_id) else {
            return;
        };
        // A later release of the same run is not concerned.
        if run.supervisor != msg.supervisor {
            return;
        }
        match msg.event {
            RunEvent::LockTaken => {
                run.held = true;
                run.renewed_at = Instant::now();
            }
            RunEvent::Ended => {
                self.runs.remove(&msg.run_id);
                telemetry::run_ended();
            }
        }
    }
}

impl Handler<WatchNow> for RunRegistry {
    type Result = ();
    fn handle(&mut self, _: WatchNow, ctx: &mut Self::Context) {
        self.watch(ctx);
    }
}

impl Handler<CheckMarker> for RunRegistry {
    type Result = ResponseFuture<Result<bool, StoreError>>;
    fn handle(&mut self, msg: CheckMarker, ctx: &mut Self::Context) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        self.marker_checks.push((msg.0, reply));
        self.check_markers(ctx);
        Box::pin(async move {
            answer.await.unwrap_or_else(|_| {
                Err(StoreError::unavailable(
                    "cancel_marker",
                    "the registry stopped before the marker was read".into(),
                ))
            })
        })
    }
}

/// Sent by readiness: this shard's own Redis connections answer.
#[derive(Message)]
#[rtype(result = "Result<(), StoreError>")]
pub struct PingStore;

impl Handler<PingStore> for RunRegistry {
    type Result = ResponseFuture<Result<(), StoreError>>;
    fn handle(&mut self, _: PingStore, _: &mut Self::Context) -> Self::Result {
        let store = self.harness.store.clone();
        Box::pin(async move { store.ping().await })
    }
}

impl Handler<InFlight> for RunRegistry {
    type Result = usize;
    fn handle(&mut self, _: InFlight, _: &mut Self::Context) -> usize {
        self.runs.len()
    }
}

impl Handler<Drain> for RunRegistry {
    type Result = MessageResult<Drain>;
    fn handle(&mut self, _: Drain, _: &mut Self::Context) -> Self::Result {
        self.draining = true;
        MessageResult(self.runs.len())
    }
}

#[cfg(test)]
mod tests {
    use actix::Actor;

    use super::*;
    use crate::actors::supervisor::tests::{closed, hanging_model, release, world};
    use crate::domain::release::Outcome;

    #[actix_rt::test]
    async fn it_refuses_a_second_release_of_a_run_in_flight_and_forgets_the_run_when_it_ends() {
        let (model, mut connections) = hanging_model().await;
        let (harness, _) = world("r-twice", Some(&model), None);
        let replica = harness.replica.to_string();
        let registry = RunRegistry::new(harness).start();
        let first = registry.send(release("r-twice", "FINAL_ANSWER"));
        let first = actix_rt::spawn(first);
        let connection = connections.recv().await.unwrap();
        assert_eq!(registry.send(InFlight).await.unwrap(), 1);
        match registry
            .send(release("r-twice", "FINAL_ANSWER"))
            .await
            .unwrap()
        {
            Err(ReleaseError::InFlight { holder, .. }) => assert_eq!(holder, Some(replica)),
            other => panic!("{other:?}"),
        }
        let cancel = |run: &str| CancelRun {
            run_id: run.into(),
            source: CancelSource::Http,
        };
        assert!(!registry.send(cancel("r-elsewhere")).await.unwrap());
        assert!(registry.send(cancel("r-twice")).await.unwrap());
        let first = first.await.unwrap().unwrap().unwrap();
        assert_eq!(first.result.outcome, Outcome::Cancelled);
        assert!(closed(connection).await);
        assert_eq!(registry.send(InFlight).await.unwrap(), 0);
        assert!(!registry.send(cancel("r-twice")).await.unwrap());
    }

    #[actix_rt::test]
    async fn its_marker_poll_cancels_a_run_whose_marker_was_set_behind_its_back() {
        let (model, mut connections) = hanging_model().await;
        let (harness, store) = world("r-polled", Some(&model), Some(20));
        let registry = RunRegistry::new(harness).start();
        let answer = actix_rt::spawn(registry.send(release("r-polled", "FINAL_ANSWER")));
        let connection = connections.recv().await.unwrap();
        // The marker alone, as another replica or the agent would set it: no message.
        store.cancel("r-polled").await.unwrap();
        let answer = answer.await.unwrap().unwrap().unwrap();
        assert_eq!(answer.result.outcome, Outcome::Cancelled);
        assert!(closed(connection).await);
    }

    #[actix_rt::test]
    async fn a_draining_registry_refuses_new_releases() {
        let (harness, store) = world("r-late-comer", None, None);
        let registry = RunRegistry::new(harness).start();
        assert_eq!(registry.send(Drain).await.unwrap(), 0);
        let answer = registry
            .send(release("r-late-comer", "INFORMATION_SATURATION"))
            .await
            .unwrap();
        assert!(matches!(answer, Err(ReleaseError::ShuttingDown)));
        assert_eq!(store.get_result("r-late-comer").await.unwrap(), None);
    }
}
