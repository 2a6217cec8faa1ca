//! Test support: real stand-ins started by the tests themselves.
#![allow(dead_code)]

pub mod aws_recorder;
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
