//! The core traits on the embedded ledger: each call a job on the sale's queue, or a read of
//! its book.

use async_trait::async_trait;
use tokio::sync::oneshot;

use flashsale_core::ledger::{Changed, RestockListener};
use flashsale_core::{
    CopyAt, Counters, ErrorCode, EventKind, HotCopies, HotLedger, HotOrder, HotPurchases,
    LedgerError, OrderNo, OrderStore, PurchaseOutcome, PurchaseRequest, RequestKey, Resolution,
    Sale, SaleState, SkuId, SoldOutSupport, StoreError, UserId,
};

use crate::job::{unavailable, Job};
use crate::EmbeddedLedger;

#[async_trait]
impl HotPurchases for EmbeddedLedger {
    async fn purchase_batch(
        &self,
        sku: SkuId,
        reqs: &[PurchaseRequest],
    ) -> Result<Vec<PurchaseOutcome>, LedgerError> {
        flashsale_core::ledger::check_batch(sku, reqs)?;
        let slot = self.inner.slot(sku).ok_or(LedgerError::NotWarmed)?;
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, rx) = oneshot::channel();
        let job = Job::Purchase {
            reqs: reqs.to_vec(),
            reply,
        };
        self.submit(slot, job, rx).await
    }
}

#[async_trait]
impl HotLedger for EmbeddedLedger {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    fn durability(&self) -> flashsale_core::Durability {
        flashsale_core::Durability::BeforeAnswer
    }

    /// All: the embedded ledger has no shards, so a bucketed sale runs as one book (one
    /// writer, one SQLite database); its buckets are only the sale's definition.
    fn buckets_max(&self) -> u16 {
        flashsale_core::buckets::BUCKETS_MAX
    }

    async fn set_state(&self, sku: SkuId, state: SaleState) -> Result<(), LedgerError> {
        self.change_state(sku, None, state).await.map(|_| ())
    }

    /// The book's state only: SQLite keeps the operator's word (as the database does for
    /// the Redis ledger), so an auto-pause never looks like an operator's pause.
    async fn set_state_if(&self, sku: SkuId, from: SaleState, to: SaleState) -> Changed {
        self.change_state(sku, Some(from), to).await
    }

    async fn pay(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError> {
        self.resolve(order_no, user, EventKind::Paid).await
    }

    async fn cancel(&self, order_no: &OrderNo, user: UserId) -> Result<Resolution, LedgerError> {
        self.resolve(order_no, user, EventKind::Cancelled).await
    }

    async fn expire_due(&self, sku: SkuId, max: usize) -> Result<usize, LedgerError> {
        let slot = self.inner.slot(sku).ok_or(LedgerError::NotWarmed)?;
        if max == 0 {
            return Ok(0);
        }
        let (reply, rx) = oneshot::channel();
        self.submit(slot, Job::Expire { max, reply }, rx).await
    }

    async fn counters(&self, sku: SkuId) -> Result<Option<Counters>, LedgerError> {
        let Some(slot) = self.inner.slot(sku) else {
            return Ok(None);
        };
        self.with_book(slot, |_, loaded| {
            Box::pin(async move { Ok(Some(loaded.book.counters)) })
        })
        .await
    }

    async fn order(&self, order_no: &OrderNo) -> Result<Option<HotOrder>, LedgerError> {
        let Some(slot) = self.inner.slot(order_no.sku()) else {
            return Ok(None);
        };
        let no = *order_no;
        self.with_book(slot, move |_, loaded| {
            Box::pin(async move { Ok(loaded.book.order(&no).cloned()) })
        })
        .await
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        self.inner.store.ping().await.map_err(unavailable)
    }
}

#[async_trait]
impl HotCopies for EmbeddedLedger {
    async fn load(&self, sale: &Sale, counters: &Counters, epoch: u64) -> Result<(), LedgerError> {
        let sku = sale.sku_id;
        if counters.total != sale.total_stock || !counters.conserved() || epoch == 0 {
            return Err(LedgerError::Internal(format!(
                "load with counters {counters:?} for total {} at epoch {epoch}",
                sale.total_stock
            )));
        }
        let (wanted, counters) = (sale.clone(), *counters);
        let inner = self.inner.clone();
        // In a task of its own: a caller giving up must not leave book and store apart.
        let task = tokio::spawn(async move {
            let _serial = inner.warm_lock.lock().await;
            let slot = inner.slot(sku);
            let mut guard = match &slot {
                Some(slot) => {
                    let mut guard = slot.book.clone().lock_owned().await;
                    // Every group in flight ended; after a failed one the book is reloaded
                    // (here, or by the next holder of the lock when this load goes no further).
                    guard.stale |= slot.pipeline.settle().await;
                    Some(guard)
                }
                None => None,
            };
            if guard.as_ref().is_some_and(|g| g.book.epoch >= epoch) {
                return Err(LedgerError::AlreadyWarm);
            }
            if let Some(g) = guard.as_mut() {
                g.stale = true; // until it is loaded again below
            }
            inner
                .store
                .put_sale(&wanted, &counters, epoch)
                .await
                .map_err(unavailable)?;
            let mut loaded = inner.load(sku).await?;
            loaded.fenced_at = Some(std::time::Instant::now());
            match guard.as_mut() {
                Some(g) => **g = loaded,
                None => {
                    inner.insert(sku, loaded);
                }
            }
            Ok(())
        });
        task.await
            .map_err(|e| LedgerError::Internal(format!("load task: {e}")))?
    }

    async fn fence(&self, sku: SkuId) -> Result<bool, LedgerError> {
        let Some(slot) = self.inner.slot(sku) else {
            return Ok(false);
        };
        self.with_book(slot, |_, loaded| {
            Box::pin(async move {
                loaded.fenced_at.get_or_insert_with(std::time::Instant::now);
                Ok(true)
            })
        })
        .await
    }

    async fn open(&self, sku: SkuId, epoch: u64, state: SaleState) -> Result<(), LedgerError> {
        let slot = self.inner.slot(sku).ok_or(LedgerError::AlreadyWarm)?;
        self.with_book(slot, move |inner, loaded| {
            Box::pin(async move {
                if loaded.book.epoch != epoch {
                    return Err(LedgerError::AlreadyWarm);
                }
                inner
                    .store
                    .set_state(sku, state)
                    .await
                    .map_err(unavailable)?;
                loaded.book.sale.state = state;
                loaded.fenced_at = None;
                Ok(())
            })
        })
        .await
    }

    /// No stream: every group is committed to SQLite before it is answered, and the book is
    /// read under its lock once every group in flight has ended, so there are never events in
    /// flight.
    async fn hot_snapshot(
        &self,
        sku: SkuId,
    ) -> Result<Option<flashsale_core::HotSnapshot>, LedgerError> {
        let Some(slot) = self.inner.slot(sku) else {
            return Ok(None);
        };
        self.with_book(slot, |_, loaded| {
            Box::pin(async move {
                Ok(Some(flashsale_core::HotSnapshot {
                    counters: loaded.book.counters,
                    epoch: loaded.book.epoch,
                    events: Vec::new(),
                    transfers: Vec::new(),
                    bad_entries: Vec::new(),
                    fenced_ms: loaded.fenced_at.map(|t| t.elapsed().as_millis() as u64),
                    state: loaded.book.sale.state,
                }))
            })
        })
        .await
    }

    /// Nothing to restore: the embedded book is loaded from SQLite, the system of record
    /// itself, orders included. Only checks that the book is still the one of `epoch`.
    async fn restore_orders(&self, at: CopyAt, _orders: &[HotOrder]) -> Result<usize, LedgerError> {
        let CopyAt { sku, epoch } = at;
        let slot = self.inner.slot(sku).ok_or(LedgerError::AlreadyWarm)?;
        self.with_book(slot, move |_, loaded| {
            Box::pin(async move {
                match loaded.book.epoch == epoch {
                    true => Ok(0),
                    false => Err(LedgerError::AlreadyWarm),
                }
            })
        })
        .await
    }
}

#[async_trait]
impl SoldOutSupport for EmbeddedLedger {
    async fn accepted_keys(
        &self,
        sku: SkuId,
        max: usize,
    ) -> Result<Option<Vec<RequestKey>>, LedgerError> {
        let Some(slot) = self.inner.slot(sku) else {
            return Ok(None);
        };
        self.with_book(slot, move |_, loaded| {
            Box::pin(
                async move { Ok((loaded.accepted.len() <= max).then(|| loaded.accepted.clone())) },
            )
        })
        .await
    }

    async fn is_accepted(&self, sku: SkuId, key: &RequestKey) -> Result<bool, LedgerError> {
        let Some(slot) = self.inner.slot(sku) else {
            return Ok(false);
        };
        let key = key.clone();
        self.with_book(slot, move |_, loaded| {
            Box::pin(async move { Ok(loaded.book.accepted(key.user, &key.request_id)) })
        })
        .await
    }

    async fn accepted_count(&self, sku: SkuId) -> Result<Option<(u64, usize)>, LedgerError> {
        let Some(slot) = self.inner.slot(sku) else {
            return Ok(None);
        };
        self.with_book(slot, |_, loaded| {
            Box::pin(async move { Ok(Some((loaded.book.epoch, loaded.accepted.len()))) })
        })
        .await
    }

    fn on_restock(&self, listener: RestockListener) {
        *self.inner.restock.write().expect("restock lock") = Some(listener);
    }
}

impl EmbeddedLedger {
    /// Sets the state of the book, only from `from` when given; without `from` (an operator's
    /// change) in SQLite too. A fenced book is `Unavailable` (its rebuild opens it in the
    /// stored state).
    async fn change_state(
        &self,
        sku: SkuId,
        from: Option<SaleState>,
        to: SaleState,
    ) -> Result<bool, LedgerError> {
        let slot = self.inner.slot(sku).ok_or(LedgerError::NotWarmed)?;
        self.with_book(slot, move |inner, loaded| {
            Box::pin(async move {
                if loaded.fenced_at.is_some() {
                    return Err(LedgerError::Unavailable("a rebuild owns the sale".into()));
                }
                if from.is_some_and(|f| f != loaded.book.sale.state) {
                    return Ok(false);
                }
                if from.is_none() {
                    match inner.store.set_state(sku, to).await {
                        Ok(()) => {}
                        Err(StoreError::SaleNotFound) => return Err(LedgerError::NotWarmed),
                        Err(e) => return Err(unavailable(e)),
                    }
                }
                loaded.book.sale.state = to;
                Ok(true)
            })
        })
        .await
    }

    async fn resolve(
        &self,
        order_no: &OrderNo,
        user: UserId,
        kind: EventKind,
    ) -> Result<Resolution, LedgerError> {
        let Some(slot) = self.inner.slot(order_no.sku()) else {
            return Ok(Err(ErrorCode::OrderNotFound));
        };
        let (reply, rx) = oneshot::channel();
        let job = Job::Resolve {
            order_no: *order_no,
            user,
            kind,
            reply,
        };
        self.submit(slot, job, rx).await
    }
}
