//! `kprov update cluster NAME`: the preview, and with `--yes` the apply, of everything the
//! spec asks for: cloud resources (aws), nodes over SSH, then the add-ons. The use case is
//! `ops::update` (the platform chosen there); `views::update` prints its plan, events and
//! report.

use std::sync::Mutex;

use super::ctx::Ctx;
use super::ctx::{catch_interrupts, interrupted};
use super::{UpdateClusterArgs, UpdatePhase, exit};
use crate::ops::aws::AwsUpdateOptions;
use crate::ops::update::{
    self as ops_update, PlanShape, Update, UpdateError, UpdateEvent, UpdateEvents, UpdateOptions,
    UpdateReport,
};
use crate::output::Format;
use crate::views::update::{self as view, ApplyEvents, InFlight};

pub(super) async fn cluster(ctx: &Ctx, a: &UpdateClusterArgs) -> anyhow::Result<i32> {
    let session = ctx.session().await?.clone();
    let update = ops_update::load(session, &a.name, options(a))
        .await
        .map_err(refused)?;
    if update.addons_only() {
        return super::metal::addons_phase(ctx, &update, a).await;
    }
    if let Some(r) = update.reread() {
        view::reread(&ctx.printer, update.cluster().name(), r);
    }
    if !a.yes {
        return preview(ctx, &update, a).await;
    }
    apply(ctx, &update, a).await
}

/// An `ops::update` error as the command reports it (exit codes from its kind).
fn refused(e: UpdateError) -> anyhow::Error {
    match e {
        UpdateError::Flag { flag, message } => super::create::FlagError { flag, message }.into(),
        UpdateError::CloudPlan { error, .. } => {
            anyhow::Error::new(error).context("planning cloud resources")
        }
        UpdateError::Lock(e) => e.into(),
        UpdateError::NodePlan { error, .. } | UpdateError::Other(error) => error,
    }
}

/// The command that runs this apply again (printed when a signal cuts it).
pub(super) fn resume_command(name: &str, a: &UpdateClusterArgs) -> String {
    format!(
        "kprov update cluster {name} --yes{}",
        a.phase.map(UpdatePhase::flag).unwrap_or_default() // no phase: no flag
    )
}

fn options(a: &UpdateClusterArgs) -> UpdateOptions {
    UpdateOptions {
        common: AwsUpdateOptions {
            prune: a.prune,
            ssh_private_address: a.ssh_private_address,
            accept_new_host_keys: a.accept_new_host_keys,
            concurrency: a.concurrency,
            ssh_wait: Some(a.ssh_wait),
            refresh_images: a.refresh_image,
            phase: a.phase.map(UpdatePhase::ops),
        },
        inventory: a.inventory.clone(),
        bundle: a.bundle.clone(),
    }
}

/// `update cluster` without `--yes`: [`Update::plan`] printed.
async fn preview(ctx: &Ctx, update: &Update, a: &UpdateClusterArgs) -> anyhow::Result<i32> {
    let printer = &ctx.printer;
    let plan = match update.plan().await {
        Ok(plan) => plan,
        Err(UpdateError::CloudPlan { plan, error }) => {
            view::cloud_plan(printer, &plan, a.prune)?;
            return Err(refused(UpdateError::CloudPlan { plan, error }));
        }
        Err(UpdateError::NodePlan { cloud, error }) => {
            // On a terminal the cloud plan shows even when the instances cannot be read.
            if printer.format() == Format::Table {
                view::cloud_plan(printer, &cloud, a.prune)?;
            }
            return Err(error);
        }
        Err(e) => return Err(refused(e)),
    };
    let name = update.cluster().name();
    let shown = match plan.shape {
        PlanShape::Cloud => view::cloud_preview(
            printer,
            name,
            &plan,
            a.prune,
            a.phase == Some(UpdatePhase::Cloud),
        )?,
        PlanShape::Hosts => view::hosts_preview(
            printer,
            name,
            &plan,
            update.hosts_to_remove(),
            a.inventory.as_deref(),
        )?,
    };
    Ok(exit::of_preview(shown, a.exit_code))
}

/// `update cluster --yes`: [`Update::apply`] (under the cluster lock, cut by the first
/// signal), its events printed, then the report and the add-ons.
async fn apply(ctx: &Ctx, update: &Update, a: &UpdateClusterArgs) -> anyhow::Result<i32> {
    let name = update.cluster().name();
    crate::views::nodes::warn_gone(&ctx.printer, name, update.hosts_to_remove());
    let resume = resume_command(name, a);
    let ints = catch_interrupts(name, &resume);
    let in_flight = InFlight::default();
    if let Some(targets) = update.known_targets() {
        in_flight.provisioning(view::provisioning(targets.len(), update.machine()));
    }
    // The first signal cuts the apply where it waits (SSH, Auto Scaling, a cloud call, a host
    // step): every part of it is safe to run again, which the next run does.
    let shown = ApplyEvents::new(&ctx.printer, name, a.prune, &in_flight);
    let events = |e: &UpdateEvent<'_>| shown.show(e);
    let events: UpdateEvents<'_> = &events;
    let bars = Mutex::new(None);
    let machine = update.machine();
    let result = update
        .apply(&ints, events, |t| {
            in_flight.provisioning(view::provisioning(t.len(), machine));
            let (events, multi) = crate::views::nodes::node_events(&ctx.printer, t);
            *bars.lock().unwrap_or_else(|p| p.into_inner()) = multi;
            events
        })
        .await;
    if let Some(multi) = bars.into_inner().unwrap_or_else(|p| p.into_inner()) {
        // The final table says it all; finished spinners would only repeat it.
        let _ = multi.clear();
    }
    let outcome = match result.map_err(refused)? {
        Err(c) => return Ok(interrupted(ctx, name, c, &in_flight.describe(), &resume)),
        Ok(o) => o,
    };
    match (&outcome, view::unprovisioned(&ctx.printer, name, &outcome)) {
        (UpdateReport::Nodes(nodes), _) => super::metal::finish(ctx, update, nodes, a, &ints).await,
        (_, Some(false)) => Ok(exit::ERROR),
        (_, _) => Ok(exit::OK),
    }
}
