//! EC2: VPC, subnets, internet gateway, route tables, elastic IPs, NAT gateways, security
//! groups and rules, the key pair, launch templates.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use aws_sdk_ec2::types::{
    Filter, InstanceType, LocationType, ResourceType, Tag, TagSpecification, VpcAttributeName,
};

use super::kinds::*;
use super::tasks::{
    ElasticIp, Fields, Head, InternetGateway, KeyPair, LaunchTemplate, ListedTemplate, NatGateway,
    Read, RouteTable, SecurityGroup, SecurityGroupRules, Subnet, Task, Vpc, VpcDns,
};
use super::{AwsCloud, Ctx, Reader, id_from_tags, owned_by};
use crate::cloud::engine::ErrorClass;
use crate::cloud::engine::{CloudError, Kind, Lifecycle, Resource, ResourceId, Value};
use crate::spec::Cluster;

fn owned(c: &AwsCloud) -> Filter {
    Filter::builder()
        .name(format!("tag:{}", super::owned_tag_key(&c.cluster)))
        .values("owned")
        .build()
}

fn filter(name: &str, values: impl IntoIterator<Item = String>) -> Filter {
    Filter::builder()
        .name(name)
        .set_values(Some(values.into_iter().collect()))
        .build()
}

fn tag_pairs(tags: &[Tag]) -> impl Iterator<Item = (&str, &str)> {
    tags.iter()
        // why: a tag without key or value matches no ownership or identity key
        .map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default()))
}

pub(super) fn tag_spec(
    c: &AwsCloud,
    rt: ResourceType,
    id: &ResourceId,
    extra: &[(&str, &str)],
) -> TagSpecification {
    let display = format!("{}.{}", id.name, c.cluster);
    let tags = c
        .tags(id, &display)
        .into_iter()
        .chain(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .map(|(k, v)| Tag::builder().key(k).value(v).build());
    TagSpecification::builder()
        .resource_type(rt)
        .set_tags(Some(tags.collect()))
        .build()
}

/// Splits kops-style `OWNER/NAME` (an account ID or an alias such as `amazon`) from a bare
/// image name. Names may use `*` and `?` wildcards; the newest match wins.
pub(super) fn split_owner(image: &str) -> (Option<&str>, &str) {
    match image.split_once('/') {
        Some((owner, name))
            if !owner.is_empty()
                && (owner.bytes().all(|b| b.is_ascii_digit())
                    || ["amazon", "self", "aws-marketplace"].contains(&owner)) =>
        {
            (Some(owner), name)
        }
        _ => (None, image),
    }
}

/// An image name pattern as DescribeImages's name filter understands it: `*` and `?` are
/// wildcards, a backslash makes the next character literal, anything else (`[`, `{`, `/`)
/// is itself. globset has richer syntax, so its other special characters are escaped and
/// `*` runs are collapsed (globset gives `**` a path meaning EC2 does not have).
fn name_matcher(pattern: &str) -> Result<globset::GlobMatcher, CloudError> {
    // With backslash escapes on, `\c` is the literal `c` for any `c` in globset.
    let literal = |glob: &mut String, c: char| {
        if !c.is_alphanumeric() {
            glob.push('\\');
        }
        glob.push(c);
    };
    let mut glob = String::with_capacity(pattern.len() * 2);
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            // A trailing backslash has nothing to escape: it is kept as itself.
            '\\' => literal(&mut glob, chars.next().unwrap_or('\\')),
            '*' => {
                while chars.peek() == Some(&'*') {
                    chars.next();
                }
                glob.push('*');
            }
            '?' => glob.push('?'),
            other => literal(&mut glob, other),
        }
    }
    globset::GlobBuilder::new(&glob)
        .literal_separator(false)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| CloudError::Model(format!("image name pattern {pattern:?}: {e}")))
}

/// Refuses subnets in zones EC2 does not offer in the region (a typo such as us-east-1z
/// would otherwise fail inside EC2 after the VPC and other resources were made).
pub(super) async fn check_zones(c: &AwsCloud, cluster: &Cluster) -> Result<(), CloudError> {
    let subnets = &cluster.spec.networking.subnets;
    if subnets.is_empty() {
        return Ok(());
    }
    let out = c
        .ec2
        .describe_availability_zones()
        .send()
        .await
        .ctx("DescribeAvailabilityZones")?;
    let known: Vec<&str> = out
        .availability_zones()
        .iter()
        .filter_map(|z| z.zone_name())
        .collect();
    for (i, sn) in subnets.iter().enumerate() {
        if !known.contains(&sn.zone.as_str()) {
            let region = cluster
                .spec
                .region
                .as_deref()
                .unwrap_or("the configured region");
            let list = if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            };
            return Err(CloudError::Spec(format!(
                "spec.networking.subnets[{i}].zone: availability zone {} does not exist in \
                 {region} (EC2 offers: {list}); nothing was changed",
                sn.zone
            )));
        }
    }
    Ok(())
}

/// One instance group as EC2 will launch it: its image, instance type and zones.
struct Launch<'a> {
    group: &'a str,
    image: &'a str,
    instance_type: &'a str,
    zones: BTreeSet<&'a str>,
}

/// The Elastic IP quota, checked at plan time: a plan that allocates more addresses (one per
/// NAT gateway) than the account has left in the region would stop at `AllocateAddress`
/// (`AddressLimitExceeded`) after the VPC and subnets exist. The limit is EC2's
/// `vpc-max-elastic-ips` account attribute (the "EC2-VPC Elastic IPs" quota, 5 by default),
/// the allocated ones every address of the region, the cluster's or not. Returns the plan's
/// error naming the numbers, or None; a read the caller may not make is the caller's warning.
pub(super) async fn check_address_quota(
    c: &AwsCloud,
    region: &str,
    need: usize,
) -> Result<Option<String>, CloudError> {
    if need == 0 {
        return Ok(None);
    }
    let (attrs, addresses) = tokio::join!(
        async {
            c.ec2
                .describe_account_attributes()
                .attribute_names(aws_sdk_ec2::types::AccountAttributeName::from(
                    "vpc-max-elastic-ips",
                ))
                .send()
                .await
                .ctx("DescribeAccountAttributes")
        },
        async {
            c.ec2
                .describe_addresses()
                .send()
                .await
                .ctx("DescribeAddresses")
        }
    );
    let limit = attrs?
        .account_attributes()
        .iter()
        .filter(|a| a.attribute_name() == Some("vpc-max-elastic-ips"))
        .flat_map(|a| a.attribute_values())
        .find_map(|v| v.attribute_value()?.parse::<usize>().ok());
    let Some(limit) = limit else {
        return Ok(None);
    };
    let allocated = addresses?.addresses().len();
    let left = limit.saturating_sub(allocated);
    Ok((need > left).then(|| {
        format!(
            "the plan allocates {need} Elastic IP address(es) (one per NAT gateway), but the \
             account has {left} of its {limit} left in {region} ({allocated} allocated): \
             AllocateAddress would fail with AddressLimitExceeded after the network exists. \
             Release unused addresses or raise the quota (Service Quotas, \"EC2-VPC Elastic \
             IPs\", L-0263D0A3) first; nothing was changed",
            region = crate::output::escape(region)
        )
    }))
}

/// Refuses, before any write, an instance group whose instance type cannot run its image's
/// architecture or is not offered in one of its zones: Auto Scaling accepts such a group and
/// then never starts an instance (a failed scaling activity, retried forever).
pub(super) async fn check_launchable(c: &AwsCloud, desired: &[Resource]) -> Result<(), CloudError> {
    let by_id: BTreeMap<&ResourceId, &Resource> = desired.iter().map(|r| (&r.id, r)).collect();
    let mut groups = Vec::new();
    for t in desired.iter().filter(|r| r.id.kind == LAUNCH_TEMPLATE) {
        let (Some(image), Some(instance_type)) = (
            t.get("imageId").and_then(Value::as_str),
            t.get("instanceType").and_then(Value::as_str),
        ) else {
            continue;
        };
        let asg = by_id.get(&ResourceId::new(AUTOSCALING_GROUP, &t.id.name));
        let zones = asg
            .and_then(|g| g.get("subnets"))
            .map(Value::as_list)
            // why: an absent list field is an empty list
            .unwrap_or_default()
            .iter()
            .filter_map(|s| by_id.get(s.as_ref_id()?)?.get("zone")?.as_str())
            .collect();
        groups.push(Launch {
            group: &t.id.name,
            image,
            instance_type,
            zones,
        });
    }
    if groups.is_empty() {
        return Ok(());
    }
    let types: BTreeSet<&str> = groups.iter().map(|g| g.instance_type).collect();
    let field = |g: &Launch, f: &str| {
        format!(
            "instance group {}: spec.{f}",
            crate::output::escape(g.group)
        )
    };
    // The types, the images and the offerings are independent: asked at once.
    let infos = async {
        match all_items!(
            c.ec2
                .describe_instance_types()
                .set_instance_types(Some(types.iter().map(|t| InstanceType::from(*t)).collect())),
            "DescribeInstanceTypes"
        ) {
            Ok(v) => Ok(v),
            // EC2 names the unknown types in its message; the groups using them are named here.
            Err(CloudError::Api { code, message, .. })
                if code.as_deref() == Some("InvalidInstanceType") =>
            {
                let bad: Vec<String> = groups
                    .iter()
                    .filter(|g| message.contains(g.instance_type))
                    .map(|g| format!("{} {}", field(g, "machineType"), g.instance_type))
                    .collect();
                Err(CloudError::Spec(format!(
                    "{}: EC2 has no such instance type ({message}); nothing was changed",
                    bad.join(", ")
                )))
            }
            Err(e) => Err(e),
        }
    };
    // By filter, not ImageIds: an image that does not exist is the apply's error to report.
    let image_ids: BTreeSet<String> = groups.iter().map(|g| g.image.to_string()).collect();
    let images = async {
        all_items!(
            c.ec2
                .describe_images()
                .filters(filter("image-id", image_ids)),
            "DescribeImages"
        )
    };
    let offered = async {
        all_items!(
            c.ec2
                .describe_instance_type_offerings()
                .location_type(LocationType::AvailabilityZone)
                .filters(filter("instance-type", types.iter().map(|t| t.to_string()))),
            "DescribeInstanceTypeOfferings"
        )
    };
    let (infos, images, offered): (Vec<_>, Vec<_>, Vec<_>) =
        tokio::try_join!(infos, images, offered)?;
    let archs: BTreeMap<&str, Vec<&str>> = infos
        .iter()
        .filter_map(|i| {
            Some((
                i.instance_type()?.as_str(),
                i.processor_info()?
                    .supported_architectures()
                    .iter()
                    .map(|a| a.as_str())
                    .collect(),
            ))
        })
        .collect();
    let offered: BTreeSet<(String, String)> = offered
        .into_iter()
        .filter_map(|o| {
            Some((
                o.instance_type()?.as_str().to_string(),
                o.location()?.to_string(),
            ))
        })
        .collect();
    for g in &groups {
        let image_arch = images
            .iter()
            .find(|i| i.image_id() == Some(g.image))
            .and_then(|i| i.architecture())
            .map(|a| a.as_str());
        if let (Some(arch), Some(supported)) = (image_arch, archs.get(g.instance_type))
            && !supported.contains(&arch)
        {
            return Err(CloudError::Spec(format!(
                "{}: instance type {} runs {} images, but image {} is {arch}; choose a type \
                 for {arch} or an image for {}; nothing was changed",
                field(g, "machineType"),
                g.instance_type,
                supported.join("/"),
                g.image,
                supported.join("/"),
            )));
        }
        for zone in &g.zones {
            if !offered.contains(&(g.instance_type.to_string(), zone.to_string())) {
                return Err(CloudError::Spec(format!(
                    "{}: instance type {} is not offered in availability zone {zone}; Auto \
                     Scaling would never start an instance there: choose another type or \
                     leave that zone's subnets out of spec.subnets; nothing was changed",
                    field(g, "machineType"),
                    g.instance_type,
                )));
            }
        }
    }
    Ok(())
}

/// Resolves image names to `ami-` IDs and their publishing accounts: one DescribeImages per
/// distinct owner. A bare name that matches images of several owners is refused: anyone can
/// publish an image under any name, so the owner must be said (as kops requires).
pub(super) async fn resolve_images(
    c: &AwsCloud,
    names: Vec<String>,
) -> Result<BTreeMap<String, (String, String)>, CloudError> {
    let mut by_owner: BTreeMap<Option<String>, Vec<String>> = BTreeMap::new();
    for n in &names {
        let (owner, pattern) = split_owner(n);
        by_owner
            .entry(owner.map(str::to_string))
            .or_default()
            .push(pattern.to_string());
    }
    let mut out = BTreeMap::new();
    for (owner, patterns) in by_owner {
        let mut req = c
            .ec2
            .describe_images()
            .filters(filter("name", patterns.clone()));
        if let Some(o) = &owner {
            req = req.owners(o.clone());
        }
        let images: Vec<_> = all_items!(req, "DescribeImages")?;
        for pattern in &patterns {
            let matcher = name_matcher(pattern)?;
            let matching: Vec<_> = images
                .iter()
                .filter(|i| i.name().is_some_and(|n| matcher.is_match(n)))
                .collect();
            let owners: BTreeSet<&str> = matching.iter().filter_map(|i| i.owner_id()).collect();
            if owner.is_none() && owners.len() > 1 {
                return Err(CloudError::Model(format!(
                    "image {pattern:?} is published by several accounts ({}); name the owner: OWNER/{pattern}",
                    owners.into_iter().collect::<Vec<_>>().join(", ")
                )));
            }
            let newest = matching
                .into_iter()
                .filter_map(|i| {
                    Some((
                        // why: an image without a date sorts oldest
                        i.creation_date().unwrap_or_default(),
                        i.image_id()?,
                        // why: shown only (the owner filter was the request)
                        i.owner_id().unwrap_or_default(),
                    ))
                })
                .max();
            if let Some((_, id, publisher)) = newest {
                let key = match &owner {
                    Some(o) => format!("{o}/{pattern}"),
                    None => pattern.clone(),
                };
                out.insert(key, (id.to_string(), publisher.to_string()));
            }
        }
    }
    Ok(out)
}

/// Every item a paginated EC2 Describe call lists under `filter`.
macro_rules! describe_all {
    ($c:expr, $describe:ident, $filter:expr, $op:literal) => {
        all_items!($c.ec2.$describe().filters($filter), $op)
    };
}

/// Items of one EC2 Describe call: those tagged as the cluster's, plus the adopted ones of
/// `kind` by ID (a filter, so a missing ID is no error here; the plan reports it), both asked
/// at once. Also returns adopted cloud ID → logical ID.
macro_rules! owned_and_adopted {
    ($c:expr, $desired:expr, $describe:ident, $id_filter:literal, $kind:expr, $op:literal) => {
        async {
            let adopted: BTreeMap<String, ResourceId> = super::adopted_in($desired, $kind)
                .filter_map(|r| Some((r.cloud_id.clone()?.into(), r.id.clone())))
                .collect();
            let owned_items = async { describe_all!($c, $describe, owned($c), $op) };
            let adopted_items = async {
                if adopted.is_empty() {
                    return Ok(Vec::new());
                }
                describe_all!(
                    $c,
                    $describe,
                    filter($id_filter, adopted.keys().cloned()),
                    $op
                )
            };
            let (mut items, more) = tokio::try_join!(owned_items, adopted_items)?;
            items.extend(more);
            Ok::<_, CloudError>((items, adopted))
        }
    };
}

/// The head of a listed item when it is ours (adopted by its ID, or tagged as this cluster's);
/// `None` when it is someone else's. Ownership is checked before anything about the item is
/// recorded: a resource of another cluster (which an API that ignores the tag filter returns)
/// is skipped, never made a conflict of this cluster's plan, even when it came without an ID.
fn listed_head(
    c: &AwsCloud,
    rd: &mut Reader<'_>,
    adopted: &BTreeMap<String, ResourceId>,
    kind: Kind,
    cloud_id: Option<&str>,
    tags: &[Tag],
) -> Option<Head> {
    let is_adopted = cloud_id.is_some_and(|id| adopted.contains_key(id));
    if !is_adopted && !owned_by(&c.cluster, tag_pairs(tags)) {
        return None;
    }
    let cid = rd.listed(kind, cloud_id)?;
    let (id, lifecycle) = classify(c, adopted, kind, &cid, tags)?;
    Some(Head {
        name: id.name,
        lifecycle,
        cloud_id: Some(cid),
    })
}

/// Reads and records the listed items of kind `T` that are ours ([`listed_head`]); returns
/// each task with the item it was read from.
fn read_listed<'a, T: Task>(
    c: &AwsCloud,
    rd: &mut Reader<'_>,
    adopted: &BTreeMap<String, ResourceId>,
    items: &'a [T::Listed],
    cloud_id: impl Fn(&T::Listed) -> Option<&str>,
    tags: impl Fn(&T::Listed) -> &[Tag],
) -> Vec<(&'a T::Listed, T)> {
    let mut out = Vec::new();
    for item in items {
        if let Some(head) = listed_head(c, rd, adopted, T::KIND.kind(), cloud_id(item), tags(item))
        {
            out.push((item, rd.add::<T>(head, item)));
        }
    }
    out
}

/// The logical ID and lifecycle of a read item: adopted, owned, or (None) someone else's.
fn classify(
    c: &AwsCloud,
    adopted: &BTreeMap<String, ResourceId>,
    kind: Kind,
    cloud_id: &str,
    tags: &[Tag],
) -> Option<(ResourceId, Lifecycle)> {
    match adopted.get(cloud_id) {
        Some(id) => Some((id.clone(), Lifecycle::ExistsAndValidates)),
        None if owned_by(&c.cluster, tag_pairs(tags)) => Some((
            id_from_tags(kind, cloud_id, tag_pairs(tags)),
            Lifecycle::Sync,
        )),
        None => None,
    }
}

/// What the network read gets from EC2, before any of it becomes a resource.
#[derive(Default)]
pub(super) struct NetworkRead {
    vpcs: Vec<aws_sdk_ec2::types::Vpc>,
    adopted_vpcs: BTreeMap<String, ResourceId>,
    /// (dnsSupport, dnsHostnames) of each owned VPC.
    vpc_dns: BTreeMap<String, (bool, bool)>,
    subnets: Vec<aws_sdk_ec2::types::Subnet>,
    adopted_subnets: BTreeMap<String, ResourceId>,
    igws: Vec<aws_sdk_ec2::types::InternetGateway>,
    /// The adopted VPC's gateway (found by its attachment) and its logical ID.
    adopted_igw: Option<(String, ResourceId)>,
    eips: Vec<aws_sdk_ec2::types::Address>,
    nats: Vec<aws_sdk_ec2::types::NatGateway>,
    tables: Vec<aws_sdk_ec2::types::RouteTable>,
}

/// Every network read at once; the DNS attributes of the owned VPCs follow their VPCs (the
/// only reads that need an answer first).
pub(super) async fn fetch_network(
    c: &AwsCloud,
    desired: &[Resource],
) -> Result<NetworkRead, CloudError> {
    // DescribeVpcAttribute answers one attribute per call: both, for every owned VPC, as soon
    // as the VPCs are known.
    let vpcs = async {
        let (vpcs, adopted) =
            owned_and_adopted!(c, desired, describe_vpcs, "vpc-id", VPC, "DescribeVpcs").await?;
        let owned_vpcs: Vec<String> = vpcs
            .iter()
            .filter_map(|v| {
                let vid = v.vpc_id()?;
                let (_, lc) = classify(c, &adopted, VPC, vid, v.tags())?;
                (lc != Lifecycle::ExistsAndValidates).then(|| vid.to_string())
            })
            .collect();
        let dns = futures::future::try_join_all(owned_vpcs.into_iter().map(|vid| async move {
            let (support, hostnames) = tokio::try_join!(
                vpc_attribute(c, &vid, VpcAttributeName::EnableDnsSupport),
                vpc_attribute(c, &vid, VpcAttributeName::EnableDnsHostnames),
            )?;
            Ok::<_, CloudError>((vid, (support, hostnames)))
        }))
        .await?;
        Ok::<_, CloudError>((vpcs, adopted, dns.into_iter().collect()))
    };
    let subnets = owned_and_adopted!(
        c,
        desired,
        describe_subnets,
        "subnet-id",
        SUBNET,
        "DescribeSubnets"
    );
    let igws = async {
        describe_all!(
            c,
            describe_internet_gateways,
            owned(c),
            "DescribeInternetGateways"
        )
    };
    // An adopted VPC's gateway is found by its attachment.
    let adopted_igw = async {
        let adopt_igw = super::adopted_in(desired, INTERNET_GATEWAY)
            .next()
            .map(|r| r.id.clone());
        let adopted_vpc = super::adopted_in(desired, VPC).find_map(|r| r.cloud_id.clone());
        let (Some(igw_id), Some(vpc_cid)) = (adopt_igw, adopted_vpc) else {
            return Ok(None);
        };
        let more: Vec<_> = describe_all!(
            c,
            describe_internet_gateways,
            filter("attachment.vpc-id", [String::from(vpc_cid)]),
            "DescribeInternetGateways"
        )?;
        Ok::<_, CloudError>(more.into_iter().next().map(|g| (g, igw_id)))
    };
    let eips = async {
        c.ec2
            .describe_addresses()
            .filters(owned(c))
            .send()
            .await
            .ctx("DescribeAddresses")
    };
    let nats = async {
        all_items!(
            c.ec2
                .describe_nat_gateways()
                .filter(owned(c))
                .filter(filter("state", ["pending".into(), "available".into()])),
            "DescribeNatGateways"
        )
    };
    let tables = async { describe_all!(c, describe_route_tables, owned(c), "DescribeRouteTables") };
    let (
        (vpcs, adopted_vpcs, vpc_dns),
        (subnets, adopted_subnets),
        mut igws,
        adopted_igw,
        eips,
        nats,
        tables,
    ) = tokio::try_join!(vpcs, subnets, igws, adopted_igw, eips, nats, tables)?;
    // A gateway listed without its ID is matched to nothing: the plan then says the adopted
    // gateway was not found, naming it.
    let adopted_igw = adopted_igw.and_then(|(g, id)| {
        let gid = g.internet_gateway_id()?.to_string();
        igws.push(g);
        Some((gid, id))
    });
    Ok(NetworkRead {
        vpcs,
        adopted_vpcs,
        vpc_dns,
        subnets,
        adopted_subnets,
        igws,
        adopted_igw,
        eips: eips.addresses().to_vec(),
        nats,
        tables,
    })
}

pub(super) fn assemble_network(c: &AwsCloud, read: NetworkRead, rd: &mut Reader<'_>) {
    let NetworkRead {
        vpcs,
        adopted_vpcs,
        vpc_dns,
        subnets,
        adopted_subnets,
        igws,
        adopted_igw,
        eips,
        nats,
        tables,
    } = read;
    let vpcs: Vec<_> = vpcs
        .into_iter()
        .map(|v| {
            let dns = v
                .vpc_id()
                .and_then(|vid| vpc_dns.get(vid))
                .map(|&(support, hostnames)| VpcDns { support, hostnames });
            (v, dns)
        })
        .collect();
    let none = BTreeMap::new();
    let adopted_igws: BTreeMap<String, ResourceId> = adopted_igw.into_iter().collect();
    read_listed::<Vpc>(
        c,
        rd,
        &adopted_vpcs,
        &vpcs,
        |(v, _)| v.vpc_id(),
        |(v, _)| v.tags(),
    );
    read_listed::<Subnet>(
        c,
        rd,
        &adopted_subnets,
        &subnets,
        |s| s.subnet_id(),
        |s| s.tags(),
    );
    read_listed::<InternetGateway>(
        c,
        rd,
        &adopted_igws,
        &igws,
        |g| g.internet_gateway_id(),
        |g| g.tags(),
    );
    // The addresses first: a NAT gateway's read names its address by the logical ID.
    read_listed::<ElasticIp>(c, rd, &none, &eips, |a| a.allocation_id(), |a| a.tags());
    read_listed::<NatGateway>(c, rd, &none, &nats, |n| n.nat_gateway_id(), |n| n.tags());
    read_listed::<RouteTable>(c, rd, &none, &tables, |t| t.route_table_id(), |t| t.tags());
}

pub(super) async fn fetch_security_groups(
    c: &AwsCloud,
) -> Result<Vec<aws_sdk_ec2::types::SecurityGroup>, CloudError> {
    describe_all!(
        c,
        describe_security_groups,
        owned(c),
        "DescribeSecurityGroups"
    )
}

pub(super) fn assemble_security_groups(
    c: &AwsCloud,
    groups: Vec<aws_sdk_ec2::types::SecurityGroup>,
    rd: &mut Reader<'_>,
) {
    let groups = read_listed::<SecurityGroup>(
        c,
        rd,
        &BTreeMap::new(),
        &groups,
        |g| g.group_id(),
        |g| g.tags(),
    );
    // The rules come second: they refer to groups by ID, and all groups are known now.
    for (g, group) in groups {
        let rules = SecurityGroupRules::read(group.head, g, rd);
        // Shares its group's cloud ID: pushed past `Reader::push` so that ID keeps mapping to
        // the group.
        rd.out.push(rules.resource());
    }
}

pub(super) async fn fetch_key_pairs(
    c: &AwsCloud,
) -> Result<Vec<aws_sdk_ec2::types::KeyPairInfo>, CloudError> {
    let out = c
        .ec2
        .describe_key_pairs()
        .filters(owned(c))
        .send()
        .await
        .ctx("DescribeKeyPairs")?;
    Ok(out.key_pairs().to_vec())
}

pub(super) fn assemble_key_pairs(
    c: &AwsCloud,
    keys: Vec<aws_sdk_ec2::types::KeyPairInfo>,
    rd: &mut Reader<'_>,
) {
    read_listed::<KeyPair>(
        c,
        rd,
        &BTreeMap::new(),
        &keys,
        |k| k.key_name(),
        |k| k.tags(),
    );
}

/// Version reads in flight at once: one per template that changed since kprov wrote it.
const VERSION_READS: usize = 8;

/// The desired launch templates, typed; one that does not decode has its version read (and
/// its apply fails naming the field).
fn wanted_templates(desired: &[Resource]) -> BTreeMap<&ResourceId, LaunchTemplate> {
    desired
        .iter()
        .filter(|r| r.id.kind == LAUNCH_TEMPLATE)
        .filter_map(|r| Some((&r.id, LaunchTemplate::from_resource(r).ok()?)))
        .collect()
}

/// The cluster's launch templates and the latest version of each one that needs reading.
pub(super) struct TemplatesRead {
    templates: Vec<aws_sdk_ec2::types::LaunchTemplate>,
    versions: Vec<aws_sdk_ec2::types::LaunchTemplateVersion>,
}

/// Lists the cluster's templates, then reads by ID the latest version of each one that is not
/// as kprov wrote it from the desired model ([`LaunchTemplate::as_written`]), a few at once.
/// Never the account's other templates: a version read without an ID would page through every
/// template of the account and their user-data, other clusters' too. An unchanged cluster's
/// preview reads no version, so what grows with the instance groups is the list alone; a
/// changed template costs one read in the second wave. A template nothing desires is read
/// too: its references order its deletion (before the profile and security groups it names).
pub(super) async fn fetch_launch_templates(
    c: &AwsCloud,
    desired: &[Resource],
) -> Result<TemplatesRead, CloudError> {
    use futures::{StreamExt, TryStreamExt};
    let templates: Vec<aws_sdk_ec2::types::LaunchTemplate> = all_items!(
        c.ec2
            .describe_launch_templates()
            .filters(owned(c))
            // AWS's largest page; moto returns only the first page (15 by default) and no token.
            .max_results(200),
        "DescribeLaunchTemplates"
    )?;
    let wanted = wanted_templates(desired);
    let to_read: Vec<String> = templates
        .iter()
        .filter(|t| owned_by(&c.cluster, tag_pairs(t.tags())))
        .filter_map(|t| {
            let tid = t.launch_template_id().filter(|s| !s.is_empty())?;
            let id = id_from_tags(LAUNCH_TEMPLATE, tid, tag_pairs(t.tags()));
            match wanted.get(&id) {
                Some(want) if want.as_written(t) => None,
                _ => Some(tid.to_string()),
            }
        })
        .collect();
    let versions: Vec<Vec<aws_sdk_ec2::types::LaunchTemplateVersion>> =
        futures::stream::iter(to_read)
            .map(|tid| async move {
                // One template per call: the API takes one template ID.
                c.ec2
                    .describe_launch_template_versions()
                    .launch_template_id(tid)
                    .versions("$Latest")
                    .send()
                    .await
                    .ctx("DescribeLaunchTemplateVersions")
                    .map(|out| out.launch_template_versions().to_vec())
                    // The preview takes no lock: a template deleted since the list (e.g. by a
                    // concurrent `delete instancegroup`) is read as no version, as the old
                    // account-wide read left it out, not as a failed preview.
                    .or_else(|e| match e.class() {
                        ErrorClass::NotFound => Ok(Vec::new()),
                        _ => Err(e),
                    })
            })
            .buffer_unordered(VERSION_READS)
            .try_collect()
            .await?;
    Ok(TemplatesRead {
        templates,
        versions: versions.into_iter().flatten().collect(),
    })
}

pub(super) fn assemble_launch_templates(c: &AwsCloud, read: TemplatesRead, rd: &mut Reader<'_>) {
    let TemplatesRead {
        templates,
        versions,
    } = read;
    let mut versions: BTreeMap<String, aws_sdk_ec2::types::LaunchTemplateVersion> = versions
        .into_iter()
        .filter_map(|v| Some((v.launch_template_id()?.to_string(), v)))
        .collect();
    let wanted = wanted_templates(rd.desired);
    for t in templates {
        let Some(head) = listed_head(
            c,
            rd,
            &BTreeMap::new(),
            LAUNCH_TEMPLATE,
            t.launch_template_id(),
            t.tags(),
        ) else {
            continue;
        };
        let id = ResourceId::new(LAUNCH_TEMPLATE, &head.name);
        let version = head
            .cloud_id
            .as_ref()
            .and_then(|tid| versions.remove(tid.as_str()));
        let listed = match version {
            Some(v) => ListedTemplate::Version(Box::new(v)),
            // Two templates with one identity (a conflict the reader reports) are each
            // judged against the desired one, as before the typed task.
            None => match wanted.get(&id).filter(|w| w.as_written(&t)) {
                Some(want) => ListedTemplate::Written(t, Box::new(want.clone())),
                None => ListedTemplate::Gone(t),
            },
        };
        rd.add::<LaunchTemplate>(head, &listed);
    }
}

pub(super) async fn wait_nat(c: &AwsCloud, nid: &str, gone: bool) -> Result<(), CloudError> {
    let mut delay = Duration::from_secs(1);
    loop {
        let out = match c
            .ec2
            .describe_nat_gateways()
            .nat_gateway_ids(nid)
            .send()
            .await
            .ctx("DescribeNatGateways")
        {
            Ok(out) => out,
            // Gone is what a delete waits for; right after the create the ID may not have
            // propagated yet (the engine's per-resource deadline bounds this wait).
            Err(e) if e.class() == ErrorClass::NotFound => {
                if gone {
                    return Ok(());
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
                continue;
            }
            Err(e) => return Err(e),
        };
        let state = out
            .nat_gateways()
            .first()
            .and_then(|n| n.state())
            .map(|s| s.as_str().to_string())
            .unwrap_or_else(|| "deleted".into());
        match (state.as_str(), gone) {
            ("available", false) | ("deleted", true) => return Ok(()),
            ("failed", _) => {
                return Err(CloudError::verdict(
                    "CreateNatGateway",
                    ErrorClass::Fatal,
                    format!("NAT gateway {nid} failed"),
                ));
            }
            // The engine's per-resource deadline bounds this wait; it backs off to 10 s.
            _ => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// A VPC's DNS attribute (DescribeVpcAttribute answers one attribute per call).
async fn vpc_attribute(
    c: &AwsCloud,
    vid: &str,
    attr: VpcAttributeName,
) -> Result<bool, CloudError> {
    let out = c
        .ec2
        .describe_vpc_attribute()
        .vpc_id(vid)
        .attribute(attr.clone())
        .send()
        .await
        .ctx("DescribeVpcAttribute")?;
    let value = match attr {
        VpcAttributeName::EnableDnsHostnames => out.enable_dns_hostnames(),
        _ => out.enable_dns_support(),
    };
    Ok(value.and_then(|v| v.value()).unwrap_or(false))
}

/// Deleting something already gone is success (an interrupted delete, re-run).
pub(super) fn gone_ok<T>(r: Result<T, CloudError>) -> Result<(), CloudError> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.class() == ErrorClass::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod image_tests {
    use super::*;

    #[test]
    fn owner_prefix() {
        assert_eq!(
            split_owner("099720109477/ubuntu/images/x-*"),
            (Some("099720109477"), "ubuntu/images/x-*")
        );
        assert_eq!(
            split_owner("amazon/al2023-ami-*"),
            (Some("amazon"), "al2023-ami-*")
        );
        assert_eq!(split_owner("ubuntu/images/x"), (None, "ubuntu/images/x"));
    }

    fn matches(pattern: &str, name: &str) -> bool {
        name_matcher(pattern).expect("valid pattern").is_match(name)
    }

    #[test]
    fn wildcards_as_ec2_filters_read_them() {
        assert!(matches(
            "ubuntu-*-amd64-server-*",
            "ubuntu-noble-24.04-amd64-server-20250101"
        ));
        assert!(matches("a?c", "abc"));
        assert!(!matches("ubuntu-*-arm64-*", "ubuntu-noble-amd64-x"));
        assert!(matches("exact", "exact") && !matches("exact", "exactly"));
        // `*` crosses `/` and `**` means no more than `*`, as in EC2's filters.
        assert!(matches(
            "ubuntu/images/*-server-*",
            "ubuntu/images/hvm-ssd/x-server-1"
        ));
        assert!(matches("a/**/b", "a/x/b") && !matches("a/**/b", "a/b"));
        // Characters globset would treat as syntax are literal in EC2.
        assert!(matches("img-[v1]-{x}", "img-[v1]-{x}") && !matches("img-[v1]-{x}", "img-v-x"));
        // A backslash makes the next character literal.
        assert!(matches(r"100\%-\*", "100%-*") && !matches(r"100\%-\*", "100%-x"));
        assert!(matches(r"ends\\", r"ends\"));
        assert!(matches(r"trailing\", r"trailing\"));
    }
}

#[cfg(test)]
mod read_tests {

    use aws_sdk_ec2::types::{InternetGateway, Subnet, Vpc};

    use super::*;

    fn cloud(cluster: &str) -> AwsCloud {
        let sdk = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .build();
        AwsCloud::new(&sdk, cluster, &[])
    }

    fn owner(cluster: &str) -> Tag {
        Tag::builder()
            .key(super::super::owned_tag_key(cluster))
            .value("owned")
            .build()
    }

    fn network(vpcs: Vec<Vpc>, subnets: Vec<Subnet>, igws: Vec<InternetGateway>) -> NetworkRead {
        NetworkRead {
            vpcs,
            subnets,
            igws,
            ..NetworkRead::default()
        }
    }

    fn read(c: &AwsCloud, n: NetworkRead) -> (Vec<Resource>, Vec<String>) {
        let mut rd = Reader::new(&[]);
        assemble_network(c, n, &mut rd);
        (rd.out, rd.conflicts)
    }

    /// An API that ignores the tag filter returns another cluster's VPC, subnet and gateway;
    /// some without their IDs. None of them becomes ours, not even as a conflict of this
    /// cluster's plan; this cluster's own ID-less VPC still does.
    #[test]
    fn another_clusters_network_is_never_recorded_even_without_its_id() {
        let c = cloud("mine.example.com");
        let theirs = owner("theirs.example.com");
        let (out, conflicts) = read(
            &c,
            network(
                vec![
                    Vpc::builder().tags(theirs.clone()).build(),
                    Vpc::builder()
                        .vpc_id("vpc-theirs")
                        .tags(theirs.clone())
                        .build(),
                ],
                vec![Subnet::builder().tags(theirs.clone()).build()],
                vec![InternetGateway::builder().tags(theirs.clone()).build()],
            ),
        );
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(conflicts, Vec::<String>::new());

        let (out, conflicts) = read(
            &c,
            network(
                vec![
                    Vpc::builder().tags(owner("mine.example.com")).build(),
                    Vpc::builder()
                        .vpc_id("vpc-mine")
                        .cidr_block("10.0.0.0/16")
                        .tags(owner("mine.example.com"))
                        .build(),
                ],
                vec![Subnet::builder().tags(theirs).build()],
                vec![],
            ),
        );
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].cloud_id.as_deref(), Some("vpc-mine"));
        assert_eq!(conflicts.len(), 1, "{conflicts:?}");
        assert!(conflicts[0].contains(VPC.as_str()), "{conflicts:?}");
    }
}
