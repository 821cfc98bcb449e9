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
