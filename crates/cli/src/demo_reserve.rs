//! `flashsale demo --mode reserve`: what happens to the holds. Each buyer of the spike acts
//! on its hold as soon as it is answered (a [`Resolver`]): a share pay, a share cancel (over
//! HTTP, each with its own token), the rest walk away and their holds expire. Once no hold is
//! left, later buyers reserve the units that came back and pay for them. On a slow machine the
//! spike may outlast a hold: units that come back during it go to the spike's own late buyers,
//! and that is a resale too. The report counts every step from the database's events
//! ([`flashsale_bench::lifecycle`]) and checks that the answers and the rows agree.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale_bench::lifecycle::{Lifecycle, Step};
use flashsale_bench::load;
use flashsale_bench::report::Check;
use flashsale_core::{Event, EventKind, HotOrder, OrderStatus, SkuId, UserId};
use flashsale_server::auth::Auth;
use flashsale_server::Server;
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::demo::DemoArgs;

/// What the demo did with the holds, as the service answered it.
#[derive(Debug, Default)]
pub struct Resolutions {
    /// Holds the first spike got.
    pub holds: u64,
    /// Units on sale: the first spike's holds past them are units that came back, resold.
    pub stock: u64,
    /// First-spike holds not paid (cancelled, left to expire, or refused): units given back.
    pub came_back: u64,
    /// Payments and cancellations answered 200, over both waves.
    pub paid: u64,
    pub cancelled: u64,
    /// Payments or cancellations refused, by error code (a pay that lost to its expiry).
    pub refused: BTreeMap<String, u64>,
    /// Units back on sale once every first-wave hold was resolved (what the spike's own late
    /// buyers did not take again).
    pub returned: u64,
    pub later_buyers: u64,
    /// Holds the later buyers got (each then paid).
    pub resold: u64,
}

/// What a buyer does with its hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Pay,
    Cancel,
    Expire,
}

/// The fate of the `i`-th hold answered: of every 100, the first `pay_percent` pay, the next
/// `cancel_percent` cancel, the rest walk away (the shares are exact per hundred holds).
fn fate(i: usize, args: &DemoArgs) -> Fate {
    let (pay, cancel) = (
        usize::from(args.pay_percent),
        usize::from(args.cancel_percent),
    );
    match i % 100 {
        k if k < pay => Fate::Pay,
        k if k < pay + cancel => Fate::Cancel,
        _ => Fate::Expire,
    }
}

/// A hold: its buyer and order number.
type Hold = (u64, String);

/// Resolves the spike's holds while the spike goes on: the load generator hands it each
/// answer ([`Resolver::on_answer`]); [`Resolver::finish`] waits for the last resolution.
pub struct Resolver {
    holds: mpsc::UnboundedSender<Hold>,
    task: tokio::task::JoinHandle<Resolutions>,
}

impl Resolver {
    /// The first spike's buyers: each hold's fate by [`fate`].
    pub fn start(base: &str, auth: Arc<Auth>, args: &DemoArgs) -> Resolver {
        let shares = args.clone();
        Resolver::with_fates(base, auth, args.concurrency, move |i| fate(i, &shares))
    }

    /// The later buyers: each pays its hold as soon as it is answered (not after the whole
    /// resale, by when the first holds may have expired).
    fn paying(base: &str, auth: Arc<Auth>, concurrency: usize) -> Resolver {
        Resolver::with_fates(base, auth, concurrency, |_| Fate::Pay)
    }

    fn with_fates(
        base: &str,
        auth: Arc<Auth>,
        concurrency: usize,
        fates: impl Fn(usize) -> Fate + Send + 'static,
    ) -> Resolver {
        // Unbounded, yet at most one message per buyer of the spike.
        let (holds, rx) = mpsc::unbounded_channel::<Hold>();
        let stream = futures::stream::unfold(rx, |mut rx| async { Some((rx.recv().await?, rx)) });
        let base = base.to_owned();
        let asks = stream
            .enumerate()
            .map(move |(i, (u, no))| (u, no, fates(i)));
        let task = tokio::spawn(async move {
            let mut done = Resolutions::default();
            done.holds = resolve(&base, &auth, asks, concurrency, &mut done).await;
            done
        });
        Resolver { holds, task }
    }

    /// The load generator's callback: every accepted purchase is a hold to act on.
    pub fn on_answer(&self) -> impl Fn(&load::Record) + Send + Sync + 'static {
        let holds = self.holds.clone();
        move |r| {
            if let (202, Some(no)) = (r.status, &r.order_no) {
                let _ = holds.send((r.user_id, no.clone()));
            }
        }
    }

    /// Waits until every hold handed over is resolved (or left to expire).
    pub async fn finish(self) -> anyhow::Result<Resolutions> {
        drop(self.holds);
        Ok(self.task.await?)
    }
}

/// After the spike: waits for the expiries, then sells the returned units again.
pub async fn after_spike(
    server: &Server,
    base: &str,
    auth: &Arc<Auth>,
    sku: u64,
    args: &DemoArgs,
    mut done: Resolutions,
) -> anyhow::Result<Resolutions> {
    done.stock = args.stock;
    done.came_back = done.holds.saturating_sub(done.paid);
    wait_for_no_holds(server, sku, args.hold_ms).await?;
    let counters = server.state.shop.ledger().counters(SkuId(sku)).await?;
    done.returned = counters.map_or(0, |c| c.available);
    resell(base, auth, sku, args, &mut done).await?;
    Ok(done)
}

/// Pays or cancels each hold as its buyer, `concurrency` at a time; the number of holds.
async fn resolve(
    base: &str,
    auth: &Auth,
    asks: impl futures::Stream<Item = (u64, String, Fate)>,
    concurrency: usize,
    done: &mut Resolutions,
) -> u64 {
    let http = reqwest::Client::new();
    let answers: Vec<(Fate, Result<(), String>)> = asks
        .map(|(user, no, fate)| {
            let (http, token) = (http.clone(), auth.sign(UserId(user), 600));
            let verb = if fate == Fate::Pay { "pay" } else { "cancel" };
            let url = format!("{base}/api/v1/orders/{no}/{verb}");
            async move {
                match fate {
                    Fate::Expire => (fate, Ok(())),
                    _ => (fate, answer(http.post(url).bearer_auth(token)).await),
                }
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let holds = answers.len() as u64;
    for (fate, answer) in answers {
        match (answer, fate) {
            (_, Fate::Expire) => {}
            (Ok(()), Fate::Pay) => done.paid += 1,
            (Ok(()), _) => done.cancelled += 1,
            (Err(code), _) => *done.refused.entry(code).or_default() += 1,
        }
    }
    holds
}

/// Tries after the first of a payment or cancellation answered 429, 503 or not at all.
const RETRIES_MAX: u32 = 3;

/// `Ok` for a 200, else the answer's error code (or the transport error). A retryable failure
/// (429, 503, transport) is retried as a client would, the same request again (a resolution
/// that went through answers its first outcome), at most [`RETRIES_MAX`] times.
async fn answer(req: reqwest::RequestBuilder) -> Result<(), String> {
    let mut tries = 0;
    loop {
        tries += 1;
        let again = req.try_clone().expect("a request without a streamed body");
        let outcome = match again.send().await {
            Err(e) => Err((true, format!("transport: {e}"))),
            Ok(resp) if resp.status().as_u16() == 200 => return Ok(()),
            Ok(resp) => {
                let retryable = matches!(resp.status().as_u16(), 429 | 503);
                let body: serde_json::Value = resp.json().await.unwrap_or_default();
                let code = body["code"].as_str().unwrap_or("UNKNOWN").to_owned();
                Err((retryable, code))
            }
        };
        match outcome {
            Err((true, _)) if tries <= RETRIES_MAX => {
                tokio::time::sleep(Duration::from_millis(20 << tries)).await;
            }
            Err((_, code)) => return Err(code),
            Ok(()) => return Ok(()),
        }
    }
}

/// Polls the hot ledger until no unit is reserved (the expiry worker has expired the rest).
async fn wait_for_no_holds(server: &Server, sku: u64, hold_ms: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_millis(hold_ms) + Duration::from_secs(30);
    loop {
        let counters = server.state.shop.ledger().counters(SkuId(sku)).await?;
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
    auth: &Arc<Auth>,
    sku: u64,
    args: &DemoArgs,
    done: &mut Resolutions,
) -> anyhow::Result<()> {
    done.later_buyers = done.returned * 2;
    if done.later_buyers == 0 {
        return Ok(());
    }
    let later = args.users + 1..=args.users + done.later_buyers;
    let buyers = crate::demo::buyers(auth, later, 600);
    let plan = crate::demo::spike_plan(base, sku, buyers, args.concurrency, 200);
    let payer = Resolver::paying(base, auth.clone(), args.concurrency);
    load::run(plan, payer.on_answer()).await?;
    let paid = payer.finish().await?;
    done.resold = paid.holds;
    done.paid += paid.paid;
    for (code, n) in paid.refused {
        *done.refused.entry(code).or_default() += n;
    }
    Ok(())
}

/// The steps of the sale's events: a deduction past the `stock` first units deducted takes a
/// unit that came back, a resale (by a later buyer or a late buyer of the spike).
pub fn lifecycle(events: &[Event], stock: u64) -> Lifecycle {
    let mut deducted = 0u64;
    let steps: Vec<(i64, Step, u64)> = events
        .iter()
        .map(|e| {
            let step = match e.kind {
                EventKind::Deducted => {
                    deducted += u64::from(e.quantity);
                    if deducted > stock {
                        Step::Resale
                    } else {
                        Step::Reservation
                    }
                }
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
    // Every first-spike hold past the stock took a unit that had come back.
    let resold_in_spike = done.holds.saturating_sub(done.stock);
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
            held: done.resold == done.returned.min(done.later_buyers)
                && resold_in_spike + done.resold >= done.came_back,
            detail: format!(
                "{} units came back: the spike's late buyers reserved {resold_in_spike}; {} \
                 were left, {} later buyers reserved {}",
                done.came_back, done.returned, done.later_buyers, done.resold
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
    fn shares_are_exact_per_hundred_holds() {
        let args = Cli::parse_from(["x", "--pay-percent", "60", "--cancel-percent", "25"]).demo;
        let fates: Vec<Fate> = (0..300).map(|i| fate(i, &args)).collect();
        let n = |f| fates.iter().filter(|x| **x == f).count();
        assert_eq!(
            (n(Fate::Pay), n(Fate::Cancel), n(Fate::Expire)),
            (180, 75, 45)
        );
    }

    #[test]
    fn a_returned_unit_not_resold_breaks_the_check() {
        // 40 units came back: the spike's late buyers took 30 of them, 10 were left.
        let done = |resold| Resolutions {
            holds: 130,
            stock: 100,
            came_back: 40,
            returned: 10,
            later_buyers: 20,
            resold,
            ..Resolutions::default()
        };
        let held = |resold| checks(&done(resold), &[])[1].held;
        assert!(held(10));
        assert!(!held(9), "a unit left unsold");
        // Nothing left after the spike, yet not every unit that came back was taken again.
        let short = Resolutions {
            holds: 120,
            ..done(0)
        };
        assert!(!checks(&short, &[])[1].held);
    }
}
