//! A kops user's image change on AWS, end to end through the binary in the cloud lab (issue 8,
//! "done when"): the worker group's `image` changes → `update cluster --yes` makes launch
//! template version 2 (the group launches `$Latest`), leaves the running workers alone and
//! reports them pending a roll → a worker the group adds afterwards starts from version 2 →
//! `get instances`, the preview (table and `-o json`, read-only) and `--exit-code` name the two
//! old workers "launch template version 1 -> 2" and leave the new one alone → `--yes` replaces
//! the two (surge first, drained before their instances are terminated), their replacements
//! launched from version 2 with the new image → group sizes as before, journal finished, the
//! added worker untouched → a second preview has nothing to roll.
//!
//! Launching from a version made by CreateLaunchTemplateVersion needs the test harness's moto
//! launcher (`support/moto_server.py`, docs/aws.md "moto notes"). Needs root.

use std::collections::{BTreeMap, BTreeSet};

use crate::support::awsroll::{
    assert_listed_as, code, delete_cleanly, edit_workers, group_size, instances_listed, journal,
    launched, nothing_to_roll, rolling, running_cluster, text, update_yes, with_call, workers,
};
use crate::support::cloudlab::CloudLab;
use crate::support::fakekube::{owned_by, pod};
use crate::support::snapshot;

/// The image the workers move to: another stock image in moto (the cluster starts on xenial).
const NEW_IMAGE: &str = "099720109477/ubuntu/images/hvm-ssd/ubuntu-trusty-14.04-amd64-server-*";
const WHY: &str = "launch template version 1 -> 2";

/// Everything a host wrote (its overlay and logs), per instance.
fn written(lab: &CloudLab, ids: &[String]) -> BTreeMap<String, usize> {
    let all = lab.instances();
    ids.iter()
        .map(|id| {
            let h = &all[id];
            let n = snapshot(&h.dir().join("upper")).len() + snapshot(&h.dir().join("log")).len();
            (id.clone(), n)
        })
        .collect()
}

#[test]
fn an_image_change_rolls_the_workers_onto_the_new_launch_template_version() {
    crate::needs_tier!(CloudLab);
    let cluster = "image.lab.example";
    let asg = format!("nodes.{cluster}");
    let lab = running_cluster(cluster, "lab.example", 2);
    let old = workers(&lab);
    assert_eq!(old.len(), 2, "{old:?}");
    let before = launched(&lab, &old);
    assert!(
        before
            .values()
            .all(|l| l.template_version.as_deref() == Some("1")),
        "{before:?}"
    );
    let old_image = before[&old[0]].image.clone();

    // The image changes: version 2, the running workers left alone and reported.
    edit_workers(&lab, cluster, |g| g.spec.image = Some(NEW_IMAGE.into()));
    let calls: BTreeMap<String, usize> = old
        .iter()
        .map(|id| (id.clone(), lab.instances()[id].standin_calls().len()))
        .collect();
    let o = lab.kprov(&update_yes(cluster));
    code(&lab, &o, 0);
    let err = text(&o.stderr);
    assert!(
        err.contains("pending a rolling update")
            && old.iter().all(|id| err.contains(id.as_str()))
            && err.contains(&format!("kprov rolling-update cluster {cluster}")),
        "update --yes did not report the workers pending a roll:\n{err}"
    );
    assert_eq!(lab.sync().started, Vec::<String>::new());
    for id in &old {
        assert_eq!(
            lab.instances()[id].standin_calls().len(),
            calls[id],
            "update --yes ran a kube binary on {id}"
        );
    }
    let (template, version, image) = lab.block_on(async {
        let sdk = lab.sdk_config().await;
        let g = aws_sdk_autoscaling::Client::new(&sdk)
            .describe_auto_scaling_groups()
            .auto_scaling_group_names(&asg)
            .send()
            .await
            .expect("DescribeAutoScalingGroups");
        let lt = g.auto_scaling_groups()[0]
            .launch_template()
            .expect("the group launches from a template")
            .clone();
        let id = lt.launch_template_id().unwrap_or_default().to_string();
        let v = aws_sdk_ec2::Client::new(&sdk)
            .describe_launch_template_versions()
            .launch_template_id(&id)
            .versions("$Latest")
            .send()
            .await
            .expect("DescribeLaunchTemplateVersions");
        let latest = &v.launch_template_versions()[0];
        (
            lt.version().unwrap_or_default().to_string(),
            latest.version_number(),
            latest
                .launch_template_data()
                .and_then(|d| d.image_id())
                .unwrap_or_default()
                .to_string(),
        )
    });
    assert_eq!(
        (template.as_str(), version),
        ("$Latest", Some(2)),
        "the group is not on version 2"
    );
    assert_ne!(image, old_image, "version 2 kept the old image");

    // A worker the group adds now starts from version 2 and joins; nothing to roll on it.
    edit_workers(&lab, cluster, |g| {
        g.spec.min_size = Some(3);
        g.spec.max_size = Some(3);
    });
    let written_before = written(&lab, &old);
    code(&lab, &lab.kprov(&update_yes(cluster)), 0);
    lab.sync();
    let added: Vec<String> = workers(&lab)
        .into_iter()
        .filter(|id| !old.contains(id))
        .collect();
    assert_eq!(added.len(), 1, "{added:?}");
    let added = added[0].clone();
    let l = &launched(&lab, std::slice::from_ref(&added))[&added];
    assert_eq!(
        (l.template_version.as_deref(), l.image.as_str()),
        (Some("2"), image.as_str())
    );
    assert!(
        with_call(&lab, "kubeadm join").contains(&added),
        "{added} did not join"
    );
    assert_eq!(
        written(&lab, &old),
        written_before,
        "update --yes wrote on an old worker"
    );

    // The preview: the two old workers replaced for the version, the added one left alone.
    let names: BTreeMap<String, String> = lab
        .instances()
        .iter()
        .map(|(id, h)| (id.clone(), h.name.clone()))
        .collect();
    let (store0, hosts0) = (snapshot(&lab.store_dir()), lab.hosts_snapshot());
    lab.fake.clear_requests();
    let out = code(&lab, &lab.kprov(&rolling(cluster, &["--exit-code"])), 2);
    let line = |id: &String| {
        out.lines()
            .find(|l| l.starts_with(names[id].as_str()))
            .unwrap_or_else(|| panic!("{} not in the preview:\n{out}", names[id]))
            .to_string()
    };
    for id in &old {
        let l = line(id);
        assert!(l.contains("replace") && l.contains(WHY), "{l}");
    }
    let l = line(&added);
    assert!(l.contains("leave alone") && l.contains("up to date"), "{l}");
    assert!(
        out.lines().any(|l| l.starts_with("nodes")
            && l.split_whitespace().take(3).collect::<Vec<_>>() == ["nodes", "NeedsUpdate", "2"]),
        "{out}"
    );
    let doc: serde_json::Value = serde_json::from_str(&code(
        &lab,
        &lab.kprov(&rolling(cluster, &["-o", "json"])),
        0,
    ))
    .expect("one JSON document");
    let nodes = doc["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .find(|g| g["name"] == "nodes")
        .expect("the nodes group")["nodes"]
        .as_array()
        .expect("nodes")
        .clone();
    let by_id: BTreeMap<&str, &serde_json::Value> = nodes
        .iter()
        .map(|n| (n["target"].as_str().unwrap_or_default(), n))
        .collect();
    for id in &old {
        let n = by_id[id.as_str()];
        assert_eq!(
            (&n["action"], &n["needsUpdate"], &n["reasons"]),
            (
                &serde_json::json!("replace"),
                &serde_json::json!(true),
                &serde_json::json!([WHY])
            ),
            "{n}"
        );
    }
    let n = by_id[added.as_str()];
    assert_eq!(
        (&n["action"], &n["needsUpdate"]),
        (&serde_json::json!("leave"), &serde_json::json!(false)),
        "{n}"
    );
    let listed = instances_listed(&lab, cluster);
    assert_listed_as(&listed, &old, &format!("needs update: {WHY}"));
    assert_listed_as(&listed, [&added], "up to date");
    assert_eq!(snapshot(&lab.store_dir()), store0, "the preview wrote");
    assert_eq!(lab.hosts_snapshot(), hosts0, "the preview changed a host");
    assert!(
        lab.fake.requests().iter().all(|r| !r.is_write()),
        "the preview wrote to the API"
    );

    // A pod of a ReplicaSet on each old worker: each is evicted before its instance goes.
    for (i, id) in old.iter().enumerate() {
        lab.fake.put(owned_by(
            pod(
                "default",
                &format!("app-{i}"),
                serde_json::json!({"app": "app"}),
                &names[id],
                "Running",
                true,
            ),
            "ReplicaSet",
            "app-rs",
        ));
    }
    lab.fake.clear_requests();
    let started = std::time::Instant::now();
    let o = lab.kprov(&rolling(cluster, &["--yes", "--validation-timeout", "3m"]));
    code(&lab, &o, 0);
    let err = text(&o.stderr);
    eprintln!("rolled 2 of 3 workers in {:?}\n{err}", started.elapsed());
    lab.sync();

    // Replaced: the old instances are gone, two new ones launched from version 2 joined.
    let now = lab.instances();
    for id in &old {
        assert!(!now.contains_key(id), "{id} still runs");
    }
    assert!(
        now.contains_key(&added),
        "the added worker {added} was replaced"
    );
    let new: Vec<String> = workers(&lab)
        .into_iter()
        .filter(|id| !old.contains(id) && *id != added)
        .collect();
    assert_eq!(new.len(), 2, "{:?}", now.keys());
    let joined = with_call(&lab, "kubeadm join");
    for (id, l) in launched(&lab, &new) {
        assert!(joined.contains(&id), "{id} did not join");
        assert_eq!(
            (l.template_version.as_deref(), l.image.as_str()),
            (Some("2"), image.as_str()),
            "{id}"
        );
    }
    // Per old node: cordoned, its pod evicted, then its Node deleted (after its instance was
    // terminated); the added worker was never cordoned.
    let reqs = lab.fake.requests();
    let at =
        |pred: &dyn Fn(&crate::support::fakekube::Recorded) -> bool| reqs.iter().position(pred);
    for (i, id) in old.iter().enumerate() {
        let path = format!("/api/v1/nodes/{}", names[id]);
        let cordon =
            at(&|r| r.method == "PATCH" && r.path == path && r.body.contains("unschedulable"))
                .unwrap_or_else(|| panic!("{} never cordoned", names[id]));
        let evicted =
            at(&|r| r.method == "POST" && r.path.ends_with(&format!("/pods/app-{i}/eviction")))
                .unwrap_or_else(|| panic!("app-{i} never evicted"));
        let deleted = at(&|r| r.method == "DELETE" && r.path == path)
            .unwrap_or_else(|| panic!("{} never deleted", names[id]));
        assert!(
            cordon < evicted && evicted < deleted,
            "{id}: {cordon} {evicted} {deleted}"
        );
        // The roll's plain progress lines: the step reached, then what the roller does.
        let drained = err
            .find(&format!("{}: drained", names[id]))
            .unwrap_or_else(|| panic!("{id}: no drain reported\n{err}"));
        let terminated = err
            .find(&format!("{}: terminating {id}", names[id]))
            .unwrap_or_else(|| panic!("{id}: no termination reported\n{err}"));
        assert!(
            drained < terminated,
            "{id} terminated before it was drained:\n{err}"
        );
    }
    let added_path = format!("/api/v1/nodes/{}", names[&added]);
    assert!(
        !reqs
            .iter()
            .any(|r| r.path == added_path && r.method != "GET"),
        "the added worker was touched"
    );
    assert_eq!(group_size(&lab, &asg), (Some(3), Some(3), Some(3)));
    let j = journal(&lab, cluster);
    assert_eq!(j["finished"], true, "{j}");
    let rolled: BTreeSet<&str> = j["nodes"]
        .as_array()
        .expect("journal nodes")
        .iter()
        .filter(|n| n["step"] == "validated" && n["replacement"].is_string())
        .filter_map(|n| n["target"].as_str())
        .collect();
    assert_eq!(
        rolled,
        old.iter().map(String::as_str).collect::<BTreeSet<_>>(),
        "{j}"
    );

    // Nothing left to roll.
    nothing_to_roll(&lab, cluster);

    delete_cleanly(&lab, cluster);
}
