//! The state store: where cluster specs (and later PKI, host keys, journals) live.
//!
//! Every write is a compare-and-swap so two operators never lose each other's update:
//! a create only succeeds if the key is absent, an update only if the key still has the
//! version the writer read. Backends: `file://DIR` (default) and `s3://BUCKET/PREFIX`.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

pub mod file;
pub mod layout;
pub mod lock;
pub mod s3;
#[cfg(test)]
pub(crate) mod testing;
pub mod url;

pub use url::StoreUrl;

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

/// One stored object as read.
#[derive(Debug, Clone)]
pub struct Object {
    /// Its content, untrusted: whoever can write the store can change it.
    pub data: Bytes,
    /// The version a conditional write of the key must match.
    pub version: Version,
}

/// Why a state-store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A `Precondition::Matches` write found another version: someone else wrote the key.
    #[error(
        "{location}: {key} was changed by someone else since it was read (expected version {expected}); re-read and retry"
    )]
    Conflict {
        /// The store's location.
        location: String,
        /// The key written.
        key: String,
        /// The version the writer had read.
        expected: String,
    },
    /// A `Precondition::Absent` write (a create) found the key there.
    #[error("{location}: {key} already exists")]
    AlreadyExists {
        /// The store's location.
        location: String,
        /// The key written.
        key: String,
    },
    /// The store URL cannot be used (unknown scheme, no bucket, a path that is not a
    /// directory).
    #[error("invalid state store URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A key or prefix breaks the key rules (see [`validate_key`]), or a name makes such a key.
    #[error("invalid state store key {key:?}: {reason}")]
    InvalidKey {
        /// The key, prefix or name as given.
        key: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// The backend failed: I/O, S3, an object over the size limit.
    #[error("{location}: {message}")]
    Backend {
        /// The key's location, or the store's.
        location: String,
        /// The backend's message.
        message: String,
    },
}

/// Whether an S3 bucket keeps old versions of objects: without versioning an overwritten or
/// deleted spec is gone for good, so the CLI warns about anything but `Enabled`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Versioning {
    /// Old versions are kept.
    Enabled,
    /// Versioning was on and is paused: objects written since have no old versions.
    Suspended,
    /// Versioning was never turned on for the bucket.
    Disabled,
    /// The bucket could not tell (the reply did not parse, or access was denied); the reason
    /// is for the warning.
    Unknown(String),
    /// The backend has no notion of versions (a local directory).
    NotApplicable,
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
    /// The object at `key`, or `None` when there is none.
    async fn get(&self, key: &str) -> Result<Option<Object>, StateError>;
    /// Writes `data` at `key` if `cond` holds; returns the new version.
    async fn put(&self, key: &str, data: Bytes, cond: Precondition) -> Result<Version, StateError>;
    /// Deletes `key` if `cond` holds; an absent key with [`Precondition::None`] is no error.
    async fn delete(&self, key: &str, cond: Precondition) -> Result<(), StateError>;
    /// Keys below `prefix` (recursive), sorted. `prefix` is a plain string prefix, as in S3:
    /// `demo` matches `demo.example.com/config`; end it with `/` to mean a directory.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StateError>;
    /// Whether old versions of objects are kept (see [`Versioning`]).
    async fn check_versioning(&self) -> Versioning {
        Versioning::NotApplicable
    }
    /// What sits at `key` when it holds no object but something in its place stops a write
    /// to it: on the file store a directory (a key that is also a prefix of other keys), or
    /// something that is not a regular file. `None` when the key is simply absent or an
    /// object. S3 has no such shape (`a` and `a/b` are independent objects), hence the
    /// default. Commands ask this before saying "not found" or "not locked", so an odd shape
    /// is reported as what it is, with the key.
    async fn obstruction(&self, _key: &str) -> Result<Option<String>, StateError> {
        Ok(None)
    }
    /// Removes what [`StateStore::obstruction`] reports at `key` (on the file store: every
    /// key below the directory, then the directory). Returns the keys deleted. Only commands
    /// that clear an odd shape on the operator's request call it (`lock break`, `delete
    /// cluster --yes`).
    async fn clear_obstruction(&self, _key: &str) -> Result<Vec<String>, StateError> {
        Ok(Vec::new())
    }
}

/// Refuses state-store bytes longer than `max` before anything parses them (the content is
/// untrusted): the message gives their length and `limit`, the maximum as the reader names it
/// ("a lock record's 65536").
pub(crate) fn check_size(data: &[u8], max: usize, limit: impl fmt::Display) -> Result<(), String> {
    if data.len() > max {
        return Err(format!("{} bytes, more than {limit}", data.len()));
    }
    Ok(())
}

/// "a prefix of 2 other keys (a/lock/x, a/lock/y)", or `None` for no keys.
pub fn describe_keys_below(below: &[String]) -> Option<String> {
    if below.is_empty() {
        return None;
    }
    let shown: Vec<String> = below
        .iter()
        .take(3)
        .map(|k| crate::output::untrusted(k).to_string())
        .collect();
    let more = if below.len() > 3 { ", ..." } else { "" };
    Some(format!(
        "not an object but a prefix of {} other key{} ({}{more})",
        below.len(),
        if below.len() == 1 { "" } else { "s" },
        shown.join(", ")
    ))
}

/// The state store location used when neither `--state` nor `KPROV_STATE_STORE` is set.
pub const DEFAULT_STORE_DIR: &str = ".kprov/state";
/// Environment variable naming the state store, like kops's `KOPS_STATE_STORE`.
pub const STORE_ENV: &str = "KPROV_STATE_STORE";

/// Picks the store URL: the `--state` flag, else `KPROV_STATE_STORE`, else
/// `file://$HOME/.kprov/state`. Empty values count as unset, so `KPROV_STATE_STORE=` in a
/// script does not turn into an invalid URL.
pub fn resolve(flag: Option<&str>, env: Option<&str>) -> String {
    let chosen = [flag, env]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|s| !s.is_empty());
    match chosen {
        Some(s) => s.to_string(),
        None => {
            let home = std::env::home_dir().unwrap_or_else(|| std::path::PathBuf::from("."));
            format!("file://{}", home.join(DEFAULT_STORE_DIR).display())
        }
    }
}

/// Opens the store a URL names. S3 uses the AWS SDK's default chain (`AWS_ENDPOINT_URL`,
/// `AWS_PROFILE`, environment and instance credentials, ...).
pub async fn open(url: &str) -> Result<Arc<dyn StateStore>, StateError> {
    match StoreUrl::parse(url)? {
        StoreUrl::File(dir) => Ok(Arc::new(file::FileStore::new(dir)?)),
        StoreUrl::S3 { bucket, prefix } => {
            let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
                .load()
                .await;
            Ok(Arc::new(s3::S3Store::open(&sdk, &bucket, &prefix).await))
        }
    }
}

/// Checks a key: `/`-separated relative path of non-empty segments, none of them `.`, `..`
/// or hidden (a leading `.` is reserved for the file backend's lock and temporary files), no
/// backslashes or control characters (they would mean different things on different backends).
pub fn validate_key(key: &str) -> Result<(), StateError> {
    let bad = |reason: &str| {
        Err(StateError::InvalidKey {
            key: key.to_string(),
            reason: reason.to_string(),
        })
    };
    if key.is_empty() {
        return bad("the key is empty");
    }
    if key.starts_with('/') {
        return bad("keys are relative to the store; remove the leading '/'");
    }
    if key.len() > 900 {
        return bad("the key is longer than 900 bytes");
    }
    if key.contains('\\') {
        return bad("backslashes are not allowed; separate segments with '/'");
    }
    if key.chars().any(char::is_control) {
        return bad("control characters are not allowed");
    }
    for segment in key.split('/') {
        if segment.is_empty() {
            return bad("empty path segment ('//' or a trailing '/')");
        }
        if segment == "." || segment == ".." {
            return bad("'.' and '..' segments are not allowed");
        }
        if segment.starts_with('.') {
            return bad("segments must not start with '.' (reserved for the store itself)");
        }
    }
    Ok(())
}

/// Checks a list prefix: empty (everything), or a key, optionally ending in `/`.
pub fn validate_prefix(prefix: &str) -> Result<(), StateError> {
    let trimmed = prefix.strip_suffix('/').unwrap_or(prefix);
    if prefix.is_empty() {
        return Ok(());
    }
    validate_key(trimmed).map_err(|e| match e {
        StateError::InvalidKey { reason, .. } => StateError::InvalidKey {
            key: prefix.to_string(),
            reason,
        },
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The limit is inclusive, and the refusal names the length and the limit as given.
    #[test]
    fn check_size_accepts_the_limit_and_refuses_one_byte_more() {
        assert_eq!(check_size(&[0; 4], 4, "four"), Ok(()));
        assert_eq!(
            check_size(&[0; 5], 4, format_args!("a record's {}", 4)),
            Err("5 bytes, more than a record's 4".to_string())
        );
    }

    #[test]
    fn resolve_prefers_flag_then_env_then_home() {
        assert_eq!(resolve(Some("s3://a-b-c"), Some("file:///x")), "s3://a-b-c");
        assert_eq!(resolve(None, Some("file:///x")), "file:///x");
        assert_eq!(resolve(Some("  "), Some("file:///x")), "file:///x");
        let default = resolve(None, Some(""));
        assert!(default.starts_with("file://"), "{default}");
        assert!(default.ends_with("/.kprov/state"), "{default}");
        assert!(StoreUrl::parse(&default).is_ok());
    }

    #[test]
    fn keys_that_could_escape_or_differ_between_backends_are_refused() {
        for (key, reason) in [
            ("", "empty"),
            ("/etc/passwd", "leading '/'"),
            ("a/../../etc", "'..'"),
            ("a/./b", "'.'"),
            ("a//b", "empty path segment"),
            ("a/b/", "empty path segment"),
            ("a/.kprov.lock", "must not start with '.'"),
            ("a\\b", "backslashes"),
            ("a\nb", "control characters"),
        ] {
            let e = validate_key(key).unwrap_err().to_string();
            assert!(e.contains(reason), "{key:?}: {e}");
            assert!(e.contains(&format!("{key:?}")), "{key:?}: {e}");
        }
        validate_key("demo.example.com/instancegroup/nodes-a").unwrap();
        validate_prefix("").unwrap();
        validate_prefix("demo.example.com/").unwrap();
        validate_prefix("demo").unwrap();
        assert!(validate_prefix("../").is_err());
    }

    proptest! {
        #[test]
        fn key_validation_never_panics_and_accepted_keys_stay_inside(s in "\\PC{0,60}") {
            if validate_key(&s).is_ok() {
                let p = std::path::Path::new(&s);
                prop_assert!(p.is_relative());
                prop_assert!(p.components().all(|c| matches!(c, std::path::Component::Normal(_))));
            }
            let _ = validate_prefix(&s);
        }

        #[test]
        fn segment_soup_never_panics(parts in proptest::collection::vec("(\\.\\.|\\.|[a-z]{0,3}|/)", 0..8)) {
            let key = parts.concat();
            if validate_key(&key).is_ok() {
                prop_assert!(!key.split('/').any(|s| s.is_empty() || s == ".." || s == "."));
            }
        }
    }
}
