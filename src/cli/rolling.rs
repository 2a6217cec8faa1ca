//! `rolling-update cluster` and `get instances`: the preview of a roll (kops's table per
//! group, then per node: replace, re-provision in place or leave alone, and why), from each
//! node's provisioning record compared with the spec.
//!
//! Caveat: on metal executing a roll (`--yes`) is refused for now (the in-place re-provision
//! with `kubeadm upgrade` is not wired); on AWS `--yes` replaces workers (`cli::rolling_aws`)
//! and refuses control planes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::commands::Ctx;
use super::exit;
use crate::cloud::aws::instances::SshReach;
use crate::kube::Kube;
use crate::nodes::roll::{self, Platform, RollAction, RollPlan, Selection};
use crate::nodes::{Inventory, TargetSource};
use crate::ops::nodes::NodeOptions;
use crate::ops::rolling as ops;
use crate::ops::rolling_aws;
use crate::output::{Format, Table};
use crate::spec::{CloudProvider, Cluster, InstanceGroup};

#[derive(Debug, Args, Clone)]
pub struct RollingUpdateClusterArgs {
    pub name: String,
    /// Roll (without it: preview only)
    #[arg(long, short)]
    pub yes: bool,
    /// Exit 2 when something would roll
    #[arg(long)]
    pub exit_code: bool,
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// Only these instance groups (repeat, or comma-separated)
    #[arg(long = "instance-group", value_delimiter = ',', value_name = "GROUP")]
    pub instance_groups: Vec<String>,
    /// Only groups of these roles: Bastion, ControlPlane (or Master), Node
    #[arg(
        long = "instance-group-roles",
        value_delimiter = ',',
        value_name = "ROLE"
    )]
    pub instance_group_roles: Vec<String>,
    /// Roll every selected node, up to date or not
    #[arg(long)]
    pub force: bool,
    /// Give up on a node's drain after this long; the roll stops, the node stays cordoned
    #[arg(long, value_parser = super::addons::parse_duration, default_value = "15m")]
    pub drain_timeout: Duration,
    /// How long the cluster may take to pass validation after each batch
    #[arg(long, value_parser = super::addons::parse_duration, default_value = "15m")]
    pub validation_timeout: Duration,
    /// Consecutive validation passes needed after each batch
    #[arg(long, default_value_t = 2)]
    pub validate_count: u32,
    /// Replace without draining or validating (for a cluster whose API is down)
    #[arg(long = "cloudonly", visible_alias = "cloud-only")]
    pub cloud_only: bool,
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    #[arg(long, default_value_t = 20)]
    pub concurrency: usize,
    /// AWS: reach instances at their private addresses (as `update cluster --ssh-private-address`)
    #[arg(long)]
    pub ssh_private_address: bool,
}

/// The cluster's API from stored credentials. One function, so moving the client into
/// `ops` (branch aws11) changes one line here.
/// The guard keeps what the client needs (a temporary kubeconfig, an SSH tunnel) alive.
async fn api(
    ctx: &Ctx,
    cluster: &Cluster,
    kubeconfig: Option<&Path>,
) -> anyhow::Result<(Kube, crate::ops::credentials::ClientGuard)> {
    super::addons::cluster_client(ctx, cluster, kubeconfig, false).await
}

/// Ready per node name, or why it is unknown.
async fn readiness(
    ctx: &Ctx,
    cluster: &Cluster,
    kubeconfig: Option<&Path>,
) -> Result<BTreeMap<String, bool>, String> {
    let ask = async {
        let (kube, _guard) = api(ctx, cluster, kubeconfig).await?;
        let nodes = kube.list_nodes().await?;
        Ok::<_, anyhow::Error>(nodes.into_iter().map(|n| (n.name, n.ready)).collect())
    };
    match tokio::time::timeout(Duration::from_secs(30), ask).await {
        Ok(Ok(m)) => Ok(m),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(_) => Err("the API did not answer within 30s".into()),
    }
}

struct Observation {
    plan: RollPlan,
    problems: Vec<String>,
    ready_error: Option<String>,
}

async fn observe(
    ctx: &Ctx,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    selection: &Selection,
    kubeconfig: Option<&Path>,
    concurrency: usize,
    ssh_private_address: bool,
) -> anyhow::Result<Observation> {
    let repo = ctx.repo().await?;
    let options = NodeOptions {
        concurrency,
        ..NodeOptions::default()
    };
    let mut problems = Vec::new();
    let (observed, platform) = match cluster.spec.cloud_provider {
        CloudProvider::Metal => {
            let targets = Inventory {
                hosts: cluster.spec.hosts.clone(),
            }
            .targets()
            .await?;
            let observed = ops::observe(repo.store().clone(), cluster, &targets, &options).await?;
            (observed, Platform::Metal)
        }
        CloudProvider::Aws => {
            let reach = SshReach::of(cluster, ssh_private_address);
            let o = rolling_aws::observe(repo.store(), cluster, groups, reach, concurrency).await?;
            problems.extend(
                o.strays.iter().map(|s| {
                    format!("{s}: owned by the cluster but in none of its instance groups")
                }),
            );
            (o.observed, Platform::Aws)
        }
    };
    let (ready, ready_error) = match readiness(ctx, cluster, kubeconfig).await {
        Ok(r) => (Some(r), None),
        Err(e) => (None, Some(e)),
    };
    let (group_inputs, nodes, found) = ops::inputs(groups, &observed, ready.as_ref());
    problems.extend(found);
    let version = cluster
        .spec
        .kubernetes_version
        .clone()
        .unwrap_or_else(|| crate::spec::versions::DEFAULT_KUBERNETES_VERSION.to_string());
    let plan = roll::plan(
        cluster.name(),
        platform,
        crate::provision::assets::normalize_version(&version),
        &group_inputs,
        &nodes,
        selection,
    );
    Ok(Observation {
        plan,
        problems,
        ready_error,
    })
}

fn groups_table(plan: &RollPlan) -> Table {
    let mut t = Table::new([
        "NAME",
        "STATUS",
        "NEEDUPDATE",
        "READY",
        "MIN",
        "TARGET",
        "MAX",
        "NODES",
    ]);
    for g in &plan.groups {
        t.row([
            g.name.clone(),
            g.status().to_string(),
            g.need_update().to_string(),
            g.ready().to_string(),
            g.min.to_string(),
            g.target.to_string(),
            g.max.to_string(),
            g.nodes.len().to_string(),
        ]);
    }
    t
}

fn nodes_table(plan: &RollPlan) -> Table {
    let mut t = Table::new(["NODE", "GROUP", "ACTION", "WHY"]);
    for g in &plan.groups {
        for n in &g.nodes {
            let mut action = n.action.as_str().to_string();
            if let Some(u) = n.upgrade {
                action.push_str(match u {
                    roll::Upgrade::Apply => " (kubeadm upgrade apply)",
                    roll::Upgrade::Node => " (kubeadm upgrade node)",
                });
            }
            let why = if n.reasons.is_empty() {
                "up to date".to_string()
            } else {
                n.reasons.join("; ")
            };
            t.row([n.node_name.clone(), g.name.clone(), action, why]);
        }
    }
    t
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PreviewJson<'a> {
    #[serde(flatten)]
    plan: &'a RollPlan,
    problems: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_unknown: Option<&'a str>,
}

pub async fn cluster(ctx: &Ctx, a: &RollingUpdateClusterArgs) -> anyhow::Result<i32> {
    let (cluster, groups) = super::addons::resolved(ctx, &a.name).await?;
    let name = cluster.name();
    let selection = Selection {
        groups: a.instance_groups.clone(),
        roles: roll::parse_roles(&a.instance_group_roles).map_err(anyhow::Error::msg)?,
        force: a.force,
    };
    let o = observe(
        ctx,
        &cluster,
        &groups,
        &selection,
        a.kubeconfig.as_deref(),
        a.concurrency,
        a.ssh_private_address,
    )
    .await?;
    let plan = &o.plan;
    match ctx.printer.format() {
        Format::Json => ctx
            .printer
            .data(&serde_json::to_string_pretty(&PreviewJson {
                plan,
                problems: &o.problems,
                ready_unknown: o.ready_error.as_deref(),
            })?),
        Format::Yaml => ctx.printer.data(&serde_saphyr::to_string(plan)?),
        Format::Table => {
            ctx.printer.data(&groups_table(plan).render());
            ctx.printer.data("");
            ctx.printer.data(&nodes_table(plan).render());
        }
    }
    if let Some(e) = &o.ready_error {
        ctx.printer.warn(&format!(
            "READY is unknown: the cluster's API could not be asked: {e}"
        ));
    }
    if let Some(v) = &plan.version {
        ctx.printer.status(&format!(
            "Kubernetes {} -> {}: control planes first{}, then the kubelets.",
            v.from.join(", "),
            v.to,
            v.apply_on
                .as_deref()
                .map(|c| format!(" (`kubeadm upgrade apply` on {c})"))
                .unwrap_or_default()
        ));
    }
    let mut refusals = o.problems.clone();
    refusals.extend(plan.refusals.iter().cloned());
    if !refusals.is_empty() {
        for r in &refusals {
            ctx.printer.error(r);
        }
        ctx.printer.error(&format!(
            "the roll of {name} cannot start as planned ({} problems above); nothing was changed",
            refusals.len()
        ));
        return Ok(exit::ERROR);
    }
    let to_roll = plan.to_roll();
    if to_roll == 0 {
        ctx.printer.success(&format!(
            "No rolling update needed: every node of {name} is up to date."
        ));
        return Ok(exit::OK);
    }
    if !a.yes {
        ctx.printer.status(&format!(
            "{to_roll} nodes would roll. Must specify --yes to rolling-update."
        ));
        return Ok(if a.exit_code {
            exit::CHANGES_PENDING
        } else {
            exit::OK
        });
    }
    if a.cloud_only {
        ctx.printer.warn(
            "--cloudonly: nodes would be replaced WITHOUT draining and WITHOUT validating the cluster",
        );
    }
    if plan.platform == Platform::Aws {
        return super::rolling_aws::run_roll(ctx, &cluster, &groups, a, plan).await;
    }
    // Not pretending: the plan above is right, the machine side of the roll is not built.
    ctx.printer.error(&format!(
        "rolling-update --yes is not implemented yet in this kprov: re-provisioning {} in place \
         (cordon, drain, kubeadm upgrade, uncordon) is not wired; nothing was changed",
        plan.order()
            .iter()
            .filter(|n| n.action != RollAction::Leave)
            .map(|n| n.node_name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(exit::ERROR)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InstanceRow {
    group: String,
    node: String,
    target: String,
    status: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    reasons: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ready: Option<bool>,
}

/// `get instances NAME`: every host with its group, status and Ready.
pub async fn get_instances(
    ctx: &Ctx,
    name: &str,
    kubeconfig: Option<&Path>,
) -> anyhow::Result<i32> {
    let (cluster, groups) = super::addons::resolved(ctx, name).await?;
    let o = observe(
        ctx,
        &cluster,
        &groups,
        &Selection::default(),
        kubeconfig,
        20,
        false,
    )
    .await?;
    let mut rows = Vec::new();
    for g in &o.plan.groups {
        for n in &g.nodes {
            rows.push(InstanceRow {
                group: g.name.clone(),
                node: n.node_name.clone(),
                target: n.target.clone(),
                status: if n.needs_update {
                    "needs update".into()
                } else {
                    "up to date".into()
                },
                reasons: n.reasons.clone(),
                ready: n.ready,
            });
        }
    }
    match ctx.printer.format() {
        Format::Json => ctx.printer.data(&serde_json::to_string_pretty(&rows)?),
        Format::Yaml => ctx.printer.data(&serde_saphyr::to_string(&rows)?),
        Format::Table => {
            let mut t = Table::new(["ID", "NODE-NAME", "GROUP", "STATUS", "READY"]);
            for r in &rows {
                let status = if r.reasons.is_empty() {
                    r.status.clone()
                } else {
                    format!("{}: {}", r.status, r.reasons.join("; "))
                };
                let ready = match r.ready {
                    Some(true) => "True",
                    Some(false) => "False",
                    None => "?",
                };
                t.row([
                    r.target.clone(),
                    r.node.clone(),
                    r.group.clone(),
                    status,
                    ready.to_string(),
                ]);
            }
            ctx.printer.data(&t.render());
        }
    }
    if let Some(e) = &o.ready_error {
        ctx.printer.warn(&format!(
            "READY is unknown: the cluster's API could not be asked: {e}"
        ));
    }
    for p in &o.problems {
        ctx.printer.error(p);
    }
    Ok(if o.problems.is_empty() {
        exit::OK
    } else {
        exit::ERROR
    })
}
