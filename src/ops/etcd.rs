//! etcd backups and restores (Kubespray's `etcd` backup tasks and `recover-control-plane.yml`,
//! kubeadm's documented restore), on either topology: stacked (kubeadm's static pods on the
//! control planes) and external (kprov's host-deployed etcd service on the etcd hosts).
//!
//! - [`backup`] takes a snapshot on the first healthy member, reads it back (bounded by
//!   [`SNAPSHOT_LIMIT`]) and stores it as `<cluster>/backups/etcd/<id>.db` with a JSON record
//!   (`<id>.json`: sha256, size, member, time, topology). The caller holds the cluster lock:
//!   `kprov backup etcd` takes it, a rolling update calls this under its own.
//! - [`list`] reads the records; [`load`] fetches one snapshot and verifies its checksum.
//! - [`restore`] verifies the snapshot first, then on every host: API servers and etcd stop,
//!   each member restores the snapshot with its own name and peer URL into fresh data whose
//!   `member` directory replaces the old one in `/var/lib/etcd` (the old kept as
//!   `/var/lib/etcd/kprov-previous/member`; the data directory may be a mount point), etcd starts on all
//!   members at once, each must turn healthy, then the API servers start again.
//!
//! - [`members`] reads the member list and every member's health (`etcdctl member list` and
//!   `endpoint health --cluster` on the first member that answers: inside kubeadm's static pod
//!   with stacked etcd, the service's etcdctl with host-deployed etcd), and [`assess`] says
//!   which members are unhealthy, naming each (name, peer URL, host). [`SshEtcdHealth`] is
//!   that check as the rolling update's validation gate calls it.
//!
//! Caveats: a snapshot is held in memory while it moves (the state store writes whole
//! objects), so [`SNAPSHOT_LIMIT`] bounds memory too. Backups live under the cluster's prefix:
//! `delete cluster` removes them with the rest of its state.

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::nodes::Target;
use crate::nodes::model::Facts;
use crate::ops::etcd_members::{self, EtcdMember};
use crate::ops::rolling::{EtcdError, EtcdHealth};
use crate::provision::render::{self, Renderer};
use crate::spec::{EtcdType, ResolvedCluster};
use crate::ssh::task::{HostExecutor, Step};
use crate::state::layout::ClusterKeys;
use crate::state::{Precondition, StateError, StateStore};

/// The largest snapshot kprov reads back: etcd's largest supported backend quota (8 GiB).
pub(crate) const SNAPSHOT_LIMIT: u64 = 8 << 30;
/// A backup record is a few hundred bytes; anything much larger is not one.
const RECORD_LIMIT: usize = 64 << 10;

/// One stored backup.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupRecord {
    /// What `restore etcd --from` takes: the time it was taken, `20261122T213500Z`.
    pub id: String,
    /// State store key of the snapshot.
    pub key: String,
    /// The snapshot's SHA-256, 64 lowercase hex digits; [`load`] refuses a snapshot that
    /// differs.
    pub sha256: String,
    /// The snapshot's length in bytes (1 byte to 8 GiB), checked again on [`load`].
    pub size: u64,
    /// The member it was taken on.
    pub host: String,
    /// RFC 3339.
    pub taken_at: String,
    /// `Stacked` or `External`.
    pub etcd: String,
}

fn prefix(cluster: &str) -> anyhow::Result<String> {
    Ok(format!(
        "{}backups/etcd/",
        ClusterKeys::new(cluster)?.prefix()
    ))
}

fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

async fn run(exec: &dyn HostExecutor, host: &str, steps: &[Step]) -> anyhow::Result<()> {
    exec.run_steps(host, steps)
        .await
        .map(|_| ())
        .map_err(|e| anyhow!(e))
}

/// The member list with every member's health, read on the first etcd member that answers
/// (each host tried in inventory order; the errors of all of them when none does).
pub(crate) async fn members(
    cluster: &ResolvedCluster,
    targets: &[Target],
    exec: &dyn HostExecutor,
) -> anyhow::Result<Vec<EtcdMember>> {
    let renderer = Renderer::new(cluster, targets).context("rendering the etcdctl calls")?;
    let hosts = renderer.etcd_members();
    if hosts.is_empty() {
        bail!("{} has no etcd member to ask", cluster.name);
    }
    let mut failures = Vec::new();
    for m in hosts {
        let etcdctl = match renderer.etcd_type() {
            EtcdType::Stacked => etcd_members::ETCDCTL.to_string(),
            EtcdType::External => renderer.etcdctl_function(m)?,
        };
        match etcd_members::etcd_members_with(exec, m.name(), &etcdctl).await {
            Ok(list) => return Ok(list),
            Err(e) => failures.push(format!("{}: {e:#}", m.name())),
        }
    }
    bail!(
        "could not read the etcd member list of {} on any member: {}",
        cluster.name,
        failures.join("; ")
    )
}

/// Whether etcd is healthy: at least one member, and every member of the list healthy. The
/// error names each unhealthy member with its peer URL and the target it runs on (found by
/// node name, which kubeadm names members after, by host name, else by peer address), and
/// says whether quorum still holds.
pub(crate) fn assess(members: &[EtcdMember], targets: &[Target]) -> Result<(), String> {
    if members.is_empty() {
        return Err("etcd lists no member".into());
    }
    let unhealthy: Vec<String> = members
        .iter()
        .filter(|m| !m.healthy)
        .map(|m| {
            let name = if m.name.is_empty() {
                format!("{} (unstarted)", m.hex_id())
            } else {
                m.name.clone()
            };
            let peer = if m.peer_urls.is_empty() {
                "no peer URL".to_string()
            } else {
                format!("peer {}", m.peer_urls.join(","))
            };
            let host = targets
                .iter()
                .find(|t| {
                    (!m.name.is_empty() && m.name == t.node_name)
                        || etcd_members::member_of(std::slice::from_ref(m), &t.host).is_some()
                })
                .map_or_else(
                    || "on no host of the spec".to_string(),
                    |t| format!("on host {}", t.name()),
                );
            format!("etcd member {name} ({peer}, {host}) is unhealthy")
        })
        .collect();
    if unhealthy.is_empty() {
        return Ok(());
    }
    let healthy = members.len() - unhealthy.len();
    let quorum = members.len() / 2 + 1;
    let margin = if healthy >= quorum {
        format!(
            "{healthy} of {} members healthy (quorum is {quorum})",
            members.len()
        )
    } else {
        format!(
            "{healthy} of {} members healthy: etcd has lost quorum ({quorum} needed)",
            members.len()
        )
    };
    Err(format!("{}; {margin}", unhealthy.join("; ")))
}

/// The etcd check of the rolling update's validation gate, over SSH.
pub(crate) struct SshEtcdHealth {
    pub cluster: ResolvedCluster,
    pub targets: Vec<Target>,
    pub exec: std::sync::Arc<dyn HostExecutor>,
}

#[async_trait::async_trait]
impl EtcdHealth for SshEtcdHealth {
    async fn check(&self) -> Result<(), EtcdError> {
        let members = members(&self.cluster, &self.targets, self.exec.as_ref())
            .await
            .map_err(|e| EtcdError::Unreachable(format!("{e:#}")))?;
        assess(&members, &self.targets).map_err(EtcdError::Unhealthy)
    }
}

/// Takes a snapshot on the first member that is healthy and answers, and stores it. The
/// caller holds the cluster lock. `now` names the backup.
pub async fn backup(
    store: &dyn StateStore,
    cluster: &ResolvedCluster,
    targets: &[Target],
    exec: &dyn HostExecutor,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<BackupRecord> {
    let renderer = Renderer::new(cluster, targets).context("rendering the snapshot steps")?;
    let members = renderer.etcd_members();
    if members.is_empty() {
        bail!("{} has no etcd member to back up", cluster.name);
    }
    let mut failures = Vec::new();
    for m in members {
        let snapshot = async {
            run(exec, m.name(), &[renderer.etcd_snapshot(m)?]).await?;
            let data = exec
                .read_file_bounded(m.name(), render::ETCD_SNAPSHOT, SNAPSHOT_LIMIT)
                .await?
                .ok_or_else(|| {
                    anyhow!("{}: etcdctl wrote no {}", m.name(), render::ETCD_SNAPSHOT)
                })?;
            // The file holds every secret of the cluster: it does not stay on the host.
            run(exec, m.name(), &[renderer.etcd_snapshot_cleanup()]).await?;
            anyhow::Ok(data)
        }
        .await;
        match snapshot {
            Ok(data) if data.is_empty() => failures.push(format!("{}: empty snapshot", m.name())),
            Ok(data) => return store_backup(store, cluster, m.name(), data, now).await,
            // Errors from the host name it already.
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    bail!(
        "no etcd member of {} gave a snapshot: {}",
        cluster.name,
        failures.join("; ")
    )
}

async fn store_backup(
    store: &dyn StateStore,
    cluster: &ResolvedCluster,
    host: &str,
    data: Bytes,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<BackupRecord> {
    let prefix = prefix(&cluster.name)?;
    // Ids are UTC seconds: a second backup within the same second (a refused roll, then the
    // next one at once) takes the next free second instead of failing on the first's key.
    let mut at = now;
    let record = loop {
        let id = at.format(ID_FORMAT).to_string();
        let record = BackupRecord {
            key: format!("{prefix}{id}.db"),
            id: id.clone(),
            sha256: sha256_hex(&data),
            size: data.len() as u64,
            host: host.to_string(),
            taken_at: at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            etcd: format!("{:?}", cluster.etcd),
        };
        // The snapshot first: a record always names a snapshot that is there.
        match store
            .put(&record.key, data.clone(), Precondition::Absent)
            .await
        {
            Ok(_) => break record,
            Err(StateError::AlreadyExists { .. }) if at < now + chrono::Duration::seconds(60) => {
                at += chrono::Duration::seconds(1);
            }
            Err(e) => return Err(e).with_context(|| format!("storing snapshot {id}")),
        }
    };
    let id = record.id.clone();
    store
        .put(
            &format!("{prefix}{id}.json"),
            Bytes::from(serde_json::to_vec_pretty(&record)?),
            Precondition::Absent,
        )
        .await
        .with_context(|| format!("storing the record of snapshot {id}"))?;
    Ok(record)
}

/// The format of a backup id: the UTC second it was taken.
const ID_FORMAT: &str = "%Y%m%dT%H%M%SZ";

/// A stored backup record that failed the checks on read: never listed as a backup, never
/// restored. `reason` quotes stored values only through [`crate::output::untrusted`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DamagedRecord {
    /// Where the record is, as the store names it ([`StateStore::key_location`]).
    pub key: String,
    /// Which check it failed, stored values escaped.
    pub reason: String,
}

/// What `<cluster>/backups/etcd/` holds: the good records, oldest first, and the damaged ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backups {
    /// The records that passed the checks, oldest id first.
    pub records: Vec<BackupRecord>,
    /// The records that did not, each with its reason; never restorable.
    pub damaged: Vec<DamagedRecord>,
}

impl BackupRecord {
    /// Checks a record read from `record_key` with the rules [`store_backup`] writes it by:
    /// the id is a UTC second, the record sits at `<prefix><id>.json` and names the snapshot
    /// `<prefix><id>.db` beside it, `takenAt` is that second in RFC 3339, the sha256 is 64
    /// lowercase hex digits, the size is that of a snapshot kprov reads back, the member is a
    /// host name and the topology one kprov knows.
    pub fn check(&self, prefix: &str, record_key: &str) -> Result<(), String> {
        use crate::output::untrusted;
        let id = &self.id;
        let taken = chrono::NaiveDateTime::parse_from_str(id, ID_FORMAT)
            .ok()
            .filter(|t| t.format(ID_FORMAT).to_string() == *id)
            .ok_or_else(|| format!("id {:?} is not a time like 20261122T213500Z", untrusted(id)))?
            .and_utc();
        let own_record = format!("{prefix}{id}.json");
        if record_key != own_record {
            return Err(format!(
                "its id {:?} is not its own key's (the record of {id} is {own_record})",
                untrusted(id)
            ));
        }
        let own_snapshot = format!("{prefix}{id}.db");
        if self.key != own_snapshot {
            return Err(format!(
                "it names {:?}, not its own snapshot {own_snapshot:?}",
                untrusted(&self.key)
            ));
        }
        match chrono::DateTime::parse_from_rfc3339(&self.taken_at) {
            Ok(t) if t.to_utc() == taken => {}
            Ok(_) => {
                return Err(format!(
                    "takenAt {:?} is not the time of its id {id}",
                    untrusted(&self.taken_at)
                ));
            }
            Err(_) => {
                return Err(format!(
                    "takenAt {:?} is not an RFC 3339 time",
                    untrusted(&self.taken_at)
                ));
            }
        }
        if self.sha256.len() != 64
            || !self
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!(
                "sha256 {:?} is not 64 lowercase hex digits",
                untrusted(&self.sha256)
            ));
        }
        if self.size == 0 || self.size > SNAPSHOT_LIMIT {
            return Err(format!(
                "size {} is not that of a snapshot (1 byte to {SNAPSHOT_LIMIT})",
                self.size
            ));
        }
        let host_ok = !self.host.is_empty()
            && self.host.len() <= 253
            && self
                .host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'));
        if !host_ok {
            return Err(format!(
                "member {:?} is not a host name",
                untrusted(&self.host)
            ));
        }
        if !matches!(self.etcd.as_str(), "Stacked" | "External") {
            return Err(format!(
                "etcd {:?} is neither Stacked nor External",
                untrusted(&self.etcd)
            ));
        }
        Ok(())
    }
}

/// A stored backup record read from `key` under `prefix`: bounded, JSON, then
/// [`BackupRecord::check`].
pub(crate) fn check_record(prefix: &str, key: &str, data: &[u8]) -> Result<BackupRecord, String> {
    crate::state::check_size(
        data,
        RECORD_LIMIT,
        format_args!("a backup record's {RECORD_LIMIT}"),
    )?;
    serde_json::from_slice::<BackupRecord>(data)
        .map_err(|e| {
            // serde quotes the offending value as it is.
            format!(
                "not a backup record: {}",
                crate::output::untrusted(&e.to_string())
            )
        })
        .and_then(|r| r.check(prefix, key).map(|()| r))
}

/// Every backup of `cluster`: the records that pass [`BackupRecord::check`], oldest first, and
/// the others as damaged with their key and reason (the store is a trust boundary: nothing is
/// skipped silently, and nothing that fails is used).
pub async fn list(store: &dyn StateStore, cluster: &str) -> anyhow::Result<Backups> {
    let prefix = prefix(cluster)?;
    let mut out = Backups::default();
    for key in store.list(&prefix).await? {
        if !key.ends_with(".json") {
            continue;
        }
        let Some(obj) = store.get(&key).await? else {
            continue;
        };
        match check_record(&prefix, &key, &obj.data) {
            Ok(r) => out.records.push(r),
            Err(reason) => out.damaged.push(DamagedRecord {
                key: store.key_location(&key),
                reason,
            }),
        }
    }
    out.records.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// The snapshot `id` (`20261122T213500Z`, or its key's file name) with its record, after
/// checking the record and the snapshot's size and sha256 against it.
pub async fn load(
    store: &dyn StateStore,
    cluster: &str,
    id: &str,
) -> anyhow::Result<(BackupRecord, Bytes)> {
    let id = id.trim_end_matches(".db").trim_end_matches(".json");
    let id = id.rsplit('/').next().unwrap_or(id);
    let shown = crate::output::untrusted(id);
    let backups = list(store, cluster).await?;
    let record_key = store.key_location(&format!("{}{id}.json", prefix(cluster)?));
    if let Some(d) = backups.damaged.iter().find(|d| d.key == record_key) {
        bail!(
            "backup record {} is damaged ({}); refused",
            crate::output::untrusted(&d.key),
            d.reason
        );
    }
    let Some(record) = backups.records.into_iter().find(|r| r.id == id) else {
        bail!("{cluster} has no etcd backup {shown:?} (see `kprov get backups {cluster}`)");
    };
    let data = store
        .get(&record.key)
        .await?
        .ok_or_else(|| anyhow!("{}: snapshot missing", store.key_location(&record.key)))?
        .data;
    let actual = sha256_hex(&data);
    if data.len() as u64 != record.size || actual != record.sha256 {
        bail!(
            "{}: checksum mismatch: the record says sha256 {} ({} bytes), the stored snapshot has {} ({} bytes); refusing to restore it",
            store.key_location(&record.key),
            record.sha256,
            record.size,
            actual,
            data.len()
        );
    }
    Ok((record, data))
}

/// What a restore will do, host by host (the preview prints it).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RestorePlan {
    pub backup: BackupRecord,
    pub etcd: String,
    /// (host, what happens there), in order.
    pub hosts: Vec<(String, Vec<String>)>,
}

/// The etcd members among `targets`: the control planes (stacked etcd) or the `etcd` hosts
/// (external).
pub(crate) fn members_of<'t>(cluster: &ResolvedCluster, targets: &'t [Target]) -> Vec<&'t Target> {
    let ty = cluster.etcd;
    targets
        .iter()
        .filter(|t| match ty {
            EtcdType::Stacked => t.is_control_plane(),
            EtcdType::External => t.has_role(crate::spec::HostRole::Etcd),
        })
        .collect()
}

pub(crate) fn restore_plan(
    cluster: &ResolvedCluster,
    targets: &[Target],
    backup: &BackupRecord,
) -> RestorePlan {
    let ty = cluster.etcd;
    let members: Vec<&str> = members_of(cluster, targets)
        .into_iter()
        .map(|t| t.name())
        .collect();
    let mut hosts = Vec::new();
    for t in targets {
        let member = members.contains(&t.name());
        if !member && !t.is_control_plane() {
            continue;
        }
        let mut what = Vec::new();
        if t.is_control_plane() {
            what.push("stop the API server (manifest set aside)".to_string());
        }
        if member {
            what.push(match ty {
                EtcdType::Stacked => "stop etcd (static pod manifest set aside)".to_string(),
                EtcdType::External => "stop the etcd service".to_string(),
            });
            what.push(format!(
                "etcdutl snapshot restore as member {} into fresh data in /var/lib/etcd (the old kept as /var/lib/etcd/kprov-previous)",
                t.node_name
            ));
            what.push("start etcd, wait until healthy".to_string());
        }
        if t.is_control_plane() {
            what.push("start the API server".to_string());
        }
        hosts.push((t.name().to_string(), what));
    }
    RestorePlan {
        backup: backup.clone(),
        etcd: format!("{ty:?}"),
        hosts,
    }
}

/// Restores `snapshot` (already verified by [`load`]) on every member. The caller holds the
/// cluster lock. Stops at the first phase that fails on any host, naming it; a re-run
/// restores again from the start.
pub(crate) async fn restore(
    cluster: &ResolvedCluster,
    targets: &[Target],
    exec: &dyn HostExecutor,
    snapshot: &Bytes,
) -> anyhow::Result<()> {
    let renderer = Renderer::new(cluster, targets).context("rendering the restore steps")?;
    let members: Vec<&Target> = renderer.etcd_members();
    let affected: Vec<&Target> = targets
        .iter()
        .filter(|t| t.is_control_plane() || members.iter().any(|m| m.name() == t.name()))
        .collect();
    // Architectures first: a host kprov never provisioned has no facts, and nothing stops.
    let mut arch = Vec::new();
    for m in &members {
        let facts = exec
            .read_file(m.name(), render::FACTS_FILE)
            .await?
            .ok_or_else(|| {
                anyhow!(
                    "{}: no {} (never provisioned by kprov?)",
                    m.name(),
                    render::FACTS_FILE
                )
            })?;
        let a = Facts::parse(&String::from_utf8_lossy(&facts))
            .arch()
            .ok_or_else(|| anyhow!("{}: unknown architecture", m.name()))?;
        arch.push(a);
    }
    let phase = |name: &'static str, work: Vec<(String, Vec<Step>)>| async move {
        let results = futures::future::join_all(
            work.iter()
                .map(|(h, steps)| async move { (h.clone(), run(exec, h, steps).await) }),
        )
        .await;
        let failed: Vec<String> = results
            .into_iter()
            .filter_map(|(_, r)| r.err().map(|e| format!("{e:#}")))
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(anyhow!(
                "restore phase {name:?} failed: {}",
                failed.join("; ")
            ))
        }
    };
    phase(
        "stop",
        affected
            .iter()
            .map(|t| (t.name().to_string(), vec![renderer.etcd_restore_stop(t)]))
            .collect(),
    )
    .await?;
    let mut work = Vec::new();
    for (m, a) in members.iter().zip(arch) {
        work.push((
            m.name().to_string(),
            renderer.etcd_restore_member(m, a, snapshot)?,
        ));
    }
    phase("snapshot restore", work).await?;
    phase(
        "start etcd",
        members
            .iter()
            .map(|m| (m.name().to_string(), vec![renderer.etcd_restore_start()]))
            .collect(),
    )
    .await?;
    let mut work = Vec::new();
    for m in &members {
        work.push((m.name().to_string(), vec![renderer.etcd_health(m)?]));
    }
    phase("health", work).await?;
    phase(
        "start API servers",
        affected
            .iter()
            .filter(|t| t.is_control_plane())
            .map(|t| {
                (
                    t.name().to_string(),
                    vec![renderer.etcd_restore_apiserver()],
                )
            })
            .collect(),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;
    use crate::provision::orchestrate::tests::resolved;
    use crate::spec::Cluster;

    fn good() -> BackupRecord {
        BackupRecord {
            id: "20261122T213500Z".into(),
            key: "c.example.com/backups/etcd/20261122T213500Z.db".into(),
            sha256: "ab".repeat(32),
            size: 8,
            host: "cp1".into(),
            taken_at: "2026-11-22T21:35:00Z".into(),
            etcd: "Stacked".into(),
        }
    }

    #[tokio::test]
    async fn two_backups_in_one_second_both_kept_with_ids_that_pass_the_checks() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::state::file::FileStore::new(dir.path()).unwrap();
        let cluster: Cluster = serde_saphyr::from_str(
            "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata: {name: c.example.com}\nspec: {cloudProvider: metal, kubernetesVersion: 1.36.4}\n",
        )
        .unwrap();
        let now = chrono::DateTime::parse_from_rfc3339("2026-11-26T13:56:24Z")
            .unwrap()
            .to_utc();
        let a = store_backup(
            &store,
            &resolved(&cluster),
            "cp1",
            Bytes::from_static(b"one"),
            now,
        )
        .await
        .unwrap();
        let b = store_backup(
            &store,
            &resolved(&cluster),
            "cp1",
            Bytes::from_static(b"two"),
            now,
        )
        .await
        .unwrap();
        assert_eq!(a.id, "20261126T135624Z");
        assert_eq!(b.id, "20261126T135625Z");
        let listed = list(&store, "c.example.com").await.unwrap();
        assert!(listed.damaged.is_empty(), "{:?}", listed.damaged);
        assert_eq!(listed.records, vec![a, b]);
    }

    #[test]
    fn backup_records_are_checked_by_the_rules_they_are_written_by() {
        let prefix = "c.example.com/backups/etcd/";
        let own = "c.example.com/backups/etcd/20261122T213500Z.json";
        good().check(prefix, own).unwrap();
        type Change = Box<dyn Fn(&mut BackupRecord)>;
        let cases: Vec<(Change, &str, &str)> = vec![
            (
                Box::new(|r| r.id = "../../../x".into()),
                "../../../x.json",
                "id \"../../../x\" is not a time",
            ),
            (
                Box::new(|r| r.id = "20261122T213500Z\n".into()),
                own,
                "id \"20261122T213500Z\\n\" is not a time",
            ),
            (
                Box::new(|_| {}),
                "c.example.com/backups/etcd/other.json",
                "is not its own key's",
            ),
            (
                Box::new(|r| r.key = "c.example.com/secrets/admin.conf".into()),
                own,
                "not its own snapshot",
            ),
            (
                Box::new(|r| r.taken_at = "yesterday".into()),
                own,
                "not an RFC 3339 time",
            ),
            (
                Box::new(|r| r.taken_at = "2026-11-22T21:35:01Z".into()),
                own,
                "not the time of its id",
            ),
            (
                Box::new(|r| r.sha256 = "AB".repeat(32)),
                own,
                "not 64 lowercase hex",
            ),
            (Box::new(|r| r.size = 0), own, "size 0"),
            (
                Box::new(|r| r.size = SNAPSHOT_LIMIT + 1),
                own,
                "is not that of a snapshot",
            ),
            (
                Box::new(|r| r.host = "\u{1b}]52;c;eA==\u{7}".into()),
                own,
                "member \"\\x1b]52;c;eA==\\x07\" is not a host name",
            ),
            (
                Box::new(|r| r.etcd = "Other".into()),
                own,
                "neither Stacked nor External",
            ),
        ];
        for (change, key, reason) in cases {
            let mut r = good();
            change(&mut r);
            let e = r.check(prefix, key).unwrap_err();
            assert!(e.contains(reason), "{reason}: {e}");
            assert!(!e.chars().any(char::is_control), "{e:?}");
        }
    }
    use crate::provision::orchestrate::tests::{cluster, hosts, targets};
    use crate::ssh::task::fake::{StepByStep, step_failed};
    use crate::ssh::task::{ExecError, StepOutcome};

    fn member(id: u64, name: &str, healthy: bool) -> EtcdMember {
        EtcdMember {
            id,
            name: name.into(),
            peer_urls: vec![format!("https://198.18.0.{}:2380", 10 + id)],
            client_urls: vec![format!("https://198.18.0.{}:2379", 10 + id)],
            healthy,
        }
    }

    #[test]
    fn every_member_healthy_passes_and_each_unhealthy_one_is_named_with_peer_and_host() {
        let hosts = targets(&hosts(3, 1));
        let three = [
            member(1, "cp1", true),
            member(2, "cp2", true),
            member(3, "cp3", true),
        ];
        assert_eq!(assess(&three, &hosts), Ok(()));

        let one_down = [
            member(1, "cp1", true),
            member(2, "cp2", false),
            member(3, "cp3", true),
        ];
        let e = assess(&one_down, &hosts).unwrap_err();
        assert!(
            e.contains("etcd member cp2 (peer https://198.18.0.12:2380, on host cp2) is unhealthy"),
            "{e}"
        );
        assert!(!e.contains("cp1 (") && !e.contains("cp3 ("), "{e}");
        assert!(e.contains("2 of 3 members healthy (quorum is 2)"), "{e}");

        // Two down: quorum lost, both named. A member kubeadm has not named yet (unstarted)
        // is found by its peer address.
        let mut unstarted = member(3, "", false);
        unstarted.client_urls.clear();
        let lost = [member(1, "cp1", true), member(2, "cp2", false), unstarted];
        let e = assess(&lost, &hosts).unwrap_err();
        assert!(e.contains("etcd member cp2 ("), "{e}");
        assert!(
            e.contains("etcd member 3 (unstarted) (peer https://198.18.0.13:2380, on host cp3)"),
            "{e}"
        );
        assert!(e.contains("etcd has lost quorum (2 needed)"), "{e}");

        // A member on no host of the spec is still named.
        let stray = [member(1, "cp1", true), member(9, "old-cp", false)];
        let e = assess(&stray, &hosts).unwrap_err();
        assert!(
            e.contains(
                "etcd member old-cp (peer https://198.18.0.19:2380, on no host of the spec)"
            ),
            "{e}"
        );
        assert_eq!(assess(&[], &hosts), Err("etcd lists no member".into()));

        // On a cloud the target is the instance, the member its node's name.
        let mut instance = hosts[1].clone();
        instance.host.name = "i-0abc".into();
        instance.host.address = "203.0.113.9".into();
        instance.node_name = "ip-10-0-0-2.ec2.internal".into();
        let cloud = [member(1, "ip-10-0-0-2.ec2.internal", false)];
        let e = assess(&cloud, &[instance]).unwrap_err();
        assert!(e.contains("on host i-0abc"), "{e}");
    }

    /// Hosts that answer etcdctl's member list and health (as the listing writes them to
    /// files), or fail every step.
    #[derive(Default)]
    struct Hosts {
        answers: HashMap<String, (String, String)>,
        scripts: Mutex<Vec<(String, String)>>,
    }

    #[async_trait::async_trait]
    impl StepByStep for Hosts {
        fn admit(&self, host: &str, steps: &[Step]) -> Result<(), ExecError> {
            if !self.answers.contains_key(host) {
                return Err(step_failed(
                    host,
                    &steps[0],
                    "no running etcd container on this host",
                ));
            }
            Ok(())
        }

        async fn step(&self, host: &str, s: &Step) -> Result<StepOutcome, ExecError> {
            self.scripts
                .lock()
                .unwrap()
                .push((host.into(), s.run.clone()));
            Ok(StepOutcome::Changed)
        }

        async fn read(&self, host: &str, path: &str) -> Result<Option<Bytes>, ExecError> {
            let (list, health) = &self.answers[host];
            Ok(Some(Bytes::from(if path.ends_with("members.json") {
                list.clone()
            } else {
                health.clone()
            })))
        }
    }

    const LIST: &str = r#"{"members":[
        {"ID":1,"name":"cp1","peerURLs":["https://198.18.0.11:2380"],"clientURLs":["https://198.18.0.11:2379"]},
        {"ID":2,"name":"cp2","peerURLs":["https://198.18.0.12:2380"],"clientURLs":["https://198.18.0.12:2379"]}]}"#;
    const HEALTH: &str = r#"[{"endpoint":"https://198.18.0.11:2379","health":true},
        {"endpoint":"https://198.18.0.12:2379","health":false,"error":"context deadline exceeded"}]"#;

    #[tokio::test]
    async fn members_are_read_on_the_first_member_that_answers_in_either_topology() {
        let hosts = hosts(2, 1);
        let exec = Hosts {
            answers: [("cp2".to_string(), (LIST.to_string(), HEALTH.to_string()))].into(),
            ..Hosts::default()
        };
        let stacked = cluster("");
        let m = members(&resolved(&stacked), &targets(&hosts), &exec)
            .await
            .unwrap();
        assert_eq!(m.len(), 2);
        assert!(m[0].healthy && !m[1].healthy);
        let scripts = exec.scripts.lock().unwrap().clone();
        let (on, script) = &scripts[0];
        assert_eq!(on, "cp2", "cp1 did not answer, cp2 did");
        assert!(script.contains("crictl exec"), "{script}");
        assert!(
            script.contains("etcdctl endpoint health --cluster -w json"),
            "{script}"
        );
        let e = assess(&m, &targets(&hosts)).unwrap_err();
        assert!(e.contains("etcd member cp2 (peer https://198.18.0.12:2380, on host cp2)"));

        // Host-deployed etcd: the service's etcdctl against the member's own address.
        let mut external = cluster("");
        if let Some(e) = external.spec.etcd.as_mut() {
            e.kind = EtcdType::External;
        }
        exec.scripts.lock().unwrap().clear();
        members(&resolved(&external), &targets(&hosts), &exec)
            .await
            .unwrap();
        let scripts = exec.scripts.lock().unwrap().clone();
        let script = &scripts[0].1;
        assert!(!script.contains("crictl"), "{script}");
        assert!(
            script.contains("command etcdctl --endpoints 'https://198.18.0.12:2379'"),
            "{script}"
        );

        // Nobody answers: every host's failure is in the error.
        let none = Hosts::default();
        let e = members(&resolved(&stacked), &targets(&hosts), &none)
            .await
            .unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains("cp1: ") && e.contains("cp2: "), "{e}");
        assert!(!e.contains("w1"), "a worker was asked: {e}");
    }
}
