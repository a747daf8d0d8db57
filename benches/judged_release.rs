//! One judged release through the whole actor tree (registry, supervisor, EvidenceGuard,
//! SemanticGuard, Budget actors; in-memory store) against an instant in-process model
//! speaking the OpenAI protocol over real HTTP. Two measurements: the total release time,
//! and the harness's own time (total minus model wait, from the audit record). After the
//! criterion runs, a fixed sample of 2000 releases prints the median and p99 of both.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use actix::{Actor, Addr};
use criterion::{criterion_group, criterion_main, Criterion};
use release_harness::actors::{Harness, RunRegistry, StartRelease};
use release_harness::check::RunBundle;
use release_harness::config::Config;
use release_harness::domain::request::release_request;
use release_harness::store::{MemoryStore, Store};
use release_harness::tools::fake_model::{FakeModel, FakeModelOptions};
use release_harness::tools::fixtures::{bundle, good_draft, standard_invocations, QUERY};
use serde_json::Value;

struct Bench {
    registry: Addr<RunRegistry>,
    memory: MemoryStore,
    store: Store,
    draft: String,
    next: u64,
}

impl Bench {
    /// Seeds a fresh run (outside the measured time) and returns its id.
    fn seed(&mut self) -> String {
        self.next += 1;
        let run = format!("bench-{}", self.next);
        let b =
            RunBundle::parse(&bundle(&run, good_draft(), standard_invocations(&run)).to_string())
                .expect("bundle");
        b.agent_records()
            .expect("records")
            .write_memory(&self.memory);
        run
    }

    /// One release; (total, harness time).
    async fn release(&mut self) -> (Duration, Duration) {
        let run = self.seed();
        let request = release_request(&run, Some(QUERY), None, Some(&self.draft)).expect("request");
        let began = Instant::now();
        let released = self
            .registry
            .send(StartRelease(request))
            .await
            .expect("mailbox")
            .expect("release");
        let total = began.elapsed();
        assert_eq!(released.result.outcome.as_str(), "SUCCESS");
        let audit: Value =
            serde_json::from_str(&self.store.get_audit(&run).await.unwrap().unwrap()).unwrap();
        let wait_ms = audit["timings"]["model_wait_ms"].as_f64().unwrap_or(0.0);
        (
            total,
            total.saturating_sub(Duration::from_secs_f64(wait_ms / 1000.0)),
        )
    }
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn judged_release(c: &mut Criterion) {
    let system = actix::System::new();
    let (mut bench, _model) = system.block_on(async {
        let model =
            FakeModel::start("127.0.0.1:0", FakeModelOptions::default()).expect("fake model");
        let mut config = Config::defaults();
        config.model.base_url = model.url.clone();
        let memory = MemoryStore::new();
        let store = Store::Memory(memory.clone());
        let registry =
            RunRegistry::new(Harness::new(config, store.clone()).expect("harness")).start();
        let bench = Bench {
            registry,
            memory,
            store,
            draft: good_draft().to_string(),
            next: 0,
        };
        (bench, model)
    });

    let mut group = c.benchmark_group("judged_release");
    group.measurement_time(Duration::from_secs(8));
    group.bench_function("total", |b| {
        b.iter_custom(|iters| {
            system.block_on(async {
                let mut sum = Duration::ZERO;
                for _ in 0..iters {
                    sum += bench.release().await.0;
                }
                sum
            })
        })
    });
    group.bench_function("harness_overhead", |b| {
        b.iter_custom(|iters| {
            system.block_on(async {
                let mut sum = Duration::ZERO;
                for _ in 0..iters {
                    sum += bench.release().await.1;
                }
                sum
            })
        })
    });
    group.finish();

    let (mut totals, mut own): (Vec<Duration>, Vec<Duration>) = system.block_on(async {
        let mut samples = Vec::with_capacity(2000);
        for _ in 0..2000 {
            samples.push(bench.release().await);
        }
        samples.into_iter().unzip()
    });
    totals.sort();
    own.sort();
    eprintln!(
        "judged_release over 2000 releases: total median {:?} p99 {:?}; harness time median {:?} p99 {:?}",
        percentile(&totals, 0.5),
        percentile(&totals, 0.99),
        percentile(&own, 0.5),
        percentile(&own, 0.99)
    );
}

criterion_group!(benches, judged_release);
criterion_main!(benches);
