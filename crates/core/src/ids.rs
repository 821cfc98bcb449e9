//! Identifiers. Every one is validated where it enters the system.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::limits::REQUEST_ID_LEN_MAX;

/// A sale is identified by the SKU it sells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SkuId(pub u64);

/// A buyer, as named by the `sub` of their token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UserId(pub u64);

impl fmt::Display for SkuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The client's id of one purchase attempt, reused on retry: 1..=64 of `[A-Za-z0-9_-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct RequestId(String);

impl TryFrom<String> for RequestId {
    type Error = &'static str;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        RequestId::parse(&s).ok_or("request_id must be 1..=64 of [A-Za-z0-9_-]")
    }
}

impl From<RequestId> for String {
    fn from(id: RequestId) -> String {
        id.0
    }
}

impl RequestId {
    pub fn parse(s: &str) -> Option<RequestId> {
        let ok = !s.is_empty()
            && s.len() <= REQUEST_ID_LEN_MAX
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        ok.then(|| RequestId(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An order number, `<sku>-<epoch>-<seq>`: unique across sales, and any instance can tell the
/// sale from it without a lookup. The epoch grows each time a sale's hot state is rebuilt from
/// the database, so a number handed out before a loss of hot state is never handed out again.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct OrderNo(String);

impl TryFrom<String> for OrderNo {
    type Error = &'static str;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        OrderNo::parse(&s).ok_or("order_no must be <sku>-<epoch>-<seq>")
    }
}

impl From<OrderNo> for String {
    fn from(no: OrderNo) -> String {
        no.0
    }
}

impl OrderNo {
    pub fn new(sku: SkuId, epoch: u64, seq: u64) -> OrderNo {
        OrderNo(format!("{}-{}-{}", sku.0, epoch, seq))
    }

    /// Parses and validates an order number from outside (a URL path).
    pub fn parse(s: &str) -> Option<OrderNo> {
        let mut parts = s.split('-');
        let mut next = || parts.next().and_then(parse_decimal);
        let (_sku, _epoch, _seq) = (next()?, next()?, next()?);
        (s.split('-').count() == 3).then(|| OrderNo(s.to_owned()))
    }

    pub fn sku(&self) -> SkuId {
        SkuId(self.part(0))
    }

    /// The epoch of the hot copy that handed this number out.
    pub fn epoch(&self) -> u64 {
        self.part(1)
    }

    /// The seq of the `deducted` event that created the order.
    pub fn seq(&self) -> u64 {
        self.part(2)
    }

    /// Part `i` of a number that [`OrderNo::parse`] or [`OrderNo::new`] made (so it parses).
    fn part(&self, i: usize) -> u64 {
        self.0
            .split('-')
            .nth(i)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn parse_decimal(s: &str) -> Option<u64> {
    let ok = !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    if ok {
        s.parse().ok()
    } else {
        None
    }
}

impl fmt::Display for OrderNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_validated() {
        assert!(RequestId::parse("abc-DEF_09").is_some());
        assert!(RequestId::parse("").is_none());
        assert!(RequestId::parse("a b").is_none());
        assert!(RequestId::parse("é").is_none());
        assert!(RequestId::parse(&"x".repeat(64)).is_some());
        assert!(RequestId::parse(&"x".repeat(65)).is_none());
    }

    #[test]
    fn order_numbers_round_trip_and_name_their_sale() {
        let no = OrderNo::new(SkuId(42), 1, 17);
        assert_eq!(no.as_str(), "42-1-17");
        assert_eq!(OrderNo::parse("42-1-17"), Some(no.clone()));
        assert_eq!((no.sku(), no.epoch(), no.seq()), (SkuId(42), 1, 17));
        for bad in [
            "",
            "42",
            "42-1",
            "42-1-x",
            "42-1-17-3",
            "-1-2",
            "42--1",
            "1-2-+3",
        ] {
            assert_eq!(OrderNo::parse(bad), None, "{bad}");
        }
    }
}
