//! `/openapi.json` describes exactly the routes the service has: every documented operation
//! is routed (not 404 ROUTE_NOT_FOUND or 405), and every routed operation is documented.

use std::collections::BTreeSet;

use crate::common::Stack;
use reqwest::StatusCode;
use serde_json::Value;

/// Every route of `flashsale_server::app`, as (method, OpenAPI path). Keep in step with lib.rs.
const ROUTES: &[(&str, &str)] = &[
    ("post", "/api/v1/sales"),
    ("get", "/api/v1/sales/{sku_id}"),
    ("post", "/api/v1/sales/{sku_id}/warm"),
    ("post", "/api/v1/sales/{sku_id}/pause"),
    ("post", "/api/v1/sales/{sku_id}/resume"),
    ("post", "/api/v1/sales/{sku_id}/end"),
    ("post", "/api/v1/sales/{sku_id}/purchases"),
    ("post", "/api/v1/sales/{sku_id}/purchase-token"),
    ("get", "/api/v1/orders/{order_no}"),
    ("post", "/api/v1/orders/{order_no}/pay"),
    ("post", "/api/v1/orders/{order_no}/cancel"),
    ("get", "/api/v1/admin/blacklist"),
    ("put", "/api/v1/admin/blacklist/users/{user_id}"),
    ("delete", "/api/v1/admin/blacklist/users/{user_id}"),
    ("put", "/api/v1/admin/blacklist/ips/{ip}"),
    ("delete", "/api/v1/admin/blacklist/ips/{ip}"),
    ("put", "/api/v1/admin/sales/{sku_id}/purchase-token"),
    ("delete", "/api/v1/admin/sales/{sku_id}/purchase-token"),
    ("get", "/api/v1/admin/risk"),
    ("put", "/api/v1/admin/risk/allowlist/users/{user_id}"),
    ("delete", "/api/v1/admin/risk/allowlist/users/{user_id}"),
    ("put", "/api/v1/admin/sales/{sku_id}/risk-fallback"),
    ("delete", "/api/v1/admin/sales/{sku_id}/risk-fallback"),
    ("get", "/api/v1/dashboard"),
    ("get", "/api/v1/admin/dashboard"),
    ("get", "/api/v1/dashboard/history/{sku_id}"),
    ("get", "/api/v1/admin/dashboard/history/{sku_id}"),
    ("get", "/api/v1/admin/reconcile"),
    ("post", "/api/v1/admin/reconcile/{sku_id}/repair"),
    ("get", "/api/v1/admin/events"),
    ("post", "/api/v1/admin/events/{sink}/redeliver"),
    ("post", "/api/v1/admin/events/{sink}/resume"),
    ("get", "/healthz"),
    ("post", "/api/v1/sales/{sku_id}/queue"),
    ("get", "/api/v1/sales/{sku_id}/queue/me"),
    ("get", "/api/v1/sales/{sku_id}/queue/me/events"),
    ("post", "/api/v1/sales/{sku_id}/entries"),
    ("get", "/api/v1/sales/{sku_id}/entries/me"),
    ("get", "/api/v1/sales/{sku_id}/draw"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/"),
];

fn concrete(path: &str) -> String {
    path.replace("{sku_id}", "1")
        .replace("{order_no}", "1-1-1")
        .replace("{user_id}", "1")
        .replace("{ip}", "10.0.0.1")
        .replace("{sink}", "webhook")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_matches_the_router() {
    let stack = Stack::embedded().await;
    let resp = stack.raw_get("/openapi.json").await;
    assert_eq!(resp.status(), StatusCode::OK);
    let doc: Value = resp.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["get", "post", "put", "delete", "patch"] {
            if item.get(method).is_some() {
                documented.insert((method.to_owned(), path.clone()));
            }
        }
    }
    let routed: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, routed, "documented vs routed operations");
    // Every documented operation is really routed.
    for (method, path) in &routed {
        let url = format!("{}{}", stack.base, concrete(path));
        let resp = stack
            .http
            .request(method.to_uppercase().parse().unwrap(), url)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        assert!(
            body["code"] != "ROUTE_NOT_FOUND" && status != StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}: {status} {body}"
        );
        let op = &doc["paths"][path][method];
        assert!(
            op["responses"].get(status.as_str()).is_some(),
            "{method} {path} answered {status}, which the document does not list"
        );
    }
    // The schemas used by the handlers are there, with their bounds.
    let purchase = &doc["components"]["schemas"]["PurchaseBody"];
    assert_eq!(purchase["properties"]["quantity"]["maximum"], 1000);
    assert_eq!(purchase["additionalProperties"], false);
    // Error answers are documented as Problem Details.
    let error = &doc["components"]["schemas"]["Error"]["properties"];
    for field in ["type", "title", "status", "detail", "code", "message"] {
        assert!(error.get(field).is_some(), "Error schema lacks {field}");
    }
    let sold_out = &doc["paths"]["/api/v1/sales/{sku_id}/purchases"]["post"]["responses"]["409"];
    assert!(
        sold_out["content"]
            .get("application/problem+json")
            .is_some(),
        "{sold_out}"
    );
}

/// The error-code schema is a mirror (core may not depend on utoipa): it must list exactly
/// the codes of `ErrorCode::ALL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_error_code_schema_lists_every_code() {
    let stack = Stack::embedded().await;
    let (s, doc) = stack.call("GET", "/openapi.json", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let listed: BTreeSet<String> = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .expect("ErrorCode enum in the document")
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let codes: BTreeSet<String> = flashsale_core::ErrorCode::ALL
        .iter()
        .map(|c| c.as_str().to_owned())
        .collect();
    assert_eq!(listed, codes);
}

/// A sale's view documents a bucketed sale's per-bucket counters, each field described, and
/// none of them required (a sale of one bucket has none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sale_view_documents_its_bucket_counters() {
    let stack = Stack::embedded().await;
    let (s, doc) = stack.call("GET", "/openapi.json", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let schemas = &doc["components"]["schemas"];
    let parts = schemas["SaleView"]["allOf"]
        .as_array()
        .expect("SaleView allOf");
    let part = parts
        .iter()
        .find(|p| p["properties"].get("bucket_counters").is_some())
        .expect("a part with bucket_counters");
    for field in ["bucket_counters", "in_flight_units", "bucket_source"] {
        // utoipa puts a reference's description beside it, inside the nullable `oneOf`.
        let property = &part["properties"][field];
        let one_of = property["oneOf"].as_array().cloned().unwrap_or_default();
        let description = std::iter::once(property)
            .chain(one_of.iter())
            .find_map(|p| p["description"].as_str());
        assert!(
            description.is_some_and(|d| !d.is_empty()),
            "{field}: {part}"
        );
        let required = part["required"].as_array().cloned().unwrap_or_default();
        assert!(!required.contains(&Value::from(field)), "{field} required");
    }
    let bucket = &schemas["BucketCounters"]["properties"];
    for field in ["bucket", "total", "available", "reserved", "sold"] {
        assert!(bucket.get(field).is_some(), "BucketCounters lacks {field}");
    }
    let sources: BTreeSet<&str> = schemas["BucketSource"]["enum"]
        .as_array()
        .expect("BucketSource enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(sources, BTreeSet::from(["hot", "database"]));
}
