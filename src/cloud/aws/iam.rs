//! IAM roles, their inline policies and instance profiles, per instance-group role.
//! Owned objects live under the path `/kprov/CLUSTER/` (ListRoles filters on it) and are named
//! `ROLE.CLUSTER`.

use super::kinds::*;
use super::tasks::{Head, IamInstanceProfile, IamRole, IamRolePolicy, ListedPolicy};
use super::{AwsCloud, Ctx, Reader};
use crate::cloud::engine::{CloudError, ResourceId};

pub(super) fn path(c: &AwsCloud) -> String {
    format!("/kprov/{}/", c.cluster)
}

/// IAM returns policy documents URL-encoded; canonical JSON makes them comparable.
pub(super) fn normalize(doc: &str) -> String {
    let decoded = percent_decode(doc);
    serde_json::from_str::<serde_json::Value>(&decoded)
        .map(|v| super::desired::pretty(&v))
        .unwrap_or(decoded)
}

/// RFC 3986 percent-decoding as IAM's query protocol sends it (`+` is a space there).
fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// `control-plane.CLUSTER` (or its shortened form, see [`super::desired::iam_name`]) →
/// `control-plane`.
fn key<'a>(c: &AwsCloud, name: &'a str) -> &'a str {
    if let Some(k) = ["control-plane", "nodes", "bastion"]
        .into_iter()
        .find(|k| super::desired::iam_name(k, &c.cluster) == name)
    {
        return k;
    }
    name.strip_suffix(&format!(".{}", c.cluster))
        .unwrap_or(name)
}

/// The cluster's roles (each with its inline policies) and instance profiles.
pub(super) struct IamRead {
    /// Each role with its inline policies.
    roles: Vec<(aws_sdk_iam::types::Role, Vec<ListedPolicy>)>,
    profiles: Vec<aws_sdk_iam::types::InstanceProfile>,
}

/// Roles and profiles at once; then every role's policy names at once; then every policy at
/// once. A role per instance-group role (at most three): these reads do not grow with the
/// number of instance groups.
pub(super) async fn fetch(c: &AwsCloud) -> Result<IamRead, CloudError> {
    let prefix = path(c);
    let roles = async { all_items!(c.iam.list_roles().path_prefix(&prefix), "ListRoles") };
    let profiles = async {
        all_items!(
            c.iam.list_instance_profiles().path_prefix(&prefix),
            "ListInstanceProfiles"
        )
    };
    let (roles, profiles): (Vec<_>, Vec<_>) = tokio::try_join!(roles, profiles)?;
    let roles: Vec<_> = roles.into_iter().filter(|r| r.path() == prefix).collect();
    let profiles = profiles
        .into_iter()
        .filter(|p| p.path() == prefix)
        .collect();
    let roles = futures::future::try_join_all(roles.into_iter().map(|role| async move {
        let name = role.role_name();
        let names: Vec<String> = all_items!(
            c.iam.list_role_policies().role_name(name),
            "ListRolePolicies"
        )?;
        let docs = futures::future::try_join_all(names.into_iter().map(|p| async move {
            let doc = c
                .iam
                .get_role_policy()
                .role_name(name)
                .policy_name(&p)
                .send()
                .await
                .ctx("GetRolePolicy")?;
            Ok::<_, CloudError>(ListedPolicy {
                role: name.to_string(),
                document: doc.policy_document().to_string(),
                name: p,
            })
        }))
        .await?;
        Ok::<_, CloudError>((role, docs))
    }))
    .await?;
    Ok(IamRead { roles, profiles })
}

pub(super) fn assemble(c: &AwsCloud, read: IamRead, rd: &mut Reader<'_>) {
    for (role, policies) in &read.roles {
        let name = role.role_name();
        let Some(role_id) = rd.listed(IAM_ROLE, Some(name)) else {
            continue;
        };
        let k = key(c, name);
        let head = Head::listed(k, role_id.clone());
        rd.add::<IamRole>(head, role);
        for p in policies {
            let rname = if p.name == format!("kprov-{k}") {
                k.to_string()
            } else {
                format!("{k}-{}", p.name)
            };
            let head = Head::listed(rname.as_str(), role_id.join(':', &p.name));
            rd.add::<IamRolePolicy>(head, p);
        }
    }
    for p in &read.profiles {
        let name = p.instance_profile_name();
        let Some(profile_id) = rd.listed(INSTANCE_PROFILE, Some(name)) else {
            continue;
        };
        let head = Head::listed(key(c, name), profile_id);
        rd.add::<IamInstanceProfile>(head, p);
    }
}

pub(super) fn tags(c: &AwsCloud, id: &ResourceId) -> Vec<aws_sdk_iam::types::Tag> {
    let display = format!("{}.{}", id.name, c.cluster);
    c.tags(id, &display)
        .into_iter()
        .filter_map(|(k, v)| {
            aws_sdk_iam::types::Tag::builder()
                .key(k)
                .value(v)
                .build()
                .ok()
        })
        .collect()
}
