//! `export kubeconfig`: the cluster's admin kubeconfig merged into the user's, the way kubectl
//! users expect (kops does the same): cluster, user and context all named after the cluster,
//! entries of the same name replaced, everything else kept, current-context switched.

use std::path::PathBuf;

use serde_json::{Map, Value};

#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("{what}: not a kubeconfig: {message}")]
    Parse { what: String, message: String },
    #[error("{what}: {field} is missing or not a list")]
    Shape { what: String, field: &'static str },
    #[error("cannot write YAML: {0}")]
    Write(String),
}

/// Where kubectl reads its configuration: the first entry of `KUBECONFIG`, else
/// `~/.kube/config`.
pub fn default_path(kubeconfig_env: Option<&str>, home: Option<&str>) -> Option<PathBuf> {
    if let Some(first) = kubeconfig_env.and_then(|v| v.split(':').find(|p| !p.is_empty())) {
        return Some(PathBuf::from(first));
    }
    home.map(|h| PathBuf::from(h).join(".kube").join("config"))
}

fn parse(text: &str, what: &str) -> Result<Map<String, Value>, KubeconfigError> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_saphyr::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(Value::Null) => Ok(Map::new()),
        Ok(_) => Err(KubeconfigError::Parse {
            what: what.into(),
            message: "the document is not a mapping".into(),
        }),
        Err(e) => Err(KubeconfigError::Parse {
            what: what.into(),
            message: e.to_string(),
        }),
    }
}

fn first_entry<'a>(
    doc: &'a Map<String, Value>,
    field: &'static str,
    what: &str,
) -> Result<&'a Value, KubeconfigError> {
    doc.get(field)
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(|e| e.get(field.trim_end_matches('s')))
        .ok_or(KubeconfigError::Shape {
            what: what.into(),
            field,
        })
}

/// Merges `admin` (kubeadm's admin.conf) into `existing` (the user's kubeconfig, if any) under
/// the name `cluster`; returns the new file's text.
pub fn merge(
    existing: Option<&str>,
    admin: &str,
    cluster: &str,
) -> Result<String, KubeconfigError> {
    let admin = parse(admin, "admin kubeconfig")?;
    let mut out = parse(existing.unwrap_or(""), "existing kubeconfig")?;
    let entries = [
        (
            "clusters",
            first_entry(&admin, "clusters", "admin kubeconfig")?.clone(),
        ),
        (
            "users",
            first_entry(&admin, "users", "admin kubeconfig")?.clone(),
        ),
        (
            "contexts",
            serde_json::json!({ "cluster": cluster, "user": cluster }),
        ),
    ];
    out.entry("apiVersion").or_insert_with(|| Value::from("v1"));
    out.entry("kind").or_insert_with(|| Value::from("Config"));
    for (field, body) in entries {
        let list = out.entry(field).or_insert_with(|| Value::Array(vec![]));
        if list.is_null() {
            *list = Value::Array(vec![]);
        }
        let list = list.as_array_mut().ok_or(KubeconfigError::Shape {
            what: "existing kubeconfig".into(),
            field,
        })?;
        let mut entry = Map::new();
        entry.insert("name".into(), Value::from(cluster));
        entry.insert(field.trim_end_matches('s').into(), body);
        match list
            .iter_mut()
            .find(|e| e.get("name").and_then(Value::as_str) == Some(cluster))
        {
            Some(e) => *e = Value::Object(entry),
            None => list.push(Value::Object(entry)),
        }
    }
    out.insert("current-context".into(), Value::from(cluster));
    serde_saphyr::to_string(&Value::Object(out)).map_err(|e| KubeconfigError::Write(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN: &str = "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: Q0E=\n    server: https://198.18.0.11:6443\n  name: kubernetes\ncontexts:\n- context:\n    cluster: kubernetes\n    user: kubernetes-admin\n  name: kubernetes-admin@kubernetes\ncurrent-context: kubernetes-admin@kubernetes\nusers:\n- name: kubernetes-admin\n  user:\n    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ\n";

    fn doc(text: &str) -> Value {
        serde_saphyr::from_str(text).unwrap()
    }

    #[test]
    fn fresh_file() {
        let out = doc(&merge(None, ADMIN, "lab.example.com").unwrap());
        assert_eq!(out["current-context"], "lab.example.com");
        assert_eq!(out["clusters"][0]["name"], "lab.example.com");
        assert_eq!(
            out["clusters"][0]["cluster"]["server"],
            "https://198.18.0.11:6443"
        );
        assert_eq!(out["users"][0]["user"]["client-key-data"], "S0VZ");
        assert_eq!(out["contexts"][0]["context"]["cluster"], "lab.example.com");
        assert_eq!(out["contexts"][0]["context"]["user"], "lab.example.com");
    }

    #[test]
    fn keeps_others_and_replaces_same_name() {
        let mine = "apiVersion: v1\nkind: Config\nclusters:\n- name: other\n  cluster:\n    server: https://other:6443\n- name: lab.example.com\n  cluster:\n    server: https://old:6443\nusers:\n- name: other\n  user: {token: t}\ncontexts:\n- name: other\n  context: {cluster: other, user: other}\ncurrent-context: other\npreferences: {}\n";
        let out = doc(&merge(Some(mine), ADMIN, "lab.example.com").unwrap());
        let clusters = out["clusters"].as_array().unwrap();
        assert_eq!(clusters.len(), 2);
        assert_eq!(clusters[0]["cluster"]["server"], "https://other:6443");
        assert_eq!(clusters[1]["cluster"]["server"], "https://198.18.0.11:6443");
        assert_eq!(out["users"].as_array().unwrap().len(), 2);
        assert_eq!(out["current-context"], "lab.example.com");
        assert!(out.get("preferences").is_some());
        // Merging twice changes nothing.
        let again = merge(
            Some(&merge(Some(mine), ADMIN, "lab.example.com").unwrap()),
            ADMIN,
            "lab.example.com",
        )
        .unwrap();
        assert_eq!(doc(&again), out);
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(matches!(
            merge(None, "- a\n", "x"),
            Err(KubeconfigError::Parse { .. })
        ));
        assert!(matches!(
            merge(None, "apiVersion: v1\n", "x"),
            Err(KubeconfigError::Shape {
                field: "clusters",
                ..
            })
        ));
        assert!(matches!(
            merge(Some("clusters: 3\n"), ADMIN, "x"),
            Err(KubeconfigError::Shape { .. })
        ));
    }

    #[test]
    fn path_honours_kubeconfig() {
        assert_eq!(
            default_path(Some("/a:/b"), Some("/home/u")),
            Some(PathBuf::from("/a"))
        );
        assert_eq!(
            default_path(Some(""), Some("/home/u")),
            Some(PathBuf::from("/home/u/.kube/config"))
        );
        assert_eq!(default_path(None, None), None);
    }
}
