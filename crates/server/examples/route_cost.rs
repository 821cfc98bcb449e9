//! Server-side cost of a request without sockets or a client: the router called in-process
//! by `--concurrency` tasks. Separates what the server spends from what HTTP and the load
//! tool spend (`flashsale bench http` measures them together).
//! `cargo run --release -p flashsale-server --example route_cost -- [concurrency] [seconds]`;
//! `ROUTE_COST_ONLY=sold` runs only the endpoints whose name contains `sold` (for `perf`).
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use axum::Router;
use flashsale_core::UserId;
use flashsale_server::auth::Auth;
use flashsale_server::gateway::config::{GatewayConfig, TokenRate};
use flashsale_server::{app, Config, Server, Tunables};
use tower::ServiceExt;

const USERS: u64 = 2_000;

type Make = Arc<dyn Fn(u64) -> Request<Body> + Send + Sync>;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (concurrency, seconds) = (
        args.first().copied().unwrap_or(64),
        args.get(1).copied().unwrap_or(3),
    );
    let dir = std::env::temp_dir().join(format!("route-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let database_url = format!("sqlite://{}/rc.db", dir.display());
    let config = Config {
        engine: flashsale_engine::settings::Settings::new(None, "rc", &database_url, "rc"),
        listen: "127.0.0.1:0".parse()?,
        jwt_secret: "s3cret-s3cret-s3cret-s3cret-0000".into(),
        admin_token: "admin-admin-admin-admin".into(),
        tunables: Tunables {
            queue_cap: 65_536,
            // The probe measures the route, not the limiter's verdict: no token bucket refuses.
            gateway: GatewayConfig {
                rate_instance: TokenRate::OFF,
                rate_sale: TokenRate::OFF,
                rate_user: TokenRate::OFF,
                ..GatewayConfig::default()
            },
            ..Tunables::default()
        },
        identity: None,
    };
    let server = Server::start(config.clone()).await?;
    let base = format!("http://{}", server.addr);
    let http = reqwest::Client::new();
    for (sku, stock) in [(7u64, 1u64), (8, 1_000_000_000)] {
        let body = serde_json::json!({"sku_id": sku, "name": "rc", "total_stock": stock, "per_user_limit": 1000});
        http.post(format!("{base}/api/v1/sales"))
            .bearer_auth(&config.admin_token)
            .json(&body)
            .send()
            .await?
            .error_for_status()?;
        http.post(format!("{base}/api/v1/sales/{sku}/warm"))
            .bearer_auth(&config.admin_token)
            .send()
            .await?
            .error_for_status()?;
    }
    let auth = Auth::new(&config.jwt_secret, &config.admin_token);
    let router = app(server.state.clone());
    let tokens: Arc<Vec<String>> =
        Arc::new((1..=USERS).map(|u| auth.sign(UserId(u), 3600)).collect());
    let healthz: Make = Arc::new(|_| Request::get("/healthz").body(Body::empty()).unwrap());
    let sold_out = purchase(7, tokens.clone(), "x");
    let success = purchase(8, tokens.clone(), "s");
    let d = Duration::from_secs(seconds);
    for (name, make) in [
        ("healthz", healthz),
        ("purchase sold out", sold_out),
        ("purchase accepted", success),
    ] {
        if std::env::var("ROUTE_COST_ONLY").is_ok_and(|only| !name.contains(&only)) {
            continue;
        }
        let (n, cpu_us) = run(&router, make, concurrency, d).await?;
        println!(
            "{name:<18} {:>9.0}/s  {:>6.1} µs CPU per request",
            n as f64 / d.as_secs_f64(),
            cpu_us / n as f64
        );
    }
    server.shutdown().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn purchase(sku: u64, tokens: Arc<Vec<String>>, tag: &'static str) -> Make {
    Arc::new(move |i| {
        Request::post(format!("/api/v1/sales/{sku}/purchases"))
            .header(
                "authorization",
                format!("Bearer {}", tokens[(i % USERS) as usize]),
            )
            .header("content-type", "application/json")
            .body(Body::from(format!(
                "{{\"request_id\":\"{tag}{i}\",\"quantity\":1}}"
            )))
            .unwrap()
    })
}

/// Requests answered in `d` by `c` tasks, and the process CPU µs spent meanwhile.
async fn run(router: &Router, make: Make, c: u64, d: Duration) -> anyhow::Result<(u64, f64)> {
    let next = Arc::new(AtomicU64::new(0));
    let cpu0 = cpu_us();
    let end = Instant::now() + d;
    let tasks: Vec<_> = (0..c)
        .map(|_| {
            let (router, make, next) = (router.clone(), make.clone(), next.clone());
            tokio::spawn(async move {
                let mut bad = 0u64;
                while Instant::now() < end {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let r = router.clone().oneshot(make(i)).await.expect("infallible");
                    bad += u64::from(r.status().as_u16() >= 500 || r.status().as_u16() == 429);
                    let _ = axum::body::to_bytes(r.into_body(), 1 << 16).await;
                }
                bad
            })
        })
        .collect();
    let mut bad = 0;
    for t in tasks {
        bad += t.await?;
    }
    anyhow::ensure!(bad == 0, "{bad} answers were 429 or 5xx");
    Ok((next.load(Ordering::Relaxed), cpu_us() - cpu0))
}

fn cpu_us() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let f: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks * 1e6 / 100.0
}
