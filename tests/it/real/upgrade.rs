//! Scenario 6 of issue 17: a patch upgrade 1.36.2 -> 1.36.3 through `rolling-update`, with
//! the archive's binaries RELABELLED (`realk8s::relabelled`, ../shared/real-k8s/relabel.py's
//! semantics): the same code under another version label. It proves kprov's upgrade
//! PROCEDURE on real kubeadm and kubelets, not any change in Kubernetes.

use std::time::{Duration, Instant};

use kprov::spec::{AssetFile, ImageArchive, Object, ObjectRef};

use crate::support::realcluster::RealCluster;
use crate::support::realhosts::RealLab;
use crate::support::realk8s::{self, ImageKind};

const TO: &str = "1.36.3";

/// Scenario 6, the upgrade PROCEDURE (not a change in Kubernetes: 1.36.3 is 1.36.2's code
/// relabelled). A 1.36.2 cluster (1 control plane + 1 worker) gets `kubernetesVersion: 1.36.3`
/// with the relabelled kubeadm, kubelet and kubectl as `spec.assets.files` overrides (file://
/// and sha256: they differ from the upstream sums kprov pins for 1.36.3) and the 1.36.3 images
/// built from them as `spec.assets.images`. The `rolling-update` preview names both nodes with
/// the version step; `--yes` runs `kubeadm upgrade apply v1.36.3` on the control plane (the
/// kubeadm-config ConfigMap says v1.36.3, the static pods run the v1.36.3 images) and
/// `kubeadm upgrade node` on the worker; every kubelet reports v1.36.3 and every node is Ready.
#[test]
fn scenario_patch_upgrade_procedure() {
    let t0 = Instant::now();
    let Some(lab) = RealLab::for_cluster(&["cp1", "worker1"]) else {
        return;
    };
    let name = "upgrade.real.example";
    let cp_addr = lab.host("cp1").address;
    let c = RealCluster::with_endpoint(
        &lab,
        name,
        &[("cp1", &["control-plane"]), ("worker1", &["node"])],
        format!("{cp_addr}:6443"),
    );
    c.update_yes();
    c.wait_nodes_ready(&["cp1", "worker1"], Duration::from_secs(300));
    eprintln!("1.36.2 cluster Ready in {:?}", t0.elapsed());

    // The relabelled binaries and the images kubeadm v1.36.3 asks for, built from them.
    let t = Instant::now();
    let dir = realk8s::relabelled(c.bins, &format!("v{TO}"));
    let images: Vec<realk8s::Image> = [
        ImageKind::KubeApiserver,
        ImageKind::KubeControllerManager,
        ImageKind::KubeScheduler,
        ImageKind::KubeProxy,
    ]
    .iter()
    .map(|k| realk8s::image(c.bins, &dir, &format!("v{TO}"), *k))
    .collect();
    eprintln!("relabelled binaries and 4 images in {:?}", t.elapsed());

    let yaml = c.kprov_ok(&["get", "cluster", name, "-o", "yaml"]);
    let mut objects: Vec<Object> = kprov::spec::load_objects("stored", &yaml)
        .expect("stored objects parse")
        .into_iter()
        .map(|o| o.value)
        .collect();
    for o in &mut objects {
        if let Object::Cluster(cl) = o {
            cl.spec.kubernetes_version = Some(TO.into());
            let assets = cl.spec.assets.as_mut().expect("assets");
            for f in assets.files.iter_mut() {
                if ["kubeadm", "kubelet", "kubectl"].contains(&f.name.as_str()) {
                    let path = dir.join(&f.name);
                    *f = AssetFile {
                        name: f.name.clone(),
                        url: format!("file://{}", path.display()),
                        sha256: realk8s::sha256_file(&path),
                    };
                }
            }
            assets.images.extend(images.iter().map(|i| ImageArchive {
                url: format!("file://{}", i.path.display()),
                sha256: i.sha256.clone(),
            }));
        }
    }
    let refs = objects.iter().map(|o| match o {
        Object::Cluster(c) => ObjectRef::Cluster(c),
        Object::InstanceGroup(g) => ObjectRef::InstanceGroup(g),
    });
    let path = lab.dir().join("upgrade.yaml");
    std::fs::write(&path, kprov::spec::to_yaml_stream(refs).expect("yaml")).expect("spec");
    c.kprov_ok(&["replace", "-f", path.to_str().expect("utf-8")]);

    let preview = c.kprov_ok(&["rolling-update", "cluster", name]);
    eprintln!("rolling-update preview:\n{preview}");
    for n in ["cp1", "worker1"] {
        assert!(
            preview
                .lines()
                .any(|l| l.contains(n) && l.contains("1.36.2") && l.contains(TO)),
            "preview names {n} with the version step:\n{preview}"
        );
    }
    let t = Instant::now();
    let out = c.kprov_ok(&["rolling-update", "cluster", name, "--yes"]);
    eprintln!("rolling-update --yes: {:?}\n{out}", t.elapsed());
    c.wait_nodes_ready(&["cp1", "worker1"], Duration::from_secs(300));

    // upgrade apply on the control plane: kubeadm's own record and the static pods.
    let kubeadm_config = c.kubectl_ok(&[
        "-n",
        "kube-system",
        "get",
        "configmap",
        "kubeadm-config",
        "-o",
        "jsonpath={.data.ClusterConfiguration}",
    ]);
    assert!(
        kubeadm_config.contains(&format!("kubernetesVersion: v{TO}")),
        "kubeadm-config after upgrade apply:\n{kubeadm_config}"
    );
    c.wait_for(
        "static pods on the v1.36.3 images",
        Duration::from_secs(300),
        || {
            let mut wrong = Vec::new();
            for p in [
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
            ] {
                let image = c.kubectl(&[
                    "-n",
                    "kube-system",
                    "get",
                    "pod",
                    &format!("{p}-cp1"),
                    "-o",
                    "jsonpath={.spec.containers[0].image} {.status.phase}",
                ])?;
                if image != format!("registry.k8s.io/{p}:v{TO} Running") {
                    wrong.push(image);
                }
            }
            if wrong.is_empty() {
                Ok(())
            } else {
                Err(format!("{wrong:?}"))
            }
        },
    );
    let proxy = c.kubectl_ok(&[
        "-n",
        "kube-system",
        "get",
        "daemonset",
        "kube-proxy",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    ]);
    assert_eq!(proxy, format!("registry.k8s.io/kube-proxy:v{TO}"));
    let server = c.kubectl_ok(&["version", "-o", "json"]);
    assert!(
        server.contains(&format!("\"gitVersion\": \"v{TO}\"")),
        "kubectl version:\n{server}"
    );
    for (n, how) in [("cp1", "apply"), ("worker1", "node")] {
        let v = c.kubectl_ok(&[
            "get",
            "node",
            n,
            "-o",
            "jsonpath={.status.nodeInfo.kubeletVersion}",
        ]);
        assert_eq!(v, format!("v{TO}"), "{n}'s kubelet");
        let h = lab.host(n);
        assert_eq!(
            h.exec("cat /var/lib/kprov/kubeadm-upgraded")
                .expect("marker")
                .trim(),
            format!("v{TO}"),
            "{n}: kubeadm upgrade {how} not recorded"
        );
        let version = h.exec("kubelet --version").expect("kubelet");
        assert_eq!(version.trim(), format!("Kubernetes v{TO}"), "{n}");
    }
    // Only upgrade apply backs up the control plane's manifests.
    let backups = lab
        .host("cp1")
        .exec("ls -d /etc/kubernetes/tmp/kubeadm-backup-manifests-* 2>/dev/null || true")
        .expect("exec");
    assert!(
        !backups.trim().is_empty(),
        "no kubeadm upgrade apply backup on cp1"
    );
    let again = c.kprov_ok(&["rolling-update", "cluster", name]);
    assert!(
        !again.lines().any(|l| l.contains("1.36.2")),
        "after the upgrade:\n{again}"
    );
    eprintln!("scenario total {:?}", t0.elapsed());

    if c.kept() {
        return;
    }
    drop(c);
    lab.teardown_clean();
}
