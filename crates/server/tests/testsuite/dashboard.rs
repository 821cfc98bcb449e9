//! The dashboard in a real browser: headless Debian chromium driven over WebDriver
//! (chromedriver, `fantoccini`). A server on the embedded ledger sells out a small spike while
//! the page is open with the admin token; the DOM must show the sold count reaching the total,
//! the charts drawn with data and the reconciliation verdict. Screenshots (public, admin,
//! admin at phone width) go to `target/test-output/`.
//!
//! `scripts/browser-check.sh` checks that chromium and chromium-driver are there (the test
//! command installs them before any test runs: scripts/test-deps.sh).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Stack, ADMIN};
use fantoccini::{Client, ClientBuilder, Locator};
use flashsale_testkit::wait;
use futures::stream::{self, StreamExt};
use reqwest::StatusCode;
use serde_json::{json, Value};

const SKU: u64 = 4_242;
const UNITS: u64 = 150;
const BUYERS: u64 = 450;
/// Buyers who also try a second time with a new request id (refused: LIMIT_EXCEEDED or SOLD_OUT).
const GREEDY: u64 = 100;
const WAVES: usize = 4;
/// Everything the page must show within this after the spike (it polls once a second).
const DEADLINE: Duration = Duration::from_secs(30);

/// chromedriver on a free port in a process group of its own, killed with the browsers it
/// started when dropped (also when the test fails before closing its session).
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `target/test-output`, beside the tests' own temp dir.
fn output_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .join("test-output");
    std::fs::create_dir_all(&dir).expect("output dir");
    dir
}

/// Runs `scripts/browser-check.sh`; returns (chromium, chromedriver).
fn browser_paths() -> (String, String) {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/browser-check.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("scripts/browser-check.sh runs");
    assert!(
        out.status.success(),
        "scripts/browser-check.sh failed: chromium and chromium-driver are needed"
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines().map(str::to_owned);
    (lines.next().unwrap(), lines.next().unwrap())
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Starts chromedriver and waits (with a deadline) until it says it is ready.
async fn start_driver(chromedriver: &str) -> Driver {
    let port = free_port();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let driver = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let http = reqwest::Client::new();
    let status_url = format!("{}/status", driver.url);
    let ready = wait::within_every(
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            let resp = http.get(&status_url).send().await.ok()?;
            let body: Value = resp.json().await.ok()?;
            body["value"]["ready"].as_bool().filter(|r| *r)
        },
    )
    .await;
    assert!(ready.is_some(), "chromedriver not ready at {}", driver.url);
    driver
}

async fn open_browser(driver: &Driver, chromium: &str) -> Client {
    let caps = json!({
        "goog:chromeOptions": {
            "binary": chromium,
            // Root in a container: no sandbox; /dev/shm may be tiny.
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1280,1500", "--hide-scrollbars"],
        }
    });
    let caps = caps.as_object().unwrap().clone().into_iter().collect();
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a WebDriver session")
}

/// Many more buyers than units, plus second tries by some (LIMIT_EXCEEDED while stock lasts),
/// in waves a second apart so the charts show a few seconds, not one spike.
async fn spike(stack: &Stack) -> Vec<StatusCode> {
    let tries: Vec<(u64, String)> = (1..=BUYERS)
        .flat_map(|u| {
            let second = (u <= GREEDY).then(|| (u, format!("u{u}-b")));
            std::iter::once((u, format!("u{u}-a"))).chain(second)
        })
        .collect();
    let mut pace = tokio::time::interval(Duration::from_secs(1));
    let mut statuses = Vec::new();
    for wave in tries.chunks(tries.len().div_ceil(WAVES)) {
        pace.tick().await;
        let answers: Vec<StatusCode> = stream::iter(wave.iter().cloned())
            .map(|(user, rid)| async move { stack.buy(user, SKU, &rid, json!(1)).await.0 })
            .buffer_unordered(32)
            .collect()
            .await;
        statuses.extend(answers);
    }
    statuses
}

/// What the page shows of the sale, read in the browser.
const READ_PAGE: &str = r#"
const card = document.getElementById('sale-' + arguments[0]);
if (!card) return null;
const v = k => card.querySelector('[data-k="' + k + '"]')?.dataset.v ?? null;
const points = c => Number(card.querySelector('[data-chart="' + c + '"]')?.dataset.points ?? 0);
// Pixels of a chart's canvas in colour (series; grid lines and axes are grey).
const inked = c => {
  const canvas = card.querySelector('[data-chart="' + c + '"] canvas');
  if (!canvas) return 0;
  const px = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let n = 0;
  for (let i = 0; i < px.length; i += 4) {
    const [r, g, b, a] = [px[i], px[i + 1], px[i + 2], px[i + 3]];
    if (a > 0 && Math.max(r, g, b) - Math.min(r, g, b) > 60) n++;
  }
  return n;
};
return {
  sold: v('sold'), total: v('total'), available: v('available'),
  accepted_points: points('answers'), latency_points: points('latency'), stock_points: points('stock'),
  answers_ink: inked('answers'), latency_ink: inked('latency'),
  reconcile: card.querySelector('[data-f="reconcile"]')?.dataset.level ?? null,
  admin: !card.querySelector('.ops').hidden,
  status: document.getElementById('status').textContent,
  overflow: document.documentElement.scrollWidth - window.innerWidth,
  // What sticks out past the right edge, to name it when the page is too wide.
  too_wide: [...document.querySelectorAll('body *')]
    .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
    .slice(0, 5).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().width)),
};
"#;

async fn read_page(browser: &Client) -> Value {
    browser
        .execute(READ_PAGE, vec![json!(SKU)])
        .await
        .expect("script runs")
}

fn sold_out_and_drawn(page: &Value) -> bool {
    let total = UNITS.to_string();
    page["sold"] == json!(total)
        && page["total"] == json!(total)
        && page["admin"] == json!(true)
        && page["accepted_points"].as_u64() > Some(0)
        && page["latency_points"].as_u64() > Some(0)
        && page["answers_ink"].as_u64() > Some(500)
        && page["latency_ink"].as_u64() > Some(30)
        && page["reconcile"] == json!("ok")
}

/// Reads the page until `done` holds (`Ok`) or the deadline passes (`Err`: the last reading).
async fn wait_for_page(browser: &Client, done: impl Fn(&Value) -> bool) -> Result<Value, Value> {
    let until = Instant::now() + DEADLINE;
    loop {
        let page = read_page(browser).await;
        if done(&page) {
            return Ok(page);
        }
        if Instant::now() >= until {
            return Err(page);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn unlock_admin(browser: &Client) {
    unlock_admin_with(browser, ADMIN).await;
}

async fn unlock_admin_with(browser: &Client, token: &str) {
    let input = browser
        .find(Locator::Css("#admin-token"))
        .await
        .expect("token input");
    input.clear().await.unwrap();
    input.send_keys(token).await.unwrap();
    browser
        .find(Locator::Css("#admin-unlock"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

async fn screenshot(browser: &Client, name: &str) -> PathBuf {
    let png = browser.screenshot().await.expect("screenshot");
    let path = output_dir().join(name);
    std::fs::write(&path, png).expect("screenshot written");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_spike_selling_out() {
    let (chromium, chromedriver) = browser_paths();
    let stack = Stack::embedded().await;
    stack.live_sale(SKU, UNITS, 1).await;
    let driver = start_driver(&chromedriver).await;
    let browser = open_browser(&driver, &chromium).await;
    browser.goto(&stack.base).await.expect("page loads");
    let public = wait_for_page(&browser, |p| {
        p["total"] == json!(UNITS.to_string()) && p["admin"] == json!(false)
    })
    .await;
    screenshot(&browser, "dashboard-public.png").await;
    assert!(public.is_ok(), "the public page shows the sale: {public:?}");
    // A wrong token: the page says why, from the error's Problem Details, and stays public.
    unlock_admin_with(&browser, "not-the-admin-token").await;
    let refused = wait_for_page(&browser, |p| {
        p["status"].as_str().is_some_and(|s| {
            s.contains("answered 401 Unauthorized: invalid token") && s.contains("showing public")
        })
    })
    .await;
    assert!(refused.is_ok(), "a refused token is explained: {refused:?}");
    unlock_admin(&browser).await;

    let statuses = spike(&stack).await;
    let accepted = statuses
        .iter()
        .filter(|s| **s == StatusCode::ACCEPTED)
        .count();
    assert_eq!(accepted as u64, UNITS, "every unit sold, no more");
    stack.repair(SKU).await;

    let shown = wait_for_page(&browser, sold_out_and_drawn).await;
    let desktop = screenshot(&browser, "dashboard.png").await;
    assert!(
        shown.is_ok(),
        "the page never showed the sale sold out with charts: {shown:?}; see {}",
        desktop.display()
    );

    browser.set_window_size(390, 1500).await.unwrap();
    let narrow = wait_for_page(&browser, |p| {
        p["overflow"].as_i64() <= Some(0) && sold_out_and_drawn(p)
    })
    .await;
    screenshot(&browser, "dashboard-phone.png").await;
    assert!(narrow.is_ok(), "the page is wider than a phone: {narrow:?}");

    // Opened again after the spike: the charts come from the server's history, from before
    // the first purchase (stock remaining) to the sell-out, not only from the reopened page.
    browser.set_window_size(1280, 1500).await.unwrap();
    browser.refresh().await.unwrap();
    let reopened = wait_for_page(&browser, |p| {
        sold_out_and_drawn(p) && p["stock_points"].as_u64() > Some(0)
    })
    .await;
    screenshot(&browser, "dashboard-reopened.png").await;
    assert!(
        reopened.is_ok(),
        "a page opened after the spike draws it: {reopened:?}"
    );
    browser.close().await.unwrap();
}
