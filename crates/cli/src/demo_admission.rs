//! `flashsale demo --admission queue|draw`: a sale that admits its buyers through a queue or a
//! draw, over real HTTP against the in-process server.
//!
//! Queue: a third of the buyers join in a burst as soon as the queue opens, a third spread
//! over the time before the start, a third after the start; each polls its place (honouring
//! `Retry-After`, at most a second in the demo), buys with its pass once admitted, and stops
//! at SOLD_OUT. The report shows, per group, who bought and the mean place: the burst gains
//! nothing over the others of the pre-queue; the late joiners queue behind.
//!
//! Draw: every buyer enters during the window; after the draw the published winners are
//! recomputed from the revealed seed, winners pay or cancel (`--pay-percent`,
//! `--cancel-percent`), and the cancelled units pass down the waitlist.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use flashsale_core::admission::{self, Entry};
use flashsale_core::UserId;
use flashsale_server::auth::Auth;
use rand::Rng;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::demo::{DemoAdmission, DemoArgs};

/// The time between the queue's (or window's) opening and the start (or draw): 3 s, plus
/// 3 ms per buyer so that every buyer meant to join before the start gets its join through
/// (the embedded ledger commits each join), at most a minute.
fn lead_ms(users: u64) -> i64 {
    (3_000 + 3 * users as i64).min(60_000)
}
/// The longest a demo buyer waits between two reads of its place.
const POLL_MAX: Duration = Duration::from_secs(1);

/// The three ways a demo buyer arrives.
const GROUPS: [&str; 3] = ["burst at open", "spread before start", "after start"];

/// What became of one queue buyer.
struct Fate {
    group: usize,
    place: Option<u64>,
    bought: bool,
}

/// A client of the demo's server for one buyer.
#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    base: String,
    sku: u64,
}

impl Client {
    async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value, Option<u64>)> {
        let url = format!("{}/api/v1/sales/{}{path}", self.base, self.sku);
        let mut req = self.http.request(method.parse()?, url).bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let retry = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let body = resp.json().await.unwrap_or(Value::Null);
        Ok((status, body, retry))
    }
}

fn now_ms() -> i64 {
    flashsale_core::clock::now_ms()
}

async fn sleep_until_ms(at: i64) {
    let wait = at - now_ms();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
}

/// The demo's sale on the server, and when its queue or entry window opened.
struct Demo<'a> {
    client: Client,
    admin: &'a str,
    auth: &'a Auth,
    args: &'a DemoArgs,
    opens: i64,
    /// From the opening to the start (a queue) or the draw.
    lead: i64,
    /// Bounds the buyers' requests in flight (`--concurrency`).
    gate: Arc<Semaphore>,
}

/// The queue or the draw demo (`args.admission`) on sale `sku`: creates the sale, runs every
/// buyer, prints the report.
pub async fn run(
    base: &str,
    admin: &str,
    auth: &Auth,
    sku: u64,
    args: &DemoArgs,
) -> anyhow::Result<()> {
    let opens = now_ms();
    let lead = lead_ms(args.users);
    let queued = args.admission == DemoAdmission::Queue;
    let body = match queued {
        true => json!({"sku_id": sku, "name": "demo drop", "total_stock": args.stock,
            "per_user_limit": 1, "admission": "queue", "admission_opens_at_ms": opens,
            "starts_at_ms": opens + lead}),
        false => json!({"sku_id": sku, "name": "demo draw", "total_stock": args.stock,
            "per_user_limit": 1, "mode": "reserve", "payment_timeout_ms": args.hold_ms,
            "admission": "draw", "admission_opens_at_ms": opens, "starts_at_ms": opens,
            "draw_at_ms": opens + lead}),
    };
    flashsale_bench::harness::setup::create_and_warm(base, admin, &body).await?;
    let client = Client {
        http: reqwest::Client::new(),
        base: base.to_owned(),
        sku,
    };
    let demo = Demo {
        client,
        admin,
        auth,
        args,
        opens,
        lead,
        gate: Arc::new(Semaphore::new(args.concurrency)),
    };
    match queued {
        true => queue(&demo).await,
        false => draw(&demo).await,
    }
}

/// The queue demo: every buyer joins, polls and buys with its pass; the report.
async fn queue(demo: &Demo<'_>) -> anyhow::Result<()> {
    let (client, admin, auth, args) = (&demo.client, demo.admin, demo.auth, demo.args);
    let (opens, lead, starts) = (demo.opens, demo.lead, demo.opens + demo.lead);
    let started = Instant::now();
    let tasks: Vec<_> = (1..=args.users)
        .map(|u| {
            let group = (u % 3) as usize;
            let at = match group {
                0 => opens,
                1 => opens + rand::rng().random_range(0..lead / 2),
                _ => starts + rand::rng().random_range(0..1_000),
            };
            let (client, gate) = (client.clone(), demo.gate.clone());
            let token = auth.sign(UserId(u), 3_600);
            tokio::spawn(async move { queue_buyer(client, gate, token, group, at).await })
        })
        .collect();
    let mut fates = Vec::new();
    for t in tasks {
        fates.push(t.await??);
    }
    print_queue(&fates, args, started.elapsed());
    let (_, sale, _) = client.call("GET", "", admin, None).await?;
    let sold = sale["sold"].as_u64().unwrap_or(0);
    let bought = fates.iter().filter(|f| f.bought).count() as u64;
    println!(
        "sale: sold {sold} of {} (buyers who bought: {bought})",
        args.stock
    );
    anyhow::ensure!(
        sold == args.stock.min(args.users) && bought == sold,
        "the queue did not sell exactly the stock"
    );
    Ok(())
}

async fn queue_buyer(
    client: Client,
    gate: Arc<Semaphore>,
    token: String,
    group: usize,
    at: i64,
) -> anyhow::Result<Fate> {
    sleep_until_ms(at).await;
    let mut fate = Fate {
        group,
        place: None,
        bought: false,
    };
    let mut path = "/queue";
    let mut method = "POST";
    loop {
        let (status, me, retry) = {
            let _permit = gate.acquire().await?;
            client.call(method, path, &token, None).await?
        };
        anyhow::ensure!(status == 200, "queue answered {status}: {me}");
        (method, path) = ("GET", "/queue/me");
        fate.place = me["place"].as_u64().or(fate.place);
        match me["state"].as_str().unwrap_or("") {
            "admitted" => {
                let body =
                    json!({"request_id": "demo", "quantity": 1, "admission_pass": me["pass"]});
                let _permit = gate.acquire().await?;
                let (status, _, _) = client
                    .call("POST", "/purchases", &token, Some(body))
                    .await?;
                fate.bought = status == 202;
                return Ok(fate);
            }
            "sold_out" | "lapsed" => return Ok(fate),
            _ => {
                let wait = Duration::from_secs(retry.unwrap_or(1)).min(POLL_MAX);
                tokio::time::sleep(wait).await;
            }
        }
    }
}

fn print_queue(fates: &[Fate], args: &DemoArgs, took: Duration) {
    println!(
        "\nqueue of {} buyers for {} units, settled in {:.1} s:",
        args.users,
        args.stock,
        took.as_secs_f64()
    );
    println!(
        "  {:<22} {:>8} {:>8} {:>12}",
        "joined", "buyers", "bought", "mean place"
    );
    for (g, name) in GROUPS.iter().enumerate() {
        let of: Vec<&Fate> = fates.iter().filter(|f| f.group == g).collect();
        let places: Vec<u64> = of.iter().filter_map(|f| f.place).collect();
        let mean = places.iter().sum::<u64>() as f64 / places.len().max(1) as f64;
        let bought = of.iter().filter(|f| f.bought).count();
        println!("  {name:<22} {:>8} {bought:>8} {mean:>12.0}", of.len());
    }
    println!("  (the burst at the queue's opening gains nothing over the buyers spread before the start)");
}

/// The draw demo: entries, the draw, its check, payments, cancellations and the waitlist.
async fn draw(demo: &Demo<'_>) -> anyhow::Result<()> {
    let (client, admin, auth, args) = (&demo.client, demo.admin, demo.auth, demo.args);
    let (opens, lead, draw_at) = (demo.opens, demo.lead, demo.opens + demo.lead);
    let entries: Vec<_> = (1..=args.users)
        .map(|u| {
            let (client, gate) = (client.clone(), demo.gate.clone());
            let token = auth.sign(UserId(u), 3_600);
            let at = opens + rand::rng().random_range(0..lead / 2);
            tokio::spawn(async move {
                sleep_until_ms(at).await;
                let _permit = gate.acquire().await?;
                let (s, b, _) = client
                    .call("POST", "/entries", &token, Some(json!({"quantity": 1})))
                    .await?;
                anyhow::ensure!(s == 201, "entry answered {s}: {b}");
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    for e in entries {
        e.await??;
    }
    sleep_until_ms(draw_at).await;
    let drawn = published_draw(client, admin).await?;
    let winners = verify(&drawn)?;
    println!(
        "\ndraw of {} entries for {} units: seed {} (SHA-256 {} published when entries opened)",
        args.users,
        args.stock,
        drawn["seed"].as_str().unwrap_or(""),
        drawn["seed_sha256"].as_str().unwrap_or("")
    );
    println!(
        "  {} winners recomputed from the seed: they match the published list",
        winners.len()
    );
    let (paid, cancelled) = resolve_winners(client, auth, &winners, args).await?;
    // Reading the draw walks the waitlist: the cancelled units go to the next entries. The
    // sale's counters are the instance cache's (up to a second old): read them once that
    // second has passed, until they settle.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let (after, sale) = loop {
        let after = published_draw(client, admin).await?;
        let (_, sale, _) = client.call("GET", "", admin, None).await?;
        let exhausted = after["waitlist_position"].as_u64() == Some(args.users);
        if sale["available"] == 0 || exhausted || Instant::now() > deadline {
            break (after, sale);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!(
        "  winners paid {paid}, cancelled {cancelled}; waitlist position {} of {}",
        after["waitlist_position"], args.users
    );
    println!(
        "  sale: sold {}, reserved {}, available {}",
        sale["sold"], sale["reserved"], sale["available"]
    );
    let exhausted = after["waitlist_position"].as_u64() == Some(args.users);
    anyhow::ensure!(
        sale["available"] == 0 || exhausted,
        "the waitlist did not take the units back"
    );
    Ok(())
}

async fn published_draw(client: &Client, token: &str) -> anyhow::Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, d, _) = client.call("GET", "/draw", token, None).await?;
        if !d["seed"].is_null() {
            return Ok(d);
        }
        anyhow::ensure!(Instant::now() < deadline, "no draw 30 s after its time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Recomputes the winners from the published seed and entries (as `scripts/draw-verify.py`
/// does) and checks they are the published ones.
fn verify(d: &Value) -> anyhow::Result<Vec<Entry>> {
    let seed = admission::seed_from_hex(d["seed"].as_str().context("seed")?).context("seed")?;
    anyhow::ensure!(
        admission::commitment(&seed) == d["seed_sha256"],
        "the seed does not match its commitment"
    );
    let entries: Vec<Entry> = serde_json::from_value(d["entries"].clone())?;
    let stock = d["total_stock"].as_u64().context("total_stock")?;
    let won: Vec<Entry> = admission::draw(&seed, &entries, stock)
        .into_iter()
        .filter(|(_, w)| *w)
        .map(|(e, _)| e)
        .collect();
    let published: Vec<Entry> = serde_json::from_value(d["winners"].clone())?;
    anyhow::ensure!(
        won == published,
        "the published winners are not the recomputed ones"
    );
    Ok(won)
}

/// Winners pay (`--pay-percent`) or cancel (`--cancel-percent`); the rest keep their hold.
async fn resolve_winners(
    client: &Client,
    auth: &Auth,
    winners: &[Entry],
    args: &DemoArgs,
) -> anyhow::Result<(u64, u64)> {
    let (mut paid, mut cancelled) = (0, 0);
    for (i, w) in winners.iter().enumerate() {
        let token = auth.sign(w.user_id, 3_600);
        let (_, me, _) = client.call("GET", "/entries/me", &token, None).await?;
        let Some(no) = me["order_no"].as_str() else {
            continue;
        };
        let roll = (i * 100 / winners.len().max(1)) as u8;
        let action = if roll < args.pay_percent {
            "pay"
        } else if roll < args.pay_percent + args.cancel_percent {
            "cancel"
        } else {
            continue;
        };
        let url = format!("{}/api/v1/orders/{no}/{action}", client.base);
        let s = client
            .http
            .post(url)
            .bearer_auth(&token)
            .send()
            .await?
            .status();
        anyhow::ensure!(s.is_success(), "{action} answered {s}");
        if action == "pay" {
            paid += 1
        } else {
            cancelled += 1
        }
    }
    Ok((paid, cancelled))
}
