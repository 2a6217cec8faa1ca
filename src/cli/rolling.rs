//! `rolling-update cluster` and `get instances`: the preview of a roll (kops's table per
//! group, then per node: replace, re-provision in place or leave alone, and why), from each
//! node's provisioning record compared with the spec.
//!
//! `--yes` runs the engine (`ops::rolling::run`) under the cluster lock with the journal and
//! `KubeCluster` as the cluster side; the machines are `ops::rolling_metal::MetalRoller` on
//! metal and `ops::rolling_aws::AwsRoller` on AWS (`cli::rolling_aws`), chosen by the `match`
//! on the platform in [`cluster`]. On both the validation gate also asks etcd's members
//! ([`etcd_health`]). Ctrl-C (or SIGTERM), caught from the moment the lock is held, asks the
//! engine to stop at a safe point (exit 130, or 143 for SIGTERM; lock released); a second one
//! exits at once. The AWS roller's waits (a replacement instance, SSH, the new etcd member)
//! end at the first one.
//!
//! Both platforms re-provision control planes in place through [`in_place_roller`], which
//! backs etcd up first (a failed backup stops the roll before anything changed), and gives the
//! validation gate its etcd check over the same hosts or instances ([`etcd_health`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::commands::{Ctx, LOCK_LEASE};
use super::exit;
use crate::cloud::aws::instances::SshReach;
use crate::kube::Kube;
use crate::nodes::journal::{Journal, JournalFile, NodeStep};
use crate::nodes::roll::{self, Platform, RollAction, RollPlan, Selection};
use crate::nodes::{Inventory, TargetSource};
use crate::ops::interrupt::{Caught, Interrupts};
use crate::ops::nodes::NodeOptions;
use crate::ops::rolling as ops;
use crate::ops::rolling_aws;
use crate::output::{Format, Table, plural};
use crate::spec::{CloudProvider, Cluster, InstanceGroup};
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
    let options = NodeOptions {
        concurrency,
        ..NodeOptions::default()
    };
    let mut problems = Vec::new();
    let (observed, platform) = match cluster.spec.cloud_provider {
        CloudProvider::Metal => {
            let targets = Inventory {
                hosts: cluster.spec.hosts.clone(),
            }
            .targets()
            .await?;
            let observed = ops::observe(repo.store().clone(), cluster, &targets, &options).await?;
            (observed, Platform::Metal)
        }
        CloudProvider::Aws => {
            let reach = SshReach::of(cluster, ssh_private_address);
            let o = rolling_aws::observe(repo.store(), cluster, groups, reach, concurrency).await?;
            problems.extend(
                o.strays.iter().map(|s| {
                    format!("{s}: owned by the cluster but in none of its instance groups")
                }),
            );
            (o.observed, Platform::Aws)
        }
    };
    let (ready, ready_error) = match readiness(ctx, cluster, kubeconfig).await {
        Ok(r) => (Some(r), None),
        Err(e) => (None, Some(e)),
    };
    let (group_inputs, nodes, found) = ops::inputs(groups, &observed, ready.as_ref());
    problems.extend(found);
    let version = cluster
        .spec
        .kubernetes_version
        .clone()
        .unwrap_or_else(|| crate::spec::versions::DEFAULT_KUBERNETES_VERSION.to_string());
    let plan = roll::plan(
        cluster.name(),
        platform,
        crate::provision::assets::normalize_version(&version),
        &group_inputs,
        &nodes,
        selection,
    );
    Ok(Observation {
        plan,
        problems,
        ready_error,
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
        return roll(ctx, a, &cluster, &groups, plan).await;
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
) -> anyhow::Result<i32> {
    let name = cluster.name();
    let repo = ctx.repo().await?;
    let store = repo.store().clone();
    // Ctrl-C is caught before the lock is taken, so none that comes while it is held can end
    // the process with the lock left behind: the first asks the roll to stop at a safe point
    // (then the lock is released), a second exits at once.
    let resume = format!("kprov rolling-update cluster {name} --yes");
    let ints = super::commands::catch_interrupts(name, &resume);
    let guard = lock::acquire(
        store.clone(),
        name,
        "rolling-update cluster --yes",
        LOCK_LEASE,
    )
    .await?;
    let result = roll_locked(ctx, a, cluster, groups, plan, &guard, &ints).await;
    let released = guard.release().await;
    let code = result?;
    released?;
    if let Some(c) = ints.caught()
        && code == c.exit_code()
    {
        ctx.printer.status(&format!(
            "The lock of {name} is released. Resume with `{resume}`."
        ));
    }
    Ok(code)
}

async fn roll_locked(
    ctx: &Ctx,
    a: &RollingUpdateClusterArgs,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    plan: &RollPlan,
    guard: &lock::LockGuard,
    ints: &Interrupts,
) -> anyhow::Result<i32> {
    let cancel = ints.flag();
    let name = cluster.name();
    let repo = ctx.repo().await?;
    let store = repo.store().clone();
    let (file, existing) = JournalFile::load(store.as_ref(), name).await?;
    let journal = match existing {
        Some(j) if !j.finished => {
            ctx.printer.status(&format!(
                "Resuming the roll of {name} started at {} by {}: {} of {} done.",
                j.started_at.to_rfc3339(),
                j.started_by,
                j.done(),
                plural(j.nodes.len(), "node")
            ));
            j
        }
        _ => {
            if plan.to_roll() == 0 {
                ctx.printer.success(&format!(
                    "No rolling update needed: every node of {name} is up to date."
                ));
                return Ok(exit::OK);
            }
            let by = guard.record();
            Journal::new(plan, &format!("{}@{}", by.holder, by.host), a.cloud_only)
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
    // etcd's members are part of validation, asked over the in-place roller's fleet.
    let (roller, fleet, etcd): (Box<dyn ops::NodeRoller + '_>, _, _) =
        match cluster.spec.cloud_provider {
            CloudProvider::Metal => {
                let InPlace {
                    roller,
                    fleet,
                    etcd,
                } = match metal_roller(ctx, a, cluster, &store, &journal, kube.clone(), &cancel)
                    .await?
                {
                    Ok(in_place) => in_place,
                    Err(code) => return Ok(code),
                };
                (Box::new(roller), fleet, etcd)
            }
            CloudProvider::Aws => {
                let (roller, fleet, etcd) = match super::rolling_aws::aws_roller(
                    ctx,
                    a,
                    cluster,
                    groups,
                    store.clone(),
                    guard,
                    kube.clone(),
                    &journal,
                    plan,
                    events.clone(),
                    ints,
                )
                .await?
                {
                    Ok(r) => r,
                    Err(code) => return Ok(code),
                };
                (Box::new(roller), fleet, etcd)
            }
        };
    let etcd = Some(etcd);
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
                roller.as_ref(),
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
                &NoApi,
                roller.as_ref(),
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
    // Both hold the fleet, which closes only once it is the last.
    drop(etcd);
    drop(roller);
    if let Ok(f) = std::sync::Arc::try_unwrap(fleet) {
        f.close().await;
    }
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

/// The metal roller over the inventory's hosts, after etcd was backed up when a control plane
/// is about to roll. `Err(exit code)` when the run stopped before any node rolled (said).
async fn metal_roller(
    ctx: &Ctx,
    a: &RollingUpdateClusterArgs,
    cluster: &Cluster,
    store: &Arc<dyn crate::state::StateStore>,
    journal: &Journal,
    kube: Option<Kube>,
    cancel: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Result<InPlace, i32>> {
    let targets = Inventory {
        hosts: cluster.spec.hosts.clone(),
    }
    .targets()
    .await?;
    in_place_roller(ctx, a, cluster, store, journal, kube, targets, None, cancel).await
}

/// The in-place roller (`MetalRoller`) over `targets`: a metal inventory's hosts, or the
/// instances an AWS roll found (with the cloud's API endpoint, as `update cluster` renders
/// them). Before it is handed out, etcd is backed up when a control plane is about to roll and
/// a version roll brings the image archives to every host; `Err(exit code)` when the run
/// stopped there (said; nothing was rolled): the backup failed, staging failed or Ctrl-C
/// (`cancel`) came while staging.
#[allow(clippy::too_many_arguments)]
pub(super) async fn in_place_roller(
    ctx: &Ctx,
    a: &RollingUpdateClusterArgs,
    cluster: &Cluster,
    store: &Arc<dyn crate::state::StateStore>,
    journal: &Journal,
    kube: Option<Kube>,
    targets: Vec<crate::nodes::Target>,
    cloud_api: Option<&crate::provision::render::CloudApi>,
    cancel: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Result<InPlace, i32>> {
    let name = cluster.name();
    let owner = crate::nodes::owner::read(store.as_ref(), name)
        .await?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{name} has no ownership record in the state store: provision it with `kprov update cluster {name} --yes` first"
            )
        })?;
    let renderer = crate::provision::render::Renderer::for_run(cluster, &targets, cloud_api)?;
    let fleet = crate::ops::nodes::fleet(
        cluster,
        &targets,
        store.clone(),
        false,
        a.concurrency,
        &crate::ops::nodes::no_events(),
    )?;
    let fleet = std::sync::Arc::new(fleet);
    if !backup_before_control_planes(ctx, cluster, store, journal, &targets, fleet.as_ref()).await {
        fleet.close().await;
        return Ok(Err(exit::ERROR));
    }
    let etcd = etcd_health(cluster, &targets, fleet.clone());
    let roller = crate::ops::rolling_metal::MetalRoller::new(
        fleet.clone(),
        renderer,
        targets,
        owner,
        kube.clone(),
    );
    if journal.nodes.iter().any(|n| n.upgrade.is_some()) {
        match roller.stage_images(cancel.clone()).await {
            Ok(()) => {}
            Err(crate::ops::rolling_metal::Staging::Failed(e)) => {
                fleet.close().await;
                anyhow::bail!("{e}; no node was rolled");
            }
            Err(crate::ops::rolling_metal::Staging::Interrupted) => {
                drop(roller);
                drop(etcd);
                if let Ok(f) = Arc::try_unwrap(fleet) {
                    f.close().await;
                }
                ctx.printer.error(&format!(
                    "interrupted while bringing the image archives to the hosts: no node was \
                     rolled; `kprov rolling-update cluster {name} --yes` starts the roll again \
                     (archives already imported are not brought twice)"
                ));
                return Ok(Err(exit::INTERRUPTED));
            }
        }
    }
    Ok(Ok(InPlace {
        roller,
        fleet,
        etcd,
    }))
}

/// The in-place roller with what comes with it: the SSH fleet it uses (the caller closes it)
/// and the validation gate's etcd check over the same hosts or instances.
pub(super) struct InPlace {
    pub roller: crate::ops::rolling_metal::MetalRoller,
    pub fleet: Arc<crate::ssh::SshFleet>,
    pub etcd: Arc<dyn ops::EtcdHealth>,
}

/// etcd is backed up before any control plane rolls (kubeadm's upgrade guide asks for it), on
/// metal and AWS alike: false when the backup failed (an unhealthy etcd among them), said, so
/// the roll stops before anything changed. True when no control plane waits to roll.
async fn backup_before_control_planes(
    ctx: &Ctx,
    cluster: &Cluster,
    store: &Arc<dyn crate::state::StateStore>,
    journal: &Journal,
    targets: &[crate::nodes::Target],
    exec: &dyn crate::ssh::task::HostExecutor,
) -> bool {
    let name = cluster.name();
    let control_planes_to_roll = control_planes_to_roll(journal, targets);
    if control_planes_to_roll.is_empty() {
        return true;
    }
    ctx.printer.status(&format!(
        "Backing up etcd of {name} before rolling {}.",
        control_planes_to_roll.join(", ")
    ));
    let record =
        crate::ops::etcd::backup(store.as_ref(), cluster, targets, exec, chrono::Utc::now()).await;
    match record {
        Ok(r) => {
            ctx.printer.status(&format!(
                "etcd backed up from {} as {} ({} bytes, sha256 {}); `kprov restore etcd {name} --from {}` restores it.",
                r.host, r.id, r.size, r.sha256, r.id
            ));
            true
        }
        Err(e) => {
            ctx.printer.error(&format!(
                "the etcd backup before the control-plane roll failed, so nothing was rolled: {e:#}"
            ));
            false
        }
    }
}

/// The control planes of `targets` the journal has yet to start rolling.
fn control_planes_to_roll<'j>(
    journal: &'j Journal,
    targets: &[crate::nodes::Target],
) -> Vec<&'j str> {
    journal
        .nodes
        .iter()
        .filter(|n| n.step == NodeStep::Waiting && n.action != RollAction::Leave)
        .filter(|n| {
            targets
                .iter()
                .any(|t| t.name() == n.target && t.is_control_plane())
        })
        .map(|n| n.node_name.as_str())
        .collect()
}

/// The validation gate's etcd check over the fleet that reaches the cluster's etcd members
/// (metal hosts, or AWS control planes: the same call).
pub(crate) fn etcd_health(
    cluster: &Cluster,
    targets: &[crate::nodes::Target],
    fleet: Arc<crate::ssh::SshFleet>,
) -> Arc<dyn ops::EtcdHealth> {
    Arc::new(crate::ops::etcd::SshEtcdHealth {
        cluster: cluster.clone(),
        targets: targets.to_vec(),
        exec: fleet,
    })
}

/// The cluster side under `--cloudonly`: the engine never calls it (it skips cordon, drain,
/// Ready and validation); anything that does gets an error, not a pretend success.
struct NoApi;

#[async_trait::async_trait]
impl ops::ClusterApi for NoApi {
    async fn taint_prefer_no_schedule(&self, node: &str) -> Result<(), String> {
        Err(format!(
            "{node}: --cloudonly does not use the cluster's API"
        ))
    }
    async fn cordon(&self, node: &str) -> Result<(), String> {
        Err(format!(
            "{node}: --cloudonly does not use the cluster's API"
        ))
    }
    async fn drain(&self, node: &str, _: Duration) -> Result<(), String> {
        Err(format!(
            "{node}: --cloudonly does not use the cluster's API"
        ))
    }
    async fn wait_ready(&self, node: &str, _: Duration) -> Result<(), String> {
        Err(format!(
            "{node}: --cloudonly does not use the cluster's API"
        ))
    }
    async fn uncordon(&self, node: &str) -> Result<(), String> {
        Err(format!(
            "{node}: --cloudonly does not use the cluster's API"
        ))
    }
    async fn validate(&self) -> Result<(), String> {
        Err("--cloudonly does not use the cluster's API".into())
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
    let mut rows = Vec::new();
    for g in &o.plan.groups {
        for n in &g.nodes {
            rows.push(InstanceRow {
                group: g.name.clone(),
                node: n.node_name.clone(),
                target: n.target.clone(),
                status: if n.needs_update {
                    "needs update".into()
                } else {
                    "up to date".into()
                },
                reasons: n.reasons.clone(),
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
