//! `create bundle`: every binary and image a cluster's nodes need, in one file for sites
//! with no internet on their nodes. [`plan`] checks that every image is pinned (a tag or a
//! digest) and reads the flags; [`make`] fetches and writes the bundle, a line per artifact
//! through `progress`.

use std::path::Path;

use crate::bundle::artifacts::{self, ArtifactError, Artifacts};
use crate::bundle::fetch::{self, FetchError, Made, RegistryMirrors};
use crate::spec::Cluster;
use crate::spec::assets::Arch;

/// Why no bundle was made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BundleError {
    #[error(transparent)]
    Artifacts(#[from] ArtifactError),
    /// An image the cluster needs has no tag or digest pinned: a bundle of it would not be
    /// reproducible, so nothing is fetched.
    #[error(
        "image {image} ({used_by}): kprov pins no tag for it with Kubernetes {version}; nothing fetched"
    )]
    Unpinned {
        image: String,
        used_by: String,
        version: String,
    },
    /// A `--registry-mirror` flag that does not parse.
    #[error("{0}")]
    Mirror(String),
    #[error(transparent)]
    Fetch(#[from] FetchError),
}

/// `get assets`: every binary and image `cluster`'s nodes need.
pub(crate) fn assets(cluster: &Cluster) -> Result<Artifacts, BundleError> {
    Ok(artifacts::artifacts(cluster)?)
}

/// What [`make`] fetches.
pub(crate) struct BundlePlan {
    pub list: Artifacts,
    pub arch: Arch,
    mirrors: RegistryMirrors,
}

impl BundlePlan {
    /// How many artifacts the bundle holds (the progress bar's length).
    pub(crate) fn count(&self) -> usize {
        self.list.binaries_for(self.arch).count()
            + self.list.images.len()
            + self.list.archives.len()
    }
}

/// The artifacts of `cluster` for `arch` (`arm64`, else amd64), every image pinned, the
/// registry mirrors (`UPSTREAM=HOST[:PORT]`) read.
pub(crate) fn plan(
    cluster: &Cluster,
    arch: &str,
    registry_mirrors: &[String],
) -> Result<BundlePlan, BundleError> {
    let list = artifacts::artifacts(cluster)?;
    if let Some(i) = list.images.iter().find(|i| {
        let last = i.reference.rsplit('/').next().unwrap_or_default(); // rsplit yields one at least
        !last.contains(':') && !i.reference.contains('@')
    }) {
        return Err(BundleError::Unpinned {
            image: i.reference.clone(),
            used_by: i.used_by.to_string(),
            version: list.kubernetes_version.clone(),
        });
    }
    let arch = match arch {
        "arm64" => Arch::Arm64,
        _ => Arch::Amd64,
    };
    let mut mirrors = RegistryMirrors::default();
    for m in registry_mirrors {
        mirrors.add(m).map_err(BundleError::Mirror)?;
    }
    Ok(BundlePlan {
        list,
        arch,
        mirrors,
    })
}

/// Fetches every artifact of `plan` into the bundle at `out`.
pub(crate) async fn make(
    plan: BundlePlan,
    out: &Path,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Made, BundleError> {
    let options = fetch::Options {
        arch: plan.arch,
        mirrors: plan.mirrors,
        progress,
    };
    Ok(fetch::make(&plan.list, out, &options).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mirror_flag_that_does_not_parse_is_refused_before_any_fetch() {
        let cluster: Cluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "kprov.dev/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": "b.lab"},
            "spec": {"cloudProvider": "metal"}
        }))
        .unwrap();
        let (cluster, _) = crate::spec::defaults::complete(&cluster, &[]);
        let plan = plan(&cluster, "arm64", &[]).expect("every image pinned");
        assert_eq!(plan.arch, Arch::Arm64);
        assert!(plan.count() > 0);
        let e = super::plan(&cluster, "amd64", &["registry.k8s.io".into()])
            .err()
            .expect("refused");
        assert!(matches!(e, BundleError::Mirror(_)), "{e}");
    }
}
