//! kprov's integration tests: one binary (linking is the expensive part of a build here).

mod support;

mod aws;
mod smoke;
