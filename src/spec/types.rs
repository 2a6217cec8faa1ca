//! The `kprov.dev/v1alpha1` objects: `Cluster` and `InstanceGroup`.
//!
//! Field names follow kops where kops has one, so specs read familiar to its users.
//! Every struct rejects unknown fields: a typo must never be silently ignored.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The `apiVersion` every kprov object carries.
pub const API_VERSION: &str = "kprov.dev/v1alpha1";
/// The `kind` of a Cluster object.
pub const KIND_CLUSTER: &str = "Cluster";
/// The `kind` of an InstanceGroup object.
pub const KIND_INSTANCE_GROUP: &str = "InstanceGroup";
/// Label that ties an InstanceGroup to its cluster (kops uses `kops.k8s.io/cluster`).
pub const CLUSTER_LABEL: &str = "kprov.dev/cluster";

/// An object's `metadata`, as in Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    /// The object's name: the cluster's DNS-style name (`demo.example.com`, or
    /// `NAME.k8s.local` for no DNS), or the instance group's name.
    pub name: String,
    /// Labels; an InstanceGroup without a `kprov.dev/cluster` label gets
    /// `kprov.dev/cluster: CLUSTER` (its other labels are kept).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Free-form annotations, kept as written.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// `kind: Cluster`: the cluster as a whole (kops's Cluster).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cluster {
    /// `kprov.dev/v1alpha1`.
    pub api_version: String,
    /// `Cluster`.
    pub kind: String,
    /// The cluster's name and labels.
    pub metadata: ObjectMeta,
    /// What the cluster is.
    pub spec: ClusterSpec,
}

/// `kind: InstanceGroup`: a set of machines with one role (kops's InstanceGroup).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceGroup {
    /// `kprov.dev/v1alpha1`.
    pub api_version: String,
    /// `InstanceGroup`.
    pub kind: String,
    /// The group's name and labels (`kprov.dev/cluster` ties it to its cluster).
    pub metadata: ObjectMeta,
    /// What the group is.
    pub spec: InstanceGroupSpec,
}

/// Where the cluster runs (`spec.cloudProvider`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CloudProvider {
    /// `aws`: kprov creates the network and instances.
    Aws,
    /// `metal`: existing hosts listed in `spec.hosts` (Kubespray's reach).
    Metal,
}

impl CloudProvider {
    /// The YAML spelling (`aws`, `metal`).
    pub fn as_str(self) -> &'static str {
        match self {
            CloudProvider::Aws => "aws",
            CloudProvider::Metal => "metal",
        }
    }
}

impl std::fmt::Display for CloudProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `Option` fields are the ones defaults fill in; the completed spec has them all set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSpec {
    /// `aws` or `metal`; required.
    pub cloud_provider: CloudProvider,
    /// AWS region; derived from the zones when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The Kubernetes release to install, `1.35.1` (a leading `v` is accepted); one kprov pins
    /// checksums for. Default: the newest pinned patch (Kubespray's `kube_version`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// The cluster's networks: VPC, subnets, pod and service ranges, CNI.
    #[serde(default)]
    pub networking: Networking,
    /// AWS: public or private subnets for the nodes, and the bastion. Default: `type: Public`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
    /// Where DNS records for the API and bastion go. Default on AWS: `Public` in the zone the
    /// cluster name implies (`demo.example.com` → `example.com`); `None` for `*.k8s.local`
    /// names and on metal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Dns>,
    /// How clients reach the API servers: load balancer, names, endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<Api>,
    /// AWS: the CIDRs allowed to reach SSH on the bastion, or on every instance of a public
    /// cluster without one (kops's `sshAccess`). Unset means 0.0.0.0/0, and the preview warns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_access: Option<Vec<String>>,
    /// AWS: the CIDRs allowed to reach the Kubernetes API (its load balancer, or the control
    /// planes without one; kops's `kubernetesApiAccess`). Unset means 0.0.0.0/0, and the
    /// preview warns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_api_access: Option<Vec<String>>,
    /// Where etcd runs. Default: `type: Stacked`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<Etcd>,
    /// The external cloud-controller-manager. Default on AWS: `provider: aws`; none on metal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_controller_manager: Option<CloudControllerManager>,
    /// The SSH key pair instances are created with (AWS). Default: `name: kprov-CLUSTER`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key: Option<SshKey>,
    /// Where node binaries and images come from: mirror, overrides, archives, bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assets: Option<Assets>,
    /// kube-proxy's configuration (kops's `kubeProxy`): the KubeProxyConfiguration kprov
    /// writes into kubeadm's init configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_proxy: Option<KubeProxy>,
    /// Kubelet settings beyond kprov's defaults (kops's `kubelet`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<Kubelet>,
    /// containerd settings (kops's `containerd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containerd: Option<Containerd>,
    /// What the node preflight requires of a host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight: Option<Preflight>,
    /// HTTP proxy the nodes reach the internet through (containerd, kubelet, downloads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<Proxy>,
    /// Hosts of a `metal` cluster (the inventory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<Host>,
}

impl ClusterSpec {
    /// A spec with only its provider set: what `spec: {cloudProvider: ...}` reads as, every
    /// other field left to the defaults.
    pub fn new(cloud_provider: CloudProvider) -> ClusterSpec {
        ClusterSpec {
            cloud_provider,
            region: None,
            kubernetes_version: None,
            networking: Networking::default(),
            topology: None,
            dns: None,
            api: None,
            ssh_access: None,
            kubernetes_api_access: None,
            etcd: None,
            cloud_controller_manager: None,
            ssh_key: None,
            assets: None,
            kube_proxy: None,
            kubelet: None,
            containerd: None,
            preflight: None,
            proxy: None,
            hosts: Vec::new(),
        }
    }
}

/// `spec.networking`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Networking {
    /// `networkCIDR`, AWS: the VPC's IPv4 range. Default `172.20.0.0/16` (as kops).
    #[serde(
        default,
        rename = "networkCIDR",
        skip_serializing_if = "Option::is_none"
    )]
    pub network_cidr: Option<String>,
    /// Adopt an existing VPC (or equivalent) by ID instead of creating one.
    #[serde(default, rename = "networkID", skip_serializing_if = "Option::is_none")]
    pub network_id: Option<String>,
    /// AWS: the subnets, one or more per zone; at least one is required.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnets: Vec<Subnet>,
    /// `podCIDR`: the pods' IPv4 range. Default `100.96.0.0/11` (kops's default). Kubespray's
    /// field is `kube_pods_subnet`; a cluster made from a Kubespray inventory keeps its range.
    #[serde(default, rename = "podCIDR", skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<String>,
    /// `serviceCIDR`: the services' IPv4 range. Default `100.64.0.0/13` (kops's default).
    /// Kubespray's field is `kube_service_addresses`; a cluster made from a Kubespray inventory
    /// keeps its range.
    #[serde(
        default,
        rename = "serviceCIDR",
        skip_serializing_if = "Option::is_none"
    )]
    pub service_cidr: Option<String>,
    /// The pod network add-on. Default `calico` (Kubespray's `kube_network_plugin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni: Option<Cni>,
}

/// One AWS subnet (kops's `subnets` entry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Subnet {
    /// The subnet's name, as instance groups' `subnets` refer to it.
    pub name: String,
    /// Its availability zone (`us-east-1a`); the region is derived from the first.
    pub zone: String,
    /// Its IPv4 range, inside `networkCIDR`.
    pub cidr: String,
    /// `type`: `Public`, `Private` or `Utility`.
    #[serde(rename = "type")]
    pub kind: SubnetType,
    /// Adopt an existing subnet by ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// A subnet's kind, as in kops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum SubnetType {
    /// Routed to the internet gateway; instances get public addresses.
    Public,
    /// Routed through its zone's NAT gateway; instances have private addresses only.
    Private,
    /// Public, for the bastion and NAT gateways of a private topology.
    Utility,
}

/// The pod network add-on (`spec.networking.cni`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Cni {
    /// `calico` (the default).
    Calico,
    /// `cilium`.
    Cilium,
    /// `flannel`.
    Flannel,
    /// The user installs a pod network themselves.
    None,
}

impl Cni {
    /// The YAML spelling (`calico`, `cilium`, `flannel`, `none`).
    pub fn as_str(self) -> &'static str {
        match self {
            Cni::Calico => "calico",
            Cni::Cilium => "cilium",
            Cni::Flannel => "flannel",
            Cni::None => "none",
        }
    }
}

/// `spec.topology` (AWS), as in kops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Topology {
    /// `type`: `Public` or `Private`.
    #[serde(rename = "type")]
    pub kind: TopologyType,
    /// The bastion's settings; a Bastion instance group is what creates one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bastion: Option<Bastion>,
    /// Which address kprov connects to over SSH (aws). Default: `Public` in public topology,
    /// `Bastion` in private topology. `Private` for operators whose machine reaches the VPC's
    /// private addresses (VPN, peering); `update cluster --ssh-private-address` does the same
    /// for one run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_address: Option<SshAddress>,
}

/// How kprov reaches cloud instances over SSH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum SshAddress {
    /// The instance's public address (public topology only).
    Public,
    /// The private address, through the bastion group's instance (ProxyJump).
    Bastion,
    /// The private address, directly.
    Private,
}

/// Where nodes are placed (`spec.topology.type`), as in kops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TopologyType {
    /// Nodes in public subnets with public addresses.
    Public,
    /// Nodes in private subnets behind NAT; reach them through a bastion.
    Private,
}

/// `spec.topology.bastion`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bastion {
    /// DNS name of the bastion (default `bastion.CLUSTER`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_name: Option<String>,
}

/// `spec.dns`: the hosted zone for the cluster's records (AWS Route 53).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Dns {
    /// `type`: `Public`, `Private` or `None`.
    #[serde(rename = "type")]
    pub kind: DnsType,
    /// The hosted zone records go into, found by name (e.g. `example.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// The kind of hosted zone (`spec.dns.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum DnsType {
    /// A public hosted zone.
    Public,
    /// A private hosted zone, resolvable inside the VPC only.
    Private,
    /// No records (gossip-style `*.k8s.local` names, metal).
    None,
}

/// `spec.api`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Api {
    /// Load balancer in front of the API servers; `None` for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancer>,
    /// DNS name clients use (default `api.CLUSTER`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_name: Option<String>,
    /// Bare metal: a fixed endpoint (virtual IP or external load balancer), `host[:port]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Bare metal: the IP address `endpoint`'s name resolves to on every host, kept in an
    /// /etc/hosts line (Kubespray's `loadbalancer_apiserver.address` beside
    /// `apiserver_loadbalancer_domain_name`); the endpoint's name then need not be in DNS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_address: Option<String>,
    /// Extra names and addresses in the API server certificate (Kubespray's
    /// `supplementary_addresses_in_ssl_keys`). Read when the first control plane is
    /// initialised; changing them later does not re-issue the certificate.
    #[serde(
        default,
        rename = "additionalSANs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub additional_sans: Vec<String>,
    /// The image of the local API proxy kprov runs as a static pod on nodes that are not
    /// control planes when no `endpoint` is set (default `docker.io/library/haproxy:3.2-alpine`;
    /// Kubespray's `haproxy_image_repo:haproxy_image_tag`). For sites that serve it from their
    /// own registry or import it from `assets.images`; it is started as
    /// `haproxy -f /usr/local/etc/haproxy/haproxy.cfg`, like the official image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_proxy_image: Option<String>,
}

/// `spec.api.loadBalancer`. Default: `type: Public` on AWS, `type: None` on metal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancer {
    /// `type`: `Public`, `Internal` or `None`.
    #[serde(rename = "type")]
    pub kind: LoadBalancerType,
}

/// The API load balancer's kind (`spec.api.loadBalancer.type`), as in kops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum LoadBalancerType {
    /// Internet-facing.
    Public,
    /// Reachable inside the VPC only.
    Internal,
    /// No load balancer (single control plane reached directly, or a local proxy on metal).
    None,
}

/// `spec.etcd`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Etcd {
    /// `type`: `Stacked` (etcd on the control planes) or `External` (etcd on hosts apart from
    /// them: a Kubespray `etcd` group distinct from `kube_control_plane`).
    #[serde(rename = "type")]
    pub kind: EtcdType,
}

/// Where etcd runs (`spec.etcd.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum EtcdType {
    /// etcd runs on the control-plane nodes (kubeadm's default).
    Stacked,
    /// etcd runs on dedicated hosts (the `etcd` role).
    External,
}

/// `spec.cloudControllerManager`: the provider's cloud-controller-manager kprov deploys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloudControllerManager {
    /// Provider whose CCM runs (`aws`, `gce`, `azure`, `openstack`, `vsphere`, `hcloud`);
    /// absent on plain bare metal, where no CCM runs and kubelets keep no cloud provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Override the image the provider table picks for the Kubernetes minor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Provider configuration (rendered into the provider's cloud config); keys are checked
    /// against the provider table.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, serde_json::Value>,
    /// Extra command-line flags (`name: value`, leading dashes optional; an empty value is a
    /// bare flag); one named like a flag kprov sets replaces it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_args: BTreeMap<String, String>,
}

/// `spec.sshKey`: the key pair kprov creates AWS instances with (kops's SSH public key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SshKey {
    /// Name of the cloud key pair (default `kprov-CLUSTER`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// OpenSSH public key text (`ssh-ed25519 AAAA… comment`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<String>,
}

/// `spec.assets`: where node binaries and images come from (Kubespray's `files_repo` and
/// offline settings).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Assets {
    /// Replace the upstream download hosts: an `http(s)://` mirror laid out like upstream, or
    /// a `file://` directory on the operator's machine (air-gapped sites).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<String>,
    /// Per-file overrides (URL and sha256) on top of the pinned table.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<AssetFile>,
    /// Container image archives (docker-archive or OCI-archive tars, as `ctr images import`
    /// takes them) imported into containerd's `k8s.io` namespace on every host before kubeadm
    /// runs: images without a registry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageArchive>,
    /// A bundle made by `kprov create bundle` (a tar file on the operator's machine): every
    /// binary and image is uploaded from it over ssh, verified on the host, and images are
    /// imported into containerd; nodes need no network beyond ssh (air-gapped sites).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
    /// Checksums of a Kubernetes patch release newer than kprov's table, read from the
    /// release's published `.sha256` files (upstream or `mirror`) by `create cluster` and
    /// pinned here, so every node and every later run installs the same bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checksums: Vec<PinnedChecksum>,
}

/// One pinned checksum: `name` is `COMPONENT/ARCH` (`kubeadm/amd64`), `version` the release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PinnedChecksum {
    /// `COMPONENT/ARCH`, e.g. `kubeadm/amd64`.
    pub name: String,
    /// The Kubernetes release it is for (`1.36.5`).
    pub version: String,
    /// 64 hex digits.
    pub sha256: String,
}

/// One image archive: `https://`/`http://` (downloaded by each host) or `file://` (a file on
/// the operator's machine, uploaded over ssh), with the sha256 of the archive file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageArchive {
    /// `https://…`, `http://…` or `file:///…`.
    pub url: String,
    /// 64 hex digits: the archive file's sha256, checked on every host.
    pub sha256: String,
}

/// kube-proxy's mode (KubeProxyConfiguration `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum ProxyMode {
    /// kube-proxy's default on Linux.
    #[default]
    Iptables,
    /// IPVS (the host needs the ip_vs modules).
    Ipvs,
    /// nftables (kube-proxy 1.33+ GA; the host kernel needs nf_tables).
    Nftables,
}

impl ProxyMode {
    /// The YAML spelling (`iptables`, `ipvs`, `nftables`).
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Iptables => "iptables",
            ProxyMode::Ipvs => "ipvs",
            ProxyMode::Nftables => "nftables",
        }
    }
}

/// `spec.kubeProxy`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeProxy {
    /// `iptables` (default), `ipvs` or `nftables` (kops's `kubeProxy.proxyMode`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_mode: Option<ProxyMode>,
    /// conntrack entries per CPU kube-proxy sets `nf_conntrack_max` to; `0` leaves the
    /// kernel's value alone (needed where `nf_conntrack_max` is read-only: containers,
    /// unprivileged LXC/LXD). Unset: kube-proxy's default (32768).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conntrack_max_per_core: Option<u32>,
}

/// `spec.kubelet`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Kubelet {
    /// `false` lets the kubelet run on a cgroup v1 host (KubeletConfiguration
    /// `failCgroupV1: false`, and kubeadm's SystemVerification preflight skipped); kubelet
    /// 1.35 and newer refuse cgroup v1 otherwise. Default `true`.
    #[serde(
        default,
        rename = "failCgroupV1",
        skip_serializing_if = "Option::is_none"
    )]
    pub fail_cgroup_v1: Option<bool>,
    /// The kubelet's hard eviction thresholds (kops's `kubelet.evictionHard`):
    /// `signal<quantity` pairs separated by commas, e.g.
    /// `memory.available<100Mi,nodefs.available<10%`. Written into the KubeletConfiguration
    /// every node gets; signals not named keep the kubelet's defaults only when none is given
    /// (the kubelet replaces the whole map).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_hard: Option<String>,
    /// The most pods the kubelet runs (kops's `kubelet.maxPods`; KubeletConfiguration
    /// `maxPods`). Unset: the kubelet's default (110). A change reaches running nodes through
    /// `update cluster --yes` (the `kubelet-config` ConfigMap) and `rolling-update` (each
    /// node's /var/lib/kubelet/config.yaml, the kubelet restarted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pods: Option<u32>,
}

/// The kubelet's eviction signals (KubeletConfiguration `evictionHard` keys).
pub const EVICTION_SIGNALS: &[&str] = &[
    "memory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

impl Kubelet {
    /// `evictionHard` as (signal, threshold) pairs in the order written; the error says which
    /// entry is wrong and why.
    pub fn eviction_hard(&self) -> Result<Vec<(String, String)>, String> {
        let Some(text) = self.eviction_hard.as_deref() else {
            return Ok(Vec::new());
        };
        let mut out: Vec<(String, String)> = Vec::new();
        for entry in text.split(',').map(str::trim) {
            let Some((signal, value)) = entry.split_once('<') else {
                return Err(format!(
                    "{entry:?} is not SIGNAL<QUANTITY (e.g. nodefs.available<10%)"
                ));
            };
            let (signal, value) = (signal.trim(), value.trim());
            if !EVICTION_SIGNALS.contains(&signal) {
                return Err(format!(
                    "{signal:?} is not a kubelet eviction signal (one of {})",
                    EVICTION_SIGNALS.join(", ")
                ));
            }
            let quantity = |v: &str| {
                let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
                let unit = &v[digits.len()..];
                !digits.is_empty()
                    && digits.chars().all(|c| c.is_ascii_digit() || c == '.')
                    && ["", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti"].contains(&unit)
            };
            let ok = match value.strip_suffix('%') {
                Some(pct) => pct.parse::<f64>().is_ok_and(|p| (0.0..=100.0).contains(&p)),
                None => quantity(value),
            };
            if !ok {
                return Err(format!(
                    "{value:?} is not a quantity or percentage for {signal} (e.g. 1Gi, 10%)"
                ));
            }
            if out.iter().any(|(s, _)| s == signal) {
                return Err(format!("{signal} is given twice"));
            }
            out.push((signal.to_string(), value.to_string()));
        }
        Ok(out)
    }
}

/// `spec.containerd`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Containerd {
    /// `true` makes containerd's CRI only raise containers' `oom_score_adj`, never lower it
    /// below its own: needed on hosts without CAP_SYS_RESOURCE (unprivileged LXC/LXD), where
    /// every pod sandbox fails otherwise. Default `false`.
    #[serde(
        default,
        rename = "restrictOOMScoreAdj",
        skip_serializing_if = "Option::is_none"
    )]
    pub restrict_oom_score_adj: Option<bool>,
    /// Registry mirrors, per upstream registry (`registry.k8s.io`, `docker.io`, `quay.io`,
    /// `ghcr.io`, or any registry name as image references spell it). kprov writes one
    /// containerd `hosts.toml` per entry under `/etc/containerd/certs.d/`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub registries: Vec<Registry>,
    /// Registry credentials, read from the state store's secrets (`registries/HOST`, set with
    /// `kprov create registry-credentials`) when the cluster is loaded; never part of the
    /// spec, never written back.
    #[serde(skip)]
    #[schemars(skip)]
    pub credentials: RegistryCredentials,
}

/// One upstream registry and the mirrors containerd tries for it, in order, before the
/// upstream itself (unless `fallback` is false).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Registry {
    /// The registry as image references name it (`docker.io`, `registry.k8s.io`,
    /// `harbor.example.com:5000`).
    pub name: String,
    /// The mirrors, tried in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<RegistryMirror>,
    /// `false`: never pull from the upstream itself (an air-gapped site, where trying it only
    /// costs a timeout). Default `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<bool>,
    /// Only for `registry.k8s.io`: the repository kubeadm's images are pulled from instead
    /// (`harbor.example.com/k8s`), kubeadm's `imageRepository`; the pause image follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_repository: Option<String>,
}

/// One mirror endpoint (containerd `[host."URL"]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistryMirror {
    /// `https://host[:port][/path]` (or `http://` for a plain-text registry).
    pub endpoint: String,
    /// containerd capabilities: `pull`, `resolve`, `push`. Default `[pull, resolve]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// Accept any TLS certificate (containerd `skip_verify`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_verify: Option<bool>,
    /// The endpoint's path is the full API path (containerd `override_path`, for registries
    /// served below a path prefix).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub override_path: Option<bool>,
    /// PEM CA bundle on the operator's machine that signs the mirror's certificate; uploaded
    /// beside hosts.toml.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// PEM client certificate and key on the operator's machine (mutual TLS); uploaded beside
    /// hosts.toml, the key with mode 0600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_file: Option<String>,
    /// The PEM private key of `clientCertFile`, on the operator's machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key_file: Option<String>,
}

impl RegistryMirror {
    /// `host[:port]` of the endpoint: the name its credentials are stored under.
    pub fn host(&self) -> Option<&str> {
        let rest = self
            .endpoint
            .strip_prefix("https://")
            .or_else(|| self.endpoint.strip_prefix("http://"))?;
        let host = rest.split('/').next().unwrap_or_default(); // split yields at least one item
        (!host.is_empty()).then_some(host)
    }
}

/// A registry's user name and password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryCredential {
    /// The registry user.
    pub username: String,
    /// The password or token; never printed.
    pub password: String,
}

impl RegistryCredential {
    /// What may be shown of it: the user and a sha256 of `user:password`.
    pub fn digest(&self) -> String {
        use sha2::Digest;
        let d = sha2::Sha256::digest(format!("{}:{}", self.username, self.password));
        format!("sha256:{}", hex::encode(d))
    }
}

/// Never prints the password, whatever logs or panics show.
impl std::fmt::Debug for RegistryCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RegistryCredential({}, {})",
            self.username,
            self.digest()
        )
    }
}

/// Credentials per mirror host (`host[:port]`).
#[derive(Debug, Clone, Default)]
pub struct RegistryCredentials(pub BTreeMap<String, RegistryCredential>);

/// Credentials are not part of what a spec says: a spec read from the store (with them) and
/// the same spec read from a file (without) are equal, so no edit or replace sees a change
/// that is not in the spec.
impl PartialEq for RegistryCredentials {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for RegistryCredentials {}

/// An HTTP(S) forward proxy for containerd, the kubelet and kprov's downloads on nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Proxy {
    /// `http://host:port` for plain HTTP requests (HTTP_PROXY).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
    /// `http://host:port` for HTTPS requests (HTTPS_PROXY).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https: Option<String>,
    /// Hosts, domains (`.example.com`) and CIDRs reached directly. kprov always adds the
    /// node addresses, the pod and service CIDRs, the API endpoint, `localhost,127.0.0.1`
    /// and `.svc,.cluster.local`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_proxy: Vec<String>,
}

/// `spec.preflight`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Preflight {
    /// `true` (default): a host whose clock is not NTP-synchronised fails preflight. `false`
    /// makes it a warning, for hosts whose clock is kept by someone else (containers share
    /// their host's clock and report `NTPSynchronized=no`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_clock_sync: Option<bool>,
}

/// One `spec.assets.files` override: where one component is downloaded from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AssetFile {
    /// The component (`kubeadm`: every architecture) or `COMPONENT/ARCH` (`kubeadm/arm64`).
    pub name: String,
    /// Where it is fetched from (`https://`, `http://` or `file://`).
    pub url: String,
    /// 64 hex digits: the file's sha256.
    pub sha256: String,
}

/// What a metal host is for (`spec.hosts[].roles`; Kubespray's inventory groups).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum HostRole {
    /// `control-plane` (Kubespray's `kube_control_plane`).
    ControlPlane,
    /// `node`: runs workloads (Kubespray's `kube_node`).
    Node,
    /// `etcd`: an etcd member (Kubespray's `etcd`); with `External` etcd, a dedicated host.
    Etcd,
}

impl HostRole {
    /// The YAML spelling (`control-plane`, `node`, `etcd`).
    pub fn as_str(self) -> &'static str {
        match self {
            HostRole::ControlPlane => "control-plane",
            HostRole::Node => "node",
            HostRole::Etcd => "etcd",
        }
    }
}

/// One bare-metal host (kprov inventory entry, or imported from Kubespray).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Host {
    /// The host's name, which becomes its Kubernetes node name.
    pub name: String,
    /// Where ssh connects (host name or IP).
    pub address: String,
    /// Address Kubernetes services bind to (Kubespray's `ip`); defaults to `address`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Address other hosts reach this one at (Kubespray's `access_ip`).
    #[serde(default, rename = "accessIP", skip_serializing_if = "Option::is_none")]
    pub access_ip: Option<String>,
    /// The SSH user (Kubespray's `ansible_user`). Default `root`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The SSH port (Kubespray's `ansible_port`). Default 22.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The private key file for `ssh -i` on the operator's machine (Kubespray's
    /// `ansible_ssh_private_key_file`). Unset: ssh's own configuration and agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_path: Option<String>,
    /// Jump host, `[user@]host[:port]`, passed to ssh as ProxyJump.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bastion: Option<String>,
    /// What the host is for; a host may have several roles.
    pub roles: Vec<HostRole>,
    /// Labels its node registers with (Kubespray's `node_labels`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `key[=value]:Effect`, as kubectl taint writes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
}

/// A host with only a name, an address and roles (no user, port, key, bastion, labels or
/// taints of its own), for tests.
#[cfg(test)]
pub(crate) fn test_host(name: &str, address: &str, roles: &[HostRole]) -> Host {
    Host {
        name: name.into(),
        address: address.into(),
        ip: None,
        access_ip: None,
        user: None,
        port: None,
        key_path: None,
        bastion: None,
        roles: roles.to_vec(),
        labels: BTreeMap::new(),
        taints: vec![],
    }
}

impl Host {
    /// Whether this host is one of the machines of an instance group of `role`: control planes
    /// by their role; nodes are the hosts with the node role that are not control planes
    /// (a control plane that also runs workloads is counted once, as a control plane); etcd-only
    /// hosts and bastions are in no group. How `defaults` sizes metal groups, how `resolve`
    /// places hosts and how `create` counts them.
    pub fn in_group_of(&self, role: InstanceGroupRole) -> bool {
        let has = |r| self.roles.contains(&r);
        match role {
            InstanceGroupRole::ControlPlane => has(HostRole::ControlPlane),
            InstanceGroupRole::Node => has(HostRole::Node) && !has(HostRole::ControlPlane),
            InstanceGroupRole::Bastion => false,
        }
    }
}

/// An instance group's `spec.role`, as in kops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum InstanceGroupRole {
    /// Control-plane machines (API server, scheduler, controller manager; stacked etcd).
    ControlPlane,
    /// Worker nodes.
    Node,
    /// An SSH jump host (AWS); a private topology's instances are reached through it.
    Bastion,
}

impl InstanceGroupRole {
    /// The YAML spelling (`ControlPlane`, `Node`, `Bastion`).
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceGroupRole::ControlPlane => "ControlPlane",
            InstanceGroupRole::Node => "Node",
            InstanceGroupRole::Bastion => "Bastion",
        }
    }
}

/// An InstanceGroup's `spec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceGroupSpec {
    /// `ControlPlane`, `Node` or `Bastion`; required.
    pub role: InstanceGroupRole,
    /// AWS: the EC2 instance type. Default `t3.medium` (`t3.micro` for a Bastion).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_type: Option<String>,
    /// AWS: an `ami-` ID, or an image name pattern (`OWNER/NAME-*`) resolved once and pinned.
    /// Default: Canonical's Ubuntu 24.04 LTS for the region's partition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The fewest instances. Default 1; on metal, the number of hosts of the role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_size: Option<u32>,
    /// The most instances. Default `minSize`; on metal, the number of hosts of the role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size: Option<u32>,
    /// AWS: the names of the subnets its instances go to. Default: every subnet of the
    /// topology's type for the role (Utility for a private topology's bastion).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnets: Vec<String>,
    /// How a rolling update replaces its instances. Default: control planes one at a time
    /// without surge (`maxSurge: 0, maxUnavailable: 1`), others surge first (`maxSurge: 1,
    /// maxUnavailable: 0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
    /// Labels the group's nodes register with (kops's `nodeLabels`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// `key[=value]:Effect`, as kubectl taint writes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
    /// The user kprov logs in as over SSH (aws). Default: from the image family (`ubuntu`
    /// for Ubuntu, `ec2-user` for Amazon Linux, `admin` for Debian); required for an image
    /// given by `ami-` ID whose family kprov cannot tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_user: Option<String>,
}

/// `spec.rollingUpdate` of an instance group (kops's `rollingUpdate`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RollingUpdate {
    /// Extra instances started before old ones go: a count (`1`) or a percentage (`25%`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_surge: Option<IntOrPercent>,
    /// How many instances may be out of service at once: a count or a percentage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrPercent>,
}

/// `3` or `"25%"`, like Kubernetes' IntOrString for rollout bounds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum IntOrPercent {
    /// A count of instances.
    Int(u32),
    /// A percentage of the group's size, `"25%"`.
    Percent(String),
}

impl IntOrPercent {
    /// Resolves against a group size; percentages round up for surge-like use when `round_up`.
    pub fn resolve(&self, total: u32, round_up: bool) -> Option<u32> {
        match self {
            IntOrPercent::Int(n) => Some(*n),
            IntOrPercent::Percent(p) => {
                let n: u32 = p.strip_suffix('%')?.trim().parse().ok()?;
                if n > 100 {
                    return None;
                }
                let scaled = total as u64 * n as u64;
                Some(if round_up {
                    scaled.div_ceil(100)
                } else {
                    scaled / 100
                } as u32)
            }
        }
    }
}

impl Cluster {
    /// The cluster's `metadata.name`.
    pub fn name(&self) -> &str {
        &self.metadata.name
    }

    /// The provider whose cloud-controller-manager runs, if any. When set, every kubelet must
    /// run with `--cloud-provider=external` and kube-apiserver / kube-controller-manager with no
    /// `--cloud-provider`; when `None` nothing may set it, or nodes stay tainted uninitialized.
    pub fn external_cloud_provider(&self) -> Option<&str> {
        self.spec
            .cloud_controller_manager
            .as_ref()
            .and_then(|c| c.provider.as_deref())
            .filter(|p| !p.is_empty() && *p != "none")
    }
}

/// Sum of the minimum sizes of the groups with `role`, in u64: sizes are user input and
/// several near `u32::MAX` would overflow a u32 sum.
pub fn total_min_size(groups: &[InstanceGroup], role: InstanceGroupRole) -> u64 {
    groups
        .iter()
        .filter(|g| g.spec.role == role)
        .map(|g| u64::from(g.spec.min_size.unwrap_or(1)))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ClusterSpec::new` is the spec a user gets by writing the provider alone.
    #[test]
    fn a_new_spec_is_the_provider_alone() {
        for (yaml, cloud) in [
            ("cloudProvider: aws\n", CloudProvider::Aws),
            ("cloudProvider: metal\n", CloudProvider::Metal),
        ] {
            let read: ClusterSpec = serde_saphyr::from_str(yaml).unwrap();
            assert_eq!(read, ClusterSpec::new(cloud));
        }
    }

    fn host(roles: &[HostRole]) -> Host {
        test_host("h", "198.18.0.1", roles)
    }

    /// The one rule sizing metal groups and placing hosts in them: a control plane that is
    /// also a node is in the control-plane group only; etcd-only hosts are in no group.
    #[test]
    fn a_host_is_in_the_group_of_one_role_at_most() {
        use HostRole::*;
        use InstanceGroupRole as G;
        let cases: [(&[HostRole], [bool; 3]); 5] = [
            (&[ControlPlane], [true, false, false]),
            (&[ControlPlane, Node, Etcd], [true, false, false]),
            (&[Node], [false, true, false]),
            (&[Node, Etcd], [false, true, false]),
            (&[Etcd], [false, false, false]),
        ];
        for (roles, want) in cases {
            let h = host(roles);
            let got = [G::ControlPlane, G::Node, G::Bastion].map(|g| h.in_group_of(g));
            assert_eq!(got, want, "{roles:?}");
        }
    }
}
