//! `kprov update cluster NAME`: the preview, and with `--yes` the apply, of everything the
//! spec asks for: cloud resources (aws), nodes over SSH (metal), then the add-ons. Thin
//! commands: the use cases are `ops::aws` and `ops::nodes`; this file prints.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use super::commands::Ctx;
use super::commands::{catch_interrupts, interrupted};
use super::{UpdateClusterArgs, UpdatePhase, exit};
use crate::cloud::aws::launch::LaunchEvent;
use crate::cloud::aws::wait::WaitEvent;
use crate::cloud::engine::{self, RenderOptions};
use crate::ops::aws::{self as ops_aws, AwsApplied, AwsEvent, AwsEvents, AwsUpdateOptions};
use crate::ops::session::Session;
use crate::output::{Format, Printer};
use crate::provision::plan::NodePlan;
use crate::spec::{CloudProvider, Cluster, InstanceGroup};
use crate::state::lock;

pub async fn cluster(ctx: &Ctx, a: &UpdateClusterArgs) -> anyhow::Result<i32> {
    let (cluster, groups) = super::addons::resolved(ctx, &a.name).await?;
    let cluster = with_bundle(cluster, a);
    if a.inventory.is_some() && cluster.spec.cloud_provider != CloudProvider::Metal {
        return Err(super::create::FlagError {
            flag: "inventory",
            message: "an inventory is only for a metal cluster's hosts".into(),
        }
        .into());
    }
    if a.refresh_image && cluster.spec.cloud_provider != CloudProvider::Aws {
        return Err(super::create::FlagError {
            flag: "refresh-image",
            message: "images are pinned on AWS only; a metal cluster's hosts are the user's".into(),
        }
        .into());
    }
    match a.phase {
        Some(UpdatePhase::Cloud) if cluster.spec.cloud_provider == CloudProvider::Metal => {
            return Err(super::create::FlagError {
                flag: "phase",
                message: "a metal cluster has no cloud resources; its phases are nodes and addons"
                    .into(),
            }
            .into());
        }
        Some(UpdatePhase::Addons) => return super::metal::addons_phase(ctx, &cluster, a).await,
        _ => {}
    }
    match cluster.spec.cloud_provider {
        CloudProvider::Aws => aws(ctx, &cluster, &groups, a).await,
        CloudProvider::Metal => super::metal::update(ctx, &cluster, &groups, a).await,
    }
}

/// The command that runs this apply again (printed when a signal cuts it).
pub(super) fn resume_command(name: &str, a: &UpdateClusterArgs) -> String {
    format!(
        "kprov update cluster {name} --yes{}",
        a.phase.map(UpdatePhase::flag).unwrap_or_default()
    )
}

/// `--bundle FILE` stands for `spec.assets.bundle` in this run (the stored spec is unchanged).
pub(super) fn with_bundle(cluster: Cluster, a: &UpdateClusterArgs) -> Cluster {
    bundle_for_run(cluster, a.bundle.as_deref())
}

/// `--bundle FILE` of `update` and `rolling-update` as `spec.assets.bundle` for this run.
pub(super) fn bundle_for_run(mut cluster: Cluster, bundle: Option<&std::path::Path>) -> Cluster {
    if let Some(b) = bundle {
        cluster
            .spec
            .assets
            .get_or_insert_with(Default::default)
            .bundle = Some(b.display().to_string());
    }
    cluster
}

/// The cloud plan; `-o json|yaml` documents also carry the node plan of the running instances
/// as `nodePlan` (docs/plan-json.md), absent while no instance runs.
fn print_plan(
    printer: &Printer,
    plan: &engine::Plan,
    nodes: Option<&NodePlan>,
    prune: bool,
) -> anyhow::Result<()> {
    let document = || -> anyhow::Result<serde_json::Value> {
        let mut doc = serde_json::to_value(plan)?;
        if let (Some(n), Some(map)) = (nodes, doc.as_object_mut()) {
            map.insert("nodePlan".into(), serde_json::to_value(n)?);
        }
        Ok(doc)
    };
    match printer.format() {
        Format::Json => printer.data(&serde_json::to_string_pretty(&document()?)?),
        Format::Yaml => printer.data(&crate::output::to_yaml(&document()?)?),
        Format::Table => printer.data(&engine::render_text(
            plan,
            RenderOptions {
                color: printer.color(),
                prune,
            },
        )),
    }
    Ok(())
}

fn options(a: &UpdateClusterArgs) -> AwsUpdateOptions {
    AwsUpdateOptions {
        prune: a.prune,
        ssh_private_address: a.ssh_private_address,
        accept_new_host_keys: a.accept_new_host_keys,
        concurrency: a.concurrency,
        ssh_wait: Some(a.ssh_wait),
        refresh_images: a.refresh_image,
        phase: a.phase.map(UpdatePhase::ops),
    }
}

async fn aws(
    ctx: &Ctx,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    let repo = ctx.repo().await?;
    let store = repo.store().clone();
    if !a.yes {
        let (cloud, plan) =
            ops_aws::plan_refreshing(&store, cluster, groups, a.refresh_image).await?;
        let table = ctx.printer.format() == Format::Table;
        if table {
            // On a terminal the cloud plan shows even when the instances cannot be read.
            print_plan(&ctx.printer, &plan, None, a.prune)?;
        }
        if let Err(e) = plan.check() {
            if !table {
                print_plan(&ctx.printer, &plan, None, a.prune)?;
            }
            return Err(anyhow::Error::new(e).context("planning cloud resources"));
        }
        let cloud_pending = plan.exit_code(a.prune) == exit::CHANGES_PENDING;
        if a.phase == Some(UpdatePhase::Cloud) {
            // The cloud phase contacts no instance: its preview is the cloud plan alone.
            if !table {
                print_plan(&ctx.printer, &plan, None, a.prune)?;
            }
            if cloud_pending {
                ctx.printer.status(&format!(
                    "Must specify --yes to apply changes to {} (--phase cloud: the cloud resources only).",
                    cluster.name()
                ));
            }
            return Ok(if cloud_pending && a.exit_code {
                exit::CHANGES_PENDING
            } else {
                exit::OK
            });
        }
        let nodes = ops_aws::node_plan(&store, &cloud, cluster, groups, &plan, &options(a)).await?;
        if table {
            if let Some(n) = &nodes {
                ctx.printer.data(&super::metal::plan_table(n).render());
                for n in n.nodes.iter().filter(|n| n.pending) {
                    ctx.printer
                        .status(&format!("{}: {}", n.target, n.reasons.join("; ")));
                }
            }
        } else {
            print_plan(&ctx.printer, &plan, nodes.as_ref(), a.prune)?;
        }
        // Hosts of another cluster are refused here as metal's preview refuses them.
        if let Some(refusal) = nodes
            .as_ref()
            .and_then(|n| crate::ops::platform::owned_elsewhere(cluster.name(), n, "instance"))
        {
            ctx.printer.error(&refusal);
            return Ok(exit::ERROR);
        }
        let nodes_pending = match &nodes {
            Some(n) if !n.pending().is_empty() => {
                let pending = n.pending();
                ctx.printer.status(&format!(
                    "{} of {} of {} {} provisioning ({}).",
                    pending.len(),
                    plural(n.nodes.len(), "instance"),
                    cluster.name(),
                    if pending.len() == 1 { "needs" } else { "need" },
                    pending.join(", ")
                ));
                true
            }
            _ => false,
        };
        let pending = cloud_pending || nodes_pending;
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
    let name = cluster.name();
    let resume = resume_command(name, a);
    let ints = catch_interrupts(name, &resume);
    let in_flight = InFlight::default();
    // The first signal cuts the apply where it waits (SSH, Auto Scaling, a cloud call, a host
    // step): every part of it is safe to run again, which the next run does.
    let session = Session::new(store.clone());
    let outcome = session
        .with_lock(name, "update cluster --yes", async |guard| {
            ints.or_try(aws_apply(
                ctx, &store, cluster, groups, a, guard, &in_flight,
            ))
            .await
        })
        .await?;
    let outcome = match outcome {
        Err(c) => return Ok(interrupted(ctx, name, c, &in_flight.describe(), &resume)),
        Ok(o) => o,
    };
    match outcome {
        AwsApplied::Nodes(nodes) => super::metal::finish(ctx, cluster, &nodes, a, &ints).await,
        AwsApplied::CloudOnly => {
            ctx.printer.status(&format!(
                "--phase cloud: the instances of {name} were not waited for nor provisioned; next: `kprov update cluster {name} --yes --phase nodes`, then `--phase addons` (or `kprov update cluster {name} --yes` for both)."
            ));
            Ok(exit::OK)
        }
        AwsApplied::NoInstances => {
            ctx.printer.error(&format!(
                "no running instance of {name} was found; nothing was provisioned (are the groups' minSize 0?)"
            ));
            Ok(exit::ERROR)
        }
        AwsApplied::KeyConflicts(conflicts) => {
            for c in &conflicts {
                ctx.printer.error(&c.to_string());
            }
            Ok(exit::ERROR)
        }
    }
}

/// `ops::aws::apply` with its events printed: the cloud plan and a line (or bar step) per
/// finished change, waits per instance, the node progress as metal shows it.
async fn aws_apply(
    ctx: &Ctx,
    store: &Arc<dyn crate::state::StateStore>,
    cluster: &Cluster,
    groups: &[InstanceGroup],
    a: &UpdateClusterArgs,
    guard: &lock::LockGuard,
    in_flight: &InFlight,
) -> anyhow::Result<AwsApplied> {
    let name = cluster.name();
    let printer = &ctx.printer;
    let progress = Mutex::new(None);
    let prune = a.prune;
    let events = |e: &AwsEvent<'_>| {
        // What a signal would cut, and whether this event says something new (a wait repeats
        // its last error every poll: one line per change, not per instance per second).
        if !in_flight.follow(e) {
            return;
        }
        let mut bar = progress.lock().unwrap_or_else(|p| p.into_inner());
        match e {
            AwsEvent::CloudPlan(plan) => {
                if let Err(e) = print_plan(printer, plan, None, prune) {
                    printer.warn(&format!("printing the plan: {e:#}"));
                }
                *bar = Some(printer.progress(plan.changes.len() as u64, "applying"));
            }
            AwsEvent::CloudUnchanged => {
                printer.success(&format!("No changes to cloud resources of {name}."))
            }
            AwsEvent::CloudChangeDone(line) => match bar.as_ref() {
                Some(p) => p.inc(printer, line),
                None => printer.status(line),
            },
            AwsEvent::CloudApplied { changes } => {
                if let Some(p) = bar.take() {
                    p.finish();
                }
                printer.success(&format!(
                    "Cloud resources of {name} are up to date ({} applied).",
                    plural(*changes, "change")
                ));
            }
            AwsEvent::CloudWaited {
                resource,
                waited,
                why,
            } => printer.status(&format!(
                "{resource}: waited {:.1}s for AWS ({})",
                waited.as_secs_f64(),
                crate::output::untrusted(why)
            )),
            AwsEvent::Stray(s) => printer.warn(&format!(
                "{}: owned by {name} but in no instance group; not provisioned",
                crate::output::untrusted(s)
            )),
            AwsEvent::Wait(WaitEvent::Waiting { instance, last }) => {
                printer.status(&format!("{instance}: waiting for SSH ({last})"))
            }
            AwsEvent::Wait(WaitEvent::Answering { instance, banner }) => {
                printer.status(&format!("{instance}: answering ({banner})"))
            }
            AwsEvent::Wait(WaitEvent::Deferred { instance }) => {
                printer.status(&format!("{instance}: reached through the bastion"))
            }
            AwsEvent::Launch(LaunchEvent::Waiting {
                group,
                ready,
                desired,
            }) => printer.status(&format!(
                "{group}: {ready} of {} launched by Auto Scaling",
                plural(*desired, "instance")
            )),
            AwsEvent::Launch(LaunchEvent::Failed { group, reason }) => {
                printer.warn(&format!("{group}: a launch failed (Auto Scaling retries): {reason}"))
            }
            AwsEvent::Launch(LaunchEvent::Launched { waited }) => printer.status(&format!(
                "every group launched its instances (waited {}s for Auto Scaling)",
                waited.as_secs()
            )),
            AwsEvent::LaunchLate(s, waited) => printer.error(&format!(
                "{}: {} of {} after {}s{}; provisioning those there are (re-run `kprov update cluster {name} --yes` once the group has launched)",
                s.group,
                s.ready,
                plural(s.desired, "instance"),
                waited.as_secs(),
                s.last_failure
                    .as_ref()
                    .map(|r| format!("; last failed launch: {r}"))
                    .unwrap_or_default()
            )),
            AwsEvent::NotAnswering {
                instance,
                last,
                waited,
            } => printer.error(&format!(
                "{instance}: not answering SSH after {}s: {last}",
                waited.as_secs()
            )),
        }
    };
    let events: AwsEvents<'_> = &events;
    let bars = Mutex::new(None);
    let result = ops_aws::apply(store, cluster, groups, guard, &options(a), events, |t| {
        in_flight.provisioning(format!(
            "provisioning {} (a host step cut short is done again by the next run)",
            plural(t.len(), "instance")
        ));
        let (events, multi) = super::metal::render_events(ctx, t);
        *bars.lock().unwrap_or_else(|p| p.into_inner()) = multi;
        events
    })
    .await;
    if let Some(multi) = bars.into_inner().unwrap_or_else(|p| p.into_inner()) {
        let _ = multi.clear();
    }
    result
}

/// `delete cluster` for aws: every owned resource, in reverse dependency order.
pub(super) use crate::output::plural;

/// What an AWS apply is doing now, for the message of a signal that cuts it; and the last
/// wait line printed per instance, so that a wait prints a line per change only.
#[derive(Default)]
struct InFlight {
    phase: Mutex<String>,
    /// Instance -> the "waiting for SSH" causes printed for it (a wait that alternates
    /// between two causes says each once).
    waiting: Mutex<BTreeMap<String, BTreeSet<String>>>,
}

impl InFlight {
    fn set(&self, phase: String) {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner()) = phase;
    }

    fn describe(&self) -> String {
        let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if !waiting.is_empty() {
            let names: Vec<&str> = waiting.keys().map(String::as_str).collect();
            return format!("waiting for SSH on {}", names.join(", "));
        }
        let phase = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        if phase.is_empty() {
            "planning cloud resources".to_string()
        } else {
            phase.clone()
        }
    }

    /// Follows `e`; false when it only repeats what was printed (the same instance still
    /// waiting for a cause already said).
    fn follow(&self, e: &AwsEvent<'_>) -> bool {
        let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let phase = match e {
            AwsEvent::Wait(WaitEvent::Waiting { instance, last }) => {
                if !waiting
                    .entry(instance.clone())
                    .or_default()
                    .insert(wait_reason(&last.to_string()))
                {
                    return false;
                }
                None
            }
            AwsEvent::Wait(WaitEvent::Answering { instance, .. })
            | AwsEvent::Wait(WaitEvent::Deferred { instance })
            | AwsEvent::NotAnswering { instance, .. } => {
                waiting.remove(instance);
                None
            }
            AwsEvent::CloudPlan(plan) => Some(format!(
                "applying {}",
                plural(plan.changes.len(), "cloud change")
            )),
            AwsEvent::CloudUnchanged | AwsEvent::CloudApplied { .. } => {
                Some("waiting for Auto Scaling to launch the instances".into())
            }
            AwsEvent::Launch(LaunchEvent::Waiting {
                group,
                ready,
                desired,
            }) => Some(format!(
                "waiting for Auto Scaling: {group} has {ready} of {}",
                plural(*desired, "instance")
            )),
            _ => None,
        };
        drop(waiting);
        if let Some(p) = phase {
            self.set(p);
        }
        true
    }

    /// The waits are over: the nodes are provisioned now.
    fn provisioning(&self, phase: String) {
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.set(phase);
    }
}

/// A wait's error without what changes at every attempt (elapsed seconds), so that the same
/// cause is recognised as the same.
fn wait_reason(last: &str) -> String {
    let mut out = String::with_capacity(last.len());
    let mut chars = last.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            while chars.peek().is_some_and(|c| c.is_ascii_digit()) {
                chars.next();
            }
            // Elapsed seconds ("3s", "(12s)") change every poll; the rest is the cause.
            if chars.peek() == Some(&'s') {
                chars.next();
                out.push_str("Ns");
                continue;
            }
            out.push('#');
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(instance: &str, last: &str) -> AwsEvent<'static> {
        AwsEvent::Wait(WaitEvent::Waiting {
            instance: instance.into(),
            last: last.into(),
        })
    }

    #[test]
    fn the_ssh_wait_says_each_cause_once_per_instance_and_what_a_signal_cuts() {
        let f = InFlight::default();
        assert_eq!(f.describe(), "planning cloud resources");
        assert!(f.follow(&AwsEvent::CloudUnchanged));
        assert_eq!(
            f.describe(),
            "waiting for Auto Scaling to launch the instances"
        );
        // 150 polls of two silent instances: two lines, then one per new cause.
        let mut printed = 0;
        for _ in 0..150 {
            for i in ["i-1", "i-2"] {
                printed += usize::from(f.follow(&waiting(i, "no answer within 2s")));
            }
        }
        assert_eq!(printed, 2);
        assert!(f.follow(&waiting("i-1", "connect: No route to host (os error 113)")));
        assert!(!f.follow(&waiting("i-1", "no answer within 2s")));
        assert_eq!(f.describe(), "waiting for SSH on i-1, i-2");
        assert!(f.follow(&AwsEvent::Wait(WaitEvent::Answering {
            instance: "i-1".into(),
            banner: "SSH-2.0-OpenSSH_9.6".into(),
        })));
        assert_eq!(f.describe(), "waiting for SSH on i-2");
        f.provisioning("provisioning 2 instances".into());
        assert_eq!(f.describe(), "provisioning 2 instances");
    }

    #[test]
    fn elapsed_seconds_do_not_make_a_cause_new() {
        assert_eq!(
            wait_reason("waiting for SSH at 198.18.0.4 (12s)"),
            wait_reason("waiting for SSH at 198.18.0.4 (14s)")
        );
        assert_ne!(wait_reason("connect: refused"), wait_reason("no answer"));
        assert_eq!(plural(1, "node"), "1 node");
        assert_eq!(plural(3, "node"), "3 nodes");
    }
}
