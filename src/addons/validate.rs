//! `kprov validate cluster`: are the expected nodes registered, Ready and initialised (no
//! `node.cloudprovider.kubernetes.io/uninitialized` taint left), are the kube-system pods of
//! the CCM, the pod network and CoreDNS running, and does every Deployment and DaemonSet in
//! kube-system have the pods it wants available? The rolling update's validation gate runs
//! the same checks (and asks etcd, `ops::etcd::assess`).
//!
//! As kops's validation does, every kube-system pod with the `system-cluster-critical` or
//! `system-node-critical` priority class must be running and ready: on a kubeadm cluster that
//! covers the control-plane static pods (API server, controller manager, scheduler, etcd),
//! kube-proxy and CoreDNS.
//!
//! Caveat: a critical pod being deleted (Terminating) is not counted: its replacement is what
//! must come up, and a pod left on a node that is gone may stay Terminating for long.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Resource};
use serde::Serialize;

use super::AddonError;
use super::ccm::cluster_provider;
use crate::kube::{Kube, NodeInfo, Poll, UNINITIALIZED_TAINT};
use crate::spec::{Cluster, Cni, HostRole, InstanceGroup, InstanceGroupRole};

/// What a healthy cluster has, derived from the spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Expectations {
    /// Nodes known by name (bare-metal hosts): (name, control plane).
    pub named: Vec<(String, bool)>,
    /// How many control-plane nodes must be Ready at least.
    pub min_control_plane: u32,
    /// All nodes, control plane included.
    pub min_nodes: u32,
    /// True when a cloud-controller-manager must be running.
    pub ccm: bool,
    /// The pod network whose pods must run on every node (`calico`, ...); `None` when the
    /// spec's CNI is `none` or unset: not checked.
    pub cni: Option<String>,
}

/// One system pod group validate looks for: (what, namespace, label selector, per node).
struct PodCheck {
    what: &'static str,
    namespace: &'static str,
    selector: &'static str,
    /// DaemonSets of the pod network must run on every node.
    every_node: bool,
}

impl Expectations {
    /// What `validate cluster` expects of this spec: the nodes it names and the system pods its CCM
    /// and CNI run.
    pub fn from_spec(cluster: &Cluster, groups: &[InstanceGroup]) -> Result<Self, AddonError> {
        let mut named = Vec::new();
        for h in &cluster.spec.hosts {
            let cp = h.roles.contains(&HostRole::ControlPlane);
            if cp || h.roles.contains(&HostRole::Node) {
                named.push((h.name.clone(), cp));
            }
        }
        // Where hosts are listed (metal) they are the nodes; instance groups only group them
        // (their sizes count the same hosts again). Cloud groups add nodes with no name yet.
        let count = |role: InstanceGroupRole| -> u32 {
            if !cluster.spec.hosts.is_empty() {
                return 0;
            }
            u32::try_from(crate::spec::total_min_size(groups, role)).unwrap_or(u32::MAX)
        };
        let named_cp = named.iter().filter(|(_, cp)| *cp).count() as u32;
        let min_control_plane = named_cp.saturating_add(count(InstanceGroupRole::ControlPlane));
        let min_nodes = (named.len() as u32)
            .saturating_add(min_control_plane - named_cp)
            .saturating_add(count(InstanceGroupRole::Node));
        Ok(Self {
            named,
            min_control_plane,
            min_nodes,
            ccm: cluster_provider(cluster)?.is_some(),
            cni: cluster
                .spec
                .networking
                .cni
                .filter(|c| *c != Cni::None)
                .map(|c| c.as_str().to_string()),
        })
    }

    fn pod_checks(&self) -> Vec<PodCheck> {
        let mut checks = vec![PodCheck {
            what: "CoreDNS",
            namespace: "kube-system",
            selector: "k8s-app=kube-dns",
            every_node: false,
        }];
        if self.ccm {
            checks.push(PodCheck {
                what: "cloud-controller-manager",
                namespace: "kube-system",
                selector: "k8s-app=cloud-controller-manager",
                every_node: false,
            });
        }
        let cni = match self.cni.as_deref() {
            Some("calico") => Some(("calico-node", "kube-system", "k8s-app=calico-node")),
            Some("cilium") => Some(("cilium", "kube-system", "k8s-app=cilium")),
            Some("flannel") => Some(("flannel", "kube-flannel", "app=flannel")),
            _ => None,
        };
        if let Some((what, namespace, selector)) = cni {
            checks.push(PodCheck {
                what,
                namespace,
                selector,
                every_node: true,
            });
        }
        checks
    }
}

/// One thing `validate cluster` found wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// `node`, `pod` or `cluster`.
    pub(crate) kind: &'static str,
    pub(crate) name: String,
    /// What is wrong, for the operator (`is not Ready`).
    pub message: String,
}

/// The result `validate cluster` prints (and `-o json` serialises).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ValidationResult {
    pub(crate) cluster: String,
    /// True when nothing failed.
    pub ok: bool,
    pub(crate) nodes: Vec<NodeInfo>,
    /// Every failure found; empty when `ok`.
    pub failures: Vec<Failure>,
}

impl ValidationResult {
    /// Human text: one line per node, then each failure.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            out.push_str(&format!(
                "node {}\t{}\t{}\n",
                n.name,
                if n.control_plane {
                    "control-plane"
                } else {
                    "node"
                },
                if n.ready { "Ready" } else { "NotReady" }
            ));
        }
        if self.ok {
            out.push_str(&format!("cluster {} is valid\n", self.cluster));
        } else {
            out.push_str(&format!(
                "cluster {} is not valid: {} failure(s)\n",
                self.cluster,
                self.failures.len()
            ));
            for f in &self.failures {
                out.push_str(&format!("  {} {}: {}\n", f.kind, f.name, f.message));
            }
        }
        out
    }
}

fn pod_problem(pod: &Pod) -> Option<String> {
    let status = pod.status.clone().unwrap_or_default(); // no status yet: phase Unknown, reported
    let phase = status.phase.unwrap_or_else(|| "Unknown".into());
    if phase != "Running" {
        return Some(format!("is {phase}"));
    }
    let not_ready: Vec<String> = status
        .container_statuses
        .unwrap_or_default() // none reported yet: no container to name
        .into_iter()
        .filter(|c| !c.ready)
        .map(|c| c.name)
        .collect();
    (!not_ready.is_empty()).then(|| format!("is Running but not ready ({})", not_ready.join(", ")))
}

/// Why a Deployment has fewer available replicas than it wants (`spec.replicas`, 1 unset).
fn deployment_unavailable(d: &Deployment) -> Option<String> {
    let want = d.spec.replicas.unwrap_or(1);
    let available = d
        .status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0);
    (available < want).then(|| format!("{available} of {want} replicas available"))
}

/// Why a DaemonSet has fewer available pods than nodes it should run on.
fn daemonset_unavailable(ds: &DaemonSet) -> Option<String> {
    let status = ds.status.clone().unwrap_or_default(); // no status yet: nothing counted, so nothing to report
    let want = status.desired_number_scheduled;
    let available = status.number_available.unwrap_or(0);
    (available < want).then(|| format!("{available} of {want} pods available"))
}

/// The priority classes that mark the pods a cluster cannot do without (kops validates
/// these): the control-plane static pods, kube-proxy, CoreDNS, the pod network.
const CRITICAL_PRIORITY_CLASSES: [&str; 2] = ["system-cluster-critical", "system-node-critical"];

/// Why a critical kube-system pod is not serving, if it is one; `None` for other pods, those
/// that finished (Succeeded) and those being deleted.
fn critical_pod_problem(pod: &Pod) -> Option<String> {
    let class = pod.spec.as_ref()?.priority_class_name.as_deref()?;
    if !CRITICAL_PRIORITY_CLASSES.contains(&class) || pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase == Some("Succeeded") {
        return None;
    }
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("no node yet");
    pod_problem(pod).map(|p| format!("{class} pod (on {node}) {p}"))
}

/// kube-system's critical pods that are not running and ready, and its Deployments and
/// DaemonSets that lack available pods.
async fn workload_failures(kube: &Kube) -> Result<Vec<Failure>, AddonError> {
    let pods = kube.list_pods(Some(NS), &ListParams::default()).await?;
    let mut out = failing("pod", &pods, critical_pod_problem);
    out.extend(unavailable::<Deployment>(kube, "deployment", deployment_unavailable).await?);
    out.extend(unavailable::<DaemonSet>(kube, "daemonset", daemonset_unavailable).await?);
    Ok(out)
}

/// The namespace whose workloads validation checks.
const NS: &str = "kube-system";

/// The workloads of one kind in [`NS`] that `problem` finds without the pods they want.
async fn unavailable<K>(
    kube: &Kube,
    kind: &'static str,
    problem: fn(&K) -> Option<String>,
) -> Result<Vec<Failure>, AddonError>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(kube.client().clone(), NS);
    let objects = kube.list_all(&api, &ListParams::default()).await?;
    Ok(failing(kind, &objects, problem))
}

/// A failure of `kind` for each of `objects` (in [`NS`]) that `problem` finds fault with.
fn failing<K: Resource>(
    kind: &'static str,
    objects: &[K],
    problem: fn(&K) -> Option<String>,
) -> Vec<Failure> {
    objects
        .iter()
        .filter_map(|o| {
            problem(o).map(|message| Failure {
                kind,
                name: format!("{NS}/{}", o.meta().name.as_deref().unwrap_or("?")),
                message,
            })
        })
        .collect()
}

/// One validation pass against the live cluster.
pub async fn validate_cluster(
    kube: &Kube,
    cluster: &Cluster,
    expect: &Expectations,
) -> Result<ValidationResult, AddonError> {
    let nodes = kube.list_nodes().await?;
    let mut failures = Vec::new();
    let fail = |kind: &'static str, name: &str, message: String| Failure {
        kind,
        name: name.to_string(),
        message,
    };
    let registered: BTreeSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    for (name, cp) in &expect.named {
        if !registered.contains(name.as_str()) {
            failures.push(fail(
                "node",
                name,
                format!(
                    "expected {} is not registered",
                    if *cp { "control-plane node" } else { "node" }
                ),
            ));
        }
    }
    let cp = nodes.iter().filter(|n| n.control_plane).count() as u32;
    if cp < expect.min_control_plane {
        failures.push(fail(
            "cluster",
            cluster.name(),
            format!(
                "{cp} control-plane node(s) registered, {} expected",
                expect.min_control_plane
            ),
        ));
    }
    if (nodes.len() as u32) < expect.min_nodes {
        failures.push(fail(
            "cluster",
            cluster.name(),
            format!(
                "{} node(s) registered, {} expected",
                nodes.len(),
                expect.min_nodes
            ),
        ));
    }
    for n in &nodes {
        if !n.ready {
            failures.push(fail("node", &n.name, "is not Ready".into()));
        }
        if n.has_taint(UNINITIALIZED_TAINT) {
            failures.push(fail(
                "node",
                &n.name,
                format!("still has the {UNINITIALIZED_TAINT} taint (not initialised by the cloud-controller-manager)"),
            ));
        }
    }
    for check in expect.pod_checks() {
        let pods = kube
            .list_pods(
                Some(check.namespace),
                &ListParams::default().labels(check.selector),
            )
            .await?;
        if pods.is_empty() {
            failures.push(fail(
                "pod",
                check.what,
                format!("no pod in {} matches {}", check.namespace, check.selector),
            ));
            continue;
        }
        let mut running_on = BTreeSet::new();
        for pod in &pods {
            let name = format!(
                "{}/{}",
                check.namespace,
                pod.metadata.name.as_deref().unwrap_or("?")
            );
            match pod_problem(pod) {
                Some(problem) => {
                    failures.push(fail("pod", &name, format!("{} pod {problem}", check.what)))
                }
                None => {
                    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
                        running_on.insert(node.to_string());
                    }
                }
            }
        }
        if check.every_node {
            for n in &nodes {
                if !running_on.contains(&n.name) {
                    failures.push(fail(
                        "node",
                        &n.name,
                        format!(
                            "no running {} pod (the pod network is not up there)",
                            check.what
                        ),
                    ));
                }
            }
        }
    }
    failures.extend(workload_failures(kube).await?);
    Ok(ValidationResult {
        cluster: cluster.name().to_string(),
        ok: failures.is_empty(),
        nodes,
        failures,
    })
}

/// Validates until the cluster passes or the wait expires; returns the last result either
/// way (the CLI exits non-zero when it is not ok).
pub async fn validate_until(
    kube: &Kube,
    cluster: &Cluster,
    expect: &Expectations,
    poll: Poll,
) -> Result<ValidationResult, AddonError> {
    let start = tokio::time::Instant::now();
    loop {
        let result = validate_cluster(kube, cluster, expect).await?;
        if result.ok || start.elapsed() >= poll.timeout {
            return Ok(result);
        }
        tokio::time::sleep(poll.interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::defaults::new_instance_group;
    use crate::spec::{InstanceGroupSpec, load_objects};

    /// The one Cluster `text` holds.
    fn cluster(text: &str) -> Cluster {
        let Some(crate::spec::Object::Cluster(c)) =
            load_objects("t", text).unwrap().pop().map(|o| o.value)
        else {
            panic!("cluster")
        };
        c
    }

    fn group(role: InstanceGroupRole, size: u32) -> InstanceGroup {
        new_instance_group(
            "lab",
            if role == InstanceGroupRole::ControlPlane {
                "control-plane"
            } else {
                "nodes"
            },
            InstanceGroupSpec {
                role,
                machine_type: None,
                image: None,
                min_size: Some(size),
                max_size: Some(size),
                subnets: vec![],
                rolling_update: None,
                node_labels: Default::default(),
                taints: vec![],
                ssh_user: None,
            },
        )
    }

    #[test]
    fn metal_groups_do_not_count_their_hosts_twice() {
        let text = "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: lab\nspec:\n  cloudProvider: metal\n  hosts:\n  - {name: cp1, address: 10.0.0.1, roles: [control-plane]}\n  - {name: cp2, address: 10.0.0.2, roles: [control-plane]}\n  - {name: cp3, address: 10.0.0.3, roles: [control-plane]}\n  - {name: w1, address: 10.0.0.4, roles: [node]}\n";
        let c = cluster(text);
        // `create cluster --cloud metal` makes these groups from the same hosts.
        let groups = [
            group(InstanceGroupRole::ControlPlane, 3),
            group(InstanceGroupRole::Node, 1),
        ];
        let e = Expectations::from_spec(&c, &groups).unwrap();
        assert_eq!(e.min_control_plane, 3);
        assert_eq!(e.min_nodes, 4);
    }

    /// `networking.cni: none` (Kubespray's `kube_network_plugin: cni`): the user's pod
    /// network; validation looks for no CNI pods and the add-ons render no CNI manifest.
    #[test]
    fn cni_none_expects_no_pod_network() {
        let text = "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: lab\nspec:\n  cloudProvider: metal\n  kubernetesVersion: 1.36.2\n  networking:\n    cni: none\n    podCIDR: 198.19.0.0/16\n  hosts:\n  - {name: cp1, address: 198.18.0.1, roles: [control-plane]}\n";
        let c = cluster(text);
        let e = Expectations::from_spec(&c, &[]).unwrap();
        assert_eq!(e.cni, None);
        let checks: Vec<&str> = e.pod_checks().iter().map(|c| c.what).collect();
        assert_eq!(checks, ["CoreDNS"]);
        assert!(crate::addons::cni::render_cni(&c).unwrap().is_none());
    }

    #[test]
    fn kube_system_workloads_need_the_pods_they_want_available() {
        let deployment = |replicas: Option<i32>, available: Option<i32>| -> Deployment {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "coredns"},
                "spec": {"replicas": replicas, "selector": {}, "template": {}},
                "status": {"availableReplicas": available},
            }))
            .unwrap()
        };
        assert_eq!(deployment_unavailable(&deployment(Some(2), Some(2))), None);
        assert_eq!(
            deployment_unavailable(&deployment(Some(2), Some(1))).as_deref(),
            Some("1 of 2 replicas available")
        );
        // Unset replicas mean one; no status yet means none available.
        assert_eq!(
            deployment_unavailable(&deployment(None, None)).as_deref(),
            Some("0 of 1 replicas available")
        );
        // Scaled to zero wants nothing.
        assert_eq!(deployment_unavailable(&deployment(Some(0), None)), None);

        let daemonset = |desired: i32, available: Option<i32>| -> DaemonSet {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "calico-node"},
                "status": {"desiredNumberScheduled": desired, "currentNumberScheduled": desired,
                           "numberMisscheduled": 0, "numberReady": 0, "numberAvailable": available},
            }))
            .unwrap()
        };
        assert_eq!(daemonset_unavailable(&daemonset(3, Some(3))), None);
        assert_eq!(
            daemonset_unavailable(&daemonset(3, Some(2))).as_deref(),
            Some("2 of 3 pods available")
        );
        assert_eq!(
            daemonset_unavailable(&daemonset(1, None)).as_deref(),
            Some("0 of 1 pods available")
        );
    }

    #[test]
    fn critical_kube_system_pods_must_run_ready_as_kops_validates_them() {
        let pod = |class: Option<&str>, phase: &str, ready: bool, deleting: bool| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {
                    "name": "kube-apiserver-cp1",
                    "deletionTimestamp": deleting.then_some("2026-11-23T00:00:00Z"),
                },
                "spec": {
                    "nodeName": "cp1",
                    "priorityClassName": class,
                    "containers": [{ "name": "kube-apiserver" }],
                },
                "status": {
                    "phase": phase,
                    "containerStatuses": [{
                        "name": "kube-apiserver", "ready": ready, "restartCount": 0,
                        "image": "i", "imageID": "i",
                    }],
                },
            }))
            .expect("pod")
        };
        let critical = Some("system-node-critical");
        assert_eq!(
            critical_pod_problem(&pod(critical, "Running", true, false)),
            None
        );
        assert_eq!(
            critical_pod_problem(&pod(critical, "Running", false, false)).as_deref(),
            Some("system-node-critical pod (on cp1) is Running but not ready (kube-apiserver)")
        );
        assert_eq!(
            critical_pod_problem(&pod(
                Some("system-cluster-critical"),
                "Pending",
                false,
                false
            ))
            .as_deref(),
            Some("system-cluster-critical pod (on cp1) is Pending")
        );
        // Not critical, finished, or going away: not judged here.
        assert_eq!(
            critical_pod_problem(&pod(None, "Pending", false, false)),
            None
        );
        assert_eq!(
            critical_pod_problem(&pod(Some("high"), "Pending", false, false)),
            None
        );
        assert_eq!(
            critical_pod_problem(&pod(critical, "Succeeded", false, false)),
            None
        );
        assert_eq!(
            critical_pod_problem(&pod(critical, "Running", false, true)),
            None
        );
    }

    #[test]
    fn huge_cloud_group_sizes_saturate() {
        let text = "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: c.example.com\nspec:\n  cloudProvider: aws\n";
        let c = cluster(text);
        let groups = [
            group(InstanceGroupRole::ControlPlane, u32::MAX),
            group(InstanceGroupRole::Node, u32::MAX),
        ];
        let e = Expectations::from_spec(&c, &groups).unwrap();
        assert_eq!(e.min_nodes, u32::MAX);
    }
}
