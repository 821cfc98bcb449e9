//! Settings: a flag, else an environment variable, else a line `NAME=value` of the config file
//! (`--config`, default `./flashsale.env` when present), else the default. Secrets never come
//! from code: from the environment, the config file, or files in the data dir made on first use.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use flashsale_engine::admission::AdmissionConfig;
use flashsale_engine::placement::HotSales;
use flashsale_engine::reconcile::WorkerSettings;
use flashsale_engine::relay::nats::NatsSettings;
use flashsale_engine::relay::webhook::WebhookSettings;
use flashsale_engine::relay::EventsSettings;
use flashsale_engine::settings::{LedgerSettings, PersisterSettings, Settings as EngineSettings};
use flashsale_server::gateway::{GatewayConfig, TokenRate};
use flashsale_server::identity::{IdentityConfig, JwksSource};
use flashsale_server::risk::{Fallback, RiskCheck, RiskConfig};
use flashsale_server::Tunables;

/// Settings shared by every command.
#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// Address to serve on.
    #[arg(long, env = "FLASHSALE_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// `redis://…` (or a comma list of cluster nodes); set → the Redis ledger.
    #[arg(long, env = "FLASHSALE_REDIS_URL")]
    pub redis_url: Option<String>,
    /// Replicas of a sale's primary that must acknowledge an accepted purchase, payment or
    /// cancellation before it is answered (Redis `WAIT`); 0 = answer once the primary has it.
    #[arg(long, env = "FLASHSALE_REDIS_WAIT_REPLICAS", default_value_t = 0)]
    pub redis_wait_replicas: u32,
    /// How long that WAIT may take, ms (at most 900); fewer replicas by then → 503, retry.
    #[arg(long, env = "FLASHSALE_REDIS_WAIT_TIMEOUT_MS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=900))]
    pub redis_wait_timeout_ms: u64,
    /// Key layout of the sale copies this instance loads into Redis: 1, the requests, orders
    /// and buyers hashes (what every release reads); 2, one record per buyer, which no release
    /// before this one reads: set 2 once no older instance runs (docs/DEPLOY.md). Either is
    /// served, as each copy says.
    #[arg(long, env = "FLASHSALE_REDIS_LAYOUT", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=2))]
    pub redis_layout: u8,
    /// Key prefix in Redis.
    #[arg(long, env = "FLASHSALE_REDIS_PREFIX", default_value = "fs")]
    pub redis_prefix: String,
    /// A dedicated Redis for the hot sales named by FLASHSALE_HOT_SKUS.
    #[arg(long, env = "FLASHSALE_HOT_REDIS_URL")]
    pub hot_redis_url: Option<String>,
    /// Skus routed to the hot Redis, comma list.
    #[arg(long, env = "FLASHSALE_HOT_SKUS", value_delimiter = ',')]
    pub hot_skus: Vec<u64>,
    /// `mysql://…`, `postgres://…` or `sqlite://…`; default `sqlite://<data dir>/flashsale.db`.
    #[arg(long, env = "FLASHSALE_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Where the embedded database, secrets and reports live.
    #[arg(long, env = "FLASHSALE_DATA_DIR", default_value = "./flashsale-data")]
    pub data_dir: PathBuf,
    /// HS256 secret for user tokens (default: one per data dir, made on first use).
    #[arg(long, env = "FLASHSALE_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// Bearer token for admin routes (default: one per data dir, made on first use).
    #[arg(long, env = "FLASHSALE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Reconciler pass interval, ms; 0 = no reconciler worker in this process.
    #[arg(long, env = "FLASHSALE_RECONCILE_INTERVAL_MS",
          default_value_t = millis(WorkerSettings::default().interval))]
    pub reconcile_interval_ms: u64,
    /// Whether the reconciler worker repairs (replay, rebuild, expire) or only reports.
    #[arg(long, env = "FLASHSALE_RECONCILE_REPAIR", default_value_t = WorkerSettings::default().repair,
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub reconcile_repair: bool,
    #[command(flatten)]
    pub persister: PersisterFlags,
    #[command(flatten)]
    pub events: EventsFlags,
    #[command(flatten)]
    pub admission: AdmissionFlags,
    #[command(flatten)]
    pub gateway: GatewaySettings,
    #[command(flatten)]
    pub risk: RiskSettings,
    #[command(flatten)]
    pub identity: IdentitySettings,
}

/// An external identity provider (OIDC-style JWKS): its RS256, ES256 and EdDSA user tokens
/// are accepted besides our own HS256 ones. Off unless a key set is named.
#[derive(Debug, Clone, Args)]
pub struct IdentitySettings {
    /// URL of the provider's JWK set (e.g. `https://idp.example/.well-known/jwks.json`).
    #[arg(long, env = "FLASHSALE_JWKS_URL", conflicts_with = "jwks_file")]
    pub jwks_url: Option<String>,
    /// A JWK set in a file, instead of a URL (read again at each refresh).
    #[arg(long, env = "FLASHSALE_JWKS_FILE")]
    pub jwks_file: Option<PathBuf>,
    /// The `iss` the provider's tokens must carry (required with a key set).
    #[arg(long, env = "FLASHSALE_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// The `aud` the provider's tokens must carry (required with a key set).
    #[arg(long, env = "FLASHSALE_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// The claim that holds the user id (a positive integer).
    #[arg(long, env = "FLASHSALE_JWT_USER_CLAIM", default_value = "sub")]
    pub jwt_user_claim: String,
    /// Least time between two key set fetches caused by an unknown `kid`, ms.
    #[arg(long, env = "FLASHSALE_JWKS_REFETCH_COOLDOWN_MS",
          default_value_t = millis(IdentityConfig::REFETCH_COOLDOWN))]
    pub jwks_refetch_cooldown_ms: u64,
    /// Refresh of the key set, ms.
    #[arg(long, env = "FLASHSALE_JWKS_REFRESH_MS",
          default_value_t = millis(IdentityConfig::REFRESH_INTERVAL))]
    pub jwks_refresh_ms: u64,
}

impl IdentitySettings {
    /// The provider's settings, `None` when no key set is named. Issuer and audience are
    /// required with one: without them a token the provider made for another service passes.
    pub fn config(&self) -> anyhow::Result<Option<IdentityConfig>> {
        let source = match (&self.jwks_url, &self.jwks_file) {
            (Some(url), _) => JwksSource::Url(url.clone()),
            (None, Some(path)) => JwksSource::File(path.clone()),
            (None, None) => return Ok(None),
        };
        let (Some(issuer), Some(audience)) = (&self.jwt_issuer, &self.jwt_audience) else {
            anyhow::bail!(
                "FLASHSALE_JWKS_URL/FILE needs FLASHSALE_JWT_ISSUER and FLASHSALE_JWT_AUDIENCE"
            );
        };
        let mut c = IdentityConfig::new(source, issuer, audience);
        c.user_claim = self.jwt_user_claim.clone();
        c.refetch_cooldown = Duration::from_millis(self.jwks_refetch_cooldown_ms);
        c.refresh_interval = Duration::from_millis(self.jwks_refresh_ms.max(1_000));
        Ok(Some(c))
    }
}

/// The stream persister's bounds; the defaults are `PersisterSettings::DEFAULT`'s.
#[derive(Debug, Clone, Args)]
pub struct PersisterFlags {
    /// Stream entries per read.
    #[arg(long, env = "FLASHSALE_PERSISTER_BATCH_MAX", default_value_t = P.batch_max,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=65_536))]
    pub persister_batch_max: usize,
    /// How long one read waits for new entries, ms.
    #[arg(long, env = "FLASHSALE_PERSISTER_BLOCK_MS", default_value_t = P.block_ms)]
    pub persister_block_ms: u64,
    /// How long a read that found few entries waits for more before it is applied, ms (0:
    /// never; at most the read wait).
    #[arg(long, env = "FLASHSALE_PERSISTER_FILL_WAIT_MS", default_value_t = P.fill_wait_ms)]
    pub persister_fill_wait_ms: u64,
    /// A sale's lease, ms (more than twice the block time).
    #[arg(long, env = "FLASHSALE_PERSISTER_LEASE_TTL_MS", default_value_t = P.lease_ttl_ms)]
    pub persister_lease_ttl_ms: u64,
    /// Entries pending this long with another consumer are claimed, ms.
    #[arg(long, env = "FLASHSALE_PERSISTER_CLAIM_IDLE_MS", default_value_t = P.claim_idle_ms)]
    pub persister_claim_idle_ms: u64,
    /// Tries of one entry before it is parked as a dead letter.
    #[arg(long, env = "FLASHSALE_PERSISTER_ATTEMPTS_MAX", default_value_t = P.attempts_max)]
    pub persister_attempts_max: u32,
    /// Longest backoff between tries of a failing batch, ms.
    #[arg(long, env = "FLASHSALE_PERSISTER_BACKOFF_MS_MAX", default_value_t = P.backoff_ms_max)]
    pub persister_backoff_ms_max: u64,
    /// Longest wait between tries of a sale stopped on an entry of a newer format, ms.
    #[arg(long, env = "FLASHSALE_PERSISTER_FORMAT_WAIT_MS_MAX",
          default_value_t = P.format_wait_ms_max)]
    pub persister_format_wait_ms_max: u64,
    /// How often the set of sales is read again, ms.
    #[arg(long, env = "FLASHSALE_PERSISTER_DISCOVER_MS",
          default_value_t = millis(P.discover_every))]
    pub persister_discover_ms: u64,
}

/// Queue and draw sales' admission; the defaults are `AdmissionConfig::DEFAULT`'s.
#[derive(Debug, Clone, Args)]
pub struct AdmissionFlags {
    /// How long an admission (and its pass) lasts from its wave, ms (1000..=3600000).
    #[arg(long, env = "FLASHSALE_ADMISSION_PASS_TTL_MS", default_value_t = A.pass_ttl_ms)]
    pub admission_pass_ttl_ms: i64,
    /// Most places one wave of a queue admits.
    #[arg(long, env = "FLASHSALE_ADMISSION_WAVE_MAX", default_value_t = A.wave_max)]
    pub admission_wave_max: u64,
    /// Most buyers one queue holds (a further join: 429 BUSY).
    #[arg(long, env = "FLASHSALE_ADMISSION_QUEUE_MAX", default_value_t = A.queue_max)]
    pub admission_queue_max: u64,
    /// Most entries one draw takes (a further entry: 429 BUSY).
    #[arg(long, env = "FLASHSALE_ADMISSION_ENTRIES_MAX", default_value_t = A.entries_max)]
    pub admission_entries_max: u64,
    /// Least time between two waves of one queue on one instance, ms (10..=10000).
    #[arg(long, env = "FLASHSALE_ADMISSION_TICK_MS", default_value_t = millis(A.tick))]
    pub admission_tick_ms: u64,
    /// Between two walks of the drawn sales' waitlists in the background, ms (10..=60000).
    #[arg(long, env = "FLASHSALE_ADMISSION_WALK_MS", default_value_t = millis(A.walk_every))]
    pub admission_walk_ms: u64,
}

/// The defaults of the admission flags.
const A: AdmissionConfig = AdmissionConfig::DEFAULT;

impl AdmissionFlags {
    /// The admission settings, each checked against its bounds.
    pub fn settings(&self) -> anyhow::Result<AdmissionConfig> {
        let c = AdmissionConfig {
            pass_ttl_ms: self.admission_pass_ttl_ms,
            wave_max: self.admission_wave_max,
            queue_max: self.admission_queue_max,
            entries_max: self.admission_entries_max,
            tick: Duration::from_millis(self.admission_tick_ms),
            walk_every: Duration::from_millis(self.admission_walk_ms),
        };
        c.validate().map_err(anyhow::Error::msg)?;
        Ok(c)
    }
}

/// Order events to the shop's other systems: a sink is on when its URL is set. Every process
/// with a sink configured runs its relay; a lease in the database keeps one delivering.
#[derive(Debug, Clone, Args)]
pub struct EventsFlags {
    /// `nats://…`: publish order events to NATS JetStream.
    #[arg(long, env = "FLASHSALE_EVENTS_NATS_URL")]
    pub events_nats_url: Option<String>,
    /// Subjects are `<this>.<sku>.order.created` and so on.
    #[arg(long, env = "FLASHSALE_EVENTS_NATS_SUBJECT", default_value = NatsSettings::DEFAULT_SUBJECT)]
    pub events_nats_subject: String,
    /// The JetStream stream (subjects `<subject>.>`), created when missing.
    #[arg(long, env = "FLASHSALE_EVENTS_NATS_STREAM", default_value = NatsSettings::DEFAULT_STREAM)]
    pub events_nats_stream: String,
    /// `http(s)://…`: POST each order event there, signed per Standard Webhooks.
    #[arg(long, env = "FLASHSALE_WEBHOOK_URL")]
    pub webhook_url: Option<String>,
    /// `whsec_<base64 of the key>`: the webhook signing secret (required with the URL).
    #[arg(long, env = "FLASHSALE_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<String>,
    /// One webhook request's timeout, ms.
    #[arg(long, env = "FLASHSALE_WEBHOOK_TIMEOUT_MS",
          default_value_t = millis(WebhookSettings::DEFAULT_TIMEOUT))]
    pub webhook_timeout_ms: u64,
    /// Failed tries in a row (each after a backoff) before the endpoint is paused with an alert.
    #[arg(long, env = "FLASHSALE_WEBHOOK_PAUSE_AFTER", default_value_t = WebhookSettings::DEFAULT_PAUSE_AFTER)]
    pub webhook_pause_after: u32,
    /// Whether this process runs the relays of the configured sinks.
    #[arg(long, env = "FLASHSALE_EVENTS_RELAY", default_value_t = true,
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub events_relay: bool,
}

impl EventsFlags {
    pub fn settings(&self) -> anyhow::Result<EventsSettings> {
        let nats = self.events_nats_url.as_ref().map(|url| NatsSettings {
            url: url.clone(),
            subject: self.events_nats_subject.clone(),
            stream: self.events_nats_stream.clone(),
        });
        let webhook = match (&self.webhook_url, &self.webhook_secret) {
            (None, _) => None,
            (Some(_), None) => {
                anyhow::bail!("FLASHSALE_WEBHOOK_URL needs FLASHSALE_WEBHOOK_SECRET")
            }
            (Some(url), Some(secret)) => {
                flashsale_engine::relay::webhook::secret_key(secret)?;
                Some(WebhookSettings {
                    timeout: Duration::from_millis(self.webhook_timeout_ms.max(1)),
                    pause_after: self.webhook_pause_after.max(1),
                    ..WebhookSettings::new(url, secret)
                })
            }
        };
        Ok(EventsSettings {
            run: self.events_relay,
            nats,
            webhook,
            relay: Default::default(),
        })
    }
}

/// The defaults of the persister's flags.
const P: PersisterSettings = PersisterSettings::DEFAULT;

impl PersisterFlags {
    /// The persister's settings; `run`: whether it runs in this process.
    pub fn settings(&self, run: bool) -> anyhow::Result<PersisterSettings> {
        let s = PersisterSettings {
            run,
            batch_max: self.persister_batch_max,
            block_ms: self.persister_block_ms,
            fill_wait_ms: self.persister_fill_wait_ms,
            lease_ttl_ms: self.persister_lease_ttl_ms,
            claim_idle_ms: self.persister_claim_idle_ms,
            attempts_max: self.persister_attempts_max.max(1),
            backoff_ms_max: self.persister_backoff_ms_max,
            format_wait_ms_max: self.persister_format_wait_ms_max,
            discover_every: Duration::from_millis(self.persister_discover_ms.max(10)),
        };
        anyhow::ensure!(
            s.fill_wait_ms <= s.block_ms,
            "FLASHSALE_PERSISTER_FILL_WAIT_MS must be at most FLASHSALE_PERSISTER_BLOCK_MS"
        );
        anyhow::ensure!(
            s.lease_ttl_ms > s.block_ms * 2,
            "FLASHSALE_PERSISTER_LEASE_TTL_MS must be more than twice FLASHSALE_PERSISTER_BLOCK_MS"
        );
        Ok(s)
    }
}

impl Settings {
    /// The engine's settings tree; `run_persister`: whether this process runs the persister.
    pub fn engine(&self, run_persister: bool) -> anyhow::Result<EngineSettings> {
        Ok(EngineSettings {
            ledger: LedgerSettings {
                redis_url: self.redis_url.clone(),
                redis_prefix: self.redis_prefix.clone(),
                replication: self.replication(),
                hot_sales: HotSales {
                    redis_url: self.hot_redis_url.clone(),
                    skus: self.hot_skus.clone(),
                },
                redis_records: self.redis_layout == 2,
            },
            database_url: self.database_url(),
            instance_id: instance_id(),
            persister: self.persister.settings(run_persister)?,
            reconcile: WorkerSettings {
                interval: Duration::from_millis(self.reconcile_interval_ms),
                repair: self.reconcile_repair,
            },
            events: self.events.settings()?,
            admission: self.admission.settings()?,
        })
    }

    /// The WAIT-for-replicas option of the Redis ledger, when asked for.
    pub fn replication(&self) -> Option<flashsale_redis::Replication> {
        (self.redis_wait_replicas > 0).then(|| flashsale_redis::Replication {
            replicas: self.redis_wait_replicas,
            timeout: std::time::Duration::from_millis(self.redis_wait_timeout_ms),
        })
    }
}

/// Gateway protections; the defaults are `GatewayConfig::DEFAULT`'s (and the request
/// timeout `Tunables::DEFAULT`'s), shown by `--help`. Rates are `PER_S` or `PER_S/BURST`,
/// `0` or `off` turns one off.
#[derive(Debug, Clone, Args)]
pub struct GatewaySettings {
    /// Authenticated requests per second of this instance.
    #[arg(long, env = "FLASHSALE_RATE_INSTANCE", default_value_t = G.rate_instance.to_string())]
    pub rate_instance: String,
    /// Purchases per second of one sale on this instance.
    #[arg(long, env = "FLASHSALE_RATE_SALE", default_value_t = G.rate_sale.to_string())]
    pub rate_sale: String,
    /// Authenticated requests per second of one user.
    #[arg(long, env = "FLASHSALE_RATE_USER", default_value_t = G.rate_user.to_string())]
    pub rate_user: String,
    /// Authenticated requests per second of one client IP.
    #[arg(long, env = "FLASHSALE_RATE_IP", default_value_t = G.rate_ip.to_string())]
    pub rate_ip: String,
    /// Apply the per-IP limit to loopback clients too.
    #[arg(long, env = "FLASHSALE_RATE_IP_LOOPBACK", default_value_t = !G.rate_ip_exempt_loopback,
          action = clap::ArgAction::Set)]
    pub rate_ip_loopback: bool,
    /// Client IP from X-Forwarded-For, behind trusted proxies only: `false`, `true` (one
    /// proxy: the rightmost entry) or the number of proxies in the chain.
    #[arg(long, env = "FLASHSALE_TRUST_FORWARDED_FOR", default_value_t = G.forwarded_for_hops,
          value_parser = GatewayConfig::parse_forwarded_for_hops)]
    pub trust_forwarded_for: u32,
    /// Blacklist cache refresh, ms.
    #[arg(long, env = "FLASHSALE_BLACKLIST_REFRESH_MS",
          default_value_t = millis(G.blacklist_refresh))]
    pub blacklist_refresh_ms: u64,
    /// Stream lag (events) past which purchases get 429 BUSY; 0 = off.
    #[arg(long, env = "FLASHSALE_BACKPRESSURE_LAG", default_value_t = G.backpressure_lag)]
    pub backpressure_lag: u64,
    /// Requests queued for one sale past which purchases get 429 BUSY; 0 = off.
    #[arg(long, env = "FLASHSALE_BACKPRESSURE_QUEUE", default_value_t = G.backpressure_queue)]
    pub backpressure_queue: u64,
    /// Pause a sale while back-pressure holds and resume it after.
    #[arg(long, env = "FLASHSALE_BACKPRESSURE_AUTO_PAUSE",
          default_value_t = G.backpressure_auto_pause, action = clap::ArgAction::Set)]
    pub backpressure_auto_pause: bool,
    /// Purchases of one sale in flight on this instance.
    #[arg(long, env = "FLASHSALE_SALE_INFLIGHT_MAX", default_value_t = G.sale_inflight_max)]
    pub sale_inflight_max: usize,
    /// Open client connections.
    #[arg(long, env = "FLASHSALE_CONNECTIONS_MAX", default_value_t = G.connections_max)]
    pub connections_max: usize,
    /// Requests in flight on this instance; past it 503.
    #[arg(long, env = "FLASHSALE_INFLIGHT_MAX", default_value_t = G.inflight_max)]
    pub inflight_max: usize,
    /// Total bytes of request headers.
    #[arg(long, env = "FLASHSALE_HEADER_BYTES_MAX", default_value_t = G.header_bytes_max)]
    pub header_bytes_max: usize,
    /// Request timeout, ms (503 UNAVAILABLE past it).
    #[arg(long, env = "FLASHSALE_REQUEST_TIMEOUT_MS",
          default_value_t = millis(Tunables::DEFAULT.request_timeout))]
    pub request_timeout_ms: u64,
    /// Lifetime of an anti-scalping purchase token, s.
    #[arg(long, env = "FLASHSALE_PURCHASE_TOKEN_TTL_S",
          default_value_t = G.purchase_token_ttl.as_secs())]
    pub purchase_token_ttl_s: u64,
    /// Idempotency-Keys one user may have bound at once (each for 24 h); past it 429.
    #[arg(long, env = "FLASHSALE_IDEMPOTENCY_KEYS_PER_USER",
          default_value_t = G.idempotency_keys_per_user)]
    pub idempotency_keys_per_user: usize,
}

/// The defaults of the gateway's flags.
const G: GatewayConfig = GatewayConfig::DEFAULT;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl GatewaySettings {
    /// Writes the settings over `tunables`.
    pub fn apply(&self, tunables: &mut Tunables) -> anyhow::Result<()> {
        let g = &mut tunables.gateway;
        let rate = |s: &str| TokenRate::parse(s).map_err(anyhow::Error::msg);
        g.rate_instance = rate(&self.rate_instance)?;
        g.rate_sale = rate(&self.rate_sale)?;
        g.rate_user = rate(&self.rate_user)?;
        g.rate_ip = rate(&self.rate_ip)?;
        g.rate_ip_exempt_loopback = !self.rate_ip_loopback;
        g.forwarded_for_hops = self.trust_forwarded_for;
        g.blacklist_refresh = Duration::from_millis(self.blacklist_refresh_ms.max(10));
        g.backpressure_lag = self.backpressure_lag;
        g.backpressure_queue = self.backpressure_queue;
        g.backpressure_auto_pause = self.backpressure_auto_pause;
        g.sale_inflight_max = self.sale_inflight_max.max(1);
        g.connections_max = self.connections_max.max(1);
        g.inflight_max = self.inflight_max.max(1);
        g.header_bytes_max = self.header_bytes_max;
        g.purchase_token_ttl = Duration::from_secs(self.purchase_token_ttl_s.max(1));
        g.idempotency_keys_per_user = self.idempotency_keys_per_user.max(1);
        tunables.request_timeout = Duration::from_millis(self.request_timeout_ms.max(1));
        Ok(())
    }
}

/// The shop's risk service in the purchase path; the defaults are `RiskConfig::DEFAULT`'s.
#[derive(Debug, Clone, Args)]
pub struct RiskSettings {
    /// The shop's risk service (`POST` JSON per purchase); unset = no risk check.
    #[arg(long, env = "FLASHSALE_RISK_URL")]
    pub risk_url: Option<String>,
    /// One risk check, connecting included, ms; past it the fallback rule decides.
    #[arg(long, env = "FLASHSALE_RISK_TIMEOUT_MS", default_value_t = millis(R.timeout),
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub risk_timeout_ms: u64,
    /// Risk checks in flight on this instance; past it the fallback rule decides.
    #[arg(long, env = "FLASHSALE_RISK_INFLIGHT_MAX", default_value_t = R.inflight_max)]
    pub risk_inflight_max: usize,
    /// Who buys while the risk service gives no answer: allow, deny or allowlist.
    #[arg(long, env = "FLASHSALE_RISK_FALLBACK", default_value_t = R.fallback.to_string(),
          value_parser = ["allow", "deny", "allowlist"])]
    pub risk_fallback: String,
    /// Consecutive risk timeouts or errors that open its breaker.
    #[arg(long, env = "FLASHSALE_RISK_BREAKER_FAILURES", default_value_t = R.breaker_failures)]
    pub risk_breaker_failures: u32,
    /// How long the risk breaker stays open before one probe, ms.
    #[arg(long, env = "FLASHSALE_RISK_BREAKER_OPEN_MS", default_value_t = millis(R.breaker_open))]
    pub risk_breaker_open_ms: u64,
}

/// The defaults of the risk check's flags.
const R: RiskConfig = RiskConfig::DEFAULT;

impl RiskSettings {
    /// Writes the settings over `tunables`.
    pub fn apply(&self, tunables: &mut Tunables) -> anyhow::Result<()> {
        let r = &mut tunables.risk;
        r.url = self.risk_url.clone().filter(|u| !u.trim().is_empty());
        r.timeout = Duration::from_millis(self.risk_timeout_ms);
        r.inflight_max = self.risk_inflight_max.max(1);
        r.fallback = Fallback::parse(&self.risk_fallback).map_err(anyhow::Error::msg)?;
        r.breaker_failures = self.risk_breaker_failures.max(1);
        r.breaker_open = Duration::from_millis(self.risk_breaker_open_ms.max(1));
        RiskCheck::validate(r).map_err(anyhow::Error::msg)
    }
}

/// Loads the config file into the environment without overriding what is already set.
pub fn load_config_file(path: Option<&Path>) -> anyhow::Result<()> {
    match path {
        Some(p) => {
            dotenvy::from_path(p).with_context(|| format!("read config file {}", p.display()))?;
        }
        None => {
            let default = Path::new("flashsale.env");
            if default.exists() {
                dotenvy::from_path(default).context("read ./flashsale.env")?;
            }
        }
    }
    Ok(())
}

impl Settings {
    pub fn database_url(&self) -> String {
        self.database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}/flashsale.db", self.data_dir.display()))
    }

    /// The JWT secret and admin token, made and written to the data dir when not configured.
    /// A configured one that is empty is refused: an empty HS256 key would sign tokens that
    /// anyone can forge.
    pub fn secrets(&self) -> anyhow::Result<(String, String)> {
        let jwt = crate::secrets::secret(
            &self.jwt_secret,
            &self.data_dir,
            "jwt_secret",
            "FLASHSALE_JWT_SECRET",
        )?;
        let admin = crate::secrets::secret(
            &self.admin_token,
            &self.data_dir,
            "admin_token",
            "FLASHSALE_ADMIN_TOKEN",
        )?;
        Ok((jwt, admin))
    }
}

/// Names this process as a stream consumer and lease owner.
fn instance_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".into());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        identity: IdentitySettings,
        #[command(flatten)]
        persister: PersisterFlags,
        #[command(flatten)]
        admission: AdmissionFlags,
    }

    fn admission(args: &[&str]) -> anyhow::Result<AdmissionConfig> {
        let mut argv = vec!["flashsale"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)?.admission.settings()
    }

    #[test]
    fn admission_takes_its_defaults_and_refuses_settings_out_of_bounds() {
        assert_eq!(admission(&[]).unwrap(), AdmissionConfig::DEFAULT);
        let set = admission(&[
            "--admission-pass-ttl-ms",
            "30000",
            "--admission-queue-max",
            "500",
            "--admission-entries-max",
            "700",
            "--admission-walk-ms",
            "100",
        ])
        .unwrap();
        assert_eq!(
            (
                set.pass_ttl_ms,
                set.queue_max,
                set.entries_max,
                set.walk_every
            ),
            (30_000, 500, 700, Duration::from_millis(100))
        );
        for bad in [
            ["--admission-pass-ttl-ms", "999"],
            ["--admission-pass-ttl-ms=-5", "--admission-wave-max=5"],
            ["--admission-wave-max", "0"],
            ["--admission-queue-max", "0"],
            ["--admission-entries-max", "1000001"],
            ["--admission-tick-ms", "5"],
            ["--admission-walk-ms", "60001"],
        ] {
            let err = admission(&bad).unwrap_err().to_string();
            assert!(err.contains("FLASHSALE_ADMISSION_"), "{bad:?}: {err}");
        }
    }

    fn persister(args: &[&str]) -> anyhow::Result<PersisterSettings> {
        let mut argv = vec!["flashsale"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)?.persister.settings(true)
    }

    #[test]
    fn the_persister_takes_todays_defaults_and_refuses_a_lease_or_a_fill_out_of_a_reads_bounds() {
        assert_eq!(persister(&[]).unwrap(), PersisterSettings::DEFAULT);
        let set = persister(&[
            "--persister-batch-max",
            "64",
            "--persister-discover-ms",
            "50",
            "--persister-fill-wait-ms",
            "0",
        ]);
        let set = set.unwrap();
        assert_eq!(
            (set.batch_max, set.discover_every, set.fill_wait_ms),
            (64, Duration::from_millis(50), 0)
        );
        assert!(persister(&["--persister-batch-max", "0"]).is_err());
        let short = [
            "--persister-block-ms",
            "500",
            "--persister-lease-ttl-ms",
            "1000",
        ];
        assert!(persister(&short).is_err());
        let fill = [
            "--persister-block-ms",
            "50",
            "--persister-fill-wait-ms",
            "51",
        ];
        let err = persister(&fill).unwrap_err().to_string();
        assert!(err.contains("FLASHSALE_PERSISTER_FILL_WAIT_MS"), "{err}");
    }

    fn identity(args: &[&str]) -> anyhow::Result<Option<IdentityConfig>> {
        let mut argv = vec!["flashsale"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)?.identity.config()
    }

    #[test]
    fn a_key_set_needs_issuer_and_audience() {
        assert!(
            identity(&[]).unwrap().is_none(),
            "off unless a key set is named"
        );
        let url = ["--jwks-url", "https://idp/jwks.json"];
        assert!(identity(&url).is_err());
        assert!(identity(&[&url[..], &["--jwt-issuer", "i"]].concat()).is_err());
        let full = [&url[..], &["--jwt-issuer", "i", "--jwt-audience", "a"]].concat();
        let c = identity(&full).unwrap().unwrap();
        assert_eq!(c.source, JwksSource::Url("https://idp/jwks.json".into()));
        assert_eq!((c.issuer.as_str(), c.audience.as_str()), ("i", "a"));
        assert_eq!(c.user_claim, "sub");
        let both = [&full[..], &["--jwks-file", "/k.json"]].concat();
        assert!(identity(&both).is_err(), "a URL or a file, not both");
    }
}
