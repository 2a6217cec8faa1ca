//! `kprov edit cluster|ig`: edit a stored object in $EDITOR, like `kubectl edit`.
//!
//! The edited text is parsed and validated before anything is written; an invalid edit is
//! reopened with the errors as comments, and never saved. The write is conditional on the
//! version read before editing, so a concurrent change by someone else is refused and the
//! edited copy kept on disk instead of being lost.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, bail};

use super::commands::Ctx;
use super::exit;
use crate::repo::{RepoError, resolve_with_docs};
use crate::spec::{self, InstanceGroup, Loaded, Object, ObjectRef};
use crate::state::StateError;

const HEADER: &str = "# Please edit the object below. Lines beginning with '#' are ignored; an empty\n# file aborts the edit. The object is validated before it is saved.\n";

fn editor() -> String {
    std::env::var("KPROV_EDITOR")
        .or_else(|_| std::env::var("VISUAL"))
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".into())
}

fn run_editor(path: &std::path::Path) -> anyhow::Result<()> {
    let ed = editor();
    // Editors are often given with arguments ("code --wait"): run through the shell like git.
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{ed} \"$1\""))
        .arg("kprov-edit")
        .arg(path)
        .status()
        .with_context(|| format!("cannot start editor {ed:?}"))?;
    if !status.success() {
        bail!(
            "editor {ed:?} exited with {status}; nothing was saved (your copy: {})",
            path.display()
        );
    }
    Ok(())
}

fn strip_comments(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

pub async fn edit(ctx: &Ctx, cluster: &str, group: Option<&str>) -> anyhow::Result<i32> {
    let repo = ctx.repo().await?;
    let stored = repo.get(cluster).await?;
    let original = match group {
        None => spec::to_yaml_stream([ObjectRef::Cluster(&stored.cluster.value)])?,
        Some(g) => {
            let sg = stored
                .groups
                .iter()
                .find(|x| x.group.value.metadata.name == g)
                .ok_or_else(|| RepoError::GroupNotFound {
                    cluster: cluster.into(),
                    group: g.into(),
                })?;
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
    let mut last_invalid: Option<String> = None;
    let edited = loop {
        run_editor(&path)?;
        let text = crate::bounded::read_file_to_string(&path, crate::bounded::SPEC)?;
        let body = strip_comments(&text);
        if body.trim().is_empty() {
            ctx.printer
                .status("Edit cancelled: the file was emptied. Nothing was saved.");
            return Ok(exit::OK);
        }
        if body.trim() == strip_comments(&original).trim() {
            ctx.printer.status("Edit cancelled, no changes made.");
            return Ok(exit::OK);
        }
        match check_edit(&path.display().to_string(), &text, cluster, group, &stored) {
            Ok(obj) => break obj,
            Err(errors) => {
                if last_invalid.as_deref() == Some(body.as_str()) {
                    let kept = keep_copy(&path)?;
                    let why = format!(
                        "the edit is still invalid and nothing was saved (your copy: {})",
                        kept.display()
                    );
                    return Err(anyhow::Error::new(errors).context(why));
                }
                last_invalid = Some(body.clone());
                let commented: String = errors
                    .to_string()
                    .lines()
                    .map(|l| format!("# {l}\n"))
                    .collect();
                std::fs::write(
                    &path,
                    format!("{HEADER}# The edit was not saved:\n{commented}#\n{body}\n"),
                )?;
            }
        }
    };
    let res = super::commands::locked(repo.store(), cluster, "edit", async {
        match &edited {
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
                repo.put_group(cluster, g, version).await?;
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
    })
    .await;
    if let Err(e) = res {
        // Whatever went wrong, the user's edit survives on disk.
        let kept = keep_copy(&path)?;
        let conflict = e.chain().any(|c| {
            matches!(
                c.downcast_ref::<RepoError>(),
                Some(RepoError::State(StateError::Conflict { .. }))
            ) || matches!(
                c.downcast_ref::<StateError>(),
                Some(StateError::Conflict { .. })
            )
        });
        let why = if conflict {
            format!(
                "cluster {cluster} was changed by someone else while you were editing; your edit was not saved and is kept at {}",
                kept.display()
            )
        } else {
            format!("your edit was not saved and is kept at {}", kept.display())
        };
        return Err(e.context(why));
    }
    ctx.printer.success(&format!(
        "Saved {}.",
        group.map_or(format!("cluster {cluster}"), |g| format!(
            "instance group {g} of cluster {cluster}"
        ))
    ));
    Ok(exit::OK)
}

/// Moves the edited file out of the temporary directory so the user's work survives.
fn keep_copy(path: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "edit.yaml".into());
    let dest = std::env::temp_dir().join(format!("kprov-unsaved-{}-{name}", std::process::id()));
    std::fs::copy(path, &dest)?;
    Ok(dest)
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
