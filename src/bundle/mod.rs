//! Air-gapped bundles: every binary and image a cluster's nodes need, in one tar file.
//!
//! `kprov create bundle` fetches exactly the list of [`crate::bundle::artifacts`] (so the
//! bundle and the node plan cannot disagree): binaries from their URLs or the configured
//! mirror, each verified against its pinned sha256; images through the OCI distribution API
//! (`oci-client`), for one architecture, each stored as an OCI image layout tar that
//! `ctr -n k8s.io images import` takes. The first member, `manifest.json`, lists every other
//! member with its sha256 and size. [`Bundle::open`] checks the manifest against every member
//! before anything is uploaded: a tampered, truncated or padded bundle is refused naming the
//! entry.

pub mod artifacts;
pub mod fetch;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The manifest's `format`: bumped when a reader of this version cannot use a bundle.
pub const FORMAT: &str = "kprov-bundle/1";
/// The tar path of the manifest, the bundle's first member.
pub const MANIFEST: &str = "manifest.json";
/// The manifest itself is small (one line per artifact).
const MANIFEST_LIMIT: u64 = 16 * 1024 * 1024;
/// One member (a containerd tarball is ~40 MB, a large image a few hundred).
pub const ENTRY_LIMIT: u64 = crate::bounded::LOCAL_ASSET;

/// What a bundle member is (the manifest's `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EntryKind {
    /// A node binary or release tarball (by component name, as `spec.assets.files` names it).
    Binary,
    /// A container image as an OCI image layout tar.
    Image,
    /// A `spec.assets.images` archive, as given.
    Archive,
}

/// One member of the bundle as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    /// The member's path in the tar.
    pub path: String,
    /// Binary, image or archive.
    pub kind: EntryKind,
    /// Component name (binary), image reference (image) or URL (archive).
    pub name: String,
    /// The binary's version (binaries only; `None` for images and archives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Where it was fetched from.
    pub source: String,
    /// Hex sha256 of the member's bytes, checked on open and on every read.
    pub sha256: String,
    /// The member's size in bytes.
    pub size: u64,
    /// The image manifest's digest as the registry served it (images only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// `manifest.json`: what the bundle was made for and every other member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    /// The bundle format; a bundle whose format is not [`FORMAT`] is refused.
    pub format: String,
    /// The cluster the bundle was made for.
    pub cluster: String,
    /// The Kubernetes version its binaries and images are for.
    pub kubernetes_version: String,
    /// The nodes' architecture (`amd64`, `arm64`).
    pub arch: String,
    /// Every member except the manifest itself.
    pub entries: Vec<Entry>,
}

impl Manifest {
    /// The binary entry for a component name (as `spec.assets.files` names it), if bundled.
    pub fn binary(&self, name: &str) -> Option<&Entry> {
        self.entries
            .iter()
            .find(|e| e.kind == EntryKind::Binary && e.name == name)
    }

    /// The members' total size in bytes (without the manifest).
    pub fn total_size(&self) -> u64 {
        self.entries.iter().map(|e| e.size).sum()
    }
}

/// Why a bundle was refused.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// The bundle as a whole: unreadable, empty, cut short, or not starting with the manifest.
    #[error("bundle {path}: {message}")]
    Bad {
        /// The bundle file.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// One member, the manifest included: unreadable, of the wrong format, listed twice or
    /// not at all, or not matching its manifest entry (missing, size, sha256).
    #[error("bundle {path}: entry {entry}: {message}; nothing uploaded")]
    Entry {
        /// The bundle file.
        path: String,
        /// The member's path in the tar.
        entry: String,
        /// How it differs from the manifest.
        message: String,
    },
}

/// A bundle whose every member was checked against its manifest.
#[derive(Debug)]
pub struct Bundle {
    path: PathBuf,
    /// The checked manifest.
    pub manifest: Manifest,
    /// Offset of each member's data in the file, by path.
    offsets: BTreeMap<String, u64>,
    /// Members read so far: every host's upload shares one buffer (hashed once by the engine).
    loaded: BTreeMap<String, OnceLock<Bytes>>,
}

fn hex_sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

impl Bundle {
    /// Reads the manifest and checks every member against it (sha256 and size), streaming: no
    /// member is held in memory. Any member missing, unlisted, of another size or digest, or a
    /// file cut short, refuses the bundle naming the entry.
    pub fn open(path: &Path) -> Result<Bundle, BundleError> {
        let shown = path.display().to_string();
        let bad = |message: String| BundleError::Bad {
            path: shown.clone(),
            message,
        };
        let entry_err = |entry: &str, message: String| BundleError::Entry {
            path: shown.clone(),
            entry: entry.to_string(),
            message,
        };
        let file = File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
        let mut archive = tar::Archive::new(file);
        let mut entries = archive
            .entries()
            .map_err(|e| bad(format!("not a tar file: {e}")))?;
        let mut first = entries
            .next()
            .ok_or_else(|| bad("is empty (no manifest.json)".into()))?
            .map_err(|e| bad(format!("unreadable first member: {e}")))?;
        let first_path = first
            .path()
            .map(|p| p.display().to_string())
            .map_err(|e| bad(format!("unreadable first member's name: {e}")))?;
        if first_path != MANIFEST {
            return Err(bad(format!(
                "first member is {first_path:?}, not {MANIFEST} (not a kprov bundle?)"
            )));
        }
        let text = crate::bounded::read(&mut first, MANIFEST, MANIFEST_LIMIT)
            .map_err(|e| entry_err(MANIFEST, e.to_string()))?;
        let manifest: Manifest = serde_json::from_slice(&text)
            .map_err(|e| entry_err(MANIFEST, format!("not a kprov bundle manifest: {e}")))?;
        if manifest.format != FORMAT {
            return Err(entry_err(
                MANIFEST,
                format!(
                    "format {:?} is not {FORMAT:?} (made by another kprov version?)",
                    manifest.format
                ),
            ));
        }
        drop(first);
        let mut want: BTreeMap<&str, &Entry> = BTreeMap::new();
        for e in &manifest.entries {
            if want.insert(e.path.as_str(), e).is_some() {
                return Err(entry_err(&e.path, "listed twice in manifest.json".into()));
            }
        }
        let mut offsets = BTreeMap::new();
        for member in entries {
            let mut member = member.map_err(|e| bad(format!("unreadable (cut short?): {e}")))?;
            let name = member
                .path()
                .map(|p| p.display().to_string())
                .map_err(|e| bad(format!("member with a bad name: {e}")))?;
            let Some(entry) = want.remove(name.as_str()) else {
                return Err(entry_err(&name, "is not listed in manifest.json".into()));
            };
            let offset = member.raw_file_position();
            let mut hasher = Sha256::new();
            let mut buf = vec![0u8; 1 << 16];
            let mut size = 0u64;
            loop {
                let n = member
                    .read(&mut buf)
                    .map_err(|e| entry_err(&name, format!("cannot read (cut short?): {e}")))?;
                if n == 0 {
                    break;
                }
                size += n as u64;
                if size > ENTRY_LIMIT {
                    return Err(entry_err(&name, "larger than the member limit".into()));
                }
                hasher.update(&buf[..n]);
            }
            if size != entry.size {
                return Err(entry_err(
                    &name,
                    format!(
                        "has {size} bytes, manifest.json says {} (truncated?)",
                        entry.size
                    ),
                ));
            }
            let actual = hex::encode(hasher.finalize());
            if actual != entry.sha256 {
                return Err(entry_err(
                    &name,
                    format!(
                        "checksum mismatch: expected sha256 {}, got {actual} (tampered or damaged)",
                        entry.sha256
                    ),
                ));
            }
            offsets.insert(name, offset);
        }
        if let Some(missing) = want.keys().next() {
            return Err(entry_err(
                missing,
                "is listed in manifest.json but missing from the file (truncated?)".into(),
            ));
        }
        let loaded = manifest
            .entries
            .iter()
            .map(|e| (e.path.clone(), OnceLock::new()))
            .collect();
        Ok(Bundle {
            path: path.to_path_buf(),
            manifest,
            offsets,
            loaded,
        })
    }

    /// The bundle file as given to [`Bundle::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The content of one member, read once and checked again (the file may have changed
    /// since it was opened).
    pub fn read(&self, entry: &Entry) -> Result<Bytes, BundleError> {
        let err = |message: String| BundleError::Entry {
            path: self.path.display().to_string(),
            entry: entry.path.clone(),
            message,
        };
        let slot = self
            .loaded
            .get(&entry.path)
            .ok_or_else(|| err("not in this bundle".into()))?;
        if let Some(b) = slot.get() {
            return Ok(b.clone());
        }
        let offset = *self
            .offsets
            .get(&entry.path)
            .ok_or_else(|| err("not in this bundle".into()))?;
        let mut f = File::open(&self.path).map_err(|e| err(format!("cannot open: {e}")))?;
        f.seek(SeekFrom::Start(offset))
            .map_err(|e| err(format!("cannot seek: {e}")))?;
        let bytes = crate::bounded::read(f.take(entry.size), &entry.path, ENTRY_LIMIT)
            .map_err(|e| err(e.to_string()))?;
        let actual = hex_sha(&bytes);
        if bytes.len() as u64 != entry.size || actual != entry.sha256 {
            return Err(err(format!(
                "changed since it was checked: expected sha256 {}, got {actual}",
                entry.sha256
            )));
        }
        Ok(slot.get_or_init(|| Bytes::from(bytes)).clone())
    }
}

/// The file a verified handle was made from, as the file system names it now: a bundle
/// replaced or written to since (another inode, size or modification time) is verified anew.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct FileIdentity {
    path: PathBuf,
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

impl FileIdentity {
    fn of(path: &Path) -> Option<FileIdentity> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(FileIdentity {
            path: std::fs::canonicalize(path).ok()?,
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }
}

/// The verified handles of this process, and how many full verifications each path cost.
#[derive(Default)]
struct Verified {
    handles: BTreeMap<FileIdentity, std::sync::Arc<Bundle>>,
    counts: BTreeMap<PathBuf, u64>,
}

fn verified() -> &'static std::sync::Mutex<Verified> {
    static V: OnceLock<std::sync::Mutex<Verified>> = OnceLock::new();
    V.get_or_init(Default::default)
}

/// The one verified handle of the bundle at `path` in this run: the first call checks every
/// member ([`Bundle::open`]); a later renderer of the same run (the preview's, then the apply's
/// after the lock, the rolling update's per group) shares it instead of hashing gigabytes
/// again. Each member's digest is still checked when it is read ([`Bundle::read`]), and a file
/// changed since (inode, size, mtime) is verified in full again.
pub fn open_verified(path: &Path) -> Result<std::sync::Arc<Bundle>, BundleError> {
    let id = FileIdentity::of(path);
    let mut v = verified().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = id.as_ref().and_then(|id| v.handles.get(id)) {
        tracing::debug!(bundle = %path.display(), "reusing this run's verified bundle");
        return Ok(h.clone());
    }
    let bundle = std::sync::Arc::new(Bundle::open(path)?);
    tracing::debug!(
        bundle = %path.display(),
        entries = bundle.manifest.entries.len(),
        bytes = bundle.manifest.total_size(),
        "bundle verified in full"
    );
    if let Some(id) = id {
        *v.counts.entry(id.path.clone()).or_default() += 1;
        // One handle per path: an older identity of it is stale.
        v.handles.retain(|k, _| k.path != id.path);
        v.handles.insert(id, bundle.clone());
    }
    Ok(bundle)
}

/// How many full verifications of the bundle at `path` [`open_verified`] made (and passed) in
/// this process.
pub fn full_verifications(path: &Path) -> u64 {
    let Ok(p) = std::fs::canonicalize(path) else {
        return 0;
    };
    let v = verified().lock().unwrap_or_else(|p| p.into_inner());
    v.counts.get(&p).copied().unwrap_or(0)
}

/// A member path for an image reference (`registry.k8s.io/pause:3.10.2` →
/// `images/registry.k8s.io_pause_3.10.2.tar`).
pub fn image_path(reference: &str) -> String {
    let safe: String = reference
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("images/{safe}.tar")
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn write_bundle(dir: &Path, members: &[(&str, &[u8])]) -> PathBuf {
        let entries = members
            .iter()
            .map(|(p, c)| Entry {
                path: p.to_string(),
                kind: EntryKind::Binary,
                name: p.to_string(),
                version: None,
                source: "test".into(),
                sha256: hex_sha(c),
                size: c.len() as u64,
                digest: None,
            })
            .collect();
        let m = Manifest {
            format: FORMAT.into(),
            cluster: "c".into(),
            kubernetes_version: "1.36.4".into(),
            arch: "amd64".into(),
            entries,
        };
        let path = dir.join("b.tar");
        let mut b = tar::Builder::new(File::create(&path).unwrap());
        let mut add = |name: &str, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, data).unwrap();
        };
        add(MANIFEST, &serde_json::to_vec(&m).unwrap());
        for (p, c) in members {
            add(p, c);
        }
        b.finish().unwrap();
        path
    }

    /// A bundle of two members, `binaries/a` ("alpha") and `images/b.tar` ("beta"), in a
    /// directory of its own (removed when the first value is dropped).
    fn alpha_beta() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = write_bundle(
            d.path(),
            &[("binaries/a", b"alpha"), ("images/b.tar", b"beta")],
        );
        (d, p)
    }

    #[test]
    fn a_good_bundle_opens_and_reads() {
        let (_d, p) = alpha_beta();
        let b = Bundle::open(&p).unwrap();
        let e = b.manifest.entries[1].clone();
        assert_eq!(&b.read(&e).unwrap()[..], b"beta");
        assert_eq!(b.manifest.total_size(), 9);
    }

    /// Every byte of every member's data: a flip is refused, naming the member.
    #[test]
    fn a_flipped_byte_is_refused_naming_the_entry() {
        let (_d, p) = alpha_beta();
        let clean = std::fs::read(&p).unwrap();
        for (needle, entry) in [(&b"alpha"[..], "binaries/a"), (b"beta", "images/b.tar")] {
            let at = clean
                .windows(needle.len())
                .position(|w| w == needle)
                .unwrap();
            for i in 0..needle.len() {
                let mut bytes = clean.clone();
                bytes[at + i] ^= 0x01;
                std::fs::write(&p, &bytes).unwrap();
                let e = Bundle::open(&p).unwrap_err().to_string();
                assert!(
                    e.contains(&format!("entry {entry}: checksum mismatch")),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn truncated_padded_or_foreign_bundles_are_refused() {
        let (d, p) = alpha_beta();
        let clean = std::fs::read(&p).unwrap();
        // Cut inside the last member's data: the tar reader or the size check names it.
        let at = clean.windows(4).position(|w| w == b"beta").unwrap();
        std::fs::write(&p, &clean[..at + 2]).unwrap();
        let e = Bundle::open(&p).unwrap_err().to_string();
        assert!(e.contains("cut short") || e.contains("images/b.tar"), "{e}");
        // Cut before the last member's header: listed but missing.
        let hdr = at - 512;
        std::fs::write(&p, &clean[..hdr]).unwrap();
        let e = Bundle::open(&p).unwrap_err().to_string();
        assert!(
            e.contains("entry images/b.tar: is listed in manifest.json but missing"),
            "{e}"
        );
        // A member the manifest does not list.
        let mut b = tar::Builder::new(File::create(d.path().join("x.tar")).unwrap());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_cksum();
        b.append_data(&mut h, "evil", &b"x"[..]).unwrap();
        b.finish().unwrap();
        drop(b);
        let e = Bundle::open(&d.path().join("x.tar"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("first member is \"evil\""), "{e}");
        // Not a tar at all.
        std::fs::write(&p, b"hello").unwrap();
        assert!(Bundle::open(&p).is_err());
    }

    /// One full verification per file per run; a changed file is verified again and a
    /// tampered one refused, not served from the earlier handle.
    #[test]
    fn a_bundle_is_verified_once_per_run_until_it_changes() {
        let d = tempfile::tempdir().unwrap();
        let p = write_bundle(d.path(), &[("binaries/a", b"alpha")]);
        let a = open_verified(&p).unwrap();
        let b = open_verified(&p).unwrap();
        assert!(std::sync::Arc::ptr_eq(&a, &b));
        assert_eq!(full_verifications(&p), 1);
        let mut bytes = std::fs::read(&p).unwrap();
        let at = bytes.windows(5).position(|w| w == b"alpha").unwrap();
        bytes[at] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        // Same size; the mtime may not move within a coarse clock tick: a new inode does.
        let q = d.path().join("q.tar");
        std::fs::write(&q, &bytes).unwrap();
        std::fs::rename(&q, &p).unwrap();
        let e = open_verified(&p).unwrap_err().to_string();
        assert!(e.contains("entry binaries/a: checksum mismatch"), "{e}");
        assert_eq!(full_verifications(&p), 1, "a refused bundle is not counted");
    }

    #[test]
    fn image_paths_are_plain_names() {
        assert_eq!(
            image_path("registry.k8s.io/pause:3.10.2"),
            "images/registry.k8s.io_pause_3.10.2.tar"
        );
    }
}
