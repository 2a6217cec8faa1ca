//! Where node binaries come from, and the sha256 each one must have.
//!
//! Checksums are pinned per version and architecture, copied from Kubespray's
//! `roles/kubespray_defaults/vars/main/checksums.yml` (which takes them from the upstream
//! release pages). `spec.assets.mirror` replaces the download hosts with a mirror laid out as
//! `MIRROR/<upstream host>/<upstream path>` (Kubespray's `files_repo` layout) or with a
//! `file://` directory on the operator's machine, uploaded to the hosts over ssh.
//! `spec.assets.files` overrides single entries by name (`kubeadm` for every architecture,
//! `kubeadm/arm64` for one).

use std::path::PathBuf;

use crate::spec::{Assets, Cluster};

/// A node architecture kprov has binaries for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    /// x86-64 (`amd64`).
    Amd64,
    /// 64-bit ARM (`arm64`).
    Arm64,
}

impl Arch {
    /// Every architecture, in the order assets are listed.
    pub const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

    /// Go's spelling (`amd64`, `arm64`), as release URLs and `spec.assets.files` use it.
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// `uname -m` spelling, used by node scripts to pick their entry.
    pub fn uname(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64",
            Arch::Arm64 => "aarch64",
        }
    }
}

/// The components a node installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    /// The `kubeadm` binary.
    Kubeadm,
    /// The `kubelet` binary.
    Kubelet,
    /// The `kubectl` binary.
    Kubectl,
    /// containerd's release tarball ([`CONTAINERD_VERSION`]).
    Containerd,
    /// The `runc` binary ([`RUNC_VERSION`]).
    Runc,
    /// The CNI plugins tarball ([`CNI_PLUGINS_VERSION`]).
    CniPlugins,
    /// crictl's tarball (release MAJOR.MINOR.0 of the Kubernetes version).
    Crictl,
    /// etcd, etcdctl and etcdutl: installed only on the hosts of an External etcd cluster.
    Etcd,
}

impl Component {
    /// Every component, in the order assets are listed.
    pub const ALL: [Component; 8] = [
        Component::Kubeadm,
        Component::Kubelet,
        Component::Kubectl,
        Component::Containerd,
        Component::Runc,
        Component::CniPlugins,
        Component::Crictl,
        Component::Etcd,
    ];

    /// What every Kubernetes node installs, in install order (one step, `binaries`): the
    /// runtime before containerd's configuration, the kubelet before its service.
    pub const NODE_BINARIES: [Component; 7] = [
        Component::Runc,
        Component::Containerd,
        Component::CniPlugins,
        Component::Crictl,
        Component::Kubeadm,
        Component::Kubelet,
        Component::Kubectl,
    ];

    /// Name used in `spec.assets.files` and in step names.
    pub fn name(self) -> &'static str {
        match self {
            Component::Kubeadm => "kubeadm",
            Component::Kubelet => "kubelet",
            Component::Kubectl => "kubectl",
            Component::Containerd => "containerd",
            Component::Runc => "runc",
            Component::CniPlugins => "cni-plugins",
            Component::Crictl => "crictl",
            Component::Etcd => "etcd",
        }
    }

    /// How the download is installed on the node.
    pub fn install(self) -> Install {
        match self {
            Component::Kubeadm | Component::Kubelet | Component::Kubectl | Component::Runc => {
                Install::Binary
            }
            Component::Containerd | Component::CniPlugins | Component::Crictl | Component::Etcd => {
                Install::Tarball
            }
        }
    }
}

/// How a component's download becomes files on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Install {
    /// A single executable copied to its destination.
    Binary,
    /// A `.tar.gz` unpacked into its destination directory.
    Tarball,
}

/// The containerd release every node installs (checksums pinned).
pub const CONTAINERD_VERSION: &str = "2.2.7";
/// The runc release every node installs.
pub const RUNC_VERSION: &str = "1.3.6";
/// The CNI plugins release every node installs.
pub const CNI_PLUGINS_VERSION: &str = "1.9.1";
/// Image of the local API proxy on workers, unless `spec.api.localProxyImage` names another.
pub const API_PROXY_IMAGE: &str = "docker.io/library/haproxy:3.2-alpine";
/// The etcd release host-deployed members run (Kubespray's `etcd_deployment_type: host`):
/// the 3.6 line kubeadm 1.34 to 1.36 run themselves (kubeadm 1.36.2 pins 3.6.8-0).
pub const ETCD_VERSION: &str = "3.6.8";

/// The checksum table (values from Kubespray's checksums.yml, see the file's header).
#[rustfmt::skip]
mod pinned;
use pinned::PINNED;

/// Kubernetes versions kprov can install (checksums pinned), newest first: every released
/// patch of the supported minors. The spec validator refuses any other `kubernetesVersion`.
pub const SUPPORTED_KUBERNETES_VERSIONS: &[&str] = pinned::SUPPORTED;

/// The default when a spec names none: the newest pinned patch.
pub const DEFAULT_KUBERNETES_VERSION: &str = "1.36.4";

/// Parses `1.35.1` or `v1.35.1` into (major, minor, patch).
pub fn parse(v: &str) -> Option<(u32, u32, u32)> {
    let v = v.strip_prefix('v').unwrap_or(v);
    let mut it = v.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    let patch = it.next()?.parse().ok()?;
    if it.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

/// What kubeadm of one minor expects on the node, from kubeadm's `constants.go` of that
/// minor: the sandbox image containerd must use (kubeadm warns, and the kubelet's pods use a
/// different one, when they differ) and the etcd image its stacked members run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeadmImages {
    /// The Kubernetes minor (1.`minor`).
    pub minor: u32,
    /// `registry.k8s.io/pause` tag.
    pub pause: &'static str,
    /// `registry.k8s.io/etcd` tag.
    pub etcd: &'static str,
}

/// One entry per supported minor (a unit test holds this and the version list together).
/// 1.34 and 1.35 pin pause 3.10.1, 1.36 moved to 3.10.2; etcd follows kubeadm's
/// `DefaultEtcdVersion` of the minor's newest patch.
pub const KUBEADM_IMAGES: &[KubeadmImages] = &[
    KubeadmImages {
        minor: 34,
        pause: "3.10.1",
        etcd: "3.6.4-0",
    },
    KubeadmImages {
        minor: 35,
        pause: "3.10.1",
        etcd: "3.6.6-0",
    },
    KubeadmImages {
        minor: 36,
        pause: "3.10.2",
        etcd: "3.6.8-0",
    },
];

/// The images kubeadm of `kubernetes`'s minor expects; `None` for a version kprov does not
/// support (refused earlier by validation).
pub fn kubeadm_images(kubernetes: &str) -> Option<&'static KubeadmImages> {
    let minor = parse(kubernetes)?.1;
    KUBEADM_IMAGES.iter().find(|k| k.minor == minor)
}

/// The supported minors, compactly (`1.34.0-1.34.11, 1.35.0-1.35.8, 1.36.0-1.36.4`): what an
/// error about an unsupported version lists instead of every patch.
pub fn supported_summary() -> String {
    let mut ranges: Vec<(u32, u32, u32, u32)> = Vec::new(); // (major, minor, low, high)
    for v in SUPPORTED_KUBERNETES_VERSIONS {
        let Some((major, minor, patch)) = parse(v) else {
            continue;
        };
        match ranges.iter_mut().find(|r| r.0 == major && r.1 == minor) {
            Some(r) => {
                r.2 = r.2.min(patch);
                r.3 = r.3.max(patch);
            }
            None => ranges.push((major, minor, patch, patch)),
        }
    }
    ranges.sort();
    ranges
        .iter()
        .map(|(ma, mi, lo, hi)| format!("{ma}.{mi}.{lo}-{ma}.{mi}.{hi}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where one file is fetched from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Nodes download it themselves (curl).
    Url(String),
    /// A file on the operator's machine, uploaded over ssh (air-gapped `file://` mirrors).
    Local(PathBuf),
    /// A member of the cluster's bundle (`spec.assets.bundle`), by its path in the bundle:
    /// uploaded over ssh, resumably.
    Bundle(String),
}

/// One resolved asset: what a node installs for one component and architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asset {
    /// The component.
    pub component: Component,
    /// The architecture this download is for.
    pub arch: Arch,
    /// The component's release (Kubernetes's for its binaries, the pinned one otherwise, or
    /// a `spec.assets.files` override's).
    pub version: String,
    /// Where the node gets it.
    pub source: Source,
    /// Lowercase hex sha256 the download must have.
    pub sha256: String,
}

/// A spec's Kubernetes version or `spec.assets` that cannot be turned into assets; each
/// message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssetError {
    /// No pinned checksums for this version (nor, for a newer patch of a known minor, in
    /// `spec.assets.checksums`).
    #[error(
        "spec.kubernetesVersion: {0:?} is not supported (kprov pins checksums for {supported})",
        supported = supported_summary()
    )]
    UnsupportedVersion(String),
    /// `spec.kubernetesVersion` is absent: the spec was not completed.
    #[error("spec.kubernetesVersion is not set (the spec must be completed with defaults first)")]
    MissingVersion,
    /// A `spec.assets.files` entry names no component.
    #[error("spec.assets.files[{index}]: unknown asset {name:?} (expected one of {known}, optionally with /amd64 or /arm64)", known = Component::ALL.map(Component::name).join(", "))]
    UnknownOverride {
        /// The entry's index in `spec.assets.files`.
        index: usize,
        /// Its `name`.
        name: String,
    },
    /// A `spec.assets.files` or `spec.assets.checksums` sha256 is not 64 hex digits.
    #[error("spec.assets.files[{index}] ({name}): sha256 {sha256:?} is not 64 hex digits")]
    BadChecksum {
        /// The entry's index.
        index: usize,
        /// Its name (`checksums: NAME` for a `spec.assets.checksums` entry).
        name: String,
        /// The value as written.
        sha256: String,
    },
    /// `spec.assets.mirror` has a scheme kprov cannot fetch from.
    #[error("spec.assets.mirror: {0:?} must start with http://, https:// or file://")]
    BadMirror(String),
    /// A `spec.assets.images` archive's URL or checksum is unusable.
    #[error("spec.assets.images[{index}] ({url}): {message}")]
    BadImage {
        /// The entry's index in `spec.assets.images`.
        index: usize,
        /// Its `url`.
        url: String,
        /// What is wrong.
        message: String,
    },
}

/// One container image archive (`spec.assets.images`), imported on every host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageAsset {
    /// The URL as the spec gives it: how messages and the preview name the archive.
    pub url: String,
    /// Where the node gets it.
    pub source: Source,
    /// Lowercase hex sha256 of the archive file.
    pub sha256: String,
}

impl ImageAsset {
    /// The archive's file name (the URL's last segment), for step names.
    pub fn file_name(&self) -> &str {
        self.url.rsplit('/').next().unwrap_or(&self.url)
    }
}

/// The largest `manifest.json`/`index.json` an archive may hold for [`archive_references`]:
/// both list a few images; anything larger is not read (the archive then goes to every host).
const ARCHIVE_INDEX_LIMIT: u64 = 1 << 20;

/// The image references an archive says it holds, read from its tar headers and index: a
/// docker-archive's `manifest.json` (`RepoTags`) or an OCI layout's `index.json`
/// (`io.containerd.image.name`, or a full `org.opencontainers.image.ref.name`). Empty when the
/// archive names none or cannot be read: an archive kprov cannot name goes to every host, and
/// `ctr images import` on the host remains the judge of its format.
pub fn archive_references(bytes: &[u8]) -> Vec<String> {
    use std::io::Read;
    let mut refs = Vec::new();
    let mut archive = tar::Archive::new(bytes);
    let Ok(entries) = archive.entries() else {
        return refs;
    };
    for entry in entries {
        let Ok(mut entry) = entry else {
            return refs;
        };
        let name = match entry.path() {
            Ok(p) => p.to_string_lossy().trim_start_matches("./").to_string(),
            Err(_) => continue,
        };
        if name != "manifest.json" && name != "index.json" {
            continue;
        }
        if entry.size() > ARCHIVE_INDEX_LIMIT {
            continue;
        }
        let mut text = Vec::new();
        if (&mut entry)
            .take(ARCHIVE_INDEX_LIMIT)
            .read_to_end(&mut text)
            .is_err()
        {
            continue;
        }
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(&text) else {
            continue;
        };
        if name == "manifest.json" {
            for m in value.as_array().into_iter().flatten() {
                for tag in m["RepoTags"].as_array().into_iter().flatten() {
                    if let Some(t) = tag.as_str() {
                        refs.push(t.to_string());
                    }
                }
            }
        } else {
            for m in value["manifests"].as_array().into_iter().flatten() {
                let a = &m["annotations"];
                let full = a["io.containerd.image.name"].as_str().or_else(|| {
                    // A bare tag (`v1.36.2`) names no repository: not a reference.
                    a["org.opencontainers.image.ref.name"]
                        .as_str()
                        .filter(|r| r.contains('/') || r.contains(':'))
                });
                if let Some(r) = full {
                    refs.push(r.to_string());
                }
            }
        }
    }
    refs.sort();
    refs.dedup();
    refs
}

/// Whether a host with `roles` runs a container from an archive holding `refs`. The control
/// plane's own images (kube-apiserver, kube-controller-manager, kube-scheduler: ~200 MB of
/// a release's ~350 MB) run only on control planes and etcd on control planes and etcd
/// members; everything else (pause, kube-proxy, CoreDNS, CNI, anything unnamed) on every
/// host. An archive naming no image goes everywhere.
pub fn archive_needed_on(refs: &[String], roles: &[crate::spec::HostRole]) -> bool {
    use crate::spec::HostRole;
    if refs.is_empty() || roles.contains(&HostRole::ControlPlane) {
        return true;
    }
    refs.iter().any(|r| {
        // `registry/path/name:tag` or `...@sha256:...`: the last path segment, untagged.
        let last = r.rsplit('/').next().unwrap_or(r);
        let repo = last.split(['@', ':']).next().unwrap_or(last);
        match repo {
            "kube-apiserver" | "kube-controller-manager" | "kube-scheduler" => false,
            "etcd" => roles.contains(&HostRole::Etcd),
            _ => true,
        }
    })
}

/// The image archives of `spec.assets.images`, checked again here (validation already located
/// any problem in the spec): a scheme curl or the upload understands, a sha256, no duplicate.
pub fn images(assets: Option<&Assets>) -> Result<Vec<ImageAsset>, AssetError> {
    let Some(assets) = assets else {
        return Ok(Vec::new());
    };
    let mut out: Vec<ImageAsset> = Vec::new();
    for (index, img) in assets.images.iter().enumerate() {
        let bad = |message: &str| AssetError::BadImage {
            index,
            url: img.url.clone(),
            message: message.to_string(),
        };
        if !["http://", "https://", "file://"]
            .iter()
            .any(|p| img.url.starts_with(p))
        {
            return Err(bad("must start with http://, https:// or file://"));
        }
        if img.url.ends_with('/') {
            return Err(bad("names a directory, not an archive file"));
        }
        if img.sha256.len() != 64 || !img.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(&format!(
                "sha256 {:?} is not 64 hex digits",
                img.sha256
            )));
        }
        let sha256 = img.sha256.to_ascii_lowercase();
        if out.iter().any(|o| o.sha256 == sha256 || o.url == img.url) {
            return Err(bad("listed twice (same URL or sha256)"));
        }
        out.push(ImageAsset {
            url: img.url.clone(),
            source: source_of(&img.url),
            sha256,
        });
    }
    Ok(out)
}

/// The upstream download URL, as the projects publish them.
pub fn upstream_url(component: Component, version: &str, arch: Arch) -> String {
    let a = arch.as_str();
    match component {
        Component::Kubeadm | Component::Kubelet | Component::Kubectl => format!(
            "https://dl.k8s.io/release/v{version}/bin/linux/{a}/{}",
            component.name()
        ),
        Component::Containerd => format!(
            "https://github.com/containerd/containerd/releases/download/v{version}/containerd-{version}-linux-{a}.tar.gz"
        ),
        Component::Runc => {
            format!("https://github.com/opencontainers/runc/releases/download/v{version}/runc.{a}")
        }
        Component::CniPlugins => format!(
            "https://github.com/containernetworking/plugins/releases/download/v{version}/cni-plugins-linux-{a}-v{version}.tgz"
        ),
        Component::Crictl => format!(
            "https://github.com/kubernetes-sigs/cri-tools/releases/download/v{version}/crictl-v{version}-linux-{a}.tar.gz"
        ),
        Component::Etcd => format!(
            "https://github.com/etcd-io/etcd/releases/download/v{version}/{}.tar.gz",
            etcd_dir(version, arch)
        ),
    }
}

/// The pinned checksum, if kprov knows one for this version and architecture.
pub fn pinned_sha256(component: Component, version: &str, arch: Arch) -> Option<&'static str> {
    PINNED
        .iter()
        .find(|(c, v, a, _)| *c == component && *v == version && *a == arch)
        .map(|(_, _, _, sha)| *sha)
}

/// The release of `component` a node of Kubernetes `kubernetes` installs. crictl follows the
/// Kubernetes minor (cri-tools releases one per minor, as Kubespray pins it).
pub fn version_of(component: Component, kubernetes: &str) -> String {
    match component {
        Component::Kubeadm | Component::Kubelet | Component::Kubectl => kubernetes.to_string(),
        Component::Containerd => CONTAINERD_VERSION.to_string(),
        Component::Runc => RUNC_VERSION.to_string(),
        Component::CniPlugins => CNI_PLUGINS_VERSION.to_string(),
        Component::Crictl => match parse(kubernetes) {
            Some((major, minor, _)) => format!("{major}.{minor}.0"),
            None => kubernetes.to_string(),
        },
        Component::Etcd => ETCD_VERSION.to_string(),
    }
}

/// The top directory of an etcd release tarball (`etcd-v3.6.8-linux-amd64`).
pub fn etcd_dir(version: &str, arch: Arch) -> String {
    format!("etcd-v{version}-linux-{}", arch.as_str())
}

/// Strips a leading `v` so `v1.35.1` and `1.35.1` both work.
pub fn normalize_version(v: &str) -> &str {
    v.strip_prefix('v').unwrap_or(v)
}

/// Resolves every asset of a completed cluster, for both architectures (a node picks its own
/// entry at run time from `uname -m`).
pub fn resolve(cluster: &Cluster) -> Result<Vec<Asset>, AssetError> {
    let version = cluster
        .spec
        .kubernetes_version
        .as_deref()
        .ok_or(AssetError::MissingVersion)?;
    resolve_for(normalize_version(version), cluster.spec.assets.as_ref())
}

/// The binaries of Kubernetes `kubernetes` whose checksum kprov's table lacks, as
/// (component, release, architecture): none for a version of the table; kubeadm, kubelet and
/// kubectl of both architectures for a newer patch of a minor it knows.
pub fn unpinned(kubernetes: &str) -> Vec<(Component, String, Arch)> {
    let mut out = Vec::new();
    for component in [
        Component::Kubeadm,
        Component::Kubelet,
        Component::Kubectl,
        Component::Crictl,
    ] {
        let version = version_of(component, kubernetes);
        for arch in Arch::ALL {
            if pinned_sha256(component, &version, arch).is_none() {
                out.push((component, version.clone(), arch));
            }
        }
    }
    out
}

/// Whether kprov knows the minor of `kubernetes` (its images, etcd and pause versions): a
/// newer patch of such a minor is installable once its checksums are pinned.
pub fn minor_known(kubernetes: &str) -> bool {
    let minor = |v: &str| parse(v).map(|(a, b, _)| (a, b));
    minor(kubernetes).is_some_and(|m| {
        SUPPORTED_KUBERNETES_VERSIONS
            .iter()
            .any(|v| minor(v) == Some(m))
    })
}

/// The checksum `assets.checksums` pins for a binary the table lacks.
fn spec_sha256<'a>(
    assets: &'a Assets,
    component: Component,
    version: &str,
    arch: Arch,
) -> Option<&'a str> {
    let name = format!("{}/{}", component.name(), arch.as_str());
    assets
        .checksums
        .iter()
        .find(|c| c.name == name && normalize_version(&c.version) == version)
        .map(|c| c.sha256.as_str())
}

/// Whether every binary of `kubernetes` has a checksum: from the table, or (a newer patch of a
/// known minor) from `assets.checksums` or a per-file override.
pub fn installable(kubernetes: &str, assets: Option<&Assets>) -> bool {
    let kubernetes = normalize_version(kubernetes);
    if SUPPORTED_KUBERNETES_VERSIONS.contains(&kubernetes) {
        return true;
    }
    let Some(assets) = assets else {
        return false;
    };
    minor_known(kubernetes)
        && unpinned(kubernetes).iter().all(|(c, v, a)| {
            let specific = format!("{}/{}", c.name(), a.as_str());
            spec_sha256(assets, *c, v, *a).is_some()
                || assets
                    .files
                    .iter()
                    .any(|f| f.name == specific || f.name == c.name())
        })
}

/// Every asset for Kubernetes `kubernetes` with `assets` (mirror, overrides, extra
/// checksums) applied, for both architectures.
pub fn resolve_for(kubernetes: &str, assets: Option<&Assets>) -> Result<Vec<Asset>, AssetError> {
    if !installable(kubernetes, assets) {
        return Err(AssetError::UnsupportedVersion(kubernetes.to_string()));
    }
    let default = Assets::default();
    let assets = assets.unwrap_or(&default);
    for (index, c) in assets.checksums.iter().enumerate() {
        if c.sha256.len() != 64 || !c.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(AssetError::BadChecksum {
                index,
                name: format!("checksums: {}", c.name),
                sha256: c.sha256.clone(),
            });
        }
    }
    if let Some(m) = &assets.mirror
        && !(m.starts_with("http://") || m.starts_with("https://") || m.starts_with("file://"))
    {
        return Err(AssetError::BadMirror(m.clone()));
    }
    for (index, f) in assets.files.iter().enumerate() {
        let (name, arch) = match f.name.split_once('/') {
            Some((n, a)) => (n, Some(a)),
            None => (f.name.as_str(), None),
        };
        let known_arch = arch.is_none_or(|a| Arch::ALL.iter().any(|x| x.as_str() == a));
        if !Component::ALL.iter().any(|c| c.name() == name) || !known_arch {
            return Err(AssetError::UnknownOverride {
                index,
                name: f.name.clone(),
            });
        }
        if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(AssetError::BadChecksum {
                index,
                name: f.name.clone(),
                sha256: f.sha256.clone(),
            });
        }
    }
    let mut out = Vec::new();
    for component in Component::ALL {
        for arch in Arch::ALL {
            let version = version_of(component, kubernetes);
            let specific = format!("{}/{}", component.name(), arch.as_str());
            let overridden = assets
                .files
                .iter()
                .find(|f| f.name == specific)
                .or_else(|| assets.files.iter().find(|f| f.name == component.name()));
            let (source, sha256) = match overridden {
                Some(f) => (source_of(&f.url), f.sha256.to_ascii_lowercase()),
                None => {
                    let upstream = upstream_url(component, &version, arch);
                    let sha = pinned_sha256(component, &version, arch)
                        .or_else(|| spec_sha256(assets, component, &version, arch))
                        .ok_or_else(|| AssetError::UnsupportedVersion(version.clone()))?;
                    let source = match &assets.mirror {
                        Some(m) => source_of(&mirror_url(m, &upstream)),
                        None => Source::Url(upstream),
                    };
                    (source, sha.to_string())
                }
            };
            out.push(Asset {
                component,
                arch,
                version,
                source,
                sha256,
            });
        }
    }
    Ok(out)
}

/// `https://dl.k8s.io/release/…` under mirror `M` is `M/dl.k8s.io/release/…`.
pub fn mirror_url(mirror: &str, upstream: &str) -> String {
    let path = upstream
        .strip_prefix("https://")
        .or_else(|| upstream.strip_prefix("http://"))
        .unwrap_or(upstream);
    format!("{}/{}", mirror.trim_end_matches('/'), path)
}

fn source_of(url: &str) -> Source {
    match url.strip_prefix("file://") {
        Some(path) => Source::Local(PathBuf::from(path)),
        None => Source::Url(url.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::AssetFile;

    #[test]
    fn every_supported_version_is_fully_pinned() {
        for v in SUPPORTED_KUBERNETES_VERSIONS {
            let assets = resolve_for(v, None).unwrap();
            assert_eq!(assets.len(), Component::ALL.len() * Arch::ALL.len());
            for a in &assets {
                assert_eq!(a.sha256.len(), 64);
                assert!(a.sha256.bytes().all(|b| b.is_ascii_hexdigit()));
            }
        }
        // No checksum appears twice: a copy-paste slip would.
        let mut shas: Vec<_> = PINNED.iter().map(|p| p.3).collect();
        shas.sort();
        shas.dedup();
        assert_eq!(shas.len(), PINNED.len());
    }

    /// Every released patch of each supported minor, the default the newest, and the
    /// kubeadm image table covering exactly those minors.
    #[test]
    fn versions_images_and_default_agree() {
        assert_eq!(SUPPORTED_KUBERNETES_VERSIONS[0], DEFAULT_KUBERNETES_VERSION);
        let parsed: Vec<_> = SUPPORTED_KUBERNETES_VERSIONS
            .iter()
            .map(|v| parse(v).unwrap())
            .collect();
        let mut sorted = parsed.clone();
        sorted.sort_by(|a, b| b.cmp(a));
        assert_eq!(parsed, sorted, "newest first");
        for minor in [34u32, 35, 36] {
            let patches: Vec<u32> = parsed
                .iter()
                .filter(|v| v.1 == minor)
                .map(|v| v.2)
                .collect();
            let max = *patches.iter().max().unwrap();
            assert_eq!(
                patches.len() as u32,
                max + 1,
                "1.{minor}: a patch is missing"
            );
            assert!(kubeadm_images(&format!("1.{minor}.0")).is_some());
        }
        let minors: std::collections::BTreeSet<u32> = parsed.iter().map(|v| v.1).collect();
        let image_minors: std::collections::BTreeSet<u32> =
            KUBEADM_IMAGES.iter().map(|k| k.minor).collect();
        assert_eq!(minors, image_minors);
        assert_eq!(kubeadm_images("1.36.2").unwrap().pause, "3.10.2");
        assert_eq!(kubeadm_images("v1.36.2").unwrap().etcd, "3.6.8-0");
        assert_eq!(kubeadm_images("1.33.0"), None);
        // crictl follows the minor.
        assert_eq!(version_of(Component::Crictl, "1.36.4"), "1.36.0");
        assert_eq!(version_of(Component::Crictl, "1.34.11"), "1.34.0");
        // Spot checks against Kubespray's checksums.yml, one per kind of row.
        for (c, v, a, sha) in [
            (
                Component::Kubeadm,
                "1.36.2",
                Arch::Amd64,
                "f95d1b345f97c673ce1c1347eb96bf2587850975155ae701cdfc629a5b575b70",
            ),
            (
                Component::Kubelet,
                "1.34.0",
                Arch::Arm64,
                "e45a7795391cd62ee226666039153832d3096c0f892266cd968936e18b2b40b0",
            ),
            (
                Component::Crictl,
                "1.36.0",
                Arch::Amd64,
                "83855e114566a8a8c44c548d515670f51de3a5e1da8b2effb59870e2f10c25a3",
            ),
            (
                Component::Etcd,
                "3.6.8",
                Arch::Arm64,
                "438f56a700d17ce761510a3e63e6fa5c1d587b2dd4d7a22c179c09a649366760",
            ),
        ] {
            assert_eq!(pinned_sha256(c, v, a), Some(sha), "{c:?} {v} {a:?}");
        }
    }

    #[test]
    fn upstream_urls() {
        let a = resolve_for("1.35.1", None).unwrap();
        let url = |c: Component, arch: Arch| {
            let x = a
                .iter()
                .find(|x| x.component == c && x.arch == arch)
                .unwrap();
            match &x.source {
                Source::Url(u) => u.clone(),
                _ => unreachable!(),
            }
        };
        assert_eq!(
            url(Component::Kubeadm, Arch::Amd64),
            "https://dl.k8s.io/release/v1.35.1/bin/linux/amd64/kubeadm"
        );
        assert_eq!(
            url(Component::Containerd, Arch::Arm64),
            "https://github.com/containerd/containerd/releases/download/v2.2.7/containerd-2.2.7-linux-arm64.tar.gz"
        );
        assert_eq!(
            url(Component::CniPlugins, Arch::Amd64),
            "https://github.com/containernetworking/plugins/releases/download/v1.9.1/cni-plugins-linux-amd64-v1.9.1.tgz"
        );
    }

    #[test]
    fn mirror_and_overrides() {
        let assets = Assets {
            images: vec![],
            bundle: None,
            mirror: Some("http://10.0.0.1:8080/".into()),
            files: vec![
                AssetFile {
                    name: "kubeadm".into(),
                    url: "file:///srv/kubeadm".into(),
                    sha256: "AB".repeat(32),
                },
                AssetFile {
                    name: "runc/arm64".into(),
                    url: "http://x/runc".into(),
                    sha256: "cd".repeat(32),
                },
            ],
            checksums: Vec::new(),
        };
        let a = resolve_for("1.34.4", Some(&assets)).unwrap();
        let get = |c, arch| {
            a.iter()
                .find(|x| x.component == c && x.arch == arch)
                .unwrap()
        };
        assert_eq!(
            get(Component::Kubelet, Arch::Amd64).source,
            Source::Url(
                "http://10.0.0.1:8080/dl.k8s.io/release/v1.34.4/bin/linux/amd64/kubelet".into()
            )
        );
        assert_eq!(
            get(Component::Kubeadm, Arch::Arm64).source,
            Source::Local("/srv/kubeadm".into())
        );
        assert_eq!(get(Component::Kubeadm, Arch::Arm64).sha256, "ab".repeat(32));
        assert_eq!(get(Component::Runc, Arch::Arm64).sha256, "cd".repeat(32));
        assert_eq!(
            get(Component::Runc, Arch::Amd64).sha256,
            pinned_sha256(Component::Runc, RUNC_VERSION, Arch::Amd64).unwrap()
        );
    }

    #[test]
    fn bad_input_is_named() {
        assert_eq!(
            resolve_for("1.20.0", None).unwrap_err().to_string(),
            "spec.kubernetesVersion: \"1.20.0\" is not supported (kprov pins checksums for \
             1.34.0-1.34.11, 1.35.0-1.35.8, 1.36.0-1.36.4)"
        );
        let bad = |name: &str, sha: &str| Assets {
            images: vec![],
            bundle: None,
            mirror: None,
            files: vec![AssetFile {
                name: name.into(),
                url: "http://x".into(),
                sha256: sha.into(),
            }],
            checksums: Vec::new(),
        };
        assert!(matches!(
            resolve_for("1.35.1", Some(&bad("kubeadmm", &"a".repeat(64)))),
            Err(AssetError::UnknownOverride { index: 0, .. })
        ));
        assert!(matches!(
            resolve_for("1.35.1", Some(&bad("kubeadm/s390x", &"a".repeat(64)))),
            Err(AssetError::UnknownOverride { .. })
        ));
        assert!(matches!(
            resolve_for("1.35.1", Some(&bad("kubeadm", "abc"))),
            Err(AssetError::BadChecksum { .. })
        ));
        let m = Assets {
            bundle: None,
            mirror: Some("ftp://x".into()),
            files: vec![],
            images: vec![],
            checksums: Vec::new(),
        };
        assert!(matches!(
            resolve_for("1.35.1", Some(&m)),
            Err(AssetError::BadMirror(_))
        ));
    }

    #[test]
    fn image_archives() {
        use crate::spec::ImageArchive;
        let img = |url: &str, sha: &str| ImageArchive {
            url: url.into(),
            sha256: sha.into(),
        };
        let with = |images: Vec<ImageArchive>| Assets {
            images,
            ..Assets::default()
        };
        assert_eq!(images(None).unwrap(), []);
        let got = images(Some(&with(vec![
            img("file:///srv/img/pause.tar", &"AB".repeat(32)),
            img("https://m.example/img/etcd.tar", &"cd".repeat(32)),
        ])))
        .unwrap();
        assert_eq!(got[0].source, Source::Local("/srv/img/pause.tar".into()));
        assert_eq!(got[0].sha256, "ab".repeat(32));
        assert_eq!(got[0].file_name(), "pause.tar");
        assert_eq!(
            got[1].source,
            Source::Url("https://m.example/img/etcd.tar".into())
        );
        for (bad, why) in [
            (
                vec![img("ftp://x/a.tar", &"a".repeat(64))],
                "must start with",
            ),
            (vec![img("file:///srv/", &"a".repeat(64))], "directory"),
            (vec![img("file:///a.tar", "abc")], "not 64 hex digits"),
            (
                vec![
                    img("file:///a.tar", &"a".repeat(64)),
                    img("file:///b.tar", &"A".repeat(64)),
                ],
                "listed twice",
            ),
        ] {
            let e = images(Some(&with(bad))).unwrap_err().to_string();
            assert!(
                e.contains(why) && e.starts_with("spec.assets.images["),
                "{e}"
            );
        }
    }
}
