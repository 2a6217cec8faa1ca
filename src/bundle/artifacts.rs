//! The one list of everything a cluster's nodes need: every binary and every container image.
//!
//! `kprov get assets` prints it and `kprov create bundle` fetches exactly it, so the bundle
//! cannot forget what the nodes install. Binaries come from the pinned table
//! ([`crate::spec::assets::resolve`]) with `spec.assets.mirror` and `spec.assets.files` applied;
//! images are kubeadm's for the Kubernetes minor, every `image:` of the rendered add-on
//! manifests (CNI, CCM), the local API proxy image, plus `spec.assets.images` archives. kprov
//! pins images by tag only: their digests (and every size) are known once fetched, and the
//! list says so rather than invent them.

use serde::Serialize;

use crate::spec::assets::{self, Arch, AssetError, Component, Source};
use crate::spec::{Cluster, EtcdType};

/// Where an artifact comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// The project's own download site or registry.
    Upstream,
    /// `spec.assets.mirror` (or a `spec.assets.files` override).
    Mirror,
    /// A bundle made by `kprov create bundle` (`spec.assets.bundle`).
    Bundle,
}

impl Origin {
    /// The origin as `get assets` prints it (`upstream`, `mirror`, `bundle`).
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Upstream => "upstream",
            Origin::Mirror => "mirror",
            Origin::Bundle => "bundle",
        }
    }
}

/// One binary download for one architecture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BinaryArtifact {
    /// The component (`kubeadm`, `containerd`, …).
    pub name: String,
    /// The component's version, as the pinned table or `spec.assets.files` gives it.
    pub version: String,
    /// The architecture it is built for (`amd64`, `arm64`).
    pub arch: String,
    /// Where it is fetched from (`file://` for a file on the operator's machine).
    pub url: String,
    /// The hex sha256 it must have: pinned, or given with a `spec.assets.files` override.
    pub sha256: String,
    /// Size in bytes; `None` until fetched (kprov's table pins checksums, not sizes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Upstream, the mirror or a bundle.
    pub origin: Origin,
    /// Installed only on these hosts (`etcd`: the hosts of an external etcd cluster).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub only_on: Option<String>,
}

/// One container image the nodes run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageArtifact {
    /// The full reference as the nodes ask containerd for it.
    pub reference: String,
    /// `sha256:…` when the reference pins one; `None` when only a tag is pinned and the digest
    /// is what the registry serves when the bundle is made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Who runs it (`kubeadm`, `calico`, `cloud-controller-manager`, `api proxy`).
    pub used_by: String,
    /// Upstream, a mirror of its registry (`spec.containerd.registries`), or a bundle.
    pub origin: Origin,
}

/// One `spec.assets.images` archive (imported as is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveArtifact {
    /// The archive's `url` as written in the spec.
    pub url: String,
    /// Its `sha256` as written in the spec.
    pub sha256: String,
}

/// Everything the nodes of one cluster need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifacts {
    /// The cluster's name.
    pub cluster: String,
    /// The completed spec's Kubernetes version, without a leading `v`.
    pub kubernetes_version: String,
    /// Every binary the nodes install (etcd's only for an external etcd), per architecture.
    pub binaries: Vec<BinaryArtifact>,
    /// Every container image, kubeadm's first.
    pub images: Vec<ImageArtifact>,
    /// The `spec.assets.images` archives; omitted from JSON when there are none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub archives: Vec<ArchiveArtifact>,
}

/// Why the list could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// The version or `spec.assets` cannot be resolved to pinned binaries.
    #[error(transparent)]
    Asset(#[from] AssetError),
    /// An add-on manifest (CNI, CCM) could not be rendered to read its images.
    #[error(transparent)]
    Addon(#[from] crate::addons::AddonError),
}

impl Artifacts {
    /// The binaries of `arch` only (a bundle is made for the cluster's architecture).
    pub fn binaries_for(&self, arch: Arch) -> impl Iterator<Item = &BinaryArtifact> {
        self.binaries
            .iter()
            .filter(move |b| b.arch == arch.as_str())
    }
}

/// kubeadm's CoreDNS tag per Kubernetes minor (kubeadm's `constants.CoreDNSVersion`). 1.36's
/// is what the real kubeadm v1.36.2 prints for `kubeadm config images list` (the real-hosts
/// tier's binaries); a minor not listed is shown untagged and `create bundle` refuses it.
fn coredns_tag(minor: u32) -> Option<&'static str> {
    match minor {
        34 => Some("v1.12.1"),
        35 => Some("v1.13.1"),
        36 => Some("v1.14.2"),
        _ => None,
    }
}

/// The registry an image reference pulls from, as containerd's `certs.d` names it: the first
/// path component when it looks like a host (a dot, a port or `localhost`), else `docker.io`.
pub fn registry_of(reference: &str) -> &str {
    match reference.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            first
        }
        _ => "docker.io",
    }
}

/// The registries `spec.containerd.registries` gives at least one mirror.
pub fn mirrored_registries(spec: &crate::spec::ClusterSpec) -> Vec<&str> {
    spec.containerd
        .as_ref()
        .map_or(&[][..], |c| c.registries.as_slice())
        .iter()
        .filter(|r| !r.mirrors.is_empty())
        .map(|r| r.name.as_str())
        .collect()
}

/// The artifact list of a completed cluster spec.
pub fn artifacts(cluster: &Cluster) -> Result<Artifacts, ArtifactError> {
    let spec = &cluster.spec;
    let version = assets::normalize_version(
        spec.kubernetes_version
            .as_deref()
            .ok_or(AssetError::MissingVersion)?,
    )
    .to_string();
    let bundled = spec.assets.as_ref().is_some_and(|a| a.bundle.is_some());
    let external_etcd = spec.etcd.as_ref().map(|e| e.kind) == Some(EtcdType::External);
    let mut binaries = Vec::new();
    for a in assets::resolve(cluster)? {
        if a.component == Component::Etcd && !external_etcd {
            continue;
        }
        let upstream = assets::upstream_url(a.component, &a.version, a.arch);
        let url = match &a.source {
            Source::Url(u) => u.clone(),
            Source::Local(p) => format!("file://{}", p.display()),
            Source::Bundle(e) => format!("bundle:{e}"),
        };
        let origin = if bundled {
            Origin::Bundle
        } else if url == upstream {
            Origin::Upstream
        } else {
            Origin::Mirror
        };
        binaries.push(BinaryArtifact {
            name: a.component.name().to_string(),
            version: a.version.clone(),
            arch: a.arch.as_str().to_string(),
            url,
            sha256: a.sha256.clone(),
            size: None,
            origin,
            only_on: (a.component == Component::Etcd).then(|| "etcd hosts".to_string()),
        });
    }
    let mirrored = mirrored_registries(spec);
    let image_origin = |reference: &str| {
        if bundled {
            Origin::Bundle
        } else if mirrored.contains(&registry_of(reference)) {
            Origin::Mirror
        } else {
            Origin::Upstream
        }
    };
    let mut images: Vec<ImageArtifact> = Vec::new();
    let mut add = |reference: String, used_by: &str| {
        if images.iter().any(|i| i.reference == reference) {
            return;
        }
        let digest = reference
            .split_once('@')
            .map(|(_, d)| d.to_string())
            .filter(|d| d.starts_with("sha256:"));
        let origin = image_origin(&reference);
        images.push(ImageArtifact {
            reference,
            digest,
            used_by: used_by.to_string(),
            origin,
        });
    };
    let k = assets::kubeadm_images(&version)
        .ok_or_else(|| AssetError::UnsupportedVersion(version.clone()))?;
    for c in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-proxy",
    ] {
        add(format!("registry.k8s.io/{c}:v{version}"), "kubeadm");
    }
    match coredns_tag(k.minor) {
        Some(t) => add(format!("registry.k8s.io/coredns/coredns:{t}"), "kubeadm"),
        None => add(
            "registry.k8s.io/coredns/coredns".to_string(),
            "kubeadm (tag chosen by kubeadm; not pinned by kprov)",
        ),
    }
    add(format!("registry.k8s.io/pause:{}", k.pause), "kubeadm");
    if !external_etcd {
        add(format!("registry.k8s.io/etcd:{}", k.etcd), "kubeadm");
    }
    for m in crate::addons::render_addons(cluster)? {
        let mut found = Vec::new();
        for o in m.objects()? {
            collect_images(&o.body, &mut found);
        }
        for r in found {
            add(r, &m.addon);
        }
    }
    if spec
        .api
        .as_ref()
        .and_then(|a| a.endpoint.as_deref())
        .is_none()
    {
        add(
            spec.api
                .as_ref()
                .and_then(|a| a.local_proxy_image.clone())
                .unwrap_or_else(|| assets::API_PROXY_IMAGE.to_string()),
            "api proxy",
        );
    }
    let archives = assets::images(spec.assets.as_ref())?
        .into_iter()
        .map(|i| ArchiveArtifact {
            url: i.url,
            sha256: i.sha256,
        })
        .collect();
    Ok(Artifacts {
        cluster: cluster.name().to_string(),
        kubernetes_version: version,
        binaries,
        images,
        archives,
    })
}

/// Every `image:` of the containers and init containers in a manifest object.
fn collect_images(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (key, val) in m {
                if key == "containers" || key == "initContainers" {
                    for c in val.as_array().into_iter().flatten() {
                        if let Some(i) = c.get("image").and_then(|i| i.as_str())
                            && !out.iter().any(|o| o == i)
                        {
                            out.push(i.to_string());
                        }
                    }
                } else {
                    collect_images(val, out);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| collect_images(x, out)),
        _ => {}
    }
}

/// The text table `kprov get assets` prints.
pub fn table(a: &Artifacts) -> String {
    let mut s = format!(
        "Cluster {} (Kubernetes {}): {} binaries, {} images\n\nBINARY\tVERSION\tARCH\tORIGIN\tSHA256\tURL\n",
        a.cluster,
        a.kubernetes_version,
        a.binaries.len(),
        a.images.len()
    );
    for b in &a.binaries {
        s.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\t{}\n",
            b.name,
            b.version,
            b.arch,
            b.origin.as_str(),
            b.sha256,
            b.url
        ));
    }
    s.push_str("\nIMAGE\tDIGEST\tUSED BY\tORIGIN\n");
    for i in &a.images {
        s.push_str(&format!(
            "{}\t{}\t{}\t{}\n",
            i.reference,
            i.digest
                .as_deref()
                .unwrap_or("(resolved when fetched: only the tag is pinned)"),
            i.used_by,
            i.origin.as_str()
        ));
    }
    if !a.archives.is_empty() {
        s.push_str("\nIMAGE ARCHIVE\tSHA256\n");
        for x in &a.archives {
            s.push_str(&format!("{}\t{}\n", x.url, x.sha256));
        }
    }
    s.push_str("\nSizes are not pinned: they are known once fetched (`kprov create bundle`).\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(etcd: &str, api: &str, cni: &str) -> Cluster {
        let yaml = format!(
            "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: demo.example.com\n\
             spec:\n  cloudProvider: metal\n  kubernetesVersion: 1.35.1\n  networking:\n    \
             podCIDR: 100.96.0.0/11\n    serviceCIDR: 100.64.0.0/13\n    cni: {cni}\n  etcd:\n    \
             type: {etcd}\n{api}"
        );
        serde_saphyr::from_str(&yaml).unwrap()
    }

    fn refs(a: &Artifacts) -> Vec<&str> {
        a.images.iter().map(|i| i.reference.as_str()).collect()
    }

    #[test]
    fn images_of_a_mirrored_registry_come_from_the_mirror_and_the_preview_says_so() {
        let c = cluster(
            "Stacked",
            "  containerd:\n    registries:\n    - name: registry.k8s.io\n      fallback: false\n      \
             mirrors:\n      - endpoint: https://mirror.example.com:5000\n      - endpoint: \
             https://b.example.com\n    - name: quay.io\n",
            "flannel",
        );
        let a = artifacts(&c).unwrap();
        for i in &a.images {
            let want = if registry_of(&i.reference) == "registry.k8s.io" {
                Origin::Mirror
            } else {
                Origin::Upstream
            };
            assert_eq!(i.origin, want, "{i:?}");
        }
        assert!(a.images.iter().any(|i| i.origin == Origin::Upstream));
        let s = crate::provision::plan::sources(&c);
        let images = s.iter().find(|s| s.artifacts == "images").unwrap();
        assert_eq!(images.origin, Origin::Mirror);
        assert_eq!(
            images.describe(),
            "images: from mirror (registry.k8s.io via https://mirror.example.com:5000 and 1 more, \
             never upstream; other registries upstream; pulled by containerd on each host)"
        );
        assert_eq!(registry_of("flannel/flannel:v1"), "docker.io");
        assert_eq!(registry_of("localhost/x:1"), "localhost");
        assert_eq!(registry_of("m.example:5000/x:1"), "m.example:5000");
    }

    #[test]
    fn kubeadm_1_36_images_are_pinned_as_the_real_kubeadm_lists_them() {
        let mut c = cluster("Stacked", "", "flannel");
        c.spec.kubernetes_version = Some("1.36.2".into());
        let a = artifacts(&c).unwrap();
        // `kubeadm config images list --kubernetes-version v1.36.2` of the real binary.
        for r in [
            "registry.k8s.io/coredns/coredns:v1.14.2",
            "registry.k8s.io/pause:3.10.2",
            "registry.k8s.io/etcd:3.6.8-0",
        ] {
            assert!(refs(&a).contains(&r), "{r} missing from {:?}", refs(&a));
        }
    }

    #[test]
    fn stacked_etcd_runs_kubeadms_image_external_etcd_the_pinned_binary() {
        let stacked = artifacts(&cluster("Stacked", "", "flannel")).unwrap();
        assert!(stacked.binaries.iter().all(|b| b.name != "etcd"));
        assert!(refs(&stacked).contains(&"registry.k8s.io/etcd:3.6.6-0"));
        assert!(refs(&stacked).contains(&"registry.k8s.io/coredns/coredns:v1.13.1"));
        // Both architectures of every binary, from upstream, with the pinned checksum.
        assert_eq!(stacked.binaries.len(), 7 * 2);
        assert!(
            stacked
                .binaries
                .iter()
                .all(|b| b.origin == Origin::Upstream)
        );
        let external = artifacts(&cluster("External", "", "flannel")).unwrap();
        let etcd: Vec<_> = external
            .binaries
            .iter()
            .filter(|b| b.name == "etcd")
            .collect();
        assert_eq!(etcd.len(), 2);
        assert_eq!(etcd[0].only_on.as_deref(), Some("etcd hosts"));
        assert!(
            !refs(&external)
                .iter()
                .any(|r| r.starts_with("registry.k8s.io/etcd:"))
        );
    }

    /// Every image of the add-on manifests is listed (flannel's two), and the API proxy's only
    /// when there is no fixed endpoint; a digest-pinned reference keeps its digest.
    #[test]
    fn addon_and_proxy_images_and_pinned_digests() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let a = artifacts(&cluster(
            "Stacked",
            &format!("  api:\n    localProxyImage: m.example/haproxy@{digest}\n"),
            "flannel",
        ))
        .unwrap();
        let r = refs(&a);
        assert!(
            r.iter()
                .any(|x| x.starts_with("docker.io/flannel/flannel:")),
            "{r:?}"
        );
        assert!(
            r.contains(&"docker.io/flannel/flannel-cni-plugin:v1.5.1-flannel2"),
            "{r:?}"
        );
        let proxy = a.images.iter().find(|i| i.used_by == "api proxy").unwrap();
        assert_eq!(proxy.digest.as_deref(), Some(digest.as_str()));
        let fixed = artifacts(&cluster(
            "Stacked",
            "  api:\n    endpoint: api.example.com:6443\n",
            "none",
        ))
        .unwrap();
        assert!(!fixed.images.iter().any(|i| i.used_by == "api proxy"));
        assert!(!fixed.images.iter().any(|i| i.used_by == "flannel"));
        // Tags only elsewhere: no digest invented.
        assert!(fixed.images.iter().all(|i| i.digest.is_none()));
    }

    #[test]
    fn a_mirror_or_a_bundle_is_the_origin() {
        let mut c = cluster("Stacked", "", "none");
        c.spec.assets = Some(crate::spec::Assets {
            mirror: Some("http://10.0.0.1:8080".into()),
            ..Default::default()
        });
        let a = artifacts(&c).unwrap();
        assert!(
            a.binaries
                .iter()
                .all(|b| b.origin == Origin::Mirror && b.url.starts_with("http://10.0.0.1:8080/"))
        );
        assert!(a.images.iter().all(|i| i.origin == Origin::Upstream));
        c.spec.assets.as_mut().unwrap().bundle = Some("/srv/site.tar".into());
        let a = artifacts(&c).unwrap();
        assert!(a.binaries.iter().all(|b| b.origin == Origin::Bundle));
        assert!(a.images.iter().all(|i| i.origin == Origin::Bundle));
    }
}
