//! Scenarios 4 (worker half) and 5 of issue 17 on one cluster (1 control plane + 2 workers,
//! a third worker host added later): scale up through the spec, `delete instance` of a worker
//! running pods behind a PodDisruptionBudget, then `rolling-update` in place after a label
//! change that is also a kubelet setting change (`--node-labels`), then after a kubelet
//! setting (`maxPods`) and a kube-proxy setting (`mode`) change.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kprov::spec::{Cluster, Object, ObjectRef};

use crate::support::realcluster::{self, RealCluster};
use crate::support::realhosts::{self, RealLab};

/// Edits the stored spec as an operator does: `get cluster -o yaml`, change it, `replace -f`.
fn edit_spec(c: &RealCluster, file: &str, edit: impl FnOnce(&mut Cluster)) {
    let yaml = c.kprov_ok(&["get", "cluster", &c.name, "-o", "yaml"]);
    let mut objects: Vec<Object> = kprov::spec::load_objects("stored", &yaml)
        .expect("stored objects parse")
        .into_iter()
        .map(|o| o.value)
        .collect();
    let mut edit = Some(edit);
    for o in &mut objects {
        if let Object::Cluster(cl) = o
            && let Some(edit) = edit.take()
        {
            edit(cl);
        }
    }
    let refs = objects.iter().map(|o| match o {
        Object::Cluster(c) => ObjectRef::Cluster(c),
        Object::InstanceGroup(g) => ObjectRef::InstanceGroup(g),
    });
    let path = c.lab.dir().join(file);
    std::fs::write(&path, kprov::spec::to_yaml_stream(refs).expect("yaml")).expect("spec");
    c.kprov_ok(&["replace", "-f", path.to_str().expect("utf-8")]);
}

/// Two replicas of the CoreDNS stand-in's HTTP server (NOT CoreDNS: its `/health` answers on
/// 8080; the image is on every node) and a PodDisruptionBudget keeping one of them available.
const WEB: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: web
          image: registry.k8s.io/coredns/coredns:v1.14.2
          imagePullPolicy: Never
          args: ["-dns.port=1053"]
          ports: [{containerPort: 8080}]
          readinessProbe: {httpGet: {path: /health, port: 8080}, periodSeconds: 1}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: default}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: web}}
"#;

/// `NODE PHASE READY` of each web pod (deleted pods included until they are gone).
fn web_pods(c: &RealCluster) -> Result<Vec<(String, String, bool)>, String> {
    let text = c.kubectl(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={range .items[*]}{.spec.nodeName} {.status.phase} {.status.containerStatuses[0].ready} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
    ])?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.to_string(),
                f.get(1)?.to_string(),
                f.get(2) == Some(&"true") && f.get(3).is_none(),
            ))
        })
        .collect())
}

/// A thread polling the API until stopped, recording the largest value `probe` saw and the
/// smallest (for "never more than N cordoned", "never fewer than N ready").
struct Watch {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicUsize>,
    min: Arc<AtomicUsize>,
    samples: Arc<AtomicUsize>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    fn start(probe: impl Fn() -> Option<usize> + Send + 'static) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicUsize::new(0));
        let min = Arc::new(AtomicUsize::new(usize::MAX));
        let samples = Arc::new(AtomicUsize::new(0));
        let (s, mx, mn, n) = (stop.clone(), max.clone(), min.clone(), samples.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                if let Some(v) = probe() {
                    mx.fetch_max(v, Ordering::SeqCst);
                    mn.fetch_min(v, Ordering::SeqCst);
                    n.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        Watch {
            stop,
            max,
            min,
            samples,
            handle: Some(handle),
        }
    }

    /// (min, max, samples)
    fn finish(mut self) -> (usize, usize, usize) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            h.join().expect("watch thread");
        }
        (
            self.min.load(Ordering::SeqCst),
            self.max.load(Ordering::SeqCst),
            self.samples.load(Ordering::SeqCst),
        )
    }
}

/// kubectl as a closure for a watch thread (owned arguments only).
fn kubectl_fn(c: &RealCluster) -> impl Fn(&[&str]) -> Option<String> + Send + 'static {
    let (bin, kubeconfig) = (c.bins.path("kubectl"), c.kubeconfig.clone());
    move |args: &[&str]| {
        let out = std::process::Command::new(&bin)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--request-timeout=10s")
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// `spec.kubelet.maxPods: 50` and `spec.kubeProxy.proxyMode: nftables` on the running cluster:
/// `update cluster --yes` rewrites kube-system's `kubelet-config` and `kube-proxy` ConfigMaps
/// (kubeadm's format, only those fields changed) and leaves the running nodes alone (capacity
/// still the kubelet's default 110); the `rolling-update` preview names both fields on every
/// node; `--yes` rewrites each node's /var/lib/kubelet/config.yaml and restarts the real
/// kubelet (new main PID), which reports `.status.capacity.pods` 50 to the real API server;
/// each kube-proxy is restarted and programs nftables (its `ip kube-proxy` table in the
/// host's namespace); every node stays Ready and never more than 1 is cordoned.
fn settings_roll(c: &RealCluster) {
    let name = c.name.as_str();
    let hosts = ["cp1", "worker2", "worker3"];
    let pid = |h: &str| {
        c.lab
            .host(h)
            .exec("systemctl show -p MainPID --value kubelet")
            .expect("exec")
            .trim()
            .to_string()
    };
    let capacity = |h: &str| {
        c.kubectl(&["get", "node", h, "-o", "jsonpath={.status.capacity.pods}"])
            .map(|s| s.trim().to_string())
    };
    let before: Vec<String> = hosts.iter().map(|h| pid(h)).collect();
    edit_spec(c, "settings.yaml", |cl| {
        cl.spec
            .kubelet
            .get_or_insert_with(Default::default)
            .max_pods = Some(50);
        cl.spec
            .kube_proxy
            .get_or_insert_with(Default::default)
            .proxy_mode = Some(kprov::spec::ProxyMode::Nftables);
    });
    let t = Instant::now();
    c.update_yes();
    eprintln!("update --yes (settings): {:?}", t.elapsed());
    let kubelet_cm = c.kubectl_ok(&[
        "get",
        "configmap",
        "-n",
        "kube-system",
        "kubelet-config",
        "-o",
        "jsonpath={.data.kubelet}",
    ]);
    assert!(
        kubelet_cm.lines().any(|l| l == "maxPods: 50")
            && kubelet_cm.contains("clientCAFile: /etc/kubernetes/pki/ca.crt"),
        "kubelet-config:\n{kubelet_cm}"
    );
    let proxy_cm = c.kubectl_ok(&[
        "get",
        "configmap",
        "-n",
        "kube-system",
        "kube-proxy",
        "-o",
        "jsonpath={.data.config\\.conf}",
    ]);
    assert!(
        proxy_cm.lines().any(|l| l == "mode: nftables")
            && proxy_cm.lines().any(|l| l.trim() == "maxPerCore: 0")
            && proxy_cm.contains("kubeconfig: /var/lib/kube-proxy/kubeconfig.conf"),
        "kube-proxy:\n{proxy_cm}"
    );
    for h in hosts {
        assert_eq!(capacity(h).as_deref(), Ok("110"), "{h} before the roll");
    }
    let preview = c.kprov_ok(&["rolling-update", "cluster", name]);
    eprintln!("rolling-update preview:\n{preview}");
    for h in hosts {
        let line = preview
            .lines()
            .find(|l| l.starts_with(h))
            .unwrap_or_else(|| panic!("preview names {h}:\n{preview}"));
        assert!(
            line.contains("spec.kubelet.maxPods (default) -> 50")
                && line.contains("spec.kubeProxy.proxyMode (default) -> nftables"),
            "{h}'s reason:\n{preview}"
        );
    }
    let kubectl = kubectl_fn(c);
    let watch = Watch::start(move || {
        let text = kubectl(&["get", "nodes", "--no-headers"])?;
        Some(
            text.lines()
                .filter(|l| l.contains("SchedulingDisabled"))
                .count(),
        )
    });
    let kubectl = kubectl_fn(c);
    let ready_watch = Watch::start(move || {
        let text = kubectl(&["get", "nodes", "--no-headers"])?;
        Some(
            text.lines()
                .filter(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .is_some_and(|s| s.starts_with("Ready"))
                })
                .count(),
        )
    });
    let t = Instant::now();
    c.kprov_ok(&["rolling-update", "cluster", name, "--yes"]);
    let (_, max_cordoned, samples) = watch.finish();
    let (min_ready, _, _) = ready_watch.finish();
    eprintln!(
        "rolling-update --yes (settings): {:?}; max cordoned {max_cordoned}, min Ready {min_ready} over {samples} samples",
        t.elapsed()
    );
    assert!(samples > 0, "the watch never reached the API");
    assert!(max_cordoned <= 1, "{max_cordoned} nodes cordoned at once");
    assert_eq!(min_ready, 3, "a node left Ready during the roll");
    for (i, h) in hosts.iter().enumerate() {
        let host = c.lab.host(h);
        let config = host
            .exec("cat /var/lib/kubelet/config.yaml")
            .expect("config.yaml");
        assert!(
            config.lines().any(|l| l == "maxPods: 50"),
            "{h}: /var/lib/kubelet/config.yaml:\n{config}"
        );
        assert_ne!(pid(h), before[i], "{h}'s kubelet was not restarted");
        c.wait_for(
            &format!("{h}'s capacity.pods 50"),
            Duration::from_secs(60),
            || match capacity(h) {
                Ok(n) if n == "50" => Ok(()),
                other => Err(format!("{other:?}")),
            },
        );
        c.wait_for(
            &format!("kube-proxy's nftables table on {h}"),
            Duration::from_secs(90),
            || {
                host.exec("nft list tables 2>&1").and_then(|t| {
                    if t.contains("ip kube-proxy") {
                        Ok(())
                    } else {
                        Err(t)
                    }
                })
            },
        );
    }
    c.wait_nodes_ready(&hosts, Duration::from_secs(60));
    let again = c.kprov_ok(&["rolling-update", "cluster", name]);
    assert!(
        !again.contains("spec.kubelet.maxPods"),
        "after the roll:\n{again}"
    );
}

/// Scenario 4, worker half, then scenario 5, on one cluster.
///
/// Scale up: a third worker host added to `spec.hosts` (as an operator does with `get -o yaml`
/// and `replace -f`) joins on `update --yes` and turns Ready. Then `delete instance` of a
/// worker running both pods of a Deployment with a PodDisruptionBudget (`minAvailable: 1`):
/// the real kubelet's pods are evicted through the API, at least one web pod stays ready
/// throughout (the PDB honoured), both pods run again on the other workers, the Node is gone
/// and the host is reset (no kubelet, no /etc/kubernetes).
///
/// Scenario 5: a label added to the remaining workers' hosts is a kubelet setting change
/// (`--node-labels` in the kubelet's flags file): the `rolling-update` preview names both
/// workers and why; `--yes` rewrites the flags and restarts the real kubelets (new main PID),
/// the Nodes carry the label, every node stays Ready and never more than `maxUnavailable` (1)
/// worker is cordoned at once. The workload is the CoreDNS stand-in's HTTP server, NOT CoreDNS.
#[test]
#[ignore = "passed alone 2026-11-26 (392 s at load ~20, with the settings roll); out of CI for its time budget (scenario_ha already costs 5-8 min there): scripts/test-real scale_delete_roll runs it"]
fn scenario_scale_delete_roll() {
    if realhosts::skip() {
        return;
    }
    let t0 = Instant::now();
    let mut lab = RealLab::start();
    lab.boot(&["cp1", "worker1", "worker2", "worker3"]);
    lab.route_pods();
    eprintln!("4 hosts booted in {:?}", t0.elapsed());
    let name = "scale.real.example";
    let cp_addr = lab.host("cp1").address;
    let c = RealCluster::create(
        &lab,
        name,
        &[
            ("cp1", &["control-plane"]),
            ("worker1", &["node"]),
            ("worker2", &["node"]),
        ],
        |cl| {
            cl.spec.api.get_or_insert_with(Default::default).endpoint =
                Some(format!("{cp_addr}:6443"));
        },
    );
    let took = c.update_yes();
    c.wait_nodes_ready(&["cp1", "worker1", "worker2"], Duration::from_secs(300));
    eprintln!("3 nodes Ready; update --yes took {took:?}");

    // Scale up: worker3 into the spec, then update.
    let w3 = lab.host("worker3");
    realcluster::write_bridge_cni(w3);
    let key = lab.client_key.display().to_string();
    let w3_addr = w3.address.to_string();
    edit_spec(&c, "scale-up.yaml", |cl| {
        let mut h = cl
            .spec
            .hosts
            .iter()
            .find(|h| h.name == "worker2")
            .expect("worker2 in spec")
            .clone();
        h.name = "worker3".into();
        h.address = w3_addr.clone();
        h.key_path = Some(key.clone());
        h.ip = None;
        h.access_ip = None;
        cl.spec.hosts.push(h);
    });
    let preview = c.kprov_ok(&["update", "cluster", name]);
    assert!(preview.contains("worker3"), "preview:\n{preview}");
    let t = Instant::now();
    c.update_yes();
    c.wait_nodes_ready(
        &["cp1", "worker1", "worker2", "worker3"],
        Duration::from_secs(300),
    );
    eprintln!(
        "scale up: worker3 Ready {:?} after update began",
        t.elapsed()
    );

    // Both web pods on worker1: the other workers cordoned while they schedule.
    c.kubectl_ok(&["cordon", "worker2", "worker3"]);
    let manifest = lab.dir().join("web.yaml");
    std::fs::write(&manifest, WEB).expect("manifest");
    c.kubectl_ok(&["apply", "-f", manifest.to_str().expect("utf-8")]);
    c.wait_for(
        "web pods ready on worker1",
        Duration::from_secs(180),
        || {
            let pods = web_pods(&c)?;
            let ok = pods
                .iter()
                .filter(|(n, p, r)| n == "worker1" && p == "Running" && *r)
                .count();
            if ok == 2 {
                Ok(())
            } else {
                Err(format!("{pods:?}"))
            }
        },
    );
    c.kubectl_ok(&["uncordon", "worker2", "worker3"]);

    // delete instance worker1: the PDB holds one pod ready throughout.
    let kubectl = kubectl_fn(&c);
    let watch = Watch::start(move || {
        let text = kubectl(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={range .items[*]}{.status.containerStatuses[0].ready} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
        ])?;
        Some(text.lines().filter(|l| l.trim() == "true").count())
    });
    let t = Instant::now();
    let out = c.kprov_ok(&["delete", "instance", name, "worker1", "--yes"]);
    let (min_ready, _, samples) = watch.finish();
    eprintln!(
        "delete instance worker1: {:?}; web pods ready: min {min_ready} over {samples} samples\n{out}",
        t.elapsed()
    );
    assert!(samples > 0, "the watch never reached the API");
    assert!(
        min_ready >= 1,
        "the PodDisruptionBudget was not honoured: {min_ready} web pods ready at one point"
    );
    c.wait_for(
        "web pods ready on worker2/worker3",
        Duration::from_secs(180),
        || {
            let pods = web_pods(&c)?;
            let ok = pods
                .iter()
                .filter(|(n, p, r)| (n == "worker2" || n == "worker3") && p == "Running" && *r)
                .count();
            if ok == 2 && pods.len() == 2 {
                Ok(())
            } else {
                Err(format!("{pods:?}"))
            }
        },
    );
    c.wait_nodes_ready(&["cp1", "worker2", "worker3"], Duration::from_secs(60));
    let w1 = lab.host("worker1");
    let left = w1
        .exec(
            "systemctl is-active kubelet 2>/dev/null | grep -x active || true; \
             pgrep -x kubelet || true; ls /etc/kubernetes/manifests /etc/kubernetes/kubelet.conf 2>/dev/null || true",
        )
        .expect("exec");
    assert_eq!(left.trim(), "", "worker1 after delete instance");
    let spec = c.kprov_ok(&["get", "cluster", name, "-o", "yaml"]);
    assert!(
        !spec.contains("name: worker1"),
        "worker1 still in the spec:\n{spec}"
    );

    // Scenario 5: a label on the workers' hosts (their kubelet's --node-labels).
    let pid = |h: &str| {
        lab.host(h)
            .exec("systemctl show -p MainPID --value kubelet")
            .expect("exec")
            .trim()
            .to_string()
    };
    let before: Vec<String> = ["cp1", "worker2", "worker3"]
        .iter()
        .map(|h| pid(h))
        .collect();
    edit_spec(&c, "labels.yaml", |cl| {
        for h in cl
            .spec
            .hosts
            .iter_mut()
            .filter(|h| h.name.starts_with("worker"))
        {
            h.labels.insert("example.com/tier".into(), "web".into());
        }
    });
    let preview = c.kprov_ok(&["rolling-update", "cluster", name]);
    eprintln!("rolling-update preview:\n{preview}");
    for w in ["worker2", "worker3"] {
        let line = preview
            .lines()
            .find(|l| l.contains(w))
            .unwrap_or_else(|| panic!("preview names {w}:\n{preview}"));
        assert!(line.contains("label"), "{w}'s reason:\n{preview}");
    }
    assert!(
        !preview
            .lines()
            .any(|l| l.contains("cp1") && l.contains("label")),
        "cp1 would roll:\n{preview}"
    );
    let kubectl = kubectl_fn(&c);
    let watch = Watch::start(move || {
        let text = kubectl(&["get", "nodes", "--no-headers"])?;
        Some(
            text.lines()
                .filter(|l| l.contains("SchedulingDisabled"))
                .count(),
        )
    });
    let kubectl = kubectl_fn(&c);
    let ready_watch = Watch::start(move || {
        let text = kubectl(&["get", "nodes", "--no-headers"])?;
        Some(
            text.lines()
                .filter(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .is_some_and(|s| s.starts_with("Ready"))
                })
                .count(),
        )
    });
    let t = Instant::now();
    c.kprov_ok(&["rolling-update", "cluster", name, "--yes"]);
    let (_, max_cordoned, samples) = watch.finish();
    let (min_ready, _, _) = ready_watch.finish();
    eprintln!(
        "rolling-update --yes: {:?}; max cordoned {max_cordoned}, min Ready {min_ready} over {samples} samples",
        t.elapsed()
    );
    assert!(samples > 0, "the watch never reached the API");
    assert!(max_cordoned <= 1, "{max_cordoned} nodes cordoned at once");
    assert_eq!(min_ready, 3, "a node left Ready during the roll");
    for (i, h) in ["cp1", "worker2", "worker3"].iter().enumerate() {
        let host = lab.host(h);
        let flags = host
            .exec("cat /var/lib/kubelet/kubeadm-flags.env")
            .expect("flags");
        let now = pid(h);
        if *h == "cp1" {
            assert_eq!(now, before[i], "cp1's kubelet restarted");
            assert!(!flags.contains("example.com/tier"), "{flags}");
            continue;
        }
        assert!(flags.contains("example.com/tier=web"), "{h}: {flags}");
        assert_ne!(now, before[i], "{h}'s kubelet was not restarted");
        let label = c.kubectl_ok(&[
            "get",
            "node",
            h,
            "-o",
            "jsonpath={.metadata.labels.example\\.com/tier}",
        ]);
        assert_eq!(label, "web", "{h}'s label");
    }
    c.wait_nodes_ready(&["cp1", "worker2", "worker3"], Duration::from_secs(60));
    let again = c.kprov_ok(&["rolling-update", "cluster", name]);
    assert!(
        !again
            .lines()
            .any(|l| l.contains("worker") && l.contains("label")),
        "after the roll:\n{again}"
    );

    // Scenario 5, second half: a kubelet setting and a kube-proxy setting.
    settings_roll(&c);
    eprintln!("scenario total {:?}", t0.elapsed());

    if realhosts::keep_requested() {
        println!("KUBECONFIG={}", c.kubeconfig.display());
        return;
    }
    drop(c);
    let left = lab.teardown_and_check();
    assert!(left.is_empty(), "left after teardown: {left:#?}");
}
