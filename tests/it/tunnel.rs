//! Reaching a cluster's API through an SSH tunnel: a real sshd test host forwards a loopback
//! port to an API server that only the host can reach.

use std::sync::Arc;
use std::time::Duration;

use kprov::spec::{Host, HostRole};
use kprov::ssh::{NoProgress, SshFleet, SshOptions};

use crate::support::fakekube::{FakeKube, node};
use crate::support::memstate::MemStore;
use crate::support::testhosts::TestHosts;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_is_reached_through_a_forwarded_port() {
    let th = tokio::task::spawn_blocking(|| TestHosts::start(1))
        .await
        .unwrap();
    // The API listens where the host reaches it; kprov talks only to its own loopback.
    let fake = FakeKube::start_on(&th.gateway).await;
    fake.put(node("cp1", true, true, false, Some("aws:///a/i-1")));
    let h = &th.hosts[0];
    let host = Host {
        name: h.name.clone(),
        address: h.address.clone(),
        ip: None,
        access_ip: None,
        user: Some("root".into()),
        port: Some(h.port),
        key_path: Some(th.client_key.display().to_string()),
        bastion: None,
        roles: vec![HostRole::ControlPlane],
        labels: Default::default(),
        taints: Vec::new(),
    };
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
