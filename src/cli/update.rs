//! `kprov update cluster NAME`: the preview, and with `--yes` the apply, of everything the
//! spec asks for: cloud resources (aws), nodes over SSH (metal), then the add-ons.

use anyhow::Context;

use super::commands::Ctx;
use super::{UpdateClusterArgs, exit};
use crate::cloud::aws::{AwsCloud, hostkeys};
use crate::cloud::engine::{self, ApplyOptions, RenderOptions};
use crate::output::Format;
use crate::spec::{CloudProvider, Cluster, InstanceGroup};

pub async fn cluster(ctx: &Ctx, a: &UpdateClusterArgs) -> anyhow::Result<i32> {
    let (cluster, groups) = super::addons::resolved(ctx, &a.name).await?;
    match cluster.spec.cloud_provider {
        CloudProvider::Aws => aws(ctx, &cluster, &groups, a).await,
        CloudProvider::Metal => super::metal::update(ctx, &cluster, &groups, a).await,
    }
}

/// SDK clients in the cluster's region; credentials and endpoint come from the usual chain
/// (environment, profiles, SSO, instance roles; `AWS_ENDPOINT_URL` for emulators).
pub(super) async fn aws_cloud(cluster: &Cluster) -> anyhow::Result<AwsCloud> {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(region) = &cluster.spec.region {
        loader = loader.region(aws_config::Region::new(region.clone()));
    }
    let sdk = loader.load().await;
    Ok(AwsCloud::new(&sdk, cluster.name(), &[]))
}

fn print_plan(ctx: &Ctx, plan: &engine::Plan, prune: bool) -> anyhow::Result<()> {
    match ctx.printer.format() {
        Format::Json => ctx.printer.data(&serde_json::to_string_pretty(plan)?),
        Format::Yaml => ctx.printer.data(&serde_saphyr::to_string(plan)?),
        Format::Table => ctx.printer.data(&engine::render_text(
            plan,
            RenderOptions {
                color: ctx.printer.color(),
                prune,
            },
        )),
    }
    Ok(())
}

async fn aws(
    ctx: &Ctx,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    let repo = ctx.repo().await?;
    let group_names: Vec<&str> = groups.iter().map(|g| g.metadata.name.as_str()).collect();
    if !a.yes {
        // Read-only: a group without a host key shows it as pending; none is generated.
        let keys = hostkeys::load(repo.store().as_ref(), cluster.name(), &group_names)
            .await
            .context("reading the instance groups' host keys")?;
        let cloud = aws_cloud(cluster).await?.with_host_keys(keys);
        let plan = cloud
            .plan(cluster, groups)
            .await
            .context("planning cloud resources")?;
        print_plan(ctx, &plan, a.prune)?;
        plan.check().context("planning cloud resources")?;
        let pending = plan.exit_code(a.prune) == exit::CHANGES_PENDING;
        if pending {
            ctx.printer.status(&format!(
                "Must specify --yes to apply changes to {}.",
                cluster.name()
            ));
        }
        return Ok(if pending && a.exit_code {
            exit::CHANGES_PENDING
        } else {
            exit::OK
        });
    }
    super::commands::locked(
        repo.store(),
        cluster.name(),
        "update cluster --yes",
        async {
            // Generated (once, compare-and-swap) before any launch template is written.
            let keys = hostkeys::ensure(repo.store().as_ref(), cluster.name(), &group_names)
                .await
                .context("generating the instance groups' host keys")?;
            let cloud = aws_cloud(cluster).await?.with_host_keys(keys);
            // Planned under the lock: what is applied is what the store says now.
            let plan = cloud
                .plan(cluster, groups)
                .await
                .context("planning cloud resources")?;
            plan.check().context("planning cloud resources")?;
            if plan.is_empty() || plan.exit_code(a.prune) == exit::OK {
                ctx.printer.success(&format!(
                    "No changes to cloud resources of {}.",
                    cluster.name()
                ));
                return Ok(());
            }
            print_plan(ctx, &plan, a.prune)?;
            let progress = ctx.printer.progress(plan.changes.len() as u64, "applying");
            // The engine reports each finished resource; lines appear as the apply goes.
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
            let hook = engine::DoneHook(std::sync::Arc::new(move |action, id| {
                let _ = tx.send(format!("{action:?} {id}"));
            }));
            let opts = ApplyOptions {
                prune: a.prune,
                on_done: Some(hook),
                ..Default::default()
            };
            let apply = engine::apply(&cloud, &plan, &opts);
            tokio::pin!(apply);
            let result = loop {
                tokio::select! {
                    r = &mut apply => break r,
                    Some(line) = rx.recv() => progress.inc(&ctx.printer, &line),
                }
            };
            while let Ok(line) = rx.try_recv() {
                progress.inc(&ctx.printer, &line);
            }
            let report = result.context("applying cloud resources")?;
            progress.finish();
            ctx.printer.success(&format!(
                "Cloud resources of {} are up to date ({} changes applied).",
                cluster.name(),
                report.done.len()
            ));
            Ok(())
        },
    )
    .await?;
    // Not a silent success: the instances run no Kubernetes until the node layer provisions
    // them, and this version does not run it on AWS yet (docs/aws.md, "Not done yet").
    if !super::addons::has_credentials(ctx, cluster).await? {
        ctx.printer.warn(&format!(
            "the instances of {} are not provisioned: update cluster does not yet run the node \
             layer (SSH, kubeadm) on AWS instances, so no Kubernetes runs there and the add-ons \
             were not applied",
            cluster.name()
        ));
    }
    if !a.skip_addons && super::addons::has_credentials(ctx, cluster).await? {
        let args = super::addons::UpdateAddonsArgs {
            name: cluster.name(),
            yes: true,
            kubeconfig: a.kubeconfig.as_deref(),
            force_conflicts: false,
            wait: std::time::Duration::from_secs(300),
            exit_code: false,
            ssh_tunnel: false,
        };
        super::addons::deploy(ctx, cluster, &args).await?;
    }
    Ok(exit::OK)
}

/// `delete cluster` for aws: every owned resource, in reverse dependency order.
pub(super) async fn aws_delete(
    ctx: &Ctx,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    yes: bool,
) -> anyhow::Result<()> {
    let cloud = aws_cloud(cluster).await?;
    let plan = cloud
        .plan_delete(cluster, groups)
        .await
        .context("finding the cluster's cloud resources")?;
    if !yes {
        ctx.printer.data(&engine::render_text(
            &plan,
            RenderOptions {
                color: ctx.printer.color(),
                prune: true,
            },
        ));
        return Ok(());
    }
    let report = engine::apply(
        &cloud,
        &plan,
        &ApplyOptions {
            prune: true,
            ..Default::default()
        },
    )
    .await
    .context("deleting cloud resources")?;
    ctx.printer.success(&format!(
        "Deleted {} cloud resources of {}.",
        report.done.len(),
        cluster.name()
    ));
    Ok(())
}
