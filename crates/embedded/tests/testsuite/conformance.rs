//! The shared conformance suite on the embedded ledger over a temp-dir SQLite file, then
//! I1–I7 from SQLite for every sale the suite created.

use std::sync::Arc;

use flashsale_core::invariants::check_sale;
use flashsale_core::{HotLedger, OrderStore};
use flashsale_embedded::EmbeddedLedger;
use flashsale_store::SqliteStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_ledger_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("flashsale.db");
    let store = Arc::new(
        SqliteStore::open(path.to_str().unwrap())
            .await
            .expect("open"),
    );
    let ledger = Arc::new(EmbeddedLedger::open(store.clone()).await.expect("ledger"));
    flashsale_testkit::conformance::run_all(ledger.clone()).await;

    // Everything the suite accepted is in SQLite and keeps the invariants. Sales warmed with
    // forced, made-up counters (epoch > 1) are left out: their counters are not the events'.
    let sales = store.sales().await.unwrap();
    assert!(sales.len() >= 10, "the suite created its sales in SQLite");
    for s in sales.iter().filter(|s| s.epoch == 1) {
        let sku = s.sale.sku_id;
        let orders = store.orders(sku).await.unwrap();
        let events = store.events(sku).await.unwrap();
        let report = check_sale(&s.sale, &s.counters, &orders, &events, true);
        assert!(report.is_ok(), "sku {sku}: {:?}", report.violations);
        // The hot counters are the committed ones.
        assert_eq!(ledger.counters(sku).await.unwrap(), Some(s.counters));
    }
    assert_eq!(ledger.kind(), "embedded");
    ledger.ping().await.unwrap();
}
