//! A spike over real HTTP: many more buyers than units, duplicates and retries; the
//! invariants are then read from the database's own tables, on Redis+MariaDB,
//! Redis+PostgreSQL and the embedded ledger over SQLite.

use crate::common;

use std::collections::{HashMap, HashSet};

use crate::common::Stack;
use futures::stream::{self, StreamExt};
use reqwest::StatusCode;
use serde_json::json;

const UNITS: u64 = 2_000;
const USERS: u64 = 20_000;
const CLIENTS: usize = 200;
const SKU: u64 = 77;

/// One attempt: user, request id.
fn attempts() -> Vec<(u64, String)> {
    let mut list: Vec<(u64, String)> = (1..=USERS).map(|u| (u, format!("u{u}-a"))).collect();
    // 5% try twice with a new request id; 5% retry the same one.
    list.extend(
        (1..=USERS)
            .filter(|u| u % 20 == 0)
            .map(|u| (u, format!("u{u}-b"))),
    );
    list.extend(
        (1..=USERS)
            .filter(|u| u % 20 == 1)
            .map(|u| (u, format!("u{u}-a"))),
    );
    // Interleave deterministically so retries land mid-spike, not at the end.
    list.sort_by_key(|(u, rid)| (u.wrapping_mul(2_654_435_761) % 1_000, rid.clone()));
    list
}

async fn spike(stack: &Stack) -> Vec<(u64, String, StatusCode, serde_json::Value)> {
    let results = stream::iter(attempts())
        .map(|(user, rid)| async move {
            let (status, body) = stack.buy(user, SKU, &rid, json!(1)).await;
            (user, rid, status, body)
        })
        .buffer_unordered(CLIENTS)
        .collect::<Vec<_>>()
        .await;
    results
}

all_systems!(a_spike_sells_exactly_the_stock);
/// Sells out over HTTP; then what the database's own tables hold, read by the store and
/// counted by SQL, is exactly the answered orders.
async fn a_spike_sells_exactly_the_stock(stack: &Stack) {
    stack.live_sale(SKU, UNITS, 1).await;
    let results = spike(stack).await;

    let mut accepted_users = HashSet::new();
    let mut orders_by_request: HashMap<(u64, String), HashSet<String>> = HashMap::new();
    for (user, rid, status, body) in &results {
        match status.as_u16() {
            202 => {
                accepted_users.insert(*user);
                let no = body["order_no"].as_str().unwrap().to_owned();
                orders_by_request
                    .entry((*user, rid.clone()))
                    .or_default()
                    .insert(no);
            }
            409 => assert!(
                ["SOLD_OUT", "LIMIT_EXCEEDED"].contains(&body["code"].as_str().unwrap()),
                "{body}"
            ),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(
        orders_by_request.values().all(|nos| nos.len() == 1),
        "a retry answered another order"
    );
    let distinct_orders: HashSet<&String> = orders_by_request.values().flatten().collect();
    assert_eq!(
        distinct_orders.len() as u64,
        UNITS,
        "every unit sold once, to one request"
    );
    assert_eq!(
        accepted_users.len() as u64,
        UNITS,
        "limit 1: one unit per buyer"
    );

    stack.drain(SKU).await;
    common::assert_invariants(stack.store().as_ref(), SKU).await;
    let orders = stack
        .store()
        .orders(flashsale_core::SkuId(SKU))
        .await
        .unwrap();
    let stored: HashSet<String> = orders.iter().map(|o| o.order_no.to_string()).collect();
    let answered: HashSet<String> = distinct_orders.into_iter().cloned().collect();
    assert_eq!(
        stored, answered,
        "the database holds exactly the orders that were answered accepted"
    );
    common::assert_sold_out_in_units_of_one(stack.database_url(), SKU, UNITS).await;
}
