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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

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
    Kubeadm,
    Kubelet,
    Kubectl,
    Containerd,
    Runc,
    CniPlugins,
    Crictl,
    /// etcd, etcdctl and etcdutl: installed only on the hosts of an External etcd cluster.
    Etcd,
}

impl Component {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Install {
    /// A single executable copied to its destination.
    Binary,
    /// A `.tar.gz` unpacked into its destination directory.
    Tarball,
}

pub const CONTAINERD_VERSION: &str = "2.2.1";
pub const RUNC_VERSION: &str = "1.3.4";
pub const CNI_PLUGINS_VERSION: &str = "1.8.0";
pub const CRICTL_VERSION: &str = "1.35.0";
/// The etcd release host-deployed members run (Kubespray's `etcd_deployment_type: host`);
/// 3.5 is the line kubeadm 1.34/1.35 still accept as external etcd.
pub const ETCD_VERSION: &str = "3.5.27";

/// Kubernetes versions kprov can install (checksums pinned below), newest first. The spec
/// validator refuses any other `kubernetesVersion`.
pub const SUPPORTED_KUBERNETES_VERSIONS: &[&str] = &["1.35.1", "1.35.0", "1.34.4"];

/// The default when a spec names none.
pub const DEFAULT_KUBERNETES_VERSION: &str = "1.35.1";

/// (component, version, arch, sha256) from Kubespray's checksums.yml.
const PINNED: &[(Component, &str, Arch, &str)] = &[
    (
        Component::Kubeadm,
        "1.35.1",
        Arch::Amd64,
        "8a7ff344eef1bfba88f9a74b3fdc9ea4448c94f1b3cefb8c0aeeaf1f96e05053",
    ),
    (
        Component::Kubeadm,
        "1.35.0",
        Arch::Amd64,
        "729e7fb34e4f1bfcf2bdaf2a14891ed64bd18c47aaab42f8cc5030875276cfed",
    ),
    (
        Component::Kubeadm,
        "1.34.4",
        Arch::Amd64,
        "b967f1fa0e36621c402d38bb560eb4a943954d5cf5a00e5150842f6f5da73455",
    ),
    (
        Component::Kubeadm,
        "1.35.1",
        Arch::Arm64,
        "80097a3c4ef824f4edfe131d2bd429772c4be3a460c42a44f2320164a917de32",
    ),
    (
        Component::Kubeadm,
        "1.35.0",
        Arch::Arm64,
        "1dac7dc2c6a56548bbc6bf8a7ecf4734f2e733fb336d7293d84541ebe52d0e50",
    ),
    (
        Component::Kubeadm,
        "1.34.4",
        Arch::Arm64,
        "d8028b7e8c8d6c9b3fc3da6bc88d4d0cfb33df1b4b026a7d6e8c35d1471c9f6e",
    ),
    (
        Component::Kubelet,
        "1.35.1",
        Arch::Amd64,
        "e7343310e03ff0d424df4397bdfa4468947d6d1f0f93dac586c1e8d6e4086d5d",
    ),
    (
        Component::Kubelet,
        "1.35.0",
        Arch::Amd64,
        "2f4ed7778681649b81244426c29c5d98df60ccabf83d561d69e61c1cbb943ddf",
    ),
    (
        Component::Kubelet,
        "1.34.4",
        Arch::Amd64,
        "03b8fea715a7ef82eeaf518dee34c72670c57cc7bc40dc1320c04fbf4f15172f",
    ),
    (
        Component::Kubelet,
        "1.35.1",
        Arch::Arm64,
        "73475c6db8fd8a9780b1b378fa2f917875e6146166c24603c1abc6eafd4493a8",
    ),
    (
        Component::Kubelet,
        "1.35.0",
        Arch::Arm64,
        "aa658d077348b43d238f50966a583f4244b2a7d45590c77b3b165b7d44983ab8",
    ),
    (
        Component::Kubelet,
        "1.34.4",
        Arch::Arm64,
        "c78845473c434ee85a2444eeab87f8b20f524e3ab6854a078f79468f44aad8f5",
    ),
    (
        Component::Kubectl,
        "1.35.1",
        Arch::Amd64,
        "36e2f4ac66259232341dd7866952d64a958846470f6a9a6a813b9117bd965207",
    ),
    (
        Component::Kubectl,
        "1.35.0",
        Arch::Amd64,
        "a2e984a18a0c063279d692533031c1eff93a262afcc0afdc517375432d060989",
    ),
    (
        Component::Kubectl,
        "1.34.4",
        Arch::Amd64,
        "d50c359d95e0841eaad08ddc27c7be37cba8fdccfba5c8e2ded65e121ff112db",
    ),
    (
        Component::Kubectl,
        "1.35.1",
        Arch::Arm64,
        "706256e21a4e9192ee62d1a007ac0bfcff2b0b26e92cc7baad487a6a5d08ff82",
    ),
    (
        Component::Kubectl,
        "1.35.0",
        Arch::Arm64,
        "58f82f9fe796c375c5c4b8439850b0f3f4d401a52434052f2df46035a8789e25",
    ),
    (
        Component::Kubectl,
        "1.34.4",
        Arch::Arm64,
        "5b982c0644ab1e27780246b9085a5886651b4a7ed86243acbb2bacc1bea01dda",
    ),
    (
        Component::Containerd,
        CONTAINERD_VERSION,
        Arch::Amd64,
        "f5d8e90ecb6c1c7e33ecddf8cc268a93b9e5b54e0e850320d765511d76624f41",
    ),
    (
        Component::Containerd,
        CONTAINERD_VERSION,
        Arch::Arm64,
        "dac15a0d412a24be8bfe6a40cec8f51829062725169f1e72ac7d120a891ef5b6",
    ),
    (
        Component::Runc,
        RUNC_VERSION,
        Arch::Amd64,
        "5966ca40b6187b30e33bfc299c5f1fe72e8c1aa01cf3fefdadf391668f47f103",
    ),
    (
        Component::Runc,
        RUNC_VERSION,
        Arch::Arm64,
        "d6dcab36d1b6af1b72c7f0662e5fcf446a291271ba6006532b95c4144e19d428",
    ),
    (
        Component::CniPlugins,
        CNI_PLUGINS_VERSION,
        Arch::Amd64,
        "ab3bda535f9d90766cccc90d3dddb5482003dd744d7f22bcf98186bf8eea8be6",
    ),
    (
        Component::CniPlugins,
        CNI_PLUGINS_VERSION,
        Arch::Arm64,
        "57ce466fc3b79db1f19b8f4c63e07a1112306efa53c94fe810a2150dd9e07ddb",
    ),
    (
        Component::Crictl,
        CRICTL_VERSION,
        Arch::Amd64,
        "2e141e5b22cb189c40365a11807d69b76b9b3caced89fac2f4ec879408ce2177",
    ),
    (
        Component::Etcd,
        ETCD_VERSION,
        Arch::Amd64,
        "0aad9a9e4e0817a021e933f9806a2b2960a62f949ad5a3d6436d8886945cb1bc",
    ),
    (
        Component::Etcd,
        ETCD_VERSION,
        Arch::Arm64,
        "1277309f540c5a0329c428f95455c9f76d24f768c8d28fd2753e891c379053fa",
    ),
    (
        Component::Crictl,
        CRICTL_VERSION,
        Arch::Arm64,
        "519071de89b64c43e2a1661bb5489c6c3fd5e9e5fcef75e50e542b0c891f1118",
    ),
];

/// Where one file is fetched from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Nodes download it themselves (curl).
    Url(String),
    /// A file on the operator's machine, uploaded over ssh (air-gapped `file://` mirrors).
    Local(PathBuf),
}

/// One resolved asset: what a node installs for one component and architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asset {
    pub component: Component,
    pub arch: Arch,
    pub version: String,
    pub source: Source,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssetError {
    #[error(
        "spec.kubernetesVersion: {0:?} is not supported (kprov pins checksums for {supported})",
        supported = SUPPORTED_KUBERNETES_VERSIONS.join(", ")
    )]
    UnsupportedVersion(String),
    #[error("spec.kubernetesVersion is not set (the spec must be completed with defaults first)")]
    MissingVersion,
    #[error("spec.assets.files[{index}]: unknown asset {name:?} (expected one of {known}, optionally with /amd64 or /arm64)", known = Component::ALL.map(Component::name).join(", "))]
    UnknownOverride { index: usize, name: String },
    #[error("spec.assets.files[{index}] ({name}): sha256 {sha256:?} is not 64 hex digits")]
    BadChecksum {
        index: usize,
        name: String,
        sha256: String,
    },
    #[error("spec.assets.mirror: {0:?} must start with http://, https:// or file://")]
    BadMirror(String),
    #[error("spec.assets.images[{index}] ({url}): {message}")]
    BadImage {
        index: usize,
        url: String,
        message: String,
    },
}

/// One container image archive (`spec.assets.images`), imported on every host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageAsset {
    /// The URL as the spec gives it: how messages and the preview name the archive.
    pub url: String,
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

fn version_of(component: Component, kubernetes: &str) -> &str {
    match component {
        Component::Kubeadm | Component::Kubelet | Component::Kubectl => kubernetes,
        Component::Containerd => CONTAINERD_VERSION,
        Component::Runc => RUNC_VERSION,
        Component::CniPlugins => CNI_PLUGINS_VERSION,
        Component::Crictl => CRICTL_VERSION,
        Component::Etcd => ETCD_VERSION,
    }
}

/// The top directory of an etcd release tarball (`etcd-v3.5.27-linux-amd64`).
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

pub fn resolve_for(kubernetes: &str, assets: Option<&Assets>) -> Result<Vec<Asset>, AssetError> {
    if !SUPPORTED_KUBERNETES_VERSIONS.contains(&kubernetes) {
        return Err(AssetError::UnsupportedVersion(kubernetes.to_string()));
    }
    let default = Assets::default();
    let assets = assets.unwrap_or(&default);
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
            let version = version_of(component, kubernetes).to_string();
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
                Source::Local(_) => unreachable!(),
            }
        };
        assert_eq!(
            url(Component::Kubeadm, Arch::Amd64),
            "https://dl.k8s.io/release/v1.35.1/bin/linux/amd64/kubeadm"
        );
        assert_eq!(
            url(Component::Containerd, Arch::Arm64),
            "https://github.com/containerd/containerd/releases/download/v2.2.1/containerd-2.2.1-linux-arm64.tar.gz"
        );
        assert_eq!(
            url(Component::CniPlugins, Arch::Amd64),
            "https://github.com/containernetworking/plugins/releases/download/v1.8.0/cni-plugins-linux-amd64-v1.8.0.tgz"
        );
    }

    #[test]
    fn mirror_and_overrides() {
        let assets = Assets {
            images: vec![],
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
            "spec.kubernetesVersion: \"1.20.0\" is not supported (kprov pins checksums for 1.35.1, 1.35.0, 1.34.4)"
        );
        let bad = |name: &str, sha: &str| Assets {
            images: vec![],
            mirror: None,
            files: vec![AssetFile {
                name: name.into(),
                url: "http://x".into(),
                sha256: sha.into(),
            }],
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
            mirror: Some("ftp://x".into()),
            files: vec![],
            images: vec![],
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
