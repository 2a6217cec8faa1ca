//! A state store test double: one wrapper that counts, fails or delays writes, for the
//! tests of what kprov does around a slow or broken store.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{Object, Precondition, StateError, StateStore, Version};

/// Forwards to `inner`; every write is counted (with the time `inner` took for it), fails
/// while [`HookedStore::failing`] is set, and a write of the slow key (if any) first says it
/// started ([`HookedStore::started`]) and then waits. Reads, deletes and lists pass through.
#[derive(Debug)]
pub(crate) struct HookedStore<S> {
    inner: S,
    writes: Mutex<(u32, Duration)>,
    failing: AtomicBool,
    slow: Option<(String, Duration)>,
    started: tokio::sync::Notify,
}

impl<S: StateStore> HookedStore<S> {
    pub(crate) fn new(inner: S) -> Self {
        HookedStore {
            inner,
            writes: Mutex::new((0, Duration::ZERO)),
            failing: AtomicBool::new(false),
            slow: None,
            started: tokio::sync::Notify::new(),
        }
    }

    /// Writes of `key` take `delay` more.
    pub(crate) fn slow_key(mut self, key: impl Into<String>, delay: Duration) -> Self {
        self.slow = Some((key.into(), delay));
        self
    }

    /// Set it and every write fails as an unreachable store's would.
    pub(crate) fn failing(&self) -> &AtomicBool {
        &self.failing
    }

    /// Notified (one permit) when a write of the slow key starts.
    pub(crate) fn started(&self) -> &tokio::sync::Notify {
        &self.started
    }

    /// The writes made so far and the time the inner store took for them.
    pub(crate) fn writes(&self) -> (u32, Duration) {
        *self.writes.lock().expect("write counter")
    }
}

#[async_trait::async_trait]
impl<S: StateStore> StateStore for HookedStore<S> {
    fn location(&self) -> String {
        self.inner.location()
    }
    async fn get(&self, key: &str) -> Result<Option<Object>, StateError> {
        self.inner.get(key).await
    }
    async fn put(&self, key: &str, data: Bytes, cond: Precondition) -> Result<Version, StateError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StateError::Backend {
                location: self.location(),
                message: "the store is unreachable".into(),
            });
        }
        if let Some((slow, delay)) = &self.slow
            && slow == key
        {
            self.started.notify_one();
            tokio::time::sleep(*delay).await;
        }
        let start = Instant::now();
        let r = self.inner.put(key, data, cond).await;
        let mut w = self.writes.lock().expect("write counter");
        w.0 += 1;
        w.1 += start.elapsed();
        r
    }
    async fn delete(&self, key: &str, cond: Precondition) -> Result<(), StateError> {
        self.inner.delete(key, cond).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StateError> {
        self.inner.list(prefix).await
    }
}
