//! `update cluster`'s end on every platform (the node report, then the add-ons), and the
//! host commands `forget host-key` and `release host`. The node plan, progress and report
//! are printed by `views::nodes`.

use super::commands::Ctx;
use super::{UpdateClusterArgs, exit};
use crate::ops::nodes::NodeReport;
use crate::ops::update::{AddonsError, Update};
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
        ctx.printer.status(&format!(
            "--phase nodes: add-ons and kube-system's node configuration left alone; next: `kprov update cluster {name} --yes --phase addons`."
        ));
        return Ok(exit::OK);
    }
    if a.skip_addons {
        ctx.printer.status(&format!(
            "Add-ons and the node configuration in kube-system (ConfigMaps kubelet-config, kube-proxy) skipped (--skip-addons); deploy them with `kprov update addons {name} --yes` and `kprov update cluster {name} --yes`."
        ));
        return Ok(exit::OK);
    }
    match ints.or(addons_phase(ctx, update, a)).await {
        Ok(code) => code,
        // Caught before the lock was taken, so the listener no longer ends the process: the
        // add-ons' waits must end here (the lock was released with the nodes' part).
        Err(c) => {
            let resume = format!("kprov update cluster {name} --yes --phase addons");
            Ok(super::commands::interrupted(
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
    let cluster = update.cluster();
    let name = cluster.name();
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
        Err(AddonsError::NodeConfig(e)) => {
            ctx.printer.error(&format!(
                "the hosts of {name} are provisioned, but its node configuration in kube-system could not be written: {e:#}. Re-run `kprov update cluster {name} --yes` when the cause is fixed (or pass --skip-addons)"
            ));
            return Ok(exit::ERROR);
        }
        Err(AddonsError::Addons {
            node_config,
            error: e,
        }) => {
            view::node_config(&ctx.printer, name, &node_config);
            ctx.printer.error(&format!(
                "the hosts of {name} are provisioned, but deploying the add-ons failed: {e:#}. \
                 Retry with `kprov update addons {name} --yes` when the cause is fixed \
                 (or pass --skip-addons)"
            ));
            return Ok(exit::ERROR);
        }
    };
    view::node_config(&ctx.printer, name, &applied.node_config);
    Ok(super::addons::print_report(
        ctx,
        cluster,
        &applied.addons,
        false,
    ))
}

/// `forget host-key CLUSTER HOST`: removes HOST's recorded SSH host key (a host of the spec or
/// of kprov's record of provisioned hosts), under the cluster's lock.
pub(super) async fn forget_host_key(
    ctx: &Ctx,
    cluster: &str,
    host: &str,
    yes: bool,
) -> anyhow::Result<i32> {
    let repo = ctx.repo().await?;
    let stored = repo.get(cluster).await?;
    let recorded = crate::ops::instance::provisioned_hosts(repo.store().as_ref(), cluster).await?;
    let h = stored
        .cluster
        .value
        .spec
        .hosts
        .iter()
        .find(|h| h.name == host)
        .or_else(|| recorded.get(host))
        .cloned()
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{} is neither a host of {cluster}'s spec nor one kprov recorded as provisioned",
                crate::output::untrusted(host)
            )
        })?;
    let pattern = crate::ssh::known_hosts_name(&h.address, h.user.as_deref(), h.port, None)
        .await
        .map_err(|e| anyhow::anyhow!("{host}: {e}"))?;
    if !yes {
        ctx.printer.status(&format!(
            "Would forget the host keys {cluster} recorded for {host} (as {}). Must specify --yes.",
            crate::output::untrusted(&pattern)
        ));
        return Ok(exit::OK);
    }
    let gone = super::commands::locked(repo.store(), cluster, "forget host-key", async {
        Ok(crate::ssh::forget_host_key(repo.store(), cluster, &pattern).await?)
    })
    .await?;
    if gone.is_empty() {
        ctx.printer.status(&format!(
            "{cluster} had no host key recorded for {host} (as {}): nothing to forget.",
            crate::output::untrusted(&pattern)
        ));
    } else {
        ctx.printer.success(&format!(
            "Forgot {} host key(s) of {host} (as {}). The next `kprov update cluster {cluster} \
             --yes --accept-new-host-keys` records its current key; check its fingerprint first.",
            gone.len(),
            crate::output::untrusted(&pattern)
        ));
    }
    Ok(exit::OK)
}

/// `release host CLUSTER HOST` ([`crate::ops::instance::release_host`]).
pub(super) async fn release_host(
    ctx: &Ctx,
    cluster: &str,
    host: &str,
    yes: bool,
    accept_new_host_keys: bool,
) -> anyhow::Result<i32> {
    use crate::ops::instance::Release;
    let (resolved, _) = super::addons::resolved(ctx, cluster).await?;
    let repo = ctx.repo().await?;
    let store = repo.store().clone();
    let outcome = if yes {
        super::commands::locked(repo.store(), cluster, "release host", async {
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
    let host = crate::output::untrusted(host);
    match outcome {
        Release::NotClaimed => {
            ctx.printer.status(&format!(
                "{host} carries no kprov ownership marker: nothing to release."
            ));
            Ok(exit::OK)
        }
        Release::Refused(why) => {
            ctx.printer
                .error(&crate::output::untrusted(&why).to_string());
            Ok(exit::ERROR)
        }
        Release::Gone { owner, done: false } => {
            ctx.printer.status(&format!(
                "{host} is held by {}, which the state store no longer has. Must specify --yes \
                 to reset it (kubeadm reset, kprov's files and marker removed).",
                crate::output::untrusted(&owner.describe())
            ));
            Ok(exit::OK)
        }
        Release::Gone { owner, done: true } => {
            ctx.printer.success(&format!(
                "Released {host}: reset, it no longer carries the marker of {}. `kprov update \
                 cluster {cluster} --yes` can now provision it.",
                crate::output::untrusted(&owner.describe())
            ));
            Ok(exit::OK)
        }
    }
}
