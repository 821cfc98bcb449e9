//! Identifiers. Every one is validated where it enters the system.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::limits::REQUEST_ID_LEN_MAX;

/// Serde through an id's text (`#[serde(into = "String", try_from = "String")]`): read by its
/// `parse`, refused with `rule`; written by its `Display`.
macro_rules! text_serde {
    ($id:ident, $rule:literal) => {
        impl TryFrom<String> for $id {
            type Error = &'static str;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                $id::parse(&s).ok_or($rule)
            }
        }

        impl From<$id> for String {
            fn from(id: $id) -> String {
                id.to_string()
            }
        }
    };
}

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

text_serde!(RequestId, "request_id must be 1..=64 of [A-Za-z0-9_-]");

/// The bytes a request id may hold, `[A-Za-z0-9_-]`, as a table: every purchase checks each
/// byte of its id.
static REQUEST_ID_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
        b += 1;
    }
    table
};

impl RequestId {
    pub fn parse(s: &str) -> Option<RequestId> {
        RequestId::is_valid(s).then(|| RequestId(s.to_owned()))
    }

    /// [`RequestId::parse`] of a string the caller owns (a request body's field): kept, not
    /// copied.
    pub fn parse_owned(s: String) -> Option<RequestId> {
        RequestId::is_valid(&s).then_some(RequestId(s))
    }

    fn is_valid(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= REQUEST_ID_LEN_MAX
            && s.bytes().all(|b| REQUEST_ID_BYTES[usize::from(b)])
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

/// The idempotency key of one purchase attempt in a sale: the buyer and the client's request
/// id. Its text form `<user>:<request_id>` is written here and nowhere else in Rust: the field
/// of the Redis `requests` hash (the scripts build the same text, and the conformance suite
/// reads it back through [`RequestKey::parse`]), the entries of a sold-out flag, the holder of a
/// purchase token.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestKey {
    pub user: UserId,
    pub request_id: RequestId,
}

impl RequestKey {
    pub fn new(user: UserId, request_id: RequestId) -> RequestKey {
        RequestKey { user, request_id }
    }

    /// Parses the text form; `None` for anything [`RequestKey`]'s `Display` would not write.
    pub fn parse(s: &str) -> Option<RequestKey> {
        let (user, rid) = s.split_once(':')?;
        let user = parse_decimal(user).filter(|u| u.to_string() == user)?;
        Some(RequestKey::new(UserId(user), RequestId::parse(rid)?))
    }
}

impl fmt::Display for RequestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.user.0, self.request_id)
    }
}

/// An order number: the sale, the epoch of the hot copy that handed it out and the seq of the
/// `deducted` event that created the order. Unique across sales (I8: an epoch is taken in the
/// database for every hot copy, so a number handed out before a loss of hot state is never
/// handed out again), and any instance can tell the sale from it without a lookup. Its text
/// form `<sku>-<epoch>-<seq>` is written here and read here (the scripts build the same text;
/// the conformance suite compares their numbers with [`OrderNo::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct OrderNo {
    pub sku: SkuId,
    pub epoch: u64,
    pub seq: u64,
}

text_serde!(OrderNo, "order_no must be <sku>-<epoch>-<seq>");

impl OrderNo {
    pub fn new(sku: SkuId, epoch: u64, seq: u64) -> OrderNo {
        OrderNo { sku, epoch, seq }
    }

    /// Parses and validates an order number from outside (a URL path, a row, a stream entry):
    /// only the canonical text that `Display` writes.
    pub fn parse(s: &str) -> Option<OrderNo> {
        let mut parts = s.split('-');
        let mut next = || parts.next().and_then(parse_decimal);
        let no = OrderNo::new(SkuId(next()?), next()?, next()?);
        (no.to_string() == s).then_some(no)
    }

    pub fn sku(&self) -> SkuId {
        self.sku
    }

    /// The epoch of the hot copy that handed this number out.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The seq of the `deducted` event that created the order.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl fmt::Display for OrderNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.sku.0, self.epoch, self.seq)
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
        assert!(RequestId::parse_owned("abc-DEF_09".into()).is_some());
        assert!(RequestId::parse_owned("a b".into()).is_none());
    }

    #[test]
    fn request_keys_round_trip_through_their_text() {
        let key = RequestKey::new(UserId(22), RequestId::parse("a-B_9").unwrap());
        assert_eq!(key.to_string(), "22:a-B_9");
        assert_eq!(RequestKey::parse("22:a-B_9"), Some(key));
        for bad in ["", "22", ":a", "x:a", "022:a", "22:", "22:a:b", "22:a b"] {
            assert_eq!(RequestKey::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn order_numbers_round_trip_and_name_their_sale() {
        let no = OrderNo::new(SkuId(42), 1, 17);
        assert_eq!(no.to_string(), "42-1-17");
        assert_eq!(OrderNo::parse("42-1-17"), Some(no));
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
            "042-1-17",
        ] {
            assert_eq!(OrderNo::parse(bad), None, "{bad}");
        }
    }
}
