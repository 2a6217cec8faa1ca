//! `edit cluster|ig`, without the command line: [`plan`] reads the object to edit and writes
//! it to a private temporary file; [`EditPlan::review`] runs the caller's editor (the one
//! piece of the terminal in here, passed in as a closure) until the text is valid, cancelled
//! or still invalid after a second try; [`apply`] stores it under the caller's lock.
//!
//! The edited text is parsed and validated before anything is written; an invalid edit is
//! reopened with the errors as comments, and never saved. The write is conditional on the
//! version read before editing, so a concurrent change by someone else is refused and the
//! edited copy kept on disk ([`EditPlan::keep`]) instead of being lost.
//!
//! ```text
//! let plan = ops::edit::plan(&repo, cluster, group).await?;
//! match plan.review(&mut editor)? { Review::Edited(object) => ..., Review::Cancelled(why) => ... }
//! session.with_lock(cluster, "edit", |guard| ops::edit::apply(&repo, &plan, &object, guard))
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};

use crate::repo::{Repo, RepoError, StoredCluster, resolve_with_docs};
use crate::spec::{self, InstanceGroup, Loaded, Object, ObjectRef};
use crate::state::StateError;
use crate::state::lock::{LockError, LockGuard};

const HEADER: &str = "# Please edit the object below. Lines beginning with '#' are ignored; an empty\n# file aborts the edit. The object is validated before it is saved.\n";

/// An object opened for editing: the stored cluster as read (its versions are what the save
/// is conditional on) and the temporary file the editor works on.
pub(crate) struct EditPlan {
    pub cluster: String,
    /// The instance group edited; the cluster when `None`.
    pub group: Option<String>,
    stored: StoredCluster,
    /// The object as YAML, as it was read.
    original: String,
    /// Kept for the temporary file's lifetime.
    _dir: tempfile::TempDir,
    path: PathBuf,
    /// Where a kept copy goes; `None` for [`edits_dir`] (a test names its own).
    keep_in: Option<PathBuf>,
}

/// What the editing ended with.
#[derive(Debug)]
pub(crate) enum Review {
    /// A valid object, different from the stored one.
    Edited(Box<Object>),
    /// Nothing to save.
    Cancelled(Cancelled),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cancelled {
    /// The file was emptied.
    Emptied,
    /// The text is the object as it was.
    Unchanged,
}

/// Why the save failed; the user's copy is kept either way.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EditError {
    /// The cluster's lock could not be taken, or was lost.
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

impl From<RepoError> for EditError {
    fn from(e: RepoError) -> Self {
        EditError::Failed(e.into())
    }
}

impl EditError {
    /// Whether someone else wrote the object since it was read.
    pub(crate) fn conflict(&self) -> bool {
        match self {
            EditError::Lock(_) => false,
            EditError::Failed(e) => e.chain().any(|c| {
                matches!(
                    c.downcast_ref::<RepoError>(),
                    Some(RepoError::State(StateError::Conflict { .. }))
                ) || matches!(
                    c.downcast_ref::<StateError>(),
                    Some(StateError::Conflict { .. })
                )
            }),
        }
    }
}

/// Reads `cluster` (or its instance group `group`) and writes it, under a header, to a new
/// private temporary file for the editor. Writes nothing to the store.
pub(crate) async fn plan(
    repo: &Repo,
    cluster: &str,
    group: Option<&str>,
) -> anyhow::Result<EditPlan> {
    let stored = repo.get(cluster).await?;
    let original = match group {
        None => spec::to_yaml_stream([ObjectRef::Cluster(&stored.cluster.value)])?,
        Some(g) => {
            let sg = super::objects::stored_group(&stored, cluster, g)?;
            spec::to_yaml_stream([ObjectRef::InstanceGroup(&sg.group.value)])?
        }
    };
    let dir = tempfile::Builder::new().prefix("kprov-edit-").tempdir()?;
    let file_name = match group {
        None => format!("{cluster}.yaml"),
        Some(g) => format!("{cluster}-{g}.yaml"),
    };
    let path = dir.path().join(file_name);
    std::fs::write(&path, format!("{HEADER}{original}"))?;
    Ok(EditPlan {
        cluster: cluster.to_string(),
        group: group.map(str::to_string),
        stored,
        original,
        _dir: dir,
        path,
        keep_in: None,
    })
}

fn strip_comments(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

impl EditPlan {
    /// Runs `editor` on the file until the text is a valid object, or the edit is cancelled.
    /// An invalid text is reopened with its errors as comments; the same invalid text twice
    /// gives up. On an error the user's copy is kept ([`EditPlan::keep`]) and named.
    pub(crate) fn review(
        &self,
        editor: &mut dyn FnMut(&Path) -> anyhow::Result<()>,
    ) -> anyhow::Result<Review> {
        let path = &self.path;
        let mut last_invalid: Option<String> = None;
        loop {
            if let Err(e) = editor(path) {
                return Err(self.nothing_saved(e));
            }
            // Too large or not text: still the user's work, kept before the error is told.
            let text = match crate::bounded::read_file_to_string(path, crate::bounded::SPEC) {
                Ok(text) => text,
                Err(e) => return Err(self.nothing_saved(e.into())),
            };
            let body = strip_comments(&text);
            if body.trim().is_empty() {
                return Ok(Review::Cancelled(Cancelled::Emptied));
            }
            if body.trim() == strip_comments(&self.original).trim() {
                return Ok(Review::Cancelled(Cancelled::Unchanged));
            }
            match self.check(&path.display().to_string(), &text) {
                Ok(obj) => return Ok(Review::Edited(Box::new(obj))),
                Err(errors) => {
                    if last_invalid.as_deref() == Some(body.as_str()) {
                        let kept = self.keep()?;
                        let why = format!(
                            "the edit is still invalid and nothing was saved (your copy: {})",
                            kept.display()
                        );
                        // The temporary file is gone when the user reads this: locate the
                        // problems in the copy that is kept (same text, so same lines and
                        // columns).
                        let errors = self
                            .check(&kept.display().to_string(), &text)
                            .err()
                            .unwrap_or(errors);
                        return Err(anyhow::Error::new(errors).context(why));
                    }
                    last_invalid = Some(body.clone());
                    let commented: String = errors
                        .to_string()
                        .lines()
                        .map(|l| format!("# {l}\n"))
                        .collect();
                    if let Err(e) = std::fs::write(
                        path,
                        format!("{HEADER}# The edit was not saved:\n{commented}#\n{body}\n"),
                    ) {
                        // The write may have cut the file: keep the text read above.
                        return Err(self.nothing_saved_text(
                            anyhow::Error::new(e)
                                .context(format!("writing the problems into {}", path.display())),
                            text.as_bytes(),
                        ));
                    }
                }
            }
        }
    }

    /// A failed save as the user reads it: the edit kept on disk and named, with whether
    /// someone else changed the cluster meanwhile.
    pub(crate) fn not_saved(&self, e: EditError) -> anyhow::Error {
        let conflict = e.conflict();
        let e: anyhow::Error = match e {
            EditError::Lock(l) => l.into(),
            EditError::Failed(f) => f,
        };
        let kept = match self.keep() {
            Ok(k) => k,
            Err(k) => return k,
        };
        let why = if conflict {
            format!(
                "cluster {} was changed by someone else while you were editing; your edit was not saved and is kept at {}",
                self.cluster,
                kept.display()
            )
        } else {
            format!("your edit was not saved and is kept at {}", kept.display())
        };
        e.context(why)
    }

    /// Copies the edited file out of the temporary directory so the user's work survives.
    pub(crate) fn keep(&self) -> anyhow::Result<PathBuf> {
        keep_copy(&self.path, &self.keep_dir()?)
    }

    /// `e`, after which nothing was saved, with `text` (the edit as last read) kept and named.
    fn nothing_saved_text(&self, e: anyhow::Error, text: &[u8]) -> anyhow::Error {
        let kept = self
            .keep_dir()
            .and_then(|dir| keep_private(&dir, kept_names(&self.path), &mut &text[..]));
        match kept {
            Ok(kept) => e.context(format!("nothing was saved (your copy: {})", kept.display())),
            Err(k) => e.context(format!(
                "nothing was saved, and your copy could not be kept: {k:#}"
            )),
        }
    }

    fn keep_dir(&self) -> anyhow::Result<PathBuf> {
        match &self.keep_in {
            Some(dir) => Ok(dir.clone()),
            None => edits_dir(),
        }
    }

    /// `e`, after which nothing was saved, with the user's copy kept and named.
    fn nothing_saved(&self, e: anyhow::Error) -> anyhow::Error {
        match self.keep() {
            Ok(kept) => e.context(format!("nothing was saved (your copy: {})", kept.display())),
            Err(k) => e.context(format!(
                "nothing was saved, and your copy could not be kept: {k:#}"
            )),
        }
    }

    fn check(&self, source: &str, text: &str) -> Result<Object, spec::SpecErrors> {
        check_edit(
            source,
            text,
            &self.cluster,
            self.group.as_deref(),
            &self.stored,
        )
    }
}

/// Stores `edited` (from [`EditPlan::review`]) under `guard`, conditional on the versions
/// read by [`plan`], and the completed spec with it.
pub(crate) async fn apply(
    repo: &Repo,
    plan: &EditPlan,
    edited: &Object,
    guard: &LockGuard,
) -> Result<(), EditError> {
    guard.check()?;
    let stored = &plan.stored;
    match edited {
        Object::Cluster(c) => {
            repo.put_cluster(c, &stored.version).await?;
            Ok(repo.write_completed(c, &stored.group_values()).await?)
        }
        Object::InstanceGroup(g) => {
            let version = stored
                .groups
                .iter()
                .find(|x| x.group.value.metadata.name == g.metadata.name)
                .map(|x| &x.version);
            repo.put_group(&plan.cluster, g, version).await?;
            let groups: Vec<InstanceGroup> = stored
                .groups
                .iter()
                .map(|x| {
                    if x.group.value.metadata.name == g.metadata.name {
                        g.clone()
                    } else {
                        x.group.value.clone()
                    }
                })
                .collect();
            Ok(repo.write_completed(&stored.cluster.value, &groups).await?)
        }
    }
}
/// Where a failed edit is kept: `$XDG_STATE_HOME/kprov/edits`, else `~/.kprov/edits`. The
/// copy can hold secrets (a cloud-controller password, say), so it never goes to a shared
/// directory such as `/tmp`.
fn edits_dir() -> anyhow::Result<PathBuf> {
    let base = match std::env::var_os("XDG_STATE_HOME")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute())
    {
        Some(x) => x.join("kprov"),
        None => std::env::home_dir()
            .filter(|h| h.is_absolute())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "no home directory to keep your edit in (set HOME or XDG_STATE_HOME)"
                )
            })?
            .join(".kprov"),
    };
    Ok(base.join("edits"))
}

/// The names a kept copy of `path` may take, first free one wins.
fn kept_names(path: &Path) -> impl Iterator<Item = String> + use<> {
    let stem = path
        .file_stem()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "edit".into());
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    (0..100u32).map(move |i| match i {
        0 => format!("{stem}-{stamp}.yaml"),
        i => format!("{stem}-{stamp}-{i}.yaml"),
    })
}

/// Copies the edited file out of the temporary directory into `dir` so the user's work
/// survives, whatever its size: streamed (memory bounded by the copy's buffer), never
/// loaded, so an edit too large to load is kept too.
fn keep_copy(path: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let mut file = std::fs::File::open(path)
        .with_context(|| format!("reading your edit back from {}", path.display()))?;
    keep_private(dir, kept_names(path), &mut file)
        .with_context(|| format!("keeping your edit under {}", dir.display()))
}

/// Writes `data` to a new file in `dir` (created 0700; an existing one must be a real
/// directory owned by this user) with mode 0600, `O_EXCL` and no symlink followed: a name that
/// exists, symlink or not, is skipped, never written through.
fn keep_private(
    dir: &std::path::Path,
    names: impl Iterator<Item = String>,
    data: &mut dyn std::io::Read,
) -> anyhow::Result<std::path::PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let md = std::fs::symlink_metadata(dir)?;
    if !md.is_dir() {
        bail!(
            "{} is not a directory (a symlink is not followed)",
            dir.display()
        );
    }
    // The process's own uid, read from something it just made (std has no getuid).
    let probe = tempfile::tempfile_in(dir)?;
    let me = probe.metadata()?.uid();
    drop(probe);
    if md.uid() != me {
        bail!(
            "{} belongs to uid {}, not to you (uid {me})",
            dir.display(),
            md.uid()
        );
    }
    if md.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    for name in names {
        let dest = dir.join(&name);
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&dest);
        match opened {
            Ok(mut f) => {
                std::io::copy(data, &mut f)?;
                f.sync_all()?;
                return Ok(dest);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e.into()),
        }
    }
    bail!("every candidate file name is taken")
}

fn check_edit(
    source: &str,
    text: &str,
    cluster: &str,
    group: Option<&str>,
    stored: &crate::repo::StoredCluster,
) -> Result<Object, spec::SpecErrors> {
    let mut objs = spec::load_objects(source, text)?;
    let one = |msg: String| {
        spec::SpecErrors(vec![spec::Diagnostic {
            source: source.into(),
            pos: None,
            path: None,
            message: msg,
        }])
    };
    if objs.len() != 1 {
        return Err(one(format!(
            "expected exactly one object, found {}",
            objs.len()
        )));
    }
    let Some(loaded) = objs.pop() else {
        return Err(one("no object".into()));
    };
    let doc = loaded.doc.clone();
    match (loaded.value, group) {
        (Object::Cluster(c), None) => {
            if c.metadata.name != cluster {
                return Err(spec::SpecErrors(vec![doc.diagnostic(
                    &spec::FieldPath::parse("metadata.name"),
                    format!("renaming a cluster is not supported (was {cluster})"),
                )]));
            }
            let docs: HashMap<String, Arc<spec::SourceDoc>> = HashMap::new();
            resolve_with_docs(&c, &stored.group_values(), Some(&doc), &docs, source)?;
            Ok(Object::Cluster(c))
        }
        (Object::InstanceGroup(g), Some(name)) => {
            if g.metadata.name != name {
                return Err(spec::SpecErrors(vec![doc.diagnostic(
                    &spec::FieldPath::parse("metadata.name"),
                    format!("renaming an instance group is not supported (was {name})"),
                )]));
            }
            let groups: Vec<Loaded<InstanceGroup>> = stored
                .groups
                .iter()
                .map(|x| {
                    if x.group.value.metadata.name == name {
                        Loaded {
                            value: g.clone(),
                            doc: doc.clone(),
                        }
                    } else {
                        x.group.clone()
                    }
                })
                .collect();
            let docs: HashMap<String, Arc<spec::SourceDoc>> = groups
                .iter()
                .map(|x| (x.value.metadata.name.clone(), x.doc.clone()))
                .collect();
            let values: Vec<InstanceGroup> = groups.iter().map(|x| x.value.clone()).collect();
            resolve_with_docs(
                &stored.cluster.value,
                &values,
                Some(&stored.cluster.doc),
                &docs,
                source,
            )?;
            Ok(Object::InstanceGroup(g))
        }
        _ => Err(one(format!(
            "the edited object must stay a {}",
            if group.is_some() {
                "InstanceGroup"
            } else {
                "Cluster"
            }
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &std::path::Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn kept_copies_are_private_and_never_follow_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        let dir = d.path().join("state/kprov/edits");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("a.yaml")).unwrap();
        let names = ["a.yaml", "b.yaml"].into_iter().map(String::from);
        let kept = keep_private(&dir, names, &mut &b"secret: x\n"[..]).unwrap();
        assert_eq!(kept, dir.join("b.yaml"));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "secret: x\n");
        assert_eq!(mode(&kept), 0o600);
        assert_eq!(mode(&dir), 0o700, "an existing directory is made private");
    }

    #[test]
    fn a_symlinked_directory_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let dir = d.path().join("edits");
        std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
        let e = keep_private(&dir, std::iter::once("a.yaml".into()), &mut &b"x"[..]).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        let fresh = d.path().join("new/kprov/edits");
        let kept = keep_private(&fresh, std::iter::once("a.yaml".into()), &mut &b"x"[..]).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        assert_eq!(mode(&kept), 0o600);
    }

    /// An edit larger than the spec's read bound is refused and still kept (it was lost: the
    /// read's error returned before the copy was made).
    #[tokio::test]
    async fn an_edit_too_large_to_load_is_kept() {
        let d = tempfile::tempdir().unwrap();
        let store = crate::state::file::FileStore::new(d.path().join("store")).unwrap();
        let repo = Repo::new(std::sync::Arc::new(store));
        let name = "big.example.com";
        let mut request =
            crate::ops::create::ClusterRequest::defaults(name, spec::CloudProvider::Aws);
        request.zones = vec!["eu-west-1a".into()];
        let (c, g) = crate::ops::create::build_cluster_objects(
            &request,
            Vec::new(),
            Some("ssh-ed25519 AAAA".into()),
        )
        .unwrap();
        repo.create(&c, &g).await.unwrap();
        let mut plan = plan(&repo, name, None).await.unwrap();
        let edits = d.path().join("edits");
        plan.keep_in = Some(edits.clone());
        let big = "# padding\n".repeat(crate::bounded::SPEC as usize / 10 + 1);
        let e = plan
            .review(&mut |p| Ok(std::fs::write(p, &big)?))
            .unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("larger than the limit of 4 MiB"), "{msg}");
        let kept: Vec<_> = std::fs::read_dir(&edits)
            .unwrap()
            .map(|f| f.unwrap().path())
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert!(
            msg.contains(&format!("your copy: {}", kept[0].display())),
            "{msg}"
        );
        assert!(
            std::fs::read_to_string(&kept[0]).unwrap() == big,
            "the copy is the edit"
        );
    }

    #[test]
    fn an_edit_of_any_size_is_kept_whole() {
        let d = tempfile::tempdir().unwrap();
        let huge = d.path().join("huge.yaml");
        let f = std::fs::File::create(&huge).unwrap();
        // Sparse: 65 MiB on no disk, over any bound a read of it into memory would have.
        f.set_len(65 * 1024 * 1024).unwrap();
        let kept = keep_copy(&huge, &d.path().join("edits")).unwrap();
        assert_eq!(std::fs::metadata(&kept).unwrap().len(), 65 * 1024 * 1024);
    }
}
