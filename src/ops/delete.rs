//! `delete cluster`: [`plan`] says what goes (read-only; the preview prints it), [`apply`]
//! does it under the caller's lock ([`super::session::Session::with_lock`]).
//!
//! A cluster whose spec reads loses its machines first (the spec is what finds them), then its
//! objects in the store; the lock key lives under the cluster's prefix, so releasing it is
//! the last delete:
//! - AWS: every owned cloud resource, in reverse dependency order (planned again under the
//!   lock);
//! - metal: the hosts that carry the cluster's ownership marker are reset (kubeadm reset,
//!   kprov's files removed): the spec's hosts and every host kprov recorded as provisioned
//!   that the spec dropped since, so none keeps a kubelet and a marker naming a dead cluster.
//!   Hosts whose key the cluster never recorded, and hosts of other clusters, are left alone;
//!   any other host that cannot be reset fails the delete, so the state (and with it the
//!   hosts' keys) stays for a retry; a host kprov provisioned is never said to be one it
//!   "never connected to".
//!
//! A cluster deleted earlier with its etcd backups kept has only them left
//! ([`DeletePlan::BackupsOnly`]); a cluster whose spec cannot be read has only its objects in
//! the store ([`DeletePlan::Unreadable`]: kprov cannot tell which cloud resources or hosts it
//! had).
//!
//! The platform is chosen here from the spec, not through [`super::platform::Platform::open`]:
//! opening an AWS platform reads the whole cloud plan, which what is left of a half-deleted
//! cluster may not give; deleting needs only what the cluster owns.

use std::collections::BTreeMap;

use anyhow::Context;

use super::nodes::{self as ops_nodes, Events, NodeOptions, ResetOutcome};
use crate::cloud::engine::Plan;
use crate::nodes::{self, Target, TargetSource};
use crate::output::plural;
use crate::provision::orchestrate::HostResult;
use crate::repo::{Repo, RepoError};
use crate::spec::{self, CloudProvider, Cluster, Host, ResolvedCluster};
use crate::state::layout::ClusterKeys;
use crate::state::lock::{LockError, LockGuard};

/// What `delete cluster` would delete.
pub(crate) enum DeletePlan {
    /// A cluster whose spec reads.
    Cluster(Box<Teardown>),
    /// A cluster deleted earlier with its etcd backups kept.
    BackupsOnly {
        cluster: String,
        count: usize,
        /// Where the backups are (the store's location of their prefix).
        prefix: String,
    },
    /// A cluster whose spec cannot be read: only its objects in the store can go.
    Unreadable {
        cluster: String,
        /// The objects under its prefix, and what sits at its config key when that is not an
        /// object (`(key, what)`).
        keys: Vec<String>,
        at_config: Option<(String, String)>,
        /// Why its spec cannot be read.
        why: String,
    },
}

/// A readable cluster's teardown.
pub(crate) struct Teardown {
    pub cluster: Cluster,
    /// AWS: the typed model the cloud's deletion is planned from, made once here (the preview
    /// and the apply under the lock both use it); `None` on metal.
    pub model: Option<ResolvedCluster>,
    /// What the preview shows of the machines; `None` in a plan for `--yes` ([`scope`]): the
    /// machines are planned under the lock, after a held lock has been reported.
    pub machines: Option<Machines>,
    /// The objects `--yes` deletes from the store (etcd backups only with `--delete-backups`).
    pub keys: Vec<String>,
    /// How many etcd backup objects the cluster has, and where (`None`: none, or no valid
    /// location to name).
    pub backups: Option<(usize, String)>,
    pub delete_backups: bool,
}

/// The machines a teardown removes, per platform.
pub(crate) enum Machines {
    /// The cloud resources to delete.
    Aws(Plan),
    /// The hosts to reset: the spec's, then those kprov provisioned that the spec dropped.
    Metal {
        hosts: Vec<Host>,
        /// The names among `hosts` that are no longer in the spec.
        dropped: Vec<String>,
    },
}

/// What `delete cluster --yes` did.
pub(crate) enum DeleteReport {
    Cluster {
        machines: MachinesGone,
        /// Objects deleted from the store.
        objects: usize,
    },
    BackupsOnly {
        deleted: usize,
    },
    Unreadable {
        deleted: usize,
    },
}

/// What happened to the machines.
pub(crate) enum MachinesGone {
    Aws {
        deleted: usize,
    },
    /// `warnings`: hosts left alone (never connected to, skipped), said before the outcome.
    Metal {
        warnings: Vec<String>,
        reset: HostsReset,
    },
}

pub(crate) enum HostsReset {
    /// The cluster never claimed a host (and kprov recorded none): none contacted.
    NothingClaimed(String),
    Reset {
        reset: usize,
        of: usize,
    },
}

/// Why `delete cluster` did not delete.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DeleteError {
    /// `delete cluster` of a deleted cluster whose backups are kept, without `--delete-backups`.
    #[error(
        "cluster {cluster} was deleted already; its {} under {prefix} are kept. Pass --delete-backups to delete them.",
        plural(*.count, "etcd backup object")
    )]
    OnlyBackupsLeft {
        cluster: String,
        count: usize,
        prefix: String,
    },
    /// kprov recorded provisioning hosts the reset could not claim: deleting the state would
    /// forget hosts that still run the cluster's kubelet.
    #[error(
        "{why}, yet kprov recorded provisioning {} of {cluster}: refusing to delete its state \
         and forget them; reset them first (or release each later with `kprov release host`)",
        recorded.join(", ")
    )]
    ProvisionedUnclaimed {
        cluster: String,
        why: String,
        recorded: Vec<String>,
    },
    /// Hosts that could not be reset; the state is kept for a retry. `warnings` as in
    /// [`MachinesGone::Metal`].
    #[error(
        "could not reset {} of {cluster}, the cluster's state is kept for a retry (to give up \
         on a host, remove it from the spec with `kprov edit cluster {cluster}`):\n{}",
        plural(failures.len(), "host"),
        failures.join("\n")
    )]
    HostsNotReset {
        cluster: String,
        failures: Vec<String>,
        warnings: Vec<String>,
    },
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

impl From<RepoError> for DeleteError {
    fn from(e: RepoError) -> Self {
        DeleteError::Failed(e.into())
    }
}

/// Whether a cluster that failed to read may be removed without its spec: its objects are
/// there but the spec is not a readable Cluster. A store that could not be reached is not one
/// (deleting on a transient error would lose the spec of a running cluster).
pub(crate) fn removable(e: &RepoError) -> bool {
    matches!(
        e,
        RepoError::Unreadable { .. } | RepoError::Corrupt { .. } | RepoError::Spec(_)
    )
}

/// The hosts kprov recorded as provisioned for `cluster`, and the spec's hosts with those the
/// spec dropped added.
async fn metal_hosts(
    repo: &Repo,
    cluster: &Cluster,
) -> anyhow::Result<(BTreeMap<String, Host>, Cluster, Vec<String>)> {
    let recorded =
        super::host_records::provisioned_hosts(repo.store().as_ref(), cluster.name()).await?;
    let dropped: Vec<Host> = recorded
        .values()
        .filter(|r| !cluster.spec.hosts.iter().any(|h| h.name == r.name))
        .cloned()
        .collect();
    let mut with_dropped = cluster.clone();
    with_dropped.spec.hosts.extend(dropped.iter().cloned());
    Ok((
        recorded,
        with_dropped,
        dropped.into_iter().map(|h| h.name).collect(),
    ))
}

async fn inventory_targets(cluster: &Cluster) -> anyhow::Result<Vec<Target>> {
    Ok(nodes::Inventory {
        hosts: cluster.spec.hosts.clone(),
    }
    .targets()
    .await?)
}

/// Plans the deletion of cluster `name` for the preview. Read-only (the cloud and the store
/// are read; no host is contacted).
pub(crate) async fn plan(
    repo: &Repo,
    name: &str,
    delete_backups: bool,
) -> Result<DeletePlan, DeleteError> {
    plan_with(repo, name, delete_backups, true).await
}

/// What `delete cluster --yes` works on: [`plan`] without the machines, which [`apply`]
/// plans under the lock (the cloud is not asked before the lock is taken).
pub(crate) async fn scope(
    repo: &Repo,
    name: &str,
    delete_backups: bool,
) -> Result<DeletePlan, DeleteError> {
    plan_with(repo, name, delete_backups, false).await
}

async fn plan_with(
    repo: &Repo,
    name: &str,
    delete_backups: bool,
    machines: bool,
) -> Result<DeletePlan, DeleteError> {
    let stored = match repo.get(name).await {
        Ok(s) => s,
        Err(RepoError::BackupsOnly { count, prefix, .. }) => {
            if !delete_backups {
                return Err(DeleteError::OnlyBackupsLeft {
                    cluster: name.to_string(),
                    count,
                    prefix,
                });
            }
            return Ok(DeletePlan::BackupsOnly {
                cluster: name.to_string(),
                count,
                prefix,
            });
        }
        Err(e) if removable(&e) => {
            let keys = repo
                .store()
                .list(&format!("{name}/"))
                .await
                .map_err(anyhow::Error::from)?;
            let config = ClusterKeys::new(name)
                .map_err(anyhow::Error::from)?
                .config();
            let at_config = repo
                .store()
                .obstruction(&config)
                .await
                .map_err(anyhow::Error::from)?
                .map(|what| (config, what));
            return Ok(DeletePlan::Unreadable {
                cluster: name.to_string(),
                keys,
                at_config,
                why: e.to_string(),
            });
        }
        Err(e) => return Err(e.into()),
    };
    let keys = repo
        .store()
        .list(&format!("{name}/"))
        .await
        .map_err(anyhow::Error::from)?;
    let backup_keys = repo.backup_keys(name).await?;
    let cluster = spec::defaults::complete_cluster(&stored.cluster.value);
    // Not validated: a cluster whose spec no longer passes validation can still be deleted;
    // only what the cloud model's types need is checked.
    let model = match cluster.spec.cloud_provider {
        CloudProvider::Aws => Some(
            spec::resolve::model(&stored.cluster.value, &stored.group_values())
                .context("reading the cluster's spec for its cloud resources")?,
        ),
        CloudProvider::Metal => {
            // The teardown renders its reset scripts from this model under the lock
            // ([`reset_hosts`]); built here too so that the preview refuses what `--yes` would.
            reset_model(&cluster)?;
            None
        }
    };
    let machines = match (machines, &model) {
        (false, _) => None,
        (true, Some(model)) => Some(Machines::Aws(super::aws::delete_plan(model).await?)),
        (true, None) => {
            let (_, with_dropped, dropped) = metal_hosts(repo, &cluster).await?;
            Some(Machines::Metal {
                hosts: with_dropped.spec.hosts,
                dropped,
            })
        }
    };
    let backups = match backup_keys.len() {
        0 => None,
        n => ClusterKeys::new(name)
            .ok()
            .map(|k| (n, repo.store().key_location(&k.backups_prefix()))),
    };
    Ok(DeletePlan::Cluster(Box::new(Teardown {
        keys: keys
            .into_iter()
            .filter(|k| delete_backups || !backup_keys.contains(k))
            .collect(),
        cluster,
        model,
        machines,
        backups,
        delete_backups,
    })))
}

impl DeletePlan {
    pub(crate) fn cluster(&self) -> &str {
        match self {
            DeletePlan::Cluster(t) => t.cluster.name(),
            DeletePlan::BackupsOnly { cluster, .. } | DeletePlan::Unreadable { cluster, .. } => {
                cluster
            }
        }
    }

    /// The command the lock names while `--yes` runs.
    pub(crate) fn lock_command(&self) -> &'static str {
        match self {
            DeletePlan::BackupsOnly { .. } => "delete cluster --delete-backups",
            _ => "delete cluster",
        }
    }
}

/// `delete cluster --yes`: [`apply`] under one lock for the whole teardown (so no update runs
/// against a half-deleted cluster), cut by the first signal of `ints` (caught before the lock
/// is taken): the wait in flight (the cloud's deletions, a host's reset) ends, the lock is
/// released and `Ok(Err(caught))` returned; deleting again resumes.
pub(crate) async fn apply_interruptible(
    session: &super::session::Session,
    plan: &DeletePlan,
    ints: &super::interrupt::Interrupts,
    concurrency: usize,
    events_for: &dyn Fn(&[Target]) -> Events,
) -> Result<Result<DeleteReport, super::interrupt::Caught>, DeleteError> {
    let repo = session.repo();
    session
        .with_lock(plan.cluster(), plan.lock_command(), async |guard| {
            ints.or_try(apply(&repo, plan, guard, concurrency, events_for))
                .await
        })
        .await
}

/// Deletes what `plan` ([`scope`]) says under `guard` (the cluster's lock, taken by the
/// caller); the machines are planned again here. Metal's hosts report their progress through
/// the events `events_for` gives for the hosts to reset; `concurrency` bounds the hosts reset
/// at once.
pub(crate) async fn apply(
    repo: &Repo,
    plan: &DeletePlan,
    guard: &LockGuard,
    concurrency: usize,
    events_for: &dyn Fn(&[Target]) -> Events,
) -> Result<DeleteReport, DeleteError> {
    guard.check()?;
    let name = plan.cluster();
    match plan {
        DeletePlan::BackupsOnly { .. } => Ok(DeleteReport::BackupsOnly {
            deleted: repo.delete_backups(name).await?,
        }),
        DeletePlan::Unreadable { .. } => Ok(DeleteReport::Unreadable {
            deleted: repo.delete_unreadable(name).await?.len(),
        }),
        DeletePlan::Cluster(t) => {
            let machines = match &t.model {
                Some(model) => MachinesGone::Aws {
                    deleted: super::aws::delete_apply(model).await?,
                },
                None => reset_hosts(repo, &t.cluster, concurrency, events_for).await?,
            };
            guard.check()?;
            let objects = repo.delete_cluster(name, t.delete_backups).await?;
            Ok(DeleteReport::Cluster { machines, objects })
        }
    }
}

/// The typed model metal's reset scripts are rendered from: not validated (a cluster whose
/// spec no longer passes validation can still be deleted), only typed.
fn reset_model(cluster: &Cluster) -> anyhow::Result<ResolvedCluster> {
    spec::resolve::model(cluster, &[]).context("reading the cluster's spec for its reset scripts")
}

/// Metal's teardown (see the module docs); the provisioned hosts are read again under the
/// lock.
async fn reset_hosts(
    repo: &Repo,
    cluster: &Cluster,
    concurrency: usize,
    events_for: &dyn Fn(&[Target]) -> Events,
) -> Result<MachinesGone, DeleteError> {
    let name = cluster.name();
    let (recorded, cluster, _) = metal_hosts(repo, cluster).await?;
    let targets = inventory_targets(&cluster).await?;
    // The reset scripts are rendered from the typed model of the spec with the dropped hosts
    // added: the delete's one resolve on metal, made here because only the teardown renders
    // (not validated, as the preview's cloud model is not: a cluster whose spec no longer
    // passes validation can still be deleted).
    let cluster = reset_model(&cluster)?;
    let events = &events_for(&targets);
    let options = NodeOptions {
        accept_new_host_keys: false,
        concurrency,
        cloud_api: None,
    };
    let outcome =
        ops_nodes::reset(repo.store().clone(), &cluster, &targets, &options, events).await?;
    let report = match outcome {
        ResetOutcome::NothingClaimed(why) if !recorded.is_empty() => {
            return Err(DeleteError::ProvisionedUnclaimed {
                cluster: name.to_string(),
                why,
                recorded: recorded.keys().cloned().collect(),
            });
        }
        ResetOutcome::NothingClaimed(why) => {
            return Ok(MachinesGone::Metal {
                warnings: Vec::new(),
                reset: HostsReset::NothingClaimed(why),
            });
        }
        ResetOutcome::Reset(report) => report,
    };
    let mut failures = Vec::new();
    let mut warnings = Vec::new();
    for h in &report.hosts {
        match &h.result {
            HostResult::Failed {
                unknown_host_key: true,
                ..
            } if recorded.contains_key(&h.host) => failures.push(format!(
                "{}: kprov provisioned it but its host key is no longer recorded (forgotten?): \
                 not reset; record its key again before deleting the cluster",
                h.host
            )),
            HostResult::Failed {
                unknown_host_key: true,
                ..
            } => warnings.push(format!(
                "{}: not reset: kprov never connected to it (no recorded host key)",
                h.host
            )),
            HostResult::Failed { error, .. } => failures.push(error.clone()),
            HostResult::Skipped { reason } | HostResult::PendingRoll { reason } => {
                warnings.push(format!("{}: {reason}", h.host))
            }
            HostResult::Ok => {}
        }
    }
    if !failures.is_empty() {
        return Err(DeleteError::HostsNotReset {
            cluster: name.to_string(),
            failures,
            warnings,
        });
    }
    let reset = report
        .hosts
        .iter()
        .filter(|h| h.result == HostResult::Ok)
        .count();
    Ok(MachinesGone::Metal {
        warnings,
        reset: HostsReset::Reset {
            reset,
            of: report.hosts.len(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::file::FileStore;
    use crate::state::{Precondition, StateStore};
    use bytes::Bytes;
    use std::sync::Arc;

    async fn repo_with(keys: &[&str]) -> (tempfile::TempDir, Repo) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn StateStore> = Arc::new(FileStore::new(dir.path()).unwrap());
        for k in keys {
            store
                .put(k, Bytes::from_static(b"x"), Precondition::None)
                .await
                .unwrap();
        }
        (dir, Repo::new(store))
    }

    #[tokio::test]
    async fn kept_backups_of_a_deleted_cluster_are_deleted_only_when_asked() {
        let (_dir, repo) = repo_with(&[
            "c1.example.com/backups/etcd/a.db",
            "c1.example.com/backups/etcd/a.json",
        ])
        .await;
        let refused = plan(&repo, "c1.example.com", false).await;
        match refused {
            Err(e @ DeleteError::OnlyBackupsLeft { count: 2, .. }) => {
                assert!(e.to_string().contains("Pass --delete-backups"), "{e}")
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a cluster with only backups left planned a teardown"),
        }
        let p = plan(&repo, "c1.example.com", true).await.unwrap();
        assert!(
            matches!(p, DeletePlan::BackupsOnly { count: 2, .. }),
            "not a backups-only plan"
        );
        assert_eq!(p.lock_command(), "delete cluster --delete-backups");
    }

    #[tokio::test]
    async fn a_cluster_whose_spec_does_not_read_plans_only_its_store_objects() {
        let (_dir, repo) = repo_with(&[
            "c2.example.com/config",
            "c2.example.com/instancegroup/nodes",
        ])
        .await;
        match plan(&repo, "c2.example.com", false).await.unwrap() {
            DeletePlan::Unreadable { keys, why, .. } => {
                assert!(
                    keys.contains(&"c2.example.com/config".to_string()),
                    "{keys:?}"
                );
                assert!(!why.is_empty());
            }
            _ => panic!("an unreadable spec planned more than its objects"),
        }
    }

    #[tokio::test]
    async fn a_metal_spec_its_reset_scripts_cannot_read_is_refused_by_the_preview_too() {
        let (_dir, repo) = repo_with(&[]).await;
        let text = "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata: {name: c3.example.com}\n\
                    spec: {cloudProvider: metal, kubernetesVersion: 1.36.4, \
                    networking: {podCIDR: not-a-cidr}}\n";
        repo.store()
            .put(
                "c3.example.com/config",
                Bytes::from(text),
                Precondition::None,
            )
            .await
            .unwrap();
        for e in [
            plan(&repo, "c3.example.com", false).await.err(),
            scope(&repo, "c3.example.com", false).await.err(),
        ] {
            let e = format!("{:#}", e.expect("a plan of an unreadable model"));
            assert!(
                e.contains("reset scripts") && e.contains("not-a-cidr"),
                "{e}"
            );
        }
    }

    #[tokio::test]
    async fn a_store_that_holds_no_such_cluster_is_an_error_not_a_plan() {
        let (_dir, repo) = repo_with(&[]).await;
        assert!(matches!(
            plan(&repo, "none.example.com", false).await,
            Err(DeleteError::Failed(_))
        ));
    }
}
