//! Settings: a flag, else an environment variable, else a line `NAME=value` of the config file
//! (`--config`, default `./flashsale.env` when present), else the default. Secrets never come
//! from code: from the environment, the config file, or files in the data dir made on first use.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use rand::distr::{Alphanumeric, SampleString};

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
    /// Key prefix in Redis.
    #[arg(long, env = "FLASHSALE_REDIS_PREFIX", default_value = "fs")]
    pub redis_prefix: String,
    /// `mysql://…` or `sqlite://…`; default `sqlite://<data dir>/flashsale.db`.
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
    #[arg(long, env = "FLASHSALE_RECONCILE_INTERVAL_MS", default_value_t = 5_000)]
    pub reconcile_interval_ms: u64,
    /// Whether the reconciler worker repairs (replay, rebuild, expire) or only reports.
    #[arg(long, env = "FLASHSALE_RECONCILE_REPAIR", default_value = "true",
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub reconcile_repair: bool,
    #[command(flatten)]
    pub gateway: GatewaySettings,
}

impl Settings {
    /// The WAIT-for-replicas option of the Redis ledger, when asked for.
    pub fn replication(&self) -> Option<flashsale_redis::Replication> {
        (self.redis_wait_replicas > 0).then(|| flashsale_redis::Replication {
            replicas: self.redis_wait_replicas,
            timeout: std::time::Duration::from_millis(self.redis_wait_timeout_ms),
        })
    }
}

/// Gateway protections; unset → the defaults of `GatewayConfig`. Rates are
/// `PER_S` or `PER_S/BURST`, `0` or `off` turns one off.
#[derive(Debug, Clone, Default, Args)]
pub struct GatewaySettings {
    /// Authenticated requests per second of this instance [default 200000/200000].
    #[arg(long, env = "FLASHSALE_RATE_INSTANCE")]
    pub rate_instance: Option<String>,
    /// Purchases per second of one sale on this instance [default 100000/100000].
    #[arg(long, env = "FLASHSALE_RATE_SALE")]
    pub rate_sale: Option<String>,
    /// Authenticated requests per second of one user [default 100/200].
    #[arg(long, env = "FLASHSALE_RATE_USER")]
    pub rate_user: Option<String>,
    /// Authenticated requests per second of one client IP [default 2000/4000].
    #[arg(long, env = "FLASHSALE_RATE_IP")]
    pub rate_ip: Option<String>,
    /// Apply the per-IP limit to loopback clients too [default false].
    #[arg(long, env = "FLASHSALE_RATE_IP_LOOPBACK")]
    pub rate_ip_loopback: Option<bool>,
    /// Client IP from X-Forwarded-For (only behind a trusted proxy) [default false].
    #[arg(long, env = "FLASHSALE_TRUST_FORWARDED_FOR")]
    pub trust_forwarded_for: Option<bool>,
    /// Blacklist cache refresh, ms [default 500].
    #[arg(long, env = "FLASHSALE_BLACKLIST_REFRESH_MS")]
    pub blacklist_refresh_ms: Option<u64>,
    /// Stream lag (events) past which purchases get 429 BUSY; 0 = off [default 100000].
    #[arg(long, env = "FLASHSALE_BACKPRESSURE_LAG")]
    pub backpressure_lag: Option<u64>,
    /// Requests queued for one sale past which purchases get 429 BUSY; 0 = off [default 4096].
    #[arg(long, env = "FLASHSALE_BACKPRESSURE_QUEUE")]
    pub backpressure_queue: Option<u64>,
    /// Pause a sale while back-pressure holds and resume it after [default false].
    #[arg(long, env = "FLASHSALE_BACKPRESSURE_AUTO_PAUSE")]
    pub backpressure_auto_pause: Option<bool>,
    /// Purchases of one sale in flight on this instance [default 4096].
    #[arg(long, env = "FLASHSALE_SALE_INFLIGHT_MAX")]
    pub sale_inflight_max: Option<usize>,
    /// Open client connections [default 10000].
    #[arg(long, env = "FLASHSALE_CONNECTIONS_MAX")]
    pub connections_max: Option<usize>,
    /// Requests in flight on this instance; past it 503 [default 20000].
    #[arg(long, env = "FLASHSALE_INFLIGHT_MAX")]
    pub inflight_max: Option<usize>,
    /// Total bytes of request headers [default 16384].
    #[arg(long, env = "FLASHSALE_HEADER_BYTES_MAX")]
    pub header_bytes_max: Option<usize>,
    /// Request timeout, ms (503 UNAVAILABLE past it) [default 10000].
    #[arg(long, env = "FLASHSALE_REQUEST_TIMEOUT_MS")]
    pub request_timeout_ms: Option<u64>,
    /// Lifetime of an anti-scalping purchase token, s [default 60].
    #[arg(long, env = "FLASHSALE_PURCHASE_TOKEN_TTL_S")]
    pub purchase_token_ttl_s: Option<u64>,
    /// A dedicated Redis for the hot sales named by FLASHSALE_HOT_SKUS.
    #[arg(long, env = "FLASHSALE_HOT_REDIS_URL")]
    pub hot_redis_url: Option<String>,
    /// Skus routed to the hot Redis, comma list.
    #[arg(long, env = "FLASHSALE_HOT_SKUS", value_delimiter = ',')]
    pub hot_skus: Vec<u64>,
}

impl GatewaySettings {
    /// Writes the settings that are set over `limits`.
    pub fn apply(&self, limits: &mut flashsale_server::Limits) -> anyhow::Result<()> {
        use flashsale_server::gateway::Rate;
        use std::time::Duration;
        let g = &mut limits.gateway;
        let rate = |s: &Option<String>, into: &mut Rate| -> anyhow::Result<()> {
            if let Some(s) = s {
                *into = Rate::parse(s).map_err(anyhow::Error::msg)?;
            }
            Ok(())
        };
        rate(&self.rate_instance, &mut g.rate_instance)?;
        rate(&self.rate_sale, &mut g.rate_sale)?;
        rate(&self.rate_user, &mut g.rate_user)?;
        rate(&self.rate_ip, &mut g.rate_ip)?;
        if let Some(v) = self.rate_ip_loopback {
            g.rate_ip_exempt_loopback = !v;
        }
        if let Some(v) = self.trust_forwarded_for {
            g.trust_forwarded_for = v;
        }
        if let Some(v) = self.blacklist_refresh_ms {
            g.blacklist_refresh = Duration::from_millis(v.max(10));
        }
        if let Some(v) = self.backpressure_lag {
            g.backpressure_lag = v;
        }
        if let Some(v) = self.backpressure_queue {
            g.backpressure_queue = v;
        }
        if let Some(v) = self.backpressure_auto_pause {
            g.backpressure_auto_pause = v;
        }
        if let Some(v) = self.sale_inflight_max {
            g.sale_inflight_max = v.max(1);
        }
        if let Some(v) = self.connections_max {
            g.connections_max = v.max(1);
        }
        if let Some(v) = self.inflight_max {
            g.inflight_max = v.max(1);
        }
        if let Some(v) = self.header_bytes_max {
            g.header_bytes_max = v;
        }
        if let Some(v) = self.purchase_token_ttl_s {
            g.purchase_token_ttl = Duration::from_secs(v.max(1));
        }
        if self.hot_redis_url.is_some() {
            g.hot_redis_url = self.hot_redis_url.clone();
        }
        if !self.hot_skus.is_empty() {
            g.hot_skus = self.hot_skus.clone();
        }
        if let Some(v) = self.request_timeout_ms {
            limits.request_timeout = Duration::from_millis(v.max(1));
        }
        Ok(())
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
    pub fn secrets(&self) -> anyhow::Result<(String, String)> {
        let jwt = match &self.jwt_secret {
            Some(s) => s.clone(),
            None => secret_file(&self.data_dir, "jwt_secret", "FLASHSALE_JWT_SECRET")?,
        };
        let admin = match &self.admin_token {
            Some(s) => s.clone(),
            None => secret_file(&self.data_dir, "admin_token", "FLASHSALE_ADMIN_TOKEN")?,
        };
        Ok((jwt, admin))
    }
}

fn secret_file(dir: &Path, name: &str, var: &str) -> anyhow::Result<String> {
    let path = dir.join(name);
    if let Ok(existing) = std::fs::read_to_string(&path) {
        return Ok(existing.trim().to_owned());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let secret = Alphanumeric.sample_string(&mut rand::rng(), 40);
    write_private(&path, &secret)?;
    eprintln!(
        "{var} not set: made one and wrote it to {} (shown once): {secret}",
        path.display()
    );
    Ok(secret)
}

fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    options.mode(0o600);
    let mut file = options
        .open(path)
        .with_context(|| format!("write {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}
