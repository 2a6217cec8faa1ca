//! Bare-metal clusters: `update cluster` provisions the inventory's hosts over SSH with
//! kubeadm (`provision::orchestrate`), `delete cluster` resets them.
//!
//! Both the preview (no `--yes`) and the apply make the node plan with `nodes::plan` (the
//! apply again, under the cluster lock); the apply hands that same value to
//! `orchestrate::execute`. The preview is read-only on hosts and in the store: it contacts
//! only hosts whose keys the cluster already recorded (others are listed as "host key not
//! recorded", without any network contact), compares the hashes of the files kprov keeps on
//! members, and never records a host key.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use super::commands::{ADMIN_KUBECONFIG_SECRET, Ctx, LOCK_LEASE};
use super::{UpdateClusterArgs, exit};
use crate::nodes::{self, Action, NodePlan, Owner, Target, TargetSource};
use crate::output::{Format, Printer, Table};
use crate::provision::orchestrate::{self, HostResult, Options, ProgressEvent, Report};
use crate::spec::{Cluster, Host, InstanceGroup};
use crate::ssh::{Event, Progress, SshFleet, SshOptions};
use crate::state::layout::ClusterKeys;
use crate::state::{Precondition, StateStore, lock};

fn roles(h: &Host) -> String {
    h.roles
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// The SSH engine's event worth a line of its own: a first-contact host key recorded (the
/// operator should compare its fingerprint). Printed above the spinners on a terminal.
struct SshLines {
    printer: Printer,
    bars: Option<MultiProgress>,
}

impl Progress for SshLines {
    fn event(&self, event: &Event) {
        if let Event::HostKeyRecorded { .. } = event {
            match &self.bars {
                Some(bars) => {
                    let _ = bars.println(event.to_string());
                }
                None => self.printer.status(&event.to_string()),
            }
        }
    }
}

fn fleet(
    cluster: &Cluster,
    store: Arc<dyn StateStore>,
    accept_new_host_keys: bool,
    concurrency: usize,
    bars: Option<MultiProgress>,
) -> anyhow::Result<SshFleet> {
    let lines = Arc::new(SshLines {
        printer: Printer::new(Format::Table, 0),
        bars,
    });
    SshFleet::for_cluster(
        cluster,
        store,
        SshOptions {
            concurrency,
            accept_new_host_keys,
            ..SshOptions::default()
        },
        lines,
    )
    .context("preparing ssh connections")
}

/// Per-host progress: a line per host and phase, or on a terminal a spinner line per host
/// showing its current phase. Returns the bars to clear once the run is over.
fn progress(ctx: &Ctx, hosts: &[Target]) -> (orchestrate::Progress, Option<MultiProgress>) {
    if !ctx.printer.is_tty() {
        return (progress_lines(), None);
    }
    let multi = MultiProgress::new();
    let style = ProgressStyle::with_template("{spinner} {prefix:<16} {wide_msg} {elapsed:>4}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let bars: HashMap<String, ProgressBar> = hosts
        .iter()
        .map(|h| {
            let bar = multi.add(ProgressBar::new_spinner());
            bar.set_style(style.clone());
            bar.set_prefix(h.name().to_string());
            bar.set_message("waiting");
            bar.enable_steady_tick(Duration::from_millis(120));
            (h.name().to_string(), bar)
        })
        .collect();
    let update = move |e: &ProgressEvent| {
        let host = match e {
            ProgressEvent::Started { host, .. }
            | ProgressEvent::Finished { host, .. }
            | ProgressEvent::Failed { host, .. } => host,
        };
        let Some(bar) = bars.get(host) else {
            return;
        };
        match e {
            ProgressEvent::Started { phase, steps, .. } => {
                bar.set_message(format!("{} ({steps} steps)", phase.as_str()))
            }
            ProgressEvent::Finished {
                phase,
                changed,
                unchanged,
                ..
            } => bar.set_message(format!(
                "{} done ({changed} changed, {unchanged} unchanged)",
                phase.as_str()
            )),
            ProgressEvent::Failed { phase, .. } => {
                bar.abandon_with_message(format!("FAILED in {}", phase.as_str()))
            }
        }
    };
    (Arc::new(update), Some(multi))
}

/// One line per host and phase (progress goes to stderr).
fn progress_lines() -> orchestrate::Progress {
    let printer = Printer::new(Format::Table, 0);
    Arc::new(move |e: &ProgressEvent| match e {
        ProgressEvent::Started { host, phase, steps } => {
            printer.status(&format!("{host}: {} ({steps} steps)", phase.as_str()))
        }
        ProgressEvent::Finished {
            host,
            phase,
            changed,
            unchanged,
        } => printer.status(&format!(
            "{host}: {} done ({changed} changed, {unchanged} unchanged)",
            phase.as_str()
        )),
        ProgressEvent::Failed { host, phase, error } => {
            printer.status(&format!("{host}: {} FAILED: {error}", phase.as_str()))
        }
    })
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
    if !a.yes {
        return preview(ctx, cluster, store, a).await;
    }
    let guard = lock::acquire(store.clone(), name, "update cluster --yes", LOCK_LEASE).await?;
    let result = provision(ctx, cluster, store.clone(), a, &guard).await;
    let released = guard.release().await;
    // The provisioning error, if any, is the one worth reporting.
    let report = result?;
    released?;
    ctx.printer.data(&report_table(&report).render());
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

/// The targets of a metal cluster: its inventory.
async fn targets(cluster: &Cluster) -> anyhow::Result<Vec<Target>> {
    Ok(nodes::Inventory {
        hosts: cluster.spec.hosts.clone(),
    }
    .targets()
    .await?)
}

async fn provision(
    ctx: &Ctx,
    cluster: &Cluster,
    store: Arc<dyn StateStore>,
    a: &UpdateClusterArgs,
    guard: &lock::LockGuard,
) -> anyhow::Result<Report> {
    let targets = targets(cluster).await?;
    // The identity hosts are claimed for, made once (compare-and-swap) before any claim.
    guard.check()?;
    let owner = nodes::owner::ensure(store.as_ref(), cluster.name())
        .await
        .context("the cluster's UID")?;
    let (events, bars) = progress(ctx, &targets);
    let fleet = fleet(
        cluster,
        store.clone(),
        a.accept_new_host_keys,
        a.concurrency,
        bars.clone(),
    )?;
    let options = Options {
        progress: Some(events),
        ..Options::current()
    };
    let result = async {
        // Observed again under the lock: the world may have changed since the preview.
        let plan = nodes::plan::plan(&fleet, None, cluster, &targets, Some(owner.clone()))
            .await
            .context("planning the nodes")?;
        let report = orchestrate::execute(&fleet, cluster, &targets, &plan, &options)
            .await
            .context("provisioning")?;
        if report.hosts.iter().any(|h| {
            h.result == HostResult::Ok
                && targets
                    .iter()
                    .any(|t| t.name() == h.host && t.is_control_plane())
        }) {
            match orchestrate::admin_kubeconfig(&fleet, cluster, &targets, &owner).await {
                Ok(admin) => {
                    guard.check()?;
                    store_admin_kubeconfig(store.as_ref(), cluster.name(), admin).await?;
                }
                Err(e) => ctx
                    .printer
                    .warn(&format!("could not fetch the admin kubeconfig: {e}")),
            }
        }
        Ok::<_, anyhow::Error>(report)
    }
    .await;
    fleet.close().await;
    if let Some(bars) = bars {
        // The final table says it all; finished spinners would only repeat it.
        let _ = bars.clear();
    }
    result
}

/// Writes the admin kubeconfig under the cluster's secrets, compare-and-swap; an unchanged one
/// is not rewritten.
async fn store_admin_kubeconfig(
    store: &dyn StateStore,
    cluster: &str,
    admin: String,
) -> anyhow::Result<()> {
    let key = ClusterKeys::new(cluster)?.secret(ADMIN_KUBECONFIG_SECRET)?;
    let cond = match store.get(&key).await? {
        Some(o) if o.data == admin.as_bytes() => return Ok(()),
        Some(o) => Precondition::Matches(o.version),
        None => Precondition::Absent,
    };
    store
        .put(&key, Bytes::from(admin), cond)
        .await
        .context("storing the admin kubeconfig")?;
    Ok(())
}

fn plan_table(plan: &NodePlan) -> Table {
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

async fn preview(
    ctx: &Ctx,
    cluster: &Cluster,
    store: Arc<dyn StateStore>,
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    let name = cluster.name();
    let targets = targets(cluster).await?;
    // Read-only: a cluster that never claimed a host has no UID yet (none is made here).
    let owner: Option<Owner> = nodes::owner::read(store.as_ref(), name).await?;
    // Never records keys, and contacts no host whose key is not recorded.
    let fleet = fleet(cluster, store, false, a.concurrency, None)?;
    let plan = nodes::plan::plan(&fleet, Some(&fleet), cluster, &targets, owner).await;
    fleet.close().await;
    let plan = plan.context("planning the nodes")?;
    match ctx.printer.format() {
        Format::Json => ctx.printer.data(&serde_json::to_string_pretty(&plan)?),
        Format::Yaml => ctx.printer.data(&serde_saphyr::to_string(&plan)?),
        Format::Table => {
            ctx.printer.data(&plan_table(&plan).render());
            for n in &plan.nodes {
                if n.pending || n.action == Action::Refused {
                    ctx.printer
                        .status(&format!("{}: {}", n.target, n.reasons.join("; ")));
                }
            }
        }
    }
    let refused = plan.refused();
    if !refused.is_empty() {
        let names: Vec<&str> = refused.iter().map(|n| n.target.as_str()).collect();
        ctx.printer.error(&format!(
            "{} hosts of {name} belong to another cluster and will not be provisioned: {}",
            names.len(),
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

/// `delete cluster` for metal: resets every host (kubeadm reset, kprov's files removed).
/// Without `yes` only lists the hosts. Hosts whose key the cluster never recorded were never
/// provisioned by kprov and are left alone; any other host that cannot be reset fails the
/// delete, so the state (and with it the hosts' keys) stays for a retry.
pub async fn reset_hosts(ctx: &Ctx, cluster: &Cluster, yes: bool) -> anyhow::Result<()> {
    let name = cluster.name();
    let hosts = &cluster.spec.hosts;
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
    let known = repo
        .store()
        .get(&ClusterKeys::new(name)?.known_hosts())
        .await?
        .is_some_and(|o| !o.data.trim_ascii().is_empty());
    if !known {
        // Without a recorded key kprov cannot (and never did) log in to any of the hosts.
        ctx.printer.warn(&format!(
            "kprov never connected to a host of {name} (no host keys recorded): no host to reset"
        ));
        return Ok(());
    }
    let Some(owner) = nodes::owner::read(repo.store().as_ref(), name).await? else {
        // No UID: the cluster never claimed a host, so none carries its marker.
        ctx.printer.warn(&format!(
            "{name} never claimed a host (no cluster UID in the state store): no host to reset"
        ));
        return Ok(());
    };
    let targets = targets(cluster).await?;
    let (events, bars) = progress(ctx, &targets);
    let fleet = fleet(cluster, repo.store().clone(), false, 20, bars.clone())?;
    let options = Options {
        progress: Some(events),
        ..Options::current()
    };
    let report = orchestrate::reset(&fleet, cluster, &targets, &owner, &options).await;
    fleet.close().await;
    if let Some(bars) = bars {
        let _ = bars.clear();
    }
    let report = report.context("resetting hosts")?;
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
            HostResult::Skipped { reason } => {
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
