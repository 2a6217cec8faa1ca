//! The state store: where cluster specs (and later PKI, host keys, journals) live.
//!
//! Every write is a compare-and-swap so two operators never lose each other's update:
//! a create only succeeds if the key is absent, an update only if the key still has the
//! version the writer read. Backends: `file://DIR` (default) and `s3://BUCKET/PREFIX`.

use std::fmt;

use bytes::Bytes;

/// Opaque version of a stored object: an S3 ETag, or a content hash for the file backend.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Version(pub String);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Condition a write must satisfy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Precondition {
    /// Write whatever is there (used only where losing a race is harmless).
    None,
    /// The key must not exist (create).
    Absent,
    /// The key must still be at this version (update, delete).
    Matches(Version),
}

#[derive(Debug, Clone)]
pub struct Object {
    pub data: Bytes,
    pub version: Version,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "{location}: {key} was changed by someone else since it was read (expected version {expected}); re-read and retry"
    )]
    Conflict {
        location: String,
        key: String,
        expected: String,
    },
    #[error("{location}: {key} already exists")]
    AlreadyExists { location: String, key: String },
    #[error("{location}: {key} does not exist")]
    NotFound { location: String, key: String },
    #[error("invalid state store URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("{location}: {message}")]
    Backend { location: String, message: String },
}

/// A key-value store with compare-and-swap writes. Keys are `/`-separated relative paths
/// (`demo.example.com/config`); backends map them onto files or S3 object keys.
#[async_trait::async_trait]
pub trait StateStore: Send + Sync + fmt::Debug {
    /// Human-readable location of the store (`file:///path`, `s3://bucket/prefix`), for messages.
    fn location(&self) -> String;
    /// Human-readable location of one key, for error messages that name a "file".
    fn key_location(&self, key: &str) -> String {
        format!("{}/{}", self.location().trim_end_matches('/'), key)
    }
    async fn get(&self, key: &str) -> Result<Option<Object>, StateError>;
    async fn put(&self, key: &str, data: Bytes, cond: Precondition) -> Result<Version, StateError>;
    async fn delete(&self, key: &str, cond: Precondition) -> Result<(), StateError>;
    /// Keys below `prefix` (recursive), sorted.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StateError>;
}
