//! The short way for a spike's batch (MySQL and PostgreSQL) (fresh deductions, no look-ups of existing orders):
//! where a look-up would have found something, a unique index refuses the insert, the try is
//! rolled back whole, and the long way keeps its answer (the event stored as rejected, no
//! second order), as it always did.

use flashsale_core::{
    Event, OrderStatus, OrderStore, PurchaseRequest, Sale, SaleBook, SaleMode, SkuId,
};

use crate::common::{live_sale, request, NOW};

const SKU: SkuId = SkuId(43);

fn sale() -> Sale {
    live_sale(SKU, 10, 5, SaleMode::Direct)
}

fn req(user: u64, rid: &str) -> PurchaseRequest {
    request(SKU, user, rid, 1)
}

fn buy(book: &mut SaleBook, reqs: &[PurchaseRequest]) -> Vec<Event> {
    reqs.iter()
        .filter_map(|r| book.purchase(r, NOW).1)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_repeated_request_key_falls_back_to_the_guard() {
    let (_db, store) = crate::common::mysql().await;
    a_repeated_request_key_falls_back_to_the_guard(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_repeated_request_key_falls_back_to_the_guard() {
    let (_db, store) = crate::common::postgres().await;
    a_repeated_request_key_falls_back_to_the_guard(&store).await;
    store.close().await;
}

async fn a_repeated_request_key_falls_back_to_the_guard(store: &dyn OrderStore) {
    store.create_sale(&sale()).await.unwrap();
    assert_eq!(store.take_epoch(SKU, 0).await.unwrap(), Some(1));
    let mut book = SaleBook::new(sale(), sale().fresh_counters(), 1);
    let first = buy(&mut book, &[req(1, "a"), req(2, "b")]);
    let report = store.apply_events(SKU, &first).await.unwrap();
    assert_eq!((report.applied, report.rejected.len()), (2, 0));

    // A second book (a hot copy that forgot user 1's request "a") judges it anew: its order
    // number is new, its request key is not.
    let mut forgetful = SaleBook::new(sale(), book.counters, 1);
    let second = buy(&mut forgetful, &[req(3, "c"), req(1, "a"), req(4, "d")]);
    assert_eq!(second.len(), 3);
    let report = store.apply_events(SKU, &second).await.unwrap();
    assert_eq!(report.applied, 3);
    assert_eq!(report.rejected, vec![second[1].order_no]);

    let orders = store.orders(SKU).await.unwrap();
    let rows: Vec<(u64, String, OrderStatus)> = orders
        .iter()
        .map(|o| (o.user_id.0, o.request_id.to_string(), o.status))
        .collect();
    assert_eq!(
        rows,
        vec![
            (1, "a".into(), OrderStatus::Created),
            (2, "b".into(), OrderStatus::Created),
            (3, "c".into(), OrderStatus::Created),
            (4, "d".into(), OrderStatus::Created),
        ]
    );
    let events = store.events(SKU).await.unwrap();
    assert_eq!(events.len(), 5);
    let c = store.sale(SKU).await.unwrap().unwrap().counters;
    assert_eq!((c.available, c.sold, c.seq), (6, 4, 5));
    // A redelivery of both batches changes nothing.
    let again = store.apply_events(SKU, &second).await.unwrap();
    assert_eq!((again.applied, again.duplicates), (0, 3));
}
