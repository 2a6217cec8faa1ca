//! Auto Scaling groups, one per instance group, on the group's launch template.

use aws_sdk_autoscaling::types::Filter;

use super::kinds::*;
use super::tasks::{AutoScalingGroup, Fields, Head, Read};
use super::{AwsCloud, Ctx, Reader, id_from_tags, owned_by};
use crate::cloud::engine::CloudError;

pub(super) async fn fetch(
    c: &AwsCloud,
) -> Result<Vec<aws_sdk_autoscaling::types::AutoScalingGroup>, CloudError> {
    all_items!(
        c.asg.describe_auto_scaling_groups().filters(
            Filter::builder()
                .name(format!("tag:{}", super::owned_tag_key(&c.cluster)))
                .values("owned")
                .build(),
        ),
        "DescribeAutoScalingGroups"
    )
}

pub(super) fn assemble(
    c: &AwsCloud,
    groups: Vec<aws_sdk_autoscaling::types::AutoScalingGroup>,
    rd: &mut Reader<'_>,
) {
    for g in groups {
        let Some(name) = rd.listed(AUTOSCALING_GROUP, g.auto_scaling_group_name()) else {
            continue;
        };
        if !owned_by(&c.cluster, tag_pairs(&g)) {
            continue;
        }
        let id = id_from_tags(AUTOSCALING_GROUP, &name, tag_pairs(&g));
        let read = AutoScalingGroup::read(Head::listed(id.name, name), &g, rd);
        rd.push(read.resource());
    }
}

/// The tags of a listed group as key/value pairs.
pub(crate) fn tag_pairs(
    g: &aws_sdk_autoscaling::types::AutoScalingGroup,
) -> impl Iterator<Item = (&str, &str)> {
    g.tags()
        .iter()
        // why: a tag without key or value matches no ownership or identity key
        .map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default()))
}

/// An Auto Scaling group's size (`delete instance` shows what terminating does to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupCapacity {
    /// The fewest instances Auto Scaling keeps running.
    pub min: i32,
    /// The instances Auto Scaling is asked to run now.
    pub desired: i32,
    /// The most instances Auto Scaling may run.
    pub max: i32,
}

impl AwsCloud {
    /// The size of one of the cluster's groups (`NAME.CLUSTER`); an error when it is not the
    /// cluster's.
    pub(crate) async fn group_capacity(&self, asg_name: &str) -> Result<GroupCapacity, CloudError> {
        let out = self
            .asg
            .describe_auto_scaling_groups()
            .auto_scaling_group_names(asg_name)
            .send()
            .await
            .ctx("DescribeAutoScalingGroups")?;
        let g = out
            .auto_scaling_groups()
            .iter()
            .find(|g| owned_by(&self.cluster, tag_pairs(g)))
            .ok_or_else(|| {
                CloudError::verdict(
                    "DescribeAutoScalingGroups",
                    crate::cloud::engine::ErrorClass::Fatal,
                    format!(
                        "no Auto Scaling group {asg_name} owned by cluster {}",
                        self.cluster
                    ),
                )
            })?;
        Ok(GroupCapacity {
            min: g.min_size().unwrap_or(0),
            desired: g.desired_capacity().unwrap_or(0),
            max: g.max_size().unwrap_or(0),
        })
    }

    /// Sets a group's desired capacity, and its maximum when given (a rolling update's surge
    /// launches instances beyond the spec's maximum, then puts it back).
    pub(crate) async fn set_group_size(
        &self,
        asg_name: &str,
        desired: i32,
        max: Option<i32>,
    ) -> Result<(), CloudError> {
        // Owned by this cluster, or an error naming the group.
        self.group_capacity(asg_name).await?;
        self.asg
            .update_auto_scaling_group()
            .auto_scaling_group_name(asg_name)
            .desired_capacity(desired)
            .set_max_size(max)
            .send()
            .await
            .ctx("UpdateAutoScalingGroup")?;
        Ok(())
    }

    /// Terminates an instance through its Auto Scaling group: the group launches a
    /// replacement, or with `decrement` shrinks by one (refused by AWS below the group's
    /// minimum). The caller checks the instance is the cluster's.
    pub(crate) async fn terminate_in_group(
        &self,
        instance_id: &str,
        decrement: bool,
    ) -> Result<(), CloudError> {
        self.asg
            .terminate_instance_in_auto_scaling_group()
            .instance_id(instance_id)
            .should_decrement_desired_capacity(decrement)
            .send()
            .await
            .ctx("TerminateInstanceInAutoScalingGroup")?;
        Ok(())
    }
}

/// The desired capacity of each of the cluster's Auto Scaling groups, by group name (what
/// the group is asked to run now: the spec's, or an autoscaler's within [min, max]).
pub(crate) async fn desired_capacities(
    c: &AwsCloud,
) -> Result<std::collections::BTreeMap<String, usize>, CloudError> {
    let groups = fetch(c).await?;
    Ok(groups
        .iter()
        .filter(|g| owned_by(&c.cluster, tag_pairs(g)))
        .filter_map(|g| {
            Some((
                g.auto_scaling_group_name()?.to_string(),
                usize::try_from(g.desired_capacity().unwrap_or(0)).unwrap_or(0),
            ))
        })
        .collect())
}

/// A scaling activity of a group that failed: an instance Auto Scaling could not launch
/// (an instance profile not usable, a type not offered in the zone, a quota reached).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailedLaunch {
    pub(crate) activity: String,
    /// Auto Scaling's `StatusMessage` (else its description).
    pub(crate) reason: String,
}

/// The group's scaling activities that failed since `since_epoch` (seconds), newest first.
pub(crate) async fn failed_launches(
    c: &AwsCloud,
    group: &str,
    since_epoch: i64,
) -> Result<Vec<FailedLaunch>, CloudError> {
    let out = c
        .asg
        .describe_scaling_activities()
        .auto_scaling_group_name(group)
        .max_records(20)
        .send()
        .await
        .ctx("DescribeScalingActivities")?;
    Ok(out
        .activities()
        .iter()
        .filter(|a| {
            a.status_code() == Some(&aws_sdk_autoscaling::types::ScalingActivityStatusCode::Failed)
        })
        .filter(|a| a.start_time().is_none_or(|t| t.secs() >= since_epoch))
        .map(|a| FailedLaunch {
            // why: shown only, next to the reason
            activity: a.activity_id().unwrap_or_default().to_string(),
            reason: a
                .status_message()
                .or(a.description())
                .unwrap_or("no reason given")
                .to_string(),
        })
        .collect())
}
