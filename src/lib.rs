//! kprov: a declarative Kubernetes cluster provisioner.
//!
//! Pipeline: spec → resolved (completed) cluster → resource graph → plan → apply.
//! See docs/architecture.md for where each stage lives.

pub mod addons;
pub mod aws_errors;
pub mod bounded;
pub mod bundle;
pub mod cli;
pub mod cloud;
#[cfg(test)]
mod import_cycles;
pub mod inventory;
pub mod kube;
pub mod kubeconfig;
pub mod nodes;
pub mod ops;
pub mod output;
pub mod provision;
pub mod repo;
pub mod spec;
pub mod ssh;
pub mod state;
#[cfg(test)]
mod test_files;
#[cfg(test)]
mod trust_boundary;
pub(crate) mod views;
