//! `get certificates`, `rotate certificates` and `validate cluster`'s certificate check: the
//! table per control plane, the warnings (unread, unreadable, expiring), the rotation's
//! progress and report.

use std::sync::Arc;
use std::time::Duration;

use crate::ops::certificates::{
    CertState, CertificateReport, HostState, RenewedBy, RotateEvent, RotateEvents, RotatePlan,
    RotateReport, ValidateCheck, WARN_WITHIN,
};
use crate::ops::nodes::AdminKubeconfig;
use crate::output::{Format, Printer, Table};

fn when(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|| "-".into())
}

pub(crate) fn report_table(report: &CertificateReport) -> Table {
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
                h.reason.clone().unwrap_or_default(), // no reason recorded: an empty cell
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

/// The report: the table, or its document (`-o json|yaml`).
pub(crate) fn report(printer: &Printer, report: &CertificateReport) -> anyhow::Result<()> {
    match printer.format() {
        Format::Json => printer.data(&serde_json::to_string_pretty(report)?),
        Format::Yaml => printer.data(&crate::output::to_yaml(report)?),
        Format::Table => printer.data(&report_table(report).render()),
    }
    Ok(())
}

/// Warnings for what a report shows: unread hosts, unreadable files, certificates that
/// expire within 30 days. Returns whether every control plane was read.
pub(crate) fn warn_about(printer: &Printer, report: &CertificateReport) -> bool {
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
        for (c, note) in h
            .certificates
            .iter()
            .filter_map(|c| c.note.as_deref().map(|n| (c, n)))
        {
            printer.warn(&format!("{}: {}: {note}", h.host, c.name));
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

/// The certificate part of `validate cluster`: warnings only, never a failure.
pub(crate) fn validate_check(printer: &Printer, name: &str, check: ValidateCheck) {
    match check {
        ValidateCheck::NotOnCloud(cloud) => printer.status(&format!(
            "Certificates are not checked by validate on {cloud:?} clusters; run `kprov get certificates {name}`."
        )),
        ValidateCheck::Read(report) => {
            if warn_about(printer, &report) && report.expiring(WARN_WITHIN).is_empty() {
                printer.status(&format!(
                    "Certificates of {name}: none expires within 30 days."
                ));
            }
        }
        ValidateCheck::Failed(e) => printer.warn(&format!(
            "could not check the certificates of {name}: {e:#}"
        )),
    }
}

/// A status line per step and per finished control plane (stderr, whatever `-o` says).
pub(crate) fn events() -> RotateEvents {
    let printer = Printer::new(Format::Table, 0);
    Arc::new(move |e: &RotateEvent| match e {
        RotateEvent::Step { host, step } => printer.status(&format!("{host}: {step}")),
        RotateEvent::HostDone { host, took } => printer.status(&format!(
            "{host}: renewed, restarted and healthy ({:.1}s)",
            took.as_secs_f64()
        )),
    })
}

/// `rotate certificates`' preview after its report: the rotation's order and waits, refused
/// (false) unless every control plane was read.
pub(crate) fn rotate_preview(
    printer: &Printer,
    name: &str,
    report: &CertificateReport,
    plan: &RotatePlan,
    static_pod_wait: Duration,
    health_timeout: Duration,
) -> bool {
    let readable = warn_about(printer, report);
    printer.status(&format!(
        "Will renew the kubeadm certificates of {name} one control plane at a time ({}): \
         `kubeadm certs renew all`, restart the static pods (manifests aside for {}s), \
         wait up to {}s for kube-apiserver, then the next; then store the renewed admin \
         kubeconfig. The kubelet's client certificates rotate by themselves and are left alone.",
        plan.order.join(" → "),
        static_pod_wait.as_secs(),
        health_timeout.as_secs()
    ));
    if !readable {
        printer.error(&format!(
            "the rotation would be refused: every control plane of {name} must be readable and owned by it"
        ));
        return false;
    }
    printer.status(&format!(
        "Must specify --yes to rotate the certificates of {name}."
    ));
    true
}

/// What `rotate certificates --yes` did: the certificates after, where it stopped, the admin
/// kubeconfig; false when it did not succeed.
pub(crate) fn rotated(
    printer: &Printer,
    name: &str,
    report: &RotateReport,
) -> anyhow::Result<bool> {
    self::report(printer, &report.after)?;
    if let Some((host, why)) = &report.rolled.failed {
        printer.error(&format!("{host}: the rotation stopped here: {why}"));
        if !report.rolled.not_started.is_empty() {
            printer.error(&format!(
                "not rotated: {}; fix {host} and re-run `kprov rotate certificates {name} --yes` (renewing again is harmless)",
                report.rolled.not_started.join(", ")
            ));
        }
    }
    match &report.admin_kubeconfig {
        AdminKubeconfig::Stored => printer.status(&format!(
            "Stored the renewed admin kubeconfig of {name}; run `kprov export kubeconfig {name}` to update yours."
        )),
        AdminKubeconfig::Unchanged => printer
            .status(&format!("The stored admin kubeconfig of {name} is current.")),
        AdminKubeconfig::NotFetched(why) => printer.error(&format!(
            "the admin kubeconfig of {name} was not refreshed: {why}"
        )),
    }
    if !report.success() {
        return Ok(false);
    }
    printer.success(&format!(
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
    Ok(true)
}
