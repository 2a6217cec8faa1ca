//! SSH transport and step execution on hosts.

pub mod task;
