//! A sale of three buckets on every backend: each bucket's events apply to its own row (its
//! epoch, applied_seq and counters) and the sale row follows as their sum; transfer sides move
//! a bucket's total and available once each, never the sale row; a batch that mixes buckets
//! changes nothing. Each bucket's events come from a `SaleBook` over its share, as its hot
//! copy would write them.

use flashsale_core::buckets::bucket_epoch;
use flashsale_core::{
    BucketRow, Counters, Event, OrderStore, Sale, SaleBook, SaleMode, SaleState, SkuId, StoreError,
    TransferApplied, TransferEvent, TransferSide,
};
use flashsale_store::SqliteStore;
use flashsale_testkit::bucketed::direct_counters as counters;

use crate::common::{request, NOW};

const SKU: SkuId = SkuId(44);
/// Buckets of the sale, and its stock: 10 a bucket.
const BUCKETS: u16 = 3;
const TOTAL: u64 = 30;

backends!(
    bucket_batches_apply_to_their_bucket_and_the_sale_sums_them,
    transfer_sides_move_bucket_totals_once,
    a_batch_of_two_buckets_changes_nothing,
    salts_are_kept_once_and_a_bucket_takes_its_own_next_epoch,
    a_fenced_side_applied_again_by_the_new_copy_counts_once,
    a_created_units_sale_is_stored_and_the_sale_row_stays_within_stock,
    a_side_stored_by_a_rebuild_takes_its_original_as_a_duplicate,
);

fn sale(sku: SkuId, buckets: u16) -> Sale {
    Sale {
        buckets,
        ..crate::common::sale(sku, TOTAL, 5, SaleMode::Direct)
    }
}

/// The bucketed sale created, its first epoch taken (bucket epochs 3, 4, 5).
async fn create(store: &dyn OrderStore) {
    let created = store.create_sale(&sale(SKU, BUCKETS)).await.unwrap();
    assert_eq!(created.sale.buckets, BUCKETS);
    assert_eq!(store.take_epoch(SKU, 0).await.unwrap(), Some(1));
}

/// The book of `bucket`'s hot copy of sale epoch 1 (its share of 10, its own epoch).
fn book(bucket: u16) -> SaleBook {
    book_of(bucket, TOTAL / u64::from(BUCKETS))
}

/// The book of `bucket`'s hot copy of sale epoch 1 holding `stock` units.
fn book_of(bucket: u16, stock: u64) -> SaleBook {
    let live = Sale {
        state: SaleState::Live,
        total_stock: stock,
        buckets: 1,
        ..sale(SKU, BUCKETS)
    };
    let counters = live.fresh_counters();
    SaleBook::new(live, counters, bucket_epoch(1, bucket, BUCKETS))
}

/// The events of purchases of `quantity` by `users` in `book`.
fn buy(book: &mut SaleBook, users: std::ops::Range<u64>, quantity: u32) -> Vec<Event> {
    users
        .map(|u| request(SKU, u, &format!("r{u}"), quantity))
        .filter_map(|r| book.purchase(&r, NOW).1)
        .collect()
}

/// The sale's bucket rows, each with the time of its epoch when it has one, then shown with
/// that time 0, to compare with [`row`].
async fn bucket_rows(store: &dyn OrderStore) -> Vec<BucketRow> {
    let mut rows = store.buckets(SKU).await.unwrap();
    for r in &mut rows {
        assert_eq!(
            r.epoch_at_ms > 0,
            r.epoch > 0,
            "an epoch's time is kept: {r:?}"
        );
        r.epoch_at_ms = 0;
    }
    rows
}

fn row(bucket: u16, epoch: u64, c: Counters) -> BucketRow {
    BucketRow {
        bucket,
        epoch,
        epoch_at_ms: 0,
        counters: c,
    }
}

async fn apply(store: &dyn OrderStore, events: &[Event]) -> (usize, usize) {
    let report = store.apply_events(SKU, events).await.unwrap();
    assert!(
        report.rejected.is_empty() && report.fenced.is_empty(),
        "{report:?}"
    );
    (report.applied, report.duplicates)
}

async fn bucket_batches_apply_to_their_bucket_and_the_sale_sums_them(store: &dyn OrderStore) {
    let fresh = store.create_sale(&sale(SKU, BUCKETS)).await.unwrap();
    let ten = counters(10, 10, 0, 0);
    let rows = bucket_rows(store).await;
    assert_eq!(rows, vec![row(0, 0, ten), row(1, 0, ten), row(2, 0, ten)]);
    assert_eq!(store.take_epoch(SKU, 0).await.unwrap(), Some(1));
    let epochs: Vec<u64> = store
        .buckets(SKU)
        .await
        .unwrap()
        .iter()
        .map(|b| b.epoch)
        .collect();
    assert_eq!(epochs, vec![3, 4, 5]);

    let one = buy(&mut book(1), 1..6, 1); // bucket 1: seqs 1..=5, 1 unit each
    let two = buy(&mut book(2), 11..15, 2); // bucket 2: seqs 1..=4, 2 units each
    assert_eq!((one.len(), two.len()), (5, 4));
    // Interleaved, each bucket's batches overlapping the ones before (redeliveries).
    assert_eq!(apply(store, &one[..2]).await, (2, 0));
    assert_eq!(apply(store, &two[..2]).await, (2, 0));
    assert_eq!(apply(store, &one[..4]).await, (2, 2));
    assert_eq!(apply(store, &two[1..]).await, (2, 1));
    assert_eq!(apply(store, &one[3..]).await, (1, 1));
    assert_eq!(apply(store, &two).await, (0, 4));

    let rows = bucket_rows(store).await;
    let expected = vec![
        row(0, 3, ten),
        row(1, 4, counters(10, 5, 5, 5)),
        row(2, 5, counters(10, 2, 8, 4)),
    ];
    assert_eq!(rows, expected);
    let stored = store.sale(SKU).await.unwrap().unwrap();
    // The sale row is the sum; its own applied_seq is not a bucketed sale's.
    assert_eq!(stored.counters, counters(TOTAL, 17, 13, fresh.counters.seq));
    let all: Vec<Event> = one.iter().chain(&two).cloned().collect();
    assert_eq!(store.events(SKU).await.unwrap(), all, "by bucket, then seq");
    assert_eq!(store.orders(SKU).await.unwrap().len(), 9);
    let audit = store.audit(SKU).await.unwrap().unwrap();
    let mut audited = audit.buckets;
    audited.iter_mut().for_each(|r| r.epoch_at_ms = 0);
    assert_eq!((audited, audit.events), (expected, all));

    // A copy of bucket 1 of an older sale epoch (0·3 + 1) is fenced by bucket 1's epoch.
    let mut stale = one[4].clone();
    (stale.epoch, stale.seq) = (1, 6);
    let report = store.apply_events(SKU, &[stale.clone()]).await.unwrap();
    assert_eq!((report.applied, report.fenced), (0, vec![stale.clone()]));
    assert_eq!(store.unreported_fenced(SKU, 10).await.unwrap(), vec![stale]);
    // A gap in bucket 2's seqs is refused, whatever bucket 1's seq is.
    let mut gap = two[3].clone();
    gap.seq = 6;
    assert!(matches!(
        store.apply_events(SKU, &[gap]).await,
        Err(StoreError::Gap {
            applied_seq: 4,
            first_seq: 6
        })
    ));
    assert_eq!(bucket_rows(store).await, rows, "neither moved a bucket");
}

fn side(
    epoch: u64,
    id: &str,
    side: TransferSide,
    (from, to): (u16, u16),
    units: u64,
) -> TransferEvent {
    TransferEvent {
        sku_id: SKU,
        epoch,
        id: id.into(),
        side,
        from,
        to,
        units,
        at_ms: NOW,
    }
}

async fn transfer_sides_move_bucket_totals_once(store: &dyn OrderStore) {
    create(store).await;
    let before = store.sale(SKU).await.unwrap();
    let out = side(3, "3.1", TransferSide::Out, (0, 2), 4);
    let into = side(5, "3.1", TransferSide::In, (0, 2), 4);
    assert_eq!(
        store.apply_transfer(&out).await.unwrap(),
        TransferApplied::Applied
    );
    assert_eq!(
        store.apply_transfer(&out).await.unwrap(),
        TransferApplied::Duplicate
    );
    let totals = |rows: Vec<BucketRow>| -> Vec<(u64, u64)> {
        rows.iter()
            .map(|b| (b.counters.total, b.counters.available))
            .collect()
    };
    // In flight: out of bucket 0, in no bucket yet.
    assert_eq!(
        totals(bucket_rows(store).await),
        [(6, 6), (10, 10), (10, 10)]
    );
    assert_eq!(
        store.apply_transfer(&into).await.unwrap(),
        TransferApplied::Applied
    );
    assert_eq!(
        store.apply_transfer(&into).await.unwrap(),
        TransferApplied::Duplicate
    );
    assert_eq!(
        totals(bucket_rows(store).await),
        [(6, 6), (10, 10), (14, 14)]
    );
    assert_eq!(
        store.sale(SKU).await.unwrap(),
        before,
        "the sale row does not move"
    );

    // More than the source holds: refused, nothing kept.
    let greedy = side(4, "4.1", TransferSide::Out, (1, 0), 11);
    assert!(matches!(
        store.apply_transfer(&greedy).await,
        Err(StoreError::Internal(_))
    ));
    // Another side under a stored key: refused.
    let other = side(3, "3.1", TransferSide::Out, (0, 2), 5);
    assert!(matches!(
        store.apply_transfer(&other).await,
        Err(StoreError::Internal(_))
    ));
    let audit = store.audit(SKU).await.unwrap().unwrap();
    assert_eq!(audit.transfers, vec![out, into]);

    // A new sale epoch (bucket epochs 6, 7, 8) fences the sides of the old copies.
    assert_eq!(store.take_epoch(SKU, 1).await.unwrap(), Some(2));
    let stale = side(3, "3.2", TransferSide::Out, (0, 1), 1);
    assert_eq!(
        store.apply_transfer(&stale).await.unwrap(),
        TransferApplied::Fenced
    );
    assert_eq!(
        store.apply_transfer(&stale).await.unwrap(),
        TransferApplied::Fenced
    );
    let rows = bucket_rows(store).await;
    assert_eq!(totals(rows.clone()), [(6, 6), (10, 10), (14, 14)]);
    assert_eq!(rows.iter().map(|b| b.epoch).collect::<Vec<_>>(), [6, 7, 8]);
    assert_eq!(store.audit(SKU).await.unwrap().unwrap().transfers.len(), 2);
    // A bucket's whole stock may leave it.
    let all = side(6, "6.1", TransferSide::Out, (0, 1), 6);
    assert_eq!(
        store.apply_transfer(&all).await.unwrap(),
        TransferApplied::Applied
    );
    assert_eq!(bucket_rows(store).await[0].counters, counters(0, 0, 0, 0));

    // Transfers exist only between the buckets of a bucketed sale.
    store.create_sale(&sale(SkuId(7), 1)).await.unwrap();
    let single = TransferEvent {
        sku_id: SkuId(7),
        ..side(1, "1.1", TransferSide::Out, (0, 1), 1)
    };
    assert!(matches!(
        store.apply_transfer(&single).await,
        Err(StoreError::Internal(_))
    ));
    assert!(store.buckets(SkuId(7)).await.unwrap().is_empty());
    let unknown = TransferEvent {
        sku_id: SkuId(8),
        ..single
    };
    assert!(matches!(
        store.apply_transfer(&unknown).await,
        Err(StoreError::SaleNotFound)
    ));
}

/// An in that reached a destination whose copy was then replaced before the side was stored
/// is fenced (kept, not applied); the new copy takes the same transfer in again (its source
/// still holds it pending), and that side is applied over the fenced one: once, and only a
/// side of the same move.
async fn a_fenced_side_applied_again_by_the_new_copy_counts_once(store: &dyn OrderStore) {
    create(store).await;
    let out = side(3, "3.1", TransferSide::Out, (0, 2), 4);
    assert_eq!(
        store.apply_transfer(&out).await.unwrap(),
        TransferApplied::Applied
    );
    let rows = bucket_rows(store).await;
    assert_eq!(rows[2].epoch, 5);
    assert_eq!(
        store.take_bucket_epoch(SKU, &rows[2]).await.unwrap(),
        Some(8)
    );
    let old_in = side(5, "3.1", TransferSide::In, (0, 2), 4);
    assert_eq!(
        store.apply_transfer(&old_in).await.unwrap(),
        TransferApplied::Fenced
    );
    let mut bigger = side(8, "3.1", TransferSide::In, (0, 2), 5);
    bigger.at_ms = NOW + 1;
    assert!(matches!(
        store.apply_transfer(&bigger).await,
        Err(StoreError::Internal(_))
    ));
    let new_in = TransferEvent {
        at_ms: NOW + 1,
        ..side(8, "3.1", TransferSide::In, (0, 2), 4)
    };
    assert_eq!(
        store.apply_transfer(&new_in).await.unwrap(),
        TransferApplied::Applied
    );
    assert_eq!(
        store.apply_transfer(&new_in).await.unwrap(),
        TransferApplied::Duplicate
    );
    assert_eq!(
        store.apply_transfer(&old_in).await.unwrap(),
        TransferApplied::Fenced
    );
    let rows = bucket_rows(store).await;
    assert_eq!((rows[0].counters.total, rows[2].counters.total), (6, 14));
    let audit = store.audit(SKU).await.unwrap().unwrap();
    assert_eq!(audit.transfers, vec![out, new_in]);
}

/// The placement is kept once (a second placement changes nothing); a bucket's rebuild
/// moves its epoch alone, by the bucket count, and only from the epoch it names.
async fn salts_are_kept_once_and_a_bucket_takes_its_own_next_epoch(store: &dyn OrderStore) {
    create(store).await;
    assert_eq!(
        store.bucket_salts(SKU).await.unwrap(),
        None,
        "not placed yet"
    );
    store.keep_bucket_salts(SKU, &[0, 7, 9]).await.unwrap();
    store.keep_bucket_salts(SKU, &[0, 1, 2]).await.unwrap();
    assert_eq!(store.bucket_salts(SKU).await.unwrap(), Some(vec![0, 7, 9]));

    let rows = bucket_rows(store).await;
    let stale = BucketRow {
        epoch: 3,
        ..rows[1]
    };
    assert_eq!(
        store.take_bucket_epoch(SKU, &stale).await.unwrap(),
        None,
        "not its epoch"
    );
    assert_eq!(rows[1].epoch, 4);
    assert_eq!(
        store.take_bucket_epoch(SKU, &rows[1]).await.unwrap(),
        Some(7)
    );
    let epochs: Vec<u64> = store
        .buckets(SKU)
        .await
        .unwrap()
        .iter()
        .map(|r| r.epoch)
        .collect();
    assert_eq!(epochs, [3, 7, 5]);
    let missing = BucketRow {
        bucket: 3,
        ..rows[2]
    };
    assert!(
        store.take_bucket_epoch(SKU, &missing).await.is_err(),
        "no bucket 3"
    );
}

async fn a_batch_of_two_buckets_changes_nothing(store: &dyn OrderStore) {
    create(store).await;
    let one = buy(&mut book(1), 1..3, 1);
    let two = buy(&mut book(2), 11..12, 1);
    apply(store, &one[..1]).await;
    let snapshot = || async {
        (
            store.sale(SKU).await.unwrap(),
            bucket_rows(store).await,
            store.orders(SKU).await.unwrap(),
            store.events(SKU).await.unwrap(),
        )
    };
    let before = snapshot().await;
    let mixed: Vec<Event> = one[1..].iter().chain(&two).cloned().collect();
    assert!(matches!(
        store.apply_events(SKU, &mixed).await,
        Err(StoreError::Internal(_))
    ));
    assert_eq!(snapshot().await, before);
    // Each bucket's own batch still applies.
    assert_eq!(apply(store, &one[1..]).await, (1, 0));
    assert_eq!(apply(store, &two).await, (1, 0));
}

/// The embedded ledger runs a bucketed sale as one book on its sale row (`put_sale` drops the
/// bucket rows): its events, of the sale's epoch, apply to the sale row as for one bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucketed_sale_put_as_one_book_applies_to_its_sale_row() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("f.db").to_str().unwrap())
        .await
        .expect("open");
    let s = sale(SKU, BUCKETS);
    store.create_sale(&s).await.unwrap();
    assert_eq!(bucket_rows(&store).await.len(), 3);
    store.put_sale(&s, &s.fresh_counters(), 1).await.unwrap();
    assert!(store.buckets(SKU).await.unwrap().is_empty());
    let live = Sale {
        state: SaleState::Live,
        ..s.clone()
    };
    let mut book = SaleBook::new(live.clone(), live.fresh_counters(), 1);
    let events = buy(&mut book, 1..4, 2);
    assert_eq!(apply(&store, &events).await, (3, 0));
    let stored = store.sale(SKU).await.unwrap().unwrap();
    assert_eq!(stored.counters, counters(TOTAL, 24, 6, 3));
    assert_eq!(store.events_between(SKU, 1..=3).await.unwrap(), events);
}

/// A created unit: bucket 1 stored an in whose out is never stored, so its copy holds 11 of
/// a sale of 30 and sells them all. Each bucket's row takes its own sales (its guard holds
/// them); the sale row, the buckets' sum, shows the stock at most and the excess stays in the
/// bucket rows for the checks to report. Nothing of it is an error, so no persister stops. A
/// guard rejection is reported lost by order number, with the fenced events.
async fn a_created_units_sale_is_stored_and_the_sale_row_stays_within_stock(
    store: &dyn OrderStore,
) {
    create(store).await;
    let created = side(4, "3.1", TransferSide::In, (0, 1), 1);
    assert_eq!(
        store.apply_transfer(&created).await.unwrap(),
        TransferApplied::Applied
    );
    apply(store, &buy(&mut book(0), 1..11, 1)).await;
    apply(store, &buy(&mut book(2), 21..31, 1)).await;
    let eleven = buy(&mut book_of(1, 11), 31..42, 1);
    assert_eq!(eleven.len(), 11);
    assert_eq!(apply(store, &eleven).await, (11, 0));
    let sale = store.sale(SKU).await.unwrap().unwrap();
    let c = sale.counters;
    assert_eq!((c.available, c.reserved, c.sold), (0, 0, 30));
    let rows = bucket_rows(store).await;
    assert_eq!(rows[1].counters, counters(11, 0, 11, 11), "the excess");
    assert_eq!(store.orders(SKU).await.unwrap().len(), 31);
    // A redelivery is a duplicate.
    assert_eq!(apply(store, &eleven).await, (0, 11));

    // The guard's own rejection (a twelfth sale bucket 1's row cannot hold) is reported lost.
    let mut twelfth = buy(&mut book_of(1, 12), 31..43, 1).pop().unwrap();
    twelfth.seq = 12;
    let report = store.apply_events(SKU, &[twelfth.clone()]).await.unwrap();
    assert_eq!(report.rejected, vec![twelfth.order_no]);
    assert_eq!(
        store.unreported_fenced(SKU, 10).await.unwrap(),
        vec![twelfth]
    );
}

/// A rebuild of bucket 2 stores the in its copy lost, with the out's time; the original in,
/// read by a persister from the old stream before the loss, arrives later with its own time:
/// a redelivery of the same move, counted once, not an error.
async fn a_side_stored_by_a_rebuild_takes_its_original_as_a_duplicate(store: &dyn OrderStore) {
    create(store).await;
    let out = side(3, "3.1", TransferSide::Out, (0, 2), 4);
    assert_eq!(
        store.apply_transfer(&out).await.unwrap(),
        TransferApplied::Applied
    );
    let by_rebuild = side(5, "3.1", TransferSide::In, (0, 2), 4);
    assert_eq!(
        store.apply_transfer(&by_rebuild).await.unwrap(),
        TransferApplied::Applied
    );
    let original = TransferEvent {
        at_ms: NOW + 7,
        ..by_rebuild.clone()
    };
    assert_eq!(
        store.apply_transfer(&original).await.unwrap(),
        TransferApplied::Duplicate
    );
    let rows = bucket_rows(store).await;
    assert_eq!((rows[0].counters.total, rows[2].counters.total), (6, 14));
    let audit = store.audit(SKU).await.unwrap().unwrap();
    assert_eq!(audit.transfers, vec![out, by_rebuild]);
}
