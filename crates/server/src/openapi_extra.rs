//! What the OpenAPI document needs beyond utoipa's attributes, applied as `Modify` steps:
//!
//! - [`Unsigned`]: the true range of `u64` values. utoipa writes a `u64` as `format: int64,
//!   minimum: 0`, and `int64` tells clients (and fuzzers) the top is 2^63−1, while the code
//!   takes every `u64`: such schemas say `format: uint64` and `maximum: 2^64−1` instead.
//! - [`IpAddresses`]: an `{ip}` path parameter is an IPv4 or IPv6 address, as the code parses it.
//! - [`Links`]: OpenAPI links along a sale's life (create → warm → purchase → order → pay or
//!   cancel), so a stateful client or fuzzer can chain calls with real ids.

use serde_json::{json, Value};
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::schema::{
    AnyOfBuilder, KnownFormat, Object, ObjectBuilder, SchemaFormat, SchemaType, Type,
};
use utoipa::openapi::{OpenApi, RefOr, Schema};
use utoipa::{Modify, Number};

/// `u64` schemas get their real range (see the module doc).
pub struct Unsigned;

impl Modify for Unsigned {
    fn modify(&self, doc: &mut OpenApi) {
        for item in doc.paths.paths.values_mut() {
            for op in operations(item) {
                for param in op.parameters.iter_mut().flatten() {
                    if let Some(schema) = param.schema.as_mut() {
                        widen(schema);
                    }
                }
            }
        }
        if let Some(components) = doc.components.as_mut() {
            components.schemas.values_mut().for_each(widen);
        }
    }
}

fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.post,
        &mut item.put,
        &mut item.delete,
        &mut item.patch,
    ]
    .into_iter()
    .flatten()
}

fn widen(schema: &mut RefOr<Schema>) {
    let RefOr::T(schema) = schema else {
        return;
    };
    match schema {
        Schema::Object(o) => {
            if is_unbounded_u64(o) {
                o.format = Some(SchemaFormat::Custom("uint64".into()));
                o.maximum = Some(Number::UInt(
                    usize::try_from(u64::MAX).unwrap_or(usize::MAX),
                ));
            }
            o.properties.values_mut().for_each(widen);
        }
        Schema::OneOf(one) => one.items.iter_mut().for_each(widen),
        Schema::AllOf(all) => all.items.iter_mut().for_each(widen),
        _ => {}
    }
}

/// How utoipa renders a `u64` (or `Option<u64>`) that no attribute bounded from above: an
/// `int64` integer with a non-negative minimum. No `i64` field of the API has a minimum
/// without a maximum, so none is caught by mistake.
fn is_unbounded_u64(o: &Object) -> bool {
    let integer = match &o.schema_type {
        SchemaType::Type(t) => *t == Type::Integer,
        SchemaType::Array(ts) => ts.contains(&Type::Integer),
        SchemaType::AnyValue => false,
    };
    let int64 = matches!(
        o.format,
        Some(SchemaFormat::KnownFormat(KnownFormat::Int64))
    );
    let non_negative = match o.minimum {
        Some(Number::UInt(_)) => true,
        Some(Number::Int(n)) => n >= 0,
        Some(Number::Float(f)) => f >= 0.0,
        None => false,
    };
    integer && int64 && non_negative && o.maximum.is_none()
}

/// `{ip}` parameters: `anyOf` an `ipv4` and an `ipv6` string (utoipa has no attribute for it).
pub struct IpAddresses;

impl Modify for IpAddresses {
    fn modify(&self, doc: &mut OpenApi) {
        for item in doc.paths.paths.values_mut() {
            for op in operations(item) {
                let params = op.parameters.iter_mut().flatten();
                for param in params.filter(|p| p.name == "ip") {
                    param.schema = Some(RefOr::T(ip_schema()));
                }
            }
        }
    }
}

fn ip_schema() -> Schema {
    let string = |format: &str| {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::Custom(format.into())))
            .build()
    };
    AnyOfBuilder::new()
        .item(string("ipv4"))
        .item(string("ipv6"))
        .build()
        .into()
}

/// One link: (name, target operation id, its parameter, runtime expression of the value).
type LinkSpec = (&'static str, &'static str, &'static str, &'static str);

const SKU_FROM_BODY: &str = "$response.body#/sku_id";
const ORDER_FROM_BODY: &str = "$response.body#/order_no";

/// A link `name` to operation `target` that passes the answer's `sku_id` on.
const fn by_sku(name: &'static str, target: &'static str) -> LinkSpec {
    (name, target, "sku_id", SKU_FROM_BODY)
}

/// A link `name` to operation `target` that passes the answer's `order_no` on.
const fn by_order(name: &'static str, target: &'static str) -> LinkSpec {
    (name, target, "order_no", ORDER_FROM_BODY)
}

/// What an order's answer (a purchase's too) leads to: paying or cancelling it.
const PAY: LinkSpec = by_order("PayOrder", "pay_order");
const CANCEL: LinkSpec = by_order("CancelOrder", "cancel_order");

/// Links from each step of a sale's life to the next ones.
const LINKS: &[(&str, &str, &str, &[LinkSpec])] = &[
    (
        "/api/v1/sales",
        "post",
        "201",
        &[
            by_sku("WarmSale", "warm_sale"),
            by_sku("GetSale", "get_sale"),
        ],
    ),
    (
        "/api/v1/sales/{sku_id}/warm",
        "post",
        "200",
        &[
            by_sku("Purchase", "purchase"),
            by_sku("PurchaseToken", "issue_purchase_token"),
            by_sku("PauseSale", "pause_sale"),
            by_sku("EndSale", "end_sale"),
        ],
    ),
    (
        "/api/v1/sales/{sku_id}/purchases",
        "post",
        "202",
        &[by_order("GetOrder", "get_order"), PAY, CANCEL],
    ),
    ("/api/v1/orders/{order_no}", "get", "200", &[PAY, CANCEL]),
];

/// Adds [`LINKS`] to the answers they start from.
pub struct Links;

impl Modify for Links {
    fn modify(&self, doc: &mut OpenApi) {
        for (path, method, status, links) in LINKS {
            let Some(RefOr::T(response)) = doc
                .paths
                .paths
                .get_mut(*path)
                .and_then(|item| operation(item, method))
                .and_then(|op| op.responses.responses.get_mut(*status))
            else {
                panic!(
                    "OpenAPI links start from {method} {path} {status}, which is not documented"
                );
            };
            // utoipa 5's `Link` serialises `operation_id` (not `operationId`), so the links
            // go in as plain JSON under the response's flattened extension map, which writes
            // its keys as they are.
            let links: serde_json::Map<String, Value> = links
                .iter()
                .map(|(name, target, param, value)| {
                    let link = json!({"operationId": target, "parameters": {*param: value}});
                    ((*name).to_owned(), link)
                })
                .collect();
            response
                .extensions
                .get_or_insert_with(Default::default)
                .insert("links".to_owned(), Value::Object(links));
        }
    }
}

fn operation<'a>(item: &'a mut PathItem, method: &str) -> Option<&'a mut Operation> {
    match method {
        "get" => item.get.as_mut(),
        "post" => item.post.as_mut(),
        "put" => item.put.as_mut(),
        "delete" => item.delete.as_mut(),
        _ => None,
    }
}
