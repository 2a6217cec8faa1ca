//! Exit codes and errors that tell the truth, through the real binary (against moto where a
//! cloud is needed): a plan with errors fails, a zone EC2 does not have is refused before
//! anything is made, a refused `create` writes nothing, SDK errors show the service's code.

use std::process::{Command, Output};

use crate::support::cli::{Env, KEY, create_aws_in, show as out};
use crate::support::moto::{moto, owned_vpcs};
use crate::support::snapshot_with_dirs;

#[track_caller]
fn code(o: &Output, want: i32) -> String {
    assert_eq!(
        o.status.code(),
        Some(want),
        "{}\nmoto:\n{}",
        out(o),
        moto().log_tail()
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// No debug dump of an SDK error: no struct syntax of the SDK's types.
#[track_caller]
fn no_debug_dump(err: &str) {
    for needle in [
        "ServiceError {",
        "DispatchFailure(",
        "ErrorMetadata {",
        "raw: Response",
        "SdkError",
        "source: ",
    ] {
        assert!(!err.contains(needle), "debug dump ({needle}) in:\n{err}");
    }
}

/// Creates `name` in us-east-1 (`zones`, then `extra` flags), then runs `update cluster
/// NAME` with each of `updates` (the flags after the name): each exits 1 with an error that
/// `says` accepts, and the cluster has no VPC (nothing was created).
async fn every_update_refused(
    name: &str,
    zones: &str,
    extra: &[&str],
    updates: &[&[&str]],
    says: impl Fn(&str) -> bool,
) {
    let env = Env::new().with_moto();
    code(
        &env.run(&[&create_aws_in(name, zones)[..], extra].concat()),
        0,
    );
    for flags in updates {
        let args = [&["update", "cluster", name][..], flags].concat();
        let o = env.run(&args);
        let err = code(&o, 1);
        assert!(says(&err), "{args:?}: {}", out(&o));
    }
    assert_eq!(
        owned_vpcs(&moto().sdk_config().await, name).await,
        0,
        "nothing may be created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_with_errors_exits_1_preview_or_apply() {
    crate::needs_tier!(Moto);
    // The DNS zone kprov must adopt does not exist: the plan has an error.
    every_update_refused(
        "gate.no-such-zone-kprov.test",
        "us-east-1a",
        &[
            "--image",
            "099720109477/ubuntu/images/hvm-ssd/ubuntu-xenial-16.04-amd64-server-*",
        ],
        &[
            &[],
            &["--exit-code"],
            &["--exit-code", "-o", "json"],
            &["--yes"],
        ],
        |err| err.contains("DnsZone/main: must already exist") && err.contains("cannot be applied"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_ec2_does_not_have_is_refused_before_anything_is_created() {
    crate::needs_tier!(Moto);
    // Syntax alone cannot tell: us-east-1z looks like a zone of us-east-1.
    every_update_refused(
        "zonetypo.k8s.local",
        "us-east-1a,us-east-1z",
        &[],
        &[&[], &["--exit-code"], &["--yes"]],
        |err| {
            err.contains("availability zone us-east-1z does not exist in us-east-1")
                && err.contains("us-east-1a, us-east-1b")
        },
    )
    .await;
}

#[test]
fn a_refused_create_writes_nothing_and_says_how_to_fix_it() {
    let env = Env::new().with_moto();
    let create = |extra: &[&str]| {
        let mut args = vec!["create", "cluster", "r.example.com", "--cloud", "aws"];
        args.extend_from_slice(extra);
        env.bare(&args).output().expect("runs")
    };
    // No flag and no ~/.ssh/id_*.pub (HOME is empty).
    let o = create(&["--zones", "us-east-1a"]);
    let err = code(&o, 3);
    assert!(
        err.contains("--ssh-public-key") && err.contains("ssh-keygen -t ed25519"),
        "{}",
        out(&o)
    );
    assert!(!env.state().exists(), "a refused create wrote to the store");
    // Zones of two regions.
    let o = create(&["--zones", "us-east-1a,eu-west-1b", "--ssh-public-key", KEY]);
    let err = code(&o, 3);
    assert!(err.contains("one region"), "{}", out(&o));
    assert!(!env.state().exists(), "a refused create wrote to the store");

    // A cluster that exists: exit 4 (conflict), and the store is left as it was.
    code(
        &create(&["--zones", "us-east-1a", "--ssh-public-key", KEY]),
        0,
    );
    let before = snapshot_with_dirs(&env.state());
    let o = create(&["--zones", "us-east-1b", "--ssh-public-key", KEY]);
    let err = code(&o, 4);
    assert!(err.contains("already exists"), "{}", out(&o));
    assert_eq!(
        snapshot_with_dirs(&env.state()),
        before,
        "a refused create changed the store"
    );
}

#[test]
fn sdk_errors_show_the_service_code_and_message() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    let mut c = env.bare(&["get", "clusters"]);
    for (k, v) in moto().env() {
        c.env(k, v);
    }
    let o = c
        .env("KPROV_STATE_STORE", "s3://kprov-no-such-bucket-4711/state")
        .output()
        .expect("runs");
    let err = code(&o, 1);
    assert!(
        err.contains("NoSuchBucket") && err.contains("kprov-no-such-bucket-4711"),
        "{}",
        out(&o)
    );
    no_debug_dump(&err);
}

#[test]
fn missing_credentials_say_which_chain_was_tried() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    let aws_env = |c: &mut Command| {
        // Nothing may leave loopback: the endpoint is moto's, IMDS is off.
        c.env("AWS_ENDPOINT_URL", &moto().env()[0].1)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_MAX_ATTEMPTS", "1")
            .env("AWS_EC2_METADATA_DISABLED", "true");
    };
    let mut c = env.bare(&["get", "clusters"]);
    aws_env(&mut c);
    let o = c
        .env("KPROV_STATE_STORE", "s3://kprov-creds-4711/state")
        .output()
        .expect("runs");
    let mut errs = vec![code(&o, 1)];

    let mut c = env.bare(&create_aws_in("creds.k8s.local", "us-east-1a"));
    code(&c.output().expect("runs"), 0);
    c = env.bare(&["update", "cluster", "creds.k8s.local"]);
    aws_env(&mut c);
    errs.push(code(&c.output().expect("runs"), 1));
    for err in errs {
        assert!(
            err.contains("no AWS credentials found")
                && err.contains("AWS_ACCESS_KEY_ID")
                && err.contains("profile \"default\"")
                && err.contains(&format!("{}/.aws/credentials", env.dir.path().display()))
                && err.contains("SSO")
                && err.contains("IMDS"),
            "{err}"
        );
        no_debug_dump(&err);
    }
}
