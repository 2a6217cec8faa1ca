//! kprov's integration tests: one binary (linking is the expensive part of a build here).
// The lint is for the library's surface; test support is `pub` for its own modules.
#![allow(unreachable_pub)]

mod support;

mod addons;
mod aws;
mod aws_broken;
mod aws_etcd;
mod aws_image_pin;
mod aws_lifecycle;
mod aws_real;
mod aws_rolling;
mod aws_rolling_cp;
mod aws_rolling_cp_image;
mod aws_rolling_image;
mod aws_templates;
mod bundle;
mod certificates;
mod cli;
mod cli_addons;
mod cli_aws;
mod cli_truth;
mod cloudlab;
mod drain;
mod etcd;
mod faults;
mod images;
mod instance;
mod instance_aws;
mod kops_habits;
mod metal;
mod mirrors;
mod pipes;
mod provision;
mod race;
mod real;
mod rolling;
mod signals;
mod smoke;
mod ssh;
mod state;
mod store_trust;
mod tiers;
mod tunnel;
