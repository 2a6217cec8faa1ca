//! `create cluster`'s views: what it understood from an inventory, the `--dry-run` objects,
//! and what it created.

use crate::ops::create::CreatePlan;
use crate::output::{Printer, plural};
use crate::spec::{EtcdType, ObjectRef};

/// The inventory's warning and notes (`--dry-run`: the whole summary of what was understood).
pub(crate) fn inventory(printer: &Printer, plan: &CreatePlan, dry_run: bool) {
    if let Some(inv) = &plan.inventory {
        if let Some(w) = inv.unused_warning() {
            printer.warn(&w);
        }
        let lines = super::create::inventory_summary(inv, &plan.overrides);
        if dry_run {
            for l in lines {
                printer.status(&l);
            }
        } else {
            for n in inv.notes.iter().chain(&plan.overrides) {
                printer.status(&format!("Note: {n}"));
            }
        }
    }
}

/// `--dry-run`'s objects: YAML documents, or (`json`) one `List`.
pub(crate) fn dry_run(printer: &Printer, plan: &CreatePlan, json: bool) -> anyhow::Result<()> {
    let objects: Vec<ObjectRef> = std::iter::once(ObjectRef::Cluster(&plan.cluster))
        .chain(plan.groups.iter().map(ObjectRef::InstanceGroup))
        .collect();
    super::objects::objects_as(printer, &objects, json)
}

/// What `create cluster` stored (`location`: the store's).
pub(crate) fn created(printer: &Printer, plan: &CreatePlan, location: &str) {
    let (cluster, groups) = (&plan.cluster, &plan.groups);
    printer.success(&format!(
        "Cluster {} created in {} ({}).",
        cluster.name(),
        location,
        plural(groups.len(), "instance group")
    ));
    printer.status(&format!("No infrastructure was changed. Review with `kprov get cluster {0} -o yaml`, then preview with `kprov update cluster {0}`.", cluster.name()));
}

/// What `create --dry-run` says it understood from an inventory, one line each.
pub(crate) fn inventory_summary(
    inv: &crate::inventory::Inventory,
    overrides: &[String],
) -> Vec<String> {
    let mut out = vec![format!(
        "Inventory {} ({:?}): {} host(s)",
        inv.file,
        inv.format,
        inv.hosts.len()
    )];
    for l in &inv.hosts {
        let h = &l.host;
        let roles: Vec<&str> = h.roles.iter().map(|r| r.as_str()).collect();
        let mut line = format!(
            "  {} (line {}): roles {}, address {}",
            h.name,
            l.line,
            roles.join(","),
            h.address
        );
        if let Some(ip) = &h.ip {
            line.push_str(&format!(", ip {ip}"));
        }
        line.push_str(&format!(
            ", user {}",
            h.user.as_deref().unwrap_or("(default)")
        ));
        line.push_str(&format!(
            ", port {}",
            h.port.map_or("22".to_string(), |p| p.to_string())
        ));
        if let Some(k) = &h.key_path {
            line.push_str(&format!(", key {k}"));
        }
        if let Some(b) = &h.bastion {
            line.push_str(&format!(", bastion {b}"));
        }
        if !h.labels.is_empty() {
            let labels: Vec<String> = h.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            line.push_str(&format!(", labels {}", labels.join(",")));
        }
        if !h.taints.is_empty() {
            line.push_str(&format!(", taints {}", h.taints.join(",")));
        }
        out.push(line);
    }
    let etcd = crate::inventory::etcd_topology(&inv.plain_hosts());
    out.push(format!(
        "etcd: {}",
        match etcd {
            EtcdType::Stacked => "stacked (a member on each control plane)",
            EtcdType::External => "external (etcd as a service on the etcd hosts)",
        }
    ));
    if inv.mapped.is_empty() {
        out.push("Variables mapped to the spec: none".into());
    } else {
        out.push("Variables mapped to the spec:".into());
        for m in &inv.mapped {
            out.push(format!(
                "  {} ({}) -> {} = {}",
                m.var, m.at, m.field, m.value
            ));
        }
    }
    for n in inv.notes.iter().chain(overrides) {
        out.push(format!("Note: {n}"));
    }
    out
}
