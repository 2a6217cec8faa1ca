//! `update cluster` and `delete cluster` on AWS, without the command line: the cloud plan and
//! its apply, then the instances as node targets (host keys kprov generated recorded first,
//! a bounded wait for SSH) converged through [`super::nodes::converge`], the code path metal
//! uses. Progress leaves as [`AwsEvent`]s (cloud) and [`NodeEvent`](super::nodes::NodeEvent)s
//! (nodes) that the CLI renders.
//!
//! ```text
//! let (cloud, plan) = ops::aws::plan(store, &cluster, &groups).await?;             // preview
//! let nodes = ops::aws::node_plan(store, &cloud, &cluster, &groups, &plan, &o).await?;
//! let outcome = ops::aws::apply(store, &cluster, &groups, &guard, &o, &events, node_events).await?;
//! let plan = ops::aws::delete_plan(&cluster, &groups).await?;                     // delete
//! let deleted = ops::aws::delete_apply(&cluster, &groups).await?;
//! ```
//!
//! Caveat: instances are a snapshot taken once every group has launched its desired instances
//! (or the launch wait ended, which is reported); an instance a group starts later is found by
//! the next run (and listed as joining by its preview).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::nodes::{self as ops_nodes, Events, NodeOptions, NodeReport};
use crate::cloud::aws::instances::{self, AwsInstances, SshReach};
use crate::cloud::aws::{AwsCloud, hostkeys, images, kinds, launch, wait};
use crate::cloud::engine::{self, ApplyOptions, Plan};
use crate::nodes::Target;
use crate::provision::plan::NodePlan;
use crate::spec::{Cluster, ResolvedCluster};
use crate::ssh::KeyConflict;
use crate::ssh::task::{ExecError, HostExecutor};
use crate::state::{StateStore, lock};
use futures::StreamExt;

/// How long instances get to answer SSH after the cloud apply.
pub(crate) const SSH_WAIT: Duration = Duration::from_secs(300);

/// How long Auto Scaling gets to launch every group's desired instances after the cloud apply
/// (AWS launches asynchronously and retries failed launches with back-off).
pub(crate) const LAUNCH_WAIT: Duration = Duration::from_secs(600);

/// What `update cluster` on AWS was asked for.
#[derive(Debug, Clone, Default)]
pub(crate) struct AwsUpdateOptions {
    /// Apply deletions of resources the spec no longer wants (`--prune`).
    pub prune: bool,
    /// Reach instances at their private addresses (`--ssh-private-address`).
    pub ssh_private_address: bool,
    pub accept_new_host_keys: bool,
    /// Hosts worked on at the same time (`--concurrency`).
    pub concurrency: usize,
    /// How long instances get to answer SSH (`--ssh-wait`; [`SSH_WAIT`] when `None`).
    pub ssh_wait: Option<Duration>,
    /// Resolve image name patterns again instead of using their pins (`--refresh-image`).
    pub refresh_images: bool,
    /// Only this part of the apply (kops's lifecycle phases, `--phase`); all of it when `None`.
    pub phase: Option<Phase>,
}

/// A part of `update cluster --yes` applied alone (`--phase`), in the order a whole apply
/// runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The cloud resources only: no wait for Auto Scaling or SSH, no host contacted.
    Cloud,
    /// The instances only (waited for, then provisioned); the cloud resources must already
    /// match the spec, and nothing in them is changed.
    Nodes,
    /// The add-ons and kube-system's node configuration only (the CLI's part).
    Addons,
}

/// Progress of an AWS apply, for the CLI to render.
#[derive(Debug)]
pub(crate) enum AwsEvent<'a> {
    /// The cloud changes about to be applied (planned under the lock).
    CloudPlan(&'a Plan),
    /// The cloud resources already match the spec.
    CloudUnchanged,
    /// One cloud change finished (`Create Subnet/us-east-1a`).
    CloudChangeDone(String),
    /// A cloud change got through only after waiting for AWS: what, how long, on what
    /// (an instance profile not usable yet, an ID not found yet, throttling).
    CloudWaited {
        resource: String,
        waited: Duration,
        why: String,
    },
    CloudApplied {
        changes: usize,
    },
    /// An instance owned by the cluster but in none of its groups: never provisioned.
    Stray(String),
    Wait(wait::WaitEvent),
    /// Waiting for Auto Scaling to launch the groups' instances.
    Launch(launch::LaunchEvent),
    /// A group still short of its desired capacity when the launch wait ended: provisioned
    /// with the instances that are there.
    LaunchLate(launch::Short, Duration),
    /// Still silent at the end of the wait (provisioning it will fail and say so).
    NotAnswering {
        instance: String,
        /// The last probe's or login's error: ssh's and the instance's text.
        last: crate::output::UntrustedText,
        waited: Duration,
    },
}

/// Where [`apply`] reports progress; called on the caller's task.
pub(crate) type AwsEvents<'e> = &'e (dyn Fn(&AwsEvent<'_>) + Send + Sync);

/// How `update cluster --yes` ended: [`apply`] (AWS) in any of these, metal only in `Nodes`.
#[derive(Debug)]
pub(crate) enum UpdateReport {
    /// The nodes were converged (see the report for failures).
    Nodes(Box<NodeReport>),
    /// AWS: no instance of the cluster runs: nothing was provisioned.
    NoInstances,
    /// AWS: the store holds other keys than the generated ones for these names: nothing was
    /// provisioned (neither key is trusted silently).
    KeyConflicts(Vec<KeyConflict>),
    /// `--phase cloud`: the cloud resources were applied; no instance was waited for.
    CloudOnly,
}

/// SDK clients in the cluster's region; credentials and endpoint come from the usual chain
/// (environment, profiles, SSO, instance roles; `AWS_ENDPOINT_URL` for emulators).
pub(crate) async fn cloud(cluster: &Cluster) -> anyhow::Result<AwsCloud> {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(region) = &cluster.spec.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    let sdk = loader.load().await;
    Ok(AwsCloud::new(&sdk, cluster.name(), &[]))
}

/// The cloud plan, read-only: a group without a host key shows it as pending; none is
/// generated.
pub(crate) async fn plan(
    store: &Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
) -> anyhow::Result<(AwsCloud, Plan)> {
    plan_refreshing(store, cluster, false).await
}

/// [`plan`]; with `refresh_images` the image name patterns are resolved again instead of
/// read from their pins (`update cluster --refresh-image`).
pub(crate) async fn plan_refreshing(
    store: &Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    refresh_images: bool,
) -> anyhow::Result<(AwsCloud, Plan)> {
    let names = group_names(cluster);
    let keys = hostkeys::load(store.as_ref(), &cluster.name, &names)
        .await
        .context("reading the instance groups' host keys")?;
    let pins = images::load(store.as_ref(), &cluster.name).await?;
    let cloud = cloud(&cluster.completed)
        .await?
        .with_host_keys(keys)
        .with_pinned_images(pins, refresh_images);
    let plan = cloud
        .plan(cluster)
        .await
        .context("planning cloud resources")?;
    Ok((cloud, plan))
}

/// The instance groups' names, as their host keys are stored.
fn group_names(cluster: &ResolvedCluster) -> Vec<&str> {
    cluster.groups.iter().map(|g| g.name.as_str()).collect()
}

/// The node plan of the running instances, read-only: only instances whose host key the
/// store holds are contacted (read-only checks); the others are listed as joining. None
/// before the load balancer and instances exist.
pub(crate) async fn node_plan(
    store: &Arc<dyn StateStore>,
    cloud: &AwsCloud,
    resolved: &ResolvedCluster,
    cloud_plan: &Plan,
    o: &AwsUpdateOptions,
) -> anyhow::Result<Option<NodePlan>> {
    let (cluster, groups) = (&resolved.completed, &resolved.completed_groups);
    let Some(lb) = instances::load_balancer_dns(cloud_plan) else {
        return Ok(None);
    };
    let reach = SshReach::of(cluster, o.ssh_private_address);
    let found = AwsInstances::new(cloud, groups, reach)
        .through(instances::jump_name(cluster, cloud_plan))
        .discover()
        .await
        .context("finding the cluster's instances")?;
    if found.targets.is_empty() {
        return Ok(None);
    }
    let targets = with_group_versions(found.targets, cloud_plan);
    let options = NodeOptions {
        accept_new_host_keys: false,
        concurrency: o.concurrency,
        cloud_api: Some(instances::cloud_api(cluster, &lb)),
    };
    Ok(Some(
        ops_nodes::plan(store.clone(), resolved, &targets, &options).await?,
    ))
}

/// Gives each instance its group's current launch template version, so that the node layer
/// reports an instance launched from an older one as pending a roll (kops's split: `update
/// --yes` moves the group, `rolling-update` replaces its instances).
fn with_group_versions(mut targets: Vec<Target>, plan: &Plan) -> Vec<Target> {
    let current = current_versions(plan);
    for t in &mut targets {
        if let (Some(group), Some(i)) = (&t.group, &mut t.instance) {
            i.group_template_version = current.get(group).cloned();
        }
    }
    targets
}

/// Under the caller's cluster lock: the cloud apply, then the instances found, their
/// expected host keys recorded, waited for (bounded) and converged through the node layer
/// metal uses. `node_events` makes the node progress sink once the targets are known.
pub(crate) async fn apply(
    store: &Arc<dyn StateStore>,
    resolved: &ResolvedCluster,
    guard: &lock::LockGuard,
    o: &AwsUpdateOptions,
    events: AwsEvents<'_>,
    node_events: impl FnOnce(&[Target]) -> Events,
) -> anyhow::Result<UpdateReport> {
    let (cluster, groups) = (&resolved.completed, resolved.completed_groups.as_slice());
    let name = resolved.name.as_str();
    // Generated (once, compare-and-swap) before any launch template is written.
    let keys = hostkeys::ensure(store.as_ref(), name, &group_names(resolved))
        .await
        .context("generating the instance groups' host keys")?;
    let pins = images::load(store.as_ref(), name).await?;
    let cloud = cloud(cluster)
        .await?
        .with_host_keys(keys.clone())
        .with_pinned_images(pins, o.refresh_images);
    if o.phase == Some(Phase::Nodes) {
        // The nodes phase changes no cloud resource: a pending change is the cloud phase's.
        let plan = cloud
            .plan(resolved)
            .await
            .context("planning cloud resources")?;
        plan.check().context("planning cloud resources")?;
        if plan.exit_code(o.prune) != 0 {
            let pending: Vec<String> = plan
                .changes
                .iter()
                .filter(|c| o.prune || c.action != engine::Action::Delete)
                .map(|c| format!("{:?} {}/{}", c.action, c.kind, c.name))
                .collect();
            anyhow::bail!(
                "the cloud resources of {name} do not match the spec yet ({}: {}); apply them \
                 first with `kprov update cluster {name} --yes --phase cloud` (or without \
                 --phase)",
                crate::output::plural(pending.len(), "change"),
                pending.join(", ")
            );
        }
        events(&AwsEvent::CloudUnchanged);
    } else {
        apply_cloud(&cloud, store, resolved, o.prune, events).await?;
    }
    guard.check()?;
    if o.phase == Some(Phase::Cloud) {
        return Ok(UpdateReport::CloudOnly);
    }
    // Read again after the apply: the load balancers' DNS names exist only now.
    let after = cloud
        .plan(resolved)
        .await
        .context("reading cloud resources after the apply")?;
    let Some(lb) = instances::load_balancer_dns(&after) else {
        anyhow::bail!(
            "the API load balancer of {name} has no DNS name yet; re-run `kprov update cluster {name} --yes`"
        );
    };
    let reach = SshReach::of(cluster, o.ssh_private_address);
    // Auto Scaling launches after the apply returns: wait (bounded, visibly) for every
    // group's desired instances before taking the snapshot the nodes are provisioned from.
    let on_launch = |e: launch::LaunchEvent| events(&AwsEvent::Launch(e));
    let late = launch::wait_for_launches(
        &cloud,
        groups,
        reach,
        LAUNCH_WAIT,
        Duration::from_secs(1),
        &on_launch,
    )
    .await
    .context("waiting for the Auto Scaling groups to launch their instances")?;
    for s in late {
        events(&AwsEvent::LaunchLate(s, LAUNCH_WAIT));
    }
    guard.check()?;
    let found = AwsInstances::new(&cloud, groups, reach)
        .through(instances::jump_name(cluster, &after))
        .discover()
        .await
        .context("finding the cluster's instances")?;
    for s in &found.strays {
        events(&AwsEvent::Stray(s.clone()));
    }
    let targets = with_group_versions(found.targets, &after);
    if targets.is_empty() {
        return Ok(UpdateReport::NoInstances);
    }
    // kprov generated the host keys: the first connection is checked strictly against them.
    let mut expected = hostkeys::expected_known_hosts(&targets, &keys)
        .await
        .map_err(anyhow::Error::msg)?;
    expected.extend(
        hostkeys::expected_known_hosts(&found.jump_hosts, &keys)
            .await
            .map_err(anyhow::Error::msg)?,
    );
    let conflicts = crate::ssh::record_expected_keys(store, name, &expected)
        .await
        .map_err(anyhow::Error::msg)
        .context("recording the instances' host keys")?;
    if !conflicts.is_empty() {
        return Ok(UpdateReport::KeyConflicts(conflicts));
    }
    // Nodes behind the bastion are waited for by the jump itself; the way in (the bastion's
    // name, where the user's ssh config sends it) is waited for here.
    let ssh_wait = o.ssh_wait.unwrap_or(SSH_WAIT);
    let mut waited = targets.clone();
    let mut bastion = None;
    if reach == SshReach::Bastion
        && let Some(jump) = found.jump_hosts.first()
    {
        let mut j = jump.clone();
        let (hostname, port) =
            crate::ssh::destination(&j.host.address, j.host.user.as_deref(), j.host.port)
                .await
                .map_err(anyhow::Error::msg)?;
        j.host.name = format!("bastion {}", j.host.address);
        j.host.address = hostname;
        j.host.port = Some(port);
        bastion = Some((j.host.name.clone(), jump.host.address.clone()));
        waited.push(j);
    }
    let on_wait = |e: wait::WaitEvent| events(&AwsEvent::Wait(e));
    if let Err(late) = wait::wait_for_ssh(&waited, ssh_wait, Duration::from_secs(2), &on_wait).await
    {
        let mut bastion_late = None;
        for (instance, last) in late {
            if bastion.as_ref().is_some_and(|(b, _)| *b == instance) {
                // The bastion's last error is its sshd's (or the network's) text: shown escaped.
                bastion_late = Some(crate::output::UntrustedText::new(last.clone()));
            }
            events(&AwsEvent::NotAnswering {
                instance,
                last: last.into(),
                waited: ssh_wait,
            });
        }
        // Every node is reached through the bastion: waiting for them behind a bastion that
        // does not answer only hides its cause under theirs.
        if let (Some(last), Some((_, way))) = (bastion_late, &bastion) {
            let behind = targets.iter().filter(|t| t.host.bastion.is_some()).count();
            anyhow::bail!(
                "the bastion of {name} ({way}) did not answer SSH within {}s: {last}; the {} \
                 behind it were not contacted. Check the bastion instance (its group, security \
                 group and the name {way} resolving to it), then re-run `kprov update cluster \
                 {name} --yes`",
                ssh_wait.as_secs(),
                if behind == 1 {
                    "1 node".to_string()
                } else {
                    format!("{behind} nodes")
                }
            );
        }
    }
    // Behind a bastion the probe above cannot see a node's sshd, and a connection through the
    // bastion to an instance whose sshd is not up yet fails instead of waiting.
    let behind: Vec<&Target> = targets
        .iter()
        .filter(|t| t.host.bastion.is_some())
        .collect();
    let logins = futures::stream::iter(behind.iter().map(|t| async move {
        let on_wait = |last: String| {
            events(&AwsEvent::Wait(wait::WaitEvent::Waiting {
                instance: t.name().to_string(),
                last: last.into(),
            }))
        };
        (
            *t,
            wait_for_login(
                store,
                cluster,
                t,
                ssh_wait,
                Duration::from_secs(2),
                &on_wait,
            )
            .await,
        )
    }))
    .buffer_unordered(8)
    .collect::<Vec<_>>()
    .await;
    for (t, r) in logins {
        // A refused key or login is the node layer's to report (it names both fingerprints).
        if let Err(LoginWait::Late(last)) = r {
            events(&AwsEvent::NotAnswering {
                instance: t.name().to_string(),
                last: last.into(),
                waited: ssh_wait,
            });
        }
    }
    guard.check()?;
    let options = NodeOptions {
        accept_new_host_keys: o.accept_new_host_keys,
        concurrency: o.concurrency,
        cloud_api: Some(instances::cloud_api(cluster, &lb)),
    };
    let node_events = node_events(&targets);
    let report = ops_nodes::converge(
        store.clone(),
        resolved,
        &targets,
        guard,
        &options,
        &node_events,
    )
    .await?;
    Ok(UpdateReport::Nodes(Box::new(report)))
}

/// Why [`wait_for_login`] gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LoginWait {
    /// The host (or the jump host) presented another key, or refused the login: waiting
    /// longer would not help.
    Refused(String),
    /// Not answering within the time given (the last error).
    Late(String),
}

impl std::fmt::Display for LoginWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoginWait::Refused(m) | LoginWait::Late(m) => f.write_str(m),
        }
    }
}

/// Whether an SSH failure is one that waiting does not fix (a key or a login refused).
fn refused(e: &ExecError) -> bool {
    let text = e.to_string();
    matches!(
        e,
        ExecError::HostKeyChanged { .. } | ExecError::UnknownHostKey { .. }
    ) || text.contains("Host key verification failed")
        || text.contains("REMOTE HOST IDENTIFICATION HAS CHANGED")
        || text.contains("Permission denied")
}

/// Waits (bounded; `on_wait` hears each failed attempt) until an SSH login on `t` succeeds,
/// checked strictly against the recorded keys (the caller recorded them). For instances
/// behind a jump host, whose sshd the banner probe of [`wait::wait_for_ssh`] cannot see: a
/// connection through the jump to an instance whose sshd is not up yet fails at once instead
/// of waiting. A key or login refused ends the wait at once.
pub(crate) async fn wait_for_login(
    store: &Arc<dyn StateStore>,
    cluster: &Cluster,
    t: &Target,
    timeout: Duration,
    poll: Duration,
    on_wait: &(dyn Fn(String) + Send + Sync),
) -> Result<(), LoginWait> {
    let way = match &t.host.bastion {
        Some(jump) => format!("{} through {jump}", t.host.address),
        None => t.host.address.clone(),
    };
    let start = std::time::Instant::now();
    loop {
        let attempt = async {
            let fleet =
                ops_nodes::strict_fleet(cluster.name(), std::slice::from_ref(t), store.clone(), 1)
                    .map_err(|e| ExecError::Connect {
                        host: t.name().to_string(),
                        message: format!("{e:#}"),
                    })?;
            let r = fleet.read_file(t.name(), "/etc/hostname").await;
            fleet.close().await;
            r.map(|_| ())
        };
        let last = match attempt.await {
            Ok(()) => return Ok(()),
            Err(e) if refused(&e) => {
                return Err(LoginWait::Refused(format!(
                    "{} ({way}) refused: {e}",
                    t.name()
                )));
            }
            Err(e) => e.to_string(),
        };
        if start.elapsed() >= timeout {
            return Err(LoginWait::Late(format!(
                "{} did not answer SSH at {way} within {timeout:?}: {last}",
                t.name()
            )));
        }
        on_wait(format!("waiting for SSH at {way}: {last}"));
        tokio::time::sleep(poll).await;
    }
}

/// The cloud part of `--yes`: planned under the lock (what is applied is what the store says
/// now), applied with an event per finished resource.
async fn apply_cloud(
    cloud: &AwsCloud,
    store: &Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    prune: bool,
    events: AwsEvents<'_>,
) -> anyhow::Result<()> {
    let (plan, images) = cloud
        .plan_and_images(cluster)
        .await
        .context("planning cloud resources")?;
    plan.check().context("planning cloud resources")?;
    // The images this apply writes into the launch templates are pinned before it starts, so
    // a re-run after a failed apply continues with them (cloud::aws::images).
    images::save(store.as_ref(), &cluster.name, &images).await?;
    // 0: nothing to apply (deletions wait for --prune).
    if plan.is_empty() || plan.exit_code(prune) == 0 {
        events(&AwsEvent::CloudUnchanged);
        return Ok(());
    }
    events(&AwsEvent::CloudPlan(&plan));
    // The engine reports each finished resource from its workers; the events are sent on
    // from this task, as the apply goes.
    enum Progress {
        Done(String),
        Waited(String, Duration, String),
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Progress>();
    let waited_tx = tx.clone();
    let hook = engine::DoneHook(Arc::new(move |action, id| {
        let _ = tx.send(Progress::Done(format!("{action:?} {id}")));
    }));
    let on_wait = engine::WaitHook(Arc::new(move |id, waited, why| {
        let _ = waited_tx.send(Progress::Waited(id.to_string(), waited, why.to_string()));
    }));
    let opts = ApplyOptions {
        prune,
        on_done: Some(hook),
        on_wait: Some(on_wait),
        ..Default::default()
    };
    let send = |p: Progress| match p {
        Progress::Done(line) => events(&AwsEvent::CloudChangeDone(line)),
        Progress::Waited(resource, waited, why) => events(&AwsEvent::CloudWaited {
            resource,
            waited,
            why,
        }),
    };
    let apply = engine::apply(cloud, &plan, &opts);
    tokio::pin!(apply);
    let result = loop {
        tokio::select! {
            r = &mut apply => break r,
            Some(p) = rx.recv() => send(p),
        }
    };
    while let Ok(p) = rx.try_recv() {
        send(p);
    }
    let report = result.context("applying cloud resources")?;
    events(&AwsEvent::CloudApplied {
        changes: report.done.len(),
    });
    Ok(())
}

/// `delete cluster` on AWS: every owned resource, in reverse dependency order. Read-only.
pub(crate) async fn delete_plan(cluster: &ResolvedCluster) -> anyhow::Result<Plan> {
    let cloud = cloud(&cluster.completed).await?;
    cloud
        .plan_delete(cluster)
        .await
        .context("finding the cluster's cloud resources")
}

/// Deletes every owned resource (planned again), under the caller's lock; returns how many
/// were deleted.
pub(crate) async fn delete_apply(cluster: &ResolvedCluster) -> anyhow::Result<usize> {
    let cloud = cloud(&cluster.completed).await?;
    let plan = cloud
        .plan_delete(cluster)
        .await
        .context("finding the cluster's cloud resources")?;
    let report = engine::apply(
        &cloud,
        &plan,
        &ApplyOptions {
            prune: true,
            ..Default::default()
        },
    )
    .await
    .context("deleting cloud resources")?;
    Ok(report.done.len())
}

/// Each group's current launch template version (`latestVersion` of its template: groups
/// launch `$Latest`), by instance group name.
pub(crate) fn current_versions(plan: &Plan) -> BTreeMap<String, String> {
    plan.actual
        .iter()
        .filter(|(id, _)| id.kind == kinds::LAUNCH_TEMPLATE)
        .filter_map(|(id, r)| {
            let v = r.get("latestVersion")?.as_int()?;
            (v > 0).then(|| (id.name.clone(), v.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refused_key_or_login_ends_the_wait_for_a_login() {
        let connect = |m: &str| ExecError::Connect {
            host: "i-1".into(),
            message: m.into(),
        };
        // The instance behind the bastion is not up yet: wait.
        assert!(!refused(&connect(
            "kex_exchange_identification: Connection closed by remote host"
        )));
        assert!(!refused(&connect(
            "channel 0: open failed: connect failed: Connection refused"
        )));
        // The bastion's or the instance's key, or the login: waiting does not help.
        assert!(refused(&connect("Host key verification failed.")));
        assert!(refused(&connect(
            "ubuntu@198.18.32.4: Permission denied (publickey)."
        )));
        assert!(refused(&ExecError::HostKeyChanged {
            host: "i-1".into(),
            known: "SHA256:a".into(),
            offered: "SHA256:b".into(),
        }));
    }
}
