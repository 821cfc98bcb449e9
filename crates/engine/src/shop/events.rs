//! Order events as use cases: each sink's status, an operator's re-delivery from a position
//! and the resumption of a paused sink (the work is `relay`'s).

use std::sync::Arc;

use flashsale_core::events::{EventLog, StreamKey, NOTICES};
use flashsale_core::{ErrorCode, SkuId};

use super::{Shop, ShopError};
use crate::relay::{self, SinkStatus, SINKS};

impl Shop {
    /// Every sink (`nats`, `webhook`) with its per-stream positions.
    pub async fn sinks(&self) -> Result<Vec<SinkStatus>, ShopError> {
        relay::status(self.event_log()?.as_ref(), &SINKS)
            .await
            .map_err(unavailable)
    }

    /// Has `sink` deliver a sale's stream (`bucket` 0 for a sale of one bucket; 64 for its
    /// notices) again from `from_seq` on (and resume when paused).
    pub async fn redeliver(
        &self,
        sink: &str,
        sku: SkuId,
        bucket: u16,
        from_seq: u64,
    ) -> Result<(), ShopError> {
        let sink = sink_name(sink)?;
        if from_seq == 0 {
            return Err(ShopError::invalid("from_seq counts from 1"));
        }
        let sale = self.stored_sale(sku).await?.sale;
        // Bucket 64 is the sale's notice stream (orders reported lost, sold out).
        if bucket >= sale.buckets.max(1) && bucket != NOTICES {
            let why = format!("sale {} has {} bucket(s)", sku.0, sale.buckets);
            return Err(ShopError::invalid(why));
        }
        let stream = StreamKey { sku, bucket };
        relay::redeliver(self.event_log()?.as_ref(), sink, stream, from_seq)
            .await
            .map_err(unavailable)
    }

    /// A paused sink retries where it stopped.
    pub async fn resume_sink(&self, sink: &str) -> Result<(), ShopError> {
        let sink = sink_name(sink)?;
        relay::resume(self.event_log()?.as_ref(), sink)
            .await
            .map_err(unavailable)
    }

    fn event_log(&self) -> Result<Arc<dyn EventLog>, ShopError> {
        self.store.event_log().ok_or_else(|| {
            ShopError::refused(ErrorCode::Unavailable, "this store keeps no event log")
        })
    }
}

fn sink_name(name: &str) -> Result<&'static str, ShopError> {
    SINKS
        .into_iter()
        .find(|s| *s == name)
        .ok_or_else(|| ShopError::invalid(format!("unknown sink {name:?}: one of {SINKS:?}")))
}

fn unavailable(e: anyhow::Error) -> ShopError {
    ShopError::refused(ErrorCode::Unavailable, format!("{e:#}"))
}
