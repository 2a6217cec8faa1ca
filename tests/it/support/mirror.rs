//! A local artifact mirror serving kprov's test stand-ins in the upstream download layout
//! (`<root>/dl.k8s.io/release/v1.35.1/bin/linux/amd64/kubeadm`, `<root>/github.com/...`),
//! the layout `spec.assets.mirror` expects. Checksums are computed when the mirror is built
//! and handed to the cluster spec as `assets.files` overrides.
//!
//! The server runs on its own thread and runtime (test executors may block theirs while a
//! node downloads) and stops when the `Mirror` is dropped. It binds to the address given, so
//! hosts in network namespaces can reach it on the bridge address.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::IntoResponse;
use kprov::spec::AssetFile;
use kprov::spec::assets::{self, Arch, Component};
use sha2::{Digest, Sha256};

const STANDINS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/support/standins");

/// The host tools (systemctl, timedatectl, …) test hosts need in their PATH before kprov runs.
pub fn host_standins_dir() -> PathBuf {
    PathBuf::from(STANDINS).join("host")
}

pub struct Mirror {
    pub url: String,
    root: tempfile::TempDir,
    /// Request paths served, in order (404s included).
    pub requests: Arc<Mutex<Vec<String>>>,
    /// (component, mirror URL, sha256) of every served asset.
    pub served: BTreeMap<Component, (String, String)>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Mirror {
    /// Builds the stand-ins for `kubernetes_version` and serves them on `bind`:0.
    pub fn start(bind: IpAddr, kubernetes_version: &str) -> Mirror {
        let (root, listener, url) = Mirror::place(bind);
        let mut served = BTreeMap::new();
        for component in Component::ALL {
            let version = &assets::version_of(component, kubernetes_version);
            // Stand-ins are scripts: one build serves every architecture.
            let mut sha = String::new();
            for arch in Arch::ALL {
                let upstream = assets::upstream_url(component, version, arch);
                let rel = upstream.strip_prefix("https://").expect("https upstream");
                let path = root.path().join(rel);
                std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
                build(component, version, arch, &path);
                // etcd's tarballs differ per architecture (top directory): the test hosts
                // are amd64, so that is the checksum handed to the spec.
                if arch == Arch::Amd64 {
                    sha = hex::encode(Sha256::digest(std::fs::read(&path).expect("read built")));
                }
            }
            let rel = assets::upstream_url(component, version, Arch::Amd64);
            let mirror_url = assets::mirror_url(&url, &rel);
            served.insert(component, (mirror_url, sha));
        }
        Mirror::serve(listener, url, root, served)
    }

    /// Serves `files` (`file://` URLs on this machine: the real tier's assets) on `bind`:0,
    /// each under its component name; [`Mirror::asset_files`] gives them with HTTP URLs.
    pub fn of_local_files(bind: IpAddr, files: &[AssetFile]) -> Mirror {
        let (root, listener, url) = Mirror::place(bind);
        let mut served = BTreeMap::new();
        for f in files {
            let component = Component::ALL
                .into_iter()
                .find(|c| c.name() == f.name)
                .unwrap_or_else(|| panic!("no component {}", f.name));
            let from = f.url.strip_prefix("file://").expect("a file:// URL");
            std::os::unix::fs::symlink(from, root.path().join(&f.name)).expect("mirror link");
            served.insert(component, (format!("{url}/{}", f.name), f.sha256.clone()));
        }
        Mirror::serve(listener, url, root, served)
    }

    /// The mirror's directory and its listener on `bind`:0, with the URL it answers at.
    fn place(bind: IpAddr) -> (tempfile::TempDir, std::net::TcpListener, String) {
        let root = tempfile::Builder::new()
            .prefix("kprov-mirror-")
            .tempdir()
            .expect("mirror dir");
        let listener = std::net::TcpListener::bind(SocketAddr::new(bind, 0)).expect("bind mirror");
        let url = url_of(&listener);
        (root, listener, url)
    }

    fn serve(
        listener: std::net::TcpListener,
        url: String,
        root: tempfile::TempDir,
        served: BTreeMap<Component, (String, String)>,
    ) -> Mirror {
        listener.set_nonblocking(true).expect("nonblocking");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let state = (PathBuf::from(root.path()), requests.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("mirror runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let app = axum::Router::new().fallback(serve).with_state(state);
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = rx.await;
                    })
                    .await
                    .expect("mirror server");
            });
        });
        Mirror {
            url,
            root,
            requests,
            served,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    /// `assets.files` overrides pointing every component at this mirror with its real sha256.
    pub fn asset_files(&self) -> Vec<AssetFile> {
        self.served
            .iter()
            .map(|(c, (url, sha))| AssetFile {
                name: c.name().to_string(),
                url: url.clone(),
                sha256: sha.clone(),
            })
            .collect()
    }

    /// The same overrides as `file://` URLs into the mirror's directory: what an air-gapped
    /// site uses (kprov uploads the files over ssh instead of nodes downloading them).
    pub fn local_asset_files(&self) -> Vec<AssetFile> {
        self.asset_files()
            .into_iter()
            .map(|mut f| {
                let rel = f
                    .url
                    .strip_prefix(&format!("{}/", self.url))
                    .expect("mirror url");
                f.url = format!("file://{}", self.root.path().join(rel).display());
                f
            })
            .collect()
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Downloads served so far (paths of 200 responses).
    pub fn downloads(&self) -> Vec<String> {
        self.requests.lock().expect("requests").clone()
    }
}

/// `http://ADDR` of a bound listener.
fn url_of(listener: &std::net::TcpListener) -> String {
    let addr = listener.local_addr().expect("addr");
    match addr.ip() {
        IpAddr::V4(_) => format!("http://{addr}"),
        IpAddr::V6(ip) => format!("http://[{ip}]:{}", addr.port()),
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(
    State((root, requests)): State<(PathBuf, Arc<Mutex<Vec<String>>>)>,
    uri: Uri,
) -> impl IntoResponse {
    let rel = uri.path().trim_start_matches('/');
    if rel.split('/').any(|p| p == ".." || p.is_empty()) {
        return (StatusCode::BAD_REQUEST, Vec::new());
    }
    match tokio::fs::read(root.join(rel)).await {
        Ok(bytes) => {
            requests
                .lock()
                .expect("requests")
                .push(uri.path().to_string());
            (StatusCode::OK, bytes)
        }
        Err(_) => (StatusCode::NOT_FOUND, Vec::new()),
    }
}

fn standin(tool: &str, version: &str) -> String {
    let template = match tool {
        "kubeadm" => "kubeadm",
        "etcd" | "etcdctl" | "etcdutl" => "etcd",
        // Plays etcdctl inside a running etcd container (etcd member removal).
        "crictl" => "crictl",
        // Checks and records image imports (`spec.assets.images`).
        "ctr" => "ctr",
        _ => "simple",
    };
    // etcdctl's member commands are one shell file shared by the two stand-ins that play it.
    let members = std::fs::read_to_string(Path::new(STANDINS).join("etcd-members.sh"))
        .expect("etcd-members.sh");
    std::fs::read_to_string(Path::new(STANDINS).join(template))
        .expect("stand-in template")
        .replace("@ETCD_MEMBERS_SH@", &members)
        .replace("@TOOL@", tool)
        .replace("@VERSION@", version)
}

fn write_exec(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write stand-in");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// Builds one component at `path`: a script, or a tarball laid out like upstream's.
fn build(component: Component, version: &str, arch: Arch, path: &Path) {
    let etcd: Vec<String> = ["etcd", "etcdctl", "etcdutl"]
        .iter()
        .map(|b| format!("{}/{b}", assets::etcd_dir(version, arch)))
        .collect();
    let etcd: Vec<&str> = etcd.iter().map(String::as_str).collect();
    let tarball_members: &[&str] = match component {
        Component::Kubeadm | Component::Kubelet | Component::Kubectl | Component::Runc => {
            write_exec(path, &standin(component.name(), version));
            return;
        }
        Component::Containerd => &["bin/containerd", "bin/containerd-shim-runc-v2", "bin/ctr"],
        Component::CniPlugins => &["./bridge", "./host-local", "./loopback", "./portmap"],
        Component::Crictl => &["crictl"],
        Component::Etcd => &etcd,
    };
    let staging = tempfile::tempdir().expect("staging");
    for m in tarball_members {
        let p = staging.path().join(m);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        let tool = Path::new(m)
            .file_name()
            .expect("name")
            .to_string_lossy()
            .to_string();
        write_exec(&p, &standin(&tool, version));
    }
    // Fixed mtime and owner so the tarball (and its checksum) do not depend on the machine.
    let status = Command::new("tar")
        .args([
            "--mtime=2025-01-01",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--sort=name",
        ])
        .args(["--use-compress-program=gzip -n", "-cf"])
        .arg(path)
        .arg("-C")
        .arg(staging.path())
        .args(tarball_members)
        .status()
        .expect("tar");
    assert!(status.success(), "tar failed for {path:?}");
}
