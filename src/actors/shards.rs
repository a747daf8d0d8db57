//! The registry shards of a service: one [`RunRegistry`] per HTTP worker, started on that
//! worker's arbiter, so a release runs (supervisor, children, model call) on the thread
//! that received its request and every worker thread carries releases. The Redis lock
//! still decides which release of a run goes ahead, across shards as across replicas.
//!
//! [`Shards`] reaches all of them, for what concerns a run wherever it runs (cancels from
//! the API and pub/sub, the marker check after a re-subscription) and for shutdown.

use std::sync::{Arc, Mutex, PoisonError};

use actix::Addr;

use super::registry::{
    CancelRun, Drain, InFlight, PingStore, RunInFlight, RunRegistry, RunsInFlight, WatchNow,
};
use crate::domain::audit::CancelSource;
use crate::store::StoreError;

#[derive(Clone, Default)]
pub struct Shards {
    shards: Arc<Mutex<Vec<Addr<RunRegistry>>>>,
}

impl Shards {
    /// Adds a worker's registry (and forgets those of workers that are gone).
    pub fn add(&self, registry: Addr<RunRegistry>) {
        let mut shards = self.shards.lock().unwrap_or_else(PoisonError::into_inner);
        shards.retain(Addr::connected);
        shards.push(registry);
    }

    fn all(&self) -> Vec<Addr<RunRegistry>> {
        self.shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Cancels the run's release on whichever shard runs it; answers whether one did.
    pub async fn cancel(&self, run_id: &str, source: CancelSource) -> bool {
        let mut running = false;
        for shard in self.all() {
            let asked = shard.send(CancelRun {
                run_id: run_id.to_string(),
                source,
            });
            running |= asked.await.unwrap_or(false);
        }
        running
    }

    /// Cancels without waiting for the answer (the pub/sub listener).
    pub fn cancel_now(&self, run_id: &str, source: CancelSource) {
        for shard in self.all() {
            shard.do_send(CancelRun {
                run_id: run_id.to_string(),
                source,
            });
        }
    }

    /// Every shard checks the markers of its runs in flight now.
    pub fn watch_now(&self) {
        for shard in self.all() {
            shard.do_send(WatchNow);
        }
    }

    /// Every shard's own Redis connections answer (a shard that is gone is skipped). A
    /// ping also reconnects a connection that broke while Redis was away, so a worker is
    /// ready again before its next release.
    pub async fn ping(&self) -> Result<(), StoreError> {
        for shard in self.all() {
            if let Ok(answer) = shard.send(PingStore).await {
                answer?;
            }
        }
        Ok(())
    }

    /// Releases in flight on all shards.
    pub async fn in_flight(&self) -> usize {
        let mut total = 0;
        for shard in self.all() {
            total += shard.send(InFlight).await.unwrap_or(0);
        }
        total
    }

    /// The releases in flight on all shards, at most `max`, oldest first.
    pub async fn runs_in_flight(&self, max: usize) -> Vec<RunInFlight> {
        let mut runs = Vec::new();
        for shard in self.all() {
            runs.extend(shard.send(RunsInFlight { max }).await.unwrap_or_default());
        }
        runs.sort_by_key(|run| std::cmp::Reverse(run.running_ms));
        runs.truncate(max);
        runs
    }

    /// Every shard refuses new releases from now on; answers the releases in flight.
    pub async fn drain(&self) -> usize {
        let mut total = 0;
        for shard in self.all() {
            total += shard.send(Drain).await.unwrap_or(0);
        }
        total
    }
}
