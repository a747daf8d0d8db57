//! The Redis store against a real `redis-server` (started by scripts/test.sh), each test on
//! its own key prefix: the CONTRACT §1 key schema, pipelined record loads, results and
//! audit stored together with a TTL by the fenced commit, the leased in-flight lock, the
//! cancel marker and pub/sub. Where the in-memory store has the same meaning, both are run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{redis_url, unique_prefix};
use redis::AsyncCommands;
use release_harness::config::Config;
use release_harness::domain::audit::{AuditJson, CancelSource};
use release_harness::domain::decision::{Decision, DecisionFilter, Values};
use release_harness::domain::evidence_guard::RunEvidence;
use release_harness::domain::release::{FallbackType, Outcome};
use release_harness::store::{
    Appended, Begin, CancelAnswer, Commit, Committed, DecisionEntry, MemoryStore, Reading,
    RecordLimits, RedisStore, Store, StoreError, Watch, Watched,
};

fn config(prefix: &str) -> Config {
    let mut c = Config::defaults();
    c.redis.url = redis_url();
    c.redis.key_prefix = prefix.to_string();
    c.redis.result_ttl_seconds = std::num::NonZero::new(120).unwrap();
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

/// Writes `record(run, call)` under `P:run:{run}:call:call`, as the agent's tool layer does.
async fn write_record(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    run: &str,
    call: &str,
) {
    let _: () = conn
        .hset_multiple(
            format!("{prefix}:run:{{{run}}}:call:{call}"),
            &record(run, call),
        )
        .await
        .unwrap();
}

/// `SCRIPT FLUSH`: Redis forgets every script, as a restarted or newly promoted master has.
async fn forget_scripts() {
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw().await)
        .await
        .unwrap();
}

#[actix_rt::test]
async fn every_script_is_sent_again_after_redis_forgot_it() {
    let prefix = unique_prefix("noscript");
    let store = Store::Redis(RedisStore::new(&config(&prefix).redis).unwrap());
    let mut conn = raw().await;
    for call in ["c-1", "c-2"] {
        write_record(&mut conn, &prefix, "r-1", call).await;
    }
    forget_scripts().await;
    let reading = Reading {
        cited: &["c-1".into()],
        ..NOTHING_CITED
    };
    let Begin::Taken(mut evidence) = store.begin("r-1", "me/1", LEASE, reading).await.unwrap()
    else {
        panic!("the lock was free");
    };
    assert_eq!(evidence.records["c-1"].get("tool_call_id"), Some("c-1"));
    forget_scripts().await;
    store
        .complete_evidence(&mut evidence, &["c-2".into()], LIMITS)
        .await
        .unwrap();
    assert_eq!(evidence.records["c-2"].get("tool_call_id"), Some("c-2"));
    forget_scripts().await;
    store.unlock("r-1", "me/1").await.unwrap();
    assert!(
        matches!(begin(&store, "r-1", "me/2").await, Begin::Taken(_)),
        "the unlock freed the lock"
    );
    forget_scripts().await;
    assert_eq!(
        store
            .commit("r-1", "me/2", &commit("{\"outcome\":\"SUCCESS\"}"))
            .await
            .unwrap()
            .0,
        Committed::Decided
    );
    assert_eq!(
        store.get_result("r-1").await.unwrap().as_deref(),
        Some("{\"outcome\":\"SUCCESS\"}")
    );
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
        write_record(&mut conn, &prefix, "r-42", call).await;
    }
    // A record of another run with the same call id is not this run's.
    write_record(&mut conn, &prefix, "r-41", "c-3").await;

    let evidence = read_run(
        &store,
        "r-42",
        &["c-9".into(), "c-ghost".into(), " ".into()],
        1000,
        LIMITS,
    )
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
    assert_eq!(evidence.records["c-9"].get("lifecycle"), Some("READY"));

    let recent = read_run(&store, "r-42", &[], 2, LIMITS).await.unwrap();
    assert_eq!(
        recent.calls,
        vec!["c-2", "c-3"],
        "only the most recent max_calls"
    );

    let mut more = recent.clone();
    store
        .complete_evidence(&mut more, &["c-1".into()], LIMITS)
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
    read_run(&store, "r-1", &["c-1".into()], 10, LIMITS)
        .await
        .unwrap();
    let after: BTreeMap<String, String> = conn.hgetall(&key).await.unwrap();
    assert_eq!(before, after);
    let ttl: i64 = conn.ttl(&key).await.unwrap();
    assert_eq!(ttl, -1, "no expiry was set on the agent's record");
}

/// The audit record a test commits: its head and the two ends, as `Audit::commit_json`
/// writes them (the stored record is the head and one end).
static AUDIT: std::sync::LazyLock<AuditJson> = std::sync::LazyLock::new(|| AuditJson {
    head: "{\"run_id\":\"r\",".into(),
    decided: "\"outcome\":\"SUCCESS\"}".into(),
    cancelled: "\"outcome\":\"CANCELLED\",\"cancelled_by\":\"marker\"}".into(),
});

fn commit(result: &str) -> Commit<'_> {
    Commit {
        result,
        cancelled_result: "{\"outcome\":\"CANCELLED\"}",
        audit: &AUDIT,
        decision: None,
    }
}

/// The stores of both kinds, with the same meaning.
fn stores(prefix: &str) -> [Store; 2] {
    [
        Store::Memory(MemoryStore::new()),
        Store::Redis(RedisStore::new(&config(prefix).redis).unwrap()),
    ]
}

const LEASE: Duration = Duration::from_secs(30);

const LIMITS: RecordLimits = RecordLimits {
    max_record_bytes: 262_144,
    max_release_bytes: 4_194_304,
    max_calls_list_bytes: 262_144,
};

/// What a release reads when it cites nothing: the records of its most recent calls.
const NOTHING_CITED: Reading<'static> = Reading {
    cited: &[],
    max_calls: 10,
    limits: LIMITS,
};

/// Begins a release of `run` with `token` for one lease.
async fn begin(store: &Store, run: &str, token: &str) -> Begin {
    store.begin(run, token, LEASE, NOTHING_CITED).await.unwrap()
}

/// The run's evidence as a release reads it while it takes the lock (the begin script,
/// with a reader's token; the lock is freed again).
async fn read_run(
    store: &Store,
    run: &str,
    cited: &[String],
    max_calls: usize,
    limits: RecordLimits,
) -> Result<RunEvidence, StoreError> {
    let reading = Reading {
        cited,
        max_calls,
        limits,
    };
    let begin = store.begin(run, "reader/1", LEASE, reading).await?;
    store.unlock(run, "reader/1").await?;
    match begin {
        Begin::Taken(evidence) => Ok(*evidence),
        other => panic!("the reader did not take the lock: {other:?}"),
    }
}

#[actix_rt::test]
async fn the_fenced_commit_stores_result_and_audit_together_with_a_ttl_and_frees_the_lock() {
    let prefix = unique_prefix("results");
    for store in stores(&prefix) {
        assert_eq!(store.get_result("r-7").await.unwrap(), None);
        assert!(matches!(
            begin(&store, "r-7", "me/1").await,
            Begin::Taken(_)
        ));
        let ok = "{\"outcome\":\"SUCCESS\"}";
        assert_eq!(
            store.commit("r-7", "me/1", &commit(ok)).await.unwrap().0,
            Committed::Decided
        );
        assert_eq!(store.get_result("r-7").await.unwrap().as_deref(), Some(ok));
        assert_eq!(
            store.get_audit("r-7").await.unwrap().as_deref(),
            Some("{\"run_id\":\"r\",\"outcome\":\"SUCCESS\"}")
        );
        assert_eq!(
            begin(&store, "r-7", "other/2").await,
            Begin::Stored(ok.into()),
            "the lock was freed and the stored result answers every later release"
        );
    }
    let mut conn = raw().await;
    let ttl: i64 = conn.ttl(format!("{prefix}:release:{{r-7}}")).await.unwrap();
    assert!((1..=120).contains(&ttl));
    let audit_ttl: i64 = conn
        .ttl(format!("{prefix}:release:{{r-7}}:audit"))
        .await
        .unwrap();
    assert!((1..=120).contains(&audit_ttl));
    let lock: Option<String> = conn
        .get(format!("{prefix}:release:{{r-7}}:lock"))
        .await
        .unwrap();
    assert_eq!(lock, None);
}

#[actix_rt::test]
async fn the_lock_is_a_lease_with_one_holder_that_only_its_holder_renews_or_frees() {
    let prefix = unique_prefix("lock");
    for store in stores(&prefix) {
        assert!(matches!(begin(&store, "r-1", "a/1").await, Begin::Taken(_)));
        assert!(
            matches!(begin(&store, "r-1", "a/1").await, Begin::Taken(_)),
            "the holder may begin again"
        );
        match begin(&store, "r-1", "b/2").await {
            Begin::Locked { token, remaining } => {
                assert_eq!(token, "a/1");
                assert_eq!(release_harness::store::lock_holder(&token), Some("a"));
                assert!(remaining <= LEASE);
            }
            other => panic!("a second holder is refused, got {other:?}"),
        }
        store.unlock("r-1", "b/2").await.unwrap();
        assert!(
            matches!(begin(&store, "r-1", "c/3").await, Begin::Locked { .. }),
            "a stranger cannot free the lock"
        );
        let watched = [
            Watched {
                run_id: "r-1".into(),
                renew: Some("a/1".into()),
            },
            Watched {
                run_id: "r-1".into(),
                renew: Some("b/2".into()),
            },
        ];
        let found = store.watch(&watched, LEASE).await.unwrap();
        assert_eq!(found[0].renewed, Some(true));
        assert_eq!(found[1].renewed, Some(false), "only the holder renews");
        store.unlock("r-1", "a/1").await.unwrap();
        assert!(matches!(begin(&store, "r-1", "d/4").await, Begin::Taken(_)));
    }
    let mut conn = raw().await;
    let pttl: i64 = conn
        .pttl(format!("{prefix}:release:{{r-1}}:lock"))
        .await
        .unwrap();
    assert!(pttl > 0 && pttl <= 30_000, "the lease expires by itself");
}

#[actix_rt::test]
async fn a_release_whose_lock_was_taken_over_or_expired_cannot_store() {
    let prefix = unique_prefix("fence");
    let redis_store = Store::Redis(RedisStore::new(&config(&prefix).redis).unwrap());
    let mut conn = raw().await;
    let lock = format!("{prefix}:release:{{r-2}}:lock");
    // Taken over: the key now holds another token.
    begin(&redis_store, "r-2", "a/1").await;
    let _: () = conn.set(&lock, "b/2").await.unwrap();
    assert_eq!(
        redis_store
            .commit("r-2", "a/1", &commit("{}"))
            .await
            .unwrap()
            .0,
        Committed::LockLost { stored: None }
    );
    assert_eq!(redis_store.get_result("r-2").await.unwrap(), None);
    assert_eq!(redis_store.get_audit("r-2").await.unwrap(), None);
    // The new holder stores; the old one still cannot, and learns what was stored.
    redis_store
        .commit("r-2", "b/2", &commit("{\"by\":\"b\"}"))
        .await
        .unwrap();
    assert_eq!(
        redis_store
            .commit("r-2", "a/1", &commit("{\"by\":\"a\"}"))
            .await
            .unwrap()
            .0,
        Committed::LockLost {
            stored: Some("{\"by\":\"b\"}".into())
        }
    );
    // Expired: a short lease runs out before the commit.
    redis_store
        .begin("r-3", "a/1", Duration::from_millis(50), NOTHING_CITED)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(
        redis_store
            .commit("r-3", "a/1", &commit("{}"))
            .await
            .unwrap()
            .0,
        Committed::LockLost { stored: None }
    );
    assert_eq!(redis_store.get_result("r-3").await.unwrap(), None);
}

#[actix_rt::test]
async fn a_marker_present_at_the_commit_stores_cancelled_instead() {
    let prefix = unique_prefix("commit-cancel");
    for store in stores(&prefix) {
        begin(&store, "r-4", "a/1").await;
        store.cancel("r-4").await.unwrap();
        assert_eq!(
            store
                .commit("r-4", "a/1", &commit("{\"outcome\":\"SUCCESS\"}"))
                .await
                .unwrap()
                .0,
            Committed::Cancelled(CancelSource::Http)
        );
        assert_eq!(
            store.get_result("r-4").await.unwrap().as_deref(),
            Some("{\"outcome\":\"CANCELLED\"}")
        );
        assert_eq!(
            store.get_audit("r-4").await.unwrap().as_deref(),
            Some("{\"run_id\":\"r\",\"outcome\":\"CANCELLED\",\"cancelled_by\":\"http\"}"),
            "the cancel route's marker: the audit says http"
        );
        // A cancel of a run whose result is stored changes nothing.
        assert_eq!(
            store.cancel("r-4").await.unwrap(),
            CancelAnswer::AlreadyStored("{\"outcome\":\"CANCELLED\"}".into())
        );
        // A marker the agent's tool layer set (any other value) is a `marker` cancel.
        match &store {
            Store::Memory(memory) => memory.set_cancel_marker("r-6", "1"),
            Store::Redis(_) => {
                let _: () = raw()
                    .await
                    .set(format!("{prefix}:run:{{r-6}}:cancelled"), "1")
                    .await
                    .unwrap();
            }
        }
        begin(&store, "r-6", "a/1").await;
        assert_eq!(
            store
                .commit("r-6", "a/1", &commit("{\"outcome\":\"SUCCESS\"}"))
                .await
                .unwrap()
                .0,
            Committed::Cancelled(CancelSource::Marker)
        );
        assert_eq!(
            store.get_audit("r-6").await.unwrap().as_deref(),
            Some("{\"run_id\":\"r\",\"outcome\":\"CANCELLED\",\"cancelled_by\":\"marker\"}")
        );
        // A marker set before the release: begin reports it.
        store.cancel("r-5").await.unwrap();
        assert_eq!(begin(&store, "r-5", "a/1").await, Begin::Cancelled);
        let found = store
            .watch(
                &[Watched {
                    run_id: "r-5".into(),
                    renew: None,
                }],
                LEASE,
            )
            .await
            .unwrap();
        assert_eq!(
            found,
            vec![Watch {
                cancelled: true,
                renewed: None
            }]
        );
    }
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
    assert!(read_run(&store, "r-1", &[], 10, LIMITS).await.is_err());
}

#[actix_rt::test]
async fn hostile_records_are_unusable_calls_with_a_rule_never_store_errors() {
    let prefix = unique_prefix("hostile");
    let store = Store::Redis(RedisStore::new(&config(&prefix).redis).unwrap());
    let mut conn = raw().await;
    let key = |call: &str| format!("{prefix}:run:{{r-1}}:call:{call}");
    // c-ok has a non-UTF-8 raw_response, which the harness never reads.
    let mut ok = record("r-1", "c-ok");
    ok.retain(|(k, _)| *k != "raw_response");
    let _: () = conn.hset_multiple(key("c-ok"), &ok).await.unwrap();
    let _: () = conn
        .hset(key("c-ok"), "raw_response", vec![0xffu8, 0xfe, b'x'])
        .await
        .unwrap();
    // c-bin has a non-UTF-8 byte in a field the guard reads.
    let _: () = conn
        .hset_multiple(key("c-bin"), &record("r-1", "c-bin"))
        .await
        .unwrap();
    let _: () = conn
        .hset(key("c-bin"), "agent_result", vec![b'{', 0xc3, b'}'])
        .await
        .unwrap();
    // c-str is a STRING, c-list a LIST.
    let _: () = conn.set(key("c-str"), "not a hash").await.unwrap();
    let _: () = conn.rpush(key("c-list"), "x").await.unwrap();
    // c-big's agent_result is over the record limit.
    let _: () = conn
        .hset_multiple(key("c-big"), &record("r-1", "c-big"))
        .await
        .unwrap();
    let _: () = conn
        .hset(key("c-big"), "agent_result", "x".repeat(300_000))
        .await
        .unwrap();
    let cited: Vec<String> = ["c-ok", "c-bin", "c-str", "c-list", "c-big", "c-none"]
        .map(String::from)
        .to_vec();
    let evidence = read_run(&store, "r-1", &cited, 10, LIMITS).await.unwrap();
    assert!(evidence.records.contains_key("c-ok"));
    // Every field the harness reads arrives, and nothing else (not raw_response).
    let read: Vec<(&str, &str)> = evidence.records["c-ok"].iter().collect();
    assert_eq!(
        read,
        [
            ("run_id", "r-1"),
            ("tool_call_id", "c-ok"),
            ("tool_name", "log_search"),
            ("lifecycle", "READY")
        ]
    );
    let rule = |id: &str| evidence.unreadable[id].rule.as_str();
    assert_eq!(rule("c-bin"), "record_not_utf8");
    assert_eq!(rule("c-str"), "record_wrong_type");
    assert_eq!(rule("c-list"), "record_wrong_type");
    assert_eq!(rule("c-big"), "record_too_large");
    assert!(!evidence.unreadable.contains_key("c-none"));
    let resolved = evidence.resolve(&cited);
    assert_eq!(resolved.rejected["c-bin"].rule.as_str(), "record_not_utf8");
    assert_eq!(resolved.rejected["c-none"].rule.as_str(), "call_missing");
}

#[actix_rt::test]
async fn the_release_budget_bounds_what_is_loaded_cited_records_first() {
    let prefix = unique_prefix("budget");
    let store = Store::Redis(RedisStore::new(&config(&prefix).redis).unwrap());
    let mut conn = raw().await;
    let calls: Vec<String> = (0..10).map(|i| format!("c-{i}")).collect();
    for call in &calls {
        let _: () = conn
            .hset_multiple(
                format!("{prefix}:run:{{r-2}}:call:{call}"),
                &record("r-2", call),
            )
            .await
            .unwrap();
        let _: () = conn
            .hset(
                format!("{prefix}:run:{{r-2}}:call:{call}"),
                "agent_result",
                "y".repeat(1_000),
            )
            .await
            .unwrap();
    }
    let _: () = conn
        .rpush(format!("{prefix}:run:{{r-2}}:calls"), &calls)
        .await
        .unwrap();
    // Room for three records: the cited one, then the two most recent calls.
    let limits = RecordLimits {
        max_record_bytes: 10_000,
        max_release_bytes: 3_200,
        ..LIMITS
    };
    let evidence = read_run(&store, "r-2", &["c-0".into()], 100, limits)
        .await
        .unwrap();
    let mut loaded: Vec<_> = evidence.records.keys().cloned().collect();
    loaded.sort();
    assert_eq!(loaded, vec!["c-0", "c-8", "c-9"]);
    assert_eq!(evidence.unreadable.len(), 7);
    assert!(evidence
        .unreadable
        .values()
        .all(|r| r.rule.as_str() == "record_over_budget"));
    assert!(evidence.loaded_bytes <= 3_200);
}

#[actix_rt::test]
async fn a_calls_key_of_the_wrong_type_makes_every_call_unusable() {
    let prefix = unique_prefix("calls-type");
    let store = Store::Redis(RedisStore::new(&config(&prefix).redis).unwrap());
    let mut conn = raw().await;
    let _: () = conn
        .set(format!("{prefix}:run:{{r-3}}:calls"), "c-1")
        .await
        .unwrap();
    let _: () = conn
        .hset_multiple(
            format!("{prefix}:run:{{r-3}}:call:c-1"),
            &record("r-3", "c-1"),
        )
        .await
        .unwrap();
    let evidence = read_run(&store, "r-3", &["c-1".into()], 10, LIMITS)
        .await
        .unwrap();
    assert!(evidence.calls.is_empty());
    let resolved = evidence.resolve(&["c-1".into()]);
    assert_eq!(resolved.rejected["c-1"].rule.as_str(), "calls_wrong_type");
    // An over-long id in a calls list is left out, not looked up.
    let _: () = conn
        .rpush(
            format!("{prefix}:run:{{r-4}}:calls"),
            &["c-1".to_string(), "z".repeat(10_000)],
        )
        .await
        .unwrap();
    let evidence = read_run(&store, "r-4", &[], 10, LIMITS).await.unwrap();
    assert_eq!(evidence.calls, vec!["c-1"]);
}

#[actix_rt::test]
async fn with_min_replicas_ack_a_flushed_script_is_loaded_again_and_too_few_acks_are_outcome_unknown(
) {
    // The suite's single node has no replica: WAIT 1 answers 0.
    let prefix = unique_prefix("wait");
    let mut c = config(&prefix);
    c.redis.min_replicas_ack = 1;
    c.redis.min_replicas_ack_timeout_ms = 100;
    let store = Store::Redis(RedisStore::new(&c.redis).unwrap());
    let lease = Duration::from_secs(5);
    assert!(matches!(
        store
            .begin("r-wait", "me/1", lease, NOTHING_CITED)
            .await
            .unwrap(),
        Begin::Taken(_)
    ));
    // A node that forgot its scripts (a restarted or promoted master): EVALSHA fails with
    // NOSCRIPT inside the commit+WAIT pipeline, the script is loaded and the pipeline sent again.
    forget_scripts().await;
    let err = store
        .commit("r-wait", "me/1", &commit("{\"outcome\":\"SUCCESS\"}"))
        .await
        .unwrap_err();
    assert_eq!(err.op, "commit");
    assert!(err.outcome_unknown, "{err}");
    assert!(err.message.contains("0 of 1 replicas"), "{err}");
    assert_eq!(
        store.get_result("r-wait").await.unwrap().as_deref(),
        Some("{\"outcome\":\"SUCCESS\"}"),
        "the result is on the master"
    );
    assert_eq!(
        store
            .begin("r-wait", "me/2", lease, NOTHING_CITED)
            .await
            .unwrap(),
        Begin::Stored("{\"outcome\":\"SUCCESS\"}".into()),
        "a retry answers it"
    );
}

/// One entry of a hostile calls list: bytes as the agent's tool layer may push them.
fn hostile_calls() -> Vec<Vec<u8>> {
    let mut calls: Vec<Vec<u8>> = [
        "c-1",
        "c-2",
        "\u{3000}",
        "c\u{a0}",
        " ",
        "",
        "c-1",
        "\u{2028}\u{205f}\t",
        "é-1",
        "c-2",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    calls.push(vec![b'c', 0xff, b'-', b'3']);
    calls.push("€".as_bytes()[..2].to_vec());
    calls.push(vec![0xed, 0xa0, 0x80]); // a surrogate, not UTF-8
    calls.push("x".repeat(257).into_bytes());
    calls.push("é".repeat(128).into_bytes()); // 256 bytes: the longest id
    calls.push("c-4".into());
    calls
}

/// Every id of [`hostile_calls`] that is text gets a record (the over-long one too), and
/// two cited ids have records the list does not name.
#[actix_rt::test]
async fn hostile_calls_lists_give_the_same_evidence_from_redis_and_from_memory() {
    let prefix = unique_prefix("differential");
    let [memory, redis] = stores(&prefix);
    let Store::Memory(ref mem) = memory else {
        unreachable!()
    };
    let mut conn = raw().await;
    let run = "r-diff";
    let calls = hostile_calls();
    let _: () = conn
        .rpush(format!("{prefix}:run:{{{run}}}:calls"), &calls)
        .await
        .unwrap();
    let text: Vec<String> = calls
        .iter()
        .filter_map(|c| String::from_utf8(c.clone()).ok())
        .collect();
    mem.set_calls(run, text.clone());
    let mut with_records: Vec<String> = text.clone();
    with_records.extend(["c-cited".to_string(), "c\u{a0}cited".to_string()]);
    for (i, call) in with_records.iter().enumerate() {
        let mut fields: Vec<(&str, String)> = record(run, call);
        // Sizes differ, so the budget decides which records are read.
        fields.push(("agent_result", "y".repeat(100 * (i + 1))));
        let _: () = conn
            .hset_multiple(format!("{prefix}:run:{{{run}}}:call:{call}"), &fields)
            .await
            .unwrap();
        mem.insert_record(
            run,
            call,
            fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        );
    }
    let cited: Vec<String> = [
        "c-cited",
        " ",
        "\u{3000}",
        "c\u{a0}cited",
        "c-cited",
        "c-4",
        "c-missing",
        &"z".repeat(300),
    ]
    .map(String::from)
    .to_vec();
    for (cited, budget) in [
        (&cited[..], 4_194_304),
        (&[][..], 4_194_304),
        (&cited[..], 2_500),
    ] {
        let limits = RecordLimits {
            max_release_bytes: budget,
            ..LIMITS
        };
        for max_calls in [3, 1000] {
            let from_memory = read_run(&memory, run, cited, max_calls, limits)
                .await
                .unwrap();
            let from_redis = read_run(&redis, run, cited, max_calls, limits)
                .await
                .unwrap();
            assert_eq!(
                from_redis, from_memory,
                "cited {cited:?}, max_calls {max_calls}, budget {budget}"
            );
        }
    }
    // The whole list, as read: only text that can name a record, in list order.
    let all = read_run(&redis, run, &cited, 1000, LIMITS).await.unwrap();
    let over_long = "x".repeat(257);
    let expected: Vec<&str> = text
        .iter()
        .map(String::as_str)
        .filter(|id| !id.is_empty() && *id != over_long)
        .collect();
    assert_eq!(all.calls, expected);
    for blank in ["\u{3000}", " ", "\u{2028}\u{205f}\t"] {
        assert!(!all.records.contains_key(blank), "{blank:?} is blank");
    }
    assert!(all.records.contains_key("c\u{a0}"));
    assert!(all.records.contains_key(&"é".repeat(128)));
    assert!(!all.records.contains_key(&over_long));
}

/// A decision entry's values for `run`, decided with `outcome` and `fallback_type`.
fn entry(run: &str, outcome: Outcome, fallback_type: Option<FallbackType>) -> Values {
    Decision {
        run_id: run,
        outcome,
        fallback_type,
        replica: "h-1",
        time: "2026-12-08T00:00:00Z",
        total_ms: 1.5,
        overhead_ms: 0.5,
        verdict: Some("SUPPORTED"),
        model_attempts: 1,
    }
    .values()
}

#[actix_rt::test]
async fn a_commit_appends_its_stored_result_s_decision_once_in_both_stores() {
    let prefix = unique_prefix("decisions");
    for store in stores(&prefix) {
        let decided = entry("r-d", Outcome::Success, None);
        let with_entry = |result| Commit {
            decision: Some(DecisionEntry {
                max_len: 1000,
                values: &decided,
            }),
            ..commit(result)
        };
        begin(&store, "r-d", "me/1").await;
        let (committed, appended) = store
            .commit("r-d", "me/1", &with_entry("{\"outcome\":\"SUCCESS\"}"))
            .await
            .unwrap();
        assert_eq!((committed, appended), (Committed::Decided, Appended::Done));
        // Stored already: the commit answers it and appends nothing.
        assert!(matches!(
            begin(&store, "r-d", "me/2").await,
            Begin::Stored(_)
        ));
        // A marker at the commit: the CANCELLED entry goes with the CANCELLED result (the
        // decided entry's values with the cancelled fields in place).
        let decided_x = entry(
            "r-x",
            Outcome::Fallback,
            Some(FallbackType::SemanticUnsupported),
        );
        begin(&store, "r-x", "me/1").await;
        store.cancel("r-x").await.unwrap();
        let (committed, _) = store
            .commit(
                "r-x",
                "me/1",
                &Commit {
                    decision: Some(DecisionEntry {
                        max_len: 1000,
                        values: &decided_x,
                    }),
                    ..commit("{}")
                },
            )
            .await
            .unwrap();
        assert_eq!(committed, Committed::Cancelled(CancelSource::Http));
        // Lost: nothing stored, nothing appended.
        let lost = store
            .commit("r-d", "me/1", &with_entry("{}"))
            .await
            .unwrap()
            .0;
        assert!(matches!(lost, Committed::LockLost { .. }));

        let page = store
            .decisions(10, None, DecisionFilter::default())
            .await
            .unwrap();
        let runs: Vec<(&str, &str)> = page
            .decisions
            .iter()
            .map(|d| (d.run_id.as_str(), d.outcome.as_str()))
            .collect();
        assert_eq!(runs, [("r-x", "CANCELLED"), ("r-d", "SUCCESS")]);
        let cancelled = &page.decisions[0];
        assert_eq!(cancelled.fallback_type, None);
        assert_eq!(cancelled.verdict.as_deref(), Some("SUPPORTED"));
        assert_eq!(cancelled.total_ms, Some(1.5));
        let only = DecisionFilter {
            outcome: Some(Outcome::Success),
            fallback_type: None,
        };
        let page = store.decisions(10, None, only).await.unwrap();
        assert_eq!(page.decisions.len(), 1);
        assert_eq!(page.decisions[0].run_id, "r-d");
        let (recent, more) = store.decisions_since(0, 1).await.unwrap();
        assert_eq!((recent.len(), more), (1, true));
    }
}

/// Redis's own clock (SLOWLOG, threshold 5 ms) on the begin and records scripts of
/// releases over the agent's worst data: calls lists of huge ids (10 MB each), of ids just
/// over the id limit, of 900 multibyte ids, 1,000 real records, and cited records that
/// fill the release's byte budget. No script call of these releases may take 5 ms or more
/// (a call is tried up to three times, so that a machine busy elsewhere at that moment does
/// not fail the test: a call that is slow by its work is slow every time).
#[actix_rt::test]
async fn no_script_call_holds_redis_5_ms_whatever_the_agent_wrote() {
    if common::is_cluster(&redis_url()) {
        return;
    }
    let prefix = unique_prefix("slow");
    let store = Store::Redis(RedisStore::new(&config(&prefix).redis).unwrap());
    let mut conn = raw().await;
    let calls = |run: &str| format!("{prefix}:run:{{{run}}}:calls");
    // huge: three ids of 10 MB, then a normal one.
    let huge = "x".repeat(10_000_000);
    for id in [&huge, &huge, &huge, &"c-1".to_string()] {
        let _: () = conn.rpush(calls("huge"), id).await.unwrap();
    }
    // over-long: 900 ids of 257 bytes (under the list limit; each id over the id limit).
    let over_long: Vec<String> = (0..900)
        .map(|i| format!("{i:04}{}", "y".repeat(253)))
        .collect();
    let _: () = conn.rpush(calls("over-long"), &over_long).await.unwrap();
    // multibyte: 900 distinct ids of 256 bytes, every one of them looked up.
    let multibyte: Vec<String> = (0..900)
        .map(|i| format!("{i:04}{}", "é".repeat(126)))
        .collect();
    let _: () = conn.rpush(calls("multibyte"), &multibyte).await.unwrap();
    // records: 1,000 listed calls, each with a 1 kB record.
    let listed: Vec<String> = (0..1000).map(|i| format!("c-{i}")).collect();
    let _: () = conn.rpush(calls("records"), &listed).await.unwrap();
    for id in &listed {
        let mut fields = record("records", id);
        fields.push(("agent_result", "z".repeat(1000)));
        let key = format!("{prefix}:run:{{records}}:call:{id}");
        let _: () = conn.hset_multiple(key, &fields).await.unwrap();
    }
    // cited: 20 cited records of 250 kB, past the 4 MB budget.
    let cited: Vec<String> = (0..20).map(|i| format!("big-{i}")).collect();
    for id in &cited {
        let mut fields = record("cited", id);
        fields.push(("agent_result", "w".repeat(250_000)));
        let key = format!("{prefix}:run:{{cited}}:call:{id}");
        let _: () = conn.hset_multiple(key, &fields).await.unwrap();
    }
    let slowlog = |conn: &mut redis::aio::MultiplexedConnection, args: &[&str]| {
        let mut cmd = redis::cmd("SLOWLOG");
        cmd.arg(args);
        let conn = conn.clone();
        async move {
            let mut conn = conn;
            cmd.query_async::<redis::Value>(&mut conn).await.unwrap()
        }
    };
    let _: () = redis::cmd("CONFIG")
        .arg(&[
            "SET",
            "slowlog-log-slower-than",
            "5000",
            "slowlog-max-len",
            "1024",
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    let mine = |entries: redis::Value| -> Vec<String> {
        // Each entry: id, time, microseconds, arguments, ...; ours name our prefix.
        let redis::Value::Array(entries) = entries else {
            return Vec::new();
        };
        entries
            .into_iter()
            .filter_map(|entry| {
                let redis::Value::Array(parts) = entry else {
                    return None;
                };
                let text = format!("{parts:?}");
                text.contains(&prefix).then_some(text)
            })
            .collect()
    };
    for (run, cited, expect) in [
        ("huge", &[][..], "calls_too_large"),
        ("over-long", &[][..], "none listed"),
        ("multibyte", &[][..], "900 missing"),
        ("records", &[][..], "1000 read"),
        ("cited", &cited[..], "budget"),
    ] {
        let mut slow = Vec::new();
        for _ in 0..3 {
            let _ = slowlog(&mut conn, &["RESET"]).await;
            let evidence = read_run(&store, run, cited, 1000, LIMITS).await.unwrap();
            match expect {
                "calls_too_large" => assert_eq!(
                    evidence.calls_unreadable.as_ref().unwrap().rule.as_str(),
                    "calls_too_large"
                ),
                "none listed" => assert!(evidence.calls.is_empty()),
                "900 missing" => {
                    assert_eq!(evidence.calls.len(), 900);
                    assert!(evidence.records.is_empty());
                }
                "1000 read" => assert_eq!(evidence.records.len(), 1000),
                _ => {
                    assert_eq!(evidence.records.len(), 16, "4 MB / 250 kB");
                    assert_eq!(evidence.unreadable.len(), 4);
                }
            }
            slow = mine(slowlog(&mut conn, &["GET", "1024"]).await);
            if slow.is_empty() {
                break;
            }
        }
        assert!(
            slow.is_empty(),
            "{run}: script calls of 5 ms or more: {slow:?}"
        );
    }
    let _: () = conn.del(calls("huge")).await.unwrap();
}
