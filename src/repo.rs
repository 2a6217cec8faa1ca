//! Clusters in a state store: the typed layer over [`crate::state::StateStore`].
//!
//! A cluster is stored kops-style: `<name>/config` (the Cluster as the user wrote it),
//! `<name>/instancegroup/<ig>` (each InstanceGroup) and `<name>/cluster-completed.spec` (the
//! completed Cluster and groups, what the rest of kprov works from). Every write carries the
//! version that was read, so a concurrent change by another operator is refused, never lost.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::spec::{self, Cluster, InstanceGroup, Loaded, Object, ObjectRef, SpecErrors};
use crate::state::layout::ClusterKeys;
use crate::state::{Precondition, StateError, StateStore, Version};

#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("cluster {name:?} not found in {store}; `kprov get clusters` lists what is there")]
    NotFound { name: String, store: String },
    #[error(
        "cluster {name:?} already exists in {store}; use `kprov replace -f` or `kprov edit cluster {name}` to change it"
    )]
    Exists { name: String, store: String },
    /// The cluster's `config` cannot be read as an object (missing, a directory, a prefix of
    /// other keys) while other objects of the cluster remain.
    #[error(
        "cluster {name} cannot be read: {key} is {what}, and {remaining} object{s} of the \
         cluster remain under {prefix}; `kprov delete cluster {name}` lists them and \
         `kprov delete cluster {name} --yes` removes them",
        s = if *remaining == 1 { "" } else { "s" }
    )]
    Unreadable {
        name: String,
        key: String,
        what: String,
        remaining: usize,
        prefix: String,
    },
    /// The cluster was deleted with its etcd backups kept: they are all that remains.
    #[error(
        "cluster {name} was deleted; only its etcd backups remain ({count} object{s} under \
         {prefix}): `kprov get backups {name}` lists them, `kprov delete cluster {name} --yes \
         --delete-backups` removes them, and a cluster created again under this name can \
         `kprov restore etcd` from them",
        s = if *count == 1 { "" } else { "s" }
    )]
    BackupsOnly {
        name: String,
        count: usize,
        prefix: String,
    },
    #[error("instance group {group:?} not found in cluster {cluster:?}")]
    GroupNotFound { cluster: String, group: String },
    #[error("{0}")]
    Spec(#[from] SpecErrors),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("{location}: stored object is not a {expected}")]
    Corrupt {
        location: String,
        expected: &'static str,
    },
    #[error("cannot serialise {what}: {message}")]
    Serialise { what: String, message: String },
}

/// A cluster as read from the store, with the versions every later write is conditional on.
#[derive(Debug, Clone)]
pub struct StoredCluster {
    pub cluster: Loaded<Cluster>,
    pub version: Version,
    pub groups: Vec<StoredGroup>,
}

#[derive(Debug, Clone)]
pub struct StoredGroup {
    pub group: Loaded<InstanceGroup>,
    pub version: Version,
}

impl StoredCluster {
    pub fn name(&self) -> &str {
        self.cluster.value.name()
    }

    pub fn group_values(&self) -> Vec<InstanceGroup> {
        self.groups.iter().map(|g| g.group.value.clone()).collect()
    }

    /// Resolves once (completed, validated, typed); errors point into the stored documents.
    pub fn resolve(&self, store: &str) -> Result<spec::ResolvedCluster, SpecErrors> {
        let docs: HashMap<String, Arc<spec::SourceDoc>> = self
            .groups
            .iter()
            .map(|g| (g.group.value.metadata.name.clone(), g.group.doc.clone()))
            .collect();
        spec::resolve_located(
            &self.cluster.value,
            &self.group_values(),
            Some(&self.cluster.doc),
            &docs,
            store,
        )
    }
}

/// Completes a cluster and validates the result, locating problems in `docs` when given.
pub fn resolve_with_docs(
    cluster: &Cluster,
    groups: &[InstanceGroup],
    cluster_doc: Option<&spec::SourceDoc>,
    group_docs: &HashMap<String, Arc<spec::SourceDoc>>,
    fallback_source: &str,
) -> Result<(Cluster, Vec<InstanceGroup>), SpecErrors> {
    // One path for every command: what `spec::resolve` refuses is refused here too.
    let r = spec::resolve_located(cluster, groups, cluster_doc, group_docs, fallback_source)?;
    Ok((r.completed, r.completed_groups))
}

pub struct Repo {
    store: Arc<dyn StateStore>,
}

fn yaml_of(o: ObjectRef<'_>) -> Result<Bytes, RepoError> {
    spec::to_yaml_stream([o])
        .map(Bytes::from)
        .map_err(|e| RepoError::Serialise {
            what: "spec".into(),
            message: e.to_string(),
        })
}

impl Repo {
    pub fn new(store: Arc<dyn StateStore>) -> Self {
        Repo { store }
    }

    pub fn store(&self) -> &Arc<dyn StateStore> {
        &self.store
    }

    pub fn location(&self) -> String {
        self.store.location()
    }

    /// Every name under which the store holds objects of a cluster: those with a `config`
    /// and those without one that still hold more than a lock (a half-deleted cluster, a
    /// `config` that is a directory), so `get clusters` can show them as unreadable instead
    /// of hiding objects that stay. A name holding only a lock is a `create` in progress (it
    /// takes the lock before it writes) or a stale lock, which `kprov lock` reports. A name
    /// holding only etcd backups (deleted with its backups kept) is listed too: `get` says so
    /// ([`RepoError::BackupsOnly`]).
    pub async fn list_all(&self) -> Result<Vec<String>, RepoError> {
        let keys = self.store.list("").await?;
        let mut names: Vec<String> = keys
            .iter()
            .filter_map(|k| k.split_once('/'))
            .filter(|(_, rest)| *rest != "lock")
            .map(|(n, _)| n.to_string())
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Cluster names: top-level directories with a `config`.
    pub async fn list(&self) -> Result<Vec<String>, RepoError> {
        let keys = self.store.list("").await?;
        let mut names: Vec<String> = keys
            .iter()
            .filter_map(|k| k.strip_suffix("/config"))
            .filter(|n| !n.contains('/'))
            .map(str::to_string)
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    async fn read_object(&self, key: &str) -> Result<Option<(Loaded<Object>, Version)>, RepoError> {
        let Some(obj) = self.store.get(key).await? else {
            return Ok(None);
        };
        let location = self.store.key_location(key);
        let text = String::from_utf8(obj.data.to_vec()).map_err(|_| RepoError::Corrupt {
            location: location.clone(),
            expected: "UTF-8 YAML document",
        })?;
        let mut objs = spec::load_objects(&location, &text)?;
        if objs.len() != 1 {
            return Err(RepoError::Corrupt {
                location,
                expected: "single YAML document",
            });
        }
        Ok(objs.pop().map(|o| (o, obj.version)))
    }

    pub async fn get(&self, name: &str) -> Result<StoredCluster, RepoError> {
        let keys = ClusterKeys::new(name)?;
        let Some((loaded, version)) = self.read_object(&keys.config()).await? else {
            return Err(self.missing(&keys).await?);
        };
        let cluster = match loaded.value {
            Object::Cluster(mut c) => {
                self.load_registry_credentials(&mut c).await?;
                Loaded {
                    value: c,
                    doc: loaded.doc,
                }
            }
            Object::InstanceGroup(_) => {
                return Err(RepoError::Corrupt {
                    location: self.store.key_location(&keys.config()),
                    expected: "Cluster",
                });
            }
        };
        let mut groups = Vec::new();
        for key in self.store.list(&keys.instance_groups_prefix()).await? {
            let Some((loaded, version)) = self.read_object(&key).await? else {
                continue;
            };
            match loaded.value {
                Object::InstanceGroup(g) => groups.push(StoredGroup {
                    group: Loaded {
                        value: g,
                        doc: loaded.doc,
                    },
                    version,
                }),
                Object::Cluster(_) => {
                    return Err(RepoError::Corrupt {
                        location: self.store.key_location(&key),
                        expected: "InstanceGroup",
                    });
                }
            }
        }
        groups.sort_by(|a, b| {
            a.group
                .value
                .metadata
                .name
                .cmp(&b.group.value.metadata.name)
        });
        Ok(StoredCluster {
            cluster,
            version,
            groups,
        })
    }

    /// Reads the credentials of the spec's registry mirrors from the cluster's secrets
    /// (`registries/HOST`), into the spec's in-memory `containerd.credentials` (never
    /// serialised). A mirror without stored credentials is pulled from anonymously.
    async fn load_registry_credentials(&self, c: &mut Cluster) -> Result<(), RepoError> {
        let Some(containerd) = c.spec.containerd.as_mut() else {
            return Ok(());
        };
        let keys = ClusterKeys::new(&c.metadata.name)?;
        let hosts: Vec<String> = containerd
            .registries
            .iter()
            .flat_map(|r| r.mirrors.iter().filter_map(|m| m.host()))
            .map(str::to_string)
            .collect();
        for host in hosts {
            let key = keys.secret(&registry_secret(&host))?;
            let Some(obj) = self.store.get(&key).await? else {
                continue;
            };
            let cred: spec::RegistryCredential =
                serde_json::from_slice(&obj.data).map_err(|_| RepoError::Corrupt {
                    location: self.store.key_location(&key),
                    expected: "registry credentials (JSON username and password)",
                })?;
            containerd.credentials.0.insert(host, cred);
        }
        Ok(())
    }

    /// Stores a mirror host's credentials (replacing earlier ones); returns their digest.
    pub async fn put_registry_credentials(
        &self,
        cluster: &str,
        host: &str,
        cred: &spec::RegistryCredential,
    ) -> Result<String, RepoError> {
        let key = ClusterKeys::new(cluster)?.secret(&registry_secret(host))?;
        let data = serde_json::to_vec(cred).map_err(|e| RepoError::Serialise {
            what: "registry credentials".into(),
            message: e.to_string(),
        })?;
        self.store
            .put(&key, Bytes::from(data), Precondition::None)
            .await?;
        Ok(cred.digest())
    }

    /// Why a cluster's `config` was not found: `NotFound` when nothing of the cluster is
    /// there, else `Unreadable` with what sits at the key and what remains.
    async fn missing(&self, keys: &ClusterKeys) -> Result<RepoError, RepoError> {
        let config = keys.config();
        let lock = keys.lock();
        let what = self.store.obstruction(&config).await?;
        let remaining = self
            .store
            .list(&keys.prefix())
            .await?
            .into_iter()
            .filter(|k| *k != lock)
            .count();
        if what.is_none() && remaining == 0 {
            return Ok(RepoError::NotFound {
                name: keys.name().into(),
                store: self.location(),
            });
        }
        if what.is_none() {
            let backups = keys.backups_prefix();
            let kept = self.store.list(&backups).await?.len();
            if kept == remaining {
                return Ok(RepoError::BackupsOnly {
                    name: keys.name().into(),
                    count: kept,
                    prefix: self.store.key_location(&backups),
                });
            }
        }
        Ok(RepoError::Unreadable {
            name: keys.name().into(),
            key: self.store.key_location(&config),
            what: what.unwrap_or_else(|| "missing".into()),
            remaining,
            prefix: self.store.key_location(&keys.prefix()),
        })
    }

    /// Writes a new cluster. Fails if one of that name exists; every key is created with
    /// create-if-absent, so two operators creating the same cluster cannot both succeed.
    pub async fn create(
        &self,
        cluster: &Cluster,
        groups: &[InstanceGroup],
    ) -> Result<(), RepoError> {
        let name = cluster.name();
        let keys = ClusterKeys::new(name)?;
        match self
            .store
            .put(
                &keys.config(),
                yaml_of(ObjectRef::Cluster(cluster))?,
                Precondition::Absent,
            )
            .await
        {
            Ok(_) => {}
            Err(StateError::AlreadyExists { .. } | StateError::Conflict { .. }) => {
                return Err(RepoError::Exists {
                    name: name.into(),
                    store: self.location(),
                });
            }
            Err(e) => return Err(e.into()),
        }
        for g in groups {
            self.store
                .put(
                    &keys.instance_group(&g.metadata.name)?,
                    yaml_of(ObjectRef::InstanceGroup(g))?,
                    Precondition::Absent,
                )
                .await?;
        }
        self.write_completed(cluster, groups).await
    }

    /// Stores the completed spec beside the user's, for tools and humans to inspect.
    pub async fn write_completed(
        &self,
        cluster: &Cluster,
        groups: &[InstanceGroup],
    ) -> Result<(), RepoError> {
        let keys = ClusterKeys::new(cluster.name())?;
        let (c, g) = spec::defaults::complete(cluster, groups);
        let objects =
            std::iter::once(ObjectRef::Cluster(&c)).chain(g.iter().map(ObjectRef::InstanceGroup));
        let text = spec::to_yaml_stream(objects).map_err(|e| RepoError::Serialise {
            what: "completed spec".into(),
            message: e.to_string(),
        })?;
        // Derived data: last writer wins, and it is rewritten from the user's spec on every change.
        self.store
            .put(
                &keys.completed_spec(),
                Bytes::from(text),
                Precondition::None,
            )
            .await?;
        Ok(())
    }

    /// Replaces the Cluster object, conditional on the version read.
    pub async fn put_cluster(
        &self,
        cluster: &Cluster,
        expected: &Version,
    ) -> Result<Version, RepoError> {
        let keys = ClusterKeys::new(cluster.name())?;
        Ok(self
            .store
            .put(
                &keys.config(),
                yaml_of(ObjectRef::Cluster(cluster))?,
                Precondition::Matches(expected.clone()),
            )
            .await?)
    }

    /// Creates (`expected: None`) or replaces an InstanceGroup.
    pub async fn put_group(
        &self,
        cluster: &str,
        group: &InstanceGroup,
        expected: Option<&Version>,
    ) -> Result<Version, RepoError> {
        let keys = ClusterKeys::new(cluster)?;
        let cond = expected.map_or(Precondition::Absent, |v| Precondition::Matches(v.clone()));
        Ok(self
            .store
            .put(
                &keys.instance_group(&group.metadata.name)?,
                yaml_of(ObjectRef::InstanceGroup(group))?,
                cond,
            )
            .await?)
    }

    pub async fn delete_group(
        &self,
        cluster: &str,
        group: &str,
        expected: &Version,
    ) -> Result<(), RepoError> {
        let keys = ClusterKeys::new(cluster)?;
        Ok(self
            .store
            .delete(
                &keys.instance_group(group)?,
                Precondition::Matches(expected.clone()),
            )
            .await?)
    }

    /// Removes every key of the cluster (config last, so a half-finished delete still lists),
    /// except its etcd backups unless `delete_backups` (see [`ClusterKeys::backups_prefix`]).
    pub async fn delete_cluster(
        &self,
        name: &str,
        delete_backups: bool,
    ) -> Result<usize, RepoError> {
        let keys = ClusterKeys::new(name)?;
        let mut all = self.store.list(&keys.prefix()).await?;
        let config = keys.config();
        let lock = keys.lock();
        let backups = keys.backups_prefix();
        all.retain(|k| *k != config && *k != lock && (delete_backups || !k.starts_with(&backups)));
        let n = all.len() + 1;
        for k in all {
            match self.store.delete(&k, Precondition::None).await {
                Ok(()) | Err(StateError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.store.delete(&config, Precondition::None).await?;
        Ok(n)
    }

    /// The keys of the cluster's etcd backups (what `delete cluster` keeps unless asked).
    pub async fn backup_keys(&self, name: &str) -> Result<Vec<String>, RepoError> {
        Ok(self
            .store
            .list(&ClusterKeys::new(name)?.backups_prefix())
            .await?)
    }

    /// Removes the etcd backups of a cluster that was deleted with them kept (the caller holds
    /// its lock). Returns how many objects went.
    pub async fn delete_backups(&self, name: &str) -> Result<usize, RepoError> {
        let all = self.backup_keys(name).await?;
        let n = all.len();
        for k in all {
            match self.store.delete(&k, Precondition::None).await {
                Ok(()) | Err(StateError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(n)
    }

    /// Removes every object of a cluster whose spec cannot be read (see `Unreadable`), and
    /// whatever sits at its `config` key, except the lock the caller holds. Returns the keys
    /// deleted.
    pub async fn delete_unreadable(&self, name: &str) -> Result<Vec<String>, RepoError> {
        let keys = ClusterKeys::new(name)?;
        let lock = keys.lock();
        let config = keys.config();
        let mut deleted = Vec::new();
        for k in self.store.list(&keys.prefix()).await? {
            if k == lock {
                continue;
            }
            match self.store.delete(&k, Precondition::None).await {
                Ok(()) | Err(StateError::NotFound { .. }) => deleted.push(k),
                Err(e) => return Err(e.into()),
            }
        }
        // On the file store, what is left of a `config` directory (empty directories).
        deleted.extend(self.store.clear_obstruction(&config).await?);
        Ok(deleted)
    }
}

/// The secret name a mirror host's credentials are kept under (`registries/HOST`).
pub fn registry_secret(host: &str) -> String {
    format!("registries/{host}")
}
