//! `create cluster` → `update cluster` (preview) → `--yes` → no changes → `delete --yes`,
//! through the real binary against moto, for both topologies.

use crate::support::awscloud::{ec2_filter, instances_of};
use crate::support::awsroll::{CreateAws, code, lab_with_zone, text};
use crate::support::cli::Env;
use crate::support::moto::owned_vpcs;

/// The cluster's running instances that kprov provisions (not its bastions), by instance ID,
/// read with the SDK from moto itself.
async fn node_instances(sdk: &aws_config::SdkConfig, cluster: &str) -> Vec<String> {
    let ec2 = aws_sdk_ec2::Client::new(sdk);
    let owned = ec2_filter(format!("tag:kubernetes.io/cluster/{cluster}"), ["owned"]);
    let running = ec2_filter("instance-state-name", ["running"]);
    instances_of(ec2.describe_instances().filters(owned).filters(running))
        .await
        .iter()
        .filter(|i| {
            !i.tags().iter().any(|t| {
                t.key() == Some("aws:autoscaling:groupName")
                    && t.value().is_some_and(|v| v.starts_with("bastions."))
            })
        })
        .filter_map(|i| i.instance_id().map(str::to_string))
        .collect()
}

/// The whole CLI lifecycle in a cloud lab: `update --yes` provisions the instances, so kprov
/// and moto run where the only addresses are test hosts the lab created (moto's public
/// addresses are invented). kprov reaches the instances at their private addresses, or with
/// `--bastion` through `bastion.NAME` (the bastion load balancer's record, which the lab
/// resolves to the host playing the bastion instance).
fn lifecycle(zone: &str, cluster: &str, zones: &str, extra: &[&str]) {
    let lab = lab_with_zone(zone);
    let sdk = lab.block_on(lab.sdk_config());
    CreateAws::new(cluster).zones(zones).flags(extra).run(&lab);
    lab.use_mirror(cluster);
    lab.watch();
    let vpcs = || lab.block_on(owned_vpcs(&sdk, cluster));
    assert_eq!(vpcs(), 0, "create cluster must change no infrastructure");

    let preview = code(
        &lab,
        &lab.kprov(&["update", "cluster", cluster, "--exit-code"]),
        2,
    );
    assert!(
        preview.contains("Will create") && preview.contains("Vpc"),
        "{preview}"
    );
    assert_eq!(vpcs(), 0, "a preview must change nothing");
    let json: serde_json::Value = serde_json::from_str(&code(
        &lab,
        &lab.kprov(&["update", "cluster", cluster, "-o", "json"]),
        0,
    ))
    .expect("json plan");
    assert_eq!(json["schemaVersion"], 2);
    // No instance runs yet: no node plan; the one document's other parts are there, empty.
    assert!(json.get("nodePlan").is_none(), "{json}");
    assert_eq!(json["hostsToRemove"], serde_json::json!([]), "{json}");
    assert_eq!(json["refusals"], serde_json::json!([]), "{json}");
    let creates = json["summary"]["create"].as_u64().unwrap();
    assert!(creates > 20, "{json}");

    let reach: &[&str] = if extra.contains(&"--bastion") {
        &[]
    } else {
        &["--ssh-private-address"]
    };
    let yes = [&["update", "cluster", cluster, "--yes"][..], reach].concat();
    let out = lab.kprov(&yes);
    code(&lab, &out, 0);
    assert_eq!(vpcs(), 1);
    // With AWS as it is (profiles refused at first, fresh IDs not found, instances late),
    // the first run completes and says what it waited for and how long.
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    // Every instance provisioned in this one run: each running instance of the groups (the
    // bastion is a jump host) is in the report, and the summary counts them all.
    let nodes = lab.block_on(node_instances(&sdk, cluster));
    assert!(!nodes.is_empty(), "no instance launched");
    for i in &nodes {
        assert!(said.contains(i.as_str()), "{i} not provisioned:\n{said}");
    }
    assert!(
        said.contains(&format!("changed on {} hosts.", nodes.len())),
        "not every one of {} instances provisioned:\n{said}",
        nodes.len()
    );
    // Each wait is said with what was waited for and how long: a cloud resource on AWS
    // ("RESOURCE: waited 2.1s for AWS (why)") or the groups on Auto Scaling.
    let waits: Vec<&str> = said.lines().filter(|l| l.contains("waited")).collect();
    for w in &waits {
        let aws = w.split_once(": waited ").is_some_and(|(what, rest)| {
            !what.trim().is_empty()
                && rest
                    .split_once("s for AWS (")
                    .is_some_and(|(secs, _)| secs.parse::<f64>().is_ok())
        });
        let launch = w
            .split_once("every group launched its instances (waited ")
            .is_some_and(|(_, rest)| {
                rest.split_once("s for Auto Scaling)")
                    .is_some_and(|(secs, _)| secs.parse::<u64>().is_ok())
            });
        assert!(aws || launch, "a wait line without what or how long: {w}");
    }
    if lab.as_it_is.is_some() {
        assert!(!waits.is_empty(), "no wait reported:\n{said}");
    }
    println!(
        "AS-IT-IS {cluster}: update --yes in one run; waits:\n{}",
        waits.join("\n")
    );
    let again = code(
        &lab,
        &lab.kprov(&[&["update", "cluster", cluster, "--exit-code"][..], reach].concat()),
        0,
    );
    assert!(again.contains("No changes"), "{again}");

    let delete_preview = code(&lab, &lab.kprov(&["delete", "cluster", cluster]), 0);
    assert!(delete_preview.contains("Will delete"), "{delete_preview}");
    assert_eq!(vpcs(), 1, "delete without --yes must change nothing");
    code(
        &lab,
        &lab.kprov(&["delete", "cluster", cluster, "--yes"]),
        0,
    );
    assert_eq!(vpcs(), 0);
    let gone = lab.kprov(&["get", "cluster", cluster]);
    assert_eq!(
        gone.status.code(),
        Some(1),
        "the state is removed after the cloud resources"
    );
}

#[test]
fn minimal_public_cluster_through_the_cli() {
    crate::needs_tier!(CloudLab);
    lifecycle("cli-min.example", "demo.cli-min.example", "us-east-1a", &[]);
}

#[test]
fn ha_private_cluster_through_the_cli() {
    crate::needs_tier!(CloudLab);
    lifecycle(
        "cli-ha.example",
        "prod.cli-ha.example",
        "us-east-1a,us-east-1b,us-east-1c",
        &[
            "--control-plane-count",
            "3",
            "--topology",
            "private",
            "--bastion",
        ],
    );
}

#[test]
fn update_of_a_missing_cluster_names_the_store() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    let err = env.run(&["update", "cluster", "nope.example.com"]);
    assert_eq!(err.status.code(), Some(1));
    assert!(
        text(&err.stderr).contains("cluster \"nope.example.com\" not found in file://"),
        "{}",
        text(&err.stderr)
    );
}
