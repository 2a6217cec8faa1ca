//! `rolling-update cluster` and `get instances`: the preview of a roll (kops's table per
//! group, then per node: replace, re-provision in place or leave alone, and why), from each
//! node's provisioning record compared with the spec.
//!
//! The platform (`ops::platform::Platform`) gives the machines the plan is made from and, for
//! `--yes`, the rollers (`ops::rolling_run`: in place on metal, replacing on AWS, with the
//! etcd backup before control planes roll and the validation gate's etcd check); this module
//! never asks which platform a cluster runs on. `--yes` runs the engine (`ops::rolling::run`)
//! under the cluster lock (`ops::session::Session::with_lock`) with the journal and
//! `KubeCluster` as the cluster side. Ctrl-C (or SIGTERM), caught from the moment the lock is
//! held, asks the engine to stop at a safe point (exit 130, or 143 for SIGTERM; lock
//! released); a second one exits at once. The AWS roller's waits (a replacement instance,
//! SSH, the new etcd member) end at the first one.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::commands::Ctx;
use super::exit;
use crate::kube::Kube;
use crate::nodes::journal::{Journal, JournalFile, NodeStep};
use crate::nodes::roll::{self, RollPlan, Selection};
use crate::ops::interrupt::{Caught, Interrupts};
use crate::ops::platform::{Platform, Reach};
use crate::ops::rolling as ops;
use crate::ops::rolling_run::{self, MachinesError, Preparing, Roll};
use crate::ops::session::Session;
use crate::output::{Format, Table, plural};
use crate::spec::{Cluster, InstanceGroup};
use crate::state::lock;

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

/// The cluster's API from stored credentials. One function, so moving the client into
/// `ops` (branch aws11) changes one line here.
/// The guard keeps what the client needs (a temporary kubeconfig, an SSH tunnel) alive.
async fn api(
    ctx: &Ctx,
    cluster: &Cluster,
    kubeconfig: Option<&Path>,
) -> anyhow::Result<(Kube, crate::ops::credentials::ClientGuard)> {
    super::addons::cluster_client(ctx, cluster, kubeconfig, false).await
}

/// Ready per node name, or why it is unknown.
async fn readiness(
    ctx: &Ctx,
    cluster: &Cluster,
    kubeconfig: Option<&Path>,
) -> Result<BTreeMap<String, bool>, String> {
    let ask = async {
        let (kube, _guard) = api(ctx, cluster, kubeconfig).await?;
        let nodes = kube.list_nodes().await?;
        Ok::<_, anyhow::Error>(nodes.into_iter().map(|n| (n.name, n.ready)).collect())
    };
    match tokio::time::timeout(Duration::from_secs(30), ask).await {
        Ok(Ok(m)) => Ok(m),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(_) => Err("the API did not answer within 30s".into()),
    }
}

struct Observation {
    plan: RollPlan,
    problems: Vec<String>,
    ready_error: Option<String>,
    /// Where the cluster runs, opened once for the preview and the run.
    platform: Platform,
}

async fn observe(
    ctx: &Ctx,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    selection: &Selection,
    kubeconfig: Option<&Path>,
    concurrency: usize,
    ssh_private_address: bool,
) -> anyhow::Result<Observation> {
    let repo = ctx.repo().await?;
    let reach = Reach {
        private_address: ssh_private_address,
    };
    let platform = Platform::open(repo.store(), cluster, groups, reach).await?;
    let machines = platform.roll_observe(repo.store(), concurrency).await?;
    let (ready, ready_error) = match readiness(ctx, cluster, kubeconfig).await {
        Ok(r) => (Some(r), None),
        Err(e) => (None, Some(e)),
    };
    let (plan, problems) = rolling_run::plan(cluster, groups, machines, ready.as_ref(), selection);
    Ok(Observation {
        plan,
        problems,
        ready_error,
        platform,
    })
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

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PreviewJson<'a> {
    #[serde(flatten)]
    plan: &'a RollPlan,
    problems: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_unknown: Option<&'a str>,
}

pub async fn cluster(ctx: &Ctx, a: &RollingUpdateClusterArgs) -> anyhow::Result<i32> {
    let (cluster, groups) = super::addons::resolved(ctx, &a.name).await?;
    let cluster = super::update::bundle_for_run(cluster, a.bundle.as_deref());
    // A tampered, truncated or incomplete bundle is refused before the preview, naming the
    // entry: no node is cordoned for a roll that could not install.
    crate::provision::render::check_bundle(&cluster)?;
    let name = cluster.name();
    let selection = Selection {
        groups: a.instance_groups.clone(),
        roles: roll::parse_roles(&a.instance_group_roles).map_err(anyhow::Error::msg)?,
        force: a.force,
    };
    let o = observe(
        ctx,
        &cluster,
        &groups,
        &selection,
        a.kubeconfig.as_deref(),
        a.concurrency,
        a.ssh_private_address,
    )
    .await?;
    let plan = &o.plan;
    match ctx.printer.format() {
        Format::Json => ctx
            .printer
            .data(&serde_json::to_string_pretty(&PreviewJson {
                plan,
                problems: &o.problems,
                ready_unknown: o.ready_error.as_deref(),
            })?),
        Format::Yaml => ctx.printer.data(&crate::output::to_yaml(plan)?),
        Format::Table => {
            ctx.printer.data(&groups_table(plan).render());
            ctx.printer.data("");
            ctx.printer.data(&nodes_table(plan).render());
        }
    }
    if let Some(e) = &o.ready_error {
        ctx.printer.warn(&format!(
            "READY is unknown: the cluster's API could not be asked: {e}"
        ));
    }
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
    let mut refusals = o.problems.clone();
    refusals.extend(plan.refusals.iter().cloned());
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
    let to_roll = plan.to_roll();
    if a.yes {
        // A journal left unfinished is resumed even when the preview finds nothing to roll:
        // its node in flight may still be cordoned.
        return roll(ctx, a, &cluster, &groups, plan, o.platform).await;
    }
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

/// `--yes`: under the cluster lock, the journal loaded (an unfinished roll is
/// resumed) or made from `plan`, and the engine run with the real cluster and machines.
async fn roll(
    ctx: &Ctx,
    a: &RollingUpdateClusterArgs,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    plan: &RollPlan,
    platform: Platform,
) -> anyhow::Result<i32> {
    let name = cluster.name();
    let session = Session::new(ctx.repo().await?.store().clone());
    // Ctrl-C is caught before the lock is taken, so none that comes while it is held can end
    // the process with the lock left behind: the first asks the roll to stop at a safe point
    // (then the lock is released), a second exits at once.
    let resume = format!("kprov rolling-update cluster {name} --yes");
    let ints = super::commands::catch_interrupts(name, &resume);
    let code = session
        .with_lock(name, "rolling-update cluster --yes", async |guard| {
            roll_locked(
                ctx, a, &session, cluster, groups, plan, platform, guard, &ints,
            )
            .await
        })
        .await?;
    if let Some(c) = ints.caught()
        && code == c.exit_code()
    {
        ctx.printer.status(&format!(
            "The lock of {name} is released. Resume with `{resume}`."
        ));
    }
    Ok(code)
}

#[allow(clippy::too_many_arguments)]
async fn roll_locked(
    ctx: &Ctx,
    a: &RollingUpdateClusterArgs,
    session: &Session,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    plan: &RollPlan,
    platform: Platform,
    guard: &lock::LockGuard,
    ints: &Interrupts,
) -> anyhow::Result<i32> {
    let cancel = ints.flag();
    let name = cluster.name();
    let store = session.store().clone();
    let (file, start) = rolling_run::start(store.as_ref(), name, plan, guard, a.cloud_only).await?;
    let journal = match start {
        rolling_run::Start::Resume(j) => {
            ctx.printer.status(&format!(
                "Resuming the roll of {name} started at {} by {}: {} of {} done.",
                j.started_at.to_rfc3339(),
                j.started_by,
                j.done(),
                plural(j.nodes.len(), "node")
            ));
            j
        }
        rolling_run::Start::New(j) => j,
        rolling_run::Start::NothingToRoll => {
            ctx.printer.success(&format!(
                "No rolling update needed: every node of {name} is up to date."
            ));
            return Ok(exit::OK);
        }
    };
    let cloud_only = a.cloud_only || journal.cloud_only;
    if cloud_only {
        ctx.printer.warn(
            "--cloudonly: nodes are re-provisioned WITHOUT cordoning, draining, waiting for \
             Ready or validating the cluster; pods on them are not moved first",
        );
    }
    let kube_client = if cloud_only {
        None
    } else {
        Some(api(ctx, cluster, a.kubeconfig.as_deref()).await?)
    };
    let kube = kube_client.as_ref().map(|(k, _)| k.clone());
    let names: Vec<String> = journal.nodes.iter().map(|n| n.node_name.clone()).collect();
    let (events, multi) = roll_events(ctx.printer.is_tty(), &names);
    // The machines: re-provisioned in place on metal, replaced through their group on AWS.
    // etcd's members are part of validation.
    let say = |p: Preparing| say_preparing(ctx, name, p);
    let rollers = platform
        .rollers(Roll {
            store: &store,
            groups,
            concurrency: a.concurrency,
            guard,
            kube: kube.clone(),
            journal: &journal,
            plan,
            events: events.clone(),
            interrupts: ints,
            say: &say,
        })
        .await;
    let rollers = match rollers {
        Ok(r) => r,
        Err(e @ MachinesError::Backup(_)) => {
            ctx.printer.error(&e.to_string());
            return Ok(exit::ERROR);
        }
        Err(e @ MachinesError::Interrupted(_)) => {
            ctx.printer.error(&e.to_string());
            return Ok(exit::INTERRUPTED);
        }
        Err(MachinesError::Other(e)) => return Err(e),
    };
    let etcd = Some(rollers.etcd.clone());
    let options = ops::RollOptions {
        drain_timeout: a.drain_timeout,
        validation_timeout: a.validation_timeout,
        validate_count: a.validate_count,
        cloud_only,
        ..ops::RollOptions::default()
    };
    let lock_check = || guard.check().map_err(|e| e.to_string());
    let result = match &kube {
        Some(kube) => {
            let api = ops::KubeCluster {
                kube: kube.clone(),
                cluster: cluster.clone(),
                expect: crate::addons::validate::Expectations::from_spec(cluster, groups)?,
                poll: Duration::from_secs(2),
                etcd: etcd.clone(),
            };
            ops::run(
                file,
                journal,
                &api,
                rollers.roller.as_ref(),
                &options,
                &events,
                cancel.clone(),
                &lock_check,
            )
            .await
        }
        None => {
            ops::run(
                file,
                journal,
                &rolling_run::NoApi,
                rollers.roller.as_ref(),
                &options,
                &events,
                cancel.clone(),
                &lock_check,
            )
            .await
        }
    };
    if let Some(m) = multi {
        let _ = m.clear();
    }
    // The gate's etcd check and the roller hold the fleet, which closes only once it is the
    // last.
    drop(etcd);
    rollers.close().await;
    let (_, last) = JournalFile::load(store.as_ref(), name).await?;
    if let Some(j) = &last {
        ctx.printer.data(&journal_table(j, cloud_only).render());
    }
    match result {
        Ok(j) => {
            ctx.printer.success(&format!(
                "Rolled {} of {} of {name}.",
                j.done(),
                plural(j.nodes.len(), "node")
            ));
            Ok(exit::OK)
        }
        Err(ops::RollError::Lock(e)) => {
            ctx.printer
                .error(&format!("the cluster lock was lost: {e}"));
            Ok(exit::ERROR)
        }
        Err(e @ ops::RollError::Interrupted(_)) => {
            ctx.printer.error(&e.to_string());
            Ok(ints.caught().unwrap_or(Caught::Interrupt).exit_code())
        }
        Err(e) => {
            ctx.printer.error(&e.to_string());
            Ok(exit::ERROR)
        }
    }
}

/// The etcd backup before control planes roll, as it happens.
fn say_preparing(ctx: &Ctx, name: &str, p: Preparing) {
    match p {
        Preparing::BackingUp { control_planes } => ctx.printer.status(&format!(
            "Backing up etcd of {name} before rolling {}.",
            control_planes.join(", ")
        )),
        Preparing::BackedUp(r) => ctx.printer.status(&format!(
            "etcd backed up from {} as {} ({} bytes, sha256 {}); `kprov restore etcd {name} --from {}` restores it.",
            r.host, r.id, r.size, r.sha256, r.id
        )),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InstanceRow {
    group: String,
    node: String,
    target: String,
    status: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    reasons: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ready: Option<bool>,
}

/// `get instances NAME`: every host with its group, status and Ready.
pub async fn get_instances(
    ctx: &Ctx,
    name: &str,
    kubeconfig: Option<&Path>,
) -> anyhow::Result<i32> {
    let (cluster, groups) = super::addons::resolved(ctx, name).await?;
    let o = observe(
        ctx,
        &cluster,
        &groups,
        &Selection::default(),
        kubeconfig,
        20,
        false,
    )
    .await?;
    let metal = o.plan.platform == roll::Platform::Metal;
    let mut rows = Vec::new();
    for g in &o.plan.groups {
        for n in &g.nodes {
            rows.push(InstanceRow {
                group: g.name.clone(),
                node: n.node_name.clone(),
                target: n.target.clone(),
                // A machine that does not answer is listed, never dropped: an instance as
                // unknown, a host as unreachable with the error (escaped: a host's words).
                status: match &n.unknown {
                    Some(_) if metal => "unreachable".into(),
                    Some(_) => "unknown".into(),
                    None if n.needs_update => "needs update".into(),
                    None => "up to date".into(),
                },
                reasons: match &n.unknown {
                    Some(why) if metal => vec![crate::output::escape(why).into_owned()],
                    _ => n.reasons.clone(),
                },
                ready: n.ready,
            });
        }
    }
    match ctx.printer.format() {
        Format::Json => ctx.printer.data(&serde_json::to_string_pretty(&rows)?),
        Format::Yaml => ctx.printer.data(&crate::output::to_yaml(&rows)?),
        Format::Table => {
            let mut t = Table::new(["ID", "NODE-NAME", "GROUP", "STATUS", "READY"]);
            for r in &rows {
                let status = if r.reasons.is_empty() {
                    r.status.clone()
                } else {
                    format!("{}: {}", r.status, r.reasons.join("; "))
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
    if let Some(e) = &o.ready_error {
        ctx.printer.warn(&format!(
            "READY is unknown: the cluster's API could not be asked: {e}"
        ));
    }
    for g in &o.plan.groups {
        for n in g.nodes.iter() {
            if let Some(why) = n.unknown.as_ref().filter(|_| metal) {
                ctx.printer.warn(&format!(
                    "{} ({}): unreachable, its state cannot be read: {}. `kprov rolling-update \
                     cluster {name}` refuses to run until it answers SSH again",
                    n.target,
                    n.node_name,
                    crate::output::untrusted(why),
                ));
            } else if let Some(why) = &n.unknown {
                ctx.printer.warn(&format!(
                    "{} ({}): unknown, its state cannot be read: {}. Replace it with `kprov \
                     rolling-update cluster {name} --instance-group {} --cloudonly --force \
                     --yes`, or remove it with `kprov delete instance {name} {} --cloudonly --yes`",
                    n.target,
                    n.node_name,
                    crate::output::untrusted(why),
                    g.name,
                    n.target
                ));
            }
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
