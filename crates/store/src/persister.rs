//! persister (in progress)
