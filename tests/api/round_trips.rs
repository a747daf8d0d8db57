//! Redis round trips per release, counted with MONITOR on a Redis of the test's own: a
//! judged release costs two (the begin script, which takes the lock and reads the marker,
//! the calls list and the records, and the fenced commit), a deterministic one too, and a
//! replay one. A regression that adds a
//! trip on the release path fails here.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::*;

/// `redis-cli MONITOR` on `port`, collecting every line it prints.
struct Monitor {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    fn start(port: u16) -> Monitor {
        let mut child = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "monitor"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("redis-cli is installed with redis-server");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Monitor { child, lines }
    }

    /// Waits until MONITOR answered OK (it sees nothing sent before that).
    async fn ready(&self) {
        for _ in 0..200 {
            if self.lines.lock().unwrap().iter().any(|l| l == "OK") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("redis-cli monitor did not start");
    }

    /// Commands clients sent (not those scripts ran inside Redis) that name `run`.
    fn trips_for(&self, run: &str) -> Vec<String> {
        let tag = format!("{{{run}}}");
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(&tag) && !l.contains(" lua]"))
            .cloned()
            .collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Releases `body` for a fresh run seeded with the standard records, on an app over its own
/// Redis, and answers the round trips that named the run and the outcome.
async fn count_trips(app: &TestApp, redis: &OwnRedis, name: &str, body: &Value) -> (usize, Value) {
    let run = unique_run(name);
    seed_records(&redis.url(), &app.prefix, &standard_invocations(&run)).await;
    let monitor = Monitor::start(redis.port);
    monitor.ready().await;
    let response = app.post_release(&run, body).await;
    assert_eq!(response.status().as_u16(), 200);
    let answer = json(response).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let trips = monitor.trips_for(&run);
    (trips.len(), answer)
}

#[actix_rt::test]
async fn a_release_costs_two_redis_round_trips_and_a_replay_one() {
    let server = wiremock::MockServer::start().await;
    on_semantic(&server, verdict("SUPPORTED", "the evidence shows it")).await;
    let redis = OwnRedis::start_any();
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        redis_url: Some(redis.url()),
        // No poll tick during the release: only the release's own trips are counted.
        tweak: Box::new(|c| {
            c.cancel.poll_interval_ms = std::num::NonZero::new(60_000).unwrap();
            c.redis.lock_lease_ms = std::num::NonZero::new(600_000).unwrap();
        }),
        ..Default::default()
    })
    .await;
    // The first release loads the scripts into this Redis (EVALSHA, NOSCRIPT, EVAL).
    let (_, warm) = count_trips(&app, &redis, "trips-warm", &release_body(good_draft())).await;
    assert_eq!(warm["outcome"], "SUCCESS");

    let (judged, answer) =
        count_trips(&app, &redis, "trips-judged", &release_body(good_draft())).await;
    assert_eq!(answer["outcome"], "SUCCESS");
    assert_eq!(
        judged, 2,
        "begin (with the load), commit for a judged release"
    );

    let mut no_conclusion = good_draft();
    no_conclusion["conclusion"] = Value::Null;
    let (deterministic, answer) = count_trips(
        &app,
        &redis,
        "trips-deterministic",
        &release_body(no_conclusion),
    )
    .await;
    assert_eq!(answer["fallback_type"], "INSUFFICIENT_EVIDENCE");
    assert_eq!(
        deterministic, 2,
        "begin (with the load), commit without a model"
    );

    let controlled = json!({"query": "Why?", "stop_reason": "INFORMATION_SATURATION"});
    let (stopped, answer) = count_trips(&app, &redis, "trips-stop", &controlled).await;
    assert_eq!(answer["fallback_type"], "INSUFFICIENT_EVIDENCE");
    assert_eq!(
        stopped, 2,
        "begin (with the load), commit for a controlled stop"
    );

    let run = unique_run("trips-replay");
    seed_records(&redis.url(), &app.prefix, &standard_invocations(&run)).await;
    let first = json(app.post_release(&run, &release_body(good_draft())).await).await;
    let monitor = Monitor::start(redis.port);
    monitor.ready().await;
    let again = json(app.post_release(&run, &release_body(good_draft())).await).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(again, first);
    assert_eq!(
        monitor.trips_for(&run).len(),
        1,
        "a replay is the begin script alone"
    );
}
