//! `rolling-update cluster --yes` on AWS: the [`AwsRoller`] for a run ([`aws_roller`]) and
//! the control planes it refuses; `cli::rolling` runs it under the lock with the journal, as
//! it runs the metal roller.
//!
//! Caveat: the plan is observed before the lock is taken; a roll already journaled and
//! unfinished is resumed as journaled (the new plan only decides whether there is anything
//! to do).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::cloud::aws::instances::{self, AwsInstances, SshReach};
use crate::kube::Kube;
use crate::nodes::journal::Journal;
use crate::nodes::roll::RollPlan;
use crate::ops::nodes::NodeOptions;
use crate::ops::rolling as ops;
use crate::ops::rolling_aws::{AwsRoller, REPLACEMENT_TIMEOUT};
use crate::spec::{Cluster, InstanceGroup};
use crate::state::lock::LockGuard;

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
