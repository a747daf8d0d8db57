//! `release-harness seed BUNDLE.json`: writes a run bundle's records and calls lists into
//! Redis as the agent's tool layer would, to replay a recorded run against a running
//! service. Entry point: [`seed_redis`].

use crate::check::{BundleError, RunBundle};
use crate::config::Config;
use crate::store::agent_records::CallsLists;
use crate::store::{Keys, RedisConnection, StoreError};

/// Why a bundle could not be seeded.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Connect(#[from] StoreError),
    #[error("cannot write to Redis: {0}")]
    Write(#[from] redis::RedisError),
}

/// Writes the bundle's records; answers how many records it wrote.
pub async fn seed_redis(config: &Config, bundle: &RunBundle) -> Result<usize, SeedError> {
    let keys = Keys::new(&config.redis.key_prefix);
    let mut conn = RedisConnection::open(&config.redis)?;
    let records = bundle.agent_records()?;
    // One transaction per run: a run's keys share a Redis Cluster slot, different runs' may not.
    for pipe in records.redis_transactions(&keys, CallsLists::Replace) {
        pipe.query_async::<()>(&mut conn).await?;
    }
    Ok(records.records.len())
}
