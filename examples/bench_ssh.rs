//! Benchmark: one task list on N real sshd test hosts, with kprov's SSH engine and with
//! `ansible-playbook` (pipelining on, forks = N, host key checking on). Run by
//! `scripts/bench-ssh`, as root; prints both times and their ratio.
//!
//! Task list per host: upload three files (one of 1 MiB), render one config from a template
//! with host variables, run five commands. Each tool runs it twice: the first run changes the
//! hosts, the second finds them converged (kprov compares hashes; ansible's copy/template do
//! too). Both start without an open connection.

#[path = "../tests/it/support/memstate.rs"]
mod memstate;
#[path = "../tests/it/support/testhosts.rs"]
#[allow(dead_code)]
mod testhosts;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kprov::spec::{Host, HostRole};
use kprov::ssh::task::{RemoteFile, Step};
use kprov::ssh::{NoProgress, PlainProgress, Progress, SshFleet, SshOptions};
use kprov::state::{Precondition, StateStore};

const CLUSTER: &str = "bench.example.com";
const COMMANDS: [&str; 5] = [
    "uname -r > /dev/null",
    "test -d /etc/kprov-bench",
    "cat /etc/kprov-bench/node.conf > /dev/null",
    "sha256sum /opt/kprov-bench/blob > /dev/null",
    "hostname > /var/lib/kprov-bench/hostname",
];
const TEMPLATE: &str =
    "# rendered for {{ name }}\nnode-name = {{ name }}\naddress = {{ address }}\nport = 10250\n";

fn blob() -> Bytes {
    Bytes::from(
        (0..1 << 20)
            .map(|i: u32| (i % 251) as u8)
            .collect::<Vec<u8>>(),
    )
}

fn steps(name: &str, address: &str) -> Result<Vec<Step>, tera::Error> {
    let mut ctx = tera::Context::new();
    ctx.insert("name", name);
    ctx.insert("address", address);
    let rendered = tera::Tera::one_off(TEMPLATE, &ctx, false)?;
    let file = |path: &str, content: Bytes, mode| RemoteFile {
        path: path.into(),
        content,
        mode,
    };
    let mut steps = vec![Step {
        name: "files".into(),
        files: vec![
            file("/opt/kprov-bench/blob", blob(), 0o644),
            file(
                "/etc/kprov-bench/a.conf",
                Bytes::from_static(b"a = 1\n"),
                0o644,
            ),
            file(
                "/etc/kprov-bench/b.conf",
                Bytes::from_static(b"b = 2\n"),
                0o600,
            ),
            file("/etc/kprov-bench/node.conf", Bytes::from(rendered), 0o644),
        ],
        check: None,
        run: String::new(),
        timeout: Duration::from_secs(60),
    }];
    steps.push(Step {
        name: "prepare".into(),
        files: Vec::new(),
        check: None,
        run: "mkdir -p /var/lib/kprov-bench".into(),
        timeout: Duration::from_secs(60),
    });
    for (i, c) in COMMANDS.iter().enumerate() {
        steps.push(Step {
            name: format!("command {i}"),
            files: Vec::new(),
            check: None,
            run: (*c).into(),
            timeout: Duration::from_secs(60),
        });
    }
    Ok(steps)
}

async fn kprov_run(th: &testhosts::TestHosts, store: &Arc<memstate::MemStore>) -> Duration {
    let hosts: Vec<Host> = th
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
    let work: Vec<(String, Vec<Step>)> = th
        .hosts
        .iter()
        .map(|h| {
            (
                h.name.clone(),
                steps(&h.name, &h.address).expect("template"),
            )
        })
        .collect();
    let options = SshOptions {
        concurrency: th.hosts.len(),
        ..SshOptions::default()
    };
    // KPROV_BENCH_VERBOSE=1 shows the engine's per-step events (where the time goes).
    let progress: Arc<dyn Progress> = if std::env::var_os("KPROV_BENCH_VERBOSE").is_some() {
        Arc::new(PlainProgress::stderr())
    } else {
        Arc::new(NoProgress)
    };
    let started = Instant::now();
    let fleet = SshFleet::new(CLUSTER, hosts, store.clone(), options, progress).expect("fleet");
    let summary = fleet.run_all(&work).await;
    fleet.close().await;
    let took = started.elapsed();
    assert!(summary.ok(), "{summary}");
    took
}

fn ansible_files(th: &testhosts::TestHosts) -> std::path::PathBuf {
    let dir = th.dir().join("ansible");
    std::fs::create_dir_all(dir.join("files")).expect("ansible dir");
    std::fs::write(dir.join("files/blob"), blob()).expect("blob");
    std::fs::write(dir.join("files/a.conf"), "a = 1\n").expect("a.conf");
    std::fs::write(dir.join("files/b.conf"), "b = 2\n").expect("b.conf");
    std::fs::write(dir.join("node.conf.j2"), TEMPLATE).expect("template");
    std::fs::write(dir.join("known_hosts"), th.known_hosts()).expect("known_hosts");
    let inventory: String = std::iter::once("[bench]\n".to_string())
        .chain(th.hosts.iter().map(|h| {
            format!(
                "{} ansible_host={} address={} ansible_user=root ansible_ssh_private_key_file={}\n",
                h.name,
                h.address,
                h.address,
                th.client_key.display()
            )
        }))
        .collect();
    std::fs::write(dir.join("inventory.ini"), inventory).expect("inventory");
    std::fs::write(
        dir.join("ansible.cfg"),
        format!(
            "[defaults]\nforks = {forks}\nhost_key_checking = True\ngathering = explicit\n\
             interpreter_python = /usr/bin/python3\nlocal_tmp = {dir}/tmp\nremote_tmp = /tmp/.ansible\n\
             [ssh_connection]\npipelining = True\ncontrol_path_dir = {dir}/cp\n\
             ssh_args = -o ControlMaster=auto -o ControlPersist=60s -o StrictHostKeyChecking=yes -o UserKnownHostsFile={dir}/known_hosts\n",
            forks = th.hosts.len(),
            dir = dir.display()
        ),
    )
    .expect("ansible.cfg");
    let mut play = String::from(
        r#"- hosts: bench
  gather_facts: false
  tasks:
    - file: {path: /opt/kprov-bench, state: directory}
    - file: {path: /etc/kprov-bench, state: directory}
    - copy: {src: files/blob, dest: /opt/kprov-bench/blob, mode: '0644'}
    - copy: {src: files/a.conf, dest: /etc/kprov-bench/a.conf, mode: '0644'}
    - copy: {src: files/b.conf, dest: /etc/kprov-bench/b.conf, mode: '0600'}
    - template: {src: node.conf.j2, dest: /etc/kprov-bench/node.conf, mode: '0644'}
      vars: {name: '{{ inventory_hostname }}'}
    - shell: mkdir -p /var/lib/kprov-bench
"#,
    );
    for c in COMMANDS {
        play.push_str(&format!("    - shell: {c:?}\n"));
    }
    std::fs::write(dir.join("play.yml"), play).expect("play.yml");
    dir
}

fn ansible_run(dir: &std::path::Path, playbook_bin: &str) -> Duration {
    let started = Instant::now();
    let out = std::process::Command::new(playbook_bin)
        .args(["-i", "inventory.ini", "play.yml"])
        .current_dir(dir)
        .env("ANSIBLE_CONFIG", dir.join("ansible.cfg"))
        .env("HOME", dir)
        .output()
        .expect("run ansible-playbook");
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "ansible-playbook failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// Closes ansible's persistent masters so the next run starts cold, like kprov's.
fn ansible_close(dir: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(dir.join("cp")) {
        for e in entries.flatten() {
            let _ = std::process::Command::new("ssh")
                .arg("-S")
                .arg(e.path())
                .args(["-O", "exit", "x"])
                .output();
        }
    }
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let playbook_bin = std::env::var("ANSIBLE_PLAYBOOK").unwrap_or("ansible-playbook".into());
    let th = testhosts::TestHosts::start(n);

    // Both tools get the hosts' keys up front and check them strictly.
    let store = Arc::new(memstate::MemStore::default());
    store
        .put(
            &format!("{CLUSTER}/known_hosts"),
            Bytes::from(th.known_hosts()),
            Precondition::Absent,
        )
        .await
        .expect("seed known hosts");
    let k1 = kprov_run(&th, &store).await;
    let k2 = kprov_run(&th, &store).await;

    // Fresh hosts' state for ansible: remove what kprov wrote.
    for h in &th.hosts {
        h.exec("rm -rf /opt/kprov-bench /etc/kprov-bench /var/lib/kprov-bench")
            .expect("reset host");
    }
    let dir = ansible_files(&th);
    let a1 = ansible_run(&dir, &playbook_bin);
    ansible_close(&dir);
    let a2 = ansible_run(&dir, &playbook_bin);
    ansible_close(&dir);

    // One row per run under the columns scripts/bench-ssh prints (hosts run kprov_ms
    // ansible_ms ratio); the script adds the machine's load and cores.
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    for (run, k, a) in [("first", k1, a1), ("rerun", k2, a2)] {
        println!(
            "{n:>5} {run:>5} {:>8.0} {:>10.0} {:>6.1}",
            ms(k),
            ms(a),
            ms(a) / ms(k)
        );
    }
}
