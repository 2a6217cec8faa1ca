//! Test support: real stand-ins started by the tests themselves.
#![allow(dead_code)]

pub mod aws_recorder;
pub mod awscloud;
pub mod awsroll;
pub mod cli;
pub mod cloudlab;
pub mod delayproxy;
pub mod fakekube;
pub mod faultproxy;
pub mod memstate;
pub mod mirror;
pub mod moto;
pub mod realcluster;
pub mod realhosts;
pub mod realk8s;
pub mod registry;
pub mod signals;
pub mod testhosts;
pub mod tiers;

pub use tiers::{Tier, skip};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Runs `cmd` (no stdin) and fails naming `what` with its stderr unless it succeeded.
#[track_caller]
pub fn run_ok(cmd: &mut std::process::Command, what: &str) -> std::process::Output {
    let o = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Starts `cmd` in the background with no stdin and its output dropped (a daemon whose own
/// log or socket the test reads); fails naming `what` when it cannot start.
#[track_caller]
pub fn spawn_silent(cmd: &mut std::process::Command, what: &str) -> std::process::Child {
    use std::process::Stdio;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Every file below `dir` with its content (to prove nothing changed).
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    walk(dir, false)
}

/// [`snapshot`] with every directory too (as an empty entry): where even a new directory
/// would be a change (a refused command writes nothing at all).
pub fn snapshot_with_dirs(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    walk(dir, true)
}

fn walk(dir: &Path, dirs: bool) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                if dirs {
                    out.insert(p.clone(), Vec::new());
                }
                todo.push(p);
            } else {
                out.insert(p.clone(), std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}

/// Whether an image reference (`registry/.../NAME:TAG` or `@sha256:...`) is one of the control
/// plane's own images (kube-apiserver, -controller-manager, -scheduler, etcd), which a worker
/// never runs, so never gets.
pub fn control_plane_only(reference: &str) -> bool {
    let repo = reference.rsplit('/').next().unwrap_or(reference);
    let repo = repo.split([':', '@']).next().unwrap_or(repo);
    matches!(
        repo,
        "kube-apiserver" | "kube-controller-manager" | "kube-scheduler" | "etcd"
    )
}

/// `cluster` as the renderer and the node use cases take it: the typed model, resolved once
/// (completed as a command would; not validated, like a test's partial spec).
pub fn model(cluster: &kprov::spec::Cluster) -> kprov::spec::ResolvedCluster {
    kprov::spec::resolve::model(cluster, &[]).unwrap_or_else(|e| panic!("{e}"))
}
