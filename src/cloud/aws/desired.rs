//! The AWS resources a resolved cluster needs (kops's AWS model, trimmed): a pure function
//! of the [`ResolvedCluster`], so golden tests need no cloud. Defaults were applied and
//! checked once by `spec::resolve`; nothing here re-applies one.

use std::collections::BTreeMap;

use serde_json::json;

use super::hostkeys::{self, GroupHostKey};
use super::tasks::{
    AutoScalingGroup, BootData, DnsRecord, DnsZone, DnsZoneVpc, ElasticIp, Fields, Head,
    IamInstanceProfile, IamRole, IamRolePolicy, InternetGateway, KeyPair, Kinded, Launch,
    LaunchTemplate, Listener, LoadBalancer, NatGateway, PublicKey, Ref, Route, RouteTable,
    RouteTarget, Rule, SecurityGroup, SecurityGroupRules, Source, Subnet, TargetGroup, Vpc, VpcDns,
};
use crate::cloud::engine::{CloudError, Resource, ResourceId};
use crate::spec::resolve::{Access, GroupPlacement, ImageRef, ResolvedDns, ResolvedGroup};
use crate::spec::{InstanceGroupRole, LoadBalancerType, ResolvedCluster, SubnetType, TopologyType};

const ANYWHERE: &str = "0.0.0.0/0";
/// The API load balancer's listener port (and its target group's): read it through
/// [`super::instances::api_port`], the one place clients take the API's port from.
pub(super) const API_PORT: u16 = 6443;

/// Role names the IAM resources, security groups and launch templates are keyed by.
fn role_key(role: InstanceGroupRole) -> &'static str {
    match role {
        InstanceGroupRole::ControlPlane => "control-plane",
        InstanceGroupRole::Node => "nodes",
        InstanceGroupRole::Bastion => "bastion",
    }
}

/// The port the bastion load balancer forwards to the bastion instances.
pub(super) const SSH_PORT: i64 = 22;

/// Load balancer names are limited to 32 characters of `[A-Za-z0-9-]`: keep a readable prefix
/// and make it unique with a hash of the cluster name.
pub(crate) fn short_name(prefix: &str, cluster: &str) -> String {
    use sha2::{Digest, Sha256};
    let hash = hex::encode(&Sha256::digest(cluster.as_bytes())[..4]);
    let clean: String = cluster
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let room = 32 - prefix.len() - 1 - hash.len() - 1;
    let mut body: String = clean.chars().take(room).collect();
    while body.ends_with('-') {
        body.pop();
    }
    format!("{prefix}-{body}-{hash}")
}

/// AWS's limit on IAM role names (instance profiles allow 128; kprov gives both the same name).
pub(crate) const IAM_NAME_MAX: usize = 64;

/// The IAM role and instance profile name of `key` (`control-plane`, `nodes`, `bastion`):
/// `KEY.CLUSTER` while that fits AWS's 64 characters (the names of existing clusters never
/// change), otherwise a readable prefix of it made unique by a hash of the cluster name, as
/// load balancer names are.
pub(crate) fn iam_name(key: &str, cluster: &str) -> String {
    let full = format!("{key}.{cluster}");
    if full.len() <= IAM_NAME_MAX {
        return full;
    }
    use sha2::{Digest, Sha256};
    let hash = hex::encode(&Sha256::digest(cluster.as_bytes())[..4]);
    // Cluster names are ASCII (validated DNS names), so byte lengths are character counts.
    let room = IAM_NAME_MAX - hash.len() - 1;
    let mut body: String = full.chars().take(room).collect();
    while body.ends_with(['.', '-']) {
        body.pop();
    }
    format!("{body}-{hash}")
}

/// The owned alias record `name` in the cluster's zone: `record_name` pointing at the load
/// balancer `lb`.
fn alias_record(name: &str, record_name: String, lb: &str) -> Resource {
    DnsRecord {
        head: Head::owned(name),
        zone: Ref::named("main"),
        record_name,
        record_type: Some("A".to_string()),
        alias: Some(Ref::named(lb)),
        txt: None,
        alias_dns: None,
        alias_zone: None,
    }
    .resource()
}

/// The SHA-256 (hex) of an SSH public key line, surrounding white space ignored: the key
/// pair's `kprov.dev/public-key-sha256` tag, so a new key is a new key pair.
pub fn public_key_hash(key: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(key.trim().as_bytes()))
}

/// Images: an `ami-` ID is used as it is; anything else is an image name that
/// `AwsCloud::plan` resolved into `images` (name → ID).
///
/// `host_keys` are the groups' SSH host keys (by group name); a group without one shows
/// [`HOST_KEY_PENDING`] and its launch template cannot be written until one is generated.
pub(crate) fn desired(
    cluster: &ResolvedCluster,
    images: &BTreeMap<String, String>,
    host_keys: &BTreeMap<String, GroupHostKey>,
) -> Result<Vec<Resource>, CloudError> {
    let name = cluster.name.as_str();
    let Some(aws) = cluster.aws() else {
        return Err(CloudError::Spec(format!(
            "cluster {name} is not on AWS (spec.cloudProvider)"
        )));
    };
    let topology = aws.topology;
    let cidr = aws.network_cidr.to_string();
    let cidr = cidr.as_str();
    let mut out = Vec::new();

    let vpc = Ref::<Vpc>::named("main");
    out.push(
        match &aws.network_id {
            Some(id) => Vpc {
                head: Head::adopted(
                    "main",
                    Some(super::adopted_id(id, "spec.networking.networkID")?),
                ),
                cidr: cidr.to_string(),
                dns: None,
            },
            // A private hosted zone answers inside a VPC only with both DNS attributes on, and
            // instances get DNS names only with hostnames on (AWS's default for a new VPC is
            // support on, hostnames off). An adopted VPC is the operator's to set.
            None => Vpc {
                head: Head::owned("main"),
                cidr: cidr.to_string(),
                dns: Some(VpcDns {
                    support: true,
                    hostnames: true,
                }),
            },
        }
        .resource(),
    );

    // An adopted VPC brings its own internet gateway (a VPC can have only one).
    let igw = InternetGateway {
        head: if aws.network_id.is_some() {
            Head::adopted("main", None)
        } else {
            Head::owned("main")
        },
        vpc: Some(vpc.clone()),
    };
    out.push(igw.resource());

    let mut zones_private: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut public_subnets: Vec<&str> = Vec::new();
    let mut utility_by_zone: BTreeMap<&str, &str> = BTreeMap::new();
    for s in &aws.subnets {
        let head = match &s.id {
            // An adopted subnet keeps its owner's routing: no route table, no NAT from us.
            Some(id) => {
                let field = format!("spec.networking.subnets[{}].id", s.name);
                Head::adopted(&s.name, Some(super::adopted_id(id, &field)?))
            }
            None => Head::owned(&s.name),
        };
        let adopted = s.id.is_some();
        out.push(
            Subnet {
                head,
                vpc: vpc.clone(),
                zone: s.zone.clone(),
                cidr: s.cidr.clone(),
                map_public_ip: s.kind != SubnetType::Private,
            }
            .resource(),
        );
        if adopted {
            continue;
        }
        match s.kind {
            SubnetType::Private => zones_private.entry(&s.zone).or_default().push(&s.name),
            SubnetType::Utility => {
                utility_by_zone.entry(&s.zone).or_insert(&s.name);
                public_subnets.push(&s.name);
            }
            SubnetType::Public => public_subnets.push(&s.name),
        }
    }

    let table = |name: String, target: RouteTarget, subnets: &[&str]| RouteTable {
        head: Head::owned(name),
        vpc: vpc.clone(),
        routes: vec![Route {
            destination: ANYWHERE.to_string(),
            target,
        }],
        subnets: subnets.iter().map(|s| Ref::named(*s)).collect(),
        associations: None,
    };
    if !public_subnets.is_empty() {
        out.push(
            table(
                "public".into(),
                RouteTarget::InternetGateway(Ref::named("main")),
                public_subnets.as_slice(),
            )
            .resource(),
        );
    }
    for (zone, subnets) in &zones_private {
        let utility = utility_by_zone.get(zone).ok_or_else(|| {
            CloudError::Spec(format!(
                "spec.networking.subnets: zone {zone} has a Private subnet but no Utility subnet \
                 (created by kprov, without an id) for its NAT gateway"
            ))
        })?;
        let eip = format!("nat-{zone}");
        out.push(ElasticIp::vpc(Head::owned(&eip)).resource());
        out.push(
            NatGateway {
                head: Head::owned(*zone),
                subnet: Ref::named(*utility),
                allocation: Ref::named(eip),
            }
            .resource(),
        );
        out.push(
            table(
                format!("private-{zone}"),
                RouteTarget::NatGateway(Ref::named(*zone)),
                subnets.as_slice(),
            )
            .resource(),
        );
    }

    let public_table: Vec<ResourceId> = if public_subnets.is_empty() {
        vec![]
    } else {
        vec![ResourceId::new(RouteTable::KIND.kind(), "public")]
    };
    let private_tables: Vec<ResourceId> = zones_private
        .keys()
        .map(|z| ResourceId::new(RouteTable::KIND.kind(), format!("private-{z}")))
        .collect();

    // Security groups and their ingress rules (kept apart: the groups reference each other).
    let lb_kind = cluster.load_balancer;
    let has_lb = lb_kind != LoadBalancerType::None;
    let roles: Vec<InstanceGroupRole> = [
        InstanceGroupRole::ControlPlane,
        InstanceGroupRole::Node,
        InstanceGroupRole::Bastion,
    ]
    .into_iter()
    .filter(|r| cluster.has_role(*r))
    .collect();
    let has_bastion = roles.contains(&InstanceGroupRole::Bastion);
    let group = |n: &str| Source::Group(Ref::named(n));
    // Who may reach SSH and the API from outside (spec.sshAccess, spec.kubernetesApiAccess;
    // unset is the whole internet, as before these settings existed).
    let world = |list: &Access| -> Vec<Source> {
        match list {
            Access::Only(l) => l.iter().map(|c| Source::Cidr(c.as_str().into())).collect(),
            Access::Anywhere => vec![Source::Cidr(ANYWHERE.into())],
        }
    };
    let ssh_world = world(&aws.ssh_access);
    let api_world = world(&aws.api_access);
    let ssh_from: Vec<Source> = if has_bastion {
        vec![group("bastion")]
    } else if topology == TopologyType::Private {
        // No bastion and no public address: SSH only from inside the VPC.
        vec![Source::Cidr(cidr.into())]
    } else {
        ssh_world.clone()
    };
    let tcp_from = |port: u16, sources: &[Source]| -> Vec<Rule> {
        sources
            .iter()
            .map(|src| Rule::tcp(port, src.clone()))
            .collect()
    };
    let mut control_plane = vec![Rule::all(group("control-plane")), Rule::all(group("nodes"))];
    control_plane.extend(tcp_from(22, &ssh_from));
    if has_lb {
        control_plane.push(Rule::tcp(API_PORT, group("api-lb")));
    } else {
        control_plane.extend(tcp_from(API_PORT, &api_world));
    }
    let mut nodes = vec![Rule::all(group("nodes")), Rule::all(group("control-plane"))];
    nodes.extend(tcp_from(22, &ssh_from));
    let mut groups: Vec<(&str, Vec<Rule>)> =
        vec![("control-plane", control_plane), ("nodes", nodes)];
    if has_lb {
        let mut lb = tcp_from(API_PORT, &api_world);
        // The cluster's own instances reach the API through its load balancer too: a
        // narrowed list must not shut them out.
        if !api_world.contains(&Source::Cidr(ANYWHERE.into())) {
            lb.push(Rule::tcp(API_PORT, group("control-plane")));
            lb.push(Rule::tcp(API_PORT, group("nodes")));
        }
        groups.push(("api-lb", lb));
    }
    if has_bastion {
        groups.push(("bastion", tcp_from(22, &ssh_world)));
    }
    for (g, rules) in groups {
        out.push(
            SecurityGroup {
                head: Head::owned(g),
                vpc: vpc.clone(),
                group_name: format!("{g}.{name}"),
                description: format!("kprov {g} of cluster {name}"),
            }
            .resource(),
        );
        out.push(
            SecurityGroupRules {
                head: Head::owned(g),
                group: Ref::named(g),
                ingress: rules,
            }
            .resource(),
        );
    }

    let no_key = || {
        CloudError::Spec(format!(
            "spec.sshKey.publicKey is not set: instances need an SSH key. Add one with `kprov \
             edit cluster {}` (sshKey: {{publicKey: \"ssh-ed25519 AAAA...\"}}); make a key with \
             `ssh-keygen -t ed25519` if you have none",
            name
        ))
    };
    let public_key = aws.ssh_public_key.as_ref().ok_or_else(no_key)?;
    out.push(
        KeyPair {
            head: Head::owned("main"),
            key_name: aws.ssh_key_name.clone(),
            public_key_sha256: public_key_hash(public_key),
            public_key: Some(PublicKey(public_key.trim().to_string())),
        }
        .resource(),
    );

    for role in &roles {
        let key = role_key(*role);
        out.push(
            IamRole {
                head: Head::owned(key),
                role_name: iam_name(key, name),
                assume_role_policy: assume_role_policy(&aws.region),
            }
            .resource(),
        );
        out.push(
            IamRolePolicy {
                head: Head::owned(key),
                role: Ref::named(key),
                policy_name: format!("kprov-{key}"),
                document: role_policy(*role),
            }
            .resource(),
        );
        out.push(
            IamInstanceProfile {
                head: Head::owned(key),
                profile_name: iam_name(key, name),
                role: Some(Ref::named(key)),
            }
            .resource(),
        );
    }

    let internal_name = format!("api.internal.{name}");
    let public_name = &aws.api_name;

    let mut lb_subnets = BTreeMap::new();
    let lb_type = if lb_kind == LoadBalancerType::Internal {
        SubnetType::Private
    } else {
        SubnetType::Utility
    };
    for want in [lb_type, SubnetType::Public] {
        for s in aws.subnets.iter().filter(|s| s.kind == want) {
            lb_subnets.entry(s.zone.as_str()).or_insert(s.name.as_str());
        }
        if !lb_subnets.is_empty() {
            break;
        }
    }
    if has_lb {
        let scheme = if lb_kind == LoadBalancerType::Internal {
            "internal"
        } else {
            "internet-facing"
        };
        push_tcp_load_balancer(
            &mut out,
            TcpLoadBalancer {
                id: "api",
                lb_name: short_name("api", name),
                scheme,
                subnets: lb_subnets.values().copied().collect(),
                security_group: "api-lb",
                tg_name: short_name("tcp", name),
                port: i64::from(API_PORT),
                vpc: vpc.clone(),
                // NLB hairpin: with instance targets the client's IP is preserved, and an
                // internal NLB drops a connection it routes back to the instance that opened
                // it (AWS documents the time-out). Control planes reach the API through this
                // load balancer (kubeadm's controlPlaneEndpoint) while being its targets, so
                // the target group does not preserve client IPs: the API servers see the
                // load balancer's address, which the control-plane rule admits by the
                // load balancer's security group.
                preserve_client_ip: false,
            },
        );
    }

    // The bastion group behind its own load balancer (kops's layout): one stable name,
    // `bastion.NAME` (spec.topology.bastion.publicName), that kprov and operators jump
    // through, whichever instance the group runs now.
    if has_bastion {
        let mut subnets = BTreeMap::new();
        for want in [SubnetType::Utility, SubnetType::Public] {
            for s in aws.subnets.iter().filter(|s| s.kind == want) {
                subnets.entry(s.zone.as_str()).or_insert(s.name.as_str());
            }
            if !subnets.is_empty() {
                break;
            }
        }
        push_tcp_load_balancer(
            &mut out,
            TcpLoadBalancer {
                id: "bastion",
                lb_name: short_name("bastion", name),
                scheme: "internet-facing",
                subnets: subnets.values().copied().collect(),
                security_group: "bastion",
                tg_name: short_name("ssh", name),
                port: SSH_PORT,
                vpc: vpc.clone(),
                // The bastion is no client of its own load balancer; sshd logs the operator's
                // address.
                preserve_client_ip: true,
            },
        );
    }

    // `spec::resolve` refused a Public or Private type without a zone where records are due.
    let zone = aws.dns.zone();
    let private_zone = matches!(aws.dns, ResolvedDns::Private { .. });
    if let Some(zone) = zone.filter(|_| has_lb || has_bastion) {
        out.push(
            DnsZone {
                head: Head::adopted("main", None),
                zone_name: fqdn(zone),
                private: private_zone,
            }
            .resource(),
        );
        if private_zone {
            // Instances resolve a private zone only from VPCs associated with it.
            out.push(
                DnsZoneVpc {
                    head: Head::owned("main"),
                    zone: Ref::named("main"),
                    vpc: vpc.clone(),
                }
                .resource(),
            );
        }
    }
    if let Some(zone) = zone.filter(|_| has_bastion) {
        let host = &aws.bastion_name;
        if !fqdn(host).ends_with(&format!(".{}", fqdn(zone))) {
            return Err(CloudError::Spec(format!(
                "{host} is not inside the DNS zone {zone} (spec.topology.bastion.publicName)"
            )));
        }
        out.push(alias_record("bastion", fqdn(host), "bastion"));
    }
    if let Some(zone) = zone.filter(|_| has_lb) {
        for (rname, host) in [("api", public_name), ("api-internal", &internal_name)] {
            if !fqdn(host).ends_with(&format!(".{}", fqdn(zone))) {
                return Err(CloudError::Spec(format!(
                    "{host} is not inside the DNS zone {zone} (spec.dns.zone)"
                )));
            }
            out.push(alias_record(rname, fqdn(host), "api"));
        }
    }

    for g in &cluster.groups {
        let ig_name = &g.name;
        let field = |f: &str| format!("instance group {ig_name}: spec.{f}");
        let GroupPlacement::Aws {
            machine_type: machine,
            image,
            subnets,
            ..
        } = &g.placement
        else {
            return Err(CloudError::Spec(format!(
                "{}: the group is not placed on AWS",
                field("subnets")
            )));
        };
        let image_id = match image {
            ImageRef::Id(id) => id.clone(),
            ImageRef::Name(n) => images.get(n).cloned().ok_or_else(|| {
                CloudError::Spec(format!("{}: no image named {n:?}", field("image")))
            })?,
        };
        let (min, max) = (g.size.min(), g.size.max());
        let key = role_key(g.role);
        let host_key = host_keys.get(ig_name.as_str());
        let boot = user_data(cluster, g, host_key);
        // The plan carries the user-data with the private key redacted; apply sends the
        // complete one (an input, never compared or printed).
        let template = LaunchTemplate {
            head: Head::owned(ig_name),
            template_name: format!("{ig_name}.{name}"),
            launch: Some(Launch {
                image_id,
                instance_type: machine.to_string(),
                key_name: Ref::named("main"),
                security_groups: vec![Ref::named(key)],
                instance_profile: Ref::named(key),
                user_data: hostkeys::redact(&boot),
                boot: host_key.map(|_| BootData(boot)),
                // IMDSv2 only, one hop: a pod (one more hop away, behind the node's network
                // namespace) cannot read the instance's user-data or role credentials.
                http_endpoint: "enabled".into(),
                http_tokens: "required".into(),
                hop_limit: 1,
            }),
            latest_version: None,
        };
        out.push(template.resource());
        let target_groups = match g.role {
            InstanceGroupRole::ControlPlane if has_lb => vec![Ref::named("api")],
            InstanceGroupRole::Bastion => vec![Ref::named("bastion")],
            _ => vec![],
        };
        let asg = AutoScalingGroup {
            head: Head::owned(ig_name),
            group_name: format!("{ig_name}.{name}"),
            launch_template: Ref::named(ig_name),
            launch_template_version: "$Latest".into(),
            min_size: min.into(),
            max_size: max.into(),
            desired_capacity: min.into(),
            subnets: subnets.iter().map(Ref::named).collect(),
            target_groups,
            role: g.role.as_str().into(),
        }
        .resource();
        // Instances must not boot before their subnets route to the internet (packages).
        let tables = if topology == TopologyType::Private && g.role != InstanceGroupRole::Bastion {
            &private_tables
        } else {
            &public_table
        };
        out.push(tables.iter().fold(asg, |r, t| r.depends_on(t.clone())));
    }
    Ok(out)
}

pub(crate) fn fqdn(s: &str) -> String {
    if s.ends_with('.') {
        s.to_string()
    } else {
        format!("{s}.")
    }
}

/// EC2's service principal carries the partition's DNS suffix: in aws-cn it is
/// `ec2.amazonaws.com.cn`, and a role trusting `ec2.amazonaws.com` there cannot be assumed
/// by the instances (their profile would hand out no credentials).
fn assume_role_policy(region: &str) -> String {
    let service = match crate::spec::defaults::partition_of_region(region) {
        "aws-cn" => "ec2.amazonaws.com.cn",
        _ => "ec2.amazonaws.com",
    };
    pretty(&json!({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": { "Service": service },
            "Action": "sts:AssumeRole"
        }]
    }))
}

/// The control plane's policy includes what the AWS cloud-controller-manager needs
/// (cloud-provider-aws's documented controller policy) plus volume management for the CSI
/// driver's controller; nodes and bastions get what kubelet and the ECR credential helper need.
fn role_policy(role: InstanceGroupRole) -> String {
    let actions: &[&str] = match role {
        InstanceGroupRole::ControlPlane => &[
            "autoscaling:DescribeAutoScalingGroups",
            "autoscaling:DescribeLaunchConfigurations",
            "autoscaling:DescribeTags",
            "ec2:AttachVolume",
            "ec2:AuthorizeSecurityGroupIngress",
            "ec2:CreateRoute",
            "ec2:CreateSecurityGroup",
            "ec2:CreateTags",
            "ec2:CreateVolume",
            "ec2:DeleteRoute",
            "ec2:DeleteSecurityGroup",
            "ec2:DeleteVolume",
            "ec2:DescribeAvailabilityZones",
            "ec2:DescribeInstances",
            "ec2:DescribeRegions",
            "ec2:DescribeRouteTables",
            "ec2:DescribeSecurityGroups",
            "ec2:DescribeSubnets",
            "ec2:DescribeVolumes",
            "ec2:DescribeVpcs",
            "ec2:DetachVolume",
            "ec2:ModifyInstanceAttribute",
            "ec2:ModifyVolume",
            "ec2:RevokeSecurityGroupIngress",
            "elasticloadbalancing:AddTags",
            "elasticloadbalancing:ApplySecurityGroupsToLoadBalancer",
            "elasticloadbalancing:AttachLoadBalancerToSubnets",
            "elasticloadbalancing:ConfigureHealthCheck",
            "elasticloadbalancing:CreateListener",
            "elasticloadbalancing:CreateLoadBalancer",
            "elasticloadbalancing:CreateLoadBalancerListeners",
            "elasticloadbalancing:CreateLoadBalancerPolicy",
            "elasticloadbalancing:CreateTargetGroup",
            "elasticloadbalancing:DeleteListener",
            "elasticloadbalancing:DeleteLoadBalancer",
            "elasticloadbalancing:DeleteLoadBalancerListeners",
            "elasticloadbalancing:DeleteTargetGroup",
            "elasticloadbalancing:DeregisterInstancesFromLoadBalancer",
            "elasticloadbalancing:DeregisterTargets",
            "elasticloadbalancing:DescribeListeners",
            "elasticloadbalancing:DescribeLoadBalancerAttributes",
            "elasticloadbalancing:DescribeLoadBalancerPolicies",
            "elasticloadbalancing:DescribeLoadBalancers",
            "elasticloadbalancing:DescribeTargetGroups",
            "elasticloadbalancing:DescribeTargetHealth",
            "elasticloadbalancing:DetachLoadBalancerFromSubnets",
            "elasticloadbalancing:ModifyListener",
            "elasticloadbalancing:ModifyLoadBalancerAttributes",
            "elasticloadbalancing:ModifyTargetGroup",
            "elasticloadbalancing:RegisterInstancesWithLoadBalancer",
            "elasticloadbalancing:RegisterTargets",
            "elasticloadbalancing:SetLoadBalancerPoliciesForBackendServer",
            "elasticloadbalancing:SetLoadBalancerPoliciesOfListener",
            "iam:CreateServiceLinkedRole",
            "kms:DescribeKey",
        ],
        InstanceGroupRole::Node => &[
            "ec2:DescribeInstances",
            "ec2:DescribeRegions",
            "ecr:BatchCheckLayerAvailability",
            "ecr:BatchGetImage",
            "ecr:DescribeRepositories",
            "ecr:GetAuthorizationToken",
            "ecr:GetDownloadUrlForLayer",
            "ecr:GetRepositoryPolicy",
            "ecr:ListImages",
        ],
        InstanceGroupRole::Bastion => &["ec2:DescribeRegions"],
    };
    pretty(&json!({
        "Version": "2012-10-17",
        "Statement": [{ "Effect": "Allow", "Action": actions, "Resource": "*" }]
    }))
}

/// Canonical JSON text (sorted keys, two-space indent) so documents compare as text and diff
/// line by line.
pub(super) fn pretty(v: &serde_json::Value) -> String {
    // why: serializing a JSON value cannot fail
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// What a group's user-data says about its host key before `update cluster --yes` generated it
/// (the preview never generates one).
pub(crate) const HOST_KEY_PENDING: &str = "<generated by update cluster --yes>";

/// The user-data of an instance group: only what kprov's SSH connection needs, in cloud-init's
/// own keys. The cluster's SSH public key is authorized for the default user, and the group's
/// host key pair (`ssh_keys`) replaces the keys sshd would generate, so kprov checks the very
/// first connection strictly. Everything else (packages, kubeadm) happens over SSH.
/// Values are JSON-quoted, which YAML reads as double-quoted scalars; the private key is a
/// literal block of base64 lines (checked by [`GroupHostKey::validate`]).
pub(crate) fn user_data(
    cluster: &ResolvedCluster,
    group: &ResolvedGroup,
    key: Option<&GroupHostKey>,
) -> String {
    // why: serializing a string cannot fail
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let authorized = cluster
        .aws()
        .and_then(|a| a.ssh_public_key.as_deref())
        .map(|k| format!("  - {}\n", q(k.trim())))
        // why: no SSH key: the spec check refused it before
        .unwrap_or_default();
    let keys = match key {
        Some(k) => {
            let block: String = k
                .private
                .trim_end()
                .lines()
                .map(|l| format!("    {l}\n"))
                .collect();
            format!(
                "  ed25519_private: |\n{block}  ed25519_public: {}\n",
                q(&k.public)
            )
        }
        None => format!(
            "  ed25519_private: {}\n  ed25519_public: {}\n",
            q(HOST_KEY_PENDING),
            q(HOST_KEY_PENDING)
        ),
    };
    format!(
        "#cloud-config\n\
         # kprov: instance group {ig} of cluster {c}. Only SSH access: kprov provisions the\n\
         # instance over SSH and checks its host key against the key below.\n\
         ssh_authorized_keys:\n{authorized}\
         ssh_deletekeys: true\n\
         ssh_genkeytypes: []\n\
         ssh_keys:\n{keys}",
        ig = group.name,
        c = cluster.name,
    )
}

/// A network load balancer forwarding one TCP port to a target group (the API, the bastion).
struct TcpLoadBalancer<'a> {
    id: &'a str,
    lb_name: String,
    scheme: &'a str,
    subnets: Vec<&'a str>,
    security_group: &'a str,
    tg_name: String,
    port: i64,
    vpc: Ref<Vpc>,
    /// Whether the target group preserves the client's IP (AWS's default for instance
    /// targets).
    preserve_client_ip: bool,
}

/// How long a target group drains a deregistered target: AWS's default is 300 s, which every
/// control-plane or bastion termination (a roll, `delete instance`, a forced group delete)
/// would wait out before the instance goes; the API's and SSH's clients reconnect anyway.
pub(super) const DEREGISTRATION_DELAY_SECONDS: i64 = 30;

fn push_tcp_load_balancer(out: &mut Vec<Resource>, lb: TcpLoadBalancer<'_>) {
    out.push(
        LoadBalancer {
            head: Head::owned(lb.id),
            lb_name: lb.lb_name,
            scheme: lb.scheme.to_string(),
            subnets: lb.subnets.into_iter().map(Ref::named).collect(),
            security_groups: vec![Ref::named(lb.security_group)],
            dns_name: None,
            canonical_zone: None,
        }
        .resource(),
    );
    out.push(
        TargetGroup {
            head: Head::owned(lb.id),
            tg_name: lb.tg_name,
            port: lb.port,
            protocol: "TCP".into(),
            vpc: lb.vpc,
            preserve_client_ip: lb.preserve_client_ip,
            deregistration_delay: DEREGISTRATION_DELAY_SECONDS,
        }
        .resource(),
    );
    out.push(
        Listener {
            head: Head::owned(lb.id),
            load_balancer: Ref::named(lb.id),
            port: lb.port,
            protocol: "TCP".into(),
            target_group: Ref::named(lb.id),
        }
        .resource(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::aws::kinds::*;
    use crate::cloud::engine::{Value, topo_order};
    use crate::spec::{Cluster, InstanceGroup};
    use proptest::prelude::*;

    fn cluster(private: bool, extra: &str) -> Cluster {
        let subnets = if private {
            "    - {name: a, zone: us-east-1a, cidr: 172.20.32.0/19, type: Private}
    - {name: ua, zone: us-east-1a, cidr: 172.20.0.0/22, type: Utility}
    - {name: b, zone: us-east-1b, cidr: 172.20.64.0/19, type: Private}
    - {name: ub, zone: us-east-1b, cidr: 172.20.4.0/22, type: Utility}"
        } else {
            "    - {name: a, zone: us-east-1a, cidr: 172.20.32.0/19, type: Public}"
        };
        let topology = if private { "Private" } else { "Public" };
        let yaml = format!(
            "apiVersion: kprov.dev/v1alpha1
kind: Cluster
metadata: {{name: c.example.com}}
spec:
  cloudProvider: aws
  region: us-east-1
  kubernetesVersion: {version}
  networking:
    networkCIDR: 172.20.0.0/16
    subnets:
{subnets}
  topology: {{type: {topology}}}
  dns: {{type: Public, zone: example.com}}
  api: {{loadBalancer: {{type: Public}}}}
  etcd: {{type: Stacked}}
{extra}",
            version = crate::spec::versions::DEFAULT_KUBERNETES_VERSION
        );
        serde_saphyr::from_str(&yaml).unwrap()
    }

    const KEY: &str = "  sshKey: {publicKey: ssh-ed25519 AAAA k}\n";

    /// A control plane has a fixed size (one); other groups 1 to 2.
    fn ig(name: &str, role: &str, rest: &str) -> InstanceGroup {
        let max = if role == "ControlPlane" { 1 } else { 2 };
        serde_saphyr::from_str(&format!(
            "apiVersion: kprov.dev/v1alpha1
kind: InstanceGroup
metadata: {{name: {name}}}
spec: {{role: {role}, machineType: t3.medium, image: ami-1, minSize: 1, maxSize: {max}{rest}}}
"
        ))
        .unwrap()
    }

    /// The cloud model of the objects as `spec::resolve` gives it; a spec it refuses is an
    /// error like the model's own.
    fn model(
        c: &Cluster,
        igs: &[InstanceGroup],
        images: &BTreeMap<String, String>,
        keys: &BTreeMap<String, GroupHostKey>,
    ) -> Result<Vec<Resource>, CloudError> {
        desired(&resolved(c, igs)?, images, keys)
    }

    /// Resolved with a well-formed stand-in for the tests' short key (`spec::validate` checks
    /// its form), then the key as written put back: the goldens keep their text.
    fn resolved(c: &Cluster, igs: &[InstanceGroup]) -> Result<ResolvedCluster, CloudError> {
        let written = c.spec.ssh_key.as_ref().and_then(|k| k.public_key.clone());
        let mut valid = c.clone();
        if let Some(k) = valid.spec.ssh_key.as_mut() {
            k.public_key = Some("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIStandIn k".into());
        }
        let mut r =
            crate::spec::resolve(&valid, igs).map_err(|e| CloudError::Spec(e.to_string()))?;
        if let crate::spec::resolve::Platform::Aws(a) = &mut r.platform {
            a.ssh_public_key = written;
        }
        Ok(r)
    }

    fn err(c: &Cluster, igs: &[InstanceGroup]) -> String {
        model(c, igs, &BTreeMap::new(), &BTreeMap::new())
            .unwrap_err()
            .to_string()
    }

    fn ingress(rs: &[Resource], group: &str) -> Vec<String> {
        rs.iter()
            .find(|r| r.id == ResourceId::new(SECURITY_GROUP_RULES, group))
            .and_then(|r| r.get("ingress"))
            .map(Value::as_list)
            // why: an absent list field is an empty list
            .unwrap_or_default()
            .iter()
            .map(|v| v.to_string())
            .collect()
    }

    /// The instances' role trusts EC2 under the partition's own name: `ec2.amazonaws.com.cn`
    /// in China, where the commercial name would leave the instance profile without credentials.
    #[test]
    fn the_role_trusts_ec2_under_the_partitions_name() {
        let trust = |region: &str| {
            let mut c = cluster(false, KEY);
            c.spec.region = Some(region.into());
            c.spec.networking.subnets[0].zone = format!("{region}a");
            let rs = model(
                &c,
                &[ig("cp", "ControlPlane", ""), ig("n", "Node", "")],
                &BTreeMap::new(),
                &BTreeMap::new(),
            )
            .unwrap();
            let role = rs
                .iter()
                .find(|r| r.id.kind == IAM_ROLE)
                .and_then(|r| match r.get("assumeRolePolicy") {
                    Some(Value::Doc(d)) => Some(d.clone()),
                    _ => None,
                })
                .unwrap();
            let doc: serde_json::Value = serde_json::from_str(&role).unwrap();
            doc["Statement"][0]["Principal"]["Service"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(trust("us-east-1"), "ec2.amazonaws.com");
        assert_eq!(trust("us-gov-west-1"), "ec2.amazonaws.com");
        assert_eq!(trust("cn-north-1"), "ec2.amazonaws.com.cn");
    }

    /// spec.sshAccess and spec.kubernetesApiAccess replace 0.0.0.0/0 as the sources of SSH
    /// (public topology, and the bastion) and of the API; a narrowed API list still admits
    /// the cluster's own instances at the load balancer.
    #[test]
    fn access_lists_narrow_ssh_and_the_api() {
        let open = model(
            &cluster(false, KEY),
            &[ig("cp", "ControlPlane", ""), ig("n", "Node", "")],
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .unwrap();
        assert!(
            ingress(&open, "nodes")
                .iter()
                .any(|r| r.contains("0.0.0.0/0"))
        );
        assert!(
            ingress(&open, "api-lb")
                .iter()
                .any(|r| r.contains("0.0.0.0/0"))
        );
        let extra = format!(
            "{KEY}  sshAccess: [203.0.113.0/24, 198.51.100.7/32]\n  kubernetesApiAccess: [192.0.2.0/24]\n"
        );
        let rs = model(
            &cluster(false, &extra),
            &[ig("cp", "ControlPlane", ""), ig("n", "Node", "")],
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .unwrap();
        for g in ["control-plane", "nodes", "api-lb"] {
            assert!(
                !ingress(&rs, g).iter().any(|r| r.contains("0.0.0.0/0")),
                "{g}: {:?}",
                ingress(&rs, g)
            );
        }
        let nodes = ingress(&rs, "nodes").join(" ");
        assert!(
            nodes.contains("203.0.113.0/24") && nodes.contains("198.51.100.7/32"),
            "{nodes}"
        );
        let lb = ingress(&rs, "api-lb").join(" ");
        assert!(lb.contains("192.0.2.0/24"), "{lb}");
        assert!(
            lb.contains("SecurityGroup/nodes") && lb.contains("SecurityGroup/control-plane"),
            "{lb}"
        );
        // With a bastion, only the bastion admits the SSH list; the rest admit the bastion.
        let rs = model(
            &cluster(true, &extra),
            &[
                ig("cp", "ControlPlane", ", subnets: [a]"),
                ig("n", "Node", ", subnets: [a]"),
                ig("b", "Bastion", ", subnets: [ua]"),
            ],
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .unwrap();
        let bastion = ingress(&rs, "bastion").join(" ");
        assert!(
            bastion.contains("203.0.113.0/24") && !bastion.contains("0.0.0.0/0"),
            "{bastion}"
        );
        assert!(!ingress(&rs, "nodes").join(" ").contains("203.0.113.0/24"));
    }

    /// IAM names are `KEY.CLUSTER` while that fits 64 characters (existing clusters keep
    /// theirs) and a hashed prefix beyond, unique per cluster name.
    #[test]
    fn iam_names_fit_aws() {
        assert_eq!(iam_name("nodes", "c.example.com"), "nodes.c.example.com");
        let a = format!("{}.example.com", "a".repeat(80));
        let b = format!("{}.example.org", "a".repeat(80));
        for k in ["control-plane", "nodes", "bastion"] {
            let n = iam_name(k, &a);
            assert!(n.len() <= IAM_NAME_MAX && n.starts_with(k), "{n}");
            assert_ne!(n, iam_name(k, &b));
        }
        // The longest cluster and group names validation allows (63 each): every name and
        // tag key kprov derives fits AWS's limits.
        let cluster = format!("{}.example.com", "a".repeat(51));
        let group = "g".repeat(63);
        let rs = model(
            &cluster_named(&cluster),
            &[ig("cp", "ControlPlane", ""), ig(&group, "Node", "")],
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .unwrap();
        let limits = [
            (IAM_ROLE, "roleName", IAM_NAME_MAX),
            (INSTANCE_PROFILE, "profileName", 128),
            (LAUNCH_TEMPLATE, "templateName", 128),
            (AUTOSCALING_GROUP, "groupName", 255),
            (SECURITY_GROUP, "groupName", 255),
        ];
        for (kind, field, max) in limits {
            let names: Vec<_> = rs
                .iter()
                .filter(|r| r.id.kind == kind)
                .map(|r| r.get_str(field).unwrap().to_string())
                .collect();
            assert!(!names.is_empty(), "{kind}");
            for n in names {
                assert!(n.len() <= max, "{kind} {field} {n} ({} > {max})", n.len());
            }
        }
        assert!(super::super::owned_tag_key(&cluster).len() <= 128);
    }

    fn cluster_named(name: &str) -> Cluster {
        let mut c = cluster(false, KEY);
        c.metadata.name = name.to_string();
        c
    }

    /// The port API clients use (`instances::api_port`, behind every kubeconfig kprov
    /// stores or exports) is the one the API load balancer's listener declares, and the
    /// rules admit exactly that port.
    #[test]
    fn api_clients_use_the_listener_port() {
        let igs = [ig("cp", "ControlPlane", ""), ig("nodes", "Node", "")];
        let c = cluster(false, KEY);
        let rs = model(&c, &igs, &BTreeMap::new(), &BTreeMap::new()).unwrap();
        let set: BTreeMap<_, _> = rs.into_iter().map(|r| (r.id.clone(), r)).collect();
        let port = super::super::instances::api_port();
        let listener = &set[&ResourceId::new(LISTENER, "api")];
        assert_eq!(listener.get("port"), Some(&Value::Int(i64::from(port))));
        let tg = &set[&ResourceId::new(TARGET_GROUP, "api")];
        assert_eq!(tg.get("port"), Some(&Value::Int(i64::from(port))));
        assert_eq!(
            super::super::instances::api_server_url(&c).as_deref(),
            Some(format!("https://api.c.example.com:{port}").as_str())
        );
    }

    #[test]
    fn models_are_ordered_and_complete() {
        for private in [false, true] {
            let igs = [
                ig("cp", "ControlPlane", ""),
                ig("nodes", "Node", ""),
                ig("bastion", "Bastion", ""),
            ];
            let rs = model(
                &cluster(private, KEY),
                &igs,
                &BTreeMap::new(),
                &BTreeMap::new(),
            )
            .unwrap();
            let set: BTreeMap<_, _> = rs.into_iter().map(|r| (r.id.clone(), r)).collect();
            // Every reference resolves and there is no cycle.
            let order = topo_order(&set).unwrap();
            let pos = |k: crate::cloud::engine::Kind, n: &str| {
                order.iter().position(|i| *i == ResourceId::new(k, n))
            };
            let asg = pos(AUTOSCALING_GROUP, "nodes").unwrap();
            if private {
                assert!(pos(ROUTE_TABLE, "private-us-east-1a").unwrap() < asg);
                assert!(pos(NAT_GATEWAY, "us-east-1b").is_some());
            } else {
                assert!(pos(ROUTE_TABLE, "public").unwrap() < asg);
                assert!(pos(NAT_GATEWAY, "us-east-1a").is_none());
            }
            let nodes = &set[&ResourceId::new(AUTOSCALING_GROUP, "nodes")];
            // Nodes go to the Private subnets in private topology (never a Utility one), to
            // the Public ones otherwise.
            let placed = nodes.get("subnets").unwrap().as_list();
            assert!(placed.contains(&Value::reference(SUBNET, "a")));
            assert_eq!(placed.len(), if private { 2 } else { 1 });
            assert!(!placed.contains(&Value::reference(SUBNET, "ua")));
            let bastion = &set[&ResourceId::new(AUTOSCALING_GROUP, "bastion")];
            let bastion_subnet = if private { "ua" } else { "a" };
            assert!(
                bastion
                    .get("subnets")
                    .unwrap()
                    .as_list()
                    .contains(&Value::reference(SUBNET, bastion_subnet))
            );
        }
    }

    #[test]
    fn bad_specs_get_errors_naming_the_field() {
        let igs = [ig("cp", "ControlPlane", "")];
        assert!(
            err(&cluster(false, ""), &igs)
                .contains("spec.sshKey.publicKey is not set: instances need an SSH key")
        );

        let mut c = cluster(true, KEY);
        c.spec.networking.subnets.retain(|s| s.name != "ub");
        assert!(
            err(&c, &igs).contains("zone us-east-1b has a Private subnet but no Utility subnet")
        );

        let c = cluster(false, KEY);
        // What the spec's rules refuse is said by `spec::resolve`, naming group and field.
        let bad = [ig("cp", "ControlPlane", ", subnets: [nope]")];
        assert!(
            err(&c, &bad).contains("InstanceGroup cp: unknown subnet \"nope\""),
            "{}",
            err(&c, &bad)
        );
        let mut big = ig("n", "Node", "");
        big.spec.min_size = Some(3);
        assert!(
            err(&c, &[ig("cp", "ControlPlane", ""), big])
                .contains("spec.minSize: InstanceGroup n: minSize 3 is larger than maxSize 2"),
            "{}",
            err(&c, &[ig("cp", "ControlPlane", ""), ig("n", "Node", "")])
        );
        let mut named = ig("cp", "ControlPlane", "");
        named.spec.image = Some("ubuntu/noble".into());
        assert!(
            err(&c, &[named])
                .contains("instance group cp: spec.image: no image named \"ubuntu/noble\"")
        );
        let twice = [ig("cp", "ControlPlane", ""), ig("cp", "Node", "")];
        assert!(
            err(&c, &twice).contains("duplicate instance group name \"cp\""),
            "{}",
            err(&c, &twice)
        );
        let mut outside = cluster(false, KEY);
        outside.spec.api.as_mut().unwrap().public_name = Some("api.elsewhere.org".into());
        assert!(
            err(&outside, &igs)
                .contains("api.elsewhere.org is not inside the DNS zone example.com")
        );
    }

    /// The complete user-data (what cloud-init reads, what the harness reads host keys from)
    /// and the redacted text a plan shows.
    #[test]
    fn user_data_is_only_ssh_access() {
        let c = cluster(false, KEY);
        let k = crate::cloud::aws::hostkeys::tests::test_key();
        let nodes = [ig("cp", "ControlPlane", ""), ig("nodes", "Node", "")];
        let r = resolved(&c, &nodes).unwrap();
        let full = user_data(&r, r.group("nodes").unwrap(), Some(&k));
        insta::assert_snapshot!("user_data_nodes", full);
        assert!(!full.contains("kprov-node") && !full.contains("runcmd"));
        // cloud-init's own format, as a YAML reader sees it.
        let doc: serde_json::Value = serde_saphyr::from_str(&full).unwrap();
        assert_eq!(doc["ssh_keys"]["ed25519_private"], k.private.as_str());
        assert_eq!(doc["ssh_keys"]["ed25519_public"], k.public.as_str());
        assert_eq!(doc["ssh_authorized_keys"][0], "ssh-ed25519 AAAA k");

        let rs = model(
            &c,
            &nodes,
            &BTreeMap::new(),
            &BTreeMap::from([("nodes".to_string(), k.clone())]),
        )
        .unwrap();
        let lt = rs
            .iter()
            .find(|r| r.id == ResourceId::new(LAUNCH_TEMPLATE, "nodes"))
            .unwrap();
        let shown = lt.get("userData").and_then(Value::as_str).unwrap();
        assert!(!shown.contains("PRIVATE KEY") && !shown.contains("b3BlbnNzaC1rZXkt"));
        insta::assert_snapshot!("user_data_nodes_redacted", shown);
        assert_eq!(lt.inputs["userData"], full, "apply sends the complete text");

        // Before --yes generated a key: pending, and nothing apply could send.
        let rs = model(&c, &nodes, &BTreeMap::new(), &BTreeMap::new()).unwrap();
        let lt = rs
            .iter()
            .find(|r| r.id == ResourceId::new(LAUNCH_TEMPLATE, "nodes"))
            .unwrap();
        assert!(lt.get_str("userData").unwrap().contains(HOST_KEY_PENDING));
        assert!(!lt.inputs.contains_key("userData"));
    }

    proptest! {
        /// Load balancer and target group names: AWS allows 32 characters of [A-Za-z0-9-], no
        /// leading or trailing hyphen; distinct clusters get distinct names.
        #[test]
        fn short_names_are_valid(a in "[a-z0-9.-]{1,80}", b in "[a-z0-9.-]{1,80}") {
            let n = short_name("api", &a);
            prop_assert!(n.len() <= 32, "{}", n);
            prop_assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
            prop_assert!(!n.ends_with('-'));
            prop_assert_eq!(&n, &short_name("api", &a));
            if a != b {
                prop_assert_ne!(n, short_name("api", &b));
            }
        }
    }
}
