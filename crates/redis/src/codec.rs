//! Encoding of what the scripts store and answer: orders in the `orders` hash, events in the
//! stream, and the loose `redis::Value` replies of scripts.
//!
//! A stream entry holds one event (fields as in `Event`; resolutions, expiries, and every
//! entry written before batch entries) or the deductions of one purchase call (a batch entry,
//! `first_seq` and `n` among its fields, see `scripts/purchase.lua`). Readers get one
//! [`Entry`] per event either way: a batch entry is expanded into its events, each under
//! the entry's id, in seq order.
//!
//! Format versions: every entry the scripts write carries `v`. An entry without `v` is one of
//! the formats written before versions (a one-event entry or a batch entry, told apart by
//! `first_seq` as for version 1, which is the same two shapes). Version 2
//! ([`FORMAT_BUCKETED`]) is an entry of a bucket of a sale kept in several buckets: the same
//! shapes plus the transfer sides, with a bucket's epoch (`E·n + b`); a reader from before
//! buckets would take its events for fenced ones and its transfer sides for corrupt ones, so
//! such a reader must wait on it instead. An entry of a version above ours was written by a
//! newer binary during a rolling upgrade: it is [`EntryError::NewerFormat`], which a reader
//! waits on (a newer reader can read it), never a corrupt entry to dead-letter. A `v` that is
//! not a version we could ever have written (not a positive integer) is corrupt like any other
//! malformed entry.

use std::collections::HashMap;

use flashsale_core::{
    ErrorCode, Event, EventKind, HotOrder, LedgerError, OrderNo, OrderStatus, PurchaseOutcome,
    PurchaseRequest, RequestId, SkuId, TransferEvent, TransferSide, UserId,
};

use crate::keys::CopyTag;
use redis::Value;

/// The newest stream format version this binary reads and writes. Raise it, and teach the
/// parser the new shape, whenever an entry changes in a way an older parser would misread or
/// refuse.
pub const FORMAT_VERSION: u64 = FORMAT_BUCKETED;
/// What the scripts write for a sale of one bucket (purchase.lua, resolve.lua,
/// expire_due.lua): every release since versions reads it, so such a sale rolls back freely.
pub const FORMAT_ONE_COPY: u64 = 1;
/// What the scripts write for every bucket of a sale of several (the same three, and
/// transfer_out.lua and transfer_in.lua). Releases before it wrote these entries as version 1,
/// which this binary still reads.
pub const FORMAT_BUCKETED: u64 = 2;
/// The field that holds an entry's format version.
pub const FORMAT_FIELD: &str = "v";

/// Why a stream entry yields no events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryError {
    /// A pending entry with no fields: it was trimmed from the stream after delivery.
    Deleted,
    /// Written in a format version newer than [`FORMAT_VERSION`]: not corrupt, only unknown
    /// to this binary.
    NewerFormat(u64),
    /// Not an entry of any format: corrupt.
    Malformed(String),
}

impl std::fmt::Display for EntryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EntryError::Deleted => f.write_str("entry was deleted"),
            EntryError::NewerFormat(v) => write!(
                f,
                "entry of format version {v}, newer than this binary reads ({FORMAT_VERSION})"
            ),
            EntryError::Malformed(why) => f.write_str(why),
        }
    }
}

/// Checks an entry's format version for a reader of versions up to `newest`: absent or at
/// most that reads; above it is newer; anything else is malformed.
fn check_format(fields: &HashMap<String, String>, newest: u64) -> Result<(), EntryError> {
    let Some(text) = fields.get(FORMAT_FIELD) else {
        return Ok(());
    };
    match text.parse::<u64>() {
        Ok(v) if (1..=newest).contains(&v) => Ok(()),
        Ok(v) if v > newest => Err(EntryError::NewerFormat(v)),
        _ => Err(EntryError::Malformed(format!(
            "field {FORMAT_FIELD} is not a format version: {text:?}"
        ))),
    }
}

/// Decodes an order of the `orders` hash: `user:request_id:quantity:status:deadline_ms:created_at_ms`.
pub fn decode_order(order_no: &str, encoded: &str) -> Result<HotOrder, String> {
    let bad = |what: &str| format!("order {order_no}: bad {what} in {encoded:?}");
    let no = OrderNo::parse(order_no).ok_or_else(|| bad("order_no"))?;
    let parts: Vec<&str> = encoded.split(':').collect();
    let [user, rid, q, status, deadline, created] = parts[..] else {
        return Err(bad("field count"));
    };
    Ok(HotOrder {
        sku_id: no.sku(),
        user_id: UserId(user.parse().map_err(|_| bad("user"))?),
        request_id: RequestId::parse(rid).ok_or_else(|| bad("request_id"))?,
        quantity: q.parse().map_err(|_| bad("quantity"))?,
        status: OrderStatus::parse(status).ok_or_else(|| bad("status"))?,
        deadline_ms: deadline.parse().map_err(|_| bad("deadline_ms"))?,
        created_at_ms: created.parse().map_err(|_| bad("created_at_ms"))?,
        order_no: no,
    })
}

/// Decodes `purchase.lua`'s reply to `reqs` (one call on one copy of sale `sku`): the head
/// (epoch, status, deadline_ms and created_at_ms of every order taken now), then one answer per
/// request: its seq (accepted now: the order is the request's, numbered
/// `<sku>-<epoch>-<seq>`), minus the seq of a request of this call it repeats, an order
/// accepted before (`[order_no, encoded]`), or the code of a refusal.
pub fn purchase_outcomes(
    sku: SkuId,
    reqs: &[PurchaseRequest],
    reply: &Value,
) -> Result<Vec<PurchaseOutcome>, String> {
    let bad = || format!("unexpected purchase reply {reply:?}");
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let [epoch, status, deadline, created, answers @ ..] = &items[..] else {
        return Err(bad());
    };
    if answers.len() != reqs.len() {
        return Err(format!(
            "{} answers for {} requests",
            answers.len(),
            reqs.len()
        ));
    }
    let text = |v: &Value| as_string(v).ok_or_else(bad);
    let epoch: u64 = text(epoch)?.parse().map_err(|_| bad())?;
    let status = OrderStatus::parse(&text(status)?).ok_or_else(bad)?;
    let deadline_ms: i64 = text(deadline)?.parse().map_err(|_| bad())?;
    let created_at_ms: i64 = text(created)?.parse().map_err(|_| bad())?;
    let taken = |r: &PurchaseRequest, seq: u64| HotOrder {
        order_no: OrderNo::new(sku, epoch, seq),
        sku_id: sku,
        user_id: r.user_id,
        request_id: r.request_id.clone(),
        quantity: r.quantity,
        status,
        deadline_ms,
        created_at_ms,
    };
    let mut now: HashMap<i64, HotOrder> = HashMap::new();
    let mut out = Vec::with_capacity(reqs.len());
    for (r, answer) in reqs.iter().zip(answers) {
        let outcome = match answer {
            Value::Int(seq) if *seq > 0 => {
                let order = taken(r, *seq as u64);
                now.insert(*seq, order.clone());
                PurchaseOutcome::Accepted {
                    order,
                    replayed: false,
                }
            }
            Value::Int(seq) => PurchaseOutcome::Accepted {
                order: now.get(&-seq).cloned().ok_or_else(bad)?,
                replayed: true,
            },
            Value::Array(before) => {
                let [no, encoded] = &before[..] else {
                    return Err(bad());
                };
                PurchaseOutcome::Accepted {
                    order: decode_order(&text(no)?, &text(encoded)?)?,
                    replayed: true,
                }
            }
            code => PurchaseOutcome::Rejected(ErrorCode::parse(&text(code)?).ok_or_else(bad)?),
        };
        out.push(outcome);
    }
    Ok(out)
}

/// One order of a buyer's record (a copy of layout 2, `scripts/records.lua`), as far as the
/// service reads it apart from the scripts: its request id (the sold-out flag's accepted
/// keys) and its units held (the per-user limit of a bucketed sale's home).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordOrder {
    pub request_id: RequestId,
    pub quantity: u64,
    /// Counts against the per-user limit (PENDING, CREATED, RESERVED, PAID).
    pub live: bool,
}

/// Decodes a buyer's record: `request_id,epoch,seq,quantity,S[,deadline_ms]` per order,
/// orders joined by `;`. An order may be followed by a mark, `#<units>`, the live units after
/// it; a long record's last order carries one, which must be what its orders hold (an earlier
/// mark is a purchase's of its time, and is not read).
pub fn parse_record(record: &str) -> Result<Vec<RecordOrder>, String> {
    let (orders, last_mark) = parse_orders(record)?;
    if let Some(units) = last_mark {
        let held = live_units(&orders);
        if units != held {
            return Err(format!(
                "buyer record {record:?}: its mark says {units} units, its orders hold {held}"
            ));
        }
    }
    Ok(orders)
}

/// The orders of a record, and the mark of its last order.
fn parse_orders(record: &str) -> Result<(Vec<RecordOrder>, Option<u64>), String> {
    let bad = |what: &str| format!("buyer record {record:?}: bad {what}");
    let mut last_mark = None;
    let orders = (record.split(';'))
        .map(|marked| {
            let (order, mark) = match marked.split_once('#') {
                Some((order, mark)) => (order, Some(mark.parse::<u64>().map_err(|_| bad("mark"))?)),
                None => (marked, None),
            };
            last_mark = mark;
            let parts: Vec<&str> = order.split(',').collect();
            let (rid, epoch, seq, q, status) = match parts[..] {
                [rid, epoch, seq, q, status] | [rid, epoch, seq, q, status, _] => {
                    (rid, epoch, seq, q, status)
                }
                _ => return Err(bad("field count")),
            };
            epoch.parse::<u64>().map_err(|_| bad("epoch"))?;
            seq.parse::<u64>().map_err(|_| bad("seq"))?;
            let live = match status {
                "N" | "C" | "R" | "P" => true,
                "X" | "E" | "J" => false,
                _ => return Err(bad("status")),
            };
            Ok(RecordOrder {
                request_id: RequestId::parse(rid).ok_or_else(|| bad("request_id"))?,
                quantity: q.parse().map_err(|_| bad("quantity"))?,
                live,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((orders, last_mark))
}

/// Units a buyer's record holds in live orders.
pub fn record_held(record: &str) -> Result<u64, String> {
    Ok(live_units(&parse_record(record)?))
}

/// Units held in the live ones of `orders`.
fn live_units(orders: &[RecordOrder]) -> u64 {
    orders.iter().filter(|o| o.live).map(|o| o.quantity).sum()
}

/// The fields of one stream entry, read by name.
struct Fields<'a>(&'a HashMap<String, String>);

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Result<&'a str, String> {
        self.0
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| format!("missing field {name}"))
    }

    fn num(&self, name: &str) -> Result<i64, String> {
        self.get(name)?
            .parse::<i64>()
            .map_err(|_| format!("field {name} is not an integer"))
    }

    fn unsigned(&self, name: &str) -> Result<u64, String> {
        self.get(name)?
            .parse::<u64>()
            .map_err(|_| format!("field {name} is not a non-negative integer"))
    }
}

/// Parses the fields of one stream entry into an event of sale `sku`.
pub fn parse_event(sku: SkuId, fields: &HashMap<String, String>) -> Result<Event, String> {
    let f = Fields(fields);
    let (sku_id, seq) = (SkuId(f.unsigned("sku_id")?), f.unsigned("seq")?);
    let order_no = OrderNo::parse(f.get("order_no")?).ok_or("field order_no is malformed")?;
    // Entries written before events carried their epoch: the order number's epoch (right for
    // deductions; a resolution of an order from an older epoch is then fenced, never applied
    // twice).
    let epoch = match fields.get("epoch") {
        Some(_) => f.unsigned("epoch")?,
        None => order_no.epoch(),
    };
    let event = Event {
        sku_id,
        epoch,
        seq,
        kind: EventKind::parse(f.get("kind")?).ok_or("field kind is unknown")?,
        order_no,
        request_id: RequestId::parse(f.get("request_id")?)
            .ok_or("field request_id is malformed")?,
        user_id: UserId(f.unsigned("user_id")?),
        quantity: u32::try_from(f.unsigned("quantity")?).map_err(|_| "quantity too large")?,
        at_ms: f.num("at_ms")?,
        deadline_ms: f.num("deadline_ms")?,
    };
    if event.sku_id != sku || event.order_no.sku() != sku {
        return Err(format!(
            "entry of sale {} in the stream of {sku}",
            event.sku_id
        ));
    }
    if event.seq == 0 || event.quantity == 0 {
        return Err("seq and quantity must be positive".into());
    }
    Ok(event)
}

/// Parses a transfer side (`kind` `transfer_out` with `to`, or `transfer_in` with `from`) in
/// the stream of `copy`: the copy is the source of an out and the destination of an in.
pub fn parse_transfer(
    copy: CopyTag,
    fields: &HashMap<String, String>,
) -> Result<TransferEvent, String> {
    let f = Fields(fields);
    let (sku_id, epoch) = (SkuId(f.unsigned("sku_id")?), f.unsigned("epoch")?);
    let id = f.get("transfer_id")?;
    let bucket = |name: &str| {
        u16::try_from(f.unsigned(name)?).map_err(|_| format!("field {name} is not a bucket"))
    };
    let (side, from, to) = match f.get("kind")? {
        "transfer_out" => (TransferSide::Out, copy.bucket, bucket("to")?),
        "transfer_in" => (TransferSide::In, bucket("from")?, copy.bucket),
        other => return Err(format!("field kind {other:?} is not a transfer")),
    };
    if sku_id != copy.sku {
        return Err(format!("entry of sale {sku_id} in the stream of {copy}"));
    }
    let id_epoch = id.split_once('.').and_then(|(e, n)| {
        let seq_ok = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
        e.parse::<u64>().ok().filter(|_| seq_ok && id.len() <= 40)
    });
    let id_epoch = id_epoch.ok_or_else(|| format!("transfer id {id:?} is malformed"))?;
    if from == to || (side == TransferSide::Out && id_epoch != epoch) {
        return Err(format!("transfer {id} does not fit its stream"));
    }
    let units = f.unsigned("units")?;
    if units == 0 {
        return Err(format!("transfer {id} of 0 units"));
    }
    Ok(TransferEvent {
        sku_id,
        epoch,
        id: id.to_owned(),
        side,
        from,
        to,
        units,
        at_ms: f.num("at_ms")?,
    })
}

/// Parses a batch entry (`first_seq`, `n`, and n comma-separated `users`, `request_ids`,
/// `quantities`) of sale `sku` into its events, all or nothing.
pub fn parse_batch(sku: SkuId, fields: &HashMap<String, String>) -> Result<Vec<Event>, String> {
    let f = Fields(fields);
    let (sku_id, epoch) = (SkuId(f.unsigned("sku_id")?), f.unsigned("epoch")?);
    let (first_seq, n) = (f.unsigned("first_seq")?, f.unsigned("n")?);
    let kind = EventKind::parse(f.get("kind")?).ok_or("field kind is unknown")?;
    let (at_ms, deadline_ms) = (f.num("at_ms")?, f.num("deadline_ms")?);
    if sku_id != sku {
        return Err(format!("entry of sale {sku_id} in the stream of {sku}"));
    }
    if kind != EventKind::Deducted {
        return Err("a batch entry holds deductions only".into());
    }
    if first_seq == 0 || n == 0 || n > flashsale_core::limits::BATCH_LEN_MAX as u64 {
        return Err("first_seq and n must be positive, n at most a batch".into());
    }
    let (users, rids, qs) = (f.get("users")?, f.get("request_ids")?, f.get("quantities")?);
    let count = |s: &str| s.split(',').count() as u64;
    if count(users) != n || count(rids) != n || count(qs) != n {
        return Err(format!(
            "a batch entry of {n} events has lists of other lengths"
        ));
    }
    let mut events = Vec::with_capacity(n as usize);
    let lists = users.split(',').zip(rids.split(',')).zip(qs.split(','));
    for (i, ((user, rid), q)) in lists.enumerate() {
        let seq = first_seq + i as u64;
        let quantity: u32 = q
            .parse()
            .map_err(|_| format!("quantity {q:?} of seq {seq}"))?;
        if quantity == 0 {
            return Err(format!("quantity 0 of seq {seq}"));
        }
        events.push(Event {
            sku_id,
            epoch,
            seq,
            kind,
            order_no: OrderNo::new(sku_id, epoch, seq),
            request_id: RequestId::parse(rid).ok_or_else(|| format!("request_id of seq {seq}"))?,
            user_id: UserId(user.parse().map_err(|_| format!("user_id of seq {seq}"))?),
            quantity,
            at_ms,
            deadline_ms,
        });
    }
    Ok(events)
}

/// What a stream entry records: an order event, or (bucketed sales) a transfer side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Event(Event),
    Transfer(TransferEvent),
}

impl Item {
    pub fn event(&self) -> Option<&Event> {
        match self {
            Item::Event(e) => Some(e),
            Item::Transfer(_) => None,
        }
    }
}

/// One stream entry, parsed: its id, and the item or why it is not one.
pub type Entry = (String, Result<Item, EntryError>);

/// Parses `[[id, [field, value, …]], …]` (XRANGE, XREADGROUP, XAUTOCLAIM) into one [`Entry`]
/// per event (a batch entry gives one per event it holds, all under its id). A deleted entry
/// (nil fields, in a pending read), one of a newer format or a malformed one is one `Err`.
pub fn parse_entries(copy: CopyTag, value: &Value) -> Result<Vec<Entry>, LedgerError> {
    parse_entries_as(copy, value, FORMAT_VERSION)
}

/// [`parse_entries`] as a reader of format versions up to `newest` parses them: the binary's
/// readers pass [`FORMAT_VERSION`]; tests pass an older one to see what an older release's
/// reader makes of an entry (it must read it, or wait on it, never misread it).
pub fn parse_entries_as(
    copy: CopyTag,
    value: &Value,
    newest: u64,
) -> Result<Vec<Entry>, LedgerError> {
    let items = match value {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(items) => items,
        other => return Err(unexpected("stream entries", other)),
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match parse_entry(copy, item, newest)? {
            (id, Ok(events)) => out.extend(events.into_iter().map(|e| (id.clone(), Ok(e)))),
            (id, Err(why)) => out.push((id, Err(why))),
        }
    }
    Ok(out)
}

fn parse_entry(
    copy: CopyTag,
    item: &Value,
    newest: u64,
) -> Result<(String, Result<Vec<Item>, EntryError>), LedgerError> {
    let Value::Array(pair) = item else {
        return Err(unexpected("stream entry", item));
    };
    let id = pair
        .first()
        .and_then(as_string)
        .ok_or_else(|| unexpected("stream entry id", item))?;
    let events = match pair.get(1) {
        Some(Value::Array(kv)) => field_map(kv).and_then(|map| parse_fields(copy, &map, newest)),
        None | Some(Value::Nil) => Err(EntryError::Deleted),
        Some(other) => Err(EntryError::Malformed(format!(
            "fields are not a list: {other:?}"
        ))),
    };
    Ok((id, events))
}

/// `[field, value, …]` as a map.
fn field_map(fields: &[Value]) -> Result<HashMap<String, String>, EntryError> {
    if !fields.len().is_multiple_of(2) {
        return Err(EntryError::Malformed("odd number of field values".into()));
    }
    let mut map = HashMap::with_capacity(fields.len() / 2);
    for kv in fields.chunks(2) {
        match (as_string(&kv[0]), as_string(&kv[1])) {
            (Some(k), Some(v)) => map.insert(k, v),
            _ => return Err(EntryError::Malformed("a field is not a string".into())),
        };
    }
    Ok(map)
}

/// The items of an entry's fields: the version first (a newer entry's other fields mean
/// nothing to us), then the shape, which versions 1 and 2 share (a transfer side written by a
/// release before version 2 is version 1).
fn parse_fields(
    copy: CopyTag,
    map: &HashMap<String, String>,
    newest: u64,
) -> Result<Vec<Item>, EntryError> {
    check_format(map, newest)?;
    let kind = map.get("kind").map_or("", String::as_str);
    let items = if map.contains_key("first_seq") {
        parse_batch(copy.sku, map).map(|es| es.into_iter().map(Item::Event).collect())
    } else if kind.starts_with("transfer_") {
        parse_transfer(copy, map).map(|t| vec![Item::Transfer(t)])
    } else {
        parse_event(copy.sku, map).map(|e| vec![Item::Event(e)])
    };
    items.map_err(EntryError::Malformed)
}

/// A bulk, simple or integer reply as text.
pub fn as_string(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".into()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// An integer reply (or its text).
pub fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => as_string(other)?.parse().ok(),
    }
}

pub fn unexpected(what: &str, v: &Value) -> LedgerError {
    LedgerError::Internal(format!("unexpected reply for {what}: {v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `entry` is an error that says `what`.
    fn assert_malformed(entry: &Entry, what: &str) {
        let why = entry.1.as_ref().unwrap_err().to_string();
        assert!(why.contains(what), "{why} does not say {what}");
    }

    /// The fields of a one-event entry: a deduction of sale 5, seq 1.
    const ONE_EVENT: [(&str, &str); 9] = [
        ("sku_id", "5"),
        ("seq", "1"),
        ("kind", "deducted"),
        ("order_no", "5-1-1"),
        ("request_id", "r1"),
        ("user_id", "3"),
        ("quantity", "1"),
        ("at_ms", "10"),
        ("deadline_ms", "0"),
    ];

    #[test]
    fn orders_decode_and_malformed_ones_are_errors() {
        let o = decode_order("42-1-7", "9:req-1:2:RESERVED:1700:1600").unwrap();
        assert_eq!(o.sku_id, SkuId(42));
        assert_eq!((o.user_id, o.quantity, o.deadline_ms), (UserId(9), 2, 1700));
        assert_eq!(o.status, OrderStatus::Reserved);
        assert!(decode_order("42-1-7", "9:req:2:WHAT:0:0").is_err());
        assert!(decode_order("42-1-7", "9:req:2:CREATED:0").is_err());
    }

    #[test]
    fn a_purchase_reply_gives_each_request_its_outcome() {
        use redis::Value::{Array, BulkString, Int};
        let text = |s: &str| BulkString(s.as_bytes().to_vec());
        let sku = SkuId(42);
        let req = |user: u64, rid: &str, quantity: u32| PurchaseRequest {
            sku_id: sku,
            user_id: UserId(user),
            request_id: RequestId::parse(rid).unwrap(),
            quantity,
        };
        let reqs = [
            req(7, "a", 2),
            req(7, "a", 1),
            req(8, "b", 1),
            req(9, "c", 1),
        ];
        let reply = Array(vec![
            text("3"),
            text("RESERVED"),
            text("1700"),
            text("1600"),
            Int(17),
            Int(-17),
            Array(vec![text("42-2-5"), text("8:b:1:PAID:1500:1400")]),
            text("SOLD_OUT"),
        ]);
        let out = purchase_outcomes(sku, &reqs, &reply).unwrap();
        let PurchaseOutcome::Accepted { order, replayed } = &out[0] else {
            panic!("{out:?}")
        };
        assert!(!replayed);
        assert_eq!(order.order_no, OrderNo::new(sku, 3, 17));
        assert_eq!(
            (
                order.quantity,
                order.status,
                order.deadline_ms,
                order.created_at_ms
            ),
            (2, OrderStatus::Reserved, 1700, 1600)
        );
        assert_eq!(
            out[1],
            PurchaseOutcome::Accepted {
                order: order.clone(),
                replayed: true
            },
            "the first outcome, its quantity too"
        );
        assert!(
            matches!(&out[2], PurchaseOutcome::Accepted { order, replayed: true }
            if order.status == OrderStatus::Paid && order.order_no.to_string() == "42-2-5")
        );
        assert_eq!(out[3], PurchaseOutcome::Rejected(ErrorCode::SoldOut));
        assert!(purchase_outcomes(sku, &reqs[..3], &reply).is_err());
        let unknown = Array(vec![
            text("3"),
            text("CREATED"),
            text("0"),
            text("1"),
            Int(-4),
        ]);
        assert!(purchase_outcomes(sku, &reqs[..1], &unknown).is_err());
    }

    #[test]
    fn buyer_records_decode_their_orders_and_units() {
        let orders = parse_record("r-1,3,17,2,R;r2,2,9,1,X,1700;r3,3,20,1,C").unwrap();
        let rids: Vec<&str> = orders.iter().map(|o| o.request_id.as_str()).collect();
        assert_eq!(rids, ["r-1", "r2", "r3"]);
        assert_eq!(
            record_held("r-1,3,17,2,R;r2,2,9,1,X,1700;r3,3,20,1,C"),
            Ok(3)
        );
        for bad in [
            "",
            "r,1,2,1",
            "r,1,2,1,Q",
            "r,x,2,1,C",
            "r,1,2,1,C;",
            "r r,1,2,1,C",
            "r,1,2,1,C#2",
            "r,1,2,1,C#x",
            "r,1,2,1,C#",
            "#1",
        ] {
            assert!(parse_record(bad).is_err(), "{bad:?}");
        }
        assert!(decode_order("bad", "9:req:2:CREATED:0:0").is_err());
    }

    /// A long record's last mark gives its live units; its orders must agree with it, and an
    /// earlier mark (a purchase's of its time) is not read.
    #[test]
    fn a_marked_record_decodes_its_orders_and_its_last_mark() {
        let record = "r-1,3,17,2,R#2;r2,2,9,1,X,1700;r3,3,20,1,C#3";
        let rids: Vec<String> = (parse_record(record).unwrap().iter())
            .map(|o| o.request_id.as_str().to_string())
            .collect();
        assert_eq!(rids, ["r-1", "r2", "r3"]);
        assert_eq!(record_held(record), Ok(3));
        assert_eq!(record_held("r-1,3,17,2,R#7;r3,3,20,1,C"), Ok(3));
        assert!(record_held("r-1,3,17,2,R#2;r3,3,20,1,C#4").is_err());
    }

    /// Entries written before events carried their epoch (no `epoch` field) still read: the
    /// epoch comes from the order number.
    #[test]
    fn entries_without_an_epoch_take_the_order_numbers() {
        let fields = |epoch: Option<&str>| {
            let mut m: HashMap<String, String> = [
                ("sku_id", "5"),
                ("seq", "3"),
                ("kind", "deducted"),
                ("order_no", "5-2-3"),
                ("request_id", "r1"),
                ("user_id", "3"),
                ("quantity", "1"),
                ("at_ms", "10"),
                ("deadline_ms", "0"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
            if let Some(e) = epoch {
                m.insert("epoch".into(), e.into());
            }
            m
        };
        assert_eq!(parse_event(SkuId(5), &fields(None)).unwrap().epoch, 2);
        assert_eq!(parse_event(SkuId(5), &fields(Some("4"))).unwrap().epoch, 4);
        assert!(parse_event(SkuId(5), &fields(Some("x"))).is_err());
    }

    /// A transfer side names its bucket from the stream it is in: the source of an out,
    /// the destination of an in; an out's id carries its own epoch.
    #[test]
    fn transfer_sides_parse_against_their_stream() {
        let map = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let out = map(&[
            ("v", "1"),
            ("sku_id", "5"),
            ("epoch", "7"),
            ("kind", "transfer_out"),
            ("transfer_id", "7.3"),
            ("to", "2"),
            ("units", "40"),
            ("at_ms", "9"),
        ]);
        let source = CopyTag::new(SkuId(5), 1, 11);
        let t = parse_transfer(source, &out).unwrap();
        assert_eq!(
            (t.side, t.from, t.to, t.units),
            (TransferSide::Out, 1, 2, 40)
        );
        assert_eq!(
            (t.id.as_str(), t.bucket(), t.units_delta()),
            ("7.3", 1, -40)
        );
        let mut wrong_id = out.clone();
        wrong_id.insert("transfer_id".into(), "8.3".into());
        assert!(parse_transfer(source, &wrong_id).is_err());
        assert!(parse_transfer(CopyTag::new(SkuId(5), 2, 0), &out).is_err());
        assert!(parse_transfer(CopyTag::new(SkuId(6), 1, 11), &out).is_err());
        let mut none = out.clone();
        none.insert("units".into(), "0".into());
        assert!(parse_transfer(source, &none).is_err());

        let into = map(&[
            ("sku_id", "5"),
            ("epoch", "6"),
            ("kind", "transfer_in"),
            ("transfer_id", "7.3"),
            ("from", "1"),
            ("units", "40"),
            ("at_ms", "9"),
        ]);
        let dest = CopyTag::new(SkuId(5), 2, 4);
        let items = parse_fields(dest, &into, FORMAT_VERSION).unwrap();
        let Item::Transfer(t) = &items[0] else {
            panic!("a transfer: {items:?}")
        };
        assert_eq!(
            (t.side, t.from, t.to, t.bucket(), t.units_delta()),
            (TransferSide::In, 1, 2, 2, 40)
        );
    }

    #[test]
    fn entries_parse_and_never_panic() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let fields = ONE_EVENT;
        let kv = |skip: &str| {
            Value::Array(
                fields
                    .iter()
                    .filter(|(k, _)| *k != skip)
                    .flat_map(|(k, v)| [bulk(k), bulk(v)])
                    .collect(),
            )
        };
        let reply = Value::Array(vec![
            Value::Array(vec![bulk("1-0"), kv("")]),
            Value::Array(vec![bulk("1-1"), kv("seq")]),
            Value::Array(vec![bulk("1-2"), Value::Nil]),
            Value::Array(vec![bulk("1-3"), Value::Array(vec![bulk("odd")])]),
        ]);
        let entries = parse_entries(SkuId(5).into(), &reply).unwrap();
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[0].1.as_ref().unwrap().event().unwrap().seq, 1);
        assert_malformed(&entries[1], "seq");
        assert_malformed(&entries[2], "deleted");
        assert!(entries[3].1.is_err());
        let other_sale = parse_entries(SkuId(6).into(), &reply).unwrap();
        assert!(other_sale[0].1.is_err());
        assert!(parse_entries(SkuId(5).into(), &bulk("x")).is_err());
    }

    /// A batch entry (what purchase.lua writes) expands into one event per deduction, under
    /// its id, beside one-event entries (what resolutions and older scripts write).
    #[test]
    fn batch_entries_expand_and_one_event_entries_still_read() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let kv = |pairs: &[(&str, &str)]| {
            Value::Array(pairs.iter().flat_map(|(k, v)| [bulk(k), bulk(v)]).collect())
        };
        let batch = [
            ("sku_id", "5"),
            ("epoch", "2"),
            ("kind", "deducted"),
            ("first_seq", "7"),
            ("n", "3"),
            ("at_ms", "10"),
            ("deadline_ms", "99"),
            ("users", "3,18446744073709551615,4"),
            ("request_ids", "a,b-1,c_2"),
            ("quantities", "1,2,1"),
        ];
        let old = [
            ("sku_id", "5"),
            ("seq", "10"),
            ("kind", "paid"),
            ("order_no", "5-2-8"),
            ("request_id", "b-1"),
            ("user_id", "18446744073709551615"),
            ("quantity", "2"),
            ("at_ms", "11"),
            ("deadline_ms", "0"),
        ];
        let mut short = batch;
        short[4] = ("n", "4");
        let mut zero = batch;
        zero[9] = ("quantities", "1,0,1");
        let reply = Value::Array(vec![
            Value::Array(vec![bulk("1-0"), kv(&batch)]),
            Value::Array(vec![bulk("1-1"), kv(&old)]),
            Value::Array(vec![bulk("1-2"), kv(&short)]),
            Value::Array(vec![bulk("1-3"), kv(&zero)]),
        ]);
        let entries = parse_entries(SkuId(5).into(), &reply).unwrap();
        assert_eq!(entries.len(), 6);
        let ids: Vec<&str> = entries.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["1-0", "1-0", "1-0", "1-1", "1-2", "1-3"]);
        let events: Vec<&Event> = entries[..4]
            .iter()
            .map(|(_, e)| e.as_ref().unwrap().event().unwrap())
            .collect();
        assert_eq!(
            events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [7, 8, 9, 10]
        );
        let second = events[1];
        assert_eq!(second.order_no, OrderNo::new(SkuId(5), 2, 8));
        assert_eq!(
            (second.user_id, second.quantity, second.epoch),
            (UserId(u64::MAX), 2, 2)
        );
        assert_eq!((second.at_ms, second.deadline_ms), (10, 99));
        assert_eq!(second.request_id.as_str(), "b-1");
        assert_eq!(events[3].kind, EventKind::Paid);
        assert_eq!(events[3].epoch, 2);
        assert_malformed(&entries[4], "lengths");
        assert!(entries[5].1.is_err());
        assert!(parse_entries(SkuId(6).into(), &reply).unwrap()[0]
            .1
            .is_err());
    }

    /// An entry's format version: absent or ours reads; above ours is newer (waited on, not
    /// corrupt), whatever else the entry holds; anything but a positive integer is corrupt.
    #[test]
    fn format_versions_read_wait_or_are_malformed() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let entry = |id: &str, v: Option<&str>| {
            let mut kv = ONE_EVENT.to_vec();
            kv.extend(v.map(|v| (FORMAT_FIELD, v)));
            let fields = kv.iter().flat_map(|(k, v)| [bulk(k), bulk(v)]).collect();
            Value::Array(vec![bulk(id), Value::Array(fields)])
        };
        let newer = (FORMAT_VERSION + 1).to_string();
        let reply = Value::Array(vec![
            entry("1-0", None),
            entry("1-1", Some("1")),
            entry("1-2", Some(&newer)),
            entry("1-3", Some("0")),
            entry("1-4", Some("banana")),
            entry("1-5", Some("-2")),
            // A newer entry is newer even when nothing else in it parses for us.
            Value::Array(vec![
                bulk("1-6"),
                Value::Array(vec![bulk(FORMAT_FIELD), bulk(&newer)]),
            ]),
        ]);
        let entries = parse_entries(SkuId(5).into(), &reply).unwrap();
        assert!(entries[0].1.is_ok() && entries[1].1.is_ok());
        let newer = EntryError::NewerFormat(FORMAT_VERSION + 1);
        assert_eq!(entries[2].1, Err(newer.clone()));
        for (_, e) in &entries[3..6] {
            assert!(matches!(e, Err(EntryError::Malformed(why)) if why.contains("version")));
        }
        assert_eq!(entries[6].1, Err(newer));
    }

    /// Version 2 (a bucketed sale's entries) reads here; a reader of version 1 (a release
    /// from before buckets, emulated) waits on it and still reads a sale of one bucket's.
    #[test]
    fn a_reader_of_version_1_waits_on_bucketed_entries() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let entry = |id: &str, v: u64| {
            let v = v.to_string();
            let mut kv = ONE_EVENT.to_vec();
            kv.push((FORMAT_FIELD, &v));
            let fields = kv.iter().flat_map(|(k, v)| [bulk(k), bulk(v)]).collect();
            Value::Array(vec![bulk(id), Value::Array(fields)])
        };
        let reply = Value::Array(vec![
            entry("1-0", FORMAT_ONE_COPY),
            entry("1-1", FORMAT_BUCKETED),
        ]);
        let now = parse_entries(SkuId(5).into(), &reply).unwrap();
        assert!(now.iter().all(|(_, e)| e.is_ok()), "{now:?}");
        let old = parse_entries_as(SkuId(5).into(), &reply, FORMAT_ONE_COPY).unwrap();
        assert!(old[0].1.is_ok());
        assert_eq!(old[1].1, Err(EntryError::NewerFormat(FORMAT_BUCKETED)));
    }
}
