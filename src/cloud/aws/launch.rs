//! Waiting for Auto Scaling to launch, bounded and visible. CreateAutoScalingGroup (and a
//! raised desired capacity) returns before any instance exists: AWS launches them through
//! scaling activities, seconds to minutes later, and retries failed launches. (moto starts
//! them inside the call, which is why a test against it alone never saw a first `update
//! --yes` find no instance, or only some.)
//!
//! [`wait_for_launches`] polls until every group of the cluster lists as many running or
//! pending instances, with their addresses (the public one too when kprov reaches instances
//! there), as its desired capacity; it reports each group's progress as it changes and every
//! failed scaling activity (with Auto Scaling's reason: an instance profile not usable yet, a
//! type not offered in the zone, a quota) once. Past the limit it returns the groups still
//! short; the caller goes on with the instances that are there and says so.
//!
//! Caveat: an interrupt ends the wait with the process (nothing is held but the cluster
//! lock's lease, which expires); re-running `update cluster --yes` picks up where it was.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::AwsCloud;
use super::instances::{AwsInstances, SshReach};
use crate::cloud::engine::CloudError;
use crate::output::UntrustedText;
use crate::spec::InstanceGroup;

/// Progress of the wait, for the printer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchEvent {
    /// A group has `ready` of its `desired` instances (sent when the count changes).
    Waiting {
        /// The instance group's name.
        group: String,
        /// Its instances running with an address.
        ready: usize,
        /// Its desired capacity.
        desired: usize,
    },
    /// A scaling activity of the group failed (each once).
    /// `reason` is Auto Scaling's status message: AWS's text, not kprov's.
    Failed {
        /// The instance group's name.
        group: String,
        /// Auto Scaling's status message for the activity.
        reason: UntrustedText,
    },
    /// Every group had its instances, after waiting this long (sent only when it waited).
    Launched {
        /// How long the wait took.
        waited: Duration,
    },
}

/// A group still short of its desired capacity when the wait ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Short {
    /// The instance group's name.
    pub group: String,
    /// Its instances running with an address when the wait ended.
    pub ready: usize,
    pub(crate) desired: usize,
    /// The last failed scaling activity's reason, if any.
    pub last_failure: Option<UntrustedText>,
}

/// Waits (at most `limit`, polling from `poll` with back-off to 10 s) until each of the
/// cluster's groups among `groups` runs its desired capacity of instances with addresses.
/// Returns the groups still short at the limit (empty: all launched).
pub async fn wait_for_launches(
    cloud: &AwsCloud,
    groups: &[InstanceGroup],
    reach: SshReach,
    limit: Duration,
    poll: Duration,
    on_event: &(dyn Fn(LaunchEvent) + Send + Sync),
) -> Result<Vec<Short>, CloudError> {
    let start = Instant::now();
    // Failed activities from before this run are history, not news.
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64 - 600)
        .unwrap_or(0);
    let wanted: BTreeSet<String> = groups
        .iter()
        .map(|g| format!("{}.{}", g.metadata.name, cloud.cluster))
        .collect();
    let found = AwsInstances::new(cloud, groups, reach);
    let mut told: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures_told: BTreeSet<String> = BTreeSet::new();
    let mut last_failure: BTreeMap<String, UntrustedText> = BTreeMap::new();
    let mut delay = poll;
    loop {
        let desired = super::asg::desired_capacities(cloud).await?;
        let instances = found.instances().await?;
        let mut short = Vec::new();
        for (group, want) in desired.iter().filter(|(g, _)| wanted.contains(*g)) {
            let ready = instances
                .iter()
                .filter(|i| &i.asg == group && !i.private_ip.is_empty())
                .filter(|i| reach != SshReach::Public || i.public_ip.is_some())
                .count();
            if told.get(group) != Some(&ready) && (ready < *want || told.contains_key(group)) {
                on_event(LaunchEvent::Waiting {
                    group: group.clone(),
                    ready,
                    desired: *want,
                });
            }
            told.insert(group.clone(), ready);
            if ready < *want {
                for f in super::asg::failed_launches(cloud, group, since).await? {
                    let reason = UntrustedText::new(f.reason);
                    last_failure.insert(group.clone(), reason.clone());
                    if failures_told.insert(f.activity.clone()) {
                        on_event(LaunchEvent::Failed {
                            group: group.clone(),
                            reason,
                        });
                    }
                }
                short.push(Short {
                    group: group.clone(),
                    ready,
                    desired: *want,
                    last_failure: last_failure.get(group).cloned(),
                });
            }
        }
        let waited = start.elapsed();
        if short.is_empty() {
            if waited >= poll {
                on_event(LaunchEvent::Launched { waited });
            }
            return Ok(short);
        }
        if waited >= limit {
            return Ok(short);
        }
        tokio::time::sleep(delay.min(limit.saturating_sub(waited))).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}
