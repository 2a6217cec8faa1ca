//! AWS as it really behaves, where moto is instantly consistent (issue 23): the fault proxy
//! in front of moto answers what AWS answers while a change propagates, and kprov's cloud
//! apply must ride it out: an instance profile refused by Auto Scaling for a while after its
//! creation, IDs returned a moment ago not found yet by the next call. Each test fails on a
//! kprov that takes those answers as final. Needs moto (no root).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use kprov::cloud::aws::AwsCloud;
use kprov::cloud::engine::{self, ApplyOptions};
use kprov::spec::{Cluster, InstanceGroup};

use crate::support::awscloud::{self, apply_pruning, delete_all, host_keys, proxied_sdk};
use crate::support::faultproxy::{AwsError, Fault, FaultProxy, Request};
use crate::support::moto::moto;

/// A cloud for `cluster` whose SDK goes through `proxy` (the CLI's retry settings), with
/// generated host keys.
async fn cloud(proxy: &FaultProxy, cluster: &str, igs: &[InstanceGroup]) -> AwsCloud {
    let sdk = proxied_sdk(&proxy.endpoint, 3).await;
    AwsCloud::new(&sdk, cluster, &[]).with_host_keys(host_keys(igs).await)
}

/// Applies, then checks that a second plan finds nothing to do.
async fn apply_converged(cloud: &AwsCloud, c: &Cluster, igs: &[InstanceGroup]) {
    let plan = awscloud::plan(cloud, c, igs).await.expect("plan");
    engine::apply(cloud, &plan, &ApplyOptions::default())
        .await
        .unwrap_or_else(|e| panic!("apply: {e}\nmoto:\n{}", moto().log_tail()));
    let again = awscloud::plan(cloud, c, igs).await.expect("plan again");
    assert!(again.is_empty(), "{:?}", again.changes);
}

/// Applies, checks that a second plan finds nothing to do, then deletes everything.
async fn apply_converge_delete(cloud: &AwsCloud, c: &Cluster, igs: &[InstanceGroup]) {
    apply_converged(cloud, c, igs).await;
    delete_all(cloud, c, igs).await;
}

/// IAM is eventually consistent: for a few seconds after CreateInstanceProfile, IAM itself
/// may not show the profile (NoSuchEntity) and Auto Scaling refuses a launch template naming
/// it (`ValidationError ... Invalid IAM Instance Profile name`). kprov waits for the profile
/// and retries the group within the propagation window, so the first apply completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_profiles_refused_until_they_propagate() {
    crate::needs_tier!(Moto);
    let zone = "real-profile.example";
    let cluster = "demo.real-profile.example";
    crate::aws::make_zone(&moto().sdk_config().await, zone).await;
    let proxy = FaultProxy::start(&moto().endpoint);
    let (c, igs) = crate::aws::spec(cluster, zone, false);
    let cloud = cloud(&proxy, cluster, &igs).await;
    let created = Arc::new(AtomicBool::new(false));
    let seen = created.clone();
    proxy.set_policy(Box::new(move |r: &Request| match r.action.as_str() {
        "CreateInstanceProfile" => {
            seen.store(true, Ordering::SeqCst);
            None
        }
        "GetInstanceProfile" if seen.load(Ordering::SeqCst) && r.seen < 2 => {
            Some(Fault::Answer(AwsError::NO_SUCH_ENTITY))
        }
        "CreateAutoScalingGroup" if r.seen < 3 => {
            Some(Fault::Answer(AwsError::PROFILE_NOT_PROPAGATED))
        }
        _ => None,
    }));
    let t = Instant::now();
    apply_converge_delete(&cloud, &c, &igs).await;
    let stats = proxy.stats();
    assert!(created.load(Ordering::SeqCst));
    let refused = stats
        .injected
        .iter()
        .filter(|(f, _)| matches!(f, Fault::Answer(_)))
        .map(|(_, n)| n)
        .sum::<u64>();
    // Two groups refused three times each, two profiles unseen twice each.
    assert!(refused >= 10, "{stats:?}");
    println!(
        "AWS-REAL profile propagation: {refused} refusals ridden out, apply + re-plan + delete in {:.1?}",
        t.elapsed()
    );
}

const fn ec2_not_found(code: &'static str) -> Fault {
    Fault::Answer(AwsError {
        status: 400,
        code,
        message: "The ID does not exist (not propagated yet)",
    })
}

/// EC2 and IAM are eventually consistent: a call naming an ID returned a moment ago may be
/// answered "not found". Every follow-up step of a create (public IPs on a new subnet, the
/// gateway's attachment, routes and associations of a new table, rules naming new groups, the
/// role added to a new profile, the NAT gateway's wait) meets that twice here, by error code,
/// and the apply still completes with nothing made twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_not_found_right_after_their_creation_are_waited_for() {
    crate::needs_tier!(Moto);
    let zone = "real-notfound.example";
    let cluster = "demo.real-notfound.example";
    crate::aws::make_zone(&moto().sdk_config().await, zone).await;
    let proxy = FaultProxy::start(&moto().endpoint);
    let (c, igs) = crate::aws::spec(cluster, zone, true);
    let cloud = cloud(&proxy, cluster, &igs).await;
    let nat_created = Arc::new(AtomicBool::new(false));
    let nat = nat_created.clone();
    proxy.set_policy(Box::new(move |r: &Request| {
        let fault = match r.action.as_str() {
            "ModifySubnetAttribute" => ec2_not_found("InvalidSubnetID.NotFound"),
            "AttachInternetGateway" => ec2_not_found("InvalidInternetGatewayID.NotFound"),
            "CreateRoute" | "AssociateRouteTable" => ec2_not_found("InvalidRouteTableID.NotFound"),
            "AuthorizeSecurityGroupIngress" => ec2_not_found("InvalidGroup.NotFound"),
            "AddRoleToInstanceProfile" => Fault::Answer(AwsError::NO_SUCH_ENTITY),
            "CreateNatGateway" => {
                nat.store(true, Ordering::SeqCst);
                return None;
            }
            "DeleteNatGateway" => {
                nat.store(false, Ordering::SeqCst);
                return None;
            }
            // The wait after the create, by ID (the plan's reads filter by tag).
            "DescribeNatGateways"
                if nat.load(Ordering::SeqCst) && r.body.contains("NatGatewayId.1=") =>
            {
                ec2_not_found("InvalidNatGatewayID.NotFound")
            }
            _ => return None,
        };
        (r.seen < 2).then_some(fault)
    }));
    let t = Instant::now();
    apply_converge_delete(&cloud, &c, &igs).await;
    let stats = proxy.stats();
    let answered = stats
        .injected
        .iter()
        .filter(|(f, _)| matches!(f, Fault::Answer(_)))
        .map(|(_, n)| n)
        .sum::<u64>();
    assert!(answered >= 20, "{stats:?}");
    println!(
        "AWS-REAL not found yet: {answered} answers ridden out, apply + re-plan + delete in {:.1?}",
        t.elapsed()
    );
}

/// The VPC kprov makes resolves private hosted zones and names its instances: DNS support and
/// DNS hostnames on (a new VPC has hostnames off on AWS and in moto); a VPC made before kprov
/// set them is corrected by the next update. The API's target group does not preserve client
/// IPs (an internal NLB drops a control plane's connection routed back to itself) and both
/// target groups drain in 30 s instead of AWS's 300.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vpc_dns_and_target_group_attributes_as_aws_needs_them() {
    crate::needs_tier!(Moto);
    use aws_sdk_ec2::types::VpcAttributeName;
    let zone = "real-attrs.example";
    let cluster = "demo.real-attrs.example";
    let sdk = moto().sdk_config().await;
    crate::aws::make_zone(&sdk, zone).await;
    let proxy = FaultProxy::start(&moto().endpoint);
    let (c, igs) = crate::aws::spec(cluster, zone, true);
    let cloud = cloud(&proxy, cluster, &igs).await;
    apply_converged(&cloud, &c, &igs).await;

    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let vpc = ec2
        .describe_vpcs()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name(format!("tag:kubernetes.io/cluster/{cluster}"))
                .values("owned")
                .build(),
        )
        .send()
        .await
        .expect("vpcs")
        .vpcs()[0]
        .vpc_id()
        .unwrap()
        .to_string();
    let attr = async |a: VpcAttributeName| {
        let out = ec2
            .describe_vpc_attribute()
            .vpc_id(&vpc)
            .attribute(a.clone())
            .send()
            .await
            .expect("vpc attribute");
        match a {
            VpcAttributeName::EnableDnsHostnames => out.enable_dns_hostnames(),
            _ => out.enable_dns_support(),
        }
        .and_then(|v| v.value())
    };
    assert_eq!(attr(VpcAttributeName::EnableDnsSupport).await, Some(true));
    assert_eq!(attr(VpcAttributeName::EnableDnsHostnames).await, Some(true));
    // As a VPC made by an older kprov: hostnames off. The plan says so; the update fixes it.
    ec2.modify_vpc_attribute()
        .vpc_id(&vpc)
        .enable_dns_hostnames(
            aws_sdk_ec2::types::AttributeBooleanValue::builder()
                .value(false)
                .build(),
        )
        .send()
        .await
        .expect("hostnames off");
    let plan = awscloud::plan(&cloud, &c, &igs).await.expect("plan");
    let fields: Vec<String> = plan
        .changes
        .iter()
        .flat_map(|ch| {
            ch.fields
                .iter()
                .map(move |f| format!("{} {}", ch.id, f.field))
        })
        .collect();
    assert_eq!(
        fields,
        vec!["Vpc/main dnsHostnames".to_string()],
        "{:?}",
        plan.changes
    );
    engine::apply(&cloud, &plan, &ApplyOptions::default())
        .await
        .expect("apply");
    assert_eq!(attr(VpcAttributeName::EnableDnsHostnames).await, Some(true));

    let elb = aws_sdk_elasticloadbalancingv2::Client::new(&sdk);
    let tgs = elb
        .describe_target_groups()
        .send()
        .await
        .expect("target groups");
    let mut seen = Vec::new();
    for tg in tgs.target_groups() {
        let attrs = elb
            .describe_target_group_attributes()
            .target_group_arn(tg.target_group_arn().unwrap())
            .send()
            .await
            .expect("attributes");
        let get = |k: &str| {
            attrs
                .attributes()
                .iter()
                .find(|a| a.key() == Some(k))
                .and_then(|a| a.value())
                .map(str::to_string)
        };
        let port = tg.port().unwrap_or_default();
        if !tg
            .target_group_name()
            .unwrap_or_default()
            .contains("real-attrs")
        {
            continue;
        }
        let preserve = if port == 22 { "true" } else { "false" };
        assert_eq!(
            get("preserve_client_ip.enabled").as_deref(),
            Some(preserve),
            "{port}"
        );
        assert_eq!(
            get("deregistration_delay.timeout_seconds").as_deref(),
            Some("30"),
            "{port}"
        );
        seen.push(port);
    }
    seen.sort();
    assert_eq!(seen, vec![22, 6443]);
    delete_all(&cloud, &c, &igs).await;
}

/// Auto Scaling launches after CreateAutoScalingGroup returns (moto launches inside the
/// call): here the groups' instances stay invisible for 4 s after the first group is created,
/// and a scaling activity fails meanwhile. A snapshot taken right after the apply finds no
/// instance (what `update --yes` did before: "no running instance", nothing provisioned);
/// the launch wait reports each group's progress and the failure with Auto Scaling's reason,
/// and returns once every group has its desired instances with addresses. When the groups
/// never launch it ends at its limit naming each group short, with the last failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_scaling_launches_later_and_the_launch_wait_says_so() {
    crate::needs_tier!(Moto);
    use kprov::cloud::aws::instances::{AwsInstances, SshReach};
    use kprov::cloud::aws::launch::{LaunchEvent, wait_for_launches};
    use std::time::Duration;
    let zone = "real-launch.example";
    let cluster = "demo.real-launch.example";
    crate::aws::make_zone(&moto().sdk_config().await, zone).await;
    let proxy = FaultProxy::start(&moto().endpoint);
    let (c, igs) = crate::aws::spec(cluster, zone, false);
    let cloud = cloud(&proxy, cluster, &igs).await;
    let reason = "Invalid IAM Instance Profile name";
    let failed = crate::support::faultproxy::failed_activity(&format!("nodes.{cluster}"), reason);
    let window = Duration::from_secs(4);
    let created: Arc<std::sync::Mutex<Option<Duration>>> = Arc::default();
    let forever = Arc::new(AtomicBool::new(false));
    let (at, never) = (created.clone(), forever.clone());
    proxy.set_policy(Box::new(move |r: &Request| {
        let mut at = at.lock().unwrap();
        if r.action == "CreateAutoScalingGroup" && at.is_none() {
            *at = Some(r.at);
        }
        let hidden = never.load(Ordering::SeqCst) || at.is_some_and(|t| r.at < t + window);
        match r.action.as_str() {
            "DescribeInstances" if hidden => {
                Some(Fault::Reply(crate::support::faultproxy::NO_INSTANCES))
            }
            "DescribeScalingActivities" if hidden => Some(Fault::Reply(failed)),
            _ => None,
        }
    }));
    let plan = awscloud::plan(&cloud, &c, &igs).await.expect("plan");
    engine::apply(&cloud, &plan, &ApplyOptions::default())
        .await
        .unwrap_or_else(|e| panic!("apply: {e}\nmoto:\n{}", moto().log_tail()));
    let snapshot = AwsInstances::new(&cloud, &igs, SshReach::Public)
        .instances()
        .await
        .expect("instances");
    assert!(
        snapshot.is_empty(),
        "instances visible right after the apply: {snapshot:?}"
    );

    let events = std::sync::Mutex::new(Vec::new());
    let on_event = |e: LaunchEvent| events.lock().unwrap().push(e);
    let t = Instant::now();
    let short = wait_for_launches(
        &cloud,
        &igs,
        SshReach::Public,
        Duration::from_secs(60),
        Duration::from_millis(200),
        &on_event,
    )
    .await
    .expect("launch wait");
    let waited = t.elapsed();
    assert!(short.is_empty(), "{short:?}");
    let events = events.into_inner().unwrap();
    let nodes = format!("nodes.{cluster}");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, LaunchEvent::Waiting { group, ready: 0, .. } if *group == nodes)),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, LaunchEvent::Failed { reason: r, .. } if r.contains(reason))),
        "{events:?}"
    );
    assert!(
        matches!(events.last(), Some(LaunchEvent::Launched { .. })),
        "{events:?}"
    );
    let found = AwsInstances::new(&cloud, &igs, SshReach::Public)
        .instances()
        .await
        .expect("instances");
    assert_eq!(found.len(), 2, "{found:?}");

    // Groups that never launch: the wait ends at its limit, naming them and why.
    forever.store(true, Ordering::SeqCst);
    let t = Instant::now();
    let short = wait_for_launches(
        &cloud,
        &igs,
        SshReach::Public,
        Duration::from_secs(2),
        Duration::from_millis(200),
        &|_| {},
    )
    .await
    .expect("launch wait");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let nodes_short = short
        .iter()
        .find(|s| s.group == nodes)
        .expect("nodes short");
    assert_eq!(nodes_short.ready, 0);
    assert!(
        nodes_short
            .last_failure
            .as_ref()
            .is_some_and(|r| r.contains(reason)),
        "{short:?}"
    );
    println!(
        "AWS-REAL launches later: waited {waited:.1?} for Auto Scaling ({} events); a group that never launches reported after {:.1?}",
        events.len(),
        t.elapsed()
    );
    forever.store(false, Ordering::SeqCst);
    delete_all(&cloud, &c, &igs).await;
}

/// S3 answers a request signed for another region than the bucket's with a 301 and the
/// bucket's region in `x-amz-bucket-region` (the as-it-is policy does); the Rust SDK does not
/// follow it. The state store looks the region up when it opens (`S3Store::open`, what
/// `state::open` uses for `s3://` URLs), so a us-east-1 environment reaches an eu-west-1
/// bucket; a store built without the lookup is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_bucket_in_another_region_is_reached_in_its_region() {
    crate::needs_tier!(Moto);
    use bytes::Bytes;
    use kprov::state::s3::S3Store;
    use kprov::state::{Precondition, StateStore};
    let proxy = FaultProxy::start(&moto().endpoint);
    proxy.set_as_it_is(7);
    let bucket = format!("kprov-region-{:016x}", rand::random::<u64>());
    let eu = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(&proxy.endpoint)
        .region(aws_config::Region::new("eu-west-1"))
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            "testing", "testing", None, None, "region",
        ))
        .load()
        .await;
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&eu)
            .force_path_style(true)
            .build(),
    );
    s3.create_bucket()
        .bucket(&bucket)
        .create_bucket_configuration(
            aws_sdk_s3::types::CreateBucketConfiguration::builder()
                .location_constraint(aws_sdk_s3::types::BucketLocationConstraint::EuWest1)
                .build(),
        )
        .send()
        .await
        .unwrap_or_else(|e| panic!("create bucket: {e:?}\n{}", moto().log_tail()));
    let us = proxied_sdk(&proxy.endpoint, 1).await;
    let key = "demo.example.com/config";
    let err = S3Store::new(&us, &bucket, "p")
        .put(key, Bytes::from_static(b"x"), Precondition::None)
        .await
        .expect_err("signed for us-east-1");
    assert!(
        err.to_string().contains(&format!("s3://{bucket}/p")),
        "{err}"
    );
    let store = S3Store::open(&us, &bucket, "p").await;
    store
        .put(key, Bytes::from_static(b"x"), Precondition::None)
        .await
        .unwrap_or_else(|e| panic!("in the bucket's region: {e}"));
    let got = store.get(key).await.expect("get").expect("the object");
    assert_eq!(got.data, Bytes::from_static(b"x"));
    assert!(
        proxy
            .stats()
            .injected
            .keys()
            .any(|f| matches!(f, Fault::WrongRegion("eu-west-1"))),
        "{:?}",
        proxy.stats()
    );
}

/// AWS refuses IAM role names over 64 characters and tag keys over 128 (the as-it-is policy
/// does too; moto takes anything). The longest cluster name validation allows (63) makes
/// `control-plane.NAME` 77 characters: kprov shortens IAM names with a hash, so the apply
/// completes and converges, and nothing was refused for length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_cluster_name_fits_aws_limits() {
    crate::needs_tier!(Moto);
    let zone = "real-long.example";
    let cluster = format!("{}.real-long.example", "l".repeat(45));
    assert_eq!(cluster.len(), 63);
    crate::aws::make_zone(&moto().sdk_config().await, zone).await;
    let proxy = FaultProxy::start(&moto().endpoint);
    proxy.set_as_it_is(11);
    let (c, igs) = crate::aws::spec(&cluster, zone, false);
    let cloud = cloud(&proxy, &cluster, &igs).await;
    apply_converge_delete(&cloud, &c, &igs).await;
    let stats = proxy.stats();
    let refused: Vec<_> = stats
        .injected
        .keys()
        .filter(|f| matches!(f, Fault::Answer(e) if e.message.contains("length")))
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
}

/// The as-it-is policy itself: what it answers, and that it is deterministic for a seed.
#[test]
fn the_as_it_is_policy_answers_as_aws_does() {
    use crate::support::faultproxy::AsItIs;
    let req = |service: &str, action: &str, body: &str| Request {
        method: "POST".into(),
        path: "/".into(),
        service: service.into(),
        region: "us-east-1".into(),
        action: action.into(),
        seen: 0,
        body: body.into(),
        account: String::new(),
        key: [0; 32],
        at: std::time::Duration::ZERO,
    };
    let a = AsItIs::new(1);
    let mut policy = a.policy();
    let mut observe = a.observer();
    // Length limits.
    let long = "r".repeat(65);
    let f = policy(&req(
        "iam",
        "CreateRole",
        &format!("Action=CreateRole&RoleName={long}"),
    ));
    assert!(
        matches!(f, Some(Fault::Answer(e)) if e.code == "ValidationError" && e.message.contains("64")),
        "{f:?}"
    );
    let key = format!("kubernetes.io%2Fcluster%2F{}", "k".repeat(110));
    let f = policy(&req(
        "ec2",
        "CreateVpc",
        &format!("Action=CreateVpc&TagSpecification.1.Tag.1.Key={key}"),
    ));
    assert!(
        matches!(f, Some(Fault::Answer(e)) if e.code == "InvalidParameterValue"),
        "{f:?}"
    );
    assert_eq!(
        policy(&req(
            "iam",
            "CreateRole",
            "Action=CreateRole&RoleName=nodes.c"
        )),
        None
    );
    // A new ID is not found by writes naming it for a moment, then it is.
    observe(
        &req("ec2", "CreateSubnet", "Action=CreateSubnet"),
        b"HTTP/1.1 200 OK\r\n\r\n<subnet><subnetId>subnet-0123abcd</subnetId></subnet>",
    );
    let modify = req(
        "ec2",
        "ModifySubnetAttribute",
        "Action=ModifySubnetAttribute&SubnetId=subnet-0123abcd",
    );
    let f = policy(&modify);
    assert!(
        matches!(f, Some(Fault::Answer(e)) if e.code == "InvalidSubnetID.NotFound"),
        "{f:?}"
    );
    assert_eq!(
        policy(&req(
            "ec2",
            "DeleteSubnet",
            "Action=DeleteSubnet&SubnetId=subnet-0123abcd"
        )),
        None
    );
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(policy(&modify), None);
    // A profile is refused to Auto Scaling through the launch template naming it.
    observe(
        &req(
            "iam",
            "CreateInstanceProfile",
            "Action=CreateInstanceProfile&InstanceProfileName=nodes.c",
        ),
        b"HTTP/1.1 200 OK\r\n\r\n",
    );
    observe(
        &req(
            "ec2",
            "CreateLaunchTemplate",
            "Action=CreateLaunchTemplate&LaunchTemplateName=nodes.c&LaunchTemplateData.IamInstanceProfile.Name=nodes.c",
        ),
        b"HTTP/1.1 200 OK\r\n\r\n<launchTemplateId>lt-0abc12345</launchTemplateId>",
    );
    let f = policy(&req(
        "autoscaling",
        "CreateAutoScalingGroup",
        "Action=CreateAutoScalingGroup&LaunchTemplate.LaunchTemplateId=lt-0abc12345",
    ));
    assert_eq!(f, Some(Fault::Answer(AwsError::PROFILE_NOT_PROPAGATED)));
    // A new group's instances are not listed at first.
    observe(
        &req(
            "autoscaling",
            "CreateAutoScalingGroup",
            "Action=CreateAutoScalingGroup&Tags.member.1.Key=kubernetes.io%2Fcluster%2Fc",
        ),
        b"HTTP/1.1 200 OK\r\n\r\n",
    );
    let f = policy(&req(
        "ec2",
        "DescribeInstances",
        "Action=DescribeInstances&Filter.1.Name=tag%3Akubernetes.io%2Fcluster%2Fc&Filter.1.Value.1=owned",
    ));
    assert!(matches!(f, Some(Fault::Reply(_))), "{f:?}");
}

/// The AWS cloud-controller-manager adds rules to the nodes' security group (described
/// `kubernetes.io/rule/nlb/...`, or from the security group it makes for a Classic ELB) and
/// makes load balancers and security groups tagged `kubernetes.io/cluster/NAME` for Services.
/// `update --yes --prune` must neither revoke those rules nor delete those resources; `delete
/// cluster` removes the resources with a line naming them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cloud_controller_managers_rules_and_load_balancers_are_left_alone() {
    crate::needs_tier!(Moto);
    use aws_sdk_ec2::types::{
        Filter, IpPermission, IpRange, ResourceType, Tag, TagSpecification, UserIdGroupPair,
    };
    let zone = "real-ccm.example";
    let cluster = "demo.real-ccm.example";
    let sdk = moto().sdk_config().await;
    crate::aws::make_zone(&sdk, zone).await;
    let proxy = FaultProxy::start(&moto().endpoint);
    let (c, igs) = crate::aws::spec(cluster, zone, false);
    let cloud = cloud(&proxy, cluster, &igs).await;
    apply_converged(&cloud, &c, &igs).await;

    // What the CCM does for two Services, made here with plain SDK calls.
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let owned = || {
        Filter::builder()
            .name(format!("tag:kubernetes.io/cluster/{cluster}"))
            .values("owned")
            .build()
    };
    let groups = ec2
        .describe_security_groups()
        .filters(owned())
        .send()
        .await
        .expect("groups");
    let nodes = groups
        .security_groups()
        .iter()
        .find(|g| g.group_name() == Some(&format!("nodes.{cluster}")))
        .expect("nodes group");
    let nodes_id = nodes.group_id().unwrap().to_string();
    let vpc = nodes.vpc_id().unwrap().to_string();
    let elb_sg = ec2
        .create_security_group()
        .group_name(format!("k8s-elb-a1b2c3.{cluster}"))
        .description("Security group for Kubernetes ELB a1b2c3 (default/web)")
        .vpc_id(&vpc)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::SecurityGroup)
                .tags(
                    Tag::builder()
                        .key(format!("kubernetes.io/cluster/{cluster}"))
                        .value("owned")
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .expect("the CCM's group")
        .group_id()
        .unwrap()
        .to_string();
    ec2.authorize_security_group_ingress()
        .group_id(&nodes_id)
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(30080)
                .to_port(30080)
                .ip_ranges(
                    IpRange::builder()
                        .cidr_ip("0.0.0.0/0")
                        .description("kubernetes.io/rule/nlb/client=a1b2c3")
                        .build(),
                )
                .build(),
        )
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(30081)
                .to_port(30081)
                .user_id_group_pairs(UserIdGroupPair::builder().group_id(&elb_sg).build())
                .build(),
        )
        .send()
        .await
        .expect("the CCM's rules");
    let subnets = ec2
        .describe_subnets()
        .filters(owned())
        .send()
        .await
        .expect("subnets");
    let elb = aws_sdk_elasticloadbalancingv2::Client::new(&sdk);
    let lb = elb
        .create_load_balancer()
        .name("a1b2c3d4e5")
        .r#type(aws_sdk_elasticloadbalancingv2::types::LoadBalancerTypeEnum::Network)
        .subnets(subnets.subnets()[0].subnet_id().unwrap())
        .tags(
            aws_sdk_elasticloadbalancingv2::types::Tag::builder()
                .key(format!("kubernetes.io/cluster/{cluster}"))
                .value("owned")
                .build(),
        )
        .tags(
            aws_sdk_elasticloadbalancingv2::types::Tag::builder()
                .key("kubernetes.io/service-name")
                .value("default/web")
                .build(),
        )
        .send()
        .await
        .expect("the CCM's load balancer");
    let lb_arn = lb.load_balancers()[0]
        .load_balancer_arn()
        .unwrap()
        .to_string();
    // The CCM's default for a Service of type LoadBalancer: a Classic ELB in the cluster's
    // subnets behind its own security group.
    let clb = aws_sdk_elasticloadbalancing::Client::new(&sdk);
    let classic = "a9f8e7d6c5b4a3f2e1d0";
    clb.create_load_balancer()
        .load_balancer_name(classic)
        .listeners(
            aws_sdk_elasticloadbalancing::types::Listener::builder()
                .protocol("TCP")
                .load_balancer_port(80)
                .instance_port(30081)
                .build()
                .expect("listener"),
        )
        .subnets(subnets.subnets()[0].subnet_id().unwrap())
        .security_groups(&elb_sg)
        .tags(
            aws_sdk_elasticloadbalancing::types::Tag::builder()
                .key(format!("kubernetes.io/cluster/{cluster}"))
                .value("owned")
                .build()
                .expect("tag"),
        )
        .send()
        .await
        .expect("the CCM's Classic ELB");
    let classic_left = || async {
        clb.describe_load_balancers()
            .send()
            .await
            .expect("classic lbs")
            .load_balancer_descriptions()
            .iter()
            .any(|l| l.load_balancer_name() == Some(classic))
    };

    // The next update, even with --prune, has nothing to do.
    let plan = awscloud::plan(&cloud, &c, &igs).await.expect("plan");
    assert!(plan.is_empty(), "{:?}", plan.changes);
    let report = apply_pruning(&cloud, &plan, "apply --prune").await;
    assert!(report.done.is_empty(), "{:?}", report.done);
    let rules = ec2
        .describe_security_groups()
        .group_ids(&nodes_id)
        .send()
        .await
        .expect("nodes group")
        .security_groups()[0]
        .ip_permissions()
        .iter()
        .filter_map(|p| p.from_port())
        .collect::<Vec<_>>();
    assert!(
        rules.contains(&30080) && rules.contains(&30081),
        "{rules:?}"
    );
    assert!(
        classic_left().await,
        "update --prune deleted the CCM's Classic ELB"
    );

    // delete cluster removes them, and says so.
    let doomed = awscloud::plan_delete(&cloud, &c, &igs).await;
    let line = doomed
        .warnings
        .iter()
        .find(|w| w.contains("also deleting"))
        .unwrap_or_else(|| panic!("{:?}", doomed.warnings));
    assert!(
        line.contains(&elb_sg)
            && line.contains(&lb_arn)
            && line.contains(&format!("ClassicLoadBalancer {classic}")),
        "{line}"
    );
    // Before the security group and subnet it holds (which AWS refuses to delete meanwhile).
    let at = |kind: &str, what: &str| {
        doomed
            .changes
            .iter()
            .position(|ch| ch.kind == kind && ch.cloud_id.as_deref() == Some(what))
            .unwrap_or_else(|| panic!("no delete of {kind} {what}: {:?}", doomed.changes))
    };
    assert!(at("ClassicLoadBalancer", classic) < at("SecurityGroup", &elb_sg));
    assert!(
        at("ClassicLoadBalancer", classic)
            < at("Subnet", subnets.subnets()[0].subnet_id().unwrap())
    );
    delete_all(&cloud, &c, &igs).await;
    let left = elb.describe_load_balancers().send().await.expect("lbs");
    assert!(
        !left
            .load_balancers()
            .iter()
            .any(|l| l.load_balancer_arn() == Some(&lb_arn)),
        "the CCM's load balancer is left"
    );
    assert!(!classic_left().await, "the CCM's Classic ELB is left");
}

/// moto's `x-moto-account-id` on every request of a client: a moto account of the test's own,
/// where nothing another test made is seen and moto's (AWS's default) quotas apply.
#[derive(Debug)]
struct Account(&'static str);

impl aws_smithy_runtime_api::client::interceptors::Intercept for Account {
    fn name(&self) -> &'static str {
        "kprov-test-moto-account"
    }

    fn modify_before_signing(
        &self,
        ctx: &mut aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextMut<'_>,
        _rc: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        _cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        ctx.request_mut()
            .headers_mut()
            .insert("x-moto-account-id", self.0);
        Ok(())
    }
}

/// Issue 23 item 11: the Elastic IP quota is checked at plan time. In an account of its own
/// (moto's quota: 5, AWS's default) with 4 addresses allocated, the HA private cluster's
/// preview (3 NAT gateways, 3 addresses) is refused naming the numbers, and its apply changes
/// nothing; with 2 allocated the same plan passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elastic_ip_quota_is_checked_at_plan_time() {
    crate::needs_tier!(Moto);
    use aws_smithy_runtime_api::client::interceptors::SharedInterceptor;
    const ACCOUNT: &str = "232300000011";
    let zone = "real-eip.example";
    let cluster = "demo.real-eip.example";
    let sdk = moto().sdk_config().await;
    let ec2 = aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::config::Builder::from(&sdk)
            .interceptor(Account(ACCOUNT))
            .build(),
    );
    let r53 = aws_sdk_route53::Client::from_conf(
        aws_sdk_route53::config::Builder::from(&sdk)
            .interceptor(Account(ACCOUNT))
            .build(),
    );
    r53.create_hosted_zone()
        .name(zone)
        .caller_reference("kprov-test-eip")
        .send()
        .await
        .expect("zone in the test's account");
    let mut allocated = Vec::new();
    for _ in 0..4 {
        let a = ec2
            .allocate_address()
            .domain(aws_sdk_ec2::types::DomainType::Vpc)
            .send()
            .await
            .expect("allocate");
        allocated.push(a.allocation_id().unwrap().to_string());
    }
    let (c, igs) = crate::aws::spec(cluster, zone, true);
    let keys = host_keys(&igs).await;
    let kprov_sdk = moto().kprov_sdk_config().await;
    let cloud = AwsCloud::new(
        &kprov_sdk,
        cluster,
        &[SharedInterceptor::new(Account(ACCOUNT))],
    )
    .with_host_keys(keys);

    let plan = awscloud::plan(&cloud, &c, &igs).await.expect("plan");
    let said = plan.errors.join("\n");
    assert!(
        said.contains("allocates 3 Elastic IP")
            && said.contains("1 of its 5 left in us-east-1 (4 allocated)")
            && said.contains("nothing was changed"),
        "{:?}",
        plan.errors
    );
    assert!(
        engine::apply(&cloud, &plan, &ApplyOptions::default())
            .await
            .is_err(),
        "a plan over the quota must not apply"
    );
    let vpcs = ec2
        .describe_vpcs()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name(format!("tag:kubernetes.io/cluster/{cluster}"))
                .values("owned")
                .build(),
        )
        .send()
        .await
        .expect("vpcs")
        .vpcs()
        .len();
    assert_eq!(vpcs, 0, "nothing may be made in the account");

    for id in allocated.drain(..2) {
        ec2.release_address()
            .allocation_id(id)
            .send()
            .await
            .expect("release");
    }
    let plan = awscloud::plan(&cloud, &c, &igs).await.expect("plan");
    assert!(
        plan.errors.is_empty() && plan.summary.create > 20,
        "{:?}",
        plan.errors
    );
    for id in allocated {
        let _ = ec2.release_address().allocation_id(id).send().await;
    }
}
