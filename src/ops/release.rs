//! A Kubernetes patch release newer than kprov's checksum table: `create cluster` reads the
//! release's published `.sha256` files (from dl.k8s.io, or the spec's `assets.mirror` laid out
//! like it) once and pins them in `spec.assets.checksums`, so every node and every later run
//! agrees on the bytes. An unreachable site or a missing or malformed checksum is an error at
//! create, naming the URL: nothing is stored, nothing is half installed.

use std::time::Duration;

use crate::spec::assets::{self, mirror_url, normalize_version, upstream_url};
use crate::spec::{Assets, Cluster, PinnedChecksum};

/// A `.sha256` file is one line (the digest, sometimes followed by the file name).
const CHECKSUM_FILE_LIMIT: u64 = 1024;
/// Each download, end to end.
const FETCH_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
#[error(
    "cannot pin the checksums of Kubernetes {version}: {url}: {message}; nothing was created \
     (check spec.assets.mirror, or choose a version kprov knows)"
)]
pub(crate) struct ReleaseError {
    pub version: String,
    pub url: String,
    pub message: String,
}

/// Pins the checksums `cluster`'s Kubernetes version needs beyond kprov's table, fetched now.
/// Returns one line per pinned binary for the user; nothing to do for a version of the table,
/// an unknown minor (validation refuses it) or checksums already pinned.
pub(crate) async fn pin_checksums(cluster: &mut Cluster) -> Result<Vec<String>, ReleaseError> {
    let Some(version) = cluster.spec.kubernetes_version.clone() else {
        return Ok(Vec::new());
    };
    let version = normalize_version(&version).to_string();
    if !assets::minor_known(&version) || assets::installable(&version, cluster.spec.assets.as_ref())
    {
        return Ok(Vec::new());
    }
    let spec_assets = cluster.spec.assets.get_or_insert_with(Assets::default);
    let wanted: Vec<(String, String, String)> = assets::unpinned(&version)
        .into_iter()
        .filter(|(c, v, a)| {
            let name = format!("{}/{}", c.name(), a.as_str());
            !spec_assets
                .checksums
                .iter()
                .any(|p| p.name == name && normalize_version(&p.version) == v)
        })
        .map(|(c, v, a)| {
            let upstream = upstream_url(c, &v, a);
            let url = match &spec_assets.mirror {
                Some(m) => mirror_url(m, &upstream),
                None => upstream,
            };
            (
                format!("{}/{}", c.name(), a.as_str()),
                v,
                format!("{url}.sha256"),
            )
        })
        .collect();
    let http = reqwest::Client::builder()
        .timeout(FETCH_TIMEOUT)
        .build()
        .map_err(|e| ReleaseError {
            version: version.clone(),
            url: String::new(),
            message: e.to_string(),
        })?;
    let fetched = futures::future::join_all(wanted.iter().map(|(_, _, url)| {
        let http = &http;
        async move { crate::bundle::fetch::fetch_url(http, url, CHECKSUM_FILE_LIMIT).await }
    }))
    .await;
    let mut notes = Vec::new();
    for ((name, v, url), got) in wanted.into_iter().zip(fetched) {
        let err = |message: String| ReleaseError {
            version: version.clone(),
            url: crate::output::escape(&url).to_string(),
            message,
        };
        let body = got.map_err(err)?;
        let sha256 = parse_checksum(&body).ok_or_else(|| {
            err("not a sha256 checksum file (64 hex digits expected)".to_string())
        })?;
        notes.push(format!("pinned {name} {v}: sha256 {sha256} (from {url})"));
        spec_assets.checksums.push(PinnedChecksum {
            name,
            version: v,
            sha256,
        });
    }
    Ok(notes)
}

/// The digest of a `.sha256` file: its first word, 64 hex digits (dl.k8s.io publishes the bare
/// digest; `sha256sum` output adds the file name).
fn parse_checksum(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let word = text.split_whitespace().next()?;
    (word.len() == 64 && word.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| word.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checksum_file_is_its_first_word_of_64_hex_digits() {
        let d = "ab".repeat(32);
        assert_eq!(parse_checksum(d.as_bytes()), Some(d.clone()));
        assert_eq!(
            parse_checksum(format!("{}  kubeadm\n", d.to_uppercase()).as_bytes()),
            Some(d.clone())
        );
        assert_eq!(parse_checksum(b"<html>not found</html>"), None);
        assert_eq!(parse_checksum(&d.as_bytes()[..63]), None);
        assert_eq!(parse_checksum(b""), None);
    }

    #[test]
    fn a_newer_patch_of_a_known_minor_needs_its_kubernetes_binaries_pinned() {
        let newest = assets::SUPPORTED_KUBERNETES_VERSIONS
            .iter()
            .filter_map(|v| crate::spec::versions::parse(v))
            .max()
            .expect("a version");
        let next = format!("{}.{}.{}", newest.0, newest.1, newest.2 + 50);
        assert!(assets::minor_known(&next));
        assert!(!assets::installable(&next, None));
        let missing = assets::unpinned(&next);
        // kubeadm, kubelet, kubectl for both architectures; crictl follows the minor.
        assert_eq!(missing.len(), 6, "{missing:?}");
        let pins = Assets {
            checksums: missing
                .iter()
                .map(|(c, v, a)| PinnedChecksum {
                    name: format!("{}/{}", c.name(), a.as_str()),
                    version: v.clone(),
                    sha256: "cd".repeat(32),
                })
                .collect(),
            ..Assets::default()
        };
        assert!(assets::installable(&next, Some(&pins)));
        let resolved = assets::resolve_for(&next, Some(&pins)).expect("resolves");
        let kubeadm = resolved
            .iter()
            .find(|a| a.component == assets::Component::Kubeadm)
            .expect("kubeadm");
        assert_eq!(kubeadm.sha256, "cd".repeat(32));
        // An unknown minor is never made installable by pins: kprov does not know its images.
        assert!(!assets::minor_known(&format!(
            "{}.{}.0",
            newest.0,
            newest.1 + 5
        )));
    }
}
