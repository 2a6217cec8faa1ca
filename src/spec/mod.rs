//! Cluster and InstanceGroup objects: types, loading with source positions, defaults,
//! validation and the JSON Schema.

mod types;

pub use types::*;
