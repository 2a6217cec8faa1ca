//! The node plan and the node layer's progress and report, as every platform's commands
//! print them (`update cluster`, `delete cluster`'s resets): the plan table, a spinner line
//! per host on a terminal (plain lines otherwise), the report table and its verdict.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use crate::nodes::Target;
use crate::ops::hostkeys::ForgetPlan;
use crate::ops::instance::Release;
use crate::ops::node_config::Synced;
use crate::ops::nodes::{AdminKubeconfig, Events, NodeEvent, NodeReport};
use crate::ops::update::{AddonsError, roles};
use crate::output::{Format, Printer, Table, plural, sanitize_lines, untrusted};
use crate::provision::orchestrate::{HostResult, ProgressEvent, Report};
use crate::provision::plan::NodePlan;
use crate::spec::Host;

/// A spinner line per name (`waiting` until its first event), under one [`MultiProgress`].
pub(super) fn spinners(
    names: impl Iterator<Item = String>,
) -> (MultiProgress, HashMap<String, ProgressBar>) {
    let multi = MultiProgress::new();
    let style = ProgressStyle::with_template("{spinner} {prefix:<16} {wide_msg} {elapsed:>4}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let bars = names
        .map(|name| {
            let bar = multi.add(ProgressBar::new_spinner());
            bar.set_style(style.clone());
            bar.set_prefix(name.clone());
            bar.set_message("waiting");
            bar.enable_steady_tick(Duration::from_millis(120));
            (name, bar)
        })
        .collect();
    (multi, bars)
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
pub(crate) fn node_events(
    printer: &Printer,
    targets: &[Target],
) -> (Events, Option<MultiProgress>) {
    let tty = printer.is_tty();
    let printer = Printer::new(Format::Table, printer.verbosity());
    if !tty {
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
    let (multi, bars) = spinners(targets.iter().map(|t| t.name().to_string()));
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

pub(crate) fn report_table(report: &Report) -> Table {
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
pub(crate) fn warn_gone(printer: &Printer, name: &str, gone: &[Host]) {
    for h in gone {
        printer.warn(&format!(
            "{} ({}) is no longer in the spec but kprov provisioned it: it is still in the \
             cluster (to remove). Remove it with `kprov delete instance {name} {}`",
            h.name, h.address, h.name
        ));
    }
}

/// After converging, on every platform: the report table, each failure named, the admin
/// kubeconfig checked. False (never a silent success) when a host did not converge or the
/// credentials were not stored.
pub(crate) fn node_report(printer: &Printer, name: &str, nodes: &NodeReport) -> bool {
    let report = &nodes.report;
    printer.data(&report_table(report).render());
    if !report.success() {
        for h in &report.hosts {
            if let HostResult::Failed { phase, error, .. } = &h.result {
                // The error names the host (and step, and remote stderr) itself.
                printer.error(&format!("[{}] {error}", phase.as_str()));
            }
        }
        let failed = report
            .hosts
            .iter()
            .filter(|h| h.result != HostResult::Ok)
            .count();
        printer.error(&format!(
            "{failed} of {} of {name} did not converge; fix the cause and re-run `kprov update cluster {name} --yes` (it resumes)",
            plural(report.hosts.len(), "host")
        ));
        return false;
    }
    if let AdminKubeconfig::NotFetched(why) = &nodes.admin_kubeconfig {
        printer.error(&format!(
            "the hosts of {name} converged but its admin kubeconfig could not be stored: {why}"
        ));
        return false;
    }
    if report.changed() == 0 {
        printer.success(&format!(
            "No changes: {} of {name} {} converged.",
            match report.hosts.len() {
                1 => "the 1 host".to_string(),
                n => format!("all {n} hosts"),
            },
            if report.hosts.len() == 1 { "is" } else { "are" }
        ));
    } else {
        printer.success(&format!(
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
        printer.status(&format!(
            "{} of {name} {} left alone and pending a rolling update ({}): preview it with `kprov rolling-update cluster {name}`, apply it with `--yes`.",
            plural(pending.len(), "running member"),
            if pending.len() == 1 { "was" } else { "were" },
            pending.iter().map(|h| h.host.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    true
}

/// What writing kube-system's node configuration changed: said whether or not the add-ons
/// after it succeeded (running nodes need a roll to get it).
pub(crate) fn node_config(printer: &Printer, name: &str, synced: &Synced) {
    for cm in &synced.rewritten {
        printer.status(&format!(
            "ConfigMap {cm} rewritten from spec.kubelet/spec.kubeProxy: nodes joining now get it; running nodes get it with `kprov rolling-update cluster {name}`."
        ));
    }
    for cm in &synced.missing {
        printer.warn(&format!(
            "ConfigMap {cm} not found (kubeadm makes it at init): spec.kubelet/spec.kubeProxy not written there"
        ));
    }
}

pub(crate) fn plan_table(plan: &NodePlan) -> Table {
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

/// `delete cluster`'s preview of a metal cluster's hosts (`ops::delete`'s plan).
pub(crate) fn reset_preview(name: &str, hosts: &[Host], dropped: &[String]) -> String {
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

/// `forget host-key` without `--yes`.
pub(crate) fn forget_preview(printer: &Printer, plan: &ForgetPlan) {
    printer.status(&format!(
        "Would forget the host keys {} recorded for {} (as {}). Must specify --yes.",
        plan.cluster,
        plan.host,
        untrusted(&plan.pattern)
    ));
}

/// `forget host-key --yes`: how many keys it removed.
pub(crate) fn forgotten(printer: &Printer, plan: &ForgetPlan, removed: usize) {
    let (cluster, host) = (&plan.cluster, &plan.host);
    if removed == 0 {
        printer.status(&format!(
            "{cluster} had no host key recorded for {host} (as {}): nothing to forget.",
            untrusted(&plan.pattern)
        ));
    } else {
        printer.success(&format!(
            "Forgot {removed} host key(s) of {host} (as {}). The next `kprov update cluster {cluster} \
             --yes --accept-new-host-keys` records its current key; check its fingerprint first.",
            untrusted(&plan.pattern)
        ));
    }
}

/// `release host`'s outcome; false when it was refused.
pub(crate) fn released(printer: &Printer, cluster: &str, host: &str, outcome: &Release) -> bool {
    let host = untrusted(host);
    match outcome {
        Release::NotClaimed => {
            printer.status(&format!(
                "{host} carries no kprov ownership marker: nothing to release."
            ));
        }
        Release::Refused(why) => {
            printer.error(&untrusted(why).to_string());
            return false;
        }
        Release::Gone { owner, done: false } => {
            printer.status(&format!(
                "{host} is held by {}, which the state store no longer has. Must specify --yes \
                 to reset it (kubeadm reset, kprov's files and marker removed).",
                untrusted(&owner.describe())
            ));
        }
        Release::Gone { owner, done: true } => {
            printer.success(&format!(
                "Released {host}: reset, it no longer carries the marker of {}. `kprov update \
                 cluster {cluster} --yes` can now provision it.",
                untrusted(&owner.describe())
            ));
        }
    }
    true
}

/// The hosts are provisioned and the add-ons left alone: `--phase nodes` (`skipped`: false)
/// or `--skip-addons` (true), and how to deploy them.
pub(crate) fn addons_left(printer: &Printer, name: &str, skipped: bool) {
    printer.status(&if skipped {
        format!(
            "Add-ons and the node configuration in kube-system (ConfigMaps kubelet-config, kube-proxy) skipped (--skip-addons); deploy them with `kprov update addons {name} --yes` and `kprov update cluster {name} --yes`."
        )
    } else {
        format!(
            "--phase nodes: add-ons and kube-system's node configuration left alone; next: `kprov update cluster {name} --yes --phase addons`."
        )
    });
}

/// The hosts are provisioned but the node configuration or the add-ons failed: what was
/// written, the error, how to retry.
pub(crate) fn addons_failed(printer: &Printer, name: &str, e: &AddonsError) {
    match e {
        AddonsError::NodeConfig(e) => printer.error(&format!(
            "the hosts of {name} are provisioned, but its node configuration in kube-system could not be written: {e:#}. Re-run `kprov update cluster {name} --yes` when the cause is fixed (or pass --skip-addons)"
        )),
        AddonsError::Addons {
            node_config: synced,
            error,
        } => {
            node_config(printer, name, synced);
            printer.error(&format!(
                "the hosts of {name} are provisioned, but deploying the add-ons failed: {error:#}. \
                 Retry with `kprov update addons {name} --yes` when the cause is fixed \
                 (or pass --skip-addons)"
            ));
        }
    }
}
