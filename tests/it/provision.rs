//! Provisioning end to end without ssh: every host is a mount + UTS namespace on this machine
//! (overlays over /etc, /var/lib, /var/log, /opt and /usr/local, like the sshd test hosts),
//! the rendered steps run there for real, nodes download stand-ins from the local mirror
//! with curl and verify their sha256, and the stand-ins record every call. The SSH engine's
//! own tests cover transport; these cover what runs on the nodes and in which order.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;
use kprov::inventory;
use kprov::provision::orchestrate::{self, HostResult, Options, Phase};
use kprov::spec::{Assets, Cluster, Host};
use kprov::ssh::task::{ExecError, HostExecutor, Step, StepOutcome};

use crate::support::mirror::{Mirror, host_standins_dir};
use crate::support::model;

/// Test hosts: one directory per host holding its overlay layers and staged files.
struct NsHosts {
    root: tempfile::TempDir,
    names: Vec<String>,
    unreachable: Mutex<BTreeSet<String>>,
}

const OVERLAID: &[&str] = &["etc", "var/lib", "var/log", "opt", "usr/local"];

impl NsHosts {
    /// `orchestrate::provision` of `c` on `hosts` through these namespaces, at today's
    /// options; the run itself must not fail (its report may).
    async fn provision(&self, c: &Cluster, hosts: &[Host]) -> orchestrate::Report {
        orchestrate::provision(
            self,
            &model(c),
            &targets(hosts),
            &owner(),
            &Options::current(),
        )
        .await
        .expect("the run")
    }

    fn new(hosts: &[Host]) -> NsHosts {
        let root = tempfile::Builder::new()
            .prefix("kprov-nshosts-")
            .tempdir()
            .expect("tempdir");
        for (i, h) in hosts.iter().enumerate() {
            let d = root.path().join(&h.name);
            for o in OVERLAID {
                std::fs::create_dir_all(d.join("up").join(o)).unwrap();
                std::fs::create_dir_all(d.join("work").join(o)).unwrap();
            }
            for m in ["overlay", "br_netfilter"] {
                std::fs::create_dir_all(d.join("sys-module").join(m)).unwrap();
            }
            std::fs::create_dir_all(d.join("sys-net/eth0")).unwrap();
            std::fs::write(
                d.join("sys-net/eth0/address"),
                format!("02:00:00:00:00:{:02x}\n", i + 1),
            )
            .unwrap();
            std::fs::create_dir_all(d.join("stage")).unwrap();
        }
        NsHosts {
            root,
            names: hosts.iter().map(|h| h.name.clone()).collect(),
            unreachable: Mutex::new(BTreeSet::new()),
        }
    }

    fn dir(&self, host: &str) -> PathBuf {
        self.root.path().join(host)
    }

    /// A file as the host sees it (its overlay's upper layer; nothing of the machine's).
    fn file(&self, host: &str, path: &str) -> Option<String> {
        std::fs::read_to_string(self.dir(host).join("up").join(path.trim_start_matches('/'))).ok()
    }

    /// The stand-ins' call log on `host`: (nanosecond timestamp, "tool args").
    fn calls(&self, host: &str) -> Vec<(u128, String)> {
        crate::support::testhosts::standin_calls(
            &self
                .file(host, "/var/log/kprov-standins.log")
                .unwrap_or_default(),
        )
    }

    fn first_call(&self, host: &str, prefix: &str) -> u128 {
        self.calls(host)
            .into_iter()
            .find(|(_, c)| c.starts_with(prefix))
            .unwrap_or_else(|| panic!("{host}: no call starting with {prefix:?}"))
            .0
    }

    /// Runs `script` as root inside the host's namespaces; returns (exit code, stdout, stderr).
    async fn sh(&self, host: &str, script: &str) -> (i32, String, String) {
        let d = self.dir(host);
        let d = d.display();
        let mut setup = String::from("set -e\n");
        for o in OVERLAID {
            setup.push_str(&format!(
                "mount -t overlay overlay -o lowerdir=/{o},upperdir={d}/up/{o},workdir={d}/work/{o} /{o}\n"
            ));
        }
        setup.push_str(&format!(
            // /sys/fs/cgroup: the cgroup v2 hierarchy, as on current distributions (this
            // machine is cgroup v1 hybrid, which preflight refuses for kubelet 1.35+).
            "mount --bind {d}/sys-module /sys/module\nmount --bind {d}/sys-net /sys/class/net\n\
             mount -t cgroup2 cgroup2 /sys/fs/cgroup\n\
             hostname {host}\nexport PATH={}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
             export HOME=/root\nset +e\n",
            host_standins_dir().display()
        ));
        let out = tokio::process::Command::new("unshare")
            .args(["--mount", "--uts", "--propagation", "private", "sh", "-c"])
            .arg(format!("{setup}{script}"))
            .output()
            .await
            .expect("unshare");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// The inventory's hosts as targets.
fn targets(hosts: &[kprov::spec::Host]) -> Vec<kprov::nodes::Target> {
    hosts
        .iter()
        .cloned()
        .map(kprov::nodes::Target::from_host)
        .collect()
}

fn owner() -> kprov::nodes::Owner {
    kprov::nodes::Owner {
        uid: "5eed0000000000000000000000000001".into(),
        cluster: "demo.example.com".into(),
        store: "file:///var/tmp/kprov-provision-test".into(),
    }
}

#[async_trait::async_trait]
impl HostExecutor for NsHosts {
    /// Same contract as the SSH engine: upload files whose sha256 differs, skip `run` when the
    /// check passes and nothing changed, stop at the first failure.
    async fn run_steps(&self, host: &str, steps: &[Step]) -> Result<Vec<StepOutcome>, ExecError> {
        if self.unreachable.lock().unwrap().contains(host) || !self.names.iter().any(|n| n == host)
        {
            return Err(ExecError::Connect {
                host: host.into(),
                message: "ssh: connect to host: No route to host".into(),
            });
        }
        let stage = self.dir(host).join("stage");
        let mut script = String::new();
        for (i, s) in steps.iter().enumerate() {
            script.push_str("changed=0\n");
            for (j, f) in s.files.iter().enumerate() {
                let staged = stage.join(format!("{i}-{j}"));
                std::fs::write(&staged, &f.content).unwrap();
                let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&f.content));
                script.push_str(&format!(
                    "if [ \"$(sha256sum '{p}' 2>/dev/null | cut -d' ' -f1)\" != {sha} ]; then \
                     mkdir -p \"$(dirname '{p}')\" && cat '{st}' > '{p}' && chmod {m:o} '{p}'; changed=1; fi\n",
                    p = f.path, st = staged.display(), m = f.mode
                ));
            }
            std::fs::write(stage.join(format!("{i}.run")), &s.run).unwrap();
            let check = match &s.check {
                Some(c) => {
                    std::fs::write(stage.join(format!("{i}.check")), c).unwrap();
                    format!(
                        "[ $changed = 0 ] && sh {}/{i}.check >/dev/null 2>&1",
                        stage.display()
                    )
                }
                None => "false".to_string(),
            };
            script.push_str(&format!(
                "if {check}; then echo 'step {i} unchanged'; \
                 elif sh {st}/{i}.run > {st}/{i}.out 2> {st}/{i}.err; then echo 'step {i} changed'; \
                 else echo \"step {i} failed $?\"; exit 0; fi\n",
                st = stage.display()
            ));
        }
        let (code, out, err) = self.sh(host, &script).await;
        if code != 0 {
            return Err(ExecError::Other {
                host: host.into(),
                message: format!("executor failed ({code}): {err}"),
            });
        }
        let mut outcomes = Vec::new();
        for line in out.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["step", _, "unchanged"] => outcomes.push(StepOutcome::Unchanged),
                ["step", _, "changed"] => outcomes.push(StepOutcome::Changed),
                ["step", i, "failed", code] => {
                    let i: usize = i.parse().unwrap();
                    return Err(ExecError::Step {
                        host: host.into(),
                        step: steps[i].name.clone(),
                        code: code.parse().ok(),
                        stderr: std::fs::read_to_string(stage.join(format!("{i}.err")))
                            .unwrap_or_default(),
                    });
                }
                _ => {}
            }
        }
        assert_eq!(outcomes.len(), steps.len(), "executor output: {out}\n{err}");
        Ok(outcomes)
    }

    async fn read_file(&self, host: &str, path: &str) -> Result<Option<Bytes>, ExecError> {
        if self.unreachable.lock().unwrap().contains(host) {
            return Err(ExecError::Connect {
                host: host.into(),
                message: "No route to host".into(),
            });
        }
        let (code, out, err) = self
            .sh(host, &format!("[ -f '{path}' ] || exit 3\ncat '{path}'"))
            .await;
        match code {
            0 => Ok(Some(Bytes::from(out))),
            3 => Ok(None),
            _ => Err(ExecError::Other {
                host: host.into(),
                message: err,
            }),
        }
    }
}

fn inventory_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("inventories")
        .join(name)
}

fn cluster(mirror: &Mirror, extra: &str) -> Cluster {
    let yaml = format!(
        "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: lab.example.com\n\
         spec:\n  cloudProvider: metal\n  kubernetesVersion: 1.35.1\n  networking:\n    \
         podCIDR: 100.96.0.0/11\n    serviceCIDR: 100.64.0.0/13\n  etcd:\n    type: Stacked\n{extra}"
    );
    let mut c: Cluster = serde_saphyr::from_str(&yaml).unwrap();
    c.spec.assets = Some(Assets {
        bundle: None,
        mirror: None,
        images: Vec::new(),
        files: mirror.asset_files(),
        checksums: Vec::new(),
    });
    c
}

/// The hosts of the inventory file `name` (tests/fixtures).
fn hosts_of(name: &str) -> Vec<Host> {
    inventory::load(&inventory_file(name)).unwrap()
}

/// What `provisioned` made.
struct Provisioned {
    m: Mirror,
    hosts: Vec<Host>,
    c: Cluster,
    ns: NsHosts,
    report: orchestrate::Report,
}

/// The hosts of the inventory file `inventory`, provisioned (successfully) in namespaces as
/// the cluster of `cluster(&m, extra)`.
async fn provisioned(inventory: &str, extra: &str) -> Provisioned {
    let m = mirror();
    let hosts = hosts_of(inventory);
    let c = cluster(&m, extra);
    let ns = NsHosts::new(&hosts);
    let report = ns.provision(&c, &hosts).await;
    assert!(report.success(), "{report:#?}");
    Provisioned {
        m,
        hosts,
        c,
        ns,
        report,
    }
}

/// How many kubeadm commands ran on `hosts` so far.
fn kubeadm_runs(ns: &NsHosts, hosts: &[Host]) -> usize {
    let on = |h: &Host| {
        let calls = ns.calls(&h.name);
        calls
            .iter()
            .filter(|(_, c)| c.starts_with("kubeadm"))
            .count()
    };
    hosts.iter().map(on).sum()
}

fn mirror() -> Mirror {
    Mirror::start(IpAddr::V4(Ipv4Addr::LOCALHOST), "1.35.1")
}

fn openssl_pin(pem: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ca.crt");
    std::fs::write(&p, pem).unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("openssl x509 -pubkey -noout -in {} | openssl pkey -pubin -outform der | sha256sum | cut -d' ' -f1", p.display()))
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_control_planes_from_kprov_inventory_then_no_op_rerun() {
    crate::needs_tier!(Root);
    let Provisioned {
        m, hosts, c, ns, ..
    } = provisioned("kprov-ha.yaml", "").await;

    // Order: init on cp1 before any join; control planes one at a time; workers after them.
    let init = ns.first_call("cp1", "kubeadm init --config");
    let join = |h: &str| ns.first_call(h, "kubeadm join --config");
    let last_call = |h: &str| {
        ns.calls(h)
            .iter()
            .filter(|(_, c)| c.starts_with("kubeadm join"))
            .map(|(t, _)| *t)
            .max()
            .unwrap()
    };
    assert!(init < join("cp2") && join("cp2") < join("cp3"));
    assert!(last_call("cp2") < join("cp3"));
    for w in ["worker1", "worker2"] {
        assert!(
            join("cp3") < join(w),
            "{w} joined before the control planes"
        );
    }
    assert_eq!(
        ns.calls("cp2")
            .iter()
            .filter(|(_, c)| c.starts_with("kubeadm init"))
            .count(),
        0
    );

    // Joins used a token cp1 created, the CA pin matches openssl's, and control planes got the
    // certificate key cp1 uploaded.
    let tokens = ns.file("cp1", "/var/lib/kprov-standins/tokens").unwrap();
    let pin = openssl_pin(&ns.file("cp1", "/etc/kubernetes/pki/ca.crt").unwrap());
    let uploaded = ns
        .file("cp1", "/var/lib/kprov-standins/uploaded-certificate-key")
        .unwrap();
    for h in ["cp2", "cp3", "worker1", "worker2"] {
        let used = ns
            .file(h, "/var/lib/kprov-standins/joined-with-token")
            .unwrap();
        assert!(
            tokens.lines().any(|t| t == used.trim()),
            "{h} joined with an unknown token"
        );
        let cfg = ns
            .file(h, "/etc/kubernetes/kprov/kubeadm-join.yaml")
            .unwrap();
        assert!(cfg.contains(&format!("\"sha256:{pin}\"")), "{h}: {cfg}");
        assert_eq!(
            cfg.contains(&format!("certificateKey: \"{}\"", uploaded.trim())),
            h.starts_with("cp"),
            "{h}"
        );
    }

    // What landed on the nodes.
    let flags = ns
        .file("worker2", "/var/lib/kubelet/kubeadm-flags.env")
        .unwrap();
    assert!(flags.contains("--node-ip=10.0.0.15"), "{flags}");
    assert!(!flags.contains("cloud-provider"), "{flags}");
    assert!(
        ns.file("cp1", "/etc/containerd/config.toml")
            .unwrap()
            .contains("SystemdCgroup = true")
    );
    let kubeadm = ns.file("worker1", "/usr/local/bin/kubeadm").unwrap();
    assert!(kubeadm.contains("stand-in for kubeadm 1.35.1"));
    assert!(ns.file("worker1", "/opt/cni/bin/bridge").is_some());
    assert!(ns.file("worker1", "/usr/local/bin/containerd").is_some());
    let proxy = ns
        .file("worker1", "/etc/kubernetes/kprov/haproxy.cfg")
        .unwrap();
    for cp in ["cp1 198.18.0.11", "cp2 198.18.0.12", "cp3 198.18.0.13"] {
        assert!(proxy.contains(&format!("server {cp}:6443")), "{proxy}");
    }
    assert!(
        ns.file("worker1", "/etc/hosts")
            .unwrap()
            .contains("127.0.0.1 api.internal.lab.example.com # kprov-api")
    );
    assert!(
        ns.file("cp2", "/etc/hosts")
            .unwrap()
            .contains("198.18.0.12 api.internal.lab.example.com # kprov-api")
    );
    assert!(
        ns.file("cp1", "/var/lib/kprov-standins/systemd/containerd.active")
            .is_some()
    );

    // Re-run: nothing changes, nothing is downloaded, kubeadm is not called to change anything.
    let downloads = m.downloads().len();
    assert_eq!(downloads, 7 * hosts.len());
    let kubeadm_calls = kubeadm_runs(&ns, &hosts);
    let again = ns.provision(&c, &hosts).await;
    assert!(again.success(), "{again:#?}");
    assert_eq!(again.changed(), 0, "{again:#?}");
    assert_eq!(m.downloads().len(), downloads);
    let after = kubeadm_runs(&ns, &hosts);
    assert_eq!(after, kubeadm_calls);

    // The admin kubeconfig, pointed at a control plane the operator can reach.
    let kc = orchestrate::admin_kubeconfig(&ns, &model(&c), &targets(&hosts), &owner())
        .await
        .unwrap();
    assert!(kc.contains("server: https://198.18.0.11:6443"), "{kc}");

    // delete cluster: every host reset.
    let reset = orchestrate::reset(
        &ns,
        &model(&c),
        &targets(&hosts),
        &owner(),
        &Options::current(),
    )
    .await
    .unwrap();
    assert!(reset.success(), "{reset:#?}");
    for h in &hosts {
        assert!(
            ns.calls(&h.name)
                .iter()
                .any(|(_, c)| c.starts_with("kubeadm reset --force"))
        );
        let (code, _, _) = ns
            .sh(
                &h.name,
                "[ ! -e /etc/kubernetes/admin.conf ] && [ ! -e /etc/kubernetes/kubelet.conf ]",
            )
            .await;
        assert_eq!(code, 0, "{}: kubeconfigs left after reset", h.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubespray_inventory_single_control_plane_with_external_cloud_provider() {
    crate::needs_tier!(Root);
    let Provisioned {
        m: _m,
        hosts,
        c: _c,
        ns,
        report,
    } = provisioned(
        "kubespray-inventory.ini",
        "  cloudControllerManager:\n    provider: openstack\n",
    )
    .await;
    for h in &hosts {
        let flags = ns
            .file(&h.name, "/var/lib/kubelet/kubeadm-flags.env")
            .unwrap();
        assert!(
            flags.contains("--cloud-provider=external"),
            "{}: {flags}",
            h.name
        );
    }
    let init = ns
        .file("node1", "/etc/kubernetes/kprov/kubeadm-init.yaml")
        .unwrap();
    assert_eq!(
        init.matches("cloud-provider").count(),
        1,
        "only the kubelet gets it: {init}"
    );
    let by_host: BTreeMap<_, _> = report
        .hosts
        .iter()
        .map(|r| (r.host.as_str(), r.roles.clone()))
        .collect();
    assert_eq!(by_host.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn checksum_mismatch_is_refused_and_unreachable_host_reported() {
    crate::needs_tier!(Root);
    let (m, hosts) = (mirror(), hosts_of("kprov-single.yaml"));
    let mut c = cluster(&m, "");
    let assets = c.spec.assets.as_mut().unwrap();
    let kubelet = assets
        .files
        .iter_mut()
        .find(|f| f.name == "kubelet")
        .unwrap();
    let actual = kubelet.sha256.clone();
    kubelet.sha256 = "0".repeat(64);
    let ns = NsHosts::new(&hosts);
    ns.unreachable.lock().unwrap().insert("worker2".into());
    let report = ns.provision(&c, &hosts).await;
    assert!(!report.success());
    let result = |h: &str| {
        report
            .hosts
            .iter()
            .find(|r| r.host == h)
            .unwrap()
            .result
            .clone()
    };
    match result("cp1") {
        HostResult::Failed {
            phase: Phase::Install,
            error,
            ..
        } => {
            assert!(error.contains("kubelet: install 1.35.1"), "{error}");
            assert!(
                error.contains(&format!("expected sha256 {}, got {actual}", "0".repeat(64))),
                "{error}"
            );
        }
        other => panic!("cp1: {other:?}"),
    }
    assert!(
        ns.file("cp1", "/usr/local/bin/kubelet").is_none(),
        "a binary with a bad checksum was installed"
    );
    match result("worker2") {
        HostResult::Failed {
            phase: Phase::Preflight,
            error,
            unknown_host_key: false,
        } => assert!(error.contains("No route to host"), "{error}"),
        other => panic!("worker2: {other:?}"),
    }
    // worker1 met the same bad checksum (kubeadm, installed before it, is fine).
    assert!(matches!(
        result("worker1"),
        HostResult::Failed {
            phase: Phase::Install,
            ..
        }
    ));
    assert!(ns.file("worker1", "/usr/local/bin/kubelet").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn external_etcd_hosts_then_control_plane_and_worker() {
    crate::needs_tier!(Root);
    let m = mirror();
    let inventory = "\
hosts:
  - {name: cp1, address: 198.18.0.11, roles: [control-plane]}
  - {name: etcd1, address: 198.18.0.21, roles: [etcd]}
  - {name: etcd2, address: 198.18.0.22, roles: [etcd]}
  - {name: etcd3, address: 198.18.0.23, roles: [etcd]}
  - {name: w1, address: 198.18.0.31, roles: [node]}
";
    let hosts = inventory::parse(inventory, "external.yaml").unwrap();
    assert_eq!(
        inventory::etcd_topology(&hosts),
        kprov::spec::EtcdType::External
    );
    let c = cluster(&m, "").clone();
    let mut c = c;
    c.spec.etcd = Some(kprov::spec::Etcd {
        kind: kprov::spec::EtcdType::External,
    });
    let ns = NsHosts::new(&hosts);
    let report = ns.provision(&c, &hosts).await;
    assert!(report.success(), "{report:#?}");

    // One CA for the etcd cluster, every member knows all three peers.
    let ca = ns.file("etcd1", "/etc/kubernetes/pki/etcd/ca.crt").unwrap();
    for e in ["etcd1", "etcd2", "etcd3"] {
        assert_eq!(
            ns.file(e, "/etc/kubernetes/pki/etcd/ca.crt").unwrap(),
            ca,
            "{e}"
        );
        // A host service from the pinned release, no kubelet-run static pod.
        let conf = ns.file(e, "/etc/etcd/etcd.conf.yml").unwrap();
        assert!(conf.contains("initial-cluster: \"etcd1=https://198.18.0.21:2380,etcd2=https://198.18.0.22:2380,etcd3=https://198.18.0.23:2380\""), "{e}: {conf}");
        assert!(ns.file(e, "/etc/systemd/system/etcd.service").is_some());
        assert!(ns.file(e, "/etc/kubernetes/manifests/etcd.yaml").is_none());
        assert!(
            ns.calls(e)
                .iter()
                .any(|(_, c)| c.starts_with("etcdctl ") && c.ends_with("endpoint health")),
            "{e}"
        );
        assert!(
            !ns.calls(e)
                .iter()
                .any(|(_, c)| c.starts_with("kubeadm join")
                    || c.starts_with("kubeadm init --config"))
        );
    }
    // The etcd CA exists before the control plane starts, and kubeadm init uses the client
    // certificates made under it.
    assert!(
        ns.first_call("etcd1", "kubeadm init phase certs etcd-ca")
            < ns.first_call("cp1", "kubeadm init --config")
    );
    assert_eq!(
        ns.file("cp1", "/etc/kubernetes/pki/etcd/ca.crt").unwrap(),
        ca
    );
    assert_eq!(
        ns.file("cp1", "/etc/kubernetes/pki/apiserver-etcd-client.crt")
            .unwrap(),
        ns.file("etcd1", "/etc/kubernetes/pki/apiserver-etcd-client.crt")
            .unwrap()
    );
    let init = ns
        .file("cp1", "/etc/kubernetes/kprov/kubeadm-init.yaml")
        .unwrap();
    assert!(
        init.contains("external:") && init.contains("https://198.18.0.22:2379"),
        "{init}"
    );
    assert!(
        ns.file("cp1", "/etc/kubernetes/manifests/etcd.yaml")
            .is_none(),
        "no stacked etcd on cp1"
    );
    assert!(ns.file("w1", "/etc/kubernetes/kubelet.conf").is_some());

    let again = ns.provision(&c, &hosts).await;
    assert!(again.success(), "{again:#?}");
    assert_eq!(again.changed(), 0, "{again:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn air_gapped_assets_are_uploaded_not_downloaded() {
    crate::needs_tier!(Root);
    let (m, hosts) = (mirror(), hosts_of("kubespray-inventory.ini"));
    let mut c = cluster(&m, "");
    c.spec.assets = Some(Assets {
        bundle: None,
        mirror: None,
        images: Vec::new(),
        files: m.local_asset_files(),
        checksums: Vec::new(),
    });
    let ns = NsHosts::new(&hosts);
    let report = ns.provision(&c, &hosts).await;
    assert!(report.success(), "{report:#?}");
    assert!(
        m.downloads().is_empty(),
        "nodes downloaded {:?}",
        m.downloads()
    );
    assert!(!ns.calls("node2").is_empty());
    for h in &hosts {
        assert!(
            ns.file(&h.name, "/usr/local/bin/kubelet")
                .unwrap()
                .contains("stand-in for kubelet")
        );
        assert!(
            ns.file(&h.name, "/etc/kubernetes/kubelet.conf").is_some(),
            "{} did not join",
            h.name
        );
    }
    let again = ns.provision(&c, &hosts).await;
    assert_eq!(again.changed(), 0, "{again:#?}");
}

/// A cgroup v1 host (older RHEL, Amazon Linux 2; this machine too) has a tmpfs at
/// /sys/fs/cgroup holding the v1 hierarchies: the host's cgroup v2 mount is replaced by one
/// (whatever this machine's own layout), and the rendered preflight runs there. Kubernetes
/// 1.35's kubelet refuses it, so preflight fails naming the host and the spec
/// setting; with `spec.kubelet.failCgroupV1: false` the same host only gets a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cgroup_v1_host_is_refused_unless_the_spec_opts_in() {
    crate::needs_tier!(Root);
    let mirror = mirror();
    let host: Host = serde_saphyr::from_str(
        "{name: cg1, address: 198.18.7.1, roles: [control-plane, etcd, node]}",
    )
    .unwrap();
    let ns = NsHosts::new(std::slice::from_ref(&host));
    let targets = vec![kprov::nodes::Target::from_host(host)];
    let preflight = |extra: &str| {
        let r = kprov::provision::render::Renderer::new(&model(&cluster(&mirror, extra)), &targets)
            .unwrap();
        let steps = r.preflight(&targets[0]).unwrap();
        String::from_utf8(steps[1].files[0].content.to_vec()).unwrap()
    };
    let run = |script: String| {
        let ns = &ns;
        async move {
            ns.sh(
                "cg1",
                &format!("umount /sys/fs/cgroup\nmount -t tmpfs tmpfs /sys/fs/cgroup\n{script}"),
            )
            .await
        }
    };
    let (_, _, err) = run(preflight("")).await;
    assert!(
        err.contains("preflight: cg1 uses cgroup v1 (/sys/fs/cgroup is tmpfs)")
            && err.contains("set spec.kubelet.failCgroupV1: false"),
        "{err}"
    );
    let (_, _, err) = run(preflight("  kubelet:\n    failCgroupV1: false\n")).await;
    assert!(
        err.contains("preflight: warning: cg1 uses cgroup v1") && !err.contains("set spec.kubelet"),
        "{err}"
    );
}
