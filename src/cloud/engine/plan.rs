//! Desired vs actual → one `Plan`, used by both the preview and apply.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::CloudError;
use super::model::{FieldRule, Lifecycle, Resource, ResourceId, Value};
use crate::cloud::{Actual, Provider};

/// Version of the JSON plan schema (docs/plan-json.md); bump on any incompatible change.
/// 2: one document on both platforms (metal's node plan moved under `nodePlan`).
pub(crate) const PLAN_SCHEMA_VERSION: u32 = 2;

/// What a change does to its resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Makes a resource the cloud does not have.
    Create,
    /// Changes fields of an existing resource in place.
    Update,
    /// Deletes the resource and creates it again (a field that cannot change in place).
    Replace,
    /// Deletes an owned resource nothing wants any more (applied only with prune).
    Delete,
}

/// One field of a change: its value in the cloud and the one wanted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldChange {
    /// The field's name in the resource's field map (`cidr`, `instanceType`).
    pub field: String,
    /// The value the cloud has; `None` when it has none (every field of a create).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) new: Option<Value>,
}

/// One resource's change in a plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// What the change does.
    pub action: Action,
    /// The kind's name as plans print it (`-o json`'s `kind`); decisions use `id.kind`.
    pub kind: String,
    /// The resource's logical name, unique within its kind.
    pub name: String,
    /// The cloud's ID of the resource changed or deleted; `None` for a create.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cloud_id: Option<String>,
    /// Create: every desired field (old absent). Update/Replace: the differing fields.
    /// Delete: empty.
    pub fields: Vec<FieldChange>,
    /// The resource's identity (kind and name), what decisions compare.
    #[serde(skip)]
    pub id: ResourceId,
}

/// How many changes of each action a plan holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Resources to create.
    pub create: usize,
    /// Resources to change in place.
    pub update: usize,
    /// Resources to delete and create again.
    pub replace: usize,
    /// Owned resources to delete (applied only with prune).
    pub delete: usize,
}

impl Summary {
    /// Every change of the plan, deletions included.
    pub fn total(&self) -> usize {
        self.create + self.update + self.replace + self.delete
    }
}

/// The plan. Serialises to the documented JSON schema; the desired and actual resources ride
/// along (not serialised) so `apply` executes exactly what was previewed.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub(crate) schema_version: u32,
    pub(crate) cluster: String,
    /// Creates and updates in dependency order, then deletions in reverse dependency order.
    pub changes: Vec<Change>,
    /// The changes counted by action.
    pub summary: Summary,
    /// What the operator should know that does not stop the plan (an unconfirmed DNS
    /// delegation, access open to anywhere, an unchecked quota).
    pub warnings: Vec<String>,
    /// Why this plan must not be applied (immutable field changed, adopted resource missing).
    pub errors: Vec<String>,
    #[serde(skip)]
    pub(crate) desired: BTreeMap<ResourceId, Resource>,
    #[serde(skip)]
    pub(crate) actual: BTreeMap<ResourceId, Resource>,
}

impl Plan {
    /// Nothing to change, deletions included.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// `--exit-code` semantics: 0 when nothing would change, 2 when changes are pending, 1 when
    /// the plan cannot be applied (`errors`). Deletions count only when they would be applied.
    pub fn exit_code(&self, prune: bool) -> i32 {
        if !self.errors.is_empty() {
            return 1;
        }
        let pending = self
            .changes
            .iter()
            .any(|c| prune || c.action != Action::Delete);
        if pending { 2 } else { 0 }
    }

    /// A plan with errors cannot be applied, and `update cluster` fails on it (exit 1) whether
    /// it previews or applies and whatever `--exit-code` says: a CI gate must never read a
    /// broken plan as "in sync".
    pub(crate) fn check(&self) -> Result<(), CloudError> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(CloudError::Refused(self.errors.clone()))
        }
    }
}

/// The plan of `delete cluster`: every owned resource goes. The adopted resources of `desired`
/// (zone, VPC) are still handed to the reader, which needs them to know where to look, but
/// they are never deleted, and one that vanished only means there is less to delete.
pub(crate) async fn plan_delete(
    provider: &dyn Provider,
    cluster: &str,
    desired: Vec<Resource>,
) -> Result<Plan, CloudError> {
    let anchors: Vec<Resource> = desired
        .into_iter()
        .filter(|r| r.lifecycle != Lifecycle::Sync)
        .collect();
    let actual = provider.read(cluster, &anchors).await?;
    let keep = anchors
        .into_iter()
        .map(|r| Resource::new(r.id.kind, r.id.name).lifecycle(Lifecycle::Ignore))
        .collect();
    diff(cluster, keep, actual)
}

/// The pure half of `plan`: compares and orders. Duplicate IDs and references to resources
/// outside the plan are errors in the desired model.
pub(crate) fn diff(
    cluster: &str,
    desired: Vec<Resource>,
    actual: Actual,
) -> Result<Plan, CloudError> {
    let mut want: BTreeMap<ResourceId, Resource> = BTreeMap::new();
    for r in desired {
        if let Some(dup) = want.insert(r.id.clone(), r) {
            return Err(CloudError::Model(format!("duplicate resource {}", dup.id)));
        }
    }
    let mut have: BTreeMap<ResourceId, Resource> = BTreeMap::new();
    for r in actual.resources {
        if let Some(dup) = have.insert(r.id.clone(), r) {
            // Two cloud resources claim one identity: usually the leak of an interrupted
            // create on a cloud without idempotency tokens. Refuse rather than guess.
            return Err(CloudError::Model(format!(
                "two cloud resources carry the identity {}: {} and {}; delete the one that \
                 should not exist",
                dup.id,
                dup.cloud_id.as_deref().unwrap_or("?"),
                have.get(&dup.id)
                    .and_then(|r| r.cloud_id.as_deref())
                    .unwrap_or("?")
            )));
        }
    }
    let order = topo_order(&want)?;

    let mut changes = Vec::new();
    let mut errors = actual.conflicts;
    for id in &order {
        let w = &want[id];
        if w.lifecycle == Lifecycle::Ignore {
            continue;
        }
        let Some(h) = have.get(id) else {
            if w.lifecycle == Lifecycle::ExistsAndValidates {
                errors.push(format!(
                    "{id}: must already exist ({}) but was not found",
                    w.cloud_id.as_deref().unwrap_or("looked up by name")
                ));
            } else {
                changes.push(Change {
                    action: Action::Create,
                    kind: id.kind.to_string(),
                    name: id.name.clone(),
                    cloud_id: None,
                    fields: w
                        .fields
                        .iter()
                        .map(|(k, v)| FieldChange {
                            field: k.clone(),
                            old: None,
                            new: Some(v.clone()),
                        })
                        .collect(),
                    id: id.clone(),
                });
            }
            continue;
        };
        let fields = field_changes(w, h);
        if fields.is_empty() {
            continue;
        }
        if w.lifecycle == Lifecycle::ExistsAndValidates {
            for f in &fields {
                errors.push(format!(
                    "{id} ({}): adopted resource differs from the spec: {}: {} -> {}; kprov does \
                     not change resources it adopts",
                    h.cloud_id.as_deref().unwrap_or("?"),
                    f.field,
                    show(&f.old),
                    show(&f.new)
                ));
            }
            continue;
        }
        let mut action = Action::Update;
        for f in &fields {
            match w.field_rule(&f.field) {
                FieldRule::Mutable => {}
                FieldRule::Replace => action = Action::Replace,
                FieldRule::Immutable => errors.push(format!(
                    "{id}: field {} cannot change ({} -> {}); it is fixed once created: restore \
                     the old value in the spec, or delete the cluster and create it again",
                    f.field,
                    show(&f.old),
                    show(&f.new)
                )),
            }
        }
        changes.push(Change {
            action,
            kind: id.kind.to_string(),
            name: id.name.clone(),
            cloud_id: h.cloud_id.clone().map(String::from),
            fields,
            id: id.clone(),
        });
    }

    let extra: BTreeMap<ResourceId, Resource> = have
        .iter()
        .filter(|(id, r)| !want.contains_key(id) && r.lifecycle == Lifecycle::Sync)
        .map(|(id, r)| (id.clone(), r.clone()))
        .collect();
    let mut del_order = topo_order_lenient(&extra);
    del_order.reverse();
    for id in del_order {
        let h = &extra[&id];
        changes.push(Change {
            action: Action::Delete,
            kind: id.kind.to_string(),
            name: id.name.clone(),
            cloud_id: h.cloud_id.clone().map(String::from),
            fields: Vec::new(),
            id,
        });
    }

    let mut summary = Summary::default();
    for c in &changes {
        match c.action {
            Action::Create => summary.create += 1,
            Action::Update => summary.update += 1,
            Action::Replace => summary.replace += 1,
            Action::Delete => summary.delete += 1,
        }
    }
    Ok(Plan {
        schema_version: PLAN_SCHEMA_VERSION,
        cluster: cluster.to_string(),
        changes,
        summary,
        warnings: actual.warnings,
        errors,
        desired: want,
        actual: have,
    })
}

fn show(v: &Option<Value>) -> String {
    v.as_ref()
        .map_or_else(|| "(none)".to_string(), Value::to_string)
}

/// Field-level differences of the fields the desired resource declares.
pub(crate) fn field_changes(want: &Resource, have: &Resource) -> Vec<FieldChange> {
    want.fields
        .iter()
        .filter(|(k, v)| have.fields.get(*k) != Some(*v))
        .map(|(k, v)| FieldChange {
            field: k.clone(),
            old: have.fields.get(k).cloned(),
            new: Some(v.clone()),
        })
        .collect()
}

/// Dependencies first, ties broken by ID so plans are stable. Errors on cycles and on
/// references to resources the model does not contain.
pub(crate) fn topo_order(
    set: &BTreeMap<ResourceId, Resource>,
) -> Result<Vec<ResourceId>, CloudError> {
    for r in set.values() {
        if let Some(missing) = r.dependencies().into_iter().find(|d| !set.contains_key(d)) {
            return Err(CloudError::Model(format!(
                "{} depends on {missing}, which is not part of the cluster",
                r.id
            )));
        }
    }
    let order = topo_order_lenient(set);
    if order.len() < set.len() {
        let stuck: Vec<String> = set
            .keys()
            .filter(|k| !order.contains(k))
            .map(ToString::to_string)
            .collect();
        return Err(CloudError::Model(format!(
            "dependency cycle among {}",
            stuck.join(", ")
        )));
    }
    Ok(order)
}

/// Kahn's algorithm over the dependencies inside `set` (outside ones are ignored): actual
/// resources may point at things that are not owned, and those impose no order.
pub(super) fn topo_order_lenient(set: &BTreeMap<ResourceId, Resource>) -> Vec<ResourceId> {
    let deps: BTreeMap<&ResourceId, BTreeSet<ResourceId>> = set
        .iter()
        .map(|(id, r)| {
            let d = r
                .dependencies()
                .into_iter()
                .filter(|d| set.contains_key(d))
                .collect();
            (id, d)
        })
        .collect();
    let mut done: BTreeSet<ResourceId> = BTreeSet::new();
    let mut order = Vec::new();
    loop {
        let ready: Vec<ResourceId> = deps
            .iter()
            .filter(|(id, d)| !done.contains(**id) && d.iter().all(|x| done.contains(x)))
            .map(|(id, _)| (*id).clone())
            .collect();
        if ready.is_empty() {
            break;
        }
        for id in ready {
            done.insert(id.clone());
            order.push(id);
        }
    }
    order
}
