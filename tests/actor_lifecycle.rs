//! Nothing leaks per run: after many releases of every kind (judged, repaired, failed,
//! cancelled mid-call, refused as in flight), the registry holds no run and every actor of
//! the run trees has stopped. Alone in its test binary because it counts live actors.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use std::time::Duration;

use actix::Actor;
use common::*;
use release_harness::actors::{
    live_actors, CancelRun, Harness, InFlight, ReleaseError, RunRegistry, StartRelease,
};
use release_harness::check::RunBundle;
use release_harness::domain::audit::CancelSource;
use release_harness::domain::request::release_request;
use release_harness::store::Store;
use serde_json::json;
use wiremock::MockServer;

#[actix_rt::test]
async fn many_runs_leave_no_run_and_no_actor_behind() {
    let server = MockServer::start().await;
    on_repair(&server, content(&good_draft().to_string())).await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence.")
            .set_delay(Duration::from_millis(20)),
    )
    .await;

    let runs: Vec<String> = (0..60).map(|_| unique_run("lifecycle")).collect();
    let invocations = runs
        .iter()
        .flat_map(|run| standard_invocations(run))
        .collect();
    // One bundle can hold many runs' records: each is stored under its own run id.
    let all = RunBundle::parse(&bundle(&runs[0], good_draft(), invocations).to_string()).unwrap();
    let store = Store::Memory(all.store().unwrap());
    let harness = Harness::new(config(Some(&server.uri())), store).unwrap();
    let registry = RunRegistry::new(harness).start();

    let mut typo = good_draft();
    typo["analyses"][0]["tool_call_ids"] = json!(["call-log-1"]);
    let drafts = [
        good_draft(),
        typo,
        json!("not a draft"),
        json!({"conclusion": null, "analyses": []}),
    ];
    let mut pending = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let draft = drafts[i % drafts.len()].to_string();
        let request = release_request(run, Some(QUERY), None, Some(&draft)).unwrap();
        pending.push(actix_rt::spawn(
            registry.send(StartRelease(request.clone())),
        ));
        if i % 7 == 0 {
            // A second release of the same run while it is in flight is refused.
            let second = registry.send(StartRelease(request)).await.unwrap();
            assert!(matches!(second, Err(ReleaseError::InFlight { .. }) | Ok(_)));
        }
        if i % 5 == 0 {
            registry.do_send(CancelRun {
                run_id: run.clone(),
                source: CancelSource::Http,
            });
        }
    }
    let mut outcomes = std::collections::BTreeMap::new();
    for p in pending {
        let released = p.await.unwrap().unwrap().unwrap();
        *outcomes
            .entry(released.result.outcome.as_str())
            .or_insert(0) += 1;
    }
    assert!(
        outcomes.contains_key("SUCCESS") && outcomes.contains_key("FALLBACK"),
        "{outcomes:?}"
    );

    // Actors stop asynchronously after answering; give them a moment.
    for _ in 0..200 {
        if registry.send(InFlight).await.unwrap() == 0 && live_actors() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        registry.send(InFlight).await.unwrap(),
        0,
        "the registry forgot every run"
    );
    assert_eq!(live_actors(), 0, "every supervisor and child actor stopped");
}
