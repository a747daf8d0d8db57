//! Graceful shutdown: `/readyz` turns 503 at once, new releases are refused, the release
//! in flight finishes, then the server stops; and the real binary exits 0 on SIGTERM.

use std::time::Duration;

use serde_json::Value;
use wiremock::MockServer;

use crate::helpers::*;

async fn wait_for_model_request(server: &MockServer) {
    for _ in 0..200 {
        if !requests(server).await.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the model was never called");
}

#[actix_rt::test]
async fn graceful_shutdown_lets_the_release_in_flight_finish() {
    let server = MockServer::start().await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence.")
            .set_delay(Duration::from_millis(800)),
    )
    .await;
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        ..Default::default()
    })
    .await;
    let run = unique_run("drain");
    app.seed(&standard_invocations(&run)).await;
    let pending = release_in_background(&app.client, &app.address, &run);
    wait_for_model_request(&server).await;
    let shutdown = app.shutdown.clone();
    let draining = tokio::spawn(async move { shutdown.run().await });
    tokio::time::sleep(Duration::from_millis(50)).await;

    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(error_code(ready, 503).await, "shutting_down");
    let refused = app
        .post_release(&unique_run("late"), &release_body(good_draft()))
        .await;
    assert_eq!(error_code(refused, 503).await, "shutting_down");

    let finished = pending.await.unwrap();
    assert_eq!(finished.status().as_u16(), 200);
    assert_eq!(
        finished.json::<Value>().await.unwrap()["outcome"],
        "SUCCESS"
    );
    draining.await.unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(10), app.stopped)
        .await
        .expect("the server stopped");
    assert!(stopped.unwrap().is_ok());
}

#[actix_rt::test]
async fn shutdown_stops_when_the_drain_time_runs_out() {
    let mut hanging = HangingModel::start();
    let app = spawn_app(AppOptions {
        model: Some(hanging.url.clone()),
        tweak: Box::new(|c| {
            c.server.shutdown_drain_ms = 300;
            c.semantic_guard.attempt_timeout_ms = std::num::NonZero::new(60_000).unwrap();
            c.semantic_guard.total_timeout_ms = std::num::NonZero::new(60_000).unwrap();
        }),
        ..Default::default()
    })
    .await;
    let run = unique_run("drain-over");
    app.seed(&standard_invocations(&run)).await;
    let _pending = release_in_background(&app.client, &app.address, &run);
    assert_eq!(
        hanging.next(Duration::from_secs(5)).await,
        Some(Event::Received)
    );
    // The release would hang for a minute; shutdown gives it the drain time, then stops.
    tokio::time::timeout(Duration::from_secs(10), app.shutdown.run())
        .await
        .expect("drain time respected");
    let stopped = tokio::time::timeout(Duration::from_secs(10), app.stopped)
        .await
        .expect("the server stopped");
    assert!(stopped.unwrap().is_ok());
}

#[actix_rt::test]
async fn the_binary_drains_and_exits_0_on_sigterm() {
    let server = MockServer::start().await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence.")
            .set_delay(Duration::from_millis(800)),
    )
    .await;
    let prefix = unique_prefix("binary");
    let mut replica = Replica::start(&prefix, &redis_url(), &server.uri(), &[]).await;
    let base = replica.base.clone();
    let client = reqwest::Client::new();

    let run = unique_run("sigterm");
    let seeder = TestApp::seeder(&prefix);
    seeder.seed(&standard_invocations(&run)).await;
    let pending = release_in_background(&client, &base, &run);
    wait_for_model_request(&server).await;
    signal(replica.child.id(), "-TERM");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ready = client.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(
        ready.status().as_u16(),
        503,
        "not ready as soon as SIGTERM arrives"
    );

    let finished = pending.await.unwrap();
    assert_eq!(
        finished.status().as_u16(),
        200,
        "the release in flight finished"
    );
    let status = tokio::task::spawn_blocking(move || replica.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

/// SIGTERM, then the exit status within `within` (None: still running; it is killed).
async fn exit_after_sigterm(replica: Replica, within: Duration) -> Option<i32> {
    let mut replica = replica;
    signal(replica.child.id(), "-TERM");
    let waited = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = replica.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None // `replica` is dropped here: killed.
    });
    waited.await.unwrap()
}

#[actix_rt::test]
async fn the_binary_exits_on_sigterm_after_its_log_pipe_closed() {
    let server = MockServer::start().await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence."),
    )
    .await;
    let prefix = unique_prefix("closed-pipe");
    let env = [
        ("RUST_LOG", "info"),
        ("HARNESS__SERVER__SHUTDOWN_DRAIN_MS", "300"),
    ];
    let mut replica = Replica::start_piped(&prefix, &redis_url(), &server.uri(), &env).await;
    // The log reader dies (`serve 2>&1 | head -3`, a crashed shipper).
    drop(replica.child.stderr.take());
    drop(replica.child.stdout.take());
    let client = reqwest::Client::new();
    let run = unique_run("closed-pipe");
    TestApp::seeder(&prefix)
        .seed(&standard_invocations(&run))
        .await;
    // Releases log on a closed pipe: they are answered all the same.
    let answer = release_in_background(&client, &replica.base, &run)
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    // Without the fix the process never exits; 10 s is only the test's patience.
    let code = exit_after_sigterm(replica, Duration::from_secs(10)).await;
    assert_eq!(
        code,
        Some(0),
        "serve exits 0 on SIGTERM with its stderr gone"
    );
}

#[actix_rt::test]
async fn the_binary_answers_and_exits_on_sigterm_while_nobody_reads_its_logs() {
    let server = MockServer::start().await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "Every claim matches the evidence."),
    )
    .await;
    let prefix = unique_prefix("full-pipe");
    // Trace level: a few requests write far more than a pipe holds (64 KiB on Linux), and
    // nobody reads it, so every write to stderr would block.
    let env = [
        ("RUST_LOG", "trace"),
        ("HARNESS__SERVER__SHUTDOWN_DRAIN_MS", "300"),
    ];
    let replica = Replica::start_piped(&prefix, &redis_url(), &server.uri(), &env).await;
    let client = reqwest::Client::new();
    let seeder = TestApp::seeder(&prefix);
    for i in 0..20 {
        let run = unique_run(&format!("full-pipe-{i}"));
        seeder.seed(&standard_invocations(&run)).await;
        // 30 s is only the test's patience: a blocked log write would hold it forever.
        let answer = tokio::time::timeout(
            Duration::from_secs(30),
            release_in_background(&client, &replica.base, &run),
        )
        .await
        .expect("the release is answered while nobody reads the logs")
        .unwrap();
        assert_eq!(answer.status().as_u16(), 200, "release {i} was answered");
    }
    let code = exit_after_sigterm(replica, Duration::from_secs(10)).await;
    assert_eq!(
        code,
        Some(0),
        "serve exits 0 on SIGTERM with its stderr full"
    );
}
