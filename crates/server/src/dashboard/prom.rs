//! Reads the Prometheus text exposition that the process's own recorder renders, so the
//! dashboard shows exactly the numbers `/metrics` exports (the recorder has no API to read one
//! value back). Also the quantile of a histogram from its cumulative buckets.

/// One sample line: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Every sample of `text`; comments and lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let (name, rest) = match line.find('{') {
        Some(i) => (&line[..i], &line[i + 1..]),
        None => {
            let (name, value) = line.split_once(' ')?;
            return Some(Sample {
                name: name.to_owned(),
                labels: Vec::new(),
                value: parse_value(value)?,
            });
        }
    };
    let (labels, after) = parse_labels(rest)?;
    Some(Sample {
        name: name.to_owned(),
        labels,
        value: parse_value(after)?,
    })
}

/// A value, ignoring an optional timestamp after it.
fn parse_value(s: &str) -> Option<f64> {
    let v = s.split_whitespace().next()?;
    match v {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => v.parse().ok(),
    }
}

/// `k="v",k2="v2"} rest` → the labels and `rest`. Values may hold `\"`, `\\` and `\n`.
fn parse_labels(s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after_eq) = rest.split_once("=\"")?;
        let (value, after_value) = unescape_until_quote(after_eq)?;
        labels.push((key.to_owned(), value));
        rest = after_value;
    }
}

fn unescape_until_quote(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &s[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                other => out.push(other),
            },
            _ => out.push(c),
        }
    }
    None
}

/// Cumulative bucket counts of one histogram series: `(upper bound, count)`, ascending.
pub type Buckets = Vec<(f64, f64)>;

/// The buckets of histogram `name` whose samples carry `label == value` (or all, when
/// `label` is empty), summed over the other labels.
pub fn buckets(samples: &[Sample], name: &str, label: &str, value: &str) -> Buckets {
    let bucket_name = format!("{name}_bucket");
    let mut out: Buckets = Vec::new();
    for s in samples.iter().filter(|s| s.name == bucket_name) {
        if !label.is_empty() && s.label(label) != Some(value) {
            continue;
        }
        let Some(le) = s.label("le").and_then(parse_value) else {
            continue;
        };
        match out.iter_mut().find(|(b, _)| *b == le) {
            Some((_, n)) => *n += s.value,
            None => out.push((le, s.value)),
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// `now − before`, bucket by bucket (a window between two readings).
pub fn minus(now: &Buckets, before: &Buckets) -> Buckets {
    now.iter()
        .map(|(le, n)| {
            let old = before
                .iter()
                .find(|(b, _)| b == le)
                .map_or(0.0, |(_, o)| *o);
            (*le, (n - old).max(0.0))
        })
        .collect()
}

/// The `q` quantile as the upper bound of the bucket that holds it (what Prometheus'
/// `histogram_quantile` would interpolate inside; the bound is the honest answer at this
/// resolution). `None` without observations; the last finite bound past the top.
pub fn quantile(b: &Buckets, q: f64) -> Option<f64> {
    let total = b.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let last_finite = b.iter().rev().find(|(le, _)| le.is_finite()).map(|x| x.0);
    b.iter().find(|(_, n)| *n >= rank).map(|(le, _)| {
        if le.is_finite() {
            *le
        } else {
            last_finite.unwrap_or(*le)
        }
    })
}

/// The value of the first sample named `name` with `label == value` (empty `label`: any).
pub fn value(samples: &[Sample], name: &str, label: &str, value: &str) -> Option<f64> {
    samples
        .iter()
        .filter(|s| s.name == name)
        .find(|s| label.is_empty() || s.label(label) == Some(value))
        .map(|s| s.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE x counter\n\
        flashsale_breaker_open 1\n\
        flashsale_stream_lag_events{sku=\"7\"} 12\n\
        lat_bucket{script=\"purchase\",le=\"0.001\"} 5\n\
        lat_bucket{script=\"purchase\",le=\"0.01\"} 9\n\
        lat_bucket{script=\"purchase\",le=\"+Inf\"} 10\n\
        odd{v=\"a\\\"b,c}\"} 3\n";

    #[test]
    fn parses_samples_labels_and_escapes() {
        let s = parse(TEXT);
        assert_eq!(value(&s, "flashsale_breaker_open", "", ""), Some(1.0));
        assert_eq!(
            value(&s, "flashsale_stream_lag_events", "sku", "7"),
            Some(12.0)
        );
        assert_eq!(value(&s, "odd", "v", "a\"b,c}"), Some(3.0));
    }

    #[test]
    fn quantiles_come_from_the_bucket_that_holds_the_rank() {
        let s = parse(TEXT);
        let b = buckets(&s, "lat", "script", "purchase");
        assert_eq!(quantile(&b, 0.5), Some(0.001));
        assert_eq!(quantile(&b, 0.9), Some(0.01));
        assert_eq!(
            quantile(&b, 0.99),
            Some(0.01),
            "+Inf reads as the last bound"
        );
        let none = minus(&b, &b);
        assert_eq!(quantile(&none, 0.5), None);
    }
}
