//! Every route of CONTRACT §3 with its bodies, status codes and JSON errors.

use serde_json::{json, Value};
use wiremock::{MockServer, ResponseTemplate};

use crate::helpers::*;

async fn judged_app(answer: ResponseTemplate) -> (TestApp, MockServer) {
    judged_app_with(answer, |_| {}).await
}

/// [`judged_app`] with its configuration changed by `tweak`.
async fn judged_app_with(
    answer: ResponseTemplate,
    tweak: impl FnOnce(&mut release_harness::config::Config) + 'static,
) -> (TestApp, MockServer) {
    let server = MockServer::start().await;
    on_semantic(&server, answer).await;
    on_repair(&server, content(&good_draft().to_string())).await;
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        tweak: Box::new(tweak),
        ..Default::default()
    })
    .await;
    (app, server)
}

#[actix_rt::test]
async fn a_release_answers_200_and_stores_a_json_equal_result() {
    let (app, server) = judged_app(verdict("SUPPORTED", "Every claim matches the evidence.")).await;
    let run = unique_run("api-success");
    app.seed(&standard_invocations(&run)).await;
    let response = app.post_release(&run, &release_body(good_draft())).await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    let body = json(response).await;
    assert_eq!(body["outcome"], "SUCCESS");
    assert_eq!(body.as_object().unwrap().len(), 8);
    let stored: Value =
        serde_json::from_str(&app.stored(&format!("release:{{{run}}}")).await.unwrap()).unwrap();
    assert_eq!(
        stored, body,
        "P:release:{{RUN}} is JSON-equal to the response"
    );
    let fetched = json(app.get(&format!("/v1/runs/{run}/release")).await).await;
    assert_eq!(fetched, body);
    let audit = json(app.get(&format!("/v1/runs/{run}/audit")).await).await;
    assert_eq!(audit["verdict"]["verdict"], "SUPPORTED");
    assert_eq!(audit["model_attempts"].as_array().unwrap().len(), 1);
    assert!(
        !audit.to_string().contains("RAW-RESPONSE-CANARY"),
        "the audit never holds raw responses"
    );

    // Releasing again returns the stored result with no new model call.
    let again = json(
        app.post_release(&run, &release_body(json!("anything else")))
            .await,
    )
    .await;
    assert_eq!(again, body);
    assert_eq!(requests(&server).await.len(), 1);
}

/// With `server.accept_h2c` the API's port also speaks HTTP/2 without TLS (h2c with prior
/// knowledge): releases sent at once over one client connection each answer what HTTP/1.1
/// answers for them.
#[actix_rt::test]
async fn releases_multiplexed_over_h2c_answer_as_over_http1() {
    let (app, server) = judged_app_with(
        verdict("SUPPORTED", "Every claim matches the evidence."),
        |c| c.server.accept_h2c = true,
    )
    .await;
    let runs: Vec<String> = (0..6)
        .map(|i| unique_run(&format!("api-h2c-{i}")))
        .collect();
    for run in &runs {
        app.seed(&standard_invocations(run)).await;
    }
    let h2c = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let sent = runs.iter().map(|run| {
        h2c.post(app.url(&format!("/v1/runs/{run}/release")))
            .bearer_auth(TOKEN)
            .json(&release_body(good_draft()))
            .send()
    });
    let answers = futures::future::join_all(sent).await;
    for (run, answer) in runs.iter().zip(answers) {
        let answer = answer.unwrap();
        assert_eq!(answer.version(), reqwest::Version::HTTP_2);
        assert_eq!(answer.status().as_u16(), 200);
        assert_eq!(answer.headers()["content-type"], "application/json");
        let body = json(answer).await;
        assert_eq!(body["outcome"], "SUCCESS", "{body}");
        let over_http1 = json(app.get(&format!("/v1/runs/{run}/release")).await).await;
        assert_eq!(over_http1, body);
    }
    assert_eq!(
        requests(&server).await.len(),
        runs.len(),
        "one judge call each"
    );
    let unauthorized = h2c
        .post(app.url(&format!("/v1/runs/{}/release", runs[0])))
        .json(&release_body(good_draft()))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status().as_u16(), 401);
}

/// With `server.accept_h2c` the front door is bounded: a connection that sends nothing is
/// closed after `client_request_timeout_ms` (actix-web's own detection waited for ever),
/// HTTP/2 announces `server.h2_max_concurrent_streams`, and a request of 30,000 header names
/// (which panicked h2's decoder under actix-web's 16 MiB header list) is answered 431 on a
/// connection that then serves the next request.
#[actix_rt::test]
async fn the_h2c_front_door_closes_silent_connections_and_bounds_streams_and_headers() {
    use tokio::io::AsyncReadExt;
    let app = spawn_app(AppOptions {
        tweak: Box::new(|c| {
            c.server.accept_h2c = true;
            c.server.client_request_timeout_ms = std::num::NonZero::new(300).unwrap();
            c.server.h2_max_concurrent_streams = std::num::NonZero::new(7).unwrap();
        }),
        ..Default::default()
    })
    .await;
    let address = app.address.trim_start_matches("http://").to_string();
    let mut silent = tokio::net::TcpStream::connect(&address).await.unwrap();
    let mut nothing = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        silent.read_to_end(&mut nothing),
    )
    .await
    .expect("the silent connection is closed")
    .unwrap();

    // 30,000 header fields in one request, written as HPACK does when a name repeats (the
    // first one adds it to the table, each next one is one byte): 30 kB on the wire, 30,000
    // entries once decoded, more than an http HeaderMap holds.
    let mut h2 = RawH2::connect(&address).await;
    assert_eq!(
        h2.settings.get(&3),
        Some(&7),
        "SETTINGS_MAX_CONCURRENT_STREAMS announced"
    );
    let mut block = get_healthz_block();
    block.extend([0x40, 5]);
    block.extend(b"x-h-0");
    block.extend([1, b'1']);
    block.extend(std::iter::repeat_n(0xbe, 29_999));
    h2.send_headers(1, &block).await;
    h2.send_headers(3, &get_healthz_block()).await;
    let answers = h2.answers(&[1, 3]).await;
    // Answered (431, its status written in Huffman form, or the stream reset), not a
    // dropped connection.
    assert!(answers.contains_key(&1), "{answers:?}");
    assert_eq!(
        answers[&3].first(),
        Some(&0x88),
        "the next request is answered 200"
    );

    // 30,000 distinct names (390 kB of header block): the connection is closed
    // (ENHANCE_YOUR_CALM) without a panic, and the next connection is served.
    let mut h2 = RawH2::connect(&address).await;
    let mut block = get_healthz_block();
    for i in 0..30_000 {
        let name = format!("x-h-{i}");
        block.push(0);
        block.push(name.len() as u8);
        block.extend(name.as_bytes());
        block.extend([1, b'1']);
    }
    h2.send_headers(1, &block).await;
    assert!(h2.answers(&[1]).await.is_empty(), "closed");
    let mut h2 = RawH2::connect(&address).await;
    h2.send_headers(1, &get_healthz_block()).await;
    assert_eq!(h2.answers(&[1]).await[&1].first(), Some(&0x88));
}

/// HPACK for `GET http://x/healthz`: :method GET, :scheme http (static entries), :path and
/// :authority (literals with static names).
fn get_healthz_block() -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x04, 8];
    block.extend(b"/healthz");
    block.extend([0x01, 1, b'x']);
    block
}

/// A client that writes HTTP/2 frames by hand (h2's own client cannot build a request of
/// 30,000 fields: its header map holds fewer).
struct RawH2 {
    socket: tokio::net::TcpStream,
    /// The server's first SETTINGS, by identifier.
    settings: std::collections::HashMap<u16, u32>,
}

impl RawH2 {
    async fn connect(address: &str) -> RawH2 {
        use tokio::io::AsyncWriteExt;
        let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
        socket
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        socket.write_all(&frame(4, 0, 0, &[])).await.unwrap();
        let mut raw = RawH2 {
            socket,
            settings: Default::default(),
        };
        let (kind, _, _, payload) = raw.read_frame().await.expect("the server's SETTINGS");
        assert_eq!(kind, 4);
        for setting in payload.chunks(6) {
            let id = u16::from_be_bytes([setting[0], setting[1]]);
            let value = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
            raw.settings.insert(id, value);
        }
        raw.socket.write_all(&frame(4, 1, 0, &[])).await.unwrap();
        raw
    }

    /// One request's header block on `stream`, in frames of 16 kB, with END_STREAM.
    async fn send_headers(&mut self, stream: u32, block: &[u8]) {
        use tokio::io::AsyncWriteExt;
        let parts: Vec<&[u8]> = block.chunks(16_384).collect();
        let mut out = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let last = if i + 1 == parts.len() { 0x4 } else { 0 };
            let (kind, flags) = if i == 0 { (1, 0x1 | last) } else { (9, last) };
            out.extend(frame(kind, flags, stream, part));
        }
        let _ = self.socket.write_all(&out).await;
    }

    /// The first HEADERS payload (or RST_STREAM code) the server sends on each of
    /// `streams`, within 5 s; fewer if the connection closes first.
    async fn answers(&mut self, streams: &[u32]) -> std::collections::HashMap<u32, Vec<u8>> {
        let mut answers = std::collections::HashMap::new();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while answers.len() < streams.len() {
            let read = tokio::time::timeout_at(deadline, self.read_frame()).await;
            let Ok(Some((kind, _, stream, payload))) = read else {
                break;
            };
            if (kind == 1 || kind == 3) && streams.contains(&stream) {
                answers.entry(stream).or_insert(payload);
            }
        }
        answers
    }

    async fn read_frame(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
        use tokio::io::AsyncReadExt;
        let mut head = [0u8; 9];
        self.socket.read_exact(&mut head).await.ok()?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        self.socket.read_exact(&mut payload).await.ok()?;
        Some((head[3], head[4], stream, payload))
    }
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

#[actix_rt::test]
async fn every_outcome_type_over_http() {
    let (app, _server) =
        judged_app(verdict("SUPPORTED", "Every claim matches the evidence.")).await;
    let unsupported_model = MockServer::start().await;
    on_semantic(
        &unsupported_model,
        verdict("UNSUPPORTED", "The conclusion overreaches the evidence."),
    )
    .await;
    let unsupported_app = spawn_app(AppOptions {
        model: Some(unsupported_model.uri()),
        ..Default::default()
    })
    .await;
    let broken_model = MockServer::start().await;
    on_semantic(&broken_model, ResponseTemplate::new(502)).await;
    on_repair(&broken_model, ResponseTemplate::new(502)).await;
    let broken_app = spawn_app(AppOptions {
        model: Some(broken_model.uri()),
        ..Default::default()
    })
    .await;

    let mut fabricated = good_draft();
    fabricated["analyses"][0]["tool_call_ids"] = json!(["call-ghost"]);
    let cases: Vec<(&TestApp, Value, Value, &str, Value)> = vec![
        (
            &app,
            release_body(good_draft()),
            json!("SUCCESS"),
            "success",
            Value::Null,
        ),
        (
            &broken_app,
            release_body(fabricated),
            json!("FALLBACK"),
            "evf",
            json!("EVIDENCE_VALIDATION_FAILED"),
        ),
        (
            &unsupported_app,
            release_body(good_draft()),
            json!("FALLBACK"),
            "unsupported",
            json!("SEMANTIC_UNSUPPORTED"),
        ),
        (
            &broken_app,
            release_body(good_draft()),
            json!("FALLBACK"),
            "unavailable",
            json!("SEMANTIC_UNAVAILABLE"),
        ),
        (
            &app,
            json!({"query": QUERY, "stop_reason": "BUDGET_EXHAUSTED"}),
            json!("FALLBACK"),
            "insufficient",
            json!("INSUFFICIENT_EVIDENCE"),
        ),
    ];
    for (app, body, outcome, name, fallback) in cases {
        let run = unique_run(name);
        app.seed(&standard_invocations(&run)).await;
        let response = app.post_release(&run, &body).await;
        assert_eq!(response.status().as_u16(), 200, "{name}");
        let result = json(response).await;
        assert_eq!(result["outcome"], outcome, "{name}: {result}");
        assert_eq!(result["fallback_type"], fallback, "{name}");
        assert!(
            !result.to_string().contains("call-log-01"),
            "{name}: no tool call id in a result"
        );
    }
    // MISSING_REQUIRED_CONTEXT: nothing was called in this run.
    let run = unique_run("missing");
    let body = release_body(
        json!({"conclusion": null, "analyses": [], "missing_context": ["Which region?"]}),
    );
    let result = json(app.post_release(&run, &body).await).await;
    assert_eq!(result["fallback_type"], "MISSING_REQUIRED_CONTEXT");
    assert_eq!(result["missing_context"], json!(["Which region?"]));
    // CANCELLED: cancelled before the release started.
    let run = unique_run("cancelled");
    assert_eq!(app.cancel(&run).await.status().as_u16(), 202);
    let result = json(app.post_release(&run, &release_body(good_draft())).await).await;
    assert_eq!(result["outcome"], "CANCELLED");
    assert_eq!(result["fallback_type"], Value::Null);
    let stored = app.stored(&format!("release:{{{run}}}")).await.unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&stored).unwrap(),
        result,
        "CANCELLED is stored like any result"
    );
}

#[actix_rt::test]
async fn malformed_bodies_and_run_ids_are_400() {
    let app = spawn_app(AppOptions::default()).await;
    let run = unique_run("bad");
    for (body, expected) in [
        ("{not json", "bad_request"),
        ("[]", "bad_request"),
        (
            r#"{"draft": {"conclusion": null, "analyses": []}}"#,
            "bad_request",
        ),
        (r#"{"query": "  ", "draft": {}}"#, "bad_request"),
        (
            r#"{"query": "q", "draft": {}, "stop_reason": "GAVE_UP"}"#,
            "bad_request",
        ),
        (r#"{"query": "q"}"#, "bad_request"),
        (
            r#"{"query": "q", "draft": {}, "priority": 1}"#,
            "bad_request",
        ),
        (r#"{"query": 42, "draft": {}}"#, "bad_request"),
    ] {
        let response = app
            .client
            .post(app.url(&format!("/v1/runs/{run}/release")))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(error_code(response, 400).await, expected, "{body}");
    }
    for bad_run in ["r%2F42", "r%20x", &"x".repeat(129), "r%7B1%7D", "%FF"] {
        let response = app.post_release(bad_run, &release_body(good_draft())).await;
        assert_eq!(
            error_code(response, 400).await,
            "invalid_run_id",
            "{bad_run}"
        );
        let response = app.get(&format!("/v1/runs/{bad_run}/release")).await;
        assert_eq!(
            error_code(response, 400).await,
            "invalid_run_id",
            "{bad_run}"
        );
    }
    assert!(
        app.stored(&format!("release:{{{run}}}")).await.is_none(),
        "nothing stored"
    );
}

#[actix_rt::test]
async fn the_run_id_is_used_percent_decoded() {
    let app = spawn_app(AppOptions::default()).await;
    let run = unique_run("decoded");
    let encoded = run.replace('-', "%2D");
    let body = json!({"query": QUERY, "stop_reason": "INFORMATION_SATURATION"});
    let result = json(app.post_release(&encoded, &body).await).await;
    assert_eq!(result["run_id"], run);
    assert!(
        app.stored(&format!("release:{{{run}}}")).await.is_some(),
        "stored under the decoded id"
    );
}

#[actix_rt::test]
async fn every_v1_route_needs_the_bearer_token() {
    let app = spawn_app(AppOptions::default()).await;
    let routes = [
        ("POST", "/v1/runs/r-1/release"),
        ("GET", "/v1/runs/r-1/release"),
        ("GET", "/v1/runs/r-1/audit"),
        ("POST", "/v1/runs/r-1/cancel"),
    ];
    for (method, path) in routes {
        for auth in [
            None,
            Some("Bearer wrong-token"),
            Some("Basic dGVzdA=="),
            Some(TOKEN),
        ] {
            let mut request = app
                .client
                .request(method.parse().unwrap(), app.url(path))
                .json(&json!({}));
            if let Some(auth) = auth {
                request = request.header("authorization", auth);
            }
            let response = request.send().await.unwrap();
            assert_eq!(
                error_code(response, 401).await,
                "unauthorized",
                "{method} {path} {auth:?}"
            );
        }
    }
    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(
            app.client
                .get(app.url(open))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16(),
            200,
            "{open}"
        );
    }
}

#[actix_rt::test]
async fn unknown_results_routes_and_methods_are_json_errors() {
    let app = spawn_app(AppOptions::default()).await;
    let run = unique_run("nothing");
    assert_eq!(
        error_code(app.get(&format!("/v1/runs/{run}/release")).await, 404).await,
        "not_found"
    );
    assert_eq!(
        error_code(app.get(&format!("/v1/runs/{run}/audit")).await, 404).await,
        "not_found"
    );
    assert_eq!(
        error_code(app.get("/v1/nothing-here").await, 404).await,
        "not_found"
    );
    let response = app
        .client
        .delete(app.url(&format!("/v1/runs/{run}/release")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(response, 405).await, "method_not_allowed");
    let response = app.get(&format!("/v1/runs/{run}/cancel")).await;
    assert_eq!(error_code(response, 405).await, "method_not_allowed");
}

#[actix_rt::test]
async fn bodies_over_the_limit_are_413_and_change_nothing() {
    let app = spawn_app(AppOptions {
        tweak: Box::new(|c| c.server.max_body_bytes = std::num::NonZero::new(2_048).unwrap()),
        ..Default::default()
    })
    .await;
    let run = unique_run("big");
    let mut draft = good_draft();
    draft["limitations"] = json!(["x".repeat(4_000)]);
    let response = app.post_release(&run, &release_body(draft)).await;
    assert_eq!(error_code(response, 413).await, "payload_too_large");
    // Chunked, with no Content-Length: the limit holds while reading.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..10).map(|_| Ok(vec![b' '; 500])).collect();
    let response = app
        .client
        .post(app.url(&format!("/v1/runs/{run}/release")))
        .bearer_auth(TOKEN)
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(response, 413).await, "payload_too_large");
    assert!(app.stored(&format!("release:{{{run}}}")).await.is_none());
}

/// A connection that sends nothing at all is answered 408 and closed after
/// `client_request_timeout_ms` (HTTP/1.1 only; with `server.accept_h2c` the front door
/// closes it after the same time, see
/// `the_h2c_front_door_closes_silent_connections_and_bounds_streams_and_headers`).
#[actix_rt::test]
async fn a_connection_that_sends_nothing_gets_408_and_is_closed() {
    use tokio::io::AsyncReadExt;
    let app = spawn_app(AppOptions {
        tweak: Box::new(|c| {
            c.server.client_request_timeout_ms = std::num::NonZero::new(300).unwrap()
        }),
        ..Default::default()
    })
    .await;
    let address = app.address.trim_start_matches("http://").to_string();
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        socket.read_to_end(&mut answer),
    )
    .await
    .expect("the silent connection is closed")
    .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
}

#[actix_rt::test]
async fn a_client_that_stalls_its_body_gets_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = spawn_app(AppOptions {
        tweak: Box::new(|c| {
            c.server.client_request_timeout_ms = std::num::NonZero::new(300).unwrap()
        }),
        ..Default::default()
    })
    .await;
    let mut stream = tokio::net::TcpStream::connect(app.address.trim_start_matches("http://"))
        .await
        .unwrap();
    let head = format!(
        "POST /v1/runs/r-slow/release HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"query\""
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
}

#[actix_rt::test]
async fn a_release_in_flight_answers_409() {
    let mut hanging = HangingModel::start();
    let app = spawn_app(AppOptions {
        model: Some(hanging.url.clone()),
        ..Default::default()
    })
    .await;
    let run = unique_run("in-flight");
    app.seed(&standard_invocations(&run)).await;
    let first = release_in_background(&app.client, &app.address, &run);
    assert_eq!(
        hanging.next(std::time::Duration::from_secs(5)).await,
        Some(Event::Received)
    );
    let second = app.post_release(&run, &release_body(good_draft())).await;
    let retry_after: u64 = second.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1, "Retry-After is whole seconds, at least 1");
    assert_eq!(error_code(second, 409).await, "release_in_flight");
    assert_eq!(app.cancel(&run).await.status().as_u16(), 202);
    let first = first.await.unwrap();
    assert_eq!(json(first).await["outcome"], "CANCELLED");
}
