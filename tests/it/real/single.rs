//! Scenarios 1, 7, 4 (worker half), 5 and 9 of issue 17 on one cluster (1 control plane + 1
//! worker, a second worker added later): install, what a real cluster shows, a converged
//! re-run, validation, backup and restore, scale up, `delete instance`, two rolls in place
//! (real/scale.rs), then `delete cluster`. One install for all of them: CI's time budget.

use std::time::{Duration, Instant};

use super::scale;
use crate::support::realcluster::{CP1_WORKER1_STATIC_PODS, RealCluster, present};
use crate::support::realhosts::RealLab;
use crate::support::snapshot;

/// A Deployment of the CoreDNS stand-in's HTTP server (its `/health` answers `OK` on 8080;
/// the image is already on every node, and it is NOT CoreDNS), pinned to `node`, behind a
/// ClusterIP Service on port 80.
fn web(node: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: default}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      nodeSelector: {{kubernetes.io/hostname: {node}}}
      containers:
        - name: web
          image: registry.k8s.io/coredns/coredns:v1.14.2
          imagePullPolicy: Never
          args: ["-dns.port=1053"]
          ports: [{{containerPort: 8080}}]
          readinessProbe: {{httpGet: {{path: /health, port: 8080}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  selector: {{app: web}}
  ports: [{{port: 80, targetPort: 8080}}]
"#
    )
}

/// Scenario 1 (`single`): 1 control plane + 1 worker through the kprov binary. The preview
/// changes no host and not the store; `update --yes` brings both nodes Ready with every
/// control-plane static pod and kube-proxy Running (through the real API server and real
/// kubectl from this machine); pods of a Deployment on the worker answer through a Service
/// from the control plane (kube-proxy's rules, the pod network's routes); a second run has
/// nothing to do; `validate cluster` passes. Scenario 7 on the lone stacked member: `backup
/// etcd`, a ConfigMap deleted and another created, `restore etcd`: the deleted one is back, the
/// later one gone, etcd and the API server Running. Scenarios 4 (worker half) and 5
/// (`scale::scale_delete_roll`): worker2 joins through the spec, worker1 with the web pods
/// behind a PodDisruptionBudget is deleted, two rolls in place (a label; maxPods and
/// kube-proxy's mode). Then scenario 9: `delete cluster --yes`
/// leaves no kubelet, containerd task, static pod or etcd on any host.
#[test]
fn scenario_single() {
    // worker2 is booted now (a lab boots before its cluster borrows it) and joins later, in
    // scale::scale_delete_roll.
    let Some(lab) = RealLab::for_cluster(&["cp1", "worker1", "worker2"]) else {
        return;
    };
    let name = "single.real.example";
    let c = RealCluster::create(
        &lab,
        name,
        &[("cp1", &["control-plane"]), ("worker1", &["node"])],
        |_| {},
    );

    // The preview: read-only on the hosts and in the store.
    let store = lab.dir().join("state");
    let before = snapshot(&store);
    let preview = c.kprov_ok(&["update", "cluster", name]);
    for h in lab.hosts() {
        assert!(
            h.name == "worker2" || preview.contains(&h.name),
            "preview names {}:\n{preview}",
            h.name
        );
        assert_eq!(
            present(h),
            Vec::<&str>::new(),
            "{} after the preview",
            h.name
        );
    }
    assert_eq!(snapshot(&store), before, "the preview changed the store");

    let took = c.update_yes();
    eprintln!("update --yes: {took:?}");
    // Generous: kubeadm join returns before the kubelet registers, and a loaded 2-core
    // machine can take minutes there.
    c.wait_nodes_ready(&["cp1", "worker1"], Duration::from_secs(300));
    eprintln!("2 nodes Ready {:?} after update --yes began", took);

    // The real control plane: static pods and kube-proxy Running and ready. CoreDNS is the
    // archive's stand-in (health and readiness only): its pods are counted, not used for DNS.
    c.wait_kube_system(
        "control plane and kube-proxy Running",
        Duration::from_secs(120),
        &CP1_WORKER1_STATIC_PODS,
        2,
    );
    // The version kubeadm installed is the spec's.
    let version = c.kubectl_ok(&[
        "get",
        "node",
        "cp1",
        "-o",
        "jsonpath={.status.nodeInfo.kubeletVersion}",
    ]);
    assert_eq!(version, "v1.36.2");
    // kube-proxy runs with the spec's configuration (conntrack left to the kernel).
    let proxy_conf = c.kubectl_ok(&[
        "-n",
        "kube-system",
        "get",
        "configmap",
        "kube-proxy",
        "-o",
        "jsonpath={.data.config\\.conf}",
    ]);
    assert!(
        proxy_conf.contains("maxPerCore: 0"),
        "kube-proxy config:\n{proxy_conf}"
    );

    // Workload: pods on the worker, reached through the Service from the control plane.
    let manifest = lab.dir().join("web.yaml");
    std::fs::write(&manifest, web("worker1")).expect("manifest");
    c.kubectl_ok(&["apply", "-f", manifest.to_str().expect("utf-8")]);
    c.wait_for("web pods Running on worker1", Duration::from_secs(120), || {
        let pods = c.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={range .items[*]}{.spec.nodeName} {.status.phase} {.status.containerStatuses[0].ready}{\"\\n\"}{end}"])?;
        let ok = pods.lines().filter(|l| *l == "worker1 Running true").count();
        if ok == 2 { Ok(()) } else { Err(pods) }
    });
    let cluster_ip = c.kubectl_ok(&["get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let cp1 = lab.host("cp1");
    let answer = c.wait_for(
        "the Service answers from cp1",
        Duration::from_secs(60),
        || {
            cp1.exec(&format!(
                "curl -fsS --max-time 3 http://{cluster_ip}/health"
            ))
        },
    );
    assert_eq!(answer.trim(), "OK");

    // A second run: every step re-checked on the real hosts, none changed anything.
    let t = Instant::now();
    let again = c.kprov_ok(&["update", "cluster", name, "--yes"]);
    eprintln!("second update --yes: {:?}", t.elapsed());
    for h in ["cp1", "worker1"] {
        assert!(
            again
                .lines()
                .any(|l| l.starts_with(h) && l.contains("ok, no changes") && l.contains(" 0 of ")),
            "second run, {h}:\n{again}"
        );
    }

    let validate = c.kprov(&["validate", "cluster", name, "--wait", "2m"]);
    assert!(
        validate.status.success(),
        "validate cluster:\n{}{}",
        String::from_utf8_lossy(&validate.stdout),
        String::from_utf8_lossy(&validate.stderr)
    );

    // Scenario 7 on stacked etcd with one member (kubeadm's static pod): backup, the ConfigMap
    // from before it deleted and another created, `restore etcd`: the etcd static pod runs on
    // the restored data (the tier's etcdutl is a stand-in running etcdctl 3.4's restore, which
    // etcd 3.6 accepts here because the lone member keeps its ID: realk8s::ETCDUTL_STANDIN),
    // the API server is back with the snapshot's objects, both nodes Ready.
    c.kubectl_ok(&["create", "configmap", "before-backup", "--from-literal=k=v"]);
    let record = c.backup_etcd();
    assert_eq!(record["etcd"], "Stacked", "{record}");
    let id = record["id"].as_str().expect("backup id");
    let took = c.restore_roundtrip(id, "before-backup", "after-backup");
    eprintln!("restore etcd --yes: {took:?}");
    c.wait_for(
        "etcd and the API server static pods Running after the restore",
        Duration::from_secs(180),
        || {
            let pods = c.running_kube_system_pods()?;
            if ["etcd-cp1", "kube-apiserver-cp1"]
                .iter()
                .all(|p| pods.iter().any(|r| r == p))
            {
                Ok(())
            } else {
                Err(format!("{pods:?}"))
            }
        },
    );
    let data = lab.host("cp1").exec("ls /var/lib/etcd").expect("exec");
    assert_eq!(data, "kprov-previous\nmember\n", "cp1's /var/lib/etcd");
    c.wait_nodes_ready(&["cp1", "worker1"], Duration::from_secs(180));

    // Scenarios 4 (worker half) and 5 on this cluster: worker2 joins, worker1 is deleted, two
    // rolls in place.
    scale::scale_delete_roll(&c);

    if c.kept() {
        return;
    }

    // Scenario 9: delete cluster removes Kubernetes from every host (worker1 was reset by
    // delete instance already).
    c.delete_and_check(
        "systemctl is-active kubelet etcd 2>/dev/null | grep -x active || true; \
         pgrep -x kubelet || true; pgrep -x etcd || true; pgrep -x kube-apiserver || true; \
         ls /etc/kubernetes/manifests 2>/dev/null || true; \
         if systemctl is-active --quiet containerd; then ctr -n k8s.io tasks ls -q; fi",
    );
    lab.teardown_clean();
}
