//! `kprov delete instance` end to end on sshd test hosts, with the fake API server playing the
//! cluster's API (the stand-ins run none): a worker removed (pods evicted, host reset, Node
//! deleted, spec updated), the last control plane refused, a PodDisruptionBudget that blocks
//! past --drain-timeout (named; the node stays cordoned, nothing else changes), a host the
//! inventory lost shown as "to remove" and removed from kprov's record, and a control plane of
//! three removed with its etcd member first (refused while that would lose quorum).

use std::process::Output;

use serde_json::json;

use crate::metal::{Lab, layout, ok, show, text};
use crate::support::cli::{fails, holds_all, says};
use crate::support::fakekube::{FakeKube, app_pdb, daemon_pod, replica_pod, static_pod};

struct Api {
    fake: FakeKube,
    rt: tokio::runtime::Runtime,
}

impl Api {
    fn start() -> Api {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let fake = rt.block_on(FakeKube::start());
        Api { fake, rt }
    }
    fn kubeconfig(&self) -> String {
        self.fake.kubeconfig.display().to_string()
    }
}

/// `kprov delete instance NAME HOST --kubeconfig KC EXTRA...`.
fn delete_instance(lab: &Lab, kc: &str, name: &str, host: &str, extra: &[&str]) -> Output {
    let mut args = vec!["delete", "instance", name, host, "--kubeconfig", kc];
    args.extend(extra);
    lab.kprov(&args)
}

fn has_call(lab: &Lab, host: &str, prefix: &str) -> Option<u128> {
    lab.calls(host)
        .into_iter()
        .find(|(_, c)| c.starts_with(prefix))
        .map(|(t, _)| t)
}

fn spec_hosts(lab: &Lab, name: &str) -> String {
    ok(&lab.kprov(&["get", "cluster", name, "-o", "yaml"]))
}

#[test]
fn remove_a_worker_refuse_the_last_control_plane_and_stop_at_a_blocking_budget() {
    crate::needs_tier!(SshdHosts);
    let name = "rm.metal.example.com";
    let lab = Lab::provisioned(name, &layout(1, 2));
    let api = Api::start();
    let kc = api.kubeconfig();
    api.fake.put_nodes(&["host1"], &["host2", "host3"]);
    api.fake.run_replicaset_controller();
    api.fake.put(replica_pod("web-1", "web", "host2"));
    api.fake
        .put(daemon_pod("calico-node-h2", "calico-node", "host2"));
    api.fake.put(static_pod("kube-apiserver-host1", "host1"));

    // Preview: what will happen, nothing done.
    let o = delete_instance(&lab, &kc, name, "host2", &[]);
    let out = ok(&o);
    says(
        &o,
        &format!("Must specify --yes to remove host2 from {name}."),
    );
    assert!(out.contains("host2") && out.contains("node"), "{out}");
    assert!(out.contains("Pods to evict (1):\n  default/web-1"), "{out}");
    assert!(
        out.contains("kube-system/calico-node-h2: left alone (DaemonSet-managed (calico-node))"),
        "{out}"
    );
    assert!(out.contains("etcd: no etcd member on this host"), "{out}");
    says(&o, "Must specify --yes");
    assert!(
        !api.fake.requests().iter().any(|r| r.is_write()),
        "the preview wrote to the API"
    );
    assert!(has_call(&lab, "host2", "kubeadm reset").is_none());
    let json_preview = ok(&delete_instance(&lab, &kc, name, "host2", &["-o", "json"]));
    let v: serde_json::Value = serde_json::from_str(&json_preview).expect("json preview");
    assert_eq!(v["node"], "host2");
    assert_eq!(v["etcd"]["state"], "noEtcd");
    assert!(
        v["pods"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pod"] == "default/web-1" && p["action"] == "evict"),
        "{v}"
    );

    // The last control plane is refused, preview and --yes alike; nothing happens.
    for extra in [&[][..], &["--yes"]] {
        let o = delete_instance(&lab, &kc, name, "host1", extra);
        assert_eq!(o.status.code(), Some(1), "{}", show(&o));
        says(&o, "host1 is the last control plane");
    }
    assert!(!api.fake.unschedulable("host1"));
    assert!(has_call(&lab, "host1", "kubeadm reset").is_none());

    // Another operator holds the cluster's lock: refused (exit 4) naming them; nothing done.
    {
        let guard = lab.hold_lock(&api.rt, name, "another operator's rolling update");
        let o = delete_instance(&lab, &kc, name, "host2", &["--yes"]);
        assert_eq!(o.status.code(), Some(4), "{}", show(&o));
        says(&o, "another operator's rolling update");
        assert!(!api.fake.unschedulable("host2"));
        api.rt.block_on(guard.release()).expect("release");
    }

    // --yes: cordon, evict (the replacement lands on host3), reset, delete the Node, spec.
    let o = delete_instance(&lab, &kc, name, "host2", &["--yes"]);
    ok(&o);
    let err = text(&o.stderr);
    assert!(err.contains("host2: evicting default/web-1"), "{err}");
    assert!(
        err.contains("host2: 1 pod(s) evicted, 1 left alone"),
        "{err}"
    );
    assert!(err.contains("Removed host2 from"), "{err}");
    assert!(api.fake.get("Pod", Some("default"), "web-1").is_none());
    assert_eq!(
        api.fake.pods_on("host3").len(),
        1,
        "the ReplicaSet's replacement"
    );
    assert!(
        api.fake.get("Node", None, "host2").is_none(),
        "Node object kept"
    );
    has_call(&lab, "host2", "kubeadm reset").expect("host2 reset");
    assert!(
        lab.host("host2")
            .exec("test -e /etc/kubernetes/kubelet.conf")
            .is_err()
    );
    assert!(has_call(&lab, "host3", "kubeadm reset").is_none());
    let spec = spec_hosts(&lab, name);
    assert!(!spec.contains("name: host2"), "{spec}");
    assert!(spec.contains("name: host3"), "{spec}");
    assert!(!lab.store_dir().join(name).join("hosts/host2").exists());
    // Nothing left to remove; the preview of the cluster no longer mentions host2.
    let o = lab.kprov(&["update", "cluster", name, "--exit-code"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(!text(&o.stdout).contains("host2") && !text(&o.stderr).contains("host2"));

    // A budget that never allows the eviction: stopped at --drain-timeout, the budget named,
    // the node left cordoned, the host not reset, the Node and the spec kept.
    api.fake.put(replica_pod("api-1", "api", "host3"));
    api.fake.put(app_pdb("api", ("minAvailable", json!(1))));
    let started = std::time::Instant::now();
    let o = delete_instance(
        &lab,
        &kc,
        name,
        "host3",
        &["--yes", "--drain-timeout", "3s"],
    );
    let err = fails(&o, 1);
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    holds_all(
        &err,
        &[
            "draining node host3: 1 pod(s) did not leave within 3s",
            "default/api-1 blocked by PodDisruptionBudget default/api",
            "stays cordoned",
        ],
    );
    assert!(api.fake.unschedulable("host3"));
    assert!(api.fake.get("Node", None, "host3").is_some());
    assert!(api.fake.get("Pod", Some("default"), "api-1").is_some());
    assert!(has_call(&lab, "host3", "kubeadm reset").is_none());
    assert!(spec_hosts(&lab, name).contains("name: host3"));

    // Ctrl-C (then SIGTERM) while the drain waits on that budget: out within a second of the
    // signal, the drain named as what was in flight, the lock released, the resume said;
    // the node stays cordoned and nothing else changed.
    {
        use crate::support::signals::{ctrl_c, exit_within, log_text, spawn, term, wait_for_log};
        let dir = tempfile::tempdir().expect("tmp");
        let log = dir.path().join("delete.log");
        let args = [
            "delete",
            "instance",
            name,
            "host3",
            "--kubeconfig",
            &kc,
            "--yes",
            "--drain-timeout",
            "15m",
        ];
        for (signal, want) in [("INT", 130), ("TERM", 143)] {
            let mut child = spawn(lab.kprov_command(&args), &log);
            wait_for_log(&mut child, &log, "blocked by PodDisruptionBudget", 120);
            if signal == "INT" {
                ctrl_c(&child);
            } else {
                term(&child);
            }
            let (code, took) = exit_within(&mut child, 30);
            let err = log_text(&log);
            assert_eq!(code, Some(want), "{err}");
            assert!(
                took < std::time::Duration::from_secs(2),
                "exit took {took:?}\n{err}"
            );
            assert!(
                err.contains(&format!("interrupted by SIG{signal} while draining host3")),
                "{err}"
            );
            assert!(
                err.contains(&format!(
                    "Resume with `kprov delete instance {name} host3 --yes`."
                )),
                "{err}"
            );
            lab.assert_unlocked(name);
        }
        assert!(api.fake.unschedulable("host3"));
        assert!(api.fake.get("Pod", Some("default"), "api-1").is_some());
        assert!(has_call(&lab, "host3", "kubeadm reset").is_none());
        assert!(spec_hosts(&lab, name).contains("name: host3"));
    }

    // The operator drops host3 from the inventory instead: `update cluster` does not leave it
    // silently in the cluster, it points at `delete instance`, which still reaches the host
    // through kprov's record of it.
    lab.edit_cluster(name, |c| c.spec.hosts.retain(|h| h.name != "host3"));
    let o = lab.kprov(&["update", "cluster", name, "--exit-code"]);
    let err = fails(&o, 2);
    holds_all(
        &err,
        &[
            "host3",
            "to remove",
            &format!("kprov delete instance {name} host3"),
        ],
    );
    api.fake.put(replica_pod("api-2", "api", "host1"));
    let o = delete_instance(&lab, &kc, name, "host3", &["--yes"]);
    ok(&o);
    has_call(&lab, "host3", "kubeadm reset").expect("host3 reset");
    assert!(api.fake.get("Node", None, "host3").is_none());
    let o = lab.kprov(&["update", "cluster", name, "--exit-code"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(!text(&o.stderr).contains("to remove"), "{}", show(&o));
}

fn members_on(lab: &Lab, on: &str) -> String {
    lab.host(on)
        .exec("cat /var/lib/kprov-standins/etcd-members")
        .expect("members file")
}

#[test]
fn remove_a_control_plane_of_three_removes_its_etcd_member_first_and_refuses_quorum_loss() {
    crate::needs_tier!(SshdHosts);
    let name = "cp.metal.example.com";
    let lab = Lab::provisioned(name, &layout(3, 1));
    let api = Api::start();
    let kc = api.kubeconfig();
    api.fake.put_nodes(&["host1", "host2", "host3"], &["host4"]);
    for h in ["host1", "host2", "host3"] {
        api.fake.put(static_pod(&format!("etcd-{h}"), h));
    }
    // host3's etcd is down: removing host2 would leave host1 + a broken host3.
    let degraded = [(1, "host1", true), (2, "host2", true), (3, "host3", false)];
    lab.seed_etcd_members("host1", &degraded);
    let o = delete_instance(&lab, &kc, name, "host2", &["--yes"]);
    let err = fails(&o, 1);
    assert!(err.contains("would lose etcd quorum"), "{err}");
    assert!(err.contains("unhealthy: host3"), "{err}");
    assert!(
        !api.fake.unschedulable("host2"),
        "cordoned despite the refusal"
    );
    assert!(has_call(&lab, "host2", "kubeadm reset").is_none());
    assert!(
        !lab.calls("host1")
            .iter()
            .any(|(_, c)| c.contains("member remove")),
        "a member was removed despite the refusal"
    );
    assert_eq!(members_on(&lab, "host1").lines().count(), 3);
    // The member list was read on host1, another control plane, inside its etcd container
    // with the etcd static pod's certificates.
    let list = lab
        .calls("host1")
        .into_iter()
        .find(|(_, c)| c.contains("member list"))
        .expect("member list on host1")
        .1;
    assert!(list.starts_with("crictl exec"), "{list}");
    assert!(
        list.contains("--cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt"),
        "{list}"
    );

    // Healthy again: the preview names the member; --yes removes it before resetting host2.
    lab.seed_etcd_members(
        "host1",
        &[(1, "host1", true), (2, "host2", true), (3, "host3", true)],
    );
    let out = ok(&delete_instance(&lab, &kc, name, "host2", &[]));
    assert!(
        out.contains(
            "member host2 (2) is removed through host1 first; 2 of 3 members remain, 2 healthy"
        ),
        "{out}"
    );
    assert!(
        out.contains("kube-system/etcd-host2: left alone (mirror pod"),
        "{out}"
    );
    assert!(
        out.contains("the host stays in the spec") && out.contains("Note: "),
        "{out}"
    );
    let o = delete_instance(&lab, &kc, name, "host2", &["--yes"]);
    ok(&o);
    let removed = lab
        .calls("host1")
        .into_iter()
        .find(|(_, c)| c.contains("etcdctl") && c.ends_with("member remove 2"))
        .expect("member remove on host1")
        .0;
    let reset = has_call(&lab, "host2", "kubeadm reset").expect("host2 reset");
    assert!(
        removed < reset,
        "the member was removed after the host was reset"
    );
    assert_eq!(members_on(&lab, "host1").lines().count(), 2);
    assert!(!members_on(&lab, "host1").contains("host2"));
    assert!(api.fake.get("Node", None, "host2").is_none());
    assert!(has_call(&lab, "host3", "kubeadm reset").is_none());
    // Two stacked control planes are not a valid spec: host2 stays in it, and the operator is
    // told that the next update provisions it again (how a control plane is replaced).
    let err = text(&o.stderr);
    assert!(
        err.contains("host2 stays in the spec") && err.contains("use an odd number"),
        "{err}"
    );
    assert!(spec_hosts(&lab, name).contains("name: host2"));
    let o = lab.kprov(&["update", "cluster", name, "--exit-code"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
}
