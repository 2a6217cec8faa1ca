//! The cluster lock: mutating commands hold `<cluster>/lock` so two operators never work on one
//! cluster at once (kops has no such lock; see kops issue 3903).
//!
//! The lock is an object created with a conditional write (`Precondition::Absent`), so exactly
//! one of several racing acquirers wins. It records who holds it and carries a lease that the
//! holder renews in the background; a lock whose lease has expired (its holder crashed or lost
//! the network) may be taken over, but only by a compare-and-swap on the stale lock's version,
//! so again exactly one taker wins. Leases compare wall clocks of different machines: keep
//! them much longer than any expected clock skew (the default is minutes, skew is seconds).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::layout::ClusterKeys;
use super::{Precondition, StateError, StateStore, Version};
use crate::output::untrusted;

/// The lease mutating commands use unless they have a reason to pick another.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(300);
/// Leases are capped so a typo cannot lock a cluster for years.
const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often acquire re-reads a lock that vanished or was taken over under it before giving up.
const MAX_ATTEMPTS: usize = 8;

/// What the lock object contains (JSON). Unknown fields are accepted: a lock written by a newer
/// kprov must still read as held, not as corrupt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockRecord {
    /// The user who ran the command.
    pub holder: String,
    /// The host name of the machine it ran on.
    pub host: String,
    /// The process id of the command on that host.
    pub pid: u32,
    /// The command line, e.g. `kprov update cluster demo.example.com --yes`.
    pub command: String,
    /// When the lock was taken.
    pub acquired_at: DateTime<Utc>,
    /// When the holder last renewed the lease.
    pub renewed_at: DateTime<Utc>,
    /// After this instant the lock counts as stale and may be taken over.
    pub expires_at: DateTime<Utc>,
    /// Random, so a holder recognises its own record (pid and host repeat across machines).
    pub id: String,
}

impl LockRecord {
    fn new(command: &str, lease: Duration) -> LockRecord {
        let now = Utc::now();
        LockRecord {
            holder: current_user(),
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            pid: std::process::id(),
            command: command.to_string(),
            acquired_at: now,
            renewed_at: now,
            expires_at: now + lease_delta(lease),
            id: format!("{:032x}", rand::random::<u128>()),
        }
    }

    /// Whether the lease has run out at `now` (from `expires_at` on).
    pub fn is_expired(&self, now: DateTime<Utc>) -> bool {
        now >= self.expires_at
    }

    /// The record as the lock object's pretty-printed JSON.
    pub fn to_bytes(&self) -> Bytes {
        // A struct of strings, numbers and timestamps always serialises.
        Bytes::from(serde_json::to_vec_pretty(self).unwrap_or_default())
    }

    /// Reads a lock object with the rules kprov writes it by: JSON with the fields above,
    /// times in RFC 3339, an id that is a plain token, text fields of bounded length. Text fields may
    /// hold anything else (a user name is the user's): they are shown only through
    /// [`crate::output::untrusted`].
    pub fn parse(data: &[u8]) -> Result<LockRecord, String> {
        let limit = format_args!("a lock record's {RECORD_LIMIT}");
        super::check_size(data, RECORD_LIMIT, limit)?;
        let r: LockRecord = serde_json::from_slice(data).map_err(|e| e.to_string())?;
        for (field, value, max) in [
            ("holder", &r.holder, 256),
            ("host", &r.host, 256),
            ("command", &r.command, 4096),
        ] {
            if value.chars().count() > max {
                return Err(format!("{field} is longer than {max} characters"));
            }
        }
        // kprov writes 32 hex digits; letters, digits, `-` and `_` keep older or hand-made
        // records readable without letting anything but a plain token through.
        if r.id.is_empty()
            || r.id.len() > 64
            || !r
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "id {:?} is not a lock id (letters, digits, '-', '_')",
                crate::output::untrusted(&r.id)
            ));
        }
        Ok(r)
    }
}

/// A lock record is a few hundred bytes; anything much larger is not one.
const RECORD_LIMIT: usize = 64 << 10;

fn lease_delta(lease: Duration) -> TimeDelta {
    TimeDelta::from_std(lease.min(MAX_LEASE)).unwrap_or(TimeDelta::zero())
}

fn current_user() -> String {
    ["USER", "LOGNAME", "USERNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "unknown".into())
}

fn when(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Why the cluster lock could not be taken, read, renewed or released.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another command holds an unexpired lease.
    #[error(
        "cluster {cluster} is locked by {holder}@{host} (pid {pid}) running `{command}` since {since}; \
         the lease runs until {until}. Wait for that command to finish; if it is dead, break the \
         lock with `kprov lock break {cluster}`",
        holder = untrusted(&record.holder),
        host = untrusted(&record.host),
        pid = record.pid,
        command = untrusted(&record.command),
        since = when(&record.acquired_at),
        until = when(&record.expires_at)
    )]
    Held {
        /// The cluster whose lock another command holds.
        cluster: String,
        /// The holder's record as read.
        record: Box<LockRecord>,
    },
    /// The lock object is not a lock record (see [`LockRecord::parse`]).
    #[error(
        "the lock {key} of cluster {cluster} is unreadable ({reason}); if no kprov command is \
         running on the cluster, remove it with `kprov lock break {cluster}`",
        reason = untrusted(reason)
    )]
    Corrupt {
        /// The cluster whose lock record does not read.
        cluster: String,
        /// The lock's location in the store.
        key: String,
        /// Why it does not parse (stored text: printed escaped).
        reason: String,
    },
    /// Something that is not a lock object sits at the lock's key (a directory, other keys
    /// below it): no command can take the lock until it is removed.
    #[error(
        "the lock {key} of cluster {cluster} is {what}, so no command can take the lock; if no \
         kprov command is running on the cluster, remove it with `kprov lock break {cluster}`"
    )]
    Blocked {
        /// The cluster whose lock key holds something that is not a lock.
        cluster: String,
        /// The lock's location in the store.
        key: String,
        /// What sits there (see [`StateStore::obstruction`]).
        what: String,
    },
    /// A renewal or the release found the lock no longer ours.
    #[error(
        "the lock on cluster {cluster} was lost: {reason}. Someone broke or took over the lock; \
         check `kprov get cluster {cluster}` before retrying"
    )]
    Lost {
        /// The cluster whose lock this command no longer holds.
        cluster: String,
        /// What was found instead of our record.
        reason: String,
    },
    /// The store failed.
    #[error(transparent)]
    State(#[from] StateError),
}

/// Takes the cluster's lock for `command` with a lease of `lease`, renewed in the background
/// every third of the lease until [`LockGuard::release`].
pub async fn acquire(
    store: Arc<dyn StateStore>,
    cluster: &str,
    command: &str,
    lease: Duration,
) -> Result<LockGuard, LockError> {
    let key = ClusterKeys::new(cluster)?.lock();
    let mut last_error = None;
    // One record (one id) for every attempt, so a write of ours that succeeded unseen is
    // recognised below.
    let record = LockRecord::new(command, lease);
    for _ in 0..MAX_ATTEMPTS {
        match store
            .put(&key, record.to_bytes(), Precondition::Absent)
            .await
        {
            Ok(version) => {
                return Ok(LockGuard::start(
                    store, cluster, key, record, version, lease,
                ));
            }
            Err(StateError::AlreadyExists { .. }) => {}
            Err(e) => {
                return Err(blocked(store.as_ref(), cluster, &key)
                    .await?
                    .unwrap_or(e.into()));
            }
        }
        let Some(current) = store.get(&key).await? else {
            if let Some(e) = blocked(store.as_ref(), cluster, &key).await? {
                return Err(e);
            }
            continue; // released between our create and our read: try to create again
        };
        let held = LockRecord::parse(&current.data).map_err(|reason| LockError::Corrupt {
            cluster: cluster.to_string(),
            key: store.key_location(&key),
            reason,
        })?;
        if held.id == record.id {
            // Our own create went through but its reply was lost, and the SDK's retry of it
            // failed the condition: the lock is ours.
            return Ok(LockGuard::start(
                store,
                cluster,
                key,
                record,
                current.version,
                lease,
            ));
        }
        if !held.is_expired(Utc::now()) {
            return Err(LockError::Held {
                cluster: cluster.to_string(),
                record: Box::new(held),
            });
        }
        match store
            .put(
                &key,
                record.to_bytes(),
                Precondition::Matches(current.version),
            )
            .await
        {
            Ok(version) => {
                tracing::warn!(
                    "took over the expired lock of cluster {cluster} held by {}@{} (pid {}) running `{}`, \
                     lease ended {}",
                    untrusted(&held.holder),
                    untrusted(&held.host),
                    held.pid,
                    untrusted(&held.command),
                    when(&held.expires_at)
                );
                return Ok(LockGuard::start(
                    store, cluster, key, record, version, lease,
                ));
            }
            // Another taker won the stale lock, or its holder renewed it: look again.
            Err(e @ (StateError::Conflict { .. } | StateError::AlreadyExists { .. })) => {
                last_error = Some(e);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(last_error
        .unwrap_or_else(|| StateError::Backend {
            location: store.key_location(&key),
            message: format!("the lock changed {MAX_ATTEMPTS} times while acquiring it"),
        })
        .into())
}

/// Like [`acquire`], but while the lock is held by someone else keeps trying until `wait` has
/// passed (a CI job queued behind another, Terraform's `-lock-timeout`). Gives up with the
/// last `Held` error, so the message still names the holder.
pub async fn acquire_waiting(
    store: Arc<dyn StateStore>,
    cluster: &str,
    command: &str,
    lease: Duration,
    wait: Duration,
) -> Result<LockGuard, LockError> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut pause = Duration::from_millis(100);
    loop {
        match acquire(store.clone(), cluster, command, lease).await {
            Err(LockError::Held { .. }) if tokio::time::Instant::now() + pause < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            other => return other,
        }
    }
}

/// `Blocked` when something that is not a lock object sits at the lock's key.
async fn blocked(
    store: &dyn StateStore,
    cluster: &str,
    key: &str,
) -> Result<Option<LockError>, LockError> {
    Ok(store
        .obstruction(key)
        .await?
        .map(|what| LockError::Blocked {
            cluster: cluster.to_string(),
            key: store.key_location(key),
            what,
        }))
}

/// Reads the cluster's lock without touching it (for `kprov lock status`): `Corrupt` or
/// `Blocked` when what sits at its key is not a lock record, never "not locked".
pub async fn read(store: &dyn StateStore, cluster: &str) -> Result<Option<LockRecord>, LockError> {
    let key = ClusterKeys::new(cluster)?.lock();
    let Some(obj) = store.get(&key).await? else {
        return match blocked(store, cluster, &key).await? {
            Some(e) => Err(e),
            None => Ok(None),
        };
    };
    LockRecord::parse(&obj.data)
        .map(Some)
        .map_err(|reason| LockError::Corrupt {
            cluster: cluster.to_string(),
            key: store.key_location(&key),
            reason,
        })
}

/// What [`break_lock`] removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broken {
    /// There was no lock: nothing was removed.
    NotLocked,
    /// A lock record, removed; this is what it said.
    Lock(Box<LockRecord>),
    /// The lock object did not parse; it was removed anyway.
    Unreadable,
    /// Something that was not a lock object sat at the lock's key (`what`, at `location`);
    /// `removed` keys below it were deleted with it.
    Obstruction {
        /// What sat there.
        what: String,
        /// The lock key's location in the store.
        location: String,
        /// How many keys below it were deleted.
        removed: usize,
    },
}

/// Deliberately removes the cluster's lock, whoever holds it and whether or not its lease has
/// expired. The delete is conditional on the version read, so a lock that changed hands in the
/// meantime is not removed blindly: the caller gets a conflict and looks again.
pub async fn break_lock(store: &dyn StateStore, cluster: &str) -> Result<Broken, LockError> {
    let key = ClusterKeys::new(cluster)?.lock();
    let Some(obj) = store.get(&key).await? else {
        let Some(what) = store.obstruction(&key).await? else {
            return Ok(Broken::NotLocked);
        };
        let removed = store.clear_obstruction(&key).await?;
        tracing::warn!("removed {what} at the lock of cluster {cluster}");
        return Ok(Broken::Obstruction {
            what,
            location: store.key_location(&key),
            removed: removed.len(),
        });
    };
    store
        .delete(&key, Precondition::Matches(obj.version))
        .await?;
    Ok(match LockRecord::parse(&obj.data) {
        Ok(record) => {
            tracing::warn!(
                "broke the lock of cluster {cluster} held by {}@{} (pid {}) running `{}` since {}",
                untrusted(&record.holder),
                untrusted(&record.host),
                record.pid,
                untrusted(&record.command),
                when(&record.acquired_at)
            );
            Broken::Lock(Box::new(record))
        }
        Err(_) => Broken::Unreadable,
    })
}

struct Held {
    version: Version,
    record: LockRecord,
    lost: Option<String>,
}

/// A held cluster lock. Call [`LockGuard::release`] when done; dropping the guard stops the
/// renewal and releases the lock from a background task on a best-effort basis (if the process
/// exits first, the lease runs out instead).
pub struct LockGuard {
    store: Arc<dyn StateStore>,
    cluster: String,
    key: String,
    held: Arc<Mutex<Held>>,
    stop: Option<oneshot::Sender<()>>,
    renewer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("cluster", &self.cluster)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    fn start(
        store: Arc<dyn StateStore>,
        cluster: &str,
        key: String,
        record: LockRecord,
        version: Version,
        lease: Duration,
    ) -> LockGuard {
        let held = Arc::new(Mutex::new(Held {
            version,
            record,
            lost: None,
        }));
        let (stop, stopped) = oneshot::channel();
        let renewer = tokio::spawn(renew(
            store.clone(),
            key.clone(),
            held.clone(),
            lease,
            stopped,
        ));
        LockGuard {
            store,
            cluster: cluster.to_string(),
            key,
            held,
            stop: Some(stop),
            renewer: Some(renewer),
        }
    }

    /// The cluster whose lock this is.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The record as last written (renewals move `renewedAt` and `expiresAt`).
    pub fn record(&self) -> LockRecord {
        lock_held(&self.held).record.clone()
    }

    /// Fails once a renewal found the lock broken or taken over: a long command checks this
    /// before each write it makes under the lock.
    pub fn check(&self) -> Result<(), LockError> {
        match &lock_held(&self.held).lost {
            Some(reason) => Err(LockError::Lost {
                cluster: self.cluster.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Stops renewing and deletes the lock, on condition that it is still ours.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.stop_renewal().await;
        self.check()?;
        let version = lock_held(&self.held).version.clone();
        match self
            .store
            .delete(&self.key, Precondition::Matches(version))
            .await
        {
            Ok(()) => Ok(()),
            Err(StateError::Conflict { .. }) => Err(LockError::Lost {
                cluster: self.cluster.clone(),
                reason: "the lock object changed before it was released".into(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    async fn stop_renewal(&mut self) {
        drop(self.stop.take());
        if let Some(renewer) = self.renewer.take() {
            let _ = renewer.await;
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(renewer) = self.renewer.take() else {
            return; // released
        };
        drop(self.stop.take());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, key, held) = (self.store.clone(), self.key.clone(), self.held.clone());
        runtime.spawn(async move {
            // Wait for an in-flight renewal so the delete carries the latest version.
            let _ = renewer.await;
            let (version, lost) = {
                let h = lock_held(&held);
                (h.version.clone(), h.lost.is_some())
            };
            if !lost {
                let _ = store.delete(&key, Precondition::Matches(version)).await;
            }
        });
    }
}

fn lock_held(held: &Mutex<Held>) -> std::sync::MutexGuard<'_, Held> {
    // The data stays consistent even if a holder panicked: every update is a single assignment.
    held.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn renew(
    store: Arc<dyn StateStore>,
    key: String,
    held: Arc<Mutex<Held>>,
    lease: Duration,
    mut stopped: oneshot::Receiver<()>,
) {
    let every = (lease / 3).max(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            () = tokio::time::sleep(every) => {}
        }
        let (version, mut record) = {
            let h = lock_held(&held);
            (h.version.clone(), h.record.clone())
        };
        let now = Utc::now();
        record.renewed_at = now;
        record.expires_at = now + lease_delta(lease);
        match store
            .put(&key, record.to_bytes(), Precondition::Matches(version))
            .await
        {
            Ok(version) => {
                let mut h = lock_held(&held);
                h.version = version;
                h.record = record;
            }
            Err(StateError::Conflict { .. }) => {
                lock_held(&held).lost = Some(format!(
                    "{} changed under the holder while renewing the lease",
                    store.key_location(&key)
                ));
                return;
            }
            // A transient failure: the lease still runs, try again at the next tick.
            Err(e) => tracing::warn!("cannot renew the cluster lock: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(holder: &str, host: &str, command: &str, id: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "holder": holder, "host": host, "pid": 1, "command": command,
            "acquiredAt": "2026-11-22T21:00:00Z", "renewedAt": "2026-11-22T21:00:00Z",
            "expiresAt": "2026-11-22T21:05:00Z", "id": id,
        }))
        .unwrap()
    }

    #[test]
    fn a_lock_record_is_read_by_the_rules_it_is_written_by() {
        let ours = LockRecord::new("kprov edit cluster x", DEFAULT_LEASE);
        assert_eq!(LockRecord::parse(&ours.to_bytes()).unwrap(), ours);
        for (data, reason) in [
            (record("a", "h", "c", "../x"), "is not a lock id"),
            (record("a", "h", "c", ""), "is not a lock id"),
            (
                record(&"a".repeat(257), "h", "c", "ff"),
                "holder is longer than 256",
            ),
            (
                record("a", "h", &"c".repeat(4097), "ff"),
                "command is longer than 4096",
            ),
            (b"{}".to_vec(), "missing field"),
            (vec![b' '; RECORD_LIMIT + 1], "more than a lock record's"),
        ] {
            let e = LockRecord::parse(&data).unwrap_err();
            assert!(e.contains(reason), "{e}");
        }
        let e = LockRecord::parse(&record("a", "h", "c", "\u{1b}[2J")).unwrap_err();
        assert!(e.contains("\\x1b[2J") && !e.contains('\u{1b}'), "{e}");
    }

    proptest! {
        /// Whatever a lock's text fields hold, the "locked by" message is one line without a
        /// control character.
        #[test]
        fn the_locked_by_message_never_passes_a_control_character(
            holder in "\\PC*|[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}\\u{202e}a]{0,40}",
            host in "[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}a\\n]{0,40}",
            command in "[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}\\u{2066}a\\n]{0,80}",
        ) {
            let r = LockRecord::parse(&record(&holder, &host, &command, "ff")).unwrap();
            let e = LockError::Held { cluster: "c".into(), record: Box::new(r) }.to_string();
            prop_assert!(!e.chars().any(|c| c.is_control() || ('\u{2066}'..='\u{2069}').contains(&c) || c == '\u{202e}'), "{e:?}");
        }
    }
}
