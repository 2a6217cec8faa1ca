//! `create -f` and `replace -f`: the objects of a file grouped per cluster, merged with what
//! the store holds and validated as a whole before anything is written (each cluster under
//! its own lock, taken by the command).

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::anyhow;

use crate::output::untrusted;
use crate::repo::{Repo, RepoError, StoredCluster, resolve_with_docs};
use crate::spec::{self, Cluster, InstanceGroup, Loaded, Object, SpecErrors};

/// Objects of a file grouped per cluster: the Cluster (if present) and its groups.
pub struct FileCluster {
    pub cluster: Option<Loaded<Cluster>>,
    pub groups: Vec<Loaded<InstanceGroup>>,
}

/// The file's objects per cluster, in the file's order: an InstanceGroup belongs to the
/// cluster its label names, or to the file's only Cluster when it has no label.
pub fn group_by_cluster(
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
pub fn validate_merged(
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
pub async fn check_create(
    repo: &Repo,
    source: &str,
    name: &str,
    fc: &FileCluster,
) -> anyhow::Result<()> {
    match &fc.cluster {
        Some(cluster) => {
            validate_merged(source, cluster, &fc.groups)?;
            let config = crate::state::layout::ClusterKeys::new(name)?.config();
            if repo.store().get(&config).await?.is_some() {
                return Err(RepoError::Exists {
                    name: name.into(),
                    store: repo.location(),
                }
                .into());
            }
        }
        None => {
            let stored = repo.get(name).await?;
            merged_groups(source, name, &stored, fc)?;
        }
    }
    Ok(())
}

/// The stored groups plus the file's new ones, validated with the stored cluster; refused
/// when one of them exists already.
pub fn merged_groups(
    source: &str,
    name: &str,
    stored: &StoredCluster,
    fc: &FileCluster,
) -> anyhow::Result<Vec<Loaded<InstanceGroup>>> {
    let mut all: Vec<Loaded<InstanceGroup>> =
        stored.groups.iter().map(|g| g.group.clone()).collect();
    for g in &fc.groups {
        if all
            .iter()
            .any(|x| x.value.metadata.name == g.value.metadata.name)
        {
            return Err(anyhow!(
                "{}: instance group {} already exists in cluster {name}; use `kprov replace -f`",
                untrusted(source),
                g.value.metadata.name
            ));
        }
        all.push(g.clone());
    }
    validate_merged(source, &stored.cluster, &all)?;
    Ok(all)
}

/// What `replace -f` will write, validated: the stored cluster and groups with the file's
/// objects in their place.
pub async fn replace_merged(
    repo: &Repo,
    source: &str,
    name: &str,
    fc: &FileCluster,
) -> anyhow::Result<(StoredCluster, Loaded<Cluster>, Vec<Loaded<InstanceGroup>>)> {
    let stored = repo.get(name).await?;
    let cluster = fc.cluster.clone().unwrap_or_else(|| stored.cluster.clone());
    let mut all: Vec<Loaded<InstanceGroup>> =
        stored.groups.iter().map(|g| g.group.clone()).collect();
    for g in &fc.groups {
        match all
            .iter_mut()
            .find(|x| x.value.metadata.name == g.value.metadata.name)
        {
            Some(slot) => *slot = g.clone(),
            None => all.push(g.clone()),
        }
    }
    validate_merged(source, &cluster, &all)?;
    Ok((stored, cluster, all))
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
