//! AWS clusters come up for real (issue 11): the kprov binary against moto in a cloud lab,
//! every instance played by an sshd test host with the host key from its user-data, the
//! stand-in kube binaries from the lab's mirror, the add-ons applied to the lab's fake API.
//!
//! create → preview (read-only: no write, nothing run on a host) → update --yes (every
//! instance provisioned, admin kubeconfig stored, add-ons applied) → no changes → a group
//! grows → the new instance joins → a host presenting a different key is refused, naming
//! both fingerprints → delete --yes. Public topology (the operator reaches the instances at
//! their private addresses, as over a VPN: moto's public addresses are invented) and private
//! topology (through the bastion, the only instance the operator has a route to).
//!
//! Needs root. `PRIVATE_ADDRESSES` is the flag that selects private addresses
//! (`update cluster --ssh-private-address`, or `spec.topology.sshAddress: Private`).

use std::process::Output;
use std::sync::Arc;

use kprov::spec::{InstanceGroupRole, Object};

use crate::support::cloudlab::{CloudLab, VERSION, snapshot};

/// The flag that makes kprov connect to instances at their private addresses.
const PRIVATE_ADDRESSES: &[&str] = &["--ssh-private-address"];
const IMAGE: &str = "099720109477/ubuntu/images/hvm-ssd/ubuntu-xenial-16.04-amd64-server-*";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn code(lab: &CloudLab, o: &Output, want: i32) -> String {
    assert_eq!(
        o.status.code(),
        Some(want),
        "stdout:\n{}\nstderr:\n{}\nlab sync errors: {:?}\nmoto:\n{}",
        text(&o.stdout),
        text(&o.stderr),
        lab.sync_errors(),
        lab.moto_log()
    );
    text(&o.stdout)
}

fn kubeadm_calls(lab: &CloudLab) -> usize {
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

/// The instances of the group with `role`, by instance ID, as the lab plays them.
fn with_call(lab: &CloudLab, prefix: &str) -> Vec<String> {
    lab.instances()
        .iter()
        .filter(|(_, h)| h.standin_calls().iter().any(|(_, c)| c.starts_with(prefix)))
        .map(|(id, _)| id.clone())
        .collect()
}

async fn make_zone(lab: &CloudLab, zone: &str) {
    let sdk = lab.sdk_config().await;
    aws_sdk_route53::Client::new(&sdk)
        .create_hosted_zone()
        .name(zone)
        .caller_reference(zone)
        .send()
        .await
        .expect("zone");
}

fn lifecycle(cluster: &str, zone: &str, extra: &[&str]) {
    let lab = Arc::new(CloudLab::start());
    lab.block_on(make_zone(&lab, zone));
    let ssh_dir = lab.home.join(".ssh");
    std::fs::create_dir_all(&ssh_dir).unwrap();
    let key = ssh_dir.join("id_ed25519");
    assert!(
        std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "operator", "-f"])
            .arg(&key)
            .status()
            .unwrap()
            .success()
    );
    lab.add_operator_key(&key);
    let public = format!("{}.pub", key.display());
    let vpc = lab.net.vpc_cidr().to_string();
    let mut create = vec![
        "create",
        "cluster",
        cluster,
        "--cloud",
        "aws",
        "--zones",
        "us-east-1a",
        "--ssh-public-key",
        &public,
        "--image",
        IMAGE,
        "--network-cidr",
        &vpc,
        "--kubernetes-version",
        VERSION,
        "--node-count",
        "2",
    ];
    create.extend_from_slice(extra);
    code(&lab, &lab.kprov(&create), 0);
    lab.use_mirror(cluster);
    lab.watch();

    // The preview: read-only. No write to the store, no instance, nothing on a host.
    let store0 = snapshot(&lab.store_dir());
    let mut preview = vec!["update", "cluster", cluster, "--exit-code"];
    preview.extend_from_slice(PRIVATE_ADDRESSES);
    let out = code(&lab, &lab.kprov(&preview), 2);
    assert!(out.contains("Will create"), "{out}");
    assert_eq!(snapshot(&lab.store_dir()), store0, "the preview wrote");
    assert!(lab.instances().is_empty(), "the preview started instances");

    // --yes: every instance provisioned, credentials stored, add-ons applied.
    let mut yes = vec!["update", "cluster", cluster, "--yes"];
    yes.extend_from_slice(PRIVATE_ADDRESSES);
    code(&lab, &lab.kprov(&yes), 0);
    let instances = lab.instances();
    assert!(
        instances.len() >= 3,
        "{:?}; lab sync errors: {:?}",
        instances.keys(),
        lab.sync_errors()
    );
    assert_eq!(with_call(&lab, "kubeadm init").len(), 1);
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
    let writes: Vec<String> = lab
        .fake
        .requests()
        .iter()
        .filter(|r| r.is_write())
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
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
    code(
        &lab,
        &lab.kprov(&[
            "export",
            "kubeconfig",
            cluster,
            "--kubeconfig",
            kc.to_str().unwrap(),
        ]),
        0,
    );
    let kc = std::fs::read_to_string(&kc).unwrap();
    assert!(kc.contains(&format!("current-context: {cluster}")), "{kc}");

    // Again: no changes, nothing run on a host; the preview is read-only on a live cluster.
    let calls = kubeadm_calls(&lab);
    let o = lab.kprov(&yes);
    code(&lab, &o, 0);
    assert!(
        text(&o.stderr).contains("No changes"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(kubeadm_calls(&lab), calls, "the re-run called kubeadm");
    let (store1, hosts1) = (snapshot(&lab.store_dir()), lab.hosts_snapshot());
    code(&lab, &lab.kprov(&preview), 0);
    assert_eq!(snapshot(&lab.store_dir()), store1, "the preview wrote");
    assert_eq!(lab.hosts_snapshot(), hosts1, "the preview changed a host");

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

    // A host presenting a different key is refused, naming both fingerprints.
    let worker = lab.instances()[&new[0]].clone();
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
    lifecycle("pub.lab.example", "lab.example", &[]);
}

#[test]
#[ignore = "not passing yet: kprov reaches the bastion at its public address, which moto invents and the lab cannot play"]
fn private_cluster_comes_up_through_the_bastion() {
    lifecycle(
        "priv.lab.example",
        "lab.example",
        &["--topology", "private", "--bastion"],
    );
}
