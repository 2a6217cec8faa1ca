//! The cloud engine and the AWS provider against moto_server: golden plans, read-only preview,
//! create → no-op → drift → repair → delete cycles, interrupted applies, foreign resources.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;

use kprov::cloud::aws::instances::{AwsInstances, SshReach};
use kprov::cloud::aws::{AwsCloud, GroupHostKey, owned_tag_key};
use kprov::cloud::engine::{self, Action, ApplyOptions, Plan, RenderOptions};
use kprov::spec::{Cluster, HostRole, InstanceGroup};

use crate::support::aws_recorder::{Recorder, is_write};
use crate::support::awscloud;
use crate::support::moto::moto;

const IMAGE: &str = "ami-1e749f67";
const IMAGE_NAME: &str = "ubuntu/images/hvm-ssd/ubuntu-trusty-14.04-amd64-server-20170727";
const ROTATED_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPbux3eWNc+++t1ENCHPOraouUduIhZMg8PM7hnKVFwQ kprov@rotated";
const SSH_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBk2yW8tEvt3hWRVrDTyW8ODgQSKmIbN6Vw0nYq1eNvd kprov@test";

/// A completed spec as the lead's defaults produce it. `zone` must already exist in Route53.
pub(crate) fn spec(name: &str, zone: &str, private: bool) -> (Cluster, Vec<InstanceGroup>) {
    let zones: &[&str] = if private {
        &["us-east-1a", "us-east-1b", "us-east-1c"]
    } else {
        &["us-east-1a"]
    };
    let mut subnets = String::new();
    for (i, z) in zones.iter().enumerate() {
        if private {
            subnets += &format!(
                "      - {{name: {z}, zone: {z}, cidr: 172.20.{}.0/19, type: Private}}\n      \
                 - {{name: utility-{z}, zone: {z}, cidr: 172.20.{}.0/22, type: Utility}}\n",
                32 * (i + 1),
                4 * i
            );
        } else {
            subnets +=
                &format!("      - {{name: {z}, zone: {z}, cidr: 172.20.32.0/19, type: Public}}\n");
        }
    }
    let topology = if private {
        "Private\n    bastion: {}"
    } else {
        "Public"
    };
    let top = head("Cluster", name);
    let yaml = format!(
        "{top}spec:
  cloudProvider: aws
  region: us-east-1
  kubernetesVersion: 1.31.2
  networking:
    networkCIDR: 172.20.0.0/16
    subnets:
{subnets}    podCIDR: 100.96.0.0/11
    serviceCIDR: 100.64.0.0/13
    cni: calico
  topology:
    type: {topology}
  dns:
    type: Public
    zone: {zone}
  api:
    loadBalancer:
      type: Public
  etcd:
    type: Stacked
  cloudControllerManager:
    provider: aws
  sshKey:
    publicKey: {SSH_KEY}
"
    );
    let cluster: Cluster = serde_saphyr::from_str(&yaml).expect("test cluster parses");
    let ig = |ig_name: &str,
              role: &str,
              machine: &str,
              image: &str,
              min: u32,
              max: u32,
              subnets: &[&str]| {
        let subnets = if subnets.is_empty() {
            String::new()
        } else {
            format!("  subnets: [{}]\n", subnets.join(", "))
        };
        let top = head("InstanceGroup", ig_name);
        let y = format!(
            "{top}  labels:
    kprov.dev/cluster: {name}
spec:
  role: {role}
  machineType: {machine}
  image: {image}
  minSize: {min}
  maxSize: {max}
{subnets}  nodeLabels:
    kprov.dev/instancegroup: {ig_name}
"
        );
        serde_saphyr::from_str::<InstanceGroup>(&y).expect("test instance group parses")
    };
    let igs = if private {
        let mut v: Vec<InstanceGroup> = zones
            .iter()
            .map(|z| {
                ig(
                    &format!("control-plane-{z}"),
                    "ControlPlane",
                    "m5.large",
                    IMAGE,
                    1,
                    1,
                    &[z],
                )
            })
            .collect();
        v.push(ig("nodes", "Node", "m5.large", IMAGE_NAME, 2, 5, &[]));
        v.push(ig("bastions", "Bastion", "t3.micro", IMAGE, 1, 1, &[]));
        v
    } else {
        vec![
            ig(
                "control-plane-us-east-1a",
                "ControlPlane",
                "m5.large",
                IMAGE,
                1,
                1,
                &[],
            ),
            ig("nodes", "Node", "t3.medium", IMAGE_NAME, 1, 3, &[]),
        ]
    };
    (cluster, igs)
}

/// The lines every kprov object's YAML starts with.
fn head(kind: &str, name: &str) -> String {
    format!("apiVersion: kprov.dev/v1alpha1\nkind: {kind}\nmetadata:\n  name: {name}\n")
}

pub(crate) struct Env {
    /// The harness's view: moto itself, for setup and checks.
    pub(crate) sdk: aws_config::SdkConfig,
    /// kprov's view: moto behind the as-it-is policy (AWS's propagation windows, launch
    /// delays and limits), so the library meets what the CLI meets.
    pub(crate) kprov_sdk: aws_config::SdkConfig,
    pub(crate) rec: Recorder,
    pub(crate) cloud: AwsCloud,
}

/// A fixed host key (generated once with `ssh-keygen -t ed25519`; it protects nothing) so the
/// golden plans show a stable digest. The binary generates one per group on `--yes`.
fn host_key() -> GroupHostKey {
    GroupHostKey {
        private: "-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACD1oIjJ5QsAfGitIRvzAgtn2x/aim2IcTyKDTGXUQdnQgAAAIiUqU9IlKlP
SAAAAAtzc2gtZWQyNTUxOQAAACD1oIjJ5QsAfGitIRvzAgtn2x/aim2IcTyKDTGXUQdnQg
AAAEA9MAmJ+bNR7vpmx2kzLQmof3czsSo4RSlala6ku4/IivWgiMnlCwB8aK0hG/MCC2fb
H9qKbYhxPIoNMZdRB2dCAAAAAAECAwQF
-----END OPENSSH PRIVATE KEY-----
"
        .into(),
        public: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPWgiMnlCwB8aK0hG/MCC2fbH9qKbYhxPIoNMZdRB2dC"
            .into(),
    }
}

pub(crate) async fn env(cluster: &str) -> Env {
    env_with(cluster, moto().kprov_sdk_config().await).await
}

async fn env_with(cluster: &str, kprov_sdk: aws_config::SdkConfig) -> Env {
    let sdk = moto().sdk_config().await;
    let rec = Recorder::default();
    // Every group name the specs above use.
    let keys = ["nodes", "bastions"]
        .into_iter()
        .map(str::to_string)
        .chain(
            ["us-east-1a", "us-east-1b", "us-east-1c"]
                .iter()
                .map(|z| format!("control-plane-{z}")),
        )
        .map(|g| (g, host_key()))
        .collect();
    let cloud = AwsCloud::new(&kprov_sdk, cluster, &[rec.shared()]).with_host_keys(keys);
    Env {
        sdk,
        kprov_sdk,
        rec,
        cloud,
    }
}

/// Waits, as `update cluster --yes` does after its apply, until every group lists its desired
/// instances: AWS (and the lab's as-it-is policy) shows a new group's instances only some
/// time after CreateAutoScalingGroup, so a test reading them right after an apply reads
/// what no operator would.
pub(crate) async fn wait_launched(e: &Env, igs: &[InstanceGroup]) {
    let short = kprov::cloud::aws::launch::wait_for_launches(
        &e.cloud,
        igs,
        SshReach::Private,
        Duration::from_secs(60),
        Duration::from_millis(200),
        &|_| {},
    )
    .await
    .expect("launch wait");
    assert!(
        short.is_empty(),
        "groups short of their instances: {short:?}"
    );
}

pub(crate) async fn make_zone(sdk: &aws_config::SdkConfig, zone: &str) -> String {
    let r53 = aws_sdk_route53::Client::new(sdk);
    let out = r53
        .create_hosted_zone()
        .name(zone)
        .caller_reference(format!("kprov-test-{zone}"))
        .send()
        .await
        .expect("create hosted zone");
    out.hosted_zone()
        .map(|z| z.id().trim_start_matches("/hostedzone/").to_string())
        .expect("zone id")
}

/// A test cluster `name` under a fresh public hosted zone `zone`: its environment, the zone's
/// ID, and the spec `spec` writes for it.
pub(crate) async fn zoned(
    name: &str,
    zone: &str,
    private: bool,
) -> (Env, String, Cluster, Vec<InstanceGroup>) {
    let e = env(name).await;
    let zone_id = make_zone(&e.sdk, zone).await;
    let (c, igs) = spec(name, zone, private);
    (e, zone_id, c, igs)
}

/// Asserts that one of the plan's errors is `wanted`.
fn assert_error(p: &Plan, wanted: impl Fn(&str) -> bool) {
    assert!(p.errors.iter().any(|m| wanted(m)), "{:?}", p.errors);
}

/// The error of a plan that could not be made at all.
async fn plan_refusal(e: &Env, c: &Cluster, igs: &[InstanceGroup]) -> String {
    awscloud::plan(&e.cloud, c, igs)
        .await
        .expect_err("the plan is refused")
        .to_string()
}

fn fast() -> ApplyOptions {
    ApplyOptions {
        parallelism: 6,
        resource_deadline: Duration::from_secs(60),
        propagation: Duration::from_secs(30),
        initial_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(500),
        prune: false,
        on_done: None,
        on_wait: None,
    }
}

pub(crate) async fn plan(e: &Env, c: &Cluster, igs: &[InstanceGroup]) -> Plan {
    awscloud::plan(&e.cloud, c, igs)
        .await
        .unwrap_or_else(|err| panic!("plan: {err}\n{}", moto().log_tail()))
}

pub(crate) async fn apply(e: &Env, p: &Plan, prune: bool) {
    let opts = ApplyOptions { prune, ..fast() };
    engine::apply(&e.cloud, p, &opts)
        .await
        .unwrap_or_else(|err| panic!("apply: {err}\n{}", moto().log_tail()));
}

pub(crate) async fn delete_all(e: &Env, c: &Cluster, igs: &[InstanceGroup]) {
    let p = awscloud::plan_delete(&e.cloud, c, igs).await;
    assert!(p.changes.iter().all(|ch| ch.action == Action::Delete));
    apply(e, &p, true).await;
}

/// Owned resources per kind, counted with plain SDK calls filtering on the ownership tag (not
/// through kprov's reader), to catch duplicates and leaks.
async fn count_owned(
    sdk: &aws_config::SdkConfig,
    cluster: &str,
    zone_id: &str,
) -> BTreeMap<&'static str, usize> {
    let ec2 = aws_sdk_ec2::Client::new(sdk);
    let f = || awscloud::ec2_filter(format!("tag:{}", owned_tag_key(cluster)), ["owned"]);
    let state = awscloud::ec2_filter("state", ["available", "pending"]);
    let asg = aws_sdk_autoscaling::Client::new(sdk);
    let asg_owned = awscloud::asg_filter(f());
    let vpcs = awscloud::sent(ec2.describe_vpcs().filters(f()).send()).await;
    let subnets = awscloud::sent(ec2.describe_subnets().filters(f()).send()).await;
    let igws = awscloud::sent(ec2.describe_internet_gateways().filters(f()).send()).await;
    let tables = awscloud::sent(ec2.describe_route_tables().filters(f()).send()).await;
    let groups = awscloud::sent(ec2.describe_security_groups().filters(f()).send()).await;
    let eips = awscloud::sent(ec2.describe_addresses().filters(f()).send()).await;
    let nats = awscloud::sent(ec2.describe_nat_gateways().filter(f()).filter(state).send()).await;
    let keys = awscloud::sent(ec2.describe_key_pairs().filters(f()).send()).await;
    let lts = awscloud::sent(ec2.describe_launch_templates().filters(f()).send()).await;
    let asgs = awscloud::sent(asg.describe_auto_scaling_groups().filters(asg_owned).send()).await;
    let mut n = BTreeMap::new();
    n.insert("vpc", vpcs.vpcs().len());
    n.insert("subnet", subnets.subnets().len());
    n.insert("igw", igws.internet_gateways().len());
    n.insert("route-table", tables.route_tables().len());
    n.insert("security-group", groups.security_groups().len());
    n.insert("eip", eips.addresses().len());
    // moto ignores tag filters on NAT gateways.
    let ours = |g: &&aws_sdk_ec2::types::NatGateway| {
        g.tags()
            .iter()
            .any(|t| t.key() == Some(&owned_tag_key(cluster)))
    };
    n.insert("nat", nats.nat_gateways().iter().filter(ours).count());
    n.insert("key-pair", keys.key_pairs().len());
    n.insert("launch-template", lts.launch_templates().len());
    n.insert("asg", asgs.auto_scaling_groups().len());
    let elb = aws_sdk_elasticloadbalancingv2::Client::new(sdk);
    let lbs = elb.describe_load_balancers().send().await.unwrap();
    let tgs = elb.describe_target_groups().send().await.unwrap();
    let arns: Vec<String> = lbs
        .load_balancers()
        .iter()
        .filter_map(|l| l.load_balancer_arn())
        .chain(
            tgs.target_groups()
                .iter()
                .filter_map(|t| t.target_group_arn()),
        )
        .map(str::to_string)
        .collect();
    let mut lb_n = 0;
    for chunk in arns.chunks(20) {
        let tags = elb
            .describe_tags()
            .set_resource_arns(Some(chunk.to_vec()))
            .send()
            .await
            .unwrap();
        lb_n += tags
            .tag_descriptions()
            .iter()
            .filter(|d| {
                d.tags()
                    .iter()
                    .any(|t| t.key() == Some(&owned_tag_key(cluster)))
            })
            .count();
    }
    n.insert("lb+tg", lb_n);
    let iam = aws_sdk_iam::Client::new(sdk);
    let prefix = format!("/kprov/{cluster}/");
    n.insert(
        "iam-role",
        iam.list_roles()
            .path_prefix(&prefix)
            .send()
            .await
            .unwrap()
            .roles()
            .len(),
    );
    n.insert(
        "instance-profile",
        iam.list_instance_profiles()
            .send()
            .await
            .unwrap()
            .instance_profiles()
            .iter()
            .filter(|p| p.path() == prefix)
            .count(),
    );
    let r53 = aws_sdk_route53::Client::new(sdk);
    let sets = awscloud::sent(
        r53.list_resource_record_sets()
            .hosted_zone_id(zone_id)
            .send(),
    )
    .await;
    n.insert(
        "dns-record",
        sets.resource_record_sets()
            .iter()
            .filter(|s| {
                s.name().contains(cluster) && s.r#type() != &aws_sdk_route53::types::RrType::Ns
            })
            .count(),
    );
    n
}

fn redact(text: &str, cluster: &str) -> String {
    text.replace(cluster, "CLUSTER")
}

/// Cloud IDs are random: `~ nodes (sg-0a1b2c)` → `~ nodes (ID)`.
fn redact_ids(text: &str) -> String {
    text.lines()
        .map(|l| match (l.rfind(" ("), l.ends_with(')')) {
            (Some(i), true) if l.trim_start().starts_with(['~', '-', '±']) => {
                format!("{} (ID)", &l[..i])
            }
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn json(p: &Plan) -> serde_json::Value {
    serde_json::to_value(p).expect("plan serialises")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minimal_public_cluster_lifecycle() {
    crate::needs_tier!(Moto);
    let (name, zone) = ("minimal.lifecycle.example.com", "lifecycle.example.com");
    let (e, zone_id, c, igs) = zoned(name, zone, false).await;
    // Foreign things in the same account and zone that must survive everything below.
    let ec2 = aws_sdk_ec2::Client::new(&e.sdk);
    let foreign_vpc = awscloud::create_vpc(&ec2, "172.20.0.0/16").await;
    // Another cluster's NAT gateway, carrying a kprov identity this cluster could also have:
    // regression test for trusting the server's tag filter (moto ignores it for NAT gateways).
    let foreign_subnet = awscloud::create_subnet(&ec2, &foreign_vpc, "172.20.0.0/24", None).await;
    let eip = ec2.allocate_address().send().await.unwrap();
    let foreign_nat = ec2
        .create_nat_gateway()
        .subnet_id(&foreign_subnet)
        .allocation_id(eip.allocation_id().unwrap())
        .tag_specifications(
            aws_sdk_ec2::types::TagSpecification::builder()
                .resource_type(aws_sdk_ec2::types::ResourceType::Natgateway)
                .tags(
                    aws_sdk_ec2::types::Tag::builder()
                        .key(owned_tag_key("other.example.com"))
                        .value("owned")
                        .build(),
                )
                .tags(
                    aws_sdk_ec2::types::Tag::builder()
                        .key("kprov.dev/id")
                        .value("NatGateway/us-east-1a")
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap()
        .nat_gateway()
        .and_then(|n| n.nat_gateway_id().map(str::to_string))
        .unwrap();
    awscloud::create_a_record(&e.sdk, &zone_id, &format!("www.{zone}."), "192.0.2.10").await;

    e.rec.take();
    let first = plan(&e, &c, &igs).await;
    // The preview is read-only: every request it sent was a Describe/List/Get.
    let sent = e.rec.take();
    let writes: Vec<&String> = sent.iter().filter(|o| is_write(o)).collect();
    assert!(writes.is_empty(), "preview wrote: {writes:?}");
    assert!(!sent.is_empty());
    assert!(first.errors.is_empty(), "{:?}", first.errors);
    assert_eq!(first.summary.update + first.summary.delete, 0);
    assert_eq!(first.exit_code(false), 2);
    insta::assert_snapshot!(
        "minimal_public_plan",
        redact(&engine::render_text(&first, RenderOptions::default()), name)
    );
    insta::assert_json_snapshot!("minimal_public_plan_json", json(&first), {
        ".cluster" => "CLUSTER",
    });

    apply(&e, &first, false).await;
    let counts = count_owned(&e.sdk, name, &zone_id).await;
    let expected: BTreeMap<&str, usize> = [
        ("vpc", 1),
        ("subnet", 1),
        ("igw", 1),
        ("route-table", 1),
        ("security-group", 3),
        ("eip", 0),
        ("nat", 0),
        ("key-pair", 1),
        ("launch-template", 2),
        ("asg", 2),
        ("lb+tg", 2),
        ("iam-role", 2),
        ("instance-profile", 2),
        ("dns-record", 4),
    ]
    .into_iter()
    .collect();
    assert_eq!(counts, expected);

    // The launch templates require IMDSv2 with one hop (moto does not copy the options to
    // instances, so the template is where this is proven), and carry the complete user-data
    // with the host key, which only the plan redacts.
    let imds = |name: String| {
        let ec2 = ec2.clone();
        async move {
            let v = awscloud::sent(
                ec2.describe_launch_template_versions()
                    .launch_template_name(name)
                    .versions("$Latest")
                    .send(),
            )
            .await;
            let d = v.launch_template_versions()[0]
                .launch_template_data()
                .cloned()
                .unwrap();
            let m = d.metadata_options().cloned().unwrap();
            (
                m.http_tokens().map(|t| t.as_str().to_string()),
                m.http_put_response_hop_limit(),
                m.http_endpoint().map(|t| t.as_str().to_string()),
                d.user_data().map(str::to_string).unwrap_or_default(),
            )
        }
    };
    for g in ["nodes", "control-plane-us-east-1a"] {
        let (tokens, hops, endpoint, user_data) = imds(format!("{g}.{name}")).await;
        assert_eq!(tokens.as_deref(), Some("required"), "{g}");
        assert_eq!(hops, Some(1), "{g}");
        assert_eq!(endpoint.as_deref(), Some("enabled"), "{g}");
        let text = aws_smithy_types::base64::decode(&user_data).unwrap();
        let text = String::from_utf8(text).unwrap();
        let k = host_key();
        for line in k.private.lines() {
            assert!(text.contains(&format!("    {line}\n")), "{g}: {text}");
        }
        assert!(text.contains(&k.public), "{g}: {text}");
    }

    // AWS (and the lab's as-it-is policy) lists an Auto Scaling group's instances only some
    // time after the group is created: wait as `update --yes` does before reading them.
    let mut igs_waited = igs.clone();
    igs_waited[0].spec.ssh_user = Some("ops".into());
    wait_launched(&e, &igs_waited).await;

    // The groups' running instances as node targets, in one read-only paginated read.
    e.rec.take();
    let reach = |r| AwsInstances::new(&e.cloud, &igs, r);
    let err = reach(SshReach::Private)
        .discover()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("instance group control-plane-us-east-1a") && err.contains("spec.sshUser"),
        "an ami- image says nothing about its login user: {err}"
    );
    let mut igs_user = igs.clone();
    igs_user[0].spec.ssh_user = Some("ops".into());
    e.rec.take();
    let found = AwsInstances::new(&e.cloud, &igs_user, SshReach::Private)
        .discover()
        .await
        .expect("instances");
    let sent = e.rec.take();
    assert!(sent.iter().all(|o| !is_write(o)), "{sent:?}");
    assert_eq!(
        sent.iter()
            .filter(|o| o.contains("DescribeInstances"))
            .count(),
        1,
        "{sent:?}"
    );
    assert!(
        found.jump_hosts.is_empty() && found.strays.is_empty(),
        "{found:?}"
    );
    let groups: Vec<_> = found
        .targets
        .iter()
        .map(|t| t.group.clone().unwrap())
        .collect();
    assert_eq!(
        groups,
        ["control-plane-us-east-1a", "nodes"],
        "control planes first"
    );
    for t in &found.targets {
        let i = t.instance.as_ref().expect("cloud instance");
        assert_eq!(t.name(), i.id);
        assert!(i.private_ip.starts_with("172.20."), "{i:?}");
        assert_eq!(t.host.address, i.private_ip, "private reach");
        assert_eq!(t.host.bastion, None);
        assert_eq!(t.node_name, i.private_dns);
        assert_eq!(
            i.private_dns,
            format!("ip-{}.ec2.internal", i.private_ip.replace('.', "-"))
        );
        assert_eq!(i.provider_id, format!("aws:///{}/{}", i.zone, i.id));
    }
    assert_eq!(found.targets[0].host.user.as_deref(), Some("ops"));
    assert_eq!(
        found.targets[1].host.user.as_deref(),
        Some("ubuntu"),
        "ubuntu image"
    );
    assert_eq!(found.targets[0].host.roles, [HostRole::ControlPlane]);
    assert_eq!(found.targets[1].host.roles, [HostRole::Node]);
    // Public reach maps the public address (moto invents it: mapped, never contacted).
    let public = AwsInstances::new(&e.cloud, &igs_user, SshReach::Public)
        .discover()
        .await
        .expect("instances");
    for t in &public.targets {
        assert_eq!(
            Some(&t.host.address),
            t.instance.as_ref().unwrap().public_ip.as_ref()
        );
    }

    // Converged: the next preview is empty, again without writes.
    e.rec.take();
    let again = plan(&e, &c, &igs).await;
    assert!(
        again.is_empty(),
        "{}",
        engine::render_text(&again, RenderOptions::default())
    );
    assert_eq!(again.exit_code(true), 0);
    let sent = e.rec.take();
    assert!(sent.iter().all(|o| !is_write(o)), "{sent:?}");

    // Out-of-band drift: a rule revoked, an ASG resized and pinned to an old template version.
    let by_name = awscloud::ec2_filter("group-name", [format!("nodes.{name}")]);
    let sg = awscloud::sent(ec2.describe_security_groups().filters(by_name).send()).await;
    let sg_id = sg.security_groups()[0].group_id().unwrap().to_string();
    ec2.revoke_security_group_ingress()
        .group_id(&sg_id)
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(22)
                .to_port(22)
                .ip_ranges(
                    aws_sdk_ec2::types::IpRange::builder()
                        .cidr_ip("0.0.0.0/0")
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    let asg = aws_sdk_autoscaling::Client::new(&e.sdk);
    let group = format!("nodes.{name}");
    asg.update_auto_scaling_group()
        .auto_scaling_group_name(&group)
        .min_size(0)
        .max_size(7)
        .desired_capacity(0)
        .launch_template(
            aws_sdk_autoscaling::types::LaunchTemplateSpecification::builder()
                .launch_template_name(format!("nodes.{name}"))
                .version("1")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let drift = plan(&e, &c, &igs).await;
    let text = redact(&engine::render_text(&drift, RenderOptions::default()), name);
    assert_eq!(drift.summary.update, 2, "{text}");
    insta::assert_snapshot!("minimal_public_drift", redact_ids(&text));
    assert_eq!(drift.summary.total(), 2, "{text}");
    let fields = |kind: &str| -> Vec<String> {
        drift
            .changes
            .iter()
            .filter(|c| c.kind == kind)
            .flat_map(|c| c.fields.iter().map(|f| f.field.clone()))
            .collect()
    };
    assert_eq!(fields("SecurityGroupRules"), ["ingress"]);
    assert_eq!(
        fields("AutoScalingGroup"),
        [
            "desiredCapacity",
            "launchTemplateVersion",
            "maxSize",
            "minSize"
        ]
    );
    assert!(text.contains("maxSize: 7 -> 3"), "{text}");
    assert!(
        text.contains("launchTemplateVersion: \"1\" -> \"$Latest\""),
        "{text}"
    );
    apply(&e, &drift, false).await;
    // Scaling within the spec's bounds is the autoscaler's business, not drift.
    asg.set_desired_capacity()
        .auto_scaling_group_name(&group)
        .desired_capacity(3)
        .send()
        .await
        .unwrap();
    let repaired = plan(&e, &c, &igs).await;
    assert!(
        repaired.is_empty(),
        "{}",
        engine::render_text(&repaired, RenderOptions::default())
    );

    // A new host key for a group changes its user-data: the plan shows the digest line
    // change (never the key) and the apply writes a new launch template version.
    let rotated = kprov::cloud::aws::hostkeys::generate("nodes")
        .await
        .expect("ssh-keygen");
    let mut keys: BTreeMap<String, GroupHostKey> = igs
        .iter()
        .map(|g| (g.metadata.name.clone(), host_key()))
        .collect();
    keys.insert("nodes".into(), rotated.clone());
    let rotating = AwsCloud::new(&e.kprov_sdk, name, &[]).with_host_keys(keys);
    let changed = awscloud::plan(&rotating, &c, &igs).await.expect("plan");
    assert_eq!(changed.summary.update, 1);
    let text = engine::render_text(&changed, RenderOptions::default());
    let digest = kprov::cloud::aws::hostkeys::digest(&rotated.private);
    assert!(
        text.lines().any(|l| l.trim_start().starts_with('+')
            && l.ends_with(&format!("<private key redacted, {digest}>"))),
        "{text}"
    );
    let json_text = serde_json::to_string(&json(&changed)).unwrap();
    for line in rotated.private.lines().chain(host_key().private.lines()) {
        if !line.starts_with("-----") {
            assert!(!text.contains(line) && !json_text.contains(line), "{text}");
        }
    }
    engine::apply(&rotating, &changed, &fast())
        .await
        .expect("apply");
    assert!(
        awscloud::plan(&rotating, &c, &igs)
            .await
            .expect("plan")
            .is_empty()
    );
    let igs2 = igs.clone();
    let e = Env {
        sdk: e.sdk.clone(),
        kprov_sdk: e.kprov_sdk.clone(),
        rec: e.rec,
        cloud: rotating,
    };

    // A new SSH key cannot be changed in place: the key pair is replaced (same name, so the
    // launch templates keep naming it); their user-data authorizes the new key, so each gets
    // a new version.
    let mut rotated = c.clone();
    rotated.spec.ssh_key.as_mut().unwrap().public_key = Some(ROTATED_KEY.into());
    let replace = plan(&e, &rotated, &igs2).await;
    assert_eq!(replace.summary.replace, 1, "{:?}", replace.changes);
    assert_eq!(replace.summary.update, 2, "{:?}", replace.changes);
    assert_eq!(replace.summary.total(), 3);
    let kinds: Vec<&str> = replace.changes.iter().map(|c| c.kind.as_str()).collect();
    assert!(kinds.contains(&"KeyPair"), "{kinds:?}");
    assert!(
        replace
            .changes
            .iter()
            .filter(|c| c.kind == "LaunchTemplate")
            .all(|c| c.fields.iter().map(|f| f.field.as_str()).eq(["userData"])),
        "{:?}",
        replace.changes
    );
    apply(&e, &replace, false).await;
    assert!(plan(&e, &rotated, &igs2).await.is_empty());
    let keys = awscloud::sent(
        ec2.describe_key_pairs()
            .key_names(format!("kprov-{name}"))
            .send(),
    )
    .await;
    let hash = keys.key_pairs()[0]
        .tags()
        .iter()
        .find(|t| t.key() == Some("kprov.dev/public-key-sha256"))
        .and_then(|t| t.value())
        .map(str::to_string);
    assert_eq!(hash, Some(kprov::cloud::aws::public_key_hash(ROTATED_KEY)));
    let c = rotated;

    // An immutable field is refused with a message naming it, and apply refuses the plan.
    let mut c2 = c.clone();
    c2.spec.networking.subnets[0].cidr = "172.20.64.0/19".into();
    let refused = plan(&e, &c2, &igs2).await;
    assert_error(&refused, |m| {
        m.contains("Subnet/us-east-1a: field cidr cannot change")
    });
    assert!(engine::apply(&e.cloud, &refused, &fast()).await.is_err());

    // Dropping an instance group: its resources are planned for deletion, applied only with prune.
    let fewer = &igs2[..1];
    let shrink = plan(&e, &c, fewer).await;
    let doomed: Vec<String> = shrink
        .changes
        .iter()
        .filter(|c| c.action == Action::Delete)
        .map(|c| format!("{}/{}", c.kind, c.name))
        .collect();
    let mut sorted = doomed.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            "AutoScalingGroup/nodes",
            "IamInstanceProfile/nodes",
            "IamRole/nodes",
            "IamRolePolicy/nodes",
            "LaunchTemplate/nodes",
        ]
    );
    // Reverse dependency order: users before what they use.
    let pos = |x: &str| doomed.iter().position(|d| d == x).unwrap();
    assert!(pos("AutoScalingGroup/nodes") < pos("LaunchTemplate/nodes"));
    assert!(pos("LaunchTemplate/nodes") < pos("IamInstanceProfile/nodes"));
    assert!(pos("IamInstanceProfile/nodes") < pos("IamRole/nodes"));
    assert!(pos("IamRolePolicy/nodes") < pos("IamRole/nodes"));

    assert_eq!(shrink.exit_code(false), 0);
    apply(&e, &shrink, false).await;
    assert_eq!(plan(&e, &c, fewer).await.summary.delete, 5);

    // Delete: everything owned goes, in reverse dependency order; foreign things stay.
    e.rec.take();
    delete_all(&e, &c, &igs2).await;
    let left: usize = count_owned(&e.sdk, name, &zone_id).await.values().sum();
    assert_eq!(left, 0, "{:?}", count_owned(&e.sdk, name, &zone_id).await);
    assert_eq!(
        vpcs_with_id(&ec2, &foreign_vpc).await,
        1,
        "foreign VPC deleted"
    );
    let nats = awscloud::sent(
        ec2.describe_nat_gateways()
            .nat_gateway_ids(&foreign_nat)
            .send(),
    )
    .await;
    assert_eq!(
        nats.nat_gateways()[0].state().map(|s| s.as_str()),
        Some("available"),
        "foreign NAT gateway deleted"
    );
    let sets = awscloud::sent(
        aws_sdk_route53::Client::new(&e.sdk)
            .list_resource_record_sets()
            .hosted_zone_id(&zone_id)
            .send(),
    )
    .await;
    assert!(
        sets.resource_record_sets()
            .iter()
            .any(|s| s.name() == format!("www.{zone}.")),
        "foreign record deleted"
    );
    let after = plan(&e, &c, &igs2).await;
    assert_eq!(after.summary.create, first.summary.create);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_private_cluster_lifecycle() {
    crate::needs_tier!(Moto);
    let (name, zone) = ("ha.private.example.com", "private.example.com");
    let (e, zone_id, c, igs) = zoned(name, zone, true).await;
    e.rec.take();
    let first = plan(&e, &c, &igs).await;
    assert!(e.rec.take().iter().all(|o| !is_write(o)));
    assert!(first.errors.is_empty(), "{:?}", first.errors);
    insta::assert_snapshot!(
        "ha_private_plan",
        redact(&engine::render_text(&first, RenderOptions::default()), name)
    );
    apply(&e, &first, false).await;
    let counts = count_owned(&e.sdk, name, &zone_id).await;
    assert_eq!(counts["subnet"], 6);
    assert_eq!(counts["nat"], 3);
    assert_eq!(counts["eip"], 3);
    assert_eq!(counts["route-table"], 4);
    assert_eq!(counts["asg"], 5);
    assert_eq!(counts["security-group"], 4);
    assert_eq!(counts["iam-role"], 3);
    e.rec.take();
    let again = plan(&e, &c, &igs).await;
    // Previews of an existing cluster, for update and for delete, are read-only too.
    let doomed = awscloud::plan_delete(&e.cloud, &c, &igs).await;
    assert_eq!(doomed.summary.delete, first.summary.create);
    let sent = e.rec.take();
    assert!(sent.iter().all(|o| !is_write(o)), "{sent:?}");
    assert!(
        again.is_empty(),
        "{}",
        engine::render_text(&again, RenderOptions::default())
    );
    delete_all(&e, &c, &igs).await;
    let left = count_owned(&e.sdk, name, &zone_id).await;
    assert_eq!(left.values().sum::<usize>(), 0, "{left:?}");
}

/// Stop the apply at an interruption point (after its k-th distinct change, see
/// `aws_recorder`); the re-run must converge with nothing duplicated. Then stop the delete at
/// the same point; the re-run must leave nothing. Under the as-it-is policy, as every AWS test.
/// Sweeps the first and last points and a seeded spread between them (see [`sweep`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_applies_converge() {
    crate::needs_tier!(Moto);
    interrupt_everywhere("interrupt.example.com", false, 6).await;
}

/// The same for the HA private cluster (NAT gateways and their waits, per-zone route tables,
/// three roles).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_ha_private_applies_converge() {
    crate::needs_tier!(Moto);
    interrupt_everywhere("interrupt-ha.example.com", true, 5).await;
}

/// The interruption points an interrupted-apply test stops at, out of `total` (1..total: the
/// last point is before the last write): the first and the last, and `between` more spread
/// evenly from an offset fixed by `seed` (the lab's seed, `KPROV_LAB_SEED`), so another seed
/// sweeps other points. Each point costs a serial apply through AWS's windows, which is why
/// not all are swept by default; `KPROV_INTERRUPT_SWEEP=all` sweeps every one.
fn sweep(total: usize, between: usize, seed: u64) -> Vec<usize> {
    let last = total.saturating_sub(1).max(1);
    if std::env::var("KPROV_INTERRUPT_SWEEP").is_ok_and(|v| v == "all") || last <= between + 2 {
        return (1..=last).collect();
    }
    let step = (last - 1) / (between + 1);
    let offset = 1 + (seed as usize % step.max(1));
    let mut points: std::collections::BTreeSet<usize> = [1, last].into();
    points.extend((0..between).map(|i| (offset + (i + 1) * step).min(last)));
    points.into_iter().collect()
}

#[test]
fn sweep_takes_first_last_and_a_seeded_spread() {
    let a = sweep(60, 5, 23);
    assert_eq!((a.first(), a.last()), (Some(&1), Some(&59)), "{a:?}");
    assert_eq!(a.len(), 7, "{a:?}");
    assert_ne!(a, sweep(60, 5, 24), "another seed, other points");
    assert_eq!(sweep(6, 5, 23), vec![1, 2, 3, 4, 5]);
}

async fn interrupt_everywhere(zone: &str, private: bool, between: usize) {
    let sdk = moto().sdk_config().await;
    let zone_id = make_zone(&sdk, zone).await;
    let seed = crate::support::faultproxy::AsItIs::lab_seed();

    // How many interruption points (distinct changes) a full apply has. Counted once: the
    // writes kprov retried through AWS's windows are no new points (`Recorder::ok_writes`).
    let probe = format!("probe.{zone}");
    let e = env(&probe).await;
    let (c, igs) = spec(&probe, zone, private);
    let p = plan(&e, &c, &igs).await;
    e.rec.limit_writes(None);
    apply(&e, &p, false).await;
    let total = e.rec.ok_writes();
    let sent = e.rec.sent_writes();
    let expected = count_owned(&sdk, &probe, &zone_id).await;
    delete_all(&e, &c, &igs).await;
    assert!(
        total > 20,
        "a full apply had only {total} interruption points"
    );
    let points = sweep(total, between, seed);
    println!(
        "interrupt sweep {zone}: {total} interruption points ({sent} writes with retries), seed {seed}: stopping at {points:?}"
    );

    // The points are independent clusters: two at a time (each apply itself is serial).
    let started = std::time::Instant::now();
    futures::stream::iter(points.iter().copied())
        .for_each_concurrent(2, |k| {
            let (sdk, zone_id, expected) = (&sdk, &zone_id, &expected);
            async move { interrupt_at(zone, private, k, sdk, zone_id, expected).await }
        })
        .await;
    println!(
        "interrupt sweep {zone}: {} points in {:.0?}",
        points.len(),
        started.elapsed()
    );
}

async fn interrupt_at(
    zone: &str,
    private: bool,
    k: usize,
    sdk: &aws_config::SdkConfig,
    zone_id: &str,
    expected: &BTreeMap<&'static str, usize>,
) {
    let name = format!("k{k}.{zone}");
    let e = env(&name).await;
    let (c, igs) = spec(&name, zone, private);
    let p = plan(&e, &c, &igs).await;
    e.rec.limit_writes(Some(k));
    // Serial, so "the k-th point" is one exact place in the run.
    let opts = ApplyOptions {
        parallelism: 1,
        ..fast()
    };
    let interrupted = engine::apply(&e.cloud, &p, &opts).await;
    assert!(interrupted.is_err(), "k={k}: apply was not interrupted");
    e.rec.limit_writes(None);
    let resumed = plan(&e, &c, &igs).await;
    assert!(resumed.errors.is_empty(), "k={k}: {:?}", resumed.errors);
    apply(&e, &resumed, true).await;
    let converged = plan(&e, &c, &igs).await;
    assert!(
        converged.is_empty(),
        "k={k}: {}",
        engine::render_text(&converged, RenderOptions::default())
    );
    assert_eq!(&count_owned(sdk, &name, zone_id).await, expected, "k={k}");
    // Delete, interrupted the same way, then run again.
    let doomed = awscloud::plan_delete(&e.cloud, &c, &igs).await;
    e.rec.limit_writes(Some(k));
    let prune = ApplyOptions {
        prune: true,
        ..opts
    };
    let _ = engine::apply(&e.cloud, &doomed, &prune).await;
    e.rec.limit_writes(None);
    delete_all(&e, &c, &igs).await;
    let left = count_owned(sdk, &name, zone_id).await;
    assert_eq!(left.values().sum::<usize>(), 0, "k={k}: leaked {left:?}");
}

/// Figures for scripts/bench-plan: AWS requests and wall time of a preview of an applied
/// cluster with 1, 10 and 50 instance groups. Run with `--ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: scripts/bench-plan runs it"]
async fn bench_plan() {
    let sizes: Vec<usize> = std::env::var("KPROV_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 10, 50]);
    bench_plan_table("bench.example.com", &sizes).await;
}

/// The benchmark's smoke mode, in every `cargo test`: small sizes, no timing assertion, so a
/// broken benchmark fails CI (it once panicked at 10 groups for weeks while `#[ignore]`d).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_plan_smoke() {
    crate::needs_tier!(Moto);
    bench_plan_table("smoke.bench.example.com", &[1, 3]).await;
}

async fn bench_plan_table(zone: &str, sizes: &[usize]) {
    let sdk = moto().sdk_config().await;
    make_zone(&sdk, zone).await;
    println!("\ninstance_groups requests operations waves wall_ms");
    for &n in sizes {
        let name = format!("n{n}.{zone}");
        let mut e = env(&name).await;
        let (c, mut igs) = spec(&name, zone, false);
        let template = igs.pop().expect("nodes group");
        igs.truncate(1);
        for i in 1..n {
            let mut g = template.clone();
            g.metadata.name = format!("nodes-{i}");
            g.spec.min_size = Some(0);
            igs.push(g);
        }
        // Host keys for the groups made here too: `env` seeds only the specs' usual names.
        let keys = igs
            .iter()
            .map(|g| (g.metadata.name.clone(), host_key()))
            .collect();
        e.cloud = AwsCloud::new(&e.kprov_sdk, &name, &[e.rec.shared()]).with_host_keys(keys);
        let p = plan(&e, &c, &igs).await;
        apply(&e, &p, false).await;
        e.rec.take();
        if std::env::var_os("KPROV_BENCH_PROBE").is_some() {
            probe_lists(&e, &name, igs.len()).await;
        }
        let start = std::time::Instant::now();
        let p = plan(&e, &c, &igs).await;
        let wall = start.elapsed();
        let waves = e.rec.waves();
        if std::env::var_os("KPROV_BENCH_WAVES").is_some() {
            for (wave, op, took) in e.rec.wave_of_each() {
                eprintln!("wave {wave}: {op} {took:?}");
            }
        }
        let sent = e.rec.take();
        assert!(
            p.is_empty(),
            "{}",
            engine::render_text(&p, RenderOptions::default())
        );
        assert!(sent.iter().all(|o| !is_write(o)));
        let mut ops: BTreeMap<&str, usize> = BTreeMap::new();
        for o in &sent {
            *ops.entry(o.as_str()).or_default() += 1;
        }
        let distinct = ops.len();
        println!(
            "{:>15} {:>8} {:>10} {:>5} {:>7}",
            igs.len(),
            sent.len(),
            distinct,
            waves,
            wall.as_millis()
        );
        delete_all(&e, &c, &igs).await;
    }
}

/// `KPROV_BENCH_PROBE=1`: the lists whose answers grow with the instance groups, each sent
/// alone (the fastest of 5, client side, as kprov sends it), beside one that does not grow, so
/// a preview's growth can be told apart from moto answering many requests at once.
async fn probe_lists(e: &Env, cluster: &str, groups: usize) {
    let ec2 = aws_sdk_ec2::Client::new(&e.kprov_sdk);
    let asg = aws_sdk_autoscaling::Client::new(&e.kprov_sdk);
    let owned = owned_tag_key(cluster);
    let mut best = [Duration::MAX; 4];
    // Keeps in `best` the shorter of it and the time `request` takes.
    async fn timed<T, E: std::fmt::Debug>(
        best: &mut Duration,
        request: impl Future<Output = Result<T, E>>,
    ) {
        let t = std::time::Instant::now();
        awscloud::sent(request).await;
        *best = (*best).min(t.elapsed());
    }
    for _ in 0..5 {
        let [versions, templates, asgs, zones] = &mut best;
        let lt_owned = awscloud::ec2_filter(format!("tag:{owned}"), ["owned"]);
        let asg_owned = awscloud::asg_filter(lt_owned.clone());
        let list_versions = ec2.describe_launch_template_versions().versions("$Latest");
        let list_templates = ec2.describe_launch_templates().filters(lt_owned);
        let list_asgs = asg.describe_auto_scaling_groups().filters(asg_owned);
        timed(versions, list_versions.max_results(200).send()).await;
        timed(templates, list_templates.max_results(200).send()).await;
        timed(asgs, list_asgs.send()).await;
        timed(zones, ec2.describe_availability_zones().send()).await;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    eprintln!(
        "probe {groups} groups, alone, ms: DescribeLaunchTemplateVersions {:.1}, \
         DescribeLaunchTemplates {:.1}, DescribeAutoScalingGroups {:.1}, \
         DescribeAvailabilityZones {:.1}",
        ms(best[0]),
        ms(best[1]),
        ms(best[2]),
        ms(best[3])
    );
}

/// `networking.networkID` adopts an existing VPC (and its internet gateway), a subnet `id` an
/// existing subnet: used, validated, never changed or deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopted_vpc_is_used_validated_and_kept() {
    crate::needs_tier!(Moto);
    let (name, zone) = ("adopt.shared.example.com", "shared.example.com");
    let (e, zone_id, mut c, igs) = zoned(name, zone, false).await;
    let ec2 = aws_sdk_ec2::Client::new(&e.sdk);
    let vpc = awscloud::create_vpc(&ec2, "172.20.0.0/16").await;
    let igw = awscloud::create_internet_gateway(&ec2, &vpc).await;
    let subnet = awscloud::create_subnet(&ec2, &vpc, "172.20.32.0/19", Some("us-east-1a")).await;
    awscloud::map_public_ip_on_launch(&ec2, &subnet).await;

    c.spec.networking.subnets[0].id = Some(subnet.clone());
    c.spec.networking.network_id = Some("vpc-00000000".into());
    let missing = plan(&e, &c, &igs).await;
    assert_error(&missing, |m| {
        m == "Vpc/main: must already exist (vpc-00000000) but was not found"
    });

    c.spec.networking.network_id = Some(vpc.clone());
    let p = plan(&e, &c, &igs).await;
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let made: Vec<&str> = p.changes.iter().map(|ch| ch.kind.as_str()).collect();
    for kind in ["Vpc", "InternetGateway", "Subnet", "RouteTable"] {
        assert!(
            !made.contains(&kind),
            "adopted network: {kind} must not be created"
        );
    }
    apply(&e, &p, false).await;
    // The instance groups use the adopted subnet.
    let asg = aws_sdk_autoscaling::Client::new(&e.sdk);
    let groups = awscloud::sent(
        asg.describe_auto_scaling_groups()
            .auto_scaling_group_names(format!("nodes.{name}"))
            .send(),
    )
    .await;
    assert_eq!(
        groups.auto_scaling_groups()[0].vpc_zone_identifier(),
        Some(subnet.as_str())
    );
    assert!(plan(&e, &c, &igs).await.is_empty());

    let mut wrong = c.clone();
    wrong.spec.networking.network_cidr = Some("10.0.0.0/16".into());
    let differs = plan(&e, &wrong, &igs).await;
    assert_error(&differs, |m| {
        m.contains("Vpc/main") && m.contains("adopted resource differs")
    });

    delete_all(&e, &c, &igs).await;
    assert_eq!(
        count_owned(&e.sdk, name, &zone_id)
            .await
            .values()
            .sum::<usize>(),
        0
    );
    assert_eq!(vpcs_with_id(&ec2, &vpc).await, 1);
    let kept = awscloud::sent(ec2.describe_subnets().subnet_ids(&subnet).send()).await;
    assert_eq!(kept.subnets().len(), 1, "the adopted subnet must survive");
    let g = awscloud::sent(
        ec2.describe_internet_gateways()
            .internet_gateway_ids(&igw)
            .send(),
    )
    .await;
    assert_eq!(
        g.internet_gateways()[0].attachments()[0].vpc_id(),
        Some(vpc.as_str()),
        "the adopted gateway must stay attached"
    );
}

/// A record this cluster would write that already exists and is not owned (no owner TXT) is a
/// plan error: applying would take over someone else's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_record_at_an_api_name_is_a_conflict() {
    crate::needs_tier!(Moto);
    let (name, zone) = ("taken.conflict.example.com", "conflict.example.com");
    let (e, zone_id, c, igs) = zoned(name, zone, false).await;
    awscloud::create_a_record(&e.sdk, &zone_id, &format!("api.{name}."), "192.0.2.1").await;
    let p = plan(&e, &c, &igs).await;
    assert_eq!(
        p.errors,
        [format!(
            "DnsRecord/api: api.{name}. already has a A record in zone {zone}. that cluster \
             {name} does not own (no owner TXT record); remove it or choose another name"
        )]
    );
    let err = engine::apply(&e.cloud, &p, &fast()).await.unwrap_err();
    assert!(err.to_string().contains("cannot be applied"), "{err}");
    assert!(
        e.rec.take().iter().all(|o| !is_write(o)),
        "a refused plan wrote"
    );
    assert_eq!(count_owned(&e.sdk, name, &zone_id).await["vpc"], 0);
}

/// A private zone is associated with the cluster's VPC (instances resolve it only from
/// associated VPCs); delete removes that association and nothing else of the zone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_zone_is_associated_with_the_cluster_vpc() {
    crate::needs_tier!(Moto);
    let (name, zone) = ("dns.internal.example", "internal.example");
    let e = env(name).await;
    let ec2 = aws_sdk_ec2::Client::new(&e.sdk);
    let other_vpc = awscloud::create_vpc(&ec2, "10.9.0.0/16").await;
    let r53 = aws_sdk_route53::Client::new(&e.sdk);
    let zone_id = r53
        .create_hosted_zone()
        .name(zone)
        .caller_reference("kprov-test-private")
        .hosted_zone_config(
            aws_sdk_route53::types::HostedZoneConfig::builder()
                .private_zone(true)
                .build(),
        )
        .vpc(
            aws_sdk_route53::types::Vpc::builder()
                .vpc_id(&other_vpc)
                .vpc_region(aws_sdk_route53::types::VpcRegion::UsEast1)
                .build(),
        )
        .send()
        .await
        .unwrap()
        .hosted_zone()
        .map(|z| z.id().trim_start_matches("/hostedzone/").to_string())
        .unwrap();
    let associated = || async {
        let z = r53.get_hosted_zone().id(&zone_id).send().await.unwrap();
        let mut v: Vec<String> = z
            .vpcs()
            .iter()
            .filter_map(|v| v.vpc_id().map(str::to_string))
            .collect();
        v.sort();
        v
    };

    let (mut c, igs) = spec(name, zone, false);
    c.spec.dns.as_mut().unwrap().kind = kprov::spec::DnsType::Private;
    let p = plan(&e, &c, &igs).await;
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert!(
        !p.warnings.iter().any(|w| w.contains("NS delegation")),
        "no NS check for a private zone: {:?}",
        p.warnings
    );
    assert!(
        p.changes
            .iter()
            .any(|ch| ch.kind == "DnsZoneVpcAssociation")
    );
    apply(&e, &p, false).await;
    let owned = awscloud::ec2_filter(format!("tag:{}", owned_tag_key(name)), ["owned"]);
    let vpcs = awscloud::sent(ec2.describe_vpcs().filters(owned).send()).await;
    let ours = vpcs.vpcs()[0].vpc_id().unwrap().to_string();
    let mut both = vec![other_vpc.clone(), ours];
    both.sort();
    assert_eq!(associated().await, both);
    assert!(plan(&e, &c, &igs).await.is_empty());

    delete_all(&e, &c, &igs).await;
    assert_eq!(associated().await, [other_vpc]);
    assert_eq!(
        count_owned(&e.sdk, name, &zone_id)
            .await
            .values()
            .sum::<usize>(),
        0
    );
}

/// Issue 23 item 11: an image given as a bare name pattern resolves, but the preview warns,
/// naming the group and the account that published the match, so the operator can pin it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unowned_image_name_is_warned_with_its_publisher() {
    crate::needs_tier!(Moto);
    let (name, zone) = ("unowned.image.example.com", "image.example.com");
    let (e, _, c, igs) = zoned(name, zone, false).await;
    let p = plan(&e, &c, &igs).await;
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let ec2 = aws_sdk_ec2::Client::new(&e.sdk);
    let img = awscloud::sent(
        ec2.describe_images()
            .filters(awscloud::ec2_filter("name", [IMAGE_NAME]))
            .send(),
    )
    .await;
    let publisher = img.images()[0].owner_id().unwrap().to_string();
    let unowned: Vec<&String> = p
        .warnings
        .iter()
        .filter(|w| w.contains("names no owner"))
        .collect();
    // Only `nodes` uses a bare name; the other groups give an `ami-` ID.
    assert_eq!(unowned.len(), 1, "{:?}", p.warnings);
    assert!(
        unowned[0].starts_with("instance group nodes: spec.image "),
        "{}",
        unowned[0]
    );
    assert!(
        unowned[0].contains(&format!("pin it as {publisher}/{IMAGE_NAME}")),
        "{}",
        unowned[0]
    );
}

/// Issue 23 item 8: an instance type that cannot run the group's image (arm64 type, x86_64
/// image) is refused by the plan, naming the group and its field, before anything exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_type_of_another_architecture_is_refused_at_plan() {
    crate::needs_tier!(Moto);
    let (name, zone) = ("arch.image.example.com", "image.example.com");
    let (e, _, c, mut igs) = zoned(name, zone, false).await;
    let nodes = igs
        .iter_mut()
        .find(|ig| ig.metadata.name == "nodes")
        .unwrap();
    nodes.spec.machine_type = Some("m6g.large".into());
    let err = plan_refusal(&e, &c, &igs).await;
    assert!(
        err.contains("instance group nodes: spec.machineType: instance type m6g.large runs arm64 images, but image ami-1e749f67 is x86_64"),
        "{err}"
    );
    assert_no_vpc_of(&e.sdk, name).await;
}

/// Issue 23 item 8, the other branch: an instance type that is not offered in one of the
/// group's availability zones (moto's offerings, like AWS's, leave most types out of
/// us-east-1e) is refused by the plan, naming the group, its field and the zone, before
/// anything exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_type_not_offered_in_a_zone_is_refused_at_plan() {
    crate::needs_tier!(Moto);
    let (name, zone) = ("offered.image.example.com", "image.example.com");
    let (e, _, mut c, mut igs) = zoned(name, zone, false).await;
    for s in &mut c.spec.networking.subnets {
        s.zone = "us-east-1e".into();
    }
    for ig in &mut igs {
        ig.spec.machine_type = Some("c5.large".into());
    }
    let err = plan_refusal(&e, &c, &igs).await;
    assert!(
        err.contains(": spec.machineType: instance type c5.large is not offered in availability zone us-east-1e"),
        "{err}"
    );
    assert!(
        err.contains("instance group control-plane-us-east-1a: "),
        "{err}"
    );
    assert_no_vpc_of(&e.sdk, name).await;
}

/// How many VPCs have the ID `id`: 1 while it exists.
async fn vpcs_with_id(ec2: &aws_sdk_ec2::Client, id: &str) -> usize {
    let vpcs = awscloud::sent(ec2.describe_vpcs().vpc_ids(id).send()).await;
    vpcs.vpcs().len()
}

/// Nothing was created for cluster `name`: no VPC carries its tag. Only this cluster's, since
/// other tests share the moto server and make VPCs meanwhile.
async fn assert_no_vpc_of(sdk: &aws_config::SdkConfig, name: &str) {
    let tagged = awscloud::ec2_filter("tag-key", [format!("kubernetes.io/cluster/{name}")]);
    let ec2 = aws_sdk_ec2::Client::new(sdk);
    let vpcs = awscloud::sent(ec2.describe_vpcs().filters(tagged).send()).await;
    assert!(vpcs.vpcs().is_empty(), "nothing created: {vpcs:?}");
}
