//! Who may buy a sale: anyone (`open`), the buyers a waiting room admits (`queue`), or the
//! winners of a draw (`draw`). Everything here is a pure function of its arguments, so that
//! anyone can recompute an order or a draw from what the service publishes:
//!
//! - **Rank of a user under a seed**: `SHA-256(seed ‖ user_id)`, the seed's 32 bytes followed
//!   by the user id as 8 bytes big-endian, compared as bytes; ties (never seen: the ids differ)
//!   broken by the user id. [`rank_key`].
//! - **Pre-queue shuffle**: the users who joined a queue before the sale's start, sorted by
//!   their rank ([`shuffle`]); they take places 1..=P, then later joins take P+1, P+2, … in
//!   join order ([`place_after_start`]).
//! - **Draw**: the entries sorted by rank form the waitlist; walking it, an entry wins when
//!   its quantity still fits in the stock left ([`draw`]). A winner whose reservation lapses
//!   hands its units to the next entries of the same walk.
//! - **Commitment**: the seed's SHA-256 in hex ([`commitment`]) is published when the queue or
//!   the entry window opens; the seed (hex) once the order is fixed.
//! - **Waves**: how many admitted buyers may be shopping at once ([`wave_window`]) and the
//!   next admission cursor ([`next_cursor`]).
//! - **Admission pass**: `v1.<sku>.<user>.<expires_at_ms>.<hex HMAC-SHA-256>` ([`pass`]).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::StoreError;
use crate::ids::{SkuId, UserId};
use crate::limits::SCRIPT_INT_MAX;
use crate::sale::{Sale, SaleMode};

/// Most buyers one queue holds, and most entries one draw takes: a bound on the state one
/// sale keeps.
pub const QUEUE_LEN_MAX: u64 = 1_000_000;

/// How a sale admits its buyers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum AdmissionMode {
    /// Anyone may buy (no admission step).
    #[default]
    Open,
    /// A waiting room: a shuffled pre-queue, then join order; admitted in waves.
    Queue,
    /// Entries in a window, winners drawn at `draw_at_ms`, each a reservation.
    Draw,
}

impl AdmissionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionMode::Open => "open",
            AdmissionMode::Queue => "queue",
            AdmissionMode::Draw => "draw",
        }
    }

    pub fn parse(s: &str) -> Option<AdmissionMode> {
        match s {
            "open" => Some(AdmissionMode::Open),
            "queue" => Some(AdmissionMode::Queue),
            "draw" => Some(AdmissionMode::Draw),
            _ => None,
        }
    }
}

/// A sale's admission and its times (ms since the Unix epoch), flattened into the sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Admission {
    #[serde(rename = "admission", default)]
    pub mode: AdmissionMode,
    /// A queue: when buyers may join (before `starts_at_ms`). A draw: when entries open.
    /// 0 for an open sale.
    #[serde(default)]
    pub admission_opens_at_ms: i64,
    /// A draw: when entries close and the winners are drawn (at or after `starts_at_ms`,
    /// before `ends_at_ms`). 0 otherwise.
    #[serde(default)]
    pub draw_at_ms: i64,
}

impl Admission {
    /// Checks the admission against its sale; the message names the field that is wrong.
    pub fn validate(&self, sale: &Sale) -> Result<(), String> {
        let opens = self.admission_opens_at_ms;
        let draw = self.draw_at_ms;
        if opens < 0 || opens as u64 > SCRIPT_INT_MAX || draw < 0 || draw as u64 > SCRIPT_INT_MAX {
            return Err(format!(
                "admission_opens_at_ms and draw_at_ms must be 0..={SCRIPT_INT_MAX}"
            ));
        }
        match self.mode {
            AdmissionMode::Open if opens != 0 || draw != 0 => {
                Err("admission_opens_at_ms and draw_at_ms are for a queue or a draw".into())
            }
            AdmissionMode::Open => Ok(()),
            AdmissionMode::Queue if opens >= sale.starts_at_ms => {
                Err("admission_opens_at_ms must be before starts_at_ms".into())
            }
            AdmissionMode::Queue if draw != 0 => Err("draw_at_ms is for a draw".into()),
            AdmissionMode::Queue => Ok(()),
            AdmissionMode::Draw if sale.mode != SaleMode::Reserve => {
                Err("mode must be reserve for a draw (each winner gets a reservation)".into())
            }
            AdmissionMode::Draw if opens >= draw => {
                Err("admission_opens_at_ms must be before draw_at_ms".into())
            }
            AdmissionMode::Draw if draw < sale.starts_at_ms || draw >= sale.ends_at_ms => {
                Err("draw_at_ms must be within starts_at_ms..ends_at_ms".into())
            }
            AdmissionMode::Draw => Ok(()),
        }
    }
}

/// A seed: 32 random bytes, chosen by the service when the queue or the entry window opens.
pub type Seed = [u8; 32];

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A seed from its hex form (64 hex digits).
pub fn seed_from_hex(text: &str) -> Option<Seed> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut seed = [0u8; 32];
    for (i, byte) in seed.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(seed)
}

/// The published commitment to a seed: its SHA-256, hex.
pub fn commitment(seed: &Seed) -> String {
    hex(&Sha256::digest(seed))
}

/// A user's rank under a seed: `SHA-256(seed ‖ user_id as 8 bytes big-endian)`.
pub fn rank_key(seed: &Seed, user: UserId) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(seed);
    h.update(user.0.to_be_bytes());
    h.finalize().into()
}

/// The pre-queue in admission order: sorted by [`rank_key`], then user id.
pub fn shuffle(seed: &Seed, users: &[UserId]) -> Vec<UserId> {
    let mut keyed: Vec<([u8; 32], UserId)> =
        users.iter().map(|&u| (rank_key(seed, u), u)).collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, u)| u).collect()
}

/// The place of the `n`-th join after the start (1-based), behind a pre-queue of `prequeue`.
pub fn place_after_start(prequeue: u64, n: u64) -> u64 {
    prequeue + n
}

/// One draw entry: a user and the units it asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Entry {
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub user_id: UserId,
    pub quantity: u32,
}

/// The draw: the entries in waitlist order (by [`rank_key`]) and, walking that list, the
/// winners: an entry wins when its quantity fits in the stock left. Returns the waitlist and,
/// for each of its entries, whether it won.
pub fn draw(seed: &Seed, entries: &[Entry], stock: u64) -> Vec<(Entry, bool)> {
    let mut keyed: Vec<([u8; 32], Entry)> = entries
        .iter()
        .map(|&e| (rank_key(seed, e.user_id), e))
        .collect();
    keyed.sort_unstable_by_key(|a| (a.0, a.1.user_id));
    let mut left = stock;
    keyed
        .into_iter()
        .map(|(_, e)| {
            let wins = u64::from(e.quantity) <= left;
            if wins {
                left -= u64::from(e.quantity);
            }
            (e, wins)
        })
        .collect()
}

/// Units that may still be sold: the available stock plus the reserved units (holds that
/// may come back).
pub fn sellable_units(c: &crate::sale::Counters) -> u64 {
    c.available + c.reserved
}

/// Admitted buyers that may be shopping at once, per unit still sellable: a buyer admitted
/// does not always buy (it leaves, its pass lapses), so a wave a little larger than the stock
/// sells it in one round, and no larger keeps most admitted buyers from meeting SOLD_OUT.
pub const WAVE_FACTOR_PERCENT: u64 = 150;

/// How many admitted buyers may hold an unused admission at once: `ceil(sellable × 1.5)`,
/// where `sellable` is the available stock plus the reserved units (holds that may come back).
pub fn wave_window(sellable: u64) -> u64 {
    (sellable.saturating_mul(WAVE_FACTOR_PERCENT)).div_ceil(100)
}

/// The admission cursor after one wave: places `1..=cursor` are admitted. `done` counts the
/// admitted buyers that no longer hold an unused admission (they bought, or their pass
/// lapsed); the cursor moves so that `cursor − done` reaches the window, by at most
/// `wave_max` places, and never past `queued` (the queue's length). It never moves back.
pub fn next_cursor(cursor: u64, done: u64, sellable: u64, queued: u64, wave_max: u64) -> u64 {
    let outstanding = cursor.saturating_sub(done);
    let room = wave_window(sellable).saturating_sub(outstanding);
    cursor
        .saturating_add(room.min(wave_max))
        .min(queued)
        .max(cursor)
}

/// The admission pass: proof that a user was admitted to a sale, until a time. Text form
/// `v1.<sku>.<user>.<expires_at_ms>.<mac>`, `mac` the hex HMAC-SHA-256 of everything before
/// its dot under the service's pass key (derived from its user-token secret, so neither can
/// stand for the other).
pub mod pass {
    use hmac::{Hmac, Mac};
    use sha2::Sha256;

    use crate::ids::{SkuId, UserId};

    type HmacSha256 = Hmac<Sha256>;

    /// Longest pass text accepted (a bound before any parsing).
    pub const PASS_LEN_MAX: usize = 160;

    /// Why a pass was refused.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum PassError {
        Malformed,
        BadSignature,
        OtherSale,
        OtherUser,
        Expired,
    }

    /// The pass key of a secret: HMAC-SHA-256(secret, "flashsale admission pass v1").
    pub fn key(secret: &[u8]) -> [u8; 32] {
        let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
        mac.update(b"flashsale admission pass v1");
        mac.finalize().into_bytes().into()
    }

    fn mac_of(key: &[u8; 32], body: &str) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
        mac.update(body.as_bytes());
        mac
    }

    /// A pass for `user` on `sku`, valid until `expires_at_ms`.
    pub fn sign(key: &[u8; 32], sku: SkuId, user: UserId, expires_at_ms: i64) -> String {
        let body = format!("v1.{}.{}.{}", sku.0, user.0, expires_at_ms);
        let tag = mac_of(key, &body).finalize().into_bytes();
        format!("{body}.{}", super::hex(&tag))
    }

    /// Checks a pass for `user` on `sku` at `now_ms`; answers its expiry.
    pub fn verify(
        key: &[u8; 32],
        text: &str,
        sku: SkuId,
        user: UserId,
        now_ms: i64,
    ) -> Result<i64, PassError> {
        if text.len() > PASS_LEN_MAX {
            return Err(PassError::Malformed);
        }
        let (body, tag) = text.rsplit_once('.').ok_or(PassError::Malformed)?;
        let tag = hex_bytes(tag).ok_or(PassError::Malformed)?;
        mac_of(key, body)
            .verify_slice(&tag)
            .map_err(|_| PassError::BadSignature)?;
        let mut parts = body.split('.');
        let (Some("v1"), Some(s), Some(u), Some(e), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(PassError::Malformed);
        };
        let id = |t: &str| t.parse::<u64>().map_err(|_| PassError::Malformed);
        let (s, u) = (id(s)?, id(u)?);
        let expires = e.parse::<i64>().map_err(|_| PassError::Malformed)?;
        if s != sku.0 {
            return Err(PassError::OtherSale);
        }
        if u != user.0 {
            return Err(PassError::OtherUser);
        }
        if now_ms >= expires {
            return Err(PassError::Expired);
        }
        Ok(expires)
    }

    fn hex_bytes(text: &str) -> Option<Vec<u8>> {
        if text.len() != 64 || !text.is_ascii() {
            return None;
        }
        (0..32)
            .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests;

/// A buyer's join of a queue: before the start (`pre`, placed by the shuffle) or the `n`-th
/// join after it (placed behind the pre-queue, [`place_after_start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub pre: bool,
    pub n: u64,
}

/// A queue's counters, read at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueCounts {
    /// The pre-queue is closed (at or after the start, by the book's clock) and its length final.
    pub sealed: bool,
    pub prequeue: u64,
    pub joined_after: u64,
    /// Places `1..=cursor` are admitted.
    pub cursor: u64,
    /// Admitted buyers who bought.
    pub bought: u64,
    /// The cursor as it was at the asked time (admissions older than that have lapsed).
    pub lapsed_through: u64,
    /// Of those, the buyers who bought.
    pub bought_through: u64,
}

impl QueueCounts {
    pub fn queued(&self) -> u64 {
        self.prequeue + self.joined_after
    }

    /// Admitted buyers that no longer hold an unused admission: they bought, or it lapsed.
    pub fn done(&self) -> u64 {
        self.bought + self.lapsed_through.saturating_sub(self.bought_through)
    }
}

/// What an entry asked of a draw got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entered {
    /// Taken now (the `n`-th entry).
    New(u64),
    /// The user's entry was taken before: this one.
    Already(Entry),
    /// The window is not open yet, or closed.
    NotOpen,
    Closed,
    /// The draw holds its most entries.
    Full,
}

/// One queue join of a group ([`AdmissionBook::join_group`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupJoin {
    pub user: UserId,
    pub starts_at_ms: i64,
    pub len_max: u64,
}

/// Where a draw takes entries: its window `[opens_at_ms, closes_at_ms)` by the book's clock,
/// and the most entries it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryWindow {
    pub opens_at_ms: i64,
    pub closes_at_ms: i64,
    pub len_max: u64,
}

/// Where a sale's admission state lives: in the sale's Redis slot (the Redis ledger) or in the
/// database (the embedded ledger). Every change is atomic; times are the book's own clock
/// (Redis `TIME`; the embedded ledger's single process), so instances' clocks order nothing.
#[async_trait::async_trait]
pub trait AdmissionBook: Send + Sync {
    /// Commits `seed` for the sale unless one is committed; answers the committed one.
    async fn commit_seed(&self, sku: SkuId, seed: &Seed) -> Result<Seed, StoreError>;
    async fn seed(&self, sku: SkuId) -> Result<Option<Seed>, StoreError>;
    /// Joins of one sale, in order: each joins the queue once (a second join, also later in
    /// the group, answers the first ticket); `None`: the queue holds `len_max` buyers. The
    /// seed must be committed first. A book writes the group at once: one commit, or one
    /// script call.
    async fn join_group(
        &self,
        sku: SkuId,
        joins: &[GroupJoin],
    ) -> Result<Vec<Option<Ticket>>, StoreError>;
    /// One join: a group of one.
    async fn join(&self, sku: SkuId, join: GroupJoin) -> Result<Option<Ticket>, StoreError> {
        let answers = self.join_group(sku, &[join]).await?;
        let why = || StoreError::Internal("a join without an answer".into());
        answers.into_iter().next().ok_or_else(why)
    }
    async fn ticket(&self, sku: SkuId, user: UserId) -> Result<Option<Ticket>, StoreError>;
    /// Closes the pre-queue once the book's clock reaches `starts_at_ms`; answers its final
    /// length, or `None` before the start.
    async fn seal(&self, sku: SkuId, starts_at_ms: i64) -> Result<Option<u64>, StoreError>;
    /// The pre-queue's users, in no particular order.
    async fn prequeue(&self, sku: SkuId) -> Result<Vec<UserId>, StoreError>;
    /// The counters, with admissions made before `lapse_before_ms` counted as lapsed.
    async fn counts(&self, sku: SkuId, lapse_before_ms: i64) -> Result<QueueCounts, StoreError>;
    /// Moves the cursor from `from` to `to` (compare and set) and records the wave's time.
    async fn advance(&self, sku: SkuId, from: u64, to: u64) -> Result<bool, StoreError>;
    /// When the wave that admitted `place` was made, and the book's clock now.
    async fn admitted_at(&self, sku: SkuId, place: u64) -> Result<(Option<i64>, i64), StoreError>;
    /// Records that the admitted user at `place` bought (once).
    async fn mark_bought(&self, sku: SkuId, user: UserId, place: u64) -> Result<(), StoreError>;
    /// Takes a draw entry within its window, one per user.
    async fn enter(&self, sku: SkuId, e: Entry, w: EntryWindow) -> Result<Entered, StoreError>;
    async fn entries(&self, sku: SkuId) -> Result<Vec<Entry>, StoreError>;
    async fn entry(&self, sku: SkuId, user: UserId) -> Result<Option<Entry>, StoreError>;
    /// How far down the waitlist the reservations have gone.
    async fn draw_pos(&self, sku: SkuId) -> Result<u64, StoreError>;
    /// Moves the draw's position from `from` to `to` (compare and set).
    async fn advance_draw(&self, sku: SkuId, from: u64, to: u64) -> Result<bool, StoreError>;
}
