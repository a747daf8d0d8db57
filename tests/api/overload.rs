//! Capacity and overload (issue 31): admission per replica (`server.max_in_flight`), the
//! bounded FIFO model gate (`model.max_concurrent_calls`), a model server's `Retry-After`
//! and the circuit on connection failures. Real Redis, real HTTP model stand-ins.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::helpers::*;

const WAIT: Duration = Duration::from_secs(5);
const REASON: &str = "Every claim in the conclusion is backed by the cited evidence.";

async fn requests_seen(server: &MockServer) -> usize {
    server.received_requests().await.unwrap_or_default().len()
}

/// A Draft whose first analysis cites a call id that does not exist: EvidenceGuard fails
/// and the one repair call is made.
fn draft_needing_repair() -> Value {
    let mut draft = good_draft();
    draft["analyses"][0]["tool_call_ids"] = json!(["call-log-1"]);
    draft
}

#[actix_rt::test]
async fn with_max_in_flight_2_the_third_release_gets_503_overloaded_while_two_complete_and_a_replay_passes(
) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(verdict("SUPPORTED", REASON).set_delay(Duration::from_millis(1500)))
        .mount(&server)
        .await;
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        tweak: Box::new(|c| {
            c.server.max_in_flight = std::num::NonZero::new(2).unwrap();
            c.server.overloaded_retry_after_s = std::num::NonZero::new(3).unwrap();
        }),
        ..Default::default()
    })
    .await;
    // A run released before the replica fills: its replay must pass while it is full.
    let stored = unique_run("overload-stored");
    app.seed(&standard_invocations(&stored)).await;
    let first = app.post_release(&stored, &release_body(good_draft())).await;
    assert_eq!(first.status().as_u16(), 200);
    let stored_result = json(first).await;

    let runs: Vec<String> = (0..3).map(|_| unique_run("overload")).collect();
    for run in &runs {
        app.seed(&standard_invocations(run)).await;
    }
    let admitted: Vec<_> = runs[..2]
        .iter()
        .map(|run| release_in_background(&app.client, &app.address, run))
        .collect();
    let before = requests_seen(&server).await;
    let deadline = Instant::now() + WAIT;
    while requests_seen(&server).await < before + 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(requests_seen(&server).await, before + 2, "both admitted");

    let shed = app
        .post_release(&runs[2], &release_body(good_draft()))
        .await;
    assert_eq!(shed.status().as_u16(), 503);
    assert_eq!(shed.headers()["retry-after"], "3");
    assert_eq!(error_code(shed, 503).await, "overloaded");
    assert!(
        app.stored(&format!("release:{{{}}}:lock", runs[2]))
            .await
            .is_none(),
        "no lock taken for the shed release"
    );

    let replay = app.post_release(&stored, &release_body(good_draft())).await;
    assert_eq!(replay.status().as_u16(), 200, "a stored result passes");
    assert_eq!(json(replay).await, stored_result);
    let audit = app.get(&format!("/v1/runs/{stored}/audit")).await;
    assert_eq!(audit.status().as_u16(), 200, "GET routes are never shed");
    let cancel = app.cancel(&unique_run("overload-cancel")).await;
    assert_eq!(cancel.status().as_u16(), 202, "cancels are never shed");
    let metrics = app.metrics().await;
    assert!(metric(&metrics, "harness_shed_total{reason=\"overloaded\"}") >= 1.0);

    for pending in admitted {
        let response = pending.await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(json(response).await["outcome"], "SUCCESS");
    }
    // The places are given back: the shed run is admitted now.
    let again = app
        .post_release(&runs[2], &release_body(good_draft()))
        .await;
    assert_eq!(again.status().as_u16(), 200);
    assert_eq!(requests_seen(&server).await, before + 3);
}

#[actix_rt::test]
async fn with_one_model_slot_the_model_sees_one_connection_and_a_queued_run_cancels_at_once() {
    let mut hanging = HangingModel::start();
    let app = spawn_app(AppOptions {
        model: Some(hanging.url.clone()),
        tweak: Box::new(|c| {
            c.model.max_concurrent_calls = std::num::NonZero::new(1).unwrap();
            c.semantic_guard.attempt_timeout_ms = std::num::NonZero::new(30_000).unwrap();
            c.semantic_guard.total_timeout_ms = std::num::NonZero::new(30_000).unwrap();
        }),
        ..Default::default()
    })
    .await;
    let (holder, queued) = (unique_run("slot-holder"), unique_run("slot-queued"));
    app.seed(&standard_invocations(&holder)).await;
    app.seed(&standard_invocations(&queued)).await;
    let holding = release_in_background(&app.client, &app.address, &holder);
    assert_eq!(hanging.next(WAIT).await, Some(Event::Received));
    let waiting = release_in_background(&app.client, &app.address, &queued);
    // The queued run is in flight (its attempt waits for the slot), and the model has
    // still one connection.
    let deadline = Instant::now() + WAIT;
    while metric(&app.metrics().await, "harness_runs_in_flight") < 2.0 && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        hanging.next(Duration::from_millis(300)).await,
        None,
        "no second connection while the slot is held"
    );

    assert_eq!(app.cancel(&queued).await.status().as_u16(), 202);
    let answer = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the queued run answers without waiting for the slot")
        .unwrap();
    assert_eq!(json(answer).await["outcome"], "CANCELLED");
    assert_eq!(
        hanging.next(Duration::from_millis(200)).await,
        None,
        "the cancelled run never reached the model"
    );
    let audit = json(app.get(&format!("/v1/runs/{queued}/audit")).await).await;
    assert_eq!(audit["model_attempts"][0]["outcome"], "cancelled");

    assert_eq!(app.cancel(&holder).await.status().as_u16(), 202);
    assert_eq!(json(holding.await.unwrap()).await["outcome"], "CANCELLED");
    hanging
        .expect_closed("the held slot's connection closed")
        .await;
}

#[actix_rt::test]
async fn a_run_whose_total_deadline_passes_in_the_model_queue_falls_back_without_a_request() {
    let server = MockServer::start().await;
    // The repair holds the one slot (its own deadline is long); the judge of another run
    // waits behind it until its total deadline.
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(content(&good_draft().to_string()).set_delay(Duration::from_secs(20)))
        .mount(&server)
        .await;
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        tweak: Box::new(|c| {
            c.model.max_concurrent_calls = std::num::NonZero::new(1).unwrap();
            c.repair.timeout_ms = std::num::NonZero::new(30_000).unwrap();
            c.semantic_guard.attempt_timeout_ms = std::num::NonZero::new(400).unwrap();
            c.semantic_guard.total_timeout_ms = std::num::NonZero::new(400).unwrap();
        }),
        ..Default::default()
    })
    .await;
    let (repairing, judged) = (unique_run("queue-repair"), unique_run("queue-judged"));
    app.seed(&standard_invocations(&repairing)).await;
    app.seed(&standard_invocations(&judged)).await;
    let holding = {
        let (client, url) = (
            app.client.clone(),
            app.url(&format!("/v1/runs/{repairing}/release")),
        );
        tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(TOKEN)
                .json(&release_body(draft_needing_repair()))
                .send()
                .await
        })
    };
    let deadline = Instant::now() + WAIT;
    while requests_seen(&server).await < 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(requests_seen(&server).await, 1, "the repair holds the slot");

    let answer = app.post_release(&judged, &release_body(good_draft())).await;
    let result = json(answer).await;
    assert_eq!(result["outcome"], "FALLBACK");
    assert_eq!(result["fallback_type"], "SEMANTIC_UNAVAILABLE");
    assert_eq!(requests_seen(&server).await, 1, "the judge was never sent");
    let audit = json(app.get(&format!("/v1/runs/{judged}/audit")).await).await;
    let attempts = audit["model_attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{audit}");
    assert_eq!(attempts[0]["outcome"], "timeout");
    assert!(attempts[0]["queued_ms"].as_f64().unwrap() > 0.0);
    assert!(attempts[0]["detail"]
        .as_str()
        .unwrap()
        .contains("waiting for a model slot"));
    assert_eq!(
        audit["budget"]["model_calls"], 0,
        "an unsent call costs no budget"
    );

    assert_eq!(app.cancel(&repairing).await.status().as_u16(), 202);
    let _ = holding.await;
}

/// Answers 429 with `Retry-After: 2` first, then the verdict; records when each came.
struct ComeBackLater {
    seen: Arc<Mutex<Vec<Instant>>>,
}

impl Respond for ComeBackLater {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let mut seen = self.seen.lock().unwrap();
        seen.push(Instant::now());
        match seen.len() {
            1 => ResponseTemplate::new(429)
                .insert_header("Retry-After", "2")
                .set_body_string("slow down"),
            _ => verdict("SUPPORTED", REASON),
        }
    }
}

async fn come_back_later_app(
    total_timeout_ms: u64,
) -> (TestApp, Arc<Mutex<Vec<Instant>>>, MockServer) {
    let server = MockServer::start().await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    Mock::given(method("POST"))
        .and(path("/chat/completions"))
        .respond_with(ComeBackLater { seen: seen.clone() })
        .mount(&server)
        .await;
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        tweak: Box::new(move |c| {
            c.semantic_guard.attempt_timeout_ms = std::num::NonZero::new(2_000).unwrap();
            c.semantic_guard.total_timeout_ms = std::num::NonZero::new(total_timeout_ms).unwrap();
        }),
        ..Default::default()
    })
    .await;
    (app, seen, server)
}

#[actix_rt::test]
async fn a_429_with_retry_after_2_is_honoured_by_the_retry() {
    let (app, seen, _server) = come_back_later_app(10_000).await;
    let run = unique_run("retry-after");
    app.seed(&standard_invocations(&run)).await;
    let result = json(app.post_release(&run, &release_body(good_draft())).await).await;
    assert_eq!(result["outcome"], "SUCCESS");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "one request per attempt");
    assert!(
        seen[1] - seen[0] >= Duration::from_secs(2),
        "the retry came {:?} after the 429",
        seen[1] - seen[0]
    );
    let audit = json(app.get(&format!("/v1/runs/{run}/audit")).await).await;
    assert_eq!(audit["model_attempts"][0]["outcome"], "transport");
    assert!(audit["model_attempts"][1]["queued_ms"].as_f64().unwrap() >= 1000.0);
}

#[actix_rt::test]
async fn a_429_whose_retry_after_is_past_the_total_timeout_fails_the_guard_at_once() {
    let (app, seen, _server) = come_back_later_app(1_000).await;
    let run = unique_run("retry-after-too-late");
    app.seed(&standard_invocations(&run)).await;
    let result = json(app.post_release(&run, &release_body(good_draft())).await).await;
    assert_eq!(result["fallback_type"], "SEMANTIC_UNAVAILABLE");
    assert_eq!(seen.lock().unwrap().len(), 1, "no second request");
    let audit = json(app.get(&format!("/v1/runs/{run}/audit")).await).await;
    let second = &audit["model_attempts"][1];
    assert_eq!(second["outcome"], "transport");
    assert!(
        second["detail"].as_str().unwrap().contains("come back"),
        "{audit}"
    );
    assert!(
        second["queued_ms"].as_f64().unwrap_or(0.0) < 1000.0,
        "refused without waiting: {audit}"
    );
    assert!(
        metric(
            &app.metrics().await,
            "harness_model_gate_refused_total{reason=\"cooldown\"}"
        ) >= 1.0
    );
}

#[actix_rt::test]
async fn connection_failures_in_a_row_open_the_circuit_and_later_attempts_fail_fast() {
    // Nothing listens on this port: every attempt is refused at connect.
    let refused = format!("http://127.0.0.1:{}", free_port());
    let app = spawn_app(AppOptions {
        model: Some(refused),
        tweak: Box::new(|c| {
            c.model.circuit_failures = 2;
            c.model.circuit_open_ms = std::num::NonZero::new(60_000).unwrap();
        }),
        ..Default::default()
    })
    .await;
    let (first, second) = (unique_run("circuit-1"), unique_run("circuit-2"));
    for run in [&first, &second] {
        app.seed(&standard_invocations(run)).await;
        let result = json(app.post_release(run, &release_body(good_draft())).await).await;
        assert_eq!(result["fallback_type"], "SEMANTIC_UNAVAILABLE");
    }
    let audit = json(app.get(&format!("/v1/runs/{first}/audit")).await).await;
    assert_eq!(audit["model_attempts"].as_array().unwrap().len(), 2);
    let audit = json(app.get(&format!("/v1/runs/{second}/audit")).await).await;
    let attempts = audit["model_attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "fails fast, nothing sent: {audit}");
    assert!(attempts[0]["detail"]
        .as_str()
        .unwrap()
        .contains("circuit is open"));
    let metrics = app.metrics().await;
    assert!(metric(&metrics, "harness_model_circuit_opened_total") >= 1.0);
}
