//! Scenarios 4 (worker half) and 5 of issue 17, run on `single`'s cluster (real/single.rs)
//! before its `delete cluster`, so CI pays for these steps and not for another install: scale
//! up through the spec (a second worker host), `delete instance` of the first worker running
//! pods behind a PodDisruptionBudget, then `rolling-update` in place after a label change that
//! is also a kubelet setting change (`--node-labels`), then after a kubelet setting (`maxPods`)
//! and a kube-proxy setting (`mode`) change.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::realcluster::{self, RealCluster, Watch};

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

/// One change of one Node as the real API server's watch delivered it.
#[derive(Debug, Clone)]
struct NodeEvent {
    /// Since the watch started.
    at: Duration,
    node: String,
    cordoned: bool,
    /// The Ready condition's status ("True", "False", "Unknown", "" when absent).
    ready: String,
    /// The Ready condition's lastHeartbeatTime, as served.
    heartbeat: Option<chrono::DateTime<chrono::FixedOffset>>,
}

/// `kprov ARGS` (which must succeed) while `kubectl get nodes --watch` streams every change of
/// every Node: each write the API server stores (a cordon, each status a kubelet posts) is an
/// event, so a NotReady between two samples cannot be missed as the 300 ms sampling could.
/// The watch is established (every node listed once) before kprov starts, and must still be
/// running when kprov returns (else the timeline has a hole and the test fails).
#[track_caller]
fn roll_watching_node_events(c: &RealCluster, nodes: usize, args: &[&str]) -> Vec<NodeEvent> {
    let template = "jsonpath={.metadata.name}|{.spec.unschedulable}|{.status.conditions[?(@.type==\"Ready\")].status}|{.status.conditions[?(@.type==\"Ready\")].lastHeartbeatTime}{\"\\n\"}";
    let mut child = Command::new(c.bins.path("kubectl"))
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args(["get", "nodes", "--watch", "-o", template])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("kubectl get nodes --watch");
    let stdout = child.stdout.take().expect("kubectl's stdout");
    let events: Arc<Mutex<Vec<NodeEvent>>> = Arc::default();
    let t0 = Instant::now();
    let sink = events.clone();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let f: Vec<&str> = line.split('|').collect();
            let [node, cordoned, ready, heartbeat] = f[..] else {
                eprintln!("node watch: unexpected line {line:?}");
                continue;
            };
            let e = NodeEvent {
                at: t0.elapsed(),
                node: node.to_string(),
                cordoned: cordoned == "true",
                ready: ready.to_string(),
                heartbeat: chrono::DateTime::parse_from_rfc3339(heartbeat).ok(),
            };
            eprintln!(
                "node event at {:.2} s: {} cordoned={} Ready={} heartbeat={heartbeat}",
                e.at.as_secs_f64(),
                e.node,
                e.cordoned,
                e.ready
            );
            sink.lock().expect("events").push(e);
        }
    });
    let listed = Instant::now() + Duration::from_secs(60);
    while events.lock().expect("events").len() < nodes {
        if Instant::now() > listed || child.try_wait().expect("kubectl").is_some() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the node watch never listed {nodes} nodes");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.kprov_ok(args)));
    eprintln!("kprov returned at {:.2} s", t0.elapsed().as_secs_f64());
    // Events the API stored before kprov returned reach the watch within moments.
    std::thread::sleep(Duration::from_secs(2));
    let alive = child.try_wait().expect("kubectl").is_none();
    let _ = child.kill();
    let _ = child.wait();
    let _ = reader.join();
    if let Err(p) = out {
        std::panic::resume_unwind(p);
    }
    assert!(
        alive,
        "the node watch ended while kprov ran: its timeline has a hole"
    );
    events.lock().expect("events").clone()
}

/// What maxUnavailable 1 means on the watch's timeline: never two nodes cordoned, nor two
/// cordoned or not Ready at once; every node in `restarted` (whose kubelet the roll restarted)
/// uncordoned only after a Ready with a heartbeat newer than the one it showed when it was
/// cordoned (the new kubelet's, not the old one's stale Ready), and the next node cordoned
/// only after that; every node Ready and schedulable at the end.
#[track_caller]
fn assert_roll_timeline(events: &[NodeEvent], nodes: &[&str], restarted: &[&str]) {
    use std::collections::BTreeMap;
    let story = || {
        events
            .iter()
            .map(|e| {
                format!(
                    "{:.2}s {} cordoned={} Ready={} hb={:?}",
                    e.at.as_secs_f64(),
                    e.node,
                    e.cordoned,
                    e.ready,
                    e.heartbeat.map(|h| h.to_rfc3339())
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut state: BTreeMap<&str, &NodeEvent> = BTreeMap::new();
    // (node, index of its cordon, heartbeat then, index of its fresh Ready, of its uncordon).
    let mut touched: Vec<(String, usize, Option<chrono::DateTime<chrono::FixedOffset>>)> =
        Vec::new();
    let mut fresh: BTreeMap<String, usize> = BTreeMap::new();
    let mut uncordoned: BTreeMap<String, usize> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        let was = state.insert(e.node.as_str(), e);
        if i >= nodes.len() {
            if e.cordoned && was.is_some_and(|w| !w.cordoned) {
                touched.push((e.node.clone(), i, was.and_then(|w| w.heartbeat)));
            }
            if !e.cordoned && was.is_some_and(|w| w.cordoned) {
                uncordoned.entry(e.node.clone()).or_insert(i);
            }
            if let Some((_, _, before)) = touched.iter().rev().find(|t| t.0 == e.node)
                && e.ready == "True"
                && e.heartbeat > *before
            {
                fresh.entry(e.node.clone()).or_insert(i);
            }
        }
        if i + 1 >= nodes.len() {
            let cordoned = state.values().filter(|s| s.cordoned).count();
            let unavailable = state
                .values()
                .filter(|s| s.cordoned || s.ready != "True")
                .count();
            assert!(
                cordoned <= 1,
                "{cordoned} nodes cordoned at once:\n{}",
                story()
            );
            assert!(
                unavailable <= 1,
                "{unavailable} nodes cordoned or not Ready at once:\n{}",
                story()
            );
        }
    }
    let order: Vec<&str> = touched.iter().map(|t| t.0.as_str()).collect();
    let mut want: Vec<&str> = restarted.to_vec();
    want.sort_unstable();
    let mut got = order.clone();
    got.sort_unstable();
    assert_eq!(got, want, "nodes cordoned once each:\n{}", story());
    for (k, (node, _, before)) in touched.iter().enumerate() {
        let ready = *fresh.get(node).unwrap_or_else(|| {
            panic!(
                "{node} never showed a Ready newer than {before:?} (its status when cordoned):\n{}",
                story()
            )
        });
        let un = *uncordoned
            .get(node)
            .unwrap_or_else(|| panic!("{node} never uncordoned:\n{}", story()));
        assert!(
            ready < un,
            "{node} uncordoned before its restarted kubelet posted Ready:\n{}",
            story()
        );
        if let Some((next, at, _)) = touched.get(k + 1) {
            assert!(
                ready < *at,
                "{next} cordoned before {node}'s restarted kubelet posted Ready:\n{}",
                story()
            );
        }
    }
    for n in nodes {
        let last = state
            .get(n)
            .unwrap_or_else(|| panic!("{n} never seen:\n{}", story()));
        assert!(
            last.ready == "True" && !last.cordoned,
            "{n} not Ready and schedulable after the roll:\n{}",
            story()
        );
    }
}

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

/// `spec.kubelet.maxPods: 50` and `spec.kubeProxy.proxyMode: nftables` on the running cluster:
/// `update cluster --yes` rewrites kube-system's `kubelet-config` and `kube-proxy` ConfigMaps
/// (kubeadm's format, only those fields changed) and leaves the running nodes alone (capacity
/// still the kubelet's default 110); the `rolling-update` preview names both fields on every
/// node; `--yes` rewrites each node's /var/lib/kubelet/config.yaml and restarts the real
/// kubelet (new main PID), which reports `.status.capacity.pods` 50 to the real API server;
/// each kube-proxy is restarted and programs nftables (its `ip kube-proxy` table in the
/// host's namespace); never more than 1 node is cordoned, nor more than 1 cordoned or NotReady at once (a real
/// kubelet's Node reads NotReady for a moment after its restart), and all are Ready after the
/// roll (`roll_watching_node_events`).
fn settings_roll(c: &RealCluster) {
    let name = c.name.as_str();
    let hosts = ["cp1", "worker2"];
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
    c.edit_spec("settings.yaml", |cl| {
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
    let t = Instant::now();
    let events = roll_watching_node_events(c, 2, &["rolling-update", "cluster", name, "--yes"]);
    eprintln!("rolling-update --yes (settings): {:?}", t.elapsed());
    assert_roll_timeline(&events, &hosts, &hosts);
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
    let again = c.kprov_ok(&["rolling-update", "cluster", name]);
    assert!(
        !again.contains("spec.kubelet.maxPods"),
        "after the roll:\n{again}"
    );
}

/// Scenario 4, worker half, then scenario 5, on `single`'s cluster after its restore (cp1 and
/// worker1 Ready, worker2 booted and not yet in the spec, `web` pinned to worker1).
///
/// Scale up: worker2 added to `spec.hosts` (as an operator does with `get -o yaml` and
/// `replace -f`) joins on `update --yes` and turns Ready. Before that `web` loses its node
/// pin and gets a PodDisruptionBudget (`minAvailable: 1`), its two pods Running on worker1
/// (the only worker then). `delete instance` of worker1: the real kubelet's pods are evicted
/// through the API, at least one web pod stays ready throughout (the PDB honoured), both run
/// again on worker2, the Node is gone and the host is reset (no kubelet, no /etc/kubernetes).
///
/// Scenario 5: a label added to the worker's host is a kubelet setting change
/// (`--node-labels` in the kubelet's flags file): the `rolling-update` preview names worker2
/// and why, not cp1; `--yes` rewrites the flags and restarts the real kubelet (new main PID;
/// cp1's untouched), the Node carries the label, never more than `maxUnavailable` (1) node is
/// cordoned, nor unavailable (cordoned or NotReady), at once and all are Ready after the roll (the PDB deleted first: with one worker its pods
/// have nowhere to go while it drains). Then `settings_roll`. The workload is the CoreDNS
/// stand-in's HTTP server, NOT CoreDNS.
pub(super) fn scale_delete_roll(c: &RealCluster) {
    let t0 = Instant::now();
    let name = c.name.as_str();
    let lab = c.lab;

    // web unpinned, with its PDB: both pods on worker1, the only worker.
    let manifest = lab.dir().join("web-pdb.yaml");
    std::fs::write(&manifest, WEB).expect("manifest");
    c.kubectl_ok(&["apply", "-f", manifest.to_str().expect("utf-8")]);
    c.wait_for(
        "web pods (unpinned) ready on worker1",
        Duration::from_secs(180),
        || {
            let pods = web_pods(c)?;
            let ok = pods
                .iter()
                .filter(|(n, p, r)| n == "worker1" && p == "Running" && *r)
                .count();
            if ok == 2 && pods.len() == 2 {
                Ok(())
            } else {
                Err(format!("{pods:?}"))
            }
        },
    );

    // Scale up: worker2 into the spec, then update.
    let w2 = lab.host("worker2");
    realcluster::write_bridge_cni(w2);
    let key = lab.client_key.display().to_string();
    let w2_addr = w2.address.to_string();
    c.edit_spec("scale-up.yaml", |cl| {
        let mut h = cl
            .spec
            .hosts
            .iter()
            .find(|h| h.name == "worker1")
            .expect("worker1 in spec")
            .clone();
        h.name = "worker2".into();
        h.address = w2_addr.clone();
        h.key_path = Some(key.clone());
        h.ip = None;
        h.access_ip = None;
        cl.spec.hosts.push(h);
    });
    let preview = c.kprov_ok(&["update", "cluster", name]);
    assert!(preview.contains("worker2"), "preview:\n{preview}");
    let t = Instant::now();
    c.update_yes();
    c.wait_nodes_ready(&["cp1", "worker1", "worker2"], Duration::from_secs(300));
    eprintln!(
        "scale up: worker2 Ready {:?} after update began",
        t.elapsed()
    );

    // delete instance worker1: the PDB holds one pod ready throughout.
    let kubectl = c.kubectl_fn();
    let watch = Watch::start(move || {
        let text = kubectl(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={range .items[*]}{.status.containerStatuses[0].ready} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
        ])?;
        Some(vec![text.lines().filter(|l| l.trim() == "true").count()])
    });
    let t = Instant::now();
    let out = c.kprov_ok(&["delete", "instance", name, "worker1", "--yes"]);
    let seen = watch.finish();
    let min_ready = seen.min(0);
    eprintln!(
        "delete instance worker1: {:?}; web pods ready: min {min_ready} over {} samples\n{out}",
        t.elapsed(),
        seen.samples
    );
    assert!(seen.samples > 1, "the watch never reached the API");
    assert!(
        min_ready >= 1,
        "the PodDisruptionBudget was not honoured: {min_ready} web pods ready at one point"
    );
    c.wait_for(
        "web pods ready on worker2",
        Duration::from_secs(180),
        || {
            let pods = web_pods(c)?;
            let ok = pods
                .iter()
                .filter(|(n, p, r)| n == "worker2" && p == "Running" && *r)
                .count();
            if ok == 2 && pods.len() == 2 {
                Ok(())
            } else {
                Err(format!("{pods:?}"))
            }
        },
    );
    // Exactly these nodes: worker1's Node is gone.
    c.wait_nodes_ready(&["cp1", "worker2"], Duration::from_secs(60));
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

    // With one worker left the budget could never be met while it drains (both pods would
    // have nowhere to go): the rolls below evict the web pods without it.
    c.kubectl_ok(&["delete", "poddisruptionbudget", "web"]);

    // Scenario 5: a label on the worker's host (its kubelet's --node-labels).
    let pid = |h: &str| {
        lab.host(h)
            .exec("systemctl show -p MainPID --value kubelet")
            .expect("exec")
            .trim()
            .to_string()
    };
    let nodes = ["cp1", "worker2"];
    let before: Vec<String> = nodes.iter().map(|h| pid(h)).collect();
    c.edit_spec("labels.yaml", |cl| {
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
    let line = preview
        .lines()
        .find(|l| l.contains("worker2"))
        .unwrap_or_else(|| panic!("preview names worker2:\n{preview}"));
    assert!(line.contains("label"), "worker2's reason:\n{preview}");
    assert!(
        !preview
            .lines()
            .any(|l| l.contains("cp1") && l.contains("label")),
        "cp1 would roll:\n{preview}"
    );
    let t = Instant::now();
    let events = roll_watching_node_events(c, 2, &["rolling-update", "cluster", name, "--yes"]);
    eprintln!("rolling-update --yes (labels): {:?}", t.elapsed());
    // Only worker2's labels changed: cp1 is not cordoned, its kubelet not restarted.
    assert_roll_timeline(&events, &nodes, &["worker2"]);
    for (i, h) in nodes.iter().enumerate() {
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
    let again = c.kprov_ok(&["rolling-update", "cluster", name]);
    assert!(
        !again
            .lines()
            .any(|l| l.contains("worker") && l.contains("label")),
        "after the roll:\n{again}"
    );

    // Scenario 5, second half: a kubelet setting and a kube-proxy setting.
    settings_roll(c);
    eprintln!("scenarios 4 (worker half) and 5: {:?}", t0.elapsed());
}
