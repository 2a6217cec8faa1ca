//! One node plan: what `update cluster` does to each target, with the reasons.
//!
//! [`observe`] looks at every target without changing anything (it reads the ownership marker,
//! whether the host is a member, and optionally which of kprov's files drifted) and [`decide`]
//! turns the observations into a [`NodePlan`]. The preview prints that value; `update --yes`
//! observes again under the cluster lock with the same functions (the world may have changed
//! since the preview) and hands the plan to `provision::orchestrate::execute`, which does what
//! the plan says and decides nothing of its own about who initialises or joins.
//!
//! Caveat: observation reads only; it never runs a step's `check` (some checks write, e.g.
//! preflight records facts). Whether it may contact a host whose key is not recorded is the
//! executor's policy: the SSH engine contacts none unless new keys may be recorded.

use futures::future::join_all;
use serde::Serialize;

use crate::nodes::Target;
use crate::nodes::model::Facts;
use crate::nodes::owner::{OWNER_FILE, Owner};
use crate::nodes::roll::{PROVISIONED_FILE, Provisioned, differences};
use crate::provision::render::{self, CloudApi, RenderError, Renderer};
use crate::spec::{Cluster, HostRole, ResolvedCluster};
use crate::ssh::task::{ExecError, HostExecutor, Step};

/// Which files of a step list differ on a host, read-only (hashes and modes only). The SSH
/// engine implements it; a plan made without it does not report drift.
#[async_trait::async_trait]
pub(crate) trait FileDiff: Send + Sync {
    async fn differing_files(
        &self,
        host: &str,
        steps: &[Step],
    ) -> Result<Vec<(String, Vec<String>)>, ExecError>;
}

#[async_trait::async_trait]
impl FileDiff for crate::ssh::SshFleet {
    async fn differing_files(
        &self,
        host: &str,
        steps: &[Step],
    ) -> Result<Vec<(String, Vec<String>)>, ExecError> {
        crate::ssh::SshFleet::differing_files(self, host, steps).await
    }
}

/// What the read-only look at a target found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub(crate) enum Observation {
    /// Reachable, not (yet) a member, and not owned by another cluster.
    New,
    /// kubelet.conf present (etcd-only hosts: etcd's manifest); `initialised` when it is a
    /// control plane holding admin.conf. `drift`: `step: path` of files that differ from what
    /// kprov would write (empty when not asked for).
    Member {
        initialised: bool,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        drift: Vec<String>,
    },
    /// A member whose provisioning record differs from what the spec wants now (version,
    /// configuration, labels, taints): `update cluster` leaves it to `rolling-update cluster`.
    Outdated {
        initialised: bool,
        reasons: Vec<String>,
    },
    /// The cluster has no recorded key for it: kprov has not contacted it.
    HostKeyNotRecorded,
    /// Could not be inspected (unreachable, changed host key, unreadable files).
    Unreachable { reason: String },
    /// Its ownership marker names another cluster.
    OwnedByOther { owner: Owner },
}

/// What `update --yes` does to a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Action {
    /// `kubeadm init`: the first control plane of a cluster that has none initialised.
    Init,
    JoinControlPlane,
    JoinWorker,
    /// Already a member: every step is re-checked, only drifted files change.
    Settle,
    /// An etcd-only host (external etcd, no other role), converged on every run.
    Etcd,
    /// Never touched (owned by another cluster).
    Refused,
    /// A member that runs an older configuration: left alone, pending a rolling update.
    PendingRoll,
}

impl Action {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Action::Init => "init",
            Action::JoinControlPlane => "join control plane",
            Action::JoinWorker => "join worker",
            Action::Settle => "settle (re-check)",
            Action::Etcd => "etcd member",
            Action::Refused => "refused",
            Action::PendingRoll => "pending rolling update",
        }
    }
}

/// One row of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PlannedNode {
    /// The target's name (progress, reports, host keys).
    pub(crate) target: String,
    pub(crate) node_name: String,
    pub(crate) roles: Vec<HostRole>,
    pub(crate) action: Action,
    pub(crate) observed: Observation,
    /// Why the action, and what stands in its way, in words.
    pub(crate) reasons: Vec<String>,
    /// Whether `--yes` would change the target (it joins, files drifted, or it could not be
    /// inspected).
    pub(crate) pending: bool,
    /// The image archives (`spec.assets.images`, by URL) the target has not imported yet:
    /// what `--yes` (or, for a member pending a roll, `rolling-update`) brings to it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) images: Vec<String>,
}

impl PlannedNode {
    /// A short state for tables.
    pub(crate) fn state(&self) -> String {
        match &self.observed {
            Observation::New => "new".into(),
            Observation::Member { initialised, drift } => match (*initialised, drift.len()) {
                (true, 0) => "initialised control plane".into(),
                (false, 0) => "member".into(),
                (true, n) => format!("initialised control plane, {n} files differ"),
                (false, n) => format!("member, {n} files differ"),
            },
            Observation::Outdated { initialised, .. } => {
                if *initialised {
                    "initialised control plane, outdated".into()
                } else {
                    "member, outdated".into()
                }
            }
            Observation::HostKeyNotRecorded => "host key not recorded".into(),
            Observation::Unreachable { reason } => format!("not reachable: {reason}"),
            Observation::OwnedByOther { owner } => format!("owned by {}", owner.describe()),
        }
    }
}

/// Where one kind of artifact comes from in this run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ArtifactSource {
    /// `binaries` or `images`.
    pub(crate) artifacts: String,
    pub(crate) origin: crate::bundle::artifacts::Origin,
    /// The bundle file, the mirror, or what upstream means for this kind.
    pub(crate) from: String,
}

impl ArtifactSource {
    /// One line of the preview.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{}: from {} ({})",
            self.artifacts,
            self.origin.as_str(),
            self.from
        )
    }
}

/// Where binaries and images come from for `cluster` (what the renderer will use).
pub(crate) fn sources(cluster: &Cluster) -> Vec<ArtifactSource> {
    use crate::bundle::artifacts::Origin;
    let assets = cluster.spec.assets.as_ref();
    let source = |artifacts: &str, origin: Origin, from: String| ArtifactSource {
        artifacts: artifacts.into(),
        origin,
        from,
    };
    if let Some(b) = assets.and_then(|a| a.bundle.as_deref()) {
        return vec![
            source(
                "binaries",
                Origin::Bundle,
                format!("{b}, uploaded over ssh"),
            ),
            source("images", Origin::Bundle, format!("{b}, uploaded over ssh")),
        ];
    }
    let binaries = match assets.and_then(|a| a.mirror.as_deref()) {
        Some(m) => source("binaries", Origin::Mirror, m.to_string()),
        None if assets.is_some_and(|a| !a.files.is_empty()) => source(
            "binaries",
            Origin::Mirror,
            format!(
                "spec.assets.files ({} overrides), the rest from upstream",
                assets.map_or(0, |a| a.files.len())
            ),
        ),
        None => source(
            "binaries",
            Origin::Upstream,
            "dl.k8s.io and github.com release pages, downloaded by each host".into(),
        ),
    };
    let registries = cluster
        .spec
        .containerd
        .as_ref()
        .map_or(&[][..], |c| c.registries.as_slice());
    let mirrored: Vec<String> = registries
        .iter()
        .filter_map(|r| {
            let first = r.mirrors.first()?;
            let more = match r.mirrors.len() {
                1 => String::new(),
                n => format!(" and {} more", n - 1),
            };
            let fallback = if r.fallback == Some(false) {
                ", never upstream"
            } else {
                ", then upstream"
            };
            Some(format!("{} via {}{more}{fallback}", r.name, first.endpoint))
        })
        .collect();
    let images = if mirrored.is_empty() {
        source(
            "images",
            Origin::Upstream,
            "their registries, pulled by containerd on each host".into(),
        )
    } else {
        source(
            "images",
            Origin::Mirror,
            format!(
                "{}; other registries upstream; pulled by containerd on each host",
                mirrored.join("; ")
            ),
        )
    };
    vec![binaries, images]
}

/// The node plan of one cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NodePlan {
    pub(crate) cluster: String,
    /// The control plane others join through: an initialised member, or the one planned for
    /// `kubeadm init`. `None` when no control plane is usable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) first_control_plane: Option<String>,
    pub(crate) nodes: Vec<PlannedNode>,
    /// Where the nodes' binaries and images come from (bundle, mirror, upstream).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) sources: Vec<ArtifactSource>,
    /// Who claims the hosts; `None` for a preview of a cluster that never claimed one (such a
    /// plan cannot be executed).
    #[serde(skip)]
    pub(crate) owner: Option<Owner>,
}

impl NodePlan {
    pub(crate) fn node(&self, target: &str) -> Option<&PlannedNode> {
        self.nodes.iter().find(|n| n.target == target)
    }

    pub(crate) fn action(&self, target: &str) -> Option<Action> {
        self.node(target).map(|n| n.action)
    }

    /// Targets `--yes` would change.
    pub(crate) fn pending(&self) -> Vec<&str> {
        self.nodes
            .iter()
            .filter(|n| n.pending)
            .map(|n| n.target.as_str())
            .collect()
    }

    /// Targets the plan refuses (errors, not changes).
    pub(crate) fn refused(&self) -> Vec<&PlannedNode> {
        self.nodes
            .iter()
            .filter(|n| n.action == Action::Refused)
            .collect()
    }
}

fn joins_cluster(t: &Target) -> bool {
    t.has_role(HostRole::ControlPlane) || t.has_role(HostRole::Node)
}

/// Decides each target's action from what was observed (pure; `observed` in target order).
pub(crate) fn decide(
    cluster: &str,
    targets: &[Target],
    observed: &[Observation],
    owner: Option<Owner>,
) -> NodePlan {
    let pairs: Vec<(&Target, &Observation)> = targets.iter().zip(observed).collect();
    let initialised = pairs.iter().find(|(t, o)| {
        t.is_control_plane()
            && matches!(
                o,
                Observation::Member {
                    initialised: true,
                    ..
                } | Observation::Outdated {
                    initialised: true,
                    ..
                }
            )
    });
    // `kubeadm init` goes to the first control plane that may be usable.
    let init_on = match initialised {
        Some(_) => None,
        None => pairs
            .iter()
            .find(|(t, o)| {
                t.is_control_plane()
                    && matches!(o, Observation::New | Observation::HostKeyNotRecorded)
            })
            .map(|(t, _)| t.name().to_string()),
    };
    let first_control_plane = initialised
        .map(|(t, _)| t.name().to_string())
        .or(init_on.clone());
    let nodes = pairs
        .iter()
        .map(|(t, o)| {
            let mut reasons = Vec::new();
            let action = match o {
                Observation::OwnedByOther { owner } => {
                    reasons.push(format!(
                        "its ownership marker ({OWNER_FILE}) names {}; kprov never changes a host of another cluster",
                        owner.describe()
                    ));
                    Action::Refused
                }
                _ if !joins_cluster(t) => Action::Etcd,
                Observation::Member { .. } => Action::Settle,
                Observation::Outdated { reasons: why, .. } => {
                    reasons.push(format!(
                        "pending a rolling update ({}); `kprov rolling-update cluster {cluster} --yes` applies it",
                        why.join("; ")
                    ));
                    Action::PendingRoll
                }
                _ if init_on.as_deref() == Some(t.name()) => {
                    reasons.push("no control plane is initialised".into());
                    Action::Init
                }
                _ if t.is_control_plane() => Action::JoinControlPlane,
                _ => Action::JoinWorker,
            };
            let pending = match o {
                Observation::Member { drift, .. } => {
                    if !drift.is_empty() {
                        reasons.push(format!("files differ: {}", drift.join(", ")));
                    }
                    !drift.is_empty()
                }
                Observation::New => {
                    reasons.push("not a member yet".into());
                    true
                }
                Observation::HostKeyNotRecorded => {
                    reasons.push(
                        "its host key is not recorded: kprov has not contacted it (`--yes --accept-new-host-keys` records it)"
                            .into(),
                    );
                    true
                }
                Observation::Unreachable { reason } => {
                    reasons.push(format!("cannot inspect: {reason}"));
                    true
                }
                Observation::OwnedByOther { .. } | Observation::Outdated { .. } => false,
            };
            PlannedNode {
                target: t.name().to_string(),
                node_name: t.node_name.clone(),
                roles: t.host.roles.clone(),
                action,
                observed: (*o).clone(),
                reasons,
                pending,
                images: Vec::new(),
            }
        })
        .collect();
    NodePlan {
        cluster: cluster.to_string(),
        first_control_plane,
        nodes,
        sources: Vec::new(),
        owner,
    }
}

/// Looks at one target without changing anything.
pub(crate) async fn observe_target(
    exec: &dyn HostExecutor,
    diff: Option<&dyn FileDiff>,
    renderer: &Renderer,
    target: &Target,
    our_uid: Option<&str>,
) -> Observation {
    let name = target.name();
    let unreachable = |e: ExecError| match e {
        ExecError::UnknownHostKey { .. } => Observation::HostKeyNotRecorded,
        e => Observation::Unreachable {
            reason: e.to_string(),
        },
    };
    let etcd_only = !joins_cluster(target);
    let membership = if etcd_only {
        render::ETCD_UNIT
    } else {
        render::KUBELET_CONF
    };
    // The owner first: that read connects (an unreachable host fails once, not per file),
    // and a host of another cluster is not looked at further.
    match exec.read_file(name, OWNER_FILE).await {
        Ok(None) => {}
        Ok(Some(bytes)) => match Owner::parse(&bytes) {
            Some(owner) if Some(owner.uid.as_str()) == our_uid => {}
            Some(owner) => return Observation::OwnedByOther { owner },
            None => {
                return Observation::OwnedByOther {
                    owner: Owner {
                        uid: String::new(),
                        cluster: "(unreadable marker)".into(),
                        store: "(unknown store)".into(),
                    },
                };
            }
        },
        Err(e) => return unreachable(e),
    }
    // One after another: each is one command on the host's open connection (a few ms), and
    // an executor need not take several commands on one host at once.
    let member = match exec.read_file(name, membership).await {
        Err(e) => return unreachable(e),
        read => read,
    };
    let admin = if target.is_control_plane() {
        exec.read_file(name, render::ADMIN_CONF).await
    } else {
        Ok(None)
    };
    let provisioned =
        if !etcd_only && (matches!(member, Ok(Some(_))) || matches!(admin, Ok(Some(_)))) {
            exec.read_file(name, PROVISIONED_FILE).await
        } else {
            Ok(None)
        };
    let member = match member {
        Ok(f) => f.is_some(),
        Err(e) => return unreachable(e),
    };
    let initialised = match admin {
        Ok(f) => f.is_some(),
        Err(e) => return unreachable(e),
    };
    if !member && !initialised {
        return Observation::New;
    }
    if !etcd_only {
        match provisioned {
            Err(e) => return unreachable(e),
            // Provisioned before kprov kept records: converged as before, then recorded.
            Ok(None) => {}
            Ok(Some(bytes)) => {
                let reasons = match (Provisioned::parse(&bytes), renderer.provisioned(target)) {
                    (Ok(have), Ok(want)) => record_differences(have, want, target),
                    (Err(e), _) => vec![e],
                    (_, Err(e)) => vec![e.to_string()],
                };
                if !reasons.is_empty() {
                    return Observation::Outdated {
                        initialised,
                        reasons,
                    };
                }
            }
        }
    }
    let drift = match diff {
        None => Vec::new(),
        Some(diff) => match member_drift(exec, diff, renderer, target).await {
            Ok(drift) => drift,
            Err(reason) => return Observation::Unreachable { reason },
        },
    };
    Observation::Member { initialised, drift }
}

/// Why a member's record differs from what provisioning it now would record. A cloud
/// instance whose group's current launch template version is known is compared by the version
/// it was launched from (its tag) against that one: the record alone names the version the
/// instance has, never the one its group moved to.
pub(crate) fn record_differences(
    mut have: Provisioned,
    mut want: Provisioned,
    target: &Target,
) -> Vec<String> {
    if let Some(i) = &target.instance
        && let (Some(launched), Some(current)) =
            (&i.launch_template_version, &i.group_template_version)
    {
        have.launch_template_version = Some(launched.clone());
        want.launch_template_version = Some(current.clone());
    }
    differences(&have, &want)
}

/// Which of the files kprov keeps on members (preflight, install, settle) differ.
async fn member_drift(
    exec: &dyn HostExecutor,
    diff: &dyn FileDiff,
    renderer: &Renderer,
    target: &Target,
) -> Result<Vec<String>, String> {
    // A member without facts was not provisioned as kprov provisions (or lost them): say so,
    // rather than report an unknown architecture.
    let facts = exec
        .read_file(target.name(), render::FACTS_FILE)
        .await
        .map_err(|e| e.to_string())?
        .map(|b| Facts::parse(&String::from_utf8_lossy(&b)))
        .ok_or_else(|| {
            format!(
                "{} is missing (kprov's preflight step writes it; re-run `update cluster --yes`)",
                render::FACTS_FILE
            )
        })?;
    let arch = facts.arch().ok_or_else(|| {
        format!(
            "no usable facts in {}: unknown machine {:?}",
            render::FACTS_FILE,
            facts.machine
        )
    })?;
    let mut steps = renderer.preflight(target).map_err(|e| e.to_string())?;
    steps.extend(
        renderer
            .install(arch, &target.host.roles)
            .map_err(|e| e.to_string())?,
    );
    if joins_cluster(target) {
        steps.extend(renderer.settle(target).map_err(|e| e.to_string())?);
    }
    let differing = diff
        .differing_files(target.name(), &steps)
        .await
        .map_err(|e| e.to_string())?;
    Ok(differing
        .into_iter()
        .flat_map(|(step, paths)| paths.into_iter().map(move |p| format!("{step}: {p}")))
        .collect())
}

/// Observes every target (concurrently; the executor bounds it) and decides. `owner` is the
/// cluster's identity: `None` in a preview of a cluster that has never claimed a host.
#[cfg(test)]
pub(crate) async fn plan(
    exec: &dyn HostExecutor,
    diff: Option<&dyn FileDiff>,
    cluster: &ResolvedCluster,
    targets: &[Target],
    owner: Option<Owner>,
) -> Result<NodePlan, RenderError> {
    plan_with(exec, diff, cluster, targets, owner, None).await
}

/// [`plan`] of a cloud cluster: the files compared are rendered with its API settings.
pub(crate) async fn plan_with(
    exec: &dyn HostExecutor,
    diff: Option<&dyn FileDiff>,
    cluster: &ResolvedCluster,
    targets: &[Target],
    owner: Option<Owner>,
    cloud_api: Option<&CloudApi>,
) -> Result<NodePlan, RenderError> {
    let renderer = Renderer::for_run(cluster, targets, cloud_api)?;
    plan_rendered(exec, diff, &renderer, None, cluster, targets, owner).await
}

/// [`plan_with`] with the run's renderer made by the caller: `update --yes` hands the same
/// one to `orchestrate::execute_rendered`, so its `file://` archives and binaries are read
/// and hashed once per run, not once to observe and again to execute.
pub(crate) async fn plan_rendered(
    exec: &dyn HostExecutor,
    diff: Option<&dyn FileDiff>,
    renderer: &Renderer,
    loading: Option<tokio::task::JoinHandle<()>>,
    cluster: &ResolvedCluster,
    targets: &[Target],
    owner: Option<Owner>,
) -> Result<NodePlan, RenderError> {
    let uid = owner.as_ref().map(|o| o.uid.clone());
    let observed = join_all(
        targets
            .iter()
            .map(|t| observe_target(exec, diff, renderer, t, uid.as_deref())),
    )
    .await;
    // A `file://` image archive whose checksum is wrong fails the preview already. Loaded
    // after observing (read-only). A caller that started loading them on a thread of their
    // own (`ops::nodes::converge`, `loading`) is awaited here, not blocked on: the wait for
    // hundreds of MB must stay cancellable by the caller's Ctrl-C. A load that panicked left
    // nothing loaded, so `load_images` below runs it again and reports it here.
    if let Some(loading) = loading {
        let _ = loading.await;
    }
    renderer.load_images()?;
    let missing = join_all(
        targets
            .iter()
            .zip(&observed)
            .map(|(t, o)| missing_images(exec, renderer, t, o)),
    )
    .await;
    let mut plan = decide(&cluster.name, targets, &observed, owner);
    plan.sources = sources(&cluster.completed);
    for (node, missing) in plan.nodes.iter_mut().zip(missing) {
        note_images(node, missing);
    }
    Ok(plan)
}

/// The image archives `target` still needs, by URL: all of them on a host that is not a
/// member yet (or not inspected), those without their marker on a member, none on a host kprov
/// will not touch. Read-only (marker files only). A marker that cannot be read counts as
/// missing: `--yes` re-checks it anyway.
async fn missing_images(
    exec: &dyn HostExecutor,
    renderer: &Renderer,
    target: &Target,
    observed: &Observation,
) -> Vec<String> {
    let all = renderer.image_archives(&target.host.roles);
    match observed {
        Observation::New | Observation::HostKeyNotRecorded => {
            all.iter().map(|i| i.url.clone()).collect()
        }
        Observation::Member { .. } | Observation::Outdated { .. } => {
            let mut missing = Vec::new();
            for img in all {
                let marker = render::image_marker(&img.sha256);
                if !matches!(exec.read_file(target.name(), &marker).await, Ok(Some(_))) {
                    missing.push(img.url.clone());
                }
            }
            missing
        }
        Observation::Unreachable { .. } | Observation::OwnedByOther { .. } => Vec::new(),
    }
}

/// Puts the archives a node needs into its plan row: a member missing one has work to do.
fn note_images(node: &mut PlannedNode, missing: Vec<String>) {
    if missing.is_empty() {
        return;
    }
    let what = format!("image archives to import: {}", missing.join(", "));
    match node.action {
        Action::Settle | Action::Etcd => {
            node.pending = true;
            node.reasons.push(what);
        }
        Action::PendingRoll => node.reasons.push(format!("{what} (by the rolling update)")),
        _ => node.reasons.push(what),
    }
    node.images = missing;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::orchestrate::tests::{hosts, owner, resolved, targets};
    use crate::provision::render::tests::{archive_with, images_yaml};

    fn member(initialised: bool) -> Observation {
        Observation::Member {
            initialised,
            drift: vec![],
        }
    }

    /// cp1, cp2 (control planes), w1.
    fn three() -> Vec<Target> {
        targets(&hosts(2, 1))
    }

    fn actions(p: &NodePlan) -> Vec<(&str, Action, bool)> {
        p.nodes
            .iter()
            .map(|n| (n.target.as_str(), n.action, n.pending))
            .collect()
    }

    #[test]
    fn fresh_cluster_initialises_the_first_control_plane_and_joins_the_rest() {
        let p = decide(
            "c",
            &three(),
            &[
                Observation::New,
                Observation::New,
                Observation::HostKeyNotRecorded,
            ],
            None,
        );
        assert_eq!(
            actions(&p),
            [
                ("cp1", Action::Init, true),
                ("cp2", Action::JoinControlPlane, true),
                ("w1", Action::JoinWorker, true)
            ]
        );
        assert_eq!(p.first_control_plane.as_deref(), Some("cp1"));
        assert_eq!(p.nodes[2].state(), "host key not recorded");
        assert!(p.nodes[2].reasons[0].contains("--accept-new-host-keys"));
    }

    #[test]
    fn unreachable_first_control_plane_moves_init_to_the_next() {
        let p = decide(
            "c",
            &three(),
            &[
                Observation::Unreachable {
                    reason: "no route".into(),
                },
                Observation::New,
                Observation::New,
            ],
            None,
        );
        assert_eq!(p.nodes[1].action, Action::Init);
        assert_eq!(p.first_control_plane.as_deref(), Some("cp2"));
        assert!(p.nodes[0].state().contains("no route"));
    }

    #[test]
    fn converged_cluster_has_nothing_pending_and_a_new_host_joins() {
        let p = decide(
            "c",
            &three(),
            &[member(true), member(false), member(false)],
            None,
        );
        assert!(p.pending().is_empty());
        assert!(p.nodes.iter().all(|n| n.action == Action::Settle));
        assert_eq!(p.first_control_plane.as_deref(), Some("cp1"));

        let more = targets(&hosts(2, 2));
        let p = decide(
            "c",
            &more,
            &[member(true), member(false), member(false), Observation::New],
            None,
        );
        assert_eq!(actions(&p)[3], ("w2", Action::JoinWorker, true));
        assert_eq!(p.pending(), ["w2"]);
    }

    #[test]
    fn an_initialised_second_control_plane_is_the_one_joined_through() {
        let p = decide(
            "c",
            &three(),
            &[Observation::New, member(true), Observation::New],
            None,
        );
        assert_eq!(p.first_control_plane.as_deref(), Some("cp2"));
        assert_eq!(p.nodes[0].action, Action::JoinControlPlane);
        assert!(!p.nodes.iter().any(|n| n.action == Action::Init));
    }

    #[test]
    fn a_member_with_drifted_files_is_pending_and_says_which() {
        let drift = vec!["containerd: configure: /etc/containerd/config.toml".to_string()];
        let p = decide(
            "c",
            &three(),
            &[
                member(true),
                member(false),
                Observation::Member {
                    initialised: false,
                    drift: drift.clone(),
                },
            ],
            None,
        );
        assert_eq!(p.pending(), ["w1"]);
        assert_eq!(p.nodes[2].state(), "member, 1 files differ");
        assert!(p.nodes[2].reasons[0].contains("/etc/containerd/config.toml"));
    }

    #[test]
    fn image_archives_a_host_lacks_are_listed_and_make_a_member_pending() {
        let mut p = decide(
            "c",
            &three(),
            &[
                Observation::New,
                member(false),
                Observation::Outdated {
                    initialised: false,
                    reasons: vec!["kubernetesVersion 1.35.0 -> 1.35.1".into()],
                },
            ],
            None,
        );
        let a = "file:///srv/a.tar".to_string();
        for (n, missing) in
            p.nodes
                .iter_mut()
                .zip([vec![a.clone()], vec![a.clone()], vec![a.clone()]])
        {
            note_images(n, missing);
        }
        assert_eq!(actions(&p)[1], ("cp2", Action::Settle, true));
        assert_eq!(
            p.nodes[1].reasons,
            ["image archives to import: file:///srv/a.tar"]
        );
        // A member pending a roll stays untouched by `update`: the roll brings them.
        assert_eq!(actions(&p)[2], ("w1", Action::PendingRoll, false));
        assert!(
            p.nodes[2].reasons[1].ends_with("(by the rolling update)"),
            "{:?}",
            p.nodes[2].reasons
        );
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["nodes"][0]["images"], serde_json::json!([a]));
        // Nothing missing: no field, nothing pending.
        let mut q = decide(
            "c",
            &three(),
            &[member(true), member(false), member(false)],
            None,
        );
        for n in &mut q.nodes {
            note_images(n, vec![]);
        }
        assert!(q.pending().is_empty());
        assert!(
            serde_json::to_value(&q).unwrap()["nodes"][0]
                .get("images")
                .is_none()
        );
    }

    /// A member whose facts file holds `facts` (none: missing); no file differs.
    struct Member(Option<&'static str>);

    #[async_trait::async_trait]
    impl HostExecutor for Member {
        async fn run_steps(
            &self,
            _host: &str,
            _steps: &[crate::ssh::task::Step],
        ) -> Result<Vec<crate::ssh::task::StepOutcome>, ExecError> {
            Ok(Vec::new())
        }
        async fn read_file(
            &self,
            _host: &str,
            path: &str,
        ) -> Result<Option<bytes::Bytes>, ExecError> {
            Ok((path == render::FACTS_FILE)
                .then_some(self.0)
                .flatten()
                .map(|t| bytes::Bytes::from_static(t.as_bytes())))
        }
    }

    #[async_trait::async_trait]
    impl FileDiff for Member {
        async fn differing_files(
            &self,
            _host: &str,
            _steps: &[crate::ssh::task::Step],
        ) -> Result<Vec<(String, Vec<String>)>, ExecError> {
            Ok(Vec::new())
        }
    }

    /// A worker member holding none of the control plane's own image archives is not pending
    /// for them (it never gets them), while a control plane lacking them is.
    #[tokio::test]
    async fn a_worker_member_is_not_pending_for_the_control_planes_images() {
        let dir = tempfile::tempdir().unwrap();
        let [apiserver, pause] = [
            "registry.k8s.io/kube-apiserver:v1",
            "registry.k8s.io/pause:3",
        ]
        .map(|tag| archive_with("manifest.json", &format!(r#"[{{"RepoTags":["{tag}"]}}]"#)));
        let yaml = images_yaml(dir.path(), &[("apiserver", &apiserver), ("pause", &pause)]);
        let cluster = crate::provision::orchestrate::tests::cluster(&yaml);
        let targets = three();
        let renderer = Renderer::for_run(&resolved(&cluster), &targets, None).unwrap();
        renderer.load_images().unwrap();
        let names = |v: Vec<String>| -> Vec<String> {
            v.iter()
                .map(|u| u.rsplit('/').next().unwrap().to_string())
                .collect()
        };
        // No marker on any host: a control plane lacks both, a worker only pause.
        let cp = missing_images(&Member(None), &renderer, &targets[0], &member(true)).await;
        assert_eq!(names(cp), ["apiserver.tar", "pause.tar"]);
        let w = missing_images(&Member(None), &renderer, &targets[2], &member(true)).await;
        assert_eq!(names(w), ["pause.tar"]);
        let new = missing_images(&Member(None), &renderer, &targets[2], &Observation::New).await;
        assert_eq!(names(new), ["pause.tar"]);
    }

    #[tokio::test]
    async fn a_member_without_facts_is_reported_as_missing_them_not_as_an_unknown_machine() {
        let cluster = crate::provision::orchestrate::tests::cluster("");
        let targets = three();
        let renderer = Renderer::for_run(&resolved(&cluster), &targets, None).unwrap();
        let drift = async |m: Member| member_drift(&m, &m, &renderer, &targets[2]).await;
        let e = drift(Member(None)).await.unwrap_err();
        assert_eq!(
            e,
            "/var/lib/kprov/facts is missing (kprov's preflight step writes it; re-run \
             `update cluster --yes`)"
        );
        let e = drift(Member(Some("machine=sparc64\n"))).await.unwrap_err();
        assert!(e.contains("unknown machine \"sparc64\""), "{e}");
    }

    #[test]
    fn a_host_of_another_cluster_is_refused_naming_it_and_never_initialised() {
        let other = Owner {
            uid: "ffff".into(),
            cluster: "first.example.com".into(),
            store: "s3://bucket/kprov".into(),
        };
        let p = decide(
            "c",
            &three(),
            &[
                Observation::OwnedByOther {
                    owner: other.clone(),
                },
                Observation::New,
                Observation::OwnedByOther { owner: other },
            ],
            Some(owner()),
        );
        assert_eq!(
            actions(&p),
            [
                ("cp1", Action::Refused, false),
                ("cp2", Action::Init, true),
                ("w1", Action::Refused, false)
            ]
        );
        assert_eq!(p.refused().len(), 2);
        assert!(
            p.nodes[0].reasons[0].contains("first.example.com")
                && p.nodes[0].reasons[0].contains("s3://bucket/kprov"),
            "{:?}",
            p.nodes[0].reasons
        );
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["nodes"][0]["observed"]["state"], "owned-by-other");
        assert_eq!(json["nodes"][0]["action"], "refused");
        assert_eq!(json["nodes"][1]["action"], "init");
    }

    #[test]
    fn an_instance_from_an_older_template_version_than_its_groups_is_outdated() {
        let rec = |v: Option<&str>| Provisioned {
            kubernetes_version: "1.35.1".into(),
            config_digest: "d".into(),
            labels: Default::default(),
            taints: vec![],
            settings: None,
            launch_template_version: v.map(str::to_string),
        };
        let on = |launched: Option<&str>, current: Option<&str>| {
            let mut t = three().remove(2);
            t.instance = Some(crate::nodes::CloudInstance {
                id: "i-1".into(),
                zone: "us-east-1a".into(),
                private_ip: "198.18.32.4".into(),
                public_ip: None,
                private_dns: "ip-198-18-32-4.ec2.internal".into(),
                provider_id: "aws:///us-east-1a/i-1".into(),
                launch_template_version: launched.map(str::to_string),
                group_template_version: current.map(str::to_string),
            });
            t
        };
        // Provisioning records the instance's own version: equal records, but the group moved.
        assert_eq!(
            record_differences(rec(Some("1")), rec(Some("1")), &on(Some("1"), Some("2"))),
            ["launch template version 1 -> 2"]
        );
        assert!(
            record_differences(rec(Some("2")), rec(Some("2")), &on(Some("2"), Some("2")))
                .is_empty()
        );
        // A record written before versions were recorded: the instance's tag speaks for it.
        assert!(
            record_differences(rec(None), rec(Some("2")), &on(Some("2"), Some("2"))).is_empty()
        );
        // The group's version not read, or the instance's unknown: the records alone decide.
        assert!(
            record_differences(rec(Some("1")), rec(Some("1")), &on(Some("1"), None)).is_empty()
        );
        assert!(record_differences(rec(None), rec(None), &on(None, Some("2"))).is_empty());
        // Metal: no instance.
        assert!(record_differences(rec(None), rec(None), &three()[2]).is_empty());
        // Other differences are still named alongside.
        let mut want = rec(Some("1"));
        want.kubernetes_version = "1.35.2".into();
        assert_eq!(
            record_differences(rec(Some("1")), want, &on(Some("1"), Some("2"))),
            [
                "kubernetesVersion 1.35.1 -> 1.35.2",
                "launch template version 1 -> 2"
            ]
        );
    }
}
