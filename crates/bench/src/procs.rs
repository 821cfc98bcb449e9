//! CPU time per process from `/proc/<pid>/stat` (utime + stime), so a bench can print what each
//! process of the path (the `flashsale` process itself, `redis-server`, `mariadbd`) spent per
//! answer, in microseconds, beside the answers per second.
//!
//! Processes are found by name (`/proc/<pid>/comm`). When several share a name (a test's
//! throwaway server beside the machine's), the one whose command line names the wanted port
//! is taken, else the oldest (the machine's service, started first).

use std::fs;

/// Linux reports `utime`/`stime` in clock ticks of `USER_HZ`, 100 on every mainstream
/// architecture (`getconf CLK_TCK`).
const TICKS_PER_S: f64 = 100.0;

/// One process to watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    /// The label printed (`flashsale`, `redis-server`, `mariadbd`).
    pub label: String,
    pub pid: u32,
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
    let mut found: Vec<(u32, u64, bool)> = Vec::new();
    for entry in fs::read_dir("/proc").ok()?.flatten() {
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
        let Some((_, start)) = stat_of(&pid.to_string()) else {
            continue;
        };
        let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        let names_port = port.is_some_and(|p| {
            [format!(":{p}"), format!("--port={p}"), format!(" {p} ")]
                .iter()
                .any(|needle| format!("{cmdline} ").contains(needle.as_str()))
        });
        found.push((pid, start, names_port));
    }
    found.sort_by_key(|&(_, start, names_port)| (!names_port, start));
    found.first().map(|&(pid, _, _)| pid)
}

/// The processes of a purchase path on this machine: this process as `flashsale`, and
/// `redis-server` / `mariadbd` when they run.
pub fn path_processes(redis_port: Option<u16>, mysql_port: Option<u16>) -> Vec<Watched> {
    let mut out = vec![Watched {
        label: "flashsale".into(),
        pid: std::process::id(),
    }];
    if let Some(pid) = find("redis-server", redis_port.or(Some(6379))) {
        out.push(Watched {
            label: "redis-server".into(),
            pid,
        });
    }
    let mariadb = find("mariadbd", mysql_port.or(Some(3306)))
        .or_else(|| find("mysqld", mysql_port.or(Some(3306))));
    if let Some(pid) = mariadb {
        out.push(Watched {
            label: "mariadbd".into(),
            pid,
        });
    }
    out
}

/// The CPU seconds of each watched process at one moment.
#[derive(Debug, Clone)]
pub struct Sample {
    seconds: Vec<Option<f64>>,
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
        Sample {
            seconds: self.watched.iter().map(|w| cpu_seconds(w.pid)).collect(),
        }
    }

    /// What each process spent between `before` and `after`, per answer (`answers` of them,
    /// over `wall_s` seconds).
    pub fn phase(&self, before: &Sample, after: &Sample, answers: u64, wall_s: f64) -> PhaseCpu {
        let mut per_answer_us = Vec::new();
        let mut cores = Vec::new();
        for (i, w) in self.watched.iter().enumerate() {
            let spent = match (before.seconds[i], after.seconds[i]) {
                (Some(b), Some(a)) => Some(a - b),
                _ => None,
            };
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
        let meter = Meter::new(vec![Watched {
            label: "x".into(),
            pid: 1,
        }]);
        let before = Sample {
            seconds: vec![Some(1.0)],
        };
        let after = Sample {
            seconds: vec![Some(1.5)],
        };
        let p = meter.phase(&before, &after, 1_000, 2.0);
        assert!((p.us("x").unwrap() - 500.0).abs() < 1e-9);
        assert_eq!(p.line(), "x 500.0");
        assert!(load_average().is_some());
    }
}
