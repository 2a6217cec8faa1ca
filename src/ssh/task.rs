//! What the SSH engine runs on a host: an ordered list of idempotent steps.
//!
//! Renderers (`provision`) produce steps; the engine (`ssh`) executes them. A step is
//! idempotent by construction: files are uploaded only when their sha256 differs from what
//! the host has, and `run` is skipped when `check` succeeds and no file of the step changed.

use std::time::Duration;

use bytes::Bytes;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    /// Absolute path on the host.
    pub path: String,
    pub content: Bytes,
    /// Octal permission bits, e.g. 0o644.
    pub mode: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Short, stable name shown in progress output and errors (`containerd: install`).
    pub name: String,
    pub files: Vec<RemoteFile>,
    /// POSIX sh script; exit status 0 means the step is already done.
    pub check: Option<String>,
    /// POSIX sh script run as root (through sudo when the ssh user is not root).
    pub run: String,
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

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The host could not be reached or authenticated (ssh's own message included).
    #[error("{host}: cannot connect: {message}")]
    Connect { host: String, message: String },
    /// A step failed; `stderr` is the remote command's standard error.
    #[error("{host}: step {step:?} failed (exit {code:?}): {stderr}")]
    Step {
        host: String,
        step: String,
        code: Option<i32>,
        stderr: String,
    },
    #[error("{host}: step {step:?} timed out after {timeout:?}")]
    Timeout {
        host: String,
        step: String,
        timeout: Duration,
    },
    #[error("{host}: {message}")]
    Other { host: String, message: String },
}

/// Runs steps on named hosts. The SSH engine implements it; provisioning orchestrates through it.
#[async_trait::async_trait]
pub trait HostExecutor: Send + Sync {
    /// Runs `steps` in order on `host`, stopping at the first failure.
    async fn run_steps(&self, host: &str, steps: &[Step]) -> Result<Vec<StepOutcome>, ExecError>;
    /// Reads a file from the host (as root); `None` when it does not exist.
    async fn read_file(&self, host: &str, path: &str) -> Result<Option<Bytes>, ExecError>;
}
