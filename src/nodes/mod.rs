//! The node layer: the machines a cluster runs on, found at run time, whatever the platform.
//!
//! A [`TargetSource`] finds the cluster's nodes: on metal, the inventory in the spec
//! ([`Inventory`]); on a cloud, the running instances of each instance group. Everything
//! downstream (the node plan, the kubeadm provisioner, host keys, progress output, rolling
//! updates) works on [`Target`]s and never asks which platform they came from.
//!
//! Caveat: a target is a snapshot. A cloud group may replace an instance at any moment, so
//! callers find targets again at the start of every run instead of caching them.

use async_trait::async_trait;
use serde::Serialize;

use crate::spec::{Host, HostRole};

/// One machine kprov provisions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// How kprov reaches it over SSH (address, user, port, key, bastion) and what it is (roles,
    /// labels, taints). `host.name` is the target's stable name in progress, reports and the
    /// host-key store; on a cloud it is the instance ID.
    pub host: Host,
    /// The name the node registers with in Kubernetes (metal: the host name; AWS: the
    /// instance's private DNS name, which the AWS cloud-controller-manager requires).
    pub node_name: String,
    /// The instance group it belongs to, when the platform has groups.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Set for cloud instances.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<CloudInstance>,
}

/// What the cloud says about an instance a target runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CloudInstance {
    /// The instance ID (`i-...`).
    pub id: String,
    /// Its availability zone.
    pub zone: String,
    /// Its private IPv4 address.
    pub private_ip: String,
    /// Its public IPv4 address; `None` when it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_ip: Option<String>,
    /// Its private DNS name, which the Node registers under.
    pub private_dns: String,
    /// `spec.providerID` of the Node, e.g. `aws:///us-east-1a/i-0123456789abcdef0`.
    pub provider_id: String,
    /// The launch template version the instance was started from, when known (rolling
    /// updates compare it with the group's current one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) launch_template_version: Option<String>,
    /// The version its group launches now (its template's latest), when the caller read it:
    /// an instance launched from an older one is pending a rolling update.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) group_template_version: Option<String>,
}

impl Target {
    /// A bare-metal host from the inventory: it registers under its own name.
    pub fn from_host(host: Host) -> Target {
        Target {
            node_name: host.name.clone(),
            host,
            group: None,
            instance: None,
        }
    }

    /// The host's inventory name (the name errors and progress use).
    pub fn name(&self) -> &str {
        &self.host.name
    }

    pub(crate) fn has_role(&self, role: HostRole) -> bool {
        self.host.roles.contains(&role)
    }

    /// True when the host has the control-plane role.
    pub fn is_control_plane(&self) -> bool {
        self.has_role(HostRole::ControlPlane)
    }
}

/// Why the platform could not list the cluster's machines.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The platform could not be asked (cloud API error, bad credentials); names the call.
    #[error("finding the nodes of {cluster}: {message}")]
    Discovery {
        /// The cluster whose machines were asked for.
        cluster: String,
        /// The platform's error.
        message: String,
    },
}

/// Finds the cluster's nodes at run time.
#[async_trait]
pub(crate) trait TargetSource: Send + Sync {
    async fn targets(&self) -> Result<Vec<Target>, TargetError>;
}

/// The hosts of a metal cluster's inventory (`spec.hosts`), in inventory order.
pub(crate) struct Inventory {
    pub(crate) hosts: Vec<Host>,
}

#[async_trait]
impl TargetSource for Inventory {
    async fn targets(&self) -> Result<Vec<Target>, TargetError> {
        Ok(self.hosts.iter().cloned().map(Target::from_host).collect())
    }
}

pub mod journal;
pub(crate) mod model;
pub(crate) mod owner;
pub mod roll;

pub use owner::Owner;
