//! A Classic ELB the cluster's cloud-controller-manager made for a Service (see `clb.rs`):
//! read so that `delete cluster` removes it before the subnets, security groups and VPC it
//! holds (its references order that delete); kprov never makes or changes one. ELB names a
//! Classic load balancer by its name: that is its cloud ID.

use super::{Apply, Ref, SecurityGroup, Subnet, Task, Vpc, never_created};
use crate::cloud::aws::kinds::AwsKind;
use crate::cloud::engine::{CloudError, CloudId};

task! {
    struct ClassicLoadBalancer: AwsKind::ClassicLoadBalancer,
        listed aws_sdk_elasticloadbalancing::types::LoadBalancerDescription as l, rd;
    vpc: Ref<Vpc> = VPC("vpc") <- Ref::read_or_empty(rd, l.vpc_id());
    subnets: Vec<Ref<Subnet>> = SUBNETS("subnets") <- Ref::read_all(rd, l.subnets());
    security_groups: Vec<Ref<SecurityGroup>> = SECURITY_GROUPS("securityGroups")
        <- Ref::read_all(rd, l.security_groups());
    /// Lower case.
    dns_name: String = DNS_NAME("dnsName")
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        <- l.dns_name().unwrap_or_default().to_lowercase();
}

impl Task for ClassicLoadBalancer {
    /// Never reached: the provider refuses to create one before decoding it.
    async fn create(&self, _: Apply<'_>) -> Result<CloudId, CloudError> {
        Err(never_created(self))
    }
}

delete_by_id!(
    ClassicLoadBalancer: clb.delete_load_balancer().load_balancer_name,
    "DeleteLoadBalancer (Classic)"
);
