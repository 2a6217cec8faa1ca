//! `delete damaged`: the one way out of records that fail the checks on read.
//!
//! Every record kprov reads back from the store (backups, the rolling-update journal, the
//! records of provisioned hosts, the cluster's known host keys) is parsed with the rules kprov
//! writes it by; one that fails is reported as damaged, naming its key, and never used. The
//! reports name `kprov delete damaged NAME`, which lists them all ([`find`]) and with `--yes`
//! removes them ([`remove`], under the caller's cluster lock): each object by a delete on the
//! version that was checked, and from the known host keys only the damaged lines. (A damaged
//! lock has its own way out, `kprov lock break`, since it stops every command from taking the
//! lock; an unreadable cluster spec has `delete cluster`.)

use bytes::Bytes;

use crate::nodes::journal::{JOURNAL_ENTRY, Journal};
use crate::output::untrusted;
use crate::state::layout::ClusterKeys;
use crate::state::{Precondition, StateStore, Version};

/// One record that failed its checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Damaged {
    /// The store key (for `key_location`).
    pub key: String,
    /// What kind of record it is ("backup record", "rolling-update journal", ...).
    pub what: &'static str,
    /// Why, with stored values quoted only escaped.
    pub reason: String,
    /// The version that was checked: the removal deletes only that.
    pub version: Version,
    /// The known host keys: only these (1-based) lines are damaged; empty for an object that
    /// is damaged as a whole.
    pub lines: Vec<usize>,
}

/// Every damaged record of `cluster`, in key order.
pub(crate) async fn find(store: &dyn StateStore, cluster: &str) -> anyhow::Result<Vec<Damaged>> {
    let keys = ClusterKeys::new(cluster)?;
    let mut out = Vec::new();
    // Backups: the same checks `get backups` and `restore etcd` apply.
    let backups = format!("{}backups/etcd/", keys.prefix());
    for key in store.list(&backups).await? {
        if !key.ends_with(".json") {
            continue;
        }
        if let Some(o) = store.get(&key).await?
            && let Err(reason) = super::etcd::check_record(&backups, &key, &o.data)
        {
            out.push(Damaged {
                key,
                what: "backup record",
                reason,
                version: o.version,
                lines: Vec::new(),
            });
        }
    }
    let journal = keys.journal(JOURNAL_ENTRY)?;
    if let Some(o) = store.get(&journal).await?
        && let Err(reason) = Journal::parse(&o.data, cluster)
    {
        out.push(Damaged {
            key: journal,
            what: "rolling-update journal",
            reason,
            version: o.version,
            lines: Vec::new(),
        });
    }
    let hosts = keys.hosts_prefix();
    for key in store.list(&hosts).await? {
        let name = key.strip_prefix(&hosts).unwrap_or(&key).to_string();
        if let Some(o) = store.get(&key).await?
            && let Err(reason) = super::host_records::check_host_record(&name, &o.data)
        {
            out.push(Damaged {
                key,
                what: "record of a provisioned host",
                reason,
                version: o.version,
                lines: Vec::new(),
            });
        }
    }
    let known = keys.known_hosts();
    if let Some(o) = store.get(&known).await? {
        let (_, damaged) = crate::ssh::hostkeys::parse_checked(&o.data);
        if !damaged.is_empty() {
            let reason = damaged
                .iter()
                .map(|(n, r)| match n {
                    0 => r.clone(),
                    n => format!("line {n}: {r}"),
                })
                .collect::<Vec<_>>()
                .join("; ");
            out.push(Damaged {
                key: known,
                what: "known host keys",
                reason,
                version: o.version,
                lines: damaged.iter().map(|(n, _)| *n).filter(|n| *n > 0).collect(),
            });
        }
    }
    Ok(out)
}

/// Removes `found` (call under the cluster lock): an object damaged as a whole is deleted on
/// the version that was checked (a record rewritten since is left alone, with a conflict
/// error); from the known host keys only the damaged lines go, the good keys stay.
pub(crate) async fn remove(store: &dyn StateStore, found: &[Damaged]) -> anyhow::Result<()> {
    for d in found {
        if d.lines.is_empty() {
            store
                .delete(&d.key, Precondition::Matches(d.version.clone()))
                .await?;
            continue;
        }
        let Some(o) = store.get(&d.key).await? else {
            continue;
        };
        if o.version != d.version {
            anyhow::bail!(
                "{} changed since it was checked; run `kprov delete damaged` again",
                store.key_location(&d.key)
            );
        }
        let kept: Vec<&[u8]> = o
            .data
            .split(|b| *b == b'\n')
            .enumerate()
            .filter(|(i, l)| !l.is_empty() && !d.lines.contains(&(i + 1)))
            .map(|(_, l)| l)
            .collect();
        let mut text = kept.join(&b'\n');
        if !text.is_empty() {
            text.push(b'\n');
        }
        store
            .put(&d.key, Bytes::from(text), Precondition::Matches(o.version))
            .await?;
    }
    Ok(())
}

/// One line per damaged record, for previews and reports: `KEY (WHAT): REASON`.
pub(crate) fn describe(store: &dyn StateStore, d: &Damaged) -> String {
    format!(
        "{} ({}): {}",
        untrusted(&store.key_location(&d.key)),
        d.what,
        untrusted(&d.reason)
    )
}

/// What `delete damaged NAME` would remove: the records found now, each described.
pub(crate) struct DamagedPlan {
    pub cluster: String,
    pub found: Vec<Damaged>,
    /// [`describe`] of each, in the same order.
    pub lines: Vec<String>,
}

/// Why `delete damaged` did not list or remove the records.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DamagedError {
    /// The cluster's lock is held by another command, or was lost.
    #[error(transparent)]
    Lock(#[from] crate::state::lock::LockError),
    /// Reading or removing a record failed (the error names its key).
    #[error(transparent)]
    Store(anyhow::Error),
}

/// Lists `cluster`'s damaged records. Read-only.
pub(crate) async fn plan(
    store: &dyn StateStore,
    cluster: &str,
) -> Result<DamagedPlan, DamagedError> {
    let found = find(store, cluster).await.map_err(DamagedError::Store)?;
    let lines = found.iter().map(|d| describe(store, d)).collect();
    Ok(DamagedPlan {
        cluster: cluster.to_string(),
        found,
        lines,
    })
}

/// Removes what is damaged now (found again under `guard`, the cluster's lock: only what is
/// damaged at the version checked); returns each removed record described.
pub(crate) async fn apply(
    store: &dyn StateStore,
    plan: &DamagedPlan,
    guard: &crate::state::lock::LockGuard,
) -> Result<Vec<String>, DamagedError> {
    guard.check()?;
    let found = find(store, &plan.cluster)
        .await
        .map_err(DamagedError::Store)?;
    remove(store, &found).await.map_err(DamagedError::Store)?;
    Ok(found.iter().map(|d| describe(store, d)).collect())
}
