//! An alias A record in the cluster's zone (the API's names, the bastion's) pointing at a load
//! balancer. Route 53 records carry no tags: the owner TXT record beside it (written in the
//! same batch) says which cluster owns it, and only a record with that proof is read. Route 53
//! has no ID for it; kprov's is `ZONE/NAME`.

use aws_sdk_route53::types::{AliasTarget, ChangeAction, ResourceRecordSet};

use super::{Apply, Delete, DnsZone, Done, LoadBalancer, Ref, Task, not_set};
use crate::cloud::aws::dns::{alias_set, change, dns_key, in_zone, owner_value, submit, txt_set};
use crate::cloud::aws::kinds::{AwsKind, DnsKind};
use crate::cloud::aws::{AwsCloud, Ctx, id_from};
use crate::cloud::engine::{CloudError, CloudId, FieldChange, IdMap};

task! {
    struct DnsRecord: AwsKind::Dns(DnsKind::Record), listed ListedRecord as l, rd;
    zone: Ref<DnsZone> = ZONE("zone") <- Ref::read(rd, &l.zone);
    /// Fully qualified, with its trailing dot; a new name is a new record.
    record_name: String = RECORD_NAME("recordName"), Replace <- l.owner.name().to_string();
    /// `A`: always on the desired record; on a read one when the A record is there (an owner
    /// record alone, left by an interrupted delete, reads without it, a change to make).
    record_type: Option<String> = TYPE("type") <- l.a.as_ref().map(|_| "A".to_string());
    /// Always on the desired record; on a read one when the A record is an alias.
    alias: Option<Ref<LoadBalancer>> = ALIAS("alias")
        // The load balancer's read keys it by DNS name (Route 53 aliases name it so).
        <- l.alias_target().map(|t| Ref::read(rd, &dns_key(t.dns_name())));
    /// Read only: the owner record's text, which its delete must name exactly.
    txt: Option<String> = TXT("txt")
        <- Some(
            l.owner
                .resource_records()
                .first()
                .map(|r| r.value())
                // why: a field the cloud left out reads as empty, which the diff shows as a change
                .unwrap_or_default()
                .to_string(),
        );
    /// Read only: the alias target as Route 53 has it, which its delete must name exactly.
    alias_dns: Option<String> = ALIAS_DNS("aliasDns")
        <- l.alias_target().map(|t| t.dns_name().to_string());
    alias_zone: Option<String> = ALIAS_ZONE("aliasZone")
        <- l.alias_target().map(|t| t.hosted_zone_id().to_string());
}

/// A record the read found: its zone's ID, the owner TXT set naming this cluster, and the A
/// set at the same name, if any.
pub(crate) struct ListedRecord {
    pub(crate) zone: CloudId,
    pub(crate) owner: ResourceRecordSet,
    pub(crate) a: Option<ResourceRecordSet>,
}

impl ListedRecord {
    fn alias_target(&self) -> Option<&AliasTarget> {
        self.a.as_ref().and_then(|a| a.alias_target())
    }
}

impl Task for DnsRecord {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        self.upsert(a.c, a.ids).await
    }

    /// The same UPSERT as the create (the name is fixed: a new one replaces the record).
    async fn update(&self, _: &Self, _: &[FieldChange], a: Apply<'_>) -> Done {
        self.upsert(a.c, a.ids).await.map(|_| ())
    }
}

impl Delete for DnsRecord {
    /// The owner record and the alias go in one batch, each named exactly as read.
    async fn delete(&self, a: Apply<'_>) -> Done {
        let (zone, name) = in_zone(&self.id(), self.cloud_id()?, "NAME")?;
        let txt = self.owner_text()?;
        let mut changes = vec![change(ChangeAction::Delete, txt_set(name, txt)?)?];
        if let (Some(dns), Some(z)) = (&self.alias_dns, &self.alias_zone) {
            changes.push(change(ChangeAction::Delete, alias_set(name, dns, z)?)?);
        }
        submit(a.c, zone, changes).await
    }
}

impl DnsRecord {
    /// The owner record's text, which a delete must name exactly. A read record always has it
    /// (it was read through it), so without it the delete is a model error: Route 53 would be
    /// sent an empty TXT record to delete.
    pub(super) fn owner_text(&self) -> Result<&str, CloudError> {
        self.txt.as_deref().ok_or_else(|| not_set(&self.id(), TXT))
    }

    /// Create and update alike: the alias and its owner TXT record go in one atomic batch.
    async fn upsert(&self, c: &AwsCloud, ids: &IdMap) -> Result<CloudId, CloudError> {
        let id = self.id();
        let zone = self.zone.resolve(ids)?;
        let name = &self.record_name;
        let arn = self
            .alias
            .as_ref()
            .ok_or_else(|| not_set(&id, ALIAS))?
            .resolve(ids)?;
        let lbs = c
            .elb
            .describe_load_balancers()
            .load_balancer_arns(arn)
            .send()
            .await
            .ctx("DescribeLoadBalancers")?;
        let lb = lbs.load_balancers().first().ok_or_else(|| {
            CloudError::not_ready(
                "DescribeLoadBalancers",
                format!("load balancer {arn} not found"),
            )
        })?;
        // The alias needs both; a load balancer listed without them is not ready to point at
        // (retried until the resource deadline, then named), never aliased to an empty name.
        let (Some(dns_name), Some(lb_zone)) = (
            lb.dns_name().filter(|s| !s.is_empty()),
            lb.canonical_hosted_zone_id().filter(|s| !s.is_empty()),
        ) else {
            return Err(CloudError::not_ready(
                "DescribeLoadBalancers",
                format!(
                    "{id}: load balancer {arn} has no DNS name or canonical hosted zone ID yet"
                ),
            ));
        };
        let changes = vec![
            change(ChangeAction::Upsert, alias_set(name, dns_name, lb_zone)?)?,
            change(ChangeAction::Upsert, txt_set(name, &owner_value(c, &id))?)?,
        ];
        submit(c, zone, changes).await?;
        id_from(&id, "the zone", zone).map(|z| z.join('/', name))
    }
}
