//! Restocks across instances: a cancel or an expiry that brings stock back is told to this
//! instance's listener at once and PUBLISHed on the restock channel; [`RestockHub::feed`]
//! is the subscription that hears the other instances' restocks, run by the service as a
//! worker until shutdown.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use flashsale_core::ledger::{RestockFeed, RestockListener};
use flashsale_core::{LedgerError, SkuId};
use futures::StreamExt;

use crate::conn::{bounded, Timeouts};

/// Wait before the restock subscriber connects again after a fault.
const RESUBSCRIBE_AFTER: Duration = Duration::from_millis(200);

/// Who hears about restocks, and where they are published.
pub(crate) struct RestockHub {
    /// Nodes to subscribe on, tried in turn (on a cluster, PUBLISH reaches every node).
    urls: Vec<String>,
    pub(crate) channel: String,
    listener: RwLock<Option<RestockListener>>,
}

impl RestockHub {
    pub(crate) fn new(urls: Vec<String>, channel: String) -> RestockHub {
        RestockHub {
            urls,
            channel,
            listener: RwLock::new(None),
        }
    }

    pub(crate) fn listener(&self) -> Option<RestockListener> {
        self.listener.read().expect("restock lock").clone()
    }

    pub(crate) fn set_listener(&self, listener: RestockListener) {
        *self.listener.write().expect("restock lock") = Some(listener);
    }

    /// The subscription to the restock channel, on its own connection: it reconnects after
    /// a fault and runs until dropped.
    pub(crate) fn feed(hub: &Arc<RestockHub>) -> RestockFeed {
        Box::pin(subscribe_loop(hub.clone()))
    }
}

async fn subscribe_loop(hub: Arc<RestockHub>) {
    for attempt in 0usize.. {
        let url = &hub.urls[attempt % hub.urls.len()];
        if let Err(e) = subscribe_once(url, &hub).await {
            tracing::debug!(error = %e, "restock subscriber reconnecting");
        }
        tokio::time::sleep(RESUBSCRIBE_AFTER).await;
    }
}

async fn subscribe_once(url: &str, hub: &RestockHub) -> Result<(), LedgerError> {
    let client = redis::Client::open(url).map_err(crate::conn::map_err)?;
    let mut pubsub = bounded(Timeouts::HOT.call, client.get_async_pubsub()).await?;
    bounded(Timeouts::HOT.call, pubsub.subscribe(&hub.channel)).await?;
    let mut messages = pubsub.into_on_message();
    while let Some(msg) = messages.next().await {
        let sku = msg.get_payload::<u64>().ok().map(SkuId);
        if let (Some(sku), Some(listener)) = (sku, hub.listener()) {
            listener(sku);
        }
    }
    Ok(())
}
