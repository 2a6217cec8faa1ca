//! `rolling-update cluster --yes` on AWS: the cluster lock, the journal (new or resumed), the
//! real cluster side ([`KubeCluster`]) and [`AwsRoller`], handed to the engine.
//!
//! Caveat: [`run_roll`] is the lock/journal/engine wiring the metal `--yes` (another branch)
//! builds too; when both exist, this one is dropped for theirs and only [`aws_roller`] stays.
//! The plan is observed before the lock is taken; a roll already journaled and unfinished is
//! resumed as journaled (the new plan only decides whether there is anything to do).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, watch};

use super::commands::{Ctx, LOCK_LEASE};
use super::exit;
use super::rolling::RollingUpdateClusterArgs;
use crate::addons::validate::Expectations;
use crate::cloud::aws::instances::{self, AwsInstances, SshReach};
use crate::kube::Kube;
use crate::nodes::journal::{Journal, JournalFile};
use crate::nodes::roll::RollPlan;
use crate::ops::nodes::NodeOptions;
use crate::ops::rolling::{self as ops, ClusterApi, KubeCluster, NodeRoller, RollEvent};
use crate::ops::rolling_aws::{AwsRoller, REPLACEMENT_TIMEOUT};
use crate::output::{Format, Printer};
use crate::spec::{Cluster, InstanceGroup};
use crate::state::lock::{self, LockGuard};

/// Control planes would be re-provisioned in place on AWS: not built yet.
pub fn control_plane_refusals(plan: &RollPlan) -> Vec<String> {
    plan.order()
        .iter()
        .filter(|n| n.action == crate::nodes::roll::RollAction::Reprovision)
        .map(|n| {
            format!(
                "{} ({}, group {}): re-provisioning a control plane in place is not implemented \
                 on AWS yet; roll the workers alone with `--instance-group-roles Node`",
                n.node_name, n.target, n.group
            )
        })
        .collect()
}

/// The AWS roller for this run.
#[allow(clippy::too_many_arguments)]
pub async fn aws_roller<'a>(
    cluster: &Cluster,
    groups: &[InstanceGroup],
    store: Arc<dyn crate::state::StateStore>,
    guard: &'a LockGuard,
    kube: Option<Kube>,
    journal: &Journal,
    plan: &RollPlan,
    ssh_private_address: bool,
    events: ops::RollEvents,
) -> anyhow::Result<AwsRoller<'a>> {
    let surge = plan
        .groups
        .iter()
        .map(|g| (g.name.clone(), g.max_surge))
        .collect();
    let (cloud, plan) = crate::ops::aws::plan(&store, cluster, groups).await?;
    let name = cluster.name();
    let lb = instances::load_balancer_dns(&plan)
        .ok_or_else(|| anyhow::anyhow!("the API load balancer of {name} has no DNS name yet"))?;
    let reach = SshReach::of(cluster, ssh_private_address);
    let found =
        AwsInstances::new(&cloud, groups, reach).through(instances::jump_name(cluster, &plan));
    Ok(AwsRoller {
        store,
        cluster: cluster.clone(),
        cloud,
        instances: found,
        kube,
        guard,
        options: NodeOptions {
            accept_new_host_keys: false,
            concurrency: 20,
            cloud_api: Some(instances::cloud_api(cluster, &lb)),
        },
        events,
        known: AwsRoller::known_of(journal),
        claimed: Mutex::new(Default::default()),
        joining: Mutex::new(()),
        replacement_timeout: REPLACEMENT_TIMEOUT,
        poll: Duration::from_secs(2),
        surge,
        surged: Mutex::new(Default::default()),
        raised_max: Mutex::new(Default::default()),
    })
}

fn printer_events() -> ops::RollEvents {
    let p = Printer::new(Format::Table, 0);
    Arc::new(move |e: &RollEvent| match e {
        RollEvent::Step {
            node,
            step,
            elapsed,
        } => p.status(&format!(
            "{node}: {} ({}s)",
            step.as_str(),
            elapsed.as_secs()
        )),
        RollEvent::Working { node, what } => p.status(&format!("{node}: {what}")),
        RollEvent::Gate {
            passes,
            needed,
            error,
        } => match error {
            None => p.status(&format!("validation passed ({passes}/{needed})")),
            Some(e) => p.status(&format!("validation failed ({passes}/{needed}): {e}")),
        },
        RollEvent::Note(n) => p.status(n),
    })
}

/// `--yes` on AWS, after the preview was printed and found something to roll.
pub async fn run_roll(
    ctx: &Ctx,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    a: &RollingUpdateClusterArgs,
    plan: &RollPlan,
) -> anyhow::Result<i32> {
    let name = cluster.name();
    let refusals = control_plane_refusals(plan);
    if !refusals.is_empty() {
        for r in &refusals {
            ctx.printer.error(r);
        }
        ctx.printer.error(&format!(
            "the roll of {name} did not start; nothing was changed"
        ));
        return Ok(exit::ERROR);
    }
    let repo = ctx.repo().await?;
    let store = repo.store().clone();
    let guard = lock::acquire(
        store.clone(),
        name,
        "rolling-update cluster --yes",
        LOCK_LEASE,
    )
    .await?;
    let result = locked_roll(ctx, cluster, groups, a, plan, &store, &guard).await;
    let released = guard.release().await;
    let code = result?;
    released?;
    Ok(code)
}

async fn locked_roll(
    ctx: &Ctx,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    a: &RollingUpdateClusterArgs,
    plan: &RollPlan,
    store: &Arc<dyn crate::state::StateStore>,
    guard: &LockGuard,
) -> anyhow::Result<i32> {
    let name = cluster.name();
    let (file, existing) = JournalFile::load(store.as_ref(), name).await?;
    let journal = match existing {
        Some(j) if !j.finished => {
            ctx.printer.status(&format!(
                "Resuming the roll started by {} at {}: {} of {} nodes done.",
                j.started_by,
                j.started_at,
                j.done(),
                j.nodes.len()
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
    let (kube, _client) = if a.cloud_only {
        (None, None)
    } else {
        let (k, g) =
            super::addons::cluster_client(ctx, cluster, a.kubeconfig.as_deref(), false).await?;
        (Some(k), Some(g))
    };
    let events = printer_events();
    let roller = aws_roller(
        cluster,
        groups,
        store.clone(),
        guard,
        kube.clone(),
        &journal,
        plan,
        a.ssh_private_address,
        events.clone(),
    )
    .await?;
    let api: Box<dyn ClusterApi> = match &kube {
        Some(k) => Box::new(KubeCluster {
            kube: k.clone(),
            cluster: cluster.clone(),
            expect: Expectations::from_spec(cluster, groups)?,
            poll: Duration::from_secs(2),
        }),
        None => Box::new(NoApi),
    };
    let options = ops::RollOptions {
        drain_timeout: a.drain_timeout,
        validation_timeout: a.validation_timeout,
        validate_count: a.validate_count,
        cloud_only: a.cloud_only,
        ..ops::RollOptions::default()
    };
    let (tx, rx) = watch::channel(false);
    let ctrl_c = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = tx.send(true);
        }
    });
    let lock_check = || guard.check().map_err(|e| e.to_string());
    let roller: &dyn NodeRoller = &roller;
    let result = ops::run(
        file,
        journal,
        api.as_ref(),
        roller,
        &options,
        &events,
        rx,
        &lock_check,
    )
    .await;
    ctrl_c.abort();
    match result {
        Ok(j) => {
            ctx.printer.success(&format!(
                "Rolled {} nodes of {name}: {}.",
                j.nodes.len(),
                j.nodes
                    .iter()
                    .map(|n| match &n.replacement {
                        Some(r) => format!("{} -> {r}", n.node_name),
                        None => n.node_name.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            Ok(exit::OK)
        }
        Err(e) => {
            ctx.printer.error(&e.to_string());
            Ok(exit::ERROR)
        }
    }
}

/// `--cloudonly`: the engine never asks the API then; any call is a bug, said as an error.
struct NoApi;

#[async_trait::async_trait]
impl ClusterApi for NoApi {
    async fn taint_prefer_no_schedule(&self, node: &str) -> Result<(), String> {
        Err(format!("--cloudonly: no API to taint {node}"))
    }
    async fn cordon(&self, node: &str) -> Result<(), String> {
        Err(format!("--cloudonly: no API to cordon {node}"))
    }
    async fn drain(&self, node: &str, _: Duration) -> Result<(), String> {
        Err(format!("--cloudonly: no API to drain {node}"))
    }
    async fn wait_ready(&self, node: &str, _: Duration) -> Result<(), String> {
        Err(format!("--cloudonly: no API to wait for {node}"))
    }
    async fn uncordon(&self, node: &str) -> Result<(), String> {
        Err(format!("--cloudonly: no API to uncordon {node}"))
    }
    async fn validate(&self) -> Result<(), String> {
        Err("--cloudonly: no API to validate".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::rolling::tests::plan_of;

    #[test]
    fn control_planes_are_refused_on_aws_naming_each() {
        let plan = plan_of(crate::nodes::roll::Platform::Aws, 3, 1);
        let cps = control_plane_refusals(&plan);
        assert_eq!(cps.len(), 2, "{cps:?}");
        assert!(
            cps.iter()
                .all(|r| r.contains("not implemented on AWS") && r.contains("group control-plane")),
            "{cps:?}"
        );
    }
}
