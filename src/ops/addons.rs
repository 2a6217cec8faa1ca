//! Add-on deployment of a resolved cluster: the preview (server-side dry run) or the apply
//! (server-side apply, then waiting for the rollouts), through the cluster's API client from
//! stored credentials ([`super::credentials::kube_client`]). `update addons` and
//! `update cluster --yes` (metal and AWS) call [`deploy`]; the CLI prints the outcome.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::addons::validate::{self, ValidationResult};
use crate::addons::{self, Change, DeployOptions, ObjectDiff};
use crate::kube::{Kube, Poll};
use crate::spec::ResolvedCluster;
use crate::state::StateStore;

/// How to deploy.
#[derive(Debug, Clone, Default)]
pub(crate) struct AddonOptions {
    /// Apply (`--yes`); otherwise a dry run.
    pub apply: bool,
    /// `--kubeconfig FILE` instead of the stored admin credentials.
    pub kubeconfig: Option<PathBuf>,
    pub force_conflicts: bool,
    /// How long an apply waits for the rollouts.
    pub wait: Duration,
    pub ssh_tunnel: bool,
}

/// What [`deploy`] did.
#[derive(Debug)]
pub(crate) struct AddonReport {
    /// Per manifest: created, changed, unchanged (a preview: what would be).
    pub diffs: Vec<ObjectDiff>,
    pub applied: bool,
    /// How the API was reached when not directly (an SSH tunnel).
    pub route: Option<String>,
}

impl AddonReport {
    /// Whether a preview found changes to apply.
    pub(crate) fn pending(&self) -> bool {
        !self.applied && self.diffs.iter().any(|d| d.change != Change::Unchanged)
    }
}

/// Previews or applies the add-ons of `cluster` (CCM of its provider, CNI).
pub(crate) async fn deploy(
    store: &Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    o: &AddonOptions,
) -> anyhow::Result<AddonReport> {
    let (kube, guard) = super::credentials::kube_client(
        store,
        &cluster.completed,
        o.kubeconfig.as_deref(),
        o.ssh_tunnel,
    )
    .await?;
    let route = guard.route().map(str::to_string);
    let report = deploy_with(&kube, route, cluster, o).await;
    drop(guard);
    report
}

/// [`deploy`] through a client the caller opened (`update cluster --yes` writes kube-system's
/// node configuration through the same one: one client, one tunnel, per run).
pub(crate) async fn deploy_with(
    kube: &Kube,
    route: Option<String>,
    cluster: &ResolvedCluster,
    o: &AddonOptions,
) -> anyhow::Result<AddonReport> {
    let manifests = addons::render_addons(&cluster.completed)?;
    if !o.apply {
        let diffs = addons::preview_addons(kube, &manifests, o.force_conflicts).await?;
        return Ok(AddonReport {
            diffs,
            applied: false,
            route,
        });
    }
    let poll = Poll {
        timeout: o.wait,
        interval: Duration::from_secs(2),
    };
    let diffs = addons::deploy_addons(
        kube,
        &cluster.completed,
        DeployOptions {
            force: o.force_conflicts,
            wait: Some(poll),
        },
    )
    .await?;
    Ok(AddonReport {
        diffs,
        applied: true,
        route,
    })
}

/// `get addons NAME`: the manifests kprov applies to `cluster`, as it applies them.
pub(crate) fn manifests(cluster: &ResolvedCluster) -> anyhow::Result<Vec<addons::Manifest>> {
    Ok(addons::render_addons(&cluster.completed)?)
}

/// How `validate cluster` reaches and waits for the cluster.
#[derive(Debug, Clone, Default)]
pub(crate) struct ValidateOptions {
    /// Poll until valid, at most this long (`--wait`); one check when `None`.
    pub wait: Option<Duration>,
    /// `--kubeconfig FILE` instead of the stored admin credentials.
    pub kubeconfig: Option<PathBuf>,
    pub ssh_tunnel: bool,
}

/// `validate cluster`'s API checks (the certificates are
/// [`super::certificates::check_for_validate`]): the nodes and add-ons the spec expects,
/// through the cluster's API client from stored credentials. `route` is told as soon as the
/// client is made (before a `--wait` polls).
pub(crate) async fn validate(
    store: &Arc<dyn StateStore>,
    cluster: &ResolvedCluster,
    o: &ValidateOptions,
    route: &mut dyn FnMut(&str),
) -> anyhow::Result<ValidationResult> {
    let (kube, guard) = super::credentials::kube_client(
        store,
        &cluster.completed,
        o.kubeconfig.as_deref(),
        o.ssh_tunnel,
    )
    .await?;
    if let Some(r) = guard.route() {
        route(r);
    }
    let expect = validate::Expectations::from_spec(&cluster.completed, &cluster.completed_groups)?;
    Ok(match o.wait {
        Some(w) => {
            validate::validate_until(
                &kube,
                &cluster.completed,
                &expect,
                Poll {
                    timeout: w,
                    interval: Duration::from_secs(5),
                },
            )
            .await?
        }
        None => validate::validate_cluster(&kube, &cluster.completed, &expect).await?,
    })
}
