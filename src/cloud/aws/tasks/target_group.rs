//! A load balancer's target group (TCP, instance targets): its name, port, protocol and VPC
//! are fixed once made; the attributes kprov manages (client IP preservation, deregistration
//! delay) are set in place.

use std::collections::BTreeMap;

use aws_sdk_elasticloadbalancingv2::types::{ProtocolEnum, TargetGroupAttribute, TargetTypeEnum};

use super::{Apply, Created, Done, Ref, Task, Vpc, cannot_change};
use crate::cloud::aws::elb::{port, tags};
use crate::cloud::aws::kinds::{AwsKind, ElbKind};
use crate::cloud::aws::{AwsCloud, Ctx, finish_create};
use crate::cloud::engine::{CloudError, CloudId, FieldChange};

/// The attributes' keys in ELB's API.
const ATTR_PRESERVE_CLIENT_IP: &str = "preserve_client_ip.enabled";
const ATTR_DEREGISTRATION_DELAY: &str = "deregistration_delay.timeout_seconds";

task! {
    struct TargetGroup: AwsKind::Elb(ElbKind::TargetGroup), listed ListedTargetGroup as l, rd;
    tg_name: String = TG_NAME("tgName"), Immutable
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        <- l.group.target_group_name().unwrap_or_default().to_string();
    port: i64 = PORT("port"), Immutable <- l.group.port().unwrap_or(0).into();
    protocol: String = PROTOCOL("protocol"), Immutable
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        <- l.group.protocol().map(|p| p.as_str()).unwrap_or_default().to_string();
    vpc: Ref<Vpc> = VPC("vpc"), Immutable <- Ref::read_or_empty(rd, l.group.vpc_id());
    /// Whether the targets see the client's address (AWS's default for instance targets).
    preserve_client_ip: bool = PRESERVE_CLIENT_IP("preserveClientIp")
        // Absent means AWS's default: client IPs preserved (instance targets).
        <- l.attributes
            .get(ATTR_PRESERVE_CLIENT_IP)
            .is_none_or(|v| v.eq_ignore_ascii_case("true"));
    /// Seconds a deregistered target drains.
    deregistration_delay: i64 = DEREGISTRATION_DELAY("deregistrationDelay")
        // Absent means AWS's default, 300 s.
        <- l.attributes
            .get(ATTR_DEREGISTRATION_DELAY)
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(300);
}

/// A target group as listed, with its attributes (key → value).
pub(crate) struct ListedTargetGroup {
    pub(crate) group: aws_sdk_elasticloadbalancingv2::types::TargetGroup,
    pub(crate) attributes: BTreeMap<String, String>,
}

impl Task for TargetGroup {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        let id = self.id();
        let arn = a
            .elb
            .create_target_group()
            .name(&self.tg_name)
            .protocol(ProtocolEnum::from(self.protocol.as_str()))
            .port(port(&id, self.port)?)
            .vpc_id(self.vpc.resolve(a.ids)?)
            .target_type(TargetTypeEnum::Instance)
            .health_check_protocol(ProtocolEnum::Tcp)
            .set_tags(Some(tags(a.c, &id)))
            .send()
            .await
            .created(self, "CreateTargetGroup", |out| {
                out.target_groups()
                    .first()
                    .and_then(|t| t.target_group_arn())
            })?;
        finish_create(|| self.set_attributes(a.c, &arn)).await?;
        Ok(arn)
    }

    async fn update(&self, have: &Self, changes: &[FieldChange], a: Apply<'_>) -> Done {
        if changes
            .iter()
            .any(|ch| ![PRESERVE_CLIENT_IP, DEREGISTRATION_DELAY].contains(&ch.field.as_str()))
        {
            return Err(cannot_change(&self.id(), changes));
        }
        self.set_attributes(a.c, have.cloud_id()?).await
    }
}

delete_by_id!(TargetGroup: elb.delete_target_group().target_group_arn, "DeleteTargetGroup");

impl TargetGroup {
    /// Sets the attributes kprov manages on the target group `arn`.
    async fn set_attributes(&self, c: &AwsCloud, arn: &str) -> Result<(), CloudError> {
        let attr = |k: &str, v: String| TargetGroupAttribute::builder().key(k).value(v).build();
        c.elb
            .modify_target_group_attributes()
            .target_group_arn(arn)
            .attributes(attr(
                ATTR_PRESERVE_CLIENT_IP,
                self.preserve_client_ip.to_string(),
            ))
            .attributes(attr(
                ATTR_DEREGISTRATION_DELAY,
                self.deregistration_delay.to_string(),
            ))
            .send()
            .await
            .ctx("ModifyTargetGroupAttributes")?;
        Ok(())
    }
}
