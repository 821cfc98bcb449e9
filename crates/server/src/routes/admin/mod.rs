//! Admin handlers of the engine's parts: [`reconcile`] (reports and repairs).

pub mod reconcile;
