//! Classic load balancers. kprov makes none, but the AWS cloud-controller-manager makes one for
//! every Service of type LoadBalancer without an NLB annotation (its default), tagged
//! `kubernetes.io/cluster/NAME=owned` and with no kprov identity. They are read so that `delete
//! cluster` removes them before the subnets, security groups and VPC they hold (a Classic ELB
//! left behind keeps the VPC from being deleted and keeps billing); `update` plans leave them
//! out like every resource someone else made for the cluster (`UNTRACKED`).

use std::collections::BTreeMap;

use super::kinds::*;
use super::tasks::{ClassicLoadBalancer, Head};
use super::{AwsCloud, Ctx, Reader, id_from_tags};
use crate::cloud::engine::{CloudError, ErrorClass};

/// Load balancer name → tags, for the owned ones among `names` (DescribeTags takes 20 names
/// a call; no names, no call).
async fn owned_tags(
    c: &AwsCloud,
    names: Vec<String>,
) -> Result<BTreeMap<String, Vec<(String, String)>>, CloudError> {
    let mut out = BTreeMap::new();
    for chunk in names.chunks(20) {
        let d = match describe_tags(c, chunk.to_vec()).await {
            Ok(d) => d,
            // One of the chunk was deleted since it was listed (a Service going away): ask
            // name by name, a gone one is nobody's.
            Err(e) if e.class() == ErrorClass::NotFound => {
                let mut all = Vec::new();
                for name in chunk {
                    match describe_tags(c, vec![name.clone()]).await {
                        Ok(d) => all.extend(d.tag_descriptions().iter().cloned()),
                        Err(e) if e.class() == ErrorClass::NotFound => {}
                        Err(e) => return Err(e),
                    }
                }
                aws_sdk_elasticloadbalancing::operation::describe_tags::DescribeTagsOutput::builder(
                )
                .set_tag_descriptions(Some(all))
                .build()
            }
            Err(e) => return Err(e),
        };
        for td in d.tag_descriptions() {
            let tags: Vec<(String, String)> = td
                .tags()
                .iter()
                .map(|t| {
                    (
                        t.key().to_string(),
                        // why: a tag without key or value matches no ownership or identity key
                        t.value().unwrap_or_default().to_string(),
                    )
                })
                .collect();
            if super::owned_by(
                &c.cluster,
                tags.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            ) {
                out.insert(
                    // why: an entry without a name matches no listed load balancer
                    td.load_balancer_name().unwrap_or_default().to_string(),
                    tags,
                );
            }
        }
    }
    Ok(out)
}

async fn describe_tags(
    c: &AwsCloud,
    names: Vec<String>,
) -> Result<aws_sdk_elasticloadbalancing::operation::describe_tags::DescribeTagsOutput, CloudError>
{
    c.clb
        .describe_tags()
        .set_load_balancer_names(Some(names))
        .send()
        .await
        .ctx("DescribeTags (Classic)")
}

/// The account's Classic load balancers and the tags of those the cluster's CCM made.
pub(super) struct ClbRead {
    lbs: Vec<aws_sdk_elasticloadbalancing::types::LoadBalancerDescription>,
    owned: BTreeMap<String, Vec<(String, String)>>,
}

pub(super) async fn fetch(c: &AwsCloud) -> Result<ClbRead, CloudError> {
    let lbs: Vec<_> = all_items!(
        c.clb.describe_load_balancers(),
        "DescribeLoadBalancers (Classic)"
    )?;
    let names: Vec<String> = lbs
        .iter()
        .filter_map(|l| l.load_balancer_name())
        .map(str::to_string)
        .collect();
    let owned = owned_tags(c, names).await?;
    Ok(ClbRead { lbs, owned })
}

pub(super) fn assemble(read: ClbRead, rd: &mut Reader<'_>) {
    let ClbRead { lbs, owned } = read;
    for l in &lbs {
        let Some(name) = rd.listed(CLASSIC_LOAD_BALANCER, l.load_balancer_name()) else {
            continue;
        };
        let Some(tags) = owned.get(name.as_str()) else {
            continue;
        };
        let id = id_from_tags(
            CLASSIC_LOAD_BALANCER,
            &name,
            tags.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        );
        rd.add::<ClassicLoadBalancer>(Head::listed(id.name, name), l);
    }
}
