//! flashsale-layering: the layering check, read from the code rather than its text.
//!
//! - [`rules`]: the rules as data (each crate's allowed workspace dependencies, the server's
//!   readers and parts, the engine's parts a handler must not name: none is allowed).
//! - [`graph`]: what one file names, parsed with `syn` (its `use` trees and every path,
//!   resolved against the file's module; fields read on the server's state).
//! - Here: the checks over the workspace (`cargo metadata` for the crates' dependencies, the
//!   server's sources for its modules), each finding with its file and line.
//!
//! Depends on no crate of the workspace; `flashsale-layering` (the binary) runs it in CI.

pub mod graph;
pub mod rules;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One arrow that breaks a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub file: String,
    pub line: usize,
    pub what: String,
}

impl Finding {
    /// A finding at the place of `named` in `file`, `what` said of its path (`a::b`).
    fn at(file: &str, named: &graph::Named, what: impl FnOnce(&str) -> String) -> Finding {
        Finding {
            file: file.into(),
            line: named.line,
            what: what(&named.path.join("::")),
        }
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.what)
    }
}

/// The findings of every check.
#[derive(Debug, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
}

/// Runs every check on the workspace at `root`.
pub fn check_workspace(root: &Path) -> anyhow::Result<Report> {
    let mut report = Report::default();
    report.findings.extend(check_crates(&metadata(root)?));
    let server = root.join("crates/server/src");
    for (file, module, source) in sources(&server)? {
        let scanned = graph::scan(&source, &module)?;
        let shown = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        report
            .findings
            .extend(check_server_part(&shown, &module, &scanned));
        report
            .findings
            .extend(check_route(&shown, &module, &scanned));
    }
    Ok(report)
}

/// `cargo metadata` of the workspace (no registry access).
fn metadata(root: &Path) -> anyhow::Result<serde_json::Value> {
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Each workspace crate's dependencies on other workspace crates against [`rules::CRATE_DEPS`].
pub fn check_crates(metadata: &serde_json::Value) -> Vec<Finding> {
    let allowed: BTreeMap<&str, &[&str]> = rules::CRATE_DEPS.iter().copied().collect();
    let packages = metadata["packages"].as_array().cloned().unwrap_or_default();
    let ours: Vec<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(String::from))
        .collect();
    let mut findings = Vec::new();
    for p in &packages {
        let name = p["name"].as_str().unwrap_or("?");
        let file = p["manifest_path"].as_str().unwrap_or("?").to_string();
        let Some(may) = allowed.get(name) else {
            findings.push(Finding {
                file,
                line: 0,
                what: format!("crate {name} has no rule in rules::CRATE_DEPS"),
            });
            continue;
        };
        for dep in p["dependencies"].as_array().into_iter().flatten() {
            let dep_name = dep["name"].as_str().unwrap_or("?");
            if !ours.iter().any(|o| o == dep_name) {
                continue;
            }
            let dev = dep["kind"].as_str() == Some("dev");
            let ok = may.contains(&dep_name) || (dev && rules::DEV_EXTRA.contains(&dep_name));
            if !ok {
                let kind = if dev { "dev-dependency" } else { "dependency" };
                findings.push(Finding {
                    file: file.clone(),
                    line: 0,
                    what: format!("{name} may not have the {kind} {dep_name}"),
                });
            }
        }
    }
    findings
}

/// Every `.rs` file under `src` with its module path and text.
fn sources(src: &Path) -> anyhow::Result<Vec<(PathBuf, Vec<String>, String)>> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let module = module_of(path.strip_prefix(src)?);
                out.push((path.clone(), module, std::fs::read_to_string(&path)?));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `routes/orders.rs` → `[routes, orders]`; `routes/mod.rs` → `[routes]`; `lib.rs` → `[]`.
pub fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if !matches!(stem, "mod" | "lib" | "main") {
            parts.push(stem.to_string());
        }
    }
    parts
}

/// A server part (a module the state holds) names no reader of the state and not `AppState`.
pub fn check_server_part(file: &str, module: &[String], scanned: &graph::Scanned) -> Vec<Finding> {
    let Some(top) = module.first() else {
        return Vec::new();
    };
    if rules::SERVER_READERS.contains(&top.as_str()) {
        return Vec::new();
    }
    let bad = |p: &[String]| {
        let reader = p.first().map(String::as_str) == Some("crate")
            && p.get(1)
                .is_some_and(|m| rules::SERVER_READERS.contains(&m.as_str()));
        reader || p.iter().any(|s| s == "AppState")
    };
    scanned
        .paths
        .iter()
        .filter(|n| bad(&n.path))
        .map(|n| {
            Finding::at(file, n, |path| {
                format!("part `{top}` names `{path}`, which reads the state")
            })
        })
        .collect()
}

/// A handler under `routes/` names no engine part: no engine module but the use cases'
/// ([`rules::ENGINE_API`]) and no part of the engine, read off the state or through the
/// shop's accessors. Every one is a finding.
pub fn check_route(file: &str, module: &[String], scanned: &graph::Scanned) -> Vec<Finding> {
    if module.first().map(String::as_str) != Some("routes") {
        return Vec::new();
    }
    let engine = scanned.paths.iter().filter(|n| {
        n.path.first().map(String::as_str) == Some("flashsale_engine")
            && !n
                .path
                .get(1)
                .is_some_and(|m| rules::ENGINE_API.contains(&m.as_str()))
    });
    let parts = scanned
        .state_fields
        .iter()
        .filter(|n| rules::ENGINE_PARTS.contains(&n.path[1].as_str()));
    engine
        .chain(parts)
        .map(|n| {
            Finding::at(file, n, |path| {
                format!("a handler names the engine part `{path}`: ask the shop for a use case")
            })
        })
        .collect()
}
