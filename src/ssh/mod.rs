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
