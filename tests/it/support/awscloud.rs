//! The AWS cloud driven through the library, as `update cluster --yes` drives it: the SDK
//! settings of the CLI, the groups' generated host keys, and the clean-up after a test.

use std::collections::BTreeMap;
use std::time::Duration;

use kprov::cloud::aws::AwsCloud;
use kprov::cloud::aws::hostkeys::GroupHostKey;
use kprov::cloud::engine::{self, ApplyOptions, CloudError};
use kprov::spec::{Cluster, InstanceGroup};

/// An SDK config for `endpoint` (moto, or a fault proxy before it): dummy credentials,
/// us-east-1, the CLI's retry mode (standard, `attempts` attempts, short backoff so the
/// tests stay quick).
pub async fn proxied_sdk(endpoint: &str, attempts: u32) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            "testing", "testing", None, None, "tests",
        ))
        .retry_config(
            aws_config::retry::RetryConfig::standard()
                .with_max_attempts(attempts)
                .with_initial_backoff(Duration::from_millis(20)),
        )
        .load()
        .await
}

/// One SSH host key per group, generated as `update --yes` does (launch templates carry them).
pub async fn host_keys(igs: &[InstanceGroup]) -> BTreeMap<String, GroupHostKey> {
    let mut keys = BTreeMap::new();
    for g in igs {
        let k = kprov::cloud::aws::hostkeys::generate(&g.metadata.name)
            .await
            .expect("ssh-keygen");
        keys.insert(g.metadata.name.clone(), k);
    }
    keys
}

/// `cloud`'s plan for the cluster `c` with `igs`, resolved as `update cluster` resolves it.
pub async fn plan(
    cloud: &AwsCloud,
    c: &Cluster,
    igs: &[InstanceGroup],
) -> Result<engine::Plan, CloudError> {
    cloud.plan(&model(c, igs)).await
}

/// `cloud`'s plan to delete what the cluster `c` with `igs` owns (`delete cluster`'s
/// preview); fails the test if there is none.
pub async fn plan_delete(cloud: &AwsCloud, c: &Cluster, igs: &[InstanceGroup]) -> engine::Plan {
    let cluster = model(c, igs);
    cloud.plan_delete(&cluster).await.expect("delete plan")
}

fn model(c: &Cluster, igs: &[InstanceGroup]) -> kprov::spec::resolve::ResolvedCluster {
    kprov::spec::resolve::model(c, igs).expect("model")
}

/// Deletes everything the cluster owns (`delete cluster --yes`'s cloud part).
pub async fn delete_all(cloud: &AwsCloud, c: &Cluster, igs: &[InstanceGroup]) {
    let doomed = plan_delete(cloud, c, igs).await;
    apply_pruning(cloud, &doomed, "clean up").await;
}

/// Applies `plan` with `--prune` (deletions too); fails naming `what`.
pub async fn apply_pruning(
    cloud: &AwsCloud,
    plan: &engine::Plan,
    what: &str,
) -> engine::ApplyReport {
    let prune = ApplyOptions {
        prune: true,
        ..ApplyOptions::default()
    };
    engine::apply(cloud, plan, &prune)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// The output of a request the harness sends itself (setup or check); a failure fails the
/// test.
pub async fn sent<T, E: std::fmt::Debug>(request: impl Future<Output = Result<T, E>>) -> T {
    request
        .await
        .unwrap_or_else(|e| panic!("a request of the test failed: {e:?}"))
}

/// Every instance a DescribeInstances request of the harness answers, across reservations.
pub async fn instances_of(
    request: aws_sdk_ec2::operation::describe_instances::builders::DescribeInstancesFluentBuilder,
) -> Vec<aws_sdk_ec2::types::Instance> {
    sent(request.send())
        .await
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .cloned()
        .collect()
}

/// An EC2 filter: `name` is any of `values`.
pub fn ec2_filter<V: Into<String>>(
    name: impl Into<String>,
    values: impl IntoIterator<Item = V>,
) -> aws_sdk_ec2::types::Filter {
    aws_sdk_ec2::types::Filter::builder()
        .name(name)
        .set_values(Some(values.into_iter().map(Into::into).collect()))
        .build()
}

/// The EC2 filter `f` for Auto Scaling's describe calls.
pub fn asg_filter(f: aws_sdk_ec2::types::Filter) -> aws_sdk_autoscaling::types::Filter {
    aws_sdk_autoscaling::types::Filter::builder()
        .set_name(f.name().map(str::to_string))
        .set_values(Some(f.values().to_vec()))
        .build()
}

/// Creates a VPC with plain SDK calls (one the user or another tool made) and returns its ID.
pub async fn create_vpc(ec2: &aws_sdk_ec2::Client, cidr: &str) -> String {
    let out = sent(ec2.create_vpc().cidr_block(cidr).send()).await;
    out.vpc()
        .and_then(|v| v.vpc_id())
        .expect("VPC id")
        .to_string()
}

/// Creates a subnet of `vpc` (in `zone` when given) with plain SDK calls; returns its ID.
pub async fn create_subnet(
    ec2: &aws_sdk_ec2::Client,
    vpc: &str,
    cidr: &str,
    zone: Option<&str>,
) -> String {
    let zone = zone.map(str::to_string);
    let request = ec2.create_subnet().vpc_id(vpc).cidr_block(cidr);
    let out = sent(request.set_availability_zone(zone).send()).await;
    out.subnet()
        .and_then(|s| s.subnet_id())
        .expect("subnet id")
        .to_string()
}

/// Creates an internet gateway attached to `vpc` with plain SDK calls; returns its ID.
pub async fn create_internet_gateway(ec2: &aws_sdk_ec2::Client, vpc: &str) -> String {
    let out = sent(ec2.create_internet_gateway().send()).await;
    let igw = out.internet_gateway().and_then(|g| g.internet_gateway_id());
    let igw = igw.expect("internet gateway id").to_string();
    let attach = ec2.attach_internet_gateway().internet_gateway_id(&igw);
    sent(attach.vpc_id(vpc).send()).await;
    igw
}

/// Gives `subnet` a route table of its own in `vpc` that sends 0.0.0.0/0 to the internet
/// gateway `igw` (what makes a subnet public); returns the table's ID.
pub async fn route_to_internet(
    ec2: &aws_sdk_ec2::Client,
    vpc: &str,
    subnet: &str,
    igw: &str,
) -> String {
    let out = sent(ec2.create_route_table().vpc_id(vpc).send()).await;
    let rt = out.route_table().and_then(|t| t.route_table_id());
    let rt = rt.expect("route table id").to_string();
    let route = ec2.create_route().route_table_id(&rt).gateway_id(igw);
    sent(route.destination_cidr_block("0.0.0.0/0").send()).await;
    let association = ec2.associate_route_table().route_table_id(&rt);
    sent(association.subnet_id(subnet).send()).await;
    rt
}

/// Makes `subnet` give its instances public addresses (what a public subnet the user made
/// has).
pub async fn map_public_ip_on_launch(ec2: &aws_sdk_ec2::Client, subnet: &str) {
    ec2.modify_subnet_attribute()
        .subnet_id(subnet)
        .map_public_ip_on_launch(
            aws_sdk_ec2::types::AttributeBooleanValue::builder()
                .value(true)
                .build(),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("public IPs on {subnet}: {e}"));
}

/// Creates an A record `name` -> `address` in the hosted zone `zone_id` with plain SDK calls
/// (a record someone else wrote: no owner TXT record beside it).
pub async fn create_a_record(
    sdk: &aws_config::SdkConfig,
    zone_id: &str,
    name: &str,
    address: &str,
) {
    use aws_sdk_route53::types::{
        Change, ChangeAction, ChangeBatch, ResourceRecord, ResourceRecordSet, RrType,
    };
    let set = ResourceRecordSet::builder()
        .name(name)
        .r#type(RrType::A)
        .ttl(60)
        .resource_records(ResourceRecord::builder().value(address).build().unwrap())
        .build()
        .unwrap();
    let change = Change::builder()
        .action(ChangeAction::Create)
        .resource_record_set(set)
        .build()
        .unwrap();
    aws_sdk_route53::Client::new(sdk)
        .change_resource_record_sets()
        .hosted_zone_id(zone_id)
        .change_batch(ChangeBatch::builder().changes(change).build().unwrap())
        .send()
        .await
        .unwrap_or_else(|e| panic!("A record {name} in {zone_id}: {e}"));
}
