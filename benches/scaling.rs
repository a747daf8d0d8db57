//! Releases per second with one worker and with two, side by side in one run: does the
//! release path use every core? Each worker is an arbiter (a thread) with its own registry
//! shard, as `serve` starts one per HTTP worker, and drives its share of the releases
//! itself, `IN_FLIGHT` at a time, as an HTTP worker does with its connections. The
//! releases are deterministic (no conclusion: records loaded and guarded, no model call)
//! on the in-memory store, so the harness is the only work on the machine: the figure is
//! the release path's, without Redis, a model or a load generator taking cores from it.
//! That is what `scripts/load.sh` cannot show on a machine with two cores, where `wrk`,
//! Redis and the fake model share them with the harness.
//!
//! `cargo bench --bench scaling` (RELEASES per measurement, default 10000; ROUNDS of the
//! 1-then-2 pair, default 3). Prints releases/s per measurement and the ratio per round.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use actix::{Actor, Arbiter};
use futures::StreamExt;
use release_harness::actors::{Harness, RunRegistry, StartRelease};
use release_harness::check::RunBundle;
use release_harness::config::Config;
use release_harness::domain::release::FallbackType;
use release_harness::domain::request::{release_request, ReleaseRequest};
use release_harness::store::{MemoryStore, Store};
use release_harness::tools::fixtures::{bundle, good_draft, standard_invocations, QUERY};

/// Releases each worker keeps in flight.
const IN_FLIGHT: usize = 16;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Seeds `count` fresh runs (records and calls list) and answers their release requests:
/// a Draft without a conclusion, released from the ProgressSnapshot.
fn seed(memory: &MemoryStore, tag: &str, count: usize) -> Vec<ReleaseRequest> {
    let mut draft = good_draft();
    draft["conclusion"] = serde_json::Value::Null;
    let draft = draft.to_string();
    (0..count)
        .map(|i| {
            let run = format!("scaling-{tag}-{i}");
            let b = bundle(&run, serde_json::Value::Null, standard_invocations(&run));
            RunBundle::parse(&b.to_string())
                .expect("bundle")
                .agent_records()
                .expect("records")
                .write_memory(memory);
            release_request(&run, Some(QUERY), None, Some(&draft)).expect("request")
        })
        .collect()
}

/// A worker's store (of its own: the in-memory store is one mutex, which two workers would
/// queue on where a Redis serves both at once) and its share of the releases.
struct Share {
    memory: MemoryStore,
    requests: Vec<ReleaseRequest>,
}

/// `count` releases seeded for each of `workers` workers, in stores of the measurement's
/// own (dropped after it, so that the runs of earlier measurements do not add up).
fn shares(workers: usize, tag: &str, count: usize) -> Vec<Share> {
    (0..workers)
        .map(|w| {
            let memory = MemoryStore::new();
            let requests = seed(&memory, &format!("{tag}-{w}"), count / workers);
            Share { memory, requests }
        })
        .collect()
}

/// Every share released by an arbiter of its own, with its own registry shard; answers
/// the wall-clock time from the first release to the last answer.
fn measure(shares: Vec<Share>) -> Duration {
    let expected: usize = shares.iter().map(|s| s.requests.len()).sum();
    let arbiters: Vec<Arbiter> = shares.iter().map(|_| Arbiter::new()).collect();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<usize>();
    let began = Instant::now();
    for (arbiter, share) in arbiters.iter().zip(shares) {
        let done = done_tx.clone();
        arbiter.spawn_fn(move || {
            let store = Store::Memory(share.memory);
            let harness = Harness::new(Config::defaults(), store).expect("harness");
            let registry = RunRegistry::new(harness).start();
            actix_rt::spawn(async move {
                let released = futures::stream::iter(share.requests)
                    .map(|request| registry.send(StartRelease(request)))
                    .buffer_unordered(IN_FLIGHT)
                    .filter(|answer| {
                        let ok = matches!(answer, Ok(Ok(r)) if r.result.fallback_type
                            == Some(FallbackType::InsufficientEvidence)
                            && r.result.observed_facts.len() == 4);
                        std::future::ready(ok)
                    })
                    .count()
                    .await;
                done.send(released).expect("the bench waits");
            });
        });
    }
    drop(done_tx);
    let released: usize = done_rx.iter().sum();
    let elapsed = began.elapsed();
    for arbiter in arbiters {
        arbiter.stop();
        arbiter.join().expect("arbiter");
    }
    assert_eq!(released, expected, "every release answered as expected");
    elapsed
}

fn main() {
    let releases = env_or("RELEASES", 10_000);
    let rounds = env_or("ROUNDS", 3);
    let system = actix::System::new();
    system.block_on(async {
        // Warm-up: allocator, lazy statics.
        measure(shares(2, "warm", 2_000));
        println!(
            "scaling: {releases} deterministic releases per measurement, {IN_FLIGHT} in flight per worker, {} cores",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        for round in 1..=rounds {
            let mut rates = Vec::new();
            for workers in [1, 2] {
                let elapsed = measure(shares(workers, &format!("{round}-{workers}"), releases));
                let rate = releases as f64 / elapsed.as_secs_f64();
                println!(
                    "round {round}: {workers} worker(s): {rate:>9.0} releases/s ({:.2} s)",
                    elapsed.as_secs_f64()
                );
                rates.push(rate);
            }
            println!("round {round}: 2 workers / 1 worker = {:.2}x", rates[1] / rates[0]);
        }
    });
}
