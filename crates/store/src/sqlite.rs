//! sqlite (in progress)
