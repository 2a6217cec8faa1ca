//! An Auto Scaling group, one per instance group, launching the group's template in its
//! subnets. Its name is fixed once made; the template, the sizes and the subnets change in
//! place (one UpdateAutoScalingGroup), the target groups by attaching and detaching, the role
//! tag by rewriting the tags.
//!
//! The desired capacity belongs to whoever scales the group within the spec's bounds (a
//! cluster-autoscaler, an operator): the read reports the spec's value while the group's is
//! within the spec's [min, max], and an update sends it only when the plan showed it changed,
//! so an autoscaler's decision is never undone. A capacity outside the bounds (a rolling
//! update's surge left by an interrupted roll) is a change the plan shows and `update` puts
//! back.

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_autoscaling::types::{LaunchTemplateSpecification, Tag};

use super::{
    Apply, Delete, Done, Fields, Head, LaunchTemplate, Read, Ref, Subnet, TargetGroup, Task,
    changed, resolve_all,
};
use crate::cloud::aws::asg::tag_pairs;
use crate::cloud::aws::kinds::AwsKind;
use crate::cloud::aws::{AwsCloud, Ctx, Reader, id_from};
use crate::cloud::engine::{CloudError, CloudId, FieldChange, IdMap};

/// The fields one UpdateAutoScalingGroup sets.
const GROUP_FIELDS: [&str; 6] = [
    LAUNCH_TEMPLATE,
    LAUNCH_TEMPLATE_VERSION,
    MIN_SIZE,
    MAX_SIZE,
    DESIRED_CAPACITY,
    SUBNETS,
];

/// The tag holding the instance group's role (propagated to its instances).
const TAG_ROLE: &str = "kprov.dev/role";

task! {
    struct AutoScalingGroup: AwsKind::AutoScalingGroup;
    /// `IG.CLUSTER`: its cloud ID.
    group_name: String = GROUP_NAME("groupName"), Immutable;
    launch_template: Ref<LaunchTemplate> = LAUNCH_TEMPLATE("launchTemplate");
    /// `$Latest` on a desired group: a new template version is what the group launches next.
    launch_template_version: String = LAUNCH_TEMPLATE_VERSION("launchTemplateVersion");
    min_size: i64 = MIN_SIZE("minSize");
    max_size: i64 = MAX_SIZE("maxSize");
    /// The spec's minimum on a desired group; on a read one, see the module doc.
    desired_capacity: i64 = DESIRED_CAPACITY("desiredCapacity");
    subnets: Vec<Ref<Subnet>> = SUBNETS("subnets");
    target_groups: Vec<Ref<TargetGroup>> = TARGET_GROUPS("targetGroups");
    /// The instance group's role (`ControlPlane`, `Node`, `Bastion`), as a tag.
    role: String = ROLE("role");
}

impl Read for AutoScalingGroup {
    type Listed = aws_sdk_autoscaling::types::AutoScalingGroup;

    fn read(head: Head, g: &Self::Listed, rd: &Reader<'_>) -> Self {
        let lt = g.launch_template();
        let role = tag_pairs(g)
            .find(|(k, _)| *k == TAG_ROLE)
            .map(|(_, v)| v)
            // why: a group without the role tag reads as no role, which the diff shows
            .unwrap_or_default();
        let subnets = Ref::read_all(
            rd,
            g.vpc_zone_identifier()
                // why: a group without subnets lists none
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty()),
        );
        let desired = i64::from(g.desired_capacity().unwrap_or(0));
        let mut read = AutoScalingGroup {
            // why: a group is listed by its name (`asg::assemble` skips one without)
            group_name: g.auto_scaling_group_name().unwrap_or_default().to_string(),
            launch_template: Ref::read_or_empty(rd, lt.and_then(|l| l.launch_template_id())),
            // why: a field the cloud left out reads as empty, which the diff shows as a change
            launch_template_version: lt.and_then(|l| l.version()).unwrap_or_default().to_string(),
            min_size: g.min_size().unwrap_or(0).into(),
            max_size: g.max_size().unwrap_or(0).into(),
            desired_capacity: desired,
            subnets,
            target_groups: Ref::read_all(rd, g.target_group_arns()),
            role: role.to_string(),
            head,
        };
        let want = rd.desired.iter().find(|r| r.id == read.id());
        // A desired group that does not decode has no bounds to judge by: the group's own
        // value stands (apply refuses that desired group, naming its field).
        if let Some(w) = want.and_then(|w| Self::from_resource(w).ok())
            && (w.min_size..=w.max_size).contains(&desired)
        {
            read.desired_capacity = w.desired_capacity;
        }
        read
    }
}

impl Task for AutoScalingGroup {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        let name = &self.group_name;
        a.asg
            .create_auto_scaling_group()
            .auto_scaling_group_name(name)
            .launch_template(self.template(a.ids)?)
            .min_size(self.size(MIN_SIZE, self.min_size)?)
            .max_size(self.size(MAX_SIZE, self.max_size)?)
            .desired_capacity(self.size(DESIRED_CAPACITY, self.desired_capacity)?)
            .vpc_zone_identifier(resolve_all(&self.subnets, a.ids)?.join(","))
            .set_target_group_arns(Some(resolve_all(&self.target_groups, a.ids)?))
            .set_tags(Some(self.tags(a.c, name)))
            .send()
            .await
            .ctx("CreateAutoScalingGroup")?;
        id_from(&self.id(), &format!("field {GROUP_NAME}"), name)
    }

    async fn update(&self, have: &Self, changes: &[FieldChange], a: Apply<'_>) -> Done {
        let name = have.cloud_id()?;
        if GROUP_FIELDS.iter().any(|f| changed(changes, f)) {
            a.asg
                .update_auto_scaling_group()
                .auto_scaling_group_name(name)
                .launch_template(self.template(a.ids)?)
                .min_size(self.size(MIN_SIZE, self.min_size)?)
                .max_size(self.size(MAX_SIZE, self.max_size)?)
                // Only when out of bounds (see `read`): never undo an autoscaler's decision.
                .set_desired_capacity(
                    changed(changes, DESIRED_CAPACITY)
                        .then(|| self.size(DESIRED_CAPACITY, self.desired_capacity))
                        .transpose()?,
                )
                .vpc_zone_identifier(resolve_all(&self.subnets, a.ids)?.join(","))
                .send()
                .await
                .ctx("UpdateAutoScalingGroup")?;
        }
        if changed(changes, TARGET_GROUPS) {
            let want: BTreeSet<String> = resolve_all(&self.target_groups, a.ids)?
                .into_iter()
                .collect();
            let have: BTreeSet<String> = resolve_all(&have.target_groups, a.ids)?
                .into_iter()
                .collect();
            let add: Vec<String> = want.difference(&have).cloned().collect();
            let remove: Vec<String> = have.difference(&want).cloned().collect();
            if !add.is_empty() {
                a.asg
                    .attach_load_balancer_target_groups()
                    .auto_scaling_group_name(name)
                    .set_target_group_arns(Some(add))
                    .send()
                    .await
                    .ctx("AttachLoadBalancerTargetGroups")?;
            }
            if !remove.is_empty() {
                a.asg
                    .detach_load_balancer_target_groups()
                    .auto_scaling_group_name(name)
                    .set_target_group_arns(Some(remove))
                    .send()
                    .await
                    .ctx("DetachLoadBalancerTargetGroups")?;
            }
        }
        if changed(changes, ROLE) {
            a.asg
                .create_or_update_tags()
                .set_tags(Some(self.tags(a.c, name)))
                .send()
                .await
                .ctx("CreateOrUpdateTags")?;
        }
        Ok(())
    }
}

impl Delete for AutoScalingGroup {
    async fn delete(&self, a: Apply<'_>) -> Done {
        let name = self.cloud_id()?;
        let r = a
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
        // backing off (terminations take minutes on AWS; a throttled describe fails this
        // delete, which the engine retries, and the group is then found already deleting).
        let mut delay = Duration::from_secs(1);
        loop {
            let out = a
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
            // The group is there and the delete was refused: not a "not found", unless the
            // group is already being deleted (a retried delete after a throttled describe: AWS
            // refuses calls on a group pending delete with the same code), which this call
            // waits out.
            if let Some(e) = refused.take()
                && !groups.iter().any(|g| already_deleting(g.status()))
            {
                return Err(e);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
    }
}

impl AutoScalingGroup {
    /// The template and version the group launches.
    fn template(&self, ids: &IdMap) -> Result<LaunchTemplateSpecification, CloudError> {
        Ok(LaunchTemplateSpecification::builder()
            .launch_template_id(self.launch_template.resolve(ids)?)
            .version(&self.launch_template_version)
            .build())
    }

    /// A size as Auto Scaling takes it; one beyond its range is a model error naming the field.
    pub(super) fn size(&self, field: &str, v: i64) -> Result<i32, CloudError> {
        i32::try_from(v).map_err(|_| {
            CloudError::Model(format!("{}: field {field}: {v} is out of range", self.id()))
        })
    }

    /// The standard tags and the role, propagated to the group's instances.
    fn tags(&self, c: &AwsCloud, name: &str) -> Vec<Tag> {
        let id = self.id();
        let display = format!("{}.{}", id.name, c.cluster);
        c.tags(&id, &display)
            .into_iter()
            .chain([(TAG_ROLE.to_string(), self.role.clone())])
            .map(|(k, v)| {
                Tag::builder()
                    .resource_id(name)
                    .resource_type("auto-scaling-group")
                    .key(k)
                    .value(v)
                    .propagate_at_launch(true)
                    .build()
            })
            .collect()
    }
}

/// Whether an Auto Scaling group's `Status` says a delete is under way (AWS sets
/// "Delete in progress" on a group being deleted and leaves it unset otherwise).
pub(super) fn already_deleting(status: Option<&str>) -> bool {
    status.is_some_and(|s| s.eq_ignore_ascii_case("Delete in progress"))
}
