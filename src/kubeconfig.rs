//! Exporting a cluster's admin kubeconfig into the user's kubeconfig, merged the way kubectl
//! merges: entries named after the cluster replace their namesakes, everything else in the
//! file is kept as it was, and the current context switches to the cluster (as kops does).

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

/// Why a kubeconfig could not be checked, merged or written.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// A kubeconfig (the user's file or the admin one) is not YAML of the kubeconfig shape.
    #[error("{path}: not a kubeconfig: {message}")]
    Parse {
        /// The file, or "admin kubeconfig" for the one from the state store.
        path: String,
        /// What the parser or the shape check found.
        message: String,
    },
    /// Writing the merged kubeconfig (its directory, temporary file or rename) failed.
    #[error("{path}: {source}")]
    Io {
        /// The kubeconfig file being written.
        path: String,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// Reading the user's existing kubeconfig failed or hit its size limit.
    #[error(transparent)]
    Read(#[from] crate::bounded::ReadError),
    /// The admin kubeconfig lacks the cluster or user entry the merge copies.
    #[error("{what}: the admin kubeconfig has no {field}")]
    Missing {
        /// The cluster whose admin kubeconfig it is.
        what: String,
        /// The missing entry: `cluster` or `user`.
        field: &'static str,
    },
    /// The stored admin kubeconfig is not one kprov writes (a refused field, too large, not text).
    #[error(
        "{key} in the state store: {message}; kprov stores client-certificate kubeconfigs only, so \
         this one was not written by kprov (whoever can write the state store can change it). \
         Refusing to use it: check who changed it, then re-provision (`kprov update cluster \
         --yes`) or pass your own --kubeconfig FILE"
    )]
    Untrusted {
        /// The state-store key the admin kubeconfig was read from.
        key: String,
        /// Which check it failed (size, encoding, an unexpected field).
        message: String,
    },
}

/// The fields kprov's stored admin kubeconfig may have, per level. Anything else (`exec`,
/// `auth-provider`, `tokenFile`, `client-certificate` and other file paths, `proxy-url`,
/// impersonation, extensions) is refused: each makes the client run or read something on the
/// operator's machine, send credentials elsewhere, or is simply not what kprov writes.
const TOP_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "clusters",
    "users",
    "contexts",
    "current-context",
    "preferences",
];
const CLUSTER_FIELDS: &[&str] = &["server", "certificate-authority-data", "tls-server-name"];
const USER_FIELDS: &[&str] = &["client-certificate-data", "client-key-data"];
const CONTEXT_FIELDS: &[&str] = &["cluster", "user", "namespace"];
const PREFERENCE_FIELDS: &[&str] = &["colors"];

/// The largest stored admin kubeconfig accepted (kubeadm's is about 6 KiB).
pub const MAX_STORED_ADMIN: usize = 256 * 1024;

/// Checks an admin kubeconfig read from the state store under `key` and returns its text:
/// UTF-8, bounded, and only the fields a client-certificate kubeconfig has.
pub fn trusted_admin(data: &[u8], key: &str) -> Result<String, KubeconfigError> {
    let bad = |message: String| KubeconfigError::Untrusted {
        key: key.to_string(),
        message,
    };
    let limit = format_args!("the {MAX_STORED_ADMIN} an admin kubeconfig may have");
    crate::state::check_size(data, MAX_STORED_ADMIN, limit).map_err(bad)?;
    let text = std::str::from_utf8(data)
        .map_err(|_| bad("not UTF-8 text".into()))?
        .to_string();
    let doc: Value = serde_saphyr::from_str(&text)
        .map_err(|e| bad(format!("not a kubeconfig: {}", e.without_snippet())))?;
    let top = doc
        .as_object()
        .ok_or_else(|| bad("the top level is not a mapping".into()))?;
    check_fields(top, TOP_FIELDS, "").map_err(bad)?;
    if let Some(p) = top.get("preferences").filter(|p| !p.is_null()) {
        let p = p
            .as_object()
            .ok_or_else(|| bad("preferences is not a mapping".into()))?;
        check_fields(p, PREFERENCE_FIELDS, "preferences.").map_err(bad)?;
    }
    for (list, inner, allowed) in [
        ("clusters", "cluster", CLUSTER_FIELDS),
        ("users", "user", USER_FIELDS),
        ("contexts", "context", CONTEXT_FIELDS),
    ] {
        let items = match top.get(list) {
            None | Some(Value::Null) => continue,
            Some(Value::Array(a)) => a,
            Some(_) => return Err(bad(format!("{list} is not a list"))),
        };
        for (i, item) in items.iter().enumerate() {
            let at = format!("{list}[{i}]");
            let obj = item
                .as_object()
                .ok_or_else(|| bad(format!("{at} is not a mapping")))?;
            check_fields(obj, &["name", inner], &format!("{at}.")).map_err(bad)?;
            match obj.get(inner) {
                None | Some(Value::Null) => {}
                Some(Value::Object(o)) => {
                    check_fields(o, allowed, &format!("{at}.{inner}.")).map_err(bad)?
                }
                Some(_) => return Err(bad(format!("{at}.{inner} is not a mapping"))),
            }
        }
    }
    Ok(text)
}

fn check_fields(obj: &Map<String, Value>, allowed: &[&str], at: &str) -> Result<(), String> {
    match obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => {
            let why = match k.as_str() {
                "exec" | "auth-provider" => " (it would run a command on this machine)",
                "tokenFile" | "client-certificate" | "client-key" | "certificate-authority" => {
                    " (it would read a file of this machine)"
                }
                "proxy-url" => " (it would send the credentials through another host)",
                _ => "",
            };
            Err(format!("the admin kubeconfig has `{at}{k}`{why}"))
        }
    }
}

fn parse(text: &str, path: &str) -> Result<Value, KubeconfigError> {
    if text.trim().is_empty() {
        return Ok(json!({"apiVersion": "v1", "kind": "Config"}));
    }
    let v: Value = serde_saphyr::from_str(text).map_err(|e| KubeconfigError::Parse {
        path: path.into(),
        message: e.without_snippet().to_string(),
    })?;
    if !v.is_object() {
        return Err(KubeconfigError::Parse {
            path: path.into(),
            message: "the top level is not a mapping".into(),
        });
    }
    Ok(v)
}

fn first_named<'a>(doc: &'a Value, list: &str) -> Option<&'a Map<String, Value>> {
    doc.get(list)?.as_array()?.first()?.as_object()
}

/// Replaces (or appends) the entry called `name` in the list `list` of `doc`.
fn upsert(doc: &mut Map<String, Value>, list: &str, name: &str, entry: Value) {
    let arr = doc.entry(list).or_insert_with(|| Value::Array(Vec::new()));
    if !arr.is_array() {
        *arr = Value::Array(Vec::new());
    }
    if let Some(items) = arr.as_array_mut() {
        let item = json!({"name": name, list.trim_end_matches('s'): entry});
        match items
            .iter_mut()
            .find(|i| i.get("name").and_then(Value::as_str) == Some(name))
        {
            Some(slot) => *slot = item,
            None => items.push(item),
        }
    }
}

/// The server URL of the first cluster of a kubeconfig.
pub fn server(text: &str) -> Option<String> {
    let doc = parse(text, "kubeconfig").ok()?;
    first_named(&doc, "clusters")?
        .get("cluster")?
        .get("server")?
        .as_str()
        .map(str::to_string)
}

/// Merges the admin kubeconfig `admin` (as kubeadm writes it) into `existing` under the
/// cluster's name. `server` overrides the API address (the load balancer or public name).
pub fn merge(
    existing: &str,
    existing_path: &str,
    admin: &str,
    cluster: &str,
    server: Option<&str>,
) -> Result<String, KubeconfigError> {
    let admin_doc = parse(admin, "admin kubeconfig")?;
    let missing = |field| KubeconfigError::Missing {
        what: cluster.into(),
        field,
    };
    let mut c = first_named(&admin_doc, "clusters")
        .and_then(|e| e.get("cluster"))
        .cloned()
        .ok_or_else(|| missing("cluster"))?;
    let u = first_named(&admin_doc, "users")
        .and_then(|e| e.get("user"))
        .cloned()
        .ok_or_else(|| missing("user"))?;
    if let (Some(s), Some(obj)) = (server, c.as_object_mut()) {
        obj.insert("server".into(), Value::String(s.to_string()));
    }
    let mut doc = parse(existing, existing_path)?;
    let Some(map) = doc.as_object_mut() else {
        return Err(KubeconfigError::Parse {
            path: existing_path.into(),
            message: "not a mapping".into(),
        });
    };
    map.entry("apiVersion").or_insert_with(|| json!("v1"));
    map.entry("kind").or_insert_with(|| json!("Config"));
    upsert(map, "clusters", cluster, c);
    upsert(map, "users", cluster, u);
    upsert(
        map,
        "contexts",
        cluster,
        json!({"cluster": cluster, "user": cluster}),
    );
    map.insert("current-context".into(), json!(cluster));
    serde_saphyr::to_string(&doc).map_err(|e| KubeconfigError::Parse {
        path: existing_path.into(),
        message: e.to_string(),
    })
}

/// Which file to write, following kubectl: an explicit path wins; with `KUBECONFIG`, the file
/// that already has the context, else the first that exists, else the last listed; otherwise
/// `~/.kube/config`.
pub fn target_path(
    explicit: Option<&Path>,
    kubeconfig_env: Option<&str>,
    home: Option<&Path>,
    context: &str,
) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    if let Some(env) = kubeconfig_env.filter(|s| !s.trim().is_empty()) {
        let paths: Vec<PathBuf> = std::env::split_paths(env)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        let has_context = |p: &PathBuf| {
            crate::bounded::read_file_to_string(p, crate::bounded::KUBECONFIG)
                .ok()
                .and_then(|t| parse(&t, "").ok())
                .is_some_and(|d| {
                    d.get("contexts")
                        .and_then(Value::as_array)
                        .is_some_and(|a| {
                            a.iter()
                                .any(|c| c.get("name").and_then(Value::as_str) == Some(context))
                        })
                })
        };
        if let Some(p) = paths
            .iter()
            .find(|p| has_context(p))
            .or_else(|| paths.iter().find(|p| p.exists()))
            .or(paths.last())
        {
            return p.clone();
        }
    }
    home.map_or_else(|| PathBuf::from(".kube/config"), |h| h.join(".kube/config"))
}

/// Merges into `path` and writes it back atomically, readable by the owner only.
pub fn export(
    path: &Path,
    admin: &str,
    cluster: &str,
    server: Option<&str>,
) -> Result<(), KubeconfigError> {
    let io = |source| KubeconfigError::Io {
        path: path.display().to_string(),
        source,
    };
    let existing = match crate::bounded::read_file_to_string(path, crate::bounded::KUBECONFIG) {
        Ok(t) => t,
        Err(e) if e.io_kind() == Some(std::io::ErrorKind::NotFound) => String::new(),
        Err(e) => {
            return Err(KubeconfigError::Read(e));
        }
    };
    let merged = merge(
        &existing,
        &path.display().to_string(),
        admin,
        cluster,
        server,
    )?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    std::io::Write::write_all(&mut tmp, merged.as_bytes()).map_err(io)?;
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster:\n    certificate-authority-data: Q0E=\n    server: https://10.0.0.1:6443\nusers:\n- name: kubernetes-admin\n  user:\n    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ\ncontexts:\n- name: kubernetes-admin@kubernetes\n  context: {cluster: kubernetes, user: kubernetes-admin}\ncurrent-context: kubernetes-admin@kubernetes\n";
    const MINE: &str = "apiVersion: v1\nkind: Config\npreferences: {colors: true}\nclusters:\n- name: other\n  cluster: {server: https://other:6443, extensions: [{name: x, extension: {a: 1}}]}\nusers:\n- name: other\n  user: {token: abc}\ncontexts:\n- name: other\n  context: {cluster: other, user: other, namespace: dev}\ncurrent-context: other\n";

    #[test]
    fn merges_without_losing_other_entries() {
        let out = merge(
            MINE,
            "config",
            ADMIN,
            "demo.example.com",
            Some("https://api.demo.example.com:6443"),
        )
        .unwrap();
        let v: Value = serde_saphyr::from_str(&out).unwrap();
        assert_eq!(v["current-context"], "demo.example.com");
        assert_eq!(v["preferences"]["colors"], true);
        let clusters = v["clusters"].as_array().unwrap();
        assert_eq!(clusters.len(), 2);
        assert_eq!(clusters[0]["cluster"]["extensions"][0]["extension"]["a"], 1);
        assert_eq!(
            clusters[1]["cluster"]["server"],
            "https://api.demo.example.com:6443"
        );
        assert_eq!(clusters[1]["cluster"]["certificate-authority-data"], "Q0E=");
        assert_eq!(v["users"][1]["user"]["client-key-data"], "S0VZ");
        assert_eq!(v["contexts"][0]["context"]["namespace"], "dev");
    }

    #[test]
    fn re_export_replaces_instead_of_duplicating() {
        let once = merge(MINE, "config", ADMIN, "demo", None).unwrap();
        let twice = merge(&once, "config", ADMIN, "demo", None).unwrap();
        assert_eq!(once, twice);
    }

    #[test]
    fn empty_or_missing_file_starts_fresh() {
        let out = merge("", "config", ADMIN, "demo", None).unwrap();
        let v: Value = serde_saphyr::from_str(&out).unwrap();
        assert_eq!(
            v["clusters"][0]["cluster"]["server"],
            "https://10.0.0.1:6443"
        );
        assert_eq!(v["kind"], "Config");
    }

    #[test]
    fn garbage_is_refused_naming_the_file() {
        let e = merge("- a\n- b\n", "/home/u/.kube/config", ADMIN, "demo", None).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/home/u/.kube/config: not a kubeconfig"),
            "{e}"
        );
        assert!(merge(MINE, "c", "clusters: []\n", "demo", None).is_err());
    }

    #[test]
    fn target_follows_kubectl_rules() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        let b = d.path().join("b");
        let env = std::env::join_paths([&a, &b])
            .unwrap()
            .into_string()
            .unwrap();
        assert_eq!(
            target_path(None, Some(&env), None, "demo"),
            b,
            "nothing exists: the last file"
        );
        std::fs::write(&b, MINE).unwrap();
        assert_eq!(
            target_path(None, Some(&env), None, "demo"),
            b,
            "the first that exists"
        );
        std::fs::write(&a, merge("", "a", ADMIN, "demo", None).unwrap()).unwrap();
        assert_eq!(
            target_path(None, Some(&env), None, "demo"),
            a,
            "the file that has the context"
        );
        assert_eq!(
            target_path(None, None, Some(d.path()), "demo"),
            d.path().join(".kube/config")
        );
        assert_eq!(
            target_path(Some(Path::new("/x")), Some(&env), None, "demo"),
            PathBuf::from("/x")
        );
    }

    #[test]
    fn stored_client_certificate_kubeconfigs_are_trusted() {
        assert_eq!(trusted_admin(ADMIN.as_bytes(), "k").unwrap(), ADMIN);
        // What kubeadm writes, with empty preferences and a CA left empty.
        let kubeadm = "apiVersion: v1\nkind: Config\npreferences: {}\nclusters:\n- cluster:\n    certificate-authority-data:\n    server: https://a:6443\n  name: k\nusers:\n- name: u\n  user: {}\ncontexts: []\n";
        assert!(trusted_admin(kubeadm.as_bytes(), "k").is_ok());
    }

    #[test]
    fn stored_kubeconfigs_that_run_or_read_something_are_refused() {
        let user = |u: &str| {
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: https://a}}\nusers:\n- name: ok\n  user: {{client-key-data: S0VZ}}\n- name: x\n  user:\n{u}\n"
            )
        };
        for (field, body) in [
            (
                "exec",
                "    exec: {command: /bin/sh, args: [-c, touch /tmp/pwned], apiVersion: client.authentication.k8s.io/v1}",
            ),
            (
                "auth-provider",
                "    auth-provider: {name: gcp, config: {cmd-path: /bin/sh}}",
            ),
            ("tokenFile", "    tokenFile: /etc/shadow"),
            ("token", "    token: abc"),
            (
                "client-certificate",
                "    client-certificate: /home/u/.ssh/id_rsa",
            ),
            ("as", "    as: system:admin"),
        ] {
            let e = trusted_admin(user(body).as_bytes(), "demo/secrets/admin.conf").unwrap_err();
            let m = e.to_string();
            assert!(
                m.starts_with("demo/secrets/admin.conf in the state store")
                    && m.contains(&format!("users[1].user.{field}`")),
                "{m}"
            );
        }
        let e = trusted_admin(user("    exec: {command: x}").as_bytes(), "k").unwrap_err();
        assert!(e.to_string().contains("run a command"), "{e}");
        for doc in [
            "clusters:\n- name: c\n  cluster: {server: https://a, certificate-authority: /etc/x}\n",
            "clusters:\n- name: c\n  cluster: {server: https://a, proxy-url: socks5://evil:1080}\n",
            "clusters:\n- name: c\n  cluster: {server: https://a}\n  extensions: []\n",
            "contexts:\n- name: c\n  context: {cluster: c, user: u, extensions: []}\n",
            "extensions: []\n",
            "preferences: {extensions: []}\n",
            "users: {name: x}\n",
            "users:\n- name: x\n  user: exec\n",
            "- not a mapping\n",
        ] {
            assert!(trusted_admin(doc.as_bytes(), "k").is_err(), "{doc}");
        }
        assert!(trusted_admin(&[0xff, 0xfe], "k").is_err());
        assert!(trusted_admin(&vec![b' '; MAX_STORED_ADMIN + 1], "k").is_err());
    }

    #[test]
    fn export_writes_owner_only() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/config");
        export(&p, ADMIN, "demo", None).unwrap();
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&p).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600);
    }
}
