//! kprov's record of provisioned hosts (`<cluster>/hosts/<name>`, written by
//! `ops::nodes::converge` for every host that converged): what lets `update cluster` say that
//! a host removed from the inventory is still in the cluster, and what lets `delete instance`
//! and `delete cluster` reach such a host (its SSH details are in the record). It is kprov's
//! own record and needs no API server, so the metal preview stays offline. Read back as
//! untrusted (the store is a trust boundary): bounded, and every field validated as the spec's.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use bytes::Bytes;

use crate::spec::{Host, ResolvedCluster};
use crate::state::layout::ClusterKeys;
use crate::state::{Precondition, StateStore};

/// Largest record of a provisioned host kprov reads back.
const RECORD_LIMIT: usize = 64 * 1024;

/// Reads the record of a provisioned host stored at `<cluster>/hosts/<name>` with the rules
/// [`record_provisioned`] writes it by: at most [`RECORD_LIMIT`] bytes of JSON, the host named
/// as its key, and every SSH field as the spec's validation admits it (address, ip, user,
/// port, key path, bastion, labels, taints), since `delete instance` connects with them.
pub(crate) fn check_host_record(name: &str, data: &[u8]) -> Result<Host, String> {
    use crate::output::untrusted;
    use crate::spec::validate as v;
    crate::state::check_size(
        data,
        RECORD_LIMIT,
        format_args!("a host record's {RECORD_LIMIT}"),
    )?;
    let h: Host = serde_json::from_slice(data)
        .map_err(|e| format!("not a host record: {}", untrusted(&e.to_string())))?;
    if h.name != name {
        return Err(format!(
            "it names host {:?}, not {name:?} of its key",
            untrusted(&h.name)
        ));
    }
    let field = |f: &str, r: Result<(), String>| r.map_err(|e| format!("{f}: {e}"));
    field("address", v::check_ssh_host(&h.address))?;
    for (f, a) in [("ip", &h.ip), ("accessIP", &h.access_ip)] {
        if let Some(a) = a {
            field(f, v::check_ssh_host(a))?;
        }
    }
    if let Some(u) = &h.user {
        field("user", v::check_ssh_user(u))?;
    }
    if let Some(p) = h.port {
        field("port", v::check_ssh_port(p.into()))?;
    }
    if let Some(k) = &h.key_path {
        field("keyPath", v::check_key_path(k))?;
    }
    if let Some(b) = &h.bastion {
        field("bastion", v::check_bastion(b))?;
    }
    for (k, val) in &h.labels {
        field(
            "labels",
            v::check_label_key(k).and(v::check_label_value(val)),
        )?;
    }
    for t in &h.taints {
        field("taints", v::check_taint(t))?;
    }
    if h.roles.is_empty() {
        return Err("it has no roles".into());
    }
    Ok(h)
}

/// kprov's records of provisioned hosts: the good ones by name, and the keys of those that
/// fail [`check_host_record`] with the reason (never used).
pub(crate) async fn host_records(
    store: &dyn StateStore,
    cluster: &str,
) -> anyhow::Result<(BTreeMap<String, Host>, Vec<(String, String)>)> {
    let keys = ClusterKeys::new(cluster)?;
    let prefix = keys.hosts_prefix();
    let mut good = BTreeMap::new();
    let mut damaged = Vec::new();
    for key in store.list(&prefix).await? {
        let Some(o) = store.get(&key).await? else {
            continue;
        };
        let name = key.strip_prefix(&prefix).unwrap_or(&key);
        match check_host_record(name, &o.data) {
            Ok(h) => {
                good.insert(h.name.clone(), h);
            }
            Err(reason) => damaged.push((key, reason)),
        }
    }
    Ok((good, damaged))
}

/// The hosts kprov provisioned for `cluster` (its record), by name. A damaged record is
/// refused, naming its key and the command that removes it: a host missing from this list
/// would be taken for one that was never provisioned.
pub(crate) async fn provisioned_hosts(
    store: &dyn StateStore,
    cluster: &str,
) -> anyhow::Result<BTreeMap<String, Host>> {
    let (good, damaged) = host_records(store, cluster).await?;
    if let Some((key, reason)) = damaged.first() {
        bail!(
            "the record of a provisioned host {} is damaged ({}) and is not used; \
             `kprov delete damaged {cluster}` lists it and `kprov delete damaged {cluster} \
             --yes` removes it (the host is then no longer known as provisioned: `update \
             cluster` re-provisions it if the spec lists it)",
            store.key_location(key),
            crate::output::untrusted(reason)
        );
    }
    Ok(good)
}

/// Records the hosts that converged (called by `converge`): compare-and-swap, unchanged
/// records are not rewritten.
pub(crate) async fn record_provisioned(
    store: &dyn StateStore,
    cluster: &str,
    hosts: &[&Host],
) -> anyhow::Result<()> {
    let keys = ClusterKeys::new(cluster)?;
    for h in hosts {
        let key = keys.host(&h.name)?;
        let data = serde_json::to_vec(h)?;
        let cond = match store.get(&key).await? {
            Some(o) if o.data == data => continue,
            Some(o) => Precondition::Matches(o.version),
            None => Precondition::Absent,
        };
        store
            .put(&key, Bytes::from(data), cond)
            .await
            .with_context(|| format!("recording host {} as provisioned", h.name))?;
    }
    Ok(())
}

pub(crate) async fn forget_provisioned(
    store: &dyn StateStore,
    cluster: &str,
    host: &str,
) -> anyhow::Result<()> {
    let key = ClusterKeys::new(cluster)?.host(host)?;
    if let Some(o) = store.get(&key).await? {
        store.delete(&key, Precondition::Matches(o.version)).await?;
    }
    Ok(())
}

/// Hosts kprov provisioned that the spec no longer lists: still in the cluster until
/// `kprov delete instance` removes them.
pub(crate) async fn hosts_to_remove(
    store: &dyn StateStore,
    cluster: &ResolvedCluster,
) -> anyhow::Result<Vec<Host>> {
    let recorded = provisioned_hosts(store, &cluster.name).await?;
    Ok(recorded
        .into_values()
        .filter(|h| {
            !cluster
                .completed
                .spec
                .hosts
                .iter()
                .any(|s| s.name == h.name)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_records_are_checked_by_the_rules_they_are_written_by() {
        let good = serde_json::json!({
            "name": "w1", "address": "198.18.0.11", "user": "debian", "port": 22,
            "roles": ["node"],
        });
        let h = check_host_record("w1", good.to_string().as_bytes()).expect("good");
        // What record_provisioned writes reads back the same.
        assert_eq!(
            check_host_record("w1", &serde_json::to_vec(&h).unwrap()),
            Ok(h)
        );
        let damaged = |field: &str, value: serde_json::Value| {
            let mut v = good.clone();
            v[field] = value;
            check_host_record("w1", v.to_string().as_bytes()).expect_err(field)
        };
        assert_eq!(
            damaged("name", "w2".into()),
            "it names host \"w2\", not \"w1\" of its key"
        );
        assert!(
            damaged("address", "-oProxyCommand=touch\u{1b}[2J".into())
                .starts_with("address: \"-oProxyCommand=touch\\u{1b}[2J\" is not a host name")
        );
        assert!(damaged("bastion", "a b".into()).starts_with("bastion: "));
        assert!(damaged("keyPath", "-i".into()).starts_with("keyPath: "));
        assert!(damaged("user", "root\nerror: x".into()).starts_with("user: "));
        assert_eq!(damaged("roles", serde_json::json!([])), "it has no roles");
        let e = damaged("roles", serde_json::json!(["\u{1b}]52;c;eA==\u{7}"]));
        assert!(
            e.starts_with("not a host record: ") && !e.contains('\u{1b}'),
            "{e}"
        );
        assert!(
            check_host_record("w1", &vec![b' '; RECORD_LIMIT + 1])
                .unwrap_err()
                .contains("more than a host record's")
        );
    }
}
