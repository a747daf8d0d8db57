//! The RunRegistry: one per process. It maps run ids to their supervisors, starts a
//! supervisor per release, refuses a second release of a run in flight here (the Redis
//! lock refuses it across replicas), routes cancels, and forgets runs when they end.

use std::collections::HashMap;

use actix::{Actor, Addr, AsyncContext, Context, Handler, Message, MessageResult, ResponseFuture};

use super::supervisor::{Cancel, Run, RunSupervisor};
use super::{Harness, ReleaseError, ReleaseRequest, Released};
use crate::domain::audit::CancelSource;
use crate::telemetry;

pub struct RunRegistry {
    harness: Harness,
    /// Supervisors of the runs in flight here, with the id that tells restarts apart.
    runs: HashMap<String, (u64, Addr<RunSupervisor>)>,
    next_id: u64,
    /// Set on shutdown: new releases are refused, running ones finish.
    draining: bool,
}

impl RunRegistry {
    pub fn new(harness: Harness) -> Self {
        RunRegistry {
            harness,
            runs: HashMap::new(),
            next_id: 0,
            draining: false,
        }
    }
}

impl Actor for RunRegistry {
    type Context = Context<Self>;
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

/// Sent by a supervisor when it stops.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct RunEnded {
    pub run_id: String,
    pub supervisor: u64,
}

/// How many releases are in flight here (tests, soak checks, shutdown).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "usize")]
pub struct InFlight;

/// Sent on shutdown: refuse new releases from now on. Answers the releases still in flight.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "usize")]
pub struct Drain;

impl Handler<StartRelease> for RunRegistry {
    type Result = ResponseFuture<Result<Released, ReleaseError>>;

    fn handle(&mut self, msg: StartRelease, ctx: &mut Self::Context) -> Self::Result {
        if self.draining {
            return Box::pin(async { Err(ReleaseError::ShuttingDown) });
        }
        let run_id = msg.0.run_id.clone();
        if self.runs.contains_key(&run_id) {
            return Box::pin(async { Err(ReleaseError::InFlight) });
        }
        self.next_id += 1;
        let id = self.next_id;
        let supervisor = RunSupervisor::new(id, msg.0, self.harness.clone(), ctx.address()).start();
        self.runs.insert(run_id, (id, supervisor.clone()));
        telemetry::runs_in_flight(self.runs.len());
        Box::pin(async move {
            supervisor.send(Run).await.unwrap_or_else(|e| {
                Err(ReleaseError::Internal(format!(
                    "the run supervisor is gone: {e}"
                )))
            })
        })
    }
}

impl Handler<CancelRun> for RunRegistry {
    type Result = bool;
    fn handle(&mut self, msg: CancelRun, _: &mut Self::Context) -> bool {
        match self.runs.get(&msg.run_id) {
            Some((_, supervisor)) => {
                supervisor.do_send(Cancel(msg.source));
                true
            }
            None => false,
        }
    }
}

impl Handler<RunEnded> for RunRegistry {
    type Result = ();
    fn handle(&mut self, msg: RunEnded, _: &mut Self::Context) {
        if self.runs.get(&msg.run_id).map(|(id, _)| *id) == Some(msg.supervisor) {
            self.runs.remove(&msg.run_id);
            telemetry::runs_in_flight(self.runs.len());
        }
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
