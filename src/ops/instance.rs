//! `delete instance`: taking one node out of a cluster, as Kubespray's `remove-node.yml` and
//! kops's `delete instance` do. [`plan`] observes (read-only) what removing a node means;
//! [`remove`] does it under the caller's cluster lock:
//!
//! 1. cordon and drain the node ([`Kube::drain`]: PodDisruptionBudgets respected, bounded);
//! 2. for a host running etcd, remove its member through another etcd host first (etcdctl in
//!    that host's etcd container, with the etcd static pod's certificates, as `kubeadm reset`
//!    removes a member), refusing when the members left would not have quorum;
//! 3. reset the host with the `delete cluster` reset (only a host carrying this cluster's
//!    ownership marker; the script checks it again on the host);
//! 4. delete the Node object;
//! 5. remove the host from the stored spec and forget kprov's record of it, so neither
//!    `update cluster` re-joins it nor its preview lists it as "to remove".
//!
//! Every step is safe to run again: an interrupted removal is finished by re-running it.
//!
//! kprov's record of provisioned hosts (`<cluster>/hosts/<name>`, written by
//! `ops::nodes::converge` for every host that converged) is what lets `update cluster` say
//! that a host removed from the inventory is still in the cluster, and what lets this command
//! reach such a host (its SSH details are in the record). It is kprov's own record and needs
//! no API server, so the metal preview stays offline.
//!
//! On AWS ([`plan_aws`], [`remove_aws`]) the node is drained, its instance terminated through
//! its Auto Scaling group (which launches a replacement, or with `--decrement-desired-capacity`
//! shrinks), and its Node object deleted.
//!
//! Caveats: on AWS only worker instances are removed (a control plane's etcd member is not
//! removed there yet: refused with that reason). The
//! etcd membership is read with `crictl exec` into the running `etcd` container of another
//! etcd host: a host whose etcd does not run as a container (e.g. installed from packages) is
//! not supported. The preview reads the member list too; it writes the answer to a file under
//! /run/kprov on that host and removes it again.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use serde::Serialize;

use crate::cloud::aws::AwsCloud;
use crate::cloud::aws::GroupCapacity;
use crate::cloud::aws::instances::AwsInstances;
use crate::kube::{Disposition, DrainEvent, DrainOptions, DrainReport, Kube, NodeInfo};
use crate::nodes::{self, Target, TargetSource};
use crate::provision::orchestrate::{self, HostResult, Options};
use crate::repo::{Repo, resolve_with_docs};
use crate::spec::{Cluster, EtcdType, Host, HostRole, ResolvedCluster};
use crate::ssh::task::HostExecutor;
use crate::ssh::{NoProgress, SshFleet, SshOptions};
use crate::state::{StateStore, lock};

use super::etcd_members::{
    EtcdMember, etcd_members, member_of, removal_keeps_quorum, remove_member,
};
use super::host_records::{forget_provisioned, provisioned_hosts};

/// What happens to etcd when the node goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum EtcdPlan {
    /// The host runs no etcd member.
    NoEtcd,
    /// The host should run etcd, but the member list has no member for it (already removed).
    NotAMember {
        /// The other etcd host whose member list was read.
        via: String,
        /// That member list, none of them the host's.
        members: Vec<EtcdMember>,
    },
    /// Its member is removed through `via` before the host is reset.
    Remove {
        /// The host's own member, the one removed.
        member: EtcdMember,
        /// The other etcd host the removal runs on (the first whose member list could be read).
        via: String,
        /// The member list read on `via`, the host's member included.
        members: Vec<EtcdMember>,
    },
}

/// What removing a node means, observed read-only.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RemovalPlan {
    pub(crate) cluster: String,
    pub(crate) node: String,
    pub(crate) host: Host,
    /// In the stored spec (otherwise only in kprov's record of provisioned hosts).
    pub(crate) in_spec: bool,
    /// Why the host stays in the spec after the removal (the spec without it would be
    /// invalid, e.g. an even number of stacked control planes): `update cluster --yes` then
    /// provisions it again, which is how a control plane is replaced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) stays_in_spec: Option<String>,
    /// The Node object, when the API server has one.
    pub(crate) node_object: Option<NodeInfo>,
    /// `namespace/name` of each pod on the node and what the drain does with it.
    #[serde(skip)]
    pub(crate) pods: Vec<(String, Disposition)>,
    pub(crate) etcd: EtcdPlan,
    /// Why the removal may not go ahead (quorum, last control plane, pods that would be lost).
    pub(crate) refusals: Vec<String>,
}

/// Progress of a removal, for the CLI to render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoveEvent {
    /// A step begins, as a sentence (`draining NODE`, `resetting host NODE`).
    Step(String),
    /// The drain's own progress (evictions, waits).
    Drain(DrainEvent),
    /// Something left undone that does not stop the removal (no Node object to drain, the
    /// host staying in the spec).
    Warning(String),
}

/// Where [`remove`] and [`remove_aws`] send their [`RemoveEvent`]s, as they happen.
pub type RemoveEvents = Arc<dyn Fn(&RemoveEvent) + Send + Sync>;

/// What [`remove`] did.
#[derive(Debug, Clone)]
pub struct RemoveReport {
    pub(crate) drain: Option<DrainReport>,
    pub(crate) etcd_member_removed: Option<EtcdMember>,
    /// `false` when the host carried no marker of this cluster (e.g. already reset).
    pub(crate) host_reset: bool,
    pub(crate) node_deleted: bool,
    pub(crate) removed_from_spec: bool,
}

/// Whether a host runs an etcd member in this cluster.
pub(crate) fn runs_etcd(cluster: &ResolvedCluster, host: &Host) -> bool {
    let external = cluster.etcd == EtcdType::External;
    host.roles.contains(&HostRole::Etcd)
        || (!external && host.roles.contains(&HostRole::ControlPlane))
}

fn fleet(
    cluster: &ResolvedCluster,
    hosts: Vec<Host>,
    store: Arc<dyn StateStore>,
) -> anyhow::Result<SshFleet> {
    SshFleet::new(
        &cluster.name,
        hosts,
        store,
        SshOptions::default(),
        Arc::new(NoProgress),
    )
    .context("preparing ssh connections")
}

/// The cluster's hosts plus the recorded one being removed (if the spec lost it already).
fn fleet_hosts(cluster: &ResolvedCluster, host: &Host) -> Vec<Host> {
    let mut hosts = cluster.completed.spec.hosts.clone();
    if !hosts.iter().any(|h| h.name == host.name) {
        hosts.push(host.clone());
    }
    hosts
}

/// The spec without `node`, checked: a removal that would leave an invalid spec is refused
/// before anything changes.
async fn spec_without(repo: &Repo, cluster: &str, node: &str) -> anyhow::Result<Option<Cluster>> {
    let stored = repo.get(cluster).await?;
    let mut c = stored.cluster.value.clone();
    let before = c.spec.hosts.len();
    c.spec.hosts.retain(|h| h.name != node);
    if c.spec.hosts.len() == before {
        return Ok(None);
    }
    resolve_with_docs(
        &c,
        &stored.group_values(),
        None,
        &HashMap::new(),
        &repo.location(),
    )
    .map_err(|e| anyhow!("the spec of {cluster} without {node} would be invalid: {e}"))?;
    Ok(Some(c))
}

async fn etcd_plan(
    exec: &dyn HostExecutor,
    cluster: &ResolvedCluster,
    host: &Host,
) -> anyhow::Result<EtcdPlan> {
    if !runs_etcd(cluster, host) {
        return Ok(EtcdPlan::NoEtcd);
    }
    let others: Vec<&Host> = cluster
        .completed
        .spec
        .hosts
        .iter()
        .filter(|h| h.name != host.name && runs_etcd(cluster, h))
        .collect();
    if others.is_empty() {
        bail!(
            "{} runs the last etcd member of {}: removing it would destroy the cluster's data",
            host.name,
            &cluster.name
        );
    }
    let mut failures = Vec::new();
    for via in others {
        match etcd_members(exec, &via.name).await {
            Ok(members) => {
                return Ok(match member_of(&members, host) {
                    Some(m) => EtcdPlan::Remove {
                        member: m.clone(),
                        via: via.name.clone(),
                        members,
                    },
                    None => EtcdPlan::NotAMember {
                        via: via.name.clone(),
                        members,
                    },
                });
            }
            Err(e) => failures.push(format!("{}: {e:#}", via.name)),
        }
    }
    bail!(
        "could not read the etcd members of {} from any other etcd host: {}",
        &cluster.name,
        failures.join("; ")
    )
}

/// Observes what removing `node` means: its host, Node object, pods, etcd member, and why it
/// would be refused. Read-only, apart from the etcdctl answer file on another etcd host.
pub(crate) async fn plan(
    store: Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    kube: &Kube,
    node: &str,
    drain: &DrainOptions,
) -> anyhow::Result<RemovalPlan> {
    let name = cluster.name.as_str();
    let in_spec = cluster
        .completed
        .spec
        .hosts
        .iter()
        .find(|h| h.name == node)
        .cloned();
    let host = match &in_spec {
        Some(h) => h.clone(),
        None => provisioned_hosts(store.as_ref(), name)
            .await?
            .remove(node)
            .ok_or_else(|| {
                anyhow!(
                    "{name} has no host {node} (hosts: {})",
                    cluster
                        .completed
                        .spec
                        .hosts
                        .iter()
                        .map(|h| h.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?,
    };
    let mut refusals = Vec::new();
    if host.roles.contains(&HostRole::ControlPlane)
        && !cluster
            .completed
            .spec
            .hosts
            .iter()
            .any(|h| h.name != node && h.roles.contains(&HostRole::ControlPlane))
    {
        refusals.push(format!(
            "{node} is the last control plane of {name}: removing it would stop the cluster \
             (use `kprov delete cluster {name}` to remove the whole cluster)"
        ));
    }
    let repo = Repo::new(store.clone());
    let stays_in_spec = match spec_without(&repo, name, node).await {
        Ok(_) => None,
        Err(e) => Some(format!("{e:#}")),
    };
    let node_object = kube
        .list_nodes()
        .await?
        .into_iter()
        .find(|n| n.name == node);
    let pods = match &node_object {
        Some(_) => kube.drain_preview(node, drain).await?,
        None => Vec::new(),
    };
    refusals.extend(refused_pods(node, &pods));
    let etcd = if refusals.iter().any(|r| r.contains("last control plane")) {
        EtcdPlan::NoEtcd
    } else {
        let fleet = fleet(cluster, fleet_hosts(cluster, &host), store.clone())?;
        let etcd = etcd_plan(&fleet, cluster, &host).await;
        fleet.close().await;
        match etcd {
            Ok(e) => e,
            Err(e) => {
                refusals.push(format!("{e:#}"));
                EtcdPlan::NoEtcd
            }
        }
    };
    if let EtcdPlan::Remove {
        member, members, ..
    } = &etcd
        && let Err(why) = removal_keeps_quorum(members, member.id)
    {
        refusals.push(format!("etcd member {} of {node}: {why}", member.name));
    }
    Ok(RemovalPlan {
        cluster: name.to_string(),
        node: node.to_string(),
        host,
        in_spec: in_spec.is_some(),
        stays_in_spec,
        node_object,
        pods,
        etcd,
        refusals,
    })
}

/// Removes `node` (see the module docs) under `guard`, the cluster lock the caller holds.
/// The plan is made again under the lock; any refusal stops before anything changes. A drain
/// that fails leaves the node cordoned and everything else as it was.
pub(crate) async fn remove(
    store: Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    kube: &Kube,
    node: &str,
    guard: &lock::LockGuard,
    drain: &DrainOptions,
    events: &RemoveEvents,
) -> anyhow::Result<RemoveReport> {
    guard.check()?;
    let name = cluster.name.as_str();
    let plan = plan(store.clone(), cluster, kube, node, drain).await?;
    if !plan.refusals.is_empty() {
        bail!(
            "refusing to remove {node} from {name}: {}",
            plan.refusals.join("; ")
        );
    }
    let mut report = RemoveReport {
        drain: None,
        etcd_member_removed: None,
        host_reset: false,
        node_deleted: false,
        removed_from_spec: false,
    };
    if plan.node_object.is_some() {
        events(&RemoveEvent::Step(format!("draining {node}")));
        let sink = {
            let events = events.clone();
            move |e: &DrainEvent| events(&RemoveEvent::Drain(e.clone()))
        };
        let drained = kube.drain(node, drain, &sink).await.with_context(|| {
            format!(
                "{node} was not removed: nothing else was changed; fix the cause and re-run, or \
                 `kubectl uncordon {node}` to give up"
            )
        })?;
        report.drain = Some(drained);
    } else {
        events(&RemoveEvent::Warning(format!(
            "{node} has no Node object in the API: nothing to drain"
        )));
    }
    guard.check()?;
    let fleet = fleet(cluster, fleet_hosts(cluster, &plan.host), store.clone())?;
    let result = async {
        if let EtcdPlan::Remove { member, via, .. } = &plan.etcd {
            events(&RemoveEvent::Step(format!(
                "removing etcd member {} ({}) through {via}",
                member.name,
                member.hex_id()
            )));
            remove_member(&fleet, via, member)
                .await
                .with_context(|| format!("removing the etcd member of {node}"))?;
            report.etcd_member_removed = Some(member.clone());
        }
        guard.check()?;
        events(&RemoveEvent::Step(format!("resetting host {node}")));
        let owner = nodes::owner::read(store.as_ref(), name)
            .await?
            .ok_or_else(|| {
                anyhow!("{name} never claimed a host (no cluster UID in the state store)")
            })?;
        let targets: Vec<Target> = fleet_hosts(cluster, &plan.host)
            .into_iter()
            .map(Target::from_host)
            .collect();
        let reset = orchestrate::reset_only(
            &fleet,
            cluster,
            &targets,
            &[node],
            &owner,
            &Options::current(),
        )
        .await
        .context("resetting the host")?;
        for h in &reset.hosts {
            match &h.result {
                HostResult::Ok => report.host_reset = true,
                HostResult::Skipped { reason } | HostResult::PendingRoll { reason } => {
                    events(&RemoveEvent::Warning(format!("{}: {reason}", h.host)))
                }
                HostResult::Failed { error, .. } => bail!(
                    "{node}: the host could not be reset ({error}); the Node object and the \
                     spec are kept, re-run to finish"
                ),
            }
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    fleet.close().await;
    result?;
    guard.check()?;
    events(&RemoveEvent::Step(format!("deleting Node {node}")));
    kube.delete_node(node).await?;
    report.node_deleted = true;
    let repo = Repo::new(store.clone());
    match spec_without(&repo, name, node).await {
        Ok(Some(without)) => {
            let stored = repo.get(name).await?;
            repo.put_cluster(&without, &stored.version).await?;
            repo.write_completed(&without, &stored.group_values())
                .await?;
            report.removed_from_spec = true;
        }
        Ok(None) => {}
        Err(e) => events(&RemoveEvent::Warning(format!(
            "{node} stays in the spec ({e:#}): `kprov update cluster {name} --yes` provisions \
             it again (that replaces it); to shrink the cluster, change the spec first"
        ))),
    }
    forget_provisioned(store.as_ref(), name, node).await?;
    Ok(report)
}

/// What removing an AWS instance means, observed read-only.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AwsRemovalPlan {
    /// The cluster's name, as the cloud's ownership tags carry it.
    pub cluster: String,
    /// The Node name (the instance's private DNS name).
    pub node: String,
    /// The EC2 instance ID (`i-...`) that is terminated.
    pub instance_id: String,
    /// The instance group the instance belongs to.
    pub instance_group: String,
    /// That group's Auto Scaling group, `GROUP.CLUSTER`.
    pub auto_scaling_group: String,
    /// The Auto Scaling group's size when planned (`--decrement-desired-capacity` is refused
    /// below its minimum).
    pub capacity: GroupCapacity,
    /// Shrink the group instead of letting it launch a replacement.
    pub decrement: bool,
    /// The instance is a control plane: the plan then refuses (its etcd member is not
    /// removed on AWS yet).
    pub control_plane: bool,
    /// The Node object, when the API has one (`None` under `--cloudonly` too).
    pub node_object: Option<NodeInfo>,
    /// `namespace/name` of each pod on the node and what the drain does with it.
    #[serde(skip)]
    pub pods: Vec<(String, Disposition)>,
    /// Why the removal may not go ahead (a control plane, the group's minimum, pods that
    /// would be lost); empty: `--yes` removes it.
    pub refusals: Vec<String>,
    /// `--cloudonly`: the cluster's API is not asked (it may be down): no drain, the Node
    /// object is left to the cloud-controller-manager.
    pub cloud_only: bool,
}

fn refused_pods(node: &str, pods: &[(String, Disposition)]) -> Option<String> {
    let lost: Vec<String> = pods
        .iter()
        .filter_map(|(p, d)| match d {
            Disposition::Refuse(why) => Some(format!("{p} ({})", why.join("; "))),
            _ => None,
        })
        .collect();
    (!lost.is_empty())
        .then(|| format!("draining {node} would lose these pods: {}", lost.join("; ")))
}

/// Finds `node` (a Node name or an instance ID) among the cluster's instances and says what
/// removing it means. Read-only. Without `kube` (`--cloudonly`) the cloud alone is asked: an
/// instance that does not answer, or a cluster whose API is down, can still be removed.
pub async fn plan_aws(
    cloud: &AwsCloud,
    instances: &AwsInstances,
    kube: Option<&Kube>,
    node: &str,
    drain: &DrainOptions,
    decrement: bool,
) -> anyhow::Result<AwsRemovalPlan> {
    let name = cloud.cluster();
    let found = instances.discover().await?;
    let target = found
        .targets
        .iter()
        .find(|t| t.node_name == node || t.name() == node)
        .ok_or_else(|| {
            anyhow!(
                "{name} has no running instance {node} (nodes: {})",
                found
                    .targets
                    .iter()
                    .map(|t| format!("{} ({})", t.node_name, t.name()))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
    let group = target
        .group
        .clone()
        .ok_or_else(|| anyhow!("instance {} has no instance group", target.name()))?;
    let asg = format!("{group}.{name}");
    let capacity = cloud.group_capacity(&asg).await?;
    let node_name = target.node_name.clone();
    let mut refusals = Vec::new();
    let control_plane = target.is_control_plane();
    if control_plane {
        refusals.push(format!(
            "{node_name} is a control plane: removing its etcd member is not automated on AWS \
             yet, so kprov does not terminate it"
        ));
    }
    if decrement && capacity.desired - 1 < capacity.min {
        refusals.push(format!(
            "--decrement-desired-capacity would take {asg} below its minimum size {} (desired \
             {}); lower the instance group's minSize first",
            capacity.min, capacity.desired
        ));
    }
    let node_object = match kube {
        Some(kube) => kube
            .list_nodes()
            .await?
            .into_iter()
            .find(|n| n.name == node_name),
        None => None,
    };
    let pods = match (&node_object, kube) {
        (Some(_), Some(kube)) => kube.drain_preview(&node_name, drain).await?,
        _ => Vec::new(),
    };
    refusals.extend(refused_pods(&node_name, &pods));
    Ok(AwsRemovalPlan {
        cluster: name.to_string(),
        node: node_name,
        instance_id: target.name().to_string(),
        instance_group: group,
        auto_scaling_group: asg,
        capacity,
        decrement,
        control_plane,
        node_object,
        pods,
        refusals,
        cloud_only: kube.is_none(),
    })
}

/// Drains `node`, terminates its instance through its Auto Scaling group and deletes the Node
/// object, under `guard`. A failed drain leaves the node cordoned and the instance running.
#[allow(clippy::too_many_arguments)]
pub async fn remove_aws(
    cloud: &AwsCloud,
    instances: &AwsInstances,
    kube: Option<&Kube>,
    node: &str,
    guard: &lock::LockGuard,
    drain: &DrainOptions,
    decrement: bool,
    events: &RemoveEvents,
) -> anyhow::Result<(AwsRemovalPlan, Option<DrainReport>)> {
    guard.check()?;
    let plan = plan_aws(cloud, instances, kube, node, drain, decrement).await?;
    if !plan.refusals.is_empty() {
        bail!(
            "refusing to remove {node} from {}: {}",
            plan.cluster,
            plan.refusals.join("; ")
        );
    }
    let node = plan.node.clone();
    let mut drained = None;
    if let (Some(_), Some(kube)) = (&plan.node_object, kube) {
        events(&RemoveEvent::Step(format!("draining {node}")));
        let sink = {
            let events = events.clone();
            move |e: &DrainEvent| events(&RemoveEvent::Drain(e.clone()))
        };
        drained = Some(kube.drain(&node, drain, &sink).await.with_context(|| {
            format!(
                "{node} was not removed: its instance {} still runs; fix the cause and re-run, \
                 or `kubectl uncordon {node}` to give up",
                plan.instance_id
            )
        })?);
    } else if kube.is_some() {
        events(&RemoveEvent::Warning(format!(
            "{node} has no Node object in the API: nothing to drain"
        )));
    }
    guard.check()?;
    events(&RemoveEvent::Step(format!(
        "terminating {} in {}{}",
        plan.instance_id,
        plan.auto_scaling_group,
        if decrement {
            " (shrinking the group)"
        } else {
            " (the group replaces it)"
        }
    )));
    cloud
        .terminate_in_group(&plan.instance_id, decrement)
        .await
        .with_context(|| format!("terminating {} ({node})", plan.instance_id))?;
    if let Some(kube) = kube {
        events(&RemoveEvent::Step(format!("deleting Node {node}")));
        kube.delete_node(&node).await?;
    }
    Ok((plan, drained))
}

/// What `release host` found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// The host carries no kprov ownership marker: nothing holds it.
    NotClaimed,
    /// The marker names a cluster the store no longer has (or a recreated one with another
    /// UID); `done` once the host was reset.
    Gone {
        /// The ownership marker read on the host.
        owner: nodes::owner::Owner,
        /// The host was reset (`false`: only previewed).
        done: bool,
    },
    /// Not released, and why (a live cluster's host, this cluster's own, another store's).
    Refused(String),
}

/// `release host CLUSTER HOST`: frees a host of `cluster`'s spec that another cluster's
/// ownership marker holds, only when that cluster is gone: its UID is checked against the
/// state store (never by force: a live cluster's host is refused, naming the command that
/// removes it from its cluster). The reset runs only on a host still carrying the gone
/// cluster's marker (checked again on the host). Call under `cluster`'s lock when `yes`.
pub(crate) async fn release_host(
    store: Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    host: &str,
    accept_new_host_keys: bool,
    yes: bool,
) -> anyhow::Result<Release> {
    let name = cluster.name.as_str();
    if !cluster.completed.spec.hosts.iter().any(|h| h.name == host) {
        bail!(
            "{host} is not a host of {name}'s spec: release a host from the cluster that wants it"
        );
    }
    let fleet = SshFleet::new(
        name,
        cluster.completed.spec.hosts.clone(),
        store.clone(),
        SshOptions {
            accept_new_host_keys,
            ..SshOptions::default()
        },
        Arc::new(NoProgress),
    )
    .context("preparing ssh connections")?;
    let outcome = release_on(&fleet, store.as_ref(), cluster, host, yes).await;
    fleet.close().await;
    outcome
}

async fn release_on(
    exec: &dyn HostExecutor,
    store: &dyn StateStore,
    cluster: &ResolvedCluster,
    host: &str,
    yes: bool,
) -> anyhow::Result<Release> {
    let name = cluster.name.as_str();
    let Some(marker) = orchestrate::marker(exec, host).await? else {
        return Ok(Release::NotClaimed);
    };
    if marker.uid.is_empty() {
        return Ok(Release::Refused(format!(
            "{host}'s ownership marker is unreadable: kprov cannot tell whose it is"
        )));
    }
    if let Some(own) = nodes::owner::read(store, name).await?
        && own.uid == marker.uid
    {
        return Ok(Release::Refused(format!(
            "{host} belongs to {name} itself: remove it with `kprov delete instance {name} {host}`"
        )));
    }
    if marker.store != store.location() {
        return Ok(Release::Refused(format!(
            "{host} belongs to {}: kprov can only check the state store it uses ({}), so it \
             cannot tell whether that cluster is gone; run the release with `--state {}`",
            marker.describe(),
            store.location(),
            marker.store
        )));
    }
    if let Some(live) = nodes::owner::read(store, &marker.cluster).await?
        && live.uid == marker.uid
    {
        return Ok(Release::Refused(format!(
            "{host} belongs to {}, which still exists: remove it from that cluster with `kprov \
             delete instance {} {host}` (or delete that cluster)",
            marker.describe(),
            marker.cluster
        )));
    }
    if !yes {
        return Ok(Release::Gone {
            owner: marker,
            done: false,
        });
    }
    let targets = nodes::Inventory {
        hosts: cluster.completed.spec.hosts.clone(),
    }
    .targets()
    .await?;
    let report = orchestrate::reset_only(
        exec,
        cluster,
        &targets,
        &[host],
        &marker,
        &Options::current(),
    )
    .await?;
    match report
        .hosts
        .iter()
        .find(|h| h.host == host)
        .map(|h| &h.result)
    {
        Some(HostResult::Ok) => Ok(Release::Gone {
            owner: marker,
            done: true,
        }),
        Some(HostResult::Failed { error, .. }) => bail!("releasing {host}: {error}"),
        Some(other) => bail!("releasing {host}: {other:?}"),
        None => bail!("releasing {host}: the reset did not run"),
    }
}

/// What `delete instance` is asked to do (its flags).
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// A host name (metal), a Node name or an instance ID (AWS).
    pub node: String,
    /// Give up on the drain after this long (the node stays cordoned, nothing else changes).
    pub drain_timeout: std::time::Duration,
    /// Evict pods with emptyDir volumes (their data is lost).
    pub delete_emptydir_data: bool,
    /// Evict pods no controller manages (they are not recreated).
    pub force: bool,
    /// AWS: shrink the Auto Scaling group instead of letting it launch a replacement.
    pub decrement: bool,
    /// AWS: do not ask the cluster's API (it may be what is down).
    pub cloud_only: bool,
    /// `--kubeconfig`: the API client's credentials instead of the stored ones.
    pub kubeconfig: Option<std::path::PathBuf>,
}

impl Request {
    /// kubectl's drain, bounded by `drain_timeout` (each eviction too).
    fn drain(&self) -> DrainOptions {
        DrainOptions {
            timeout: self.drain_timeout,
            delete_emptydir_data: self.delete_emptydir_data,
            force_unmanaged: self.force,
            eviction: crate::kube::EvictOptions {
                deadline: self.drain_timeout,
                ..Default::default()
            },
            ..DrainOptions::default()
        }
    }
}

/// Why `delete instance` could not run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InstanceError {
    /// `--decrement-desired-capacity` on a metal cluster.
    #[error("--decrement-desired-capacity applies to AWS clusters; {0} is bare metal")]
    DecrementOnMetal(String),
    /// `--cloudonly` on a metal cluster.
    #[error(
        "--cloudonly applies to AWS clusters (the instance is terminated through its Auto \
         Scaling group); {0} is bare metal: its hosts are removed over SSH and the API"
    )]
    CloudOnlyOnMetal(String),
    /// The cluster's lock could not be taken, or was lost.
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    /// A refusal, or a step that failed (naming the node, host or resource).
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// `delete instance` on one cluster, opened: where it runs and the API client it uses.
pub(crate) struct Removal {
    store: Arc<dyn StateStore>,
    cluster: ResolvedCluster,
    request: Request,
    on: RemovalOn,
    /// Keeps the API client's credentials file and tunnel alive as long as the client.
    client: Option<crate::ops::credentials::ClientGuard>,
}

enum RemovalOn {
    Metal { kube: Kube },
    Aws(Box<AwsRemoval>),
}

/// An AWS cluster's removal: its cloud, its instances, the API client (`None`: `--cloudonly`).
struct AwsRemoval {
    cloud: AwsCloud,
    instances: AwsInstances,
    kube: Option<Kube>,
}

/// The preview of `delete instance`, per platform.
#[derive(Debug, Clone)]
pub enum InstancePlan {
    /// A metal host: its Node, pods and etcd member.
    Metal(Box<RemovalPlan>),
    /// An AWS instance: its Auto Scaling group and capacity.
    Aws(Box<AwsRemovalPlan>),
}

impl InstancePlan {
    /// Why `--yes` would refuse (empty: it would remove the node).
    pub(crate) fn refusals(&self) -> &[String] {
        match self {
            InstancePlan::Metal(p) => &p.refusals,
            InstancePlan::Aws(p) => &p.refusals,
        }
    }

    /// The preview as `-o json|yaml` prints it: the plan's fields (keys sorted), each pod as
    /// `{pod, action, reason}`.
    pub(crate) fn document(&self) -> serde_json::Result<serde_json::Value> {
        let (mut v, pods) = match self {
            InstancePlan::Metal(p) => (serde_json::to_value(p)?, &p.pods),
            InstancePlan::Aws(p) => (serde_json::to_value(p)?, &p.pods),
        };
        v["pods"] = pods
            .iter()
            .map(|(p, d)| {
                let (action, why) = match d {
                    Disposition::Evict => ("evict", String::new()),
                    Disposition::Skip(r) => ("skip", r.to_string()),
                    Disposition::Refuse(w) => ("refused", w.join("; ")),
                };
                serde_json::json!({ "pod": p, "action": action, "reason": why })
            })
            .collect();
        Ok(v)
    }
}

/// What `delete instance --yes` did, per platform.
#[derive(Debug, Clone)]
pub enum InstanceReport {
    /// A metal host removed: drained, etcd member, reset, Node object, spec.
    Metal(RemoveReport),
    /// An AWS instance terminated in its Auto Scaling group.
    Aws {
        /// The plan as made again under the lock, the one carried out.
        plan: AwsRemovalPlan,
        /// The drain's outcome; `None` when nothing was drained (`--cloudonly`, no Node).
        drain: Option<DrainReport>,
    },
}

impl Removal {
    /// Opens the removal of `request.node` from `cluster` (completed and validated): the flags
    /// checked against the platform, the cloud's clients on AWS, and the API client (not on
    /// AWS with `--cloudonly`, which never asks the API).
    pub(crate) async fn open(
        store: Arc<dyn StateStore>,
        cluster: &ResolvedCluster,
        request: Request,
    ) -> Result<Removal, InstanceError> {
        let name = cluster.name.as_str();
        let aws = cluster.completed.spec.cloud_provider == crate::spec::CloudProvider::Aws;
        if !aws && request.decrement {
            return Err(InstanceError::DecrementOnMetal(name.to_string()));
        }
        if !aws && request.cloud_only {
            return Err(InstanceError::CloudOnlyOnMetal(name.to_string()));
        }
        // The API client, opened where the platform's branch needs it (after the cloud's).
        let api = async || {
            crate::ops::credentials::kube_client(
                &store,
                &cluster.completed,
                request.kubeconfig.as_deref(),
                false,
            )
            .await
        };
        let (on, client) = if aws {
            let cloud = crate::ops::aws::cloud(&cluster.completed).await?;
            let instances = AwsInstances::new(
                &cloud,
                &cluster.completed_groups,
                crate::cloud::aws::instances::SshReach::of(&cluster.completed, false),
            );
            let (kube, client) = match request.cloud_only {
                true => (None, None),
                false => {
                    let (k, g) = api().await?;
                    (Some(k), Some(g))
                }
            };
            (
                RemovalOn::Aws(Box::new(AwsRemoval {
                    cloud,
                    instances,
                    kube,
                })),
                client,
            )
        } else {
            let (kube, g) = api().await?;
            (RemovalOn::Metal { kube }, Some(g))
        };
        Ok(Removal {
            store,
            cluster: cluster.clone(),
            request,
            on,
            client,
        })
    }

    /// How the API is reached when not directly, for a debug line.
    pub(crate) fn route(&self) -> Option<&str> {
        self.client.as_ref().and_then(|c| c.route())
    }

    /// What removing the node means, read-only (the preview).
    pub(crate) async fn plan(&self) -> Result<InstancePlan, InstanceError> {
        let r = &self.request;
        Ok(match &self.on {
            RemovalOn::Metal { kube } => InstancePlan::Metal(Box::new(
                plan(self.store.clone(), &self.cluster, kube, &r.node, &r.drain()).await?,
            )),
            RemovalOn::Aws(aws) => InstancePlan::Aws(Box::new(
                plan_aws(
                    &aws.cloud,
                    &aws.instances,
                    aws.kube.as_ref(),
                    &r.node,
                    &r.drain(),
                    r.decrement,
                )
                .await?,
            )),
        })
    }

    /// `delete instance --yes`: [`Removal::apply`] under the cluster's lock (`session`), cut
    /// by the first signal of `ints` (caught before the lock is taken, so none ends the
    /// process with the lock held): the wait in flight (drain, etcd member, host, API, the
    /// cloud) ends, the lock is released and `Ok(Err(caught))` returned; every step is safe to
    /// run again, which the next run does.
    pub(crate) async fn apply_interruptible(
        &self,
        session: &super::session::Session,
        ints: &super::interrupt::Interrupts,
        events: &RemoveEvents,
    ) -> Result<Result<InstanceReport, super::interrupt::Caught>, InstanceError> {
        session
            .with_lock(&self.cluster.name, "delete instance", async |guard| {
                ints.or_try(self.apply(guard, events)).await
            })
            .await
    }

    /// Removes the node under `guard` (the caller's [`crate::ops::session::Session::with_lock`]):
    /// the plan is made again under the lock, a refusal stops before anything changes.
    pub(crate) async fn apply(
        &self,
        guard: &lock::LockGuard,
        events: &RemoveEvents,
    ) -> Result<InstanceReport, InstanceError> {
        let r = &self.request;
        Ok(match &self.on {
            RemovalOn::Metal { kube } => InstanceReport::Metal(
                remove(
                    self.store.clone(),
                    &self.cluster,
                    kube,
                    &r.node,
                    guard,
                    &r.drain(),
                    events,
                )
                .await?,
            ),
            RemovalOn::Aws(aws) => {
                let (plan, drain) = remove_aws(
                    &aws.cloud,
                    &aws.instances,
                    aws.kube.as_ref(),
                    &r.node,
                    guard,
                    &r.drain(),
                    r.decrement,
                    events,
                )
                .await?;
                InstanceReport::Aws { plan, drain }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(decrement: bool, cloud_only: bool) -> Request {
        Request {
            node: "w1".into(),
            drain_timeout: std::time::Duration::from_secs(60),
            delete_emptydir_data: false,
            force: false,
            decrement,
            cloud_only,
            kubeconfig: None,
        }
    }

    #[tokio::test]
    async fn aws_only_flags_are_refused_on_metal_before_anything_is_asked() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn StateStore> =
            Arc::new(crate::state::file::FileStore::new(dir.path()).unwrap());
        let cluster = orchestrate::tests::resolved(&orchestrate::tests::cluster(""));
        for (req, flag) in [
            (request(true, false), "--decrement-desired-capacity"),
            (request(false, true), "--cloudonly"),
        ] {
            match Removal::open(store.clone(), &cluster, req).await {
                Err(
                    e @ (InstanceError::DecrementOnMetal(_) | InstanceError::CloudOnlyOnMetal(_)),
                ) => {
                    let said = e.to_string();
                    assert!(said.starts_with(flag), "{said}");
                    assert!(said.contains("demo.example.com is bare metal"), "{said}");
                }
                Err(e) => panic!("{flag}: {e}"),
                Ok(_) => panic!("{flag} was accepted on a metal cluster"),
            }
        }
    }

    fn member(id: u64, name: &str, healthy: bool) -> EtcdMember {
        EtcdMember {
            id,
            name: name.into(),
            peer_urls: vec![format!("https://10.0.0.{id}:2380")],
            client_urls: vec![format!("https://10.0.0.{id}:2379")],
            healthy,
        }
    }

    #[test]
    fn quorum_is_kept_or_the_removal_refused() {
        let three = [
            member(1, "cp1", true),
            member(2, "cp2", true),
            member(3, "cp3", true),
        ];
        assert_eq!(removal_keeps_quorum(&three, 1), Ok(()));
        let degraded = [
            member(1, "cp1", true),
            member(2, "cp2", true),
            member(3, "cp3", false),
        ];
        // Removing the broken member is how to repair; removing a healthy one loses quorum.
        assert_eq!(removal_keeps_quorum(&degraded, 3), Ok(()));
        let e = removal_keeps_quorum(&degraded, 1).unwrap_err();
        assert!(
            e.contains("2 members would remain, 1 of them healthy"),
            "{e}"
        );
        assert!(e.contains("needs 2") && e.contains("unhealthy: cp3"), "{e}");
        let two = [member(1, "cp1", true), member(2, "cp2", true)];
        assert_eq!(removal_keeps_quorum(&two, 2), Ok(()));
        let e = removal_keeps_quorum(&[member(1, "cp1", true)], 1).unwrap_err();
        assert!(e.contains("last etcd member"), "{e}");
        let five = [
            member(1, "a", true),
            member(2, "b", true),
            member(3, "c", true),
            member(4, "d", false),
            member(5, "e", false),
        ];
        // 4 remain, 2 healthy, quorum of 4 is 3.
        assert!(removal_keeps_quorum(&five, 1).is_err());
        assert_eq!(removal_keeps_quorum(&five, 4), Ok(()));
    }
}
