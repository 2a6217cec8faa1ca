//! `backup etcd`, `get backups`, `restore etcd`: thin commands over `ops::etcd_backup` on
//! every platform (the machines from the platform seam, strict host keys), the lock through
//! `Session::with_lock`.

use super::ctx::Ctx;
use super::exit;
use crate::ops::etcd_backup::{self as ops, EtcdBackups, EtcdError};
use crate::ops::platform::Reach;
use crate::ops::session::Session;
use crate::views::etcd as view;

/// The stored cluster's etcd commands, and the session they take the lock through.
async fn open(ctx: &Ctx, name: &str, reach: Reach) -> anyhow::Result<(Session, EtcdBackups)> {
    let resolved = ctx.session().await?.resolve(name).await?;
    let session = Session::new(ctx.repo().await?.store().clone());
    let etcd = ops::open(session.store().clone(), &resolved, reach)
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

/// `kprov backup etcd NAME`.
pub(super) async fn backup(ctx: &Ctx, name: &str, reach: Reach) -> anyhow::Result<i32> {
    let (session, etcd) = open(ctx, name, reach).await?;
    let record = session
        .with_lock(name, "backup etcd", async |guard| etcd.backup(guard).await)
        .await
        .map_err(failed)?;
    view::backed_up(&ctx.printer, name, &record, &etcd.location(&record.key))?;
    Ok(exit::OK)
}

/// `kprov get backups NAME`.
pub(super) async fn list(ctx: &Ctx, name: &str) -> anyhow::Result<i32> {
    let store = ctx.repo().await?.store().clone();
    let backups = ops::backups(&store, name).await.map_err(failed)?;
    view::backups(&ctx.printer, name, &backups)?;
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
    let record = &restore.plan.backup;
    view::restore_plan(&ctx.printer, name, &restore);
    if !yes {
        view::restore_pending(&ctx.printer, record);
        return Ok(exit::OK);
    }
    session
        .with_lock(name, "restore etcd", async |guard| {
            etcd.restore(&restore, guard).await
        })
        .await
        .map_err(failed)?;
    view::restored(&ctx.printer, name, record);
    Ok(exit::OK)
}
