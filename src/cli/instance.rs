//! `delete instance CLUSTER NODE [--yes]`: the command over `ops::instance` (preview, then
//! drain, etcd member, reset, Node object, spec). Renders the plan and the progress.
//!
//! On AWS: drain, terminate the instance in its Auto Scaling group (replaced, or the group
//! shrinks with `--decrement-desired-capacity`), delete the Node object.
//!
//! Exit codes: 0 removed (or previewed); 1 refused (last control plane, etcd quorum, pods
//! that would be lost; on AWS a control plane, or a group below its minimum) or failed (drain timed out: the node stays
//! cordoned and nothing else changed; host not reset); 4 the cluster's lock is held.

use super::ctx::{Ctx, catch_interrupts, interrupted};
use super::{DeleteInstanceArgs, exit};
use crate::ops::instance::{self as ops, InstanceError};
use crate::output::{Format, Printer};
use crate::views::instance::{self as view, InFlight};

pub(super) async fn delete_instance(ctx: &Ctx, a: &DeleteInstanceArgs) -> anyhow::Result<i32> {
    let cluster = super::addons::resolved(ctx, &a.cluster).await?;
    let name = cluster.name.as_str();
    let repo = ctx.repo().await?;
    let request = ops::Request {
        node: a.node.clone(),
        drain_timeout: a.drain_timeout,
        delete_emptydir_data: a.delete_emptydir_data,
        force: a.force,
        decrement: a.decrement_desired_capacity,
        cloud_only: a.cloud_only,
        kubeconfig: a.kubeconfig.clone(),
    };
    let removal = ops::Removal::open(repo.store().clone(), &cluster, request)
        .await
        .map_err(failed)?;
    if let Some(route) = removal.route() {
        ctx.printer.debug(route);
    }
    if !a.yes {
        let plan = removal.plan().await.map_err(failed)?;
        let shown = view::preview(&ctx.printer, name, &a.node, &plan)?;
        return Ok(exit::of_preview(shown, false));
    }
    // Caught before the lock is taken: the first signal ends whatever wait is in flight
    // (drain, etcd member, host, API, the cloud), the lock is released and the way to resume
    // said.
    let resume = format!("kprov delete instance {name} {} --yes", a.node);
    let ints = catch_interrupts(name, &resume);
    let in_flight = InFlight::default();
    let events = view::events(
        Printer::new(Format::Table, 0),
        a.node.clone(),
        in_flight.clone(),
    );
    let outcome = removal
        .apply_interruptible(ctx.session().await?, &ints, &events)
        .await
        .map_err(failed)?;
    let report = match outcome {
        Err(c) => {
            return Ok(interrupted(
                ctx,
                name,
                c,
                &in_flight.describe(&a.node),
                &resume,
            ));
        }
        Ok(r) => r,
    };
    view::report(&ctx.printer, name, &a.node, &report);
    Ok(exit::OK)
}

/// An ops error as the command reports it: its cause kept as it is, so that the exit code
/// (`exit_code_of`: 4 for a held lock, a conflict) reads it.
fn failed(e: InstanceError) -> anyhow::Error {
    match e {
        InstanceError::Lock(e) => e.into(),
        InstanceError::Failed(e) => e,
        e => e.into(),
    }
}
