//! Turns a completed cluster and its hosts into the steps that run on each node.
//!
//! Everything here is pure: no I/O except reading `file://` assets to upload them. The
//! orchestrator (`orchestrate`) decides which of these step lists run where and when.
//!
//! HA endpoint on bare metal (Kubespray's approach): when `spec.api.endpoint` names an
//! external load balancer or virtual IP, it is the `controlPlaneEndpoint`. Otherwise the
//! endpoint is the name `api.internal.CLUSTER:6443`, which each host resolves through a line in
//! its own /etc/hosts: control planes to themselves, workers to 127.0.0.1 where a local haproxy
//! (static pod) balances over every control plane. While a host joins, the name points at the
//! first control plane (its own proxy or API server does not run yet). This works the same for
//! 1 and 3 control planes, needs no extra machine, and adding control planes later only
//! rewrites the proxies' backend lists.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tera::Tera;

use super::shell::{enable_template_quoting, sh_quote};
use crate::inventory::parse_taint;
use crate::nodes::Target;
use crate::nodes::owner::{OWNER_FILE, Owner};
use crate::nodes::roll::{PROVISIONED_FILE, Provisioned};
use crate::script;
use crate::spec::assets::{self, Arch, Asset, Component, ImageAsset, Install, Source};
use crate::spec::validate::{
    check_kubelet_label, check_label_key, check_label_value, check_taint, is_dns_subdomain,
};
use crate::spec::{Cluster, EtcdType, Host, HostRole, ProxyMode, ResolvedCluster};
use crate::ssh::task::{Arrival, RemoteFile, Step};

use crate::spec::assets::API_PROXY_IMAGE;
/// kprov's own sysctl file, the only one the kernel step applies, and its copy once applied.
const SYSCTL_FILE: &str = "/etc/sysctl.d/99-kprov.conf";
const SYSCTL_APPLIED: &str = "/var/lib/kprov/sysctl.applied";

/// The kernel step: modules and sysctls a node needs, applied without assuming more of the
/// host than it must have. A module built into the kernel counts as present (br_netfilter
/// shows as /proc/sys/net/bridge, overlay in /proc/filesystems), so modprobe runs only for a
/// module that is missing, and its absence is an error only then. Only kprov's own sysctl
/// file is applied (`sysctl --system` also re-applies every other file, whose keys may be
/// read-only here: containers, LXC/LXD); a key that cannot be written but already holds the
/// wanted value is fine (a read-only /proc/sys).
const KERNEL_SETTINGS: &str = r#"set -e
have_overlay() { grep -qw overlay /proc/filesystems 2>/dev/null || [ -d /sys/module/overlay ]; }
have_br_netfilter() { [ -d /proc/sys/net/bridge ]; }
for m in overlay br_netfilter; do
  "have_$m" && continue
  if ! command -v modprobe >/dev/null 2>&1; then
    echo "kernel module $m is needed, not loaded, and modprobe is not installed: install kmod or load $m on this host" >&2
    exit 1
  fi
  modprobe "$m" || { echo "kernel module $m is needed and modprobe $m failed" >&2; exit 1; }
  "have_$m" || { echo "kernel module $m loaded but not in effect" >&2; exit 1; }
done
sed -n 's/^[[:space:]]*\([a-z0-9_.-]*\)[[:space:]]*=[[:space:]]*\([^[:space:]]*\)[[:space:]]*$/\1 \2/p' /etc/sysctl.d/99-kprov.conf |
while read -r key want; do
  [ "$(sysctl -n "$key" 2>/dev/null)" = "$want" ] && continue
  if ! sysctl -q -w "$key=$want" >/dev/null 2>&1; then
    echo "sysctl $key cannot be set to $want (it is $(sysctl -n "$key" 2>/dev/null || echo missing))" >&2
    exit 1
  fi
done
mkdir -p /var/lib/kprov
cp /etc/sysctl.d/99-kprov.conf /var/lib/kprov/sysctl.applied
swapoff -a
# Keep swap off across reboots.
if [ -f /etc/fstab ]; then sed -i '/^[^#].*[[:space:]]swap[[:space:]]/s/^/#kprov: /' /etc/fstab; fi
"#;

/// kube-proxy's ipvs mode needs the IPVS modules (the ones Kubespray loads for
/// `kube_proxy_mode: ipvs`); without them kube-proxy refuses the mode. Loaded only when
/// missing (`/sys/module/NAME` exists for a loaded or built-in module) and kept across reboots.
const IPVS_MODULES: &[&str] = &["ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh"];
const IPVS_MODULES_FILE: &str = "/etc/modules-load.d/kprov-ipvs.conf";
const IPVS_LOADED: &str = "[ -d /sys/module/ip_vs ] && [ -d /sys/module/ip_vs_rr ] && \
                           [ -d /sys/module/ip_vs_wrr ] && [ -d /sys/module/ip_vs_sh ]";
const IPVS_LOAD: &str = r#"set -e
for m in ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh; do
  [ -d "/sys/module/$m" ] && continue
  if ! command -v modprobe >/dev/null 2>&1; then
    echo "kernel module $m is needed for kube-proxy's ipvs mode, not loaded, and modprobe is not installed" >&2
    exit 1
  fi
  modprobe "$m" || { echo "kernel module $m is needed for kube-proxy's ipvs mode and modprobe $m failed" >&2; exit 1; }
done
"#;

/// Marker on kprov's line in /etc/hosts.
const HOSTS_MARK: &str = "# kprov-api";
pub(crate) const KPROV_DIR: &str = "/etc/kubernetes/kprov";
pub(crate) const CERTIFICATE_KEY_FILE: &str = "/etc/kubernetes/kprov/certificate-key";
pub(crate) const JOIN_COMMAND_FILE: &str = "/etc/kubernetes/kprov/join-command";
pub(crate) const FACTS_FILE: &str = "/var/lib/kprov/facts";
pub(crate) const ADMIN_CONF: &str = "/etc/kubernetes/admin.conf";
pub(crate) const KUBELET_CONF: &str = "/etc/kubernetes/kubelet.conf";
pub(crate) const CA_CERT: &str = "/etc/kubernetes/pki/ca.crt";
/// Restarts containerd and waits (bounded, 60 s) until its CRI plugin answers; otherwise fails
/// with what crictl and containerd's log say about it.
const CONTAINERD_RESTART: &str = "set -e\nsystemctl daemon-reload\nsystemctl enable containerd\n\
systemctl restart containerd\ni=0\n\
until crictl --timeout 5s info >/dev/null 2>&1; do\n  i=$((i+1))\n  if [ \"$i\" -ge 60 ]; then\n    \
echo 'containerd is active but its CRI plugin does not answer (kubeadm and the kubelet need it):' >&2\n    \
crictl --timeout 5s info 2>&1 | tail -n 3 >&2 || true\n    \
journalctl -u containerd --no-pager 2>/dev/null | grep -iE 'cri|inotify' | tail -n 5 >&2 || true\n    exit 1\n  fi\n  \
sleep 1\ndone\n";

pub(crate) const ETCD_CA_CERT: &str = "/etc/kubernetes/pki/etcd/ca.crt";
pub(crate) const ETCD_CA_KEY: &str = "/etc/kubernetes/pki/etcd/ca.key";
pub(crate) const ETCD_CLIENT_CERT: &str = "/etc/kubernetes/pki/apiserver-etcd-client.crt";
pub(crate) const ETCD_CLIENT_KEY: &str = "/etc/kubernetes/pki/apiserver-etcd-client.key";
pub(crate) const ETCD_SERVER_CERT: &str = "/etc/kubernetes/pki/etcd/server.crt";
pub(crate) const ETCD_SERVER_KEY: &str = "/etc/kubernetes/pki/etcd/server.key";
pub(crate) const ETCD_PEER_CERT: &str = "/etc/kubernetes/pki/etcd/peer.crt";
pub(crate) const ETCD_PEER_KEY: &str = "/etc/kubernetes/pki/etcd/peer.key";
pub(crate) const ETCD_HEALTHCHECK_CERT: &str = "/etc/kubernetes/pki/etcd/healthcheck-client.crt";
pub(crate) const ETCD_HEALTHCHECK_KEY: &str = "/etc/kubernetes/pki/etcd/healthcheck-client.key";
/// Host-deployed etcd (external etcd): binaries, configuration, unit and data.
pub(crate) const ETCD_BIN: &str = "/usr/local/bin/etcd";
pub(crate) const ETCD_CONFIG: &str = "/etc/etcd/etcd.conf.yml";
pub(crate) const ETCD_UNIT: &str = "/etc/systemd/system/etcd.service";
pub(crate) const ETCD_DATA_DIR: &str = "/var/lib/etcd";
/// Where a backup's snapshot is written on a member: inside the data directory, which
/// kubeadm's etcd static pod mounts at the same path, so both topologies find it there.
pub const ETCD_SNAPSHOT: &str = "/var/lib/etcd/kprov-snapshot.db";
/// Where a restore uploads the snapshot on each member.
pub(crate) const ETCD_RESTORE_UPLOAD: &str = "/var/lib/kprov/etcd-restore.db";
/// Static pod manifests set aside while etcd is restored.
pub(crate) const ETCD_PAUSED_DIR: &str = "/etc/kubernetes/kprov/paused";
pub(crate) const APISERVER_MANIFEST: &str = "/etc/kubernetes/manifests/kube-apiserver.yaml";
pub(crate) const STACKED_ETCD_MANIFEST: &str = "/etc/kubernetes/manifests/etcd.yaml";
/// kubeadm's file of kubelet flags, and kprov's copy of the flags last applied.
pub(crate) const KUBELET_FLAGS: &str = "/var/lib/kubelet/kubeadm-flags.env";
const KUBELET_FLAGS_APPLIED: &str = "/var/lib/kprov/kubelet-flags.applied";
/// The kubelet's configuration as kubeadm writes it at init/join/upgrade.
pub(crate) const KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";
const KUBELET_CONFIG_APPLIED: &str = "/var/lib/kprov/kubelet-config.applied";
/// The version a member's `kubeadm upgrade` last finished at, and the kubelet binary restarted.
const UPGRADED_MARKER: &str = "/var/lib/kprov/kubeadm-upgraded";
const KUBELET_RESTARTED: &str = "/var/lib/kprov/kubelet-restarted";
const CRI_SOCKET: &str = "unix:///run/containerd/containerd.sock";
/// Where uploaded assets wait on a host (binaries' and image archives' `file://` sources), and
/// where image archives are downloaded before their checksum is verified.
pub(crate) const CACHE_DIR: &str = "/var/lib/kprov/cache";
/// One marker per imported image archive, named by its sha256 (holding its URL).
pub(crate) const IMAGES_DIR: &str = "/var/lib/kprov/images";

/// The marker a host keeps once the image archive with `sha256` is imported.
pub(crate) fn image_marker(sha256: &str) -> String {
    format!("{IMAGES_DIR}/{sha256}")
}

const SHORT: Duration = Duration::from_secs(120);
const LONG: Duration = Duration::from_secs(600);
/// The binaries step's watchdog counts the whole batch (uploads, hooks, downloads) against
/// one limit: each binary keeps the budget its own step had before they were one.
const BINARIES_TIMEOUT: Duration =
    Duration::from_secs(LONG.as_secs() * Component::NODE_BINARIES.len() as u64);
/// An image archive uploads or downloads hundreds of MB before it is imported: the image
/// step's timeout is this per archive.
const IMAGE_TIMEOUT: Duration = Duration::from_secs(1800);
/// Image archives imported at the same time on a host: containerd unpacks each on its own
/// (decompression is one core per layer), so a few at once use the host's cores and overlap
/// one import's disk waits with another's work, without flooding a small host.
pub(crate) const IMPORTS_AT_ONCE: usize = 4;

const TEMPLATES: &[(&str, &str)] = &[
    (
        "node/preflight.sh.tera",
        include_str!("../../templates/node/preflight.sh.tera"),
    ),
    (
        "node/modules-load.conf.tera",
        include_str!("../../templates/node/modules-load.conf.tera"),
    ),
    (
        "node/sysctl.conf.tera",
        include_str!("../../templates/node/sysctl.conf.tera"),
    ),
    (
        "node/install.sh.tera",
        include_str!("../../templates/node/install.sh.tera"),
    ),
    (
        "node/containerd-config.toml.tera",
        include_str!("../../templates/node/containerd-config.toml.tera"),
    ),
    (
        "node/containerd.service.tera",
        include_str!("../../templates/node/containerd.service.tera"),
    ),
    (
        "node/crictl.yaml.tera",
        include_str!("../../templates/node/crictl.yaml.tera"),
    ),
    (
        "node/kubelet.service.tera",
        include_str!("../../templates/node/kubelet.service.tera"),
    ),
    (
        "node/10-kubeadm.conf.tera",
        include_str!("../../templates/node/10-kubeadm.conf.tera"),
    ),
    (
        "node/node-registration.yaml.tera",
        include_str!("../../templates/node/node-registration.yaml.tera"),
    ),
    (
        "node/kubeadm-init.yaml.tera",
        include_str!("../../templates/node/kubeadm-init.yaml.tera"),
    ),
    (
        "node/kubeadm-join.yaml.tera",
        include_str!("../../templates/node/kubeadm-join.yaml.tera"),
    ),
    (
        "node/haproxy.cfg.tera",
        include_str!("../../templates/node/haproxy.cfg.tera"),
    ),
    (
        "node/api-proxy.yaml.tera",
        include_str!("../../templates/node/api-proxy.yaml.tera"),
    ),
    (
        "node/reset.sh.tera",
        include_str!("../../templates/node/reset.sh.tera"),
    ),
    (
        "node/kubeadm-etcd.yaml.tera",
        include_str!("../../templates/node/kubeadm-etcd.yaml.tera"),
    ),
    (
        "node/etcd.conf.yml.tera",
        include_str!("../../templates/node/etcd.conf.yml.tera"),
    ),
    (
        "node/etcd.service.tera",
        include_str!("../../templates/node/etcd.service.tera"),
    ),
    (
        "node/image-import.sh.tera",
        include_str!("../../templates/node/image-import.sh.tera"),
    ),
];

/// Why the steps for a host could not be rendered from the spec.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// A setting defaults should have filled is unset: the spec was not completed.
    #[error("{0} is not set (the spec must be completed with defaults first)")]
    Missing(&'static str),
    /// A pinned asset (binary, image) cannot be named for this version or architecture.
    #[error(transparent)]
    Assets(#[from] assets::AssetError),
    /// A host's own settings cannot be rendered.
    #[error("host {host:?}: {message}")]
    Host {
        /// The host's inventory name.
        host: String,
        /// What is wrong with it.
        message: String,
    },
    /// `spec.api.endpoint` is not `host[:port]`.
    #[error("spec.api.endpoint: {0:?} is not host[:port]")]
    BadEndpoint(String),
    /// The cluster's name cannot name DNS records and certificates.
    #[error("cluster name {0:?} is not a DNS name")]
    BadName(String),
    /// A spec field holds a value the node configuration cannot take.
    #[error("{field}: {message}")]
    BadField {
        /// The field's path in the spec.
        field: &'static str,
        /// What is wrong with its value.
        message: String,
    },
    /// No host has the control-plane role.
    #[error("the cluster has no control-plane host")]
    NoControlPlane,
    /// A node template failed to render (a kprov bug, or a value the template cannot take).
    #[error("template {name}: {message}")]
    Template {
        /// The template's name.
        name: String,
        /// Tera's error.
        message: String,
    },
    /// A local (`file://`) asset cannot be read.
    #[error("asset {path}: cannot read: {message}")]
    LocalAsset {
        /// The file's path.
        path: String,
        /// The read error.
        message: String,
    },
    /// A local asset's sha256 is not the pinned one: nothing is uploaded.
    #[error(
        "asset {path} ({name} {version}): checksum mismatch: expected sha256 {expected}, got {actual}; nothing uploaded or installed"
    )]
    LocalChecksum {
        /// The file's path.
        path: String,
        /// The component (`kubelet`, `containerd`, ...).
        name: String,
        /// The component's version.
        version: String,
        /// The pinned sha256 (hex).
        expected: String,
        /// The file's sha256 (hex).
        actual: String,
    },
    /// An image archive of the spec cannot be uploaded.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// `spec.assets.bundle` cannot serve this cluster (refused before anything is uploaded).
    #[error("{0}")]
    Bundle(String),
    /// The spec's registry mirrors or proxy cannot be turned into node files.
    #[error(transparent)]
    Mirror(#[from] crate::spec::mirrors::MirrorError),
}

/// A `file://` image archive that cannot be uploaded: found before any host is changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// The archive cannot be read.
    #[error("image archive {url} (spec.assets.images): cannot read: {message}")]
    Read {
        /// The archive's URL in the spec.
        url: String,
        /// The read error.
        message: String,
    },
    /// The bundle does not hold the image, or its member cannot be read.
    #[error("image {url} (spec.assets.bundle): {message}")]
    Bundle {
        /// The image archive's URL in the spec.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// The archive's sha256 is not the one the spec pins: nothing is uploaded.
    #[error(
        "image archive {url} (spec.assets.images): checksum mismatch: expected sha256 {expected}, got {actual}; nothing uploaded or imported"
    )]
    Checksum {
        /// The archive's URL in the spec.
        url: String,
        /// The pinned sha256 (hex).
        expected: String,
        /// The archive's sha256 (hex).
        actual: String,
    },
}

/// How nodes reach the API servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// An external load balancer or VIP (`spec.api.endpoint`).
    Fixed {
        /// Its DNS name or address.
        host: String,
        /// The port it serves the API on (the `controlPlaneEndpoint` port).
        port: u16,
    },
    /// `NAME:6443` resolved per host through /etc/hosts (see the module docs).
    LocalProxy {
        /// The name the API server certificate and /etc/hosts carry.
        name: String,
    },
}

impl Endpoint {
    pub(crate) fn host(&self) -> &str {
        match self {
            Endpoint::Fixed { host, .. } => host,
            Endpoint::LocalProxy { name } => name,
        }
    }

    pub(crate) fn address(&self) -> String {
        match self {
            Endpoint::Fixed { host, port } => format!("{host}:{port}"),
            Endpoint::LocalProxy { name } => format!("{name}:6443"),
        }
    }
}

/// Secrets a joining node needs, read back from the first control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinSecrets {
    pub(crate) token: String,
    /// Hex sha256 of the cluster CA's SubjectPublicKeyInfo.
    pub(crate) ca_cert_hash: String,
    /// Decrypts the control-plane certificates uploaded by `--upload-certs`.
    pub(crate) certificate_key: String,
}

/// Renders the steps each provisioning phase runs on a host, from the resolved cluster and the
/// targets.
pub struct Renderer {
    tera: Tera,
    cluster_name: String,
    kubernetes_version: String,
    /// The minor of `kubernetes_version`, typed (what changes with it is chosen by it).
    minor: u32,
    endpoint: Endpoint,
    /// `spec.api.endpointAddress`: where a fixed endpoint's name points in every host's
    /// /etc/hosts (Kubespray's `loadbalancer_apiserver.address` with a domain name).
    endpoint_address: Option<String>,
    /// `spec.api.additionalSANs`.
    extra_sans: Vec<String>,
    pod_cidr: String,
    service_cidr: String,
    etcd: EtcdType,
    cloud_external: bool,
    targets: Vec<Target>,
    assets: Vec<Asset>,
    /// Extra API server certificate names (a cloud load balancer's DNS name).
    cloud_sans: Vec<String>,
    /// The sandbox image kubeadm of this minor expects (`registry.k8s.io/pause:TAG`).
    pause_image: String,
    /// `spec.api.localProxyImage`, or kprov's default.
    api_proxy_image: String,
    node: NodeSettings,
    images: Vec<ImageAsset>,
    /// `spec.assets.bundle`, checked against its manifest when the renderer is made.
    bundle: Option<std::sync::Arc<crate::bundle::Bundle>>,
    /// The `file://` archives' contents (`None` for URLs), read and verified once per run on
    /// first use: every host's upload shares one buffer, hashed once by the SSH engine.
    image_files: OnceLock<Result<Vec<Option<Bytes>>, ImageError>>,
    /// The image references each archive of `images` names (read once from the loaded bytes;
    /// empty for a URL the hosts download).
    image_refs: OnceLock<Vec<Vec<String>>>,
    /// `file://` binaries read and verified against their pinned sha256, by path: read once
    /// per run, and every host's upload shares the buffer (hashed here, not again).
    /// `file://` binaries already verified, by path and the sha256 they were verified against
    /// (two assets may name one path with different pins: each is checked).
    local_binaries:
        std::sync::Mutex<std::collections::HashMap<(std::path::PathBuf, String), Bytes>>,
    /// `spec.containerd.registries` as files under /etc/containerd/certs.d.
    registry_files: Vec<crate::spec::mirrors::NodeFile>,
    /// kubeadm's `imageRepository` (registry.k8s.io rewritten), if any.
    image_repository: Option<String>,
    /// `spec.proxy` and what its no-proxy list is completed from (the endpoint may change
    /// with [`Renderer::with_cloud_api`]).
    proxy_spec: crate::spec::ClusterSpec,
    proxy: Option<crate::spec::mirrors::ProxyEnv>,
}

/// The host-level settings of `spec.kubeProxy`, `spec.kubelet`, `spec.containerd` and
/// `spec.preflight`, with their defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeSettings {
    proxy_mode: ProxyMode,
    conntrack_max_per_core: Option<u32>,
    /// KubeletConfiguration `failCgroupV1` (kubelet's default, `true`, unless the spec says).
    fail_cgroup_v1: bool,
    restrict_oom_score_adj: bool,
    require_clock_sync: bool,
    /// KubeletConfiguration `evictionHard` (empty: the kubelet's defaults).
    eviction_hard: Vec<(String, String)>,
    /// KubeletConfiguration `maxPods` (`None`: the kubelet's default, 110).
    max_pods: Option<u32>,
}

impl NodeSettings {
    pub(crate) fn of(spec: &crate::spec::ClusterSpec) -> Result<NodeSettings, RenderError> {
        let proxy = spec.kube_proxy.clone().unwrap_or_default(); // no kubeProxy section: kube-proxy's defaults
        Ok(NodeSettings {
            proxy_mode: proxy.proxy_mode.unwrap_or_default(), // no proxyMode: the default mode
            conntrack_max_per_core: proxy.conntrack_max_per_core,
            fail_cgroup_v1: spec
                .kubelet
                .as_ref()
                .and_then(|k| k.fail_cgroup_v1)
                .unwrap_or(true),
            restrict_oom_score_adj: spec
                .containerd
                .as_ref()
                .and_then(|c| c.restrict_oom_score_adj)
                .unwrap_or(false),
            require_clock_sync: spec
                .preflight
                .as_ref()
                .and_then(|p| p.require_clock_sync)
                .unwrap_or(true),
            eviction_hard: match &spec.kubelet {
                Some(k) => k.eviction_hard().map_err(|message| RenderError::BadField {
                    field: "spec.kubelet.evictionHard",
                    message,
                })?,
                None => Vec::new(),
            },
            max_pods: spec.kubelet.as_ref().and_then(|k| k.max_pods),
        })
    }

    /// kubeadm preflight errors kprov skips: only SystemVerification, and only when the spec
    /// lets the kubelet run on cgroup v1 (kubeadm's system verification refuses it).
    fn ignore_preflight_errors(&self) -> Vec<&'static str> {
        if self.fail_cgroup_v1 {
            vec![]
        } else {
            vec!["SystemVerification"]
        }
    }

    /// What a non-default setting adds to the provisioning record's digest. Defaults add
    /// nothing, so records written before these settings existed stay current.
    fn digest_entries(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        if self.proxy_mode != ProxyMode::default() {
            m.insert("proxy_mode".into(), json!(self.proxy_mode.as_str()));
        }
        if let Some(n) = self.conntrack_max_per_core {
            m.insert("conntrack_max_per_core".into(), json!(n));
        }
        if !self.fail_cgroup_v1 {
            m.insert("fail_cgroup_v1".into(), json!(false));
        }
        if !self.eviction_hard.is_empty() {
            m.insert("eviction_hard".into(), json!(self.eviction_hard));
        }
        if let Some(n) = self.max_pods {
            m.insert("max_pods".into(), json!(n));
        }
        m
    }

    /// The spec's kubelet and kube-proxy settings as the provisioning record names them
    /// (`spec.kubelet.maxPods` -> `50`), defaults left out: the roll plan names each changed
    /// field, and the roller restarts kube-proxy only when one of its own changed.
    fn recorded(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        if self.proxy_mode != ProxyMode::default() {
            m.insert(
                "spec.kubeProxy.proxyMode".into(),
                self.proxy_mode.as_str().into(),
            );
        }
        if let Some(n) = self.conntrack_max_per_core {
            m.insert("spec.kubeProxy.conntrackMaxPerCore".into(), n.to_string());
        }
        if !self.fail_cgroup_v1 {
            m.insert("spec.kubelet.failCgroupV1".into(), "false".into());
        }
        if !self.eviction_hard.is_empty() {
            let text: Vec<String> = self
                .eviction_hard
                .iter()
                .map(|(k, v)| format!("{k}<{v}"))
                .collect();
            m.insert("spec.kubelet.evictionHard".into(), text.join(","));
        }
        if let Some(n) = self.max_pods {
            m.insert("spec.kubelet.maxPods".into(), n.to_string());
        }
        m
    }

    /// `text` (a component configuration as kubeadm wrote it: a ConfigMap's data, a node's
    /// /var/lib/kubelet/config.yaml, named by `origin` in errors) with the fields kprov owns
    /// set from the spec; `None` when it already says what the spec says (compared as data,
    /// not text, so kubeadm's formatting never causes a rewrite). Keys come out sorted, as
    /// kubeadm marshals them.
    pub(crate) fn edit_component_config(
        &self,
        which: ComponentConfig,
        origin: &str,
        text: &str,
    ) -> Result<Option<String>, String> {
        let before: Value =
            serde_saphyr::from_str(text).map_err(|e| format!("{origin}: not YAML: {e}"))?;
        let Value::Object(mut doc) = before.clone() else {
            return Err(format!("{origin}: not a {} mapping", which.kind()));
        };
        if let Some(kind) = doc.get("kind")
            && kind != which.kind()
        {
            return Err(format!(
                "{origin}: kind is {kind}, expected {}",
                which.kind()
            ));
        }
        match which {
            ComponentConfig::Kubelet => self.edit_kubelet_config(&mut doc),
            ComponentConfig::KubeProxy => self.edit_kube_proxy_config(&mut doc),
        }
        let after = Value::Object(doc);
        if after == before {
            return Ok(None);
        }
        serde_saphyr::to_string(&after)
            .map(Some)
            .map_err(|e| format!("{origin}: {e}"))
    }

    /// The fields kprov owns in a KubeletConfiguration (kubeadm's `kubelet-config` ConfigMap,
    /// a node's /var/lib/kubelet/config.yaml), set from the spec; everything else kubeadm wrote
    /// is kept. A setting the spec no longer gives is removed (the kubelet's default again).
    fn edit_kubelet_config(&self, doc: &mut serde_json::Map<String, Value>) {
        let mut set = |key: &str, value: Option<Value>| match value {
            Some(v) => {
                doc.insert(key.into(), v);
            }
            None => {
                doc.remove(key);
            }
        };
        set("maxPods", self.max_pods.map(|n| json!(n)));
        set(
            "failCgroupV1",
            (!self.fail_cgroup_v1).then_some(json!(false)),
        );
        set(
            "evictionHard",
            (!self.eviction_hard.is_empty()).then(|| {
                Value::Object(
                    self.eviction_hard
                        .iter()
                        .map(|(k, v)| (k.clone(), json!(v)))
                        .collect(),
                )
            }),
        );
    }

    /// The fields kprov owns in kube-proxy's KubeProxyConfiguration (the `config.conf` of the
    /// `kube-proxy` ConfigMap): `mode` and `conntrack.maxPerCore` (`null`, kubeadm's own
    /// value, when the spec leaves it to kube-proxy).
    fn edit_kube_proxy_config(&self, doc: &mut serde_json::Map<String, Value>) {
        doc.insert("mode".into(), json!(self.proxy_mode.as_str()));
        let conntrack = doc
            .entry("conntrack")
            .or_insert_with(|| Value::Object(Default::default()));
        if !conntrack.is_object() {
            *conntrack = Value::Object(Default::default());
        }
        if let Some(c) = conntrack.as_object_mut() {
            c.insert("maxPerCore".into(), json!(self.conntrack_max_per_core));
        }
    }
}

/// Which component configuration [`NodeSettings::edit_component_config`] edits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ComponentConfig {
    /// A KubeletConfiguration.
    Kubelet,
    /// A KubeProxyConfiguration.
    KubeProxy,
}

impl ComponentConfig {
    pub(crate) fn kind(self) -> &'static str {
        match self {
            ComponentConfig::Kubelet => "KubeletConfiguration",
            ComponentConfig::KubeProxy => "KubeProxyConfiguration",
        }
    }
}

/// Printed after a failed `kubeadm init`/`join`: pod sandboxes failing because runc may not
/// lower `oom_score_adj` (no CAP_SYS_RESOURCE: unprivileged LXC/LXD) surface in kubeadm only
/// as a timeout, so the journal is asked (bounded) and the spec setting that fixes it named.
///
/// Not when containerd already restricts oom_score_adj: then the advice is taken, and the
/// kubelet's own "permission denied" on its oom_score_adj (logged on every such host) would
/// make it a false lead (seen on the real-hosts tier: a worker whose kubelet did not start was
/// told to set what it had set).
const KUBEADM_FAILURE_HINT: &str = "if ! grep -qs '^ *restrict_oom_score_adj = true' /etc/containerd/config.toml \\\n  \
  && journalctl -u containerd -u kubelet --since -30min --no-pager -n 5000 2>/dev/null \
  | grep -m1 -q 'oom_score_adj.*[Pp]ermission denied'; then\n\
  echo 'kprov: pod sandboxes fail because runc may not set oom_score_adj on this host (no CAP_SYS_RESOURCE, as in unprivileged LXC/LXD): set spec.containerd.restrictOOMScoreAdj: true' >&2\n\
fi\n";

/// How clients reach a cloud cluster's API servers: through its load balancer, under the API
/// record when the cluster has DNS (`api.NAME`), else under the load balancer's own name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CloudApi {
    /// The `controlPlaneEndpoint` host.
    pub(crate) endpoint: String,
    pub(crate) port: u16,
    /// Names the API server certificate must also carry (the load balancer's DNS name).
    pub(crate) sans: Vec<String>,
}

/// The address Kubernetes binds to on a host (`ip`, else `address` when it is an IP).
pub(crate) fn node_ip(host: &Host) -> Result<String, RenderError> {
    let candidate = host.ip.as_deref().unwrap_or(&host.address);
    candidate
        .parse::<IpAddr>()
        .map(|ip| ip.to_string())
        .map_err(|_| RenderError::Host {
            host: host.name.clone(),
            message: format!(
                "{candidate:?} is not an IP address; set `ip` to the address Kubernetes should bind to"
            ),
        })
}

/// `spec.assets.bundle` checked as a run uses it (every member against its manifest, complete
/// for the cluster, made for its version), before a preview or anything is changed: the
/// commands that render later (`rolling-update`) refuse a bad bundle up front. Nothing without
/// one. The verified handle is the run's ([`crate::bundle::open_verified`]): not hashed twice.
pub(crate) fn check_bundle(model: &ResolvedCluster) -> Result<(), RenderError> {
    let cluster = &model.completed;
    let Some(path) = cluster
        .spec
        .assets
        .as_ref()
        .and_then(|a| a.bundle.as_deref())
    else {
        return Ok(());
    };
    let mut resolved = assets::resolve(cluster)?;
    let mut images = assets::images(cluster.spec.assets.as_ref())?;
    use_bundle(
        cluster,
        std::path::Path::new(path),
        &mut resolved,
        &mut images,
    )
    .map(|_| ())
}

/// Opens `spec.assets.bundle` (every member checked against its manifest, before anything is
/// uploaded), checks that it holds everything the cluster's artifact list names, and points
/// the binaries of its architecture and every image at its members.
fn use_bundle(
    cluster: &Cluster,
    path: &std::path::Path,
    resolved: &mut [Asset],
    images: &mut Vec<ImageAsset>,
) -> Result<std::sync::Arc<crate::bundle::Bundle>, RenderError> {
    use crate::bundle::EntryKind;
    // The run's one verified handle: the preview's renderer and the apply's share it.
    let bundle =
        crate::bundle::open_verified(path).map_err(|e| RenderError::Bundle(e.to_string()))?;
    let shown = path.display();
    let bad = |m: String| RenderError::Bundle(format!("spec.assets.bundle {shown}: {m}"));
    let list = crate::bundle::artifacts::artifacts(cluster).map_err(|e| bad(e.to_string()))?;
    let m = &bundle.manifest;
    if m.kubernetes_version != list.kubernetes_version {
        return Err(bad(format!(
            "made for Kubernetes {}, the cluster runs {}; make a new bundle with `kprov create bundle {}`",
            m.kubernetes_version,
            list.kubernetes_version,
            cluster.name()
        )));
    }
    for a in resolved.iter_mut().filter(|a| a.arch.as_str() == m.arch) {
        let name = a.component.name();
        let needed = list.binaries.iter().any(|b| b.name == name);
        let entry = match m.binary(name) {
            Some(e) => e,
            None if !needed => continue,
            None => {
                return Err(bad(format!(
                    "lacks the binary {name} {} ({})",
                    a.version, m.arch
                )));
            }
        };
        if entry.sha256 != a.sha256 {
            return Err(bad(format!(
                "entry {}: sha256 {} is not the {} the spec pins for {name} {}",
                entry.path, entry.sha256, a.sha256, a.version
            )));
        }
        a.source = Source::Bundle(entry.path.clone());
    }
    for i in &list.images {
        if !m
            .entries
            .iter()
            .any(|e| e.kind == EntryKind::Image && e.name == i.reference)
        {
            return Err(bad(format!(
                "lacks the image {} ({})",
                i.reference, i.used_by
            )));
        }
    }
    for x in &list.archives {
        if !m
            .entries
            .iter()
            .any(|e| e.kind == EntryKind::Archive && e.sha256 == x.sha256)
        {
            return Err(bad(format!("lacks the image archive {}", x.url)));
        }
    }
    *images = m
        .entries
        .iter()
        .filter(|e| matches!(e.kind, EntryKind::Image | EntryKind::Archive))
        .map(|e| ImageAsset {
            url: e.name.clone(),
            source: Source::Bundle(e.path.clone()),
            sha256: e.sha256.clone(),
        })
        .collect();
    Ok(bundle)
}

/// `spec.proxy` for the nodes: no-proxy completed with the hosts' addresses (metal) or the
/// cloud network (aws), so that every node of the cluster gets the same list whichever hosts
/// a run touches.
fn proxy_of(
    spec: &crate::spec::ClusterSpec,
    api_host: &str,
) -> Result<Option<crate::spec::mirrors::ProxyEnv>, RenderError> {
    let mut addresses: Vec<String> = spec
        .hosts
        .iter()
        .map(|h| h.ip.clone().unwrap_or_else(|| h.address.clone()))
        .collect();
    if spec.hosts.is_empty() {
        addresses.extend(spec.networking.network_cidr.clone());
    }
    Ok(crate::spec::mirrors::proxy_env(spec, &addresses, api_host)?)
}

/// Writes a drop-in when there is a proxy, else removes a former one (a proxy taken out of
/// the spec must stop applying).
fn proxy_dropin(
    proxy: Option<&crate::spec::mirrors::ProxyEnv>,
    unit: &str,
    path: &str,
) -> (Vec<RemoteFile>, String, String) {
    match proxy {
        Some(p) => (
            vec![file(path, p.dropin(unit), 0o644)],
            "true".into(),
            String::new(),
        ),
        None => (
            Vec::new(),
            script!("[ ! -e {} ]", path),
            script!("rm -f {}\n", path),
        ),
    }
}

fn file(path: &str, content: impl Into<Bytes>, mode: u32) -> RemoteFile {
    RemoteFile {
        path: path.to_string(),
        content: content.into(),
        mode,
        resumable: false,
        on_arrival: None,
        sha256: None,
    }
}

impl Renderer {
    /// The renderer of `cluster`'s node steps for `targets`. The typed model gives the
    /// version, networks, etcd topology and cloud provider (resolved once, nothing re-defaulted
    /// here); the completed spec it keeps gives the settings it does not type yet (assets,
    /// mirrors, proxy, kubelet and kube-proxy settings, the API's extra names).
    pub fn new(model: &ResolvedCluster, targets: &[Target]) -> Result<Self, RenderError> {
        let cluster = &model.completed;
        let hosts: Vec<&Host> = targets.iter().map(|t| &t.host).collect();
        let mut tera = Tera::default();
        tera.add_raw_templates(TEMPLATES.to_vec())
            .map_err(|e| RenderError::Template {
                name: "node/*".into(),
                message: format!("{e:?}"),
            })?;
        enable_template_quoting(&mut tera);
        let spec = &cluster.spec;
        let kubernetes_version = model.version.to_string();
        let image_repository = crate::spec::mirrors::image_repository(spec)?;
        let pause_image = assets::kubeadm_images(&kubernetes_version)
            .map(|k| {
                format!(
                    "{}/pause:{}",
                    image_repository.as_deref().unwrap_or("registry.k8s.io"),
                    k.pause
                )
            })
            .ok_or_else(|| assets::AssetError::UnsupportedVersion(kubernetes_version.clone()))?;
        let endpoint = match spec.api.as_ref().and_then(|a| a.endpoint.as_deref()) {
            Some(e) => parse_endpoint(e)?,
            None => Endpoint::LocalProxy {
                name: format!("api.internal.{}", cluster.name()),
            },
        };
        let etcd = model.etcd;
        if !hosts
            .iter()
            .any(|h| h.roles.contains(&HostRole::ControlPlane))
        {
            return Err(RenderError::NoControlPlane);
        }
        // Names reach haproxy.cfg and /etc/hosts, which have no quoting: only DNS names pass,
        // whatever validation let through.
        if !is_dns_subdomain(cluster.name()) {
            return Err(RenderError::BadName(cluster.name().to_string()));
        }
        for h in hosts.iter().copied() {
            node_ip(h)?;
            if !is_dns_subdomain(&h.name) {
                return Err(RenderError::Host {
                    host: h.name.clone(),
                    message: "is not a valid node name (a lowercase DNS name)".into(),
                });
            }
        }
        if etcd == EtcdType::Stacked
            && let Some(h) = hosts.iter().find(|h| {
                h.roles.contains(&HostRole::Etcd) && !h.roles.contains(&HostRole::ControlPlane)
            })
        {
            return Err(RenderError::Host {
                host: h.name.clone(),
                message: "has the etcd role without control-plane, but spec.etcd.type is \
                          Stacked (etcd on the control planes); set it to External to run etcd \
                          on dedicated hosts"
                    .into(),
            });
        }
        if etcd == EtcdType::External && !hosts.iter().any(|h| h.roles.contains(&HostRole::Etcd)) {
            return Err(RenderError::Missing(
                "hosts with the etcd role (spec.etcd.type is External)",
            ));
        }
        let mut resolved = assets::resolve(cluster)?;
        let mut images = assets::images(spec.assets.as_ref())?;
        let bundle = match spec.assets.as_ref().and_then(|a| a.bundle.as_deref()) {
            Some(path) => Some(use_bundle(
                cluster,
                std::path::Path::new(path),
                &mut resolved,
                &mut images,
            )?),
            None => None,
        };
        let proxy = proxy_of(spec, endpoint.host())?;
        Ok(Renderer {
            tera,
            registry_files: crate::spec::mirrors::registry_files(spec)?,
            image_repository,
            proxy_spec: spec.clone(),
            proxy,
            cluster_name: cluster.name().to_string(),
            assets: resolved,
            images,
            bundle,
            image_files: OnceLock::new(),
            image_refs: OnceLock::new(),
            local_binaries: Default::default(),
            kubernetes_version,
            endpoint_address: match (
                &endpoint,
                spec.api
                    .as_ref()
                    .and_then(|a| a.endpoint_address.as_deref()),
            ) {
                // Only an IP address for a DNS name reaches /etc/hosts, whatever validation let
                // through: the file has no quoting.
                (Endpoint::Fixed { host, .. }, Some(a)) if is_dns_subdomain(host) => Some(
                    a.parse::<IpAddr>()
                        .map_err(|_| RenderError::BadEndpoint(a.to_string()))?
                        .to_string(),
                ),
                (_, Some(a)) => return Err(RenderError::BadEndpoint(a.to_string())),
                (_, None) => None,
            },
            endpoint,
            extra_sans: spec
                .api
                .as_ref()
                .map(|a| a.additional_sans.clone())
                .unwrap_or_default(), // no api section: no extra SANs
            pod_cidr: model.networking.pod_cidr.to_string(),
            service_cidr: model.networking.service_cidr.to_string(),
            etcd,
            cloud_external: model.addons.external_cloud_provider.is_some(),
            minor: model.version.minor,
            targets: targets.to_vec(),
            cloud_sans: Vec::new(),
            pause_image,
            api_proxy_image: spec
                .api
                .as_ref()
                .and_then(|a| a.local_proxy_image.clone())
                .unwrap_or_else(|| API_PROXY_IMAGE.to_string()),
            node: NodeSettings::of(spec)?,
        })
    }

    /// A cloud cluster's API sits behind a load balancer: that is the control-plane endpoint
    /// (no per-host /etc/hosts line or local proxy), and its names go into the certificate.
    /// [`Renderer::new`], with the cloud's API settings when the platform has them.
    pub(crate) fn for_run(
        cluster: &ResolvedCluster,
        targets: &[Target],
        cloud_api: Option<&CloudApi>,
    ) -> Result<Self, RenderError> {
        let r = Renderer::new(cluster, targets)?;
        Ok(match cloud_api {
            Some(api) => r.with_cloud_api(api.clone()),
            None => r,
        })
    }

    pub(crate) fn with_cloud_api(mut self, api: CloudApi) -> Self {
        // The proxy was checked in `new`; the load balancer's name joins its no-proxy list
        // (a DNS name passes the same check; were it refused, the list stays as checked).
        if let Ok(p) = proxy_of(&self.proxy_spec, &api.endpoint) {
            self.proxy = p;
        }
        self.endpoint_address = None;
        self.endpoint = Endpoint::Fixed {
            host: api.endpoint,
            port: api.port,
        };
        self.cloud_sans = api.sans;
        self
    }

    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub(crate) fn control_planes(&self) -> impl Iterator<Item = &Target> {
        self.targets.iter().filter(|t| t.is_control_plane())
    }

    /// The file `path` (mode 0644: units and configuration without secrets) holding the
    /// template `name`, which takes no values.
    fn static_file(&self, path: &str, name: &str) -> Result<RemoteFile, RenderError> {
        Ok(file(path, self.render(name, json!({}))?, 0o644))
    }

    fn render(&self, name: &str, ctx: Value) -> Result<String, RenderError> {
        let ctx = tera::Context::from_value(ctx).map_err(|e| RenderError::Template {
            name: name.into(),
            message: e.to_string(),
        })?;
        self.tera
            .render(name, &ctx)
            .map_err(|e| RenderError::Template {
                name: name.into(),
                message: format!("{e:?}"),
            })
    }

    /// Host settings (modules, sysctls, swap) and the preflight checks, which also record the
    /// facts `orchestrate` compares across hosts.
    pub fn preflight(&self, target: &Target) -> Result<Vec<Step>, RenderError> {
        let host = &target.host;
        let mut ports: Vec<u16> = vec![10250];
        if host.roles.contains(&HostRole::ControlPlane) {
            ports.extend([6443, 10257, 10259]);
        }
        if host.roles.contains(&HostRole::ControlPlane) || host.roles.contains(&HostRole::Etcd) {
            ports.extend([2379, 2380]);
        }
        ports.sort_unstable();
        ports.dedup();
        let minor = self.minor;
        let script = self.render(
            "node/preflight.sh.tera",
            json!({
                "node": { "name": host.name },
                "ports": ports,
                // kubelet 1.34 still runs on cgroup v1 by default; 1.35 refuses it.
                "refuse_cgroup_v1": self.node.fail_cgroup_v1 && minor >= 35,
                "require_clock_sync": self.node.require_clock_sync,
            }),
        )?;
        let mut steps = vec![Step {
            name: "preflight: kernel settings".into(),
            files: vec![
                self.static_file(
                    "/etc/modules-load.d/kprov.conf",
                    "node/modules-load.conf.tera",
                )?,
                self.static_file(SYSCTL_FILE, "node/sysctl.conf.tera")?,
            ],
            check: Some(script!(
                "( grep -qw overlay /proc/filesystems || [ -d /sys/module/overlay ] ) && \
                     [ -d /proc/sys/net/bridge ] && \
                     [ -z \"$(swapon --show=NAME --noheadings 2>/dev/null)\" ] && \
                     [ \"$(sysctl -n net.ipv4.ip_forward)\" = 1 ] && \
                     [ \"$(sysctl -n net.bridge.bridge-nf-call-iptables)\" = 1 ] && \
                     [ \"$(sysctl -n net.bridge.bridge-nf-call-ip6tables)\" = 1 ] && \
                     cmp -s {SYSCTL_FILE} {SYSCTL_APPLIED}"
            )),
            run: KERNEL_SETTINGS.into(),
            timeout: SHORT,
        }];
        if self.node.proxy_mode == ProxyMode::Ipvs {
            steps.push(Step {
                name: "preflight: ipvs modules (kubeProxy.proxyMode ipvs)".into(),
                files: vec![file(
                    IPVS_MODULES_FILE,
                    format!(
                        "# Written by kprov: kube-proxy runs in ipvs mode.\n{}\n",
                        IPVS_MODULES.join("\n")
                    ),
                    0o644,
                )],
                check: Some(IPVS_LOADED.into()),
                run: IPVS_LOAD.into(),
                timeout: SHORT,
            });
        }
        steps.push(Step {
            name: "preflight: checks".into(),
            files: vec![file("/var/lib/kprov/preflight.sh", script, 0o755)],
            // The check is the script itself: a passing host reports "unchanged", a
            // failing one runs it again to print what is wrong.
            check: Some("sh /var/lib/kprov/preflight.sh >/dev/null 2>&1".into()),
            run: "sh /var/lib/kprov/preflight.sh".into(),
            timeout: SHORT,
        });
        Ok(steps)
    }

    fn asset(&self, component: Component, arch: Arch) -> Result<&Asset, RenderError> {
        self.assets
            .iter()
            .find(|a| a.component == component && a.arch == arch)
            .ok_or(RenderError::Missing("asset"))
    }

    pub(crate) fn install_step(
        &self,
        component: Component,
        arch: Arch,
    ) -> Result<Step, RenderError> {
        let (a, files, check, run) = self.install_parts(component, arch)?;
        Ok(Step {
            name: format!("{}: install {}", component.name(), a.version),
            files,
            check: Some(check),
            run,
            timeout: LONG,
        })
    }

    /// One binary's install: its asset, the file uploaded for it (none when the host
    /// downloads it), the check that it is installed and the script that installs it.
    fn install_parts(
        &self,
        component: Component,
        arch: Arch,
    ) -> Result<(&Asset, Vec<RemoteFile>, String, String), RenderError> {
        let a = self.asset(component, arch)?;
        let name = component.name();
        let (dest, marker_bin) = match component {
            Component::Kubeadm | Component::Kubelet | Component::Kubectl => {
                (format!("/usr/local/bin/{name}"), None)
            }
            Component::Runc => ("/usr/local/sbin/runc".to_string(), None),
            Component::Containerd => ("/usr/local".into(), Some("/usr/local/bin/containerd")),
            Component::CniPlugins => ("/opt/cni/bin".into(), Some("/opt/cni/bin/bridge")),
            Component::Crictl => ("/usr/local/bin".into(), Some("/usr/local/bin/crictl")),
            Component::Etcd => ("/usr/local/bin".into(), Some(ETCD_BIN)),
        };
        // Only the binaries of etcd's release, without its top directory and documentation.
        let members: Vec<String> = match component {
            Component::Etcd => {
                let dir = assets::etcd_dir(&a.version, arch);
                ["etcd", "etcdctl", "etcdutl"]
                    .iter()
                    .map(|b| format!("{dir}/{b}"))
                    .collect()
            }
            _ => Vec::new(),
        };
        let tarball = component.install() == Install::Tarball;
        let mut files = Vec::new();
        let (url, cache, origin) = match &a.source {
            Source::Url(_) if self.bundle.is_some() => {
                return Err(RenderError::Bundle(format!(
                    "spec.assets.bundle holds {} binaries only; {name} for {} is not in it",
                    self.bundle
                        .as_ref()
                        .map(|b| b.manifest.arch.as_str())
                        .unwrap_or_default(), // the match guard holds a bundle
                    arch.as_str()
                )));
            }
            Source::Url(u) => (Some(u.clone()), None, u.clone()),
            Source::Bundle(entry) => {
                let bytes = self.bundle_member(entry).map_err(RenderError::Bundle)?;
                let cache = format!("{CACHE_DIR}/{name}-{}", a.sha256);
                let mut f = file(&cache, bytes, 0o644);
                f.resumable = true;
                // The bundle checked it against its manifest, which pins the spec's sha256.
                f.sha256 = Some(a.sha256.clone());
                files.push(f);
                (None, Some(cache), format!("bundle:{entry}"))
            }
            Source::Local(p) => {
                let bytes = self.local_binary(p, a)?;
                let cache = format!("{CACHE_DIR}/{name}-{}", a.sha256);
                let mut f = file(&cache, bytes, 0o644);
                f.sha256 = Some(a.sha256.clone());
                files.push(f);
                (None, Some(cache), format!("file://{}", p.display()))
            }
        };
        let run = self.render(
            "node/install.sh.tera",
            json!({
                "name": name, "version": a.version, "arch": arch.as_str(), "url": url,
                "cache": cache, "origin": origin, "sha256": a.sha256, "dest": dest,
                "tarball": tarball, "members": members,
                "service": match component {
                    Component::Kubelet => Some("kubelet"),
                    Component::Containerd => Some("containerd"),
                    _ => None,
                },
            }),
        )?;
        let run = [self.download_env(), run].concat();
        let check = match marker_bin {
            Some(bin) => script!(
                "[ \"$(cat /var/lib/kprov/installed/{} 2>/dev/null)\" = {} ] && [ -x {} ]",
                name,
                a.sha256,
                bin
            ),
            None => script!(
                "[ \"$(sha256sum {} 2>/dev/null | cut -d' ' -f1)\" = {} ]",
                dest,
                a.sha256
            ),
        };
        Ok((a, files, check, run))
    }

    /// The container runtime's and Kubernetes' binaries ([`Component::NODE_BINARIES`], in
    /// order) as **one** step: their uploads go up in one stream, and each uploaded binary is
    /// installed as soon as it lands (its arrival hook: the same script its own step would
    /// run), while the next one uploads. The step is converged when every binary's check passes;
    /// its run installs,
    /// in order, each binary whose hook did not install it in this batch (`$KPROV_HOOKED`)
    /// and whose check fails: a download, a bundle member, a file already on the host, a
    /// binary changed since. A failure names the binary (`kprov: NAME: install VERSION
    /// failed`) after the install's own message, and stops the run there.
    fn binaries_step(&self, arch: Arch) -> Result<Step, RenderError> {
        let mut names = Vec::new();
        let mut files = Vec::new();
        let mut checks = Vec::new();
        let mut run = String::from(
            "# Installs what this batch's arrival hooks did not (one binary per line below).\n\
             hooked() { printf '%s\\n' \"${KPROV_HOOKED:-}\" | grep -qxF -- \"$1\"; }\n\
             failed() { printf 'kprov: %s: install %s failed\\n' \"$1\" \"$2\" >&2; exit 1; }\n",
        );
        for c in Component::NODE_BINARIES {
            let (a, mut fs, check, install) = self.install_parts(c, arch)?;
            let name = c.name();
            let hooked = match fs.first_mut() {
                Some(f) if !f.resumable => {
                    f.on_arrival = Some(Arrival {
                        run: install.clone(),
                        timeout: LONG,
                    });
                    script!("hooked {} || ", f.path)
                }
                _ => String::new(),
            };
            run.push_str(&hooked);
            run.push_str(&script!(
                "sh -c {} >/dev/null 2>&1 || sh -c {} || failed {} {}\n",
                check,
                install,
                name,
                a.version
            ));
            checks.push(format!("{{ {check}; }}"));
            names.push(format!("{name} {}", a.version));
            files.extend(fs);
        }
        Ok(Step {
            name: format!("binaries: install {}", names.join(", ")),
            files,
            check: Some(checks.join(" && ")),
            run,
            timeout: BINARIES_TIMEOUT,
        })
    }

    /// A `file://` binary, read once per run and checked against the sha256 the spec pins
    /// for it: a mismatch names the file before any host is changed, and the host, which
    /// receives exactly these bytes (the upload is checked), does not hash it again.
    fn local_binary(&self, path: &std::path::Path, a: &Asset) -> Result<Bytes, RenderError> {
        let shown = || path.display().to_string();
        if let Ok(cache) = self.local_binaries.lock()
            && let Some(b) = cache.get(&(path.to_path_buf(), a.sha256.clone()))
        {
            return Ok(b.clone());
        }
        let bytes = crate::bounded::read_file(path, crate::bounded::LOCAL_ASSET).map_err(|e| {
            RenderError::LocalAsset {
                path: shown(),
                message: e.to_string(),
            }
        })?;
        let actual = hex::encode(Sha256::digest(&bytes));
        if actual != a.sha256 {
            return Err(RenderError::LocalChecksum {
                path: shown(),
                name: a.component.name().to_string(),
                version: a.version.clone(),
                expected: a.sha256.clone(),
                actual,
            });
        }
        let bytes = Bytes::from(bytes);
        if let Ok(mut cache) = self.local_binaries.lock() {
            cache.insert((path.to_path_buf(), a.sha256.clone()), bytes.clone());
        }
        Ok(bytes)
    }

    /// Container runtime, kube binaries and their services, and the image archives, for a host
    /// of `arch` with `roles`.
    pub(crate) fn install(
        &self,
        arch: Arch,
        roles: &[crate::spec::HostRole],
    ) -> Result<Vec<Step>, RenderError> {
        // Every binary in one step and one upload stream, each installed as it lands; the
        // kubelet's binary is in place before its service step, containerd's before its
        // configuration.
        let mut steps = vec![self.binaries_step(arch)?];
        steps.extend(self.registries_step());
        let (proxy_files, proxy_check, proxy_run) = proxy_dropin(
            self.proxy.as_ref(),
            "containerd",
            crate::spec::mirrors::CONTAINERD_PROXY_DROPIN,
        );
        let mut configure_files = proxy_files;
        configure_files.extend([
            file(
                "/etc/containerd/config.toml",
                self.render(
                    "node/containerd-config.toml.tera",
                    json!({
                        "pause_image": self.pause_image,
                        "restrict_oom_score_adj": self.node.restrict_oom_score_adj,
                        "config_path": (!self.registry_files.is_empty())
                            .then_some(crate::spec::mirrors::CERTS_D),
                    }),
                )?,
                0o644,
            ),
            self.static_file(
                "/etc/systemd/system/containerd.service",
                "node/containerd.service.tera",
            )?,
            self.static_file("/etc/crictl.yaml", "node/crictl.yaml.tera")?,
        ]);
        steps.push(Step {
            name: "containerd: configure".into(),
            files: configure_files,
            // Active is not enough: containerd stays up when its CRI plugin fails to load
            // (a bad config, or the kernel's inotify instances exhausted), and kubeadm then
            // fails later with "unknown service runtime.v1.RuntimeService". The CRI must answer.
            // Both parts are built by script! (quoted) or constant.
            check: Some(
                [
                    &proxy_check,
                    " && systemctl is-active --quiet containerd && crictl --timeout 5s info >/dev/null 2>&1",
                ]
                .concat(),
            ),
            run: [&proxy_run, CONTAINERD_RESTART].concat(),
            timeout: SHORT,
        });
        let (proxy_files, proxy_check, proxy_run) = proxy_dropin(
            self.proxy.as_ref(),
            "kubelet",
            crate::spec::mirrors::KUBELET_PROXY_DROPIN,
        );
        let mut kubelet_files = proxy_files;
        kubelet_files.extend([
            self.static_file(
                "/etc/systemd/system/kubelet.service",
                "node/kubelet.service.tera",
            )?,
            self.static_file(
                "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf",
                "node/10-kubeadm.conf.tera",
            )?,
        ]);
        steps.push(Step {
            name: "kubelet: service".into(),
            files: kubelet_files,
            check: Some([&proxy_check, " && systemctl is-enabled --quiet kubelet"].concat()),
            // kubeadm init/join start the kubelet once its configuration exists; a running
            // kubelet restarts to take a changed unit or proxy.
            run: [
                "set -e\n",
                &proxy_run,
                "systemctl daemon-reload\nsystemctl enable kubelet\nsystemctl try-restart kubelet\n",
            ]
            .concat(),
            timeout: SHORT,
        });
        // After containerd runs with its configuration, before kubeadm pulls anything.
        steps.extend(self.images(roles)?);
        Ok(steps)
    }

    /// One member of the bundle, read once per run (every host's upload shares the buffer).
    fn bundle_member(&self, path: &str) -> Result<Bytes, String> {
        let b = self
            .bundle
            .as_ref()
            .ok_or_else(|| format!("bundle member {path}: no spec.assets.bundle"))?;
        let entry = b
            .manifest
            .entries
            .iter()
            .find(|e| e.path == path)
            .ok_or_else(|| format!("bundle {}: no member {path}", b.path().display()))?;
        b.read(entry).map_err(|e| e.to_string())
    }

    /// containerd's `hosts.toml` per mirrored registry (read at each pull: no restart), and
    /// the removal of kprov's directories whose registry left the spec. Nothing when the spec
    /// has no registries and no kprov directory is left.
    fn registries_step(&self) -> Option<Step> {
        use crate::spec::mirrors::{CERTS_D, MANAGED_MARK};
        let mut keep: Vec<String> = self
            .registry_files
            .iter()
            .filter_map(|f| f.path.strip_suffix(&format!("/{MANAGED_MARK}")))
            .map(str::to_string)
            .collect();
        keep.sort();
        let keep_words: String = keep.iter().map(|d| format!(" {}", sh_quote(d))).collect();
        let keep_words = if keep.is_empty() {
            "''".to_string()
        } else {
            keep_words.trim_start().to_string()
        };
        // Lists kprov's directories not in the spec (one per line); the kept ones are quoted
        // words (sh_quote), the rest constants.
        let stale = [
            "for m in ",
            CERTS_D,
            "/*/",
            MANAGED_MARK,
            "; do [ -e \"$m\" ] || continue; d=${m%/*}; case \" $(printf '%s ' ",
            &keep_words,
            ") \" in *\" $d \"*) ;; *) echo \"$d\";; esac; done",
        ]
        .concat();
        Some(Step {
            name: "containerd: registry mirrors".into(),
            files: self
                .registry_files
                .iter()
                .map(|f| file(&f.path, f.content.clone(), f.mode))
                .collect(),
            check: Some(["[ -z \"$(", &stale, ")\" ]"].concat()),
            run: [
                "set -e\n",
                &stale,
                " | while read -r d; do rm -rf \"$d\"; done\n",
            ]
            .concat(),
            timeout: SHORT,
        })
    }

    /// `export` lines giving kprov's downloads on a node (curl) the proxy of `spec.proxy`;
    /// empty without one.
    fn download_env(&self) -> String {
        let Some(p) = &self.proxy else {
            return String::new();
        };
        let mut s = String::from("# spec.proxy: downloads go through the proxy.\n");
        for (k, v) in p.vars() {
            s.push_str(&format!("export {k}={}\n", sh_quote(&v)));
        }
        s
    }

    /// The image archives of `spec.assets.images` (or the bundle's) a host with `roles` needs,
    /// in spec order: a worker skips the control plane's own images when the archive names them
    /// ([`assets::archive_needed_on`]). Archives not loaded (a download URL, or a load error the
    /// run reports elsewhere) go to every host.
    pub(crate) fn image_archives(&self, roles: &[crate::spec::HostRole]) -> Vec<&ImageAsset> {
        self.images
            .iter()
            .zip(self.image_refs())
            .filter(|(_, refs)| assets::archive_needed_on(refs, roles))
            .map(|(img, _)| img)
            .collect()
    }

    /// The references each archive of `images` names, in the same order.
    fn image_refs(&self) -> &[Vec<String>] {
        self.image_refs.get_or_init(|| match self.load_images() {
            Ok(contents) => contents
                .iter()
                .map(|c| match c {
                    Some(bytes) => assets::archive_references(bytes),
                    // Downloaded by the hosts: kprov never sees its contents.
                    None => Vec::new(),
                })
                .collect(),
            Err(_) => vec![Vec::new(); self.images.len()],
        })
    }

    /// Reads every `file://` image archive and checks its sha256 on the operator's machine,
    /// once per renderer. A mismatch names the file before any host is changed.
    pub(crate) fn load_images(&self) -> Result<&[Option<Bytes>], ImageError> {
        self.image_files
            .get_or_init(|| {
                self.images
                    .iter()
                    .map(|img| match &img.source {
                        Source::Url(_) => Ok(None),
                        Source::Bundle(entry) => {
                            self.bundle_member(entry).map(Some).map_err(|message| {
                                ImageError::Bundle {
                                    url: img.url.clone(),
                                    message,
                                }
                            })
                        }
                        Source::Local(path) => {
                            let bytes =
                                crate::bounded::read_file(path, crate::bounded::LOCAL_ASSET)
                                    .map_err(|e| ImageError::Read {
                                        url: img.url.clone(),
                                        message: e.to_string(),
                                    })?;
                            let actual = hex::encode(Sha256::digest(&bytes));
                            if actual != img.sha256 {
                                return Err(ImageError::Checksum {
                                    url: img.url.clone(),
                                    expected: img.sha256.clone(),
                                    actual,
                                });
                            }
                            Ok(Some(Bytes::from(bytes)))
                        }
                    })
                    .collect()
            })
            .as_deref()
            .map_err(Clone::clone)
    }

    /// One step for every image archive the host needs: each brought to the host (uploaded
    /// from the operator's machine into [`CACHE_DIR`], where it stays so that a re-run
    /// compares it by hash and uploads nothing, like a `file://` binary; or downloaded by the
    /// host and checked against its sha256 there), imported into containerd's `k8s.io`
    /// namespace and recorded under [`IMAGES_DIR`]. The archives of the step go up in one
    /// stream and are imported [`IMPORTS_AT_ONCE`] at a time (one `ctr` each: it takes one
    /// archive): one after another they cost the sum of their imports. The step is converged
    /// when every marker exists; a run imports only the archives whose marker is missing, and
    /// a failure names the archive with `ctr`'s own message. No step without archives.
    pub(crate) fn images(&self, roles: &[crate::spec::HostRole]) -> Result<Vec<Step>, RenderError> {
        let contents = self.load_images()?;
        let needed = self.image_archives(roles);
        let mut labels = Vec::new();
        let mut files = Vec::new();
        let mut archives = Vec::new();
        let mut markers = Vec::new();
        for ((img, content), refs) in self
            .images
            .iter()
            .zip(contents)
            .zip(self.image_refs())
            .filter(|((img, _), _)| needed.iter().any(|n| std::ptr::eq(*n, *img)))
        {
            let marker = image_marker(&img.sha256);
            let cache = format!("{CACHE_DIR}/image-{}.tar", img.sha256);
            let archive = json!({
                "url": "", "cache": cache, "origin": img.url, "sha256": img.sha256,
                "marker": marker,
            });
            let (url, cache) = match (&img.source, content) {
                (Source::Local(_), Some(bytes)) => {
                    let mut f = file(&cache, bytes.clone(), 0o600);
                    // load_images verified it against the spec's sha256.
                    f.sha256 = Some(img.sha256.clone());
                    // Imported as soon as it lands, while the next archive uploads (the
                    // step's run then finds its marker). The same script with this archive
                    // alone: it never downloads, so its exit trap removes no one's download.
                    f.on_arrival = Some(Arrival {
                        run: self.render(
                            "node/image-import.sh.tera",
                            json!({
                                "archives": [archive], "cache_dir": CACHE_DIR,
                                "marker_dir": IMAGES_DIR, "at_once": "1",
                            }),
                        )?,
                        timeout: IMAGE_TIMEOUT,
                    });
                    files.push(f);
                    (String::new(), cache)
                }
                (Source::Url(u), _) => (u.clone(), String::new()),
                (Source::Bundle(_), Some(bytes)) => {
                    let mut f = file(&cache, bytes.clone(), 0o600);
                    f.resumable = true;
                    // The bundle verified it against its manifest when it was read.
                    f.sha256 = Some(img.sha256.clone());
                    files.push(f);
                    (String::new(), cache)
                }
                (Source::Local(_) | Source::Bundle(_), None) => {
                    return Err(RenderError::Missing("image archive"));
                }
            };
            // The images it holds when the archive names them (several archives may share a
            // file name), else its file name.
            labels.push(if refs.is_empty() {
                img.file_name().to_string()
            } else {
                refs.join(", ")
            });
            archives.push(json!({
                "url": url, "cache": cache, "origin": img.url, "sha256": img.sha256,
                "marker": marker,
            }));
            markers.push(marker);
        }
        if archives.is_empty() {
            return Ok(Vec::new());
        }
        let run = self.render(
            "node/image-import.sh.tera",
            json!({
                "archives": archives, "cache_dir": CACHE_DIR, "marker_dir": IMAGES_DIR,
                "at_once": IMPORTS_AT_ONCE.to_string(),
            }),
        )?;
        let run = [self.download_env(), run].concat();
        let check = markers
            .iter()
            .map(|m| script!("test -f {}", m))
            .collect::<Vec<_>>()
            .join(" && ");
        Ok(vec![Step {
            // The labels are the archives' text: escaped here, once, so the step's name is
            // safe on every path it takes (progress lines, errors, drift reasons, JSON).
            name: crate::output::escape(&format!("images: import {}", labels.join(", ")))
                .into_owned(),
            files,
            check: Some(check),
            run,
            // Each archive had a step, and so a timeout, of its own; downloads and imports
            // now share one step, which must not give a host less time than they had.
            timeout: IMAGE_TIMEOUT.saturating_mul(u32::try_from(markers.len()).unwrap_or(u32::MAX)),
        }])
    }

    /// Points the API name at `ip` in /etc/hosts (local-proxy endpoint), or a fixed endpoint's
    /// name at `spec.api.endpointAddress` when the spec gives one (as Kubespray does for
    /// `apiserver_loadbalancer_domain_name` with `loadbalancer_apiserver.address`).
    pub(crate) fn endpoint_entry(&self, ip: &str) -> Option<Step> {
        let (ip, name) = match (&self.endpoint, &self.endpoint_address) {
            (Endpoint::LocalProxy { name }, _) => (ip, name),
            (Endpoint::Fixed { host, .. }, Some(address)) => (address.as_str(), host),
            (Endpoint::Fixed { .. }, None) => return None,
        };
        let line = format!("{ip} {name} {HOSTS_MARK}");
        Some(Step {
            name: format!("api endpoint: {name} -> {ip}"),
            files: vec![],
            check: Some(script!("grep -qxF -e {} /etc/hosts", line)),
            // Rewritten in place (not renamed): /etc/hosts may be a bind mount.
            run: script!(
                "set -e\ngrep -v -e {} /etc/hosts > /etc/hosts.kprov-new || true\n\
                 printf '%s\\n' {} >> /etc/hosts.kprov-new\ncat /etc/hosts.kprov-new > /etc/hosts\n\
                 rm -f /etc/hosts.kprov-new\n",
                format!("{HOSTS_MARK}$"),
                line
            ),
            timeout: SHORT,
        })
    }

    fn registration(&self, target: &Target) -> Result<Value, RenderError> {
        let host = &target.host;
        let mut args = vec![json!({ "name": "node-ip", "value": node_ip(host)? })];
        if let Some(instance) = &target.instance {
            // The cloud-controller-manager matches the Node to its instance by this ID.
            args.push(json!({ "name": "provider-id", "value": instance.provider_id }));
        }
        if self.cloud_external {
            // The cloud-controller-manager initialises the node; the kubelet must not.
            args.push(json!({ "name": "cloud-provider", "value": "external" }));
        }
        if !host.labels.is_empty() {
            // `k=v,k2=v2`: only valid label keys and values keep that unambiguous.
            for (k, v) in &host.labels {
                check_label_key(k)
                    .and_then(|()| check_label_value(v))
                    .and_then(|()| check_kubelet_label(k))
                    .map_err(|message| RenderError::Host {
                        host: host.name.clone(),
                        message,
                    })?;
            }
            let labels: Vec<String> = host
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            args.push(json!({ "name": "node-labels", "value": labels.join(",") }));
        }
        let control_plane = host.roles.contains(&HostRole::ControlPlane);
        let mut taints = Vec::new();
        if control_plane && !host.roles.contains(&HostRole::Node) {
            taints.push(json!({
                "key": "node-role.kubernetes.io/control-plane", "value": null, "effect": "NoSchedule"
            }));
        }
        for t in &host.taints {
            let t = check_taint(t)
                .and_then(|()| parse_taint(t))
                .map_err(|message| RenderError::Host {
                    host: host.name.clone(),
                    message,
                })?;
            taints.push(json!({ "key": t.key, "value": t.value, "effect": t.effect }));
        }
        Ok(json!({
            "node": { "name": target.node_name, "ip": node_ip(host)? },
            "kubelet_args": args,
            "taints": taints,
            "control_plane": control_plane,
        }))
    }

    fn kubeadm_common(
        &self,
        target: &Target,
    ) -> Result<serde_json::Map<String, Value>, RenderError> {
        let Value::Object(mut ctx) = self.registration(target)? else {
            unreachable!("registration renders an object")
        };
        ctx.insert("cluster_name".into(), json!(self.cluster_name));
        ctx.insert("endpoint".into(), json!(self.endpoint.address()));
        ctx.insert(
            "ignore_preflight_errors".into(),
            json!(self.node.ignore_preflight_errors()),
        );
        Ok(ctx)
    }

    /// The kubeadm configuration for `kubeadm init` on `host`.
    pub(crate) fn init_config(
        &self,
        target: &Target,
        certificate_key: &str,
    ) -> Result<String, RenderError> {
        let mut ctx = self.kubeadm_common(target)?;
        let mut sans = vec![self.endpoint.host().to_string()];
        // Clients that reach the load balancer by its address see the same certificate.
        sans.extend(self.endpoint_address.iter().cloned());
        sans.extend(self.cloud_sans.iter().cloned());
        for cp in self.control_planes() {
            sans.push(cp.node_name.clone());
            sans.push(node_ip(&cp.host)?);
        }
        sans.dedup();
        for extra in &self.extra_sans {
            if !sans.contains(extra) {
                sans.push(extra.clone());
            }
        }
        let etcd_endpoints: Vec<String> = self
            .targets
            .iter()
            .filter(|t| t.has_role(HostRole::Etcd))
            .map(|t| node_ip(&t.host).map(|ip| format!("https://{ip}:2379")))
            .collect::<Result<_, _>>()?;
        ctx.insert("certificate_key".into(), json!(certificate_key));
        ctx.insert("kubernetes_version".into(), json!(self.kubernetes_version));
        ctx.insert("pod_cidr".into(), json!(self.pod_cidr));
        ctx.insert("service_cidr".into(), json!(self.service_cidr));
        ctx.insert("cert_sans".into(), json!(sans));
        ctx.insert(
            "external_etcd".into(),
            json!(self.etcd == EtcdType::External),
        );
        ctx.insert("etcd_endpoints".into(), json!(etcd_endpoints));
        ctx.insert("proxy_mode".into(), json!(self.node.proxy_mode.as_str()));
        ctx.insert(
            "conntrack_max_per_core".into(),
            json!(self.node.conntrack_max_per_core),
        );
        ctx.insert("fail_cgroup_v1".into(), json!(self.node.fail_cgroup_v1));
        ctx.insert("eviction_hard".into(), json!(self.node.eviction_hard));
        ctx.insert("max_pods".into(), json!(self.node.max_pods));
        ctx.insert("image_repository".into(), json!(self.image_repository));
        self.render("node/kubeadm-init.yaml.tera", Value::Object(ctx))
    }

    /// The kubeadm configuration for `kubeadm join` on `host`.
    pub(crate) fn join_config(
        &self,
        target: &Target,
        secrets: &JoinSecrets,
    ) -> Result<String, RenderError> {
        let mut ctx = self.kubeadm_common(target)?;
        ctx.insert("discovery_endpoint".into(), json!(self.endpoint.address()));
        ctx.insert("token".into(), json!(secrets.token));
        ctx.insert("ca_cert_hash".into(), json!(secrets.ca_cert_hash));
        ctx.insert("certificate_key".into(), json!(secrets.certificate_key));
        self.render("node/kubeadm-join.yaml.tera", Value::Object(ctx))
    }

    /// Writes a fresh certificate key (with the time it was issued, for its 2 h validity) and,
    /// on an initialised control plane, re-uploads the certificates encrypted with it.
    pub(crate) fn certificate_key(&self, key: &str, issued_at: i64) -> Step {
        Step {
            name: "kubeadm: certificate key".into(),
            files: vec![file(
                CERTIFICATE_KEY_FILE,
                format!("{issued_at} {key}\n"),
                0o600,
            )],
            check: None,
            run: script!(
                "set -e\nif [ -f {ADMIN_CONF} ]; then\n  kubeadm init phase upload-certs --upload-certs \
                 --certificate-key \"$(cut -d' ' -f2 {CERTIFICATE_KEY_FILE})\"\nfi\n"
            ),
            timeout: SHORT,
        }
    }

    /// `kubeadm init` on the first control plane.
    pub(crate) fn init(
        &self,
        target: &Target,
        certificate_key: &str,
    ) -> Result<Vec<Step>, RenderError> {
        let mut steps: Vec<Step> = self
            .endpoint_entry(&node_ip(&target.host)?)
            .into_iter()
            .collect();
        let config = format!("{KPROV_DIR}/kubeadm-init.yaml");
        steps.push(Step {
            name: "kubeadm: init".into(),
            files: vec![file(
                &config,
                self.init_config(target, certificate_key)?,
                0o600,
            )],
            check: Some(script!("test -f {ADMIN_CONF}")),
            run: script!(
                "set -e\n[ -f {ADMIN_CONF} ] && exit 0\nkubeadm init --config {} --upload-certs && exit 0\n{KUBEADM_FAILURE_HINT}exit 1\n",
                config
            ),
            timeout: LONG,
        });
        Ok(steps)
    }

    /// Creates a bootstrap token on the first control plane; its join command is read back.
    pub(crate) fn join_token(&self) -> Step {
        Step {
            name: "kubeadm: join token".into(),
            files: vec![],
            check: None,
            run: script!(
                "set -e\numask 077\nkubeadm token create --ttl 1h0m0s --print-join-command > {JOIN_COMMAND_FILE}\n"
            ),
            timeout: SHORT,
        }
    }

    /// `kubeadm join` on `host`, through the first control plane `via`.
    pub(crate) fn join(
        &self,
        target: &Target,
        via: &Target,
        secrets: &JoinSecrets,
    ) -> Result<Vec<Step>, RenderError> {
        let mut steps: Vec<Step> = self
            .endpoint_entry(&node_ip(&via.host)?)
            .into_iter()
            .collect();
        let config = format!("{KPROV_DIR}/kubeadm-join.yaml");
        steps.push(Step {
            name: "kubeadm: join".into(),
            files: vec![file(&config, self.join_config(target, secrets)?, 0o600)],
            check: Some(script!("test -f {KUBELET_CONF}")),
            run: script!(
                "set -e\n[ -f {KUBELET_CONF} ] && exit 0\nkubeadm join --config {} && exit 0\n{KUBEADM_FAILURE_HINT}exit 1\n",
                config
            ),
            timeout: LONG,
        });
        Ok(steps)
    }

    /// What a member runs once it is in the cluster: control planes use their own API server,
    /// workers the local proxy over every control plane.
    pub(crate) fn settle(&self, target: &Target) -> Result<Vec<Step>, RenderError> {
        if !matches!(self.endpoint, Endpoint::LocalProxy { .. }) {
            return Ok(vec![]);
        }
        if target.is_control_plane() {
            return Ok(self
                .endpoint_entry(&node_ip(&target.host)?)
                .into_iter()
                .collect());
        }
        let control_planes: Vec<Value> = self
            .control_planes()
            .map(|cp| Ok(json!({ "name": cp.name(), "ip": node_ip(&cp.host)? })))
            .collect::<Result<_, RenderError>>()?;
        let cfg = self.render(
            "node/haproxy.cfg.tera",
            json!({ "cluster_name": self.cluster_name, "endpoint": self.endpoint.address(),
                    "control_planes": control_planes }),
        )?;
        let manifest = self.render(
            "node/api-proxy.yaml.tera",
            json!({ "image": self.api_proxy_image, "config_sha256": hex::encode(Sha256::digest(&cfg)) }),
        )?;
        let mut steps = vec![Step {
            name: "api proxy: local load balancer".into(),
            files: vec![
                file(&format!("{KPROV_DIR}/haproxy.cfg"), cfg, 0o644),
                file(
                    "/etc/kubernetes/manifests/kprov-api-proxy.yaml",
                    manifest,
                    0o644,
                ),
            ],
            check: Some("test -f /etc/kubernetes/manifests/kprov-api-proxy.yaml".into()),
            // The kubelet watches the manifest directory and (re)starts the static pod itself.
            run: "true".into(),
            timeout: SHORT,
        }];
        steps.extend(self.endpoint_entry("127.0.0.1"));
        Ok(steps)
    }

    pub(crate) fn etcd_type(&self) -> EtcdType {
        self.etcd
    }

    /// The hosts of external etcd (whatever other roles they have); none with stacked etcd.
    pub(crate) fn etcd_hosts(&self) -> impl Iterator<Item = &Target> {
        let external = self.etcd == EtcdType::External;
        self.targets
            .iter()
            .filter(move |t| external && t.has_role(HostRole::Etcd))
    }

    /// The etcd CA, made once on the first etcd host and copied to the others.
    pub(crate) fn etcd_ca(&self) -> Step {
        Step {
            name: "etcd: CA".into(),
            files: vec![],
            check: Some(script!("test -f {ETCD_CA_CERT} && test -f {ETCD_CA_KEY}")),
            run: "kubeadm init phase certs etcd-ca\n".into(),
            timeout: SHORT,
        }
    }

    /// `name=https://IP:2380` of every external etcd member, in inventory order.
    pub(crate) fn etcd_initial_cluster(&self) -> Result<Vec<String>, RenderError> {
        self.etcd_hosts()
            .map(|t| {
                Ok(format!(
                    "{}=https://{}:2380",
                    t.node_name,
                    node_ip(&t.host)?
                ))
            })
            .collect()
    }

    /// One host-deployed external etcd member (Kubespray's `etcd_deployment_type: host`):
    /// certificates under the shared CA with the host's addresses as names, the pinned etcd
    /// release, a systemd service, and a health check. Independent of the kubelet, so the
    /// host may have any other role.
    pub(crate) fn etcd_member(
        &self,
        target: &Target,
        arch: Arch,
        ca_cert: &Bytes,
        ca_key: &Bytes,
    ) -> Result<Vec<Step>, RenderError> {
        let ip = node_ip(&target.host)?;
        let mut sans = vec![ip.clone()];
        if target.host.address != ip {
            sans.push(target.host.address.clone());
        }
        let config = format!("{KPROV_DIR}/kubeadm-etcd.yaml");
        let certs = self.render(
            "node/kubeadm-etcd.yaml.tera",
            json!({
                "node": { "name": target.node_name, "ip": ip },
                "cluster_name": self.cluster_name,
                "kubernetes_version": self.kubernetes_version,
                "sans": sans,
            }),
        )?;
        let service = self.render(
            "node/etcd.conf.yml.tera",
            json!({
                "name": target.node_name,
                "data_dir": ETCD_DATA_DIR,
                "initial_cluster": self.etcd_initial_cluster()?.join(","),
                "cluster_token": format!("kprov-{}", self.cluster_name),
                "peer_url": format!("https://{ip}:2380"),
                "client_urls": format!("https://{ip}:2379,https://127.0.0.1:2379"),
                "advertise_client_url": format!("https://{ip}:2379"),
                "ca": ETCD_CA_CERT,
                "server_cert": ETCD_SERVER_CERT,
                "server_key": ETCD_SERVER_KEY,
                "peer_cert": ETCD_PEER_CERT,
                "peer_key": ETCD_PEER_KEY,
            }),
        )?;
        Ok(vec![
            Step {
                name: "etcd: shared CA".into(),
                files: vec![
                    file(ETCD_CA_CERT, ca_cert.clone(), 0o644),
                    file(ETCD_CA_KEY, ca_key.clone(), 0o600),
                ],
                check: Some("true".into()),
                run: "true".into(),
                timeout: SHORT,
            },
            Step {
                name: "etcd: certificates".into(),
                files: vec![file(&config, certs, 0o600)],
                check: Some(script!(
                    "test -f {} && test -f {} && test -f {} && test -f {}",
                    ETCD_SERVER_CERT,
                    ETCD_PEER_CERT,
                    ETCD_HEALTHCHECK_CERT,
                    ETCD_CLIENT_CERT
                )),
                run: script!(
                    "set -e\nfor c in etcd-server etcd-peer etcd-healthcheck-client apiserver-etcd-client; do\n  \
                     kubeadm init phase certs \"$c\" --config {}\ndone\n",
                    config
                ),
                timeout: SHORT,
            },
            self.install_step(Component::Etcd, arch)?,
            Step {
                name: "etcd: service".into(),
                files: vec![
                    file(ETCD_CONFIG, service, 0o600),
                    self.static_file(ETCD_UNIT, "node/etcd.service.tera")?,
                ],
                check: Some("systemctl is-active --quiet etcd".into()),
                // etcd wants its data directory private; an empty one it initialises.
                run: script!(
                    "set -e\ninstall -d -m 0700 {}\nsystemctl daemon-reload\nsystemctl enable etcd\nsystemctl restart etcd\n",
                    ETCD_DATA_DIR
                ),
                timeout: SHORT,
            },
            Step {
                name: "etcd: health".into(),
                files: vec![],
                check: Some(self.etcdctl(&ip, "endpoint health")),
                // A fresh member only turns healthy once a quorum of its peers is up.
                run: "for i in $(seq 1 60); do\n  ".to_string()
                    + &self.etcdctl(&ip, "endpoint health")
                    + " && exit 0\n  sleep 2\ndone\necho 'etcd did not become healthy in 120 s' >&2\nexit 1\n",
                timeout: SHORT,
            },
        ])
    }

    /// An etcdctl command line against the member at `ip`, with the health-check client
    /// certificate every member has. `args` is code (a literal at every call site).
    pub(crate) fn etcdctl(&self, ip: &str, args: &'static str) -> String {
        script!(
            "ETCDCTL_API=3 etcdctl --endpoints {} --cacert {} --cert {} --key {} ",
            format!("https://{ip}:2379"),
            ETCD_CA_CERT,
            ETCD_HEALTHCHECK_CERT,
            ETCD_HEALTHCHECK_KEY
        ) + args
    }

    /// Shell code defining `etcdctl` as a function that talks to host-deployed etcd on
    /// `member` (the service's etcdctl, the health-check client certificate), so scripts
    /// written against kubeadm's static pod (`crictl exec` into it) run unchanged.
    pub(crate) fn etcdctl_function(&self, member: &Target) -> Result<String, RenderError> {
        let ip = node_ip(&member.host)?;
        Ok("etcdctl() { ".to_string()
            + &script!(
                "ETCDCTL_API=3 command etcdctl --endpoints {} --cacert {} --cert {} --key {}",
                format!("https://{ip}:2379"),
                ETCD_CA_CERT,
                ETCD_HEALTHCHECK_CERT,
                ETCD_HEALTHCHECK_KEY
            )
            + " \"$@\"; }\n")
    }

    /// The etcd members: the control planes with stacked etcd, the etcd hosts with external.
    pub(crate) fn etcd_members(&self) -> Vec<&Target> {
        match self.etcd {
            EtcdType::Stacked => self.control_planes().collect(),
            EtcdType::External => self.etcd_hosts().collect(),
        }
    }

    /// `name=https://IP:2380` of every member, as a restore recreates the cluster.
    fn etcd_restore_cluster(&self) -> Result<String, RenderError> {
        let members = self
            .etcd_members()
            .into_iter()
            .map(|t| {
                Ok(format!(
                    "{}=https://{}:2380",
                    t.node_name,
                    node_ip(&t.host)?
                ))
            })
            .collect::<Result<Vec<_>, RenderError>>()?;
        Ok(members.join(","))
    }

    /// The token the members were started with: kprov's for host-deployed etcd, etcd's own
    /// default for kubeadm's static pods (kubeadm sets none).
    fn etcd_cluster_token(&self) -> String {
        match self.etcd {
            EtcdType::Stacked => "etcd-cluster".into(),
            EtcdType::External => format!("kprov-{}", self.cluster_name),
        }
    }

    /// Takes a snapshot on `member` into [`ETCD_SNAPSHOT`] after a health check: with stacked
    /// etcd through the static pod's own etcdctl and kubeadm's health-check certificate, with
    /// host-deployed etcd through the service's etcdctl.
    pub(crate) fn etcd_snapshot(&self, member: &Target) -> Result<Step, RenderError> {
        let run = match self.etcd {
            EtcdType::Stacked => {
                let ctl = script!(
                    "crictl exec \"$id\" etcdctl --endpoints https://127.0.0.1:2379 --cacert {} --cert {} --key {}",
                    ETCD_CA_CERT,
                    ETCD_HEALTHCHECK_CERT,
                    ETCD_HEALTHCHECK_KEY
                );
                "set -eu\nid=$(crictl ps --name '^etcd$' --state running -q | head -n1)\n\
                 [ -n \"$id\" ] || { echo 'no running etcd container (static pod) on this host' >&2; exit 1; }\n"
                    .to_string()
                    + &script!("rm -f {}\n", ETCD_SNAPSHOT)
                    + &ctl
                    + " endpoint health\n"
                    + &ctl
                    + &script!(" snapshot save {}\n", ETCD_SNAPSHOT)
            }
            EtcdType::External => {
                let ip = node_ip(&member.host)?;
                "set -eu\n".to_string()
                    + &script!("rm -f {}\n", ETCD_SNAPSHOT)
                    + &self.etcdctl(&ip, "endpoint health")
                    + "\n"
                    + &self.etcdctl(&ip, "snapshot save")
                    + &script!(" {}\n", ETCD_SNAPSHOT)
            }
        };
        Ok(Step {
            name: "etcd: snapshot".into(),
            files: vec![],
            check: None,
            run,
            timeout: LONG,
        })
    }

    /// Removes the snapshot file a backup left on a member.
    pub(crate) fn etcd_snapshot_cleanup(&self) -> Step {
        Step {
            name: "etcd: remove snapshot file".into(),
            files: vec![],
            check: None,
            run: script!("rm -f {}\n", ETCD_SNAPSHOT),
            timeout: SHORT,
        }
    }

    /// First restore phase on `target`: the API server (control planes) and etcd (members)
    /// stop, as kubeadm documents it: static pod manifests moved out of the kubelet's
    /// directory, the etcd service stopped.
    pub(crate) fn etcd_restore_stop(&self, target: &Target) -> Step {
        let mut run = script!("set -eu\nmkdir -p {}\n", ETCD_PAUSED_DIR);
        if target.is_control_plane() {
            run += &script!(
                "if [ -f {} ]; then mv -f {} {}/; fi\n",
                APISERVER_MANIFEST,
                APISERVER_MANIFEST,
                ETCD_PAUSED_DIR
            );
        }
        let member = self
            .etcd_members()
            .iter()
            .any(|m| m.name() == target.name());
        match self.etcd {
            EtcdType::Stacked if member => {
                run += &script!(
                    "if [ -f {} ]; then mv -f {} {}/; fi\n",
                    STACKED_ETCD_MANIFEST,
                    STACKED_ETCD_MANIFEST,
                    ETCD_PAUSED_DIR
                );
                // The kubelet stops the pod once its manifest is gone.
                run += "for i in $(seq 1 60); do\n  [ -z \"$(crictl ps --name '^etcd$' -q 2>/dev/null)\" ] && break\n  sleep 2\ndone\n\
                        [ -z \"$(crictl ps --name '^etcd$' -q 2>/dev/null)\" ] || \
                        { echo 'the etcd static pod still runs 120 s after its manifest was set aside' >&2; exit 1; }\n";
            }
            EtcdType::External if member => run += "systemctl stop etcd\n",
            _ => {}
        }
        Step {
            name: "etcd restore: stop".into(),
            files: vec![],
            check: None,
            run,
            timeout: LONG,
        }
    }

    /// Second phase on a member: `etcdutl snapshot restore` with the member's own name and
    /// peer URL into a fresh directory inside the data directory, whose `member` directory then
    /// replaces the old one (kept as `/var/lib/etcd/kprov-previous/member` until the next
    /// restore). Only `member` moves, never the data directory itself: it is often a mount
    /// point (etcd on a disk of its own; the real-hosts tier's bind mount), which `mv` cannot
    /// rename (EBUSY), and inside it every move stays on one file system.
    pub(crate) fn etcd_restore_member(
        &self,
        member: &Target,
        arch: Arch,
        snapshot: &Bytes,
    ) -> Result<Vec<Step>, RenderError> {
        let ip = node_ip(&member.host)?;
        let fresh = format!("{ETCD_DATA_DIR}/kprov-restore");
        let previous = format!("{ETCD_DATA_DIR}/kprov-previous");
        let run = script!(
            "set -eu\nmkdir -p {}\nrm -rf {}\netcdutl snapshot restore {} --name {} --initial-cluster {} \
             --initial-cluster-token {} --initial-advertise-peer-urls {} --data-dir {}\n\
             rm -rf {}\nif [ -e {} ]; then mkdir -p {}; mv {} {}; fi\nmv {} {}\nrm -rf {}\nrm -f {}\n",
            ETCD_DATA_DIR,
            fresh,
            ETCD_RESTORE_UPLOAD,
            member.node_name,
            self.etcd_restore_cluster()?,
            self.etcd_cluster_token(),
            format!("https://{ip}:2380"),
            fresh,
            previous,
            format!("{ETCD_DATA_DIR}/member"),
            previous,
            format!("{ETCD_DATA_DIR}/member"),
            format!("{previous}/member"),
            format!("{fresh}/member"),
            format!("{ETCD_DATA_DIR}/member"),
            fresh,
            ETCD_RESTORE_UPLOAD
        );
        Ok(vec![
            // etcdutl comes with the pinned etcd release (stacked control planes lack it).
            self.install_step(Component::Etcd, arch)?,
            Step {
                name: "etcd restore: snapshot restore".into(),
                files: vec![file(ETCD_RESTORE_UPLOAD, snapshot.clone(), 0o600)],
                check: None,
                run,
                timeout: LONG,
            },
        ])
    }

    /// Third phase on a member: etcd starts again on the restored data.
    pub(crate) fn etcd_restore_start(&self) -> Step {
        let run = match self.etcd {
            EtcdType::Stacked => script!(
                "set -eu\nmv -f {}/etcd.yaml {}\n",
                ETCD_PAUSED_DIR,
                STACKED_ETCD_MANIFEST
            ),
            EtcdType::External => "systemctl start etcd\n".into(),
        };
        Step {
            name: "etcd restore: start etcd".into(),
            files: vec![],
            check: None,
            run,
            timeout: LONG,
        }
    }

    /// Fourth phase on a member: wait until it is healthy (a member only is once a quorum of
    /// its peers runs).
    pub(crate) fn etcd_health(&self, member: &Target) -> Result<Step, RenderError> {
        let ip = node_ip(&member.host)?;
        Ok(Step {
            name: "etcd: health".into(),
            files: vec![],
            check: None,
            run: "for i in $(seq 1 60); do\n  ".to_string()
                + &self.etcdctl(&ip, "endpoint health")
                + " && exit 0\n  sleep 2\ndone\necho 'etcd did not become healthy in 120 s' >&2\nexit 1\n",
            timeout: LONG,
        })
    }

    /// Last phase on a control plane: its API server starts again.
    pub(crate) fn etcd_restore_apiserver(&self) -> Step {
        Step {
            name: "etcd restore: start the API server".into(),
            files: vec![],
            check: None,
            run: script!(
                "set -eu\nif [ -f {}/kube-apiserver.yaml ]; then mv -f {}/kube-apiserver.yaml {}; fi\n",
                ETCD_PAUSED_DIR,
                ETCD_PAUSED_DIR,
                APISERVER_MANIFEST
            ),
            timeout: SHORT,
        }
    }

    /// What the first control plane needs to reach external etcd, copied from an etcd host.
    pub(crate) fn etcd_client(&self, ca_cert: &Bytes, cert: &Bytes, key: &Bytes) -> Step {
        Step {
            name: "etcd: client certificates".into(),
            files: vec![
                file(ETCD_CA_CERT, ca_cert.clone(), 0o644),
                file(ETCD_CLIENT_CERT, cert.clone(), 0o644),
                file(ETCD_CLIENT_KEY, key.clone(), 0o600),
            ],
            check: Some("true".into()),
            run: "true".into(),
            timeout: SHORT,
        }
    }

    /// The kubelet's flags of a running member, rewritten as kubeadm writes them at join
    /// (`/var/lib/kubelet/kubeadm-flags.env`), from the spec's registration of `target`
    /// (node IP, labels, provider ID); the kubelet restarts when they changed. A marker with
    /// the flags last applied makes a cut run restart it on the next one.
    pub(crate) fn kubelet_flags(&self, target: &Target) -> Result<Step, RenderError> {
        let reg = self.registration(target)?;
        let mut flags = vec![format!("--container-runtime-endpoint={CRI_SOCKET}")];
        for arg in reg["kubelet_args"].as_array().into_iter().flatten() {
            let (Some(name), Some(value)) = (arg["name"].as_str(), arg["value"].as_str()) else {
                return Err(RenderError::Host {
                    host: target.host.name.clone(),
                    message: format!("kubelet flag {arg}: no name or no value"),
                });
            };
            // A systemd environment file: one double-quoted value, so nothing that quoting or
            // word splitting would change may appear in it.
            if !value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:/=,@+".contains(&b))
            {
                return Err(RenderError::Host {
                    host: target.host.name.clone(),
                    message: format!(
                        "kubelet flag --{name}: {value:?} has characters a kubelet flag file cannot hold"
                    ),
                });
            }
            flags.push(format!("--{name}={value}"));
        }
        let content = format!("KUBELET_KUBEADM_ARGS=\"{}\"\n", flags.join(" "));
        Ok(Step {
            name: "kubelet: flags".into(),
            files: vec![file(KUBELET_FLAGS, content, 0o644)],
            check: Some(script!("cmp -s {KUBELET_FLAGS} {KUBELET_FLAGS_APPLIED}")),
            run: script!(
                "set -e\nsystemctl restart kubelet\nmkdir -p /var/lib/kprov\ncp {KUBELET_FLAGS} {KUBELET_FLAGS_APPLIED}\n"
            ),
            timeout: SHORT,
        })
    }

    /// The in-place Kubernetes upgrade of a member, in kubeadm's order: the new kubeadm (from
    /// the pinned assets), `kubeadm upgrade apply vX` on the first control plane or
    /// `kubeadm upgrade node` elsewhere, then the new kubelet and kubectl, then a kubelet
    /// restart on the new binary. Every step checks a marker first: a cut run repeats only
    /// what it had not finished.
    pub(crate) fn upgrade(
        &self,
        arch: Arch,
        how: crate::nodes::roll::Upgrade,
    ) -> Result<Vec<Step>, RenderError> {
        let version = format!("v{}", self.kubernetes_version);
        // The same preflight skip as init/join (cgroup v1 hosts), as a flag: upgrade reads no
        // kprov configuration file.
        let mut ignore = self.node.ignore_preflight_errors();
        if matches!(how, crate::nodes::roll::Upgrade::Apply) {
            // `upgrade apply`'s CreateJob check runs a Job that must complete within a
            // minute; kprov drains a control plane before upgrading it, so on a cluster whose
            // only schedulable nodes are control planes (or under load) that Job cannot run
            // and the upgrade stops (found on real hosts; Kubespray ignores every upgrade
            // preflight). kprov validated the cluster itself before this batch.
            ignore.push("CreateJob");
        }
        let flags: String = ignore
            .iter()
            .map(|e| format!(" {}", sh_quote(&format!("--ignore-preflight-errors={e}"))))
            .collect();
        let mut steps = vec![self.install_step(Component::Kubeadm, arch)?];
        let (name, command) = match how {
            crate::nodes::roll::Upgrade::Apply => (
                "kubeadm: upgrade apply",
                script!("set -e\nkubeadm upgrade apply {} --yes", version),
            ),
            crate::nodes::roll::Upgrade::Node => (
                "kubeadm: upgrade node",
                "set -e\nkubeadm upgrade node".into(),
            ),
        };
        let run = format!(
            "{command}{flags}\n{}",
            script!(
                "mkdir -p /var/lib/kprov\nprintf '%s\\n' {} > {UPGRADED_MARKER}\n",
                version
            )
        );
        steps.push(Step {
            name: format!("{name} {version}"),
            files: vec![],
            check: Some(script!(
                "[ \"$(cat {UPGRADED_MARKER} 2>/dev/null)\" = {} ]",
                version
            )),
            run,
            timeout: LONG,
        });
        steps.push(self.install_step(Component::Kubelet, arch)?);
        steps.push(self.install_step(Component::Kubectl, arch)?);
        let kubelet = &self.asset(Component::Kubelet, arch)?.sha256;
        steps.push(Step {
            name: format!("kubelet: restart on {version}"),
            files: vec![],
            check: Some(script!(
                "[ \"$(cat {KUBELET_RESTARTED} 2>/dev/null)\" = {} ]",
                kubelet
            )),
            run: script!(
                "set -e\nsystemctl daemon-reload\nsystemctl restart kubelet\nmkdir -p /var/lib/kprov\nprintf '%s\\n' {} > {KUBELET_RESTARTED}\n",
                kubelet
            ),
            timeout: SHORT,
        });
        Ok(steps)
    }

    /// What provisioning `target` sets up, as recorded on it ([`Provisioned`]): the version,
    /// a digest of its kubeadm/kubelet configuration, its labels and taints.
    pub(crate) fn provisioned(&self, target: &Target) -> Result<Provisioned, RenderError> {
        let mut ctx = self.kubeadm_common(target)?;
        ctx.insert("kubernetes_version".into(), json!(self.kubernetes_version));
        // The preflight skip reaches the digest through `node`, not on its own.
        ctx.remove("ignore_preflight_errors");
        let mut node = self.node.digest_entries();
        // Mirrors and proxy change what the node runs with: a change makes it out of date.
        // Only digests: the credentials in hosts.toml never reach the record in clear.
        if !self.registry_files.is_empty() {
            let mut h = Sha256::new();
            for f in &self.registry_files {
                h.update(f.path.as_bytes());
                h.update(&f.content);
            }
            node.insert("registries".into(), json!(hex::encode(h.finalize())));
        }
        if let Some(repo) = &self.image_repository {
            node.insert("image_repository".into(), json!(repo));
        }
        if let Some(p) = &self.proxy {
            node.insert("proxy".into(), json!(p.dropin("")));
        }
        if !node.is_empty() {
            ctx.insert("node_settings".into(), Value::Object(node));
        }
        // serde_json maps are ordered (BTreeMap): the digest is stable.
        let digest = Sha256::digest(Value::Object(ctx).to_string().as_bytes());
        Ok(Provisioned {
            kubernetes_version: self.kubernetes_version.clone(),
            config_digest: hex::encode(digest),
            labels: target.host.labels.clone(),
            taints: target.host.taints.clone(),
            settings: Some(self.node.recorded()),
            launch_template_version: target
                .instance
                .as_ref()
                .and_then(|i| i.launch_template_version.clone()),
        })
    }

    /// The kubelet's flags and, when `config` is given (the node's
    /// /var/lib/kubelet/config.yaml as it should be), its configuration file, with one
    /// restart when either differs from what the kubelet last started with (markers under
    /// /var/lib/kprov: a run cut between the write and the restart restarts on the next).
    pub(crate) fn kubelet_flags_and_config(
        &self,
        target: &Target,
        config: Option<String>,
    ) -> Result<Step, RenderError> {
        let mut step = self.kubelet_flags(target)?;
        let Some(config) = config else {
            return Ok(step);
        };
        step.name = "kubelet: flags and configuration".into();
        step.files.push(file(KUBELET_CONFIG, config, 0o644));
        step.check = Some(script!(
            "cmp -s {KUBELET_FLAGS} {KUBELET_FLAGS_APPLIED} && cmp -s {KUBELET_CONFIG} {KUBELET_CONFIG_APPLIED}"
        ));
        step.run = script!(
            "set -e\nsystemctl restart kubelet\nmkdir -p /var/lib/kprov\ncp {KUBELET_FLAGS} {KUBELET_FLAGS_APPLIED}\ncp {KUBELET_CONFIG} {KUBELET_CONFIG_APPLIED}\n"
        );
        Ok(step)
    }

    /// The spec's kubelet and kube-proxy settings.
    pub(crate) fn node_settings(&self) -> &NodeSettings {
        &self.node
    }

    /// Records [`Renderer::provisioned`] on the host; the last step of a provisioning, so the
    /// record never claims more than was done.
    pub(crate) fn record(&self, target: &Target) -> Result<Step, RenderError> {
        Ok(Step {
            name: "kprov: provisioning record".into(),
            files: vec![file(
                PROVISIONED_FILE,
                self.provisioned(target)?.to_json(),
                0o644,
            )],
            check: Some("true".into()),
            run: "true".into(),
            timeout: SHORT,
        })
    }

    /// Claims the host for `owner` before anything else changes it: the marker is created
    /// with `ln` (atomic, fails if it exists), so of two clusters racing for a host one wins
    /// and the other's step fails naming the winner. Re-claiming an own host changes nothing.
    pub(crate) fn claim(&self, owner: &Owner) -> Step {
        Step {
            name: "ownership: claim".into(),
            files: vec![],
            check: Some(script!(
                "[ \"$(sed -n 's/^uid=//p' {OWNER_FILE} 2>/dev/null)\" = {} ]",
                owner.uid
            )),
            run: script!(
                "set -e\nuid={}\nmarker={}\nf={OWNER_FILE}\n\
                 if [ -e \"$f\" ]; then\n\
                   [ \"$(sed -n 's/^uid=//p' \"$f\")\" = \"$uid\" ] && exit 0\n\
                   printf 'this host belongs to another cluster: %s\\n' \"$(tr '\\n' ' ' < \"$f\" | head -c 512)\" >&2\n  exit 1\nfi\n\
                 mkdir -p \"$(dirname \"$f\")\"\nnew=\"$f.kprov-new.$$\"\nprintf '%s' \"$marker\" > \"$new\"\n\
                 if ! ln \"$new\" \"$f\" 2>/dev/null; then\n  rm -f \"$new\"\n\
                   [ \"$(sed -n 's/^uid=//p' \"$f\")\" = \"$uid\" ] && exit 0\n\
                   printf 'this host belongs to another cluster: %s\\n' \"$(tr '\\n' ' ' < \"$f\" | head -c 512)\" >&2\n  exit 1\nfi\n\
                 rm -f \"$new\"\n",
                owner.uid,
                owner.marker()
            ),
            timeout: SHORT,
        }
    }

    /// Removes Kubernetes from a host (`delete cluster`), only if its marker names `owner`
    /// (checked on the host, right before the reset).
    pub(crate) fn reset(&self, target: &Target, owner: &Owner) -> Result<Vec<Step>, RenderError> {
        let host = &target.host;
        Ok(vec![Step {
            name: "kubeadm: reset".into(),
            files: vec![],
            check: Some(
                "! [ -e /etc/kubernetes ] && ! [ -e /var/lib/kubelet ] && ! [ -e /var/lib/kprov ]"
                    .into(),
            ),
            run: self.render(
                "node/reset.sh.tera",
                json!({ "node": { "name": host.name }, "owner_uid": owner.uid, "owner_file": OWNER_FILE }),
            )?,
            timeout: LONG,
        }])
    }
}

fn parse_endpoint(e: &str) -> Result<Endpoint, RenderError> {
    let bad = || RenderError::BadEndpoint(e.to_string());
    let (host, port) = if let Some(rest) = e.strip_prefix('[') {
        // [IPv6]:port or [IPv6]
        let (h, after) = rest.split_once(']').ok_or_else(bad)?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse::<u16>().map_err(|_| bad())?,
            None if after.is_empty() => 6443,
            None => return Err(bad()),
        };
        (format!("[{h}]"), port)
    } else {
        match e.split_once(':') {
            Some((h, p)) => (h.to_string(), p.parse::<u16>().map_err(|_| bad())?),
            None => (e.to_string(), 6443),
        }
    };
    if host.is_empty() || host.contains('/') || host.contains(char::is_whitespace) {
        return Err(bad());
    }
    Ok(Endpoint::Fixed { host, port })
}

/// A readable dump of steps, for golden tests.
#[cfg(test)]
pub(crate) fn describe(steps: &[Step]) -> String {
    let mut out = String::new();
    for s in steps {
        out.push_str(&format!(
            "=== step: {} (timeout {}s)\n",
            s.name,
            s.timeout.as_secs()
        ));
        for f in &s.files {
            out.push_str(&format!("--- file {} (mode {:o})\n", f.path, f.mode));
            match std::str::from_utf8(&f.content) {
                Ok(t) => out.push_str(t),
                Err(_) => out.push_str(&format!("<{} bytes>\n", f.content.len())),
            }
            if !out.ends_with('\n') {
                out.push('\n');
            }
        }
        if let Some(c) = &s.check {
            out.push_str(&format!("--- check\n{c}\n"));
        }
        out.push_str(&format!("--- run\n{}", s.run));
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
#[path = "render_hostile.rs"]
mod hostile;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    /// A control plane: every image archive.
    pub(super) const CP: &[crate::spec::HostRole] = &[crate::spec::HostRole::ControlPlane];
    use crate::provision::orchestrate::tests::{cluster, hosts, owner, resolved, targets};
    use serde_json::Value;

    fn secrets() -> JoinSecrets {
        JoinSecrets {
            token: "abcdef.0123456789abcdef".into(),
            ca_cert_hash: "98eaf2e53ec610253dd7e225ff8b8d4bf37f038900b6d1de2f9cdf97ad50af71".into(),
            certificate_key: "c".repeat(64),
        }
    }

    fn docs(yaml: &str) -> Vec<Value> {
        yaml.split("\n---\n")
            .map(|d| serde_saphyr::from_str::<Value>(d).unwrap_or_else(|e| panic!("{e}\n{d}")))
            .collect()
    }

    const AWS_CCM: &str = "  cloudControllerManager:\n    provider: aws\n";

    /// The renderer of the test cluster with `extra` added to its spec, over `targets`.
    fn renderer(extra: &str, targets: &[Target]) -> Renderer {
        Renderer::new(&resolved(&cluster(extra)), targets).unwrap()
    }

    #[test]
    fn golden_first_control_plane() {
        let hs = hosts(3, 2);
        let r = renderer("", &targets(&hs));
        let mut steps = r.preflight(&targets(&hs)[0]).unwrap();
        steps.extend(r.init(&targets(&hs)[0], &"k".repeat(64)).unwrap());
        steps.extend(r.settle(&targets(&hs)[0]).unwrap());
        insta::assert_snapshot!("first_control_plane", describe(&steps));
    }

    /// A cloud instance registers under its private DNS name with its provider ID; a metal
    /// host under its own name without one.
    #[test]
    fn golden_cloud_instance_registration() {
        let hs = hosts(1, 1);
        let mut ts = targets(&hs);
        ts[1].node_name = "ip-10-0-1-23.ec2.internal".into();
        ts[1].group = Some("nodes-us-east-1a".into());
        ts[1].instance = Some(crate::nodes::CloudInstance {
            id: "i-0123456789abcdef0".into(),
            zone: "us-east-1a".into(),
            private_ip: "198.18.0.12".into(),
            public_ip: None,
            private_dns: "ip-10-0-1-23.ec2.internal".into(),
            provider_id: "aws:///us-east-1a/i-0123456789abcdef0".into(),
            launch_template_version: None,
            group_template_version: None,
        });
        let r = renderer(AWS_CCM, &ts);
        let join = r.join_config(&ts[1], &secrets()).unwrap();
        insta::assert_snapshot!("join_cloud_instance", join);
        let reg = &docs(&join)[0]["nodeRegistration"];
        assert_eq!(reg["name"], "ip-10-0-1-23.ec2.internal");
        let args = reg["kubeletExtraArgs"].as_array().unwrap();
        assert!(
            args.iter().any(|a| a["name"] == "provider-id"
                && a["value"] == "aws:///us-east-1a/i-0123456789abcdef0")
        );
        let metal = docs(&r.join_config(&ts[0], &secrets()).unwrap());
        assert_eq!(metal[0]["nodeRegistration"]["name"], "cp1");
        assert!(
            !metal[0]["nodeRegistration"]["kubeletExtraArgs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["name"] == "provider-id")
        );
    }

    /// AWS: the first control plane's `kubeadm init` uses the API record behind the load
    /// balancer as the endpoint, carries the load balancer's name among the certificate names,
    /// registers under the private DNS name with the provider ID and an external cloud
    /// provider. The uninitialized taint is the kubelet's own (it adds it itself with
    /// `--cloud-provider=external`; listing it again would make a duplicate the API refuses).
    #[test]
    fn golden_aws_init() {
        let hs = hosts(1, 1);
        let mut ts = targets(&hs);
        ts[0].node_name = "ip-198-18-32-4.ec2.internal".into();
        ts[0].host.address = "198.18.32.4".into();
        ts[0].host.ip = Some("198.18.32.4".into());
        ts[0].group = Some("control-plane-us-east-1a".into());
        ts[0].instance = Some(crate::nodes::CloudInstance {
            id: "i-0aaa".into(),
            zone: "us-east-1a".into(),
            private_ip: "198.18.32.4".into(),
            public_ip: None,
            private_dns: "ip-198-18-32-4.ec2.internal".into(),
            provider_id: "aws:///us-east-1a/i-0aaa".into(),
            launch_template_version: Some("1".into()),
            group_template_version: None,
        });
        let lb = "api-c-example-com-1a2b3c4d.elb.us-east-1.amazonaws.com";
        let r = renderer(AWS_CCM, &ts).with_cloud_api(CloudApi {
            endpoint: "api.c.example.com".into(),
            port: 6443,
            sans: vec![lb.into()],
        });
        let init = r.init_config(&ts[0], &"k".repeat(64)).unwrap();
        insta::assert_snapshot!("aws_init", init);
        let d = docs(&init);
        let reg = &d[0]["nodeRegistration"];
        assert_eq!(reg["name"], "ip-198-18-32-4.ec2.internal");
        let args = reg["kubeletExtraArgs"].as_array().unwrap();
        for (k, v) in [
            ("provider-id", "aws:///us-east-1a/i-0aaa"),
            ("cloud-provider", "external"),
        ] {
            assert!(
                args.iter().any(|a| a["name"] == k && a["value"] == v),
                "{k}"
            );
        }
        assert!(!init.contains("node.cloudprovider.kubernetes.io/uninitialized"));
        assert_eq!(d[1]["controlPlaneEndpoint"], "api.c.example.com:6443");
        let sans: Vec<&str> = d[1]["apiServer"]["certSANs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for n in [
            "api.c.example.com",
            lb,
            "ip-198-18-32-4.ec2.internal",
            "198.18.32.4",
        ] {
            assert!(sans.contains(&n), "{n} in {sans:?}");
        }
        // A cloud endpoint needs no /etc/hosts line (that is the metal local-proxy scheme).
        assert!(r.endpoint_entry("198.18.32.4").is_none());
    }

    #[test]
    fn golden_install_amd64() {
        let hs = hosts(1, 0);
        let r = renderer("", &targets(&hs));
        insta::assert_snapshot!(
            "install_amd64",
            describe(&r.install(Arch::Amd64, CP).unwrap())
        );
    }

    /// A cluster with one `file://` image archive (a tar written to `dir`) and one served
    /// over https; returns the cluster and the local archive's URL and sha256.
    fn with_images(dir: &std::path::Path, content: &[u8]) -> (Cluster, String, String) {
        let path = dir.join("pause.tar");
        std::fs::write(&path, content).unwrap();
        let sha = hex::encode(Sha256::digest(content));
        let url = format!("file://{}", path.display());
        let c = cluster(&format!(
            "  assets:\n    images:\n    - url: {url}\n      sha256: {sha}\n    \
             - url: https://mirror.example/images/kube-apiserver.tar\n      sha256: {}\n",
            "ab".repeat(32)
        ));
        (c, url, sha)
    }

    #[test]
    fn golden_image_archives() {
        let dir = tempfile::tempdir().unwrap();
        let (c, _, _) = with_images(dir.path(), b"not really a tar\n");
        let hs = hosts(1, 1);
        let r = Renderer::new(&resolved(&c), &targets(&hs)).unwrap();
        let steps = r.images(CP).unwrap();
        let text = describe(&steps).replace(&dir.path().display().to_string(), "/OPERATOR");
        insta::assert_snapshot!("image_archives", text);
        // One step for both: the uploaded archive goes up with the step's batch, the other
        // is downloaded by the host. Only the downloaded one is hashed by the script (the
        // upload checked the other's sha256 before renaming it into place), and the digest
        // kprov verified travels with the file, so the engine does not hash it again.
        assert_eq!(steps.len(), 1);
        // Two archives: each keeps the time a step of its own had.
        assert_eq!(steps[0].timeout, IMAGE_TIMEOUT * 2);
        assert_eq!(steps[0].files.len(), 1);
        assert_eq!(
            steps[0].files[0].sha256.as_deref(),
            Some(hex::encode(Sha256::digest(b"not really a tar\n")).as_str())
        );
        assert_eq!(steps[0].run.matches("sha256sum").count(), 1);
        assert!(steps[0].run.contains("if [ -n \"$u\" ]; then"));
        // The uploaded archive is imported as soon as it lands: the same import, of it alone,
        // under an archive's timeout (the step's run then finds its marker).
        let hook = steps[0].files[0]
            .on_arrival
            .as_ref()
            .expect("an import on arrival");
        assert_eq!(hook.timeout, IMAGE_TIMEOUT);
        insta::assert_snapshot!(
            "image_archive_on_arrival",
            hook.run
                .replace(&dir.path().display().to_string(), "/OPERATOR")
        );
        assert_eq!(hook.run.matches("\nimport ").count(), 1, "{}", hook.run);

        // After containerd runs with its configuration and the kubelet unit, at the end of
        // the install phase, so before any kubeadm step of init or join.
        let names: Vec<String> = r
            .install(Arch::Amd64, CP)
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        let pos = |n: &str| names.iter().position(|x| x == n).unwrap();
        let images = "images: import pause.tar, kube-apiserver.tar";
        assert!(pos("containerd: configure") < pos(images));
        // An active containerd whose CRI plugin did not load is neither converged nor done
        // (found on real hosts: kubeadm join failed later on `unknown service`).
        let install = r.install(Arch::Amd64, CP).unwrap();
        let configure = &install[pos("containerd: configure")];
        assert!(
            configure
                .check
                .as_deref()
                .is_some_and(|c| c.contains("crictl --timeout 5s info")),
            "{configure:?}"
        );
        assert!(configure.run.contains("until crictl --timeout 5s info"));
        let binaries = names
            .iter()
            .position(|x| x.starts_with("binaries: install "));
        assert!(
            binaries.is_some_and(|c| c < pos("containerd: configure")),
            "{names:?}"
        );
        assert!(pos("kubelet: service") < pos(images));
        assert_eq!(names.last().map(String::as_str), Some(images));
        // One buffer for every host: the engine hashes it once.
        let again = r.images(CP).unwrap();
        assert_eq!(
            steps[0].files[0].content.as_ptr(),
            again[0].files[0].content.as_ptr()
        );
    }

    /// A `file://` binary is read and checked against its pinned sha256 once per run on the
    /// operator's machine: every host's upload shares the buffer and carries the digest (the
    /// engine does not hash it again), and the host's install does not hash it either; a
    /// mismatch names the file before anything reaches a host.
    #[test]
    fn a_local_binary_is_verified_once_on_the_operators_machine() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubectl");
        std::fs::write(&path, b"kubectl binary\n").unwrap();
        let sha = hex::encode(Sha256::digest(b"kubectl binary\n"));
        let yaml = |sha: &str| {
            format!(
                "  assets:\n    files:\n    - name: kubectl\n      url: file://{}\n      sha256: {sha}\n",
                path.display()
            )
        };
        let hs = hosts(1, 1);
        let r = renderer(&yaml(&sha), &targets(&hs));
        let a = r.install_step(Component::Kubectl, Arch::Amd64).unwrap();
        let b = r.install_step(Component::Kubectl, Arch::Amd64).unwrap();
        assert_eq!(a.files[0].content.as_ptr(), b.files[0].content.as_ptr());
        assert_eq!(a.files[0].sha256.as_deref(), Some(sha.as_str()));
        assert!(!a.run.contains("sha256sum"), "{}", a.run);
        let wrong = "ab".repeat(32);
        let r = renderer(&yaml(&wrong), &targets(&hs));
        let e = r
            .install_step(Component::Kubectl, Arch::Amd64)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&path.display().to_string())
                && e.contains(&format!("expected sha256 {wrong}, got {sha}"))
                && e.contains("nothing uploaded"),
            "{e}"
        );
        // One path under two pins: the second asset is checked against its own pin, not
        // handed the bytes the first one verified.
        let both = format!(
            "{}    - name: kubeadm\n      url: file://{}\n      sha256: {wrong}\n",
            yaml(&sha),
            path.display()
        );
        let r = renderer(&both, &targets(&hs));
        r.install_step(Component::Kubectl, Arch::Amd64).unwrap();
        let e = r
            .install_step(Component::Kubeadm, Arch::Amd64)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("expected sha256 {wrong}, got {sha}")),
            "{e}"
        );
    }

    /// Every binary is installed by one step: one upload stream, each uploaded binary's install
    /// (its own step's script) as its arrival hook, a run that installs, in order, each binary
    /// its hook did not (`$KPROV_HOOKED`) and whose check fails, naming the binary when it
    /// fails; converged when every binary's check passes.
    #[test]
    fn the_binaries_are_one_step_each_installed_as_it_lands() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubectl");
        std::fs::write(&path, b"kubectl binary\n").unwrap();
        let sha = hex::encode(Sha256::digest(b"kubectl binary\n"));
        let yaml = format!(
            "  assets:\n    files:\n    - name: kubectl\n      url: file://{}\n      sha256: {sha}\n",
            path.display()
        );
        let hs = hosts(1, 1);
        let r = renderer(&yaml, &targets(&hs));
        let install = r.install(Arch::Amd64, CP).unwrap();
        let all = Component::NODE_BINARIES;
        let step = &install[0];
        assert!(
            step.name.starts_with("binaries: install runc "),
            "{}",
            step.name
        );
        // One watchdog for the batch: the budget the seven steps had, not one step's.
        assert_eq!(step.timeout, LONG * 7);
        assert_eq!(
            install
                .iter()
                .filter(|s| all
                    .iter()
                    .any(|c| s.name.starts_with(&format!("{}: install", c.name()))))
                .count(),
            0,
            "no binary has a step of its own"
        );
        // The only uploaded binary (the others are downloaded by the host).
        let own = r.install_step(Component::Kubectl, Arch::Amd64).unwrap();
        assert_eq!(step.files.len(), 1);
        let f = &step.files[0];
        assert_eq!(f.path, own.files[0].path);
        assert_eq!(
            f.on_arrival.as_ref().map(|a| a.run.as_str()),
            Some(own.run.as_str())
        );
        assert!(step.run.contains(&script!(
            "hooked {} || sh -c {}",
            f.path,
            own.check.as_deref().unwrap()
        )));
        for c in all {
            let one = r.install_step(c, Arch::Amd64).unwrap();
            let check = one.check.unwrap();
            assert!(step.check.as_deref().unwrap().contains(&check), "{c:?}");
            let version = one.name.rsplit(' ').next().unwrap().to_string();
            assert!(
                step.run.contains(&script!(
                    "sh -c {} >/dev/null 2>&1 || sh -c {} || failed {} {}\n",
                    check,
                    one.run,
                    c.name(),
                    version
                )),
                "{c:?}: {}",
                step.run
            );
        }
        // In order, so the runtime's binaries are there before its configuration.
        let order: Vec<usize> = all
            .iter()
            .map(|c| {
                step.run
                    .find(&format!(" || failed '{}' ", c.name()))
                    .unwrap_or_else(|| panic!("{c:?} not named: {}", step.run))
            })
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
        sh_n(&step.name, &step.run);
        sh_n(&step.name, step.check.as_deref().unwrap());
    }

    /// `sh -n`: the script (of the step `name`) parses.
    pub(crate) fn sh_n(name: &str, script: &str) {
        let out = std::process::Command::new("sh")
            .args(["-n", "-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: sh -n: {}\n{script}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A tar with one member `name` holding `json`, as an image archive's index.
    pub(crate) fn archive_with(name: &str, json: &str) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(json.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, json.as_bytes()).unwrap();
        b.into_inner().unwrap()
    }

    /// `archives` written to `dir` as `NAME.tar`, and the spec's `assets.images` listing them
    /// as `file://` URLs with their sums.
    pub(crate) fn images_yaml(dir: &std::path::Path, archives: &[(&str, &[u8])]) -> String {
        let mut yaml = String::from("  assets:\n    images:\n");
        for (name, bytes) in archives {
            let path = dir.join(format!("{name}.tar"));
            std::fs::write(&path, bytes).unwrap();
            yaml.push_str(&format!(
                "    - url: file://{}\n      sha256: {}\n",
                path.display(),
                hex::encode(Sha256::digest(bytes))
            ));
        }
        yaml
    }

    #[test]
    fn a_worker_gets_no_archive_of_the_control_planes_own_images() {
        use crate::spec::HostRole;
        let dir = tempfile::tempdir().unwrap();
        // A docker-archive (ctr/docker save) and an OCI layout (kprov's bundle), both local.
        let apiserver = archive_with(
            "manifest.json",
            r#"[{"Config":"c.json","Layers":[],"RepoTags":["registry.k8s.io/kube-apiserver:v1.36.2"]}]"#,
        );
        let etcd = archive_with(
            "index.json",
            r#"{"schemaVersion":2,"manifests":[{"annotations":{"io.containerd.image.name":"registry.k8s.io/etcd:3.6.5-0","org.opencontainers.image.ref.name":"3.6.5-0"}}]}"#,
        );
        let pause = archive_with(
            "manifest.json",
            r#"[{"RepoTags":["registry.k8s.io/pause:3.10.1"]}]"#,
        );
        let mut yaml = images_yaml(
            dir.path(),
            &[
                ("apiserver", &apiserver),
                ("etcd", &etcd),
                ("pause", &pause),
            ],
        );
        // Downloaded by the hosts: kprov cannot read it, so every host gets it.
        yaml.push_str(&format!(
            "    - url: https://mirror.example/images/kube-scheduler.tar\n      sha256: {}\n",
            "ab".repeat(32)
        ));
        let c = cluster(&yaml);
        let hs = hosts(1, 1);
        let r = Renderer::new(&resolved(&c), &targets(&hs)).unwrap();
        let names = |roles: &[HostRole]| -> Vec<String> {
            r.images(roles)
                .unwrap()
                .into_iter()
                .map(|s| s.name)
                .collect()
        };
        // One step, named by the images the archives hold; the one kprov cannot read by its
        // file name.
        let (apiserver, etcd, pause, scheduler) = (
            "registry.k8s.io/kube-apiserver:v1.36.2",
            "registry.k8s.io/etcd:3.6.5-0",
            "registry.k8s.io/pause:3.10.1",
            "kube-scheduler.tar",
        );
        let step = |l: &[&str]| vec![format!("images: import {}", l.join(", "))];
        assert_eq!(names(CP), step(&[apiserver, etcd, pause, scheduler]));
        assert_eq!(names(&[HostRole::Node]), step(&[pause, scheduler]));
        assert_eq!(
            names(&[HostRole::Etcd, HostRole::Node]),
            step(&[etcd, pause, scheduler])
        );
        // Converged only when every archive's marker is there.
        let cp = r.images(CP).unwrap();
        assert_eq!(
            cp[0].check.as_deref().unwrap().matches("test -f").count(),
            4
        );
        let urls: Vec<&str> = r
            .image_archives(&[HostRole::Node])
            .iter()
            .map(|i| i.file_name())
            .collect();
        assert_eq!(urls, ["pause.tar", "kube-scheduler.tar"]);
    }

    #[test]
    fn archive_references_read_both_layouts_and_nothing_else() {
        use crate::spec::HostRole;
        use crate::spec::assets::{archive_needed_on, archive_references};
        let docker = archive_with(
            "./manifest.json",
            r#"[{"RepoTags":["registry.k8s.io/kube-scheduler:v1.36.2","mirror.local/kube-scheduler:v1.36.2"]}]"#,
        );
        assert_eq!(
            archive_references(&docker),
            [
                "mirror.local/kube-scheduler:v1.36.2",
                "registry.k8s.io/kube-scheduler:v1.36.2"
            ]
        );
        // A bare tag names no repository.
        let oci = archive_with(
            "index.json",
            r#"{"manifests":[{"annotations":{"org.opencontainers.image.ref.name":"v1"}}]}"#,
        );
        assert!(archive_references(&oci).is_empty());
        assert!(archive_references(b"not really a tar\n").is_empty());
        assert!(archive_references(&archive_with("manifest.json", "{not json")).is_empty());
        // Named nothing: everywhere. A mixed archive: wherever one of its images runs.
        assert!(archive_needed_on(&[], &[HostRole::Node]));
        let mixed = [
            "r/kube-apiserver:v1".to_string(),
            "r/kube-proxy:v1".to_string(),
        ];
        assert!(archive_needed_on(&mixed, &[HostRole::Node]));
        let digest = ["r/kube-controller-manager@sha256:00".to_string()];
        assert!(!archive_needed_on(&digest, &[HostRole::Node]));
        assert!(archive_needed_on(&digest, &[HostRole::ControlPlane]));
        // A name that merely contains a control-plane image's name is not one.
        let other = ["r/my-kube-apiserver-proxy:v1".to_string()];
        assert!(archive_needed_on(&other, &[HostRole::Node]));
    }

    #[test]
    fn a_local_image_archive_with_another_checksum_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let (c, url, sha) = with_images(dir.path(), b"archive\n");
        std::fs::write(dir.path().join("pause.tar"), b"tampered\n").unwrap();
        let actual = hex::encode(Sha256::digest(b"tampered\n"));
        let hs = hosts(1, 0);
        // Rendering what needs no archive still works (etcd backups, certificates, reset).
        let r = Renderer::new(&resolved(&c), &targets(&hs)).unwrap();
        let e = r.images(CP).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "image archive {url} (spec.assets.images): checksum mismatch: expected sha256 \
                 {sha}, got {actual}; nothing uploaded or imported"
            )
        );
        assert!(r.install(Arch::Amd64, CP).is_err());
        std::fs::remove_file(dir.path().join("pause.tar")).unwrap();
        let r = Renderer::new(&resolved(&c), &targets(&hs)).unwrap();
        let e = r.load_images().unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "image archive {url} (spec.assets.images): cannot read:"
            )),
            "{e}"
        );
    }

    #[test]
    fn golden_joins() {
        let mut hs = hosts(3, 2);
        hs[4].labels.insert("disk".into(), "ssd".into());
        hs[4].taints.push("dedicated=batch:NoSchedule".into());
        let r = renderer("", &targets(&hs));
        let mut cp = r
            .join(&targets(&hs)[1], &targets(&hs)[0], &secrets())
            .unwrap();
        cp.extend(r.settle(&targets(&hs)[1]).unwrap());
        insta::assert_snapshot!("join_control_plane", describe(&cp));
        let mut w = r
            .join(&targets(&hs)[4], &targets(&hs)[0], &secrets())
            .unwrap();
        w.extend(r.settle(&targets(&hs)[4]).unwrap());
        insta::assert_snapshot!("join_worker", describe(&w));
        insta::assert_snapshot!(
            "reset",
            describe(&r.reset(&targets(&hs)[4], &owner()).unwrap())
        );
    }

    /// `spec.api.localProxyImage` replaces the image of the workers' local API proxy.
    #[test]
    fn local_proxy_image_from_the_spec() {
        let hs = hosts(1, 1);
        let ts = targets(&hs);
        let r = renderer(
            "  api:\n    localProxyImage: registry.site.example/haproxy:2.6\n",
            &ts,
        );
        let w = describe(&r.settle(&ts[1]).unwrap());
        assert!(
            w.contains("image: \"registry.site.example/haproxy:2.6\"\n"),
            "{w}"
        );
        assert!(!w.contains(API_PROXY_IMAGE), "{w}");
    }

    #[test]
    fn golden_external_endpoint_external_etcd_and_ccm() {
        let mut hs = hosts(1, 1);
        hs[0].roles = vec![HostRole::ControlPlane];
        for (i, n) in ["etcd1", "etcd2", "etcd3"].iter().enumerate() {
            hs.push(Host {
                name: n.to_string(),
                address: format!("198.18.0.{}", 40 + i),
                roles: vec![HostRole::Etcd],
                ..hs[1].clone()
            });
        }
        let extra = format!("{AWS_CCM}  api:\n    endpoint: k8s-api.example.com:8443\n");
        let mut c = cluster(&extra);
        c.spec.etcd = Some(crate::spec::Etcd {
            kind: EtcdType::External,
        });
        let r = Renderer::new(&resolved(&c), &targets(&hs)).unwrap();
        let init = r.init_config(&targets(&hs)[0], &"k".repeat(64)).unwrap();
        insta::assert_snapshot!("init_config_external", init);
        let d = docs(&init);
        assert_eq!(d[1]["controlPlaneEndpoint"], "k8s-api.example.com:8443");
        assert_eq!(
            d[1]["etcd"]["external"]["endpoints"],
            serde_json::json!([
                "https://198.18.0.40:2379",
                "https://198.18.0.41:2379",
                "https://198.18.0.42:2379"
            ])
        );
        let ca = Bytes::from_static(b"CA CERT\n");
        let key = Bytes::from_static(b"CA KEY\n");
        let mut etcd = vec![r.etcd_ca()];
        etcd.extend(
            r.etcd_member(&targets(&hs)[3], Arch::Amd64, &ca, &key)
                .unwrap(),
        );
        insta::assert_snapshot!("external_etcd_member", describe(&etcd));
        assert!(
            matches!(Renderer::new(&resolved(&cluster("")), &targets(&hs)), Err(RenderError::Host { ref host, .. }) if host == "etcd1")
        );
        // etcd is a host service: an etcd member may also be a control plane or a worker.
        let mut both = hs.clone();
        both[0].roles.push(HostRole::Etcd);
        both[1].roles.push(HostRole::Etcd);
        both.truncate(3);
        let r = Renderer::new(&resolved(&c), &targets(&both)).unwrap();
        assert_eq!(
            r.etcd_hosts().map(|t| t.name()).collect::<Vec<_>>(),
            ["cp1", "w1", "etcd1"].map(String::from).to_vec()
        );
        let member = r
            .etcd_member(&targets(&both)[0], Arch::Arm64, &ca, &key)
            .unwrap();
        let install = member
            .iter()
            .find(|s| s.name.starts_with("etcd: install"))
            .unwrap();
        assert!(install.run.contains("'etcd-v3.6.8-linux-arm64/etcdutl'"));
        assert!(
            install
                .run
                .contains("438f56a700d17ce761510a3e63e6fa5c1d587b2dd4d7a22c179c09a649366760")
        );
        let conf = member
            .iter()
            .flat_map(|s| &s.files)
            .find(|f| f.path == ETCD_CONFIG)
            .unwrap();
        let conf: serde_json::Value =
            serde_saphyr::from_str(&String::from_utf8_lossy(&conf.content)).unwrap();
        assert_eq!(
            conf["initial-cluster"],
            "cp1=https://198.18.0.11:2380,w1=https://198.18.0.12:2380,etcd1=https://198.18.0.40:2380"
        );
        // No /etc/hosts games and no local proxy with a real load balancer in front.
        assert!(r.endpoint_entry("1.2.3.4").is_none());
        assert!(r.settle(&targets(&hs)[1]).unwrap().is_empty());
    }

    #[test]
    fn cloud_provider_flags_are_consistent() {
        let hs = hosts(1, 1);
        for (extra, external) in [
            ("", false),
            (AWS_CCM, true),
            ("  cloudControllerManager:\n    provider: none\n", false),
        ] {
            let r = renderer(extra, &targets(&hs));
            let init = docs(&r.init_config(&targets(&hs)[0], &"k".repeat(64)).unwrap());
            let join = docs(&r.join_config(&targets(&hs)[1], &secrets()).unwrap());
            for args in [
                &init[0]["nodeRegistration"]["kubeletExtraArgs"],
                &join[0]["nodeRegistration"]["kubeletExtraArgs"],
            ] {
                let has = args
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|a| a["name"] == "cloud-provider" && a["value"] == "external");
                assert_eq!(has, external, "{extra:?}: {args}");
            }
            // kube-apiserver and kube-controller-manager never get the flag.
            let cc = &init[1];
            assert!(cc["apiServer"].get("extraArgs").is_none());
            assert!(cc.get("controllerManager").is_none());
            let text = r.init_config(&targets(&hs)[0], "k").unwrap();
            assert_eq!(
                text.matches("cloud-provider").count(),
                usize::from(external)
            );
        }
    }

    #[test]
    fn additional_sans_reach_the_api_server_certificate() {
        let hs = hosts(1, 0);
        let c = cluster("  api:\n    additionalSANs: [k8s.example.com, 203.0.113.10]\n");
        let r = Renderer::new(&resolved(&c), &targets(&hs)).unwrap();
        let init = docs(&r.init_config(&targets(&hs)[0], &"k".repeat(64)).unwrap());
        let sans: Vec<&str> = init[1]["apiServer"]["certSANs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert!(sans.contains(&"k8s.example.com"), "{sans:?}");
        assert!(sans.contains(&"203.0.113.10"), "{sans:?}");
    }

    #[test]
    fn kubeadm_documents_are_v1beta4_and_pin_the_ca() {
        let hs = hosts(3, 1);
        let r = renderer("", &targets(&hs));
        let init = docs(&r.init_config(&targets(&hs)[0], &"k".repeat(64)).unwrap());
        assert_eq!(init[0]["apiVersion"], "kubeadm.k8s.io/v1beta4");
        assert_eq!(init[0]["kind"], "InitConfiguration");
        assert_eq!(init[1]["kind"], "ClusterConfiguration");
        assert_eq!(
            init[1]["controlPlaneEndpoint"],
            "api.internal.demo.example.com:6443"
        );
        assert_eq!(init[1]["networking"]["podSubnet"], "100.96.0.0/11");
        assert_eq!(init[1]["networking"]["serviceSubnet"], "100.64.0.0/13");
        assert_eq!(init[1]["kubernetesVersion"], "v1.35.1");
        assert_eq!(init[2]["kind"], "KubeletConfiguration");
        assert_eq!(init[2]["cgroupDriver"], "systemd");
        let join = docs(&r.join_config(&targets(&hs)[1], &secrets()).unwrap());
        let bt = &join[0]["discovery"]["bootstrapToken"];
        assert_eq!(
            bt["caCertHashes"][0],
            format!("sha256:{}", secrets().ca_cert_hash)
        );
        assert!(bt.get("unsafeSkipCAVerification").is_none());
        assert_eq!(join[0]["controlPlane"]["certificateKey"], "c".repeat(64));
        let worker = docs(&r.join_config(&targets(&hs)[3], &secrets()).unwrap());
        assert!(worker[0].get("controlPlane").is_none());
        assert!(worker[0]["nodeRegistration"].get("taints").is_none());
    }

    /// Defaults: kube-proxy in iptables mode with kube-proxy's own conntrack sizing, the
    /// kubelet's failCgroupV1 untouched, no preflight error skipped, the pause image of the
    /// minor, containerd without restrict_oom_score_adj, a clock check that fails.
    #[test]
    fn node_settings_default() {
        let hs = hosts(1, 1);
        let ts = targets(&hs);
        let r = renderer("", &ts);
        let init = docs(&r.init_config(&ts[0], &"k".repeat(64)).unwrap());
        assert_eq!(init.len(), 4);
        assert!(
            init[0]["nodeRegistration"]
                .get("ignorePreflightErrors")
                .is_none()
        );
        assert!(init[2].get("failCgroupV1").is_none());
        assert_eq!(init[3]["apiVersion"], "kubeproxy.config.k8s.io/v1alpha1");
        assert_eq!(init[3]["kind"], "KubeProxyConfiguration");
        assert_eq!(init[3]["mode"], "iptables");
        assert!(init[3].get("conntrack").is_none());
        let install = describe(&r.install(Arch::Amd64, CP).unwrap());
        assert!(install.contains("sandbox = \"registry.k8s.io/pause:3.10.1\""));
        assert!(!install.contains("restrict_oom_score_adj"));
        let preflight = r.preflight(&ts[0]).unwrap();
        let script = String::from_utf8(preflight[1].files[0].content.to_vec()).unwrap();
        assert!(script.contains("fail \"the clock is not synchronised"));
        assert!(script.contains("set spec.kubelet.failCgroupV1: false"));
        let up = describe(
            &r.upgrade(Arch::Amd64, crate::nodes::roll::Upgrade::Apply)
                .unwrap(),
        );
        // Only the health-check Job kubeadm cannot run on a drained control plane.
        assert!(
            up.contains(" '--ignore-preflight-errors=CreateJob'\n"),
            "{up}"
        );
        assert!(!up.contains("SystemVerification"), "{up}");
        let node = describe(
            &r.upgrade(Arch::Amd64, crate::nodes::roll::Upgrade::Node)
                .unwrap(),
        );
        assert!(!node.contains("ignore-preflight-errors"), "{node}");
        // 1.36 runs the pause image kubeadm 1.36 pins.
        let c = cluster("").tap_version("1.36.2");
        let r36 = Renderer::new(&resolved(&c), &ts).unwrap();
        let install = describe(&r36.install(Arch::Amd64, CP).unwrap());
        assert!(install.contains("sandbox = \"registry.k8s.io/pause:3.10.2\""));
        // 1.34's kubelet still runs on cgroup v1: no refusal rendered.
        let c = cluster("").tap_version("1.34.11");
        let r34 = Renderer::new(&resolved(&c), &ts).unwrap();
        let script =
            String::from_utf8(r34.preflight(&ts[0]).unwrap()[1].files[0].content.to_vec()).unwrap();
        assert!(!script.contains("set spec.kubelet.failCgroupV1: false"));
        assert!(script.contains("cgroup v1 support is deprecated"));
    }

    trait TapVersion {
        fn tap_version(self, v: &str) -> Self;
    }
    impl TapVersion for Cluster {
        fn tap_version(mut self, v: &str) -> Self {
            self.spec.kubernetes_version = Some(v.into());
            self
        }
    }

    const REAL_HOST_SETTINGS: &str = "  kubeProxy:\n    proxyMode: nftables\n    conntrackMaxPerCore: 0\n\
         \x20 kubelet:\n    failCgroupV1: false\n    evictionHard: nodefs.available<1Gi,imagefs.available<2%\n  containerd:\n    restrictOOMScoreAdj: true\n\
         \x20 preflight:\n    requireClockSync: false\n";

    /// The settings a host without some privileges needs (cgroup v1, no CAP_SYS_RESOURCE,
    /// read-only nf_conntrack_max, no NTP daemon) reach kubeadm, the kubelet, kube-proxy,
    /// containerd and the preflight; only SystemVerification is skipped, on init, join and
    /// upgrade alike.
    /// Mirrors and proxy reach the node: hosts.toml beside a config_path, kubeadm's image
    /// repository and the pause image rewritten, drop-ins for containerd and the kubelet,
    /// curl's proxy in every download; removing the proxy removes the drop-ins; the record's
    /// digest follows both, and never holds the password.
    #[test]
    fn mirrors_and_proxy_reach_the_node() {
        let hs = hosts(1, 1);
        let ts = targets(&hs);
        let mut c = cluster(
            "  containerd:\n    registries:\n    - name: registry.k8s.io\n      imageRepository: mirror.example.com:5000/k8s\n      mirrors:\n      - endpoint: https://mirror.example.com:5000\n\
             \x20 proxy:\n    https: http://proxy.example.com:3128\n    noProxy: [.corp.example]\n",
        );
        c.spec.hosts = hs.clone();
        c.spec.containerd.as_mut().unwrap().credentials.0.insert(
            "mirror.example.com:5000".into(),
            crate::spec::RegistryCredential {
                username: "u".into(),
                password: "pw-not-in-records".into(),
            },
        );
        let r = Renderer::new(&resolved(&c), &ts).unwrap();
        let install = r.install(Arch::Amd64, CP).unwrap();
        let step = |name: &str| install.iter().find(|s| s.name == name).unwrap();
        let text = |s: &Step, path: &str| {
            String::from_utf8(
                s.files
                    .iter()
                    .find(|f| f.path == path)
                    .unwrap()
                    .content
                    .to_vec(),
            )
            .unwrap()
        };
        let mirrors = step("containerd: registry mirrors");
        let hosts_toml = text(
            mirrors,
            "/etc/containerd/certs.d/registry.k8s.io/hosts.toml",
        );
        assert!(
            hosts_toml.contains("[host.\"https://mirror.example.com:5000\"]"),
            "{hosts_toml}"
        );
        assert!(
            hosts_toml.contains("Authorization = [\"Basic "),
            "{hosts_toml}"
        );
        let configure = step("containerd: configure");
        let config = text(configure, "/etc/containerd/config.toml");
        assert!(
            config.contains("config_path = \"/etc/containerd/certs.d\""),
            "{config}"
        );
        assert!(
            config.contains("sandbox = \"mirror.example.com:5000/k8s/pause:3.10.1\""),
            "{config}"
        );
        let dropin = text(configure, crate::spec::mirrors::CONTAINERD_PROXY_DROPIN);
        assert!(dropin.contains("Environment=\"HTTPS_PROXY=http://proxy.example.com:3128\""));
        assert!(
            dropin.contains(
                "NO_PROXY=.corp.example,198.18.0.11,198.18.0.12,100.96.0.0/11,100.64.0.0/13,\
                 api.internal.demo.example.com,localhost,127.0.0.1,.svc,.cluster.local\""
            ),
            "{dropin}"
        );
        let kubelet = step("kubelet: service");
        text(kubelet, crate::spec::mirrors::KUBELET_PROXY_DROPIN);
        assert!(kubelet.run.contains("systemctl try-restart kubelet"));
        let binaries = |install: &[Step]| {
            install
                .iter()
                .find(|s| s.name.starts_with("binaries: install "))
                .unwrap()
                .clone()
        };
        // Each binary's install script (quoted inside the step's run) sets the proxy first.
        let kubeadm = binaries(&install);
        assert!(
            kubeadm
                .run
                .contains("sh -c '# spec.proxy: downloads go through the proxy.\n"),
            "{}",
            kubeadm.run
        );
        assert!(
            kubeadm
                .run
                .contains("export https_proxy='\\''http://proxy.example.com:3128'\\''\n"),
            "{}",
            kubeadm.run
        );
        let init = docs(&r.init_config(&ts[0], &"k".repeat(64)).unwrap());
        assert_eq!(init[1]["imageRepository"], "mirror.example.com:5000/k8s");
        let record = r.provisioned(&ts[0]).unwrap();
        assert!(!record.to_json().contains("pw-not-in-records"));

        // Without proxy and registries: drop-ins removed, kprov's certs.d directories too,
        // no config_path, registry.k8s.io, and another record digest.
        let plain = renderer("", &ts);
        let install = plain.install(Arch::Amd64, CP).unwrap();
        let step = |name: &str| install.iter().find(|s| s.name == name).unwrap();
        let configure = step("containerd: configure");
        assert!(
            configure
                .run
                .contains("rm -f '/etc/systemd/system/containerd.service.d/http-proxy.conf'"),
            "{}",
            configure.run
        );
        assert!(configure.check.as_deref().unwrap().starts_with(
            "[ ! -e '/etc/systemd/system/containerd.service.d/http-proxy.conf' ] && "
        ));
        assert!(
            !configure
                .files
                .iter()
                .any(|f| f.path.contains("http-proxy"))
        );
        assert!(
            step("kubelet: service")
                .run
                .contains("rm -f '/etc/systemd/system/kubelet.service.d/http-proxy.conf'")
        );
        let mirrors = step("containerd: registry mirrors");
        assert!(mirrors.files.is_empty());
        assert!(mirrors.run.contains("kprov-managed"), "{}", mirrors.run);
        assert!(!binaries(&install).run.contains("proxy"));
        let init = docs(&plain.init_config(&ts[0], &"k".repeat(64)).unwrap());
        assert!(init[1].get("imageRepository").is_none());
        assert_ne!(
            plain.provisioned(&ts[0]).unwrap().config_digest,
            r.provisioned(&ts[0]).unwrap().config_digest
        );
    }

    #[test]
    fn node_settings_reach_every_component() {
        let hs = hosts(1, 1);
        let ts = targets(&hs);
        let r = renderer(REAL_HOST_SETTINGS, &ts);
        let init = docs(&r.init_config(&ts[0], &"k".repeat(64)).unwrap());
        assert_eq!(
            init[0]["nodeRegistration"]["ignorePreflightErrors"],
            json!(["SystemVerification"])
        );
        assert_eq!(init[2]["failCgroupV1"], false);
        assert_eq!(
            init[2]["evictionHard"],
            json!({"nodefs.available": "1Gi", "imagefs.available": "2%"})
        );
        assert_eq!(init[3]["mode"], "nftables");
        assert_eq!(init[3]["conntrack"]["maxPerCore"], 0);
        let join = docs(&r.join_config(&ts[1], &secrets()).unwrap());
        assert_eq!(
            join[0]["nodeRegistration"]["ignorePreflightErrors"],
            json!(["SystemVerification"])
        );
        for how in [
            crate::nodes::roll::Upgrade::Apply,
            crate::nodes::roll::Upgrade::Node,
        ] {
            let up = describe(&r.upgrade(Arch::Amd64, how).unwrap());
            assert!(
                up.contains(" '--ignore-preflight-errors=SystemVerification'"),
                "{up}"
            );
        }
        let install = describe(&r.install(Arch::Amd64, CP).unwrap());
        assert!(
            install.contains(
                "[plugins.'io.containerd.cri.v1.runtime']\n  restrict_oom_score_adj = true\n"
            ),
            "{install}"
        );
        let script =
            String::from_utf8(r.preflight(&ts[0]).unwrap()[1].files[0].content.to_vec()).unwrap();
        assert!(script.contains("warning: the clock is not NTP-synchronised"));
        assert!(!script.contains("fail \"the clock"));
        assert!(script.contains("warning: $node uses cgroup v1"));
        // kubeadm init and join name the containerd setting when sandboxes hit oom_score_adj.
        let init = describe(&r.init(&ts[0], &"k".repeat(64)).unwrap());
        assert!(
            init.contains("spec.containerd.restrictOOMScoreAdj: true"),
            "{init}"
        );
        let join = describe(&r.join(&ts[1], &ts[0], &secrets()).unwrap());
        assert!(
            join.contains("spec.containerd.restrictOOMScoreAdj: true"),
            "{join}"
        );
    }

    /// `kubeProxy.proxyMode: ipvs` (Kubespray's default `kube_proxy_mode`) is honoured on the
    /// host too: kube-proxy's configuration says ipvs and the IPVS modules are loaded (and
    /// kept across reboots) before kubeadm runs; iptables mode loads none.
    #[test]
    fn ipvs_mode_loads_the_ipvs_modules() {
        let hs = hosts(1, 0);
        let ts = targets(&hs);
        let r = renderer("  kubeProxy:\n    proxyMode: ipvs\n", &ts);
        let pre = r.preflight(&ts[0]).unwrap();
        let ipvs = pre
            .iter()
            .find(|s| s.name.contains("ipvs modules"))
            .expect("an ipvs modules step");
        assert_eq!(ipvs.files[0].path, IPVS_MODULES_FILE);
        let listed = String::from_utf8(ipvs.files[0].content.to_vec()).unwrap();
        for m in ["ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh"] {
            assert!(listed.lines().any(|l| l == m), "{listed}");
            assert!(
                ipvs.check
                    .as_deref()
                    .unwrap()
                    .contains(&format!("/sys/module/{m} ]"))
            );
        }
        assert!(ipvs.run.contains("modprobe \"$m\""), "{}", ipvs.run);
        let init = r.init_config(&ts[0], &"k".repeat(64)).unwrap();
        let proxy = docs(&init)
            .into_iter()
            .find(|d| d["kind"] == "KubeProxyConfiguration")
            .expect("a KubeProxyConfiguration");
        assert_eq!(proxy["mode"], "ipvs");
        let plain = renderer("", &ts);
        assert!(
            !plain
                .preflight(&ts[0])
                .unwrap()
                .iter()
                .any(|s| s.name.contains("ipvs"))
        );
    }

    /// Kubespray's `loadbalancer_apiserver.address` with `apiserver_loadbalancer_domain_name`:
    /// the endpoint's name points at the address in every host's /etc/hosts (the first control
    /// plane and joining nodes alike) and the address is in the API server certificate.
    #[test]
    fn endpoint_address_is_an_etc_hosts_line_and_a_san() {
        let hs = hosts(1, 1);
        let ts = targets(&hs);
        let r = renderer(
            "  api:\n    endpoint: api.example.com:8443\n    endpointAddress: 10.2.0.100\n",
            &ts,
        );
        let line = "10.2.0.100 api.example.com # kprov-api";
        let init = describe(&r.init(&ts[0], &"k".repeat(64)).unwrap());
        assert!(init.contains(line), "{init}");
        let join = describe(&r.join(&ts[1], &ts[0], &secrets()).unwrap());
        assert!(join.contains(line), "{join}");
        let config = r.init_config(&ts[0], &"k".repeat(64)).unwrap();
        let cc = docs(&config)
            .into_iter()
            .find(|d| d["kind"] == "ClusterConfiguration")
            .unwrap();
        let sans = &cc["apiServer"]["certSANs"];
        assert!(
            sans.as_array().unwrap().iter().any(|s| s == "10.2.0.100"),
            "{sans}"
        );
        assert_eq!(cc["controlPlaneEndpoint"], "api.example.com:8443");
        // Without the address, a fixed endpoint writes no /etc/hosts line at all.
        let r = renderer("  api:\n    endpoint: api.example.com:8443\n", &ts);
        assert!(r.endpoint_entry("198.18.0.1").is_none());
    }

    /// kubeadm's own KubeletConfiguration and KubeProxyConfiguration (as its ConfigMaps and
    /// /var/lib/kubelet/config.yaml hold them) with the fields kprov owns set from the spec
    /// and everything else kept; nothing to write when they already say it; another kind or
    /// a non-mapping refused, naming where it came from.
    #[test]
    fn component_configs_edited_in_kubeadms_format() {
        use ComponentConfig::{KubeProxy, Kubelet};
        let kubelet = include_str!("testdata/kubelet-config.yaml");
        let proxy = include_str!("testdata/kube-proxy-config.yaml");
        let settings = |extra: &str| NodeSettings::of(&cluster(extra).spec).unwrap();
        // The spec these files were written from (the real-hosts tier's).
        let lab = settings(
            "  kubeProxy: {conntrackMaxPerCore: 0}\n  kubelet:\n    failCgroupV1: false\n    \
             evictionHard: memory.available<100Mi,nodefs.available<2Gi,imagefs.available<2Gi\n",
        );
        assert_eq!(lab.edit_component_config(Kubelet, "k", kubelet), Ok(None));
        assert_eq!(lab.edit_component_config(KubeProxy, "p", proxy), Ok(None));

        let changed = settings(
            "  kubeProxy: {proxyMode: nftables, conntrackMaxPerCore: 0}\n  kubelet:\n    \
             failCgroupV1: false\n    maxPods: 50\n",
        );
        let k = changed
            .edit_component_config(Kubelet, "k", kubelet)
            .unwrap()
            .expect("maxPods set, evictionHard dropped");
        insta::assert_snapshot!("kubelet_config_max_pods", k);
        let mut want: Value = serde_saphyr::from_str(kubelet).unwrap();
        want.as_object_mut().unwrap().remove("evictionHard");
        want["maxPods"] = json!(50);
        let got: Value = serde_saphyr::from_str(&k).unwrap();
        assert_eq!(got, want, "only kprov's fields changed");
        assert_eq!(got["logging"]["options"]["json"]["infoBufferSize"], "0");
        assert_eq!(changed.edit_component_config(Kubelet, "k", &k), Ok(None));

        let p = changed
            .edit_component_config(KubeProxy, "p", proxy)
            .unwrap()
            .expect("mode changed");
        let mut want: Value = serde_saphyr::from_str(proxy).unwrap();
        want["mode"] = json!("nftables");
        let got: Value = serde_saphyr::from_str(&p).unwrap();
        assert_eq!(got, want);
        assert_eq!(got["conntrack"]["maxPerCore"], 0);
        // kube-proxy's own conntrack sizing again: kubeadm's `null`.
        let p = settings("")
            .edit_component_config(KubeProxy, "p", proxy)
            .unwrap()
            .expect("maxPerCore unset");
        let got: Value = serde_saphyr::from_str(&p).unwrap();
        assert_eq!(got["conntrack"]["maxPerCore"], Value::Null);
        assert_eq!(got["mode"], "iptables");

        let err = changed
            .edit_component_config(KubeProxy, "ConfigMap kube-system/kube-proxy", kubelet)
            .unwrap_err();
        assert_eq!(
            err,
            "ConfigMap kube-system/kube-proxy: kind is \"KubeletConfiguration\", expected KubeProxyConfiguration"
        );
        let err = changed
            .edit_component_config(Kubelet, "cp1: /var/lib/kubelet/config.yaml", "- a\n")
            .unwrap_err();
        assert_eq!(
            err,
            "cp1: /var/lib/kubelet/config.yaml: not a KubeletConfiguration mapping"
        );
    }

    /// What the roll plan sees: a kubelet or kube-proxy setting changed in the spec makes a
    /// node's record differ, named by field (not only as a digest); only kube-proxy's fields
    /// make the roller restart kube-proxy. A record of an older kprov (no settings) still
    /// differs through its digest. The init configuration carries maxPods.
    #[test]
    fn a_kubelet_or_kube_proxy_setting_change_is_a_named_roll_reason() {
        use crate::nodes::roll::{differences, kube_proxy_changed};
        let hs = hosts(1, 1);
        let ts = targets(&hs);
        let rec = |extra: &str| renderer(extra, &ts).provisioned(&ts[1]).unwrap();
        let old = rec("");
        assert!(differences(&old, &rec("")).is_empty());
        let pods = rec("  kubelet:\n    maxPods: 50\n");
        assert_eq!(
            differences(&old, &pods),
            vec!["spec.kubelet.maxPods (default) -> 50"]
        );
        assert!(!kube_proxy_changed(Some(&old), &pods));
        let mode = rec("  kubeProxy:\n    proxyMode: nftables\n");
        assert_eq!(
            differences(&pods, &mode),
            vec![
                "spec.kubeProxy.proxyMode (default) -> nftables",
                "spec.kubelet.maxPods 50 -> (default)"
            ]
        );
        assert!(kube_proxy_changed(Some(&pods), &mode));
        let mut older = old.clone();
        older.settings = None;
        let why = differences(&older, &pods);
        assert!(
            why.len() == 1 && why[0].starts_with("kubeadm/kubelet configuration (digest"),
            "{why:?}"
        );
        assert!(kube_proxy_changed(Some(&older), &pods));
        assert!(!kube_proxy_changed(None, &pods));

        let r = renderer("  kubelet:\n    maxPods: 50\n", &ts);
        let init = r.init_config(&ts[0], &"k".repeat(64)).unwrap();
        let kc = docs(&init)
            .into_iter()
            .find(|d| d["kind"] == "KubeletConfiguration")
            .unwrap();
        assert_eq!(kc["maxPods"], 50);
    }

    /// Settings left at their defaults leave a node's record as it was before they existed
    /// (no roll for nothing); a changed one makes the node outdated.
    #[test]
    fn node_settings_in_the_provisioning_record() {
        let hs = hosts(1, 0);
        let ts = targets(&hs);
        let digest = |extra: &str| {
            renderer(extra, &ts)
                .provisioned(&ts[0])
                .unwrap()
                .config_digest
        };
        let plain = digest("");
        assert_eq!(
            plain,
            digest(
                "  kubeProxy:\n    proxyMode: iptables\n  kubelet:\n    failCgroupV1: true\n\
                 \x20 containerd:\n    restrictOOMScoreAdj: false\n"
            )
        );
        assert_ne!(plain, digest("  kubelet:\n    failCgroupV1: false\n"));
        assert_ne!(plain, digest("  kubeProxy:\n    proxyMode: ipvs\n"));
        assert_ne!(plain, digest("  kubeProxy:\n    conntrackMaxPerCore: 0\n"));
    }

    /// The kernel step on a host whose modules are built in, without modprobe, and whose
    /// /proc/sys is read-only but already right: nothing to load, nothing to write, success.
    /// On a host missing br_netfilter without modprobe it fails naming the module; a sysctl
    /// that is wrong and cannot be written is named too. `sysctl --system` never runs.
    #[test]
    fn kernel_step_on_real_hosts() {
        assert!(!KERNEL_SETTINGS.contains("--system"));
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // The script's absolute paths, moved under the scratch root.
        let script = KERNEL_SETTINGS
            .replace("/proc/", "$R/proc/")
            .replace("/sys/module", "$R/sys/module")
            .replace("/etc/", "$R/etc/")
            .replace("/var/lib/kprov", "$R/var/lib/kprov");
        std::fs::create_dir_all(r.join("proc/sys/net/bridge")).unwrap();
        std::fs::create_dir_all(r.join("etc/sysctl.d")).unwrap();
        std::fs::create_dir_all(r.join("bin")).unwrap();
        std::fs::write(r.join("proc/filesystems"), "nodev\toverlay\n").unwrap();
        let conf = renderer("", &targets(&hosts(1, 0)))
            .render("node/sysctl.conf.tera", json!({}))
            .unwrap();
        std::fs::write(r.join("etc/sysctl.d/99-kprov.conf"), conf).unwrap();
        // sysctl: `-n KEY` reads $R/values/KEY; `-w` fails (read-only /proc/sys).
        std::fs::create_dir_all(r.join("values")).unwrap();
        std::fs::write(
            r.join("bin/sysctl"),
            "#!/bin/sh\ncase \"$1\" in -n) cat \"$R/values/$2\" 2>/dev/null || exit 1;; \
             *) echo \"$*\" >> \"$R/writes\"; exit 1;; esac\n",
        )
        .unwrap();
        std::fs::write(r.join("bin/swapoff"), "#!/bin/sh\nexit 0\n").unwrap();
        for f in ["bin/sysctl", "bin/swapoff"] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(r.join(f), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let set = |key: &str, v: &str| std::fs::write(r.join("values").join(key), v).unwrap();
        for k in [
            "net.bridge.bridge-nf-call-iptables",
            "net.bridge.bridge-nf-call-ip6tables",
            "net.ipv4.ip_forward",
        ] {
            set(k, "1");
        }
        // The PATH holds only what the script may use: no modprobe.
        for tool in ["grep", "sed", "cat", "cp", "mkdir"] {
            let real = ["/usr/bin", "/bin"]
                .iter()
                .map(|d| std::path::Path::new(d).join(tool))
                .find(|p| p.exists())
                .unwrap();
            std::os::unix::fs::symlink(real, r.join("bin").join(tool)).unwrap();
        }
        let run = || {
            std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(&script)
                .env("R", r)
                .env("PATH", r.join("bin"))
                .output()
                .unwrap()
        };
        let out = run();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!r.join("writes").exists(), "nothing written");
        assert!(r.join("var/lib/kprov/sysctl.applied").exists());
        // A wanted value that cannot be written is named.
        set("net.ipv4.ip_forward", "0");
        let out = run();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("sysctl net.ipv4.ip_forward cannot be set to 1 (it is 0)"),
            "{err}"
        );
        set("net.ipv4.ip_forward", "1");
        // br_netfilter missing and no modprobe: named.
        std::fs::remove_dir_all(r.join("proc/sys/net/bridge")).unwrap();
        let out = run();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(
                "kernel module br_netfilter is needed, not loaded, and modprobe is not installed"
            ),
            "{err}"
        );
        // With modprobe present, it is asked for exactly the missing module.
        std::fs::write(
            r.join("bin/modprobe"),
            "#!/bin/sh\necho \"$*\" >> \"$R/modprobed\"\nmkdir -p \"$R/proc/sys/net/bridge\"\n",
        )
        .unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(
                r.join("bin/modprobe"),
                std::fs::Permissions::from_mode(0o755),
            )
            .unwrap();
        }
        let out = run();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            std::fs::read_to_string(r.join("modprobed")).unwrap(),
            "br_netfilter\n"
        );
    }

    #[test]
    fn node_labels_cannot_add_labels() {
        let mut hs = hosts(1, 1);
        let r = renderer("", &targets(&hs));
        // A comma, '=' or newline in a value would add labels to `--node-labels`.
        for v in ["a,evil=1", "a\nevil=1", "a=b", "a\"b'; rm -rf /"] {
            hs[1].labels = [("team".to_string(), v.to_string())].into();
            assert!(
                r.join_config(&targets(&hs)[1], &secrets()).is_err(),
                "{v:?}"
            );
        }
        // Reserved labels would stop the kubelet from starting.
        hs[1].labels = [("node-role.kubernetes.io/worker".to_string(), String::new())].into();
        assert!(r.join_config(&targets(&hs)[1], &secrets()).is_err());
        hs[1].labels = [("disk".to_string(), "ssd".to_string())].into();
        let join = docs(&r.join_config(&targets(&hs)[1], &secrets()).unwrap());
        let args = join[0]["nodeRegistration"]["kubeletExtraArgs"]
            .as_array()
            .unwrap()
            .clone();
        assert!(args.iter().any(|a| a["value"] == "disk=ssd"));
    }

    #[test]
    fn bad_specs_are_named() {
        let hs = hosts(1, 0);
        // The networks, version and etcd topology are the typed model's: a bad one is refused
        // when the spec is resolved, naming the field, before any renderer exists.
        let mut c = cluster("");
        c.spec.networking.pod_cidr = Some("nope".into());
        let e = crate::spec::resolve::model(&c, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("spec.networking.podCIDR"), "{e}");
        let mut named = hs.clone();
        named[0].address = "cp1.example.com".into();
        assert!(matches!(
            Renderer::new(&resolved(&cluster("")), &targets(&named)),
            Err(RenderError::Host { .. })
        ));
        let mut c = cluster("");
        c.spec.api = Some(crate::spec::Api {
            endpoint: Some("a:b:c".into()),
            ..Default::default()
        });
        assert!(matches!(
            Renderer::new(&resolved(&c), &targets(&hs)),
            Err(RenderError::BadEndpoint(_))
        ));
        for (text, want) in [
            ("lb:8443", ("lb", 8443)),
            ("10.0.0.1", ("10.0.0.1", 6443)),
            ("[fd00::1]:7443", ("[fd00::1]", 7443)),
        ] {
            assert_eq!(
                parse_endpoint(text).unwrap(),
                Endpoint::Fixed {
                    host: want.0.into(),
                    port: want.1
                }
            );
        }
        for bad in ["", "lb:", "lb:x", "[fd00::1", "a b"] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }
}
