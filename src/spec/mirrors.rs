//! Registry mirrors (`spec.containerd.registries`) and the HTTP proxy (`spec.proxy`) as the
//! files a node gets: containerd's `hosts.toml` per upstream registry (containerd 2.x's
//! format, read at every pull from `config_path`), and systemd drop-ins that give containerd
//! and the kubelet the proxy environment.
//!
//! Every value that reaches a file was checked here to hold only characters those files need
//! no quoting for (TOML basic strings are written JSON-encoded; systemd `Environment=` values
//! are double-quoted and may not hold quotes, `\`, `%`, `$` or spaces): whatever validation let
//! through, nothing can break out of its string.

use std::collections::BTreeMap;

use base64::Engine;
use serde_json::json;

use crate::spec::{ClusterSpec, Registry, RegistryCredentials, RegistryMirror};

/// containerd's registry configuration directory (`config_path`).
pub const CERTS_D: &str = "/etc/containerd/certs.d";
/// Marks a `certs.d` directory as kprov's: only those are removed when their registry
/// leaves the spec (an operator's own directories stay).
pub const MANAGED_MARK: &str = "kprov-managed";
/// The systemd drop-in that gives containerd `spec.proxy` (written only when a proxy is set).
pub const CONTAINERD_PROXY_DROPIN: &str =
    "/etc/systemd/system/containerd.service.d/http-proxy.conf";
/// The systemd drop-in that gives the kubelet `spec.proxy`.
pub const KUBELET_PROXY_DROPIN: &str = "/etc/systemd/system/kubelet.service.d/http-proxy.conf";

/// The capabilities a mirror has unless the spec names them.
const DEFAULT_CAPABILITIES: &[&str] = &["pull", "resolve"];
const CAPABILITIES: &[&str] = &["pull", "resolve", "push"];

/// A field that cannot be written into a node file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct MirrorError {
    /// The spec field, e.g. `spec.containerd.registries[0].mirrors[1].endpoint`.
    pub field: String,
    /// What is wrong with its value.
    pub message: String,
}

fn bad(field: impl Into<String>, message: impl Into<String>) -> MirrorError {
    MirrorError {
        field: field.into(),
        message: message.into(),
    }
}

/// A registry name as image references spell it: a DNS name or IP, optionally `:port`.
pub fn check_registry_name(name: &str) -> Result<(), String> {
    let (host, port) = match name.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (name, None),
    };
    if let Some(p) = port
        && p.parse::<u16>().is_err()
    {
        return Err(format!("{name:?}: {p:?} is not a port number"));
    }
    let ok = !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        && !host.starts_with('-');
    if !ok {
        return Err(format!(
            "{name:?} is not a registry name (a host name like docker.io or \
             harbor.example.com:5000)"
        ));
    }
    Ok(())
}

/// An `http(s)://host[:port][/path]` URL with only characters a URL needs.
pub fn check_endpoint(url: &str) -> Result<(), String> {
    // `user:token@host` would put a secret in the spec, in containerd's hosts.toml and in
    // this very error: refuse it without echoing the URL.
    let authority = url.split_once("://").map_or(url, |(_, r)| r);
    if authority.split('/').next().is_some_and(|a| a.contains('@')) {
        return Err(
            "a mirror URL may not carry credentials (user:password@): store them with \
             `kprov create registry-credentials` (the URL is not shown: it holds a secret)"
                .into(),
        );
    }
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| format!("{url:?} is not an http:// or https:// URL"))?;
    let (host, path) = match rest.split_once('/') {
        Some((h, p)) => (h, p),
        None => (rest, ""),
    };
    check_registry_name(host).map_err(|e| format!("{url:?}: {e}"))?;
    if !path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~/".contains(&b))
    {
        return Err(format!(
            "{url:?}: the path may hold only letters, digits and -._~/"
        ));
    }
    Ok(())
}

/// The upstream server a registry name stands for (`docker.io` is served by
/// registry-1.docker.io).
fn upstream(name: &str) -> String {
    match name {
        "docker.io" => "https://registry-1.docker.io".into(),
        other => format!("https://{other}"),
    }
}

/// File-name-safe form of a mirror host (`:` is not wanted in file names).
fn file_stem(host: &str) -> String {
    host.replace(':', "_")
}

/// One file a node gets: path, content, mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFile {
    /// Absolute path on the node.
    pub path: String,
    /// The file's bytes.
    pub content: Vec<u8>,
    /// Unix permissions: 0o600 for credentials and keys, 0o644 otherwise.
    pub mode: u32,
}

/// Reads a PEM file the spec names on the operator's machine.
fn read_pem(field: &str, path: &str, read: bool) -> Result<Vec<u8>, MirrorError> {
    if !read {
        return Ok(Vec::new());
    }
    let bytes = crate::bounded::read_file(std::path::Path::new(path), 1 << 20)
        .map_err(|e| bad(field, format!("{path}: cannot read: {e}")))?;
    if !bytes.starts_with(b"-----BEGIN ") {
        return Err(bad(field, format!("{path}: is not a PEM file")));
    }
    Ok(bytes)
}

/// The `[host."URL"]` table (or the top-level server settings when `table` is `None`).
fn host_settings(
    out: &mut String,
    files: &mut Vec<NodeFile>,
    field: &str,
    dir: &str,
    table: Option<&str>,
    m: &RegistryMirror,
    (credentials, read): (&RegistryCredentials, bool),
) -> Result<(), MirrorError> {
    let host = m
        .host()
        .ok_or_else(|| bad(format!("{field}.endpoint"), "has no host"))?;
    let stem = file_stem(host);
    let indent = if table.is_some() { "  " } else { "" };
    let caps: Vec<&str> = if m.capabilities.is_empty() {
        DEFAULT_CAPABILITIES.to_vec()
    } else {
        m.capabilities.iter().map(String::as_str).collect()
    };
    for c in &caps {
        if !CAPABILITIES.contains(c) {
            return Err(bad(
                format!("{field}.capabilities"),
                format!("{c:?} is not a containerd capability (pull, resolve, push)"),
            ));
        }
    }
    if table.is_some() {
        out.push_str(&format!("{indent}capabilities = {}\n", json!(caps)));
    }
    if let Some(ca) = &m.ca_file {
        let path = format!("{dir}/{stem}-ca.crt");
        files.push(NodeFile {
            path: path.clone(),
            content: read_pem(&format!("{field}.caFile"), ca, read)?,
            mode: 0o644,
        });
        out.push_str(&format!("{indent}ca = {}\n", json!(path)));
    }
    match (&m.client_cert_file, &m.client_key_file) {
        (Some(cert), Some(key)) => {
            let (cp, kp) = (
                format!("{dir}/{stem}-client.crt"),
                format!("{dir}/{stem}-client.key"),
            );
            files.push(NodeFile {
                path: cp.clone(),
                content: read_pem(&format!("{field}.clientCertFile"), cert, read)?,
                mode: 0o644,
            });
            files.push(NodeFile {
                path: kp.clone(),
                content: read_pem(&format!("{field}.clientKeyFile"), key, read)?,
                mode: 0o600,
            });
            out.push_str(&format!("{indent}client = [{}]\n", json!([cp, kp])));
        }
        (None, None) => {}
        _ => {
            return Err(bad(
                field,
                "clientCertFile and clientKeyFile go together (mutual TLS needs both)",
            ));
        }
    }
    if m.skip_verify == Some(true) {
        out.push_str(&format!("{indent}skip_verify = true\n"));
    }
    if m.override_path == Some(true) {
        out.push_str(&format!("{indent}override_path = true\n"));
    }
    if let Some(c) = credentials.0.get(host) {
        let token = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", c.username, c.password));
        let header = match table {
            Some(t) => format!("{indent}[host.{}.header]\n", json!(t)),
            None => "[header]\n".to_string(),
        };
        out.push_str(&header);
        out.push_str(&format!(
            "{indent}  Authorization = [{}]\n",
            json!(format!("Basic {token}"))
        ));
    }
    Ok(())
}

/// `hosts.toml` (and the CA and client files beside it) for one registry; `index` names the
/// entry in errors.
pub fn hosts_toml(
    index: usize,
    r: &Registry,
    credentials: &RegistryCredentials,
    read: bool,
) -> Result<Vec<NodeFile>, MirrorError> {
    let field = format!("spec.containerd.registries[{index}]");
    check_registry_name(&r.name).map_err(|m| bad(format!("{field}.name"), m))?;
    if r.mirrors.is_empty() && r.image_repository.is_none() {
        return Err(bad(
            format!("{field}.mirrors"),
            format!("{} has no mirror endpoint", r.name),
        ));
    }
    let dir = format!("{CERTS_D}/{}", r.name);
    let mut files = Vec::new();
    let mut out = format!(
        "# Written by kprov (spec.containerd.registries[{index}]): where containerd pulls {} \
         images from.\n",
        r.name
    );
    for (i, m) in r.mirrors.iter().enumerate() {
        check_endpoint(&m.endpoint)
            .map_err(|e| bad(format!("{field}.mirrors[{i}].endpoint"), e))?;
    }
    let fallback = r.fallback.unwrap_or(true);
    match (fallback, r.mirrors.first()) {
        (false, Some(first)) => {
            // containerd always tries `server` last; an air-gapped registry's server is its
            // first mirror, so nothing goes to the unreachable upstream.
            out.push_str("# fallback: false: the upstream is never tried.\n");
            out.push_str(&format!("server = {}\n", json!(first.endpoint)));
            host_settings(
                &mut out,
                &mut files,
                &format!("{field}.mirrors[0]"),
                &dir,
                None,
                first,
                (credentials, read),
            )?;
        }
        _ => out.push_str(&format!("server = {}\n", json!(upstream(&r.name)))),
    }
    for (i, m) in r.mirrors.iter().enumerate() {
        out.push_str(&format!("\n[host.{}]\n", json!(m.endpoint)));
        host_settings(
            &mut out,
            &mut files,
            &format!("{field}.mirrors[{i}]"),
            &dir,
            Some(&m.endpoint),
            m,
            (credentials, read),
        )?;
    }
    // Basic auth sits in the file: only root reads it.
    files.insert(
        0,
        NodeFile {
            path: format!("{dir}/hosts.toml"),
            content: out.into_bytes(),
            mode: 0o600,
        },
    );
    files.push(NodeFile {
        path: format!("{dir}/{MANAGED_MARK}"),
        content: b"# This directory is kprov's: it is removed when its registry leaves spec.containerd.registries.\n"
            .to_vec(),
        mode: 0o644,
    });
    Ok(files)
}

/// Every registry's files, in spec order.
pub fn registry_files(spec: &ClusterSpec) -> Result<Vec<NodeFile>, MirrorError> {
    files_of(spec, true)
}

/// What is wrong with `spec.containerd.registries` and `spec.proxy`, without reading the
/// files they name (validation; rendering reads them).
pub fn check_spec(spec: &ClusterSpec) -> Result<(), MirrorError> {
    files_of(spec, false)?;
    image_repository(spec)?;
    proxy_env(spec, &[], "localhost")?;
    Ok(())
}

fn files_of(spec: &ClusterSpec, read: bool) -> Result<Vec<NodeFile>, MirrorError> {
    let Some(c) = &spec.containerd else {
        return Ok(Vec::new());
    };
    let mut seen = BTreeMap::new();
    let mut files = Vec::new();
    for (i, r) in c.registries.iter().enumerate() {
        if let Some(j) = seen.insert(r.name.clone(), i) {
            return Err(bad(
                format!("spec.containerd.registries[{i}].name"),
                format!("{} is also spec.containerd.registries[{j}]", r.name),
            ));
        }
        files.extend(hosts_toml(i, r, &c.credentials, read)?);
    }
    Ok(files)
}

/// kubeadm's `imageRepository` when registry.k8s.io is rewritten.
pub fn image_repository(spec: &ClusterSpec) -> Result<Option<String>, MirrorError> {
    let Some(c) = &spec.containerd else {
        return Ok(None);
    };
    for (i, r) in c.registries.iter().enumerate() {
        let Some(repo) = &r.image_repository else {
            continue;
        };
        let field = format!("spec.containerd.registries[{i}].imageRepository");
        if r.name != "registry.k8s.io" {
            return Err(bad(
                field,
                "only registry.k8s.io's images can be rewritten (kubeadm's imageRepository)",
            ));
        }
        let (host, path) = repo.split_once('/').unwrap_or((repo, ""));
        check_registry_name(host).map_err(|m| bad(&field, m))?;
        if !path
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._/".contains(&b))
        {
            return Err(bad(
                &field,
                format!("{repo:?} is not an image repository (host[:port]/path)"),
            ));
        }
        return Ok(Some(repo.clone()));
    }
    Ok(None)
}

/// `spec.proxy` resolved for the nodes: the proxies and the complete no-proxy list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyEnv {
    /// `spec.proxy.http`, as `HTTP_PROXY`.
    pub http: Option<String>,
    /// `spec.proxy.https`, as `HTTPS_PROXY`.
    pub https: Option<String>,
    /// `spec.proxy.noProxy` plus what must never go through a proxy, comma-separated.
    pub no_proxy: String,
}

fn check_proxy_value(field: &str, v: &str) -> Result<(), MirrorError> {
    if v.is_empty()
        || !v
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~:/@[]*".contains(&b))
    {
        return Err(bad(
            field,
            format!(
                "{v:?} may hold only letters, digits and -._~:/@[]* (it goes into systemd \
                 unit files and the environment)"
            ),
        ));
    }
    Ok(())
}

/// The proxy environment, with `noProxy` completed by what must never go through a proxy:
/// `node_addresses` (the hosts' IPs, or the cloud network's CIDR), the pod and service
/// CIDRs, the API endpoint's host, the loopback names, and the cluster's service domains.
pub fn proxy_env(
    spec: &ClusterSpec,
    node_addresses: &[String],
    api_host: &str,
) -> Result<Option<ProxyEnv>, MirrorError> {
    let Some(p) = &spec.proxy else {
        return Ok(None);
    };
    if p.http.is_none() && p.https.is_none() {
        return Ok(None);
    }
    for (field, v) in [("spec.proxy.http", &p.http), ("spec.proxy.https", &p.https)] {
        if let Some(v) = v {
            check_endpoint(v)
                .map_err(|m| bad(field, m))
                .and_then(|()| check_proxy_value(field, v))?;
        }
    }
    let mut list: Vec<String> = Vec::new();
    let mut add = |s: &str| {
        if !s.is_empty() && !list.iter().any(|x| x == s) {
            list.push(s.to_string());
        }
    };
    for (i, n) in p.no_proxy.iter().enumerate() {
        for part in n.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            check_proxy_value(&format!("spec.proxy.noProxy[{i}]"), part)?;
            add(part);
        }
    }
    for a in node_addresses {
        add(a);
    }
    for cidr in [&spec.networking.pod_cidr, &spec.networking.service_cidr]
        .into_iter()
        .flatten()
    {
        add(cidr);
    }
    add(api_host);
    for s in ["localhost", "127.0.0.1", ".svc", ".cluster.local"] {
        add(s);
    }
    for v in &list {
        check_proxy_value("spec.proxy.noProxy", v)?;
    }
    Ok(Some(ProxyEnv {
        http: p.http.clone(),
        https: p.https.clone(),
        no_proxy: list.join(","),
    }))
}

impl ProxyEnv {
    /// The variables in both spellings (curl reads lowercase `http_proxy`; Go programs
    /// read either).
    pub fn vars(&self) -> Vec<(String, String)> {
        let mut v = Vec::new();
        if let Some(h) = &self.http {
            v.push(("HTTP_PROXY".into(), h.clone()));
            v.push(("http_proxy".into(), h.clone()));
        }
        if let Some(h) = &self.https {
            v.push(("HTTPS_PROXY".into(), h.clone()));
            v.push(("https_proxy".into(), h.clone()));
        }
        v.push(("NO_PROXY".into(), self.no_proxy.clone()));
        v.push(("no_proxy".into(), self.no_proxy.clone()));
        v
    }

    /// A systemd drop-in setting the proxy for `unit`.
    pub fn dropin(&self, unit: &str) -> String {
        let mut s = format!(
            "# Written by kprov (spec.proxy): {unit} reaches registries through the proxy.\n[Service]\n"
        );
        for (k, v) in self.vars() {
            s.push_str(&format!("Environment=\"{k}={v}\"\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {

    /// Credentials in a mirror URL are refused and never echoed (Kubespray's
    /// `docker_registry_mirrors` may carry them).
    #[test]
    fn credentials_in_a_mirror_url_are_refused_unshown() {
        for url in [
            "https://user:s3cret@mirror.example.com",
            "http://user:s3cret@mirror.example.com:5000/v2",
            "user:s3cret@mirror.example.com",
        ] {
            let e = check_endpoint(url).unwrap_err();
            assert!(!e.contains("s3cret"), "{e}");
            assert!(e.contains("registry-credentials"), "{e}");
        }
        assert!(check_endpoint("https://mirror.example.com:5000/v2").is_ok());
    }

    use super::*;
    use crate::spec::{Proxy, RegistryCredential};

    const PASSWORD: &str = "s3cret-Passw0rd";

    fn spec(yaml: &str) -> ClusterSpec {
        let text = format!(
            "cloudProvider: metal\nkubernetesVersion: 1.35.1\nnetworking:\n  podCIDR: 10.244.0.0/16\n  serviceCIDR: 10.96.0.0/12\n{yaml}"
        );
        serde_saphyr::from_str(&text).unwrap()
    }

    fn credentials() -> RegistryCredentials {
        let mut c = RegistryCredentials::default();
        c.0.insert(
            "mirror.example.com:5000".into(),
            RegistryCredential {
                username: "puller".into(),
                password: PASSWORD.into(),
            },
        );
        c
    }

    /// The files as text, with the Authorization token replaced by the credential's digest:
    /// goldens never hold a credential.
    fn shown(files: &[NodeFile], creds: &RegistryCredentials) -> String {
        let mut out = String::new();
        for f in files {
            let mut text = String::from_utf8_lossy(&f.content).to_string();
            for c in creds.0.values() {
                let token = base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", c.username, c.password));
                text = text.replace(&token, &c.digest());
            }
            out.push_str(&format!("==> {} ({:o})\n{text}", f.path, f.mode));
        }
        out
    }

    #[test]
    fn golden_hosts_toml() {
        let dir = crate::test_files::tree(&[(
            "ca.pem",
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )]);
        let ca = dir.path().join("ca.pem");
        let mut s = spec(&format!(
            "containerd:\n  registries:\n  - name: docker.io\n    mirrors:\n    - endpoint: https://mirror.example.com:5000\n      caFile: {}\n    - endpoint: https://cache.example.com/v2/dockerhub\n      capabilities: [pull]\n      skipVerify: true\n      overridePath: true\n  - name: registry.k8s.io\n    fallback: false\n    imageRepository: mirror.example.com:5000/k8s\n    mirrors:\n    - endpoint: https://mirror.example.com:5000\n",
            ca.display()
        ));
        s.containerd.as_mut().unwrap().credentials = credentials();
        let files = registry_files(&s).unwrap();
        let creds = credentials();
        let text = shown(&files, &creds);
        // The golden shows where the credential goes by its digest, never the password or
        // the header's token.
        let token = base64::engine::general_purpose::STANDARD.encode(format!("puller:{PASSWORD}"));
        let raw: String = files
            .iter()
            .map(|f| String::from_utf8_lossy(&f.content).to_string())
            .collect();
        assert!(raw.contains(&format!("Authorization = [\"Basic {token}\"]")));
        assert!(!text.contains(PASSWORD) && !text.contains(&token));
        assert!(text.contains(&creds.0["mirror.example.com:5000"].digest()));
        let hosts = files
            .iter()
            .find(|f| f.path == "/etc/containerd/certs.d/docker.io/hosts.toml")
            .unwrap();
        assert_eq!(hosts.mode, 0o600, "the file holds basic auth");
        // containerd's own parser is the real judge (tests/it); here the TOML must parse.
        insta::assert_snapshot!("hosts_toml", text);
        assert_eq!(
            image_repository(&s).unwrap().as_deref(),
            Some("mirror.example.com:5000/k8s")
        );
    }

    #[test]
    fn registry_errors_name_the_field() {
        let cases = [
            (
                "  - name: docker.io\n    mirrors:\n    - endpoint: ftp://x\n",
                "spec.containerd.registries[0].mirrors[0].endpoint",
                "not an http:// or https:// URL",
            ),
            (
                "  - name: docker.io\n    mirrors:\n    - endpoint: https://x.example\n      capabilities: [pull, fly]\n",
                "spec.containerd.registries[0].mirrors[0].capabilities",
                "\"fly\" is not a containerd capability",
            ),
            (
                "  - name: docker.io\n    mirrors:\n    - endpoint: https://a.example\n  - name: docker.io\n    mirrors:\n    - endpoint: https://b.example\n",
                "spec.containerd.registries[1].name",
                "docker.io is also spec.containerd.registries[0]",
            ),
            (
                "  - name: docker.io\n    imageRepository: a.example/x\n    mirrors:\n    - endpoint: https://a.example\n",
                "spec.containerd.registries[0].imageRepository",
                "only registry.k8s.io",
            ),
            (
                "  - name: \"evil/../x\"\n    mirrors:\n    - endpoint: https://a.example\n",
                "spec.containerd.registries[0].name",
                "is not a registry name",
            ),
            (
                "  - name: quay.io\n    mirrors:\n    - endpoint: https://a.example\n      clientCertFile: /c.pem\n",
                "spec.containerd.registries[0].mirrors[0]",
                "go together",
            ),
            (
                "  - name: quay.io\n    mirrors:\n    - endpoint: \"https://a.example/\\\"]\\n[x\"\n",
                "spec.containerd.registries[0].mirrors[0].endpoint",
                "the path may hold only",
            ),
        ];
        for (yaml, field, says) in cases {
            let s = spec(&format!("containerd:\n  registries:\n{yaml}"));
            let e = check_spec(&s).unwrap_err();
            assert_eq!(e.field, field, "{yaml}: {e}");
            assert!(e.message.contains(says), "{yaml}: {e}");
        }
        // A CA file that is not there is named at render time with its path.
        let s = spec(
            "containerd:\n  registries:\n  - name: quay.io\n    mirrors:\n    - endpoint: https://a.example\n      caFile: /nonexistent/ca.pem\n",
        );
        assert!(check_spec(&s).is_ok());
        let e = registry_files(&s).unwrap_err();
        assert_eq!(e.field, "spec.containerd.registries[0].mirrors[0].caFile");
        assert!(
            e.message.contains("/nonexistent/ca.pem: cannot read"),
            "{e}"
        );
    }

    #[test]
    fn golden_proxy_dropin_and_no_proxy() {
        let mut s = spec("");
        s.proxy = Some(Proxy {
            http: Some("http://proxy.example.com:3128".into()),
            https: Some("http://proxy.example.com:3128".into()),
            no_proxy: vec![".corp.example".into(), "10.0.0.0/8,registry.corp".into()],
        });
        let p = proxy_env(
            &s,
            &["198.18.0.2".into(), "198.18.0.3".into()],
            "api.internal.demo",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            p.no_proxy,
            ".corp.example,10.0.0.0/8,registry.corp,198.18.0.2,198.18.0.3,10.244.0.0/16,\
             10.96.0.0/12,api.internal.demo,localhost,127.0.0.1,.svc,.cluster.local"
        );
        insta::assert_snapshot!("proxy_dropin", p.dropin("containerd"));
        // No proxy: nothing to write.
        assert_eq!(proxy_env(&spec(""), &[], "x").unwrap(), None);
        // A value that could end its systemd string is refused, naming the field.
        s.proxy.as_mut().unwrap().no_proxy = vec!["a\" b".into()];
        let e = proxy_env(&s, &[], "x").unwrap_err();
        assert_eq!(e.field, "spec.proxy.noProxy[0]");
        s.proxy.as_mut().unwrap().no_proxy = vec![];
        s.proxy.as_mut().unwrap().http = Some("proxy:3128".into());
        let e = proxy_env(&s, &[], "x").unwrap_err();
        assert_eq!(e.field, "spec.proxy.http");
    }

    #[test]
    fn credentials_never_print() {
        let c = &credentials().0["mirror.example.com:5000"];
        let debug = format!("{c:?} {:?}", credentials());
        assert!(!debug.contains(PASSWORD), "{debug}");
        assert!(debug.contains(&c.digest()));
    }
}
