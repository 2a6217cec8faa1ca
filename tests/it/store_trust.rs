//! The state store is a trust boundary: what it holds must not run code on the operator's
//! machine. Through the real binary, with a tampered store.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::cli::create_metal as metal_args;
use crate::support::cli::{Env, KEY, create_aws, show as out};
use crate::support::fakekube::FakeKube;
use crate::support::snapshot_with_dirs as snapshot;

/// A kubeconfig whose user is an exec plugin that leaves `marker` behind and then hands the
/// client a valid credential, so a client that runs it goes on to talk to `server`.
fn exec_kubeconfig(server: &str, marker: &Path) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n\
         users:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      \
         command: /bin/sh\n      interactiveMode: Never\n      args:\n      - -c\n      - 'touch {}; \
         echo \"{{\\\"apiVersion\\\":\\\"client.authentication.k8s.io/v1\\\",\\\"kind\\\":\\\"ExecCredential\\\",\\\"status\\\":{{\\\"token\\\":\\\"t\\\"}}}}\"'\n\
         contexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
        marker.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_kubeconfig_that_runs_a_command_is_refused() {
    let fake = FakeKube::start().await;
    let name = "tampered.example.com";
    let env = with_aws(name);
    let marker = env.dir.path().join("pwned");
    let secrets = env.state().join(name).join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::write(
        secrets.join("admin.conf"),
        exec_kubeconfig(&format!("http://{}", fake.addr), &marker),
    )
    .unwrap();
    let user_config = env.dir.path().join(".kube/config");
    for args in [
        vec!["validate", "cluster", name],
        vec!["update", "addons", name],
        vec!["update", "addons", name, "--yes"],
        vec!["export", "kubeconfig", name],
    ] {
        let o = env.run_async(&args).await;
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", out(&o));
        assert!(
            err.contains(&format!("{name}/secrets/admin.conf in the state store"))
                && err.contains("users[0].user.exec")
                && err.contains("run a command"),
            "{args:?}: {}",
            out(&o)
        );
        assert!(!marker.exists(), "{args:?} ran the stored exec plugin");
        assert!(
            !user_config.exists(),
            "{args:?} wrote the tampered credentials into the user's kubeconfig"
        );
    }
    assert!(
        fake.requests().is_empty(),
        "nothing may reach the API with tampered credentials"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_own_kubeconfig_may_use_an_exec_plugin() {
    let fake = FakeKube::start().await;
    let name = "own.example.com";
    let env = with_aws(name);
    let marker = env.dir.path().join("plugin-ran");
    let mine = env.dir.path().join("mine.conf");
    std::fs::write(
        &mine,
        exec_kubeconfig(&format!("http://{}", fake.addr), &marker),
    )
    .unwrap();
    let o = env
        .run_async(&[
            "validate",
            "cluster",
            name,
            "--kubeconfig",
            mine.to_str().unwrap(),
        ])
        .await;
    assert!(
        marker.exists(),
        "the user's exec plugin did not run: {}",
        out(&o)
    );
    assert!(!fake.requests().is_empty(), "{}", out(&o));
}

#[test]
fn a_failed_edit_is_kept_private_and_no_symlink_is_followed() {
    use std::os::unix::fs::PermissionsExt;
    let name = "private.example.com";
    let env = with_aws(name);
    let tmp = env.dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let victim = env.dir.path().join("victim");
    std::fs::write(&victim, "untouched").unwrap();
    // Whoever can guess the name plants symlinks for the next seconds; none may be followed.
    let edits = env.dir.path().join(".kprov/edits");
    std::fs::create_dir_all(&edits).unwrap();
    let now = chrono::Utc::now();
    for s in 0..120 {
        let t = now + chrono::Duration::seconds(s);
        let planted = edits.join(format!("{name}-{}.yaml", t.format("%Y%m%dT%H%M%SZ")));
        std::os::unix::fs::symlink(&victim, planted).unwrap();
    }
    // An edit that stays invalid: kprov reopens it once, then gives up and keeps the copy.
    let editor = env.dir.path().join("bad.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\nsed -i 's/podCIDR: 100.96.0.0\\/11/podCIDR: 172.20.0.0\\/24/' \"$1\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&editor, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = env
        .cmd(&["edit", "cluster", name])
        .env("EDITOR", &editor)
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(3), "{}", out(&o));
    let kept = err
        .split("your copy: ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no path of the kept copy in: {err}"));
    assert!(kept.starts_with(&edits), "{}", kept.display());
    let md = std::fs::symlink_metadata(&kept).unwrap();
    assert!(md.file_type().is_file(), "{}", kept.display());
    assert_eq!(md.permissions().mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::metadata(&edits).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert!(
        std::fs::read_to_string(&kept)
            .unwrap()
            .contains("172.20.0.0/24")
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
    // The problems are located in the copy that is kept, never in the deleted temporary file.
    assert!(
        err.contains(&format!("{}:", kept.display())) && !err.contains(tmp.to_str().unwrap()),
        "{err}"
    );
    let in_tmp: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        in_tmp.is_empty(),
        "left in the shared temporary directory: {in_tmp:?}"
    );
}

// ---- What the store holds reaches the terminal escaped (issue 21) ----

/// OSC 52 (writes the operator's clipboard), a clear screen, a forged line of kprov's own.
const OSC52: &str = "mallory\u{1b}]52;c;cm0gLXJmIH4K\u{7}";
const CLEAR: &str = "evil\u{1b}[2J\u{1b}[H";
const FORGED: &str = "kprov\nerror: all nodes were deleted";

/// Nothing the user sees holds a control character but the line breaks between kprov's own
/// lines.
/// A scratch environment with the AWS cluster `name` created in its store.
fn with_aws(name: &str) -> Env {
    let env = Env::new();
    env.create_aws(name);
    env
}

/// How many lines of `o`'s stderr are errors.
fn error_lines(o: &Output) -> usize {
    stderr(o)
        .lines()
        .filter(|l| l.starts_with("error:"))
        .count()
}

/// `o` failed with exit code 1 and printed no control character.
fn assert_failed_cleanly(o: &Output) {
    assert_no_controls(o);
    assert_eq!(o.status.code(), Some(1), "{}", out(o));
}

fn assert_no_controls(o: &Output) {
    for (stream, bytes) in [("stdout", &o.stdout), ("stderr", &o.stderr)] {
        let text = String::from_utf8_lossy(bytes);
        assert!(
            !text
                .chars()
                .any(|c| (c.is_control() && c != '\n') || ('\u{202a}'..='\u{202e}').contains(&c)),
            "a control character reached {stream}: {text:?}"
        );
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn forged_lock() -> String {
    serde_json::json!({
        "holder": OSC52,
        "host": CLEAR,
        "pid": 4242,
        "command": FORGED,
        "acquiredAt": "2026-11-22T21:00:00Z",
        "renewedAt": "2026-11-22T21:00:00Z",
        "expiresAt": "2099-01-01T00:00:00Z",
        "id": "00ff",
    })
    .to_string()
}

#[test]
fn a_forged_lock_is_shown_escaped_in_every_message() {
    let name = "forged.example.com";
    let env = with_aws(name);
    std::fs::write(env.state().join(name).join("lock"), forged_lock()).unwrap();

    let o = env.run(&["delete", "cluster", name, "--yes"]);
    assert_no_controls(&o);
    assert_eq!(o.status.code(), Some(4), "{}", out(&o));
    assert_eq!(
        stderr(&o),
        "error: cluster forged.example.com is locked by mallory\\x1b]52;c;cm0gLXJmIH4K\\x07@\
         evil\\x1b[2J\\x1b[H (pid 4242) running `kprov\\nerror: all nodes were deleted` since \
         2026-11-22T21:00:00Z; the lease runs until 2099-01-01T00:00:00Z. Wait for that command \
         to finish; if it is dead, break the lock with `kprov lock break forged.example.com`\n"
    );

    // `lock status` prints the record as exact JSON: the same values, escaped as JSON escapes.
    let o = env.run(&["lock", "status", name]);
    assert_no_controls(&o);
    assert!(o.status.success(), "{}", out(&o));
    let shown: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(shown["holder"], OSC52);
    assert_eq!(shown["command"], FORGED);
    assert!(
        stdout(&o).contains(r#""holder": "mallory\u001b]52;c;cm0gLXJmIH4K\u0007","#),
        "{}",
        out(&o)
    );

    let o = env.run(&["lock", "break", name]);
    assert_no_controls(&o);
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        stderr(&o).ends_with(
            "broke the lock of cluster forged.example.com held by mallory\\x1b]52;c;cm0gLXJmIH4K\\x07@\
             evil\\x1b[2J\\x1b[H running `kprov\\nerror: all nodes were deleted`\n"
        ),
        "{}",
        out(&o)
    );
    assert_eq!(error_lines(&o), 0, "{}", out(&o));
}

#[test]
fn a_lock_that_is_a_directory_is_reported_and_broken() {
    let name = "dirlock.example.com";
    let env = with_aws(name);
    let lock = env.state().join(name).join("lock");
    std::fs::create_dir_all(lock.join("x")).unwrap();
    std::fs::write(lock.join("x/y"), "planted").unwrap();
    let key = format!("{}/{name}/lock", env.store());

    let o = env.run(&["lock", "status", name]);
    assert_failed_cleanly(&o);
    assert_eq!(
        stderr(&o),
        format!(
            "error: the lock {key} of cluster {name} is a directory, not an object but a prefix of \
             1 other key ({name}/lock/x/y), so no command can take the lock; if no kprov command is \
             running on the cluster, remove it with `kprov lock break {name}`\n"
        )
    );
    // A command that needs the lock says the same, never "is it also a prefix of other keys?".
    let o = env.run(&["delete", "cluster", name, "--yes"]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(
        stderr(&o).contains(&format!("`kprov lock break {name}`")),
        "{}",
        out(&o)
    );

    let o = env.run(&["lock", "break", name]);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(
        stderr(&o).lines().last().unwrap(),
        format!(
            "removed what sat at the lock {key} of cluster {name} (a directory, not an object but \
             a prefix of 1 other key ({name}/lock/x/y); 1 key deleted)"
        )
    );
    assert!(!lock.exists());
    let o = env.run(&["lock", "status", name]);
    assert_eq!(
        stdout(&o),
        format!("cluster {name} is not locked\n"),
        "{}",
        out(&o)
    );
}

#[test]
fn the_store_lock_as_a_directory_is_named_with_the_fix() {
    let env = Env::new();
    env.create_aws("one.example.com");
    let store_lock = env.state().join(".kprov.lock");
    std::fs::remove_file(&store_lock).unwrap();
    std::fs::create_dir(&store_lock).unwrap();
    let o = env.run(&create_aws("two.example.com"));
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let err = stderr(&o);
    let path = store_lock.display();
    assert!(
        err.contains(&format!(
            "{} (store lock): cannot open the store lock file {path}",
            env.store()
        )) && err.contains(&format!(
            "{path} is a directory, not kprov's store lock file"
        )) && err.contains(&format!("`rm -r -- '{path}'`"))
            && !err.contains("two.example.com/lock"),
        "{}",
        out(&o)
    );
}

/// `<name>/config` replaced by a directory holding a key.
fn config_as_directory(env: &Env, name: &str) {
    let config = env.state().join(name).join("config");
    std::fs::remove_file(&config).unwrap();
    std::fs::create_dir(&config).unwrap();
    std::fs::write(config.join("junk"), "planted").unwrap();
}

#[test]
fn a_cluster_whose_config_is_a_directory_is_listed_and_can_be_deleted() {
    let env = Env::new();
    env.create_aws("good.example.com");
    let name = "odd.example.com";
    env.create_aws(name);
    config_as_directory(&env, name);
    let key = format!("{}/{name}/config", env.store());

    let o = env.run(&["get", "clusters"]);
    assert_no_controls(&o);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(
        stdout(&o),
        "NAME               CLOUD        ZONES        VERSION   CONTROL PLANES   NODES\n\
         good.example.com   aws          eu-west-1a   1.36.4    1                2\n\
         odd.example.com    UNREADABLE   -            -         -                -\n"
    );
    let unreadable = format!(
        "cluster {name} cannot be read: {key} is a directory, not an object but a prefix of 1 \
         other key ({name}/config/junk), and 4 objects of the cluster remain under {}/{name}/; \
         `kprov delete cluster {name}` lists them and `kprov delete cluster {name} --yes` \
         removes them",
        env.store()
    );
    assert_eq!(
        stderr(&o),
        format!("warning: cluster {name} is unreadable: {unreadable}\n")
    );
    let o = env.run(&["get", "clusters", name]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert_eq!(stderr(&o), format!("error: {unreadable}\n"));

    let o = env.run(&["delete", "cluster", name]);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(
        stdout(&o),
        format!(
            "Will delete the objects of cluster {name} from {}:\n  {name}/cluster-completed.spec\n  \
             {name}/config/junk\n  {name}/instancegroup/control-plane-eu-west-1a\n  \
             {name}/instancegroup/nodes\n  {name}/config (a directory, not an object \
             but a prefix of 1 other key ({name}/config/junk))\n",
            env.store()
        )
    );
    assert!(env.state().join(name).exists());
    let o = env.run(&["delete", "cluster", name, "--yes"]);
    assert!(o.status.success(), "{}", out(&o));
    assert!(!env.state().join(name).exists(), "{}", out(&o));
    let o = env.run(&["get", "clusters"]);
    assert_eq!(stderr(&o), "", "{}", out(&o));
    assert!(env.state().join("good.example.com/config").exists());
}

#[test]
fn a_refused_create_writes_nothing_to_the_store() {
    let env = Env::new();
    // A group name holding a newline and a forged error line: refused, shown escaped, and on a
    // store that does not exist yet nothing at all is created (not even the store's lock).
    let dump = env.run(
        &[
            &create_aws("x.example.com")[..],
            &["--dry-run", "-o", "yaml"],
        ]
        .concat(),
    );
    assert!(dump.status.success(), "{}", out(&dump));
    let spec = env.path("bad.yaml");
    std::fs::write(
        &spec,
        String::from_utf8_lossy(&dump.stdout)
            .replace("name: nodes\n", "name: \"a\\nerror: forged \\e[2J\"\n"),
    )
    .unwrap();
    let o = env.run(&["create", "-f", spec.to_str().unwrap()]);
    assert_no_controls(&o);
    assert_ne!(o.status.code(), Some(0), "{}", out(&o));
    assert_eq!(error_lines(&o), 1, "{}", out(&o));
    assert!(
        stderr(&o).contains("a\\nerror: forged \\x1b[2J"),
        "{}",
        out(&o)
    );
    assert!(!env.state().exists(), "{}", out(&o));

    // On a store that holds a cluster: an invalid file, an existing cluster, an existing group.
    env.create_aws("held.example.com");
    let before = snapshot(&env.state());
    let dump = env.run(&["get", "clusters", "held.example.com", "-o", "yaml"]);
    assert!(dump.status.success(), "{}", out(&dump));
    let existing = env.path("existing.yaml");
    std::fs::write(&existing, &dump.stdout).unwrap();
    let invalid = env.path("invalid.yaml");
    std::fs::write(
        &invalid,
        String::from_utf8_lossy(&dump.stdout)
            .replace("held.example.com", "new.example.com")
            .replace("100.96.0.0/11", "172.20.0.0/24"),
    )
    .unwrap();
    for file in [&existing, &invalid] {
        let o = env.run(&["create", "-f", file.to_str().unwrap()]);
        assert!(!o.status.success(), "{}", out(&o));
        assert_eq!(snapshot(&env.state()), before, "{}", out(&o));
    }
    let o = env.run(&create_aws("held.example.com"));
    assert_eq!(o.status.code(), Some(4), "{}", out(&o));
    assert_eq!(snapshot(&env.state()), before, "{}", out(&o));
}

/// A good backup record of `name` taken at 2026-11-22T21:35:00Z, and its snapshot.
fn plant_backups(env: &Env, name: &str) {
    let dir = env.state().join(name).join("backups/etcd");
    std::fs::create_dir_all(&dir).unwrap();
    let snapshot = b"snapshot";
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(snapshot))
    };
    let record = |id: &str, key: &str, taken: &str, host: &str| {
        serde_json::json!({
            "id": id, "key": key, "sha256": sha, "size": snapshot.len(), "host": host,
            "takenAt": taken, "etcd": "Stacked",
        })
        .to_string()
    };
    let good = "20261122T213500Z";
    std::fs::write(dir.join(format!("{good}.db")), snapshot).unwrap();
    // Then a record naming a key outside its own, one whose id walks up, one whose time is not
    // one, one whose member is an escape sequence, one that is not JSON.
    let (outside, late, osc) = ("20261122T220000Z", "20261122T230000Z", "20261123T000000Z");
    let key = |id: &str| format!("{name}/backups/etcd/{id}.db");
    for (file, id, key, taken, host) in [
        (good, good, key(good), "2026-11-22T21:35:00Z", "cp1"),
        (
            outside,
            outside,
            format!("{name}/secrets/admin.conf"),
            "2026-11-22T22:00:00Z",
            "cp1",
        ),
        (
            "up",
            "../../../x",
            "../../../x.db".into(),
            "2026-11-22T22:00:00Z",
            "cp1",
        ),
        (late, late, key(late), "yesterday\u{1b}[2J", "cp1"),
        (osc, osc, key(osc), "2026-11-23T00:00:00Z", OSC52),
    ] {
        std::fs::write(
            dir.join(format!("{file}.json")),
            record(id, &key, taken, host),
        )
        .unwrap();
    }
    std::fs::write(dir.join("zz.json"), "\u{1b}]52;c;eA==\u{7}\nerror: forged").unwrap();
}

#[test]
fn backup_records_are_checked_on_read_and_damaged_ones_never_used() {
    let env = Env::new();
    let name = "lab.example.com";
    create_metal(&env, name);
    plant_backups(&env, name);
    let at = |file: &str| format!("{}/{name}/backups/etcd/{file}", env.store());

    let o = env.run(&["get", "backups", name]);
    assert_no_controls(&o);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(
        stdout(&o),
        "SNAPSHOT           TAKEN                  MEMBER   ETCD      SIZE   SHA256\n\
         20261122T213500Z   2026-11-22T21:35:00Z   cp1      Stacked   8      \
         e5a1f3a7d5bfc5fb3ed2e0f4b4ecdd0c26dd78c2a1b9c3da3fd4e2f4c54d6bd2\n\
         20261122T220000Z   DAMAGED                -        -         -      -\n\
         20261122T230000Z   DAMAGED                -        -         -      -\n\
         20261123T000000Z   DAMAGED                -        -         -      -\n\
         up                 DAMAGED                -        -         -      -\n\
         zz                 DAMAGED                -        -         -      -\n"
            .replace(
                "e5a1f3a7d5bfc5fb3ed2e0f4b4ecdd0c26dd78c2a1b9c3da3fd4e2f4c54d6bd2",
                &{
                    use sha2::Digest;
                    hex::encode(sha2::Sha256::digest(b"snapshot"))
                }
            )
    );
    let tail = format!(
        "; it is not a backup kprov can use and `restore etcd` refuses it. If you did not put it \
         there, find out who can write the state store; then `kprov delete damaged {name} --yes` \
         removes it"
    );
    let expected = [
        format!(
            "warning: backup record {} is damaged: it names \"{name}/secrets/admin.conf\", not its \
             own snapshot \"{name}/backups/etcd/20261122T220000Z.db\"{tail}",
            at("20261122T220000Z.json")
        ),
        format!(
            "warning: backup record {} is damaged: takenAt \"yesterday\\x1b[2J\" is not an RFC 3339 \
             time{tail}",
            at("20261122T230000Z.json")
        ),
        format!(
            "warning: backup record {} is damaged: member \"mallory\\x1b]52;c;cm0gLXJmIH4K\\x07\" is \
             not a host name{tail}",
            at("20261123T000000Z.json")
        ),
        format!(
            "warning: backup record {} is damaged: id \"../../../x\" is not a time like \
             20261122T213500Z{tail}",
            at("up.json")
        ),
        format!(
            "warning: backup record {} is damaged: not a backup record: expected value at line 1 \
             column 1{tail}",
            at("zz.json")
        ),
    ];
    assert_eq!(stderr(&o), expected.map(|l| l + "\n").concat());

    // -o json lists the good records only, as exact JSON.
    let o = env.run(&["get", "backups", name, "-o", "json"]);
    let listed: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{}", out(&o));

    // The restore preview shows the good one; a damaged one is refused with its reason.
    let o = env.run(&["restore", "etcd", name, "--from", "20261122T213500Z"]);
    assert_no_controls(&o);
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        stdout(&o).starts_with(&format!(
            "Restore etcd of {name} (Stacked etcd) from snapshot 20261122T213500Z taken \
             2026-11-22T21:35:00Z on cp1 (8 bytes, sha256 "
        )),
        "{}",
        out(&o)
    );
    for (id, reason) in [
        ("20261122T220000Z", "not its own snapshot"),
        (
            "20261123T000000Z",
            "member \"mallory\\x1b]52;c;cm0gLXJmIH4K\\x07\" is not a host name",
        ),
    ] {
        let o = env.run(&["restore", "etcd", name, "--from", id, "--yes"]);
        assert_no_controls(&o);
        assert_eq!(o.status.code(), Some(1), "{}", out(&o));
        assert!(
            stderr(&o).starts_with(&format!(
                "error: backup record {} is damaged (",
                at(&format!("{id}.json"))
            )) && stderr(&o).contains(reason)
                && stderr(&o).ends_with("); refused\n"),
            "{}",
            out(&o)
        );
    }
}

/// A fresh bucket in moto, with a store under its prefix `t`, for the S3 variants.
struct S3Bucket {
    rt: tokio::runtime::Runtime,
    s3: aws_sdk_s3::Client,
    bucket: String,
}

impl S3Bucket {
    fn new() -> S3Bucket {
        use crate::support::moto::moto;
        let rt = tokio::runtime::Runtime::new().unwrap();
        let bucket = format!("kprov-trust-{:016x}", rand::random::<u64>());
        let s3 = rt.block_on(moto().create_bucket(&bucket));
        S3Bucket { rt, s3, bucket }
    }

    fn env(&self) -> Env {
        Env::with_store(format!("s3://{}/t", self.bucket)).with_moto()
    }

    /// Writes `data` at the store key `key` (below the prefix `t`).
    fn put(&self, key: &str, data: &[u8]) {
        self.rt
            .block_on(
                self.s3
                    .put_object()
                    .bucket(&self.bucket)
                    .key(format!("t/{key}"))
                    .body(data.to_vec().into())
                    .send(),
            )
            .expect("put");
    }

    /// The object at the store key `key`, if there is one.
    fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.rt.block_on(async {
            let o = self
                .s3
                .get_object()
                .bucket(&self.bucket)
                .key(format!("t/{key}"))
                .send()
                .await
                .ok()?;
            Some(o.body.collect().await.ok()?.into_bytes().to_vec())
        })
    }
}

#[test]
fn on_s3_a_forged_lock_is_escaped_and_a_cluster_without_its_config_can_be_deleted() {
    crate::needs_tier!(Moto);
    let b = S3Bucket::new();
    let (rt, s3, bucket) = (&b.rt, &b.s3, &b.bucket);
    let put = |key: String, body: String| b.put(&key, body.as_bytes());
    let env = b.env();
    env.create_aws("good.example.com");
    let name = "odd.example.com";
    env.create_aws(name);

    put(format!("{name}/lock"), forged_lock());
    let o = env.run(&["delete", "cluster", name, "--yes"]);
    assert_no_controls(&o);
    assert_eq!(o.status.code(), Some(4), "{}", out(&o));
    assert!(
        stderr(&o).starts_with(&format!(
            "error: cluster {name} is locked by mallory\\x1b]52;c;cm0gLXJmIH4K\\x07@evil\\x1b[2J\\x1b[H \
             (pid 4242) running `kprov\\nerror: all nodes were deleted` since"
        )) && stderr(&o).lines().count() == 1,
        "{}",
        out(&o)
    );
    let o = env.run(&["lock", "break", name]);
    assert!(o.status.success(), "{}", out(&o));

    // The config gone, other objects staying (one of them below where the config was).
    rt.block_on(
        s3.delete_object()
            .bucket(bucket)
            .key(format!("t/{name}/config"))
            .send(),
    )
    .expect("delete");
    put(format!("{name}/config/junk"), "planted".into());
    let o = env.run(&["get", "clusters"]);
    assert_no_controls(&o);
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        stdout(&o).ends_with(
            "odd.example.com    UNREADABLE   -            -         -                -\n"
        ),
        "{}",
        out(&o)
    );
    assert_eq!(
        stderr(&o),
        format!(
            "warning: cluster {name} is unreadable: cluster {name} cannot be read: \
             s3://{bucket}/t/{name}/config is missing, and 4 objects of the cluster remain under \
             s3://{bucket}/t/{name}/; `kprov delete cluster {name}` lists them and `kprov delete \
             cluster {name} --yes` removes them\n"
        )
    );
    let o = env.run(&["delete", "cluster", name, "--yes"]);
    assert!(o.status.success(), "{}", out(&o));
    let left = rt
        .block_on(
            s3.list_objects_v2()
                .bucket(bucket)
                .prefix(format!("t/{name}/"))
                .send(),
        )
        .expect("list");
    assert!(left.contents().is_empty(), "left: {:?}", left.contents());
    let o = env.run(&["get", "clusters"]);
    assert_eq!(stderr(&o), "", "{}", out(&o));
}

// ---- Records checked on read, and the one way out of damaged ones (issue 21) ----

/// Writes an object at a key of the store (relative to the store's root).
type Put<'a> = &'a dyn Fn(&str, &[u8]);

/// The metal cluster the record tests plant into (no host is ever contacted).
fn create_metal(env: &Env, name: &str) {
    let inv = concat!(env!("CARGO_MANIFEST_DIR"), "/inventories/kprov-single.yaml");
    let o = env.run(&[&metal_args(name, inv)[..], &["--ssh-public-key", KEY]].concat());
    assert!(o.status.success(), "{}", out(&o));
}

/// A good record of each kind and a damaged one: a journal naming a node with an escape
/// sequence, a record of a provisioned host whose address is an ssh option, known host keys
/// with one forged line between two good ones, a backup record whose time is not one.
fn plant_records(name: &str, put: Put) {
    let journal = serde_json::json!({
        "cluster": name, "startedAt": "2026-11-22T21:00:00Z",
        "updatedAt": "2026-11-22T21:05:00Z", "startedBy": "alice@desk", "cloudOnly": false,
        "finished": false,
        "nodes": [{"target": "w1", "nodeName": format!("w1{CLEAR}"), "group": "nodes",
                   "action": "reprovision", "batch": 0, "step": "drained"}],
    });
    put(
        &format!("{name}/journal/rolling-update.json"),
        journal.to_string().as_bytes(),
    );
    let host = |address: &str| {
        serde_json::json!({"name": "w9", "address": address, "roles": ["node"]}).to_string()
    };
    put(
        &format!("{name}/hosts/w9"),
        host("-oProxyCommand=touch\u{1b}[2J").as_bytes(),
    );
    put(
        &format!("{name}/known_hosts"),
        format!(
            "cp1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5\n{OSC52} ssh-ed25519 AAAA\n\
             [cp2]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5\n"
        )
        .as_bytes(),
    );
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(b"snapshot"))
    };
    let id = "20261122T213500Z";
    put(&format!("{name}/backups/etcd/{id}.db"), b"snapshot");
    let record = serde_json::json!({
        "id": id, "key": format!("{name}/backups/etcd/{id}.db"), "sha256": sha, "size": 8,
        "host": "cp1", "takenAt": "2026-11-22T21:35:00Z", "etcd": "Stacked",
    });
    put(
        &format!("{name}/backups/etcd/{id}.json"),
        record.to_string().as_bytes(),
    );
    let bad = "20261122T230000Z";
    let mut damaged = record.clone();
    damaged["id"] = bad.into();
    damaged["key"] = format!("{name}/backups/etcd/{bad}.db").into();
    damaged["takenAt"] = "yesterday\u{1b}[2J".into();
    put(
        &format!("{name}/backups/etcd/{bad}.json"),
        damaged.to_string().as_bytes(),
    );
}

/// The messages of the damaged records and their removal, the same on every store:
/// `get(key)` reads an object back (`None`: gone).
fn damaged_records_are_named_and_cleared(
    env: &Env,
    name: &str,
    get: &dyn Fn(&str) -> Option<Vec<u8>>,
) {
    let at = |key: &str| format!("{}/{name}/{key}", env.store());
    let way_out = format!(
        "`kprov delete damaged {name}` lists it and `kprov delete damaged {name} --yes` removes it"
    );

    // A damaged record of a provisioned host stops the preview, named with the way out.
    let o = env.run(&["update", "cluster", name]);
    assert_failed_cleanly(&o);
    assert_eq!(
        stderr(&o),
        format!(
            "error: the record of a provisioned host {} is damaged (address: \
             \"-oProxyCommand=touch\\u{{1b}}[2J\" is not a host name or IP address (letters, \
             digits, '-', '_' and '.'; no label may start or end with '-')) and is not used; \
             {way_out} (the host is then no longer known as provisioned: `update cluster` \
             re-provisions it if the spec lists it)\n",
            at("hosts/w9")
        )
    );

    // `delete damaged` lists every damaged record with its key and reason, and writes nothing.
    let o = env.run(&["delete", "damaged", name]);
    assert_no_controls(&o);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(
        stdout(&o),
        format!(
            "Will remove 4 damaged records of cluster {name} (from known host keys only the \
             damaged lines):\n  \
             {} (backup record): takenAt \"yesterday\\x1b[2J\" is not an RFC 3339 time\n  \
             {} (rolling-update journal): nodes[0].nodeName \"w1evil\\x1b[2J\\x1b[H\" is not a \
             node or group name\n  \
             {} (record of a provisioned host): address: \"-oProxyCommand=touch\\u{{1b}}[2J\" is \
             not a host name or IP address (letters, digits, '-', '_' and '.'; no label may start \
             or end with '-')\n  \
             {} (known host keys): line 2: \"mallory\\x1b]52;c;cm0gLXJmIH4K\\x07\" is not a host \
             name\n",
            at("backups/etcd/20261122T230000Z.json"),
            at("journal/rolling-update.json"),
            at("hosts/w9"),
            at("known_hosts"),
        )
    );
    assert_eq!(
        stderr(&o),
        format!("Run `kprov delete damaged {name} --yes` to remove them.\n")
    );
    assert!(get(&format!("{name}/hosts/w9")).is_some());
    assert!(
        get(&format!("{name}/lock")).is_none(),
        "a preview took the lock"
    );

    let o = env.run(&["delete", "damaged", name, "--yes"]);
    assert_no_controls(&o);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(stderr(&o).lines().count(), 4, "{}", out(&o));
    assert!(
        stderr(&o).lines().all(|l| l.starts_with("removed ")),
        "{}",
        out(&o)
    );
    for gone in [
        "hosts/w9",
        "journal/rolling-update.json",
        "backups/etcd/20261122T230000Z.json",
        "lock",
    ] {
        assert!(get(&format!("{name}/{gone}")).is_none(), "{gone} stays");
    }
    // The good records stay: the backup, and the two good host keys.
    assert!(get(&format!("{name}/backups/etcd/20261122T213500Z.json")).is_some());
    assert_eq!(
        String::from_utf8(get(&format!("{name}/known_hosts")).expect("known_hosts")).unwrap(),
        "cp1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5\n[cp2]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5\n"
    );
    let o = env.run(&["delete", "damaged", name]);
    assert_eq!(
        stderr(&o),
        format!("cluster {name} has no damaged records\n"),
        "{}",
        out(&o)
    );
    let o = env.run(&["get", "backups", name]);
    assert_eq!(stderr(&o), "", "{}", out(&o));
}

#[test]
fn damaged_records_are_named_and_delete_damaged_clears_them() {
    let env = Env::new();
    let name = "records.example.com";
    create_metal(&env, name);
    let root = env.state();
    plant_records(name, &|key, data| {
        let path = root.join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    });
    damaged_records_are_named_and_cleared(&env, name, &|key| std::fs::read(root.join(key)).ok());
}

#[test]
fn on_s3_damaged_records_are_named_and_delete_damaged_clears_them() {
    crate::needs_tier!(Moto);
    let b = S3Bucket::new();
    let env = b.env();
    let name = "records.example.com";
    create_metal(&env, name);
    plant_records(name, &|key, data| b.put(key, data));
    damaged_records_are_named_and_cleared(&env, name, &|key| b.get(key));
}

/// Runs `args` (with `editor` as $EDITOR), expects a refusal, and the store as it was.
fn refused_writes_nothing(
    env: &Env,
    args: &[&str],
    editor: &Path,
    before: &std::collections::BTreeMap<PathBuf, Vec<u8>>,
) {
    let o = env.cmd(args).env("EDITOR", editor).output().unwrap();
    assert_no_controls(&o);
    assert!(!o.status.success(), "{args:?} was not refused: {}", out(&o));
    assert_eq!(
        &snapshot(&env.state()),
        before,
        "{args:?} changed the store: {}",
        out(&o)
    );
}

#[test]
fn every_refused_edit_update_and_delete_leaves_the_store_as_it_was() {
    use std::os::unix::fs::PermissionsExt;
    let aws = "refuse.example.com";
    let env = with_aws(aws);
    let metal = "refuse-metal.example.com";
    create_metal(&env, metal);
    let editor = |name: &str, script: &str| {
        let path = env.path(name);
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    };
    // An edit that stays invalid, and an editor that fails.
    let invalid = editor(
        "invalid.sh",
        "sed -i 's/podCIDR: 100.96.0.0\\/11/podCIDR: 172.20.0.0\\/24/' \"$1\"",
    );
    let failing = editor("failing.sh", "exit 1");
    // A damaged record of a provisioned host (refuses the metal preview and apply) and a
    // damaged journal (refuses a roll).
    let hosts = env.state().join(metal).join("hosts");
    std::fs::create_dir_all(&hosts).unwrap();
    std::fs::write(hosts.join("w9"), "{\"name\": \"w9\u{1b}[2J\"}").unwrap();
    let journal = env.state().join(metal).join("journal");
    std::fs::create_dir_all(&journal).unwrap();
    std::fs::write(journal.join("rolling-update.json"), "\u{1b}]52;c;eA==\u{7}").unwrap();
    let before = snapshot(&env.state());
    for (args, editor) in [
        (vec!["edit", "cluster", aws], &invalid),
        (vec!["edit", "cluster", aws], &failing),
        (vec!["edit", "ig", "--name", aws, "nosuch"], &invalid),
        (vec!["edit", "cluster", "nosuch.example.com"], &invalid),
        (
            vec!["update", "cluster", "nosuch.example.com", "--yes"],
            &invalid,
        ),
        (vec!["update", "cluster", metal], &invalid),
        (vec!["update", "cluster", metal, "--yes"], &invalid),
        (vec!["rolling-update", "cluster", metal, "--yes"], &invalid),
        (
            vec!["delete", "ig", "--name", aws, "nosuch", "--yes"],
            &invalid,
        ),
        (
            vec!["delete", "instance", metal, "nosuch", "--yes"],
            &invalid,
        ),
        (
            vec!["delete", "cluster", "nosuch.example.com", "--yes"],
            &invalid,
        ),
    ] {
        refused_writes_nothing(&env, &args, editor, &before);
    }
    // While someone holds the lock, every mutating command is refused and writes nothing.
    std::fs::write(env.state().join(aws).join("lock"), forged_lock()).unwrap();
    let before = snapshot(&env.state());
    let valid = editor("valid.sh", "sed -i 's/maxSize: 2/maxSize: 3/' \"$1\"");
    let o = env.run(&["get", "clusters", aws, "-o", "yaml"]);
    let file = env.path("again.yaml");
    std::fs::write(&file, &o.stdout).unwrap();
    for args in [
        vec!["edit", "ig", "--name", aws, "nodes"],
        vec!["replace", "-f", file.to_str().unwrap()],
        vec!["update", "cluster", aws, "--yes"],
        vec!["delete", "ig", "--name", aws, "nodes", "--yes"],
        vec!["delete", "cluster", aws, "--yes"],
    ] {
        refused_writes_nothing(&env, &args, &valid, &before);
    }
}

/// A YAML double-quoted scalar with every character but printable ASCII escaped (YAML
/// allows no raw DEL or C1 even inside quotes).
fn yaml_quoted(v: &str) -> String {
    let mut out = String::from("\"");
    for c in v.chars() {
        match c {
            '"' | '\\' => out.push_str(&format!("\\{c}")),
            c if c == ' ' || c.is_ascii_graphic() => out.push(c),
            c => out.push_str(&format!("\\u{:04x}", c as u32)),
        }
    }
    out.push('"');
    out
}

#[test]
fn yaml_and_json_output_is_exact_whatever_a_stored_value_holds() {
    let name = "exact.example.com";
    let env = with_aws(name);
    // An annotation (free text) holding every kind of character a terminal acts on.
    let hostile = format!("{OSC52}|{CLEAR}|{FORGED}|\u{7f}\u{9b}2J\u{202e}\u{2066}\ttab");
    let config = env.state().join(name).join("config");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("\nmetadata:\n"), "{text}");
    std::fs::write(
        &config,
        text.replacen(
            "\nmetadata:\n",
            &format!(
                "\nmetadata:\n  annotations:\n    kprov.dev/note: {}\n",
                yaml_quoted(&hostile)
            ),
            1,
        ),
    )
    .unwrap();
    for format in ["yaml", "json"] {
        let o = env.run(&["get", "clusters", name, "-o", format]);
        assert_no_controls(&o);
        assert!(o.status.success(), "{}", out(&o));
        let doc: serde_json::Value = if format == "json" {
            serde_json::from_slice(&o.stdout).unwrap()
        } else {
            // The cluster, then its instance groups, as one multi-document stream.
            {
                let docs: Vec<serde_json::Value> =
                    serde_saphyr::from_str_multiple(&stdout(&o)).unwrap();
                docs[0].clone()
            }
        };
        // `-o json` is a List of the cluster and its groups.
        let doc = doc.get("items").map(|i| i[0].clone()).unwrap_or(doc);
        assert_eq!(
            doc["metadata"]["annotations"]["kprov.dev/note"],
            serde_json::Value::String(hostile.clone()),
            "{format}: {}",
            out(&o)
        );
    }
}

/// Taking over an expired lock warns with its holder escaped, and the log line carries no
/// colour codes when stderr is not a terminal (issue 21).
#[test]
fn taking_over_a_forged_expired_lock_warns_escaped_and_without_colour() {
    let name = "takeover.example.com";
    let env = with_aws(name);
    let expired = forged_lock().replace("2099-01-01T00:00:00Z", "2026-01-01T00:00:00Z");
    std::fs::write(env.state().join(name).join("lock"), expired).unwrap();
    let o = env.run(&["delete", "ig", "--name", name, "nodes", "--yes"]);
    assert_no_controls(&o);
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        stderr(&o).contains(
            "took over the expired lock of cluster takeover.example.com held by \
             mallory\\x1b]52;c;cm0gLXJmIH4K\\x07@evil\\x1b[2J\\x1b[H (pid 4242) running \
             `kprov\\nerror: all nodes were deleted`"
        ),
        "{}",
        out(&o)
    );
    assert!(!env.state().join(name).join("lock").exists());
}

/// An instance group created alone for a stored cluster is refused with every problem
/// located in its file (never an error without file and line), and writes nothing.
#[test]
fn a_refused_instance_group_is_located_in_its_file() {
    let name = "located.example.com";
    let env = with_aws(name);
    let file = env.path("ig.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: kprov.dev/v1alpha1\nkind: InstanceGroup\nmetadata:\n  name: extra\n  \
             labels:\n    kprov.dev/cluster: {name}\nspec:\n  role: Node\n  minSize: 3\n  \
             maxSize: 1\n  subnets:\n  - eu-west-1z\n"
        ),
    )
    .unwrap();
    let before = snapshot(&env.state());
    let o = env.run(&["create", "-f", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{}", out(&o));
    let f = file.display();
    assert_eq!(
        stderr(&o),
        format!(
            "error: {f}:9:12: spec.minSize: InstanceGroup extra: minSize 3 is larger than maxSize \
             1\n{f}:12:5: spec.subnets[0]: InstanceGroup extra: unknown subnet \"eu-west-1z\"; the \
             cluster has: eu-west-1a\n(2 problems)\n"
        )
    );
    assert_eq!(snapshot(&env.state()), before);
}
