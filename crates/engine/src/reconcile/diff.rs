//! Hot counters (in-flight events folded out) against the database's, field by field (I6).

use flashsale_core::Counters;
use serde::{Deserialize, Serialize};

/// Counters of the two sides and their difference per field (hot folded minus database).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Diff {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
    pub seq: i64,
}

impl Diff {
    pub fn between(hot: &Counters, db: &Counters) -> Diff {
        let d = |h: u64, d: u64| h as i64 - d as i64;
        Diff {
            total: d(hot.total, db.total),
            available: d(hot.available, db.available),
            reserved: d(hot.reserved, db.reserved),
            sold: d(hot.sold, db.sold),
            seq: d(hot.seq, db.seq),
        }
    }

    pub fn is_zero(&self) -> bool {
        self.fields().iter().all(|(_, v)| *v == 0)
    }

    pub fn fields(&self) -> [(&'static str, i64); 5] {
        [
            ("total", self.total),
            ("available", self.available),
            ("reserved", self.reserved),
            ("sold", self.sold),
            ("seq", self.seq),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffs_name_every_field() {
        let hot = Counters {
            total: 10,
            available: 4,
            reserved: 1,
            sold: 5,
            seq: 7,
        };
        assert!(Diff::between(&hot, &hot).is_zero());
        let db = Counters {
            sold: 4,
            available: 5,
            ..hot
        };
        let d = Diff::between(&hot, &db);
        assert_eq!((d.available, d.sold, d.seq), (-1, 1, 0));
        assert!(!d.is_zero());
    }
}
