//! SSH transport and step execution on hosts.
//!
//! [`SshFleet`] holds one multiplexed OpenSSH connection per host and implements
//! [`task::HostExecutor`]; host keys are checked strictly against the cluster's known hosts in
//! the state store. See docs/ssh.md.

mod engine;
mod hostkeys;
pub mod progress;
pub mod task;

pub use engine::{SshFleet, SshOptions};
pub use progress::{Event, HostReport, NoProgress, PlainProgress, Progress, Summary};

/// What an `UnknownHostKey` error says instead of fingerprints: kprov contacts no host whose
/// key is not recorded unless it may record it.
pub const NOT_SCANNED: &str = "(not scanned: kprov contacts no host whose key the cluster has not recorded; `ssh-keyscan HOST | ssh-keygen -lf -` shows it)";

/// Records known_hosts lines kprov knows in advance (a cloud instance's address with the host
/// key kprov generated for its group), compare-and-swap, before the first connection, so that
/// connection is checked strictly. A line whose host already has other keys in the store is
/// not recorded: its pattern is returned, and the connection will be refused naming both
/// fingerprints rather than trusting either silently.
pub async fn record_expected_keys(
    store: &std::sync::Arc<dyn crate::state::StateStore>,
    cluster: &str,
    lines: &[String],
) -> Result<Vec<String>, crate::state::StateError> {
    let mut differing = Vec::new();
    for k in hostkeys::parse(&lines.join("\n")) {
        match hostkeys::record(store, cluster, std::slice::from_ref(&k)).await {
            Ok(()) => {}
            Err(hostkeys::RecordError::Differs(_)) => differing.push(k.pattern.clone()),
            Err(hostkeys::RecordError::Store(e)) => return Err(e),
        }
    }
    Ok(differing)
}
