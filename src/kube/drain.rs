//! Draining a node as `kubectl drain` does, bounded and explicit when it gets stuck; plus the
//! node edits around it (uncordon, taints) and deleting the Node object.
//!
//! A drain cordons the node, sorts its pods (DaemonSet-owned, mirror and finished pods are
//! skipped; pods with emptyDir data or without a controller are refused unless allowed, all of
//! them listed before anything is evicted), evicts the rest through the eviction API in
//! parallel (a 429 from a PodDisruptionBudget is retried with back-off), and waits until the
//! evicted pods are gone. The whole drain, API calls included, ends at `timeout`; the error
//! then names every pod that would not leave and the budget that blocks each, or the
//! deletionTimestamp of a pod stuck Terminating.
//!
//! Caveats: the node stays cordoned whenever a drain fails (that is the safe state; the caller
//! decides whether to uncordon). A budget is found by selector among the budgets of the pod's
//! namespace, as the API server's eviction does; when several match, all are named. The
//! `deadline` of [`DrainOptions::eviction`] is not used: the drain's own `timeout` bounds the
//! retries; its back-off settings are.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams};
use serde::Serialize;
use tokio::time::Instant;

use super::nodes::{EvictOptions, Taint};
use super::{FIELD_MANAGER, Kube, KubeError, api_error};

/// The annotation the kubelet puts on the API copy of a static pod.
pub(crate) const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Evictions in flight at once: parallel like kubectl, without flooding the API server.
const EVICTION_CONCURRENCY: usize = 16;

/// How `drain` treats a node's pods and how long it may take.
#[derive(Debug, Clone)]
pub struct DrainOptions {
    /// The whole drain (cordon, evictions, waiting for the pods to go) ends by then.
    pub timeout: Duration,
    /// Evict pods with emptyDir volumes (their data is lost); refused otherwise.
    pub delete_emptydir_data: bool,
    /// Evict pods no controller owns (nothing re-creates them); refused otherwise.
    pub force_unmanaged: bool,
    /// How often to check whether evicted pods are gone.
    pub poll: Duration,
    /// Back-off while a disruption budget answers 429 (its `deadline` is not used: `timeout` is).
    pub eviction: EvictOptions,
}

impl Default for DrainOptions {
    fn default() -> Self {
        let timeout = Duration::from_secs(15 * 60);
        DrainOptions {
            timeout,
            delete_emptydir_data: false,
            force_unmanaged: false,
            poll: Duration::from_secs(2),
            eviction: EvictOptions {
                deadline: timeout,
                ..EvictOptions::default()
            },
        }
    }
}

/// What happens during a drain, for the caller to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainEvent {
    /// The node is marked unschedulable.
    Cordoned {
        /// The node's name.
        node: String,
    },
    /// A pod left alone (DaemonSet, mirror, finished).
    Skipped {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
        /// Why it stays.
        reason: SkipReason,
    },
    /// The first eviction request for a pod is about to be sent.
    Evicting {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
    },
    /// The eviction was refused for now (429); retried with back-off. Sent again only when the
    /// message changes.
    Blocked {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
        /// The PodDisruptionBudget(s) matching the pod, when any does.
        pdb: Option<String>,
        /// The API server's refusal.
        message: String,
    },
    /// The API server accepted the eviction (the pod may still be terminating).
    Evicted {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
    },
    /// Pods not gone yet (sent when the number changes).
    Waiting {
        /// How many evicted pods are still on the node.
        remaining: usize,
    },
}

/// Why a pod is left on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "camelCase")]
pub enum SkipReason {
    /// Owned by a DaemonSet (which would put it straight back).
    DaemonSet {
        /// The DaemonSet's name.
        name: String,
    },
    /// A static pod's API mirror: the kubelet runs it from a file, eviction cannot stop it.
    Mirror,
    /// Already Succeeded or Failed.
    Finished {
        /// `Succeeded` or `Failed`.
        phase: String,
    },
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::DaemonSet { name } => write!(f, "DaemonSet-managed ({name})"),
            SkipReason::Mirror => write!(f, "mirror pod of a static pod"),
            SkipReason::Finished { phase } => write!(f, "already {phase}"),
        }
    }
}

/// What a drain did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DrainReport {
    /// `namespace/name` of every pod evicted and gone.
    pub evicted: Vec<String>,
    /// `namespace/name` of every pod left alone, and why.
    pub skipped: Vec<(String, SkipReason)>,
}

/// A pod that did not leave before the drain's timeout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StuckPod {
    pub(crate) namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The PodDisruptionBudget(s) whose selector matches the pod, when an eviction was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pdb: Option<String>,
    /// The API server's last answer, or what the pod is waiting for.
    pub message: String,
    /// Set when the pod was evicted but is still Terminating.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<String>,
}

impl fmt::Display for StuckPod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.pod)?;
        if let Some(pdb) = &self.pdb {
            write!(f, " blocked by PodDisruptionBudget {pdb}")?;
        }
        write!(f, " ({})", self.message)
    }
}

/// Why a drain stopped.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// Pods were still on the node when `timeout` passed; the node stays cordoned.
    #[error(
        "draining node {node}: {} pod(s) did not leave within {}s: {}; the node stays cordoned",
        .stuck.len(), .waited.as_secs(), join(.stuck)
    )]
    Timeout {
        /// The node drained.
        node: String,
        /// How long the drain ran.
        waited: Duration,
        /// The pods that did not leave.
        stuck: Vec<StuckPod>,
    },
    /// Pods would be lost (emptyDir data, no controller) and the flag allowing it was not given;
    /// nothing was evicted.
    #[error(
        "draining node {node}: refused, evicting these pods would lose them: {}; nothing was \
         evicted and the node stays cordoned",
        .pods.iter().map(|(p, why)| format!("{p} ({why})")).collect::<Vec<_>>().join("; ")
    )]
    Refused {
        /// The node drained.
        node: String,
        /// `namespace/name` and why it is refused.
        pods: Vec<(String, String)>,
    },
    /// An API call of the drain failed.
    #[error(transparent)]
    Api(#[from] KubeError),
}

fn join(stuck: &[StuckPod]) -> String {
    stuck
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What a drain does with one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Evicted (and waited for).
    Evict,
    /// Left on the node, for this reason.
    Skip(SkipReason),
    /// Every reason it may not be evicted without a flag.
    Refuse(Vec<String>),
}

/// kubectl drain's filters, in its order: finished pods, mirror pods and DaemonSet pods are
/// skipped; unmanaged pods and pods with emptyDir volumes are refused unless allowed.
pub(crate) fn classify(
    pod: &Pod,
    delete_emptydir_data: bool,
    force_unmanaged: bool,
) -> Disposition {
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    if phase == "Succeeded" || phase == "Failed" {
        return Disposition::Skip(SkipReason::Finished {
            phase: phase.to_string(),
        });
    }
    if pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
    {
        return Disposition::Skip(SkipReason::Mirror);
    }
    let controller = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    if let Some(c) = controller
        && c.kind == "DaemonSet"
    {
        return Disposition::Skip(SkipReason::DaemonSet {
            name: c.name.clone(),
        });
    }
    let mut why = Vec::new();
    if controller.is_none() && !force_unmanaged {
        why.push(
            "not managed by a controller: nothing would re-create it (--force evicts it)"
                .to_string(),
        );
    }
    if !delete_emptydir_data {
        let volumes: Vec<&str> = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter(|v| v.empty_dir.is_some())
            .map(|v| v.name.as_str())
            .collect();
        if !volumes.is_empty() {
            why.push(format!(
                "emptyDir volume {}: its data would be lost (--delete-emptydir-data evicts it)",
                volumes.join(", ")
            ));
        }
    }
    if why.is_empty() {
        Disposition::Evict
    } else {
        Disposition::Refuse(why)
    }
}

/// Whether a PodDisruptionBudget's selector selects these labels. In policy/v1 an empty
/// selector selects every pod of the namespace; a missing one selects none.
pub(crate) fn selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(selector) = selector else {
        return false;
    };
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default(); // Exists/DoesNotExist carry no values
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            // An operator the API server would have rejected selects nothing.
            _ => false,
        }
    });
    by_labels && by_expressions
}

/// The names of the budgets (of the pod's namespace) that select the pod.
pub(crate) fn matching_pdbs(
    pdbs: &[PodDisruptionBudget],
    labels: &BTreeMap<String, String>,
) -> Vec<String> {
    pdbs.iter()
        .filter(|p| selector_matches(p.spec.as_ref().and_then(|s| s.selector.as_ref()), labels))
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

#[derive(Debug)]
enum State {
    ToEvict {
        next: Instant,
        backoff: Duration,
        attempted: bool,
        blocked: Option<(Option<String>, String)>,
    },
    Evicted {
        deletion_timestamp: Option<String>,
    },
    Gone,
}

#[derive(Debug)]
struct Tracked {
    namespace: String,
    name: String,
    uid: Option<String>,
    labels: BTreeMap<String, String>,
    state: State,
}

impl Tracked {
    fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn stuck(&self) -> Option<StuckPod> {
        let (pdb, message, deletion_timestamp) = match &self.state {
            State::Gone => return None,
            State::ToEvict {
                blocked: Some((pdb, message)),
                ..
            } => (pdb.clone(), message.clone(), None),
            State::ToEvict { .. } => (None, "eviction not accepted yet".to_string(), None),
            State::Evicted {
                deletion_timestamp: Some(t),
            } => (
                None,
                format!(
                    "evicted but still Terminating since {t}; a pod whose kubelet is gone never finishes terminating"
                ),
                Some(t.clone()),
            ),
            State::Evicted { .. } => (None, "evicted, not gone yet".to_string(), None),
        };
        Some(StuckPod {
            namespace: self.namespace.clone(),
            pod: self.name.clone(),
            pdb,
            message,
            deletion_timestamp,
        })
    }
}

enum Attempt {
    Accepted,
    Gone,
    Blocked(String),
}

/// A 429's message with the causes the API server gives (which budget, how many healthy).
fn blocked_message(status: &kube::core::Status) -> String {
    let causes: Vec<&str> = status
        .details
        .iter()
        .flat_map(|d| d.causes.iter())
        .map(|c| c.message.as_str())
        .filter(|m| !m.is_empty())
        .collect();
    if causes.is_empty() {
        status.message.clone()
    } else {
        format!("{} {}", status.message, causes.join("; "))
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

impl Kube {
    /// Marks a node schedulable again (kubectl uncordon).
    pub async fn uncordon(&self, node: &str) -> Result<(), KubeError> {
        let patch = serde_json::json!({ "spec": { "unschedulable": null } });
        self.patch_node(node, "uncordoning", &Patch::Merge(patch))
            .await
    }

    /// Adds (or updates) a taint; nothing is written when the node already carries it.
    /// A strategic merge patch keyed by the taint's key, so other taints are kept even when
    /// someone else edits them at the same time.
    pub async fn add_taint(&self, node: &str, taint: &Taint) -> Result<(), KubeError> {
        let present = self
            .carries(node, |t| {
                t.key == taint.key && t.effect == taint.effect && t.value == taint.value
            })
            .await?;
        if present {
            return Ok(());
        }
        let patch = serde_json::json!({ "spec": { "taints": [taint] } });
        self.patch_node(node, "tainting", &Patch::Strategic(patch))
            .await
    }

    /// Removes every taint with this key (no-op when there is none).
    pub async fn remove_taint(&self, node: &str, key: &str) -> Result<(), KubeError> {
        if !self.carries(node, |t| t.key == key).await? {
            return Ok(());
        }
        let patch =
            serde_json::json!({ "spec": { "taints": [ { "key": key, "$patch": "delete" } ] } });
        self.patch_node(node, "removing a taint from", &Patch::Strategic(patch))
            .await
    }

    /// Whether the node carries a taint that `matches` (a node without `spec.taints` has
    /// none).
    async fn carries(
        &self,
        node: &str,
        matches: impl Fn(&k8s_openapi::api::core::v1::Taint) -> bool,
    ) -> Result<bool, KubeError> {
        let current = Api::<Node>::all(self.client.clone())
            .get(node)
            .await
            .map_err(|e| api_error(&self.server, "reading", &format!("node {node}"), e))?;
        let taints = current.spec.and_then(|s| s.taints).unwrap_or_default(); // no spec or no taints: none
        Ok(taints.iter().any(matches))
    }

    /// Patches the Node object; `doing` names the change in an error.
    async fn patch_node(
        &self,
        node: &str,
        doing: &'static str,
        patch: &Patch<serde_json::Value>,
    ) -> Result<(), KubeError> {
        Api::<Node>::all(self.client.clone())
            .patch(node, &patch_params(), patch)
            .await
            .map_err(|e| api_error(&self.server, doing, &format!("node {node}"), e))?;
        Ok(())
    }

    /// Deletes the Node object; a node already gone counts as deleted.
    pub async fn delete_node(&self, node: &str) -> Result<(), KubeError> {
        let api: Api<Node> = Api::all(self.client.clone());
        match api.delete(node, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(api_error(
                &self.server,
                "deleting",
                &format!("node {node}"),
                e,
            )),
        }
    }

    /// What a drain of `node` would do to each pod now, without changing anything: the
    /// preview of `delete instance` and `rolling-update`.
    pub(crate) async fn drain_preview(
        &self,
        node: &str,
        options: &DrainOptions,
    ) -> Result<Vec<(String, Disposition)>, KubeError> {
        let pods = self.pods_on_node(node).await?;
        Ok(pods
            .iter()
            .map(|p| {
                (
                    format!(
                        "{}/{}",
                        p.metadata.namespace.as_deref().unwrap_or("default"),
                        p.metadata.name.as_deref().unwrap_or_default() // the API names every pod it lists
                    ),
                    classify(p, options.delete_emptydir_data, options.force_unmanaged),
                )
            })
            .collect())
    }

    /// Drains `node` (see the module docs). The node stays cordoned whatever the outcome.
    pub async fn drain(
        &self,
        node: &str,
        options: &DrainOptions,
        events: &(dyn Fn(&DrainEvent) + Send + Sync),
    ) -> Result<DrainReport, DrainError> {
        let start = Instant::now();
        let deadline = start + options.timeout;
        let timeout = |tracked: &[Tracked]| DrainError::Timeout {
            node: node.to_string(),
            waited: start.elapsed(),
            stuck: tracked.iter().filter_map(Tracked::stuck).collect(),
        };
        // Every call is bounded by the drain's deadline, not only the waits between them.
        match tokio::time::timeout_at(deadline, self.cordon(node)).await {
            Ok(r) => r?,
            Err(_) => return Err(timeout(&[])),
        }
        events(&DrainEvent::Cordoned {
            node: node.to_string(),
        });
        let pods = match tokio::time::timeout_at(deadline, self.pods_on_node(node)).await {
            Ok(r) => r?,
            Err(_) => return Err(timeout(&[])),
        };
        let mut report = DrainReport::default();
        let mut refused = Vec::new();
        let mut tracked = Vec::new();
        for pod in &pods {
            let namespace = pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into());
            let name = pod.metadata.name.clone().unwrap_or_default(); // the API names every pod it lists
            let id = format!("{namespace}/{name}");
            match classify(pod, options.delete_emptydir_data, options.force_unmanaged) {
                Disposition::Skip(reason) => {
                    events(&DrainEvent::Skipped {
                        namespace,
                        pod: name,
                        reason: reason.clone(),
                    });
                    report.skipped.push((id, reason));
                }
                Disposition::Refuse(why) => refused.push((id, why.join("; "))),
                Disposition::Evict => tracked.push(Tracked {
                    namespace,
                    name,
                    uid: pod.metadata.uid.clone(),
                    labels: pod.metadata.labels.clone().unwrap_or_default(), // no labels: no selector matches
                    state: State::ToEvict {
                        next: start,
                        backoff: options.eviction.initial_backoff,
                        attempted: false,
                        blocked: None,
                    },
                }),
            }
        }
        if !refused.is_empty() {
            return Err(DrainError::Refused {
                node: node.to_string(),
                pods: refused,
            });
        }
        let mut pdb_cache: BTreeMap<String, Vec<PodDisruptionBudget>> = BTreeMap::new();
        let mut last_remaining = None;
        loop {
            let now = Instant::now();
            let due: Vec<usize> = tracked
                .iter()
                .enumerate()
                .filter(|(_, t)| matches!(t.state, State::ToEvict { next, .. } if next <= now))
                .map(|(i, _)| i)
                .collect();
            for &i in &due {
                if let State::ToEvict {
                    attempted: attempted @ false,
                    ..
                } = &mut tracked[i].state
                {
                    *attempted = true;
                    events(&DrainEvent::Evicting {
                        namespace: tracked[i].namespace.clone(),
                        pod: tracked[i].name.clone(),
                    });
                }
            }
            let requests: Vec<(usize, Api<Pod>, String)> = due
                .iter()
                .map(|&i| {
                    let t = &tracked[i];
                    (
                        i,
                        Api::namespaced(self.client.clone(), &t.namespace),
                        t.name.clone(),
                    )
                })
                .collect();
            let attempts = stream::iter(requests)
                .map(|(i, api, name)| async move {
                    let r = match api.evict(&name, &EvictParams::default()).await {
                        Ok(_) => Ok(Attempt::Accepted),
                        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Attempt::Gone),
                        Err(kube::Error::Api(s)) if s.code == 429 => {
                            Ok(Attempt::Blocked(blocked_message(&s)))
                        }
                        Err(e) => Err(e),
                    };
                    (i, r)
                })
                .buffer_unordered(EVICTION_CONCURRENCY)
                .collect::<Vec<_>>();
            let attempts = match tokio::time::timeout_at(deadline, attempts).await {
                Ok(a) => a,
                Err(_) => return Err(timeout(&tracked)),
            };
            for (i, attempt) in attempts {
                let t = &mut tracked[i];
                let attempt = attempt.map_err(|e| {
                    api_error(
                        &self.server,
                        "evicting",
                        &format!("pod {}/{}", t.namespace, t.name),
                        e,
                    )
                })?;
                match attempt {
                    Attempt::Accepted => {
                        events(&DrainEvent::Evicted {
                            namespace: t.namespace.clone(),
                            pod: t.name.clone(),
                        });
                        t.state = State::Evicted {
                            deletion_timestamp: None,
                        };
                    }
                    Attempt::Gone => {
                        report.evicted.push(t.id());
                        t.state = State::Gone;
                    }
                    Attempt::Blocked(message) => {
                        let pdb = if let State::ToEvict {
                            blocked: Some((pdb, _)),
                            ..
                        } = &t.state
                        {
                            pdb.clone()
                        } else {
                            // The budget is looked up once per pod, by selector, in its namespace.
                            if !pdb_cache.contains_key(&t.namespace) {
                                let api: Api<PodDisruptionBudget> =
                                    Api::namespaced(self.client.clone(), &t.namespace);
                                let listed = match tokio::time::timeout_at(
                                    deadline,
                                    self.list_all(&api, &ListParams::default()),
                                )
                                .await
                                {
                                    Ok(Ok(l)) => l,
                                    // Naming the budget is a courtesy: a client that may not
                                    // list budgets still drains (the message says why).
                                    Ok(Err(e)) => {
                                        tracing::debug!(%e, "listing PodDisruptionBudgets");
                                        Vec::new()
                                    }
                                    Err(_) => return Err(timeout(&tracked)),
                                };
                                pdb_cache.insert(t.namespace.clone(), listed);
                            }
                            let names = matching_pdbs(
                                pdb_cache.get(&t.namespace).map_or(&[], Vec::as_slice),
                                &t.labels,
                            );
                            (!names.is_empty()).then(|| {
                                names
                                    .iter()
                                    .map(|n| format!("{}/{n}", t.namespace))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            })
                        };
                        if let State::ToEvict {
                            next,
                            backoff,
                            blocked,
                            ..
                        } = &mut t.state
                        {
                            let changed = blocked.as_ref().is_none_or(|(_, m)| *m != message);
                            if changed {
                                events(&DrainEvent::Blocked {
                                    namespace: t.namespace.clone(),
                                    pod: t.name.clone(),
                                    pdb: pdb.clone(),
                                    message: message.clone(),
                                });
                            }
                            *blocked = Some((pdb, message));
                            *next = Instant::now() + *backoff;
                            *backoff = (*backoff * 2).min(options.eviction.max_backoff);
                        }
                    }
                }
            }
            if tracked
                .iter()
                .any(|t| matches!(t.state, State::Evicted { .. }))
            {
                let on_node = match tokio::time::timeout_at(deadline, self.pods_on_node(node)).await
                {
                    Ok(r) => r?,
                    Err(_) => return Err(timeout(&tracked)),
                };
                for t in tracked
                    .iter_mut()
                    .filter(|t| matches!(t.state, State::Evicted { .. }))
                {
                    // Same name and same UID: still the pod we evicted (a StatefulSet's
                    // replacement has the name but not the UID).
                    let still = on_node.iter().find(|p| {
                        p.metadata.namespace.as_deref() == Some(&t.namespace)
                            && p.metadata.name.as_deref() == Some(&t.name)
                            && p.metadata.uid == t.uid
                    });
                    match still {
                        Some(p) => {
                            t.state = State::Evicted {
                                deletion_timestamp: p
                                    .metadata
                                    .deletion_timestamp
                                    .as_ref()
                                    .map(|ts| ts.0.to_string()),
                            }
                        }
                        None => {
                            report.evicted.push(t.id());
                            t.state = State::Gone;
                        }
                    }
                }
            }
            let remaining = tracked
                .iter()
                .filter(|t| !matches!(t.state, State::Gone))
                .count();
            if remaining == 0 {
                return Ok(report);
            }
            if last_remaining != Some(remaining) {
                events(&DrainEvent::Waiting { remaining });
                last_remaining = Some(remaining);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(timeout(&tracked));
            }
            let next_eviction = tracked
                .iter()
                .filter_map(|t| match t.state {
                    State::ToEvict { next, .. } => Some(next),
                    _ => None,
                })
                .min();
            let mut wake = deadline.min(now + options.poll);
            if let Some(n) = next_eviction {
                wake = wake.min(n.max(now));
            }
            tokio::time::sleep_until(wake).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn owned(kind: &str) -> serde_json::Value {
        json!([{ "apiVersion": "apps/v1", "kind": kind, "name": "owner", "uid": "u1", "controller": true }])
    }

    #[test]
    fn finished_mirror_and_daemonset_pods_are_skipped() {
        let done = pod(json!({"metadata": {"name": "job"}, "status": {"phase": "Succeeded"}}));
        assert_eq!(
            classify(&done, false, false),
            Disposition::Skip(SkipReason::Finished {
                phase: "Succeeded".into()
            })
        );
        let failed = pod(json!({"metadata": {"name": "job"}, "status": {"phase": "Failed"}}));
        assert!(matches!(
            classify(&failed, false, false),
            Disposition::Skip(SkipReason::Finished { .. })
        ));
        let mirror = pod(json!({"metadata": {"name": "kube-apiserver-cp1",
            "annotations": {MIRROR_ANNOTATION: "abc"}}, "status": {"phase": "Running"}}));
        assert_eq!(
            classify(&mirror, false, false),
            Disposition::Skip(SkipReason::Mirror)
        );
        let ds = pod(
            json!({"metadata": {"name": "calico-node-x", "ownerReferences": owned("DaemonSet")},
            "spec": {"containers": [], "volumes": [{"name": "tmp", "emptyDir": {}}]},
            "status": {"phase": "Running"}}),
        );
        assert_eq!(
            classify(&ds, false, false),
            Disposition::Skip(SkipReason::DaemonSet {
                name: "owner".into()
            })
        );
    }

    #[test]
    fn unmanaged_and_emptydir_pods_are_refused_with_every_reason_unless_allowed() {
        let bare = pod(json!({"metadata": {"name": "scratch"},
            "spec": {"containers": [], "volumes": [{"name": "cache", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "c"}}]},
            "status": {"phase": "Running"}}));
        let Disposition::Refuse(why) = classify(&bare, false, false) else {
            panic!("not refused")
        };
        assert_eq!(why.len(), 2, "{why:?}");
        assert!(why[0].contains("not managed by a controller"), "{why:?}");
        assert!(why[1].contains("emptyDir volume cache"), "{why:?}");
        assert!(!why[1].contains("cfg"), "{why:?}");
        let Disposition::Refuse(why) = classify(&bare, true, false) else {
            panic!("not refused")
        };
        assert_eq!(why.len(), 1);
        assert!(matches!(classify(&bare, false, true), Disposition::Refuse(w) if w.len() == 1));
        assert_eq!(classify(&bare, true, true), Disposition::Evict);
        // A non-controller owner reference does not make a pod managed.
        let loose = pod(json!({"metadata": {"name": "p", "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "u"}]},
            "status": {"phase": "Running"}}));
        assert!(matches!(
            classify(&loose, false, false),
            Disposition::Refuse(_)
        ));
        let rs = pod(
            json!({"metadata": {"name": "web-1", "ownerReferences": owned("ReplicaSet")},
            "status": {"phase": "Running"}}),
        );
        assert_eq!(classify(&rs, false, false), Disposition::Evict);
        // Pending pods are evicted too (a budget does not protect them).
        let pending = pod(
            json!({"metadata": {"name": "web-2", "ownerReferences": owned("ReplicaSet")},
            "status": {"phase": "Pending"}}),
        );
        assert_eq!(classify(&pending, false, false), Disposition::Evict);
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn selector(v: serde_json::Value) -> LabelSelector {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn budget_selectors_match_like_the_api_server() {
        let web = labels(&[("app", "web"), ("tier", "front")]);
        assert!(selector_matches(
            Some(&selector(json!({"matchLabels": {"app": "web"}}))),
            &web
        ));
        assert!(!selector_matches(
            Some(&selector(json!({"matchLabels": {"app": "db"}}))),
            &web
        ));
        // policy/v1: an empty selector selects every pod of the namespace, none selects none.
        assert!(selector_matches(Some(&selector(json!({}))), &web));
        assert!(!selector_matches(None, &web));
        let expr = |op: &str, values: &[&str]| {
            selector(
                json!({"matchExpressions": [{"key": "tier", "operator": op, "values": values}]}),
            )
        };
        assert!(selector_matches(
            Some(&expr("In", &["front", "back"])),
            &web
        ));
        assert!(!selector_matches(Some(&expr("In", &["back"])), &web));
        assert!(selector_matches(Some(&expr("NotIn", &["back"])), &web));
        assert!(!selector_matches(Some(&expr("NotIn", &["front"])), &web));
        assert!(selector_matches(Some(&expr("Exists", &[])), &web));
        assert!(!selector_matches(Some(&expr("DoesNotExist", &[])), &web));
        assert!(selector_matches(
            Some(&expr("NotIn", &["x"])),
            &labels(&[("app", "web")])
        ));
        assert!(!selector_matches(Some(&expr("Bogus", &[])), &web));
        // Labels and expressions must both hold.
        let both = selector(json!({"matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["back"]}]}));
        assert!(!selector_matches(Some(&both), &web));
    }

    #[test]
    fn every_matching_budget_is_named() {
        let pdb = |name: &str, sel: serde_json::Value| -> PodDisruptionBudget {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
                "spec": {"selector": sel}}))
            .unwrap()
        };
        let pdbs = [
            pdb("web", json!({"matchLabels": {"app": "web"}})),
            pdb("db", json!({"matchLabels": {"app": "db"}})),
            pdb("all", json!({})),
        ];
        assert_eq!(
            matching_pdbs(&pdbs, &labels(&[("app", "web")])),
            ["web", "all"]
        );
    }

    #[test]
    fn the_timeout_error_names_node_pods_budgets_and_deletion_times() {
        let e = DrainError::Timeout {
            node: "w1".into(),
            waited: Duration::from_secs(900),
            stuck: vec![
                StuckPod {
                    namespace: "default".into(),
                    pod: "web-1".into(),
                    pdb: Some("default/web".into()),
                    message: "Cannot evict pod".into(),
                    deletion_timestamp: None,
                },
                StuckPod {
                    namespace: "db".into(),
                    pod: "pg-0".into(),
                    pdb: None,
                    message: "evicted but still Terminating since 2026-01-01T00:00:00Z".into(),
                    deletion_timestamp: Some("2026-01-01T00:00:00Z".into()),
                },
            ],
        }
        .to_string();
        assert_eq!(
            e,
            "draining node w1: 2 pod(s) did not leave within 900s: default/web-1 blocked by \
             PodDisruptionBudget default/web (Cannot evict pod); db/pg-0 (evicted but still \
             Terminating since 2026-01-01T00:00:00Z); the node stays cordoned"
        );
    }
}
