//! Cluster and InstanceGroup objects: types, loading with source positions, defaults,
//! validation and the JSON Schema.

pub mod assets;
pub(crate) mod cidr;
pub mod defaults;
mod load;
mod locate;
pub mod mirrors;
pub mod resolve;
mod types;
pub mod validate;
pub(crate) mod versions;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod proptests;

pub use load::{
    Diagnostic, Loaded, Object, ObjectRef, SourceDoc, SpecErrors, load_objects, to_yaml_stream,
};
pub use locate::{FieldPath, Pos, Seg};
pub use resolve::{ResolvedCluster, ResolvedGroup, resolve, resolve_located};
pub use types::*;
