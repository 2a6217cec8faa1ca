//! The types of the layers below `ops` that a command names: the errors its exit code matches
//! on (a held lock, a store conflict, an invalid inventory), the store and its clusters, the
//! machines a node plan works on, the roll plan and its journal. Re-exported here so that
//! `cli` imports only `ops`, `views`, `output` and the spec model (a test in
//! `src/import_cycles.rs` fails on any other import from `src/cli`).

pub(crate) use crate::inventory::InventoryError;
pub(crate) use crate::nodes::Target;
pub(crate) use crate::nodes::journal::Journal;
pub(crate) use crate::nodes::roll::{RollPlan, Selection, parse_roles};
pub(crate) use crate::repo::{Repo, RepoError};
pub(crate) use crate::state::lock::LockError;
#[cfg(test)]
pub(crate) use crate::state::lock::LockRecord;
pub(crate) use crate::state::{StateError, StateStore};
