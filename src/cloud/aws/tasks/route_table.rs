//! A route table: its VPC, its routes (to the internet gateway or a zone's NAT gateway) and the
//! subnets associated with it.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::ResourceType;

use super::{
    Apply, Created, Delete, Done, Head, InternetGateway, Item, Kinded, NatGateway, Read, Ref,
    Subnet, Task, Vpc, gone,
};
use crate::cloud::aws::ec2::{gone_ok, tag_spec};
use crate::cloud::aws::kinds::{AwsKind, Ec2Kind};
use crate::cloud::aws::{AwsCloud, Ctx, Reader, after_create, finish_create};
use crate::cloud::engine::{CloudError, CloudId, FieldChange, IdMap, ResourceId, Value};

task! {
    struct RouteTable: AwsKind::Ec2(Ec2Kind::RouteTable);
    vpc: Ref<Vpc> = VPC("vpc");
    routes: Vec<Route> = ROUTES("routes");
    subnets: Vec<Ref<Subnet>> = SUBNETS("subnets");
    /// A read table's subnet associations (subnet cloud ID, association ID): what
    /// disassociating needs. Not compared (the desired table has none).
    associations: Option<Vec<Association>> = ASSOCIATIONS("associations");
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Route {
    /// The destination CIDR; never empty (EC2 would be sent a route to nowhere).
    pub(crate) destination: String,
    pub(crate) target: RouteTarget,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RouteTarget {
    InternetGateway(Ref<InternetGateway>),
    NatGateway(Ref<NatGateway>),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Association {
    pub(crate) subnet: String,
    pub(crate) id: String,
}

impl RouteTarget {
    fn value(&self) -> Value {
        match self {
            RouteTarget::InternetGateway(r) => r.value(),
            RouteTarget::NatGateway(r) => r.value(),
        }
    }

    /// A raw cloud ID's kind, by EC2's ID prefix.
    fn of_cloud_id(cid: &str) -> RouteTarget {
        if cid.starts_with("nat-") {
            RouteTarget::NatGateway(Ref::cloud(cid))
        } else {
            RouteTarget::InternetGateway(Ref::cloud(cid))
        }
    }

    fn read(rd: &Reader<'_>, cid: &str) -> RouteTarget {
        match rd.refs.get(cid) {
            Some(id) if id.kind == InternetGateway::KIND.kind() => {
                RouteTarget::InternetGateway(Ref::named(&id.name))
            }
            Some(id) if id.kind == NatGateway::KIND.kind() => {
                RouteTarget::NatGateway(Ref::named(&id.name))
            }
            _ => RouteTarget::of_cloud_id(cid),
        }
    }

    fn from_value(owner: &ResourceId, v: &Value) -> Result<RouteTarget, CloudError> {
        match v {
            Value::Ref(id) if id.kind == InternetGateway::KIND.kind() => {
                Ok(RouteTarget::InternetGateway(Ref::named(&id.name)))
            }
            Value::Ref(id) if id.kind == NatGateway::KIND.kind() => {
                Ok(RouteTarget::NatGateway(Ref::named(&id.name)))
            }
            Value::Str(s) => Ok(RouteTarget::of_cloud_id(s)),
            other => Err(CloudError::Model(format!(
                "{owner}: route target {other}: not a gateway"
            ))),
        }
    }

    fn resolve<'a>(&'a self, ids: &'a IdMap) -> Result<Resolved<'a>, CloudError> {
        Ok(match self {
            RouteTarget::InternetGateway(r) => Resolved::Gateway(r.resolve(ids)?),
            RouteTarget::NatGateway(r) => Resolved::Nat(r.resolve(ids)?),
        })
    }
}

/// A route's target as a cloud ID, and which kind of gateway it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resolved<'a> {
    Gateway(&'a str),
    Nat(&'a str),
}

impl Resolved<'_> {
    fn id(self) -> String {
        match self {
            Resolved::Gateway(g) | Resolved::Nat(g) => g.to_string(),
        }
    }
}

impl Item for Route {
    fn item(&self) -> Value {
        Value::List(vec![Value::str(&self.destination), self.target.value()])
    }

    fn from_item(owner: &ResourceId, _: &str, v: &Value) -> Result<Route, CloudError> {
        let [dest, target] = v.as_list() else {
            return Err(CloudError::Model(format!("{owner}: malformed route {v}")));
        };
        Ok(Route {
            destination: dest
                .as_str()
                .filter(|d| !d.is_empty())
                .ok_or_else(|| CloudError::Model(format!("{owner}: route {v}: no destination")))?
                .to_string(),
            target: RouteTarget::from_value(owner, target)?,
        })
    }
}

impl Item for Association {
    fn item(&self) -> Value {
        Value::List(vec![Value::str(&self.subnet), Value::str(&self.id)])
    }

    fn from_item(owner: &ResourceId, _: &str, v: &Value) -> Result<Association, CloudError> {
        match v.as_list() {
            [Value::Str(s), Value::Str(a)] => Ok(Association {
                subnet: s.clone(),
                id: a.clone(),
            }),
            _ => Err(CloudError::Model(format!(
                "{owner}: malformed association {v}"
            ))),
        }
    }
}

impl RouteTable {
    /// Routes by destination, targets as cloud IDs.
    fn resolved<'a>(
        &'a self,
        ids: &'a IdMap,
    ) -> Result<BTreeMap<&'a str, Resolved<'a>>, CloudError> {
        self.routes
            .iter()
            .map(|r| Ok((r.destination.as_str(), r.target.resolve(ids)?)))
            .collect()
    }

    fn subnet_ids(&self, ids: &IdMap) -> Result<BTreeSet<String>, CloudError> {
        self.subnets
            .iter()
            .map(|s| s.resolve(ids).map(str::to_string))
            .collect()
    }

    pub(super) fn read_associations(&self) -> Result<&[Association], CloudError> {
        self.associations.as_deref().ok_or_else(|| {
            CloudError::Model(format!(
                "{}: field {ASSOCIATIONS} is not set (not a table read from the cloud)",
                self.id()
            ))
        })
    }
}

impl Read for RouteTable {
    type Listed = aws_sdk_ec2::types::RouteTable;

    fn read(head: Head, t: &Self::Listed, rd: &Reader<'_>) -> Self {
        let routes = t
            .routes()
            .iter()
            .filter(|r| r.gateway_id() != Some("local"))
            .filter_map(|r| {
                let destination = r.destination_cidr_block()?.to_string();
                let target = r.gateway_id().or(r.nat_gateway_id())?;
                Some(Route {
                    destination,
                    target: RouteTarget::read(rd, target),
                })
            })
            .collect();
        let associations: Vec<Association> = t
            .associations()
            .iter()
            .filter(|a| a.main() != Some(true))
            .filter_map(|a| {
                Some(Association {
                    subnet: a.subnet_id()?.to_string(),
                    id: a.route_table_association_id()?.to_string(),
                })
            })
            .collect();
        RouteTable {
            head,
            vpc: Ref::read_or_empty(rd, t.vpc_id()),
            routes,
            subnets: Ref::read_all(rd, associations.iter().map(|a| &a.subnet)),
            associations: Some(associations),
        }
    }
}

impl Task for RouteTable {
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError> {
        let tid = a
            .ec2
            .create_route_table()
            .vpc_id(self.vpc.resolve(a.ids)?)
            .tag_specifications(tag_spec(a.c, ResourceType::RouteTable, &self.id(), &[]))
            .send()
            .await
            .created(self, "CreateRouteTable", |out| {
                out.route_table().and_then(|t| t.route_table_id())
            })?;
        // Call by call: a throttled route is retried alone, not with those already added.
        for (dest, target) in self.resolved(a.ids).map_err(after_create)? {
            finish_create(|| add_route(a.c, &tid, dest, target)).await?;
        }
        for sub in self.subnet_ids(a.ids).map_err(after_create)? {
            finish_create(|| associate(a.c, &tid, &sub)).await?;
        }
        Ok(tid)
    }

    async fn update(&self, have: &Self, _: &[FieldChange], a: Apply<'_>) -> Done {
        let tid = have.cloud_id()?;
        let want_routes = self.resolved(a.ids)?;
        let have_routes = have.resolved(a.ids)?;
        for (dest, target) in &want_routes {
            match have_routes.get(dest) {
                None => add_route(a.c, tid, dest, *target).await?,
                Some(t) if t.id() != target.id() => {
                    let req = a
                        .ec2
                        .replace_route()
                        .route_table_id(tid)
                        .destination_cidr_block(*dest);
                    let req = match target {
                        Resolved::Nat(n) => req.nat_gateway_id(*n),
                        Resolved::Gateway(g) => req.gateway_id(*g),
                    };
                    req.send().await.ctx("ReplaceRoute")?;
                }
                Some(_) => {}
            }
        }
        for dest in have_routes.keys().filter(|d| !want_routes.contains_key(*d)) {
            a.ec2
                .delete_route()
                .route_table_id(tid)
                .destination_cidr_block(*dest)
                .send()
                .await
                .ctx("DeleteRoute")?;
        }
        let want_subnets = self.subnet_ids(a.ids)?;
        let assoc: BTreeMap<&str, &str> = have
            .read_associations()?
            .iter()
            .map(|a| (a.subnet.as_str(), a.id.as_str()))
            .collect();
        for s in &want_subnets {
            if !assoc.contains_key(s.as_str()) {
                associate(a.c, tid, s).await?;
            }
        }
        for (s, assoc_id) in &assoc {
            if !want_subnets.contains(*s) {
                disassociate(a.c, assoc_id).await?;
            }
        }
        Ok(())
    }
}

impl Delete for RouteTable {
    async fn delete(&self, a: Apply<'_>) -> Done {
        let tid = self.cloud_id()?;
        for assoc in self.read_associations()? {
            gone_ok(disassociate(a.c, &assoc.id).await)?;
        }
        gone(
            a.ec2.delete_route_table().route_table_id(tid).send(),
            "DeleteRouteTable",
        )
        .await
    }
}

async fn add_route(
    c: &AwsCloud,
    table: &str,
    dest: &str,
    target: Resolved<'_>,
) -> Result<(), CloudError> {
    let req = c
        .ec2
        .create_route()
        .route_table_id(table)
        .destination_cidr_block(dest);
    let req = match target {
        Resolved::Nat(n) => req.nat_gateway_id(n),
        Resolved::Gateway(g) => req.gateway_id(g),
    };
    req.send().await.ctx("CreateRoute")?;
    Ok(())
}

async fn associate(c: &AwsCloud, table: &str, subnet: &str) -> Result<(), CloudError> {
    c.ec2
        .associate_route_table()
        .route_table_id(table)
        .subnet_id(subnet)
        .send()
        .await
        .ctx("AssociateRouteTable")?;
    Ok(())
}

async fn disassociate(c: &AwsCloud, assoc: &str) -> Result<(), CloudError> {
    c.ec2
        .disassociate_route_table()
        .association_id(assoc)
        .send()
        .await
        .ctx("DisassociateRouteTable")?;
    Ok(())
}
