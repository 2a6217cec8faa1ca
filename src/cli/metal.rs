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
use crate::nodes::{self, Target, TargetSource};
use crate::ops::nodes::{self as ops, AdminKubeconfig, Events, NodeEvent, NodeOptions, NodeReport};
use crate::ops::session::Session;
use crate::output::{Format, Printer, Table, plural, sanitize_lines};
use crate::provision::orchestrate::{HostResult, ProgressEvent, Report};
use crate::provision::plan::{Action, NodePlan};
use crate::spec::{Cluster, Host, InstanceGroup};

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

/// The targets of a metal cluster: its inventory.
async fn targets(cluster: &Cluster) -> anyhow::Result<Vec<Target>> {
    Ok(nodes::Inventory {
        hosts: cluster.spec.hosts.clone(),
    }
    .targets()
    .await?)
}

/// What reading the inventory again changes in the spec's hosts (by name).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HostsChange {
    pub added: Vec<Host>,
    pub removed: Vec<Host>,
    /// The same name with another address, roles, user, port, labels, ...: (before, after).
    pub changed: Vec<(Host, Host)>,
}

impl HostsChange {
    pub fn of(before: &[Host], after: &[Host]) -> HostsChange {
        let find = |hosts: &[Host], name: &str| hosts.iter().find(|h| h.name == name).cloned();
        HostsChange {
            added: after
                .iter()
                .filter(|h| find(before, &h.name).is_none())
                .cloned()
                .collect(),
            removed: before
                .iter()
                .filter(|h| find(after, &h.name).is_none())
                .cloned()
                .collect(),
            changed: before
                .iter()
                .filter_map(|b| {
                    find(after, &b.name)
                        .filter(|a| a != b)
                        .map(|a| (b.clone(), a))
                })
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }

    /// One line each: the hosts to add, to remove and those that changed.
    pub fn lines(&self, inventory: &str) -> Vec<String> {
        let list = |hosts: &[Host]| {
            hosts
                .iter()
                .map(|h| format!("{} ({}, {})", h.name, h.address, roles(h)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut out = vec![];
        if self.is_empty() {
            out.push(format!(
                "Inventory {inventory}: the same hosts as the spec (nothing to add or remove)"
            ));
            return out;
        }
        if !self.added.is_empty() {
            out.push(format!(
                "Inventory {inventory}: hosts to add: {}",
                list(&self.added)
            ));
        }
        if !self.removed.is_empty() {
            out.push(format!(
                "Inventory {inventory}: hosts to remove: {}",
                list(&self.removed)
            ));
        }
        for (b, a) in &self.changed {
            out.push(format!(
                "Inventory {inventory}: host {} changes: {} ({}) -> {} ({})",
                b.name,
                b.address,
                roles(b),
                a.address,
                roles(a)
            ));
        }
        out
    }
}

/// `update cluster NAME --inventory DIR`: the stored user spec with the inventory's hosts,
/// completed and validated (nothing stored), its version, and what changes.
async fn reread_inventory(
    ctx: &Ctx,
    name: &str,
    path: &std::path::Path,
) -> anyhow::Result<(Cluster, Cluster, crate::state::Version, HostsChange)> {
    // Refused with every problem at once, like `create cluster --inventory`.
    let inv = crate::inventory::import(path)?;
    let repo = ctx.repo().await?;
    let stored = repo.get(name).await?;
    let mut user = stored.cluster.value.clone();
    let hosts = inv.plain_hosts();
    let change = HostsChange::of(&user.spec.hosts, &hosts);
    user.spec.hosts = hosts;
    let (resolved, _) = crate::repo::resolve_with_docs(
        &user,
        &stored.group_values(),
        None,
        &HashMap::new(),
        &inv.file,
    )?;
    for line in change.lines(&inv.file) {
        ctx.printer
            .status(&crate::output::untrusted(&line).to_string());
    }
    if let Some((v, at)) = &inv.settings.kubernetes_version
        && resolved.spec.kubernetes_version.as_deref() != Some(v.as_str())
    {
        ctx.printer.warn(
            &crate::output::untrusted(&format!(
                "kube_version {v} ({at}) differs from the spec's {}: `update cluster --inventory` \
             reads hosts only; change the version with `kprov edit cluster {name}` and roll it \
             with `kprov rolling-update cluster {name}`",
                resolved.spec.kubernetes_version.as_deref().unwrap_or("-")
            ))
            .to_string(),
        );
    }
    Ok((user, resolved, stored.version, change))
}

/// `update cluster NAME` for a metal cluster (`cluster` is resolved: completed and valid).
pub async fn update(
    ctx: &Ctx,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    let name = cluster.name();
    let repo = ctx.repo().await?;
    let store = repo.store().clone();
    let reread = match &a.inventory {
        Some(path) => Some(reread_inventory(ctx, name, path).await?),
        None => None,
    };
    let rebundled = reread
        .as_ref()
        .map(|(_, resolved, _, _)| super::update::with_bundle(resolved.clone(), a));
    let cluster = rebundled.as_ref().unwrap_or(cluster);
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
    let spec_changes = reread.as_ref().is_some_and(|(_, _, _, c)| !c.is_empty());
    if !a.yes {
        let plan = ops::plan(store, cluster, &targets, &options).await?;
        let code = preview(ctx, name, &plan, a)?;
        warn_gone();
        if spec_changes {
            ctx.printer.status(&format!(
                "The spec's hosts would change: `kprov update cluster {name} --inventory {} \
                 --yes` stores them and provisions the new ones.",
                a.inventory
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""))
                    .display()
            ));
        }
        return Ok(
            if code == exit::OK && a.exit_code && (!gone.is_empty() || spec_changes) {
                exit::CHANGES_PENDING
            } else {
                code
            },
        );
    }
    warn_gone();
    let resume = super::update::resume_command(name, a);
    let ints = super::commands::catch_interrupts(name, &resume);
    let session = Session::new(store.clone());
    let nodes = session
        .with_lock(name, "update cluster --yes", async |guard| {
            if let Some((user, _, version, change)) = &reread
                && !change.is_empty()
            {
                // Conditional on the spec read for the preview: a concurrent edit is a
                // conflict (exit 4), never overwritten.
                repo.put_cluster(user, version).await?;
                repo.write_completed(user, groups).await?;
                ctx.printer.status(&format!(
                    "Stored the inventory's hosts in the spec of {name} ({} added, {} removed, \
                     {} changed).",
                    change.added.len(),
                    change.removed.len(),
                    change.changed.len()
                ));
            }
            let (events, bars) = render_events(ctx, &targets);
            // A signal cuts the hosts where they are: every step is safe to run again.
            let result = ints
                .or(ops::converge(
                    store.clone(),
                    cluster,
                    &targets,
                    guard,
                    &options,
                    &events,
                ))
                .await;
            if let Some(bars) = bars {
                // The final table says it all; finished spinners would only repeat it.
                let _ = bars.clear();
            }
            match result {
                Err(c) => anyhow::Ok(Err(c)),
                // The provisioning error, if any, is the one worth reporting.
                Ok(r) => Ok(Ok(r?)),
            }
        })
        .await?;
    let nodes = match nodes {
        Err(c) => {
            let what = format!(
                "provisioning {} (a host step cut short is done again by the next run)",
                super::update::plural(targets.len(), "host")
            );
            return Ok(super::commands::interrupted(ctx, name, c, &what, &resume));
        }
        Ok(nodes) => nodes,
    };
    finish(ctx, cluster, &nodes, a, &ints).await
}

/// After converging, on every platform: the report table, each failure named, the admin
/// kubeconfig checked, then the add-ons. Never a silent success: exit 1 when a host did not
/// converge, the credentials were not stored, or the add-ons failed.
/// `ints`: the command's signals, caught since before the lock; the add-ons' waits on the
/// API (the CCM's rollout on AWS, up to `--wait` per stage) end at the first one too.
pub(super) async fn finish(
    ctx: &Ctx,
    cluster: &Cluster,
    nodes: &NodeReport,
    a: &UpdateClusterArgs,
    ints: &crate::ops::interrupt::Interrupts,
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
    match ints.or(addons_phase(ctx, cluster, a)).await {
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
/// kube-system's node configuration, then the add-ons. Without --yes, the add-ons' preview.
pub(super) async fn addons_phase(
    ctx: &Ctx,
    cluster: &Cluster,
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    let name = cluster.name();
    if !a.yes {
        let args = super::addons::UpdateAddonsArgs {
            name,
            yes: false,
            kubeconfig: a.kubeconfig.as_deref(),
            force_conflicts: false,
            wait: Duration::from_secs(300),
            exit_code: a.exit_code,
            ssh_tunnel: false,
        };
        return super::addons::deploy(ctx, cluster, &args).await;
    }
    if let Err(e) = sync_node_config(ctx, cluster, a).await {
        ctx.printer.error(&format!(
            "the hosts of {name} are provisioned, but its node configuration in kube-system could not be written: {e:#}. Re-run `kprov update cluster {name} --yes` when the cause is fixed (or pass --skip-addons)"
        ));
        return Ok(exit::ERROR);
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

/// kube-system's `kubelet-config` and `kube-proxy` ConfigMaps from the spec
/// ([`crate::ops::node_config::sync`]), each rewrite said.
async fn sync_node_config(
    ctx: &Ctx,
    cluster: &Cluster,
    a: &UpdateClusterArgs,
) -> anyhow::Result<()> {
    let settings = crate::provision::render::NodeSettings::of(&cluster.spec)?;
    let (kube, _guard) =
        super::addons::cluster_client(ctx, cluster, a.kubeconfig.as_deref(), false).await?;
    let synced = crate::ops::node_config::sync(&kube, &settings)
        .await
        .map_err(anyhow::Error::msg)?;
    for cm in &synced.rewritten {
        ctx.printer.status(&format!(
            "ConfigMap {cm} rewritten from spec.kubelet/spec.kubeProxy: nodes joining now get it; running nodes get it with `kprov rolling-update cluster {}`.",
            cluster.name()
        ));
    }
    for cm in &synced.missing {
        ctx.printer.warn(&format!(
            "ConfigMap {cm} not found (kubeadm makes it at init): spec.kubelet/spec.kubeProxy not written there"
        ));
    }
    Ok(())
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
    if let Some(refusal) = crate::ops::platform::owned_elsewhere(name, plan, "host") {
        ctx.printer.error(&refusal);
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
pub async fn forget_host_key(
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
pub async fn release_host(
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
