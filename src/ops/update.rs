//! `update cluster`, without the command line: [`open`] (flags the platform refuses, the
//! inventory read again on metal), [`Update::plan`] → [`UpdatePlan`] (read-only: the preview
//! prints it) and [`Update::apply`] → [`UpdateReport`] under the cluster's lock. Errors are
//! [`UpdateError`]s.
//!
//! The platform is asked of the seam ([`super::platform::Kind`]); on AWS the cloud plan and
//! the instances come from [`super::aws`], on metal the hosts of the spec (or of the inventory
//! given again) are the targets; both converge through [`super::nodes::converge`]. The
//! add-ons after the nodes are `ops::addons`.
//!
//! ```text
//! let update = ops::update::load(session, name, options).await?;  // refusals, inventory
//! let plan = update.plan().await?;                                 // preview
//! let report = update.apply(&interrupts, &events, nodes).await?;   // under the cluster lock
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::addons::{AddonOptions, AddonReport};
pub(crate) use super::aws::UpdateReport;
use super::aws::{self as ops_aws, AwsEvent, AwsUpdateOptions, Phase};
use super::interrupt::{Caught, Interrupts};
use super::node_config::Synced;
use super::nodes::{self as ops_nodes, Events, NodeOptions};
use super::platform::Kind;
use super::session::Session;
use crate::cloud::CloudError;
use crate::cloud::engine::{Plan, Summary};
use crate::nodes::{self, Target, TargetSource};
use crate::provision::plan::NodePlan;
use crate::repo::Repo;
use crate::spec::{Cluster, Host, ResolvedCluster};
use crate::state::lock::{self, LockError};
use crate::state::{StateStore, Version};

/// What `update cluster` was asked for: the options every platform shares (AWS reads all of
/// them; metal the host keys, the concurrency, `--prune`'s absence and the phase), and metal's
/// and the run's own.
#[derive(Debug, Clone, Default)]
pub(crate) struct UpdateOptions {
    pub common: AwsUpdateOptions,
    /// Metal: the inventory to read the hosts from again (`--inventory`).
    pub inventory: Option<PathBuf>,
    /// `spec.assets.bundle` for this run (`--bundle`; the stored spec is unchanged).
    pub bundle: Option<PathBuf>,
}

/// Why `update cluster` stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpdateError {
    /// A flag this platform has no use for.
    #[error("--{flag}: {message}")]
    Flag { flag: &'static str, message: String },
    /// The cloud plan cannot be applied (an immutable field, a missing adopted resource).
    #[error("planning cloud resources: {error}")]
    CloudPlan { plan: Box<Plan>, error: CloudError },
    /// The cloud plan was made, the node plan could not be (the instances not readable).
    #[error("{error:#}")]
    NodePlan {
        cloud: Box<Plan>,
        error: anyhow::Error,
    },
    /// The cluster's lock could not be taken (held by another command) or released.
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// Why the add-ons part of `update cluster --yes` failed (the hosts are provisioned).
#[derive(Debug, thiserror::Error)]
pub(crate) enum AddonsError {
    /// The API could not be reached, or kube-system's `kubelet-config` / `kube-proxy` could
    /// not be written.
    #[error("{0:#}")]
    NodeConfig(anyhow::Error),
    /// Applying the add-ons (or waiting for their rollouts) failed, after kube-system's node
    /// configuration was written (`node_config`: what the user must still be told of).
    #[error("{error:#}")]
    Addons {
        node_config: Synced,
        error: anyhow::Error,
    },
}

/// What the add-ons part of `update cluster --yes` did.
#[derive(Debug)]
pub(crate) struct AddonsApplied {
    pub node_config: Synced,
    pub addons: AddonReport,
}

/// What reading the inventory again changes in the spec's hosts (by name).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct HostsChange {
    pub added: Vec<Host>,
    pub removed: Vec<Host>,
    /// The same name with another address, roles, user, port, labels, ...: (before, after).
    pub changed: Vec<(Host, Host)>,
}

/// A host's roles as the previews print them (`control-plane,etcd`).
pub(crate) fn roles(h: &Host) -> String {
    h.roles
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

impl HostsChange {
    pub(crate) fn of(before: &[Host], after: &[Host]) -> HostsChange {
        let find = |hosts: &[Host], name: &str| hosts.iter().find(|h| h.name == name).cloned();
        HostsChange {
            added: after
                .iter()
                .filter(|h| find(before, &h.name).is_none())
                .cloned()
                .collect(),
            removed: before
                .iter()
                .filter(|h| find(after, &h.name).is_none())
                .cloned()
                .collect(),
            changed: before
                .iter()
                .filter_map(|b| {
                    find(after, &b.name)
                        .filter(|a| a != b)
                        .map(|a| (b.clone(), a))
                })
                .collect(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }

    /// One line each: the hosts to add, to remove and those that changed.
    pub(crate) fn lines(&self, inventory: &str) -> Vec<String> {
        let list = |hosts: &[Host]| {
            hosts
                .iter()
                .map(|h| format!("{} ({}, {})", h.name, h.address, roles(h)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut out = vec![];
        if self.is_empty() {
            out.push(format!(
                "Inventory {inventory}: the same hosts as the spec (nothing to add or remove)"
            ));
            return out;
        }
        if !self.added.is_empty() {
            out.push(format!(
                "Inventory {inventory}: hosts to add: {}",
                list(&self.added)
            ));
        }
        if !self.removed.is_empty() {
            out.push(format!(
                "Inventory {inventory}: hosts to remove: {}",
                list(&self.removed)
            ));
        }
        for (b, a) in &self.changed {
            out.push(format!(
                "Inventory {inventory}: host {} changes: {} ({}) -> {} ({})",
                b.name,
                b.address,
                roles(b),
                a.address,
                roles(a)
            ));
        }
        out
    }
}

/// `--inventory DIR` read again: the stored user spec with the inventory's hosts (to store at
/// `--yes`, conditional on the version read), and what changes.
#[derive(Debug)]
pub(crate) struct Reread {
    /// The inventory's file, as its problems name it.
    pub file: String,
    pub change: HostsChange,
    /// `kube_version` of the inventory when it differs from the spec's: (its value, where it
    /// is written, the spec's). Only hosts are read from an inventory here.
    pub version_differs: Option<(String, String, String)>,
    user: Cluster,
    version: Version,
    /// `user` resolved (the spec changed: its hosts), with `--bundle`: the cluster this run
    /// provisions.
    resolved: ResolvedCluster,
}

/// Where the update goes, chosen by the platform seam.
enum Side {
    /// The AWS cloud plan, then its instances.
    Aws,
    /// Metal's hosts (those of the inventory read again, if one was given) and the hosts kprov
    /// provisioned that the spec lost.
    Metal {
        targets: Vec<Target>,
        reread: Option<Box<Reread>>,
        gone: Vec<Host>,
    },
    /// `--phase addons`: no machine is read.
    AddonsOnly,
}

/// `update cluster` opened: the cluster as this run sees it, its platform's part read.
pub(crate) struct Update {
    session: Session,
    store: Arc<dyn StateStore>,
    /// Resolved once when the update was opened (with `--bundle` in its completed spec): the
    /// cloud plan, the apply and the nodes take it.
    resolved: ResolvedCluster,
    options: UpdateOptions,
    kind: Kind,
    side: Side,
}

/// Reads cluster `name` from the session's store, resolves it and opens `update cluster` on it
/// ([`open`]).
pub(crate) async fn load(
    session: Session,
    name: &str,
    options: UpdateOptions,
) -> Result<Update, UpdateError> {
    let repo = Repo::new(session.store().clone());
    let resolved = repo
        .get(name)
        .await
        .map_err(anyhow::Error::from)?
        .resolve(&repo.location())
        .map_err(anyhow::Error::from)?;
    open(session, resolved, options).await
}

/// Opens `update cluster` on `resolved` (as the store resolves it): refuses the flags its
/// platform has no use for, and on metal reads the inventory given again, the targets and the
/// hosts to remove.
pub(crate) async fn open(
    session: Session,
    mut resolved: ResolvedCluster,
    options: UpdateOptions,
) -> Result<Update, UpdateError> {
    let store = session.store().clone();
    resolved.completed = bundle_for_run(resolved.completed, options.bundle.as_deref());
    let kind = Kind::of(&resolved.completed);
    if options.inventory.is_some() && kind != Kind::Metal {
        return Err(UpdateError::Flag {
            flag: "inventory",
            message: "an inventory is only for a metal cluster's hosts".into(),
        });
    }
    if options.common.refresh_images && kind != Kind::Aws {
        return Err(UpdateError::Flag {
            flag: "refresh-image",
            message: "images are pinned on AWS only; a metal cluster's hosts are the user's".into(),
        });
    }
    let side = match options.common.phase {
        Some(Phase::Cloud) if kind == Kind::Metal => {
            return Err(UpdateError::Flag {
                flag: "phase",
                message: "a metal cluster has no cloud resources; its phases are nodes and addons"
                    .into(),
            });
        }
        Some(Phase::Addons) => Side::AddonsOnly,
        _ if kind == Kind::Aws => Side::Aws,
        _ => Side::Metal {
            targets: vec![],
            reread: None,
            gone: vec![],
        },
    };
    let mut update = Update {
        session,
        store,
        resolved,
        options,
        kind,
        side,
    };
    if let Side::Metal { .. } = update.side {
        let reread = match &update.options.inventory {
            Some(path) => Some(Box::new(update.read_inventory(path).await?)),
            None => None,
        };
        // The hosts of the inventory read again when one was given.
        let cluster = reread.as_ref().map_or(&update.resolved, |r| &r.resolved);
        let targets = nodes::Inventory {
            hosts: cluster.completed.spec.hosts.clone(),
        }
        .targets()
        .await
        .map_err(anyhow::Error::from)?;
        // Hosts kprov provisioned that the inventory lost stay in the cluster until removed.
        let gone = super::host_records::hosts_to_remove(update.store.as_ref(), cluster).await?;
        update.side = Side::Metal {
            targets,
            reread,
            gone,
        };
    }
    Ok(update)
}

/// `--bundle FILE` of `update` and `rolling-update` as `spec.assets.bundle` for this run.
pub(crate) fn bundle_for_run(mut cluster: Cluster, bundle: Option<&std::path::Path>) -> Cluster {
    if let Some(b) = bundle {
        cluster
            .spec
            .assets
            .get_or_insert_with(Default::default)
            .bundle = Some(b.display().to_string());
    }
    cluster
}

/// The preview of `update cluster`, one shape on every platform (docs/plan-json.md): the
/// cloud plan (empty on metal), the node plan, the hosts to remove and the refusals.
#[derive(Debug, Serialize)]
pub(crate) struct UpdatePlan {
    /// The cloud plan's fields at the top of the document.
    #[serde(flatten)]
    pub cloud: Plan,
    /// The machines' node plan; absent while none runs (AWS before the first `--yes`) and in
    /// `--phase cloud`'s preview, which contacts no instance.
    #[serde(rename = "nodePlan", skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodePlan>,
    /// Metal: hosts kprov provisioned that the spec no longer has (`delete instance` removes
    /// them).
    #[serde(rename = "hostsToRemove")]
    pub hosts_to_remove: Vec<HostToRemove>,
    /// Why some machines will not be provisioned (owned by another cluster).
    pub refusals: Vec<String>,
    /// What the preview shows on this platform (the cloud plan first, or the hosts alone).
    #[serde(skip)]
    pub shape: PlanShape,
    /// Metal: the inventory given again changes the spec's hosts.
    #[serde(skip)]
    pub spec_changes: bool,
    #[serde(skip)]
    prune: bool,
}

/// What an [`UpdatePlan`] is made of, so that its preview shows it without asking the
/// platform: a platform with cloud resources (AWS) plans them first and its instances' nodes
/// after; one without (metal) plans its hosts, the hosts to remove and the inventory's changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlanShape {
    /// The cloud plan, then the running instances' node plan.
    Cloud,
    /// The hosts' node plan (the cloud plan is empty).
    Hosts,
}

impl PlanShape {
    /// The shape of a platform's plan.
    pub(crate) fn of(kind: Kind) -> PlanShape {
        match kind {
            Kind::Aws => PlanShape::Cloud,
            Kind::Metal => PlanShape::Hosts,
        }
    }
}

/// A host kprov provisioned that the spec no longer has.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HostToRemove {
    pub name: String,
    pub address: String,
}

impl UpdatePlan {
    /// Cloud changes that `--yes` would apply (deletions only with `--prune`).
    pub(crate) fn cloud_pending(&self) -> bool {
        self.cloud.exit_code(self.prune) == 2
    }

    /// The targets `--yes` would provision.
    pub(crate) fn nodes_pending(&self) -> Vec<&str> {
        self.nodes
            .as_ref()
            .map(NodePlan::pending)
            .unwrap_or_default() // no node plan (the cloud's preview alone): none pending
    }

    /// Whether `--yes` would change anything, or something waits on the user (hosts to
    /// remove): what `--exit-code` reports as 2.
    pub(crate) fn pending(&self) -> bool {
        self.cloud_pending()
            || !self.nodes_pending().is_empty()
            || !self.hosts_to_remove.is_empty()
            || self.spec_changes
    }
}

/// Progress of `update cluster --yes`.
#[derive(Debug)]
pub(crate) enum UpdateEvent<'a> {
    /// The cloud part (AWS).
    Cloud(&'a AwsEvent<'a>),
    /// Metal: the inventory's hosts were stored in the spec.
    HostsStored(&'a HostsChange),
}

/// Where [`Update::apply`] reports progress; called on the caller's task.
pub(crate) type UpdateEvents<'e> = &'e (dyn Fn(&UpdateEvent<'_>) + Send + Sync);

impl Update {
    /// The cluster as this run sees it (with `--bundle`, and on metal the hosts of the
    /// inventory given again).
    pub(crate) fn cluster(&self) -> &Cluster {
        &self.resolved().completed
    }

    /// [`Update::cluster`]'s resolved model, the one the nodes are rendered from.
    pub(crate) fn resolved(&self) -> &ResolvedCluster {
        match &self.side {
            Side::Metal {
                reread: Some(r), ..
            } => &r.resolved,
            _ => &self.resolved,
        }
    }

    /// The inventory read again (`--inventory`), for the preview and the apply to say.
    pub(crate) fn reread(&self) -> Option<&Reread> {
        match &self.side {
            Side::Metal { reread, .. } => reread.as_deref(),
            _ => None,
        }
    }

    /// Hosts kprov provisioned that the spec lost (metal): the apply leaves them alone.
    pub(crate) fn hosts_to_remove(&self) -> &[Host] {
        match &self.side {
            Side::Metal { gone, .. } => gone,
            _ => &[],
        }
    }

    /// How this platform calls its machines in sentences (`host`, `instance`).
    pub(crate) fn machine(&self) -> &'static str {
        self.kind.machine()
    }

    /// The machines the apply provisions when they are known before it (metal's hosts); AWS
    /// finds its instances during the apply.
    pub(crate) fn known_targets(&self) -> Option<&[Target]> {
        match &self.side {
            Side::Metal { targets, .. } => Some(targets),
            _ => None,
        }
    }

    async fn read_inventory(&self, path: &std::path::Path) -> anyhow::Result<Reread> {
        // Refused with every problem at once, like `create cluster --inventory`.
        let inv = crate::inventory::import(path)?;
        let repo = Repo::new(self.store.clone());
        let name = self.resolved.name.as_str();
        let stored = repo.get(name).await?;
        let mut user = stored.cluster.value.clone();
        let hosts = inv.plain_hosts();
        let change = HostsChange::of(&user.spec.hosts, &hosts);
        user.spec.hosts = hosts;
        // The spec changed (its hosts): resolved anew, once, for this run.
        let mut resolved = crate::spec::resolve_located(
            &user,
            &stored.group_values(),
            None,
            &std::collections::HashMap::new(),
            &inv.file,
        )?;
        let version_differs = inv
            .settings
            .kubernetes_version
            .as_ref()
            .and_then(|(v, at)| {
                // Both without a leading `v` (the inventory's reader strips it).
                let spec = resolved.version.to_string();
                (spec != *v).then(|| (v.clone(), at.to_string(), spec))
            });
        resolved.completed = bundle_for_run(resolved.completed, self.options.bundle.as_deref());
        Ok(Reread {
            file: inv.file,
            change,
            version_differs,
            user,
            version: stored.version,
            resolved,
        })
    }

    fn node_options(&self) -> NodeOptions {
        NodeOptions {
            accept_new_host_keys: self.options.common.accept_new_host_keys,
            concurrency: self.options.common.concurrency,
            cloud_api: None,
        }
    }

    /// The preview, read-only: on AWS the cloud plan and (unless `--phase cloud`) the node plan
    /// of the running instances; on metal the node plan of the hosts. Machines another cluster
    /// owns are refused in it on every platform.
    pub(crate) async fn plan(&self) -> Result<UpdatePlan, UpdateError> {
        let name = self.cluster().name();
        let mut plan = UpdatePlan {
            cloud: empty_cloud_plan(name),
            nodes: None,
            hosts_to_remove: self
                .hosts_to_remove()
                .iter()
                .map(|h| HostToRemove {
                    name: h.name.clone(),
                    address: h.address.clone(),
                })
                .collect(),
            refusals: vec![],
            shape: PlanShape::of(self.kind),
            spec_changes: self.reread().is_some_and(|r| !r.change.is_empty()),
            prune: self.options.common.prune,
        };
        match &self.side {
            Side::AddonsOnly => {}
            Side::Aws => {
                let (cloud, cloud_plan) = ops_aws::plan_refreshing(
                    &self.store,
                    &self.resolved,
                    self.options.common.refresh_images,
                )
                .await?;
                if let Err(error) = cloud_plan.check() {
                    return Err(UpdateError::CloudPlan {
                        plan: Box::new(cloud_plan),
                        error,
                    });
                }
                if self.options.common.phase != Some(Phase::Cloud) {
                    // The cloud phase contacts no instance: its preview is the cloud plan.
                    plan.nodes = match ops_aws::node_plan(
                        &self.store,
                        &cloud,
                        &self.resolved,
                        &cloud_plan,
                        &self.options.common,
                    )
                    .await
                    {
                        Ok(n) => n,
                        Err(error) => {
                            return Err(UpdateError::NodePlan {
                                cloud: Box::new(cloud_plan),
                                error,
                            });
                        }
                    };
                }
                plan.cloud = cloud_plan;
            }
            Side::Metal { targets, .. } => {
                plan.nodes = Some(
                    ops_nodes::plan(
                        self.store.clone(),
                        self.resolved(),
                        targets,
                        &self.node_options(),
                    )
                    .await?,
                );
            }
        }
        if let Some(refusal) = plan
            .nodes
            .as_ref()
            .and_then(|n| super::platform::owned_elsewhere(name, n, self.machine()))
        {
            plan.refusals.push(refusal);
        }
        Ok(plan)
    }

    /// `--yes`: takes the cluster's lock (released whatever happens), then on metal stores the
    /// inventory's hosts (conditional on the spec read at [`open`]: a concurrent edit is a
    /// conflict, never overwritten), then applies: on AWS the cloud plan made again and applied,
    /// its instances waited for; the machines converged. The store write is never raced
    /// against a signal: cut between the spec and its completed copy it would leave the two
    /// apart, so a signal that comes during it takes effect right after it. The first signal
    /// (`ints`) cuts the apply where it waits: `Ok(Err(caught))`, every part of it safe to run
    /// again. `node_events` makes the node progress sink once the targets are known. The
    /// add-ons are [`Update::addons`].
    pub(crate) async fn apply(
        &self,
        ints: &Interrupts,
        events: UpdateEvents<'_>,
        node_events: impl FnOnce(&[Target]) -> Events,
    ) -> Result<Result<UpdateReport, Caught>, UpdateError> {
        let name = self.cluster().name();
        self.session
            .with_lock(name, "update cluster --yes", async |guard| {
                // A signal that came while the lock was taken: nothing is written.
                if let Some(caught) = ints.caught() {
                    return Ok(Err(caught));
                }
                self.store_hosts(events).await?;
                ints.or_try(self.apply_locked(guard, events, node_events))
                    .await
            })
            .await
    }

    /// Metal: the inventory's hosts, read again, stored in the spec (and its completed copy).
    async fn store_hosts(&self, events: UpdateEvents<'_>) -> Result<(), UpdateError> {
        let Some(r) = self.reread().filter(|r| !r.change.is_empty()) else {
            return Ok(());
        };
        let repo = Repo::new(self.store.clone());
        repo.put_cluster(&r.user, &r.version)
            .await
            .map_err(anyhow::Error::from)?;
        repo.write_completed(&r.user, &self.resolved.completed_groups)
            .await
            .map_err(anyhow::Error::from)?;
        events(&UpdateEvent::HostsStored(&r.change));
        Ok(())
    }

    /// The apply under the lock `guard`: planned again here (the cloud, then the machines),
    /// applied, the nodes converged.
    async fn apply_locked(
        &self,
        guard: &lock::LockGuard,
        events: UpdateEvents<'_>,
        node_events: impl FnOnce(&[Target]) -> Events,
    ) -> Result<UpdateReport, UpdateError> {
        match &self.side {
            Side::AddonsOnly => Err(UpdateError::Other(anyhow::anyhow!(
                "--phase addons deploys the add-ons only; it has no machines to apply"
            ))),
            Side::Aws => {
                let cloud_events = |e: &AwsEvent<'_>| events(&UpdateEvent::Cloud(e));
                Ok(ops_aws::apply(
                    &self.store,
                    &self.resolved,
                    guard,
                    &self.options.common,
                    &cloud_events,
                    node_events,
                )
                .await?)
            }
            Side::Metal { targets, .. } => {
                let node_events = node_events(targets);
                let report = ops_nodes::converge(
                    self.store.clone(),
                    self.resolved(),
                    targets,
                    guard,
                    &self.node_options(),
                    &node_events,
                )
                .await?;
                Ok(UpdateReport::Nodes(Box::new(report)))
            }
        }
    }

    /// Whether this run is `--phase addons`: no machine is read or changed, only the add-ons
    /// ([`Update::addons`], or their preview).
    pub(crate) fn addons_only(&self) -> bool {
        matches!(self.side, Side::AddonsOnly)
    }

    /// The last part of a whole `update --yes` (and `--phase addons --yes`): kube-system's node
    /// configuration from the spec, then the add-ons, through one API client (`kubeconfig`,
    /// else the stored admin credentials).
    pub(crate) async fn addons(
        &self,
        kubeconfig: Option<&std::path::Path>,
    ) -> Result<AddonsApplied, AddonsError> {
        let cluster = self.resolved();
        let settings = crate::provision::render::NodeSettings::of(&cluster.completed.spec)
            .map_err(|e| AddonsError::NodeConfig(anyhow::Error::from(e)))?;
        let (kube, guard) =
            super::credentials::kube_client(&self.store, &cluster.completed, kubeconfig, false)
                .await
                .map_err(AddonsError::NodeConfig)?;
        let node_config = super::node_config::sync(&kube, &settings)
            .await
            .map_err(|e| AddonsError::NodeConfig(anyhow::Error::msg(e)))?;
        let options = AddonOptions {
            apply: true,
            kubeconfig: kubeconfig.map(std::path::Path::to_path_buf),
            force_conflicts: false,
            wait: ADDONS_WAIT,
            ssh_tunnel: false,
        };
        let route = guard.route().map(str::to_string);
        let addons = match super::addons::deploy_with(&kube, route, cluster, &options).await {
            Ok(addons) => addons,
            Err(error) => return Err(AddonsError::Addons { node_config, error }),
        };
        drop(guard);
        Ok(AddonsApplied {
            node_config,
            addons,
        })
    }
}

/// How long `update cluster --yes` waits for the add-ons' rollouts.
pub(crate) const ADDONS_WAIT: Duration = Duration::from_secs(300);

/// Metal's cloud part of the one plan document: no change.
fn empty_cloud_plan(cluster: &str) -> Plan {
    Plan {
        schema_version: crate::cloud::engine::PLAN_SCHEMA_VERSION,
        cluster: cluster.to_string(),
        changes: vec![],
        summary: Summary::default(),
        warnings: vec![],
        errors: vec![],
        desired: Default::default(),
        actual: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::testing::HookedStore;

    async fn assert_unlocked(store: &dyn StateStore, name: &str) {
        let held = lock::read(store, name).await.expect("lock");
        assert!(held.is_none(), "the lock is released: {held:?}");
    }

    fn host(name: &str, address: &str) -> Host {
        serde_json::from_value(serde_json::json!({
            "name": name, "address": address, "roles": ["node"]
        }))
        .expect("host")
    }

    fn inventory(dir: &std::path::Path, file: &str, hosts: &[(&str, &str, &str)]) -> PathBuf {
        let mut text = String::from("hosts:\n");
        for (name, address, role) in hosts {
            text.push_str(&format!(
                "  - name: {name}\n    address: {address}\n    user: root\n    roles: [{role}]\n"
            ));
        }
        let path = dir.join(file);
        std::fs::write(&path, text).expect("inventory");
        path
    }

    /// A signal during the store write of `--inventory ... --yes` never cuts it: the spec and
    /// its completed copy both hold the inventory's hosts, the run still ends with the signal
    /// (nothing converged) and the lock is released.
    #[tokio::test]
    async fn a_signal_during_the_host_store_write_takes_effect_after_it() {
        use crate::ops::interrupt::Caught;
        use crate::spec::CloudProvider;
        let dir = tempfile::tempdir().expect("tmp");
        let name = "write.metal.example.com";
        let first = inventory(
            dir.path(),
            "first.yaml",
            &[("cp1", "198.18.250.1", "control-plane")],
        );
        let mut inv = crate::inventory::import(&first).expect("inventory");
        let mut request = crate::ops::create::ClusterRequest::defaults(name, CloudProvider::Metal);
        request.node_count = 0;
        request.inventory = Some(first.clone());
        let (cluster, groups, _) =
            crate::ops::create::inventory_objects(&request, &mut inv, None).expect("objects");
        let keys = crate::state::layout::ClusterKeys::new(name).expect("keys");
        let store = Arc::new(
            HookedStore::new(
                crate::state::file::FileStore::new(dir.path().join("store")).expect("store"),
            )
            .slow_key(keys.config(), Duration::from_millis(400)),
        );
        let repo = Repo::new(store.clone());
        repo.create(&cluster, &groups).await.expect("create");
        // The creation's write left a permit: taken here, so the signal below comes during
        // the update's write and not before it.
        let _ = tokio::time::timeout(Duration::from_millis(50), store.started().notified()).await;
        let resolved = repo
            .get(name)
            .await
            .expect("get")
            .resolve(&repo.location())
            .expect("resolve");
        let second = inventory(
            dir.path(),
            "second.yaml",
            &[
                ("cp1", "198.18.250.1", "control-plane"),
                ("w1", "198.18.250.2", "node"),
            ],
        );
        let options = UpdateOptions {
            inventory: Some(second),
            ..Default::default()
        };
        let update = open(Session::new(store.clone()), resolved, options)
            .await
            .expect("open");
        assert_eq!(update.reread().expect("reread").change.added.len(), 1);

        let (tx, ints) = Interrupts::manual();
        let signal = async {
            store.started().notified().await;
            tx.send(Some(Caught::Interrupt)).expect("send");
        };
        let stored = std::sync::Mutex::new(false);
        let events = |e: &UpdateEvent<'_>| {
            if let UpdateEvent::HostsStored(_) = e {
                *stored.lock().unwrap() = true;
            }
        };
        let mut converged = false;
        let (outcome, ()) = tokio::join!(
            update.apply(&ints, &events, |_| {
                converged = true;
                ops_nodes::no_events()
            }),
            signal
        );
        assert!(matches!(outcome, Ok(Err(Caught::Interrupt))), "{outcome:?}");
        assert!(
            !converged,
            "the signal came before the hosts were worked on"
        );
        assert!(*stored.lock().unwrap(), "the write was said");
        let hosts = |c: &Cluster| {
            c.spec
                .hosts
                .iter()
                .map(|h| h.name.clone())
                .collect::<Vec<_>>()
        };
        let stored = repo.get(name).await.expect("get");
        assert_eq!(hosts(&stored.cluster.value), ["cp1", "w1"]);
        let resolved = stored.resolve(&repo.location()).expect("resolve");
        assert_eq!(hosts(&resolved.completed), ["cp1", "w1"]);
        let completed = store
            .get(&keys.completed_spec())
            .await
            .expect("read")
            .expect("completed spec");
        let completed = String::from_utf8_lossy(&completed.data);
        assert!(completed.contains("198.18.250.2"), "{completed}");
        assert_unlocked(store.as_ref(), name).await;

        // A signal caught before the lock was held (it is still caught): nothing is written.
        let said = std::sync::Mutex::new(false);
        let events = |e: &UpdateEvent<'_>| {
            if let UpdateEvent::HostsStored(_) = e {
                *said.lock().unwrap() = true;
            }
        };
        let outcome = update
            .apply(&ints, &events, |_| ops_nodes::no_events())
            .await;
        assert!(matches!(outcome, Ok(Err(Caught::Interrupt))), "{outcome:?}");
        assert!(!*said.lock().unwrap(), "hosts written after the signal");
        assert_unlocked(store.as_ref(), name).await;
    }

    #[test]
    fn an_inventory_read_again_says_what_it_adds_removes_and_changes() {
        let before = [host("a", "198.18.0.1"), host("b", "198.18.0.2")];
        let after = [host("b", "198.18.0.9"), host("c", "198.18.0.3")];
        let change = HostsChange::of(&before, &after);
        assert_eq!(
            change.lines("inv.yaml"),
            [
                "Inventory inv.yaml: hosts to add: c (198.18.0.3, node)",
                "Inventory inv.yaml: hosts to remove: a (198.18.0.1, node)",
                "Inventory inv.yaml: host b changes: 198.18.0.2 (node) -> 198.18.0.9 (node)",
            ]
        );
        assert!(HostsChange::of(&before, &before).is_empty());
    }

    /// The preview's shape follows the platform: AWS plans its cloud resources, then its
    /// instances' nodes; metal plans its hosts.
    #[test]
    fn the_plan_shape_follows_the_platform() {
        assert_eq!(PlanShape::of(Kind::Aws), PlanShape::Cloud);
        assert_eq!(PlanShape::of(Kind::Metal), PlanShape::Hosts);
    }

    #[test]
    fn a_metal_plan_has_the_cloud_plans_fields_and_no_change() {
        let plan = UpdatePlan {
            cloud: empty_cloud_plan("demo"),
            nodes: None,
            hosts_to_remove: vec![HostToRemove {
                name: "h9".into(),
                address: "198.18.0.9".into(),
            }],
            refusals: vec![],
            shape: PlanShape::Hosts,
            spec_changes: false,
            prune: false,
        };
        let doc = serde_json::to_value(&plan).expect("json");
        assert_eq!(doc["schemaVersion"], 2);
        assert_eq!(doc["cluster"], "demo");
        assert_eq!(doc["changes"], serde_json::json!([]));
        assert_eq!(doc["hostsToRemove"][0]["name"], "h9");
        assert_eq!(doc["refusals"], serde_json::json!([]));
        assert!(doc.get("nodePlan").is_none());
        assert!(plan.pending(), "a host to remove waits on the user");
        assert!(!plan.cloud_pending());
    }
}
