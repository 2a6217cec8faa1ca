//! `backup etcd`, `get backups`, `restore etcd`: thin commands over `ops::etcd_backup` on
//! every platform (the machines from the platform seam, strict host keys), the lock through
//! `Session::with_lock`.

use super::commands::Ctx;
use super::exit;
use crate::ops::etcd::{BackupRecord, DamagedRecord};
use crate::ops::etcd_backup::{self as ops, EtcdBackups, EtcdError};
use crate::ops::platform::Reach;
use crate::ops::session::Session;
use crate::output::{Table, untrusted};

/// The stored cluster's etcd commands, and the session they take the lock through.
async fn open(ctx: &Ctx, name: &str, reach: Reach) -> anyhow::Result<(Session, EtcdBackups)> {
    let (cluster, groups) = super::addons::resolved(ctx, name).await?;
    let session = Session::new(ctx.repo().await?.store().clone());
    let etcd = ops::open(session.store().clone(), &cluster, &groups, reach)
        .await
        .map_err(failed)?;
    Ok((session, etcd))
}

/// An ops error as the command reports it: its cause kept as it is, so that the exit code
/// (`exit_code_of`: 4 for a held lock) reads it.
fn failed(e: EtcdError) -> anyhow::Error {
    match e {
        EtcdError::Lock(e) => e.into(),
        EtcdError::Other(e) => e,
        e => e.into(),
    }
}

fn backups_table(records: &[BackupRecord], damaged: &[DamagedRecord]) -> Table {
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
pub(super) async fn backup(ctx: &Ctx, name: &str, reach: Reach) -> anyhow::Result<i32> {
    let (session, etcd) = open(ctx, name, reach).await?;
    let record = session
        .with_lock(name, "backup etcd", async |guard| etcd.backup(guard).await)
        .await
        .map_err(failed)?;
    ctx.printer.value(&record, || {
        backups_table(std::slice::from_ref(&record), &[])
    })?;
    ctx.printer.success(&format!(
        "Backed up etcd of {name} from {} to {} ({} bytes, sha256 {}).",
        record.host,
        etcd.location(&record.key),
        record.size,
        record.sha256
    ));
    Ok(exit::OK)
}

/// `kprov get backups NAME`.
pub(super) async fn list(ctx: &Ctx, name: &str) -> anyhow::Result<i32> {
    let store = ctx.repo().await?.store().clone();
    let backups = ops::backups(&store, name).await.map_err(failed)?;
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
pub(super) async fn restore(
    ctx: &Ctx,
    name: &str,
    from: &str,
    yes: bool,
    reach: Reach,
) -> anyhow::Result<i32> {
    let (session, etcd) = open(ctx, name, reach).await?;
    let restore = etcd.restore_plan(from).await.map_err(failed)?;
    let (plan, record) = (&restore.plan, &restore.plan.backup);
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
    session
        .with_lock(name, "restore etcd", async |guard| {
            etcd.restore(&restore, guard).await
        })
        .await
        .map_err(failed)?;
    ctx.printer.success(&format!(
        "Restored etcd of {name} from snapshot {}: every member healthy, API servers started.",
        untrusted(&record.id)
    ));
    Ok(exit::OK)
}
