//! Reading the Prometheus text format (what `/metrics` answers) in tests: one sample's value,
//! or a metric's values by one label.

use std::collections::HashMap;

/// The value of `sample` (a metric name with its labels as exported, e.g.
/// `flashsale_backpressure_engaged{sku="51"}`), if the text has it.
pub fn value(text: &str, sample: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(sample)?;
        rest.starts_with(' ').then(|| rest.trim().parse().ok())?
    })
}

/// Every sample of metric `name` that has label `label`, by that label's value.
pub fn by_label(text: &str, name: &str, label: &str) -> HashMap<String, f64> {
    let open = format!("{name}{{");
    let key = format!("{label}=\"");
    text.lines()
        .filter(|line| line.starts_with(&open))
        .filter_map(|line| {
            let of = line.split(&key).nth(1)?.split('"').next()?.to_owned();
            let n = line.rsplit(' ').next()?.parse().ok()?;
            Some((of, n))
        })
        .collect()
}
