//! The agent's records are untrusted input: a byte that is not UTF-8, a key of the wrong
//! Redis type or an oversized record makes that call unusable (a release outcome with a
//! named rule in the audit), never a 503, never a Redis error, and `/readyz` stays ready.

use redis::AsyncCommands;
use serde_json::json;

use crate::helpers::*;

#[actix_rt::test]
async fn odd_bytes_and_wrong_types_in_records_are_release_outcomes_not_store_errors() {
    let _quiet = STORE_FAULTS.write().await;
    let server = wiremock::MockServer::start().await;
    on_semantic(&server, verdict("SUPPORTED", "the evidence shows it")).await;
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        ..Default::default()
    })
    .await;
    let mut conn = app.redis().await;
    let call_key = |run: &str, call: &str| format!("{}:run:{{{run}}}:call:{call}", app.prefix);
    let before = app.metrics().await;

    // A non-UTF-8 raw_response, which the harness never reads: released as usual.
    let raw = unique_run("raw-bytes");
    app.seed(&standard_invocations(&raw)).await;
    let _: () = conn
        .hset(
            call_key(&raw, "call-log-01"),
            "raw_response",
            vec![0xffu8, 0x00, 0xfe],
        )
        .await
        .unwrap();
    let result = json(app.post_release(&raw, &release_body(good_draft())).await).await;
    assert_eq!(result["outcome"], "SUCCESS");

    // A non-UTF-8 byte in a cited call's agent_result: that call is unusable.
    let bin = unique_run("agent-bytes");
    app.seed(&standard_invocations(&bin)).await;
    let _: () = conn
        .hset(
            call_key(&bin, "call-log-01"),
            "agent_result",
            vec![b'{', 0xc3, b'}'],
        )
        .await
        .unwrap();
    let response = app.post_release(&bin, &release_body(good_draft())).await;
    assert_eq!(response.status().as_u16(), 200);
    let result = json(response).await;
    assert_eq!(result["fallback_type"], "EVIDENCE_VALIDATION_FAILED");
    let audit = json(app.get(&format!("/v1/runs/{bin}/audit")).await).await;
    assert!(
        audit_rules(&audit).contains(&"record_not_utf8".to_string()),
        "{audit}"
    );

    // A cited call stored as a STRING.
    let typed = unique_run("wrong-type");
    app.seed(&standard_invocations(&typed)).await;
    let _: () = conn.del(call_key(&typed, "call-log-01")).await.unwrap();
    let _: () = conn
        .set(call_key(&typed, "call-log-01"), "a string")
        .await
        .unwrap();
    let result = json(app.post_release(&typed, &release_body(good_draft())).await).await;
    assert_eq!(result["fallback_type"], "EVIDENCE_VALIDATION_FAILED");
    let audit = json(app.get(&format!("/v1/runs/{typed}/audit")).await).await;
    assert!(audit_rules(&audit).contains(&"record_wrong_type".to_string()));

    // The calls key as a STRING: every call of the run is unusable; a controlled stop has
    // no facts to show.
    let calls = unique_run("calls-type");
    app.seed(&standard_invocations(&calls)).await;
    let calls_key = format!("{}:run:{{{calls}}}:calls", app.prefix);
    let _: () = conn.del(&calls_key).await.unwrap();
    let _: () = conn.set(&calls_key, "call-log-01").await.unwrap();
    let stop = json!({"query": QUERY, "stop_reason": "INFORMATION_SATURATION"});
    let result = json(app.post_release(&calls, &stop).await).await;
    assert_eq!(result["fallback_type"], "INSUFFICIENT_EVIDENCE");
    assert_eq!(result["observed_facts"], json!([]));
    // The same for a Draft citing calls whose records are fine.
    let judged = unique_run("calls-type-judged");
    app.seed(&standard_invocations(&judged)).await;
    let judged_calls = format!("{}:run:{{{judged}}}:calls", app.prefix);
    let _: () = conn.del(&judged_calls).await.unwrap();
    let _: () = conn.set(&judged_calls, "call-log-01").await.unwrap();
    let result = json(app.post_release(&judged, &release_body(good_draft())).await).await;
    assert_eq!(result["fallback_type"], "EVIDENCE_VALIDATION_FAILED");
    let audit = json(app.get(&format!("/v1/runs/{judged}/audit")).await).await;
    assert!(audit_rules(&audit).contains(&"calls_wrong_type".to_string()));

    assert_eq!(
        app.status("/readyz").await,
        200,
        "the agent's data says nothing about Redis"
    );
    let after = app.metrics().await;
    assert_eq!(
        store_errors(&after),
        store_errors(&before),
        "no Redis error was counted"
    );
    for reason in ["not_utf8", "wrong_type", "calls_wrong_type"] {
        let series = format!("harness_bad_records_total{{reason=\"{reason}\"}}");
        assert!(
            metric(&after, &series) > metric(&before, &series),
            "{series} counted"
        );
    }
}

/// A Draft citing 90,000 ids (900 kB) breaks EvidenceGuard before any of them reaches Redis:
/// EVIDENCE_VALIDATION_FAILED with `too_many_cited_calls`, no model call, and an audit record
/// of a few hundred bytes (before: Redis blocked 389-511 ms and a 9.27 MB audit was stored).
#[actix_rt::test]
async fn a_draft_citing_90000_calls_is_refused_before_redis_with_a_small_audit() {
    let server = wiremock::MockServer::start().await;
    on_semantic(&server, verdict("SUPPORTED", "the evidence shows it")).await;
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        ..Default::default()
    })
    .await;
    let run = unique_run("cites-90000");
    app.seed(&standard_invocations(&run)).await;
    let mut draft = good_draft();
    let ids: Vec<String> = (0..90_000).map(|i| format!("m-{i}")).collect();
    draft["analyses"][0]["tool_call_ids"] = json!(ids);
    let result = json(app.post_release(&run, &release_body(draft)).await).await;
    assert_eq!(result["fallback_type"], "EVIDENCE_VALIDATION_FAILED");
    let response = app.get(&format!("/v1/runs/{run}/audit")).await;
    let text = response.text().await.unwrap();
    assert!(text.len() < 4096, "{} bytes", text.len());
    let audit: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(audit_rules(&audit), vec!["too_many_cited_calls"]);
    assert!(requests(&server).await.is_empty(), "no model call");
}

/// Invisible characters (U+200B, U+00AD, U+2060, U+FEFF) inside a call id or a Redis key in
/// the Draft's text do not hide it: EvidenceGuard's whole-token check reads the text as the
/// judge would be sent it, so the release fails closed and the judge is never asked.
#[actix_rt::test]
async fn invisible_characters_inside_ids_and_keys_do_not_carry_them_to_the_judge() {
    let server = wiremock::MockServer::start().await;
    on_semantic(&server, verdict("SUPPORTED", "the evidence shows it")).await;
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        ..Default::default()
    })
    .await;
    for (i, invisible) in ["\u{200B}", "\u{00AD}", "\u{2060}", "\u{FEFF}"]
        .iter()
        .enumerate()
    {
        for text in [
            format!("See call-log{invisible}-01 for the timeouts."),
            format!("Read {}:{invisible}run:{{r}}:calls first.", app.prefix),
        ] {
            let run = unique_run(&format!("invisible-{i}"));
            app.seed(&standard_invocations(&run)).await;
            let mut draft = good_draft();
            draft["analyses"][0]["text"] = json!(text);
            let result = json(app.post_release(&run, &release_body(draft)).await).await;
            assert_eq!(
                result["fallback_type"], "EVIDENCE_VALIDATION_FAILED",
                "{text:?}"
            );
            let audit = json(app.get(&format!("/v1/runs/{run}/audit")).await).await;
            assert!(
                audit_rules(&audit).contains(&"draft_names_identifier".to_string()),
                "{text:?}: {audit}"
            );
        }
    }
    assert!(
        requests(&server).await.is_empty(),
        "the judge was never asked"
    );
}
