//! `rolling-update cluster` on metal through the binary: real sshd test hosts, stand-in
//! kubeadm from the mirror. What is proven: every provisioned node carries its record;
//! `update cluster --yes` leaves a member whose configuration changed alone and names the
//! command; the preview names the node, the field and the action, exits 2 with
//! `--exit-code`, changes nothing; `--yes` refuses (not built yet) without touching a host;
//! `get instances` lists every host with its status.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::metal::{Lab, VERSION, kprov_inventory, show};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Files one host wrote to its overlay, with contents.
fn host_files(lab: &Lab, host: &str) -> BTreeMap<PathBuf, Vec<u8>> {
    let etc = lab.host(host).upper_path("/etc/x");
    let upper = etc
        .parent()
        .and_then(Path::parent)
        .expect("upper dir")
        .to_path_buf();
    lab.hosts_snapshot()
        .into_iter()
        .filter(|(p, _)| p.starts_with(&upper))
        .collect()
}

#[test]
fn metal_label_change_is_left_to_rolling_update_and_previewed_per_node() {
    let lab = Lab::start(2);
    let name = "roll.metal.example.com";
    let inv = lab.write(
        "inventory.yaml",
        &kprov_inventory(&lab, &[("host1", "control-plane"), ("host2", "node")]),
    );
    let o = lab.kprov(&[
        "create",
        "cluster",
        name,
        "--cloud",
        "metal",
        "--inventory",
        &inv,
        "--kubernetes-version",
        VERSION,
    ]);
    assert!(o.status.success(), "{}", show(&o));
    lab.use_mirror(name, None);
    let o = lab.kprov(&[
        "update",
        "cluster",
        name,
        "--yes",
        "--accept-new-host-keys",
        "--skip-addons",
    ]);
    assert!(o.status.success(), "{}", show(&o));
    for h in ["host1", "host2"] {
        let record = lab
            .host(h)
            .read_upper("/var/lib/kprov/provisioned.json")
            .unwrap_or_else(|| panic!("{h}: no provisioning record"));
        let record: serde_json::Value = serde_json::from_slice(&record).expect("record is JSON");
        assert_eq!(record["kubernetesVersion"], VERSION, "{h}: {record}");
        assert_eq!(record["configDigest"].as_str().map(str::len), Some(64));
    }

    // Converged: nothing to roll.
    let o = lab.kprov(&["rolling-update", "cluster", name, "--exit-code"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("No rolling update needed"),
        "{}",
        show(&o)
    );

    // The spec changes a running worker's labels.
    lab.edit_cluster(name, |c| {
        let h = c
            .spec
            .hosts
            .iter_mut()
            .find(|h| h.name == "host2")
            .expect("host2 in the spec");
        h.labels.insert("tier".into(), "web".into());
    });

    // update --yes leaves it alone, and says which command applies it.
    let before = host_files(&lab, "host2");
    let o = lab.kprov(&["update", "cluster", name, "--yes", "--skip-addons"]);
    assert!(o.status.success(), "{}", show(&o));
    let err = text(&o.stderr);
    assert!(
        err.contains("pending a rolling update") && err.contains("host2"),
        "{}",
        show(&o)
    );
    assert!(
        text(&o.stdout).contains("left alone: pending rolling update"),
        "{}",
        show(&o)
    );
    assert!(
        err.contains(&format!("kprov rolling-update cluster {name}")),
        "{}",
        show(&o)
    );
    assert_eq!(host_files(&lab, "host2"), before, "update changed host2");

    // The preview: kops's table, the node, the field, the action; exit 2; nothing written.
    let store0 = crate::metal::store_snapshot(&lab);
    let hosts0 = lab.hosts_snapshot();
    let o = lab.kprov(&["rolling-update", "cluster", name, "--exit-code"]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let out = text(&o.stdout);
    for want in [
        "NAME",
        "STATUS",
        "NEEDUPDATE",
        "READY",
        "MIN",
        "TARGET",
        "MAX",
        "NODES",
        "NeedsUpdate",
        "labels {} -> {tier=web}",
        "re-provision in place",
        "leave alone",
        "up to date",
    ] {
        assert!(out.contains(want), "{want} missing:\n{}", show(&o));
    }
    let host2_line = out
        .lines()
        .find(|l| l.starts_with("host2"))
        .expect("a line for host2");
    assert!(host2_line.contains("re-provision in place"), "{host2_line}");
    let host1_line = out
        .lines()
        .find(|l| l.starts_with("host1"))
        .expect("a line for host1");
    assert!(host1_line.contains("leave alone"), "{host1_line}");

    let o = lab.kprov(&["rolling-update", "cluster", name, "-o", "json"]);
    assert!(o.status.success(), "{}", show(&o));
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json plan");
    let mut nodes = Vec::new();
    for g in plan["groups"].as_array().expect("groups") {
        nodes.extend(g["nodes"].as_array().expect("nodes").iter().cloned());
    }
    let host2 = nodes
        .iter()
        .find(|n| n["target"] == "host2")
        .expect("host2 in the plan");
    assert_eq!(host2["action"], "reprovision", "{host2}");
    assert_eq!(host2["needsUpdate"], true, "{host2}");
    let host1 = nodes.iter().find(|n| n["target"] == "host1").unwrap();
    assert_eq!(host1["action"], "leave", "{host1}");

    // Selection: only the control planes: nothing to roll.
    let o = lab.kprov(&[
        "rolling-update",
        "cluster",
        name,
        "--instance-group-roles",
        "ControlPlane",
        "--exit-code",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let o = lab.kprov(&[
        "rolling-update",
        "cluster",
        name,
        "--instance-group",
        "nope",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("no such instance group"),
        "{}",
        show(&o)
    );

    // --yes is refused (the machine side is not built yet): no host changed.
    let o = lab.kprov(&["rolling-update", "cluster", name, "--yes"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        text(&o.stderr).contains("not implemented yet"),
        "{}",
        show(&o)
    );

    assert_eq!(lab.hosts_snapshot(), hosts0, "the preview changed a host");
    assert_eq!(
        crate::metal::store_snapshot(&lab),
        store0,
        "the preview wrote to the store"
    );

    // get instances: every host, its group and status with why.
    let o = lab.kprov(&["get", "instances", name]);
    assert!(o.status.success(), "{}", show(&o));
    let out = text(&o.stdout);
    let line = |h: &str| {
        out.lines()
            .find(|l| l.starts_with(h))
            .unwrap_or_else(|| panic!("{h} missing:\n{out}"))
            .to_string()
    };
    assert!(line("host1").contains("control-plane") && line("host1").contains("up to date"));
    assert!(
        line("host2").contains("nodes") && line("host2").contains("needs update: labels"),
        "{out}"
    );
}
