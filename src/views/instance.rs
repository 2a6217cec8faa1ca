//! `delete instance`'s views: the plan per platform (the host or instance, the Node, the
//! pods, the etcd member, what follows), the progress lines and the report.

use std::sync::Arc;

use super::Shown;
use crate::kube::{Disposition, DrainEvent, DrainReport, NodeInfo};
use crate::ops::instance::{
    AwsRemovalPlan, EtcdPlan, InstancePlan, InstanceReport, RemovalPlan, RemoveEvent, RemoveEvents,
};
use crate::output::{Format, Printer, Table};

/// The preview: `-o json|yaml` the plan's document, else the platform's table and text;
/// then the refusals (or what `--yes` would do).
pub(crate) fn preview(
    printer: &Printer,
    name: &str,
    node: &str,
    plan: &InstancePlan,
) -> anyhow::Result<Shown> {
    match (plan, printer.format()) {
        (_, Format::Json) => printer.data(&serde_json::to_string_pretty(&plan.document()?)?),
        (_, Format::Yaml) => printer.data(&crate::output::to_yaml(&plan.document()?)?),
        (InstancePlan::Metal(p), Format::Table) => metal_plan(printer, p),
        (InstancePlan::Aws(p), Format::Table) => aws_plan(printer, p),
    };
    let node = match plan {
        InstancePlan::Metal(_) => node,
        InstancePlan::Aws(p) => &p.node,
    };
    Ok(end_preview(printer, plan.refusals(), node, name))
}

fn roles(plan: &RemovalPlan) -> String {
    plan.host
        .roles
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// The preview of removing a metal host: the table, the pods, the etcd member, what follows.
pub(crate) fn metal_plan(printer: &Printer, plan: &RemovalPlan) {
    let mut t = Table::new(["NODE", "HOST", "ADDRESS", "ROLES", "NODE OBJECT"]);
    t.row([
        plan.node.clone(),
        plan.host.name.clone(),
        plan.host.address.clone(),
        roles(plan),
        node_state(plan.node_object.as_ref()),
    ]);
    let mut out = t.render();
    out.push_str(&pods_text(&plan.pods));
    out.push_str("\netcd: ");
    out.push_str(&match &plan.etcd {
        EtcdPlan::NoEtcd => "no etcd member on this host".to_string(),
        EtcdPlan::NotAMember { via, members } => format!(
            "no member for this host among the {} members (read on {via}): nothing to remove",
            members.len()
        ),
        EtcdPlan::Remove {
            member,
            via,
            members,
        } => format!(
            "member {} ({}) is removed through {via} first; {} of {} members remain, {} healthy",
            member.name,
            member.hex_id(),
            members.len() - 1,
            members.len(),
            members
                .iter()
                .filter(|m| m.id != member.id && m.healthy)
                .count()
        ),
    });
    out.push_str(&format!(
        "\nThen: host {} is reset (kubeadm reset; only if it carries this cluster's ownership marker), \
         the Node object is deleted{}.",
        plan.host.name,
        match (&plan.stays_in_spec, plan.in_spec) {
            (Some(_), true) => ", and the host stays in the spec",
            (None, true) => ", and the host is removed from the spec",
            (_, false) => " (the host is no longer in the spec)",
        }
    ));
    if let (Some(why), true) = (&plan.stays_in_spec, plan.in_spec) {
        out.push_str(&format!(
            "\nNote: {why}; `kprov update cluster {} --yes` would provision it again (a \
             replacement); to shrink the cluster, change the spec first.",
            plan.cluster
        ));
    }
    printer.data(&out);
}

fn pods_text(pods: &[(String, Disposition)]) -> String {
    let evict: Vec<&str> = pods
        .iter()
        .filter(|(_, d)| *d == Disposition::Evict)
        .map(|(p, _)| p.as_str())
        .collect();
    let mut out = format!("\nPods to evict ({}):", evict.len());
    for p in &evict {
        out.push_str(&format!("\n  {p}"));
    }
    for (p, d) in pods {
        match d {
            Disposition::Skip(why) => out.push_str(&format!("\n  {p}: left alone ({why})")),
            Disposition::Refuse(why) => {
                out.push_str(&format!("\n  {p}: REFUSED ({})", why.join("; ")))
            }
            Disposition::Evict => {}
        }
    }
    out
}

/// What the removal is doing now (its last step), for the message of a signal that cuts it.
#[derive(Clone, Default)]
pub(crate) struct InFlight(Arc<std::sync::Mutex<String>>);

impl InFlight {
    pub(crate) fn describe(&self, node: &str) -> String {
        let step = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if step.is_empty() {
            format!("planning the removal of {node}")
        } else {
            format!("{step} (a step cut short is done again by the next run)")
        }
    }
}

/// A status line per step and drain event (stderr, whatever `-o` says); the last step kept
/// in `in_flight`.
pub(crate) fn events(printer: Printer, node: String, in_flight: InFlight) -> RemoveEvents {
    Arc::new(move |e: &RemoveEvent| match e {
        RemoveEvent::Step(s) => {
            *in_flight.0.lock().unwrap_or_else(|p| p.into_inner()) = s.clone();
            printer.status(s)
        }
        RemoveEvent::Warning(w) => printer.warn(w),
        RemoveEvent::Drain(d) => match d {
            DrainEvent::Cordoned { node } => printer.status(&format!("{node}: cordoned")),
            DrainEvent::Skipped {
                namespace,
                pod,
                reason,
            } => printer.status(&format!("{node}: {namespace}/{pod} left alone ({reason})")),
            DrainEvent::Evicting { namespace, pod } => {
                printer.status(&format!("{node}: evicting {namespace}/{pod}"))
            }
            DrainEvent::Blocked {
                namespace,
                pod,
                pdb,
                message,
            } => printer.status(&format!(
                "{node}: {namespace}/{pod} blocked{}: {message} (retrying)",
                pdb.as_ref()
                    .map(|p| format!(" by PodDisruptionBudget {p}"))
                    .unwrap_or_default() // no budget named: no suffix
            )),
            DrainEvent::Evicted { namespace, pod } => {
                printer.status(&format!("{node}: evicted {namespace}/{pod}"))
            }
            DrainEvent::Waiting { remaining } => {
                printer.status(&format!("{node}: waiting for {remaining} pod(s) to go"))
            }
        },
    })
}

/// The Node object's state, as the preview's table shows it.
fn node_state(node: Option<&NodeInfo>) -> String {
    match node {
        Some(n) if n.unschedulable => "cordoned",
        Some(n) if n.ready => "Ready",
        Some(_) => "NotReady",
        None => "none",
    }
    .to_string()
}

/// What the drain did, when there was a Node to drain.
fn drain_status(printer: &Printer, node: &str, drained: Option<&DrainReport>) {
    if let Some(d) = drained {
        printer.status(&format!(
            "{node}: {} pod(s) evicted, {} left alone",
            d.evicted.len(),
            d.skipped.len()
        ));
    }
}

/// The end of a preview: its refusals as errors (exit 1), else what `--yes` would do.
pub(crate) fn end_preview(
    printer: &Printer,
    refusals: &[String],
    node: &str,
    cluster: &str,
) -> Shown {
    for r in refusals {
        printer.error(r);
    }
    if !refusals.is_empty() {
        return Shown::Refused;
    }
    printer.status(&format!(
        "Must specify --yes to remove {node} from {cluster}."
    ));
    Shown::Pending
}

/// What `delete instance --yes` did.
pub(crate) fn report(printer: &Printer, name: &str, node: &str, report: &InstanceReport) {
    match report {
        InstanceReport::Metal(report) => {
            drain_status(printer, node, report.drain.as_ref());
            printer.success(&format!(
                "Removed {} from {name}{}{}.",
                node,
                match &report.etcd_member_removed {
                    Some(m) => format!(" (etcd member {} removed)", m.hex_id()),
                    None => String::new(),
                },
                if report.host_reset {
                    ", host reset"
                } else {
                    ", host not reset (no ownership marker of this cluster on it)"
                }
            ));
        }
        InstanceReport::Aws { plan, drain } => {
            drain_status(printer, &plan.node, drain.as_ref());
            printer.success(&format!(
                "Removed {} ({}) from {name}: {}.",
                plan.node,
                plan.instance_id,
                if plan.decrement {
                    format!("{} shrank by one", plan.auto_scaling_group)
                } else {
                    format!("{} launches a replacement", plan.auto_scaling_group)
                }
            ));
        }
    }
}

/// The preview of removing an AWS instance: the table, the pods, what follows.
pub(crate) fn aws_plan(printer: &Printer, plan: &AwsRemovalPlan) {
    let mut t = Table::new(["NODE", "INSTANCE", "GROUP", "ROLE", "NODE OBJECT"]);
    t.row([
        plan.node.clone(),
        plan.instance_id.clone(),
        plan.instance_group.clone(),
        if plan.control_plane {
            "control-plane".to_string()
        } else {
            "node".to_string()
        },
        if plan.cloud_only {
            "not asked (--cloudonly)".to_string()
        } else {
            node_state(plan.node_object.as_ref())
        },
    ]);
    let mut out = t.render();
    if plan.cloud_only {
        out.push_str(
            "\n--cloudonly: the cluster's API is not asked: no pod is evicted (they stop with the \
             instance) and the Node object is left to the cloud-controller-manager.",
        );
    } else {
        out.push_str(&pods_text(&plan.pods));
    }
    let c = plan.capacity;
    out.push_str(&format!(
        "\nThen: {} is terminated in {} ({}){}.",
        plan.instance_id,
        plan.auto_scaling_group,
        if plan.decrement {
            format!("desired capacity {} -> {}", c.desired, c.desired - 1)
        } else {
            format!(
                "the group launches a replacement; desired capacity stays {}",
                c.desired
            )
        },
        if plan.cloud_only {
            ""
        } else {
            ", and the Node object is deleted"
        }
    ));
    printer.data(&out);
}
