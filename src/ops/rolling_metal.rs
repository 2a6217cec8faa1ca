//! The machine side of a roll on bare metal: a member re-provisioned in place over SSH.
//!
//! Per node, in order: the host is claimed again (a host whose ownership marker names another
//! cluster is refused before anything changes); for a Kubernetes version change kubeadm's
//! upgrade (the new kubeadm from the pinned assets, `kubeadm upgrade apply vX` on the first
//! control plane or `kubeadm upgrade node`, the new kubelet and kubectl, the kubelet
//! restarted); what a member's settle runs (API endpoint line, local proxy); the kubelet's
//! flags rewritten (restarted when they changed); the labels and taints the spec gives it
//! applied to its Node through the API (the kubelet only sets them when it registers); and the
//! provisioning record rewritten last, so it never claims more than was done.
//!
//! Every step checks before it acts, so the engine may call [`MetalRoller::roll`] again for a
//! node whose previous attempt was cut.
//!
//! Caveat: labels and taints need the cluster's API; under `--cloudonly` (no API) a node
//! whose labels or taints changed fails with that reason instead of being recorded as done.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Map, Value};

use super::rolling::NodeRoller;
use crate::inventory::parse_taint;
use crate::kube::{Kube, Taint};
use crate::nodes::Target;
use crate::nodes::journal::JournalNode;
use crate::nodes::owner::Owner;
use crate::nodes::roll::{PROVISIONED_FILE, Provisioned};
use crate::provision::orchestrate::Facts;
use crate::provision::render::{self, Renderer};
use crate::ssh::task::{HostExecutor, Step};

pub struct MetalRoller {
    exec: Arc<dyn HostExecutor>,
    renderer: Renderer,
    targets: Vec<Target>,
    owner: Owner,
    /// `None` under `--cloudonly`.
    kube: Option<Kube>,
}

impl MetalRoller {
    pub fn new(
        exec: Arc<dyn HostExecutor>,
        renderer: Renderer,
        targets: Vec<Target>,
        owner: Owner,
        kube: Option<Kube>,
    ) -> MetalRoller {
        MetalRoller {
            exec,
            renderer,
            targets,
            owner,
            kube,
        }
    }

    /// The steps of `node` on `target`, record excluded (it goes last, after the API).
    async fn steps(&self, node: &JournalNode, target: &Target) -> Result<Vec<Step>, String> {
        let mut steps = vec![self.renderer.claim(&self.owner)];
        if let Some(how) = node.upgrade {
            let facts = self
                .exec
                .read_file(target.name(), render::FACTS_FILE)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| {
                    format!(
                        "{}: no {} (it was never provisioned by kprov)",
                        target.name(),
                        render::FACTS_FILE
                    )
                })?;
            let facts = Facts::parse(&String::from_utf8_lossy(&facts));
            let arch = facts.arch().ok_or_else(|| {
                format!(
                    "{}: unsupported architecture {:?}",
                    target.name(),
                    facts.machine
                )
            })?;
            steps.extend(
                self.renderer
                    .upgrade(arch, how)
                    .map_err(|e| e.to_string())?,
            );
        }
        steps.extend(self.renderer.settle(target).map_err(|e| e.to_string())?);
        steps.push(
            self.renderer
                .kubelet_flags(target)
                .map_err(|e| e.to_string())?,
        );
        Ok(steps)
    }

    /// Makes the Node carry the spec's labels and taints, removing those a previous
    /// provisioning set that the spec no longer gives (others' labels and taints are kept).
    async fn labels_and_taints(
        &self,
        node: &str,
        old: Option<&Provisioned>,
        new: &Provisioned,
    ) -> Result<(), String> {
        let (old_labels, old_taints) = match old {
            Some(o) => (o.labels.clone(), o.taints.clone()),
            None => Default::default(),
        };
        let mut labels = Map::new();
        for k in old_labels.keys().filter(|k| !new.labels.contains_key(*k)) {
            labels.insert(k.clone(), Value::Null);
        }
        for (k, v) in &new.labels {
            if old_labels.get(k) != Some(v) {
                labels.insert(k.clone(), Value::String(v.clone()));
            }
        }
        let parse = |t: &String| parse_taint(t).map_err(|e| format!("taint {t:?}: {e}"));
        let new_taints = new
            .taints
            .iter()
            .map(parse)
            .collect::<Result<Vec<_>, _>>()?;
        let gone: Vec<String> = old_taints
            .iter()
            .filter(|t| !new.taints.contains(t))
            .map(parse)
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .map(|t| t.key)
            .filter(|k| !new_taints.iter().any(|n| &n.key == k))
            .collect();
        let changed_taints = new.taints.iter().any(|t| !old_taints.contains(t)) || !gone.is_empty();
        if labels.is_empty() && !changed_taints {
            return Ok(());
        }
        let Some(kube) = &self.kube else {
            return Err(format!(
                "node {node}: its labels or taints changed and applying them needs the cluster's API, which --cloudonly does not use"
            ));
        };
        if !labels.is_empty() {
            let api: Api<Node> = Api::all(kube.client().clone());
            let patch = serde_json::json!({ "metadata": { "labels": labels } });
            api.patch(
                node,
                &PatchParams::apply(crate::kube::FIELD_MANAGER),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| format!("labelling node {node}: {e}"))?;
        }
        for key in &gone {
            kube.remove_taint(node, key)
                .await
                .map_err(|e| e.to_string())?;
        }
        for t in new_taints {
            let taint = Taint {
                key: t.key,
                value: t.value,
                effect: t.effect,
            };
            kube.add_taint(node, &taint)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

#[async_trait]
impl NodeRoller for MetalRoller {
    async fn roll(&self, node: &JournalNode) -> Result<Option<String>, String> {
        // Only hosts of this cluster's spec; the claim step below refuses another cluster's.
        let target = self
            .targets
            .iter()
            .find(|t| t.name() == node.target)
            .ok_or_else(|| {
                format!(
                    "{}: not a host of this cluster's spec any more; nothing was changed on it",
                    node.target
                )
            })?;
        let old = match self.exec.read_file(target.name(), PROVISIONED_FILE).await {
            Ok(Some(bytes)) => Provisioned::parse(&bytes).ok(),
            Ok(None) => None,
            Err(e) => return Err(e.to_string()),
        };
        let new = self
            .renderer
            .provisioned(target)
            .map_err(|e| e.to_string())?;
        let steps = self.steps(node, target).await?;
        self.exec
            .run_steps(target.name(), &steps)
            .await
            .map_err(|e| e.to_string())?;
        self.labels_and_taints(&target.node_name, old.as_ref(), &new)
            .await?;
        let record = self.renderer.record(target).map_err(|e| e.to_string())?;
        self.exec
            .run_steps(target.name(), &[record])
            .await
            .map_err(|e| e.to_string())?;
        Ok(None)
    }
}
