//! The AWS provider: EC2 networking, security groups, key pair, launch templates, Auto Scaling
//! groups, the API network load balancer, IAM and Route53 records.
//!
//! Ownership: every taggable resource carries `kubernetes.io/cluster/NAME=owned`,
//! `KubernetesCluster=NAME` and `kprov.dev/id=Kind/name`; reads filter on the first, so one
//! paginated Describe per resource type finds the whole cluster. IAM objects live under the path
//! `/kprov/NAME/`; Route53 records are owned through a TXT record next to them.

mod asg;
mod desired;
mod dns;
mod ec2;
mod elb;
pub mod hostkeys;
mod iam;
pub mod instances;
pub mod kinds;
pub mod wait;

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use aws_smithy_runtime_api::client::interceptors::SharedInterceptor;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::display::DisplayErrorContext;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

pub use desired::{HOST_KEY_PENDING, desired, fqdn, public_key_hash, short_name, user_data};
pub use hostkeys::GroupHostKey;

use crate::cloud::engine::{
    self, CloudError, ErrorClass, FieldChange, IdMap, Lifecycle, Plan, Resource, ResourceId, Value,
};
use crate::cloud::{Actual, Provider};
use crate::spec::{Cluster, InstanceGroup};
use kinds::*;

pub const TAG_ID: &str = "kprov.dev/id";
pub const TAG_CLUSTER: &str = "KubernetesCluster";

pub fn owned_tag_key(cluster: &str) -> String {
    format!("kubernetes.io/cluster/{cluster}")
}

pub struct AwsCloud {
    cluster: String,
    ec2: aws_sdk_ec2::Client,
    asg: aws_sdk_autoscaling::Client,
    elb: aws_sdk_elasticloadbalancingv2::Client,
    iam: aws_sdk_iam::Client,
    r53: aws_sdk_route53::Client,
    /// The instance groups' SSH host keys (see [`hostkeys`]); launch templates of groups
    /// without one can be planned but not written.
    host_keys: BTreeMap<String, GroupHostKey>,
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
            iam: client!(aws_sdk_iam),
            r53: client!(aws_sdk_route53),
            host_keys: BTreeMap::new(),
        }
    }

    /// The groups' host keys, as [`hostkeys::load`] (preview) or [`hostkeys::ensure`]
    /// (`--yes`) returned them.
    pub fn with_host_keys(mut self, keys: BTreeMap<String, GroupHostKey>) -> Self {
        self.host_keys = keys;
        self
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The desired resources, with image names (not `ami-` IDs) resolved in one
    /// DescribeImages call.
    pub async fn desired(
        &self,
        cluster: &Cluster,
        igs: &[InstanceGroup],
    ) -> Result<Vec<Resource>, CloudError> {
        if cluster.name() != self.cluster {
            return Err(CloudError::Model(format!(
                "provider set up for cluster {} asked about {}",
                self.cluster,
                cluster.name()
            )));
        }
        let names: Vec<String> = igs
            .iter()
            .filter_map(|ig| ig.spec.image.clone())
            .filter(|i| !i.starts_with("ami-"))
            .collect();
        let images = if names.is_empty() {
            BTreeMap::new()
        } else {
            ec2::resolve_images(self, names).await?
        };
        desired(cluster, igs, &images, &self.host_keys)
    }

    /// The preview of `update cluster`: desired model, read-only read, diff.
    pub async fn plan(&self, cluster: &Cluster, igs: &[InstanceGroup]) -> Result<Plan, CloudError> {
        let desired = self.desired(cluster, igs).await?;
        engine::plan(self, cluster.name(), desired).await
    }

    /// The preview of `delete cluster`: every owned resource, in deletion order.
    pub async fn plan_delete(
        &self,
        cluster: &Cluster,
        igs: &[InstanceGroup],
    ) -> Result<Plan, CloudError> {
        // Deleting must not depend on images still being published: only the adopted anchors
        // (VPC, zone) of the desired model are used, so image names stand in for their IDs.
        let images: BTreeMap<String, String> = igs
            .iter()
            .filter_map(|ig| ig.spec.image.clone())
            .map(|i| (i.clone(), i))
            .collect();
        let desired = desired(cluster, igs, &images, &self.host_keys)?;
        engine::plan_delete(self, cluster.name(), desired).await
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

/// Collects actual resources and the cloud ID → logical ID map that turns the cloud's
/// references back into `Value::Ref`s.
pub(crate) struct Reader<'a> {
    pub desired: &'a [Resource],
    pub refs: HashMap<String, ResourceId>,
    pub out: Vec<Resource>,
    pub warnings: Vec<String>,
    pub conflicts: Vec<String>,
}

impl Reader<'_> {
    pub fn push(&mut self, r: Resource) {
        if let Some(cid) = &r.cloud_id {
            self.refs.insert(cid.clone(), r.id.clone());
        }
        self.out.push(r);
    }

    /// A reference to whatever has cloud ID `cid`: a logical ref when it is known, the raw ID
    /// otherwise (a foreign resource shows up as itself in a diff).
    pub fn r(&self, cid: &str) -> Value {
        match self.refs.get(cid) {
            Some(id) => Value::Ref(id.clone()),
            None => Value::str(cid),
        }
    }

    /// Desired resources of `kind` that are adopted by cloud ID.
    pub fn adopted(&self, kind: &str) -> impl Iterator<Item = &Resource> + '_ {
        let kind = kind.to_string();
        self.desired
            .iter()
            .filter(move |r| r.id.kind == kind && r.lifecycle == Lifecycle::ExistsAndValidates)
    }
}

/// The logical ID of an owned resource from its tags; one that lost its `kprov.dev/id` tag is
/// still owned, so it gets an ID that no desired resource has and is planned for deletion.
pub(crate) fn id_from_tags<'a>(
    kind: &str,
    cloud_id: &str,
    tags: impl Iterator<Item = (&'a str, &'a str)>,
) -> ResourceId {
    tags.filter(|(k, _)| *k == TAG_ID)
        .find_map(|(_, v)| ResourceId::parse(v).filter(|id| id.kind == kind))
        .unwrap_or_else(|| ResourceId::new(kind, format!("untracked-{cloud_id}")))
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

/// Resolves a reference to a cloud ID.
pub(crate) fn cid<'a>(ids: &'a IdMap, v: Option<&'a Value>) -> Result<&'a str, CloudError> {
    match v {
        Some(Value::Ref(r)) => ids
            .get(r)
            .map(String::as_str)
            .ok_or_else(|| CloudError::Model(format!("{r} has no cloud ID yet"))),
        Some(Value::Str(s)) => Ok(s),
        other => Err(CloudError::Model(format!(
            "expected a reference, found {other:?}"
        ))),
    }
}

pub(crate) fn cids(ids: &IdMap, v: Option<&Value>) -> Result<Vec<String>, CloudError> {
    v.map(Value::as_list)
        .unwrap_or_default()
        .iter()
        .map(|x| cid(ids, Some(x)).map(str::to_string))
        .collect()
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
        "IncorrectInstanceState" | "InvalidNatGatewayID.NotFound" => ErrorClass::NotReady,
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
    R: std::fmt::Debug,
{
    fn ctx(self, operation: &str) -> Result<T, CloudError> {
        self.map_err(|e| {
            let class = e.code().map(classify).unwrap_or(ErrorClass::Fatal);
            CloudError::Api {
                operation: operation.to_string(),
                class,
                message: DisplayErrorContext(&e).to_string(),
            }
        })
    }
}

/// A step after the first write of a create must not be retried by re-running the create (that
/// would make a second resource): the next plan finds the half-made one by its tags instead.
pub(crate) fn after_create(e: CloudError) -> CloudError {
    match e {
        CloudError::Api {
            operation, message, ..
        } => CloudError::Api {
            operation,
            class: ErrorClass::Fatal,
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
        let mut rd = Reader {
            desired,
            refs: HashMap::new(),
            out: Vec::new(),
            warnings: Vec::new(),
            conflicts: Vec::new(),
        };
        // Order matters: each reader turns cloud IDs of the kinds read before it into refs.
        ec2::read_network(self, &mut rd).await?;
        ec2::read_security_groups(self, &mut rd).await?;
        ec2::read_key_pairs(self, &mut rd).await?;
        iam::read(self, &mut rd).await?;
        ec2::read_launch_templates(self, &mut rd).await?;
        elb::read(self, &mut rd).await?;
        asg::read(self, &mut rd).await?;
        dns::read(self, &mut rd).await?;
        Ok(Actual {
            resources: rd.out,
            warnings: rd.warnings,
            conflicts: rd.conflicts,
        })
    }

    async fn create(&self, want: &Resource, ids: &IdMap) -> Result<String, CloudError> {
        match want.id.kind.as_str() {
            AUTOSCALING_GROUP => asg::create(self, want, ids).await,
            LOAD_BALANCER | TARGET_GROUP | LISTENER => elb::create(self, want, ids).await,
            IAM_ROLE | IAM_ROLE_POLICY | INSTANCE_PROFILE => iam::create(self, want, ids).await,
            DNS_RECORD => dns::upsert(self, want, ids).await,
            DNS_ZONE_VPC => dns::associate(self, want, ids).await,
            _ => ec2::create(self, want, ids).await,
        }
    }

    async fn update(
        &self,
        want: &Resource,
        have: &Resource,
        changes: &[FieldChange],
        ids: &IdMap,
    ) -> Result<(), CloudError> {
        match want.id.kind.as_str() {
            AUTOSCALING_GROUP => asg::update(self, want, have, changes, ids).await,
            LOAD_BALANCER | TARGET_GROUP | LISTENER => {
                elb::update(self, want, have, changes, ids).await
            }
            IAM_ROLE | IAM_ROLE_POLICY | INSTANCE_PROFILE => {
                iam::update(self, want, have, changes, ids).await
            }
            DNS_RECORD => dns::upsert(self, want, ids).await.map(|_| ()),
            _ => ec2::update(self, want, have, changes, ids).await,
        }
    }

    async fn delete(&self, have: &Resource, ids: &IdMap) -> Result<(), CloudError> {
        match have.id.kind.as_str() {
            AUTOSCALING_GROUP => asg::delete(self, have).await,
            LOAD_BALANCER | TARGET_GROUP | LISTENER => elb::delete(self, have).await,
            IAM_ROLE | IAM_ROLE_POLICY | INSTANCE_PROFILE => iam::delete(self, have, ids).await,
            DNS_RECORD => dns::delete(self, have).await,
            DNS_ZONE_VPC => dns::disassociate(self, have).await,
            _ => ec2::delete(self, have, ids).await,
        }
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
        for code in ["DependencyViolation", "ResourceInUse", "DeleteConflict"] {
            assert_eq!(classify(code), ErrorClass::DependencyViolation, "{code}");
        }
        for code in ["InvalidParameterValue", "UnauthorizedOperation", ""] {
            assert_eq!(classify(code), ErrorClass::Fatal, "{code}");
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
}
