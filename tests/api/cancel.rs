//! Cancel over HTTP and across replicas: the marker, pub/sub, and the in-flight lock.

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::Value;

use crate::helpers::*;

const WAIT: Duration = Duration::from_secs(5);

async fn answered(pending: tokio::task::JoinHandle<reqwest::Response>) -> Value {
    let response = pending.await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.unwrap()
}

#[actix_rt::test]
async fn cancel_during_a_pending_model_call_answers_cancelled_and_closes_the_model_connection() {
    let mut hanging = HangingModel::start();
    let app = spawn_app(AppOptions {
        model: Some(hanging.url.clone()),
        ..Default::default()
    })
    .await;
    let run = unique_run("http-cancel");
    app.seed(&standard_invocations(&run)).await;
    let pending = release_in_background(&app.client, &app.address, &run);
    assert_eq!(hanging.next(WAIT).await, Some(Event::Received));
    let accepted = app.cancel(&run).await;
    assert_eq!(accepted.status().as_u16(), 202);
    assert_eq!(json(accepted).await["run_id"], run);
    let result = tokio::time::timeout(Duration::from_secs(2), answered(pending))
        .await
        .expect("answered promptly");
    assert_eq!(result["outcome"], "CANCELLED");
    assert_eq!(result["fallback_type"], Value::Null);
    hanging.expect_closed("the model connection closed").await;
    let audit = json(app.get(&format!("/v1/runs/{run}/audit")).await).await;
    assert_eq!(audit["cancelled_by"], "http");
    assert!(
        app.stored(&format!("run:{{{run}}}:cancelled"))
            .await
            .is_some(),
        "the durable marker is set"
    );
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metric(&metrics, "harness_cancellations_total{source=\"http\"}") >= 1.0);
    assert!(
        metric(
            &metrics,
            "harness_model_calls_total{role=\"semantic\",result=\"cancelled\"}"
        ) >= 1.0
    );
}

#[actix_rt::test]
async fn cancel_through_replica_b_aborts_the_release_on_replica_a() {
    let mut hanging = HangingModel::start();
    let a = spawn_app(AppOptions {
        model: Some(hanging.url.clone()),
        ..Default::default()
    })
    .await;
    let b = spawn_app(AppOptions {
        model: Some(hanging.url.clone()),
        prefix: Some(a.prefix.clone()),
        ..Default::default()
    })
    .await;
    let run = unique_run("cross-replica");
    a.seed(&standard_invocations(&run)).await;
    let pending = release_in_background(&a.client, &a.address, &run);
    assert_eq!(hanging.next(WAIT).await, Some(Event::Received));

    // A second release of the same run through B while A runs it: 409, from the Redis lock.
    let second = b.post_release(&run, &release_body(good_draft())).await;
    assert_eq!(error_code(second, 409).await, "release_in_flight");

    assert_eq!(b.cancel(&run).await.status().as_u16(), 202);
    let result = tokio::time::timeout(Duration::from_secs(3), answered(pending))
        .await
        .expect("A answered");
    assert_eq!(result["outcome"], "CANCELLED");
    hanging
        .expect_closed("the pending model call was aborted")
        .await;
    let audit = json(a.get(&format!("/v1/runs/{run}/audit")).await).await;
    assert_eq!(
        audit["cancelled_by"], "http",
        "A learned of the cancel through P:cancel; it came in over HTTP (B's route), and the marker says so"
    );
    // Both replicas now answer the stored CANCELLED result.
    assert_eq!(
        json(b.post_release(&run, &release_body(good_draft())).await).await,
        result
    );
}

#[actix_rt::test]
async fn a_marker_set_by_the_agent_is_honoured_without_pubsub() {
    let server = wiremock::MockServer::start().await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence."),
    )
    .await;
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        ..Default::default()
    })
    .await;
    let run = unique_run("agent-marker");
    app.seed(&standard_invocations(&run)).await;
    let mut conn = app.redis().await;
    let _: () = conn
        .set(format!("{}:run:{{{run}}}:cancelled", app.prefix), "1")
        .await
        .unwrap();
    let result = json(app.post_release(&run, &release_body(good_draft())).await).await;
    assert_eq!(result["outcome"], "CANCELLED");
    assert!(
        requests(&server).await.is_empty(),
        "no model call for a cancelled run"
    );
    let audit = json(app.get(&format!("/v1/runs/{run}/audit")).await).await;
    assert_eq!(audit["cancelled_by"], "marker");
}

#[actix_rt::test]
async fn cancelling_a_finished_run_keeps_its_result() {
    let app = spawn_app(AppOptions::default()).await;
    let run = unique_run("finished");
    app.seed(&standard_invocations(&run)).await;
    let body = serde_json::json!({"query": QUERY, "stop_reason": "INFORMATION_SATURATION"});
    let first = json(app.post_release(&run, &body).await).await;
    assert_eq!(first["outcome"], "FALLBACK");
    // Nothing to cancel: 200 (not the 202 of a cancel), saying what is stored.
    let answer = app.cancel(&run).await;
    assert_eq!(answer.status().as_u16(), 200);
    let answer = json(answer).await;
    assert_eq!(answer["run_id"], run);
    assert_eq!(answer["cancelled"], false);
    assert_eq!(answer["outcome"], "FALLBACK");
    assert_eq!(answer["fallback_type"], "INSUFFICIENT_EVIDENCE");
    assert!(answer["message"]
        .as_str()
        .unwrap()
        .contains("already stored"));
    assert!(
        app.stored(&format!("run:{{{run}}}:cancelled"))
            .await
            .is_none(),
        "no marker is set for a stored result"
    );
    assert_eq!(json(app.post_release(&run, &body).await).await, first);
    // A run cancelled earlier: its stored CANCELLED is reported as cancelled.
    let run = unique_run("cancelled-twice");
    assert_eq!(app.cancel(&run).await.status().as_u16(), 202);
    let cancelled = json(app.post_release(&run, &body).await).await;
    assert_eq!(cancelled["outcome"], "CANCELLED");
    let again = app.cancel(&run).await;
    assert_eq!(again.status().as_u16(), 200);
    let again = json(again).await;
    assert_eq!(again["cancelled"], true);
    assert_eq!(again["outcome"], "CANCELLED");
}

#[actix_rt::test]
async fn a_cancel_sent_before_the_release_counts_as_http() {
    let app = spawn_app(AppOptions::default()).await;
    let run = unique_run("http-first");
    app.seed(&standard_invocations(&run)).await;
    assert_eq!(app.cancel(&run).await.status().as_u16(), 202);
    assert_eq!(
        app.stored(&format!("run:{{{run}}}:cancelled"))
            .await
            .as_deref(),
        Some("http"),
        "the marker says who set it"
    );
    let result = json(app.post_release(&run, &release_body(good_draft())).await).await;
    assert_eq!(result["outcome"], "CANCELLED");
    let audit = json(app.get(&format!("/v1/runs/{run}/audit")).await).await;
    assert_eq!(audit["cancelled_by"], "http");
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metric(&metrics, "harness_cancellations_total{source=\"http\"}") >= 1.0);
}
