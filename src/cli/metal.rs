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

use super::commands::{Ctx, LOCK_LEASE};
use super::{UpdateClusterArgs, exit};
use crate::nodes::{self, Action, NodePlan, Target, TargetSource};
use crate::ops::nodes::{
    self as ops, AdminKubeconfig, Events, NodeEvent, NodeOptions, NodeReport, ResetOutcome,
};
use crate::output::{Format, Printer, Table, sanitize_lines};
use crate::provision::orchestrate::{HostResult, ProgressEvent, Report};
use crate::spec::{Cluster, Host, InstanceGroup};
use crate::state::lock;

fn roles(h: &Host) -> String {
    h.roles
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

fn phase_line(e: &ProgressEvent) -> (String, String) {
    match e {
        ProgressEvent::Started { host, phase, steps } => {
            (host.clone(), format!("{} ({steps} steps)", phase.as_str()))
        }
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
    let printer = Printer::new(Format::Table, 0);
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
            format!("{} of {} steps", h.changed, h.changed + h.unchanged),
            format!("{:.1}s", h.duration.as_secs_f64()),
        ]);
    }
    t
}

/// The targets of a metal cluster: its inventory.
async fn targets(cluster: &Cluster) -> anyhow::Result<Vec<Target>> {
    Ok(nodes::Inventory {
        hosts: cluster.spec.hosts.clone(),
    }
    .targets()
    .await?)
}

/// `update cluster NAME` for a metal cluster (`cluster` is resolved: completed and valid).
pub async fn update(
    ctx: &Ctx,
    cluster: &Cluster,
    _groups: &[InstanceGroup],
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    let name = cluster.name();
    let repo = ctx.repo().await?;
    let store = repo.store().clone();
    let targets = targets(cluster).await?;
    let options = NodeOptions {
        accept_new_host_keys: a.accept_new_host_keys,
        concurrency: a.concurrency,
        cloud_api: None,
    };
    // Hosts kprov provisioned that the inventory lost stay in the cluster until removed.
    let gone = crate::ops::instance::hosts_to_remove(store.as_ref(), cluster).await?;
    let warn_gone = || {
        for h in &gone {
            ctx.printer.warn(&format!(
                "{} ({}) is no longer in the spec but kprov provisioned it: it is still in the \
                 cluster (to remove). Remove it with `kprov delete instance {name} {}`",
                h.name, h.address, h.name
            ));
        }
    };
    if !a.yes {
        let plan = ops::plan(store, cluster, &targets, &options).await?;
        let code = preview(ctx, name, &plan, a)?;
        warn_gone();
        return Ok(if code == exit::OK && a.exit_code && !gone.is_empty() {
            exit::CHANGES_PENDING
        } else {
            code
        });
    }
    warn_gone();
    let guard = lock::acquire(store.clone(), name, "update cluster --yes", LOCK_LEASE).await?;
    let (events, bars) = render_events(ctx, &targets);
    let result = ops::converge(store.clone(), cluster, &targets, &guard, &options, &events).await;
    if let Some(bars) = bars {
        // The final table says it all; finished spinners would only repeat it.
        let _ = bars.clear();
    }
    let released = guard.release().await;
    // The provisioning error, if any, is the one worth reporting.
    let nodes = result?;
    released?;
    finish(ctx, cluster, &nodes, a).await
}

/// After converging, on every platform: the report table, each failure named, the admin
/// kubeconfig checked, then the add-ons. Never a silent success: exit 1 when a host did not
/// converge, the credentials were not stored, or the add-ons failed.
pub(super) async fn finish(
    ctx: &Ctx,
    cluster: &Cluster,
    nodes: &NodeReport,
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    let name = cluster.name();
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
            "{failed} of {} hosts of {name} did not converge; fix the cause and re-run `kprov update cluster {name} --yes` (it resumes)",
            report.hosts.len()
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
            "No changes: all {} hosts of {name} are converged.",
            report.hosts.len()
        ));
    } else {
        ctx.printer.success(&format!(
            "Provisioned {name}: {} steps changed on {} hosts.",
            report.changed(),
            report.hosts.iter().filter(|h| h.changed > 0).count()
        ));
    }
    let pending = report.pending_roll();
    if !pending.is_empty() {
        ctx.printer.status(&format!(
            "{} running members of {name} were left alone and are pending a rolling update ({}): preview it with `kprov rolling-update cluster {name}`, apply it with `--yes`.",
            pending.len(),
            pending.iter().map(|h| h.host.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    if a.skip_addons {
        ctx.printer.status(&format!(
            "Add-ons skipped (--skip-addons); deploy them with `kprov update addons {name} --yes`."
        ));
        return Ok(exit::OK);
    }
    let args = super::addons::UpdateAddonsArgs {
        name,
        yes: true,
        kubeconfig: a.kubeconfig.as_deref(),
        force_conflicts: false,
        wait: Duration::from_secs(300),
        exit_code: false,
        ssh_tunnel: false,
    };
    if let Err(e) = super::addons::deploy(ctx, cluster, &args).await {
        ctx.printer.error(&format!(
            "the hosts of {name} are provisioned, but deploying the add-ons failed: {e:#}. \
             Retry with `kprov update addons {name} --yes` when the cause is fixed \
             (or pass --skip-addons)"
        ));
        return Ok(exit::ERROR);
    }
    Ok(exit::OK)
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

pub(super) fn preview(
    ctx: &Ctx,
    name: &str,
    plan: &NodePlan,
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    match ctx.printer.format() {
        Format::Json => ctx.printer.data(&serde_json::to_string_pretty(plan)?),
        Format::Yaml => ctx.printer.data(&crate::output::to_yaml(plan)?),
        Format::Table => {
            ctx.printer.data(&plan_table(plan).render());
            for n in &plan.nodes {
                if n.pending || matches!(n.action, Action::Refused | Action::PendingRoll) {
                    ctx.printer
                        .status(&format!("{}: {}", n.target, n.reasons.join("; ")));
                }
            }
        }
    }
    let refused = plan.refused();
    if !refused.is_empty() {
        ctx.printer.error(&format!(
            "{} hosts of {name} belong to another cluster and will not be provisioned: {}",
            refused.len(),
            refused
                .iter()
                .map(|n| format!("{} ({})", n.target, n.state()))
                .collect::<Vec<_>>()
                .join(", ")
        ));
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
        "{} of {} hosts need provisioning ({}). Must specify --yes to provision {name}.",
        pending.len(),
        plan.nodes.len(),
        pending.join(", ")
    ));
    Ok(if a.exit_code {
        exit::CHANGES_PENDING
    } else {
        exit::OK
    })
}

/// `delete cluster` for metal: resets the hosts that carry the cluster's ownership marker
/// (kubeadm reset, kprov's files removed). Without `yes` only lists the hosts. Hosts whose
/// key the cluster never recorded, and hosts of other clusters, are left alone; any other
/// host that cannot be reset fails the delete, so the state (and with it the hosts' keys)
/// stays for a retry.
pub async fn reset_hosts(
    ctx: &Ctx,
    cluster: &Cluster,
    yes: bool,
    concurrency: usize,
) -> anyhow::Result<()> {
    let name = cluster.name();
    let hosts: &[Host] = &cluster.spec.hosts;
    if !yes {
        let mut t = Table::new(["HOST", "ROLES", "ADDRESS"]);
        for h in hosts {
            t.row([h.name.clone(), roles(h), h.address.clone()]);
        }
        ctx.printer.data(&format!(
            "Will reset {} hosts of {name}, those that carry its ownership marker (kubeadm reset; /etc/kubernetes, /var/lib/kubelet, /var/lib/etcd, /var/lib/kprov removed):\n{}",
            hosts.len(),
            t.render()
        ));
        return Ok(());
    }
    let repo = ctx.repo().await?;
    let targets = targets(cluster).await?;
    let (events, bars) = render_events(ctx, &targets);
    let options = NodeOptions {
        accept_new_host_keys: false,
        concurrency,
        cloud_api: None,
    };
    let outcome = ops::reset(repo.store().clone(), cluster, &targets, &options, &events).await;
    if let Some(bars) = bars {
        let _ = bars.clear();
    }
    let report = match outcome? {
        ResetOutcome::NothingClaimed(why) => {
            ctx.printer.warn(&format!("{why}: no host to reset"));
            return Ok(());
        }
        ResetOutcome::Reset(report) => report,
    };
    let mut failures = Vec::new();
    for h in &report.hosts {
        match &h.result {
            HostResult::Failed {
                unknown_host_key: true,
                ..
            } => {
                ctx.printer.warn(&format!(
                    "{}: not reset: kprov never connected to it (no recorded host key)",
                    h.host
                ));
            }
            HostResult::Failed { error, .. } => failures.push(error.clone()),
            HostResult::Skipped { reason } | HostResult::PendingRoll { reason } => {
                ctx.printer.warn(&format!("{}: {reason}", h.host));
            }
            HostResult::Ok => {}
        }
    }
    if !failures.is_empty() {
        anyhow::bail!(
            "could not reset {} hosts of {name}, the cluster's state is kept for a retry \
             (to give up on a host, remove it from the spec with `kprov edit cluster {name}`):\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    let reset = report
        .hosts
        .iter()
        .filter(|h| h.result == HostResult::Ok)
        .count();
    ctx.printer.success(&format!(
        "Reset {reset} of the {} hosts of {name}.",
        report.hosts.len()
    ));
    Ok(())
}
