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

/// What the engine reports while a run goes on, host by host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The engine starts connecting to the host (its SSH master connection).
    Connecting {
        /// The host's inventory name.
        host: String,
    },
    /// The host's connection is up.
    Connected {
        /// The host's inventory name.
        host: String,
        /// How long connecting took, wall clock.
        duration: Duration,
        /// Where the connection's time went (`ssh -G`, the recorded keys, the first-contact
        /// scan and record, ssh's own connect), each part's own time: some run at once.
        parts: Vec<(&'static str, Duration)>,
    },
    /// A first-contact host key was recorded in the state store (`--accept-new-host-keys`).
    HostKeyRecorded {
        /// The host's inventory name.
        host: String,
        /// The SHA256 fingerprints of the keys recorded.
        fingerprints: Vec<String>,
    },
    /// A file of a step's batch landed and its arrival hook started (`RemoteFile::on_arrival`),
    /// while the batch's next files upload.
    HookStarted {
        /// The host's inventory name.
        host: String,
        /// The step whose file it is.
        step: String,
        /// The file's path on the host.
        path: String,
    },
    /// A step began on the host.
    StepStarted {
        /// The host's inventory name.
        host: String,
        /// The step's name.
        step: String,
        /// 0-based position and number of steps in this run on the host.
        index: usize,
        /// How many steps this run has on the host.
        total: usize,
    },
    /// A step ended on the host, done, already done, or failed.
    StepFinished {
        /// The host's inventory name.
        host: String,
        /// The step's name.
        step: String,
        /// The outcome, or the error message (it quotes the host: shown escaped, one line).
        result: Result<StepOutcome, crate::output::UntrustedText>,
        /// Wall-clock time from the step's start to its end as kprov saw it.
        duration: Duration,
        /// How long the step's check and run took on the host (from its start marker to its
        /// end marker); `duration` also counts, for the first step of a batch, comparing and
        /// uploading the batch's files. None when the step did not start on the host.
        remote: Option<Duration>,
    },
    /// Emitted by [`super::SshFleet::run_all`] when a host is done (or failed).
    HostFinished {
        /// The host's inventory name.
        host: String,
        /// True when every step of the host's run succeeded.
        ok: bool,
        /// The host's whole run, connecting included.
        duration: Duration,
    },
}

/// Receives events from concurrently running hosts; must be cheap and must not block.
pub trait Progress: Send + Sync {
    /// Called for every event, from the task running the host: must not block.
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
    /// One line per event written to `out`.
    pub fn new(out: W) -> Self {
        PlainProgress {
            out: Mutex::new(out),
        }
    }
}

fn plural(steps: usize) -> String {
    if steps == 1 {
        "1 step".to_string()
    } else {
        format!("{steps} steps")
    }
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

impl fmt::Display for Event {
    /// One line: a step's name is shown escaped (it may quote an archive's image names).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::output::untrusted;
        match self {
            Event::Connecting { host } => write!(f, "{host}: connecting"),
            Event::Connected {
                host,
                duration,
                parts,
            } => {
                write!(f, "{host}: connected ({}", ms(*duration))?;
                for (i, (what, took)) in parts.iter().enumerate() {
                    let sep = if i == 0 { ": " } else { ", " };
                    write!(f, "{sep}{what} {}", ms(*took))?;
                }
                write!(f, ")")
            }
            Event::HookStarted { host, step, path } => write!(
                f,
                "{host}: {}: {} landed, its arrival hook started",
                untrusted(step),
                untrusted(path)
            ),
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
            } => write!(f, "{host}: [{}/{total}] {}", index + 1, untrusted(step)),
            Event::StepFinished {
                host,
                step,
                result,
                duration,
                remote,
            } => {
                // `(N ms)`, or `(N ms, M ms on the host)` when files were compared or sent
                // first: the difference is kprov's transfer, the rest the host's own work.
                let took = match remote {
                    Some(r) if r.as_millis() != duration.as_millis() => {
                        format!("{}, {} on the host", ms(*duration), ms(*r))
                    }
                    _ => ms(*duration),
                };
                match result {
                    Ok(StepOutcome::Unchanged) => {
                        write!(f, "{host}: {}: unchanged ({took})", untrusted(step))
                    }
                    Ok(StepOutcome::Changed) => {
                        write!(f, "{host}: {}: changed ({took})", untrusted(step))
                    }
                    Err(e) => write!(f, "{host}: {}: FAILED ({took}): {e}", untrusted(step)),
                }
            }
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
    /// The host's inventory name.
    pub host: String,
    pub(crate) roles: Vec<HostRole>,
    pub(crate) duration: Duration,
    /// Step names with their outcomes, or the error that stopped the host.
    pub result: Result<Vec<(String, StepOutcome)>, ExecError>,
}

impl HostReport {
    /// How many steps changed the host (0 when the host failed).
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
    /// One report per host, in the order the hosts were given.
    pub hosts: Vec<HostReport>,
}

impl Summary {
    /// True when every host ran all its steps.
    pub fn ok(&self) -> bool {
        self.hosts.iter().all(|h| h.result.is_ok())
    }

    /// True when every host succeeded and no step changed anything.
    pub fn converged(&self) -> bool {
        self.ok() && self.hosts.iter().all(|h| h.changed() == 0)
    }

    /// The hosts that failed, each with its error, in the order hosts were given.
    pub fn failures(&self) -> impl Iterator<Item = (&HostReport, &ExecError)> {
        self.hosts
            .iter()
            .filter_map(|h| h.result.as_ref().err().map(|e| (h, e)))
    }

    /// Folds a later phase's summary into this one (provisioning runs phases: common steps on
    /// all hosts, init on the first control plane, joins): per host, steps are appended,
    /// durations added, and a failure ends the host's record. Hosts new in `later` are appended.
    #[cfg(test)]
    pub(crate) fn absorb(&mut self, later: Summary) {
        for report in later.hosts {
            let Some(mine) = self.hosts.iter_mut().find(|h| h.host == report.host) else {
                self.hosts.push(report);
                continue;
            };
            mine.duration += report.duration;
            match (&mut mine.result, report.result) {
                // The host already failed: kprov does not run later phases on it; keep the cause.
                (Err(_), _) => {}
                (Ok(steps), Ok(more)) => steps.extend(more),
                (mine_result @ Ok(_), Err(e)) => *mine_result = Err(e),
            }
        }
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
                        format!("ok, no changes ({})", plural(steps.len()))
                    }
                    Ok(steps) => format!("ok, {} of {} changed", h.changed(), plural(steps.len())),
                    Err(
                        ExecError::Step { step, .. }
                        | ExecError::Timeout { step, .. }
                        | ExecError::ConnectionLost { step, .. },
                    ) => {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn report(
        host: &str,
        roles: Vec<HostRole>,
        secs: u64,
        result: Result<Vec<(String, StepOutcome)>, ExecError>,
    ) -> HostReport {
        HostReport {
            host: host.into(),
            roles,
            duration: Duration::from_millis(secs * 1000 + 250),
            result,
        }
    }

    #[test]
    fn summary_table_lists_every_host_then_every_failure() {
        let steps = |outcomes: &[StepOutcome]| {
            Ok(outcomes
                .iter()
                .enumerate()
                .map(|(i, o)| (format!("step {i}"), o.clone()))
                .collect())
        };
        let summary = Summary {
            hosts: vec![
                report(
                    "cp1",
                    vec![HostRole::ControlPlane, HostRole::Etcd],
                    12,
                    steps(&[StepOutcome::Changed, StepOutcome::Unchanged]),
                ),
                report(
                    "worker-1",
                    vec![HostRole::Node],
                    3,
                    steps(&[StepOutcome::Unchanged]),
                ),
                report(
                    "worker-2",
                    vec![HostRole::Node],
                    4,
                    Err(ExecError::Step {
                        host: "worker-2".into(),
                        step: "kubeadm join".into(),
                        code: Some(1),
                        stderr: "error execution phase preflight: port 10250 is in use".into(),
                    }),
                ),
                report(
                    "worker-3",
                    vec![HostRole::Node],
                    2,
                    Err(ExecError::Connect {
                        host: "worker-3".into(),
                        message: "no route to host".into(),
                    }),
                ),
            ],
        };
        assert!(!summary.ok());
        assert!(!summary.converged());
        assert_eq!(summary.failures().count(), 2);
        insta::assert_snapshot!(summary.to_string());
    }

    #[test]
    fn absorb_joins_phases_per_host() {
        // A host of one role that ran one step.
        let ran = |host: &str, role, secs, step: &str, o| {
            report(host, vec![role], secs, Ok(vec![(step.to_string(), o)]))
        };
        let mut first = Summary {
            hosts: vec![
                ran("cp1", HostRole::ControlPlane, 1, "a", StepOutcome::Changed),
                ran("w1", HostRole::Node, 1, "a", StepOutcome::Unchanged),
            ],
        };
        first.absorb(Summary {
            hosts: vec![
                ran(
                    "cp1",
                    HostRole::ControlPlane,
                    2,
                    "init",
                    StepOutcome::Changed,
                ),
                report(
                    "w1",
                    vec![HostRole::Node],
                    1,
                    Err(ExecError::Timeout {
                        host: "w1".into(),
                        step: "join".into(),
                        timeout: Duration::from_secs(1),
                    }),
                ),
                report("w2", vec![HostRole::Node], 1, Ok(vec![])),
            ],
        });
        let names: Vec<&str> = first.hosts.iter().map(|h| h.host.as_str()).collect();
        assert_eq!(names, ["cp1", "w1", "w2"]);
        let cp1 = &first.hosts[0];
        assert_eq!(cp1.duration, Duration::from_millis(3500));
        let steps: Vec<&str> = cp1
            .result
            .as_ref()
            .unwrap()
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(steps, ["a", "init"]);
        assert!(matches!(
            first.hosts[1].result,
            Err(ExecError::Timeout { .. })
        ));
        assert_eq!(first.failures().count(), 1);
    }

    #[test]
    fn converged_only_when_nothing_changed() {
        let ok = |o: StepOutcome| Summary {
            hosts: vec![report(
                "h",
                vec![HostRole::Node],
                1,
                Ok(vec![("s".into(), o)]),
            )],
        };
        assert!(ok(StepOutcome::Unchanged).converged());
        assert!(!ok(StepOutcome::Changed).converged());
        assert!(ok(StepOutcome::Changed).ok());
    }

    #[test]
    fn plain_progress_writes_one_line_per_event() {
        let p = PlainProgress::new(Vec::new());
        p.event(&Event::StepStarted {
            host: "h1".into(),
            step: "containerd".into(),
            index: 0,
            total: 3,
        });
        p.event(&Event::StepFinished {
            host: "h1".into(),
            step: "containerd".into(),
            result: Err("boom".into()),
            duration: Duration::from_millis(42),
            remote: None,
        });
        p.event(&Event::StepFinished {
            host: "h1".into(),
            step: "images".into(),
            result: Ok(StepOutcome::Changed),
            duration: Duration::from_millis(900),
            remote: Some(Duration::from_millis(600)),
        });
        let out = String::from_utf8(p.out.into_inner().unwrap()).unwrap();
        assert_eq!(
            out,
            "h1: [1/3] containerd\nh1: containerd: FAILED (42 ms): boom\n\
             h1: images: changed (900 ms, 600 ms on the host)\n"
        );
    }
}
