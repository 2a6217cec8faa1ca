//! `create cluster` → `update cluster` (preview) → `--yes` → no changes → `delete --yes`,
//! through the real binary against moto, for both topologies.

use std::process::Output;

use assert_cmd::Command;

use crate::support::moto::moto;

const KEY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/id_ed25519.pub");
/// moto carries only old Ubuntu images; the owner prefix is what users write too.
const IMAGE: &str = "099720109477/ubuntu/images/hvm-ssd/ubuntu-xenial-16.04-amd64-server-*";

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn run(&self, args: &[&str]) -> Output {
        let mut c = Command::cargo_bin("kprov").expect("binary");
        c.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .env(
                "KPROV_STATE_STORE",
                format!("file://{}", self.dir.path().join("state").display()),
            )
            .env("NO_COLOR", "1");
        for (k, v) in moto().env() {
            c.env(k, v);
        }
        c.args(args).output().expect("runs")
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn code(o: &Output, want: i32) -> String {
    assert_eq!(
        o.status.code(),
        Some(want),
        "stdout:\n{}\nstderr:\n{}\nmoto:\n{}",
        text(&o.stdout),
        text(&o.stderr),
        moto().log_tail()
    );
    text(&o.stdout)
}

async fn make_zone(zone: &str) {
    let sdk = moto().sdk_config().await;
    let r53 = aws_sdk_route53::Client::new(&sdk);
    r53.create_hosted_zone()
        .name(zone)
        .caller_reference(zone)
        .send()
        .await
        .expect("zone");
}

/// VPCs tagged as owned by the cluster, counted with the SDK, not with kprov's reader.
async fn owned_vpcs(cluster: &str) -> usize {
    let sdk = moto().sdk_config().await;
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
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

async fn lifecycle(zone: &str, cluster: &str, extra: &[&str]) {
    make_zone(zone).await;
    let env = Env {
        dir: tempfile::tempdir().unwrap(),
    };
    let mut create = vec![
        "create",
        "cluster",
        cluster,
        "--cloud",
        "aws",
        "--ssh-public-key",
        KEY,
        "--image",
        IMAGE,
    ];
    create.extend_from_slice(extra);
    code(&env.run(&create), 0);
    assert_eq!(
        owned_vpcs(cluster).await,
        0,
        "create cluster must change no infrastructure"
    );

    let preview = code(&env.run(&["update", "cluster", cluster, "--exit-code"]), 2);
    assert!(
        preview.contains("Will create") && preview.contains("Vpc"),
        "{preview}"
    );
    assert_eq!(
        owned_vpcs(cluster).await,
        0,
        "a preview must change nothing"
    );
    let json: serde_json::Value = serde_json::from_str(&code(
        &env.run(&["update", "cluster", cluster, "-o", "json"]),
        0,
    ))
    .expect("json plan");
    assert_eq!(json["schemaVersion"], 1);
    let creates = json["summary"]["create"].as_u64().unwrap();
    assert!(creates > 20, "{json}");

    code(&env.run(&["update", "cluster", cluster, "--yes"]), 0);
    assert_eq!(owned_vpcs(cluster).await, 1);
    let again = code(&env.run(&["update", "cluster", cluster, "--exit-code"]), 0);
    assert!(again.contains("No changes"), "{again}");

    let delete_preview = code(&env.run(&["delete", "cluster", cluster]), 0);
    assert!(delete_preview.contains("Will delete"), "{delete_preview}");
    assert_eq!(
        owned_vpcs(cluster).await,
        1,
        "delete without --yes must change nothing"
    );
    code(&env.run(&["delete", "cluster", cluster, "--yes"]), 0);
    assert_eq!(owned_vpcs(cluster).await, 0);
    let gone = env.run(&["get", "cluster", cluster]);
    assert_eq!(
        gone.status.code(),
        Some(1),
        "the state is removed after the cloud resources"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minimal_public_cluster_through_the_cli() {
    lifecycle(
        "cli-min.example",
        "demo.cli-min.example",
        &["--zones", "us-east-1a"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_private_cluster_through_the_cli() {
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
    )
    .await;
}

#[test]
fn update_of_a_missing_cluster_names_the_store() {
    let env = Env {
        dir: tempfile::tempdir().unwrap(),
    };
    let err = env.run(&["update", "cluster", "nope.example.com"]);
    assert_eq!(err.status.code(), Some(1));
    assert!(
        text(&err.stderr).contains("cluster \"nope.example.com\" not found in file://"),
        "{}",
        text(&err.stderr)
    );
}
