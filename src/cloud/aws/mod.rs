//! The AWS provider: EC2 networking, security groups, key pair, launch templates, Auto Scaling
//! groups, the API network load balancer, IAM and Route53 records.
//!
//! Ownership: every taggable resource carries `kubernetes.io/cluster/NAME=owned`,
//! `KubernetesCluster=NAME` and `kprov.dev/id=Kind/name`; reads filter on the first, so one
//! paginated Describe per resource type finds the whole cluster. IAM objects live under the path
//! `/kprov/NAME/`; Route53 records are owned through a TXT record next to them.

/// Every item a paginated list call answers, in one `Vec`: `$request` is the call's request
/// builder, `$op` names the operation in its error. A macro because the five SDKs' paginators
/// share this shape but no trait a function could be written over.
macro_rules! all_items {
    ($request:expr, $op:expr) => {
        $crate::cloud::aws::Ctx::ctx(
            $request.into_paginator().items().send().try_collect().await,
            $op,
        )
    };
}

pub(crate) mod asg;
pub use asg::GroupCapacity;
mod clb;
mod desired;
mod dns;
mod ec2;
mod elb;
pub mod hostkeys;
mod iam;
pub(crate) mod images;
pub mod instances;
pub(crate) mod kinds;
pub mod launch;
mod resource;
mod tasks;
pub mod wait;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use async_trait::async_trait;
use aws_smithy_runtime_api::client::interceptors::SharedInterceptor;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

pub use desired::public_key_hash;
pub(crate) use desired::{desired, fqdn};
pub use hostkeys::GroupHostKey;

use crate::aws_errors::describe_sdk_error;
use crate::cloud::engine::{
    self, CloudError, CloudId, ErrorClass, FieldChange, IdMap, Kind, Lifecycle, Plan, Resource,
    ResourceId,
};
use crate::cloud::{Actual, Provider};
use crate::spec::ResolvedCluster;
use crate::spec::resolve::{Access, AwsPart, GroupPlacement, ImageRef, ResolvedGroup};
use images::{ImagePins, PinnedImage};
use kinds::*;
use resource::AwsResource;
use tasks::{Fields, SecurityGroupRules};

pub(crate) const TAG_ID: &str = "kprov.dev/id";
/// The name prefix of resources that carry this cluster's ownership tag but no kprov
/// identity: someone else made them for the cluster (the cloud-controller-manager's load
/// balancers, target groups and security groups for Services).
pub(crate) const UNTRACKED: &str = "untracked-";
pub(crate) const TAG_CLUSTER: &str = "KubernetesCluster";

/// The tag key whose value `owned` marks a resource as cluster `cluster`'s
/// (`kubernetes.io/cluster/NAME`, as the cloud-controller-manager also reads it): every
/// owned-resource read filters on it.
pub fn owned_tag_key(cluster: &str) -> String {
    format!("kubernetes.io/cluster/{cluster}")
}

/// The AWS provider for one cluster: the SDK clients of each service it calls, and what its
/// plans need beyond the spec (the groups' host keys, the pinned images).
pub struct AwsCloud {
    cluster: String,
    ec2: aws_sdk_ec2::Client,
    asg: aws_sdk_autoscaling::Client,
    elb: aws_sdk_elasticloadbalancingv2::Client,
    /// Classic ELBs, which only the cloud-controller-manager makes (see [`clb`]).
    clb: aws_sdk_elasticloadbalancing::Client,
    iam: aws_sdk_iam::Client,
    r53: aws_sdk_route53::Client,
    /// The instance groups' SSH host keys (see [`hostkeys`]); launch templates of groups
    /// without one can be planned but not written.
    host_keys: BTreeMap<String, GroupHostKey>,
    /// The images name patterns were pinned to (see [`images`]).
    pins: ImagePins,
    /// Resolve every pattern again, ignoring the pins (`--refresh-image`).
    refresh_images: bool,
}

impl AwsCloud {
    /// Clients for every service from one SDK config (region, credentials and, for tests or
    /// emulators, `AWS_ENDPOINT_URL`). `interceptors` are added to every client: the tests use
    /// one to record (and interrupt) the requests sent.
    pub fn new(
        sdk: &aws_config::SdkConfig,
        cluster: &str,
        interceptors: &[SharedInterceptor],
    ) -> Self {
        macro_rules! client {
            ($svc:ident) => {{
                let mut b = $svc::config::Builder::from(sdk);
                for i in interceptors {
                    b.push_interceptor(i.clone());
                }
                $svc::Client::from_conf(b.build())
            }};
        }
        AwsCloud {
            cluster: cluster.to_string(),
            ec2: client!(aws_sdk_ec2),
            asg: client!(aws_sdk_autoscaling),
            elb: client!(aws_sdk_elasticloadbalancingv2),
            clb: client!(aws_sdk_elasticloadbalancing),
            iam: client!(aws_sdk_iam),
            r53: client!(aws_sdk_route53),
            host_keys: BTreeMap::new(),
            pins: ImagePins::new(),
            refresh_images: false,
        }
    }

    /// The pins [`images::load`] read; `refresh` resolves every pattern again instead (the
    /// preview then shows the launch templates' new image, and the apply pins it).
    pub(crate) fn with_pinned_images(mut self, pins: ImagePins, refresh: bool) -> Self {
        self.pins = pins;
        self.refresh_images = refresh;
        self
    }

    /// The groups' host keys, as [`hostkeys::load`] (preview) or [`hostkeys::ensure`]
    /// (`--yes`) returned them.
    pub fn with_host_keys(mut self, keys: BTreeMap<String, GroupHostKey>) -> Self {
        self.host_keys = keys;
        self
    }

    pub(crate) fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The desired resources, the image each name stands for (its pin unless refreshing,
    /// else the newest match) and what the preview says about pins and newer images.
    async fn desired_and_images(
        &self,
        cluster: &ResolvedCluster,
    ) -> Result<(Vec<Resource>, ImagePins, Vec<String>), CloudError> {
        if cluster.name != self.cluster {
            return Err(CloudError::Model(format!(
                "provider set up for cluster {} asked about {}",
                self.cluster, cluster.name
            )));
        }
        let names: BTreeSet<String> = cluster
            .groups
            .iter()
            .filter_map(|g| match &g.placement {
                GroupPlacement::Aws {
                    image: ImageRef::Name(n),
                    ..
                } => Some(n.clone()),
                _ => None,
            })
            .collect();
        // Resolved even when pinned: a newer image is worth a line in the preview.
        let newest = if names.is_empty() {
            BTreeMap::new()
        } else {
            ec2::resolve_images(self, names.iter().cloned().collect()).await?
        };
        let mut chosen = ImagePins::new();
        let mut notes = Vec::new();
        for name in &names {
            let newest = newest.get(name).map(|(id, owner)| PinnedImage {
                id: id.clone(),
                owner: owner.clone(),
            });
            let pin = self.pins.get(name);
            let shown = |s: &str| crate::output::escape(s).to_string();
            match (pin, newest) {
                (Some(pin), Some(n)) if self.refresh_images && n.id != pin.id => {
                    notes.push(format!(
                        "image {}: refreshed from {} to the newest match {} (--refresh-image)",
                        shown(name),
                        shown(&pin.id),
                        shown(&n.id)
                    ));
                    chosen.insert(name.clone(), n);
                }
                (_, Some(n)) if self.refresh_images => {
                    chosen.insert(name.clone(), n);
                }
                (Some(pin), newest) => {
                    if let Some(n) = newest.filter(|n| n.id != pin.id) {
                        notes.push(format!(
                            "image {}: a newer image {} matches; the cluster stays on {}, \
                             pinned when first applied, until `kprov update cluster {} \
                             --refresh-image` moves it",
                            shown(name),
                            shown(&n.id),
                            shown(&pin.id),
                            self.cluster
                        ));
                    }
                    chosen.insert(name.clone(), pin.clone());
                }
                (None, Some(n)) => {
                    chosen.insert(name.clone(), n);
                }
                // No image of that name: `desired` names the group and field.
                (None, None) => {}
            }
        }
        let ids: BTreeMap<String, String> = chosen
            .iter()
            .map(|(k, p)| (k.clone(), p.id.clone()))
            .collect();
        Ok((desired(cluster, &ids, &self.host_keys)?, chosen, notes))
    }

    /// The preview of `update cluster`: desired model, read-only read, diff.
    pub async fn plan(&self, cluster: &ResolvedCluster) -> Result<Plan, CloudError> {
        Ok(self.plan_and_images(cluster).await?.0)
    }

    /// [`Self::plan`] and the images it used, which the apply pins ([`images::save`]).
    pub(crate) async fn plan_and_images(
        &self,
        resolved: &ResolvedCluster,
    ) -> Result<(Plan, ImagePins), CloudError> {
        // Apply plans first too, so a zone EC2 does not have or a type that cannot launch is
        // refused before any write. The read needs of the desired model only what the spec
        // says (adopted IDs, group bounds, the zone), not the images, so it runs beside the
        // image lookup with names standing in for image IDs, as in `plan_delete`: the whole
        // preview is as deep as its deepest read, not the sum of its checks.
        // Every request runs to its end (the reads are bounded) and the errors are said in the
        // order a sequential preview would meet them: a zone EC2 does not have explains the
        // rest, then the images and launch checks, then the read.
        let aws = aws_part(resolved)?;
        let checked = async {
            let found = self.desired_and_images(resolved).await?;
            ec2::check_launchable(self, &found.0).await?;
            Ok::<_, CloudError>(found)
        };
        let read = async {
            let stand_in = desired(resolved, &image_names(resolved), &self.host_keys)?;
            self.read(&resolved.name, &stand_in).await
        };
        let (zones, checked, read) =
            tokio::join!(ec2::check_zones(self, &resolved.completed), checked, read);
        zones?;
        let (desired, images, notes) = checked?;
        let mut actual = read?;
        // What carries the cluster's tag without a kprov identity was made for the cluster by
        // someone else, mostly the cloud-controller-manager (Services' load balancers, target
        // groups, security groups): not kprov's to change or `--prune`. `delete cluster`
        // removes them (plan_delete).
        actual
            .resources
            .retain(|r| !r.id.name.starts_with(UNTRACKED));
        let mut plan = engine::diff(&resolved.name, desired, actual)?;
        let need = plan
            .changes
            .iter()
            .filter(|c| c.action == engine::Action::Create && c.id.kind == ELASTIC_IP)
            .count();
        match ec2::check_address_quota(self, &aws.region, need).await {
            Ok(Some(over)) => plan.errors.push(over),
            Ok(None) => {}
            // A caller without ec2:DescribeAccountAttributes still gets its preview.
            Err(e) => plan
                .warnings
                .push(format!("the Elastic IP quota was not checked: {e}")),
        }
        plan.warnings.extend(open_access_warnings(aws, &plan));
        plan.warnings
            .extend(unowned_image_warnings(&resolved.groups, &images));
        plan.warnings.extend(notes);
        Ok((plan, images))
    }

    /// The preview of `delete cluster`: every owned resource, in deletion order.
    pub async fn plan_delete(&self, cluster: &ResolvedCluster) -> Result<Plan, CloudError> {
        // Deleting must not depend on images still being published: only the adopted anchors
        // (VPC, zone) of the desired model are used, so image names stand in for their IDs.
        let desired = desired(cluster, &image_names(cluster), &self.host_keys)?;
        let mut plan = engine::plan_delete(self, &cluster.name, desired).await?;
        let foreign: Vec<String> = plan
            .changes
            .iter()
            .filter(|c| c.name.starts_with(UNTRACKED))
            .map(|c| format!("{} {}", c.kind, c.cloud_id.as_deref().unwrap_or(&c.name)))
            .collect();
        if !foreign.is_empty() {
            plan.warnings.push(format!(
                "also deleting {} resource(s) made for this cluster by someone else (tagged {} \
                 without a kprov identity; the cloud-controller-manager's Service load \
                 balancers and their security groups): {}",
                foreign.len(),
                owned_tag_key(&cluster.name),
                foreign.join(", ")
            ));
        }
        Ok(plan)
    }

    /// The standard ownership and identity tags.
    fn tags(&self, id: &ResourceId, display: &str) -> Vec<(String, String)> {
        vec![
            (owned_tag_key(&self.cluster), "owned".into()),
            (TAG_CLUSTER.into(), self.cluster.clone()),
            (TAG_ID.into(), id.to_string()),
            ("Name".into(), display.to_string()),
        ]
    }
}

/// The preview's warnings for images named without an owner: anyone can publish an image
/// under any name, so today's single match can be joined tomorrow by someone else's (then
/// refused as ambiguous, or worse, picked as the newest). Names the account to pin.
fn unowned_image_warnings(groups: &[ResolvedGroup], images: &ImagePins) -> Vec<String> {
    groups
        .iter()
        .filter_map(|g| {
            let GroupPlacement::Aws {
                image: ImageRef::Name(image),
                ..
            } = &g.placement
            else {
                return None;
            };
            if ec2::split_owner(image).0.is_some() {
                return None;
            }
            let PinnedImage {
                id,
                owner: publisher,
            } = images.get(image)?;
            Some(format!(
                "instance group {}: spec.image {} names no owner; it resolves to {} published \
                 by account {}: pin it as {}/{} (anyone can publish an image under any name)",
                crate::output::escape(&g.name),
                crate::output::escape(image),
                crate::output::escape(id),
                crate::output::escape(publisher),
                crate::output::escape(publisher),
                crate::output::escape(image)
            ))
        })
        .collect()
}

/// The preview's warnings for SSH or the API about to be opened to the whole internet because
/// `spec.sshAccess` / `spec.kubernetesApiAccess` is unset (kops's default, kept).
fn open_access_warnings(aws: &AwsPart, plan: &Plan) -> Vec<String> {
    let opens = |port: u16| {
        plan.changes.iter().any(|c| {
            c.id.kind == SECURITY_GROUP_RULES
                && matches!(c.action, engine::Action::Create | engine::Action::Update)
                && plan.desired.get(&c.id).is_some_and(|r| {
                    // The model made it; one that does not decode fails apply, naming it.
                    SecurityGroupRules::from_resource(r).is_ok_and(|t| t.open_to_anywhere(port))
                })
        })
    };
    let mut out = Vec::new();
    if aws.ssh_access == Access::Anywhere && opens(22) {
        out.push(
            "SSH (port 22) will be open to 0.0.0.0/0: set spec.sshAccess to the CIDRs that may \
             connect (kops's sshAccess)"
                .to_string(),
        );
    }
    if aws.api_access == Access::Anywhere && opens(desired::API_PORT) {
        out.push(format!(
            "the Kubernetes API (port {}) will be open to 0.0.0.0/0: set \
             spec.kubernetesApiAccess to the CIDRs that may connect (kops's \
             kubernetesApiAccess)",
            desired::API_PORT
        ));
    }
    out
}

/// The AWS part of a cluster handed to the AWS provider; a metal cluster is a caller's bug,
/// said as the cloud model says it, before any request.
fn aws_part(cluster: &ResolvedCluster) -> Result<&AwsPart, CloudError> {
    cluster.aws().ok_or_else(|| {
        CloudError::Spec(format!(
            "cluster {} is not on AWS (spec.cloudProvider)",
            cluster.name
        ))
    })
}

/// Collects actual resources and the cloud ID → logical ID map that turns the cloud's
/// references back into `Value::Ref`s.
/// Every instance group's image name standing for its own ID: for the uses of the desired
/// model that never look at an image (the read, the delete).
fn image_names(cluster: &ResolvedCluster) -> BTreeMap<String, String> {
    cluster
        .groups
        .iter()
        .filter_map(|g| match &g.placement {
            GroupPlacement::Aws { image, .. } => Some(image.as_str().to_string()),
            GroupPlacement::Metal { .. } => None,
        })
        .map(|i| (i.clone(), i))
        .collect()
}

pub(crate) struct Reader<'a> {
    pub(crate) desired: &'a [Resource],
    pub(crate) refs: HashMap<String, ResourceId>,
    pub(crate) out: Vec<Resource>,
    pub(crate) warnings: Vec<String>,
    pub(crate) conflicts: Vec<String>,
}

impl<'a> Reader<'a> {
    /// A reader of the resources the cloud lists, against the `desired` ones.
    pub(crate) fn new(desired: &'a [Resource]) -> Reader<'a> {
        Reader {
            desired,
            refs: HashMap::new(),
            out: Vec::new(),
            warnings: Vec::new(),
            conflicts: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, r: Resource) {
        if let Some(cid) = &r.cloud_id {
            self.refs.insert(cid.to_string(), r.id.clone());
        }
        self.out.push(r);
    }

    /// The task of kind `T` a read found (`head` as the reader classified the listed item),
    /// recorded among the actual resources.
    pub(crate) fn add<T: tasks::Task>(&mut self, head: tasks::Head, listed: &T::Listed) -> T {
        let task = T::read(head, listed, self);
        self.push(task.resource());
        task
    }

    /// The ID of a resource the cloud listed. One listed without an ID cannot be compared,
    /// changed or deleted: it becomes a plan error naming the kind rather than a resource
    /// with an empty cloud ID.
    pub(crate) fn listed(&mut self, kind: Kind, id: Option<&str>) -> Option<CloudId> {
        let id = id.and_then(CloudId::new);
        if id.is_none() {
            self.conflicts.push(format!(
                "the cloud listed a {kind} of this cluster without its ID (a reply kprov \
                 cannot act on)"
            ));
        }
        id
    }
}

/// Desired resources of `kind` that are adopted by cloud ID.
pub(crate) fn adopted_in(desired: &[Resource], kind: Kind) -> impl Iterator<Item = &Resource> {
    desired
        .iter()
        .filter(move |r| r.id.kind == kind && r.lifecycle == Lifecycle::ExistsAndValidates)
}

/// The logical ID of an owned resource from its tags; one that lost its `kprov.dev/id` tag (or
/// whose tag names another kind, or none this provider knows) is still owned, so it gets an ID
/// that no desired resource has and is planned for deletion.
pub(crate) fn id_from_tags<'a>(
    kind: Kind,
    cloud_id: &str,
    tags: impl Iterator<Item = (&'a str, &'a str)>,
) -> ResourceId {
    tags.filter(|(k, _)| *k == TAG_ID)
        .find_map(|(_, v)| AwsKind::parse_tag(v).ok().filter(|id| id.kind == kind))
        .unwrap_or_else(|| ResourceId::new(kind, format!("{UNTRACKED}{cloud_id}")))
}

/// Reads filter on the ownership tag, and this checks it again on what came back: an API (or
/// an emulator: moto ignores tag filters on DescribeNatGateways) that ignores a filter must
/// never make another cluster's resource look like ours.
pub(crate) fn owned_by<'a>(
    cluster: &str,
    mut tags: impl Iterator<Item = (&'a str, &'a str)>,
) -> bool {
    let key = owned_tag_key(cluster);
    tags.any(|(k, v)| k == key && v == "owned")
}

/// A text field the desired model always sets for this kind; its absence is a model error
/// naming the resource and field, never an empty value sent to AWS.
pub(crate) fn want_str<'a>(r: &'a Resource, field: &str) -> Result<&'a str, CloudError> {
    r.get_str(field)
        .ok_or_else(|| CloudError::Model(format!("{}: field {field} is not set", r.id)))
}

/// The ID a create call returned; AWS always returns one, and an empty one must never be
/// recorded (the next apply could not find, update or delete the resource by it).
pub(crate) fn created_id(
    id: &ResourceId,
    operation: &str,
    returned: Option<&str>,
) -> Result<CloudId, CloudError> {
    match returned.and_then(CloudId::new) {
        Some(id) => Ok(id),
        None => Err(after_create(CloudError::verdict(
            operation,
            ErrorClass::Fatal,
            format!("{id}: the reply carries no ID"),
        ))),
    }
}

/// `s` (a name the desired model chose, an ID a reference resolved to) as the cloud ID of `id`;
/// an empty one is a model error naming the resource and what was empty.
pub(crate) fn id_from(id: &ResourceId, what: &str, s: &str) -> Result<CloudId, CloudError> {
    CloudId::new(s).ok_or_else(|| CloudError::Model(format!("{id}: {what} is empty")))
}

/// The ID of a resource the spec adopts (`field` says where it was written); an empty one is
/// refused naming the field.
pub(crate) fn adopted_id(id: &str, field: &str) -> Result<CloudId, CloudError> {
    CloudId::new(id).ok_or_else(|| CloudError::Spec(format!("{field} is empty")))
}

/// The class of an error `operation` got. `AuthFailure` means "in use" only where EC2 says
/// so for an address still held (ReleaseAddress, DisassociateAddress while a NAT gateway lets
/// go of it); anywhere else it is a real authorization failure, final at once rather than
/// retried to the resource deadline.
fn class_of(operation: &str, code: &str, message: Option<&str>) -> ErrorClass {
    if profile_not_propagated(code, message) {
        return ErrorClass::NotFound;
    }
    match (operation, code) {
        ("ReleaseAddress" | "DisassociateAddress", "AuthFailure") => {
            ErrorClass::DependencyViolation
        }
        (_, "AuthFailure") => ErrorClass::Fatal,
        _ => classify(code),
    }
}

fn classify(code: &str) -> ErrorClass {
    match code {
        "Throttling"
        | "ThrottlingException"
        | "RequestLimitExceeded"
        | "TooManyRequestsException"
        | "RequestThrottled"
        | "PriorRequestNotComplete"
        | "SlowDown" => ErrorClass::Throttled,
        "DependencyViolation"
        | "ResourceInUse"
        | "ResourceInUseException"
        | "DeleteConflict"
        | "InvalidIPAddress.InUse"
        | "AuthFailure"
        | "InvalidGroup.InUse" => ErrorClass::DependencyViolation,
        "IncorrectInstanceState" => ErrorClass::NotReady,
        // EC2's `InvalidSubnetID.NotFound`, `InvalidGroup.NotFound`, ..., ELB's
        // `LoadBalancerNotFound`, `TargetGroupNotFound`, EC2's `NatGatewayNotFound`, IAM's
        // `NoSuchEntity`: on AWS also "created a moment ago, not propagated yet".
        c if c.ends_with("NotFound") || c == "NoSuchEntity" => ErrorClass::NotFound,
        "InternalError"
        | "InternalFailure"
        | "InternalServerError"
        | "ServiceUnavailable"
        | "Unavailable" => ErrorClass::Transient,
        _ => ErrorClass::Fatal,
    }
}

/// A launch template or Auto Scaling group naming an instance profile IAM created seconds
/// ago is refused until the profile propagates (3 to 34 s observed; terraform-provider-aws
/// and eksctl retry the same): Auto Scaling answers `ValidationError`, EC2
/// `InvalidParameterValue`, both "... Invalid IAM Instance Profile name". Those two codes also
/// mean plain bad input, and AWS gives this case no code of its own, so here alone the
/// documented message tells it apart; it is then a "not found yet", retried for the apply's
/// propagation window only, after which it is final.
fn profile_not_propagated(code: &str, message: Option<&str>) -> bool {
    matches!(code, "ValidationError" | "InvalidParameterValue")
        && message.is_some_and(|m| m.contains("Invalid IAM Instance Profile"))
}

/// An error without a service error code: a broken connection, a timeout, or a 5xx reply the
/// SDK could not parse is worth retrying; anything else is not.
fn unclassified<E, R>(e: &SdkError<E, R>) -> ErrorClass {
    match e {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_) => {
            ErrorClass::Transient
        }
        _ => ErrorClass::Fatal,
    }
}

/// Turns SDK errors into `CloudError`s with the operation name and a class for retries.
pub(crate) trait Ctx<T> {
    fn ctx(self, operation: &str) -> Result<T, CloudError>;
}

impl<T, E, R> Ctx<T> for Result<T, SdkError<E, R>>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + 'static,
{
    fn ctx(self, operation: &str) -> Result<T, CloudError> {
        self.map_err(|e| {
            let class = match e.code() {
                Some(code) => class_of(operation, code, e.message()),
                None => unclassified(&e),
            };
            CloudError::Api {
                operation: operation.to_string(),
                class,
                code: e.code().map(str::to_string),
                message: describe_sdk_error(&e),
            }
        })
    }
}

/// Runs a step that follows the first write of a create (attach, add a route, associate):
/// throttling, service failures and "not found" (the ID the create returned a moment ago has
/// not propagated through AWS yet: EC2's `*.NotFound`, IAM's `NoSuchEntity`, by code) are
/// retried here, call by call, with back-off (about 30 s in all), since the engine must not
/// retry by re-running the create; what still fails goes through [`after_create`].
pub(crate) async fn finish_create<T, F, Fut>(mut step: F) -> Result<T, CloudError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CloudError>>,
{
    let mut delay = std::time::Duration::from_millis(250);
    for _ in 0..8 {
        match step().await {
            Err(e)
                if matches!(
                    e.class(),
                    ErrorClass::Throttled | ErrorClass::Transient | ErrorClass::NotFound
                ) =>
            {
                tracing::debug!(error = %e, ?delay, "retrying a step of a create");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(8));
            }
            other => return other.map_err(after_create),
        }
    }
    step().await.map_err(after_create)
}

/// A step after the first write of a create must not be retried by re-running the create (that
/// would make a second resource): the next plan finds the half-made one by its tags instead.
pub(crate) fn after_create(e: CloudError) -> CloudError {
    match e {
        CloudError::Api {
            operation,
            code,
            message,
            ..
        } => CloudError::Api {
            operation,
            class: ErrorClass::Fatal,
            code,
            message: format!("{message} (the resource was created; re-run to finish it)"),
        },
        other => other,
    }
}

pub(crate) fn error_code<E: ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> Option<&str> {
    e.code()
}

#[async_trait]
impl Provider for AwsCloud {
    async fn read(&self, cluster: &str, desired: &[Resource]) -> Result<Actual, CloudError> {
        if cluster != self.cluster {
            return Err(CloudError::Model(format!(
                "provider set up for cluster {} asked about {cluster}",
                self.cluster
            )));
        }
        // Every kind is asked at once (independent reads; the SDK's retries honour
        // throttling), so a preview takes as many dependent waves as the deepest kind (three:
        // a list, its owners' tags or names, their details), however many groups there are.
        // `desired` may have image names standing in for image IDs (`plan_and_images`): the
        // launch templates' read takes from it only what does not depend on them.
        let (network, groups, keys, iam, templates, elb, clb, asgs, zone) = tokio::try_join!(
            ec2::fetch_network(self, desired),
            ec2::fetch_security_groups(self),
            ec2::fetch_key_pairs(self),
            iam::fetch(self),
            ec2::fetch_launch_templates(self, desired),
            elb::fetch(self),
            clb::fetch(self),
            asg::fetch(self),
            dns::fetch(self, desired),
        )?;
        let mut rd = Reader::new(desired);
        // Order matters: each kind turns the cloud IDs of the kinds before it into refs.
        ec2::assemble_network(self, network, &mut rd);
        ec2::assemble_security_groups(self, groups, &mut rd);
        ec2::assemble_key_pairs(self, keys, &mut rd);
        iam::assemble(self, iam, &mut rd);
        ec2::assemble_launch_templates(self, templates, &mut rd);
        elb::assemble(elb, &mut rd);
        clb::assemble(clb, &mut rd);
        asg::assemble(self, asgs, &mut rd);
        dns::assemble(self, zone, &mut rd)?;
        Ok(Actual {
            resources: rd.out,
            warnings: rd.warnings,
            conflicts: rd.conflicts,
        })
    }

    async fn create(&self, want: &Resource, ids: &IdMap) -> Result<CloudId, CloudError> {
        match AwsKind::of(&want.id)? {
            // Someone else's (a Classic ELB) or its group's (an instance): never made here.
            k @ (AwsKind::ClassicLoadBalancer | AwsKind::Instance) => Err(CloudError::Model(
                format!("{}: kprov does not create a {k}", want.id),
            )),
            _ => AwsResource::from_resource(want)?.create(self, ids).await,
        }
    }

    async fn update(
        &self,
        want: &Resource,
        have: &Resource,
        changes: &[FieldChange],
        ids: &IdMap,
    ) -> Result<(), CloudError> {
        match AwsKind::of(&want.id)? {
            k @ (AwsKind::ClassicLoadBalancer | AwsKind::Instance) => Err(CloudError::Model(
                format!("{}: kprov does not change a {k} in place", want.id),
            )),
            _ => {
                AwsResource::from_resource(want)?
                    .update(have, changes, self, ids)
                    .await
            }
        }
    }

    async fn delete(&self, have: &Resource, ids: &IdMap) -> Result<(), CloudError> {
        match AwsKind::of(&have.id)? {
            // Never read as a resource: its group ends it.
            AwsKind::Instance => Err(CloudError::Model(format!(
                "{}: an instance is deleted with its Auto Scaling group",
                have.id
            ))),
            _ => AwsResource::from_resource(have)?.delete(self, ids).await,
        }
    }
}

/// Cloud errors built as the SDK builds them, for the trust-boundary tests.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    /// What an S3 `GetObject` call fails with: the SDK error type these helpers build.
    pub(crate) type S3Error = SdkError<
        aws_sdk_s3::operation::get_object::GetObjectError,
        aws_smithy_runtime_api::http::Response,
    >;

    /// A service error answering `code` and `message` (an HTTP 400), as the SDK hands it.
    pub(crate) fn service_error(code: &str, message: &str) -> S3Error {
        let meta = aws_smithy_types::error::ErrorMetadata::builder()
            .code(code)
            .message(message)
            .build();
        let raw = aws_smithy_runtime_api::http::Response::new(
            aws_smithy_runtime_api::http::StatusCode::try_from(400).expect("status"),
            aws_smithy_types::body::SdkBody::from(""),
        );
        SdkError::service_error(
            aws_sdk_s3::operation::get_object::GetObjectError::generic(meta),
            raw,
        )
    }

    /// A service error and a transport error whose texts are `text`, as the SDK hands them.
    pub(crate) fn sdk_errors(text: &str) -> [S3Error; 2] {
        [
            service_error(text, text),
            SdkError::timeout_error(text.to_string()),
        ]
    }

    /// What kprov says about a service error, a transport error and an engine error whose
    /// texts are `text`.
    pub(crate) fn cloud_errors(text: &str) -> Vec<String> {
        let mut out: Vec<String> = sdk_errors(text).iter().map(describe_sdk_error).collect();
        let e: Result<(), _> = Err(sdk_errors(text).into_iter().next().expect("one"));
        if let Err(e) = e.ctx("GetObject") {
            out.push(e.to_string());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_decide_retries() {
        for code in ["Throttling", "RequestLimitExceeded", "ThrottlingException"] {
            assert_eq!(classify(code), ErrorClass::Throttled, "{code}");
        }
        for code in ["SlowDown", "RequestThrottled"] {
            assert_eq!(classify(code), ErrorClass::Throttled, "{code}");
        }
        for code in ["InternalError", "InternalFailure", "ServiceUnavailable"] {
            assert_eq!(classify(code), ErrorClass::Transient, "{code}");
        }
        for code in ["DependencyViolation", "ResourceInUse", "DeleteConflict"] {
            assert_eq!(classify(code), ErrorClass::DependencyViolation, "{code}");
        }
        for code in [
            "InvalidSubnetID.NotFound",
            "InvalidGroup.NotFound",
            "InvalidNatGatewayID.NotFound",
            "NatGatewayNotFound",
            // a template deleted between the preview's list and its version read
            "InvalidLaunchTemplateId.NotFound",
            "TargetGroupNotFound",
            "NoSuchEntity",
        ] {
            assert_eq!(classify(code), ErrorClass::NotFound, "{code}");
        }
        for code in ["InvalidParameterValue", "UnauthorizedOperation", ""] {
            assert_eq!(classify(code), ErrorClass::Fatal, "{code}");
        }
    }

    /// A service error with `code` and `message`, through `ctx` as every call site sends it.
    fn api_error(operation: &str, code: &str, message: &str) -> CloudError {
        let r: Result<(), _> = Err(tests_support::service_error(code, message));
        r.ctx(operation).expect_err("an error")
    }

    #[test]
    fn a_cloud_error_keeps_the_service_code_and_decides_by_it() {
        // (operation, code, message, class): "gone" and "in use" come from the code; a message
        // that says "not found" under another code is not a "not found".
        let cases = [
            (
                "DeleteSubnet",
                "InvalidSubnetID.NotFound",
                "x",
                ErrorClass::NotFound,
            ),
            (
                "DeleteTargetGroup",
                "TargetGroupNotFound",
                "x",
                ErrorClass::NotFound,
            ),
            ("DeleteRole", "NoSuchEntity", "x", ErrorClass::NotFound),
            (
                "DeleteLoadBalancer",
                "LoadBalancerNotFound",
                "x",
                ErrorClass::NotFound,
            ),
            (
                "DeleteVpc",
                "DependencyViolation",
                "x",
                ErrorClass::DependencyViolation,
            ),
            (
                "DeleteAutoScalingGroup",
                "ValidationError",
                "AutoScalingGroup name not found",
                ErrorClass::Fatal,
            ),
            (
                "DeleteVpc",
                "UnauthorizedOperation",
                "resource not found",
                ErrorClass::Fatal,
            ),
            (
                "CreateVpc",
                "Throttling",
                "Rate exceeded",
                ErrorClass::Throttled,
            ),
            (
                "DescribeInstanceTypes",
                "InvalidInstanceType",
                "m9.huge",
                ErrorClass::Fatal,
            ),
        ];
        for (op, code, message, class) in cases {
            let e = api_error(op, code, message);
            assert_eq!(e.code(), Some(code), "{op} {code}");
            assert_eq!(e.class(), class, "{op} {code} {message}");
            assert!(
                e.to_string()
                    .starts_with(&format!("{op}: {code}: {message}")),
                "{e}"
            );
            // Wrapped with the resource, and after the first write of a create, the code stays.
            let wrapped = CloudError::Resource {
                id: ResourceId::new(VPC, "main"),
                source: Box::new(after_create(api_error(op, code, message))),
            };
            assert_eq!(wrapped.code(), Some(code), "{op} {code}");
            assert_eq!(wrapped.class(), ErrorClass::Fatal, "after a create: final");
        }
        // kprov's own verdicts and transport failures carry no service code.
        let v = CloudError::verdict("GetInstanceProfile", ErrorClass::NotFound, "not yet");
        assert_eq!((v.code(), v.class()), (None, ErrorClass::NotFound));
        let t: Result<(), _> = Err(tests_support::sdk_errors("x")
            .into_iter()
            .nth(1)
            .expect("two"));
        let t = t.ctx("GetObject").expect_err("an error");
        assert_eq!((t.code(), t.class()), (None, ErrorClass::Transient));
    }

    #[test]
    fn no_empty_cloud_id_is_sent_or_recorded() {
        let id = ResourceId::new(SUBNET, "a");
        assert_eq!(
            created_id(&id, "CreateSubnet", Some("subnet-1"))
                .ok()
                .as_deref(),
            Some("subnet-1")
        );
        for returned in [None, Some("")] {
            let e = created_id(&id, "CreateSubnet", returned).expect_err("no ID");
            assert!(
                e.to_string().contains("Subnet/a: the reply carries no ID"),
                "{e}"
            );
            assert_eq!(
                e.class(),
                ErrorClass::Fatal,
                "never retried by creating again"
            );
        }
        let mut have = Resource::new(SUBNET, "a");
        // An empty ID cannot even be made, so none can be recorded.
        assert_eq!(CloudId::new(""), None);
        let zone = CloudId::new("Z1").expect("not empty");
        assert_eq!(
            zone.join('/', "api.example.com.").as_str(),
            "Z1/api.example.com."
        );
        let e = adopted_id("", "spec.networking.networkID").expect_err("empty");
        assert_eq!(e.to_string(), "spec: spec.networking.networkID is empty");
        let e = id_from(&id, "field keyName", "").expect_err("empty");
        assert!(
            e.to_string().contains("Subnet/a: field keyName is empty"),
            "{e}"
        );
        have = have.cloud_id(CloudId::new("subnet-1").expect("not empty"));
        let e = want_str(&have, "cidr").expect_err("unset");
        assert!(
            e.to_string().contains("Subnet/a: field cidr is not set"),
            "{e}"
        );
        let mut rd = Reader::new(&[]);
        assert_eq!(
            rd.listed(SUBNET, Some("subnet-1")),
            CloudId::new("subnet-1")
        );
        assert!(rd.conflicts.is_empty());
        assert_eq!(rd.listed(SUBNET, Some("")), None);
        assert_eq!(rd.listed(VPC, None), None);
        assert_eq!(rd.conflicts.len(), 2, "{:?}", rd.conflicts);
        assert!(
            rd.conflicts[1].contains("a Vpc of this cluster without its ID"),
            "{:?}",
            rd.conflicts
        );
    }

    #[test]
    fn auth_failure_is_in_use_only_for_a_held_address() {
        assert_eq!(
            class_of("ReleaseAddress", "AuthFailure", None),
            ErrorClass::DependencyViolation
        );
        assert_eq!(
            class_of("DisassociateAddress", "AuthFailure", None),
            ErrorClass::DependencyViolation
        );
        for op in [
            "CreateVpc",
            "DescribeInstances",
            "AuthorizeSecurityGroupIngress",
        ] {
            assert_eq!(class_of(op, "AuthFailure", None), ErrorClass::Fatal, "{op}");
        }
        assert_eq!(
            class_of("CreateSubnet", "InvalidVpcID.NotFound", None),
            ErrorClass::NotFound
        );
    }

    #[test]
    fn a_profile_not_propagated_yet_is_told_apart_from_bad_input() {
        let asg = "You must use a valid fully-formed launch template. Value (nodes.c) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name";
        assert!(profile_not_propagated("ValidationError", Some(asg)));
        assert!(profile_not_propagated(
            "InvalidParameterValue",
            Some(
                "Value (nodes.c) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name"
            )
        ));
        assert!(!profile_not_propagated(
            "ValidationError",
            Some("Max bound, 1, must be greater than or equal to min bound, 2")
        ));
        assert!(!profile_not_propagated("AccessDenied", Some(asg)));
        assert!(!profile_not_propagated("ValidationError", None));
    }

    #[test]
    fn a_cloud_error_message_is_escaped_where_it_enters() {
        let forged = "Denied\u{1b}]52;c;eA==\u{7}\nerror: all nodes were deleted\u{202e}";
        let [service, timeout] = tests_support::sdk_errors(forged);
        assert_eq!(
            describe_sdk_error(&service),
            "Denied\\x1b]52;c;eA==\\x07\\nerror: all nodes were deleted\\u{202e}: \
             Denied\\x1b]52;c;eA==\\x07\\nerror: all nodes were deleted\\u{202e} (HTTP 400)"
        );
        assert!(!describe_sdk_error(&timeout).contains('\u{1b}'));
        let e: Result<(), _> = Err(tests_support::sdk_errors(forged)
            .into_iter()
            .next()
            .expect("one"));
        let e = e.ctx("GetObject").expect_err("an error");
        assert!(!e.to_string().chars().any(char::is_control), "{e}");
    }

    proptest::proptest! {
        /// Whatever bytes a cloud API (or whoever answers in its place) sends as its error's
        /// code, message or cause, kprov's message about it holds no control character.
        #[test]
        fn no_cloud_error_passes_a_control_character(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
        ) {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            for shown in tests_support::cloud_errors(&text) {
                proptest::prop_assert!(
                    !shown.chars().any(|c| c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c)),
                    "{shown:?}"
                );
            }
        }
    }

    #[test]
    fn ownership_needs_the_owned_tag_of_this_cluster() {
        let key = owned_tag_key("a.example.com");
        assert!(owned_by(
            "a.example.com",
            [(key.as_str(), "owned")].into_iter()
        ));
        assert!(!owned_by(
            "a.example.com",
            [(key.as_str(), "shared")].into_iter()
        ));
        let other = owned_tag_key("b.example.com");
        assert!(!owned_by(
            "a.example.com",
            [(other.as_str(), "owned")].into_iter()
        ));
        assert_eq!(
            id_from_tags(VPC, "vpc-1", [(TAG_ID, "Subnet/x")].into_iter()),
            ResourceId::new(VPC, "untracked-vpc-1"),
            "an identity of another kind is not trusted"
        );
    }

    /// The provider takes the model ops resolved: a cluster that is not on AWS is refused
    /// naming the field, before any request, never a panic.
    #[tokio::test]
    async fn a_metal_model_is_refused_before_any_request() {
        let c: crate::spec::Cluster = serde_saphyr::from_str(
            "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: lab\nspec:\n  cloudProvider: metal\n  hosts:\n  - {name: cp1, address: 198.18.0.11, roles: [control-plane]}\n",
        )
        .expect("cluster");
        let model = crate::spec::resolve::model(&c, &[]).expect("model");
        let sdk = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .build();
        // No credentials provider: a request, if one were tried, fails here without leaving.
        let cloud = AwsCloud::new(&sdk, "lab", &[]);
        for err in [
            cloud.plan(&model).await.expect_err("plan"),
            cloud.plan_delete(&model).await.expect_err("plan_delete"),
        ] {
            assert!(
                err.to_string()
                    .contains("cluster lab is not on AWS (spec.cloudProvider)"),
                "{err}"
            );
        }
    }
}
