//! Where a persister reads, who it is, its bounds, and how a step fails.

use flashsale_core::{LedgerError, StoreError};

use crate::settings::PersisterSettings;

/// Most events one `apply_events` transaction takes. A read of `batch_max` entries may hold
/// far more events than entries (one purchase call's entry carries all its deductions, up to
/// `BATCH_LEN_MAX`), so a read is applied in transactions of at most this many.
pub const EVENTS_PER_APPLY_MAX: usize = 16_384;

/// Entries a tail read must bring for the persister to apply them at once; fewer, and it waits
/// the settings' `fill_wait_ms` for more (a bounded delay of the database copy, never of an
/// answer).
pub(super) const FILL_ENTRIES: usize = 512;

/// Where a persister reads and who it is; its bounds are the process's persister settings.
#[derive(Debug, Clone)]
pub struct PersisterConfig {
    pub redis_url: String,
    pub prefix: String,
    /// This instance's name in the consumer group and as lease owner.
    pub consumer: String,
    /// Every bound (entries per read: events per transaction at most [`EVENTS_PER_APPLY_MAX`]).
    pub bounds: PersisterSettings,
}

impl PersisterConfig {
    /// With the default bounds.
    pub fn new(redis_url: &str, prefix: &str, consumer: &str) -> PersisterConfig {
        PersisterConfig::with(redis_url, prefix, consumer, &PersisterSettings::DEFAULT)
    }

    /// With the bounds of `s`.
    pub fn with(
        redis_url: &str,
        prefix: &str,
        consumer: &str,
        s: &PersisterSettings,
    ) -> PersisterConfig {
        PersisterConfig {
            redis_url: redis_url.to_owned(),
            prefix: prefix.to_owned(),
            consumer: consumer.to_owned(),
            bounds: s.clone(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Store(#[from] StoreError),
}
