//! `get addons`, `update addons` and `validate cluster` through the real binary, against the
//! HTTP fake of the Kubernetes API.

use std::sync::Arc;

use crate::support::cli::{Env, fails, ok, says, show as out};
use crate::support::fakekube::{FakeKube, ccm_stand_in, node, system_pod};

/// A scratch environment holding one AWS cluster spec (no cloud is contacted).
fn env_with(cluster: &str) -> Env {
    let env = Env::new();
    env.create_aws(cluster);
    env
}

/// `command` (`update addons NAME`, `validate cluster NAME`) with `--kubeconfig KC` and `extra`.
async fn with_kubeconfig(
    env: &Env,
    command: &[&str],
    kc: &str,
    extra: &[&str],
) -> std::process::Output {
    let args = [command, &["--kubeconfig", kc][..], extra].concat();
    env.run_async(&args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_addons_prints_the_manifests_applied() {
    let env = env_with("addons.example.com");
    let o = env
        .run_async(&["get", "addons", "addons.example.com"])
        .await;
    let yaml = ok(&o);
    assert!(
        yaml.contains("registry.k8s.io/provider-aws/cloud-controller-manager:v1.35.0"),
        "{yaml}"
    );
    assert!(
        yaml.contains("node.cloudprovider.kubernetes.io/uninitialized")
            && yaml.contains("kind: ClusterRole")
    );
    assert!(yaml.contains("CALICO_IPV4POOL_CIDR") && yaml.contains("100.96.0.0/11"));
    // Every document parses as the Kubernetes object it claims to be.
    let objects = kprov::kube::parse_manifests(&yaml, "get addons").expect("valid manifests");
    assert!(objects.len() > 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_addons_previews_read_only_then_applies_then_is_a_no_op() {
    let fake = Arc::new(FakeKube::start().await);
    fake.put(node("cp1", true, false, true, None));
    let env = env_with("live.example.com");
    let kc = fake.kubeconfig.display().to_string();
    let update_addons = async |extra: &[&str]| {
        with_kubeconfig(&env, &["update", "addons", "live.example.com"], &kc, extra).await
    };

    let o = update_addons(&["--exit-code"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", out(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .contains("DaemonSet kube-system/cloud-controller-manager"),
        "{}",
        out(&o)
    );
    fake.assert_no_writes();
    assert!(
        fake.get("DaemonSet", Some("kube-system"), "cloud-controller-manager")
            .is_none()
    );

    // Stand-ins for the kubelet and the CCM: once the DaemonSet exists it rolls out and
    // initialises the node.
    let ccm = ccm_stand_in(&fake, &[("cp1", true, "aws:///eu-west-1a/i-1")]);
    let o = update_addons(&["--yes", "--wait", "30s"]).await;
    assert!(o.status.success(), "{}", out(&o));
    ccm.await.unwrap();
    assert!(
        fake.get("DaemonSet", Some("kube-system"), "calico-node")
            .is_some()
    );

    fake.clear_requests();
    let o = update_addons(&["--exit-code"]).await;
    assert_eq!(
        o.status.code(),
        Some(0),
        "unchanged add-ons must report no changes: {}",
        out(&o)
    );
    fake.assert_no_writes();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_cluster_exit_code_follows_health() {
    let fake = FakeKube::start().await;
    let env = env_with("health.example.com");
    let kc = fake.kubeconfig.display().to_string();
    fake.put(node(
        "cp1",
        true,
        true,
        false,
        Some("aws:///eu-west-1a/i-1"),
    ));
    fake.put(node("w1", false, true, true, None));
    fake.put(node(
        "w2",
        false,
        true,
        false,
        Some("aws:///eu-west-1a/i-3"),
    ));
    for (name, n) in [
        ("calico-node-a", "cp1"),
        ("calico-node-b", "w1"),
        ("calico-node-c", "w2"),
    ] {
        fake.put(system_pod(name, "calico-node", n));
    }
    fake.put(system_pod("coredns-1", "kube-dns", "w2"));
    fake.put(system_pod("ccm-1", "cloud-controller-manager", "cp1"));

    let o = with_kubeconfig(
        &env,
        &["validate", "cluster", "health.example.com"],
        &kc,
        &["-o", "json"],
    )
    .await;
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["ok"], false);
    assert!(v["failures"].to_string().contains("w1"), "{v}");

    fake.put(node(
        "w1",
        false,
        true,
        false,
        Some("aws:///eu-west-1a/i-2"),
    ));
    let o = with_kubeconfig(
        &env,
        &["validate", "cluster", "health.example.com"],
        &kc,
        &[],
    )
    .await;
    ok(&o);
    says(&o, "is ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addon_commands_without_credentials_say_how_to_get_them() {
    let env = env_with("fresh.example.com");
    let o = env
        .run_async(&["validate", "cluster", "fresh.example.com"])
        .await;
    fails(&o, 1);
    says(&o, "kprov update cluster fresh.example.com --yes");
}
