//! The VPC: its CIDR (fixed once created) and, for one kprov makes, its DNS attributes.

use aws_sdk_ec2::types::{AttributeBooleanValue, ResourceType};

use super::{Apply, Created, Done, Fields, Head, Kinded, Read, Task, cannot_change, changed, text};
use crate::cloud::aws::ec2::tag_spec;
use crate::cloud::aws::kinds::{AwsKind, Ec2Kind};
use crate::cloud::aws::{AwsCloud, Ctx, Reader, finish_create};
use crate::cloud::engine::{CloudError, CloudId, FieldChange, FieldRule, Resource, Value};

const CIDR: &str = "cidr";
const DNS_SUPPORT: &str = "dnsSupport";
const DNS_HOSTNAMES: &str = "dnsHostnames";

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Vpc {
    pub(crate) head: Head,
    pub(crate) cidr: String,
    /// Set on a VPC kprov makes (and reads back); an adopted VPC's are its operator's.
    pub(crate) dns: Option<VpcDns>,
}

/// A VPC's DNS attributes: a private hosted zone answers inside a VPC only with both on, and
/// instances get DNS names only with hostnames on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VpcDns {
    pub(crate) support: bool,
    pub(crate) hostnames: bool,
}

impl Kinded for Vpc {
    const KIND: AwsKind = AwsKind::Ec2(Ec2Kind::Vpc);
}

/// By hand: the DNS pair is two fields of the resource, both or neither.
impl Fields for Vpc {
    fn head(&self) -> &Head {
        &self.head
    }

    fn resource(&self) -> Resource {
        let r = self
            .head
            .resource::<Vpc>()
            .field(CIDR, Value::str(&self.cidr))
            .rule(CIDR, FieldRule::Immutable);
        match self.dns {
            Some(dns) => r
                .field(DNS_SUPPORT, Value::Bool(dns.support))
                .field(DNS_HOSTNAMES, Value::Bool(dns.hostnames)),
            None => r,
        }
    }

    fn from_resource(r: &Resource) -> Result<Self, CloudError> {
        let flag = |f: &str| r.get(f).and_then(Value::as_bool);
        let dns = match (flag(DNS_SUPPORT), flag(DNS_HOSTNAMES)) {
            (Some(support), Some(hostnames)) => Some(VpcDns { support, hostnames }),
            (None, None) => None,
            _ => {
                return Err(CloudError::Model(format!(
                    "{}: fields {DNS_SUPPORT} and {DNS_HOSTNAMES} go together",
                    r.id
                )));
            }
        };
        Ok(Vpc {
            head: Head::of(r),
            cidr: text(r, CIDR)?,
            dns,
        })
    }
}

impl Read for Vpc {
    /// The listed VPC and its DNS attributes (read for owned VPCs only).
    type Listed = (aws_sdk_ec2::types::Vpc, Option<VpcDns>);

    fn read(head: Head, (v, dns): &Self::Listed, _: &Reader<'_>) -> Self {
        Vpc {
            head,
            // why: a field the cloud left out reads as empty, which the diff shows as a change
            cidr: v.cidr_block().unwrap_or_default().to_string(),
            dns: *dns,
        }
    }
}

impl Task for Vpc {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        let vid = a
            .ec2
            .create_vpc()
            .cidr_block(&self.cidr)
            .tag_specifications(tag_spec(a.c, ResourceType::Vpc, &self.id(), &[]))
            .send()
            .await
            .created(self, "CreateVpc", |out| out.vpc().and_then(|v| v.vpc_id()))?;
        if let Some(dns) = self.dns {
            // Support first: AWS refuses hostnames on a VPC without DNS support.
            finish_create(|| set_dns(a.c, &vid, Attribute::Support, dns.support)).await?;
            finish_create(|| set_dns(a.c, &vid, Attribute::Hostnames, dns.hostnames)).await?;
        }
        Ok(vid)
    }

    async fn update(&self, have: &Self, changes: &[FieldChange], a: Apply<'_>) -> Done {
        let (Some(dns), true) = (
            self.dns,
            changed(changes, DNS_SUPPORT) || changed(changes, DNS_HOSTNAMES),
        ) else {
            return Err(cannot_change(&self.id(), changes));
        };
        let vid = have.cloud_id()?;
        if changed(changes, DNS_SUPPORT) {
            set_dns(a.c, vid, Attribute::Support, dns.support).await?;
        }
        if changed(changes, DNS_HOSTNAMES) {
            set_dns(a.c, vid, Attribute::Hostnames, dns.hostnames).await?;
        }
        Ok(())
    }
}

delete_by_id!(Vpc: ec2.delete_vpc().vpc_id, "DeleteVpc");

#[derive(Clone, Copy)]
enum Attribute {
    Support,
    Hostnames,
}

/// Sets a VPC's DNS attribute (ModifyVpcAttribute takes one attribute per call).
async fn set_dns(c: &AwsCloud, vid: &str, which: Attribute, on: bool) -> Result<(), CloudError> {
    let value = AttributeBooleanValue::builder().value(on).build();
    let req = c.ec2.modify_vpc_attribute().vpc_id(vid);
    let req = match which {
        Attribute::Hostnames => req.enable_dns_hostnames(value),
        Attribute::Support => req.enable_dns_support(value),
    };
    req.send().await.ctx("ModifyVpcAttribute")?;
    Ok(())
}
