//! The service's secrets (the JWT secret, the admin token) when none is configured: made on
//! first use and kept in a file of the data dir, written whole or not at all, readable by
//! its owner only, and made again when a crash left it empty or damaged.

use std::path::Path;

use anyhow::Context;
use rand::distr::{Alphanumeric, SampleString};

/// `configured` (refused when empty), else the secret in `dir/name`, made when missing;
/// `var` names the setting in messages.
pub fn secret(
    configured: &Option<String>,
    dir: &Path,
    name: &str,
    var: &str,
) -> anyhow::Result<String> {
    match configured {
        Some(s) if s.trim().is_empty() => anyhow::bail!(
            "{var} is set but empty: set it to a secret, or unset it to use (or make) {}",
            dir.join(name).display()
        ),
        Some(s) => Ok(s.clone()),
        None => secret_file(dir, name, var),
    }
}

/// Length of a secret we make (alphanumeric: about 238 bits).
const SECRET_LEN: usize = 40;

/// The secret in `dir/name`, made when missing. A file a crash left behind is made again:
/// empty (the crash came between creating and writing it, as older versions did) or with
/// NUL or control bytes (blocks a power loss left zero-filled). What an operator wrote there
/// is kept, so a hand-made secret survives.
fn secret_file(dir: &Path, name: &str, var: &str) -> anyhow::Result<String> {
    let path = dir.join(name);
    match std::fs::read(&path) {
        Ok(bytes) => match usable_secret(&bytes) {
            Some(existing) => Ok(existing),
            None => {
                tracing::warn!(path = %path.display(), "secret file is empty or damaged: making a new one");
                make_secret(dir, name, var, Placement::Replace)
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
            make_secret(dir, name, var, Placement::New)
        }
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

fn usable_secret(bytes: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?.trim();
    let clean = !text.is_empty() && !text.chars().any(char::is_control);
    clean.then(|| text.to_owned())
}

/// Where a made secret goes: a new file (another process may make one at the same time), or
/// over a damaged one (processes that repair one file at the same moment each print a
/// secret and the last rename wins: start one of them first).
#[derive(Clone, Copy, PartialEq)]
enum Placement {
    New,
    Replace,
}

/// Writes a new secret whole or not at all: to a temp file in the same dir, synced, then
/// linked (new: fails if another process got there first, whose secret is then used) or
/// renamed (replace) into place, and the dir synced so the name survives a crash.
fn make_secret(dir: &Path, name: &str, var: &str, placement: Placement) -> anyhow::Result<String> {
    let (path, secret) = (
        dir.join(name),
        Alphanumeric.sample_string(&mut rand::rng(), SECRET_LEN),
    );
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    write_private(&tmp, &secret)?;
    let placed = match placement {
        Placement::New => std::fs::hard_link(&tmp, &path),
        Placement::Replace => std::fs::rename(&tmp, &path),
    };
    let _ = std::fs::remove_file(&tmp);
    match placed {
        Ok(()) => sync_dir(dir)?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return secret_file(dir, name, var)
        }
        Err(e) => return Err(e).with_context(|| format!("write {}", path.display())),
    }
    eprintln!(
        "{var} not set: made one and wrote it to {} (shown once): {secret}",
        path.display()
    );
    Ok(secret)
}

/// A file of `contents` readable by its owner only, on disk before this returns.
fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    options.mode(0o600);
    let mut file = options
        .open(path)
        .with_context(|| format!("write {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
        .with_context(|| format!("sync {}", path.display()))?;
    Ok(())
}

/// Makes a rename or link in `dir` durable (a no-op where directories cannot be opened).
fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("sync {}", dir.display()))?;
    Ok(())
}
