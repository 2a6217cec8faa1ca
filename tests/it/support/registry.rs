//! Debian's real `docker-registry` (the distribution registry 2.8), started by a test on an
//! address it owns, images pushed into it with real `skopeo`; stopped by PID when dropped.
//! Used by the bundle tests on sshd hosts (tests/it/bundle.rs) and the real tier's air-gap
//! scenarios (tests/it/real/airgap.rs); with the bundle helpers both use.

use std::net::{IpAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Registry {
    child: Child,
    /// `HOST:PORT` it serves on.
    pub addr: String,
    /// TLS and basic auth: (CA file that signs its certificate, user, password).
    pub secure: Option<(std::path::PathBuf, String, String)>,
    _dir: tempfile::TempDir,
}

/// A CA the test makes and a server certificate it signs for `ip` (EC P-256, openssl):
/// (ca.pem, cert.pem, key.pem) in `dir`.
pub fn make_tls(dir: &std::path::Path, ip: IpAddr) -> [std::path::PathBuf; 3] {
    let sh = |script: &str| {
        super::run_ok(
            Command::new("sh").args(["-ec", script]).current_dir(dir),
            script,
        );
    };
    sh(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
         -keyout ca.key -out ca.pem -days 2 -subj /CN=kprov-test-registry-ca 2>/dev/null",
    );
    sh(&format!(
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
           -keyout key.pem -out req.csr -subj /CN={ip} 2>/dev/null\n\
         printf 'subjectAltName=IP:{ip}\\n' > ext.cnf\n\
         openssl x509 -req -in req.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
           -out cert.pem -days 2 -extfile ext.cnf 2>/dev/null"
    ));
    ["ca.pem", "cert.pem", "key.pem"].map(|f| dir.join(f))
}

impl Registry {
    /// Serves plain HTTP on `bind`, a free port (the loopback for a test on this machine, a
    /// lab's bridge address for hosts to reach).
    pub fn start(bind: IpAddr) -> Registry {
        Registry::start_with(bind, None)
    }

    /// Serves HTTPS with a certificate of a CA made here and basic auth for `user` (htpasswd
    /// from apache2-utils, bcrypt as the registry wants).
    pub fn start_secure(bind: IpAddr, user: &str, password: &str) -> Registry {
        Registry::start_with(bind, Some((user, password)))
    }

    fn start_with(bind: IpAddr, auth: Option<(&str, &str)>) -> Registry {
        let dir = tempfile::tempdir().expect("registry dir");
        let port = TcpListener::bind((bind, 0))
            .expect("free port")
            .local_addr()
            .expect("addr")
            .port();
        let addr = format!("{bind}:{port}");
        let config = dir.path().join("config.yml");
        let mut yaml = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
            dir.path().join("data").display()
        );
        let mut secure = None;
        if let Some((user, password)) = auth {
            let [ca, cert, key] = make_tls(dir.path(), bind);
            yaml.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            ));
            let o = Command::new("htpasswd")
                .args(["-Bbn", user, password])
                .stdin(Stdio::null())
                .output()
                .expect("htpasswd (scripts/install-test-deps installs apache2-utils)");
            assert!(o.status.success(), "htpasswd");
            let htpasswd = dir.path().join("htpasswd");
            std::fs::write(&htpasswd, &o.stdout).expect("htpasswd file");
            yaml.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: kprov-test\n    path: {}\n",
                htpasswd.display()
            ));
            secure = Some((ca, user.to_string(), password.to_string()));
        }
        std::fs::write(&config, yaml).expect("registry config");
        let child = crate::support::spawn_silent(
            Command::new("docker-registry").arg("serve").arg(&config),
            "docker-registry (scripts/install-test-deps installs it)",
        );
        let mut r = Registry {
            child,
            addr,
            secure,
            _dir: dir,
        };
        // Generous: a loaded machine starts it slowly; it exits early only on a bad config.
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(&r.addr).is_err() {
            if let Ok(Some(status)) = r.child.try_wait() {
                panic!("docker-registry exited: {status}");
            }
            assert!(Instant::now() < deadline, "docker-registry did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        r
    }

    /// Pushes a docker-archive to `REPO:TAG` with skopeo.
    pub fn push(&self, archive: &str, repo_tag: &str) {
        let mut c = Command::new("skopeo");
        // The push is the test's setup: the nodes are the ones that check the certificate.
        c.args(["copy", "--quiet", "--dest-tls-verify=false"]);
        if let Some((_, user, password)) = &self.secure {
            c.arg(format!("--dest-creds={user}:{password}"));
        }
        super::run_ok(
            c.arg(format!("docker-archive:{archive}"))
                .arg(format!("docker://{}/{repo_tag}", self.addr)),
            &format!("skopeo copy {archive} to {repo_tag}"),
        );
    }

    /// Stops the registry now (PID), as a site whose registry is gone.
    pub fn stop(mut self) {
        self.kill();
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `registry.k8s.io/pause:3.10.1` → (`registry.k8s.io`, `pause:3.10.1`).
pub fn split_reference(r: &str) -> (&str, &str) {
    r.split_once('/').expect("a registry")
}

/// The data offset of a bundle member (to flip one of its bytes).
pub fn member_offset(bundle: &std::path::Path, member: &str) -> u64 {
    let mut a = tar::Archive::new(std::fs::File::open(bundle).expect("bundle"));
    for e in a.entries().expect("bundle entries") {
        let e = e.expect("bundle entry");
        if e.path().expect("member path").display().to_string() == member {
            return e.raw_file_position();
        }
    }
    panic!("no member {member} in {}", bundle.display());
}

/// Flips one bit of the byte at `offset` of `path` in place (twice restores it).
pub fn flip_byte(path: &std::path::Path, offset: u64) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open to flip");
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset)).expect("seek");
    f.read_exact(&mut b).expect("read");
    b[0] ^= 0x20;
    f.seek(SeekFrom::Start(offset)).expect("seek");
    f.write_all(&b).expect("write");
}
