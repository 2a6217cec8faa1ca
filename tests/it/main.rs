//! kprov's integration tests: one binary (linking is the expensive part of a build here).

mod support;

mod addons;
mod aws;
mod aws_lifecycle;
mod cli;
mod cli_addons;
mod cli_aws;
mod cli_truth;
mod cloudlab;
mod etcd;
mod faults;
mod metal;
mod provision;
mod race;
mod smoke;
mod ssh;
mod state;
mod store_trust;
mod tunnel;
