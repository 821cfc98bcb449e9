//! A run's report: JSON for machines, one self-contained HTML page (inline SVG charts from
//! [`crate::charts`], no script) for people.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::charts::{self, esc, Labels, Series, PALETTE};
use crate::summary::Summary;

/// One verdict (an invariant, a target).
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub held: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub title: String,
    /// What was run: settings, paths, versions.
    pub setup: BTreeMap<String, String>,
    pub summary: Summary,
    /// Counted from the system of record.
    pub database: BTreeMap<String, i64>,
    pub checks: Vec<Check>,
    /// Hot ledger minus database, per counter (0 everywhere when they agree).
    pub reconciliation_diff: BTreeMap<String, i64>,
    /// Reserve mode: what became of the holds, over time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<crate::lifecycle::Lifecycle>,
}

impl Report {
    pub fn all_held(&self) -> bool {
        self.checks.iter().all(|c| c.held)
    }

    /// Writes `<stem>.json` and `<stem>.html` into `dir`; returns the HTML path.
    pub fn write(&self, dir: &Path, stem: &str) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join(format!("{stem}.json")),
            serde_json::to_vec_pretty(self)?,
        )?;
        let html = dir.join(format!("{stem}.html"));
        std::fs::write(&html, self.html())?;
        Ok(html)
    }

    pub fn html(&self) -> String {
        let s = &self.summary;
        let mut page = String::new();
        let _ = write!(
            page,
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>{}</title>",
            esc(&self.title)
        );
        page.push_str("<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:960px}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}.ok{color:#080}.bad{color:#c00;font-weight:bold}svg.chart{width:100%;height:auto;max-width:900px;border:1px solid #ddd;margin:.5em 0;background:#fff}</style></head><body>");
        let _ = write!(page, "<h1>{}</h1>", esc(&self.title));
        page.push_str(&table(
            "Setup",
            self.setup.iter().map(|(k, v)| (k.clone(), v.clone())),
        ));
        let headline = [
            ("buyers", s.buyers.to_string()),
            ("requests (with retries)", s.requests.to_string()),
            ("elapsed", format!("{:.2} s", s.elapsed_s)),
            (
                "throughput",
                format!(
                    "{:.0} buyers/s, {:.0} requests/s",
                    s.buyers_per_s, s.requests_per_s
                ),
            ),
            (
                "latency p50 / p99 / p99.9",
                format!(
                    "{:.2} / {:.2} / {:.2} ms",
                    s.latency.p50_ms, s.latency.p99_ms, s.latency.p999_ms
                ),
            ),
        ];
        page.push_str(&table(
            "Run",
            headline.into_iter().map(|(k, v)| (k.to_owned(), v)),
        ));
        page.push_str(&table(
            "Outcomes",
            s.outcomes.iter().map(|(k, v)| (k.clone(), v.to_string())),
        ));
        page.push_str(&table(
            "Database",
            self.database
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string())),
        ));
        page.push_str(&checks_table(&self.checks));
        page.push_str(&table(
            "Reconciliation diff (hot − database)",
            self.reconciliation_diff
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string())),
        ));
        if let Some(l) = &self.lifecycle {
            let rows = l.totals.iter().map(|(k, v)| (k.clone(), v.to_string()));
            page.push_str(&table("Holds (units)", rows));
            page.push_str(&l.chart());
        }
        page.push_str(&charts_html(s));
        page.push_str("</body></html>");
        page
    }
}

fn table(title: &str, rows: impl Iterator<Item = (String, String)>) -> String {
    let mut out = format!("<h2>{}</h2><table>", esc(title));
    for (k, v) in rows {
        let _ = write!(out, "<tr><th>{}</th><td>{}</td></tr>", esc(&k), esc(&v));
    }
    out + "</table>"
}

fn checks_table(checks: &[Check]) -> String {
    let mut out = String::from(
        "<h2>Invariants</h2><table><tr><th>check</th><th>verdict</th><th>detail</th></tr>",
    );
    for c in checks {
        let (class, word) = if c.held {
            ("ok", "held")
        } else {
            ("bad", "BROKEN")
        };
        let _ = write!(
            out,
            "<tr><th>{}</th><td class=\"{class}\">{word}</td><td>{}</td></tr>",
            esc(&c.name),
            esc(&c.detail)
        );
    }
    out + "</table>"
}

/// The run's charts: answers by outcome, stock, latency over time, histogram, percentiles.
fn charts_html(s: &Summary) -> String {
    let o = &s.over_time;
    let t: Vec<f64> = o.t_ms.iter().map(|ms| *ms as f64 / 1_000.0).collect();
    let mut out = answers_chart(o, &t);
    let stock_t: Vec<f64> = s.timeline.iter().map(|p| p.t_ms as f64 / 1_000.0).collect();
    let stock = Series {
        name: "remaining",
        color: PALETTE[0],
        ys: s
            .timeline
            .iter()
            .map(|p| Some(p.remaining as f64))
            .collect(),
    };
    out += &charts::lines(
        &Labels {
            title: "Remaining stock",
            x: "time since start (s)",
            y: "units",
        },
        &stock_t,
        &[stock],
    );
    let latency = [
        Series {
            name: "p50",
            color: PALETTE[3],
            ys: o.p50_ms.clone(),
        },
        Series {
            name: "p99",
            color: PALETTE[4],
            ys: o.p99_ms.clone(),
        },
        Series {
            name: "max",
            color: PALETTE[2],
            ys: o.max_ms.clone(),
        },
    ];
    out += &charts::lines(
        &Labels {
            title: "Latency percentiles over time (by answer time)",
            x: "time since start (s)",
            y: "latency (ms)",
        },
        &t,
        &latency,
    );
    out += &histogram_chart(s);
    let (q, ms): (Vec<f64>, Vec<f64>) = s.latency_curve.iter().cloned().unzip();
    let curve = Series {
        name: "latency",
        color: PALETTE[3],
        ys: ms.into_iter().map(Some).collect(),
    };
    out + &charts::lines(
        &Labels {
            title: "Latency by percentile",
            x: "percentile (%)",
            y: "latency (ms)",
        },
        &q,
        &[curve],
    )
}

/// Answers per second stacked by outcome, accepted at the bottom.
fn answers_chart(o: &crate::series::OverTime, t: &[f64]) -> String {
    let mut names: Vec<&String> = o.answers_per_s.keys().collect();
    names.sort_by_key(|n| (outcome_rank(n), n.as_str()));
    let series: Vec<Series> = names
        .iter()
        .enumerate()
        .map(|(i, n)| Series {
            name: n.as_str(),
            color: outcome_color(n, i),
            ys: o.answers_per_s[*n].iter().map(|v| Some(*v)).collect(),
        })
        .collect();
    charts::stacked(
        &Labels {
            title: "Answers per second by outcome (stacked)",
            x: "time since start (s)",
            y: "answers/s",
        },
        t,
        &series,
    )
}

fn histogram_chart(s: &Summary) -> String {
    let names: Vec<String> = s
        .latency_histogram
        .iter()
        .map(|b| format!("≤{}", ms_label(b.upper_ms)))
        .collect();
    let counts: Vec<f64> = s.latency_histogram.iter().map(|b| b.count as f64).collect();
    charts::bars(
        &Labels {
            title: "Latency histogram",
            x: "latency (bins of 1-2-5 steps)",
            y: "answers",
        },
        &names,
        &counts,
        PALETTE[3],
    )
}

fn ms_label(ms: f64) -> String {
    if ms >= 1_000.0 {
        format!("{} s", ms / 1_000.0)
    } else if ms >= 1.0 {
        format!("{ms} ms")
    } else {
        format!("{} µs", (ms * 1_000.0).round())
    }
}

fn outcome_rank(name: &str) -> u8 {
    match name {
        "ACCEPTED" => 0,
        "REPLAYED" => 1,
        "SOLD_OUT" => 2,
        _ => 3,
    }
}

/// Fixed colours for the outcomes every run has, so reports compare at a glance.
fn outcome_color(name: &str, i: usize) -> &'static str {
    match name {
        "ACCEPTED" => "#2e7d32",
        "REPLAYED" => "#81c784",
        "SOLD_OUT" => "#e0a030",
        _ => ["#c62828", "#6a1b9a", "#00838f", "#8d6e63"][i % 4],
    }
}
