//! A command's session with the state store (issue 19): the store opened once, and the one
//! way a use case takes a cluster's lock ([`Session::with_lock`]).

use std::sync::Arc;
use std::time::Duration;

use crate::repo::Repo;
use crate::spec::ResolvedCluster;
use crate::state::lock::{self, LockError, LockGuard};
use crate::state::{StateError, StateStore, Versioning};

/// The lease of a command's cluster lock, renewed in the background while it is held.
pub(crate) const LOCK_LEASE: Duration = Duration::from_secs(300);

/// The state store a command works on.
#[derive(Clone)]
pub(crate) struct Session {
    store: Arc<dyn StateStore>,
}

/// The store a command uses: the `--state` flag's (clap fills it from `KPROV_STATE_STORE`),
/// else the default ([`crate::state::resolve`]).
pub(crate) fn store_url(flag: Option<&str>) -> String {
    crate::state::resolve(flag, None)
}

impl Session {
    pub(crate) fn new(store: Arc<dyn StateStore>) -> Session {
        Session { store }
    }

    /// Opens the store at `url` (`file://`, `s3://`): once per command.
    pub(crate) async fn open(url: &str) -> Result<Session, StateError> {
        Ok(Session::new(crate::state::open(url).await?))
    }

    pub(crate) fn store(&self) -> &Arc<dyn StateStore> {
        &self.store
    }

    /// The clusters in the store.
    pub(crate) fn repo(&self) -> Repo {
        Repo::new(self.store.clone())
    }

    /// Teams rely on S3 versioning to recover from mistakes: a warning when it is off or
    /// cannot be confirmed.
    pub(crate) async fn versioning_warning(&self) -> Option<String> {
        let store = &self.store;
        match store.check_versioning().await {
            Versioning::Enabled | Versioning::NotApplicable => None,
            Versioning::Suspended | Versioning::Disabled => Some(format!(
                "{} has no object versioning: an overwritten or deleted spec cannot be recovered; enable versioning on the bucket",
                store.location()
            )),
            Versioning::Unknown(why) => Some(format!(
                "could not confirm object versioning on {} ({why})",
                store.location()
            )),
        }
    }

    /// `name` from the store, resolved once ([`crate::spec::resolve`]).
    pub(crate) async fn resolve(&self, name: &str) -> anyhow::Result<ResolvedCluster> {
        let repo = self.repo();
        let stored = repo.get(name).await?;
        Ok(stored.resolve(&repo.location())?)
    }

    /// Runs `work` holding `cluster`'s lock for `command`. The lock is released whatever the
    /// work returns; when both the work and the release fail, the work's error is the one
    /// returned.
    pub(crate) async fn with_lock<T, E: From<LockError>>(
        &self,
        cluster: &str,
        command: &str,
        work: impl AsyncFnOnce(&LockGuard) -> Result<T, E>,
    ) -> Result<T, E> {
        let guard = lock::acquire(self.store.clone(), cluster, command, LOCK_LEASE).await?;
        let result = work(&guard).await;
        let released = guard.release().await;
        let value = result?;
        released?;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::file::FileStore;

    fn session() -> (tempfile::TempDir, Session) {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn StateStore> = Arc::new(FileStore::new(dir.path()).unwrap());
        (dir, Session::new(store))
    }

    #[tokio::test]
    async fn the_lock_is_held_during_the_work_and_released_after_it_whatever_it_returns() {
        let (_dir, s) = session();
        let held = s
            .with_lock("c1", "test ok", async |guard| {
                let seen = lock::read(s.store().as_ref(), "c1").await?;
                assert_eq!(seen.map(|r| r.command), Some("test ok".to_string()));
                assert!(guard.check().is_ok());
                anyhow::Ok(7)
            })
            .await
            .unwrap();
        assert_eq!(held, 7);
        assert!(
            lock::read(s.store().as_ref(), "c1")
                .await
                .unwrap()
                .is_none()
        );
        let failed = s
            .with_lock("c1", "test err", async |_| -> anyhow::Result<()> {
                anyhow::bail!("the work's own error")
            })
            .await
            .unwrap_err();
        assert_eq!(failed.to_string(), "the work's own error");
        assert!(
            lock::read(s.store().as_ref(), "c1")
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_lock_held_by_another_command_refuses_the_work_without_running_it() {
        let (_dir, s) = session();
        let other = lock::acquire(s.store().clone(), "c1", "other", LOCK_LEASE)
            .await
            .unwrap();
        let mut ran = false;
        let refused = s
            .with_lock("c1", "mine", async |_| {
                ran = true;
                Ok::<_, LockError>(())
            })
            .await
            .unwrap_err();
        assert!(matches!(refused, LockError::Held { .. }), "{refused}");
        assert!(!ran);
        other.release().await.unwrap();
    }
}
