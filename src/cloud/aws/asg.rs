//! Auto Scaling groups, one per instance group, on the group's launch template.

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_autoscaling::types::{Filter, LaunchTemplateSpecification, Tag};

use super::kinds::*;
use super::{AwsCloud, Ctx, Reader, cid, cids, cloud_id_of, id_from_tags, owned_by, want_str};
use crate::cloud::engine::{CloudError, CloudId, FieldChange, IdMap, Resource, Value};

const TAG_ROLE: &str = "kprov.dev/role";

pub(super) async fn fetch(
    c: &AwsCloud,
) -> Result<Vec<aws_sdk_autoscaling::types::AutoScalingGroup>, CloudError> {
    c.asg
        .describe_auto_scaling_groups()
        .filters(
            Filter::builder()
                .name(format!("tag:{}", super::owned_tag_key(&c.cluster)))
                .values("owned")
                .build(),
        )
        .into_paginator()
        .items()
        .send()
        .try_collect()
        .await
        .ctx("DescribeAutoScalingGroups")
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
        let tags = || {
            g.tags()
                .iter()
                // why: a tag without key or value matches no ownership or identity key
                .map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default()))
        };
        if !owned_by(&c.cluster, tags()) {
            continue;
        }
        let id = id_from_tags(AUTOSCALING_GROUP, &name, tags());
        let role = tags()
            .find(|(k, _)| *k == TAG_ROLE)
            .map(|(_, v)| v)
            // why: a group without the role tag reads as no role, which the diff shows
            .unwrap_or_default();
        let lt = g.launch_template();
        let subnets = g
            .vpc_zone_identifier()
            // why: a group without subnets lists none
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| rd.r(s))
            .collect();
        let tgs = g.target_group_arns().iter().map(|a| rd.r(a)).collect();
        // why: a reference the cloud left out reads as empty, which the diff shows as a change
        let lt_ref = rd.r(lt.and_then(|l| l.launch_template_id()).unwrap_or_default());
        // The desired capacity belongs to whoever scales the group (a cluster-autoscaler,
        // an operator): any value within the spec's [min, max] counts as matching.
        let mut desired = i64::from(g.desired_capacity().unwrap_or(0));
        if let Some(w) = rd.desired.iter().find(|r| r.id == id) {
            let bound = |f: &str| w.get(f).and_then(Value::as_int);
            if let (Some(min), Some(max), Some(want)) =
                (bound("minSize"), bound("maxSize"), bound("desiredCapacity"))
                && (min..=max).contains(&desired)
            {
                desired = want;
            }
        }
        rd.push(
            Resource::new(AUTOSCALING_GROUP, id.name)
                .cloud_id(name.clone())
                .field("groupName", Value::str(name.as_str()))
                .field("launchTemplate", lt_ref)
                .field(
                    "launchTemplateVersion",
                    // why: a field the cloud left out reads as empty, which the diff shows as a change
                    Value::str(lt.and_then(|l| l.version()).unwrap_or_default()),
                )
                .field("minSize", Value::Int(g.min_size().unwrap_or(0).into()))
                .field("maxSize", Value::Int(g.max_size().unwrap_or(0).into()))
                .field("desiredCapacity", Value::Int(desired))
                .field("subnets", Value::set(subnets))
                .field("targetGroups", Value::set(tgs))
                .field("role", Value::str(role)),
        );
    }
}

fn int(r: &Resource, f: &str) -> i32 {
    r.get(f).and_then(Value::as_int).unwrap_or(0) as i32
}

fn template(want: &Resource, ids: &IdMap) -> Result<LaunchTemplateSpecification, CloudError> {
    Ok(LaunchTemplateSpecification::builder()
        .launch_template_id(cid(ids, want.get("launchTemplate"))?)
        .version(want.get_str("launchTemplateVersion").unwrap_or("$Latest"))
        .build())
}

fn tags(c: &AwsCloud, want: &Resource, name: &str) -> Result<Vec<Tag>, CloudError> {
    let role = want_str(want, "role")?;
    let display = format!("{}.{}", want.id.name, c.cluster);
    let tags = c
        .tags(&want.id, &display)
        .into_iter()
        .chain([(TAG_ROLE.to_string(), role.to_string())])
        .map(|(k, v)| {
            Tag::builder()
                .resource_id(name)
                .resource_type("auto-scaling-group")
                .key(k)
                .value(v)
                .propagate_at_launch(true)
                .build()
        })
        .collect();
    Ok(tags)
}

pub(super) async fn create(
    c: &AwsCloud,
    want: &Resource,
    ids: &IdMap,
) -> Result<CloudId, CloudError> {
    let name = want_str(want, "groupName")?.to_string();
    c.asg
        .create_auto_scaling_group()
        .auto_scaling_group_name(&name)
        .launch_template(template(want, ids)?)
        .min_size(int(want, "minSize"))
        .max_size(int(want, "maxSize"))
        .desired_capacity(int(want, "desiredCapacity"))
        .vpc_zone_identifier(cids(ids, want.get("subnets"))?.join(","))
        .set_target_group_arns(Some(cids(ids, want.get("targetGroups"))?))
        .set_tags(Some(tags(c, want, &name)?))
        .send()
        .await
        .ctx("CreateAutoScalingGroup")?;
    super::id_from(&want.id, "field groupName", &name)
}

pub(super) async fn update(
    c: &AwsCloud,
    want: &Resource,
    have: &Resource,
    changes: &[FieldChange],
    ids: &IdMap,
) -> Result<(), CloudError> {
    let name = cloud_id_of(have)?;
    let group_fields = [
        "launchTemplate",
        "launchTemplateVersion",
        "minSize",
        "maxSize",
        "desiredCapacity",
        "subnets",
    ];
    if changes
        .iter()
        .any(|ch| group_fields.contains(&ch.field.as_str()))
    {
        c.asg
            .update_auto_scaling_group()
            .auto_scaling_group_name(name)
            .launch_template(template(want, ids)?)
            .min_size(int(want, "minSize"))
            .max_size(int(want, "maxSize"))
            // Only when out of bounds (see `read`): never undo an autoscaler's decision.
            .set_desired_capacity(
                changes
                    .iter()
                    .any(|ch| ch.field == "desiredCapacity")
                    .then(|| int(want, "desiredCapacity")),
            )
            .vpc_zone_identifier(cids(ids, want.get("subnets"))?.join(","))
            .send()
            .await
            .ctx("UpdateAutoScalingGroup")?;
    }
    if changes.iter().any(|ch| ch.field == "targetGroups") {
        let want_tg: BTreeSet<String> = cids(ids, want.get("targetGroups"))?.into_iter().collect();
        let have_tg: BTreeSet<String> = cids(ids, have.get("targetGroups"))?.into_iter().collect();
        let add: Vec<String> = want_tg.difference(&have_tg).cloned().collect();
        let remove: Vec<String> = have_tg.difference(&want_tg).cloned().collect();
        if !add.is_empty() {
            c.asg
                .attach_load_balancer_target_groups()
                .auto_scaling_group_name(name)
                .set_target_group_arns(Some(add))
                .send()
                .await
                .ctx("AttachLoadBalancerTargetGroups")?;
        }
        if !remove.is_empty() {
            c.asg
                .detach_load_balancer_target_groups()
                .auto_scaling_group_name(name)
                .set_target_group_arns(Some(remove))
                .send()
                .await
                .ctx("DetachLoadBalancerTargetGroups")?;
        }
    }
    if changes.iter().any(|ch| ch.field == "role") {
        c.asg
            .create_or_update_tags()
            .set_tags(Some(tags(c, want, name)?))
            .send()
            .await
            .ctx("CreateOrUpdateTags")?;
    }
    Ok(())
}

pub(super) async fn delete(c: &AwsCloud, have: &Resource) -> Result<(), CloudError> {
    let name = cloud_id_of(have)?;
    let r = c
        .asg
        .delete_auto_scaling_group()
        .auto_scaling_group_name(name)
        .force_delete(true)
        .send()
        .await
        .ctx("DeleteAutoScalingGroup");
    // Auto Scaling answers a missing group with a plain `ValidationError` ("AutoScalingGroup
    // name not found"), a code it also gives bad input: whether the group is gone is asked
    // below (an empty describe), never read from the message.
    let mut refused = match r {
        Ok(_) => None,
        Err(e) if e.code() == Some("ValidationError") => Some(e),
        Err(e) => return Err(e),
    };
    // Its instances hold the subnets and security groups: wait until the group is gone,
    // backing off (terminations take minutes on AWS; a throttled describe fails this delete,
    // which the engine retries, and the group is then found already deleting).
    let mut delay = Duration::from_secs(1);
    loop {
        let out = c
            .asg
            .describe_auto_scaling_groups()
            .auto_scaling_group_names(name)
            .send()
            .await
            .ctx("DescribeAutoScalingGroups")?;
        let groups = out.auto_scaling_groups();
        if groups.is_empty() {
            return Ok(());
        }
        // The group is there and the delete was refused: not a "not found", unless the group
        // is already being deleted (a retried delete after a throttled describe: AWS refuses
        // calls on a group pending delete with the same code), which this call waits out.
        if let Some(e) = refused.take()
            && !groups.iter().any(|g| already_deleting(g.status()))
        {
            return Err(e);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

/// Whether an Auto Scaling group's `Status` says a delete is under way (AWS sets
/// "Delete in progress" on a group being deleted and leaves it unset otherwise).
fn already_deleting(status: Option<&str>) -> bool {
    status.is_some_and(|s| s.eq_ignore_ascii_case("Delete in progress"))
}

/// An Auto Scaling group's size (`delete instance` shows what terminating does to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupCapacity {
    pub min: i32,
    pub desired: i32,
    pub max: i32,
}

impl AwsCloud {
    /// The size of one of the cluster's groups (`NAME.CLUSTER`); an error when it is not the
    /// cluster's.
    pub async fn group_capacity(&self, asg_name: &str) -> Result<GroupCapacity, CloudError> {
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
            .find(|g| {
                owned_by(
                    &self.cluster,
                    g.tags()
                        .iter()
                        // why: a tag without key or value matches no ownership or identity key
                        .map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default())),
                )
            })
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
    pub async fn set_group_size(
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
    pub async fn terminate_in_group(
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
    let groups: Vec<_> = c
        .asg
        .describe_auto_scaling_groups()
        .filters(
            Filter::builder()
                .name(format!("tag:{}", super::owned_tag_key(&c.cluster)))
                .values("owned")
                .build(),
        )
        .into_paginator()
        .items()
        .send()
        .try_collect()
        .await
        .ctx("DescribeAutoScalingGroups")?;
    Ok(groups
        .iter()
        .filter(|g| {
            owned_by(
                &c.cluster,
                g.tags()
                    .iter()
                    // why: a tag without key or value matches no ownership or identity key
                    .map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default())),
            )
        })
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
    pub activity: String,
    /// Auto Scaling's `StatusMessage` (else its description).
    pub reason: String,
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

#[cfg(test)]
mod tests {
    use super::already_deleting;

    /// A delete refused on a group already being deleted waits for it instead of failing
    /// (`delete cluster` retried after a throttled describe); any other status is a refusal.
    #[test]
    fn a_group_pending_delete_is_waited_for_not_refused() {
        assert!(already_deleting(Some("Delete in progress")));
        assert!(!already_deleting(None));
        assert!(!already_deleting(Some("")));
        assert!(!already_deleting(Some("InService")));
    }
}
