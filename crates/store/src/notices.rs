//! Sale notices (migration 0015): the transitions of a sale that are no order's own stored
//! event, kept as an ordered log per sale that the order-event relay reads like
//! `stock_events`. Two writers, each inside the transaction that makes the transition true:
//!
//! - a loss: the transaction that stores a reconciler run stores one `lost` notice per order
//!   it reports lost, unless one was stored before (a loss reported by two runs is one
//!   notice, one event);
//! - sold out: the transaction whose guarded counter update makes the sale row's `sold` reach
//!   `total_stock` (nothing available, nothing held, nothing in flight) stores `sold_out`,
//!   once per total.
//!
//! Each is a gate and an insert: the gate raises `sales.notice_seq` under the sale row's lock
//! only when the notice is not stored yet, and the insert writes it at the raised value. So a
//! sale's notices commit in seq order without a gap, as a stream's events do.
//!
//! The statements are public: the embedded ledger's own SQLite writer runs the sold-out pair.

use flashsale_core::events::{Notice, NoticeKind};
use flashsale_core::{Counters, SkuId, StoreError};
use sqlx::Transaction;

use crate::backend::{Arg, Backend, Columns};

/// Raises the sale's notice head when it sold out and that total's notice is not stored yet
/// (1 row: go on with [`INSERT_SOLD_OUT`]). Binds: sku_id.
pub const SOLD_OUT_GATE: &str = "UPDATE sales SET notice_seq = notice_seq + 1 \
     WHERE sku_id = ? AND sold = total_stock AND NOT EXISTS (SELECT 1 FROM sale_notices n \
     WHERE n.sku_id = sales.sku_id AND n.kind = 'sold_out' AND n.order_no = '' \
     AND n.total_stock = sales.total_stock)";

/// The sold-out notice at the raised head. Binds: at_ms, sku_id.
pub const INSERT_SOLD_OUT: &str = "INSERT INTO sale_notices \
     (sku_id, seq, kind, order_no, total_stock, run_id, at_ms) \
     SELECT sku_id, notice_seq, 'sold_out', '', total_stock, 0, ? FROM sales WHERE sku_id = ?";

/// Raises the sale's notice head when the order's loss is not stored yet. Binds: sku_id,
/// sku_id, order_no.
const LOST_GATE: &str = "UPDATE sales SET notice_seq = notice_seq + 1 WHERE sku_id = ? \
     AND NOT EXISTS (SELECT 1 FROM sale_notices n WHERE n.sku_id = ? AND n.kind = 'lost' \
     AND n.order_no = ? AND n.total_stock = 0)";

/// The loss at the raised head. Binds: order_no, run_id, at_ms, sku_id.
const INSERT_LOST: &str = "INSERT INTO sale_notices \
     (sku_id, seq, kind, order_no, total_stock, run_id, at_ms) \
     SELECT sku_id, notice_seq, 'lost', ?, 0, ?, ? FROM sales WHERE sku_id = ?";

const NOTICE_COLUMNS: &str = "sku_id, seq, kind, order_no, total_stock, run_id, at_ms";

/// Whether a batch that moved the counters from `old` to `new` may have sold the sale out:
/// it sold something, and (a sale of one bucket, whose row it moved) every unit is sold. A
/// bucketed sale's row is the sum of its buckets', so there the gate decides.
pub fn may_sell_out(old: Counters, new: Counters, bucketed: bool) -> bool {
    new.sold > old.sold && (bucketed || new.sold == new.total)
}

/// In the transaction of a guarded update that moved `old` to `new`: stores the sold-out
/// notice when the sale row is sold out now (`at_ms`: the last event's time).
pub(crate) async fn note_sold_out<B: Backend>(
    tx: &mut Transaction<'static, B>,
    sku: SkuId,
    (old, new, bucketed): (Counters, Counters, bool),
    at_ms: i64,
) -> Result<(), StoreError> {
    if !may_sell_out(old, new, bucketed) {
        return Ok(());
    }
    if B::run(&mut **tx, SOLD_OUT_GATE, &[Arg::Id(sku.0)]).await? == 1 {
        B::run(
            &mut **tx,
            INSERT_SOLD_OUT,
            &[Arg::Int(at_ms), Arg::Id(sku.0)],
        )
        .await?;
    }
    Ok(())
}

/// In the transaction that stores reconciler run `run_id` of `sku`: one notice per order of
/// `lost` not stored lost before.
pub(crate) async fn note_losses<B: Backend>(
    tx: &mut Transaction<'static, B>,
    sku: SkuId,
    run_id: u64,
    at_ms: i64,
    lost: &[String],
) -> Result<(), StoreError> {
    for no in lost {
        let gate = [Arg::Id(sku.0), Arg::Id(sku.0), Arg::Text(no)];
        if B::run(&mut **tx, LOST_GATE, &gate).await? == 1 {
            let args = [
                Arg::Text(no),
                Arg::Id(run_id),
                Arg::Int(at_ms),
                Arg::Id(sku.0),
            ];
            B::run(&mut **tx, INSERT_LOST, &args).await?;
        }
    }
    Ok(())
}

fn notice<R: Columns>(row: &R) -> Result<Notice, StoreError> {
    let kind = row.text("kind")?;
    Ok(Notice {
        sku_id: SkuId(row.uint("sku_id")?),
        seq: row.uint("seq")?,
        kind: NoticeKind::parse(&kind)
            .ok_or_else(|| StoreError::Internal(format!("bad notice kind {kind:?}")))?,
        order_no: row.text("order_no")?,
        total_stock: row.uint("total_stock")?,
        run_id: row.uint("run_id")?,
        at_ms: row.int("at_ms")?,
    })
}

/// The notices of `sku` after `after`, by seq, at most `max`.
pub(crate) async fn read<B: Backend>(
    store: &crate::store::Store<B>,
    sku: SkuId,
    after: u64,
    max: usize,
) -> Result<Vec<Notice>, StoreError> {
    let sql = format!(
        "SELECT {NOTICE_COLUMNS} FROM sale_notices WHERE sku_id = ? AND seq > ? \
         ORDER BY seq LIMIT {}",
        max.clamp(1, i64::MAX as usize)
    );
    let rows = store
        .read(&sql, &[Arg::Id(sku.0), Arg::Id(after.min(i64::MAX as u64))])
        .await?;
    rows.iter().map(notice).collect()
}
