//! Redis stopped and restarted under a running service: 503 with a JSON error on every
//! route that needs it, nothing stored half-way, then recovery by itself, including the
//! cancel subscription.

use std::time::Duration;

use redis::AsyncCommands;

use crate::helpers::*;

async fn wait_ready(app: &TestApp, ready: bool) {
    for _ in 0..200 {
        let status = app
            .client
            .get(app.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        if (status == 200) == ready {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("/readyz never became {}", if ready { "200" } else { "503" });
}

#[actix_rt::test]
async fn redis_down_is_503_everywhere_then_the_service_recovers_by_itself() {
    let _faults = STORE_FAULTS.read().await;
    let port = free_port();
    let redis = OwnRedis::start(port);
    let mut hanging = HangingModel::start();
    let app = spawn_app(AppOptions {
        model: Some(hanging.url.clone()),
        redis_url: Some(redis.url()),
        ..Default::default()
    })
    .await;
    let saturation = serde_json::json!({"query": QUERY, "stop_reason": "INFORMATION_SATURATION"});
    let run = unique_run("before");
    app.seed(&standard_invocations(&run)).await;
    assert_eq!(
        app.post_release(&run, &saturation).await.status().as_u16(),
        200
    );
    wait_ready(&app, true).await;

    let errors_before = store_errors(&app.metrics().await);

    redis.stop();
    let down = unique_run("down");
    assert_eq!(
        error_code(app.post_release(&down, &saturation).await, 503).await,
        "store_unavailable"
    );
    assert_eq!(
        error_code(app.get(&format!("/v1/runs/{run}/release")).await, 503).await,
        "store_unavailable"
    );
    assert_eq!(
        error_code(app.get(&format!("/v1/runs/{run}/audit")).await, 503).await,
        "store_unavailable"
    );
    assert_eq!(
        error_code(app.cancel(&down).await, 503).await,
        "store_unavailable"
    );
    assert_eq!(
        error_code(
            app.client.get(app.url("/readyz")).send().await.unwrap(),
            503
        )
        .await,
        "store_unavailable"
    );
    assert_eq!(
        app.client
            .get(app.url("/healthz"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    let during = app.metrics().await;
    assert!(
        store_errors(&during) >= errors_before + 5.0,
        "every failed Redis operation is counted"
    );

    let redis = OwnRedis::start(port);
    wait_ready(&app, true).await;
    assert!(
        app.stored(&format!("release:{{{down}}}")).await.is_none(),
        "nothing was stored half-way"
    );
    let after = unique_run("after");
    app.seed(&standard_invocations(&after)).await;
    let result = json(app.post_release(&after, &saturation).await).await;
    assert_eq!(result["fallback_type"], "INSUFFICIENT_EVIDENCE");
    assert_eq!(result["observed_facts"].as_array().unwrap().len(), 4);

    // The cancel subscription came back too: a bare PUBLISH aborts a pending release.
    let pending_run = unique_run("resubscribed");
    app.seed(&standard_invocations(&pending_run)).await;
    let pending = {
        let pending = release_in_background(&app.client, &app.address, &pending_run);
        async move {
            pending
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    assert_eq!(
        hanging.next(Duration::from_secs(5)).await,
        Some(Event::Received)
    );
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut delivered = 0;
    for _ in 0..100 {
        delivered = conn
            .publish(format!("{}:cancel", app.prefix), &pending_run)
            .await
            .unwrap();
        if delivered > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        delivered > 0,
        "the CancelListener re-subscribed after the restart"
    );
    let result = tokio::time::timeout(Duration::from_secs(3), pending)
        .await
        .unwrap();
    assert_eq!(result["outcome"], "CANCELLED");
}
