//! A sale stored live for a relay test ([`stored_live_sale`]), and the check of delivered order
//! events against what the database stored: a consumer that deduplicates by `id` must hold
//! exactly the stored transitions, each once, with the same content, and per order in the
//! order they happened (created before its resolution; a lost order and a sold-out sale have
//! no creation to follow).

use std::collections::{HashMap, HashSet};

use flashsale_core::events::CloudEvent;
use flashsale_core::{OrderStore, Sale, SaleBook, SaleState};

/// Stores `sale` live with its first epoch taken, as the first load of its hot copy does, and
/// returns the book that copy runs: the transitions a test stores then come from it.
pub async fn stored_live_sale(store: &dyn OrderStore, sale: &Sale) -> SaleBook {
    store.create_sale(sale).await.expect("create the sale");
    (store.set_state(sale.sku_id, SaleState::Live).await).expect("set it live");
    let epoch = store.take_epoch(sale.sku_id, 0).await.expect("take epoch");
    assert_eq!(epoch, Some(1), "the sale's first epoch");
    let live = Sale {
        state: SaleState::Live,
        ..sale.clone()
    };
    SaleBook::new(live.clone(), live.fresh_counters(), 1)
}

/// What a delivery looked like, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Events received, duplicates included.
    pub received: usize,
    /// Distinct ids.
    pub unique: usize,
}

/// Checks `delivered` (in arrival order, duplicates allowed) against `stored` (every
/// transition the database holds, as the relay maps it): an error names the first breach.
pub fn check_exactly_once(
    stored: &[CloudEvent],
    delivered: &[CloudEvent],
) -> Result<Delivery, String> {
    let want: HashMap<&str, &CloudEvent> = stored.iter().map(|e| (e.id.as_str(), e)).collect();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut first_order: Vec<&CloudEvent> = Vec::new();
    for e in delivered {
        let Some(stored) = want.get(e.id.as_str()) else {
            return Err(format!("delivered {} that the database never stored", e.id));
        };
        if *stored != e {
            return Err(format!("{} delivered with other content than stored", e.id));
        }
        if seen.insert(&e.id, first_order.len()).is_none() {
            first_order.push(e);
        }
    }
    let missing: Vec<&str> = stored
        .iter()
        .map(|e| e.id.as_str())
        .filter(|id| !seen.contains_key(id))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{} stored transitions never delivered, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        ));
    }
    let mut created: HashSet<&str> = HashSet::new();
    for e in &first_order {
        match e.suffix() {
            "order.created" => {
                created.insert(&e.subject);
            }
            // A lost order was never stored, so never created; a sale's notice has none.
            "order.lost" | "sale.sold_out" => {}
            _ if !created.contains(e.subject.as_str()) => {
                return Err(format!("{} arrived before its order's creation", e.id));
            }
            _ => {}
        }
    }
    Ok(Delivery {
        received: delivered.len(),
        unique: first_order.len(),
    })
}
