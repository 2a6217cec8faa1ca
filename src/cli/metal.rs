//! Bare-metal clusters: `update cluster` provisions the inventory's hosts over SSH with
//! kubeadm (`provision::orchestrate`), `delete cluster` resets them.
//!
//! The preview (no `--yes`) is read-only on hosts and in the store: it connects only to hosts
//! whose keys the cluster already recorded, reads whether each host is a member
//! (`kubelet.conf`) or an initialised control plane (`admin.conf`), compares the hashes of the
//! files kprov keeps on members, and lists the phases `--yes` would run. It never runs a
//! step's `check` (some checks write, e.g. preflight records facts) and never records a host
//! key.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use futures::future::join_all;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde::Serialize;

use super::commands::{ADMIN_KUBECONFIG_SECRET, Ctx, LOCK_LEASE};
use super::{UpdateClusterArgs, exit};
use crate::output::{Format, Printer, Table};
use crate::provision::orchestrate::{self, Facts, HostResult, Options, ProgressEvent, Report};
use crate::provision::render::{self, Renderer};
use crate::spec::{Cluster, Host, HostRole, InstanceGroup};
use crate::ssh::task::{ExecError, HostExecutor};
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

fn is_control_plane(h: &Host) -> bool {
    h.roles.contains(&HostRole::ControlPlane)
}

/// What the read-only look at a host found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// Not (yet) a cluster member.
    New,
    /// kubelet.conf present; `initialised` when it is a control plane holding admin.conf.
    /// `drift`: `step: path` of files that differ from what kprov would write.
    Member {
        initialised: bool,
        drift: Vec<String>,
    },
    /// The cluster has no recorded key for it: kprov never provisioned it.
    UnknownKey,
    /// Could not be inspected (unreachable, changed host key, ...).
    Unreachable(String),
}

/// One row of the preview.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedHost {
    pub host: String,
    pub roles: Vec<HostRole>,
    pub state: String,
    /// Phases `--yes` runs on the host, in order.
    pub phases: Vec<String>,
    /// Files on a member that differ from what kprov would write (`step: path`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<String>,
    /// Whether `--yes` would change the host (it joins, files drifted, or it could not be
    /// inspected).
    pub pending: bool,
}

/// Decides the phases per host from what was observed, the way `orchestrate::provision` does:
/// every host gets preflight and install (both check before acting); the first control plane
/// is initialised if none is; members only re-check their settled state; others join.
pub fn plan(hosts: &[Host], observed: &[Observed]) -> Vec<PlannedHost> {
    let initialised = observed.iter().any(|o| {
        matches!(
            o,
            Observed::Member {
                initialised: true,
                ..
            }
        )
    });
    // The control plane `kubeadm init` would run on: the first one not known to be broken.
    let init_on = if initialised {
        None
    } else {
        hosts
            .iter()
            .zip(observed)
            .find(|(h, o)| is_control_plane(h) && !matches!(o, Observed::Unreachable(_)))
            .map(|(h, _)| h.name.as_str())
    };
    hosts
        .iter()
        .zip(observed)
        .map(|(h, o)| {
            let joins = is_control_plane(h) || h.roles.contains(&HostRole::Node);
            let mut phases = vec!["preflight".to_string(), "install".to_string()];
            let (state, pending) = match o {
                Observed::Member { initialised, drift } => (
                    match (*initialised, drift.len()) {
                        (true, 0) => "initialised control plane".to_string(),
                        (false, 0) => "member".to_string(),
                        (true, n) => format!("initialised control plane, {n} files differ"),
                        (false, n) => format!("member, {n} files differ"),
                    },
                    !drift.is_empty(),
                ),
                Observed::New => ("new".to_string(), true),
                Observed::UnknownKey => (
                    "new (host key not recorded yet: needs --accept-new-host-keys)".to_string(),
                    true,
                ),
                Observed::Unreachable(why) => (format!("cannot inspect: {why}"), true),
            };
            if !joins {
                phases.push("etcd".into());
            } else if matches!(o, Observed::Member { .. }) {
                phases.push("settle (re-check)".into());
            } else if init_on == Some(h.name.as_str()) {
                phases.push("init".into());
            } else if is_control_plane(h) {
                phases.push("join control plane".into());
            } else {
                phases.push("join worker".into());
            }
            PlannedHost {
                host: h.name.clone(),
                roles: h.roles.clone(),
                state,
                phases,
                drift: match o {
                    Observed::Member { drift, .. } => drift.clone(),
                    _ => Vec::new(),
                },
                pending,
            }
        })
        .collect()
}

/// Reads, without changing anything, whether `h` is a member of the cluster and, if it is,
/// which of the files kprov keeps on members (preflight, install, settle) differ.
async fn observe(fleet: &SshFleet, renderer: &Renderer, h: &Host) -> Observed {
    let read = |path: &'static str| fleet.read_file(&h.name, path);
    let member = match read(render::KUBELET_CONF).await {
        Ok(f) => f.is_some(),
        Err(ExecError::UnknownHostKey { .. }) => return Observed::UnknownKey,
        Err(e) => return Observed::Unreachable(e.to_string()),
    };
    let initialised = if is_control_plane(h) {
        match read(render::ADMIN_CONF).await {
            Ok(f) => f.is_some(),
            Err(e) => return Observed::Unreachable(e.to_string()),
        }
    } else {
        false
    };
    if !member && !initialised {
        return Observed::New;
    }
    match member_drift(fleet, renderer, h).await {
        Ok(drift) => Observed::Member { initialised, drift },
        Err(e) => Observed::Unreachable(e),
    }
}

async fn member_drift(
    fleet: &SshFleet,
    renderer: &Renderer,
    h: &Host,
) -> Result<Vec<String>, String> {
    let facts = fleet
        .read_file(&h.name, render::FACTS_FILE)
        .await
        .map_err(|e| e.to_string())?
        .map(|b| Facts::parse(&String::from_utf8_lossy(&b)))
        .unwrap_or_default();
    let arch = facts
        .arch()
        .ok_or_else(|| format!("no usable facts in {}", render::FACTS_FILE))?;
    let mut steps = renderer.preflight(h).map_err(|e| e.to_string())?;
    steps.extend(renderer.install(arch).map_err(|e| e.to_string())?);
    steps.extend(renderer.settle(h).map_err(|e| e.to_string())?);
    let differing = fleet
        .differing_files(&h.name, &steps)
        .await
        .map_err(|e| e.to_string())?;
    Ok(differing
        .into_iter()
        .flat_map(|(step, paths)| paths.into_iter().map(move |p| format!("{step}: {p}")))
        .collect())
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
fn progress(ctx: &Ctx, hosts: &[Host]) -> (orchestrate::Progress, Option<MultiProgress>) {
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
            bar.set_prefix(h.name.clone());
            bar.set_message("waiting");
            bar.enable_steady_tick(Duration::from_millis(120));
            (h.name.clone(), bar)
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

async fn provision(
    ctx: &Ctx,
    cluster: &Cluster,
    store: Arc<dyn StateStore>,
    a: &UpdateClusterArgs,
    guard: &lock::LockGuard,
) -> anyhow::Result<Report> {
    let hosts = &cluster.spec.hosts;
    let (events, bars) = progress(ctx, hosts);
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
        let report = orchestrate::provision(&fleet, cluster, hosts, &options)
            .await
            .context("provisioning")?;
        if report
            .hosts
            .iter()
            .any(|h| is_control_plane_report(hosts, &h.host) && h.result == HostResult::Ok)
        {
            match orchestrate::admin_kubeconfig(&fleet, cluster, hosts).await {
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

fn is_control_plane_report(hosts: &[Host], name: &str) -> bool {
    hosts.iter().any(|h| h.name == name && is_control_plane(h))
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

async fn preview(
    ctx: &Ctx,
    cluster: &Cluster,
    store: Arc<dyn StateStore>,
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    let name = cluster.name();
    let hosts = &cluster.spec.hosts;
    // Never records keys: the preview writes nothing, not even known hosts.
    let fleet = fleet(cluster, store, false, a.concurrency, None)?;
    let renderer = Renderer::new(cluster, hosts).context("rendering the hosts' steps")?;
    let observed = join_all(hosts.iter().map(|h| observe(&fleet, &renderer, h))).await;
    fleet.close().await;
    let planned = plan(hosts, &observed);
    match ctx.printer.format() {
        Format::Json => ctx.printer.data(&serde_json::to_string_pretty(&planned)?),
        Format::Yaml => ctx.printer.data(&serde_saphyr::to_string(&planned)?),
        Format::Table => {
            let mut t = Table::new(["HOST", "ROLES", "STATE", "PHASES"]);
            for p in &planned {
                let host = hosts.iter().find(|h| h.name == p.host);
                t.row([
                    p.host.clone(),
                    host.map(roles).unwrap_or_default(),
                    p.state.clone(),
                    p.phases.join(", "),
                ]);
            }
            ctx.printer.data(&t.render());
        }
    }
    let pending: Vec<&str> = planned
        .iter()
        .filter(|p| p.pending)
        .map(|p| p.host.as_str())
        .collect();
    if pending.is_empty() {
        ctx.printer.status(&format!(
            "Every host of {name} is a member; `--yes` re-checks each step and changes only what drifted."
        ));
        return Ok(exit::OK);
    }
    ctx.printer.status(&format!(
        "{} of {} hosts need provisioning ({}). Must specify --yes to provision {name}.",
        pending.len(),
        planned.len(),
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
            "Will reset {} hosts of {name} (kubeadm reset; /etc/kubernetes, /var/lib/kubelet, /var/lib/etcd, /var/lib/kprov removed):\n{}",
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
    let (events, bars) = progress(ctx, hosts);
    let fleet = fleet(cluster, repo.store().clone(), false, 20, bars.clone())?;
    let options = Options {
        progress: Some(events),
        ..Options::current()
    };
    let report = orchestrate::reset(&fleet, cluster, hosts, &options).await;
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
            _ => {}
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
    ctx.printer
        .success(&format!("Reset {} hosts of {name}.", report.hosts.len()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, roles: &[HostRole]) -> Host {
        Host {
            name: name.into(),
            address: format!("{name}.lab"),
            ip: None,
            access_ip: None,
            user: None,
            port: None,
            key_path: None,
            bastion: None,
            roles: roles.to_vec(),
            labels: Default::default(),
            taints: vec![],
        }
    }

    fn hosts() -> Vec<Host> {
        vec![
            host("cp1", &[HostRole::ControlPlane]),
            host("cp2", &[HostRole::ControlPlane]),
            host("w1", &[HostRole::Node]),
        ]
    }

    fn last_phases(p: &[PlannedHost]) -> Vec<(&str, &str, bool)> {
        p.iter()
            .map(|p| {
                (
                    p.host.as_str(),
                    p.phases.last().map(String::as_str).unwrap_or(""),
                    p.pending,
                )
            })
            .collect()
    }

    #[test]
    fn fresh_cluster_initialises_the_first_control_plane_and_joins_the_rest() {
        let p = plan(
            &hosts(),
            &[Observed::New, Observed::New, Observed::UnknownKey],
        );
        assert_eq!(
            last_phases(&p),
            [
                ("cp1", "init", true),
                ("cp2", "join control plane", true),
                ("w1", "join worker", true)
            ]
        );
    }

    #[test]
    fn unreachable_first_control_plane_moves_init_to_the_next() {
        let p = plan(
            &hosts(),
            &[
                Observed::Unreachable("no route".into()),
                Observed::New,
                Observed::New,
            ],
        );
        assert_eq!(p[1].phases.last().unwrap(), "init");
        assert!(p[0].state.contains("no route"));
    }

    #[test]
    fn converged_cluster_has_nothing_pending_and_a_new_host_joins() {
        let p = plan(
            &hosts(),
            &[
                Observed::Member {
                    initialised: true,
                    drift: vec![],
                },
                Observed::Member {
                    initialised: false,
                    drift: vec![],
                },
                Observed::Member {
                    initialised: false,
                    drift: vec![],
                },
            ],
        );
        assert!(p.iter().all(|p| !p.pending));
        assert!(
            p.iter()
                .all(|p| p.phases.last().unwrap() == "settle (re-check)")
        );

        let mut more = hosts();
        more.push(host("w2", &[HostRole::Node]));
        let p = plan(
            &more,
            &[
                Observed::Member {
                    initialised: true,
                    drift: vec![],
                },
                Observed::Member {
                    initialised: false,
                    drift: vec![],
                },
                Observed::Member {
                    initialised: false,
                    drift: vec![],
                },
                Observed::New,
            ],
        );
        assert_eq!(last_phases(&p)[3], ("w2", "join worker", true));
        assert!(p[..3].iter().all(|p| !p.pending));
    }

    #[test]
    fn a_member_with_drifted_files_is_pending_and_says_which() {
        let drift = vec!["containerd: configure: /etc/containerd/config.toml".to_string()];
        let p = plan(
            &hosts(),
            &[
                Observed::Member {
                    initialised: true,
                    drift: vec![],
                },
                Observed::Member {
                    initialised: false,
                    drift: vec![],
                },
                Observed::Member {
                    initialised: false,
                    drift: drift.clone(),
                },
            ],
        );
        assert_eq!(
            last_phases(&p),
            [
                ("cp1", "settle (re-check)", false),
                ("cp2", "settle (re-check)", false),
                ("w1", "settle (re-check)", true)
            ]
        );
        assert_eq!(p[2].drift, drift);
        assert_eq!(p[2].state, "member, 1 files differ");
    }
}
