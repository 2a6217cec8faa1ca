//! SSH transport and step execution on hosts.
//!
//! [`SshFleet`] holds one multiplexed OpenSSH connection per host and implements
//! [`task::HostExecutor`]; host keys are checked strictly against the cluster's known hosts in
//! the state store. See docs/ssh.md.

mod engine;
pub(crate) mod hostkeys;
pub(crate) mod progress;
pub mod task;

pub use engine::{SshFleet, SshOptions};
pub(crate) use engine::{destination, known_hosts_name};
pub(crate) use hostkeys::forget as forget_host_key;
pub use progress::{Event, HostReport, NoProgress, PlainProgress, Progress, Summary};

/// Runs a local command (ssh, ssh-keygen) for its standard output. A command that cannot
/// start fails as `{cannot_start}: {error}`, one that exits non-zero as `{failed}: {stderr}`
/// (trimmed): what the operator needs to fix their OpenSSH setup.
pub(crate) async fn stdout_of(
    cmd: &mut tokio::process::Command,
    cannot_start: &str,
    failed: &str,
) -> Result<Vec<u8>, String> {
    let out = cmd
        .output()
        .await
        .map_err(|e| format!("{cannot_start}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{failed}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out.stdout)
}

/// What an `UnknownHostKey` error says instead of fingerprints: kprov contacts no host whose
/// key is not recorded unless it may record it.
pub(crate) const NOT_SCANNED: &str = "(not scanned: kprov contacts no host whose key the cluster has not recorded; `ssh-keyscan HOST | ssh-keygen -lf -` shows it)";

/// A host key kprov expected (it generated it) at a name the store already holds another
/// key for: an address reused by a new instance, or a host impersonating one. Fingerprints
/// as `ssh-keygen -lf` prints them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyConflict {
    /// The name the key is checked under (an address, a jump host's name).
    pub(crate) name: String,
    pub(crate) stored: Vec<String>,
    pub(crate) expected: Vec<String>,
}

impl std::fmt::Display for KeyConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: the state store holds host key {} for this name, but kprov generated {} for \
             the instance now there; refused (if the address was reused by a new instance, \
             remove the stale line from the cluster's known hosts in the state store)",
            self.name,
            self.stored.join(", "),
            self.expected.join(", ")
        )
    }
}

/// Records known_hosts lines kprov knows in advance (a cloud instance's address with the host
/// key kprov generated for its group), compare-and-swap, before the first connection, so that
/// connection is checked strictly. A line whose name already has other keys in the store is
/// not recorded: it comes back as a [`KeyConflict`] naming both fingerprints, and the caller
/// refuses to go on rather than trusting either key.
pub(crate) async fn record_expected_keys(
    store: &std::sync::Arc<dyn crate::state::StateStore>,
    cluster: &str,
    lines: &[String],
) -> Result<Vec<KeyConflict>, String> {
    let mut conflicts = Vec::new();
    let scratch = tempfile::tempdir().map_err(|e| format!("scratch directory: {e}"))?;
    for k in hostkeys::parse(&lines.join("\n")) {
        match hostkeys::record(store, cluster, std::slice::from_ref(&k)).await {
            Ok(()) => {}
            Err(hostkeys::RecordError::Differs(existing)) => conflicts.push(KeyConflict {
                name: k.pattern.clone(),
                stored: hostkeys::fingerprints(&existing, scratch.path()).await?,
                expected: hostkeys::fingerprints(std::slice::from_ref(&k), scratch.path()).await?,
            }),
            Err(hostkeys::RecordError::Store(e)) => return Err(e.to_string()),
        }
    }
    Ok(conflicts)
}
