//! An elastic IP: the public address a zone's NAT gateway holds.

use aws_sdk_ec2::types::{DomainType, ResourceType};

use super::{Apply, Created, Head, Task};
use crate::cloud::aws::ec2::tag_spec;
use crate::cloud::aws::kinds::{AwsKind, Ec2Kind};
use crate::cloud::engine::{CloudError, CloudId};

task! {
    struct ElasticIp: AwsKind::Ec2(Ec2Kind::ElasticIp), listed aws_sdk_ec2::types::Address as a;
    /// `vpc` for every address kprov allocates (EC2-Classic's `standard` is gone).
    domain: String = DOMAIN("domain")
        // An address listed without its domain is a VPC one: the only kind left.
        <- a.domain().map_or("vpc", |d| d.as_str()).to_string();
}

impl ElasticIp {
    /// The address a NAT gateway needs.
    pub(crate) fn vpc(head: Head) -> ElasticIp {
        ElasticIp {
            head,
            domain: "vpc".into(),
        }
    }
}

impl Task for ElasticIp {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        a.ec2
            .allocate_address()
            .domain(DomainType::from(self.domain.as_str()))
            .tag_specifications(tag_spec(a.c, ResourceType::ElasticIp, &self.id(), &[]))
            .send()
            .await
            .created(self, "AllocateAddress", |out| out.allocation_id())
    }
}

delete_by_id!(ElasticIp: ec2.release_address().allocation_id, "ReleaseAddress");
