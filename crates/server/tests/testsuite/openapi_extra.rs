//! The OpenAPI document says what the code does for `u64` ids (every value up to 2^64−1 is
//! taken, one past it is refused) and links a sale's life together for stateful clients.

use crate::common::Stack;
use reqwest::StatusCode;
use serde_json::Value;

async fn document(stack: &Stack) -> Value {
    let url = format!("{}/openapi.json", stack.base);
    stack
        .http
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A property of a schema, also inside its `allOf` parts (a flattened struct's fields).
fn property<'a>(schema: &'a Value, name: &str) -> Option<&'a Value> {
    if let Some(p) = schema["properties"].get(name) {
        return Some(p);
    }
    let parts = schema["allOf"].as_array()?;
    parts.iter().find_map(|part| property(part, name))
}

fn path_param<'a>(doc: &'a Value, path: &str, method: &str, name: &str) -> &'a Value {
    let params = doc["paths"][path][method]["parameters"].as_array().unwrap();
    let param = params.iter().find(|p| p["name"] == name).unwrap();
    &param["schema"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn u64_ids_are_documented_and_served_to_their_top() {
    let stack = Stack::embedded().await;
    let doc = document(&stack).await;
    let path = "/api/v1/admin/blacklist/users/{user_id}";
    let schema = path_param(&doc, path, "put", "user_id");
    assert_eq!(schema["format"], "uint64", "{schema}");
    assert_eq!(schema["minimum"].as_u64(), Some(1), "{schema}");
    assert_eq!(schema["maximum"].as_u64(), Some(u64::MAX), "{schema}");
    // A sale with its stock: the sale's own fields (inlined), then its counters.
    let sale_id = property(&doc["components"]["schemas"]["SaleView"], "sku_id").unwrap();
    assert_eq!(sale_id["maximum"].as_u64(), Some(u64::MAX), "{sale_id}");
    let ip = path_param(&doc, "/api/v1/admin/blacklist/ips/{ip}", "put", "ip");
    assert_eq!(ip["anyOf"][0]["format"], "ipv4", "{ip}");
    assert_eq!(ip["anyOf"][1]["format"], "ipv6", "{ip}");
    let quantity = &doc["components"]["schemas"]["PurchaseBody"]["properties"]["quantity"];
    assert_eq!(
        quantity["maximum"].as_u64(),
        Some(1_000),
        "a bounded field keeps its bound"
    );

    let top = u64::MAX.to_string();
    let (s, b) = stack
        .admin("PUT", &format!("/api/v1/admin/blacklist/users/{top}"), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let past = "18446744073709551616";
    let path = format!("/api/v1/admin/blacklist/users/{past}");
    let (s, b) = stack.admin("PUT", &path, None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_chain_create_warm_purchase_order_pay() {
    let stack = Stack::embedded().await;
    let doc = document(&stack).await;
    let links = |path: &str, method: &str, status: &str| {
        doc["paths"][path][method]["responses"][status]["links"].clone()
    };
    let created = links("/api/v1/sales", "post", "201");
    assert_eq!(created["WarmSale"]["operationId"], "warm_sale");
    assert_eq!(
        created["WarmSale"]["parameters"]["sku_id"],
        "$response.body#/sku_id"
    );
    let warmed = links("/api/v1/sales/{sku_id}/warm", "post", "200");
    assert_eq!(warmed["Purchase"]["operationId"], "purchase");
    let bought = links("/api/v1/sales/{sku_id}/purchases", "post", "202");
    for (name, op) in [
        ("GetOrder", "get_order"),
        ("PayOrder", "pay_order"),
        ("CancelOrder", "cancel_order"),
    ] {
        assert_eq!(bought[name]["operationId"], op);
        assert_eq!(
            bought[name]["parameters"]["order_no"],
            "$response.body#/order_no"
        );
    }
    // Every link names an operation the document has.
    let ids: Vec<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .filter_map(|op| op["operationId"].as_str())
        .collect();
    for target in [
        "warm_sale",
        "get_sale",
        "purchase",
        "get_order",
        "pay_order",
        "cancel_order",
    ] {
        assert!(ids.contains(&target), "{target} not in {ids:?}");
    }
}
