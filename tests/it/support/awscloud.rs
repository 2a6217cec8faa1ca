//! The AWS cloud driven through the library, as `update cluster --yes` drives it: the SDK
//! settings of the CLI, the groups' generated host keys, and the clean-up after a test.

use std::collections::BTreeMap;
use std::time::Duration;

use kprov::cloud::aws::AwsCloud;
use kprov::cloud::aws::hostkeys::GroupHostKey;
use kprov::cloud::engine::{self, ApplyOptions};
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

/// Deletes everything the cluster owns (`delete cluster --yes`'s cloud part).
pub async fn delete_all(cloud: &AwsCloud, c: &Cluster, igs: &[InstanceGroup]) {
    let doomed = cloud
        .plan_delete(&kprov::spec::resolve::model(c, igs).expect("model"))
        .await
        .expect("delete plan");
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
