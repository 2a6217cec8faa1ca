//! `spec.assets.images`: image archives brought to every host and imported into containerd
//! before kubeadm runs, through the real `kprov` binary on sshd test hosts. Needs root.
//!
//! `ctr` here is a STAND-IN (tests/it/support/standins/ctr): it records its calls, checks
//! that it is asked to import into the `k8s.io` namespace from a tar holding an image
//! manifest, and records the sha256 of the file it was given. It imports nothing into any
//! containerd; the real-hosts tier proves the import with real containerd.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};

use kprov::spec::ImageArchive;

use crate::metal::{Lab, layout, metal_update_yes, ok, show, text};
use crate::support::cli::fails;

/// A docker-archive as `docker save` writes it (manifest.json, config, one layer), in `dir`.
pub(crate) fn image_archive(dir: &Path, name: &str, tag: &str) -> (String, String) {
    image_archive_with(dir, name, tag, 0)
}

/// [`image_archive`] whose layer also holds `filler` bytes of noise (a large archive).
fn image_archive_with(dir: &Path, name: &str, tag: &str, filler: usize) -> (String, String) {
    let staging = tempfile::tempdir().expect("staging");
    let s = staging.path();
    std::fs::create_dir_all(s.join("rootfs")).unwrap();
    let mut hello = format!("{name}\n").into_bytes();
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    hello.extend((0..filler).map(|_| {
        // xorshift: incompressible enough, no dependency.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    }));
    std::fs::write(s.join("rootfs/hello"), hello).unwrap();
    let layer = s.join("layer.tar");
    assert!(
        Command::new("tar")
            .args(["--mtime=2025-01-01", "--owner=0", "--group=0", "-cf"])
            .arg(&layer)
            .arg("-C")
            .arg(s.join("rootfs"))
            .arg("hello")
            .status()
            .unwrap()
            .success()
    );
    let diff_id = hex::encode(Sha256::digest(std::fs::read(&layer).unwrap()));
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{"Cmd":["/hello"]}},"rootfs":{{"type":"layers","diff_ids":["sha256:{diff_id}"]}}}}"#
    );
    let config_sha = hex::encode(Sha256::digest(config.as_bytes()));
    std::fs::write(s.join(format!("{config_sha}.json")), &config).unwrap();
    std::fs::write(
        s.join("manifest.json"),
        format!(
            r#"[{{"Config":"{config_sha}.json","RepoTags":["{tag}"],"Layers":["layer.tar"]}}]"#
        ),
    )
    .unwrap();
    let out = dir.join(format!("{name}.tar"));
    assert!(
        Command::new("tar")
            .args(["--mtime=2025-01-01", "--owner=0", "--group=0", "-cf"])
            .arg(&out)
            .arg("-C")
            .arg(s)
            .args(["manifest.json", &format!("{config_sha}.json"), "layer.tar"])
            .status()
            .unwrap()
            .success()
    );
    let sha = hex::encode(Sha256::digest(std::fs::read(&out).unwrap()));
    (out.display().to_string(), sha)
}

/// `(sha256, namespace)` of every import the ctr stand-in saw on `host`.
pub(crate) fn imports(lab: &Lab, host: &str) -> Vec<(String, String)> {
    lab.upper(host, "/var/lib/kprov-standins/ctr-imports")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (sha, ns) = l.split_once(' ')?;
            Some((sha.to_string(), ns.to_string()))
        })
        .collect()
}

fn ctr_calls(lab: &Lab, host: &str) -> Vec<(u128, String)> {
    lab.calls(host)
        .into_iter()
        .filter(|(_, c)| c.starts_with("ctr "))
        .collect()
}

#[test]
fn image_archives_are_previewed_uploaded_once_imported_before_kubeadm_and_tampering_is_refused() {
    crate::needs_tier!(SshdHosts);
    let name = "images.metal.example.com";
    let lab = Lab::with_control_plane_and_worker(name);

    // One archive on the operator's machine (uploaded), one on the lab's mirror (downloaded by
    // each host).
    let (local_path, local_sha) =
        image_archive(lab.dir.path(), "pause", "registry.k8s.io/pause:3.10.1");
    let (served_path, served_sha) = image_archive(
        lab.mirror.root(),
        "apiserver",
        "registry.k8s.io/kube-apiserver:v1.35.1",
    );
    let served_url = format!("{}/apiserver.tar", lab.mirror.url);
    assert!(Path::new(&served_path).exists());
    let local_url = format!("file://{local_path}");
    let images = vec![
        ImageArchive {
            url: local_url.clone(),
            sha256: local_sha.clone(),
        },
        ImageArchive {
            url: served_url.clone(),
            sha256: served_sha.clone(),
        },
    ];
    lab.edit_cluster(name, |c| {
        c.spec.assets.as_mut().expect("assets").images = images.clone();
    });

    // The preview lists both archives for every host, read-only.
    let hosts0 = lab.hosts_snapshot();
    let json: serde_json::Value =
        serde_json::from_str(&ok(&lab.kprov(&["update", "cluster", name, "-o", "json"])))
            .expect("plan json");
    for n in json["nodePlan"]["nodes"].as_array().expect("nodes") {
        assert_eq!(
            n["images"],
            serde_json::json!([local_url, served_url]),
            "{json:#}"
        );
    }
    let o = lab.kprov(&["update", "cluster", name]);
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!(
            "image archives to import: {local_url}, {served_url}"
        )),
        "{}",
        show(&o)
    );
    assert_eq!(lab.hosts_snapshot(), hosts0, "the preview changed a host");

    // --yes: each host imports both (by checksum) into k8s.io, before kubeadm runs.
    lab.provision(name);
    let cache = format!("/var/lib/kprov/cache/image-{local_sha}.tar");
    let mut inodes = Vec::new();
    for (h, kubeadm) in [
        ("host1", "kubeadm init --config"),
        ("host2", "kubeadm join --config"),
    ] {
        let mut got = imports(&lab, h);
        got.sort();
        let mut want = vec![
            (local_sha.clone(), "k8s.io".to_string()),
            (served_sha.clone(), "k8s.io".to_string()),
        ];
        want.sort();
        assert_eq!(got, want, "{h}");
        let calls = ctr_calls(&lab, h);
        assert_eq!(calls.len(), 2, "{h}: {calls:#?}");
        assert!(
            calls
                .iter()
                .all(|(_, c)| c.starts_with("ctr -n k8s.io images import ")),
            "{calls:#?}"
        );
        assert!(
            calls.iter().all(|(t, _)| *t < lab.first_call(h, kubeadm)),
            "{h}: an image was imported after {kubeadm}"
        );
        for sha in [&local_sha, &served_sha] {
            assert!(
                lab.upper(h, &format!("/var/lib/kprov/images/{sha}"))
                    .is_some(),
                "{h}: no marker for {sha}"
            );
        }
        let meta = std::fs::metadata(lab.host(h).upper_path(&cache)).expect("uploaded archive");
        inodes.push(meta.ino());
        // Downloaded archives are not kept.
        assert!(
            lab.upper(h, &format!("/var/lib/kprov/cache/image-{served_sha}.tar"))
                .is_none()
        );
    }
    let downloads = |lab: &Lab| {
        lab.mirror_downloads()
            .iter()
            .filter(|p| p.ends_with("/apiserver.tar"))
            .count()
    };
    assert_eq!(downloads(&lab), 2, "{:?}", lab.mirror_downloads());

    // A second run: the preview lists nothing, --yes uploads, downloads and imports nothing.
    let json: serde_json::Value =
        serde_json::from_str(&ok(&lab.kprov(&["update", "cluster", name, "-o", "json"])))
            .expect("plan json");
    for n in json["nodePlan"]["nodes"].as_array().expect("nodes") {
        assert!(n.get("images").is_none(), "{json:#}");
        assert_eq!(n["pending"], false, "{json:#}");
    }
    lab.provision(name);
    for (i, h) in ["host1", "host2"].into_iter().enumerate() {
        assert_eq!(ctr_calls(&lab, h).len(), 2, "{h}: imported again");
        let meta = std::fs::metadata(lab.host(h).upper_path(&cache)).expect("uploaded archive");
        assert_eq!(meta.ino(), inodes[i], "{h}: the archive was uploaded again");
    }
    assert_eq!(downloads(&lab), 2, "downloaded again");

    // The operator's file changed under the spec: refused on the operator's machine, naming
    // the file and both checksums, before any host is contacted for a change.
    let original = std::fs::read(&local_path).unwrap();
    let mut tampered = original.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    std::fs::write(&local_path, &tampered).unwrap();
    let actual = hex::encode(Sha256::digest(&tampered));
    let hosts1 = lab.hosts_snapshot();
    for args in [
        &["update", "cluster", name][..],
        &["update", "cluster", name, "--yes", "--skip-addons"][..],
    ] {
        let o = lab.kprov(args);
        let err = fails(&o, 1);
        assert!(
            err.contains(&format!(
                "image archive {local_url} (spec.assets.images): checksum mismatch: expected sha256 {local_sha}, got {actual}; nothing uploaded or imported"
            )),
            "{}",
            show(&o)
        );
    }
    assert_eq!(
        lab.hosts_snapshot(),
        hosts1,
        "a refused archive changed a host"
    );
    std::fs::write(&local_path, &original).unwrap();

    // A served archive that is not what the spec pins: each host refuses it naming the URL and
    // both checksums, and imports nothing from it.
    let (_, other_sha) = image_archive(lab.mirror.root(), "other", "example.com/other:1");
    let wrong = "0".repeat(64);
    let bad_url = format!("{}/other.tar", lab.mirror.url);
    lab.edit_cluster(name, |c| {
        c.spec
            .assets
            .as_mut()
            .expect("assets")
            .images
            .push(ImageArchive {
                url: bad_url.clone(),
                sha256: wrong.clone(),
            });
    });
    let o = lab.kprov(&["update", "cluster", name, "--yes", "--skip-addons"]);
    let err = fails(&o, 1);
    assert!(
        err.contains(&format!(
            "image archive {bad_url}: checksum mismatch: expected sha256 {wrong}, got {other_sha}; nothing imported"
        )),
        "{}",
        show(&o)
    );
    for h in ["host1", "host2"] {
        assert_eq!(ctr_calls(&lab, h).len(), 2, "{h}: imported the bad archive");
        assert!(
            lab.upper(h, &format!("/var/lib/kprov/images/{wrong}"))
                .is_none(),
            "{h}: marker for a refused archive"
        );
        assert!(
            !imports(&lab, h).iter().any(|(s, _)| *s == other_sha),
            "{h}: imported"
        );
    }
}

/// The image archives of a host are imported as each lands, while the next ones upload, and
/// one import failing among others: the step fails naming that archive with ctr's message,
/// the others are imported and marked, and a re-run imports only the failed one (its archive
/// already on the host: uploaded once).
#[test]
fn an_archive_is_imported_as_it_lands_and_a_failed_import_among_others_is_redone_alone() {
    crate::needs_tier!(SshdHosts);
    let name = "imports.metal.example.com";
    let lab = Lab::with_cluster(1, name, &layout(1, 0));
    let dir = lab.dir.path();
    let (a, a_sha) = image_archive(dir, "first", "example.com/first:1");
    let (b, b_sha) = image_archive(dir, "second", "example.com/second:1");
    let (c, c_sha) = image_archive(dir, "third", "example.com/third:1");
    lab.edit_cluster(name, |cl| {
        cl.spec.assets.as_mut().expect("assets").images =
            [(&a, &a_sha), (&b, &b_sha), (&c, &c_sha)]
                .into_iter()
                .map(|(p, sha)| ImageArchive {
                    url: format!("file://{p}"),
                    sha256: sha.clone(),
                })
                .collect();
    });
    let h = lab.host("host1");
    h.exec(&format!(
        "mkdir -p /var/lib/kprov-standins && echo {b_sha} > /var/lib/kprov-standins/ctr-fail"
    ))
    .expect("ctr-fail");
    let o = lab.kprov(&metal_update_yes(name, &["-v"]));
    let err = fails(&o, 1);
    let cache = |sha: &str| format!("/var/lib/kprov/cache/image-{sha}.tar");
    assert!(
        err.contains(&format!("ctr: {}: failed as the test asked", cache(&b_sha)))
            && err.contains(&format!(
                "kprov: image archive file://{b}: ctr -n k8s.io images import failed"
            )),
        "{}",
        show(&o)
    );
    let marker = |sha: &str| lab.upper("host1", &format!("/var/lib/kprov/images/{sha}"));
    assert!(
        marker(&a_sha).is_some() && marker(&c_sha).is_some(),
        "{}",
        show(&o)
    );
    assert!(marker(&b_sha).is_none());
    assert!(
        lab.calls("host1")
            .iter()
            .all(|(_, c)| !c.starts_with("kubeadm init"))
    );
    // Each archive's import was started by the batch as the archive landed (`-v` shows the
    // batch's own markers: a hook starts before the next file's upload begins, which the
    // engine's `at_most_four_hooks_run_at_once_each_started_before_the_next_upload` checks),
    // in upload order, and ctr ran once for each: the step's run, after the failed hook,
    // imported nothing.
    let hooked: Vec<usize> = [&a_sha, &b_sha, &c_sha]
        .iter()
        .map(|sha| {
            err.lines()
                .position(|l| {
                    l.ends_with(&format!("{} landed, its arrival hook started", cache(sha)))
                })
                .unwrap_or_else(|| panic!("no hook started for {sha}: {}", show(&o)))
        })
        .collect();
    assert!(hooked.windows(2).all(|w| w[0] < w[1]), "{}", show(&o));
    for sha in [&a_sha, &b_sha, &c_sha] {
        let calls = ctr_calls(&lab, "host1")
            .into_iter()
            .filter(|(_, c)| c.starts_with(&format!("ctr -n k8s.io images import {}", cache(sha))))
            .count();
        assert_eq!(calls, 1, "{sha}: {}", show(&o));
    }
    let inode = |sha: &str| {
        std::fs::metadata(h.upper_path(&cache(sha)))
            .expect("cache")
            .ino()
    };
    let inodes: Vec<u64> = [&a_sha, &b_sha, &c_sha].map(|s| inode(s)).to_vec();

    // The cause gone, a re-run imports the failed archive alone, uploading nothing.
    h.exec("rm /var/lib/kprov-standins/ctr-fail").expect("rm");
    let before = imports(&lab, "host1").len();
    lab.provision(name);
    let after = imports(&lab, "host1");
    assert_eq!(after.len(), before + 1, "{after:?}");
    assert_eq!(after.last().map(|(s, _)| s.as_str()), Some(b_sha.as_str()));
    assert!(marker(&b_sha).is_some());
    assert_eq!(
        [&a_sha, &b_sha, &c_sha].map(|s| inode(s)).to_vec(),
        inodes,
        "an archive was uploaded again"
    );
}

/// An image name is the archive's text, and it is in a step's name ("images: import REF"): an
/// ESC and a newline in a tag reach no output raw, on any path the step name takes (the
/// step's progress line at -v, a drifted file's reason in the preview) in plain, TTY and
/// `-o json` output; no line of kprov's own can be forged with it.
#[test]
fn an_image_tag_with_control_characters_is_printed_escaped_in_every_output() {
    crate::needs_tier!(SshdHosts);
    let name = "tags.metal.example.com";
    let lab = Lab::with_cluster(1, name, &layout(1, 0));
    // As the archive's manifest.json holds it: JSON escapes for ESC and a newline.
    let (path, sha) = image_archive(
        lab.dir.path(),
        "evil",
        r"registry.example/evil:v1\u001b[31m\nerror: forged",
    );
    lab.edit_cluster(name, |c| {
        c.spec.assets.as_mut().expect("assets").images = vec![ImageArchive {
            url: format!("file://{path}"),
            sha256: sha.clone(),
        }];
    });
    let escaped = r"images: import registry.example/evil:v1\x1b[31m\nerror: forged";
    let forged = |out: &str| {
        out.lines().any(|l| {
            l.trim_start_matches(['\r', ' '])
                .starts_with("error: forged")
        })
    };

    // Plain, and -o json: the step's progress line at -v.
    for extra in [&[][..], &["-o", "json"][..]] {
        let mut args = metal_update_yes(name, &["-v"]);
        args.extend_from_slice(extra);
        let o = lab.kprov(&args);
        let err = text(&o.stderr);
        assert!(o.status.success(), "{}", show(&o));
        assert!(err.contains(escaped), "{extra:?}: {}", show(&o));
        assert!(
            !err.contains('\x1b') && !forged(&err),
            "{extra:?}: {}",
            show(&o)
        );
    }

    // The uploaded archive drifts on the host: the preview's reason names the step.
    let cache = format!("/var/lib/kprov/cache/image-{sha}.tar");
    std::fs::write(lab.host("host1").upper_path(&cache), b"drifted").expect("drift");
    let o = lab.kprov(&["update", "cluster", name]);
    let err = text(&o.stderr);
    assert!(err.contains(escaped), "plain: {}", show(&o));
    assert!(
        !err.contains('\x1b') && !forged(&err),
        "plain: {}",
        show(&o)
    );

    let o = lab.kprov(&["update", "cluster", name, "-o", "json"]);
    let out = text(&o.stdout);
    assert!(!out.contains('\x1b'), "json: {}", show(&o));
    let plan: serde_json::Value = serde_json::from_str(&out).expect("plan json");
    let reasons = plan["nodePlan"]["nodes"][0]["reasons"].to_string();
    assert!(
        reasons.contains(
            &serde_json::to_string(escaped)
                .unwrap()
                .trim_matches('"')
                .to_string()
        ),
        "json: {plan:#}"
    );
    assert!(!reasons.contains("\\u001b"), "json: {plan:#}");

    // On a terminal (colours on: the printer's own sequences only).
    let o = lab.kprov_tty(&["update", "cluster", name]);
    let all = text(&o.stdout);
    assert!(all.contains(escaped), "tty: {all}");
    assert!(!all.contains("\x1b[31m\n") && !forged(&all), "tty: {all}");
}
