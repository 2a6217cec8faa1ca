//! `update cluster`'s end on every platform (the node report, then the add-ons), and the
//! host commands `forget host-key` and `release host`. The node plan, progress and report
//! are printed by `views::nodes`.

use super::ctx::Ctx;
use super::{UpdateClusterArgs, exit};
use crate::ops::nodes::NodeReport;
use crate::ops::update::Update;
use crate::views::nodes as view;

/// After converging, on every platform: the report ([`view::node_report`]), then the
/// add-ons. Never a silent success: exit 1 when a host did not converge, the credentials were
/// not stored, or the add-ons failed.
/// `ints`: the command's signals, caught since before the lock; the add-ons' waits on the
/// API (the CCM's rollout on AWS, up to `--wait` per stage) end at the first one too.
pub(super) async fn finish(
    ctx: &Ctx,
    update: &Update,
    nodes: &NodeReport,
    a: &UpdateClusterArgs,
    ints: &crate::ops::interrupt::Interrupts,
) -> anyhow::Result<i32> {
    let name = update.cluster().name();
    if !view::node_report(&ctx.printer, name, nodes) {
        return Ok(exit::ERROR);
    }
    if a.phase == Some(super::UpdatePhase::Nodes) {
        view::addons_left(&ctx.printer, name, false);
        return Ok(exit::OK);
    }
    if a.skip_addons {
        view::addons_left(&ctx.printer, name, true);
        return Ok(exit::OK);
    }
    match ints.or(addons_phase(ctx, update, a)).await {
        Ok(code) => code,
        // Caught before the lock was taken, so the listener no longer ends the process: the
        // add-ons' waits must end here (the lock was released with the nodes' part).
        Err(c) => {
            let resume = format!("kprov update cluster {name} --yes --phase addons");
            Ok(super::ctx::interrupted(
                ctx,
                name,
                c,
                "applying the add-ons and waiting for them through the API (the hosts are provisioned)",
                &resume,
            ))
        }
    }
}

/// `update cluster --phase addons`, and the last part of every whole `update --yes`:
/// kube-system's node configuration, then the add-ons ([`Update::addons`]: one API client for
/// both). Without --yes, the add-ons' preview.
pub(super) async fn addons_phase(
    ctx: &Ctx,
    update: &Update,
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    let cluster = update.resolved();
    let name = cluster.name.as_str();
    if !a.yes {
        let args = super::addons::UpdateAddonsArgs {
            name,
            yes: false,
            kubeconfig: a.kubeconfig.as_deref(),
            force_conflicts: false,
            wait: crate::ops::update::ADDONS_WAIT,
            exit_code: a.exit_code,
            ssh_tunnel: false,
        };
        return super::addons::deploy(ctx, cluster, &args).await;
    }
    let applied = match update.addons(a.kubeconfig.as_deref()).await {
        Ok(applied) => applied,
        Err(e) => {
            view::addons_failed(&ctx.printer, name, &e);
            return Ok(exit::ERROR);
        }
    };
    view::node_config(&ctx.printer, name, &applied.node_config);
    Ok(super::addons::print_report(
        ctx,
        name,
        &applied.addons,
        false,
    ))
}

/// `forget host-key CLUSTER HOST` ([`crate::ops::hostkeys`]): HOST's recorded SSH host key
/// removed under the cluster's lock.
pub(super) async fn forget_host_key(
    ctx: &Ctx,
    cluster: &str,
    host: &str,
    yes: bool,
) -> anyhow::Result<i32> {
    use crate::ops::hostkeys::{self, ForgetError};
    let session = ctx.session().await?;
    let plan = hostkeys::plan(&session.repo(), cluster, host)
        .await
        .map_err(failed)?;
    if !yes {
        view::forget_preview(&ctx.printer, &plan);
        return Ok(exit::OK);
    }
    let gone = session
        .with_lock(cluster, "forget host-key", async |guard| {
            hostkeys::apply(session.store(), &plan, guard).await
        })
        .await
        .map_err(failed)?;
    view::forgotten(&ctx.printer, &plan, gone.len());
    return Ok(exit::OK);

    /// The cause kept as it is for the exit code (4 for a held lock).
    fn failed(e: ForgetError) -> anyhow::Error {
        match e {
            ForgetError::Lock(e) => e.into(),
            ForgetError::Repo(e) => e.into(),
            ForgetError::Other(e) => e,
            e => e.into(),
        }
    }
}

/// `release host CLUSTER HOST` ([`crate::ops::instance::release_host`]).
pub(super) async fn release_host(
    ctx: &Ctx,
    cluster: &str,
    host: &str,
    yes: bool,
    accept_new_host_keys: bool,
) -> anyhow::Result<i32> {
    let resolved = super::addons::resolved(ctx, cluster).await?;
    let repo = ctx.repo().await?;
    let store = repo.store().clone();
    let outcome = if yes {
        super::ctx::locked(repo.store(), cluster, "release host", async {
            crate::ops::instance::release_host(
                store.clone(),
                &resolved,
                host,
                accept_new_host_keys,
                true,
            )
            .await
        })
        .await?
    } else {
        crate::ops::instance::release_host(store, &resolved, host, accept_new_host_keys, false)
            .await?
    };
    Ok(if view::released(&ctx.printer, cluster, host, &outcome) {
        exit::OK
    } else {
        exit::ERROR
    })
}
