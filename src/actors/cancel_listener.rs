//! The CancelListener: subscribes to `P:cancel` on its own Redis connection and forwards
//! every published run id to every registry shard, so a cancel on any replica reaches the one
//! running the release. It re-subscribes (with backoff) whenever the connection drops, and
//! after every (re)subscription asks every shard to check the cancel markers of its runs
//! in flight at once: a cancel published while nobody listened is not lost.

use std::time::Duration;

use actix::{
    Actor, ActorContext, AsyncContext, Context, Handler, Message, SpawnHandle, WrapFuture,
};

use super::Shards;
use crate::domain::audit::CancelSource;
use crate::store::RedisStore;

pub struct CancelListener {
    store: RedisStore,
    registry: Shards,
    /// The subscription loop; stopping the actor drops it and its connection.
    listening: Option<SpawnHandle>,
}

impl CancelListener {
    pub fn new(store: RedisStore, registry: Shards) -> Self {
        CancelListener {
            store,
            registry,
            listening: None,
        }
    }
}

async fn listen(store: RedisStore, registry: Shards) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match store.subscribe_cancels().await {
            Ok(mut subscription) => {
                backoff = Duration::from_millis(100);
                tracing::info!("subscribed to cancel channel");
                registry.watch_now();
                while let Some(run_id) = subscription.next_run_id().await {
                    registry.cancel_now(&run_id, CancelSource::Pubsub);
                }
                tracing::warn!("cancel subscription lost; re-subscribing");
            }
            Err(e) => {
                // Reported (once per interval, naming Redis) by the store's outage log.
                tracing::debug!(error = %e, "cannot subscribe to cancel channel; retrying");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

impl Actor for CancelListener {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let work = listen(self.store.clone(), self.registry.clone());
        self.listening = Some(ctx.spawn(work.into_actor(self)));
    }
}

/// Stops listening (shutdown).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct StopListening;

impl Handler<StopListening> for CancelListener {
    type Result = ();
    fn handle(&mut self, _: StopListening, ctx: &mut Self::Context) {
        if let Some(handle) = self.listening.take() {
            ctx.cancel_future(handle);
        }
        ctx.stop();
    }
}
