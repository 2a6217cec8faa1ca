//! `delete instance CLUSTER NODE [--yes]`: the command over `ops::instance` (preview, then
//! drain, etcd member, reset, Node object, spec). Renders the plan and the progress.
//!
//! On AWS: drain, terminate the instance in its Auto Scaling group (replaced, or the group
//! shrinks with `--decrement-desired-capacity`), delete the Node object.
//!
//! Exit codes: 0 removed (or previewed); 1 refused (last control plane, etcd quorum, pods
//! that would be lost; on AWS a control plane, or a group below its minimum) or failed (drain timed out: the node stays
//! cordoned and nothing else changed; host not reset); 4 the cluster's lock is held.

use std::sync::Arc;

use super::commands::{Ctx, catch_interrupts, interrupted};
use super::{DeleteInstanceArgs, exit};
use crate::kube::{Disposition, DrainEvent, DrainReport, NodeInfo};
use crate::ops::instance::{
    self as ops, AwsRemovalPlan, EtcdPlan, InstanceError, InstancePlan, InstanceReport,
    RemovalPlan, RemoveEvent, RemoveEvents,
};
use crate::ops::session::Session;
use crate::output::{Format, Printer, Table};

fn roles(plan: &RemovalPlan) -> String {
    plan.host
        .roles
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

fn render_plan(ctx: &Ctx, plan: &RemovalPlan) {
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
    ctx.printer.data(&out);
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
struct InFlight(Arc<std::sync::Mutex<String>>);

impl InFlight {
    fn describe(&self, node: &str) -> String {
        let step = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if step.is_empty() {
            format!("planning the removal of {node}")
        } else {
            format!("{step} (a step cut short is done again by the next run)")
        }
    }
}

fn render_events(printer: Printer, node: String, in_flight: InFlight) -> RemoveEvents {
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
                    .unwrap_or_default()
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
fn drain_status(ctx: &Ctx, node: &str, drained: Option<&DrainReport>) {
    if let Some(d) = drained {
        ctx.printer.status(&format!(
            "{node}: {} pod(s) evicted, {} left alone",
            d.evicted.len(),
            d.skipped.len()
        ));
    }
}

/// The end of a preview: its refusals as errors (exit 1), else what `--yes` would do.
fn end_preview(ctx: &Ctx, refusals: &[String], node: &str, cluster: &str) -> i32 {
    for r in refusals {
        ctx.printer.error(r);
    }
    if !refusals.is_empty() {
        return exit::ERROR;
    }
    ctx.printer.status(&format!(
        "Must specify --yes to remove {node} from {cluster}."
    ));
    exit::OK
}

pub(super) async fn delete_instance(ctx: &Ctx, a: &DeleteInstanceArgs) -> anyhow::Result<i32> {
    let (cluster, groups) = super::addons::resolved(ctx, &a.cluster).await?;
    let name = cluster.name();
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
    let removal = ops::Removal::open(repo.store().clone(), &cluster, &groups, request)
        .await
        .map_err(failed)?;
    if let Some(route) = removal.route() {
        ctx.printer.debug(route);
    }
    if !a.yes {
        let plan = removal.plan().await.map_err(failed)?;
        match (&plan, ctx.printer.format()) {
            (_, Format::Json) => ctx
                .printer
                .data(&serde_json::to_string_pretty(&plan.document()?)?),
            (_, Format::Yaml) => ctx
                .printer
                .data(&crate::output::to_yaml(&plan.document()?)?),
            (InstancePlan::Metal(p), Format::Table) => render_plan(ctx, p),
            (InstancePlan::Aws(p), Format::Table) => render_aws_plan(ctx, p),
        };
        let node = match &plan {
            InstancePlan::Metal(_) => &a.node,
            InstancePlan::Aws(p) => &p.node,
        };
        return Ok(end_preview(ctx, plan.refusals(), node, name));
    }
    // Caught before the lock is taken: the first signal ends whatever wait is in flight
    // (drain, etcd member, host, API, the cloud), the lock is released and the way to resume
    // said.
    let resume = format!("kprov delete instance {name} {} --yes", a.node);
    let ints = catch_interrupts(name, &resume);
    let in_flight = InFlight::default();
    let events = render_events(
        Printer::new(Format::Table, 0),
        a.node.clone(),
        in_flight.clone(),
    );
    let outcome = Session::new(repo.store().clone())
        .with_lock(name, "delete instance", async |guard| {
            ints.or_try(removal.apply(guard, &events)).await
        })
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
    match report {
        InstanceReport::Metal(report) => {
            drain_status(ctx, &a.node, report.drain.as_ref());
            ctx.printer.success(&format!(
                "Removed {} from {name}{}{}.",
                a.node,
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
            drain_status(ctx, &plan.node, drain.as_ref());
            ctx.printer.success(&format!(
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

fn render_aws_plan(ctx: &Ctx, plan: &AwsRemovalPlan) {
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
    ctx.printer.data(&out);
}
