//! What kprov says about a signal that cuts a command holding a cluster's lock. These go to
//! stderr whatever `-o` says (a printer of its own: the listener outlives the command's).

use crate::ops::interrupt::Caught;
use crate::output::{Format, Printer};

/// The first signal: what happens now.
pub(crate) fn first(cluster: &str, c: Caught) {
    Printer::new(Format::Table, 0).warn(&format!(
        "{c}: stopping what is in flight and releasing the lock of {cluster} \
         ({} again exits at once)",
        match c {
            Caught::Interrupt => "Ctrl-C",
            Caught::Terminate => "a signal",
        }
    ))
}

/// The second signal: kprov exits at once, the lock left to its lease.
pub(crate) fn second(cluster: &str, c: Caught, resume: &str) {
    Printer::new(Format::Table, 0).error(&format!(
        "interrupted twice ({c}): exiting now; the lock of {cluster} stays held until its lease \
         expires (or `kprov lock break {cluster}`), then `{resume}` resumes"
    ));
}

/// Signals cannot be caught here.
pub(crate) fn not_caught(why: &str) {
    Printer::new(Format::Table, 0).warn(&format!(
        "Ctrl-C cannot be caught ({why}): an interrupt ends kprov where it is"
    ));
}

/// After a command stopped for signal `c` with its lock released: what was in flight, how to
/// resume.
pub(crate) fn interrupted(
    printer: &Printer,
    cluster: &str,
    c: Caught,
    in_flight: &str,
    resume: &str,
) {
    printer.error(&format!(
        "interrupted by {c} while {in_flight}; the lock of {cluster} is released"
    ));
    printer.status(&format!("Resume with `{resume}`."));
}
