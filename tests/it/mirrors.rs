//! Registry mirrors and credentials through the binary: the password goes in on standard
//! input, lives in the store's secrets, and is shown nowhere but as a digest.

use std::io::Write;
use std::process::{Output, Stdio};

use crate::support::cli::Env;
use crate::support::cli::{fails, show, text};

const NAME: &str = "mirrors.example.com";
const PASSWORD: &str = "hunter2-not-shown";

#[track_caller]
fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", show(o));
    format!("{}{}", text(&o.stdout), text(&o.stderr))
}

fn with_stdin(env: &Env, args: &[&str], input: &str) -> Output {
    let mut child = env
        .cmd(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().expect("waits")
}

fn all_files(dir: &std::path::Path, out: &mut Vec<(String, Vec<u8>)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            all_files(&p, out);
        } else {
            out.push((p.display().to_string(), std::fs::read(&p).unwrap()));
        }
    }
}

/// `create -f` of a metal Cluster named NAME with one host and `spec` (lines under `spec:`).
fn create_with(env: &Env, spec: &str) -> std::process::Output {
    let yaml = format!(
        "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {NAME}\nspec:\n  \
         cloudProvider: metal\n  kubernetesVersion: 1.35.1\n{spec}  hosts:\n  - name: cp1\n    \
         address: 198.18.0.11\n    roles: [control-plane, etcd]\n"
    );
    std::fs::write(env.path("c.yaml"), yaml).unwrap();
    env.run(&["create", "-f", env.path("c.yaml").to_str().unwrap()])
}

#[test]
fn registry_credentials_are_kept_as_secrets_and_shown_as_digests() {
    let env = Env::new();
    ok(&create_with(
        &env,
        "  containerd:\n    registries:\n    - name: registry.k8s.io\n      fallback: false\n      \
         mirrors:\n      - endpoint: https://mirror.example.com:5000\n  proxy:\n    https: \
         http://proxy.example.com:3128\n",
    ));

    let args = [
        "create",
        "registry-credentials",
        NAME,
        "--host",
        "mirror.example.com:5000",
        "--username",
        "puller",
    ];
    let said = ok(&with_stdin(&env, &args, &format!("{PASSWORD}\n")));
    assert!(!said.contains(PASSWORD), "{said}");
    assert!(
        said.contains("registries/mirror.example.com:5000"),
        "{said}"
    );
    assert!(said.contains("sha256:"), "{said}");

    let secrets = ok(&env.run(&["get", "secrets", NAME]));
    assert!(
        secrets.contains("registries/mirror.example.com:5000"),
        "{secrets}"
    );
    assert!(!secrets.contains(PASSWORD));
    for shown in [
        ok(&env.run(&["get", "cluster", NAME, "-o", "yaml"])),
        ok(&env.run(&["get", "cluster", NAME, "-o", "yaml", "--full"])),
    ] {
        assert!(!shown.contains(PASSWORD), "{shown}");
        assert!(shown.contains("mirror.example.com:5000"), "{shown}");
    }
    // Only the secret holds it, in the whole store.
    let mut files = Vec::new();
    all_files(&env.state(), &mut files);
    let holding: Vec<&str> = files
        .iter()
        .filter(|(_, c)| String::from_utf8_lossy(c).contains(PASSWORD))
        .map(|(p, _)| p.as_str())
        .collect();
    assert_eq!(holding.len(), 1, "{holding:?}");
    assert!(
        holding[0].ends_with("secrets/registries/mirror.example.com:5000"),
        "{holding:?}"
    );

    // No password, a bad host: refused, naming what is wrong.
    let o = with_stdin(&env, &args, "");
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("no password on standard input"));
    let mut bad = args;
    bad[4] = "mirror/../x";
    let o = with_stdin(&env, &bad, "pw\n");
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("--host"), "{}", text(&o.stderr));
}

#[test]
fn a_bad_mirror_is_refused_at_create_naming_the_field() {
    let env = Env::new();
    let o = create_with(
        &env,
        "  containerd:\n    registries:\n    - name: docker.io\n      mirrors:\n      \
         - endpoint: ftp://mirror.example.com\n",
    );
    let err = fails(&o, 3);
    assert!(
        err.contains("spec.containerd.registries[0].mirrors[0].endpoint"),
        "{err}"
    );
    assert!(err.contains("c.yaml:12"), "{err}");
}
