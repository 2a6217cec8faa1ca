//! Where a cluster's objects live in the store (the kops layout, plus kprov's lock and journal):
//!
//! ```text
//! <cluster>/config                    the Cluster as the user wrote it
//! <cluster>/cluster-completed.spec    the Cluster with every default filled in
//! <cluster>/instancegroup/<name>      one InstanceGroup each
//! <cluster>/lock                      the cluster lock (see lock.rs)
//! <cluster>/known_hosts               SSH host keys accepted for the cluster's hosts
//! <cluster>/pki/...                   certificates and keys
//! <cluster>/secrets/...               other secrets
//! <cluster>/journal/...               the operation journal
//! <cluster>/status/images             the AMIs image name patterns were pinned to (aws)
//! ```
//!
//! Every key is built here, so no other module spells a path.

use super::{StateError, StateStore};

const CONFIG: &str = "config";
const COMPLETED: &str = "cluster-completed.spec";
const INSTANCE_GROUPS: &str = "instancegroup";
const LOCK: &str = "lock";
const KNOWN_HOSTS: &str = "known_hosts";
const PKI: &str = "pki";
const SECRETS: &str = "secrets";
const JOURNAL: &str = "journal";
const HOSTS: &str = "hosts";
const STATUS: &str = "status";

/// The keys of one cluster. The name must be a single key segment; the spec validator checks
/// the stricter DNS rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterKeys {
    name: String,
}

impl ClusterKeys {
    /// The keys of cluster `cluster`; refused when the name is not a single key segment.
    pub fn new(cluster: &str) -> Result<ClusterKeys, StateError> {
        single_segment(cluster, "cluster name")?;
        Ok(ClusterKeys {
            name: cluster.to_string(),
        })
    }

    /// The cluster's name, as given to [`ClusterKeys::new`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `<cluster>/`: every key of the cluster starts with it.
    pub fn prefix(&self) -> String {
        format!("{}/", self.name)
    }

    /// `<cluster>/config`: the Cluster as the user wrote it.
    pub fn config(&self) -> String {
        self.key(CONFIG)
    }

    /// `<cluster>/cluster-completed.spec`: the Cluster and groups with every default filled in.
    pub fn completed_spec(&self) -> String {
        self.key(COMPLETED)
    }

    /// `<cluster>/instancegroup/`: every InstanceGroup's key starts with it.
    pub fn instance_groups_prefix(&self) -> String {
        self.dir(INSTANCE_GROUPS)
    }

    /// `<cluster>/instancegroup/<group>`; refused when `group` is not a single segment.
    pub fn instance_group(&self, group: &str) -> Result<String, StateError> {
        self.child(INSTANCE_GROUPS, group, "instance group name")
    }

    /// `<cluster>/lock`: the cluster lock (see [`super::lock`]).
    pub fn lock(&self) -> String {
        self.key(LOCK)
    }

    /// `<cluster>/known_hosts`: the SSH host keys accepted for the cluster's hosts.
    pub fn known_hosts(&self) -> String {
        self.key(KNOWN_HOSTS)
    }

    /// `<cluster>/pki/`: certificates and keys.
    pub fn pki_prefix(&self) -> String {
        self.dir(PKI)
    }

    /// `<cluster>/pki/<path>`; `path` may have several segments (`issued/ca.crt`).
    pub fn pki(&self, path: &str) -> Result<String, StateError> {
        self.below(PKI, path)
    }

    /// `<cluster>/secrets/`: secrets other than the PKI.
    pub fn secrets_prefix(&self) -> String {
        self.dir(SECRETS)
    }

    /// `<cluster>/secrets/<path>`; `path` may have several segments (`registries/HOST`).
    pub fn secret(&self, path: &str) -> Result<String, StateError> {
        self.below(SECRETS, path)
    }

    /// `<cluster>/hosts/`: kprov's record of the hosts it provisioned.
    pub fn hosts_prefix(&self) -> String {
        self.dir(HOSTS)
    }

    /// `<cluster>/hosts/<name>`: one provisioned host's record; `name` is a single segment.
    pub fn host(&self, name: &str) -> Result<String, StateError> {
        self.child(HOSTS, name, "host name")
    }

    /// What kprov chose once and keeps (see `cloud::aws::images`): not the user's spec, not
    /// a secret.
    pub fn pinned_images(&self) -> String {
        self.key(&format!("{STATUS}/images"))
    }

    /// `<cluster>/backups/`: etcd snapshots, kept by `delete cluster` unless asked (they are
    /// what a cluster deleted by mistake is restored from).
    pub fn backups_prefix(&self) -> String {
        self.key("backups/")
    }

    /// `<cluster>/journal/`: the operation journal.
    pub fn journal_prefix(&self) -> String {
        self.dir(JOURNAL)
    }

    /// `<cluster>/journal/<entry>`; `entry` may have several segments.
    pub fn journal(&self, entry: &str) -> Result<String, StateError> {
        self.below(JOURNAL, entry)
    }

    fn key(&self, rest: &str) -> String {
        format!("{}/{rest}", self.name)
    }

    /// `<cluster>/<dir>/`.
    fn dir(&self, dir: &str) -> String {
        self.key(&format!("{dir}/"))
    }

    /// `<cluster>/<dir>/<name>`, where `name` (a `what`, for the error) is one segment.
    fn child(&self, dir: &str, name: &str, what: &str) -> Result<String, StateError> {
        single_segment(name, what)?;
        Ok(self.key(&format!("{dir}/{name}")))
    }

    fn below(&self, dir: &str, path: &str) -> Result<String, StateError> {
        let key = self.key(&format!("{dir}/{path}"));
        super::validate_key(&key)?;
        Ok(key)
    }

    /// Names of the cluster's instance groups, sorted.
    pub async fn instance_groups(&self, store: &dyn StateStore) -> Result<Vec<String>, StateError> {
        let prefix = self.instance_groups_prefix();
        Ok(store
            .list(&prefix)
            .await?
            .into_iter()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_string))
            .filter(|name| !name.contains('/'))
            .collect())
    }

    /// Deletes every object of the cluster except its lock, which the caller holds and
    /// releases last so no one starts on a half-deleted cluster. Returns the keys deleted.
    pub async fn delete_all(&self, store: &dyn StateStore) -> Result<Vec<String>, StateError> {
        let lock = self.lock();
        let keys: Vec<String> = store
            .list(&self.prefix())
            .await?
            .into_iter()
            .filter(|k| *k != lock)
            .collect();
        for key in &keys {
            store.delete(key, super::Precondition::None).await?;
        }
        Ok(keys)
    }
}

fn single_segment(name: &str, what: &str) -> Result<(), StateError> {
    super::validate_key(name)?;
    if name.contains('/') {
        return Err(StateError::InvalidKey {
            key: name.to_string(),
            reason: format!("a {what} must not contain '/'"),
        });
    }
    Ok(())
}

/// Clusters in the store: top-level directories that hold a `config` (a half-deleted cluster
/// without one, or a stray lock, is not a cluster). Sorted.
pub async fn list_clusters(store: &dyn StateStore) -> Result<Vec<String>, StateError> {
    let suffix = format!("/{CONFIG}");
    Ok(store
        .list("")
        .await?
        .into_iter()
        .filter_map(|k| k.strip_suffix(&suffix).map(str::to_string))
        .filter(|name| !name.contains('/'))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_kops_layout() {
        let c = ClusterKeys::new("demo.example.com").unwrap();
        assert_eq!(c.config(), "demo.example.com/config");
        assert_eq!(
            c.completed_spec(),
            "demo.example.com/cluster-completed.spec"
        );
        assert_eq!(
            c.instance_group("nodes-us-east-1a").unwrap(),
            "demo.example.com/instancegroup/nodes-us-east-1a"
        );
        assert_eq!(c.lock(), "demo.example.com/lock");
        assert_eq!(c.known_hosts(), "demo.example.com/known_hosts");
        assert_eq!(
            c.pki("issued/ca.crt").unwrap(),
            "demo.example.com/pki/issued/ca.crt"
        );
        assert_eq!(c.secret("admin").unwrap(), "demo.example.com/secrets/admin");
        assert_eq!(c.journal_prefix(), "demo.example.com/journal/");
    }

    #[test]
    fn names_that_would_escape_are_refused() {
        for bad in ["", "a/b", "..", ".hidden", "/abs"] {
            assert!(ClusterKeys::new(bad).is_err(), "{bad:?} accepted");
        }
        let c = ClusterKeys::new("demo").unwrap();
        assert!(c.instance_group("a/b").is_err());
        assert!(c.pki("../../other/config").is_err());
        let e = c.instance_group("x/y").unwrap_err().to_string();
        assert!(
            e.contains("instance group name") && e.contains("x/y"),
            "{e}"
        );
    }
}
