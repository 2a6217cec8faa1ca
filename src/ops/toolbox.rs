//! `toolbox dump` (kops's): what a cluster is made of right now, as one document for support
//! tickets and scripts: its cloud resources (AWS: everything it owns, found by its ownership
//! tag as `delete cluster` finds them), its machines (metal's hosts, AWS's running instances)
//! and the nodes the API server lists. Never a secret: no key, certificate, kubeconfig or
//! registry credential is read for the document (the admin kubeconfig only opens the API).

use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use super::platform::{Platform, Reach};
use crate::kube::NodeInfo;
use crate::nodes::{CloudInstance, Target};
use crate::spec::{CloudProvider, ResolvedCluster};
use crate::state::StateStore;

/// The dump (`-o json|yaml`); field names are part of kprov's output contract.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Dump {
    pub cluster: String,
    pub cloud: String,
    /// AWS: every resource the cluster owns; empty on metal.
    pub resources: Vec<Resource>,
    /// Why the resources could not be read (the dump still carries the rest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources_error: Option<String>,
    pub machines: Vec<Machine>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machines_error: Option<String>,
    /// The nodes as the API server lists them; absent when it could not be asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<NodeInfo>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes_error: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Resource {
    pub kind: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// A host or instance, without anything secret (the SSH key's path is the user's, not kept).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Machine {
    pub name: String,
    pub node_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub roles: Vec<String>,
    pub address: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bastion: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<CloudInstance>,
}

impl Machine {
    fn of(t: &Target) -> Machine {
        Machine {
            name: t.host.name.clone(),
            node_name: t.node_name.clone(),
            group: t.group.clone(),
            roles: t
                .host
                .roles
                .iter()
                .map(|r| r.as_str().to_string())
                .collect(),
            address: t.host.address.clone(),
            bastion: t.host.bastion.clone(),
            instance: t.instance.clone(),
        }
    }
}

/// Reads the dump. A part that cannot be read (the cloud, the API server) is named in the
/// document with its cause instead of failing the whole dump: a dump is wanted most on the
/// days something is broken.
pub(crate) async fn dump(
    store: &Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    kubeconfig: Option<&Path>,
    with_api: bool,
) -> Dump {
    let mut d = Dump {
        cluster: cluster.name.clone(),
        cloud: cluster.completed.spec.cloud_provider.to_string(),
        resources: Vec::new(),
        resources_error: None,
        machines: Vec::new(),
        machines_error: None,
        nodes: None,
        nodes_error: None,
    };
    if cluster.completed.spec.cloud_provider == CloudProvider::Aws {
        match owned_resources(cluster).await {
            Ok(r) => d.resources = r,
            Err(e) => d.resources_error = Some(format!("{e:#}")),
        }
    }
    let machines = async {
        Platform::open(store, cluster, Reach::default())
            .await?
            .targets()
            .await
    };
    match machines.await {
        Ok(t) => d.machines = t.iter().map(Machine::of).collect(),
        Err(e) => d.machines_error = Some(format!("{e:#}")),
    }
    if with_api {
        let nodes = async {
            let (kube, _guard) =
                super::credentials::kube_client(store, &cluster.completed, kubeconfig, false)
                    .await?;
            anyhow::Ok(kube.list_nodes().await?)
        };
        match nodes.await {
            Ok(n) => d.nodes = Some(n),
            Err(e) => d.nodes_error = Some(format!("{e:#}")),
        }
    }
    d
}

async fn owned_resources(cluster: &ResolvedCluster) -> anyhow::Result<Vec<Resource>> {
    let cloud = super::aws::cloud(&cluster.completed).await?;
    // The deletion plan is exactly "what this cluster owns", found as `delete cluster` finds it.
    let plan = cloud.plan_delete(cluster).await?;
    let mut out: Vec<Resource> = plan
        .changes
        .iter()
        .map(|c| Resource {
            kind: c.kind.clone(),
            name: c.name.clone(),
            id: c.cloud_id.clone(),
        })
        .collect();
    out.sort_by(|a, b| (&a.kind, &a.name).cmp(&(&b.kind, &b.name)));
    Ok(out)
}
