//! Typed AWS tasks, one file per kind (as kops's `awstasks`): a task is a struct with typed fields
//! and [`Ref`]s to the resources it needs, and one [`Task`] trait says how it becomes the engine's
//! resource (the fields the generic diff compares and prints, and their rules), how it is read back
//! from the cloud (kops's Find, its supertrait [`Read`]), and how it is created, updated and
//! deleted (kops's Render) against one [`Apply`] context (kops's target: the cloud and the cloud
//! IDs recorded so far). Its delete is the supertrait [`Delete`]: most kinds are deleted by one
//! call naming their cloud ID, which `delete_by_id!` declares in one line. The engine stays
//! generic: it diffs the field maps `resource()` makes, and apply hands them back, decoded once
//! by `from_resource` (a missing or mistyped field is a model error naming the resource and
//! field, never an empty value sent to AWS).
//!
//! A kind whose fields each map to one engine field is declared with `task!` (the struct, its
//! [`Kinded`], its [`Fields`], its field-name constants and its [`Read`], from one table of
//! field, type, name, rule and read expression: a field is declared once, in one row, with how
//! it is held, compared and read), so a new kind writes only what is its own: how it is
//! created, updated and deleted.
//!
//! The tasks: the EC2 networking kinds ([`Vpc`], [`Subnet`], [`InternetGateway`],
//! [`RouteTable`], [`ElasticIp`], [`NatGateway`]), [`SecurityGroup`] and [`SecurityGroupRules`],
//! the key pair ([`KeyPair`], its key an input the diff never sees), the IAM role, its policy
//! and its instance profile ([`IamRole`], [`IamRolePolicy`], [`IamInstanceProfile`]), the
//! Route 53 kinds ([`DnsZone`], [`DnsRecord`], [`DnsZoneVpc`]; the owner TXT records that prove
//! a record is the cluster's stay in `dns.rs`), and the network load balancer with its target
//! group and listener ([`LoadBalancer`], [`TargetGroup`], [`Listener`]); the Classic ELBs the
//! cloud-controller-manager makes are read and deleted as [`ClassicLoadBalancer`]; the
//! [`LaunchTemplate`]; and the [`AutoScalingGroup`] that launches it. Every kind kprov writes
//! is a task; the instances are only read (`instances.rs`): their group makes and ends them.
//! A typed reference to a kind that is not a task would use a marker type (an uninhabited
//! enum implementing [`Kinded`]).

/// Declares the [`Delete`] of a kind that is deleted by one call naming its cloud ID: the
/// client, the operation and the setter the ID goes to, and the operation's name for errors
/// (`delete_by_id!(Vpc: ec2.delete_vpc().vpc_id, "DeleteVpc")`). An answer that the resource
/// is already gone is success ([`gone`]). A kind whose delete does more writes [`Delete`] by
/// hand.
macro_rules! delete_by_id {
    ($name:ident: $client:ident.$op:ident().$setter:ident, $operation:literal) => {
        impl $crate::cloud::aws::tasks::Delete for $name {
            async fn delete(
                &self,
                a: $crate::cloud::aws::tasks::Apply<'_>,
            ) -> $crate::cloud::aws::tasks::Done {
                let cid = $crate::cloud::aws::tasks::Task::cloud_id(self)?;
                $crate::cloud::aws::tasks::gone(a.$client.$op().$setter(cid).send(), $operation)
                    .await
            }
        }
    };
}

/// Declares a task whose typed fields each map to one field of the engine's resource: the
/// struct (its [`Head`] and the fields), the kind it stands for ([`Kinded`]), its [`Fields`],
/// and, when each field is read from the listed item by one expression, its [`Read`]. Each
/// field row says all there is to it: its name and type, the constant that is its name in the
/// engine's map (declared here when its text follows, `VPC("vpc")`, else one the file
/// declares), optionally the [`Codec`] that holds it when that is not its own type (`as Doc`),
/// optionally its [`FieldRule`](crate::cloud::engine::FieldRule) (`Mutable` when none is
/// given), and how a read finds it (`<- expr`). The read expressions name the listed item and
/// the [`Reader`] as the struct line's `listed TYPE as ITEM, READER` says (`READER` left out
/// when no field needs it); a read longer than an expression calls a helper of the kind's
/// file. A kind whose fields are not read one by one (the auto scaling group's capacity, judged
/// against the desired group) leaves out `listed` and the `<-`s and writes [`Read`] by hand;
/// one whose fields do not map one to one (the VPC's DNS pair) writes [`Fields`] by hand too.
macro_rules! task {
    (@codec $ty:ty) => { $ty };
    (@codec $ty:ty, $codec:ident) => { $codec };
    (@reader) => { _ };
    (@reader $rd:ident) => { $rd };
    (@read $name:ident [] $($field:ident: ;)*) => {};
    (@read $name:ident [$listed:ty, $l:ident $(, $rd:ident)?] $($field:ident: $read:expr;)*) => {
        impl $crate::cloud::aws::tasks::Read for $name {
            type Listed = $listed;

            fn read(
                head: $crate::cloud::aws::tasks::Head,
                $l: &$listed,
                task!(@reader $($rd)?): &$crate::cloud::aws::Reader<'_>,
            ) -> Self {
                $name {
                    head,
                    $( $field: $read, )*
                }
            }
        }
    };
    (
        $(#[$meta:meta])*
        struct $name:ident: $kind:expr $(, listed $listed:ty as $l:ident $(, $rd:ident)?)?;
        $(
            $(#[$fmeta:meta])*
            $field:ident: $ty:ty = $key:ident $(($text:literal))? $(as $codec:ident)?
                $(, $rule:ident)? $(<- $read:expr)?;
        )*
    ) => {
        $( $( const $key: &str = $text; )? )*

        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        pub(crate) struct $name {
            pub(crate) head: $crate::cloud::aws::tasks::Head,
            $( $(#[$fmeta])* pub(crate) $field: $ty, )*
        }

        impl $crate::cloud::aws::tasks::Kinded for $name {
            const KIND: $crate::cloud::aws::kinds::AwsKind = $kind;
        }

        impl $crate::cloud::aws::tasks::Fields for $name {
            fn head(&self) -> &$crate::cloud::aws::tasks::Head {
                &self.head
            }

            fn resource(&self) -> $crate::cloud::engine::Resource {
                let r = self.head.resource::<$name>();
                $(
                    let r = <task!(@codec $ty $(, $codec)?) as
                        $crate::cloud::aws::tasks::Codec<$ty>>::put(&self.$field, r, $key);
                    $( let r = r.rule($key, $crate::cloud::engine::FieldRule::$rule); )?
                )*
                r
            }

            fn from_resource(
                r: &$crate::cloud::engine::Resource,
            ) -> Result<Self, $crate::cloud::engine::CloudError> {
                Ok($name {
                    head: $crate::cloud::aws::tasks::Head::of(r),
                    $(
                        $field: <task!(@codec $ty $(, $codec)?) as
                            $crate::cloud::aws::tasks::Codec<$ty>>::take(r, $key)?,
                    )*
                })
            }
        }

        task!(@read $name [$($listed, $l $(, $rd)?)?] $($field: $($read)?;)*);
    };
}

mod auto_scaling_group;
mod classic_load_balancer;
mod dns_record;
mod dns_zone;
mod dns_zone_vpc;
mod elastic_ip;
mod iam_instance_profile;
mod iam_role;
mod iam_role_policy;
mod internet_gateway;
mod key_pair;
mod launch_template;
mod listener;
mod load_balancer;
mod nat_gateway;
mod route_table;
mod security_group;
mod security_group_rules;
mod subnet;
mod target_group;
mod vpc;

use std::fmt;
use std::marker::PhantomData;

pub(crate) use auto_scaling_group::AutoScalingGroup;
pub(crate) use classic_load_balancer::ClassicLoadBalancer;
pub(crate) use dns_record::{DnsRecord, ListedRecord};
pub(crate) use dns_zone::DnsZone;
pub(crate) use dns_zone_vpc::{DnsZoneVpc, ListedAssociation};
pub(crate) use elastic_ip::ElasticIp;
pub(crate) use iam_instance_profile::IamInstanceProfile;
pub(crate) use iam_role::IamRole;
pub(crate) use iam_role_policy::{IamRolePolicy, ListedPolicy};
pub(crate) use internet_gateway::InternetGateway;
pub(crate) use key_pair::{KeyPair, PublicKey};
pub(crate) use launch_template::{BootData, Launch, LaunchTemplate, ListedTemplate};
pub(crate) use listener::{ListedListener, Listener};
pub(crate) use load_balancer::LoadBalancer;
pub(crate) use nat_gateway::NatGateway;
pub(crate) use route_table::{Route, RouteTable, RouteTarget};
pub(crate) use security_group::SecurityGroup;
pub(crate) use security_group_rules::{Rule, SecurityGroupRules, Source};
pub(crate) use subnet::Subnet;
pub(crate) use target_group::{ListedTargetGroup, TargetGroup};
pub(crate) use vpc::{Vpc, VpcDns};

use super::ec2::gone_ok;
use super::kinds::AwsKind;
use super::{AwsCloud, Ctx, Reader, created_id};
use crate::cloud::engine::{
    CloudError, CloudId, FieldChange, IdMap, Lifecycle, Resource, ResourceId, Value,
};

/// A type that stands for one AWS kind: what a [`Ref`] points at.
pub(crate) trait Kinded {
    const KIND: AwsKind;
}

/// What every task carries: its logical name, lifecycle and cloud ID (set on a read resource,
/// and on a desired one adopted by ID).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Head {
    pub(crate) name: String,
    pub(crate) lifecycle: Lifecycle,
    pub(crate) cloud_id: Option<CloudId>,
}

impl Head {
    /// A resource kprov makes and owns.
    pub(crate) fn owned(name: impl Into<String>) -> Head {
        Head {
            name: name.into(),
            lifecycle: Lifecycle::Sync,
            cloud_id: None,
        }
    }

    /// A resource the spec adopts: it must exist and match, and is never changed.
    pub(crate) fn adopted(name: impl Into<String>, cloud_id: Option<CloudId>) -> Head {
        Head {
            name: name.into(),
            lifecycle: Lifecycle::ExistsAndValidates,
            cloud_id,
        }
    }

    /// A resource a read found among the cluster's own, at `cloud_id`.
    pub(crate) fn listed(name: impl Into<String>, cloud_id: CloudId) -> Head {
        Head {
            name: name.into(),
            lifecycle: Lifecycle::Sync,
            cloud_id: Some(cloud_id),
        }
    }

    fn of(r: &Resource) -> Head {
        Head {
            name: r.id.name.clone(),
            lifecycle: r.lifecycle,
            cloud_id: r.cloud_id.clone(),
        }
    }

    /// The engine's resource of kind `T` with this head and no fields yet.
    fn resource<T: Kinded>(&self) -> Resource {
        let mut r = Resource::new(T::KIND.kind(), &self.name).lifecycle(self.lifecycle);
        r.cloud_id = self.cloud_id.clone();
        r
    }
}

/// A reference from one task to another resource: by logical name inside the plan (resolved
/// to its cloud ID at apply time), or by cloud ID for a resource outside it (what a read finds
/// pointing at something kprov does not know; a diff shows it as itself).
pub(crate) struct Ref<T> {
    to: Target,
    kind: PhantomData<fn() -> T>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Named(String),
    Cloud(String),
}

impl<T> Clone for Ref<T> {
    fn clone(&self) -> Self {
        Ref {
            to: self.to.clone(),
            kind: PhantomData,
        }
    }
}

impl<T> PartialEq for Ref<T> {
    fn eq(&self, other: &Self) -> bool {
        self.to == other.to
    }
}

impl<T: Kinded> fmt::Debug for Ref<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.to {
            Target::Named(n) => write!(f, "Ref({}/{n})", T::KIND),
            Target::Cloud(c) => write!(f, "Ref({} {c:?})", T::KIND),
        }
    }
}

impl<T: Kinded> Ref<T> {
    /// The resource of the plan named `name`.
    pub(crate) fn named(name: impl Into<String>) -> Ref<T> {
        Ref {
            to: Target::Named(name.into()),
            kind: PhantomData,
        }
    }

    fn cloud(id: impl Into<String>) -> Ref<T> {
        Ref {
            to: Target::Cloud(id.into()),
            kind: PhantomData,
        }
    }

    /// What a read found at cloud ID `cid`: the logical resource when the reader knows one of
    /// this kind there, the raw ID otherwise.
    pub(crate) fn read(rd: &Reader<'_>, cid: &str) -> Ref<T> {
        match rd.refs.get(cid) {
            Some(id) if id.kind == T::KIND.kind() => Ref::named(&id.name),
            _ => Ref::cloud(cid),
        }
    }

    /// As [`Ref::read`], for an ID the cloud may leave out.
    pub(crate) fn read_or_empty(rd: &Reader<'_>, cid: Option<&str>) -> Ref<T> {
        // why: a reference the cloud left out reads as empty, which the diff shows as a change
        Ref::read(rd, cid.unwrap_or_default())
    }

    /// What a read found at each of `cids`, in their order (see [`Ref::read`]).
    pub(crate) fn read_all<S: AsRef<str>>(
        rd: &Reader<'_>,
        cids: impl IntoIterator<Item = S>,
    ) -> Vec<Ref<T>> {
        cids.into_iter()
            .map(|c| Ref::read(rd, c.as_ref()))
            .collect()
    }

    /// As a field value: a `Value::Ref` (which orders the plan) or the raw ID.
    pub(crate) fn value(&self) -> Value {
        match &self.to {
            Target::Named(n) => Value::reference(T::KIND.kind(), n),
            Target::Cloud(c) => Value::str(c),
        }
    }

    /// From field `field` of `owner`: a reference to a `T`, or a raw cloud ID.
    fn from_value(
        owner: &ResourceId,
        field: &str,
        v: Option<&Value>,
    ) -> Result<Ref<T>, CloudError> {
        match v {
            Some(Value::Ref(id)) if id.kind == T::KIND.kind() => Ok(Ref::named(&id.name)),
            Some(Value::Str(s)) => Ok(Ref::cloud(s)),
            other => Err(CloudError::Model(format!(
                "{owner}: field {field}: expected a reference to a {}, found {}",
                T::KIND,
                other.map_or_else(|| "nothing".to_string(), Value::to_string)
            ))),
        }
    }

    /// Its cloud ID: the one apply recorded for the named resource, or the raw ID.
    pub(crate) fn resolve<'a>(&'a self, ids: &'a IdMap) -> Result<&'a str, CloudError> {
        match &self.to {
            Target::Named(n) => {
                let id = ResourceId::new(T::KIND.kind(), n);
                ids.get(&id)
                    .map(CloudId::as_str)
                    .ok_or_else(|| CloudError::Model(format!("{id} has no cloud ID yet")))
            }
            Target::Cloud(c) => Ok(c),
        }
    }
}

/// A task's typed fields as the engine's resource, and back: what [`task!`] writes.
pub(crate) trait Fields: Kinded + Sized {
    fn head(&self) -> &Head;

    /// The engine's resource: identity, lifecycle, cloud ID, the fields the generic diff
    /// compares and prints, and what a change to each means (kops's CheckChanges).
    fn resource(&self) -> Resource;

    /// The task an engine resource of this kind holds: the desired one the plan carries to
    /// apply, or the read one. A missing or mistyped field is a model error naming both.
    fn from_resource(r: &Resource) -> Result<Self, CloudError>;
}

/// How a typed field of type `F` is held in the engine's resource: `put` adds it (an absent
/// optional adds nothing, so the diff sees no field), `take` reads it back (a missing or
/// mistyped field is a model error naming the resource and the field). A type is its own
/// codec unless the field names another (`as Doc`).
pub(crate) trait Codec<F> {
    fn put(v: &F, r: Resource, field: &str) -> Resource;
    fn take(r: &Resource, field: &str) -> Result<F, CloudError>;
}

impl Codec<String> for String {
    fn put(v: &String, r: Resource, field: &str) -> Resource {
        r.field(field, Value::str(v))
    }

    fn take(r: &Resource, field: &str) -> Result<String, CloudError> {
        text(r, field)
    }
}

/// A `Copy` scalar as its own codec: the [`Value`] variant that holds it and the accessor
/// that reads it back.
macro_rules! scalar_codec {
    ($ty:ty, $variant:path, $get:path) => {
        impl Codec<$ty> for $ty {
            fn put(v: &$ty, r: Resource, field: &str) -> Resource {
                r.field(field, $variant(*v))
            }

            fn take(r: &Resource, field: &str) -> Result<$ty, CloudError> {
                r.get(field)
                    .and_then($get)
                    .ok_or_else(|| not_set(&r.id, field))
            }
        }
    };
}

scalar_codec!(bool, Value::Bool, Value::as_bool);
scalar_codec!(i64, Value::Int, Value::as_int);

impl<T: Kinded> Codec<Ref<T>> for Ref<T> {
    fn put(v: &Ref<T>, r: Resource, field: &str) -> Resource {
        r.field(field, v.value())
    }

    fn take(r: &Resource, field: &str) -> Result<Ref<T>, CloudError> {
        Ref::from_value(&r.id, field, r.get(field))
    }
}

/// A member of a list field whose order carries no meaning (references, routes, rules): the
/// list is compared as a set.
pub(crate) trait Item: Sized {
    fn item(&self) -> Value;
    fn from_item(owner: &ResourceId, field: &str, v: &Value) -> Result<Self, CloudError>;
}

impl<T: Item> Codec<Vec<T>> for Vec<T> {
    fn put(v: &Vec<T>, r: Resource, field: &str) -> Resource {
        r.field(field, Value::set(v.iter().map(T::item).collect()))
    }

    fn take(r: &Resource, field: &str) -> Result<Vec<T>, CloudError> {
        list(r, field)?
            .iter()
            .map(|v| T::from_item(&r.id, field, v))
            .collect()
    }
}

impl<T: Kinded> Item for Ref<T> {
    fn item(&self) -> Value {
        self.value()
    }

    fn from_item(owner: &ResourceId, field: &str, v: &Value) -> Result<Self, CloudError> {
        Ref::from_value(owner, field, Some(v))
    }
}

impl<F, C: Codec<F>> Codec<Option<F>> for Option<C> {
    fn put(v: &Option<F>, r: Resource, field: &str) -> Resource {
        match v {
            Some(v) => C::put(v, r, field),
            None => r,
        }
    }

    fn take(r: &Resource, field: &str) -> Result<Option<F>, CloudError> {
        match r.get(field) {
            Some(_) => C::take(r, field).map(Some),
            None => Ok(None),
        }
    }
}

/// A text field the diff shows line by line (a policy document).
pub(crate) enum Doc {}

impl Codec<String> for Doc {
    fn put(v: &String, r: Resource, field: &str) -> Resource {
        r.field(field, Value::Doc(v.clone()))
    }

    fn take(r: &Resource, field: &str) -> Result<String, CloudError> {
        text(r, field)
    }
}

/// What apply hands a task's create, update and delete (kops's target): the cloud, and the
/// cloud IDs recorded so far, which its [`Ref`]s resolve against.
#[derive(Clone, Copy)]
pub(crate) struct Apply<'a> {
    pub(crate) c: &'a AwsCloud,
    pub(crate) ids: &'a IdMap,
}

/// The cloud's clients (`a.ec2`, `a.iam`, ...), as the SDK calls read on the cloud itself.
impl std::ops::Deref for Apply<'_> {
    type Target = AwsCloud;

    fn deref(&self) -> &AwsCloud {
        self.c
    }
}

/// What a task's update and delete return.
pub(crate) type Done = Result<(), CloudError>;

/// How a kind is deleted: declared with `delete_by_id!` for a kind deleted by one call naming
/// its cloud ID, written by hand otherwise.
pub(crate) trait Delete {
    /// Deletes `self` (a read task); already gone is success.
    async fn delete(&self, a: Apply<'_>) -> Done;
}

/// How a kind is read back from the cloud (kops's Find): written by `task!` from each field's
/// read expression, by hand for a kind whose fields are not read one by one. A [`Task`] is
/// always a `Read`.
pub(crate) trait Read: Fields {
    /// What the cloud lists for one resource of this kind (with what else the read fetched
    /// about it).
    type Listed;

    /// The read task: `head` as the reader classified the listed item, its references as the
    /// reader knows them.
    fn read(head: Head, listed: &Self::Listed, rd: &Reader<'_>) -> Self;
}

/// One AWS kind as a typed task (its read is its [`Read`], its delete its [`Delete`]).
pub(crate) trait Task: Read + Delete + Send + Sync {
    fn id(&self) -> ResourceId {
        ResourceId::new(Self::KIND.kind(), &self.head().name)
    }

    /// Makes it and returns the ID AWS assigned; steps after the first write go through
    /// `finish_create` (a half-made resource is found by its tags on the next plan).
    async fn create(&self, a: Apply<'_>) -> Result<CloudId, CloudError>;

    /// Brings `have` (read) to `self` (desired); `changes` are the fields the plan showed. The
    /// default is a kind whose fields are all fixed once made: the plan refuses or replaces
    /// first, and this names the fields should a change get here.
    async fn update(&self, _: &Self, changes: &[FieldChange], _: Apply<'_>) -> Done {
        Err(cannot_change(&self.id(), changes))
    }

    /// Its cloud ID; a read task always has one, so its absence is a model error.
    fn cloud_id(&self) -> Result<&str, CloudError> {
        self.head()
            .cloud_id
            .as_deref()
            .ok_or_else(|| CloudError::Model(format!("{}: no cloud ID recorded", self.id())))
    }
}

/// The cloud IDs of `refs`, in their order.
fn resolve_all<T: Kinded>(refs: &[Ref<T>], ids: &IdMap) -> Result<Vec<String>, CloudError> {
    refs.iter()
        .map(|r| r.resolve(ids).map(str::to_string))
        .collect()
}

/// A create call's answer, as `.send().await.created(self, "CreateVpc", |out| ...)`: the ID of
/// the task it made, which `returned` finds in the reply. A failed call, or a reply without
/// an ID, is an error naming the operation (see [`created_id`]).
trait Created<O> {
    fn created<T: Task>(
        self,
        task: &T,
        operation: &str,
        returned: impl FnOnce(&O) -> Option<&str>,
    ) -> Result<CloudId, CloudError>;
}

impl<O, R: Ctx<O>> Created<O> for R {
    fn created<T: Task>(
        self,
        task: &T,
        operation: &str,
        returned: impl FnOnce(&O) -> Option<&str>,
    ) -> Result<CloudId, CloudError> {
        let out = self.ctx(operation)?;
        created_id(&task.id(), operation, returned(&out))
    }
}

/// Awaits a delete call: an answer that the resource is already gone is success.
async fn gone<T, R: Ctx<T>>(call: impl Future<Output = R>, op: &str) -> Result<(), CloudError> {
    gone_ok(call.await.ctx(op))
}

fn changed(changes: &[FieldChange], field: &str) -> bool {
    changes.iter().any(|c| c.field == field)
}

/// An update the kind cannot make in place (the plan refuses immutable fields first; this
/// names the fields should one get here).
fn cannot_change(id: &ResourceId, changes: &[FieldChange]) -> CloudError {
    CloudError::Model(format!(
        "{id}: cannot change {} in place",
        changes
            .iter()
            .map(|c| c.field.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// The create of a kind kprov only reads or adopts: never reached (the provider refuses it, or
/// the engine never creates it), named should one get here.
fn never_created<T: Task>(task: &T) -> CloudError {
    CloudError::Model(format!(
        "{}: kprov does not create a {}",
        task.id(),
        T::KIND
    ))
}

/// Field `field` of `id` missing: on an engine resource as decoded, or on a desired task
/// where only a read one may lack it.
fn not_set(id: &ResourceId, field: &str) -> CloudError {
    CloudError::Model(format!("{id}: field {field} is not set"))
}

/// A text field this kind always sets.
fn text(r: &Resource, field: &str) -> Result<String, CloudError> {
    r.get_str(field)
        .map(str::to_string)
        .ok_or_else(|| not_set(&r.id, field))
}

/// A list field this kind always sets (an empty list is a list, not an absent field).
fn list<'a>(r: &'a Resource, field: &str) -> Result<&'a [Value], CloudError> {
    match r.get(field) {
        Some(Value::List(l)) => Ok(l),
        _ => Err(CloudError::Model(format!(
            "{}: field {field} is not a list",
            r.id
        ))),
    }
}

#[cfg(test)]
mod tests;
