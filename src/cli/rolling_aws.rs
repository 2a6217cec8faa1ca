//! `rolling-update cluster --yes` on AWS: the [`AwsRoller`] for a run ([`aws_roller`]);
//! `cli::rolling` runs it under the lock with the journal, as it runs the metal roller.
//!
//! Control planes are re-provisioned in place by the metal roller over the instances found at
//! run time (the same `cli::rolling::in_place_roller` metal uses, with the API load balancer
//! as the endpoint), after etcd was backed up, or, when their launch template changed,
//! replaced new member first (`ops::rolling_aws`); workers and bastions are replaced through
//! their Auto Scaling groups.
//!
//! Caveat: the plan is observed before the lock is taken; a roll already journaled and
//! unfinished is resumed as journaled (the new plan only decides whether there is anything
//! to do).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use super::commands::Ctx;
use super::rolling::{RollingUpdateClusterArgs, in_place_roller};
use crate::cloud::aws::instances::{self, AwsInstances, SshReach};
use crate::kube::Kube;
use crate::nodes::journal::Journal;
use crate::nodes::roll::RollPlan;
use crate::ops::interrupt::Interrupts;
use crate::ops::nodes::NodeOptions;
use crate::ops::rolling as ops;
use crate::ops::rolling_aws::{AwsRoller, REPLACEMENT_TIMEOUT};
use crate::spec::{Cluster, InstanceGroup};
use crate::ssh::SshFleet;
use crate::state::lock::LockGuard;

/// The AWS roller for this run, with the SSH fleet its in-place roller uses (the caller closes
/// it) and the validation gate's etcd check (over the control planes running at each check).
/// `Err(exit code)` when the run stopped before any node rolled (said): the etcd backup
/// before a control-plane roll failed, or Ctrl-C came while the image archives were staged.
#[allow(clippy::too_many_arguments)]
pub async fn aws_roller<'a>(
    ctx: &Ctx,
    a: &RollingUpdateClusterArgs,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    store: Arc<dyn crate::state::StateStore>,
    guard: &'a LockGuard,
    kube: Option<Kube>,
    journal: &Journal,
    plan: &RollPlan,
    events: ops::RollEvents,
    interrupts: &Interrupts,
) -> anyhow::Result<Result<(AwsRoller<'a>, Arc<SshFleet>, Arc<dyn ops::EtcdHealth>), i32>> {
    let surge = plan
        .groups
        .iter()
        .map(|g| (g.name.clone(), g.max_surge))
        .collect();
    let (cloud, plan) = crate::ops::aws::plan(&store, cluster, groups).await?;
    let name = cluster.name();
    let lb = instances::load_balancer_dns(&plan)
        .ok_or_else(|| anyhow::anyhow!("the API load balancer of {name} has no DNS name yet"))?;
    let reach = SshReach::of(cluster, a.ssh_private_address);
    let jump = instances::jump_name(cluster, &plan);
    let found = AwsInstances::new(&cloud, groups, reach).through(jump.clone());
    // etcd is asked on the control planes running at each gate (a roll may replace them all).
    let etcd = Arc::new(crate::ops::rolling_aws::AwsEtcdHealth {
        cluster: cluster.clone(),
        instances: AwsInstances::new(&cloud, groups, reach).through(jump),
        store: store.clone(),
    });
    let cloud_api = instances::cloud_api(cluster, &lb);
    // The control planes are re-provisioned in place over the instances running now (found by
    // the cluster's ownership tag, in its groups), as metal hosts are.
    let targets = found
        .discover()
        .await
        .map_err(|e| anyhow::anyhow!("finding the cluster's instances: {e}"))?
        .targets;
    let super::rolling::InPlace {
        roller: in_place,
        fleet,
        etcd: _,
    } = match in_place_roller(
        ctx,
        a,
        cluster,
        &store,
        journal,
        kube.clone(),
        targets,
        Some(&cloud_api),
        &interrupts.flag(),
    )
    .await?
    {
        Ok(in_place) => in_place,
        Err(code) => return Ok(Err(code)),
    };
    let roller = AwsRoller {
        store,
        cluster: cluster.clone(),
        cloud,
        instances: found,
        kube,
        guard,
        options: NodeOptions {
            accept_new_host_keys: false,
            concurrency: 20,
            cloud_api: Some(cloud_api),
        },
        groups: groups.to_vec(),
        in_place,
        events,
        known: AwsRoller::known_of(journal),
        claimed: Mutex::new(Default::default()),
        joining: Mutex::new(()),
        replacement_timeout: REPLACEMENT_TIMEOUT,
        poll: Duration::from_secs(2),
        surge,
        surged: Mutex::new(Default::default()),
        raised_max: Mutex::new(Default::default()),
        interrupts: interrupts.clone(),
    };
    Ok(Ok((roller, fleet, etcd)))
}
