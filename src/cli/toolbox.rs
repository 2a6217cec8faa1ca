//! `create sshpublickey` (and kops's `create secret sshpublickey`) and `toolbox dump`: thin
//! commands over `ops::sshkey` and `ops::toolbox`.

use std::path::Path;

use super::commands::{Ctx, locked};
use super::exit;
use crate::ops::sshkey::{self, KeyChange, PublicKey};
use crate::output::Format;

pub(super) async fn create_sshpublickey(ctx: &Ctx, name: &str, file: &Path) -> anyhow::Result<i32> {
    let source = file.display().to_string();
    // A public key line is short: anything larger is not one (and is never read whole).
    let text = crate::bounded::read_file(file, 16 * 1024)
        .map_err(|e| anyhow::anyhow!("reading {source}: {e}"))?;
    let text = String::from_utf8(text)
        .map_err(|_| anyhow::anyhow!("{source} is not an OpenSSH public key (not UTF-8 text)"))?;
    let key = PublicKey::parse(&source, &text).map_err(anyhow::Error::msg)?;
    let repo = ctx.repo().await?;
    let change = locked(repo.store(), name, "create sshpublickey", async {
        sshkey::set(&repo, name, &key).await
    })
    .await?;
    match change {
        KeyChange::Unchanged => ctx.printer.success(&format!(
            "{name} already has this SSH public key ({}).",
            key.fingerprint
        )),
        KeyChange::Stored { replaced } => {
            ctx.printer.success(&format!(
                "Stored the SSH public key of {name} ({}){}.",
                key.fingerprint,
                replaced
                    .map(|r| format!(", replacing {r}"))
                    .unwrap_or_default()
            ));
            ctx.printer.status(&format!(
                "AWS: `kprov update cluster {name} --yes` writes it into the key pair and launch templates; running instances get it when `kprov rolling-update cluster {name} --yes` replaces them."
            ));
        }
    }
    Ok(exit::OK)
}

pub(super) async fn dump(
    ctx: &Ctx,
    name: &str,
    kubeconfig: Option<&Path>,
    with_api: bool,
) -> anyhow::Result<i32> {
    let (cluster, groups) = super::addons::resolved(ctx, name).await?;
    let repo = ctx.repo().await?;
    let d = crate::ops::toolbox::dump(repo.store(), &cluster, &groups, kubeconfig, with_api).await;
    for (part, e) in [
        ("cloud resources", &d.resources_error),
        ("machines", &d.machines_error),
        ("nodes", &d.nodes_error),
    ] {
        if let Some(e) = e {
            ctx.printer.warn(&format!(
                "{part} of {name} not read: {}",
                crate::output::untrusted(e)
            ));
        }
    }
    match ctx.printer.format() {
        Format::Json => ctx.printer.data(&serde_json::to_string_pretty(&d)?),
        _ => ctx.printer.data(&crate::output::to_yaml(&d)?),
    }
    Ok(exit::OK)
}
