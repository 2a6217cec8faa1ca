//! An instance-group role's IAM role (`ROLE.CLUSTER`, under the cluster's path): its name
//! is fixed once made, its trust policy is brought back in place.

use super::{Apply, Doc, Done, Task, cannot_change, changed};
use crate::cloud::aws::iam::{normalize, path, tags};
use crate::cloud::aws::kinds::{AwsKind, IamKind};
use crate::cloud::aws::{Ctx, id_from};
use crate::cloud::engine::{CloudError, CloudId, FieldChange};

task! {
    struct IamRole: AwsKind::Iam(IamKind::Role), listed aws_sdk_iam::types::Role as role;
    /// Also its cloud ID: IAM names a role by its name.
    role_name: String = ROLE_NAME("roleName"), Immutable <- role.role_name().to_string();
    /// The trust policy, as canonical JSON (a document the diff shows line by line).
    assume_role_policy: String = ASSUME_ROLE_POLICY("assumeRolePolicy") as Doc
        // why: a field the cloud left out reads as empty, which the diff shows as a change
        <- normalize(role.assume_role_policy_document().unwrap_or_default());
}

impl Task for IamRole {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        let id = self.id();
        a.iam
            .create_role()
            .role_name(&self.role_name)
            .path(path(a.c))
            .assume_role_policy_document(&self.assume_role_policy)
            .set_tags(Some(tags(a.c, &id)))
            .send()
            .await
            .ctx("CreateRole")?;
        id_from(&id, "field roleName", &self.role_name)
    }

    async fn update(&self, have: &Self, changes: &[FieldChange], a: Apply<'_>) -> Done {
        if !changed(changes, ASSUME_ROLE_POLICY) {
            return Err(cannot_change(&self.id(), changes));
        }
        a.iam
            .update_assume_role_policy()
            .role_name(have.cloud_id()?)
            .policy_document(&self.assume_role_policy)
            .send()
            .await
            .ctx("UpdateAssumeRolePolicy")?;
        Ok(())
    }
}

delete_by_id!(IamRole: iam.delete_role().role_name, "DeleteRole");
