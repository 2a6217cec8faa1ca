//! `get addons`, `update addons` and `validate cluster`: the add-on manifests kprov applies
//! and the health of a running cluster.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::anyhow;

use super::commands::{ADMIN_KUBECONFIG_SECRET, Ctx};
use super::exit;
use crate::addons::{self, DeployOptions};
use crate::kube::{Kube, Poll};
use crate::output::Format;
use crate::spec::{Cluster, InstanceGroup};
use crate::state::layout::ClusterKeys;

/// Parses `90s`, `5m`, `1h30m` (Go-style durations, as kops and kubectl take them).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let mut total = 0u64;
    let mut num = String::new();
    let mut seen_unit = false;
    let mut chars = s.trim().chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let unit = if c == 'm' && chars.peek() == Some(&'s') {
            chars.next();
            "ms"
        } else {
            match c {
                'h' => "h",
                'm' => "m",
                's' => "s",
                _ => return Err(format!("{s:?} is not a duration like 90s, 5m or 1h30m")),
            }
        };
        let n: u64 = num
            .parse()
            .map_err(|_| format!("{s:?} is not a duration like 90s, 5m or 1h30m"))?;
        num.clear();
        seen_unit = true;
        total = total.saturating_add(match unit {
            "h" => n * 3_600_000,
            "m" => n * 60_000,
            "s" => n * 1000,
            _ => n,
        });
    }
    if !num.is_empty() || !seen_unit {
        return Err(format!(
            "{s:?} is not a duration like 90s, 5m or 1h30m (a unit is required)"
        ));
    }
    Ok(Duration::from_millis(total))
}

/// The resolved cluster from the store.
pub(super) async fn resolved(
    ctx: &Ctx,
    name: &str,
) -> anyhow::Result<(Cluster, Vec<InstanceGroup>)> {
    let repo = ctx.repo().await?;
    let stored = repo.get(name).await?;
    Ok(stored.resolve(&repo.location())?)
}

/// What keeps a cluster client working: its private kubeconfig file and, when the API is
/// reached through SSH, the connection carrying the tunnel.
pub(super) struct ClientGuard {
    _dir: Option<tempfile::TempDir>,
    _tunnel: Option<crate::ssh::SshFleet>,
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

/// A client for the cluster: `--kubeconfig FILE` as given, else the admin credentials kprov
/// stored when it provisioned the cluster (written to a private temporary file), through an
/// SSH tunnel to a control plane when the hosts sit behind a bastion.
pub(super) async fn cluster_client(
    ctx: &Ctx,
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
            },
        ));
    }
    let name = cluster.name();
    let repo = ctx.repo().await?;
    let key = ClusterKeys::new(name)?.secret(ADMIN_KUBECONFIG_SECRET)?;
    let admin = repo
        .store()
        .get(&key)
        .await?
        .ok_or_else(|| anyhow!("no credentials for cluster {name} in the state store: provision it with `kprov update cluster {name} --yes`, or pass --kubeconfig FILE"))?;
    let admin = crate::kubeconfig::trusted_admin(&admin.data, &key)?;
    let server = cluster
        .spec
        .api
        .as_ref()
        .and_then(|a| a.public_name.as_ref())
        .map(|n| format!("https://{n}"));
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
        repo.store().clone(),
        crate::ssh::SshOptions::default(),
        std::sync::Arc::new(crate::ssh::NoProgress),
    )?;
    let local = fleet.forward(&cp.name, &remote_host, remote_port).await?;
    ctx.printer.debug(&format!(
        "reaching the API of {name} through {local} → {} → {remote_host}:{remote_port}",
        cp.name
    ));
    let kube = Kube::from_kubeconfig_through(&path, Some(name), &local.to_string()).await?;
    Ok((
        kube,
        ClientGuard {
            _dir: Some(dir),
            _tunnel: Some(fleet),
        },
    ))
}

pub async fn get_addons(ctx: &Ctx, name: &str) -> anyhow::Result<i32> {
    let (cluster, _) = resolved(ctx, name).await?;
    let manifests = addons::render_addons(&cluster)?;
    match ctx.printer.format() {
        Format::Json => ctx.printer.data(&serde_json::to_string_pretty(&manifests)?),
        // The manifests are the review artefact: print them exactly as they are applied.
        Format::Yaml | Format::Table => ctx.printer.data(&addons::manifests_yaml(&manifests)),
    }
    Ok(exit::OK)
}

pub struct UpdateAddonsArgs<'a> {
    pub name: &'a str,
    pub yes: bool,
    pub kubeconfig: Option<&'a Path>,
    pub force_conflicts: bool,
    pub wait: Duration,
    pub exit_code: bool,
    pub ssh_tunnel: bool,
}

pub async fn update_addons(ctx: &Ctx, a: &UpdateAddonsArgs<'_>) -> anyhow::Result<i32> {
    let (cluster, _) = resolved(ctx, a.name).await?;
    deploy(ctx, &cluster, a).await
}

/// Previews (dry run) or applies the add-ons of an already resolved cluster; `update cluster`
/// calls this after provisioning.
pub(super) async fn deploy(
    ctx: &Ctx,
    cluster: &Cluster,
    a: &UpdateAddonsArgs<'_>,
) -> anyhow::Result<i32> {
    let manifests = addons::render_addons(cluster)?;
    let (kube, _tmp) = cluster_client(ctx, cluster, a.kubeconfig, a.ssh_tunnel).await?;
    if !a.yes {
        let diffs = addons::preview_addons(&kube, &manifests, a.force_conflicts).await?;
        ctx.printer.data(&addons::preview_text(&diffs));
        let pending = diffs.iter().any(|d| d.change != addons::Change::Unchanged);
        if pending {
            ctx.printer.status(&format!(
                "Must specify --yes to apply these add-on changes to {}.",
                cluster.name()
            ));
        }
        return Ok(if pending && a.exit_code {
            exit::CHANGES_PENDING
        } else {
            exit::OK
        });
    }
    let poll = Poll {
        timeout: a.wait,
        interval: Duration::from_secs(2),
    };
    let diffs = addons::deploy_addons(
        &kube,
        cluster,
        DeployOptions {
            force: a.force_conflicts,
            wait: Some(poll),
        },
    )
    .await?;
    ctx.printer.data(&addons::preview_text(&diffs));
    ctx.printer.success(&format!(
        "Add-ons of {}: {}",
        cluster.name(),
        addons::summary(&diffs)
    ));
    Ok(exit::OK)
}

pub async fn validate(
    ctx: &Ctx,
    name: &str,
    wait: Option<Duration>,
    kubeconfig: Option<&Path>,
    ssh_tunnel: bool,
) -> anyhow::Result<i32> {
    let (cluster, groups) = resolved(ctx, name).await?;
    // Over SSH, before the API: an expired certificate is often why the API fails.
    super::certificates::warn_expiring(ctx, &cluster, &groups).await;
    let (kube, _tmp) = cluster_client(ctx, &cluster, kubeconfig, ssh_tunnel).await?;
    let expect = addons::validate::Expectations::from_spec(&cluster, &groups)?;
    let result = match wait {
        Some(w) => {
            addons::validate::validate_until(
                &kube,
                &cluster,
                &expect,
                Poll {
                    timeout: w,
                    interval: Duration::from_secs(5),
                },
            )
            .await?
        }
        None => addons::validate::validate_cluster(&kube, &cluster, &expect).await?,
    };
    match ctx.printer.format() {
        Format::Json => ctx.printer.data(&serde_json::to_string_pretty(&result)?),
        Format::Yaml => ctx.printer.data(&serde_saphyr::to_string(&result)?),
        Format::Table => ctx.printer.data(&result.render_text()),
    }
    if result.ok {
        ctx.printer
            .success(&format!("Your cluster {name} is ready."));
        Ok(exit::OK)
    } else {
        ctx.printer
            .error(&format!("cluster {name} did not pass validation"));
        Ok(exit::ERROR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("five minutes").is_err());
        assert!(parse_duration("").is_err());
    }
}
