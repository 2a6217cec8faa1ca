//! A security group's ingress rules: a kind apart from the group, because groups admit each
//! other and every group must exist before a rule names one. "Creating" it authorizes the
//! rules, an update revokes what is no longer wanted and authorizes what is missing, deleting
//! revokes them. It shares its group's name and cloud ID.
//!
//! Only kprov's rules are read: those the AWS cloud-controller-manager adds for a Service's
//! load balancer, and those from a group that is not one of kprov's (the CCM's Classic ELB
//! group, another team's), are theirs to add and remove; kprov neither compares nor revokes
//! them.

use aws_sdk_ec2::types::{IpPermission, IpRange, UserIdGroupPair};

use super::{Apply, Delete, Done, Head, Item, Kinded, Read, Ref, SecurityGroup, Task};
use crate::cloud::aws::ec2::gone_ok;
use crate::cloud::aws::kinds::{AwsKind, Ec2Kind};
use crate::cloud::aws::{AwsCloud, Ctx, Reader, UNTRACKED, id_from};
use crate::cloud::engine::{CloudError, CloudId, FieldChange, IdMap, ResourceId, Value};

const ANYWHERE: &str = "0.0.0.0/0";

task! {
    struct SecurityGroupRules: AwsKind::Ec2(Ec2Kind::SecurityGroupRules);
    group: Ref<SecurityGroup> = GROUP("group");
    ingress: Vec<Rule> = INGRESS("ingress");
}

/// One ingress rule; in the field map `[protocol, ports, source]`, as plans have always shown
/// it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rule {
    /// EC2's protocol name or number; `-1` is every protocol.
    pub(crate) protocol: String,
    pub(crate) ports: Ports,
    pub(crate) source: Source,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ports {
    All,
    /// From, to (inclusive); one port is a range of one.
    Range(i32, i32),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Source {
    Cidr(String),
    Group(Ref<SecurityGroup>),
}

impl Ports {
    fn value(self) -> Value {
        match self {
            Ports::All => Value::str("all"),
            Ports::Range(from, to) if from == to => Value::str(from.to_string()),
            Ports::Range(from, to) => Value::str(format!("{from}-{to}")),
        }
    }

    /// `all`, `22` or `30000-32767`; a lone port may be negative (ICMP's `-1`, read back).
    fn parse(s: &str) -> Option<Ports> {
        if s == "all" {
            return Some(Ports::All);
        }
        if let Ok(p) = s.parse() {
            return Some(Ports::Range(p, p));
        }
        let dash = s.get(1..)?.find('-')? + 1;
        Some(Ports::Range(
            s[..dash].parse().ok()?,
            s[dash + 1..].parse().ok()?,
        ))
    }

    /// What EC2 lists: every port for every protocol, or without a from-port.
    fn of(p: &IpPermission) -> Ports {
        match (p.ip_protocol(), p.from_port(), p.to_port()) {
            (Some("-1"), _, _) | (_, None, _) => Ports::All,
            (_, Some(from), to) => Ports::Range(from, to.unwrap_or(from)),
        }
    }
}

impl Source {
    fn value(&self) -> Value {
        match self {
            Source::Cidr(c) => Value::str(c),
            Source::Group(g) => g.value(),
        }
    }

    /// A reference to a group, a group's raw ID (`sg-...`), or a CIDR.
    fn from_value(owner: &ResourceId, v: &Value) -> Option<Source> {
        match v {
            Value::Ref(_) => Ref::from_value(owner, INGRESS, Some(v))
                .ok()
                .map(Source::Group),
            Value::Str(s) if s.starts_with("sg-") => Some(Source::Group(Ref::cloud(s))),
            Value::Str(s) => Some(Source::Cidr(s.clone())),
            _ => None,
        }
    }
}

impl Item for Rule {
    fn item(&self) -> Value {
        Value::List(vec![
            Value::str(&self.protocol),
            self.ports.value(),
            self.source.value(),
        ])
    }

    fn from_item(owner: &ResourceId, _: &str, v: &Value) -> Result<Rule, CloudError> {
        let bad = || CloudError::Model(format!("{owner}: malformed security group rule {v}"));
        let [protocol, ports, source] = v.as_list() else {
            return Err(bad());
        };
        Ok(Rule {
            protocol: protocol.as_str().ok_or_else(bad)?.to_string(),
            ports: ports.as_str().and_then(Ports::parse).ok_or_else(bad)?,
            source: Source::from_value(owner, source).ok_or_else(bad)?,
        })
    }
}

impl Rule {
    /// Every protocol and port from `source`.
    pub(crate) fn all(source: Source) -> Rule {
        Rule {
            protocol: "-1".into(),
            ports: Ports::All,
            source,
        }
    }

    /// TCP to `port` from `source`.
    pub(crate) fn tcp(port: u16, source: Source) -> Rule {
        Rule {
            protocol: "tcp".into(),
            ports: Ports::Range(port.into(), port.into()),
            source,
        }
    }

    pub(super) fn permission(&self, ids: &IdMap) -> Result<IpPermission, CloudError> {
        let b = IpPermission::builder().ip_protocol(&self.protocol);
        let b = match self.ports {
            Ports::All => b,
            Ports::Range(from, to) => b.from_port(from).to_port(to),
        };
        Ok(match &self.source {
            Source::Group(g) => {
                b.user_id_group_pairs(UserIdGroupPair::builder().group_id(g.resolve(ids)?).build())
            }
            Source::Cidr(c) => b.ip_ranges(IpRange::builder().cidr_ip(c).build()),
        }
        .build())
    }
}

impl SecurityGroupRules {
    /// Whether a rule admits the whole internet to `port` (what the preview warns about).
    pub(crate) fn open_to_anywhere(&self, port: u16) -> bool {
        let port = i32::from(port);
        self.ingress.iter().any(|r| {
            r.ports == Ports::Range(port, port) && r.source == Source::Cidr(ANYWHERE.into())
        })
    }
}

impl Read for SecurityGroupRules {
    type Listed = aws_sdk_ec2::types::SecurityGroup;

    /// The rules of group `g`, read after every group is known (a rule names its source
    /// group by ID).
    fn read(head: Head, g: &Self::Listed, rd: &Reader<'_>) -> Self {
        let mut ingress = Vec::new();
        for p in g.ip_permissions() {
            let protocol = p.ip_protocol().unwrap_or("-1");
            let ports = Ports::of(p);
            let rule = |source| Rule {
                protocol: protocol.to_string(),
                ports,
                source,
            };
            for r in p.ip_ranges().iter().filter(|r| !ccm_rule(r.description())) {
                // why: a field the cloud left out reads as empty, which the diff shows as a change
                ingress.push(rule(Source::Cidr(
                    r.cidr_ip().unwrap_or_default().to_string(),
                )));
            }
            for pair in p
                .user_id_group_pairs()
                .iter()
                .filter(|p| !ccm_rule(p.description()))
            {
                if let Some(group) = kprov_group(rd, pair.group_id()) {
                    ingress.push(rule(Source::Group(group)));
                }
            }
        }
        SecurityGroupRules {
            group: Ref::named(&head.name),
            head,
            ingress,
        }
    }
}

impl Task for SecurityGroupRules {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        let gid = self.group.resolve(a.ids)?;
        authorize(a.c, gid, &self.ingress, a.ids).await?;
        id_from(&self.id(), "the group reference", gid)
    }

    async fn update(&self, have: &Self, _: &[FieldChange], a: Apply<'_>) -> Done {
        let gid = have.cloud_id()?;
        let missing: Vec<Rule> = self
            .ingress
            .iter()
            .filter(|r| !have.ingress.contains(r))
            .cloned()
            .collect();
        let extra: Vec<Rule> = have
            .ingress
            .iter()
            .filter(|r| !self.ingress.contains(r))
            .cloned()
            .collect();
        revoke(a.c, gid, &extra, a.ids).await?;
        authorize(a.c, gid, &missing, a.ids).await
    }
}

impl Delete for SecurityGroupRules {
    async fn delete(&self, a: Apply<'_>) -> Done {
        gone_ok(revoke(a.c, self.cloud_id()?, &self.ingress, a.ids).await)
    }
}

/// A rule the AWS cloud-controller-manager added for a Service's load balancer: it marks
/// its rules `kubernetes.io/rule/nlb/client=...`, `.../health=...`, `.../mtu...`.
fn ccm_rule(description: Option<&str>) -> bool {
    description.is_some_and(|d| d.starts_with("kubernetes.io/"))
}

/// A rule's source group when it is one of kprov's own groups of this cluster (one that lost
/// its identity tag is not: it is planned for deletion).
fn kprov_group(rd: &Reader<'_>, gid: Option<&str>) -> Option<Ref<SecurityGroup>> {
    match rd.refs.get(gid?) {
        Some(id) if id.kind == SecurityGroup::KIND.kind() && !id.name.starts_with(UNTRACKED) => {
            Some(Ref::named(&id.name))
        }
        _ => None,
    }
}

fn permissions(rules: &[Rule], ids: &IdMap) -> Result<Vec<IpPermission>, CloudError> {
    rules.iter().map(|r| r.permission(ids)).collect()
}

async fn authorize(c: &AwsCloud, gid: &str, rules: &[Rule], ids: &IdMap) -> Result<(), CloudError> {
    if rules.is_empty() {
        return Ok(());
    }
    c.ec2
        .authorize_security_group_ingress()
        .group_id(gid)
        .set_ip_permissions(Some(permissions(rules, ids)?))
        .send()
        .await
        .ctx("AuthorizeSecurityGroupIngress")?;
    Ok(())
}

async fn revoke(c: &AwsCloud, gid: &str, rules: &[Rule], ids: &IdMap) -> Result<(), CloudError> {
    if rules.is_empty() {
        return Ok(());
    }
    c.ec2
        .revoke_security_group_ingress()
        .group_id(gid)
        .set_ip_permissions(Some(permissions(rules, ids)?))
        .send()
        .await
        .ctx("RevokeSecurityGroupIngress")?;
    Ok(())
}
