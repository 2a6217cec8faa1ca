//! `delete instance` on AWS through the library, against moto and the fake API: a worker is
//! drained, then terminated in its Auto Scaling group (which replaces it, or shrinks with
//! `decrement`), and its Node object deleted; a control plane and a shrink below the group's
//! minimum are refused before anything changes.

use std::sync::Arc;
use std::time::Duration;

use kprov::cloud::aws::instances::{AwsInstances, SshReach};
use kprov::kube::{DrainOptions, EvictOptions};
use kprov::ops::instance::{RemoveEvent, RemoveEvents, plan_aws, remove_aws};

use crate::aws::{apply, delete_all, plan, wait_launched, zoned};
use crate::support::awscloud;
use crate::support::cli::holds_all;
use crate::support::fakekube::{FakeKube, replica_pod};
use crate::support::memstate::MemStore;

fn drain() -> DrainOptions {
    DrainOptions {
        timeout: Duration::from_secs(10),
        poll: Duration::from_millis(50),
        eviction: EvictOptions {
            deadline: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(200),
        },
        ..DrainOptions::default()
    }
}

/// Asserts that `plan` refuses the removal, saying `why`.
fn assert_refused(plan: &kprov::ops::instance::AwsRemovalPlan, why: &str) {
    assert!(
        plan.refusals.iter().any(|r| r.contains(why)),
        "{:?}",
        plan.refusals
    );
}

/// `remove_aws` of `node` with the test's drain options, the group's size kept.
async fn remove(
    e: &crate::aws::Env,
    instances: &AwsInstances,
    kube: Option<&kprov::kube::Kube>,
    node: &str,
    guard: &kprov::state::lock::LockGuard,
    events: &RemoveEvents,
) -> anyhow::Result<(
    kprov::ops::instance::AwsRemovalPlan,
    Option<kprov::kube::DrainReport>,
)> {
    remove_aws(
        &e.cloud,
        instances,
        kube,
        node,
        guard,
        &drain(),
        false,
        events,
    )
    .await
}

async fn instance_state(sdk: &aws_config::SdkConfig, id: &str) -> String {
    let ec2 = aws_sdk_ec2::Client::new(sdk);
    let out = awscloud::sent(ec2.describe_instances().instance_ids(id).send()).await;
    out.reservations()[0].instances()[0]
        .state()
        .and_then(|s| s.name())
        .map(|n| n.as_str().to_string())
        .unwrap_or_default()
}

async fn desired(sdk: &aws_config::SdkConfig, asg: &str) -> i32 {
    let c = aws_sdk_autoscaling::Client::new(sdk);
    let groups = c
        .describe_auto_scaling_groups()
        .auto_scaling_group_names(asg);
    let out = awscloud::sent(groups.send()).await;
    out.auto_scaling_groups()[0].desired_capacity().unwrap()
}

#[tokio::test]
async fn a_worker_instance_is_drained_then_terminated_in_its_group() {
    crate::needs_tier!(Moto);
    let name = "rm.rminstance.example.com";
    let zone = "rminstance.example.com";
    let (e, _, c, mut igs) = zoned(name, zone, false).await;
    // The control plane's image is an ami- ID, which names no login user.
    for g in &mut igs {
        g.spec.ssh_user.get_or_insert_with(|| "ops".into());
    }
    let p = plan(&e, &c, &igs).await;
    apply(&e, &p, false).await;
    wait_launched(&e, &igs).await;
    let instances = AwsInstances::new(&e.cloud, &igs, SshReach::Private);
    let found = instances.discover().await.expect("instances");
    let worker = found
        .targets
        .iter()
        .find(|t| !t.is_control_plane())
        .expect("a worker")
        .clone();
    let cp = found
        .targets
        .iter()
        .find(|t| t.is_control_plane())
        .expect("a control plane")
        .clone();
    let fake = FakeKube::start().await;
    fake.put_nodes(&[&cp.node_name], &[&worker.node_name, "spare"]);
    fake.run_replicaset_controller();
    fake.put(replica_pod("web-1", "web", &worker.node_name));
    let kube = fake.kube().await;
    let asg = format!("nodes.{name}");
    let before = desired(&e.sdk, &asg).await;

    // The preview finds the instance by node name or instance ID and changes nothing.
    let by_id = plan_aws(
        &e.cloud,
        &instances,
        Some(&kube),
        worker.name(),
        &drain(),
        false,
    )
    .await
    .unwrap();
    assert_eq!(by_id.node, worker.node_name);
    assert_eq!(by_id.auto_scaling_group, asg);
    assert_eq!(by_id.capacity.desired, before);
    assert!(by_id.refusals.is_empty(), "{:?}", by_id.refusals);
    assert_eq!(by_id.pods.len(), 1);
    // Shrinking below the group's minimum and control planes are refused.
    let shrink = plan_aws(
        &e.cloud,
        &instances,
        Some(&kube),
        &worker.node_name,
        &drain(),
        true,
    )
    .await
    .unwrap();
    assert_eq!(
        shrink.capacity.min, before,
        "the spec's group runs at its minimum"
    );
    assert_refused(&shrink, "below its minimum size");
    let cp_plan = plan_aws(
        &e.cloud,
        &instances,
        Some(&kube),
        &cp.node_name,
        &drain(),
        false,
    )
    .await
    .unwrap();
    assert_refused(&cp_plan, "is a control plane");
    assert!(
        fake.requests().iter().all(|r| !r.is_write()),
        "a preview wrote to the API"
    );
    assert_eq!(instance_state(&e.sdk, worker.name()).await, "running");

    let store: Arc<dyn kprov::state::StateStore> = Arc::new(MemStore::default());
    let guard = kprov::state::lock::acquire(store, name, "test", Duration::from_secs(60))
        .await
        .unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let events: RemoveEvents = {
        let seen = seen.clone();
        Arc::new(move |e: &RemoveEvent| seen.lock().unwrap().push(e.clone()))
    };
    let e2 = remove(&e, &instances, Some(&kube), &cp.node_name, &guard, &events)
        .await
        .unwrap_err()
        .to_string();
    holds_all(&e2, &["refusing to remove", "control plane"]);
    assert_eq!(instance_state(&e.sdk, cp.name()).await, "running");

    let (done, drained) = remove(
        &e,
        &instances,
        Some(&kube),
        &worker.node_name,
        &guard,
        &events,
    )
    .await
    .unwrap();
    assert_eq!(drained.unwrap().evicted, ["default/web-1"]);
    assert_eq!(done.instance_id, worker.name());
    let state = instance_state(&e.sdk, worker.name()).await;
    assert!(state == "shutting-down" || state == "terminated", "{state}");
    assert!(fake.get("Node", None, &worker.node_name).is_none());
    assert!(fake.get("Pod", Some("default"), "web-1").is_none());
    assert_eq!(
        desired(&e.sdk, &asg).await,
        before,
        "the group replaces the instance"
    );
    let steps: Vec<RemoveEvent> = seen.lock().unwrap().clone();
    let draining = steps
        .iter()
        .position(|s| matches!(s, RemoveEvent::Step(t) if t.starts_with("draining")))
        .expect("draining step");
    let terminating = steps
        .iter()
        .position(|s| matches!(s, RemoveEvent::Step(t) if t.starts_with("terminating")))
        .expect("terminating step");
    assert!(draining < terminating, "{steps:?}");

    // With `decrement` the group shrinks instead (here from 2, above its minimum of 1).
    aws_sdk_autoscaling::Client::new(&e.sdk)
        .update_auto_scaling_group()
        .auto_scaling_group_name(&asg)
        .desired_capacity(before + 1)
        .send()
        .await
        .unwrap();
    let found = instances.discover().await.expect("instances");
    let other = found
        .targets
        .iter()
        .find(|t| !t.is_control_plane() && t.name() != worker.name())
        .expect("another worker")
        .clone();
    fake.put_nodes(&[], &[&other.node_name]);
    let (done, _) = remove_aws(
        &e.cloud,
        &instances,
        Some(&kube),
        other.name(),
        &guard,
        &drain(),
        true,
        &events,
    )
    .await
    .unwrap();
    assert!(done.decrement);
    assert_eq!(
        desired(&e.sdk, &asg).await,
        before,
        "the group shrank by one"
    );
    let state = instance_state(&e.sdk, other.name()).await;
    assert!(state == "shutting-down" || state == "terminated", "{state}");
    assert!(fake.get("Node", None, &other.node_name).is_none());

    // --cloudonly (no API at all): an instance whose node cannot be asked about (here the
    // API is not even given) is previewed and terminated through its group by the cloud alone;
    // its Node object is left to the cloud-controller-manager.
    let third = {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let found = instances.discover().await.expect("instances");
            if let Some(t) = found.targets.iter().find(|t| {
                !t.is_control_plane() && t.name() != worker.name() && t.name() != other.name()
            }) {
                break t.clone();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the group launched no replacement"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    fake.put_nodes(&[], &[&third.node_name]);
    let preview = plan_aws(&e.cloud, &instances, None, third.name(), &drain(), false)
        .await
        .unwrap();
    assert!(preview.cloud_only && preview.node_object.is_none() && preview.pods.is_empty());
    assert!(preview.refusals.is_empty(), "{:?}", preview.refusals);
    let (done, drained) = remove(&e, &instances, None, third.name(), &guard, &events)
        .await
        .unwrap();
    assert!(drained.is_none() && done.cloud_only);
    let state = instance_state(&e.sdk, third.name()).await;
    assert!(state == "shutting-down" || state == "terminated", "{state}");
    assert!(fake.get("Node", None, &third.node_name).is_some());
    guard.release().await.unwrap();
    delete_all(&e, &c, &igs).await;
}
