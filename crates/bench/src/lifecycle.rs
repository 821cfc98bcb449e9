//! A reserve-mode sale's holds over time: reservations, payments, cancellations, expiries and
//! resales (reservations of units that came back), counted from the database's events, and
//! their chart for the report.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::charts::{self, Labels, Series, PALETTE};

/// What one event of the sale was, for the lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    Reservation,
    Payment,
    Cancellation,
    Expiry,
    /// A reservation of a unit an earlier hold gave back (cancelled or expired).
    Resale,
}

impl Step {
    pub const ALL: [Step; 5] = [
        Step::Reservation,
        Step::Payment,
        Step::Cancellation,
        Step::Expiry,
        Step::Resale,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Step::Reservation => "reservations",
            Step::Payment => "payments",
            Step::Cancellation => "cancellations",
            Step::Expiry => "expiries",
            Step::Resale => "resales",
        }
    }
}

/// Most bins of the over-time series (a long run gets wider bins, never a longer series).
const BINS_MAX: u64 = 200;
/// Narrowest bin, ms.
const BIN_MS_MIN: u64 = 50;

/// Units per step in total, and cumulatively at the end of each time bin.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Lifecycle {
    pub totals: BTreeMap<String, u64>,
    /// Width of a bin, ms.
    pub bin_ms: u64,
    /// End of each bin, ms since the first event.
    pub t_ms: Vec<u64>,
    /// Units per step, cumulative at the end of each bin.
    pub cumulative: BTreeMap<String, Vec<u64>>,
}

impl Lifecycle {
    /// From `(at_ms, step, units)` of every event, in any order.
    pub fn from_steps(steps: &[(i64, Step, u64)]) -> Lifecycle {
        let Some(start) = steps.iter().map(|s| s.0).min() else {
            return Lifecycle::default();
        };
        let span = steps.iter().map(|s| s.0).max().unwrap_or(start) - start;
        let span = u64::try_from(span).unwrap_or(0);
        let bin_ms = span.div_ceil(BINS_MAX).max(BIN_MS_MIN);
        let bins = (span / bin_ms + 1) as usize;
        let mut per_bin: BTreeMap<Step, Vec<u64>> =
            Step::ALL.iter().map(|s| (*s, vec![0; bins])).collect();
        for &(at, step, units) in steps {
            let bin = (u64::try_from(at - start).unwrap_or(0) / bin_ms) as usize;
            per_bin.get_mut(&step).expect("every step")[bin.min(bins - 1)] += units;
        }
        let cumulative = per_bin
            .iter()
            .map(|(step, counts)| {
                let sums = counts.iter().scan(0, |acc, n| {
                    *acc += n;
                    Some(*acc)
                });
                (step.name().to_owned(), sums.collect::<Vec<u64>>())
            })
            .collect::<BTreeMap<_, _>>();
        Lifecycle {
            totals: cumulative
                .iter()
                .map(|(k, v)| (k.clone(), v.last().copied().unwrap_or(0)))
                .collect(),
            bin_ms,
            t_ms: (1..=bins as u64).map(|i| i * bin_ms).collect(),
            cumulative,
        }
    }

    /// The chart of the cumulative series.
    pub fn chart(&self) -> String {
        let t: Vec<f64> = self.t_ms.iter().map(|ms| *ms as f64 / 1_000.0).collect();
        let series: Vec<Series> = Step::ALL
            .iter()
            .enumerate()
            .filter_map(|(i, step)| {
                let ys = self.cumulative.get(step.name())?;
                Some(Series {
                    name: step.name(),
                    color: PALETTE[i % PALETTE.len()],
                    ys: ys.iter().map(|v| Some(*v as f64)).collect(),
                })
            })
            .collect();
        charts::lines(
            &Labels {
                title: "Holds over time: reserved, paid, cancelled, expired, resold (cumulative)",
                x: "time since the first reservation (s)",
                y: "units",
            },
            &t,
            &series,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_binned_and_summed() {
        let l = Lifecycle::from_steps(&[
            (1_000, Step::Reservation, 1),
            (1_010, Step::Reservation, 2),
            (1_120, Step::Payment, 1),
            (1_260, Step::Expiry, 2),
            (1_300, Step::Resale, 2),
        ]);
        assert_eq!(l.bin_ms, BIN_MS_MIN);
        assert_eq!(l.t_ms.len(), 7);
        assert_eq!(l.cumulative["reservations"], vec![3; 7]);
        assert_eq!(l.cumulative["payments"], vec![0, 0, 1, 1, 1, 1, 1]);
        assert_eq!(l.totals["expiries"], 2);
        assert_eq!(l.totals["resales"], 2);
        assert_eq!(l.totals["cancellations"], 0);
        assert!(Lifecycle::from_steps(&[]).t_ms.is_empty());
    }
}
