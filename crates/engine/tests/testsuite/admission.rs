//! Admission end to end on each place its state lives, with the hot ledger it goes with: the
//! embedded ledger with its SQLite database, and the Redis ledger (the state in the sale's
//! slot) on the shared Redis. The engine runs in process (no HTTP): a queue sells exactly the
//! stock to admitted buyers in the published order and tells every other buyer it sold out;
//! a draw's winners are recomputed by the independent script and get their reservations, and
//! a cancelled one passes down the waitlist.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale_core::admission::{self, pass, AdmissionBook, Entry, GroupJoin, Ticket};
use flashsale_core::clock::now_ms;
use flashsale_core::{
    Admission as AdmissionFields, AdmissionMode, ErrorCode, Ledger, PurchaseOutcome, Sale,
    SaleMode, SaleState, SkuId, UserId,
};
use flashsale_embedded::EmbeddedLedger;
use flashsale_engine::admission::grouped::{GroupedBook, GROUP_MAX, REDIS_GROUP_MAX};
use flashsale_engine::admission::walker::DrawWalker;
use flashsale_engine::admission::{Admission, AdmissionConfig, QueueState};
use flashsale_engine::runner;
use flashsale_engine::workers::ExpiryWorker;
use flashsale_redis::RedisLedger;
use flashsale_store::SqliteStore;
use flashsale_testkit::conformance::req;
use flashsale_testkit::redis_server::{shared_url, unique_prefix};

const SECRET: &[u8] = b"admission-test-secret";

/// Held by each run of 100,000 buyers: they run one at a time (on two cores, two of them at
/// once starve each other's Redis calls past their timeouts).
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const LIMIT: Duration = Duration::from_secs(120);

/// A ledger and the admission book that goes with it.
struct Place {
    ledger: Arc<dyn Ledger>,
    book: Arc<dyn AdmissionBook>,
    _dir: Option<tempfile::TempDir>,
}

async fn embedded() -> Place {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flashsale.db");
    let store = Arc::new(SqliteStore::open(path.to_str().unwrap()).await.unwrap());
    let ledger = Arc::new(EmbeddedLedger::open(store.clone()).await.unwrap());
    Place {
        ledger,
        book: Arc::new(GroupedBook::new(store, GROUP_MAX)),
        _dir: Some(dir),
    }
}

async fn redis() -> Place {
    let ledger = RedisLedger::connect(&shared_url(), &unique_prefix())
        .await
        .unwrap();
    let book = Arc::new(GroupedBook::new(
        Arc::new(ledger.admission()),
        REDIS_GROUP_MAX,
    ));
    Place {
        ledger: Arc::new(ledger),
        book,
        _dir: None,
    }
}

fn queue_sale(sku: u64, stock: u64, starts_at_ms: i64) -> Sale {
    Sale {
        admission: AdmissionFields {
            mode: AdmissionMode::Queue,
            admission_opens_at_ms: 0,
            draw_at_ms: 0,
        },
        starts_at_ms,
        ..Sale::always_open(SkuId(sku), stock)
    }
}

/// Joins `users` concurrently, each twice: the second join answers the first ticket.
async fn join_all(adm: &Arc<Admission>, sale: &Sale, users: &[UserId]) -> Vec<Ticket> {
    let mut tickets = Vec::new();
    for chunk in users.chunks(256) {
        let joins = chunk.iter().map(|&u| {
            let (adm, sale) = (adm.clone(), sale.clone());
            async move {
                let first = adm.join(&sale, u, now_ms()).await.unwrap();
                let again = adm.join(&sale, u, now_ms()).await.unwrap();
                assert_eq!(first, again, "a second join keeps the place");
                first
            }
        });
        tickets.extend(futures::future::join_all(joins).await);
    }
    tickets
}

/// What a run of a queue saw.
#[derive(Default)]
struct Seen {
    /// Buyer → its place when admitted.
    admitted: HashMap<UserId, u64>,
    bought: HashSet<UserId>,
    sold_out: HashSet<UserId>,
    places: HashMap<UserId, u64>,
    seed: Option<String>,
}

/// Every buyer polls its place until it bought or heard SOLD_OUT; each admitted buyer buys one
/// unit with its pass. The ledger is only asked with a pass the service checked.
async fn poll_until_settled(adm: &Admission, place: &Place, sale: &Sale, users: &[UserId]) -> Seen {
    let mut seen = Seen::default();
    let deadline = Instant::now() + LIMIT;
    let key = pass::key(SECRET);
    while seen.bought.len() + seen.sold_out.len() < users.len() {
        assert!(Instant::now() < deadline, "the queue did not settle");
        let c = place.ledger.counters(sale.sku_id).await.unwrap().unwrap();
        for &u in users {
            if seen.bought.contains(&u) || seen.sold_out.contains(&u) {
                continue;
            }
            let s = adm.status(sale, u, &c).await.unwrap().expect("joined");
            if let Some(p) = s.place {
                assert_eq!(*seen.places.entry(u).or_insert(p), p, "a place never moves");
                seen.seed = s.seed.clone();
            }
            match s.state {
                QueueState::Admitted => {
                    let p = s.place.unwrap();
                    assert_eq!(*seen.admitted.entry(u).or_insert(p), p, "admitted once");
                    let text = s.pass.unwrap();
                    adm.check_pass(sale, u, Some(&text), now_ms()).unwrap();
                    let other =
                        adm.check_pass(sale, UserId(u.0 + 1_000_000), Some(&text), now_ms());
                    assert_eq!(other.unwrap_err().code(), ErrorCode::AdmissionRequired);
                    let until = s.admitted_until_ms.unwrap();
                    assert_eq!(
                        pass::verify(&key, &text, sale.sku_id, u, now_ms()),
                        Ok(until)
                    );
                    let out = place
                        .ledger
                        .purchase_batch(sale.sku_id, &[req(sale.sku_id, u.0, "buy", 1)])
                        .await
                        .unwrap();
                    match &out[0] {
                        PurchaseOutcome::Accepted { .. } => {
                            adm.bought(sale, u).await.unwrap();
                            seen.bought.insert(u);
                        }
                        PurchaseOutcome::Rejected(ErrorCode::SoldOut) => {}
                        other => panic!("purchase of an admitted buyer: {other:?}"),
                    }
                }
                QueueState::SoldOut => {
                    seen.sold_out.insert(u);
                }
                QueueState::Waiting | QueueState::PreQueue => {}
                QueueState::Lapsed => panic!("no admission lapses in this run"),
            }
        }
    }
    seen
}

/// The admission over `place` ticking every `tick_ms`, and the ledger's copy of the sale open
/// from 0 (the admission's start is set by the sale a test passes: far ahead while the
/// pre-queue joins, then now).
async fn warmed(place: &Place, sku: u64, stock: u64, tick_ms: u64) -> Arc<Admission> {
    let config = AdmissionConfig {
        tick: Duration::from_millis(tick_ms),
        ..AdmissionConfig::default()
    };
    let open = Sale::always_open(SkuId(sku), stock);
    place
        .ledger
        .warm(&open, &open.fresh_counters(), 1)
        .await
        .unwrap();
    Arc::new(Admission::new(place.book.clone(), SECRET, config))
}

/// A queue of `pre` buyers joining before the start and `after` joining after it, for
/// `stock` units: exactly the stock is sold, to the buyers of the first places; the pre-queue
/// is the published shuffle of the revealed seed and later joins follow it in join order;
/// every other buyer hears SOLD_OUT; nothing is bought without a pass.
async fn queue_sells_the_stock_in_the_published_order(
    place: Place,
    sku: u64,
    pre: u64,
    after: u64,
    stock: u64,
) {
    let adm = warmed(&place, sku, stock, 20).await;
    let before = queue_sale(sku, stock, now_ms() + 3_600_000);
    let pre_users: Vec<UserId> = (1..=pre).map(|u| UserId(u * 7 + 3)).collect();
    let tickets = join_all(&adm, &before, &pre_users).await;
    assert!(tickets.iter().all(|t| t.pre));
    let committed = admission::commitment(&adm.seed(SkuId(sku)).await.unwrap());

    let started = queue_sale(sku, stock, now_ms());
    let c = place.ledger.counters(SkuId(sku)).await.unwrap().unwrap();
    let s = adm
        .status(&started, pre_users[0], &c)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.seed_sha256, committed, "the commitment never changes");
    let after_users: Vec<UserId> = (1..=after).map(|u| UserId(10_000_000 + u)).collect();
    for (i, &u) in after_users.iter().enumerate() {
        let t = adm.join(&started, u, now_ms()).await.unwrap();
        assert_eq!(
            t,
            Ticket {
                pre: false,
                n: i as u64 + 1
            },
            "after the start: join order"
        );
    }
    let refused = adm.check_pass(&started, pre_users[0], None, now_ms());
    assert_eq!(refused.unwrap_err().code(), ErrorCode::AdmissionRequired);

    let all: Vec<UserId> = pre_users.iter().chain(&after_users).copied().collect();
    let seen = poll_until_settled(&adm, &place, &started, &all).await;

    let c = place.ledger.counters(SkuId(sku)).await.unwrap().unwrap();
    let sold = stock.min(pre + after);
    assert_eq!(
        (c.sold, c.available),
        (sold, stock - sold),
        "exactly the stock sold"
    );
    assert_eq!(seen.bought.len() as u64, sold);
    // The order: the revealed seed hashes to the commitment, and recomputes every place.
    let seed = admission::seed_from_hex(seen.seed.as_deref().unwrap()).unwrap();
    assert_eq!(admission::commitment(&seed), committed);
    let expected: Vec<UserId> = admission::shuffle(&seed, &pre_users)
        .into_iter()
        .chain(after_users.iter().copied())
        .collect();
    for (i, u) in expected.iter().enumerate() {
        assert_eq!(seen.places.get(u), Some(&(i as u64 + 1)), "place of {u:?}");
    }
    // Admission went down the queue in order (every place seen admitted is within the
    // cursor), only admitted buyers bought, and the waves overshot the window by no more than
    // the purchases made while the counters they read were stale (at most the stock).
    let cursor = place.book.counts(SkuId(sku), 0).await.unwrap().cursor;
    assert!(seen.admitted.values().all(|&p| p <= cursor));
    assert!(seen.bought.iter().all(|u| seen.admitted.contains_key(u)));
    assert!(
        cursor <= admission::wave_window(stock) + stock,
        "cursor {cursor}"
    );
    assert_eq!(
        seen.sold_out.len() as u64,
        pre + after - sold,
        "the rest heard SOLD_OUT"
    );
    let c = place.ledger.counters(SkuId(sku)).await.unwrap().unwrap();
    let late = adm
        .status(&started, expected[expected.len() - 1], &c)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(late.state, QueueState::SoldOut);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_on_the_embedded_ledger() {
    queue_sells_the_stock_in_the_published_order(embedded().await, 1, 300, 50, 40).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_on_redis() {
    queue_sells_the_stock_in_the_published_order(redis().await, 2, 1_000, 200, 150).await;
}

/// A group of joins answers what the same joins one by one answer: a user already in the
/// queue, or twice in the group, keeps its first ticket; past the queue's bound, `None`.
async fn a_group_answers_as_single_joins(place: Place, sku: u64) {
    let (book, sku) = (&place.book, SkuId(sku));
    book.commit_seed(sku, &[7; 32]).await.unwrap();
    let later = now_ms() + 3_600_000;
    let j = |u| GroupJoin {
        user: UserId(u),
        starts_at_ms: later,
        len_max: 4,
    };
    let first = book.join(sku, j(1)).await.unwrap();
    let group = [j(2), j(1), j(3), j(2), j(4), j(5)];
    let got = book.join_group(sku, &group).await.unwrap();
    let pre = |n| Some(Ticket { pre: true, n });
    assert_eq!(first, pre(1));
    assert_eq!(got, vec![pre(2), pre(1), pre(3), pre(2), pre(4), None]);
    assert_eq!(book.prequeue(sku).await.unwrap().len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_joins_on_the_embedded_ledger() {
    a_group_answers_as_single_joins(embedded().await, 901).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_joins_on_redis() {
    a_group_answers_as_single_joins(redis().await, 902).await;
}

fn draw_sale(sku: u64, stock: u64, draw_at_ms: i64) -> Sale {
    Sale {
        mode: SaleMode::Reserve,
        payment_timeout_ms: 600_000,
        per_user_limit: 2,
        admission: AdmissionFields {
            mode: AdmissionMode::Draw,
            admission_opens_at_ms: 0,
            draw_at_ms,
        },
        ..Sale::always_open(SkuId(sku), stock)
    }
}

/// The admission over `place` (the default configuration) and the ledger's copy of the
/// draw sale `open` warmed.
async fn warmed_draw(place: &Place, open: &Sale) -> Arc<Admission> {
    place
        .ledger
        .warm(open, &open.fresh_counters(), 1)
        .await
        .unwrap();
    let config = AdmissionConfig::default();
    Arc::new(Admission::new(place.book.clone(), SECRET, config))
}

/// A draw of `n` entries for `stock` units: the published winners are what the independent
/// script recomputes from the revealed seed; each winner holds its reservation; a cancelled
/// one passes its units down the waitlist; every result is readable.
async fn draw_is_recomputable_and_passes_down(place: Place, sku: u64, n: u64, stock: u64) {
    let open = draw_sale(sku, stock, now_ms() + 3_600_000);
    let adm = warmed_draw(&place, &open).await;
    for chunk in (1..=n).collect::<Vec<_>>().chunks(256) {
        let entries = chunk.iter().map(|&u| {
            let (adm, sale) = (adm.clone(), open.clone());
            async move {
                let q = (u % 2 + 1) as u32;
                let (e, new) = adm.enter(&sale, UserId(u), q).await.unwrap();
                assert!(new);
                let (again, new) = adm.enter(&sale, UserId(u), 1).await.unwrap();
                assert_eq!((again, new), (e, false), "one entry per user");
            }
        });
        futures::future::join_all(entries).await;
    }
    let over = adm.enter(&open, UserId(n + 1), 3).await.unwrap_err();
    assert_eq!(
        over.code(),
        ErrorCode::InvalidRequest,
        "quantity within the limit"
    );
    let before = adm.draw_view(&open).await.unwrap();
    assert!(
        before.seed.is_none() && before.winners.is_none(),
        "nothing revealed before"
    );

    let drawn = draw_sale(sku, stock, now_ms());
    let late = adm.enter(&drawn, UserId(n + 2), 1).await.unwrap_err();
    assert_eq!(late.code(), ErrorCode::Ended, "the window closed");
    let started = Instant::now();
    adm.walk(&drawn, place.ledger.as_ref()).await.unwrap();
    let view = adm.draw_view(&drawn).await.unwrap();
    assert_eq!(view.seed_sha256, before.seed_sha256);
    verify_with_script(&serde_json::to_value(&view).unwrap());

    let winners = view.winners.clone().unwrap();
    let won: u64 = winners.iter().map(|e| u64::from(e.quantity)).sum();
    let c = place.ledger.counters(SkuId(sku)).await.unwrap().unwrap();
    assert_eq!(c.reserved, won, "every winner holds its reservation");
    assert_eq!(won, stock, "entries of one unit fill the last unit");
    let mut orders = Vec::new();
    for w in &winners {
        let r = adm
            .my_entry(&drawn, w.user_id, place.ledger.as_ref())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.result, "won");
        orders.push((w.user_id, r.order_no.unwrap()));
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "results within 60 s"
    );

    // Two winners cancel: their units pass to the next entries that fit.
    for (user, no) in orders.iter().take(2) {
        let no = flashsale_core::OrderNo::parse(no).unwrap();
        let cancelled = place.ledger.cancel(&no, *user).await.unwrap();
        assert!(cancelled.is_ok(), "{cancelled:?}");
    }
    adm.walk(&drawn, place.ledger.as_ref()).await.unwrap();
    let c = place.ledger.counters(SkuId(sku)).await.unwrap().unwrap();
    assert_eq!(
        (c.reserved, c.available),
        (stock, 0),
        "the waitlist took the units back"
    );
    let entries: Vec<Entry> = view.entries.unwrap();
    assert_eq!(entries.len() as u64, n);
    results_are_truthful(
        &adm,
        &place,
        &drawn,
        (&entries, &winners),
        &orders[..2],
        stock,
    )
    .await;
}

/// After two winners cancelled and the walk passed their units on: each of the two reads
/// `cancelled`, and the entries reading `won` hold exactly the stock, some of them promoted
/// from the waitlist.
async fn results_are_truthful(
    adm: &Admission,
    place: &Place,
    sale: &Sale,
    (entries, winners): (&[Entry], &[Entry]),
    cancelled: &[(UserId, String)],
    stock: u64,
) {
    let cancelled: HashSet<UserId> = cancelled.iter().map(|(u, _)| *u).collect();
    let first_round: HashSet<UserId> = winners.iter().map(|e| e.user_id).collect();
    let mut won = 0u64;
    let mut promoted = 0;
    for e in entries {
        let r = adm
            .my_entry(sale, e.user_id, place.ledger.as_ref())
            .await
            .unwrap()
            .unwrap();
        if cancelled.contains(&e.user_id) {
            assert_eq!(r.result, "cancelled", "a cancelled winner: {r:?}");
            continue;
        }
        if r.result == "won" {
            won += u64::from(e.quantity);
            promoted += usize::from(!first_round.contains(&e.user_id));
        }
    }
    assert_eq!(won, stock, "the entries reading won hold the stock");
    assert!(promoted > 0, "a promoted entry reads won");
}

/// Runs `scripts/draw-verify.py` on a published draw: it must recompute the same winners.
fn verify_with_script(draw: &serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("draw.json");
    std::fs::write(&path, serde_json::to_vec(draw).unwrap()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/draw-verify.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "draw-verify.py: {text}");
    assert!(text.starts_with("OK"), "{text}");
    // And it catches a forged list: the last winner swapped for a loser.
    let mut forged = draw.clone();
    let winners = forged["winners"].as_array_mut().unwrap();
    if let Some(last) = winners.last_mut() {
        last["user_id"] = serde_json::json!(u64::MAX);
        std::fs::write(&path, serde_json::to_vec(&forged).unwrap()).unwrap();
        let out = std::process::Command::new("python3")
            .arg(script)
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "a forged winner list passes the check"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draw_on_the_embedded_ledger() {
    draw_is_recomputable_and_passes_down(embedded().await, 3, 400, 60).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draw_on_redis() {
    draw_is_recomputable_and_passes_down(redis().await, 4, 2_000, 300).await;
}

/// Runs `f` over `items`, `width` at a time.
async fn each<T: Copy, F, Fut>(items: &[T], width: usize, f: F)
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for chunk in items.chunks(width) {
        futures::future::join_all(chunk.iter().map(|&t| f(t))).await;
    }
}

/// `n` buyers join the pre-queue, the start shuffles them, admitted buyers buy one unit each
/// with their pass, in place order as they are admitted: exactly the stock is sold, no place is
/// admitted to two buyers, nothing is bought without a pass the service checked, and once the
/// stock is gone every buyer (admitted or waiting) is told SOLD_OUT by the next read.
async fn many_joiners(place: Place, sku: u64, n: u64, stock: u64) {
    let _heavy = HEAVY.lock().await;
    let adm = warmed(&place, sku, stock, 10).await;
    let before = queue_sale(sku, stock, now_ms() + 3_600_000);
    let users: Vec<UserId> = (1..=n).map(UserId).collect();
    let joined = Instant::now();
    each(&users, 512, |u| {
        let (adm, before) = (adm.clone(), before.clone());
        async move {
            assert!(adm.join(&before, u, now_ms()).await.unwrap().pre);
        }
    })
    .await;
    let joined = joined.elapsed();
    assert!(joined < LIMIT, "{n} joins took {joined:?}");

    let started = queue_sale(sku, stock, now_ms());
    let c = place.ledger.counters(SkuId(sku)).await.unwrap().unwrap();
    let first = adm.status(&started, users[0], &c).await.unwrap().unwrap();
    let seed = admission::seed_from_hex(first.seed.as_deref().unwrap()).unwrap();
    let order = admission::shuffle(&seed, &users);
    let place_of: HashMap<UserId, u64> = order.iter().zip(1..).map(|(&u, p)| (u, p)).collect();
    let sold_by = std::sync::Mutex::new(HashMap::<UserId, u64>::new());
    let deadline = Instant::now() + LIMIT;
    let mut next = 0usize;
    let mut c = c;
    while c.available > 0 {
        assert!(Instant::now() < deadline, "the queue did not sell out");
        let window = admission::wave_window(admission::sellable_units(&c)) as usize;
        let polled = &order[next..(next + 2 * window.max(1)).min(order.len())];
        each(polled, 256, |u| {
            let (adm, sale, ledger, sold_by) =
                (adm.clone(), started.clone(), place.ledger.clone(), &sold_by);
            let expected = place_of[&u];
            async move {
                let s = adm.status(&sale, u, &c).await.unwrap().unwrap();
                assert_eq!(s.place, Some(expected), "one place per buyer");
                if s.state != QueueState::Admitted {
                    return;
                }
                adm.check_pass(&sale, u, s.pass.as_deref(), now_ms())
                    .unwrap();
                let rid = format!("q{}", u.0);
                let out = ledger
                    .purchase_batch(sale.sku_id, &[req(sale.sku_id, u.0, &rid, 1)])
                    .await
                    .unwrap();
                if matches!(
                    out[0],
                    PurchaseOutcome::Accepted {
                        replayed: false,
                        ..
                    }
                ) {
                    adm.bought(&sale, u).await.unwrap();
                    assert!(
                        sold_by.lock().unwrap().insert(u, expected).is_none(),
                        "bought twice"
                    );
                }
            }
        })
        .await;
        let counts = place.book.counts(SkuId(sku), 0).await.unwrap();
        next = (counts.cursor as usize).min(next + polled.len());
        c = place.ledger.counters(SkuId(sku)).await.unwrap().unwrap();
    }
    let sold_out_at = Instant::now();
    let sold_by = sold_by.into_inner().unwrap();
    assert_eq!(
        (c.sold, sold_by.len() as u64),
        (stock, stock),
        "exactly the stock"
    );
    let cursor = place.book.counts(SkuId(sku), 0).await.unwrap().cursor;
    assert!(
        sold_by.values().all(|&p| p <= cursor),
        "only admitted places bought"
    );

    // Every buyer hears SOLD_OUT at its next read.
    let told = std::sync::atomic::AtomicU64::new(0);
    each(&users, 256, |u| {
        let (adm, sale, told) = (adm.clone(), started.clone(), &told);
        async move {
            let s = adm.status(&sale, u, &c).await.unwrap().unwrap();
            assert_eq!(s.state, QueueState::SoldOut);
            told.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    })
    .await;
    assert_eq!(told.into_inner(), n);
    let tell = sold_out_at.elapsed();
    println!(
        "{n} joiners joined in {joined:?}; all {n} told SOLD_OUT within {tell:?} of the last unit"
    );
    assert!(tell < LIMIT, "sold out told within {LIMIT:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_joiners_on_redis() {
    many_joiners(redis().await, 5, 100_000, 1_000).await;
}

/// The embedded ledger's book commits the joins that queue up behind a commit together (one
/// synced SQLite transaction per group), so 100,000 joiners fit in the debug suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_joiners_on_the_embedded_ledger() {
    many_joiners(embedded().await, 7, 100_000, 1_000).await;
}

/// 100,000 entries for 1,000 units: the independent script recomputes the published
/// winners, every winner's reservation is made, and the results (every winner's, and 5,000
/// others') are readable within 60 s of the window's close.
async fn a_draw_of_a_hundred_thousand_entries(place: Place, sku: u64) {
    let (n, stock) = (100_000u64, 1_000u64);
    let _heavy = HEAVY.lock().await;
    let open = draw_sale(sku, stock, now_ms() + 3_600_000);
    let adm = warmed_draw(&place, &open).await;
    let users: Vec<UserId> = (1..=n).map(UserId).collect();
    each(&users, 512, |u| {
        let (adm, sale) = (adm.clone(), open.clone());
        async move {
            assert!(adm.enter(&sale, u, (u.0 % 2 + 1) as u32).await.unwrap().1);
        }
    })
    .await;
    let drawn = draw_sale(sku, stock, now_ms());
    let closed = Instant::now();
    let t = Instant::now();
    adm.drawn(&drawn).await.unwrap().unwrap();
    println!("drawn in {:?}", t.elapsed());
    adm.walk(&drawn, place.ledger.as_ref()).await.unwrap();
    let view = adm.draw_view(&drawn).await.unwrap();
    assert_eq!(view.entry_count, n);
    let winners = view.winners.clone().unwrap();
    let won: u64 = winners.iter().map(|e| u64::from(e.quantity)).sum();
    let c = place.ledger.counters(SkuId(sku)).await.unwrap().unwrap();
    assert_eq!(
        (won, c.reserved),
        (stock, stock),
        "every winner's reservation made"
    );
    let winner_ids: Vec<UserId> = winners.iter().map(|e| e.user_id).collect();
    let others: Vec<UserId> = (1..=5_000).map(|i| UserId(i * 19 % n + 1)).collect();
    let results = std::sync::atomic::AtomicU64::new(0);
    each(
        &[winner_ids.as_slice(), others.as_slice()].concat(),
        256,
        |u| {
            let (adm, sale, ledger, results, won) = (
                adm.clone(),
                drawn.clone(),
                place.ledger.clone(),
                &results,
                &winner_ids,
            );
            async move {
                let r = adm
                    .my_entry(&sale, u, ledger.as_ref())
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(r.result == "won", won.contains(&u), "{r:?}");
                results.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        },
    )
    .await;
    let readable = closed.elapsed();
    println!(
        "draw of {n}: {} winners reserved and {} results read in {readable:?}",
        winners.len(),
        results.into_inner()
    );
    assert!(
        readable < Duration::from_secs(60),
        "results within 60 s: {readable:?}"
    );
    verify_with_script(&serde_json::to_value(&view).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draw_of_a_hundred_thousand_entries_on_redis() {
    a_draw_of_a_hundred_thousand_entries(redis().await, 8).await;
}

/// The embedded ledger's entries commit unsynced (a crash of the process keeps them), so
/// 100,000 of them fit in the debug suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draw_of_a_hundred_thousand_entries_on_the_embedded_ledger() {
    a_draw_of_a_hundred_thousand_entries(embedded().await, 9).await;
}

/// A draw whose waitlist only the background walker walks (no result or draw is read), with
/// holds of one second: the expiry worker expires the holds of the entries that never pay,
/// the walker passes their units to the next entries, the paying entries pay; the sale ends
/// with exactly its stock sold, one order per buyer.
async fn walked_in_the_background_under_expiries(place: Place, sku: u64) {
    let (n, stock) = (120u64, 12u64);
    let open = Sale {
        payment_timeout_ms: 1_000,
        ..draw_sale(sku, stock, now_ms() + 3_600_000)
    };
    let adm = warmed_draw(&place, &open).await;
    let users: Vec<UserId> = (1..=n).map(UserId).collect();
    each(&users, 64, |u| {
        let (adm, sale) = (adm.clone(), open.clone());
        async move {
            assert!(adm.enter(&sale, u, 1).await.unwrap().1);
        }
    })
    .await;
    // The sales the workers see: this one, drawn now.
    let dir = tempfile::tempdir().unwrap();
    let listing = dir.path().join("listing.db");
    let listing = Arc::new(SqliteStore::open(listing.to_str().unwrap()).await.unwrap());
    let drawn = Sale {
        admission: AdmissionFields {
            draw_at_ms: now_ms(),
            ..open.admission
        },
        ..open.clone()
    };
    let stored: &dyn flashsale_core::OrderStore = listing.as_ref();
    stored.create_sale(&drawn).await.unwrap();
    stored.set_state(SkuId(sku), SaleState::Live).await.unwrap();
    let (stop, _) = tokio::sync::broadcast::channel(1);
    let walker = DrawWalker::new(
        adm.clone(),
        place.ledger.clone(),
        listing.clone(),
        Duration::from_millis(50),
    );
    let expiry = ExpiryWorker::new(
        place.ledger.clone(),
        listing.clone(),
        Arc::new(|_| false),
        Duration::from_millis(50),
        64,
    );
    let tasks = [
        tokio::spawn(runner::run(Box::new(walker), stop.subscribe())),
        tokio::spawn(runner::run(Box::new(expiry), stop.subscribe())),
    ];
    let paid = pay_the_even_winners(&place, sku, &users, stock).await;
    stop.send(()).unwrap();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let c = place.ledger.counters(SkuId(sku)).await.unwrap().unwrap();
    assert_eq!(
        (c.sold, c.reserved, c.available),
        (stock, 0, 0),
        "exactly the stock sold"
    );
    assert_eq!(paid.len() as u64, stock, "one paid order per buyer");
    assert!(paid.iter().all(|u| u.0 % 2 == 0), "only payers bought");
}

/// Pays every even buyer's reservation as soon as the ledger has it (found by the request
/// id the walk uses, without asking the admission), until the stock is sold.
async fn pay_the_even_winners(
    place: &Place,
    sku: u64,
    users: &[UserId],
    stock: u64,
) -> HashSet<UserId> {
    use flashsale_engine::admission::draw::DRAW_REQUEST_ID;
    let sku = SkuId(sku);
    let deadline = Instant::now() + LIMIT;
    let mut paid = HashSet::new();
    loop {
        let c = place.ledger.counters(sku).await.unwrap().unwrap();
        if c.sold == stock {
            return paid;
        }
        assert!(Instant::now() < deadline, "not sold out: {c:?}");
        let unpaid: Vec<UserId> = users
            .iter()
            .copied()
            .filter(|u| u.0 % 2 == 0 && !paid.contains(u))
            .collect();
        for u in unpaid {
            let key = flashsale_core::RequestKey::new(
                u,
                flashsale_core::RequestId::parse(DRAW_REQUEST_ID).unwrap(),
            );
            if !place.ledger.is_accepted(sku, &key).await.unwrap() {
                continue;
            }
            let out = place
                .ledger
                .purchase_batch(sku, &[req(sku, u.0, DRAW_REQUEST_ID, 1)])
                .await
                .unwrap();
            let PurchaseOutcome::Accepted { order, .. } = &out[0] else {
                panic!("a replay of an accepted reservation: {out:?}");
            };
            if place.ledger.pay(&order.order_no, u).await.unwrap().is_ok() {
                assert!(paid.insert(u), "paid twice");
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draw_walked_in_the_background_sells_exactly_the_stock_under_expiries_embedded() {
    walked_in_the_background_under_expiries(embedded().await, 9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draw_walked_in_the_background_sells_exactly_the_stock_under_expiries_redis() {
    walked_in_the_background_under_expiries(redis().await, 10).await;
}
