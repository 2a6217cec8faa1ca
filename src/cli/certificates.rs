//! `get certificates` and `rotate certificates`: thin commands over `ops::certificates`, and
//! the certificate warning of `validate cluster`.
//!
//! The control planes come from the platform seam (`ops::platform`): the inventory (metal) or
//! the cluster's running instances (AWS, found with the same discovery as `update cluster`). Only hosts whose key
//! the cluster recorded and that carry its ownership marker are read or rotated.

use super::ctx::Ctx;
use super::exit;
use crate::ops::certificates::{self as ops, RotateError, RotateOptions};
use crate::spec::ResolvedCluster;
use crate::views::certificates as view;

/// `get certificates NAME`: exit 1 when a control plane could not be read.
pub(super) async fn get(ctx: &Ctx, name: &str) -> anyhow::Result<i32> {
    let session = ctx.session().await?;
    let resolved = session.resolve(name).await?;
    let report = ops::get(session.store(), &resolved)
        .await
        .map_err(|e| match e {
            ops::ReadError::Failed(e) => e,
            e => e.into(),
        })?;
    view::report(&ctx.printer, &report)?;
    Ok(if view::warn_about(&ctx.printer, &report) {
        exit::OK
    } else {
        exit::ERROR
    })
}

/// The certificate part of `validate cluster`: warnings only, never a failure (the API
/// checks decide). Called with the cluster `validate` resolved.
pub(super) async fn warn_expiring(ctx: &Ctx, cluster: &ResolvedCluster) -> anyhow::Result<()> {
    let name = cluster.name.as_str();
    let store = ctx.session().await?.store();
    let check = ops::check_for_validate(store, cluster).await;
    view::validate_check(&ctx.printer, name, check);
    Ok(())
}

/// `rotate certificates NAME [--yes]`.
pub(super) async fn rotate(ctx: &Ctx, a: &super::RotateCertificatesCli) -> anyhow::Result<i32> {
    let name = a.name.as_str();
    let session = ctx.session().await?;
    let resolved = session.resolve(name).await?;
    let store = session.store().clone();
    let plan = ops::plan(&store, &resolved).await.map_err(failed)?;
    if !a.yes {
        let report = plan.read(store, a.concurrency).await?;
        view::report(&ctx.printer, &report)?;
        if !view::rotate_preview(
            &ctx.printer,
            name,
            &report,
            &plan,
            a.static_pod_wait,
            a.health_timeout,
        ) {
            return Ok(exit::ERROR);
        }
        return Ok(exit::OK);
    }
    let options = RotateOptions {
        concurrency: a.concurrency,
        static_pod_wait: a.static_pod_wait,
        health_timeout: a.health_timeout,
        cloud_api: None,
    };
    // Caught before the lock is taken: the first signal ends the wait in flight (a static
    // pod's restart, the API's health) and releases the lock; renewing again is harmless.
    let resume = format!("kprov rotate certificates {name} --yes");
    let ints = super::ctx::catch_interrupts(name, &resume);
    let outcome = session
        .with_lock(name, "rotate certificates --yes", async |guard| {
            ints.or_try(ops::apply(
                store.clone(),
                &plan,
                guard,
                &options,
                &view::events(),
            ))
            .await
        })
        .await
        .map_err(failed)?;
    let report = match outcome {
        Err(c) => {
            return Ok(super::ctx::interrupted(
                ctx,
                name,
                c,
                "rotating the certificates",
                &resume,
            ));
        }
        Ok(r) => r,
    };
    Ok(if view::rotated(&ctx.printer, name, &report)? {
        exit::OK
    } else {
        exit::ERROR
    })
}

/// An ops error as the command reports it: its cause kept as it is, so that the exit code
/// (`exit_code_of`: 4 for a held lock) reads it.
fn failed(e: RotateError) -> anyhow::Error {
    match e {
        RotateError::Lock(e) => e.into(),
        RotateError::Failed(e) => e,
        e => e.into(),
    }
}
