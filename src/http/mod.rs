//! The service: actix-web routes over the actor tree and the Redis store.
//!
//! Entry point: [`Application::build`] binds the configured address (port 0 works: tests
//! read [`Application::port`]) and wires the store, model client, registry and
//! CancelListener; [`Application::run_until_stopped`] serves until SIGTERM/SIGINT or
//! [`Shutdown::run`]: `/readyz` turns 503 at once, in-flight releases get
//! `server.shutdown_drain_ms` to finish, then the server stops.

mod auth;
mod error;
pub mod front_door;
pub mod openapi;
mod routes;

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr};
use actix_service::{IntoServiceFactory, ServiceExt, ServiceFactory};
use actix_web::dev::{AppConfig, Server, ServerHandle, Service, ServiceResponse};
use actix_web::{web, App, HttpServer};
use futures::FutureExt;
use metrics_exporter_prometheus::PrometheusHandle;

pub use error::ApiError;

use crate::actors::cancel_listener::StopListening;
use crate::actors::{Admission, CancelListener, Harness, RunRegistry, Shards};
use crate::config::Config;
use crate::model::ModelGate;
use crate::store::{RedisStore, Store, StoreError};
use crate::telemetry;

/// What every handler shares (each worker its own copy, with its own store connections).
#[derive(Clone)]
pub struct AppState {
    /// Every worker's registry (cancels, shutdown).
    pub shards: Shards,
    pub store: Store,
    pub config: Arc<Config>,
    pub metrics: Option<PrometheusHandle>,
    /// Set when shutdown begins: `/readyz` answers 503 and new releases are refused.
    pub draining: Arc<AtomicBool>,
    /// The replica's admission count: a full replica answers `503 overloaded` at the door.
    pub admission: Admission,
    /// The replica's model gate, whose cooldown gauge is brought up to date per scrape.
    pub gate: Arc<ModelGate>,
    /// This replica's name (the console's runs in flight are this replica's).
    pub replica: Arc<str>,
}

/// What readiness asks of Redis (`/readyz` and the readiness gauge): it answers on the
/// service's shared connection (audits, cancels) and on every worker's own.
async fn redis_answers(store: &Store, shards: &Shards) -> Result<(), StoreError> {
    store.ping().await?;
    shards.ping().await
}

/// The registry shard of the HTTP worker a request arrived on: its release runs there.
pub struct WorkerRegistry(pub Addr<RunRegistry>);

/// Why the service cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("refusing to listen on {0} without server.api_token: set HARNESS__SERVER__API_TOKEN, or listen on a loopback address such as 127.0.0.1")]
    NoTokenOffLoopback(String),
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
    #[error("cannot install the metrics recorder: {0}")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Harness(#[from] crate::actors::HarnessError),
}

/// Starts graceful shutdown; cloned into the signal handler and into tests.
#[derive(Clone)]
pub struct Shutdown {
    draining: Arc<AtomicBool>,
    shards: Shards,
    listener: Addr<CancelListener>,
    server: ServerHandle,
    drain: Duration,
}

impl Shutdown {
    /// Not ready from now on; waits for in-flight releases (at most the drain time), then
    /// stops the server, which lets `run_until_stopped` return.
    pub async fn run(&self) {
        if self.draining.swap(true, Ordering::SeqCst) {
            return;
        }
        telemetry::ready(false);
        let deadline = tokio::time::Instant::now() + self.drain;
        let mut in_flight = self.shards.drain().await;
        tracing::info!(in_flight, "shutting down: draining releases");
        while in_flight > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            in_flight = self.shards.in_flight().await;
        }
        if in_flight > 0 {
            tracing::warn!(
                in_flight,
                "drain time over; stopping with releases in flight"
            );
        }
        self.listener.do_send(StopListening);
        self.server.stop(true).await;
    }
}

pub struct Application {
    port: u16,
    server: Server,
    shutdown: Shutdown,
    /// Keeps `harness_ready` current between probes and runs the exporter's upkeep;
    /// aborted when the server stops.
    readiness: tokio::task::JoinHandle<()>,
}

fn is_loopback(listen: &str) -> bool {
    listen
        .parse::<std::net::SocketAddr>()
        .map(|a| a.ip().is_loopback())
        .unwrap_or(false)
}

/// A path's resource; any method it has no route for (`allow` lists those it has) answers
/// the JSON 405. Without it, actix answers an empty 405 (or, for `App::route`, a 404).
fn resource(path: &str, allow: &'static str) -> actix_web::Resource {
    web::resource(path).default_service(routes::method_not_allowed(allow))
}

/// The route label of the HTTP metric: the matched pattern, never a raw path.
fn route_label(pattern: Option<&str>) -> &'static str {
    match pattern {
        Some("/v1/runs/{run_id}/release") => "/v1/runs/{run_id}/release",
        Some("/v1/runs/{run_id}/audit") => "/v1/runs/{run_id}/audit",
        Some("/v1/runs/{run_id}/cancel") => "/v1/runs/{run_id}/cancel",
        Some("/metrics") => "/metrics",
        Some("/healthz") => "/healthz",
        Some("/readyz") => "/readyz",
        Some("/openapi.json") => "/openapi.json",
        Some("/v1/decisions") => "/v1/decisions",
        Some("/v1/overview") => "/v1/overview",
        Some("/console") => "/console",
        Some("/console/console.js") => "/console/console.js",
        Some("/console/console.css") => "/console/console.css",
        _ => "unmatched",
    }
}

impl Application {
    /// Binds, wires and returns the service, not yet serving.
    pub async fn build(config: Config) -> Result<Application, StartError> {
        // A blank token is no token (config validation refuses one with whitespace around it).
        if config.server.api_token.trim().is_empty() && !is_loopback(&config.server.listen) {
            return Err(StartError::NoTokenOffLoopback(config.server.listen.clone()));
        }
        let metrics = telemetry::install_metrics(&config)?;
        let redis = RedisStore::new(&config.redis)?;
        let store = Store::Redis(redis.clone());
        let harness = Harness::new(config.clone(), store.clone())?;
        let config = harness.config.clone();
        let shards = Shards::default();
        let listener = CancelListener::new(redis, shards.clone()).start();
        let draining = Arc::new(AtomicBool::new(false));

        let bind_error = |source| StartError::Bind {
            address: config.server.listen.clone(),
            source,
        };
        let tcp = TcpListener::bind(&config.server.listen).map_err(bind_error)?;
        let port = tcp.local_addr().map_err(bind_error)?.port();
        // What every worker's handlers share, each worker with its own store (below).
        let state = AppState {
            shards: shards.clone(),
            store: store.clone(),
            config: config.clone(),
            metrics: Some(metrics.clone()),
            draining: draining.clone(),
            admission: harness.admission.clone(),
            gate: harness.gate.clone(),
            replica: harness.replica.clone(),
        };
        let worker_shards = shards.clone();
        let ready_gate = harness.gate.clone();
        let make_app = move || {
            // Called once on each worker's thread: the worker's own registry shard, with
            // Redis connections and a model client of its own.
            let worker = harness.for_worker().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "a worker shares the first connections");
                harness.clone()
            });
            // The handlers read Redis (a full replica's door, the GET routes, cancels) on
            // the worker's connections too: on the first worker's, every read of another
            // worker went to that thread and back (two wake-ups, four system calls more for
            // each shed release; issue 31).
            let worker_state = web::Data::new(AppState {
                store: worker.store.clone(),
                ..state.clone()
            });
            let registry = RunRegistry::new(worker).start();
            worker_shards.add(registry.clone());
            App::new()
                .app_data(worker_state)
                .app_data(web::Data::new(WorkerRegistry(registry)))
                .wrap_fn(|request, service| {
                    service.call(request).map(|response| {
                        if let Ok(r) = &response {
                            // Read once routed: the matched resource's pattern is then
                            // found by its index, not by matching the path again (a regex
                            // per request before routing).
                            let route = route_label(r.request().match_pattern().as_deref());
                            telemetry::http_request(route, r.status().as_u16());
                        }
                        response
                    })
                })
                .service(
                    resource("/v1/runs/{run_id}/release", "GET, POST")
                        .route(web::post().to(routes::release))
                        .route(web::get().to(routes::get_release)),
                )
                .service(
                    resource("/v1/runs/{run_id}/audit", "GET")
                        .route(web::get().to(routes::get_audit)),
                )
                .service(
                    resource("/v1/runs/{run_id}/cancel", "POST")
                        .route(web::post().to(routes::cancel)),
                )
                .service(resource("/v1/decisions", "GET").route(web::get().to(routes::decisions)))
                .service(resource("/v1/overview", "GET").route(web::get().to(routes::overview)))
                .service(resource("/console", "GET").route(web::get().to(routes::console_page)))
                .service(
                    resource("/console/console.js", "GET")
                        .route(web::get().to(routes::console_script)),
                )
                .service(
                    resource("/console/console.css", "GET")
                        .route(web::get().to(routes::console_style)),
                )
                .service(resource("/metrics", "GET").route(web::get().to(routes::metrics)))
                .service(resource("/healthz", "GET").route(web::get().to(routes::healthz)))
                .service(resource("/readyz", "GET").route(web::get().to(routes::readyz)))
                .service(resource("/openapi.json", "GET").route(web::get().to(routes::openapi)))
                .default_service(web::to(routes::not_found))
        };
        let bind_error = |source| StartError::Bind {
            address: config.server.listen.clone(),
            source,
        };
        let shutdown_timeout = config.server.shutdown_drain_ms.div_ceil(1000).max(1);
        let server = if config.server.accept_h2c {
            // HTTP/2 without TLS (h2c, prior knowledge) beside HTTP/1.1, through the bounded
            // front door: a client that multiplexes its releases holds one connection.
            let limits = front_door::Limits {
                first_bytes: Duration::from_millis(config.server.client_request_timeout_ms.get()),
                max_concurrent_streams: config.server.h2_max_concurrent_streams.get(),
            };
            let local = tcp.local_addr().map_err(bind_error)?;
            let mut builder = actix_server::Server::build()
                .shutdown_timeout(shutdown_timeout)
                .disable_signals();
            if config.server.workers > 0 {
                builder = builder.workers(config.server.workers);
            }
            let worker = move || {
                let make_app = make_app.clone();
                let app_service = move || {
                    let app = make_app();
                    async move {
                        let config = AppConfig::__priv_test_new(false, local.to_string(), local);
                        let service = app.into_factory().new_service(config).await?;
                        let service = service
                            .map(|response: ServiceResponse<_>| {
                                actix_http::Response::from(response.map_into_boxed_body())
                            })
                            .map_err(actix_http::Response::from);
                        Ok(actix_service::boxed::service(service))
                    }
                };
                front_door::service(app_service, limits, local)
            };
            builder
                .listen("release-harness", tcp, worker)
                .map_err(bind_error)?
                .run()
        } else {
            let mut server = HttpServer::new(make_app)
                .listen(tcp)
                .map_err(bind_error)?
                .client_request_timeout(Duration::from_millis(
                    config.server.client_request_timeout_ms.get(),
                ))
                .shutdown_timeout(shutdown_timeout)
                .disable_signals();
            if config.server.workers > 0 {
                server = server.workers(config.server.workers);
            }
            server.run()
        };
        // The one line that says which store, key prefix and model this replica uses.
        let model = match config.model_configured() {
            true => config.model.base_url.as_str(),
            false => "none (model.base_url is empty: judged releases fail closed)",
        };
        tracing::info!(
            listen = %config.server.listen,
            port,
            redis = %config.redis_target(),
            key_prefix = %config.redis.key_prefix,
            model,
            "release-harness listening"
        );
        let ready_shards = shards.clone();
        let shutdown = Shutdown {
            draining: draining.clone(),
            shards,
            listener,
            server: server.handle(),
            drain: Duration::from_millis(config.server.shutdown_drain_ms),
        };
        let readiness = tokio::spawn(async move {
            loop {
                let ready = !draining.load(Ordering::SeqCst)
                    && redis_answers(&store, &ready_shards).await.is_ok();
                telemetry::ready(ready);
                ready_gate.publish();
                // The exporter drains histogram samples only on upkeep (or a scrape).
                metrics.run_upkeep();
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
        Ok(Application {
            port,
            server,
            shutdown,
            readiness,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A handle that starts graceful shutdown (what SIGTERM does).
    pub fn shutdown_handle(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// Serves until stopped; SIGTERM and SIGINT start graceful shutdown.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let shutdown = self.shutdown.clone();
        let signals = tokio::spawn(async move {
            wait_for_signal().await;
            shutdown.run().await;
        });
        let result = self.server.await;
        signals.abort();
        self.readiness.abort();
        result
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received"),
                    _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses_are_recognised() {
        assert!(is_loopback("127.0.0.1:8080"));
        assert!(is_loopback("[::1]:8080"));
        assert!(!is_loopback("0.0.0.0:8080"));
        assert!(!is_loopback("10.1.2.3:8080"));
    }

    #[test]
    fn route_labels_never_hold_raw_paths() {
        assert_eq!(
            route_label(Some("/v1/runs/{run_id}/release")),
            "/v1/runs/{run_id}/release"
        );
        assert_eq!(route_label(Some("/v1/runs/r-42/release")), "unmatched");
        assert_eq!(route_label(None), "unmatched");
    }
}
