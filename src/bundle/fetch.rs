//! Making a bundle: fetch every artifact of the cluster's list, verify it, write the tar.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use oci_client::Reference;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::{OciImageIndex, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{ENTRY_LIMIT, Entry, EntryKind, FORMAT, MANIFEST, Manifest, image_path};
use crate::bundle::artifacts::Artifacts;
use crate::spec::assets::Arch;

/// Where images are pulled from instead of their own registry (`--registry-mirror
/// registry.k8s.io=http://10.0.0.5:5000`): `http://` for a plain-HTTP registry.
#[derive(Debug, Clone, Default)]
pub struct RegistryMirrors {
    map: BTreeMap<String, (String, bool)>,
}

impl RegistryMirrors {
    /// Parses `UPSTREAM=[http://|https://]HOST[:PORT]`.
    pub fn add(&mut self, spec: &str) -> Result<(), String> {
        let (up, to) = spec.split_once('=').ok_or_else(|| {
            format!("--registry-mirror {spec:?}: expected UPSTREAM=HOST[:PORT] (e.g. registry.k8s.io=http://10.0.0.5:5000)")
        })?;
        let (host, plain) = match to.strip_prefix("http://") {
            Some(h) => (h, true),
            None => (to.strip_prefix("https://").unwrap_or(to), false),
        };
        let host = host.trim_end_matches('/');
        if up.is_empty() || host.is_empty() || host.contains('/') {
            return Err(format!(
                "--registry-mirror {spec:?}: expected UPSTREAM=HOST[:PORT] without a path"
            ));
        }
        self.map.insert(up.to_string(), (host.to_string(), plain));
        Ok(())
    }

    fn resolve(&self, r: &Reference) -> Reference {
        match self.map.get(r.registry()) {
            Some((host, _)) => match (r.tag(), r.digest()) {
                (_, Some(d)) => {
                    Reference::with_digest(host.clone(), r.repository().to_string(), d.to_string())
                }
                (Some(t), None) => {
                    Reference::with_tag(host.clone(), r.repository().to_string(), t.to_string())
                }
                (None, None) => {
                    Reference::with_tag(host.clone(), r.repository().to_string(), "latest".into())
                }
            },
            None => r.clone(),
        }
    }

    fn plain_http(&self) -> Vec<String> {
        self.map
            .values()
            .filter(|(_, plain)| *plain)
            .map(|(h, _)| h.clone())
            .collect()
    }
}

/// How [`make`] fetches.
pub struct Options<'a> {
    /// The architecture whose binaries and image variants are bundled.
    pub arch: Arch,
    /// Where images are pulled from instead of their own registry (`--registry-mirror`).
    pub mirrors: RegistryMirrors,
    /// A line per artifact fetched (the printer's progress).
    pub progress: &'a (dyn Fn(&str) + Sync),
}

/// What was written.
#[derive(Debug)]
pub struct Made {
    /// The manifest written as the bundle's first member.
    pub manifest: Manifest,
    /// The bundle file's size in bytes.
    pub bytes: u64,
}

/// Why a bundle could not be made; nothing is left at the output path.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// One artifact could not be fetched or did not match its sha256.
    #[error("{what}: {message}")]
    Artifact {
        /// The artifact: "binary NAME VERSION (URL)", "image REF" or "image archive URL".
        what: String,
        /// Why: the download's or registry's error, or the checksum mismatch.
        message: String,
    },
    /// Staging or writing the bundle file failed.
    #[error("bundle {path}: {message}")]
    Write {
        /// The bundle path given.
        path: String,
        /// What failed: the I/O or archive error writing the bundle.
        message: String,
    },
}

fn artifact(what: &str, message: impl std::fmt::Display) -> FetchError {
    FetchError::Artifact {
        what: what.to_string(),
        message: message.to_string(),
    }
}

/// Fetches `url` (http(s) or file://) whole, at most `limit` bytes.
pub async fn fetch_url(http: &reqwest::Client, url: &str, limit: u64) -> Result<Vec<u8>, String> {
    if let Some(path) = url.strip_prefix("file://") {
        return crate::bounded::read_file(Path::new(path), limit).map_err(|e| e.to_string());
    }
    let resp = http
        .get(url)
        .send()
        .await
        .map_err(|e| format!("download failed: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("download failed: HTTP {}", resp.status()));
    }
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| format!("download cut short: {e}"))?;
        if out.len() as u64 + chunk.len() as u64 > limit {
            return Err(format!("larger than the limit of {limit} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// `url`'s content, refused unless its sha256 is the one the artifact list pins (`what`
/// names the artifact in the error). Refused before anything is written: the bundle is
/// renamed into place only when every artifact has passed.
async fn fetch_checked(
    http: &reqwest::Client,
    what: &str,
    url: &str,
    sha256: &str,
) -> Result<Vec<u8>, FetchError> {
    let data = fetch_url(http, url, ENTRY_LIMIT)
        .await
        .map_err(|m| artifact(what, m))?;
    let actual = sha(&data);
    if actual != sha256 {
        return Err(artifact(
            what,
            format!("checksum mismatch: expected sha256 {sha256}, got {actual}; nothing written"),
        ));
    }
    Ok(data)
}

/// Fetches every artifact of `list` for one architecture and writes the bundle to `out`
/// (through a temporary file beside it, renamed when complete: a cut run leaves no bundle).
pub async fn make(list: &Artifacts, out: &Path, opts: &Options<'_>) -> Result<Made, FetchError> {
    let shown = out.display().to_string();
    let werr = |m: String| FetchError::Write {
        path: shown.clone(),
        message: m,
    };
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let staging = tempfile::Builder::new()
        .prefix(".kprov-bundle-")
        .tempdir_in(dir)
        .map_err(|e| werr(format!("cannot make a staging directory: {e}")))?;
    let http = reqwest::Client::builder()
        .build()
        .map_err(|e| werr(e.to_string()))?;
    let mut entries: Vec<(Entry, PathBuf)> = Vec::new();
    let stage = |i: usize, data: &[u8]| -> Result<PathBuf, FetchError> {
        let p = staging.path().join(i.to_string());
        std::fs::write(&p, data).map_err(|e| werr(format!("staging: {e}")))?;
        Ok(p)
    };
    for b in list.binaries_for(opts.arch) {
        let what = format!("binary {} {} ({})", b.name, b.version, b.url);
        let data = fetch_checked(&http, &what, &b.url, &b.sha256).await?;
        (opts.progress)(&format!("fetched {what}: {} bytes", data.len()));
        let path = stage(entries.len(), &data)?;
        entries.push((
            Entry {
                path: format!("binaries/{}/{}", b.arch, b.name),
                kind: EntryKind::Binary,
                name: b.name.clone(),
                version: Some(b.version.clone()),
                source: b.url.clone(),
                sha256: b.sha256.clone(),
                size: data.len() as u64,
                digest: None,
            },
            path,
        ));
    }
    for a in &list.archives {
        let what = format!("image archive {}", a.url);
        let data = fetch_checked(&http, &what, &a.url, &a.sha256).await?;
        (opts.progress)(&format!("fetched {what}: {} bytes", data.len()));
        let path = stage(entries.len(), &data)?;
        entries.push((
            Entry {
                path: format!("archives/{}.tar", a.sha256),
                kind: EntryKind::Archive,
                name: a.url.clone(),
                version: None,
                source: a.url.clone(),
                sha256: a.sha256.clone(),
                size: data.len() as u64,
                digest: None,
            },
            path,
        ));
    }
    let client = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(opts.mirrors.plain_http()),
        platform_resolver: None,
        ..Default::default()
    });
    for img in &list.images {
        let what = format!("image {}", img.reference);
        let (data, digest, source) = pull_image(&client, &opts.mirrors, &img.reference, opts.arch)
            .await
            .map_err(|m| artifact(&what, m))?;
        if let Some(pinned) = &img.digest
            && pinned != &digest
        {
            return Err(artifact(
                &what,
                format!("the registry served {digest}, the spec pins {pinned}"),
            ));
        }
        (opts.progress)(&format!("fetched {what} ({digest}): {} bytes", data.len()));
        let path = stage(entries.len(), &data)?;
        entries.push((
            Entry {
                path: image_path(&img.reference),
                kind: EntryKind::Image,
                name: img.reference.clone(),
                version: None,
                source,
                sha256: sha(&data),
                size: data.len() as u64,
                digest: Some(digest),
            },
            path,
        ));
    }
    let manifest = Manifest {
        format: FORMAT.into(),
        cluster: list.cluster.clone(),
        kubernetes_version: list.kubernetes_version.clone(),
        arch: opts.arch.as_str().into(),
        entries: entries.iter().map(|(e, _)| e.clone()).collect(),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".kprov-bundle-")
        .suffix(".tar")
        .tempfile_in(dir)
        .map_err(|e| werr(format!("cannot create: {e}")))?;
    {
        let mut tar = tar::Builder::new(tmp.as_file());
        let mut add = |name: &str, size: u64, data: &mut dyn std::io::Read| {
            let mut h = tar::Header::new_gnu();
            h.set_size(size);
            h.set_mode(0o644);
            h.set_mtime(0);
            h.set_cksum();
            tar.append_data(&mut h, name, data)
                .map_err(|e| werr(format!("writing {name}: {e}")))
        };
        let text = serde_json::to_vec_pretty(&manifest).map_err(|e| werr(e.to_string()))?;
        add(MANIFEST, text.len() as u64, &mut &text[..])?;
        for (e, p) in &entries {
            let mut f = File::open(p).map_err(|e| werr(format!("staging: {e}")))?;
            add(&e.path, e.size, &mut f)?;
        }
        tar.into_inner()
            .and_then(|mut f| f.flush())
            .map_err(|e| werr(format!("finishing: {e}")))?;
    }
    tmp.as_file()
        .sync_all()
        .map_err(|e| werr(format!("sync: {e}")))?;
    let bytes = tmp
        .as_file()
        .metadata()
        .map(|m| m.len())
        .map_err(|e| werr(e.to_string()))?;
    tmp.persist(out)
        .map_err(|e| werr(format!("cannot rename into place: {}", e.error)))?;
    Ok(Made { manifest, bytes })
}

const ACCEPT: &[&str] = &[
    oci_client::manifest::OCI_IMAGE_INDEX_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_LIST_MEDIA_TYPE,
    oci_client::manifest::OCI_IMAGE_MEDIA_TYPE,
    oci_client::manifest::IMAGE_MANIFEST_MEDIA_TYPE,
];

/// Pulls one image for `arch` and returns it as an OCI image layout tar (what
/// `ctr images import` takes), named with its original reference; with the manifest digest
/// (of the index when the registry served one) and where it came from.
async fn pull_image(
    client: &oci_client::Client,
    mirrors: &RegistryMirrors,
    reference: &str,
    arch: Arch,
) -> Result<(Vec<u8>, String, String), String> {
    let original: Reference = reference
        .parse()
        .map_err(|e| format!("not an image reference: {e}"))?;
    let from = mirrors.resolve(&original);
    let auth = RegistryAuth::Anonymous;
    let (raw, digest) = client
        .pull_manifest_raw(&from, &auth, ACCEPT)
        .await
        .map_err(|e| format!("pulling the manifest from {}: {e}", from.registry()))?;
    let value: serde_json::Value =
        serde_json::from_slice(&raw).map_err(|e| format!("manifest is not JSON: {e}"))?;
    let (manifest_raw, manifest_digest, media_type) = if value.get("manifests").is_some() {
        let index: OciImageIndex =
            serde_json::from_slice(&raw).map_err(|e| format!("bad image index: {e}"))?;
        let entry = index
            .manifests
            .iter()
            .find(|m| {
                m.platform.as_ref().is_some_and(|p| {
                    p.os.to_string() == "linux" && p.architecture.to_string() == arch.as_str()
                })
            })
            .ok_or_else(|| format!("no linux/{} image in its index", arch.as_str()))?;
        let by_digest = from.clone_with_digest(entry.digest.clone());
        let (m, d) = client
            .pull_manifest_raw(&by_digest, &auth, ACCEPT)
            .await
            .map_err(|e| format!("pulling the linux/{} manifest: {e}", arch.as_str()))?;
        (m, d, entry.media_type.clone())
    } else {
        let mt = value
            .get("mediaType")
            .and_then(|m| m.as_str())
            .unwrap_or(oci_client::manifest::OCI_IMAGE_MEDIA_TYPE)
            .to_string();
        (raw.clone(), digest.clone(), mt)
    };
    if format!("sha256:{}", sha(&manifest_raw)) != manifest_digest {
        return Err(format!(
            "manifest content does not match its digest {manifest_digest}"
        ));
    }
    let image: OciImageManifest =
        serde_json::from_slice(&manifest_raw).map_err(|e| format!("bad image manifest: {e}"))?;
    let mut blobs: Vec<(String, Vec<u8>)> = Vec::new();
    let mut total = manifest_raw.len() as u64;
    for d in std::iter::once(&image.config).chain(image.layers.iter()) {
        total += d.size.max(0) as u64;
        if total > ENTRY_LIMIT {
            return Err(format!("larger than the limit of {ENTRY_LIMIT} bytes"));
        }
        let mut buf = Vec::with_capacity(d.size.max(0) as usize);
        // oci-client checks the blob against its descriptor's digest.
        client
            .pull_blob(&from, d, &mut buf)
            .await
            .map_err(|e| format!("pulling blob {}: {e}", d.digest))?;
        blobs.push((d.digest.clone(), buf));
    }
    blobs.push((manifest_digest.clone(), manifest_raw.to_vec()));
    let mut annotations = json!({ "io.containerd.image.name": reference });
    if let Some(t) = original.tag() {
        annotations["org.opencontainers.image.ref.name"] = json!(t);
    }
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": media_type,
            "digest": manifest_digest,
            "size": manifest_raw.len(),
            "annotations": annotations,
        }],
    });
    let mut out = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_cksum();
        out.append_data(&mut h, name, data)
            .map_err(|e| format!("building the image tar: {e}"))
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add(
        "index.json",
        &serde_json::to_vec(&index).map_err(|e| e.to_string())?,
    )?;
    let mut seen = std::collections::BTreeSet::new();
    for (digest, data) in &blobs {
        let hex = digest
            .strip_prefix("sha256:")
            .ok_or_else(|| format!("unsupported digest {digest}"))?;
        if seen.insert(hex.to_string()) {
            add(&format!("blobs/sha256/{hex}"), data)?;
        }
    }
    let data = out.into_inner().map_err(|e| e.to_string())?;
    let source = format!("{}/{}", from.registry(), from.repository());
    Ok((data, digest, source))
}
