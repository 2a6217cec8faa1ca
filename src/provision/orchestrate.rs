//! Runs provisioning phases through a `HostExecutor`, in the order kubeadm needs:
//!
//! 1. preflight on every host (in parallel); facts compared across hosts;
//! 2. container runtime and kube binaries (in parallel);
//! 3. `kubeadm init --upload-certs` on the first control plane, unless it is initialised;
//! 4. a join token and the CA pin read back from it; the certificate key re-uploaded when it
//!    is older than its 2 h validity allows;
//! 5. the other control planes join one at a time (etcd grows one member at a time);
//! 6. workers join in parallel; a failing worker does not stop the others.
//!
//! Hosts already in the cluster (kubelet.conf present) are not joined again, so a re-run on a
//! converged cluster only re-checks; new hosts in the inventory join.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use rand::RngCore;

use super::pki;
use super::render::{self, CloudApi, Endpoint, JoinSecrets, RenderError, Renderer};
use crate::nodes::Target;
use crate::nodes::model::Facts;
use crate::nodes::owner::{OWNER_FILE, Owner};
use crate::provision::plan::{self, Action, NodePlan, Observation};
use crate::spec::{EtcdType, HostRole, ResolvedCluster};
use crate::ssh::task::{ExecError, HostExecutor, Step, StepOutcome};

/// kubeadm deletes uploaded certificates after 2 h; keep a margin for slow joins.
pub(crate) const CERTIFICATE_KEY_LIFETIME: i64 = 2 * 3600 - 15 * 60;

/// Why provisioning stopped before every host had a result (a host's own failure is in its
/// `HostReport`).
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// The spec or the targets could not be rendered into steps.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// A file read from a host is not what provisioning expects (e.g. not UTF-8).
    #[error("{host}: {path}: {message}")]
    Remote {
        /// The host the file was read from.
        host: String,
        /// The file's path on the host.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// A host could not be reached or a step on it failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error(
        "no control plane has been initialised (no {} on any control-plane host)",
        render::ADMIN_CONF
    )]
    /// No control plane holds the admin kubeconfig: the cluster was never initialised.
    NotInitialised,
    /// The plan was made for a preview (no owner): it cannot be executed.
    #[error("the node plan names no owner (a preview's plan cannot be executed)")]
    NoOwner,
}

/// Why a host's phase failed, as the tracker keeps it.
#[derive(Debug, Clone)]
struct Failure {
    message: String,
    unknown_host_key: bool,
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure {
            message,
            unknown_host_key: false,
        }
    }
}

/// How one host fared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostResult {
    /// Every phase succeeded.
    Ok,
    /// A phase failed; the host's later phases did not run.
    Failed {
        /// The phase that failed.
        phase: Phase,
        /// The failure, as the host or the renderer reported it.
        error: String,
        /// The host was never contacted: its key is not recorded (a delete may skip it).
        unknown_host_key: bool,
    },
    /// Not attempted because something it depends on failed.
    Skipped {
        /// What it depended on that failed.
        reason: String,
    },
    /// A member left alone: it runs an older configuration that `rolling-update cluster`
    /// applies (`update cluster` never upgrades running members).
    PendingRoll {
        /// What differs from the spec (the version or configuration it runs).
        reason: String,
    },
}

/// A stage of provisioning, in the order they run; a host's failure names the phase it failed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Ownership: the host's marker names this cluster (written before anything else).
    Claim,
    /// Host settings (modules, sysctls, swap) and the preflight checks.
    Preflight,
    /// The pinned binaries, images and runtime configuration.
    Install,
    /// External etcd members, when the spec runs etcd apart.
    Etcd,
    /// `kubeadm init` on the first control plane.
    Init,
    /// `kubeadm join --control-plane` on the other control planes.
    JoinControlPlane,
    /// `kubeadm join` on the workers.
    JoinWorker,
    /// What a member runs once it is in the cluster (its API endpoint: its own API server, or
    /// the workers' local proxy) and the provisioning record.
    Settle,
    /// `delete cluster`: the host reset to before kprov.
    Reset,
}

impl Phase {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Claim => "ownership",
            Phase::Preflight => "preflight",
            Phase::Install => "install",
            Phase::Etcd => "etcd",
            Phase::Init => "init",
            Phase::JoinControlPlane => "join control plane",
            Phase::JoinWorker => "join worker",
            Phase::Settle => "settle",
            Phase::Reset => "reset",
        }
    }
}

/// How provisioning ended on one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostReport {
    /// The host's inventory name.
    pub host: String,
    /// Its roles in the spec.
    pub roles: Vec<HostRole>,
    /// How its run ended.
    pub result: HostResult,
    pub(crate) changed: usize,
    pub(crate) unchanged: usize,
    pub(crate) duration: Duration,
}

/// The final table: host, roles, result, duration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// One report per target, in the order the targets were given.
    pub hosts: Vec<HostReport>,
}

impl Report {
    /// True when every host succeeded (a host left to `rolling-update` counts as success).
    pub fn success(&self) -> bool {
        self.hosts
            .iter()
            .all(|h| matches!(h.result, HostResult::Ok | HostResult::PendingRoll { .. }))
    }

    /// Members left for `rolling-update cluster`.
    pub(crate) fn pending_roll(&self) -> Vec<&HostReport> {
        self.hosts
            .iter()
            .filter(|h| matches!(h.result, HostResult::PendingRoll { .. }))
            .collect()
    }

    /// Steps that changed something; 0 on a converged cluster.
    pub fn changed(&self) -> usize {
        self.hosts.iter().map(|h| h.changed).sum()
    }
}

/// What the orchestrator reports while it runs (for per-host progress bars or plain lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProgressEvent {
    /// A host began a phase.
    Started {
        /// The host's inventory name.
        host: String,
        /// The phase begun.
        phase: Phase,
        /// How many steps the phase runs on the host.
        steps: usize,
    },
    /// A host finished a phase.
    Finished {
        /// The host's inventory name.
        host: String,
        /// The phase finished.
        phase: Phase,
        /// Steps that changed the host.
        changed: usize,
        /// Steps that found the host already done.
        unchanged: usize,
    },
    /// A host's phase failed.
    Failed {
        /// The host's inventory name.
        host: String,
        /// The phase that failed.
        phase: Phase,
        /// Quotes what the host said: shown only escaped, on one line.
        error: crate::output::UntrustedText,
    },
}

pub(crate) type Progress = Arc<dyn Fn(&ProgressEvent) + Send + Sync>;

/// Inputs that vary between runs, injectable for tests.
#[derive(Clone)]
pub struct Options {
    /// Unix time, to date certificate keys.
    pub(crate) now: i64,
    pub(crate) progress: Option<Progress>,
    /// The cloud's API endpoint and certificate names (AWS: the load balancer).
    pub(crate) cloud_api: Option<CloudApi>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("now", &self.now)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

impl Options {
    /// The options of a real run: the time now, no progress callback, no cloud API.
    pub fn current() -> Self {
        Options {
            now: chrono::Utc::now().timestamp(),
            progress: None,
            cloud_api: None,
        }
    }

    fn emit(&self, event: ProgressEvent) {
        if let Some(p) = &self.progress {
            p(&event);
        }
    }
}

/// Finds values that more than one host reports; returns a message per offending host.
pub(crate) fn duplicate_facts(facts: &[(String, Facts)]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut check = |what: &str, why: &str, value_of: &dyn Fn(&Facts) -> Vec<String>| {
        let mut seen: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for (host, f) in facts {
            for v in value_of(f) {
                if !v.is_empty() && v != "unknown" {
                    seen.entry(v).or_default().push(host);
                }
            }
        }
        for (value, hosts) in seen {
            if hosts.len() > 1 {
                for h in &hosts {
                    let others: Vec<&str> = hosts.iter().copied().filter(|o| o != h).collect();
                    out.entry(h.to_string()).or_default().push(format!(
                        "{what} {value} is also used by {}; {why}",
                        others.join(", ")
                    ));
                }
            }
        }
    };
    check("hostname", "each node must have a unique hostname", &|f| {
        vec![f.hostname.clone()]
    });
    check(
        "product_uuid",
        "cloned machines confuse the kubelet and CNI plugins (regenerate the machine's UUID)",
        &|f| vec![f.product_uuid.clone()],
    );
    check(
        "MAC address",
        "cloned network interfaces break pod networking",
        &|f| f.macs.clone(),
    );
    out
}

struct Tracker {
    reports: BTreeMap<String, HostReport>,
    order: Vec<String>,
}

impl Tracker {
    fn new(targets: &[Target]) -> Self {
        Tracker {
            reports: targets
                .iter()
                .map(|t| {
                    (
                        t.name().to_string(),
                        HostReport {
                            host: t.name().to_string(),
                            roles: t.host.roles.clone(),
                            result: HostResult::Ok,
                            changed: 0,
                            unchanged: 0,
                            duration: Duration::ZERO,
                        },
                    )
                })
                .collect(),
            order: targets.iter().map(|t| t.name().to_string()).collect(),
        }
    }

    fn healthy(&self, host: &str) -> bool {
        self.reports
            .get(host)
            .is_some_and(|r| r.result == HostResult::Ok)
    }

    fn record(
        &mut self,
        host: &str,
        phase: Phase,
        took: Duration,
        result: Result<Vec<StepOutcome>, Failure>,
    ) -> bool {
        let Some(r) = self.reports.get_mut(host) else {
            return false;
        };
        r.duration += took;
        match result {
            Ok(outcomes) => {
                for o in outcomes {
                    match o {
                        StepOutcome::Changed => r.changed += 1,
                        StepOutcome::Unchanged => r.unchanged += 1,
                    }
                }
                true
            }
            Err(failure) => {
                r.result = HostResult::Failed {
                    phase,
                    error: failure.message,
                    unknown_host_key: failure.unknown_host_key,
                };
                false
            }
        }
    }

    fn fail(&mut self, host: &str, phase: Phase, error: String) {
        if let Some(r) = self.reports.get_mut(host) {
            r.result = HostResult::Failed {
                phase,
                error,
                unknown_host_key: false,
            };
        }
    }

    /// Never contacted: its key is not recorded.
    fn fail_unknown_key(&mut self, host: &str, error: String) {
        if let Some(r) = self.reports.get_mut(host) {
            r.result = HostResult::Failed {
                phase: Phase::Preflight,
                error,
                unknown_host_key: true,
            };
        }
    }

    fn pending_roll(&mut self, host: &str, reason: String) {
        if let Some(r) = self.reports.get_mut(host) {
            r.result = HostResult::PendingRoll { reason };
        }
    }

    fn is_pending_roll(&self, host: &str) -> bool {
        self.reports
            .get(host)
            .is_some_and(|r| matches!(r.result, HostResult::PendingRoll { .. }))
    }

    fn skip(&mut self, host: &str, reason: &str) {
        if let Some(r) = self.reports.get_mut(host)
            && r.result == HostResult::Ok
        {
            r.result = HostResult::Skipped {
                reason: reason.to_string(),
            };
        }
    }

    fn finish(mut self) -> Report {
        Report {
            hosts: self
                .order
                .iter()
                .filter_map(|h| self.reports.remove(h))
                .collect(),
        }
    }
}

async fn timed(
    exec: &dyn HostExecutor,
    options: &Options,
    phase: Phase,
    host: &str,
    steps: &[Step],
) -> (Duration, Result<Vec<StepOutcome>, Failure>) {
    options.emit(ProgressEvent::Started {
        host: host.into(),
        phase,
        steps: steps.len(),
    });
    let start = Instant::now();
    let r = exec.run_steps(host, steps).await.map_err(|e| Failure {
        unknown_host_key: matches!(e, ExecError::UnknownHostKey { .. }),
        message: e.to_string(),
    });
    options.emit(match &r {
        Ok(outcomes) => ProgressEvent::Finished {
            host: host.into(),
            phase,
            changed: outcomes
                .iter()
                .filter(|o| **o == StepOutcome::Changed)
                .count(),
            unchanged: outcomes
                .iter()
                .filter(|o| **o == StepOutcome::Unchanged)
                .count(),
        },
        Err(error) => ProgressEvent::Failed {
            host: host.into(),
            phase,
            error: error.message.as_str().into(),
        },
    });
    (start.elapsed(), r)
}

/// Runs one step list per host, all hosts concurrently (the executor bounds concurrency).
async fn parallel(
    exec: &dyn HostExecutor,
    options: &Options,
    tracker: &mut Tracker,
    phase: Phase,
    work: Vec<(String, Vec<Step>)>,
) {
    let runs = work
        .iter()
        .map(|(host, steps)| timed(exec, options, phase, host, steps));
    let results = join_all(runs).await;
    for ((host, _), (took, r)) in work.iter().zip(results) {
        tracker.record(host, phase, took, r);
    }
}

async fn read_text(
    exec: &dyn HostExecutor,
    host: &str,
    path: &str,
) -> Result<Option<String>, ProvisionError> {
    let Some(bytes) = exec.read_file(host, path).await? else {
        return Ok(None);
    };
    String::from_utf8(bytes.to_vec())
        .map(Some)
        .map_err(|_| ProvisionError::Remote {
            host: host.into(),
            path: path.into(),
            message: "not UTF-8 text".into(),
        })
}

fn new_certificate_key() -> String {
    let mut key = [0u8; 32];
    rand::rng().fill_bytes(&mut key);
    hex::encode(key)
}

/// Parses `kubeadm token create --print-join-command` output: the token and the CA pin.
pub(crate) fn parse_join_command(text: &str) -> Option<(String, Option<String>)> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let after = |flag: &str| {
        words
            .iter()
            .position(|w| *w == flag)
            .and_then(|i| words.get(i + 1))
            .map(|s| s.to_string())
    };
    let token = after("--token")?;
    let hash = after("--discovery-token-ca-cert-hash")
        .map(|h| h.strip_prefix("sha256:").unwrap_or(&h).to_string());
    Some((token, hash))
}

/// Observes the targets, plans and executes the plan: `update --yes` in one call (see
/// `provision::plan` for the steps taken apart, as the CLI does).
pub async fn provision(
    exec: &dyn HostExecutor,
    cluster: &ResolvedCluster,
    targets: &[Target],
    owner: &Owner,
    options: &Options,
) -> Result<Report, ProvisionError> {
    let plan = plan::plan_with(
        exec,
        None,
        cluster,
        targets,
        Some(owner.clone()),
        options.cloud_api.as_ref(),
    )
    .await?;
    execute(exec, cluster, targets, &plan, options).await
}

/// Provisions (or converges) the targets as `plan` says: it decides nothing about who
/// initialises or joins. Targets the plan refuses, or could not inspect, are reported failed
/// and never contacted again; every other target is claimed (ownership marker) before anything
/// else changes it.
pub(crate) async fn execute(
    exec: &dyn HostExecutor,
    cluster: &ResolvedCluster,
    targets: &[Target],
    plan: &NodePlan,
    options: &Options,
) -> Result<Report, ProvisionError> {
    let renderer = Renderer::for_run(cluster, targets, options.cloud_api.as_ref())?;
    execute_rendered(exec, &renderer, targets, plan, options).await
}

/// [`execute`] with the run's renderer (the one the plan was observed with: `file://`
/// archives and binaries read and hashed once per run).
pub(crate) async fn execute_rendered(
    exec: &dyn HostExecutor,
    renderer: &Renderer,
    targets: &[Target],
    plan: &NodePlan,
    options: &Options,
) -> Result<Report, ProvisionError> {
    let owner = plan.owner.as_ref().ok_or(ProvisionError::NoOwner)?;
    // `file://` image archives are read and verified here, before any host is changed.
    renderer.load_images().map_err(RenderError::from)?;
    let mut t = Tracker::new(targets);
    let action = |target: &Target| plan.action(target.name());

    // 0. What observation already ruled out.
    for target in targets {
        let name = target.name();
        match plan.node(name).map(|n| &n.observed) {
            None => t.fail(name, Phase::Preflight, format!("{name}: not in the node plan")),
            Some(Observation::OwnedByOther { owner }) => t.fail(
                name,
                Phase::Claim,
                format!(
                    "{name}: refused: the host belongs to {} (marker {OWNER_FILE}); kprov never changes a host of another cluster",
                    owner.describe()
                ),
            ),
            Some(Observation::HostKeyNotRecorded) => t.fail_unknown_key(
                name,
                ExecError::UnknownHostKey {
                    host: name.to_string(),
                    fingerprints: crate::ssh::NOT_SCANNED.into(),
                }
                .to_string(),
            ),
            Some(Observation::Unreachable { reason }) => {
                t.fail(name, Phase::Preflight, reason.clone())
            }
            // Not contacted again: no preflight, no install, no settle.
            Some(Observation::Outdated { .. }) => t.pending_roll(
                name,
                plan.node(name)
                    .map(|n| n.reasons.join("; "))
                    .unwrap_or_default(), // a node the plan does not list: no reasons to give
            ),
            Some(_) => {}
        }
    }

    // 1. Ownership, then preflight.
    let work = targets
        .iter()
        .filter(|h| t.healthy(h.name()))
        .map(|h| {
            let mut steps = vec![renderer.claim(owner)];
            steps.extend(renderer.preflight(h)?);
            Ok((h.name().to_string(), steps))
        })
        .collect::<Result<Vec<_>, RenderError>>()?;
    parallel(exec, options, &mut t, Phase::Preflight, work).await;
    let mut facts = Vec::new();
    for h in targets {
        if !t.healthy(h.name()) {
            continue;
        }
        match read_text(exec, h.name(), render::FACTS_FILE).await {
            Ok(Some(text)) => facts.push((h.name().to_string(), Facts::parse(&text))),
            Ok(None) => t.fail(
                h.name(),
                Phase::Preflight,
                format!("preflight wrote no {}", render::FACTS_FILE),
            ),
            Err(e) => t.fail(h.name(), Phase::Preflight, e.to_string()),
        }
    }
    for (host, problems) in duplicate_facts(&facts) {
        t.fail(&host, Phase::Preflight, problems.join("; "));
    }

    // 2. Runtime and binaries.
    let mut work = Vec::new();
    for (host, f) in &facts {
        if !t.healthy(host) {
            continue;
        }
        match f.arch() {
            Some(arch) => {
                // Facts come from the targets, so the host is among them; were it not, it
                // gets every image archive, as a control plane does.
                let roles = targets
                    .iter()
                    .find(|t| t.name() == host)
                    .map_or(&[crate::spec::HostRole::ControlPlane][..], |t| {
                        t.host.roles.as_slice()
                    });
                work.push((host.clone(), renderer.install(arch, roles)?))
            }
            None => t.fail(
                host,
                Phase::Preflight,
                format!("unsupported architecture {:?}", f.machine),
            ),
        }
    }
    // 3. The first control plane, as planned.
    let first = plan
        .first_control_plane
        .as_deref()
        .and_then(|name| targets.iter().find(|h| h.name() == name));
    // A new cluster on stacked etcd: `kubeadm init` needs only the first control plane's own
    // install, so it starts as soon as that is done while the other hosts still install (their
    // uploads and image imports hidden behind init; they join after both). External etcd
    // keeps the order: its members are set up between the installs and init.
    let mut early_init = None;
    match first {
        Some(f)
            if action(f) == Some(Action::Init)
                && renderer.etcd_type() != EtcdType::External
                && work.iter().any(|(h, _)| h == f.name()) =>
        {
            let key = new_certificate_key();
            let mut init_steps = vec![renderer.certificate_key(&key, options.now)];
            init_steps.extend(renderer.init(f, &key)?);
            init_steps.extend(renderer.settle(f)?);
            init_steps.push(renderer.record(f)?);
            let (mine, others): (Vec<_>, Vec<_>) =
                work.into_iter().partition(|(h, _)| h == f.name());
            let first_run = async {
                let (_, steps) = &mine[0];
                let install = timed(exec, options, Phase::Install, f.name(), steps).await;
                let init = if install.1.is_ok() {
                    Some(timed(exec, options, Phase::Init, f.name(), &init_steps).await)
                } else {
                    None
                };
                (install, init)
            };
            let others_run = join_all(
                others
                    .iter()
                    .map(|(h, steps)| timed(exec, options, Phase::Install, h, steps)),
            );
            let (((took, r), init), results) = futures::join!(first_run, others_run);
            t.record(f.name(), Phase::Install, took, r);
            for ((host, _), (took, r)) in others.iter().zip(results) {
                t.record(host, Phase::Install, took, r);
            }
            early_init = init.map(|i| (key, i));
        }
        _ => parallel(exec, options, &mut t, Phase::Install, work).await,
    }
    let Some(first) = first.cloned() else {
        for h in targets {
            t.skip(
                h.name(),
                "no control plane is available to initialise or join",
            );
        }
        return Ok(t.finish());
    };
    let initialise = action(&first) == Some(Action::Init);
    // An outdated control plane still serves: others join through it, it is not settled.
    let first_pending = t.is_pending_roll(first.name());
    if !t.healthy(first.name()) && !first_pending {
        let why = format!(
            "the control plane planned to {} ({}) failed; re-run to plan again",
            if initialise {
                "initialise the cluster"
            } else {
                "join through"
            },
            first.name()
        );
        for h in targets {
            t.skip(h.name(), &why);
        }
        return Ok(t.finish());
    }
    // External etcd is converged on every run; a cluster that still needs `kubeadm init`
    // cannot start without it.
    let mut etcd_client = None;
    if renderer.etcd_type() == EtcdType::External {
        match external_etcd(exec, renderer, &facts, &mut t, options).await {
            Ok(step) => etcd_client = Some(step),
            Err(why) if initialise => {
                for h in targets {
                    t.skip(h.name(), &why);
                }
                return Ok(t.finish());
            }
            Err(_) => {}
        }
    }
    let mut certificate_key = None;
    if initialise {
        let (key, (took, r)) = match early_init {
            Some(done) => done,
            None => {
                let key = new_certificate_key();
                let mut steps: Vec<Step> = etcd_client.into_iter().collect();
                steps.push(renderer.certificate_key(&key, options.now));
                steps.extend(renderer.init(&first, &key)?);
                steps.extend(renderer.settle(&first)?);
                steps.push(renderer.record(&first)?);
                let run = timed(exec, options, Phase::Init, first.name(), &steps).await;
                (key, run)
            }
        };
        if !t.record(first.name(), Phase::Init, took, r) {
            for h in targets {
                t.skip(
                    h.name(),
                    &format!("kubeadm init failed on {}", first.name()),
                );
            }
            return Ok(t.finish());
        }
        certificate_key = Some((options.now, key));
    } else if !first_pending {
        let mut steps = renderer.settle(&first)?;
        steps.push(renderer.record(&first)?);
        let (took, r) = timed(exec, options, Phase::Settle, first.name(), &steps).await;
        t.record(first.name(), Phase::Settle, took, r);
    }

    // 4. Members only re-check their settled state; the others join.
    let mut to_join = Vec::new();
    let mut settle = Vec::new();
    for h in targets {
        if h.name() == first.name() || !t.healthy(h.name()) {
            continue;
        }
        match action(h) {
            Some(Action::Settle) => {
                let mut steps = renderer.settle(h)?;
                steps.push(renderer.record(h)?);
                settle.push((h.name().to_string(), steps));
            }
            Some(Action::JoinControlPlane | Action::JoinWorker) => to_join.push(h.clone()),
            // `Init` only ever names `first`; etcd hosts were handled above.
            _ => {}
        }
    }
    parallel(exec, options, &mut t, Phase::Settle, settle).await;
    if to_join.is_empty() {
        return Ok(t.finish());
    }
    let secrets = match join_secrets(
        exec,
        renderer,
        &first,
        certificate_key,
        to_join.iter().any(is_control_plane),
        options,
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            let why = format!("cannot prepare joins on {}: {e}", first.name());
            for h in &to_join {
                t.fail(h.name(), Phase::JoinWorker, why.clone());
            }
            return Ok(t.finish());
        }
    };

    // 5. Control planes, one at a time.
    let mut cp_failed: Option<String> = None;
    for h in to_join.iter().filter(|h| is_control_plane(h)) {
        if let Some(failed) = &cp_failed {
            t.skip(
                h.name(),
                &format!("control plane {failed} failed to join before it"),
            );
            continue;
        }
        let mut steps = renderer.join(h, &first, &secrets)?;
        steps.extend(renderer.settle(h)?);
        steps.push(renderer.record(h)?);
        let (took, r) = timed(exec, options, Phase::JoinControlPlane, h.name(), &steps).await;
        if !t.record(h.name(), Phase::JoinControlPlane, took, r) {
            cp_failed = Some(h.name().to_string());
        }
    }

    // 6. Workers, all at once.
    let work = to_join
        .iter()
        .filter(|h| !is_control_plane(h))
        .map(|h| {
            let mut steps = renderer.join(h, &first, &secrets)?;
            steps.extend(renderer.settle(h)?);
            steps.push(renderer.record(h)?);
            Ok((h.name().to_string(), steps))
        })
        .collect::<Result<Vec<_>, RenderError>>()?;
    parallel(exec, options, &mut t, Phase::JoinWorker, work).await;
    Ok(t.finish())
}

/// Sets up external etcd on its hosts (a systemd service per member, whatever other roles the
/// host has; certificates from kubeadm's phases under one etcd CA) and returns the
/// step that gives the first control plane its etcd client certificates. Runs before
/// `kubeadm init`; every member is needed, since the cluster bootstraps with all of them.
async fn external_etcd(
    exec: &dyn HostExecutor,
    renderer: &Renderer,
    facts: &[(String, Facts)],
    t: &mut Tracker,
    options: &Options,
) -> Result<Step, String> {
    let members: Vec<Target> = renderer.etcd_hosts().cloned().collect();
    if let Some(down) = members.iter().find(|h| !t.healthy(h.name())) {
        return Err(format!("etcd host {} is not available", down.name()));
    }
    let arch = |h: &Target| {
        facts
            .iter()
            .find(|(n, _)| n == h.name())
            .and_then(|(_, f)| f.arch())
            .ok_or_else(|| format!("etcd host {}: architecture unknown", h.name()))
    };
    let first = members.first().ok_or("no etcd host")?;
    let (took, r) = timed(
        exec,
        options,
        Phase::Etcd,
        first.name(),
        &[renderer.etcd_ca()],
    )
    .await;
    if !t.record(first.name(), Phase::Etcd, took, r) {
        return Err(format!("the etcd CA could not be made on {}", first.name()));
    }
    let read = |path: &'static str| async move {
        match exec.read_file(first.name(), path).await {
            Ok(Some(b)) => Ok(b),
            Ok(None) => Err(format!("{}: {path} is missing", first.name())),
            Err(e) => Err(e.to_string()),
        }
    };
    let (ca_cert, ca_key) = (
        read(render::ETCD_CA_CERT).await?,
        read(render::ETCD_CA_KEY).await?,
    );
    let work = members
        .iter()
        .map(|h| {
            Ok((
                h.name().to_string(),
                renderer
                    .etcd_member(h, arch(h)?, &ca_cert, &ca_key)
                    .map_err(|e| e.to_string())?,
            ))
        })
        .collect::<Result<Vec<_>, String>>()?;
    parallel(exec, options, t, Phase::Etcd, work).await;
    if let Some(down) = members.iter().find(|h| !t.healthy(h.name())) {
        return Err(format!("etcd member {} failed", down.name()));
    }
    let cert = read(render::ETCD_CLIENT_CERT).await?;
    let key = read(render::ETCD_CLIENT_KEY).await?;
    Ok(renderer.etcd_client(&ca_cert, &cert, &key))
}

fn is_control_plane(t: &Target) -> bool {
    t.is_control_plane()
}

async fn join_secrets(
    exec: &dyn HostExecutor,
    renderer: &Renderer,
    first: &Target,
    fresh_key: Option<(i64, String)>,
    control_planes_join: bool,
    options: &Options,
) -> Result<JoinSecrets, ProvisionError> {
    let remote = |path: &str, message: String| ProvisionError::Remote {
        host: first.name().to_string(),
        path: path.to_string(),
        message,
    };
    let ca = read_text(exec, first.name(), render::CA_CERT)
        .await?
        .ok_or_else(|| remote(render::CA_CERT, "missing".into()))?;
    let ca_cert_hash =
        pki::ca_cert_hash(&ca).map_err(|e| remote(render::CA_CERT, e.to_string()))?;

    let mut steps = vec![renderer.join_token()];
    let mut key = fresh_key.map(|(_, k)| k);
    if key.is_none() && control_planes_join {
        let existing = read_text(exec, first.name(), render::CERTIFICATE_KEY_FILE).await?;
        key = existing.as_deref().and_then(|text| {
            let (issued, k) = text.trim().split_once(' ')?;
            let issued: i64 = issued.parse().ok()?;
            (options.now - issued < CERTIFICATE_KEY_LIFETIME && k.len() == 64)
                .then(|| k.to_string())
        });
        if key.is_none() {
            // Expired (or never recorded): upload the certificates again under a new key.
            let k = new_certificate_key();
            steps.push(renderer.certificate_key(&k, options.now));
            key = Some(k);
        }
    }
    exec.run_steps(first.name(), &steps).await?;
    let command = read_text(exec, first.name(), render::JOIN_COMMAND_FILE)
        .await?
        .ok_or_else(|| remote(render::JOIN_COMMAND_FILE, "missing".into()))?;
    let (token, printed_hash) = parse_join_command(&command).ok_or_else(|| {
        remote(
            render::JOIN_COMMAND_FILE,
            "no --token in kubeadm's join command".into(),
        )
    })?;
    if let Some(printed) = printed_hash
        && printed != ca_cert_hash
    {
        return Err(remote(
            render::CA_CERT,
            format!(
                "kubeadm pins the CA as sha256:{printed} but {} hashes to sha256:{ca_cert_hash}",
                render::CA_CERT
            ),
        ));
    }
    Ok(JoinSecrets {
        token,
        ca_cert_hash,
        certificate_key: key.unwrap_or_default(), // None only when no control plane joins: no key needed
    })
}

/// Whose marker a target carries, read without changing anything.
pub(crate) async fn marker(
    exec: &dyn HostExecutor,
    target: &str,
) -> Result<Option<Owner>, ExecError> {
    Ok(exec.read_file(target, OWNER_FILE).await?.map(|b| {
        Owner::parse(&b).unwrap_or(Owner {
            uid: String::new(),
            cluster: "(unreadable marker)".into(),
            store: "(unknown store)".into(),
        })
    }))
}

/// Resets the targets that carry `owner`'s marker (`delete cluster`), in parallel. The others
/// are skipped, naming their owner; the reset script checks the marker again on the host, so
/// a host claimed in between is not reset either.
pub async fn reset(
    exec: &dyn HostExecutor,
    cluster: &ResolvedCluster,
    targets: &[Target],
    owner: &Owner,
    options: &Options,
) -> Result<Report, ProvisionError> {
    let all: Vec<&str> = targets.iter().map(Target::name).collect();
    reset_only(exec, cluster, targets, &all, owner, options).await
}

/// [`reset`] of the targets named in `only` (`delete instance`); `targets` are all of the
/// cluster's, which the scripts are rendered against.
pub(crate) async fn reset_only(
    exec: &dyn HostExecutor,
    cluster: &ResolvedCluster,
    targets: &[Target],
    only: &[&str],
    owner: &Owner,
    options: &Options,
) -> Result<Report, ProvisionError> {
    let renderer = Renderer::for_run(cluster, targets, options.cloud_api.as_ref())?;
    let chosen: Vec<Target> = targets
        .iter()
        .filter(|t| only.contains(&t.name()))
        .cloned()
        .collect();
    let mut t = Tracker::new(&chosen);
    let mut work = Vec::new();
    for h in &chosen {
        match marker(exec, h.name()).await {
            Ok(Some(m)) if m.uid == owner.uid => {
                work.push((h.name().to_string(), renderer.reset(h, owner)?))
            }
            Ok(Some(m)) => t.skip(
                h.name(),
                &format!("not reset: the host belongs to {}", m.describe()),
            ),
            Ok(None) => t.skip(
                h.name(),
                &format!(
                    "not reset: it carries no ownership marker ({OWNER_FILE}) of this cluster"
                ),
            ),
            Err(e @ ExecError::UnknownHostKey { .. }) => {
                t.fail_unknown_key(h.name(), e.to_string())
            }
            Err(e) => t.fail(h.name(), Phase::Reset, e.to_string()),
        }
    }
    parallel(exec, options, &mut t, Phase::Reset, work).await;
    Ok(t.finish())
}

/// The cluster's admin kubeconfig, from the first control plane that has one and carries this
/// cluster's ownership marker (a host of another cluster never hands over its credentials).
/// With the local-proxy endpoint (a name only the nodes resolve) the server is rewritten to
/// that control plane's reachable address, which the API server certificate also covers.
pub async fn admin_kubeconfig(
    exec: &dyn HostExecutor,
    cluster: &ResolvedCluster,
    targets: &[Target],
    owner: &Owner,
) -> Result<String, ProvisionError> {
    admin_kubeconfig_with(exec, cluster, targets, owner, None).await
}

/// [`admin_kubeconfig`] of a cloud cluster (its API behind the cloud's load balancer).
pub(crate) async fn admin_kubeconfig_with(
    exec: &dyn HostExecutor,
    cluster: &ResolvedCluster,
    targets: &[Target],
    owner: &Owner,
    cloud_api: Option<&CloudApi>,
) -> Result<String, ProvisionError> {
    let renderer = Renderer::for_run(cluster, targets, cloud_api)?;
    for cp in renderer.control_planes() {
        if !matches!(marker(exec, cp.name()).await, Ok(Some(m)) if m.uid == owner.uid) {
            continue;
        }
        let Some(text) = read_text(exec, cp.name(), render::ADMIN_CONF).await? else {
            continue;
        };
        return Ok(match renderer.endpoint() {
            Endpoint::Fixed { .. } => text,
            Endpoint::LocalProxy { .. } => {
                let reachable = cp
                    .host
                    .access_ip
                    .clone()
                    .unwrap_or(render::node_ip(&cp.host)?);
                text.replace(
                    &format!("https://{}", renderer.endpoint().address()),
                    &format!("https://{reachable}:6443"),
                )
            }
        });
    }
    Err(ProvisionError::NotInitialised)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    use bytes::Bytes;

    use super::*;
    use crate::provision::plan::decide;
    use crate::spec::{Cluster, Host};
    use crate::ssh::task::fake::{Files, StepByStep, step_failed};

    pub(crate) const CA: &str = include_str!("testdata/ca.crt");
    const CA_HASH: &str = include_str!("testdata/ca.hash");

    /// `c` as the renderer takes it: the typed model, resolved once (tests render the spec
    /// they wrote, completed as a command would).
    pub(crate) fn resolved(c: &Cluster) -> ResolvedCluster {
        crate::spec::resolve::model(c, &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    pub(crate) fn cluster(extra: &str) -> Cluster {
        let yaml = format!(
            "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: demo.example.com\n\
             spec:\n  cloudProvider: metal\n  kubernetesVersion: 1.35.1\n  networking:\n    \
             podCIDR: 100.96.0.0/11\n    serviceCIDR: 100.64.0.0/13\n  etcd:\n    type: Stacked\n{extra}"
        );
        serde_saphyr::from_str(&yaml).unwrap()
    }

    pub(crate) fn hosts(cps: usize, workers: usize) -> Vec<Host> {
        let mut out = Vec::new();
        for i in 0..cps + workers {
            let cp = i < cps;
            let (name, roles) = if cp {
                (
                    format!("cp{}", i + 1),
                    vec![HostRole::ControlPlane, HostRole::Etcd],
                )
            } else {
                (format!("w{}", i + 1 - cps), vec![HostRole::Node])
            };
            out.push(crate::spec::test_host(
                &name,
                &format!("198.18.0.{}", 11 + i),
                &roles,
            ));
        }
        out
    }

    pub(crate) fn targets(hosts: &[Host]) -> Vec<Target> {
        hosts.iter().cloned().map(Target::from_host).collect()
    }

    pub(crate) fn owner() -> Owner {
        Owner {
            uid: "0123456789abcdef".into(),
            cluster: "demo.example.com".into(),
            store: "file:///var/tmp/store".into(),
        }
    }

    #[derive(Debug, Clone)]
    struct Event {
        host: String,
        step: String,
        start: u64,
        end: u64,
    }

    /// Simulates hosts: stores uploaded files, plays the effect of kubeadm steps, treats a
    /// step as converged when its check exists and it already succeeded with the same files.
    #[derive(Default)]
    struct Fake {
        clock: Mutex<u64>,
        events: Mutex<Vec<Event>>,
        files: Files,
        done: Mutex<BTreeSet<(String, String, Vec<Bytes>)>>,
        fail: Vec<(String, String)>,
        unreachable: Vec<String>,
        /// Hosts whose key kprov never recorded.
        unknown_key: Vec<String>,
        duplicate_uuid: bool,
        /// (host, step, other step): the host's step does not finish before the other step
        /// has started on some host (at most 10 s: a test that fails does not hang).
        hold: Vec<(String, String, String)>,
        started: Mutex<Vec<String>>,
    }

    impl Fake {
        /// Hosts where `step` (a step name's beginning) fails on `host`.
        fn failing(host: &str, step: &str) -> Fake {
            Fake {
                fail: vec![(host.into(), step.into())],
                ..Fake::default()
            }
        }

        fn tick(&self) -> u64 {
            let mut c = self.clock.lock().unwrap();
            *c += 1;
            *c
        }

        fn put(&self, host: &str, path: &str, content: impl Into<Bytes>) {
            self.files.put(host, path, content);
        }

        fn reachable(&self, host: &str) -> Result<(), ExecError> {
            if self.unreachable.iter().any(|h| h == host) {
                return Err(ExecError::Connect {
                    host: host.into(),
                    message: "No route to host".into(),
                });
            }
            if self.unknown_key.iter().any(|h| h == host) {
                return Err(ExecError::UnknownHostKey {
                    host: host.into(),
                    fingerprints: "SHA256:test".into(),
                });
            }
            Ok(())
        }

        fn events(&self) -> Vec<Event> {
            self.events.lock().unwrap().clone()
        }

        fn steps_on(&self, host: &str) -> Vec<String> {
            self.events()
                .into_iter()
                .filter(|e| e.host == host)
                .map(|e| e.step)
                .collect()
        }

        /// Whether `step` ran on `host`.
        fn ran(&self, host: &str, step: &str) -> bool {
            self.steps_on(host).iter().any(|s| s == step)
        }

        /// The text of the file at `path` on `host`; panics where there is none.
        fn text(&self, host: &str, path: &str) -> String {
            let content = self
                .files
                .get(host, path)
                .unwrap_or_else(|| panic!("{host}: no {path}"));
            std::str::from_utf8(&content).unwrap().to_string()
        }
    }

    #[async_trait::async_trait]
    impl StepByStep for Fake {
        fn admit(&self, host: &str, _: &[Step]) -> Result<(), ExecError> {
            self.reachable(host)
        }

        async fn step(&self, host: &str, s: &Step) -> Result<StepOutcome, ExecError> {
            let start = self.tick();
            self.started.lock().unwrap().push(s.name.clone());
            // Let concurrent hosts interleave, as real ssh round trips do.
            tokio::time::sleep(Duration::from_millis(5)).await;
            for (_, _, other) in self
                .hold
                .iter()
                .filter(|(h, n, _)| h == host && *n == s.name)
            {
                let until = std::time::Instant::now() + Duration::from_secs(10);
                while !self.started.lock().unwrap().contains(other)
                    && std::time::Instant::now() < until
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            let key = (
                host.to_string(),
                s.name.clone(),
                s.files.iter().map(|f| f.content.clone()).collect(),
            );
            let converged = s.check.is_some() && self.done.lock().unwrap().contains(&key);
            let end = self.tick();
            self.events.lock().unwrap().push(Event {
                host: host.into(),
                step: s.name.clone(),
                start,
                end,
            });
            if self
                .fail
                .iter()
                .any(|(h, n)| h == host && s.name.starts_with(n.as_str()))
            {
                return Err(step_failed(host, s, "boom"));
            }
            if converged {
                return Ok(StepOutcome::Unchanged);
            }
            for f in &s.files {
                self.put(host, &f.path, f.content.clone());
            }
            match s.name.as_str() {
                "ownership: claim" => {
                    let ours = s.run.contains(&owner().uid);
                    let existing = self.files.get(host, OWNER_FILE);
                    match existing {
                        Some(m) if !ours || !m.starts_with(format!("uid={}", owner().uid).as_bytes()) => {
                            return Err(step_failed(host, s, "this host belongs to another cluster"));
                        }
                        Some(_) => {}
                        None => self.put(host, OWNER_FILE, owner().marker()),
                    }
                }
                "preflight: checks" => {
                    let uuid = if self.duplicate_uuid { "same".to_string() } else { format!("uuid-{host}") };
                    self.put(host, render::FACTS_FILE, format!(
                        "hostname={host}\nmachine=x86_64\nproduct_uuid={uuid}\nmacs=mac-of-{host}\n"
                    ));
                }
                "kubeadm: init" => {
                    self.put(host, render::ADMIN_CONF, "apiVersion: v1\nclusters:\n- cluster:\n    server: https://api.internal.demo.example.com:6443\n");
                    self.put(host, render::CA_CERT, CA);
                    self.put(host, render::KUBELET_CONF, "kubelet");
                }
                "kubeadm: join token" => self.put(host, render::JOIN_COMMAND_FILE, format!(
                    "kubeadm join api.internal.demo.example.com:6443 --token abcdef.0123456789abcdef --discovery-token-ca-cert-hash sha256:{}\n",
                    CA_HASH.trim()
                )),
                "kubeadm: join" => self.put(host, render::KUBELET_CONF, "kubelet"),
                _ => {}
            }
            self.done.lock().unwrap().insert(key);
            Ok(StepOutcome::Changed)
        }

        async fn read(&self, host: &str, path: &str) -> Result<Option<Bytes>, ExecError> {
            self.reachable(host)?;
            Ok(self.files.get(host, path))
        }
    }

    type Outcome = Result<Report, ProvisionError>;

    /// `provision` of the plain test cluster (`cluster("")`) on `hosts`, as most tests run it.
    async fn provision_plain(fake: &Fake, hosts: &[Host]) -> Outcome {
        provision_with(fake, hosts, &opts()).await
    }

    /// [`provision_plain`] with other options.
    async fn provision_with(fake: &Fake, hosts: &[Host], o: &Options) -> Outcome {
        provision(fake, &resolved(&cluster("")), &targets(hosts), &owner(), o).await
    }

    /// `reset` of the plain test cluster on `hosts`, as `owner` asks it.
    async fn reset_plain(fake: &Fake, hosts: &[Host], owner: &Owner, o: &Options) -> Outcome {
        reset(fake, &resolved(&cluster("")), &targets(hosts), owner, o).await
    }

    fn opts() -> Options {
        Options {
            now: 1_800_000_000,
            progress: None,
            cloud_api: None,
        }
    }

    fn result_of(report: &Report, host: &str) -> HostResult {
        report
            .hosts
            .iter()
            .find(|r| r.host == host)
            .unwrap_or_else(|| panic!("{host}: not in the report"))
            .result
            .clone()
    }

    fn span(events: &[Event], host: &str, step: &str) -> (u64, u64) {
        let e = events
            .iter()
            .find(|e| e.host == host && e.step == step)
            .unwrap_or_else(|| panic!("{host}: no {step}"));
        (e.start, e.end)
    }

    /// A new stacked cluster: `kubeadm init` starts once the first control plane's own install
    /// is done, while a worker is still installing (it holds its last install step until init
    /// has started); the worker joins only after init and its own install.
    #[tokio::test]
    async fn init_starts_while_the_other_hosts_still_install() {
        let fake = Fake {
            hold: vec![(
                "w1".into(),
                "kubelet: service".into(),
                "kubeadm: init".into(),
            )],
            ..Fake::default()
        };
        let hosts = hosts(1, 2);
        let report = provision_plain(&fake, &hosts).await.unwrap();
        assert!(report.success(), "{report:#?}");
        let ev = fake.events();
        let init = span(&ev, "cp1", "kubeadm: init");
        let cp_install = span(&ev, "cp1", "kubelet: service");
        let w1_install = span(&ev, "w1", "kubelet: service");
        assert!(cp_install.1 < init.0, "init before its own install ended");
        assert!(
            init.0 < w1_install.1,
            "init waited for w1's install: init {init:?}, w1's install {w1_install:?}"
        );
        for w in ["w1", "w2"] {
            let join = span(&ev, w, "kubeadm: join");
            let installed = span(&ev, w, "kubelet: service");
            assert!(init.1 < join.0 && installed.1 < join.0, "{w} joined early");
        }
    }

    /// The first control plane's install fails: no init, and no host joins (the others
    /// installed meanwhile).
    #[tokio::test]
    async fn a_failed_install_of_the_first_control_plane_runs_no_init() {
        let fake = Fake::failing("cp1", "kubelet: service");
        let hosts = hosts(1, 1);
        let report = provision_plain(&fake, &hosts).await.unwrap();
        assert!(!report.success());
        assert!(!fake.ran("cp1", "kubeadm: init"));
        assert!(!fake.ran("w1", "kubeadm: join"));
        assert!(fake.ran("w1", "kubelet: service"));
    }

    #[tokio::test]
    async fn ha_order_init_then_sequential_control_planes_then_parallel_workers() {
        let fake = Fake::default();
        let hosts = hosts(3, 3);
        let report = provision_plain(&fake, &hosts).await.unwrap();
        assert!(report.success(), "{report:#?}");
        let ev = fake.events();
        let init = span(&ev, "cp1", "kubeadm: init");
        let joins: Vec<(u64, u64)> = ["cp2", "cp3", "w1", "w2", "w3"]
            .iter()
            .map(|h| span(&ev, h, "kubeadm: join"))
            .collect();
        for j in &joins {
            assert!(init.1 < j.0, "a join started before init finished");
        }
        // Control planes strictly one after the other, and before workers.
        assert!(joins[0].1 < joins[1].0);
        for w in &joins[2..] {
            assert!(joins[1].1 < w.0);
        }
        // Workers overlap: each starts before the others end.
        let latest_start = joins[2..].iter().map(|j| j.0).max().unwrap();
        let earliest_end = joins[2..].iter().map(|j| j.1).min().unwrap();
        assert!(
            latest_start < earliest_end,
            "workers did not join in parallel: {joins:?}"
        );
        assert!(!fake.ran("cp2", "kubeadm: init"));
        // The join configs pin the CA read back from cp1 and carry the key init uploaded.
        let join = fake.text("cp2", "/etc/kubernetes/kprov/kubeadm-join.yaml");
        let key_file = fake.text("cp1", render::CERTIFICATE_KEY_FILE);
        let key = key_file.split_whitespace().nth(1).unwrap();
        assert!(
            join.contains(&format!("sha256:{}", CA_HASH.trim())),
            "{join}"
        );
        assert!(
            join.contains(&format!("certificateKey: \"{key}\"")),
            "{join}"
        );
        assert!(key_file.starts_with("1800000000 "));
        assert!(!join.contains("unsafeSkipCAVerification"));
        let worker_join = fake.text("w1", "/etc/kubernetes/kprov/kubeadm-join.yaml");
        assert!(!worker_join.contains("controlPlane:"));
    }

    #[tokio::test]
    async fn rerun_is_a_no_op() {
        let fake = Fake::default();
        let hosts = hosts(3, 2);
        provision_plain(&fake, &hosts).await.unwrap();
        let before = fake.events().len();
        let report = provision_plain(&fake, &hosts).await.unwrap();
        assert!(report.success());
        assert_eq!(report.changed(), 0, "{report:#?}");
        let rerun: Vec<String> = fake.events()[before..]
            .iter()
            .map(|e| e.step.clone())
            .collect();
        for forbidden in [
            "kubeadm: init",
            "kubeadm: join",
            "kubeadm: join token",
            "kubeadm: certificate key",
        ] {
            assert!(
                !rerun.iter().any(|s| s == forbidden),
                "{forbidden} ran again"
            );
        }
    }

    /// `update cluster` never upgrades running members: after a version or label change
    /// they are left alone (nothing runs on them) and reported pending a rolling update,
    /// while a new host still joins; the record is written last, on provisioned hosts only.
    #[tokio::test]
    async fn a_changed_spec_leaves_members_pending_a_rolling_update() {
        let fake = Fake::default();
        let hs = hosts(2, 1);
        provision_plain(&fake, &hs).await.unwrap();
        let record = |host: &str| {
            let files = fake.files.lock().unwrap();
            crate::nodes::roll::Provisioned::parse(
                &files[&(
                    host.to_string(),
                    crate::nodes::roll::PROVISIONED_FILE.to_string(),
                )],
            )
            .unwrap()
        };
        assert_eq!(record("cp1").kubernetes_version, "1.35.1");
        assert_eq!(record("w1").kubernetes_version, "1.35.1");
        let before = fake.events().len();
        let newer = cluster("").clone();
        let mut older = newer.clone();
        older.spec.kubernetes_version = Some("1.34.4".into());
        // Pretend the members were provisioned with 1.34.4: rewrite their records.
        let r = Renderer::new(&resolved(&older), &targets(&hs)).unwrap();
        for t in targets(&hs) {
            fake.put(
                t.name(),
                crate::nodes::roll::PROVISIONED_FILE,
                r.provisioned(&t).unwrap().to_json(),
            );
        }
        let mut more = hs.clone();
        more.extend(hosts(2, 2).into_iter().skip(3));
        let mut labelled = more.clone();
        labelled[2].labels.insert("tier".into(), "web".into());
        let report = provision(
            &fake,
            &resolved(&newer),
            &targets(&labelled),
            &owner(),
            &opts(),
        )
        .await
        .unwrap();
        assert!(report.success(), "{report:#?}");
        let pending: Vec<&str> = report
            .pending_roll()
            .iter()
            .map(|h| h.host.as_str())
            .collect();
        assert_eq!(pending, ["cp1", "cp2", "w1"]);
        match &report.hosts[2].result {
            HostResult::PendingRoll { reason } => {
                assert!(
                    reason.contains("kubernetesVersion 1.34.4 -> 1.35.1"),
                    "{reason}"
                );
                assert!(reason.contains("labels {} -> {tier=web}"), "{reason}");
                assert!(
                    reason.contains("rolling-update cluster demo.example.com --yes"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        let after = &fake.events()[before..];
        assert!(
            after.iter().all(|e| e.host == "w2"
                || e.step.starts_with("kubeadm: join token")
                || e.step.starts_with("kubeadm: certificate")),
            "members were changed: {:?}",
            after.iter().map(|e| (&e.host, &e.step)).collect::<Vec<_>>()
        );
        assert!(fake.ran("w2", "kubeadm: join"));
        assert_eq!(record("w2").kubernetes_version, "1.35.1");
        assert_eq!(record("w1").kubernetes_version, "1.34.4");
    }

    #[tokio::test]
    async fn new_host_joins_on_rerun_and_expired_key_is_reuploaded() {
        let fake = Fake::default();
        let mut hs = hosts(1, 1);
        provision_plain(&fake, &hs).await.unwrap();
        // A new control plane arrives three hours later: the key from init has expired.
        hs.insert(
            1,
            Host {
                name: "cp2".into(),
                address: "198.18.0.30".into(),
                ..hs[0].clone()
            },
        );
        let later = Options {
            now: opts().now + 3 * 3600,
            ..opts()
        };
        let before = fake.events().len();
        let report = provision_with(&fake, &hs, &later).await.unwrap();
        assert!(report.success(), "{report:#?}");
        let rerun: Vec<(String, String)> = fake.events()[before..]
            .iter()
            .map(|e| (e.host.clone(), e.step.clone()))
            .collect();
        assert!(rerun.contains(&("cp1".into(), "kubeadm: certificate key".into())));
        assert!(rerun.contains(&("cp2".into(), "kubeadm: join".into())));
        assert!(!rerun.contains(&("w1".into(), "kubeadm: join".into())));
        let key_file = fake.text("cp1", render::CERTIFICATE_KEY_FILE);
        assert!(key_file.starts_with(&format!("{} ", later.now)));
        // The worker's proxy now balances over both control planes.
        let cfg = fake.text("w1", "/etc/kubernetes/kprov/haproxy.cfg");
        assert!(
            cfg.contains("server cp1 198.18.0.11:6443")
                && cfg.contains("server cp2 198.18.0.30:6443"),
            "{cfg}"
        );
    }

    #[tokio::test]
    async fn valid_key_is_reused_without_reupload() {
        let fake = Fake::default();
        let mut hs = hosts(1, 0);
        provision_plain(&fake, &hs).await.unwrap();
        hs.push(Host {
            name: "cp2".into(),
            address: "198.18.0.30".into(),
            ..hs[0].clone()
        });
        let before = fake.events().len();
        let soon = Options {
            now: opts().now + 3600,
            ..opts()
        };
        provision_with(&fake, &hs, &soon).await.unwrap();
        assert!(
            !fake.events()[before..]
                .iter()
                .any(|e| e.step == "kubeadm: certificate key")
        );
    }

    /// `delete cluster` skips hosts kprov never reached; the report says which they are by
    /// type, not by the wording of the error.
    #[tokio::test]
    async fn reset_marks_hosts_never_contacted() {
        let fake = Fake {
            unknown_key: vec!["w2".into()],
            unreachable: vec!["w3".into()],
            ..Default::default()
        };
        let report = reset_plain(&fake, &hosts(1, 3), &owner(), &opts())
            .await
            .unwrap();
        let unknown = |h: &str| {
            report.hosts.iter().find(|r| r.host == h).map(|r| {
                matches!(
                    r.result,
                    HostResult::Failed {
                        unknown_host_key: true,
                        ..
                    }
                )
            })
        };
        assert_eq!(unknown("w2"), Some(true));
        assert_eq!(
            unknown("w3"),
            Some(false),
            "unreachable is not the same as never contacted"
        );
        assert_eq!(unknown("w1"), Some(false));
    }

    #[tokio::test]
    async fn failed_worker_does_not_stop_others() {
        let fake = Fake {
            unreachable: vec!["w3".into()],
            ..Fake::failing("w2", "kubeadm: join")
        };
        let report = provision_plain(&fake, &hosts(1, 4)).await.unwrap();
        assert!(!report.success());
        let result = |h: &str| result_of(&report, h);
        assert_eq!(result("w1"), HostResult::Ok);
        assert_eq!(result("w4"), HostResult::Ok);
        assert!(
            matches!(result("w2"), HostResult::Failed { phase: Phase::JoinWorker, ref error, .. } if error.contains("boom"))
        );
        assert!(
            matches!(result("w3"), HostResult::Failed { phase: Phase::Preflight, ref error, unknown_host_key: false } if error.contains("No route to host"))
        );
    }

    #[tokio::test]
    async fn failed_control_plane_join_stops_later_control_planes_only() {
        let fake = Fake::failing("cp2", "kubeadm: join");
        let report = provision_plain(&fake, &hosts(3, 1)).await.unwrap();
        let result = |h: &str| result_of(&report, h);
        assert!(matches!(result("cp2"), HostResult::Failed { .. }));
        assert!(
            matches!(result("cp3"), HostResult::Skipped { ref reason } if reason.contains("cp2"))
        );
        assert_eq!(result("w1"), HostResult::Ok);
        assert!(!fake.ran("cp3", "kubeadm: join"));
    }

    #[tokio::test]
    async fn failed_init_skips_everyone_else() {
        let fake = Fake::failing("cp1", "kubeadm: init");
        let report = provision_plain(&fake, &hosts(1, 2)).await.unwrap();
        assert!(matches!(
            report.hosts[0].result,
            HostResult::Failed {
                phase: Phase::Init,
                ..
            }
        ));
        assert!(matches!(report.hosts[1].result, HostResult::Skipped { .. }));
        assert!(!fake.ran("w1", "kubeadm: join"));
    }

    #[tokio::test]
    async fn cloned_machines_fail_preflight() {
        let fake = Fake {
            duplicate_uuid: true,
            ..Default::default()
        };
        let report = provision_plain(&fake, &hosts(1, 1)).await.unwrap();
        for r in &report.hosts {
            assert!(
                matches!(&r.result, HostResult::Failed { phase: Phase::Preflight, error, .. } if error.contains("product_uuid same is also used by")),
                "{r:?}"
            );
        }
        assert!(!fake.events().iter().any(|e| e.step.starts_with("kubeadm")));
    }

    #[tokio::test]
    async fn reset_and_admin_kubeconfig() {
        let fake = Fake::default();
        let hs = hosts(1, 1);
        assert!(matches!(
            admin_kubeconfig(&fake, &resolved(&cluster("")), &targets(&hs), &owner()).await,
            Err(ProvisionError::NotInitialised)
        ));
        provision_plain(&fake, &hs).await.unwrap();
        let kc = admin_kubeconfig(&fake, &resolved(&cluster("")), &targets(&hs), &owner())
            .await
            .unwrap();
        assert!(kc.contains("server: https://198.18.0.11:6443"), "{kc}");
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let with_progress = Options {
            progress: Some(Arc::new(move |e: &ProgressEvent| {
                sink.lock().unwrap().push(e.clone())
            })),
            ..opts()
        };
        let report = reset_plain(&fake, &hs, &owner(), &with_progress)
            .await
            .unwrap();
        let events = events.lock().unwrap().clone();
        assert_eq!(events.len(), 4, "{events:?}");
        assert!(events.contains(&ProgressEvent::Started {
            host: "w1".into(),
            phase: Phase::Reset,
            steps: 1
        }));
        assert!(events.contains(&ProgressEvent::Finished {
            host: "w1".into(),
            phase: Phase::Reset,
            changed: 1,
            unchanged: 0
        }));
        assert!(report.success());
        assert_eq!(fake.steps_on("w1").last().unwrap(), "kubeadm: reset");
    }

    /// Refused hosts (another cluster's marker) get no step at all; every other host is
    /// claimed before its first other step.
    #[tokio::test]
    async fn hosts_of_another_cluster_are_refused_and_claim_comes_first() {
        let fake = Fake::default();
        fake.put(
            "w1",
            OWNER_FILE,
            "uid=ffff\ncluster=first.example.com\nstore=file:///var/tmp/first\n",
        );
        let report = provision_plain(&fake, &hosts(1, 2)).await.unwrap();
        let w1 = report.hosts.iter().find(|h| h.host == "w1").unwrap();
        assert!(
            matches!(&w1.result, HostResult::Failed { phase: Phase::Claim, error, .. }
                if error.contains("first.example.com") && error.contains("file:///var/tmp/first")),
            "{w1:?}"
        );
        assert!(fake.steps_on("w1").is_empty(), "{:?}", fake.steps_on("w1"));
        for h in ["cp1", "w2"] {
            assert_eq!(fake.steps_on(h)[0], "ownership: claim");
            let marker =
                fake.files.lock().unwrap()[&(h.to_string(), OWNER_FILE.to_string())].clone();
            assert_eq!(Owner::parse(&marker), Some(owner()));
        }
        assert!(fake.ran("w2", "kubeadm: join"));
    }

    /// The orchestrator initialises where the plan says, not where it would have chosen.
    #[tokio::test]
    async fn execution_follows_the_plan() {
        let fake = Fake::default();
        let ts = targets(&hosts(2, 1));
        let plan = decide(
            "demo.example.com",
            &ts,
            &[Observation::New, Observation::New, Observation::New],
            Some(owner()),
        );
        // Re-planned by hand: cp2 initialises, cp1 joins through it.
        let mut plan = plan;
        plan.first_control_plane = Some("cp2".into());
        plan.nodes[0].action = Action::JoinControlPlane;
        plan.nodes[1].action = Action::Init;
        let report = execute(&fake, &resolved(&cluster("")), &ts, &plan, &opts())
            .await
            .unwrap();
        assert!(report.success(), "{report:#?}");
        assert!(fake.ran("cp2", "kubeadm: init"));
        assert!(!fake.ran("cp1", "kubeadm: init"));
        assert!(fake.ran("cp1", "kubeadm: join"));
        // A preview's plan (no owner) is never executed.
        plan.owner = None;
        assert!(matches!(
            execute(&fake, &resolved(&cluster("")), &ts, &plan, &opts()).await,
            Err(ProvisionError::NoOwner)
        ));
    }

    /// A second cluster listing the first one's hosts gets neither their credentials nor a
    /// reset.
    #[tokio::test]
    async fn another_cluster_gets_no_credentials_and_resets_nothing() {
        let fake = Fake::default();
        let hs = hosts(1, 1);
        provision_plain(&fake, &hs).await.unwrap();
        let second = Owner {
            uid: "9999".into(),
            cluster: "second.example.com".into(),
            store: "file:///var/tmp/second".into(),
        };
        assert!(matches!(
            admin_kubeconfig(&fake, &resolved(&cluster("")), &targets(&hs), &second).await,
            Err(ProvisionError::NotInitialised)
        ));
        let report = reset_plain(&fake, &hs, &second, &opts()).await.unwrap();
        for h in &report.hosts {
            assert!(
                matches!(&h.result, HostResult::Skipped { reason } if reason.contains("demo.example.com")),
                "{h:?}"
            );
        }
        assert!(!fake.events().iter().any(|e| e.step == "kubeadm: reset"));
        let plan = plan::plan(
            &fake,
            None,
            &resolved(&cluster("")),
            &targets(&hs),
            Some(second),
        )
        .await
        .unwrap();
        assert!(plan.nodes.iter().all(|n| n.action == Action::Refused));
    }

    /// Hosts without DMI (containers, some VMs) report product_uuid `unknown`: never a
    /// duplicate; real duplicates still are.
    #[test]
    fn hosts_without_dmi_are_not_clones() {
        let facts = |host: &str, uuid: &str| {
            (
                host.to_string(),
                Facts::parse(&format!(
                    "hostname={host}\nmachine=x86_64\nproduct_uuid={uuid}\nmacs=02:00:00:00:00:0{}\n",
                    host.len()
                )),
            )
        };
        assert!(duplicate_facts(&[facts("a", "unknown"), facts("bb", "unknown")]).is_empty());
        assert!(duplicate_facts(&[facts("a", ""), facts("bb", "")]).is_empty());
        let dup = duplicate_facts(&[facts("a", "U-1"), facts("bb", "U-1")]);
        assert_eq!(dup.len(), 2);
        assert!(dup["a"][0].starts_with("product_uuid U-1 is also used by bb"));
    }

    #[test]
    fn join_command_parsing() {
        assert_eq!(
            parse_join_command(
                "kubeadm join x:6443 --token a.b --discovery-token-ca-cert-hash sha256:ff \n"
            ),
            Some(("a.b".into(), Some("ff".into())))
        );
        assert_eq!(parse_join_command("kubeadm join x:6443"), None);
    }
}
