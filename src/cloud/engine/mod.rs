//! The cloud-agnostic engine: resource model, diff, plan, apply and rendering.

mod apply;
mod model;
mod plan;
mod render;

pub use apply::{ApplyOptions, ApplyReport, DoneHook, WaitHook, apply};
pub use model::{CloudId, FieldRule, IdMap, Kind, Lifecycle, Resource, ResourceId, Value};
pub use plan::{
    Action, Change, FieldChange, PLAN_SCHEMA_VERSION, Plan, Summary, diff, field_changes, plan,
    plan_delete, topo_order,
};
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

#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    #[error("{operation}: {message}")]
    Api {
        operation: String,
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
    #[error("{id}: not done within {after:?} (last error: {last})")]
    Deadline {
        id: ResourceId,
        after: std::time::Duration,
        last: String,
    },
    #[error("{id}: {source}")]
    Resource {
        id: ResourceId,
        #[source]
        source: Box<CloudError>,
    },
    #[error("the plan cannot be applied:\n  {}", .0.join("\n  "))]
    Refused(Vec<String>),
    #[error("{} resource(s) failed:\n  {}", .0.len(), .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  "))]
    Failed(Vec<CloudError>),
}

impl CloudError {
    pub fn class(&self) -> ErrorClass {
        match self {
            CloudError::Api { class, .. } => *class,
            CloudError::Resource { source, .. } => source.class(),
            _ => ErrorClass::Fatal,
        }
    }

    /// The service's error code, through `Resource` wrappers.
    pub fn code(&self) -> Option<&str> {
        match self {
            CloudError::Api { code, .. } => code.as_deref(),
            CloudError::Resource { source, .. } => source.code(),
            _ => None,
        }
    }

    pub fn not_ready(operation: &str, message: impl Into<String>) -> Self {
        CloudError::verdict(operation, ErrorClass::NotReady, message)
    }

    /// kprov's own verdict about a call's result (no service code): a resource not visible
    /// yet, a group not owned by the cluster.
    pub fn verdict(operation: &str, class: ErrorClass, message: impl Into<String>) -> Self {
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
