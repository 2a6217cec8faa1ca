//! `backup etcd`, `get backups` and `restore etcd` without the command line (issue 19), on
//! every platform: [`open`] asks the platform seam for the machines (metal's hosts, AWS's
//! instances) and refuses a cluster with no etcd member running; [`EtcdBackups::backup`] and
//! [`EtcdBackups::restore`] run under the caller's lock over an SSH fleet with strict host
//! keys; [`EtcdBackups::restore_plan`] is the restore's read-only preview (the snapshot's
//! checksum verified first). [`backups`] lists a cluster's backups, a deleted cluster's kept
//! ones included. Errors are [`EtcdError`]s.
//!
//! ```text
//! let etcd = ops::etcd_backup::open(store, &resolved, reach).await?;
//! let record = session.with_lock(name, "backup etcd", async |guard| etcd.backup(guard).await).await?;
//! ```

use std::sync::Arc;

use bytes::Bytes;

use super::etcd::{self, BackupRecord, Backups, RestorePlan};
use super::nodes::no_events;
use super::platform::{Platform, Reach};
use crate::nodes::Target;
use crate::repo::{Repo, RepoError};
use crate::spec::ResolvedCluster;
use crate::state::StateStore;
use crate::state::lock::{LockError, LockGuard};

/// Hosts worked on at once (every member restores at the same time anyway).
const CONCURRENCY: usize = 20;

/// Why an etcd command could not run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EtcdError {
    /// The platform found no etcd member: nothing to back up or restore.
    #[error(
        "{cluster} has no etcd member running (no control plane{}); nothing to back up or restore",
        if *.aws { " instance found: `kprov get instances` lists them" } else { "" }
    )]
    NoMember { cluster: String, aws: bool },
    /// The cluster's lock could not be taken, or was lost.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// A step that failed, or a refused snapshot (naming the host, key or record).
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// The etcd commands opened on one cluster: its platform and its machines.
pub(crate) struct EtcdBackups {
    store: Arc<dyn StateStore>,
    cluster: ResolvedCluster,
    platform: Platform,
    targets: Vec<Target>,
}

/// A restore previewed: the snapshot (verified against its record) and what happens where.
pub(crate) struct Restore {
    pub(crate) plan: RestorePlan,
    snapshot: Bytes,
}

/// Opens the etcd commands on `cluster` (resolved once by the caller, so a stored spec that
/// is no longer valid is refused before any host is contacted): the platform's machines,
/// refused when none runs etcd.
pub(crate) async fn open(
    store: Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    reach: Reach,
) -> Result<EtcdBackups, EtcdError> {
    let platform = Platform::open(&store, cluster, reach).await?;
    let targets = platform.targets().await?;
    if platform.etcd_hosts(&targets).is_empty() {
        return Err(EtcdError::NoMember {
            cluster: cluster.name.clone(),
            aws: matches!(platform, Platform::Aws(_)),
        });
    }
    Ok(EtcdBackups {
        store,
        cluster: cluster.clone(),
        platform,
        targets,
    })
}

impl EtcdBackups {
    /// Where a stored key is, as the user finds it (`s3://bucket/key`, a file path).
    pub(crate) fn location(&self, key: &str) -> String {
        self.store.key_location(key)
    }

    /// `backup etcd`: a snapshot of a healthy member into the store, under the caller's lock
    /// (`_guard`).
    pub(crate) async fn backup(&self, _guard: &LockGuard) -> Result<BackupRecord, EtcdError> {
        let fleet = self
            .platform
            .fleet(&self.store, &self.targets, CONCURRENCY, &no_events())?;
        let r = etcd::backup(
            self.store.as_ref(),
            &self.cluster,
            &self.targets,
            &fleet,
            chrono::Utc::now(),
        )
        .await;
        fleet.close().await;
        Ok(r?)
    }

    /// The restore's preview from snapshot `from`: its checksum verified before anything else,
    /// then what happens on each host. Read-only.
    pub(crate) async fn restore_plan(&self, from: &str) -> Result<Restore, EtcdError> {
        let (record, snapshot) = etcd::load(self.store.as_ref(), &self.cluster.name, from).await?;
        Ok(Restore {
            plan: etcd::restore_plan(&self.cluster, &self.targets, &record),
            snapshot,
        })
    }

    /// `restore etcd --yes`: `restore` on every member, under the caller's lock (`_guard`).
    pub(crate) async fn restore(
        &self,
        restore: &Restore,
        _guard: &LockGuard,
    ) -> Result<(), EtcdError> {
        let fleet = self
            .platform
            .fleet(&self.store, &self.targets, CONCURRENCY, &no_events())?;
        let r = etcd::restore(&self.cluster, &self.targets, &fleet, &restore.snapshot).await;
        fleet.close().await;
        Ok(r?)
    }
}

/// `get backups`: the backups of `cluster`, which must exist or have been deleted with its
/// backups kept (a typo is an error, not an empty list).
pub(crate) async fn backups(
    store: &Arc<dyn StateStore>,
    cluster: &str,
) -> Result<Backups, EtcdError> {
    match Repo::new(store.clone()).get(cluster).await {
        Ok(_) | Err(RepoError::BackupsOnly { .. }) => {}
        Err(e) => return Err(anyhow::Error::from(e).into()),
    }
    Ok(etcd::list(store.as_ref(), cluster).await?)
}
