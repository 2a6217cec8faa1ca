//! `delete cluster`'s views: the plan (the machines, the store's objects, the etcd
//! backups) and the report.

use crate::ops::delete::{
    DeleteError, DeletePlan, DeleteReport, HostsReset, Machines, MachinesGone,
};
use crate::output::{Printer, plural, untrusted};

/// The preview of `delete cluster`.
pub(crate) fn plan(printer: &Printer, location: &str, plan: &DeletePlan) {
    let name = plan.cluster();
    match plan {
        DeletePlan::BackupsOnly { count, prefix, .. } => {
            printer.data(&format!(
                "Will delete {} of the deleted cluster {name} under {prefix}.",
                plural(*count, "etcd backup object")
            ));
            printer.status(&format!(
                "Must specify --yes to delete the backups of {name}."
            ));
        }
        DeletePlan::Unreadable {
            keys,
            at_config,
            why,
            ..
        } => {
            let mut lines: Vec<String> =
                keys.iter().map(|k| format!("  {}", untrusted(k))).collect();
            if let Some((config, what)) = at_config {
                lines.push(format!("  {config} ({what})"));
            }
            printer.data(&format!(
                "Will delete the objects of cluster {name} from {}:\n{}",
                location,
                lines.join("\n")
            ));
            printer.warn(&format!(
                "the spec of cluster {name} cannot be read ({why}); kprov cannot tell which cloud \
                 resources or hosts it had, so --yes removes only its objects in the state store. \
                 Delete its cloud resources or reset its hosts yourself if it had any."
            ));
            printer.status(&format!("Must specify --yes to delete cluster {name}."));
        }
        DeletePlan::Cluster(t) => {
            match &t.machines {
                None => {}
                Some(Machines::Aws(cloud)) => printer.data(&crate::cloud::engine::render_text(
                    cloud,
                    crate::cloud::engine::RenderOptions {
                        color: printer.color(),
                        prune: true,
                    },
                )),
                Some(Machines::Metal { hosts, dropped }) => {
                    printer.data(&super::nodes::reset_preview(name, hosts, dropped))
                }
            }
            printer.data(&format!(
                "Will delete cluster {name} from {}:\n{}",
                location,
                t.keys
                    .iter()
                    .map(|k| format!("  {}", untrusted(k)))
                    .collect::<Vec<_>>()
                    .join("\n")
            ));
            if let Some(line) = backups_said(name, t.backups.as_ref(), t.delete_backups, false) {
                printer.status(&line);
            }
            printer.status(&format!("Must specify --yes to delete cluster {name}."));
        }
    }
}

/// What `delete cluster --yes` did (`location`: the store's).
pub(crate) fn report(
    printer: &Printer,
    name: &str,
    location: &str,
    plan: &DeletePlan,
    report: DeleteReport,
) {
    match report {
        DeleteReport::BackupsOnly { deleted } => {
            if let DeletePlan::BackupsOnly { prefix, .. } = &plan {
                printer.success(&format!(
                    "Deleted {} of {name} under {prefix}.",
                    plural(deleted, "etcd backup object")
                ));
            }
        }
        DeleteReport::Unreadable { deleted } => printer.success(&format!(
            "Deleted the unreadable cluster {name} ({}) from {}; no cloud resource or host was touched.",
            plural(deleted, "object"),
            location
        )),
        DeleteReport::Cluster { machines, objects } => {
            match machines {
                MachinesGone::Aws { deleted } => printer
                    .success(&format!("Deleted {deleted} cloud resources of {name}.")),
                MachinesGone::Metal { warnings, reset } => {
                    for w in &warnings {
                        printer.warn(w);
                    }
                    match reset {
                        HostsReset::NothingClaimed(why) => {
                            printer.warn(&format!("{why}: no host to reset"))
                        }
                        HostsReset::Reset { reset, of } => printer.success(&format!(
                            "Reset {reset} of {} of {name}.",
                            plural(of, "host")
                        )),
                    }
                }
            }
            printer.success(&format!(
                "Deleted cluster {name} ({}) from {}.",
                plural(objects, "object"),
                location
            ));
            if let DeletePlan::Cluster(t) = &plan
                && let Some(line) = backups_said(name, t.backups.as_ref(), t.delete_backups, true)
            {
                printer.status(&line);
            }
        }
    }
}

/// What happens to the etcd backups of a deleted cluster (`done`: after the delete).
fn backups_said(
    name: &str,
    backups: Option<&(usize, String)>,
    delete_backups: bool,
    done: bool,
) -> Option<String> {
    let (n, where_) = backups?;
    let objects = plural(*n, "etcd backup object");
    Some(match (delete_backups, done) {
        (true, false) => format!("Will delete {objects} under {where_} too (--delete-backups)."),
        (true, true) => format!("Deleted {objects} under {where_} (--delete-backups)."),
        (false, false) => format!(
            "Will keep {objects} under {where_}: `kprov get backups {name}` lists them, a cluster created again as {name} can `kprov restore etcd` from them; `--delete-backups` deletes them too."
        ),
        (false, true) => format!(
            "Kept {objects} under {where_}: `kprov get backups {name}` lists them; `kprov delete cluster {name} --yes --delete-backups` deletes them."
        ),
    })
}

/// Before a refusal is reported: the warnings of hosts left alone.
pub(crate) fn not_deleted(printer: &Printer, e: &DeleteError) {
    if let DeleteError::HostsNotReset { warnings, .. } = e {
        for w in warnings {
            printer.warn(w);
        }
    }
}
