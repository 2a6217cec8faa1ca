//! Benchmark: making a bundle and uploading it to N real sshd test hosts at once. Run by
//! `scripts/bench-bundle`, as root; prints the sum of artifact sizes, the time to write the
//! bundle (fetch from `file://`, verify, tar), to check it against its manifest, and to upload
//! every member to every host (resumable uploads, sha256 verified on each host), with the
//! upload's aggregate throughput over the hosts' links.
//!
//! Usage: bench_bundle HOSTS MIB (artifacts: four files summing to MIB mebibytes).
// The lint is for the library's surface; test support is `pub` for its own modules.
#![allow(unreachable_pub)]

// The whole harness, as examples/cloudlab.rs takes it: testhosts.rs asks its tier gate.
#[allow(unused_imports)]
#[path = "../tests/it/support/mod.rs"]
mod support;
use support::{memstate, testhosts};

use std::sync::Arc;
use std::time::Instant;

use kprov::bundle::Bundle;
use kprov::bundle::artifacts::{Artifacts, BinaryArtifact, Origin};
use kprov::bundle::fetch::{self, RegistryMirrors};
use kprov::spec::assets::Arch;
use kprov::spec::{Host, HostRole};
use kprov::ssh::task::{RemoteFile, Step};
use kprov::ssh::{NoProgress, SshFleet, SshOptions};
use sha2::{Digest, Sha256};

const CLUSTER: &str = "bench-bundle.example.com";

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let hosts: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    let mib: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(8);
    let dir = tempfile::Builder::new()
        .prefix("kprov-bench-bundle-")
        .tempdir_in("/var/tmp")
        .expect("dir");
    let mut binaries = Vec::new();
    let mut total = 0u64;
    for (i, name) in ["kubeadm", "kubelet", "kubectl", "containerd"]
        .into_iter()
        .enumerate()
    {
        let size = mib * (1 << 20) / 4;
        let data: Vec<u8> = (0..size).map(|j| ((j * 31 + i) % 251) as u8).collect();
        let path = dir.path().join(name);
        std::fs::write(&path, &data).expect("write");
        total += size as u64;
        binaries.push(BinaryArtifact {
            name: name.into(),
            version: "0.0.0".into(),
            arch: "amd64".into(),
            url: format!("file://{}", path.display()),
            sha256: hex::encode(Sha256::digest(&data)),
            size: Some(size as u64),
            origin: Origin::Mirror,
            only_on: None,
        });
    }
    let list = Artifacts {
        cluster: CLUSTER.into(),
        kubernetes_version: "0.0.0".into(),
        binaries,
        images: Vec::new(),
        archives: Vec::new(),
    };
    let out = dir.path().join("bundle.tar");
    let progress = |_: &str| {};
    let t = Instant::now();
    fetch::make(
        &list,
        &out,
        &fetch::Options {
            arch: Arch::Amd64,
            mirrors: RegistryMirrors::default(),
            progress: &progress,
        },
    )
    .await
    .expect("bundle");
    let create = t.elapsed();
    let t = Instant::now();
    let bundle = Bundle::open(&out).expect("open");
    let verify = t.elapsed();

    let th = testhosts::TestHosts::start(hosts);
    let store = Arc::new(memstate::MemStore::default());
    let fleet_hosts: Vec<Host> = th
        .hosts
        .iter()
        .map(|h| Host {
            name: h.name.clone(),
            address: h.address.clone(),
            ip: None,
            access_ip: None,
            user: Some("root".into()),
            port: Some(h.port),
            key_path: Some(th.client_key.display().to_string()),
            bastion: None,
            roles: vec![HostRole::Node],
            labels: Default::default(),
            taints: Vec::new(),
        })
        .collect();
    let files: Vec<RemoteFile> = bundle
        .manifest
        .entries
        .iter()
        .map(|e| RemoteFile {
            path: format!("/var/lib/kprov/cache/{}-{}", e.name, e.sha256),
            content: bundle.read(e).expect("member"),
            mode: 0o644,
            resumable: true,
            on_arrival: None,
            // As the renderer does: the bundle verified it against the manifest.
            sha256: Some(e.sha256.clone()),
        })
        .collect();
    let step = Step {
        name: "bundle: upload".into(),
        files,
        check: None,
        run: String::new(),
        timeout: std::time::Duration::from_secs(1800),
    };
    let work: Vec<(String, Vec<Step>)> = th
        .hosts
        .iter()
        .map(|h| (h.name.clone(), vec![step.clone()]))
        .collect();
    let options = SshOptions {
        concurrency: hosts,
        accept_new_host_keys: true,
        ..SshOptions::default()
    };
    let fleet =
        SshFleet::new(CLUSTER, fleet_hosts, store, options, Arc::new(NoProgress)).expect("fleet");
    let t = Instant::now();
    let summary = fleet.run_all(&work).await;
    let upload = t.elapsed();
    fleet.close().await;
    assert!(summary.ok(), "{summary}");
    let mb = total as f64 / (1 << 20) as f64;
    println!(
        "{hosts} {mb:.0} {} {} {} {:.1}",
        create.as_millis(),
        verify.as_millis(),
        upload.as_millis(),
        mb * hosts as f64 / upload.as_secs_f64()
    );
}
