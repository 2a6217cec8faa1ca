//! kops habits through the binary: `--name` and `KPROV_NAME` for the cluster, a warning when
//! only `KOPS_STATE_STORE` is set, `kprov version`, and `get secrets` (names and digests,
//! never values).

use crate::support::cli::Env;

const KEY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/id_ed25519.pub");
const NAME: &str = "habits.example.com";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn ok(o: &std::process::Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stdout)
}

fn created() -> Env {
    let env = Env::new().with_moto();
    ok(&env.run(&[
        "create",
        "cluster",
        "--name",
        NAME,
        "--cloud",
        "aws",
        "--zones",
        "us-east-1a",
        "--ssh-public-key",
        KEY,
    ]));
    env
}

#[test]
fn name_and_kprov_name_reach_every_command_that_takes_a_cluster() {
    let env = created();
    // --name where kprov takes the cluster as its first argument.
    let status = ok(&env.run(&["lock", "status", "--name", NAME]));
    assert!(status.contains("is not locked"), "{status}");
    let shown = ok(&env.run(&["get", "cluster", "--name", NAME, "-o", "yaml"]));
    assert!(shown.contains(&format!("name: {NAME}")), "{shown}");
    // KPROV_NAME when the command line names none.
    let o = env
        .cmd(&["lock", "status"])
        .env("KPROV_NAME", NAME)
        .output()
        .expect("runs");
    assert!(ok(&o).contains("is not locked"));
    // The command line wins over KPROV_NAME.
    let o = env
        .cmd(&["lock", "status", NAME])
        .env("KPROV_NAME", "other.example.com")
        .output()
        .expect("runs");
    assert!(ok(&o).contains(NAME));
    // Neither: the usage error names the argument.
    let o = env.run(&["lock", "status"]);
    assert_eq!(o.status.code(), Some(64), "{}", text(&o.stderr));
}

#[test]
fn kops_state_store_alone_is_named_with_the_store_used_instead() {
    let env = Env::new();
    let o = env
        .bare(&["get", "clusters"])
        .env_remove("KPROV_STATE_STORE")
        .env("KOPS_STATE_STORE", "s3://kops-bucket")
        .output()
        .expect("runs");
    let err = text(&o.stderr);
    assert!(
        err.contains("KOPS_STATE_STORE is set (s3://kops-bucket) but kprov reads KPROV_STATE_STORE or --state: using file://"),
        "{err}"
    );
    // With kprov's own store set, no warning.
    let o = env
        .cmd(&["get", "clusters"])
        .env("KOPS_STATE_STORE", "s3://kops-bucket")
        .output()
        .expect("runs");
    assert!(
        !text(&o.stderr).contains("KOPS_STATE_STORE"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn version_prints_kprovs_version() {
    let env = Env::new();
    let out = ok(&env.run(&["version"]));
    assert_eq!(out.trim(), format!("kprov {}", env!("CARGO_PKG_VERSION")));
    let json: serde_json::Value =
        serde_json::from_str(&ok(&env.run(&["version", "-o", "json"]))).expect("json");
    assert_eq!(json["kprov"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn get_secrets_lists_names_and_digests_never_values() {
    let env = created();
    let dir = env.state().join(NAME).join("secrets");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("admin"), "TOP-SECRET-VALUE").expect("secret");
    let table = ok(&env.run(&["get", "secrets", NAME]));
    assert!(!table.contains("TOP-SECRET-VALUE"), "{table}");
    insta::assert_snapshot!(table);
    let json: serde_json::Value = serde_json::from_str(&ok(
        &env.run(&["get", "secrets", "--name", NAME, "-o", "json"])
    ))
    .expect("json");
    let items = json["items"].as_array().expect("items");
    let admin = items
        .iter()
        .find(|i| i["name"] == "admin")
        .expect("admin listed");
    assert_eq!(admin["bytes"], 16);
    assert!(!json.to_string().contains("TOP-SECRET-VALUE"));
    // A cluster that does not exist is an error, not an empty list.
    let o = env.run(&["get", "secrets", "nope.example.com"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
}
