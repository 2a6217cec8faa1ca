//! Cloud resources: the provider-agnostic engine (desired vs actual, plan, apply) and the
//! providers that implement it (AWS today).
//!
//! The path `ops` takes through this module: `aws::AwsCloud::new` → `AwsCloud::plan`
//! (`aws::desired`, pure; the provider's read-only read; `engine::diff`) →
//! `engine::render_text` / `engine::Plan` as JSON → `engine::apply` with `--yes`.

pub mod aws;
pub mod engine;

use async_trait::async_trait;

pub(crate) use engine::{CloudError, CloudId, ErrorClass, FieldChange, IdMap, Resource};

/// What the engine asks of a cloud. Kinds and fields are the provider's vocabulary; the engine
/// only diffs `Resource::fields`, follows `Value::Ref`s for ordering and retries by
/// `CloudError::class`.
#[async_trait]
pub trait Provider: Send + Sync {
    /// Every resource the cluster owns (found by tags or ownership records, one batched read per
    /// resource type) plus the adopted (`ExistsAndValidates`) resources named in `desired`.
    /// References to other resources must come back as `Value::Ref` to their logical IDs.
    async fn read(&self, cluster: &str, desired: &[Resource]) -> Result<Actual, CloudError>;
    /// Creates `want` (refs resolved through `ids`) and returns its cloud ID (a reply without
    /// one is an error naming the resource: an empty ID is never recorded).
    async fn create(&self, want: &Resource, ids: &IdMap) -> Result<CloudId, CloudError>;
    /// Brings `have` to `want`; `changes` are the fields that differ.
    async fn update(
        &self,
        want: &Resource,
        have: &Resource,
        changes: &[FieldChange],
        ids: &IdMap,
    ) -> Result<(), CloudError>;
    /// Removes an owned resource; `DependencyViolation` errors are retried by the engine.
    async fn delete(&self, have: &Resource, ids: &IdMap) -> Result<(), CloudError>;
}

/// The result of `Provider::read`.
#[derive(Debug, Default, Clone)]
pub struct Actual {
    pub(crate) resources: Vec<Resource>,
    /// Things the operator should know that do not stop a plan (e.g. NS delegation unconfirmed).
    pub(crate) warnings: Vec<String>,
    /// Conflicts that make applying unsafe (a record this cluster would write exists and is
    /// not owned by it); they become plan errors.
    pub(crate) conflicts: Vec<String>,
}
