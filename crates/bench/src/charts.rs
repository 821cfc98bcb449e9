//! Inline SVG charts for the self-contained HTML report: axes with ticks at round values and
//! units in their labels, a legend, and three kinds: lines, stacked areas and bars. No script
//! and no external file, so a report opens anywhere, offline.

use std::fmt::Write as _;

const W: f64 = 900.0;
const H: f64 = 280.0;
/// Plot area margins: left (tick labels and the y label), right, top (legend), bottom.
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 46.0;

/// Colours for series, in order (outcome charts pass their own).
pub const PALETTE: [&str; 6] = [
    "#2e7d32", "#e0a030", "#c62828", "#1565c0", "#6a1b9a", "#00838f",
];

/// One named series of y values (one per x; `None` is a gap).
pub struct Series<'a> {
    pub name: &'a str,
    pub color: &'a str,
    pub ys: Vec<Option<f64>>,
}

/// Title and axis labels (with units, e.g. "time (s)").
pub struct Labels<'a> {
    pub title: &'a str,
    pub x: &'a str,
    pub y: &'a str,
}

/// Maps data to pixels inside the plot area.
struct Frame {
    x_max: f64,
    y_max: f64,
}

impl Frame {
    fn px(&self, x: f64) -> f64 {
        LEFT + x / self.x_max * (W - LEFT - RIGHT)
    }
    fn py(&self, y: f64) -> f64 {
        H - BOTTOM - y / self.y_max * (H - TOP - BOTTOM)
    }
}

/// Round tick values from 0 past `max`: steps of 1, 2 or 5 × 10^k, about five of them.
pub fn ticks(max: f64) -> Vec<f64> {
    let max = if max > 0.0 && max.is_finite() {
        max
    } else {
        1.0
    };
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let n = (max / step).ceil() as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

/// A tick label: no trailing zeros, thousands as "k".
fn tick_label(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{}k", trim(v / 1_000.0))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The frame, grid, ticks, axis labels and legend; returns the SVG so far and the frame.
fn open(labels: &Labels, xs: &[f64], y_max: f64, legend: &[(&str, &str)]) -> (String, Frame) {
    let x_ticks = ticks(xs.iter().cloned().fold(0.0, f64::max));
    let y_ticks = ticks(y_max);
    let frame = Frame {
        x_max: *x_ticks.last().unwrap_or(&1.0),
        y_max: *y_ticks.last().unwrap_or(&1.0),
    };
    let mut svg = format!(
        "<h2>{t}</h2><svg class=\"chart\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"{t}\" xmlns=\"http://www.w3.org/2000/svg\" font-family=\"system-ui,sans-serif\" font-size=\"12\">",
        t = esc(labels.title)
    );
    grid(&mut svg, &frame, &x_ticks, &y_ticks);
    axis_labels(&mut svg, labels);
    legend_row(&mut svg, legend);
    (svg, frame)
}

fn grid(svg: &mut String, f: &Frame, x_ticks: &[f64], y_ticks: &[f64]) {
    let (bottom, right) = (H - BOTTOM, W - RIGHT);
    for y in y_ticks {
        let py = f.py(*y);
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" y1=\"{py:.1}\" x2=\"{right}\" y2=\"{py:.1}\" stroke=\"#e3e3e3\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT - 6.0,
            py + 4.0,
            tick_label(*y)
        );
    }
    for x in x_ticks {
        let px = f.px(*x);
        let _ = write!(
            svg,
            "<line x1=\"{px:.1}\" y1=\"{bottom}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"#333\"/><text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            bottom + 5.0,
            bottom + 18.0,
            tick_label(*x)
        );
    }
    let _ = write!(
        svg,
        "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{bottom}\" stroke=\"#333\"/><line x1=\"{LEFT}\" y1=\"{bottom}\" x2=\"{right}\" y2=\"{bottom}\" stroke=\"#333\"/>"
    );
}

fn axis_labels(svg: &mut String, labels: &Labels) {
    let mid_y = TOP + (H - TOP - BOTTOM) / 2.0;
    let _ = write!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text><text transform=\"translate(16 {mid_y:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        LEFT + (W - LEFT - RIGHT) / 2.0,
        H - 8.0,
        esc(labels.x),
        esc(labels.y)
    );
}

fn legend_row(svg: &mut String, legend: &[(&str, &str)]) {
    let mut x = LEFT;
    for (name, color) in legend {
        let _ = write!(
            svg,
            "<rect x=\"{x:.1}\" y=\"10\" width=\"12\" height=\"12\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"20\">{}</text>",
            x + 16.0,
            esc(name)
        );
        x += 28.0 + 7.0 * name.len() as f64;
    }
}

fn max_of(series: &[Series]) -> f64 {
    series
        .iter()
        .flat_map(|s| s.ys.iter().flatten())
        .cloned()
        .fold(0.0, f64::max)
}

fn legend<'a>(series: &'a [Series<'a>]) -> Vec<(&'a str, &'a str)> {
    series.iter().map(|s| (s.name, s.color)).collect()
}

/// Lines (with a dot per point, so a lone point shows); gaps break a line.
pub fn lines(labels: &Labels, xs: &[f64], series: &[Series]) -> String {
    let (mut svg, f) = open(labels, xs, max_of(series), &legend(series));
    for s in series {
        for run in runs(xs, &s.ys) {
            let points: Vec<String> = run
                .iter()
                .map(|(x, y)| format!("{:.1},{:.1}", f.px(*x), f.py(*y)))
                .collect();
            let _ = write!(
                svg,
                "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>",
                s.color,
                points.join(" ")
            );
            if run.len() == 1 {
                let (x, y) = run[0];
                let _ = write!(
                    svg,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{}\"/>",
                    f.px(x),
                    f.py(y),
                    s.color
                );
            }
        }
    }
    svg + "</svg>"
}

/// Consecutive points without a gap.
fn runs(xs: &[f64], ys: &[Option<f64>]) -> Vec<Vec<(f64, f64)>> {
    let mut out: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for (x, y) in xs.iter().zip(ys) {
        match y {
            Some(y) => out.last_mut().expect("one run").push((*x, *y)),
            None if out.last().is_some_and(|r| !r.is_empty()) => out.push(Vec::new()),
            None => {}
        }
    }
    out.retain(|r| !r.is_empty());
    out
}

/// Areas stacked in the order given (the first at the bottom); gaps count as 0.
pub fn stacked(labels: &Labels, xs: &[f64], series: &[Series]) -> String {
    let mut base = vec![0.0; xs.len()];
    let mut bands = Vec::new();
    for s in series {
        let top: Vec<f64> = base
            .iter()
            .zip(&s.ys)
            .map(|(b, y)| b + y.unwrap_or(0.0))
            .collect();
        bands.push((base.clone(), top.clone(), s.color));
        base = top;
    }
    let y_max = base.iter().cloned().fold(0.0, f64::max);
    let (mut svg, f) = open(labels, xs, y_max, &legend(series));
    for (low, high, color) in bands {
        let upper = xs
            .iter()
            .zip(&high)
            .map(|(x, y)| format!("{:.1},{:.1}", f.px(*x), f.py(*y)));
        let lower = xs
            .iter()
            .zip(&low)
            .rev()
            .map(|(x, y)| format!("{:.1},{:.1}", f.px(*x), f.py(*y)));
        let points: Vec<String> = upper.chain(lower).collect();
        let _ = write!(
            svg,
            "<polygon fill=\"{color}\" fill-opacity=\"0.8\" stroke=\"{color}\" points=\"{}\"/>",
            points.join(" ")
        );
    }
    svg + "</svg>"
}

/// Bars with a label under each (e.g. a histogram's bins); with many bars, only every few
/// labels are written so they do not overlap.
pub fn bars(labels: &Labels, names: &[String], counts: &[f64], color: &str) -> String {
    let n = counts.len().max(1) as f64;
    let y_ticks = ticks(counts.iter().cloned().fold(0.0, f64::max));
    let frame = Frame {
        x_max: n,
        y_max: *y_ticks.last().unwrap_or(&1.0),
    };
    let mut svg = format!(
        "<h2>{t}</h2><svg class=\"chart\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"{t}\" xmlns=\"http://www.w3.org/2000/svg\" font-family=\"system-ui,sans-serif\" font-size=\"12\">",
        t = esc(labels.title)
    );
    grid(&mut svg, &frame, &[], &y_ticks);
    axis_labels(&mut svg, labels);
    let width = (W - LEFT - RIGHT) / n;
    let label_every = (n / 12.0).ceil().max(1.0) as usize;
    for (i, (name, count)) in names.iter().zip(counts).enumerate() {
        let (x, y) = (frame.px(i as f64), frame.py(*count));
        let _ = write!(
            svg,
            "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{color}\"><title>{}: {count}</title></rect>",
            x + 1.0,
            (width - 2.0).max(1.0),
            H - BOTTOM - y,
            esc(name)
        );
        if i % label_every == 0 {
            let _ = write!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                x + width / 2.0,
                H - BOTTOM + 16.0,
                esc(name)
            );
        }
    }
    svg + "</svg>"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_max() {
        assert_eq!(ticks(9.3), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(
            ticks(1_000.0),
            vec![0.0, 200.0, 400.0, 600.0, 800.0, 1_000.0]
        );
        let empty = ticks(0.0);
        assert_eq!(
            (empty.len(), empty.last()),
            (6, Some(&1.0)),
            "no data: 0 to 1"
        );
        assert_eq!(tick_label(25_000.0), "25k");
        assert_eq!(tick_label(0.25), "0.25");
    }

    #[test]
    fn gaps_split_lines_and_stacks_add_up() {
        let r = runs(
            &[0.0, 1.0, 2.0, 3.0],
            &[Some(1.0), None, Some(2.0), Some(3.0)],
        );
        assert_eq!(r, vec![vec![(0.0, 1.0)], vec![(2.0, 2.0), (3.0, 3.0)]]);
        let labels = Labels {
            title: "t",
            x: "time (s)",
            y: "answers/s",
        };
        let a = Series {
            name: "a",
            color: "#111",
            ys: vec![Some(1.0), Some(2.0)],
        };
        let b = Series {
            name: "b",
            color: "#222",
            ys: vec![Some(3.0), None],
        };
        let svg = stacked(&labels, &[0.0, 1.0], &[a, b]);
        assert_eq!(svg.matches("<polygon").count(), 2);
        assert!(svg.contains("time (s)") && svg.contains("answers/s"));
    }
}
