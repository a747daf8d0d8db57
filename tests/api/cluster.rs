//! The store as a Redis Cluster (`redis.cluster_nodes`) and the durability option
//! (`redis.min_replicas_ack`). The tests here run in both API suite runs of
//! `scripts/test.sh`: on the single node and on its 3+3 cluster (`HARNESS_TEST_REDIS_CLUSTER`);
//! the outage test starts a cluster of its own.

use std::time::Duration;

use redis::AsyncCommands;

use crate::helpers::*;

/// Replicas per master of the suite's store: one on its cluster, none on a single node.
fn replicas_per_master() -> u32 {
    if is_cluster(&redis_url()) {
        1
    } else {
        0
    }
}

#[actix_rt::test]
async fn a_commit_too_few_replicas_acknowledge_answers_503_outcome_unknown_and_a_retry_answers_what_is_stored(
) {
    let server = wiremock::MockServer::start().await;
    on_semantic(&server, verdict("SUPPORTED", "the evidence shows it")).await;
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        tweak: Box::new(|c| {
            c.redis.min_replicas_ack = replicas_per_master() + 1;
            c.redis.min_replicas_ack_timeout_ms = 200;
        }),
        ..Default::default()
    })
    .await;
    let run = unique_run("too-few-acks");
    app.seed(&standard_invocations(&run)).await;
    let answer = app.post_release(&run, &release_body(good_draft())).await;
    assert_eq!(error_code(answer, 503).await, "store_outcome_unknown");
    // The master has the result (nothing failed it over): a retry answers it, no new call.
    let stored = app
        .stored(&format!("release:{{{run}}}"))
        .await
        .expect("the result is on the master");
    let retried = app.post_release(&run, &release_body(good_draft())).await;
    assert_eq!(retried.status().as_u16(), 200);
    let retried = json(retried).await;
    assert_eq!(retried["outcome"], "SUCCESS");
    assert_eq!(
        retried,
        serde_json::from_str::<serde_json::Value>(&stored).unwrap()
    );
    assert_eq!(requests(&server).await.len(), 1, "one judge call in all");
    let lock: Option<String> = app
        .redis()
        .await
        .get(format!("{}:release:{{{run}}}:lock", app.prefix))
        .await
        .unwrap();
    assert_eq!(lock, None, "the commit freed the lock");
}

#[actix_rt::test]
async fn a_commit_acknowledged_by_enough_replicas_answers_the_result() {
    let server = wiremock::MockServer::start().await;
    on_semantic(&server, verdict("SUPPORTED", "the evidence shows it")).await;
    let acks = replicas_per_master();
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        tweak: Box::new(move |c| {
            c.redis.min_replicas_ack = acks;
            c.redis.min_replicas_ack_timeout_ms = 500;
        }),
        ..Default::default()
    })
    .await;
    for i in 0..4 {
        let run = unique_run(&format!("acked-{i}"));
        app.seed(&standard_invocations(&run)).await;
        let answer = app.post_release(&run, &release_body(good_draft())).await;
        assert_eq!(answer.status().as_u16(), 200, "run {i}");
        let answer = json(answer).await;
        assert_eq!(answer["outcome"], "SUCCESS");
        let stored = app.stored(&format!("release:{{{run}}}")).await.unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&stored).unwrap(),
            answer
        );
    }
}

/// Many releases in flight at once, whose runs hash to different slots (masters, on the
/// cluster): the one watch tick renews every lease and checks every marker.
#[actix_rt::test]
async fn the_watch_tick_renews_and_checks_runs_in_flight_across_slots() {
    let server = wiremock::MockServer::start().await;
    on_semantic(
        &server,
        verdict("SUPPORTED", "the evidence shows it").set_delay(Duration::from_millis(1_500)),
    )
    .await;
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        tweak: Box::new(|c| {
            // The lease runs out three times over during the judge's answer unless renewed.
            c.redis.lock_lease_ms = std::num::NonZero::new(450).unwrap();
            c.cancel.poll_interval_ms = std::num::NonZero::new(100).unwrap();
        }),
        ..Default::default()
    })
    .await;
    let runs: Vec<String> = (0..8).map(|i| unique_run(&format!("slots-{i}"))).collect();
    for run in &runs {
        app.seed(&standard_invocations(run)).await;
    }
    let pending: Vec<_> = runs
        .iter()
        .map(|run| release_in_background(&app.client, &app.address, run))
        .collect();
    // The last run is cancelled by its marker alone, with no publish.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut conn = app.redis().await;
    let _: () = conn
        .set(format!("{}:run:{{{}}}:cancelled", app.prefix, runs[7]), "1")
        .await
        .unwrap();
    for (i, pending) in pending.into_iter().enumerate() {
        let answer = pending.await.unwrap();
        assert_eq!(answer.status().as_u16(), 200, "run {i}");
        let expected = if i == 7 { "CANCELLED" } else { "SUCCESS" };
        assert_eq!(json(answer).await["outcome"], expected, "run {i}");
    }
}

/// A Redis Cluster owned by the test: three masters with `replicas` replicas each, on
/// loopback ports whose cluster bus ports (+10000) are free too; stopped on drop.
struct OwnCluster {
    ports: Vec<u16>,
    dir: tempfile::TempDir,
    children: Vec<std::process::Child>,
}

fn cluster_port() -> u16 {
    loop {
        let port = 20_000 + (rand_u64() % 25_000) as u16;
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

impl OwnCluster {
    fn start(replicas: usize) -> OwnCluster {
        let dir = tempfile::tempdir().unwrap();
        let mut ports: Vec<u16> = Vec::new();
        while ports.len() < 3 * (1 + replicas) {
            let port = cluster_port();
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        let mut cluster = OwnCluster {
            ports,
            dir,
            children: Vec::new(),
        };
        cluster.start_nodes();
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let created = std::process::Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&nodes)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(created.status.success(), "{created:?}");
        cluster.wait_ok();
        cluster
    }

    fn start_nodes(&mut self) {
        for port in &self.ports {
            let child = std::process::Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args([
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--cluster-enabled",
                    "yes",
                ])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .args(["--dbfilename", &format!("dump-{port}.rdb")])
                .args(["--cluster-node-timeout", "5000"])
                .arg("--dir")
                .arg(self.dir.path())
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("redis-server is installed (scripts/test.sh installs it)");
            self.children.push(child);
        }
        for port in &self.ports {
            let up = (0..100).any(|_| {
                std::thread::sleep(Duration::from_millis(20));
                std::net::TcpStream::connect(("127.0.0.1", *port)).is_ok()
            });
            assert!(up, "cluster node {port} did not start");
        }
    }

    fn wait_ok(&self) {
        for _ in 0..200 {
            let ok = self.ports.iter().all(|port| {
                std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "cluster", "info"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
                    .unwrap_or(false)
            });
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the test's cluster never reached cluster_state:ok");
    }

    fn seeds(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `redis-cli -p PORT ARGS...`, its output.
    fn cli(port: u16, args: &[&str]) -> String {
        std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// A node that is a replica now.
    fn a_replica(&self) -> u16 {
        *self
            .ports
            .iter()
            .find(|p| Self::cli(**p, &["role"]).starts_with("slave"))
            .expect("the cluster has a replica")
    }

    /// Pub/sub connections on each node.
    fn subscribers(&self, port: u16) -> usize {
        Self::cli(port, &["client", "list", "type", "pubsub"])
            .lines()
            .filter(|l| !l.is_empty())
            .count()
    }

    fn kill_9(&mut self, port: u16) {
        let i = self.ports.iter().position(|p| *p == port).unwrap();
        let _ = self.children[i].kill();
        let _ = self.children[i].wait();
    }

    /// SIGTERM to every node: each saves its nodes.conf (its slots) and exits.
    fn stop(&mut self) {
        for child in &mut self.children {
            signal(child.id(), "-TERM");
        }
        for mut child in self.children.drain(..) {
            let _ = child.wait();
        }
    }

    /// The same nodes again, on the same ports, from their nodes.conf (data is gone).
    fn restart(&mut self) {
        self.start_nodes();
        self.wait_ok();
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn wait_ready(app: &TestApp, ready: bool) {
    for _ in 0..300 {
        if (app.status("/readyz").await == 200) == ready {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("/readyz never became {}", if ready { "200" } else { "503" });
}

#[actix_rt::test]
async fn the_cluster_down_is_503_everywhere_then_the_service_recovers_by_itself() {
    let _faults = STORE_FAULTS.read().await;
    let mut cluster = OwnCluster::start(0);
    let server = wiremock::MockServer::start().await;
    on_semantic(&server, verdict("SUPPORTED", "the evidence shows it")).await;
    let app = spawn_app(AppOptions {
        model: Some(server.uri()),
        redis_url: Some(cluster.seeds()),
        ..Default::default()
    })
    .await;
    let run = unique_run("cluster-before");
    app.seed(&standard_invocations(&run)).await;
    let first = app.post_release(&run, &release_body(good_draft())).await;
    assert_eq!(first.status().as_u16(), 200);
    wait_ready(&app, true).await;
    let errors_before = store_errors(&app.metrics().await);

    cluster.stop();
    let down = unique_run("cluster-down");
    assert_eq!(
        error_code(
            app.post_release(&down, &release_body(good_draft())).await,
            503
        )
        .await,
        "store_unavailable"
    );
    assert_eq!(
        error_code(app.get(&format!("/v1/runs/{run}/release")).await, 503).await,
        "store_unavailable"
    );
    assert_eq!(app.cancel(&down).await.status().as_u16(), 503);
    wait_ready(&app, false).await;
    assert!(store_errors(&app.metrics().await) > errors_before);

    cluster.restart();
    wait_ready(&app, true).await;
    let after = unique_run("cluster-after");
    app.seed(&standard_invocations(&after)).await;
    let mut answer = None;
    for _ in 0..50 {
        let response = app.post_release(&after, &release_body(good_draft())).await;
        if response.status().as_u16() == 200 {
            answer = Some(json(response).await);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = answer.expect("releases work again once the cluster is back");
    assert_eq!(answer["outcome"], "SUCCESS");
    let stored = app.stored(&format!("release:{{{after}}}")).await.unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&stored).unwrap(),
        answer
    );
}

#[actix_rt::test]
async fn a_cancel_reaches_the_release_after_the_node_holding_the_subscriptions_is_killed() {
    let mut cluster = OwnCluster::start(1);
    // Replicas subscribe on the first seed that answers: a replica here, killed below (no
    // failover needed, every slot stays served).
    let replica = cluster.a_replica();
    let seeds = std::iter::once(replica)
        .chain(cluster.ports.iter().copied().filter(|p| *p != replica))
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    // No marker poll during the test: only pub/sub, or the marker check after a
    // re-subscription, can bring the cancel.
    let no_poll = || -> Box<dyn FnOnce(&mut release_harness::config::Config)> {
        Box::new(|c| {
            c.cancel.poll_interval_ms = std::num::NonZero::new(60_000).unwrap();
            c.redis.lock_lease_ms = std::num::NonZero::new(180_000).unwrap();
        })
    };
    let mut hanging = HangingModel::start();
    let prefix = unique_prefix("cluster-sub");
    let a = spawn_app(AppOptions {
        model: Some(hanging.url.clone()),
        redis_url: Some(seeds.clone()),
        prefix: Some(prefix.clone()),
        tweak: no_poll(),
    })
    .await;
    let b = spawn_app(AppOptions {
        redis_url: Some(seeds.clone()),
        prefix: Some(prefix.clone()),
        tweak: no_poll(),
        ..Default::default()
    })
    .await;
    for _ in 0..100 {
        if cluster.subscribers(replica) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        cluster.subscribers(replica),
        2,
        "both subscribed on the replica"
    );

    let run = unique_run("cluster-sub");
    a.seed(&standard_invocations(&run)).await;
    let pending = release_in_background(&a.client, &a.address, &run);
    assert_eq!(
        hanging.next(Duration::from_secs(5)).await,
        Some(Event::Received)
    );
    cluster.kill_9(replica);
    let others: Vec<u16> = cluster
        .ports
        .iter()
        .copied()
        .filter(|p| *p != replica)
        .collect();
    for _ in 0..100 {
        if others
            .iter()
            .map(|p| cluster.subscribers(*p))
            .sum::<usize>()
            == 2
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        others
            .iter()
            .map(|p| cluster.subscribers(*p))
            .sum::<usize>(),
        2,
        "both subscribed again on another node"
    );
    assert_eq!(b.cancel(&run).await.status().as_u16(), 202);
    let answer = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("the cancel reached replica A")
        .unwrap();
    assert_eq!(json(answer).await["outcome"], "CANCELLED");
    hanging
        .expect_closed("the pending model call was aborted")
        .await;
}
