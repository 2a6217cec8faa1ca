//! `get assets` and `create bundle`: the cluster's artifact list, and all of it in one file.

use super::CreateBundleArgs;
use super::addons::resolved;
use super::commands::Ctx;
use super::exit;
use crate::bundle::artifacts;
use crate::bundle::fetch::{self, RegistryMirrors};
use crate::output::Format;
use crate::spec::assets::Arch;

pub(super) async fn get_assets(ctx: &Ctx, name: &str) -> anyhow::Result<i32> {
    let (cluster, _) = resolved(ctx, name).await?;
    let list = artifacts::artifacts(&cluster)?;
    match ctx.printer.format() {
        Format::Json => ctx.printer.data(&serde_json::to_string_pretty(&list)?),
        Format::Yaml => ctx.printer.data(&crate::output::to_yaml(&list)?),
        Format::Table => ctx.printer.data(&artifacts::table(&list)),
    }
    Ok(exit::OK)
}

pub(super) async fn create(ctx: &Ctx, a: &CreateBundleArgs) -> anyhow::Result<i32> {
    let (cluster, _) = resolved(ctx, &a.name).await?;
    let list = artifacts::artifacts(&cluster)?;
    if let Some(i) = list.images.iter().find(|i| {
        let last = i.reference.rsplit('/').next().unwrap_or_default();
        !last.contains(':') && !i.reference.contains('@')
    }) {
        anyhow::bail!(
            "image {} ({}): kprov pins no tag for it with Kubernetes {}; nothing fetched",
            i.reference,
            i.used_by,
            list.kubernetes_version
        );
    }
    let arch = match a.arch.as_str() {
        "arm64" => Arch::Arm64,
        _ => Arch::Amd64,
    };
    let mut mirrors = RegistryMirrors::default();
    for m in &a.registry_mirror {
        mirrors.add(m).map_err(anyhow::Error::msg)?;
    }
    let count = list.binaries_for(arch).count() + list.images.len() + list.archives.len();
    let progress = ctx
        .printer
        .progress(count as u64, &format!("bundle {}", a.output.display()));
    let printer = &ctx.printer;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let line = move |s: &str| {
        let _ = tx.send(s.to_string());
    };
    let start = std::time::Instant::now();
    let options = fetch::Options {
        arch,
        mirrors,
        progress: &line,
    };
    let made = {
        let fut = fetch::make(&list, &a.output, &options);
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
    ctx.printer.status(&format!(
        "Wrote bundle {} for {} ({}, Kubernetes {}): {} entries, {} bytes, in {:.1}s.",
        a.output.display(),
        cluster.name(),
        made.manifest.arch,
        made.manifest.kubernetes_version,
        made.manifest.entries.len(),
        made.bytes,
        start.elapsed().as_secs_f64()
    ));
    Ok(exit::OK)
}
