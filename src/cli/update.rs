//! `kprov update cluster NAME`: the preview, and with `--yes` the apply, of everything the
//! spec asks for: cloud resources (aws), nodes over SSH, then the add-ons. The use case is
//! `ops::update` (the platform chosen there); this file prints its plan, events and report.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use super::commands::Ctx;
use super::commands::{catch_interrupts, interrupted};
use super::{UpdateClusterArgs, UpdatePhase, exit};
use crate::cloud::aws::launch::LaunchEvent;
use crate::cloud::aws::wait::WaitEvent;
use crate::cloud::engine::{self, RenderOptions};
use crate::ops::aws::AwsEvent;
use crate::ops::aws::AwsUpdateOptions;
use crate::ops::interrupt::{Caught, Interrupts};
use crate::ops::session::Session;
use crate::ops::update::{
    self as ops_update, Update, UpdateError, UpdateEvent, UpdateEvents, UpdateOptions, UpdatePlan,
    UpdateReport,
};
use crate::output::{Format, Printer};

pub(super) async fn cluster(ctx: &Ctx, a: &UpdateClusterArgs) -> anyhow::Result<i32> {
    let session = Session::new(ctx.repo().await?.store().clone());
    let update = ops_update::load(session, &a.name, options(a))
        .await
        .map_err(refused)?;
    if update.addons_only() {
        return super::metal::addons_phase(ctx, &update, a).await;
    }
    let name = update.cluster().name();
    if let Some(r) = update.reread() {
        for line in r.change.lines(&r.file) {
            ctx.printer
                .status(&crate::output::untrusted(&line).to_string());
        }
        if let Some((v, at, spec)) = &r.version_differs {
            ctx.printer.warn(
                &crate::output::untrusted(&format!(
                    "kube_version {v} ({at}) differs from the spec's {spec}: `update cluster --inventory` \
             reads hosts only; change the version with `kprov edit cluster {name}` and roll it \
             with `kprov rolling-update cluster {name}`"
                ))
                .to_string(),
            );
        }
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
        a.phase.map(UpdatePhase::flag).unwrap_or_default()
    )
}

/// The plan as one document (docs/plan-json.md): the cloud plan's fields, `nodePlan`,
/// `hostsToRemove` and `refusals`, keys in order.
fn print_document(printer: &Printer, plan: &UpdatePlan) -> anyhow::Result<()> {
    let doc = serde_json::to_value(plan)?;
    match printer.format() {
        Format::Yaml => printer.data(&crate::output::to_yaml(&doc)?),
        _ => printer.data(&serde_json::to_string_pretty(&doc)?),
    }
    Ok(())
}

/// The cloud plan alone: the table, or (`-o json|yaml`) the cloud plan's document.
fn print_plan(printer: &Printer, plan: &engine::Plan, prune: bool) -> anyhow::Result<()> {
    match printer.format() {
        Format::Json => printer.data(&serde_json::to_string_pretty(&serde_json::to_value(plan)?)?),
        Format::Yaml => printer.data(&crate::output::to_yaml(&serde_json::to_value(plan)?)?),
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
    let table = ctx.printer.format() == Format::Table;
    let plan = match update.plan().await {
        Ok(plan) => plan,
        Err(UpdateError::CloudPlan { plan, error }) => {
            print_plan(&ctx.printer, &plan, a.prune)?;
            return Err(refused(UpdateError::CloudPlan { plan, error }));
        }
        Err(UpdateError::NodePlan { cloud, error }) => {
            // On a terminal the cloud plan shows even when the instances cannot be read.
            if table {
                print_plan(&ctx.printer, &cloud, a.prune)?;
            }
            return Err(error);
        }
        Err(e) => return Err(refused(e)),
    };
    if plan.has_cloud {
        cloud_preview(ctx, update.cluster().name(), &plan, a)
    } else {
        super::metal::preview(ctx, update, &plan, a)
    }
}

/// The preview of a platform with cloud resources: the cloud plan, then the node plan of its
/// running instances.
fn cloud_preview(
    ctx: &Ctx,
    name: &str,
    plan: &UpdatePlan,
    a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    let table = ctx.printer.format() == Format::Table;
    if table {
        print_plan(&ctx.printer, &plan.cloud, a.prune)?;
    }
    let cloud_pending = plan.cloud_pending();
    if a.phase == Some(UpdatePhase::Cloud) {
        // The cloud phase contacts no instance: its preview is the cloud plan alone.
        if !table {
            print_document(&ctx.printer, plan)?;
        }
        if cloud_pending {
            ctx.printer.status(&format!(
                "Must specify --yes to apply changes to {name} (--phase cloud: the cloud resources only)."
            ));
        }
        return Ok(if cloud_pending && a.exit_code {
            exit::CHANGES_PENDING
        } else {
            exit::OK
        });
    }
    if table {
        if let Some(n) = &plan.nodes {
            ctx.printer.data(&super::metal::plan_table(n).render());
            for n in n.nodes.iter().filter(|n| n.pending) {
                ctx.printer
                    .status(&format!("{}: {}", n.target, n.reasons.join("; ")));
            }
        }
    } else {
        print_document(&ctx.printer, plan)?;
    }
    // Hosts of another cluster are refused here as metal's preview refuses them.
    if let Some(refusal) = plan.refusals.first() {
        ctx.printer.error(refusal);
        return Ok(exit::ERROR);
    }
    let pending = plan.nodes_pending();
    if let Some(n) = plan.nodes.as_ref().filter(|_| !pending.is_empty()) {
        ctx.printer.status(&format!(
            "{} of {} of {name} {} provisioning ({}).",
            pending.len(),
            plural(n.nodes.len(), "instance"),
            if pending.len() == 1 { "needs" } else { "need" },
            pending.join(", ")
        ));
    }
    let pending = plan.pending();
    if pending {
        ctx.printer
            .status(&format!("Must specify --yes to apply changes to {name}."));
    }
    Ok(if pending && a.exit_code {
        exit::CHANGES_PENDING
    } else {
        exit::OK
    })
}

/// `update cluster --yes`: [`Update::apply`] (under the cluster lock, cut by the first
/// signal), its events printed, then the report and the add-ons.
async fn apply(ctx: &Ctx, update: &Update, a: &UpdateClusterArgs) -> anyhow::Result<i32> {
    let cluster = update.cluster();
    let name = cluster.name();
    super::metal::warn_gone(ctx, name, update.hosts_to_remove());
    let resume = resume_command(name, a);
    let ints = catch_interrupts(name, &resume);
    let in_flight = InFlight::default();
    if let Some(targets) = update.known_targets() {
        in_flight.provisioning(provisioning(targets.len(), update.machine()));
    }
    // The first signal cuts the apply where it waits (SSH, Auto Scaling, a cloud call, a host
    // step): every part of it is safe to run again, which the next run does.
    let outcome = match apply_printing(ctx, update, a, &ints, &in_flight).await? {
        Err(c) => return Ok(interrupted(ctx, name, c, &in_flight.describe(), &resume)),
        Ok(o) => o,
    };
    match outcome {
        UpdateReport::Nodes(nodes) => super::metal::finish(ctx, update, &nodes, a, &ints).await,
        UpdateReport::CloudOnly => {
            ctx.printer.status(&format!(
                "--phase cloud: the instances of {name} were not waited for nor provisioned; next: `kprov update cluster {name} --yes --phase nodes`, then `--phase addons` (or `kprov update cluster {name} --yes` for both)."
            ));
            Ok(exit::OK)
        }
        UpdateReport::NoInstances => {
            ctx.printer.error(&format!(
                "no running instance of {name} was found; nothing was provisioned (are the groups' minSize 0?)"
            ));
            Ok(exit::ERROR)
        }
        UpdateReport::KeyConflicts(conflicts) => {
            for c in &conflicts {
                ctx.printer.error(&c.to_string());
            }
            Ok(exit::ERROR)
        }
    }
}

/// What a signal cuts once the machines are being provisioned.
fn provisioning(machines: usize, machine: &str) -> String {
    format!(
        "provisioning {} (a host step cut short is done again by the next run)",
        plural(machines, machine)
    )
}

/// [`Update::apply`] with its events printed: the cloud plan and a line (or bar step) per
/// finished change, waits per instance, the node progress per host.
async fn apply_printing(
    ctx: &Ctx,
    update: &Update,
    a: &UpdateClusterArgs,
    ints: &Interrupts,
    in_flight: &InFlight,
) -> anyhow::Result<Result<UpdateReport, Caught>> {
    let name = update.cluster().name();
    let printer = &ctx.printer;
    let progress = Mutex::new(None);
    let prune = a.prune;
    let events = |e: &UpdateEvent<'_>| {
        let e = match e {
            UpdateEvent::HostsStored(change) => {
                printer.status(&format!(
                    "Stored the inventory's hosts in the spec of {name} ({} added, {} removed, \
                     {} changed).",
                    change.added.len(),
                    change.removed.len(),
                    change.changed.len()
                ));
                return;
            }
            UpdateEvent::Cloud(e) => e,
        };
        // What a signal would cut, and whether this event says something new (a wait repeats
        // its last error every poll: one line per change, not per instance per second).
        if !in_flight.follow(e) {
            return;
        }
        let mut bar = progress.lock().unwrap_or_else(|p| p.into_inner());
        match e {
            AwsEvent::CloudPlan(plan) => {
                if let Err(e) = print_plan(printer, plan, prune) {
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
    let events: UpdateEvents<'_> = &events;
    let bars = Mutex::new(None);
    let machine = update.machine();
    let result = update
        .apply(ints, events, |t| {
            in_flight.provisioning(provisioning(t.len(), machine));
            let (events, multi) = super::metal::render_events(ctx, t);
            *bars.lock().unwrap_or_else(|p| p.into_inner()) = multi;
            events
        })
        .await;
    if let Some(multi) = bars.into_inner().unwrap_or_else(|p| p.into_inner()) {
        // The final table says it all; finished spinners would only repeat it.
        let _ = multi.clear();
    }
    result.map_err(refused)
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
