//! `create -f` and `replace -f`: the objects of a file grouped per cluster, merged with what
//! the store holds and validated as a whole before anything is written ([`plan`]), then
//! written each cluster under its own lock ([`apply`]).

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::anyhow;

use crate::output::untrusted;
use crate::repo::{Repo, RepoError, StoredCluster, StoredGroup, resolve_with_docs};
use crate::spec::{self, Cluster, InstanceGroup, Loaded, Object, SpecErrors};

/// The text of `create -f` / `replace -f`'s file (`-` for standard input), read with the
/// spec's bound, and the name its errors give it.
pub(crate) fn read_input(path: &std::path::Path) -> anyhow::Result<(String, String)> {
    use crate::bounded;
    if path == std::path::Path::new("-") {
        let s = bounded::read_stdin_to_string(bounded::SPEC)?;
        Ok(("<stdin>".into(), s))
    } else {
        let s = bounded::read_file_to_string(path, bounded::SPEC)?;
        Ok((path.display().to_string(), s))
    }
}

/// Objects of a file grouped per cluster: the Cluster (if present) and its groups.
pub(crate) struct FileCluster {
    pub cluster: Option<Loaded<Cluster>>,
    pub groups: Vec<Loaded<InstanceGroup>>,
}

/// The file's objects per cluster, in the file's order: an InstanceGroup belongs to the
/// cluster its label names, or to the file's only Cluster when it has no label.
pub(crate) fn group_by_cluster(
    objects: Vec<Loaded<Object>>,
) -> Result<Vec<(String, FileCluster)>, SpecErrors> {
    let single_cluster = {
        let names: Vec<String> = objects
            .iter()
            .filter_map(|o| {
                if let Object::Cluster(c) = &o.value {
                    Some(c.metadata.name.clone())
                } else {
                    None
                }
            })
            .collect();
        if names.len() == 1 {
            names.into_iter().next()
        } else {
            None
        }
    };
    let mut out: Vec<(String, FileCluster)> = Vec::new();
    let mut errors = Vec::new();
    for o in objects {
        let (name, is_cluster) = match &o.value {
            Object::Cluster(c) => (Some(c.metadata.name.clone()), true),
            Object::InstanceGroup(g) => (
                g.metadata
                    .labels
                    .get(spec::CLUSTER_LABEL)
                    .cloned()
                    .or_else(|| single_cluster.clone()),
                false,
            ),
        };
        let Some(name) = name else {
            errors.push(o.doc.diagnostic(
                &spec::FieldPath::parse("metadata.labels"),
                format!(
                    "InstanceGroup has no {} label naming its cluster",
                    spec::CLUSTER_LABEL
                ),
            ));
            continue;
        };
        let idx = match out.iter().position(|(n, _)| *n == name) {
            Some(i) => i,
            None => {
                out.push((
                    name.clone(),
                    FileCluster {
                        cluster: None,
                        groups: Vec::new(),
                    },
                ));
                out.len() - 1
            }
        };
        match o.value {
            Object::Cluster(c) => {
                if out[idx].1.cluster.is_some() && is_cluster {
                    errors.push(o.doc.diagnostic(
                        &spec::FieldPath::parse("metadata.name"),
                        format!("cluster {name} appears twice"),
                    ));
                }
                out[idx].1.cluster = Some(Loaded {
                    value: c,
                    doc: o.doc,
                });
            }
            Object::InstanceGroup(mut g) => {
                g.metadata
                    .labels
                    .entry(spec::CLUSTER_LABEL.into())
                    .or_insert_with(|| name.clone());
                out[idx].1.groups.push(Loaded {
                    value: g,
                    doc: o.doc,
                });
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(SpecErrors(errors))
    }
}

/// Validates the union of stored and incoming objects, locating errors in whichever document
/// each object came from.
pub(crate) fn validate_merged(
    source: &str,
    cluster: &Loaded<Cluster>,
    groups: &[Loaded<InstanceGroup>],
) -> Result<(), SpecErrors> {
    let docs: HashMap<String, Arc<spec::SourceDoc>> = groups
        .iter()
        .map(|g| (g.value.metadata.name.clone(), g.doc.clone()))
        .collect();
    let values: Vec<InstanceGroup> = groups.iter().map(|g| g.value.clone()).collect();
    resolve_with_docs(&cluster.value, &values, Some(&cluster.doc), &docs, source).map(|_| ())
}

/// What `create -f` refuses, found without writing: the file's own objects, a cluster that
/// exists, instance groups that exist or make the stored cluster invalid.
pub(crate) async fn check_create(
    repo: &Repo,
    source: &str,
    name: &str,
    fc: &FileCluster,
) -> anyhow::Result<()> {
    match &fc.cluster {
        Some(cluster) => {
            validate_merged(source, cluster, &fc.groups)?;
            refuse_existing(repo, name).await?;
        }
        None => {
            let stored = repo.get(name).await?;
            merged_groups(source, name, &stored, fc)?;
        }
    }
    Ok(())
}

/// A cluster that is to be created is refused when the store has its config already
/// ([`RepoError::Exists`]: a conflict).
pub(crate) async fn refuse_existing(repo: &Repo, name: &str) -> anyhow::Result<()> {
    let config = crate::state::layout::ClusterKeys::new(name)?.config();
    if repo.store().get(&config).await?.is_some() {
        return Err(RepoError::Exists {
            name: name.into(),
            store: repo.location(),
        }
        .into());
    }
    Ok(())
}

/// The stored groups plus the file's new ones, validated with the stored cluster; refused
/// when one of them exists already.
pub(crate) fn merged_groups(
    source: &str,
    name: &str,
    stored: &StoredCluster,
    fc: &FileCluster,
) -> anyhow::Result<Vec<Loaded<InstanceGroup>>> {
    let (all, existing) = with_file_groups(stored, fc);
    if let Some(group) = existing {
        return Err(anyhow!(
            "{}: instance group {group} already exists in cluster {name}; use `kprov replace -f`",
            untrusted(source),
        ));
    }
    validate_merged(source, &stored.cluster, &all)?;
    Ok(all)
}

/// The stored groups with the file's: a file's group named as a stored one takes its place.
/// Also the first such name (`create -f` refuses it; `replace -f` replaces).
fn with_file_groups(
    stored: &StoredCluster,
    fc: &FileCluster,
) -> (Vec<Loaded<InstanceGroup>>, Option<String>) {
    let mut all: Vec<Loaded<InstanceGroup>> =
        stored.groups.iter().map(|g| g.group.clone()).collect();
    let mut existing = None;
    for g in &fc.groups {
        let name = &g.value.metadata.name;
        match all.iter_mut().find(|x| &x.value.metadata.name == name) {
            Some(slot) => {
                existing.get_or_insert_with(|| name.clone());
                *slot = g.clone();
            }
            None => all.push(g.clone()),
        }
    }
    (all, existing)
}

/// What `replace -f` will write, validated: the stored cluster and groups with the file's
/// objects in their place.
pub(crate) async fn replace_merged(
    repo: &Repo,
    source: &str,
    name: &str,
    fc: &FileCluster,
) -> anyhow::Result<(StoredCluster, Loaded<Cluster>, Vec<Loaded<InstanceGroup>>)> {
    let stored = repo.get(name).await?;
    let cluster = fc.cluster.clone().unwrap_or_else(|| stored.cluster.clone());
    // A group the store has is replaced: that is what `replace -f` is for.
    let (all, _replaced) = with_file_groups(&stored, fc);
    validate_merged(source, &cluster, &all)?;
    Ok((stored, cluster, all))
}

/// `create -f` or `replace -f`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Create,
    Replace,
}

/// What [`plan`] and [`apply`] did, one event each, as it happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Written {
    /// A line about the checksums pinned for a newer patch release (`create -f`).
    Pinned(String),
    /// `create -f`: a cluster stored with this many instance groups.
    ClusterCreated { name: String, groups: usize },
    /// `create -f`: an instance group added to a stored cluster.
    GroupCreated { cluster: String, group: String },
    /// `replace -f`: the cluster written, or left as it was.
    ClusterReplaced { name: String, changed: bool },
    /// `replace -f`: an instance group replaced (`existed`), created, or left as it was.
    GroupReplaced {
        group: String,
        existed: bool,
        changed: bool,
    },
}

/// Every refusal of a file's objects, found before the first write: each cluster of the file
/// checked against the store as it is now (under the lock [`apply`] checks again). For
/// `create -f` a newer patch release's checksums are read once, here, and kept in the spec.
pub(crate) async fn plan(
    repo: &Repo,
    source: &str,
    mode: Mode,
    per_cluster: &mut [(String, FileCluster)],
    said: &mut dyn FnMut(Written),
) -> anyhow::Result<()> {
    if mode == Mode::Create {
        for (_, fc) in per_cluster.iter_mut() {
            if let Some(c) = fc.cluster.as_mut() {
                for n in super::release::pin_checksums(&mut c.value).await? {
                    said(Written::Pinned(n));
                }
            }
        }
    }
    for (name, fc) in per_cluster.iter() {
        match mode {
            Mode::Create => check_create(repo, source, name, fc).await?,
            Mode::Replace => {
                replace_merged(repo, source, name, fc).await?;
            }
        }
    }
    Ok(())
}

/// Writes a file's objects, every cluster under its own lock, in the file's order.
pub(crate) async fn apply(
    repo: &Repo,
    source: &str,
    mode: Mode,
    per_cluster: Vec<(String, FileCluster)>,
    said: &mut dyn FnMut(Written),
) -> anyhow::Result<()> {
    let session = super::session::Session::new(repo.store().clone());
    for (name, fc) in per_cluster {
        let command = match mode {
            Mode::Create => "create -f",
            Mode::Replace => "replace -f",
        };
        session
            .with_lock(&name, command, async |_| match mode {
                Mode::Create => create_one(repo, source, &name, fc, said).await,
                Mode::Replace => replace_one(repo, source, &name, fc, said).await,
            })
            .await?;
    }
    Ok(())
}

async fn create_one(
    repo: &Repo,
    source: &str,
    name: &str,
    fc: FileCluster,
    said: &mut dyn FnMut(Written),
) -> anyhow::Result<()> {
    match fc.cluster {
        Some(cluster) => {
            validate_merged(source, &cluster, &fc.groups)?;
            let groups: Vec<InstanceGroup> = fc.groups.iter().map(|g| g.value.clone()).collect();
            repo.create(&cluster.value, &groups).await?;
            said(Written::ClusterCreated {
                name: name.into(),
                groups: groups.len(),
            });
        }
        None => {
            // Only groups: add them to the stored cluster.
            let stored = repo.get(name).await?;
            let all = merged_groups(source, name, &stored, &fc)?;
            for g in &fc.groups {
                repo.put_group(name, &g.value, None).await?;
                said(Written::GroupCreated {
                    cluster: name.into(),
                    group: g.value.metadata.name.clone(),
                });
            }
            let values: Vec<InstanceGroup> = all.iter().map(|g| g.value.clone()).collect();
            repo.write_completed(&stored.cluster.value, &values).await?;
        }
    }
    Ok(())
}

async fn replace_one(
    repo: &Repo,
    source: &str,
    name: &str,
    fc: FileCluster,
    said: &mut dyn FnMut(Written),
) -> anyhow::Result<()> {
    let (stored, cluster, all) = replace_merged(repo, source, name, &fc).await?;
    if let Some(c) = &fc.cluster {
        let changed = c.value != stored.cluster.value;
        if changed {
            repo.put_cluster(&c.value, &stored.version).await?;
        }
        said(Written::ClusterReplaced {
            name: name.into(),
            changed,
        });
    }
    for g in &fc.groups {
        let existing = stored
            .groups
            .iter()
            .find(|x| x.group.value.metadata.name == g.value.metadata.name);
        let changed = !existing.is_some_and(|e| e.group.value == g.value);
        if changed {
            repo.put_group(name, &g.value, existing.map(|e| &e.version))
                .await?;
        }
        said(Written::GroupReplaced {
            group: g.value.metadata.name.clone(),
            existed: existing.is_some(),
            changed,
        });
    }
    let values: Vec<InstanceGroup> = all.iter().map(|g| g.value.clone()).collect();
    repo.write_completed(&cluster.value, &values).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str = "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: NAME\nspec:\n  cloudProvider: metal\n";
    const GROUP: &str = "apiVersion: kprov.dev/v1alpha1\nkind: InstanceGroup\nmetadata:\n  name: nodes\nspec:\n  role: Node\n";

    #[test]
    fn a_group_without_a_label_joins_the_files_only_cluster_and_is_refused_with_two() {
        let one = format!("{}---\n{GROUP}", CLUSTER.replace("NAME", "a.example.com"));
        let objects = spec::load_objects("one.yaml", &one).unwrap();
        let grouped = group_by_cluster(objects).unwrap();
        assert_eq!(grouped.len(), 1);
        assert_eq!(grouped[0].0, "a.example.com");
        assert!(grouped[0].1.cluster.is_some());
        assert_eq!(
            grouped[0].1.groups[0]
                .value
                .metadata
                .labels
                .get(spec::CLUSTER_LABEL),
            Some(&"a.example.com".to_string())
        );
        let two = format!(
            "{}---\n{}---\n{GROUP}",
            CLUSTER.replace("NAME", "a.example.com"),
            CLUSTER.replace("NAME", "b.example.com")
        );
        let objects = spec::load_objects("two.yaml", &two).unwrap();
        let err = group_by_cluster(objects)
            .err()
            .expect("an unlabelled group was placed");
        let said = err.to_string();
        assert!(said.contains("two.yaml") && said.contains("no "), "{said}");
    }
}

/// One cluster of `get clusters`: as stored, and completed with the defaults.
pub(crate) struct Listed {
    pub stored: StoredCluster,
    pub completed: Cluster,
    pub completed_groups: Vec<InstanceGroup>,
}

/// A cluster whose objects cannot be read, listed with the reason (which names the key).
pub(crate) struct Unreadable {
    pub name: String,
    pub error: RepoError,
}

impl Unreadable {
    /// Whether `delete cluster` is the way out (an object that is there but not a readable
    /// cluster; a store that cannot be read is fixed at the store).
    pub(crate) fn delete_removes_it(&self) -> bool {
        !matches!(self.error, RepoError::Unreadable { .. })
    }
}

/// What `get clusters [NAME]` shows.
pub(crate) struct ClusterList {
    /// The name asked for, or `None` for every cluster in the store.
    pub asked: Option<String>,
    /// Whether the store holds no cluster at all (nothing listed, nothing unreadable).
    pub empty: bool,
    pub clusters: Vec<Listed>,
    /// Listed as unreadable (only when every cluster is listed; asked by name, an error).
    pub unreadable: Vec<Unreadable>,
    /// Deleted with their etcd backups kept: listed, so that backups are never forgotten.
    pub backups_only: Vec<String>,
}

/// A row of `get clusters`' table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct ClusterSummary {
    pub name: String,
    pub cloud: String,
    pub zones: Vec<String>,
    #[serde(rename = "kubernetesVersion")]
    pub kubernetes_version: String,
    #[serde(rename = "controlPlanes")]
    pub control_planes: u64,
    pub nodes: u64,
}

impl Listed {
    pub(crate) fn summary(&self) -> ClusterSummary {
        let (c, g) = (&self.completed, &self.completed_groups);
        let mut zones: Vec<String> = c
            .spec
            .networking
            .subnets
            .iter()
            .map(|s| s.zone.clone())
            .collect();
        zones.sort();
        zones.dedup();
        ClusterSummary {
            name: c.metadata.name.clone(),
            cloud: c.spec.cloud_provider.to_string(),
            zones,
            // Completion always sets the version; an empty cell would show if it did not.
            kubernetes_version: c.spec.kubernetes_version.clone().unwrap_or_default(),
            control_planes: spec::total_min_size(g, spec::InstanceGroupRole::ControlPlane),
            nodes: spec::total_min_size(g, spec::InstanceGroupRole::Node),
        }
    }
}

impl ClusterList {
    /// The objects `-o yaml|json` prints, which `create -f` / `replace -f` accept as they
    /// are: the clusters (completed with `full`), and their groups when one was asked for.
    pub(crate) fn objects(&self, full: bool) -> Vec<spec::ObjectRef<'_>> {
        let mut objs = Vec::new();
        for l in &self.clusters {
            objs.push(spec::ObjectRef::Cluster(if full {
                &l.completed
            } else {
                &l.stored.cluster.value
            }));
            if self.asked.is_some() {
                if full {
                    objs.extend(
                        l.completed_groups
                            .iter()
                            .map(spec::ObjectRef::InstanceGroup),
                    );
                } else {
                    objs.extend(
                        l.stored
                            .groups
                            .iter()
                            .map(|g| spec::ObjectRef::InstanceGroup(&g.group.value)),
                    );
                }
            }
        }
        objs
    }
}

/// `get clusters [NAME]`: the cluster asked for, or every cluster of the store with those
/// that cannot be read and those deleted with backups kept. Read-only.
pub(crate) async fn list(repo: &Repo, name: Option<&str>) -> Result<ClusterList, RepoError> {
    let names = match name {
        Some(n) => vec![n.to_string()],
        None => repo.list_all().await?,
    };
    let mut list = ClusterList {
        asked: name.map(str::to_string),
        empty: names.is_empty(),
        clusters: Vec::new(),
        unreadable: Vec::new(),
        backups_only: Vec::new(),
    };
    for n in &names {
        let stored = match repo.get(n).await {
            Ok(s) => s,
            Err(RepoError::BackupsOnly { .. }) if name.is_none() => {
                list.backups_only.push(n.clone());
                continue;
            }
            Err(e) if name.is_none() && super::delete::removable(&e) => {
                list.unreadable.push(Unreadable {
                    name: n.clone(),
                    error: e,
                });
                continue;
            }
            Err(e) => return Err(e),
        };
        let (completed, completed_groups) =
            spec::defaults::complete(&stored.cluster.value, &stored.group_values());
        list.clusters.push(Listed {
            stored,
            completed,
            completed_groups,
        });
    }
    Ok(list)
}

/// `get instancegroups CLUSTER`: the groups as stored, and completed with the defaults.
pub(crate) async fn groups(
    repo: &Repo,
    cluster: &str,
) -> Result<(Vec<InstanceGroup>, Vec<InstanceGroup>), RepoError> {
    let stored = repo.get(cluster).await?;
    let user = stored.group_values();
    let (_, completed) = spec::defaults::complete(&stored.cluster.value, &user);
    Ok((user, completed))
}

/// `delete instancegroup`: the group, and the cluster without it checked valid.
pub(crate) struct GroupDeletePlan {
    pub cluster: String,
    pub group: String,
    stored: StoredCluster,
    version: crate::state::Version,
    remaining: Vec<InstanceGroup>,
}

/// Why `delete instancegroup` did not delete.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GroupDeleteError {
    /// The store: no such cluster or group, unreadable, or changed since the plan.
    #[error(transparent)]
    Repo(#[from] RepoError),
    /// The cluster without the group would not validate (a control-plane group its only one,
    /// a group another refers to): nothing is deleted.
    #[error("cluster {cluster} would be invalid without instance group {group}")]
    WouldBeInvalid {
        cluster: String,
        group: String,
        #[source]
        errors: SpecErrors,
    },
    /// The cluster's lock is held by another command, or was lost.
    #[error(transparent)]
    Lock(#[from] crate::state::lock::LockError),
}

/// Plans the deletion of `cluster`'s instance group `group`, refused when the cluster would
/// be invalid without it. Read-only.
pub(crate) async fn plan_group_delete(
    repo: &Repo,
    cluster: &str,
    group: &str,
) -> Result<GroupDeletePlan, GroupDeleteError> {
    let stored = repo.get(cluster).await?;
    let version = stored_group(&stored, cluster, group)?.version.clone();
    let remaining: Vec<InstanceGroup> = stored
        .groups
        .iter()
        .filter(|x| x.group.value.metadata.name != group)
        .map(|x| x.group.value.clone())
        .collect();
    resolve_with_docs(
        &stored.cluster.value,
        &remaining,
        Some(&stored.cluster.doc),
        &HashMap::new(),
        &repo.location(),
    )
    .map_err(|errors| GroupDeleteError::WouldBeInvalid {
        cluster: cluster.into(),
        group: group.into(),
        errors,
    })?;
    Ok(GroupDeletePlan {
        cluster: cluster.into(),
        group: group.into(),
        stored,
        version,
        remaining,
    })
}

/// `cluster`'s instance group `group` as read from the store, or the repo's "not found".
pub(crate) fn stored_group<'s>(
    stored: &'s StoredCluster,
    cluster: &str,
    group: &str,
) -> Result<&'s StoredGroup, RepoError> {
    stored
        .groups
        .iter()
        .find(|g| g.group.value.metadata.name == group)
        .ok_or_else(|| RepoError::GroupNotFound {
            cluster: cluster.into(),
            group: group.into(),
        })
}

/// Deletes the planned group under `guard` (conditional on the version planned), and writes
/// the completed spec without it.
pub(crate) async fn delete_group(
    repo: &Repo,
    plan: &GroupDeletePlan,
    guard: &crate::state::lock::LockGuard,
) -> Result<(), GroupDeleteError> {
    guard.check()?;
    repo.delete_group(&plan.cluster, &plan.group, &plan.version)
        .await?;
    Ok(repo
        .write_completed(&plan.stored.cluster.value, &plan.remaining)
        .await?)
}
