//! `get assets` and `create bundle`: the cluster's artifact list, and all of it in one file
//! (`ops::bundle`), a progress step per artifact.

use super::CreateBundleArgs;
use super::addons::resolved;
use super::ctx::Ctx;
use super::exit;
use crate::ops::bundle;
use crate::views::bundle as view;

pub(super) async fn get_assets(ctx: &Ctx, name: &str) -> anyhow::Result<i32> {
    let resolved = resolved(ctx, name).await?;
    view::assets(&ctx.printer, &bundle::assets(&resolved.completed)?)?;
    Ok(exit::OK)
}

pub(super) async fn create(ctx: &Ctx, a: &CreateBundleArgs) -> anyhow::Result<i32> {
    let resolved = resolved(ctx, &a.name).await?;
    let plan = bundle::plan(&resolved.completed, &a.arch, &a.registry_mirror)?;
    let label = format!("bundle {}", a.output.display());
    let progress = ctx.printer.progress(plan.count() as u64, &label);
    let printer = &ctx.printer;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let line = move |s: &str| {
        let _ = tx.send(s.to_string());
    };
    let start = std::time::Instant::now();
    let made = {
        let fut = bundle::make(plan, &a.output, &line);
        tokio::pin!(fut);
        loop {
            tokio::select! {
                r = &mut fut => break r,
                _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {
                    while let Ok(l) = rx.try_recv() { progress.inc(printer, &l); }
                }
            }
        }
    };
    while let Ok(l) = rx.try_recv() {
        progress.inc(printer, &l);
    }
    let made = made?;
    progress.finish();
    view::made(printer, &a.output, &resolved.name, &made, start.elapsed());
    Ok(exit::OK)
}
