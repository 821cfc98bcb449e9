//! The conformance suite (filled in with the ledgers).
