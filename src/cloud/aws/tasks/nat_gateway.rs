//! A zone's NAT gateway: in the zone's utility subnet, holding its elastic IP; the private
//! route table of the zone routes through it.

use aws_sdk_ec2::types::ResourceType;

use super::{Apply, Created, Delete, Done, ElasticIp, Ref, Subnet, Task, gone};
use crate::cloud::aws::after_create;
use crate::cloud::aws::ec2::{tag_spec, wait_nat};
use crate::cloud::aws::kinds::{AwsKind, Ec2Kind};
use crate::cloud::engine::{CloudError, CloudId};

task! {
    struct NatGateway: AwsKind::Ec2(Ec2Kind::NatGateway),
        listed aws_sdk_ec2::types::NatGateway as n, rd;
    subnet: Ref<Subnet> = SUBNET("subnet"), Immutable <- Ref::read_or_empty(rd, n.subnet_id());
    allocation: Ref<ElasticIp> = ALLOCATION("allocation"), Immutable
        <- Ref::read_or_empty(
            rd,
            // why: a NAT gateway without its address reads as none, which the diff shows
            n.nat_gateway_addresses().iter().find_map(|a| a.allocation_id()),
        );
}

impl Task for NatGateway {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        let nid = a
            .ec2
            .create_nat_gateway()
            .subnet_id(self.subnet.resolve(a.ids)?)
            .allocation_id(self.allocation.resolve(a.ids)?)
            .tag_specifications(tag_spec(a.c, ResourceType::Natgateway, &self.id(), &[]))
            .send()
            .await
            .created(self, "CreateNatGateway", |out| {
                out.nat_gateway().and_then(|n| n.nat_gateway_id())
            })?;
        wait_nat(a.c, &nid, false).await.map_err(after_create)?;
        Ok(nid)
    }
}

impl Delete for NatGateway {
    async fn delete(&self, a: Apply<'_>) -> Done {
        let nid = self.cloud_id()?;
        gone(
            a.ec2.delete_nat_gateway().nat_gateway_id(nid).send(),
            "DeleteNatGateway",
        )
        .await?;
        // Its elastic IP can only be released once it is gone.
        wait_nat(a.c, nid, true).await
    }
}
