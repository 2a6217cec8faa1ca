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
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
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

fn run(cmd: &mut Command) -> Result<String, String> {
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

fn sh(args: &[&str]) -> Result<String, String> {
    run(Command::new(args[0]).args(&args[1..]))
}

fn keygen(path: &Path) {
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
fn is_dead(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
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
        let field = |k: &str| {
            alias
                .split_whitespace()
                .find_map(|f| f.strip_prefix(k))
                .map(str::to_string)
        };
        let (Some(pid), Some(dir)) = (field("pid="), field("dir=")) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(idx) = name.trim_start_matches("kpb").parse() {
            teardown(idx, Path::new(&dir));
        }
    }
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
        if link.starts_with(&format!("kp{idx}h")) || link.starts_with(&format!("kp{idx}n")) {
            let _ = sh(&["ip", "link", "del", link]);
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
    let start = (std::process::id() * 37 + COUNTER.fetch_add(1, Ordering::SeqCst) * 7) % SUBNETS;
    for i in 0..SUBNETS {
        let idx = (start + i) % SUBNETS;
        let (b, c) = (18 + idx / 256, idx % 256);
        // Someone else may use the range without our naming scheme: skip anything in use.
        let used = sh(&[
            "ip",
            "-o",
            "addr",
            "show",
            "to",
            &format!("198.{b}.{c}.0/24"),
        ])
        .map(|o| !o.trim().is_empty())
        .unwrap_or(true);
        if used {
            continue;
        }
        let bridge = format!("kpb{idx}");
        if sh(&["ip", "link", "add", &bridge, "type", "bridge"]).is_ok() {
            return (idx, bridge);
        }
    }
    panic!("no free test subnet in 198.18.0.0/15");
}

impl TestHosts {
    /// Starts `n` hosts named `host1..hostN` and waits until every sshd listens.
    pub fn start(n: usize) -> TestHosts {
        TestHosts::start_on_port(n, 22)
    }

    /// Like `start`, with every sshd listening on `port`.
    pub fn start_on_port(n: usize, port: u16) -> TestHosts {
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
        sh(&[
            "ip",
            "link",
            "set",
            "dev",
            &hosts.bridge,
            "alias",
            &format!(
                "kprov-test pid={} dir={}",
                std::process::id(),
                hosts.dir.display()
            ),
        ])
        .expect("bridge alias");
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
            dir,
            sshd: Mutex::new(None),
        };
        fs::write(host.dir.join("sshd_config"), host.sshd_config(&self.dir)).expect("config");
        fs::write(host.dir.join("init.sh"), host.init_script()).expect("init.sh");
        let peer = format!("kp{idx}n{i}");
        let ns = host.netns.as_str();
        sh(&["ip", "netns", "add", ns]).expect("netns");
        sh(&[
            "ip", "link", "add", &host.veth, "type", "veth", "peer", "name", &peer,
        ])
        .expect("veth");
        sh(&["ip", "link", "set", &host.veth, "master", &self.bridge]).expect("veth master");
        sh(&["ip", "link", "set", &host.veth, "up"]).expect("veth up");
        sh(&["ip", "link", "set", &peer, "netns", ns]).expect("veth to netns");
        let in_ns = |args: &[&str]| {
            let mut full = vec!["ip", "netns", "exec", ns];
            full.extend_from_slice(args);
            sh(&full).expect("configure netns");
        };
        in_ns(&["ip", "link", "set", &peer, "name", "eth0"]);
        in_ns(&["ip", "addr", "add", &format!("{address}/24"), "dev", "eth0"]);
        in_ns(&["ip", "link", "set", "eth0", "up"]);
        in_ns(&["ip", "link", "set", "lo", "up"]);
        host.spawn_sshd();
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

impl TestHost {
    fn sshd_config(&self, base: &Path) -> String {
        format!(
            "ListenAddress {addr}:{port}\n\
             HostKey {dir}/host_key\n\
             PidFile {dir}/sshd.pid\n\
             AuthorizedKeysFile {base}/authorized_keys\n\
             StrictModes no\n\
             PermitRootLogin prohibit-password\n\
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
            base = base.display(),
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

    fn pid(&self) -> u32 {
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
        // sshd first, by PID, reaping our child; then whatever else the namespaces hold.
        for h in &self.hosts {
            h.stop();
        }
        teardown(self.idx, &self.dir);
    }
}
