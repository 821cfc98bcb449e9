//! `flashsale demo --mode reserve`: what happens to the holds after the spike. The demo pays
//! a share of them and cancels a share over HTTP (each buyer with its own token), leaves the
//! rest to the expiry worker, waits until no hold is left, then lets later buyers reserve the
//! units that came back and pay for them. The report counts every step from the database's
//! events ([`flashsale_bench::lifecycle`]) and checks that the answers and the rows agree.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use flashsale_bench::lifecycle::{Lifecycle, Step};
use flashsale_bench::load::{self, Arrival, Buyer, Plan};
use flashsale_bench::report::Check;
use flashsale_core::{Event, EventKind, HotOrder, OrderStatus, SkuId, UserId};
use flashsale_server::auth::Auth;
use flashsale_server::Server;
use futures::StreamExt;

use crate::demo::DemoArgs;

/// What the demo did with the holds, as the service answered it.
#[derive(Debug, Default)]
pub struct Resolutions {
    /// Holds the first spike got.
    pub holds: u64,
    /// Payments and cancellations answered 200, over both waves.
    pub paid: u64,
    pub cancelled: u64,
    /// Payments or cancellations refused, by error code (a pay that lost to its expiry).
    pub refused: BTreeMap<String, u64>,
    /// Units back on sale once every first-wave hold was resolved.
    pub returned: u64,
    pub later_buyers: u64,
    /// Holds the later buyers got (each then paid).
    pub resold: u64,
}

/// What the demo does with a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Pay,
    Cancel,
    Expire,
}

/// The `i`-th of `n` holds: the first `pay_percent` paid, the next `cancel_percent` cancelled,
/// the rest left to expire (spread by position, so each share is exact to one hold).
fn fate(i: usize, n: usize, args: &DemoArgs) -> Fate {
    let pay = n * usize::from(args.pay_percent) / 100;
    let cancel = n * usize::from(args.cancel_percent) / 100;
    match i {
        i if i < pay => Fate::Pay,
        i if i < pay + cancel => Fate::Cancel,
        _ => Fate::Expire,
    }
}

/// Resolves the first spike's holds, waits for the expiries, sells the returned units again.
pub async fn run(
    server: &Server,
    base: &str,
    auth: &Auth,
    sku: u64,
    args: &DemoArgs,
    first: &[load::Record],
) -> anyhow::Result<Resolutions> {
    let holds: Vec<(u64, String)> = first
        .iter()
        .filter(|r| r.status == 202)
        .filter_map(|r| Some((r.user_id, r.order_no.clone()?)))
        .collect();
    let mut done = Resolutions {
        holds: holds.len() as u64,
        ..Resolutions::default()
    };
    let n = holds.len();
    let asks: Vec<(u64, String, Fate)> = holds
        .into_iter()
        .enumerate()
        .map(|(i, (user, no))| (user, no, fate(i, n, args)))
        .filter(|(_, _, f)| *f != Fate::Expire)
        .collect();
    resolve(base, auth, asks, args.concurrency, &mut done).await?;
    wait_for_no_holds(server, sku, args.hold_ms).await?;
    let counters = server.state.ledger.counters(SkuId(sku)).await?;
    done.returned = counters.map_or(0, |c| c.available);
    resell(base, auth, sku, args, &mut done).await?;
    Ok(done)
}

/// Pays or cancels each hold as its buyer, `concurrency` at a time.
async fn resolve(
    base: &str,
    auth: &Auth,
    asks: Vec<(u64, String, Fate)>,
    concurrency: usize,
    done: &mut Resolutions,
) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let answers: Vec<(Fate, Result<(), String>)> = futures::stream::iter(asks)
        .map(|(user, no, fate)| {
            let (http, token) = (http.clone(), auth.sign(UserId(user), 600));
            let verb = if fate == Fate::Pay { "pay" } else { "cancel" };
            let url = format!("{base}/api/v1/orders/{no}/{verb}");
            async move { (fate, answer(http.post(url).bearer_auth(token)).await) }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    for (fate, answer) in answers {
        match (answer, fate) {
            (Ok(()), Fate::Pay) => done.paid += 1,
            (Ok(()), _) => done.cancelled += 1,
            (Err(code), _) => *done.refused.entry(code).or_default() += 1,
        }
    }
    Ok(())
}

/// `Ok` for a 200, else the answer's error code (or the transport error).
async fn answer(req: reqwest::RequestBuilder) -> Result<(), String> {
    let resp = req.send().await.map_err(|e| format!("transport: {e}"))?;
    if resp.status().as_u16() == 200 {
        return Ok(());
    }
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    Err(body["code"].as_str().unwrap_or("UNKNOWN").to_owned())
}

/// Polls the hot ledger until no unit is reserved (the expiry worker has expired the rest).
async fn wait_for_no_holds(server: &Server, sku: u64, hold_ms: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_millis(hold_ms) + Duration::from_secs(30);
    loop {
        let counters = server.state.ledger.counters(SkuId(sku)).await?;
        if counters.is_none_or(|c| c.reserved == 0) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "holds still reserved 30 s past their deadline"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Later buyers, twice as many as the units that came back, reserve them and pay.
async fn resell(
    base: &str,
    auth: &Auth,
    sku: u64,
    args: &DemoArgs,
    done: &mut Resolutions,
) -> anyhow::Result<()> {
    done.later_buyers = done.returned * 2;
    if done.later_buyers == 0 {
        return Ok(());
    }
    let buyers: Vec<Buyer> = (args.users + 1..=args.users + done.later_buyers)
        .map(|u| Buyer {
            user_id: u,
            token: auth.sign(UserId(u), 600),
        })
        .collect();
    let plan = Plan {
        targets: vec![base.to_owned()],
        sku_id: sku,
        buyers,
        quantity: 1,
        concurrency: args.concurrency,
        arrival: Arrival::Spike { ramp_ms: 200 },
        timeout: Duration::from_secs(5),
        retries_max: 3,
    };
    let records = load::run(plan, || {}).await?;
    let asks: Vec<(u64, String, Fate)> = records
        .iter()
        .filter(|r| r.status == 202)
        .filter_map(|r| Some((r.user_id, r.order_no.clone()?, Fate::Pay)))
        .collect();
    done.resold = asks.len() as u64;
    resolve(base, auth, asks, args.concurrency, done).await
}

/// The steps of the sale's events: a deduction by a later buyer is a resale.
pub fn lifecycle(events: &[Event], first_wave_users: u64) -> Lifecycle {
    let steps: Vec<(i64, Step, u64)> = events
        .iter()
        .map(|e| {
            let step = match e.kind {
                EventKind::Deducted if e.user_id.0 > first_wave_users => Step::Resale,
                EventKind::Deducted => Step::Reservation,
                EventKind::Paid => Step::Payment,
                EventKind::Cancelled => Step::Cancellation,
                EventKind::Expired => Step::Expiry,
            };
            (e.at_ms, step, u64::from(e.quantity))
        })
        .collect();
    Lifecycle::from_steps(&steps)
}

/// Whether the database's orders are what the service answered: every payment and
/// cancellation answered 200 is a PAID or CANCELLED order, every other hold EXPIRED, and the
/// later buyers took every unit that came back.
pub fn checks(done: &Resolutions, orders: &[HotOrder]) -> Vec<Check> {
    let count = |s: OrderStatus| orders.iter().filter(|o| o.status == s).count() as u64;
    let (paid, cancelled, expired) = (
        count(OrderStatus::Paid),
        count(OrderStatus::Cancelled),
        count(OrderStatus::Expired),
    );
    let holds = done.holds + done.resold;
    let expected_expired = holds.saturating_sub(done.paid + done.cancelled);
    vec![
        Check {
            name: "resolutions as answered".into(),
            held: (paid, cancelled, expired) == (done.paid, done.cancelled, expected_expired),
            detail: format!(
                "database PAID {paid}, CANCELLED {cancelled}, EXPIRED {expired}; answered: paid \
                 {}, cancelled {}, left to expire {expected_expired}, refused {:?}",
                done.paid, done.cancelled, done.refused
            ),
        },
        Check {
            name: "returned units resold".into(),
            held: done.resold == done.returned.min(done.later_buyers),
            detail: format!(
                "{} units came back, {} later buyers reserved {}",
                done.returned, done.later_buyers, done.resold
            ),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        demo: DemoArgs,
    }

    #[test]
    fn shares_are_exact_to_one_hold() {
        let args = Cli::parse_from(["x", "--pay-percent", "60", "--cancel-percent", "25"]).demo;
        let fates: Vec<Fate> = (0..20).map(|i| fate(i, 20, &args)).collect();
        let n = |f| fates.iter().filter(|x| **x == f).count();
        assert_eq!((n(Fate::Pay), n(Fate::Cancel), n(Fate::Expire)), (12, 5, 3));
    }
}
