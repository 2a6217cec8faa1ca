//! `kprov edit cluster|ig`: edit a stored object in $EDITOR, like `kubectl edit`. The editor
//! is run here; what is checked, saved and kept is `ops::edit`.

use anyhow::{Context, bail};

use super::ctx::Ctx;
use super::exit;
use crate::ops::edit::{self as ops, Cancelled, Review};

fn editor() -> String {
    std::env::var("KPROV_EDITOR")
        .or_else(|_| std::env::var("VISUAL"))
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".into())
}

fn run_editor(path: &std::path::Path) -> anyhow::Result<()> {
    let ed = editor();
    // Editors are often given with arguments ("code --wait"): run through the shell like git.
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{ed} \"$1\""))
        .arg("kprov-edit")
        .arg(path)
        .status()
        .with_context(|| format!("cannot start editor {ed:?}"))?;
    if !status.success() {
        bail!("editor {ed:?} exited with {status}");
    }
    Ok(())
}

pub(super) async fn edit(ctx: &Ctx, cluster: &str, group: Option<&str>) -> anyhow::Result<i32> {
    let repo = ctx.repo().await?;
    let plan = ops::plan(&repo, cluster, group).await?;
    let edited = match plan.review(&mut run_editor)? {
        Review::Edited(object) => object,
        Review::Cancelled(Cancelled::Emptied) => {
            ctx.printer
                .status("Edit cancelled: the file was emptied. Nothing was saved.");
            return Ok(exit::OK);
        }
        Review::Cancelled(Cancelled::Unchanged) => {
            ctx.printer.status("Edit cancelled, no changes made.");
            return Ok(exit::OK);
        }
    };
    ctx.session()
        .await?
        .with_lock(cluster, "edit", async |guard| {
            ops::apply(&repo, &plan, &edited, guard).await
        })
        .await
        .map_err(|e| plan.not_saved(e))?;
    ctx.printer.success(&format!(
        "Saved {}.",
        group.map_or(format!("cluster {cluster}"), |g| format!(
            "instance group {g} of cluster {cluster}"
        ))
    ));
    Ok(exit::OK)
}
