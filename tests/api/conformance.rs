//! API conformance where the fuzzer (`scripts/api-fuzz.sh`) does not reach: methods a route
//! lacks, and requests that are not well-formed HTTP/1.1, sent over a raw TCP connection.
//! actix-http's codec answers those itself, before any request exists: a bare status with
//! no body, then it closes the connection. They never reach the application (no route, no
//! JSON error, no `harness_http_requests_total`). A well-framed request with a bad body is
//! the application's, and is answered with the JSON error.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::*;

/// What came back on the connection before the server closed it.
struct RawAnswer {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl RawAnswer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name)
                .then(|| value.trim().to_string())
        })
    }
}

/// Sends `request` as raw bytes and reads until the server closes the connection.
async fn exchange(app: &TestApp, request: &[u8]) -> RawAnswer {
    let address = app.address.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).await.expect("connects");
    stream.write_all(request).await.expect("request written");
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    let read_all = async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
                // A reset after the answer (unread request bytes) still ends the answer.
                Err(_) => break,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read_all)
        .await
        .expect("the server answers and closes the connection within 10 s");
    let end = received
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("an HTTP head in {:?}", String::from_utf8_lossy(&received)));
    let head = String::from_utf8_lossy(&received[..end]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status line in {head:?}"));
    RawAnswer {
        status,
        head,
        body: received[end + 4..].to_vec(),
    }
}

fn assert_bare(answer: &RawAnswer, status: u16) {
    assert_eq!(answer.status, status, "{}", answer.head);
    assert_eq!(
        answer.header("content-length").as_deref(),
        Some("0"),
        "{}",
        answer.head
    );
    assert!(answer.body.is_empty(), "no body: {:?}", answer.body);
    assert_eq!(answer.header("content-type"), None, "{}", answer.head);
}

#[actix_rt::test]
async fn a_bad_request_line_is_answered_400_by_the_http_codec_with_no_body() {
    let app = spawn_app(AppOptions::default()).await;
    for line in [
        "NOT AN HTTP REQUEST LINE\r\n\r\n",
        "GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n",
        "GET /hea lthz HTTP/1.1\r\nHost: x\r\n\r\n",
    ] {
        let answer = exchange(&app, line.as_bytes()).await;
        assert_bare(&answer, 400);
    }
}

#[actix_rt::test]
async fn a_duplicate_or_invalid_content_length_is_answered_400_by_the_http_codec_with_no_body() {
    let app = spawn_app(AppOptions::default()).await;
    let body = r#"{"query":"q","stop_reason":"BUDGET_EXHAUSTED"}"#;
    let framings = [
        format!("Content-Length: {0}\r\nContent-Length: {0}\r\n", body.len()),
        format!("Content-Length: {}\r\nContent-Length: 1\r\n", body.len()),
        format!("Content-Length: +{}\r\n", body.len()),
        format!(
            "Content-Length: {}\r\nTransfer-Encoding: chunked\r\n",
            body.len()
        ),
    ];
    for framing in framings {
        let request = format!(
            "POST /v1/runs/r-framing/release HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n{framing}\r\n{body}"
        );
        let answer = exchange(&app, request.as_bytes()).await;
        assert_bare(&answer, 400);
    }
}

#[actix_rt::test]
async fn a_request_head_with_too_many_headers_is_answered_431_by_the_http_codec_with_no_body() {
    let app = spawn_app(AppOptions::default()).await;
    let headers: String = (0..100).map(|i| format!("X-Filler-{i}: x\r\n")).collect();
    let request = format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{headers}\r\n");
    let answer = exchange(&app, request.as_bytes()).await;
    assert_bare(&answer, 431);
}

#[actix_rt::test]
async fn a_request_head_that_stalls_is_answered_408_by_the_http_codec_with_no_body() {
    let app = spawn_app(AppOptions {
        tweak: Box::new(|c| {
            c.server.client_request_timeout_ms = std::num::NonZero::new(300).unwrap()
        }),
        ..Default::default()
    })
    .await;
    let answer = exchange(&app, b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await;
    assert_bare(&answer, 408);
}

#[actix_rt::test]
async fn a_well_framed_request_with_a_bad_body_reaches_the_application_and_is_answered_json() {
    let app = spawn_app(AppOptions::default()).await;
    let body = "{not json";
    let request = format!(
        "POST /v1/runs/r-framing/release HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = exchange(&app, request.as_bytes()).await;
    assert_eq!(answer.status, 400, "{}", answer.head);
    assert_eq!(
        answer.header("content-type").as_deref(),
        Some("application/json")
    );
    let error: serde_json::Value = serde_json::from_slice(&answer.body).expect("a JSON body");
    assert_eq!(error["error"]["code"], "bad_request");
    assert!(error["error"]["message"].is_string());
}

#[actix_rt::test]
async fn every_route_answers_a_method_it_lacks_with_the_json_405_and_allow() {
    let app = spawn_app(AppOptions::default()).await;
    for (method, path, allow) in [
        ("DELETE", "/v1/runs/r-1/release", "GET, POST"),
        ("PUT", "/v1/runs/r-1/audit", "GET"),
        ("GET", "/v1/runs/r-1/cancel", "POST"),
        ("POST", "/metrics", "GET"),
        ("POST", "/healthz", "GET"),
        ("TRACE", "/readyz", "GET"),
        ("PUT", "/openapi.json", "GET"),
    ] {
        let response = app
            .client
            .request(method.parse().unwrap(), app.url(path))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(response.headers()["allow"], allow, "{method} {path}");
        assert_eq!(
            error_code(response, 405).await,
            "method_not_allowed",
            "{method} {path}"
        );
    }
}
