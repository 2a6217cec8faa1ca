//! A kprov cluster on a real-hosts lab, driven as an operator drives it: the kprov binary with
//! a `file://` store in the lab's directory, and real kubectl from this machine through the
//! lab bridge. Every scenario of the real tier starts here (tests/it/real.rs).
//!
//! The spec is what `create cluster --cloud metal --inventory` writes, then edited the way an
//! operator edits it for these hosts (docs/testing.md, "where a real host is not a machine"):
//! every address in the lab's block, `networking.cni: none` (the tier's own bridge network),
//! the archive's binaries and images as `spec.assets`, the cgroup v1 opt-in, containerd's
//! `restrictOOMScoreAdj`, conntrack left alone, no NTP requirement.

use crate::support::cli::create_metal;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kprov::spec::{Cluster, Object, ObjectRef};

use super::realhosts::{self, RealHost, RealLab};
use super::realk8s::{self, Binaries};

/// The kprov binary as an operator runs it against a lab: HOME and a `file://` state store in
/// the lab's directory (under /var/tmp: the hosts mount their own /tmp).
pub fn kprov(lab: &RealLab, args: &[&str]) -> Output {
    kprov_command(lab, args)
        .stdin(Stdio::null())
        .output()
        .expect("runs kprov")
}

/// The command [`kprov`] runs (for one that needs standard input).
pub fn kprov_command(lab: &RealLab, args: &[&str]) -> Command {
    let mut c = super::cli::kprov_in(lab.dir(), &lab.dir().join("state"));
    c.args(args);
    c
}

/// `kprov ARGS`, which must succeed; its stdout.
#[track_caller]
pub fn kprov_ok(lab: &RealLab, args: &[&str]) -> String {
    let t = Instant::now();
    let o = kprov(lab, args);
    eprintln!("kprov {} ({:?})", args.join(" "), t.elapsed());
    assert!(
        o.status.success(),
        "kprov {}: exit {:?}\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The pod network the tier uses instead of a CNI add-on (`networking.cni: none` is the user's
/// own network): the bridge plugin handing out the host's pod /24; `RealLab::route_pods` adds
/// the routes between hosts.
pub fn write_bridge_cni(h: &RealHost) {
    h.exec(&format!(
        "mkdir -p /etc/cni/net.d && cat > /etc/cni/net.d/10-bridge.conflist <<'EOF'\n\
         {{\"cniVersion\": \"1.0.0\", \"name\": \"kprov-real\", \"plugins\": [\n\
         {{\"type\": \"bridge\", \"bridge\": \"cni0\", \"isGateway\": true, \"ipMasq\": true, \"hairpinMode\": true,\n\
          \"ipam\": {{\"type\": \"host-local\", \"ranges\": [[{{\"subnet\": \"{}\"}}]], \"routes\": [{{\"dst\": \"0.0.0.0/0\"}}]}}}},\n\
         {{\"type\": \"portmap\", \"capabilities\": {{\"portMappings\": true}}}}]}}\nEOF\n",
        h.pod_cidr
    ))
    .unwrap_or_else(|e| panic!("CNI config on {}: {e}", h.name));
}

/// What kprov installs or writes on a node; none of it may exist before `--yes`.
pub const KPROV_PATHS: &[&str] = &[
    "/var/lib/kprov",
    "/etc/kubernetes",
    "/etc/containerd",
    "/usr/local/bin/kubelet",
    "/usr/local/bin/containerd",
    "/etc/systemd/system/kubelet.service",
    "/etc/sysctl.d/99-kprov.conf",
];

pub fn present(h: &RealHost) -> Vec<&'static str> {
    KPROV_PATHS
        .iter()
        .copied()
        .filter(|p| {
            h.exec(&format!("[ -e {p} ] && echo yes || true"))
                .expect("exec")
                .trim()
                == "yes"
        })
        .collect()
}

/// kube-system's static pods on a cluster of `cp1` and `worker1`: the control plane, and the
/// worker's local API proxy (kprov's haproxy static pod, spec.api.localProxyImage).
pub const CP1_WORKER1_STATIC_PODS: [&str; 5] = [
    "etcd-cp1",
    "kube-apiserver-cp1",
    "kube-controller-manager-cp1",
    "kube-scheduler-cp1",
    "kprov-api-proxy-worker1",
];

pub struct RealCluster<'a> {
    pub lab: &'a RealLab,
    pub name: String,
    /// Where `export kubeconfig` writes the admin credentials (what `--keep` prints).
    pub kubeconfig: PathBuf,
    pub bins: &'static Binaries,
}

impl<'a> RealCluster<'a> {
    /// Writes the inventory of `hosts` (name, kprov roles: `control-plane`, `node`, `etcd`),
    /// creates the cluster from it and edits its spec for the tier; `edit` changes the Cluster
    /// further (an endpoint, etcd type, ...). Nothing is installed yet.
    pub fn create(
        lab: &'a RealLab,
        name: &str,
        hosts: &[(&str, &[&str])],
        edit: impl FnOnce(&mut Cluster),
    ) -> RealCluster<'a> {
        let bins = Binaries::get();
        let assets = realk8s::Assets::get(bins);
        let mut images = realk8s::images(
            bins,
            &bins.bin,
            &format!("v{}", realk8s::KUBERNETES_VERSION),
        );
        let proxy = realk8s::image(bins, &bins.bin, "", realk8s::ImageKind::Haproxy);
        let proxy_reference = proxy.reference.clone();
        images.push(proxy);
        for (h, _) in hosts {
            write_bridge_cni(lab.host(h));
        }
        let key = lab.client_key.display().to_string();
        let mut inv = String::from("hosts:\n");
        for (h, roles) in hosts {
            inv.push_str(&format!(
                "  - name: {h}\n    address: {}\n    user: root\n    keyPath: {key}\n    roles: [{}]\n",
                lab.host(h).address,
                roles.join(", ")
            ));
        }
        let inv_path = lab.dir().join(format!("{name}.hosts.yaml"));
        std::fs::write(&inv_path, inv).expect("inventory");
        kprov_ok(
            lab,
            &[
                &create_metal(name, inv_path.to_str().expect("utf-8"))[..],
                &["--kubernetes-version", realk8s::KUBERNETES_VERSION],
            ]
            .concat(),
        );
        edit_stored_cluster(lab, name, &format!("{name}.spec.yaml"), |c| {
            c.spec.networking.pod_cidr = Some(lab.pod_cidr.to_string());
            c.spec.networking.service_cidr = Some(lab.service_cidr.to_string());
            c.spec.networking.cni = Some(kprov::spec::Cni::None);
            c.spec.assets = Some(kprov::spec::Assets {
                bundle: None,
                mirror: None,
                files: assets.files.clone(),
                images: images
                    .iter()
                    .map(|i| kprov::spec::ImageArchive {
                        url: format!("file://{}", i.path.display()),
                        sha256: i.sha256.clone(),
                    })
                    .collect(),
                checksums: Vec::new(),
            });
            // What these hosts need (docs/testing.md: where a real host is not a machine).
            c.spec.kube_proxy = Some(kprov::spec::KubeProxy {
                proxy_mode: None,
                conntrack_max_per_core: Some(0),
            });
            c.spec.kubelet = Some(kprov::spec::Kubelet {
                fail_cgroup_v1: Some(false),
                ..Default::default()
            });
            c.spec.containerd = Some(kprov::spec::Containerd {
                restrict_oom_score_adj: Some(true),
                ..Default::default()
            });
            c.spec.preflight = Some(kprov::spec::Preflight {
                require_clock_sync: Some(false),
            });
            // The hosts share this machine's disk: a percentage of it says nothing about
            // a node, and a busy disk would taint every node with disk-pressure.
            c.spec
                .kubelet
                .get_or_insert_with(Default::default)
                .eviction_hard =
                Some("memory.available<100Mi,nodefs.available<2Gi,imagefs.available<2Gi".into());
            c.spec
                .api
                .get_or_insert_with(Default::default)
                .local_proxy_image = Some(proxy_reference.clone());
            edit(c);
        });
        RealCluster {
            lab,
            name: name.to_string(),
            kubeconfig: lab.dir().join("kubeconfig"),
            bins,
        }
    }

    /// [`RealCluster::create`] with the API endpoint set to `endpoint` (`HOST:PORT`).
    pub fn with_endpoint(
        lab: &'a RealLab,
        name: &str,
        hosts: &[(&str, &[&str])],
        endpoint: String,
    ) -> RealCluster<'a> {
        RealCluster::create(lab, name, hosts, |c| {
            c.spec.api.get_or_insert_with(Default::default).endpoint = Some(endpoint);
        })
    }

    /// `backup etcd NAME -o json` (timed): the record.
    #[track_caller]
    pub fn backup_etcd(&self) -> serde_json::Value {
        let t = Instant::now();
        let record = self.kprov_ok(&["backup", "etcd", &self.name, "-o", "json"]);
        eprintln!("backup etcd: {:?}\n{record}", t.elapsed());
        serde_json::from_str(&record).expect("backup -o json")
    }

    pub fn kprov(&self, args: &[&str]) -> Output {
        kprov(self.lab, args)
    }

    #[track_caller]
    pub fn kprov_ok(&self, args: &[&str]) -> String {
        kprov_ok(self.lab, args)
    }

    /// `update cluster --yes --accept-new-host-keys`, then the admin credentials exported to
    /// `self.kubeconfig`. Returns how long the update took.
    #[track_caller]
    pub fn update_yes(&self) -> Duration {
        self.update_yes_with(&[])
    }

    /// [`RealCluster::update_yes`] with more arguments (`--bundle FILE`).
    #[track_caller]
    pub fn update_yes_with(&self, extra: &[&str]) -> Duration {
        let t = Instant::now();
        let mut args = vec![
            "update",
            "cluster",
            &self.name,
            "--yes",
            "--accept-new-host-keys",
        ];
        args.extend_from_slice(extra);
        let o = self.kprov(&args);
        if !o.status.success() {
            // What the hosts' containerd said: a failed kubeadm preflight names only the CRI.
            let journals: String = self
                .lab
                .hosts()
                .iter()
                .map(|h| {
                    let j = h
                        .exec(
                            "journalctl -u containerd --no-pager 2>&1 | grep -v 'Image[CU][a-z]* event' | tail -40 || true",
                        )
                        .unwrap_or_else(|e| e);
                    format!("--- {} containerd:\n{j}\n", h.name)
                })
                .collect();
            panic!(
                "kprov {}: exit {:?}\nstdout:\n{}\nstderr:\n{}\n{journals}",
                args.join(" "),
                o.status.code(),
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let took = t.elapsed();
        eprintln!("kprov {} ({took:?})", args.join(" "));
        self.kprov_ok(&[
            "export",
            "kubeconfig",
            &self.name,
            "--kubeconfig",
            self.kubeconfig.to_str().expect("utf-8"),
        ]);
        took
    }

    /// Real kubectl from this machine with the exported admin kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        super::testhosts::run(
            Command::new(self.bins.path("kubectl"))
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .arg("--request-timeout=20s")
                .args(args),
        )
    }

    #[track_caller]
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        self.kubectl(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Edits the stored spec as an operator does: `get cluster -o yaml`, change the Cluster,
    /// `replace -f` (the file kept in the lab's directory as `file`).
    #[track_caller]
    pub fn edit_spec(&self, file: &str, edit: impl FnOnce(&mut Cluster)) {
        edit_stored_cluster(self.lab, &self.name, file, edit);
    }

    /// Real kubectl as an owned closure, for a `Watch` thread: stdout on success.
    pub fn kubectl_fn(&self) -> impl Fn(&[&str]) -> Option<String> + Send + 'static {
        let (bin, kubeconfig) = (self.bins.path("kubectl"), self.kubeconfig.clone());
        move |args: &[&str]| {
            let out = Command::new(&bin)
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .arg("--request-timeout=10s")
                .args(args)
                .stdin(Stdio::null())
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        }
    }

    /// Whether the lab is to stay up (`--keep`): then prints the line scripts/test-real
    /// shows (`KUBECONFIG=...`) and the test ends there (the lab's Drop keeps it).
    pub fn kept(&self) -> bool {
        let keep = realhosts::keep_requested();
        if keep {
            println!("KUBECONFIG={}", self.kubeconfig.display());
        }
        keep
    }

    /// `delete cluster --yes`, then `leftovers` (a shell script printing what is left) on
    /// every host of the lab: each must print nothing.
    #[track_caller]
    pub fn delete_and_check(&self, leftovers: &str) {
        let t = Instant::now();
        self.kprov_ok(&["delete", "cluster", &self.name, "--yes"]);
        eprintln!("delete cluster --yes: {:?}", t.elapsed());
        for h in self.lab.hosts() {
            let left = h.exec(leftovers).expect("exec");
            assert_eq!(left.trim(), "", "{} after delete cluster", h.name);
        }
    }

    /// Waits (up to `limit`) until every pod of `want` runs in kube-system, with
    /// `kube_proxies` kube-proxy pods; fails naming what is missing and what runs.
    #[track_caller]
    pub fn wait_kube_system(
        &self,
        what: &str,
        limit: Duration,
        want: &[&str],
        kube_proxies: usize,
    ) {
        self.wait_for(what, limit, || {
            let running = self.running_kube_system_pods()?;
            let proxies = running
                .iter()
                .filter(|p| p.starts_with("kube-proxy-"))
                .count();
            let missing: Vec<&&str> = want
                .iter()
                .filter(|w| !running.iter().any(|r| r == *w))
                .collect();
            if missing.is_empty() && proxies == kube_proxies {
                Ok(())
            } else {
                Err(format!(
                    "missing {missing:?}, {proxies} kube-proxy; running: {running:?}"
                ))
            }
        })
    }

    /// Polls `probe` once a second until it returns `Some`, failing after `limit` with the
    /// last thing `probe` reported. For waits on the real cluster's state (no fixed sleeps).
    #[track_caller]
    pub fn wait_for<T>(
        &self,
        what: &str,
        limit: Duration,
        mut probe: impl FnMut() -> Result<T, String>,
    ) -> T {
        let deadline = Instant::now() + limit;
        loop {
            match probe() {
                Ok(v) => return v,
                Err(last) => {
                    assert!(
                        Instant::now() < deadline,
                        "{what}: not reached after {limit:?}; last: {last}"
                    );
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    }

    /// Waits until exactly the named nodes are registered and Ready; on failure, what the
    /// kubelet of each missing node says (its state and the end of its journal).
    #[track_caller]
    pub fn wait_nodes_ready(&self, nodes: &[&str], limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut want = nodes.to_vec();
        want.sort_unstable();
        loop {
            let text = self
                .kubectl(&["get", "nodes", "--no-headers"])
                .unwrap_or_else(|e| e);
            let mut ready: Vec<&str> = text
                .lines()
                .filter(|l| l.split_whitespace().nth(1) == Some("Ready"))
                .filter_map(|l| l.split_whitespace().next())
                .collect();
            ready.sort_unstable();
            if ready == want {
                return;
            }
            if Instant::now() > deadline {
                let mut why = String::new();
                for n in want.iter().filter(|n| !ready.contains(n)) {
                    let said = self
                        .lab
                        .host(n)
                        .exec(
                            "systemctl is-active kubelet; \
                             journalctl -u kubelet --no-pager -n 15 2>&1 | cut -c1-300",
                        )
                        .unwrap_or_else(|e| e);
                    why.push_str(&format!("\n--- {n}: kubelet\n{said}"));
                }
                panic!("nodes {want:?} not all Ready after {limit:?}:\n{text}{why}");
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// The names of kube-system pods that are Running with every container ready.
    pub fn running_kube_system_pods(&self) -> Result<Vec<String>, String> {
        let text = self.kubectl(&["-n", "kube-system", "get", "pods", "--no-headers"])?;
        Ok(text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (ready, status) = (f.get(1)?, f.get(2)?);
                let (a, b) = ready.split_once('/')?;
                (*status == "Running" && a == b).then(|| f[0].to_string())
            })
            .collect())
    }

    /// The ConfigMaps in `default` whose names are in `names`, sorted.
    pub fn configmaps(&self, names: &[&str]) -> Result<Vec<String>, String> {
        let text = self.kubectl(&[
            "get",
            "configmaps",
            "-n",
            "default",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}",
        ])?;
        let mut found: Vec<String> = text
            .lines()
            .filter(|l| names.contains(l))
            .map(str::to_string)
            .collect();
        found.sort();
        Ok(found)
    }

    /// Scenario 7's second half, after `backup etcd` took backup `id` while the ConfigMap
    /// `kept` existed: `kept` is deleted and `gone` created, then `restore etcd --from ID
    /// --yes`; returns once the API (restarted by the restore) shows `kept` again and not
    /// `gone`, with the restore's wall time.
    pub fn restore_roundtrip(&self, id: &str, kept: &str, gone: &str) -> Duration {
        self.kubectl_ok(&["delete", "configmap", kept, "-n", "default"]);
        self.kubectl_ok(&["create", "configmap", gone, "--from-literal=k=v"]);
        assert_eq!(
            self.configmaps(&[kept, gone]).expect("configmaps"),
            [gone],
            "before the restore"
        );
        let t = Instant::now();
        let out = self.kprov(&["restore", "etcd", &self.name, "--from", id, "--yes"]);
        assert!(
            out.status.success(),
            "restore etcd --from {id} --yes:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let took = t.elapsed();
        self.wait_for(
            "the snapshot's ConfigMaps through the API after the restore",
            Duration::from_secs(300),
            || {
                let found = self.configmaps(&[kept, gone])?;
                if found == [kept] {
                    Ok(())
                } else {
                    Err(format!("{found:?}"))
                }
            },
        );
        took
    }
}

/// A thread sampling the real API every 300 ms until finished, keeping the smallest and the
/// largest of each value `probe` returns ("never more than N cordoned", "never fewer than N
/// ready"). `finish` takes one last sample after stopping the thread.
pub struct Watch {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    probe: Arc<dyn Fn() -> Option<Vec<usize>> + Send + Sync>,
    handle: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
pub struct Seen {
    /// (min, max) per value.
    bounds: Vec<(usize, usize)>,
    /// The latest sample.
    pub last: Vec<usize>,
    pub samples: usize,
}

impl Seen {
    fn add(&mut self, values: &[usize]) {
        if self.bounds.is_empty() {
            self.bounds = values.iter().map(|v| (*v, *v)).collect();
        }
        for (b, v) in self.bounds.iter_mut().zip(values) {
            b.0 = b.0.min(*v);
            b.1 = b.1.max(*v);
        }
        self.samples += 1;
        self.last = values.to_vec();
    }

    /// The smallest value `i` had (`usize::MAX` without a sample: a failing bound).
    pub fn min(&self, i: usize) -> usize {
        self.bounds.get(i).map_or(usize::MAX, |b| b.0)
    }

    /// The largest value `i` had (`usize::MAX` without a sample: a failing bound).
    pub fn max(&self, i: usize) -> usize {
        self.bounds.get(i).map_or(usize::MAX, |b| b.1)
    }
}

/// A test that panics mid-watch stops the thread too.
impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Watch {
    pub fn start(probe: impl Fn() -> Option<Vec<usize>> + Send + Sync + 'static) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let probe: Arc<dyn Fn() -> Option<Vec<usize>> + Send + Sync> = Arc::new(probe);
        let (s, sn, p) = (stop.clone(), seen.clone(), probe.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                if let Some(v) = p() {
                    sn.lock().unwrap_or_else(|e| e.into_inner()).add(&v);
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        Watch {
            stop,
            seen,
            probe,
            handle: Some(handle),
        }
    }

    pub fn finish(mut self) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            h.join().expect("watch thread");
        }
        let mut seen = std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(v) = (self.probe)() {
            seen.add(&v);
        }
        seen
    }
}

/// Edits cluster `name`'s stored Cluster as an operator does: `get cluster -o yaml`, `edit`,
/// `replace -f` (the file kept in the lab's directory as `file`).
#[track_caller]
fn edit_stored_cluster(lab: &RealLab, name: &str, file: &str, edit: impl FnOnce(&mut Cluster)) {
    let yaml = kprov_ok(lab, &["get", "cluster", name, "-o", "yaml"]);
    let mut objects: Vec<Object> = kprov::spec::load_objects("stored", &yaml)
        .expect("stored objects parse")
        .into_iter()
        .map(|o| o.value)
        .collect();
    let mut edit = Some(edit);
    for o in &mut objects {
        if let Object::Cluster(c) = o
            && let Some(edit) = edit.take()
        {
            edit(c);
        }
    }
    let refs = objects.iter().map(|o| match o {
        Object::Cluster(c) => ObjectRef::Cluster(c),
        Object::InstanceGroup(g) => ObjectRef::InstanceGroup(g),
    });
    let path = lab.dir().join(file);
    std::fs::write(&path, kprov::spec::to_yaml_stream(refs).expect("yaml")).expect("spec");
    kprov_ok(lab, &["replace", "-f", path.to_str().expect("utf-8")]);
}
