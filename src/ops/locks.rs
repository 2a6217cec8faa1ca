//! `lock status` and `lock break`: a cluster's lock looked at, or removed on purpose,
//! whoever holds it. A lock that does not parse, or something else sitting at its key, is
//! named and removed too (a damaged lock stops every command, so it has this way out).

use crate::state::StateStore;
use crate::state::layout::ClusterKeys;
use crate::state::lock::{self, LockError, LockRecord};

/// `lock status CLUSTER`: who holds the lock, or `None`.
pub async fn status(
    store: &dyn StateStore,
    cluster: &str,
) -> Result<Option<LockRecord>, LockError> {
    lock::read(store, cluster).await
}

/// What `lock break` removed.
#[derive(Debug)]
pub enum Broken {
    NotLocked,
    Lock(Box<LockRecord>),
    /// The lock object did not parse; it was removed anyway.
    Unreadable,
    /// Something that was not a lock sat at the lock's key (`what`, at `location`); `removed`
    /// keys below it were deleted with it.
    Obstruction {
        what: String,
        location: String,
        removed: usize,
    },
}

/// `lock break CLUSTER`: removes the lock conditional on the version read (a lock that
/// changed hands meanwhile is a conflict, not removed blindly).
pub async fn break_lock(store: &dyn StateStore, cluster: &str) -> Result<Broken, LockError> {
    Ok(match lock::break_lock(store, cluster).await? {
        lock::Broken::NotLocked => Broken::NotLocked,
        lock::Broken::Lock(r) => Broken::Lock(r),
        lock::Broken::Unreadable => Broken::Unreadable,
        lock::Broken::Obstruction { what, removed } => Broken::Obstruction {
            what,
            location: store.key_location(&ClusterKeys::new(cluster)?.lock()),
            removed: removed.len(),
        },
    })
}
