//! An instance-group role's instance profile (named as its role, under the cluster's path):
//! what a launch template names to give instances the role. Its name is fixed once made; its
//! role is swapped in place.

use super::{Apply, Delete, Done, IamRole, Ref, Task, gone, not_set};
use crate::cloud::aws::iam::{path, tags};
use crate::cloud::aws::kinds::{AwsKind, IamKind};
use crate::cloud::aws::{AwsCloud, Ctx, finish_create, id_from};
use crate::cloud::engine::{CloudError, CloudId, ErrorClass, FieldChange};

task! {
    struct IamInstanceProfile: AwsKind::Iam(IamKind::InstanceProfile),
        listed aws_sdk_iam::types::InstanceProfile as p, rd;
    /// Also its cloud ID: IAM names a profile by its name.
    profile_name: String = PROFILE_NAME("profileName"), Immutable
        <- p.instance_profile_name().to_string();
    /// Always on the desired profile; a read one may hold none (IAM allows at most one).
    role: Option<Ref<IamRole>> = ROLE("role")
        <- p.roles().first().map(|r| Ref::read(rd, r.role_name()));
}

impl IamInstanceProfile {
    fn desired_role(&self) -> Result<&Ref<IamRole>, CloudError> {
        self.role.as_ref().ok_or_else(|| not_set(&self.id(), ROLE))
    }
}

impl Task for IamInstanceProfile {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        let id = self.id();
        let name = &self.profile_name;
        a.iam
            .create_instance_profile()
            .instance_profile_name(name)
            .path(path(a.c))
            .set_tags(Some(tags(a.c, &id)))
            .send()
            .await
            .ctx("CreateInstanceProfile")?;
        let role = self.desired_role()?.resolve(a.ids)?;
        finish_create(|| add_role(a.c, name, role)).await?;
        // Done only once IAM shows the profile with its role (the `InstanceProfileExists`
        // waiter): launch templates and groups naming it come next.
        finish_create(|| profile_ready(a.c, name, role)).await?;
        id_from(&id, "field profileName", name)
    }

    /// A new role: the old one out, the new one in (a profile holds one).
    async fn update(&self, have: &Self, _: &[FieldChange], a: Apply<'_>) -> Done {
        let name = have.cloud_id()?;
        if let Some(old) = &have.role {
            remove_role(a.c, name, old.resolve(a.ids)?).await?;
        }
        add_role(a.c, name, self.desired_role()?.resolve(a.ids)?).await
    }
}

impl Delete for IamInstanceProfile {
    async fn delete(&self, a: Apply<'_>) -> Done {
        let name = self.cloud_id()?;
        if let Some(Ok(role)) = self.role.as_ref().map(|r| r.resolve(a.ids)) {
            // Already detached by an interrupted run is fine: the delete below decides.
            let _ = remove_role(a.c, name, role).await;
        }
        gone(
            a.iam
                .delete_instance_profile()
                .instance_profile_name(name)
                .send(),
            "DeleteInstanceProfile",
        )
        .await
    }
}

async fn add_role(c: &AwsCloud, profile: &str, role: &str) -> Result<(), CloudError> {
    c.iam
        .add_role_to_instance_profile()
        .instance_profile_name(profile)
        .role_name(role)
        .send()
        .await
        .ctx("AddRoleToInstanceProfile")?;
    Ok(())
}

async fn remove_role(c: &AwsCloud, profile: &str, role: &str) -> Result<(), CloudError> {
    c.iam
        .remove_role_from_instance_profile()
        .instance_profile_name(profile)
        .role_name(role)
        .send()
        .await
        .ctx("RemoveRoleFromInstanceProfile")?;
    Ok(())
}

/// The instance profile as IAM shows it, with `role` in it; a "not found (yet)" otherwise.
async fn profile_ready(c: &AwsCloud, profile: &str, role: &str) -> Result<(), CloudError> {
    let out = c
        .iam
        .get_instance_profile()
        .instance_profile_name(profile)
        .send()
        .await
        .ctx("GetInstanceProfile")?;
    let has_role = out
        .instance_profile()
        .is_some_and(|p| p.roles().iter().any(|r| r.role_name() == role));
    if has_role {
        Ok(())
    } else {
        Err(CloudError::verdict(
            "GetInstanceProfile",
            ErrorClass::NotFound,
            format!("instance profile {profile} does not show role {role} yet"),
        ))
    }
}
