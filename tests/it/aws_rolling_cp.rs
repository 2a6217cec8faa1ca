//! A Kubernetes minor upgrade on AWS through the binary, in the cloud lab (moto, every instance
//! an sshd test host, the stand-in kubeadm recording its calls with their times): a private
//! cluster (reached through `bastion.NAME`) with three control planes and two workers at
//! 1.34.4 (a second mirror serves that version's stand-ins) → `kubernetesVersion` 1.35.1 and
//! the bastion group's `image` changed → `update cluster --yes` makes launch template version
//! 2, leaves the running members and the bastion alone and reports them pending → the preview
//! lists the bastion first (`launch template version 1 -> 2`, table and JSON), the control
//! planes as re-provisioned in place (one with `kubeadm upgrade apply`), the workers as
//! replaced, and writes nothing → with etcd unhealthy the backup fails and `--yes` stops
//! before anything changed → `rolling-update --yes` backs etcd up first (listed by `get
//! backups`), replaces the bastion before any node (no API call for it; `bastion.NAME` leads
//! to the new one, through which the control planes are then reached), upgrades the control
//! planes one at a time in place (the
//! same instances: `upgrade apply` on exactly one, then `upgrade node` on the others), then
//! replaces the workers (the new instances join at 1.35.1) → journal finished, nothing left to
//! roll → the bastion, forced, is replaced without any API call for it, and the cluster is
//! reached through the new one.
//!
//! Needs root.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kprov::spec::{InstanceGroupRole, Object};

use crate::aws_lifecycle::{code, text, with_call};
use crate::support::awsroll::{CreateAws, lab_with_zone, launched, ok_saying};
use crate::support::cli::{fails, says};
use crate::support::cloudlab::VERSION;
use crate::support::mirror::Mirror;
use crate::support::snapshot;
use crate::support::testhosts::{TestHost, in_netns};

/// The minor before the lab mirror's (the metal upgrade test's pin).
const FROM: &str = "1.34.4";
/// Another stock image of moto's: the bastion group's new image (launch template version 2).
const BASTION_IMAGE: &str = "099720109477/ubuntu/images/hvm-ssd/ubuntu-trusty-14.04-amd64-server-*";
const BASTION_WHY: &str = "launch template version 1 -> 2";

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos()
}

fn record(h: &TestHost) -> serde_json::Value {
    let bytes = h
        .read_upper("/var/lib/kprov/provisioned.json")
        .unwrap_or_else(|| panic!("{}: no provisioning record", h.address));
    serde_json::from_slice(&bytes).expect("record parses")
}

fn is_control_plane(h: &TestHost) -> bool {
    h.read_upper("/etc/kubernetes/manifests/kube-apiserver.yaml")
        .is_some()
}

/// The times of the stand-in calls starting with `prefix` after `since`.
fn calls(h: &TestHost, since: u128, prefix: &str) -> Vec<u128> {
    h.standin_calls()
        .into_iter()
        .filter(|(t, c)| *t > since && c.starts_with(prefix))
        .map(|(t, _)| t)
        .collect()
}

#[test]
fn a_minor_upgrade_on_aws_rolls_control_planes_in_place_then_replaces_the_workers() {
    crate::needs_tier!(CloudLab);
    let cluster = "upgrade.lab.example";
    let lab = lab_with_zone("lab.example");
    let gateway = lab.net.gateway;
    let old = in_netns(&lab.net.router_ns, || Mirror::start(gateway.into(), FROM));
    CreateAws::new(cluster)
        .version(FROM)
        .flags(&[
            "--control-plane-count",
            "3",
            "--node-count",
            "2",
            "--topology",
            "private",
            "--bastion",
        ])
        .run(&lab);
    lab.use_asset_files(cluster, old.asset_files());
    lab.watch();
    let yes = ["update", "cluster", cluster, "--yes"];
    code(&lab, &lab.kprov(&yes), 0);
    code(
        &lab,
        &lab.kprov(&["validate", "cluster", cluster, "--wait", "60s"]),
        0,
    );
    let before = lab.instances();
    let control_planes: Vec<String> = before
        .iter()
        .filter(|(_, h)| is_control_plane(h))
        .map(|(id, _)| id.clone())
        .collect();
    let workers: Vec<String> = before
        .iter()
        .filter(|(_, h)| {
            !is_control_plane(h) && h.read_upper("/etc/kubernetes/kubelet.conf").is_some()
        })
        .map(|(id, _)| id.clone())
        .collect();
    let bastions: Vec<String> = before
        .iter()
        .filter(|(_, h)| h.standin_calls().is_empty())
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(
        (control_planes.len(), workers.len(), bastions.len()),
        (3, 2, 1),
        "{:?}",
        before.keys()
    );
    for id in control_planes.iter().chain(&workers) {
        assert_eq!(record(&before[id])["kubernetesVersion"], FROM, "{id}");
    }

    // The next minor, from the lab mirror's pinned assets: `update cluster --yes` leaves the
    // running members alone and says they wait for a roll.
    lab.edit_objects(cluster, |objects| {
        for o in objects {
            match o {
                Object::Cluster(c) => c.spec.kubernetes_version = Some(VERSION.into()),
                // The bastion's launch template changes with it: replaced first.
                Object::InstanceGroup(g) if g.spec.role == InstanceGroupRole::Bastion => {
                    g.spec.image = Some(BASTION_IMAGE.into());
                }
                _ => {}
            }
        }
    });
    lab.use_mirror(cluster);
    let t_update = now_ns();
    ok_saying(&lab, &yes, "pending a rolling update");
    assert_eq!(
        lab.instances().keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "update cluster --yes replaced an instance"
    );
    for (id, h) in &before {
        assert!(
            calls(h, t_update, "kubeadm upgrade").is_empty(),
            "{id} upgraded by update cluster"
        );
    }

    // The preview: control planes in place (one with `upgrade apply`), workers replaced, why;
    // exit 2; read-only.
    let (store0, hosts0) = (snapshot(&lab.store_dir()), lab.hosts_snapshot());
    lab.fake.clear_requests();
    let preview = ["rolling-update", "cluster", cluster, "--exit-code"];
    let o = lab.kprov(&preview);
    let out = code(&lab, &o, 2);
    let why = format!("kubernetesVersion {FROM} -> {VERSION}");
    let line = |id: &str| -> String {
        let node = &before[id].name;
        out.lines()
            .find(|l| l.starts_with(node.as_str()))
            .unwrap_or_else(|| panic!("{id} ({node}) not in the preview:\n{out}"))
            .to_string()
    };
    // The bastion first, replaced because of its template (table and JSON).
    let bastion_line = |l: &&str| {
        l.contains(bastions[0].as_str()) || l.contains(before[&bastions[0]].name.as_str())
    };
    let first = out
        .lines()
        .position(|l| {
            before.values().any(|h| l.contains(h.name.as_str())) || l.contains(bastions[0].as_str())
        })
        .unwrap_or_else(|| panic!("no instance in the preview:\n{out}"));
    let l = out.lines().nth(first).unwrap_or_default();
    assert!(bastion_line(&l), "the bastion is not first:\n{out}");
    assert!(l.contains("replace") && l.contains(BASTION_WHY), "{l}");
    let doc: serde_json::Value = serde_json::from_str(&code(
        &lab,
        &lab.kprov(&["rolling-update", "cluster", cluster, "-o", "json"]),
        0,
    ))
    .expect("one JSON document");
    let groups = doc["groups"].as_array().expect("groups");
    let g = &groups[0];
    assert_eq!(g["name"], "bastions", "{doc}");
    let n = &g["nodes"][0];
    assert_eq!(
        (&n["target"], &n["action"], &n["reasons"]),
        (
            &serde_json::json!(bastions[0]),
            &serde_json::json!("replace"),
            &serde_json::json!([BASTION_WHY])
        ),
        "{doc}"
    );
    let mut applies = 0;
    for id in &control_planes {
        let l = line(id);
        assert!(
            l.contains("re-provision in place") && l.contains(&why),
            "{l}"
        );
        applies += usize::from(l.contains("kubeadm upgrade apply"));
    }
    assert_eq!(applies, 1, "{out}");
    for id in &workers {
        let l = line(id);
        assert!(l.contains("replace") && l.contains(&why), "{l}");
    }
    assert!(
        text(&o.stderr).contains(&format!(
            "Kubernetes {FROM} -> {VERSION}: control planes first"
        )),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(snapshot(&lab.store_dir()), store0, "the preview wrote");
    assert_eq!(lab.hosts_snapshot(), hosts0, "the preview changed a host");
    assert!(
        lab.fake.requests().iter().all(|r| !r.is_write()),
        "the preview wrote to the API"
    );

    // etcd unhealthy on every member: the backup fails, and the roll stops before anything
    // changed (no journal, no cordon, no kubeadm).
    let members = "/var/lib/kprov-standins/etcd-members";
    for id in &control_planes {
        before[id]
            .exec(&format!(
                "mkdir -p /var/lib/kprov-standins && echo '1 etcd-0 https://127.0.0.1:2380 https://127.0.0.1:2379 false' > {members}"
            ))
            .expect("etcd made unhealthy");
    }
    let t_refused = now_ns();
    lab.fake.clear_requests();
    let roll = [
        "rolling-update",
        "cluster",
        cluster,
        "--yes",
        "--validate-count",
        "1",
        "--validation-timeout",
        "3m",
    ];
    let o = lab.kprov(&roll);
    fails(&o, 1);
    says(&o, "the etcd backup before the control-plane roll failed");
    assert!(
        lab.fake.requests().iter().all(|r| !r.is_write()),
        "a refused roll wrote to the API"
    );
    for (id, h) in &lab.instances() {
        assert!(
            calls(h, t_refused, "kubeadm").is_empty(),
            "{id}: kubeadm ran in a refused roll"
        );
    }
    assert!(
        !lab.store_dir()
            .join(cluster)
            .join("journal/rolling-update.json")
            .exists(),
        "a refused roll left a journal"
    );
    for id in &control_planes {
        before[id]
            .exec(&format!("rm -f {members}"))
            .expect("etcd healthy again");
    }

    // The roll.
    let t0 = now_ns();
    let started = Instant::now();
    let o = lab.kprov(&roll);
    code(&lab, &o, 0);
    let wall = started.elapsed();
    eprintln!(
        "upgraded 3 control planes in place and replaced 2 workers in {wall:?}\n{}",
        text(&o.stderr)
    );
    lab.sync();
    let now = lab.instances();
    // The bastion, replaced first: its replacement waited for before any control plane's
    // step, no API call about it, and the control planes were reached through the new one.
    let err = text(&o.stderr);
    let step_lines: Vec<&str> = err
        .lines()
        .filter(|l| !l.contains("Backing up etcd") && !l.contains("etcd backed up"))
        .collect();
    let replaced_at = step_lines
        .iter()
        .position(|l| l.contains("replacement bastion"))
        .unwrap_or_else(|| panic!("the bastion was not replaced:\n{err}"));
    let first_node = step_lines
        .iter()
        .position(|l| {
            control_planes
                .iter()
                .chain(&workers)
                .any(|id| l.contains(before[id].name.as_str()))
        })
        .unwrap_or_else(|| panic!("no node step:\n{err}"));
    assert!(
        replaced_at < first_node,
        "a node rolled before the bastion:\n{err}"
    );
    let new_bastion = replacement_bastion(&bastions[0], &before, &now);
    assert_eq!(
        launched(&lab, std::slice::from_ref(&new_bastion))[&new_bastion]
            .template_version
            .as_deref(),
        Some("2")
    );
    assert_eq!(
        lab.names()[&format!("bastion.{cluster}")].to_string(),
        now[&new_bastion].address,
        "bastion.{cluster} does not lead to the new bastion"
    );
    let old_bastion_name = before[&bastions[0]].name.clone();
    // No step it never went through is reported for it.
    for l in err
        .lines()
        .filter(|l| l.starts_with(&format!("{old_bastion_name}:")))
    {
        assert!(
            !l.contains(": cordoned") && !l.contains(": drained") && !l.contains(": uncordoned"),
            "{l}"
        );
    }
    assert!(
        err.lines()
            .any(|l| l.starts_with(&format!("{old_bastion_name}: validated"))),
        "{err}"
    );
    let bastion_writes: Vec<String> = lab
        .fake
        .requests()
        .iter()
        .filter(|r| {
            r.is_write()
                && (r.path.contains(&old_bastion_name) || r.path.contains(&now[&new_bastion].name))
        })
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        bastion_writes.is_empty(),
        "API writes for the bastion: {bastion_writes:?}"
    );
    // The control planes were upgraded after the bastion was replaced, so through the new one,
    // checked against the group's host key (strict): each saw a login from it.
    let via = &now[&new_bastion].address;
    for id in &control_planes {
        assert!(
            now[id].log().contains(&format!("from {via} port")),
            "{id} was not reached through the new bastion {via}: {}",
            now[id].log()
        );
    }
    // In place: the same instances, upgraded one at a time, `apply` on exactly one, first.
    let mut upgrades = Vec::new();
    for id in &control_planes {
        let h = now
            .get(id)
            .unwrap_or_else(|| panic!("control plane {id} was replaced"));
        let apply = calls(h, t0, &format!("kubeadm upgrade apply v{VERSION} --yes"));
        let node = calls(h, t0, "kubeadm upgrade node");
        assert_eq!(apply.len() + node.len(), 1, "{id}: {:?}", h.standin_calls());
        let restarts = calls(h, t0, "systemctl restart kubelet");
        let at = apply.first().or(node.first()).copied().unwrap_or_default();
        assert!(
            restarts.iter().any(|r| *r > at),
            "{id}: kubelet not restarted after its upgrade"
        );
        upgrades.push((at, !apply.is_empty(), id.clone()));
        assert_eq!(record(h)["kubernetesVersion"], VERSION, "{id}");
    }
    upgrades.sort();
    assert!(upgrades[0].1, "upgrade apply was not first: {upgrades:?}");
    assert!(
        !upgrades[1].1 && !upgrades[2].1,
        "upgrade apply ran more than once: {upgrades:?}"
    );
    // One at a time: each control plane's kubelet restarted before the next one's upgrade.
    for pair in upgrades.windows(2) {
        let done = calls(&now[&pair[0].2], t0, "systemctl restart kubelet");
        assert!(
            done.iter().any(|r| *r < pair[1].0),
            "{} upgraded before {} finished: {upgrades:?}",
            pair[1].2,
            pair[0].2
        );
    }
    // etcd was backed up into the store before the first control plane changed.
    let snapshots: Vec<u128> = control_planes
        .iter()
        .flat_map(|id| {
            now[id]
                .standin_calls()
                .into_iter()
                .filter(|(t, c)| *t > t0 && c.contains("snapshot save"))
                .map(|(t, _)| t)
        })
        .collect();
    assert_eq!(snapshots.len(), 1, "{snapshots:?}");
    assert!(
        snapshots[0] < upgrades[0].0,
        "the backup came after an upgrade"
    );
    assert!(
        text(&o.stderr).contains("Backing up etcd of"),
        "{}",
        text(&o.stderr)
    );
    let backups: serde_json::Value = serde_json::from_str(&code(
        &lab,
        &lab.kprov(&["get", "backups", cluster, "-o", "json"]),
        0,
    ))
    .expect("backups json");
    assert_eq!(backups.as_array().map(Vec::len), Some(1), "{backups}");
    // Then the workers: replaced, the new instances joined at the new version, after every
    // control plane was upgraded.
    for id in &workers {
        assert!(!now.contains_key(id), "worker {id} still runs");
    }
    let last_cp = upgrades[2].0;
    let joined = with_call(&lab, "kubeadm join");
    let new: Vec<&String> = now
        .keys()
        .filter(|id| !before.contains_key(*id) && joined.contains(id))
        .collect();
    assert_eq!(new.len(), 2, "{:?}", now.keys());
    for id in &new {
        let h = &now[*id];
        assert_eq!(record(h)["kubernetesVersion"], VERSION, "{id}");
        let join = calls(h, 0, "kubeadm join");
        assert!(
            join[0] > last_cp,
            "{id} joined before the control planes were upgraded"
        );
    }
    assert!(
        lab.mirror
            .requests
            .lock()
            .expect("mirror requests")
            .iter()
            .any(|p| p.contains(&format!("v{VERSION}")) && p.contains("kubeadm")),
        "the new kubeadm did not come from the new version's assets"
    );
    let journal: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            lab.store_dir()
                .join(cluster)
                .join("journal/rolling-update.json"),
        )
        .expect("journal"),
    )
    .expect("journal parses");
    assert_eq!(journal["finished"], true, "{journal}");
    let nodes = journal["nodes"].as_array().expect("journal nodes");
    assert_eq!(nodes.len(), 6, "{journal}");
    assert!(nodes.iter().all(|n| n["step"] == "validated"), "{journal}");
    ok_saying(&lab, &preview, "No rolling update needed");

    // The bastion, forced: replaced through its group, no API call about it, and the cluster
    // is reached through the new one.
    lab.fake.clear_requests();
    let o = lab.kprov(&[
        "rolling-update",
        "cluster",
        cluster,
        "--yes",
        "--force",
        "--instance-group-roles",
        "Bastion",
        "--validate-count",
        "1",
    ]);
    code(&lab, &o, 0);
    let err = text(&o.stderr);
    assert!(err.contains("replacement bastion"), "{err}");
    lab.sync();
    let after = lab.instances();
    let fresh = replacement_bastion(&new_bastion, &now, &after);
    let node_writes = lab.fake.writes();
    assert!(
        node_writes.is_empty(),
        "a bastion roll wrote to the API: {node_writes:?}"
    );
    let calls_before = with_call(&lab, "kubeadm");
    let o = lab.kprov(&["update", "cluster", cluster, "--exit-code"]);
    code(&lab, &o, 0);
    assert_eq!(with_call(&lab, "kubeadm"), calls_before);
    let names = lab.names();
    let bastion = names[&format!("bastion.{cluster}")].to_string();
    assert_eq!(
        after[&fresh].address, bastion,
        "bastion.{cluster} does not lead to the new bastion"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !after[&fresh].log().contains("Accepted publickey") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        after[&fresh].log().contains("Accepted publickey"),
        "nobody logged in to the new bastion: {}",
        after[&fresh].log()
    );

    code(
        &lab,
        &lab.kprov(&["delete", "cluster", cluster, "--yes"]),
        0,
    );
    lab.sync();
    assert!(lab.sync_errors().is_empty(), "{:?}", lab.sync_errors());
}

/// The one bastion (a host with no stand-in calls) in `after` that was not in `before`, once
/// `old` is gone.
fn replacement_bastion(
    old: &str,
    before: &BTreeMap<String, Arc<TestHost>>,
    after: &BTreeMap<String, Arc<TestHost>>,
) -> String {
    assert!(!after.contains_key(old), "the old bastion still runs");
    let fresh: Vec<&String> = after
        .iter()
        .filter(|(id, h)| !before.contains_key(*id) && h.standin_calls().is_empty())
        .map(|(id, _)| id)
        .collect();
    assert_eq!(fresh.len(), 1, "{:?}", after.keys());
    fresh[0].clone()
}
