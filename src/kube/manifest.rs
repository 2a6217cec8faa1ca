//! Multi-document YAML manifests as dynamic objects, and the kinds kprov knows how to address.

use kube::api::{ApiResource, GroupVersionKind};
use serde_json::Value;

use super::KubeError;

/// Where an object lives in the API: enough to build its URL without a discovery round trip.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub(crate) api_version: String,
    /// The object's kind (`Deployment`).
    pub kind: String,
    /// Its namespace; `None` for a cluster-scoped kind.
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// One object of a manifest, as the API server will see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    /// Where it lives in the API.
    pub reference: ObjectRef,
    /// The object as it will be applied.
    pub body: Value,
}

/// The kinds kprov's add-ons use. A static table instead of discovery: one fewer round trip per
/// apply, and an unknown kind is caught when rendering rather than against a live cluster.
const KINDS: &[(&str, &str, &str, bool)] = &[
    // (apiVersion, kind, plural, namespaced)
    ("v1", "Namespace", "namespaces", false),
    ("v1", "ServiceAccount", "serviceaccounts", true),
    ("v1", "ConfigMap", "configmaps", true),
    ("v1", "Secret", "secrets", true),
    ("v1", "Service", "services", true),
    ("v1", "Node", "nodes", false),
    ("v1", "Pod", "pods", true),
    ("apps/v1", "DaemonSet", "daemonsets", true),
    ("apps/v1", "Deployment", "deployments", true),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        "clusterroles",
        false,
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        false,
    ),
    ("rbac.authorization.k8s.io/v1", "Role", "roles", true),
    (
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        "rolebindings",
        true,
    ),
    (
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
    ),
    (
        "policy/v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        true,
    ),
    ("coordination.k8s.io/v1", "Lease", "leases", true),
];

/// The API resource (plural, scope) of a kind, or an error naming the object.
pub(crate) fn api_resource(api_version: &str, kind: &str) -> Option<(ApiResource, bool)> {
    KINDS
        .iter()
        .find(|(v, k, _, _)| *v == api_version && *k == kind)
        .map(|(v, k, plural, namespaced)| {
            let (group, version) = v.split_once('/').unwrap_or(("", v));
            let gvk = GroupVersionKind::gvk(group, version, k);
            (ApiResource::from_gvk_with_plural(&gvk, plural), *namespaced)
        })
}

/// Parses a multi-document manifest. `source` names the manifest in errors (file or add-on).
pub fn parse_manifests(yaml: &str, source: &str) -> Result<Vec<Object>, KubeError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).map_err(|e| KubeError::Manifest {
        source_name: source.to_string(),
        message: e.to_string(),
    })?;
    docs.into_iter()
        .filter(|d| !d.is_null())
        .enumerate()
        .map(|(i, body)| object_from_value(body, &format!("{source} (document {})", i + 1)))
        .collect()
}

fn object_from_value(body: Value, source: &str) -> Result<Object, KubeError> {
    let err = |message: String| KubeError::Manifest {
        source_name: source.to_string(),
        message,
    };
    // Absent → None; present but not a string (YAML reads an unquoted `y`, `on` or `123` as a
    // bool or number) → an error saying so, since "missing" would mislead.
    let field = |path: &[&str]| -> Result<Option<String>, KubeError> {
        let mut v = &body;
        for p in path {
            match v.get(p) {
                Some(next) => v = next,
                None => return Ok(None),
            }
        }
        match v {
            Value::String(s) => Ok(Some(s.clone())),
            Value::Null => Ok(None),
            other => Err(err(format!(
                "{} is {other}, not a string: quote it",
                path.join(".")
            ))),
        }
    };
    let required = |path: &[&str]| -> Result<String, KubeError> {
        field(path)?.ok_or_else(|| err(format!("missing {}", path.join("."))))
    };
    let api_version = required(&["apiVersion"])?;
    let kind = required(&["kind"])?;
    let name = required(&["metadata", "name"])?;
    let (_, namespaced) = api_resource(&api_version, &kind).ok_or_else(|| {
        err(format!(
            "kind {kind} ({api_version}) is not one kprov applies"
        ))
    })?;
    let namespace = field(&["metadata", "namespace"])?;
    let namespace = match (namespaced, namespace) {
        (true, Some(ns)) => Some(ns),
        (true, None) => {
            return Err(err(format!(
                "{kind} {name}: metadata.namespace is required"
            )));
        }
        (false, Some(_)) => {
            return Err(err(format!(
                "{kind} {name} is cluster-scoped: remove metadata.namespace"
            )));
        }
        (false, None) => None,
    };
    Ok(Object {
        reference: ObjectRef {
            api_version,
            kind,
            namespace,
            name,
        },
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_text_parses_or_errors_without_panicking(s in ".{0,200}") {
            let _ = parse_manifests(&s, "fuzz");
        }

        #[test]
        fn rendered_objects_round_trip(names in proptest::collection::vec("[a-z][a-z0-9-]{0,20}", 1..8)) {
            let yaml: String = names
                .iter()
                .map(|n| format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: \"{n}\"\n  namespace: kube-system\ndata:\n  k: \"v\"\n"))
                .collect::<Vec<_>>()
                .join("---\n");
            let objs = parse_manifests(&yaml, "gen").unwrap();
            let got: Vec<&str> = objs.iter().map(|o| o.reference.name.as_str()).collect();
            prop_assert_eq!(got, names.iter().map(String::as_str).collect::<Vec<_>>());
        }
    }

    #[test]
    fn parses_documents_and_rejects_unknown_kinds() {
        let objs = parse_manifests(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: a, namespace: kube-system}\n---\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\n",
            "t.yaml",
        )
        .unwrap();
        assert_eq!(objs.len(), 2);
        assert_eq!(objs[1].reference.to_string(), "ClusterRole r");
        let e = parse_manifests(
            "apiVersion: x/v1\nkind: Foo\nmetadata: {name: a}\n",
            "t.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("t.yaml (document 1)") && e.contains("Foo"),
            "{e}"
        );
        let e = parse_manifests(
            "apiVersion: v1\nkind: Secret\nmetadata: {name: a}\n",
            "t.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("metadata.namespace is required"), "{e}");
        // Found by the round-trip property: an unquoted `y` is a YAML bool, not a name.
        let e = parse_manifests(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: y, namespace: a}\n",
            "t.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("metadata.name is true, not a string: quote it"),
            "{e}"
        );
    }
}
