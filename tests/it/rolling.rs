//! `rolling-update cluster` on metal through the binary: real sshd test hosts, stand-in
//! kubeadm from the mirror. What is proven: every provisioned node carries its record;
//! `update cluster --yes` leaves a member whose configuration changed alone and names the
//! command; the preview names the node, the field and the action, exits 2 with
//! `--exit-code`, changes nothing; `get instances` lists every host with its status.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::metal::{Lab, VERSION, metal_update_yes, show};
use crate::support::cli::text;
use crate::support::cli::{prints, says};

/// Files one host wrote to its overlay, with contents.
fn host_files(lab: &Lab, host: &str) -> BTreeMap<PathBuf, Vec<u8>> {
    let etc = lab.host(host).upper_path("/etc/x");
    let upper = etc
        .parent()
        .and_then(Path::parent)
        .expect("upper dir")
        .to_path_buf();
    lab.hosts_snapshot()
        .into_iter()
        .filter(|(p, _)| p.starts_with(&upper))
        .collect()
}

#[test]
fn metal_label_change_is_left_to_rolling_update_and_previewed_per_node() {
    crate::needs_tier!(SshdHosts);
    let name = "roll.metal.example.com";
    let lab = Lab::with_control_plane_and_worker(name);
    let o = lab.kprov(&metal_update_yes(name, &[]));
    assert!(o.status.success(), "{}", show(&o));
    for h in ["host1", "host2"] {
        let record = lab
            .host(h)
            .read_upper("/var/lib/kprov/provisioned.json")
            .unwrap_or_else(|| panic!("{h}: no provisioning record"));
        let record: serde_json::Value = serde_json::from_slice(&record).expect("record is JSON");
        assert_eq!(record["kubernetesVersion"], VERSION, "{h}: {record}");
        assert_eq!(record["configDigest"].as_str().map(str::len), Some(64));
    }

    // Converged: nothing to roll.
    let o = lab.kprov(&["rolling-update", "cluster", name, "--exit-code"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    says(&o, "No rolling update needed");

    // The spec changes a running worker's labels.
    lab.edit_host(name, "host2", |h| {
        h.labels.insert("tier".into(), "web".into());
    });

    // update --yes leaves it alone, and says which command applies it.
    let before = host_files(&lab, "host2");
    let o = lab.kprov(&["update", "cluster", name, "--yes", "--skip-addons"]);
    assert!(o.status.success(), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(
        err.contains("pending a rolling update") && err.contains("host2"),
        "{}",
        show(&o)
    );
    prints(&o, "left alone: pending rolling update");
    assert!(
        err.contains(&format!("kprov rolling-update cluster {name}")),
        "{}",
        show(&o)
    );
    assert_eq!(host_files(&lab, "host2"), before, "update changed host2");

    // The preview: kops's table, the node, the field, the action; exit 2; nothing written.
    let store0 = crate::metal::store_snapshot(&lab);
    let hosts0 = lab.hosts_snapshot();
    let o = lab.kprov(&["rolling-update", "cluster", name, "--exit-code"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let out = text(&o.stdout);
    for want in [
        "NAME",
        "STATUS",
        "NEEDUPDATE",
        "READY",
        "MIN",
        "TARGET",
        "MAX",
        "NODES",
        "NeedsUpdate",
        "labels {} -> {tier=web}",
        "re-provision in place",
        "leave alone",
        "up to date",
    ] {
        assert!(out.contains(want), "{want} missing:\n{}", show(&o));
    }
    let host2_line = out
        .lines()
        .find(|l| l.starts_with("host2"))
        .expect("a line for host2");
    assert!(host2_line.contains("re-provision in place"), "{host2_line}");
    let host1_line = out
        .lines()
        .find(|l| l.starts_with("host1"))
        .expect("a line for host1");
    assert!(host1_line.contains("leave alone"), "{host1_line}");

    let o = lab.kprov(&["rolling-update", "cluster", name, "-o", "json"]);
    assert!(o.status.success(), "{}", show(&o));
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json plan");
    let mut nodes = Vec::new();
    for g in plan["groups"].as_array().expect("groups") {
        nodes.extend(g["nodes"].as_array().expect("nodes").iter().cloned());
    }
    let host2 = nodes
        .iter()
        .find(|n| n["target"] == "host2")
        .expect("host2 in the plan");
    assert_eq!(host2["action"], "reprovision", "{host2}");
    assert_eq!(host2["needsUpdate"], true, "{host2}");
    let host1 = nodes.iter().find(|n| n["target"] == "host1").unwrap();
    assert_eq!(host1["action"], "leave", "{host1}");

    // Selection: only the control planes: nothing to roll.
    let o = lab.kprov(&[
        "rolling-update",
        "cluster",
        name,
        "--instance-group-roles",
        "ControlPlane",
        "--exit-code",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let o = lab.kprov(&[
        "rolling-update",
        "cluster",
        name,
        "--instance-group",
        "nope",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    says(&o, "no such instance group");

    assert_eq!(lab.hosts_snapshot(), hosts0, "the preview changed a host");
    assert_eq!(
        crate::metal::store_snapshot(&lab),
        store0,
        "the preview wrote to the store"
    );

    // get instances: every host, its group and status with why.
    let o = lab.kprov(&["get", "instances", name]);
    assert!(o.status.success(), "{}", show(&o));
    let out = text(&o.stdout);
    let line = |h: &str| {
        out.lines()
            .find(|l| l.starts_with(h))
            .unwrap_or_else(|| panic!("{h} missing:\n{out}"))
            .to_string()
    };
    assert!(line("host1").contains("control-plane") && line("host1").contains("up to date"));
    assert!(
        line("host2").contains("nodes") && line("host2").contains("needs update: labels"),
        "{out}"
    );
}

mod engine_on_the_fake_api {
    //! The roll engine with the real cluster side (`KubeCluster`: `kube::drain`, validation)
    //! against the fake API server; the machines are a recorder (the in-place re-provisioner
    //! is not built). A budget that never allows stops the roll at the drain timeout naming
    //! it, the node stays cordoned and the journal says so; a free node is drained, rolled,
    //! uncordoned; the journal in a real file:// store.

    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use async_trait::async_trait;
    use kprov::addons::validate::Expectations;
    use kprov::nodes::journal::{Journal, JournalFile, JournalNode, NodeStep};
    use kprov::nodes::roll::{self, GroupInput, GroupRole, NodeInput, Platform, Provisioned};
    use kprov::ops::rolling::{
        self, KubeCluster, NodeRoller, RollError, RollEvent, RollOptions, Rolled,
    };
    use kprov::state::file::FileStore;
    use serde_json::json;

    use crate::support::fakekube::{
        FakeKube, app_pdb, node, pod, replica_pod, system_pod, with_heartbeat,
    };

    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    #[async_trait]
    impl NodeRoller for Recorder {
        async fn roll(&self, node: &JournalNode) -> Result<Rolled, rolling::RollerError> {
            self.0.lock().unwrap().push(node.node_name.clone());
            Ok(Rolled::default())
        }
    }

    /// Restarts each node's kubelet as the real one restarts (the fake API keeps the old
    /// Ready for a moment, then NotReady, then Ready with a new heartbeat) and says so. With
    /// `old_posts_first`, the steps before the restart take a while (a kubeadm upgrade pulling
    /// images): the old kubelet posts a fresh Ready meanwhile, and the roller reads the
    /// heartbeat right before the restart (`Rolled::ready_before`), as the metal roller does.
    struct KubeletRestarter<'f> {
        fake: &'f FakeKube,
        posts: Mutex<Vec<std::thread::JoinHandle<()>>>,
        old_posts_first: bool,
    }

    #[async_trait]
    impl NodeRoller for KubeletRestarter<'_> {
        async fn roll(&self, node: &JournalNode) -> Result<Rolled, rolling::RollerError> {
            let mut ready_before = None;
            if self.old_posts_first {
                // The API's heartbeats have one-second precision.
                tokio::time::sleep(Duration::from_millis(1100)).await;
                self.fake.kubelet_posts(&node.node_name, true);
                let n = self
                    .fake
                    .get("Node", None, &node.node_name)
                    .expect("the node");
                let heartbeat = n["status"]["conditions"]
                    .as_array()
                    .and_then(|l| l.iter().find(|c| c["type"] == "Ready"))
                    .map(|c| c["lastHeartbeatTime"].clone())
                    .expect("a Ready heartbeat");
                ready_before = Some(serde_json::from_value(heartbeat).expect("an RFC 3339 time"));
            }
            // The API's side goes on after the roll returns, as it does for real.
            let posts = self.fake.kubelet_restarted(
                &node.node_name,
                Duration::from_millis(1200),
                Duration::from_millis(600),
            );
            self.posts.lock().unwrap().push(posts);
            Ok(Rolled {
                replacement: None,
                kubelet_restarted: true,
                ready_before,
            })
        }
    }

    /// Rolls the plan's nodes with a [`KubeletRestarter`] on the fake API, waits for every
    /// kubelet's posts (a roll that went on without them too) and returns the timeline.
    async fn roll_restarting_kubelets(
        old_posts_first: bool,
        events: rolling::RollEvents,
    ) -> Vec<(usize, String, &'static str)> {
        let (fake, api) = setup().await;
        let roller = KubeletRestarter {
            fake: &fake,
            posts: Mutex::default(),
            old_posts_first,
        };
        fake.clear_requests();
        let j = roll(&api, &roller, &events).await.0.unwrap();
        assert!(j.finished);
        for posts in roller.posts.lock().unwrap().drain(..) {
            posts.join().unwrap();
        }
        timeline(&fake)
    }

    /// The index of the first `what` of `node` in a [`timeline`].
    fn first(t: &[(usize, String, &'static str)], node: &str, what: &str) -> usize {
        t.iter()
            .find(|(_, n, w)| n == node && *w == what)
            .map(|(i, _, _)| *i)
            .unwrap_or_else(|| panic!("no {what} of {node}: {t:?}"))
    }

    /// Where `node` was cordoned, uncordoned and its kubelet posted Ready/NotReady, in the
    /// order the fake API saw them: (index in the log, node, what).
    pub(super) fn timeline(fake: &FakeKube) -> Vec<(usize, String, &'static str)> {
        let mut out = Vec::new();
        for (i, r) in fake.requests().iter().enumerate() {
            let Some(node) = r
                .path
                .rsplit("/nodes/")
                .next()
                .filter(|_| r.path.contains("/nodes/"))
            else {
                continue;
            };
            let body = r.body.replace(' ', "");
            let what = match r.method.as_str() {
                "KUBELET" if body == "Ready=True" => "ready",
                "KUBELET" => "notready",
                "PATCH" if body.contains("\"unschedulable\":true") => "cordon",
                "PATCH" if body.contains("\"unschedulable\":null") => "uncordon",
                _ => continue,
            };
            out.push((i, node.to_string(), what));
        }
        out
    }

    /// The old kubelet's Ready posted while the roll's first steps ran is no sign of the new
    /// kubelet: the heartbeat the roller read right before the restart is the one to beat.
    /// (With the heartbeat read before the roll began, w1 was uncordoned on the old kubelet's
    /// post, before the new one's NotReady.)
    #[tokio::test]
    async fn the_heartbeat_to_beat_is_the_one_read_right_before_the_restart() {
        let t = roll_restarting_kubelets(true, Arc::new(|_: &RollEvent| {})).await;
        let at = |node: &str, what: &str| first(&t, node, what);
        for n in ["w1", "w2"] {
            assert!(
                at(n, "notready") < at(n, "uncordon"),
                "{n} uncordoned on the old kubelet's Ready: {t:?}"
            );
        }
        assert!(at("w1", "uncordon") < at("w2", "cordon"), "{t:?}");
    }

    /// After an in-place roll restarted the kubelet, the node counts as Ready only once the
    /// new kubelet posted Ready (a heartbeat newer than the one read before the restart):
    /// it is uncordoned only then, the next node is cordoned only after that, and never are
    /// two nodes cordoned or NotReady at once. With the old wait (any Ready) the stale Ready
    /// let w2 be cordoned while w1 was about to go NotReady.
    #[tokio::test]
    async fn after_a_kubelet_restart_only_a_ready_posted_by_the_new_kubelet_counts() {
        let working = Arc::new(Mutex::new(Vec::new()));
        let w2 = working.clone();
        let events: rolling::RollEvents = Arc::new(move |e: &RollEvent| {
            if let RollEvent::Working { what, .. } = e {
                w2.lock().unwrap().push(what.clone());
            }
        });
        let t = roll_restarting_kubelets(false, events).await;
        let at = |node: &str, what: &str| first(&t, node, what);
        assert!(at("w1", "notready") < at("w1", "ready"), "{t:?}");
        assert!(
            at("w1", "ready") < at("w1", "uncordon"),
            "uncordoned on a stale Ready: {t:?}"
        );
        assert!(
            at("w1", "ready") < at("w2", "cordon"),
            "w2 touched before w1's fresh Ready: {t:?}"
        );
        assert!(at("w2", "ready") < at("w2", "uncordon"), "{t:?}");
        let mut down = std::collections::BTreeSet::new();
        let mut cordoned = std::collections::BTreeSet::new();
        let mut notready = std::collections::BTreeSet::new();
        for (_, n, w) in &t {
            match *w {
                "cordon" => cordoned.insert(n.clone()),
                "uncordon" => cordoned.remove(n),
                "notready" => notready.insert(n.clone()),
                _ => notready.remove(n),
            };
            let now: std::collections::BTreeSet<_> = cordoned.union(&notready).cloned().collect();
            assert!(now.len() <= 1, "{now:?} unavailable at once: {t:?}");
            down.extend(now);
        }
        assert_eq!(down.len(), 2, "{t:?}");
        let said = working.lock().unwrap().clone();
        assert!(
            said.iter()
                .any(|w| w.contains("Ready after its kubelet restart")),
            "{said:?}"
        );
    }

    /// A restarted kubelet that never posts: the wait ends at the timeout naming the node and
    /// the stale Ready it still shows (the heartbeat from before the restart).
    #[tokio::test]
    async fn a_kubelet_that_never_posts_after_its_restart_is_named_with_the_stale_ready() {
        use kprov::ops::rolling::ClusterApi;
        let (_fake, api) = setup().await;
        let before = api
            .ready_heartbeat("w1")
            .await
            .unwrap()
            .expect("a heartbeat");
        let e = api
            .wait_ready("w1", Duration::from_millis(300), Some(&before))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("node w1 still shows the Ready posted before its kubelet restart")
                && e.contains(&before.0.to_string()),
            "{e}"
        );
        // Without a restart, the same Ready is enough.
        api.wait_ready("w1", Duration::from_millis(300), None)
            .await
            .unwrap();
    }

    fn rec(v: &str) -> Provisioned {
        Provisioned {
            kubernetes_version: v.into(),
            config_digest: "0".repeat(64),
            labels: Default::default(),
            taints: vec![],
            settings: None,
            launch_template_version: None,
        }
    }

    fn plan() -> roll::RollPlan {
        let groups = vec![GroupInput {
            name: "nodes".into(),
            role: GroupRole::Node,
            min: 2,
            max: 2,
            rolling_update: None,
        }];
        let nodes: Vec<NodeInput> = ["w1", "w2"]
            .iter()
            .map(|n| NodeInput {
                target: n.to_string(),
                node_name: n.to_string(),
                group: "nodes".into(),
                role: GroupRole::Node,
                recorded: Some(rec("1.35.0")),
                desired: rec("1.35.1"),
                ready: Some(true),
                unknown: None,
            })
            .collect();
        roll::plan(
            "c",
            Platform::Metal,
            "1.35.1",
            &groups,
            &nodes,
            &Default::default(),
        )
    }

    /// Rolls `plan()` with `roller`, journalled in a fresh file store: the roll's result, and
    /// the store's directory, where the journal stays to be read.
    async fn roll(
        api: &KubeCluster,
        roller: &dyn NodeRoller,
        events: &rolling::RollEvents,
    ) -> (Result<Journal, RollError>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path()).unwrap();
        let (file, _) = JournalFile::load(&store, "c").await.unwrap();
        let (_tx, rx) = tokio::sync::watch::channel(false);
        let journal = Journal::new(&plan(), "test", false);
        let opts = options();
        let result = rolling::run(file, journal, api, roller, &opts, events, rx, &|| Ok(())).await;
        (result, dir)
    }

    async fn setup() -> (FakeKube, KubeCluster) {
        let fake = FakeKube::start().await;
        fake.put(with_heartbeat(node("cp1", true, true, false, Some("p"))));
        fake.put(with_heartbeat(node("w1", false, true, false, Some("p"))));
        fake.put(with_heartbeat(node("w2", false, true, false, Some("p"))));
        fake.put(system_pod("coredns-1", "kube-dns", "cp1"));
        let kube = fake.kube().await;
        let cluster: kprov::spec::Cluster = serde_saphyr::from_str(
            "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: c\nspec:\n  cloudProvider: metal\n",
        )
        .unwrap();
        let expect = Expectations {
            named: vec![
                ("cp1".into(), true),
                ("w1".into(), false),
                ("w2".into(), false),
            ],
            min_control_plane: 1,
            min_nodes: 3,
            ccm: false,
            cni: None,
        };
        (
            fake,
            KubeCluster {
                kube,
                cluster,
                expect,
                poll: Duration::from_millis(50),
                etcd: None,
            },
        )
    }

    fn options() -> RollOptions {
        RollOptions {
            drain_timeout: Duration::from_millis(1500),
            validation_timeout: Duration::from_secs(10),
            validate_count: 2,
            validation_interval: Duration::from_millis(50),
            ready_timeout: Duration::from_secs(5),
            cloud_only: false,
        }
    }

    fn unschedulable(fake: &FakeKube, name: &str) -> bool {
        fake.get("Node", None, name).unwrap()["spec"]["unschedulable"].as_bool() == Some(true)
    }

    /// etcd as the gate sees it: healthy, or the sentence of an unhealthy member.
    struct Etcd(Mutex<Option<String>>);

    #[async_trait]
    impl rolling::EtcdHealth for Etcd {
        async fn check(&self) -> Result<(), rolling::EtcdError> {
            match self.0.lock().unwrap().clone() {
                None => Ok(()),
                Some(e) => Err(rolling::EtcdError::Unhealthy(e)),
            }
        }
    }

    /// Validation is the API's checks (nodes, kube-system workloads, uninitialized nodes)
    /// and etcd's: each failure named, both reported when both fail, and it passes only when
    /// all of them pass.
    #[tokio::test]
    async fn validation_asks_etcd_and_kube_system_workloads_and_names_what_fails() {
        use kprov::ops::rolling::ClusterApi;
        let (fake, mut api) = setup().await;
        let etcd = Arc::new(Etcd(Mutex::new(None)));
        api.etcd = Some(etcd.clone());
        api.validate().await.expect("healthy");

        let member = "etcd member cp2 (peer https://198.18.0.12:2380, on host cp2) is unhealthy";
        *etcd.0.lock().unwrap() = Some(member.into());
        let e = api.validate().await.unwrap_err().to_string();
        assert_eq!(e, member);

        // A kube-system Deployment short of replicas and a DaemonSet short of pods.
        fake.put(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                     "template": {"metadata": {"labels": {"k8s-app": "kube-dns"}}, "spec": {"containers": []}}},
            "status": {"replicas": 2, "availableReplicas": 1},
        }));
        fake.put(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "kube-proxy", "namespace": "kube-system"},
            "spec": {"selector": {"matchLabels": {"k8s-app": "kube-proxy"}},
                     "template": {"metadata": {"labels": {"k8s-app": "kube-proxy"}}, "spec": {"containers": []}}},
            "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3,
                       "numberMisscheduled": 0, "numberReady": 2, "numberAvailable": 2},
        }));
        let e = api.validate().await.unwrap_err().to_string();
        assert!(
            e.contains("deployment kube-system/coredns: 1 of 2 replicas available"),
            "{e}"
        );
        assert!(
            e.contains("daemonset kube-system/kube-proxy: 2 of 3 pods available"),
            "{e}"
        );
        assert!(e.ends_with(member), "etcd's failure reported too: {e}");

        // A node the cloud-controller-manager never initialised.
        *etcd.0.lock().unwrap() = None;
        fake.set_status(
            "Deployment",
            Some("kube-system"),
            "coredns",
            json!({"replicas": 2, "availableReplicas": 2}),
        );
        fake.set_status(
            "DaemonSet",
            Some("kube-system"),
            "kube-proxy",
            json!({"desiredNumberScheduled": 3, "currentNumberScheduled": 3,
                   "numberMisscheduled": 0, "numberReady": 3, "numberAvailable": 3}),
        );
        api.validate().await.expect("healthy again");

        // A control-plane static pod (critical, as kubeadm's are) not ready: named, as kops
        // names it; ready again, the cluster passes.
        let mut apiserver = pod(
            "kube-system",
            "kube-apiserver-cp1",
            json!({ "component": "kube-apiserver" }),
            "cp1",
            "Running",
            false,
        );
        apiserver["spec"]["priorityClassName"] = json!("system-node-critical");
        fake.put(apiserver.clone());
        let e = api.validate().await.unwrap_err().to_string();
        assert!(
            e.contains("pod kube-system/kube-apiserver-cp1: system-node-critical pod (on cp1) is Running but not ready (main)"),
            "{e}"
        );
        apiserver["status"]["containerStatuses"][0]["ready"] = json!(true);
        fake.put(apiserver);
        api.validate()
            .await
            .expect("healthy with the API server ready");

        fake.put(node("w2", false, true, true, Some("p")));
        let e = api.validate().await.unwrap_err().to_string();
        assert!(
            e.contains(
                "node w2: still has the node.cloudprovider.kubernetes.io/uninitialized taint"
            ),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_budget_that_never_allows_stops_the_roll_naming_it_and_the_node_stays_cordoned() {
        let (fake, api) = setup().await;
        fake.put(replica_pod("db-1", "db", "w1"));
        fake.put(app_pdb("db", ("minAvailable", json!("100%"))));
        let roller = Recorder::default();
        let events: rolling::RollEvents = Arc::new(|_: &RollEvent| {});
        let (result, dir) = roll(&api, &roller, &events).await;
        let e = result.unwrap_err();
        let RollError::Stopped { node, reason, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(node, "w1");
        assert!(
            reason.contains("PodDisruptionBudget default/db"),
            "{reason}"
        );
        assert!(reason.contains("default/db-1"), "{reason}");
        assert!(reason.contains("stays cordoned"), "{reason}");
        assert!(unschedulable(&fake, "w1"));
        assert!(!unschedulable(&fake, "w2"), "w2 was touched");
        assert!(roller.0.lock().unwrap().is_empty(), "w1 was rolled");
        let store = FileStore::new(dir.path()).unwrap();
        let (_, j) = JournalFile::load(&store, "c").await.unwrap();
        let j = j.unwrap();
        assert_eq!(j.nodes[0].step, NodeStep::Cordoned);
        assert!(
            j.nodes[0]
                .stopped
                .as_deref()
                .unwrap()
                .contains("PodDisruptionBudget default/db")
        );
        assert_eq!(j.nodes[1].step, NodeStep::Waiting);
    }

    #[tokio::test]
    async fn free_nodes_are_drained_rolled_and_uncordoned_one_by_one() {
        let (fake, api) = setup().await;
        fake.run_replicaset_controller();
        fake.put(replica_pod("web-1", "web", "w1"));
        let roller = Recorder::default();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let events: rolling::RollEvents = Arc::new(move |e: &RollEvent| {
            if let RollEvent::Step { node, step, .. } = e {
                s2.lock().unwrap().push(format!("{node} {}", step.as_str()));
            }
        });
        let j = roll(&api, &roller, &events).await.0.unwrap();
        assert!(j.finished);
        assert_eq!(*roller.0.lock().unwrap(), ["w1", "w2"]);
        assert!(!unschedulable(&fake, "w1") && !unschedulable(&fake, "w2"));
        // The pod was evicted (the ReplicaSet controller re-created it on a schedulable node,
        // never on the node being drained: w2 was drained last and holds none).
        assert!(fake.get("Pod", Some("default"), "web-1").is_none());
        let web: Vec<String> = fake
            .list("Pod")
            .into_iter()
            .filter(|p| p["metadata"]["labels"]["app"] == "web")
            .map(|p| p["spec"]["nodeName"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(web.len(), 1, "{web:?}");
        assert_ne!(web[0], "w2", "{web:?}");
        let seen = seen.lock().unwrap().clone();
        let pos = |s: &str| {
            seen.iter()
                .position(|x| x == s)
                .unwrap_or_else(|| panic!("{s}: {seen:?}"))
        };
        assert!(pos("w1 validated") < pos("w2 cordoned"), "{seen:?}");
    }
}

mod roll_with_yes {
    //! `rolling-update cluster --yes` on metal through the binary: sshd test hosts with the
    //! stand-ins, the fake API server as the cluster's API (`--kubeconfig`). What is proven:
    //! a label change rolls every node in order (control plane, then workers), each cordoned
    //! before it is re-provisioned (kubelet flags rewritten, kubelet restarted, labels on the
    //! Node, record rewritten) and uncordoned after; a second run has nothing to roll; a
    //! second operator is refused with exit 4 naming the holder while a roll holds the lock;
    //! a roll killed (SIGKILL) while it drains a node resumes there without re-rolling the
    //! node it had finished; a budget that never allows stops the roll at --drain-timeout
    //! naming it, the node left cordoned. A minor upgrade (two mirrors: the old and the new
    //! version's stand-ins) runs `kubeadm upgrade apply` on the first control plane, then
    //! `kubeadm upgrade node` on the other control planes, then on the worker.

    use std::process::Stdio;
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use serde_json::json;

    use crate::metal::{Lab, VERSION, layout, ok, show, text};
    use crate::support::cli::{fails, says};
    use crate::support::fakekube::{
        FakeKube, app_pdb, daemon_pod, node, owned_by, replica_pod, system_pod, with_heartbeat,
    };

    fn now_ns() -> u128 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_nanos()
    }

    /// Times of `systemctl restart kubelet` on `host` after `since`.
    fn kubelet_restarts(lab: &Lab, host: &str, since: u128) -> Vec<u128> {
        lab.calls(host)
            .into_iter()
            .filter(|(t, c)| *t > since && c.trim() == "systemctl restart kubelet")
            .map(|(t, _)| t)
            .collect()
    }

    fn record(lab: &Lab, host: &str) -> serde_json::Value {
        let r = lab
            .host(host)
            .read_upper("/var/lib/kprov/provisioned.json")
            .unwrap_or_else(|| panic!("{host}: no provisioning record"));
        serde_json::from_slice(&r).expect("record is JSON")
    }

    /// Positions of the cordon requests of `host` in the fake API's request log.
    fn cordons(fake: &FakeKube, host: &str) -> Vec<usize> {
        fake.requests()
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.method == "PATCH"
                    && r.path.ends_with(&format!("/nodes/{host}"))
                    && r.body.replace(' ', "").contains("\"unschedulable\":true")
            })
            .map(|(i, _)| i)
            .collect()
    }

    fn unschedulable(fake: &FakeKube, host: &str) -> bool {
        fake.get("Node", None, host).expect("node")["spec"]["unschedulable"].as_bool() == Some(true)
    }

    fn set_label(lab: &Lab, name: &str, hosts: &[&str], value: &str) {
        lab.edit_cluster(name, |c| {
            for h in c.spec.hosts.iter_mut() {
                if hosts.contains(&h.name.as_str()) {
                    h.labels.insert("tier".into(), value.into());
                }
            }
        });
    }

    /// A lab of `hosts` with the metal cluster `name` on them provisioned: the lab, its
    /// hosts, and the fake API as it shows that cluster (its runtime, itself and its
    /// kubeconfig's path).
    fn provisioned(
        name: &str,
        hosts: Vec<(&'static str, &'static str)>,
    ) -> (
        Lab,
        Vec<(&'static str, &'static str)>,
        tokio::runtime::Runtime,
        FakeKube,
        String,
    ) {
        let lab = Lab::start(hosts.len());
        let inv = lab.inventory(&hosts);
        lab.create_metal(name, &inv);
        lab.provision(name);
        let (rt, fake) = cluster_api(&hosts);
        let kc = fake.kubeconfig.display().to_string();
        (lab, hosts, rt, fake, kc)
    }

    /// The fake API as a healthy metal cluster of `hosts` shows it: a Ready Node each, a
    /// running calico-node pod on each (owned by its DaemonSet), CoreDNS on the last host
    /// (a DaemonSet's pod), the ReplicaSet controller running.
    fn cluster_api(hosts: &[(&str, &str)]) -> (tokio::runtime::Runtime, FakeKube) {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let fake = rt.block_on(FakeKube::start());
        for (h, role) in hosts {
            fake.put(node(h, *role == "control-plane", true, false, None));
            fake.put(daemon_pod(&format!("calico-node-{h}"), "calico-node", h));
        }
        let last = hosts.last().map(|(h, _)| *h).unwrap_or("host1");
        fake.put(owned_by(
            system_pod("coredns-1", "kube-dns", last),
            // Drains skip it: validation finds CoreDNS whichever node rolls, even when
            // every node is a control plane (tainted) and an evicted pod would stay Pending.
            "DaemonSet",
            "coredns-as-a-daemonset",
        ));
        // Evicted ReplicaSet pods come back on another node.
        fake.run_replicaset_controller();
        (rt, fake)
    }

    /// `rolling-update cluster NAME --yes --kubeconfig KC` and `extra`.
    fn roll_args<'a>(name: &'a str, kc: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec![
            "rolling-update",
            "cluster",
            name,
            "--yes",
            "--kubeconfig",
            kc,
        ];
        v.extend_from_slice(extra);
        v
    }

    /// Polls `ready` every 50 ms until it holds; panics (after killing `child`) when the child
    /// exits first or `secs` pass.
    fn wait_for(
        child: &mut std::process::Child,
        secs: u64,
        what: &str,
        mut ready: impl FnMut() -> bool,
    ) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !ready() {
            if Instant::now() > deadline || child.try_wait().expect("wait").is_some() {
                let _ = child.kill();
                let _ = child.wait();
                panic!("never saw: {what}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGINT to the process group of `child`, as a terminal's Ctrl-C sends it.
    fn ctrl_c(child: &std::process::Child) {
        let st = std::process::Command::new("kill")
            .args(["-INT", "--", &format!("-{}", child.id())])
            .status()
            .expect("kill");
        assert!(st.success(), "SIGINT not delivered");
    }

    /// Waits (bounded) for `child` to exit; its exit code.
    fn exit_within(child: &mut std::process::Child, secs: u64) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(st) = child.try_wait().expect("wait") {
                return st.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("kprov did not exit within {secs}s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Ctrl-C to `child`, which must then exit with 130 within `secs`: how long it took, and
    /// what it wrote to `log`.
    fn interrupted(
        child: &mut std::process::Child,
        log: &std::path::Path,
        secs: u64,
    ) -> (Duration, String) {
        let at = Instant::now();
        ctrl_c(child);
        let code = exit_within(child, secs);
        let took = at.elapsed();
        let err = std::fs::read_to_string(log).expect("log");
        assert_eq!(code, Some(130), "{err}");
        (took, err)
    }

    /// The journal's entry of `node`, in the journal of the roll of `name`.
    fn journaled(lab: &Lab, name: &str, node: &str) -> serde_json::Value {
        let j = lab.journal(name).expect("journal");
        j["nodes"]
            .as_array()
            .and_then(|ns| ns.iter().find(|n| n["nodeName"] == node).cloned())
            .unwrap_or_else(|| panic!("{node} not in the journal: {j}"))
    }

    /// A roll (one validation pass of at most 3 s) that the gate refuses before it starts,
    /// exit 1: when it started, and its output; the fake API logs only its requests.
    fn refused_at_the_gate(
        lab: &Lab,
        fake: &FakeKube,
        name: &str,
        kc: &str,
    ) -> (u128, std::process::Output) {
        let t0 = now_ns();
        fake.clear_requests();
        let gate = ["--validate-count", "1", "--validation-timeout", "3s"];
        let o = lab.kprov(&roll_args(name, kc, &gate));
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        (t0, o)
    }

    /// Starts the roll `args` and sends Ctrl-C once `host`'s kubelet restart (a step of its
    /// re-provision) has begun; the roll finishes that step first, so it must still run half
    /// a second later (`cut` says otherwise).
    fn ctrl_c_in_a_restart(
        lab: &Lab,
        args: &[&str],
        log: &std::path::Path,
        host: &str,
        cut: &str,
    ) -> std::process::Child {
        let since = now_ns();
        let mut child = spawn(lab, args, log);
        wait_for(
            &mut child,
            120,
            &format!("{host}'s kubelet restart"),
            || !kubelet_restarts(lab, host, since).is_empty(),
        );
        ctrl_c(&child);
        std::thread::sleep(Duration::from_millis(500));
        assert!(child.try_wait().expect("wait").is_none(), "{cut}");
        child
    }

    /// `kprov` started in the background in a process group of its own (a terminal's job),
    /// stderr to `log`.
    fn spawn(lab: &Lab, args: &[&str], log: &std::path::Path) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        lab.kprov_command(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log"))
            .process_group(0)
            .spawn()
            .expect("kprov starts")
    }

    /// etcd's health is part of the validation gate, read over SSH on the first member that
    /// answers (the stand-in's member list on host1; three stacked control planes): an
    /// unhealthy member refuses the roll before any node is touched, naming it; a member that
    /// goes unhealthy after the first control plane stops the roll at that gate, naming it,
    /// the other control planes untouched; healed, the next run resumes without rolling the
    /// first control plane again.
    #[test]
    fn an_unhealthy_etcd_member_refuses_the_roll_and_one_lost_mid_roll_stops_it_at_the_gate() {
        crate::needs_tier!(SshdHosts);
        let name = "etcdgate.metal.example.com";
        let (lab, hosts, _rt, fake, kc) = provisioned(name, layout(3, 0));
        let addr3 = lab.host("host3").address.clone();
        let named =
            format!("etcd member host3 (peer https://{addr3}:2380, on host host3) is unhealthy");
        set_label(&lab, name, &["host1", "host2", "host3"], "web");
        const HEALTHY: [(u64, &str, bool); 3] =
            [(1, "host1", true), (2, "host2", true), (3, "host3", true)];
        const HOST3_DOWN: [(u64, &str, bool); 3] =
            [(1, "host1", true), (2, "host2", true), (3, "host3", false)];

        // 1. host2's member is down before the roll: refused, nothing touched.
        lab.seed_etcd_members("host1", &HOST3_DOWN);
        let (t0, o) = refused_at_the_gate(&lab, &fake, name, &kc);
        let err = text(&o.stderr);
        assert!(err.contains(&named), "{}", show(&o));
        assert!(err.contains("before the roll starts"), "{}", show(&o));
        assert!(err.contains("2 of 3 members healthy"), "{}", show(&o));
        assert!(
            !fake.requests().iter().any(|r| r.is_write()),
            "the API was written to: {:?}",
            fake.requests()
        );
        for (h, _) in hosts {
            assert!(kubelet_restarts(&lab, h, t0).is_empty(), "{h} touched");
            assert!(record(&lab, h)["labels"].get("tier").is_none(), "{h}");
            assert_eq!(lab.journal_step(name, h).as_deref(), Some("waiting"), "{h}");
        }
        // The member list was read inside host1's etcd container.
        assert!(
            lab.calls("host1")
                .iter()
                .any(|(t, c)| *t > t0 && c.contains("etcdctl") && c.contains("member list")),
            "{:?}",
            lab.calls("host1")
        );

        // 2. Healthy again; host3's member fails while host1 is re-provisioned: the gate after
        //    host1 stops the roll naming it, host2 and host3 untouched. host1's kubelet
        //    restart is held until the member is down, so the gate after host1 cannot pass
        //    before it (on a busy machine it did: the test waited on wall-clock luck).
        lab.seed_etcd_members("host1", &HEALTHY);
        let hold = "/var/lib/kprov-standins/systemd/kubelet.restart-hold";
        lab.host("host1")
            .exec(&format!(
                "mkdir -p /var/lib/kprov-standins/systemd && touch {hold}"
            ))
            .expect("hold host1's kubelet restart");
        let t1 = now_ns();
        let log = lab.dir.path().join("gate.log");
        let args = roll_args(
            name,
            &kc,
            &["--validate-count", "2", "--validation-timeout", "25s"],
        );
        let mut child = spawn(&lab, &args, &log);
        // The bound is for a stuck run only: the event comes when it comes.
        wait_for(&mut child, 600, "host1's kubelet restart (held)", || {
            !kubelet_restarts(&lab, "host1", t1).is_empty()
        });
        lab.seed_etcd_members("host1", &HOST3_DOWN);
        lab.host("host1")
            .exec(&format!("rm -f {hold}"))
            .expect("release host1's kubelet restart");
        let code = exit_within(&mut child, 300);
        let err = std::fs::read_to_string(&log).expect("log");
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains("did not pass validation 2 times in a row")
                && err.contains("after host1")
                && err.contains(&named),
            "{err}"
        );
        assert_eq!(record(&lab, "host1")["labels"]["tier"], "web");
        assert_eq!(kubelet_restarts(&lab, "host1", t1).len(), 1);
        for h in ["host2", "host3"] {
            assert!(kubelet_restarts(&lab, h, t1).is_empty(), "{h} rolled");
            assert!(cordons(&fake, h).is_empty(), "{h} cordoned");
            assert_eq!(lab.journal_step(name, h).as_deref(), Some("waiting"));
        }
        assert_eq!(
            lab.journal_step(name, "host1").as_deref(),
            Some("uncordoned"),
            "{err}"
        );

        // 3. Healed: the next run resumes at the gate after host1 and rolls the rest only.
        lab.seed_etcd_members("host1", &HEALTHY);
        let t2 = now_ns();
        let o = lab.kprov(&roll_args(
            name,
            &kc,
            &["--validate-count", "1", "--validation-timeout", "30s"],
        ));
        ok(&o);
        says(&o, "Resuming");
        assert!(
            kubelet_restarts(&lab, "host1", t2).is_empty(),
            "host1 again"
        );
        for h in ["host2", "host3"] {
            assert_eq!(record(&lab, h)["labels"]["tier"], "web", "{h}");
        }
    }

    /// With host-deployed etcd (three etcd hosts beside two control planes) the gate asks
    /// the service's etcdctl on the first etcd host: a member down there refuses the roll of a
    /// worker, naming it, before anything is touched.
    #[test]
    fn an_unhealthy_host_deployed_etcd_member_refuses_the_roll() {
        crate::needs_tier!(SshdHosts);
        let lab = Lab::start(5);
        let name = "etcdhost.metal.example.com";
        crate::etcd::provision(&lab, name);
        let hosts = layout(2, 3);
        let (_rt, fake) = cluster_api(&hosts);
        let kc = fake.kubeconfig.display().to_string();
        set_label(&lab, name, &["host4"], "web");
        lab.seed_etcd_members(
            "host1",
            &[(1, "host1", true), (2, "host2", false), (3, "host3", true)],
        );
        let (t0, o) = refused_at_the_gate(&lab, &fake, name, &kc);
        let addr2 = &lab.host("host2").address;
        says(
            &o,
            &format!(
                "etcd member host2 (peer https://{addr2}:2380, on host host2) is unhealthy; 2 of 3 members healthy"
            ),
        );
        // Asked through the host's etcdctl at its own address, not a container.
        let addr1 = &lab.host("host1").address;
        assert!(
            lab.calls("host1").iter().any(|(t, c)| *t > t0
                && c.starts_with(&format!("etcdctl --endpoints https://{addr1}:2379"))
                && c.contains("endpoint health --cluster -w json")),
            "{:?}",
            lab.calls("host1")
        );
        assert!(
            !lab.calls("host1")
                .iter()
                .any(|(t, c)| *t > t0 && c.starts_with("crictl"))
        );
        assert!(!fake.requests().iter().any(|r| r.is_write()));
        assert!(kubelet_restarts(&lab, "host4", t0).is_empty());
    }

    /// Ctrl-C through the binary, sent to its process group as a terminal does:
    /// 0. during the etcd backup before the control plane rolls: the backup finishes, the
    ///    roll stops before its first node (exit 130), the lock is released;
    /// 1. mid-drain (a budget holds host2): the drain is abandoned, exit 130, the message
    ///    names host2 and its step, the journal records it (cordoned, why), the lock is
    ///    released (the next run takes it at once) and that run finishes without rolling
    ///    host1 again;
    /// 2. during a re-provision (a slow kubelet restart on host3): that step is finished (its
    ///    record written), then the roll stops, exit 130, host3 journaled `replaced`;
    /// 3. a second Ctrl-C during such a step exits at once (130), saying the lock stays held;
    ///    after `lock break` the next run rolls host3 again (the cut step is safe to repeat);
    /// 4. SIGTERM mid-drain behaves as the first Ctrl-C.
    #[test]
    fn ctrl_c_stops_at_a_safe_point_journals_it_releases_the_lock_and_a_rerun_resumes() {
        crate::needs_tier!(SshdHosts);
        let name = "ctrlc.metal.example.com";
        let (lab, hosts, _rt, fake, kc) = provisioned(name, layout(1, 2));
        let args = roll_args(
            name,
            &kc,
            &[
                "--validate-count",
                "1",
                "--validation-timeout",
                "60s",
                "--drain-timeout",
                "10m",
            ],
        );
        let log = lab.dir.path().join("ctrlc.log");
        let journal_node = |node: &str| journaled(&lab, name, node);

        // 0. Interrupted during the etcd backup taken before the control plane rolls (the
        //    lock is already held): the backup finishes, the roll stops before its first
        //    node, the lock is released.
        set_label(&lab, name, &["host1", "host2", "host3"], "web");
        let snapshot_delay = "/var/lib/kprov-standins/snapshot-delay";
        lab.host("host1")
            .exec(&format!("echo 2 > {snapshot_delay}"))
            .expect("slow backup");
        let t0 = now_ns();
        fake.clear_requests();
        let mut child = spawn(&lab, &args, &log);
        wait_for(&mut child, 120, "the etcd backup", || {
            lab.calls("host1")
                .iter()
                .any(|(t, c)| *t > t0 && c.contains("snapshot save"))
        });
        let (_, err) = interrupted(&mut child, &log, 60);
        assert!(err.contains("etcd backed up from host1"), "{err}");
        assert!(
            err.contains("interrupted: during validation before the roll starts"),
            "{err}"
        );
        for (h, _) in hosts {
            assert_eq!(journal_node(h)["step"], "waiting", "{h}");
            assert!(kubelet_restarts(&lab, h, t0).is_empty(), "{h}");
        }
        assert!(!fake.requests().iter().any(|r| r.is_write()), "{err}");
        lab.assert_unlocked(name);
        lab.host("host1")
            .exec(&format!("rm -f {snapshot_delay}"))
            .expect("fast backup");

        // 1. Interrupted while host2's drain waits on a budget.
        fake.put(replica_pod("db-1", "db", "host2"));
        fake.put(app_pdb("db", ("minAvailable", json!("100%"))));
        let mut child = spawn(&lab, &args, &log);
        wait_for(&mut child, 120, "host2's drain", || {
            lab.journal_step(name, "host2").as_deref() == Some("cordoned")
                && fake
                    .requests()
                    .iter()
                    .any(|r| r.path.ends_with("/eviction"))
        });
        let (stopped_in, err) = interrupted(&mut child, &log, 30);
        assert!(
            err.contains("interrupted: host2 was cordoned (drain abandoned"),
            "{err}"
        );
        assert!(
            err.contains("run `rolling-update cluster --yes` again"),
            "{err}"
        );
        let n2 = journal_node("host2");
        assert_eq!(n2["step"], "cordoned", "{n2}");
        assert!(
            n2["stopped"]
                .as_str()
                .is_some_and(|s| s.contains("abandoned by an interrupt")),
            "{n2}"
        );
        assert_eq!(journal_node("host1")["step"], "validated");
        assert_eq!(journal_node("host3")["step"], "waiting");
        assert!(unschedulable(&fake, "host2"), "host2 stays cordoned");
        // The lock was released on the way out.
        lab.assert_unlocked(name);

        // ... and the next run takes it at once, resumes at host2, leaves host1 alone.
        fake.put(app_pdb("db", ("maxUnavailable", json!(1))));
        let t1 = now_ns();
        fake.clear_requests();
        let o = lab.kprov(&args);
        ok(&o);
        says(&o, "Resuming");
        assert!(
            kubelet_restarts(&lab, "host1", t1).is_empty(),
            "host1 again"
        );
        assert!(cordons(&fake, "host1").is_empty(), "host1 cordoned again");
        for h in ["host2", "host3"] {
            assert_eq!(record(&lab, h)["labels"]["tier"], "web", "{h}");
            assert!(!unschedulable(&fake, h), "{h}");
        }

        // 2. Interrupted while host3's re-provision restarts the kubelet (slowly): the step
        //    is finished, then the roll stops.
        set_label(&lab, name, &["host3"], "api");
        let delay = "/var/lib/kprov-standins/systemd/kubelet.restart-delay";
        lab.host("host3")
            .exec(&format!("echo 3 > {delay}"))
            .expect("slow restart");
        let mut child = ctrl_c_in_a_restart(&lab, &args, &log, "host3", "the re-provision was cut");
        let code = exit_within(&mut child, 60);
        let err = std::fs::read_to_string(&log).expect("log");
        assert_eq!(code, Some(130), "{err}");
        assert!(err.contains("interrupted: host3 was replaced"), "{err}");
        assert_eq!(journal_node("host3")["step"], "replaced");
        assert_eq!(record(&lab, "host3")["labels"]["tier"], "api", "{err}");

        // 3. Twice during such a step: out at once, the lock left held.
        ok(&lab.kprov(&args));
        set_label(&lab, name, &["host3"], "db");
        lab.host("host3")
            .exec(&format!("echo 60 > {delay}"))
            .expect("slower restart");
        let mut child = ctrl_c_in_a_restart(&lab, &args, &log, "host3", "out after one");
        let (out_in, err) = interrupted(&mut child, &log, 10);
        assert!(err.contains("interrupted twice"), "{err}");
        let o = lab.kprov(&args);
        assert_eq!(o.status.code(), Some(4), "{}", show(&o));
        assert_eq!(journal_node("host3")["step"], "drained");
        lab.host("host3")
            .exec(&format!("rm -f {delay}"))
            .expect("fast restart");
        ok(&lab.kprov(&["lock", "break", name]));
        let o = lab.kprov(&args);
        ok(&o);
        assert_eq!(
            record(&lab, "host3")["labels"]["tier"],
            "db",
            "{}",
            show(&o)
        );

        // 4. SIGTERM (a service manager stopping kprov) is a first Ctrl-C, exit 143.
        set_label(&lab, name, &["host2"], "db");
        fake.put(replica_pod("db-9", "db", "host2"));
        fake.put(app_pdb("db", ("minAvailable", json!("100%"))));
        fake.clear_requests();
        let mut child = spawn(&lab, &args, &log);
        wait_for(&mut child, 120, "host2's drain", || {
            fake.requests()
                .iter()
                .any(|r| r.path.ends_with("/pods/db-9/eviction"))
        });
        let st = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(st.success());
        let code = exit_within(&mut child, 30);
        let err = std::fs::read_to_string(&log).expect("log");
        assert_eq!(code, Some(143), "128 + SIGTERM, as shells report it: {err}");
        assert!(err.contains("interrupted: host2 was cordoned"), "{err}");
        assert!(
            err.contains(&format!(
                "The lock of {name} is released. Resume with `kprov rolling-update cluster {name} --yes`."
            )),
            "{err}"
        );
        assert_eq!(journal_node("host2")["step"], "cordoned");
        lab.assert_unlocked(name);
        eprintln!(
            "ctrl-c figures: mid-drain interrupt to exit {stopped_in:?}; second interrupt to exit {out_in:?}"
        );
    }

    /// Ctrl-C during the roll's API waits on metal, sent once kprov says it waits (its
    /// progress line), never after a sleep: out within a second of the signal (far below the
    /// wait's own 15-minute Ready timeout or the 10-minute validation timeout given), the
    /// lock released, the resume said, the journal recording what was in flight.
    /// 1. The wait for the re-provisioned node's Ready (host2's Node reads NotReady after its
    ///    kubelet restart): host2 journaled `replaced`, stopped while waiting for Ready.
    /// 2. The validation gate after host2 (etcd's second member unhealthy from the moment
    ///    host2's kubelet restarts, so the gate before the roll passed): host2 journaled
    ///    `uncordoned`, stopped during the validation after it; healed, the next run resumes
    ///    without re-provisioning host2.
    #[test]
    fn ctrl_c_ends_the_rolls_ready_and_validation_waits_within_a_second() {
        crate::needs_tier!(SshdHosts);
        use crate::support::signals::wait_for_log;
        const EXIT_WITHIN: Duration = Duration::from_secs(2);
        let name = "apiwait.metal.example.com";
        let (lab, _, _rt, fake, kc) = provisioned(name, layout(1, 1));
        let args = roll_args(
            name,
            &kc,
            &["--validate-count", "1", "--validation-timeout", "10m"],
        );
        let log = lab.dir.path().join("apiwait.log");
        let hold = "/var/lib/kprov-standins/systemd/kubelet.restart-hold";
        let journal_node = |node: &str| journaled(&lab, name, node);
        let resume = format!(
            "The lock of {name} is released. Resume with `kprov rolling-update cluster {name} --yes`."
        );
        let ready = |r: bool| {
            fake.set_status(
                "Node",
                None,
                "host2",
                json!({ "conditions": [{ "type": "Ready", "status": if r { "True" } else { "False" }, "reason": "KubeletReady" }] }),
            )
        };
        // Holds host2's kubelet restart, runs `during` once it is called, then lets it go.
        let held_restart = |child: &mut std::process::Child, since: u128, during: &dyn Fn()| {
            wait_for(child, 600, "host2's kubelet restart (held)", || {
                !kubelet_restarts(&lab, "host2", since).is_empty()
            });
            during();
            lab.host("host2")
                .exec(&format!("rm -f {hold}"))
                .expect("release host2's kubelet restart");
        };

        // Ctrl-C to a roll waiting on host2: out within EXIT_WITHIN (how long it took), saying
        // where it stopped (`why`) and how to resume, host2 journaled at `step`, `stopped`, the
        // lock released.
        let stops = |child: &mut std::process::Child, why: &str, step: &str, stopped: &str| {
            let (took, err) = interrupted(child, &log, 60);
            assert!(took < EXIT_WITHIN, "exit took {took:?}\n{err}");
            assert!(err.contains(why), "{err}");
            assert!(err.contains(&resume), "{err}");
            let n2 = journal_node("host2");
            assert_eq!(n2["step"], step, "{n2}");
            assert_eq!(n2["stopped"], stopped, "{n2}");
            lab.assert_unlocked(name);
            took
        };
        // Healed, the next run takes the lock at once and finishes, host2 not re-provisioned
        // a second time.
        let resumes = || {
            let since = now_ns();
            let o = lab.kprov(&args);
            ok(&o);
            says(&o, "Resuming");
            assert!(
                kubelet_restarts(&lab, "host2", since).is_empty(),
                "{}",
                show(&o)
            );
        };

        // 1. The wait for Ready.
        set_label(&lab, name, &["host2"], "web");
        lab.host("host2")
            .exec(&format!(
                "mkdir -p /var/lib/kprov-standins/systemd && touch {hold}"
            ))
            .expect("hold host2's kubelet restart");
        let t0 = now_ns();
        let mut child = spawn(&lab, &args, &log);
        held_restart(&mut child, t0, &|| ready(false));
        wait_for_log(
            &mut child,
            &log,
            "host2: waiting for host2 to be Ready",
            300,
        );
        let ready_wait_took = stops(
            &mut child,
            "interrupted: host2 was replaced (waiting for Ready)",
            "replaced",
            "interrupted while waiting for Ready",
        );
        ready(true);
        resumes();

        // 2. The validation gate after host2.
        set_label(&lab, name, &["host2"], "db");
        lab.host("host2")
            .exec(&format!("touch {hold}"))
            .expect("hold host2's kubelet restart");
        let t2 = now_ns();
        let mut child = spawn(&lab, &args, &log);
        held_restart(&mut child, t2, &|| {
            lab.seed_etcd_members("host1", &[(1, "host1", true), (2, "host2", false)])
        });
        wait_for_log(&mut child, &log, "validation: not yet", 300);
        let took = stops(
            &mut child,
            "interrupted: during validation after host2",
            "uncordoned",
            "interrupted during the validation after host2",
        );
        lab.seed_etcd_members("host1", &[(1, "host1", true)]);
        resumes();
        assert_eq!(journal_node("host2")["step"], "validated");
        assert_eq!(record(&lab, "host2")["labels"]["tier"], "db");
        eprintln!(
            "ctrl-c figures: Ready wait to exit {ready_wait_took:?}; validation wait to exit {took:?}"
        );
    }

    #[test]
    fn a_label_change_rolls_in_order_resumes_after_a_kill_and_stops_at_a_budget() {
        crate::needs_tier!(SshdHosts);
        let name = "rollyes.metal.example.com";
        let hosts = layout(1, 2);
        let lab = Lab::provisioned(name, &hosts);

        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let fake = rt.block_on(FakeKube::start());
        let kc = fake.kubeconfig.display().to_string();
        for &(h, role) in &hosts {
            fake.put(with_heartbeat(node(
                h,
                role == "control-plane",
                true,
                false,
                None,
            )));
            fake.put(daemon_pod(&format!("calico-node-{h}"), "calico-node", h));
        }
        fake.run_replicaset_controller();
        fake.put(owned_by(
            system_pod("coredns-1", "kube-dns", "host2"),
            "ReplicaSet",
            "coredns-rs",
        ));
        let roll_args = |extra: &[&str]| -> Vec<String> {
            let mut v = vec!["--validate-count", "1", "--validation-timeout", "60s"];
            v.extend_from_slice(extra);
            roll_args(name, &kc, &v)
                .into_iter()
                .map(String::from)
                .collect()
        };
        let roll = |extra: &[&str]| {
            let args = roll_args(extra);
            lab.kprov(&args.iter().map(String::as_str).collect::<Vec<_>>())
        };

        // 1. Every node's labels change: control plane first, then the workers, one by one.
        // Each kubelet restart plays out on the API as a real one does: the old Ready for a
        // moment, NotReady, then Ready with a new heartbeat.
        set_label(&lab, name, &["host1", "host2", "host3"], "web");
        let t0 = now_ns();
        fake.clear_requests();
        // For the rest of the test: every later roll restarts kubelets too.
        let _kubelets = fake.follow_kubelets(
            hosts
                .iter()
                .map(|(h, _)| {
                    (
                        h.to_string(),
                        lab.host(h).dir().join("log/kprov-standins.log"),
                    )
                })
                .collect(),
            Duration::from_millis(1500),
            Duration::from_millis(500),
        );
        let o = roll(&[]);
        let out = ok(&o);
        // Each node uncordoned only after its restarted kubelet posted Ready, and the next
        // one cordoned only after that (the old wait took the stale Ready and moved on).
        let t = super::engine_on_the_fake_api::timeline(&fake);
        let at = |node: &str, what: &str| {
            t.iter()
                .find(|(_, n, w)| n == node && *w == what)
                .map(|(i, _, _)| *i)
                .unwrap_or_else(|| panic!("no {what} of {node}: {t:?}\n{}", show(&o)))
        };
        for (k, (h, _)) in hosts.iter().enumerate() {
            assert!(
                at(h, "ready") < at(h, "uncordon"),
                "{h} uncordoned on a stale Ready: {t:?}"
            );
            if let Some((next, _)) = hosts.get(k + 1) {
                assert!(
                    at(h, "ready") < at(next, "cordon"),
                    "{next} cordoned before {h}'s fresh Ready: {t:?}"
                );
            }
        }
        for (h, _) in hosts {
            assert_eq!(
                record(&lab, h)["labels"]["tier"],
                "web",
                "{h}\n{}",
                show(&o)
            );
            let flags = lab
                .host(h)
                .read_upper("/var/lib/kubelet/kubeadm-flags.env")
                .unwrap_or_else(|| panic!("{h}: no kubelet flags"));
            assert!(
                text(&flags).contains("--node-labels=tier=web"),
                "{h}: {}",
                text(&flags)
            );
            let n = fake.get("Node", None, h).expect("node");
            assert_eq!(n["metadata"]["labels"]["tier"], "web", "{h}: {n}");
            assert!(!unschedulable(&fake, h), "{h} left cordoned");
            // The engine cordons, and the drain makes sure (as kubectl's does).
            assert!(!cordons(&fake, h).is_empty(), "{h} never cordoned");
            assert_eq!(kubelet_restarts(&lab, h, t0).len(), 1, "{h} restarted once");
            assert!(out.contains(h), "{h} missing from the final table:\n{out}");
        }
        let c = |h| cordons(&fake, h)[0];
        assert!(c("host1") < c("host2") && c("host2") < c("host3"));
        // etcd was backed up into the store before the control plane rolled.
        assert!(
            show(&o).contains("Backing up etcd of"),
            "no backup announced:\n{}",
            show(&o)
        );
        let backups = ok(&lab.kprov(&["get", "backups", name, "-o", "json"]));
        let backups: serde_json::Value = serde_json::from_str(&backups).expect("backups json");
        assert_eq!(
            backups.as_array().map(Vec::len),
            Some(1),
            "one backup before the control plane rolled: {backups}"
        );
        let snapshot_at = lab
            .calls("host1")
            .into_iter()
            .find(|(_, c)| c.contains("snapshot save"))
            .map(|(t, _)| t)
            .expect("the snapshot was taken on host1");
        assert!(
            t0 < snapshot_at && snapshot_at < kubelet_restarts(&lab, "host1", t0)[0],
            "the backup was not taken in this roll before the control plane was re-provisioned"
        );
        let r = |h| kubelet_restarts(&lab, h, t0)[0];
        assert!(r("host1") < r("host2") && r("host2") < r("host3"));
        says(&o, "validated");

        // 2. Nothing left: a second run says so and touches nothing.
        fake.clear_requests();
        let o = roll(&[]);
        assert!(
            ok(&o).contains("leave alone") && text(&o.stderr).contains("No rolling update needed"),
            "{}",
            show(&o)
        );
        assert!(cordons(&fake, "host2").is_empty());

        // 3. A roll killed while it drains host3 (a budget holds it): a second operator is
        //    refused meanwhile; after the lock is broken the next run resumes at host3 and
        //    leaves host2, already rolled, alone.
        set_label(&lab, name, &["host2", "host3"], "api");
        fake.put(replica_pod("db-1", "db", "host3"));
        fake.put(app_pdb("db", ("minAvailable", json!("100%"))));
        let args = roll_args(&["--drain-timeout", "10m"]);
        let mut child = lab
            .kprov_command(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("kprov starts");
        let deadline = Instant::now() + Duration::from_secs(90);
        while !unschedulable(&fake, "host3") {
            if Instant::now() > deadline || child.try_wait().expect("wait").is_some() {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the roll never reached host3's drain");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let o = roll(&[]);
        assert_eq!(o.status.code(), Some(4), "{}", show(&o));
        assert!(
            text(&o.stderr).contains("is locked by")
                && text(&o.stderr).contains(&format!("pid {}", child.id())),
            "{}",
            show(&o)
        );
        let t1 = now_ns();
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
        assert_eq!(record(&lab, "host2")["labels"]["tier"], "api");
        assert_eq!(record(&lab, "host3")["labels"]["tier"], "web");
        ok(&lab.kprov(&["lock", "break", name]));
        fake.put(app_pdb("db", ("maxUnavailable", json!(1))));
        fake.clear_requests();
        let o = roll(&[]);
        ok(&o);
        says(&o, "Resuming");
        assert_eq!(record(&lab, "host3")["labels"]["tier"], "api");
        assert!(
            kubelet_restarts(&lab, "host2", t1).is_empty(),
            "host2 rolled again"
        );
        assert_eq!(kubelet_restarts(&lab, "host3", t1).len(), 1);
        assert!(cordons(&fake, "host2").is_empty(), "host2 cordoned again");
        assert!(!unschedulable(&fake, "host3"));

        // 4. A budget that never allows: the roll stops at --drain-timeout naming it; the node
        //    stays cordoned and is not re-provisioned.
        set_label(&lab, name, &["host3"], "db");
        fake.put(replica_pod("db-2", "db", "host3"));
        fake.put(app_pdb("db", ("minAvailable", json!("100%"))));
        let t2 = now_ns();
        let o = roll(&["--drain-timeout", "3s"]);
        fails(&o, 1);
        says(&o, "host3");
        says(&o, "PodDisruptionBudget default/db");
        assert!(unschedulable(&fake, "host3"));
        assert!(kubelet_restarts(&lab, "host3", t2).is_empty());
        assert_eq!(record(&lab, "host3")["labels"]["tier"], "api");
    }

    #[test]
    fn a_minor_upgrade_rolls_control_planes_first_apply_then_node_then_the_kubelets() {
        crate::needs_tier!(SshdHosts);
        const FROM: &str = "1.34.4";
        let lab = Lab::start(4);
        let old = crate::support::mirror::Mirror::start(lab.gateway().parse().expect("ip"), FROM);
        let name = "upgrade.metal.example.com";
        let hosts = layout(3, 1);
        let inv = lab.inventory(&hosts);
        ok(&lab.kprov(
            &[
                &crate::support::cli::create_metal(name, &inv)[..],
                &["--kubernetes-version", FROM],
            ]
            .concat(),
        ));
        lab.edit_cluster(name, |c| {
            c.spec.assets = Some(kprov::spec::Assets {
                bundle: None,
                mirror: None,
                images: Vec::new(),
                files: old.asset_files(),
                checksums: Vec::new(),
            })
        });
        lab.provision(name);
        for &(h, _) in &hosts {
            assert_eq!(record(&lab, h)["kubernetesVersion"], FROM);
        }

        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let fake = rt.block_on(FakeKube::start());
        let kc = fake.kubeconfig.display().to_string();
        for &(h, role) in &hosts {
            fake.put(node(h, role == "control-plane", true, false, None));
            fake.put(daemon_pod(&format!("calico-node-{h}"), "calico-node", h));
        }
        fake.put(owned_by(
            system_pod("coredns-1", "kube-dns", "host4"),
            "DaemonSet",
            "coredns-as-a-daemonset",
        ));

        // The next minor, from the pinned assets of the lab's mirror.
        lab.edit_cluster(name, |c| {
            c.spec.kubernetes_version = Some(VERSION.into());
        });
        lab.use_mirror(name, None);
        // The new version's images as an archive on the operator's machine (ctr is a
        // stand-in: it records the archive's checksum, see tests/it/images.rs).
        let (archive, image_sha) = crate::images::image_archive(
            lab.dir.path(),
            "kube-next",
            &format!("registry.k8s.io/kube-proxy:v{VERSION}"),
        );
        lab.edit_cluster(name, |c| {
            c.spec.assets.as_mut().expect("assets").images = vec![kprov::spec::ImageArchive {
                url: format!("file://{archive}"),
                sha256: image_sha.clone(),
            }];
        });
        let o = lab.kprov(&["update", "cluster", name, "--yes", "--skip-addons"]);
        says(&o, "pending a rolling update");
        // `update` leaves outdated members alone, their images too: the roll brings them.
        for (h, _) in hosts {
            assert!(crate::images::imports(&lab, h).is_empty(), "{h}");
        }
        let t0 = now_ns();
        let once = ["--validate-count", "1", "--validation-timeout", "60s"];
        let o = lab.kprov(&roll_args(name, &kc, &once));
        ok(&o);
        let call = |h: &str, prefix: &str| -> Vec<u128> {
            lab.calls(h)
                .into_iter()
                .filter(|(t, c)| *t > t0 && c.starts_with(prefix))
                .map(|(t, _)| t)
                .collect()
        };
        let apply = call("host1", &format!("kubeadm upgrade apply v{VERSION} --yes"));
        assert_eq!(apply.len(), 1, "{}", show(&o));
        assert!(call("host1", "kubeadm upgrade node").is_empty());
        for h in ["host2", "host3", "host4"] {
            assert!(call(h, "kubeadm upgrade apply").is_empty(), "{h}");
            assert_eq!(call(h, "kubeadm upgrade node").len(), 1, "{h}");
        }
        let node2 = call("host2", "kubeadm upgrade node")[0];
        let node3 = call("host3", "kubeadm upgrade node")[0];
        let node4 = call("host4", "kubeadm upgrade node")[0];
        assert!(
            apply[0] < node2.min(node3) && node2.max(node3) < node4,
            "control planes first"
        );
        // The kubelet restarts on the new binary after kubeadm's upgrade, on every node; the
        // new images were imported (once) before kubeadm's upgrade ran.
        for h in ["host1", "host2", "host3", "host4"] {
            let upgrade = call(h, "kubeadm upgrade")[0];
            let imported = call(h, "ctr -n k8s.io images import");
            assert_eq!(imported.len(), 1, "{h}");
            assert!(
                imported[0] < upgrade,
                "{h}: images imported after kubeadm upgrade"
            );
            assert_eq!(
                crate::images::imports(&lab, h),
                [(image_sha.clone(), "k8s.io".to_string())],
                "{h}"
            );
            assert!(
                !kubelet_restarts(&lab, h, upgrade).is_empty(),
                "{h}: kubelet not restarted after the upgrade"
            );
            assert_eq!(record(&lab, h)["kubernetesVersion"], VERSION, "{h}");
            assert!(!unschedulable(&fake, h), "{h}");
        }
        // The new binaries came from the new version's assets.
        assert!(
            lab.mirror_downloads()
                .iter()
                .any(|d| d.contains(&format!("v{VERSION}")) && d.contains("kubeadm")),
            "{:?}",
            lab.mirror_downloads()
        );
        let o = lab.kprov(&["rolling-update", "cluster", name, "--exit-code"]);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    }
}
