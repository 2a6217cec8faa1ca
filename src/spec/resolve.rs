//! The resolved cluster (issue 19, "resolve once"): the user's objects with every default
//! applied once ([`super::defaults::complete`]), validated ([`super::validate`]) and turned
//! into types that hold no `Option` for anything a default fills. Consumers take a
//! [`ResolvedCluster`] and never re-apply a default or re-check a field the defaults fill:
//! a value missing here is a [`SpecErrors`] naming the field (and its file and line when the
//! caller knows the source documents), said before any plan is made.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use ipnet::Ipv4Net;

use super::defaults::complete;
use super::load::{SourceDoc, SpecErrors};
use super::locate::FieldPath;
use super::types::*;
use super::validate::{self, ObjectKey, Violation};

/// A Kubernetes release, `MAJOR.MINOR.PATCH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeVersion {
    /// The major version (1).
    pub major: u32,
    /// The minor version, e.g. 35 in 1.35.1.
    pub minor: u32,
    /// The patch release, e.g. 1 in 1.35.1.
    pub patch: u32,
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Who may reach a port from outside (`spec.sshAccess`, `spec.kubernetesApiAccess`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Not set: the whole internet (kops's default; the preview warns).
    Anywhere,
    /// Only these CIDRs, as the user wrote them.
    Only(Vec<String>),
}

/// Where a cluster's DNS records go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolvedDns {
    /// No records (gossip names, metal).
    None,
    /// Records in a public hosted zone (`spec.dns.type: Public`).
    Public {
        /// The zone's name (`spec.dns.zone`, default: the cluster name after its first label).
        zone: String,
    },
    /// Records in a private hosted zone (`spec.dns.type: Private`).
    Private {
        /// The zone's name (`spec.dns.zone`).
        zone: String,
    },
}

impl ResolvedDns {
    /// The zone records go to; `None` when the cluster has no records.
    pub fn zone(&self) -> Option<&str> {
        match self {
            ResolvedDns::None => None,
            ResolvedDns::Public { zone } | ResolvedDns::Private { zone } => Some(zone),
        }
    }
}

/// An instance group's image: an `ami-` ID used as it is, or a name (pattern, optionally
/// `OWNER/` first) that the cloud resolves, then pins (`cloud::aws::images`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageRef {
    /// An AMI ID (`ami-…`), used as it is.
    Id(String),
    /// An image name or pattern, optionally `OWNER/` first, resolved then pinned.
    Name(String),
}

impl ImageRef {
    fn new(s: &str) -> ImageRef {
        if s.starts_with("ami-") {
            ImageRef::Id(s.to_string())
        } else {
            ImageRef::Name(s.to_string())
        }
    }

    /// The text as the spec gives it (the key of the image pins).
    pub fn as_str(&self) -> &str {
        match self {
            ImageRef::Id(s) | ImageRef::Name(s) => s,
        }
    }
}

/// A group's size bounds; `min <= max` by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupSize {
    min: u32,
    max: u32,
}

impl GroupSize {
    /// The bounds, or `None` when `min > max`.
    pub fn new(min: u32, max: u32) -> Option<GroupSize> {
        (min <= max).then_some(GroupSize { min, max })
    }
    /// The fewest instances (`spec.minSize`, default 1; on metal the hosts of the role).
    pub fn min(self) -> u32 {
        self.min
    }
    /// The most instances (`spec.maxSize`, default `minSize`; on metal the hosts of the role).
    pub fn max(self) -> u32 {
        self.max
    }
}

/// What a group needs of its platform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupPlacement {
    /// An AWS group: its launch settings.
    Aws {
        /// `spec.machineType` (default t3.medium, t3.micro for a bastion).
        machine_type: String,
        /// `spec.image` (default Canonical's Ubuntu 24.04 for the region's partition).
        image: ImageRef,
        /// The subnets the group's instances go to (never empty; each one of the cluster's).
        subnets: Vec<String>,
        /// The zones of those subnets, in order, without repeats.
        zones: Vec<String>,
        /// The SSH user when the spec names one (otherwise the image family tells it).
        ssh_user: Option<String>,
    },
    /// A metal group: hosts of the spec, not machines kprov makes.
    Metal {
        /// The hosts (by name) the group stands for: every host of its role goes to the first
        /// group of that role, as the roll places it.
        hosts: Vec<String>,
    },
}

/// One instance group, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedGroup {
    /// The group's `metadata.name` (unique in the cluster).
    pub name: String,
    /// `spec.role`.
    pub role: InstanceGroupRole,
    /// `spec.minSize` and `spec.maxSize`.
    pub size: GroupSize,
    /// Where its instances go, per platform.
    pub placement: GroupPlacement,
    /// `spec.nodeLabels`: labels the kubelet registers its node with.
    pub node_labels: std::collections::BTreeMap<String, String>,
    /// `spec.taints`, as `key[=value]:Effect`.
    pub taints: Vec<String>,
}

impl ResolvedGroup {
    /// The machine type, on AWS.
    pub fn machine_type(&self) -> Option<&str> {
        match &self.placement {
            GroupPlacement::Aws { machine_type, .. } => Some(machine_type),
            GroupPlacement::Metal { .. } => None,
        }
    }
}

/// The AWS half of a cluster: what the cloud model needs, each field set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsPart {
    /// `spec.region`, default: the region of the first subnet's zone.
    pub region: String,
    /// `spec.networking.networkCIDR`, the VPC's range (default 172.20.0.0/16).
    pub network_cidr: Ipv4Net,
    /// An adopted VPC's ID (absent: kprov creates one).
    pub network_id: Option<String>,
    /// Never empty.
    pub subnets: Vec<Subnet>,
    /// `spec.topology.type` (default Public).
    pub topology: TopologyType,
    /// `spec.topology.bastion.publicName`, default `bastion.NAME`.
    pub bastion_name: String,
    /// `spec.api.publicName`, default `api.NAME`.
    pub api_name: String,
    /// Where the cluster's DNS records go (`spec.dns`).
    pub dns: ResolvedDns,
    /// `spec.sshKey.name`, default `kprov-NAME`.
    pub ssh_key_name: String,
    /// Not a default: the user adds it (`create sshpublickey`); the cloud model refuses to
    /// plan instances without it, naming the field.
    pub ssh_public_key: Option<String>,
    /// Who may reach SSH (`spec.sshAccess`).
    pub ssh_access: Access,
    /// Who may reach the API (`spec.kubernetesApiAccess`).
    pub api_access: Access,
}

/// One metal host with its connection defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetalHost {
    /// The host's `name` (its node name).
    pub name: String,
    /// The `address` kprov connects to over SSH.
    pub address: String,
    /// The SSH `user` (default root).
    pub user: String,
    /// The SSH `port` (default 22).
    pub port: u16,
    /// The host's `roles`.
    pub roles: Vec<HostRole>,
}

/// The metal half of a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetalPart {
    /// Every host of `spec.hosts`, in order.
    pub hosts: Vec<MetalHost>,
    /// A fixed API endpoint (VIP or external load balancer); absent: a local proxy per node.
    pub endpoint: Option<String>,
}

/// The platform's half of the cluster (`spec.cloudProvider`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Platform {
    /// `cloudProvider: aws`.
    Aws(Box<AwsPart>),
    /// `cloudProvider: metal`.
    Metal(MetalPart),
}

/// The cluster's networks inside Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedNetworking {
    /// `spec.networking.podCIDR` (default 100.96.0.0/11, as kops).
    pub pod_cidr: Ipv4Net,
    /// `spec.networking.serviceCIDR` (default 100.64.0.0/13, as kops).
    pub service_cidr: Ipv4Net,
    /// `spec.networking.cni` (default calico).
    pub cni: Cni,
}

/// What the add-ons are rendered from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedAddons {
    /// The CNI to install (`none`: the user installs their own).
    pub cni: Cni,
    /// The provider whose cloud-controller-manager runs; none on plain metal (absence is the
    /// setting: no kubelet gets `--cloud-provider=external`).
    pub external_cloud_provider: Option<String>,
}

/// A cluster and its groups, resolved once. `completed` / `completed_groups` keep the
/// completed objects for the consumers that still read the spec's own types (see
/// docs/architecture.md) and for the store's `cluster-completed.spec`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedCluster {
    /// The cluster's `metadata.name`.
    pub name: String,
    /// `spec.kubernetesVersion` (default: kprov's pinned default release).
    pub version: KubeVersion,
    /// Pod and service networks and the CNI.
    pub networking: ResolvedNetworking,
    /// `spec.api.loadBalancer.type` (default Public on AWS, None on metal).
    pub load_balancer: LoadBalancerType,
    /// `spec.etcd.type` (default Stacked).
    pub etcd: EtcdType,
    /// The AWS or metal half.
    pub platform: Platform,
    /// Every instance group, in the order given.
    pub groups: Vec<ResolvedGroup>,
    /// What the add-ons are rendered from.
    pub addons: ResolvedAddons,
    /// The completed Cluster (every default filled in).
    pub completed: Cluster,
    /// The completed InstanceGroups, in the order given.
    pub completed_groups: Vec<InstanceGroup>,
}

impl ResolvedCluster {
    /// The AWS half, on AWS.
    pub fn aws(&self) -> Option<&AwsPart> {
        match &self.platform {
            Platform::Aws(a) => Some(a),
            Platform::Metal(_) => None,
        }
    }

    /// The group of that name.
    pub fn group(&self, name: &str) -> Option<&ResolvedGroup> {
        self.groups.iter().find(|g| g.name == name)
    }

    /// Whether any group has that role.
    pub fn has_role(&self, role: InstanceGroupRole) -> bool {
        self.groups.iter().any(|g| g.role == role)
    }
}

/// Resolves `cluster` and `groups`; errors name the field (no source positions).
pub fn resolve(cluster: &Cluster, groups: &[InstanceGroup]) -> Result<ResolvedCluster, SpecErrors> {
    resolve_located(cluster, groups, None, &HashMap::new(), "the spec")
}

/// [`resolve`] with the source documents, so every error names its file and line.
pub fn resolve_located(
    cluster: &Cluster,
    groups: &[InstanceGroup],
    cluster_doc: Option<&SourceDoc>,
    group_docs: &HashMap<String, Arc<SourceDoc>>,
    fallback_source: &str,
) -> Result<ResolvedCluster, SpecErrors> {
    let (c, g) = complete(cluster, groups);
    let mut violations = validate::validate(&c, &g);
    let resolved = if violations.is_empty() {
        build(&c, &g, &mut violations)
    } else {
        None
    };
    match resolved {
        Some(r) if violations.is_empty() => Ok(r),
        _ => Err(validate::locate(
            &violations,
            cluster_doc,
            group_docs,
            fallback_source,
        )),
    }
}

/// The typed model of objects a caller already validated (the cloud provider's entry points,
/// reached from `ops` with a spec `resolve` accepted, and from tests with any spec): defaults
/// applied once, then only the checks the types need, each naming its field; not the policy
/// rules of [`validate`].
pub fn model(cluster: &Cluster, groups: &[InstanceGroup]) -> Result<ResolvedCluster, SpecErrors> {
    let (c, g) = complete(cluster, groups);
    let mut violations = Vec::new();
    match build(&c, &g, &mut violations) {
        Some(r) if violations.is_empty() => Ok(r),
        _ => Err(validate::locate(
            &violations,
            None,
            &HashMap::new(),
            "the spec",
        )),
    }
}

struct Problems<'a>(&'a mut Vec<Violation>);

impl Problems<'_> {
    fn at(&mut self, object: &ObjectKey, path: &str, message: impl Into<String>) {
        self.0.push(Violation {
            object: object.clone(),
            path: FieldPath::parse(path),
            message: message.into(),
        });
    }
}

fn cidr(p: &mut Problems<'_>, path: &str, v: Option<&str>) -> Option<Ipv4Net> {
    let cl = ObjectKey::Cluster;
    match v {
        None => {
            p.at(&cl, path, "is not set");
            None
        }
        Some(v) => match v.parse::<Ipv4Net>() {
            Ok(n) => Some(n),
            Err(_) => {
                p.at(&cl, path, format!("{v:?} is not an IPv4 CIDR"));
                None
            }
        },
    }
}

/// Builds the typed model from the completed, validated objects. Validation has already
/// refused what it knows; what is checked again here is what the types need, so a rule
/// validation lacks shows as an error naming the field, never as a panic.
fn build(c: &Cluster, igs: &[InstanceGroup], out: &mut Vec<Violation>) -> Option<ResolvedCluster> {
    let mut p = Problems(out);
    let cl = ObjectKey::Cluster;
    let s = &c.spec;
    let name = c.name().to_string();

    let version = match s.kubernetes_version.as_deref().map(super::versions::parse) {
        Some(Some((major, minor, patch))) => Some(KubeVersion {
            major,
            minor,
            patch,
        }),
        Some(None) => {
            p.at(
                &cl,
                "spec.kubernetesVersion",
                "is not a version like 1.35.1",
            );
            None
        }
        None => {
            p.at(&cl, "spec.kubernetesVersion", "is not set");
            None
        }
    };
    let pod_cidr = cidr(
        &mut p,
        "spec.networking.podCIDR",
        s.networking.pod_cidr.as_deref(),
    );
    let service_cidr = cidr(
        &mut p,
        "spec.networking.serviceCIDR",
        s.networking.service_cidr.as_deref(),
    );
    let cni = s.networking.cni.unwrap_or_else(|| {
        p.at(&cl, "spec.networking.cni", "is not set");
        Cni::None
    });
    let load_balancer = match s.api.as_ref().and_then(|a| a.load_balancer.as_ref()) {
        Some(lb) => lb.kind,
        None => {
            p.at(&cl, "spec.api.loadBalancer", "is not set");
            LoadBalancerType::None
        }
    };
    let etcd = match &s.etcd {
        Some(e) => e.kind,
        None => {
            p.at(&cl, "spec.etcd", "is not set");
            EtcdType::Stacked
        }
    };

    let platform = match s.cloud_provider {
        CloudProvider::Aws => aws_part(&mut p, c, igs).map(|a| Platform::Aws(Box::new(a))),
        CloudProvider::Metal => Some(Platform::Metal(metal_part(&mut p, c))),
    };

    let mut groups = Vec::new();
    for (i, ig) in igs.iter().enumerate() {
        if igs[..i].iter().any(|o| o.metadata.name == ig.metadata.name) {
            p.at(
                &ObjectKey::InstanceGroup(ig.metadata.name.clone()),
                "metadata.name",
                format!("duplicate instance group name {:?}", ig.metadata.name),
            );
            continue;
        }
        if let Some(g) = group(&mut p, c, platform.as_ref(), igs, ig) {
            groups.push(g);
        }
    }

    let addons = ResolvedAddons {
        cni,
        external_cloud_provider: c.external_cloud_provider().map(str::to_string),
    };
    if !p.0.is_empty() {
        return None;
    }
    Some(ResolvedCluster {
        name,
        version: version?,
        networking: ResolvedNetworking {
            pod_cidr: pod_cidr?,
            service_cidr: service_cidr?,
            cni,
        },
        load_balancer,
        etcd,
        platform: platform?,
        groups,
        addons,
        completed: c.clone(),
        completed_groups: igs.to_vec(),
    })
}

/// The bastion's DNS name: `spec.topology.bastion.publicName`, default `bastion.NAME`.
/// Completion fills it only when the spec has a bastion section; a Bastion group without one
/// gets the same default name. The one rule: the resolved model and the cloud's jump name
/// both read it here.
pub fn bastion_name(c: &Cluster) -> String {
    c.spec
        .topology
        .as_ref()
        .and_then(|t| t.bastion.as_ref())
        .and_then(|b| b.public_name.clone())
        .unwrap_or_else(|| format!("bastion.{}", c.name()))
}

fn aws_part(p: &mut Problems<'_>, c: &Cluster, igs: &[InstanceGroup]) -> Option<AwsPart> {
    let cl = ObjectKey::Cluster;
    let s = &c.spec;
    let name = c.name();
    let region = s.region.clone();
    if region.is_none() {
        p.at(
            &cl,
            "spec.region",
            "is not set and no subnet's zone names a region",
        );
    }
    let network_cidr = cidr(
        p,
        "spec.networking.networkCIDR",
        s.networking.network_cidr.as_deref(),
    );
    if s.networking.subnets.is_empty() {
        p.at(&cl, "spec.networking.subnets", "is empty");
    }
    let topology = match &s.topology {
        Some(t) => t.kind,
        None => {
            p.at(&cl, "spec.topology", "is not set");
            TopologyType::Public
        }
    };
    let bastion_name = bastion_name(c);
    let api_name = match s.api.as_ref().and_then(|a| a.public_name.clone()) {
        Some(n) => n,
        None => {
            p.at(&cl, "spec.api.publicName", "is not set");
            String::new()
        }
    };
    let wants_records = s
        .api
        .as_ref()
        .and_then(|a| a.load_balancer.as_ref())
        .is_some_and(|l| l.kind != LoadBalancerType::None)
        || igs
            .iter()
            .any(|g| g.spec.role == InstanceGroupRole::Bastion);
    let dns = match &s.dns {
        None => {
            p.at(&cl, "spec.dns", "is not set");
            ResolvedDns::None
        }
        Some(d) => match (d.kind, d.zone.clone()) {
            (DnsType::None, _) => ResolvedDns::None,
            (DnsType::Public, Some(zone)) => ResolvedDns::Public { zone },
            (DnsType::Private, Some(zone)) => ResolvedDns::Private { zone },
            (_, None) => {
                if wants_records {
                    p.at(&cl, "spec.dns.zone", "is not set");
                }
                ResolvedDns::None
            }
        },
    };
    let key = s.ssh_key.as_ref();
    let ssh_key_name = key
        .and_then(|k| k.name.clone())
        .unwrap_or_else(|| format!("kprov-{name}"));
    let access = |l: &Option<Vec<String>>| match l {
        Some(l) => Access::Only(l.clone()),
        None => Access::Anywhere,
    };
    Some(AwsPart {
        region: region?,
        network_cidr: network_cidr?,
        network_id: s.networking.network_id.clone(),
        subnets: s.networking.subnets.clone(),
        topology,
        bastion_name,
        api_name,
        dns,
        ssh_key_name,
        ssh_public_key: key.and_then(|k| k.public_key.clone()),
        ssh_access: access(&s.ssh_access),
        api_access: access(&s.kubernetes_api_access),
    })
}

fn metal_part(p: &mut Problems<'_>, c: &Cluster) -> MetalPart {
    let mut hosts = Vec::new();
    for (i, h) in c.spec.hosts.iter().enumerate() {
        let (Some(user), Some(port)) = (h.user.clone(), h.port) else {
            p.at(
                &ObjectKey::Cluster,
                &format!("spec.hosts[{i}]"),
                "user or port is not set",
            );
            continue;
        };
        hosts.push(MetalHost {
            name: h.name.clone(),
            address: h.address.clone(),
            user,
            port,
            roles: h.roles.clone(),
        });
    }
    MetalPart {
        hosts,
        endpoint: c.spec.api.as_ref().and_then(|a| a.endpoint.clone()),
    }
}

fn group(
    p: &mut Problems<'_>,
    c: &Cluster,
    platform: Option<&Platform>,
    all: &[InstanceGroup],
    ig: &InstanceGroup,
) -> Option<ResolvedGroup> {
    let key = ObjectKey::InstanceGroup(ig.metadata.name.clone());
    let s = &ig.spec;
    let (min, max) = match (s.min_size, s.max_size) {
        (Some(min), Some(max)) => (min, max),
        (None, _) => {
            p.at(&key, "spec.minSize", "is not set");
            return None;
        }
        (_, None) => {
            p.at(&key, "spec.maxSize", "is not set");
            return None;
        }
    };
    let Some(size) = GroupSize::new(min, max) else {
        p.at(
            &key,
            "spec.minSize",
            format!("minSize {min} is larger than maxSize {max}"),
        );
        return None;
    };
    let placement = match platform? {
        Platform::Aws(aws) => aws_placement(p, &key, aws, ig)?,
        Platform::Metal(_) => GroupPlacement::Metal {
            hosts: metal_hosts(c, all, ig),
        },
    };
    Some(ResolvedGroup {
        name: ig.metadata.name.clone(),
        role: s.role,
        size,
        placement,
        node_labels: s.node_labels.clone(),
        taints: s.taints.clone(),
    })
}

fn aws_placement(
    p: &mut Problems<'_>,
    key: &ObjectKey,
    aws: &AwsPart,
    ig: &InstanceGroup,
) -> Option<GroupPlacement> {
    let s = &ig.spec;
    let machine_type = s.machine_type.clone().filter(|m| !m.is_empty());
    if machine_type.is_none() {
        p.at(key, "spec.machineType", "is not set");
    }
    let image = s
        .image
        .as_deref()
        .filter(|i| !i.is_empty())
        .map(ImageRef::new);
    if image.is_none() {
        p.at(key, "spec.image", "is not set");
    }
    let subnets: Vec<String> = if s.subnets.is_empty() {
        // Completion places a group in the subnets of its role's type; a bastion of a public
        // cluster with only Utility subnets (or the reverse) goes to the other kind.
        let kinds: &[SubnetType] = match (s.role, aws.topology) {
            (InstanceGroupRole::Bastion, _) => &[SubnetType::Utility, SubnetType::Public],
            (_, TopologyType::Private) => &[SubnetType::Private],
            (_, TopologyType::Public) => &[SubnetType::Public],
        };
        kinds
            .iter()
            .map(|k| {
                aws.subnets
                    .iter()
                    .filter(|x| x.kind == *k)
                    .map(|x| x.name.clone())
                    .collect::<Vec<_>>()
            })
            .find(|v| !v.is_empty())
            // why: no subnet of a suitable type: refused just below, naming the field
            .unwrap_or_default()
    } else {
        s.subnets.clone()
    };
    if subnets.is_empty() {
        p.at(
            key,
            "spec.subnets",
            "no subnet of a suitable type to place it in",
        );
    }
    let mut zones: Vec<String> = Vec::new();
    let mut unknown = false;
    for (i, sn) in subnets.iter().enumerate() {
        match aws.subnets.iter().find(|x| &x.name == sn) {
            Some(x) => {
                if !zones.contains(&x.zone) {
                    zones.push(x.zone.clone());
                }
            }
            None => {
                unknown = true;
                p.at(
                    key,
                    &format!("spec.subnets[{i}]"),
                    format!("subnet {sn:?} is not in spec.networking.subnets"),
                );
            }
        }
    }
    if subnets.is_empty() || unknown {
        return None;
    }
    Some(GroupPlacement::Aws {
        machine_type: machine_type?,
        image: image?,
        subnets,
        zones,
        ssh_user: s.ssh_user.clone(),
    })
}

/// The hosts a metal group stands for: those of its role, for the first group of the role
/// (as `defaults` sizes the groups and the roll places hosts).
fn metal_hosts(c: &Cluster, all: &[InstanceGroup], ig: &InstanceGroup) -> Vec<String> {
    let role = ig.spec.role;
    let first = all.iter().find(|g| g.spec.role == role);
    if first.map(|g| &g.metadata.name) != Some(&ig.metadata.name) {
        return Vec::new();
    }
    c.spec
        .hosts
        .iter()
        .filter(|h| h.in_group_of(role))
        .map(|h| h.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::LazyLock;

    use super::*;
    use crate::spec::defaults::{
        DEFAULT_AWS_BASTION_MACHINE_TYPE, DEFAULT_AWS_IMAGE, DEFAULT_AWS_MACHINE_TYPE,
        DEFAULT_NETWORK_CIDR, DEFAULT_POD_CIDR, DEFAULT_SERVICE_CIDR, new_instance_group,
    };
    use crate::spec::fixtures::aws_stream;
    use crate::spec::load::{Loaded, Object, load_objects};
    use crate::spec::versions::DEFAULT_KUBERNETES_VERSION;

    /// A cluster that leaves every default to kprov: no version, no VPC range, no group sizes
    /// but the workers'.
    static AWS: LazyLock<String> = LazyLock::new(|| {
        aws_stream(
            "  networking:
    subnets:
    - {name: us-east-1a, zone: us-east-1a, cidr: 172.20.32.0/19, type: Public}
",
            &[
                ("control-plane", "ControlPlane", None),
                ("nodes", "Node", Some((2, 3))),
                ("bastion", "Bastion", None),
            ],
        )
    });

    fn objects(text: &str) -> (Cluster, Vec<InstanceGroup>, Vec<Loaded<Object>>) {
        let objs = load_objects("c.yaml", text).unwrap();
        let mut cluster = None;
        let mut groups = Vec::new();
        for o in &objs {
            match &o.value {
                Object::Cluster(c) => cluster = Some(c.clone()),
                Object::InstanceGroup(g) => groups.push(g.clone()),
            }
        }
        (cluster.unwrap(), groups, objs)
    }

    fn aws() -> (Cluster, Vec<InstanceGroup>) {
        let (c, g, _) = objects(&AWS);
        (c, g)
    }

    /// Every default the issue names, present and typed: version, networks, groups' bounds,
    /// machine types, image reference, the AWS part.
    #[test]
    fn aws_defaults_are_resolved_once_and_typed() {
        let (c, g) = aws();
        let r = resolve(&c, &g).unwrap();
        assert_eq!(r.version.to_string(), DEFAULT_KUBERNETES_VERSION);
        assert_eq!(r.networking.pod_cidr.to_string(), DEFAULT_POD_CIDR);
        assert_eq!(r.networking.service_cidr.to_string(), DEFAULT_SERVICE_CIDR);
        assert_eq!(r.networking.cni, Cni::Calico);
        assert_eq!(r.addons.cni, Cni::Calico);
        assert_eq!(r.addons.external_cloud_provider.as_deref(), Some("aws"));
        assert_eq!(r.load_balancer, LoadBalancerType::Public);
        assert_eq!(r.etcd, EtcdType::Stacked);
        let a = r.aws().unwrap();
        assert_eq!(a.region, "us-east-1");
        assert_eq!(a.network_cidr.to_string(), DEFAULT_NETWORK_CIDR);
        assert_eq!(a.topology, TopologyType::Public);
        assert_eq!(a.api_name, "api.demo.example.com");
        assert_eq!(a.bastion_name, "bastion.demo.example.com");
        assert_eq!(a.ssh_key_name, "kprov-demo.example.com");
        assert_eq!(a.ssh_public_key, None);
        assert_eq!(
            a.dns,
            ResolvedDns::Public {
                zone: "example.com".into()
            }
        );
        assert_eq!(
            (&a.ssh_access, &a.api_access),
            (&Access::Anywhere, &Access::Anywhere)
        );

        let cp = r.group("control-plane").unwrap();
        assert_eq!((cp.size.min(), cp.size.max()), (1, 1));
        assert_eq!(cp.machine_type(), Some(DEFAULT_AWS_MACHINE_TYPE));
        let nodes = r.group("nodes").unwrap();
        assert_eq!((nodes.size.min(), nodes.size.max()), (2, 3));
        let GroupPlacement::Aws {
            image,
            subnets,
            zones,
            ..
        } = &nodes.placement
        else {
            panic!("{:?}", nodes.placement)
        };
        assert_eq!(image, &ImageRef::Name(DEFAULT_AWS_IMAGE.into()));
        assert_eq!(subnets, &["us-east-1a".to_string()]);
        assert_eq!(zones, &["us-east-1a".to_string()]);
        let bastion = r.group("bastion").unwrap();
        assert_eq!(
            bastion.machine_type(),
            Some(DEFAULT_AWS_BASTION_MACHINE_TYPE)
        );
    }

    /// What the user wrote wins over every default, and an `ami-` image is an ID.
    #[test]
    fn user_values_win() {
        let text = AWS
            .replace(
                "  cloudProvider: aws\n",
                "  cloudProvider: aws\n  sshAccess: [203.0.113.0/24]\n  api: {publicName: k8s.demo.example.com, loadBalancer: {type: Internal}}\n",
            )
            .replace(
                "  role: Node\n",
                "  role: Node\n  machineType: m5.large\n  image: ami-0123456789abcdef0\n",
            );
        let (c, g, _) = objects(&text);
        let r = resolve(&c, &g).unwrap();
        let a = r.aws().unwrap();
        assert_eq!(a.api_name, "k8s.demo.example.com");
        assert_eq!(a.ssh_access, Access::Only(vec!["203.0.113.0/24".into()]));
        assert_eq!(r.load_balancer, LoadBalancerType::Internal);
        let nodes = r.group("nodes").unwrap();
        assert_eq!(nodes.machine_type(), Some("m5.large"));
        assert!(matches!(
            &nodes.placement,
            GroupPlacement::Aws { image: ImageRef::Id(id), .. } if id == "ami-0123456789abcdef0"
        ));
    }

    /// A resolved spec is a fixed point: resolving the completed objects again gives the same.
    #[test]
    fn resolving_the_completed_spec_changes_nothing() {
        let (c, g) = aws();
        let once = resolve(&c, &g).unwrap();
        let (cc, cg) = complete(&c, &g);
        assert_eq!(resolve(&cc, &cg).unwrap(), once);
    }

    /// Errors name the field, and with the source documents the file and line.
    #[test]
    fn errors_name_the_field_file_and_line() {
        let text = AWS.replace(
            "  minSize: 2\n  maxSize: 3\n",
            "  minSize: 4\n  maxSize: 3\n",
        );
        let (c, g, objs) = objects(&text);
        let e = resolve(&c, &g).unwrap_err().to_string();
        assert!(
            e.contains("spec.minSize: InstanceGroup nodes: minSize 4 is larger than maxSize 3"),
            "{e}"
        );
        let mut docs = HashMap::new();
        let mut cdoc = None;
        for o in &objs {
            match &o.value {
                Object::Cluster(_) => cdoc = Some(o.doc.clone()),
                Object::InstanceGroup(g) => {
                    docs.insert(g.metadata.name.clone(), o.doc.clone());
                }
            }
        }
        let located = resolve_located(&c, &g, cdoc.as_deref(), &docs, "store")
            .unwrap_err()
            .to_string();
        assert!(located.starts_with("c.yaml:"), "{located}");
        assert!(located.contains("spec.minSize"), "{located}");

        // A region no zone names.
        let text = AWS.replace("zone: us-east-1a", "zone: nowhere");
        let (c, g, _) = objects(&text);
        let e = resolve(&c, &g).unwrap_err().to_string();
        assert!(e.contains("spec.region"), "{e}");
    }

    /// The checks the typed model makes itself (validation has them too; these run if a rule
    /// there ever goes): each names its field.
    #[test]
    fn the_models_own_checks_name_their_fields() {
        let (c, g) = aws();
        let (c, g) = complete(&c, &g);
        let mut broken = c.clone();
        broken.spec.kubernetes_version = Some("one".into());
        broken.spec.networking.pod_cidr = Some("nope".into());
        broken.spec.dns = None;
        let mut out = Vec::new();
        assert!(build(&broken, &g, &mut out).is_none());
        let said: Vec<String> = out.iter().map(|v| v.path.to_string()).collect();
        for f in [
            "spec.kubernetesVersion",
            "spec.networking.podCIDR",
            "spec.dns",
        ] {
            assert!(said.iter().any(|s| s == f), "{f}: {said:?}");
        }
        let mut groups = g.clone();
        groups[1].spec.max_size = None;
        groups[1].spec.machine_type = None;
        groups[1].spec.subnets = vec!["elsewhere".into()];
        let mut out = Vec::new();
        assert!(build(&c, &groups, &mut out).is_none());
        assert!(
            out.iter().any(|v| v.path.to_string() == "spec.maxSize"
                && v.object == ObjectKey::InstanceGroup("nodes".into())),
            "{out:?}"
        );
        groups[1].spec.max_size = Some(3);
        let mut out = Vec::new();
        assert!(build(&c, &groups, &mut out).is_none());
        let said: Vec<String> = out.iter().map(|v| v.path.to_string()).collect();
        assert!(said.contains(&"spec.machineType".to_string()), "{said:?}");
        assert!(said.contains(&"spec.subnets[0]".to_string()), "{said:?}");
        assert!(GroupSize::new(3, 2).is_none());
    }

    /// Metal: hosts with their connection defaults, each group standing for the hosts of its
    /// role (the first group of a role takes them all), no AWS part.
    #[test]
    fn metal_hosts_and_groups() {
        let c: Cluster = serde_saphyr::from_str(&format!(
            "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: lab\nspec:\n  cloudProvider: metal\n  kubernetesVersion: {DEFAULT_KUBERNETES_VERSION}\n  hosts:\n  - {{name: cp1, address: 198.18.0.11, roles: [control-plane, etcd]}}\n  - {{name: w1, address: 198.18.0.12, roles: [node], port: 2222}}\n  - {{name: w2, address: 198.18.0.13, roles: [node]}}\n"
        ))
        .unwrap();
        let group = |name: &str, yaml: &str| {
            new_instance_group("lab", name, serde_saphyr::from_str(yaml).unwrap())
        };
        let igs = [
            group("control-plane", "role: ControlPlane\n"),
            group("nodes", "role: Node\n"),
            group("more", "role: Node\n"),
        ];
        let r = resolve(&c, &igs).unwrap();
        let Platform::Metal(m) = &r.platform else {
            panic!("{:?}", r.platform)
        };
        assert!(r.aws().is_none());
        assert_eq!(r.addons.external_cloud_provider, None);
        assert_eq!(r.load_balancer, LoadBalancerType::None);
        let w1 = m.hosts.iter().find(|h| h.name == "w1").unwrap();
        assert_eq!((w1.user.as_str(), w1.port), ("root", 2222));
        let hosts = |g: &str| match &r.group(g).unwrap().placement {
            GroupPlacement::Metal { hosts } => hosts.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(hosts("control-plane"), ["cp1"]);
        assert_eq!(hosts("nodes"), ["w1", "w2"]);
        assert!(hosts("more").is_empty());
        assert_eq!(r.group("nodes").unwrap().size.max(), 2);
    }
}
