//! Test support: real stand-ins started by the tests themselves.
#![allow(dead_code)]

pub mod fakekube;
pub mod mirror;
pub mod moto;
