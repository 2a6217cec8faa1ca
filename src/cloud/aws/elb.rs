//! The network load balancers (the API's on `desired::API_PORT`, the bastion's on 22), their
//! target groups (with the attributes kprov manages: client IP preservation, deregistration
//! delay) and listeners.

use std::collections::BTreeMap;

use aws_sdk_elasticloadbalancingv2::types::Tag;

use super::kinds::*;
use super::tasks::{Head, ListedListener, ListedTargetGroup, Listener, LoadBalancer, TargetGroup};
use super::{AwsCloud, Ctx, Reader, id_from_tags};
use crate::cloud::engine::{CloudError, ResourceId};

/// ARN → tags, for the owned ones among `arns` (DescribeTags takes 20 ARNs a call; no ARNs, no
/// call).
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
    let lbs = async { all_items!(c.elb.describe_load_balancers(), "DescribeLoadBalancers") };
    let tgs = async { all_items!(c.elb.describe_target_groups(), "DescribeTargetGroups") };
    let (lbs, tgs): (Vec<_>, Vec<_>) = tokio::try_join!(lbs, tgs)?;
    let arns: Vec<String> = lbs
        .iter()
        .filter_map(|l| l.load_balancer_arn())
        .chain(tgs.iter().filter_map(|t| t.target_group_arn()))
        .map(str::to_string)
        .collect();
    let owned = owned_tags(c, arns).await?;
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
        let ls: Vec<_> = all_items!(
            c.elb.describe_listeners().load_balancer_arn(arn),
            "DescribeListeners"
        )?;
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
        mut attrs,
        mut listeners,
    } = read;
    let pairs = |arn: &str| {
        owned.get(arn).map(|t| {
            t.iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect::<Vec<_>>()
        })
    };

    for group in tgs {
        let Some(arn) = rd.listed(TARGET_GROUP, group.target_group_arn()) else {
            continue;
        };
        let Some(tags) = pairs(&arn) else { continue };
        let id = id_from_tags(TARGET_GROUP, &arn, tags.into_iter());
        let listed = ListedTargetGroup {
            // why: a group whose attributes were not read reads as AWS's defaults
            attributes: attrs.remove(arn.as_str()).unwrap_or_default(),
            group,
        };
        rd.add::<TargetGroup>(Head::listed(id.name, arn), &listed);
    }
    let mut owned_lbs = Vec::new();
    for l in &lbs {
        let Some(arn) = rd.listed(LOAD_BALANCER, l.load_balancer_arn()) else {
            continue;
        };
        let Some(tags) = pairs(&arn) else { continue };
        let id = id_from_tags(LOAD_BALANCER, &arn, tags.into_iter());
        let read = rd.add::<LoadBalancer>(Head::listed(&id.name, arn.clone()), l);
        // Route53 aliases name the load balancer by DNS name.
        if let Some(dns) = &read.dns_name {
            rd.refs.insert(dns.clone(), id.clone());
        }
        owned_lbs.push((String::from(arn), id));
    }
    for (arn, lb_id) in owned_lbs {
        // A load balancer's own listener is named after it (api: 6443, bastion: 22).
        let own = if lb_id.name == "bastion" {
            super::desired::SSH_PORT
        } else {
            i64::from(super::desired::API_PORT)
        };
        // why: a load balancer without listeners has none to read
        for listener in listeners.remove(&arn).unwrap_or_default() {
            let Some(cloud_id) = rd.listed(LISTENER, listener.listener_arn()) else {
                continue;
            };
            let port = i64::from(listener.port().unwrap_or(0));
            let name = if port == own {
                lb_id.name.clone()
            } else {
                format!("{}-{port}", lb_id.name)
            };
            let listed = ListedListener {
                load_balancer: arn.clone(),
                listener,
            };
            rd.add::<Listener>(Head::listed(name, cloud_id), &listed);
        }
    }
}

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

/// The tags of a load balancer, target group or listener kprov makes.
pub(super) fn tags(c: &AwsCloud, id: &ResourceId) -> Vec<Tag> {
    let display = format!("{}.{}", id.name, c.cluster);
    c.tags(id, &display)
        .into_iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

/// `port` as ELB takes it; one out of range is a model error naming the resource.
pub(super) fn port(id: &ResourceId, port: i64) -> Result<i32, CloudError> {
    i32::try_from(port).map_err(|_| CloudError::Model(format!("{id}: port {port} is out of range")))
}
