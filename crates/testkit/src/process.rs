//! A long-running child process that a test kills with SIGKILL and starts again with the same
//! command line, its output appended to a log file; killed on drop, also when the test panics.

use std::fs::OpenOptions;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A restartable child: program, arguments, environment and working directory are fixed at
/// creation so that every start is the same process again.
pub struct Proc {
    pub name: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Proc {
    /// `dir` is the working directory (so no stray config file of the caller's is read) and
    /// holds `<name>.log`. The environment is exactly `env`: nothing leaks in from the
    /// caller's shell.
    pub fn new(
        name: &str,
        program: impl Into<PathBuf>,
        args: &[&str],
        env: Vec<(String, String)>,
        dir: &Path,
    ) -> Proc {
        Proc {
            name: name.to_owned(),
            program: program.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env,
            dir: dir.to_path_buf(),
            log: dir.join(format!("{name}.log")),
            child: None,
            starts: 0,
        }
    }

    /// Starts the process (again). Panics when it cannot be spawned.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "{} already running", self.name);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the process log");
        let err = log.try_clone().expect("clone the log handle");
        let child = Command::new(&self.program)
            .args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.name));
        self.child = Some(child);
        self.starts += 1;
    }

    /// SIGKILL and reap: no shutdown hook runs.
    pub fn kill(&mut self) {
        kill(&mut self.child);
    }

    /// SIGTERM, as an operator stops an instance (its shutdown hooks run: leases given up,
    /// in-flight work finished), then reaped; SIGKILL after `limit` if it has not exited.
    pub async fn terminate(&mut self, limit: Duration) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        let pid = child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(sent.is_ok_and(|s| s.success()), "SIGTERM to {}", self.name);
        let exited = crate::wait::within(limit, || {
            let done = child.try_wait().ok().flatten().is_some();
            async move { done.then_some(()) }
        })
        .await;
        if exited.is_none() {
            eprintln!(
                "{} did not stop within {limit:?} of SIGTERM: killed",
                self.name
            );
        }
        kill(&mut self.child);
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the process exited by itself (a crash), without reaping a live one.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// How many times it was started.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// The last `lines` lines of its log (for a failure message).
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// SIGKILL and reap the child in `slot`, if any.
pub(crate) fn kill(slot: &mut Option<Child>) {
    if let Some(mut child) = slot.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Sends signal `name` (`STOP`, `CONT`) to the running server in `slot`: a frozen server keeps
/// its connections and reads nothing until it is sent `CONT`.
pub(crate) fn signal(slot: &Option<Child>, name: &str) {
    let child = slot.as_ref().expect("running");
    let status = Command::new("kill")
        .args([format!("-{name}"), child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {}", child.id());
}

/// A throwaway server's controls over the child in its `child` field, for a type whose `start`
/// spawns it: `kill` (SIGKILL and reap), `pause` (SIGSTOP: it keeps its connections and reads
/// nothing, so what clients send waits in its socket buffers) until `resume` (SIGCONT),
/// `is_running`; and a kill on drop, also when the test panics.
macro_rules! server_controls {
    ($server:ty) => {
        impl $server {
            /// SIGKILL and reap: no shutdown of its own runs.
            pub fn kill(&mut self) {
                $crate::process::kill(&mut self.child);
            }

            /// SIGSTOP: connections held, nothing read or answered until `resume`.
            pub fn pause(&self) {
                $crate::process::signal(&self.child, "STOP");
            }

            /// SIGCONT after `pause`.
            pub fn resume(&self) {
                $crate::process::signal(&self.child, "CONT");
            }

            pub fn is_running(&self) -> bool {
                self.child.is_some()
            }
        }

        impl Drop for $server {
            fn drop(&mut self) {
                self.kill();
            }
        }
    };
}
pub(crate) use server_controls;

/// Spawns a throwaway server's `cmd` (`name` in the panic when it cannot be) with its output
/// discarded, into `slot` (so that its owner's drop kills it, also when the wait panics), then
/// polls `up(url)` until it holds, or panics after `limit` naming `waiting_for`.
pub(crate) async fn spawn_server<F, Fut>(
    slot: &mut Option<Child>,
    cmd: &mut Command,
    name: &str,
    (waiting_for, limit): (&str, Duration),
    url: String,
    up: F,
) where
    F: Fn(String) -> Fut,
    Fut: Future<Output = bool>,
{
    assert!(slot.is_none(), "already running");
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
    *slot = Some(child);
    crate::wait::until(waiting_for, limit, || {
        let answered = up(url.clone());
        async move { answered.await.then_some(()) }
    })
    .await;
}

/// `var` from the environment, else `default`: where a test finds a server or a binary.
pub(crate) fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.into())
}
