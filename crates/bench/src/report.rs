//! A run's report: JSON for machines, one self-contained HTML page (inline SVG) for people.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

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
        page.push_str("<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:960px}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}.ok{color:#080}.bad{color:#c00;font-weight:bold}svg{border:1px solid #ddd;margin:.5em 0}</style></head><body>");
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
        let t: Vec<f64> = s.timeline.iter().map(|p| p.t_ms as f64 / 1_000.0).collect();
        let rate: Vec<f64> = s.timeline.iter().map(|p| p.answered_per_s).collect();
        let stock: Vec<f64> = s.timeline.iter().map(|p| p.remaining as f64).collect();
        page.push_str(&svg_chart(
            "Answers per second",
            &t,
            &rate,
            "time (s)",
            "answers/s",
        ));
        page.push_str(&svg_chart(
            "Remaining stock",
            &t,
            &stock,
            "time (s)",
            "units",
        ));
        let (q, ms): (Vec<f64>, Vec<f64>) = s.latency_curve.iter().cloned().unzip();
        page.push_str(&svg_chart(
            "Latency by percentile",
            &q,
            &ms,
            "percentile",
            "ms",
        ));
        page.push_str("</body></html>");
        page
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
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

/// A line chart as inline SVG, axes from 0 to the largest value.
fn svg_chart(title: &str, xs: &[f64], ys: &[f64], x_label: &str, y_label: &str) -> String {
    const W: f64 = 900.0;
    const H: f64 = 260.0;
    const PAD: f64 = 50.0;
    let x_max = xs.iter().cloned().fold(0.0, f64::max).max(1e-9);
    let y_max = ys.iter().cloned().fold(0.0, f64::max).max(1e-9);
    let px = |x: f64| PAD + x / x_max * (W - 2.0 * PAD);
    let py = |y: f64| H - PAD + -(y / y_max) * (H - 2.0 * PAD);
    let points: Vec<String> = xs
        .iter()
        .zip(ys)
        .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
        .collect();
    let mut svg = format!(
        "<h2>{}</h2><svg width=\"{W}\" height=\"{H}\" xmlns=\"http://www.w3.org/2000/svg\">",
        esc(title)
    );
    let _ = write!(
        svg,
        "<line x1=\"{PAD}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#333\"/><line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{b}\" stroke=\"#333\"/>",
        b = H - PAD,
        r = W - PAD
    );
    let _ = write!(
        svg,
        "<polyline fill=\"none\" stroke=\"#1565c0\" stroke-width=\"2\" points=\"{}\"/>",
        points.join(" ")
    );
    let _ = write!(
        svg,
        "<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">{} (max {:.2})</text>",
        W / 2.0,
        H - 12.0,
        esc(x_label),
        x_max
    );
    let _ = write!(
        svg,
        "<text x=\"8\" y=\"{}\" font-size=\"12\">{} (max {:.2})</text>",
        PAD - 12.0,
        esc(y_label),
        y_max
    );
    svg + "</svg>"
}
