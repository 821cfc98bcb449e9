//! CPU time per process from `/proc/<pid>/stat` (utime + stime), so a bench can print what each
//! process of the path (the `flashsale` process itself, `redis-server`, `mariadbd`) spent per
//! answer, in microseconds, beside the answers per second.
//!
//! Processes are found by name (`/proc/<pid>/comm`). When several share a name (a test's
//! throwaway server beside the machine's), the one whose command line names the wanted port
//! is taken, else the oldest (the machine's service, started first).
//!
//! PostgreSQL forks a process per connection, so it is watched as a group: every `postgres`
//! process whose command line holds a text (a backend's title names its database), found
//! anew at each sample and summed. A process that starts during a phase counts from zero; one
//! that ends during it is not counted (a connection pool keeps its backends).

use std::collections::HashMap;
use std::fs;

/// Linux reports `utime`/`stime` in clock ticks of `USER_HZ`, 100 on every mainstream
/// architecture (`getconf CLK_TCK`).
const TICKS_PER_S: f64 = 100.0;

/// One process, or a group of processes, to watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    /// The label printed (`flashsale`, `redis-server`, `mariadbd`, `postgres`).
    pub label: String,
    pub pid: u32,
    /// Instead of `pid`: every process named `.0` whose command line holds `.1`.
    pub group: Option<(String, String)>,
}

impl Watched {
    pub fn one(label: &str, pid: u32) -> Watched {
        Watched {
            label: label.into(),
            pid,
            group: None,
        }
    }

    /// The PostgreSQL backends serving database `db` (`postgres: … <user> <db> <client> …`).
    pub fn postgres_backends(db: &str) -> Watched {
        Watched::group("postgres", "postgres", &format!(" {db} "))
    }

    /// Every process named `comm` whose command line holds `needle` (empty: every one).
    pub fn group(label: &str, comm: &str, needle: &str) -> Watched {
        Watched {
            label: label.into(),
            pid: 0,
            group: Some((comm.into(), needle.into())),
        }
    }
}

/// Fields of `/proc/<pid>/stat` after the command name: (utime + stime in ticks, start time).
fn stat_of(pid: &str) -> Option<(u64, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: split after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime 15, starttime 22.
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some((field(14)? + field(15)?, field(22)?))
}

/// CPU seconds (user + system) a process has used so far; None when it is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    stat_of(&pid.to_string()).map(|(ticks, _)| ticks as f64 / TICKS_PER_S)
}

/// The process named `comm`, preferring one whose command line holds `port` (as `:port`,
/// ` port` or `--port=port`), else the oldest.
pub fn find(comm: &str, port: Option<u16>) -> Option<u32> {
    let mut found: Vec<(u32, u64, bool)> = named(comm)
        .into_iter()
        .map(|(pid, ticks_start, cmdline)| {
            let names_port = port.is_some_and(|p| {
                [format!(":{p}"), format!("--port={p}"), format!(" {p} ")]
                    .iter()
                    .any(|needle| cmdline.contains(needle.as_str()))
            });
            (pid, ticks_start.1, names_port)
        })
        .collect();
    found.sort_by_key(|&(_, start, names_port)| (!names_port, start));
    found.first().map(|&(pid, _, _)| pid)
}

/// The processes named `comm`: pid, (CPU ticks, start time), command line (NULs as spaces,
/// one space after).
fn named(comm: &str) -> Vec<(u32, (u64, u64), String)> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(c) = fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        if c.trim_end() != comm {
            continue;
        }
        let Some(stat) = stat_of(&pid.to_string()) else {
            continue;
        };
        let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        out.push((pid, stat, format!("{cmdline} ")));
    }
    out
}

/// CPU seconds of each process of a group, by pid.
fn group_seconds(comm: &str, needle: &str) -> HashMap<u32, f64> {
    named(comm)
        .into_iter()
        .filter(|(_, _, cmdline)| cmdline.contains(needle))
        .map(|(pid, (ticks, _), _)| (pid, ticks as f64 / TICKS_PER_S))
        .collect()
}

/// The processes of a purchase path on this machine: this process as `flashsale`, and
/// `redis-server` / `mariadbd` when they run.
pub fn path_processes(redis_port: Option<u16>, mysql_port: Option<u16>) -> Vec<Watched> {
    let mut out = vec![Watched::one("flashsale", std::process::id())];
    if let Some(pid) = find("redis-server", redis_port.or(Some(6379))) {
        out.push(Watched::one("redis-server", pid));
    }
    let mariadb = find("mariadbd", mysql_port.or(Some(3306)))
        .or_else(|| find("mysqld", mysql_port.or(Some(3306))));
    if let Some(pid) = mariadb {
        out.push(Watched::one("mariadbd", pid));
    }
    out
}

/// The CPU seconds of each watched process (or group) at one moment.
#[derive(Debug, Clone)]
pub struct Sample {
    seconds: Vec<Reading>,
}

#[derive(Debug, Clone)]
enum Reading {
    One(Option<f64>),
    Group(HashMap<u32, f64>),
}

impl Reading {
    /// CPU seconds spent from `before` to `self`; None when the process went away.
    fn since(&self, before: &Reading) -> Option<f64> {
        match (before, self) {
            (Reading::One(Some(b)), Reading::One(Some(a))) => Some(a - b),
            (Reading::Group(b), Reading::Group(a)) => Some(
                a.iter()
                    .map(|(pid, s)| s - b.get(pid).copied().unwrap_or(0.0))
                    .sum(),
            ),
            _ => None,
        }
    }
}

/// CPU µs per answer of each watched process over a phase.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PhaseCpu {
    /// `(label, µs per answer)`; None when the process went away during the phase.
    pub per_answer_us: Vec<(String, Option<f64>)>,
    /// Cores busy on average (CPU seconds / wall seconds) per process.
    pub cores: Vec<(String, Option<f64>)>,
}

/// Samples the CPU of a fixed set of processes.
#[derive(Debug, Clone)]
pub struct Meter {
    pub watched: Vec<Watched>,
}

impl Meter {
    pub fn new(watched: Vec<Watched>) -> Meter {
        Meter { watched }
    }

    pub fn sample(&self) -> Sample {
        let read = |w: &Watched| match &w.group {
            Some((comm, needle)) => Reading::Group(group_seconds(comm, needle)),
            None => Reading::One(cpu_seconds(w.pid)),
        };
        Sample {
            seconds: self.watched.iter().map(read).collect(),
        }
    }

    /// What each process spent between `before` and `after`, per answer (`answers` of them,
    /// over `wall_s` seconds).
    pub fn phase(&self, before: &Sample, after: &Sample, answers: u64, wall_s: f64) -> PhaseCpu {
        let mut per_answer_us = Vec::new();
        let mut cores = Vec::new();
        for (i, w) in self.watched.iter().enumerate() {
            let spent = after.seconds[i].since(&before.seconds[i]);
            per_answer_us.push((
                w.label.clone(),
                spent.map(|s| s * 1e6 / answers.max(1) as f64),
            ));
            cores.push((w.label.clone(), spent.map(|s| s / wall_s.max(1e-9))));
        }
        PhaseCpu {
            per_answer_us,
            cores,
        }
    }
}

impl PhaseCpu {
    /// µs per answer of the process labelled `label`.
    pub fn us(&self, label: &str) -> Option<f64> {
        self.per_answer_us
            .iter()
            .find(|(l, _)| l == label)
            .and_then(|(_, v)| *v)
    }

    /// `flashsale 12.3 · redis-server 4.5 · mariadbd 6.7` (µs per answer; `-` when unknown).
    pub fn line(&self) -> String {
        self.per_answer_us
            .iter()
            .map(|(l, v)| match v {
                Some(us) => format!("{l} {us:.1}"),
                None => format!("{l} -"),
            })
            .collect::<Vec<_>>()
            .join(" · ")
    }
}

/// The machine's load average over the last minute (`/proc/loadavg`), printed with a
/// measurement because other work on the same cores skews it.
pub fn load_average() -> Option<f64> {
    fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_found_and_spends_cpu() {
        let me = std::process::id();
        let before = cpu_seconds(me).expect("own stat");
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 50 {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = cpu_seconds(me).expect("own stat");
        assert!(after >= before);
        let comm = fs::read_to_string("/proc/self/comm").unwrap();
        assert!(find(comm.trim_end(), None).is_some());
        assert!(find("no-such-process-name", None).is_none());
    }

    #[test]
    fn a_phase_divides_by_answers() {
        let meter = Meter::new(vec![Watched::one("x", 1)]);
        let before = Sample {
            seconds: vec![Reading::One(Some(1.0))],
        };
        let after = Sample {
            seconds: vec![Reading::One(Some(1.5))],
        };
        let p = meter.phase(&before, &after, 1_000, 2.0);
        assert!((p.us("x").unwrap() - 500.0).abs() < 1e-9);
        assert_eq!(p.line(), "x 500.0");
        assert!(load_average().is_some());
    }

    #[test]
    fn a_group_sums_its_processes_and_counts_newcomers_from_zero() {
        let before = Reading::Group(HashMap::from([(1, 1.0), (2, 5.0)]));
        let after = Reading::Group(HashMap::from([(1, 1.5), (3, 0.25)]));
        assert_eq!(after.since(&before), Some(0.75));
        let comm = fs::read_to_string("/proc/self/comm").unwrap();
        let found = group_seconds(comm.trim_end(), "");
        assert!(found.contains_key(&std::process::id()));
        assert!(group_seconds(comm.trim_end(), " no such text ").is_empty());
    }
}
