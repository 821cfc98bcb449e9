//! The key schema. Every key of one hot copy carries one hash tag, so every script of a copy
//! touches one Redis Cluster slot; the few keys shared by all sales are never touched inside a
//! script. A sale of one bucket is one copy tagged `{<sku>}`; a sale of several buckets has a
//! copy per bucket, bucket 0 tagged `{<sku>}` and bucket b `{<sku>.<b>.<salt>}`
//! ([`CopyTag`], [`crate::placement::bucket_tag`]).

use flashsale_core::SkuId;

use crate::placement;

/// The hot copy a key belongs to: a sale's own (bucket 0) or one of its buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CopyTag {
    pub sku: SkuId,
    pub bucket: u16,
    /// Chosen when the sale is placed (`placement::place`); 0 for bucket 0.
    pub salt: u32,
}

impl CopyTag {
    pub fn new(sku: SkuId, bucket: u16, salt: u32) -> CopyTag {
        CopyTag { sku, bucket, salt }
    }
}

impl From<SkuId> for CopyTag {
    fn from(sku: SkuId) -> CopyTag {
        CopyTag::new(sku, 0, 0)
    }
}

impl std::fmt::Display for CopyTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.bucket == 0 {
            write!(f, "{}", self.sku.0)
        } else {
            f.write_str(&placement::bucket_tag(self.sku, self.bucket, self.salt))
        }
    }
}

/// Builds the keys of a prefix (default `fs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Default for Keys {
    fn default() -> Self {
        Keys {
            prefix: "fs".into(),
        }
    }
}

impl Keys {
    /// A prefix must be non-empty and free of `{`, `}` and whitespace (a brace would change the
    /// hash tag and so the slot of every key).
    pub fn new(prefix: &str) -> Result<Keys, String> {
        let ok = !prefix.is_empty()
            && prefix.len() <= 64
            && !prefix
                .chars()
                .any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control());
        if ok {
            Ok(Keys {
                prefix: prefix.to_owned(),
            })
        } else {
            Err(format!(
                "bad key prefix {prefix:?}: 1..=64 chars, no braces or spaces"
            ))
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn tagged(&self, copy: impl Into<CopyTag>, what: &str) -> String {
        format!("{}:{{{}}}:{}", self.prefix, copy.into(), what)
    }

    /// Hash: counters, seq, epoch, limit, mode, timeout_ms, starts_at_ms, ends_at_ms, state, sku.
    pub fn sale(&self, copy: impl Into<CopyTag>) -> String {
        self.tagged(copy, "sale")
    }

    /// Hash: user id → units held in live orders.
    pub fn buyers(&self, copy: impl Into<CopyTag>) -> String {
        self.tagged(copy, "buyers")
    }

    /// Hash: `<user>:<request_id>` → order_no of the accepted request (replay).
    pub fn requests(&self, copy: impl Into<CopyTag>) -> String {
        self.tagged(copy, "requests")
    }

    /// Hash: order_no → encoded order (see `scripts::decode_order`).
    pub fn orders(&self, copy: impl Into<CopyTag>) -> String {
        self.tagged(copy, "orders")
    }

    /// Hash (a copy of layout 2): user id → the buyer's record, its orders with their request
    /// ids, whose live units count against the limit (`scripts/records.lua`).
    pub fn records(&self, copy: impl Into<CopyTag>) -> String {
        self.tagged(copy, "rec")
    }

    /// Sorted set (a copy of layout 2): one member per purchase call that accepted anything,
    /// scored by its first seq: the buyer of each of its seqs and their orders' creation time.
    pub fn batches(&self, copy: impl Into<CopyTag>) -> String {
        self.tagged(copy, "seqs")
    }

    /// Sorted set: order_no of each hold, scored by its payment deadline (epoch ms).
    pub fn holds(&self, copy: impl Into<CopyTag>) -> String {
        self.tagged(copy, "holds")
    }

    /// Stream: one entry per event of the sale.
    pub fn events(&self, copy: impl Into<CopyTag>) -> String {
        self.tagged(copy, "events")
    }

    /// String: the persister lease of the sale (owner name, with a TTL).
    pub fn lease(&self, copy: impl Into<CopyTag>) -> String {
        self.tagged(copy, "lease")
    }

    /// String: a counter bumped right after a write script when writes wait for replicas
    /// (`WAIT`, in the same pipeline): a replay writes nothing, and a server that moves a
    /// connection's WAIT offset only with its own writes would otherwise confirm it at once.
    pub fn wait_mark(&self, copy: impl Into<CopyTag>) -> String {
        self.tagged(copy, "wait")
    }

    /// Hash: transfer id → `<to bucket>:<units>` of each transfer out of this bucket whose in
    /// side is not known done (`transfer_out.lua`; the mover deletes it once the in is done).
    pub fn transfers_out(&self, copy: impl Into<CopyTag>) -> String {
        self.tagged(copy, "xout")
    }

    /// Hash: transfer id → units of each transfer taken into this bucket (`transfer_in.lua`):
    /// an in applied twice counts once.
    pub fn transfers_in(&self, copy: impl Into<CopyTag>) -> String {
        self.tagged(copy, "xin")
    }

    /// The keys of a sale's admission state, in the order `scripts/admission.lua` takes them:
    /// adm, joins, pre, waves, wave_at, bought, entries, entry_list.
    pub fn admission(&self, sku: SkuId) -> [String; 8] {
        [
            "adm",
            "adm:joins",
            "adm:pre",
            "adm:waves",
            "adm:wave_at",
            "adm:bought",
            "adm:entries",
            "adm:entry_list",
        ]
        .map(|what| self.tagged(sku, what))
    }

    /// Every per-sale key, in a fixed order (for tests and tools): the copy's state
    /// ([`Keys::copy_state`]), then its events, lease, wait mark and transfers.
    pub fn all_of_sale(&self, copy: impl Into<CopyTag>) -> [String; 12] {
        let sku = copy.into();
        let rest = [
            self.events(sku),
            self.lease(sku),
            self.wait_mark(sku),
            self.transfers_out(sku),
            self.transfers_in(sku),
        ];
        let mut all = self.copy_state(sku).into_iter().chain(rest);
        std::array::from_fn(|_| all.next().expect("7 + 5 keys"))
    }

    /// The keys that hold a copy's state, in the order `load` and `restore_orders` take them:
    /// sale, buyers, requests, orders, holds (layout 1's hashes and the holds), records,
    /// batches (layout 2's).
    pub fn copy_state(&self, copy: impl Into<CopyTag>) -> [String; 7] {
        let sku = copy.into();
        [
            self.sale(sku),
            self.buyers(sku),
            self.requests(sku),
            self.orders(sku),
            self.holds(sku),
            self.records(sku),
            self.batches(sku),
        ]
    }

    /// The keys `scripts/transfer_out.lua` takes at a transfer's source, in its order: sale,
    /// events, transfers out.
    pub fn transfer_out_side(&self, source: impl Into<CopyTag>) -> [String; 3] {
        let source = source.into();
        [
            self.sale(source),
            self.events(source),
            self.transfers_out(source),
        ]
    }

    /// The keys `scripts/transfer_in.lua` takes at a transfer's destination, in its order:
    /// sale, events, transfers in.
    pub fn transfer_in_side(&self, destination: impl Into<CopyTag>) -> [String; 3] {
        let destination = destination.into();
        [
            self.sale(destination),
            self.events(destination),
            self.transfers_in(destination),
        ]
    }

    /// Set: sku ids of warm sales. Never touched inside a script (no hash tag).
    pub fn sales(&self) -> String {
        format!("{}:sales", self.prefix)
    }

    /// Set: blocked user ids. Never touched inside a script.
    pub fn blacklist(&self) -> String {
        format!("{}:blacklist", self.prefix)
    }

    /// Pub/sub channel: a sku whose stock came back from 0 (cancel, expiry).
    pub fn restock_channel(&self) -> String {
        format!("{}:restock", self.prefix)
    }
}

/// CRC16/XMODEM (poly 0x1021, init 0), as Redis Cluster uses for key slots.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The Redis Cluster slot of a key, honoring a hash tag: the bytes between the first `{` and
/// the next `}`, when that is non-empty.
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_schema() {
        let k = Keys::default();
        assert_eq!(k.sale(SkuId(42)), "fs:{42}:sale");
        assert_eq!(k.events(SkuId(42)), "fs:{42}:events");
        assert_eq!(k.sales(), "fs:sales");
        assert_eq!(k.blacklist(), "fs:blacklist");
        assert_eq!(k.restock_channel(), "fs:restock");
        assert!(Keys::new("a{b").is_err());
        assert!(Keys::new("").is_err());
        assert_eq!(Keys::new("t1").unwrap().buyers(SkuId(7)), "t1:{7}:buyers");
    }

    #[test]
    fn crc16_matches_redis_cluster() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("bar"), 5061);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(slot("foo{{bar}}zap"), crc16(b"{bar") % 16384);
        assert_eq!(slot("foo{bar}{zap}"), slot("bar"));
    }

    #[test]
    fn every_key_of_a_sale_hashes_to_one_slot() {
        let k = Keys::new("fs").unwrap();
        for sku in [1u64, 42, 7_777, u64::MAX] {
            let keys = k.all_of_sale(SkuId(sku));
            let first = slot(&keys[0]);
            assert!(keys.iter().all(|key| slot(key) == first), "{keys:?}");
            assert_eq!(first, slot(&sku.to_string()));
        }
        assert_ne!(slot(&k.sale(SkuId(1))), slot(&k.sale(SkuId(2))));
        let admission = k.admission(SkuId(42));
        assert!(admission.iter().all(|key| slot(key) == slot("42")));
    }
}
