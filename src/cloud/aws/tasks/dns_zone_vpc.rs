//! A private zone's association with the cluster's VPC: instances resolve a private zone only
//! from VPCs associated with it. Route 53 has no ID for it; kprov's is `ZONE/VPC`. Only one
//! with a VPC kprov owns is owned: one with an adopted VPC is that VPC's owner's and is never
//! removed.

use super::{Apply, Delete, DnsZone, Done, Ref, Task, Vpc};
use crate::cloud::aws::dns::in_zone;
use crate::cloud::aws::ec2::gone_ok;
use crate::cloud::aws::kinds::{AwsKind, DnsKind};
use crate::cloud::aws::{Ctx, id_from};
use crate::cloud::engine::{CloudError, CloudId};

task! {
    struct DnsZoneVpc: AwsKind::Dns(DnsKind::ZoneVpc), listed ListedAssociation as a, rd;
    zone: Ref<DnsZone> = ZONE("zone"), Replace <- Ref::read(rd, &a.zone);
    vpc: Ref<Vpc> = VPC("vpc"), Replace <- Ref::read(rd, &a.vpc);
}

/// An association the read found: the zone's ID and the VPC's.
pub(crate) struct ListedAssociation {
    pub(crate) zone: CloudId,
    pub(crate) vpc: CloudId,
}

impl Task for DnsZoneVpc {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        let zone = self.zone.resolve(a.ids)?;
        let vpc = self.vpc.resolve(a.ids)?;
        let region = a
            .r53
            .config()
            .region()
            .map(|r| r.to_string())
            .ok_or_else(|| {
                CloudError::Spec(format!(
                    "{}: no AWS region is set to name the VPC's (spec.region or AWS_REGION)",
                    self.id()
                ))
            })?;
        a.r53
            .associate_vpc_with_hosted_zone()
            .hosted_zone_id(zone)
            .vpc(
                aws_sdk_route53::types::Vpc::builder()
                    .vpc_id(vpc)
                    .vpc_region(aws_sdk_route53::types::VpcRegion::from(region.as_str()))
                    .build(),
            )
            .send()
            .await
            .ctx("AssociateVPCWithHostedZone")?;
        id_from(&self.id(), "the zone", zone).map(|z| z.join('/', vpc))
    }
}

impl Delete for DnsZoneVpc {
    /// Already disassociated (`VPCAssociationNotFound`) is success; so is the zone's last
    /// association: a private zone keeps at least one VPC, and the zone is not kprov's to empty.
    async fn delete(&self, a: Apply<'_>) -> Done {
        let (zone, vpc) = in_zone(&self.id(), self.cloud_id()?, "VPC")?;
        let r = a
            .r53
            .disassociate_vpc_from_hosted_zone()
            .hosted_zone_id(zone)
            .vpc(aws_sdk_route53::types::Vpc::builder().vpc_id(vpc).build())
            .send()
            .await
            .ctx("DisassociateVPCFromHostedZone");
        disassociated(r)
    }
}

/// What a disassociation's answer means for the delete: done, already done, or the zone's
/// last association (success: the zone is not kprov's to empty); anything else fails it.
pub(super) fn disassociated<T>(r: Result<T, CloudError>) -> Result<(), CloudError> {
    match r {
        Err(e) if e.code() == Some("LastVPCAssociation") => Ok(()),
        other => gone_ok(other),
    }
}
