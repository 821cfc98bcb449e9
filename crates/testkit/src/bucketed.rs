//! Conformance checks of sales of several buckets, for every ledger that holds them
//! (`HotLedger::buckets_max`); a ledger that holds fewer skips them (it refuses such sales,
//! which `conformance::a_bucketed_sale_is_held_whole_or_refused` checks). Each asks the
//! ledger only through the `Ledger` traits, so the embedded ledger (one book), one Redis and
//! a cluster answer the same checks.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use flashsale_core::buckets::home_bucket;
use flashsale_core::{
    BucketLoad, BucketTransfers, Counters, ErrorCode, HotCopies, Ledger, OrderNo, PurchaseOutcome,
    PurchaseRequest, Sale, SaleMode, SaleState, UserId,
};
use rand::Rng;

use crate::conformance::{
    buy_ok, buy_refused, concurrent_batches, counters, live_sale, run_batches, stock, warm,
};

/// How the buyers of a check fall over the buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// Every user id in turn: about as many buyers at each bucket.
    Uniform,
    /// Four buyers in five homed at bucket 0.
    Skewed,
    /// Every buyer homed at the last bucket (the one with the smallest initial share).
    OneHome,
}

pub const SPREADS: [Spread; 3] = [Spread::Uniform, Spread::Skewed, Spread::OneHome];

/// `count` user ids (from a random base, so checks never share buyers) spread over `n`
/// buckets as `spread` says.
pub fn buyers(n: u16, count: usize, spread: Spread) -> Vec<u64> {
    let base = rand::rng().random_range(1..=1u64 << 40);
    // Skewed: of the users homed elsewhere, one in 4·(n − 1) is kept, so bucket 0 has
    // k / (k + n − 1) = 4/5 of the buyers.
    let every = 4 * u64::from(n - 1).max(1);
    let mut elsewhere = 0u64;
    (base..)
        .filter(|&user| {
            let home = home_bucket(UserId(user), n);
            match spread {
                Spread::Uniform => true,
                Spread::Skewed if home == 0 => true,
                Spread::Skewed => {
                    elsewhere += 1;
                    elsewhere.is_multiple_of(every)
                }
                Spread::OneHome => home == n - 1,
            }
        })
        .take(count)
        .collect()
}

/// A bucket's counters with nothing reserved (a direct sale's): `total` units, `available` of
/// them left and `sold`, after `seq` events.
pub fn direct_counters(total: u64, available: u64, sold: u64, seq: u64) -> Counters {
    Counters {
        total,
        available,
        reserved: 0,
        sold,
        seq,
    }
}

/// A live direct sale of `total` units over `n` buckets.
pub fn bucketed_sale(mode: SaleMode, total: u64, limit: u32, n: u16) -> Sale {
    Sale {
        buckets: n,
        ..live_sale(mode, total, limit)
    }
}

/// Rebuilds `bucket` of a live `sale` by hand, as the reconciler would from a row of one unit
/// that never stored what the bucket sold: fenced, loaded at `epoch` with no transfers, opened.
pub async fn rebuild_with_one_unit(ledger: &dyn HotCopies, sale: &Sale, bucket: u16, epoch: u64) {
    let sku = sale.sku_id;
    assert!(ledger.fence_bucket(sku, bucket).await.unwrap(), "fenced");
    let load = BucketLoad {
        sale,
        bucket,
        counters: &direct_counters(1, 1, 0, 0),
        epoch,
        transfers: &BucketTransfers::default(),
    };
    ledger.load_bucket(load).await.unwrap();
    let opened = ledger.open_bucket(load, SaleState::Live);
    opened.await.unwrap();
}

/// Runs every check of this module that `ledger` can hold.
pub async fn run_all(ledger: Arc<dyn Ledger>) {
    let l = ledger.as_ref();
    no_false_sold_out_when_every_buyer_shares_one_home(l).await;
    holds_resolve_at_their_bucket_and_come_back_anywhere(l).await;
    bucketed_sales_sell_exactly_their_stock(ledger.clone()).await;
}

/// One buyer after another, all homed at one bucket of three: every unit of the sale is
/// sold to them (none answered SOLD_OUT while another bucket holds it), then SOLD_OUT.
pub async fn no_false_sold_out_when_every_buyer_shares_one_home(ledger: &dyn Ledger) {
    if ledger.buckets_max() < 3 {
        return;
    }
    let sale = bucketed_sale(SaleMode::Direct, 30, 1, 3);
    let sku = warm(ledger, &sale).await;
    let users = buyers(3, 31, Spread::OneHome);
    for &user in &users[..30] {
        buy_ok(ledger, sku, user, "a", 1).await;
    }
    buy_refused(ledger, sku, users[30], "a", 1, ErrorCode::SoldOut).await;
    assert_eq!(stock(ledger, sku).await, (0, 0, 30, 30));
}

/// Reserve mode over three buckets: holds taken at one home (stock brought there), paid,
/// cancelled and expired at the bucket that sold them; the units that come back are sold
/// again to buyers homed at the other buckets.
pub async fn holds_resolve_at_their_bucket_and_come_back_anywhere(ledger: &dyn Ledger) {
    if ledger.buckets_max() < 3 {
        return;
    }
    let sale = bucketed_sale(SaleMode::Reserve, 4, 1, 3);
    let sku = warm(ledger, &sale).await;
    let users = buyers(3, 4, Spread::OneHome);
    let mut holds = Vec::new();
    for &user in &users {
        holds.push(buy_ok(ledger, sku, user, "a", 1).await);
    }
    let others = buyers(3, 200, Spread::Uniform);
    let elsewhere: Vec<u64> = others
        .into_iter()
        .filter(|&u| home_bucket(UserId(u), 3) != 2)
        .take(3)
        .collect();
    // Paid and cancelled well within the payment timeout; the other two holds expire.
    let paid = ledger.pay(&holds[0].order_no, UserId(users[0])).await;
    assert!(
        matches!(paid, Ok(Ok(_))),
        "pay at the order's bucket: {paid:?}"
    );
    let cancelled = ledger.cancel(&holds[1].order_no, UserId(users[1])).await;
    assert!(matches!(cancelled, Ok(Ok(_))), "cancel: {cancelled:?}");
    crate::conformance::expire_until(ledger, sku, 2).await;
    assert_eq!(stock(ledger, sku).await.0, 3, "three units back");
    for &user in &elsewhere {
        buy_ok(ledger, sku, user, "b", 1).await;
    }
    let c = counters(ledger, sku).await;
    assert_eq!((c.available, c.reserved, c.sold), (0, 3, 1));
}

/// 10× more units asked than the sale holds, over 3 and 7 buckets, for each spread of
/// buyers; concurrent batches with retries. The sale sells exactly its stock (no oversell,
/// no unit left behind in a bucket), at most the limit per buyer, and every retry is
/// answered with its first outcome.
pub async fn bucketed_sales_sell_exactly_their_stock(ledger: Arc<dyn Ledger>) {
    for n in [3u16, 7] {
        if ledger.buckets_max() < n {
            return;
        }
        for spread in SPREADS {
            sells_exactly(ledger.clone(), n, spread).await;
        }
    }
}

const STOCK: u64 = 200;
const LIMIT: u32 = 2;

async fn sells_exactly(ledger: Arc<dyn Ledger>, n: u16, spread: Spread) {
    let sale = bucketed_sale(SaleMode::Direct, STOCK, LIMIT, n);
    let sku = warm(ledger.as_ref(), &sale).await;
    let batches = concurrent_batches(sku, buyers(n, 1_000, spread), LIMIT);
    let answers = run_batches(ledger.clone(), sku, batches).await;
    let orders = first_outcomes(&answers);
    let c = counters(ledger.as_ref(), sku).await;
    let context = format!("{n} buckets, {spread:?}: {c:?}");
    assert_eq!((c.sold, c.available), (STOCK, 0), "exact stock: {context}");
    let mut units_of: HashMap<UserId, u64> = HashMap::new();
    for no in &orders {
        let order = ledger.order(no).await.expect("order").expect("known");
        *units_of.entry(order.user_id).or_default() += u64::from(order.quantity);
    }
    assert_eq!(units_of.values().sum::<u64>(), STOCK, "orders: {context}");
    assert!(
        units_of.values().all(|&u| u <= u64::from(LIMIT)),
        "I3: {context}"
    );
}

/// The order of each accepted request, checking that every answer to it named the same one
/// (I4) and that only SOLD_OUT and LIMIT_EXCEEDED refused anything.
fn first_outcomes(answers: &[(PurchaseRequest, PurchaseOutcome)]) -> HashSet<OrderNo> {
    let mut first: HashMap<(UserId, String), OrderNo> = HashMap::new();
    for (r, outcome) in answers {
        let PurchaseOutcome::Accepted { order, .. } = outcome else {
            let ok = [ErrorCode::SoldOut, ErrorCode::LimitExceeded].map(Some);
            assert!(ok.contains(&outcome.code()), "unexpected {outcome:?}");
            continue;
        };
        let key = (r.user_id, r.request_id.as_str().to_owned());
        let no = first.entry(key).or_insert(order.order_no);
        assert_eq!(*no, order.order_no, "I4: a retry answered another order");
    }
    let orders: HashSet<OrderNo> = first.values().copied().collect();
    assert_eq!(orders.len(), first.len(), "I8: two requests share an order");
    orders
}
