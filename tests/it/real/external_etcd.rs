//! Scenario 3 of issue 17: external etcd on three dedicated hosts (kprov's host etcd service from
//! the archive's etcd 3.6), one control plane and one worker.

use std::time::{Duration, Instant};

use crate::support::realcluster::RealCluster;
use crate::support::realhosts::RealLab;

const ETCD_HOSTS: [&str; 3] = ["etcd1", "etcd2", "etcd3"];

/// `etcdctl ARGS` on `host` with kprov's health-check client certificate, over every member's
/// address (not localhost: what the API server uses).
fn etcdctl(lab: &RealLab, host: &str, args: &str) -> Result<String, String> {
    let endpoints: Vec<String> = ETCD_HOSTS
        .iter()
        .map(|h| format!("https://{}:2379", lab.host(h).address))
        .collect();
    lab.host(host).exec(&format!(
        "ETCDCTL_API=3 etcdctl --endpoints {} --cacert /etc/kubernetes/pki/etcd/ca.crt \
         --cert /etc/kubernetes/pki/etcd/healthcheck-client.crt \
         --key /etc/kubernetes/pki/etcd/healthcheck-client.key --command-timeout=10s {args} 2>&1",
        endpoints.join(",")
    ))
}

/// Scenario 3 (`external_etcd`): the inventory gives etcd1-3 the `etcd` role only, so kprov
/// makes etcd External: a systemd service (`Type=notify`) on each etcd host, three healthy
/// members seen over the hosts' addresses with kprov's client certificates, no etcd static pod
/// on the control plane, the API server storing through them (a ConfigMap written by kubectl
/// reads back, `/livez/etcd` ok), both nodes Ready, `backup etcd` saving a snapshot from a
/// host-deployed member; `restore etcd` of it (scenario 7: the real etcd 3.6 on data restored
/// by the tier's etcdutl stand-in, etcdctl 3.4's restore code) brings back the ConfigMap deleted
/// after the backup and not the one created after it, with three healthy members; then `delete
/// cluster --yes` leaves no etcd running and no etcd data.
/// `spec.api.endpoint` is the control plane's address (the local API proxy's image cannot be
/// pulled in the tier).
#[test]
fn scenario_external_etcd() {
    let Some(lab) = RealLab::for_cluster(&["etcd1", "etcd2", "etcd3", "cp1", "worker1"]) else {
        return;
    };
    let name = "etcd.real.example";
    let endpoint = format!("{}:6443", lab.host("cp1").address);
    let c = RealCluster::with_endpoint(
        &lab,
        name,
        &[
            ("etcd1", &["etcd"]),
            ("etcd2", &["etcd"]),
            ("etcd3", &["etcd"]),
            ("cp1", &["control-plane"]),
            ("worker1", &["node"]),
        ],
        endpoint,
    );
    let spec = c.kprov_ok(&["get", "cluster", name, "-o", "yaml"]);
    assert!(
        spec.contains("type: External"),
        "etcd on dedicated hosts is External:\n{spec}"
    );

    let t = Instant::now();
    let up = c.kprov(&["update", "cluster", name, "--yes", "--accept-new-host-keys"]);
    if !up.status.success() {
        // What the hosts' containerd said (a join failed once on a CRI plugin not loaded).
        for h in lab.hosts() {
            let j = h
                .exec("journalctl -u containerd --no-pager 2>&1 | grep -iE 'error|fail|cri' | tail -15")
                .unwrap_or_default();
            eprintln!("--- {} containerd:\n{j}", h.name);
        }
        panic!(
            "update --yes: {:?}\n{}\n{}",
            up.status,
            String::from_utf8_lossy(&up.stdout),
            String::from_utf8_lossy(&up.stderr)
        );
    }
    eprintln!("update --yes: {:?}", t.elapsed());
    c.kprov_ok(&[
        "export",
        "kubeconfig",
        name,
        "--kubeconfig",
        c.kubeconfig.to_str().expect("utf-8"),
    ]);
    c.wait_nodes_ready(&["cp1", "worker1"], Duration::from_secs(300));
    eprintln!("2 nodes Ready");

    // etcd is kprov's systemd service on each etcd host, a notify unit, and on no other host.
    for h in ETCD_HOSTS {
        let said = lab
            .host(h)
            .exec("systemctl is-active etcd; systemctl show -p Type --value etcd")
            .unwrap_or_else(|e| panic!("{h}: {e}"));
        assert_eq!(said, "active\nnotify\n", "{h}: etcd.service");
    }
    for h in ["cp1", "worker1"] {
        let said = lab
            .host(h)
            .exec("pgrep -x etcd || true; ls /etc/kubernetes/manifests 2>/dev/null || true")
            .expect("exec");
        assert!(
            !said.contains("etcd"),
            "{h}: an etcd process or manifest on a non-etcd host:\n{said}"
        );
    }
    // Three started members, all healthy, over the hosts' addresses.
    let members = c.wait_for("3 started members", Duration::from_secs(60), || {
        let m = etcdctl(&lab, "etcd1", "member list")?;
        let started = m.lines().filter(|l| l.contains(", started, ")).count();
        if started == 3 { Ok(m) } else { Err(m) }
    });
    for h in ETCD_HOSTS {
        let a = lab.host(h).address;
        assert!(
            members.contains(&format!(", {h}, https://{a}:2380, https://{a}:2379")),
            "{h} ({a}) in the member list:\n{members}"
        );
    }
    let health = c.wait_for("every member healthy", Duration::from_secs(60), || {
        let out = etcdctl(&lab, "etcd2", "endpoint health --cluster")?;
        let healthy = out.lines().filter(|l| l.contains("is healthy")).count();
        if healthy == 3 { Ok(out) } else { Err(out) }
    });
    eprintln!("{health}");

    // The API server stores through them.
    let apiserver = lab
        .host("cp1")
        .exec("cat /etc/kubernetes/manifests/kube-apiserver.yaml")
        .expect("manifest");
    for h in ETCD_HOSTS {
        let url = format!("https://{}:2379", lab.host(h).address);
        assert!(
            apiserver.contains(&url),
            "the API server's --etcd-servers lack {url}:\n{apiserver}"
        );
    }
    let livez = c.wait_for("livez/etcd", Duration::from_secs(60), || {
        c.kubectl(&["get", "--raw", "/livez/etcd"])
    });
    assert_eq!(livez.trim(), "ok");
    c.kubectl_ok(&[
        "create",
        "configmap",
        "stored-in-etcd",
        "--from-literal=written=by-kubectl",
    ]);
    let read = c.kubectl_ok(&[
        "get",
        "configmap",
        "stored-in-etcd",
        "-o",
        "jsonpath={.data.written}",
    ]);
    assert_eq!(read, "by-kubectl");
    // ... and the key is in the external members' keyspace.
    let keys = etcdctl(
        &lab,
        "etcd3",
        "get --prefix --keys-only /registry/configmaps/default/stored-in-etcd",
    )
    .expect("etcdctl get");
    assert!(
        keys.contains("/registry/configmaps/default/stored-in-etcd"),
        "the ConfigMap is not in the external etcd:\n{keys}"
    );

    // A backup of host-deployed etcd.
    let record = c.backup_etcd();
    let listed = c.kprov_ok(&["get", "backups", name, "-o", "json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).expect("get backups -o json");
    assert_eq!(
        listed.as_array().map(Vec::len),
        Some(1),
        "one backup listed: {listed}"
    );
    let size = record["size"].as_u64().unwrap_or(0);
    assert!(size > 0, "the backup's record: {record}");
    assert_eq!(record["etcd"], "External", "{record}");
    assert!(
        ETCD_HOSTS.contains(&record["host"].as_str().unwrap_or_default()),
        "taken on an etcd host: {record}"
    );
    for h in ETCD_HOSTS {
        let left = lab
            .host(h)
            .exec("ls /var/lib/etcd/kprov-snapshot.db 2>/dev/null || true")
            .expect("exec");
        assert_eq!(left.trim(), "", "{h}: snapshot left on the host");
    }

    // Scenario 7 on host-deployed etcd: the ConfigMap from before the backup deleted, another
    // created, `restore etcd`: etcd 3.6 runs on the restored data directories (the tier's
    // etcdutl is a stand-in running etcdctl 3.4's restore: realk8s::ETCDUTL_STANDIN), the
    // deleted ConfigMap is back, the later one gone, three members healthy, both nodes Ready.
    let id = record["id"].as_str().expect("backup id");
    let took = c.restore_roundtrip(id, "stored-in-etcd", "after-backup");
    eprintln!("restore etcd --yes: {took:?}");
    let restored = etcdctl(
        &lab,
        "etcd2",
        "get --prefix --keys-only /registry/configmaps/default/",
    )
    .expect("etcdctl get");
    assert!(
        restored.contains("/registry/configmaps/default/stored-in-etcd")
            && !restored.contains("after-backup"),
        "the members' keyspace after the restore:\n{restored}"
    );
    c.wait_for(
        "3 healthy members after the restore",
        Duration::from_secs(120),
        || {
            let out = etcdctl(&lab, "etcd1", "endpoint health --cluster")?;
            let healthy = out.lines().filter(|l| l.contains("is healthy")).count();
            if healthy == 3 { Ok(out) } else { Err(out) }
        },
    );
    for h in ETCD_HOSTS {
        let said = lab
            .host(h)
            .exec("systemctl is-active etcd; ls /var/lib/etcd")
            .unwrap_or_else(|e| panic!("{h}: {e}"));
        assert_eq!(
            said, "active\nkprov-previous\nmember\n",
            "{h} after the restore"
        );
    }
    c.wait_nodes_ready(&["cp1", "worker1"], Duration::from_secs(180));

    if c.kept() {
        return;
    }

    // delete cluster: no etcd anywhere, no etcd data or configuration. (The tier masks this
    // machine's own etcd.service on every host, a symlink to /dev/null: only a regular file
    // is kprov's unit.)
    c.delete_and_check(
        "systemctl is-active etcd kubelet 2>/dev/null | grep -x active || true; \
         pgrep -x etcd || true; pgrep -x kube-apiserver || true; \
         ls -d /etc/etcd /var/lib/etcd/member 2>/dev/null || true; \
         [ -f /etc/systemd/system/etcd.service ] && echo etcd.service || true",
    );
    lab.teardown_clean();
}
