//! The network load balancers (the API's on `desired::API_PORT`, the bastion's on 22), their
//! target groups (with the attributes kprov manages: client IP preservation, deregistration
//! delay) and listeners.

use std::collections::BTreeMap;

use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, LoadBalancerSchemeEnum, LoadBalancerTypeEnum, ProtocolEnum, Tag,
    TargetGroupAttribute, TargetTypeEnum,
};

use super::kinds::*;
use super::{
    AwsCloud, Ctx, Reader, cid, cids, cloud_id_of, created_id, finish_create, id_from_tags,
    want_str,
};
use crate::cloud::engine::{CloudError, CloudId, FieldChange, IdMap, Resource, Value};

/// ARN → tags, for the owned ones among `arns` (DescribeTags takes 20 ARNs a call).
async fn owned_tags(
    c: &AwsCloud,
    arns: Vec<String>,
) -> Result<BTreeMap<String, Vec<(String, String)>>, CloudError> {
    let key = super::owned_tag_key(&c.cluster);
    let mut out = BTreeMap::new();
    for chunk in arns.chunks(20) {
        let d = c
            .elb
            .describe_tags()
            .set_resource_arns(Some(chunk.to_vec()))
            .send()
            .await
            .ctx("DescribeTags")?;
        for td in d.tag_descriptions() {
            let tags: Vec<(String, String)> = td
                .tags()
                .iter()
                .map(|t| {
                    (
                        // why: a tag without key or value matches no ownership or identity key
                        t.key().unwrap_or_default().to_string(),
                        // why: a tag without key or value matches no ownership or identity key
                        t.value().unwrap_or_default().to_string(),
                    )
                })
                .collect();
            if tags.iter().any(|(k, v)| *k == key && v == "owned") {
                // why: an entry without an ARN matches no listed load balancer
                out.insert(td.resource_arn().unwrap_or_default().to_string(), tags);
            }
        }
    }
    Ok(out)
}

/// The account's load balancers and target groups with the tags of the cluster's own, and,
/// for those, the target groups' attributes and the load balancers' listeners.
pub(super) struct ElbRead {
    lbs: Vec<aws_sdk_elasticloadbalancingv2::types::LoadBalancer>,
    tgs: Vec<aws_sdk_elasticloadbalancingv2::types::TargetGroup>,
    owned: BTreeMap<String, Vec<(String, String)>>,
    attrs: BTreeMap<String, BTreeMap<String, String>>,
    listeners: BTreeMap<String, Vec<aws_sdk_elasticloadbalancingv2::types::Listener>>,
}

/// Three waves: load balancers and target groups; their tags (which are the cluster's);
/// the attributes and listeners of the cluster's own, all at once.
pub(super) async fn fetch(c: &AwsCloud) -> Result<ElbRead, CloudError> {
    let lbs = async {
        c.elb
            .describe_load_balancers()
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .ctx("DescribeLoadBalancers")
    };
    let tgs = async {
        c.elb
            .describe_target_groups()
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .ctx("DescribeTargetGroups")
    };
    let (lbs, tgs): (Vec<_>, Vec<_>) = tokio::try_join!(lbs, tgs)?;
    let arns: Vec<String> = lbs
        .iter()
        .filter_map(|l| l.load_balancer_arn())
        .chain(tgs.iter().filter_map(|t| t.target_group_arn()))
        .map(str::to_string)
        .collect();
    let owned = if arns.is_empty() {
        BTreeMap::new()
    } else {
        owned_tags(c, arns).await?
    };
    let owned_tgs = tgs
        .iter()
        .filter_map(|t| t.target_group_arn())
        .filter(|a| owned.contains_key(*a));
    let attrs = futures::future::try_join_all(owned_tgs.map(|arn| async move {
        Ok::<_, CloudError>((arn.to_string(), target_group_attributes(c, arn).await?))
    }));
    // One DescribeListeners per owned load balancer: a cluster has one or two.
    let owned_lbs = lbs
        .iter()
        .filter_map(|l| l.load_balancer_arn())
        .filter(|a| owned.contains_key(*a));
    let listeners = futures::future::try_join_all(owned_lbs.map(|arn| async move {
        let ls: Vec<_> = c
            .elb
            .describe_listeners()
            .load_balancer_arn(arn)
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .ctx("DescribeListeners")?;
        Ok::<_, CloudError>((arn.to_string(), ls))
    }));
    let (attrs, listeners) = tokio::try_join!(attrs, listeners)?;
    Ok(ElbRead {
        attrs: attrs.into_iter().collect(),
        listeners: listeners.into_iter().collect(),
        lbs,
        tgs,
        owned,
    })
}

pub(super) fn assemble(read: ElbRead, rd: &mut Reader<'_>) {
    let ElbRead {
        lbs,
        tgs,
        owned,
        attrs,
        listeners,
    } = read;
    let pairs = |arn: &str| {
        owned.get(arn).map(|t| {
            t.iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect::<Vec<_>>()
        })
    };

    for t in &tgs {
        let Some(arn) = rd.listed(TARGET_GROUP, t.target_group_arn()) else {
            continue;
        };
        let Some(tags) = pairs(&arn) else { continue };
        let id = id_from_tags(TARGET_GROUP, &arn, tags.into_iter());
        // why: a reference the cloud left out reads as empty, which the diff shows as a change
        let vpc = rd.r(t.vpc_id().unwrap_or_default());
        let none = BTreeMap::new();
        let attrs = attrs.get(arn.as_str()).unwrap_or(&none);
        // Absent means AWS's defaults: client IPs preserved (instance targets), 300 s.
        let preserve = attrs
            .get(PRESERVE_CLIENT_IP)
            .is_none_or(|v| v.eq_ignore_ascii_case("true"));
        let delay = attrs
            .get(DEREGISTRATION_DELAY)
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(300);
        rd.push(
            Resource::new(TARGET_GROUP, id.name)
                .cloud_id(arn)
                .field(
                    "tgName",
                    // why: a field the cloud left out reads as empty, which the diff shows as a change
                    Value::str(t.target_group_name().unwrap_or_default()),
                )
                .field("port", Value::Int(t.port().unwrap_or(0).into()))
                .field(
                    "protocol",
                    // why: a field the cloud left out reads as empty, which the diff shows as a change
                    Value::str(t.protocol().map(|p| p.as_str()).unwrap_or_default()),
                )
                .field("vpc", vpc)
                .field("preserveClientIp", Value::Bool(preserve))
                .field("deregistrationDelay", Value::Int(delay)),
        );
    }
    let mut owned_lbs = Vec::new();
    for l in &lbs {
        let Some(arn) = rd.listed(LOAD_BALANCER, l.load_balancer_arn()) else {
            continue;
        };
        let Some(tags) = pairs(&arn) else { continue };
        let id = id_from_tags(LOAD_BALANCER, &arn, tags.into_iter());
        let subnets = l
            .availability_zones()
            .iter()
            .filter_map(|z| z.subnet_id())
            .map(|s| rd.r(s))
            .collect();
        let sgs = l.security_groups().iter().map(|g| rd.r(g)).collect();
        let dns = l
            .dns_name()
            // why: a field the cloud left out reads as empty, which the diff shows as a change
            .unwrap_or_default()
            .trim_end_matches('.')
            .to_lowercase();
        // Route53 aliases name the load balancer by DNS name.
        rd.refs.insert(dns.clone(), id.clone());
        rd.push(
            Resource::new(LOAD_BALANCER, &id.name)
                .cloud_id(arn.clone())
                .field(
                    "lbName",
                    // why: a field the cloud left out reads as empty, which the diff shows as a change
                    Value::str(l.load_balancer_name().unwrap_or_default()),
                )
                .field(
                    "scheme",
                    // why: a field the cloud left out reads as empty, which the diff shows as a change
                    Value::str(l.scheme().map(|s| s.as_str()).unwrap_or_default()),
                )
                .field("subnets", Value::set(subnets))
                .field("securityGroups", Value::set(sgs))
                .field("dnsName", Value::str(dns))
                .field(
                    "canonicalZone",
                    // why: a field the cloud left out reads as empty, which the diff shows as a change
                    Value::str(l.canonical_hosted_zone_id().unwrap_or_default()),
                ),
        );
        owned_lbs.push((String::from(arn), id));
    }
    for (arn, lb_id) in owned_lbs {
        for l in listeners.get(&arn).into_iter().flatten() {
            let port = l.port().unwrap_or(0);
            // A load balancer's own listener is named after it (api: 6443, bastion: 22).
            let own = if lb_id.name == "bastion" {
                super::desired::SSH_PORT
            } else {
                i64::from(super::desired::API_PORT)
            };
            let name = if i64::from(port) == own {
                lb_id.name.clone()
            } else {
                format!("{}-{port}", lb_id.name)
            };
            let tg = l
                .default_actions()
                .iter()
                .find_map(|a| a.target_group_arn())
                // why: a reference the cloud left out reads as empty, which the diff shows as a change
                .unwrap_or_default();
            let Some(arn) = rd.listed(LISTENER, l.listener_arn()) else {
                continue;
            };
            rd.push(
                Resource::new(LISTENER, name)
                    .cloud_id(arn)
                    .field("loadBalancer", Value::Ref(lb_id.clone()))
                    .field("port", Value::Int(port.into()))
                    .field(
                        "protocol",
                        // why: a field the cloud left out reads as empty, which the diff shows as a change
                        Value::str(l.protocol().map(|p| p.as_str()).unwrap_or_default()),
                    )
                    .field("targetGroup", rd.r(tg)),
            );
        }
    }
}

const PRESERVE_CLIENT_IP: &str = "preserve_client_ip.enabled";
const DEREGISTRATION_DELAY: &str = "deregistration_delay.timeout_seconds";

/// A target group's attributes, key → value.
async fn target_group_attributes(
    c: &AwsCloud,
    arn: &str,
) -> Result<BTreeMap<String, String>, CloudError> {
    let out = c
        .elb
        .describe_target_group_attributes()
        .target_group_arn(arn)
        .send()
        .await
        .ctx("DescribeTargetGroupAttributes")?;
    Ok(out
        .attributes()
        .iter()
        .filter_map(|a| Some((a.key()?.to_string(), a.value()?.to_string())))
        .collect())
}

/// Sets the target group attributes kprov manages (client IP preservation, deregistration
/// delay) to what `want` says.
async fn set_target_group_attributes(
    c: &AwsCloud,
    arn: &str,
    want: &Resource,
) -> Result<(), CloudError> {
    let mut attrs = Vec::new();
    if let Some(on) = want.get("preserveClientIp").and_then(Value::as_bool) {
        attrs.push(
            TargetGroupAttribute::builder()
                .key(PRESERVE_CLIENT_IP)
                .value(on.to_string())
                .build(),
        );
    }
    if let Some(secs) = want.get("deregistrationDelay").and_then(Value::as_int) {
        attrs.push(
            TargetGroupAttribute::builder()
                .key(DEREGISTRATION_DELAY)
                .value(secs.to_string())
                .build(),
        );
    }
    if attrs.is_empty() {
        return Ok(());
    }
    c.elb
        .modify_target_group_attributes()
        .target_group_arn(arn)
        .set_attributes(Some(attrs))
        .send()
        .await
        .ctx("ModifyTargetGroupAttributes")?;
    Ok(())
}

fn tags(c: &AwsCloud, want: &Resource) -> Vec<Tag> {
    let display = format!("{}.{}", want.id.name, c.cluster);
    c.tags(&want.id, &display)
        .into_iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

fn forward(tg: &str) -> Action {
    Action::builder()
        .r#type(ActionTypeEnum::Forward)
        .target_group_arn(tg)
        .build()
}

pub(super) async fn create(
    c: &AwsCloud,
    kind: ElbKind,
    want: &Resource,
    ids: &IdMap,
) -> Result<CloudId, CloudError> {
    let s = |f: &str| want_str(want, f).map(str::to_string);
    let port = want.get("port").and_then(Value::as_int).unwrap_or(0) as i32;
    match kind {
        ElbKind::LoadBalancer => {
            let out = c
                .elb
                .create_load_balancer()
                .name(s("lbName")?)
                .r#type(LoadBalancerTypeEnum::Network)
                .scheme(LoadBalancerSchemeEnum::from(s("scheme")?.as_str()))
                .set_subnets(Some(cids(ids, want.get("subnets"))?))
                .set_security_groups(Some(cids(ids, want.get("securityGroups"))?))
                .set_tags(Some(tags(c, want)))
                .send()
                .await
                .ctx("CreateLoadBalancer")?;
            created_id(
                &want.id,
                "CreateLoadBalancer",
                out.load_balancers()
                    .first()
                    .and_then(|l| l.load_balancer_arn()),
            )
        }
        ElbKind::TargetGroup => {
            let out = c
                .elb
                .create_target_group()
                .name(s("tgName")?)
                .protocol(ProtocolEnum::from(s("protocol")?.as_str()))
                .port(port)
                .vpc_id(cid(ids, want.get("vpc"))?)
                .target_type(TargetTypeEnum::Instance)
                .health_check_protocol(ProtocolEnum::Tcp)
                .set_tags(Some(tags(c, want)))
                .send()
                .await
                .ctx("CreateTargetGroup")?;
            let arn = created_id(
                &want.id,
                "CreateTargetGroup",
                out.target_groups()
                    .first()
                    .and_then(|t| t.target_group_arn()),
            )?;
            finish_create(|| set_target_group_attributes(c, &arn, want)).await?;
            Ok(arn)
        }
        ElbKind::Listener => {
            let out = c
                .elb
                .create_listener()
                .load_balancer_arn(cid(ids, want.get("loadBalancer"))?)
                .protocol(ProtocolEnum::from(s("protocol")?.as_str()))
                .port(port)
                .default_actions(forward(cid(ids, want.get("targetGroup"))?))
                .set_tags(Some(tags(c, want)))
                .send()
                .await
                .ctx("CreateListener")?;
            created_id(
                &want.id,
                "CreateListener",
                out.listeners().first().and_then(|l| l.listener_arn()),
            )
        }
    }
}

pub(super) async fn update(
    c: &AwsCloud,
    kind: ElbKind,
    want: &Resource,
    have: &Resource,
    changes: &[FieldChange],
    ids: &IdMap,
) -> Result<(), CloudError> {
    let arn = cloud_id_of(have)?;
    match kind {
        ElbKind::LoadBalancer if changes.iter().all(|ch| ch.field == "subnets") => {
            c.elb
                .set_subnets()
                .load_balancer_arn(arn)
                .set_subnets(Some(cids(ids, want.get("subnets"))?))
                .send()
                .await
                .ctx("SetSubnets")?;
            Ok(())
        }
        ElbKind::TargetGroup
            if changes.iter().all(|ch| {
                ["preserveClientIp", "deregistrationDelay"].contains(&ch.field.as_str())
            }) =>
        {
            set_target_group_attributes(c, arn, want).await
        }
        ElbKind::Listener => {
            c.elb
                .modify_listener()
                .listener_arn(arn)
                .port(want.get("port").and_then(Value::as_int).unwrap_or(0) as i32)
                .protocol(ProtocolEnum::from(
                    want.get_str("protocol").unwrap_or("TCP"),
                ))
                .default_actions(forward(cid(ids, want.get("targetGroup"))?))
                .send()
                .await
                .ctx("ModifyListener")?;
            Ok(())
        }
        _ => Err(CloudError::Model(format!(
            "{}: cannot change {} in place",
            want.id,
            changes
                .iter()
                .map(|c| c.field.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

pub(super) async fn delete(c: &AwsCloud, kind: ElbKind, have: &Resource) -> Result<(), CloudError> {
    let arn = cloud_id_of(have)?;
    let r = match kind {
        ElbKind::LoadBalancer => c
            .elb
            .delete_load_balancer()
            .load_balancer_arn(arn)
            .send()
            .await
            .ctx("DeleteLoadBalancer")
            .map(|_| ()),
        ElbKind::TargetGroup => c
            .elb
            .delete_target_group()
            .target_group_arn(arn)
            .send()
            .await
            .ctx("DeleteTargetGroup")
            .map(|_| ()),
        ElbKind::Listener => c
            .elb
            .delete_listener()
            .listener_arn(arn)
            .send()
            .await
            .ctx("DeleteListener")
            .map(|_| ()),
    };
    match r {
        Err(e) if e.class() == crate::cloud::engine::ErrorClass::NotFound => Ok(()),
        other => other,
    }
}
