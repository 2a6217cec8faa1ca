//! `create cluster` → `update cluster` (preview) → `--yes` → no changes → `delete --yes`,
//! through the real binary against moto, for both topologies.

use std::process::Output;

use std::sync::Arc;

use crate::support::cli::Env;
use crate::support::cloudlab::{CloudLab, VERSION};

/// moto carries only old Ubuntu images; the owner prefix is what users write too.
const IMAGE: &str = "099720109477/ubuntu/images/hvm-ssd/ubuntu-xenial-16.04-amd64-server-*";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// VPCs tagged as owned by the cluster, counted with the SDK, not with kprov's reader.
async fn owned_vpcs(sdk: &aws_config::SdkConfig, cluster: &str) -> usize {
    let ec2 = aws_sdk_ec2::Client::new(sdk);
    let f = aws_sdk_ec2::types::Filter::builder()
        .name(format!("tag:kubernetes.io/cluster/{cluster}"))
        .values("owned")
        .build();
    ec2.describe_vpcs()
        .filters(f)
        .send()
        .await
        .expect("describe")
        .vpcs()
        .len()
}

#[track_caller]
fn lab_code(lab: &CloudLab, o: &Output, want: i32) -> String {
    assert_eq!(
        o.status.code(),
        Some(want),
        "stdout:\n{}\nstderr:\n{}\nlab sync errors: {:?}\nmoto:\n{}",
        text(&o.stdout),
        text(&o.stderr),
        lab.sync_errors(),
        lab.moto_log()
    );
    text(&o.stdout)
}

/// The whole CLI lifecycle in a cloud lab: `update --yes` provisions the instances, so kprov
/// and moto run where the only addresses are test hosts the lab created (moto's public
/// addresses are invented). kprov reaches the instances at their private addresses, or with
/// `--bastion` through `bastion.NAME` (the bastion load balancer's record, which the lab
/// resolves to the host playing the bastion instance).
fn lifecycle(zone: &str, cluster: &str, extra: &[&str]) {
    let lab = Arc::new(CloudLab::start());
    let sdk = lab.block_on(lab.sdk_config());
    lab.block_on(async {
        aws_sdk_route53::Client::new(&sdk)
            .create_hosted_zone()
            .name(zone)
            .caller_reference(zone)
            .send()
            .await
            .expect("zone")
    });
    let key = lab.home.join(".ssh/id_ed25519");
    std::fs::create_dir_all(lab.home.join(".ssh")).unwrap();
    assert!(
        std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "operator", "-f"])
            .arg(&key)
            .status()
            .unwrap()
            .success()
    );
    lab.add_operator_key(&key);
    let public = format!("{}.pub", key.display());
    let vpc = lab.net.vpc_cidr().to_string();
    let mut create = vec![
        "create",
        "cluster",
        cluster,
        "--cloud",
        "aws",
        "--ssh-public-key",
        &public,
        "--image",
        IMAGE,
        "--network-cidr",
        &vpc,
        "--kubernetes-version",
        VERSION,
    ];
    create.extend_from_slice(extra);
    lab_code(&lab, &lab.kprov(&create), 0);
    lab.use_mirror(cluster);
    lab.watch();
    let vpcs = || lab.block_on(owned_vpcs(&sdk, cluster));
    assert_eq!(vpcs(), 0, "create cluster must change no infrastructure");

    let preview = lab_code(
        &lab,
        &lab.kprov(&["update", "cluster", cluster, "--exit-code"]),
        2,
    );
    assert!(
        preview.contains("Will create") && preview.contains("Vpc"),
        "{preview}"
    );
    assert_eq!(vpcs(), 0, "a preview must change nothing");
    let json: serde_json::Value = serde_json::from_str(&lab_code(
        &lab,
        &lab.kprov(&["update", "cluster", cluster, "-o", "json"]),
        0,
    ))
    .expect("json plan");
    assert_eq!(json["schemaVersion"], 1);
    let creates = json["summary"]["create"].as_u64().unwrap();
    assert!(creates > 20, "{json}");

    let reach: &[&str] = if extra.contains(&"--bastion") {
        &[]
    } else {
        &["--ssh-private-address"]
    };
    let yes = [&["update", "cluster", cluster, "--yes"][..], reach].concat();
    lab_code(&lab, &lab.kprov(&yes), 0);
    assert_eq!(vpcs(), 1);
    let again = lab_code(
        &lab,
        &lab.kprov(&[&["update", "cluster", cluster, "--exit-code"][..], reach].concat()),
        0,
    );
    assert!(again.contains("No changes"), "{again}");

    let delete_preview = lab_code(&lab, &lab.kprov(&["delete", "cluster", cluster]), 0);
    assert!(delete_preview.contains("Will delete"), "{delete_preview}");
    assert_eq!(vpcs(), 1, "delete without --yes must change nothing");
    lab_code(
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
    lifecycle(
        "cli-min.example",
        "demo.cli-min.example",
        &["--zones", "us-east-1a"],
    );
}

#[test]
fn ha_private_cluster_through_the_cli() {
    lifecycle(
        "cli-ha.example",
        "prod.cli-ha.example",
        &[
            "--zones",
            "us-east-1a,us-east-1b,us-east-1c",
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
    let env = Env::new().with_moto();
    let err = env.run(&["update", "cluster", "nope.example.com"]);
    assert_eq!(err.status.code(), Some(1));
    assert!(
        text(&err.stderr).contains("cluster \"nope.example.com\" not found in file://"),
        "{}",
        text(&err.stderr)
    );
}
