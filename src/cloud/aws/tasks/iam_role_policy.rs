//! A role's inline policy (`kprov-ROLE`): what the instances of that role may do. IAM has no
//! ID for it; kprov's is `ROLE:POLICY`.

use super::{Apply, Delete, Doc, Done, IamRole, Ref, Task, gone};
use crate::cloud::aws::iam::normalize;
use crate::cloud::aws::kinds::{AwsKind, IamKind};
use crate::cloud::aws::{AwsCloud, Ctx, id_from};
use crate::cloud::engine::{CloudError, CloudId, FieldChange, IdMap};

task! {
    struct IamRolePolicy: AwsKind::Iam(IamKind::RolePolicy), listed ListedPolicy as p, rd;
    role: Ref<IamRole> = ROLE("role") <- Ref::read(rd, &p.role);
    policy_name: String = POLICY_NAME("policyName"), Immutable <- p.name.clone();
    /// The policy, as canonical JSON (a document the diff shows line by line).
    document: String = DOCUMENT("document") as Doc <- normalize(&p.document);
}

/// An inline policy as the read found it: its role's name, its name, and its document as
/// IAM sends it (URL-encoded).
pub(crate) struct ListedPolicy {
    pub(crate) role: String,
    pub(crate) name: String,
    pub(crate) document: String,
}

impl Task for IamRolePolicy {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        self.put(a.c, a.ids).await
    }

    /// PutRolePolicy replaces the document (the name is fixed: the plan refuses a change).
    async fn update(&self, _: &Self, _: &[FieldChange], a: Apply<'_>) -> Done {
        self.put(a.c, a.ids).await.map(|_| ())
    }
}

impl Delete for IamRolePolicy {
    async fn delete(&self, a: Apply<'_>) -> Done {
        let cid = self.cloud_id()?;
        // A role name has no ':' (IAM allows `\w+=,.@-`): the first one ends it.
        let (role, policy) = cid.split_once(':').ok_or_else(|| {
            CloudError::Model(format!(
                "{}: cloud ID {cid:?} is not of the form ROLE:POLICY",
                self.id()
            ))
        })?;
        gone(
            a.iam
                .delete_role_policy()
                .role_name(role)
                .policy_name(policy)
                .send(),
            "DeleteRolePolicy",
        )
        .await
    }
}

impl IamRolePolicy {
    /// Creates or replaces the policy on its role.
    async fn put(&self, c: &AwsCloud, ids: &IdMap) -> Result<CloudId, CloudError> {
        let role = self.role.resolve(ids)?;
        c.iam
            .put_role_policy()
            .role_name(role)
            .policy_name(&self.policy_name)
            .policy_document(&self.document)
            .send()
            .await
            .ctx("PutRolePolicy")?;
        id_from(&self.id(), "the role", role).map(|r| r.join(':', &self.policy_name))
    }
}
