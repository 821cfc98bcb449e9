//! The crate's integration tests, one binary (each former test file is a module).

mod conformance;
mod kill9;
mod recovery;
mod writer;
