//! etcd end to end: Kubespray's 2 control planes + 3 etcd layout (external etcd as a host
//! service beside other roles) on sshd test hosts, and the Kubespray inventories that used to
//! be refused. Stand-in etcd/etcdctl/etcdutl from the mirror record their calls.

use std::process::Output;

use crate::metal::{Lab, layout, metal_update_yes, ok, show};
use crate::support::cli::create_metal;
use crate::support::cli::says;
use crate::support::cli::text;

/// The inventory Kubespray's inventory builder writes for five hosts: two control planes,
/// etcd on the first three hosts, every host a worker.
fn builder_inventory(lab: &Lab) -> String {
    let mut inv = lab.kubespray_hosts(true);
    inv.push_str(
        "  children:\n    kube_control_plane:\n      hosts:\n        host1:\n        host2:\n",
    );
    inv.push_str("    kube_node:\n      hosts:\n");
    for h in &lab.th.hosts {
        inv.push_str(&format!("        {}:\n", h.name));
    }
    inv.push_str("    etcd:\n      hosts:\n        host1:\n        host2:\n        host3:\n");
    inv.push_str(
        "    k8s_cluster:\n      children:\n        kube_control_plane:\n        kube_node:\n    calico_rr:\n      hosts: {}\n",
    );
    inv
}

const ETCD_HOSTS: [&str; 3] = ["host1", "host2", "host3"];

fn san_of(lab: &Lab, host: &str, cert: &str) -> String {
    lab.host(host)
        .exec(&format!(
            "openssl x509 -noout -ext subjectAltName -in {cert}"
        ))
        .unwrap_or_else(|e| panic!("{host}: {cert}: {e}"))
}

#[test]
fn two_control_planes_and_three_etcd_hosts_from_the_inventory_builder() {
    crate::needs_tier!(SshdHosts);
    let lab = Lab::start(5);
    let name = "kubespray.metal.example.com";
    let inv = lab.write("hosts.yaml", &builder_inventory(&lab));
    lab.create_metal_spec(name, &inv);
    let stored = ok(&lab.kprov(&["get", "cluster", name, "-o", "yaml"]));
    assert!(stored.contains("type: External"), "{stored}");
    // The preview of what `create` stored works (no host key recorded yet: no host contacted).
    let preview = lab.kprov(&["update", "cluster", name]);
    assert_eq!(preview.status.code(), Some(0), "{}", show(&preview));
    drop(preview);

    let o = provisioned_two_plus_three_after_create(&lab, name);
    ok(&o);

    // etcd runs as a service on exactly the etcd hosts, whatever else they are.
    let peers: Vec<String> = ETCD_HOSTS
        .iter()
        .map(|h| format!("{h}=https://{}:2380", lab.host(h).address))
        .collect();
    let ca = lab
        .upper("host1", "/etc/kubernetes/pki/etcd/ca.crt")
        .expect("etcd CA");
    let first_health = ETCD_HOSTS
        .iter()
        .map(|h| lab.first_call(h, "etcdctl "))
        .max()
        .unwrap();
    for h in ETCD_HOSTS {
        let addr = &lab.host(h).address;
        let conf = lab
            .upper(h, "/etc/etcd/etcd.conf.yml")
            .expect("etcd config");
        assert!(
            conf.contains(&format!("initial-cluster: \"{}\"", peers.join(","))),
            "{h}: {conf}"
        );
        assert!(conf.contains(&format!("name: \"{h}\"")), "{h}: {conf}");
        assert!(
            conf.contains(&format!("advertise-client-urls: \"https://{addr}:2379\"")),
            "{h}: {conf}"
        );
        assert!(
            lab.upper(h, "/etc/systemd/system/etcd.service")
                .expect("unit")
                .contains("ExecStart=/usr/local/bin/etcd --config-file=/etc/etcd/etcd.conf.yml")
        );
        // The pinned release's binaries, from the mirror.
        for b in ["etcd", "etcdctl", "etcdutl"] {
            assert!(
                lab.upper(h, &format!("/usr/local/bin/{b}")).is_some(),
                "{h}: {b}"
            );
        }
        let calls: Vec<String> = lab.calls(h).into_iter().map(|c| c.1).collect();
        assert!(
            calls.iter().any(|c| c == "systemctl enable etcd"),
            "{h}: {calls:#?}"
        );
        assert!(
            calls.iter().any(|c| c == "systemctl restart etcd"),
            "{h}: {calls:#?}"
        );
        assert!(
            calls.iter().any(|c| c.starts_with(&format!(
                "etcdctl --endpoints https://{addr}:2379 --cacert /etc/kubernetes/pki/etcd/ca.crt"
            )) && c.ends_with("endpoint health")),
            "{h}: {calls:#?}"
        );
        // One CA; server and peer certificates name the host's address.
        assert_eq!(
            lab.upper(h, "/etc/kubernetes/pki/etcd/ca.crt").as_ref(),
            Some(&ca),
            "{h}"
        );
        for cert in ["server", "peer"] {
            let san = san_of(&lab, h, &format!("/etc/kubernetes/pki/etcd/{cert}.crt"));
            assert!(
                san.contains(&format!("IP Address:{addr}")),
                "{h} {cert}: {san}"
            );
        }
    }
    for h in ["host4", "host5"] {
        assert!(lab.upper(h, "/etc/etcd/etcd.conf.yml").is_none(), "{h}");
        assert!(lab.upper(h, "/usr/local/bin/etcd").is_none(), "{h}");
    }
    // Every member is healthy before kubeadm init, which points at all three.
    let init = lab.first_call("host1", "kubeadm init --config");
    assert!(first_health < init);
    let init_cfg = lab
        .upper("host1", "/etc/kubernetes/kprov/kubeadm-init.yaml")
        .expect("init config");
    assert!(init_cfg.contains("external:"), "{init_cfg}");
    for h in ETCD_HOSTS {
        assert!(
            init_cfg.contains(&format!("https://{}:2379", lab.host(h).address)),
            "{init_cfg}"
        );
    }
    // kubeadm's own etcd never runs: no etcd static pod on the control planes.
    for h in ["host1", "host2"] {
        assert!(
            lab.upper(h, "/etc/kubernetes/manifests/etcd.yaml")
                .is_none(),
            "{h}"
        );
        assert!(lab.upper(h, "/etc/kubernetes/admin.conf").is_some(), "{h}");
    }
    let join2 = lab
        .upper("host2", "/etc/kubernetes/kprov/kubeadm-join.yaml")
        .expect("join");
    assert!(join2.contains("controlPlane:"), "{join2}");
    for h in ["host3", "host4", "host5"] {
        assert!(
            lab.upper(h, "/etc/kubernetes/kubelet.conf").is_some(),
            "{h}"
        );
    }

    // Converged: the preview has nothing pending and a re-run changes nothing on etcd.
    let before = ETCD_HOSTS.map(|h| lab.calls(h).len());
    let p = lab.kprov(&["update", "cluster", name, "--exit-code"]);
    assert_eq!(p.status.code(), Some(0), "{}", show(&p));
    let again = lab.kprov(&["update", "cluster", name, "--yes", "--skip-addons"]);
    let out = ok(&again) + &text(&again.stderr);
    assert!(out.contains("No changes"), "{out}");
    for (i, h) in ETCD_HOSTS.iter().enumerate() {
        let new: Vec<String> = lab.calls(h)[before[i]..]
            .iter()
            .map(|c| c.1.clone())
            .collect();
        assert!(
            !new.iter().any(|c| c.starts_with("systemctl restart etcd")
                || c.starts_with("kubeadm")
                || c.starts_with("etcd ")),
            "{h}: {new:#?}"
        );
    }

    // delete cluster stops and removes the etcd service with everything else.
    ok(&lab.kprov(&["delete", "cluster", name, "--yes"]));
    for h in ETCD_HOSTS {
        let calls: Vec<String> = lab.calls(h).into_iter().map(|c| c.1).collect();
        assert!(
            calls.iter().any(|c| c == "systemctl disable --now etcd"),
            "{h}: {calls:#?}"
        );
        assert!(
            lab.host(h).exec("test ! -e /etc/etcd && test ! -e /etc/systemd/system/etcd.service && test ! -e /var/lib/etcd").is_ok(),
            "{h}"
        );
    }
}

fn provisioned_two_plus_three_after_create(lab: &Lab, name: &str) -> Output {
    lab.use_mirror(name, None);
    lab.kprov(&metal_update_yes(name, &[]))
}

/// The real inventories kprov refused before (etcd beside other roles) import, are stored,
/// and preview; no host is contacted (their keys are not recorded), so no traffic leaves.
#[test]
fn kubespray_inventories_with_etcd_beside_other_roles_create_and_preview() {
    let dir = tempfile::Builder::new()
        .prefix("kprov-etcd-real-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kubespray/real");
    let kprov = |args: &[&str]| {
        crate::support::cli::kprov_in(dir.path(), &dir.path().join("state"))
            .args(args)
            .output()
            .unwrap()
    };
    for (i, f) in [
        "12-inventory-builder-2-hosts.yaml",
        "12-inventory-builder-3-hosts.yaml",
        "12-inventory-builder-5-hosts.yaml",
        "13-python-discord-hosts.yaml",
        "14-ska-telescope-hosts.yaml",
        "16-llaoj-inventory.ini",
        "25-kubespray-docs-inventory-md-example.ini",
    ]
    .iter()
    .enumerate()
    {
        let name = format!("real{i}.example.com");
        let inv = fixtures.join(f).display().to_string();
        let c = kprov(&create_metal(&name, &inv));
        assert!(c.status.success(), "{f}: {}", show(&c));
        let got = kprov(&["get", "cluster", &name, "-o", "yaml"]);
        assert!(
            text(&got.stdout).contains("type: External"),
            "{f}: {}",
            show(&got)
        );
        let p = kprov(&["update", "cluster", &name, "-o", "json"]);
        assert_eq!(p.status.code(), Some(0), "{f}: {}", show(&p));
        let plan: serde_json::Value = serde_json::from_slice(&p.stdout).expect("json plan");
        let nodes = plan["nodePlan"]["nodes"].as_array().expect("nodes");
        assert!(!nodes.is_empty(), "{f}");
        for n in nodes {
            assert_eq!(n["observed"]["state"], "host-key-not-recorded", "{f}: {n}");
        }
    }
}

/// A cluster of two control planes and three host-deployed etcd members (host1-3) among
/// five hosts, created and provisioned.
pub(crate) fn provision(lab: &Lab, name: &str) {
    let inv = lab.write("hosts.yaml", &builder_inventory(lab));
    lab.create_metal_spec(name, &inv);
    ok(&provisioned_two_plus_three_after_create(lab, name));
}

fn backup_dir(lab: &Lab, name: &str) -> std::path::PathBuf {
    lab.store_dir().join(name).join("backups/etcd")
}

fn calls_since(lab: &Lab, host: &str, since: usize) -> Vec<(u128, String)> {
    lab.calls(host).split_off(since.min(lab.calls(host).len()))
}

#[test]
fn etcd_backup_list_and_restore_on_host_deployed_etcd() {
    crate::needs_tier!(SshdHosts);
    let lab = Lab::start(5);
    let name = "backup.metal.example.com";
    provision(&lab, name);
    // What the stand-in etcd "holds": it goes into every snapshot it saves.
    for h in ETCD_HOSTS {
        lab.host(h)
            .exec("printf 'key=v1\\n' > /var/lib/kprov-standins/etcd-keys")
            .unwrap();
    }

    // 1. A backup on the first healthy member, stored with its checksum.
    let before = lab.calls("host1").len();
    let o = lab.kprov(&["backup", "etcd", name, "-o", "json"]);
    let first: serde_json::Value = serde_json::from_str(&ok(&o)).expect("json record");
    says(&o, "Backed up etcd of");
    assert_eq!(first["host"], "host1");
    assert_eq!(first["etcd"], "External");
    let id1 = first["id"].as_str().unwrap().to_string();
    let db =
        std::fs::read(backup_dir(&lab, name).join(format!("{id1}.db"))).expect("stored snapshot");
    assert!(
        text(&db).starts_with("kprov-standin-snapshot\nhost1\nkey=v1\n"),
        "{}",
        text(&db)
    );
    assert_eq!(first["sha256"], kprov_sha256(&db));
    assert_eq!(first["size"], db.len());
    let addr1 = &lab.host("host1").address;
    let new: Vec<String> = calls_since(&lab, "host1", before)
        .into_iter()
        .map(|c| c.1)
        .collect();
    let health = new
        .iter()
        .position(|c| {
            c.starts_with(&format!("etcdctl --endpoints https://{addr1}:2379"))
                && c.ends_with("endpoint health")
        })
        .unwrap_or_else(|| panic!("{new:#?}"));
    let save = new
        .iter()
        .position(|c| {
            c.starts_with("etcdctl ")
                && c.ends_with("snapshot save /var/lib/etcd/kprov-snapshot.db")
        })
        .unwrap_or_else(|| panic!("{new:#?}"));
    assert!(health < save);
    // The snapshot holds every secret of the cluster: it does not stay on the host.
    assert!(
        lab.host("host1")
            .exec("test ! -e /var/lib/etcd/kprov-snapshot.db")
            .is_ok()
    );
    for h in ["host2", "host3", "host4", "host5"] {
        assert!(
            !lab.calls(h).iter().any(|c| c.1.contains("snapshot save")),
            "{h} was asked for a snapshot too"
        );
    }

    // 2. host1's etcdctl is broken: the next healthy member gives the snapshot.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    lab.host("host1")
        .exec("mv /usr/local/bin/etcdctl /usr/local/bin/etcdctl.off")
        .unwrap();
    for h in ETCD_HOSTS {
        lab.host(h)
            .exec("printf 'key=v2\\n' > /var/lib/kprov-standins/etcd-keys")
            .unwrap();
    }
    let o = lab.kprov(&["backup", "etcd", name, "-o", "json"]);
    let second: serde_json::Value = serde_json::from_str(&ok(&o)).expect("json record");
    assert_eq!(second["host"], "host2", "{}", show(&o));
    lab.host("host1")
        .exec("mv /usr/local/bin/etcdctl.off /usr/local/bin/etcdctl")
        .unwrap();
    let id2 = second["id"].as_str().unwrap().to_string();
    assert_ne!(id1, id2);

    // 3. Listed, oldest first, as a table and as JSON.
    let listed: serde_json::Value =
        serde_json::from_str(&ok(&lab.kprov(&["get", "backups", name, "-o", "json"]))).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    assert_eq!(listed[0], first);
    assert_eq!(listed[1], second);
    let table = ok(&lab.kprov(&["get", "backups", name]));
    assert!(
        table.contains("SNAPSHOT") && table.contains(&id1) && table.contains(&id2),
        "{table}"
    );
    let missing = lab.kprov(&["get", "backups", "nope.example.com"]);
    assert!(!missing.status.success(), "{}", show(&missing));

    // 4. A snapshot whose bytes changed in the store is refused before any host is touched.
    let calls_before: Vec<usize> = lab
        .th
        .hosts
        .iter()
        .map(|h| lab.calls(&h.name).len())
        .collect();
    let p2 = backup_dir(&lab, name).join(format!("{id2}.db"));
    let mut bad = std::fs::read(&p2).unwrap();
    bad[0] ^= 1;
    std::fs::write(&p2, &bad).unwrap();
    let o = lab.kprov(&["restore", "etcd", name, "--from", &id2, "--yes"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    says(&o, "checksum mismatch");
    // 5. The preview verifies, lists every control plane and member, and changes nothing.
    let o = lab.kprov(&["restore", "etcd", name, "--from", &id1]);
    let preview = ok(&o);
    assert!(preview.contains("verified"), "{preview}");
    for h in ["host1", "host2", "host3"] {
        assert!(preview.contains(h), "{preview}");
    }
    assert!(
        !preview.contains("host4") && !preview.contains("host5"),
        "{preview}"
    );
    says(&o, "Must specify --yes");
    for (i, h) in lab.th.hosts.iter().enumerate() {
        assert_eq!(
            lab.calls(&h.name).len(),
            calls_before[i],
            "{} was touched",
            h.name
        );
    }

    // 6. The restore, as kubeadm documents it. On host1 the data directory is a mount point
    // (etcd on a disk of its own; the real-hosts tier bind-mounts it): `mv` cannot rename a
    // mount point, so the restore must move only what is inside it.
    // Every member's old data is marked (the stand-in etcd writes none).
    for h in ETCD_HOSTS {
        lab.host(h)
            .exec("mkdir -p /var/lib/etcd/member && echo old > /var/lib/etcd/member/old-data")
            .expect("old data");
    }
    lab.host("host1")
        .exec(
            "set -e; mkdir -p /var/lib/etcd-disk; cp -a /var/lib/etcd/. /var/lib/etcd-disk/; \
             mount --bind /var/lib/etcd-disk /var/lib/etcd; mountpoint -q /var/lib/etcd",
        )
        .expect("host1: /var/lib/etcd as a mount point");
    let o = lab.kprov(&["restore", "etcd", name, "--from", &id1, "--yes"]);
    ok(&o);
    let peers: Vec<String> = ETCD_HOSTS
        .iter()
        .map(|h| format!("{h}=https://{}:2380", lab.host(h).address))
        .collect();
    let at = |h: &str, prefix: &str| -> Vec<u128> {
        calls_since(&lab, h, calls_before[h[4..].parse::<usize>().unwrap() - 1])
            .into_iter()
            .filter(|c| c.1.starts_with(prefix))
            .map(|c| c.0)
            .collect()
    };
    let mut stops = Vec::new();
    let mut restores = Vec::new();
    let mut starts = Vec::new();
    for h in ETCD_HOSTS {
        let addr = &lab.host(h).address;
        let restore = format!(
            "etcdutl snapshot restore /var/lib/kprov/etcd-restore.db --name {h} --initial-cluster {} --initial-cluster-token kprov-{name} --initial-advertise-peer-urls https://{addr}:2380 --data-dir /var/lib/etcd/kprov-restore",
            peers.join(",")
        );
        let r = at(h, &restore);
        assert_eq!(r.len(), 1, "{h}: {:#?}", lab.calls(h));
        stops.extend(at(h, "systemctl stop etcd"));
        restores.extend(r);
        starts.extend(at(h, "systemctl start etcd"));
        let healthy = at(h, "etcdctl ");
        assert!(
            healthy.iter().any(|t| *t > restores[restores.len() - 1]),
            "{h}"
        );
        // The data directory holds the restored member; the old one is kept inside it.
        let data = if h == "host1" {
            "/var/lib/etcd-disk"
        } else {
            "/var/lib/etcd"
        };
        assert_eq!(
            lab.host(h)
                .read_upper(&format!("{data}/member/snap/db"))
                .as_deref(),
            Some(&db[..]),
            "{h}"
        );
        let kept = lab.host(h).exec(
            "grep -qx old /var/lib/etcd/kprov-previous/member/old-data && test ! -e /var/lib/etcd/kprov-restore \
             && test ! -e /var/lib/kprov/etcd-restore.db && ls /var/lib/etcd",
        );
        assert_eq!(kept.as_deref(), Ok("kprov-previous\nmember\n"), "{h}");
    }
    assert_eq!((stops.len(), starts.len()), (3, 3));
    // Every member stops before any restores, all restore before any starts.
    assert!(stops.iter().max() < restores.iter().min());
    assert!(restores.iter().max() < starts.iter().min());
    // The API servers were set aside meanwhile and are back.
    for h in ["host1", "host2"] {
        let calls: Vec<(u128, String)> =
            calls_since(&lab, h, calls_before[h[4..].parse::<usize>().unwrap() - 1]);
        assert!(!calls.is_empty(), "{h}");
        assert!(
            lab.upper(h, "/etc/kubernetes/manifests/kube-apiserver.yaml")
                .is_some(),
            "{h}"
        );
        assert!(
            lab.host(h)
                .exec("test -d /etc/kubernetes/kprov/paused && test -z \"$(ls -A /etc/kubernetes/kprov/paused)\"")
                .is_ok(),
            "{h}"
        );
    }
    for h in ["host4", "host5"] {
        assert_eq!(
            lab.calls(h).len(),
            calls_before[h[4..].parse::<usize>().unwrap() - 1],
            "{h} was touched by the restore"
        );
    }

    // 7. delete cluster keeps the backups unless asked, and says so; the store still lists
    //    the name (only backups under it), `get backups` reads them, and --delete-backups
    //    removes them.
    let kept = std::fs::read_dir(backup_dir(&lab, name)).unwrap().count();
    let listed_before: serde_json::Value =
        serde_json::from_str(&ok(&lab.kprov(&["get", "backups", name, "-o", "json"]))).unwrap();
    let o = lab.kprov(&["delete", "cluster", name]);
    let preview = format!("{}{}", ok(&o), text(&o.stderr));
    assert!(
        preview.contains(&format!("Will keep {kept} etcd backup objects under"))
            && preview.contains("--delete-backups"),
        "{preview}"
    );
    assert!(
        !preview.contains(&format!("backups/etcd/{id1}.db")),
        "{preview}"
    );
    let o = lab.kprov(&["delete", "cluster", name, "--yes"]);
    ok(&o);
    says(&o, &format!("Kept {kept} etcd backup objects under"));
    assert!(backup_dir(&lab, name).join(format!("{id1}.db")).exists());
    let clusters = lab.kprov(&["get", "clusters"]);
    assert!(
        ok(&clusters).contains("DELETED (backups kept)"),
        "{}",
        show(&clusters)
    );
    let listed: serde_json::Value =
        serde_json::from_str(&ok(&lab.kprov(&["get", "backups", name, "-o", "json"]))).unwrap();
    assert_eq!(listed, listed_before);
    let o = lab.kprov(&["get", "cluster", name]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    says(&o, "only its etcd backups remain");
    // Without --delete-backups a second delete says what is kept and changes nothing.
    let o = lab.kprov(&["delete", "cluster", name, "--yes"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(backup_dir(&lab, name).join(format!("{id1}.db")).exists());
    ok(&lab.kprov(&["delete", "cluster", name, "--yes", "--delete-backups"]));
    assert!(!backup_dir(&lab, name).join(format!("{id1}.db")).exists());
    let clusters = ok(&lab.kprov(&["get", "clusters"]));
    assert!(!clusters.contains(name), "{clusters}");
}

fn kprov_sha256(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

/// Stacked etcd (kubeadm's static pods on three control planes): the snapshot comes from the
/// static pod's etcdctl (crictl exec, kubeadm's health-check certificate); the restore sets
/// the etcd and API server manifests aside, waits for the pod to stop, restores with the
/// pinned release's etcdutl, and puts the manifests back.
#[test]
fn etcd_backup_and_restore_on_stacked_etcd() {
    crate::needs_tier!(SshdHosts);
    let lab = Lab::start(3);
    let name = "stacked.metal.example.com";
    let inv = crate::metal::kprov_inventory(&lab, &layout(3, 0));
    let inv = lab.write("hosts.yaml", &inv);
    lab.create_metal_spec(name, &inv);
    ok(&provisioned_two_plus_three_after_create(&lab, name));
    lab.host("host1")
        .exec("printf 'key=stacked\\n' > /var/lib/kprov-standins/etcd-keys")
        .unwrap();

    let o = lab.kprov(&["backup", "etcd", name, "-o", "json"]);
    let record: serde_json::Value = serde_json::from_str(&ok(&o)).expect("json record");
    assert_eq!(record["host"], "host1");
    assert_eq!(record["etcd"], "Stacked");
    let id = record["id"].as_str().unwrap().to_string();
    let db = std::fs::read(backup_dir(&lab, name).join(format!("{id}.db"))).unwrap();
    assert!(
        text(&db).starts_with("kprov-standin-snapshot\nhost1\nkey=stacked\n"),
        "{}",
        text(&db)
    );
    let calls: Vec<String> = lab.calls("host1").into_iter().map(|c| c.1).collect();
    assert!(
        calls.iter().any(|c| c
            == "crictl exec etcd0000standin etcdctl --endpoints https://127.0.0.1:2379 --cacert /etc/kubernetes/pki/etcd/ca.crt --cert /etc/kubernetes/pki/etcd/healthcheck-client.crt --key /etc/kubernetes/pki/etcd/healthcheck-client.key snapshot save /var/lib/etcd/kprov-snapshot.db"),
        "{calls:#?}"
    );

    let before: Vec<usize> = ["host1", "host2", "host3"]
        .iter()
        .map(|h| lab.calls(h).len())
        .collect();
    ok(&lab.kprov(&["restore", "etcd", name, "--from", &id, "--yes"]));
    let peers: Vec<String> = ["host1", "host2", "host3"]
        .iter()
        .map(|h| format!("{h}=https://{}:2380", lab.host(h).address))
        .collect();
    for (i, h) in ["host1", "host2", "host3"].iter().enumerate() {
        let new: Vec<String> = calls_since(&lab, h, before[i])
            .into_iter()
            .map(|c| c.1)
            .collect();
        let restore = format!(
            "etcdutl snapshot restore /var/lib/kprov/etcd-restore.db --name {h} --initial-cluster {} --initial-cluster-token etcd-cluster --initial-advertise-peer-urls https://{}:2380 --data-dir /var/lib/etcd/kprov-restore",
            peers.join(","),
            lab.host(h).address
        );
        assert!(new.contains(&restore), "{h}: {new:#?}");
        // etcdutl came from the pinned release; the pod was waited for before the restore.
        assert!(lab.upper(h, "/usr/local/bin/etcdutl").is_some(), "{h}");
        let waited = new
            .iter()
            .position(|c| c.starts_with("crictl ps --name ^etcd$"))
            .unwrap();
        assert!(
            waited < new.iter().position(|c| *c == restore).unwrap(),
            "{h}: {new:#?}"
        );
        assert_eq!(
            lab.host(h)
                .read_upper("/var/lib/etcd/member/snap/db")
                .as_deref(),
            Some(&db[..]),
            "{h}"
        );
        for m in ["etcd.yaml", "kube-apiserver.yaml"] {
            assert!(
                lab.upper(h, &format!("/etc/kubernetes/manifests/{m}"))
                    .is_some(),
                "{h}: {m} not back"
            );
        }
    }
}

/// Plays the members for `ops::etcd` without SSH: the snapshot step fails on `broken`, works
/// elsewhere; the file read back is the member's snapshot.
struct FakeMembers {
    broken: &'static str,
    steps: std::sync::Mutex<Vec<(String, String)>>,
}

#[async_trait::async_trait]
impl kprov::ssh::task::HostExecutor for FakeMembers {
    async fn run_steps(
        &self,
        host: &str,
        steps: &[kprov::ssh::task::Step],
    ) -> Result<Vec<kprov::ssh::task::StepOutcome>, kprov::ssh::task::ExecError> {
        for s in steps {
            self.steps
                .lock()
                .unwrap()
                .push((host.into(), s.name.clone()));
            if host == self.broken && s.name == "etcd: snapshot" {
                return Err(kprov::ssh::task::ExecError::Step {
                    host: host.into(),
                    step: s.name.clone(),
                    code: Some(1),
                    stderr: "context deadline exceeded".into(),
                });
            }
        }
        Ok(vec![kprov::ssh::task::StepOutcome::Changed; steps.len()])
    }

    async fn read_file(
        &self,
        host: &str,
        path: &str,
    ) -> Result<Option<bytes::Bytes>, kprov::ssh::task::ExecError> {
        Ok((path == kprov::provision::render::ETCD_SNAPSHOT)
            .then(|| bytes::Bytes::from(format!("snapshot of {host}\n"))))
    }
}

/// The use case a rolling update calls, against both state store backends: the record and
/// snapshot land under NAME/backups/etcd/, the list reads them back, a tampered record or
/// snapshot is refused by `load`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_use_case_on_file_and_s3_stores() {
    crate::needs_tier!(Moto);
    use kprov::ops::etcd;
    use kprov::state::{Precondition, StateStore};

    use crate::support::model;
    let yaml = "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: uc.example.com\n\
         spec:\n  cloudProvider: metal\n  kubernetesVersion: 1.35.1\n  networking:\n    \
         podCIDR: 100.96.0.0/11\n    serviceCIDR: 100.64.0.0/13\n  etcd:\n    type: External\n  hosts:\n\
         \x20 - {name: cp1, address: 198.18.9.1, roles: [control-plane, etcd]}\n\
         \x20 - {name: cp2, address: 198.18.9.2, roles: [control-plane, etcd]}\n\
         \x20 - {name: w1, address: 198.18.9.3, roles: [node, etcd]}\n";
    let cluster: kprov::spec::Cluster = serde_saphyr::from_str(yaml).unwrap();
    let targets: Vec<kprov::nodes::Target> = cluster
        .spec
        .hosts
        .iter()
        .cloned()
        .map(kprov::nodes::Target::from_host)
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let bucket = format!("kprov-it-etcd-{:016x}", rand::random::<u64>());
    let moto = crate::support::moto::moto();
    moto.create_bucket(&bucket).await;
    let stores: Vec<(&str, std::sync::Arc<dyn StateStore>)> = vec![
        (
            "file",
            std::sync::Arc::new(kprov::state::file::FileStore::new(dir.path()).unwrap()),
        ),
        (
            "s3",
            std::sync::Arc::new(kprov::state::s3::S3Store::new(
                &moto.sdk_config().await,
                &bucket,
                "team",
            )),
        ),
    ];
    for (kind, store) in stores {
        let exec = FakeMembers {
            broken: "cp1",
            steps: Default::default(),
        };
        let t0 = chrono::DateTime::parse_from_rfc3339("2026-11-22T21:00:00Z")
            .unwrap()
            .to_utc();
        let r1 = etcd::backup(store.as_ref(), &model(&cluster), &targets, &exec, t0)
            .await
            .unwrap();
        // cp1 failed its snapshot: cp2 gave it, and cleaned up after itself.
        assert_eq!(r1.host, "cp2", "{kind}");
        assert_eq!(r1.id, "20261122T210000Z");
        assert_eq!(r1.key, "uc.example.com/backups/etcd/20261122T210000Z.db");
        assert_eq!(r1.sha256, kprov_sha256(b"snapshot of cp2\n"));
        assert!(
            exec.steps
                .lock()
                .unwrap()
                .contains(&("cp2".into(), "etcd: remove snapshot file".into()))
        );
        let r2 = etcd::backup(
            store.as_ref(),
            &model(&cluster),
            &targets,
            &exec,
            t0 + chrono::Duration::hours(1),
        )
        .await
        .unwrap();
        // The same second twice never overwrites: the second takes the next free second.
        let r3 = etcd::backup(store.as_ref(), &model(&cluster), &targets, &exec, t0)
            .await
            .unwrap();
        assert_eq!(r3.id, "20261122T210001Z", "{kind}");
        let listed = etcd::list(store.as_ref(), "uc.example.com").await.unwrap();
        assert_eq!(
            listed.records,
            vec![r1.clone(), r3.clone(), r2.clone()],
            "{kind}"
        );
        assert!(listed.damaged.is_empty(), "{kind}: {listed:?}");
        let (rec, data) = etcd::load(store.as_ref(), "uc.example.com", &r1.id)
            .await
            .unwrap();
        assert_eq!((rec, &data[..]), (r1.clone(), &b"snapshot of cp2\n"[..]));
        // A changed snapshot, or a record pointing elsewhere, is refused.
        let mut forged = r1.clone();
        forged.key = "other.example.com/secrets/admin.conf".into();
        let record_key = format!("uc.example.com/backups/etcd/{}.json", r1.id);
        for (key, data, id, says) in [
            (
                r2.key.clone(),
                bytes::Bytes::from_static(b"evil"),
                &r2.id,
                "checksum mismatch",
            ),
            (
                record_key,
                bytes::Bytes::from(serde_json::to_vec(&forged).unwrap()),
                &r1.id,
                "not its own snapshot",
            ),
        ] {
            store.put(&key, data, Precondition::None).await.unwrap();
            let err = etcd::load(store.as_ref(), "uc.example.com", id)
                .await
                .unwrap_err();
            assert!(format!("{err:#}").contains(says), "{kind}: {err:#}");
        }
        assert!(
            etcd::load(store.as_ref(), "uc.example.com", "20200101T000000Z")
                .await
                .is_err()
        );
    }
}
