//! Route53: the zone named by `spec.dns.zone` (adopted, never managed) and the API records.
//! Records cannot carry tags; a TXT record at the same name (external-dns's scheme) says which
//! cluster owns it, and only records with that proof are ever read as owned or deleted.

use std::time::Duration;

use aws_sdk_route53::types::{
    AliasTarget, Change, ChangeAction, ChangeBatch, ChangeStatus, ResourceRecord,
    ResourceRecordSet, RrType,
};

use super::kinds::*;
use super::tasks::{DnsRecord, DnsZone, DnsZoneVpc, Head, ListedAssociation, ListedRecord};
use super::{AwsCloud, Ctx, Reader, want_str};
use crate::cloud::engine::{CloudError, CloudId, Lifecycle, Resource, ResourceId, Value};

pub(super) fn owner_value(c: &AwsCloud, id: &ResourceId) -> String {
    format!(
        "\"heritage=kprov,kprov.dev/cluster={},kprov.dev/id={id}\"",
        c.cluster
    )
}

/// The resource the owner TXT value `txt` at `record` names: `None` when it is not this
/// cluster's owner record. One that names this cluster with an identity this version cannot
/// read (a kind another kprov version made) is refused: read as unowned, its record would be
/// overwritten by an UPSERT or leaked by a delete.
fn owner_id(cluster: &str, record: &str, txt: &str) -> Result<Option<ResourceId>, CloudError> {
    let prefix = format!("\"heritage=kprov,kprov.dev/cluster={cluster},kprov.dev/id=");
    let Some(tag) = txt.strip_prefix(&prefix).and_then(|t| t.strip_suffix('"')) else {
        return Ok(None);
    };
    AwsKind::parse_tag(tag).map(Some).map_err(|e| {
        let e = match e {
            CloudError::Model(m) => m,
            other => other.to_string(),
        };
        CloudError::Model(format!(
            "DNS record {}: owner TXT record of cluster {cluster}: {e}; \
             written by another kprov version? refusing to treat it as unowned",
            crate::output::escape(record)
        ))
    })
}

/// The resource the owner TXT records of `set` name, if any (the first one that does).
fn set_owner(cluster: &str, set: &ResourceRecordSet) -> Result<Option<ResourceId>, CloudError> {
    for r in set.resource_records() {
        if let Some(id) = owner_id(cluster, set.name(), r.value())? {
            return Ok(Some(id));
        }
    }
    Ok(None)
}

fn zone_id(raw: &str) -> &str {
    raw.trim_start_matches("/hostedzone/")
}

/// The zone's ID and the rest of `task`'s cloud ID `ZONE/REST` (`what` names the rest). A
/// hosted zone ID has no '/' (kprov strips `/hostedzone/`): the first one ends it.
pub(super) fn in_zone<'a>(
    task: &ResourceId,
    cloud_id: &'a str,
    what: &str,
) -> Result<(&'a str, &'a str), CloudError> {
    cloud_id.split_once('/').ok_or_else(|| {
        CloudError::Model(format!(
            "{task}: cloud ID {cloud_id:?} is not of the form ZONE/{what}"
        ))
    })
}

pub(super) fn dns_key(name: &str) -> String {
    let n = name.trim_end_matches('.').to_lowercase();
    n.strip_prefix("dualstack.")
        .map(str::to_string)
        .unwrap_or(n)
}

async fn find_zone(
    c: &AwsCloud,
    name: &str,
    private: Option<bool>,
) -> Result<Option<(CloudId, bool)>, CloudError> {
    let out = c
        .r53
        .list_hosted_zones_by_name()
        .dns_name(name)
        .send()
        .await
        .ctx("ListHostedZonesByName")?;
    Ok(out
        .hosted_zones()
        .iter()
        .filter(|z| z.name() == name)
        // A zone listed without its ID is no zone kprov can use: the plan says it is missing.
        .filter_map(|z| {
            let p = z.config().map(|c| c.private_zone()).unwrap_or(false);
            Some((CloudId::new(zone_id(z.id()))?, p))
        })
        .find(|(_, p)| private.is_none_or(|want| want == *p)))
}

async fn record_sets(c: &AwsCloud, zone: &str) -> Result<Vec<ResourceRecordSet>, CloudError> {
    let mut out = Vec::new();
    let mut next: Option<(String, RrType)> = None;
    loop {
        let mut req = c.r53.list_resource_record_sets().hosted_zone_id(zone);
        if let Some((n, t)) = next.take() {
            req = req.start_record_name(n).start_record_type(t);
        }
        let page = req.send().await.ctx("ListResourceRecordSets")?;
        out.extend(page.resource_record_sets().iter().cloned());
        match (
            page.is_truncated(),
            page.next_record_name(),
            page.next_record_type(),
        ) {
            (true, Some(n), Some(t)) => next = Some((n.to_string(), t.clone())),
            _ => return Ok(out),
        }
    }
}

/// The cluster's zone as Route 53 has it: its name and ID, whether it is private, the VPCs a
/// private zone is associated with, a public zone's delegation warning, and its record sets.
pub(crate) struct ZoneRead {
    /// Fully qualified (the name it was found by).
    pub(crate) name: String,
    zid: CloudId,
    pub(crate) is_private: bool,
    /// A private zone's associated VPC IDs.
    vpcs: Vec<String>,
    delegation: Option<String>,
    sets: Vec<ResourceRecordSet>,
}

/// The zone first (its ID is in every later call), then the rest of it at once.
pub(super) async fn fetch(
    c: &AwsCloud,
    desired: &[Resource],
) -> Result<Option<ZoneRead>, CloudError> {
    let Some(want) = desired.iter().find(|r| r.id.kind == DNS_ZONE) else {
        return Ok(None);
    };
    let name = want_str(want, "zoneName")?.to_string();
    let private = want.get("private").and_then(Value::as_bool);
    // A public zone's parent (for the delegation check) is found beside the zone itself: the
    // lookup needs only the name.
    let parent = name
        .trim_end_matches('.')
        .split_once('.')
        .map(|(_, p)| super::fqdn(p));
    let parent_zone = async {
        match &parent {
            Some(p) if private != Some(true) => find_zone(c, p, Some(false)).await,
            _ => Ok(None),
        }
    };
    let (zone, parent_zone) = tokio::try_join!(find_zone(c, &name, private), parent_zone)?;
    let Some((zid, is_private)) = zone else {
        return Ok(None);
    };
    let delegation = async {
        match &parent {
            Some(p) if !is_private => {
                let pid = parent_zone.as_ref().map(|(id, _)| id.as_str());
                check_delegation(c, &zid, &name, p, pid).await
            }
            _ => Ok(None),
        }
    };
    let vpcs = async {
        if !is_private {
            return Ok(Vec::new());
        }
        let zone = c
            .r53
            .get_hosted_zone()
            .id(zid.as_str())
            .send()
            .await
            .ctx("GetHostedZone")?;
        Ok(zone
            .vpcs()
            .iter()
            .filter_map(|v| v.vpc_id().map(str::to_string))
            .collect())
    };
    let (delegation, vpcs, sets) = tokio::try_join!(delegation, vpcs, record_sets(c, &zid))?;
    Ok(Some(ZoneRead {
        name,
        zid,
        is_private,
        vpcs,
        delegation,
        sets,
    }))
}

pub(super) fn assemble(
    c: &AwsCloud,
    read: Option<ZoneRead>,
    rd: &mut Reader<'_>,
) -> Result<(), CloudError> {
    let (Some(want), Some(read)) = (rd.desired.iter().find(|r| r.id.kind == DNS_ZONE), read) else {
        return Ok(());
    };
    let head = Head {
        name: want.id.name.clone(),
        lifecycle: Lifecycle::ExistsAndValidates,
        cloud_id: Some(read.zid.clone()),
    };
    rd.add::<DnsZone>(head, &read);
    if let Some(w) = read.delegation {
        rd.warnings.push(w);
    }
    if read.is_private {
        association(rd, &read.zid, &read.vpcs);
    }
    for txt in read.sets.iter().filter(|s| s.r#type() == &RrType::Txt) {
        let Some(id) = set_owner(&c.cluster, txt)? else {
            continue;
        };
        let head = Head {
            name: id.name,
            lifecycle: Lifecycle::Sync,
            cloud_id: Some(read.zid.join('/', txt.name())),
        };
        let listed = ListedRecord {
            zone: read.zid.clone(),
            owner: txt.clone(),
            a: read
                .sets
                .iter()
                .find(|s| s.name() == txt.name() && s.r#type() == &RrType::A)
                .cloned(),
        };
        rd.add::<DnsRecord>(head, &listed);
    }
    // A name this cluster would write that holds someone else's record: UPSERT would
    // silently take it over, so the plan refuses instead.
    // Every owner record was read above: one this version cannot read already failed there.
    let mut owned: Vec<&str> = Vec::new();
    for s in read.sets.iter().filter(|s| s.r#type() == &RrType::Txt) {
        if set_owner(&c.cluster, s)?.is_some() {
            owned.push(s.name());
        }
    }
    for want in rd.desired.iter().filter(|r| r.id.kind == DNS_RECORD) {
        let name = want_str(want, "recordName")?;
        if owned.contains(&name) {
            continue;
        }
        if let Some(s) = read
            .sets
            .iter()
            .find(|s| s.name() == name && s.r#type() != &RrType::Txt)
        {
            rd.conflicts.push(format!(
                "{}: {name} already has a {} record in zone {zone} that cluster {} does not own \
                 (no owner TXT record); remove it or choose another name",
                want.id,
                s.r#type().as_str(),
                c.cluster,
                zone = read.name,
            ));
        }
    }
    Ok(())
}

/// The private zone's association with the cluster's VPC. Only an association with a VPC kprov
/// owns is owned: one with an adopted VPC is its owner's and is never removed.
fn association(rd: &mut Reader<'_>, zid: &CloudId, zone_vpcs: &[String]) {
    // Read resources always carry a cloud ID (a `CloudId`, never empty).
    let Some((vpc_id, lifecycle)) = rd
        .out
        .iter()
        .find(|r| r.id == ResourceId::new(VPC, "main"))
        .and_then(|r| Some((r.cloud_id.clone()?, r.lifecycle)))
    else {
        return;
    };
    if zone_vpcs.iter().any(|v| v.as_str() == vpc_id.as_str()) {
        let head = Head {
            name: "main".to_string(),
            lifecycle,
            cloud_id: Some(zid.join('/', &vpc_id)),
        };
        let listed = ListedAssociation {
            zone: zid.clone(),
            vpc: vpc_id,
        };
        rd.add::<DnsZoneVpc>(head, &listed);
    }
}

/// Route53 answers only for zones the registrar or parent zone delegates to it. The parent can
/// be checked when it is in this account; otherwise say what must be confirmed by hand.
async fn check_delegation(
    c: &AwsCloud,
    zid: &str,
    name: &str,
    parent: &str,
    parent_id: Option<&str>,
) -> Result<Option<String>, CloudError> {
    let zone = async {
        c.r53
            .get_hosted_zone()
            .id(zid)
            .send()
            .await
            .ctx("GetHostedZone")
    };
    let parent_ns = async {
        let Some(pid) = parent_id else {
            return Ok(None);
        };
        c.r53
            .list_resource_record_sets()
            .hosted_zone_id(pid)
            .start_record_name(name)
            .start_record_type(RrType::Ns)
            .max_items(1)
            .send()
            .await
            .ctx("ListResourceRecordSets")
            .map(Some)
    };
    let (zone, parent_ns) = tokio::try_join!(zone, parent_ns)?;
    let mut servers: Vec<String> = zone
        .delegation_set()
        .map(|d| d.name_servers().iter().map(|s| dns_key(s)).collect())
        // why: a zone without a delegation set has no name servers to compare
        .unwrap_or_default();
    servers.sort();
    let unconfirmed = |why: &str| {
        Some(format!(
            "cannot confirm NS delegation of {name} ({why}); it must be delegated to {}",
            servers.join(", ")
        ))
    };
    let Some(out) = parent_ns else {
        return Ok(unconfirmed(&format!(
            "parent zone {parent} is not in this account"
        )));
    };
    let ns = out
        .resource_record_sets()
        .iter()
        .find(|s| s.name() == name && s.r#type() == &RrType::Ns);
    let mut delegated: Vec<String> = ns
        .map(|s| {
            s.resource_records()
                .iter()
                .map(|r| dns_key(r.value()))
                .collect()
        })
        // why: no NS set in the parent: nothing delegated (said as unconfirmed below)
        .unwrap_or_default();
    delegated.sort();
    Ok(if delegated.is_empty() {
        unconfirmed(&format!("parent zone {parent} has no NS record for it"))
    } else if delegated != servers {
        unconfirmed(&format!(
            "parent zone {parent} delegates to {}",
            delegated.join(", ")
        ))
    } else {
        None
    })
}

/// The SDK's builders fail only when a required field is missing, which would be a bug here.
fn built<T>(r: Result<T, aws_sdk_route53::error::BuildError>) -> Result<T, CloudError> {
    r.map_err(|e| CloudError::Model(format!("Route53 request: {e}")))
}

pub(super) fn txt_set(name: &str, value: &str) -> Result<ResourceRecordSet, CloudError> {
    built(
        ResourceRecordSet::builder()
            .name(name)
            .r#type(RrType::Txt)
            .ttl(300)
            .resource_records(built(ResourceRecord::builder().value(value).build())?)
            .build(),
    )
}

pub(super) fn alias_set(
    name: &str,
    dns: &str,
    zone: &str,
) -> Result<ResourceRecordSet, CloudError> {
    let target = AliasTarget::builder()
        .dns_name(dns)
        .hosted_zone_id(zone)
        .evaluate_target_health(false)
        .build();
    built(
        ResourceRecordSet::builder()
            .name(name)
            .r#type(RrType::A)
            .alias_target(built(target)?)
            .build(),
    )
}

pub(super) fn change(action: ChangeAction, set: ResourceRecordSet) -> Result<Change, CloudError> {
    built(
        Change::builder()
            .action(action)
            .resource_record_set(set)
            .build(),
    )
}

pub(super) async fn submit(
    c: &AwsCloud,
    zone: &str,
    changes: Vec<Change>,
) -> Result<(), CloudError> {
    let out = c
        .r53
        .change_resource_record_sets()
        .hosted_zone_id(zone)
        .change_batch(built(
            ChangeBatch::builder().set_changes(Some(changes)).build(),
        )?)
        .send()
        .await
        .ctx("ChangeResourceRecordSets")?;
    let Some(info) = out.change_info() else {
        return Ok(());
    };
    let mut status = info.status().clone();
    // The engine's per-resource deadline bounds this wait.
    while status != ChangeStatus::Insync {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let got = c
            .r53
            .get_change()
            .id(info.id())
            .send()
            .await
            .ctx("GetChange")?;
        status = got
            .change_info()
            .map(|i| i.status().clone())
            .unwrap_or(ChangeStatus::Insync);
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    use super::*;

    const CLUSTER: &str = "c.example.com";

    fn cloud() -> AwsCloud {
        let sdk = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .build();
        AwsCloud::new(&sdk, CLUSTER, &[])
    }

    fn owner_txt(name: &str, cluster: &str, id: &str) -> ResourceRecordSet {
        txt_set(
            name,
            &format!("\"heritage=kprov,kprov.dev/cluster={cluster},kprov.dev/id={id}\""),
        )
        .expect("a TXT set")
    }

    /// The zone read holding `sets`, assembled against a plan that wants the API record.
    fn assemble_sets(sets: Vec<ResourceRecordSet>) -> Result<Vec<Resource>, CloudError> {
        let desired = [
            Resource::new(DNS_ZONE, "main").field("zoneName", Value::str("example.com.")),
            Resource::new(DNS_RECORD, "api").field("recordName", Value::str("api.example.com.")),
        ];
        let mut rd = Reader::new(&desired);
        let read = ZoneRead {
            name: "example.com.".into(),
            zid: CloudId::new("Z1").expect("not empty"),
            is_private: false,
            vpcs: vec![],
            delegation: None,
            sets,
        };
        assemble(&cloud(), Some(read), &mut rd)?;
        Ok(rd.out)
    }

    /// A record's or association's cloud ID is `ZONE/REST`; one without the '/' is a model
    /// error naming the task, never a call with an empty name.
    #[test]
    fn a_cloud_id_in_a_zone_splits_at_the_first_slash() {
        let id = ResourceId::new(DNS_RECORD, "api");
        assert_eq!(
            in_zone(&id, "Z1/a/b.example.com.", "NAME").ok(),
            Some(("Z1", "a/b.example.com."))
        );
        let e = in_zone(&id, "Z1", "NAME").expect_err("no slash");
        assert_eq!(
            e.to_string(),
            "resource model: DnsRecord/api: cloud ID \"Z1\" is not of the form ZONE/NAME"
        );
    }

    /// An owner record naming this cluster with a kind this version does not know was
    /// written by another kprov version: the plan refuses, naming the record, instead of
    /// reading the name as unowned (then overwritten by UPSERT, or never deleted).
    #[test]
    fn an_owner_record_of_an_unknown_kind_is_refused_naming_it() {
        let e = assemble_sets(vec![owner_txt(
            "api.example.com.",
            CLUSTER,
            "DnsRecordV9/api",
        )])
        .expect_err("an owner record this version cannot read");
        let msg = e.to_string();
        assert!(msg.contains("DNS record api.example.com."), "{msg}");
        assert!(msg.contains("DnsRecordV9/api"), "{msg}");
        assert!(msg.contains("refusing to treat it as unowned"), "{msg}");
        assert_eq!(msg.matches("resource model").count(), 1, "{msg}");

        // Another cluster's record, whatever its kind, is not this cluster's to read.
        let out = assemble_sets(vec![owner_txt(
            "api.example.com.",
            "other.example.com",
            "DnsRecordV9/api",
        )])
        .expect("another cluster's record is not ours");
        assert!(out.iter().all(|r| r.id.kind != DNS_RECORD), "{out:?}");

        // This cluster's record of a known kind is read as owned.
        let out = assemble_sets(vec![owner_txt(
            "api.example.com.",
            CLUSTER,
            "DnsRecord/api",
        )])
        .expect("an owned record");
        let rec = out
            .iter()
            .find(|r| r.id == ResourceId::new(DNS_RECORD, "api"))
            .expect("the record is read");
        assert_eq!(rec.cloud_id.as_deref(), Some("Z1/api.example.com."));
        assert_eq!(rec.get("zone"), Some(&Value::reference(DNS_ZONE, "main")));

        // The zone reads as the adopted zone the plan wants, by the name it was found by.
        let zone = out
            .iter()
            .find(|r| r.id == ResourceId::new(DNS_ZONE, "main"))
            .expect("the zone is read");
        assert_eq!(zone.lifecycle, Lifecycle::ExistsAndValidates);
        assert_eq!(zone.cloud_id.as_deref(), Some("Z1"));
        assert_eq!(zone.get_str("zoneName"), Some("example.com."));
        assert_eq!(zone.get("private"), Some(&Value::Bool(false)));
    }
}
