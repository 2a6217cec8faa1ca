//! kprov: a declarative Kubernetes cluster provisioner.
//!
//! Pipeline: spec → resolved (completed) cluster → resource graph → plan → apply.
//! See docs/architecture.md for where each stage lives.

pub mod cloud;
pub mod spec;
pub mod ssh;
pub mod state;
