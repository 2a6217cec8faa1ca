//! Reading specs: multi-document YAML files of Clusters and InstanceGroups, with every error
//! pointing at the source (file or state-store key), line and column.

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;

use super::locate::{FieldPath, Pos, Tree};
use super::types::{API_VERSION, Cluster, InstanceGroup, KIND_CLUSTER, KIND_INSTANCE_GROUP};

/// One problem in a spec, located as precisely as the input allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// File path or state-store location the spec came from (`-` for standard input).
    pub source: String,
    /// Line and column in the source, when the problem could be placed there.
    pub pos: Option<Pos>,
    /// Field path, when the problem is about a field.
    pub path: Option<String>,
    /// What is wrong (spec text in it is escaped when displayed).
    pub message: String,
}

/// One diagnostic is one line: its parts quote the spec (names, values, the file name), so
/// each is escaped ([`crate::output::untrusted`]); a name holding a newline cannot start a
/// line of its own (`error: ...`) in the message that refuses it.
impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::output::untrusted;
        write!(f, "{}", untrusted(&self.source))?;
        if let Some(p) = self.pos {
            write!(f, ":{}:{}", p.line, p.column)?;
        }
        if let Some(path) = &self.path {
            write!(f, ": {}", untrusted(path))?;
        }
        write!(f, ": {}", untrusted(&self.message))
    }
}

/// All problems found in one load or validation; never empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SpecErrors(pub Vec<Diagnostic>);

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        if n > 1 {
            write!(f, "\n({n} problems)")?;
        }
        Ok(())
    }
}

/// The document an object was read from, kept so later validation can point into it.
#[derive(Debug, Clone)]
pub struct SourceDoc {
    /// The file path or state-store location it was read from (`-` for standard input).
    pub source: String,
    /// Lines before this document in its file (0 for the first).
    pub line_offset: usize,
    tree: Option<Tree>,
    /// Where the object sits in its document: the root, or `items[i]` of a `kind: List`
    /// (what `get -o json` prints), so paths and positions name the item.
    base: FieldPath,
}

impl SourceDoc {
    fn full(&self, path: &FieldPath) -> FieldPath {
        FieldPath(self.base.0.iter().chain(&path.0).cloned().collect())
    }

    /// Where a field of the object sits in the file (the nearest existing parent when the
    /// field is absent); `None` when the document could not be parsed into a tree.
    pub fn locate(&self, path: &FieldPath) -> Option<Pos> {
        let path = self.full(path);
        self.tree.as_ref().map(|t| {
            let p = t.locate(&path);
            Pos {
                line: p.line + self.line_offset,
                column: p.column,
            }
        })
    }

    /// A problem about the field at `path` of this object, placed in its document.
    pub fn diagnostic(&self, path: &FieldPath, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            source: self.source.clone(),
            pos: self.locate(path),
            path: Some(self.full(path).to_string()).filter(|p| !p.is_empty()),
            message: message.into(),
        }
    }
}

// A handful of objects live per command; boxing the Cluster would buy nothing.
#[allow(clippy::large_enum_variant)]
/// One document of a spec file, by its `kind`.
#[derive(Debug, Clone)]
pub enum Object {
    /// `kind: Cluster`.
    Cluster(Cluster),
    /// `kind: InstanceGroup`.
    InstanceGroup(InstanceGroup),
}

/// An object plus where it came from.
#[derive(Debug, Clone)]
pub struct Loaded<T> {
    /// The object as parsed.
    pub value: T,
    /// Its document, for placing later validation errors.
    pub doc: Arc<SourceDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
}

/// Splits a YAML stream at document markers. A `---` or `...` line at column 0 always ends the
/// previous document in YAML, even inside a block scalar, so a line-based split is exact.
fn split_documents(text: &str) -> Vec<(usize, &str)> {
    let mut docs = Vec::new();
    let mut start = 0usize;
    let mut start_line = 0usize;
    let mut offset = 0usize;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.trim_end_matches(['\n', '\r']);
        let is_marker = bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t");
        if is_marker && offset > start {
            docs.push((start_line, &text[start..offset]));
            start = offset;
            start_line = i;
        }
        offset += line.len();
    }
    docs.push((start_line, &text[start..]));
    docs.into_iter()
        .filter(|(_, d)| {
            d.lines().any(|l| {
                let t = l.trim();
                !(t.is_empty()
                    || t.starts_with('#')
                    || t == "---"
                    || t == "..."
                    || t.starts_with('%'))
            })
        })
        .collect()
}

fn saphyr_diagnostic(
    source: &str,
    line_offset: usize,
    tree: Option<&Tree>,
    err: &serde_saphyr::Error,
) -> Diagnostic {
    let pos = err.location().map(|l| Pos {
        line: l.line() as usize,
        column: l.column() as usize,
    });
    let text = err.without_snippet().to_string();
    // The library prefixes "error: line L column C: "; we print the position ourselves.
    let message = match text.strip_prefix("error: ") {
        Some(rest) if rest.starts_with("line ") => {
            rest.split_once(": ").map_or(rest, |(_, m)| m).to_string()
        }
        Some(rest) => rest.to_string(),
        None => text.clone(),
    };
    let path = pos
        .and_then(|p| tree.and_then(|t| t.path_of_key_at(p)))
        .map(|p| p.to_string());
    Diagnostic {
        source: source.to_string(),
        pos: pos.map(|p| Pos {
            line: p.line + line_offset,
            column: p.column,
        }),
        path,
        message,
    }
}

/// Parses every document in `text` (read from `source`) into Clusters and InstanceGroups.
/// Collects all problems instead of stopping at the first.
pub fn load_objects(source: &str, text: &str) -> Result<Vec<Loaded<Object>>, SpecErrors> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    let docs = split_documents(text);
    if docs.is_empty() {
        return Err(SpecErrors(vec![Diagnostic {
            source: source.to_string(),
            pos: None,
            path: None,
            message: "no objects found (expected a Cluster or InstanceGroup document)".into(),
        }]));
    }
    for (line_offset, chunk) in docs {
        let tree = Tree::parse(chunk);
        let doc = SourceDoc {
            source: source.to_string(),
            line_offset,
            tree: tree.clone(),
            base: FieldPath::root(),
        };
        let meta: TypeMeta = match serde_saphyr::from_str(chunk) {
            Ok(m) => m,
            Err(e) => {
                errors.push(saphyr_diagnostic(source, line_offset, tree.as_ref(), &e));
                continue;
            }
        };
        if meta.kind.as_deref() == Some("List") && meta.api_version.as_deref() == Some("v1") {
            load_list(chunk, doc, &mut out, &mut errors);
            continue;
        }
        if let Some(o) = load_document(chunk, meta, Arc::new(doc), &mut errors, |e| {
            saphyr_diagnostic(source, line_offset, tree.as_ref(), e)
        }) {
            out.push(o);
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(SpecErrors(errors))
    }
}

/// One Cluster or InstanceGroup document; `None` with its problems in `errors`. `parse_error`
/// locates a parser error (in the document, or in a List item's own text).
fn load_document(
    text: &str,
    meta: TypeMeta,
    doc: Arc<SourceDoc>,
    errors: &mut Vec<Diagnostic>,
    parse_error: impl Fn(&serde_saphyr::Error) -> Diagnostic,
) -> Option<Loaded<Object>> {
    // A document without a known apiVersion and kind is said once, and not parsed further;
    // a known one is parsed as its kind (each kind named, so a new one cannot fall through).
    type Parse = fn(&str) -> Result<Object, serde_saphyr::Error>;
    let parse: Result<Parse, (FieldPath, String)> =
        match (meta.api_version.as_deref(), meta.kind.as_deref()) {
            (Some(API_VERSION), Some(KIND_CLUSTER)) => {
                Ok(|t| serde_saphyr::from_str::<Cluster>(t).map(Object::Cluster))
            }
            (Some(API_VERSION), Some(KIND_INSTANCE_GROUP)) => {
                Ok(|t| serde_saphyr::from_str::<InstanceGroup>(t).map(Object::InstanceGroup))
            }
            (Some(API_VERSION), Some(other)) => Err((
                FieldPath::parse("kind"),
                format!("unknown kind {other:?}; expected Cluster or InstanceGroup"),
            )),
            (Some(API_VERSION), None) => Err((
                FieldPath::root(),
                "missing kind (Cluster or InstanceGroup)".to_string(),
            )),
            (Some(other), _) => Err((
                FieldPath::parse("apiVersion"),
                format!("unsupported apiVersion {other:?}; expected {API_VERSION:?}"),
            )),
            (None, _) => Err((
                FieldPath::root(),
                format!("missing apiVersion (expected {API_VERSION:?})"),
            )),
        };
    let parsed = match parse {
        Ok(parse) => parse(text),
        Err((path, message)) => {
            errors.push(doc.diagnostic(&path, message));
            return None;
        }
    };
    match parsed {
        Ok(value) => Some(Loaded { value, doc }),
        Err(e) => {
            errors.push(parse_error(&e));
            None
        }
    }
}

#[derive(Deserialize)]
struct ListDoc {
    #[serde(default)]
    items: Vec<serde_json::Value>,
}

/// A `kind: List` document (`apiVersion: v1`, as `get -o json` and `create --dry-run -o json`
/// print, kubectl's form): every item is loaded as its own document, its problems located at
/// `items[i]` of the list.
fn load_list(
    text: &str,
    list: SourceDoc,
    out: &mut Vec<Loaded<Object>>,
    errors: &mut Vec<Diagnostic>,
) {
    let items = match serde_saphyr::from_str::<ListDoc>(text) {
        Ok(l) => l.items,
        Err(e) => {
            errors.push(saphyr_diagnostic(
                &list.source,
                list.line_offset,
                list.tree.as_ref(),
                &e,
            ));
            return;
        }
    };
    if items.is_empty() {
        errors.push(list.diagnostic(&FieldPath::parse("items"), "an empty List has no objects"));
    }
    for (i, item) in items.into_iter().enumerate() {
        let doc = Arc::new(SourceDoc {
            base: FieldPath::parse("items").index(i),
            ..list.clone()
        });
        // JSON is YAML: the item's own text goes through the one loader; a parser error in it
        // is located back in the list by its field path.
        let text = match serde_json::to_string_pretty(&item) {
            Ok(t) => t,
            Err(e) => {
                errors.push(doc.diagnostic(&FieldPath::root(), e.to_string()));
                continue;
            }
        };
        let meta = TypeMeta {
            api_version: item
                .get("apiVersion")
                .and_then(|v| v.as_str())
                .map(str::to_string),
            kind: item
                .get("kind")
                .and_then(|v| v.as_str())
                .map(str::to_string),
        };
        let own = Tree::parse(&text);
        let at = doc.clone();
        if let Some(o) = load_document(&text, meta, doc, errors, |e| {
            let located = saphyr_diagnostic("", 0, None, e);
            let path = located
                .pos
                .and_then(|p| own.as_ref()?.path_of_key_at(p))
                .unwrap_or_else(FieldPath::root);
            at.diagnostic(&path, located.message)
        }) {
            out.push(o);
        }
    }
}

/// Serialises objects as one multi-document YAML stream that [`load_objects`] reads back.
pub fn to_yaml_stream<'a>(
    objects: impl IntoIterator<Item = ObjectRef<'a>>,
) -> Result<String, serde_saphyr::ser::Error> {
    let mut out = String::new();
    for (i, o) in objects.into_iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        let s = match o {
            ObjectRef::Cluster(c) => to_yaml(c)?,
            ObjectRef::InstanceGroup(g) => to_yaml(g)?,
        };
        out.push_str(&s);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

/// YAML as people write it: long one-line values (SSH keys, URLs) stay on one line instead of
/// being folded, multi-line text uses literal blocks.
pub(super) fn to_yaml<T: serde::Serialize>(value: &T) -> Result<String, serde_saphyr::ser::Error> {
    let mut options = serde_saphyr::SerializerOptions::default();
    options.folded_wrap_chars = usize::MAX / 2;
    // Exact on stdout whatever a stored value holds (see `output::yaml_exact`).
    Ok(crate::output::yaml_exact(
        serde_saphyr::to_string_with_options(value, options)?,
        value,
    ))
}

/// A borrowed [`Object`], for writing objects without cloning them.
#[derive(Debug, Clone, Copy)]
pub enum ObjectRef<'a> {
    /// A Cluster.
    Cluster(&'a Cluster),
    /// An InstanceGroup.
    InstanceGroup(&'a InstanceGroup),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_documents_with_line_offsets() {
        let text = "# c\n---\na: 1\n---\nb: 2\n...\n---\n\n";
        let docs = split_documents(text);
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].0, 1);
        assert_eq!(docs[1].0, 3);
    }

    #[test]
    fn unknown_field_in_second_document_points_at_file_line_and_path() {
        let text = "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: a.example.com\nspec:\n  cloudProvider: aws\n---\napiVersion: kprov.dev/v1alpha1\nkind: InstanceGroup\nmetadata:\n  name: nodes\nspec:\n  role: Node\n  minSise: 1\n";
        let err = load_objects("c.yaml", text).unwrap_err();
        assert_eq!(err.0.len(), 1);
        let d = &err.0[0];
        assert_eq!(
            d.pos,
            Some(Pos {
                line: 14,
                column: 3
            })
        );
        assert_eq!(d.path.as_deref(), Some("spec.minSise"));
        assert!(
            d.message.contains("unknown field `minSise`"),
            "{}",
            d.message
        );
        assert!(
            d.to_string()
                .starts_with("c.yaml:14:3: spec.minSise: unknown field"),
            "{d}"
        );
    }

    #[test]
    fn a_json_list_loads_its_items_and_locates_their_problems() {
        let text = r#"{
  "apiVersion": "v1",
  "kind": "List",
  "items": [
    {
      "apiVersion": "kprov.dev/v1alpha1",
      "kind": "Cluster",
      "metadata": {"name": "a.example.com"},
      "spec": {"cloudProvider": "aws"}
    },
    {
      "apiVersion": "kprov.dev/v1alpha1",
      "kind": "InstanceGroup",
      "metadata": {"name": "nodes"},
      "spec": {"role": "Node", "minSize": 1}
    }
  ]
}"#;
        let objs = load_objects("l.json", text).unwrap();
        assert_eq!(objs.len(), 2);
        assert!(matches!(&objs[0].value, Object::Cluster(c) if c.metadata.name == "a.example.com"));
        assert!(matches!(&objs[1].value, Object::InstanceGroup(g) if g.spec.min_size == Some(1)));
        // Later validation points into the list: the item's line, its path.
        let d = objs[1]
            .doc
            .diagnostic(&FieldPath::parse("spec.minSize"), "too small");
        assert_eq!(
            d.to_string(),
            "l.json:15:43: items[1].spec.minSize: too small"
        );
        // A typo and a wrong kind in items, both reported, at their item.
        let bad = text
            .replace("\"minSize\"", "\"minSise\"")
            .replace("\"kind\": \"Cluster\"", "\"kind\": \"Pod\"");
        let err = load_objects("l.json", &bad).unwrap_err().to_string();
        assert!(
            err.contains("l.json:7:15: items[0].kind: unknown kind \"Pod\""),
            "{err}"
        );
        assert!(
            err.contains("items[1].spec.minSise: unknown field"),
            "{err}"
        );
        assert!(err.contains("l.json:15:"), "{err}");
    }

    #[test]
    fn wrong_kind_and_api_version_are_named() {
        let err = load_objects("x.yaml", "apiVersion: v1\nkind: Pod\n").unwrap_err();
        assert!(
            err.0[0]
                .to_string()
                .contains("x.yaml:1:13: apiVersion: unsupported apiVersion"),
            "{err}"
        );
        let err =
            load_objects("x.yaml", "apiVersion: kprov.dev/v1alpha1\nkind: Pod\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("x.yaml:2:7: kind: unknown kind \"Pod\""),
            "{err}"
        );
    }

    /// A missing apiVersion is said alone (not also the kind), a missing kind once.
    #[test]
    fn missing_kind_and_api_version_are_named_once() {
        for (text, message) in [
            (
                "kind: Pod\n",
                "missing apiVersion (expected \"kprov.dev/v1alpha1\")",
            ),
            ("metadata: {}\n", "missing apiVersion"),
            (
                "apiVersion: kprov.dev/v1alpha1\n",
                "missing kind (Cluster or InstanceGroup)",
            ),
        ] {
            let err = load_objects("x.yaml", text).unwrap_err();
            assert_eq!(err.0.len(), 1, "{err}");
            assert!(err.to_string().contains(message), "{err}");
        }
    }

    #[test]
    fn syntax_errors_are_located() {
        let err = load_objects(
            "s.yaml",
            "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata: [a\n",
        )
        .unwrap_err();
        assert_eq!(err.0[0].pos.map(|p| p.line), Some(3), "{err}");
    }

    #[test]
    fn empty_input_is_an_error() {
        assert!(load_objects("e.yaml", "# nothing\n").is_err());
    }
}
