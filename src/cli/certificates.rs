//! `get certificates` and `rotate certificates`: thin commands over `ops::certificates`, and
//! the certificate warning of `validate cluster`.
//!
//! The control planes come from the platform seam (`ops::platform`): the inventory (metal) or
//! the cluster's running instances (AWS, found with the same discovery as `update cluster`). Only hosts whose key
//! the cluster recorded and that carry its ownership marker are read or rotated.

use std::sync::Arc;
use std::time::Duration;

use super::commands::Ctx;
use super::exit;
use crate::ops::certificates::RenewedBy;
use crate::ops::certificates::{
    self as ops, CertState, CertificateReport, HostState, RotateError, RotateEvent, RotateEvents,
    RotateOptions, ValidateCheck, WARN_WITHIN,
};
use crate::ops::nodes::AdminKubeconfig;
use crate::output::{Format, Printer, Table};
use crate::spec::{Cluster, InstanceGroup};

/// `rotate certificates` options from the command line.
#[derive(Debug, Clone)]
pub(super) struct RotateArgs {
    pub name: String,
    pub yes: bool,
    pub static_pod_wait: Duration,
    pub health_timeout: Duration,
    pub concurrency: usize,
}

fn when(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|| "-".into())
}

fn report_table(report: &CertificateReport) -> Table {
    let mut t = Table::new([
        "HOST",
        "CERTIFICATE",
        "EXPIRES",
        "RESIDUAL TIME",
        "ISSUER",
        "RENEWED BY",
    ]);
    for h in &report.hosts {
        if h.state != HostState::Read {
            t.row([
                h.host.clone(),
                "-".into(),
                "-".into(),
                "not read".into(),
                h.reason.clone().unwrap_or_default(),
                "-".into(),
            ]);
            continue;
        }
        for c in &h.certificates {
            let issuer = match (c.certificate_authority, &c.issuer) {
                (true, _) => "(certificate authority)".to_string(),
                (false, Some(i)) => i.clone(),
                (false, None) => c.error.clone().unwrap_or_else(|| "-".into()),
            };
            t.row([
                h.host.clone(),
                c.name.clone(),
                when(c.not_after),
                c.residual(),
                issuer,
                match c.renewed_by {
                    RenewedBy::Kubeadm => "kubeadm (rotate certificates)",
                    RenewedBy::Kubelet => "the kubelet",
                    RenewedBy::Manual => "manual",
                }
                .to_string(),
            ]);
        }
    }
    t
}

fn print_report(ctx: &Ctx, report: &CertificateReport) -> anyhow::Result<()> {
    match ctx.printer.format() {
        Format::Json => ctx.printer.data(&serde_json::to_string_pretty(report)?),
        Format::Yaml => ctx.printer.data(&crate::output::to_yaml(report)?),
        Format::Table => ctx.printer.data(&report_table(report).render()),
    }
    Ok(())
}

/// Warnings for what a report shows: unread hosts, unreadable files, certificates that
/// expire within 30 days. Returns whether every control plane was read.
fn warn_about(printer: &Printer, report: &CertificateReport) -> bool {
    let name = &report.cluster;
    for h in report.unread() {
        printer.warn(&format!(
            "{}: certificates not read: {}",
            h.host,
            h.reason.as_deref().unwrap_or("unknown reason")
        ));
    }
    for (host, c) in report.invalid() {
        printer.warn(&format!(
            "{host}: {} ({}) is unreadable: {}",
            c.name,
            c.path,
            c.error.as_deref().unwrap_or("unknown reason")
        ));
    }
    for h in &report.hosts {
        for c in h.certificates.iter().filter(|c| c.note.is_some()) {
            printer.warn(&format!(
                "{}: {}: {}",
                h.host,
                c.name,
                c.note.as_deref().unwrap_or_default()
            ));
        }
    }
    let expiring = report.expiring(WARN_WITHIN);
    for (host, c) in &expiring {
        let what = if c.state == CertState::Expired {
            format!("EXPIRED on {}", when(c.not_after))
        } else {
            format!("expires on {} (in {})", when(c.not_after), c.residual())
        };
        let who = match c.renewed_by {
            RenewedBy::Kubeadm => "",
            RenewedBy::Kubelet => {
                " (the kubelet should have rotated it: check its rotateCertificates setting and that its certificate signing requests are approved)"
            }
            RenewedBy::Manual => " (no tool renews it: renew it by hand as kubeadm documents)",
        };
        printer.warn(&format!("{host}: certificate {} {what}{who}", c.name));
    }
    let kubeadm = expiring
        .iter()
        .filter(|(_, c)| c.renewed_by == RenewedBy::Kubeadm)
        .count();
    if kubeadm > 0 {
        printer.warn(&format!(
            "{kubeadm} certificates of {name} expire within 30 days: renew them with `kprov rotate certificates {name} --yes`"
        ));
    }
    report.unread().is_empty()
}

/// `get certificates NAME`: exit 1 when a control plane could not be read.
pub(super) async fn get(ctx: &Ctx, name: &str) -> anyhow::Result<i32> {
    let session = ctx.session().await?;
    let (cluster, groups) = session.resolved(name).await?;
    let report = ops::get(session.store(), &cluster, &groups)
        .await
        .map_err(|e| match e {
            ops::ReadError::Failed(e) => e,
            e => e.into(),
        })?;
    print_report(ctx, &report)?;
    Ok(if warn_about(&ctx.printer, &report) {
        exit::OK
    } else {
        exit::ERROR
    })
}

/// The certificate part of `validate cluster`: warnings only, never a failure (the API
/// checks decide). Called with the cluster `validate` resolved.
pub(super) async fn warn_expiring(
    ctx: &Ctx,
    cluster: &Cluster,
    groups: &[InstanceGroup],
) -> anyhow::Result<()> {
    let name = cluster.name();
    let store = ctx.session().await?.store();
    match ops::check_for_validate(store, cluster, groups).await {
        ValidateCheck::NotOnCloud(cloud) => ctx.printer.status(&format!(
            "Certificates are not checked by validate on {cloud:?} clusters; run `kprov get certificates {name}`."
        )),
        ValidateCheck::Read(report) => {
            if warn_about(&ctx.printer, &report) && report.expiring(WARN_WITHIN).is_empty() {
                ctx.printer.status(&format!(
                    "Certificates of {name}: none expires within 30 days."
                ));
            }
        }
        ValidateCheck::Failed(e) => ctx.printer.warn(&format!(
            "could not check the certificates of {name}: {e:#}"
        )),
    }
    Ok(())
}

/// A status line per step and per finished control plane (stderr, whatever `-o` says).
fn render_events() -> RotateEvents {
    let printer = Printer::new(Format::Table, 0);
    Arc::new(move |e: &RotateEvent| match e {
        RotateEvent::Step { host, step } => printer.status(&format!("{host}: {step}")),
        RotateEvent::HostDone { host, took } => printer.status(&format!(
            "{host}: renewed, restarted and healthy ({:.1}s)",
            took.as_secs_f64()
        )),
    })
}

/// `rotate certificates NAME [--yes]`.
pub(super) async fn rotate(ctx: &Ctx, a: &RotateArgs) -> anyhow::Result<i32> {
    let name = a.name.as_str();
    let session = ctx.session().await?;
    let (cluster, groups) = session.resolved(name).await?;
    let store = session.store().clone();
    let plan = ops::plan(&store, &cluster, &groups).await.map_err(failed)?;
    if !a.yes {
        let report = plan.read(store, a.concurrency).await?;
        print_report(ctx, &report)?;
        let readable = warn_about(&ctx.printer, &report);
        ctx.printer.status(&format!(
            "Will renew the kubeadm certificates of {name} one control plane at a time ({}): \
             `kubeadm certs renew all`, restart the static pods (manifests aside for {}s), \
             wait up to {}s for kube-apiserver, then the next; then store the renewed admin \
             kubeconfig. The kubelet's client certificates rotate by themselves and are left alone.",
            plan.order.join(" → "),
            a.static_pod_wait.as_secs(),
            a.health_timeout.as_secs()
        ));
        if !readable {
            ctx.printer.error(&format!(
                "the rotation would be refused: every control plane of {name} must be readable and owned by it"
            ));
            return Ok(exit::ERROR);
        }
        ctx.printer.status(&format!(
            "Must specify --yes to rotate the certificates of {name}."
        ));
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
    let ints = super::commands::catch_interrupts(name, &resume);
    let outcome = session
        .with_lock(name, "rotate certificates --yes", async |guard| {
            ints.or_try(ops::apply(
                store.clone(),
                &plan,
                guard,
                &options,
                &render_events(),
            ))
            .await
        })
        .await
        .map_err(failed)?;
    let report = match outcome {
        Err(c) => {
            return Ok(super::commands::interrupted(
                ctx,
                name,
                c,
                "rotating the certificates",
                &resume,
            ));
        }
        Ok(r) => r,
    };
    print_report(ctx, &report.after)?;
    if let Some((host, why)) = &report.rolled.failed {
        ctx.printer
            .error(&format!("{host}: the rotation stopped here: {why}"));
        if !report.rolled.not_started.is_empty() {
            ctx.printer.error(&format!(
                "not rotated: {}; fix {host} and re-run `kprov rotate certificates {name} --yes` (renewing again is harmless)",
                report.rolled.not_started.join(", ")
            ));
        }
    }
    match &report.admin_kubeconfig {
        AdminKubeconfig::Stored => ctx.printer.status(&format!(
            "Stored the renewed admin kubeconfig of {name}; run `kprov export kubeconfig {name}` to update yours."
        )),
        AdminKubeconfig::Unchanged => ctx
            .printer
            .status(&format!("The stored admin kubeconfig of {name} is current.")),
        AdminKubeconfig::NotFetched(why) => ctx.printer.error(&format!(
            "the admin kubeconfig of {name} was not refreshed: {why}"
        )),
    }
    if !report.success() {
        return Ok(exit::ERROR);
    }
    ctx.printer.success(&format!(
        "Rotated the certificates of {name} on {} control planes ({}).",
        report.rolled.renewed.len(),
        report
            .rolled
            .renewed
            .iter()
            .map(|(h, _)| h.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(exit::OK)
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
