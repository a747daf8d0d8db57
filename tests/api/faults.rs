//! Release integrity under real faults (issue: a fenced commit, a leased lock, a cancel that
//! cannot be lost): a replica killed with SIGKILL, Redis paused with SIGSTOP, pub/sub
//! connections cut with CLIENT KILL, a cancel marker set behind the harness's back, and a
//! lock key replaced under a running release.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::Value;

use crate::helpers::*;

fn lock_key(prefix: &str, run: &str) -> String {
    format!("{prefix}:release:{{{run}}}:lock")
}

fn marker_key(prefix: &str, run: &str) -> String {
    format!("{prefix}:run:{{{run}}}:cancelled")
}

/// An app whose model never answers, with a release of a fresh run pending on it.
async fn release_pending_on_a_hanging_model(
    name: &str,
    tweak: Box<dyn FnOnce(&mut release_harness::config::Config)>,
) -> (
    TestApp,
    HangingModel,
    String,
    tokio::task::JoinHandle<reqwest::Response>,
) {
    let mut hanging = HangingModel::start();
    let app = spawn_app(AppOptions {
        model: Some(hanging.url.clone()),
        tweak,
        ..Default::default()
    })
    .await;
    let run = unique_run(name);
    app.seed(&standard_invocations(&run)).await;
    let pending = release_in_background(&app.client, &app.address, &run);
    assert_eq!(
        hanging.next(Duration::from_secs(5)).await,
        Some(Event::Received)
    );
    (app, hanging, run, pending)
}

/// An app whose judge answers SUPPORTED after `delay`, with `tweak` applied.
async fn app_with_a_slow_judge(
    delay: Duration,
    redis_url: Option<String>,
    tweak: Box<dyn FnOnce(&mut release_harness::config::Config)>,
) -> (TestApp, wiremock::MockServer) {
    let server = wiremock::MockServer::start().await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "the evidence shows it").set_delay(delay),
    )
    .await;
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        redis_url,
        tweak,
        ..Default::default()
    })
    .await;
    (app, server)
}

/// Waits until the wiremock model has received a request.
async fn model_called(server: &wiremock::MockServer) {
    for _ in 0..500 {
        if !requests(server).await.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the model was never called");
}

/// Retries a release as a client should: on 409 or 503, after Retry-After (or 200 ms).
async fn retry_until_released(app: &TestApp, run: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let response = app.post_release(run, &release_body(good_draft())).await;
        let status = response.status().as_u16();
        let wait = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_millis(200));
        let body = json(response).await;
        if status == 200 {
            return body;
        }
        assert!([409, 503].contains(&status), "{status} {body}");
        assert!(
            Instant::now() + wait < deadline,
            "not released in time: {body}"
        );
        tokio::time::sleep(wait).await;
    }
}

fn stored_json(stored: Option<String>) -> Option<Value> {
    stored.map(|s| serde_json::from_str(&s).expect("the stored result is JSON"))
}

#[actix_rt::test]
async fn after_kill_9_of_the_replica_holding_a_release_another_replica_releases_within_one_lease() {
    let _faults = STORE_FAULTS.read().await;
    const LEASE_MS: u64 = 2_000;
    let mut hanging = HangingModel::start();
    let server = wiremock::MockServer::start().await;
    on_semantic(&server, verdict("SUPPORTED", "the evidence shows it")).await;
    let prefix = unique_prefix("kill9");
    let lease = LEASE_MS.to_string();
    let mut a = Replica::start(
        &prefix,
        &redis_url(),
        &hanging.url,
        &[
            ("HARNESS__REDIS__LOCK_LEASE_MS", lease.as_str()),
            ("HARNESS__SERVER__REPLICA_NAME", "replica-a"),
        ],
    )
    .await;
    let b = spawn_app(AppOptions {
        model: Some(server.uri()),
        prefix: Some(prefix.clone()),
        tweak: Box::new(|c| c.redis.lock_lease_ms = std::num::NonZero::new(LEASE_MS).unwrap()),
        ..Default::default()
    })
    .await;
    let run = unique_run("kill9");
    b.seed(&standard_invocations(&run)).await;
    let client = reqwest::Client::new();
    let pending = release_in_background(&client, &a.base, &run);
    assert_eq!(
        hanging.next(Duration::from_secs(10)).await,
        Some(Event::Received),
        "replica A holds the release, waiting on the model"
    );
    a.kill_9();
    let killed = Instant::now();
    pending.abort();

    let refused = b.post_release(&run, &release_body(good_draft())).await;
    assert_eq!(refused.status().as_u16(), 409);
    let retry_after: u64 = refused
        .headers()
        .get("retry-after")
        .expect("every 409 carries Retry-After")
        .to_str()
        .unwrap()
        .parse()
        .expect("whole seconds");
    assert!(
        (1..=LEASE_MS / 1000 + 1).contains(&retry_after),
        "{retry_after}"
    );
    let body = json(refused).await;
    assert_eq!(body["error"]["code"], "release_in_flight");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("replica-a"),
        "the 409 names the replica holding the run: {body}"
    );

    let answer = loop {
        let response = b.post_release(&run, &release_body(good_draft())).await;
        if response.status().as_u16() == 200 {
            break json(response).await;
        }
        assert_eq!(response.status().as_u16(), 409);
        assert!(
            killed.elapsed() < Duration::from_millis(LEASE_MS + 1_000),
            "the dead replica's run was not free within one lease + 1 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(killed.elapsed() < Duration::from_millis(LEASE_MS + 1_000));
    assert_eq!(answer["outcome"], "SUCCESS");
    assert_eq!(
        stored_json(b.stored(&format!("release:{{{run}}}")).await),
        Some(answer.clone()),
        "exactly the answered result is stored"
    );
    assert_eq!(requests(&server).await.len(), 1, "one judge call on B");
    // It stays the one result: a replay answers it without a model call.
    assert_eq!(
        json(b.post_release(&run, &release_body(good_draft())).await).await,
        answer
    );
    assert_eq!(requests(&server).await.len(), 1);
}

#[actix_rt::test]
async fn a_cancel_sent_after_client_kill_type_pubsub_is_answered_cancelled_within_1s() {
    let _faults = STORE_FAULTS.read().await;
    let redis = OwnRedis::start_any();
    let mut hanging = HangingModel::start();
    let prefix = unique_prefix("pubsub-cut");
    let a = spawn_app(AppOptions {
        model: Some(hanging.url.clone()),
        redis_url: Some(redis.url()),
        prefix: Some(prefix.clone()),
        ..Default::default()
    })
    .await;
    let b = spawn_app(AppOptions {
        redis_url: Some(redis.url()),
        prefix: Some(prefix.clone()),
        ..Default::default()
    })
    .await;
    let run = unique_run("pubsub-cut");
    a.seed(&standard_invocations(&run)).await;
    let pending = release_in_background(&a.client, &a.address, &run);
    assert_eq!(
        hanging.next(Duration::from_secs(5)).await,
        Some(Event::Received)
    );
    let mut conn = redis.connection().await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(killed >= 2, "both replicas' subscriptions were cut");
    let sent = Instant::now();
    assert_eq!(b.cancel(&run).await.status().as_u16(), 202);
    let answer = tokio::time::timeout(Duration::from_secs(1), pending)
        .await
        .expect("answered within 1 s of the cancel")
        .unwrap();
    assert!(sent.elapsed() < Duration::from_secs(1));
    let answer = json(answer).await;
    assert_eq!(answer["outcome"], "CANCELLED");
    assert_eq!(
        stored_json(a.stored(&format!("release:{{{run}}}")).await),
        Some(answer)
    );
    hanging
        .expect_closed("the pending model call was aborted")
        .await;
}

#[actix_rt::test]
async fn a_marker_set_directly_in_redis_during_a_model_call_is_answered_cancelled_within_1s() {
    let _faults = STORE_FAULTS.read().await;
    let (app, mut hanging, run, pending) =
        release_pending_on_a_hanging_model("direct-marker", Box::new(|_| {})).await;
    // The agent's tool layer sets the marker itself: no publish at all.
    let mut conn = app.redis().await;
    let _: () = conn.set(marker_key(&app.prefix, &run), "1").await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(1), pending)
        .await
        .expect("noticed by the marker poll within 1 s")
        .unwrap();
    assert_eq!(json(answer).await["outcome"], "CANCELLED");
    hanging
        .expect_closed("the pending model call was aborted")
        .await;
    let audit = json(app.get(&format!("/v1/runs/{run}/audit")).await).await;
    assert_eq!(audit["cancelled_by"], "marker");
    assert_eq!(audit["outcome"], "CANCELLED");
}

#[actix_rt::test]
async fn a_model_answer_that_arrives_after_the_marker_is_never_released() {
    let _faults = STORE_FAULTS.read().await;
    // No poll tick during the test: the commit alone must honour the marker.
    let (app, server) = app_with_a_slow_judge(
        Duration::from_millis(600),
        None,
        Box::new(|c| {
            c.cancel.poll_interval_ms = std::num::NonZero::new(60_000).unwrap();
            c.redis.lock_lease_ms = std::num::NonZero::new(180_000).unwrap();
        }),
    )
    .await;
    let run = unique_run("late-answer");
    app.seed(&standard_invocations(&run)).await;
    let pending = release_in_background(&app.client, &app.address, &run);
    model_called(&server).await;
    let mut conn = app.redis().await;
    let _: () = conn.set(marker_key(&app.prefix, &run), "1").await.unwrap();
    let answer = json(pending.await.unwrap()).await;
    assert_eq!(answer["outcome"], "CANCELLED", "the verdict came too late");
    assert_eq!(
        stored_json(app.stored(&format!("release:{{{run}}}")).await),
        Some(answer)
    );
    let audit = json(app.get(&format!("/v1/runs/{run}/audit")).await).await;
    assert_eq!(audit["outcome"], "CANCELLED");
    assert_eq!(audit["cancelled_by"], "marker");
    assert_eq!(audit["superseded"]["outcome"], "SUCCESS");
    assert_eq!(audit["verdict"]["verdict"], "SUPPORTED");
}

#[actix_rt::test]
async fn a_release_whose_lock_was_taken_over_cannot_store() {
    let _faults = STORE_FAULTS.read().await;
    // Renewal is 20 s away: the commit's fence is what stops this release.
    let (app, server) = app_with_a_slow_judge(
        Duration::from_millis(600),
        None,
        Box::new(|c| c.redis.lock_lease_ms = std::num::NonZero::new(60_000).unwrap()),
    )
    .await;
    let run = unique_run("taken-over");
    app.seed(&standard_invocations(&run)).await;
    let pending = release_in_background(&app.client, &app.address, &run);
    model_called(&server).await;
    let mut conn = app.redis().await;
    let _: () = conn
        .set(lock_key(&app.prefix, &run), "intruder/0001")
        .await
        .unwrap();
    let answer = pending.await.unwrap();
    assert_eq!(error_code(answer, 409).await, "lock_lost");
    assert_eq!(app.stored(&format!("release:{{{run}}}")).await, None);
    assert_eq!(app.stored(&format!("release:{{{run}}}:audit")).await, None);
    let lock: Option<String> = conn.get(lock_key(&app.prefix, &run)).await.unwrap();
    assert_eq!(
        lock.as_deref(),
        Some("intruder/0001"),
        "the new holder's lock stands"
    );
    // Once the intruder lets go, a retry releases the run normally.
    let _: () = conn.del(lock_key(&app.prefix, &run)).await.unwrap();
    let retried = json(app.post_release(&run, &release_body(good_draft())).await).await;
    assert_eq!(retried["outcome"], "SUCCESS");
}

#[actix_rt::test]
async fn a_renewal_that_finds_the_lock_gone_aborts_the_release_and_its_model_call() {
    let _faults = STORE_FAULTS.read().await;
    let (app, mut hanging, run, pending) = release_pending_on_a_hanging_model(
        "lease-lost",
        Box::new(|c| c.redis.lock_lease_ms = std::num::NonZero::new(1_500).unwrap()),
    )
    .await;
    let mut conn = app.redis().await;
    let _: () = conn.del(lock_key(&app.prefix, &run)).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(3), pending)
        .await
        .expect("the next renewal notices")
        .unwrap();
    assert_eq!(answer.headers().get("retry-after").unwrap(), "1");
    assert_eq!(error_code(answer, 409).await, "lock_lost");
    hanging
        .expect_closed("the pending model call was aborted")
        .await;
    assert_eq!(app.stored(&format!("release:{{{run}}}")).await, None);
}

#[actix_rt::test]
async fn redis_paused_during_a_release_answers_consistently_with_what_is_stored() {
    let _faults = STORE_FAULTS.read().await;
    let redis = OwnRedis::start_any();
    let (app, server) = app_with_a_slow_judge(
        Duration::from_millis(500),
        Some(redis.url()),
        Box::new(|_| {}),
    )
    .await;
    let run = unique_run("paused");
    app.seed(&standard_invocations(&run)).await;
    let pending = release_in_background(&app.client, &app.address, &run);
    model_called(&server).await;
    redis.pause();
    // The verdict arrives while Redis is stopped: the commit is sent and times out (1 s).
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    redis.resume();
    let answer = pending.await.unwrap();
    let status = answer.status().as_u16();
    let answered = json(answer).await;
    let settled = if status == 200 {
        answered
    } else {
        assert_eq!(status, 503, "{answered}");
        assert_eq!(
            answered["error"]["code"], "store_outcome_unknown",
            "the commit was sent, so its outcome is unknown: {answered}"
        );
        // A retry is safe: it answers what was stored, or releases the run now; while the
        // commit may still land (the lease runs) it answers 409 with Retry-After.
        retry_until_released(&app, &run, Duration::from_secs(10)).await
    };
    assert_eq!(settled["outcome"], "SUCCESS");
    assert_eq!(
        stored_json(app.stored(&format!("release:{{{run}}}")).await),
        Some(settled),
        "the answer is what is stored"
    );
    assert!(app
        .stored(&format!("release:{{{run}}}:audit"))
        .await
        .is_some());
    let mut conn = redis.connection().await;
    let lock: Option<String> = conn.get(lock_key(&app.prefix, &run)).await.unwrap();
    assert_eq!(lock, None, "no lock left behind");
}
