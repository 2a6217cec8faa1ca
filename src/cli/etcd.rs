//! `backup etcd`, `get backups`, `restore etcd`: thin commands over `ops::etcd` on every
//! platform: the machines come from `ops::platform` (metal's hosts, AWS's instances), strict
//! host keys, the cluster lock.

use std::sync::Arc;

use super::commands::{Ctx, locked};
use super::exit;
use crate::nodes::Target;
use crate::ops::etcd::{self as ops, BackupRecord};
use crate::ops::nodes::no_events;
use crate::ops::platform::{Platform, Reach};
use crate::output::{Table, untrusted};
use crate::spec::Cluster;
use crate::state::StateStore;

/// Hosts worked on at once by a restore (every member restores at the same time anyway).
const CONCURRENCY: usize = 20;

/// The stored cluster and its platform's machines.
async fn open(
    ctx: &Ctx,
    name: &str,
    reach: Reach,
) -> anyhow::Result<(Arc<dyn StateStore>, Cluster, Platform, Vec<Target>)> {
    let repo = ctx.repo().await?;
    let stored = repo.get(name).await?;
    // Resolved as every other command resolves a stored cluster (`addons::resolved`):
    // completed and validated, so a stored spec that is no longer valid is refused with its
    // located problems before any host is contacted.
    let (cluster, groups) = stored.resolve(&repo.location())?;
    let store = repo.store().clone();
    let platform = Platform::open(&store, &cluster, &groups, reach).await?;
    let targets = platform.targets().await?;
    if platform.etcd_hosts(&targets).is_empty() {
        anyhow::bail!(
            "{name} has no etcd member running (no control plane{}); nothing to back up or restore",
            if matches!(platform, Platform::Aws(_)) {
                " instance found: `kprov get instances` lists them"
            } else {
                ""
            }
        );
    }
    Ok((store, cluster, platform, targets))
}

fn backups_table(records: &[BackupRecord], damaged: &[ops::DamagedRecord]) -> Table {
    let mut t = Table::new(["SNAPSHOT", "TAKEN", "MEMBER", "ETCD", "SIZE", "SHA256"]);
    // Checked on read (`BackupRecord::check`), and escaped all the same: the table is the
    // one place these values meet a terminal.
    for r in records {
        t.row([
            untrusted(&r.id).to_string(),
            untrusted(&r.taken_at).to_string(),
            untrusted(&r.host).to_string(),
            untrusted(&r.etcd).to_string(),
            r.size.to_string(),
            untrusted(&r.sha256).to_string(),
        ]);
    }
    for d in damaged {
        let name = d.key.rsplit('/').next().unwrap_or(&d.key);
        t.row([
            untrusted(name.trim_end_matches(".json")).to_string(),
            "DAMAGED".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
        ]);
    }
    t
}

/// `kprov backup etcd NAME`.
pub async fn backup(ctx: &Ctx, name: &str, reach: Reach) -> anyhow::Result<i32> {
    let (store, cluster, platform, targets) = open(ctx, name, reach).await?;
    let record = locked(&store, cluster.name(), "backup etcd", async {
        let fleet = platform.fleet(&store, &targets, CONCURRENCY, &no_events())?;
        let r = ops::backup(
            store.as_ref(),
            &cluster,
            &targets,
            &fleet,
            chrono::Utc::now(),
        )
        .await;
        fleet.close().await;
        r
    })
    .await?;
    ctx.printer.value(&record, || {
        backups_table(std::slice::from_ref(&record), &[])
    })?;
    ctx.printer.success(&format!(
        "Backed up etcd of {name} from {} to {} ({} bytes, sha256 {}).",
        record.host,
        store.key_location(&record.key),
        record.size,
        record.sha256
    ));
    Ok(exit::OK)
}

/// `kprov get backups NAME`.
pub async fn list(ctx: &Ctx, name: &str) -> anyhow::Result<i32> {
    let repo = ctx.repo().await?;
    // The cluster must exist, or have been deleted with its backups kept: a typo is an
    // error, not an empty list.
    match repo.get(name).await {
        Ok(_) | Err(crate::repo::RepoError::BackupsOnly { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let backups = ops::list(repo.store().as_ref(), name).await?;
    ctx.printer.value(&backups.records, || {
        backups_table(&backups.records, &backups.damaged)
    })?;
    for d in &backups.damaged {
        ctx.printer.warn(&format!(
            "backup record {} is damaged: {}; it is not a backup kprov can use and `restore \
             etcd` refuses it. If you did not put it there, find out who can write the state \
             store; then `kprov delete damaged {name} --yes` removes it",
            untrusted(&d.key),
            untrusted(&d.reason)
        ));
    }
    Ok(exit::OK)
}

/// `kprov restore etcd NAME --from SNAPSHOT [--yes]`.
pub async fn restore(
    ctx: &Ctx,
    name: &str,
    from: &str,
    yes: bool,
    reach: Reach,
) -> anyhow::Result<i32> {
    let (store, cluster, platform, targets) = open(ctx, name, reach).await?;
    // The checksum is verified before anything else, preview included.
    let (record, snapshot) = ops::load(store.as_ref(), name, from).await?;
    let plan = ops::restore_plan(&cluster, &targets, &record);
    let mut t = Table::new(["HOST", "STEPS"]);
    for (h, what) in &plan.hosts {
        t.row([h.clone(), what.join("; ")]);
    }
    ctx.printer.data(&format!(
        "Restore etcd of {name} ({} etcd) from snapshot {} taken {} on {} ({} bytes, sha256 {} verified):\n{}",
        plan.etcd,
        untrusted(&record.id),
        untrusted(&record.taken_at),
        untrusted(&record.host),
        record.size,
        untrusted(&record.sha256),
        t.render()
    ));
    if !yes {
        ctx.printer.status(&format!(
            "Everything written to the cluster after {} is lost. Must specify --yes to restore.",
            untrusted(&record.taken_at)
        ));
        return Ok(exit::OK);
    }
    locked(&store, cluster.name(), "restore etcd", async {
        let fleet = platform.fleet(&store, &targets, CONCURRENCY, &no_events())?;
        let r = ops::restore(&cluster, &targets, &fleet, &snapshot).await;
        fleet.close().await;
        r
    })
    .await?;
    ctx.printer.success(&format!(
        "Restored etcd of {name} from snapshot {}: every member healthy, API servers started.",
        untrusted(&record.id)
    ));
    Ok(exit::OK)
}
