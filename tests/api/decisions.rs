//! The operator's view: the decision stream `P:decisions`, `GET /v1/decisions`,
//! `GET /v1/overview`, the audit's `view`, `Server-Timing` and the `/console` page's headers.

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::{json, Value};
use wiremock::MockServer;

use crate::helpers::*;

async fn judged_app(reason: &str) -> (TestApp, MockServer) {
    let server = MockServer::start().await;
    on_semantic(&server, verdict("SUPPORTED", reason)).await;
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        ..Default::default()
    })
    .await;
    (app, server)
}

/// The stream's length, once it has `at_least` entries or 3 s have passed (on a Redis
/// Cluster the entry is appended just after the answer).
async fn stream_len(app: &TestApp, at_least: usize) -> usize {
    let mut conn = app.redis().await;
    let key = format!("{}:decisions", app.prefix);
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let len: usize = conn.xlen(&key).await.unwrap();
        if len >= at_least || std::time::Instant::now() > deadline {
            return len;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn controlled_stop() -> Value {
    json!({"query": QUERY, "stop_reason": "INFORMATION_SATURATION"})
}

#[actix_rt::test]
async fn each_committed_release_appends_one_decision_and_a_replay_none() {
    let (app, _server) = judged_app("Every claim matches the evidence it cites.").await;
    let judged = unique_run("stream-judged");
    let stopped = unique_run("stream-stopped");
    app.seed(&standard_invocations(&judged)).await;
    app.seed(&standard_invocations(&stopped)).await;

    let first = app.post_release(&judged, &release_body(good_draft())).await;
    assert_eq!(first.status().as_u16(), 200);
    assert_eq!(stream_len(&app, 1).await, 1);
    // A replay answers the stored result and appends nothing.
    let again = app.post_release(&judged, &release_body(good_draft())).await;
    assert_eq!(json(again).await["outcome"], "SUCCESS");
    let released = app.post_release(&stopped, &controlled_stop()).await;
    assert_eq!(
        json(released).await["fallback_type"],
        "INSUFFICIENT_EVIDENCE"
    );
    assert_eq!(
        stream_len(&app, 3).await,
        2,
        "one entry per committed release"
    );

    let page = json(app.get("/v1/decisions").await).await;
    let decisions = page["decisions"].as_array().unwrap();
    assert_eq!(decisions.len(), 2);
    assert_eq!(page["next_before"], Value::Null);
    let (newest, oldest) = (&decisions[0], &decisions[1]);
    assert_eq!(newest["run_id"], stopped.as_str(), "newest first");
    assert_eq!(newest["outcome"], "FALLBACK");
    assert_eq!(newest["verdict"], Value::Null);
    assert_eq!(newest["model_attempts"], 0);
    assert_eq!(oldest["run_id"], judged.as_str());
    assert_eq!(oldest["outcome"], "SUCCESS");
    assert_eq!(oldest["fallback_type"], Value::Null);
    assert_eq!(oldest["verdict"], "SUPPORTED");
    assert_eq!(oldest["model_attempts"], 1);
    assert!(oldest["total_ms"].as_f64().unwrap() >= oldest["overhead_ms"].as_f64().unwrap());
    assert!(!oldest["replica"].as_str().unwrap().is_empty());
    assert!(oldest["time"].as_str().unwrap().starts_with("20"));

    // Filters, and paging with the cursor.
    let success = json(app.get("/v1/decisions?outcome=SUCCESS").await).await;
    assert_eq!(success["decisions"].as_array().unwrap().len(), 1);
    assert_eq!(success["decisions"][0]["run_id"], judged.as_str());
    let by_type = json(
        app.get("/v1/decisions?outcome=FALLBACK&fallback_type=INSUFFICIENT_EVIDENCE")
            .await,
    )
    .await;
    assert_eq!(by_type["decisions"][0]["run_id"], stopped.as_str());
    assert_eq!(by_type["decisions"].as_array().unwrap().len(), 1);
    let none = json(
        app.get("/v1/decisions?fallback_type=SEMANTIC_UNAVAILABLE")
            .await,
    )
    .await;
    assert_eq!(none["decisions"], json!([]));
    let one = json(app.get("/v1/decisions?limit=1").await).await;
    assert_eq!(one["decisions"][0]["run_id"], stopped.as_str());
    let cursor = one["next_before"].as_str().unwrap().to_string();
    let next = json(
        app.get(&format!("/v1/decisions?limit=1&before={cursor}"))
            .await,
    )
    .await;
    assert_eq!(next["decisions"][0]["run_id"], judged.as_str());
    let last = next["next_before"].as_str().unwrap().to_string();
    let empty = json(app.get(&format!("/v1/decisions?before={last}")).await).await;
    assert_eq!(empty["decisions"], json!([]));
    assert_eq!(empty["next_before"], Value::Null);

    // The overview counts them.
    let overview = json(app.get("/v1/overview").await).await;
    assert_eq!(
        overview["last_5m"],
        json!({"SUCCESS": 1, "FALLBACK": 1, "CANCELLED": 0})
    );
    assert_eq!(overview["last_60m"]["SUCCESS"], 1);
    assert_eq!(overview["complete"], true);
    assert_eq!(overview["in_flight"], json!([]));
}

#[actix_rt::test]
async fn bad_decision_parameters_are_400_and_the_token_is_required() {
    let app = spawn_app(AppOptions::default()).await;
    for query in [
        "limit=0",
        "limit=201",
        "limit=x",
        "limit=",
        "outcome=success",
        "fallback_type=NONE",
        "before=x",
        "before=1-",
        "before=12345678901234567890-0",
    ] {
        let response = app.get(&format!("/v1/decisions?{query}")).await;
        assert_eq!(error_code(response, 400).await, "bad_request", "{query}");
    }
    for path in ["/v1/decisions", "/v1/overview"] {
        let response = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 401, "{path}");
    }
    // An empty stream is an empty page; before=0-0 has nothing older.
    let page = json(app.get("/v1/decisions?before=0-0&limit=200").await).await;
    assert_eq!(page, json!({"decisions": [], "next_before": null}));
}

#[actix_rt::test]
async fn a_failed_append_is_counted_and_never_fails_the_committed_release() {
    let (app, _server) = judged_app("Every claim matches the evidence it cites.").await;
    // Someone made the stream key a string: XADD fails with WRONGTYPE.
    let mut conn = app.redis().await;
    let _: () = conn
        .set(format!("{}:decisions", app.prefix), "not a stream")
        .await
        .unwrap();
    let run = unique_run("stream-wrongtype");
    app.seed(&standard_invocations(&run)).await;
    let response = app.post_release(&run, &release_body(good_draft())).await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(json(response).await["outcome"], "SUCCESS");
    assert!(app.stored(&format!("release:{{{run}}}")).await.is_some());
    let series = "harness_store_errors_total{op=\"append_decision\"}";
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while metric(&app.metrics().await, series) < 1.0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(metric(&app.metrics().await, series) >= 1.0);
    // Reading a stream that is not one is a store error, not a crash.
    assert_eq!(app.get("/v1/decisions").await.status().as_u16(), 503);
}

#[actix_rt::test]
async fn a_release_answer_says_where_its_time_went() {
    let (app, _server) = judged_app("Every claim matches the evidence it cites.").await;
    let run = unique_run("server-timing");
    app.seed(&standard_invocations(&run)).await;
    for _ in 0..2 {
        // The release, then its replay: both carry the header.
        let response = app.post_release(&run, &release_body(good_draft())).await;
        let timing = response.headers()["server-timing"]
            .to_str()
            .unwrap()
            .to_string();
        let names: Vec<&str> = timing
            .split(", ")
            .map(|metric| {
                let (name, dur) = metric.split_once(";dur=").unwrap();
                assert!(dur.parse::<f64>().unwrap() >= 0.0, "{timing}");
                name
            })
            .collect();
        assert_eq!(names, ["evidence", "repair", "judge", "commit", "harness"]);
    }
}

#[actix_rt::test]
async fn the_audit_view_holds_the_question_the_draft_and_the_verified_evidence() {
    let (app, _server) = judged_app("Every claim matches the evidence it cites.").await;
    let run = unique_run("audit-view");
    app.seed(&standard_invocations(&run)).await;
    let body = json!({"query": "Why <b>now</b>?", "draft": good_draft()});
    assert_eq!(app.post_release(&run, &body).await.status().as_u16(), 200);
    let audit = json(app.get(&format!("/v1/runs/{run}/audit")).await).await;
    let view = &audit["view"];
    assert_eq!(view["query"], "Why <b>now</b>?");
    assert_eq!(view["draft"]["analyses"], good_draft()["analyses"]);
    assert_eq!(view["draft"]["conclusion"], good_draft()["conclusion"]);
    assert_eq!(view["repaired_draft"], Value::Null);
    let analyses = view["evidence"]["analyses"].as_array().unwrap();
    assert_eq!(analyses[0]["analysis_id"], "A1");
    assert!(!analyses[0]["evidence"].as_array().unwrap().is_empty());
    assert_eq!(view["omitted"], json!([]));
    assert!(!audit.to_string().contains("RAW-RESPONSE-CANARY"));
}

#[actix_rt::test]
async fn a_release_in_flight_is_listed_in_the_overview() {
    let mut hanging = HangingModel::start();
    let app = spawn_app(AppOptions {
        model: Some(hanging.url.clone()),
        ..Default::default()
    })
    .await;
    let run = unique_run("overview-in-flight");
    app.seed(&standard_invocations(&run)).await;
    let pending = release_in_background(&app.client, &app.address, &run);
    assert_eq!(
        hanging.next(Duration::from_secs(5)).await,
        Some(Event::Received)
    );
    let overview = json(app.get("/v1/overview").await).await;
    let in_flight = overview["in_flight"].as_array().unwrap();
    assert_eq!(in_flight.len(), 1);
    assert_eq!(in_flight[0]["run_id"], run.as_str());
    assert_eq!(in_flight[0]["lock_held"], true);
    assert_eq!(app.cancel(&run).await.status().as_u16(), 202);
    let answered: Value = pending.await.unwrap().json().await.unwrap();
    assert_eq!(answered["outcome"], "CANCELLED");
    assert_eq!(
        stream_len(&app, 1).await,
        1,
        "a cancelled release is a decision too"
    );
    let page = json(app.get("/v1/decisions?outcome=CANCELLED").await).await;
    assert_eq!(page["decisions"][0]["run_id"], run.as_str());
}

#[actix_rt::test]
async fn the_console_is_served_from_the_binary_with_strict_headers() {
    let app = spawn_app(AppOptions::default()).await;
    for (path, kind) in [
        ("/console", "text/html"),
        ("/console/console.js", "text/javascript"),
        ("/console/console.css", "text/css"),
    ] {
        // No token: the page holds no data; its script asks for the token.
        let response = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200, "{path}");
        let headers = response.headers();
        assert!(headers["content-type"].to_str().unwrap().starts_with(kind));
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self'") && csp.contains("default-src 'none'"));
        assert!(!csp.contains("unsafe"), "{csp}");
        assert_eq!(headers["x-frame-options"], "DENY");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert_eq!(headers["referrer-policy"], "no-referrer");
    }
    let html = app
        .client
        .get(app.url("/console"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // Its one script is a file of the harness: no inline script, no other host.
    assert_eq!(html.matches("<script").count(), 1);
    assert!(html.contains(r#"<script src="/console/console.js" defer></script>"#));
    assert!(!html.contains("http://") && !html.contains("https://"));
    let script = app
        .client
        .get(app.url("/console/console.js"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for unsafe_sink in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
    ] {
        assert!(
            !script.contains(unsafe_sink),
            "the console never uses {unsafe_sink}"
        );
    }
}
