//! What operators rely on: /metrics after releases, /healthz, /readyz, /openapi.json.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wiremock::MockServer;

use crate::helpers::*;

/// A model server over plain HTTP/1.1 keep-alive that answers every judge request with
/// SUPPORTED after `latency`, and counts the connections open now and at most at once
/// (what wiremock does not show).
struct CountingModel {
    url: String,
    open: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl CountingModel {
    async fn start(latency: Duration) -> CountingModel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (open, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let answer = completion(
            &serde_json::json!({"verdict": "SUPPORTED", "reason": "The logs show 132 timeouts for A1."})
                .to_string(),
        )
        .to_string();
        let (o, p) = (open.clone(), peak.clone());
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                let now = o.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(now, Ordering::SeqCst);
                let (o, answer) = (o.clone(), answer.clone());
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 16384];
                    'requests: loop {
                        // One request: its head, then Content-Length bytes of body.
                        let head_end = loop {
                            if let Some(i) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            match socket.read(&mut buf).await {
                                Ok(0) | Err(_) => break 'requests,
                                Ok(n) => seen.extend_from_slice(&buf[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&seen[..head_end]).to_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        while seen.len() < head_end + length {
                            match socket.read(&mut buf).await {
                                Ok(0) | Err(_) => break 'requests,
                                Ok(n) => seen.extend_from_slice(&buf[..n]),
                            }
                        }
                        seen.drain(..head_end + length);
                        tokio::time::sleep(latency).await;
                        let response = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                            answer.len()
                        );
                        if socket.write_all(response.as_bytes()).await.is_err() {
                            break;
                        }
                    }
                    o.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        CountingModel { url, open, peak }
    }
}

/// After a burst of releases that wait on the model together, a worker keeps at most
/// `IDLE_CONNECTIONS` of their model connections open; the others are closed as their calls
/// end, so that neither side holds a socket per call of the burst.
#[actix_rt::test]
async fn after_a_burst_the_idle_model_connections_are_bounded() {
    let model = CountingModel::start(Duration::from_millis(400)).await;
    let app = spawn_app(AppOptions {
        model: Some(model.url.clone()),
        tweak: Box::new(|c| c.server.workers = 1),
        ..Default::default()
    })
    .await;
    let runs: Vec<String> = (0..40).map(|i| unique_run(&format!("idle-{i}"))).collect();
    for run in &runs {
        app.seed(&standard_invocations(run)).await;
    }
    let body = release_body(good_draft());
    let answers =
        futures::future::join_all(runs.iter().map(|run| app.post_release(run, &body))).await;
    for answer in answers {
        assert_eq!(json(answer).await["outcome"], "SUCCESS");
    }
    let peak = model.peak.load(Ordering::SeqCst);
    assert!(
        peak > release_harness::model::client::IDLE_CONNECTIONS,
        "the calls waited together: {peak} connections"
    );
    // The closes reach the model server just after the answers.
    let mut open = model.open.load(Ordering::SeqCst);
    for _ in 0..50 {
        if open <= release_harness::model::client::IDLE_CONNECTIONS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        open = model.open.load(Ordering::SeqCst);
    }
    assert!(
        open <= release_harness::model::client::IDLE_CONNECTIONS,
        "{open} of {peak} model connections are still open after the burst"
    );
}

#[actix_rt::test]
async fn metrics_describe_and_count_releases() {
    let server = MockServer::start().await;
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
    let run = unique_run("metrics");
    app.seed(&standard_invocations(&run)).await;
    assert_eq!(
        json(app.post_release(&run, &release_body(good_draft())).await).await["outcome"],
        "SUCCESS"
    );
    let mut bad = good_draft();
    bad["analyses"][0]["tool_call_ids"] = serde_json::json!(["call-ghost"]);
    let other = unique_run("metrics-bad");
    app.seed(&standard_invocations(&other)).await;
    app.post_release(&other, &release_body(bad)).await;
    let unknown = app.client.get(app.url("/v2/nothing")).send().await.unwrap();
    assert_eq!(unknown.status(), 404);
    let wrong_method = app
        .client
        .delete(app.url(&format!("/v1/runs/{run}/release")))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), 405);

    let response = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = response.text().await.unwrap();
    let value = |needle: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(needle))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no series {needle} in\n{text}"))
    };
    assert!(value("harness_releases_total{outcome=\"SUCCESS\",fallback_type=\"none\"}") >= 1.0);
    assert!(value("harness_releases_total{outcome=\"FALLBACK\",fallback_type=\"EVIDENCE_VALIDATION_FAILED\"}") >= 1.0);
    assert!(value("harness_model_calls_total{role=\"semantic\",result=\"ok\"}") >= 1.0);
    assert!(value("harness_model_tokens_total{role=\"semantic\",kind=\"prompt\"}") >= 1200.0);
    assert!(value("harness_guard_violations_total{rule=\"call_missing\"}") >= 1.0);
    assert!(value("harness_release_duration_seconds_count{outcome=\"SUCCESS\"}") >= 1.0);
    assert!(
        text.contains("harness_release_duration_seconds_bucket{outcome=\"SUCCESS\",le=\"2\"}"),
        "a bucket at the attempt timeout"
    );
    assert!(
        text.contains("harness_release_duration_seconds_bucket{outcome=\"SUCCESS\",le=\"5\"}"),
        "a bucket at the total timeout"
    );
    // Each request is counted under its route's pattern, never under its raw path.
    assert!(
        value("harness_http_requests_total{route=\"/v1/runs/{run_id}/release\",status=\"200\"}")
            >= 2.0
    );
    assert!(
        value("harness_http_requests_total{route=\"/v1/runs/{run_id}/release\",status=\"405\"}")
            >= 1.0
    );
    assert!(value("harness_http_requests_total{route=\"unmatched\",status=\"404\"}") >= 1.0);
    assert!(text.contains("harness_overhead_seconds_bucket"));
    assert!(text.contains("harness_model_call_duration_seconds_bucket{role=\"semantic\""));
    for name in [
        "harness_runs_in_flight",
        "harness_cancellations_total",
        "harness_store_errors_total",
        "harness_ready",
        "harness_http_requests_total",
    ] {
        assert!(
            text.contains(&format!("# HELP {name}")),
            "{name} is described"
        );
    }
    assert!(!text.contains(&run), "no run id in any label");
}

#[actix_rt::test]
async fn health_and_readiness() {
    let app = spawn_app(AppOptions::default()).await;
    assert_eq!(
        json(app.client.get(app.url("/healthz")).send().await.unwrap()).await["status"],
        "ok"
    );
    assert_eq!(
        json(app.client.get(app.url("/readyz")).send().await.unwrap()).await["status"],
        "ready"
    );
}

#[actix_rt::test]
async fn the_openapi_document_lists_every_route_and_status_of_the_contract() {
    let app = spawn_app(AppOptions::default()).await;
    let doc: Value = json(
        app.client
            .get(app.url("/openapi.json"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let expected: [(&str, &str, &[&str]); 7] = [
        (
            "/v1/runs/{run_id}/release",
            "post",
            &["200", "400", "401", "409", "413", "503"],
        ),
        (
            "/v1/runs/{run_id}/release",
            "get",
            &["200", "400", "401", "404", "503"],
        ),
        (
            "/v1/runs/{run_id}/audit",
            "get",
            &["200", "400", "401", "404", "503"],
        ),
        (
            "/v1/runs/{run_id}/cancel",
            "post",
            &["202", "400", "401", "503"],
        ),
        ("/metrics", "get", &["200"]),
        ("/healthz", "get", &["200"]),
        ("/readyz", "get", &["200", "503"]),
    ];
    for (path, method, statuses) in expected {
        let operation = &doc["paths"][path][method];
        assert!(operation.is_object(), "{method} {path} is documented");
        for status in statuses {
            assert!(
                operation["responses"][status].is_object(),
                "{method} {path} documents {status}"
            );
        }
        if path.starts_with("/v1") {
            assert_eq!(
                operation["security"][0]["bearer"],
                serde_json::json!([]),
                "{method} {path} needs the token"
            );
        }
    }
    assert!(
        doc["components"]["schemas"]["ReleaseResultDoc"]["properties"]["verified_sources"]
            .is_object()
    );
}

#[actix_rt::test]
async fn serve_probes_the_model_at_start_up_without_delaying_readiness() {
    let server = MockServer::start().await;
    // A slow model: the probe's answers come 3 s after the service is ready.
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .respond_with(
            verdict("SUPPORTED", "The probe word is not known here.")
                .set_delay(std::time::Duration::from_secs(3)),
        )
        .mount(&server)
        .await;
    let started = std::time::Instant::now();
    let _replica = Replica::start(
        &unique_prefix("probe-on-start"),
        &redis_url(),
        &server.uri(),
        &[("HARNESS__MODEL__PROBE_ON_START", "true")],
    )
    .await;
    assert!(
        started.elapsed() < std::time::Duration::from_millis(2_500),
        "ready after {:?}: the probe delayed readiness",
        started.elapsed()
    );
    let mut probed = false;
    for _ in 0..100 {
        let requests = server.received_requests().await.unwrap_or_default();
        if requests
            .iter()
            .any(|r| String::from_utf8_lossy(&r.body).contains("Your secret probe word is"))
        {
            probed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(probed, "the start-up probe's canary reached the model");
}
