//! `lock status` and `lock break`: a cluster's lock looked at, or removed on purpose,
//! whoever holds it. A lock that does not parse, or something else sitting at its key, is
//! named and removed too (a damaged lock stops every command, so it has this way out).

use crate::state::StateStore;
use crate::state::lock::{self, LockError, LockRecord};

/// What `lock break` removed.
pub(crate) use crate::state::lock::Broken;

/// `lock status CLUSTER`: who holds the lock, or `None`.
pub(crate) async fn status(
    store: &dyn StateStore,
    cluster: &str,
) -> Result<Option<LockRecord>, LockError> {
    lock::read(store, cluster).await
}

/// `lock break CLUSTER`: removes the lock conditional on the version read (a lock that
/// changed hands meanwhile is a conflict, not removed blindly).
pub(crate) async fn break_lock(store: &dyn StateStore, cluster: &str) -> Result<Broken, LockError> {
    lock::break_lock(store, cluster).await
}
