//! An in-memory `StateStore` with real compare-and-swap semantics, for tests that need a store
//! but not a particular backend.

use std::collections::BTreeMap;
use std::sync::Mutex;

use bytes::Bytes;
use kprov::state::{Object, Precondition, StateError, StateStore, Version};
use sha2::{Digest, Sha256};

#[derive(Debug, Default)]
pub struct MemStore {
    objects: Mutex<BTreeMap<String, Bytes>>,
}

fn version(data: &[u8]) -> Version {
    Version(hex::encode(Sha256::digest(data)))
}

impl MemStore {
    fn check(
        &self,
        key: &str,
        current: Option<&Bytes>,
        cond: &Precondition,
    ) -> Result<(), StateError> {
        match (cond, current) {
            (Precondition::None, _) => Ok(()),
            (Precondition::Absent, None) => Ok(()),
            (Precondition::Absent, Some(_)) => Err(StateError::AlreadyExists {
                location: self.location(),
                key: key.to_string(),
            }),
            (Precondition::Matches(v), Some(cur)) if version(cur) == *v => Ok(()),
            (Precondition::Matches(v), _) => Err(StateError::Conflict {
                location: self.location(),
                key: key.to_string(),
                expected: v.0.clone(),
            }),
        }
    }
}

#[async_trait::async_trait]
impl StateStore for MemStore {
    fn location(&self) -> String {
        "mem://".to_string()
    }

    async fn get(&self, key: &str) -> Result<Option<Object>, StateError> {
        let objects = self.objects.lock().expect("store lock");
        Ok(objects.get(key).map(|data| Object {
            data: data.clone(),
            version: version(data),
        }))
    }

    async fn put(&self, key: &str, data: Bytes, cond: Precondition) -> Result<Version, StateError> {
        let mut objects = self.objects.lock().expect("store lock");
        self.check(key, objects.get(key), &cond)?;
        let v = version(&data);
        objects.insert(key.to_string(), data);
        Ok(v)
    }

    async fn delete(&self, key: &str, cond: Precondition) -> Result<(), StateError> {
        let mut objects = self.objects.lock().expect("store lock");
        self.check(key, objects.get(key), &cond)?;
        objects.remove(key);
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StateError> {
        let objects = self.objects.lock().expect("store lock");
        Ok(objects
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect())
    }
}
