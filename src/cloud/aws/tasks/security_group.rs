//! A security group: its VPC, name and description, all fixed once made. Its ingress rules
//! are a kind of their own (`SecurityGroupRules`): groups admit each other, so every
//! group must exist before any rule names one.

use aws_sdk_ec2::types::ResourceType;

use super::{Apply, Created, Ref, Task, Vpc};
use crate::cloud::aws::ec2::tag_spec;
use crate::cloud::aws::kinds::{AwsKind, Ec2Kind};
use crate::cloud::engine::{CloudError, CloudId};

task! {
    struct SecurityGroup: AwsKind::Ec2(Ec2Kind::SecurityGroup),
        listed aws_sdk_ec2::types::SecurityGroup as g, rd;
    vpc: Ref<Vpc> = VPC("vpc"), Immutable <- Ref::read_or_empty(rd, g.vpc_id());
    group_name: String = GROUP_NAME("groupName"), Immutable
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        <- g.group_name().unwrap_or_default().to_string();
    description: String = DESCRIPTION("description"), Immutable
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        <- g.description().unwrap_or_default().to_string();
}

impl Task for SecurityGroup {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        a.ec2
            .create_security_group()
            .group_name(&self.group_name)
            .description(&self.description)
            .vpc_id(self.vpc.resolve(a.ids)?)
            .tag_specifications(tag_spec(a.c, ResourceType::SecurityGroup, &self.id(), &[]))
            .send()
            .await
            .created(self, "CreateSecurityGroup", |out| out.group_id())
    }
}

delete_by_id!(SecurityGroup: ec2.delete_security_group().group_id, "DeleteSecurityGroup");
