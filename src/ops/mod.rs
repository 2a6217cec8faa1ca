//! Use cases: what a command does, without the command line. No clap, no indicatif and no
//! printing in here: progress leaves as events that the CLI renders through the printer
//! (a spinner line per host on a terminal, plain lines otherwise).
//!
//! - [`nodes`]: a cluster's machines over SSH on any platform: the node plan
//!   ([`nodes::plan`]), converging the nodes and storing the admin kubeconfig
//!   ([`nodes::converge`]), resetting them at `delete cluster` ([`nodes::reset`]).
//! - [`etcd`]: snapshots into the state store ([`etcd::backup`], which a rolling update
//!   calls before control-plane rolls), listing them, and restoring every member.
//!
//! Caveat: `update addons`, the SSH tunnel and the AWS cloud apply still live in `cli/`
//! (`cli/addons.rs`, `cli/update.rs`); they are the next to move.

pub mod etcd;
pub mod nodes;
