//! Bare-metal node provisioning with kubeadm: what runs on each host, and in which order.
//!
//! `assets` pins the binaries, `render` turns a completed cluster into `ssh::task::Step`s,
//! `orchestrate` runs them through a `HostExecutor` phase by phase. See
//! docs/provisioning.md.

pub mod artifacts;
pub mod assets;
pub mod mirrors;
pub mod orchestrate;
pub mod pki;
pub mod render;
pub mod shell;
