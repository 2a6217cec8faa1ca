//! Air-gapped bundles through the real `kprov` binary: `get assets` (golden), `create bundle`
//! from a local HTTP mirror and Debian's real `docker-registry` (images pushed with `skopeo`),
//! then an install of sshd test hosts from the bundle alone, and a flipped byte refused.
//! The install test needs root (network namespaces); `ctr` on the hosts is the stand-in of
//! tests/it/images.rs (it checks an image layout and records the archive's sha256).

use std::path::PathBuf;

use crate::images::{image_archive, imports};
use crate::metal::{Lab, metal_update_yes, ok, show, text};
use crate::support;
use crate::support::cli::Env;
use crate::support::cli::create_metal;
use crate::support::cli::{holds_all, says};
use crate::support::registry::{Registry, member_offset, split_reference};

/// `o` failed (exit 1) naming the bundle's entry whose checksum does not match.
#[track_caller]
fn refused_for_checksum(o: &std::process::Output, member: &str) {
    assert_eq!(o.status.code(), Some(1), "{}", show(o));
    assert!(
        text(&o.stderr).contains(&format!("entry {member}: checksum mismatch")),
        "{}",
        show(o)
    );
}

fn assets_json(run: impl Fn(&[&str]) -> std::process::Output, name: &str) -> String {
    let o = run(&["get", "assets", name, "-o", "json"]);
    assert!(o.status.success(), "{}", show(&o));
    text(&o.stdout)
}

/// The default AWS spec's list: every binary of both architectures from upstream with its
/// pinned sha256, kubeadm's images, Calico's and the AWS CCM's; no API proxy (the load
/// balancer is the endpoint); CoreDNS of 1.36 without a tag (kprov does not pin it).
#[test]
fn get_assets_of_the_default_aws_spec_is_golden() {
    let env = Env::new();
    env.create_aws("assets.example.com");
    let json = assets_json(|a| env.run(a), "assets.example.com");
    insta::assert_snapshot!("assets-default-aws", json);
    let table = ok(&env.run(&["get", "assets", "assets.example.com"]));
    holds_all(&table, &["(resolved when fetched: only the tag is pinned)"]);
}

/// The default metal spec (stacked etcd: no etcd binary; the local API proxy's image).
#[test]
fn get_assets_of_the_default_metal_spec_is_golden() {
    let env = Env::new();
    let inv = env.path("inventory.yaml");
    std::fs::write(
        &inv,
        "hosts:\n  - name: cp1\n    address: 198.18.0.10\n    roles: [control-plane]\n  - name: w1\n    address: 198.18.0.11\n    roles: [node]\n",
    )
    .unwrap();
    let o = env.run(&create_metal(
        "assets.metal.example.com",
        inv.to_str().unwrap(),
    ));
    assert!(o.status.success(), "{}", show(&o));
    let json = assets_json(|a| env.run(a), "assets.metal.example.com");
    insta::assert_snapshot!("assets-default-metal", json);
    let yaml = ok(&env.run(&["get", "assets", "assets.metal.example.com", "-o", "yaml"]));
    holds_all(&yaml, &["docker.io/library/haproxy:3.2-alpine"]);
}

#[test]
fn bundle_from_a_mirror_and_a_registry_installs_with_neither_and_a_flipped_byte_is_refused() {
    crate::needs_tier!(SshdHosts);
    let name = "bundle.metal.example.com";
    let lab = Lab::with_control_plane_and_worker(name);
    let list: serde_json::Value =
        serde_json::from_str(&assets_json(|a| lab.kprov(a), name)).unwrap();
    let images: Vec<String> = list["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["reference"].as_str().unwrap().to_string())
        .collect();
    assert!(images.len() >= 8, "{images:?}");

    // Every image into a real registry, under its upstream repository and tag.
    let registry = Registry::start(std::net::Ipv4Addr::LOCALHOST.into());
    let mut registries = std::collections::BTreeSet::new();
    for (i, r) in images.iter().enumerate() {
        let (reg, repo_tag) = split_reference(r);
        registries.insert(reg.to_string());
        let (archive, _) = image_archive(lab.dir.path(), &format!("img{i}"), r);
        registry.push(&archive, repo_tag);
    }
    let bundle: PathBuf = lab.dir.path().join("site-bundle.tar");
    let mut args = vec![
        "create".to_string(),
        "bundle".into(),
        name.into(),
        "-o".into(),
        bundle.display().to_string(),
    ];
    for reg in &registries {
        args.push("--registry-mirror".into());
        args.push(format!("{reg}=http://{}", registry.addr));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let made = lab.kprov(&args);
    assert!(made.status.success(), "{}", show(&made));
    says(&made, "Wrote bundle");
    let opened = kprov::bundle::Bundle::open(&bundle).expect("the bundle checks out");
    let m = &opened.manifest;
    let binaries = list["binaries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["arch"] == "amd64")
        .count();
    assert_eq!(m.entries.len(), binaries + images.len(), "{m:#?}");
    assert!(
        images
            .iter()
            .all(|r| m.entries.iter().any(|e| &e.name == r))
    );
    assert!(m.entries.iter().all(|e| {
        e.kind != kprov::bundle::EntryKind::Image
            || e.digest
                .as_deref()
                .is_some_and(|d| d.starts_with("sha256:"))
    }));
    registry.stop();

    // No registry, and the hosts download nothing from the mirror: all comes from the bundle.
    let downloads = lab.mirror_downloads().len();
    let b = bundle.display().to_string();
    let plain: serde_json::Value =
        serde_json::from_str(&ok(&lab.kprov(&["update", "cluster", name, "-o", "json"]))).unwrap();
    assert_eq!(
        plain["nodePlan"]["sources"][0]["origin"], "mirror",
        "{plain:#}"
    );
    assert_eq!(
        plain["nodePlan"]["sources"][1]["origin"], "upstream",
        "{plain:#}"
    );
    let preview = lab.kprov(&["update", "cluster", name, "--bundle", &b, "-o", "json"]);
    assert!(preview.status.success(), "{}", show(&preview));
    let plan: serde_json::Value = serde_json::from_str(&text(&preview.stdout)).unwrap();
    for (i, kind) in ["binaries", "images"].into_iter().enumerate() {
        assert_eq!(
            plan["nodePlan"]["sources"][i]["artifacts"], kind,
            "{plan:#}"
        );
        assert_eq!(
            plan["nodePlan"]["sources"][i]["origin"], "bundle",
            "{plan:#}"
        );
    }
    assert_eq!(
        plan["nodePlan"]["nodes"][0]["images"]
            .as_array()
            .map(Vec::len),
        Some(images.len())
    );
    let table = lab.kprov(&["update", "cluster", name, "--bundle", &b]);
    says(
        &table,
        &format!("binaries: from bundle ({b}, uploaded over ssh)"),
    );
    // One full verification per run: the preview's renderer and the apply's share the
    // verified handle (kprov::bundle's debug trace says each verification and each reuse).
    let applied = lab
        .kprov_command(&metal_update_yes(name, &["--bundle", &b]))
        .env("KPROV_LOG", "kprov::bundle=debug")
        .output()
        .expect("runs kprov");
    ok(&applied);
    let trace = text(&applied.stderr);
    assert_eq!(
        trace.matches("bundle verified in full").count(),
        1,
        "{trace}"
    );
    assert!(
        trace.contains("reusing this run's verified bundle"),
        "{trace}"
    );
    assert_eq!(lab.mirror_downloads().len(), downloads, "a host downloaded");
    // The control plane imports every image of the bundle; the worker all but the control
    // plane's own (kube-apiserver, -controller-manager, -scheduler, etcd), which it never runs.
    let images: Vec<&kprov::bundle::Entry> = m
        .entries
        .iter()
        .filter(|e| e.kind == kprov::bundle::EntryKind::Image)
        .collect();
    assert_eq!(
        images
            .iter()
            .filter(|e| support::control_plane_only(&e.name))
            .count(),
        4,
        "the bundle holds the control plane's four images"
    );
    let kubeadm = m.binary("kubeadm").unwrap();
    for (h, worker) in [("host1", false), ("host2", true)] {
        let mut want: Vec<String> = images
            .iter()
            .filter(|e| !worker || !support::control_plane_only(&e.name))
            .map(|e| e.sha256.clone())
            .collect();
        want.sort();
        let mut got: Vec<String> = imports(&lab, h).into_iter().map(|(s, _)| s).collect();
        got.sort();
        assert_eq!(got, want, "{h}");
        let installed = lab.host(h).read_upper("/usr/local/bin/kubeadm").unwrap();
        assert_eq!(
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&installed)),
            kubeadm.sha256,
            "{h}"
        );
    }

    // A flipped byte in one member: refused naming it, before any host changes.
    let bad = lab.dir.path().join("flipped.tar");
    let mut bytes = std::fs::read(&bundle).unwrap();
    let member = "binaries/amd64/kubelet";
    let at = member_offset(&bundle, member) as usize + 10;
    bytes[at] ^= 0x20;
    std::fs::write(&bad, &bytes).unwrap();
    let before = lab.hosts_snapshot();
    let o = lab.kprov(&[
        "update",
        "cluster",
        name,
        "--bundle",
        bad.to_str().unwrap(),
        "--yes",
        "--skip-addons",
    ]);
    refused_for_checksum(&o, member);
    assert_eq!(
        lab.hosts_snapshot(),
        before,
        "a refused bundle changed a host"
    );

    // rolling-update --bundle: the same check before its preview, naming the entry; a good
    // bundle previews (the roll renders from it as update does).
    for yes in [false, true] {
        let mut args = vec![
            "rolling-update",
            "cluster",
            name,
            "--bundle",
            bad.to_str().unwrap(),
        ];
        if yes {
            args.push("--yes");
        }
        let o = lab.kprov(&args);
        refused_for_checksum(&o, member);
    }
    assert_eq!(
        lab.hosts_snapshot(),
        before,
        "rolling-update with a refused bundle changed a host"
    );
    let preview = lab.kprov(&["rolling-update", "cluster", name, "--bundle", &b]);
    assert!(preview.status.success(), "{}", show(&preview));
}
