//! The internet gateway and its attachment to the VPC (an adopted VPC brings its own).

use aws_sdk_ec2::types::ResourceType;

use super::{Apply, Created, Delete, Done, Ref, Task, Vpc, gone, not_set};
use crate::cloud::aws::ec2::{gone_ok, tag_spec};
use crate::cloud::aws::kinds::{AwsKind, Ec2Kind};
use crate::cloud::aws::{AwsCloud, Ctx, error_code, finish_create};
use crate::cloud::engine::{CloudError, CloudId, FieldChange};

task! {
    struct InternetGateway: AwsKind::Ec2(Ec2Kind::InternetGateway),
        listed aws_sdk_ec2::types::InternetGateway as g, rd;
    /// The VPC it is attached to: always set on the desired gateway; a read one may be
    /// detached.
    vpc: Option<Ref<Vpc>> = VPC("vpc")
        <- g.attachments().iter().find_map(|a| a.vpc_id()).map(|vid| Ref::read(rd, vid));
}

impl InternetGateway {
    fn attached_to(&self) -> Result<&Ref<Vpc>, CloudError> {
        self.vpc.as_ref().ok_or_else(|| not_set(&self.id(), VPC))
    }
}

impl Task for InternetGateway {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        let gid = a
            .ec2
            .create_internet_gateway()
            .tag_specifications(tag_spec(
                a.c,
                ResourceType::InternetGateway,
                &self.id(),
                &[],
            ))
            .send()
            .await
            .created(self, "CreateInternetGateway", |out| {
                out.internet_gateway().and_then(|g| g.internet_gateway_id())
            })?;
        let vpc = self.attached_to()?.resolve(a.ids)?;
        finish_create(|| attach(a.c, &gid, vpc)).await?;
        Ok(gid)
    }

    async fn update(&self, have: &Self, _: &[FieldChange], a: Apply<'_>) -> Done {
        let gid = have.cloud_id()?;
        if let Some(old) = &have.vpc {
            a.ec2
                .detach_internet_gateway()
                .internet_gateway_id(gid)
                .vpc_id(old.resolve(a.ids)?)
                .send()
                .await
                .ctx("DetachInternetGateway")?;
        }
        attach(a.c, gid, self.attached_to()?.resolve(a.ids)?).await
    }
}

impl Delete for InternetGateway {
    async fn delete(&self, a: Apply<'_>) -> Done {
        let gid = self.cloud_id()?;
        if let Some(vpc) = &self.vpc {
            let r = a
                .ec2
                .detach_internet_gateway()
                .internet_gateway_id(gid)
                .vpc_id(vpc.resolve(a.ids)?)
                .send()
                .await;
            if let Err(e) = r
                && error_code(&e) != Some("Gateway.NotAttached")
            {
                return gone_ok(Err::<(), _>(e).ctx("DetachInternetGateway"));
            }
        }
        gone(
            a.ec2
                .delete_internet_gateway()
                .internet_gateway_id(gid)
                .send(),
            "DeleteInternetGateway",
        )
        .await
    }
}

async fn attach(c: &AwsCloud, gid: &str, vpc: &str) -> Result<(), CloudError> {
    c.ec2
        .attach_internet_gateway()
        .internet_gateway_id(gid)
        .vpc_id(vpc)
        .send()
        .await
        .ctx("AttachInternetGateway")?;
    Ok(())
}
