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
use kprov::ssh::task::{ExecError, RemoteFile, Step, StepOutcome};
use kprov::ssh::{NoProgress, SshFleet, SshOptions, Summary};
use kprov::state::{Object, Precondition, StateError, StateStore, Version};

use crate::metal::{Lab, layout, metal_update_yes};
use crate::support::awscloud::{self, delete_all, host_keys, proxied_sdk};
use crate::support::faultproxy::{Fault, FaultProxy, Request};
use crate::support::memstate::MemStore;
use crate::support::moto::moto;
use crate::support::testhosts::{TestHost, TestHosts, is_dead};

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

fn new_fleet(th: &TestHosts, store: &Arc<MemStore>, connect_timeout: Duration) -> SshFleet {
    let options = SshOptions {
        accept_new_host_keys: true,
        connect_timeout,
        ..SshOptions::default()
    };
    SshFleet::new(
        CLUSTER,
        th.spec_hosts(),
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
                resumable: false,
                on_arrival: None,
                sha256: None,
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

/// `n` hosts, an empty state store and a runtime to drive fleets on.
fn rig(n: usize) -> (TestHosts, Arc<MemStore>, tokio::runtime::Runtime) {
    (
        TestHosts::start(n),
        Arc::new(MemStore::default()),
        runtime(),
    )
}

/// Runs the one step `s` on host1.
fn on_host1(rt: &tokio::runtime::Runtime, fleet: &SshFleet, s: Step) -> Summary {
    rt.block_on(fleet.run_all(&[("host1".into(), vec![s])]))
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
    let (th, store, rt) = rig(3);
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
    crate::needs_tier!(SshdHosts);
    connection_killed_mid_step(Cut::HostSessions);
}

#[test]
fn operator_side_master_killed_mid_step_fails_that_host_and_rerun_converges() {
    crate::needs_tier!(SshdHosts);
    connection_killed_mid_step(Cut::OperatorMaster);
}

/// Every file below `dir` whose name `wanted` picks.
fn files_below(dir: &Path, wanted: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if wanted(&e.file_name().to_string_lossy()) {
                out.push(p);
            }
        }
    }
    out
}

/// Every `.kprov.*` temporary file below `dir` (upload leftovers).
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    files_below(dir, |name| name.starts_with(".kprov."))
}

/// 48 MiB of bytes counting up modulo `modulus`: its size, and it.
fn blob(modulus: usize) -> (usize, Bytes) {
    let size = 48 * 1024 * 1024;
    (size, (0..size).map(|i| (i % modulus) as u8).collect())
}

/// Runs the upload step `s` on host1 and kills the operator's ssh master of `host` once
/// `uploaded` (what has arrived on the host so far) reaches `threshold`: the run's summary.
fn cut_upload(
    rt: &tokio::runtime::Runtime,
    fleet: &SshFleet,
    host: &TestHost,
    s: Step,
    round: usize,
    threshold: u64,
    uploaded: impl Fn() -> u64 + Send,
) -> Summary {
    let address = host.address.clone();
    let (summary, _) = run_with_fault(rt, fleet, &[("host1".into(), vec![s])], move || {
        let seen = wait_for(Duration::from_secs(20), || uploaded() >= threshold);
        assert!(seen, "round {round}: no upload reached {threshold} bytes");
        kill(master_pid(fleet, &address).expect("master"));
    });
    summary
}

/// Runs the upload step `s` on host1 again: it succeeds and `path` holds all of `content`.
fn uploads_whole(
    rt: &tokio::runtime::Runtime,
    fleet: &SshFleet,
    host: &TestHost,
    path: &str,
    s: Step,
    content: &Bytes,
) {
    let again = on_host1(rt, fleet, s);
    assert!(again.ok(), "{again}");
    assert_eq!(host.read_upper(path).as_deref(), Some(&content[..]));
}

/// A big upload cut off in the middle, at seeded points: the target is never replaced by a
/// partial file (the remote end sees an early EOF: before the fix, `cat` succeeded with half
/// the data and `mv` put it in place), no temporary file is left, and the re-run uploads it.
#[test]
fn upload_cut_mid_transfer_leaves_no_partial_file() {
    crate::needs_tier!(SshdHosts);
    let (th, store, rt) = rig(1);
    let host = &th.hosts[0];
    let (size, content) = blob(251);
    let old = Bytes::from_static(b"the previous version\n");
    let path = "/opt/kprov-faults/blob";
    let step = |c: &Bytes| Step {
        name: "install blob".into(),
        files: vec![RemoteFile {
            path: path.into(),
            content: c.clone(),
            mode: 0o755,
            resumable: false,
            on_arrival: None,
            sha256: None,
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
        let summary = on_host1(&rt, &fleet, step(&old));
        assert!(summary.ok(), "{summary}");
        let threshold = rng.range(1, size as u64 / 2);
        let uploaded = || {
            let sizes = temp_files(&upper_dir).into_iter();
            let sizes = sizes.map(|t| std::fs::metadata(t).map(|m| m.len()).unwrap_or(0));
            sizes.max().unwrap_or(0)
        };
        let summary = cut_upload(
            &rt,
            &fleet,
            host,
            step(&content),
            round,
            threshold,
            uploaded,
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
        uploads_whole(&rt, &fleet, host, path, step(&content), &content);
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
    crate::needs_tier!(SshdHosts);
    let (th, store, rt) = rig(3);
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
    crate::needs_tier!(SshdHosts);
    let (th, store, rt) = rig(3);
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
    assert!(
        temp_files(
            victim
                .upper_path("/etc/x")
                .parent()
                .and_then(Path::parent)
                .expect("upper dirs")
        )
        .is_empty()
    );
    rt.block_on(fleet.close());
    figures(
        "host-rebooted",
        &format!(
            "1 host powered off mid-step: error after {took:?} ({msg:?}); while down: {err}; re-run after boot converged: yes"
        ),
    );
}

// ---------------------------------------------------------------------------------------------
// State store writes that fail half-way.

/// Leftover temporary files of the file backend below `dir`.
fn store_temps(dir: &Path) -> Vec<PathBuf> {
    files_below(dir, |name| name.contains(".tmp-"))
}

/// A full disk: the write fails with the system's reason, leaves no temporary file and the
/// object and its version as they were; once there is room, the same conditional write works.
#[test]
fn file_store_write_on_a_full_disk_changes_nothing_and_retry_succeeds() {
    crate::needs_tier!(Root);
    let dir = tempfile::Builder::new()
        .prefix("kprov-faults-disk-")
        .tempdir_in("/var/tmp")
        .expect("dir");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512k", "tmpfs"])
        .arg(&mnt)
        .status()
        .expect("mount");
    assert!(status.success(), "mount a small tmpfs");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mnt.clone());
    let rt = runtime();
    let store = kprov::state::file::FileStore::new(mnt.join("state")).expect("store");
    let key = "c.example.com/config";
    let v1 = rt
        .block_on(store.put(
            key,
            Bytes::from_static(b"version one\n"),
            Precondition::Absent,
        ))
        .expect("first write");
    // Fill the disk.
    let filler = mnt.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
    drop(f);
    let big = Bytes::from(vec![b'x'; 256 * 1024]);
    let err = rt
        .block_on(store.put(key, big.clone(), Precondition::Matches(v1.clone())))
        .expect_err("the disk is full");
    let msg = err.to_string();
    assert!(matches!(err, StateError::Backend { .. }), "{msg}");
    assert!(msg.contains(key), "the error must name the key: {msg}");
    assert!(
        msg.to_lowercase().contains("no space left"),
        "the error must give the reason: {msg}"
    );
    assert!(
        !msg.contains("prefix of other keys"),
        "a full disk is not a key clash: {msg}"
    );
    assert!(store_temps(&mnt).is_empty(), "{:?}", store_temps(&mnt));
    let now: Object = rt.block_on(store.get(key)).unwrap().expect("still there");
    assert_eq!((&now.data[..], &now.version), (&b"version one\n"[..], &v1));

    std::fs::remove_file(&filler).unwrap();
    let v2 = rt
        .block_on(store.put(key, big.clone(), Precondition::Matches(v1.clone())))
        .expect("retry with room");
    let now = rt.block_on(store.get(key)).unwrap().expect("there");
    assert_eq!((now.data, now.version), (big, v2));
    figures(
        "file-store-full-disk",
        &format!("1 write on a full disk: {msg:?}; object and version unchanged; retry succeeded"),
    );
}

/// Record written by the crash child: a sequence number, padding, and the sha256 of both, so a
/// torn or mixed record is detected.
fn record(seq: u64) -> Vec<u8> {
    let mut body = format!("seq {seq}\n").into_bytes();
    body.resize(256 * 1024, b'a' + (seq % 26) as u8);
    let sum = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&body));
    body.extend_from_slice(format!("\nsha256 {sum}\n").as_bytes());
    body
}

fn check_record(data: &[u8]) -> Result<u64, String> {
    let text = String::from_utf8_lossy(data);
    let seq: u64 = text
        .strip_prefix("seq ")
        .and_then(|t| t.split('\n').next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("no sequence number in {} bytes", data.len()))?;
    if record(seq) == data {
        Ok(seq)
    } else {
        Err(format!("record {seq} torn ({} bytes)", data.len()))
    }
}

/// Child process: increments a record with compare-and-swap writes until it is killed.
#[tokio::test]
#[ignore = "run as a child process by file_store_writer_killed_at_random_points"]
async fn file_store_crash_child() {
    let Ok(root) = std::env::var("KPROV_FAULTS_STATE_DIR") else {
        return;
    };
    let store = kprov::state::file::FileStore::new(root).expect("store");
    let key = "crash.example.com/config";
    loop {
        let cur = store.get(key).await.expect("read");
        let (seq, cond) = match cur {
            Some(o) => (
                check_record(&o.data).expect("a complete record") + 1,
                Precondition::Matches(o.version),
            ),
            None => (0, Precondition::Absent),
        };
        store
            .put(key, Bytes::from(record(seq)), cond)
            .await
            .expect("write");
    }
}

/// The writer is killed (SIGKILL) at seeded random points, between writing the temporary
/// file and the rename among others: the object is always a complete record whose version
/// matches its content, a leftover temporary file is never listed, the next write succeeds
/// with the version read and removes the leftovers.
#[test]
fn file_store_writer_killed_at_random_points() {
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("state");
    let exe = std::env::current_exe().expect("test binary");
    let rt = runtime();
    let key = "crash.example.com/config";
    let mut rng = Rng::new(4);
    let kills = 10;
    let (mut leftovers, mut max_seq) = (0, 0);
    for round in 0..kills {
        let mut child = std::process::Command::new(&exe)
            .args([
                "faults::file_store_crash_child",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env("KPROV_FAULTS_STATE_DIR", &root)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("child");
        // Wait for the first write of this round, then kill at a seeded moment.
        let store = kprov::state::file::FileStore::new(&root).expect("store");
        let before = rt.block_on(store.get(key)).unwrap().map(|o| o.version);
        assert!(
            wait_for(Duration::from_secs(20), || {
                rt.block_on(store.get(key)).unwrap().map(|o| o.version) != before
            }),
            "round {round}: the child never wrote"
        );
        std::thread::sleep(Duration::from_millis(rng.range(0, 150)));
        kill(child.id());
        let _ = child.wait();

        leftovers += store_temps(&root).len();
        let obj = rt.block_on(store.get(key)).unwrap().expect("object");
        let seq = check_record(&obj.data).unwrap_or_else(|e| panic!("round {round}: {e}"));
        max_seq = max_seq.max(seq);
        let listed = rt.block_on(store.list("crash.example.com/")).unwrap();
        assert_eq!(listed, vec![key.to_string()], "round {round}");
        // The version read is the one a compare-and-swap must name.
        let next = Bytes::from(record(seq + 1));
        let v = rt
            .block_on(store.put(key, next.clone(), Precondition::Matches(obj.version)))
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(
            store_temps(&root).is_empty(),
            "leftovers stay after a write"
        );
        assert_eq!(rt.block_on(store.get(key)).unwrap().unwrap().version, v);
    }
    figures(
        "file-store-kill",
        &format!(
            "{kills} writers killed (SIGKILL) at seeded points after {max_seq}+ writes: torn objects 0, version mismatches 0, temporary files found after a kill {leftovers} (removed by the next write), retries succeeded {kills}"
        ),
    );
}

/// What moto holds for `key`, read around the proxy.
/// The cluster `cluster` (the spec of aws.rs, under a new hosted zone `zone`) on moto behind a
/// fault proxy, reached with the CLI's SDK settings (standard retry mode, 3 attempts): the
/// proxy, the spec and the cloud.
async fn behind_a_fault_proxy(
    cluster: &str,
    zone: &str,
) -> (
    FaultProxy,
    kprov::spec::Cluster,
    Vec<kprov::spec::InstanceGroup>,
    kprov::cloud::aws::AwsCloud,
) {
    crate::aws::make_zone(&moto().sdk_config().await, zone).await;
    let proxy = FaultProxy::start(&moto().endpoint);
    let sdk = proxied_sdk(&proxy.endpoint, 3).await;
    let (c, igs) = crate::aws::spec(cluster, zone, false);
    let keys = host_keys(&igs).await;
    let cloud = kprov::cloud::aws::AwsCloud::new(&sdk, cluster, &[]).with_host_keys(keys);
    (proxy, c, igs, cloud)
}

async fn s3_direct(bucket: &str, key: &str) -> Option<(Bytes, String)> {
    let s3 = moto().s3().await;
    let out = s3.get_object().bucket(bucket).key(key).send().await.ok()?;
    let etag = out.e_tag().unwrap_or_default().to_string();
    Some((out.body.collect().await.ok()?.into_bytes(), etag))
}

/// S3 writes that fail half-way: a connection cut in the middle of the PUT body, a 500, a
/// 503 SlowDown, and a reply lost after S3 wrote. No object is ever half-written, the version
/// (ETag) always matches the content, errors name the object and the cause, retries succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_store_writes_failing_half_way_leave_no_torn_object() {
    crate::needs_tier!(Moto);
    let bucket = "kprov-faults-s3";
    moto().create_bucket(bucket).await;
    let proxy = FaultProxy::start(&moto().endpoint);
    // One attempt: the fault reaches kprov's code. Three: the SDK's default.
    let once = kprov::state::s3::S3Store::new(&proxied_sdk(&proxy.endpoint, 1).await, bucket, "p");
    let retrying =
        kprov::state::s3::S3Store::new(&proxied_sdk(&proxy.endpoint, 3).await, bucket, "p");
    let key = "c.example.com/config";
    let object = format!("p/{key}");
    let v1 = once
        .put(key, Bytes::from(record(1)), Precondition::Absent)
        .await
        .expect("first write");
    let put_only = |fault: Fault, times: u32| {
        Box::new(move |r: &Request| (r.method == "PUT" && r.seen < times).then_some(fault))
            as crate::support::faultproxy::Policy
    };
    let mut figures_text = Vec::new();
    let mut version: Version = v1;
    let mut seq = 1;
    for (fault, what) in [
        (Fault::CutRequest, "connection cut during the PUT"),
        (Fault::Internal, "500 InternalError"),
        (Fault::Throttle, "503 SlowDown"),
    ] {
        seq += 1;
        let data = Bytes::from(record(seq));
        proxy.set_policy(put_only(fault, 1));
        let err = once
            .put(key, data.clone(), Precondition::Matches(version.clone()))
            .await
            .expect_err(what);
        let msg = err.to_string();
        assert!(matches!(err, StateError::Backend { .. }), "{what}: {msg}");
        assert!(
            msg.contains(&format!("s3://{bucket}/p")) && msg.contains(key),
            "{msg}"
        );
        match fault {
            Fault::Internal => assert!(msg.contains("InternalError: We encountered"), "{msg}"),
            Fault::Throttle => assert!(
                msg.contains("SlowDown: Please") && msg.contains("throttled"),
                "{msg}"
            ),
            _ => assert!(msg.contains("did not get through"), "{msg}"),
        }
        assert!(
            !msg.contains("ServiceError {") && !msg.contains("DispatchFailure("),
            "a Debug dump: {msg}"
        );
        // Nothing half-written: moto still has the previous complete record, same ETag.
        let (have, etag) = s3_direct(bucket, &object).await.expect("object");
        assert_eq!(check_record(&have), Ok(seq - 1), "{what}");
        assert_eq!(Version(etag), version, "{what}");
        // The same conditional write, retried, succeeds.
        proxy.set_policy(Box::new(|_: &Request| None));
        version = once
            .put(key, data.clone(), Precondition::Matches(version.clone()))
            .await
            .unwrap_or_else(|e| panic!("{what}: retry: {e}"));
        let (have, etag) = s3_direct(bucket, &object).await.expect("object");
        assert_eq!((have, Version(etag)), (data, version.clone()), "{what}");
        figures_text.push(format!("{what}: {msg:?}, object intact, retry ok"));

        // With the SDK's own retries the same fault is invisible.
        seq += 1;
        let data = Bytes::from(record(seq));
        proxy.set_policy(put_only(fault, 1));
        version = retrying
            .put(key, data.clone(), Precondition::Matches(version.clone()))
            .await
            .unwrap_or_else(|e| panic!("{what} with SDK retries: {e}"));
        let (have, etag) = s3_direct(bucket, &object).await.expect("object");
        assert_eq!((have, Version(etag)), (data, version.clone()), "{what}");
    }

    // The reply of a successful conditional write is lost: the SDK's retry fails the
    // condition, so the caller sees a conflict for a write that did happen (docs/state-store.md).
    // The object is complete and a re-read gives the version to go on with.
    seq += 1;
    let data = Bytes::from(record(seq));
    proxy.set_policy(put_only(Fault::LoseReply, 1));
    let err = retrying
        .put(key, data.clone(), Precondition::Matches(version.clone()))
        .await
        .expect_err("the retry finds the object changed");
    assert!(matches!(err, StateError::Conflict { .. }), "{err}");
    proxy.set_policy(Box::new(|_: &Request| None));
    let now = retrying.get(key).await.unwrap().expect("object");
    assert_eq!(now.data, data, "the write did happen");
    let (_, etag) = s3_direct(bucket, &object).await.expect("object");
    assert_eq!(now.version, Version(etag));
    retrying
        .put(
            key,
            Bytes::from(record(seq + 1)),
            Precondition::Matches(now.version),
        )
        .await
        .expect("read-modify-write goes on");
    figures_text.push(format!(
        "lost reply: {err}; object complete, re-read version usable"
    ));
    let stats = proxy.stats();
    figures(
        "s3-store",
        &format!(
            "{} faults injected in {} requests; torn objects 0; {}",
            stats.total_injected(),
            stats.requests,
            figures_text.join("; ")
        ),
    );
}

// ---------------------------------------------------------------------------------------------
// An AWS API that throttles and fails for a while.

/// The throttling policy of the AWS tests, fixed by `seed` and each request's content: a
/// quarter of the distinct reads are throttled twice and a tenth fail once with 500 (the SDK's
/// three attempts absorb both); a quarter of the writes are throttled four times and a sixth
/// fail three times with 500, more than the SDK's attempts, so kprov's engine must retry.
fn throttling(seed: u64) -> crate::support::faultproxy::Policy {
    Box::new(move |r: &Request| {
        let p = r.percentile(seed);
        let (throttle, internal) = if r.is_write() { (4, 3) } else { (2, 1) };
        let share = if r.is_write() { 40 } else { 35 };
        if p < 25 && r.seen < throttle {
            Some(Fault::Throttle)
        } else if (25..share).contains(&p) && r.seen < internal {
            Some(Fault::Internal)
        } else {
            None
        }
    })
}

async fn owned(cluster: &str) -> (usize, usize) {
    let sdk = moto().sdk_config().await;
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let f = aws_sdk_ec2::types::Filter::builder()
        .name(format!("tag:kubernetes.io/cluster/{cluster}"))
        .values("owned")
        .build();
    let vpcs = ec2
        .describe_vpcs()
        .filters(f.clone())
        .send()
        .await
        .expect("vpcs")
        .vpcs()
        .len();
    let subnets = ec2
        .describe_subnets()
        .filters(f)
        .send()
        .await
        .expect("subnets")
        .subnets()
        .len();
    (vpcs, subnets)
}

/// The cloud apply of `update cluster --yes` through throttling and 500s converges (the SDK
/// retries reads, the engine retries writes past the SDK's attempts), creates nothing twice,
/// and the next plan and apply find no changes, with the faults still on. Through the library:
/// the binary's `--yes` goes on to provision the instances over SSH, which only the cloud lab
/// can play (tests never connect to the addresses moto invents).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_update_converges_while_the_api_throttles() {
    crate::needs_tier!(Moto);
    use kprov::cloud::engine::{self, ApplyOptions};
    let cluster = "demo.faults-throttle.example";
    let (proxy, c, igs, cloud) = behind_a_fault_proxy(cluster, "faults-throttle.example").await;
    proxy.set_policy(throttling(11));
    let started = Instant::now();
    let plan = awscloud::plan(&cloud, &c, &igs)
        .await
        .expect("plan under faults");
    engine::apply(&cloud, &plan, &ApplyOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}\nmoto:\n{}", moto().log_tail()));
    let took = started.elapsed();
    let first = proxy.stats();
    assert!(first.total_injected() > 20, "{first:?}");
    // Other requests fail now: the second runs meet faults of their own.
    proxy.set_policy(throttling(12));
    let again = awscloud::plan(&cloud, &c, &igs).await.expect("plan again");
    assert!(again.is_empty(), "{:?}", again.changes);
    engine::apply(&cloud, &again, &ApplyOptions::default())
        .await
        .expect("no-op apply");
    // Retries created nothing twice.
    assert_eq!(owned(cluster).await, (1, 1));
    let stats = proxy.stats();
    figures(
        "aws-throttle",
        &format!(
            "apply: {} faults in {} requests ({:?}), converged in {took:.1?}; then plan and apply with {} more faults: no changes; duplicates 0",
            first.total_injected(),
            first.requests,
            first.by_service,
            stats.total_injected() - first.total_injected(),
        ),
    );
    proxy.set_policy(Box::new(|_: &Request| None));
    delete_all(&cloud, &c, &igs).await;
}

/// Throttling that outlasts the resource deadline: the apply stops at the deadline with an
/// error naming the resource, the API call and that it was throttled; without faults a
/// re-plan and apply finish the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_throttling_past_the_deadline_is_reported_as_such() {
    crate::needs_tier!(Moto);
    use kprov::cloud::engine::{self, ApplyOptions};
    let cluster = "demo.faults-deadline.example";
    let (proxy, c, igs, cloud) = behind_a_fault_proxy(cluster, "faults-deadline.example").await;
    let plan = awscloud::plan(&cloud, &c, &igs).await.expect("plan");
    proxy.set_policy(Box::new(|r: &Request| {
        r.is_write().then_some(Fault::Throttle)
    }));
    let opts = ApplyOptions {
        resource_deadline: Duration::from_secs(3),
        initial_backoff: Duration::from_millis(200),
        max_backoff: Duration::from_secs(1),
        ..ApplyOptions::default()
    };
    let started = Instant::now();
    let err = engine::apply(&cloud, &plan, &opts)
        .await
        .expect_err("throttled past the deadline")
        .to_string();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(20), "took {took:?}: {err}");
    assert!(err.contains("not done within 3s"), "{err}");
    assert!(err.contains("throttled by the API"), "{err}");
    assert!(
        err.contains("RequestLimitExceeded") || err.contains("Throttling"),
        "the service's code: {err}"
    );
    assert!(
        err.contains("Create"),
        "the call that was being made: {err}"
    );
    proxy.set_policy(Box::new(|_: &Request| None));
    let plan = awscloud::plan(&cloud, &c, &igs).await.expect("re-plan");
    engine::apply(&cloud, &plan, &ApplyOptions::default())
        .await
        .expect("apply without faults");
    let again = awscloud::plan(&cloud, &c, &igs).await.expect("plan");
    assert!(again.is_empty() || again.changes.is_empty(), "{again:?}");
    let line = err.lines().nth(1).unwrap_or(&err).trim().to_string();
    figures(
        "aws-deadline",
        &format!(
            "{} throttles over {took:.1?}; error: {line:?}; apply without faults converged",
            proxy.stats().total_injected()
        ),
    );
    delete_all(&cloud, &c, &igs).await;
}

// ---------------------------------------------------------------------------------------------
// kprov killed (SIGKILL) in the middle of a metal `update --yes`, then re-run.

/// `kprov update cluster NAME --yes` as a child process, killed after `after`; returns how it
/// ended (None: killed).
fn update_killed_after(lab: &Lab, name: &str, after: Duration) -> Option<std::process::ExitStatus> {
    let mut child = lab
        .kprov_command(&metal_update_yes(name, &[]))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kprov");
    let end = Instant::now() + after;
    while Instant::now() < end {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    kill(child.id());
    let _ = child.wait();
    None
}

/// Files in the hosts' overlays named like a temporary upload.
fn host_temps(lab: &Lab) -> Vec<PathBuf> {
    lab.hosts_snapshot()
        .into_keys()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".kprov."))
        })
        .collect()
}

#[test]
fn kprov_killed_at_random_points_of_a_metal_update_then_rerun_converges() {
    crate::needs_tier!(SshdHosts);
    let seeds: [u64; 3] = [1, 2, 3];
    let (mut kills, mut lock_breaks, mut converged, mut torn) = (0, 0, 0, 0);
    let mut finished_before_kill = 0;
    let mut full_run = Duration::ZERO;
    for seed in seeds {
        let lab = Lab::start(3);
        let name = format!("kill{seed}.metal.example.com");
        let inv = lab.inventory(&layout(1, 2));
        lab.create_metal(&name, &inv);
        let before = lab.hosts_snapshot();
        let mut rng = Rng::new(seed);
        // Two kills at seeded moments, the second while the first's leftovers are handled.
        for attempt in 0..2 {
            let at = Duration::from_millis(rng.range(300, 4000));
            let ended = update_killed_after(&lab, &name, at);
            if ended.is_some() {
                finished_before_kill += 1;
            } else {
                kills += 1;
            }
            // The killed run's masters (they would outlive it by their idle limit).
            lab.th.stop_kprov_ssh();
            // The remote halves of cut uploads see EOF and remove their temporary files.
            assert!(
                wait_for(Duration::from_secs(15), || host_temps(&lab).is_empty()),
                "seed {seed}, kill {attempt} at {at:?}: temporary files left on the hosts: {:?}",
                host_temps(&lab)
            );
            let after_kill = lab.hosts_snapshot();
            // The lock of the killed run: its lease (5 minutes) outlives the test, so the
            // re-run is refused naming the dead holder and the lock is broken as
            // docs/state-store.md says to, once the holder is known to be dead.
            let lock = lab.store_dir().join(&name).join("lock");
            if lock.exists() {
                let o = lab.kprov(&["update", "cluster", &name, "--yes", "--skip-addons"]);
                assert_eq!(o.status.code(), Some(4), "{}", crate::metal::show(&o));
                let err = String::from_utf8_lossy(&o.stderr);
                assert!(
                    err.contains("update cluster") && err.contains("kprov lock break"),
                    "{err}"
                );
                let o = lab.kprov(&["lock", "break", &name]);
                assert!(o.status.success(), "{}", crate::metal::show(&o));
                lock_breaks += 1;
            }
            if attempt == 0 {
                continue;
            }
            let started = Instant::now();
            let o = lab.kprov(&metal_update_yes(&name, &[]));
            assert!(
                o.status.success(),
                "seed {seed}: re-run after a kill at {at:?}: {}",
                crate::metal::show(&o)
            );
            full_run = full_run.max(started.elapsed());
            // Converged: the read-only preview finds every file kprov keeps complete and
            // nothing pending.
            let o = lab.kprov(&["update", "cluster", &name, "--exit-code"]);
            assert_eq!(
                o.status.code(),
                Some(0),
                "seed {seed}: {}",
                crate::metal::show(&o)
            );
            converged += 1;
            // Nothing the killed run left on a host is a cut-off copy of what kprov finally
            // wrote there.
            let done = lab.hosts_snapshot();
            for (path, was) in &after_kill {
                // A file as it was before any run is no trace of a cut write (kprov appends
                // to /etc/hosts, for one).
                if before.get(path) == Some(was) {
                    continue;
                }
                // The stand-in binaries keep append-only logs of their own (tokens issued,
                // calls made): a log that grew on the re-run is not a cut write of kprov's.
                if path.to_string_lossy().contains("kprov-standins") {
                    continue;
                }
                if let Some(now) = done.get(path)
                    && was.len() < now.len()
                    && now.starts_with(was)
                    && !was.is_empty()
                {
                    torn += 1;
                    eprintln!(
                        "seed {seed}: {} was left as the first {} of {} bytes",
                        path.display(),
                        was.len(),
                        now.len()
                    );
                }
            }
            assert!(host_temps(&lab).is_empty());
            assert_eq!(torn, 0, "seed {seed}: files were left cut off (above)");
        }
    }
    figures(
        "metal-sigkill",
        &format!(
            "{} seeds, {kills} kills (SIGKILL) of `update --yes` ({finished_before_kill} runs had finished first), {lock_breaks} stale locks broken with `kprov lock break`, {converged} re-runs converged (longest {full_run:.1?}); torn files {torn}, temporary files left 0",
            seeds.len()
        ),
    );
}

/// A killed kprov never closes its fleet: its ssh masters are stopped by the test support,
/// on demand (between kills) and when the hosts go, with their control directories.
#[test]
fn masters_left_by_a_killed_kprov_are_stopped_by_the_test_support() {
    crate::needs_tier!(SshdHosts);
    let (th, store, rt) = rig(1);
    let address = th.hosts[0].address.clone();
    let work = work(&th, &steps(Duration::ZERO, Duration::from_secs(10)));
    // A fleet that ran a step and was then neither closed nor dropped, as when SIGKILLed.
    let abandoned = || {
        let fleet = new_fleet(&th, &store, Duration::from_secs(3));
        let s = rt.block_on(fleet.run_all(&work));
        assert!(s.ok(), "{s}");
        let master = master_pid(&fleet, &address).expect("master");
        let dir = fleet.control_dir().to_path_buf();
        std::mem::forget(fleet);
        (master, dir)
    };

    let (master, dir) = abandoned();
    assert_eq!(th.stop_kprov_ssh(), [master]);
    // Dead, or a zombie its new parent has not reaped yet.
    assert!(is_dead(master), "master {master} still runs");
    assert!(!dir.exists(), "{} is left", dir.display());
    // Nothing else is left to stop; the hosts still serve (the next fleet runs there).
    assert!(th.stop_kprov_ssh().is_empty());

    let (master, dir) = abandoned();
    drop(th);
    assert!(is_dead(master), "master {master} outlived its hosts");
    assert!(!dir.exists(), "{} outlived its hosts", dir.display());
}

/// A bundle member's upload (resumable) cut at seeded offsets by killing the ssh connection:
/// the target never holds part of the file, the bytes received stay in `PATH.kprov-partial`
/// (a prefix of the content), and the re-run appends the rest to that same file (same inode)
/// and renames it into place once its sha256 is right. A partial file that is not a prefix is
/// removed by the run that finds the digest wrong, and the run after it converges.
fn shell(name: &str, run: &str) -> Step {
    Step {
        name: name.into(),
        files: vec![],
        check: None,
        run: run.into(),
        timeout: Duration::from_secs(30),
    }
}

#[test]
fn resumable_upload_cut_at_seeded_offsets_resumes_from_the_partial_file() {
    crate::needs_tier!(SshdHosts);
    use std::os::unix::fs::MetadataExt;
    let (th, store, rt) = rig(1);
    let host = &th.hosts[0];
    let (size, content) = blob(253);
    let path = "/var/lib/kprov/cache/bundle-blob";
    let partial = format!("{path}.kprov-partial");
    let step = |c: &Bytes| Step {
        name: "bundle blob".into(),
        files: vec![RemoteFile {
            path: path.into(),
            content: c.clone(),
            mode: 0o600,
            resumable: true,
            on_arrival: None,
            sha256: None,
        }],
        check: None,
        run: String::new(),
        timeout: Duration::from_secs(60),
    };
    let partial_upper = host.upper_path(&partial);
    let mut rng = Rng::new(18);
    let mut cuts = 0;
    let seeds = 3;
    for round in 0..seeds {
        let fleet = new_fleet(&th, &store, Duration::from_secs(3));
        // Through the host (not its overlay's upper directory, which the mount caches).
        let rm = rt.block_on(fleet.run_all(&[(
            "host1".into(),
            vec![shell("reset", &format!("rm -f {path}"))],
        )]));
        assert!(rm.ok(), "{rm}");
        let threshold = rng.range(1, size as u64 / 2);
        let uploaded = || {
            std::fs::metadata(&partial_upper)
                .map(|m| m.len())
                .unwrap_or(0)
        };
        let summary = cut_upload(
            &rt,
            &fleet,
            host,
            step(&content),
            round,
            threshold,
            uploaded,
        );
        assert!(
            wait_for(Duration::from_secs(10), || !host
                .processes()
                .iter()
                .any(|p| p == "cat")),
            "round {round}: the remote cat is still running"
        );
        let inode = if summary.ok() {
            assert_eq!(host.read_upper(path).as_deref(), Some(&content[..]));
            None
        } else {
            cuts += 1;
            assert_step_failure(&summary, "host1", "bundle blob");
            assert!(
                host.read_upper(path).is_none(),
                "round {round}: a partial file reached its final place"
            );
            let got = std::fs::read(&partial_upper).expect("the partial upload is kept");
            assert!(
                got.len() as u64 >= threshold && got.len() < size,
                "round {round}"
            );
            assert_eq!(
                &got[..],
                &content[..got.len()],
                "round {round}: not a prefix"
            );
            Some(std::fs::metadata(&partial_upper).unwrap().ino())
        };
        let fleet = new_fleet(&th, &store, Duration::from_secs(3));
        uploads_whole(&rt, &fleet, host, path, step(&content), &content);
        assert!(!partial_upper.exists(), "round {round}: partial left");
        if let Some(inode) = inode {
            assert_eq!(
                std::fs::metadata(host.upper_path(path)).unwrap().ino(),
                inode,
                "round {round}: the re-run did not resume the partial file"
            );
        }
        rt.block_on(fleet.close());
    }
    assert!(cuts > 0, "no upload was cut");

    // A partial file that is not a prefix (a different file's bytes): refused by digest and
    // removed, then the next run starts afresh and converges.
    let fleet = new_fleet(&th, &store, Duration::from_secs(3));
    let foreign = rt.block_on(fleet.run_all(&[(
        "host1".into(),
        vec![shell(
            "foreign partial",
            &format!("rm -f {path}; head -c 1000 /dev/urandom > {partial}"),
        )],
    )]));
    assert!(foreign.ok(), "{foreign}");
    let first = on_host1(&rt, &fleet, step(&content));
    let msg = assert_step_failure(&first, "host1", "bundle blob");
    assert!(msg.contains("the partial upload is removed"), "{msg}");
    assert!(host.read_upper(path).is_none() && !partial_upper.exists());
    uploads_whole(&rt, &fleet, host, path, step(&content), &content);
    rt.block_on(fleet.close());
    figures(
        "upload-resume",
        &format!(
            "{seeds} resumable uploads of 48 MiB cut at seeded offsets ({cuts} cut); partial files in place: 0; resumed on the same inode: {cuts}; a foreign partial file removed and re-uploaded: yes"
        ),
    );
}
