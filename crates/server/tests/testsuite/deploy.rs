//! The monitoring files in `deploy/`: the Prometheus alerts pass `promtool check rules` and
//! their unit tests, the scrape config passes `promtool check config`, every query of the
//! Grafana dashboard parses as PromQL, every metric they name is one the docs define, and the
//! service's own `/metrics` after a few purchases passes `promtool check metrics` (names,
//! units, HELP text). HAProxy's `timeout server` in `deploy/haproxy.cfg` outlasts the
//! service's own request timeout.
//!
//! `scripts/promtool.sh` runs the promtool checks (promtool comes from Debian's `prometheus`
//! package, which the test command installs before any test runs: scripts/test-deps.sh).

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::Stack;

use serde_json::{json, Value};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every `expr` of the dashboard's panels, with Grafana's variables replaced by values
/// Prometheus accepts.
fn grafana_queries() -> Vec<String> {
    let dash: Value = serde_json::from_str(&read("deploy/grafana/flashsale.json")).unwrap();
    let panels = dash["panels"].as_array().expect("panels");
    let queries: Vec<String> = panels
        .iter()
        .filter_map(|p| p["targets"].as_array())
        .flatten()
        .filter_map(|t| t["expr"].as_str())
        .map(|e| {
            e.replace("$__rate_interval", "1m")
                .replace("$instance", ".*")
        })
        .collect();
    assert!(queries.len() >= 20, "the dashboard has its panels");
    queries
}

/// The dashboard's queries as recording rules, so `promtool check rules` parses each one.
/// (JSON is YAML, so the rule file is written with serde_json.)
fn queries_as_rules(queries: &[String]) -> tempfile::NamedTempFile {
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, q)| json!({"record": format!("grafana:query_{i}"), "expr": q}))
        .collect();
    let doc = json!({"groups": [{"name": "grafana-queries", "rules": rules}]});
    let file = tempfile::Builder::new().suffix(".yml").tempfile().unwrap();
    std::fs::write(file.path(), doc.to_string()).unwrap();
    file
}

/// `flashsale_…` names in `text`, with the histogram series suffixes taken off.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, _) in text.match_indices("flashsale_") {
        let name: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name);
        names.insert(base.to_owned());
    }
    names
}

/// An HAProxy time (`deploy/haproxy.cfg`): a number with an optional unit, ms by default.
fn haproxy_time(value: &str) -> std::time::Duration {
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (n, unit) = value.split_at(split);
    let n: u64 = n
        .parse()
        .unwrap_or_else(|_| panic!("HAProxy time {value:?}"));
    let micros = match unit {
        "us" => 1,
        "" | "ms" => 1_000,
        "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => panic!("HAProxy time unit {unit:?}"),
    };
    std::time::Duration::from_micros(n * micros)
}

/// The `timeout <name>` lines of the config, comments left out.
fn haproxy_timeouts(cfg: &str, name: &str) -> Vec<std::time::Duration> {
    cfg.lines()
        .map(|line| line.split('#').next().unwrap_or_default())
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["timeout", n, value] if *n == name => Some(haproxy_time(value)),
                _ => None,
            }
        })
        .collect()
}

/// HAProxy must wait longer than the service takes to answer on its own (the JSON 503 at
/// its request timeout, plus a second to reach HAProxy); a shorter wait answers HAProxy's
/// own non-JSON 504 first.
#[test]
fn haproxy_outwaits_the_request_timeout() {
    let cfg = read("deploy/haproxy.cfg");
    let timeouts = haproxy_timeouts(&cfg, "server");
    assert!(
        !timeouts.is_empty(),
        "deploy/haproxy.cfg sets `timeout server`"
    );
    let service = flashsale_server::Tunables::DEFAULT.request_timeout;
    for t in timeouts {
        assert!(
            t >= service + std::time::Duration::from_secs(1),
            "HAProxy gives up after {t:?}, the service answers by {service:?}"
        );
    }
}

/// Without `option forwardfor` every client behind HAProxy is HAProxy's address to the
/// instances: one per-IP bucket and one blacklist entry for all of them.
#[test]
fn haproxy_forwards_the_client_address() {
    let cfg = read("deploy/haproxy.cfg");
    let forwards = cfg
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .any(|line| line.starts_with("option forwardfor"));
    assert!(forwards, "deploy/haproxy.cfg has `option forwardfor`");
}

#[test]
fn alerts_config_and_dashboard_pass_promtool() {
    let rules = queries_as_rules(&grafana_queries());
    let status = Command::new("bash")
        .arg(repo_root().join("scripts/promtool.sh"))
        .arg(rules.path())
        .status()
        .expect("scripts/promtool.sh runs");
    assert!(status.success(), "scripts/promtool.sh failed (see above)");
}

#[test]
fn alerts_and_dashboard_name_only_documented_metrics() {
    let design = read("docs/DESIGN.md");
    let mut used = metric_names(&read("deploy/prometheus/alerts.yml"));
    used.extend(metric_names(&read("deploy/grafana/flashsale.json")));
    let unknown: Vec<&String> = used
        .iter()
        .filter(|n| !design.contains(n.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "metrics not in docs/DESIGN.md: {unknown:?}"
    );
    assert!(used.len() >= 15, "{used:?}");
}

/// `promtool` is there (scripts/test-deps.sh installs it before the tests).
fn ensure_promtool() {
    let status = Command::new("bash")
        .arg(repo_root().join("scripts/promtool.sh"))
        .stdout(Stdio::null())
        .status()
        .expect("scripts/promtool.sh runs");
    assert!(status.success(), "scripts/promtool.sh failed (see above)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exported_metrics_pass_promtool_check_metrics() {
    ensure_promtool();
    let stack = Stack::embedded().await;
    stack.live_sale(3, 2, 1).await;
    for user in 1..=4 {
        stack.buy(user, 3, &format!("r{user}"), json!(1)).await;
    }
    let text = stack.metrics_text().await;
    assert!(text.contains("flashsale_purchases_total"), "{text}");
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool check metrics: {said}");
}
