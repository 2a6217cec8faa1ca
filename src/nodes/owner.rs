//! A host belongs to exactly one cluster.
//!
//! At first provisioning kprov writes `/var/lib/kprov/owner` on the host before anything else
//! changes it (the `ownership: claim` step, created atomically with `ln`, so two clusters
//! racing for one host cannot both win). The marker names a random cluster UID kept in the
//! cluster's state store (`<cluster>/secrets/cluster-uid`), the cluster name and the store's
//! location: two stores holding clusters of the same name still differ by UID. Observation
//! reads the marker; a host whose marker names another UID is refused in the node plan and is
//! never provisioned, reset or asked for its admin kubeconfig.
//!
//! Caveat: a host provisioned by a kprov that predates markers carries none; the first
//! cluster that updates it claims it. `delete cluster` resets only hosts with its own marker.

use bytes::Bytes;
use rand::RngCore;

use crate::state::layout::ClusterKeys;
use crate::state::{Precondition, StateError, StateStore};

/// Where the marker lives on a host (removed by `delete cluster`'s reset with the rest of
/// /var/lib/kprov).
pub(crate) const OWNER_FILE: &str = "/var/lib/kprov/owner";
/// The store secret holding the cluster's UID.
pub(crate) const UID_SECRET: &str = "cluster-uid";
/// Markers are a few lines; anything longer is not one of kprov's.
const MAX_MARKER: usize = 4096;

/// The cluster a host belongs to, as its marker says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    /// Random, kept in the state store: what ownership is decided by.
    pub uid: String,
    /// For people: which cluster, in which store.
    pub cluster: String,
    /// The state store's URL, for people.
    pub store: String,
}

/// Keeps marker values on one line each, whatever the store location contains.
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

impl Owner {
    /// The marker's text: `key=value` lines.
    pub(crate) fn marker(&self) -> String {
        format!(
            "uid={}\ncluster={}\nstore={}\n",
            one_line(&self.uid),
            one_line(&self.cluster),
            one_line(&self.store)
        )
    }

    /// Reads a marker; `None` when it names no UID (not a marker kprov wrote).
    pub(crate) fn parse(bytes: &[u8]) -> Option<Owner> {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_MARKER)]);
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
                .map(|v| v.trim().to_string())
        };
        Some(Owner {
            uid: get("uid").filter(|u| !u.is_empty())?,
            cluster: get("cluster").unwrap_or_else(|| "(unnamed)".into()),
            store: get("store").unwrap_or_else(|| "(unknown store)".into()),
        })
    }

    /// "cluster X (state store Y)", for messages.
    pub(crate) fn describe(&self) -> String {
        format!("cluster {} (state store {})", self.cluster, self.store)
    }
}

fn uid_key(cluster: &str) -> Result<String, StateError> {
    ClusterKeys::new(cluster)?.secret(UID_SECRET)
}

fn parse_uid(data: &[u8]) -> Option<String> {
    let uid = String::from_utf8_lossy(data).trim().to_string();
    (!uid.is_empty() && uid.len() <= 128 && uid.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then_some(uid)
}

/// The cluster's identity if it has one (read-only: what a preview uses). A cluster without a
/// UID has never claimed a host.
pub(crate) async fn read(
    store: &dyn StateStore,
    cluster: &str,
) -> Result<Option<Owner>, StateError> {
    let key = uid_key(cluster)?;
    let Some(obj) = store.get(&key).await? else {
        return Ok(None);
    };
    let uid = parse_uid(&obj.data).ok_or_else(|| StateError::Backend {
        location: store.key_location(&key),
        message: "not a cluster UID (expected up to 128 letters and digits)".into(),
    })?;
    Ok(Some(Owner {
        uid,
        cluster: cluster.to_string(),
        store: store.location(),
    }))
}

/// The cluster's identity, created (compare-and-swap) on first use. Call under the cluster
/// lock, before anything claims a host.
pub(crate) async fn ensure(store: &dyn StateStore, cluster: &str) -> Result<Owner, StateError> {
    for _ in 0..3 {
        if let Some(owner) = read(store, cluster).await? {
            return Ok(owner);
        }
        let mut raw = [0u8; 16];
        rand::rng().fill_bytes(&mut raw);
        let key = uid_key(cluster)?;
        match store
            .put(&key, Bytes::from(hex::encode(raw)), Precondition::Absent)
            .await
        {
            Ok(_) => {}
            // Someone else made it first: theirs wins, read it back.
            Err(StateError::AlreadyExists { .. } | StateError::Conflict { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    read(store, cluster)
        .await?
        .ok_or_else(|| StateError::Backend {
            location: store.location(),
            message: format!("the UID of {cluster} could not be created"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_round_trips_and_stays_on_its_lines() {
        let o = Owner {
            uid: "abc123".into(),
            cluster: "demo.example.com".into(),
            store: "file:///var/tmp/store\nuid=evil".into(),
        };
        let text = o.marker();
        assert_eq!(text.lines().count(), 3, "{text}");
        let back = Owner::parse(text.as_bytes()).unwrap();
        assert_eq!(back.uid, "abc123");
        assert_eq!(back.store, "file:///var/tmp/store uid=evil");
        assert_eq!(Owner::parse(b"cluster=x\n"), None);
        assert_eq!(Owner::parse(b""), None);
    }
}
