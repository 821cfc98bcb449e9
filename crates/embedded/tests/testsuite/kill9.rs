//! An accepted purchase survives kill -9: a child process (this test binary, re-run on its
//! ignored entry point) buys as fast as it can and prints every accepted order; the parent
//! SIGKILLs it mid-stream, reopens the file and finds every printed order, and the stored
//! sale keeps I1–I7.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use flashsale_core::invariants::check_sale;
use flashsale_core::{
    HotCopies, HotLedger, HotPurchases, OrderNo, OrderStore, PurchaseOutcome, Sale, SaleMode,
    SaleState, SkuId,
};
use flashsale_embedded::EmbeddedLedger;
use flashsale_store::SqliteStore;
use flashsale_testkit::conformance::{now_ms, req};

const SKU: SkuId = SkuId(4242);
const CHILD_ENV: &str = "FLASHSALE_KILL9_CHILD_DB";

fn sale() -> Sale {
    let now = now_ms();
    Sale {
        sku_id: SKU,
        name: "kill9".into(),
        total_stock: 1_000_000,
        per_user_limit: 1,
        mode: SaleMode::Direct,
        payment_timeout_ms: 0,
        starts_at_ms: now - 3_600_000,
        ends_at_ms: now + 3_600_000,
        state: SaleState::Live,
        buckets: 1,
        admission: Default::default(),
    }
}

/// The child: buys in batches of 8 forever, printing each accepted order as it is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "entry point of the child process of accepted_purchases_survive_kill_9"]
async fn kill9_child() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let store = Arc::new(SqliteStore::open(&path).await.expect("open"));
    let ledger = EmbeddedLedger::open(store).await.expect("ledger");
    let s = sale();
    ledger.warm(&s, &s.fresh_counters(), 1).await.expect("warm");
    println!("READY");
    let mut user = 0u64;
    loop {
        let reqs: Vec<_> = (0..8)
            .map(|_| {
                user += 1;
                req(SKU, user, "r", 1)
            })
            .collect();
        let out = ledger.purchase_batch(SKU, &reqs).await.expect("batch");
        for o in out {
            if let PurchaseOutcome::Accepted { order, .. } = o {
                println!("ACCEPTED {}", order.order_no);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_purchases_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kill9.db");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "kill9::kill9_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().unwrap();
    // Read until enough orders were answered, then SIGKILL mid-stream.
    // The pipe stays open until after the kill, so the child dies of SIGKILL, not of EPIPE.
    let (accepted, reader) = tokio::task::spawn_blocking(move || {
        let mut reader = BufReader::new(stdout);
        let mut accepted = Vec::new();
        let mut line = String::new();
        while accepted.len() < 400 {
            line.clear();
            if reader.read_line(&mut line).expect("child output") == 0 {
                break; // the child ended early
            }
            if let Some(no) = line.trim_end().strip_prefix("ACCEPTED ") {
                accepted.push(OrderNo::parse(no).expect("order number"));
            }
        }
        (accepted, reader)
    })
    .await
    .unwrap();
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
    drop(reader);
    assert_eq!(accepted.len(), 400, "the child answered purchases");

    let store = Arc::new(SqliteStore::open(path.to_str().unwrap()).await.unwrap());
    let ledger = EmbeddedLedger::open(store.clone()).await.unwrap();
    for no in &accepted {
        assert!(
            store.order(no).await.unwrap().is_some(),
            "answered order {no} lost by kill -9"
        );
        assert!(ledger.order(no).await.unwrap().is_some());
    }
    let s = store.sale(SKU).await.unwrap().unwrap();
    assert!(s.counters.sold >= 400);
    let orders = store.orders(SKU).await.unwrap();
    let events = store.events(SKU).await.unwrap();
    let report = check_sale(&s.sale, &s.counters, &orders, &events, true);
    assert!(report.is_ok(), "{:?}", report.violations);
    assert_eq!(ledger.counters(SKU).await.unwrap(), Some(s.counters));
}
