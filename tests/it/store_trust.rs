//! The state store is a trust boundary: what it holds must not run code on the operator's
//! machine. Through the real binary, with a tampered store.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::cli::Env;
use crate::support::fakekube::FakeKube;

const KEY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/id_ed25519.pub");

/// Writes one AWS cluster spec (no cloud is contacted).
fn create(env: &Env, cluster: &str) {
    let o = env.run(&[
        "create",
        "cluster",
        cluster,
        "--cloud",
        "aws",
        "--zones",
        "eu-west-1a",
        "--ssh-public-key",
        KEY,
    ]);
    assert!(o.status.success(), "{}", out(&o));
}

fn out(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

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
    let env = Env::new();
    let name = "tampered.example.com";
    create(&env, name);
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
    let env = Env::new();
    let name = "own.example.com";
    create(&env, name);
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
    let env = Env::new();
    let name = "private.example.com";
    create(&env, name);
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
