//! The rolling-update journal: the progress of one roll, per node, in the state store at
//! `<cluster>/journal/rolling-update.json`, written compare-and-swap under the cluster lock.
//!
//! A roll records each node's step as it reaches it: waiting, cordoned, drained, replaced (or
//! re-provisioned), uncordoned, validated. The next `rolling-update cluster --yes` after an
//! interruption resumes the unfinished journal: finished nodes are skipped and the node in
//! flight is settled first, from the step it reached (every step is safe to repeat: cordon and
//! drain are idempotent, re-provisioning converges, a replacement recorded is not made again).
//!
//! Caveat: the journal is data from the store (a trust boundary): it names nodes and steps,
//! never commands, and a journal that does not parse is refused, not guessed at.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::roll::{RollAction, RollPlan, Upgrade};
use crate::state::layout::ClusterKeys;
use crate::state::{Precondition, StateError, StateStore, Version};

pub(crate) const JOURNAL_ENTRY: &str = "rolling-update.json";

/// Where a node is in its roll. Ordered: a node only moves forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeStep {
    /// Not started yet.
    Waiting,
    /// Marked unschedulable.
    Cordoned,
    /// Its pods evicted.
    Drained,
    /// Replaced (AWS) or re-provisioned in place.
    Replaced,
    /// Made schedulable again; the batch's health gate is next.
    Uncordoned,
    /// The health gate after its batch passed: done.
    Validated,
}

impl NodeStep {
    /// The step's name as progress and `get instances` print it.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStep::Waiting => "waiting",
            NodeStep::Cordoned => "cordoned",
            NodeStep::Drained => "drained",
            NodeStep::Replaced => "replaced",
            NodeStep::Uncordoned => "uncordoned",
            NodeStep::Validated => "validated",
        }
    }
}

/// One node of the roll in the journal: where it is and what was done to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalNode {
    pub(crate) target: String,
    /// The Kubernetes node's name when the roll started.
    pub node_name: String,
    pub(crate) group: String,
    pub(crate) action: RollAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) upgrade: Option<Upgrade>,
    /// Index of its batch in the roll (nodes of a batch roll together).
    pub(crate) batch: usize,
    /// The last step it completed.
    pub step: NodeStep,
    /// The node that took its place (AWS replacement), once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) replacement: Option<String>,
    /// Why the roll stopped at this node (drain timeout, interruption), for the next operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

/// The rolling-update journal kept in the state store, so an interrupted roll resumes where
/// it stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Journal {
    pub(crate) cluster: String,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
    /// `user@host`: who started it.
    pub(crate) started_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kubernetes_version: Option<String>,
    pub(crate) cloud_only: bool,
    /// Every node that rolls, in roll order.
    pub nodes: Vec<JournalNode>,
    /// The targets and node names the plan had but does not roll (up to date, or in a group
    /// not selected), as the roll found them when it started: on AWS never taken for a surge
    /// or replacement instance, by this run or a resumed one. Instances started later are not
    /// here, so a resumed roll still uses the surge instance an interrupted run started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) left_alone: Vec<String>,
    /// Set when the roll ended with every node validated.
    pub finished: bool,
}

impl Journal {
    /// A journal for `plan`: every node that rolls, waiting, in roll order.
    pub fn new(plan: &RollPlan, started_by: &str, cloud_only: bool) -> Journal {
        let now = Utc::now();
        let mut nodes = Vec::new();
        let mut batch = 0;
        for g in &plan.groups {
            for b in &g.batches {
                for t in b {
                    if let Some(n) = g.nodes.iter().find(|n| &n.target == t) {
                        nodes.push(JournalNode {
                            target: n.target.clone(),
                            node_name: n.node_name.clone(),
                            group: n.group.clone(),
                            action: n.action,
                            upgrade: n.upgrade,
                            batch,
                            step: NodeStep::Waiting,
                            replacement: None,
                            stopped: None,
                        });
                    }
                }
                batch += 1;
            }
        }
        let rolled: std::collections::BTreeSet<&str> =
            nodes.iter().map(|n| n.target.as_str()).collect();
        let left_alone = plan
            .groups
            .iter()
            .flat_map(|g| &g.nodes)
            .filter(|n| !rolled.contains(n.target.as_str()))
            .flat_map(|n| [n.target.clone(), n.node_name.clone()])
            .collect();
        Journal {
            cluster: plan.cluster.clone(),
            started_at: now,
            updated_at: now,
            started_by: started_by.to_string(),
            kubernetes_version: plan.version.as_ref().map(|v| v.to.clone()),
            cloud_only,
            nodes,
            left_alone,
            finished: false,
        }
    }

    pub(crate) fn done(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.step == NodeStep::Validated)
            .count()
    }

    /// Batches in order, each the indexes of its nodes not yet validated.
    pub(crate) fn remaining_batches(&self) -> Vec<Vec<usize>> {
        let mut out: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.step == NodeStep::Validated {
                continue;
            }
            match out.last_mut() {
                Some((b, v)) if *b == n.batch => v.push(i),
                _ => out.push((n.batch, vec![i])),
            }
        }
        out.into_iter().map(|(_, v)| v).collect()
    }
}

/// A journal is a few hundred bytes per node; anything much larger is not one kprov wrote.
const JOURNAL_LIMIT: usize = 4 << 20;
/// More nodes than any cluster kprov rolls.
const MAX_NODES: usize = 10_000;

/// A node, instance, group or target name in a journal: what kprov writes there (host names,
/// instance ids, `ip-10-0-0-1.ec2.internal`, group names), never anything a terminal or a
/// command could act on.
fn check_name(field: &str, v: &str) -> Result<(), String> {
    let ok = !v.is_empty()
        && v.len() <= 253
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{field} {:?} is not a node or group name",
            crate::output::untrusted(v)
        ))
    }
}

fn check_len(field: &str, v: &str, max: usize) -> Result<(), String> {
    if v.chars().count() > max {
        return Err(format!("{field} is longer than {max} characters"));
    }
    Ok(())
}

impl Journal {
    /// Reads a journal object of `cluster` with the rules kprov writes it by: JSON with times
    /// in RFC 3339 (`startedAt` not after `updatedAt`), the cluster's own name, node, target,
    /// group and replacement names that are names, batches in order, text fields of bounded
    /// length, at most [`JOURNAL_LIMIT`] bytes. Anything else is damaged and never resumed.
    pub(crate) fn parse(data: &[u8], cluster: &str) -> Result<Journal, String> {
        use crate::output::untrusted;
        crate::state::check_size(
            data,
            JOURNAL_LIMIT,
            format_args!("a journal's {JOURNAL_LIMIT}"),
        )?;
        let j: Journal = serde_json::from_slice(data).map_err(|e| {
            // serde quotes the offending value (an unknown step) as it is.
            format!("not a journal: {}", untrusted(&e.to_string()))
        })?;
        if j.cluster != cluster {
            return Err(format!(
                "it is the journal of cluster {:?}, not of {cluster}",
                untrusted(&j.cluster)
            ));
        }
        if j.started_at > j.updated_at {
            return Err("startedAt is after updatedAt".into());
        }
        check_len("startedBy", &j.started_by, 256)?;
        if let Some(v) = &j.kubernetes_version {
            let plain = v.strip_prefix('v').unwrap_or(v);
            if v.len() > 32
                || plain.split('.').count() != 3
                || !plain
                    .split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            {
                return Err(format!(
                    "kubernetesVersion {:?} is not a version like 1.36.4",
                    untrusted(v)
                ));
            }
        }
        if j.nodes.len() > MAX_NODES || j.left_alone.len() > 2 * MAX_NODES {
            return Err(format!("more than {MAX_NODES} nodes"));
        }
        let mut batch = 0;
        for (i, n) in j.nodes.iter().enumerate() {
            let at = format!("nodes[{i}].");
            check_name(&format!("{at}target"), &n.target)?;
            check_name(&format!("{at}nodeName"), &n.node_name)?;
            check_name(&format!("{at}group"), &n.group)?;
            if let Some(r) = &n.replacement {
                check_name(&format!("{at}replacement"), r)?;
            }
            if let Some(s) = &n.stopped {
                check_len(&format!("{at}stopped"), s, 4096)?;
            }
            if n.batch < batch || n.batch > MAX_NODES {
                return Err(format!("{at}batch {} is out of order", n.batch));
            }
            batch = n.batch;
        }
        for (i, n) in j.left_alone.iter().enumerate() {
            check_name(&format!("leftAlone[{i}]"), n)?;
        }
        Ok(j)
    }
}

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The journal object fails [`Journal::parse`]: it is never resumed.
    #[error(
        "the rolling-update journal {key} is damaged ({reason}) and is not used; if no roll \
         is running, `kprov delete damaged {cluster}` lists it and `kprov delete damaged \
         {cluster} --yes` removes it, and the next roll starts from a fresh plan",
        reason = crate::output::untrusted(reason)
    )]
    Corrupt {
        /// The cluster whose journal it is.
        cluster: String,
        /// The journal's key in the state store.
        key: String,
        /// What is wrong with it (quotes the object: printed escaped).
        reason: String,
    },
    /// The state store could not be read or written (a conflict included).
    #[error(transparent)]
    State(#[from] StateError),
}

/// The journal object of one cluster, with the version last read or written.
pub struct JournalFile<'a> {
    store: &'a dyn StateStore,
    key: String,
    version: Option<Version>,
}

impl<'a> JournalFile<'a> {
    /// Reads the journal (`None` when no roll was ever journaled).
    pub async fn load(
        store: &'a dyn StateStore,
        cluster: &str,
    ) -> Result<(JournalFile<'a>, Option<Journal>), JournalError> {
        let key = ClusterKeys::new(cluster)?.journal(JOURNAL_ENTRY)?;
        match store.get(&key).await? {
            None => Ok((
                JournalFile {
                    store,
                    key,
                    version: None,
                },
                None,
            )),
            Some(o) => {
                let journal =
                    Journal::parse(&o.data, cluster).map_err(|reason| JournalError::Corrupt {
                        cluster: cluster.to_string(),
                        key: store.key_location(&key),
                        reason,
                    })?;
                Ok((
                    JournalFile {
                        store,
                        key,
                        version: Some(o.version),
                    },
                    Some(journal),
                ))
            }
        }
    }

    /// Writes `journal` on condition that nobody else wrote since our last read or write.
    pub(crate) async fn save(&mut self, journal: &mut Journal) -> Result<(), JournalError> {
        journal.updated_at = Utc::now();
        let data = serde_json::to_vec_pretty(journal).map_err(|e| JournalError::Corrupt {
            cluster: journal.cluster.clone(),
            key: self.key.clone(),
            reason: e.to_string(),
        })?;
        let cond = match &self.version {
            Some(v) => Precondition::Matches(v.clone()),
            None => Precondition::Absent,
        };
        let version = self.store.put(&self.key, Bytes::from(data), cond).await?;
        self.version = Some(version);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> serde_json::Value {
        serde_json::json!({
            "cluster": "lab.example.com",
            "startedAt": "2026-11-22T21:00:00Z",
            "updatedAt": "2026-11-22T21:05:00Z",
            "startedBy": "alice@desk",
            "kubernetesVersion": "1.36.4",
            "cloudOnly": false,
            "nodes": [{
                "target": "w1", "nodeName": "w1", "group": "nodes", "action": "reprovision",
                "batch": 0, "step": "drained",
            }],
            "leftAlone": ["cp1"],
            "finished": false,
        })
    }

    fn parse(v: &serde_json::Value) -> Result<Journal, String> {
        Journal::parse(v.to_string().as_bytes(), "lab.example.com")
    }

    #[test]
    fn a_journal_is_checked_by_the_rules_it_is_written_by() {
        let j = parse(&good()).expect("the journal kprov writes");
        // What kprov writes reads back the same.
        let again = Journal::parse(&serde_json::to_vec(&j).unwrap(), "lab.example.com");
        assert_eq!(again, Ok(j));
        let damaged = |path: &str, value: serde_json::Value| {
            let mut v = good();
            *v.pointer_mut(path).unwrap() = value;
            parse(&v).expect_err(path)
        };
        for (path, value, says) in [
            (
                "/cluster",
                "other.example.com".to_string(),
                "it is the journal of cluster \"other.example.com\", not of lab.example.com",
            ),
            (
                "/nodes/0/nodeName",
                "w1\u{1b}[2J\nerror: x".into(),
                "nodes[0].nodeName \"w1\\x1b[2J\\nerror: x\" is not a node or group name",
            ),
            (
                "/nodes/0/target",
                "../../etc".into(),
                "nodes[0].target \"../../etc\" is not a node or group name",
            ),
            (
                "/startedAt",
                "2026-11-23T00:00:00Z".into(),
                "startedAt is after updatedAt",
            ),
            (
                "/kubernetesVersion",
                "1.36; rm -rf /".into(),
                "kubernetesVersion \"1.36; rm -rf /\" is not a version like 1.36.4",
            ),
            (
                "/startedBy",
                "x".repeat(300),
                "startedBy is longer than 256 characters",
            ),
            (
                "/leftAlone/0",
                String::new(),
                "leftAlone[0] \"\" is not a node or group name",
            ),
        ] {
            assert_eq!(damaged(path, value.into()), says, "{path}");
        }
        assert!(damaged("/startedAt", "yesterday".into()).starts_with("not a journal: "));
        // serde's own message quotes the unknown step as it is: escaped here.
        let e = damaged("/nodes/0/step", "\u{1b}]52;c;eA==\u{7}".into());
        assert!(
            e.contains("\\x1b]52;c;eA==\\x07") && !e.contains('\u{1b}'),
            "{e}"
        );
        let big = vec![b' '; JOURNAL_LIMIT + 1];
        assert!(
            Journal::parse(&big, "lab.example.com")
                .unwrap_err()
                .contains("more than a journal's")
        );
    }
}
