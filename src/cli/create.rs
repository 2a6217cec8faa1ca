//! `kprov create cluster NAME ...`: the kops-like flags, read into an `ops::create`
//! request, and what `--dry-run` says it understood from an inventory. The objects are built,
//! checked and stored by `ops::create`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::ops::create::ClusterRequest;
pub(super) use crate::ops::create::FlagError;
use crate::spec::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TopologyArg {
    Public,
    Private,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DnsArg {
    Public,
    Private,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ApiLbArg {
    Public,
    Internal,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum EtcdArg {
    Stacked,
    External,
}

#[derive(Debug, Args, Clone)]
pub(crate) struct CreateClusterArgs {
    /// Cluster name: a DNS name such as demo.example.com (or NAME.k8s.local for no DNS)
    pub(crate) name: String,
    /// Cloud provider
    #[arg(long, value_enum)]
    pub(crate) cloud: CloudArg,
    /// Availability zones (aws), comma-separated: a subnet is made in each
    #[arg(long, value_delimiter = ',')]
    pub(crate) zones: Vec<String>,
    /// Zones for control-plane instances (default: the first zones)
    #[arg(long, value_delimiter = ',', alias = "master-zones")]
    pub(crate) control_plane_zones: Vec<String>,
    /// Number of control-plane instances (odd with stacked etcd)
    #[arg(long, default_value_t = 1, alias = "master-count")]
    pub(crate) control_plane_count: u32,
    /// Machine type of control-plane instances
    #[arg(long, alias = "master-size")]
    pub(crate) control_plane_size: Option<String>,
    /// Number of worker nodes
    #[arg(long, default_value_t = 2)]
    pub(crate) node_count: u32,
    /// Machine type of worker nodes
    #[arg(long)]
    pub(crate) node_size: Option<String>,
    /// Machine image for all instance groups
    #[arg(long)]
    pub(crate) image: Option<String>,
    /// Kubernetes version, e.g. 1.35.1
    #[arg(long)]
    pub(crate) kubernetes_version: Option<String>,
    /// Pod network add-on
    #[arg(long, value_enum)]
    pub(crate) networking: Option<CniArg>,
    /// Network topology: nodes in public subnets, or private subnets behind NAT
    #[arg(long, value_enum, default_value_t = TopologyArg::Public)]
    pub(crate) topology: TopologyArg,
    /// Add a bastion host group (private topology)
    #[arg(long)]
    pub(crate) bastion: bool,
    /// DNS zone for the cluster's records (default: the cluster name's parent domain)
    #[arg(long)]
    pub(crate) dns_zone: Option<String>,
    /// DNS type
    #[arg(long, value_enum)]
    pub(crate) dns: Option<DnsArg>,
    /// API load balancer type
    #[arg(long, value_enum)]
    pub(crate) api_loadbalancer_type: Option<ApiLbArg>,
    /// etcd topology
    #[arg(long, value_enum)]
    pub(crate) etcd: Option<EtcdArg>,
    /// Network CIDR (aws VPC)
    #[arg(long)]
    pub(crate) network_cidr: Option<String>,
    /// Use an existing VPC by ID instead of creating one
    #[arg(long, alias = "vpc")]
    pub(crate) network_id: Option<String>,
    /// Pod network CIDR
    #[arg(long)]
    pub(crate) pod_cidr: Option<String>,
    /// Service CIDR
    #[arg(long)]
    pub(crate) service_cidr: Option<String>,
    /// SSH public key installed on instances [default: ~/.ssh/id_ed25519.pub or ~/.ssh/id_rsa.pub if present]
    #[arg(long, value_name = "FILE")]
    pub(crate) ssh_public_key: Option<PathBuf>,
    /// Inventory of hosts (metal): kprov YAML, or a Kubespray inventory file or directory
    /// (inventory/mycluster/ with hosts.yaml or inventory.ini, group_vars/ and host_vars/)
    #[arg(long, value_name = "DIR_OR_FILE")]
    pub(crate) inventory: Option<PathBuf>,
    /// Print the objects instead of storing them
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Output format for --dry-run
    #[arg(short, long, value_enum, default_value_t = DryRunFormat::Yaml)]
    pub(crate) output: DryRunFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CloudArg {
    Aws,
    Metal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CniArg {
    Calico,
    Cilium,
    Flannel,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DryRunFormat {
    Yaml,
    Json,
}

impl CreateClusterArgs {
    /// The request these flags make (the same words in the model's types).
    pub(crate) fn request(&self) -> ClusterRequest {
        ClusterRequest {
            name: self.name.clone(),
            cloud: match self.cloud {
                CloudArg::Aws => CloudProvider::Aws,
                CloudArg::Metal => CloudProvider::Metal,
            },
            zones: self.zones.clone(),
            control_plane_zones: self.control_plane_zones.clone(),
            control_plane_count: self.control_plane_count,
            control_plane_size: self.control_plane_size.clone(),
            node_count: self.node_count,
            node_size: self.node_size.clone(),
            image: self.image.clone(),
            kubernetes_version: self.kubernetes_version.clone(),
            networking: self.networking.map(|n| match n {
                CniArg::Calico => Cni::Calico,
                CniArg::Cilium => Cni::Cilium,
                CniArg::Flannel => Cni::Flannel,
                CniArg::None => Cni::None,
            }),
            topology: match self.topology {
                TopologyArg::Public => TopologyType::Public,
                TopologyArg::Private => TopologyType::Private,
            },
            bastion: self.bastion,
            dns_zone: self.dns_zone.clone(),
            dns: self.dns.map(|d| match d {
                DnsArg::Public => DnsType::Public,
                DnsArg::Private => DnsType::Private,
                DnsArg::None => DnsType::None,
            }),
            api_loadbalancer_type: self.api_loadbalancer_type.map(|lb| match lb {
                ApiLbArg::Public => LoadBalancerType::Public,
                ApiLbArg::Internal => LoadBalancerType::Internal,
                ApiLbArg::None => LoadBalancerType::None,
            }),
            etcd: self.etcd.map(|e| match e {
                EtcdArg::Stacked => EtcdType::Stacked,
                EtcdArg::External => EtcdType::External,
            }),
            network_cidr: self.network_cidr.clone(),
            network_id: self.network_id.clone(),
            pod_cidr: self.pod_cidr.clone(),
            service_cidr: self.service_cidr.clone(),
            inventory: self.inventory.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::path::Path;

    #[derive(Parser)]
    struct W {
        #[command(flatten)]
        a: CreateClusterArgs,
    }

    /// Every flag reaches the request with its meaning (the objects themselves are
    /// `ops::create`'s tests).
    #[test]
    fn flags_become_the_request() {
        let a = W::try_parse_from([
            "kprov",
            "c.example.com",
            "--cloud",
            "aws",
            "--zones",
            "us-east-1a,us-east-1b",
            "--topology",
            "private",
            "--bastion",
            "--dns",
            "private",
            "--networking",
            "cilium",
            "--api-loadbalancer-type",
            "internal",
            "--etcd",
            "external",
        ])
        .unwrap()
        .a
        .request();
        assert_eq!(a.cloud, CloudProvider::Aws);
        assert_eq!(a.zones, ["us-east-1a", "us-east-1b"]);
        assert_eq!((a.control_plane_count, a.node_count), (1, 2));
        assert_eq!(a.topology, TopologyType::Private);
        assert!(a.bastion);
        assert_eq!(a.dns, Some(DnsType::Private));
        assert_eq!(a.networking, Some(Cni::Cilium));
        assert_eq!(a.api_loadbalancer_type, Some(LoadBalancerType::Internal));
        assert_eq!(a.etcd, Some(EtcdType::External));
    }

    #[test]
    fn inventory_summary_says_what_was_understood() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kubespray/corpus/mycluster");
        let a = W::try_parse_from([
            "kprov",
            "lab.example.com",
            "--cloud",
            "metal",
            "--inventory",
            path.to_str().unwrap(),
        ])
        .unwrap()
        .a
        .request();
        let mut inv = crate::ops::create::import_inventory(&path).unwrap();
        let (mut c, _) =
            crate::ops::create::build_cluster_objects(&a, inv.plain_hosts(), None).unwrap();
        let notes = crate::ops::create::apply_inventory(&mut c, &mut inv, &a);
        let summary = crate::views::create::inventory_summary(&inv, &notes).join("\n");
        assert!(
            summary.contains(
                "node3 (line 10): roles control-plane,etcd, address 198.18.10.3, ip 10.0.0.3, \
                 user from-host-vars, port 2203, key ~/.ssh/cluster_key"
            ),
            "{summary}"
        );
        assert!(summary.contains("etcd: stacked"), "{summary}");
        assert!(
            summary.contains("kube_pods_subnet (")
                && summary.contains("-> spec.networking.podCIDR = 10.244.0.0/16"),
            "{summary}"
        );
    }

    #[test]
    fn inventory_errors_exit_3() {
        let e: anyhow::Error = crate::ops::model::InventoryError::Format {
            file: "x".into(),
            message: "y".into(),
        }
        .into();
        assert_eq!(
            crate::cli::ctx::exit_code_of(&e),
            crate::cli::exit::INVALID_SPEC
        );
    }

    /// ops's error enums reach their documented exit codes through their variants (a held
    /// lock 4, a cluster that would be invalid 3), not only as the type they wrap.
    #[test]
    fn ops_errors_map_to_exit_codes() {
        use crate::cli::{ctx::exit_code_of, exit};
        use crate::ops::model::{LockError, LockRecord, RepoError, StateError};
        use crate::ops::{damaged::DamagedError, objects::GroupDeleteError};
        let now = chrono::Utc::now();
        let record = LockRecord {
            holder: "someone".into(),
            host: "h".into(),
            pid: 1,
            command: "kprov update cluster c --yes".into(),
            acquired_at: now,
            renewed_at: now,
            expires_at: now,
            id: "x".into(),
        };
        let held = || LockError::Held {
            cluster: "c".into(),
            record: Box::new(record.clone()),
        };
        let code = |e: anyhow::Error| exit_code_of(&e);
        assert_eq!(code(GroupDeleteError::Lock(held()).into()), exit::CONFLICT);
        assert_eq!(code(DamagedError::Lock(held()).into()), exit::CONFLICT);
        assert_eq!(
            code(DamagedError::Store(anyhow::anyhow!("x")).into()),
            exit::ERROR
        );
        let conflict = StateError::Conflict {
            location: "file:///s".into(),
            key: "c/damaged/x".into(),
            expected: "1".into(),
        };
        assert_eq!(
            code(DamagedError::Store(anyhow::Error::from(conflict).context("removing")).into()),
            exit::CONFLICT
        );
        let missing = RepoError::GroupNotFound {
            cluster: "c".into(),
            group: "g".into(),
        };
        assert_eq!(code(GroupDeleteError::Repo(missing).into()), exit::ERROR);
        let exists = RepoError::Exists {
            name: "c".into(),
            store: "file:///s".into(),
        };
        assert_eq!(code(GroupDeleteError::Repo(exists).into()), exit::CONFLICT);
    }
}
