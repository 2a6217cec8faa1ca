//! `Kube::drain` and the node edits around it against the fake API server: what is skipped,
//! refused and evicted, budgets that block and unblock, the bounded timeout naming the budget,
//! pods stuck Terminating, taints, uncordon and node deletion.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kprov::kube::{
    DrainError, DrainEvent, DrainOptions, DrainReport, EvictOptions, Kube, SkipReason, Taint,
};
use serde_json::json;

use crate::support::cli::holds_all;
use crate::support::fakekube::{
    FakeKube, app_pdb, daemon_pod, owned_by, pdb, pod, replica_pod, static_pod, with_empty_dir,
};

fn options(timeout: Duration) -> DrainOptions {
    DrainOptions {
        timeout,
        delete_emptydir_data: false,
        force_unmanaged: false,
        poll: Duration::from_millis(50),
        eviction: EvictOptions {
            deadline: timeout,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(200),
        },
    }
}

/// Drains `node` within `timeout`, its events ignored.
async fn drain(kube: &Kube, node: &str, timeout: Duration) -> Result<DrainReport, DrainError> {
    kube.drain(node, &options(timeout), &|_: &DrainEvent| {})
        .await
}

/// Records every drain event.
#[derive(Default, Clone)]
struct Seen(Arc<Mutex<Vec<DrainEvent>>>);

impl Seen {
    fn sink(&self) -> impl Fn(&DrainEvent) + Send + Sync + use<> {
        let seen = self.0.clone();
        move |e: &DrainEvent| seen.lock().unwrap().push(e.clone())
    }
    fn all(&self) -> Vec<DrainEvent> {
        self.0.lock().unwrap().clone()
    }
}

async fn three_nodes() -> (FakeKube, Kube) {
    let fake = FakeKube::start().await;
    fake.put_nodes(&["cp1"], &["w1", "w2"]);
    let kube = fake.kube().await;
    (fake, kube)
}

#[tokio::test]
async fn drain_evicts_managed_pods_and_skips_daemonset_mirror_and_finished_ones() {
    let (fake, kube) = three_nodes().await;
    fake.run_replicaset_controller();
    fake.put(replica_pod("web-1", "web", "w1"));
    fake.put(replica_pod("web-2", "web", "w2"));
    fake.put(with_empty_dir(
        daemon_pod("calico-node-w1", "calico-node", "w1"),
        "tmp",
    ));
    fake.put(static_pod("etcd-w1", "w1"));
    fake.put(pod(
        "default",
        "job-done",
        json!({}),
        "w1",
        "Succeeded",
        false,
    ));
    let seen = Seen::default();
    let report = kube
        .drain("w1", &options(Duration::from_secs(10)), &seen.sink())
        .await
        .unwrap();
    assert_eq!(report.evicted, ["default/web-1"]);
    let mut skipped = report.skipped.clone();
    skipped.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        skipped,
        [
            (
                "default/job-done".to_string(),
                SkipReason::Finished {
                    phase: "Succeeded".into()
                }
            ),
            (
                "kube-system/calico-node-w1".to_string(),
                SkipReason::DaemonSet {
                    name: "calico-node".into()
                }
            ),
            ("kube-system/etcd-w1".to_string(), SkipReason::Mirror),
        ]
    );
    assert!(fake.unschedulable("w1"));
    assert!(fake.get("Pod", Some("default"), "web-1").is_none());
    // The replacement landed on the schedulable worker, not on the cordoned node or the
    // tainted control plane.
    let on_w2 = fake.pods_on("w2");
    assert_eq!(on_w2.len(), 2, "{on_w2:?}");
    assert!(fake.pods_on("cp1").is_empty());
    // Skipped pods stay, and were never sent an eviction.
    let mut left = fake.pods_on("w1");
    left.sort();
    assert_eq!(left, ["calico-node-w1", "etcd-w1", "job-done"]);
    let evictions: Vec<String> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .map(|r| r.path)
        .collect();
    assert_eq!(
        evictions,
        ["/api/v1/namespaces/default/pods/web-1/eviction"]
    );
    let events = seen.all();
    assert_eq!(
        events.first(),
        Some(&DrainEvent::Cordoned { node: "w1".into() })
    );
    let evicting = events
        .iter()
        .position(|e| matches!(e, DrainEvent::Evicting { pod, .. } if pod == "web-1"))
        .expect("Evicting event");
    let evicted = events
        .iter()
        .position(|e| matches!(e, DrainEvent::Evicted { pod, .. } if pod == "web-1"))
        .expect("Evicted event");
    assert!(evicting < evicted, "{events:?}");
}

#[tokio::test]
async fn unmanaged_and_emptydir_pods_are_all_listed_and_nothing_is_evicted() {
    let (fake, kube) = three_nodes().await;
    fake.put(replica_pod("web-1", "web", "w1"));
    fake.put(pod("default", "scratch", json!({}), "w1", "Running", true));
    fake.put(with_empty_dir(
        replica_pod("cache-1", "cache", "w1"),
        "data",
    ));
    let e = drain(&kube, "w1", Duration::from_secs(10))
        .await
        .unwrap_err();
    let DrainError::Refused { node, pods } = &e else {
        panic!("not refused: {e}")
    };
    assert_eq!(node, "w1");
    let names: Vec<&str> = pods.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(names, ["default/cache-1", "default/scratch"]);
    assert!(pods[0].1.contains("emptyDir volume data"), "{pods:?}");
    assert!(
        pods[1].1.contains("not managed by a controller"),
        "{pods:?}"
    );
    let text = e.to_string();
    assert!(text.contains("nothing was evicted"), "{text}");
    assert!(
        !fake
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/eviction")),
        "an eviction was sent despite the refusal"
    );
    assert!(
        fake.unschedulable("w1"),
        "a refused drain leaves the node cordoned"
    );
    // With both switches every pod goes.
    let mut o = options(Duration::from_secs(10));
    o.delete_emptydir_data = true;
    o.force_unmanaged = true;
    let report = kube.drain("w1", &o, &|_: &DrainEvent| {}).await.unwrap();
    let mut evicted = report.evicted.clone();
    evicted.sort();
    assert_eq!(
        evicted,
        ["default/cache-1", "default/scratch", "default/web-1"]
    );
    assert!(fake.pods_on("w1").is_empty());
}

#[tokio::test]
async fn a_budget_that_blocks_is_retried_until_a_replica_moves() {
    let (fake, kube) = three_nodes().await;
    fake.put(replica_pod("web-1", "web", "w1"));
    fake.put(app_pdb("web", ("minAvailable", json!(1))));
    assert_eq!(
        fake.pdb_status("default", "web").unwrap()["disruptionsAllowed"],
        0
    );
    let seen = Seen::default();
    let drain = tokio::spawn({
        let kube = kube.clone();
        let sink = seen.sink();
        async move {
            kube.drain("w1", &options(Duration::from_secs(20)), &sink)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!drain.is_finished(), "drained through a blocking budget");
    // The deployment scales up on the other worker: the budget now allows one disruption.
    fake.put(replica_pod("web-2", "web", "w2"));
    let report = drain.await.unwrap().unwrap();
    assert_eq!(report.evicted, ["default/web-1"]);
    let blocked: Vec<DrainEvent> = seen
        .all()
        .into_iter()
        .filter(|e| matches!(e, DrainEvent::Blocked { .. }))
        .collect();
    // Sent once (the message did not change), naming the budget.
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    let DrainEvent::Blocked { pdb, message, .. } = &blocked[0] else {
        unreachable!()
    };
    assert_eq!(pdb.as_deref(), Some("default/web"));
    assert!(
        message.contains("disruption budget web needs 1 healthy pods"),
        "{message}"
    );
    let attempts = fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/pods/web-1/eviction"))
        .count();
    assert!(
        (3..=15).contains(&attempts),
        "{attempts} attempts: back-off"
    );
}

#[tokio::test]
async fn the_replicaset_controller_moves_pods_so_a_budget_lets_each_go_in_turn() {
    let (fake, kube) = three_nodes().await;
    fake.put(replica_pod("web-1", "web", "w1"));
    fake.put(replica_pod("web-2", "web", "w1"));
    fake.put(app_pdb("web", ("minAvailable", json!(1))));
    // Without the controller, the second pod is blocked once the first is gone.
    let e = drain(&kube, "w1", Duration::from_millis(800))
        .await
        .unwrap_err();
    let DrainError::Timeout { stuck, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(stuck.len(), 1, "{e}");
    assert_eq!(stuck[0].pdb.as_deref(), Some("default/web"));
    // With it, each evicted pod is re-created on w2 and the budget lets the next one go.
    let (fake, kube) = three_nodes().await;
    fake.run_replicaset_controller();
    fake.put(replica_pod("web-1", "web", "w1"));
    fake.put(replica_pod("web-2", "web", "w1"));
    fake.put(app_pdb("web", ("minAvailable", json!(1))));
    let report = drain(&kube, "w1", Duration::from_secs(10)).await.unwrap();
    assert_eq!(report.evicted.len(), 2, "{report:?}");
    assert!(fake.pods_on("w1").is_empty());
    assert_eq!(fake.pods_on("w2").len(), 2);
}

#[tokio::test]
async fn a_budget_that_never_allows_fails_at_the_timeout_naming_node_pod_and_budget() {
    let (fake, kube) = three_nodes().await;
    fake.put(replica_pod("web-1", "web", "w1"));
    fake.put(replica_pod("api-1", "api", "w1"));
    fake.put(app_pdb("web", ("minAvailable", json!("100%"))));
    let timeout = Duration::from_millis(1500);
    let started = Instant::now();
    let e = drain(&kube, "w1", timeout).await.unwrap_err();
    let took = started.elapsed();
    assert!(took >= timeout, "gave up early: {took:?}");
    assert!(
        took < timeout + Duration::from_millis(700),
        "not bounded: {took:?}"
    );
    let DrainError::Timeout {
        node,
        waited,
        stuck,
    } = &e
    else {
        panic!("{e}")
    };
    assert_eq!(node, "w1");
    assert!(*waited >= timeout);
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(stuck[0].pod, "web-1");
    assert_eq!(stuck[0].pdb.as_deref(), Some("default/web"));
    let text = e.to_string();
    assert!(
        text.starts_with("draining node w1: 1 pod(s) did not leave within 1s"),
        "{text}"
    );
    holds_all(
        &text,
        &[
            "default/web-1 blocked by PodDisruptionBudget default/web",
            "would violate the pod's disruption budget",
            "the node stays cordoned",
        ],
    );
    // The other pod went; the blocked one is still there, and the node stays cordoned.
    assert!(fake.get("Pod", Some("default"), "api-1").is_none());
    assert!(fake.get("Pod", Some("default"), "web-1").is_some());
    assert!(fake.unschedulable("w1"));
}

#[tokio::test]
async fn a_pod_stuck_terminating_is_named_with_its_deletion_timestamp() {
    let (fake, kube) = three_nodes().await;
    fake.put(replica_pod("web-1", "web", "w1"));
    fake.stop_kubelet("w1");
    let seen = Seen::default();
    let e = kube
        .drain("w1", &options(Duration::from_millis(800)), &seen.sink())
        .await
        .unwrap_err();
    let DrainError::Timeout { stuck, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(stuck.len(), 1);
    let ts = stuck[0]
        .deletion_timestamp
        .clone()
        .expect("deletionTimestamp");
    assert!(ts.starts_with("20"), "{ts}");
    assert!(
        e.to_string()
            .contains(&format!("still Terminating since {ts}")),
        "{e}"
    );
    assert!(seen.all().contains(&DrainEvent::Waiting { remaining: 1 }));
    // Once the kubelet finishes the pod, the same drain completes.
    fake.start_kubelet("w1");
    let report = drain(&kube, "w1", Duration::from_secs(5)).await.unwrap();
    assert!(
        report.evicted.is_empty(),
        "nothing left to evict: {report:?}"
    );
}

#[tokio::test]
async fn pending_pods_go_despite_a_budget_and_two_budgets_are_an_api_error() {
    let (fake, kube) = three_nodes().await;
    fake.put(owned_by(
        pod(
            "default",
            "web-p",
            json!({"app": "web"}),
            "w1",
            "Pending",
            false,
        ),
        "ReplicaSet",
        "web-rs",
    ));
    fake.put(app_pdb("web", ("minAvailable", json!(5))));
    let report = drain(&kube, "w1", Duration::from_secs(5)).await.unwrap();
    assert_eq!(report.evicted, ["default/web-p"]);
    // The eviction API refuses a pod two budgets select (500); the drain reports it at once.
    fake.put(replica_pod("web-1", "web", "w2"));
    fake.put(pdb(
        "default",
        "web-too",
        json!({"app": "web"}),
        ("maxUnavailable", json!(1)),
    ));
    let started = Instant::now();
    let e = drain(&kube, "w2", Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(matches!(e, DrainError::Api(_)), "{e}");
    assert!(
        e.to_string().contains("more than one PodDisruptionBudget"),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn taints_are_added_once_removed_by_key_and_nodes_uncordoned_and_deleted() {
    let (fake, kube) = three_nodes().await;
    let taint = Taint {
        key: "kprov.dev/replacing".into(),
        value: Some("true".into()),
        effect: "PreferNoSchedule".into(),
    };
    kube.add_taint("cp1", &taint).await.unwrap();
    fake.clear_requests();
    kube.add_taint("cp1", &taint).await.unwrap();
    assert!(
        !fake.requests().iter().any(|r| r.method == "PATCH"),
        "adding a present taint wrote"
    );
    let taints = || fake.get("Node", None, "cp1").unwrap()["spec"]["taints"].clone();
    assert_eq!(
        taints(),
        json!([
            {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
            {"key": "kprov.dev/replacing", "value": "true", "effect": "PreferNoSchedule"}
        ])
    );
    // A changed value updates the taint in place (strategic merge keyed by `key`).
    let changed = Taint {
        value: Some("v2".into()),
        ..taint.clone()
    };
    kube.add_taint("cp1", &changed).await.unwrap();
    assert_eq!(taints()[1]["value"], "v2");
    assert_eq!(taints().as_array().unwrap().len(), 2);
    let patch = fake
        .requests()
        .into_iter()
        .rfind(|r| r.method == "PATCH")
        .unwrap();
    assert!(
        patch
            .content_type
            .starts_with("application/strategic-merge-patch+json")
    );
    kube.remove_taint("cp1", "kprov.dev/replacing")
        .await
        .unwrap();
    assert_eq!(
        taints(),
        json!([{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}])
    );
    fake.clear_requests();
    kube.remove_taint("cp1", "kprov.dev/replacing")
        .await
        .unwrap();
    assert!(!fake.requests().iter().any(|r| r.method == "PATCH"));

    kube.cordon("w1").await.unwrap();
    assert!(fake.unschedulable("w1"));
    kube.uncordon("w1").await.unwrap();
    assert!(!fake.unschedulable("w1"));
    assert!(fake.get("Node", None, "w1").unwrap()["spec"]["unschedulable"].is_null());

    kube.delete_node("w1").await.unwrap();
    assert!(fake.get("Node", None, "w1").is_none());
    kube.delete_node("w1").await.unwrap();
    let e = kube.add_taint("w1", &taint).await.unwrap_err().to_string();
    assert!(e.contains("node w1") && e.contains("404"), "{e}");
}

#[tokio::test]
async fn a_client_that_may_not_list_budgets_still_drains_and_reports_the_block() {
    let (fake, kube) = three_nodes().await;
    fake.put(replica_pod("web-1", "web", "w1"));
    fake.put(app_pdb("web", ("minAvailable", json!(1))));
    fake.forbid_list("poddisruptionbudgets");
    let e = drain(&kube, "w1", Duration::from_millis(600))
        .await
        .unwrap_err();
    let DrainError::Timeout { stuck, .. } = &e else {
        panic!("{e}")
    };
    // The budget cannot be named by selector, but the API server's own message names it.
    assert_eq!(stuck[0].pdb, None);
    assert!(
        stuck[0]
            .message
            .contains("The disruption budget web needs 1"),
        "{e}"
    );
}

#[tokio::test]
async fn two_hundred_pods_are_evicted_in_parallel_within_the_bound() {
    let (fake, kube) = three_nodes().await;
    for i in 0..200 {
        fake.put(replica_pod(&format!("web-{i:03}"), "web", "w1"));
    }
    let started = Instant::now();
    let report = drain(&kube, "w1", Duration::from_secs(20)).await.unwrap();
    let took = started.elapsed();
    eprintln!("drained 200 pods in {took:?}");
    assert_eq!(report.evicted.len(), 200);
    assert!(fake.pods_on("w1").is_empty());
    // One eviction request each (nothing blocked), and few polls of the node's pods.
    let requests = fake.requests();
    let evictions = requests
        .iter()
        .filter(|r| r.path.ends_with("/eviction"))
        .count();
    assert_eq!(evictions, 200);
    let lists = requests.iter().filter(|r| r.path == "/api/v1/pods").count();
    assert!(lists <= 5, "{lists} list calls");
    assert!(took < Duration::from_secs(10), "{took:?}");
}
