//! mysql (in progress)
