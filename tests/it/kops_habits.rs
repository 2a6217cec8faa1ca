//! kops habits through the binary: `--name` and `KPROV_NAME` for the cluster, a warning when
//! only `KOPS_STATE_STORE` is set, `kprov version`, and `get secrets` (names and digests,
//! never values).

use crate::support::cli::Env;
use crate::support::cli::create_metal;
use crate::support::cli::{fails, ok, says, text};

const KEY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/id_ed25519.pub");
const NAME: &str = "habits.example.com";

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
    crate::needs_tier!(Moto);
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
    let o = env.run_with(
        &["get", "clusters"],
        &[("KOPS_STATE_STORE", "s3://kops-bucket")],
    );
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
    crate::needs_tier!(Moto);
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

const HA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/inventories/kprov-ha.yaml");

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}):\n{s}"))
}

/// `-o json` of `create --dry-run` and of `get cluster NAME` is what `create -f` takes back,
/// object for object (kubectl's habit: `get -o json > f; create -f f`).
#[test]
fn json_of_get_and_of_a_dry_run_is_accepted_by_create_f() {
    crate::needs_tier!(Moto);
    let env = Env::new();
    let dry = ok(&env.run(
        &[
            &create_metal("lab.internal", HA)[..],
            &["--dry-run", "-o", "json"],
        ]
        .concat(),
    ));
    let file = env.path("dry.json");
    std::fs::write(&file, &dry).expect("write");
    let o = env.run(&["create", "-f", file.to_str().expect("utf-8")]);
    ok(&o);
    assert!(
        text(&o.stderr).contains("with 2 instance groups"),
        "{}",
        text(&o.stderr)
    );
    let got = ok(&env.run(&["get", "cluster", "lab.internal", "-o", "json"]));
    assert_eq!(
        json(&got),
        json(&dry),
        "get -o json differs from the dry run"
    );

    // An AWS cluster's `get -o json`, into another store, comes back the same.
    let aws = created();
    let got = ok(&aws.run(&["get", "cluster", NAME, "-o", "json"]));
    let other = Env::new().with_moto();
    let file = other.path("got.json");
    std::fs::write(&file, &got).expect("write");
    ok(&other.run(&["create", "-f", file.to_str().expect("utf-8")]));
    let again = ok(&other.run(&["get", "cluster", NAME, "-o", "json"]));
    assert_eq!(json(&again), json(&got));

    // A typo in an item is refused at its item's path; nothing is created.
    let third = Env::new();
    let file = third.path("bad.json");
    std::fs::write(&file, dry.replacen("\"role\"", "\"rolle\"", 1)).expect("write");
    let o = third.run(&["create", "-f", file.to_str().expect("utf-8")]);
    fails(&o, 3);
    says(&o, "items[1].spec.rolle");
    assert!(
        text(&third.run(&["get", "clusters"]).stderr).contains("No clusters"),
        "a refused create wrote something"
    );
}

/// On metal the hosts are the machines: `get ig` and `get clusters` count them, whatever
/// `create` wrote when the inventory was first read.
#[test]
fn metal_group_sizes_and_cluster_counts_follow_the_hosts() {
    let env = Env::new();
    let o = env.run(&create_metal("lab.internal", HA));
    ok(&o);
    let row = |out: &str, first: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(first))
            .unwrap_or_else(|| panic!("no {first} row:\n{out}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let clusters = ok(&env.run(&["get", "clusters"]));
    assert_eq!(
        row(&clusters, "lab.internal")[4..],
        ["3", "2"],
        "{clusters}"
    );

    // Two workers more, written straight into the spec (as `update --inventory --yes` does).
    let mut objs = json(&ok(&env.run(&[
        "get",
        "cluster",
        "lab.internal",
        "-o",
        "json",
    ])));
    let hosts = objs["items"][0]["spec"]["hosts"]
        .as_array_mut()
        .expect("hosts");
    for (name, addr) in [("worker3", "198.18.0.16"), ("worker4", "198.18.0.17")] {
        hosts.push(serde_json::json!({"name": name, "address": addr, "roles": ["node"]}));
    }
    let file = env.path("more.json");
    std::fs::write(&file, objs.to_string()).expect("write");
    ok(&env.run(&["replace", "-f", file.to_str().expect("utf-8")]));

    let clusters = ok(&env.run(&["get", "clusters"]));
    assert_eq!(
        row(&clusters, "lab.internal")[4..],
        ["3", "4"],
        "{clusters}"
    );
    let igs = ok(&env.run(&["get", "ig", "lab.internal"]));
    // NAME ROLE MACHINETYPE MIN MAX SUBNETS
    assert_eq!(row(&igs, "nodes")[3..5], ["4", "4"], "{igs}");
    assert_eq!(row(&igs, "control-plane")[3..5], ["3", "3"], "{igs}");
}

/// kops's `create sshpublickey` (and its older `create secret sshpublickey admin --name`): the
/// key lands in the spec in the store (which the key pair and cloud-init are rendered from),
/// `get secrets` shows its fingerprint (ssh-keygen's), and a private key or a damaged line is
/// refused without writing anything or echoing it.
#[test]
fn create_sshpublickey_stores_the_instances_key_shown_by_its_fingerprint() {
    crate::needs_tier!(Moto);
    let env = created();
    let dir = tempfile::tempdir().expect("tmp");
    let new_pub = dir.path().join("new.pub");
    // `ssh-keygen -t ed25519 -C t@x`; `ssh-keygen -l` printed FINGERPRINT.
    let key =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDrsgbU+KqPAyw9r0WAMIPvi7Q1jtYbcYY5+u6MiVLqO t@x";
    const FINGERPRINT: &str = "SHA256:m3sHvu8PwAWFP6Zjv38RrYxg3aQGY+zKGBLbDG+ip14";
    std::fs::write(&new_pub, format!("{key}\n")).expect("key");
    let path = new_pub.to_str().unwrap();

    let o = env.run(&["create", "sshpublickey", "--name", NAME, "-i", path]);
    ok(&o);
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!(
            "Stored the SSH public key of {NAME} ({FINGERPRINT}), replacing SHA256:DXvJ2DVngPn43SGri09dRIlrf8JYJGAyIvnK2qMPkvw"
        )),
        "{err}"
    );
    let spec = ok(&env.run(&["get", "cluster", NAME, "-o", "yaml"]));
    assert!(spec.contains(key), "{spec}");
    let secrets = json(&ok(&env.run(&["get", "secrets", NAME, "-o", "json"])));
    let ssh = secrets["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|i| i["type"] == "sshpublickey")
        .cloned()
        .expect("the key listed");
    assert_eq!(ssh["fingerprint"], FINGERPRINT);
    // The same key again, kops's older form: nothing to change.
    let o = env.run(&[
        "create",
        "secret",
        "sshpublickey",
        "admin",
        "--name",
        NAME,
        "-i",
        path,
    ]);
    ok(&o);
    assert!(
        text(&o.stderr).contains("already has this SSH public key"),
        "{}",
        text(&o.stderr)
    );
    // A private key is refused without a byte of it echoed, and nothing is written.
    let private = dir.path().join("id");
    std::fs::write(
        &private,
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAE\n-----END OPENSSH PRIVATE KEY-----\n",
    )
    .expect("private");
    let refused = |file: &std::path::Path| {
        let o = env.run(&["create", "sshpublickey", NAME, "-i", file.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
        text(&o.stderr)
    };
    let err = refused(&private);
    assert!(err.contains("holds a private key"), "{err}");
    assert!(!err.contains("b3BlbnNz"), "{err}");
    let damaged = dir.path().join("bad.pub");
    std::fs::write(&damaged, key.replace("ssh-ed25519", "ssh-rsa")).expect("bad");
    refused(&damaged);
    assert!(ok(&env.run(&["get", "cluster", NAME, "-o", "yaml"])).contains(key));
}

/// kops's lifecycle phases on metal, through the binary on sshd test hosts and the fake API:
/// `--phase cloud` is refused (a metal cluster has no cloud resources) before any host or the
/// API is contacted; `--phase nodes --yes` provisions the hosts and sends the API nothing;
/// `--phase addons` previews with dry runs only, and with `--yes` applies the add-ons through
/// the API without an SSH login on any host or a command run there.
#[test]
fn metal_phases_each_do_their_part_and_nothing_else() {
    crate::needs_tier!(SshdHosts);
    use crate::metal::Lab;
    use crate::support::fakekube::{FakeKube, node};
    let name = "phases.metal.example.com";
    let lab = Lab::with_control_plane_and_worker(name);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let fake = rt.block_on(FakeKube::start());
    fake.put(node("host1", true, true, false, None));
    fake.put(node("host2", false, true, false, None));
    let kc = fake.kubeconfig.display().to_string();
    let logins = || -> Vec<usize> {
        ["host1", "host2"]
            .iter()
            .map(|h| lab.host(h).log().matches("Accepted publickey").count())
            .collect()
    };
    let calls = || -> Vec<usize> {
        ["host1", "host2"]
            .iter()
            .map(|h| lab.calls(h).len())
            .collect()
    };
    let update = |extra: &[&str]| {
        let mut args = vec!["update", "cluster", name, "--kubeconfig", &kc];
        args.extend_from_slice(extra);
        lab.kprov(&args)
    };

    // 1. cloud: refused, nothing contacted.
    let before = logins();
    let o = update(&["--yes", "--phase", "cloud"]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr)
            .contains("a metal cluster has no cloud resources; its phases are nodes and addons"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(logins(), before);
    assert!(fake.requests().is_empty(), "{:?}", fake.requests());

    // 2. nodes: the hosts provisioned, the API sent nothing.
    let o = update(&["--yes", "--phase", "nodes", "--accept-new-host-keys"]);
    let err = text(&o.stderr);
    ok(&o);
    assert!(
        err.contains(&format!(
            "--phase nodes: add-ons and kube-system's node configuration left alone; next: `kprov update cluster {name} --yes --phase addons`."
        )),
        "{err}"
    );
    assert!(
        lab.kubeadm_calls("host1")
            .iter()
            .any(|(_, c)| c.starts_with("kubeadm init")),
        "{err}"
    );
    assert!(
        lab.kubeadm_calls("host2")
            .iter()
            .any(|(_, c)| c.starts_with("kubeadm join")),
        "{err}"
    );
    assert!(
        logins().iter().all(|n| *n > 0),
        "sshd logs no login: {:?}",
        logins()
    );
    assert!(fake.requests().is_empty(), "{:?}", fake.requests());

    // 3. addons: the preview dry-runs, --yes applies; no host is contacted by either.
    let (before, ran) = (logins(), calls());
    let o = update(&["--phase", "addons"]);
    let preview = ok(&o);
    assert!(
        preview.contains("DaemonSet kube-system/calico-node"),
        "{preview}"
    );
    fake.assert_no_writes();
    assert!(
        fake.get("DaemonSet", Some("kube-system"), "calico-node")
            .is_none()
    );
    let o = update(&["--yes", "--phase", "addons"]);
    ok(&o);
    assert!(
        fake.get("DaemonSet", Some("kube-system"), "calico-node")
            .is_some(),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(logins(), before, "an SSH login during --phase addons");
    assert_eq!(
        calls(),
        ran,
        "a command ran on a host during --phase addons"
    );
}
