//! AWS clusters in a cloud lab, for the e2e tests: how they run kprov and read its exit codes
//! (`code`, `text`), the flags and image they use, and for the `rolling-update` tests a
//! running cluster: one control plane, workers in the group `nodes`, the operator reaching
//! the private addresses (as over a VPN, set in the spec so that `get instances` never dials
//! an address moto invented), provisioned by `update cluster --yes` and validated. Plus what
//! those tests read back from moto and the store.

use std::collections::BTreeMap;
use std::process::Output;
use std::sync::Arc;

use kprov::spec::{InstanceGroup, InstanceGroupRole, Object, SshAddress, Topology, TopologyType};

use crate::support::awscloud::instances_of;
use crate::support::cloudlab::{CloudLab, VERSION};

/// The flag that makes kprov connect to instances at their private addresses.
pub const PRIVATE_ADDRESSES: &[&str] = &["--ssh-private-address"];
/// A stock image of moto's (owner and name pattern, as kops names images).
pub const IMAGE: &str = "099720109477/ubuntu/images/hvm-ssd/ubuntu-xenial-16.04-amd64-server-*";

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts kprov's exit code (showing its output, the lab's sync errors and moto's log
/// otherwise) and returns its stdout.
#[track_caller]
pub fn code(lab: &CloudLab, o: &Output, want: i32) -> String {
    assert_eq!(
        o.status.code(),
        Some(want),
        "stdout:\n{}\nstderr:\n{}\nlab sync errors: {:?}\nmoto:\n{}",
        text(&o.stdout),
        text(&o.stderr),
        lab.sync_errors(),
        lab.moto_log()
    );
    text(&o.stdout)
}

/// Runs kprov with `args` in `lab`, asserts exit 0 and that its stderr says `said`; returns
/// its output.
#[track_caller]
pub fn ok_saying(lab: &CloudLab, args: &[&str], said: &str) -> Output {
    let o = lab.kprov(args);
    code(lab, &o, 0);
    let err = text(&o.stderr);
    assert!(err.contains(said), "{err}");
    o
}

/// `get instances CLUSTER`'s table (exit 0).
#[track_caller]
pub fn instances_listed(lab: &CloudLab, cluster: &str) -> String {
    code(lab, &lab.kprov(&["get", "instances", cluster]), 0)
}

/// Asserts that `listed` (`get instances`'s table) has a row for each of `ids` saying `state`.
#[track_caller]
pub fn assert_listed_as(listed: &str, ids: impl IntoIterator<Item = impl AsRef<str>>, state: &str) {
    for id in ids {
        let id = id.as_ref();
        assert!(
            listed
                .lines()
                .any(|l| l.starts_with(id) && l.contains(state)),
            "{id} not {state}:\n{listed}"
        );
    }
}

/// Each of `nodes` has its line in a rolling-update preview `out`, marked `replace` and
/// saying `why`.
pub fn assert_replaced_in_preview(
    out: &str,
    nodes: impl IntoIterator<Item = impl AsRef<str>>,
    why: &str,
) {
    for node in nodes {
        let node = node.as_ref();
        let line = out
            .lines()
            .find(|l| l.starts_with(node))
            .unwrap_or_else(|| panic!("{node} not in the preview:\n{out}"));
        assert!(line.contains("replace") && line.contains(why), "{line}");
    }
}

/// The instances whose host ran a stand-in command starting with `prefix`, by instance ID.
pub fn with_call(lab: &CloudLab, prefix: &str) -> Vec<String> {
    lab.instances()
        .iter()
        .filter(|(_, h)| h.standin_calls().iter().any(|(_, c)| c.starts_with(prefix)))
        .map(|(id, _)| id.clone())
        .collect()
}

/// A public hosted zone in the lab's moto.
pub async fn make_zone(lab: &CloudLab, zone: &str) {
    let sdk = lab.sdk_config().await;
    aws_sdk_route53::Client::new(&sdk)
        .create_hosted_zone()
        .name(zone)
        .caller_reference(zone)
        .send()
        .await
        .expect("zone");
}

/// `update cluster NAME --yes` reaching the instances at their private addresses.
pub fn update_yes(cluster: &str) -> Vec<&str> {
    let mut a = vec!["update", "cluster", cluster, "--yes"];
    a.extend_from_slice(PRIVATE_ADDRESSES);
    a
}

/// `rolling-update cluster NAME` with `extra`, reaching the private addresses.
pub fn rolling<'a>(cluster: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["rolling-update", "cluster", cluster];
    a.extend_from_slice(extra);
    a.extend_from_slice(PRIVATE_ADDRESSES);
    a
}

/// Asserts that the `rolling-update --exit-code` preview of `cluster` has nothing to roll
/// (exit 0).
#[track_caller]
pub fn nothing_to_roll(lab: &CloudLab, cluster: &str) {
    let o = lab.kprov(&rolling(cluster, &["--exit-code"]));
    code(lab, &o, 0);
    assert!(
        text(&o.stderr).contains("No rolling update needed"),
        "{}",
        text(&o.stderr)
    );
}

/// `delete cluster NAME --yes`, asserting exit 0 and that the lab followed moto without a
/// sync error.
#[track_caller]
pub fn delete_cleanly(lab: &CloudLab, cluster: &str) {
    code(lab, &lab.kprov(&["delete", "cluster", cluster, "--yes"]), 0);
    lab.sync();
    assert!(lab.sync_errors().is_empty(), "{:?}", lab.sync_errors());
}

/// A cloud lab whose moto has the public hosted zone `zone`.
pub fn lab_with_zone(zone: &str) -> Arc<CloudLab> {
    let lab = Arc::new(CloudLab::start());
    lab.block_on(make_zone(&lab, zone));
    lab
}

/// `create cluster NAME --cloud aws` as the lab's tests write it: the operator's key (made in
/// the lab's `~/.ssh` and loaded in its agent, [`CloudLab::operator_key`]), moto's stock
/// [`IMAGE`], the lab's VPC range, Kubernetes [`VERSION`] and the zone `us-east-1a` unless
/// set, then the test's own flags.
pub struct CreateAws<'a> {
    cluster: &'a str,
    version: &'a str,
    zones: &'a str,
    image: &'a str,
    flags: Vec<&'a str>,
}

impl<'a> CreateAws<'a> {
    pub fn new(cluster: &'a str) -> Self {
        CreateAws {
            cluster,
            version: VERSION,
            zones: "us-east-1a",
            image: IMAGE,
            flags: Vec::new(),
        }
    }

    /// `--kubernetes-version`.
    pub fn version(mut self, version: &'a str) -> Self {
        self.version = version;
        self
    }

    /// `--zones`, comma-separated.
    pub fn zones(mut self, zones: &'a str) -> Self {
        self.zones = zones;
        self
    }

    /// `--image` (default [`IMAGE`]).
    pub fn image(mut self, image: &'a str) -> Self {
        self.image = image;
        self
    }

    /// Flags after the common ones.
    pub fn flags(mut self, flags: &[&'a str]) -> Self {
        self.flags.extend_from_slice(flags);
        self
    }

    /// Runs it in `lab`, asserting exit 0.
    #[track_caller]
    pub fn run(&self, lab: &CloudLab) {
        let public = lab.operator_key();
        let vpc = lab.net.vpc_cidr().to_string();
        let mut args = vec![
            "create",
            "cluster",
            self.cluster,
            "--cloud",
            "aws",
            "--zones",
            self.zones,
            "--ssh-public-key",
            &public,
            "--image",
            self.image,
            "--network-cidr",
            &vpc,
            "--kubernetes-version",
            self.version,
        ];
        args.extend_from_slice(&self.flags);
        code(lab, &lab.kprov(&args), 0);
    }
}

/// A lab with `cluster` (in the hosted zone `zone`) created with `nodes` workers, provisioned
/// and validated. The lab watches moto (instances become hosts as they start).
pub fn running_cluster(cluster: &str, zone: &str, nodes: u32) -> Arc<CloudLab> {
    running_cluster_with(cluster, zone, nodes, 1)
}

/// [`running_cluster`] with `control_planes` control planes (stacked etcd; AWS makes a group
/// per control plane).
pub fn running_cluster_with(
    cluster: &str,
    zone: &str,
    nodes: u32,
    control_planes: u32,
) -> Arc<CloudLab> {
    running_cluster_on(cluster, zone, nodes, control_planes, IMAGE)
}

/// [`running_cluster_with`] on `image` (owner/name pattern or `ami-` ID).
pub fn running_cluster_on(
    cluster: &str,
    zone: &str,
    nodes: u32,
    control_planes: u32,
    image: &str,
) -> Arc<CloudLab> {
    let lab = lab_with_zone(zone);
    running_cluster_in(&lab, cluster, nodes, control_planes, image);
    lab
}

/// [`running_cluster_on`] in a lab the caller started (to prepare moto first).
pub fn running_cluster_in(
    lab: &Arc<CloudLab>,
    cluster: &str,
    nodes: u32,
    control_planes: u32,
    image: &str,
) {
    let count = nodes.to_string();
    let cps = control_planes.to_string();
    CreateAws::new(cluster)
        .image(image)
        .flags(&["--node-count", &count, "--control-plane-count", &cps])
        .run(lab);
    lab.use_mirror(cluster);
    lab.edit_objects(cluster, |objects| {
        for o in objects {
            if let Object::Cluster(c) = o {
                c.spec.topology = Some(Topology {
                    kind: TopologyType::Public,
                    bastion: None,
                    ssh_address: Some(SshAddress::Private),
                });
            }
        }
    });
    lab.watch();
    code(lab, &lab.kprov(&update_yes(cluster)), 0);
    code(
        lab,
        &lab.kprov(&["validate", "cluster", cluster, "--wait", "60s"]),
        0,
    );
}

/// Edits every worker (`Node`) instance group of `cluster` in the store.
pub fn edit_workers(lab: &CloudLab, cluster: &str, mut edit: impl FnMut(&mut InstanceGroup)) {
    lab.edit_objects(cluster, |objects| {
        for o in objects {
            if let Object::InstanceGroup(g) = o
                && g.spec.role == InstanceGroupRole::Node
            {
                edit(g);
            }
        }
    });
}

/// The running instances other than the one that ran `kubeadm init` (the lab's clusters have
/// one control plane): the workers.
pub fn workers(lab: &CloudLab) -> Vec<String> {
    let init = with_call(lab, "kubeadm init");
    lab.instances()
        .keys()
        .filter(|id| !init.contains(id))
        .cloned()
        .collect()
}

/// (min, desired, max) of an Auto Scaling group.
pub fn group_size(lab: &CloudLab, asg: &str) -> (Option<i32>, Option<i32>, Option<i32>) {
    lab.block_on(async {
        let out = aws_sdk_autoscaling::Client::new(&lab.sdk_config().await)
            .describe_auto_scaling_groups()
            .auto_scaling_group_names(asg)
            .send()
            .await
            .expect("DescribeAutoScalingGroups");
        let g = out
            .auto_scaling_groups()
            .first()
            .unwrap_or_else(|| panic!("no group {asg}"));
        (g.min_size(), g.desired_capacity(), g.max_size())
    })
}

/// What EC2 says an instance was launched with.
#[derive(Debug, Clone, PartialEq)]
pub struct Launched {
    pub image: String,
    pub instance_type: String,
    /// Its `aws:ec2launchtemplate:version` tag.
    pub template_version: Option<String>,
}

/// [`Launched`] of the given instances (all states), by instance ID.
pub fn launched(lab: &CloudLab, ids: &[String]) -> BTreeMap<String, Launched> {
    lab.block_on(async {
        let ec2 = aws_sdk_ec2::Client::new(&lab.sdk_config().await);
        instances_of(
            ec2.describe_instances()
                .set_instance_ids(Some(ids.to_vec())),
        )
        .await
        .iter()
        .map(|i| {
            let tag = i
                .tags()
                .iter()
                .find(|t| t.key() == Some("aws:ec2launchtemplate:version"))
                .and_then(|t| t.value())
                .map(str::to_string);
            (
                i.instance_id().unwrap_or_default().to_string(),
                Launched {
                    image: i.image_id().unwrap_or_default().to_string(),
                    instance_type: i
                        .instance_type()
                        .map(|t| t.as_str().to_string())
                        .unwrap_or_default(),
                    template_version: tag,
                },
            )
        })
        .collect()
    })
}

/// The roll's journal in the lab's file store.
pub fn journal(lab: &CloudLab, cluster: &str) -> serde_json::Value {
    let path = lab
        .store_dir()
        .join(cluster)
        .join("journal/rolling-update.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("journal {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("journal: {e}\n{text}"))
}
