//! AWS clusters come up for real (issue 11): the kprov binary against moto in a cloud lab,
//! every instance played by an sshd test host with the host key from its user-data, the
//! stand-in kube binaries from the lab's mirror, the add-ons applied to the lab's fake API.
//!
//! create → preview (read-only: no write, nothing run on a host) → update --yes (every
//! instance provisioned, admin kubeconfig stored, add-ons applied) → validate, export
//! kubeconfig → no changes (preview read-only on a live cluster) → add-ons that cannot be
//! applied fail the run (exit 1) → (private topology: a bastion presenting another key is
//! refused) → a group grows → the new instance joins → the group replaces an instance: the
//! preview (JSON node plan too) lists it as joining, `--yes` joins it → a stale key stored
//! for a reused address is refused before any connection, naming both fingerprints → a host
//! presenting a different key is refused, naming both fingerprints → delete --yes.
//!
//! Public topology (the operator reaches the instances at their private addresses, as over a
//! VPN: moto's public addresses are invented) and private topology (through `bastion.NAME`,
//! the bastion load balancer's record, which the lab resolves to the host playing the bastion
//! instance: the only one the operator has a route to; the operator's `~/.ssh/config` gives it
//! a `HostKeyAlias`, so kprov must record the bastion's key under the name ssh really checks).
//!
//! Needs root. `PRIVATE_ADDRESSES` is the flag that selects private addresses
//! (`update cluster --ssh-private-address`, or `spec.topology.sshAddress: Private`).

use kprov::spec::{InstanceGroupRole, Object};

use crate::support::awsroll::{CreateAws, lab_with_zone, ok_saying};
use crate::support::cli::{export_kubeconfig, fails, holds_all};
use crate::support::cloudlab::CloudLab;
use crate::support::snapshot;

pub(crate) use crate::support::awsroll::{PRIVATE_ADDRESSES, code, text, with_call};

pub(crate) fn kubeadm_calls(lab: &CloudLab) -> usize {
    lab.instances()
        .values()
        .map(|h| {
            h.standin_calls()
                .iter()
                .filter(|(_, c)| c.starts_with("kubeadm "))
                .count()
        })
        .sum()
}

/// How the operator reaches the instances.
#[derive(Clone, Copy, PartialEq)]
enum Reach {
    PrivateAddresses,
    Bastion,
}

/// The alias the operator's ssh config gives the bastion's key in the private lifecycle.
const BASTION_ALIAS: &str = "lab-bastion-key";

fn lifecycle(cluster: &str, zone: &str, extra: &[&str], reach: Reach) {
    let flags: &[&str] = match reach {
        Reach::PrivateAddresses => PRIVATE_ADDRESSES,
        Reach::Bastion => &[],
    };
    let lab = lab_with_zone(zone);
    CreateAws::new(cluster)
        .flags(&["--node-count", "2"])
        .flags(extra)
        .run(&lab);
    if reach == Reach::Bastion {
        // The operator's own ssh config applies to the jump kprov makes.
        std::fs::write(
            lab.home.join(".ssh/config"),
            format!(
                "Host bastion.{cluster}\n  HostKeyAlias {BASTION_ALIAS}\n  ConnectTimeout 10\n"
            ),
        )
        .unwrap();
    }
    lab.use_mirror(cluster);
    lab.watch();

    // The preview: read-only. No write to the store, no instance, nothing on a host.
    let store0 = snapshot(&lab.store_dir());
    let mut preview = vec!["update", "cluster", cluster, "--exit-code"];
    preview.extend_from_slice(flags);
    let out = code(&lab, &lab.kprov(&preview), 2);
    assert!(out.contains("Will create"), "{out}");
    assert_eq!(snapshot(&lab.store_dir()), store0, "the preview wrote");
    assert!(lab.instances().is_empty(), "the preview started instances");

    // --yes: every instance provisioned, credentials stored, add-ons applied.
    let mut yes = vec!["update", "cluster", cluster, "--yes"];
    yes.extend_from_slice(flags);
    code(&lab, &lab.kprov(&yes), 0);
    let instances = lab.instances();
    assert!(
        instances.len() >= 3,
        "{:?}; lab sync errors: {:?}",
        instances.keys(),
        lab.sync_errors()
    );
    assert_eq!(with_call(&lab, "kubeadm init").len(), 1);
    let known_hosts = lab.store_dir().join(cluster).join("known_hosts");
    if reach == Reach::Bastion {
        // The bastion's key, as kprov generated it, under the name ssh checks (the alias),
        // and every node reached through the bastion host.
        let kh = std::fs::read_to_string(&known_hosts).unwrap();
        assert!(
            kh.lines()
                .any(|l| l.starts_with(&format!("{BASTION_ALIAS} "))),
            "{kh}"
        );
        let names = lab.names();
        let bastion = names[&format!("bastion.{cluster}")].to_string();
        let bastion_host = instances
            .values()
            .find(|h| h.address == bastion)
            .expect("the bastion record leads to an instance");
        assert!(bastion_host.standin_calls().is_empty());
        for h in instances.values().filter(|h| h.address != bastion) {
            assert!(
                h.log().contains(&format!("from {bastion} port")),
                "{} not reached through the bastion: {}",
                h.address,
                h.log()
            );
        }
    }
    for (id, h) in &instances {
        let calls = h.standin_calls();
        let bastion = calls.is_empty() && extra.contains(&"--bastion");
        assert!(
            bastion
                || calls
                    .iter()
                    .any(|(_, c)| c.starts_with("kubeadm init") || c.starts_with("kubeadm join")),
            "{id} ({}) was not provisioned: {calls:?}",
            h.address
        );
        if !calls.is_empty() {
            let flags = String::from_utf8_lossy(
                &h.read_upper("/var/lib/kubelet/kubeadm-flags.env")
                    .expect("kubelet flags"),
            )
            .into_owned();
            assert!(flags.contains("--cloud-provider=external"), "{flags}");
            assert!(
                flags.contains(&format!("aws:///us-east-1a/{id}")),
                "{flags}"
            );
        }
    }
    assert!(
        lab.store_dir()
            .join(cluster)
            .join("secrets/admin.conf")
            .exists(),
        "admin kubeconfig not stored"
    );
    let writes = lab.fake.writes();
    assert!(
        writes.iter().any(|w| w.contains("daemonsets")),
        "no add-on applied: {writes:?}"
    );

    // The lab's nodes and pods exist only because kprov provisioned and applied: validate
    // passes, and the exported kubeconfig reaches the API.
    // The lab plays the controllers asynchronously, as a real cluster's run: wait as users do.
    code(
        &lab,
        &lab.kprov(&["validate", "cluster", cluster, "--wait", "60s"]),
        0,
    );
    let kc = lab.home.join("kubeconfig");
    code(&lab, &lab.kprov(&export_kubeconfig(cluster, &kc)), 0);
    let exported = std::fs::read_to_string(&kc).unwrap();
    assert!(
        exported.contains(&format!("current-context: {cluster}")),
        "{exported}"
    );
    // One API address: the record on the port the API load balancer's listener declares
    // (the lab answers on no other), in the kubeconfig kprov stored and in the exported one,
    // and the exported one works on its own.
    let server = format!("server: https://api.{cluster}:6443\n");
    assert_eq!(
        lab.api_ports(),
        vec![6443],
        "the load balancers' listener ports"
    );
    assert!(exported.contains(&server), "{exported}");
    let stored =
        std::fs::read_to_string(lab.store_dir().join(cluster).join("secrets/admin.conf")).unwrap();
    assert!(stored.contains(&server), "{stored}");
    code(
        &lab,
        &lab.kprov(&[
            "validate",
            "cluster",
            cluster,
            "--kubeconfig",
            kc.to_str().unwrap(),
        ]),
        0,
    );

    // Again: no changes, nothing run on a host; the preview is read-only on a live cluster.
    let calls = kubeadm_calls(&lab);
    ok_saying(&lab, &yes, "No changes");
    assert_eq!(kubeadm_calls(&lab), calls, "the re-run called kubeadm");
    let (store1, hosts1) = (snapshot(&lab.store_dir()), lab.hosts_snapshot());
    code(&lab, &lab.kprov(&preview), 0);
    assert_eq!(snapshot(&lab.store_dir()), store1, "the preview wrote");
    assert_eq!(lab.hosts_snapshot(), hosts1, "the preview changed a host");

    // Add-ons that cannot be applied are never a silent success: another field manager took
    // the CCM's image, so `--yes` converges the nodes (nothing to do), says the add-ons
    // failed, how to retry, and exits 1. Forcing the add-ons takes the field back.
    lab.fake.update_as(
        "kubectl-edit",
        "DaemonSet",
        Some("kube-system"),
        "cloud-controller-manager",
        serde_json::json!({"spec": {"template": {"spec": {"containers": [
            {"name": "cloud-controller-manager", "image": "example.com/hotfix:1"}
        ]}}}}),
    );
    let o = lab.kprov(&yes);
    let err = fails(&o, 1);
    holds_all(
        &err,
        &[
            "deploying the add-ons failed",
            "kubectl-edit",
            &format!("kprov update addons {cluster} --yes"),
        ],
    );
    assert_eq!(kubeadm_calls(&lab), calls, "the re-run called kubeadm");
    code(
        &lab,
        &lab.kprov(&["update", "addons", cluster, "--yes", "--force-conflicts"]),
        0,
    );

    // The bastion's key is checked strictly against the one kprov generated: a bastion
    // presenting another is refused, and no node is provisioned through it.
    if reach == Reach::Bastion {
        let names = lab.names();
        let addr = names[&format!("bastion.{cluster}")].to_string();
        let bastion = lab
            .instances()
            .into_values()
            .find(|h| h.address == addr)
            .expect("bastion host");
        let generated = std::fs::read(bastion.dir().join("host_key")).unwrap();
        bastion.new_host_key();
        let o = lab.kprov(&yes);
        assert_ne!(o.status.code(), Some(0), "{}", text(&o.stderr));
        assert_eq!(
            kubeadm_calls(&lab),
            calls,
            "ran kubeadm through a refused bastion"
        );
        // What cloud-init put there comes back; the next run goes through again.
        bastion.set_host_key(&generated);
        code(&lab, &lab.kprov(&yes), 0);
    }

    // A group grows: the next update's new instance joins.
    let before = lab.instances();
    lab.edit_objects(cluster, |objects| {
        for o in objects {
            if let Object::InstanceGroup(g) = o
                && g.spec.role == InstanceGroupRole::Node
            {
                g.spec.min_size = Some(3);
                g.spec.max_size = Some(3);
            }
        }
    });
    let o = lab.kprov(&preview);
    let out = code(&lab, &o, 2);
    assert!(!out.is_empty());
    code(&lab, &lab.kprov(&yes), 0);
    let new: Vec<String> = lab
        .instances()
        .keys()
        .filter(|id| !before.contains_key(*id))
        .cloned()
        .collect();
    assert_eq!(new.len(), 1, "{new:?}");
    assert!(with_call(&lab, "kubeadm join").contains(&new[0]));

    // The group replaces an instance (terminated without lowering its size): the next
    // preview lists the replacement as joining, in the JSON plan too, and `--yes` joins it.
    let before = lab.instances();
    lab.block_on(async {
        aws_sdk_autoscaling::Client::new(&lab.sdk_config().await)
            .terminate_instance_in_auto_scaling_group()
            .instance_id(&new[0])
            .should_decrement_desired_capacity(false)
            .send()
            .await
            .expect("terminate in group")
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let replacement = loop {
        lab.sync();
        let now = lab.instances();
        let fresh: Vec<String> = now
            .keys()
            .filter(|id| !before.contains_key(*id))
            .cloned()
            .collect();
        if !now.contains_key(&new[0]) && fresh.len() == 1 {
            break fresh[0].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no replacement: {fresh:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let store2 = snapshot(&lab.store_dir());
    let mut json = vec!["update", "cluster", cluster, "-o", "json", "--exit-code"];
    json.extend_from_slice(flags);
    let doc: serde_json::Value = serde_json::from_str(&code(&lab, &lab.kprov(&json), 2))
        .expect("the JSON preview is one document");
    assert_eq!(doc["schemaVersion"], 2);
    assert_eq!(doc["summary"]["create"], 0, "{doc}");
    // The same document as metal's (docs/plan-json.md): nothing to remove, nothing refused.
    assert_eq!(doc["hostsToRemove"], serde_json::json!([]), "{doc}");
    assert_eq!(doc["refusals"], serde_json::json!([]), "{doc}");
    let planned = doc["nodePlan"]["nodes"].as_array().expect("nodePlan.nodes");
    let pending: Vec<&serde_json::Value> =
        planned.iter().filter(|n| n["pending"] == true).collect();
    assert_eq!(pending.len(), 1, "{doc}");
    assert_eq!(pending[0]["target"], replacement.as_str(), "{doc}");
    assert_eq!(pending[0]["action"], "join-worker", "{doc}");
    assert!(
        planned
            .iter()
            .filter(|n| n["target"] != replacement.as_str())
            .all(|n| n["observed"]["state"] == "member"),
        "{doc}"
    );
    assert_eq!(snapshot(&lab.store_dir()), store2, "the JSON preview wrote");
    assert!(
        lab.instances()[&replacement].standin_calls().is_empty(),
        "the preview ran something on the new instance"
    );
    code(&lab, &lab.kprov(&yes), 0);
    assert!(with_call(&lab, "kubeadm join").contains(&replacement));
    let new = [replacement];

    // An address reused by a new instance while the store still holds the old host's key
    // there: refused before any connection, naming both fingerprints.
    let worker = lab.instances()[&new[0]].clone();
    let saved = std::fs::read_to_string(&known_hosts).unwrap();
    let stale_key = lab.home.join("stale_host_key");
    assert!(
        std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&stale_key)
            .status()
            .unwrap()
            .success()
    );
    let stale_pub = std::fs::read_to_string(stale_key.with_extension("pub")).unwrap();
    let stale_blob: Vec<&str> = stale_pub.split_whitespace().take(2).collect();
    let mut replaced = 0;
    let edited: String = saved
        .lines()
        .map(|l| {
            if l.split_whitespace().next() == Some(worker.address.as_str()) {
                replaced += 1;
                format!("{} {} {}\n", worker.address, stale_blob[0], stale_blob[1])
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert_eq!(replaced, 1, "{saved}");
    std::fs::write(&known_hosts, edited).unwrap();
    let stale_fp = String::from_utf8_lossy(
        &std::process::Command::new("ssh-keygen")
            .arg("-lf")
            .arg(stale_key.with_extension("pub"))
            .output()
            .unwrap()
            .stdout,
    )
    .split_whitespace()
    .nth(1)
    .unwrap()
    .to_string();
    let calls = kubeadm_calls(&lab);
    let o = lab.kprov(&yes);
    let err = fails(&o, 1);
    assert!(
        err.contains(&stale_fp) && err.contains(&worker.fingerprint()) && err.contains("refused"),
        "expected {stale_fp} and {} in:\n{err}",
        worker.fingerprint()
    );
    assert_eq!(kubeadm_calls(&lab), calls, "a refused run called kubeadm");
    std::fs::write(&known_hosts, saved).unwrap();

    // A host presenting a different key is refused, naming both fingerprints.
    let expected = worker.fingerprint();
    worker.new_host_key();
    let presented = worker.fingerprint();
    let o = lab.kprov(&yes);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains(&expected) && err.contains(&presented),
        "expected {expected} and {presented} in:\n{err}"
    );

    // delete: instances gone, hosts gone, state gone.
    code(
        &lab,
        &lab.kprov(&["delete", "cluster", cluster, "--yes"]),
        0,
    );
    lab.sync();
    assert!(lab.instances().is_empty(), "{:?}", lab.instances().keys());
    assert_eq!(
        lab.kprov(&["get", "cluster", cluster]).status.code(),
        Some(1)
    );
    assert!(lab.sync_errors().is_empty(), "{:?}", lab.sync_errors());
}

#[test]
fn public_cluster_comes_up_on_instances_played_by_test_hosts() {
    crate::needs_tier!(CloudLab);
    lifecycle(
        "pub.lab.example",
        "lab.example",
        &[],
        Reach::PrivateAddresses,
    );
}

#[test]
fn private_cluster_comes_up_through_the_bastion() {
    crate::needs_tier!(CloudLab);
    lifecycle(
        "priv.lab.example",
        "lab.example",
        &["--topology", "private", "--bastion"],
        Reach::Bastion,
    );
}
