//! Machine-like test hosts for the real-Kubernetes tier (issue 17): each host is systemd as
//! PID 1 in its own network + mount + UTS + IPC + PID + cgroup namespaces, so that real
//! containerd, kubelet, kubeadm and etcd run on it as on a machine, and kprov reaches it only
//! over SSH (sshd is Debian's `ssh.service` under the host's systemd, with a host key of its
//! own and the test client key authorised for root).
//!
//! What a host is made of (the facts come from ../shared/real-k8s/README.md and its recipe):
//! - network: a veth to the lab's bridge, the host's address in the lab's /24 of
//!   198.18.0.0/15 (claimed with `testhosts`' allocator), default route via the bridge's
//!   address in the root namespace, which keeps `ip_forward=0`: nothing leaves the lab;
//! - cgroups: a cgroup per host in every v1 hierarchy and in the unified one, below the test
//!   process's own, joined before the namespaces are made so the cgroup namespace is rooted
//!   there (systemd inside sees itself at `/`), mounted inside in the same hybrid layout;
//! - files: overlays over /etc /var/lib /opt /usr/local /var/log; plain directories bound
//!   over /var/lib/containerd, /var/lib/kubelet, /var/lib/etcd (overlayfs cannot be the upper
//!   layer of containerd's snapshots); tmpfs over /run /tmp /root /home; a fresh /proc whose
//!   /proc/sys is read-only except net/, the six kernel tunables the kubelet checks bound as
//!   files (no host ever writes this machine's kernel.* or vm.*); /sys read-only; a private
//!   /dev;
//! - identity: hostname, machine-id, /etc/hosts of its own; units that would touch this
//!   machine or are this machine's own services masked.
//!
//! Where this is not a machine (one shared kernel, cgroup v1, no CAP_SYS_RESOURCE, no kernel
//! modules, no NTP, no DMI): see docs/testing.md.
//!
//! Teardown is by `Drop` and by PID, from the lab's state file (`lab.json`): poweroff of each
//! host's systemd (SIGRTMIN+4), what remains in its namespaces and cgroups killed, netns and
//! veths deleted, cgroups removed depth-first, bridge and directory removed. A killed run's
//! leftovers are reaped by the next lab (`reap_orphans`); a lab kept on purpose
//! (`KPROV_REAL_KEEP=1`, scripts/test-real --keep) is left alone until `down_kept`.

use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::support::testhosts::{claim_block, is_dead, keygen, plug, run, sh, stop_kprov_ssh};

/// Directories each host gets a private copy-on-write view of.
const OVERLAYS: [&str; 5] = ["/etc", "/var/lib", "/opt", "/usr/local", "/var/log"];
/// Directories each host gets as plain directories of this machine's file system.
const DATA: [&str; 3] = ["containerd", "kubelet", "etcd"];
/// The kernel tunables the kubelet checks (and would otherwise write), with the values it
/// wants: each host sees them as files.
const SYSCTL_FILES: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];
/// v1 controllers mounted inside each host (this machine's hybrid layout).
const V1_CONTROLLERS: [&str; 8] = [
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids",
];
/// Units no host may run: they would touch this machine (udev, modules, binfmt, the clock,
/// the console), or are not wanted in a node (network managers: the harness sets the address).
/// This machine's own enabled services (postgresql, haproxy, ...) are masked too, found at
/// boot time from /etc/systemd/system/*.wants.
const MASKED: &[&str] = &[
    "systemd-udevd.service",
    "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket",
    "systemd-udev-trigger.service",
    "systemd-udev-settle.service",
    "systemd-modules-load.service",
    "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount",
    "proc-sys-fs-binfmt_misc.mount",
    "sys-kernel-config.mount",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "dev-hugepages.mount",
    "sys-fs-fuse-connections.mount",
    "systemd-pstore.service",
    "systemd-timesyncd.service",
    "systemd-random-seed.service",
    "systemd-firstboot.service",
    "systemd-repart.service",
    "kmod-static-nodes.service",
    "getty@tty1.service",
    "getty.target",
    "console-getty.service",
    "serial-getty@.service",
    "systemd-networkd.service",
    "systemd-resolved.service",
    "networking.service",
    "etcd.service",
    "etcd2.service",
    "postgresql.service",
    "haproxy.service",
    "e2scrub_reap.service",
    "e2scrub_all.timer",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "fstrim.timer",
    "man-db.timer",
];
/// /24s claimed per lab: hosts, services, (unused), then pods (the second half, one /24 per
/// host).
const BLOCK_24S: u32 = 16;
/// Longest a host may take from spawn to `systemctl is-system-running` answering.
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest a host's systemd may take to power off before it is killed.
const POWEROFF_TIMEOUT: Duration = Duration::from_secs(30);
/// Where a kept lab is recorded for `scripts/test-real --down`.
const KEPT_FILE: &str = "/var/tmp/kprov-real-kept";
/// Glibc's SIGRTMIN is 34; systemd powers off on SIGRTMIN+4.
const SIGRTMIN_PLUS_4: i32 = 38;

/// One lab at a time per test process: a control plane takes ~1.1 GiB, and the tier is
/// sized for 2 cores.
static LAB_LOCK: Mutex<()> = Mutex::new(());

/// Holds off every lab of this process (and so its reaper) while held.
pub fn no_lab() -> MutexGuard<'static, ()> {
    LAB_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// What teardown needs to know about a host, also after the process that made it died.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct HostState {
    name: String,
    netns: String,
    veth: String,
    /// The host's cgroup directory in every hierarchy of this machine.
    cgroups: Vec<PathBuf>,
    /// `unshare` (the spawned process) and the host's PID 1 (systemd).
    unshare_pid: Option<u32>,
    pid1: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct LabState {
    idx: u32,
    count: u32,
    dir: PathBuf,
    hosts: Vec<HostState>,
}

/// A boot's outcome: PID 1 and the boot time, or PID 1 if found and what went wrong.
type Booted = Result<(u32, Duration), (Option<u32>, String)>;

/// A machine-like host (see the module doc).
pub struct RealHost {
    pub name: String,
    pub address: Ipv4Addr,
    /// The pod /24 this host's CNI bridge hands out (host-local IPAM); other hosts route it
    /// to this host (`RealLab::route_pods`).
    pub pod_cidr: Ipv4Net,
    /// Spawn to `systemctl is-system-running` answering running/degraded.
    pub boot_time: Duration,
    state: HostState,
    dir: PathBuf,
    child: Mutex<Option<Child>>,
}

/// A lab of real hosts on one bridge, with every address it uses in one claimed block of
/// 198.18.0.0/15.
pub struct RealLab {
    /// The whole claimed block (16 /24s).
    pub block: Ipv4Net,
    /// The hosts' /24; the first address is `gateway`.
    pub hosts_net: Ipv4Net,
    /// The root namespace's address on the lab bridge: the hosts' default route, and where
    /// the machine (kubectl with a kept cluster's kubeconfig) reaches the hosts from.
    pub gateway: Ipv4Addr,
    /// An address in `hosts_net` kept free for a load balancer (the HA scenario's haproxy).
    pub lb_address: Ipv4Addr,
    /// Kubernetes service CIDR for the lab's clusters.
    pub service_cidr: Ipv4Net,
    /// Kubernetes pod CIDR (`podSubnet`): holds every host's `pod_cidr`.
    pub pod_cidr: Ipv4Net,
    /// Private key (ed25519) authorised for root on every host.
    pub client_key: PathBuf,
    hosts: Vec<RealHost>,
    state: LabState,
    bridge: String,
    /// Torn down already (`teardown_and_check`): `Drop` has nothing left to do.
    done: bool,
    _lock: MutexGuard<'static, ()>,
}

/// Why the tier cannot run here, or `None` when it can (the gate, CI's refusal to skip:
/// support/tiers.rs).
pub fn unavailable() -> Option<String> {
    if !crate::support::tiers::running_as_root() {
        return Some("needs root".into());
    }
    let archive = crate::support::realk8s::archive_path();
    if !archive.exists() {
        return Some(format!(
            "needs {} (KPROV_REAL_K8S_DIR overrides its directory)",
            archive.display()
        ));
    }
    for tool in [
        "/lib/systemd/systemd",
        "/usr/sbin/sshd",
        "/usr/sbin/runc",
        "/usr/lib/cni/bridge",
        "/usr/bin/etcdctl",
    ] {
        if !Path::new(tool).exists() {
            return Some(format!("needs {tool}: run scripts/install-test-deps"));
        }
    }
    None
}

/// For a test's first line: returns `true` when the tier is skipped (the one gate:
/// `support::skip`).
pub fn skip() -> bool {
    crate::support::skip(crate::support::Tier::RealHosts)
}

/// This process's cgroup directory in every hierarchy of the machine (v1 controllers,
/// name=systemd, unified), as (mount directory name, absolute path).
fn own_cgroups() -> Vec<(String, PathBuf)> {
    let text = fs::read_to_string("/proc/self/cgroup").expect("/proc/self/cgroup");
    let mut out = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
        let (Some(controllers), Some(path)) = (controllers, path) else {
            continue;
        };
        let mount = match controllers {
            "" => "unified".to_string(),
            "name=systemd" => "systemd".to_string(),
            c => c.to_string(),
        };
        let base = Path::new("/sys/fs/cgroup").join(&mount);
        if base.is_dir() {
            out.push((mount, base.join(path.trim_start_matches('/'))));
        }
    }
    out
}

/// Runs `cmd`, killing it after `limit`; its stdout, or why it failed.
fn run_bounded(cmd: &mut Command, limit: Duration) -> Result<String, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{cmd:?}: no answer within {limit:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("{cmd:?}: {e}")),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{cmd:?}: {}: {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn alive(pid: u32) -> bool {
    !is_dead(pid)
}

fn wait_dead(pids: &[u32], limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while pids.iter().any(|p| alive(*p)) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// The PIDs in a cgroup directory and below it.
fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        if let Ok(procs) = fs::read_to_string(d.join("cgroup.procs")) {
            out.extend(
                procs
                    .split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(e.path());
            }
        }
    }
    out
}

/// Removes a cgroup directory and everything below it, deepest first (cgroup directories
/// hold only kernel files, which go with their directory).
fn rmdir_cgroup_tree(dir: &Path) {
    let mut dirs = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(e.path());
            }
        }
        dirs.push(d);
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    // A cgroup whose last process just died may stay busy for a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    for d in dirs {
        while d.exists() && fs::remove_dir(&d).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Tears a host down from its recorded state (also a dead run's): poweroff, then kill by PID.
fn teardown_host(h: &HostState) {
    if let Some(pid1) = h.pid1
        && alive(pid1)
        && fs::read_to_string(format!("/proc/{pid1}/comm")).is_ok_and(|c| c.trim() == "systemd")
    {
        // SAFETY: a signal to a PID we recorded as this host's systemd (checked by name).
        unsafe { kill(pid1 as i32, SIGRTMIN_PLUS_4) };
        if !wait_dead(&[pid1], POWEROFF_TIMEOUT) {
            eprintln!(
                "real host {}: systemd not down after {POWEROFF_TIMEOUT:?}, killed",
                h.name
            );
        }
    }
    // Whatever remains (a PID 1 that did not power off, a process that escaped): by PID.
    for _ in 0..3 {
        let mut pids: Vec<u32> = h.cgroups.iter().flat_map(|c| cgroup_pids(c)).collect();
        pids.extend(
            sh(&["ip", "netns", "pids", &h.netns])
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
        pids.extend(h.pid1);
        pids.retain(|p| alive(*p));
        pids.sort_unstable();
        pids.dedup();
        if pids.is_empty() {
            break;
        }
        for p in &pids {
            // SAFETY: plain kill(2) of a PID found in this host's cgroups or namespace.
            unsafe { kill(*p as i32, 9) };
        }
        wait_dead(&pids, Duration::from_secs(10));
    }
    let _ = sh(&["ip", "netns", "del", &h.netns]);
    let _ = sh(&["ip", "link", "del", &h.veth]);
    for c in &h.cgroups {
        rmdir_cgroup_tree(c);
        // `kprov-real` itself, once no other lab's host is in it.
        if let Some(parent) = c.parent() {
            let _ = fs::remove_dir(parent);
        }
    }
}

/// Tears down everything a lab's state file names, then its bridges and directory.
fn teardown_lab(state: &LabState) {
    for h in &state.hosts {
        teardown_host(h);
    }
    // Only bridges still labelled with this lab's directory: once a dead lab's bridges are
    // gone, another lab may have claimed the same block (and names) meanwhile.
    let links = sh(&["ip", "-o", "link", "show", "type", "bridge"]).unwrap_or_default();
    let mark = format!("dir={}", state.dir.display());
    for j in state.idx..state.idx + state.count {
        let bridge = format!("kpb{j}");
        let ours = links.lines().any(|l| {
            l.split(": ").nth(1) == Some(bridge.as_str()) && l.split_whitespace().any(|f| f == mark)
        });
        if ours {
            let _ = sh(&["ip", "link", "del", &bridge]);
        }
    }
    if state.dir.starts_with("/var/tmp") && state.dir.to_string_lossy().contains("/kprov-real-") {
        let _ = fs::remove_dir_all(&state.dir);
    }
}

fn read_state(dir: &Path) -> Option<LabState> {
    serde_json::from_slice(&fs::read(dir.join("lab.json")).ok()?).ok()
}

/// A lab whose owner died (SIGKILL, a CI timeout) never ran `Drop`: its bridge's alias names
/// the owner PID and the lab directory, whose state file says what to remove.
fn reap_orphans() {
    let Ok(links) = sh(&["ip", "-o", "link", "show", "type", "bridge"]) else {
        return;
    };
    for line in links.lines() {
        let Some(alias) = line.split("alias kprov-real ").nth(1) else {
            continue;
        };
        // A lab `kept` on purpose has no PID: `down_kept` removes it.
        let Some(dir) = super::testhosts::dead_owner_dir(alias) else {
            continue;
        };
        if let Some(state) = read_state(Path::new(&dir)) {
            teardown_lab(&state);
        }
    }
    reap_load_balancers(&live_lab_dirs());
}

/// The directories of labs whose owner is alive (their bridges' aliases).
fn live_lab_dirs() -> Vec<PathBuf> {
    let links = sh(&["ip", "-o", "link", "show", "type", "bridge"]).unwrap_or_default();
    links
        .lines()
        .filter_map(|l| l.split("alias kprov-real ").nth(1))
        .filter_map(|alias| {
            let field = |k: &str| alias.split_whitespace().find_map(|f| f.strip_prefix(k));
            let (pid, dir) = (field("pid=")?, field("dir=")?);
            Path::new(&format!("/proc/{pid}"))
                .exists()
                .then(|| PathBuf::from(dir))
        })
        .collect()
}

/// Whether `path` is a lab's load-balancer configuration (`/var/tmp/kprov-real-*/haproxy.cfg`),
/// and if so its lab directory.
fn lab_of_haproxy_config(path: &Path) -> Option<&Path> {
    let dir = path.parent()?;
    let base = dir.file_name()?.to_str()?;
    (path.file_name()? == "haproxy.cfg"
        && dir.parent()? == Path::new("/var/tmp")
        && base.starts_with("kprov-real-")
        && base != "kprov-real-cache")
        .then_some(dir)
}

/// The site load balancers labs start in the ROOT namespace (`haproxy -db -f
/// LAB/haproxy.cfg`, the ha scenario's) outlive a killed run: they hold their port (6443) on
/// this machine, which the provision tests' hosts (mount + UTS namespaces sharing the root
/// network namespace) then see in kprov's preflight. Each whose configuration lies in a lab
/// directory no live lab owns is killed. Returns the PIDs killed.
pub fn reap_load_balancers(live: &[PathBuf]) -> Vec<u32> {
    let mut killed = Vec::new();
    let Ok(procs) = fs::read_dir("/proc") else {
        return killed;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_haproxy = argv
            .first()
            .and_then(|a| Path::new(std::str::from_utf8(a).ok()?).file_name())
            .is_some_and(|n| n == "haproxy");
        let config = argv
            .windows(2)
            .find(|w| w[0] == b"-f")
            .and_then(|w| std::str::from_utf8(w[1]).ok())
            .map(PathBuf::from);
        let Some(config) = config.filter(|_| is_haproxy) else {
            continue;
        };
        match lab_of_haproxy_config(&config) {
            Some(dir) if !live.iter().any(|l| l == dir) => {
                // SAFETY: kill(2) with a PID and a signal number; no memory is shared.
                unsafe { kill(pid as i32, 9) };
                killed.push(pid);
            }
            _ => {}
        }
    }
    wait_dead(&killed, Duration::from_secs(5));
    killed
}

/// Whether this test was asked to leave its lab running (`scripts/test-real --keep` on the
/// last test): a scenario then skips its own clean-up steps and prints `KUBECONFIG=<path>`.
pub fn keep_requested() -> bool {
    std::env::var("KPROV_REAL_KEEP").as_deref() == Ok("1")
}

/// Tears down the labs kept by `KPROV_REAL_KEEP=1` (scripts/test-real --down); returns
/// their directories.
pub fn down_kept() -> Vec<PathBuf> {
    let mut done = Vec::new();
    for dir in fs::read_to_string(KEPT_FILE).unwrap_or_default().lines() {
        let dir = PathBuf::from(dir);
        if let Some(state) = read_state(&dir) {
            teardown_lab(&state);
            done.push(dir);
        }
    }
    let _ = fs::remove_file(KEPT_FILE);
    done
}

impl RealLab {
    /// A lab for a cluster scenario: `None` where the real tier is skipped ([`skip`]), else
    /// started with `names` booted and the pod routes between them.
    pub fn for_cluster(names: &[&str]) -> Option<RealLab> {
        if skip() {
            return None;
        }
        let mut lab = RealLab::start();
        lab.boot(names);
        lab.route_pods();
        Some(lab)
    }

    /// Claims a block of 198.18.0.0/15, makes the lab's bridge, directory and client key.
    /// Waits for any other lab of this process to be dropped first.
    pub fn start() -> RealLab {
        crate::support::tiers::require(crate::support::Tier::RealHosts);
        let lock = LAB_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        reap_orphans();
        let dir = tempfile::Builder::new()
            .prefix("kprov-real-")
            // Not under /tmp, /run, /root or /home: the hosts mount tmpfs over those.
            .tempdir_in("/var/tmp")
            .expect("lab dir")
            .keep();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
        let (idx, block) = claim_block(BLOCK_24S, None);
        let bridge = format!("kpb{idx}");
        let state = LabState {
            idx,
            count: BLOCK_24S,
            dir: dir.clone(),
            hosts: Vec::new(),
        };
        let mut nets = block.subnets(24).expect("/24s");
        let hosts_net = nets.next().expect("hosts /24");
        let service_cidr = nets.next().expect("services /24");
        let pod_cidr = block
            .subnets(block.prefix_len() + 1)
            .expect("halves")
            .nth(1)
            .expect("pods");
        let gateway = hosts_net.hosts().next().expect("gateway");
        let lb_address = Ipv4Addr::from(u32::from(hosts_net.broadcast()) - 1);
        let lab = RealLab {
            block,
            hosts_net,
            gateway,
            lb_address,
            service_cidr,
            pod_cidr,
            client_key: dir.join("client_key"),
            hosts: Vec::new(),
            state,
            bridge,
            done: false,
            _lock: lock,
        };
        lab.save_state();
        for j in idx..idx + BLOCK_24S {
            lab.label(&format!("kpb{j}"), false);
        }
        keygen(&lab.client_key);
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{gateway}/24"),
            "dev",
            &lab.bridge,
        ])
        .expect("bridge address");
        sh(&["ip", "link", "set", &lab.bridge, "up"]).expect("bridge up");
        lab
    }

    /// The alias `reap_orphans` reads (owner PID and directory), or `kept`.
    fn label(&self, bridge: &str, kept: bool) {
        let alias = if kept {
            format!("kprov-real kept dir={}", self.state.dir.display())
        } else {
            format!(
                "kprov-real pid={} dir={}",
                std::process::id(),
                self.state.dir.display()
            )
        };
        sh(&["ip", "link", "set", "dev", bridge, "alias", &alias]).expect("bridge alias");
    }

    fn save_state(&self) {
        let path = self.state.dir.join("lab.json");
        let tmp = path.with_extension("json.new");
        fs::write(&tmp, serde_json::to_vec_pretty(&self.state).expect("state")).expect("state");
        fs::rename(&tmp, &path).expect("state");
    }

    pub fn dir(&self) -> &Path {
        &self.state.dir
    }

    /// Boots one host per name (in parallel) and waits until each one's systemd is up and
    /// its sshd answers. Hosts get addresses .11, .12, ... of `hosts_net` in boot order.
    pub fn boot(&mut self, names: &[&str]) -> Vec<&RealHost> {
        let first = self.hosts.len();
        for name in names {
            assert!(
                name.len() <= 20
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "host name {name:?}: lowercase letters, digits and '-', at most 20"
            );
            let i = self.hosts.len();
            let host = self.spawn_host(i, name);
            self.state.hosts.push(host.state.clone());
            self.hosts.push(host);
            self.save_state();
        }
        let started: Vec<(usize, Booted)> = std::thread::scope(|s| {
            let handles: Vec<_> = self.hosts[first..]
                .iter()
                .enumerate()
                .map(|(k, h)| (first + k, s.spawn(|| h.wait_booted())))
                .collect();
            handles
                .into_iter()
                .map(|(i, t)| (i, t.join().expect("boot thread")))
                .collect()
        });
        let mut failed = Vec::new();
        for (i, r) in started {
            // Record PID 1 before failing, so teardown finds it.
            match r {
                Ok((pid1, took)) => {
                    self.hosts[i].state.pid1 = Some(pid1);
                    self.hosts[i].boot_time = took;
                }
                Err((pid1, e)) => {
                    self.hosts[i].state.pid1 = pid1;
                    failed.push(e);
                }
            }
            self.state.hosts[i] = self.hosts[i].state.clone();
        }
        self.save_state();
        assert!(failed.is_empty(), "{}", failed.join("\n"));
        self.save_state();
        for h in &self.hosts[first..] {
            h.wait_ssh(&self.client_key, &self.known_hosts_file());
        }
        self.hosts[first..].iter().collect()
    }

    fn spawn_host(&mut self, i: usize, name: &str) -> RealHost {
        // Names unique to this lab (its directory's random suffix), not to its block: a dead
        // lab's state, reaped by another process, must never name a live lab's namespace,
        // veth or cgroup after the block was claimed again.
        let token = self
            .state
            .dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("kprov-real-"))
            .expect("lab directory kprov-real-XXXXXX")
            .to_string();
        let address = Ipv4Addr::from(u32::from(self.hosts_net.network()) + 11 + i as u32);
        let pod_cidr = self
            .pod_cidr
            .subnets(24)
            .expect("pod /24s")
            .nth(i)
            .unwrap_or_else(|| panic!("more hosts than pod /24s in {}", self.pod_cidr));
        let dir = self.state.dir.join(name);
        assert!(!dir.exists(), "two hosts named {name}");
        for d in OVERLAYS {
            let flat = d.trim_start_matches('/').replace('/', "_");
            fs::create_dir_all(dir.join("upper").join(&flat)).expect("upper dir");
            fs::create_dir_all(dir.join("work").join(&flat)).expect("work dir");
        }
        for d in DATA {
            fs::create_dir_all(dir.join("data").join(d)).expect("data dir");
        }
        fs::create_dir_all(dir.join("sysctl")).expect("sysctl dir");
        for (k, v) in SYSCTL_FILES {
            fs::write(
                dir.join("sysctl").join(k.replace('/', "_")),
                format!("{v}\n"),
            )
            .expect("sysctl file");
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
        let cgroups: Vec<PathBuf> = own_cgroups()
            .into_iter()
            .map(|(_, base)| base.join("kprov-real").join(format!("{token}-{name}")))
            .collect();
        let mut state = HostState {
            name: name.to_string(),
            netns: format!("kprovr-{token}-{i}"),
            veth: format!("kp{token}x{i}"),
            cgroups,
            unshare_pid: None,
            pid1: None,
        };
        // Recorded before anything is made, so a failure half-way is torn down too.
        self.state.hosts.push(state.clone());
        self.save_state();
        self.state.hosts.pop();

        write_etc(&dir, name, address, self.gateway, &self.client_key);
        for c in &state.cgroups {
            fs::create_dir_all(c).unwrap_or_else(|e| panic!("cgroup {}: {e}", c.display()));
            if c.starts_with("/sys/fs/cgroup/cpuset") {
                // A new cpuset has no CPUs or memory nodes until given its parent's.
                for level in [c.parent().expect("kprov-real"), c.as_path()] {
                    let parent = level.parent().expect("parent cgroup");
                    for f in ["cpuset.cpus", "cpuset.mems"] {
                        let v = fs::read(parent.join(f)).expect("cpuset");
                        fs::write(level.join(f), v).expect("cpuset");
                    }
                }
            }
        }
        plug(
            &self.bridge,
            &state.netns,
            &state.veth,
            &format!("kp{token}y{i}"),
            &format!("{address}/24"),
            Some(self.gateway),
        );
        fs::write(dir.join("init.sh"), init_script(&dir, name)).expect("init.sh");
        let console = fs::File::create(dir.join("console.log")).expect("console log");
        let procs: Vec<String> = state
            .cgroups
            .iter()
            .map(|c| c.join("cgroup.procs").display().to_string())
            .collect();
        // The shell joins the host's cgroups first (before `ip netns exec`, which mounts a
        // fresh /sys), so the cgroup namespace unshare makes is rooted at them; `ip netns
        // exec` and `unshare` exec, so the child's PID ends up as unshare's, whose child is
        // the host's PID 1.
        let child = Command::new("sh")
            .arg("-c")
            .arg(
                "ns=$1; init=$2; shift 2; for f; do echo $$ > \"$f\"; done; \
                 exec ip netns exec \"$ns\" unshare --pid --fork --mount --uts --ipc --cgroup \
                 --propagation private sh \"$init\"",
            )
            .arg("sh")
            .arg(&state.netns)
            .arg(dir.join("init.sh"))
            .args(&procs)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(console.try_clone().expect("log fd"))
            .stderr(console)
            .spawn()
            .expect("spawn host");
        state.unshare_pid = Some(child.id());
        RealHost {
            name: name.to_string(),
            address,
            pod_cidr,
            boot_time: Duration::ZERO,
            state,
            dir,
            child: Mutex::new(Some(child)),
        }
    }

    pub fn hosts(&self) -> &[RealHost] {
        &self.hosts
    }

    /// The lab bridge's name in the root namespace (where a test's load balancer binds
    /// `lb_address`; the bridge, and so that address, goes with the lab).
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    pub fn host(&self, name: &str) -> &RealHost {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no real host {name}"))
    }

    /// known_hosts lines for every host (`ADDRESS ssh-ed25519 KEY`).
    pub fn known_hosts(&self) -> String {
        self.hosts.iter().map(RealHost::known_hosts_line).collect()
    }

    /// `known_hosts()` written to the lab directory.
    pub fn known_hosts_file(&self) -> PathBuf {
        let path = self.state.dir.join("known_hosts");
        fs::write(&path, self.known_hosts()).expect("known_hosts");
        path
    }

    /// Routes every host's pod /24 to it from every other host (host-gw style: the lab has
    /// no CNI add-on, each host's bridge plugin hands out its own /24).
    pub fn route_pods(&self) {
        for a in &self.hosts {
            for b in self.hosts.iter().filter(|b| b.name != a.name) {
                a.add_route(b.pod_cidr, b.address)
                    .unwrap_or_else(|e| panic!("route on {}: {e}", a.name));
            }
        }
    }

    /// Leaves the lab running after this process (scripts/test-real --keep): the bridge is
    /// marked `kept` (no reaper touches it) and the lab recorded for `down_kept`.
    fn keep(&mut self) {
        for j in self.state.idx..self.state.idx + self.state.count {
            self.label(&format!("kpb{j}"), true);
        }
        let mut kept = fs::read_to_string(KEPT_FILE).unwrap_or_default();
        kept.push_str(&format!("{}\n", self.state.dir.display()));
        fs::write(KEPT_FILE, kept).expect("kept file");
        let kubeconfig = self.state.dir.join("kubeconfig");
        eprintln!(
            "real lab kept: {} (scripts/test-real --down removes it)",
            self.state.dir.display()
        );
        if kubeconfig.exists() {
            println!("KUBECONFIG={}", kubeconfig.display());
        }
        // The hosts' processes are not our children once we exit: nothing to wait for.
        for h in &self.hosts {
            if let Ok(mut c) = h.child.lock() {
                c.take();
            }
        }
    }

    /// [`RealLab::teardown_and_check`], failing on anything left.
    #[track_caller]
    pub fn teardown_clean(self) {
        let left = self.teardown_and_check();
        assert!(left.is_empty(), "left after teardown: {left:#?}");
    }

    /// Tears the lab down now and returns what is left of it, which must be nothing:
    /// (network namespaces, cgroup directories, live PIDs, the directory if it remains).
    pub fn teardown_and_check(mut self) -> Vec<String> {
        // `self` (and the one-lab lock it holds) is dropped at the end, after `done` is set.
        let state = self.state.clone();
        let pids: Vec<u32> = self
            .hosts
            .iter()
            .flat_map(|h| h.all_pids())
            .chain(state.hosts.iter().filter_map(|h| h.pid1))
            .collect();
        self.teardown();
        let mut left = Vec::new();
        let netns = sh(&["ip", "netns", "list"]).unwrap_or_default();
        for h in &state.hosts {
            if netns
                .lines()
                .any(|l| l.split_whitespace().next() == Some(h.netns.as_str()))
            {
                left.push(format!("netns {}", h.netns));
            }
            for c in &h.cgroups {
                if c.exists() {
                    left.push(format!("cgroup {}", c.display()));
                }
            }
            if sh(&["ip", "link", "show", &h.veth]).is_ok() {
                left.push(format!("veth {}", h.veth));
            }
        }
        for p in pids.iter().filter(|p| alive(**p)) {
            left.push(format!("process {p}"));
        }
        if sh(&["ip", "link", "show", &self.bridge]).is_ok() {
            left.push(format!("bridge {}", self.bridge));
        }
        if state.dir.exists() {
            left.push(format!("directory {}", state.dir.display()));
        }
        left
    }

    fn teardown(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        stop_kprov_ssh(
            &self
                .hosts
                .iter()
                .map(|h| h.address.to_string())
                .collect::<Vec<_>>()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        // The state file may name a host that failed half-way through `spawn_host`.
        let state = read_state(&self.state.dir).unwrap_or_else(|| self.state.clone());
        teardown_lab(&state);
        // Reap our children (unshare) so none stays a zombie.
        for h in &self.hosts {
            if let Some(mut c) = h.child.lock().ok().and_then(|mut c| c.take()) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Drop for RealLab {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if keep_requested() && !std::thread::panicking() {
            self.keep();
        } else {
            self.teardown();
        }
    }
}

/// Files each host finds in its /etc at boot (written to its overlay's upper directory):
/// identity, sshd's host key, drop-in and authorised key, and the masked units.
fn write_etc(dir: &Path, name: &str, address: Ipv4Addr, gateway: Ipv4Addr, client_key: &Path) {
    let etc = dir.join("upper/etc");
    let w = |rel: &str, content: &[u8], mode: u32| {
        let p = etc.join(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("etc dir");
        fs::write(&p, content).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).expect("chmod");
    };
    w("hostname", format!("{name}\n").as_bytes(), 0o644);
    let machine_id: String = (0..16)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect();
    w("machine-id", format!("{machine_id}\n").as_bytes(), 0o444);
    w(
        "hosts",
        format!("127.0.0.1 localhost\n{address} {name}\n").as_bytes(),
        0o644,
    );
    // Nothing answers there: the lab has no DNS, and no query leaves it.
    w(
        "resolv.conf",
        format!("nameserver {gateway}\noptions timeout:1 attempts:1\n").as_bytes(),
        0o644,
    );
    let key = dir.join("host_key");
    keygen(&key);
    w(
        "ssh/ssh_host_ed25519_key",
        &fs::read(&key).expect("host key"),
        0o600,
    );
    w(
        "ssh/ssh_host_ed25519_key.pub",
        &fs::read(key.with_extension("pub")).expect("host key"),
        0o644,
    );
    w(
        "ssh/kprov-test-authorized_keys",
        &fs::read(client_key.with_extension("pub")).expect("client key"),
        0o644,
    );
    // Debian's sshd_config includes sshd_config.d first, and the first value of a keyword
    // wins: this host's address, key, and root by key only.
    w(
        "ssh/sshd_config.d/00-kprov-test.conf",
        format!(
            "ListenAddress {address}:22\n\
             HostKey /etc/ssh/ssh_host_ed25519_key\n\
             AuthorizedKeysFile /etc/ssh/kprov-test-authorized_keys\n\
             PermitRootLogin prohibit-password\n\
             PubkeyAuthentication yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             UsePAM no\n\
             MaxSessions 100\n\
             MaxStartups 100:30:200\n"
        )
        .as_bytes(),
        0o644,
    );
    let mut masked: Vec<String> = MASKED.iter().map(|u| u.to_string()).collect();
    // This machine's own enabled services and timers (not sshd, which the host runs).
    for wants in fs::read_dir("/etc/systemd/system")
        .into_iter()
        .flatten()
        .flatten()
    {
        if !wants.file_name().to_string_lossy().ends_with(".wants") {
            continue;
        }
        for u in fs::read_dir(wants.path()).into_iter().flatten().flatten() {
            let u = u.file_name().to_string_lossy().into_owned();
            if (u.ends_with(".service") || u.ends_with(".timer") || u.ends_with(".socket"))
                && !u.starts_with("ssh")
            {
                masked.push(u);
            }
        }
    }
    let units = etc.join("systemd/system");
    fs::create_dir_all(&units).expect("units dir");
    for u in masked {
        let p = units.join(&u);
        let _ = fs::remove_file(&p);
        std::os::unix::fs::symlink("/dev/null", &p).expect("mask unit");
    }
}

/// The host's PID 1 until it execs systemd: mounts, /dev, then `exec systemd`.
fn init_script(dir: &Path, name: &str) -> String {
    let d = dir.display();
    let mut s = String::from("set -eu\n");
    for o in OVERLAYS {
        let flat = o.trim_start_matches('/').replace('/', "_");
        s.push_str(&format!(
            "mount -t overlay overlay -o lowerdir={o},upperdir={d}/upper/{flat},workdir={d}/work/{flat} {o}\n"
        ));
    }
    for data in DATA {
        s.push_str(&format!(
            "mkdir -p /var/lib/{data}; mount --bind {d}/data/{data} /var/lib/{data}\n"
        ));
    }
    s.push_str(
        "for m in /run /tmp /root /home; do mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs $m; done\n\
         chmod 1777 /tmp; chmod 0700 /root; mkdir -p /run/lock\n\
         mount -t proc -o nosuid,nodev,noexec proc /proc\n\
         mount --bind /proc/sys /proc/sys\n\
         mount -o remount,bind,ro /proc/sys\n",
    );
    for (k, _) in SYSCTL_FILES {
        s.push_str(&format!(
            "mount --bind {d}/sysctl/{} /proc/sys/{k}\n",
            k.replace('/', "_")
        ));
    }
    s.push_str(
        "mount --bind /proc/sys/net /proc/sys/net\n\
         mount -o remount,bind,rw /proc/sys/net\n\
         mount -o remount,bind,ro,nosuid,nodev,noexec /sys\n\
         mount -t tmpfs -o mode=0755,nosuid,nodev,noexec tmpfs /sys/fs/cgroup\n",
    );
    for c in V1_CONTROLLERS {
        s.push_str(&format!(
            "mkdir /sys/fs/cgroup/{c}; mount -t cgroup -o nosuid,nodev,noexec,{c} cgroup /sys/fs/cgroup/{c}\n"
        ));
    }
    s.push_str(&format!(
        "mkdir /sys/fs/cgroup/systemd; mount -t cgroup -o nosuid,nodev,noexec,none,name=systemd cgroup /sys/fs/cgroup/systemd\n\
         mkdir /sys/fs/cgroup/unified; mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup/unified\n\
         mount -t tmpfs -o mode=0755,nosuid tmpfs /dev\n\
         mknod -m 666 /dev/null c 1 3; mknod -m 666 /dev/zero c 1 5; mknod -m 666 /dev/full c 1 7\n\
         mknod -m 666 /dev/random c 1 8; mknod -m 666 /dev/urandom c 1 9; mknod -m 666 /dev/tty c 5 0\n\
         mknod -m 600 /dev/kmsg c 1 11\n\
         mkdir /dev/pts /dev/shm /dev/mqueue\n\
         mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5 devpts /dev/pts\n\
         ln -s pts/ptmx /dev/ptmx\n\
         mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm\n\
         mount -t mqueue mqueue /dev/mqueue\n\
         ln -s /proc/self/fd /dev/fd; ln -s /proc/self/fd/0 /dev/stdin\n\
         ln -s /proc/self/fd/1 /dev/stdout; ln -s /proc/self/fd/2 /dev/stderr\n\
         touch /dev/console; mount --bind /dev/null /dev/console\n\
         hostname {name}\n\
         exec env -i container=kprov-real PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
         /lib/systemd/systemd --show-status=no --log-target=console --log-level=info\n"
    ));
    s
}

impl RealHost {
    /// The host's systemd (PID 1 of its namespaces), once booted.
    pub fn pid1(&self) -> u32 {
        self.state.pid1.expect("host booted")
    }

    /// The host's directory on this machine (overlay upper dirs, data dirs, console log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What systemd and the init script printed.
    pub fn console(&self) -> String {
        fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    fn known_hosts_line(&self) -> String {
        let key = fs::read_to_string(self.dir.join("host_key.pub")).expect("host key");
        let mut parts = key.split_whitespace();
        format!(
            "{} {} {}\n",
            self.address,
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default()
        )
    }

    /// Finds PID 1 (unshare's child), then waits for systemd to finish booting: first for its
    /// private socket, then `systemctl is-system-running --wait` (an event, bounded).
    fn wait_booted(&self) -> Booted {
        let started = Instant::now();
        let deadline = started + BOOT_TIMEOUT;
        let unshare = self.state.unshare_pid.expect("spawned");
        let fail = |what: &str| {
            format!(
                "real host {}: {what} after {:?}\nconsole:\n{}",
                self.name,
                started.elapsed(),
                self.console()
            )
        };
        let pid1 = loop {
            let children = fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
                .unwrap_or_default();
            if let Some(p) = children.split_whitespace().next() {
                break p.parse::<u32>().expect("pid");
            }
            if is_dead(unshare) || Instant::now() > deadline {
                return Err((None, fail("no PID 1")));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let private = format!("/proc/{pid1}/root/run/systemd/private");
        while !Path::new(&private).exists() {
            if is_dead(pid1) || Instant::now() > deadline {
                let why = if is_dead(pid1) {
                    "PID 1 exited before systemd listened (see the console)"
                } else {
                    "systemd never listened"
                };
                return Err((Some(pid1), fail(why)));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let state = run_bounded(
            Command::new("nsenter")
                .args(["-t", &pid1.to_string(), "-a", "systemctl"])
                .args(["is-system-running", "--wait"]),
            deadline.saturating_duration_since(Instant::now()),
        );
        // `degraded` exits 1: read what it said either way.
        let said = match &state {
            Ok(s) => s.trim().to_string(),
            Err(e) => e.clone(),
        };
        if !(said == "running" || said.ends_with(": degraded") || said.contains("degraded\n")) {
            // What boot still waits for, and what failed: the cause, not only the timeout.
            let jobs = run_bounded(
                Command::new("nsenter")
                    .args(["-t", &pid1.to_string(), "-a", "sh", "-c"])
                    .arg("systemctl list-jobs --no-pager; systemctl --failed --no-pager; journalctl -b --no-pager -p warning | tail -n 30"),
                Duration::from_secs(10),
            )
            .unwrap_or_else(|e| e);
            return Err((
                Some(pid1),
                fail(&format!("systemd not running: {said}\n{jobs}")),
            ));
        }
        Ok((pid1, started.elapsed()))
    }

    fn wait_ssh(&self, key: &Path, known_hosts: &Path) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.ssh_with(key, known_hosts, "true") {
                Ok(_) => return,
                Err(e) if Instant::now() > deadline => {
                    panic!(
                        "real host {}: sshd does not answer: {e}\n{}",
                        self.name,
                        self.exec("systemctl status ssh --no-pager 2>&1; journalctl -u ssh --no-pager | tail -20")
                            .unwrap_or_else(|e| e)
                    )
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Runs `command` on the host over ssh as root, with strict host key checking against
    /// `known_hosts` (what kprov does, for tests that check sshd itself).
    pub fn ssh_with(
        &self,
        key: &Path,
        known_hosts: &Path,
        command: &str,
    ) -> Result<String, String> {
        run_bounded(
            Command::new("ssh")
                .args(["-F", "/dev/null", "-i"])
                .arg(key)
                .arg("-o")
                .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
                .args([
                    "-o",
                    "StrictHostKeyChecking=yes",
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    "ConnectTimeout=5",
                ])
                .arg(format!("root@{}", self.address))
                .arg(command),
            Duration::from_secs(60),
        )
    }

    /// Runs a shell script as root in all the host's namespaces (nsenter into its PID 1), for
    /// a test's assertions only: kprov itself reaches hosts over SSH.
    pub fn exec(&self, script: &str) -> Result<String, String> {
        run(Command::new("nsenter")
            .args(["-t", &self.pid1().to_string(), "-a", "--"])
            .args(["sh", "-c", script]))
    }

    /// Like `exec`, killed after `limit`.
    pub fn exec_bounded(&self, script: &str, limit: Duration) -> Result<String, String> {
        run_bounded(
            Command::new("nsenter")
                .args(["-t", &self.pid1().to_string(), "-a", "--"])
                .args(["sh", "-c", script]),
            limit,
        )
    }

    /// A file as the host sees it (through its PID 1's root, no process started).
    pub fn read_file(&self, path: &str) -> std::io::Result<Vec<u8>> {
        fs::read(format!(
            "/proc/{}/root/{}",
            self.pid1(),
            path.trim_start_matches('/')
        ))
    }

    /// A route in the host's network namespace (`ip route replace DEST via VIA`).
    pub fn add_route(&self, dest: Ipv4Net, via: Ipv4Addr) -> Result<String, String> {
        sh(&[
            "ip",
            "netns",
            "exec",
            &self.state.netns,
            "ip",
            "route",
            "replace",
            &dest.to_string(),
            "via",
            &via.to_string(),
        ])
    }

    /// The host's network namespace (for `ip netns exec`).
    pub fn netns(&self) -> &str {
        &self.state.netns
    }

    /// The host's cgroup directories on this machine (one per hierarchy).
    pub fn cgroups(&self) -> &[PathBuf] {
        &self.state.cgroups
    }

    /// Every PID in the host's cgroups.
    pub fn all_pids(&self) -> Vec<u32> {
        self.state
            .cgroups
            .iter()
            .flat_map(|c| cgroup_pids(c))
            .collect()
    }

    /// Powers the host off as `systemctl poweroff` would (SIGRTMIN+4 to its systemd) and
    /// waits until its PID 1 is gone; returns whether it went within the bound.
    pub fn power_off(&self) -> bool {
        let pid1 = self.pid1();
        // SAFETY: a signal to this host's PID 1.
        unsafe { kill(pid1 as i32, SIGRTMIN_PLUS_4) };
        let gone = wait_dead(&[pid1], POWEROFF_TIMEOUT);
        if let Some(mut c) = self.child.lock().ok().and_then(|mut c| c.take()) {
            let _ = c.wait();
        }
        gone
    }
}
