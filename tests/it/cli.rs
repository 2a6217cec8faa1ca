//! The command line end to end, as a user runs it: the real binary against real stores.

use std::path::Path;

use crate::support::cli::Env;
use crate::support::cli::{KEY, create_aws_in, create_metal};
use crate::support::cli::{fails, holds_all, ok, text};
use crate::support::moto::moto;

/// `create cluster NAME --cloud aws --zones ZONES EXTRA.. --dry-run -o yaml`'s output.
fn dry_run_aws(env: &Env, name: &str, zones: &str, extra: &[&str]) -> String {
    dry_run(env, &[&create_aws_in(name, zones)[..], extra].concat())
}

/// `create cluster lab.internal --cloud metal --inventory INVENTORY --ssh-public-key KEY`.
fn metal_keyed(inventory: &str) -> Vec<&str> {
    [
        &create_metal("lab.internal", inventory)[..],
        &["--ssh-public-key", KEY],
    ]
    .concat()
}

/// `create`, a whole `create cluster` command line, with `--dry-run -o yaml`: its output.
fn dry_run(env: &Env, create: &[&str]) -> String {
    ok(&env.run(&[create, &["--dry-run", "-o", "yaml"]].concat()))
}

#[test]
fn dry_run_golden_minimal_aws() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    insta::assert_snapshot!(dry_run_aws(&env, "minimal.example.com", "us-east-1a", &[]));
    assert!(!env.path("state").exists(), "--dry-run must write nothing");
}

#[test]
fn dry_run_golden_ha_private() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    insta::assert_snapshot!(dry_run_aws(
        &env,
        "ha.example.com",
        "eu-west-1a,eu-west-1b,eu-west-1c",
        &[
            "--control-plane-count",
            "3",
            "--topology",
            "private",
            "--bastion",
            "--node-count",
            "5",
            "--node-size",
            "m6i.large",
            "--networking",
            "cilium"
        ],
    ));
}

#[test]
fn dry_run_golden_metal_from_kubespray_inventory() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    let inv = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/inventories/kubespray-hosts.yaml"
    );
    insta::assert_snapshot!(dry_run(
        &env,
        &[&metal_keyed(inv)[..], &["--kubernetes-version", "1.34.4"]].concat()
    ));
}

#[test]
fn dry_run_says_what_it_understood_from_a_kubespray_inventory_directory() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kubespray/corpus/mycluster"
    );
    let o = env.run(&[&metal_keyed(dir)[..], &["--dry-run", "-o", "yaml"]].concat());
    let out = ok(&o);
    let err = text(&o.stderr);
    for want in [
        "kubernetesVersion: \"1.35.1\"",
        "cni: cilium",
        "podCIDR: 10.244.0.0/16",
        "serviceCIDR: 10.96.0.0/16",
        "additionalSANs:",
        "name: node3",
    ] {
        assert!(out.contains(want), "{want}\n{out}");
    }
    for want in [
        "mycluster/hosts.yaml (KubesprayYaml): 4 host(s)",
        "node3 (line 10): roles control-plane,etcd, address 198.18.10.3, ip 10.0.0.3, user \
         from-host-vars, port 2203, key ~/.ssh/cluster_key",
        "etcd: stacked",
        "-> spec.networking.podCIDR = 10.244.0.0/16",
        "2 inventory variable(s) not used by kprov",
        "group_vars/all/all.yml:5",
    ] {
        assert!(err.contains(want), "{want}\n{err}");
    }
    assert!(!env.path("state").exists(), "a dry run writes nothing");
}

#[test]
fn invalid_inventories_exit_3_name_file_and_line_and_store_nothing() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    let real = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/kubespray/real");
    // An even etcd group (etcd beside other roles is fine, quorum is not): refused at its lines.
    let even = env.path("even.ini");
    std::fs::write(
        &even,
        "[all]\nn1 ansible_host=198.18.0.1\nn2 ansible_host=198.18.0.2\nn3 ansible_host=198.18.0.3\n\
         n4 ansible_host=198.18.0.4\n[kube_control_plane]\nn1\nn2\n[etcd]\nn1\nn2\nn3\nn4\n\
         [kube_node]\nn3\nn4\n",
    )
    .unwrap();
    let err = fails(&env.run(&metal_keyed(even.to_str().unwrap())), 3);
    assert!(err.contains(&format!("{}:", even.display())), "{err}");
    assert!(
        err.contains("external etcd runs on the etcd hosts and there are 4: n1 (line"),
        "{err}"
    );
    let commented = format!("{real}/01-sample-inventory-HEAD.ini");
    let err = fails(&env.run(&metal_keyed(&commented)), 3);
    assert!(err.contains("the inventory lists no hosts"), "{err}");
    // A host problem found by spec validation points at the host's line, not "command line".
    let ini = env.path("inventory.ini");
    std::fs::write(
        &ini,
        "[all]\ncp1 ansible_host=198.18.0.1 ip=10.244.0.5\n[kube_control_plane]\ncp1\n\
         [all:vars]\nkube_pods_subnet=10.244.0.0/16\n",
    )
    .unwrap();
    let err = fails(&env.run(&metal_keyed(ini.to_str().unwrap())), 3);
    assert!(
        err.contains(&format!("{}:2:1: spec.hosts[0]", ini.display())),
        "{err}"
    );
    assert!(!err.contains("command line"), "{err}");
    assert!(
        !env.path("state").exists(),
        "a refused create writes nothing"
    );
}

#[test]
fn dry_run_output_is_accepted_by_create_f() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    let yaml = dry_run_aws(
        &env,
        "round.example.com",
        "us-east-1a,us-east-1b",
        &["--topology", "private"],
    );
    std::fs::write(env.path("c.yaml"), &yaml).unwrap();
    ok(&env.run(&["create", "-f", env.path("c.yaml").to_str().unwrap()]));
    let back = ok(&env.run(&["get", "cluster", "round.example.com", "-o", "yaml"]));
    assert_eq!(
        back, yaml,
        "stored objects must read back exactly as written"
    );
}

#[test]
fn invalid_flags_are_refused_without_writing() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    // (the flags after `--cloud aws --zones`, what the refusal says), each exit 3.
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "us-east-1a",
                "--control-plane-count",
                "2",
                "--ssh-public-key",
                KEY,
            ],
            "2 control-plane members with stacked etcd",
        ),
        (
            &["mars-1a"],
            "--zones: \"mars-1a\" is not an availability zone",
        ),
        (
            &[
                "us-east-1a",
                "--kubernetes-version",
                "1.19.0",
                "--ssh-public-key",
                KEY,
            ],
            "spec.kubernetesVersion: 1.19.0 is not supported",
        ),
    ];
    for (flags, says) in cases {
        let create = [
            "create",
            "cluster",
            "x.example.com",
            "--cloud",
            "aws",
            "--zones",
        ];
        let err = fails(&env.run(&[&create[..], flags].concat()), 3);
        assert!(err.contains(says), "{flags:?}: {err}");
    }
    assert!(!env.path("state").join("x.example.com").exists());
    // Usage errors have their own code: 2 is reserved for "changes pending".
    fails(&env.run(&["create", "cluster", "--bogus"]), 64);
}

#[test]
fn bad_file_errors_point_at_file_line_and_field() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    let yaml = dry_run_aws(&env, "lines.example.com", "us-east-1a", &[]);
    let bad = yaml
        .replacen("cidr: 172.20.32.0/19", "cidr: 10.1.0.0/24", 1)
        .replacen("minSize: 2", "minSize: 2\n  maxSise: 3", 1);
    let f = env.path("bad.yaml");
    std::fs::write(&f, &bad).unwrap();
    let err = fails(&env.run(&["create", "-f", f.to_str().unwrap()]), 3);
    let line_of = |needle: &str| {
        bad.lines()
            .position(|l| l.contains(needle))
            .map(|i| i + 1)
            .unwrap()
    };
    let want = format!(
        "{}:{}:3: spec.maxSise: unknown field `maxSise`",
        f.display(),
        line_of("maxSise")
    );
    assert!(err.contains(&want), "want {want:?} in\n{err}");
    // Fix the syntax error: the semantic error is then reported at its own line.
    let bad2 = yaml.replacen("cidr: 172.20.32.0/19", "cidr: 10.1.0.0/24", 1);
    std::fs::write(&f, &bad2).unwrap();
    let err = fails(&env.run(&["create", "-f", f.to_str().unwrap()]), 3);
    let want = format!(
        "{}:{}:13: spec.networking.subnets[0].cidr: 10.1.0.0/24 is not inside networkCIDR 172.20.0.0/16",
        f.display(),
        line_of("10.1.0.0/24")
    );
    assert!(err.contains(&want), "want {want:?} in\n{err}");
}

#[test]
fn create_get_replace_delete_lifecycle() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    ok(&env.run(&create_aws_in("life.example.com", "us-east-1a")));
    let err = fails(
        &env.run(&create_aws_in("life.example.com", "us-east-1a")),
        4,
    );
    assert!(err.contains("already exists"), "{err}");
    let table = ok(&env.run(&["get", "clusters"]));
    assert!(
        table.contains("life.example.com   aws     us-east-1a   1.36.4"),
        "{table}"
    );
    let igs = ok(&env.run(&["get", "ig", "--name", "life.example.com"]));
    assert!(
        igs.contains(
            "nodes                      Node           t3.medium     2     2     us-east-1a"
        ),
        "{igs}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&env.run(&["get", "clusters", "-o", "json"]))).unwrap();
    assert_eq!(json["items"][0]["metadata"]["name"], "life.example.com");

    // replace -f: scale the nodes group.
    let yaml = ok(&env.run(&["get", "ig", "life.example.com", "-o", "yaml"]));
    let nodes_doc = yaml
        .split("---\n")
        .find(|d| d.contains("name: nodes"))
        .unwrap()
        .replace("minSize: 2\n  maxSize: 2", "minSize: 3\n  maxSize: 6");
    std::fs::write(env.path("nodes.yaml"), &nodes_doc).unwrap();
    ok(&env.run(&["replace", "-f", env.path("nodes.yaml").to_str().unwrap()]));
    let igs = ok(&env.run(&["get", "ig", "life.example.com"]));
    assert!(igs.contains("3     6"), "{igs}");
    let completed =
        std::fs::read_to_string(env.path("state/life.example.com/cluster-completed.spec")).unwrap();
    assert!(
        completed.contains("maxSize: 6") && completed.contains("region: us-east-1"),
        "{completed}"
    );

    // Delete previews without --yes, then deletes.
    let preview = ok(&env.run(&["delete", "cluster", "life.example.com"]));
    assert!(preview.contains("life.example.com/config"), "{preview}");
    assert!(env.path("state/life.example.com/config").exists());
    ok(&env.run(&["delete", "cluster", "life.example.com", "--yes"]));
    assert!(!env.path("state/life.example.com/config").exists());
    let err = fails(&env.run(&["get", "cluster", "life.example.com"]), 1);
    assert!(err.contains("not found"), "{err}");
}

/// An editor script: applies a sed expression to the file it is given.
fn sed_editor(env: &Env, name: &str, expr: &str) -> String {
    let p = env.path(name);
    std::fs::write(&p, format!("#!/bin/sh\nsed -i '{expr}' \"$1\"\n")).unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p.display().to_string()
}

#[test]
fn edit_saves_valid_changes_and_never_saves_invalid_ones() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    ok(&env.run(&create_aws_in("edit.example.com", "us-east-1a")));
    let config = env.path("state/edit.example.com/config");
    let before = std::fs::read_to_string(&config).unwrap();

    let good = sed_editor(&env, "good.sh", "s/cni: calico/cni: cilium/");
    ok(&env
        .cmd(&[])
        .env("EDITOR", &good)
        .args(["edit", "cluster", "edit.example.com"])
        .output()
        .unwrap());
    let after = std::fs::read_to_string(&config).unwrap();
    assert!(
        after.contains("cni: cilium") && !after.contains("cni: calico"),
        "{after}"
    );

    let bad = sed_editor(
        &env,
        "bad.sh",
        "s/podCIDR: 100.96.0.0\\/11/podCIDR: 172.20.0.0\\/24/",
    );
    let err = fails(
        &env.cmd(&[])
            .env("EDITOR", &bad)
            .args(["edit", "cluster", "edit.example.com"])
            .output()
            .unwrap(),
        3,
    );
    assert!(err.contains("overlaps networkCIDR"), "{err}");
    assert!(err.contains("nothing was saved"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        after,
        "an invalid edit must not be saved"
    );
    assert_ne!(before, after);

    let ig = sed_editor(&env, "ig.sh", "s/maxSize: 2/maxSize: 4/");
    ok(&env
        .cmd(&[])
        .env("EDITOR", &ig)
        .args(["edit", "ig", "--name", "edit.example.com", "nodes"])
        .output()
        .unwrap());
    assert!(
        std::fs::read_to_string(env.path("state/edit.example.com/instancegroup/nodes"))
            .unwrap()
            .contains("maxSize: 4")
    );
}

#[test]
fn edit_racing_another_writer_keeps_the_users_copy() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    ok(&env.run(&create_aws_in("race.example.com", "us-east-1a")));
    // The "editor" itself changes the stored spec behind kprov's back (another operator
    // saving while this one edits), then makes its own change.
    let other = env.path("other.yaml");
    let yaml = ok(&env.run(&["get", "cluster", "race.example.com", "-o", "yaml"]));
    let cluster_doc = yaml
        .split("---\n")
        .next()
        .unwrap()
        .replace("cni: calico", "cni: flannel");
    std::fs::write(&other, cluster_doc).unwrap();
    let bin = assert_cmd::cargo::cargo_bin("kprov");
    let script = env.path("racing.sh");
    std::fs::write(&script, format!("#!/bin/sh\n{} replace -f {} >/dev/null 2>&1 || exit 9\nsed -i 's/cni: calico/cni: cilium/' \"$1\"\n", bin.display(), other.display())).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let err = fails(
        &env.cmd(&[])
            .env("EDITOR", &script)
            .args(["edit", "cluster", "race.example.com"])
            .output()
            .unwrap(),
        4,
    );
    assert!(
        err.contains("changed by someone else while you were editing"),
        "{err}"
    );
    let kept = err
        .split("kept at ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .map(|s| s.trim_end_matches(':').to_string())
        .expect("path of kept copy");
    let kept_text = std::fs::read_to_string(Path::new(&kept)).expect("kept copy exists");
    assert!(kept_text.contains("cni: cilium"), "{kept_text}");
    let stored = std::fs::read_to_string(env.path("state/race.example.com/config")).unwrap();
    assert!(
        stored.contains("cni: flannel"),
        "the other operator's update must survive: {stored}"
    );
    let _ = std::fs::remove_file(kept);
}

#[test]
fn locked_cluster_refuses_writers_and_lock_break_clears_it() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    ok(&env.run(&create_aws_in("locked.example.com", "us-east-1a")));
    // A lock left by a crashed process on another host.
    let lock = serde_json::json!({
        "holder": "alice", "host": "ops-box", "pid": 4242, "command": "update cluster",
        "acquiredAt": "2026-01-01T00:00:00Z", "renewedAt": "2026-01-01T00:00:00Z",
        "expiresAt": "2999-01-01T00:00:00Z", "id": "0123456789abcdef0123456789abcdef"
    });
    std::fs::write(env.path("state/locked.example.com/lock"), lock.to_string()).unwrap();
    let status = ok(&env.run(&["lock", "status", "locked.example.com"]));
    assert!(status.contains("alice"), "{status}");
    let err = fails(
        &env.run(&["delete", "cluster", "locked.example.com", "--yes"]),
        4,
    );
    assert!(
        err.contains("locked by alice@ops-box")
            && err.contains("kprov lock break locked.example.com"),
        "{err}"
    );
    assert!(env.path("state/locked.example.com/config").exists());
    ok(&env.run(&["lock", "break", "locked.example.com"]));
    ok(&env.run(&["delete", "cluster", "locked.example.com", "--yes"]));
}

#[test]
fn s3_store_end_to_end_against_moto() {
    crate::needs_tier!(Moto);
    let m = moto();
    let bucket = format!("kprov-cli-{}", std::process::id());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        m.create_bucket(&bucket).await;
    });
    let env = Env::with_store(format!("s3://{bucket}/teams/platform")).with_moto();
    let out = env.run(&create_aws_in("s3.example.com", "us-east-1a"));
    ok(&out);
    // moto's GetBucketVersioning reply does not parse in the SDK: a warning, never a failure.
    assert!(
        text(&out.stderr).contains("versioning"),
        "{}",
        text(&out.stderr)
    );
    let table = ok(&env.run(&["get", "clusters"]));
    assert!(table.contains("s3.example.com"), "{table}");
    let keys = rt.block_on(async {
        let r = m
            .s3()
            .await
            .list_objects_v2()
            .bucket(&bucket)
            .prefix("teams/platform/")
            .send()
            .await
            .expect("list");
        r.contents()
            .iter()
            .filter_map(|o| o.key().map(str::to_string))
            .collect::<Vec<_>>()
    });
    assert!(
        keys.contains(&"teams/platform/s3.example.com/config".to_string()),
        "{keys:?}"
    );
    assert!(
        keys.contains(&"teams/platform/s3.example.com/instancegroup/nodes".to_string()),
        "{keys:?}"
    );
    ok(&env.run(&["delete", "cluster", "s3.example.com", "--yes"]));
    assert!(!ok(&env.run(&["get", "clusters"])).contains("s3.example.com"));
}

#[test]
fn schema_describes_both_kinds() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    let schema: serde_json::Value = serde_json::from_str(&ok(&env.run(&["schema"]))).unwrap();
    let one_of = schema["oneOf"].as_array().unwrap();
    assert_eq!(one_of.len(), 2);
    assert_eq!(one_of[0]["properties"]["kind"]["const"], "Cluster");
    assert_eq!(one_of[1]["properties"]["kind"]["const"], "InstanceGroup");
    assert_eq!(
        one_of[0]["additionalProperties"], false,
        "unknown fields must be rejected by editors too"
    );
    let c: serde_json::Value = serde_json::from_str(&ok(&env.run(&["schema", "cluster"]))).unwrap();
    assert!(
        c["$defs"]["ClusterSpec"]["properties"]["kubernetesVersion"].is_object(),
        "{c}"
    );
    // spec.assets.images: archives by URL with a required sha256, no other field.
    assert!(
        c["$defs"]["Assets"]["properties"]["images"].is_object(),
        "{c}"
    );
    let image = &c["$defs"]["ImageArchive"];
    assert_eq!(
        image["required"],
        serde_json::json!(["url", "sha256"]),
        "{c}"
    );
    assert_eq!(image["additionalProperties"], false, "{c}");
}

#[test]
fn completions_and_version() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    assert!(ok(&env.run(&["completion", "bash"])).contains("_kprov"));
    assert!(ok(&env.run(&["--version"])).starts_with("kprov "));
}

#[test]
fn example_specs_are_valid() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    for f in ["minimal-aws.yaml", "ha-private-aws.yaml"] {
        let path = format!("{}/examples/{f}", env!("CARGO_MANIFEST_DIR"));
        ok(&env.run(&["create", "-f", &path]));
    }
    let table = ok(&env.run(&["get", "clusters"]));
    holds_all(
        &table,
        &[
            "demo.example.com",
            "prod.example.com",
            "us-east-1a,us-east-1b,us-east-1c   1.35.1    3",
        ],
    );
}

/// The README's sample store reads back, and its completed specs are what the current
/// defaults produce (a defaults change must refresh them).
#[test]
fn sample_store_is_current() {
    crate::needs_tier!(Moto);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("state");
    let env = Env::new().with_moto();
    let dst = env.path("state");
    std::fs::create_dir_all(&dst).unwrap();
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", src.display()))
        .arg(&dst)
        .status()
        .unwrap();
    assert!(cp.success());
    let table = ok(&env.run(&["get", "clusters"]));
    assert!(
        table.contains("demo.example.com") && table.contains("lab.internal"),
        "{table}"
    );
    for name in ["demo.example.com", "lab.internal"] {
        let full = ok(&env.run(&["get", "cluster", name, "--full", "-o", "yaml"]));
        let stored =
            std::fs::read_to_string(src.join(name).join("cluster-completed.spec")).unwrap();
        assert_eq!(
            full, stored,
            "state/{name}/cluster-completed.spec is stale; recreate the sample store (state/README.md)"
        );
    }
}

/// Issue 9: endless or huge inputs end promptly with an error naming the input and the limit
/// (they used to grow to 23 GB or never return).
#[test]
fn endless_inputs_are_refused_promptly() {
    crate::needs_tier!(Moto);
    let env = Env::new().with_moto();
    let inv = concat!(env!("CARGO_MANIFEST_DIR"), "/inventories/kprov-single.yaml");
    let cases: [(&[&str], &str); 3] = [
        (
            &metal_keyed("/dev/zero"),
            "inventory /dev/zero is larger than the limit of 4 MiB",
        ),
        (
            &["create", "-f", "/dev/urandom"],
            "/dev/urandom is larger than the limit of 4 MiB",
        ),
        (
            &[
                &create_metal("lab.internal", inv)[..],
                &["--ssh-public-key", "/dev/zero"],
            ]
            .concat(),
            "/dev/zero is larger than the limit of 64 KiB",
        ),
    ];
    for (args, want) in cases {
        let start = std::time::Instant::now();
        // Before the fix these grew without end or never returned: fail, not hang.
        let o = assert_cmd::Command::from_std(env.cmd(args))
            .timeout(std::time::Duration::from_secs(30))
            .output()
            .expect("runs");
        let took = start.elapsed();
        assert!(!o.status.success(), "{args:?} succeeded");
        let err = text(&o.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            took < std::time::Duration::from_secs(20),
            "{args:?} took {took:?}"
        );
    }
    assert!(
        !env.path("state").exists(),
        "a refused create wrote to the store"
    );
}

#[test]
fn an_unusable_default_ssh_key_is_skipped_with_a_warning_naming_it() {
    let env = Env::new();
    let ssh = env.path(".ssh");
    std::fs::create_dir_all(&ssh).unwrap();
    // Too large to be a public key; the next default is used, and the skip is said.
    std::fs::write(ssh.join("id_ed25519.pub"), "x".repeat(70 * 1024)).unwrap();
    let rsa = std::fs::read_to_string(KEY).unwrap();
    std::fs::write(ssh.join("id_rsa.pub"), &rsa).unwrap();
    let create = [
        "create",
        "cluster",
        "keys.example.com",
        "--cloud",
        "aws",
        "--zones",
        "eu-west-1a",
        "--dry-run",
        "-o",
        "yaml",
    ];
    let o = env.run(&create);
    let out = ok(&o);
    let err = text(&o.stderr);
    let skipped = format!("{}/id_ed25519.pub", ssh.display());
    assert!(
        err.contains("skipped a default SSH public key")
            && err.contains(&skipped)
            && err.contains("larger than the limit of 64 KiB"),
        "{err}"
    );
    assert!(
        out.contains(rsa.split_whitespace().nth(1).unwrap()),
        "{out}"
    );

    // Neither is usable (a directory, an empty file): both named, then the refusal.
    std::fs::remove_file(ssh.join("id_ed25519.pub")).unwrap();
    std::fs::create_dir(ssh.join("id_ed25519.pub")).unwrap();
    std::fs::write(ssh.join("id_rsa.pub"), "\n").unwrap();
    let err = fails(&env.run(&create), 3);
    assert!(
        err.contains(&skipped) && err.contains("cannot read"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "skipped the SSH public key {}/id_rsa.pub: it is empty",
            ssh.display()
        )),
        "{err}"
    );
    assert!(err.contains("no SSH public key"), "{err}");

    // Absent keys are not worth a warning.
    std::fs::remove_dir(ssh.join("id_ed25519.pub")).unwrap();
    std::fs::remove_file(ssh.join("id_rsa.pub")).unwrap();
    let err = fails(&env.run(&create), 3);
    assert!(!err.contains("skipped"), "{err}");
}

/// `backup etcd` and `restore etcd` resolve the stored cluster as every other command does
/// (completed and validated): a stored spec that is no longer valid is refused with the same
/// located problem as `get certificates`, exit 3, before any host is contacted.
#[test]
fn etcd_commands_refuse_a_stored_spec_that_is_no_longer_valid_as_other_commands_do() {
    let env = Env::new();
    let name = "ha.example.com";
    let inv = concat!(env!("CARGO_MANIFEST_DIR"), "/inventories/kprov-ha.yaml");
    ok(&env.run(&create_metal(name, inv)));
    // Valid: resolution lets the command through, to the hosts (whose keys nobody recorded).
    let err = fails(&env.run(&["backup", "etcd", name]), 1);
    assert!(err.contains("unknown host key"), "{err}");
    // Another writer of the store leaves two stacked control planes, which `create` refuses.
    let config = env.state().join(name).join("config");
    let text = std::fs::read_to_string(&config).unwrap();
    let cp3 = "  - name: cp3\n    address: \"198.18.0.13\"\n    user: root\n    roles:\n    \
               - control-plane\n    - etcd\n";
    assert!(text.contains(cp3), "{text}");
    std::fs::write(&config, text.replace(cp3, "")).unwrap();
    let refusal = fails(&env.run(&["get", "certificates", name]), 3);
    assert!(
        refusal.contains(&format!(
            "{}:13:5: spec.hosts: 2 control-plane members",
            config.display()
        )) && refusal.contains("use an odd number"),
        "{refusal}"
    );
    for args in [
        vec!["backup", "etcd", name],
        vec!["restore", "etcd", name, "--from", "20260101T000000Z"],
    ] {
        let err = fails(&env.run(&args), 3);
        assert_eq!(err, refusal, "{args:?}");
        assert!(!err.contains("host key"), "{err}");
    }
}

/// A KPROV_LOG that does not parse is a usage error naming it, not silently the default.
#[test]
fn an_invalid_kprov_log_filter_is_refused() {
    let env = Env::new();
    let o = env.run_with(&["get", "clusters"], &[("KPROV_LOG", "kprov=loud")]);
    let err = fails(&o, 64);
    assert!(
        err.contains("KPROV_LOG=\"kprov=loud\" is not a log filter"),
        "{err}"
    );
    let o = env.run_with(&["get", "clusters"], &[("KPROV_LOG", "kprov=debug")]);
    ok(&o);
}

/// A Kubernetes patch release newer than kprov's table (issue 18): `create -f` reads the
/// release's published `.sha256` files from the spec's mirror (laid out like dl.k8s.io; never
/// the internet here) and pins them in `spec.assets.checksums`, which `get cluster` shows and
/// every later run uses. A checksum file the mirror lacks refuses the create naming its URL,
/// and nothing is stored.
#[test]
fn a_newer_patch_release_is_pinned_from_its_published_checksums_at_create() {
    crate::needs_tier!(Moto);
    use crate::support::mirror::Mirror;
    use kprov::spec::assets::{self, Arch, Component};
    const NEWER: &str = "1.36.97";
    let env = Env::new().with_moto();
    let mirror = Mirror::start(std::net::Ipv4Addr::LOCALHOST.into(), NEWER);
    let mut expected = Vec::new();
    for c in [Component::Kubeadm, Component::Kubelet, Component::Kubectl] {
        for a in Arch::ALL {
            let upstream = assets::upstream_url(c, NEWER, a);
            let rel = upstream.strip_prefix("https://").unwrap();
            let bin = mirror.root().join(rel);
            let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
                std::fs::read(&bin).unwrap(),
            ));
            // dl.k8s.io publishes the bare digest.
            std::fs::write(format!("{}.sha256", bin.display()), &sha).unwrap();
            expected.push((format!("{}/{}", c.name(), a.as_str()), sha));
        }
    }
    let yaml = dry_run_aws(&env, "newer.example.com", "us-east-1a", &[]);
    let version_line = yaml
        .lines()
        .find(|l| l.trim_start().starts_with("kubernetesVersion:"))
        .expect("a version line")
        .to_string();
    let indent = &version_line[..version_line.len() - version_line.trim_start().len()];
    let edited = yaml.replace(
        &version_line,
        &format!(
            "{indent}kubernetesVersion: {NEWER}\n{indent}assets:\n{indent}  mirror: {}",
            mirror.url
        ),
    );

    // First without one checksum file: refused, naming it; nothing stored.
    let gone = mirror
        .root()
        .join("dl.k8s.io/release/v1.36.97/bin/linux/arm64/kubectl.sha256");
    let kept = std::fs::read(&gone).unwrap();
    std::fs::remove_file(&gone).unwrap();
    std::fs::write(env.path("c.yaml"), &edited).unwrap();
    let err = fails(
        &env.run(&["create", "-f", env.path("c.yaml").to_str().unwrap()]),
        1,
    );
    assert!(
        err.contains("cannot pin the checksums of Kubernetes 1.36.97")
            && err.contains("/dl.k8s.io/release/v1.36.97/bin/linux/arm64/kubectl.sha256"),
        "{err}"
    );
    let listed = ok(&env.run(&["get", "clusters"]));
    assert!(!listed.contains("newer.example.com"), "{listed}");

    // With every file: pinned, shown, and the spec validates with them.
    std::fs::write(&gone, kept).unwrap();
    let created = env.run(&["create", "-f", env.path("c.yaml").to_str().unwrap()]);
    ok(&created);
    let said = text(&created.stderr);
    assert!(said.contains("pinned kubeadm/amd64 1.36.97"), "{said}");
    let back = ok(&env.run(&["get", "cluster", "newer.example.com", "-o", "yaml"]));
    for (name, sha) in &expected {
        assert!(
            back.contains(&format!("name: {name}")) && back.contains(sha.as_str()),
            "{name} {sha} missing from\n{back}"
        );
    }
    let assets_out = ok(&env.run(&["get", "assets", "newer.example.com", "-o", "json"]));
    assert!(assets_out.contains(&expected[0].1), "{assets_out}");
}
