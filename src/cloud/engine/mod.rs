//! The cloud-agnostic engine: resource model, diff, plan, apply and rendering.

mod apply;
mod model;
mod plan;
mod render;

pub use apply::{ApplyOptions, ApplyReport, DoneHook, WaitHook, apply};
pub use model::{CloudId, IdMap, Resource, ResourceId, Value};
pub(crate) use model::{FieldRule, Kind, Lifecycle};
pub use plan::{Action, Change, FieldChange, Plan, Summary};
pub(crate) use plan::{PLAN_SCHEMA_VERSION, diff, plan_delete};
#[cfg(test)]
pub(crate) use plan::{field_changes, topo_order};
pub use render::{RenderOptions, render_text};

/// How the engine reacts to a failed cloud call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Rate limited: back off and retry.
    Throttled,
    /// Something still uses the resource (deleting a VPC with subnets): retry until the
    /// deadline, the dependants are usually on their way out.
    DependencyViolation,
    /// Not ready yet (a NAT gateway still pending): wait and retry.
    NotReady,
    /// The service does not know a resource (EC2's `*.NotFound`, IAM's `NoSuchEntity`, ELB's
    /// `*NotFound`): on AWS an ID returned a moment ago may not have propagated yet, so a
    /// create is retried for a short propagation window ([`apply::ApplyOptions`]); a delete
    /// takes it as already gone.
    NotFound,
    /// The service failed (HTTP 5xx, `InternalError`) or the connection broke before a reply:
    /// retry with back-off, like throttling.
    Transient,
    /// Anything else: fail the resource.
    Fatal,
}

/// What failed in a plan or apply, and how the engine treats it ([`CloudError::class`]).
#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    /// A cloud call failed, or kprov judged its answer ([`CloudError::verdict`]).
    #[error("{operation}: {message}")]
    Api {
        /// The service operation (`DeleteSubnet`), as the error names it.
        operation: String,
        /// How the engine reacts: retry, wait, or fail.
        class: ErrorClass,
        /// The service's error code as the SDK read it (`ProvideErrorMetadata::code`), raw:
        /// decisions ("already gone", "no such type") match on it, never on `message`. `None`
        /// for errors that never reached a service and for kprov's own verdicts.
        code: Option<String>,
        /// What the user reads (code and message escaped where they entered).
        message: String,
    },
    /// The desired model is inconsistent (a bug or an incomplete spec).
    #[error("resource model: {0}")]
    Model(String),
    /// The spec lacks something this provider needs.
    #[error("spec: {0}")]
    Spec(String),
    /// A resource still failed with a retryable error when its deadline
    /// ([`ApplyOptions::resource_deadline`]) passed.
    #[error("{id}: not done within {after:?} (last error: {last})")]
    Deadline {
        /// The resource that ran out of time.
        id: ResourceId,
        /// The deadline it had.
        after: std::time::Duration,
        /// The last error it met.
        last: String,
    },
    /// An error of one resource's step, naming the resource.
    #[error("{id}: {source}")]
    Resource {
        /// The resource whose step failed.
        id: ResourceId,
        /// What failed.
        #[source]
        source: Box<CloudError>,
    },
    /// The plan has errors ([`Plan::errors`]): apply makes no change.
    #[error("the plan cannot be applied:\n  {}", .0.join("\n  "))]
    Refused(Vec<String>),
    /// Resources failed during apply (each error names its resource); the others were done.
    #[error("{} resource(s) failed:\n  {}", .0.len(), .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  "))]
    Failed(Vec<CloudError>),
}

impl CloudError {
    pub(crate) fn class(&self) -> ErrorClass {
        match self {
            CloudError::Api { class, .. } => *class,
            CloudError::Resource { source, .. } => source.class(),
            _ => ErrorClass::Fatal,
        }
    }

    /// The service's error code, through `Resource` wrappers.
    pub(crate) fn code(&self) -> Option<&str> {
        match self {
            CloudError::Api { code, .. } => code.as_deref(),
            CloudError::Resource { source, .. } => source.code(),
            _ => None,
        }
    }

    pub(crate) fn not_ready(operation: &str, message: impl Into<String>) -> Self {
        CloudError::verdict(operation, ErrorClass::NotReady, message)
    }

    /// kprov's own verdict about a call's result (no service code): a resource not visible
    /// yet, a group not owned by the cluster.
    pub(crate) fn verdict(operation: &str, class: ErrorClass, message: impl Into<String>) -> Self {
        CloudError::Api {
            operation: operation.to_string(),
            class,
            code: None,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests;
