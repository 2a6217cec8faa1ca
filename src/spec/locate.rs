//! Source positions for field paths, so every spec error can point at a file, line and column.
//!
//! serde-saphyr reports positions for syntax and type errors; validation runs later on typed
//! values, so each document is also read into a light tree of spanned nodes that maps a field
//! path (`spec.networking.subnets[1].cidr`) back to where it was written.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Seg {
    /// A mapping key (`networking`, a label's name).
    Key(String),
    /// A sequence index, 0-based (`subnets[1]`).
    Index(usize),
}

/// A field path in the YAML document, e.g. `spec.networking.subnets[1].cidr`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct FieldPath(pub Vec<Seg>);

impl FieldPath {
    /// The empty path: the document itself.
    pub fn root() -> Self {
        FieldPath(Vec::new())
    }

    /// This path followed by mapping key `k` (which may hold dots: it is one segment).
    pub fn key(&self, k: &str) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Key(k.to_string()));
        p
    }

    /// This path followed by sequence index `i`.
    pub fn index(&self, i: usize) -> Self {
        let mut p = self.clone();
        p.0.push(Seg::Index(i));
        p
    }

    /// Parses `a.b[2].c`; keys containing dots cannot be expressed, which spec paths never need
    /// except map keys (labels), which callers build with [`FieldPath::key`].
    pub fn parse(s: &str) -> Self {
        let mut segs = Vec::new();
        for part in s.split('.').filter(|p| !p.is_empty()) {
            let (name, rest) = part.split_once('[').map_or((part, ""), |(n, r)| (n, r));
            if !name.is_empty() {
                segs.push(Seg::Key(name.to_string()));
            }
            for idx in rest.split('[') {
                if let Ok(i) = idx.trim_end_matches(']').parse() {
                    segs.push(Seg::Index(i));
                }
            }
        }
        FieldPath(segs)
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            match s {
                Seg::Key(k) if i == 0 => write!(f, "{k}")?,
                Seg::Key(k) if k.contains('.') || k.contains('/') => write!(f, "[{k:?}]")?,
                Seg::Key(k) => write!(f, ".{k}")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    /// The line in the file, 1-based.
    pub line: usize,
    /// The column, 1-based.
    pub column: usize,
}

#[derive(Debug, Clone)]
pub(super) enum Node {
    Map(Vec<(Key, Spanned<Node>)>),
    Seq(Vec<Spanned<Node>>),
    Scalar,
}

/// A mapping key with its own position (where an unknown field is reported).
#[derive(Debug, Clone)]
pub(super) struct Key(pub Spanned<String>);

fn pos_of<T>(s: &Spanned<T>) -> Pos {
    Pos {
        line: s.referenced.line() as usize,
        column: s.referenced.column() as usize,
    }
}

/// The spanned tree of one document.
#[derive(Debug, Clone)]
pub(super) struct Tree {
    root: Spanned<Node>,
}

impl Tree {
    pub(super) fn parse(text: &str) -> Option<Tree> {
        serde_saphyr::from_str::<Spanned<Node>>(text)
            .ok()
            .map(|root| Tree { root })
    }

    /// Position of the value at `path`; if the path does not exist (a missing field), the
    /// position of the deepest ancestor that does, which is where the field belongs.
    pub(super) fn locate(&self, path: &FieldPath) -> Pos {
        let mut node = &self.root;
        for seg in &path.0 {
            let next = match (&node.value, seg) {
                (Node::Map(entries), Seg::Key(k)) => entries
                    .iter()
                    .find(|(key, _)| key.0.value == *k)
                    .map(|(_, v)| v),
                (Node::Seq(items), Seg::Index(i)) => items.get(*i),
                _ => None,
            };
            match next {
                Some(n) => node = n,
                None => break,
            }
        }
        pos_of(node)
    }

    /// The path of the mapping key written at `pos` (serde reports unknown fields by position).
    pub(super) fn path_of_key_at(&self, pos: Pos) -> Option<FieldPath> {
        fn walk(node: &Spanned<Node>, pos: Pos, here: &FieldPath) -> Option<FieldPath> {
            match &node.value {
                Node::Map(entries) => entries.iter().find_map(|(k, v)| {
                    let p = here.key(&k.0.value);
                    if pos_of(&k.0) == pos {
                        Some(p)
                    } else {
                        walk(v, pos, &p)
                    }
                }),
                Node::Seq(items) => items
                    .iter()
                    .enumerate()
                    .find_map(|(i, v)| walk(v, pos, &here.index(i))),
                Node::Scalar => None,
            }
        }
        walk(&self.root, pos, &FieldPath::root())
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Keys may be written as numbers or booleans; paths only need their text.
        struct AnyScalar;
        impl<'de> Visitor<'de> for AnyScalar {
            type Value = String;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a scalar key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
                Ok(v.to_string())
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
                Ok(v.to_string())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
                Ok(v.to_string())
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
                Ok(v.to_string())
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
                Ok(v.to_string())
            }
            fn visit_unit<E: de::Error>(self) -> Result<String, E> {
                Ok(String::new())
            }
        }
        struct KeyText(String);
        impl<'de> Deserialize<'de> for KeyText {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(AnyScalar).map(KeyText)
            }
        }
        let s = Spanned::<KeyText>::deserialize(d)?;
        Ok(Key(Spanned {
            value: s.value.0,
            referenced: s.referenced,
            defined: s.defined,
        }))
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any YAML node")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(k) = m.next_key::<Key>()? {
                    entries.push((k, m.next_value::<Spanned<Node>>()?));
                }
                Ok(Node::Map(entries))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(v) = s.next_element::<Spanned<Node>>()? {
                    items.push(v);
                }
                Ok(Node::Seq(items))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
            fn visit_none<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Scalar)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "metadata:\n  name: x\nspec:\n  subnets:\n  - name: a\n    cidr: 10.0.0.0/24\n  - name: b\n    cidr: 10.0.1.0/24\n";

    #[test]
    fn locates_nested_values_and_missing_fields() {
        let t = Tree::parse(DOC).expect("tree");
        assert_eq!(
            t.locate(&FieldPath::parse("spec.subnets[1].cidr")),
            Pos {
                line: 8,
                column: 11
            }
        );
        assert_eq!(
            t.locate(&FieldPath::parse("metadata.name")),
            Pos { line: 2, column: 9 }
        );
        // A missing field points at its parent, where it should be written.
        assert_eq!(t.locate(&FieldPath::parse("spec.subnets[0].zone")).line, 5);
    }

    #[test]
    fn finds_path_of_key_by_position() {
        let t = Tree::parse(DOC).expect("tree");
        let p = t.path_of_key_at(Pos { line: 8, column: 5 }).expect("path");
        assert_eq!(p.to_string(), "spec.subnets[1].cidr");
    }

    #[test]
    fn path_display_round_trips() {
        for s in ["spec.networking.subnets[3].cidr", "a", "a[0][1].b"] {
            assert_eq!(FieldPath::parse(s).to_string(), s);
        }
        assert_eq!(
            FieldPath::root()
                .key("spec")
                .key("nodeLabels")
                .key("kprov.dev/x")
                .to_string(),
            "spec.nodeLabels[\"kprov.dev/x\"]"
        );
    }
}
