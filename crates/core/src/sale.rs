//! A sale: what it sells, its rules, its state and its counters.

use serde::{Deserialize, Serialize};

use crate::admission::Admission;
use crate::buckets::{self, BUCKETS_MAX};
use crate::ids::SkuId;
use crate::limits::{
    PAYMENT_TIMEOUT_MS_MAX, PER_USER_LIMIT_MAX, SALE_NAME_LEN_MAX, SCRIPT_INT_MAX, TOTAL_STOCK_MAX,
};

/// How a purchase takes stock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum SaleMode {
    /// available → sold at once.
    #[default]
    Direct,
    /// available → reserved; pay moves it to sold, cancel and expiry give it back.
    Reserve,
}

/// The state an operator sets. The time window is judged apart from it, by the ledger's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum SaleState {
    /// Created, not yet warmed into the hot ledger.
    Scheduled,
    Live,
    Paused,
    Ended,
}

impl SaleMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SaleMode::Direct => "direct",
            SaleMode::Reserve => "reserve",
        }
    }

    pub fn parse(s: &str) -> Option<SaleMode> {
        match s {
            "direct" => Some(SaleMode::Direct),
            "reserve" => Some(SaleMode::Reserve),
            _ => None,
        }
    }
}

impl SaleState {
    pub fn as_str(self) -> &'static str {
        match self {
            SaleState::Scheduled => "scheduled",
            SaleState::Live => "live",
            SaleState::Paused => "paused",
            SaleState::Ended => "ended",
        }
    }

    pub fn parse(s: &str) -> Option<SaleState> {
        match s {
            "scheduled" => Some(SaleState::Scheduled),
            "live" => Some(SaleState::Live),
            "paused" => Some(SaleState::Paused),
            "ended" => Some(SaleState::Ended),
            _ => None,
        }
    }
}

/// A sale's definition. Times are Unix epoch milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Sale {
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub sku_id: SkuId,
    pub name: String,
    pub total_stock: u64,
    pub per_user_limit: u32,
    pub mode: SaleMode,
    /// Reserve mode: how long a hold waits for payment.
    pub payment_timeout_ms: u64,
    pub starts_at_ms: i64,
    pub ends_at_ms: i64,
    pub state: SaleState,
    /// How many hot copies (buckets) the stock is split over, 1..=[`BUCKETS_MAX`]; 1 (the
    /// default) is one hot copy, the layout of a sale without buckets.
    #[serde(default = "one_bucket")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 64, default = 1))]
    pub buckets: u16,
    /// Who may buy: `admission` (`open`, the default; `queue`; `draw`) and its times.
    #[serde(flatten, default)]
    #[cfg_attr(feature = "openapi", schema(inline))]
    pub admission: Admission,
}

fn one_bucket() -> u16 {
    1
}

impl Sale {
    /// A live direct sale that is always open (from 0 to the latest time a sale may end),
    /// one unit per buyer: the one fixture of tests and benches. A test changes what it
    /// needs with `Sale { per_user_limit: 2, ..Sale::always_open(sku, total) }`.
    pub fn always_open(sku_id: SkuId, total_stock: u64) -> Sale {
        Sale {
            sku_id,
            name: "sale".into(),
            total_stock,
            per_user_limit: 1,
            mode: SaleMode::Direct,
            payment_timeout_ms: 0,
            starts_at_ms: 0,
            ends_at_ms: SCRIPT_INT_MAX as i64,
            state: SaleState::Live,
            buckets: 1,
            admission: Admission::default(),
        }
    }

    /// Checks the definition; the message names the first field that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.sku_id.0 == 0 || self.sku_id.0 > SCRIPT_INT_MAX {
            return Err(format!("sku_id must be 1..={SCRIPT_INT_MAX}"));
        }
        if self.name.is_empty() || self.name.len() > SALE_NAME_LEN_MAX {
            return Err(format!("name must be 1..={SALE_NAME_LEN_MAX} bytes"));
        }
        if self.total_stock == 0 || self.total_stock > TOTAL_STOCK_MAX {
            return Err(format!("total_stock must be 1..={TOTAL_STOCK_MAX}"));
        }
        if self.per_user_limit == 0 || self.per_user_limit > PER_USER_LIMIT_MAX {
            return Err(format!("per_user_limit must be 1..={PER_USER_LIMIT_MAX}"));
        }
        let timeout_ok = (1..=PAYMENT_TIMEOUT_MS_MAX).contains(&self.payment_timeout_ms);
        if self.mode == SaleMode::Reserve && !timeout_ok {
            return Err(format!(
                "payment_timeout_ms must be 1..={PAYMENT_TIMEOUT_MS_MAX}"
            ));
        }
        if self.ends_at_ms <= self.starts_at_ms || self.starts_at_ms < 0 {
            return Err("ends_at_ms must be after starts_at_ms (both >= 0)".into());
        }
        if self.ends_at_ms as u64 > SCRIPT_INT_MAX {
            return Err(format!("ends_at_ms must be at most {SCRIPT_INT_MAX}"));
        }
        if !buckets::valid_count(self.buckets) {
            return Err(format!("buckets must be 1..={BUCKETS_MAX}"));
        }
        self.admission.validate(self)
    }

    /// Counters of a sale that has sold nothing.
    pub fn fresh_counters(&self) -> Counters {
        Counters {
            total: self.total_stock,
            available: self.total_stock,
            reserved: 0,
            sold: 0,
            seq: 0,
        }
    }
}

/// A sale's stock counters at `seq`. Always `available + reserved + sold == total` (I2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Counters {
    pub total: u64,
    pub available: u64,
    pub reserved: u64,
    pub sold: u64,
    /// Number of state changes (events) applied.
    pub seq: u64,
}

/// Whether nothing can change a sale any more. `end` is final: a sale ended in the database
/// (`state`, `db`) and in its hot copy (`hot`: the copy's state and seq; its scripts then
/// accept no purchase) with no unit reserved (no payment, cancellation or expiry can come)
/// changes no more, once the database is at the copy's seq. With no hot copy (`None`) nothing
/// can write either. The caller adds that nothing is in flight in the stream.
pub fn settled(state: SaleState, db: &Counters, hot: Option<(SaleState, u64)>) -> bool {
    state == SaleState::Ended
        && db.reserved == 0
        && hot.is_none_or(|(hot_state, seq)| hot_state == SaleState::Ended && seq == db.seq)
}

impl Counters {
    /// Field by field sum (a sale's counters over its buckets).
    pub fn plus(&self, other: &Counters) -> Counters {
        Counters {
            total: self.total + other.total,
            available: self.available + other.available,
            reserved: self.reserved + other.reserved,
            sold: self.sold + other.sold,
            seq: self.seq + other.seq,
        }
    }

    /// I2: conservation.
    pub fn conserved(&self) -> bool {
        self.available
            .checked_add(self.reserved)
            .and_then(|s| s.checked_add(self.sold))
            == Some(self.total)
    }

    /// Applies a delta, or says why it cannot (a counter would go negative).
    pub fn apply(&self, delta: Delta) -> Option<Counters> {
        Some(Counters {
            total: self.total,
            available: add_signed(self.available, delta.available)?,
            reserved: add_signed(self.reserved, delta.reserved)?,
            sold: add_signed(self.sold, delta.sold)?,
            seq: self.seq + 1,
        })
    }

    /// Undoes a delta (used to fold in-flight events out of hot counters).
    pub fn unapply(&self, delta: Delta) -> Option<Counters> {
        let back = Delta {
            available: -delta.available,
            reserved: -delta.reserved,
            sold: -delta.sold,
        };
        let mut c = self.apply(back)?;
        c.seq = self.seq.checked_sub(1)?;
        Some(c)
    }
}

fn add_signed(value: u64, delta: i64) -> Option<u64> {
    if delta >= 0 {
        value.checked_add(delta as u64)
    } else {
        value.checked_sub(delta.unsigned_abs())
    }
}

/// How one event moves the counters. Always sums to zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Delta {
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

impl Delta {
    pub fn plus(self, other: Delta) -> Delta {
        Delta {
            available: self.available + other.available,
            reserved: self.reserved + other.reserved,
            sold: self.sold + other.sold,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sale() -> Sale {
        Sale {
            sku_id: SkuId(1),
            name: "x".into(),
            total_stock: 10,
            per_user_limit: 1,
            mode: SaleMode::Direct,
            payment_timeout_ms: 0,
            starts_at_ms: 0,
            ends_at_ms: 1,
            state: SaleState::Scheduled,
            buckets: 1,
            admission: Default::default(),
        }
    }

    #[test]
    fn validation_names_the_bad_field() {
        assert!(sale().validate().is_ok());
        let with = |change: fn(&mut Sale)| {
            let mut s = sale();
            change(&mut s);
            s
        };
        let cases = [
            (with(|s| s.total_stock = 0), "total_stock"),
            (with(|s| s.per_user_limit = 0), "per_user_limit"),
            (with(|s| s.mode = SaleMode::Reserve), "payment_timeout_ms"),
            (with(|s| s.ends_at_ms = 0), "ends_at_ms"),
            (with(|s| s.buckets = 0), "buckets"),
            (with(|s| s.buckets = BUCKETS_MAX + 1), "buckets"),
        ];
        for (bad, field) in cases {
            assert!(bad.validate().unwrap_err().contains(field), "{field}");
        }
    }

    #[test]
    fn the_fixture_is_a_valid_sale() {
        Sale::always_open(SkuId(1), 10).validate().unwrap();
    }

    #[test]
    fn counters_apply_and_unapply() {
        let c = sale().fresh_counters();
        let d = Delta {
            available: -3,
            reserved: 0,
            sold: 3,
        };
        let after = c.apply(d).unwrap();
        assert_eq!((after.available, after.sold, after.seq), (7, 3, 1));
        assert!(after.conserved());
        assert_eq!(after.unapply(d), Some(c));
        let too_much = Delta {
            available: -11,
            reserved: 0,
            sold: 11,
        };
        assert_eq!(c.apply(too_much), None);
    }

    #[test]
    fn a_sale_is_settled_once_ended_everywhere_with_nothing_reserved_and_all_applied() {
        let ended = SaleState::Ended;
        let db = Counters {
            total: 10,
            available: 7,
            reserved: 0,
            sold: 3,
            seq: 3,
        };
        assert!(settled(ended, &db, Some((ended, 3))));
        assert!(settled(ended, &db, None), "no copy: nothing can write");
        assert!(!settled(SaleState::Live, &db, Some((ended, 3))));
        assert!(
            !settled(ended, &db, Some((SaleState::Live, 3))),
            "the copy still sells"
        );
        assert!(
            !settled(ended, &db, Some((ended, 4))),
            "an event not applied yet"
        );
        let holding = Counters {
            available: 6,
            reserved: 1,
            ..db
        };
        assert!(
            !settled(ended, &holding, Some((ended, 3))),
            "a hold may still resolve"
        );
    }
}
