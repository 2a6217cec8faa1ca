//! Signals as an operator sends them, for the tests that interrupt a running kprov: the child
//! in a process group of its own (a terminal's job), Ctrl-C to the group, SIGTERM to the
//! process, and bounded waits on what the child wrote (events, never a fixed sleep).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `cmd` in a process group of its own, stderr to `log`.
pub fn spawn(mut cmd: Command, log: &Path) -> Child {
    use std::os::unix::process::CommandExt;
    cmd.stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log"))
        .process_group(0)
        .spawn()
        .expect("spawn kprov")
}

/// What the child wrote to `log` so far.
pub fn log_text(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Polls every 50 ms until `log` holds `needle`; panics (the child killed, its log shown)
/// when the child exits first or `secs` pass.
pub fn wait_for_log(child: &mut Child, log: &Path, needle: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !log_text(log).contains(needle) {
        if Instant::now() > deadline || child.try_wait().expect("wait").is_some() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("never saw {needle:?}; log:\n{}", log_text(log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGINT to the child's process group, as a terminal's Ctrl-C sends it.
pub fn ctrl_c(child: &Child) {
    let st = Command::new("kill")
        .args(["-INT", "--", &format!("-{}", child.id())])
        .status()
        .expect("kill");
    assert!(st.success(), "SIGINT not delivered");
}

/// SIGTERM to the child alone, as a service manager or CI timeout sends it.
pub fn term(child: &Child) {
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "SIGTERM not delivered");
}

/// Waits (bounded) for the child to exit: its exit code and how long it took.
pub fn exit_within(child: &mut Child, secs: u64) -> (Option<i32>, Duration) {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return (st.code(), start.elapsed());
        }
        if start.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kprov did not exit within {secs}s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `cmd` until a step held by a test stand-in is reached (`arrived`, polled every 50 ms,
/// bounded by 300 s), sends Ctrl-C, and lets the step go (`release`) once kprov exited (or
/// when it never arrived, before panicking with kprov's log). Returns the exit code, the time
/// from the signal to the exit, and what kprov wrote.
pub fn interrupt_held_step(
    cmd: Command,
    what: &str,
    arrived: impl Fn() -> bool,
    release: impl FnOnce(),
) -> (Option<i32>, Duration, String) {
    let dir = tempfile::tempdir().expect("tmp");
    let log = dir.path().join("kprov.log");
    let mut child = spawn(cmd, &log);
    let deadline = Instant::now() + Duration::from_secs(300);
    while !arrived() {
        if Instant::now() > deadline || child.try_wait().expect("wait").is_some() {
            let _ = child.kill();
            let _ = child.wait();
            release();
            panic!("{what} never came:\n{}", log_text(&log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    ctrl_c(&child);
    let (code, took) = exit_within(&mut child, 60);
    release();
    (code, took, log_text(&log))
}
