//! `kprov update cluster NAME`: the preview, and with `--yes` the apply, of everything the
//! spec asks for: cloud resources (aws), nodes over SSH (metal), then the add-ons.

use anyhow::Context;

use super::commands::Ctx;
use super::commands::LOCK_LEASE;
use super::{UpdateClusterArgs, exit};
use crate::cloud::aws::instances::{self, AwsInstances, SshReach};
use crate::cloud::aws::{AwsCloud, hostkeys, wait};
use crate::cloud::engine::{self, ApplyOptions, RenderOptions};
use crate::nodes::plan::NodePlan;
use crate::ops::nodes::{self as ops, NodeOptions};
use crate::output::Format;
use crate::spec::{CloudProvider, Cluster, InstanceGroup};
use crate::state::lock;

pub async fn cluster(ctx: &Ctx, a: &UpdateClusterArgs) -> anyhow::Result<i32> {
    let (cluster, groups) = super::addons::resolved(ctx, &a.name).await?;
    match cluster.spec.cloud_provider {
        CloudProvider::Aws => aws(ctx, &cluster, &groups, a).await,
        CloudProvider::Metal => super::metal::update(ctx, &cluster, &groups, a).await,
    }
}

/// SDK clients in the cluster's region; credentials and endpoint come from the usual chain
/// (environment, profiles, SSO, instance roles; `AWS_ENDPOINT_URL` for emulators).
pub(super) async fn aws_cloud(cluster: &Cluster) -> anyhow::Result<AwsCloud> {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(region) = &cluster.spec.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    let sdk = loader.load().await;
    Ok(AwsCloud::new(&sdk, cluster.name(), &[]))
}

/// The cloud plan; `-o json|yaml` documents also carry the node plan of the running instances
/// as `nodePlan` (docs/plan-json.md), absent while no instance runs.
fn print_plan(
    ctx: &Ctx,
    plan: &engine::Plan,
    nodes: Option<&NodePlan>,
    prune: bool,
) -> anyhow::Result<()> {
    let document = || -> anyhow::Result<serde_json::Value> {
        let mut doc = serde_json::to_value(plan)?;
        if let (Some(n), Some(map)) = (nodes, doc.as_object_mut()) {
            map.insert("nodePlan".into(), serde_json::to_value(n)?);
        }
        Ok(doc)
    };
    match ctx.printer.format() {
        Format::Json => ctx
            .printer
            .data(&serde_json::to_string_pretty(&document()?)?),
        Format::Yaml => ctx.printer.data(&serde_saphyr::to_string(&document()?)?),
        Format::Table => ctx.printer.data(&engine::render_text(
            plan,
            RenderOptions {
                color: ctx.printer.color(),
                prune,
            },
        )),
    }
    Ok(())
}

async fn aws(
    ctx: &Ctx,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    let repo = ctx.repo().await?;
    let group_names: Vec<&str> = groups.iter().map(|g| g.metadata.name.as_str()).collect();
    if !a.yes {
        // Read-only: a group without a host key shows it as pending; none is generated.
        let keys = hostkeys::load(repo.store().as_ref(), cluster.name(), &group_names)
            .await
            .context("reading the instance groups' host keys")?;
        let cloud = aws_cloud(cluster).await?.with_host_keys(keys);
        let plan = cloud
            .plan(cluster, groups)
            .await
            .context("planning cloud resources")?;
        let table = ctx.printer.format() == Format::Table;
        if table {
            // On a terminal the cloud plan shows even when the instances cannot be read.
            print_plan(ctx, &plan, None, a.prune)?;
        }
        if let Err(e) = plan.check() {
            if !table {
                print_plan(ctx, &plan, None, a.prune)?;
            }
            return Err(anyhow::Error::new(e).context("planning cloud resources"));
        }
        let cloud_pending = plan.exit_code(a.prune) == exit::CHANGES_PENDING;
        let nodes = preview_nodes(ctx, &cloud, cluster, groups, &plan, a).await?;
        if !table {
            print_plan(ctx, &plan, nodes.as_ref(), a.prune)?;
        }
        let nodes_pending = nodes.as_ref().is_some_and(|n| !n.pending().is_empty());
        let pending = cloud_pending || nodes_pending;
        if pending {
            ctx.printer.status(&format!(
                "Must specify --yes to apply changes to {}.",
                cluster.name()
            ));
        }
        return Ok(if pending && a.exit_code {
            exit::CHANGES_PENDING
        } else {
            exit::OK
        });
    }
    let store = repo.store().clone();
    let name = cluster.name();
    let guard = lock::acquire(store.clone(), name, "update cluster --yes", LOCK_LEASE).await?;
    let result = aws_apply(ctx, cluster, groups, a, &guard).await;
    let released = guard.release().await;
    let outcome = result?;
    released?;
    match outcome {
        AwsOutcome::Nodes(nodes) => super::metal::finish(ctx, cluster, &nodes, a).await,
        AwsOutcome::Failed(code) => Ok(code),
    }
}

enum AwsOutcome {
    Nodes(Box<ops::NodeReport>),
    Failed(i32),
}

/// Under the cluster lock: the cloud apply, then the instances found, their expected host
/// keys recorded, waited for (bounded) and converged through the node layer metal uses.
async fn aws_apply(
    ctx: &Ctx,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    a: &UpdateClusterArgs,
    guard: &lock::LockGuard,
) -> anyhow::Result<AwsOutcome> {
    let repo = ctx.repo().await?;
    let store = repo.store().clone();
    let name = cluster.name();
    let group_names: Vec<&str> = groups.iter().map(|g| g.metadata.name.as_str()).collect();
    // Generated (once, compare-and-swap) before any launch template is written.
    let keys = hostkeys::ensure(store.as_ref(), name, &group_names)
        .await
        .context("generating the instance groups' host keys")?;
    let cloud = aws_cloud(cluster).await?.with_host_keys(keys.clone());
    apply_cloud(ctx, &cloud, cluster, groups, a).await?;
    guard.check()?;
    // Read again after the apply: the load balancer's DNS name exists only now.
    let after = cloud
        .plan(cluster, groups)
        .await
        .context("reading cloud resources after the apply")?;
    let Some(lb) = instances::load_balancer_dns(&after) else {
        anyhow::bail!(
            "the API load balancer of {name} has no DNS name yet; re-run `kprov update cluster {name} --yes`"
        );
    };
    let reach = SshReach::of(cluster, a.ssh_private_address);
    let found = AwsInstances::new(&cloud, groups, reach)
        .through(instances::jump_name(cluster, &after))
        .discover()
        .await
        .context("finding the cluster's instances")?;
    for s in &found.strays {
        ctx.printer.warn(&format!(
            "{s}: owned by {name} but in no instance group; not provisioned"
        ));
    }
    let targets = found.targets;
    if targets.is_empty() {
        ctx.printer.error(&format!(
            "no running instance of {name} was found; nothing was provisioned (are the groups' minSize 0?)"
        ));
        return Ok(AwsOutcome::Failed(exit::ERROR));
    }
    // kprov generated the host keys: the first connection is checked strictly against them.
    let mut expected = hostkeys::expected_known_hosts(&targets, &keys)
        .await
        .map_err(anyhow::Error::msg)?;
    expected.extend(
        hostkeys::expected_known_hosts(&found.jump_hosts, &keys)
            .await
            .map_err(anyhow::Error::msg)?,
    );
    let conflicts = crate::ssh::record_expected_keys(&store, name, &expected)
        .await
        .map_err(anyhow::Error::msg)
        .context("recording the instances' host keys")?;
    if !conflicts.is_empty() {
        // Neither key is trusted silently: the operator decides which one is right.
        for c in &conflicts {
            ctx.printer.error(&c.to_string());
        }
        return Ok(AwsOutcome::Failed(exit::ERROR));
    }
    let printer = crate::output::Printer::new(Format::Table, 0);
    let on_wait = move |e: wait::WaitEvent| match e {
        wait::WaitEvent::Waiting { instance, last } => {
            printer.status(&format!("{instance}: waiting for SSH ({last})"))
        }
        wait::WaitEvent::Answering { instance, banner } => {
            printer.status(&format!("{instance}: answering ({banner})"))
        }
        wait::WaitEvent::Deferred { instance } => {
            printer.status(&format!("{instance}: reached through the bastion"))
        }
    };
    // Nodes behind the bastion are waited for by the jump itself; the way in (the bastion's
    // name, where the user's ssh config sends it) is waited for here.
    let mut waited = targets.clone();
    if reach == SshReach::Bastion
        && let Some(jump) = found.jump_hosts.first()
    {
        let mut j = jump.clone();
        let (hostname, port) =
            crate::ssh::destination(&j.host.address, j.host.user.as_deref(), j.host.port)
                .await
                .map_err(anyhow::Error::msg)?;
        j.host.name = format!("bastion {}", j.host.address);
        j.host.address = hostname;
        j.host.port = Some(port);
        waited.push(j);
    }
    if let Err(late) = wait::wait_for_ssh(
        &waited,
        SSH_WAIT,
        std::time::Duration::from_secs(2),
        &on_wait,
    )
    .await
    {
        for (instance, last) in &late {
            ctx.printer.error(&format!(
                "{instance}: not answering SSH after {}s: {last}",
                SSH_WAIT.as_secs()
            ));
        }
    }
    guard.check()?;
    let options = NodeOptions {
        accept_new_host_keys: a.accept_new_host_keys,
        concurrency: a.concurrency,
        cloud_api: Some(instances::cloud_api(cluster, &lb)),
    };
    let (events, bars) = super::metal::render_events(ctx, &targets);
    let result = ops::converge(store, cluster, &targets, guard, &options, &events).await;
    if let Some(bars) = bars {
        let _ = bars.clear();
    }
    Ok(AwsOutcome::Nodes(Box::new(result?)))
}

/// The node plan of the running instances, read-only: only instances whose host key the
/// store holds are contacted (read-only checks); the others are listed as joining. Printed
/// as a table on a terminal (documents carry it in the plan). None before the load balancer
/// and instances exist.
async fn preview_nodes(
    ctx: &Ctx,
    cloud: &AwsCloud,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    cloud_plan: &engine::Plan,
    a: &UpdateClusterArgs,
) -> anyhow::Result<Option<NodePlan>> {
    let Some(lb) = instances::load_balancer_dns(cloud_plan) else {
        return Ok(None);
    };
    let reach = SshReach::of(cluster, a.ssh_private_address);
    let found = AwsInstances::new(cloud, groups, reach)
        .through(instances::jump_name(cluster, cloud_plan))
        .discover()
        .await
        .context("finding the cluster's instances")?;
    if found.targets.is_empty() {
        return Ok(None);
    }
    let options = NodeOptions {
        accept_new_host_keys: false,
        concurrency: a.concurrency,
        cloud_api: Some(instances::cloud_api(cluster, &lb)),
    };
    let repo = ctx.repo().await?;
    let plan = ops::plan(repo.store().clone(), cluster, &found.targets, &options).await?;
    if ctx.printer.format() == Format::Table {
        ctx.printer.data(&super::metal::plan_table(&plan).render());
        for n in &plan.nodes {
            if n.pending {
                ctx.printer
                    .status(&format!("{}: {}", n.target, n.reasons.join("; ")));
            }
        }
    }
    let pending = plan.pending();
    if !pending.is_empty() {
        ctx.printer.status(&format!(
            "{} of {} instances of {} need provisioning ({}).",
            pending.len(),
            plan.nodes.len(),
            cluster.name(),
            pending.join(", ")
        ));
    }
    Ok(Some(plan))
}

/// How long instances get to answer SSH after the cloud apply.
const SSH_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// The cloud part of `--yes`: planned under the lock (what is applied is what the store says
/// now), applied with a line per finished resource.
async fn apply_cloud(
    ctx: &Ctx,
    cloud: &AwsCloud,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    a: &UpdateClusterArgs,
) -> anyhow::Result<()> {
    // Planned under the lock: what is applied is what the store says now.
    let plan = cloud
        .plan(cluster, groups)
        .await
        .context("planning cloud resources")?;
    plan.check().context("planning cloud resources")?;
    if plan.is_empty() || plan.exit_code(a.prune) == exit::OK {
        ctx.printer.success(&format!(
            "No changes to cloud resources of {}.",
            cluster.name()
        ));
        return Ok(());
    }
    print_plan(ctx, &plan, None, a.prune)?;
    let progress = ctx.printer.progress(plan.changes.len() as u64, "applying");
    // The engine reports each finished resource; lines appear as the apply goes.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let hook = engine::DoneHook(std::sync::Arc::new(move |action, id| {
        let _ = tx.send(format!("{action:?} {id}"));
    }));
    let opts = ApplyOptions {
        prune: a.prune,
        on_done: Some(hook),
        ..Default::default()
    };
    let apply = engine::apply(cloud, &plan, &opts);
    tokio::pin!(apply);
    let result = loop {
        tokio::select! {
            r = &mut apply => break r,
            Some(line) = rx.recv() => progress.inc(&ctx.printer, &line),
        }
    };
    while let Ok(line) = rx.try_recv() {
        progress.inc(&ctx.printer, &line);
    }
    let report = result.context("applying cloud resources")?;
    progress.finish();
    ctx.printer.success(&format!(
        "Cloud resources of {} are up to date ({} changes applied).",
        cluster.name(),
        report.done.len()
    ));
    Ok(())
}

/// `delete cluster` for aws: every owned resource, in reverse dependency order.
pub(super) async fn aws_delete(
    ctx: &Ctx,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    yes: bool,
) -> anyhow::Result<()> {
    let cloud = aws_cloud(cluster).await?;
    let plan = cloud
        .plan_delete(cluster, groups)
        .await
        .context("finding the cluster's cloud resources")?;
    if !yes {
        ctx.printer.data(&engine::render_text(
            &plan,
            RenderOptions {
                color: ctx.printer.color(),
                prune: true,
            },
        ));
        return Ok(());
    }
    let report = engine::apply(
        &cloud,
        &plan,
        &ApplyOptions {
            prune: true,
            ..Default::default()
        },
    )
    .await
    .context("deleting cloud resources")?;
    ctx.printer.success(&format!(
        "Deleted {} cloud resources of {}.",
        report.done.len(),
        cluster.name()
    ));
    Ok(())
}
