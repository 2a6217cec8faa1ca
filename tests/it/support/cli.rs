//! The kprov binary as a user runs it: one scratch HOME and state store per test, so nothing
//! leaks between tests or from the machine (its `~/.ssh`, `~/.aws`, `~/.kube`).
//!
//! The environment is cleared except PATH; AWS settings are passed only when the test asks
//! for moto ([`Env::with_moto`]), so a test that must not reach a cloud cannot by accident.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::moto::moto;

/// The SSH public key the tests' `create cluster` is given.
pub const KEY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/id_ed25519.pub");

/// `create cluster CLUSTER --cloud aws --zones eu-west-1a --ssh-public-key KEY`: the default
/// AWS spec (writing it contacts no cloud).
pub fn create_aws(cluster: &str) -> [&str; 9] {
    create_aws_in(cluster, "eu-west-1a")
}

/// `create cluster CLUSTER --cloud aws --zones ZONES --ssh-public-key KEY`.
pub fn create_aws_in<'a>(cluster: &'a str, zones: &'a str) -> [&'a str; 9] {
    [
        "create",
        "cluster",
        cluster,
        "--cloud",
        "aws",
        "--zones",
        zones,
        "--ssh-public-key",
        KEY,
    ]
}

/// kprov with a clean environment: `PATH`, `HOME` at `home`, the file store at `store`, no
/// colour (the labs' commands; [`Env`] adds moto's settings where asked).
pub fn kprov_in(home: &Path, store: &Path) -> Command {
    let mut c = Command::new(assert_cmd::cargo::cargo_bin("kprov"));
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("KPROV_STATE_STORE", format!("file://{}", store.display()))
        .env("NO_COLOR", "1");
    c
}

pub struct Env {
    pub dir: tempfile::TempDir,
    store: String,
    moto: bool,
}

impl Default for Env {
    fn default() -> Self {
        Env::new()
    }
}

/// `export kubeconfig CLUSTER --kubeconfig PATH`.
pub fn export_kubeconfig<'a>(cluster: &'a str, kc: &'a Path) -> [&'a str; 5] {
    [
        "export",
        "kubeconfig",
        cluster,
        "--kubeconfig",
        kc.to_str().expect("utf-8 path"),
    ]
}

/// `create cluster CLUSTER --cloud metal --inventory INVENTORY`.
pub fn create_metal<'a>(cluster: &'a str, inventory: &'a str) -> [&'a str; 7] {
    [
        "create",
        "cluster",
        cluster,
        "--cloud",
        "metal",
        "--inventory",
        inventory,
    ]
}

impl Env {
    /// A scratch HOME with a `file://` store in it (`<HOME>/state`).
    pub fn new() -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = format!("file://{}", dir.path().join("state").display());
        Env {
            dir,
            store,
            moto: false,
        }
    }

    /// A scratch HOME with another store (an `s3://` URL on moto).
    pub fn with_store(store: String) -> Env {
        Env {
            dir: tempfile::tempdir().expect("tempdir"),
            store,
            moto: false,
        }
    }

    /// Every command of this environment talks to the shared moto server.
    pub fn with_moto(mut self) -> Env {
        self.moto = true;
        self
    }

    pub fn home(&self) -> &Path {
        self.dir.path()
    }

    /// A path inside the scratch HOME.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The directory of the default `file://` store.
    pub fn state(&self) -> PathBuf {
        self.path("state")
    }

    pub fn store(&self) -> &str {
        &self.store
    }

    /// The command without any AWS settings, whatever [`Env::with_moto`] said.
    pub fn bare(&self, args: &[&str]) -> Command {
        let mut c = Command::new(assert_cmd::cargo::cargo_bin("kprov"));
        c.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            // Temporary files (an unsaved edit's kept copy) stay inside the test's directory.
            .env("TMPDIR", self.dir.path())
            .env("KPROV_STATE_STORE", &self.store)
            .env("NO_COLOR", "1")
            .args(args);
        c
    }

    /// The command, with moto's settings when the environment has them.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = self.bare(args);
        if self.moto {
            c.envs(moto().env());
        }
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("runs")
    }

    /// [`Env::run`] with `vars` set in kprov's environment.
    pub fn run_with(&self, args: &[&str], vars: &[(&str, &str)]) -> Output {
        self.cmd(args)
            .envs(vars.iter().copied())
            .output()
            .expect("runs")
    }

    /// Writes the default AWS spec of `cluster` ([`create_aws`]); it must succeed.
    #[track_caller]
    pub fn create_aws(&self, cluster: &str) {
        ok(&self.run(&create_aws(cluster)));
    }

    /// For tests whose runtime serves a fake (the Kubernetes API): the child must not block it.
    pub async fn run_async(&self, args: &[&str]) -> Output {
        tokio::process::Command::from(self.cmd(args))
            .output()
            .await
            .expect("runs")
    }
}

/// A command's output as text (lossy UTF-8).
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Exit code, stdout and stderr, for an assertion's message.
pub fn show(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        text(&o.stdout),
        text(&o.stderr)
    )
}

/// Asserts the command succeeded (else shows everything it said); its stdout.
#[track_caller]
pub fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", show(o));
    text(&o.stdout)
}

/// Asserts the command exited with `code` (else shows everything it said); its stderr.
#[track_caller]
pub fn fails(o: &Output, code: i32) -> String {
    assert_eq!(o.status.code(), Some(code), "{}", show(o));
    text(&o.stderr)
}

/// Asserts that `text` holds each of `needles` (else names the first missing and shows
/// the text).
#[track_caller]
pub fn holds_all(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
}

/// Asserts that the command's stderr says `needle` (else shows everything it said).
#[track_caller]
pub fn says(o: &Output, needle: &str) {
    assert!(text(&o.stderr).contains(needle), "{}", show(o));
}

/// Asserts that the command's stdout holds `needle` (else shows everything it said).
#[track_caller]
pub fn prints(o: &Output, needle: &str) {
    assert!(text(&o.stdout).contains(needle), "{}", show(o));
}
