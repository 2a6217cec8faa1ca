//! A kops user's image change of the control planes on AWS, end to end through the binary in
//! the cloud lab: three control planes (stacked etcd, a group each) and one worker → the
//! control-plane groups' `image` changes → `update cluster --yes` makes launch template
//! version 2 and leaves the running control planes alone → the preview lists each control
//! plane as replaced, "launch template version 1 -> 2" → `--yes` replaces them one at a time:
//! a new instance surged in the group joins as a control plane (its etcd member added) BEFORE
//! the old member is removed from etcd, and the old instance is terminated → every group back
//! to its size, journal finished, a second preview has nothing to roll, `get instances` lists
//! only the new control planes, up to date. On the way, the first roll is cut after the first
//! new member joined (the old members made unhealthy: removing one would lose quorum): it
//! stops, nothing terminated; the next `--yes` resumes with the instance already joined and
//! is killed (SIGKILL) right after it removed the old member, before the old instance is
//! terminated; after `lock break` the next `--yes` finds the member already removed and
//! finishes (no second surge, no second join, no member removed twice).
//!
//! etcd is the stand-ins' members mode over one member list the lab's hosts share
//! (`CloudLab::share_etcd_members`): the stand-in kubeadm adds a joining control plane's
//! member, the stand-in etcdctl removes one; both append to the list's `.history`, which is
//! what the order is asserted on. Needs root.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kprov::spec::{InstanceGroupRole, Object};

use crate::support::awscloud::instances_of;
use crate::support::awsroll::{
    assert_listed_as, assert_replaced_in_preview, code, delete_cleanly, instances_listed, journal,
    launched, nothing_to_roll, ok_saying, rolling, running_cluster_with, text, update_yes,
};
use crate::support::cloudlab::CloudLab;
use crate::support::testhosts::TestHost;

const NEW_IMAGE: &str = "099720109477/ubuntu/images/hvm-ssd/ubuntu-trusty-14.04-amd64-server-*";
const WHY: &str = "launch template version 1 -> 2";

fn is_control_plane(h: &TestHost) -> bool {
    h.read_upper("/etc/kubernetes/manifests/kube-apiserver.yaml")
        .is_some()
}

fn control_planes(lab: &CloudLab) -> BTreeMap<String, String> {
    lab.instances()
        .iter()
        .filter(|(_, h)| is_control_plane(h))
        .map(|(id, h)| (id.clone(), h.name.clone()))
        .collect()
}

/// (min, desired, max) of an Auto Scaling group.
type Size = (Option<i32>, Option<i32>, Option<i32>);

/// [`Size`] of every control-plane Auto Scaling group, by name.
fn control_plane_groups(lab: &CloudLab) -> BTreeMap<String, Size> {
    lab.block_on(async {
        let out = aws_sdk_autoscaling::Client::new(&lab.sdk_config().await)
            .describe_auto_scaling_groups()
            .send()
            .await
            .expect("DescribeAutoScalingGroups");
        out.auto_scaling_groups()
            .iter()
            .filter(|g| {
                g.auto_scaling_group_name()
                    .unwrap_or_default()
                    .starts_with("control-plane")
            })
            // A new instance reaches the API load balancer through its group's target group.
            .inspect(|g| assert_eq!(g.target_group_arns().len(), 1, "{g:?}"))
            .map(|g| {
                (
                    g.auto_scaling_group_name().unwrap_or_default().to_string(),
                    (g.min_size(), g.desired_capacity(), g.max_size()),
                )
            })
            .collect()
    })
}

#[test]
fn a_control_plane_image_change_replaces_each_control_plane_new_member_first() {
    crate::needs_tier!(CloudLab);
    let cluster = "cpimage.lab.example";
    let lab = running_cluster_with(cluster, "lab.example", 1, 3);
    let old = control_planes(&lab);
    assert_eq!(old.len(), 3, "{:?}", lab.instances().keys());
    let groups = control_plane_groups(&lab);
    assert_eq!(groups.len(), 3, "{groups:?}");
    assert!(
        groups.values().all(|g| *g == (Some(1), Some(1), Some(1))),
        "{groups:?}"
    );
    let all = lab.instances();
    let lines: String = old
        .iter()
        .enumerate()
        .map(|(i, (id, name))| {
            let a = &all[id].address;
            format!("{} {name} https://{a}:2380 https://{a}:2379 true\n", i + 1)
        })
        .collect();
    let members = lab.share_etcd_members(&lines);
    let history = members.with_extension("history");

    lab.edit_objects(cluster, |objects| {
        for o in objects {
            if let Object::InstanceGroup(g) = o
                && g.spec.role == InstanceGroupRole::ControlPlane
            {
                g.spec.image = Some(NEW_IMAGE.into());
            }
        }
    });
    ok_saying(&lab, &update_yes(cluster), "pending a rolling update");
    assert_eq!(lab.sync().started, Vec::<String>::new());

    // The preview: each control plane replaced, and why.
    let out = code(&lab, &lab.kprov(&rolling(cluster, &["--exit-code"])), 2);
    assert_replaced_in_preview(&out, old.values(), WHY);

    // A roll cut after the first new member joined: etcd would lose quorum without the old
    // member (every old member reported unhealthy the moment the join adds the new one), so
    // the roll stops before removing it and nothing is terminated.
    lab.fake.clear_requests();
    let started = std::time::Instant::now();
    let yes = rolling(cluster, &["--yes", "--validation-timeout", "3m"]);
    let child = lab.spawn_kprov(&yes, true);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !std::fs::read_to_string(&history).is_ok_and(|h| h.contains(" add ")) {
        assert!(Instant::now() < deadline, "no control plane joined");
        std::thread::sleep(Duration::from_millis(20));
    }
    let healthy = std::fs::read_to_string(&members).expect("members");
    let cut: String = healthy
        .lines()
        .map(|l| {
            let was_old = old.values().any(|n| l.contains(&format!(" {n} ")));
            format!(
                "{}\n",
                if was_old {
                    l.replace(" true", " false")
                } else {
                    l.to_string()
                }
            )
        })
        .collect();
    std::fs::write(&members, cut).expect("old members unhealthy");
    let o = child.wait_with_output().expect("kprov ends");
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("would lose etcd quorum") && err.contains("nothing was terminated"),
        "{err}"
    );
    lab.sync();
    assert_eq!(control_planes(&lab).len(), 4, "{err}");
    for id in old.keys() {
        assert!(lab.instances().contains_key(id), "{id} terminated\n{err}");
    }
    assert_eq!(
        std::fs::read_to_string(&history)
            .expect("history")
            .lines()
            .count(),
        1
    );

    // etcd healthy again: the next `--yes` resumes with the instance already joined. It is
    // killed (SIGKILL) the moment the old member's removal is recorded, before the old
    // instance is terminated (the stand-in holds its answer meanwhile).
    std::fs::write(&members, healthy).expect("members healthy");
    let hold = members.with_extension("hold");
    std::fs::write(&hold, "").expect("hold");
    let mut child = lab.spawn_kprov(&yes, false);
    let deadline = Instant::now() + Duration::from_secs(180);
    while !std::fs::read_to_string(&history).is_ok_and(|h| h.contains(" remove ")) {
        if Instant::now() > deadline || child.try_wait().expect("wait").is_some() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&hold);
            panic!("the resumed roll never removed the old member");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    std::fs::remove_file(&hold).expect("hold released");
    lab.sync();
    // Cut between the removal and the termination: the old instance of the first control
    // plane still runs next to its joined successor, its member gone, the roll unfinished.
    assert_eq!(control_planes(&lab).len(), 4);
    for id in old.keys() {
        assert!(
            lab.instances().contains_key(id),
            "{id} terminated before the cut"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&members)
            .expect("members")
            .lines()
            .count(),
        3
    );
    assert_eq!(journal(&lab, cluster)["finished"], false);
    code(&lab, &lab.kprov(&["lock", "break", cluster]), 0);
    let o = ok_saying(&lab, &yes, "already removed");
    eprintln!(
        "replaced 3 control planes in {:?}\n{}",
        started.elapsed(),
        text(&o.stderr)
    );
    lab.sync();

    // Three new control planes, from version 2; the old instances gone.
    let new = control_planes(&lab);
    assert_eq!(new.len(), 3, "{new:?}");
    for id in old.keys() {
        assert!(!lab.instances().contains_key(id), "{id} still runs");
        assert!(!new.contains_key(id));
    }
    for (id, l) in launched(&lab, &new.keys().cloned().collect::<Vec<_>>()) {
        assert_eq!(l.template_version.as_deref(), Some("2"), "{id}");
    }
    // No second surge after either cut: three instances ever launched from version 2.
    let every = lab.block_on(async {
        let ec2 = aws_sdk_ec2::Client::new(&lab.sdk_config().await);
        instances_of(ec2.describe_instances())
            .await
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_string))
            .collect::<Vec<_>>()
    });
    let from_v2: Vec<String> = launched(&lab, &every)
        .into_iter()
        .filter(|(_, l)| l.template_version.as_deref() == Some("2"))
        .map(|(id, _)| id)
        .collect();
    assert_eq!(from_v2.len(), 3, "{from_v2:?}");
    // etcd: each new member joined before an old one was removed, one at a time.
    let events: Vec<(String, String)> = std::fs::read_to_string(&history)
        .expect("etcd history")
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[1].to_string(), f[2].to_string())
        })
        .collect();
    assert_eq!(events.len(), 6, "{events:?}");
    let old_ids: Vec<String> = (1..=3).map(|i: u32| i.to_string()).collect();
    for (k, pair) in events.chunks(2).enumerate() {
        assert_eq!(pair[0].0, "add", "{events:?}");
        assert!(new.values().any(|n| *n == pair[0].1), "{events:?}");
        assert_eq!(pair[1].0, "remove", "step {k}: {events:?}");
        assert!(old_ids.contains(&pair[1].1), "{events:?}");
    }
    let left = std::fs::read_to_string(&members).expect("members");
    assert_eq!(left.lines().count(), 3, "{left}");
    for n in new.values() {
        assert!(left.contains(&format!(" {n} ")), "{left}");
    }
    assert_eq!(
        control_plane_groups(&lab),
        groups,
        "the groups' sizes changed"
    );
    let reqs = lab.fake.requests();
    for name in old.values() {
        let path = format!("/api/v1/nodes/{name}");
        assert!(
            reqs.iter().any(|r| r.method == "DELETE" && r.path == path),
            "the Node {name} was not deleted"
        );
    }
    let j = journal(&lab, cluster);
    assert_eq!(j["finished"], true, "{j}");

    nothing_to_roll(&lab, cluster);
    let listed = instances_listed(&lab, cluster);
    for id in old.keys() {
        assert!(!listed.contains(id.as_str()), "{listed}");
    }
    assert_listed_as(&listed, new.keys(), "up to date");

    delete_cleanly(&lab, cluster);
}
