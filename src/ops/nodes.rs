//! Nodes over SSH, whatever platform found them: the entry points `update cluster` and
//! `delete cluster` call on metal, and AWS calls once its instances are targets.
//!
//! ```text
//! let targets = source.targets().await?;          // nodes::Inventory, AwsInstances, ...
//! let plan = ops::nodes::plan(store, &resolved, &targets, &options).await?;    // preview
//! let report = ops::nodes::converge(store, &resolved, &targets, &guard, &options, &events).await?;
//! ```
//!
//! `converge` observes the targets again under the caller's cluster lock (the same function
//! the preview used), executes that plan, and stores the admin kubeconfig (compare-and-swap)
//! fetched from a control plane this cluster owns. It does not deploy add-ons: the caller
//! does, once the report says the nodes converged.

use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;

use crate::nodes::{self, Owner, Target};
use crate::provision::orchestrate::{self, HostResult, Options, ProgressEvent, Report};
use crate::provision::plan::{self as node_plan, NodePlan};
use crate::provision::render::CloudApi;
use crate::spec::ResolvedCluster;
use crate::ssh::{Event, Progress, SshFleet, SshOptions};
use crate::state::layout::ClusterKeys;
use crate::state::{Precondition, StateStore, lock};

/// Where the admin kubeconfig is kept: `<cluster>/secrets/admin.conf`.
pub(crate) const ADMIN_KUBECONFIG_SECRET: &str = "admin.conf";

/// How to reach and treat the nodes.
#[derive(Debug, Clone)]
pub(crate) struct NodeOptions {
    /// Record the keys of hosts the cluster has never seen (`--accept-new-host-keys`).
    /// Ignored by [`plan`] (a preview never records a key).
    pub accept_new_host_keys: bool,
    /// Hosts worked on at the same time (`--concurrency`).
    pub concurrency: usize,
    /// The cloud's API endpoint and certificate names (AWS: the load balancer); `None` on metal.
    pub cloud_api: Option<CloudApi>,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            accept_new_host_keys: false,
            concurrency: SshOptions::default().concurrency,
            cloud_api: None,
        }
    }
}

/// What happens while nodes are worked on, for the CLI to render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeEvent {
    /// A phase started, finished or failed on a target.
    Progress(ProgressEvent),
    /// A first-contact host key was recorded: the operator should compare its fingerprints.
    HostKeyRecorded {
        host: String,
        fingerprints: Vec<String>,
    },
    /// Something worth a warning that does not fail the run.
    Warning(String),
    /// A connection made or a step finished, with its time (`HOST: STEP: changed (N ms)`):
    /// where a run's time goes, shown with `-v`. Failures are not here: the phase's `Failed`
    /// says them.
    Detail(String),
}

pub(crate) type Events = Arc<dyn Fn(&NodeEvent) + Send + Sync>;

/// Events nobody listens to.
pub(crate) fn no_events() -> Events {
    Arc::new(|_: &NodeEvent| {})
}

/// What became of the admin kubeconfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AdminKubeconfig {
    /// Written to the store (new or changed).
    Stored,
    /// The store already held exactly this one.
    Unchanged,
    /// Not fetched; why (no control plane converged, none initialised, ...).
    NotFetched(String),
}

/// The outcome of [`converge`].
#[derive(Debug, Clone)]
pub(crate) struct NodeReport {
    pub report: Report,
    pub admin_kubeconfig: AdminKubeconfig,
}

impl NodeReport {
    /// Every target converged and the cluster's credentials are in the store.
    pub(crate) fn success(&self) -> bool {
        self.report.success()
            && matches!(
                self.admin_kubeconfig,
                AdminKubeconfig::Stored | AdminKubeconfig::Unchanged
            )
    }
}

struct SshEvents(Events);

impl Progress for SshEvents {
    fn event(&self, event: &Event) {
        match event {
            Event::HostKeyRecorded { host, fingerprints } => {
                (self.0)(&NodeEvent::HostKeyRecorded {
                    host: host.clone(),
                    fingerprints: fingerprints.clone(),
                })
            }
            Event::Connected { .. }
            | Event::HookStarted { .. }
            | Event::StepFinished { result: Ok(_), .. } => {
                (self.0)(&NodeEvent::Detail(event.to_string()))
            }
            _ => {}
        }
    }
}

/// An SSH fleet over the targets' hosts that trusts only the host keys already recorded and
/// tells no one of its progress: the fleet of a check, a read or a roll.
pub(crate) fn strict_fleet(
    cluster: &str,
    targets: &[Target],
    store: Arc<dyn StateStore>,
    concurrency: usize,
) -> anyhow::Result<SshFleet> {
    fleet(cluster, targets, store, false, concurrency, &no_events())
}

/// An SSH fleet over the targets' hosts.
pub(crate) fn fleet(
    cluster: &str,
    targets: &[Target],
    store: Arc<dyn StateStore>,
    accept_new_host_keys: bool,
    concurrency: usize,
    events: &Events,
) -> anyhow::Result<SshFleet> {
    SshFleet::new(
        cluster,
        targets.iter().map(|t| t.host.clone()).collect(),
        store,
        SshOptions {
            concurrency,
            accept_new_host_keys,
            ..SshOptions::default()
        },
        Arc::new(SshEvents(events.clone())),
    )
    .context("preparing ssh connections")
}

/// An SSH fleet that contacts only hosts whose keys the cluster recorded (the preview, a
/// reset): it accepts no new host key.
fn known_hosts_fleet(
    cluster: &ResolvedCluster,
    targets: &[Target],
    store: Arc<dyn StateStore>,
    options: &NodeOptions,
    events: &Events,
) -> anyhow::Result<SshFleet> {
    fleet(
        &cluster.name,
        targets,
        store,
        false,
        options.concurrency,
        events,
    )
}

/// The orchestrator's options for a run that changes hosts (converge, reset): now, its
/// progress told as node events.
fn run_options(options: &NodeOptions, events: &Events) -> Options {
    let events = events.clone();
    let progress: orchestrate::Progress =
        Arc::new(move |e: &ProgressEvent| events(&NodeEvent::Progress(e.clone())));
    Options {
        progress: Some(progress),
        cloud_api: options.cloud_api.clone(),
        ..Options::current()
    }
}

/// The preview: observes every target read-only and decides. Contacts only hosts whose keys
/// the cluster recorded, writes nothing to hosts or to the store, records no key.
pub(crate) async fn plan(
    store: Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    targets: &[Target],
    options: &NodeOptions,
) -> anyhow::Result<NodePlan> {
    // A cluster that never claimed a host has no UID yet (none is made here).
    let owner: Option<Owner> = nodes::owner::read(store.as_ref(), &cluster.name).await?;
    let fleet = known_hosts_fleet(cluster, targets, store, options, &no_events())?;
    let plan = node_plan::plan_with(
        &fleet,
        Some(&fleet),
        cluster,
        targets,
        owner,
        options.cloud_api.as_ref(),
    )
    .await;
    fleet.close().await;
    plan.context("planning the nodes")
}

/// `update cluster --yes` for the nodes: plans again under `guard` (the cluster lock the
/// caller holds), executes the plan, stores the admin kubeconfig. The nodes' failures are in
/// the report; an `Err` means the run itself could not proceed (store, lock, rendering).
pub(crate) async fn converge(
    store: Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    targets: &[Target],
    guard: &lock::LockGuard,
    options: &NodeOptions,
    events: &Events,
) -> anyhow::Result<NodeReport> {
    guard.check()?;
    // The identity hosts are claimed for, made once (compare-and-swap) before any claim.
    let owner = nodes::owner::ensure(store.as_ref(), &cluster.name)
        .await
        .context("the cluster's UID")?;
    let fleet = fleet(
        &cluster.name,
        targets,
        store.clone(),
        options.accept_new_host_keys,
        options.concurrency,
        events,
    )?;
    let run = run_options(options, events);
    let result = async {
        // One renderer for observing and executing: local assets read and hashed once.
        let renderer = Arc::new(
            crate::provision::render::Renderer::for_run(
                cluster,
                targets,
                options.cloud_api.as_ref(),
            )
            .context("planning the nodes")?,
        );
        // Reading and hashing the `file://` image archives (hundreds of MB) overlaps
        // connecting to the hosts and observing them; the plan waits for it (and reports a
        // failure) before it decides anything.
        let warm = renderer.clone();
        let warming = tokio::task::spawn_blocking(move || {
            let _ = warm.load_images();
        });
        // Observed again: the world may have changed since the preview.
        let plan = node_plan::plan_rendered(
            &fleet,
            None,
            &renderer,
            Some(warming),
            cluster,
            targets,
            Some(owner.clone()),
        )
        .await
        .context("planning the nodes")?;
        let report = orchestrate::execute_rendered(&fleet, &renderer, targets, &plan, &run)
            .await
            .context("provisioning")?;
        // kprov's record of its metal hosts: `update cluster` names those the inventory lost.
        // (Cloud instances are found from the cloud; their groups replace them.)
        let metal = matches!(cluster.platform, crate::spec::resolve::Platform::Metal(_));
        let converged: Vec<&crate::spec::Host> = targets
            .iter()
            .filter(|_| metal)
            .filter(|t| {
                report
                    .hosts
                    .iter()
                    .any(|h| h.host == t.name() && h.result == HostResult::Ok)
            })
            .map(|t| &t.host)
            .collect();
        guard.check()?;
        super::host_records::record_provisioned(store.as_ref(), &cluster.name, &converged).await?;
        let converged_control_plane = report.hosts.iter().any(|h| {
            matches!(h.result, HostResult::Ok | HostResult::PendingRoll { .. })
                && targets
                    .iter()
                    .any(|t| t.name() == h.host && t.is_control_plane())
        });
        let admin_kubeconfig = if !converged_control_plane {
            AdminKubeconfig::NotFetched("no control plane converged".into())
        } else {
            let (cloud_api, store) = (options.cloud_api.as_ref(), store.as_ref());
            match fetch_admin_kubeconfig(&fleet, store, cluster, targets, &owner, cloud_api, guard)
                .await?
            {
                Ok(stored) => stored,
                Err(e) => {
                    events(&NodeEvent::Warning(format!(
                        "could not fetch the admin kubeconfig: {e}"
                    )));
                    AdminKubeconfig::NotFetched(e)
                }
            }
        };
        Ok::<_, anyhow::Error>(NodeReport {
            report,
            admin_kubeconfig,
        })
    }
    .await;
    fleet.close().await;
    result
}

/// The admin kubeconfig read from a control plane this cluster owns, then stored (the lock
/// checked first); `Err` says why none could be read (nothing stored).
pub(super) async fn fetch_admin_kubeconfig(
    fleet: &SshFleet,
    store: &dyn StateStore,
    cluster: &ResolvedCluster,
    targets: &[Target],
    owner: &Owner,
    cloud_api: Option<&CloudApi>,
    guard: &lock::LockGuard,
) -> anyhow::Result<Result<AdminKubeconfig, String>> {
    match orchestrate::admin_kubeconfig_with(fleet, cluster, targets, owner, cloud_api).await {
        Ok(admin) => {
            guard.check()?;
            Ok(Ok(
                store_admin_kubeconfig(store, &cluster.name, admin).await?
            ))
        }
        Err(e) => Ok(Err(e.to_string())),
    }
}

/// Writes the admin kubeconfig under the cluster's secrets, compare-and-swap; an unchanged
/// one is not rewritten.
pub(crate) async fn store_admin_kubeconfig(
    store: &dyn StateStore,
    cluster: &str,
    admin: String,
) -> anyhow::Result<AdminKubeconfig> {
    let key = ClusterKeys::new(cluster)?.secret(ADMIN_KUBECONFIG_SECRET)?;
    let cond = match store.get(&key).await? {
        Some(o) if o.data == admin.as_bytes() => return Ok(AdminKubeconfig::Unchanged),
        Some(o) => Precondition::Matches(o.version),
        None => Precondition::Absent,
    };
    store
        .put(&key, Bytes::from(admin), cond)
        .await
        .context("storing the admin kubeconfig")?;
    Ok(AdminKubeconfig::Stored)
}

/// What [`reset`] did.
#[derive(Debug, Clone)]
pub(crate) enum ResetOutcome {
    /// The cluster never claimed a host (no UID, or no key recorded): nothing contacted.
    NothingClaimed(String),
    Reset(Report),
}

/// `delete cluster` for the nodes: resets the targets that carry this cluster's ownership
/// marker; the others are skipped (the report says whose they are). Call under the lock.
pub(crate) async fn reset(
    store: Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    targets: &[Target],
    options: &NodeOptions,
    events: &Events,
) -> anyhow::Result<ResetOutcome> {
    let name = cluster.name.as_str();
    let known = store
        .get(&ClusterKeys::new(name)?.known_hosts())
        .await?
        .is_some_and(|o| !o.data.trim_ascii().is_empty());
    if !known {
        // Without a recorded key kprov cannot (and never did) log in to any of the hosts.
        return Ok(ResetOutcome::NothingClaimed(format!(
            "kprov never connected to a host of {name} (no host keys recorded)"
        )));
    }
    let Some(owner) = nodes::owner::read(store.as_ref(), name).await? else {
        return Ok(ResetOutcome::NothingClaimed(format!(
            "{name} never claimed a host (no cluster UID in the state store)"
        )));
    };
    let fleet = known_hosts_fleet(cluster, targets, store, options, events)?;
    let run = run_options(options, events);
    let report = orchestrate::reset(&fleet, cluster, targets, &owner, &run).await;
    fleet.close().await;
    Ok(ResetOutcome::Reset(report.context("resetting hosts")?))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::ssh::task::StepOutcome;

    /// `-v` shows where a run's time goes: connections and finished steps with their times
    /// reach the CLI as details; a failed step does not (its phase's `Failed` says it, once).
    #[test]
    fn connections_and_finished_steps_become_details_failures_do_not() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let events: Events = Arc::new(move |e: &NodeEvent| sink.lock().unwrap().push(e.clone()));
        let p = SshEvents(events);
        p.event(&Event::Connected {
            host: "cp1".into(),
            duration: Duration::from_millis(40),
            parts: vec![
                ("scan", Duration::from_millis(12)),
                ("ssh", Duration::from_millis(25)),
            ],
        });
        p.event(&Event::StepFinished {
            host: "cp1".into(),
            step: "images: import etcd.tar".into(),
            result: Ok(StepOutcome::Changed),
            duration: Duration::from_millis(2150),
            remote: None,
        });
        p.event(&Event::StepFinished {
            host: "cp1".into(),
            step: "kubelet: service".into(),
            result: Err("boom".into()),
            duration: Duration::from_millis(5),
            remote: None,
        });
        assert_eq!(
            *seen.lock().unwrap(),
            [
                NodeEvent::Detail("cp1: connected (40 ms: scan 12 ms, ssh 25 ms)".into()),
                NodeEvent::Detail("cp1: images: import etcd.tar: changed (2150 ms)".into()),
            ]
        );
    }
}
