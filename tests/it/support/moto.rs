//! One `moto_server` per test binary on a free loopback port, stopped by PID when the
//! binary exits. moto holds one global state, so tests sharing it use unique names.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::faultproxy::{AsItIs, FaultProxy};

pub struct Moto {
    /// What clients use: moto behind the fault proxy's as-it-is policy (AWS's propagation
    /// windows, launch delays, limits and regions), unless `KPROV_LAB_AS_IT_IS=0`; then moto
    /// itself. The serial moto has a proxy of its own (the S3 store tests meet the policy too).
    pub endpoint: String,
    /// moto itself, instantly consistent (for harness reads that must see the truth).
    pub direct: String,
    /// The as-it-is policy in front of moto, when on.
    pub as_it_is: Option<AsItIs>,
    pub log: PathBuf,
    child: Mutex<Option<Child>>,
    _proxy: Option<FaultProxy>,
}

static MOTO: OnceLock<Moto> = OnceLock::new();
static MOTO_SERIAL: OnceLock<Moto> = OnceLock::new();

/// Where `scripts/install-test-deps` puts moto; falls back to whatever is on PATH.
pub fn moto_binary() -> PathBuf {
    if let Ok(p) = std::env::var("KPROV_MOTO_SERVER") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/moto_server");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("moto_server")
    }
}

/// The launcher every test starts moto through: moto's own server with the emulator bugs the
/// tests must get past patched in memory (see the script's docstring; docs/aws.md "moto
/// notes"). The installed package stays as pip left it.
pub fn launcher() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/support/moto_server.py")
}

/// The program and leading arguments that start moto; `moto_server`'s own arguments follow
/// (`-H HOST -p PORT`). Run through `program` so a caller can wrap it (`ip netns exec`).
pub fn server_command(program: impl FnOnce(PathBuf) -> Command) -> Command {
    let mut c = program(moto_python(&moto_binary()));
    c.arg(launcher());
    c
}

fn free_port(host: &str) -> u16 {
    TcpListener::bind((host, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Starts moto (once per test binary) listening on `host` (127.0.0.1 unless node-side code in a
/// netns must reach it, then the bridge address).
pub fn moto() -> &'static Moto {
    MOTO.get_or_init(|| start("127.0.0.1", false))
}

/// A second moto that handles one request at a time, for tests of concurrent conditional
/// writes. moto checks `If-Match`/`If-None-Match` and then writes without a lock, on a threaded
/// server: two racing writes of one version can both succeed, which real S3 never allows
/// (observed under load: a lost update in the 16-writer race). Serialised requests give the
/// atomicity S3 guarantees; werkzeug closes every connection, so one thread does not stall
/// pooled clients.
pub fn moto_serial() -> &'static Moto {
    MOTO_SERIAL.get_or_init(|| start("127.0.0.1", true))
}

/// The interpreter moto is installed in: the venv's own python next to its `moto_server`.
fn moto_python(moto: &std::path::Path) -> PathBuf {
    moto.parent()
        .map(|dir| dir.join("python3"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("python3"))
}

fn start(host: &str, serial: bool) -> Moto {
    crate::support::tiers::require(crate::support::Tier::Moto);
    let port = free_port(host);
    let log = std::env::temp_dir().join(format!("kprov-moto-{}-{port}.log", std::process::id()));
    let logf = std::fs::File::create(&log).expect("moto log file");
    let mut cmd = server_command(Command::new);
    if serial {
        cmd.args(["--serial", host, &port.to_string()])
            .env("MOTO_PORT", port.to_string());
    } else {
        cmd.args(["-H", host, "-p", &port.to_string()]);
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(logf.try_clone().expect("log fd"))
        .stderr(logf)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start moto_server ({e}); run scripts/install-test-deps")
        });
    let endpoint = format!("http://{host}:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if std::net::TcpStream::connect((host, port)).is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "moto_server did not listen within 30 s; log: {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (proxy, as_it_is) = if AsItIs::enabled() {
        let proxy = FaultProxy::start(&endpoint);
        let a = proxy.set_as_it_is(AsItIs::lab_seed());
        (Some(proxy), Some(a))
    } else {
        (None, None)
    };
    let moto = Moto {
        endpoint: proxy
            .as_ref()
            .map_or_else(|| endpoint.clone(), |p| p.endpoint.clone()),
        direct: endpoint,
        as_it_is,
        log,
        child: Mutex::new(Some(child)),
        _proxy: proxy,
    };
    register_exit_hook();
    moto
}

impl Moto {
    /// An S3 client for this moto (path-style: moto serves no bucket subdomains).
    pub async fn s3(&self) -> aws_sdk_s3::Client {
        aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&self.sdk_config().await)
                .force_path_style(true)
                .build(),
        )
    }

    /// Creates `bucket` on this moto; the client it used.
    pub async fn create_bucket(&self, bucket: &str) -> aws_sdk_s3::Client {
        let s3 = self.s3().await;
        s3.create_bucket()
            .bucket(bucket)
            .send()
            .await
            .unwrap_or_else(|e| panic!("create bucket {bucket}: {e}"));
        s3
    }

    /// Environment that points the AWS SDK's default chain at this moto.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = sdk_env(&self.endpoint);
        env.push(("AWS_MAX_ATTEMPTS", "1".into()));
        env
    }

    /// An SDK config for this moto: dummy credentials, us-east-1, the SDK's retries with a
    /// short back-off. moto's threaded server sometimes answers a read with an empty 500 while
    /// other tests write (seen in full-suite runs: ListInstanceProfiles), which a real client
    /// retries too; unimplemented calls cost only the short back-off.
    ///
    /// This is the harness's view: moto itself, instantly consistent, so a test's own setup
    /// and checks never meet the as-it-is windows; kprov's clients use
    /// [`Moto::kprov_sdk_config`] (and the CLI [`Moto::env`]).
    pub async fn sdk_config(&self) -> aws_config::SdkConfig {
        self.config_for(&self.direct).await
    }

    /// An SDK config for kprov's own clients: through the as-it-is policy when it is on.
    pub async fn kprov_sdk_config(&self) -> aws_config::SdkConfig {
        self.config_for(&self.endpoint).await
    }

    async fn config_for(&self, endpoint: &str) -> aws_config::SdkConfig {
        super::awscloud::proxied_sdk(endpoint, 3).await
    }

    /// The tail of moto's log, for assertion messages (moto's tracebacks only appear there).
    pub fn log_tail(&self) -> String {
        let f = match std::fs::File::open(&self.log) {
            Ok(f) => f,
            Err(e) => return format!("(no moto log: {e})"),
        };
        let lines: Vec<String> = BufReader::new(f).lines().map_while(Result::ok).collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn stop(&self) {
        if let Some(mut child) = self.child.lock().ok().and_then(|mut c| c.take()) {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// Statics are never dropped; stop moto when the test process exits instead.
fn register_exit_hook() {
    unsafe extern "C" {
        fn atexit(cb: extern "C" fn()) -> i32;
    }
    extern "C" fn stop_moto() {
        for m in [MOTO.get(), MOTO_SERIAL.get()].into_iter().flatten() {
            m.stop();
        }
    }
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    // SAFETY: registering a plain extern "C" callback with libc's atexit.
    REGISTERED.call_once(|| unsafe {
        atexit(stop_moto);
    });
}

/// VPCs tagged as owned by the cluster, counted with the SDK, not with kprov's reader.
pub async fn owned_vpcs(sdk: &aws_config::SdkConfig, cluster: &str) -> usize {
    let ec2 = aws_sdk_ec2::Client::new(sdk);
    let f = aws_sdk_ec2::types::Filter::builder()
        .name(format!("tag:kubernetes.io/cluster/{cluster}"))
        .values("owned")
        .build();
    ec2.describe_vpcs()
        .filters(f)
        .send()
        .await
        .expect("describe")
        .vpcs()
        .len()
}

/// The environment that points the AWS SDK's default chain at `endpoint` (moto, or a proxy
/// before it): dummy credentials, us-east-1, no instance metadata lookups.
pub fn sdk_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint.to_string()),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_EC2_METADATA_DISABLED", "true".into()),
    ]
}
