//! Filling in defaults: the user's spec plus deterministic defaults gives the *completed*
//! spec (`cluster-completed.spec` in the store). What the user wrote always wins: defaults only
//! fill fields that are absent.

use std::collections::BTreeMap;

use super::types::*;

/// `spec.networking.networkCIDR` on AWS when absent: the VPC's range, as kops.
pub const DEFAULT_NETWORK_CIDR: &str = "172.20.0.0/16";
/// kops's defaults, chosen outside RFC 1918 so they rarely collide with existing networks.
pub const DEFAULT_POD_CIDR: &str = "100.96.0.0/11";
/// `spec.networking.serviceCIDR` when absent (kops's default, outside RFC 1918).
pub const DEFAULT_SERVICE_CIDR: &str = "100.64.0.0/13";
/// An AWS instance group's `spec.machineType` when absent (bastions excepted).
pub const DEFAULT_AWS_MACHINE_TYPE: &str = "t3.medium";
/// A Bastion group's `spec.machineType` when absent.
pub const DEFAULT_AWS_BASTION_MACHINE_TYPE: &str = "t3.micro";
/// Canonical's Ubuntu 24.04 LTS image, by owner and name pattern (resolved at update time),
/// in the commercial partition; see [`default_aws_image`] for the others.
pub const DEFAULT_AWS_IMAGE: &str =
    "099720109477/ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*";

/// The AWS partition of a region: accounts, image owners and ARNs differ between them.
pub fn partition_of_region(region: &str) -> &'static str {
    if region.starts_with("cn-") {
        "aws-cn"
    } else if region.starts_with("us-gov-") {
        "aws-us-gov"
    } else {
        "aws"
    }
}

/// The default image for a region: Canonical publishes Ubuntu from a different account in
/// each partition (099720109477 commercial, 837727238323 China, 513442679011 GovCloud, as
/// Canonical's "Find Ubuntu images on AWS" lists them), so the commercial owner would find
/// nothing in aws-cn or aws-us-gov.
pub fn default_aws_image(region: Option<&str>) -> String {
    let owner = match region.map(partition_of_region) {
        Some("aws-cn") => "837727238323",
        Some("aws-us-gov") => "513442679011",
        _ => return DEFAULT_AWS_IMAGE.to_string(),
    };
    let pattern = DEFAULT_AWS_IMAGE
        .split_once('/')
        .map_or(DEFAULT_AWS_IMAGE, |(_, p)| p);
    format!("{owner}/{pattern}")
}

/// The AWS region a zone belongs to (`us-east-1a` → `us-east-1`; local zones
/// `us-west-2-lax-1a` → `us-west-2`).
pub fn region_of_zone(zone: &str) -> Option<String> {
    // GovCloud's regions have one more label: `us-gov-west-1a` → `us-gov-west-1`.
    let (head, rest) = match zone.strip_prefix("us-gov-") {
        Some(rest) => ("us-gov-", rest),
        None => ("", zone),
    };
    let parts: Vec<&str> = rest.split('-').collect();
    let (first, second, third) = if head.is_empty() {
        if parts.len() < 3 {
            return None;
        }
        (Some(parts[0]), parts[1], parts[2])
    } else {
        if parts.len() < 2 {
            return None;
        }
        (None, parts[0], parts[1])
    };
    let digits: String = third.chars().take_while(|c| c.is_ascii_digit()).collect();
    if digits.is_empty() {
        return None;
    }
    Some(match first {
        Some(first) => format!("{first}-{second}-{digits}"),
        None => format!("{head}{second}-{digits}"),
    })
}

/// The DNS zone a cluster name implies: everything after the first label.
pub fn parent_zone(name: &str) -> Option<&str> {
    name.split_once('.')
        .map(|(_, rest)| rest)
        .filter(|z| z.contains('.') || !z.is_empty())
}

/// Gossip-style names (`*.k8s.local`) have no DNS zone, as in kops.
pub fn is_gossip_name(name: &str) -> bool {
    name.ends_with(".k8s.local")
}

/// The Cluster with every absent default filled in (what the user wrote is kept).
pub fn complete_cluster(c: &Cluster) -> Cluster {
    let mut c = c.clone();
    let name = c.metadata.name.clone();
    let s = &mut c.spec;
    let aws = s.cloud_provider == CloudProvider::Aws;

    if s.kubernetes_version.is_none() {
        s.kubernetes_version = Some(super::versions::DEFAULT_KUBERNETES_VERSION.to_string());
    }
    if aws && s.region.is_none() {
        s.region = s
            .networking
            .subnets
            .first()
            .and_then(|sn| region_of_zone(&sn.zone));
    }
    let n = &mut s.networking;
    if aws && n.network_cidr.is_none() {
        n.network_cidr = Some(DEFAULT_NETWORK_CIDR.into());
    }
    n.pod_cidr.get_or_insert_with(|| DEFAULT_POD_CIDR.into());
    n.service_cidr
        .get_or_insert_with(|| DEFAULT_SERVICE_CIDR.into());
    n.cni.get_or_insert(Cni::Calico);

    if aws {
        s.topology.get_or_insert(Topology {
            kind: TopologyType::Public,
            bastion: None,
            ssh_address: None,
        });
    }
    if let Some(b) = s.topology.as_mut().and_then(|t| t.bastion.as_mut()) {
        b.public_name
            .get_or_insert_with(|| format!("bastion.{name}"));
    }
    if s.dns.is_none() {
        s.dns = Some(if aws && !is_gossip_name(&name) {
            Dns {
                kind: DnsType::Public,
                zone: parent_zone(&name).map(str::to_string),
            }
        } else {
            Dns {
                kind: DnsType::None,
                zone: None,
            }
        });
    }
    let api = s.api.get_or_insert_with(Api::default);
    if api.load_balancer.is_none() {
        // On metal a local proxy on every node fronts the API servers instead of a cloud LB.
        let kind = if aws {
            LoadBalancerType::Public
        } else {
            LoadBalancerType::None
        };
        api.load_balancer = Some(LoadBalancer { kind });
    }
    if aws && api.public_name.is_none() {
        api.public_name = Some(format!("api.{name}"));
    }
    s.etcd.get_or_insert(Etcd {
        kind: EtcdType::Stacked,
    });
    if aws {
        let ccm = s
            .cloud_controller_manager
            .get_or_insert_with(CloudControllerManager::default);
        ccm.provider.get_or_insert_with(|| "aws".into());
    }
    let key = s.ssh_key.get_or_insert_with(SshKey::default);
    key.name.get_or_insert_with(|| format!("kprov-{name}"));
    s.assets.get_or_insert_with(Assets::default);
    for h in &mut s.hosts {
        h.user.get_or_insert_with(|| "root".into());
        h.port.get_or_insert(22);
    }
    c
}

/// The InstanceGroup with every absent default filled in, from the completed cluster `c`
/// (metal sizes come from the hosts only in [`complete`]).
pub fn complete_instance_group(c: &Cluster, ig: &InstanceGroup) -> InstanceGroup {
    let mut ig = ig.clone();
    ig.metadata
        .labels
        .entry(CLUSTER_LABEL.into())
        .or_insert_with(|| c.metadata.name.clone());
    let s = &mut ig.spec;
    let aws = c.spec.cloud_provider == CloudProvider::Aws;
    if aws {
        s.machine_type.get_or_insert_with(|| {
            if s.role == InstanceGroupRole::Bastion {
                DEFAULT_AWS_BASTION_MACHINE_TYPE
            } else {
                DEFAULT_AWS_MACHINE_TYPE
            }
            .into()
        });
        if s.image.is_none() {
            let region = c.spec.region.clone().or_else(|| {
                c.spec
                    .networking
                    .subnets
                    .first()
                    .and_then(|sn| region_of_zone(&sn.zone))
            });
            s.image = Some(default_aws_image(region.as_deref()));
        }
        if s.subnets.is_empty() {
            s.subnets = default_subnets_for(c, s.role);
        }
    }
    let min = *s.min_size.get_or_insert(1);
    s.max_size.get_or_insert(min);
    if s.rolling_update.is_none() {
        // Control planes are replaced one at a time without surge (etcd quorum); nodes surge
        // first so capacity never drops.
        s.rolling_update = Some(match s.role {
            InstanceGroupRole::ControlPlane => RollingUpdate {
                max_surge: Some(IntOrPercent::Int(0)),
                max_unavailable: Some(IntOrPercent::Int(1)),
            },
            _ => RollingUpdate {
                max_surge: Some(IntOrPercent::Int(1)),
                max_unavailable: Some(IntOrPercent::Int(0)),
            },
        });
    }
    ig
}

fn default_subnets_for(c: &Cluster, role: InstanceGroupRole) -> Vec<String> {
    let private = c
        .spec
        .topology
        .as_ref()
        .is_some_and(|t| t.kind == TopologyType::Private);
    let want = match (role, private) {
        (InstanceGroupRole::Bastion, true) => SubnetType::Utility,
        (_, true) => SubnetType::Private,
        (_, false) => SubnetType::Public,
    };
    c.spec
        .networking
        .subnets
        .iter()
        .filter(|s| s.kind == want)
        .map(|s| s.name.clone())
        .collect()
}

/// Completes a cluster and its groups together (groups depend on the completed cluster).
pub fn complete(c: &Cluster, igs: &[InstanceGroup]) -> (Cluster, Vec<InstanceGroup>) {
    let cluster = complete_cluster(c);
    let mut groups: Vec<InstanceGroup> = igs
        .iter()
        .map(|g| complete_instance_group(&cluster, g))
        .collect();
    if cluster.spec.cloud_provider == CloudProvider::Metal {
        metal_sizes_from_hosts(&cluster, &mut groups);
    }
    (cluster, groups)
}

/// On metal the hosts are the machines: a group's size is the number of hosts of its role,
/// whatever `create` wrote when the inventory was first read (hosts added with `update
/// --inventory` or `replace`, removed with `delete instance`). Every host goes to the first
/// group of its role, as the roll places it (`ops::rolling::inputs`); etcd-only hosts are in
/// no group.
fn metal_sizes_from_hosts(cluster: &Cluster, groups: &mut [InstanceGroup]) {
    let count = |role: InstanceGroupRole| -> u32 {
        let n = cluster
            .spec
            .hosts
            .iter()
            .filter(|h| h.in_group_of(role))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    };
    let mut seen = Vec::new();
    for g in groups.iter_mut() {
        let role = g.spec.role;
        let n = if seen.contains(&role) { 0 } else { count(role) };
        seen.push(role);
        g.spec.min_size = Some(n);
        g.spec.max_size = Some(n);
    }
}

/// A new InstanceGroup object for `cluster`.
pub fn new_instance_group(cluster: &str, name: &str, spec: InstanceGroupSpec) -> InstanceGroup {
    InstanceGroup {
        api_version: API_VERSION.into(),
        kind: KIND_INSTANCE_GROUP.into(),
        metadata: ObjectMeta {
            name: name.into(),
            labels: BTreeMap::from([(CLUSTER_LABEL.into(), cluster.into())]),
            annotations: BTreeMap::new(),
        },
        spec,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aws_cluster() -> Cluster {
        serde_saphyr::from_str(
            "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: demo.example.com\nspec:\n  cloudProvider: aws\n  networking:\n    subnets:\n    - {name: us-east-1a, zone: us-east-1a, cidr: 172.20.32.0/19, type: Public}\n",
        )
        .unwrap()
    }

    /// Canonical publishes Ubuntu from another account in China and GovCloud: the default
    /// image of a cluster there names that partition's owner (issue 23, item 11).
    #[test]
    fn default_image_owner_follows_the_partition() {
        for (zone, owner) in [
            ("us-east-1a", "099720109477"),
            ("eu-central-1b", "099720109477"),
            ("cn-north-1a", "837727238323"),
            ("us-gov-west-1a", "513442679011"),
        ] {
            let mut c = aws_cluster();
            c.spec.networking.subnets[0].zone = zone.into();
            c.spec.region = None;
            let c = complete_cluster(&c);
            let ig: InstanceGroup = serde_saphyr::from_str(
                "apiVersion: kprov.dev/v1alpha1\nkind: InstanceGroup\nmetadata:\n  name: nodes\nspec:\n  role: Node\n",
            )
            .unwrap();
            let image = complete_instance_group(&c, &ig).spec.image.unwrap();
            assert_eq!(
                image,
                format!("{owner}/ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"),
                "{zone}"
            );
        }
        assert_eq!(partition_of_region("us-gov-east-1"), "aws-us-gov");
        assert_eq!(partition_of_region("cn-northwest-1"), "aws-cn");
        assert_eq!(partition_of_region("ap-south-2"), "aws");
    }

    #[test]
    fn region_from_zone() {
        for (zone, region) in [
            ("us-east-1a", Some("us-east-1")),
            ("eu-central-1c", Some("eu-central-1")),
            ("us-west-2-lax-1a", Some("us-west-2")),
            ("us-gov-west-1a", Some("us-gov-west-1")),
            ("cn-northwest-1b", Some("cn-northwest-1")),
            ("us-gov-x", None),
            ("nonsense", None),
            ("a-b-c", None),
        ] {
            assert_eq!(region_of_zone(zone).as_deref(), region, "{zone}");
        }
    }

    #[test]
    fn aws_defaults_are_filled() {
        let c = complete_cluster(&aws_cluster());
        let s = &c.spec;
        assert_eq!(s.region.as_deref(), Some("us-east-1"));
        assert_eq!(
            s.networking.network_cidr.as_deref(),
            Some(DEFAULT_NETWORK_CIDR)
        );
        assert_eq!(s.networking.pod_cidr.as_deref(), Some(DEFAULT_POD_CIDR));
        assert_eq!(
            s.dns,
            Some(Dns {
                kind: DnsType::Public,
                zone: Some("example.com".into())
            })
        );
        assert_eq!(
            s.api.as_ref().and_then(|a| a.public_name.as_deref()),
            Some("api.demo.example.com")
        );
        assert_eq!(c.external_cloud_provider(), Some("aws"));
        assert_eq!(
            s.etcd,
            Some(Etcd {
                kind: EtcdType::Stacked
            })
        );
    }

    #[test]
    fn metal_group_sizes_follow_the_hosts() {
        let c: Cluster = serde_saphyr::from_str(
            "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: lab\nspec:\n  cloudProvider: metal\n  hosts:\n  - {name: cp1, address: 198.18.0.11, roles: [control-plane, etcd]}\n  - {name: w1, address: 198.18.0.12, roles: [node]}\n  - {name: w2, address: 198.18.0.13, roles: [node]}\n  - {name: e1, address: 198.18.0.14, roles: [etcd]}\n",
        )
        .unwrap();
        let group = |name: &str, yaml: &str| {
            new_instance_group("lab", name, serde_saphyr::from_str(yaml).unwrap())
        };
        // As `create` wrote them for an inventory of 1 worker, before 2 more hosts came.
        let igs = [
            group(
                "control-plane",
                "role: ControlPlane\nminSize: 1\nmaxSize: 1\n",
            ),
            group("nodes", "role: Node\nminSize: 1\nmaxSize: 1\n"),
            group("more-nodes", "role: Node\nminSize: 7\nmaxSize: 7\n"),
        ];
        let (_, done) = complete(&c, &igs);
        let sizes: Vec<(Option<u32>, Option<u32>)> = done
            .iter()
            .map(|g| (g.spec.min_size, g.spec.max_size))
            .collect();
        assert_eq!(
            sizes,
            [(Some(1), Some(1)), (Some(2), Some(2)), (Some(0), Some(0))]
        );
        assert_eq!(total_min_size(&done, InstanceGroupRole::Node), 2);
    }

    #[test]
    fn user_values_win() {
        let mut c = aws_cluster();
        c.spec.networking.pod_cidr = Some("10.200.0.0/16".into());
        c.spec.kubernetes_version = Some("1.2.3".into());
        c.spec.dns = Some(Dns {
            kind: DnsType::Private,
            zone: Some("internal.".into()),
        });
        let done = complete_cluster(&c);
        assert_eq!(
            done.spec.networking.pod_cidr.as_deref(),
            Some("10.200.0.0/16")
        );
        assert_eq!(done.spec.kubernetes_version.as_deref(), Some("1.2.3"));
        assert_eq!(done.spec.dns, c.spec.dns);
    }

    #[test]
    fn completion_is_deterministic_and_idempotent() {
        let once = complete_cluster(&aws_cluster());
        assert_eq!(complete_cluster(&once), once);
        let ig = new_instance_group(
            "demo.example.com",
            "nodes",
            InstanceGroupSpec {
                role: InstanceGroupRole::Node,
                machine_type: None,
                image: None,
                min_size: Some(2),
                max_size: None,
                subnets: vec![],
                rolling_update: None,
                node_labels: Default::default(),
                taints: vec![],
                ssh_user: None,
            },
        );
        let g1 = complete_instance_group(&once, &ig);
        assert_eq!(complete_instance_group(&once, &g1), g1);
        assert_eq!(g1.spec.max_size, Some(2));
        assert_eq!(g1.spec.subnets, vec!["us-east-1a".to_string()]);
    }

    #[test]
    fn metal_gets_no_cloud_defaults() {
        let c: Cluster = serde_saphyr::from_str("apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: lab.local\nspec:\n  cloudProvider: metal\n").unwrap();
        let done = complete_cluster(&c);
        assert_eq!(done.spec.region, None);
        assert_eq!(done.spec.networking.network_cidr, None);
        assert_eq!(done.external_cloud_provider(), None);
        assert_eq!(done.spec.dns.as_ref().map(|d| d.kind), Some(DnsType::None));
    }
}
