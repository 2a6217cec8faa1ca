//! `create sshpublickey` (and kops's `create secret sshpublickey`) and `toolbox dump`: thin
//! commands over `ops::sshkey` and `ops::toolbox`.

use std::path::Path;

use super::ctx::{Ctx, locked};
use super::exit;
use crate::ops::sshkey::{self, PublicKey};
use crate::views::toolbox as view;

pub(super) async fn create_sshpublickey(ctx: &Ctx, name: &str, file: &Path) -> anyhow::Result<i32> {
    let key = PublicKey::read(file)?;
    let repo = ctx.repo().await?;
    let change = locked(repo.store(), name, "create sshpublickey", async {
        sshkey::set(&repo, name, &key).await
    })
    .await?;
    view::key_stored(&ctx.printer, name, &key, &change);
    Ok(exit::OK)
}

pub(super) async fn dump(
    ctx: &Ctx,
    name: &str,
    kubeconfig: Option<&Path>,
    with_api: bool,
) -> anyhow::Result<i32> {
    let cluster = super::addons::resolved(ctx, name).await?;
    let repo = ctx.repo().await?;
    let d = crate::ops::toolbox::dump(repo.store(), &cluster, kubeconfig, with_api).await;
    view::dump(&ctx.printer, name, &d)?;
    Ok(exit::OK)
}
