//! `rolling-update cluster --yes` without the command line: executes a journaled roll.
//!
//! The roll talks to the cluster through [`ClusterApi`] (taint, cordon, drain, Ready,
//! uncordon, validation) and to the machines through [`NodeRoller`] (replace or re-provision);
//! the CLI passes the real ones, tests an in-memory fake. Per batch, every node goes
//! cordon (a `PreferNoSchedule` taint first when it is replaced) -> drain -> replace or
//! re-provision -> Ready -> uncordon, journaling each step before the next; then the cluster
//! must pass validation `validate_count` times in a row within `validation_timeout` before the
//! batch counts as done and the next starts. Control planes are batches of one.
//!
//! Interruption (Ctrl-C): a step that must not be cut (cordon, the replacement itself) is
//! finished; a step that may be abandoned safely (drain, waiting for Ready, validation) is
//! abandoned. Either way the journal records where the node is and the run returns
//! [`RollError::Interrupted`]; the next run resumes from there.
//!
//! Caveats: `cloud_only` skips taint, cordon, drain, Ready and validation entirely (for a
//! cluster whose API is down); the caller says so loudly. Surge instances (AWS `maxSurge`) are
//! the roller's: [`NodeRoller::before_batch`] runs before a batch is cordoned. A machine that
//! is no Kubernetes node (an AWS bastion, [`NodeRoller::kubernetes_node`]) is replaced without
//! taint, cordon, drain, Ready or uncordon; the health gate still runs after its batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::join_all;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::Api;
use tokio::sync::{Mutex, watch};

use std::collections::BTreeMap;

use crate::addons::validate::{self, Expectations};
use crate::kube::{DrainEvent, DrainOptions, EvictOptions, Kube, KubeError, Taint};
use crate::nodes::Target;
use crate::nodes::journal::{Journal, JournalError, JournalFile, JournalNode, NodeStep};
use crate::nodes::roll::{
    GroupInput, GroupRole, NodeInput, PROVISIONED_FILE, Provisioned, RollAction,
};
use crate::ops::nodes::NodeOptions;
use crate::provision::render::Renderer;
use crate::spec::{Cluster, HostRole, ResolvedCluster};
use crate::ssh::task::{ExecError, HostExecutor};
use crate::state::StateStore;
use crate::state::lock::LockError;

/// The taint put on nodes about to be replaced, so evicted pods prefer other nodes.
pub(crate) const REPLACING_TAINT: &str = "kprov.dev/rolling-update";

/// The waits and gates of a roll, from `rolling-update cluster`'s flags; [`Default`] is what
/// the flags default to.
#[derive(Debug, Clone)]
pub struct RollOptions {
    /// `--drain-timeout` per node (default 15 minutes).
    pub drain_timeout: Duration,
    /// `--validation-timeout`: the whole health gate of a batch.
    pub validation_timeout: Duration,
    /// `--validate-count`: consecutive passes the gate needs.
    pub validate_count: u32,
    /// Between validation attempts.
    pub validation_interval: Duration,
    /// How long a replaced or re-provisioned node may take to be Ready.
    pub ready_timeout: Duration,
    /// `--cloudonly`: the API is not asked (no drain, no Ready, no validation gate).
    pub cloud_only: bool,
}

impl Default for RollOptions {
    fn default() -> Self {
        RollOptions {
            drain_timeout: Duration::from_secs(15 * 60),
            validation_timeout: Duration::from_secs(15 * 60),
            validate_count: 2,
            validation_interval: Duration::from_secs(10),
            ready_timeout: Duration::from_secs(15 * 60),
            cloud_only: false,
        }
    }
}

/// The cluster's API as a roll needs it. Errors name the node and keep their cause; their
/// text is a sentence naming what failed.
#[async_trait]
pub trait ClusterApi: Send + Sync {
    /// Puts `REPLACING_TAINT` (`kprov.dev/rolling-update`, PreferNoSchedule) on `node`, so
    /// pods evicted from the batch prefer other nodes.
    async fn taint_prefer_no_schedule(&self, node: &str) -> Result<(), ObserveError>;
    /// Marks `node` unschedulable before its drain.
    async fn cordon(&self, node: &str) -> Result<(), ObserveError>;
    /// Evicts every pod that must leave; on timeout the error names the pods left and the
    /// PodDisruptionBudget blocking each.
    async fn drain(&self, node: &str, timeout: Duration) -> Result<(), ObserveError>;
    /// The `lastHeartbeatTime` of `node`'s Ready condition as the API serves it (`None`: no
    /// such node, condition or time). Read before a roll restarts the node's kubelet.
    async fn ready_heartbeat(&self, node: &str) -> Result<Option<Heartbeat>, ObserveError>;
    /// Until `node` is Ready. With `after` (the heartbeat read before its kubelet restarted),
    /// only a Ready condition whose heartbeat is strictly newer counts: right after a restart
    /// the Node still shows the old kubelet's Ready, and the new kubelet posts NotReady (its
    /// runtime and PLEG not checked yet) before it posts Ready.
    async fn wait_ready(
        &self,
        node: &str,
        timeout: Duration,
        after: Option<&Heartbeat>,
    ) -> Result<(), ObserveError>;
    /// Makes `node` schedulable again, once it is Ready after its roll.
    async fn uncordon(&self, node: &str) -> Result<(), ObserveError>;
    /// One validation of the whole cluster (nodes Ready, control plane and etcd healthy,
    /// kube-system available, nothing uninitialized).
    async fn validate(&self) -> Result<(), ValidateError>;
}

/// etcd's side of validation: the validation gate asks it after the API's checks.
#[async_trait]
pub trait EtcdHealth: Send + Sync {
    /// Ok when every member of etcd's member list is healthy; otherwise a sentence naming
    /// each unhealthy member (name, peer URL, host), or why the list could not be read.
    async fn check(&self) -> Result<(), EtcdError>;
}

/// A Ready condition's `lastHeartbeatTime` (RFC 3339 as the API serves it, compared only with
/// other times the API served: never with this machine's clock).
pub(crate) type Heartbeat = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The heartbeat of `node`'s Ready condition as the API serves it now (`None`: no Node, or
/// no Ready condition yet).
pub(crate) async fn node_ready_heartbeat(
    kube: &crate::kube::Kube,
    node: &str,
) -> Result<Option<Heartbeat>, ObserveError> {
    let found = read_node(kube, node).await?;
    Ok(found
        .as_ref()
        .and_then(ready_condition)
        .and_then(|c| c.last_heartbeat_time.clone()))
}

/// `node`'s Node object as the API serves it now (`None`: no such Node).
async fn read_node(kube: &Kube, node: &str) -> Result<Option<Node>, ObserveError> {
    Api::<Node>::all(kube.client().clone())
        .get_opt(node)
        .await
        .map_err(|source| ObserveError::Read {
            node: node.to_string(),
            source,
        })
}

/// A change made to `node` through the API (`verb`: "cordoning", ...), its failure an
/// [`ObserveError::Change`] naming the node and the change.
async fn change(
    node: &str,
    verb: &'static str,
    made: impl Future<Output = Result<(), KubeError>>,
) -> Result<(), ObserveError> {
    made.await.map_err(|source| ObserveError::Change {
        node: node.to_string(),
        verb,
        source,
    })
}

/// What [`NodeRoller::roll`] did to a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rolled {
    /// The name of the node that took its place, when it is a new one.
    pub replacement: Option<String>,
    /// The node's kubelet was restarted in place: its Ready must be one posted after that.
    pub kubelet_restarted: bool,
    /// The Ready heartbeat the roller read right before the first step that restarts the
    /// kubelet. Steps before it (a kubeadm upgrade pulling images) can take minutes, and the
    /// old kubelet keeps posting meanwhile: a heartbeat read before the roll began would let
    /// such a post pass for the new kubelet's. `None`: the engine's own read counts.
    pub ready_before: Option<Heartbeat>,
}

impl Rolled {
    /// A node replaced by the new node `node` (whose kubelet the engine waits Ready for).
    pub fn replaced_by(node: String) -> Rolled {
        Rolled {
            replacement: Some(node),
            kubelet_restarted: false,
            ready_before: None,
        }
    }
}

/// The machines.
#[async_trait]
pub trait NodeRoller: Send + Sync {
    /// Replaces or re-provisions `node` as its action says (with its kubeadm upgrade, if any),
    /// and says what it did. Must be safe to call again for a node whose previous attempt was
    /// cut short.
    async fn roll(&self, node: &JournalNode) -> Result<Rolled, RollerError>;

    /// Before a batch is cordoned (AWS: the surge's new instances start and join here, so
    /// capacity is added before any is taken away). Must be safe to call again on resume.
    async fn before_batch(&self, _nodes: &[JournalNode]) -> Result<(), RollerError> {
        Ok(())
    }

    /// Whether `node` is a Kubernetes node. One that is not (an AWS bastion) is replaced
    /// without taint, cordon, drain, waiting for Ready or uncordon.
    fn kubernetes_node(&self, _node: &JournalNode) -> bool {
        true
    }
}

/// What happens, for the printer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollEvent {
    /// A node reached a step.
    Step {
        /// The node, by its journal name.
        node: String,
        /// The step it reached (as the journal records it).
        step: NodeStep,
        /// Time since this run began working on the node.
        elapsed: Duration,
    },
    /// A node is working on something (drain, replace, Ready).
    Working {
        /// The node, by its journal name.
        node: String,
        /// What it waits on, as a phrase for the spinner.
        what: String,
    },
    /// A validation attempt of the gate: passes so far, needed.
    Gate {
        /// Consecutive passes so far (0 after a failure).
        passes: u32,
        /// Consecutive passes the gate needs (`--validate-count`).
        needed: u32,
        /// Why this attempt failed; `None`: it passed.
        error: Option<String>,
    },
    /// A line for the user that is no step (a node done without validation under
    /// `--cloudonly`).
    Note(String),
}

/// Where [`run`] sends its [`RollEvent`]s, as they happen (from the batch's tasks: it must be
/// cheap and must not block).
pub type RollEvents = Arc<dyn Fn(&RollEvent) + Send + Sync>;

/// Why [`run`] stopped before the journal was finished; the journal on the store says where
/// each node is, and a run started again resumes from there.
#[derive(Debug, thiserror::Error)]
pub enum RollError {
    /// A node's step failed: `reason` is what the journal records for it, `cause` the
    /// failure as the cluster side or the roller returned it (match on it, never on `reason`).
    #[error("the roll stopped at {node}: {reason}")]
    Stopped {
        /// The node, by its journal name.
        node: String,
        /// The failure as the journal records it for the node.
        reason: String,
        /// The failure itself.
        #[source]
        cause: StepError,
    },
    /// The validation gate after a batch did not see `needed` passes in a row in time.
    #[error(
        "the cluster did not pass validation {needed} times in a row within {timeout:?}: {last}"
    )]
    Validation {
        /// Consecutive passes the gate needed (`--validate-count`).
        needed: u32,
        /// The gate's whole time (`--validation-timeout`).
        timeout: Duration,
        /// The last failed attempt, when it was and why.
        last: String,
        /// The last attempt's failure (`None`: no attempt finished in time).
        #[source]
        cause: Option<ValidateError>,
    },
    /// Ctrl-C (or SIGTERM) at a safe point: where the roll stopped and why.
    #[error(
        "interrupted: {0}; the journal records where each node is, run `rolling-update cluster --yes` again to resume"
    )]
    Interrupted(String),
    /// The cluster lock was lost or could not be renewed: nothing more was written.
    #[error("the cluster lock: {0}")]
    Lock(LockError),
    /// The journal could not be written to the store.
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// Which side of a node's step failed, as [`RollError::Stopped`] carries it.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The cluster's API ([`ClusterApi`]): taint, cordon, drain, Ready, uncordon.
    #[error(transparent)]
    Observe(#[from] ObserveError),
    /// The machines ([`NodeRoller`]): the replacement, the re-provisioning, the surge.
    #[error(transparent)]
    Roller(#[from] RollerError),
}

/// Why a step of a node through the cluster's API failed ([`ClusterApi`]). Each names the
/// node; its text is what the journal and the user read.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// The API failed a change of the Node (`verb`: tainting, cordoning, uncordoning).
    #[error("{verb} node {node}: {source}")]
    Change {
        /// The node, by its journal name.
        node: String,
        /// What was asked of the Node, as the message words it.
        verb: &'static str,
        /// The API's failure.
        #[source]
        source: crate::kube::KubeError,
    },
    /// The drain did not finish: a pod would not leave (a budget), or one may not be evicted.
    #[error("{source}")]
    Drain {
        /// The node, by its journal name.
        node: String,
        /// Why the drain stopped, naming the pods left.
        #[source]
        source: crate::kube::DrainError,
    },
    /// The Node could not be read.
    #[error("reading node {node}: {source}")]
    Read {
        /// The node, by its journal name.
        node: String,
        /// The API's failure.
        #[source]
        source: kube::Error,
    },
    /// The node did not become Ready in time (`why`: what its Ready condition showed).
    #[error("{why}")]
    NotReady {
        /// The node, by its journal name.
        node: String,
        /// The whole message: the node, the time waited and what its Ready condition showed.
        why: String,
    },
    /// `--cloudonly`: there is no API to ask.
    #[error("{node}: --cloudonly does not use the cluster's API")]
    NoApi {
        /// The node, by its journal name.
        node: String,
    },
    /// Another cluster side's failure (an implementation outside this module), as it says it.
    #[error("{message}")]
    Failed {
        /// The node, by its journal name.
        node: String,
        /// The whole message, naming the node.
        message: String,
    },
}

/// Why one validation of the cluster failed ([`ClusterApi::validate`]).
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// The API's checks could not be run.
    #[error("{0}")]
    Check(#[source] crate::addons::AddonError),
    /// The API's checks found failures (each `kind name: message`).
    #[error("{}", .0.join("; "))]
    Failures(Vec<String>),
    /// etcd's members are not all healthy.
    #[error("{0}")]
    Etcd(#[source] EtcdError),
    /// Both: each is reported.
    #[error("{}; {etcd}", .api.join("; "))]
    Both {
        /// The API's failures, as in [`ValidateError::Failures`].
        api: Vec<String>,
        /// etcd's.
        #[source]
        etcd: EtcdError,
    },
    /// `--cloudonly`: there is no API to ask.
    #[error("--cloudonly does not use the cluster's API")]
    NoApi,
}

/// Why etcd's health check failed ([`EtcdHealth::check`]).
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// A member (or more) is unhealthy: each named (name, peer URL, host).
    #[error("{0}")]
    Unhealthy(String),
    /// The member list could not be read, or no control plane runs to ask.
    #[error("{0}")]
    Unreachable(String),
}

/// Why a machine could not be rolled ([`NodeRoller`]). Each names the node (the journal's
/// name; empty for a batch's surge, whose error names its group).
#[derive(Debug, thiserror::Error)]
pub enum RollerError {
    /// The cloud failed a call (terminating, resizing a group); `class` says whether AWS
    /// throttled it ([`RollerError::retryable`]).
    #[error("{what}: {source}")]
    Cloud {
        /// The node, by its journal name.
        node: String,
        /// The call that failed, as a phrase (`terminating i-0abc (NODE)`).
        what: String,
        /// The cloud's error, its class kept.
        #[source]
        source: crate::cloud::CloudError,
    },
    /// The cluster lock was lost between the roller's waits: nothing more was changed.
    #[error("{source}")]
    Lock {
        /// The node, by its journal name.
        node: String,
        /// Why the lock is gone.
        #[source]
        source: crate::state::lock::LockError,
    },
    /// The roller refuses the node as it is (not the cluster's, its record unreadable, a
    /// control plane without a successor): nothing was changed on it.
    #[error("{message}")]
    Refused {
        /// The node, by its journal name.
        node: String,
        /// The whole message: why, and what to do.
        message: String,
    },
    /// A step on the machine failed (SSH, kubeadm, a join, a wait), as it says.
    #[error("{message}")]
    Failed {
        /// The node, by its journal name.
        node: String,
        /// The whole message, naming what failed.
        message: String,
    },
}

impl RollerError {
    /// A [`RollerError::Failed`] of `node`.
    pub fn failed(node: &str, message: impl Into<String>) -> RollerError {
        RollerError::Failed {
            node: node.to_string(),
            message: message.into(),
        }
    }

    /// A [`RollerError::Refused`] of `node`.
    pub fn refused(node: &str, message: impl Into<String>) -> RollerError {
        RollerError::Refused {
            node: node.to_string(),
            message: message.into(),
        }
    }

    /// The node it is about.
    pub fn node(&self) -> &str {
        match self {
            RollerError::Cloud { node, .. }
            | RollerError::Lock { node, .. }
            | RollerError::Refused { node, .. }
            | RollerError::Failed { node, .. } => node,
        }
    }

    /// A cloud call AWS throttled or found not ready yet: the same run may try it again.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            RollerError::Cloud {
                source: crate::cloud::CloudError::Api { class, .. },
                ..
            } if matches!(
                class,
                crate::cloud::ErrorClass::Throttled | crate::cloud::ErrorClass::NotReady
            )
        )
    }
}

/// The journal in memory and on the store, written with group commit: the nodes of a batch record
/// their steps at nearly the same moment, and one store write then carries every change made while
/// the previous write was in flight. A `record` returns only once a write holding its change is on
/// the store; a `note` (an uncordon, a batch validated: harmless to repeat) waits for none and is
/// written alongside the next wait, or as the roll stops. A batch of 20 thus costs a few writes
/// instead of 100 (each a full journal, serialized and written with compare-and-swap), which kept
/// large rolls far from their bound (scripts/bench-rolling).
struct Shared<'a> {
    state: Mutex<InMemory>,
    file: Mutex<OnStore<'a>>,
    /// When the roll waited, and on what (see [`RollTiming`]).
    spans: std::sync::Mutex<Vec<(Wait, Instant, Instant)>>,
}

/// What a roll waits on, for [`RollTiming`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// A journal write that the next step waits for.
    Journal,
    /// A validation gate.
    Validate,
    /// The cluster through the API: cordon, drain, the wait for Ready, uncordon.
    Observe,
    /// The machines: a replacement or re-provision.
    Roll,
}

/// Where a roll's wall time went (`scripts/bench-rolling` prints it beside the ratio): for each
/// kind of wait, the time during which at least one node (or the roll itself) was in it.
/// Kinds overlap (a write beside a validation), so they do not add up to the wall time.
#[derive(Debug, Clone, Default)]
pub struct RollTiming {
    /// Waiting for a journal write before the next step (not the writes that ride beside a
    /// validation or a wait for Ready while they run).
    pub journal: Duration,
    /// In a validation gate.
    pub validate: Duration,
    /// On the cluster's API: taint, cordon, drain, the wait for Ready, uncordon.
    pub observe: Duration,
    /// On the machines: a replacement or a re-provisioning ([`NodeRoller::roll`]).
    pub roll: Duration,
}

struct InMemory {
    journal: Journal,
    /// Changes made to `journal` so far.
    changes: u64,
}

struct OnStore<'a> {
    file: JournalFile<'a>,
    /// The `changes` count of the journal last written.
    saved: Option<u64>,
}

impl<'a> Shared<'a> {
    fn new(file: JournalFile<'a>, journal: Journal) -> Self {
        Shared {
            state: Mutex::new(InMemory {
                journal,
                changes: 0,
            }),
            file: Mutex::new(OnStore { file, saved: None }),
            spans: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// `fut`, its time noted as a wait on `kind`.
    async fn timed<T>(&self, kind: Wait, fut: impl std::future::Future<Output = T>) -> T {
        let start = Instant::now();
        let r = fut.await;
        self.span(kind, start, Instant::now());
        r
    }

    fn span(&self, kind: Wait, start: Instant, end: Instant) {
        if end > start
            && let Ok(mut spans) = self.spans.lock()
        {
            spans.push((kind, start, end));
        }
    }

    /// The union of each kind's spans.
    fn timing(&self) -> RollTiming {
        let spans = self.spans.lock().map(|s| s.clone()).unwrap_or_default();
        let union = |kind: Wait| {
            let mut v: Vec<(Instant, Instant)> = spans
                .iter()
                .filter(|(k, _, _)| *k == kind)
                .map(|&(_, a, b)| (a, b))
                .collect();
            v.sort();
            let mut total = Duration::ZERO;
            let mut open: Option<(Instant, Instant)> = None;
            for (a, b) in v {
                open = match open {
                    Some((s, e)) if a <= e => Some((s, e.max(b))),
                    Some((s, e)) => {
                        total += e - s;
                        Some((a, b))
                    }
                    None => Some((a, b)),
                };
            }
            total + open.map_or(Duration::ZERO, |(s, e)| e - s)
        };
        RollTiming {
            journal: union(Wait::Journal),
            validate: union(Wait::Validate),
            observe: union(Wait::Observe),
            roll: union(Wait::Roll),
        }
    }

    /// Returns once the store holds every change made before the call.
    async fn commit(
        &self,
        lock_check: &(dyn Fn() -> Result<(), LockError> + Send + Sync),
    ) -> Result<(), RollError> {
        let wanted = self.state.lock().await.changes;
        let mut f = self.file.lock().await;
        if f.saved.is_some_and(|saved| saved >= wanted) {
            return Ok(());
        }
        lock_check().map_err(RollError::Lock)?;
        let (mut snapshot, changes) = {
            let s = self.state.lock().await;
            (s.journal.clone(), s.changes)
        };
        f.file.save(&mut snapshot).await?;
        f.saved = Some(changes);
        self.state.lock().await.journal.updated_at = snapshot.updated_at;
        Ok(())
    }
}

/// Runs (or resumes) the roll `journal` describes. `lock_check` fails once the cluster lock
/// was lost: nothing is written after that.
#[allow(clippy::too_many_arguments)]
pub async fn run<'a>(
    file: JournalFile<'a>,
    journal: Journal,
    api: &dyn ClusterApi,
    roller: &dyn NodeRoller,
    options: &RollOptions,
    events: &RollEvents,
    cancel: watch::Receiver<bool>,
    lock_check: &(dyn Fn() -> Result<(), LockError> + Send + Sync),
) -> Result<Journal, RollError> {
    run_timed(
        file, journal, api, roller, options, events, cancel, lock_check,
    )
    .await
    .0
}

/// [`run`], and where its time went.
#[allow(clippy::too_many_arguments)]
pub async fn run_timed<'a>(
    file: JournalFile<'a>,
    journal: Journal,
    api: &dyn ClusterApi,
    roller: &dyn NodeRoller,
    options: &RollOptions,
    events: &RollEvents,
    cancel: watch::Receiver<bool>,
    lock_check: &(dyn Fn() -> Result<(), LockError> + Send + Sync),
) -> (Result<Journal, RollError>, RollTiming) {
    let shared = Shared::new(file, journal);
    let result =
        match roll_batches(&shared, api, roller, options, events, &cancel, lock_check).await {
            Ok(()) => Ok(shared.state.lock().await.journal.clone()),
            Err(e) => {
                // Whatever stopped the roll, the store gets the steps noted but not yet written
                // (an uncordon before a failed gate), unless the lock is gone: then nothing is.
                let _ = shared.commit(lock_check).await;
                Err(e)
            }
        };
    (result, shared.timing())
}

async fn roll_batches(
    shared: &Shared<'_>,
    api: &dyn ClusterApi,
    roller: &dyn NodeRoller,
    options: &RollOptions,
    events: &RollEvents,
    cancel: &watch::Receiver<bool>,
    lock_check: &(dyn Fn() -> Result<(), LockError> + Send + Sync),
) -> Result<(), RollError> {
    let cancel = cancel.clone();
    shared
        .timed(Wait::Journal, shared.commit(lock_check))
        .await?;
    if !options.cloud_only {
        // A cluster already unhealthy (etcd without quorum to spare, a control plane down) is
        // not made worse by taking a node away.
        let first = shared.state.lock().await.journal.remaining_batches();
        if !first.is_empty() {
            shared
                .timed(
                    Wait::Validate,
                    gate(api, options, events, &cancel, 1, "before the roll starts"),
                )
                .await?;
        }
    }
    let batches = shared.state.lock().await.journal.remaining_batches();
    for batch in batches {
        let nodes: Vec<JournalNode> = {
            let s = shared.state.lock().await;
            batch.iter().map(|&i| s.journal.nodes[i].clone()).collect()
        };
        if let Err(cause) = roller.before_batch(&nodes).await {
            let reason = cause.to_string();
            let node = nodes
                .first()
                .map(|n| n.node_name.clone())
                .unwrap_or_default(); // a batch is never empty
            if cancelled(&cancel) {
                // The batch's nodes keep their step; the journal says what was in flight
                // (a surge instance's SSH or etcd member, say) for `get`/the next run.
                stopped_in_flight(
                    shared,
                    &batch,
                    &format!("interrupted before its cordon: {reason}"),
                    lock_check,
                )
                .await?;
                return Err(RollError::Interrupted(format!(
                    "before {node} was cordoned: {reason}"
                )));
            }
            return Err(RollError::Stopped {
                node,
                reason,
                cause: cause.into(),
            });
        }
        let results = join_all(
            batch
                .iter()
                .map(|&i| advance(shared, i, api, roller, options, events, &cancel, lock_check)),
        )
        .await;
        let mut failure = None;
        for r in results {
            if let Err(e) = r {
                // An interruption outranks a failure of a sibling: both are recorded.
                match (&failure, &e) {
                    (None, _) | (Some(RollError::Stopped { .. }), RollError::Interrupted(_)) => {
                        failure = Some(e)
                    }
                    _ => {}
                }
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        if !options.cloud_only {
            let names: Vec<String> = {
                let s = shared.state.lock().await;
                batch
                    .iter()
                    .map(|&i| s.journal.nodes[i].node_name.clone())
                    .collect()
            };
            // The batch's uncordons are written while the cluster is validated, not before.
            let when = format!("after {}", names.join(", "));
            let gated = beside_write(
                shared,
                lock_check,
                shared.timed(
                    Wait::Validate,
                    gate(api, options, events, &cancel, options.validate_count, &when),
                ),
            )
            .await?;
            if let Err(e @ RollError::Interrupted(_)) = gated {
                stopped_in_flight(
                    shared,
                    &batch,
                    &format!("interrupted during the validation {when}"),
                    lock_check,
                )
                .await?;
                return Err(e);
            }
            gated?;
        }
        lock_check().map_err(RollError::Lock)?;
        let names: Vec<String> = {
            let mut s = shared.state.lock().await;
            for &i in &batch {
                s.journal.nodes[i].step = NodeStep::Validated;
                s.journal.nodes[i].stopped = None;
            }
            s.changes += 1;
            batch
                .iter()
                .map(|&i| s.journal.nodes[i].node_name.clone())
                .collect()
        };
        // Not written yet: a resume that finds the batch Uncordoned only validates again.
        for node in names {
            if options.cloud_only {
                // Nothing was checked: "validated" would claim a gate that never ran.
                events(&RollEvent::Note(format!(
                    "{node}: done, the cluster not checked (--cloudonly)"
                )));
            } else {
                events(&RollEvent::Step {
                    node,
                    step: NodeStep::Validated,
                    elapsed: Duration::ZERO,
                });
            }
        }
    }
    lock_check().map_err(RollError::Lock)?;
    {
        let mut s = shared.state.lock().await;
        s.journal.finished = true;
        s.changes += 1;
    }
    shared.timed(Wait::Journal, shared.commit(lock_check)).await
}

/// Records on every node of `batch` why it stopped where it is (its step unchanged), and
/// returns once it is written.
async fn stopped_in_flight(
    shared: &Shared<'_>,
    batch: &[usize],
    why: &str,
    lock_check: &(dyn Fn() -> Result<(), LockError> + Send + Sync),
) -> Result<(), RollError> {
    {
        let mut s = shared.state.lock().await;
        lock_check().map_err(RollError::Lock)?;
        for &i in batch {
            s.journal.nodes[i].stopped = Some(why.to_string());
        }
        s.changes += 1;
    }
    shared.commit(lock_check).await
}

/// Records in memory that node `i` reached `step`; the next write carries it.
async fn note(
    shared: &Shared<'_>,
    i: usize,
    step: NodeStep,
    lock_check: &(dyn Fn() -> Result<(), LockError> + Send + Sync),
) -> Result<(), RollError> {
    let mut s = shared.state.lock().await;
    lock_check().map_err(RollError::Lock)?;
    s.journal.nodes[i].step = step;
    s.journal.nodes[i].stopped = None;
    s.changes += 1;
    Ok(())
}

/// How long a drain runs before the node's `Cordoned` is written (see `advance`).
const CORDONED_WRITTEN_AFTER: Duration = Duration::from_millis(500);

/// Records that node `i` reached `step` (or stopped, with why), and returns once it is
/// written.
async fn record(
    shared: &Shared<'_>,
    i: usize,
    step: NodeStep,
    stopped: Option<String>,
    replacement: Option<String>,
    lock_check: &(dyn Fn() -> Result<(), LockError> + Send + Sync),
) -> Result<(), RollError> {
    {
        let mut s = shared.state.lock().await;
        lock_check().map_err(RollError::Lock)?;
        let n = &mut s.journal.nodes[i];
        n.step = step;
        n.stopped = stopped;
        if replacement.is_some() {
            n.replacement = replacement;
        }
        s.changes += 1;
    }
    shared.timed(Wait::Journal, shared.commit(lock_check)).await
}

/// Journals why node `i` stopped at `step`, and gives `error`, which ends its run (the
/// journal's own error where the record could not be written).
async fn stopped_at(
    shared: &Shared<'_>,
    i: usize,
    step: NodeStep,
    why: String,
    error: RollError,
    lock_check: &(dyn Fn() -> Result<(), LockError> + Send + Sync),
) -> RollError {
    match record(shared, i, step, Some(why), None, lock_check).await {
        Ok(()) => error,
        Err(e) => e,
    }
}

/// `wait` (a drain, a wait for Ready, a validation) with the journal written beside it. The
/// write is never cut short, not even by the wait's end: a write dropped midway would leave
/// the journal's version unknown. A failed write cuts the wait short instead: the roll stops
/// at once, not minutes later when a drain or a wait for Ready ends, and no step is taken on
/// a journal the store no longer follows. Time spent on the write after the wait ended counts
/// as a wait on the journal.
async fn beside_write<T>(
    shared: &Shared<'_>,
    lock_check: &(dyn Fn() -> Result<(), LockError> + Send + Sync),
    wait: impl std::future::Future<Output = T>,
) -> Result<T, RollError> {
    let write = shared.commit(lock_check);
    tokio::pin!(write, wait);
    tokio::select! {
        written = &mut write => {
            written?;
            Ok(wait.await)
        }
        r = &mut wait => {
            let waited = Instant::now();
            let written = write.await;
            shared.span(Wait::Journal, waited, Instant::now());
            written?;
            Ok(r)
        }
    }
}

fn cancelled(cancel: &watch::Receiver<bool>) -> bool {
    *cancel.borrow()
}

/// Waits for `fut` unless the operator interrupts first (`None`).
async fn abandonable<T>(
    cancel: &watch::Receiver<bool>,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    let mut cancel = cancel.clone();
    if *cancel.borrow() {
        return None;
    }
    tokio::select! {
        r = fut => Some(r),
        _ = async { while cancel.changed().await.is_ok() { if *cancel.borrow() { return; } } std::future::pending::<()>().await } => None,
    }
}

/// Takes node `i` from wherever the journal says it is to uncordoned.
#[allow(clippy::too_many_arguments)]
async fn advance(
    shared: &Shared<'_>,
    i: usize,
    api: &dyn ClusterApi,
    roller: &dyn NodeRoller,
    options: &RollOptions,
    events: &RollEvents,
    cancel: &watch::Receiver<bool>,
    lock_check: &(dyn Fn() -> Result<(), LockError> + Send + Sync),
) -> Result<(), RollError> {
    let start = Instant::now();
    // The Ready heartbeat read before this run restarted the node's kubelet: only a newer
    // Ready counts. Kept in memory: a run resumed at Replaced waits for any Ready (caveat in
    // docs/rolling-update.md).
    let mut restarted_after: Option<Heartbeat> = None;
    // `Replaced` noted in memory and not yet written: the wait for Ready writes it.
    let mut replaced_unwritten = false;
    loop {
        let node = shared.state.lock().await.journal.nodes[i].clone();
        let name = node.node_name.clone();
        let stop = |reason: String, cause: StepError| RollError::Stopped {
            node: name.clone(),
            reason,
            cause,
        };
        // A step through the API that failed: the journal's reason is its text.
        let observed = |e: ObserveError| stop(e.to_string(), e.into());
        let interrupted = |what: &str| {
            RollError::Interrupted(format!("{name} was {} ({what})", node.step.as_str()))
        };
        let halt = |step: NodeStep, why: String, error: RollError| {
            stopped_at(shared, i, step, why, error, lock_check)
        };
        // A wait through the API (a drain, a wait for Ready) that the operator interrupted or
        // that failed stops the node at `step`, journaled: an interrupt with the journal's
        // reason `why` (`what` for the interruption's text), a failure with `failed: {error}`.
        let waited = async |step: NodeStep,
                            outcome: Option<Result<(), ObserveError>>,
                            (why, what): (&str, &str),
                            failed: String|
               -> Result<(), RollError> {
            match outcome {
                None => Err(halt(step, why.to_string(), interrupted(what)).await),
                Some(Err(e)) => {
                    let why = format!("{failed}: {e}");
                    Err(halt(step, why.clone(), stop(why, e.into())).await)
                }
                Some(Ok(())) => Ok(()),
            }
        };
        if cancelled(cancel) {
            let why = format!("interrupted at step {}", node.step.as_str());
            return Err(halt(node.step, why, interrupted("before its next step")).await);
        }
        // Steps through the API only for nodes the API knows, and not under --cloudonly.
        let skip_api = options.cloud_only || !roller.kubernetes_node(&node);
        // A step passed over (no cordon, drain or uncordon happened) is journaled but not
        // reported: "drained" would tell the operator of a drain that never was.
        let passed_over = skip_api && matches!(node.step, NodeStep::Waiting | NodeStep::Replaced);
        let next = match node.step {
            NodeStep::Uncordoned | NodeStep::Validated => return Ok(()),
            NodeStep::Waiting if skip_api => NodeStep::Drained,
            NodeStep::Waiting => {
                if node.action == RollAction::Replace {
                    shared
                        .timed(Wait::Observe, api.taint_prefer_no_schedule(&name))
                        .await
                        .map_err(&observed)?;
                }
                shared
                    .timed(Wait::Observe, api.cordon(&name))
                    .await
                    .map_err(&observed)?;
                NodeStep::Cordoned
            }
            NodeStep::Cordoned => {
                events(&RollEvent::Working {
                    node: name.clone(),
                    what: "draining".into(),
                });
                // `Cordoned` is written once the drain has run for `CORDONED_WRITTEN_AFTER`
                // (a drain may take minutes: the journal then says where the node is); a drain
                // that ends sooner has it written with `Drained`, one write instead of two.
                // Unwritten, a crash leaves the node `waiting` on the store: cordoning and
                // draining it again on resume is harmless.
                let drain = abandonable(
                    cancel,
                    shared.timed(Wait::Observe, api.drain(&name, options.drain_timeout)),
                );
                tokio::pin!(drain);
                let drained = tokio::select! {
                    r = &mut drain => r,
                    () = tokio::time::sleep(CORDONED_WRITTEN_AFTER) => {
                        beside_write(shared, lock_check, &mut drain).await?
                    }
                };
                waited(
                    NodeStep::Cordoned,
                    drained,
                    (
                        "drain abandoned by an interrupt; the node stays cordoned",
                        "drain abandoned, it stays cordoned",
                    ),
                    "drain failed; the node stays cordoned".to_string(),
                )
                .await?;
                NodeStep::Drained
            }
            NodeStep::Drained => {
                events(&RollEvent::Working {
                    node: name.clone(),
                    what: node.action.as_str().into(),
                });
                // In place, the kubelet may restart: what the Node shows before is what a
                // stale Ready looks like afterwards. Read before anything changes on it.
                let before = if node.action == RollAction::Replace || skip_api {
                    None
                } else {
                    match abandonable(cancel, api.ready_heartbeat(&name)).await {
                        None => {
                            let why = "interrupted before its roll began".to_string();
                            return Err(halt(
                                NodeStep::Drained,
                                why,
                                interrupted("before its roll began"),
                            )
                            .await);
                        }
                        Some(r) => r.map_err(&observed)?,
                    }
                };
                // Never cut short: a half-made replacement is worse than a late exit.
                match shared.timed(Wait::Roll, roller.roll(&node)).await {
                    Ok(rolled) => {
                        if rolled.kubelet_restarted {
                            restarted_after = rolled.ready_before.clone().or(before);
                        }
                        if skip_api {
                            record(
                                shared,
                                i,
                                NodeStep::Replaced,
                                None,
                                rolled.replacement,
                                lock_check,
                            )
                            .await?;
                        } else {
                            // Written while the wait for Ready runs; the uncordon waits for
                            // the write (see `NodeStep::Replaced` below).
                            let mut s = shared.state.lock().await;
                            lock_check().map_err(RollError::Lock)?;
                            let n = &mut s.journal.nodes[i];
                            n.step = NodeStep::Replaced;
                            n.stopped = None;
                            if rolled.replacement.is_some() {
                                n.replacement = rolled.replacement;
                            }
                            s.changes += 1;
                            replaced_unwritten = true;
                        }
                        events(&RollEvent::Step {
                            node: name.clone(),
                            step: NodeStep::Replaced,
                            elapsed: start.elapsed(),
                        });
                        continue;
                    }
                    // The machines' waits end at a signal (AWS: a replacement, SSH, etcd):
                    // an interruption, journaled where the node is, not a failure.
                    Err(e) if cancelled(cancel) => {
                        let why = format!("{} stopped: {e}", node.action.as_str());
                        return Err(halt(NodeStep::Drained, why, interrupted(&e.to_string())).await);
                    }
                    Err(e) => {
                        let why = format!("{} failed: {e}", node.action.as_str());
                        return Err(halt(NodeStep::Drained, why.clone(), stop(why, e.into())).await);
                    }
                }
            }
            NodeStep::Replaced if skip_api => NodeStep::Uncordoned,
            NodeStep::Replaced => {
                let now = node.replacement.clone().unwrap_or_else(|| name.clone());
                events(&RollEvent::Working {
                    node: name.clone(),
                    what: match &restarted_after {
                        Some(t) => format!(
                            "waiting for {now} to be Ready after its kubelet restart (a heartbeat newer than {})",
                            t.0
                        ),
                        None => format!("waiting for {now} to be Ready"),
                    },
                });
                let wait = abandonable(
                    cancel,
                    shared.timed(
                        Wait::Observe,
                        api.wait_ready(&now, options.ready_timeout, restarted_after.as_ref()),
                    ),
                );
                // `Replaced` and the replacement's name are written while the node becomes
                // Ready, and on the store before it is uncordoned: a resume never finds an
                // uncordoned node `drained` (it would roll it again with pods on it). A crash
                // before the write lands leaves it `drained`, as a crash right after the
                // replacement always did: the roller finds its work done.
                let ready = if std::mem::take(&mut replaced_unwritten) {
                    beside_write(shared, lock_check, wait).await?
                } else {
                    wait.await
                };
                waited(
                    NodeStep::Replaced,
                    ready,
                    ("interrupted while waiting for Ready", "waiting for Ready"),
                    format!("{now} did not become Ready"),
                )
                .await?;
                shared
                    .timed(Wait::Observe, api.uncordon(&now))
                    .await
                    .map_err(&observed)?;
                NodeStep::Uncordoned
            }
        };
        // Drained is written before the node is replaced (a resume must not cordon a node that
        // a replacement already took away); Cordoned during a long drain (above). An uncordon
        // is harmless to repeat: its record is written with the batch's validation (see
        // `roll_batches`).
        if next == NodeStep::Drained {
            record(shared, i, next, None, None, lock_check).await?;
        } else {
            note(shared, i, next, lock_check).await?;
        }
        if !passed_over {
            events(&RollEvent::Step {
                node: name.clone(),
                step: next,
                elapsed: start.elapsed(),
            });
        }
    }
}

/// `needed` consecutive validation passes within the timeout.
async fn gate(
    api: &dyn ClusterApi,
    options: &RollOptions,
    events: &RollEvents,
    cancel: &watch::Receiver<bool>,
    needed: u32,
    when: &str,
) -> Result<(), RollError> {
    let needed = needed.max(1);
    let deadline = Instant::now() + options.validation_timeout;
    let mut passes = 0;
    let mut last = String::from("never validated");
    let mut cause = None;
    loop {
        let attempt = abandonable(cancel, api.validate()).await;
        let Some(result) = attempt else {
            return Err(RollError::Interrupted(format!("during validation {when}")));
        };
        match result {
            Ok(()) => {
                passes += 1;
                events(&RollEvent::Gate {
                    passes,
                    needed,
                    error: None,
                });
                if passes >= needed {
                    return Ok(());
                }
            }
            Err(e) => {
                passes = 0;
                events(&RollEvent::Gate {
                    passes,
                    needed,
                    error: Some(e.to_string()),
                });
                last = format!("{when}: {e}");
                cause = Some(e);
            }
        }
        if Instant::now() + options.validation_interval > deadline {
            return Err(RollError::Validation {
                needed,
                timeout: options.validation_timeout,
                last,
                cause,
            });
        }
        if abandonable(cancel, tokio::time::sleep(options.validation_interval))
            .await
            .is_none()
        {
            return Err(RollError::Interrupted(format!("during validation {when}")));
        }
    }
}

/// The real cluster side of a roll: `kube::drain` (kubectl's rules, budgets respected with
/// back-off, bounded) and validation: the checks of `validate cluster` (nodes registered and
/// Ready, none left uninitialized, the add-ons' pods running, kube-system Deployments and
/// DaemonSets available), then etcd's members when `etcd` is set. The roll's first gate is
/// what refuses to start on an unhealthy cluster.
///
/// Caveat: with `etcd: None` (today AWS, until its roller builds an [`EtcdHealth`]) etcd is
/// not asked; a member down shows only through what the API reports.
pub struct KubeCluster {
    /// The cluster's API client.
    pub kube: Kube,
    /// The cluster's spec, which the validation checks the nodes and add-ons against.
    pub cluster: Cluster,
    /// What a healthy cluster has (the nodes by name, the minimum counts, the CNI and CCM).
    pub expect: Expectations,
    /// How often evictions, Ready and pods are re-checked.
    pub poll: Duration,
    /// etcd's members, asked on every validation (`ops::etcd::SshEtcdHealth`).
    pub etcd: Option<Arc<dyn EtcdHealth>>,
}

#[async_trait]
impl ClusterApi for KubeCluster {
    async fn taint_prefer_no_schedule(&self, node: &str) -> Result<(), ObserveError> {
        let taint = Taint {
            key: REPLACING_TAINT.into(),
            value: None,
            effect: "PreferNoSchedule".into(),
        };
        change(node, "tainting", self.kube.add_taint(node, &taint)).await
    }

    async fn cordon(&self, node: &str) -> Result<(), ObserveError> {
        change(node, "cordoning", self.kube.cordon(node)).await
    }

    async fn drain(&self, node: &str, timeout: Duration) -> Result<(), ObserveError> {
        let options = DrainOptions {
            timeout,
            poll: self.poll,
            eviction: EvictOptions {
                deadline: timeout,
                ..EvictOptions::default()
            },
            ..DrainOptions::default()
        };
        self.kube
            .drain(node, &options, &|_: &DrainEvent| {})
            .await
            .map(|_| ())
            .map_err(|source| ObserveError::Drain {
                node: node.to_string(),
                source,
            })
    }

    async fn ready_heartbeat(&self, node: &str) -> Result<Option<Heartbeat>, ObserveError> {
        node_ready_heartbeat(&self.kube, node).await
    }

    async fn wait_ready(
        &self,
        node: &str,
        timeout: Duration,
        after: Option<&Heartbeat>,
    ) -> Result<(), ObserveError> {
        let deadline = Instant::now() + timeout;
        loop {
            let found = read_node(&self.kube, node).await?;
            let state = readiness(found.as_ref(), after);
            if state == Readiness::Ready {
                return Ok(());
            }
            if Instant::now() + self.poll > deadline {
                return Err(ObserveError::NotReady {
                    node: node.to_string(),
                    why: state.timed_out(node, timeout),
                });
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    async fn uncordon(&self, node: &str) -> Result<(), ObserveError> {
        change(node, "uncordoning", self.kube.uncordon(node)).await
    }

    async fn validate(&self) -> Result<(), ValidateError> {
        let r = validate::validate_cluster(&self.kube, &self.cluster, &self.expect)
            .await
            .map_err(ValidateError::Check)?;
        let api = (!r.ok).then(|| {
            r.failures
                .iter()
                .map(|f| format!("{} {}: {}", f.kind, f.name, f.message))
                .collect::<Vec<_>>()
        });
        let etcd = match &self.etcd {
            Some(etcd) => etcd.check().await.err(),
            None => None,
        };
        combine(api, etcd)
    }
}

/// A Node's Ready condition, if it has one.
fn ready_condition(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// Where a node is on its way to Ready, as [`KubeCluster::wait_ready`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Readiness {
    /// Ready, and (after a kubelet restart) posted by the new kubelet.
    Ready,
    /// No such Node.
    Missing,
    /// The Ready condition is not True (or absent): its status and heartbeat.
    NotReady {
        status: String,
        heartbeat: Option<Heartbeat>,
    },
    /// Ready, but with a heartbeat no newer than the one read before the kubelet restart:
    /// the old kubelet's status.
    Stale {
        heartbeat: Option<Heartbeat>,
        before: Heartbeat,
    },
}

/// `node`'s readiness; with `after`, a Ready only counts with a heartbeat strictly newer.
/// Both times come from the API (the kubelet's clock on either side): never this machine's.
fn readiness(node: Option<&Node>, after: Option<&Heartbeat>) -> Readiness {
    let Some(node) = node else {
        return Readiness::Missing;
    };
    let cond = ready_condition(node);
    let heartbeat = cond.and_then(|c| c.last_heartbeat_time.clone());
    match cond {
        Some(c) if c.status == "True" => match after {
            Some(before) if heartbeat.as_ref().is_none_or(|h| h <= before) => Readiness::Stale {
                heartbeat,
                before: before.clone(),
            },
            _ => Readiness::Ready,
        },
        other => Readiness::NotReady {
            status: other.map_or_else(|| "absent".to_string(), |c| c.status.clone()),
            heartbeat,
        },
    }
}

impl Readiness {
    fn timed_out(&self, node: &str, timeout: Duration) -> String {
        let at = |h: &Option<Heartbeat>| match h {
            Some(t) => format!("heartbeat {}", t.0),
            None => "no heartbeat".to_string(),
        };
        match self {
            Readiness::Ready => format!("node {node} is Ready"),
            Readiness::Missing => format!("node {node} did not register within {timeout:?}"),
            Readiness::NotReady { status, heartbeat } => format!(
                "node {node} was not Ready within {timeout:?} (its Ready condition: {status}, {})",
                at(heartbeat)
            ),
            Readiness::Stale { heartbeat, before } => format!(
                "node {node} still shows the Ready posted before its kubelet restart after {timeout:?} \
                 (before the restart: heartbeat {}; now: {}): the restarted kubelet never posted its status",
                before.0,
                at(heartbeat)
            ),
        }
    }
}

/// One validation's verdict from the API's failures and etcd's: both are reported.
fn combine(api: Option<Vec<String>>, etcd: Option<EtcdError>) -> Result<(), ValidateError> {
    match (api, etcd) {
        (None, None) => Ok(()),
        (Some(a), None) => Err(ValidateError::Failures(a)),
        (None, Some(e)) => Err(ValidateError::Etcd(e)),
        (Some(api), Some(etcd)) => Err(ValidateError::Both { api, etcd }),
    }
}

/// What a rolling-update preview found on one target.
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    pub target: Target,
    /// The record on the host (`None`: none), or why it could not be read.
    pub record: Result<Option<Provisioned>, ReadError>,
    /// What provisioning it today would record.
    pub desired: Result<Provisioned, ReadError>,
}

/// Why the preview could not tell a target's record or what it should be: the target is
/// listed as unknown or refused, never guessed at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReadError {
    /// kprov never recorded the host's key: it is not contacted.
    #[error(
        "its host key is not recorded: `kprov update cluster --yes --accept-new-host-keys` first"
    )]
    UnknownHostKey,
    /// The host did not answer, or the read failed (as the transport says).
    #[error("{0}")]
    Unreachable(String),
    /// The record is there but is not one kprov wrote.
    #[error("{0}")]
    Unparsable(String),
    /// What provisioning it today would record could not be rendered.
    #[error("{0}")]
    Render(String),
}

/// Reads every target's provisioning record, read-only: contacts only hosts whose key the
/// cluster recorded, records no key, writes nothing.
pub(crate) async fn observe(
    store: Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    targets: &[Target],
    options: &NodeOptions,
) -> anyhow::Result<Vec<Observed>> {
    let renderer = Renderer::for_run(cluster, targets, options.cloud_api.as_ref())?;
    let fleet = super::nodes::strict_fleet(&cluster.name, targets, store, options.concurrency)?;
    let reads = join_all(targets.iter().map(|t| async {
        let record = match fleet.read_file(t.name(), PROVISIONED_FILE).await {
            Ok(None) => Ok(None),
            Ok(Some(bytes)) => Provisioned::parse(&bytes)
                .map(Some)
                .map_err(ReadError::Unparsable),
            Err(ExecError::UnknownHostKey { .. }) => Err(ReadError::UnknownHostKey),
            Err(e) => Err(ReadError::Unreachable(e.to_string())),
        };
        Observed {
            target: t.clone(),
            record,
            desired: renderer
                .provisioned(t)
                .map_err(|e| ReadError::Render(e.to_string())),
        }
    }))
    .await;
    fleet.close().await;
    Ok(reads)
}

/// The roll's groups as resolve typed them (role, size with `min <= max`), each with its
/// `rollingUpdate` settings as the completed spec gives them.
pub(crate) fn group_inputs(resolved: &ResolvedCluster) -> Vec<GroupInput> {
    resolved
        .groups
        .iter()
        .map(|g| GroupInput {
            name: g.name.clone(),
            role: g.role.into(),
            min: g.size.min(),
            max: g.size.max(),
            rolling_update: resolved
                .completed_groups
                .iter()
                .find(|c| c.metadata.name == g.name)
                .and_then(|c| c.spec.rolling_update.clone()),
        })
        .collect()
}

/// The planner's inputs from the cluster's groups ([`group_inputs`]) and what was observed.
/// Metal hosts belong to the first group of their role (control planes before workers);
/// etcd-only hosts are not rolled. Targets that could not be inspected come back as problems:
/// a roll never guesses.
pub(crate) fn inputs(
    group_inputs: Vec<GroupInput>,
    observed: &[Observed],
    ready: Option<&BTreeMap<String, bool>>,
) -> (Vec<GroupInput>, Vec<NodeInput>, Vec<String>) {
    let mut nodes = Vec::new();
    let mut problems = Vec::new();
    for o in observed {
        let t = &o.target;
        let bastion = t.group.as_ref().is_some_and(|g| {
            group_inputs
                .iter()
                .any(|x| &x.name == g && x.role == GroupRole::Bastion)
        });
        let role = if t.is_control_plane() {
            GroupRole::ControlPlane
        } else if t.has_role(HostRole::Node) {
            GroupRole::Node
        } else if bastion {
            GroupRole::Bastion
        } else {
            continue;
        };
        let group = t.group.clone().or_else(|| {
            group_inputs
                .iter()
                .find(|g| g.role == role)
                .map(|g| g.name.clone())
        });
        let Some(group) = group else {
            problems.push(format!(
                "{}: no instance group with role {} to roll it in",
                t.name(),
                role.as_str()
            ));
            continue;
        };
        let mut unknown = None;
        let (record, desired) = match (&o.record, &o.desired) {
            (Ok(r), Ok(d)) => (r.clone(), d.clone()),
            // A machine that does not answer is listed as unknown, never dropped (`get
            // instances` shows it): on AWS only a replacement through its group (`--force`)
            // can fix it; a host is the user's machine, which nothing replaces, so the plan
            // refuses to roll while one is unreachable (`roll::plan`).
            (Err(e), Ok(d)) if !bastion => {
                unknown = Some(e.to_string());
                (None, d.clone())
            }
            (Err(e), _) => {
                problems.push(format!(
                    "{}: cannot read its provisioning record: {e}",
                    t.name()
                ));
                continue;
            }
            (_, Err(e)) => {
                problems.push(format!("{}: {e}", t.name()));
                continue;
            }
        };
        nodes.push(NodeInput {
            target: t.name().to_string(),
            node_name: t.node_name.clone(),
            group,
            role,
            recorded: record,
            desired,
            // A bastion is no node: Ready does not apply.
            ready: ready
                .filter(|_| !bastion)
                .map(|r| r.get(&t.node_name).copied().unwrap_or(false)),
            unknown,
        });
    }
    (group_inputs, nodes, problems)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeSet;
    use std::sync::Mutex as StdMutex;

    use super::*;
    use crate::nodes::journal::JournalFile;
    use crate::nodes::roll::{self, GroupInput, GroupRole, NodeInput, Platform, Provisioned};
    use crate::state::StateStore;
    use crate::state::file::FileStore;
    use crate::state::testing::HookedStore;

    /// An in-memory cluster and fleet: records every call, fails where told.
    #[derive(Default)]
    pub(crate) struct Fake {
        pub calls: StdMutex<Vec<String>>,
        pub drain_fails: BTreeSet<String>,
        pub validate_failures: StdMutex<u32>,
        /// Sets the cancel flag when this call is made.
        pub cancel_on: Option<(String, watch::Sender<bool>)>,
        /// Simulated durations (bench).
        pub roll_time: Duration,
        pub validate_time: Duration,
        /// How long the call that cancels takes, when it is a drain or a wait for Ready.
        pub slow: Duration,
        /// Records `before-batch N1,N2` calls (off: the other tests' sequences stay as they are).
        pub record_batches: bool,
        /// `before_batch` fails for a batch holding this node.
        pub batch_fails: Option<String>,
    }

    impl Fake {
        fn call(&self, c: String) {
            if let Some((on, tx)) = &self.cancel_on
                && *on == c
            {
                let _ = tx.send(true);
            }
            if let Ok(mut calls) = self.calls.lock() {
                calls.push(c);
            }
        }

        async fn lag(&self, call: &str) {
            if self.cancel_on.as_ref().is_some_and(|(on, _)| on == call) {
                tokio::time::sleep(self.slow).await;
            }
        }

        pub(crate) fn calls(&self) -> Vec<String> {
            self.calls.lock().map(|c| c.clone()).unwrap_or_default()
        }
    }

    #[async_trait]
    impl ClusterApi for Fake {
        async fn taint_prefer_no_schedule(&self, node: &str) -> Result<(), ObserveError> {
            self.call(format!("taint {node}"));
            Ok(())
        }
        async fn cordon(&self, node: &str) -> Result<(), ObserveError> {
            self.call(format!("cordon {node}"));
            Ok(())
        }
        async fn drain(&self, node: &str, _timeout: Duration) -> Result<(), ObserveError> {
            self.call(format!("drain {node}"));
            self.lag(&format!("drain {node}")).await;
            if self.drain_fails.contains(node) {
                return Err(ObserveError::Drain {
                    node: node.to_string(),
                    source: crate::kube::DrainError::Timeout {
                        node: node.to_string(),
                        waited: Duration::ZERO,
                        stuck: vec![crate::kube::StuckPod {
                            namespace: "default".into(),
                            pod: "db-0".into(),
                            pdb: Some("default/db".into()),
                            message: "allows 0 disruptions".into(),
                            deletion_timestamp: None,
                        }],
                    },
                });
            }
            Ok(())
        }
        async fn ready_heartbeat(&self, _node: &str) -> Result<Option<Heartbeat>, ObserveError> {
            Ok(None)
        }
        async fn wait_ready(
            &self,
            node: &str,
            _timeout: Duration,
            _after: Option<&Heartbeat>,
        ) -> Result<(), ObserveError> {
            self.call(format!("ready {node}"));
            self.lag(&format!("ready {node}")).await;
            Ok(())
        }
        async fn uncordon(&self, node: &str) -> Result<(), ObserveError> {
            self.call(format!("uncordon {node}"));
            Ok(())
        }
        async fn validate(&self) -> Result<(), ValidateError> {
            tokio::time::sleep(self.validate_time).await;
            self.call("validate".into());
            let mut f = self
                .validate_failures
                .lock()
                .map_err(|e| ValidateError::Failures(vec![e.to_string()]))?;
            if *f > 0 {
                *f -= 1;
                return Err(ValidateError::Failures(vec!["node w1 is NotReady".into()]));
            }
            Ok(())
        }
    }

    #[async_trait]
    impl NodeRoller for Fake {
        async fn roll(&self, node: &JournalNode) -> Result<Rolled, RollerError> {
            tokio::time::sleep(self.roll_time).await;
            self.call(format!("roll {}", node.node_name));
            Ok(match node.action {
                RollAction::Replace => Rolled::replaced_by(format!("{}-new", node.node_name)),
                _ => Rolled::default(),
            })
        }

        async fn before_batch(&self, nodes: &[JournalNode]) -> Result<(), RollerError> {
            let names: Vec<&str> = nodes.iter().map(|n| n.node_name.as_str()).collect();
            if self.record_batches {
                self.call(format!("before-batch {}", names.join(",")));
            }
            match &self.batch_fails {
                Some(n) if names.contains(&n.as_str()) => Err(RollerError::failed(
                    "",
                    format!("surge for {n}: the group started no instance"),
                )),
                _ => Ok(()),
            }
        }
    }

    pub(crate) fn rec(v: &str) -> Provisioned {
        Provisioned {
            kubernetes_version: v.into(),
            config_digest: "0".repeat(64),
            labels: Default::default(),
            taints: vec![],
            settings: None,
            launch_template_version: None,
        }
    }

    /// cp1, cp2 and `workers` workers behind by a minor, workers two at a time.
    pub(crate) fn plan_of(platform: Platform, workers: usize, unavailable: u32) -> roll::RollPlan {
        let groups = vec![
            GroupInput {
                name: "control-plane".into(),
                role: GroupRole::ControlPlane,
                min: 2,
                max: 2,
                rolling_update: None,
            },
            GroupInput {
                name: "nodes".into(),
                role: GroupRole::Node,
                min: 1,
                max: 100,
                rolling_update: Some(crate::spec::RollingUpdate {
                    max_surge: None,
                    max_unavailable: Some(crate::spec::IntOrPercent::Int(unavailable)),
                }),
            },
        ];
        let mut nodes = vec![
            node("cp1", "control-plane", GroupRole::ControlPlane),
            node("cp2", "control-plane", GroupRole::ControlPlane),
        ];
        for i in 1..=workers {
            nodes.push(node(&format!("w{i}"), "nodes", GroupRole::Node));
        }
        roll::plan(
            "c",
            platform,
            "1.35.1",
            &groups,
            &nodes,
            &roll::Selection::default(),
        )
    }

    fn node(name: &str, group: &str, role: GroupRole) -> NodeInput {
        NodeInput {
            target: name.into(),
            node_name: name.into(),
            group: group.into(),
            role,
            recorded: Some(rec("1.34.4")),
            desired: rec("1.35.1"),
            ready: Some(true),
            unknown: None,
        }
    }

    pub(crate) fn fast() -> RollOptions {
        RollOptions {
            validation_interval: Duration::from_millis(1),
            validation_timeout: Duration::from_secs(5),
            ..RollOptions::default()
        }
    }

    pub(crate) fn silent() -> RollEvents {
        Arc::new(|_: &RollEvent| {})
    }

    /// A roll in a test: `fake` is the cluster API and the roller, the options are [`fast`],
    /// nothing listens, nothing interrupts and the lock is held, unless the test says otherwise.
    pub(crate) struct TestRoll<'a> {
        api: &'a dyn ClusterApi,
        roller: &'a dyn NodeRoller,
        options: RollOptions,
        events: RollEvents,
        cancel: watch::Receiver<bool>,
        lock_check: Box<dyn Fn() -> Result<(), LockError> + Send + Sync + 'a>,
    }

    impl<'a> TestRoll<'a> {
        pub(crate) fn of(fake: &'a Fake) -> Self {
            TestRoll {
                api: fake,
                roller: fake,
                options: fast(),
                events: silent(),
                cancel: idle(),
                lock_check: Box::new(|| Ok(())),
            }
        }

        fn api(self, api: &'a dyn ClusterApi) -> Self {
            TestRoll { api, ..self }
        }

        fn roller(self, roller: &'a dyn NodeRoller) -> Self {
            TestRoll { roller, ..self }
        }

        fn options(self, options: RollOptions) -> Self {
            TestRoll { options, ..self }
        }

        fn events(self, events: RollEvents) -> Self {
            TestRoll { events, ..self }
        }

        fn cancel(self, cancel: watch::Receiver<bool>) -> Self {
            TestRoll { cancel, ..self }
        }

        fn lock_check(
            self,
            lock_check: impl Fn() -> Result<(), LockError> + Send + Sync + 'a,
        ) -> Self {
            TestRoll {
                lock_check: Box::new(lock_check),
                ..self
            }
        }

        /// Rolls `journal` with the journal file of cluster `c` on `store`, loaded now.
        pub(crate) async fn on(
            self,
            store: &dyn StateStore,
            journal: Journal,
        ) -> Result<Journal, RollError> {
            let (file, _) = JournalFile::load(store, "c").await?;
            self.with_file(file, journal).await
        }

        /// Rolls `journal` with `file`, loaded earlier by the test.
        async fn with_file(
            self,
            file: JournalFile<'_>,
            journal: Journal,
        ) -> Result<Journal, RollError> {
            self.timed(file, journal).await.0
        }

        /// [`run_timed`]: the roll and where its time went.
        async fn timed(
            self,
            file: JournalFile<'_>,
            journal: Journal,
        ) -> (Result<Journal, RollError>, RollTiming) {
            run_timed(
                file,
                journal,
                self.api,
                self.roller,
                &self.options,
                &self.events,
                self.cancel,
                &*self.lock_check,
            )
            .await
        }
    }

    /// The journal of cluster `c` as the store holds it now; why not, as a witness says it.
    async fn stored_journal(store: &dyn StateStore) -> Result<Journal, String> {
        let (_, journal) = JournalFile::load(store, "c")
            .await
            .map_err(|e| e.to_string())?;
        journal.ok_or_else(|| "no journal on the store".to_string())
    }

    /// Replaces nodes like `Fake`, after noting the step the store's journal gives the node.
    struct StoreWitness<'a> {
        fake: &'a Fake,
        store: &'a dyn StateStore,
        seen: StdMutex<Vec<(String, NodeStep)>>,
    }

    #[async_trait]
    impl NodeRoller for StoreWitness<'_> {
        async fn roll(&self, node: &JournalNode) -> Result<Rolled, RollerError> {
            let failed = |e: String| RollerError::failed(&node.node_name, e);
            let journal = stored_journal(self.store).await.map_err(failed)?;
            let step = journal
                .nodes
                .iter()
                .find(|n| n.node_name == node.node_name)
                .map(|n| n.step)
                .ok_or_else(|| failed("node not in the stored journal".into()))?;
            self.seen
                .lock()
                .map_err(|e| failed(e.to_string()))?
                .push((node.node_name.clone(), step));
            self.fake.roll(node).await
        }
        async fn before_batch(&self, nodes: &[JournalNode]) -> Result<(), RollerError> {
            self.fake.before_batch(nodes).await
        }
    }

    #[tokio::test]
    async fn a_batch_is_journaled_in_few_writes_and_a_node_is_drained_on_the_store_before_it_is_replaced()
     {
        let (_d, inner) = store();
        let s = HookedStore::new(inner);
        // cp1, cp2, then 20 workers in one batch.
        let plan = plan_of(Platform::Metal, 20, 20);
        let fake = Fake::default();
        let witness = StoreWitness {
            fake: &fake,
            store: &s,
            seen: StdMutex::new(Vec::new()),
        };
        let j = TestRoll::of(&fake)
            .roller(&witness)
            .on(&s, Journal::new(&plan, "me@here", false))
            .await
            .unwrap();
        assert!(j.finished && j.done() == 22);
        let seen = witness.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 22);
        assert!(
            seen.iter().all(|(_, step)| *step == NodeStep::Drained),
            "{seen:?}"
        );
        // At most the start, Cordoned, Drained and Replaced of each node, one write per batch
        // (its uncordons, beside the gate) and the end, even with no two writes grouped: one
        // write per step and node (cordon, drain, replace, uncordon, validate) was 112.
        let (writes, _) = s.writes();
        assert!(writes <= 1 + 3 * 22 + 3 + 1, "{writes} journal writes");
        let (_, stored) = JournalFile::load(&s, "c").await.unwrap();
        let stored = stored.unwrap();
        assert!(stored.finished && stored.done() == 22);
    }

    /// Notes what the store's journal says of a node when it is uncordoned and, `drain_time`
    /// into a drain, when it is drained (the fake cluster, [`Hooked`], answers the calls).
    struct ApiWitness<'a> {
        store: &'a dyn StateStore,
        drain_time: Duration,
        seen: StdMutex<Vec<Seen>>,
    }

    /// (call, node, its step on the store, its replacement on the store)
    type Seen = (String, String, NodeStep, Option<String>);

    impl ApiWitness<'_> {
        async fn note(&self, call: &str, node: &str) -> Result<(), ObserveError> {
            let failed = |message: String| ObserveError::Failed {
                node: node.to_string(),
                message,
            };
            let journal = stored_journal(self.store).await.map_err(failed)?;
            let n = journal
                .nodes
                .iter()
                .find(|n| n.node_name == node || n.replacement.as_deref() == Some(node))
                .ok_or_else(|| failed("node not in the stored journal".into()))?;
            self.seen.lock().map_err(|e| failed(e.to_string()))?.push((
                call.into(),
                n.node_name.clone(),
                n.step,
                n.replacement.clone(),
            ));
            Ok(())
        }
    }

    /// A call the engine makes of the cluster's API, as [`Hooked`] tells its hook.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Call {
        Taint,
        Cordon,
        Drain,
        ReadyHeartbeat,
        WaitReady,
        Uncordon,
    }

    /// What a test does before the fake cluster answers a call ([`Hooked`]).
    #[async_trait]
    trait BeforeCall: Send + Sync {
        /// Before `call` for `node`; an error is the call's, and the fake is not asked.
        async fn before(&self, _call: Call, _node: &str) -> Result<(), ObserveError> {
            Ok(())
        }
        /// Before a validation.
        async fn before_validate(&self) {}
    }

    /// The fake cluster, with `hook` run before each call.
    struct Hooked<'a, H> {
        fake: &'a Fake,
        hook: H,
    }

    #[async_trait]
    impl<H: BeforeCall> ClusterApi for Hooked<'_, H> {
        async fn taint_prefer_no_schedule(&self, node: &str) -> Result<(), ObserveError> {
            self.hook.before(Call::Taint, node).await?;
            self.fake.taint_prefer_no_schedule(node).await
        }
        async fn cordon(&self, node: &str) -> Result<(), ObserveError> {
            self.hook.before(Call::Cordon, node).await?;
            self.fake.cordon(node).await
        }
        async fn drain(&self, node: &str, timeout: Duration) -> Result<(), ObserveError> {
            self.hook.before(Call::Drain, node).await?;
            self.fake.drain(node, timeout).await
        }
        async fn ready_heartbeat(&self, node: &str) -> Result<Option<Heartbeat>, ObserveError> {
            self.hook.before(Call::ReadyHeartbeat, node).await?;
            self.fake.ready_heartbeat(node).await
        }
        async fn wait_ready(
            &self,
            node: &str,
            timeout: Duration,
            after: Option<&Heartbeat>,
        ) -> Result<(), ObserveError> {
            self.hook.before(Call::WaitReady, node).await?;
            self.fake.wait_ready(node, timeout, after).await
        }
        async fn uncordon(&self, node: &str) -> Result<(), ObserveError> {
            self.hook.before(Call::Uncordon, node).await?;
            self.fake.uncordon(node).await
        }
        async fn validate(&self) -> Result<(), ValidateError> {
            self.hook.before_validate().await;
            self.fake.validate().await
        }
    }

    #[async_trait]
    impl BeforeCall for ApiWitness<'_> {
        async fn before(&self, call: Call, node: &str) -> Result<(), ObserveError> {
            match call {
                Call::Drain if !self.drain_time.is_zero() => {
                    tokio::time::sleep(self.drain_time).await;
                    self.note("drain", node).await
                }
                Call::Uncordon => self.note("uncordon", node).await,
                _ => Ok(()),
            }
        }
    }

    #[tokio::test]
    async fn a_node_is_replaced_on_the_store_before_it_is_uncordoned_and_cordoned_there_during_a_long_drain()
     {
        for (platform, drain_time) in [
            (Platform::Aws, Duration::ZERO),
            (Platform::Metal, Duration::ZERO),
            (Platform::Metal, CORDONED_WRITTEN_AFTER * 2),
        ] {
            let (_d, s) = store();
            let plan = plan_of(platform, 4, 2);
            let fake = Fake::default();
            let api = Hooked {
                fake: &fake,
                hook: ApiWitness {
                    store: &s,
                    drain_time,
                    seen: StdMutex::new(Vec::new()),
                },
            };
            let j = TestRoll::of(&fake)
                .api(&api)
                .on(&s, Journal::new(&plan, "me@here", false))
                .await
                .unwrap();
            assert!(j.finished && j.done() == 6);
            let seen = api.hook.seen.lock().unwrap().clone();
            let uncordons: Vec<_> = seen.iter().filter(|s| s.0 == "uncordon").collect();
            assert_eq!(uncordons.len(), 6, "{platform:?}: {seen:?}");
            for (_, node, step, replacement) in uncordons {
                // The replacement's name too, where there is one: a resume finds it.
                let want = j.nodes.iter().find(|n| &n.node_name == node).unwrap();
                assert_eq!(
                    (*step, replacement),
                    (NodeStep::Replaced, &want.replacement),
                    "{platform:?} {node}: {seen:?}"
                );
            }
            if platform == Platform::Aws {
                assert!(j.nodes.iter().any(|n| n.replacement.is_some()), "{j:?}");
            }
            let drains: Vec<_> = seen.iter().filter(|s| s.0 == "drain").collect();
            if drain_time.is_zero() {
                assert!(drains.is_empty());
            } else {
                assert_eq!(drains.len(), 6, "{seen:?}");
                assert!(drains.iter().all(|d| d.2 == NodeStep::Cordoned), "{seen:?}");
            }
        }
    }

    fn store() -> (tempfile::TempDir, FileStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::new(dir.path()).unwrap();
        (dir, s)
    }

    fn idle() -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(false);
        std::mem::forget(tx);
        rx
    }

    /// `scripts/bench-rolling`: the wall time of a roll of N workers with simulated durations
    /// against its bound ceil(N / batch) x (replace + validate). Ignored in the normal run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "benchmark: scripts/bench-rolling"]
    async fn bench_rolling() {
        bench_rolling_table(
            Duration::from_millis(200),
            Duration::from_millis(50),
            &[(10, 1), (10, 3), (50, 5), (50, 10), (200, 20)],
        )
        .await;
    }

    /// The benchmark's smoke mode, in every `cargo test`: the smallest sizes with short
    /// durations and no timing assertion, so a broken benchmark fails CI.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bench_rolling_smoke() {
        bench_rolling_table(
            Duration::from_millis(5),
            Duration::from_millis(1),
            &[(3, 1), (6, 3)],
        )
        .await;
    }

    async fn bench_rolling_table(replace: Duration, validate: Duration, sizes: &[(usize, u32)]) {
        // Where the time goes: `*_wait_ms` is the time a node (or the roll) waited on that kind
        // of work (kinds overlap); `over_ms` the wall time above the bound.
        println!(
            "\nnodes batch wall_ms bound_ms ratio over_ms writes writes_ms journal_wait_ms validate_wait_ms observe_wait_ms roll_wait_ms validations"
        );
        for &(n, batch) in sizes {
            let groups = vec![GroupInput {
                name: "nodes".into(),
                role: GroupRole::Node,
                min: n as u32,
                max: n as u32,
                rolling_update: Some(crate::spec::RollingUpdate {
                    max_surge: None,
                    max_unavailable: Some(crate::spec::IntOrPercent::Int(batch)),
                }),
            }];
            let nodes: Vec<NodeInput> = (0..n)
                .map(|i| node(&format!("w{i}"), "nodes", GroupRole::Node))
                .collect();
            let plan = roll::plan(
                "c",
                Platform::Metal,
                "1.35.1",
                &groups,
                &nodes,
                &roll::Selection::default(),
            );
            let (_d, inner) = store();
            let s = HookedStore::new(inner);
            let fake = Fake {
                roll_time: replace,
                validate_time: validate,
                ..Fake::default()
            };
            let options = RollOptions {
                validate_count: 1,
                ..fast()
            };
            let start = Instant::now();
            let (file, _) = JournalFile::load(&s, "c").await.unwrap();
            let (j, timing) = TestRoll::of(&fake)
                .options(options)
                .timed(file, Journal::new(&plan, "bench", false))
                .await;
            let j = j.unwrap();
            let wall = start.elapsed();
            assert!(j.finished && j.done() == n);
            let bound = (replace + validate) * (n.div_ceil(batch as usize) as u32);
            let (writes, write_time) = s.writes();
            let validations = fake.calls().iter().filter(|c| *c == "validate").count();
            println!(
                "{n:5} {batch:5} {:7} {:8} {:.2} {:7} {writes:6} {:9} {:15} {:16} {:15} {:12} {validations:11}",
                wall.as_millis(),
                bound.as_millis(),
                wall.as_secs_f64() / bound.as_secs_f64(),
                wall.as_millis() as i128 - bound.as_millis() as i128,
                write_time.as_millis(),
                timing.journal.as_millis(),
                timing.validate.as_millis(),
                timing.observe.as_millis(),
                timing.roll.as_millis(),
            );
        }
    }

    #[tokio::test]
    async fn rolls_control_planes_one_by_one_then_workers_with_gates_between() {
        let (_d, s) = store();
        let plan = plan_of(Platform::Metal, 3, 2);
        let fake = Fake::default();
        let j = TestRoll::of(&fake)
            .on(&s, Journal::new(&plan, "me@here", false))
            .await
            .unwrap();
        assert!(j.finished && j.done() == 5);
        let calls = fake.calls();
        let seq: Vec<&str> = calls.iter().map(|c| c.as_str()).collect();
        let cp1: Vec<&str> = seq[..8].to_vec();
        assert_eq!(
            cp1,
            [
                "validate",
                "cordon cp1",
                "drain cp1",
                "roll cp1",
                "ready cp1",
                "uncordon cp1",
                "validate",
                "validate"
            ]
        );
        // w1 and w2 are one batch: both drained before the gate, w3 after it.
        let pos = |c: &str| seq.iter().position(|x| *x == c).unwrap();
        assert!(pos("uncordon cp2") < pos("cordon w1"));
        assert!(pos("uncordon w1") < pos("cordon w3") && pos("uncordon w2") < pos("cordon w3"));
        let gate_after_batch = seq[pos("uncordon w2").max(pos("uncordon w1"))..pos("cordon w3")]
            .iter()
            .filter(|c| **c == "validate")
            .count();
        assert_eq!(gate_after_batch, 2);
        // Metal re-provisions in place: no taint.
        assert!(!seq.iter().any(|c| c.starts_with("taint")));
        // Stored.
        let (_, stored) = JournalFile::load(&s, "c").await.unwrap();
        assert_eq!(stored.unwrap(), j);
    }

    /// The fake's machines, with some that are no Kubernetes nodes (AWS bastions).
    struct NotNodes<'f>(&'f Fake, BTreeSet<String>);

    #[async_trait]
    impl NodeRoller for NotNodes<'_> {
        async fn roll(&self, node: &JournalNode) -> Result<Rolled, RollerError> {
            self.0.roll(node).await
        }
        fn kubernetes_node(&self, node: &JournalNode) -> bool {
            !self.1.contains(&node.target)
        }
    }

    #[tokio::test]
    async fn a_machine_that_is_no_node_is_replaced_without_touching_the_api_for_it() {
        let (_d, s) = store();
        let plan = plan_of(Platform::Aws, 1, 1);
        let fake = Fake::default();
        let roller = NotNodes(&fake, ["w1".to_string()].into());
        let steps = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = steps.clone();
        let events: RollEvents = Arc::new(move |e: &RollEvent| {
            if let RollEvent::Step { node, step, .. } = e {
                seen.lock()
                    .unwrap()
                    .push(format!("{node} {}", step.as_str()));
            }
        });
        let j = TestRoll::of(&fake)
            .roller(&roller)
            .events(events)
            .on(&s, Journal::new(&plan, "me", false))
            .await
            .unwrap();
        // Reported: only the steps that happened to it (no "drained", no "uncordoned").
        let steps = steps.lock().unwrap().clone();
        let w1: Vec<&String> = steps.iter().filter(|s| s.starts_with("w1 ")).collect();
        assert_eq!(w1, ["w1 replaced", "w1 validated"], "{steps:?}");
        assert!(steps.contains(&"cp2 drained".to_string()), "{steps:?}");
        assert!(j.finished && j.done() == 3, "{j:?}");
        let calls = fake.calls();
        assert!(calls.contains(&"roll w1".to_string()), "{calls:?}");
        assert!(
            !calls
                .iter()
                .any(|c| c != "roll w1" && (c.ends_with(" w1") || c.ends_with(" w1-new"))),
            "the API was asked about a machine that is no node: {calls:?}"
        );
        // The nodes around it still go through every step, and the gate still runs after it.
        assert!(calls.contains(&"cordon cp2".to_string()), "{calls:?}");
        let at = |c: &str| calls.iter().position(|x| x == c).unwrap();
        assert!(
            calls[at("roll w1")..].iter().any(|c| c == "validate"),
            "{calls:?}"
        );
        assert_eq!(
            j.nodes
                .iter()
                .find(|n| n.target == "w1")
                .unwrap()
                .replacement,
            Some("w1-new".to_string())
        );
    }

    #[tokio::test]
    async fn before_batch_runs_before_each_batch_is_cordoned_and_its_failure_stops_the_roll() {
        let (_d, s) = store();
        let plan = plan_of(Platform::Aws, 2, 1);
        let fake = Fake {
            record_batches: true,
            ..Fake::default()
        };
        let roll = Journal::new(&plan, "me", false);
        TestRoll::of(&fake).on(&s, roll.clone()).await.unwrap();
        let calls = fake.calls();
        let at = |c: &str| calls.iter().position(|x| x == c).unwrap();
        assert!(at("before-batch w1") < at("taint w1"), "{calls:?}");
        assert!(at("uncordon w1-new") < at("before-batch w2"), "{calls:?}");
        assert!(at("before-batch w2") < at("taint w2"), "{calls:?}");

        let (_d, s) = store();
        let fake = Fake {
            batch_fails: Some("w2".into()),
            ..Fake::default()
        };
        let e = TestRoll::of(&fake).on(&s, roll).await.unwrap_err();
        assert!(
            matches!(&e, RollError::Stopped { node, reason, cause: StepError::Roller(RollerError::Failed { .. }) } if node == "w2" && reason.contains("no instance")),
            "{e}"
        );
        let calls = fake.calls();
        assert!(calls.contains(&"uncordon w1-new".to_string()), "{calls:?}");
        assert!(
            !calls.iter().any(|c| c.ends_with(" w2")),
            "w2 was touched: {calls:?}"
        );
    }

    #[tokio::test]
    async fn replaced_nodes_are_tainted_first_and_the_replacement_is_awaited() {
        let (_d, s) = store();
        let plan = plan_of(Platform::Aws, 1, 1);
        let fake = Fake::default();
        let j = TestRoll::of(&fake)
            .on(&s, Journal::new(&plan, "me", false))
            .await
            .unwrap();
        let calls = fake.calls();
        let w: Vec<&String> = calls.iter().filter(|c| c.contains("w1")).collect();
        assert_eq!(
            w,
            [
                "taint w1",
                "cordon w1",
                "drain w1",
                "roll w1",
                "ready w1-new",
                "uncordon w1-new"
            ]
        );
        assert_eq!(j.nodes[2].replacement.as_deref(), Some("w1-new"));
    }

    #[tokio::test]
    async fn a_stuck_drain_stops_the_roll_names_the_pdb_and_leaves_the_node_cordoned() {
        let (_d, s) = store();
        let plan = plan_of(Platform::Metal, 2, 1);
        let fake = Fake {
            drain_fails: ["w1".to_string()].into(),
            ..Fake::default()
        };
        let e = TestRoll::of(&fake)
            .on(&s, Journal::new(&plan, "me", false))
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("w1") && text.contains("PodDisruptionBudget default/db"),
            "{text}"
        );
        // The caller sees which step failed and why, by variant: the drain's pods, typed.
        let RollError::Stopped {
            node,
            cause:
                StepError::Observe(ObserveError::Drain {
                    node: drained,
                    source,
                }),
            ..
        } = &e
        else {
            panic!("not a stopped drain: {e:?}");
        };
        assert_eq!((node.as_str(), drained.as_str()), ("w1", "w1"));
        assert!(
            matches!(source, crate::kube::DrainError::Timeout { stuck, .. }
                if stuck[0].pdb.as_deref() == Some("default/db")),
            "{source:?}"
        );
        assert!(
            !fake
                .calls()
                .iter()
                .any(|c| c == "roll w1" || c.contains("w2"))
        );
        let (_, j) = JournalFile::load(&s, "c").await.unwrap();
        let j = j.unwrap();
        assert_eq!(j.nodes[2].step, NodeStep::Cordoned);
        assert!(
            j.nodes[2]
                .stopped
                .as_deref()
                .unwrap()
                .contains("stays cordoned")
        );
        assert!(!j.finished);
    }

    /// A roller whose cloud call AWS throttled.
    struct Throttled<'f>(&'f Fake);

    #[async_trait]
    impl NodeRoller for Throttled<'_> {
        async fn roll(&self, node: &JournalNode) -> Result<Rolled, RollerError> {
            if node.node_name == "w1" {
                return Err(RollerError::Cloud {
                    node: node.node_name.clone(),
                    what: "terminating i-w1 (w1)".into(),
                    source: crate::cloud::CloudError::Api {
                        operation: "TerminateInstanceInAutoScalingGroup".into(),
                        class: crate::cloud::ErrorClass::Throttled,
                        code: Some("Throttling".into()),
                        message: "Rate exceeded".into(),
                    },
                });
            }
            self.0.roll(node).await
        }
    }

    /// A failed replacement reaches the caller as the roller's typed error, not a sentence:
    /// the cloud's error class tells a throttled call (worth running again) from a refusal,
    /// while the journal and the user read the same text as before.
    #[tokio::test]
    async fn a_throttled_replacement_reaches_the_caller_typed_and_retryable() {
        let (_d, s) = store();
        let plan = plan_of(Platform::Aws, 1, 1);
        let fake = Fake::default();
        let e = TestRoll::of(&fake)
            .roller(&Throttled(&fake))
            .on(&s, Journal::new(&plan, "me", false))
            .await
            .unwrap_err();
        let RollError::Stopped {
            node,
            reason,
            cause: StepError::Roller(cause),
        } = &e
        else {
            panic!("not a stopped roll: {e:?}");
        };
        assert_eq!((node.as_str(), cause.node()), ("w1", "w1"));
        assert!(cause.retryable(), "{cause:?}");
        assert_eq!(
            reason,
            "replace failed: terminating i-w1 (w1): TerminateInstanceInAutoScalingGroup: Rate exceeded"
        );
        let refused = RollerError::refused("w1", "not a host of this cluster");
        assert!(!refused.retryable());
        let (_, j) = JournalFile::load(&s, "c").await.unwrap();
        assert_eq!(j.unwrap().nodes[2].step, NodeStep::Drained);
    }

    #[tokio::test]
    async fn failing_validation_stops_after_the_timeout_and_an_unhealthy_cluster_never_starts() {
        let (_d, s) = store();
        let plan = plan_of(Platform::Metal, 1, 1);
        let fake = Fake {
            validate_failures: StdMutex::new(u32::MAX),
            ..Fake::default()
        };
        let options = RollOptions {
            validation_timeout: Duration::from_millis(30),
            ..fast()
        };
        let e = TestRoll::of(&fake)
            .options(options)
            .on(&s, Journal::new(&plan, "me", false))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, RollError::Validation { cause: Some(ValidateError::Failures(f)), .. }
                if f == &["node w1 is NotReady".to_string()]),
            "{e}"
        );
        assert!(e.to_string().contains("NotReady"));
        assert!(
            fake.calls().iter().all(|c| c == "validate"),
            "{:?}",
            fake.calls()
        );
    }

    #[tokio::test]
    async fn cloudonly_skips_drain_and_validation() {
        let (_d, s) = store();
        let plan = plan_of(Platform::Aws, 1, 1);
        let fake = Fake::default();
        let options = RollOptions {
            cloud_only: true,
            ..fast()
        };
        let said = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = said.clone();
        let events: RollEvents = Arc::new(move |e: &RollEvent| {
            let line = match e {
                RollEvent::Step { node, step, .. } => format!("{node} {}", step.as_str()),
                RollEvent::Note(n) => n.clone(),
                _ => return,
            };
            seen.lock().unwrap().push(line);
        });
        let j = TestRoll::of(&fake)
            .options(options)
            .events(events)
            .on(&s, Journal::new(&plan, "me", true))
            .await
            .unwrap();
        assert_eq!(fake.calls(), ["roll cp1", "roll cp2", "roll w1"]);
        assert!(j.finished, "{j:?}");
        // Said: what happened (replaced), never a drain or a validation that did not.
        let said = said.lock().unwrap().clone();
        assert_eq!(
            said,
            [
                "cp1 replaced",
                "cp1: done, the cluster not checked (--cloudonly)",
                "cp2 replaced",
                "cp2: done, the cluster not checked (--cloudonly)",
                "w1 replaced",
                "w1: done, the cluster not checked (--cloudonly)",
            ]
        );
    }

    /// Resume from every step: node cp2 is left at `step` (cp1 validated), and a second run
    /// does exactly what remains for it, nothing for cp1, and then the rest.
    #[tokio::test]
    async fn resume_from_every_step() {
        let remaining: [(NodeStep, &[&str]); 6] = [
            (
                NodeStep::Waiting,
                &[
                    "cordon cp2",
                    "drain cp2",
                    "roll cp2",
                    "ready cp2",
                    "uncordon cp2",
                ],
            ),
            (
                NodeStep::Cordoned,
                &["drain cp2", "roll cp2", "ready cp2", "uncordon cp2"],
            ),
            (
                NodeStep::Drained,
                &["roll cp2", "ready cp2", "uncordon cp2"],
            ),
            (NodeStep::Replaced, &["ready cp2", "uncordon cp2"]),
            (NodeStep::Uncordoned, &[]),
            (NodeStep::Validated, &[]),
        ];
        for (step, expect) in remaining {
            let (_d, s) = store();
            let plan = plan_of(Platform::Metal, 1, 1);
            let mut j = Journal::new(&plan, "me", false);
            j.nodes[0].step = NodeStep::Validated;
            j.nodes[1].step = step;
            let fake = Fake::default();
            let out = TestRoll::of(&fake).on(&s, j).await.unwrap();
            assert!(out.finished && out.done() == 3);
            let calls = fake.calls();
            let cp2: Vec<&str> = calls
                .iter()
                .filter(|c| c.contains("cp2"))
                .map(|c| c.as_str())
                .collect();
            assert_eq!(cp2, expect, "from {step:?}");
            assert!(
                !calls.iter().any(|c| c.contains("cp1")),
                "cp1 re-rolled from {step:?}"
            );
            assert!(calls.contains(&"roll w1".to_string()));
            // A gate between cp2 and w1 whatever cp2's step was.
            let pos = |c: &str| calls.iter().position(|x| x == c).unwrap();
            let gates = calls[..pos("cordon w1")]
                .iter()
                .filter(|c| *c == "validate")
                .count();
            let want = if step == NodeStep::Validated { 1 } else { 3 };
            assert_eq!(gates, want, "from {step:?}: {calls:?}");
        }
    }

    /// Ctrl-C during each step: the step is finished (cordon, roll) or abandoned (drain,
    /// Ready), the journal says where, and a resume completes without repeating done work.
    #[tokio::test]
    async fn interrupted_then_resumed_without_repeating_finished_nodes() {
        for (on, left_at) in [
            ("cordon w1", NodeStep::Cordoned),
            ("drain w1", NodeStep::Cordoned),
            ("roll w1", NodeStep::Replaced),
            ("ready w1", NodeStep::Replaced),
        ] {
            let (_d, s) = store();
            let plan = plan_of(Platform::Metal, 1, 1);
            let (tx, rx) = watch::channel(false);
            let fake = Fake {
                cancel_on: Some((on.to_string(), tx)),
                // Long enough that only abandoning them ends the run quickly.
                slow: Duration::from_secs(600),
                ..Fake::default()
            };
            let e = TestRoll::of(&fake)
                .cancel(rx)
                .on(&s, Journal::new(&plan, "me", false))
                .await
                .unwrap_err();
            assert!(matches!(e, RollError::Interrupted(_)), "{on}: {e}");
            let (_, j) = JournalFile::load(&s, "c").await.unwrap();
            let j = j.unwrap();
            assert_eq!(j.nodes[2].step, left_at, "{on}");
            assert!(j.nodes[2].stopped.is_some(), "{on}");
            assert_eq!(j.done(), 2);
            let again = Fake::default();
            let out = TestRoll::of(&again).on(&s, j).await.unwrap();
            assert!(out.finished);
            let calls = again.calls();
            assert!(!calls.iter().any(|c| c.contains("cp")), "{on}: {calls:?}");
            let rolled = calls.iter().filter(|c| *c == "roll w1").count();
            assert_eq!(
                rolled,
                usize::from(left_at < NodeStep::Replaced),
                "{on}: {calls:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_journal_written_by_someone_else_meanwhile_is_not_overwritten() {
        let (_d, s) = store();
        let plan = plan_of(Platform::Metal, 1, 1);
        let (file, _) = JournalFile::load(&s, "c").await.unwrap();
        // Another writer gets there first.
        let (mut other, _) = JournalFile::load(&s, "c").await.unwrap();
        other
            .save(&mut Journal::new(&plan, "them", false))
            .await
            .unwrap();
        let fake = Fake::default();
        let e = TestRoll::of(&fake)
            .with_file(file, Journal::new(&plan, "me", false))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                RollError::Journal(JournalError::State(
                    crate::state::StateError::AlreadyExists { .. }
                        | crate::state::StateError::Conflict { .. }
                ))
            ),
            "{e}"
        );
        assert!(fake.calls().is_empty());
    }

    /// A Node as the API serves it, Ready `status` with heartbeat `at` (RFC 3339 as written).
    fn served(status: &str, at: &str) -> Node {
        serde_json::from_str(&format!(
            r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"w1"}},
                "status":{{"conditions":[
                  {{"type":"MemoryPressure","status":"False","lastHeartbeatTime":"2030-01-01T00:00:00Z"}},
                  {{"type":"Ready","status":"{status}","lastHeartbeatTime":"{at}","lastTransitionTime":"{at}"}}]}}}}"#
        ))
        .expect("a Node as the API serves it")
    }

    /// The heartbeat comparison: only the Ready condition's own time, parsed as the API
    /// serves it (Z, fractional seconds or not, an offset), strictly newer than the one read
    /// before the restart; equal is the old kubelet's status.
    #[test]
    fn after_a_restart_only_a_ready_with_a_strictly_newer_heartbeat_counts() {
        let before = ready_condition(&served("True", "2026-11-26T22:29:29Z"))
            .and_then(|c| c.last_heartbeat_time.clone())
            .unwrap();
        let stale = |at: &str| readiness(Some(&served("True", at)), Some(&before));
        assert!(matches!(
            stale("2026-11-26T22:29:29Z"),
            Readiness::Stale { .. }
        ));
        assert!(matches!(
            stale("2026-11-26T22:29:28.999999Z"),
            Readiness::Stale { .. }
        ));
        // Same instant written with an offset: still the old one.
        assert!(matches!(
            stale("2026-11-26T23:29:29+01:00"),
            Readiness::Stale { .. }
        ));
        assert_eq!(stale("2026-11-26T22:29:29.000001Z"), Readiness::Ready);
        assert_eq!(stale("2026-11-26T22:29:30Z"), Readiness::Ready);
        // Another condition's newer heartbeat (MemoryPressure, 2030) is not the Ready's.
        assert!(matches!(
            stale("2026-11-26T22:29:00Z"),
            Readiness::Stale { .. }
        ));
        // NotReady with a newer heartbeat: the new kubelet, not ready yet.
        assert!(matches!(
            readiness(
                Some(&served("False", "2026-11-26T22:29:31Z")),
                Some(&before)
            ),
            Readiness::NotReady { .. }
        ));
        // No restart: any Ready.
        assert_eq!(
            readiness(Some(&served("True", "2020-01-01T00:00:00Z")), None),
            Readiness::Ready
        );
        assert_eq!(readiness(None, Some(&before)), Readiness::Missing);
        let e = stale("2026-11-26T22:29:29Z").timed_out("w1", Duration::from_secs(60));
        assert!(
            e.contains("node w1 still shows the Ready posted before its kubelet restart")
                && e.contains("2026-11-26T22:29:29Z"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_lost_lock_stops_before_any_write() {
        let (_d, s) = store();
        let plan = plan_of(Platform::Metal, 1, 1);
        let fake = Fake::default();
        let e = TestRoll::of(&fake)
            .lock_check(|| {
                Err(LockError::Lost {
                    cluster: "c".into(),
                    reason: "broken by bob".into(),
                })
            })
            .on(&s, Journal::new(&plan, "me", false))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("broken by bob"));
        assert!(fake.calls().is_empty());
    }

    /// The wait a journal write rides beside.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Beside {
        Drain,
        Ready,
        Validation,
    }

    /// Makes the wait `stall` of the fake cluster ([`Hooked`]) never end, and breaks the store
    /// (`failing`) before the write beside it starts: only that failed write can end the roll.
    struct Stalling<'a> {
        stall: Beside,
        failing: &'a std::sync::atomic::AtomicBool,
    }

    impl Stalling<'_> {
        async fn forever(&self) {
            self.failing
                .store(true, std::sync::atomic::Ordering::SeqCst);
            std::future::pending::<()>().await
        }
    }

    #[async_trait]
    impl BeforeCall for Stalling<'_> {
        async fn before(&self, call: Call, _node: &str) -> Result<(), ObserveError> {
            match (call, self.stall) {
                (Call::Drain, Beside::Drain) | (Call::WaitReady, Beside::Ready) => {
                    self.forever().await
                }
                // Read right before the in-place roll, whose `replaced` is written beside the
                // wait for Ready: the store breaks before that write can start.
                (Call::ReadyHeartbeat, Beside::Ready)
                // The uncordon is written beside the gate that follows: the store breaks now,
                // and that gate's validation never ends.
                | (Call::Uncordon, Beside::Validation) => self
                    .failing
                    .store(true, std::sync::atomic::Ordering::SeqCst),
                _ => {}
            }
            Ok(())
        }
        async fn before_validate(&self) {
            if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
                self.forever().await;
            }
        }
    }

    #[tokio::test]
    async fn a_failed_journal_write_stops_the_roll_without_waiting_for_the_wait_beside_it() {
        for stall in [Beside::Drain, Beside::Ready, Beside::Validation] {
            let (_d, inner) = store();
            let s = HookedStore::new(inner);
            let fake = Fake::default();
            let api = Hooked {
                fake: &fake,
                hook: Stalling {
                    stall,
                    failing: s.failing(),
                },
            };
            // The stalled wait never ends: the roll ends only if the failed write ends it. The
            // bound is for a broken engine, never reached by a working one.
            let ended = tokio::time::timeout(
                Duration::from_secs(120),
                TestRoll::of(&fake).api(&api).on(
                    &s,
                    Journal::new(&plan_of(Platform::Metal, 1, 1), "me@here", false),
                ),
            )
            .await;
            let Ok(result) = ended else {
                panic!("{stall:?}: the roll still waited 120s after its journal write failed");
            };
            let e = result.unwrap_err();
            assert!(matches!(e, RollError::Journal(_)), "{stall:?}: {e}");
            assert!(e.to_string().contains("the store is unreachable"), "{e}");
            // Nothing was done after the write failed: cp1 was not uncordoned (drain, Ready) or
            // the next node not cordoned (validation).
            let calls = fake.calls();
            let after_cp1: Vec<_> = calls
                .iter()
                .skip_while(|c| *c != "roll cp1")
                .skip(1)
                .collect();
            match stall {
                Beside::Drain => assert!(!calls.contains(&"roll cp1".to_string()), "{calls:?}"),
                Beside::Ready => assert!(after_cp1.is_empty(), "{calls:?}"),
                Beside::Validation => {
                    assert_eq!(after_cp1, ["ready cp1", "uncordon cp1"], "{calls:?}")
                }
            }
        }
    }
}
