//! `rolling-update cluster` and `get instances` without the command line (issue 19): [`open`]
//! (the bundle checked in full, the platform opened), [`RollingUpdate::plan`] →
//! [`RollingPlan`] (read-only: the machines observed through the platform seam, each node's
//! Ready, the roll's plan and every problem; the preview and `get instances` print it) and
//! [`RollingUpdate::apply`] → [`RollingReport`] under the caller's lock. Errors that stop a
//! roll before the engine runs are [`RollingError`]s; how the engine ended is in the report.
//!
//! The apply, in order: the journal loaded (an unfinished roll is resumed, even when the plan
//! finds nothing to roll: its node in flight may still be cordoned) or made from the plan; the
//! cluster's API client (none with `--cloudonly`); the platform's rollers
//! ([`Platform::rollers`]: etcd backed up before control planes roll, image archives brought
//! first for a version roll); the engine ([`engine::run`]) with [`engine::KubeCluster`] as the
//! cluster side (its gate asks the rollers' etcd check), or [`run::NoApi`] under
//! `--cloudonly`; the rollers closed and the journal read back as the store holds it.
//!
//! ```text
//! let roll = ops::rolling_update::open(store, cluster, groups, options).await?;
//! let plan = roll.plan().await?;                                   // preview
//! session.with_lock(name, cmd, async |guard| roll.apply(&plan.plan, guard, &ints, say, events)).await?;
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::credentials::{self, ClientGuard};
use super::interrupt::Interrupts;
use super::platform::rolling::{self as run, MachinesError, Preparing, Roll, Start};
use super::platform::{Platform, Reach};
use super::rolling::{self as engine, RollError, RollEvents, RollOptions};
use crate::kube::Kube;
use crate::nodes::journal::{Journal, JournalFile};
use crate::nodes::roll::{RollPlan, Selection};
use crate::spec::{Cluster, ResolvedCluster};
use crate::state::StateStore;
use crate::state::lock::{LockError, LockGuard};

/// How long the preview waits for the cluster's API to list the nodes' Ready.
const READY_WAIT: Duration = Duration::from_secs(30);

/// What `rolling-update cluster` (or `get instances`) was asked for: its flags in the
/// model's types.
#[derive(Debug, Clone)]
pub(crate) struct RollingOptions {
    /// The groups, roles and `--force` that choose the nodes.
    pub selection: Selection,
    /// Give up on a node's drain after this long (`--drain-timeout`).
    pub drain_timeout: Duration,
    /// How long the cluster may take to pass validation after each batch.
    pub validation_timeout: Duration,
    /// Consecutive validation passes needed after each batch.
    pub validate_count: u32,
    /// Replace without draining or validating (`--cloudonly`).
    pub cloud_only: bool,
    /// `--kubeconfig`: the API client's credentials instead of the stored ones.
    pub kubeconfig: Option<PathBuf>,
    /// SSH connections at a time.
    pub concurrency: usize,
    /// AWS: reach instances at their private addresses (`--ssh-private-address`).
    pub ssh_private_address: bool,
    /// `spec.assets.bundle` for this run (`--bundle`; the stored spec is unchanged).
    pub bundle: Option<PathBuf>,
}

impl Default for RollingOptions {
    /// `get instances`: every group, the command's defaults.
    fn default() -> Self {
        let roll = RollOptions::default();
        RollingOptions {
            selection: Selection::default(),
            drain_timeout: roll.drain_timeout,
            validation_timeout: roll.validation_timeout,
            validate_count: roll.validate_count,
            cloud_only: false,
            kubeconfig: None,
            concurrency: 20,
            ssh_private_address: false,
            bundle: None,
        }
    }
}

/// Why a roll stopped before its engine ran: nothing was rolled.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RollingError {
    /// The machines could not be made ready (the etcd backup, the image staging, ...).
    #[error(transparent)]
    Machines(#[from] MachinesError),
    /// The cluster's lock could not be taken.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// Anything else (the bundle, the platform, the journal, the API client), its cause kept.
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// The preview: the roll's plan, the problems found on the way and whether Ready is known.
/// `-o json` prints it as it serializes: the plan's fields, `problems`, `readyUnknown`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RollingPlan {
    #[serde(flatten)]
    pub plan: RollPlan,
    /// Problems of the observation (AWS: owned instances in none of the groups; records that
    /// cannot be read).
    pub problems: Vec<String>,
    /// Why READY is unknown: the cluster's API could not be asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready_unknown: Option<String>,
    /// How the API was reached when not directly, for a debug line.
    #[serde(skip)]
    pub route: Option<String>,
}

impl RollingPlan {
    /// Why the roll cannot start as planned: the observation's problems, then the plan's
    /// refusals. Not empty: nothing may roll.
    pub(crate) fn refusals(&self) -> Vec<String> {
        let mut refusals = self.problems.clone();
        refusals.extend(self.plan.refusals.iter().cloned());
        refusals
    }

    /// `get instances`: every machine with its group, status and Ready. A machine whose
    /// state cannot be read is listed, never dropped.
    pub(crate) fn instances(&self) -> Vec<Instance> {
        let metal = self.plan.platform == crate::nodes::roll::Platform::Metal;
        let mut rows = Vec::new();
        for g in &self.plan.groups {
            for n in &g.nodes {
                rows.push(Instance {
                    group: g.name.clone(),
                    node: n.node_name.clone(),
                    target: n.target.clone(),
                    // An instance as unknown, a host as unreachable with the error (escaped:
                    // a host's words).
                    status: match &n.unknown {
                        Some(_) if metal => "unreachable",
                        Some(_) => "unknown",
                        None if n.needs_update => "needs update",
                        None => "up to date",
                    },
                    reasons: match &n.unknown {
                        Some(why) if metal => vec![crate::output::escape(why).into_owned()],
                        _ => n.reasons.clone(),
                    },
                    ready: n.ready,
                    unknown: n.unknown.clone(),
                    unreachable_host: metal && n.unknown.is_some(),
                });
            }
        }
        rows
    }
}

/// One machine of `get instances`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Instance {
    pub group: String,
    pub node: String,
    pub target: String,
    pub status: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Why its state cannot be read (`status` is `unknown` or `unreachable`).
    #[serde(skip)]
    pub unknown: Option<String>,
    /// A metal host that did not answer (`rolling-update` refuses until it does).
    #[serde(skip)]
    pub unreachable_host: bool,
}

/// What happens before the engine runs, as it happens.
pub(crate) enum RollingEvent<'a> {
    /// An unfinished roll is resumed.
    Resuming(&'a Journal),
    /// `--cloudonly` (asked now or by the roll resumed): no cordon, drain, Ready or
    /// validation.
    CloudOnly,
    /// How the API is reached when not directly, for a debug line.
    Route(&'a str),
    /// The machines being made ready (the etcd backup).
    Preparing(Preparing<'a>),
}

/// How `rolling-update cluster --yes` ended, once it held the lock.
pub(crate) enum RollingReport {
    /// No journal to resume and nothing to roll.
    NothingToRoll,
    /// The engine ran.
    Ran(Box<Ran>),
}

/// A roll the engine ran, to its end or to where it stopped.
pub(crate) struct Ran {
    /// The roll done, or why it stopped (the journal says where each node is).
    pub outcome: Result<Journal, RollError>,
    /// The journal as the store holds it after the run.
    pub stored: Option<Journal>,
    /// Whether the roll ran under `--cloudonly` (asked now or by the roll resumed).
    pub cloud_only: bool,
}

/// `rolling-update cluster` opened on one cluster: its platform, the options.
pub(crate) struct RollingUpdate {
    store: Arc<dyn StateStore>,
    /// The cluster resolved once, by the caller (with `--bundle`): the plan reads its groups,
    /// sizes and version, the renderer its settings.
    resolved: ResolvedCluster,
    options: RollingOptions,
    platform: Platform,
}

/// Opens a roll (or `get instances`) of `resolved` (as the store resolves it, once). A
/// tampered, truncated or incomplete `--bundle` is refused here, naming the entry, before the
/// preview: no node is cordoned for a roll that could not install.
pub(crate) async fn open(
    store: Arc<dyn StateStore>,
    mut resolved: ResolvedCluster,
    options: RollingOptions,
) -> Result<RollingUpdate, RollingError> {
    resolved.completed =
        super::update::bundle_for_run(resolved.completed, options.bundle.as_deref());
    crate::provision::render::check_bundle(&resolved).map_err(anyhow::Error::from)?;
    let reach = Reach {
        private_address: options.ssh_private_address,
    };
    let platform = Platform::open(&store, &resolved, reach).await?;
    Ok(RollingUpdate {
        store,
        resolved,
        options,
        platform,
    })
}

impl RollingUpdate {
    /// The cluster as this run sees it (with `--bundle`).
    pub(crate) fn cluster(&self) -> &Cluster {
        &self.resolved.completed
    }

    async fn client(&self) -> anyhow::Result<(Kube, ClientGuard)> {
        credentials::kube_client(
            &self.store,
            &self.resolved.completed,
            self.options.kubeconfig.as_deref(),
            false,
        )
        .await
    }

    /// Ready per node name, or why it is unknown; and the API's route when one was taken.
    async fn readiness(&self) -> (Result<BTreeMap<String, bool>, String>, Option<String>) {
        let ask = async {
            let (kube, guard) = self.client().await.map_err(|e| (format!("{e:#}"), None))?;
            let route = guard.route().map(str::to_string);
            match kube.list_nodes().await {
                Ok(nodes) => Ok((
                    nodes.into_iter().map(|n| (n.name, n.ready)).collect(),
                    route,
                )),
                Err(e) => Err((format!("{:#}", anyhow::Error::from(e)), route)),
            }
        };
        match tokio::time::timeout(READY_WAIT, ask).await {
            Ok(Ok((ready, route))) => (Ok(ready), route),
            Ok(Err((e, route))) => (Err(e), route),
            Err(_) => (
                Err(format!(
                    "the API did not answer within {}s",
                    READY_WAIT.as_secs()
                )),
                None,
            ),
        }
    }

    /// The preview, read-only: the machines and their provisioning records through the
    /// platform, each node's Ready (unknown when the API does not answer), the plan.
    pub(crate) async fn plan(&self) -> Result<RollingPlan, RollingError> {
        let machines = self
            .platform
            .roll_observe(&self.store, self.options.concurrency)
            .await?;
        let (ready, route) = self.readiness().await;
        let (ready, ready_unknown) = match ready {
            Ok(r) => (Some(r), None),
            Err(e) => (None, Some(e)),
        };
        let (plan, problems) = run::plan(
            &self.resolved,
            machines,
            ready.as_ref(),
            &self.options.selection,
        );
        Ok(RollingPlan {
            plan,
            problems,
            ready_unknown,
            route,
        })
    }

    /// `--yes` under the cluster lock the caller holds as `guard` (see the module's text).
    /// `plan` is the preview's: a new journal is made from it. `events` makes the engine's
    /// progress sink once the journal's nodes are known. The first signal caught by
    /// `interrupts` asks the engine to stop at a safe point.
    pub(crate) async fn apply(
        self,
        plan: &RollPlan,
        guard: &LockGuard,
        interrupts: &Interrupts,
        say: &(dyn Fn(RollingEvent<'_>) + Sync),
        events: impl FnOnce(&Journal) -> RollEvents,
    ) -> Result<RollingReport, RollingError> {
        let name = self.resolved.name.clone();
        let store = self.store.clone();
        let (file, start) = run::start(store.as_ref(), &name, plan, guard, self.options.cloud_only)
            .await
            .map_err(anyhow::Error::from)?;
        let journal = match start {
            Start::Resume(j) => {
                say(RollingEvent::Resuming(&j));
                j
            }
            Start::New(j) => j,
            Start::NothingToRoll => return Ok(RollingReport::NothingToRoll),
        };
        let cloud_only = self.options.cloud_only || journal.cloud_only;
        if cloud_only {
            say(RollingEvent::CloudOnly);
        }
        let client = if cloud_only {
            None
        } else {
            let client = self.client().await?;
            if let Some(route) = client.1.route() {
                say(RollingEvent::Route(route));
            }
            Some(client)
        };
        let kube = client.as_ref().map(|(k, _)| k.clone());
        let expect = match kube {
            Some(_) => Some(
                crate::addons::validate::Expectations::from_spec(
                    &self.resolved.completed,
                    &self.resolved.completed_groups,
                )
                .map_err(anyhow::Error::from)?,
            ),
            None => None,
        };
        let events = events(&journal);
        let RollingUpdate {
            resolved,
            options,
            platform,
            ..
        } = self;
        // The machines: re-provisioned in place on metal, replaced through their group on AWS.
        let preparing = |p: Preparing<'_>| say(RollingEvent::Preparing(p));
        let rollers = platform
            .rollers(Roll {
                store: &store,
                groups: &resolved.completed_groups,
                concurrency: options.concurrency,
                guard,
                kube: kube.clone(),
                journal: &journal,
                plan,
                events: events.clone(),
                interrupts,
                say: &preparing,
            })
            .await?;
        // etcd's members are part of validation.
        let etcd = Some(rollers.etcd.clone());
        let roll_options = RollOptions {
            drain_timeout: options.drain_timeout,
            validation_timeout: options.validation_timeout,
            validate_count: options.validate_count,
            cloud_only,
            ..RollOptions::default()
        };
        let lock_check = || guard.check();
        let cancel = interrupts.flag();
        let outcome = {
            // Dropped with this block: its etcd check must be gone before the fleet closes.
            let kube_api;
            let api: &dyn engine::ClusterApi = match (kube, expect) {
                (Some(kube), Some(expect)) => {
                    kube_api = engine::KubeCluster {
                        kube,
                        cluster: resolved.completed.clone(),
                        expect,
                        poll: Duration::from_secs(2),
                        etcd: etcd.clone(),
                    };
                    &kube_api
                }
                _ => &run::NoApi,
            };
            engine::run(
                file,
                journal,
                api,
                rollers.roller.as_ref(),
                &roll_options,
                &events,
                cancel,
                &lock_check,
            )
            .await
        };
        // The gate's etcd check and the roller hold the fleet, which closes only once it is the
        // last.
        drop(etcd);
        rollers.close().await;
        drop(client);
        let (_, stored) = JournalFile::load(store.as_ref(), &name)
            .await
            .map_err(anyhow::Error::from)?;
        Ok(RollingReport::Ran(Box::new(Ran {
            outcome,
            stored,
            cloud_only,
        })))
    }
}
