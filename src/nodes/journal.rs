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

pub const JOURNAL_ENTRY: &str = "rolling-update.json";

/// Where a node is in its roll. Ordered: a node only moves forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeStep {
    Waiting,
    Cordoned,
    Drained,
    /// Replaced (AWS) or re-provisioned in place.
    Replaced,
    Uncordoned,
    /// The health gate after its batch passed: done.
    Validated,
}

impl NodeStep {
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalNode {
    pub target: String,
    pub node_name: String,
    pub group: String,
    pub action: RollAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<Upgrade>,
    /// Index of its batch in the roll (nodes of a batch roll together).
    pub batch: usize,
    pub step: NodeStep,
    /// The node that took its place (AWS replacement), once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
    /// Why the roll stopped at this node (drain timeout, interruption), for the next operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Journal {
    pub cluster: String,
    pub started_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// `user@host`: who started it.
    pub started_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    pub cloud_only: bool,
    pub nodes: Vec<JournalNode>,
    /// The targets and node names the plan had but does not roll (up to date, or in a group
    /// not selected), as the roll found them when it started: on AWS never taken for a surge
    /// or replacement instance, by this run or a resumed one. Instances started later are not
    /// here, so a resumed roll still uses the surge instance an interrupted run started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_alone: Vec<String>,
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

    pub fn done(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.step == NodeStep::Validated)
            .count()
    }

    /// Batches in order, each the indexes of its nodes not yet validated.
    pub fn remaining_batches(&self) -> Vec<Vec<usize>> {
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

    /// Nodes in flight (past waiting, not yet validated): the ones a resume settles first.
    pub fn in_flight(&self) -> Vec<&JournalNode> {
        self.nodes
            .iter()
            .filter(|n| n.step != NodeStep::Waiting && n.step != NodeStep::Validated)
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error(
        "the rolling-update journal {key} is unreadable ({reason}); inspect it, and remove it to start a new roll"
    )]
    Corrupt { key: String, reason: String },
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
                let journal: Journal =
                    serde_json::from_slice(&o.data).map_err(|e| JournalError::Corrupt {
                        key: store.key_location(&key),
                        reason: e.to_string(),
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
    pub async fn save(&mut self, journal: &mut Journal) -> Result<(), JournalError> {
        journal.updated_at = Utc::now();
        let data = serde_json::to_vec_pretty(journal).map_err(|e| JournalError::Corrupt {
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
