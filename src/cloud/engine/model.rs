//! The resource model: typed field values, stable IDs, lifecycles.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

use super::CloudError;

/// A resource kind: a name from one provider's closed set (the AWS provider's are
/// `cloud::aws::kinds::AwsKind`, whose `kind()` is the only maker outside the engine's own
/// tests). The engine stays cloud-agnostic (it only compares, orders and prints kinds) while
/// no code can make a kind from arbitrary text: the constructor is visible to `cloud/` only,
/// takes a `&'static str`, and text read back from the cloud becomes a kind only through
/// [`ResourceId::parse`], which checks it against the provider's set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Kind(&'static str);

impl Kind {
    pub(in crate::cloud) const fn new(name: &'static str) -> Kind {
        Kind(name)
    }

    /// The name written into tags and shown in plans.
    pub(crate) const fn as_str(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// A resource's stable identity: its kind and a logical name unique within the kind. It is
/// written into the cloud resource's tags, so it must never depend on cloud-assigned IDs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId {
    pub(crate) kind: Kind,
    pub(crate) name: String,
}

impl ResourceId {
    pub(crate) fn new(kind: Kind, name: impl Into<String>) -> Self {
        ResourceId {
            kind,
            name: name.into(),
        }
    }

    /// Parses the `Kind/name` form written into tags; `kinds` is the provider's set. A tag
    /// that is not of that form, or names a kind outside the set, is an error naming the tag
    /// (escaped: it is the cloud's text).
    pub(crate) fn parse(tag: &str, kinds: &[Kind]) -> Result<Self, CloudError> {
        let bad = |why: &str| {
            CloudError::Model(format!(
                "identity tag \"{}\": {why}",
                crate::output::escape(tag)
            ))
        };
        let (kind, name) = tag
            .split_once('/')
            .ok_or_else(|| bad("not of the form Kind/name"))?;
        if name.is_empty() {
            return Err(bad("no name after the kind"));
        }
        let kind = kinds
            .iter()
            .find(|k| k.as_str() == kind)
            .ok_or_else(|| bad("not a resource kind of this provider"))?;
        Ok(ResourceId::new(*kind, name))
    }
}

impl fmt::Display for ResourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

impl Serialize for ResourceId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A cloud-assigned ID (an EC2 `vpc-...`, an ARN, a group name): never empty, so a resource
/// with no ID cannot be recorded as one with an empty ID. Made only where the ID enters kprov:
/// the cloud's reply (a missing one is an error naming the resource) or the spec (adopted IDs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct CloudId(String);

impl CloudId {
    /// `None` for an empty ID.
    pub(crate) fn new(id: impl Into<String>) -> Option<CloudId> {
        let id = id.into();
        (!id.is_empty()).then_some(CloudId(id))
    }

    /// `self`, `sep` and `part` as one ID (a record's `ZONE/NAME`, a policy's `ROLE:POLICY`):
    /// not empty, since `self` is not.
    pub(crate) fn join(&self, sep: char, part: &str) -> CloudId {
        CloudId(format!("{}{sep}{part}", self.0))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for CloudId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CloudId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// The same order, equality and hash as the text: maps keyed by `CloudId` are looked up by `&str`.
impl std::borrow::Borrow<str> for CloudId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<CloudId> for String {
    fn from(id: CloudId) -> String {
        id.0
    }
}

/// A field value. Lists are kept sorted by their builders where order carries no meaning, so
/// that comparison is set comparison.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Value {
    /// Text (a name, a CIDR, a cloud ID a reference could not name).
    Str(String),
    /// A number (a port, a size, a version).
    Int(i64),
    /// A switch (DNS support, a public IP on launch).
    Bool(bool),
    /// Another resource of the same plan; resolved to its cloud ID at apply time.
    Ref(ResourceId),
    /// Several values; a set (sorted, no duplicates) when built by `Value::set`.
    List(Vec<Value>),
    /// A multi-line document (user-data, a policy): previews show a line diff.
    Doc(String),
}

impl Value {
    pub(crate) fn str(s: impl Into<String>) -> Value {
        Value::Str(s.into())
    }

    pub(crate) fn reference(kind: Kind, name: impl Into<String>) -> Value {
        Value::Ref(ResourceId::new(kind, name))
    }

    /// A list with set semantics: sorted and deduplicated.
    pub(crate) fn set(mut items: Vec<Value>) -> Value {
        items.sort();
        items.dedup();
        Value::List(items)
    }

    /// The text of a `Str` or `Doc`; `None` for any other value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) | Value::Doc(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub(crate) fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub(crate) fn as_ref_id(&self) -> Option<&ResourceId> {
        match self {
            Value::Ref(r) => Some(r),
            _ => None,
        }
    }

    pub(crate) fn as_list(&self) -> &[Value] {
        match self {
            Value::List(l) => l,
            _ => &[],
        }
    }

    /// Every resource this value points at, nested lists included.
    pub(crate) fn refs<'a>(&'a self, out: &mut BTreeSet<&'a ResourceId>) {
        match self {
            Value::Ref(r) => {
                out.insert(r);
            }
            Value::List(l) => l.iter().for_each(|v| v.refs(out)),
            _ => {}
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Ref(r) => write!(f, "{r}"),
            Value::List(l) => {
                f.write_str("[")?;
                for (i, v) in l.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            Value::Doc(d) => write!(f, "<document, {} lines>", d.lines().count()),
        }
    }
}

/// JSON form (docs/plan-json.md): scalars as JSON scalars, lists as arrays, references as
/// `{"ref": "Kind/name"}`, documents as strings.
impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Str(v) | Value::Doc(v) => s.serialize_str(v),
            Value::Int(i) => s.serialize_i64(*i),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Ref(r) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("ref", r)?;
                m.end()
            }
            Value::List(l) => {
                let mut seq = s.serialize_seq(Some(l.len()))?;
                for v in l {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
        }
    }
}

/// How the engine treats a resource (kops's lifecycles).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum Lifecycle {
    /// Create, update and (with prune) delete it.
    Sync,
    /// Leave it alone entirely.
    Ignore,
    /// Adopt: it must exist and match; never create, change or delete it.
    ExistsAndValidates,
}

/// What a change to a field means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum FieldRule {
    Mutable,
    /// Cannot change in place; a plan that needs it is refused with a message.
    Immutable,
    /// Cannot change in place; the resource is deleted and created again.
    Replace,
}

/// One cloud resource as the engine diffs it: its identity, lifecycle and cloud ID, the fields
/// the diff compares (and what a change to each means), and what apply needs besides.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub(crate) id: ResourceId,
    pub(crate) lifecycle: Lifecycle,
    /// The cloud's ID: set on actual resources, and on desired ones that are adopted by ID.
    pub(crate) cloud_id: Option<CloudId>,
    /// Compared fields. Actual resources may carry extra fields the provider needs later
    /// (association IDs, DNS names): only the desired resource's fields are compared.
    pub(crate) fields: BTreeMap<String, Value>,
    /// Dependencies not expressed by a `Value::Ref` in the fields.
    pub(crate) deps: BTreeSet<ResourceId>,
    pub(crate) rules: BTreeMap<String, FieldRule>,
    /// Inputs apply needs but the diff must not compare (key material whose hash is a field).
    pub(crate) inputs: BTreeMap<String, String>,
}

impl Resource {
    pub(crate) fn new(kind: Kind, name: impl Into<String>) -> Self {
        Resource {
            id: ResourceId::new(kind, name),
            lifecycle: Lifecycle::Sync,
            cloud_id: None,
            fields: BTreeMap::new(),
            deps: BTreeSet::new(),
            rules: BTreeMap::new(),
            inputs: BTreeMap::new(),
        }
    }

    pub(crate) fn field(mut self, name: &str, v: Value) -> Self {
        self.fields.insert(name.to_string(), v);
        self
    }

    pub(crate) fn rule(mut self, name: &str, rule: FieldRule) -> Self {
        self.rules.insert(name.to_string(), rule);
        self
    }

    pub(crate) fn input(mut self, name: &str, v: impl Into<String>) -> Self {
        self.inputs.insert(name.to_string(), v.into());
        self
    }

    pub(crate) fn lifecycle(mut self, l: Lifecycle) -> Self {
        self.lifecycle = l;
        self
    }

    #[cfg(test)]
    pub(crate) fn cloud_id(mut self, id: CloudId) -> Self {
        self.cloud_id = Some(id);
        self
    }

    pub(crate) fn depends_on(mut self, id: ResourceId) -> Self {
        self.deps.insert(id);
        self
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Value> {
        self.fields.get(name)
    }

    pub(crate) fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(Value::as_str)
    }

    pub(crate) fn field_rule(&self, name: &str) -> FieldRule {
        self.rules.get(name).copied().unwrap_or(FieldRule::Mutable)
    }

    /// Explicit dependencies plus every referenced resource.
    pub(crate) fn dependencies(&self) -> BTreeSet<ResourceId> {
        let mut refs = BTreeSet::new();
        self.fields.values().for_each(|v| v.refs(&mut refs));
        let mut all: BTreeSet<ResourceId> = refs.into_iter().cloned().collect();
        all.extend(self.deps.iter().cloned());
        all.remove(&self.id);
        all
    }
}

/// Logical ID → cloud ID, for resolving references.
pub type IdMap = BTreeMap<ResourceId, CloudId>;
