//! A subnet: its VPC, zone and CIDR (fixed once created) and whether instances launched in it
//! get a public address.

use aws_sdk_ec2::types::{AttributeBooleanValue, ResourceType};

use super::{Apply, Created, Done, Ref, Task, Vpc, cannot_change, changed};
use crate::cloud::aws::ec2::tag_spec;
use crate::cloud::aws::kinds::{AwsKind, Ec2Kind};
use crate::cloud::aws::{AwsCloud, Ctx, finish_create};
use crate::cloud::engine::{CloudError, CloudId, FieldChange};

task! {
    struct Subnet: AwsKind::Ec2(Ec2Kind::Subnet), listed aws_sdk_ec2::types::Subnet as s, rd;
    vpc: Ref<Vpc> = VPC("vpc"), Immutable <- Ref::read_or_empty(rd, s.vpc_id());
    zone: String = ZONE("zone"), Immutable
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        <- s.availability_zone().unwrap_or_default().to_string();
    cidr: String = CIDR("cidr"), Immutable
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        <- s.cidr_block().unwrap_or_default().to_string();
    /// A public subnet (and a utility one): instances get a public address, and the subnet is
    /// tagged for internet-facing load balancers (internal ones otherwise).
    map_public_ip: bool = MAP_PUBLIC_IP("mapPublicIp")
        // EC2's default for a new subnet.
        <- s.map_public_ip_on_launch().unwrap_or(false);
}

impl Task for Subnet {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        let id = self.id();
        let role = if self.map_public_ip {
            "kubernetes.io/role/elb"
        } else {
            "kubernetes.io/role/internal-elb"
        };
        let sid = a
            .ec2
            .create_subnet()
            .vpc_id(self.vpc.resolve(a.ids)?)
            .cidr_block(&self.cidr)
            .availability_zone(&self.zone)
            .tag_specifications(tag_spec(a.c, ResourceType::Subnet, &id, &[(role, "1")]))
            .send()
            .await
            .created(self, "CreateSubnet", |out| {
                out.subnet().and_then(|v| v.subnet_id())
            })?;
        if self.map_public_ip {
            finish_create(|| set_map_public_ip(a.c, &sid, true)).await?;
        }
        Ok(sid)
    }

    async fn update(&self, have: &Self, changes: &[FieldChange], a: Apply<'_>) -> Done {
        if !changed(changes, MAP_PUBLIC_IP) {
            return Err(cannot_change(&self.id(), changes));
        }
        set_map_public_ip(a.c, have.cloud_id()?, self.map_public_ip).await
    }
}

delete_by_id!(Subnet: ec2.delete_subnet().subnet_id, "DeleteSubnet");

async fn set_map_public_ip(c: &AwsCloud, sid: &str, on: bool) -> Result<(), CloudError> {
    c.ec2
        .modify_subnet_attribute()
        .subnet_id(sid)
        .map_public_ip_on_launch(AttributeBooleanValue::builder().value(on).build())
        .send()
        .await
        .ctx("ModifySubnetAttribute")?;
    Ok(())
}
