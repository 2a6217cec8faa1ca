//! `file://DIR`: a state store in a local directory, one file per key.
//!
//! It gives the same compare-and-swap guarantees as the S3 backend's conditional writes, across
//! threads and processes: every write or delete holds an exclusive `flock` on `DIR/.kprov.lock`
//! while it compares the current version and renames the new content into place. Readers take
//! no lock: a rename replaces a file atomically, so a reader sees the old or the new content,
//! never a mix. The version of an object is the sha256 of its content.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::{Object, Precondition, StateError, StateStore, Version};

const LOCK_FILE: &str = ".kprov.lock";

/// The `file://DIR` backend: one file per key below a directory, written through a
/// temporary file and a rename, compare-and-swap under a store-wide lock file.
#[derive(Debug, Clone)]
pub struct FileStore {
    root: PathBuf,
}

impl FileStore {
    /// A store rooted at `root` (made absolute; created on the first write, so read-only
    /// commands on a fresh machine leave nothing behind).
    pub fn new(root: impl AsRef<Path>) -> Result<FileStore, StateError> {
        let root = root.as_ref();
        let root = std::path::absolute(root).map_err(|e| StateError::InvalidUrl {
            url: format!("file://{}", root.display()),
            reason: format!("cannot make the path absolute: {e}"),
        })?;
        if root.exists() && !root.is_dir() {
            return Err(StateError::InvalidUrl {
                url: format!("file://{}", root.display()),
                reason: "the path exists and is not a directory".into(),
            });
        }
        Ok(FileStore { root })
    }

    /// The store's directory, absolute.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn io_err(&self, key: &str, what: &str, e: io::Error) -> StateError {
        StateError::Backend {
            location: self.key_location(key),
            message: format!("{what}: {e}"),
        }
    }

    fn read(&self, key: &str) -> Result<Option<Object>, StateError> {
        let file = match File::open(self.root.join(key)) {
            Ok(f) => f,
            Err(e) if absent(&e) => return Ok(None),
            Err(e) => return Err(self.io_err(key, "cannot read", e)),
        };
        // A tampered store could hold a huge object (or a link to /dev/zero).
        match crate::bounded::read(file, key, crate::bounded::STATE_OBJECT) {
            Ok(data) => Ok(Some(Object {
                version: version_of(&data),
                data: Bytes::from(data),
            })),
            // A key that is a "directory" of other keys does not exist, as in S3.
            Err(e) if e.io_kind() == Some(io::ErrorKind::IsADirectory) => Ok(None),
            Err(e @ crate::bounded::ReadError::TooLarge { .. }) => Err(StateError::Backend {
                location: self.key_location(key),
                message: e.to_string(),
            }),
            Err(e) => Err(StateError::Backend {
                location: self.key_location(key),
                message: format!("cannot read: {e}"),
            }),
        }
    }

    /// Takes the store-wide write lock; released when the returned file is dropped.
    fn lock(&self, key: &str) -> Result<File, StateError> {
        create_private_dir(&self.root)
            .map_err(|e| self.io_err(key, "cannot create the store directory", e))?;
        let path = self.root.join(LOCK_FILE);
        // The error is about the store's own lock file, not about the key being written: it
        // names that file, and when something else sits there, how to clear it.
        let lock_err = |what: &str, e: io::Error| {
            let fix = match fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => format!(
                    "; {} is a directory, not kprov's store lock file: no write to the store can \
                     proceed until it is gone (it is not a state-store key; move it away or \
                     remove it with `rm -r -- '{}'`)",
                    path.display(),
                    path.display()
                ),
                Ok(m) if !m.is_file() => format!(
                    "; {} is not a regular file: remove it (`rm -- '{}'`) and kprov recreates it",
                    path.display(),
                    path.display()
                ),
                _ => String::new(),
            };
            StateError::Backend {
                location: format!("{} (store lock)", self.location()),
                message: format!("{what} {}: {e}{fix}", path.display()),
            }
        };
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| lock_err("cannot open the store lock file", e))?;
        lock.lock()
            .map_err(|e| lock_err("cannot lock the store with", e))?;
        Ok(lock)
    }

    fn check(
        &self,
        key: &str,
        current: Option<&Object>,
        cond: &Precondition,
    ) -> Result<(), StateError> {
        match (cond, current) {
            (Precondition::None, _) | (Precondition::Absent, None) => Ok(()),
            (Precondition::Absent, Some(_)) => Err(StateError::AlreadyExists {
                location: self.location(),
                key: key.to_string(),
            }),
            (Precondition::Matches(v), Some(cur)) if &cur.version == v => Ok(()),
            (Precondition::Matches(v), _) => Err(StateError::Conflict {
                location: self.location(),
                key: key.to_string(),
                expected: v.to_string(),
            }),
        }
    }

    fn write(&self, key: &str, data: &[u8], cond: &Precondition) -> Result<Version, StateError> {
        super::validate_key(key)?;
        let _lock = self.lock(key)?;
        let current = self.read(key)?;
        self.check(key, current.as_ref(), cond)?;
        let path = self.root.join(key);
        let dir = path.parent().unwrap_or(&self.root);
        create_private_dir(dir).map_err(|e| {
            self.io_err(
                key,
                "cannot create its directory (is a parent key a file?)",
                e,
            )
        })?;
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let tmp = dir.join(format!(
            ".{name}.tmp-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        remove_leftovers(dir, &name);
        let result = write_synced(&tmp, data).and_then(|()| fs::rename(&tmp, &path));
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            // Only a directory in the way means the key clashes with a prefix of others; a
            // full disk or a read-only file system must not be explained as that.
            let what = if matches!(
                e.kind(),
                io::ErrorKind::IsADirectory
                    | io::ErrorKind::NotADirectory
                    | io::ErrorKind::DirectoryNotEmpty
            ) {
                "cannot write (is it also a prefix of other keys?)"
            } else {
                "cannot write (the stored object is unchanged)"
            };
            return Err(self.io_err(key, what, e));
        }
        // The rename is only durable once the directory entry is on disk.
        sync_dir(dir).map_err(|e| self.io_err(key, "cannot sync its directory", e))?;
        Ok(version_of(data))
    }

    fn remove(&self, key: &str, cond: &Precondition) -> Result<(), StateError> {
        super::validate_key(key)?;
        if !self.root.exists() {
            return self.check(key, None, cond);
        }
        let _lock = self.lock(key)?;
        let current = self.read(key)?;
        self.check(key, current.as_ref(), cond)?;
        if current.is_none() {
            return Ok(());
        }
        let path = self.root.join(key);
        fs::remove_file(&path).map_err(|e| self.io_err(key, "cannot delete", e))?;
        let mut dir = path.parent();
        if let Some(d) = dir {
            sync_dir(d).map_err(|e| self.io_err(key, "cannot sync its directory", e))?;
        }
        // Empty directories are invisible to list() but would pile up; the lock keeps a
        // concurrent write from losing its directory between create_dir_all and rename.
        while let Some(d) = dir {
            if d == self.root || fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
        Ok(())
    }

    fn walk(&self, prefix: &str) -> Result<Vec<String>, StateError> {
        super::validate_prefix(prefix)?;
        // Only the directory part of the prefix can be walked; the rest filters names, which
        // gives S3's plain string-prefix semantics.
        let base = prefix.rfind('/').map_or("", |i| &prefix[..=i]);
        let mut keys = Vec::new();
        let mut pending = vec![(self.root.join(base), base.to_string())];
        while let Some((dir, rel)) = pending.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if absent(&e) => continue,
                Err(e) => return Err(self.io_err(&rel, "cannot list", e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| self.io_err(&rel, "cannot list", e))?;
                let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                    tracing::warn!(path = %entry.path().display(), "skipping a file whose name is not UTF-8");
                    continue;
                };
                if name.starts_with('.') {
                    continue; // the lock file and in-flight temporary files
                }
                let key = format!("{rel}{name}");
                let ft = entry
                    .file_type()
                    .map_err(|e| self.io_err(&key, "cannot stat", e))?;
                if ft.is_dir() {
                    pending.push((entry.path(), format!("{key}/")));
                } else if (ft.is_file() || entry.path().is_file()) && key.starts_with(prefix) {
                    keys.push(key);
                }
            }
        }
        keys.sort();
        Ok(keys)
    }
}

/// Removes the temporary files of `name` left in `dir` by a writer that died between writing
/// and renaming (killed, power cut). Called with the store lock held: every writer holds it
/// while its temporary file exists, so any such file found now belongs to a dead writer.
fn remove_leftovers(dir: &Path, name: &str) {
    let prefix = format!(".{name}.tmp-");
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            // Best effort: a leftover that cannot be removed is only clutter, never read.
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Whether `e` says there is nothing at the path. A key that lies below a key (a file where a
/// directory would be) does not exist either, as in S3.
fn absent(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

fn version_of(data: &[u8]) -> Version {
    Version(hex::encode(Sha256::digest(data)))
}

fn write_synced(path: &Path, data: &[u8]) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// The store will hold PKI and secrets: only its owner may read it, whatever the umask.
fn create_private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Runs blocking file work off the async runtime's worker threads (flock waits block).
async fn blocking<T: Send + 'static>(
    store: &FileStore,
    f: impl FnOnce(&FileStore) -> Result<T, StateError> + Send + 'static,
) -> Result<T, StateError> {
    let store = store.clone();
    let location = store.location();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(|e| StateError::Backend {
            location,
            message: format!("file store task failed: {e}"),
        })?
}

#[async_trait::async_trait]
impl StateStore for FileStore {
    fn location(&self) -> String {
        format!("file://{}", self.root.display())
    }

    async fn get(&self, key: &str) -> Result<Option<Object>, StateError> {
        super::validate_key(key)?;
        let key = key.to_string();
        blocking(self, move |s| s.read(&key)).await
    }

    async fn put(&self, key: &str, data: Bytes, cond: Precondition) -> Result<Version, StateError> {
        let key = key.to_string();
        blocking(self, move |s| s.write(&key, &data, &cond)).await
    }

    async fn delete(&self, key: &str, cond: Precondition) -> Result<(), StateError> {
        let key = key.to_string();
        blocking(self, move |s| s.remove(&key, &cond)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StateError> {
        let prefix = prefix.to_string();
        blocking(self, move |s| s.walk(&prefix)).await
    }

    async fn obstruction(&self, key: &str) -> Result<Option<String>, StateError> {
        super::validate_key(key)?;
        let path = self.root.join(key);
        Ok(match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {
                let below = self.list(&format!("{key}/")).await?;
                Some(match super::describe_keys_below(&below) {
                    Some(d) => format!("a directory, {d}"),
                    None => "an empty directory, not an object".to_string(),
                })
            }
            Ok(m) if !m.is_file() && !m.file_type().is_symlink() => {
                Some("not a regular file".to_string())
            }
            _ => None,
        })
    }

    async fn clear_obstruction(&self, key: &str) -> Result<Vec<String>, StateError> {
        super::validate_key(key)?;
        let below = self.list(&format!("{key}/")).await?;
        for k in &below {
            self.delete(k, Precondition::None).await?;
        }
        let key = key.to_string();
        blocking(self, move |s| {
            let _lock = s.lock(&key)?;
            let path = s.root.join(&key);
            match fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => {
                    remove_empty_dirs(&path).map_err(|e| {
                        s.io_err(
                            &key,
                            &format!(
                                "cannot remove the directory (it holds files that are not \
                                 state-store keys: hidden or not UTF-8); look at them, then \
                                 remove it with `rm -r -- '{}'`",
                                path.display()
                            ),
                            e,
                        )
                    })?;
                }
                Ok(m) if !m.is_file() && !m.file_type().is_symlink() => {
                    fs::remove_file(&path).map_err(|e| s.io_err(&key, "cannot remove", e))?;
                }
                _ => {}
            }
            Ok(())
        })
        .await?;
        Ok(below)
    }
}

/// Removes `dir` and the empty directories below it, deepest first; fails on anything else.
fn remove_empty_dirs(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_empty_dirs(&entry.path())?;
        }
    }
    fs::remove_dir(dir)
}
