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

/// Why reading or writing a cluster's objects in the state store failed.
#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    /// No object of the cluster is in the store.
    #[error("cluster {name:?} not found in {store}; `kprov get clusters` lists what is there")]
    NotFound {
        /// The cluster name asked for.
        name: String,
        /// The store's location (`file:///…`, `s3://…`).
        store: String,
    },
    /// `create` found the cluster's `config` already there.
    #[error(
        "cluster {name:?} already exists in {store}; use `kprov replace -f` or `kprov edit cluster {name}` to change it"
    )]
    Exists {
        /// The cluster name.
        name: String,
        /// The store's location.
        store: String,
    },
    /// The cluster's `config` cannot be read as an object (missing, a directory, a prefix of
    /// other keys) while other objects of the cluster remain.
    #[error(
        "cluster {name} cannot be read: {key} is {what}, and {remaining} object{s} of the \
         cluster remain under {prefix}; `kprov delete cluster {name}` lists them and \
         `kprov delete cluster {name} --yes` removes them",
        s = if *remaining == 1 { "" } else { "s" }
    )]
    Unreadable {
        /// The cluster name.
        name: String,
        /// The `config` key's location in the store.
        key: String,
        /// What stands at that key instead of an object ("missing", "a directory", …).
        what: String,
        /// How many other objects of the cluster are still stored.
        remaining: usize,
        /// The cluster's key prefix, under which they are.
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
        /// The cluster name.
        name: String,
        /// How many backup objects remain.
        count: usize,
        /// The key prefix they are under.
        prefix: String,
    },
    /// The cluster exists but has no instance group of that name.
    #[error("instance group {group:?} not found in cluster {cluster:?}")]
    GroupNotFound {
        /// The cluster name.
        cluster: String,
        /// The group name asked for.
        group: String,
    },
    /// A stored or given spec does not parse, complete or validate; messages locate the field.
    #[error("{0}")]
    Spec(#[from] SpecErrors),
    /// The store itself failed, or refused a write whose version no longer matched.
    #[error(transparent)]
    State(#[from] StateError),
    /// A stored object is not the document its key promises (not UTF-8, several documents,
    /// an InstanceGroup where the Cluster belongs).
    #[error("{location}: stored object is not a {expected}")]
    Corrupt {
        /// The object's location in the store.
        location: String,
        /// What the key should hold, e.g. "Cluster" or "single YAML document".
        expected: &'static str,
    },
    /// A spec could not be turned into YAML for writing.
    #[error("cannot serialise {what}: {message}")]
    Serialise {
        /// What was being written (e.g. "spec").
        what: String,
        /// The serialiser's message.
        message: String,
    },
}

/// A cluster as read from the store, with the versions every later write is conditional on.
#[derive(Debug, Clone)]
pub struct StoredCluster {
    /// The Cluster as the user wrote it (`<name>/config`), with its registry credentials
    /// loaded from the cluster's secrets and its source for locating errors.
    pub cluster: Loaded<Cluster>,
    /// The version of `<name>/config` that was read.
    pub version: Version,
    /// The cluster's instance groups, sorted by name.
    pub groups: Vec<StoredGroup>,
}

/// One instance group as read from the store (`<name>/instancegroup/<ig>`).
#[derive(Debug, Clone)]
pub struct StoredGroup {
    /// The InstanceGroup as stored, with its source for locating errors.
    pub group: Loaded<InstanceGroup>,
    /// The version of its object that was read.
    pub version: Version,
}

impl StoredCluster {
    /// The cluster's name (`metadata.name`).
    pub fn name(&self) -> &str {
        self.cluster.value.name()
    }

    /// The groups' specs as stored, without their versions or sources.
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

/// The clusters of one state store: reads whole clusters, writes each object conditionally.
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
    /// Clusters in `store`.
    pub fn new(store: Arc<dyn StateStore>) -> Self {
        Repo { store }
    }

    /// The store underneath, for objects other than specs (locks, secrets, plans).
    pub fn store(&self) -> &Arc<dyn StateStore> {
        &self.store
    }

    /// The store's location for messages (`file:///path`, `s3://bucket/prefix`).
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

    /// Reads the cluster `name` and all its groups; a missing `config` is `NotFound`,
    /// `Unreadable` or `BackupsOnly` depending on what else of the cluster remains.
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

    /// Deletes one instance group's object if it is still at version `expected`.
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
            self.store.delete(&k, Precondition::None).await?;
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
            self.store.delete(&k, Precondition::None).await?;
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
            self.store.delete(&k, Precondition::None).await?;
            deleted.push(k);
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
