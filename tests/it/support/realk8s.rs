//! Real Kubernetes for the real-hosts tier: the shared archive's binaries (checksummed,
//! unpacked once into a cache), kprov's `spec.assets.files` made from them and from Debian's
//! runc, CNI plugins and etcdctl, and the images kubeadm v1.36.2 wants, built at test time.
//!
//! The archive is `../shared/real-k8s/k8s-1.36.2-amd64.tar.xz` beside the checkout
//! (`KPROV_REAL_K8S_DIR` names another directory). The cache is `/var/tmp/kprov-real-cache`
//! (`KPROV_REAL_CACHE` overrides; not /tmp: real hosts mount their own), keyed by the
//! archive's sha256; every entry is built in a private directory and renamed into place, so
//! two test processes building at once both end with one complete copy.
//!
//! Stand-ins that remain, named as such everywhere: the `coredns-standin` binary tagged as
//! `registry.k8s.io/coredns/coredns:v1.14.2` is NOT CoreDNS (health and ready endpoints only,
//! SERVFAIL to every DNS query). There is no etcdutl: the etcd tarball's `etcdutl` is a
//! stand-in running Debian's etcdctl 3.4 `snapshot restore` ([`ETCDUTL_STANDIN`] says what that
//! proves and what it does not).

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use kprov::spec::AssetFile;

pub const ARCHIVE: &str = "k8s-1.36.2-amd64.tar.xz";
/// The Kubernetes version the archive's binaries report.
pub const KUBERNETES_VERSION: &str = "1.36.2";
/// Version of the cache's layout: bump when what is built from the archive changes.
const CACHE_FORMAT: &str = "v2";

/// The directory holding the shared archive and its sums.
pub fn shared_dir() -> PathBuf {
    match std::env::var_os("KPROV_REAL_K8S_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/real-k8s"),
    }
}

pub fn archive_path() -> PathBuf {
    shared_dir().join(ARCHIVE)
}

fn cache_root() -> PathBuf {
    std::env::var_os("KPROV_REAL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/kprov-real-cache"))
}

pub fn sha256_file(path: &Path) -> String {
    let mut f = fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    hex::encode(h.finalize())
}

/// `SHA256SUMS`-style lines: name -> sha256.
fn read_sums(path: &Path) -> BTreeMap<String, String> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter_map(|l| {
            let (sum, name) = l.split_once(char::is_whitespace)?;
            Some((
                name.trim().trim_start_matches('*').to_string(),
                sum.to_string(),
            ))
        })
        .collect()
}

/// Builds `dest` with `build` (given a private directory next to it) unless it exists;
/// a concurrent builder's rename wins and ours is discarded.
fn cached(dest: &Path, build: impl FnOnce(&Path)) {
    if dest.exists() {
        return;
    }
    let parent = dest.parent().expect("cache parent");
    fs::create_dir_all(parent).expect("cache dir");
    let tmp = tempfile::Builder::new()
        .prefix(".building-")
        .tempdir_in(parent)
        .expect("cache temp dir");
    build(tmp.path());
    let tmp = tmp.keep();
    if fs::rename(&tmp, dest).is_err() {
        // Someone else finished first (rename onto a non-empty directory fails).
        let _ = fs::remove_dir_all(&tmp);
        assert!(dest.exists(), "cache entry {} not made", dest.display());
    }
}

/// The archive's binaries, unpacked and verified.
pub struct Binaries {
    /// `.../bin`: kubeadm, kubelet, kubectl, kube-*, etcd, containerd*, ctr, crictl, pause,
    /// coredns-standin.
    pub bin: PathBuf,
    /// The cache directory for everything built from this archive.
    pub cache: PathBuf,
    pub archive_sha256: String,
}

impl Binaries {
    /// Once per process: checks the archive against `SHA256SUMS`, unpacks it into the cache
    /// (once per archive) and checks every binary against `SHA256SUMS.inner`.
    pub fn get() -> &'static Binaries {
        static BINARIES: OnceLock<Binaries> = OnceLock::new();
        BINARIES.get_or_init(Binaries::load)
    }

    fn load() -> Binaries {
        let archive = archive_path();
        let sums = read_sums(&shared_dir().join("SHA256SUMS"));
        let expected = sums
            .get(ARCHIVE)
            .unwrap_or_else(|| panic!("SHA256SUMS names no {ARCHIVE}"));
        let actual = sha256_file(&archive);
        assert_eq!(
            &actual,
            expected,
            "{}: sha256 differs from SHA256SUMS",
            archive.display()
        );
        let cache = cache_root().join(&actual);
        let unpacked = cache.join("k8s");
        cached(&unpacked, |tmp| {
            let mut xz = Command::new("xz")
                .args(["-dc", "-T2"])
                .arg(&archive)
                .stdout(Stdio::piped())
                .spawn()
                .expect("xz (xz-utils)");
            let mut tar = tar::Archive::new(xz.stdout.take().expect("xz stdout"));
            tar.set_preserve_permissions(true);
            tar.unpack(tmp)
                .unwrap_or_else(|e| panic!("unpacking {}: {e}", archive.display()));
            let status = xz.wait().expect("xz");
            assert!(status.success(), "xz -dc {}: {status}", archive.display());
            let inner = read_sums(&shared_dir().join("SHA256SUMS.inner"));
            let bin = tmp.join("k8s-1.36.2-amd64/bin");
            assert!(!inner.is_empty(), "SHA256SUMS.inner is empty");
            for (name, sum) in &inner {
                let got = sha256_file(&tmp.join("k8s-1.36.2-amd64").join(name));
                assert_eq!(
                    &got, sum,
                    "{ARCHIVE}: {name}: sha256 differs from SHA256SUMS.inner"
                );
            }
            assert!(bin.join("kubeadm").exists(), "{ARCHIVE} has no bin/kubeadm");
        });
        Binaries {
            bin: unpacked.join("k8s-1.36.2-amd64/bin"),
            cache,
            archive_sha256: actual,
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        let p = self.bin.join(name);
        assert!(p.exists(), "{} missing from the archive", p.display());
        p
    }
}

/// A file tree for a tarball or an image layer: path (relative, no leading `/`) to entry.
/// Written in path order with owner root and mtime 0, so the bytes are reproducible.
#[derive(Default)]
pub struct Tree {
    entries: BTreeMap<String, Entry>,
}

enum Entry {
    Dir(u32),
    File(PathBuf, u32),
    Bytes(Vec<u8>, u32),
    Symlink(String),
}

impl Tree {
    fn parents(&mut self, path: &str) {
        let mut acc = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for p in &parts[..parts.len() - 1] {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(p);
            self.entries.entry(acc.clone()).or_insert(Entry::Dir(0o755));
        }
    }

    pub fn dir(&mut self, path: &str, mode: u32) -> &mut Tree {
        self.parents(path);
        self.entries.insert(path.to_string(), Entry::Dir(mode));
        self
    }

    /// A file copied from this machine (symlinks followed), with `mode`.
    pub fn file(&mut self, path: &str, from: &Path, mode: u32) -> &mut Tree {
        assert!(from.exists(), "{} missing", from.display());
        self.parents(path);
        self.entries
            .insert(path.to_string(), Entry::File(from.to_path_buf(), mode));
        self
    }

    pub fn bytes(&mut self, path: &str, content: &[u8], mode: u32) -> &mut Tree {
        self.parents(path);
        self.entries
            .insert(path.to_string(), Entry::Bytes(content.to_vec(), mode));
        self
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Tree {
        self.parents(path);
        self.entries
            .insert(path.to_string(), Entry::Symlink(target.to_string()));
        self
    }

    /// Everything below directory `from` at `prefix` (symlinks kept as symlinks), except
    /// paths (relative to `from`) starting with one of `skip`.
    pub fn tree(&mut self, prefix: &str, from: &Path, skip: &[&str]) -> &mut Tree {
        let mut todo = vec![from.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in fs::read_dir(&d).expect("read_dir").flatten() {
                let p = e.path();
                let rel = p
                    .strip_prefix(from)
                    .expect("below")
                    .to_string_lossy()
                    .into_owned();
                if skip.iter().any(|s| rel.starts_with(s)) {
                    continue;
                }
                let at = if prefix.is_empty() {
                    rel
                } else {
                    format!("{prefix}/{rel}")
                };
                let meta = fs::symlink_metadata(&p).expect("metadata");
                let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
                if meta.file_type().is_symlink() {
                    let target = fs::read_link(&p).expect("readlink");
                    self.symlink(&at, &target.to_string_lossy());
                } else if meta.is_dir() {
                    self.dir(&at, mode);
                    todo.push(p);
                } else {
                    self.file(&at, &p, mode);
                }
            }
        }
        self
    }

    /// Writes the tree as a tar stream to `out`.
    pub fn write<W: Write>(&self, out: W) -> W {
        let mut b = tar::Builder::new(out);
        b.follow_symlinks(false);
        for (path, e) in &self.entries {
            let mut h = tar::Header::new_gnu();
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            let _ = h.set_username("root");
            let _ = h.set_groupname("root");
            match e {
                Entry::Dir(mode) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(*mode);
                    h.set_size(0);
                    b.append_data(&mut h, format!("{path}/"), std::io::empty())
                        .expect("tar dir");
                }
                Entry::File(from, mode) => {
                    let f = fs::File::open(from).expect("open");
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(*mode);
                    h.set_size(f.metadata().expect("metadata").len());
                    b.append_data(&mut h, path, f).expect("tar file");
                }
                Entry::Bytes(content, mode) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(*mode);
                    h.set_size(content.len() as u64);
                    b.append_data(&mut h, path, content.as_slice())
                        .expect("tar file");
                }
                Entry::Symlink(target) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_mode(0o777);
                    h.set_size(0);
                    b.append_link(&mut h, path, target).expect("tar symlink");
                }
            }
        }
        b.into_inner().expect("tar finish")
    }

    /// Writes the tree as a `.tar.gz` file; returns its sha256.
    pub fn write_tar_gz(&self, path: &Path) -> String {
        let f = fs::File::create(path).expect("create tarball");
        let gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
        self.write(gz).finish().expect("gzip");
        sha256_file(path)
    }
}

/// The etcd tarball's `etcdutl`: every etcd release carries one and kprov installs it, but the
/// archive has none (it was not built) and Debian 12 has none. This is a STAND-IN, named as one
/// wherever it speaks: it runs Debian's etcdctl 3.4.23 `snapshot restore` (the 3.4 restore
/// code, real code) with the arguments kprov passes to etcdutl (`snapshot restore FILE --name
/// --initial-cluster --initial-cluster-token --initial-advertise-peer-urls --data-dir`, which
/// etcdctl 3.4 takes as they are) and refuses every other command.
///
/// What it proves and what it does not (measured against the archive's etcd 3.6): 3.4's
/// restore writes the new membership into the data directory's v2 store only and leaves the
/// snapshot's member records in its v3 backend, the one etcd 3.6 reads. Where every member's
/// ID is the same after the restore as before (IDs derive from the peer URLs and the cluster
/// token for members bootstrapped together: kprov's host etcd, or a lone kubeadm member) the
/// 3.6 server starts on the restored directory and serves the snapshot's data; where a member
/// joined later (kubeadm's stacked etcd with more than one control plane: its ID was seeded
/// with the time of `member add`), etcd 3.6 panics `failed to update; member unknown`. etcd
/// 3.6's own etcdutl rewrites the v3 membership, so that failure is the stand-in's, not
/// kprov's procedure's; but the tier does not prove a restore of multi-member stacked etcd.
pub const ETCDUTL_STANDIN: &str = r#"#!/bin/sh
# STAND-IN for etcdutl (kprov real-hosts tier): no etcdutl exists in the tier. Runs Debian's
# etcdctl 3.4 `snapshot restore` with the same arguments; nothing else.
if [ "${1:-}" != snapshot ] || [ "${2:-}" != restore ]; then
  echo "etcdutl: STAND-IN of the kprov real-hosts tier: only 'snapshot restore' (through etcdctl 3.4) is available here" >&2
  exit 1
fi
shift 2
echo "etcdutl: STAND-IN of the kprov real-hosts tier: etcdctl 3.4 snapshot restore" >&2
ETCDCTL_API=3 exec "$(dirname "$(readlink -f "$0")")/etcdctl" snapshot restore "$@"
"#;

/// kprov's `spec.assets.files` for this archive: `file://` URLs into the cache with their
/// sha256 (kprov uploads them to the hosts over ssh).
pub struct Assets {
    pub files: Vec<AssetFile>,
    pub dir: PathBuf,
}

impl Assets {
    /// Builds (once per archive) and returns the assets: kubeadm, kubelet, kubectl as single
    /// binaries; runc (Debian's /usr/sbin/runc); the containerd tarball (`bin/containerd`,
    /// `bin/containerd-shim-runc-v2`, `bin/ctr`), cni-plugins (Debian's /usr/lib/cni, files at
    /// the top), crictl (`crictl` at the top), and etcd (`etcd-v<VERSION>-linux-amd64/` with
    /// the archive's etcd, Debian's etcdctl and the `etcdutl` stand-in [`ETCDUTL_STANDIN`]:
    /// etcdctl 3.4's restore under etcdutl's name).
    pub fn get(bins: &Binaries) -> Assets {
        // The etcd tarball's layout names kprov's pinned etcd version: a cache built for
        // another version must not be taken for this one.
        // `-u2`: the etcdutl stand-in's second form (etcdctl 3.4's restore, not a refusal).
        let dir = bins.cache.join(format!(
            "assets-{CACHE_FORMAT}-u2-etcd{}",
            kprov::spec::assets::ETCD_VERSION
        ));
        let etcd_dir = kprov::spec::assets::etcd_dir(
            kprov::spec::assets::ETCD_VERSION,
            kprov::spec::assets::Arch::Amd64,
        );
        cached(&dir, |tmp| {
            for b in ["kubeadm", "kubelet", "kubectl"] {
                fs::copy(bins.path(b), tmp.join(b)).expect("copy binary");
            }
            fs::copy("/usr/sbin/runc", tmp.join("runc")).expect("copy runc");
            let mut containerd = Tree::default();
            for b in ["containerd", "containerd-shim-runc-v2", "ctr"] {
                containerd.file(&format!("bin/{b}"), &bins.path(b), 0o755);
            }
            containerd.write_tar_gz(&tmp.join("containerd.tar.gz"));
            let mut cni = Tree::default();
            for e in fs::read_dir("/usr/lib/cni")
                .expect("/usr/lib/cni")
                .flatten()
            {
                cni.file(&e.file_name().to_string_lossy(), &e.path(), 0o755);
            }
            cni.write_tar_gz(&tmp.join("cni-plugins.tar.gz"));
            let mut crictl = Tree::default();
            crictl.file("crictl", &bins.path("crictl"), 0o755);
            crictl.write_tar_gz(&tmp.join("crictl.tar.gz"));
            let mut etcd = Tree::default();
            etcd.file(&format!("{etcd_dir}/etcd"), &bins.path("etcd"), 0o755)
                .file(
                    &format!("{etcd_dir}/etcdctl"),
                    Path::new("/usr/bin/etcdctl"),
                    0o755,
                )
                .bytes(
                    &format!("{etcd_dir}/etcdutl"),
                    ETCDUTL_STANDIN.as_bytes(),
                    0o755,
                );
            etcd.write_tar_gz(&tmp.join("etcd.tar.gz"));
        });
        let files = [
            ("kubeadm", "kubeadm"),
            ("kubelet", "kubelet"),
            ("kubectl", "kubectl"),
            ("runc", "runc"),
            ("containerd", "containerd.tar.gz"),
            ("cni-plugins", "cni-plugins.tar.gz"),
            ("crictl", "crictl.tar.gz"),
            ("etcd", "etcd.tar.gz"),
        ]
        .iter()
        .map(|(name, file)| {
            let path = dir.join(file);
            AssetFile {
                name: name.to_string(),
                url: format!("file://{}", path.display()),
                sha256: sha256_file(&path),
            }
        })
        .collect();
        Assets { files, dir }
    }
}

/// An image as a `docker save` archive (manifest.json, config, one layer), for
/// `ctr -n k8s.io images import` or kprov's `spec.assets.images`.
#[derive(Debug, Clone)]
pub struct Image {
    /// `registry.k8s.io/pause:3.10.2`
    pub reference: String,
    pub path: PathBuf,
    pub sha256: String,
}

/// The images kubeadm v1.36.2 wants (`kubeadm config images list`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    KubeApiserver,
    KubeControllerManager,
    KubeScheduler,
    KubeProxy,
    Etcd,
    Pause,
    /// NOT CoreDNS: the archive's `coredns-standin` (health/ready only, DNS SERVFAIL),
    /// tagged as kubeadm expects CoreDNS.
    CorednsStandin,
    /// The workers' local API proxy (kprov's static pod): Debian's haproxy (installed by
    /// scripts/install-test-deps) with its libraries, under a reference of the tier's own,
    /// handed to kprov as `spec.api.localProxyImage` (the default, docker.io's haproxy, cannot
    /// be pulled here). Not among `ALL`: kubeadm does not want it.
    Haproxy,
}

impl ImageKind {
    pub const ALL: [ImageKind; 7] = [
        ImageKind::KubeApiserver,
        ImageKind::KubeControllerManager,
        ImageKind::KubeScheduler,
        ImageKind::KubeProxy,
        ImageKind::Etcd,
        ImageKind::Pause,
        ImageKind::CorednsStandin,
    ];

    fn file_name(self) -> &'static str {
        match self {
            ImageKind::KubeApiserver => "kube-apiserver",
            ImageKind::KubeControllerManager => "kube-controller-manager",
            ImageKind::KubeScheduler => "kube-scheduler",
            ImageKind::KubeProxy => "kube-proxy",
            ImageKind::Etcd => "etcd",
            ImageKind::Pause => "pause",
            ImageKind::CorednsStandin => "coredns-standin",
            ImageKind::Haproxy => "haproxy",
        }
    }

    /// The reference kubeadm pulls for Kubernetes `tag` (`v1.36.2`).
    pub fn reference(self, tag: &str) -> String {
        match self {
            ImageKind::Etcd => "registry.k8s.io/etcd:3.6.8-0".into(),
            ImageKind::Pause => "registry.k8s.io/pause:3.10.2".into(),
            ImageKind::CorednsStandin => "registry.k8s.io/coredns/coredns:v1.14.2".into(),
            ImageKind::Haproxy => "kprov.test/haproxy:debian-bookworm".into(),
            k => format!("registry.k8s.io/{}:{tag}", k.file_name()),
        }
    }
}

/// Debian packages the kube-proxy image carries: iptables (nft backend, as the hosts), nft,
/// conntrack and their libraries.
const KUBE_PROXY_DEBS: &[&str] = &[
    "libc6",
    "iptables",
    "libxtables12",
    "libip4tc2",
    "libip6tc2",
    "libnftnl11",
    "libmnl0",
    "libnetfilter-conntrack3",
    "libnfnetlink0",
    "conntrack",
    "libnftables1",
    "nftables",
    "libjansson4",
    "libgmp10",
    "libedit2",
    "libbsd0",
    "libmd0",
    "libtinfo6",
    "libnetfilter-cttimeout1",
    "libnetfilter-cthelper0",
    "libnetfilter-queue1",
];

/// The kube-proxy packages unpacked (`apt-get download` + `dpkg-deb -x`), cached.
fn kube_proxy_root() -> PathBuf {
    let dir = cache_root().join(format!("kube-proxy-debs-{CACHE_FORMAT}"));
    cached(&dir, |tmp| {
        let debs = tmp.join("debs");
        fs::create_dir_all(&debs).expect("debs dir");
        let out = Command::new("apt-get")
            .arg("download")
            .args(KUBE_PROXY_DEBS)
            .current_dir(&debs)
            .stdin(Stdio::null())
            .output()
            .expect("apt-get");
        assert!(
            out.status.success(),
            "apt-get download {KUBE_PROXY_DEBS:?} (the kube-proxy image's iptables; run \
             `apt-get update` if the package lists are missing): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let root = tmp.join("root");
        for e in fs::read_dir(&debs).expect("debs").flatten() {
            let out = Command::new("dpkg-deb")
                .arg("-x")
                .arg(e.path())
                .arg(&root)
                .output()
                .expect("dpkg-deb");
            assert!(
                out.status.success(),
                "dpkg-deb -x {}: {}",
                e.path().display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        fs::remove_dir_all(&debs).expect("remove debs");
    });
    dir.join("root")
}

/// /etc basics every image gets (users kubeadm's static pods and the pause image run as).
fn base(t: &mut Tree) {
    t.dir("tmp", 0o1777)
        .dir("var/run", 0o755)
        .dir("usr/local/bin", 0o755)
        .bytes(
            "etc/passwd",
            b"root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
            0o644,
        )
        .bytes("etc/group", b"root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n", 0o644)
        .bytes("etc/nsswitch.conf", b"hosts: files dns\n", 0o644);
}

/// Builds (once per archive, binaries directory and tag) and returns the image `kind` for
/// Kubernetes `tag` from the binaries in `bin`. The upgrade scenario's hook: relabel a copy of
/// the binaries (../shared/real-k8s/relabel.py semantics, v1.36.2 -> v1.36.3, same code) and
/// call this with that directory and `v1.36.3`.
pub fn image(bins: &Binaries, bin: &Path, tag: &str, kind: ImageKind) -> Image {
    let reference = kind.reference(tag);
    let key = hex::encode(&Sha256::digest(format!("{}\n{tag}", bin.display()))[..8]);
    let dir = bins
        .cache
        .join(format!("images-{CACHE_FORMAT}-{key}-{}", kind.file_name()));
    let b = |name: &str| {
        let p = bin.join(name);
        assert!(p.exists(), "{} missing", p.display());
        p
    };
    cached(&dir, |tmp| {
        let mut t = Tree::default();
        let (entrypoint, cmd, user): (Option<&str>, Option<&str>, Option<&str>) = match kind {
            ImageKind::Pause => {
                t.file("pause", &b("pause"), 0o755);
                (Some("/pause"), None, Some("65535:65535"))
            }
            ImageKind::KubeApiserver
            | ImageKind::KubeControllerManager
            | ImageKind::KubeScheduler => {
                base(&mut t);
                let n = kind.file_name();
                t.file(&format!("usr/local/bin/{n}"), &b(n), 0o755);
                (None, None, None)
            }
            ImageKind::KubeProxy => {
                base(&mut t);
                t.tree(
                    "",
                    &kube_proxy_root(),
                    &[
                        "usr/share/doc",
                        "usr/share/man",
                        "usr/share/locale",
                        "usr/share/lintian",
                        "usr/share/i18n",
                        "usr/share/bash-completion",
                        "usr/lib/x86_64-linux-gnu/gconv",
                        "etc/ld.so.conf.d",
                    ],
                );
                // The hosts' iptables is nft (Debian 12's default): kube-proxy must match.
                for cmd in ["iptables", "ip6tables"] {
                    for suffix in ["", "-save", "-restore"] {
                        t.symlink(&format!("usr/sbin/{cmd}{suffix}"), "xtables-nft-multi");
                    }
                }
                t.file("usr/local/bin/kube-proxy", &b("kube-proxy"), 0o755);
                (None, None, None)
            }
            ImageKind::Etcd => {
                base(&mut t);
                // kprov runs `crictl exec <etcd> etcdctl ...`: Debian's etcdctl needs libc.
                t.file("usr/local/bin/etcd", &b("etcd"), 0o755)
                    .file(
                        "usr/local/bin/etcdctl",
                        Path::new("/usr/bin/etcdctl"),
                        0o755,
                    )
                    .file(
                        "lib64/ld-linux-x86-64.so.2",
                        Path::new("/lib64/ld-linux-x86-64.so.2"),
                        0o755,
                    )
                    .file(
                        "lib/x86_64-linux-gnu/libc.so.6",
                        Path::new("/lib/x86_64-linux-gnu/libc.so.6"),
                        0o755,
                    )
                    .dir("var/lib/etcd", 0o700);
                (None, Some("/usr/local/bin/etcd"), None)
            }
            ImageKind::CorednsStandin => {
                base(&mut t);
                t.file("coredns", &b("coredns-standin"), 0o755);
                (Some("/coredns"), None, Some("0:0"))
            }
            ImageKind::Haproxy => {
                base(&mut t);
                let haproxy = Path::new("/usr/sbin/haproxy");
                t.file("usr/sbin/haproxy", haproxy, 0o755);
                for lib in shared_libraries(haproxy) {
                    let rel = lib
                        .to_str()
                        .expect("utf-8")
                        .trim_start_matches('/')
                        .to_string();
                    t.file(&rel, &lib, 0o755);
                }
                (None, None, None)
            }
        };
        let entrypoint: Option<serde_json::Value> = match kind {
            // As the official image runs it: in the foreground, master-worker, kprov's config.
            ImageKind::Haproxy => Some(serde_json::json!([
                "/usr/sbin/haproxy",
                "-W",
                "-db",
                "-f",
                "/usr/local/etc/haproxy/haproxy.cfg"
            ])),
            _ => None,
        }
        .or_else(|| entrypoint.map(|e| serde_json::json!([e])))
        .or_else(|| match kind {
            ImageKind::KubeApiserver
            | ImageKind::KubeControllerManager
            | ImageKind::KubeScheduler
            | ImageKind::KubeProxy => Some(serde_json::json!([format!(
                "/usr/local/bin/{}",
                kind.file_name()
            )])),
            _ => None,
        });
        let layer = tmp.join("layer.tar");
        let mut hasher = HashWriter {
            inner: fs::File::create(&layer).expect("layer"),
            hash: Sha256::new(),
        };
        hasher = t.write(hasher);
        hasher.inner.flush().expect("layer");
        let diff_id = format!("sha256:{}", hex::encode(hasher.hash.finalize()));
        let mut config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {
                "Env": ["PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "WorkingDir": "/",
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": "1970-01-01T00:00:00Z",
                         "created_by": format!("kprov tests/it/support/realk8s.rs {reference}")}],
        });
        if let Some(e) = entrypoint {
            config["config"]["Entrypoint"] = e;
        }
        if let Some(c) = cmd {
            config["config"]["Cmd"] = serde_json::json!([c]);
        }
        if let Some(u) = user {
            config["config"]["User"] = serde_json::json!(u);
        }
        let config = serde_json::to_vec(&config).expect("config");
        let config_name = format!("{}.json", hex::encode(Sha256::digest(&config)));
        let manifest = serde_json::to_vec(&serde_json::json!([{
            "Config": config_name, "RepoTags": [reference], "Layers": ["layer.tar"],
        }]))
        .expect("manifest");
        let mut outer = Tree::default();
        outer
            .file("layer.tar", &layer, 0o644)
            .bytes(&config_name, &config, 0o644)
            .bytes("manifest.json", &manifest, 0o644);
        outer.write(fs::File::create(tmp.join("image.tar")).expect("image"));
        fs::remove_file(&layer).expect("remove layer");
    });
    let path = dir.join("image.tar");
    Image {
        reference,
        sha256: sha256_file(&path),
        path,
    }
}

/// The shared libraries `binary` loads, as `ldd` lists them (the loader included).
fn shared_libraries(binary: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd")
        .arg(binary)
        .stdin(Stdio::null())
        .output()
        .expect("ldd");
    assert!(out.status.success(), "ldd {}", binary.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// All seven images for `tag` from `bin`.
pub fn images(bins: &Binaries, bin: &Path, tag: &str) -> Vec<Image> {
    ImageKind::ALL
        .iter()
        .map(|k| image(bins, bin, tag, *k))
        .collect()
}

struct HashWriter {
    inner: fs::File,
    hash: Sha256,
}

impl Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The Kubernetes binaries that carry their version as a string (`-ldflags -X`).
const VERSIONED: &[&str] = &[
    "kubeadm",
    "kubelet",
    "kubectl",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
];

/// `../shared/real-k8s/relabel.py` in Rust: a copy of the archive's `bin` (once per cache)
/// where every occurrence of `v{KUBERNETES_VERSION}` in the Kubernetes binaries reads `to`
/// (same length). The SAME code under another label: what uses it proves the upgrade
/// procedure (kubeadm upgrade apply/node, static pods replaced, kubelets restarted), never a
/// change in Kubernetes. Build the images for `to` from the returned directory.
pub fn relabelled(bins: &Binaries, to: &str) -> PathBuf {
    let from = format!("v{KUBERNETES_VERSION}");
    assert_eq!(
        from.len(),
        to.len(),
        "relabel {from} -> {to}: lengths differ"
    );
    let dir = bins.cache.join(format!("relabelled-{CACHE_FORMAT}-{to}"));
    cached(&dir, |tmp| {
        for e in fs::read_dir(&bins.bin).expect("bin").flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let dest = tmp.join(&name);
            if !VERSIONED.contains(&name.as_str()) {
                fs::copy(e.path(), &dest).expect("copy binary");
                continue;
            }
            let mut data = fs::read(e.path()).expect("read binary");
            let n = replace_all(&mut data, from.as_bytes(), to.as_bytes());
            assert!(n > 0, "relabel: {name}: {from} not found");
            fs::write(&dest, &data).expect("write relabelled binary");
            let mode = fs::metadata(e.path()).expect("mode").permissions();
            fs::set_permissions(&dest, mode).expect("chmod");
        }
    });
    dir
}

/// Replaces every occurrence of `old` with `new` (same length) in place; how many.
fn replace_all(data: &mut [u8], old: &[u8], new: &[u8]) -> usize {
    let (mut i, mut n) = (0, 0);
    while i + old.len() <= data.len() {
        match data[i..].iter().position(|&b| b == old[0]) {
            None => break,
            Some(p) => i += p,
        }
        if data[i..].starts_with(old) {
            data[i..i + old.len()].copy_from_slice(new);
            n += 1;
            i += old.len();
        } else {
            i += 1;
        }
    }
    n
}
