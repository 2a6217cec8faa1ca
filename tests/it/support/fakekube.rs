//! An HTTP-level fake of the Kubernetes API server (kube-rs's mock-server idea, over a real
//! socket): the real URL paths and JSON, server-side apply with field ownership and 409
//! conflicts, dry runs, merge patches, LIST with label/field selectors and `limit`/`continue`,
//! strategic merge patches (keyed lists such as node taints, `$patch: delete`), and what drains
//! need: the eviction subresource with 429 while a PodDisruptionBudget (policy/v1) allows no
//! disruption (computed from minAvailable / maxUnavailable over the healthy pods it selects,
//! as the disruption controller does), evictions that delete the pod, nodes whose kubelet is
//! down (their pods stay Terminating), and a ReplicaSet "controller" that re-creates an
//! evicted pod on another schedulable node. Every request is recorded. It listens on
//! 127.0.0.1 and stops when dropped.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub content_type: String,
    pub body: String,
}

impl Recorded {
    pub fn is_dry_run(&self) -> bool {
        self.query.get("dryRun").map(String::as_str) == Some("All")
    }
    /// A request that changes stored state.
    pub fn is_write(&self) -> bool {
        self.method != "GET" && !self.is_dry_run()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Seg {
    F(String),
    K(String),
}
type FieldPath = Vec<Seg>;

fn path_string(p: &FieldPath) -> String {
    p.iter()
        .map(|s| match s {
            Seg::F(f) => format!(".{f}"),
            Seg::K(k) => format!("[name=\"{k}\"]"),
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq)]
struct Managed {
    manager: String,
    operation: &'static str,
    api_version: String,
    fields: BTreeSet<FieldPath>,
}

#[derive(Debug, Clone)]
struct Entry {
    api_version: String,
    obj: Value,
    managed: Vec<Managed>,
    rv: u64,
    uid: String,
    generation: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    group: String,
    plural: String,
    ns: Option<String>,
    name: String,
}

impl Key {
    /// The key of `kind` `ns`/`name`, or None for a kind the fake does not serve.
    fn of(kind: &str, ns: Option<&str>, name: &str) -> Option<Key> {
        let (group, plural) = plural_of(kind)?;
        Some(Key {
            group: group.into(),
            plural: plural.into(),
            ns: ns.map(str::to_string),
            name: name.into(),
        })
    }
}

#[derive(Default)]
struct Inner {
    objects: BTreeMap<Key, Entry>,
    requests: Vec<Recorded>,
    rv: u64,
    /// Nodes without a running kubelet: their pods stay Terminating once deleted.
    kubelet_down: BTreeSet<String>,
    /// Re-create evicted ReplicaSet pods on another schedulable node.
    replicaset_controller: bool,
    recreated: u64,
    /// Plurals whose LIST answers 403 (a client without that permission).
    forbidden_lists: BTreeSet<String>,
}

type Shared = Arc<Mutex<Inner>>;

/// (group, plural, kind): what the fake serves.
const RESOURCES: &[(&str, &str, &str)] = &[
    ("", "namespaces", "Namespace"),
    ("", "serviceaccounts", "ServiceAccount"),
    ("", "configmaps", "ConfigMap"),
    ("", "secrets", "Secret"),
    ("", "services", "Service"),
    ("", "nodes", "Node"),
    ("", "pods", "Pod"),
    ("apps", "daemonsets", "DaemonSet"),
    ("apps", "deployments", "Deployment"),
    ("rbac.authorization.k8s.io", "clusterroles", "ClusterRole"),
    (
        "rbac.authorization.k8s.io",
        "clusterrolebindings",
        "ClusterRoleBinding",
    ),
    ("rbac.authorization.k8s.io", "roles", "Role"),
    ("rbac.authorization.k8s.io", "rolebindings", "RoleBinding"),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "CustomResourceDefinition",
    ),
    ("policy", "poddisruptionbudgets", "PodDisruptionBudget"),
    ("coordination.k8s.io", "leases", "Lease"),
];

fn kind_of(group: &str, plural: &str) -> Option<&'static str> {
    RESOURCES
        .iter()
        .find(|(g, p, _)| *g == group && *p == plural)
        .map(|(_, _, k)| *k)
}

fn plural_of(kind: &str) -> Option<(&'static str, &'static str)> {
    RESOURCES
        .iter()
        .find(|(_, _, k)| *k == kind)
        .map(|(g, p, _)| (*g, *p))
}

pub struct FakeKube {
    pub addr: SocketAddr,
    pub kubeconfig: PathBuf,
    state: Shared,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

impl FakeKube {
    pub async fn start() -> FakeKube {
        Self::start_on("127.0.0.1").await
    }

    /// Listens on `ip` (the test hosts' gateway, when the API must be reached through them).
    pub async fn start_on(ip: &str) -> FakeKube {
        let state: Shared = Arc::default();
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind((ip, 0))
            .await
            .expect("bind the fake API");
        let addr = listener.local_addr().expect("local addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("admin.conf");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
                 users:\n- name: admin\n  user: {{}}\ncontexts:\n- name: admin@fake\n  context:\n    cluster: fake\n    user: admin\n\
                 current-context: admin@fake\n"
            ),
        )
        .expect("write kubeconfig");
        FakeKube {
            addr,
            kubeconfig,
            state,
            shutdown: Some(tx),
            _dir: dir,
        }
    }

    pub async fn kube(&self) -> kprov::kube::Kube {
        kprov::kube::Kube::from_kubeconfig(&self.kubeconfig, None)
            .await
            .expect("client from the fake's kubeconfig")
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Nothing the API stores was changed: every request so far read or dry-ran (a preview).
    #[track_caller]
    pub fn assert_no_writes(&self) {
        let writes: Vec<Recorded> = self
            .requests()
            .into_iter()
            .filter(Recorded::is_write)
            .collect();
        assert!(
            writes.is_empty(),
            "a preview must only read or dry-run: {writes:?}"
        );
    }

    /// Every write the API was asked for, as `METHOD path`.
    pub fn writes(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter(|r| r.is_write())
            .map(|r| format!("{} {}", r.method, r.path))
            .collect()
    }

    pub fn clear_requests(&self) {
        self.state.lock().unwrap().requests.clear();
    }

    fn key_of(obj: &Value) -> Key {
        let kind = obj["kind"].as_str().expect("kind");
        let (group, plural) = plural_of(kind).expect("kind the fake serves");
        Key {
            group: group.into(),
            plural: plural.into(),
            ns: obj["metadata"]["namespace"].as_str().map(str::to_string),
            name: obj["metadata"]["name"].as_str().expect("name").to_string(),
        }
    }

    /// Stores an object as-is (test setup: nodes, pods, status), owned by no manager.
    pub fn put(&self, obj: Value) {
        let key = Self::key_of(&obj);
        let mut st = self.state.lock().unwrap();
        st.rv += 1;
        let rv = st.rv;
        let api_version = obj["apiVersion"].as_str().unwrap_or("v1").to_string();
        let entry = st.objects.entry(key).or_insert_with(|| Entry {
            api_version: api_version.clone(),
            obj: Value::Null,
            managed: Vec::new(),
            rv,
            uid: format!("uid-{rv}"),
            generation: 1,
        });
        entry.obj = obj;
        entry.rv = rv;
    }

    /// The stored object as the API would return it.
    pub fn get(&self, kind: &str, ns: Option<&str>, name: &str) -> Option<Value> {
        let key = Key::of(kind, ns, name)?;
        let st = self.state.lock().unwrap();
        st.objects.get(&key).map(render)
    }

    /// Changes an object as another field manager would (`kubectl edit`): a merge patch
    /// recorded as an Update by `manager`.
    pub fn update_as(&self, manager: &str, kind: &str, ns: Option<&str>, name: &str, patch: Value) {
        let key = Key::of(kind, ns, name).expect("kind");
        let mut st = self.state.lock().unwrap();
        merge_patch(&mut st, &key, &patch, manager).expect("object exists");
    }

    /// Sets `status` (what controllers would write).
    pub fn set_status(&self, kind: &str, ns: Option<&str>, name: &str, status: Value) {
        let mut obj = self.get(kind, ns, name).expect("object exists");
        obj["status"] = status;
        let key = Key::of(kind, ns, name).expect("kind");
        let mut st = self.state.lock().unwrap();
        st.rv += 1;
        let rv = st.rv;
        if let Some(e) = st.objects.get_mut(&key) {
            e.obj["status"] = obj["status"].take();
            e.rv = rv;
        }
    }

    /// The node's kubelet stops: pods deleted or evicted there stay Terminating (a
    /// deletionTimestamp, never removed), as on a real API server without a kubelet.
    pub fn stop_kubelet(&self, node: &str) {
        self.state
            .lock()
            .unwrap()
            .kubelet_down
            .insert(node.to_string());
    }

    /// What a real kubelet's restart shows through the API (kubelet 1.36 on the real tier):
    /// for `stale` the Node still carries the Ready the old kubelet posted (heartbeat and
    /// all); then the new kubelet posts NotReady (its container runtime and PLEG not checked
    /// yet) and, `not_ready` later, Ready, each with a new heartbeat. Runs on a thread of its
    /// own; the handle ends once Ready is posted.
    pub fn kubelet_restarted(
        &self,
        node: &str,
        stale: std::time::Duration,
        not_ready: std::time::Duration,
    ) -> std::thread::JoinHandle<()> {
        let state = self.state.clone();
        let node = node.to_string();
        std::thread::spawn(move || {
            std::thread::sleep(stale);
            post_ready(&state, &node, false);
            std::thread::sleep(not_ready);
            post_ready(&state, &node, true);
        })
    }

    /// The running kubelet posts its status now (Ready or not, a new heartbeat), as a real
    /// one does on any change (its image list after a pull) and every few minutes anyway.
    pub fn kubelet_posts(&self, node: &str, ready: bool) {
        post_ready(&self.state, node, ready);
    }

    /// Every `systemctl restart kubelet` the `systemctl` stand-in logs from now on (`logs`:
    /// node and its host's stand-in log) is followed on this API as a real restart is
    /// ([`FakeKube::kubelet_restarted`] with `stale` and `not_ready`), until the follower is
    /// dropped (which waits for the posts in flight). The log is read every 50 ms: part of
    /// the stale moment, as on a real node.
    pub fn follow_kubelets(
        &self,
        logs: Vec<(String, PathBuf)>,
        stale: std::time::Duration,
        not_ready: std::time::Duration,
    ) -> KubeletFollower {
        let restarts = |p: &PathBuf| {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .filter(|l| {
                    l.split_once(' ')
                        .is_some_and(|(_, c)| c.trim() == "systemctl restart kubelet")
                })
                .count()
        };
        let mut seen: Vec<usize> = logs.iter().map(|(_, p)| restarts(p)).collect();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let state = self.state.clone();
        let handle = std::thread::spawn(move || {
            let mut posts = Vec::new();
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                for (i, (node, log)) in logs.iter().enumerate() {
                    let now = restarts(log);
                    while seen[i] < now {
                        seen[i] += 1;
                        let (state, node) = (state.clone(), node.clone());
                        posts.push(std::thread::spawn(move || {
                            std::thread::sleep(stale);
                            post_ready(&state, &node, false);
                            std::thread::sleep(not_ready);
                            post_ready(&state, &node, true);
                        }));
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            for p in posts {
                let _ = p.join();
            }
        });
        KubeletFollower {
            stop,
            handle: Some(handle),
        }
    }

    /// The kubelet is back: pods Terminating on the node finish (are removed).
    pub fn start_kubelet(&self, node: &str) {
        let mut st = self.state.lock().unwrap();
        st.kubelet_down.remove(node);
        st.objects.retain(|k, e| {
            !(k.plural == "pods"
                && e.obj["spec"]["nodeName"].as_str() == Some(node)
                && !e.obj["metadata"]["deletionTimestamp"].is_null())
        });
        st.rv += 1;
    }

    /// Plays the ReplicaSet controller: a pod owned by a ReplicaSet that is evicted is
    /// re-created (new name and UID, same labels and owner) Running and ready on another
    /// schedulable, Ready node without a NoSchedule taint, or Pending when there is none.
    pub fn run_replicaset_controller(&self) {
        self.state.lock().unwrap().replicaset_controller = true;
    }

    /// LIST of `plural` answers 403 Forbidden from now on (RBAC without that verb).
    pub fn forbid_list(&self, plural: &str) {
        self.state
            .lock()
            .unwrap()
            .forbidden_lists
            .insert(plural.to_string());
    }

    /// What the disruption controller would write into a budget's status now.
    pub fn pdb_status(&self, ns: &str, name: &str) -> Option<Value> {
        let st = self.state.lock().unwrap();
        let key = Key {
            group: "policy".into(),
            plural: "poddisruptionbudgets".into(),
            ns: Some(ns.into()),
            name: name.into(),
        };
        st.objects.get(&key).map(|e| pdb_status(&st, ns, &e.obj))
    }

    /// Ready nodes as kubelets register them: control planes (tainted) and workers.
    pub fn put_nodes(&self, control_planes: &[&str], workers: &[&str]) {
        for (names, control_plane) in [(control_planes, true), (workers, false)] {
            for n in names {
                self.put(node(n, control_plane, true, false, None));
            }
        }
    }

    /// Whether the node is cordoned (`spec.unschedulable`).
    pub fn unschedulable(&self, node: &str) -> bool {
        self.get("Node", None, node).expect("node")["spec"]["unschedulable"].as_bool() == Some(true)
    }

    /// Names of the pods bound to `node`, ordered by namespace and name.
    pub fn pods_on(&self, node: &str) -> Vec<String> {
        self.list("Pod")
            .into_iter()
            .filter(|p| p["spec"]["nodeName"].as_str() == Some(node))
            .map(|p| p["metadata"]["name"].as_str().expect("name").to_string())
            .collect()
    }

    /// Objects of a kind, ordered by namespace and name.
    pub fn list(&self, kind: &str) -> Vec<Value> {
        let (group, plural) = plural_of(kind).expect("kind");
        let st = self.state.lock().unwrap();
        st.objects
            .iter()
            .filter(|(k, _)| k.group == group && k.plural == plural)
            .map(|(_, e)| render(e))
            .collect()
    }
}

/// Stands in for the kubelets and the cloud-controller-manager: once the CCM DaemonSet exists
/// it is rolled out (one pod ready), then each of `nodes` (name, control plane, provider ID)
/// is put back Ready and initialised (no `uninitialized` taint, its provider ID).
pub fn ccm_stand_in(
    fake: &Arc<FakeKube>,
    nodes: &[(&'static str, bool, &'static str)],
) -> tokio::task::JoinHandle<()> {
    let (fake, nodes) = (fake.clone(), nodes.to_vec());
    tokio::spawn(async move {
        // Bounded: a test whose command never deploys the CCM fails on its own wait, and
        // this task ends instead of polling for the rest of the process.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(600);
        while fake
            .get("DaemonSet", Some("kube-system"), "cloud-controller-manager")
            .is_none()
        {
            if std::time::Instant::now() > until {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        fake.set_status("DaemonSet", Some("kube-system"), "cloud-controller-manager", json!({"desiredNumberScheduled": 1, "currentNumberScheduled": 1, "numberMisscheduled": 0, "numberReady": 1, "updatedNumberScheduled": 1, "numberAvailable": 1, "observedGeneration": 1}));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        for (name, control_plane, provider_id) in nodes {
            fake.put(node(name, control_plane, true, false, Some(provider_id)));
        }
    })
}

/// A node as a kubelet registers it.
pub fn node(
    name: &str,
    control_plane: bool,
    ready: bool,
    uninitialized: bool,
    provider_id: Option<&str>,
) -> Value {
    let mut labels = json!({ "kubernetes.io/hostname": name, "kubernetes.io/os": "linux" });
    let mut taints = Vec::new();
    if control_plane {
        labels["node-role.kubernetes.io/control-plane"] = json!("");
        taints
            .push(json!({"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}));
    }
    if uninitialized {
        taints.push(json!({"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}));
    }
    let mut spec = json!({ "taints": taints });
    if let Some(p) = provider_id {
        spec["providerID"] = json!(p);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": name, "labels": labels },
        "spec": spec,
        "status": { "conditions": [
            { "type": "Ready", "status": if ready { "True" } else { "False" }, "reason": "KubeletReady" }
        ]}
    })
}

/// `node` with the times a real API always serves on its Ready condition (second precision,
/// as metav1.Time marshals): what kprov compares after a kubelet restart. [`node`] alone has
/// none, and kprov then waits for any Ready: tests whose kubelets are not played by
/// [`FakeKube::kubelet_restarted`] or [`FakeKube::follow_kubelets`] keep it that way.
pub fn with_heartbeat(mut node: Value) -> Value {
    if let Some(list) = node["status"]["conditions"].as_array_mut() {
        for c in list.iter_mut().filter(|c| c["type"] == "Ready") {
            c["lastHeartbeatTime"] = json!(now_rfc3339());
            c["lastTransitionTime"] = json!(now_rfc3339());
        }
    }
    node
}

/// Plays the kubelets of sshd test hosts on the fake API until dropped (see
/// [`FakeKube::follow_kubelets`]).
pub struct KubeletFollower {
    stop: Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for KubeletFollower {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Sets `node`'s Ready condition as a kubelet posts it (status, new heartbeat, transition
/// time when the status changes), and logs the post in the request log (method `KUBELET`,
/// path `/nodes/NAME`, body `Ready=True|False`) so tests can order it against kprov's requests.
fn post_ready(state: &Shared, node: &str, ready: bool) {
    let mut st = state.lock().unwrap();
    st.rv += 1;
    let rv = st.rv;
    let key = Key {
        group: String::new(),
        plural: "nodes".into(),
        ns: None,
        name: node.into(),
    };
    let status = if ready { "True" } else { "False" };
    if let Some(e) = st.objects.get_mut(&key) {
        let now = now_rfc3339();
        let conditions = &mut e.obj["status"]["conditions"];
        if !conditions.is_array() {
            *conditions = json!([]);
        }
        let list = conditions.as_array_mut().expect("an array");
        let at = match list.iter().position(|c| c["type"] == "Ready") {
            Some(i) => i,
            None => {
                list.push(json!({ "type": "Ready" }));
                list.len() - 1
            }
        };
        let c = &mut list[at];
        if c["status"] != status {
            c["lastTransitionTime"] = json!(now);
        }
        c["status"] = json!(status);
        c["reason"] = json!(if ready {
            "KubeletReady"
        } else {
            "KubeletNotReady"
        });
        c["lastHeartbeatTime"] = json!(now);
        e.rv = rv;
    }
    st.requests.push(Recorded {
        method: "KUBELET".into(),
        path: format!("/nodes/{node}"),
        query: BTreeMap::new(),
        content_type: String::new(),
        body: format!("Ready={status}"),
    });
}

/// A pod in `phase` on `node`, every container ready iff `ready`.
/// A Running, ready kube-system pod labelled `k8s-app: APP` on `node` (an add-on's pod).
pub fn system_pod(name: &str, app: &str, node: &str) -> Value {
    pod(
        "kube-system",
        name,
        json!({ "k8s-app": app }),
        node,
        "Running",
        true,
    )
}

pub fn pod(ns: &str, name: &str, labels: Value, node: &str, phase: &str, ready: bool) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": ns, "labels": labels },
        "spec": { "nodeName": node, "containers": [ { "name": "main", "image": "registry.k8s.io/pause:3.10" } ] },
        "status": {
            "phase": phase,
            "containerStatuses": [ { "name": "main", "ready": ready, "restartCount": 0, "image": "registry.k8s.io/pause:3.10", "imageID": "" } ]
        }
    })
}

/// `pod` owned (as its controller) by a `kind` (ReplicaSet, DaemonSet, StatefulSet, ...).
pub fn owned_by(mut pod: Value, kind: &str, owner: &str) -> Value {
    let api_version = if kind == "Job" { "batch/v1" } else { "apps/v1" };
    pod["metadata"]["ownerReferences"] = json!([{
        "apiVersion": api_version, "kind": kind, "name": owner,
        "uid": format!("uid-{owner}"), "controller": true, "blockOwnerDeletion": true
    }]);
    pod
}

/// A Deployment's pod: Running and ready in `default`, labelled `app=APP`, owned by the
/// ReplicaSet `APP-rs` (what the replicaset controller re-creates elsewhere when evicted).
pub fn replica_pod(name: &str, app: &str, node: &str) -> Value {
    owned_by(
        pod(
            "default",
            name,
            json!({ "app": app }),
            node,
            "Running",
            true,
        ),
        "ReplicaSet",
        &format!("{app}-rs"),
    )
}

/// A DaemonSet's pod in kube-system, Running and ready, labelled `k8s-app=DAEMONSET`.
pub fn daemon_pod(name: &str, daemonset: &str, node: &str) -> Value {
    owned_by(
        pod(
            "kube-system",
            name,
            json!({ "k8s-app": daemonset }),
            node,
            "Running",
            true,
        ),
        "DaemonSet",
        daemonset,
    )
}

/// The mirror of a static pod (etcd, kube-apiserver, ...) in kube-system, Running and ready.
pub fn static_pod(name: &str, node: &str) -> Value {
    mirror(pod("kube-system", name, json!({}), node, "Running", true))
}

/// The API mirror of a static pod (what the kubelet registers for kube-apiserver & co).
pub fn mirror(mut pod: Value) -> Value {
    pod["metadata"]["annotations"] = json!({ "kubernetes.io/config.mirror": "0123abcd" });
    pod
}

/// `pod` with an emptyDir volume named `volume`.
pub fn with_empty_dir(mut pod: Value, volume: &str) -> Value {
    pod["spec"]["volumes"] = json!([{ "name": volume, "emptyDir": {} }]);
    pod
}

/// A policy/v1 PodDisruptionBudget selecting `match_labels`; `budget` is
/// `("minAvailable" | "maxUnavailable", 1 | "50%")`. No status: the fake computes it, over
/// the matching pods that exist (it has no scale subresource: an evicted pod that nothing
/// re-creates lowers the expected count, unlike a real ReplicaSet's budget).
pub fn pdb(ns: &str, name: &str, match_labels: Value, budget: (&str, Value)) -> Value {
    let mut spec = json!({ "selector": { "matchLabels": match_labels } });
    spec[budget.0] = budget.1;
    json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": { "name": name, "namespace": ns },
        "spec": spec,
    })
}

/// The budget of an app's pods: `APP` in `default`, selecting `app=APP` (see [`pdb`]).
pub fn app_pdb(app: &str, budget: (&str, Value)) -> Value {
    pdb("default", app, json!({ "app": app }), budget)
}

fn render(e: &Entry) -> Value {
    let mut obj = e.obj.clone();
    let meta = &mut obj["metadata"];
    meta["resourceVersion"] = json!(e.rv.to_string());
    meta["uid"] = json!(e.uid);
    meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    meta["generation"] = json!(e.generation);
    if !e.managed.is_empty() {
        meta["managedFields"] = Value::Array(
            e.managed
                .iter()
                .map(|m| {
                    json!({
                        "manager": m.manager,
                        "operation": m.operation,
                        "apiVersion": m.api_version,
                        "time": "2026-01-01T00:00:00Z",
                        "fieldsType": "FieldsV1",
                        "fieldsV1": fields_v1(&m.fields),
                    })
                })
                .collect(),
        );
    }
    obj
}

fn fields_v1(fields: &BTreeSet<FieldPath>) -> Value {
    let mut root = json!({});
    for path in fields {
        let mut cur = &mut root;
        for seg in path {
            let k = match seg {
                Seg::F(f) => format!("f:{f}"),
                Seg::K(n) => format!("k:{{\"name\":\"{n}\"}}"),
            };
            cur = cur
                .as_object_mut()
                .expect("object")
                .entry(k)
                .or_insert_with(|| json!({}));
        }
    }
    root
}

fn is_named_list(a: &[Value]) -> bool {
    !a.is_empty()
        && a.iter()
            .all(|e| e.get("name").and_then(Value::as_str).is_some())
}

fn flatten(v: &Value, prefix: &mut FieldPath, out: &mut BTreeMap<FieldPath, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                prefix.push(Seg::F(k.clone()));
                flatten(c, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) if is_named_list(a) => {
            for e in a {
                prefix.push(Seg::K(e["name"].as_str().unwrap_or_default().to_string()));
                flatten(e, prefix, out);
                prefix.pop();
            }
        }
        _ => {
            out.insert(prefix.clone(), v.clone());
        }
    }
}

/// The fields a client sets: everything but identity and status.
fn leaves(obj: &Value) -> BTreeMap<FieldPath, Value> {
    let mut body = obj.clone();
    if let Some(m) = body.as_object_mut() {
        m.remove("apiVersion");
        m.remove("kind");
        m.remove("status");
        if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            for k in [
                "name",
                "namespace",
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "generation",
                "managedFields",
            ] {
                meta.remove(k);
            }
        }
        if m.get("metadata")
            .is_some_and(|v| v.as_object().is_some_and(|o| o.is_empty()))
        {
            m.remove("metadata");
        }
    }
    let mut out = BTreeMap::new();
    flatten(&body, &mut Vec::new(), &mut out);
    out.retain(|p, _| !p.is_empty());
    out
}

fn get_path<'a>(v: &'a Value, path: &[Seg]) -> Option<&'a Value> {
    let mut cur = v;
    for seg in path {
        cur = match seg {
            Seg::F(f) => cur.get(f)?,
            Seg::K(n) => cur
                .as_array()?
                .iter()
                .find(|e| e.get("name").and_then(Value::as_str) == Some(n))?,
        };
    }
    Some(cur)
}

fn set_path(v: &mut Value, path: &[Seg], val: Value) {
    let Some((first, rest)) = path.split_first() else {
        *v = val;
        return;
    };
    let next_is_key = matches!(rest.first(), Some(Seg::K(_)));
    match first {
        Seg::F(f) => {
            if !v.is_object() {
                *v = json!({});
            }
            let child = v
                .as_object_mut()
                .expect("object")
                .entry(f.clone())
                .or_insert_with(|| if next_is_key { json!([]) } else { json!({}) });
            set_path(child, rest, val);
        }
        Seg::K(n) => {
            if !v.is_array() {
                *v = json!([]);
            }
            let arr = v.as_array_mut().expect("array");
            let idx = match arr
                .iter()
                .position(|e| e.get("name").and_then(Value::as_str) == Some(n))
            {
                Some(i) => i,
                None => {
                    arr.push(json!({ "name": n }));
                    arr.len() - 1
                }
            };
            set_path(&mut arr[idx], rest, val);
        }
    }
}

/// Removes a field; returns whether `v` became empty (so the parent drops it too).
fn remove_path(v: &mut Value, path: &[Seg]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return true;
    };
    match first {
        Seg::F(f) => {
            if let Some(m) = v.as_object_mut() {
                let drop_child = m.get_mut(f).is_some_and(|c| remove_path(c, rest));
                if drop_child {
                    m.remove(f);
                }
                return m.is_empty();
            }
            false
        }
        Seg::K(n) => {
            if let Some(arr) = v.as_array_mut() {
                if let Some(i) = arr
                    .iter()
                    .position(|e| e.get("name").and_then(Value::as_str) == Some(n))
                {
                    let emptied = remove_path(&mut arr[i], rest)
                        || arr[i]
                            .as_object()
                            .is_some_and(|o| o.len() == 1 && o.contains_key("name"));
                    if emptied {
                        arr.remove(i);
                    }
                }
                return arr.is_empty();
            }
            false
        }
    }
}

/// Keyed lists keep the order of the applied configuration (env order matters), as the API
/// server's structured merge does.
fn follow_order(obj: &mut Value, applied: &Value) {
    match (obj, applied) {
        (Value::Object(o), Value::Object(a)) => {
            for (k, av) in a {
                if let Some(ov) = o.get_mut(k) {
                    follow_order(ov, av);
                }
            }
        }
        (Value::Array(o), Value::Array(a)) if is_named_list(a) => {
            let name = |v: &Value| v.get("name").and_then(Value::as_str).map(str::to_string);
            let rank = |v: &Value| {
                a.iter()
                    .position(|e| name(e) == name(v))
                    .unwrap_or(usize::MAX)
            };
            o.sort_by_key(|v| rank(v));
            for e in o.iter_mut() {
                if let Some(ae) = a.iter().find(|ae| name(ae) == name(e)) {
                    follow_order(e, ae);
                }
            }
        }
        _ => {}
    }
}

fn spec_changed(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            m.remove("status");
        }
        v
    };
    strip(a) != strip(b)
}

fn status_response(code: u16, reason: &str, message: &str, details: Value) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": if code < 300 { "Success" } else { "Failure" },
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    });
    json_response(code, body)
}

fn json_response(code: u16, body: Value) -> Response {
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: Option<&str>) -> BTreeMap<String, String> {
    q.unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

struct Target {
    group: String,
    version: String,
    plural: String,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

impl Target {
    /// The stored object's key for `name` in this request's collection.
    fn key(&self, name: &str) -> Key {
        Key {
            group: self.group.clone(),
            plural: self.plural.clone(),
            ns: self.ns.clone(),
            name: name.to_string(),
        }
    }
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => (String::new(), v.to_string(), rest),
        ["apis", g, v, rest @ ..] => (g.to_string(), v.to_string(), rest),
        _ => return None,
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let plural = rest.first()?.to_string();
    Some(Target {
        group,
        version,
        plural,
        ns,
        name: rest.get(1).map(|s| s.to_string()),
        sub: rest.get(2).map(|s| s.to_string()),
    })
}

fn labels_match(obj: &Value, selector: &str) -> bool {
    let labels = &obj["metadata"]["labels"];
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            labels[k].as_str() != Some(v)
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            labels[k].as_str() == Some(v)
        } else {
            labels.get(term).is_some()
        }
    })
}

fn fields_match(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (k, v) = term.split_once('=').unwrap_or((term, ""));
        let mut cur = obj;
        for part in k.split('.') {
            cur = &cur[part];
        }
        cur.as_str().unwrap_or_default() == v
    })
}

async fn handle(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let query = parse_query(uri.query());
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let mut st = state.lock().unwrap();
    st.requests.push(Recorded {
        method: method.to_string(),
        path: uri.path().to_string(),
        query: query.clone(),
        content_type: content_type.clone(),
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    let Some(t) = parse_path(uri.path()) else {
        return status_response(
            404,
            "NotFound",
            &format!("the server could not find {}", uri.path()),
            json!({}),
        );
    };
    let Some(kind) = kind_of(&t.group, &t.plural) else {
        return status_response(
            404,
            "NotFound",
            &format!(
                "the server could not find the requested resource ({})",
                t.plural
            ),
            json!({}),
        );
    };
    let api_version = if t.group.is_empty() {
        t.version.clone()
    } else {
        format!("{}/{}", t.group, t.version)
    };
    let not_found = |name: &str| {
        status_response(
            404,
            "NotFound",
            &format!("{} \"{name}\" not found", t.plural),
            json!({ "name": name, "group": t.group, "kind": t.plural }),
        )
    };
    match (&method, &t.name, t.sub.as_deref()) {
        (&Method::GET, None, _) if st.forbidden_lists.contains(&t.plural) => status_response(
            403,
            "Forbidden",
            &format!("{} is forbidden: cannot list resource", t.plural),
            json!({ "kind": t.plural }),
        ),
        (&Method::GET, None, _) => list(&st, &t, kind, &api_version, &query),
        (&Method::GET, Some(name), None) => {
            let key = t.key(name);
            match st.objects.get(&key) {
                Some(e) => json_response(200, render(e)),
                None => not_found(name),
            }
        }
        (&Method::PATCH, Some(name), None) => {
            let Some(manager) = query.get("fieldManager").cloned() else {
                return status_response(400, "BadRequest", "fieldManager is required", json!({}));
            };
            let key = t.key(name);
            if content_type.starts_with("application/apply-patch") {
                let parsed: Result<Value, _> = serde_json::from_slice(&body);
                let Ok(applied) = parsed else {
                    return status_response(
                        400,
                        "BadRequest",
                        "body is not a JSON/YAML object",
                        json!({}),
                    );
                };
                apply(
                    &mut st,
                    key,
                    &api_version,
                    applied,
                    &manager,
                    query.get("force").map(String::as_str) == Some("true"),
                    query.get("dryRun").map(String::as_str) == Some("All"),
                )
            } else if content_type.starts_with("application/merge-patch+json")
                || content_type.starts_with("application/strategic-merge-patch+json")
            {
                let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                    return status_response(400, "BadRequest", "body is not JSON", json!({}));
                };
                let strategic = content_type.starts_with("application/strategic-merge-patch");
                match patch_object(&mut st, &key, &patch, &manager, strategic) {
                    Some(obj) => json_response(200, obj),
                    None => not_found(name),
                }
            } else {
                status_response(
                    415,
                    "UnsupportedMediaType",
                    &format!("unsupported patch type {content_type}"),
                    json!({}),
                )
            }
        }
        (&Method::POST, Some(name), Some("eviction")) if kind == "Pod" => {
            evict(&mut st, t.ns.clone().unwrap_or_default(), name)
        }
        (&Method::DELETE, Some(name), None) => {
            let key = t.key(name);
            match st.objects.remove(&key) {
                Some(e) => json_response(200, render(&e)),
                None => not_found(name),
            }
        }
        _ => status_response(
            405,
            "MethodNotAllowed",
            &format!("{method} is not supported on {}", uri.path()),
            json!({}),
        ),
    }
}

fn list(
    st: &Inner,
    t: &Target,
    kind: &str,
    api_version: &str,
    query: &BTreeMap<String, String>,
) -> Response {
    let items: Vec<Value> = st
        .objects
        .iter()
        .filter(|(k, _)| {
            k.group == t.group && k.plural == t.plural && (t.ns.is_none() || k.ns == t.ns)
        })
        .map(|(_, e)| render(e))
        .filter(|o| {
            query
                .get("labelSelector")
                .is_none_or(|s| labels_match(o, s))
        })
        .filter(|o| {
            query
                .get("fieldSelector")
                .is_none_or(|s| fields_match(o, s))
        })
        .collect();
    let start: usize = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => match token
            .strip_prefix("fake-offset-")
            .and_then(|n| n.parse().ok())
        {
            Some(n) => n,
            None => {
                return status_response(
                    410,
                    "Expired",
                    "the provided continue parameter is invalid",
                    json!({}),
                );
            }
        },
        None => 0,
    };
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let end = start.saturating_add(limit).min(items.len());
    let page: Vec<Value> = items
        .get(start..end)
        .map(<[Value]>::to_vec)
        .unwrap_or_default();
    let mut metadata = json!({ "resourceVersion": st.rv.to_string() });
    if end < items.len() {
        metadata["continue"] = json!(format!("fake-offset-{end}"));
        metadata["remainingItemCount"] = json!(items.len() - end);
    }
    json_response(
        200,
        json!({ "kind": format!("{kind}List"), "apiVersion": api_version, "metadata": metadata, "items": page }),
    )
}

fn apply(
    st: &mut Inner,
    key: Key,
    api_version: &str,
    applied: Value,
    manager: &str,
    force: bool,
    dry_run: bool,
) -> Response {
    if applied["metadata"]["name"].as_str() != Some(key.name.as_str()) {
        return status_response(
            400,
            "BadRequest",
            "metadata.name does not match the URL",
            json!({}),
        );
    }
    let new_leaves = leaves(&applied);
    let existing = st.objects.get(&key).cloned();
    let mut conflicts = Vec::new();
    if let Some(e) = &existing {
        for (p, v) in &new_leaves {
            if get_path(&e.obj, p).is_some_and(|cur| cur != v) {
                for m in e
                    .managed
                    .iter()
                    .filter(|m| m.manager != manager && m.fields.contains(p))
                {
                    conflicts.push((m.manager.clone(), m.api_version.clone(), p.clone()));
                }
            }
        }
    }
    if !conflicts.is_empty() && !force {
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(m, v, p)| json!({ "reason": "FieldManagerConflict", "message": format!("conflict with \"{m}\" using {v}"), "field": path_string(p) }))
            .collect();
        let message = format!(
            "Apply failed with {} conflict{}: {}",
            conflicts.len(),
            if conflicts.len() == 1 { "" } else { "s" },
            conflicts
                .iter()
                .map(|(m, v, p)| format!("conflict with \"{m}\" using {v}: {}", path_string(p)))
                .collect::<Vec<_>>()
                .join("\n")
        );
        return status_response(409, "Conflict", &message, json!({ "causes": causes }));
    }
    let mut entry = existing.clone().unwrap_or_else(|| Entry {
        api_version: api_version.to_string(),
        obj: json!({
            "apiVersion": applied["apiVersion"],
            "kind": applied["kind"],
            "metadata": { "name": key.name },
        }),
        managed: Vec::new(),
        rv: 0,
        uid: format!("uid-{}", st.rv + 1),
        generation: 1,
    });
    if let Some(ns) = &key.ns {
        entry.obj["metadata"]["namespace"] = json!(ns);
    }
    let before = entry.obj.clone();
    let new_paths: BTreeSet<FieldPath> = new_leaves.keys().cloned().collect();
    let previously_mine: BTreeSet<FieldPath> = entry
        .managed
        .iter()
        .filter(|m| m.manager == manager && m.operation == "Apply")
        .flat_map(|m| m.fields.iter().cloned())
        .collect();
    for p in previously_mine.difference(&new_paths) {
        let shared = entry
            .managed
            .iter()
            .any(|m| m.manager != manager && m.fields.contains(p));
        if !shared {
            remove_path(&mut entry.obj, p);
        }
    }
    for (p, v) in &new_leaves {
        set_path(&mut entry.obj, p, v.clone());
    }
    follow_order(&mut entry.obj, &applied);
    let before_managed = entry.managed.clone();
    for (m, _, p) in &conflicts {
        for owner in entry.managed.iter_mut().filter(|o| &o.manager == m) {
            owner.fields.remove(p);
        }
    }
    entry
        .managed
        .retain(|m| !(m.manager == manager && m.operation == "Apply"));
    entry.managed.retain(|m| !m.fields.is_empty());
    entry.managed.push(Managed {
        manager: manager.to_string(),
        operation: "Apply",
        api_version: api_version.to_string(),
        fields: new_paths,
    });
    entry.managed.sort_by(|a, b| a.manager.cmp(&b.manager));
    let changed = existing.is_none() || entry.obj != before || entry.managed != before_managed;
    if changed && existing.is_some() && spec_changed(&before, &entry.obj) {
        entry.generation += 1;
    }
    if dry_run {
        return json_response(if existing.is_none() { 201 } else { 200 }, render(&entry));
    }
    if changed {
        st.rv += 1;
        entry.rv = st.rv;
        st.objects.insert(key, entry.clone());
    }
    json_response(if existing.is_none() { 201 } else { 200 }, render(&entry))
}

/// A JSON merge patch (`strategic` false: a list replaces the list), or a strategic merge as
/// the API server does it for the lists kprov patches: lists of objects with a merge key
/// (`key` for taints, else `name`) merge element by element, and an element
/// `{"<key>": K, "$patch": "delete"}` removes K; other values merge like a JSON merge patch.
fn merge_values(target: &mut Value, patch: &Value, strategic: bool) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_values(t.entry(k.clone()).or_insert(Value::Null), v, strategic);
                }
            }
        }
        Value::Array(items)
            if strategic && items.iter().all(Value::is_object) && !items.is_empty() =>
        {
            let merge_key = if items.iter().all(|i| i.get("key").is_some()) {
                "key"
            } else {
                "name"
            };
            if !target.is_array() {
                *target = json!([]);
            }
            let t = target.as_array_mut().expect("array");
            for item in items {
                let k = item.get(merge_key).cloned().unwrap_or(Value::Null);
                let pos = t.iter().position(|e| e.get(merge_key) == Some(&k));
                if item.get("$patch").and_then(Value::as_str) == Some("delete") {
                    t.retain(|e| e.get(merge_key) != Some(&k));
                    continue;
                }
                match pos {
                    Some(i) => merge_values(&mut t[i], item, true),
                    None => t.push(item.clone()),
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn merge_patch(st: &mut Inner, key: &Key, patch: &Value, manager: &str) -> Option<Value> {
    patch_object(st, key, patch, manager, false)
}

fn patch_object(
    st: &mut Inner,
    key: &Key,
    patch: &Value,
    manager: &str,
    strategic: bool,
) -> Option<Value> {
    let rv = st.rv + 1;
    let e = st.objects.get_mut(key)?;
    let before = e.obj.clone();
    merge_values(&mut e.obj, patch, strategic);
    let old = leaves(&before);
    let new = leaves(&e.obj);
    let changed: BTreeSet<FieldPath> = new
        .iter()
        .filter(|(p, v)| old.get(*p) != Some(*v))
        .map(|(p, _)| p.clone())
        .collect();
    if !changed.is_empty() {
        for m in e.managed.iter_mut().filter(|m| m.manager != manager) {
            m.fields.retain(|p| !changed.contains(p));
        }
        match e
            .managed
            .iter_mut()
            .find(|m| m.manager == manager && m.operation == "Update")
        {
            Some(m) => m.fields.extend(changed),
            None => e.managed.push(Managed {
                manager: manager.to_string(),
                operation: "Update",
                api_version: e.api_version.clone(),
                fields: changed,
            }),
        }
        e.managed.retain(|m| !m.fields.is_empty());
        if spec_changed(&before, &e.obj) {
            e.generation += 1;
        }
    }
    if e.obj != before {
        e.rv = rv;
        st.rv = rv;
    }
    st.objects.get(key).map(render)
}

fn obj_labels_match(labels: &Value, sel: &Value) -> bool {
    if sel.is_null() {
        return false;
    }
    let by_labels = sel["matchLabels"]
        .as_object()
        .is_none_or(|m| m.iter().all(|(k, v)| labels[k] == *v));
    let by_expressions = sel["matchExpressions"].as_array().is_none_or(|exprs| {
        exprs.iter().all(|e| {
            let value = labels[e["key"].as_str().unwrap_or_default()].as_str();
            let values: Vec<&str> = e["values"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            match e["operator"].as_str() {
                Some("In") => value.is_some_and(|v| values.contains(&v)),
                Some("NotIn") => value.is_none_or(|v| !values.contains(&v)),
                Some("Exists") => value.is_some(),
                Some("DoesNotExist") => value.is_none(),
                _ => false,
            }
        })
    });
    by_labels && by_expressions
}

fn pod_healthy(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["phase"].as_str() == Some("Running")
        && pod["status"]["containerStatuses"]
            .as_array()
            .is_some_and(|c| c.iter().all(|c| c["ready"].as_bool() == Some(true)))
}

/// An int-or-percent of `of`, rounded up as the disruption controller does.
fn scaled(v: &Value, of: i64) -> i64 {
    match v {
        Value::String(p) => p
            .trim_end_matches('%')
            .parse::<i64>()
            .map(|p| (p * of + 99) / 100)
            .unwrap_or(0),
        other => other.as_i64().unwrap_or(0),
    }
}

/// The disruption controller's status for a budget: a status stored by the test wins (a
/// controller that lags), otherwise computed over the pods the selector matches now.
fn pdb_status(st: &Inner, ns: &str, pdb: &Value) -> Value {
    if pdb["status"]["disruptionsAllowed"].is_i64() {
        return pdb["status"].clone();
    }
    let matching: Vec<&Value> = st
        .objects
        .iter()
        .filter(|(k, _)| k.plural == "pods" && k.ns.as_deref() == Some(ns))
        .map(|(_, e)| &e.obj)
        .filter(|p| obj_labels_match(&p["metadata"]["labels"], &pdb["spec"]["selector"]))
        .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
        .collect();
    let expected = matching
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .count() as i64;
    let healthy = matching.iter().filter(|p| pod_healthy(p)).count() as i64;
    let spec = &pdb["spec"];
    let desired = if !spec["minAvailable"].is_null() {
        scaled(&spec["minAvailable"], expected)
    } else if !spec["maxUnavailable"].is_null() {
        (expected - scaled(&spec["maxUnavailable"], expected)).max(0)
    } else {
        expected
    };
    json!({
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "disruptionsAllowed": (healthy - desired).max(0),
    })
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn evict(st: &mut Inner, ns: String, name: &str) -> Response {
    let key = Key {
        group: String::new(),
        plural: "pods".into(),
        ns: Some(ns.clone()),
        name: name.to_string(),
    };
    let Some(pod) = st.objects.get(&key).map(|e| e.obj.clone()) else {
        return status_response(
            404,
            "NotFound",
            &format!("pods \"{name}\" not found"),
            json!({ "name": name, "kind": "pods" }),
        );
    };
    // A pod already terminating is not disrupted again: the eviction succeeds as is.
    if !pod["metadata"]["deletionTimestamp"].is_null() {
        return status_response(201, "", "", json!({}));
    }
    // Pending pods do not count against a disruption budget: they go at once.
    if pod["status"]["phase"].as_str() != Some("Pending") {
        let budgets: Vec<Key> = st
            .objects
            .iter()
            .filter(|(k, e)| {
                k.plural == "poddisruptionbudgets"
                    && k.ns.as_deref() == Some(ns.as_str())
                    && obj_labels_match(&pod["metadata"]["labels"], &e.obj["spec"]["selector"])
            })
            .map(|(k, _)| k.clone())
            .collect();
        if budgets.len() > 1 {
            return status_response(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                json!({}),
            );
        }
        if let Some(k) = budgets.first() {
            let obj = st.objects[k].obj.clone();
            let status = pdb_status(st, &ns, &obj);
            let allowed = status["disruptionsAllowed"].as_i64().unwrap_or(0);
            if allowed < 1 {
                let healthy = status["currentHealthy"].as_i64().unwrap_or(0);
                let desired = status["desiredHealthy"].as_i64().unwrap_or(0);
                return status_response(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    json!({ "causes": [ { "reason": "DisruptionBudget", "message": format!("The disruption budget {} needs {desired} healthy pods and has {healthy} currently", k.name) } ] }),
                );
            }
            // A pinned status is consumed like the API server decrements it.
            if let Some(e) = st.objects.get_mut(k)
                && e.obj["status"]["disruptionsAllowed"].is_i64()
            {
                e.obj["status"]["disruptionsAllowed"] = json!(allowed - 1);
            }
        }
    }
    let node = pod["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    st.rv += 1;
    let rv = st.rv;
    if st.kubelet_down.contains(&node) {
        if let Some(e) = st.objects.get_mut(&key) {
            e.obj["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            e.obj["metadata"]["deletionGracePeriodSeconds"] = json!(30);
            e.rv = rv;
        }
    } else {
        st.objects.remove(&key);
    }
    if st.replicaset_controller {
        recreate(st, &pod, &node);
    }
    status_response(201, "", "", json!({}))
}

/// The ReplicaSet controller's answer to a pod of its going away.
fn recreate(st: &mut Inner, pod: &Value, old_node: &str) {
    let owner = pod["metadata"]["ownerReferences"]
        .as_array()
        .and_then(|o| o.iter().find(|o| o["controller"].as_bool() == Some(true)))
        .cloned();
    let Some(owner) = owner.filter(|o| o["kind"].as_str() == Some("ReplicaSet")) else {
        return;
    };
    let target = st
        .objects
        .iter()
        .filter(|(k, _)| k.plural == "nodes" && k.name != old_node)
        .map(|(_, e)| &e.obj)
        .find(|n| {
            n["spec"]["unschedulable"].as_bool() != Some(true)
                && n["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
                && !n["spec"]["taints"].as_array().is_some_and(|t| {
                    t.iter()
                        .any(|t| matches!(t["effect"].as_str(), Some("NoSchedule" | "NoExecute")))
                })
        })
        .and_then(|n| n["metadata"]["name"].as_str())
        .map(str::to_string);
    st.recreated += 1;
    st.rv += 1;
    let rv = st.rv;
    let ns = pod["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_string();
    let name = format!(
        "{}-{:05}",
        owner["name"].as_str().unwrap_or("rs"),
        st.recreated
    );
    let mut new = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": ns,
            "labels": pod["metadata"]["labels"],
            "ownerReferences": [owner],
        },
        "spec": pod["spec"],
    });
    match &target {
        Some(n) => {
            new["spec"]["nodeName"] = json!(n);
            new["status"] = json!({ "phase": "Running", "containerStatuses": [
                { "name": "main", "ready": true, "restartCount": 0, "image": "registry.k8s.io/pause:3.10", "imageID": "" } ] });
        }
        None => {
            if let Some(spec) = new["spec"].as_object_mut() {
                spec.remove("nodeName");
            }
            new["status"] = json!({ "phase": "Pending" });
        }
    }
    let key = Key {
        group: String::new(),
        plural: "pods".into(),
        ns: Some(ns),
        name,
    };
    st.objects.insert(
        key,
        Entry {
            api_version: "v1".into(),
            obj: new,
            managed: Vec::new(),
            rv,
            uid: format!("uid-{rv}"),
            generation: 1,
        },
    );
}
