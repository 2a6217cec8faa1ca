//! The real-hosts tier (issue 17, docs/testing.md): real Kubernetes v1.36.2 binaries from the
//! shared archive on machine-like hosts (systemd as PID 1 in namespaces), reached by kprov
//! over SSH. Needs root and ../shared/real-k8s/k8s-1.36.2-amd64.tar.xz: skipped otherwise
//! (a failure in CI when the archive is missing). Run alone with scripts/test-real.
//!
//! Scenarios are `scenario_NAME`; `hosts_boot` proves the hosts themselves.

use std::time::{Duration, Instant};

use crate::support::realhosts::{self, RealLab};
use crate::support::realk8s::{self, Binaries, ImageKind};

/// The hosts are machines: two boot with systemd running and no failed unit, sshd answers
/// with strict host keys, the cgroup namespace roots systemd at `/`, /proc/sys is read-only
/// except net/, the archive's containerd runs under the host's systemd and imports a built
/// image, and teardown leaves nothing behind.
#[test]
fn hosts_boot() {
    if realhosts::skip() {
        return;
    }
    let t0 = Instant::now();
    let bins = Binaries::get();
    let pause = realk8s::image(bins, &bins.bin, "v1.36.2", ImageKind::Pause);
    eprintln!("binaries and pause image ready in {:?}", t0.elapsed());

    let mut lab = RealLab::start();
    let t1 = Instant::now();
    lab.boot(&["node1", "node2"]);
    eprintln!("2 hosts booted in {:?} (wall)", t1.elapsed());
    let key = lab.client_key.clone();
    let known_hosts = lab.known_hosts_file();
    for h in lab.hosts() {
        eprintln!("{}: {} booted in {:?}", h.name, h.address, h.boot_time);
        let state = h
            .exec("systemctl is-system-running || true")
            .expect("systemctl");
        let failed = h
            .exec("systemctl list-units --failed --no-legend --plain")
            .expect("failed units");
        assert!(
            state.trim() == "running" && failed.trim().is_empty(),
            "{}: systemd {state:?}, failed units:\n{failed}",
            h.name
        );
        // The host is the machine kprov sees: its name, its address, its sshd and key.
        let said = h
            .ssh_with(&key, &known_hosts, "hostname; cat /etc/machine-id")
            .unwrap_or_else(|e| panic!("{}: ssh: {e}", h.name));
        let mut lines = said.lines();
        assert_eq!(lines.next(), Some(h.name.as_str()));
        let machine_id = lines.next().unwrap_or_default().to_string();
        assert_ne!(
            machine_id,
            std::fs::read_to_string("/etc/machine-id")
                .unwrap_or_default()
                .trim(),
            "{}: the machine's machine-id",
            h.name
        );
        assert_eq!(machine_id.len(), 32, "{}: machine-id {machine_id:?}", h.name);
    }
    let (n1, n2) = (lab.host("node1"), lab.host("node2"));
    assert_ne!(
        n1.read_file("/etc/machine-id").expect("machine-id"),
        n2.read_file("/etc/machine-id").expect("machine-id")
    );

    // Strict host keys: node2's key under node1's address is refused.
    let wrong = lab.dir().join("wrong_known_hosts");
    let n2_key = lab
        .known_hosts()
        .lines()
        .find(|l| l.starts_with(&format!("{} ", n2.address)))
        .expect("node2 key")
        .replacen(&n2.address.to_string(), &n1.address.to_string(), 1);
    std::fs::write(&wrong, format!("{n2_key}\n")).expect("known_hosts");
    let refused = n1.ssh_with(&key, &wrong, "true");
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("HOST IDENTIFICATION HAS CHANGED")
            || e.contains("Host key verification failed")),
        "ssh to node1 with node2's key trusted: {refused:?}"
    );

    // The cgroup namespace: systemd sees itself at the root of every hierarchy, while on
    // this machine it lives in the host's own cgroup, where it made its slices.
    let inside = String::from_utf8(n1.read_file("/proc/1/cgroup").expect("cgroup")).unwrap();
    assert!(
        inside.lines().all(|l| l.ends_with(":/") || l.ends_with(":/init.scope")),
        "node1's PID 1 cgroups, seen inside:\n{inside}"
    );
    let outside = std::fs::read_to_string(format!("/proc/{}/cgroup", n1.pid1())).unwrap();
    assert!(outside.contains("/kprov-real/"), "seen outside:\n{outside}");
    assert!(
        n1.cgroups()
            .iter()
            .any(|c| c.starts_with("/sys/fs/cgroup/systemd") && c.join("system.slice").is_dir()),
        "no system.slice in node1's systemd cgroup {:?}",
        n1.cgroups()
    );

    // /proc/sys: global keys read-only, the kubelet's tunables as it wants them, net/ per
    // network namespace and writable; the machine keeps ip_forward=0.
    let global = n1.exec("echo 4194304 > /proc/sys/kernel/pid_max");
    assert!(
        global.as_ref().is_err_and(|e| e.contains("Read-only")),
        "writing kernel.pid_max on node1: {global:?}"
    );
    assert_eq!(
        n1.exec("cat /proc/sys/vm/overcommit_memory /proc/sys/kernel/panic")
            .expect("sysctl"),
        "1\n10\n"
    );
    n1.exec("sysctl -qw net.ipv4.ip_forward=1")
        .expect("net.* is the host's own");
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap(),
        "0\n",
        "the machine's ip_forward"
    );
    let sys = n1.exec("touch /sys/kernel/kprov-test");
    assert!(sys.is_err(), "/sys writable on node1: {sys:?}");

    // The archive's containerd under the host's systemd imports a built image.
    let t2 = Instant::now();
    let ctr = bins.path("ctr");
    n1.exec(&format!(
        "set -e\n\
         install -m 0755 {bin}/containerd {bin}/containerd-shim-runc-v2 {ctr} /usr/local/bin/\n\
         cat > /etc/systemd/system/containerd.service <<'EOF'\n\
         [Unit]\nDescription=containerd (real-hosts tier)\nAfter=network.target\n\
         [Service]\nType=notify\nExecStart=/usr/local/bin/containerd\nDelegate=yes\nKillMode=process\n\
         [Install]\nWantedBy=multi-user.target\n\
         EOF\n\
         systemctl daemon-reload\nsystemctl start containerd\n",
        bin = bins.bin.display(),
        ctr = ctr.display()
    ))
    .unwrap_or_else(|e| {
        panic!(
            "containerd on node1: {e}\n{}",
            n1.exec("journalctl -u containerd --no-pager | tail -30")
                .unwrap_or_default()
        )
    });
    let imported = n1
        .exec_bounded(
            &format!(
                "ctr -n k8s.io images import {} >/dev/null && ctr -n k8s.io images ls -q",
                pause.path.display()
            ),
            Duration::from_secs(120),
        )
        .expect("ctr import");
    assert!(
        imported.lines().any(|l| l == pause.reference),
        "images on node1 after import: {imported}"
    );
    eprintln!(
        "containerd started and {} imported in {:?}",
        pause.reference,
        t2.elapsed()
    );

    let t3 = Instant::now();
    let left = lab.teardown_and_check();
    eprintln!("teardown in {:?}", t3.elapsed());
    assert!(left.is_empty(), "left after teardown: {left:#?}");
}

/// `scripts/test-real --down`: removes the lab a `--keep` run left running.
#[test]
#[ignore = "run by scripts/test-real --down"]
fn down() {
    for dir in realhosts::down_kept() {
        println!("removed kept lab {}", dir.display());
    }
}
