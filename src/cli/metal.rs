//! Bare-metal clusters on the command line: `update cluster` and `delete cluster` for a metal
//! cluster are thin commands over `ops::nodes` (the node plan, converging, resetting), with
//! the inventory (`nodes::Inventory`) as the targets. This file renders: the plan table, the
//! per-host progress (a spinner line per host on a terminal, plain lines otherwise) and the
//! final report.
//!
//! The preview (no `--yes`) is read-only on hosts and in the store: it contacts only hosts
//! whose keys the cluster already recorded (others are listed as "host key not recorded",
//! without any network contact), compares the hashes of the files kprov keeps on members, and
//! never records a host key. The apply makes the plan again under the cluster lock and
//! executes that value.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use super::commands::Ctx;
use super::{UpdateClusterArgs, exit};
use crate::nodes::Target;
use crate::ops::node_config::Synced;
use crate::ops::nodes::{AdminKubeconfig, Events, NodeEvent, NodeReport};
use crate::ops::update::{AddonsError, Update, UpdatePlan};
use crate::output::{Format, Printer, Table, plural, sanitize_lines};
use crate::provision::orchestrate::{HostResult, ProgressEvent, Report};
use crate::provision::plan::{Action, NodePlan};
use crate::spec::Host;

fn roles(h: &Host) -> String {
    h.roles
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

fn phase_line(e: &ProgressEvent) -> (String, String) {
    match e {
        ProgressEvent::Started { host, phase, steps } => (
            host.clone(),
            format!("{} ({})", phase.as_str(), plural(*steps, "step")),
        ),
        ProgressEvent::Finished {
            host,
            phase,
            changed,
            unchanged,
        } => (
            host.clone(),
            format!(
                "{} done ({changed} changed, {unchanged} unchanged)",
                phase.as_str()
            ),
        ),
        ProgressEvent::Failed { host, phase, error } => {
            (host.clone(), format!("{} FAILED: {error}", phase.as_str()))
        }
    }
}

/// Renders node events: on a terminal a spinner line per target showing its current phase
/// (other lines printed above the spinners), otherwise a plain status line per event.
/// Returns the bars to clear once the run is over.
pub(super) fn render_events(ctx: &Ctx, targets: &[Target]) -> (Events, Option<MultiProgress>) {
    let printer = Printer::new(Format::Table, ctx.printer.verbosity());
    if !ctx.printer.is_tty() {
        let events: Events = Arc::new(move |e: &NodeEvent| match e {
            NodeEvent::Progress(p) => {
                let (host, line) = phase_line(p);
                printer.status(&format!("{host}: {line}"));
            }
            NodeEvent::HostKeyRecorded { host, fingerprints } => printer.status(&format!(
                "{host}: new host key recorded: {}",
                fingerprints.join(", ")
            )),
            NodeEvent::Warning(w) => printer.warn(w),
            NodeEvent::Detail(d) => printer.debug(d),
        });
        return (events, None);
    }
    let multi = MultiProgress::new();
    let style = ProgressStyle::with_template("{spinner} {prefix:<16} {wide_msg} {elapsed:>4}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let bars: HashMap<String, ProgressBar> = targets
        .iter()
        .map(|t| {
            let bar = multi.add(ProgressBar::new_spinner());
            bar.set_style(style.clone());
            bar.set_prefix(t.name().to_string());
            bar.set_message("waiting");
            bar.enable_steady_tick(Duration::from_millis(120));
            (t.name().to_string(), bar)
        })
        .collect();
    let above = multi.clone();
    let events: Events = Arc::new(move |e: &NodeEvent| match e {
        NodeEvent::Progress(p) => {
            let (host, line) = phase_line(p);
            let Some(bar) = bars.get(&host) else {
                return;
            };
            match p {
                ProgressEvent::Failed { phase, .. } => {
                    bar.abandon_with_message(format!("FAILED in {}", phase.as_str()))
                }
                // indicatif writes to the terminal itself: the printer's backstop applies here
                // by hand (a phase line quotes a host's error).
                _ => bar.set_message(sanitize_lines(&line).into_owned()),
            }
        }
        NodeEvent::HostKeyRecorded { host, fingerprints } => {
            let _ = above.println(sanitize_lines(&format!(
                "{host}: new host key recorded: {}",
                fingerprints.join(", ")
            )));
        }
        NodeEvent::Warning(w) => {
            let _ = above.println(sanitize_lines(&format!("Warning: {w}")));
        }
        // The spinners show the current phase; step times are for plain output (-v).
        NodeEvent::Detail(_) => {}
    });
    (events, Some(multi))
}

fn report_table(report: &Report) -> Table {
    let mut t = Table::new(["HOST", "ROLES", "RESULT", "CHANGED", "DURATION"]);
    for h in &report.hosts {
        let roles: Vec<&str> = h.roles.iter().map(|r| r.as_str()).collect();
        let result = match &h.result {
            HostResult::Ok if h.changed == 0 => "ok, no changes".to_string(),
            HostResult::Ok => "ok".to_string(),
            HostResult::Failed { phase, .. } => format!("FAILED in {}", phase.as_str()),
            HostResult::Skipped { reason } => format!("skipped: {reason}"),
            HostResult::PendingRoll { .. } => "left alone: pending rolling update".to_string(),
        };
        t.row([
            h.host.clone(),
            roles.join(","),
            result,
            format!(
                "{} of {}",
                h.changed,
                plural(h.changed + h.unchanged, "step")
            ),
            format!("{:.1}s", h.duration.as_secs_f64()),
        ]);
    }
    t
}

/// Hosts kprov provisioned that the spec lost: they stay in the cluster until removed.
pub(super) fn warn_gone(ctx: &Ctx, name: &str, gone: &[Host]) {
    for h in gone {
        ctx.printer.warn(&format!(
            "{} ({}) is no longer in the spec but kprov provisioned it: it is still in the \
             cluster (to remove). Remove it with `kprov delete instance {name} {}`",
            h.name, h.address, h.name
        ));
    }
}

/// After converging, on every platform: the report table, each failure named, the admin
/// kubeconfig checked, then the add-ons. Never a silent success: exit 1 when a host did not
/// converge, the credentials were not stored, or the add-ons failed.
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
    let report = &nodes.report;
    ctx.printer.data(&report_table(report).render());
    if !report.success() {
        for h in &report.hosts {
            if let HostResult::Failed { phase, error, .. } = &h.result {
                // The error names the host (and step, and remote stderr) itself.
                ctx.printer.error(&format!("[{}] {error}", phase.as_str()));
            }
        }
        let failed = report
            .hosts
            .iter()
            .filter(|h| h.result != HostResult::Ok)
            .count();
        ctx.printer.error(&format!(
            "{failed} of {} of {name} did not converge; fix the cause and re-run `kprov update cluster {name} --yes` (it resumes)",
            plural(report.hosts.len(), "host")
        ));
        return Ok(exit::ERROR);
    }
    if let AdminKubeconfig::NotFetched(why) = &nodes.admin_kubeconfig {
        ctx.printer.error(&format!(
            "the hosts of {name} converged but its admin kubeconfig could not be stored: {why}"
        ));
        return Ok(exit::ERROR);
    }
    if report.changed() == 0 {
        ctx.printer.success(&format!(
            "No changes: {} of {name} {} converged.",
            match report.hosts.len() {
                1 => "the 1 host".to_string(),
                n => format!("all {n} hosts"),
            },
            if report.hosts.len() == 1 { "is" } else { "are" }
        ));
    } else {
        ctx.printer.success(&format!(
            "Provisioned {name}: {} changed on {}.",
            plural(report.changed(), "step"),
            plural(
                report.hosts.iter().filter(|h| h.changed > 0).count(),
                "host"
            )
        ));
    }
    let pending = report.pending_roll();
    if !pending.is_empty() {
        ctx.printer.status(&format!(
            "{} of {name} {} left alone and pending a rolling update ({}): preview it with `kprov rolling-update cluster {name}`, apply it with `--yes`.",
            plural(pending.len(), "running member"),
            if pending.len() == 1 { "was" } else { "were" },
            pending.iter().map(|h| h.host.as_str()).collect::<Vec<_>>().join(", ")
        ));
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
            print_node_config(ctx, name, &node_config);
            ctx.printer.error(&format!(
                "the hosts of {name} are provisioned, but deploying the add-ons failed: {e:#}. \
                 Retry with `kprov update addons {name} --yes` when the cause is fixed \
                 (or pass --skip-addons)"
            ));
            return Ok(exit::ERROR);
        }
    };
    print_node_config(ctx, name, &applied.node_config);
    Ok(super::addons::print_report(
        ctx,
        cluster,
        &applied.addons,
        false,
    ))
}

/// What writing kube-system's node configuration changed: said whether or not the add-ons
/// after it succeeded (running nodes need a roll to get it).
fn print_node_config(ctx: &Ctx, name: &str, synced: &Synced) {
    for cm in &synced.rewritten {
        ctx.printer.status(&format!(
            "ConfigMap {cm} rewritten from spec.kubelet/spec.kubeProxy: nodes joining now get it; running nodes get it with `kprov rolling-update cluster {name}`."
        ));
    }
    for cm in &synced.missing {
        ctx.printer.warn(&format!(
            "ConfigMap {cm} not found (kubeadm makes it at init): spec.kubelet/spec.kubeProxy not written there"
        ));
    }
}

pub(super) fn plan_table(plan: &NodePlan) -> Table {
    let mut t = Table::new(["HOST", "ROLES", "STATE", "ACTION"]);
    for n in &plan.nodes {
        let roles: Vec<&str> = n.roles.iter().map(|r| r.as_str()).collect();
        t.row([
            n.target.clone(),
            roles.join(","),
            n.state(),
            n.action.as_str().to_string(),
        ]);
    }
    t
}

/// The preview of a platform without cloud resources (metal): the node plan of its hosts,
/// the hosts to remove and the inventory's changes to the spec.
pub(super) fn preview(
    ctx: &Ctx,
    update: &Update,
    plan: &UpdatePlan,
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    let name = update.cluster().name();
    let code = node_preview(ctx, name, plan, a)?;
    warn_gone(ctx, name, update.hosts_to_remove());
    if plan.spec_changes {
        ctx.printer.status(&format!(
            "The spec's hosts would change: `kprov update cluster {name} --inventory {} \
             --yes` stores them and provisions the new ones.",
            a.inventory
                .as_deref()
                .unwrap_or(std::path::Path::new(""))
                .display()
        ));
    }
    Ok(if code == exit::OK && a.exit_code && plan.pending() {
        exit::CHANGES_PENDING
    } else {
        code
    })
}

fn node_preview(
    ctx: &Ctx,
    name: &str,
    update: &UpdatePlan,
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    let Some(plan) = &update.nodes else {
        return Ok(exit::OK);
    };
    match ctx.printer.format() {
        Format::Json => ctx
            .printer
            .data(&serde_json::to_string_pretty(&serde_json::to_value(
                update,
            )?)?),
        Format::Yaml => ctx
            .printer
            .data(&crate::output::to_yaml(&serde_json::to_value(update)?)?),
        Format::Table => {
            ctx.printer.data(&plan_table(plan).render());
            for src in &plan.sources {
                ctx.printer.status(&src.describe());
            }
            for n in &plan.nodes {
                if n.pending || matches!(n.action, Action::Refused | Action::PendingRoll) {
                    ctx.printer
                        .status(&format!("{}: {}", n.target, n.reasons.join("; ")));
                }
            }
        }
    }
    if let Some(refusal) = update.refusals.first() {
        ctx.printer.error(refusal);
        return Ok(exit::ERROR);
    }
    let pending = plan.pending();
    if pending.is_empty() {
        ctx.printer.status(&format!(
            "Every host of {name} is a member; `--yes` re-checks each step and changes only what drifted."
        ));
        return Ok(exit::OK);
    }
    ctx.printer.status(&format!(
        "{} of {} {} provisioning ({}). Must specify --yes to provision {name}.",
        pending.len(),
        plural(plan.nodes.len(), "host"),
        if pending.len() == 1 { "needs" } else { "need" },
        pending.join(", ")
    ));
    Ok(if a.exit_code {
        exit::CHANGES_PENDING
    } else {
        exit::OK
    })
}

/// `delete cluster`'s preview of a metal cluster's hosts (`ops::delete`'s plan).
pub(super) fn reset_preview(name: &str, hosts: &[Host], dropped: &[String]) -> String {
    let mut t = Table::new(["HOST", "ROLES", "ADDRESS", "NOTE"]);
    for h in hosts {
        let note = if dropped.contains(&h.name) {
            "no longer in the spec; kprov provisioned it"
        } else {
            ""
        };
        t.row([
            h.name.clone(),
            roles(h),
            h.address.clone(),
            note.to_string(),
        ]);
    }
    format!(
        "Will reset {} of {name}, those that carry its ownership marker (kubeadm reset; /etc/kubernetes, /var/lib/kubelet, /var/lib/etcd, /var/lib/kprov removed):\n{}",
        plural(hosts.len(), "host"),
        t.render()
    )
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
