//! `kprov update cluster NAME`: the preview, and with `--yes` the apply, of everything the
//! spec asks for: cloud resources (aws), nodes over SSH (metal), then the add-ons. Thin
//! commands: the use cases are `ops::aws` and `ops::nodes`; this file prints.

use std::sync::{Arc, Mutex};

use super::commands::Ctx;
use super::commands::LOCK_LEASE;
use super::{UpdateClusterArgs, exit};
use crate::cloud::aws::launch::LaunchEvent;
use crate::cloud::aws::wait::WaitEvent;
use crate::cloud::engine::{self, RenderOptions};
use crate::nodes::plan::NodePlan;
use crate::ops::aws::{self as ops_aws, AwsApplied, AwsEvent, AwsEvents, AwsUpdateOptions};
use crate::output::{Format, Printer};
use crate::spec::{CloudProvider, Cluster, InstanceGroup};
use crate::state::lock;

pub async fn cluster(ctx: &Ctx, a: &UpdateClusterArgs) -> anyhow::Result<i32> {
    let (cluster, groups) = super::addons::resolved(ctx, &a.name).await?;
    match cluster.spec.cloud_provider {
        CloudProvider::Aws => aws(ctx, &cluster, &groups, a).await,
        CloudProvider::Metal => super::metal::update(ctx, &cluster, &groups, a).await,
    }
}

/// The cloud plan; `-o json|yaml` documents also carry the node plan of the running instances
/// as `nodePlan` (docs/plan-json.md), absent while no instance runs.
fn print_plan(
    printer: &Printer,
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
    match printer.format() {
        Format::Json => printer.data(&serde_json::to_string_pretty(&document()?)?),
        Format::Yaml => printer.data(&crate::output::to_yaml(&document()?)?),
        Format::Table => printer.data(&engine::render_text(
            plan,
            RenderOptions {
                color: printer.color(),
                prune,
            },
        )),
    }
    Ok(())
}

fn options(a: &UpdateClusterArgs) -> AwsUpdateOptions {
    AwsUpdateOptions {
        prune: a.prune,
        ssh_private_address: a.ssh_private_address,
        accept_new_host_keys: a.accept_new_host_keys,
        concurrency: a.concurrency,
    }
}

async fn aws(
    ctx: &Ctx,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    let repo = ctx.repo().await?;
    let store = repo.store().clone();
    if !a.yes {
        let (cloud, plan) = ops_aws::plan(&store, cluster, groups).await?;
        let table = ctx.printer.format() == Format::Table;
        if table {
            // On a terminal the cloud plan shows even when the instances cannot be read.
            print_plan(&ctx.printer, &plan, None, a.prune)?;
        }
        if let Err(e) = plan.check() {
            if !table {
                print_plan(&ctx.printer, &plan, None, a.prune)?;
            }
            return Err(anyhow::Error::new(e).context("planning cloud resources"));
        }
        let cloud_pending = plan.exit_code(a.prune) == exit::CHANGES_PENDING;
        let nodes = ops_aws::node_plan(&store, &cloud, cluster, groups, &plan, &options(a)).await?;
        if table {
            if let Some(n) = &nodes {
                ctx.printer.data(&super::metal::plan_table(n).render());
                for n in n.nodes.iter().filter(|n| n.pending) {
                    ctx.printer
                        .status(&format!("{}: {}", n.target, n.reasons.join("; ")));
                }
            }
        } else {
            print_plan(&ctx.printer, &plan, nodes.as_ref(), a.prune)?;
        }
        let nodes_pending = match &nodes {
            Some(n) if !n.pending().is_empty() => {
                let pending = n.pending();
                ctx.printer.status(&format!(
                    "{} of {} instances of {} need provisioning ({}).",
                    pending.len(),
                    n.nodes.len(),
                    cluster.name(),
                    pending.join(", ")
                ));
                true
            }
            _ => false,
        };
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
    let name = cluster.name();
    let guard = lock::acquire(store.clone(), name, "update cluster --yes", LOCK_LEASE).await?;
    let result = aws_apply(ctx, &store, cluster, groups, a, &guard).await;
    let released = guard.release().await;
    let outcome = result?;
    released?;
    match outcome {
        AwsApplied::Nodes(nodes) => super::metal::finish(ctx, cluster, &nodes, a).await,
        AwsApplied::NoInstances => {
            ctx.printer.error(&format!(
                "no running instance of {name} was found; nothing was provisioned (are the groups' minSize 0?)"
            ));
            Ok(exit::ERROR)
        }
        AwsApplied::KeyConflicts(conflicts) => {
            for c in &conflicts {
                ctx.printer.error(&c.to_string());
            }
            Ok(exit::ERROR)
        }
    }
}

/// `ops::aws::apply` with its events printed: the cloud plan and a line (or bar step) per
/// finished change, waits per instance, the node progress as metal shows it.
async fn aws_apply(
    ctx: &Ctx,
    store: &Arc<dyn crate::state::StateStore>,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    a: &UpdateClusterArgs,
    guard: &lock::LockGuard,
) -> anyhow::Result<AwsApplied> {
    let name = cluster.name();
    let printer = &ctx.printer;
    let progress = Mutex::new(None);
    let prune = a.prune;
    let events = |e: &AwsEvent<'_>| {
        let mut bar = progress.lock().unwrap_or_else(|p| p.into_inner());
        match e {
            AwsEvent::CloudPlan(plan) => {
                if let Err(e) = print_plan(printer, plan, None, prune) {
                    printer.warn(&format!("printing the plan: {e:#}"));
                }
                *bar = Some(printer.progress(plan.changes.len() as u64, "applying"));
            }
            AwsEvent::CloudUnchanged => {
                printer.success(&format!("No changes to cloud resources of {name}."))
            }
            AwsEvent::CloudChangeDone(line) => match bar.as_ref() {
                Some(p) => p.inc(printer, line),
                None => printer.status(line),
            },
            AwsEvent::CloudApplied { changes } => {
                if let Some(p) = bar.take() {
                    p.finish();
                }
                printer.success(&format!(
                    "Cloud resources of {name} are up to date ({changes} changes applied)."
                ));
            }
            AwsEvent::Stray(s) => printer.warn(&format!(
                "{}: owned by {name} but in no instance group; not provisioned",
                crate::output::untrusted(s)
            )),
            AwsEvent::Wait(WaitEvent::Waiting { instance, last }) => {
                printer.status(&format!("{instance}: waiting for SSH ({last})"))
            }
            AwsEvent::Wait(WaitEvent::Answering { instance, banner }) => {
                printer.status(&format!("{instance}: answering ({banner})"))
            }
            AwsEvent::Wait(WaitEvent::Deferred { instance }) => {
                printer.status(&format!("{instance}: reached through the bastion"))
            }
            AwsEvent::Launch(LaunchEvent::Waiting {
                group,
                ready,
                desired,
            }) => printer.status(&format!(
                "{group}: {ready} of {desired} instances launched by Auto Scaling"
            )),
            AwsEvent::Launch(LaunchEvent::Failed { group, reason }) => {
                printer.warn(&format!("{group}: a launch failed (Auto Scaling retries): {reason}"))
            }
            AwsEvent::Launch(LaunchEvent::Launched { waited }) => printer.status(&format!(
                "every group launched its instances (waited {}s for Auto Scaling)",
                waited.as_secs()
            )),
            AwsEvent::LaunchLate(s, waited) => printer.error(&format!(
                "{}: {} of {} instances after {}s{}; provisioning those there are (re-run `kprov update cluster {name} --yes` once the group has launched)",
                s.group,
                s.ready,
                s.desired,
                waited.as_secs(),
                s.last_failure
                    .as_ref()
                    .map(|r| format!("; last failed launch: {r}"))
                    .unwrap_or_default()
            )),
            AwsEvent::NotAnswering {
                instance,
                last,
                waited,
            } => printer.error(&format!(
                "{instance}: not answering SSH after {}s: {last}",
                waited.as_secs()
            )),
        }
    };
    let events: AwsEvents<'_> = &events;
    let bars = Mutex::new(None);
    let result = ops_aws::apply(store, cluster, groups, guard, &options(a), events, |t| {
        let (events, multi) = super::metal::render_events(ctx, t);
        *bars.lock().unwrap_or_else(|p| p.into_inner()) = multi;
        events
    })
    .await;
    if let Some(multi) = bars.into_inner().unwrap_or_else(|p| p.into_inner()) {
        let _ = multi.clear();
    }
    result
}

/// `delete cluster` for aws: every owned resource, in reverse dependency order.
pub(super) async fn aws_delete(
    ctx: &Ctx,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    yes: bool,
) -> anyhow::Result<()> {
    let (plan, deleted) = ops_aws::delete(cluster, groups, yes).await?;
    match deleted {
        None => ctx.printer.data(&engine::render_text(
            &plan,
            RenderOptions {
                color: ctx.printer.color(),
                prune: true,
            },
        )),
        Some(n) => ctx.printer.success(&format!(
            "Deleted {n} cloud resources of {}.",
            cluster.name()
        )),
    }
    Ok(())
}
