//! Fault injection: kprov keeps its promises when connections break, hosts vanish, kprov itself
//! is killed, state-store writes fail half-way and the AWS API throttles. What each test
//! injects and what it asserts is summarised in docs/faults.md, with the figures.
//!
//! Every injected fault is chosen from a fixed seed and every wait is bounded, so a run is
//! repeatable; each test prints one `FAULTS` line with its figures (`--nocapture` shows them).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kprov::spec::{Host, HostRole};
use kprov::ssh::task::{ExecError, RemoteFile, Step, StepOutcome};
use kprov::ssh::{NoProgress, SshFleet, SshOptions, Summary};

use crate::support::memstate::MemStore;
use crate::support::testhosts::{TestHost, TestHosts};

const CLUSTER: &str = "faults.example.com";

/// A small deterministic generator (xorshift64*): the tests' only source of randomness, so a
/// seed names a run exactly.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
}

fn figures(class: &str, text: &str) {
    println!("FAULTS {class}: {text}");
}

/// Polls `cond` every 10 ms for at most `limit`; false when it never held.
fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

// ---------------------------------------------------------------------------------------------
// SSH: connections killed mid-step, hosts that vanish or reboot.

fn fleet_hosts(th: &TestHosts) -> Vec<Host> {
    th.hosts
        .iter()
        .map(|h| Host {
            name: h.name.clone(),
            address: h.address.clone(),
            ip: None,
            access_ip: None,
            user: Some("root".into()),
            port: Some(h.port),
            key_path: Some(th.client_key.display().to_string()),
            bastion: None,
            roles: vec![HostRole::Node],
            labels: Default::default(),
            taints: Vec::new(),
        })
        .collect()
}

fn new_fleet(th: &TestHosts, store: &Arc<MemStore>, connect_timeout: Duration) -> SshFleet {
    let options = SshOptions {
        accept_new_host_keys: true,
        connect_timeout,
        ..SshOptions::default()
    };
    SshFleet::new(
        CLUSTER,
        fleet_hosts(th),
        store.clone(),
        options,
        Arc::new(NoProgress),
    )
    .expect("fleet")
}

/// Three idempotent steps; the middle one runs `sleep` long enough to be interrupted.
fn steps(long: Duration, timeout: Duration) -> Vec<Step> {
    vec![
        Step {
            name: "write config".into(),
            files: vec![RemoteFile {
                path: "/etc/kprov-faults/app.conf".into(),
                content: Bytes::from(vec![b'c'; 64 * 1024]),
                mode: 0o644,
            }],
            check: None,
            run: String::new(),
            timeout,
        },
        Step {
            name: "long work".into(),
            files: Vec::new(),
            check: Some("[ -f /etc/kprov-faults/long-done ]".into()),
            run: format!(
                "sleep {}; touch /etc/kprov-faults/long-done",
                long.as_secs_f64()
            ),
            timeout,
        },
        Step {
            name: "after".into(),
            files: Vec::new(),
            check: Some("[ -f /etc/kprov-faults/after ]".into()),
            run: "touch /etc/kprov-faults/after".into(),
            timeout,
        },
    ]
}

fn work(th: &TestHosts, steps: &[Step]) -> Vec<(String, Vec<Step>)> {
    th.hosts
        .iter()
        .map(|h| (h.name.clone(), steps.to_vec()))
        .collect()
}

fn result_of<'s>(
    summary: &'s Summary,
    host: &str,
) -> &'s Result<Vec<(String, StepOutcome)>, ExecError> {
    &summary
        .hosts
        .iter()
        .find(|h| h.host == host)
        .unwrap_or_else(|| panic!("{host} not in {summary}"))
        .result
}

/// True once `host` runs the long step's `sleep`.
fn sleeping(host: &TestHost) -> bool {
    host.processes().iter().any(|p| p == "sleep")
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The operator-side ssh master of `fleet` for `address` (started by this test's fleet: its
/// command line names the fleet's private control directory).
fn master_pid(fleet: &SshFleet, address: &str) -> Option<u32> {
    let dir = fleet.control_dir().display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_master = args.first().is_some_and(|a| a.ends_with("ssh"))
            && args.iter().any(|a| a.contains(&dir))
            && args.iter().any(|a| a == address);
        is_master.then_some(pid)
    })
}

fn kill(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

/// Asserts that the failure of `host` names the host and the step, and is one of the kinds a
/// broken connection can produce.
#[track_caller]
fn assert_step_failure(summary: &Summary, host: &str, step: &str) -> String {
    let err = match result_of(summary, host) {
        Ok(_) => panic!("{host} should have failed:\n{summary}"),
        Err(e) => e,
    };
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            ExecError::ConnectionLost { .. } | ExecError::Step { .. } | ExecError::Timeout { .. }
        ),
        "{msg}"
    );
    assert!(
        msg.starts_with(&format!("{host}: step {step:?}")),
        "the error must name host and step: {msg}"
    );
    msg
}

#[track_caller]
fn assert_others_ok(summary: &Summary, failed: &str) {
    for h in &summary.hosts {
        if h.host != failed {
            assert!(
                h.result.is_ok(),
                "{} should have gone on:\n{summary}",
                h.host
            );
        }
    }
}

/// Runs `work` on a fresh runtime while `fault` runs on another thread; returns the summary
/// and how long the run took.
fn run_with_fault(
    rt: &tokio::runtime::Runtime,
    fleet: &SshFleet,
    work: &[(String, Vec<Step>)],
    fault: impl FnOnce() + Send,
) -> (Summary, Duration) {
    std::thread::scope(|s| {
        s.spawn(fault);
        let started = Instant::now();
        let summary = rt.block_on(fleet.run_all(work));
        (summary, started.elapsed())
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Which side of the connection the fault hits.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// The host's per-connection sshd processes are killed (the command itself survives).
    HostSessions,
    /// The operator's ssh master for that host is killed.
    OperatorMaster,
}

fn connection_killed_mid_step(cut: Cut) {
    let th = TestHosts::start(3);
    let store = Arc::new(MemStore::default());
    let rt = runtime();
    let fleet = new_fleet(&th, &store, Duration::from_secs(3));
    let steps = steps(Duration::from_secs(2), Duration::from_secs(20));
    let work = work(&th, &steps);
    let victim = &th.hosts[1];
    let address = victim.address.clone();

    let (summary, took) = run_with_fault(&rt, &fleet, &work, || {
        assert!(
            wait_for(Duration::from_secs(15), || sleeping(victim)),
            "host2 never started the long step"
        );
        match cut {
            Cut::HostSessions => {
                for pid in victim.session_pids() {
                    if comm(pid) == "sshd" {
                        kill(pid);
                    }
                }
            }
            Cut::OperatorMaster => kill(master_pid(&fleet, &address).expect("host2's master")),
        }
    });
    let msg = assert_step_failure(&summary, "host2", "long work");
    assert_others_ok(&summary, "host2");
    assert!(took < Duration::from_secs(15), "took {took:?}: {summary}");
    assert!(
        victim.read_upper("/etc/kprov-faults/after").is_none(),
        "a step after the failed one ran"
    );

    // The re-run (same fleet: it reconnects) converges: host2 finishes, the others change
    // nothing.
    let again = rt.block_on(fleet.run_all(&work));
    assert!(again.ok(), "{again}");
    for h in &again.hosts {
        let changed = h.changed();
        if h.host == "host2" {
            assert!(changed >= 1, "{again}");
        } else {
            assert_eq!(changed, 0, "{again}");
        }
    }
    assert!(rt.block_on(fleet.run_all(&work)).converged());
    assert!(victim.read_upper("/etc/kprov-faults/long-done").is_some());
    rt.block_on(fleet.close());
    figures(
        "ssh-cut",
        &format!("{cut:?}: 1 fault, error {msg:?}; re-run converged: yes; lost: nothing"),
    );
}

#[test]
fn host_side_session_killed_mid_step_fails_that_host_and_rerun_converges() {
    connection_killed_mid_step(Cut::HostSessions);
}

#[test]
fn operator_side_master_killed_mid_step_fails_that_host_and_rerun_converges() {
    connection_killed_mid_step(Cut::OperatorMaster);
}

/// Every `.kprov.*` temporary file below `dir` (upload leftovers).
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if e.file_name().to_string_lossy().starts_with(".kprov.") {
                out.push(p);
            }
        }
    }
    out
}

/// A big upload cut off in the middle, at seeded points: the target is never replaced by a
/// partial file (the remote end sees an early EOF: before the fix, `cat` succeeded with half
/// the data and `mv` put it in place), no temporary file is left, and the re-run uploads it.
#[test]
fn upload_cut_mid_transfer_leaves_no_partial_file() {
    let th = TestHosts::start(1);
    let host = &th.hosts[0];
    let store = Arc::new(MemStore::default());
    let rt = runtime();
    let size = 48 * 1024 * 1024;
    let content: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let content = Bytes::from(content);
    let old = Bytes::from_static(b"the previous version\n");
    let path = "/opt/kprov-faults/blob";
    let step = |c: &Bytes| Step {
        name: "install blob".into(),
        files: vec![RemoteFile {
            path: path.into(),
            content: c.clone(),
            mode: 0o755,
        }],
        check: None,
        run: String::new(),
        timeout: Duration::from_secs(60),
    };
    let upper_dir = host.upper_path(path).parent().expect("dir").to_path_buf();
    let mut rng = Rng::new(9);
    let mut cuts = 0;
    let seeds = 3;
    for round in 0..seeds {
        let fleet = new_fleet(&th, &store, Duration::from_secs(3));
        // A complete older version is in place: a cut must leave exactly it.
        let summary = rt.block_on(fleet.run_all(&[("host1".into(), vec![step(&old)])]));
        assert!(summary.ok(), "{summary}");
        let threshold = rng.range(1, size as u64 / 2);
        let address = host.address.clone();
        let (summary, _) = run_with_fault(
            &rt,
            &fleet,
            &[("host1".into(), vec![step(&content)])],
            || {
                let seen = wait_for(Duration::from_secs(20), || {
                    temp_files(&upper_dir)
                        .iter()
                        .any(|t| std::fs::metadata(t).map(|m| m.len()).unwrap_or(0) >= threshold)
                });
                assert!(seen, "round {round}: no upload reached {threshold} bytes");
                kill(master_pid(&fleet, &address).expect("master"));
            },
        );
        // The remote side notices the EOF and ends: wait for that before judging the target
        // (its last act, with the old code, was to rename half a file into place).
        assert!(
            wait_for(Duration::from_secs(10), || temp_files(&upper_dir)
                .is_empty()
                && !host.processes().iter().any(|p| p == "cat")),
            "round {round}: temporary files left: {:?}",
            temp_files(&upper_dir)
        );
        std::thread::sleep(Duration::from_millis(200));
        assert!(temp_files(&upper_dir).is_empty(), "round {round}");
        let have = host.read_upper(path).expect("the target exists");
        if summary.ok() {
            // The last bytes were already through: the file must then be complete.
            assert_eq!(have, content, "round {round}");
        } else {
            cuts += 1;
            let msg = assert_step_failure(&summary, "host1", "install blob");
            assert!(
                have == old || have == content,
                "round {round}: a partial file of {} bytes replaced the target ({msg})",
                have.len()
            );
        }
        let again = rt.block_on(fleet.run_all(&[("host1".into(), vec![step(&content)])]));
        assert!(again.ok(), "{again}");
        assert_eq!(host.read_upper(path).as_deref(), Some(&content[..]));
        rt.block_on(fleet.close());
    }
    figures(
        "upload-cut",
        &format!(
            "{seeds} uploads of 48 MiB cut at seeded offsets ({cuts} failed, the rest had finished); partial files in place: 0; temp files left: 0; re-runs converged: {seeds}"
        ),
    );
}

/// A host whose cable is pulled while a step runs: a timeout naming host and step after the
/// step's timeout (no hang), the other hosts go on; plugged back, the re-run converges.
#[test]
fn host_vanishing_mid_step_times_out_clearly_and_rerun_converges() {
    let th = TestHosts::start(3);
    let store = Arc::new(MemStore::default());
    let rt = runtime();
    let fleet = new_fleet(&th, &store, Duration::from_secs(3));
    let timeout = Duration::from_secs(6);
    let steps = steps(Duration::from_secs(2), timeout);
    let work = work(&th, &steps);
    let victim = &th.hosts[1];
    let (summary, took) = run_with_fault(&rt, &fleet, &work, || {
        assert!(wait_for(Duration::from_secs(15), || sleeping(victim)));
        victim.set_link(false);
    });
    let msg = assert_step_failure(&summary, "host2", "long work");
    assert!(
        matches!(result_of(&summary, "host2"), Err(ExecError::Timeout { .. })),
        "{msg}"
    );
    assert_others_ok(&summary, "host2");
    assert!(
        took < timeout + Duration::from_secs(10),
        "no error within the step timeout: {took:?}: {msg}\n{summary}"
    );

    // While the host is away, a new connection fails within the connect timeout.
    let away = new_fleet(&th, &store, Duration::from_secs(2));
    let started = Instant::now();
    let down = rt.block_on(away.run_all(&work[1..2]));
    let waited = started.elapsed();
    let err = result_of(&down, "host2")
        .as_ref()
        .expect_err("host2 is away");
    assert!(matches!(err, ExecError::Connect { .. }), "{err}");
    assert!(
        err.to_string().starts_with("host2: cannot connect"),
        "{err}"
    );
    assert!(waited < Duration::from_secs(8), "took {waited:?}");

    victim.set_link(true);
    let again = rt.block_on(fleet.run_all(&work));
    assert!(again.ok(), "{again}");
    assert!(rt.block_on(fleet.run_all(&work)).converged());
    rt.block_on(fleet.close());
    rt.block_on(away.close());
    figures(
        "host-vanished",
        &format!(
            "1 host unplugged mid-step: error after {took:?} ({msg:?}); while away: connect error after {waited:?}; re-run converged: yes"
        ),
    );
}

/// A host that loses power mid-step and boots again: the error names host and step at once,
/// a run while it is down fails to connect within the connect timeout, and after the boot the
/// re-run converges.
#[test]
fn host_rebooting_mid_step_fails_clearly_and_rerun_converges() {
    let th = TestHosts::start(3);
    let store = Arc::new(MemStore::default());
    let rt = runtime();
    let fleet = new_fleet(&th, &store, Duration::from_secs(2));
    let steps = steps(Duration::from_secs(2), Duration::from_secs(20));
    let work = work(&th, &steps);
    let victim = &th.hosts[1];
    let (summary, took) = run_with_fault(&rt, &fleet, &work, || {
        assert!(wait_for(Duration::from_secs(15), || sleeping(victim)));
        victim.power_off();
    });
    let msg = assert_step_failure(&summary, "host2", "long work");
    assert_others_ok(&summary, "host2");
    assert!(
        took < Duration::from_secs(20),
        "took {took:?}: {msg}\n{summary}"
    );

    let started = Instant::now();
    let down = rt.block_on(fleet.run_all(&work));
    let waited = started.elapsed();
    let err = result_of(&down, "host2")
        .as_ref()
        .expect_err("host2 is down");
    assert!(
        err.to_string().starts_with("host2: "),
        "the error must name the host: {err}"
    );
    assert!(waited < Duration::from_secs(15), "took {waited:?}");
    assert_others_ok(&down, "host2");

    victim.power_on();
    let again = rt.block_on(fleet.run_all(&work));
    assert!(again.ok(), "{again}");
    assert!(rt.block_on(fleet.run_all(&work)).converged());
    assert!(temp_files(&victim.upper_path("/etc/x").parent().unwrap().to_path_buf()).is_empty());
    rt.block_on(fleet.close());
    figures(
        "host-rebooted",
        &format!(
            "1 host powered off mid-step: error after {took:?} ({msg:?}); while down: {err}; re-run after boot converged: yes"
        ),
    );
}
