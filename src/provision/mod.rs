//! Node provisioning with kubeadm: what runs on each host, and in which order.
//!
//! `render` turns a completed cluster into `ssh::task::Step`s (binaries from
//! `spec::assets`), `plan` observes the targets read-only and decides per node, and
//! `orchestrate` runs the plan through a `HostExecutor` phase by phase. All three sit above
//! the node core (`crate::nodes`). See docs/provisioning.md.

pub mod orchestrate;
pub(crate) mod pki;
pub(crate) mod plan;
pub mod render;
pub(crate) mod shell;
