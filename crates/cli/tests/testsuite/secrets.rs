//! Secrets at start: an empty `FLASHSALE_JWT_SECRET` is refused with an error that names it
//! (never a panic), and a secret file a crash left empty or zero-filled is made again, whole.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use flashsale_core::UserId;
use flashsale_server::auth::Auth;

/// How long one run may take: `serve` started with a bad secret must exit, not serve.
const RUN_LIMIT: Duration = Duration::from_secs(30);

/// `flashsale <args>` on the embedded default in `dir`, secrets from the environment removed;
/// killed past `RUN_LIMIT` (its status then has no code).
fn flashsale(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_flashsale"))
        .args(args)
        .current_dir(dir)
        .env("FLASHSALE_DATA_DIR", dir)
        .env("FLASHSALE_LISTEN", "127.0.0.1:0")
        .env_remove("FLASHSALE_JWT_SECRET")
        .env_remove("FLASHSALE_ADMIN_TOKEN")
        .env_remove("FLASHSALE_REDIS_URL")
        .env_remove("FLASHSALE_DATABASE_URL")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run flashsale");
    let deadline = Instant::now() + RUN_LIMIT;
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn an_empty_secret_in_the_environment_is_refused_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    for (var, value) in [
        ("FLASHSALE_JWT_SECRET", ""),
        ("FLASHSALE_ADMIN_TOKEN", "  "),
    ] {
        for args in [&["token", "--user", "7"][..], &["serve"][..]] {
            let out = flashsale(dir.path(), args, &[(var, value)]);
            let err = stderr(&out);
            assert_eq!(
                out.status.code(),
                Some(1),
                "{args:?} with {var} empty: {err}"
            );
            assert!(!err.contains("panicked"), "{args:?}: {err}");
            assert!(err.contains(var), "the error names {var}: {err}");
        }
    }
}

/// A secret file as a crash between its creation and its write leaves it (empty), or as a
/// power loss may (its blocks zero-filled), is made again; tokens then verify with it.
#[test]
fn a_broken_secret_file_is_made_again() {
    for broken in [&b""[..], b"\n", b"\0\0\0\0\0\0\0\0"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwt_secret");
        std::fs::write(&path, broken).unwrap();
        let out = flashsale(dir.path(), &["token", "--user", "7"], &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{broken:?}: {err}");
        let secret = std::fs::read_to_string(&path).unwrap();
        assert!(secret.trim().len() >= 32, "a whole secret: {secret:?}");
        let admin = std::fs::read_to_string(dir.path().join("admin_token")).unwrap();
        let token = String::from_utf8(out.stdout).unwrap();
        let auth = Auth::new(secret.trim(), admin.trim());
        assert_eq!(auth.verify_user(token.trim()).unwrap(), UserId(7));
        // The next start keeps it.
        let again = flashsale(dir.path(), &["token", "--user", "8"], &[]);
        assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), secret);
        assert_only_secrets_left(dir.path());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "readable by its owner only");
        }
    }
}

fn assert_only_secrets_left(dir: &Path) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["admin_token", "jwt_secret"]);
}
