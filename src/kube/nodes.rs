//! Nodes: reading them with their taints and provider IDs, cordon, eviction, and waiting for
//! the cloud-controller-manager to initialise them.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use serde::Serialize;

use super::{FIELD_MANAGER, Kube, KubeError, Poll, api_error};

/// The taint a kubelet started with `--cloud-provider=external` carries until the CCM has
/// initialised its node.
pub(crate) const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";

const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// A node taint as the API holds it (`key[=value]:effect`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Taint {
    /// The taint's key.
    pub key: String,
    /// Its value; `None` when it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// What kprov needs to know about a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    /// The node's name.
    pub name: String,
    pub(crate) ready: bool,
    pub(crate) control_plane: bool,
    /// True when the node is cordoned.
    pub unschedulable: bool,
    /// The cloud's ID of the machine (`aws:///zone/i-...`); `None` until a cloud-controller-manager
    /// sets it, and on metal.
    #[serde(rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    pub(crate) taints: Vec<Taint>,
    pub(crate) labels: BTreeMap<String, String>,
}

impl NodeInfo {
    pub(crate) fn from_node(node: &Node) -> Self {
        let spec = node.spec.clone().unwrap_or_default(); // no spec: schedulable, no taints, no provider ID
        let labels = node.metadata.labels.clone().unwrap_or_default(); // no labels: not a control plane
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        NodeInfo {
            name: node.metadata.name.clone().unwrap_or_default(), // the API names every Node it returns
            ready,
            control_plane: labels.contains_key(CONTROL_PLANE_LABEL),
            unschedulable: spec.unschedulable.unwrap_or(false),
            provider_id: spec.provider_id.filter(|p| !p.is_empty()),
            taints: spec
                .taints
                .unwrap_or_default() // no taints listed: none
                .into_iter()
                .map(|t| Taint {
                    key: t.key,
                    value: t.value,
                    effect: t.effect,
                })
                .collect(),
            labels,
        }
    }

    pub(crate) fn has_taint(&self, key: &str) -> bool {
        self.taints.iter().any(|t| t.key == key)
    }

    /// Why the CCM has not finished with this node, or `None` when it has.
    pub fn uninitialized_reason(&self) -> Option<String> {
        let mut reasons = Vec::new();
        if self.has_taint(UNINITIALIZED_TAINT) {
            reasons.push(format!("taint {UNINITIALIZED_TAINT}"));
        }
        if self.provider_id.is_none() {
            reasons.push("no providerID".to_string());
        }
        (!reasons.is_empty()).then(|| reasons.join(", "))
    }
}

/// How eviction retries while a PodDisruptionBudget blocks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictOptions {
    /// Give up (with a clear error) once this much time has passed.
    pub deadline: Duration,
    /// The first wait after a 429; doubled after each.
    pub initial_backoff: Duration,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
}

impl Default for EvictOptions {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(300),
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
        }
    }
}

impl Kube {
    /// Every node, read page by page.
    pub async fn list_nodes(&self) -> Result<Vec<NodeInfo>, KubeError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let nodes = self.list_all(&api, &ListParams::default()).await?;
        Ok(nodes.iter().map(NodeInfo::from_node).collect())
    }

    /// Pods of a namespace (or all namespaces with `None`), optionally filtered.
    pub(crate) async fn list_pods(
        &self,
        namespace: Option<&str>,
        params: &ListParams,
    ) -> Result<Vec<Pod>, KubeError> {
        let api: Api<Pod> = match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        self.list_all(&api, params).await
    }

    /// Every pod scheduled on a node (what a drain must evict).
    pub async fn pods_on_node(&self, node: &str) -> Result<Vec<Pod>, KubeError> {
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        self.list_pods(None, &params).await
    }

    /// Marks a node unschedulable (kubectl cordon).
    pub async fn cordon(&self, node: &str) -> Result<(), KubeError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = serde_json::json!({ "spec": { "unschedulable": true } });
        api.patch(
            node,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| api_error(&self.server, "cordoning", &format!("node {node}"), e))?;
        Ok(())
    }

    /// Evicts a pod through the eviction subresource, so PodDisruptionBudgets are honoured.
    /// A 429 (budget exhausted) is retried with doubling back-off until the deadline; a pod
    /// that is already gone counts as evicted.
    pub async fn evict(
        &self,
        namespace: &str,
        pod: &str,
        options: EvictOptions,
    ) -> Result<(), KubeError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let start = tokio::time::Instant::now();
        let mut backoff = options.initial_backoff;
        loop {
            match api.evict(pod, &EvictParams::default()).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 429 => {
                    let elapsed = start.elapsed();
                    if elapsed >= options.deadline {
                        return Err(KubeError::EvictionBlocked {
                            namespace: namespace.to_string(),
                            pod: pod.to_string(),
                            waited: elapsed,
                            message: s.message.clone(),
                        });
                    }
                    let wait = backoff.min(options.deadline - elapsed);
                    tracing::debug!(
                        pod,
                        namespace,
                        ?wait,
                        "eviction blocked by a disruption budget"
                    );
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(options.max_backoff);
                }
                Err(e) => {
                    return Err(api_error(
                        &self.server,
                        "evicting",
                        &format!("pod {namespace}/{pod}"),
                        e,
                    ));
                }
            }
        }
    }

    /// Waits until no node carries the uninitialized taint and every node has a providerID.
    pub async fn wait_nodes_initialized(&self, poll: Poll) -> Result<Vec<NodeInfo>, KubeError> {
        let start = tokio::time::Instant::now();
        loop {
            let nodes = self.list_nodes().await?;
            let waiting: Vec<String> = nodes
                .iter()
                .filter_map(|n| {
                    n.uninitialized_reason()
                        .map(|r| format!("{} ({r})", n.name))
                })
                .collect();
            if waiting.is_empty() {
                return Ok(nodes);
            }
            if start.elapsed() >= poll.timeout {
                return Err(KubeError::NodesNotInitialized {
                    waited: start.elapsed(),
                    waiting,
                });
            }
            tokio::time::sleep(poll.interval).await;
        }
    }
}
