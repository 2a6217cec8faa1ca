//! Test support: real stand-ins started by the tests themselves.
#![allow(dead_code)]

pub mod memstate;
pub mod moto;
pub mod testhosts;
