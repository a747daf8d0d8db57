//! The Redis store against a real `redis-server` (started by scripts/test.sh), each test on
//! its own key prefix: the CONTRACT §1 key schema, pipelined record loads, results and
//! audit stored together with a TTL, the in-flight lock, the cancel marker and pub/sub.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{redis_url, unique_prefix};
use redis::AsyncCommands;
use release_harness::config::Config;
use release_harness::store::{RedisStore, Store};

fn config(prefix: &str) -> Config {
    let mut c = Config::defaults();
    c.redis.url = redis_url();
    c.redis.key_prefix = prefix.to_string();
    c.redis.result_ttl_seconds = 120;
    c
}

async fn raw() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn record(run: &str, call: &str) -> Vec<(&'static str, String)> {
    vec![
        ("run_id", run.to_string()),
        ("tool_call_id", call.to_string()),
        ("tool_name", "log_search".to_string()),
        ("lifecycle", "READY".to_string()),
        ("raw_response", "{\"hits\": 132}".to_string()),
    ]
}

#[actix_rt::test]
async fn records_are_read_under_the_contract_keys_in_one_pipeline() {
    let prefix = unique_prefix("records");
    let redis_store = RedisStore::new(&config(&prefix).redis).unwrap();
    let store = Store::Redis(redis_store);
    let mut conn = raw().await;
    let _: () = conn
        .rpush(
            format!("{prefix}:run:{{r-42}}:calls"),
            &["c-1", "c-2", "c-3"],
        )
        .await
        .unwrap();
    for call in ["c-1", "c-2", "c-9"] {
        let _: () = conn
            .hset_multiple(
                format!("{prefix}:run:{{r-42}}:call:{call}"),
                &record("r-42", call),
            )
            .await
            .unwrap();
    }
    // A record of another run with the same call id is not this run's.
    let _: () = conn
        .hset_multiple(
            format!("{prefix}:run:{{r-41}}:call:c-3"),
            &record("r-41", "c-3"),
        )
        .await
        .unwrap();

    let evidence = store
        .load_evidence("r-42", &["c-9".into(), "c-ghost".into(), " ".into()], 1000)
        .await
        .unwrap();
    assert_eq!(evidence.calls, vec!["c-1", "c-2", "c-3"]);
    let mut ids: Vec<_> = evidence.records.keys().cloned().collect();
    ids.sort();
    assert_eq!(
        ids,
        vec!["c-1", "c-2", "c-9"],
        "c-3 has no record under r-42; c-ghost none at all"
    );
    assert_eq!(evidence.records["c-9"]["lifecycle"], "READY");

    let recent = store.load_evidence("r-42", &[], 2).await.unwrap();
    assert_eq!(
        recent.calls,
        vec!["c-2", "c-3"],
        "only the most recent max_calls"
    );

    let mut more = recent.clone();
    store
        .complete_evidence(&mut more, &["c-1".into()])
        .await
        .unwrap();
    assert!(more.records.contains_key("c-1"));
}

#[actix_rt::test]
async fn the_harness_never_writes_the_agents_keys() {
    let prefix = unique_prefix("readonly");
    let store = Store::Redis(RedisStore::new(&config(&prefix).redis).unwrap());
    let mut conn = raw().await;
    let key = format!("{prefix}:run:{{r-1}}:call:c-1");
    let _: () = conn
        .hset_multiple(&key, &record("r-1", "c-1"))
        .await
        .unwrap();
    let before: BTreeMap<String, String> = conn.hgetall(&key).await.unwrap();
    store
        .load_evidence("r-1", &["c-1".into()], 10)
        .await
        .unwrap();
    let after: BTreeMap<String, String> = conn.hgetall(&key).await.unwrap();
    assert_eq!(before, after);
    let ttl: i64 = conn.ttl(&key).await.unwrap();
    assert_eq!(ttl, -1, "no expiry was set on the agent's record");
}

#[actix_rt::test]
async fn results_and_audit_are_stored_together_with_a_ttl() {
    let prefix = unique_prefix("results");
    let store = Store::Redis(RedisStore::new(&config(&prefix).redis).unwrap());
    assert_eq!(store.get_result("r-7").await.unwrap(), None);
    store
        .put_result("r-7", "{\"outcome\":\"SUCCESS\"}", "{\"audit\":true}")
        .await
        .unwrap();
    assert_eq!(
        store.get_result("r-7").await.unwrap().as_deref(),
        Some("{\"outcome\":\"SUCCESS\"}")
    );
    assert_eq!(
        store.get_audit("r-7").await.unwrap().as_deref(),
        Some("{\"audit\":true}")
    );
    let mut conn = raw().await;
    let ttl: i64 = conn.ttl(format!("{prefix}:release:{{r-7}}")).await.unwrap();
    assert!((1..=120).contains(&ttl));
    let audit_ttl: i64 = conn
        .ttl(format!("{prefix}:release:{{r-7}}:audit"))
        .await
        .unwrap();
    assert!((1..=120).contains(&audit_ttl));
    let preflight = store.preflight("r-7").await.unwrap();
    assert!(preflight.stored_result.is_some() && !preflight.cancelled);
}

#[actix_rt::test]
async fn the_in_flight_lock_admits_one_holder_and_frees_only_its_own() {
    let prefix = unique_prefix("lock");
    let store = Store::Redis(RedisStore::new(&config(&prefix).redis).unwrap());
    let ttl = Duration::from_secs(30);
    assert!(store.try_lock("r-1", "token-a", ttl).await.unwrap());
    assert!(
        !store.try_lock("r-1", "token-b", ttl).await.unwrap(),
        "a second holder is refused"
    );
    store.unlock("r-1", "token-b").await.unwrap();
    assert!(
        !store.try_lock("r-1", "token-c", ttl).await.unwrap(),
        "a stranger cannot free the lock"
    );
    store.unlock("r-1", "token-a").await.unwrap();
    assert!(store.try_lock("r-1", "token-d", ttl).await.unwrap());
    let mut conn = raw().await;
    let pttl: i64 = conn
        .pttl(format!("{prefix}:release:{{r-1}}:lock"))
        .await
        .unwrap();
    assert!(pttl > 0 && pttl <= 30_000, "the lock expires by itself");
}

#[actix_rt::test]
async fn cancel_sets_the_marker_and_publishes_the_run_id() {
    let prefix = unique_prefix("cancel");
    let redis_store = RedisStore::new(&config(&prefix).redis).unwrap();
    let mut subscription = redis_store.subscribe_cancels().await.unwrap();
    let store = Store::Redis(redis_store);
    assert!(!store.is_cancelled("r-9").await.unwrap());
    store.cancel("r-9").await.unwrap();
    assert!(store.is_cancelled("r-9").await.unwrap());
    assert!(store.preflight("r-9").await.unwrap().cancelled);
    let published = tokio::time::timeout(Duration::from_secs(2), subscription.next_run_id())
        .await
        .unwrap();
    assert_eq!(published.as_deref(), Some("r-9"));
    let mut conn = raw().await;
    let marker: Option<String> = conn
        .get(format!("{prefix}:run:{{r-9}}:cancelled"))
        .await
        .unwrap();
    assert!(marker.is_some());
}

#[actix_rt::test]
async fn an_unreachable_redis_is_a_typed_error_not_a_hang() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut c = config("unreachable");
    c.redis.url = format!("redis://127.0.0.1:{port}");
    let store = Store::Redis(RedisStore::new(&c.redis).unwrap());
    let err = store.get_result("r-1").await.unwrap_err();
    assert_eq!(err.op, "get_result");
    assert!(store.ping().await.is_err());
    assert!(store.load_evidence("r-1", &[], 10).await.is_err());
}
