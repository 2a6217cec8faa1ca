//! `rolling-update cluster`'s and `get instances`' views: kops's table per group, then per
//! node (replace, re-provision in place or leave alone, and why), the roll's progress (a
//! spinner line per node on a terminal, plain lines otherwise), the journal and how it ended.

use std::sync::Arc;

use indicatif::MultiProgress;

use super::Shown;
use crate::nodes::journal::{Journal, NodeStep};
use crate::nodes::roll::{self, RollPlan};
use crate::ops::platform::rolling::{MachinesError, Preparing};
use crate::ops::rolling::{self as ops, RollError};
use crate::ops::rolling_update::{RollingError, RollingEvent, RollingPlan, RollingReport};
use crate::output::{Format, Printer, Table, plural};

/// The preview of `rolling-update cluster`: the groups' and nodes' tables (or the plan's
/// document), READY's absence, the version change, the refusals (false: the roll cannot start).
pub(crate) fn preview(printer: &Printer, name: &str, o: &RollingPlan) -> anyhow::Result<bool> {
    let plan = &o.plan;
    match printer.format() {
        Format::Json => printer.data(&serde_json::to_string_pretty(o)?),
        Format::Yaml => printer.data(&crate::output::to_yaml(plan)?),
        Format::Table => {
            printer.data(&groups_table(plan).render());
            printer.data("");
            printer.data(&nodes_table(plan).render());
        }
    }
    warn_ready_unknown(printer, o);
    if let Some(v) = &plan.version {
        printer.status(&format!(
            "Kubernetes {} -> {}: control planes first{}, then the kubelets.",
            v.from.join(", "),
            v.to,
            v.apply_on
                .as_deref()
                .map(|c| format!(" (`kubeadm upgrade apply` on {c})"))
                .unwrap_or_default() // no control plane to name: no suffix
        ));
    }
    let refusals = o.refusals();
    if !refusals.is_empty() {
        for r in &refusals {
            printer.error(r);
        }
        printer.error(&format!(
            "the roll of {name} cannot start as planned ({} above); nothing was changed",
            plural(refusals.len(), "problem")
        ));
        return Ok(false);
    }
    Ok(true)
}

/// What a `--yes` would roll (up to date, or pending).
pub(crate) fn to_roll(printer: &Printer, name: &str, plan: &RollPlan) -> Shown {
    let to_roll = plan.to_roll();
    if to_roll == 0 {
        printer.success(&format!(
            "No rolling update needed: every node of {name} is up to date."
        ));
        return Shown::UpToDate;
    }
    printer.status(&format!(
        "{} would roll. Must specify --yes to rolling-update.",
        plural(to_roll, "node")
    ));
    Shown::Pending
}

pub(crate) fn warn_ready_unknown(printer: &Printer, plan: &RollingPlan) {
    if let Some(e) = &plan.ready_unknown {
        printer.warn(&format!(
            "READY is unknown: the cluster's API could not be asked: {e}"
        ));
    }
}

pub(crate) fn groups_table(plan: &RollPlan) -> Table {
    let mut t = Table::new([
        "NAME",
        "STATUS",
        "NEEDUPDATE",
        "READY",
        "MIN",
        "TARGET",
        "MAX",
        "NODES",
    ]);
    for g in &plan.groups {
        t.row([
            g.name.clone(),
            g.status().to_string(),
            g.need_update().to_string(),
            g.ready().map_or_else(|| "?".to_string(), |n| n.to_string()),
            g.min.to_string(),
            g.target.to_string(),
            g.max.to_string(),
            g.nodes.len().to_string(),
        ]);
    }
    t
}

pub(crate) fn nodes_table(plan: &RollPlan) -> Table {
    let mut t = Table::new(["NODE", "GROUP", "ACTION", "WHY"]);
    for g in &plan.groups {
        for n in &g.nodes {
            let mut action = n.action.as_str().to_string();
            if let Some(u) = n.upgrade {
                action.push_str(match u {
                    roll::Upgrade::Apply => " (kubeadm upgrade apply)",
                    roll::Upgrade::Node => " (kubeadm upgrade node)",
                });
            }
            let why = if n.reasons.is_empty() {
                "up to date".to_string()
            } else {
                n.reasons.join("; ")
            };
            t.row([n.node_name.clone(), g.name.clone(), action, why]);
        }
    }
    t
}

/// Renders the roll's events: on a terminal one line per node (its step or what it is
/// doing, and the time since that line started), validation above them; otherwise plain
/// lines naming the node, its step and the seconds since the roll started.
pub(crate) fn roll_events(tty: bool, nodes: &[String]) -> (ops::RollEvents, Option<MultiProgress>) {
    let printer = crate::output::Printer::new(Format::Table, 0);
    let start = std::time::Instant::now();
    if !tty {
        let events: ops::RollEvents = Arc::new(move |e: &ops::RollEvent| {
            let t = start.elapsed().as_secs();
            match e {
                ops::RollEvent::Step { node, step, .. } => {
                    printer.status(&format!("{node}: {} ({t}s)", step.as_str()))
                }
                ops::RollEvent::Working { node, what } => {
                    printer.status(&format!("{node}: {what} ({t}s)"))
                }
                ops::RollEvent::Gate { .. } | ops::RollEvent::Note(_) => {
                    printer.status(&format!("{} ({t}s)", gate_line(e)))
                }
            }
        });
        return (events, None);
    }
    let (multi, bars) = super::nodes::spinners(nodes.iter().cloned());
    let above = multi.clone();
    let events: ops::RollEvents = Arc::new(move |e: &ops::RollEvent| match e {
        ops::RollEvent::Step { node, step, .. } => {
            if let Some(bar) = bars.get(node) {
                if *step == crate::nodes::journal::NodeStep::Validated {
                    bar.finish_with_message("validated");
                } else {
                    bar.set_message(step.as_str().to_string());
                }
            }
        }
        ops::RollEvent::Working { node, what } => {
            if let Some(bar) = bars.get(node) {
                // indicatif writes to the terminal itself: the printer's backstop by hand.
                bar.set_message(crate::output::sanitize_lines(what).into_owned());
            }
        }
        ops::RollEvent::Gate { .. } | ops::RollEvent::Note(_) => {
            let _ = above.println(crate::output::sanitize_lines(&gate_line(e)));
        }
    });
    (events, Some(multi))
}

fn gate_line(e: &ops::RollEvent) -> String {
    match e {
        ops::RollEvent::Gate {
            passes,
            needed,
            error: None,
        } => format!("validation: {passes}/{needed} passed"),
        ops::RollEvent::Gate {
            error: Some(err), ..
        } => format!("validation: not yet ({err})"),
        ops::RollEvent::Note(n) => n.clone(),
        other => format!("{other:?}"),
    }
}

pub(crate) fn journal_table(j: &Journal, cloud_only: bool) -> Table {
    let mut t = Table::new(["NODE", "GROUP", "ACTION", "STEP", "NOTE"]);
    for n in &j.nodes {
        t.row([
            n.node_name.clone(),
            n.group.clone(),
            n.action.as_str().to_string(),
            shown_step(n.step, cloud_only).to_string(),
            n.stopped.clone().unwrap_or_default(), // not stopped: nothing to note
        ]);
    }
    t
}

/// A node's step as the table says it. Under `--cloudonly` nothing is cordoned, drained or
/// validated: the journal's steps past them are bookkeeping, and the table must not claim
/// them.
fn shown_step(step: NodeStep, cloud_only: bool) -> &'static str {
    match (cloud_only, step) {
        (false, s) => s.as_str(),
        (true, NodeStep::Waiting | NodeStep::Cordoned | NodeStep::Drained) => {
            "not replaced yet (--cloudonly: no drain)"
        }
        (true, NodeStep::Replaced | NodeStep::Uncordoned) => "replaced",
        (true, NodeStep::Validated) => "replaced (--cloudonly: cluster not checked)",
    }
}

/// How a roll ended, for the command's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Rolled, or nothing to roll.
    Rolled,
    /// Refused or failed (said as an error).
    Failed,
    /// Interrupted before the engine ran (its preparation).
    Interrupted,
    /// The engine stopped at a safe point for a signal.
    Stopped,
}

/// The report printed (the journal as stored, then how the roll ended); the errors it does
/// not say are returned.
pub(crate) fn report(
    printer: &Printer,
    name: &str,
    report: Result<RollingReport, RollingError>,
) -> Result<Ended, RollingError> {
    let ran = match report {
        Ok(RollingReport::NothingToRoll) => {
            printer.success(&format!(
                "No rolling update needed: every node of {name} is up to date."
            ));
            return Ok(Ended::Rolled);
        }
        Ok(RollingReport::Ran(ran)) => ran,
        Err(RollingError::Machines(e @ MachinesError::Backup(_))) => {
            printer.error(&e.to_string());
            return Ok(Ended::Failed);
        }
        Err(RollingError::Machines(e @ MachinesError::Interrupted(_))) => {
            printer.error(&e.to_string());
            return Ok(Ended::Interrupted);
        }
        Err(RollingError::Machines(MachinesError::Other(e))) => return Err(e.into()),
        Err(e) => return Err(e),
    };
    if let Some(j) = &ran.stored {
        printer.data(&journal_table(j, ran.cloud_only).render());
    }
    Ok(match ran.outcome {
        Ok(j) => {
            printer.success(&format!(
                "Rolled {} of {} of {name}.",
                j.done(),
                plural(j.nodes.len(), "node")
            ));
            Ended::Rolled
        }
        Err(RollError::Lock(e)) => {
            printer.error(&format!("the cluster lock was lost: {e}"));
            Ended::Failed
        }
        Err(e @ RollError::Interrupted(_)) => {
            printer.error(&e.to_string());
            Ended::Stopped
        }
        Err(e) => {
            printer.error(&e.to_string());
            Ended::Failed
        }
    })
}

/// What happens before the engine runs, as it happens.
pub(crate) fn say(printer: &Printer, name: &str, e: RollingEvent<'_>) {
    match e {
        RollingEvent::Resuming(j) => printer.status(&format!(
            "Resuming the roll of {name} started at {} by {}: {} of {} done.",
            j.started_at.to_rfc3339(),
            j.started_by,
            j.done(),
            plural(j.nodes.len(), "node")
        )),
        RollingEvent::CloudOnly => printer.warn(
            "--cloudonly: nodes are re-provisioned WITHOUT cordoning, draining, waiting for \
             Ready or validating the cluster; pods on them are not moved first",
        ),
        RollingEvent::Route(route) => printer.debug(route),
        RollingEvent::Preparing(Preparing::BackingUp { control_planes }) => {
            printer.status(&format!(
                "Backing up etcd of {name} before rolling {}.",
                control_planes.join(", ")
            ))
        }
        RollingEvent::Preparing(Preparing::BackedUp(r)) => printer.status(&format!(
            "etcd backed up from {} as {} ({} bytes, sha256 {}); `kprov restore etcd {name} --from {}` restores it.",
            r.host, r.id, r.size, r.sha256, r.id
        )),
    }
}

/// `get instances`: every machine with its group, status and Ready, the unknown ones
/// warned of, the problems as errors (false: there are some).
pub(crate) fn instances(printer: &Printer, name: &str, o: &RollingPlan) -> anyhow::Result<bool> {
    let rows = o.instances();
    match printer.format() {
        Format::Json => printer.data(&serde_json::to_string_pretty(&rows)?),
        Format::Yaml => printer.data(&crate::output::to_yaml(&rows)?),
        Format::Table => {
            let mut t = Table::new(["ID", "NODE-NAME", "GROUP", "STATUS", "READY"]);
            for r in &rows {
                let status = match r.reasons.is_empty() {
                    true => r.status.to_string(),
                    false => format!("{}: {}", r.status, r.reasons.join("; ")),
                };
                let ready = match r.ready {
                    Some(true) => "True",
                    Some(false) => "False",
                    None => "?",
                };
                t.row([
                    r.target.clone(),
                    r.node.clone(),
                    r.group.clone(),
                    status,
                    ready.to_string(),
                ]);
            }
            printer.data(&t.render());
        }
    }
    warn_ready_unknown(printer, o);
    for r in &rows {
        if let Some(why) = r.unknown.as_ref().filter(|_| r.unreachable_host) {
            printer.warn(&format!(
                "{} ({}): unreachable, its state cannot be read: {}. `kprov rolling-update \
                 cluster {name}` refuses to run until it answers SSH again",
                r.target,
                r.node,
                crate::output::untrusted(why),
            ));
        } else if let Some(why) = &r.unknown {
            printer.warn(&format!(
                "{} ({}): unknown, its state cannot be read: {}. Replace it with `kprov \
                 rolling-update cluster {name} --instance-group {} --cloudonly --force \
                 --yes`, or remove it with `kprov delete instance {name} {} --cloudonly --yes`",
                r.target,
                r.node,
                crate::output::untrusted(why),
                r.group,
                r.target
            ));
        }
    }
    for p in &o.problems {
        printer.error(p);
    }
    Ok(o.problems.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cloudonly_never_shows_a_drain_or_a_validation() {
        let all = [
            NodeStep::Waiting,
            NodeStep::Cordoned,
            NodeStep::Drained,
            NodeStep::Replaced,
            NodeStep::Uncordoned,
            NodeStep::Validated,
        ];
        for step in all {
            let shown = shown_step(step, true);
            for claim in ["cordoned", "drained", "uncordoned", "validated"] {
                assert!(
                    !shown.split([' ', '(', ')', ':']).any(|w| w == claim),
                    "{step:?} shown as {shown:?}"
                );
            }
            assert_eq!(shown_step(step, false), step.as_str());
        }
    }
}
