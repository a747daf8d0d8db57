//! The command connection: one node (`redis.url`, a [`ConnectionManager`]) or a Redis
//! Cluster (`redis.cluster_nodes`, a cluster connection that routes each command to the master
//! of its key's slot). Both connect lazily and reconnect by themselves, so the service starts
//! and recovers while Redis is down. Entry point: [`RedisConnection::open`].

use std::collections::HashMap;
use std::time::Duration;

use futures::future::BoxFuture;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{Client, Cmd, IntoConnectionInfo, Pipeline, Value};

use super::failed;
use crate::config::RedisConfig;
use crate::store::StoreError;

/// The command connection, one node or a Redis Cluster; cheap to clone (clones share it).
#[derive(Clone)]
pub enum RedisConnection {
    /// `redis.url`: one node, one multiplexed connection that reconnects by itself.
    Single(ConnectionManager),
    /// `redis.cluster_nodes`: a connection per master, each command routed to the master of
    /// its first key's slot (MOVED/ASK followed, the slot map refreshed after a failover).
    Cluster(ClusterConnection),
}

impl RedisConnection {
    /// The connection the configuration selects, built without connecting: the first
    /// command connects.
    pub fn open(config: &RedisConfig) -> Result<RedisConnection, StoreError> {
        let response_timeout = Duration::from_millis(config.response_timeout_ms.get());
        let connection_timeout = Duration::from_millis(config.connection_timeout_ms.get());
        // Commands are small and answered one by one: Nagle's algorithm would only hold a
        // command back while an earlier one of the multiplexed connection is unacknowledged
        // (redis-rs leaves TCP_NODELAY off unless told).
        let tcp = redis::io::tcp::TcpSettings::default().set_nodelay(true);
        if config.cluster_nodes.is_empty() {
            let info = config
                .url
                .as_str()
                .into_connection_info()
                .map_err(failed("connect"))?
                .set_tcp_settings(tcp);
            let client = Client::open(info).map_err(failed("connect"))?;
            let manager_config = ConnectionManagerConfig::new()
                .set_response_timeout(Some(response_timeout))
                .set_connection_timeout(Some(connection_timeout))
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(Duration::from_millis(500));
            let conn = ConnectionManager::new_lazy_with_config(client, manager_config)
                .map_err(failed("connect"))?;
            return Ok(RedisConnection::Single(conn));
        }
        // A command is retried (after a slot refresh) while a failover promotes a replica,
        // but never for longer than one response timeout overall: past it the caller answers
        // 503 as on a single node, and a retry of the release is safe.
        let client = ClusterClientBuilder::new(config.cluster_nodes.iter().map(String::as_str))
            .connection_timeout(connection_timeout)
            .response_timeout(response_timeout)
            .tcp_settings(tcp)
            .overall_response_timeout(Some(response_timeout))
            .retries(6)
            .min_retry_wait(50)
            .max_retry_wait(500)
            .build()
            .map_err(failed("connect"))?;
        let cluster_config = ClusterConfig::new()
            .set_connection_timeout(connection_timeout)
            .set_response_timeout(response_timeout);
        Ok(RedisConnection::Cluster(
            client.get_pending_async_connection_with_config(cluster_config),
        ))
    }

    /// The groups in which commands on `keys` may share a pipeline: all together on one
    /// node; per hash slot on a cluster (a pipeline is sent to one master, and a script or
    /// transaction may only touch one slot). Indices into `keys`, in order.
    pub(super) fn pipeline_groups(&self, keys: &[String]) -> Vec<Vec<usize>> {
        match self {
            RedisConnection::Single(_) => vec![(0..keys.len()).collect()],
            RedisConnection::Cluster(_) => {
                let mut by_slot: HashMap<Slot, Vec<usize>> = HashMap::new();
                for (i, key) in keys.iter().enumerate() {
                    by_slot
                        .entry(Slot::for_key(key.as_bytes()))
                        .or_default()
                        .push(i);
                }
                by_slot.into_values().collect()
            }
        }
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a Cmd,
    ) -> BoxFuture<'a, redis::RedisResult<Value>> {
        match self {
            RedisConnection::Single(c) => c.req_packed_command(cmd),
            RedisConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> BoxFuture<'a, redis::RedisResult<Vec<Value>>> {
        match self {
            RedisConnection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConnection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(c) => c.get_db(),
            RedisConnection::Cluster(c) => c.get_db(),
        }
    }
}
