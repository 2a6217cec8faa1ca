//! Issue 18's air-gapped sites on real hosts (docs/testing.md): what the sshd-host tests prove
//! with a `ctr` stand-in (tests/it/bundle.rs), here with the archive's real containerd 2.2,
//! kubeadm and kubelet.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::support::mirror::Mirror;
use crate::support::realcluster::{CP1_WORKER1_STATIC_PODS, RealCluster, present};
use crate::support::realhosts::{RealHost, RealLab};
use crate::support::realk8s::{self, Binaries};
use crate::support::registry::{Registry, flip_byte, member_offset, split_reference};

/// The images kubeadm v1.36.2 and the local API proxy need, built from the archive
/// (docker-archives), pushed to `registry` under their upstream repository and tag; the
/// upstream registries they name.
fn push_images(registry: &Registry) -> BTreeSet<String> {
    let bins = Binaries::get();
    let mut images = realk8s::images(
        bins,
        &bins.bin,
        &format!("v{}", realk8s::KUBERNETES_VERSION),
    );
    images.push(realk8s::image(
        bins,
        &bins.bin,
        "",
        realk8s::ImageKind::Haproxy,
    ));
    let mut upstreams = BTreeSet::new();
    for i in &images {
        let (reg, repo_tag) = split_reference(&i.reference);
        upstreams.insert(reg.to_string());
        registry.push(&i.path.display().to_string(), repo_tag);
    }
    upstreams
}

/// The image references real containerd holds in the kubelet's namespace on `h`.
fn containerd_images(h: &RealHost) -> BTreeSet<String> {
    h.exec("ctr -n k8s.io images ls -q")
        .unwrap_or_else(|e| panic!("ctr on {}: {e}", h.name))
        .lines()
        .map(str::to_string)
        .collect()
}

/// Whether `h` gets an HTTP answer from `addr` (HOST:PORT).
fn reaches(h: &RealHost, addr: &str) -> bool {
    h.exec(&format!(
        "curl -sS --max-time 3 -o /dev/null http://{addr}/ && echo reached || true"
    ))
    .unwrap_or_else(|e| panic!("curl on {}: {e}", h.name))
    .trim()
        == "reached"
}

/// `airgap-bundle`: a bundle made with `kprov create bundle` from the site's HTTP mirror
/// (binaries) and Debian's real `docker-registry` (images pushed with skopeo), both on the lab
/// bridge and then stopped, so the nodes' only network is the bridge and the operator's SSH.
/// A flipped byte in the bundle is refused naming the entry before any host changes; then
/// `update --yes --bundle` installs 1 control plane + 1 worker from the bundle alone: real
/// containerd holds every image of the manifest (imported from its OCI layout tar, none
/// pulled: nothing is reachable), both nodes Ready, the control plane, kube-proxy and the
/// local API proxy Running.
#[test]
fn scenario_airgap_bundle() {
    let t0 = Instant::now();
    let Some(lab) = RealLab::for_cluster(&["cp1", "worker1"]) else {
        return;
    };
    let bins = Binaries::get();
    // The site's mirror and registry, where the nodes could reach them while they run.
    let gateway = IpAddr::V4(lab.gateway);
    let mirror = Mirror::of_local_files(gateway, &realk8s::Assets::get(bins).files);
    let registry = Registry::start(gateway);
    let upstreams = push_images(&registry);
    let files = mirror.asset_files();
    let name = "airgap.real.example";
    let c = RealCluster::create(
        &lab,
        name,
        &[("cp1", &["control-plane"]), ("worker1", &["node"])],
        |c| {
            let a = c.spec.assets.as_mut().expect("spec.assets");
            // Binaries from the mirror, images from the registry: no archive of the tier's.
            a.files = files.clone();
            a.images.clear();
        },
    );
    let cp1 = lab.host("cp1");
    assert!(
        reaches(cp1, &registry.addr),
        "the registry is not on the lab bridge"
    );

    let bundle = lab.dir().join("site.bundle.tar");
    let b = bundle.to_str().expect("utf-8").to_string();
    let mut args = vec![
        "create".to_string(),
        "bundle".into(),
        name.into(),
        "-o".into(),
        b.clone(),
    ];
    for reg in &upstreams {
        args.push("--registry-mirror".into());
        args.push(format!("{reg}=http://{}", registry.addr));
    }
    let t = Instant::now();
    c.kprov_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let size = std::fs::metadata(&bundle).expect("bundle").len();
    eprintln!(
        "create bundle: {:?}, {} MiB, {} mirror downloads",
        t.elapsed(),
        size >> 20,
        mirror.downloads().len()
    );
    let manifest = kprov::bundle::Bundle::open(&bundle)
        .expect("the bundle checks out")
        .manifest;
    // Every binary the cluster needs (no etcd: it is stacked) came from the mirror.
    let served: BTreeSet<String> = mirror.downloads().into_iter().collect();
    let binaries: BTreeSet<String> = manifest
        .entries
        .iter()
        .filter(|e| e.kind == kprov::bundle::EntryKind::Binary)
        .map(|e| format!("/{}", e.name))
        .collect();
    assert_eq!(served, binaries, "the mirror's downloads");
    let in_bundle: BTreeSet<String> = manifest
        .entries
        .iter()
        .filter(|e| e.kind == kprov::bundle::EntryKind::Image)
        .map(|e| e.name.clone())
        .collect();

    // The site goes dark: nothing answers on the bridge but the nodes' own sshd.
    let registry_addr = registry.addr.clone();
    registry.stop();
    let mirror_addr = mirror.url.trim_start_matches("http://").to_string();
    drop(mirror);
    for h in lab.hosts() {
        for addr in [&registry_addr, &mirror_addr] {
            assert!(!reaches(h, addr), "{} still reaches {addr}", h.name);
        }
    }

    // A flipped byte: refused naming the entry, no host touched.
    let member = "binaries/amd64/kubelet";
    let at = member_offset(&bundle, member) + 4096;
    flip_byte(&bundle, at);
    let o = c.kprov(&[
        "update",
        "cluster",
        name,
        "--bundle",
        &b,
        "--yes",
        "--accept-new-host-keys",
    ]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!("entry {member}: checksum mismatch")),
        "{said}"
    );
    for h in lab.hosts() {
        assert_eq!(
            present(h),
            Vec::<&str>::new(),
            "{} after a refused bundle",
            h.name
        );
    }
    flip_byte(&bundle, at);

    let took = c.update_yes_with(&["--bundle", &b]);
    eprintln!("update --yes --bundle: {took:?}");
    c.wait_nodes_ready(&["cp1", "worker1"], Duration::from_secs(300));
    // The control plane gets every image of the bundle; the worker all but the control
    // plane's own (kube-apiserver, -controller-manager, -scheduler, etcd), which it never runs.
    for h in lab.hosts() {
        let have = containerd_images(h);
        let worker = h.name == "worker1";
        let wanted: BTreeSet<&String> = in_bundle
            .iter()
            .filter(|r| !worker || !crate::support::control_plane_only(r))
            .collect();
        let missing: Vec<&&String> = wanted.iter().filter(|r| !have.contains(**r)).collect();
        assert!(
            missing.is_empty(),
            "{}: real containerd lacks {missing:?}; has {have:?}",
            h.name
        );
        if worker {
            let extra: Vec<&String> = have
                .iter()
                .filter(|r| crate::support::control_plane_only(r))
                .collect();
            assert!(
                extra.is_empty(),
                "the worker got the control plane's images {extra:?}"
            );
        }
    }
    c.wait_kube_system(
        "control plane, kube-proxy and the API proxy Running",
        Duration::from_secs(180),
        &CP1_WORKER1_STATIC_PODS,
        2,
    );
    eprintln!("airgap-bundle: {:?} in all", t0.elapsed());

    if c.kept() {
        return;
    }
    lab.teardown_clean();
}

/// `kprov ARGS` with `stdin` as standard input; its stdout and stderr.
fn kprov_with_stdin(lab: &RealLab, args: &[&str], stdin: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = crate::support::realcluster::kprov_command(lab, args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs kprov");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("password to kprov");
    child.wait_with_output().expect("kprov output")
}

/// `airgap-registry`: Debian's `docker-registry` on the lab bridge with TLS (a CA the test
/// makes) and basic auth, every image pushed with skopeo; no image archive in the spec, so the
/// nodes' real containerd pulls every image through kprov's `hosts.toml` (a mirror for
/// registry.k8s.io and the API proxy's registry, no fallback upstream, the CA uploaded) with
/// the credentials of `kprov create registry-credentials`. A wrong password first: `update
/// --yes` fails naming the registry, and neither the password nor its base64 appears in
/// anything kprov printed; with the right one the cluster comes up. (Real containerd says
/// "no basic auth credentials" for a rejected Authorization header, and kubeadm names the
/// image, so the registry named is the upstream `registry.k8s.io`, not the mirror's host.)
#[test]
fn scenario_airgap_registry() {
    use base64::Engine as _;
    let t0 = Instant::now();
    let Some(lab) = RealLab::for_cluster(&["cp1", "worker1"]) else {
        return;
    };
    let (user, password) = ("puller", "s3cret-Registry-pw");
    let registry = Registry::start_secure(IpAddr::V4(lab.gateway), user, password);
    let upstreams = push_images(&registry);
    let (ca, _, _) = registry.secure.clone().expect("a secure registry");
    let endpoint = format!("https://{}", registry.addr);
    let name = "registry.real.example";
    let c = RealCluster::create(
        &lab,
        name,
        &[("cp1", &["control-plane"]), ("worker1", &["node"])],
        |c| {
            c.spec.assets.as_mut().expect("spec.assets").images.clear();
            c.spec
                .containerd
                .get_or_insert_with(Default::default)
                .registries = upstreams
                .iter()
                .map(|u| kprov::spec::Registry {
                    name: u.clone(),
                    fallback: Some(false),
                    mirrors: vec![kprov::spec::RegistryMirror {
                        endpoint: endpoint.clone(),
                        ca_file: Some(ca.display().to_string()),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect();
        },
    );
    let creds = |pw: &str| {
        let o = kprov_with_stdin(
            &lab,
            &[
                "create",
                "registry-credentials",
                name,
                "--host",
                &registry.addr,
                "--username",
                user,
            ],
            &format!("{pw}\n"),
        );
        assert!(
            o.status.success(),
            "create registry-credentials: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };

    // A wrong password: the install fails naming the registry, and says no password.
    let wrong = "not-the-Password-42";
    creds(wrong);
    let o = c.kprov(&["update", "cluster", name, "--yes", "--accept-new-host-keys"]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_ne!(o.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&registry.addr) || said.contains("registry.k8s.io"),
        "the failure names no registry:\n{said}"
    );
    let b64 = base64::engine::general_purpose::STANDARD;
    for secret in [
        wrong.to_string(),
        password.to_string(),
        b64.encode(format!("{user}:{wrong}")),
        b64.encode(wrong),
    ] {
        assert!(!said.contains(&secret), "kprov printed {secret:?}:\n{said}");
    }
    eprintln!(
        "wrong password refused in {:?}; kprov said (last lines):\n{}",
        t0.elapsed(),
        said.lines().rev().take(6).collect::<Vec<_>>().join("\n")
    );

    creds(password);
    let took = c.update_yes();
    eprintln!("update --yes through the registry: {took:?}");
    c.wait_nodes_ready(&["cp1", "worker1"], Duration::from_secs(300));
    c.wait_kube_system(
        "the control plane and the API proxy Running",
        Duration::from_secs(180),
        &["kube-apiserver-cp1", "kprov-api-proxy-worker1"],
        2,
    );
    // Pulled by then: the worker's kube-proxy and API proxy images too.
    for h in lab.hosts() {
        let toml = String::from_utf8_lossy(
            &h.read_file("/etc/containerd/certs.d/registry.k8s.io/hosts.toml")
                .expect("hosts.toml"),
        )
        .into_owned();
        assert!(toml.contains(&endpoint), "{}: {toml}", h.name);
        let have = containerd_images(h);
        assert!(
            have.iter()
                .any(|i| i.starts_with("registry.k8s.io/kube-proxy:")),
            "{}: {have:?}",
            h.name
        );
    }
    eprintln!("airgap-registry: {:?} in all", t0.elapsed());
    if c.kept() {
        return;
    }
    drop(registry);
    lab.teardown_clean();
}

/// Debian's tinyproxy in the foreground on `listen`:PORT, logging every request to
/// `dir/tinyproxy.log`; stopped by PID when dropped.
struct TinyProxy {
    child: std::process::Child,
    addr: String,
    log: std::path::PathBuf,
}

impl TinyProxy {
    fn start(dir: &std::path::Path, listen: std::net::Ipv4Addr, allow: &str) -> TinyProxy {
        let port = std::net::TcpListener::bind((listen, 0))
            .expect("free port")
            .local_addr()
            .expect("addr")
            .port();
        let log = dir.join("tinyproxy.log");
        let conf = dir.join("tinyproxy.conf");
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen {listen}\nTimeout 120\nLogFile \"{}\"\nLogLevel Info\n\
                 MaxClients 100\nAllow {allow}\n",
                log.display()
            ),
        )
        .expect("tinyproxy.conf");
        let child = std::process::Command::new("tinyproxy")
            .arg("-d")
            .arg("-c")
            .arg(&conf)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("tinyproxy (scripts/install-test-deps installs it)");
        let p = TinyProxy {
            child,
            addr: format!("{listen}:{port}"),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&p.addr).is_err() {
            assert!(Instant::now() < deadline, "tinyproxy did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    /// The requests it forwarded (`GET http://... HTTP/1.1`, `CONNECT host:port ...`).
    fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once("Request (file descriptor ").map(|(_, r)| r))
            .filter_map(|r| r.split_once("): ").map(|(_, r)| r.to_string()))
            .collect()
    }
}

impl Drop for TinyProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `airgap-proxy`: the site's HTTP mirror (binaries) and plain-HTTP registry (images) sit on an
/// address of the lab's block that the nodes' own routing refuses (a `prohibit` route on each
/// node); Debian's tinyproxy on the lab bridge is their only way there, given as
/// `spec.proxy`. kprov's downloads on the nodes (curl) and containerd's pulls (its drop-in)
/// go through it: its log shows every binary and the registry's `/v2/` requests; the
/// no-proxy list keeps the API endpoint and the node addresses off it; the cluster comes up.
#[test]
fn scenario_airgap_proxy() {
    let t0 = Instant::now();
    let Some(lab) = RealLab::for_cluster(&["cp1", "worker1"]) else {
        return;
    };
    // The site: an address of the lab's block, on the lab bridge (gone with it), that no node
    // may reach but through the proxy.
    let site = lab
        .block
        .subnets(24)
        .expect("/24s")
        .nth(2)
        .expect("a free /24")
        .hosts()
        .next()
        .expect("site address");
    crate::support::testhosts::sh(&[
        "ip",
        "addr",
        "add",
        &format!("{site}/32"),
        "dev",
        lab.bridge(),
    ])
    .expect("site address");
    for h in lab.hosts() {
        h.exec(&format!("ip route add prohibit {site}/32"))
            .unwrap_or_else(|e| panic!("{}: {e}", h.name));
    }
    let bins = Binaries::get();
    let mirror = Mirror::of_local_files(IpAddr::V4(site), &realk8s::Assets::get(bins).files);
    let registry = Registry::start(IpAddr::V4(site));
    let upstreams = push_images(&registry);
    let proxy = TinyProxy::start(lab.dir(), lab.gateway, &lab.hosts_net.to_string());
    for h in lab.hosts() {
        assert!(
            !reaches(h, &registry.addr),
            "{} reaches the site directly",
            h.name
        );
    }
    let files = mirror.asset_files();
    let proxy_url = format!("http://{}", proxy.addr);
    let registry_url = format!("http://{}", registry.addr);
    let name = "proxy.real.example";
    let c = RealCluster::create(
        &lab,
        name,
        &[("cp1", &["control-plane"]), ("worker1", &["node"])],
        |c| {
            let a = c.spec.assets.as_mut().expect("spec.assets");
            a.files = files.clone();
            a.images.clear();
            c.spec
                .containerd
                .get_or_insert_with(Default::default)
                .registries = upstreams
                .iter()
                .map(|u| kprov::spec::Registry {
                    name: u.clone(),
                    fallback: Some(false),
                    mirrors: vec![kprov::spec::RegistryMirror {
                        endpoint: registry_url.clone(),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect();
            c.spec.proxy = Some(kprov::spec::Proxy {
                http: Some(proxy_url.clone()),
                https: Some(proxy_url.clone()),
                no_proxy: Vec::new(),
            });
        },
    );
    let took = c.update_yes();
    eprintln!("update --yes through the proxy: {took:?}");
    c.wait_nodes_ready(&["cp1", "worker1"], Duration::from_secs(300));
    c.wait_kube_system(
        "the control plane, both kube-proxies and the API proxy Running",
        Duration::from_secs(180),
        &["kube-apiserver-cp1", "kprov-api-proxy-worker1"],
        2,
    );
    let requests = proxy.requests();
    for f in &files {
        // Stacked etcd: its tarball is not needed.
        if f.name == "etcd" {
            continue;
        }
        assert!(
            requests.iter().any(|r| r.contains(&f.url)),
            "the proxy forwarded no download of {}: {requests:#?}",
            f.url
        );
    }
    assert!(
        requests
            .iter()
            .any(|r| r.contains(&format!("{registry_url}/v2/"))),
        "the proxy forwarded no registry request: {requests:#?}"
    );
    // noProxy: the API endpoint and the nodes never went through it.
    for h in lab.hosts() {
        let addr = h.address.to_string();
        assert!(
            !requests.iter().any(|r| r.contains(&addr)),
            "{} ({addr}) went through the proxy: {requests:#?}",
            h.name
        );
    }
    assert!(
        !requests.iter().any(|r| r.contains("api.internal.")),
        "the API endpoint went through the proxy: {requests:#?}"
    );
    eprintln!(
        "airgap-proxy: {:?} in all, {} requests through the proxy",
        t0.elapsed(),
        requests.len()
    );
    if c.kept() {
        return;
    }
    drop((proxy, registry, mirror));
    lab.teardown_clean();
}
