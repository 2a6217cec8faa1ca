//! `kprov create cluster NAME ...`: turns kops-like flags into a Cluster and its InstanceGroups.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::spec::defaults::{
    DEFAULT_NETWORK_CIDR, DEFAULT_POD_CIDR, DEFAULT_SERVICE_CIDR, new_instance_group,
    region_of_zone,
};
use crate::spec::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TopologyArg {
    Public,
    Private,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DnsArg {
    Public,
    Private,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ApiLbArg {
    Public,
    Internal,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EtcdArg {
    Stacked,
    External,
}

#[derive(Debug, Args, Clone)]
pub struct CreateClusterArgs {
    /// Cluster name: a DNS name such as demo.example.com (or NAME.k8s.local for no DNS)
    pub name: String,
    /// Cloud provider
    #[arg(long, value_enum)]
    pub cloud: CloudArg,
    /// Availability zones (aws), comma-separated: a subnet is made in each
    #[arg(long, value_delimiter = ',')]
    pub zones: Vec<String>,
    /// Zones for control-plane instances (default: the first zones)
    #[arg(long, value_delimiter = ',', alias = "master-zones")]
    pub control_plane_zones: Vec<String>,
    /// Number of control-plane instances (odd with stacked etcd)
    #[arg(long, default_value_t = 1, alias = "master-count")]
    pub control_plane_count: u32,
    /// Machine type of control-plane instances
    #[arg(long, alias = "master-size")]
    pub control_plane_size: Option<String>,
    /// Number of worker nodes
    #[arg(long, default_value_t = 2)]
    pub node_count: u32,
    /// Machine type of worker nodes
    #[arg(long)]
    pub node_size: Option<String>,
    /// Machine image for all instance groups
    #[arg(long)]
    pub image: Option<String>,
    /// Kubernetes version, e.g. 1.35.1
    #[arg(long)]
    pub kubernetes_version: Option<String>,
    /// Pod network add-on
    #[arg(long, value_enum)]
    pub networking: Option<CniArg>,
    /// Network topology: nodes in public subnets, or private subnets behind NAT
    #[arg(long, value_enum, default_value_t = TopologyArg::Public)]
    pub topology: TopologyArg,
    /// Add a bastion host group (private topology)
    #[arg(long)]
    pub bastion: bool,
    /// DNS zone for the cluster's records (default: the cluster name's parent domain)
    #[arg(long)]
    pub dns_zone: Option<String>,
    /// DNS type
    #[arg(long, value_enum)]
    pub dns: Option<DnsArg>,
    /// API load balancer type
    #[arg(long, value_enum)]
    pub api_loadbalancer_type: Option<ApiLbArg>,
    /// etcd topology
    #[arg(long, value_enum)]
    pub etcd: Option<EtcdArg>,
    /// Network CIDR (aws VPC)
    #[arg(long)]
    pub network_cidr: Option<String>,
    /// Use an existing VPC by ID instead of creating one
    #[arg(long, alias = "vpc")]
    pub network_id: Option<String>,
    /// Pod network CIDR
    #[arg(long)]
    pub pod_cidr: Option<String>,
    /// Service CIDR
    #[arg(long)]
    pub service_cidr: Option<String>,
    /// SSH public key installed on instances [default: ~/.ssh/id_ed25519.pub or ~/.ssh/id_rsa.pub if present]
    #[arg(long, value_name = "FILE")]
    pub ssh_public_key: Option<PathBuf>,
    /// Inventory of hosts (metal): kprov YAML, Kubespray hosts.yaml or inventory.ini
    #[arg(long, value_name = "FILE")]
    pub inventory: Option<PathBuf>,
    /// Print the objects instead of storing them
    #[arg(long)]
    pub dry_run: bool,
    /// Output format for --dry-run
    #[arg(short, long, value_enum, default_value_t = DryRunFormat::Yaml)]
    pub output: DryRunFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CloudArg {
    Aws,
    Metal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CniArg {
    Calico,
    Cilium,
    Flannel,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DryRunFormat {
    Yaml,
    Json,
}

/// A flag problem, reported like a spec error against the flag name.
#[derive(Debug, thiserror::Error)]
#[error("--{flag}: {message}")]
pub struct FlagError {
    pub flag: &'static str,
    pub message: String,
}

fn flag_err(flag: &'static str, message: impl Into<String>) -> FlagError {
    FlagError {
        flag,
        message: message.into(),
    }
}

fn ig_spec(
    role: InstanceGroupRole,
    machine_type: Option<String>,
    image: Option<String>,
    size: u32,
    subnets: Vec<String>,
) -> InstanceGroupSpec {
    InstanceGroupSpec {
        role,
        machine_type,
        image,
        min_size: Some(size),
        max_size: Some(size),
        subnets,
        rolling_update: None,
        node_labels: BTreeMap::new(),
        taints: Vec::new(),
        ssh_user: None,
    }
}

/// Builds the objects `create cluster` stores. `hosts` is the parsed inventory for metal.
/// `ssh_public_key` is the key text already read from disk.
pub fn build_cluster_objects(
    a: &CreateClusterArgs,
    hosts: Vec<Host>,
    ssh_public_key: Option<String>,
) -> Result<(Cluster, Vec<InstanceGroup>), FlagError> {
    let name = a.name.trim_end_matches('.').to_string();
    let aws = a.cloud == CloudArg::Aws;
    let mut spec = ClusterSpec {
        cloud_provider: if aws {
            CloudProvider::Aws
        } else {
            CloudProvider::Metal
        },
        region: None,
        // Choices made at creation are pinned in the user's spec, so a newer kprov with newer
        // defaults never changes an existing cluster behind its owner's back.
        kubernetes_version: Some(
            a.kubernetes_version
                .clone()
                .unwrap_or_else(|| crate::spec::versions::DEFAULT_KUBERNETES_VERSION.into()),
        ),
        networking: Networking {
            network_cidr: a.network_cidr.clone(),
            network_id: a.network_id.clone(),
            subnets: Vec::new(),
            pod_cidr: Some(
                a.pod_cidr
                    .clone()
                    .unwrap_or_else(|| DEFAULT_POD_CIDR.into()),
            ),
            service_cidr: Some(
                a.service_cidr
                    .clone()
                    .unwrap_or_else(|| DEFAULT_SERVICE_CIDR.into()),
            ),
            cni: Some(match a.networking.unwrap_or(CniArg::Calico) {
                CniArg::Calico => Cni::Calico,
                CniArg::Cilium => Cni::Cilium,
                CniArg::Flannel => Cni::Flannel,
                CniArg::None => Cni::None,
            }),
        },
        // Public/private subnets and bastions are cloud networking; metal hosts have neither.
        topology: aws.then(|| Topology {
            kind: if a.topology == TopologyArg::Private {
                TopologyType::Private
            } else {
                TopologyType::Public
            },
            bastion: a.bastion.then(Bastion::default),
            ssh_address: None,
        }),
        dns: None,
        api: None,
        etcd: a.etcd.map(|e| Etcd {
            kind: if e == EtcdArg::External {
                EtcdType::External
            } else {
                EtcdType::Stacked
            },
        }),
        cloud_controller_manager: None,
        ssh_key: ssh_public_key.map(|k| SshKey {
            name: None,
            public_key: Some(k.trim().to_string()),
        }),
        assets: None,
        hosts: Vec::new(),
    };
    if a.dns.is_some() || a.dns_zone.is_some() {
        let kind = match a.dns {
            Some(DnsArg::None) => DnsType::None,
            Some(DnsArg::Private) => DnsType::Private,
            _ => DnsType::Public,
        };
        spec.dns = Some(Dns {
            kind,
            zone: a
                .dns_zone
                .clone()
                .map(|z| z.trim_end_matches('.').to_string()),
        });
    }
    if let Some(lb) = a.api_loadbalancer_type {
        let kind = match lb {
            ApiLbArg::Public => LoadBalancerType::Public,
            ApiLbArg::Internal => LoadBalancerType::Internal,
            ApiLbArg::None => LoadBalancerType::None,
        };
        spec.api = Some(Api {
            load_balancer: Some(LoadBalancer { kind }),
            ..Default::default()
        });
    }

    let mut groups = Vec::new();
    if aws {
        if !hosts.is_empty() || a.inventory.is_some() {
            return Err(flag_err(
                "inventory",
                "an inventory is only for --cloud metal",
            ));
        }
        if a.zones.is_empty() {
            return Err(flag_err(
                "zones",
                "at least one zone is required for --cloud aws (e.g. --zones us-east-1a,us-east-1b)",
            ));
        }
        let mut zones: Vec<String> = Vec::new();
        for z in &a.zones {
            let z = z.trim().to_string();
            if region_of_zone(&z).is_none() {
                return Err(flag_err(
                    "zones",
                    format!("{z:?} is not an availability zone like us-east-1a"),
                ));
            }
            if !zones.contains(&z) {
                zones.push(z);
            }
        }
        let net_text = a
            .network_cidr
            .clone()
            .unwrap_or_else(|| DEFAULT_NETWORK_CIDR.to_string());
        spec.networking.network_cidr = Some(net_text.clone());
        let net: ipnet::Ipv4Net = net_text
            .parse()
            .map_err(|_| flag_err("network-cidr", format!("{net_text:?} is not an IPv4 CIDR")))?;
        let private = a.topology == TopologyArg::Private;
        let (node_cidrs, util_cidrs) = cidr::kops_layout(net.trunc(), zones.len(), private)
            .map_err(|e| flag_err("network-cidr", e.to_string()))?;
        for (z, c) in zones.iter().zip(&node_cidrs) {
            spec.networking.subnets.push(Subnet {
                name: z.clone(),
                zone: z.clone(),
                cidr: c.to_string(),
                kind: if private {
                    SubnetType::Private
                } else {
                    SubnetType::Public
                },
                id: None,
            });
        }
        for (z, c) in zones.iter().zip(&util_cidrs) {
            spec.networking.subnets.push(Subnet {
                name: format!("utility-{z}"),
                zone: z.clone(),
                cidr: c.to_string(),
                kind: SubnetType::Utility,
                id: None,
            });
        }
        if a.bastion && !private {
            return Err(flag_err(
                "bastion",
                "a bastion is only useful with --topology private",
            ));
        }

        // One control-plane group per instance, spread over the zones (kops's layout: etcd
        // members and their volumes stay tied to one zone each).
        let cp_zones: Vec<String> = if a.control_plane_zones.is_empty() {
            zones.clone()
        } else {
            a.control_plane_zones
                .iter()
                .map(|z| z.trim().to_string())
                .collect()
        };
        for z in &cp_zones {
            if !zones.contains(z) {
                return Err(flag_err(
                    "control-plane-zones",
                    format!("{z} is not one of --zones"),
                ));
            }
        }
        if a.control_plane_count == 0 {
            return Err(flag_err("control-plane-count", "must be at least 1"));
        }
        let per_zone_multiple = a.control_plane_count as usize > cp_zones.len();
        for i in 0..a.control_plane_count as usize {
            let z = &cp_zones[i % cp_zones.len()];
            let subnet = spec
                .networking
                .subnets
                .iter()
                .find(|s| &s.zone == z && s.kind != SubnetType::Utility)
                .map(|s| s.name.clone())
                .unwrap_or_default();
            let ig_name = if per_zone_multiple {
                format!("control-plane-{z}-{}", i / cp_zones.len() + 1)
            } else {
                format!("control-plane-{z}")
            };
            groups.push(new_instance_group(
                &name,
                &ig_name,
                ig_spec(
                    InstanceGroupRole::ControlPlane,
                    a.control_plane_size.clone(),
                    a.image.clone(),
                    1,
                    vec![subnet],
                ),
            ));
        }
        let node_subnets: Vec<String> = spec
            .networking
            .subnets
            .iter()
            .filter(|s| s.kind != SubnetType::Utility)
            .map(|s| s.name.clone())
            .collect();
        groups.push(new_instance_group(
            &name,
            "nodes",
            ig_spec(
                InstanceGroupRole::Node,
                a.node_size.clone(),
                a.image.clone(),
                a.node_count,
                node_subnets,
            ),
        ));
        if a.bastion {
            let util: Vec<String> = spec
                .networking
                .subnets
                .iter()
                .filter(|s| s.kind == SubnetType::Utility)
                .map(|s| s.name.clone())
                .collect();
            groups.push(new_instance_group(
                &name,
                "bastions",
                ig_spec(InstanceGroupRole::Bastion, None, a.image.clone(), 1, util),
            ));
        }
    } else {
        if !a.zones.is_empty() {
            return Err(flag_err(
                "zones",
                "zones are only for --cloud aws; metal hosts come from --inventory",
            ));
        }
        if a.inventory.is_none() {
            return Err(flag_err(
                "inventory",
                "--cloud metal needs an inventory of hosts (kprov YAML, Kubespray hosts.yaml or inventory.ini)",
            ));
        }
        if a.control_plane_size.is_some() || a.node_size.is_some() {
            return Err(flag_err(
                "node-size",
                "machine sizes do not apply to metal hosts",
            ));
        }
        if a.etcd.is_none()
            && hosts.iter().any(|h| {
                h.roles.contains(&HostRole::Etcd) && !h.roles.contains(&HostRole::ControlPlane)
            })
        {
            spec.etcd = Some(Etcd {
                kind: EtcdType::External,
            });
        }
        let cps = hosts
            .iter()
            .filter(|h| h.roles.contains(&HostRole::ControlPlane))
            .count() as u32;
        let nodes = hosts
            .iter()
            .filter(|h| {
                h.roles.contains(&HostRole::Node) && !h.roles.contains(&HostRole::ControlPlane)
            })
            .count() as u32;
        groups.push(new_instance_group(
            &name,
            "control-plane",
            ig_spec(InstanceGroupRole::ControlPlane, None, None, cps, vec![]),
        ));
        if nodes > 0 {
            groups.push(new_instance_group(
                &name,
                "nodes",
                ig_spec(InstanceGroupRole::Node, None, None, nodes, vec![]),
            ));
        }
        spec.hosts = hosts;
    }
    let cluster = Cluster {
        api_version: API_VERSION.into(),
        kind: KIND_CLUSTER.into(),
        metadata: ObjectMeta {
            name,
            ..Default::default()
        },
        spec,
    };
    Ok((cluster, groups))
}
