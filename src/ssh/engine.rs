//! The SSH engine: one multiplexed OpenSSH master per host, steps executed idempotently.
//!
//! The system `ssh` does the connecting (so `~/.ssh/config`, the agent and ProxyJump behave
//! as users expect); host keys are always checked strictly against the cluster's known hosts
//! from the state store (see `hostkeys`).

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use openssh::{ControlPersist, KnownHosts, Session, SessionBuilder, Stdio};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Mutex, Semaphore};

use crate::spec::{Cluster, Host};
use crate::state::StateStore;

use super::hostkeys::{self, KnownKey, RecordError};
use super::progress::{Event, HostReport, Progress, Summary};
use super::task::{ExecError, HostExecutor, RemoteFile, Step, StepOutcome};

/// Tuning and policy for a fleet of SSH connections.
#[derive(Debug, Clone)]
pub struct SshOptions {
    /// Hosts worked on at the same time (`--concurrency`).
    pub concurrency: usize,
    /// Commands in flight on one connection. sshd's default `MaxSessions` is 10 and a
    /// multiplexed master counts each command as a session, so stay below it.
    pub sessions_per_host: usize,
    /// How long one connection attempt may take (ssh's `ConnectTimeout`).
    pub connect_timeout: Duration,
    /// Record the keys of hosts the cluster has never seen (`--accept-new-host-keys`).
    pub accept_new_host_keys: bool,
    /// Passed to ssh as `-F` only when set; otherwise the user's own config applies.
    pub config_file: Option<PathBuf>,
    /// A master left behind by a killed kprov exits after this much idle time.
    pub control_persist_idle: Duration,
}

impl Default for SshOptions {
    fn default() -> Self {
        SshOptions {
            concurrency: 20,
            sessions_per_host: 8,
            connect_timeout: Duration::from_secs(10),
            accept_new_host_keys: false,
            config_file: None,
            control_persist_idle: Duration::from_secs(300),
        }
    }
}

/// Where ssh will really connect, after the user's ssh config is applied (`ssh -G`).
#[derive(Debug, Clone)]
struct Target {
    user: String,
    hostname: String,
    port: u16,
    /// Name the host key is recorded under.
    pattern: String,
    /// The cipher list ssh will offer (`ssh -G`'s `ciphers`).
    ciphers: Option<String>,
}

#[derive(Clone)]
struct Connection {
    session: Arc<Session>,
    target: Target,
}

struct HostSlot {
    spec: Host,
    connection: Mutex<Option<Connection>>,
    sessions: Semaphore,
}

/// A cluster's hosts reached over SSH. Implements [`HostExecutor`].
pub struct SshFleet {
    cluster: String,
    // Declared before `dir`: sessions shut their masters down before the control dir goes.
    hosts: Vec<HostSlot>,
    by_name: HashMap<String, usize>,
    store: Arc<dyn StateStore>,
    options: SshOptions,
    progress: Arc<dyn Progress>,
    in_flight: Semaphore,
    /// sha256 of file contents by buffer address. Renderers hand every host clones of the same
    /// `Bytes` (a 100 MB kubelet), so each is hashed once per fleet, not once per host. The
    /// cache holds a clone, which keeps the buffer alive: an address is never reused while
    /// cached.
    hashes: std::sync::Mutex<HashMap<(usize, usize), (Bytes, String)>>,
    /// ssh's compiled-in cipher list, asked once (see [`preferred_ciphers`]).
    default_ciphers: tokio::sync::OnceCell<Option<String>>,
    /// The controller's CPU has AES instructions (/proc/cpuinfo).
    aes: bool,
    /// Private (0700), short path: control sockets (≤ 108 bytes) and known_hosts files.
    dir: tempfile::TempDir,
}

/// Where ssh will connect for `address` (`ssh -G`: the user's config applied, no network
/// contact) and the name it checks the host key under.
async fn resolve(
    address: &str,
    user: Option<&str>,
    port: Option<u16>,
    config_file: Option<&std::path::Path>,
) -> Result<Target, String> {
    let mut cmd = tokio::process::Command::new("ssh");
    cmd.arg("-G");
    if let Some(f) = config_file {
        cmd.arg("-F").arg(f);
    }
    if let Some(p) = port {
        cmd.args(["-p", &p.to_string()]);
    }
    if let Some(u) = user {
        cmd.args(["-l", u]);
    }
    // `--`: an address is never read as an option.
    cmd.arg("--").arg(address);
    let out = super::stdout_of(&mut cmd, "cannot run ssh", &format!("ssh -G {address}")).await?;
    let text = String::from_utf8_lossy(&out);
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(' '))
            .map(str::trim)
    };
    let hostname = get("hostname").unwrap_or(address).to_string();
    let port = get("port").and_then(|p| p.parse().ok()).unwrap_or(22);
    let alias = get("hostkeyalias").filter(|a| *a != "none");
    Ok(Target {
        user: get("user").unwrap_or("root").to_string(),
        pattern: hostkeys::pattern(&hostname, port, alias),
        hostname,
        port,
        ciphers: get("ciphers").map(str::to_string),
    })
}

/// The cipher kprov prefers for its own connections on a CPU with AES instructions: they
/// carry hundreds of MB (binaries, image archives), and OpenSSH's default,
/// chacha20-poly1305@openssh.com, costs the controller's `ssh` and the host's `sshd` about
/// twice the CPU of AES-GCM there (300 MB on this project's benchmark machine: 0.21-0.28 s
/// against 0.15 s in ssh, 0.19-0.20 s against 0.08-0.10 s in sshd).
const PREFERRED_CIPHER: &str = "aes128-gcm@openssh.com";

/// Whether /proc/cpuinfo's text names AES instructions (x86 `flags`, ARM `Features`).
fn cpu_has_aes(cpuinfo: &str) -> bool {
    cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags") || l.starts_with("Features"))
        .any(|l| l.split_whitespace().any(|w| w == "aes"))
}

/// ssh's compiled-in cipher list (`ssh -G -F /dev/null`: no config read, no network contact).
async fn default_ciphers() -> Option<String> {
    let out = tokio::process::Command::new("ssh")
        .args(["-G", "-F", "/dev/null", "--", "localhost"])
        .output()
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("ciphers "))
        .map(|c| c.trim().to_string())
}

/// The `Ciphers` kprov sets for a connection, or None to leave ssh's choice alone. Only when
/// the CPU has AES, the user's config sets no cipher for the host (`configured`, from `ssh -G`,
/// is ssh's own default list) and that list offers [`PREFERRED_CIPHER`]: the same list with
/// it first, so a server without it still negotiates one of the others.
fn preferred_ciphers(configured: Option<&str>, default: Option<&str>, aes: bool) -> Option<String> {
    let (configured, default) = (configured?, default?);
    if !aes || configured != default || !default.split(',').any(|c| c == PREFERRED_CIPHER) {
        return None;
    }
    let rest = default.split(',').filter(|c| *c != PREFERRED_CIPHER);
    Some(
        std::iter::once(PREFERRED_CIPHER)
            .chain(rest)
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// The name ssh checks `address`'s host key under once the user's ssh config (or
/// `config_file`) is applied: a `HostKeyAlias`, else the `HostName`, with the port in
/// brackets when it is not 22. Where kprov records a key it knows in advance.
pub(crate) async fn known_hosts_name(
    address: &str,
    user: Option<&str>,
    port: Option<u16>,
    config_file: Option<&std::path::Path>,
) -> Result<String, String> {
    resolve(address, user, port, config_file)
        .await
        .map(|t| t.pattern)
}

/// Where ssh connects for `address` once the user's ssh config is applied (`HostName`,
/// `Port`), without contacting it: what a probe of the same host must dial.
pub(crate) async fn destination(
    address: &str,
    user: Option<&str>,
    port: Option<u16>,
) -> Result<(String, u16), String> {
    resolve(address, user, port, None)
        .await
        .map(|t| (t.hostname, t.port))
}

/// `[user@]host[:port]` (an IPv6 host in brackets), as `spec::validate::check_bastion`
/// accepts it.
fn split_jump(jump: &str) -> (Option<&str>, &str, Option<u16>) {
    let (user, rest) = match jump.rsplit_once('@') {
        Some((u, r)) => (Some(u), r),
        None => (None, jump),
    };
    if let Some(v6) = rest.strip_prefix('[') {
        return match v6.split_once(']') {
            Some((h, p)) => (user, h, p.strip_prefix(':').and_then(|p| p.parse().ok())),
            None => (user, rest, None),
        };
    }
    match rest.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (user, h, p.parse().ok()),
        _ => (user, rest, None),
    }
}

/// The ssh config of one connection: kprov's settings first (ssh keeps the first value it
/// reads), then the user's config as ssh would have read it without `-F`. `ciphers`: the
/// address ssh is given and the list for it, see [`preferred_ciphers`] (set only when the
/// user's config sets none for that address). `jump`: the jump host checked against the key
/// file kprov recorded for it.
fn connection_config_text(
    ciphers: Option<(&str, &str)>,
    jump: Option<(&str, &std::path::Path)>,
    config_file: Option<&std::path::Path>,
) -> String {
    let mut text = String::from("# Written by kprov for one connection.\n");
    if let Some((address, c)) = ciphers {
        // Under a Match for the address alone: ssh hands this file to the ProxyJump child
        // too, and the jump host's own `Ciphers` (checked by nobody here) must still win.
        text.push_str(&format!(
            "# The user's config sets no cipher: AES-GCM first (the CPU has AES instructions).\n\
             Match originalhost \"{address}\"\n  \
             Ciphers {c}\n\
             Match all\n"
        ));
    }
    if let Some((jump_host, known)) = jump {
        text.push_str(&format!(
            "# The jump host's key is the one kprov recorded.\n\
             Match originalhost {jump_host}\n  \
             StrictHostKeyChecking yes\n  \
             UserKnownHostsFile \"{k}\"\n  \
             GlobalKnownHostsFile \"{k}\"\n\
             Match all\n",
            k = known.display()
        ));
    }
    match config_file {
        Some(f) => text.push_str(&format!("Include \"{}\"\n", f.display())),
        None => text.push_str("Include ~/.ssh/config\nInclude /etc/ssh/ssh_config\n"),
    }
    text
}

/// How running one command failed.
enum Attempt {
    /// No session could be opened on the master: the command did not start.
    NotStarted(openssh::Error),
    Failed(ExecError),
}

impl Attempt {
    fn into_error(self, host: &str) -> ExecError {
        match self {
            Attempt::NotStarted(e) => ExecError::connect(host, chain(&e)),
            Attempt::Failed(e) => e,
        }
    }
}

/// Exit status kprov's own remote snippets use for "file does not exist".
const MISSING: i32 = 100;
/// Files kprov reads back from hosts (kubeconfigs, certificates, facts, markers) are small.
const MAX_REMOTE_FILE: u64 = crate::bounded::KUBECONFIG;
/// coreutils `timeout` exits with 124 when it had to stop the command.
const TIMED_OUT: i32 = 124;

fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let s_msg = s.to_string();
        if !msg.contains(&s_msg) {
            msg.push_str(": ");
            msg.push_str(s_msg.trim());
        }
        src = s.source();
    }
    msg
}

fn stderr_text(out: &Output) -> String {
    output_text(
        &String::from_utf8_lossy(&out.stderr),
        &String::from_utf8_lossy(&out.stdout),
    )
}

impl SshFleet {
    /// A fleet for the hosts of a completed metal cluster spec.
    pub(crate) fn for_cluster(
        cluster: &Cluster,
        store: Arc<dyn StateStore>,
        options: SshOptions,
        progress: Arc<dyn Progress>,
    ) -> Result<SshFleet, ExecError> {
        SshFleet::new(
            &cluster.metadata.name,
            cluster.spec.hosts.clone(),
            store,
            options,
            progress,
        )
    }

    /// A fleet over `hosts` (names must be unique); nothing connects until a run. Fails when a name
    /// repeats or the private control-socket directory cannot be made in /tmp.
    pub fn new(
        cluster: &str,
        hosts: Vec<Host>,
        store: Arc<dyn StateStore>,
        options: SshOptions,
        progress: Arc<dyn Progress>,
    ) -> Result<SshFleet, ExecError> {
        let mut by_name = HashMap::new();
        for (i, h) in hosts.iter().enumerate() {
            if by_name.insert(h.name.clone(), i).is_some() {
                return Err(ExecError::Other {
                    host: h.name.clone(),
                    message: "host name appears twice in the inventory".into(),
                });
            }
        }
        // /tmp, not $TMPDIR: a long TMPDIR would push socket paths past the 108-byte limit.
        // Private: it holds the control sockets, through which anyone could run commands.
        let dir = tempfile::Builder::new()
            .prefix("kprov-ssh-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir_in("/tmp")
            .map_err(|e| ExecError::Other {
                host: "localhost".into(),
                message: format!("cannot create the ssh control directory in /tmp: {e}"),
            })?;
        let sessions = options.sessions_per_host.max(1);
        Ok(SshFleet {
            cluster: cluster.to_string(),
            hosts: hosts
                .into_iter()
                .map(|spec| HostSlot {
                    spec,
                    connection: Mutex::new(None),
                    sessions: Semaphore::new(sessions),
                })
                .collect(),
            by_name,
            store,
            in_flight: Semaphore::new(options.concurrency.max(1)),
            hashes: std::sync::Mutex::new(HashMap::new()),
            default_ciphers: tokio::sync::OnceCell::new(),
            aes: std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|t| cpu_has_aes(&t)),
            options,
            progress,
            dir,
        })
    }

    /// The sha256 of `f`'s content: the renderer's when it gave one, else computed (once).
    fn file_hash(&self, f: &RemoteFile) -> String {
        match &f.sha256 {
            Some(h) => h.clone(),
            None => self.content_hash(&f.content),
        }
    }

    fn content_hash(&self, content: &Bytes) -> String {
        let key = (content.as_ptr() as usize, content.len());
        if let Ok(cache) = self.hashes.lock()
            && let Some((_, h)) = cache.get(&key)
        {
            return h.clone();
        }
        let h = hex::encode(Sha256::digest(content));
        if let Ok(mut cache) = self.hashes.lock() {
            cache.insert(key, (content.clone(), h.clone()));
        }
        h
    }

    fn slot(&self, host: &str) -> Result<(usize, &HostSlot), ExecError> {
        self.by_name
            .get(host)
            .map(|&i| (i, &self.hosts[i]))
            .ok_or_else(|| ExecError::Other {
                host: host.to_string(),
                message: format!("not a host of cluster {}", self.cluster),
            })
    }

    /// Runs each host's steps, hosts in parallel (bounded by `concurrency`); a failed host
    /// does not stop the others. Reports come back in the order of `work`.
    pub async fn run_all(&self, work: &[(String, Vec<Step>)]) -> Summary {
        let runs = work.iter().map(|(host, steps)| async move {
            let started = Instant::now();
            let result = self.run_named(host, steps).await;
            let duration = started.elapsed();
            self.progress.event(&Event::HostFinished {
                host: host.clone(),
                ok: result.is_ok(),
                duration,
            });
            HostReport {
                host: host.clone(),
                roles: self
                    .slot(host)
                    .map(|(_, s)| s.spec.roles.clone())
                    .unwrap_or_default(), // a host outside the fleet has no roles to report
                duration,
                result,
            }
        });
        Summary {
            hosts: futures::future::join_all(runs).await,
        }
    }

    /// Forwards a free loopback port through `host`'s connection to `remote_host:remote_port`
    /// as `host` sees it (the API server of a control plane that only the ssh path reaches:
    /// private endpoints, hosts behind a bastion). The forward lasts as long as the fleet.
    pub async fn forward(
        &self,
        host: &str,
        remote_host: &str,
        remote_port: u16,
    ) -> Result<std::net::SocketAddr, ExecError> {
        let (_, slot) = self.slot(host)?;
        let conn = self.connection(slot).await?;
        let other = |message: String| ExecError::Other {
            host: host.to_string(),
            message,
        };
        // The master binds the port itself: ask the kernel for a free one first.
        let local = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| other(format!("no free local port for a tunnel: {e}")))?;
        conn.session
            .request_port_forward(
                openssh::ForwardType::Local,
                local,
                openssh::Socket::TcpSocket {
                    host: remote_host.to_string().into(),
                    port: remote_port,
                },
            )
            .await
            .map_err(|e| {
                other(format!(
                    "cannot forward {local} to {remote_host}:{remote_port}: {}",
                    chain(&e)
                ))
            })?;
        Ok(local)
    }

    /// Per step, the paths of its files whose content or mode differ on `host`. Strictly
    /// read-only (hashes and modes are read; nothing is uploaded, no check or run script is
    /// executed): what a preview may do.
    pub(crate) async fn differing_files(
        &self,
        host: &str,
        steps: &[Step],
    ) -> Result<Vec<(String, Vec<String>)>, ExecError> {
        let (_, slot) = self.slot(host)?;
        let mut out = Vec::new();
        for step in steps {
            let stale = self.stale_files(slot, step).await?;
            if !stale.is_empty() {
                out.push((
                    step.name.clone(),
                    stale.iter().map(|f| f.path.clone()).collect(),
                ));
            }
        }
        Ok(out)
    }

    /// Where the masters' control sockets live (diagnostics: `ssh -S SOCKET -O check x`).
    pub fn control_dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Closes every master connection (also done on drop, without waiting).
    pub async fn close(&self) {
        for slot in &self.hosts {
            if let Some(c) = slot.connection.lock().await.take()
                && let Ok(session) = Arc::try_unwrap(c.session)
            {
                // Nothing useful to do if the master is already gone.
                let _ = session.close().await;
            }
        }
    }

    async fn run_named(
        &self,
        host: &str,
        steps: &[Step],
    ) -> Result<Vec<(String, StepOutcome)>, ExecError> {
        let (_, slot) = self.slot(host)?;
        let _permit = self
            .in_flight
            .acquire()
            .await
            .map_err(|e| ExecError::Other {
                host: host.to_string(),
                message: e.to_string(),
            })?;
        // Connect before the first step, so a host that cannot be reached fails as such.
        self.connection(slot).await?;
        let mut outcomes = Vec::with_capacity(steps.len());
        // A step with files, and every step without files after it, make one command: the
        // files are compared first (one command), so a batch is at most two round trips.
        let mut i = 0;
        while i < steps.len() {
            let end = steps[i + 1..]
                .iter()
                .position(|s| !s.files.is_empty())
                .map_or(steps.len(), |p| i + 1 + p);
            self.run_batch(slot, i, steps.len(), &steps[i..end], &mut outcomes)
                .await?;
            i = end;
        }
        Ok(outcomes)
    }

    /// The host's connection, opened on first use.
    async fn connection(&self, slot: &HostSlot) -> Result<Connection, ExecError> {
        let mut guard = slot.connection.lock().await;
        if let Some(c) = guard.as_ref() {
            return Ok(c.clone());
        }
        let c = self.connect(slot).await?;
        *guard = Some(c.clone());
        Ok(c)
    }

    /// Replaces `stale` with a new connection, unless another task already did.
    async fn reconnect(
        &self,
        slot: &HostSlot,
        stale: &Connection,
    ) -> Result<Connection, ExecError> {
        let mut guard = slot.connection.lock().await;
        if let Some(c) = guard.as_ref()
            && !Arc::ptr_eq(&c.session, &stale.session)
        {
            return Ok(c.clone());
        }
        *guard = None;
        let c = self.connect(slot).await?;
        *guard = Some(c.clone());
        Ok(c)
    }

    async fn resolve(&self, h: &Host) -> Result<Target, ExecError> {
        resolve(
            &h.address,
            h.user.as_deref(),
            h.port,
            self.options.config_file.as_deref(),
        )
        .await
        .map_err(|message| ExecError::connect(&h.name, message))
    }

    /// When the cluster's store holds the key of `h`'s jump host (a cloud bastion whose key
    /// kprov generated): the jump host's name and a known_hosts file with that key, for a
    /// config that checks the jump strictly against it. OpenSSH passes `-F` on to the
    /// ProxyJump child but no `-o`, so the check must live in a config file. None: the user's
    /// config checks the jump, as it does for metal bastions.
    async fn jump_known(
        &self,
        h: &Host,
        index: usize,
    ) -> Result<Option<(String, PathBuf)>, ExecError> {
        let Some(jump) = &h.bastion else {
            return Ok(None);
        };
        let (user, host, port) = split_jump(jump);
        let t = resolve(host, user, port, self.options.config_file.as_deref())
            .await
            .map_err(|message| {
                ExecError::connect(&h.name, format!("jump host {jump}: {message}"))
            })?;
        let keys = self.stored_keys(&h.name, &t.pattern).await?;
        if keys.is_empty() {
            return Ok(None);
        }
        let known = self.write_known_hosts(h, &format!("known_hosts.jump.{index}"), &keys)?;
        Ok(Some((host.to_string(), known)))
    }

    /// The ssh config file of `h`'s connection when kprov has something to set (the jump
    /// host's recorded key, the preferred cipher): kprov's lines, then an `Include` of the
    /// user's own config (or of the one given), so everything else the user configured
    /// keeps applying. None: ssh reads the user's config as it would (or the `-F` given).
    async fn connection_config(
        &self,
        h: &Host,
        target: &Target,
        index: usize,
    ) -> Result<Option<PathBuf>, ExecError> {
        let jump = self.jump_known(h, index).await?;
        let default = self.default_ciphers.get_or_init(default_ciphers).await;
        // The address goes into a Match line: only a plain host name or IP (validated
        // specs have nothing else; anything odd keeps ssh's own choice).
        let plain = h
            .address
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-_:".contains(c));
        let ciphers = preferred_ciphers(target.ciphers.as_deref(), default.as_deref(), self.aes)
            .filter(|_| plain && !h.address.is_empty());
        if jump.is_none() && ciphers.is_none() {
            return Ok(None);
        }
        let config = self.dir.path().join(format!("ssh_config.{index}"));
        let text = connection_config_text(
            ciphers.as_deref().map(|c| (h.address.as_str(), c)),
            jump.as_ref()
                .map(|(host, known)| (host.as_str(), known.as_path())),
            self.options.config_file.as_deref(),
        );
        std::fs::write(&config, text).map_err(|e| ExecError::Other {
            host: h.name.clone(),
            message: format!("writing {}: {e}", config.display()),
        })?;
        Ok(Some(config))
    }

    /// `keys` as the known_hosts file `name` in the fleet's private directory, for a
    /// connection to `h` that checks them strictly.
    fn write_known_hosts(
        &self,
        h: &Host,
        name: &str,
        keys: &[KnownKey],
    ) -> Result<PathBuf, ExecError> {
        let path = self.dir.path().join(name);
        let text: String = keys.iter().map(|k| k.line() + "\n").collect();
        std::fs::write(&path, text).map_err(|e| ExecError::Other {
            host: h.name.clone(),
            message: format!("writing {}: {e}", path.display()),
        })?;
        Ok(path)
    }

    async fn stored_keys(&self, host: &str, pattern: &str) -> Result<Vec<KnownKey>, ExecError> {
        Ok(self
            .recorded_keys(host)
            .await?
            .into_iter()
            .filter(|k| k.pattern == pattern)
            .collect())
    }

    /// Every key the cluster's store records (for any host), checked line by line.
    async fn recorded_keys(&self, host: &str) -> Result<Vec<KnownKey>, ExecError> {
        let key = hostkeys::store_key(&self.cluster);
        let obj = self.store.get(&key).await.map_err(|e| ExecError::Other {
            host: host.to_string(),
            message: format!("reading known host keys: {e}"),
        })?;
        let Some(obj) = obj else {
            return Ok(Vec::new());
        };
        // Checked on read: a damaged line is reported and refused, never used or skipped
        // silently (a key that vanished would read as a first contact).
        let (keys, damaged) = hostkeys::parse_checked(&obj.data);
        if !damaged.is_empty() {
            return Err(ExecError::Other {
                host: host.to_string(),
                message: hostkeys::damaged_message(
                    &self.store.key_location(&key),
                    &self.cluster,
                    &damaged,
                ),
            });
        }
        Ok(keys)
    }

    async fn fingerprints(&self, host: &str, keys: &[KnownKey]) -> Result<String, ExecError> {
        hostkeys::fingerprints(keys, self.dir.path())
            .await
            .map(|f| f.join(", "))
            .map_err(|message| ExecError::Other {
                host: host.to_string(),
                message,
            })
    }

    async fn scan(&self, h: &Host, t: &Target) -> Result<Vec<KnownKey>, ExecError> {
        let (index, _) = self.slot(&h.name)?;
        let config = self.connection_config(h, t, index).await?;
        self.scan_with(
            h,
            t,
            config.as_deref().or(self.options.config_file.as_deref()),
        )
        .await
    }

    /// [`Self::scan`] with the connection's ssh config already made.
    async fn scan_with(
        &self,
        h: &Host,
        t: &Target,
        ssh_config: Option<&std::path::Path>,
    ) -> Result<Vec<KnownKey>, ExecError> {
        hostkeys::scan(
            &t.hostname,
            t.port,
            &t.pattern,
            h.bastion.as_deref(),
            ssh_config,
            self.options.connect_timeout.as_secs().max(1),
        )
        .await
        .map_err(|message| ExecError::connect(&h.name, message))
    }

    /// Explains a host key verification failure. If the host still offers a recorded key,
    /// the failure was elsewhere (a bastion's key, checked by the user's known_hosts).
    async fn changed_key(
        &self,
        h: &Host,
        t: &Target,
        known: &[KnownKey],
        ssh_message: String,
    ) -> Result<ExecError, ExecError> {
        let offered = match self.scan(h, t).await {
            Ok(offered) => offered,
            // Not even the scan gets through (e.g. the bastion's key is refused): ssh's own
            // message says more than the scan's.
            Err(_) => {
                return Ok(ExecError::connect(&h.name, ssh_message));
            }
        };
        if offered.iter().any(|k| known.contains(k)) {
            return Ok(ExecError::connect(&h.name, ssh_message));
        }
        Ok(ExecError::HostKeyChanged {
            host: h.name.clone(),
            known: self.fingerprints(&h.name, known).await?,
            offered: self.fingerprints(&h.name, &offered).await?,
        })
    }

    /// Records first-contact keys (compare-and-swap) and reports them: `Ok(())` once they are
    /// in the store.
    async fn record_keys(&self, h: &Host, scanned: &[KnownKey]) -> Result<(), ExecError> {
        let (fingerprints, recorded) = tokio::join!(
            self.fingerprints(&h.name, scanned),
            hostkeys::record(&self.store, &self.cluster, scanned)
        );
        let fingerprints = fingerprints?;
        match recorded {
            Ok(()) => {}
            Err(RecordError::Differs(existing)) => {
                return Err(ExecError::HostKeyChanged {
                    host: h.name.clone(),
                    known: self.fingerprints(&h.name, &existing).await?,
                    offered: fingerprints,
                });
            }
            Err(RecordError::Store(e)) => {
                return Err(ExecError::Other {
                    host: h.name.clone(),
                    message: format!("recording host keys: {e}"),
                });
            }
        }
        self.progress.event(&Event::HostKeyRecorded {
            host: h.name.clone(),
            fingerprints: fingerprints.split(", ").map(String::from).collect(),
        });
        Ok(())
    }

    /// Opens `slot`'s master. Strict host keys always: against the cluster's recorded keys,
    /// or on first contact (`--accept-new-host-keys` only) against the scanned ones, recorded
    /// in the store before ssh starts: a record that fails starts no connection, so nothing
    /// logs in. Parts that do not depend on each other run at once (`ssh -G` and reading the
    /// store), each part's time reported with `Connected`.
    async fn connect(&self, slot: &HostSlot) -> Result<Connection, ExecError> {
        let h = &slot.spec;
        let started = Instant::now();
        self.progress.event(&Event::Connecting {
            host: h.name.clone(),
        });
        let (index, _) = self.slot(&h.name)?;
        // ssh's default cipher list (the fleet's first connection asks `ssh -G -F /dev/null`
        // once) is read beside them: in series it cost one more ssh start before the connect.
        let ((target, resolved), (recorded, read), _) = tokio::join!(
            timed("ssh -G", self.resolve(h)),
            timed("keys", self.recorded_keys(&h.name)),
            self.default_ciphers.get_or_init(default_ciphers),
        );
        let mut parts = vec![resolved, read];
        let target = target?;
        let stored: Vec<KnownKey> = recorded?
            .into_iter()
            .filter(|k| k.pattern == target.pattern)
            .collect();
        let t = Instant::now();
        let config = self
            .connection_config(h, &target, index)
            .await?
            .or(self.options.config_file.clone());
        parts.push(("config", t.elapsed()));
        let first_contact = stored.is_empty();
        let keys = if !first_contact {
            stored
        } else if !self.options.accept_new_host_keys {
            // No network contact at all (no keyscan, no bastion login): a preview, or an
            // update not allowed to record keys, never reaches a host it cannot verify.
            return Err(ExecError::UnknownHostKey {
                host: h.name.clone(),
                fingerprints: super::NOT_SCANNED.into(),
            });
        } else {
            let t = Instant::now();
            let scanned = self.scan_with(h, &target, config.as_deref()).await?;
            parts.push(("scan", t.elapsed()));
            scanned
        };
        let known_hosts = self.write_known_hosts(h, &format!("known_hosts.{index}"), &keys)?;

        let mut b = SessionBuilder::default();
        b.known_hosts_check(KnownHosts::Strict)
            .user_known_hosts_file(&known_hosts)
            .control_directory(self.dir.path())
            .control_persist(ControlPersist::IdleFor(
                NonZeroUsize::new(self.options.control_persist_idle.as_secs() as usize)
                    .unwrap_or(NonZeroUsize::MIN),
            ))
            .connect_timeout(self.options.connect_timeout)
            .server_alive_interval(Duration::from_secs(15));
        if let Some(u) = &h.user {
            b.user(u.clone());
        }
        if let Some(p) = h.port {
            b.port(p);
        }
        if let Some(k) = &h.key_path {
            b.keyfile(k);
        }
        if let Some(j) = &h.bastion {
            b.jump_hosts([j]);
        }
        if let Some(f) = config {
            b.config_file(f);
        }
        // First contact: the scanned keys are in the store before ssh starts. A record that
        // fails (another writer recorded other keys for the host, the store refused) ends
        // here: no master is started, nothing authenticates to the host, nothing runs on it.
        // Recording beside the connect saved one store write on first contact only, and left
        // a master that had to be closed half-started when the record failed.
        if first_contact {
            let (recorded, took) = timed("record", self.record_keys(h, &keys)).await;
            parts.push(took);
            recorded?;
        }
        let (session, ssh_took) = timed("ssh", b.connect_mux(&h.address)).await;
        parts.push(ssh_took);
        let session = match session {
            Ok(s) => s,
            Err(e) => {
                let message = chain(&e);
                if message.contains("Host key verification failed")
                    || message.contains("HOST IDENTIFICATION HAS CHANGED")
                {
                    return Err(self.changed_key(h, &target, &keys, message).await?);
                }
                return Err(ExecError::connect(&h.name, message));
            }
        };
        let conn = Connection {
            session: Arc::new(session),
            target,
        };
        if conn.target.user != "root" {
            // Fail at connect with the clear sudo message rather than in the middle of a step.
            let out = self
                .exec_on(slot, &conn, Remote::new("true", &[]))
                .await
                .map_err(|a| a.into_error(&h.name))?;
            if !out.status.success() {
                return Err(ExecError::Other {
                    host: h.name.clone(),
                    message: format!("sudo -n true failed: {}", stderr_text(&out)),
                });
            }
        }
        self.progress.event(&Event::Connected {
            host: h.name.clone(),
            duration: started.elapsed(),
            parts,
        });
        Ok(conn)
    }

    /// Runs `command` as root on the host, through `sudo -n` when the login user is not root,
    /// on a fresh connection when the master died before the command started.
    async fn exec(&self, slot: &HostSlot, command: Remote<'_>) -> Result<Output, ExecError> {
        let conn = self.connection(slot).await?;
        match self.exec_on(slot, &conn, command).await {
            // The master died since its last use (host rebooted, network cut). The command
            // never started, so running it on a fresh connection is safe.
            Err(Attempt::NotStarted(_)) => {
                let fresh = self.reconnect(slot, &conn).await?;
                self.exec_on(slot, &fresh, command)
                    .await
                    .map_err(|a| a.into_error(&slot.spec.name))
            }
            other => other.map_err(|a| a.into_error(&slot.spec.name)),
        }
    }

    async fn exec_on(
        &self,
        slot: &HostSlot,
        conn: &Connection,
        command: Remote<'_>,
    ) -> Result<Output, Attempt> {
        let Remote {
            script,
            args,
            stdin,
            on_line,
        } = command;
        let host = &slot.spec.name;
        let failed = |e: openssh::Error| Attempt::Failed(ExecError::connect(host, chain(&e)));
        let sudo = conn.target.user != "root";
        let mut argv: Vec<String> = Vec::new();
        if sudo {
            argv.extend(["sudo".into(), "-n".into()]);
        }
        argv.extend(["sh".into(), "-c".into(), script.into(), "sh".into()]);
        argv.extend(args.iter().map(|a| a.to_string()));

        let _permit = slot.sessions.acquire().await.map_err(|e| {
            Attempt::Failed(ExecError::Other {
                host: host.clone(),
                message: e.to_string(),
            })
        })?;
        let mut cmd = conn.session.command(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(if stdin.is_empty() {
                Stdio::null()
            } else {
                Stdio::piped()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().await.map_err(Attempt::NotStarted)?;
        let writer = child.stdin().take();
        let feed = async move {
            if let Some(mut w) = writer {
                for data in stdin {
                    w.write_all(data).await?;
                }
                // EOF tells the remote side the data is complete.
                w.shutdown().await?;
            }
            Ok::<_, std::io::Error>(())
        };
        let mut out_pipe = child.stdout().take();
        let mut err_pipe = child.stderr().take();
        let read_out = async {
            let mut buf = Vec::new();
            if let Some(p) = out_pipe.as_mut() {
                p.read_to_end(&mut buf).await?;
            }
            Ok::<_, std::io::Error>(buf)
        };
        let read_err = async {
            let mut all = Vec::new();
            if let Some(p) = err_pipe.as_mut() {
                let mut r = tokio::io::BufReader::new(p);
                loop {
                    let start = all.len();
                    if r.read_until(b'\n', &mut all).await? == 0 {
                        break;
                    }
                    if let Some(f) = on_line {
                        f(&all[start..]);
                    }
                }
            }
            Ok::<_, std::io::Error>(all)
        };
        let (fed, stdout, stderr) = tokio::join!(feed, read_out, read_err);
        let status = child.wait().await.map_err(failed)?;
        let io_failed = |e: std::io::Error| {
            Attempt::Failed(ExecError::connect(
                host,
                format!("reading the command's output: {e}"),
            ))
        };
        let out = Output {
            status,
            stdout: stdout.map_err(io_failed)?,
            stderr: stderr.map_err(io_failed)?,
        };
        if let Err(e) = fed {
            // A remote side that refused part of the data (a failed upload in a batch) says
            // why on stderr; the broken pipe says less.
            if out.status.success() {
                return Err(Attempt::Failed(ExecError::Other {
                    host: host.clone(),
                    message: format!("sending data: {e}"),
                }));
            }
        }
        if sudo && out.status.code() == Some(1) {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.starts_with("sudo:")
                && (err.contains("password is required") || err.contains("terminal is required"))
            {
                return Err(Attempt::Failed(ExecError::SudoPassword {
                    host: host.clone(),
                    user: conn.target.user.clone(),
                }));
            }
        }
        Ok(out)
    }

    /// The step's files whose content or mode differ on the host (a read-only comparison).
    async fn stale_files<'s>(
        &self,
        slot: &HostSlot,
        step: &'s Step,
    ) -> Result<Vec<&'s RemoteFile>, ExecError> {
        if step.files.is_empty() {
            return Ok(Vec::new());
        }
        let paths: Vec<&str> = step.files.iter().map(|f| f.path.as_str()).collect();
        let out = self.exec(slot, Remote::new(STAT, &paths)).await?;
        let failed = |why: String| ExecError::Step {
            host: slot.spec.name.clone(),
            step: step.name.clone(),
            code: out.status.code(),
            stderr: format!("comparing files: {why}"),
        };
        if !out.status.success() {
            return Err(failed(stderr_text(&out)));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let remote = parse_stat(&stdout, paths.len()).ok_or_else(|| {
            failed(format!(
                "unexpected answer from the host: {:?}",
                crate::output::untrusted(&stdout.chars().take(200).collect::<String>())
            ))
        })?;
        Ok(step
            .files
            .iter()
            .zip(remote)
            .filter(|(f, have)| {
                have.is_none_or(|(hash, mode)| {
                    hash != self.file_hash(f) || mode != format!("{:o}", f.mode)
                })
            })
            .map(|(f, _)| f)
            .collect())
    }

    /// Uploads a large file so that a cut upload resumes: the bytes go to
    /// `PATH.kprov-partial` (kept when the connection or kprov dies), the next run sends only
    /// what the partial file lacks, and the file is renamed into place only once its sha256 is
    /// the expected one. A partial file that cannot be a prefix of the content (longer, or the
    /// whole of it with the wrong digest) is removed, so the run after that starts afresh.
    async fn put_resumable(
        &self,
        slot: &HostSlot,
        step: &Step,
        f: &RemoteFile,
        mode: &str,
        hash: &str,
    ) -> Result<(), ExecError> {
        let fail = |out: &Output, what: &str| ExecError::Step {
            host: slot.spec.name.clone(),
            step: step.name.clone(),
            code: out.status.code(),
            stderr: format!("{what}: {}", stderr_text(out)),
        };
        const SIZE: &str = r#"p="$1.kprov-partial"
if [ -f "$p" ]; then s=$(stat -c %s "$p"); else s=0; fi
if [ "$s" -gt "$2" ]; then rm -f "$p"; s=0; fi
echo "$s""#;
        let total = f.content.len() as u64;
        let out = self
            .exec(slot, Remote::new(SIZE, &[&f.path, &total.to_string()]))
            .await?;
        if !out.status.success() {
            return Err(fail(
                &out,
                &format!("reading the partial upload of {}", f.path),
            ));
        }
        let have: u64 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
            .min(total);
        const APPEND: &str = r#"set -e
p="$1.kprov-partial"
mkdir -p "$(dirname "$1")"
if [ -f "$p" ]; then s=$(stat -c %s "$p"); else s=0; fi
if [ "$s" != "$4" ]; then
  echo "partial upload $p has $s bytes, expected $4 (another upload at once?)" >&2
  exit 1
fi
cat >> "$p"
s=$(stat -c %s "$p")
if [ "$s" -lt "$5" ]; then
  echo "upload cut short at $s of $5 bytes; $p is kept and a re-run resumes it" >&2
  exit 1
fi
h=$(sha256sum < "$p" | cut -d' ' -f1)
if [ "$h" != "$3" ]; then
  rm -f "$p"
  echo "received content has sha256 $h, expected $3; the partial upload is removed, a re-run starts afresh" >&2
  exit 1
fi
chmod "$2" "$p"
mv -f "$p" "$1""#;
        let rest = f.content.slice(have as usize..);
        let out = self
            .exec(
                slot,
                Remote {
                    stdin: &[rest],
                    ..Remote::new(
                        APPEND,
                        &[&f.path, mode, hash, &have.to_string(), &total.to_string()],
                    )
                },
            )
            .await?;
        if out.status.success() {
            tracing::debug!(
                host = %slot.spec.name,
                path = %f.path,
                resumed_at = have,
                sent = total - have,
                "resumable upload complete"
            );
            Ok(())
        } else {
            Err(fail(&out, &format!("uploading {}", f.path)))
        }
    }

    /// Runs `steps` on the host as **one** command: the stale files of the first step (the
    /// only one that may have files) go over its stdin and are written atomically, then each
    /// step's check and run follow in order, stopping at the first failure. A marker line on
    /// stderr per step (`NONCE start I`, `NONCE unchanged I`, `NONCE changed I`, `NONCE exit I
    /// CODE`; `NONCE start I` also on stdout) gives live progress, each step's outcome and the
    /// output that belongs to it. One command costs about one round trip on an open master;
    /// one per step, as before, cost about two each.
    async fn run_batch(
        &self,
        slot: &HostSlot,
        first: usize,
        total: usize,
        steps: &[Step],
        outcomes: &mut Vec<(String, StepOutcome)>,
    ) -> Result<(), ExecError> {
        let host = &slot.spec.name;
        let state = std::sync::Mutex::new(BatchState {
            current: 0,
            started: Instant::now(),
            on_host: None,
            finished: Vec::new(),
            hooks_failed: false,
        });
        self.progress.event(&Event::StepStarted {
            host: host.clone(),
            step: steps[0].name.clone(),
            index: first,
            total,
        });
        let finish = |k: usize,
                      result: Result<StepOutcome, &ExecError>,
                      took: Duration,
                      remote: Option<Duration>| {
            self.progress.event(&Event::StepFinished {
                host: host.clone(),
                step: steps[k].name.clone(),
                result: result.map_err(|e| e.to_string().into()),
                duration: took,
                remote,
            });
        };
        let nonce = format!("kprov-{:016x}", rand::random::<u64>());
        let to_step = |e: ExecError, k: usize| match e {
            // Inside a step a broken connection is about the step: say which one.
            ExecError::Connect { host, message } => ExecError::ConnectionLost {
                host,
                step: steps[k].name.clone(),
                message,
            },
            other => other,
        };
        // Each step's timeout bounds it here too, counted from when its start marker arrived
        // (the first step's from the start of the batch: it includes comparing and uploading
        // its files). The remote `timeout` normally reports first; this catches a host that
        // went silent.
        let watchdog = || async {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if let Ok(st) = state.lock()
                    && st.started.elapsed() > steps[st.current].timeout
                {
                    return;
                }
            }
        };
        let timed_out = |k: usize| ExecError::Timeout {
            host: host.clone(),
            step: steps[k].name.clone(),
            timeout: steps[k].timeout,
        };

        let stale = match within(self.stale_files(slot, &steps[0]), watchdog()).await {
            Ok(Ok(stale)) => stale,
            Ok(Err(e)) => {
                let e = to_step(e, 0);
                finish(0, Err(&e), Duration::ZERO, None);
                return Err(e);
            }
            Err(_) => {
                let e = timed_out(0);
                finish(0, Err(&e), Duration::ZERO, None);
                return Err(e);
            }
        };
        // Bundle members go first, each on its own resumable upload (see `put_resumable`);
        // the batch then carries only the other files.
        let (resumable, stale): (Vec<&RemoteFile>, Vec<&RemoteFile>) =
            stale.into_iter().partition(|f| f.resumable);
        for f in resumable {
            let mode = format!("{:o}", f.mode);
            let hash = self.file_hash(f);
            if let Err(e) = self.put_resumable(slot, &steps[0], f, &mode, &hash).await {
                let e = to_step(e, 0);
                finish(0, Err(&e), Duration::ZERO, None);
                return Err(e);
            }
        }
        let mut args: Vec<String> = vec![
            nonce.clone(),
            super::task::ARRIVALS_AT_ONCE.to_string(),
            stale.len().to_string(),
        ];
        for f in &stale {
            let (hook, hook_timeout) = match &f.on_arrival {
                Some(a) => (a.run.clone(), a.timeout.as_secs().max(1).to_string()),
                None => (String::new(), String::new()),
            };
            args.extend([
                f.path.clone(),
                format!("{:o}", f.mode),
                self.file_hash(f),
                f.content.len().to_string(),
                hook,
                hook_timeout,
            ]);
        }
        args.push(steps.len().to_string());
        for st in steps {
            args.extend([
                st.timeout.as_secs().max(1).to_string(),
                if st.check.is_some() { "1" } else { "0" }.to_string(),
                st.check.clone().unwrap_or_default(), // the flag before it says there is none
                if st.run.trim().is_empty() {
                    String::new()
                } else {
                    st.run.clone()
                },
            ]);
        }
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let data: Vec<Bytes> = stale.iter().map(|f| f.content.clone()).collect();
        let on_line = |line: &[u8]| {
            let line = String::from_utf8_lossy(line);
            let mut words = line.split_whitespace();
            if words.next() != Some(nonce.as_str()) {
                return;
            }
            let kind = words.next().unwrap_or_default(); // a bare nonce: no kind below matches
            let Some(k) = words.next().and_then(|k| k.parse::<usize>().ok()) else {
                return;
            };
            if kind == "hook" {
                // K is the index of a file sent in this batch.
                if let Some(f) = stale.get(k) {
                    self.progress.event(&Event::HookStarted {
                        host: host.clone(),
                        step: steps[0].name.clone(),
                        path: f.path.clone(),
                    });
                }
                return;
            }
            let Ok(mut st) = state.lock() else { return };
            if k >= steps.len() {
                return;
            }
            let took = st.started.elapsed();
            let remote = st.on_host.map(|t| t.elapsed());
            match kind {
                // The first file's hook started: the first step's work on the host began
                // (its files' hooks are part of it), while the rest of its files upload.
                "arrive" => {
                    st.on_host = Some(Instant::now());
                }
                "start" => {
                    if k > 0 || st.on_host.is_none() {
                        st.on_host = Some(Instant::now());
                    }
                    if k > 0 {
                        self.progress.event(&Event::StepStarted {
                            host: host.clone(),
                            step: steps[k].name.clone(),
                            index: first + k,
                            total,
                        });
                    }
                    if k > 0 {
                        st.current = k;
                        st.started = Instant::now();
                    }
                }
                "changed" | "unchanged" => {
                    let o = if kind == "changed" {
                        StepOutcome::Changed
                    } else {
                        StepOutcome::Unchanged
                    };
                    finish(k, Ok(o.clone()), took, remote);
                    st.finished.push((k, Ok(o), took));
                }
                "exit" => {
                    let code = words.next().and_then(|c| c.parse::<i32>().ok());
                    // Failed arrival hooks: their own lines name each file and what happened
                    // (a hook's timeout is not the step's).
                    if words.next() == Some("hook") {
                        st.hooks_failed = true;
                    }
                    if code == Some(0) {
                        finish(k, Ok(StepOutcome::Changed), took, remote);
                        st.finished.push((k, Ok(StepOutcome::Changed), took));
                    } else {
                        st.finished.push((k, Err(code), took));
                    }
                }
                _ => {}
            }
        };
        let batch = Remote {
            stdin: &data,
            on_line: Some(&on_line),
            ..Remote::new(BATCH, &arg_refs)
        };
        let run = self.exec(slot, batch);
        let result = within(run, watchdog()).await;
        let st = state.lock().map_err(|e| ExecError::Other {
            host: host.clone(),
            message: e.to_string(),
        })?;
        let current = st.current;
        let elapsed = st.started.elapsed();
        let on_host = st.on_host.map(|t| t.elapsed());
        let out = match result {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => {
                let e = to_step(e, current);
                finish(current, Err(&e), elapsed, on_host);
                outcomes.extend(ok_outcomes(steps, &st.finished));
                return Err(e);
            }
            Err(_) => {
                let e = timed_out(current);
                finish(current, Err(&e), elapsed, on_host);
                outcomes.extend(ok_outcomes(steps, &st.finished));
                return Err(e);
            }
        };
        outcomes.extend(ok_outcomes(steps, &st.finished));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let failed = st.finished.iter().find_map(|(k, r, took)| match r {
            Err(code) => Some((*k, *code, *took)),
            Ok(_) => None,
        });
        if let Some((k, code, took)) = failed {
            let e = if code == Some(TIMED_OUT) && !st.hooks_failed {
                timed_out(k)
            } else {
                ExecError::Step {
                    host: host.clone(),
                    step: steps[k].name.clone(),
                    code,
                    stderr: output_text(
                        &section(&stderr, &nonce, &format!("start {k}")),
                        &section(&stdout, &nonce, &format!("start {k}")),
                    ),
                }
            };
            finish(k, Err(&e), took, on_host);
            return Err(e);
        }
        if st.finished.len() == steps.len() && out.status.success() {
            return Ok(());
        }
        // The command stopped before its steps were done: an upload refused (before the first
        // step started) or the shell itself failed.
        let started = stderr
            .lines()
            .any(|l| l.trim() == format!("{nonce} start 0"));
        let e = if !started {
            let which = stderr
                .lines()
                .filter_map(|l| l.trim().strip_prefix(&format!("{nonce} upload ")))
                .filter_map(|j| j.parse::<usize>().ok())
                .next_back();
            let what = match which.and_then(|j| stale.get(j)) {
                Some(f) => format!("uploading {}", f.path),
                None => "uploading files".to_string(),
            };
            let text = match which {
                Some(j) => section(&stderr, &nonce, &format!("upload {j}")),
                None => stderr.to_string(),
            };
            ExecError::Step {
                host: host.clone(),
                step: steps[0].name.clone(),
                code: out.status.code(),
                stderr: format!("{what}: {}", output_text(&text, "")),
            }
        } else {
            ExecError::Step {
                host: host.clone(),
                step: steps[current].name.clone(),
                code: out.status.code(),
                stderr: output_text(
                    &section(&stderr, &nonce, &format!("start {current}")),
                    &section(&stdout, &nonce, &format!("start {current}")),
                ),
            }
        };
        finish(current, Err(&e), elapsed, on_host);
        Err(e)
    }
}

/// Each file's sha256 and mode on the host, for [`parse_stat`]. One `stat` and one
/// `sha256sum` for every file that exists: per file, its own `sha256sum`, `cut`, `stat` and
/// two subshells cost the host about twenty process starts for a step of four files. The
/// answer: a line of `1`/`0` (the file exists or not), then one mode per existing file, then
/// its `sha256sum` line (`HASH  NAME`, a backslash first when the name needed escaping).
const STAT: &str = r#"e=
for f; do
  shift
  # A bare "-" would be standard input to stat and sha256sum; paths are absolute anyway.
  case $f in /*) ;; *) f=./$f ;; esac
  if [ -f "$f" ]; then e="${e}1"; set -- "$@" "$f"; else e="${e}0"; fi
done
echo "$e"
[ "$#" -gt 0 ] || exit 0
stat -c %a -- "$@" || exit 1
sha256sum -- "$@" || exit 1"#;

/// [`STAT`]'s answer for `count` files: per file, its (sha256, mode) or None when it does
/// not exist. None for an answer of another shape (a file that vanished between the test and
/// the hash): nothing is guessed.
fn parse_stat(stdout: &str, count: usize) -> Option<Vec<Option<(&str, &str)>>> {
    let mut lines = stdout.lines();
    let exists = lines.next()?;
    if exists.len() != count || !exists.bytes().all(|b| b == b'0' || b == b'1') {
        return None;
    }
    let present = exists.bytes().filter(|b| *b == b'1').count();
    let modes: Vec<&str> = lines.by_ref().take(present).collect();
    let hashes: Vec<&str> = lines
        .by_ref()
        .take(present)
        .map(|l| l.strip_prefix('\\').unwrap_or(l).get(..64))
        .collect::<Option<_>>()?;
    let well_formed = modes.len() == present
        && hashes.len() == present
        && lines.next().is_none()
        && modes
            .iter()
            .all(|m| !m.is_empty() && m.bytes().all(|b| (b'0'..=b'7').contains(&b)))
        && hashes
            .iter()
            .all(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    if !well_formed {
        return None;
    }
    let (mut modes, mut hashes) = (modes.into_iter(), hashes.into_iter());
    exists
        .bytes()
        .map(|b| match b {
            b'1' => Some(Some((hashes.next()?, modes.next()?))),
            _ => Some(None),
        })
        .collect()
}

/// `work`'s result and how long it took, named `what` (a part of a connection's time).
async fn timed<T>(
    what: &'static str,
    work: impl std::future::Future<Output = T>,
) -> (T, (&'static str, Duration)) {
    let t = Instant::now();
    let r = work.await;
    (r, (what, t.elapsed()))
}

/// `work`'s result, or `Err` when `limit` resolved first.
async fn within<T>(
    work: impl std::future::Future<Output = T>,
    limit: impl std::future::Future<Output = ()>,
) -> Result<T, ()> {
    tokio::select! {
        r = work => Ok(r),
        () = limit => Err(()),
    }
}

/// Sees each line of a command's standard error as it arrives.
type LineSink<'a> = dyn Fn(&[u8]) + Sync + 'a;

/// A command for a host: `sh -c script` with `args` as `$1..`. `stdin` is sent in order, then
/// EOF (no buffers: none means /dev/null); `on_line` sees each line of standard error as it
/// arrives (progress markers of a batch of steps).
#[derive(Clone, Copy)]
struct Remote<'a> {
    script: &'a str,
    args: &'a [&'a str],
    stdin: &'a [Bytes],
    on_line: Option<&'a LineSink<'a>>,
}

impl<'a> Remote<'a> {
    /// `script` with `args`, nothing on its standard input, its standard error read whole.
    fn new(script: &'a str, args: &'a [&'a str]) -> Self {
        Remote {
            script,
            args,
            stdin: &[],
            on_line: None,
        }
    }
}

/// A finished step of a batch (its index): its outcome or its exit code, how long it took.
type Finished = (usize, Result<StepOutcome, Option<i32>>, Duration);

/// What the markers of a batch said so far.
struct BatchState {
    /// The step (index in the batch) that started last.
    current: usize,
    started: Instant,
    /// When the step's work on the host began: its start marker, or for the first step the
    /// first arrival hook's start when earlier.
    on_host: Option<Instant>,
    /// Per finished step: its outcome or its exit code, and how long it took.
    finished: Vec<Finished>,
    /// The first step failed because arrival hooks did (its exit marker said `hook`).
    hooks_failed: bool,
}

fn ok_outcomes(steps: &[Step], finished: &[Finished]) -> Vec<(String, StepOutcome)> {
    finished
        .iter()
        .filter_map(|(k, r, _)| r.as_ref().ok().map(|o| (steps[*k].name.clone(), o.clone())))
        .collect()
}

/// The lines of `text` after the marker line `NONCE what` up to the next marker line.
fn section(text: &str, nonce: &str, what: &str) -> String {
    let start = format!("{nonce} {what}");
    let mut lines = text.lines().skip_while(|l| l.trim() != start);
    if lines.next().is_none() {
        return String::new();
    }
    lines
        .take_while(|l| !l.trim_start().starts_with(nonce))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A failed command's reason: its stderr, else its stdout, the end kept.
fn output_text(stderr: &str, stdout: &str) -> String {
    let err = stderr.trim();
    let text = if err.is_empty() { stdout.trim() } else { err };
    // The end of the output is where the reason is; keep errors readable.
    const MAX: usize = 4000;
    match text.char_indices().rev().nth(MAX) {
        Some((i, _)) => format!("...{}", &text[i..]),
        None => text.to_string(),
    }
}

/// The script of a batch of steps (see `run_batch`). Arguments: NONCE, the most arrival hooks
/// at once, the number of files, per file PATH MODE SHA256 LENGTH HOOK HOOK_TIMEOUT (their
/// contents follow one another on stdin; an empty HOOK: none), the number of steps, per step
/// TIMEOUT HAS_CHECK CHECK RUN (an empty RUN: a files-only step). Values reach the shell only
/// as positional parameters, never inside the script text.
///
/// Each file goes to a `mktemp` file beside its target (same filesystem: the final `mv` is
/// atomic) and is checked against its sha256 before the rename: a cut connection gives
/// `head` an early EOF, and half a file must never replace the old one. The traps remove the
/// temporary file also when the shell is killed by the hang-up of a cut session.
/// `head -c` (GNU) reads no more than it is asked for, so the next file starts where this one
/// ended.
///
/// A file's hook ([`RemoteFile::on_arrival`]) starts in the background once the file is in
/// place (its stdin /dev/null: the stream is the next file's), while the next files upload;
/// each one's stderr goes to a file of its own; the first one's start is marked (`NONCE arrive
/// 0`: the first step's time on the host counts from there), and each one's start too (`NONCE
/// hook J`, J the file's index: written before the next file's upload begins). All have ended
/// before the first step starts; if any failed, the first step fails with their stderr and a
/// line naming each failed hook's file (timed out, or its exit code), its exit marker says so
/// (`NONCE exit 0 CODE hook`, CODE the last failed hook's) and nothing else runs. The first
/// step's run sees the files whose hooks ran in `$KPROV_HOOKED` (one path a line), so it can
/// skip their work. A batch that ends early (a checksum mismatch, its watchdog, a cut session)
/// stops the hooks still running: `timeout` passes the TERM on, and a re-run must not meet a
/// stale import of the same archive.
const BATCH: &str = r#"n=$1; hk=$2; nf=$3; shift 3
up=0
t=
hd=
hj=
hn=0
hf=
hc=0
ha=
nl='
'
trap 'for j in $hj; do kill -TERM "${j%%:*}" 2>/dev/null; done; rm -f -- ${t:+"$t"}; [ -z "$hd" ] || rm -rf -- "$hd"' EXIT
# Waits for the oldest running hook (a function's positional parameters are its own).
hwait() {
  set -- $hj
  p=${1%%:*}
  j=${1#*:}
  shift
  hj="$*"
  hn=$((hn - 1))
  wait "$p"
  e=$?
  if [ "$e" -ne 0 ]; then hf="$hf $j"; hc=$e; printf '%s\n' "$e" > "$hd/$j.e"; fi
}
while [ "$nf" -gt 0 ]; do
  printf '\n%s upload %d\n' "$n" "$up" >&2
  f=$1; m=$2; h=$3; l=$4; x=$5; xt=$6; shift 6; nf=$((nf - 1))
  case $f in */*) d=${f%/*}; d=${d:-/} ;; *) d=. ;; esac
  [ -d "$d" ] || mkdir -p "$d" || exit 1
  t=$(mktemp "$d/.kprov.XXXXXX") || exit 1
  trap 'exit 1' HUP INT TERM PIPE
  head -c "$l" > "$t" || exit 1
  g=$(sha256sum < "$t") || exit 1
  g=${g%% *}
  if [ "$g" != "$h" ]; then
    echo "received content has sha256 $g, expected $h (upload cut short?)" >&2
    exit 1
  fi
  chmod "$m" "$t" && mv -f "$t" "$f" || exit 1
  t=
  if [ -n "$x" ]; then
    if [ -z "$hd" ]; then
      hd=$(mktemp -d) || exit 1
      printf '\n%s arrive 0\n' "$n" >&2
    fi
    [ "$hn" -lt "$hk" ] || hwait
    printf '%s\n%s\n' "$f" "$xt" > "$hd/$up.f"
    timeout -k 5 "$xt" sh -c "$x" </dev/null >/dev/null 2>"$hd/$up" &
    hj="$hj $!:$up"
    hn=$((hn + 1))
    ha="$ha$f$nl"
    printf '\n%s hook %d\n' "$n" "$up" >&2
  fi
  up=$((up + 1))
done
while [ "$hn" -gt 0 ]; do hwait; done
trap - HUP INT TERM PIPE
if [ -n "$hd" ] && [ -z "$hf" ]; then rm -rf -- "$hd"; hd=; fi
ns=$1; shift
i=0
while [ "$i" -lt "$ns" ]; do
  to=$1; k=$2; c=$3; r=$4; shift 4
  printf '\n%s start %d\n' "$n" "$i"
  printf '\n%s start %d\n' "$n" "$i" >&2
  if [ -n "$hf" ]; then
    for j in $hf; do
      cat -- "$hd/$j" >&2
      { read -r hp; read -r ht; } < "$hd/$j.f"
      read -r e < "$hd/$j.e"
      if [ "$e" = 124 ]; then
        printf 'kprov: %s: its arrival hook did not end within its timeout (%s s); stopped\n' "$hp" "$ht" >&2
      else
        printf 'kprov: %s: its arrival hook failed (exit %s)\n' "$hp" "$e" >&2
      fi
    done
    printf '\n%s exit %d %d hook\n' "$n" "$i" "$hc" >&2
    exit 0
  fi
  if [ -z "$r" ]; then
    if [ "$up" -gt 0 ]; then s=changed; else s=unchanged; fi
    printf '\n%s %s %d\n' "$n" "$s" "$i" >&2
  elif [ "$up" -eq 0 ] && [ "$k" = 1 ] && timeout -k 5 "$to" sh -c "$c" </dev/null >/dev/null 2>&1; then
    printf '\n%s unchanged %d\n' "$n" "$i" >&2
  else
    KPROV_HOOKED=$ha timeout -k 5 "$to" sh -c "$r" </dev/null
    rc=$?
    printf '\n%s exit %d %d\n' "$n" "$i" "$rc" >&2
    [ "$rc" -eq 0 ] || exit 0
  fi
  up=0
  ha=
  i=$((i + 1))
done"#;

#[async_trait::async_trait]
impl HostExecutor for SshFleet {
    async fn run_steps(&self, host: &str, steps: &[Step]) -> Result<Vec<StepOutcome>, ExecError> {
        Ok(self
            .run_named(host, steps)
            .await?
            .into_iter()
            .map(|(_, o)| o)
            .collect())
    }

    async fn read_file(&self, host: &str, path: &str) -> Result<Option<Bytes>, ExecError> {
        self.read_file_bounded(host, path, MAX_REMOTE_FILE).await
    }

    async fn read_file_bounded(
        &self,
        host: &str,
        path: &str,
        limit: u64,
    ) -> Result<Option<Bytes>, ExecError> {
        let (_, slot) = self.slot(host)?;
        // A host is not trusted with the operator's memory: the remote side sends at most one
        // byte over the limit, and that byte is the refusal.
        let script = format!(
            "[ -e \"$1\" ] || exit {MISSING}; head -c {} -- \"$1\"",
            limit + 1
        );
        let out = self.exec(slot, Remote::new(&script, &[path])).await?;
        match out.status.code() {
            Some(0) if out.stdout.len() as u64 > limit => Err(ExecError::Other {
                host: host.to_string(),
                message: format!(
                    "reading {path}: larger than {} MiB, the most kprov reads back for it; refused",
                    limit >> 20
                ),
            }),
            Some(0) => Ok(Some(Bytes::from(out.stdout))),
            Some(MISSING) => Ok(None),
            _ => Err(ExecError::Other {
                host: host.to_string(),
                message: format!("reading {path}: {}", stderr_text(&out)),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `script` run by a local `sh -c` as a host's shell runs it (`$0` is `sh`; the arguments
    /// added to the command are its `$1`...).
    fn sh(script: &str) -> std::process::Command {
        let mut c = std::process::Command::new("sh");
        c.arg("-c").arg(script).arg("sh");
        c
    }

    /// The one `stat` and `sha256sum` of STAT answer per file in the order given, missing
    /// files included, names a shell or sha256sum would mangle included.
    #[test]
    fn stat_answers_each_file_in_order_with_one_hash_and_one_stat() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let names = ["plain", "with space", "new\nline", "back\\slash", "-dash"];
        let mut paths = Vec::new();
        let mut want = Vec::new();
        for (i, n) in names.iter().enumerate() {
            let p = d.path().join(n);
            let content = format!("content {i}\n");
            std::fs::write(&p, &content).unwrap();
            let mode = [0o644, 0o600, 0o755, 0o640, 0o4755][i];
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            want.push(Some((
                hex::encode(Sha256::digest(content.as_bytes())),
                format!("{mode:o}"),
            )));
            paths.push(p.display().to_string());
            // A missing file between each two.
            paths.push(d.path().join(format!("missing {i}")).display().to_string());
            want.push(None);
        }
        let out = sh(STAT).args(&paths).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        let got: Vec<Option<(String, String)>> = parse_stat(&stdout, paths.len())
            .unwrap_or_else(|| panic!("{stdout}"))
            .into_iter()
            .map(|f| f.map(|(h, m)| (h.to_string(), m.to_string())))
            .collect();
        assert_eq!(got, want);
        // A bare "-" is the file of that name, never standard input.
        std::fs::write(d.path().join("-"), "dash\n").unwrap();
        let out = sh(STAT)
            .arg("-")
            .current_dir(d.path())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let got = parse_stat(&stdout, 1).unwrap_or_else(|| panic!("{stdout}"));
        assert_eq!(
            got[0].map(|(h, _)| h.to_string()),
            Some(hex::encode(Sha256::digest(b"dash\n"))),
            "{stdout}"
        );
        // No file at all: the line of zeros alone.
        let out = sh(STAT).arg(d.path().join("none")).output().unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(parse_stat(&stdout, 1), Some(vec![None]));
    }

    #[test]
    fn a_stat_answer_of_another_shape_is_refused_not_guessed() {
        let h = "a".repeat(64);
        let ok = format!("1\n644\n{h}  /x\n");
        assert_eq!(parse_stat(&ok, 1), Some(vec![Some((h.as_str(), "644"))]));
        for (answer, count) in [
            (String::new(), 1),
            // A file that vanished between the test and the hash: its line is missing.
            ("1\n644\n".to_string(), 1),
            (ok.clone(), 2),
            (format!("11\n644\n{h}  /x\n"), 2),
            (format!("1\n64x\n{h}  /x\n"), 1),
            (format!("1\n644\n{}  /x\n", "g".repeat(64)), 1),
            (format!("{ok}more\n"), 1),
            (format!("2\n644\n{h}  /x\n"), 1),
        ] {
            assert_eq!(parse_stat(&answer, count), None, "{answer:?}");
        }
    }

    /// A batch that fails after a file's hook started (here: the next file's checksum) stops
    /// the hook: it must not run on beside a re-run (a stale `ctr import`).
    #[test]
    fn a_batch_that_fails_stops_the_hooks_still_running() {
        use std::io::Write;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().display().to_string();
        let pid_file = d.path().join("hook.pid");
        let hook = format!("echo $$ > {dir}/hook.pid; exec sleep 60");
        let (a, b) = (b"first".as_slice(), b"second".as_slice());
        // The second file is announced with another content's sha256: the batch exits there,
        // its hook running.
        let files = [
            (format!("{dir}/a"), a, hook, "120"),
            (format!("{dir}/b"), b"SECOND".as_slice(), String::new(), "0"),
        ];
        let mut child = spawn_batch(&files, &["0"], std::process::Stdio::null());
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(a).unwrap();
        stdin.flush().unwrap();
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        // The fields of /proc/PID/stat after the `)` of the name: state first, the start
        // time (in clock ticks since boot) 20th.
        let stat = |pid: &str| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .map(|(_, r)| r.split_whitespace().map(str::to_string).collect())
                })
                .unwrap_or_else(Vec::new)
        };
        // The hook's PID and start time, read while it surely runs: on a busy machine with
        // pid_max 32768 the PID may belong to another process or thread by the time the
        // batch has failed, and only the start time tells it is not the hook.
        let (pid, started) = loop {
            assert!(Instant::now() < deadline, "the hook never started");
            if let Ok(p) = std::fs::read_to_string(&pid_file) {
                let p = p.trim().to_string();
                if let Some(t) = stat(&p).get(19).cloned().filter(|_| !p.is_empty()) {
                    break (p, t);
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        stdin.write_all(b).unwrap();
        drop(stdin);
        assert!(
            !child.wait().unwrap().success(),
            "the checksum must fail the batch"
        );
        // Gone, a zombie nobody reaped yet (state Z), or its PID now someone else's.
        let alive = || {
            let f = stat(&pid);
            f.first().is_some_and(|state| state != "Z") && f.get(19) == Some(&started)
        };
        while alive() {
            assert!(Instant::now() < deadline, "the hook {pid} still runs");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// A file of a test batch: its path, content, arrival hook and the hook's timeout.
    type BatchFile<'a> = (String, &'a [u8], String, &'a str);

    /// [`BATCH`] under `sh`, announcing `files` (each with its content's sha256 and size)
    /// and then `steps` (the step arguments, their count first); stdin piped, stdout dropped.
    fn spawn_batch(
        files: &[BatchFile],
        steps: &[&str],
        stderr: std::process::Stdio,
    ) -> std::process::Child {
        use sha2::Digest;
        let mut args: Vec<String> = vec![
            "NONCE".into(),
            super::super::task::ARRIVALS_AT_ONCE.to_string(),
            files.len().to_string(),
        ];
        for (path, content, hook, timeout) in files {
            args.extend([
                path.clone(),
                "644".into(),
                hex::encode(sha2::Sha256::digest(content)),
                content.len().to_string(),
                hook.clone(),
                timeout.to_string(),
            ]);
        }
        args.extend(steps.iter().map(|s| s.to_string()));
        sh(BATCH)
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap()
    }

    /// Runs [`BATCH`] under `sh` with `files` and one step whose run is `run`; the stdin is
    /// written by a thread (the batch may stop reading while it waits for a hook). Returns
    /// the child to wait on.
    fn batch(files: &[BatchFile], run: &str) -> std::process::Child {
        use std::io::Write;
        let mut child = spawn_batch(
            files,
            &["1", "60", "0", "", run],
            std::process::Stdio::piped(),
        );
        let data: Vec<u8> = files.iter().flat_map(|f| f.1.iter().copied()).collect();
        let mut stdin = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            // A batch that stopped early closes its end: nothing to report here.
            let _ = stdin.write_all(&data);
        });
        child
    }

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < deadline, "waited 60 s for {what}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// A hook that outlives its own timeout is stopped, and the first step fails naming the
    /// hook's file and the timeout (not as the step's own timeout); the step's run never runs.
    #[test]
    fn a_hook_that_exceeds_its_timeout_fails_the_step_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().display().to_string();
        let files = [
            (format!("{dir}/fast"), &b"one"[..], "true".to_string(), "60"),
            (
                format!("{dir}/slow"),
                &b"two"[..],
                "exec sleep 60".to_string(),
                "1",
            ),
        ];
        let child = batch(&files, &format!("touch {dir}/ran"));
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "kprov: {dir}/slow: its arrival hook did not end within its timeout (1 s); stopped"
            )),
            "{err}"
        );
        assert!(!err.contains(&format!("{dir}/fast: its")), "{err}");
        assert!(
            err.lines().any(|l| l == "NONCE exit 0 124 hook"),
            "the exit marker names the hooks: {err}"
        );
        assert!(
            !d.path().join("ran").exists(),
            "the run ran after a failed hook"
        );
    }

    /// Never more than [`super::super::task::ARRIVALS_AT_ONCE`] hooks at once, counted with
    /// marker files (each hook's exists while it runs); each hook starts before the next
    /// file's upload begins (the batch's own markers, in order); the first step's run sees
    /// the hooked files in `$KPROV_HOOKED`.
    #[test]
    fn at_most_four_hooks_run_at_once_each_started_before_the_next_upload() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().display().to_string();
        std::fs::create_dir(d.path().join("running")).unwrap();
        let n = 7;
        let files: Vec<(String, &[u8], String, &str)> = (0..n)
            .map(|j| {
                // Counts the hooks running now (its own marker included), then holds until
                // the test releases every hook.
                let hook = format!(
                    "touch {dir}/running/{j}; ls {dir}/running | wc -l >> {dir}/counts; \
                     while [ ! -e {dir}/release ]; do sleep 0.05; done; rm {dir}/running/{j}"
                );
                (format!("{dir}/file{j}"), &b"content"[..], hook, "120")
            })
            .collect();
        let child = batch(
            &files,
            &format!("printf '%s' \"$KPROV_HOOKED\" > {dir}/hooked"),
        );
        let counts = || {
            std::fs::read_to_string(d.path().join("counts"))
                .unwrap_or_default()
                .lines()
                .map(|l| l.trim().parse::<usize>().unwrap())
                .collect::<Vec<_>>()
        };
        wait_for("four hooks", || counts().len() >= 4);
        // The fifth file lands; its hook must wait for the oldest one.
        wait_for("the fifth file", || d.path().join("file4").exists());
        // Only a batch without the limit would start a fifth hook now: give it the chance.
        let deadline = Instant::now() + std::time::Duration::from_secs(2);
        while Instant::now() < deadline && counts().len() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(counts().len(), 4, "a fifth hook started while four ran");
        std::fs::write(d.path().join("release"), "").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let c = counts();
        assert_eq!(c.len(), n, "{c:?}");
        assert!(c.iter().all(|&k| k <= 4), "more than four at once: {c:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let at = |m: &str| {
            err.lines()
                .position(|l| l == m)
                .unwrap_or_else(|| panic!("no marker {m:?}: {err}"))
        };
        for j in 0..n - 1 {
            assert!(
                at(&format!("NONCE hook {j}")) < at(&format!("NONCE upload {}", j + 1)),
                "{err}"
            );
        }
        let hooked = std::fs::read_to_string(d.path().join("hooked")).unwrap();
        let want: Vec<String> = (0..n).map(|j| format!("{dir}/file{j}")).collect();
        assert_eq!(hooked.lines().collect::<Vec<_>>(), want);
    }

    #[test]
    fn jump_specs_split_like_ssh_reads_them() {
        assert_eq!(
            split_jump("admin@bastion.c.example.com"),
            (Some("admin"), "bastion.c.example.com", None)
        );
        assert_eq!(split_jump("b:2222"), (None, "b", Some(2222)));
        assert_eq!(
            split_jump("u@[2001:db8::1]:2200"),
            (Some("u"), "2001:db8::1", Some(2200))
        );
        assert_eq!(split_jump("2001:db8::1"), (None, "2001:db8::1", None));
    }

    #[test]
    fn aes_is_read_from_cpuinfo_flags() {
        assert!(cpu_has_aes(
            "processor\t: 0\nflags\t\t: fpu sse2 aes avx2\n"
        ));
        assert!(cpu_has_aes("Features\t: fp asimd aes pmull sha1\n"));
        assert!(!cpu_has_aes("flags\t\t: fpu sse2 avx2 vaes_like\n"));
        assert!(!cpu_has_aes("model name\t: aes\n"));
    }

    #[test]
    fn aes_gcm_goes_first_only_when_the_user_sets_no_cipher() {
        let default = "chacha20-poly1305@openssh.com,aes128-ctr,aes128-gcm@openssh.com";
        assert_eq!(
            preferred_ciphers(Some(default), Some(default), true).as_deref(),
            Some("aes128-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr")
        );
        // The user's config chose: it wins.
        assert_eq!(
            preferred_ciphers(Some("aes256-ctr"), Some(default), true),
            None
        );
        // No AES instructions: chacha20 is the faster one there.
        assert_eq!(preferred_ciphers(Some(default), Some(default), false), None);
        // A build without it, or ssh's answer unknown.
        assert_eq!(
            preferred_ciphers(Some("aes128-ctr"), Some("aes128-ctr"), true),
            None
        );
        assert_eq!(preferred_ciphers(None, Some(default), true), None);
    }

    /// What ssh makes of `host` under the config file `config` (`ssh -G`: no network contact).
    fn ssh_g(config: &std::path::Path, host: &str) -> String {
        let out = std::process::Command::new("ssh")
            .args(["-G", "-F"])
            .arg(config)
            .arg(host)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn the_cipher_is_set_before_the_users_config_which_keeps_applying() {
        let dir = crate::test_files::tree(&[(
            "user_config",
            "Host node.c.example.com\n  HostName 198.18.9.10\n\
             Host bastion.c.example.com\n  Ciphers aes256-ctr\n",
        )]);
        let user = dir.path().join("user_config");
        let config = dir.path().join("config");
        let list = "aes128-gcm@openssh.com,chacha20-poly1305@openssh.com";
        std::fs::write(
            &config,
            connection_config_text(Some(("node.c.example.com", list)), None, Some(&user)),
        )
        .unwrap();
        let g = |host: &str| ssh_g(&config, host);
        let node = g("node.c.example.com");
        assert!(node.contains(&format!("ciphers {list}\n")), "{node}");
        assert!(node.contains("hostname 198.18.9.10"), "{node}");
        // ssh reads the same file for a ProxyJump child: the jump host keeps its own cipher.
        let jump = g("bastion.c.example.com");
        assert!(jump.contains("ciphers aes256-ctr\n"), "{jump}");
    }

    #[tokio::test]
    async fn the_jump_config_checks_the_jump_strictly_and_keeps_the_users_config() {
        let dir = crate::test_files::tree(&[(
            "user_config",
            "Host bastion.c.example.com\n  HostName 198.18.9.9\n",
        )]);
        let user = dir.path().join("user_config");
        let known = dir.path().join("known");
        let config = dir.path().join("config");
        std::fs::write(
            &config,
            connection_config_text(None, Some(("bastion.c.example.com", &known)), Some(&user)),
        )
        .unwrap();
        let g = |host: &str| ssh_g(&config, host);
        let jump = g("bastion.c.example.com");
        assert!(jump.contains("hostname 198.18.9.9"), "{jump}");
        assert!(jump.contains("stricthostkeychecking true"), "{jump}");
        assert!(
            jump.contains(&format!("userknownhostsfile {}", known.display())),
            "{jump}"
        );
        // Other hosts are left to the user's config.
        let other = g("node.c.example.com");
        assert!(
            !other.contains(&format!("userknownhostsfile {}", known.display())),
            "{other}"
        );
    }
}
