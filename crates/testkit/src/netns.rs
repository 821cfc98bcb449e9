//! Network namespaces for partition tests: a [`Net`] makes one namespace per host, each with a
//! veth into a bridge that lives in a hub namespace of its own, plus one veth from the root
//! namespace into that bridge (so that the test, and a server it runs in the root namespace,
//! reach every host). Addresses come from one /24 of 198.18.0.0/15 (RFC 2544's benchmarking
//! range: never routed, so nothing outside the test is addressed).
//!
//! A partition is a pair of `blackhole` routes, one in each side's namespace: packets between
//! the two addresses are dropped silently, as a cut cable drops them, while every other pair
//! still talks. Only iproute2 is needed (the machine has no nftables, iptables or tc qdiscs).
//!
//! Everything is removed on drop (also on a panic). Names carry the owning process id, so a
//! new `Net` removes what a killed test run left behind without touching a live run's.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Prefix of every namespace and root-side link a `Net` makes.
const PREFIX: &str = "fsnet";
/// /24 blocks in 198.18.0.0/15.
const BLOCKS: u32 = 512;

/// One host: its namespace and its address on the bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub ns: String,
    pub addr: Ipv4Addr,
}

/// Namespaces, links and partitions of one test; removed on drop.
pub struct Net {
    /// `fsnet-<pid>-<n>`: the prefix of this net's namespaces.
    tag: String,
    hub: String,
    root_link: String,
    block: u32,
    hosts: Vec<Host>,
    /// Partitions in force, each pair with the lower address first.
    cut: BTreeSet<(Ipv4Addr, Ipv4Addr)>,
}

static NETS: AtomicU32 = AtomicU32::new(0);

impl Net {
    /// A hub namespace with a bridge and the root namespace's link into it. Removes leftovers
    /// of test processes that no longer run first.
    pub fn new() -> Net {
        remove_leftovers();
        let pid = std::process::id();
        let n = NETS.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{PREFIX}-{pid}-{n}");
        let block = free_block(pid + n);
        let net = Net {
            hub: format!("{tag}-hub"),
            // Interface names have at most 15 bytes: `fsnet` + pid in hex + n.
            root_link: format!("{PREFIX}{pid:x}x{n}"),
            tag,
            block,
            hosts: Vec::new(),
            cut: BTreeSet::new(),
        };
        ip(&["netns", "add", &net.hub]);
        ipn(&net.hub, &["link", "add", "br0", "type", "bridge"]);
        ipn(&net.hub, &["link", "set", "br0", "up"]);
        let root = net.root_addr().to_string();
        ip(&[
            "link",
            "add",
            &net.root_link,
            "type",
            "veth",
            "peer",
            "name",
            "root",
            "netns",
            &net.hub,
        ]);
        ipn(&net.hub, &["link", "set", "root", "master", "br0", "up"]);
        ip(&["addr", "add", &format!("{root}/24"), "dev", &net.root_link]);
        ip(&["link", "set", &net.root_link, "up"]);
        net
    }

    /// The root namespace's address on the bridge (`.1`): where the test reaches the hosts
    /// from, and where a server in the root namespace listens for them.
    pub fn root_addr(&self) -> Ipv4Addr {
        self.addr(1)
    }

    fn addr(&self, host: u32) -> Ipv4Addr {
        let [a, b] = [198, 18 + (self.block / 256) as u8];
        Ipv4Addr::new(a, b, (self.block % 256) as u8, host as u8)
    }

    /// A new host `name` (`[a-z0-9]`, short): its own namespace with loopback up and `eth0`
    /// on the bridge.
    pub fn add_host(&mut self, name: &str) -> Host {
        let k = self.hosts.len() as u32;
        assert!(k < 200, "a Net holds at most 200 hosts");
        let host = Host {
            name: name.to_owned(),
            ns: format!("{}-{name}", self.tag),
            addr: self.addr(k + 2),
        };
        let hub_side = format!("h{k}");
        ip(&["netns", "add", &host.ns]);
        ip(&[
            "link", "add", &hub_side, "netns", &self.hub, "type", "veth", "peer", "name", "eth0",
            "netns", &host.ns,
        ]);
        ipn(
            &self.hub,
            &["link", "set", &hub_side, "master", "br0", "up"],
        );
        let cidr = format!("{}/24", host.addr);
        ipn(&host.ns, &["addr", "add", &cidr, "dev", "eth0"]);
        ipn(&host.ns, &["link", "set", "eth0", "up"]);
        ipn(&host.ns, &["link", "set", "lo", "up"]);
        self.hosts.push(host.clone());
        host
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// A command that runs `program` inside `host`'s namespace (`ip netns exec`, which execs
    /// the program: its pid is the program's, so a kill reaches it).
    pub fn command(&self, host: &Host, program: &str) -> Command {
        let mut cmd = Command::new(ip_binary());
        cmd.args(["netns", "exec", &host.ns, program]);
        cmd
    }

    /// `ip netns exec` as a program and its leading arguments, for a runner that takes them
    /// apart (e.g. [`crate::process::Proc`]).
    pub fn exec_prefix(&self, host: &Host) -> (String, Vec<String>) {
        let args = ["netns", "exec", &host.ns].map(str::to_owned).to_vec();
        (ip_binary(), args)
    }

    /// Cuts `a` from `b` (either may be the root address): a blackhole route on each side.
    /// Idempotent.
    pub fn partition(&mut self, a: Ipv4Addr, b: Ipv4Addr) {
        let pair = (a.min(b), a.max(b));
        if a == b || !self.cut.insert(pair) {
            return;
        }
        self.route("add", a, b);
        self.route("add", b, a);
    }

    /// Heals the cut between `a` and `b`. Idempotent.
    pub fn heal(&mut self, a: Ipv4Addr, b: Ipv4Addr) {
        if self.cut.remove(&(a.min(b), a.max(b))) {
            self.route("del", a, b);
            self.route("del", b, a);
        }
    }

    /// Heals every cut.
    pub fn heal_all(&mut self) {
        for (a, b) in std::mem::take(&mut self.cut) {
            self.route("del", a, b);
            self.route("del", b, a);
        }
    }

    /// The partitions in force.
    pub fn cuts(&self) -> Vec<(Ipv4Addr, Ipv4Addr)> {
        self.cut.iter().copied().collect()
    }

    /// `ip route <verb> blackhole <to>/32` in `from`'s namespace.
    fn route(&self, verb: &str, from: Ipv4Addr, to: Ipv4Addr) {
        let dst = format!("{to}/32");
        let args = ["route", verb, "blackhole", &dst];
        if from == self.root_addr() {
            ip(&args);
        } else {
            let host = self.hosts.iter().find(|h| h.addr == from);
            let host = host.unwrap_or_else(|| panic!("{from} is no host of this net"));
            ipn(&host.ns, &args);
        }
    }
}

impl Default for Net {
    fn default() -> Net {
        Net::new()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Root-side blackhole routes die with their link only when they name it: remove them.
        self.heal_all();
        for host in &self.hosts {
            let _ = try_ip(&["netns", "del", &host.ns]);
        }
        let _ = try_ip(&["link", "del", &self.root_link]);
        let _ = try_ip(&["netns", "del", &self.hub]);
    }
}

/// A /24 block no link of the root namespace uses yet, starting from a hash of `salt`.
fn free_block(salt: u32) -> u32 {
    let used = String::from_utf8_lossy(&ip(&["-4", "-o", "addr", "show"])).into_owned();
    (0..BLOCKS)
        .map(|i| salt.wrapping_mul(2_654_435_761).wrapping_add(i) % BLOCKS)
        .find(|b| {
            let prefix = format!(" 198.{}.{}.", 18 + b / 256, b % 256);
            !used.contains(&prefix)
        })
        .expect("a free /24 in 198.18.0.0/15")
}

/// Removes namespaces and root links of this module's naming whose owning process is gone.
fn remove_leftovers() {
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    let listing = String::from_utf8_lossy(&ip(&["netns", "list"])).into_owned();
    for ns in listing.lines().filter_map(|l| l.split_whitespace().next()) {
        let pid = ns
            .strip_prefix(&format!("{PREFIX}-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse().ok());
        if pid.is_some_and(|p| !alive(p)) {
            // A run killed with SIGKILL left its servers running in there (no drop ran):
            // they belong to that run, and would hold the namespace alive after its name goes.
            let pids = try_ip(&["netns", "pids", ns]).unwrap_or_default();
            for pid in String::from_utf8_lossy(&pids).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
            let _ = try_ip(&["netns", "del", ns]);
        }
    }
    let links = String::from_utf8_lossy(&ip(&["-o", "link", "show"])).into_owned();
    for link in links.lines().filter_map(|l| l.split(": ").nth(1)) {
        let name = link.split('@').next().unwrap_or_default();
        let pid = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('x').next())
            .and_then(|p| u32::from_str_radix(p, 16).ok());
        if pid.is_some_and(|p| !alive(p)) {
            let _ = try_ip(&["link", "del", name]);
        }
    }
}

fn ip_binary() -> String {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("ip")
        .to_owned()
}

/// `ip <args>` in the root namespace; panics with its stderr when it fails.
fn ip(args: &[&str]) -> Vec<u8> {
    try_ip(args).unwrap_or_else(|e| panic!("ip {}: {e}", args.join(" ")))
}

/// `ip -n <ns> <args>`.
fn ipn(ns: &str, args: &[&str]) -> Vec<u8> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    ip(&all)
}

fn try_ip(args: &[&str]) -> Result<Vec<u8>, String> {
    let out = Command::new(ip_binary())
        .args(args)
        .output()
        .map_err(|e| format!("run ip (is iproute2 installed? scripts/test-deps.sh): {e}"))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}
