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
