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
