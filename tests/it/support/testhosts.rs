//! Real sshd test hosts: each in its own network namespace (veth to a bridge in the root
//! namespace, address in 198.18.0.0/15) and its own mount + UTS namespace with overlayfs over
//! /etc, /var/lib, /opt and /usr/local and tmpfs over /run, /tmp, /root and /home.
//!
//! The overlay upper dirs stay on disk while the hosts live, so a test can read what a host
//! wrote without going through ssh. Everything is torn down by `Drop` (also when a test
//! panics): sshd killed by PID, leftover processes in the namespaces killed, namespaces,
//! veths and the bridge deleted, the directory removed.
//!
//! Needs root, iproute2, util-linux (unshare, nsenter), openssh-server and sudo.

use std::fs;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use ipnet::Ipv4Net;
use std::time::{Duration, Instant};

/// Directories each host gets a private, persistent copy-on-write view of.
const OVERLAYS: [&str; 4] = ["/etc", "/var/lib", "/opt", "/usr/local"];
/// Directories each host gets empty (an empty /root avoids this machine's pyenv .bashrc).
const TMPFS: [&str; 4] = ["/run", "/tmp", "/root", "/home"];
/// Subnets 198.18.0.0/24 .. 198.19.255.0/24.
const SUBNETS: u32 = 512;

static COUNTER: AtomicU32 = AtomicU32::new(0);

pub struct TestHost {
    pub name: String,
    pub address: String,
    pub port: u16,
    netns: String,
    veth: String,
    dir: PathBuf,
    /// The keys sshd accepts (for root and every user).
    authorized_keys: PathBuf,
    /// Whether root may log in (a cloud image lets only its login user in).
    root_login: bool,
    sshd: Mutex<Option<Child>>,
}

pub struct TestHosts {
    pub hosts: Vec<TestHost>,
    /// Private key (ed25519) authorised for root and for users made by `add_user`.
    pub client_key: PathBuf,
    /// An address inside the subnet that nothing answers on.
    pub unreachable_address: String,
    /// The root namespace's address on the hosts' bridge: where a server the hosts must reach
    /// (an artifact mirror, a fake API) listens.
    pub gateway: String,
    idx: u32,
    bridge: String,
    dir: PathBuf,
}

pub(crate) fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

pub(crate) fn sh(args: &[&str]) -> Result<String, String> {
    run(Command::new(args[0]).args(&args[1..]))
}

pub(crate) fn keygen(path: &Path) {
    let _ = fs::remove_file(path);
    let _ = fs::remove_file(path.with_extension("pub"));
    sh(&[
        "ssh-keygen",
        "-q",
        "-t",
        "ed25519",
        "-N",
        "",
        "-C",
        "kprov-test",
        "-f",
        path.to_str().expect("utf-8 path"),
    ])
    .expect("ssh-keygen");
}

/// Zombie or gone: a killed sshd stays a zombie briefly until we reap it, so `kill -0` lies.
pub fn is_dead(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

/// The ssh clients kprov left connected to one of `addresses`: PID and the fleet's private
/// control directory (`/tmp/kprov-ssh-XXXX`, on their command line).
fn kprov_ssh_clients(addresses: &[&str]) -> Vec<(u32, PathBuf)> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if fs::read_to_string(format!("/proc/{pid}/comm")).map_or(true, |c| c.trim() != "ssh") {
            continue;
        }
        let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let control = args
            .iter()
            .find_map(|a| a.find("/tmp/kprov-ssh-").map(|i| a[i..].to_string()));
        if let Some(control) = control
            && args.iter().any(|a| addresses.contains(&a.as_str()))
        {
            // /tmp/kprov-ssh-XXXX/...: the fleet's private directory.
            out.push((pid, Path::new(&control).components().take(3).collect()));
        }
    }
    out
}

/// Stops the ssh clients kprov left connected to `addresses` by PID and removes their control
/// directories; returns the PIDs. A killed kprov never sends `ssh -O exit`, so its masters
/// would live on for their ControlPersist idle time (300 s) while the hosts do. A master still
/// authenticating during a scan forks into the background afterwards (under a new PID), so
/// the scan repeats until it finds none.
pub(crate) fn stop_kprov_ssh(addresses: &[&str]) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut stopped = Vec::new();
    loop {
        let found = kprov_ssh_clients(addresses);
        if found.is_empty() || Instant::now() > deadline {
            return stopped;
        }
        for (pid, dir) in found {
            let _ = sh(&["kill", "-KILL", &pid.to_string()]);
            while !is_dead(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = fs::remove_dir_all(dir);
            stopped.push(pid);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A test binary killed outright (SIGKILL, a CI timeout) never runs `Drop`. Each bridge
/// carries its owner's PID and directory in its link alias, so a later run tears down what a
/// dead owner left behind: processes in its namespaces, the namespaces, the bridge, the dir.
fn reap_orphans() {
    let Ok(links) = sh(&["ip", "-o", "link", "show", "type", "bridge"]) else {
        return;
    };
    for line in links.lines() {
        let Some(name) = line.split(": ").nth(1).filter(|n| n.starts_with("kpb")) else {
            continue;
        };
        let Some(alias) = line.split("alias kprov-test ").nth(1) else {
            continue;
        };
        let Some(dir) = dead_owner_dir(alias) else {
            continue;
        };
        if let Ok(idx) = name.trim_start_matches("kpb").parse() {
            teardown(idx, Path::new(&dir));
        }
    }
}

/// The `dir=` of a bridge's alias (after its `kprov-test `/`kprov-real ` marker) when the
/// alias's `pid=` is dead: what a later run reaps. `None` while the owner lives, or for a lab
/// kept on purpose (no PID; `down_kept` removes it).
pub(crate) fn dead_owner_dir(alias: &str) -> Option<String> {
    let field = |k: &str| {
        alias
            .split_whitespace()
            .find_map(|f| f.strip_prefix(k))
            .map(str::to_string)
    };
    let (Some(pid), Some(dir)) = (field("pid="), field("dir=")) else {
        return None;
    };
    (!Path::new(&format!("/proc/{pid}")).exists()).then_some(dir)
}

/// Removes everything of subnet `idx`: processes in its namespaces (also of hosts that
/// failed half-way through setup), the namespaces, stray veths, the bridge, the directory.
fn teardown(idx: u32, dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let namespaces = sh(&["ip", "netns", "list"]).unwrap_or_default();
    for ns in namespaces
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|ns| ns.starts_with(&format!("kprov-{idx}-")))
    {
        let pids = sh(&["ip", "netns", "pids", ns]).unwrap_or_default();
        for p in pids.split_whitespace() {
            let _ = sh(&["kill", "-KILL", p]);
        }
        for p in pids.split_whitespace().filter_map(|p| p.parse().ok()) {
            // No assertion here: this runs in Drop, possibly while a test is panicking.
            while !is_dead(p) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let _ = sh(&["ip", "netns", "del", ns]);
    }
    // A veth whose peer never reached its namespace survives the namespace's deletion.
    let links = sh(&["ip", "-o", "link", "show"]).unwrap_or_default();
    for link in links.lines().filter_map(|l| l.split(": ").nth(1)) {
        let link = link.split('@').next().unwrap_or(link);
        // kp{idx} followed by a letter: host (h/n), router (r/s) and operator (o/p) veths.
        let ours = link
            .strip_prefix(&format!("kp{idx}"))
            .and_then(|rest| rest.chars().next())
            .is_some_and(|c| c.is_ascii_alphabetic());
        if ours {
            let _ = sh(&["ip", "link", "del", link]);
        }
    }
    // What `ip netns exec` bind-mounts over /etc (the operator namespace's hosts file).
    if let Ok(entries) = fs::read_dir("/etc/netns") {
        for e in entries.flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with(&format!("kprov-{idx}-"))
            {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    let _ = sh(&["ip", "link", "del", &format!("kpb{idx}")]);
    if dir.starts_with("/var/tmp") && dir.to_string_lossy().contains("/kprov-th-") {
        let _ = fs::remove_dir_all(dir);
    }
}

/// Claims a free /24 by creating its bridge: `ip link add` fails if another test run (or
/// another test binary) already holds that name, which makes the claim atomic.
fn claim_subnet() -> (u32, String) {
    let (idx, _) = claim_block(1, None);
    (idx, format!("kpb{idx}"))
}

/// Claims `count` consecutive /24s (a power of two, aligned: one CIDR block) the same way,
/// one bridge per /24; the bridges after the first only mark the claim and carry the same
/// alias (owner PID and `dir`) so `reap_orphans` frees them too. Returns the first index.
pub(crate) fn claim_block(count: u32, owner_dir: Option<&Path>) -> (u32, Ipv4Net) {
    assert!(
        count.is_power_of_two() && count <= 64,
        "block of {count} /24s"
    );
    let blocks = SUBNETS / count;
    let start = (std::process::id() * 37 + COUNTER.fetch_add(1, Ordering::SeqCst) * 7) % blocks;
    let prefix = 24 - count.trailing_zeros() as u8;
    'next: for i in 0..blocks {
        let idx = ((start + i) % blocks) * count;
        let (b, c) = (18 + idx / 256, idx % 256);
        let net = Ipv4Net::new(Ipv4Addr::new(198, b as u8, c as u8, 0), prefix).expect("net");
        // Someone else may use the range without our naming scheme: skip anything in use.
        let used = sh(&["ip", "-o", "addr", "show", "to", &net.to_string()])
            .map(|o| !o.trim().is_empty())
            .unwrap_or(true);
        if used {
            continue;
        }
        for j in idx..idx + count {
            if sh(&["ip", "link", "add", &format!("kpb{j}"), "type", "bridge"]).is_err() {
                for k in idx..j {
                    let _ = sh(&["ip", "link", "del", &format!("kpb{k}")]);
                }
                continue 'next;
            }
            if let Some(dir) = owner_dir {
                label_bridge(&format!("kpb{j}"), dir);
            }
        }
        return (idx, net);
    }
    panic!("no free block of {count} /24s in 198.18.0.0/15");
}

/// The alias `reap_orphans` reads: who owns the bridge, and the directory to remove.
fn label_bridge(bridge: &str, dir: &Path) {
    sh(&[
        "ip",
        "link",
        "set",
        "dev",
        bridge,
        "alias",
        &format!(
            "kprov-test pid={} dir={}",
            std::process::id(),
            dir.display()
        ),
    ])
    .expect("bridge alias");
}

/// The tier gate's check (support/tiers.rs), in the tests and in the benchmarks that start
/// test hosts (examples/bench_*.rs include the whole harness).
fn require_tier() {
    crate::support::tiers::require(crate::support::Tier::SshdHosts);
}

impl TestHosts {
    /// `h` as a spec's host with `role`: root, reached at its port with the tests' client key.
    pub fn spec_host(&self, h: &TestHost, role: kprov::spec::HostRole) -> kprov::spec::Host {
        kprov::spec::Host {
            name: h.name.clone(),
            address: h.address.clone(),
            ip: None,
            access_ip: None,
            user: Some("root".into()),
            port: Some(h.port),
            key_path: Some(self.client_key.display().to_string()),
            bastion: None,
            roles: vec![role],
            labels: Default::default(),
            taints: Vec::new(),
        }
    }

    /// Every host as a worker ([`TestHosts::spec_host`]).
    pub fn spec_hosts(&self) -> Vec<kprov::spec::Host> {
        self.hosts
            .iter()
            .map(|h| self.spec_host(h, kprov::spec::HostRole::Node))
            .collect()
    }

    /// Stops the ssh masters a killed kprov left connected to these hosts (by PID; their
    /// control directories removed); returns their PIDs. Also done when the hosts are dropped.
    pub fn stop_kprov_ssh(&self) -> Vec<u32> {
        stop_kprov_ssh(
            &self
                .hosts
                .iter()
                .map(|h| h.address.as_str())
                .collect::<Vec<_>>(),
        )
    }

    /// Starts `n` hosts named `host1..hostN` and waits until every sshd listens.
    pub fn start(n: usize) -> TestHosts {
        TestHosts::start_on_port(n, 22)
    }

    /// Like `start`, with every sshd listening on `port`.
    pub fn start_on_port(n: usize, port: u16) -> TestHosts {
        require_tier();
        assert!(
            (1..=200).contains(&n),
            "between 1 and 200 test hosts, not {n}"
        );
        reap_orphans();
        let (idx, bridge) = claim_subnet();
        let (b, c) = (18 + idx / 256, idx % 256);
        let dir = tempfile::Builder::new()
            .prefix("kprov-th-")
            // Not under /tmp, /run, /root or /home: the hosts mount tmpfs over those.
            .tempdir_in("/var/tmp")
            .expect("test host dir")
            .keep();
        let mut hosts = TestHosts {
            hosts: Vec::new(),
            client_key: dir.join("client_key"),
            unreachable_address: format!("198.{b}.{c}.254"),
            gateway: format!("198.{b}.{c}.1"),
            idx,
            bridge,
            dir,
        };
        // sshd reads AuthorizedKeysFile as the logging-in user: keep the path readable.
        fs::set_permissions(&hosts.dir, fs::Permissions::from_mode(0o755)).expect("chmod");
        keygen(&hosts.client_key);
        fs::copy(
            hosts.client_key.with_extension("pub"),
            hosts.dir.join("authorized_keys"),
        )
        .expect("authorized_keys");
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", hosts.gateway),
            "dev",
            &hosts.bridge,
        ])
        .expect("bridge address");
        sh(&["ip", "link", "set", &hosts.bridge, "up"]).expect("bridge up");
        label_bridge(&hosts.bridge, &hosts.dir);
        for i in 0..n {
            let host = hosts.add_host(idx, i, &format!("198.{b}.{c}.{}", 11 + i), port);
            hosts.hosts.push(host);
        }
        for h in &hosts.hosts {
            h.wait_ready();
        }
        hosts
    }

    fn add_host(&self, idx: u32, i: usize, address: &str, port: u16) -> TestHost {
        let name = format!("host{}", i + 1);
        let dir = self.dir.join(&name);
        for d in OVERLAYS {
            let flat = d.trim_start_matches('/').replace('/', "_");
            fs::create_dir_all(dir.join("upper").join(&flat)).expect("upper dir");
            fs::create_dir_all(dir.join("work").join(&flat)).expect("work dir");
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
        keygen(&dir.join("host_key"));
        let host = TestHost {
            name,
            address: address.to_string(),
            port,
            netns: format!("kprov-{idx}-{i}"),
            veth: format!("kp{idx}h{i}"),
            authorized_keys: self.dir.join("authorized_keys"),
            root_login: true,
            dir,
            sshd: Mutex::new(None),
        };
        host.boot(
            &self.bridge,
            &format!("kp{idx}n{i}"),
            &format!("{address}/24"),
            None,
        );
        host
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// known_hosts lines for every host, as `ssh-keyscan` would print them (for tools like
    /// ansible that read a known_hosts file).
    pub fn known_hosts(&self) -> String {
        self.hosts
            .iter()
            .map(|h| {
                let key = fs::read_to_string(h.dir.join("host_key.pub")).expect("host key");
                let mut parts = key.split_whitespace();
                format!(
                    "{} {} {}\n",
                    h.address,
                    parts.next().unwrap_or_default(),
                    parts.next().unwrap_or_default()
                )
            })
            .collect()
    }
}

/// Makes namespace `ns` with one interface, eth0, plugged into `bridge` (veth `veth`, whose
/// peer is created as `peer`), holding `cidr` (address/prefix), and a default route via
/// `gateway` when given. Loopback is up.
pub(crate) fn plug(
    bridge: &str,
    ns: &str,
    veth: &str,
    peer: &str,
    cidr: &str,
    gateway: Option<Ipv4Addr>,
) {
    sh(&["ip", "netns", "add", ns]).expect("netns");
    sh(&[
        "ip", "link", "add", veth, "type", "veth", "peer", "name", peer,
    ])
    .expect("veth");
    sh(&["ip", "link", "set", veth, "master", bridge]).expect("veth master");
    sh(&["ip", "link", "set", veth, "up"]).expect("veth up");
    sh(&["ip", "link", "set", peer, "netns", ns]).expect("veth to netns");
    let in_ns = |args: &[&str]| {
        let mut full = vec!["ip", "netns", "exec", ns];
        full.extend_from_slice(args);
        sh(&full).expect("configure netns");
    };
    in_ns(&["ip", "link", "set", peer, "name", "eth0"]);
    in_ns(&["ip", "addr", "add", cidr, "dev", "eth0"]);
    in_ns(&["ip", "link", "set", "eth0", "up"]);
    in_ns(&["ip", "link", "set", "lo", "up"]);
    if let Some(gw) = gateway {
        in_ns(&["ip", "route", "add", "default", "via", &gw.to_string()]);
    }
}

impl TestHost {
    fn sshd_config(&self) -> String {
        format!(
            "ListenAddress {addr}:{port}\n\
             HostKey {dir}/host_key\n\
             PidFile {dir}/sshd.pid\n\
             AuthorizedKeysFile {keys}\n\
             StrictModes no\n\
             PermitRootLogin {root}\n\
             PubkeyAuthentication yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             UsePAM no\n\
             MaxSessions 100\n\
             MaxStartups 100:30:200\n\
             Subsystem sftp internal-sftp\n",
            addr = self.address,
            port = self.port,
            dir = self.dir.display(),
            keys = self.authorized_keys.display(),
            root = if self.root_login {
                "prohibit-password"
            } else {
                "no"
            },
        )
    }

    fn init_script(&self) -> String {
        let mut s = String::from("set -e\n");
        for d in OVERLAYS {
            let flat = d.trim_start_matches('/').replace('/', "_");
            s.push_str(&format!(
                "mount -t overlay overlay -o lowerdir={d},upperdir={dir}/upper/{flat},workdir={dir}/work/{flat} {d}\n",
                dir = self.dir.display()
            ));
        }
        for d in TMPFS {
            s.push_str(&format!("mount -t tmpfs -o mode=0755 tmpfs {d}\n"));
        }
        s.push_str(&format!(
            "chmod 0700 /root\nmkdir -p /run/sshd\nhostname {name}\n\
             echo '{addr} {name}' >> /etc/hosts\n\
             exec /usr/sbin/sshd -D -e -f {dir}/sshd_config\n",
            name = self.name,
            addr = self.address,
            dir = self.dir.display()
        ));
        s
    }

    /// Writes the host's sshd config and init script, plugs its namespace into `bridge`
    /// (`peer`: the bridge side's veth, `cidr`: its address) and starts its sshd.
    fn boot(&self, bridge: &str, peer: &str, cidr: &str, gateway: Option<Ipv4Addr>) {
        fs::write(self.dir.join("sshd_config"), self.sshd_config()).expect("config");
        fs::write(self.dir.join("init.sh"), self.init_script()).expect("init.sh");
        plug(bridge, &self.netns, &self.veth, peer, cidr, gateway);
        self.spawn_sshd();
    }

    fn spawn_sshd(&self) {
        let _ = fs::remove_file(self.pid_file());
        let log = fs::File::create(self.dir.join("sshd.log")).expect("sshd log");
        // `ip netns exec` and `unshare` exec their command, so the child's PID ends up as sshd's.
        let child = Command::new("ip")
            .args(["netns", "exec", &self.netns, "unshare", "--mount", "--uts"])
            .args(["--propagation", "private", "sh"])
            .arg(self.dir.join("init.sh"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("spawn sshd");
        *self.sshd.lock().expect("sshd lock") = Some(child);
    }

    fn pid_file(&self) -> PathBuf {
        self.dir.join("sshd.pid")
    }

    /// sshd writes its PidFile only once it listens.
    fn wait_ready(&self) {
        let started = Instant::now();
        while !self.pid_file().exists() {
            let exited = self
                .sshd
                .lock()
                .expect("sshd lock")
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            assert!(
                exited.is_none(),
                "sshd on {} exited ({exited:?}): {}",
                self.name,
                self.log()
            );
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "sshd on {} not up after 10 s: {}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
    }

    /// The host's sshd, whose namespaces are the host's (`nsenter -t PID`).
    pub fn pid(&self) -> u32 {
        self.sshd
            .lock()
            .expect("sshd lock")
            .as_ref()
            .map(Child::id)
            .expect("sshd running")
    }

    /// The host's public host key line (`ssh-ed25519 AAAA... comment`).
    pub fn host_public_key(&self) -> String {
        fs::read_to_string(self.dir.join("host_key.pub")).expect("host key")
    }

    /// SHA256 fingerprint of the current host key, as `ssh-keygen -lf` prints it.
    pub fn fingerprint(&self) -> String {
        let out = sh(&[
            "ssh-keygen",
            "-lf",
            self.dir.join("host_key.pub").to_str().unwrap(),
        ])
        .expect("ssh-keygen -lf");
        out.split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string()
    }

    /// Gives the host a NEW host key: sshd re-executes on SIGHUP and rereads its keys.
    pub fn new_host_key(&self) {
        keygen(&self.dir.join("host_key"));
        let _ = fs::remove_file(self.pid_file());
        sh(&["kill", "-HUP", &self.pid().to_string()]).expect("SIGHUP sshd");
        self.wait_ready();
    }

    /// Gives the host back a host key it had (`private`: the OpenSSH private key file's
    /// bytes), as re-running cloud-init would.
    pub fn set_host_key(&self, private: &[u8]) {
        let path = self.dir.join("host_key");
        fs::write(&path, private).expect("host key");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
        let public = sh(&["ssh-keygen", "-y", "-f", path.to_str().expect("utf-8 path")])
            .expect("ssh-keygen -y");
        fs::write(path.with_extension("pub"), public).expect("public key");
        let _ = fs::remove_file(self.pid_file());
        sh(&["kill", "-HUP", &self.pid().to_string()]).expect("SIGHUP sshd");
        self.wait_ready();
    }

    /// Lowers (or raises) sshd's `MaxSessions`, e.g. to the stock default of 10 that real
    /// hosts have.
    pub fn set_max_sessions(&self, n: u32) {
        let path = self.dir.join("sshd_config");
        let config = fs::read_to_string(&path).expect("sshd_config");
        let config: String = config
            .lines()
            .map(|l| {
                if l.starts_with("MaxSessions ") {
                    format!("MaxSessions {n}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        fs::write(&path, config).expect("sshd_config");
        let _ = fs::remove_file(self.pid_file());
        sh(&["kill", "-HUP", &self.pid().to_string()]).expect("SIGHUP sshd");
        self.wait_ready();
    }

    /// Runs a command as root inside the host's namespaces (not over ssh).
    pub fn exec(&self, script: &str) -> Result<String, String> {
        run(Command::new("nsenter")
            .args(["-t", &self.pid().to_string(), "-m", "-u", "-n", "--"])
            .args(["sh", "-c", script]))
    }

    /// Command names of the processes living in the host's network namespace.
    pub fn processes(&self) -> Vec<String> {
        sh(&["ip", "netns", "pids", &self.netns])
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| fs::read_to_string(format!("/proc/{p}/comm")).ok())
            .map(|c| c.trim().to_string())
            .collect()
    }

    /// Cuts every open ssh connection (as a reboot or a network blip would) by killing all
    /// processes in the host's namespace except the listening sshd.
    pub fn drop_connections(&self) {
        let listener = self.pid().to_string();
        let pids = sh(&["ip", "netns", "pids", &self.netns]).unwrap_or_default();
        for p in pids.split_whitespace().filter(|p| *p != listener) {
            let _ = sh(&["kill", "-KILL", p]);
        }
    }

    /// Takes the host down as a power cut would: sshd and every process in the host's
    /// namespaces killed (its tmpfs mounts go with them; the overlay upper dirs stay).
    pub fn power_off(&self) {
        self.stop();
        let pids = sh(&["ip", "netns", "pids", &self.netns]).unwrap_or_default();
        for p in pids.split_whitespace() {
            let _ = sh(&["kill", "-KILL", p]);
        }
    }

    /// Boots a host taken down by `power_off` (same address and host key) and waits for sshd.
    pub fn power_on(&self) {
        self.spawn_sshd();
        self.wait_ready();
    }

    /// Unplugs (`false`) or plugs back (`true`) the host's cable: its end of the veth on the
    /// bridge goes down, so packets are dropped without any reset, as when a host vanishes.
    pub fn set_link(&self, up: bool) {
        sh(&[
            "ip",
            "link",
            "set",
            &self.veth,
            if up { "up" } else { "down" },
        ])
        .expect("ip link set");
    }

    /// PIDs of the processes in the host's network namespace other than the listening sshd:
    /// the per-connection sshd processes and what they run.
    pub fn session_pids(&self) -> Vec<u32> {
        let listener = self.pid();
        sh(&["ip", "netns", "pids", &self.netns])
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .filter(|p| *p != listener)
            .collect()
    }

    /// Adds a login user (the test client key authorises it) with or without passwordless sudo.
    pub fn add_user(&self, user: &str, passwordless_sudo: bool) {
        // '*' instead of useradd's locked '!': with UsePAM no, sshd refuses locked accounts.
        let mut script = format!("useradd -m -s /bin/sh {user} && usermod -p '*' {user}");
        if passwordless_sudo {
            script.push_str(&format!(
                " && echo '{user} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/{user} && chmod 0440 /etc/sudoers.d/{user}"
            ));
        } else {
            script.push_str(&format!(
                " && echo '{user} ALL=(ALL) ALL' > /etc/sudoers.d/{user} && chmod 0440 /etc/sudoers.d/{user}"
            ));
        }
        self.exec(&script).expect("add user");
    }

    /// Where the host's overlay keeps `path` (below `/etc`, `/var/lib`, `/opt` or `/usr/local`)
    /// once the host wrote it.
    pub fn upper_path(&self, path: &str) -> PathBuf {
        let (root, rest) = OVERLAYS
            .iter()
            .filter_map(|d| {
                path.strip_prefix(d)
                    .and_then(|r| r.strip_prefix('/'))
                    .map(|r| (d, r))
            })
            .next()
            .unwrap_or_else(|| panic!("{path} is not below an overlaid directory {OVERLAYS:?}"));
        let flat = root.trim_start_matches('/').replace('/', "_");
        self.dir.join("upper").join(flat).join(rest)
    }

    /// What the host wrote to `path`; `None` when it did not write (or replace) that file.
    pub fn read_upper(&self, path: &str) -> Option<Vec<u8>> {
        fs::read(self.upper_path(path)).ok()
    }

    fn stop(&self) {
        let Some(mut child) = self.sshd.lock().map(|mut c| c.take()).unwrap_or(None) else {
            return;
        };
        let pid = child.id();
        let _ = sh(&["kill", "-KILL", &pid.to_string()]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !is_dead(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.wait();
    }
}

impl Drop for TestHosts {
    fn drop(&mut self) {
        // kprov's ssh masters first (tearing the hosts down ends their connections, but
        // nothing else removes their control directories), then sshd, by PID, reaping our
        // child; then whatever else the namespaces hold.
        self.stop_kprov_ssh();
        for h in &self.hosts {
            h.stop();
        }
        teardown(self.idx, &self.dir);
    }
}

impl TestHost {
    /// Makes the host look like a machine kprov can provision: the stand-in host tools
    /// (systemctl, sysctl, ...) in /usr/local/sbin, its own /var/log (the stand-ins' call log),
    /// kernel modules and a MAC address of its own (the hosts share this machine's /sys, and
    /// preflight would otherwise see cloned machines). `mac` makes the MAC unique. The host's
    /// /sys/fs/cgroup is the cgroup v2 hierarchy, as on current distributions (`ip netns exec`
    /// leaves an empty directory there, and this machine itself is cgroup v1 hybrid, which
    /// kprov's preflight refuses for kubelet 1.35+ unless the spec opts in).
    pub fn prepare_node(&self, mac: u32) {
        let d = &self.dir;
        for sub in [
            "log",
            "sys-module/overlay",
            "sys-module/br_netfilter",
            "sys-net/eth0",
            "tools",
        ] {
            fs::create_dir_all(d.join(sub)).expect("node dir");
        }
        fs::write(
            d.join("sys-net/eth0/address"),
            format!(
                "02:00:{:02x}:{:02x}:{:02x}:{:02x}\n",
                mac >> 24,
                (mac >> 16) & 0xff,
                (mac >> 8) & 0xff,
                mac & 0xff
            ),
        )
        .expect("mac");
        // The checkout may live under /tmp, which each host covers with its own tmpfs: stage
        // the host tools in the host's directory, which it can see.
        let tools = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/it/support/standins/host"
        );
        for entry in fs::read_dir(tools).expect("tools") {
            let entry = entry.expect("tool");
            fs::copy(entry.path(), d.join("tools").join(entry.file_name())).expect("copy tool");
        }
        self.exec(&format!(
            "set -e; mkdir -p /usr/local/sbin; cp {d}/tools/* /usr/local/sbin/\n\
             mount --bind {d}/log /var/log\n\
             mount --bind {d}/sys-module /sys/module\n\
             mount --bind {d}/sys-net /sys/class/net\n\
             mount -t cgroup2 cgroup2 /sys/fs/cgroup",
            d = d.display()
        ))
        .expect("prepare host");
    }

    /// The stand-ins' calls on this host (after `prepare_node`): (ns timestamp, "tool args").
    pub fn standin_calls(&self) -> Vec<(u128, String)> {
        standin_calls(
            &fs::read_to_string(self.dir.join("log/kprov-standins.log")).unwrap_or_default(),
        )
    }

    /// The host's directory on this machine (overlay upper dirs, logs, sshd files).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// What a host started at a chosen address is like: what cloud-init would have set up on
/// an instance from its user-data.
#[derive(Debug, Clone)]
pub struct HostSpec {
    /// Host name (an instance's private DNS name).
    pub name: String,
    pub address: Ipv4Addr,
    /// The subnet the address lies in; its first address is the host's default gateway.
    pub subnet: Ipv4Net,
    /// OpenSSH private host key (cloud-init's `ssh_keys.ed25519_private`); `None`: the host
    /// makes its own, as cloud-init does without one.
    pub host_key: Option<String>,
    /// Lines of authorized_keys (cloud-init's `ssh_authorized_keys`).
    pub authorized_keys: Vec<String>,
    /// The image's login user, with passwordless sudo; root cannot log in. `None`: root
    /// logs in (like `TestHosts`).
    pub login_user: Option<String>,
}

struct NetState {
    hosts: Vec<Arc<TestHost>>,
    subnets: std::collections::BTreeSet<Ipv4Net>,
    routed: std::collections::BTreeSet<Ipv4Net>,
}

/// Test hosts at chosen addresses in several subnets of one claimed block of 198.18.0.0/15,
/// for cloud instances played by test hosts.
///
/// Layout of a block of four /24s (e.g. 198.18.8.0/22): the first /23 is for the test's VPC
/// (`vpc_cidr`); the last /24 is the services network. One L2 bridge in the root namespace
/// (no address there: the root namespace cannot reach the lab, the lab cannot reach it)
/// links three kinds of namespaces:
/// - the router (`router_ns`): the first address of every subnet added (`add_subnet`), like
///   a VPC router, and `gateway` in the services network, where the artifact mirror and the
///   fake API listen; it forwards between its networks and has no other route, so an
///   address outside the block is unreachable from everywhere in the lab;
/// - the operator (`operator_ns`): where kprov and moto run, at `operator_address` in the
///   services network, with routes only to the subnets made reachable with
///   `route_from_operator` (the public ones: private subnets are reached through a bastion);
/// - one per host, its default route via its subnet's router address.
///
/// Torn down like `TestHosts` (by PID in Drop, orphans of killed runs reaped).
pub struct Network {
    pub block: Ipv4Net,
    pub gateway: Ipv4Addr,
    pub operator_address: Ipv4Addr,
    pub router_ns: String,
    pub operator_ns: String,
    idx: u32,
    count: u32,
    bridge: String,
    dir: PathBuf,
    next: AtomicU32,
    state: Mutex<NetState>,
}

impl Network {
    /// Claims a free block of four /24s and sets up the bridge, router and operator.
    pub fn start() -> Network {
        require_tier();
        reap_orphans();
        let dir = tempfile::Builder::new()
            .prefix("kprov-th-")
            .tempdir_in("/var/tmp")
            .expect("network dir")
            .keep();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
        let count = 4;
        let (idx, block) = claim_block(count, Some(&dir));
        let services = block
            .subnets(24)
            .expect("/24s")
            .last()
            .expect("services /24");
        let mut hosts = services.hosts();
        let gateway = hosts.next().expect("gateway");
        let operator_address = hosts.next().expect("operator address");
        let net = Network {
            block,
            gateway,
            operator_address,
            router_ns: format!("kprov-{idx}-r"),
            operator_ns: format!("kprov-{idx}-o"),
            idx,
            count,
            bridge: format!("kpb{idx}"),
            dir,
            next: AtomicU32::new(0),
            state: Mutex::new(NetState {
                hosts: Vec::new(),
                subnets: Default::default(),
                routed: Default::default(),
            }),
        };
        sh(&["ip", "link", "set", &net.bridge, "up"]).expect("bridge up");
        let svc = |a: Ipv4Addr| format!("{a}/{}", services.prefix_len());
        plug(
            &net.bridge,
            &net.router_ns,
            &format!("kp{idx}r"),
            &format!("kp{idx}s"),
            &svc(gateway),
            None,
        );
        net.in_ns(&net.router_ns, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        plug(
            &net.bridge,
            &net.operator_ns,
            &format!("kp{idx}o"),
            &format!("kp{idx}p"),
            &svc(operator_address),
            None,
        );
        // `ip netns exec` bind-mounts these over /etc: the lab's names, and no name server.
        let etc = Path::new("/etc/netns").join(&net.operator_ns);
        fs::create_dir_all(&etc).expect("/etc/netns dir");
        fs::write(etc.join("hosts"), "127.0.0.1 localhost\n").expect("hosts");
        fs::write(
            etc.join("resolv.conf"),
            "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
        )
        .expect("resolv.conf");
        net
    }

    /// The CIDR a test's VPC uses (the first half of the block).
    pub fn vpc_cidr(&self) -> Ipv4Net {
        self.block
            .subnets(self.block.prefix_len() + 1)
            .expect("halves")
            .next()
            .expect("vpc")
    }

    fn in_ns(&self, ns: &str, args: &[&str]) -> String {
        let mut full = vec!["ip", "netns", "exec", ns];
        full.extend_from_slice(args);
        sh(&full).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A command that runs `program` in the operator namespace.
    pub fn operator_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.operator_ns]).arg(program);
        c
    }

    /// The operator namespace's hosts file (bind-mounted over /etc/hosts by `ip netns exec`).
    pub fn operator_hosts_file(&self) -> PathBuf {
        Path::new("/etc/netns")
            .join(&self.operator_ns)
            .join("hosts")
    }

    /// Gives the router the first address of `subnet` (idempotent).
    pub fn add_subnet(&self, subnet: Ipv4Net) {
        assert!(
            self.vpc_cidr().contains(&subnet),
            "subnet {subnet} outside the lab's VPC range {}",
            self.vpc_cidr()
        );
        let mut st = self.state.lock().expect("network state");
        if st.subnets.insert(subnet) {
            let router = subnet.hosts().next().expect("router address");
            self.in_ns(
                &self.router_ns,
                &[
                    "ip",
                    "addr",
                    "add",
                    &format!("{router}/{}", subnet.prefix_len()),
                    "dev",
                    "eth0",
                ],
            );
        }
    }

    /// Lets the operator reach `subnet` (idempotent).
    pub fn route_from_operator(&self, subnet: Ipv4Net) {
        let mut st = self.state.lock().expect("network state");
        if st.routed.insert(subnet) {
            self.in_ns(
                &self.operator_ns,
                &[
                    "ip",
                    "route",
                    "add",
                    &subnet.to_string(),
                    "via",
                    &self.gateway.to_string(),
                ],
            );
        }
    }

    /// Starts a host as `spec` says and waits until its sshd listens.
    pub fn start_host(&self, spec: &HostSpec) -> Arc<TestHost> {
        assert!(spec.subnet.contains(&spec.address), "{spec:?}");
        self.add_subnet(spec.subnet);
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let dir = self.dir.join(format!("h{n}"));
        for d in OVERLAYS {
            let flat = d.trim_start_matches('/').replace('/', "_");
            fs::create_dir_all(dir.join("upper").join(&flat)).expect("upper dir");
            fs::create_dir_all(dir.join("work").join(&flat)).expect("work dir");
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
        let key = dir.join("host_key");
        match &spec.host_key {
            None => keygen(&key),
            Some(private) => {
                let mut text = private.trim_end().to_string();
                text.push('\n');
                fs::write(&key, text).expect("host key");
                fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).expect("chmod");
                let public = sh(&["ssh-keygen", "-y", "-f", key.to_str().expect("utf-8")])
                    .unwrap_or_else(|e| panic!("host key of {}: {e}", spec.name));
                fs::write(key.with_extension("pub"), public).expect("host key .pub");
            }
        }
        let authorized = dir.join("authorized_keys");
        fs::write(&authorized, spec.authorized_keys.join("\n") + "\n").expect("authorized_keys");
        fs::set_permissions(&authorized, fs::Permissions::from_mode(0o644)).expect("chmod");
        let host = TestHost {
            name: spec.name.clone(),
            address: spec.address.to_string(),
            port: 22,
            netns: format!("kprov-{}-{n}", self.idx),
            veth: format!("kp{}h{n}", self.idx),
            dir,
            authorized_keys: authorized,
            root_login: spec.login_user.is_none(),
            sshd: Mutex::new(None),
        };
        host.boot(
            &self.bridge,
            &format!("kp{}n{n}", self.idx),
            &format!("{}/{}", spec.address, spec.subnet.prefix_len()),
            spec.subnet.hosts().next(),
        );
        host.wait_ready();
        if let Some(user) = &spec.login_user {
            host.add_user(user, true);
        }
        let host = Arc::new(host);
        self.state
            .lock()
            .expect("network state")
            .hosts
            .push(host.clone());
        host
    }

    /// Stops the host at `address` and removes its namespace (an instance terminated).
    /// Returns whether there was one.
    pub fn stop_host(&self, address: Ipv4Addr) -> bool {
        let host = {
            let mut st = self.state.lock().expect("network state");
            let Some(i) = st
                .hosts
                .iter()
                .position(|h| h.address == address.to_string())
            else {
                return false;
            };
            st.hosts.remove(i)
        };
        host.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        let pids = sh(&["ip", "netns", "pids", &host.netns]).unwrap_or_default();
        for p in pids.split_whitespace() {
            let _ = sh(&["kill", "-KILL", p]);
        }
        for p in pids.split_whitespace().filter_map(|p| p.parse().ok()) {
            while !is_dead(p) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let _ = sh(&["ip", "netns", "del", &host.netns]);
        let _ = sh(&["ip", "link", "del", &host.veth]);
        true
    }

    pub fn hosts(&self) -> Vec<Arc<TestHost>> {
        self.state.lock().expect("network state").hosts.clone()
    }

    pub fn host(&self, address: &str) -> Option<Arc<TestHost>> {
        self.hosts().into_iter().find(|h| h.address == address)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let hosts = self.hosts();
        stop_kprov_ssh(&hosts.iter().map(|h| h.address.as_str()).collect::<Vec<_>>());
        for h in hosts {
            h.stop();
        }
        for j in self.idx..self.idx + self.count {
            teardown(j, &self.dir);
        }
    }
}

/// Runs `f` on a thread that has entered network namespace `ns`: sockets it creates (a
/// listener, a connection) live in that namespace, whichever thread uses them later.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    use std::os::fd::AsRawFd;
    unsafe extern "C" {
        fn setns(fd: i32, nstype: i32) -> i32;
    }
    const CLONE_NEWNET: i32 = 0x4000_0000;
    let file = fs::File::open(Path::new("/run/netns").join(ns))
        .unwrap_or_else(|e| panic!("network namespace {ns}: {e}"));
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on this thread only (network namespaces are per thread); the fd
            // stays open for the call.
            let rc = unsafe { setns(file.as_raw_fd(), CLONE_NEWNET) };
            assert_eq!(
                rc,
                0,
                "setns into {ns}: {}",
                std::io::Error::last_os_error()
            );
            f()
        })
        .join()
        .expect("thread in netns")
    })
}

/// The stand-ins' call log (`kprov-standins.log`, a line per call): (ns timestamp, "tool args").
pub fn standin_calls(log: &str) -> Vec<(u128, String)> {
    log.lines()
        .filter_map(|l| {
            let (t, rest) = l.split_once(' ')?;
            Some((t.parse().ok()?, rest.to_string()))
        })
        .collect()
}
