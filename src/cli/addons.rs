//! `get addons`, `update addons` and `validate cluster`: the add-on manifests kprov applies
//! and the health of a running cluster. Thin commands: the deployment is
//! `ops::addons::deploy`, the API client `ops::credentials::kube_client`.

use std::path::Path;
use std::time::Duration;

use super::ctx::Ctx;
use super::exit;
use crate::ops::addons::{self as ops_addons, AddonOptions, ValidateOptions};
use crate::spec::ResolvedCluster;
use crate::views::addons as view;

/// Parses `90s`, `5m`, `1h30m` (Go-style durations, as kops and kubectl take them).
pub(super) fn parse_duration(s: &str) -> Result<Duration, String> {
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

/// The cluster from the store, resolved once for the command.
pub(super) async fn resolved(ctx: &Ctx, name: &str) -> anyhow::Result<ResolvedCluster> {
    ctx.session().await?.resolve(name).await
}

pub(super) async fn get_addons(ctx: &Ctx, name: &str) -> anyhow::Result<i32> {
    let cluster = resolved(ctx, name).await?;
    let manifests = ops_addons::manifests(&cluster)?;
    view::manifests(&ctx.printer, &manifests)?;
    Ok(exit::OK)
}

pub(super) struct UpdateAddonsArgs<'a> {
    pub(crate) name: &'a str,
    pub(crate) yes: bool,
    pub(crate) kubeconfig: Option<&'a Path>,
    pub(crate) force_conflicts: bool,
    pub(crate) wait: Duration,
    pub(crate) exit_code: bool,
    pub(crate) ssh_tunnel: bool,
}

pub(super) async fn update_addons(ctx: &Ctx, a: &UpdateAddonsArgs<'_>) -> anyhow::Result<i32> {
    let cluster = resolved(ctx, a.name).await?;
    deploy(ctx, &cluster, a).await
}

/// Previews (dry run) or applies the add-ons of an already resolved cluster
/// ([`crate::ops::addons::deploy`]); `update cluster` calls this after provisioning.
pub(super) async fn deploy(
    ctx: &Ctx,
    cluster: &ResolvedCluster,
    a: &UpdateAddonsArgs<'_>,
) -> anyhow::Result<i32> {
    let store = ctx.session().await?.store();
    let options = AddonOptions {
        apply: a.yes,
        kubeconfig: a.kubeconfig.map(Path::to_path_buf),
        force_conflicts: a.force_conflicts,
        wait: a.wait,
        ssh_tunnel: a.ssh_tunnel,
    };
    let report = ops_addons::deploy(store, cluster, &options).await?;
    Ok(print_report(ctx, &cluster.name, &report, a.exit_code))
}

/// The add-ons' preview or what was applied ([`view::report`]); the exit code (`exit_code`: 2
/// for a preview with changes).
pub(super) fn print_report(
    ctx: &Ctx,
    cluster: &str,
    report: &ops_addons::AddonReport,
    exit_code: bool,
) -> i32 {
    exit::of_preview(view::report(&ctx.printer, cluster, report), exit_code)
}

pub(super) async fn validate(
    ctx: &Ctx,
    name: &str,
    wait: Option<Duration>,
    kubeconfig: Option<&Path>,
    ssh_tunnel: bool,
) -> anyhow::Result<i32> {
    let cluster = resolved(ctx, name).await?;
    // Over SSH, before the API: an expired certificate is often why the API fails.
    super::certificates::warn_expiring(ctx, &cluster).await?;
    let options = ValidateOptions {
        wait,
        kubeconfig: kubeconfig.map(Path::to_path_buf),
        ssh_tunnel,
    };
    let store = ctx.session().await?.store();
    let result = ops_addons::validate(store, &cluster, &options, &mut |route| {
        ctx.printer.debug(route)
    })
    .await?;
    Ok(if view::validated(&ctx.printer, name, &result)? {
        exit::OK
    } else {
        exit::ERROR
    })
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
