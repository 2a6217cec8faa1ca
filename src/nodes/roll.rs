//! The rolling-update plan: which nodes roll, how (replaced or re-provisioned in place), in
//! which order and in which batches, and the Kubernetes version steps. Pure: the command
//! observes the world (each node's provisioning record, Ready, the groups) and hands it here.
//!
//! - What a node runs is what kprov recorded on it at provisioning
//!   ([`PROVISIONED_FILE`], a [`Provisioned`]); "needs update" is a comparison of that record
//!   with what the spec wants now, field by field, so every reason names the field.
//! - Order: bastions, then control planes one at a time, then worker groups in batches from
//!   their `rollingUpdate` (`maxUnavailable` rounds down, `maxSurge` up, as in kops; both 0
//!   means one at a time).
//! - Version skew: one minor at a time, control planes first (the first with
//!   `kubeadm upgrade apply`, the others with `kubeadm upgrade node`), kubelets after and never
//!   newer than the API server; anything else is refused with the steps to take.
//!
//! - Bastions (AWS) are judged by their launch template version alone and replaced, first.
//! - AWS control planes are re-provisioned in place (the etcd member kept), except one whose
//!   launch template version changed (a new image or instance type needs a new instance):
//!   that one is replaced. A replacement joins at the spec's version, so a control-plane
//!   replacement together with a Kubernetes version change is refused with the two rolls to
//!   run instead (replace at the running version, then upgrade in place).
//!
//! Caveats: a node already NotReady is not counted against `maxUnavailable` (kops does not
//! either); surge applies to cloud groups only (metal has no spare hosts to add).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::spec::{InstanceGroupRole, RollingUpdate, versions};

/// Where the provisioner records what it set up on a node.
pub(crate) const PROVISIONED_FILE: &str = "/var/lib/kprov/provisioned.json";

/// What kprov provisioned on a node. Unknown fields are accepted (a newer kprov may record
/// more); the node is the trust boundary here, so the record is only compared, never executed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Provisioned {
    /// The Kubernetes version the node was provisioned with.
    pub kubernetes_version: String,
    /// sha256 of the node's rendered kubeadm/kubelet configuration (registration, kubelet
    /// arguments, endpoint): a change there changes the digest.
    pub config_digest: String,
    /// The node labels kprov set (the spec's, at the time).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The node taints kprov set, as `key[=value]:effect`.
    #[serde(default)]
    pub taints: Vec<String>,
    /// The spec's kubelet and kube-proxy settings that differ from their defaults, by field
    /// (`spec.kubelet.maxPods` -> `50`). `None` in records of a kprov that did not write them:
    /// then only the digest (which covers them too) says whether they changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<BTreeMap<String, String>>,
    /// AWS: the launch template version the instance was provisioned from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_template_version: Option<String>,
}

impl Provisioned {
    pub(crate) fn parse(data: &[u8]) -> Result<Provisioned, String> {
        serde_json::from_slice(data).map_err(|e| format!("{PROVISIONED_FILE} is unreadable: {e}"))
    }

    pub(crate) fn to_json(&self) -> String {
        // Strings and maps of strings always serialise.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }
}

/// Why a node needs an update: the fields that differ between the record and the spec.
pub(crate) fn differences(recorded: &Provisioned, desired: &Provisioned) -> Vec<String> {
    let mut why = Vec::new();
    if recorded.kubernetes_version != desired.kubernetes_version {
        why.push(format!(
            "kubernetesVersion {} -> {}",
            recorded.kubernetes_version, desired.kubernetes_version
        ));
    }
    if recorded.labels != desired.labels {
        why.push(format!(
            "labels {} -> {}",
            map_text(&recorded.labels),
            map_text(&desired.labels)
        ));
    }
    if recorded.taints != desired.taints {
        why.push(format!(
            "taints [{}] -> [{}]",
            recorded.taints.join(", "),
            desired.taints.join(", ")
        ));
    }
    if let (Some(old), Some(new)) = (&recorded.settings, &desired.settings) {
        why.extend(settings_changed(old, new));
    }
    if let Some(want) = &desired.launch_template_version
        && recorded.launch_template_version.as_ref() != Some(want)
    {
        why.push(format!(
            "launch template version {} -> {want}",
            recorded
                .launch_template_version
                .as_deref()
                .unwrap_or("(unknown)")
        ));
    }
    // The digest covers labels and taints too: only name it when nothing more specific did.
    if recorded.config_digest != desired.config_digest && why.is_empty() {
        why.push(format!(
            "kubeadm/kubelet configuration (digest {} -> {})",
            short(&recorded.config_digest),
            short(&desired.config_digest)
        ));
    }
    why
}

/// `field old -> new` for each kubelet/kube-proxy setting that differs (`(default)` for one
/// the spec does not set).
pub(crate) fn settings_changed(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> Vec<String> {
    let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    keys.into_iter()
        .filter(|k| old.get(*k) != new.get(*k))
        .map(|k| {
            let side = |m: &BTreeMap<String, String>| {
                m.get(k).cloned().unwrap_or_else(|| "(default)".into())
            };
            format!("{k} {} -> {}", side(old), side(new))
        })
        .collect()
}

/// Whether a roll from `old` to `new` changes kube-proxy's settings (it reads them only when
/// it starts). A record without settings says nothing: then a changed digest counts.
pub(crate) fn kube_proxy_changed(old: Option<&Provisioned>, new: &Provisioned) -> bool {
    match (old.and_then(|o| o.settings.as_ref()), &new.settings) {
        (Some(o), Some(n)) => settings_changed(o, n)
            .iter()
            .any(|why| why.starts_with("spec.kubeProxy.")),
        _ => old.is_some_and(|o| o.config_digest != new.config_digest),
    }
}

fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

fn map_text(m: &BTreeMap<String, String>) -> String {
    let items: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{{{}}}", items.join(","))
}

/// The role a group plays in the order of a roll.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GroupRole {
    /// SSH bastions: rolled first, one at a time.
    Bastion,
    /// Control planes: rolled one at a time, before the workers.
    ControlPlane,
    /// Workers: rolled last.
    Node,
}

impl GroupRole {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            GroupRole::Bastion => "Bastion",
            GroupRole::ControlPlane => "ControlPlane",
            GroupRole::Node => "Node",
        }
    }

    /// `--instance-group-roles` values (kops spelling, old `Master` included).
    pub(crate) fn parse(s: &str) -> Option<GroupRole> {
        match s.to_ascii_lowercase().as_str() {
            "bastion" => Some(GroupRole::Bastion),
            "controlplane" | "control-plane" | "master" => Some(GroupRole::ControlPlane),
            "node" | "nodes" | "worker" => Some(GroupRole::Node),
            _ => None,
        }
    }
}

impl From<InstanceGroupRole> for GroupRole {
    fn from(r: InstanceGroupRole) -> GroupRole {
        match r {
            InstanceGroupRole::Bastion => GroupRole::Bastion,
            InstanceGroupRole::ControlPlane => GroupRole::ControlPlane,
            InstanceGroupRole::Node => GroupRole::Node,
        }
    }
}

/// How a node is rolled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RollAction {
    /// AWS: terminate the instance in its group, provision the replacement.
    Replace,
    /// Provision the same machine again (metal; control planes keep their etcd member).
    Reprovision,
    /// Up to date (or not selected).
    Leave,
}

impl RollAction {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RollAction::Replace => "replace",
            RollAction::Reprovision => "re-provision in place",
            RollAction::Leave => "leave alone",
        }
    }
}

/// The kubeadm step a node's version change takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Upgrade {
    /// `kubeadm upgrade apply VERSION`: the first control plane.
    Apply,
    /// `kubeadm upgrade node`: the other control planes, then every kubelet.
    Node,
}

/// What the command observed about one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInput {
    /// The target's name (instance ID on AWS, host name on metal).
    pub target: String,
    /// The Kubernetes node's name.
    pub node_name: String,
    /// The group it belongs to.
    pub group: String,
    /// Its group's role.
    pub role: GroupRole,
    /// `None`: no record (not provisioned by this kprov, or never provisioned). A bastion
    /// carries none: here only its launch template version, from the cloud, counts.
    pub recorded: Option<Provisioned>,
    /// What the spec would provision on it now.
    pub desired: Provisioned,
    /// From the API; `None` when it could not be asked.
    pub ready: Option<bool>,
    /// An AWS instance whose state could not be read over SSH (why): what it runs is unknown.
    /// Listed, and replaced through its group only when asked (`--force`; `--cloudonly` when
    /// its node cannot be drained either), never dropped from the plan.
    pub unknown: Option<String>,
}

/// A group as the spec has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInput {
    /// The group's name.
    pub name: String,
    /// Its role, which places the group in the roll order (bastions, control planes, workers).
    pub role: GroupRole,
    /// The group's minimum size.
    pub min: u32,
    /// The group's maximum size.
    pub max: u32,
    /// The group's `rollingUpdate` (maxSurge, maxUnavailable) from the spec; `None` when it
    /// sets none.
    pub rolling_update: Option<RollingUpdate>,
}

/// Where the cluster's machines come from: metal hosts rolled in place, or AWS instances
/// replaced through their groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Platform {
    /// Inventory hosts, re-provisioned in place.
    Metal,
    /// AWS instances: workers replaced through their Auto Scaling groups.
    Aws,
}

/// `--instance-group`, `--instance-group-roles`, `--force`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    pub(crate) groups: Vec<String>,
    pub(crate) roles: Vec<GroupRole>,
    pub(crate) force: bool,
}

impl Selection {
    fn selects(&self, group: &str, role: GroupRole) -> bool {
        (self.groups.is_empty() || self.groups.iter().any(|g| g == group))
            && (self.roles.is_empty() || self.roles.contains(&role))
    }
}

/// One node of the roll plan and why it rolls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RollNode {
    pub(crate) target: String,
    pub(crate) node_name: String,
    pub(crate) group: String,
    pub(crate) action: RollAction,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) upgrade: Option<Upgrade>,
    /// Needs update per the record (independent of selection and `--force`).
    pub(crate) needs_update: bool,
    pub(crate) reasons: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ready: Option<bool>,
    /// Why kprov does not know what this instance runs (see [`NodeInput::unknown`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) unknown: Option<String>,
}

/// One group of the plan, with kops's table columns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RollGroup {
    pub(crate) name: String,
    pub(crate) role: GroupRole,
    pub(crate) selected: bool,
    pub(crate) min: u32,
    pub(crate) target: u32,
    pub(crate) max: u32,
    /// Nodes out of service at once at most.
    pub(crate) max_unavailable: u32,
    /// New instances launched before old ones leave (cloud only).
    pub(crate) max_surge: u32,
    pub(crate) nodes: Vec<RollNode>,
    /// Target names, batch by batch, in order.
    pub(crate) batches: Vec<Vec<String>>,
}

impl RollGroup {
    pub(crate) fn need_update(&self) -> usize {
        self.nodes.iter().filter(|n| n.needs_update).count()
    }

    /// Nodes Ready; `None` when Ready is unknown for any of them (the API could not be
    /// asked, or the group's machines are no nodes, as bastions): a count of 0 would say
    /// "none is Ready" where nobody knows.
    pub(crate) fn ready(&self) -> Option<usize> {
        if self.nodes.iter().any(|n| n.ready.is_none()) {
            return None;
        }
        Some(self.nodes.iter().filter(|n| n.ready == Some(true)).count())
    }

    pub(crate) fn to_roll(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.action != RollAction::Leave)
            .count()
    }

    /// kops's STATUS column.
    pub(crate) fn status(&self) -> &'static str {
        if self.to_roll() > 0 {
            "NeedsUpdate"
        } else {
            "Ready"
        }
    }
}

/// The version change of a roll.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionChange {
    pub(crate) from: Vec<String>,
    pub(crate) to: String,
    /// Where `kubeadm upgrade apply` runs; `None` when the control planes are already there.
    pub(crate) apply_on: Option<String>,
}

/// What `rolling-update cluster` will do: the groups in roll order, their batches and the
/// version change, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RollPlan {
    pub(crate) cluster: String,
    pub(crate) platform: Platform,
    /// In roll order: bastions, control planes, workers.
    pub(crate) groups: Vec<RollGroup>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<VersionChange>,
    /// Why the roll cannot start as planned (skew, unknown groups): non-empty means refused.
    pub(crate) refusals: Vec<String>,
}

impl RollPlan {
    pub(crate) fn to_roll(&self) -> usize {
        self.groups.iter().map(RollGroup::to_roll).sum()
    }

    /// Every node that rolls, in order (batch by batch).
    #[cfg(test)]
    pub(crate) fn order(&self) -> Vec<&RollNode> {
        self.groups
            .iter()
            .flat_map(|g| {
                g.batches
                    .iter()
                    .flatten()
                    .filter_map(|t| g.nodes.iter().find(|n| &n.target == t))
            })
            .collect()
    }
}

/// (maxUnavailable, maxSurge) of a group of `size` with kops's rules: unavailable rounds
/// down, surge up; surge only where instances can be added; both zero means one at a time.
pub(crate) fn batch_bounds(ru: Option<&RollingUpdate>, size: u32, can_surge: bool) -> (u32, u32) {
    let surge = match (can_surge, ru.and_then(|r| r.max_surge.as_ref())) {
        (true, Some(s)) => s.resolve(size, true).unwrap_or(0),
        _ => 0,
    };
    let unavailable = match ru.and_then(|r| r.max_unavailable.as_ref()) {
        Some(u) => u.resolve(size, false).unwrap_or(1),
        // kops: 1 without surge, 0 with it.
        None if surge == 0 => 1,
        None => 0,
    };
    if unavailable == 0 && surge == 0 {
        (1, 0)
    } else {
        (unavailable, surge)
    }
}

/// Splits `nodes` into batches of `unavailable + surge`: the surge's new instances start
/// first, so at most `unavailable` fewer than the target serve at any time.
pub(crate) fn batches(nodes: &[String], unavailable: u32, surge: u32) -> Vec<Vec<String>> {
    let size = (unavailable.saturating_add(surge)).max(1) as usize;
    nodes.chunks(size).map(|c| c.to_vec()).collect()
}

fn minor(v: &str) -> Option<(u32, u32)> {
    versions::parse(v).map(|(ma, mi, _)| (ma, mi))
}

/// Makes the plan. `groups` from the spec, `nodes` as observed.
pub fn plan(
    cluster: &str,
    platform: Platform,
    desired_version: &str,
    groups: &[GroupInput],
    nodes: &[NodeInput],
    selection: &Selection,
) -> RollPlan {
    let mut refusals = Vec::new();
    // A host (metal) whose state cannot be read cannot be rolled nor replaced: no roll while
    // one is unreachable (it is still listed, as unknown).
    if platform == Platform::Metal {
        for n in nodes {
            if let Some(why) = &n.unknown {
                refusals.push(format!(
                    "{}: cannot read its provisioning record: {why}",
                    n.target
                ));
            }
        }
    }
    for g in &selection.groups {
        if !groups.iter().any(|x| &x.name == g) {
            refusals.push(format!(
                "--instance-group {g}: no such instance group (groups: {})",
                groups
                    .iter()
                    .map(|x| x.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    let mut ordered: Vec<&GroupInput> = groups.iter().collect();
    ordered.sort_by_key(|g| g.role);

    // Version skew, judged over every node (selected or not), in roll order: `kubeadm upgrade
    // apply` goes to the first control plane that rolls, whichever of several control-plane
    // groups (AWS: one per instance) it is in.
    let in_order: Vec<NodeInput> = ordered
        .iter()
        .flat_map(|g| nodes.iter().filter(|n| n.group == g.name))
        .chain(
            nodes
                .iter()
                .filter(|n| !groups.iter().any(|g| g.name == n.group)),
        )
        .cloned()
        .collect();
    let version = version_change(desired_version, &in_order, &mut refusals);
    let cp_behind: Vec<&NodeInput> = nodes
        .iter()
        .filter(|n| n.role == GroupRole::ControlPlane && behind(n, desired_version))
        .collect();
    let apply_on = version.as_ref().and_then(|v| v.apply_on.clone());

    let mut out = Vec::new();
    for g in ordered {
        let selected = selection.selects(&g.name, g.role);
        let members: Vec<&NodeInput> = nodes.iter().filter(|n| n.group == g.name).collect();
        let rolled: Vec<RollNode> = members
            .iter()
            .map(|n| {
                let mut reasons = match (&n.recorded, g.role) {
                    // Nothing is known to differ: only --force replaces it.
                    _ if n.unknown.is_some() => Vec::new(),
                    (r, GroupRole::Bastion) => bastion_differences(r.as_ref(), &n.desired),
                    (Some(r), _) => differences(r, &n.desired),
                    (None, _) => vec![format!(
                        "no provisioning record ({PROVISIONED_FILE}): provisioned by an older kprov or not by kprov"
                    )],
                };
                let needs_update = !reasons.is_empty();
                if let Some(why) = &n.unknown {
                    reasons.push(format!("unknown: {why}"));
                }
                let rolls = selected && (needs_update || selection.force);
                if rolls && !needs_update {
                    reasons.push("--force".into());
                }
                if !selected && needs_update {
                    reasons.push("not selected".into());
                }
                // A new image or instance type needs a new instance: on AWS a control plane
                // whose launch template changed is replaced (a new member joins first); any
                // other change keeps the instance (and its etcd member) and re-provisions it.
                let new_template = reasons.iter().find(|r| r.starts_with("launch template"));
                let action = match (rolls, platform, g.role) {
                    (false, _, _) => RollAction::Leave,
                    // It cannot be re-provisioned in place: it does not answer.
                    (true, _, _) if n.unknown.is_some() => RollAction::Replace,
                    (true, Platform::Aws, GroupRole::ControlPlane) if new_template.is_some() => {
                        RollAction::Replace
                    }
                    (true, Platform::Aws, GroupRole::ControlPlane) => RollAction::Reprovision,
                    (true, Platform::Aws, _) => RollAction::Replace,
                    (true, Platform::Metal, _) => RollAction::Reprovision,
                };
                // A replacement joins at the spec's version; `kubeadm upgrade apply` must have
                // run on a control plane before one joins at a newer version (a newer minor
                // breaks the skew policy; even a patch leaves kubeadm's ClusterConfiguration
                // behind when every control plane is replaced). Two rolls, in this order.
                if action == RollAction::Replace
                    && g.role == GroupRole::ControlPlane
                    && let Some(have) = n.recorded.as_ref().map(|r| r.kubernetes_version.as_str())
                    && have != desired_version
                {
                    refusals.push(format!(
                        "{} (group {}): {}: a new control-plane instance and a Kubernetes \
                         upgrade ({have} -> {desired_version}) cannot happen in one roll (the new \
                         instance would join at {desired_version} before `kubeadm upgrade apply` ran). \
                         Take two steps: 1. set spec.kubernetesVersion back to {have} (`kprov edit \
                         cluster`), `kprov update cluster --yes`, `kprov rolling-update cluster \
                         --yes` (the control planes are replaced); 2. set it to {desired_version}, \
                         `kprov update cluster --yes`, `kprov rolling-update cluster --yes` (the \
                         upgrade, in place)",
                        n.node_name,
                        g.name,
                        new_template.map(String::as_str).unwrap_or("launch template changed"),
                    ));
                }
                let upgrade = if rolls && behind(n, desired_version) {
                    Some(if apply_on.as_deref() == Some(n.target.as_str()) {
                        Upgrade::Apply
                    } else {
                        Upgrade::Node
                    })
                } else {
                    None
                };
                RollNode {
                    target: n.target.clone(),
                    node_name: n.node_name.clone(),
                    group: g.name.clone(),
                    action,
                    upgrade,
                    needs_update,
                    reasons,
                    ready: n.ready,
                    unknown: n.unknown.clone(),
                }
            })
            .collect();
        let size = members.len() as u32;
        let (unavailable, surge) = match g.role {
            // Control planes one at a time, whatever the group says.
            GroupRole::ControlPlane | GroupRole::Bastion => (1, 0),
            GroupRole::Node => {
                batch_bounds(g.rolling_update.as_ref(), size, platform == Platform::Aws)
            }
        };
        let mut to_roll: Vec<String> = rolled
            .iter()
            .filter(|n| n.action != RollAction::Leave)
            .map(|n| n.target.clone())
            .collect();
        // The control plane that runs `kubeadm upgrade apply` goes first.
        if let Some(first) = &apply_on
            && let Some(i) = to_roll.iter().position(|t| t == first)
        {
            let t = to_roll.remove(i);
            to_roll.insert(0, t);
        }
        out.push(RollGroup {
            name: g.name.clone(),
            role: g.role,
            selected,
            min: g.min,
            target: size,
            max: g.max,
            max_unavailable: unavailable,
            max_surge: surge,
            batches: batches(&to_roll, unavailable, surge),
            nodes: rolled,
        });
    }
    // Kubelets never newer than the API server: workers wait for every control plane.
    if version.is_some() && !cp_behind.is_empty() {
        let cp_rolling = |t: &str| {
            out.iter().any(|g| {
                g.role == GroupRole::ControlPlane
                    && g.nodes
                        .iter()
                        .any(|n| n.target == t && n.action != RollAction::Leave)
            })
        };
        let left: Vec<&str> = cp_behind
            .iter()
            .filter(|n| !cp_rolling(&n.target))
            .map(|n| n.node_name.as_str())
            .collect();
        let workers_upgrade = out
            .iter()
            .any(|g| g.role == GroupRole::Node && g.nodes.iter().any(|n| n.upgrade.is_some()));
        if !left.is_empty() && workers_upgrade {
            refusals.push(format!(
                "kubelets would be newer than the API server: control planes {} are not at {desired_version} and not selected; roll the control planes first (`--instance-group-roles ControlPlane`)",
                left.join(", ")
            ));
        }
    }
    RollPlan {
        cluster: cluster.to_string(),
        platform,
        groups: out,
        version,
        refusals,
    }
}

/// Why a bastion needs an update: only its launch template version counts (it runs no
/// Kubernetes and carries no provisioning record).
pub(crate) fn bastion_differences(
    launched: Option<&Provisioned>,
    desired: &Provisioned,
) -> Vec<String> {
    match &desired.launch_template_version {
        Some(want) if launched.and_then(|l| l.launch_template_version.as_ref()) != Some(want) => {
            vec![format!(
                "launch template version {} -> {want}",
                launched
                    .and_then(|l| l.launch_template_version.as_deref())
                    .unwrap_or("(unknown)")
            )]
        }
        _ => Vec::new(),
    }
}

fn behind(n: &NodeInput, desired: &str) -> bool {
    n.role != GroupRole::Bastion
        && n.recorded
            .as_ref()
            .is_some_and(|r| r.kubernetes_version != desired)
}

/// The version step of the roll, refusing skew the policy forbids.
fn version_change(
    desired: &str,
    nodes: &[NodeInput],
    refusals: &mut Vec<String>,
) -> Option<VersionChange> {
    let Some((dmaj, dmin)) = minor(desired) else {
        refusals.push(format!(
            "spec.kubernetesVersion {desired:?} is not a version"
        ));
        return None;
    };
    let mut from: Vec<String> = Vec::new();
    for n in nodes.iter().filter(|n| n.role != GroupRole::Bastion) {
        let Some(r) = &n.recorded else { continue };
        if r.kubernetes_version == desired {
            continue;
        }
        if !from.contains(&r.kubernetes_version) {
            from.push(r.kubernetes_version.clone());
        }
        let Some((maj, min)) = minor(&r.kubernetes_version) else {
            refusals.push(format!(
                "{}: recorded kubernetesVersion {:?} is not a version",
                n.node_name, r.kubernetes_version
            ));
            continue;
        };
        if (maj, min) > (dmaj, dmin)
            || (maj, min) == (dmaj, dmin)
                && versions::parse(&r.kubernetes_version) > versions::parse(desired)
        {
            refusals.push(format!(
                "{}: runs {} and the spec asks for {desired}: kubeadm does not downgrade; set spec.kubernetesVersion back to {} (`kprov edit cluster`)",
                n.node_name, r.kubernetes_version, r.kubernetes_version
            ));
        } else if maj != dmaj || dmin > min + 1 {
            let steps: Vec<String> = ((min + 1)..dmin).map(|m| format!("{maj}.{m}")).collect();
            refusals.push(format!(
                "{}: runs {} and the spec asks for {desired}: Kubernetes upgrades one minor version at a time; set spec.kubernetesVersion to the latest {} patch, `kprov update cluster --yes`, `kprov rolling-update cluster --yes`, and repeat up to {desired}",
                n.node_name,
                r.kubernetes_version,
                steps.join(", then ")
            ));
        }
    }
    if from.is_empty() {
        return None;
    }
    from.sort();
    let apply_on = nodes
        .iter()
        .find(|n| n.role == GroupRole::ControlPlane && behind(n, desired))
        .map(|n| n.target.clone());
    Some(VersionChange {
        from,
        to: desired.to_string(),
        apply_on,
    })
}

/// Parses `--instance-group-roles` values.
pub(crate) fn parse_roles(values: &[String]) -> Result<Vec<GroupRole>, String> {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .filter(|v| !v.trim().is_empty())
        .map(|v| {
            GroupRole::parse(v.trim()).ok_or_else(|| {
                format!("--instance-group-roles {v:?}: expected Bastion, ControlPlane or Node")
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::IntOrPercent;
    use proptest::prelude::*;

    fn rec(version: &str) -> Provisioned {
        Provisioned {
            kubernetes_version: version.into(),
            config_digest: "d".repeat(64),
            labels: BTreeMap::new(),
            taints: vec![],
            settings: None,
            launch_template_version: None,
        }
    }

    fn node(name: &str, group: &str, role: GroupRole, have: &str, want: &str) -> NodeInput {
        NodeInput {
            target: name.into(),
            node_name: name.into(),
            group: group.into(),
            role,
            recorded: Some(rec(have)),
            desired: rec(want),
            ready: Some(true),
            unknown: None,
        }
    }

    fn group(name: &str, role: GroupRole, ru: Option<RollingUpdate>) -> GroupInput {
        GroupInput {
            name: name.into(),
            role,
            min: 1,
            max: 5,
            rolling_update: ru,
        }
    }

    fn cluster(have: &str, want: &str) -> (Vec<GroupInput>, Vec<NodeInput>) {
        let groups = vec![
            group("nodes", GroupRole::Node, None),
            group("control-plane", GroupRole::ControlPlane, None),
            group("bastions", GroupRole::Bastion, None),
        ];
        let nodes = vec![
            node("w1", "nodes", GroupRole::Node, have, want),
            node("w2", "nodes", GroupRole::Node, have, want),
            node("cp1", "control-plane", GroupRole::ControlPlane, have, want),
            node("cp2", "control-plane", GroupRole::ControlPlane, have, want),
            node("b1", "bastions", GroupRole::Bastion, want, want),
        ];
        (groups, nodes)
    }

    /// The plan of cluster "c" for every node (no selection, nothing forced).
    fn plan_all(
        platform: Platform,
        want: &str,
        groups: &[GroupInput],
        nodes: &[NodeInput],
    ) -> RollPlan {
        plan("c", platform, want, groups, nodes, &Selection::default())
    }

    /// The plan's roll order: each node's target and upgrade.
    fn upgrades(p: &RollPlan) -> Vec<(&str, Option<Upgrade>)> {
        p.order()
            .iter()
            .map(|n| (n.target.as_str(), n.upgrade))
            .collect()
    }

    #[test]
    fn an_instance_that_does_not_answer_is_listed_as_unknown_and_replaced_only_when_forced() {
        let (g, mut n) = cluster("1.35.1", "1.35.1");
        n[1].recorded = None;
        n[1].unknown = Some("no answer on port 22".into());
        let aws = |s: &Selection| plan("c", Platform::Aws, "1.35.1", &g, &n, s);
        let p = aws(&Selection::default());
        let find = |p: &RollPlan, t: &str| {
            p.groups
                .iter()
                .flat_map(|g| g.nodes.iter())
                .find(|x| x.target == t)
                .cloned()
                .unwrap()
        };
        let w2 = find(&p, "w2");
        assert_eq!(w2.action, RollAction::Leave);
        assert!(!w2.needs_update);
        assert_eq!(w2.reasons, ["unknown: no answer on port 22"]);
        assert_eq!(w2.unknown.as_deref(), Some("no answer on port 22"));
        assert!(p.refusals.is_empty(), "{:?}", p.refusals);
        assert_eq!(p.to_roll(), 0);
        let forced = aws(&Selection {
            groups: vec!["nodes".into()],
            force: true,
            ..Selection::default()
        });
        let w2 = find(&forced, "w2");
        assert_eq!(w2.action, RollAction::Replace);
        assert_eq!(w2.reasons, ["unknown: no answer on port 22", "--force"]);
        // An unknown control plane is replaced too (a new member joins first): it cannot be
        // re-provisioned in place.
        n[2].recorded = None;
        n[2].unknown = Some("timeout".into());
        let p = plan(
            "c",
            Platform::Aws,
            "1.35.1",
            &g,
            &n,
            &Selection {
                force: true,
                ..Selection::default()
            },
        );
        let cp1 = find(&p, "cp1");
        assert_eq!(cp1.action, RollAction::Replace);
    }

    #[test]
    fn ready_is_unknown_not_zero_when_the_api_was_not_asked() {
        let (g, mut n) = cluster("1.35.1", "1.35.1");
        n[1].ready = Some(false);
        n[4].ready = None; // b1, as `ops::rolling::inputs` gives a bastion
        let metal = |n: &[_]| plan_all(Platform::Metal, "1.35.1", &g, n);
        let p = metal(&n);
        let ready = |name: &str| p.groups.iter().find(|g| g.name == name).unwrap().ready();
        assert_eq!(ready("nodes"), Some(1));
        assert_eq!(ready("control-plane"), Some(2));
        // A bastion is no node: its Ready is unknown, not "0 Ready".
        assert_eq!(ready("bastions"), None);
        for node in &mut n {
            node.ready = None;
        }
        let p = metal(&n);
        assert!(p.groups.iter().all(|g| g.ready().is_none()), "{p:?}");
    }

    #[test]
    fn a_version_upgrade_rolls_control_planes_first_apply_then_node() {
        let (g, n) = cluster("1.34.4", "1.35.1");
        let p = plan_all(Platform::Metal, "1.35.1", &g, &n);
        assert!(p.refusals.is_empty(), "{:?}", p.refusals);
        assert_eq!(
            upgrades(&p),
            [
                ("cp1", Some(Upgrade::Apply)),
                ("cp2", Some(Upgrade::Node)),
                ("w1", Some(Upgrade::Node)),
                ("w2", Some(Upgrade::Node)),
            ]
        );
        assert_eq!(p.groups[0].name, "bastions");
        assert_eq!(p.groups[0].status(), "Ready");
        assert_eq!(p.groups[1].batches, [vec!["cp1"], vec!["cp2"]]);
        let v = p.version.unwrap();
        assert_eq!(
            (v.from, v.to.as_str()),
            (vec!["1.34.4".to_string()], "1.35.1")
        );
        assert!(p.groups[2].nodes[0].reasons[0].contains("kubernetesVersion 1.34.4 -> 1.35.1"));
    }

    #[test]
    fn upgrade_apply_goes_to_the_first_control_plane_in_roll_order_across_groups() {
        // AWS makes a control-plane group per instance; the instances are observed in any order.
        let groups = vec![
            group("nodes", GroupRole::Node, None),
            group("control-plane-1", GroupRole::ControlPlane, None),
            group("control-plane-2", GroupRole::ControlPlane, None),
            group("control-plane-3", GroupRole::ControlPlane, None),
        ];
        let mut nodes = vec![node("w1", "nodes", GroupRole::Node, "1.34.4", "1.35.1")];
        nodes.extend([3, 2, 1].map(|i| {
            let (name, group) = (format!("cp{i}"), format!("control-plane-{i}"));
            node(&name, &group, GroupRole::ControlPlane, "1.34.4", "1.35.1")
        }));
        let p = plan_all(Platform::Aws, "1.35.1", &groups, &nodes);
        assert!(p.refusals.is_empty(), "{:?}", p.refusals);
        assert_eq!(
            upgrades(&p),
            [
                ("cp1", Some(Upgrade::Apply)),
                ("cp2", Some(Upgrade::Node)),
                ("cp3", Some(Upgrade::Node)),
                ("w1", Some(Upgrade::Node)),
            ]
        );
        assert_eq!(p.version.unwrap().apply_on.as_deref(), Some("cp1"));
    }

    fn new_cp_template(have: &str, want: &str) -> (Vec<GroupInput>, Vec<NodeInput>) {
        let (g, mut n) = cluster(have, want);
        for x in n.iter_mut().filter(|x| x.role == GroupRole::ControlPlane) {
            x.recorded.as_mut().unwrap().launch_template_version = Some("1".into());
            x.desired.launch_template_version = Some("2".into());
        }
        (g, n)
    }

    #[test]
    fn a_control_planes_new_template_on_aws_is_replaced_one_at_a_time_before_workers() {
        let (g, n) = new_cp_template("1.35.1", "1.35.1");
        let p = plan_all(Platform::Aws, "1.35.1", &g, &n);
        assert!(p.refusals.is_empty(), "{:?}", p.refusals);
        let cp = p.groups.iter().find(|g| g.name == "control-plane").unwrap();
        assert_eq!((cp.max_unavailable, cp.max_surge), (1, 0));
        assert_eq!(
            cp.batches,
            [vec!["cp1".to_string()], vec!["cp2".to_string()]]
        );
        for x in &cp.nodes {
            assert_eq!(x.action, RollAction::Replace);
            assert_eq!(x.reasons, ["launch template version 1 -> 2"]);
            assert_eq!(x.upgrade, None);
        }
        // Workers (up to date here) are left; the order is bastions, control planes, workers.
        let order: Vec<&str> = p.order().iter().map(|n| n.target.as_str()).collect();
        assert_eq!(order, ["cp1", "cp2"]);
        // Forced control planes whose template is current are re-provisioned in place.
        let (g, n) = cluster("1.35.1", "1.35.1");
        let sel = Selection {
            roles: vec![GroupRole::ControlPlane],
            force: true,
            ..Selection::default()
        };
        let p = plan("c", Platform::Aws, "1.35.1", &g, &n, &sel);
        assert!(p.refusals.is_empty(), "{:?}", p.refusals);
        assert_eq!(p.to_roll(), 2);
        assert!(
            p.order()
                .iter()
                .all(|n| n.action == RollAction::Reprovision)
        );
        // Metal never replaces.
        let (g, n) = new_cp_template("1.35.1", "1.35.1");
        let p = plan_all(Platform::Metal, "1.35.1", &g, &n);
        assert!(
            p.order()
                .iter()
                .all(|n| n.action == RollAction::Reprovision)
        );
    }

    #[test]
    fn a_new_control_plane_template_with_a_version_change_is_refused_with_two_steps() {
        for have in ["1.34.4", "1.35.0"] {
            let (g, n) = new_cp_template(have, "1.35.1");
            let p = plan_all(Platform::Aws, "1.35.1", &g, &n);
            assert_eq!(p.refusals.len(), 2, "{:?}", p.refusals);
            let r = &p.refusals[0];
            assert!(
                r.contains("cp1 (group control-plane)")
                    && r.contains("launch template version 1 -> 2")
                    && r.contains(&format!("({have} -> 1.35.1)"))
                    && r.contains(&format!("1. set spec.kubernetesVersion back to {have}"))
                    && r.contains("2. set it to 1.35.1"),
                "{r}"
            );
        }
        // The upgrade alone (templates current) still rolls in place.
        let (g, n) = cluster("1.34.4", "1.35.1");
        let p = plan_all(Platform::Aws, "1.35.1", &g, &n);
        assert!(p.refusals.is_empty(), "{:?}", p.refusals);
    }

    #[test]
    fn two_minors_at_once_and_downgrades_are_refused_with_the_steps() {
        // The version the nodes run, the one wanted, what the refusal says.
        for (have, want, says) in [
            (
                "1.33.2",
                "1.35.1",
                &["one minor version at a time", "1.34"][..],
            ),
            ("1.35.1", "1.34.4", &["does not downgrade"]),
        ] {
            let (g, n) = cluster(have, want);
            let p = plan_all(Platform::Metal, want, &g, &n);
            for s in says {
                assert!(p.refusals[0].contains(s), "{:?}", p.refusals);
            }
        }
    }

    #[test]
    fn workers_alone_are_refused_while_control_planes_lag() {
        let (g, n) = cluster("1.34.4", "1.35.1");
        let sel = Selection {
            roles: vec![GroupRole::Node],
            ..Selection::default()
        };
        let p = plan("c", Platform::Metal, "1.35.1", &g, &n, &sel);
        assert!(
            p.refusals
                .iter()
                .any(|r| r.contains("roll the control planes first")),
            "{:?}",
            p.refusals
        );
    }

    #[test]
    fn up_to_date_nodes_are_left_unless_forced_and_aws_replaces_workers_only() {
        let (g, n) = cluster("1.35.1", "1.35.1");
        let p = plan_all(Platform::Aws, "1.35.1", &g, &n);
        assert_eq!(p.to_roll(), 0);
        let sel = Selection {
            groups: vec!["nodes".into(), "control-plane".into()],
            force: true,
            ..Selection::default()
        };
        let p = plan("c", Platform::Aws, "1.35.1", &g, &n, &sel);
        let actions: Vec<(&str, RollAction)> = p
            .order()
            .iter()
            .map(|n| (n.target.as_str(), n.action))
            .collect();
        assert_eq!(
            actions,
            [
                ("cp1", RollAction::Reprovision),
                ("cp2", RollAction::Reprovision),
                ("w1", RollAction::Replace),
                ("w2", RollAction::Replace)
            ]
        );
        assert_eq!(p.groups[0].nodes[0].action, RollAction::Leave);
        assert_eq!(p.groups[2].nodes[0].reasons, ["--force"]);
    }

    fn bastion(name: &str, launched: Option<&str>, current: Option<&str>) -> NodeInput {
        let mut have = rec("1.35.1");
        have.launch_template_version = launched.map(str::to_string);
        // What a bastion is observed as: no Kubernetes, no record of kprov's; the digest and
        // version may say anything, only the launch template version counts.
        have.config_digest = String::new();
        let mut want = rec("1.35.1");
        want.launch_template_version = current.map(str::to_string);
        NodeInput {
            ready: None,
            recorded: Some(have),
            desired: want,
            ..node(name, "bastions", GroupRole::Bastion, "1.35.1", "1.35.1")
        }
    }

    #[test]
    fn a_bastion_from_an_older_template_is_replaced_first_alone_and_without_kubeadm() {
        let (g, mut n) = cluster("1.34.4", "1.35.1");
        n.retain(|x| x.role != GroupRole::Bastion);
        n.push(bastion("b1", Some("1"), Some("2")));
        n.push(bastion("b2", Some("2"), Some("2")));
        let p = plan_all(Platform::Aws, "1.35.1", &g, &n);
        assert!(p.refusals.is_empty(), "{:?}", p.refusals);
        let order: Vec<(&str, RollAction, Option<Upgrade>)> = p
            .order()
            .iter()
            .map(|n| (n.target.as_str(), n.action, n.upgrade))
            .collect();
        assert_eq!(
            order[..3],
            [
                ("b1", RollAction::Replace, None),
                ("cp1", RollAction::Reprovision, Some(Upgrade::Apply)),
                ("cp2", RollAction::Reprovision, Some(Upgrade::Node)),
            ]
        );
        let b = &p.groups[0];
        assert_eq!(
            (b.role, b.max_unavailable, b.max_surge),
            (GroupRole::Bastion, 1, 0)
        );
        assert_eq!(b.batches, [vec!["b1"]]);
        assert_eq!(b.nodes[0].reasons, ["launch template version 1 -> 2"]);
        assert!(b.nodes[1].reasons.is_empty() && b.nodes[1].action == RollAction::Leave);
        // The bastions take no part in the version change.
        assert_eq!(p.version.unwrap().from, ["1.34.4"]);
    }

    #[test]
    fn bastions_roll_only_when_their_template_changed_or_forced() {
        let (g, mut n) = cluster("1.35.1", "1.35.1");
        n.retain(|x| x.role != GroupRole::Bastion);
        // A bastion whose launch template version is unknown needs an update naming that, never
        // "no provisioning record" (bastions carry none).
        n.push(NodeInput {
            recorded: None,
            ..bastion("b1", None, Some("3"))
        });
        let p = plan_all(Platform::Aws, "1.35.1", &g, &n);
        assert_eq!(
            p.groups[0].nodes[0].reasons,
            ["launch template version (unknown) -> 3"]
        );
        let mut n2 = n.clone();
        n2.pop();
        n2.push(bastion("b1", Some("3"), Some("3")));
        let p = plan_all(Platform::Aws, "1.35.1", &g, &n2);
        assert_eq!(p.to_roll(), 0);
        assert!(bastion_differences(None, &rec("1.35.1")).is_empty());
        let sel = Selection {
            roles: vec![GroupRole::Bastion],
            force: true,
            ..Selection::default()
        };
        let p = plan("c", Platform::Aws, "1.35.1", &g, &n2, &sel);
        let order: Vec<(&str, RollAction)> = p
            .order()
            .iter()
            .map(|n| (n.target.as_str(), n.action))
            .collect();
        assert_eq!(order, [("b1", RollAction::Replace)]);
        assert_eq!(p.groups[0].nodes[0].reasons, ["--force"]);
    }

    #[test]
    fn every_difference_is_named() {
        let have = rec("1.35.1");
        let mut want = rec("1.35.1");
        want.labels.insert("tier".into(), "db".into());
        want.taints.push("dedicated=db:NoSchedule".into());
        want.launch_template_version = Some("3".into());
        let why = differences(&have, &want);
        assert_eq!(why.len(), 3, "{why:?}");
        assert!(why[0].starts_with("labels {} -> {tier=db}"));
        assert!(why[2].contains("launch template version (unknown) -> 3"));
        let mut want = rec("1.35.1");
        want.config_digest = "e".repeat(64);
        assert_eq!(
            differences(&have, &want),
            ["kubeadm/kubelet configuration (digest dddddddddddd -> eeeeeeeeeeee)"]
        );
        assert!(differences(&have, &have).is_empty());
        assert!(Provisioned::parse(have.to_json().as_bytes()).unwrap() == have);
    }

    #[test]
    fn unknown_groups_and_roles_are_refused() {
        let (g, n) = cluster("1.35.1", "1.35.1");
        let sel = Selection {
            groups: vec!["nope".into()],
            ..Selection::default()
        };
        let p = plan("c", Platform::Metal, "1.35.1", &g, &n, &sel);
        assert!(p.refusals[0].contains("no such instance group"));
        assert!(
            parse_roles(&["Node,master".into()]).unwrap()
                == [GroupRole::Node, GroupRole::ControlPlane]
        );
        assert!(parse_roles(&["Worker2".into()]).is_err());
    }

    #[test]
    fn kops_bounds() {
        let ru = |s: Option<IntOrPercent>, u: Option<IntOrPercent>| RollingUpdate {
            max_surge: s,
            max_unavailable: u,
        };
        assert_eq!(batch_bounds(None, 10, true), (1, 0));
        let pct = |p: &str| Some(IntOrPercent::Percent(p.into()));
        assert_eq!(batch_bounds(Some(&ru(None, pct("25%"))), 10, true), (2, 0));
        assert_eq!(batch_bounds(Some(&ru(pct("25%"), None)), 10, true), (0, 3));
        assert_eq!(batch_bounds(Some(&ru(pct("25%"), None)), 10, false), (1, 0));
        assert_eq!(
            batch_bounds(
                Some(&ru(Some(IntOrPercent::Int(0)), Some(IntOrPercent::Int(0)))),
                4,
                true
            ),
            (1, 0)
        );
    }

    fn bound() -> impl Strategy<Value = Option<IntOrPercent>> {
        prop_oneof![
            Just(None),
            (0u32..6).prop_map(|n| Some(IntOrPercent::Int(n))),
            (0u32..=100).prop_map(|p| Some(IntOrPercent::Percent(format!("{p}%")))),
        ]
    }

    proptest! {
        /// Simulates a group's roll batch by batch: surge instances start, then the batch's old
        /// nodes leave. Never fewer than target - maxUnavailable serve; every node that needs
        /// an update is rolled exactly once; a batch never exceeds unavailable + surge.
        #[test]
        fn batches_respect_bounds(size in 1usize..40, stale in proptest::collection::vec(any::<bool>(), 40),
                                  surge in bound(), unavailable in bound(), aws in any::<bool>()) {
            let platform = if aws { Platform::Aws } else { Platform::Metal };
            let groups = vec![group("nodes", GroupRole::Node,
                Some(RollingUpdate { max_surge: surge, max_unavailable: unavailable }))];
            let nodes: Vec<NodeInput> = (0..size)
                .map(|i| node(&format!("n{i}"), "nodes", GroupRole::Node,
                              if stale[i] { "1.35.0" } else { "1.35.1" }, "1.35.1"))
                .collect();
            let p = plan_all(platform, "1.35.1", &groups, &nodes);
            prop_assert!(p.refusals.is_empty());
            let g = &p.groups[0];
            prop_assert!(aws || g.max_surge == 0);
            prop_assert!(g.max_unavailable + g.max_surge >= 1);
            let mut seen = std::collections::BTreeSet::new();
            let target = size as i64;
            for b in &g.batches {
                prop_assert!(!b.is_empty());
                prop_assert!(b.len() as u32 <= g.max_unavailable + g.max_surge);
                // Surge first: new instances serve before the old ones leave.
                let serving = target + i64::from(g.max_surge).min(b.len() as i64) - b.len() as i64;
                prop_assert!(serving >= target - i64::from(g.max_unavailable),
                    "batch {b:?} leaves {serving} of {target}");
                for t in b { prop_assert!(seen.insert(t.clone()), "{t} twice"); }
            }
            let want: std::collections::BTreeSet<String> =
                (0..size).filter(|i| stale[*i]).map(|i| format!("n{i}")).collect();
            prop_assert_eq!(seen, want);
        }
    }
}
