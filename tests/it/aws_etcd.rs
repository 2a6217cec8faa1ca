//! `backup etcd`, `get backups` and `restore etcd` on AWS through the platform seam (issue 19;
//! issue 20 "AWS etcd"): a running cluster in the cloud lab (one control plane with stacked
//! etcd, one worker, instances played by sshd test hosts with the etcdctl/etcdutl stand-ins)
//! → the backup is taken on the control-plane instance and stored with its sha256 → listed →
//! the restore preview names the control plane and changes nothing → `--yes` restores the
//! snapshot on it (the data directory holds the snapshot, the manifests are back) and leaves
//! the worker alone. Then the preview's owned-host check, as on metal: the worker's ownership
//! marker made another cluster's → `update cluster` (preview) exits 1 naming it and its owner.
//! Then `delete cluster` keeps the etcd backups (said in the preview and after `--yes`, `get
//! clusters` shows `DELETED (backups kept)`) and `--delete-backups` removes them.
//! Needs root.

use crate::support::awsroll::{code, ok_saying, running_cluster, text, with_call, workers};

#[test]
fn etcd_backup_list_restore_and_the_owned_host_refusal_on_aws_instances() {
    crate::needs_tier!(CloudLab);
    let cluster = "etcd.lab.example";
    let lab = running_cluster(cluster, "lab.example", 1);
    let cps = with_call(&lab, "kubeadm init");
    assert_eq!(cps.len(), 1, "{cps:?}");
    let cp = lab.instances()[&cps[0]].clone();
    let worker = lab.instances()[&workers(&lab)[0]].clone();
    cp.exec("mkdir -p /var/lib/kprov-standins && printf 'key=aws\\n' > /var/lib/kprov-standins/etcd-keys")
        .expect("etcd keys");

    // Backup: on the control plane, into the store.
    let o = lab.kprov(&["backup", "etcd", cluster, "-o", "json"]);
    let record: serde_json::Value = serde_json::from_str(&code(&lab, &o, 0)).expect("json record");
    assert_eq!(record["etcd"], "Stacked", "{record}");
    let id = record["id"].as_str().expect("id").to_string();
    let db = std::fs::read(
        lab.store_dir()
            .join(cluster)
            .join("backups/etcd")
            .join(format!("{id}.db")),
    )
    .expect("the snapshot is in the store");
    assert!(
        text(&db).starts_with("kprov-standin-snapshot\n") && text(&db).contains("key=aws\n"),
        "{}",
        text(&db)
    );
    assert!(
        cp.standin_calls()
            .iter()
            .any(|(_, c)| c.contains("snapshot save")),
        "no snapshot taken on the control plane"
    );
    assert!(
        !worker
            .standin_calls()
            .iter()
            .any(|(_, c)| c.contains("snapshot")),
        "the worker was asked for a snapshot"
    );

    // Listed.
    let list: serde_json::Value = serde_json::from_str(&code(
        &lab,
        &lab.kprov(&["get", "backups", cluster, "-o", "json"]),
        0,
    ))
    .expect("backups json");
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["id"], id.as_str());

    // The preview: the control plane's steps, nothing run.
    let calls_before = cp.standin_calls().len();
    let o = lab.kprov(&["restore", "etcd", cluster, "--from", &id]);
    let out = code(&lab, &o, 0);
    assert!(
        out.contains(record["host"].as_str().expect("host"))
            && out.contains("etcdutl snapshot restore"),
        "{out}"
    );
    assert!(
        text(&o.stderr).contains("Must specify --yes"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(
        cp.standin_calls().len(),
        calls_before,
        "the preview ran something"
    );

    // Restored on the control plane; the worker untouched.
    let worker_before = worker.standin_calls().len();
    ok_saying(
        &lab,
        &["restore", "etcd", cluster, "--from", &id, "--yes"],
        "every member healthy",
    );
    let new: Vec<String> = cp.standin_calls()[calls_before..]
        .iter()
        .map(|(_, c)| c.clone())
        .collect();
    assert!(
        new.iter()
            .any(|c| c
                .starts_with("etcdutl snapshot restore /var/lib/kprov/etcd-restore.db --name ")),
        "{new:#?}"
    );
    assert_eq!(
        cp.read_upper("/var/lib/etcd/member/snap/db").as_deref(),
        Some(&db[..])
    );
    for m in ["etcd.yaml", "kube-apiserver.yaml"] {
        assert!(
            cp.read_upper(&format!("/etc/kubernetes/manifests/{m}"))
                .is_some(),
            "{m} not back"
        );
    }
    assert_eq!(
        worker.standin_calls().len(),
        worker_before,
        "the restore touched the worker"
    );

    // A worker another cluster owns: refused by the preview, named with its owner.
    assert!(
        worker.read_upper("/var/lib/kprov/owner").is_some(),
        "the worker has no marker"
    );
    worker
        .exec("cp /var/lib/kprov/owner /var/lib/kprov-standins/owner.saved && printf 'uid=0123456789abcdef\ncluster=other.lab.example\nstore=file:///elsewhere\n' > /var/lib/kprov/owner")
        .expect("marker replaced");
    let o = lab.kprov(&["update", "cluster", cluster, "--ssh-private-address"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}\n{err}", text(&o.stdout));
    assert!(
        err.contains(&format!(
            "1 instance of {cluster} belongs to another cluster"
        )) && err.contains(&workers(&lab)[0])
            && text(&o.stdout).contains("owned by cluster other.lab.example"),
        "{}\n{err}",
        text(&o.stdout)
    );
    worker
        .exec("mv /var/lib/kprov-standins/owner.saved /var/lib/kprov/owner")
        .expect("marker back");
    code(
        &lab,
        &lab.kprov(&["update", "cluster", cluster, "--ssh-private-address"]),
        0,
    );

    // delete cluster keeps the etcd backups unless asked, and says so (preview and --yes);
    // the store lists the name as deleted with its backups kept; --delete-backups removes
    // them.
    let backup = lab
        .store_dir()
        .join(cluster)
        .join("backups/etcd")
        .join(format!("{id}.db"));
    let kept = match std::fs::read_dir(backup.parent().expect("dir"))
        .expect("backups")
        .count()
    {
        1 => "1 etcd backup object".to_string(),
        n => format!("{n} etcd backup objects"),
    };
    let o = lab.kprov(&["delete", "cluster", cluster]);
    let preview = format!("{}{}", code(&lab, &o, 0), text(&o.stderr));
    assert!(
        preview.contains(&format!("Will keep {kept} under"))
            && preview.contains("--delete-backups"),
        "{preview}"
    );
    ok_saying(
        &lab,
        &["delete", "cluster", cluster, "--yes"],
        &format!("Kept {kept} under"),
    );
    lab.sync();
    assert!(lab.sync_errors().is_empty(), "{:?}", lab.sync_errors());
    assert!(backup.exists(), "the backup went with the cluster");
    let clusters = code(&lab, &lab.kprov(&["get", "clusters"]), 0);
    assert!(
        clusters
            .lines()
            .any(|l| l.starts_with(cluster) && l.contains("DELETED (backups kept)")),
        "{clusters}"
    );
    let listed = code(&lab, &lab.kprov(&["get", "backups", cluster]), 0);
    assert!(listed.contains(&id), "{listed}");
    code(
        &lab,
        &lab.kprov(&["delete", "cluster", cluster, "--yes", "--delete-backups"]),
        0,
    );
    assert!(!backup.exists(), "--delete-backups kept the backup");
    let clusters = code(&lab, &lab.kprov(&["get", "clusters"]), 0);
    assert!(!clusters.contains(cluster), "{clusters}");
}
