//! What the engine reports while it runs, and the summary of a fleet run.
//!
//! The engine only emits [`Event`]s; rendering belongs to the caller (bars on a terminal, plain
//! lines otherwise). [`PlainProgress`] is the line-based default.

use std::fmt;
use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use crate::spec::HostRole;

use super::task::{ExecError, StepOutcome};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Connecting {
        host: String,
    },
    Connected {
        host: String,
        duration: Duration,
    },
    /// A first-contact host key was recorded in the state store (`--accept-new-host-keys`).
    HostKeyRecorded {
        host: String,
        fingerprints: Vec<String>,
    },
    StepStarted {
        host: String,
        step: String,
        /// 0-based position and number of steps in this run on the host.
        index: usize,
        total: usize,
    },
    StepFinished {
        host: String,
        step: String,
        /// The outcome, or the error message.
        result: Result<StepOutcome, String>,
        duration: Duration,
    },
    /// Emitted by [`super::SshFleet::run_all`] when a host is done (or failed).
    HostFinished {
        host: String,
        ok: bool,
        duration: Duration,
    },
}

/// Receives events from concurrently running hosts; must be cheap and must not block.
pub trait Progress: Send + Sync {
    fn event(&self, event: &Event);
}

/// Ignores everything (library use, tests).
#[derive(Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn event(&self, _: &Event) {}
}

/// One line per event, for logs and non-terminal output.
pub struct PlainProgress<W: Write + Send> {
    out: Mutex<W>,
}

impl<W: Write + Send> PlainProgress<W> {
    pub fn new(out: W) -> Self {
        PlainProgress {
            out: Mutex::new(out),
        }
    }
}

impl PlainProgress<std::io::Stderr> {
    pub fn stderr() -> Self {
        PlainProgress::new(std::io::stderr())
    }
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Connecting { host } => write!(f, "{host}: connecting"),
            Event::Connected { host, duration } => {
                write!(f, "{host}: connected ({})", ms(*duration))
            }
            Event::HostKeyRecorded { host, fingerprints } => write!(
                f,
                "{host}: new host key recorded: {}",
                fingerprints.join(", ")
            ),
            Event::StepStarted {
                host,
                step,
                index,
                total,
            } => write!(f, "{host}: [{}/{total}] {step}", index + 1),
            Event::StepFinished {
                host,
                step,
                result,
                duration,
            } => match result {
                Ok(StepOutcome::Unchanged) => {
                    write!(f, "{host}: {step}: unchanged ({})", ms(*duration))
                }
                Ok(StepOutcome::Changed) => {
                    write!(f, "{host}: {step}: changed ({})", ms(*duration))
                }
                Err(e) => write!(f, "{host}: {step}: FAILED ({}): {e}", ms(*duration)),
            },
            Event::HostFinished { host, ok, duration } => write!(
                f,
                "{host}: {} ({})",
                if *ok { "done" } else { "FAILED" },
                ms(*duration)
            ),
        }
    }
}

impl<W: Write + Send> Progress for PlainProgress<W> {
    fn event(&self, event: &Event) {
        if let Ok(mut out) = self.out.lock() {
            // Progress output is best effort: a closed stderr must not fail the run.
            let _ = writeln!(out, "{event}");
        }
    }
}

/// How one host's run ended.
#[derive(Debug)]
pub struct HostReport {
    pub host: String,
    pub roles: Vec<HostRole>,
    pub duration: Duration,
    /// Step names with their outcomes, or the error that stopped the host.
    pub result: Result<Vec<(String, StepOutcome)>, ExecError>,
}

impl HostReport {
    pub fn changed(&self) -> usize {
        self.result.as_ref().map_or(0, |steps| {
            steps
                .iter()
                .filter(|(_, o)| *o == StepOutcome::Changed)
                .count()
        })
    }
}

/// The final table of a fleet run, in the order hosts were given.
#[derive(Debug)]
pub struct Summary {
    pub hosts: Vec<HostReport>,
}

impl Summary {
    pub fn ok(&self) -> bool {
        self.hosts.iter().all(|h| h.result.is_ok())
    }

    /// True when every host succeeded and no step changed anything.
    pub fn converged(&self) -> bool {
        self.ok() && self.hosts.iter().all(|h| h.changed() == 0)
    }

    pub fn failures(&self) -> impl Iterator<Item = (&HostReport, &ExecError)> {
        self.hosts
            .iter()
            .filter_map(|h| h.result.as_ref().err().map(|e| (h, e)))
    }
}

/// Plain table: host, roles, result, duration; then each failure in full.
impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows: Vec<[String; 4]> = self
            .hosts
            .iter()
            .map(|h| {
                let roles: Vec<&str> = h.roles.iter().map(|r| r.as_str()).collect();
                let result = match &h.result {
                    Ok(steps) if h.changed() == 0 => {
                        format!("ok, unchanged ({} steps)", steps.len())
                    }
                    Ok(steps) => format!("ok, {} of {} steps changed", h.changed(), steps.len()),
                    Err(ExecError::Step { step, .. } | ExecError::Timeout { step, .. }) => {
                        format!("FAILED at {step:?}")
                    }
                    Err(_) => "FAILED".to_string(),
                };
                [
                    h.host.clone(),
                    roles.join(","),
                    result,
                    format!("{:.1}s", h.duration.as_secs_f64()),
                ]
            })
            .collect();
        let header = ["HOST", "ROLES", "RESULT", "DURATION"].map(String::from);
        let mut widths = header.clone().map(|h| h.len());
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        for r in std::iter::once(&header).chain(&rows) {
            let line = r
                .iter()
                .zip(widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect::<Vec<_>>()
                .join("  ");
            writeln!(f, "{}", line.trim_end())?;
        }
        for (_, e) in self.failures() {
            writeln!(f, "\nerror: {e}")?;
        }
        Ok(())
    }
}
