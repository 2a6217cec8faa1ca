//! Reaching a cluster's API through an SSH tunnel: a real sshd test host forwards a loopback
//! port to an API server that only the host can reach.

use std::sync::Arc;
use std::time::Duration;

use kprov::spec::HostRole;
use kprov::ssh::{NoProgress, SshFleet, SshOptions};

use crate::support::fakekube::{FakeKube, node, system_pod};
use crate::support::memstate::MemStore;
use crate::support::testhosts::TestHosts;

/// One test host and a fake API server listening where the host reaches it (the gateway).
async fn host_and_api() -> (TestHosts, FakeKube) {
    let th = tokio::task::spawn_blocking(|| TestHosts::start(1))
        .await
        .unwrap();
    let fake = FakeKube::start_on(&th.gateway).await;
    (th, fake)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_is_reached_through_a_forwarded_port() {
    crate::needs_tier!(SshdHosts);
    // The API listens where the host reaches it; kprov talks only to its own loopback.
    let (th, fake) = host_and_api().await;
    fake.put(node("cp1", true, true, false, Some("aws:///a/i-1")));
    let h = &th.hosts[0];
    let host = th.spec_host(h, HostRole::ControlPlane);
    let store = Arc::new(MemStore::default());
    let options = SshOptions {
        accept_new_host_keys: true,
        connect_timeout: Duration::from_secs(5),
        ..SshOptions::default()
    };
    let fleet = SshFleet::new(
        "tunnel.example.com",
        vec![host],
        store,
        options,
        Arc::new(NoProgress),
    )
    .expect("fleet");
    let local = fleet
        .forward(&h.name, &th.gateway, fake.addr.port())
        .await
        .expect("forward");
    assert!(local.ip().is_loopback());
    let kube =
        kprov::kube::Kube::from_kubeconfig_through(&fake.kubeconfig, None, &local.to_string())
            .await
            .expect("client");
    let nodes = kube.list_nodes().await.expect("nodes through the tunnel");
    assert_eq!(nodes.len(), 1);
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.path.starts_with("/api/v1/nodes")),
        "{:?}",
        fake.requests()
    );

    // A tunnel to a host that is not in the fleet is refused by name.
    let err = fleet.forward("nope", "127.0.0.1", 6443).await.unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
    fleet.close().await;
}

/// `kprov validate cluster --ssh-tunnel` with the credentials and host keys kprov keeps in the
/// store: the binary reaches an API server only the control-plane host can reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_reaches_the_api_through_the_control_plane() {
    crate::needs_tier!(SshdHosts);
    let (th, fake) = host_and_api().await;
    fake.put(node("cp1", true, true, false, None));
    fake.put(system_pod("calico-node-a", "calico-node", "cp1"));
    fake.put(system_pod("coredns-1", "kube-dns", "cp1"));
    let h = &th.hosts[0];
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let spec = format!(
        "apiVersion: kprov.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: tunnel.lab\nspec:\n  cloudProvider: metal\n  hosts:\n  - {{name: cp1, address: \"{}\", port: {}, user: root, keyPath: \"{}\", roles: [control-plane]}}\n",
        h.address,
        h.port,
        th.client_key.display()
    );
    std::fs::write(dir.path().join("c.yaml"), spec).unwrap();
    let kprov = assert_cmd::cargo::cargo_bin("kprov");
    let run = |args: &[&str]| {
        let mut c = tokio::process::Command::new(&kprov);
        c.args(args)
            .env("KPROV_STATE_STORE", format!("file://{}", state.display()))
            .env("HOME", dir.path())
            .env("NO_COLOR", "1");
        c
    };
    let o = run(&["create", "-f", dir.path().join("c.yaml").to_str().unwrap()])
        .output()
        .await
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // What provisioning leaves in the store: the host's key and the admin credentials.
    let key_line = if h.port == 22 {
        format!("{} {}", h.address, h.host_public_key())
    } else {
        format!("[{}]:{} {}", h.address, h.port, h.host_public_key())
    };
    std::fs::write(state.join("tunnel.lab/known_hosts"), key_line).unwrap();
    std::fs::create_dir_all(state.join("tunnel.lab/secrets")).unwrap();
    std::fs::copy(
        &fake.kubeconfig,
        state.join("tunnel.lab/secrets/admin.conf"),
    )
    .unwrap();

    let o = run(&[
        "validate",
        "cluster",
        "tunnel.lab",
        "--ssh-tunnel",
        "-o",
        "json",
    ])
    .output()
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("\"ok\": true"), "{stdout}");
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.path.starts_with("/api/v1/nodes"))
    );

    // A host whose key kprov never recorded is refused, tunnel or not.
    std::fs::write(state.join("tunnel.lab/known_hosts"), "").unwrap();
    let o = run(&["validate", "cluster", "tunnel.lab", "--ssh-tunnel"])
        .output()
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--accept-new-host-keys"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
