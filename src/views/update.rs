//! `update cluster`'s views: the cloud plan (text or document), the previews (a platform
//! with cloud resources: the cloud plan, then its instances' node plan; one without: the
//! hosts' node plan), the AWS apply's events and what a signal cuts, the outcomes that
//! provisioned nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;

use super::Shown;
use crate::cloud::aws::launch::LaunchEvent;
use crate::cloud::aws::wait::WaitEvent;
use crate::cloud::engine::{self, RenderOptions};
use crate::ops::aws::AwsEvent;
use crate::ops::update::{UpdateEvent, UpdatePlan, UpdateReport};
use crate::output::{Format, Printer, Progress, plural, untrusted};
use crate::provision::plan::Action;

/// The plan as one document (docs/plan-json.md): the cloud plan's fields, `nodePlan`,
/// `hostsToRemove` and `refusals`, keys in order.
pub(crate) fn plan_document(printer: &Printer, plan: &UpdatePlan) -> anyhow::Result<()> {
    let doc = serde_json::to_value(plan)?;
    match printer.format() {
        Format::Yaml => printer.data(&crate::output::to_yaml(&doc)?),
        _ => printer.data(&serde_json::to_string_pretty(&doc)?),
    }
    Ok(())
}

/// The cloud plan alone: the table, or (`-o json|yaml`) the cloud plan's document.
pub(crate) fn cloud_plan(
    printer: &Printer,
    plan: &engine::Plan,
    prune: bool,
) -> anyhow::Result<()> {
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

/// The lines `update cluster` prints when it reads the inventory again: the hosts' changes,
/// and a `kube_version` that differs from the spec's.
pub(crate) fn reread(printer: &Printer, name: &str, r: &crate::ops::update::Reread) {
    for line in r.change.lines(&r.file) {
        printer.status(&untrusted(&line).to_string());
    }
    if let Some((v, at, spec)) = &r.version_differs {
        printer.warn(
            &untrusted(&format!(
                "kube_version {v} ({at}) differs from the spec's {spec}: `update cluster --inventory` \
         reads hosts only; change the version with `kprov edit cluster {name}` and roll it \
         with `kprov rolling-update cluster {name}`"
            ))
            .to_string(),
        );
    }
}

/// The preview of a platform with cloud resources: the cloud plan, then the node plan of its
/// running instances (`cloud_phase`: `--phase cloud`, the cloud plan alone).
pub(crate) fn cloud_preview(
    printer: &Printer,
    name: &str,
    plan: &UpdatePlan,
    prune: bool,
    cloud_phase: bool,
) -> anyhow::Result<Shown> {
    let table = printer.format() == Format::Table;
    if table {
        cloud_plan(printer, &plan.cloud, prune)?;
    }
    let cloud_pending = plan.cloud_pending();
    if cloud_phase {
        // The cloud phase contacts no instance: its preview is the cloud plan alone.
        if !table {
            plan_document(printer, plan)?;
        }
        if cloud_pending {
            printer.status(&format!(
                "Must specify --yes to apply changes to {name} (--phase cloud: the cloud resources only)."
            ));
        }
        return Ok(if cloud_pending {
            Shown::Pending
        } else {
            Shown::UpToDate
        });
    }
    if table {
        if let Some(n) = &plan.nodes {
            printer.data(&super::nodes::plan_table(n).render());
            for n in n.nodes.iter().filter(|n| n.pending) {
                printer.status(&format!("{}: {}", n.target, n.reasons.join("; ")));
            }
        }
    } else {
        plan_document(printer, plan)?;
    }
    // Hosts of another cluster are refused here as metal's preview refuses them.
    if let Some(refusal) = plan.refusals.first() {
        printer.error(refusal);
        return Ok(Shown::Refused);
    }
    let pending = plan.nodes_pending();
    if let Some(n) = plan.nodes.as_ref().filter(|_| !pending.is_empty()) {
        let of = format!("{} of {name}", plural(n.nodes.len(), "instance"));
        printer.status(&format!("{}.", needs_provisioning(&pending, &of)));
    }
    let pending = plan.pending();
    if pending {
        printer.status(&format!("Must specify --yes to apply changes to {name}."));
    }
    Ok(if pending {
        Shown::Pending
    } else {
        Shown::UpToDate
    })
}

/// The preview of a platform without cloud resources (metal): the node plan of its hosts,
/// the hosts to remove and the inventory's changes to the spec (`inventory`: the flag).
pub(crate) fn hosts_preview(
    printer: &Printer,
    name: &str,
    plan: &UpdatePlan,
    gone: &[crate::spec::Host],
    inventory: Option<&Path>,
) -> anyhow::Result<Shown> {
    let shown = node_preview(printer, name, plan)?;
    super::nodes::warn_gone(printer, name, gone);
    if plan.spec_changes {
        printer.status(&format!(
            "The spec's hosts would change: `kprov update cluster {name} --inventory {} \
             --yes` stores them and provisions the new ones.",
            inventory.unwrap_or(Path::new("")).display()
        ));
    }
    Ok(match shown {
        Shown::UpToDate if plan.pending() => Shown::Pending,
        s => s,
    })
}

fn node_preview(printer: &Printer, name: &str, update: &UpdatePlan) -> anyhow::Result<Shown> {
    let Some(plan) = &update.nodes else {
        return Ok(Shown::UpToDate);
    };
    match printer.format() {
        Format::Json => printer.data(&serde_json::to_string_pretty(&serde_json::to_value(
            update,
        )?)?),
        Format::Yaml => printer.data(&crate::output::to_yaml(&serde_json::to_value(update)?)?),
        Format::Table => {
            printer.data(&super::nodes::plan_table(plan).render());
            for src in &plan.sources {
                printer.status(&src.describe());
            }
            for n in &plan.nodes {
                if n.pending || matches!(n.action, Action::Refused | Action::PendingRoll) {
                    printer.status(&format!("{}: {}", n.target, n.reasons.join("; ")));
                }
            }
        }
    }
    if let Some(refusal) = update.refusals.first() {
        printer.error(refusal);
        return Ok(Shown::Refused);
    }
    let pending = plan.pending();
    if pending.is_empty() {
        printer.status(&format!(
            "Every host of {name} is a member; `--yes` re-checks each step and changes only what drifted."
        ));
        return Ok(Shown::UpToDate);
    }
    printer.status(&format!(
        "{}. Must specify --yes to provision {name}.",
        needs_provisioning(&pending, &plural(plan.nodes.len(), "host"))
    ));
    Ok(Shown::Pending)
}

/// What a signal cuts once the machines are being provisioned.
pub(crate) fn provisioning(machines: usize, machine: &str) -> String {
    format!(
        "provisioning {} (a host step cut short is done again by the next run)",
        plural(machines, machine)
    )
}

/// An apply that provisioned no machine, as said; false when that is a failure. `None` for
/// [`UpdateReport::Nodes`] (the node report's own view).
pub(crate) fn unprovisioned(printer: &Printer, name: &str, report: &UpdateReport) -> Option<bool> {
    match report {
        UpdateReport::Nodes(_) => None,
        UpdateReport::CloudOnly => {
            printer.status(&format!(
                "--phase cloud: the instances of {name} were not waited for nor provisioned; next: `kprov update cluster {name} --yes --phase nodes`, then `--phase addons` (or `kprov update cluster {name} --yes` for both)."
            ));
            Some(true)
        }
        UpdateReport::NoInstances => {
            printer.error(&format!(
                "no running instance of {name} was found; nothing was provisioned (are the groups' minSize 0?)"
            ));
            Some(false)
        }
        UpdateReport::KeyConflicts(conflicts) => {
            for c in conflicts {
                printer.error(&c.to_string());
            }
            Some(false)
        }
    }
}

/// The apply's events printed: the cloud plan and a line (or bar step) per finished change,
/// waits per instance (a line per new cause), the inventory's hosts stored.
pub(crate) struct ApplyEvents<'a> {
    printer: &'a Printer,
    name: &'a str,
    prune: bool,
    in_flight: &'a InFlight,
    bar: Mutex<Option<Progress>>,
}

impl<'a> ApplyEvents<'a> {
    pub(crate) fn new(
        printer: &'a Printer,
        name: &'a str,
        prune: bool,
        in_flight: &'a InFlight,
    ) -> Self {
        ApplyEvents {
            printer,
            name,
            prune,
            in_flight,
            bar: Mutex::new(None),
        }
    }

    pub(crate) fn show(&self, e: &UpdateEvent<'_>) {
        let (printer, name) = (self.printer, self.name);
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
        if !self.in_flight.follow(e) {
            return;
        }
        let mut bar = self.bar.lock().unwrap_or_else(|p| p.into_inner());
        match e {
            AwsEvent::CloudPlan(plan) => {
                if let Err(e) = cloud_plan(printer, plan, self.prune) {
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
                untrusted(why)
            )),
            AwsEvent::Stray(s) => printer.warn(&format!(
                "{}: owned by {name} but in no instance group; not provisioned",
                untrusted(s)
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
                    .unwrap_or_default() // no failed launch: no suffix
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
    }
}

/// What an AWS apply is doing now, for the message of a signal that cuts it; and the last
/// wait line printed per instance, so that a wait prints a line per change only.
#[derive(Default)]
pub(crate) struct InFlight {
    phase: Mutex<String>,
    /// Instance -> the "waiting for SSH" causes printed for it (a wait that alternates
    /// between two causes says each once).
    waiting: Mutex<BTreeMap<String, BTreeSet<String>>>,
}

impl InFlight {
    fn set(&self, phase: String) {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner()) = phase;
    }

    pub(crate) fn describe(&self) -> String {
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
    pub(crate) fn follow(&self, e: &AwsEvent<'_>) -> bool {
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
    pub(crate) fn provisioning(&self, phase: String) {
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

/// `2 of 3 hosts need provisioning (a, b)`: which of the machines (`of`) a plan would provision.
fn needs_provisioning(pending: &[&str], of: &str) -> String {
    format!(
        "{} of {of} {} provisioning ({})",
        pending.len(),
        if pending.len() == 1 { "needs" } else { "need" },
        pending.join(", ")
    )
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
