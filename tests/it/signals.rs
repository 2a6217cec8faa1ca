//! Ctrl-C and SIGTERM during the long waits of `update cluster --yes` on AWS (moto, instances
//! that never answer: the lab plays no host for them), and a bastion that never answers. Each
//! run is interrupted once the log shows the wait, never after a fixed sleep; the exit code,
//! the time to exit, the lock (released, read with `lock status`) and the resume message are
//! asserted.

use std::time::Duration;

use crate::support::awsroll::{CreateAws, code, lab_with_zone};
use crate::support::cloudlab::CloudLab;
use crate::support::signals::{ctrl_c, exit_within, log_text, spawn, term, wait_for_log};

/// Within a second of the signal, plus a process's start-up slack on a busy machine.
const EXIT_WITHIN: Duration = Duration::from_secs(2);

fn update(lab: &CloudLab, args: &[&str]) -> std::process::Command {
    let mut cmd = lab.command(assert_cmd::cargo::cargo_bin("kprov"));
    cmd.args(args);
    cmd
}

#[track_caller]
fn unlocked(lab: &CloudLab, cluster: &str) {
    let status = code(lab, &lab.kprov(&["lock", "status", cluster]), 0);
    assert!(status.contains("is not locked"), "{status}");
}

/// Lines of `log` that contain `needle`.
fn lines_with(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn update_yes_stops_within_a_second_of_sigint_or_sigterm_during_the_ssh_wait() {
    let cluster = "demo.sig-ssh.example";
    let lab = lab_with_zone("sig-ssh.example");
    CreateAws::new(cluster)
        .flags(&["--node-count", "2"])
        .run(&lab);
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("update.log");
    let args = [
        "update",
        "cluster",
        cluster,
        "--yes",
        "--ssh-private-address",
    ];

    // 1. Ctrl-C while 3 instances do not answer: out within a second, lock released.
    let mut child = spawn(update(&lab, &args), &log);
    wait_for_log(&mut child, &log, "waiting for SSH", 240);
    // Three polls of the wait (2 s apart) happen before the signal: the same cause is
    // printed once per instance, not once per poll.
    let first = std::time::Instant::now();
    while first.elapsed() < Duration::from_secs(7) {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "{}",
            log_text(&log)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    ctrl_c(&child);
    let (code_int, took) = exit_within(&mut child, 30);
    let err = log_text(&log);
    assert_eq!(code_int, Some(130), "{err}");
    assert!(took < EXIT_WITHIN, "exit took {took:?}\n{err}");
    assert!(
        err.contains("interrupted by SIGINT while waiting for SSH on i-"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "Resume with `kprov update cluster {cluster} --yes`."
        )),
        "{err}"
    );
    let waits = lines_with(&err, "waiting for SSH (");
    assert!(
        (3..=6).contains(&waits),
        "one line per instance and change, not per poll: {waits}\n{err}"
    );
    unlocked(&lab, cluster);

    // 2. SIGTERM (a supervisor) at the same wait of the next run: 143, lock released.
    let mut child = spawn(update(&lab, &args), &log);
    wait_for_log(&mut child, &log, "waiting for SSH", 240);
    term(&child);
    let (code_term, took) = exit_within(&mut child, 30);
    let err = log_text(&log);
    assert_eq!(code_term, Some(143), "{err}");
    assert!(took < EXIT_WITHIN, "exit took {took:?}\n{err}");
    assert!(err.contains("interrupted by SIGTERM while"), "{err}");
    unlocked(&lab, cluster);

    // 3. The cloud resources the interrupted runs made are there: the next preview has
    //    nothing left to create.
    let again = code(&lab, &lab.kprov(&["update", "cluster", cluster]), 0);
    assert!(!again.contains("Will create"), "{again}");
    eprintln!("signal figures: SIGINT to exit and SIGTERM to exit, each under {EXIT_WITHIN:?}");
}

#[test]
fn a_bastion_that_never_answers_stops_the_run_after_its_own_wait_and_a_signal_ends_that_wait() {
    let cluster = "demo.sig-bastion.example";
    let lab = lab_with_zone("sig-bastion.example");
    CreateAws::new(cluster)
        .flags(&["--topology", "private", "--bastion"])
        .run(&lab);
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("update.log");

    // 1. SIGINT during the bastion's wait.
    let args = ["update", "cluster", cluster, "--yes"];
    let mut child = spawn(update(&lab, &args), &log);
    wait_for_log(&mut child, &log, "bastion", 240);
    wait_for_log(&mut child, &log, "waiting for SSH", 60);
    ctrl_c(&child);
    let (c, took) = exit_within(&mut child, 30);
    let err = log_text(&log);
    assert_eq!(c, Some(130), "{err}");
    assert!(took < EXIT_WITHIN, "exit took {took:?}\n{err}");
    assert!(
        err.contains("interrupted by SIGINT while waiting for SSH on bastion"),
        "{err}"
    );
    unlocked(&lab, cluster);

    // 2. Its own wait (short here) ends the run, its cause in the summary; the nodes behind
    //    it are not waited for.
    let started = std::time::Instant::now();
    let o = lab.kprov(&["update", "cluster", cluster, "--yes", "--ssh-wait", "4s"]);
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "the bastion of {cluster} (bastion.{cluster}) did not answer SSH within 4s:"
        )),
        "{err}"
    );
    assert!(err.contains("were not contacted"), "{err}");
    assert_eq!(lines_with(&err, "waiting for SSH at"), 0, "{err}");
    assert!(took < Duration::from_secs(60), "took {took:?}\n{err}");
    unlocked(&lab, cluster);
}
