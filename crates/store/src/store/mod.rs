//! [`Store`]: the system of record's algorithm, written once over a [`Backend`]. Every
//! `OrderStore` method lives here: the apply of a batch (read the locked sale row and the
//! stored events the batch names, split off duplicates and fenced events, fold the fresh
//! ones, write the plan under the guarded counter update), audits, fenced events, dead
//! letters, reconcile runs. A backend (`mysql`, `sqlite`, `postgres`) adds how it connects
//! and migrates, and what only it has.

//!
//! Files, each using only those listed before it: `base` (the pools, transactions, connect and
//! migrate), `one_row` (an order row as its deduction: the event log read from both tables,
//! the contract step), `buckets` (a bucketed sale's rows), `apply` (a batch of events in one
//! transaction), `transfers` (a transfer side), `order_store` (the `OrderStore` impl, and the
//! stream's pause).

mod apply;
mod base;
mod buckets;
mod one_row;
mod order_store;
mod transfers;

pub use base::Store;
pub use one_row::ContractReport;
