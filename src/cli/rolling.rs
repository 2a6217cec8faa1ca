//! `rolling-update cluster` and `get instances`: the flags read into
//! `ops::rolling_update::RollingOptions`, the preview printed (kops's table per group, then per
//! node: replace, re-provision in place or leave alone, and why), and with `--yes` the roll
//! (`RollingUpdate::apply`) under `Session::with_lock`, its progress (a spinner line per node
//! on a terminal, plain lines otherwise), the journal and the exit code from how it ended.
//! Every decision (the platform, the rollers, the etcd backup, the journal) is in `ops`.
//!
//! Ctrl-C (or SIGTERM), caught before the lock is taken, asks the engine to stop at a safe
//! point (exit 130, or 143 for SIGTERM; lock released); a second one exits at once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use super::commands::Ctx;
use super::exit;
use crate::nodes::journal::{Journal, NodeStep};
use crate::nodes::roll::{self, RollPlan, Selection};
use crate::ops::interrupt::{Caught, Interrupts};
use crate::ops::rolling::{self as ops, RollError};
use crate::ops::rolling_run::{MachinesError, Preparing};
use crate::ops::rolling_update::{
    self as ops_roll, RollingError, RollingEvent, RollingOptions, RollingPlan, RollingReport,
    RollingUpdate,
};
use crate::ops::session::Session;
use crate::output::{Format, Table, plural};

#[derive(Debug, Args, Clone)]
pub struct RollingUpdateClusterArgs {
    pub name: String,
    /// Roll (without it: preview only)
    #[arg(long, short)]
    pub yes: bool,
    /// Exit 2 when something would roll
    #[arg(long)]
    pub exit_code: bool,
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// Only these instance groups (repeat, or comma-separated)
    #[arg(long = "instance-group", value_delimiter = ',', value_name = "GROUP")]
    pub instance_groups: Vec<String>,
    /// Only groups of these roles: Bastion, ControlPlane (or Master), Node
    #[arg(
        long = "instance-group-roles",
        value_delimiter = ',',
        value_name = "ROLE"
    )]
    pub instance_group_roles: Vec<String>,
    /// Roll every selected node, up to date or not
    #[arg(long)]
    pub force: bool,
    /// Give up on a node's drain after this long; the roll stops, the node stays cordoned
    #[arg(long, value_parser = super::addons::parse_duration, default_value = "15m")]
    pub drain_timeout: Duration,
    /// How long the cluster may take to pass validation after each batch
    #[arg(long, value_parser = super::addons::parse_duration, default_value = "15m")]
    pub validation_timeout: Duration,
    /// Consecutive validation passes needed after each batch
    #[arg(long, default_value_t = 2)]
    pub validate_count: u32,
    /// Replace without draining or validating (for a cluster whose API is down)
    #[arg(long = "cloudonly", visible_alias = "cloud-only")]
    pub cloud_only: bool,
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    #[arg(long, default_value_t = 20)]
    pub concurrency: usize,
    /// AWS: reach instances at their private addresses (as `update cluster --ssh-private-address`)
    #[arg(long)]
    pub ssh_private_address: bool,
    /// Upload every binary and image from this bundle (`kprov create bundle`), as
    /// `update cluster --bundle` does: checked in full before the preview (air-gapped sites)
    #[arg(long, value_name = "FILE")]
    pub bundle: Option<PathBuf>,
}

fn groups_table(plan: &RollPlan) -> Table {
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

fn nodes_table(plan: &RollPlan) -> Table {
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

impl RollingUpdateClusterArgs {
    fn options(&self) -> anyhow::Result<RollingOptions> {
        Ok(RollingOptions {
            selection: Selection {
                groups: self.instance_groups.clone(),
                roles: roll::parse_roles(&self.instance_group_roles).map_err(anyhow::Error::msg)?,
                force: self.force,
            },
            drain_timeout: self.drain_timeout,
            validation_timeout: self.validation_timeout,
            validate_count: self.validate_count,
            cloud_only: self.cloud_only,
            kubeconfig: self.kubeconfig.clone(),
            concurrency: self.concurrency,
            ssh_private_address: self.ssh_private_address,
            bundle: self.bundle.clone(),
        })
    }
}

/// The roll opened on the stored cluster and its preview made (the API's route shown at
/// debug level, READY's absence warned of after the data).
async fn planned(
    ctx: &Ctx,
    name: &str,
    options: RollingOptions,
) -> anyhow::Result<(RollingUpdate, RollingPlan)> {
    let (cluster, groups) = super::addons::resolved(ctx, name).await?;
    let store = ctx.repo().await?.store().clone();
    let roll = ops_roll::open(store, cluster, groups, options)
        .await
        .map_err(failed)?;
    let plan = roll.plan().await.map_err(failed)?;
    if let Some(route) = &plan.route {
        ctx.printer.debug(route);
    }
    Ok((roll, plan))
}

fn warn_ready_unknown(ctx: &Ctx, plan: &RollingPlan) {
    if let Some(e) = &plan.ready_unknown {
        ctx.printer.warn(&format!(
            "READY is unknown: the cluster's API could not be asked: {e}"
        ));
    }
}

/// An ops error as the command reports it: its cause kept as it is, so that the exit code
/// (`exit_code_of`: 4 for a held lock) reads it.
fn failed(e: RollingError) -> anyhow::Error {
    match e {
        RollingError::Lock(e) => e.into(),
        RollingError::Other(e) => e,
        e => e.into(),
    }
}

pub(super) async fn cluster(ctx: &Ctx, a: &RollingUpdateClusterArgs) -> anyhow::Result<i32> {
    let (roll, o) = planned(ctx, &a.name, a.options()?).await?;
    let name = roll.cluster().name().to_string();
    let plan = &o.plan;
    match ctx.printer.format() {
        Format::Json => ctx.printer.data(&serde_json::to_string_pretty(&o)?),
        Format::Yaml => ctx.printer.data(&crate::output::to_yaml(plan)?),
        Format::Table => {
            ctx.printer.data(&groups_table(plan).render());
            ctx.printer.data("");
            ctx.printer.data(&nodes_table(plan).render());
        }
    }
    warn_ready_unknown(ctx, &o);
    if let Some(v) = &plan.version {
        ctx.printer.status(&format!(
            "Kubernetes {} -> {}: control planes first{}, then the kubelets.",
            v.from.join(", "),
            v.to,
            v.apply_on
                .as_deref()
                .map(|c| format!(" (`kubeadm upgrade apply` on {c})"))
                .unwrap_or_default()
        ));
    }
    let refusals = o.refusals();
    if !refusals.is_empty() {
        for r in &refusals {
            ctx.printer.error(r);
        }
        ctx.printer.error(&format!(
            "the roll of {name} cannot start as planned ({} above); nothing was changed",
            plural(refusals.len(), "problem")
        ));
        return Ok(exit::ERROR);
    }
    if a.yes {
        // A journal left unfinished is resumed even when the preview finds nothing to roll.
        return apply(ctx, &name, roll, plan).await;
    }
    let to_roll = plan.to_roll();
    if to_roll == 0 {
        ctx.printer.success(&format!(
            "No rolling update needed: every node of {name} is up to date."
        ));
        return Ok(exit::OK);
    }
    ctx.printer.status(&format!(
        "{} would roll. Must specify --yes to rolling-update.",
        plural(to_roll, "node")
    ));
    Ok(if a.exit_code {
        exit::CHANGES_PENDING
    } else {
        exit::OK
    })
}

/// Renders the roll's events: on a terminal one line per node (its step or what it is
/// doing, and the time since that line started), validation above them; otherwise plain
/// lines naming the node, its step and the seconds since the roll started.
fn roll_events(tty: bool, nodes: &[String]) -> (ops::RollEvents, Option<MultiProgress>) {
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
    let multi = MultiProgress::new();
    let style = ProgressStyle::with_template("{spinner} {prefix:<16} {wide_msg} {elapsed:>4}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let bars: HashMap<String, ProgressBar> = nodes
        .iter()
        .map(|n| {
            let bar = multi.add(ProgressBar::new_spinner());
            bar.set_style(style.clone());
            bar.set_prefix(n.clone());
            bar.set_message("waiting");
            bar.enable_steady_tick(Duration::from_millis(120));
            (n.clone(), bar)
        })
        .collect();
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

fn journal_table(j: &Journal, cloud_only: bool) -> Table {
    let mut t = Table::new(["NODE", "GROUP", "ACTION", "STEP", "NOTE"]);
    for n in &j.nodes {
        t.row([
            n.node_name.clone(),
            n.group.clone(),
            n.action.as_str().to_string(),
            shown_step(n.step, cloud_only).to_string(),
            n.stopped.clone().unwrap_or_default(),
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

/// `--yes`: [`RollingUpdate::apply`] under the cluster lock, its events and report printed.
async fn apply(ctx: &Ctx, name: &str, roll: RollingUpdate, plan: &RollPlan) -> anyhow::Result<i32> {
    let session = Session::new(ctx.repo().await?.store().clone());
    // Ctrl-C is caught before the lock is taken, so none that comes while it is held can end
    // the process with the lock left behind: the first asks the roll to stop at a safe point
    // (then the lock is released), a second exits at once.
    let resume = format!("kprov rolling-update cluster {name} --yes");
    let ints = super::commands::catch_interrupts(name, &resume);
    let multi = std::sync::Mutex::new(None);
    let say = |e: RollingEvent<'_>| say(ctx, name, e);
    let events = |j: &Journal| {
        let names: Vec<String> = j.nodes.iter().map(|n| n.node_name.clone()).collect();
        let (events, bars) = roll_events(ctx.printer.is_tty(), &names);
        *multi.lock().unwrap_or_else(|p| p.into_inner()) = bars;
        events
    };
    let code = session
        .with_lock(name, "rolling-update cluster --yes", async |guard| {
            let report = roll.apply(plan, guard, &ints, &say, events).await;
            if let Some(m) = multi.lock().unwrap_or_else(|p| p.into_inner()).take() {
                let _ = m.clear();
            }
            report_code(ctx, name, report, &ints)
        })
        .await
        .map_err(failed)?;
    if let Some(c) = ints.caught()
        && code == c.exit_code()
    {
        ctx.printer.status(&format!(
            "The lock of {name} is released. Resume with `{resume}`."
        ));
    }
    Ok(code)
}

/// The report printed (the journal as stored, then how the roll ended) and its exit code.
fn report_code(
    ctx: &Ctx,
    name: &str,
    report: Result<RollingReport, RollingError>,
    ints: &Interrupts,
) -> Result<i32, RollingError> {
    let ran = match report {
        Ok(RollingReport::NothingToRoll) => {
            ctx.printer.success(&format!(
                "No rolling update needed: every node of {name} is up to date."
            ));
            return Ok(exit::OK);
        }
        Ok(RollingReport::Ran(ran)) => ran,
        Err(RollingError::Machines(e @ MachinesError::Backup(_))) => {
            ctx.printer.error(&e.to_string());
            return Ok(exit::ERROR);
        }
        Err(RollingError::Machines(e @ MachinesError::Interrupted(_))) => {
            ctx.printer.error(&e.to_string());
            return Ok(exit::INTERRUPTED);
        }
        Err(RollingError::Machines(MachinesError::Other(e))) => return Err(e.into()),
        Err(e) => return Err(e),
    };
    if let Some(j) = &ran.stored {
        ctx.printer.data(&journal_table(j, ran.cloud_only).render());
    }
    Ok(match ran.outcome {
        Ok(j) => {
            ctx.printer.success(&format!(
                "Rolled {} of {} of {name}.",
                j.done(),
                plural(j.nodes.len(), "node")
            ));
            exit::OK
        }
        Err(RollError::Lock(e)) => {
            ctx.printer
                .error(&format!("the cluster lock was lost: {e}"));
            exit::ERROR
        }
        Err(e @ RollError::Interrupted(_)) => {
            ctx.printer.error(&e.to_string());
            ints.caught().unwrap_or(Caught::Interrupt).exit_code()
        }
        Err(e) => {
            ctx.printer.error(&e.to_string());
            exit::ERROR
        }
    })
}

/// What happens before the engine runs, as it happens.
fn say(ctx: &Ctx, name: &str, e: RollingEvent<'_>) {
    match e {
        RollingEvent::Resuming(j) => ctx.printer.status(&format!(
            "Resuming the roll of {name} started at {} by {}: {} of {} done.",
            j.started_at.to_rfc3339(),
            j.started_by,
            j.done(),
            plural(j.nodes.len(), "node")
        )),
        RollingEvent::CloudOnly => ctx.printer.warn(
            "--cloudonly: nodes are re-provisioned WITHOUT cordoning, draining, waiting for \
             Ready or validating the cluster; pods on them are not moved first",
        ),
        RollingEvent::Route(route) => ctx.printer.debug(route),
        RollingEvent::Preparing(Preparing::BackingUp { control_planes }) => {
            ctx.printer.status(&format!(
                "Backing up etcd of {name} before rolling {}.",
                control_planes.join(", ")
            ))
        }
        RollingEvent::Preparing(Preparing::BackedUp(r)) => ctx.printer.status(&format!(
            "etcd backed up from {} as {} ({} bytes, sha256 {}); `kprov restore etcd {name} --from {}` restores it.",
            r.host, r.id, r.size, r.sha256, r.id
        )),
    }
}

/// `get instances NAME`: every host with its group, status and Ready.
pub(super) async fn get_instances(
    ctx: &Ctx,
    name: &str,
    kubeconfig: Option<&Path>,
) -> anyhow::Result<i32> {
    let options = RollingOptions {
        kubeconfig: kubeconfig.map(Path::to_path_buf),
        ..RollingOptions::default()
    };
    let (_, o) = planned(ctx, name, options).await?;
    let rows = o.instances();
    match ctx.printer.format() {
        Format::Json => ctx.printer.data(&serde_json::to_string_pretty(&rows)?),
        Format::Yaml => ctx.printer.data(&crate::output::to_yaml(&rows)?),
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
            ctx.printer.data(&t.render());
        }
    }
    warn_ready_unknown(ctx, &o);
    for r in &rows {
        if let Some(why) = r.unknown.as_ref().filter(|_| r.unreachable_host) {
            ctx.printer.warn(&format!(
                "{} ({}): unreachable, its state cannot be read: {}. `kprov rolling-update \
                 cluster {name}` refuses to run until it answers SSH again",
                r.target,
                r.node,
                crate::output::untrusted(why),
            ));
        } else if let Some(why) = &r.unknown {
            ctx.printer.warn(&format!(
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
        ctx.printer.error(p);
    }
    Ok(if o.problems.is_empty() {
        exit::OK
    } else {
        exit::ERROR
    })
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
