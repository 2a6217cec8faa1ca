//! `rolling-update cluster`'s platform half (issue 19), reached through the platform seam
//! (`ops::platform::Platform`): the machines a preview is planned from
//! (`Platform::roll_observe`, then [`plan`]), and the rollers a `--yes` run rolls with
//! (`Platform::rollers`): `rolling_metal::MetalRoller` over the inventory's hosts on metal;
//! `rolling_aws::AwsRoller` on AWS, whose control planes are re-provisioned in place by the
//! same metal roller over the instances found at run time (the API load balancer as the
//! endpoint), or replaced new member first when their launch template changed. The CLI never
//! asks which platform a cluster runs on: it renders the [`Preparing`] events and matches on
//! [`MachinesError`] for its exit code.
//!
//! Before the rollers are handed out, etcd is backed up when a control plane is about to roll
//! (kubeadm's upgrade guide asks for it; a failed backup stops the run before anything
//! changed), and a version roll brings the image archives to every host.
//!
//! Caveat (AWS): the plan is observed before the lock is taken; a roll already journaled and
//! unfinished is resumed as journaled (the new plan only decides whether there is anything
//! to do).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::kube::Kube;
use crate::nodes::journal::{Journal, JournalError, JournalFile, NodeStep};
use crate::nodes::roll::{self, Platform, RollAction, RollPlan, Selection};
use crate::nodes::{Inventory, Target, TargetSource};
use crate::ops::etcd::BackupRecord;
use crate::ops::interrupt::Interrupts;
use crate::ops::nodes::NodeOptions;
use crate::ops::rolling::{
    self as engine, EtcdHealth, NodeRoller, ObserveError, Observed, RollEvents,
};
use crate::ops::rolling_aws::{self, AwsRoller, REPLACEMENT_TIMEOUT};
use crate::ops::rolling_metal::{MetalRoller, Staging};
use crate::provision::render::{CloudApi, Renderer};
use crate::spec::{InstanceGroup, ResolvedCluster};
use crate::ssh::SshFleet;
use crate::ssh::task::HostExecutor;
use crate::state::StateStore;
use crate::state::lock::LockGuard;

/// The machines as observed for a roll's plan, whatever the platform.
pub(crate) struct Machines {
    pub platform: Platform,
    pub observed: Vec<Observed>,
    /// Problems found on the way (AWS: owned instances in none of the cluster's groups).
    pub problems: Vec<String>,
}

/// [`super::platform::Platform::roll_observe`] on metal: the inventory's hosts.
pub(super) async fn observe_metal(
    store: &Arc<dyn StateStore>,
    metal: &super::Metal,
    concurrency: usize,
) -> anyhow::Result<Machines> {
    let cluster = &metal.cluster;
    let targets = Inventory {
        hosts: cluster.completed.spec.hosts.clone(),
    }
    .targets()
    .await?;
    let options = NodeOptions {
        concurrency,
        ..NodeOptions::default()
    };
    Ok(Machines {
        platform: Platform::Metal,
        observed: engine::observe(store.clone(), cluster, &targets, &options).await?,
        problems: Vec::new(),
    })
}

/// [`super::platform::Platform::roll_observe`] on AWS: the running instances of the groups.
pub(super) async fn observe_aws(
    store: &Arc<dyn StateStore>,
    aws: &super::Aws,
    concurrency: usize,
) -> anyhow::Result<Machines> {
    let o =
        rolling_aws::observe(store, &aws.cluster, &aws.instances, &aws.plan, concurrency).await?;
    Ok(Machines {
        platform: Platform::Aws,
        observed: o.observed,
        problems: o
            .strays
            .iter()
            .map(|s| format!("{s}: owned by the cluster but in none of its instance groups"))
            .collect(),
    })
}

/// The roll's plan from the resolved cluster (its groups, their sizes, its version), the
/// observed machines and each node's Ready (`None`: unknown), and every problem found (the
/// observation's first). Pure.
pub(crate) fn plan(
    resolved: &ResolvedCluster,
    machines: Machines,
    ready: Option<&BTreeMap<String, bool>>,
    selection: &Selection,
) -> (RollPlan, Vec<String>) {
    let mut problems = machines.problems;
    let (group_inputs, nodes, found) =
        engine::inputs(engine::group_inputs(resolved), &machines.observed, ready);
    problems.extend(found);
    let plan = roll::plan(
        &resolved.name,
        machines.platform,
        &resolved.version.to_string(),
        &group_inputs,
        &nodes,
        selection,
    );
    (plan, problems)
}

/// What a `--yes` run hands the platform for its rollers.
pub(crate) struct Roll<'a, 'g> {
    pub store: &'a Arc<dyn StateStore>,
    pub groups: &'a [InstanceGroup],
    /// SSH connections at a time of the in-place roller's fleet.
    pub concurrency: usize,
    /// The cluster lock, held for the whole run (the AWS roller checks it between waits).
    pub guard: &'g LockGuard,
    /// The cluster's API (`None` with `--cloudonly`).
    pub kube: Option<Kube>,
    /// The journal, loaded (an unfinished roll) or made from `plan`.
    pub journal: &'a Journal,
    pub plan: &'a RollPlan,
    pub events: RollEvents,
    pub interrupts: &'a Interrupts,
    /// What happens while the machines are made ready, as it happens.
    pub say: &'a (dyn Fn(Preparing) + Sync),
}

/// What happens while the machines are made ready, for the CLI to say.
pub(crate) enum Preparing<'a> {
    /// etcd is being backed up before these control planes roll.
    BackingUp {
        control_planes: &'a [&'a str],
    },
    BackedUp(&'a BackupRecord),
}

/// Why the machines could not be made ready; nothing was rolled.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MachinesError {
    #[error("the etcd backup before the control-plane roll failed, so nothing was rolled: {0:#}")]
    Backup(anyhow::Error),
    #[error(
        "interrupted while bringing the image archives to the hosts: no node was rolled; \
         `kprov rolling-update cluster {0} --yes` starts the roll again (archives already \
         imported are not brought twice)"
    )]
    Interrupted(String),
    /// Anything else (no ownership record, the instances not found, staging failed, ...).
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// The roller of a `--yes` run, with the SSH fleet it uses and the validation gate's etcd
/// check (over the same hosts on metal; over the control planes running at each check on
/// AWS, because a roll may replace them all). [`Rollers::close`] closes the fleet.
pub(crate) struct Rollers<'g> {
    pub roller: Box<dyn NodeRoller + 'g>,
    pub etcd: Arc<dyn EtcdHealth>,
    fleet: Arc<SshFleet>,
}

impl Rollers<'_> {
    /// Drops the roller and the etcd check, then closes the fleet they shared (it closes only
    /// once it is the last holder).
    pub(crate) async fn close(self) {
        let Rollers {
            roller,
            etcd,
            fleet,
        } = self;
        drop(etcd);
        drop(roller);
        if let Ok(f) = Arc::try_unwrap(fleet) {
            f.close().await;
        }
    }
}

/// [`super::platform::Platform::rollers`] on metal: the in-place roller over the inventory's
/// hosts.
pub(super) async fn metal_rollers<'g>(
    metal: super::Metal,
    roll: Roll<'_, 'g>,
) -> Result<Rollers<'g>, MachinesError> {
    let cluster = &metal.cluster;
    let targets = Inventory {
        hosts: cluster.completed.spec.hosts.clone(),
    }
    .targets()
    .await
    .map_err(anyhow::Error::from)?;
    let InPlace {
        roller,
        fleet,
        etcd,
    } = in_place(cluster, &roll, roll.kube.clone(), targets, None).await?;
    Ok(Rollers {
        roller: Box::new(roller),
        etcd,
        fleet,
    })
}

/// [`super::platform::Platform::rollers`] on AWS: workers and bastions replaced through their
/// Auto Scaling groups, control planes re-provisioned in place over the instances running now
/// (found by the cluster's ownership tag, in its groups), as metal hosts are, or, when their
/// launch template changed, replaced new member first.
pub(super) async fn aws_rollers<'g>(
    aws: super::Aws,
    roll: Roll<'_, 'g>,
) -> Result<Rollers<'g>, MachinesError> {
    let super::Aws {
        cluster,
        cloud,
        plan: _,
        instances: found,
        api,
    } = aws;
    let surge = roll
        .plan
        .groups
        .iter()
        .map(|g| (g.name.clone(), g.max_surge))
        .collect();
    let name = cluster.name.as_str();
    let cloud_api =
        api.ok_or_else(|| anyhow::anyhow!("the API load balancer of {name} has no DNS name yet"))?;
    // etcd is asked on the control planes running at each gate (a roll may replace them all).
    let etcd = Arc::new(rolling_aws::AwsEtcdHealth {
        cluster: cluster.clone(),
        instances: found.clone(),
        store: roll.store.clone(),
    });
    let targets = found
        .discover()
        .await
        .map_err(|e| anyhow::anyhow!("finding the cluster's instances: {e}"))?
        .targets;
    let InPlace {
        roller: in_place_roller,
        fleet,
        etcd: _,
    } = in_place(
        &cluster,
        &roll,
        roll.kube.clone(),
        targets,
        Some(&cloud_api),
    )
    .await?;
    let roller = AwsRoller {
        store: roll.store.clone(),
        cluster,
        cloud,
        instances: found,
        kube: roll.kube,
        guard: roll.guard,
        options: NodeOptions {
            accept_new_host_keys: false,
            concurrency: 20,
            cloud_api: Some(cloud_api),
        },
        groups: roll.groups.to_vec(),
        in_place: in_place_roller,
        events: roll.events,
        known: AwsRoller::known_of(roll.journal),
        claimed: Mutex::new(Default::default()),
        joining: Mutex::new(()),
        replacement_timeout: REPLACEMENT_TIMEOUT,
        poll: Duration::from_secs(2),
        surge,
        surged: Mutex::new(Default::default()),
        raised_max: Mutex::new(Default::default()),
        interrupts: roll.interrupts.clone(),
    };
    Ok(Rollers {
        roller: Box::new(roller),
        etcd,
        fleet,
    })
}

/// The in-place roller with what comes with it: the SSH fleet it uses and the validation
/// gate's etcd check over the same hosts or instances.
struct InPlace {
    roller: MetalRoller,
    fleet: Arc<SshFleet>,
    etcd: Arc<dyn EtcdHealth>,
}

/// The in-place roller (`MetalRoller`) over `targets`: a metal inventory's hosts, or the
/// instances an AWS roll found (with the cloud's API endpoint, as `update cluster` renders
/// them), after the etcd backup and the image staging (see the module's text).
async fn in_place(
    cluster: &ResolvedCluster,
    roll: &Roll<'_, '_>,
    kube: Option<Kube>,
    targets: Vec<Target>,
    cloud_api: Option<&CloudApi>,
) -> Result<InPlace, MachinesError> {
    let store = roll.store;
    let name = cluster.name.as_str();
    let owner = crate::nodes::owner::read(store.as_ref(), name)
        .await
        .map_err(anyhow::Error::from)?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{name} has no ownership record in the state store: provision it with `kprov update cluster {name} --yes` first"
            )
        })?;
    let renderer = Renderer::for_run(cluster, &targets, cloud_api).map_err(anyhow::Error::from)?;
    let fleet =
        crate::ops::nodes::strict_fleet(&cluster.name, &targets, store.clone(), roll.concurrency)?;
    let fleet = Arc::new(fleet);
    if let Err(e) = backup_before_control_planes(
        store,
        cluster,
        roll.journal,
        &targets,
        fleet.as_ref(),
        roll.say,
    )
    .await
    {
        fleet.close().await;
        return Err(MachinesError::Backup(e));
    }
    let etcd: Arc<dyn EtcdHealth> = Arc::new(crate::ops::etcd::SshEtcdHealth {
        cluster: cluster.clone(),
        targets: targets.to_vec(),
        exec: fleet.clone(),
    });
    let roller = MetalRoller::new(fleet.clone(), renderer, targets, owner, kube);
    if roll.journal.nodes.iter().any(|n| n.upgrade.is_some()) {
        match roller.stage_images(roll.interrupts.flag()).await {
            Ok(()) => {}
            Err(Staging::Failed(e)) => {
                fleet.close().await;
                return Err(anyhow::anyhow!("{e}; no node was rolled").into());
            }
            Err(Staging::Interrupted) => {
                drop(roller);
                drop(etcd);
                if let Ok(f) = Arc::try_unwrap(fleet) {
                    f.close().await;
                }
                return Err(MachinesError::Interrupted(name.to_string()));
            }
        }
    }
    Ok(InPlace {
        roller,
        fleet,
        etcd,
    })
}

/// etcd is backed up before any control plane rolls, on metal and AWS alike; nothing to do
/// when no control plane waits to roll.
async fn backup_before_control_planes(
    store: &Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    journal: &Journal,
    targets: &[Target],
    exec: &dyn HostExecutor,
    say: &(dyn Fn(Preparing) + Sync),
) -> anyhow::Result<()> {
    let control_planes = control_planes_to_roll(journal, targets);
    if control_planes.is_empty() {
        return Ok(());
    }
    say(Preparing::BackingUp {
        control_planes: &control_planes,
    });
    let record =
        crate::ops::etcd::backup(store.as_ref(), cluster, targets, exec, chrono::Utc::now())
            .await?;
    say(Preparing::BackedUp(&record));
    Ok(())
}

/// The control planes of `targets` the journal has yet to start rolling.
fn control_planes_to_roll<'j>(journal: &'j Journal, targets: &[Target]) -> Vec<&'j str> {
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

/// How a `--yes` run starts: an unfinished journal is resumed even when the preview finds
/// nothing to roll (its node in flight may still be cordoned); otherwise a new one is made
/// from the plan, unless nothing would roll.
pub(crate) enum Start {
    Resume(Journal),
    New(Journal),
    NothingToRoll,
}

/// The journal a `--yes` run works on, read under the lock (`guard`, whose holder starts a
/// new one), with the file it is written back through.
pub(crate) async fn start<'s>(
    store: &'s dyn StateStore,
    cluster: &str,
    plan: &RollPlan,
    guard: &LockGuard,
    cloud_only: bool,
) -> Result<(JournalFile<'s>, Start), JournalError> {
    let (file, existing) = JournalFile::load(store, cluster).await?;
    let start = match existing {
        Some(j) if !j.finished => Start::Resume(j),
        _ if plan.to_roll() == 0 => Start::NothingToRoll,
        _ => {
            let by = guard.record();
            Start::New(Journal::new(
                plan,
                &format!("{}@{}", by.holder, by.host),
                cloud_only,
            ))
        }
    };
    Ok((file, start))
}

/// The cluster side under `--cloudonly`: the engine never calls it (it skips cordon, drain,
/// Ready and validation); anything that does gets an error, not a pretend success.
pub(crate) struct NoApi;

#[async_trait::async_trait]
impl engine::ClusterApi for NoApi {
    async fn taint_prefer_no_schedule(&self, node: &str) -> Result<(), ObserveError> {
        Err(no_api(node))
    }
    async fn cordon(&self, node: &str) -> Result<(), ObserveError> {
        Err(no_api(node))
    }
    async fn drain(&self, node: &str, _: Duration) -> Result<(), ObserveError> {
        Err(no_api(node))
    }
    async fn ready_heartbeat(&self, node: &str) -> Result<Option<engine::Heartbeat>, ObserveError> {
        Err(no_api(node))
    }
    async fn wait_ready(
        &self,
        node: &str,
        _: Duration,
        _: Option<&engine::Heartbeat>,
    ) -> Result<(), ObserveError> {
        Err(no_api(node))
    }
    async fn uncordon(&self, node: &str) -> Result<(), ObserveError> {
        Err(no_api(node))
    }
    async fn validate(&self) -> Result<(), engine::ValidateError> {
        Err(engine::ValidateError::NoApi)
    }
}

fn no_api(node: &str) -> ObserveError {
    ObserveError::NoApi {
        node: node.to_string(),
    }
}
