//! `rolling-update cluster` on AWS through the binary, in the cloud lab (moto, every instance
//! an sshd test host at its private address, the lab playing kubelets and the CCM in the fake
//! API): a worker group's labels change → `update cluster --yes` leaves the running workers
//! alone → the preview lists them as "replace" with why and exits 2 (read-only) → `--yes`
//! replaces them one batch at a time (the default `maxSurge: 1`: the group grows first, the
//! surge instance joins, then the old node is cordoned, drained, terminated with decrement)
//! → a second preview has nothing to roll → the group's instance type changes: the preview
//! and `get instances` name "launch template version 1 -> 2", and `--yes` puts every worker on
//! the new type. Control planes: aws_rolling_cp.rs.
//!
//! Needs root.

use crate::support::awsroll::{
    PRIVATE_ADDRESSES, assert_listed_as, assert_replaced_in_preview, code, delete_cleanly,
    edit_workers, group_size, instances_listed, journal, launched, nothing_to_roll,
    running_cluster, text, update_yes, with_call, workers,
};
use crate::support::fakekube::{owned_by, pod};
use crate::support::snapshot;

#[test]
fn a_changed_worker_template_rolls_the_workers_one_batch_at_a_time() {
    crate::needs_tier!(CloudLab);
    let cluster = "roll.lab.example";
    let lab = running_cluster(cluster, "lab.example", 2);
    let yes = update_yes(cluster);
    let mut preview = vec!["rolling-update", "cluster", cluster, "--exit-code"];
    preview.extend_from_slice(PRIVATE_ADDRESSES);
    nothing_to_roll(&lab, cluster);
    let o = lab.kprov(&["get", "instances", cluster]);
    let listed = code(&lab, &o, 0);
    assert_eq!(
        listed.lines().filter(|l| l.contains("up to date")).count(),
        3,
        "{listed}"
    );

    // The worker group's labels change (the launch template stays; an image change is
    // aws_rolling_image.rs); the running workers are left for the roll.
    let workers = workers(&lab);
    assert_eq!(workers.len(), 2, "{workers:?}");
    edit_workers(&lab, cluster, |g| {
        g.spec.node_labels.insert("tier".into(), "web".into());
    });
    code(&lab, &lab.kprov(&yes), 0);
    let old: Vec<(String, String)> = {
        let all = lab.instances();
        workers
            .iter()
            .map(|id| (id.clone(), all[id].name.clone()))
            .collect()
    };
    assert!(old.iter().all(|(id, _)| lab.instances().contains_key(id)));

    // The preview: both workers replaced, why, exit 2, read-only.
    let (store0, hosts0) = (snapshot(&lab.store_dir()), lab.hosts_snapshot());
    lab.fake.clear_requests();
    let o = lab.kprov(&preview);
    let out = code(&lab, &o, 2);
    assert_replaced_in_preview(
        &out,
        old.iter().map(|(_, node)| node),
        "labels {} -> {tier=web}",
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("nodes") && l.contains("NeedsUpdate")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("control-plane") && l.contains("Ready")),
        "{out}"
    );
    let mut json = vec!["rolling-update", "cluster", cluster, "-o", "json"];
    json.extend_from_slice(PRIVATE_ADDRESSES);
    let doc: serde_json::Value =
        serde_json::from_str(&code(&lab, &lab.kprov(&json), 0)).expect("one JSON document");
    assert_eq!(doc["platform"], "aws", "{doc}");
    assert_eq!(snapshot(&lab.store_dir()), store0, "the preview wrote");
    assert_eq!(lab.hosts_snapshot(), hosts0, "the preview changed a host");
    assert!(
        lab.fake.requests().iter().all(|r| !r.is_write()),
        "the preview wrote to the API"
    );

    // A pod of a ReplicaSet on the first worker: the drain must evict it before the instance
    // goes.
    lab.fake.put(owned_by(
        pod(
            "default",
            "web-1",
            serde_json::json!({"app": "web"}),
            &old[0].1,
            "Running",
            true,
        ),
        "ReplicaSet",
        "web-rs",
    ));
    lab.fake.clear_requests();
    let mut roll = vec![
        "rolling-update",
        "cluster",
        cluster,
        "--yes",
        "--validation-timeout",
        "3m",
    ];
    roll.extend_from_slice(PRIVATE_ADDRESSES);
    let started = std::time::Instant::now();
    let o = lab.kprov(&roll);
    code(&lab, &o, 0);
    eprintln!(
        "rolled 2 workers in {:?}\n{}",
        started.elapsed(),
        text(&o.stderr)
    );
    lab.sync();
    let now = lab.instances();
    for (id, _) in &old {
        assert!(!now.contains_key(id), "{id} still runs");
    }
    let joined = with_call(&lab, "kubeadm join");
    let new: Vec<&String> = now
        .keys()
        .filter(|id| !workers.contains(id) && joined.contains(id))
        .collect();
    assert_eq!(new.len(), 2, "{:?} joined {joined:?}", now.keys());
    // Per old node: cordoned, drained (its pod evicted), then deleted once its instance was
    // terminated; the second node starts only after the first batch passed validation.
    let reqs = lab.fake.requests();
    let at =
        |pred: &dyn Fn(&crate::support::fakekube::Recorded) -> bool| reqs.iter().position(pred);
    let mut deleted_at = Vec::new();
    for (_, node) in &old {
        let path = format!("/api/v1/nodes/{node}");
        let cordon =
            at(&|r| r.method == "PATCH" && r.path == path && r.body.contains("unschedulable"))
                .unwrap_or_else(|| panic!("{node} never cordoned"));
        let delete = at(&|r| r.method == "DELETE" && r.path == path)
            .unwrap_or_else(|| panic!("{node} never deleted"));
        assert!(cordon < delete, "{node}: deleted before it was cordoned");
        deleted_at.push((cordon, delete));
    }
    let evicted = at(&|r| r.method == "POST" && r.path.ends_with("/pods/web-1/eviction"))
        .expect("web-1 evicted");
    assert!(
        deleted_at[0].0 < evicted && evicted < deleted_at[0].1,
        "web-1 evicted at {evicted}, node cordoned/deleted at {:?}",
        deleted_at[0]
    );
    assert!(
        deleted_at[0].1 < deleted_at[1].0,
        "the second batch started before the first finished: {deleted_at:?}"
    );
    // The surge grew the group by one at a time; it is back to the spec's size.
    assert_eq!(
        group_size(&lab, &format!("nodes.{cluster}")),
        (Some(2), Some(2), Some(2))
    );
    let err = text(&o.stderr);
    assert!(
        err.contains("desired capacity 2 -> 3, max 2 -> 3") && err.contains("shrinking it back"),
        "{err}"
    );
    let j = journal(&lab, cluster);
    assert_eq!(j["finished"], true, "{j}");
    assert!(
        j["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["step"] == "validated" && n["replacement"].is_string()),
        "{j}"
    );

    assert_listed_as(&instances_listed(&lab, cluster), &new, "up to date");

    // Nothing left to roll.
    nothing_to_roll(&lab, cluster);

    // The worker group's instance type changes: a new launch template version. The preview
    // names it for both (new) workers.
    edit_workers(&lab, cluster, |g| {
        g.spec.machine_type = Some("t3.large".into())
    });
    code(&lab, &lab.kprov(&yes), 0);
    let (store1, hosts1) = (snapshot(&lab.store_dir()), lab.hosts_snapshot());
    lab.fake.clear_requests();
    let out = code(&lab, &lab.kprov(&preview), 2);
    let names: Vec<String> = {
        let all = lab.instances();
        new.iter().map(|id| all[*id].name.clone()).collect()
    };
    assert_replaced_in_preview(&out, &names, "launch template version 1 -> 2");
    let listed = code(&lab, &lab.kprov(&["get", "instances", cluster]), 0);
    assert_eq!(
        listed
            .lines()
            .filter(|l| l.contains("needs update: launch template version 1 -> 2"))
            .count(),
        2,
        "{listed}"
    );
    assert_eq!(snapshot(&lab.store_dir()), store1, "the preview wrote");
    assert_eq!(lab.hosts_snapshot(), hosts1, "the preview changed a host");
    assert!(
        lab.fake.requests().iter().all(|r| !r.is_write()),
        "the preview wrote to the API"
    );
    // And it rolls (launches from version 2 need the harness's moto launcher): every worker
    // now runs the new type, launched from version 2.
    code(&lab, &lab.kprov(&roll), 0);
    lab.sync();
    let now = crate::support::awsroll::workers(&lab);
    let types: Vec<(Option<String>, String)> = launched(&lab, &now)
        .into_values()
        .map(|l| (l.template_version, l.instance_type))
        .collect();
    assert_eq!(
        types,
        vec![(Some("2".into()), "t3.large".into()); 2],
        "{now:?}"
    );

    delete_cleanly(&lab, cluster);
}
