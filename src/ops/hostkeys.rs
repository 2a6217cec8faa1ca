//! `forget host-key CLUSTER HOST`: the SSH host key a cluster recorded for one of its hosts
//! (a host of the spec, or one kprov recorded as provisioned) removed under the cluster's
//! lock, so that the next `update cluster --yes --accept-new-host-keys` records the host's
//! current key. [`plan`] finds the host and the name ssh records it under; [`apply`] removes
//! it (the caller holds the lock).

use std::sync::Arc;

use crate::repo::{Repo, RepoError};
use crate::state::lock::{LockError, LockGuard};
use crate::state::{StateError, StateStore};

/// Why a host key cannot be forgotten.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForgetError {
    #[error(
        "{} is neither a host of {cluster}'s spec nor one kprov recorded as provisioned",
        crate::output::untrusted(host)
    )]
    UnknownHost { cluster: String, host: String },
    #[error("{host}: {message}")]
    Address { host: String, message: String },
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// The host key to forget: the host, and the name its keys are recorded under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ForgetPlan {
    pub cluster: String,
    pub host: String,
    /// The `known_hosts` name (`[address]:port` as ssh writes it).
    pub pattern: String,
}

/// Finds `host` among `cluster`'s spec hosts, then kprov's record of provisioned hosts, and
/// the name ssh records its key under. Read-only.
pub(crate) async fn plan(
    repo: &Repo,
    cluster: &str,
    host: &str,
) -> Result<ForgetPlan, ForgetError> {
    let stored = repo.get(cluster).await?;
    let recorded = super::host_records::provisioned_hosts(repo.store().as_ref(), cluster).await?;
    let h = stored
        .cluster
        .value
        .spec
        .hosts
        .iter()
        .find(|h| h.name == host)
        .or_else(|| recorded.get(host))
        .ok_or_else(|| ForgetError::UnknownHost {
            cluster: cluster.to_string(),
            host: host.to_string(),
        })?;
    let pattern = crate::ssh::known_hosts_name(&h.address, h.user.as_deref(), h.port, None)
        .await
        .map_err(|message| ForgetError::Address {
            host: host.to_string(),
            message,
        })?;
    Ok(ForgetPlan {
        cluster: cluster.to_string(),
        host: host.to_string(),
        pattern,
    })
}

/// Removes the recorded keys of `plan`'s host; returns the lines removed (none: nothing was
/// recorded under its name).
pub(crate) async fn apply(
    store: &Arc<dyn StateStore>,
    plan: &ForgetPlan,
    _guard: &LockGuard,
) -> Result<Vec<String>, ForgetError> {
    Ok(crate::ssh::forget_host_key(store, &plan.cluster, &plan.pattern).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::file::FileStore;

    async fn stored(dir: &std::path::Path) -> Repo {
        let store: Arc<dyn StateStore> = Arc::new(FileStore::new(dir).unwrap());
        let repo = Repo::new(store);
        let text = "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: keys.lab\n\
                    spec:\n  cloudProvider: metal\n  hosts:\n  - {name: cp1, address: \"198.18.7.1\", \
                    port: 2222, user: root, roles: [control-plane]}\n";
        let objects = crate::spec::load_objects("c.yaml", text).unwrap();
        let mut per = crate::ops::objects::group_by_cluster(objects).unwrap();
        let mode = crate::ops::objects::Mode::Create;
        crate::ops::objects::plan(&repo, "c.yaml", mode, &mut per, &mut |_| {})
            .await
            .unwrap();
        crate::ops::objects::apply(&repo, "c.yaml", mode, per, &mut |_| {})
            .await
            .unwrap();
        repo
    }

    #[tokio::test]
    async fn a_spec_host_is_found_under_the_name_ssh_records_it_and_another_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let repo = stored(dir.path()).await;
        let p = plan(&repo, "keys.lab", "cp1").await.unwrap();
        assert_eq!(p.host, "cp1");
        assert!(
            p.pattern.contains("198.18.7.1") && p.pattern.contains("2222"),
            "{p:?}"
        );
        let e = plan(&repo, "keys.lab", "cp9").await.unwrap_err();
        assert!(matches!(e, ForgetError::UnknownHost { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "cp9 is neither a host of keys.lab's spec nor one kprov recorded as provisioned"
        );
    }

    #[tokio::test]
    async fn a_cluster_the_store_does_not_have_is_the_stores_error() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn StateStore> = Arc::new(FileStore::new(dir.path()).unwrap());
        assert!(matches!(
            plan(&Repo::new(store), "nope.example.com", "h1").await,
            Err(ForgetError::Repo(_))
        ));
    }
}
