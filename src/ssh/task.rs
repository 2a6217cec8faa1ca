//! What the SSH engine runs on a host: an ordered list of idempotent steps.
//!
//! Renderers (`provision`) produce steps; the engine (`ssh`) executes them. A step is
//! idempotent by construction: files are uploaded only when their sha256 differs from what
//! the host has, and `run` is skipped when `check` succeeds and no file of the step changed.

use std::time::Duration;

use bytes::Bytes;

/// A file a step puts on the host before its check and run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    /// Absolute path on the host.
    pub path: String,
    /// The file's bytes, written exactly.
    pub content: Bytes,
    /// Octal permission bits, e.g. 0o644.
    pub mode: u32,
    /// Large uploads (bundle members): sent into `PATH.kprov-partial`, which a cut upload
    /// leaves behind and the next run appends to; renamed into place only once its sha256 is
    /// right. Other files go through a temporary file removed on any failure.
    pub resumable: bool,
    /// The content's sha256 (hex) when the renderer already computed it while verifying the
    /// content against a pinned checksum: the engine does not hash it again. A wrong value
    /// cannot install wrong bytes: the host checks what it received against it and refuses.
    pub sha256: Option<String>,
    /// Work on this file that may start as soon as it is on the host, before the rest of the
    /// step's files have arrived (an image archive's import while the next archive uploads).
    /// Run only when the file is uploaded in the step's stream (not for a file already on the
    /// host, nor a resumable one): the step's `run` must do the same work when it finds it
    /// undone, the hook only starts it earlier.
    pub on_arrival: Option<Arrival>,
}

/// A script run in the background on the host as soon as its file is written (see
/// [`RemoteFile::on_arrival`]), at most [`ARRIVALS_AT_ONCE`] at a time, each under its own
/// `timeout`. All of a step's hooks end before its check and run; if one failed, the step
/// fails with their standard error and its `run` does not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// POSIX sh script, run as root in the background (no arguments, no stdin) once the file
    /// is written.
    pub run: String,
    /// How long the hook may run before it is stopped and the step fails.
    pub timeout: Duration,
}

/// Hooks of one batch running at once on a host.
pub(crate) const ARRIVALS_AT_ONCE: usize = 4;

/// One idempotent unit of work on a host: its files, a `check` that says whether it is
/// already done, and the `run` that does it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Short, stable name shown in progress output and errors (`containerd: install`).
    pub name: String,
    /// Files put on the host first, in order.
    pub files: Vec<RemoteFile>,
    /// POSIX sh script; exit status 0 means the step is already done.
    pub check: Option<String>,
    /// POSIX sh script run as root (through sudo when the ssh user is not root).
    pub run: String,
    /// How long the check and run together may take before the step fails with
    /// `ExecError::Timeout`.
    pub timeout: Duration,
}

/// What executing a step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// Already converged: nothing uploaded, nothing run.
    Unchanged,
    /// Files were uploaded and/or `run` was executed successfully.
    Changed,
}

/// Why a host's run failed; every variant names the host.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The host could not be reached or authenticated (ssh's own message included).
    #[error("{host}: cannot connect: {}", host_text(message))]
    Connect {
        /// The host's inventory name.
        host: String,
        /// ssh's own message (from the host side: shown escaped).
        message: String,
    },
    /// A step failed; `stderr` is the remote command's standard error.
    #[error("{host}: step {:?} failed ({}): {}", untrusted(.step), exit_text(*.code), host_text(stderr))]
    Step {
        /// The host's inventory name.
        host: String,
        /// The step's name.
        step: String,
        /// The remote exit status; None when a signal ended it.
        code: Option<i32>,
        /// The remote command's standard error (from the host: shown escaped).
        stderr: String,
    },
    /// The connection broke (or could not be reopened) while a step was running: the step may
    /// have run in part. Steps are idempotent, so a re-run finishes it.
    #[error(
        "{host}: step {:?}: connection lost ({}); the step may have run in part, re-run to finish it",
        untrusted(.step),
        host_text(message)
    )]
    ConnectionLost {
        /// The host's inventory name.
        host: String,
        /// The step that was running.
        step: String,
        /// Why the connection ended (ssh's message).
        message: String,
    },
    /// The step did not end within its `timeout`.
    #[error("{host}: step {:?} timed out after {timeout:?}", untrusted(.step))]
    Timeout {
        /// The host's inventory name.
        host: String,
        /// The step's name.
        step: String,
        /// The step's timeout.
        timeout: Duration,
    },
    /// First contact with a host whose key the cluster has not recorded yet.
    #[error(
        "{host}: unknown host key {fingerprints}; verify it (e.g. on the host: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub) and re-run with --accept-new-host-keys to record it"
    )]
    UnknownHostKey {
        /// The host's inventory name.
        host: String,
        /// The SHA256 fingerprints the host offered, for the operator to verify.
        fingerprints: String,
    },
    /// The host offers a key other than the one recorded for the cluster.
    #[error(
        "{host}: HOST KEY CHANGED: the cluster's state store has {known} but the host offers {offered}; this may be an attack or a reinstalled host. If the host was reinstalled, remove its line from the cluster's known_hosts in the state store"
    )]
    HostKeyChanged {
        /// The host's inventory name.
        host: String,
        /// The fingerprints the state store holds.
        known: String,
        /// The fingerprints the host offered.
        offered: String,
    },
    /// sudo on the host asks for a password: kprov needs NOPASSWD (or root).
    #[error(
        "sudo on {host} requires a password; configure NOPASSWD for user {user} (e.g. '{user} ALL=(ALL) NOPASSWD: ALL' in /etc/sudoers.d/) or connect as root"
    )]
    SudoPassword {
        /// The host's inventory name.
        host: String,
        /// The ssh user sudo asked a password of.
        user: String,
    },
    /// Any other failure (a duplicate host name, a local directory that cannot be made).
    #[error("{host}: {}", host_text(message))]
    Other {
        /// The host the failure concerns (`localhost` for a local failure).
        host: String,
        /// What failed, as the host or the local step reported it (untrusted text).
        message: String,
    },
}

impl ExecError {
    /// [`ExecError::Connect`]: `host` could not be reached or authenticated.
    pub(crate) fn connect(host: &str, message: impl Into<String>) -> ExecError {
        ExecError::Connect {
            host: host.to_string(),
            message: message.into(),
        }
    }
}

/// A step's name in an error: quoted and escaped (it may quote an archive's image names).
fn untrusted(step: &str) -> crate::output::Untrusted<'_> {
    crate::output::untrusted(step)
}

/// What a host (or ssh on its behalf) said, for an error message: escaped, and when it spans
/// several lines, each on its own indented line (`  | ...`), so no line of it can pass for a
/// line of kprov's own (`error: ...`).
fn host_text(s: &str) -> String {
    let s = s.trim_end();
    if s.contains('\n') {
        format!("\n{}", crate::output::UntrustedBlock(s))
    } else {
        crate::output::untrusted(s).to_string()
    }
}

fn exit_text(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("exit {c}"),
        None => "killed by a signal".to_string(),
    }
}

/// Runs steps on named hosts. The SSH engine implements it; provisioning orchestrates through it.
#[async_trait::async_trait]
pub trait HostExecutor: Send + Sync {
    /// Runs `steps` in order on `host`, stopping at the first failure.
    async fn run_steps(&self, host: &str, steps: &[Step]) -> Result<Vec<StepOutcome>, ExecError>;
    /// Reads a file from the host (as root); `None` when it does not exist.
    async fn read_file(&self, host: &str, path: &str) -> Result<Option<Bytes>, ExecError>;
    /// [`HostExecutor::read_file`] with a caller-chosen size limit, for the one kind of file
    /// larger than the usual bound (etcd snapshots). Executors that hold files in memory
    /// already (test fakes) need no limit of their own.
    async fn read_file_bounded(
        &self,
        host: &str,
        path: &str,
        limit: u64,
    ) -> Result<Option<Bytes>, ExecError> {
        let _ = limit;
        self.read_file(host, path).await
    }
}

/// Test hosts. Every fake answers a run one step at a time: the loop over the steps, stopping
/// at the first failure as [`HostExecutor::run_steps`] does, is written once here.
#[cfg(test)]
pub(crate) mod fake {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use bytes::Bytes;

    use super::{ExecError, HostExecutor, Step, StepOutcome};

    /// A test host's answers; [`HostExecutor`] comes with it.
    #[async_trait::async_trait]
    pub(crate) trait StepByStep: Send + Sync {
        /// Whether `host` takes `steps` at all, asked before the first of them.
        fn admit(&self, _host: &str, _steps: &[Step]) -> Result<(), ExecError> {
            Ok(())
        }
        async fn step(&self, host: &str, step: &Step) -> Result<StepOutcome, ExecError>;
        async fn read(&self, host: &str, path: &str) -> Result<Option<Bytes>, ExecError>;
    }

    #[async_trait::async_trait]
    impl<T: StepByStep> HostExecutor for T {
        async fn run_steps(
            &self,
            host: &str,
            steps: &[Step],
        ) -> Result<Vec<StepOutcome>, ExecError> {
            self.admit(host, steps)?;
            let mut out = Vec::new();
            for s in steps {
                out.push(self.step(host, s).await?);
            }
            Ok(out)
        }

        async fn read_file(&self, host: &str, path: &str) -> Result<Option<Bytes>, ExecError> {
            self.read(host, path).await
        }
    }

    /// `step` failing on `host` with exit code 1 and `stderr`.
    pub(crate) fn step_failed(host: &str, step: &Step, stderr: &str) -> ExecError {
        ExecError::Step {
            host: host.into(),
            step: step.name.clone(),
            code: Some(1),
            stderr: stderr.into(),
        }
    }

    /// What `log` recorded on `host`, in order, each as `f` gives it.
    pub(crate) fn on_host<T, U>(
        log: &Mutex<Vec<(String, T)>>,
        host: &str,
        f: impl Fn(&T) -> U,
    ) -> Vec<U> {
        log.lock()
            .unwrap()
            .iter()
            .filter(|(h, _)| h == host)
            .map(|(_, t)| f(t))
            .collect()
    }

    /// The files on test hosts, by host and path.
    #[derive(Default)]
    pub(crate) struct Files(Mutex<HashMap<(String, String), Bytes>>);

    impl Files {
        pub(crate) fn put(&self, host: &str, path: &str, content: impl Into<Bytes>) {
            self.0
                .lock()
                .unwrap()
                .insert((host.into(), path.into()), content.into());
        }

        pub(crate) fn get(&self, host: &str, path: &str) -> Option<Bytes> {
            self.0
                .lock()
                .unwrap()
                .get(&(host.to_string(), path.to_string()))
                .cloned()
        }
    }

    /// The map itself, for tests that look at or change it as a whole.
    impl std::ops::Deref for Files {
        type Target = Mutex<HashMap<(String, String), Bytes>>;

        fn deref(&self) -> &Self::Target {
            &self.0
        }
    }
}
