//! A cloud lab: moto plus kprov in a network namespace whose only routes lead to the lab's
//! own bridge, with every running EC2 instance moto reports played by a real sshd test host
//! at the instance's private address, holding the host key from the instance's user-data
//! (what cloud-init would do with `ssh_keys`) and letting in the keys of its
//! `ssh_authorized_keys` as the image's login user (passwordless sudo; root cannot log in).
//!
//! Layout (see `testhosts::Network`): moto listens on the operator namespace's address,
//! where `kprov` runs (`CloudLab::kprov`, through `ip netns exec`); the artifact mirror and
//! the fake Kubernetes API listen on the router's `gateway`, which every host reaches through
//! its default route. Nothing in the lab has a route out of 198.18.0.0/15: an address moto
//! invented (public IPs, load balancer names) is unreachable, and names do not resolve except
//! those the lab writes into the hosts files.
//!
//! The API: every name a Route53 record or a load balancer answers for resolves, in the
//! operator namespace and on every host, to the gateway, where the fake API speaks TLS with
//! certificates signed by the lab's CA for whatever name the client asks for (an IP address
//! gets one naming the lab's addresses) on exactly the ports the listeners of the API load
//! balancers in moto declare, as a load balancer would: nothing answers before a listener
//! exists, on a port no listener declares, or after the listener is gone. (A client that
//! used another port than kprov's load balancer listens on once went unnoticed here because
//! the lab answered on 443 and 6443 alike.) Hosts get that CA at
//! /etc/kprov-standins/ca.{crt,key}, where the stand-in kubeadm takes it as the cluster CA:
//! the admin kubeconfig it writes then carries a CA and a client certificate that work
//! against the fake API, so `update --yes` deploys the add-ons for real.
//!
//! The test process reaches moto through a loopback proxy (`CloudLab::sdk_config`).
//! `sync()` reconciles hosts with moto once; `watch()` keeps doing so in the background while
//! kprov runs (instances appear in the middle of `update --yes`).
//!
//! The lab also plays what the stand-ins do not run (see `play_kubernetes`): kubelets
//! register their nodes in the fake API, DaemonSets and Deployments get running pods, the
//! CCM initialises nodes once its add-on is applied, kubeadm's CoreDNS runs. So `validate
//! cluster` sees a cluster only if kprov provisioned the hosts and applied the add-ons.
//!
//! Caveats: moto ignores launch-template tags and metadata options on instances; instances
//! are `running` at once, so a host appears within one sync period (200 ms) of the instance.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_smithy_types::base64;
use ipnet::Ipv4Net;
use serde_json::Value;

use crate::support::fakekube::FakeKube;
use crate::support::faultproxy::{AsItIs, FaultProxy};
use crate::support::mirror::Mirror;
use crate::support::testhosts::{HostSpec, Network, TestHost, in_netns, run};

/// The Kubernetes version the mirror serves stand-ins for.
pub const VERSION: &str = "1.35.1";
const MOTO_PORT: u16 = 5000;
/// How often `watch()` asks moto for instances.
const SYNC_PERIOD: Duration = Duration::from_millis(200);

/// What the lab read from an instance's user-data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CloudInit {
    pub host_key: Option<String>,
    pub authorized_keys: Vec<String>,
    /// `users: [{name: ...}]`: the login user cloud-init would make.
    pub user: Option<String>,
}

/// Reads what cloud-init would act on from a `#cloud-config` document.
pub fn parse_cloud_init(user_data: &str) -> Result<CloudInit, String> {
    if !user_data.starts_with("#cloud-config") {
        return Err(format!(
            "user-data is not a #cloud-config document: {:?}",
            user_data.lines().next().unwrap_or_default()
        ));
    }
    let doc: Value = serde_saphyr::from_str(user_data).map_err(|e| format!("user-data: {e}"))?;
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = CloudInit {
        host_key: doc["ssh_keys"]["ed25519_private"]
            .as_str()
            .map(str::to_string),
        authorized_keys: strings(&doc["ssh_authorized_keys"]),
        user: None,
    };
    for u in doc["users"].as_array().into_iter().flatten() {
        if let Some(name) = u["name"].as_str() {
            out.user.get_or_insert_with(|| name.to_string());
            out.authorized_keys
                .extend(strings(&u["ssh_authorized_keys"]));
        }
    }
    Ok(out)
}

/// The login user of an image family, as cloud images set it up.
pub fn login_user_for_image(name: &str) -> &'static str {
    let n = name.to_ascii_lowercase();
    if n.contains("ubuntu") {
        "ubuntu"
    } else if n.contains("debian") {
        "admin"
    } else {
        "ec2-user"
    }
}

#[derive(Default)]
struct LabState {
    /// instance ID → the host playing it.
    instances: BTreeMap<String, Arc<TestHost>>,
    /// Names that resolve in the lab, and where to: the gateway (the fake API behind every
    /// API record and load balancer), or the host playing an instance behind an SSH load
    /// balancer (the bastion's).
    names: BTreeMap<String, Ipv4Addr>,
    /// image ID → login user.
    users: BTreeMap<String, String>,
    /// Subnets already classified.
    subnets: BTreeSet<String>,
    /// instance ID → availability zone.
    zones: BTreeMap<String, String>,
    /// One etcd member list every instance's stand-in crictl and kubeadm share
    /// ([`CloudLab::share_etcd_members`]).
    etcd_members: Option<PathBuf>,
    errors: Vec<String>,
}

/// What one `sync()` changed.
#[derive(Debug, Default, Clone)]
pub struct Synced {
    pub started: Vec<String>,
    pub stopped: Vec<String>,
}

pub struct CloudLab {
    /// moto's endpoint inside the operator namespace.
    pub moto_endpoint: String,
    /// What kprov uses inside the operator namespace: moto behind the fault proxy's as-it-is
    /// policy (unless `KPROV_LAB_AS_IT_IS=0`; then moto itself).
    pub kprov_endpoint: String,
    /// The as-it-is policy in front of moto for kprov, when on.
    pub as_it_is: Option<AsItIs>,
    as_it_is_proxy: Option<FaultProxy>,
    /// moto's endpoint through the loopback proxy (what the test process uses).
    pub sdk_endpoint: String,
    /// HOME and state store of the kprov runs.
    pub home: PathBuf,
    /// How long `start()` took.
    pub started_in: Duration,
    state: Mutex<LabState>,
    sync_lock: Mutex<()>,
    watcher: Mutex<Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>>,
    moto: Mutex<Option<Child>>,
    /// The operator's ssh-agent and its socket ([`CloudLab::add_operator_key`]).
    agent: Mutex<Option<(Child, PathBuf)>>,
    proxy_stop: Arc<AtomicBool>,
    proxy_addr: SocketAddr,
    proxy: Option<std::thread::JoinHandle<()>>,
    ca_dir: PathBuf,
    /// Print a line per instance started or stopped (for `scripts/demo`).
    pub announce: AtomicBool,
    pub mirror: Mirror,
    pub fake: FakeKube,
    /// TLS in front of the fake API, for every port an API load balancer listens on.
    api_tls: tokio_rustls::TlsAcceptor,
    /// The ports the fake API answers on now (the API load balancers' listener ports), each
    /// with the task accepting on it (aborted, so the port closes, when its listener goes).
    api_ports: Mutex<BTreeMap<u16, tokio::task::JoinHandle<()>>>,
    rt: tokio::runtime::Runtime,
    /// Dropped after everything that lives in it.
    pub net: Network,
    /// Last of all: counts the lab as gone only once its hosts and network are.
    live: Live,
}

/// Labs not yet dropped. The background sync may hold the last reference when a test
/// returns, so the lab can be dropped on that thread; were that test the process's last, the
/// process would exit under it and leave its instances' sshd and namespaces behind. The exit
/// hook waits (bounded) for every lab to be gone.
static LIVE_LABS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

struct Live;

impl Live {
    fn new() -> Live {
        unsafe extern "C" {
            fn atexit(cb: extern "C" fn()) -> i32;
        }
        extern "C" fn wait_for_labs() {
            let deadline = Instant::now() + Duration::from_secs(60);
            while LIVE_LABS.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        static REGISTERED: std::sync::Once = std::sync::Once::new();
        // SAFETY: registering a plain extern "C" callback with libc's atexit.
        REGISTERED.call_once(|| unsafe {
            atexit(wait_for_labs);
        });
        LIVE_LABS.fetch_add(1, Ordering::SeqCst);
        Live
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        LIVE_LABS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Points the host's stand-in etcd member list at the lab's shared one.
fn link_etcd_members(host: &TestHost, file: &Path) -> Result<(), String> {
    host.exec(&format!(
        "mkdir -p /var/lib/kprov-standins && ln -sfn '{}' /var/lib/kprov-standins/etcd-members",
        file.display()
    ))
    .map(|_| ())
    .map_err(|e| format!("sharing the etcd member list: {e}"))
}

/// Signs a certificate for `sans` (`DNS:x`, `IP:y`) with the lab CA in `dir`; returns the
/// certificate and key as rustls wants them.
fn issue(dir: &Path, stem: &str, sans: &str) -> Result<Arc<rustls::sign::CertifiedKey>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (key, csr, crt, ext) = (
        dir.join(format!("{stem}.key")),
        dir.join(format!("{stem}.csr")),
        dir.join(format!("{stem}.crt")),
        dir.join(format!("{stem}.ext")),
    );
    std::fs::write(&ext, format!("subjectAltName={sans}\n")).map_err(|e| e.to_string())?;
    run(Command::new("openssl")
        .args(["req", "-new", "-newkey", "ec", "-pkeyopt"])
        .args([
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            "/CN=kube-apiserver",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&csr))?;
    run(Command::new("openssl")
        .args(["x509", "-req", "-days", "30", "-in"])
        .arg(&csr)
        .arg("-CA")
        .arg(dir.join("ca.crt"))
        .arg("-CAkey")
        .arg(dir.join("ca.key"))
        .arg("-CAcreateserial")
        .arg("-extfile")
        .arg(&ext)
        .arg("-out")
        .arg(&crt))?;
    let certs = CertificateDer::pem_file_iter(&crt)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", crt.display()))?;
    let key = PrivateKeyDer::from_pem_file(&key).map_err(|e| format!("{}: {e}", key.display()))?;
    let signer = rustls::crypto::aws_lc_rs::sign::any_supported_type(&key)
        .map_err(|e| format!("key for {sans}: {e}"))?;
    Ok(Arc::new(rustls::sign::CertifiedKey::new(certs, signer)))
}

/// A certificate for whatever name the client asks for (SNI), signed on first use; clients
/// that connect to an address (no SNI) get the default one naming the lab's addresses.
#[derive(Debug)]
struct AnyName {
    dir: PathBuf,
    default: Arc<rustls::sign::CertifiedKey>,
    issued: Mutex<BTreeMap<String, Arc<rustls::sign::CertifiedKey>>>,
}

impl rustls::server::ResolvesServerCert for AnyName {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let Some(name) = hello.server_name() else {
            return Some(self.default.clone());
        };
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        {
            return None;
        }
        let mut issued = self.issued.lock().ok()?;
        if let Some(k) = issued.get(name) {
            return Some(k.clone());
        }
        let k = issue(
            &self.dir,
            &format!("srv-{}", issued.len()),
            &format!("DNS:{name}"),
        )
        .ok()?;
        issued.insert(name.to_string(), k.clone());
        Some(k)
    }
}

/// Copies bytes both ways until either side closes.
fn splice(a: TcpStream, b: TcpStream) {
    let (Ok(mut a2), Ok(mut b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let t = std::thread::spawn(move || {
        let mut a = a;
        let mut b = b;
        let _ = std::io::copy(&mut a, &mut b);
        let _ = b.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut b2, &mut a2);
    let _ = a2.shutdown(std::net::Shutdown::Write);
    let _ = t.join();
}

impl CloudLab {
    /// Network, moto, mirror, fake API: everything but instances.
    pub fn start() -> CloudLab {
        crate::support::tiers::require(crate::support::Tier::CloudLab);
        let t0 = Instant::now();
        let net = Network::start();
        let home = net.dir().join("home");
        let ca_dir = net.dir().join("ca");
        std::fs::create_dir_all(&home).expect("home");
        std::fs::create_dir_all(&ca_dir).expect("ca dir");

        // moto in the operator namespace, on its bridge address.
        let log = std::fs::File::create(net.dir().join("moto.log")).expect("moto log");
        let moto = crate::support::moto::server_command(|p| net.operator_command(p))
            .args(["-H", &net.operator_address.to_string(), "-p"])
            .arg(MOTO_PORT.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("moto_server (run scripts/install-test-deps)");
        let moto_addr = SocketAddr::from((net.operator_address, MOTO_PORT));

        // kprov's way to moto: AWS as it is, on the operator's address.
        let (as_it_is_proxy, as_it_is) = if AsItIs::enabled() {
            let at = net.operator_address;
            let listener = in_netns(&net.operator_ns, || TcpListener::bind((at, 0)))
                .expect("as-it-is proxy listener");
            let ns = net.operator_ns.clone();
            let proxy = FaultProxy::start_with(
                listener,
                Arc::new(move || {
                    in_netns(&ns, || {
                        TcpStream::connect_timeout(&moto_addr, Duration::from_secs(5))
                    })
                }),
            );
            let a = proxy.set_as_it_is(AsItIs::lab_seed());
            (Some(proxy), Some(a))
        } else {
            (None, None)
        };

        // The test process's way to moto: a loopback listener that dials into the lab.
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy listener");
        let proxy_addr = listener.local_addr().expect("proxy addr");
        let proxy_stop = Arc::new(AtomicBool::new(false));
        let proxy = {
            let stop = proxy_stop.clone();
            let ns = net.operator_ns.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let ns = ns.clone();
                    std::thread::spawn(move || {
                        let dialed = in_netns(&ns, || {
                            TcpStream::connect_timeout(&moto_addr, Duration::from_secs(5))
                        });
                        if let Ok(up) = dialed {
                            splice(conn, up);
                        }
                    });
                }
            })
        };

        // The lab's CA, and the fake API behind TLS on the gateway.
        run(Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "30"])
            .args(["-subj", "/CN=kubernetes", "-keyout"])
            .arg(ca_dir.join("ca.key"))
            .arg("-out")
            .arg(ca_dir.join("ca.crt")))
        .expect("lab CA");
        let default = issue(
            &ca_dir,
            "default",
            &format!(
                "IP:{},IP:{},IP:127.0.0.1,DNS:localhost,DNS:kubernetes",
                net.gateway, net.operator_address
            ),
        )
        .expect("default API certificate");
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(AnyName {
            dir: ca_dir.clone(),
            default,
            issued: Mutex::new(BTreeMap::new()),
        }));
        // The fake speaks HTTP/1.1 only.
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("lab runtime");
        let fake = rt.block_on(FakeKube::start());
        // The API's ports open as the load balancers' listeners appear (`serve_api_ports`).
        let gw = net.gateway;
        let mirror = in_netns(&net.router_ns, || Mirror::start(gw.into(), VERSION));

        let mut lab = CloudLab {
            api_tls: acceptor,
            api_ports: Mutex::new(BTreeMap::new()),
            moto_endpoint: format!("http://{moto_addr}"),
            kprov_endpoint: as_it_is_proxy
                .as_ref()
                .map_or_else(|| format!("http://{moto_addr}"), |p| p.endpoint.clone()),
            as_it_is,
            as_it_is_proxy,
            sdk_endpoint: format!("http://{proxy_addr}"),
            home,
            started_in: Duration::ZERO,
            state: Mutex::new(LabState::default()),
            sync_lock: Mutex::new(()),
            watcher: Mutex::new(None),
            agent: Mutex::new(None),
            moto: Mutex::new(Some(moto)),
            proxy_stop,
            proxy_addr,
            proxy: Some(proxy),
            ca_dir,
            announce: AtomicBool::new(false),
            mirror,
            fake,
            rt,
            net,
            live: Live::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while in_netns(&lab.net.operator_ns, || {
            TcpStream::connect_timeout(&moto_addr, Duration::from_millis(200))
        })
        .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "moto did not listen within 30 s: {}",
                lab.moto_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        lab.started_in = t0.elapsed();
        lab
    }

    pub fn moto_log(&self) -> String {
        let text = std::fs::read_to_string(self.net.dir().join("moto.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// An SDK config for the lab's moto, usable from the test process.
    pub async fn sdk_config(&self) -> aws_config::SdkConfig {
        aws_config::defaults(aws_config::BehaviorVersion::latest())
            .endpoint_url(&self.sdk_endpoint)
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_s3::config::Credentials::new(
                "testing", "testing", None, None, "moto",
            ))
            .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(1))
            .load()
            .await
    }

    /// Runs `f` on the lab's runtime (for SDK calls from a synchronous test).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// The environment kprov runs with in the operator namespace.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("PATH", std::env::var("PATH").unwrap_or_default()),
            ("HOME", self.home.display().to_string()),
            (
                "KPROV_STATE_STORE",
                format!("file://{}", self.store_dir().display()),
            ),
            ("NO_COLOR", "1".into()),
            ("AWS_DEFAULT_REGION", "us-east-1".into()),
            ("AWS_MAX_ATTEMPTS", "1".into()),
        ]
        .into_iter()
        .chain(super::moto::sdk_env(&self.kprov_endpoint))
        .chain(
            self.agent_socket()
                .map(|s| ("SSH_AUTH_SOCK", s.display().to_string())),
        )
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn agent_socket(&self) -> Option<PathBuf> {
        self.agent
            .lock()
            .ok()
            .and_then(|a| a.as_ref().map(|(_, s)| s.clone()))
    }

    /// Gives kprov's ssh the operator's private key through an ssh-agent the lab starts (and
    /// stops by PID): ssh finds default identities in the passwd entry's home, never in the
    /// `HOME` the lab sets, and an agent is what operators use anyway.
    pub fn add_operator_key(&self, key: &Path) {
        let mut agent = self.agent.lock().expect("agent");
        if agent.is_none() {
            let sock = self.home.join("agent.sock");
            let child = crate::support::spawn_silent(
                Command::new("ssh-agent").arg("-D").arg("-a").arg(&sock),
                "ssh-agent",
            );
            // The socket file appears at bind(), before the agent listens: wait for a
            // connection to be accepted, not for the file (ssh-add failed in that window
            // under load). A slow agent is a failure naming it, not a later ssh-add error.
            let until = Instant::now() + Duration::from_secs(60);
            while std::os::unix::net::UnixStream::connect(&sock).is_err() {
                assert!(
                    Instant::now() < until,
                    "ssh-agent did not listen on {} within 60 s",
                    sock.display()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            *agent = Some((child, sock));
        }
        let sock = agent
            .as_ref()
            .map(|(_, s)| s.clone())
            .expect("agent socket");
        let st = Command::new("ssh-add")
            .arg("-q")
            .arg(key)
            .env("SSH_AUTH_SOCK", &sock)
            .stdin(Stdio::null())
            .status()
            .expect("ssh-add");
        assert!(st.success(), "ssh-add {}", key.display());
    }

    /// Makes the operator's ed25519 key in the lab's `~/.ssh`, gives it to the agent
    /// ([`CloudLab::add_operator_key`]) and returns the public key's path (what
    /// `create cluster --ssh-public-key` takes).
    pub fn operator_key(&self) -> String {
        let ssh_dir = self.home.join(".ssh");
        std::fs::create_dir_all(&ssh_dir).expect("lab ~/.ssh");
        let key = ssh_dir.join("id_ed25519");
        let made = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "operator", "-f"])
            .arg(&key)
            .stdin(Stdio::null())
            .status()
            .expect("ssh-keygen");
        assert!(made.success(), "ssh-keygen {}", key.display());
        self.add_operator_key(&key);
        format!("{}.pub", key.display())
    }

    pub fn store_dir(&self) -> PathBuf {
        self.home.join("state")
    }

    /// Runs a program in the operator namespace with the lab's environment. In a mount
    /// namespace of its own, the passwd entry's home gets the lab's `home/.ssh` as its
    /// `.ssh` (over a scratch overlay of that home, so the real one is neither changed nor
    /// hidden: tools installed under it keep working): ssh reads `~/.ssh/config` and default
    /// identities from the passwd home, never from `HOME`, so a test writes the operator's
    /// ssh config in `home/.ssh/` and it applies as on an operator's machine.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = self.net.operator_command("unshare");
        c.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(
                r#"set -e
home=$(getent passwd "$(id -u)" | cut -d: -f6)
mkdir -p "$1/.ssh"
o=$(mktemp -d "$2/passwd-home.XXXXXX")
mkdir "$o/upper" "$o/work"
mount -t overlay overlay -o "lowerdir=$home,upperdir=$o/upper,workdir=$o/work" "$home"
mkdir -p "$home/.ssh"
mount --bind "$1/.ssh" "$home/.ssh"
set +e
shift 2
exec "$@""#,
            )
            .arg("sh")
            .arg(&self.home)
            .arg(self.net.dir())
            .arg(program);
        c.env_clear().envs(self.env()).stdin(Stdio::null());
        c
    }

    /// Runs the kprov binary in the operator namespace.
    pub fn kprov(&self, args: &[&str]) -> Output {
        self.kprov_command(args).output().expect("runs kprov")
    }

    /// kprov with `args` as the operator runs it, not started yet.
    pub fn kprov_command(&self, args: &[&str]) -> Command {
        let mut c = self.command(assert_cmd::cargo::cargo_bin("kprov"));
        c.args(args);
        c
    }

    /// kprov started in the background; its output captured (for `wait_with_output`) when
    /// `capture`, else dropped.
    pub fn spawn_kprov(&self, args: &[&str], capture: bool) -> Child {
        let out = || {
            if capture {
                Stdio::piped()
            } else {
                Stdio::null()
            }
        };
        self.kprov_command(args)
            .stdout(out())
            .stderr(out())
            .spawn()
            .expect("kprov starts")
    }

    /// Hosts playing instances, by instance ID.
    pub fn instances(&self) -> BTreeMap<String, Arc<TestHost>> {
        self.state.lock().expect("lab state").instances.clone()
    }

    /// From now on every instance (running or started later) plays one stacked etcd cluster
    /// whose member list is the lab file `lines` starts (the stand-ins' members mode, see
    /// `standins/crictl`): a control plane that joins adds its member, `etcdctl member remove`
    /// through any member removes it for all. Returns the file.
    pub fn share_etcd_members(&self, lines: &str) -> PathBuf {
        let file = self.home.join("etcd-members");
        std::fs::write(&file, lines).expect("etcd members file");
        self.state.lock().expect("lab state").etcd_members = Some(file.clone());
        for (id, h) in self.instances() {
            link_etcd_members(&h, &file).unwrap_or_else(|e| panic!("{id}: {e}"));
        }
        file
    }

    /// The names the lab resolves, with their addresses.
    pub fn names(&self) -> BTreeMap<String, Ipv4Addr> {
        self.state.lock().expect("lab state").names.clone()
    }

    /// Errors the background sync met (a test asserts there were none).
    pub fn sync_errors(&self) -> Vec<String> {
        self.state.lock().expect("lab state").errors.clone()
    }

    /// Reconciles hosts with moto once; panics on an error (with moto's log).
    pub fn sync(&self) -> Synced {
        self.try_sync()
            .unwrap_or_else(|e| panic!("cloud lab sync: {e}\nmoto:\n{}", self.moto_log()))
    }

    /// Keeps syncing in the background (every 200 ms) until `unwatch()` or drop.
    pub fn watch(self: &Arc<Self>) {
        let mut w = self.watcher.lock().expect("watcher");
        if w.is_some() {
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let lab = Arc::downgrade(self);
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                let Some(lab) = lab.upgrade() else { return };
                if let Err(e) = lab.try_sync() {
                    lab.state.lock().expect("lab state").errors.push(e);
                }
                drop(lab);
                std::thread::sleep(SYNC_PERIOD);
            }
        });
        *w = Some((stop, handle));
    }

    pub fn unwatch(&self) {
        let w = self.watcher.lock().map(|mut w| w.take()).unwrap_or(None);
        if let Some((stop, handle)) = w {
            stop.store(true, Ordering::SeqCst);
            // The watcher may hold the last reference for a moment, so the lab can be dropped
            // on the watcher's own thread: joining itself would panic out of `Drop` and leave
            // the ssh-agent and moto running.
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }

    pub fn try_sync(&self) -> Result<Synced, String> {
        let _one = self.sync_lock.lock().map_err(|e| e.to_string())?;
        let sdk = self.rt.block_on(self.sdk_config());
        let ec2 = aws_sdk_ec2::Client::new(&sdk);
        let mut out = Synced::default();

        let mut instances = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .rt
                .block_on(ec2.describe_instances().set_next_token(token).send())
                .map_err(|e| format!("DescribeInstances: {e:?}"))?;
            for r in page.reservations() {
                instances.extend(r.instances().iter().cloned());
            }
            token = page.next_token().map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        use aws_sdk_ec2::types::InstanceStateName as S;
        let mut to_start = Vec::new();
        for i in &instances {
            let Some(id) = i.instance_id() else { continue };
            let state = i.state().and_then(|s| s.name()).cloned();
            let live = matches!(state, Some(S::Pending) | Some(S::Running));
            let known = self
                .state
                .lock()
                .expect("lab state")
                .instances
                .get(id)
                .cloned();
            match (live, known) {
                (false, Some(host)) => {
                    self.net
                        .stop_host(host.address.parse().map_err(|e| format!("{e}"))?);
                    self.state.lock().expect("lab state").instances.remove(id);
                    if self.announce.load(Ordering::SeqCst) {
                        eprintln!("[lab] {id} terminated: test host {} stopped", host.address);
                    }
                    out.stopped.push(id.to_string());
                }
                (true, None) => to_start.push(i),
                _ => {}
            }
        }
        // A host takes most of a second to set up (namespaces, sshd, login user): start
        // the new ones side by side.
        let started: Vec<Result<String, String>> = std::thread::scope(|s| {
            let ec2 = &ec2;
            let handles: Vec<_> = to_start
                .iter()
                .map(|i| {
                    s.spawn(move || {
                        self.start_instance(ec2, i)?;
                        let id = i.instance_id().unwrap_or_default().to_string();
                        if self.announce.load(Ordering::SeqCst) {
                            eprintln!(
                                "[lab] {id} running: played by an sshd test host at {}",
                                i.private_ip_address().unwrap_or_default()
                            );
                        }
                        Ok(id)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("starting a host panicked".into()))
                })
                .collect()
        });
        for r in started {
            out.started.push(r?);
        }
        self.sync_names(&sdk)?;
        self.play_kubernetes();
        Ok(out)
    }

    /// Plays the parts of Kubernetes the stand-ins do not run, in the fake API: each kubelet
    /// kubeadm set up registers its node (Ready, with the uninitialized taint until the
    /// cloud-controller-manager add-on is applied, as the CCM would then remove it), each
    /// DaemonSet runs a ready pod on every node, each Deployment its replicas, and CoreDNS
    /// runs once a control plane is initialised (kubeadm deploys it).
    fn play_kubernetes(&self) {
        use crate::support::fakekube::{node, owned_by, pod};
        let zones = self.state.lock().expect("lab state").zones.clone();
        let ccm = self
            .fake
            .list("DaemonSet")
            .iter()
            .chain(self.fake.list("Deployment").iter())
            .any(|w| {
                w["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("cloud-controller-manager"))
            });
        let mut nodes = Vec::new();
        let mut cps = Vec::new();
        let mut initialised = None;
        for (id, h) in self.instances() {
            let Some(kubelet) = h.read_upper("/etc/kubernetes/kubelet.conf") else {
                continue;
            };
            let kubelet = String::from_utf8_lossy(&kubelet).into_owned();
            let name = kubelet
                .split("system:node:")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .filter(|n| !n.is_empty())
                .unwrap_or(&h.name)
                .to_string();
            let cp = h
                .read_upper("/etc/kubernetes/manifests/kube-apiserver.yaml")
                .is_some();
            if cp && h.read_upper("/etc/kubernetes/admin.conf").is_some() {
                initialised.get_or_insert(name.clone());
            }
            if cp {
                cps.push(name.clone());
            }
            let provider = zones.get(&id).map(|z| format!("aws:///{z}/{id}"));
            let mut want = node(&name, cp, true, !ccm, provider.as_deref());
            let have = self.fake.get("Node", None, &name);
            // The lab plays the kubelet and the CCM only: what others set on the Node (a
            // cordon, a roll's taint, labels applied through the API) stays.
            if let Some(h) = &have {
                if let Some(u) = h["spec"].get("unschedulable") {
                    want["spec"]["unschedulable"] = u.clone();
                }
                let ours = [
                    "node.cloudprovider.kubernetes.io/uninitialized",
                    "node-role.kubernetes.io/control-plane",
                ];
                let theirs = h["spec"]["taints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|t| !ours.contains(&t["key"].as_str().unwrap_or_default()))
                    .cloned();
                if let Some(t) = want["spec"]["taints"].as_array_mut() {
                    t.extend(theirs);
                }
                if let (Some(l), Some(have_labels)) = (
                    want["metadata"]["labels"].as_object_mut(),
                    h["metadata"]["labels"].as_object(),
                ) {
                    for (k, v) in have_labels {
                        l.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
            }
            if have
                .as_ref()
                .map(|n| (&n["spec"], &n["metadata"]["labels"]))
                != Some((&want["spec"], &want["metadata"]["labels"]))
            {
                self.fake.put(want);
            }
            nodes.push(name);
        }
        // One list per pass: status is only written for what the pods were made for.
        let daemonsets = self.fake.list("DaemonSet");
        let deployments = self.fake.list("Deployment");
        for ds in &daemonsets {
            let ns = ds["metadata"]["namespace"].as_str().unwrap_or("default");
            let ds_name = ds["metadata"]["name"].as_str().unwrap_or("ds");
            let labels = &ds["spec"]["template"]["metadata"]["labels"];
            for n in &nodes {
                let short = n.split('.').next().unwrap_or(n);
                let name = format!("{ds_name}-{short}");
                // Owned by its DaemonSet, as the controller makes them (a drain leaves them).
                if self.fake.get("Pod", Some(ns), &name).is_none() {
                    self.fake.put(owned_by(
                        pod(ns, &name, labels.clone(), n, "Running", true),
                        "DaemonSet",
                        ds_name,
                    ));
                }
            }
        }
        // The controllers' status: every DaemonSet and Deployment rolled out on the nodes.
        let n = nodes.len() as u64;
        for ds in &daemonsets {
            let meta = &ds["metadata"];
            let want = serde_json::json!({
                "desiredNumberScheduled": n, "currentNumberScheduled": n,
                "numberMisscheduled": 0, "numberReady": n, "updatedNumberScheduled": n,
                "numberAvailable": n, "observedGeneration": meta["generation"].as_u64().unwrap_or(1),
            });
            if ds["status"] != want {
                self.fake.set_status(
                    "DaemonSet",
                    meta["namespace"].as_str(),
                    meta["name"].as_str().unwrap_or_default(),
                    want,
                );
            }
        }
        if !nodes.is_empty() {
            for d in &deployments {
                let meta = &d["metadata"];
                let r = d["spec"]["replicas"].as_u64().unwrap_or(1);
                let want = serde_json::json!({
                    "replicas": r, "updatedReplicas": r, "readyReplicas": r,
                    "availableReplicas": r,
                    "observedGeneration": meta["generation"].as_u64().unwrap_or(1),
                });
                if d["status"] != want {
                    self.fake.set_status(
                        "Deployment",
                        meta["namespace"].as_str(),
                        meta["name"].as_str().unwrap_or_default(),
                        want,
                    );
                }
            }
        }
        // Deployments' pods (ReplicaSet-owned, as the controllers make them) are scheduled on
        // the first control plane that is not cordoned, once there is one (a worker may be
        // drained by a roll); an evicted one comes back there, off the drained node.
        let schedulable = |n: &String| {
            self.fake
                .get("Node", None, n)
                .is_some_and(|v| v["spec"]["unschedulable"] != true)
        };
        let first = initialised
            .as_ref()
            .filter(|n| schedulable(n))
            .or_else(|| cps.iter().find(|n| schedulable(n)))
            .or_else(|| nodes.iter().find(|n| schedulable(n)));
        let replica = |ns: &str, name: &str, labels: &Value, on: &str, owner: &str| {
            if self.fake.get("Pod", Some(ns), name).is_none() {
                self.fake.put(owned_by(
                    pod(ns, name, labels.clone(), on, "Running", true),
                    "ReplicaSet",
                    owner,
                ));
            }
        };
        if let Some(first) = first {
            for d in &deployments {
                let ns = d["metadata"]["namespace"].as_str().unwrap_or("default");
                let d_name = d["metadata"]["name"].as_str().unwrap_or("deploy");
                let labels = &d["spec"]["template"]["metadata"]["labels"];
                for r in 0..d["spec"]["replicas"].as_u64().unwrap_or(1) {
                    replica(
                        ns,
                        &format!("{d_name}-{r}"),
                        labels,
                        first,
                        &format!("{d_name}-rs"),
                    );
                }
            }
            if initialised.is_some() {
                replica(
                    "kube-system",
                    "coredns-0",
                    &serde_json::json!({"k8s-app": "kube-dns"}),
                    first,
                    "coredns-rs",
                );
            }
        }
    }

    fn start_instance(
        &self,
        ec2: &aws_sdk_ec2::Client,
        i: &aws_sdk_ec2::types::Instance,
    ) -> Result<(), String> {
        let id = i.instance_id().unwrap_or_default();
        let address: Ipv4Addr = i
            .private_ip_address()
            .ok_or_else(|| format!("instance {id} has no private address"))?
            .parse()
            .map_err(|e| format!("instance {id}: private address: {e}"))?;
        let subnet_id = i
            .subnet_id()
            .ok_or_else(|| format!("instance {id} has no subnet"))?;
        let subnet = self.classify_subnet(ec2, subnet_id)?;
        let attr = self
            .rt
            .block_on(
                ec2.describe_instance_attribute()
                    .instance_id(id)
                    .attribute(aws_sdk_ec2::types::InstanceAttributeName::UserData)
                    .send(),
            )
            .map_err(|e| format!("DescribeInstanceAttribute userData of {id}: {e:?}"))?;
        let user_data = attr
            .user_data()
            .and_then(|u| u.value())
            .map(|b| {
                base64::decode(b)
                    .map_err(|e| format!("user-data of {id}: {e}"))
                    .and_then(|raw| {
                        String::from_utf8(raw).map_err(|e| format!("user-data of {id}: {e}"))
                    })
            })
            .transpose()?
            .unwrap_or_default();
        let init = if user_data.is_empty() {
            CloudInit::default()
        } else {
            parse_cloud_init(&user_data).map_err(|e| format!("instance {id}: {e}"))?
        };
        let user = match &init.user {
            Some(u) => u.clone(),
            None => self.login_user(ec2, i.image_id().unwrap_or_default())?,
        };
        let name = i
            .private_dns_name()
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .unwrap_or_else(|| {
                format!("ip-{}.ec2.internal", address.to_string().replace('.', "-"))
            });
        if let Some(z) = i.placement().and_then(|p| p.availability_zone()) {
            self.state
                .lock()
                .expect("lab state")
                .zones
                .insert(id.to_string(), z.to_string());
        }
        let host = self.net.start_host(&HostSpec {
            name,
            address,
            subnet,
            host_key: init.host_key,
            authorized_keys: init.authorized_keys,
            login_user: Some(user),
        });
        let octets = address.octets();
        host.prepare_node(u32::from_be_bytes(octets));
        // The lab CA the stand-in kubeadm takes as the cluster's.
        host.exec(&format!(
            "mkdir -p /etc/kprov-standins && cp {d}/ca.crt {d}/ca.key /etc/kprov-standins/",
            d = self.ca_dir.display()
        ))
        .map_err(|e| format!("lab CA on {id}: {e}"))?;
        let shared = self.state.lock().expect("lab state").etcd_members.clone();
        if let Some(file) = shared {
            link_etcd_members(&host, &file).map_err(|e| format!("{id}: {e}"))?;
        }
        let names = self.names();
        write_hosts(&host, &names)?;
        self.state
            .lock()
            .expect("lab state")
            .instances
            .insert(id.to_string(), host);
        Ok(())
    }

    /// Adds the subnet's router address, and a route from the operator when the subnet is
    /// public (its route table, explicit or the VPC's main one, sends 0.0.0.0/0 to an
    /// internet gateway), as from an operator's machine on the internet.
    fn classify_subnet(
        &self,
        ec2: &aws_sdk_ec2::Client,
        subnet_id: &str,
    ) -> Result<Ipv4Net, String> {
        let subnets = self
            .rt
            .block_on(ec2.describe_subnets().subnet_ids(subnet_id).send())
            .map_err(|e| format!("DescribeSubnets {subnet_id}: {e:?}"))?;
        let s = subnets
            .subnets()
            .first()
            .ok_or_else(|| format!("subnet {subnet_id} not found"))?;
        let cidr: Ipv4Net = s
            .cidr_block()
            .unwrap_or_default()
            .parse()
            .map_err(|e| format!("subnet {subnet_id}: {e}"))?;
        if !self.net.vpc_cidr().contains(&cidr) {
            return Err(format!(
                "subnet {subnet_id} ({cidr}) lies outside the lab's range {}: create the VPC with lab.vpc_cidr()",
                self.net.vpc_cidr()
            ));
        }
        if self
            .state
            .lock()
            .expect("lab state")
            .subnets
            .contains(subnet_id)
        {
            return Ok(cidr);
        }
        self.net.add_subnet(cidr);
        let tables = self
            .rt
            .block_on(
                ec2.describe_route_tables()
                    .filters(
                        aws_sdk_ec2::types::Filter::builder()
                            .name("vpc-id")
                            .values(s.vpc_id().unwrap_or_default())
                            .build(),
                    )
                    .send(),
            )
            .map_err(|e| format!("DescribeRouteTables: {e:?}"))?;
        let explicit = tables.route_tables().iter().find(|t| {
            t.associations()
                .iter()
                .any(|a| a.subnet_id() == Some(subnet_id))
        });
        let main = tables
            .route_tables()
            .iter()
            .find(|t| t.associations().iter().any(|a| a.main() == Some(true)));
        let public = explicit.or(main).is_some_and(|t| {
            t.routes().iter().any(|r| {
                r.destination_cidr_block() == Some("0.0.0.0/0")
                    && r.gateway_id().is_some_and(|g| g.starts_with("igw-"))
            })
        });
        if public {
            self.net.route_from_operator(cidr);
        }
        self.state
            .lock()
            .expect("lab state")
            .subnets
            .insert(subnet_id.to_string());
        Ok(cidr)
    }

    fn login_user(&self, ec2: &aws_sdk_ec2::Client, image: &str) -> Result<String, String> {
        if let Some(u) = self.state.lock().expect("lab state").users.get(image) {
            return Ok(u.clone());
        }
        let images = self
            .rt
            .block_on(ec2.describe_images().image_ids(image).send())
            .map_err(|e| format!("DescribeImages {image}: {e:?}"))?;
        let name = images
            .images()
            .first()
            .and_then(|i| i.name())
            .ok_or_else(|| format!("image {image} not found"))?;
        let user = login_user_for_image(name).to_string();
        self.state
            .lock()
            .expect("lab state")
            .users
            .insert(image.to_string(), user.clone());
        Ok(user)
    }

    /// Where a load balancer leads: Some(gateway) unless it forwards SSH (a target group on
    /// port 22), then the address of the host playing its first registered instance (None
    /// until one runs).
    fn ssh_backend(
        &self,
        elb: &aws_sdk_elasticloadbalancingv2::Client,
        lb_arn: Option<&str>,
    ) -> Result<Option<Ipv4Addr>, String> {
        let Some(arn) = lb_arn else {
            return Ok(Some(self.net.gateway));
        };
        // A load balancer or target group deleted between two reads (a `delete cluster`
        // running while the lab syncs) leads nowhere any more.
        let tgs = match self
            .rt
            .block_on(elb.describe_target_groups().load_balancer_arn(arn).send())
        {
            Ok(t) => t,
            Err(e)
                if e.as_service_error().is_some_and(|s| {
                    s.is_load_balancer_not_found_exception()
                        || s.is_target_group_not_found_exception()
                }) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(format!("DescribeTargetGroups {arn}: {e:?}")),
        };
        let Some(tg) = tgs.target_groups().iter().find(|t| t.port() == Some(22)) else {
            return Ok(Some(self.net.gateway));
        };
        let health = match self.rt.block_on(
            elb.describe_target_health()
                .set_target_group_arn(tg.target_group_arn().map(str::to_string))
                .send(),
        ) {
            Ok(h) => h,
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_target_group_not_found_exception()) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(format!("DescribeTargetHealth: {e:?}")),
        };
        let instances = self.instances();
        Ok(health
            .target_health_descriptions()
            .iter()
            .filter_map(|d| d.target()?.id())
            .filter_map(|id| instances.get(id))
            .find_map(|h| h.address.parse().ok()))
    }

    /// The ports a load balancer's listeners declare (none once it is gone).
    fn listener_ports(
        &self,
        elb: &aws_sdk_elasticloadbalancingv2::Client,
        arn: &str,
    ) -> Result<Vec<u16>, String> {
        match self
            .rt
            .block_on(elb.describe_listeners().load_balancer_arn(arn).send())
        {
            Ok(l) => Ok(l
                .listeners()
                .iter()
                .filter_map(|l| l.port())
                .filter_map(|p| u16::try_from(p).ok())
                .collect()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_load_balancer_not_found_exception()) =>
            {
                Ok(Vec::new())
            }
            Err(e) => Err(format!("DescribeListeners {arn}: {e:?}")),
        }
    }

    /// Makes the fake API answer on exactly `ports` at the gateway: opens the new ones, closes
    /// those no listener declares any more.
    fn serve_api_ports(&self, ports: &BTreeSet<u16>) -> Result<(), String> {
        let mut open = self.api_ports.lock().map_err(|e| e.to_string())?;
        open.retain(|port, task| {
            let keep = ports.contains(port);
            if !keep {
                task.abort();
            }
            keep
        });
        for &port in ports {
            if open.contains_key(&port) {
                continue;
            }
            let gw = self.net.gateway;
            let l = in_netns(&self.net.router_ns, || TcpListener::bind((gw, port)))
                .map_err(|e| format!("API listener {gw}:{port}: {e}"))?;
            l.set_nonblocking(true).map_err(|e| e.to_string())?;
            let acceptor = self.api_tls.clone();
            let backend = self.fake.addr;
            let task = self.rt.spawn(async move {
                let Ok(l) = tokio::net::TcpListener::from_std(l) else {
                    return;
                };
                loop {
                    let Ok((s, _)) = l.accept().await else {
                        continue;
                    };
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let Ok(mut t) = acceptor.accept(s).await else {
                            return;
                        };
                        let Ok(mut b) = tokio::net::TcpStream::connect(backend).await else {
                            return;
                        };
                        let _ = tokio::io::copy_bidirectional(&mut t, &mut b).await;
                    });
                }
            });
            open.insert(port, task);
        }
        Ok(())
    }

    /// The ports the fake API answers on now (the API load balancers' listener ports).
    pub fn api_ports(&self) -> Vec<u16> {
        self.api_ports
            .lock()
            .map(|p| p.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Every name a Route53 record or a load balancer answers for resolves to the gateway
    /// (where the fake API listens), for kprov and on every host; except a load balancer
    /// that forwards SSH (the bastion's), whose names resolve to the host playing one of its
    /// registered instances, as the load balancer would forward there (no name until one
    /// runs).
    fn sync_names(&self, sdk: &aws_config::SdkConfig) -> Result<(), String> {
        let r53 = aws_sdk_route53::Client::new(sdk);
        let elb = aws_sdk_elasticloadbalancingv2::Client::new(sdk);
        let clean = |n: &str| {
            let n = n.trim_end_matches('.').to_ascii_lowercase();
            n.strip_prefix("dualstack.")
                .map(str::to_string)
                .unwrap_or(n)
        };
        // Load balancer DNS name → where it leads (None: an SSH one with no instance yet).
        let mut lb_to = BTreeMap::new();
        // The ports the API load balancers (those leading to the gateway) listen on.
        let mut api_ports = BTreeSet::new();
        let lbs = self
            .rt
            .block_on(elb.describe_load_balancers().send())
            .map_err(|e| format!("DescribeLoadBalancers: {e:?}"))?;
        for lb in lbs.load_balancers() {
            let Some(n) = lb.dns_name() else { continue };
            let to = self.ssh_backend(&elb, lb.load_balancer_arn())?;
            if to == Some(self.net.gateway)
                && let Some(arn) = lb.load_balancer_arn()
            {
                api_ports.extend(self.listener_ports(&elb, arn)?);
            }
            lb_to.insert(clean(n), to);
        }
        self.serve_api_ports(&api_ports)?;
        let mut names = BTreeMap::new();
        let zones = self
            .rt
            .block_on(r53.list_hosted_zones().send())
            .map_err(|e| format!("ListHostedZones: {e:?}"))?;
        for z in zones.hosted_zones() {
            let records = self
                .rt
                .block_on(
                    r53.list_resource_record_sets()
                        .hosted_zone_id(z.id())
                        .send(),
                )
                .map_err(|e| format!("ListResourceRecordSets {}: {e:?}", z.id()))?;
            use aws_sdk_route53::types::RrType;
            for r in records.resource_record_sets() {
                if matches!(r.r#type(), RrType::A | RrType::Aaaa | RrType::Cname) {
                    let to = match r
                        .alias_target()
                        .and_then(|a| lb_to.get(&clean(a.dns_name())))
                    {
                        Some(Some(host)) => *host,
                        Some(None) => continue,
                        None => self.net.gateway,
                    };
                    names.insert(r.name().trim_end_matches('.').to_string(), to);
                }
            }
        }
        for (n, to) in &lb_to {
            if let Some(to) = to {
                names.insert(n.clone(), *to);
            }
        }
        let changed = {
            let mut st = self.state.lock().expect("lab state");
            let changed = st.names != names;
            st.names = names.clone();
            changed
        };
        if changed {
            let mut text = String::from("127.0.0.1 localhost\n");
            for (n, to) in &names {
                text.push_str(&format!("{to} {n}\n"));
            }
            // In place (same inode): `ip netns exec` bind-mounts this file.
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(self.net.operator_hosts_file())
                .map_err(|e| format!("operator hosts file: {e}"))?;
            f.write_all(text.as_bytes())
                .map_err(|e| format!("operator hosts file: {e}"))?;
            for host in self.instances().values() {
                write_hosts(host, &names)?;
            }
        }
        Ok(())
    }
}

/// The host's /etc/hosts: itself, and the lab's names.
fn write_hosts(host: &TestHost, names: &BTreeMap<String, Ipv4Addr>) -> Result<(), String> {
    let mut text = format!("127.0.0.1 localhost\n{} {}\n", host.address, host.name);
    for (n, to) in names {
        text.push_str(&format!("{to} {n}\n"));
    }
    host.exec(&format!("cat > /etc/hosts <<'EOF'\n{text}EOF"))
        .map(|_| ())
        .map_err(|e| format!("/etc/hosts on {}: {e}", host.name))
}

impl Drop for CloudLab {
    fn drop(&mut self) {
        self.unwatch();
        if let Some((mut a, _)) = self.agent.lock().map(|mut a| a.take()).unwrap_or(None) {
            let _ = a.kill();
            let _ = a.wait();
        }
        if let Some(mut m) = self.moto.lock().map(|mut m| m.take()).unwrap_or(None) {
            let _ = m.kill();
            let _ = m.wait();
        }
        self.proxy_stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.proxy_addr, Duration::from_secs(1));
        if let Some(p) = self.proxy.take() {
            let _ = p.join();
        }
    }
}

impl CloudLab {
    /// Everything the instances' hosts wrote to their overlays and their stand-in logs.
    pub fn hosts_snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut all = BTreeMap::new();
        for h in self.instances().values() {
            all.extend(super::snapshot(&h.dir().join("upper")));
            all.extend(super::snapshot(&h.dir().join("log")));
        }
        all
    }

    /// Changes the stored objects the way an operator does: `get cluster -o yaml`, edit,
    /// `replace -f`.
    pub fn edit_objects(&self, cluster: &str, edit: impl FnOnce(&mut Vec<kprov::spec::Object>)) {
        use kprov::spec::{self, Object, ObjectRef};
        let o = self.kprov(&["get", "cluster", cluster, "-o", "yaml"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let yaml = String::from_utf8_lossy(&o.stdout).into_owned();
        let mut objects: Vec<Object> = spec::load_objects("stored", &yaml)
            .expect("stored objects parse")
            .into_iter()
            .map(|o| o.value)
            .collect();
        if !objects
            .iter()
            .any(|o| matches!(o, Object::InstanceGroup(_)))
        {
            let o = self.kprov(&["get", "instancegroups", cluster, "-o", "yaml"]);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let igs = String::from_utf8_lossy(&o.stdout).into_owned();
            objects.extend(
                spec::load_objects("stored groups", &igs)
                    .expect("stored groups parse")
                    .into_iter()
                    .map(|o| o.value),
            );
        }
        edit(&mut objects);
        let refs = objects.iter().map(|o| match o {
            Object::Cluster(c) => ObjectRef::Cluster(c),
            Object::InstanceGroup(g) => ObjectRef::InstanceGroup(g),
        });
        let path = self.home.join("edited.yaml");
        std::fs::write(&path, spec::to_yaml_stream(refs).expect("yaml")).expect("write spec");
        let o = self.kprov(&["replace", "-f", path.to_str().expect("utf-8")]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }

    /// Points the cluster's assets at the lab's mirror (what an air-gapped site does).
    pub fn use_mirror(&self, cluster: &str) {
        self.use_asset_files(cluster, self.mirror.asset_files());
    }

    /// Points the cluster's assets at `files` (another mirror's, for a version change).
    pub fn use_asset_files(&self, cluster: &str, files: Vec<kprov::spec::AssetFile>) {
        self.edit_objects(cluster, |objects| {
            for o in objects {
                if let kprov::spec::Object::Cluster(c) = o {
                    c.spec.assets = Some(kprov::spec::Assets {
                        bundle: None,
                        mirror: None,
                        images: Vec::new(),
                        files: files.clone(),
                        checksums: Vec::new(),
                    });
                }
            }
        });
    }
}
