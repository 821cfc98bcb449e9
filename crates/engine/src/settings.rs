//! One settings tree for the engine: where the ledger and the system of record live, which
//! sales sit on a dedicated Redis, this instance's name, the persister and the reconcile
//! worker. The CLI builds it from flags, env and a file; the server nests it under its own
//! `Config` beside the HTTP-only settings.

use std::time::Duration;

use crate::placement::HotSales;
use crate::reconcile::WorkerSettings;

/// Everything the engine needs to open its backends and run its workers.
#[derive(Debug, Clone)]
pub struct Settings {
    pub ledger: LedgerSettings,
    /// The system of record (`mysql://…`, `mariadb://…` or `sqlite:…`).
    pub database_url: String,
    /// Names this instance as a stream consumer and lease owner.
    pub instance_id: String,
    pub persister: PersisterSettings,
    /// The reconcile worker of this process.
    pub reconcile: WorkerSettings,
    /// Order events to the shop's other systems (the sinks, the relay).
    pub events: crate::relay::EventsSettings,
    /// Queue and draw sales' admission.
    pub admission: crate::admission::AdmissionConfig,
}

impl Settings {
    /// Settings of a process on the ledger at `redis_url` (embedded when `None`) and the
    /// database at `database_url`, named `instance_id`, with every other default.
    pub fn new(
        redis_url: Option<String>,
        redis_prefix: &str,
        database_url: &str,
        instance_id: &str,
    ) -> Settings {
        Settings {
            ledger: LedgerSettings {
                redis_url,
                redis_prefix: redis_prefix.to_owned(),
                ..LedgerSettings::default()
            },
            database_url: database_url.to_owned(),
            instance_id: instance_id.to_owned(),
            persister: PersisterSettings::default(),
            reconcile: WorkerSettings::default(),
            events: crate::relay::EventsSettings::default(),
            admission: crate::admission::AdmissionConfig::DEFAULT,
        }
    }
}

/// Where the hot ledger lives.
#[derive(Debug, Clone, Default)]
pub struct LedgerSettings {
    /// Set → Redis ledger; unset → embedded ledger.
    pub redis_url: Option<String>,
    pub redis_prefix: String,
    /// Redis ledger: answer writes only once replicas have them (`WAIT`); `None` = off.
    pub replication: Option<flashsale_redis::Replication>,
    /// Sales whose hot copy lives on a dedicated Redis (it decides where their ledger is).
    pub hot_sales: HotSales,
    /// Redis ledger: load copies in layout 2, one record per buyer
    /// (`flashsale_redis::RedisLedger::with_records`); either layout is served.
    pub redis_records: bool,
}

/// The stream persister of a process (Redis ledger only): whether it runs, and its bounds
/// (`FLASHSALE_PERSISTER_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersisterSettings {
    /// Run the stream persister inside this process.
    pub run: bool,
    /// Entries per read.
    pub batch_max: usize,
    /// How long one read waits for new entries.
    pub block_ms: u64,
    /// How long a read that found few entries waits to be topped up (0: never), so that one
    /// transaction carries the entries of that time: a delay of the database copy, never of an
    /// answer. Under load each transaction's fixed cost (its commit, the lease, the ack) is
    /// shared by the purchases of 20 ms instead of 5 ms: MariaDB a sixth less per purchase.
    pub fill_wait_ms: u64,
    pub lease_ttl_ms: u64,
    /// Entries pending this long with another consumer are claimed.
    pub claim_idle_ms: u64,
    /// Tries of one entry before it is parked as a dead letter.
    pub attempts_max: u32,
    pub backoff_ms_max: u64,
    /// Longest wait between tries of a sale stopped on an entry of a newer format.
    pub format_wait_ms_max: u64,
    /// How often the set of sales is read again.
    pub discover_every: Duration,
}

impl PersisterSettings {
    /// Every default, in one place: the persister's and the CLI's flags take theirs from here.
    pub const DEFAULT: PersisterSettings = PersisterSettings {
        run: true,
        batch_max: 1_024,
        block_ms: 100,
        fill_wait_ms: 20,
        lease_ttl_ms: 3_000,
        claim_idle_ms: 2_000,
        attempts_max: 5,
        backoff_ms_max: 2_000,
        format_wait_ms_max: 30_000,
        discover_every: Duration::from_millis(500),
    };
}

impl Default for PersisterSettings {
    fn default() -> PersisterSettings {
        PersisterSettings::DEFAULT
    }
}
