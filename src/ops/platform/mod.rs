//! The platform seam (issue 19): the one place that asks where a cluster runs. A command opens the
//! cluster's [`Platform`] and asks it for the machines to work on, the API address they are
//! rendered with and (through [`rolling`]) the rollers and the etcd health check; the use cases
//! below it (`ops::etcd`, `ops::certificates`) work on targets and an SSH fleet the same way on
//! every platform.
//!
//! - metal: the hosts of the spec; the API address is the spec's.
//! - AWS: the running instances of the cluster's groups (found by its ownership tag, reached as
//!   `spec.topology.sshAddress` or `--ssh-private-address` says, through the bastion where there
//!   is one); the API address is the load balancer's record. Opening it reads the cloud plan
//!   (host keys and pinned images from the store, as `update cluster` does).
//!
//! `rolling-update cluster` asks it too: for the machines a roll is planned from
//! ([`Platform::roll_observe`]) and for the rollers of a `--yes` run ([`Platform::rollers`]:
//! metal's in-place roller, AWS's replacing roller with the in-place one for its control
//! planes), assembled in [`rolling`].
//!
//! `update cluster` (`ops::update`) asks [`Kind`] only: its preview and its apply read the cloud
//! themselves (the apply under the lock).
//!
//! Not behind the seam yet: `delete cluster` (`ops::delete`) and `delete
//! instance` (`ops::instance::Removal`) choose the platform in ops, without opening it (an AWS
//! platform reads the whole cloud plan, which they do not need).

pub(crate) mod rolling;

use std::sync::Arc;

use anyhow::Context;

use super::nodes::{self as ops_nodes, Events};
use crate::cloud::aws::AwsCloud;
use crate::cloud::aws::instances::{self, AwsInstances, SshReach};
use crate::cloud::engine::Plan;
use crate::nodes::{self, Target, TargetSource};
use crate::provision::plan::NodePlan;
use crate::provision::render::CloudApi;
use crate::spec::resolve::Platform as ResolvedPlatform;
use crate::spec::{CloudProvider, Cluster, ResolvedCluster};
use crate::ssh::SshFleet;
use crate::state::StateStore;

/// Where a cluster runs, told without opening it (no cloud read): for a use case that reads
/// what it needs itself, as `update cluster` does (its apply plans the cloud under the lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Metal,
    Aws,
}

impl Kind {
    pub(crate) fn of(cluster: &Cluster) -> Kind {
        match cluster.spec.cloud_provider {
            CloudProvider::Metal => Kind::Metal,
            CloudProvider::Aws => Kind::Aws,
        }
    }

    /// How the platform's machines are called in sentences.
    pub(crate) fn machine(self) -> &'static str {
        match self {
            Kind::Metal => "host",
            Kind::Aws => "instance",
        }
    }
}

/// Where a cluster runs, opened for one command.
pub(crate) enum Platform {
    Metal(Box<Metal>),
    Aws(Box<Aws>),
}

/// A metal cluster: the hosts of its spec.
pub(crate) struct Metal {
    pub(super) cluster: ResolvedCluster,
}

/// An AWS cluster: its instances as the cloud shows them now.
pub(crate) struct Aws {
    pub(super) cluster: ResolvedCluster,
    /// The cloud's clients (the replacing roller works through them).
    pub(super) cloud: AwsCloud,
    /// The cloud plan read when the platform was opened (the load balancer, the bastion, each
    /// group's current launch template version).
    pub(super) plan: Plan,
    pub(super) instances: AwsInstances,
    pub(super) api: Option<CloudApi>,
}

/// How a command reaches the machines.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Reach {
    /// AWS: the instances' private addresses (`--ssh-private-address`); the spec's
    /// `topology.sshAddress` otherwise.
    pub private_address: bool,
}

impl Platform {
    /// Opens the platform of `resolved` (the command's one resolved model: opening it
    /// resolves nothing again).
    pub(crate) async fn open(
        store: &Arc<dyn StateStore>,
        resolved: &ResolvedCluster,
        reach: Reach,
    ) -> anyhow::Result<Platform> {
        let (cluster, groups) = (&resolved.completed, &resolved.completed_groups);
        Ok(match resolved.platform {
            ResolvedPlatform::Metal(_) => Platform::Metal(Box::new(Metal {
                cluster: resolved.clone(),
            })),
            ResolvedPlatform::Aws(_) => {
                let (cloud, plan) = super::aws::plan(store, resolved).await.with_context(|| {
                    format!("reading the cloud resources of {}", cluster.name())
                })?;
                let instances =
                    AwsInstances::new(&cloud, groups, SshReach::of(cluster, reach.private_address))
                        .through(instances::jump_name(cluster, &plan));
                let api = instances::load_balancer_dns(&plan)
                    .map(|lb| instances::cloud_api(cluster, &lb));
                Platform::Aws(Box::new(Aws {
                    cluster: resolved.clone(),
                    cloud,
                    plan,
                    instances,
                    api,
                }))
            }
        })
    }

    fn cluster(&self) -> &ResolvedCluster {
        match self {
            Platform::Metal(m) => &m.cluster,
            Platform::Aws(a) => &a.cluster,
        }
    }

    /// The cluster's machines as node targets: metal's hosts, AWS's running instances
    /// (bastions excluded: they are never nodes).
    pub(crate) async fn targets(&self) -> anyhow::Result<Vec<Target>> {
        match self {
            Platform::Metal(m) => Ok(nodes::Inventory {
                hosts: m.cluster.completed.spec.hosts.clone(),
            }
            .targets()
            .await?),
            Platform::Aws(a) => Ok(a
                .instances
                .discover()
                .await
                .with_context(|| format!("finding the instances of {}", a.cluster.name))?
                .targets),
        }
    }

    /// The API address nodes are rendered with when the platform sets it (AWS: the load
    /// balancer's record, once it exists); `None` on metal, where the spec's applies.
    pub(crate) fn cloud_api(&self) -> Option<&CloudApi> {
        match self {
            Platform::Metal(_) => None,
            Platform::Aws(a) => a.api.as_ref(),
        }
    }

    /// The etcd members among `targets` (stacked: the control planes; external: the `etcd`
    /// hosts), as the etcd use cases pick them.
    pub(crate) fn etcd_hosts<'t>(&self, targets: &'t [Target]) -> Vec<&'t Target> {
        super::etcd::members_of(self.cluster(), targets)
    }

    /// An SSH fleet over `targets` with strict host keys (the keys `update cluster` recorded;
    /// AWS instances' are the ones kprov generated).
    pub(crate) fn fleet(
        &self,
        store: &Arc<dyn StateStore>,
        targets: &[Target],
        concurrency: usize,
        events: &Events,
    ) -> anyhow::Result<SshFleet> {
        ops_nodes::fleet(
            &self.cluster().name,
            targets,
            store.clone(),
            false,
            concurrency,
            events,
        )
    }
}

impl Platform {
    /// `rolling-update cluster`'s observation: the machines and their provisioning records
    /// (AWS: with their launch template versions, bastions, and owned instances in no group
    /// as problems). Read-only.
    pub(crate) async fn roll_observe(
        &self,
        store: &Arc<dyn StateStore>,
        concurrency: usize,
    ) -> anyhow::Result<rolling::Machines> {
        match self {
            Platform::Metal(m) => rolling::observe_metal(store, m, concurrency).await,
            Platform::Aws(a) => rolling::observe_aws(store, a, concurrency).await,
        }
    }

    /// The rollers of a `rolling-update cluster --yes` run, the lock held as `guard` (see
    /// [`rolling::Roll`] for what else it takes).
    pub(crate) async fn rollers<'g>(
        self,
        roll: rolling::Roll<'_, 'g>,
    ) -> Result<rolling::Rollers<'g>, rolling::MachinesError> {
        match self {
            Platform::Metal(m) => rolling::metal_rollers(*m, roll).await,
            Platform::Aws(a) => rolling::aws_rollers(*a, roll).await,
        }
    }
}

/// The preview's refusal of hosts another cluster owns, the same on every platform: `Some`
/// sentence naming each refused host and its owner when the node plan has any (`update
/// cluster` then exits 1 before `--yes` is even considered).
pub(crate) fn owned_elsewhere(cluster: &str, plan: &NodePlan, what: &str) -> Option<String> {
    let refused = plan.refused();
    if refused.is_empty() {
        return None;
    }
    Some(format!(
        "{} of {cluster} belong{} to another cluster and will not be provisioned: {}",
        crate::output::plural(refused.len(), what),
        if refused.len() == 1 { "s" } else { "" },
        refused
            .iter()
            .map(|n| format!("{} ({})", n.target, n.state()))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}
