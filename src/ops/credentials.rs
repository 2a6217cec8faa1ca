//! The cluster's API client from stored credentials: the one place commands get a
//! Kubernetes client for a cluster kprov provisioned (add-ons, validate, and anything that
//! talks to the API: rolling updates, drains, certificates, etcd backups).
//!
//! [`kube_client`] uses `--kubeconfig FILE` when given, else the admin kubeconfig kprov
//! stored at `<cluster>/secrets/admin.conf` (read as untrusted data: the store is a trust
//! boundary, see `kubeconfig::trusted_admin`), written to a private temporary file, reached
//! through an SSH port forward to a control plane when the hosts sit behind a bastion
//! (metal) or when asked (`--ssh-tunnel`). The returned [`ClientGuard`] keeps the file and
//! the tunnel alive: drop it after the client.
//!
//! Caveat: the tunnel is for metal clusters (their hosts are in the spec); an AWS cluster's
//! API is reached through its load balancer.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::anyhow;

use crate::kube::Kube;
use crate::spec::Cluster;
use crate::state::StateStore;
use crate::state::layout::ClusterKeys;

pub(crate) use super::nodes::ADMIN_KUBECONFIG_SECRET;

/// What keeps a cluster client working: its private kubeconfig file and, when the API is
/// reached through SSH, the connection carrying the tunnel.
pub(crate) struct ClientGuard {
    _dir: Option<tempfile::TempDir>,
    _tunnel: Option<crate::ssh::SshFleet>,
    route: Option<String>,
}

impl ClientGuard {
    /// How the API is reached when it is not direct (`local → host → server`), for a debug
    /// line.
    pub(crate) fn route(&self) -> Option<&str> {
        self.route.as_deref()
    }
}

/// The control-plane host to tunnel through when the API is not reachable directly: metal
/// control planes that ssh itself only reaches through a bastion.
fn tunnel_host(cluster: &Cluster, forced: bool) -> Option<&crate::spec::Host> {
    let cp = cluster
        .spec
        .hosts
        .iter()
        .find(|h| h.roles.contains(&crate::spec::HostRole::ControlPlane))?;
    (forced || cp.bastion.is_some()).then_some(cp)
}

/// A client for the cluster: `explicit` (`--kubeconfig FILE`) as given, else the admin
/// credentials kprov stored when it provisioned the cluster (written to a private temporary
/// file), through an SSH tunnel to a control plane when the hosts sit behind a bastion or
/// `ssh_tunnel` asks for it.
pub(crate) async fn kube_client(
    store: &Arc<dyn StateStore>,
    cluster: &Cluster,
    explicit: Option<&Path>,
    ssh_tunnel: bool,
) -> anyhow::Result<(Kube, ClientGuard)> {
    if let Some(p) = explicit {
        return Ok((
            Kube::from_kubeconfig(p, None).await?,
            ClientGuard {
                _dir: None,
                _tunnel: None,
                route: None,
            },
        ));
    }
    let name = cluster.name();
    let key = ClusterKeys::new(name)?.secret(ADMIN_KUBECONFIG_SECRET)?;
    let admin = store
        .get(&key)
        .await?
        .ok_or_else(|| anyhow!("no credentials for cluster {name} in the state store: provision it with `kprov update cluster {name} --yes`, or pass --kubeconfig FILE"))?;
    let admin = crate::kubeconfig::trusted_admin(&admin.data, &key)?;
    // An AWS cluster's API record on its load balancer's listener port (the one truth of
    // that port: `instances::api_port`); other clusters keep the server kubeadm wrote.
    let server = crate::cloud::aws::instances::api_server_url(cluster);
    let dir = tempfile::Builder::new().prefix("kprov-kube-").tempdir()?;
    let path: PathBuf = dir.path().join("config");
    crate::kubeconfig::export(&path, &admin, name, server.as_deref())?;
    if ssh_tunnel && cluster.spec.hosts.is_empty() {
        anyhow::bail!(
            "--ssh-tunnel needs the cluster's hosts (cloudProvider metal); {name} has none"
        );
    }
    let Some(cp) = tunnel_host(cluster, ssh_tunnel) else {
        return Ok((
            Kube::from_kubeconfig(&path, Some(name)).await?,
            ClientGuard {
                _dir: Some(dir),
                _tunnel: None,
                route: None,
            },
        ));
    };
    // The kubeconfig's server as the control plane sees it; TLS still checks its name.
    let url: http::Uri = crate::kubeconfig::server(&admin)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("the stored admin kubeconfig of {name} has no usable server URL"))?;
    let (remote_host, remote_port) = (
        url.host().unwrap_or("127.0.0.1").to_string(),
        url.port_u16().unwrap_or(443),
    );
    let fleet = crate::ssh::SshFleet::for_cluster(
        cluster,
        store.clone(),
        crate::ssh::SshOptions::default(),
        Arc::new(crate::ssh::NoProgress),
    )?;
    let local = fleet.forward(&cp.name, &remote_host, remote_port).await?;
    let route = format!(
        "reaching the API of {name} through {local} → {} → {remote_host}:{remote_port}",
        cp.name
    );
    let kube = Kube::from_kubeconfig_through(&path, Some(name), &local.to_string()).await?;
    Ok((
        kube,
        ClientGuard {
            _dir: Some(dir),
            _tunnel: Some(fleet),
            route: Some(route),
        },
    ))
}

/// What `create registry-credentials` stored.
pub(crate) struct RegistryStored {
    /// The secret's name under the cluster's secrets.
    pub secret: String,
    /// The digest of what was stored (never the password).
    pub digest: String,
    /// Whether a mirror in `spec.containerd.registries` has this host (otherwise the
    /// credentials are kept but not used until one does).
    pub used: bool,
}

/// `create registry-credentials`: `host` and `username` checked (errors name their flag),
/// the cluster read, then the password (`password()`, read only then) stored in the
/// cluster's secrets.
pub(crate) async fn store_registry_credentials(
    repo: &crate::repo::Repo,
    name: &str,
    host: &str,
    username: &str,
    password: impl FnOnce() -> anyhow::Result<String>,
) -> anyhow::Result<RegistryStored> {
    use crate::output::untrusted;
    crate::spec::mirrors::check_registry_name(host).map_err(|e| anyhow!("--host: {e}"))?;
    if username.is_empty() || username.contains(':') || username.chars().any(char::is_control) {
        return Err(anyhow!(
            "--username: {} is not a registry user name (not empty, no ':' or control characters)",
            untrusted(username)
        ));
    }
    let stored = repo.get(name).await?;
    let password = password()?;
    if password.is_empty() {
        return Err(anyhow!(
            "no password on standard input (give it as the first line, e.g. `kprov create \
             registry-credentials {name} --host {host} --username {username} < FILE`)"
        ));
    }
    let used = stored
        .cluster
        .value
        .spec
        .containerd
        .iter()
        .flat_map(|c| c.registries.iter())
        .flat_map(|r| r.mirrors.iter())
        .any(|m| m.host() == Some(host));
    let cred = crate::spec::RegistryCredential {
        username: username.to_string(),
        password,
    };
    let digest = repo.put_registry_credentials(name, host, &cred).await?;
    Ok(RegistryStored {
        secret: crate::repo::registry_secret(host),
        digest,
        used,
    })
}

/// One object among a cluster's secrets, as `get secrets` lists it: never its bytes.
pub(crate) struct SecretEntry {
    /// "secret", "pki" or "sshpublickey".
    pub kind: &'static str,
    /// Its key below the cluster's `secrets/` or `pki/`; "admin" for the SSH key.
    pub name: String,
    pub bytes: usize,
    /// The sha256 of its bytes; for the SSH key its fingerprint.
    pub digest: String,
}

/// `get secrets NAME`: every object under the cluster's `secrets/` and `pki/` keys with the
/// sha256 of its bytes (to compare two stores, or notice a change), and the instances' SSH
/// public key by its fingerprint (as kops shows it).
pub(crate) async fn secrets(
    repo: &crate::repo::Repo,
    name: &str,
) -> anyhow::Result<Vec<SecretEntry>> {
    use sha2::{Digest, Sha256};
    // The cluster must exist: an empty listing must not hide a typo.
    let stored = repo.get(name).await?;
    let keys = ClusterKeys::new(name)?;
    let mut rows = Vec::new();
    for (kind, prefix) in [
        ("secret", keys.secrets_prefix()),
        ("pki", keys.pki_prefix()),
    ] {
        let mut listed = repo.store().list(&prefix).await?;
        listed.sort();
        for key in listed {
            let Some(obj) = repo.store().get(&key).await? else {
                continue;
            };
            let short = key
                .strip_prefix(&prefix)
                .unwrap_or(&key)
                .trim_start_matches('/')
                .to_string();
            rows.push(SecretEntry {
                kind,
                name: short,
                bytes: obj.data.len(),
                digest: hex::encode(Sha256::digest(&obj.data)),
            });
        }
    }
    let ssh_key = stored
        .cluster
        .value
        .spec
        .ssh_key
        .as_ref()
        .and_then(|k| k.public_key.as_deref());
    if let Some(k) = ssh_key {
        rows.push(SecretEntry {
            kind: "sshpublickey",
            name: "admin".into(),
            bytes: k.trim().len(),
            digest: super::sshkey::fingerprint(k)
                .unwrap_or_else(|| "not an OpenSSH public key".into()),
        });
    }
    Ok(rows)
}

/// `export kubeconfig`: the stored admin credentials merged into the kubeconfig kubectl's
/// rules choose (`explicit`, else `$KUBECONFIG`'s first file, else `~/.kube/config`), with the
/// context named after the cluster; returns the file written.
pub(crate) async fn export_kubeconfig(
    repo: &crate::repo::Repo,
    name: &str,
    explicit: Option<&Path>,
    env: Option<&str>,
    home: Option<&Path>,
) -> anyhow::Result<PathBuf> {
    let stored = repo.get(name).await?;
    let key = ClusterKeys::new(name)?.secret(ADMIN_KUBECONFIG_SECRET)?;
    let admin = repo
        .store()
        .get(&key)
        .await?
        .ok_or_else(|| anyhow!("cluster {name} has no admin credentials yet: provision it first with `kprov update cluster {name} --yes`"))?;
    let admin = crate::kubeconfig::trusted_admin(&admin.data, &key)?;
    let (cluster, _) =
        crate::spec::defaults::complete(&stored.cluster.value, &stored.group_values());
    // AWS clusters are reached through their API record on the load balancer's listener
    // port (`instances::api_port`); metal kubeconfigs already carry the control-plane
    // endpoint kubeadm was given.
    let server = crate::cloud::aws::instances::api_server_url(&cluster);
    let path = crate::kubeconfig::target_path(explicit, env, home, name);
    crate::kubeconfig::export(&path, &admin, name, server.as_deref())?;
    Ok(path)
}
