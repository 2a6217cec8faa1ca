//! A network load balancer (the API's, the bastion's): its name, scheme and security groups
//! are fixed once made, its subnets are set in place. Its DNS name and hosted zone are read
//! only: clients and Route53 aliases find the load balancer by them.

use aws_sdk_elasticloadbalancingv2::types::{LoadBalancerSchemeEnum, LoadBalancerTypeEnum};

use super::{Apply, Created, Done, Ref, SecurityGroup, Subnet, Task, cannot_change, resolve_all};
use crate::cloud::aws::Ctx;
use crate::cloud::aws::elb::tags;
use crate::cloud::aws::kinds::{AwsKind, ElbKind};
use crate::cloud::engine::{CloudError, CloudId, FieldChange};

task! {
    struct LoadBalancer: AwsKind::Elb(ElbKind::LoadBalancer),
        listed aws_sdk_elasticloadbalancingv2::types::LoadBalancer as l, rd;
    lb_name: String = LB_NAME("lbName"), Immutable
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        <- l.load_balancer_name().unwrap_or_default().to_string();
    /// `internet-facing` or `internal`.
    scheme: String = SCHEME("scheme"), Immutable
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        <- l.scheme().map(|s| s.as_str()).unwrap_or_default().to_string();
    subnets: Vec<Ref<Subnet>> = SUBNETS("subnets")
        <- Ref::read_all(rd, l.availability_zones().iter().filter_map(|z| z.subnet_id()));
    security_groups: Vec<Ref<SecurityGroup>> = SECURITY_GROUPS("securityGroups"), Immutable
        <- Ref::read_all(rd, l.security_groups());
    /// Read only (the desired model has none): clients find the API by it. Lower case,
    /// without the trailing dot.
    dns_name: Option<String> = DNS_NAME("dnsName")
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        <- Some(l.dns_name().unwrap_or_default().trim_end_matches('.').to_lowercase());
    canonical_zone: Option<String> = CANONICAL_ZONE("canonicalZone")
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        <- Some(l.canonical_hosted_zone_id().unwrap_or_default().to_string());
}

impl Task for LoadBalancer {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        a.elb
            .create_load_balancer()
            .name(&self.lb_name)
            .r#type(LoadBalancerTypeEnum::Network)
            .scheme(LoadBalancerSchemeEnum::from(self.scheme.as_str()))
            .set_subnets(Some(resolve_all(&self.subnets, a.ids)?))
            .set_security_groups(Some(resolve_all(&self.security_groups, a.ids)?))
            .set_tags(Some(tags(a.c, &self.id())))
            .send()
            .await
            .created(self, "CreateLoadBalancer", |out| {
                out.load_balancers()
                    .first()
                    .and_then(|l| l.load_balancer_arn())
            })
    }

    async fn update(&self, have: &Self, changes: &[FieldChange], a: Apply<'_>) -> Done {
        if changes.iter().any(|ch| ch.field != SUBNETS) {
            return Err(cannot_change(&self.id(), changes));
        }
        a.elb
            .set_subnets()
            .load_balancer_arn(have.cloud_id()?)
            .set_subnets(Some(resolve_all(&self.subnets, a.ids)?))
            .send()
            .await
            .ctx("SetSubnets")?;
        Ok(())
    }
}

delete_by_id!(LoadBalancer: elb.delete_load_balancer().load_balancer_arn, "DeleteLoadBalancer");
