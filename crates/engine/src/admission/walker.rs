//! The draw walker: a worker that walks every drawn sale's waitlist once per interval, so a
//! winner's reservation is made at the draw and a hold that expired or was cancelled passes
//! to the next entry with nobody reading a result. A walk is safe beside another instance's
//! (and a reader's): its reservations replay by request id and the position moves by compare
//! and set.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flashsale_core::clock::now_ms;
use flashsale_core::{AdmissionMode, Ledger, OrderStore, Sale, SaleState};

use super::Admission;
use crate::runner::{Pace, Worker, WorkerState};

/// Between two walks of the drawn sales.
pub const WALK_EVERY: Duration = Duration::from_millis(250);

/// Walks the waitlists of the live draw sales whose draw time passed.
pub struct DrawWalker {
    admission: Arc<Admission>,
    ledger: Arc<dyn Ledger>,
    store: Arc<dyn OrderStore>,
    pace: Pace,
}

impl DrawWalker {
    pub fn new(
        admission: Arc<Admission>,
        ledger: Arc<dyn Ledger>,
        store: Arc<dyn OrderStore>,
        every: Duration,
    ) -> DrawWalker {
        DrawWalker {
            admission,
            ledger,
            store,
            pace: Pace::new(every),
        }
    }

    /// Whether the sale's waitlist is walked now: a live draw sale after its draw time.
    fn drawn(sale: &Sale, now: i64) -> bool {
        sale.admission.mode == AdmissionMode::Draw
            && sale.state == SaleState::Live
            && now >= sale.admission.draw_at_ms
    }

    /// One walk of every drawn sale. A sale that fails is logged and skipped: the others are
    /// still walked.
    async fn walk_all(&self) -> anyhow::Result<u64> {
        let now = now_ms();
        let mut made = 0;
        for stored in self.store.sales().await? {
            if !Self::drawn(&stored.sale, now) {
                continue;
            }
            match self
                .admission
                .walk(&stored.sale, self.ledger.as_ref())
                .await
            {
                Ok(n) => made += n,
                Err(e) => {
                    let sku = stored.sale.sku_id.0;
                    tracing::warn!(sku, error = %e, "draw walk failed; retried next interval");
                }
            }
        }
        Ok(made)
    }
}

#[async_trait]
impl Worker for DrawWalker {
    fn name(&self) -> &'static str {
        "draw_walker"
    }

    async fn work(&mut self) -> anyhow::Result<WorkerState> {
        self.walk_all().await?;
        Ok(WorkerState::Idle)
    }

    async fn wait_for_work(&mut self) -> WorkerState {
        self.pace.tick().await;
        WorkerState::Busy
    }
}
