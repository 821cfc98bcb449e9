//! Order events for the shop's other systems: the CloudEvents 1.0 form (structured JSON) of
//! each transition the system of record stores, and the [`EventLog`] a store gives the relay
//! that delivers them (the ordered event log per stream, a delivered position per sink and
//! stream, a lease and a state per sink).
//!
//! An event is a pure function of one stored row of `stock_events` (or of `sale_notices`), so
//! delivering it twice yields the same bytes and the same `id` (`<order_no>.<kind>`: an order
//! is created once and resolved at most once; `<order_no>.lost`: a loss is stored once however
//! many runs report it; `sale-<sku>.sold_out.<total>`: a sale sells out once per total), which
//! is what a consumer deduplicates by and what NATS JetStream's `Nats-Msg-Id` window catches.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::ids::{OrderNo, RequestId, SkuId, UserId};
use crate::order::{Event, EventKind, HotOrder, OrderStatus};

/// The CloudEvents version every event declares.
pub const SPEC_VERSION: &str = "1.0";
/// What every event's `type` starts with (reverse-DNS, as CloudEvents recommends).
pub const TYPE_PREFIX: &str = "dev.flashsale.";

/// One ordered stream of the log: a sale's events, or one bucket's of a sale kept in buckets
/// (bucket 0 for a sale of one bucket). Its `seq` is gap-free from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StreamKey {
    pub sku: SkuId,
    pub bucket: u16,
}

impl std::fmt::Display for StreamKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.sku, self.bucket)
    }
}

/// The `bucket` of a sale's notice stream (orders reported lost, the sale sold out): past
/// every bucket's (a sale has at most 64, numbered from 0).
pub const NOTICES: u16 = 64;

impl StreamKey {
    /// The notice stream of `sku`.
    pub fn notices(sku: SkuId) -> StreamKey {
        StreamKey {
            sku,
            bucket: NOTICES,
        }
    }

    pub fn is_notices(&self) -> bool {
        self.bucket == NOTICES
    }
}

/// What a sale notice announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NoticeKind {
    /// An order the hot ledger accepted and lost before the database stored it, as the
    /// reconciler reported it.
    Lost,
    /// Every unit of the sale sold: `sold` reached `total_stock` (none available, none held,
    /// none in flight between buckets).
    SoldOut,
}

impl NoticeKind {
    /// As stored in `sale_notices.kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeKind::Lost => "lost",
            NoticeKind::SoldOut => "sold_out",
        }
    }

    pub fn parse(s: &str) -> Option<NoticeKind> {
        match s {
            "lost" => Some(NoticeKind::Lost),
            "sold_out" => Some(NoticeKind::SoldOut),
            _ => None,
        }
    }
}

/// A row of `sale_notices`: the `seq`-th notice of its sale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub sku_id: SkuId,
    pub seq: u64,
    pub kind: NoticeKind,
    /// The lost order's number (empty for sold out).
    pub order_no: String,
    /// The sale's total when it sold out (0 for a loss).
    pub total_stock: u64,
    /// The reconciler run that reported the loss (0 for sold out).
    pub run_id: u64,
    pub at_ms: i64,
}

/// A stream and the last seq the database stored in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamHead {
    pub stream: StreamKey,
    pub head: u64,
}

/// A row of the event log as stored. `rejected`: the guard refused it (the order is REJECTED,
/// an alerted fault): it moved nothing and announces nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedEvent {
    pub bucket: u16,
    pub event: Event,
    pub rejected: bool,
}

/// A sink's row: who holds its lease until when, whether an operator must resume it, and its
/// failures in a row with the last one's text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SinkRow {
    pub sink: String,
    pub holder: String,
    pub lease_until_ms: i64,
    pub paused: bool,
    pub failures: u32,
    pub last_error: Option<String>,
    pub last_error_at_ms: i64,
}

/// What the relay needs of the system of record. Positions only move forward by compare and
/// set, so two relays that overlap (a lease that lapsed under a paused process) may both
/// deliver an event but never move a position back past what a consumer has seen.
#[async_trait]
pub trait EventLog: Send + Sync + 'static {
    /// Every stream with at least one stored event, and its head (a sale's notice stream,
    /// [`StreamKey::notices`], among them).
    async fn event_streams(&self) -> Result<Vec<StreamHead>, StoreError>;

    /// The events of `stream` with `seq > after`, by seq, at most `max`.
    async fn logged_events(
        &self,
        stream: StreamKey,
        after: u64,
        max: usize,
    ) -> Result<Vec<LoggedEvent>, StoreError>;

    /// The notices of `sku` with `seq > after`, by seq, at most `max` (its notice stream's
    /// events).
    async fn logged_notices(
        &self,
        sku: SkuId,
        after: u64,
        max: usize,
    ) -> Result<Vec<Notice>, StoreError>;

    /// The delivered position of `sink` in every stream it has one for.
    async fn positions(&self, sink: &str) -> Result<Vec<(StreamKey, u64)>, StoreError>;

    /// Moves `sink`'s position in `stream` from `from` to `to` (a stream with no position is at
    /// 0); false when the position is no longer `from` (another relay, an operator).
    async fn advance_position(
        &self,
        sink: &str,
        stream: StreamKey,
        from: u64,
        to: u64,
        now_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Sets `sink`'s position in `stream` (an operator's re-delivery: the events after `seq`
    /// are delivered again).
    async fn set_position(
        &self,
        sink: &str,
        stream: StreamKey,
        seq: u64,
        now_ms: i64,
    ) -> Result<(), StoreError>;

    /// Takes or renews `sink`'s lease for `holder` until `now_ms + ttl_ms`: true when
    /// `holder` holds it now (it did, or the last holder's lapsed).
    async fn take_sink_lease(
        &self,
        sink: &str,
        holder: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Gives the lease up (a relay that stops), if `holder` has it.
    async fn release_sink_lease(&self, sink: &str, holder: &str) -> Result<(), StoreError>;

    /// Every sink's row.
    async fn sinks(&self) -> Result<Vec<SinkRow>, StoreError>;

    /// Records a delivery's outcome: `None` resets the failures, `Some(e)` counts one more
    /// and keeps `e`. Answers the failures in a row.
    async fn record_sink_outcome(
        &self,
        sink: &str,
        error: Option<&str>,
        now_ms: i64,
    ) -> Result<u32, StoreError>;

    /// Pauses (an endpoint that keeps failing) or resumes (an operator) a sink.
    async fn set_sink_paused(&self, sink: &str, paused: bool) -> Result<(), StoreError>;
}

/// The kinds of order events, as their `type` ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OrderEventType {
    Created,
    Paid,
    Cancelled,
    Expired,
    Lost,
    SoldOut,
}

impl OrderEventType {
    pub fn of(kind: EventKind) -> OrderEventType {
        match kind {
            EventKind::Deducted => OrderEventType::Created,
            EventKind::Paid => OrderEventType::Paid,
            EventKind::Cancelled => OrderEventType::Cancelled,
            EventKind::Expired => OrderEventType::Expired,
        }
    }

    /// `order.created`, …: the tail of the `type`, and of the NATS subject.
    pub fn suffix(self) -> &'static str {
        match self {
            OrderEventType::Created => "order.created",
            OrderEventType::Paid => "order.paid",
            OrderEventType::Cancelled => "order.cancelled",
            OrderEventType::Expired => "order.expired",
            OrderEventType::Lost => "order.lost",
            OrderEventType::SoldOut => "sale.sold_out",
        }
    }

    /// The last word, as the event's `id` ends.
    fn word(self) -> &'static str {
        let suffix = self.suffix();
        &suffix[suffix.find('.').map_or(0, |i| i + 1)..]
    }
}

/// An order as the API answers it and its events carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OrderFields {
    pub order_no: String,
    pub sku_id: u64,
    pub user_id: u64,
    pub request_id: String,
    pub quantity: u32,
    pub status: OrderStatus,
    /// Reserve mode: the payment deadline of the hold (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<i64>,
}

impl OrderFields {
    /// An order's fields in `status`, with its payment deadline where it has one (`> 0`).
    pub fn new(
        no: &OrderNo,
        user: UserId,
        request: &RequestId,
        quantity: u32,
        status: OrderStatus,
        deadline_ms: i64,
    ) -> OrderFields {
        OrderFields {
            order_no: no.to_string(),
            sku_id: no.sku().0,
            user_id: user.0,
            request_id: request.to_string(),
            quantity,
            status,
            deadline_ms: (deadline_ms > 0).then_some(deadline_ms),
        }
    }

    /// A hot order's fields in `status`.
    pub fn of(o: &HotOrder, status: OrderStatus) -> OrderFields {
        let deadline_ms = o.deadline_ms;
        OrderFields::new(
            &o.order_no,
            o.user_id,
            &o.request_id,
            o.quantity,
            status,
            deadline_ms,
        )
    }
}

/// The order as the API shows it, after the transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderData {
    #[serde(flatten)]
    pub order: OrderFields,
    /// When the transition happened (ms, the hot ledger's clock).
    pub at_ms: i64,
}

/// An order the reconciler reported lost: accepted by the hot ledger, never stored (the API
/// answers 404 for it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostData {
    pub order_no: String,
    pub sku_id: u64,
    /// Always `LOST`.
    pub status: String,
    /// The stored reconciler run that reported it (`GET /api/v1/admin/reconcile/runs`).
    pub reconcile_run_id: u64,
    /// When that run ran (ms).
    pub at_ms: i64,
}

/// A sale whose every unit sold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoldOutData {
    pub sku_id: u64,
    pub total_stock: u64,
    pub sold: u64,
    /// The time of the transition that sold the last unit (ms, the hot ledger's clock).
    pub at_ms: i64,
}

/// An event's `data`: the order as the API shows it, a lost order, or a sold-out sale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EventData {
    Order(OrderData),
    Lost(LostData),
    SoldOut(SoldOutData),
}

impl EventData {
    /// When the transition happened (ms).
    pub fn at_ms(&self) -> i64 {
        match self {
            EventData::Order(o) => o.at_ms,
            EventData::Lost(l) => l.at_ms,
            EventData::SoldOut(s) => s.at_ms,
        }
    }

    /// The order's data, for an order's own transition.
    pub fn order(&self) -> Option<&OrderData> {
        match self {
            EventData::Order(o) => Some(o),
            _ => None,
        }
    }
}

/// One event in CloudEvents 1.0 structured JSON. `sequence` (the CloudEvents sequence
/// extension) and `partitionkey` (the partitioning extension) let a consumer order by stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloudEvent {
    pub specversion: String,
    pub id: String,
    pub source: String,
    #[serde(rename = "type")]
    pub ty: String,
    pub subject: String,
    pub time: String,
    pub datacontenttype: String,
    /// `<bucket>.<seq>` of the stream, zero-padded so it sorts as text.
    pub sequence: String,
    /// The sale (sku id): every event of one order has it.
    pub partitionkey: String,
    pub data: EventData,
}

impl CloudEvent {
    /// The event of a stored transition; `None` for a row the guard rejected.
    pub fn of(logged: &LoggedEvent) -> Option<CloudEvent> {
        if logged.rejected {
            return None;
        }
        let e = &logged.event;
        let ty = OrderEventType::of(e.kind);
        let reserve = e.deadline_ms > 0;
        let status = match e.kind {
            EventKind::Deducted if reserve => OrderStatus::Reserved,
            EventKind::Deducted => OrderStatus::Created,
            EventKind::Paid => OrderStatus::Paid,
            EventKind::Cancelled => OrderStatus::Cancelled,
            EventKind::Expired => OrderStatus::Expired,
        };
        Some(CloudEvent {
            specversion: SPEC_VERSION.to_owned(),
            id: event_id(&e.order_no.to_string(), ty),
            source: format!("/flashsale/sales/{}", e.sku_id),
            ty: format!("{TYPE_PREFIX}{}", ty.suffix()),
            subject: e.order_no.to_string(),
            time: rfc3339_ms(e.at_ms),
            datacontenttype: "application/json".to_owned(),
            sequence: format!("{:02}.{:020}", logged.bucket, e.seq),
            partitionkey: e.sku_id.to_string(),
            data: EventData::Order(OrderData {
                order: OrderFields::new(
                    &e.order_no,
                    e.user_id,
                    &e.request_id,
                    e.quantity,
                    status,
                    if e.kind == EventKind::Deducted {
                        e.deadline_ms
                    } else {
                        0
                    },
                ),
                at_ms: e.at_ms,
            }),
        })
    }

    /// The event of a stored notice: `order.lost` (subject the order number) or
    /// `sale.sold_out` (subject the sale's sku id). Its `sequence` is `64.<seq>`, the notice
    /// stream's.
    pub fn of_notice(n: &Notice) -> CloudEvent {
        let sku = n.sku_id.0;
        let (ty, id, subject, data) = match n.kind {
            NoticeKind::Lost => (
                OrderEventType::Lost,
                event_id(&n.order_no, OrderEventType::Lost),
                n.order_no.clone(),
                EventData::Lost(LostData {
                    order_no: n.order_no.clone(),
                    sku_id: sku,
                    status: "LOST".to_owned(),
                    reconcile_run_id: n.run_id,
                    at_ms: n.at_ms,
                }),
            ),
            NoticeKind::SoldOut => (
                OrderEventType::SoldOut,
                format!("sale-{sku}.sold_out.{}", n.total_stock),
                sku.to_string(),
                EventData::SoldOut(SoldOutData {
                    sku_id: sku,
                    total_stock: n.total_stock,
                    sold: n.total_stock,
                    at_ms: n.at_ms,
                }),
            ),
        };
        CloudEvent {
            specversion: SPEC_VERSION.to_owned(),
            id,
            source: format!("/flashsale/sales/{sku}"),
            ty: format!("{TYPE_PREFIX}{}", ty.suffix()),
            subject,
            time: rfc3339_ms(n.at_ms),
            datacontenttype: "application/json".to_owned(),
            sequence: format!("{NOTICES:02}.{:020}", n.seq),
            partitionkey: sku.to_string(),
            data,
        }
    }

    /// The `type`'s tail (`order.created`, …).
    pub fn suffix(&self) -> &str {
        self.ty.strip_prefix(TYPE_PREFIX).unwrap_or(&self.ty)
    }

    /// The JSON body (structured mode).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an event serializes")
    }
}

/// The stable id of one transition of one order.
pub fn event_id(order_no: &str, ty: OrderEventType) -> String {
    format!("{order_no}.{}", ty.word())
}

/// `ms` since the Unix epoch as RFC 3339 UTC with milliseconds (`2026-01-31T12:00:00.250Z`).
pub fn rfc3339_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logged(kind: EventKind, deadline_ms: i64, rejected: bool) -> LoggedEvent {
        LoggedEvent {
            bucket: 0,
            event: Event {
                sku_id: SkuId(42),
                epoch: 1,
                seq: 17,
                kind,
                order_no: OrderNo::new(SkuId(42), 1, 17),
                request_id: RequestId::parse("r-1").unwrap(),
                user_id: UserId(7),
                quantity: 2,
                at_ms: 1_767_225_600_250,
                deadline_ms,
            },
            rejected,
        }
    }

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_767_225_600_250), "2026-01-01T00:00:00.250Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn an_event_is_a_pure_function_of_its_row_with_a_stable_id() {
        let a = CloudEvent::of(&logged(EventKind::Deducted, 0, false)).unwrap();
        let b = CloudEvent::of(&logged(EventKind::Deducted, 0, false)).unwrap();
        assert_eq!(a.to_json(), b.to_json());
        let no = OrderNo::new(SkuId(42), 1, 17).to_string();
        assert_eq!(a.id, format!("{no}.created"));
        assert_eq!(a.ty, "dev.flashsale.order.created");
        assert_eq!(a.subject, no);
        assert_eq!(a.data.order().unwrap().order.status, OrderStatus::Created);
        assert_eq!(a.data.order().unwrap().order.deadline_ms, None);
        let json: serde_json::Value = serde_json::from_slice(&a.to_json()).unwrap();
        assert_eq!(json["specversion"], "1.0");
        assert_eq!(json["type"], "dev.flashsale.order.created");
        assert_eq!(json["time"], "2026-01-01T00:00:00.250Z");
        assert_eq!(json["data"]["status"], "CREATED");
    }

    #[test]
    fn each_kind_has_its_type_and_status_and_rejected_rows_announce_nothing() {
        let held = CloudEvent::of(&logged(EventKind::Deducted, 99, false)).unwrap();
        let data = &held.data.order().unwrap().order;
        assert_eq!(data.status, OrderStatus::Reserved);
        assert_eq!(data.deadline_ms, Some(99));
        for (kind, ty, status) in [
            (EventKind::Paid, "order.paid", OrderStatus::Paid),
            (
                EventKind::Cancelled,
                "order.cancelled",
                OrderStatus::Cancelled,
            ),
            (EventKind::Expired, "order.expired", OrderStatus::Expired),
        ] {
            let e = CloudEvent::of(&logged(kind, 99, false)).unwrap();
            assert_eq!(e.suffix(), ty);
            assert_eq!(e.data.order().unwrap().order.status, status);
            assert_eq!(e.data.order().unwrap().order.deadline_ms, None);
            assert!(e.id.ends_with(&ty["order".len()..]));
        }
        assert!(CloudEvent::of(&logged(EventKind::Deducted, 0, true)).is_none());
    }

    fn notice(kind: NoticeKind) -> Notice {
        Notice {
            sku_id: SkuId(42),
            seq: 3,
            kind,
            order_no: if kind == NoticeKind::Lost {
                "42-1-9".into()
            } else {
                String::new()
            },
            total_stock: if kind == NoticeKind::Lost { 0 } else { 100 },
            run_id: if kind == NoticeKind::Lost { 7 } else { 0 },
            at_ms: 1_767_225_600_250,
        }
    }

    #[test]
    fn notices_have_their_types_stable_ids_and_data_that_reads_back() {
        let lost = CloudEvent::of_notice(&notice(NoticeKind::Lost));
        assert_eq!(lost.id, "42-1-9.lost");
        assert_eq!(lost.ty, "dev.flashsale.order.lost");
        assert_eq!(lost.subject, "42-1-9");
        assert_eq!(lost.sequence, "64.00000000000000000003");
        let sold = CloudEvent::of_notice(&notice(NoticeKind::SoldOut));
        assert_eq!(sold.id, "sale-42.sold_out.100");
        assert_eq!(sold.ty, "dev.flashsale.sale.sold_out");
        assert_eq!(sold.suffix(), "sale.sold_out");
        assert_eq!(sold.subject, "42");
        for e in [&lost, &sold] {
            let back: CloudEvent = serde_json::from_slice(&e.to_json()).unwrap();
            assert_eq!(&back, e);
        }
        let order = CloudEvent::of(&logged(EventKind::Paid, 9, false)).unwrap();
        let back: CloudEvent = serde_json::from_slice(&order.to_json()).unwrap();
        assert_eq!(back, order);
        let json: serde_json::Value = serde_json::from_slice(&lost.to_json()).unwrap();
        assert_eq!(json["data"]["status"], "LOST");
        assert_eq!(json["data"]["reconcile_run_id"], 7);
    }
}
