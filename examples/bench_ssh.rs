//! Benchmark: one task list on N real sshd test hosts, with kprov's SSH engine and with
//! `ansible-playbook` (pipelining on, forks = N, host key checking on). Run by
//! `scripts/bench-ssh`, as root; prints both times and their ratio.
//!
//! Task list per host: upload three files (one of 1 MiB), render one config from a template
//! with host variables, run five commands. Each tool runs it twice: the first run changes the
//! hosts, the second finds them converged (kprov compares hashes; ansible's copy/template do
//! too). Both start without an open connection.
//!
//! `--rtt MS[,MS...]`: every host is reached through a delay proxy (each direction delayed by
//! RTT/2) and the runs repeat at RTT 0 and at each RTT given; each row then also says how many
//! round trips per host the run cost: (time at RTT - time at 0) / RTT.

#[path = "../tests/it/support/delayproxy.rs"]
mod delayproxy;
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
        resumable: false,
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

/// Where a tool dials each host: its own address, or the loopback port of its delay proxy.
struct Endpoint {
    address: String,
    port: u16,
}

async fn kprov_run(
    th: &testhosts::TestHosts,
    ends: &[Endpoint],
    store: &Arc<memstate::MemStore>,
) -> Duration {
    let hosts: Vec<Host> = th
        .hosts
        .iter()
        .zip(ends)
        .map(|(h, e)| Host {
            name: h.name.clone(),
            address: e.address.clone(),
            ip: None,
            access_ip: None,
            user: Some("root".into()),
            port: Some(e.port),
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

fn ansible_files(
    th: &testhosts::TestHosts,
    ends: &[Endpoint],
    known_hosts: &str,
) -> std::path::PathBuf {
    let dir = th.dir().join("ansible");
    std::fs::create_dir_all(dir.join("files")).expect("ansible dir");
    std::fs::write(dir.join("files/blob"), blob()).expect("blob");
    std::fs::write(dir.join("files/a.conf"), "a = 1\n").expect("a.conf");
    std::fs::write(dir.join("files/b.conf"), "b = 2\n").expect("b.conf");
    std::fs::write(dir.join("node.conf.j2"), TEMPLATE).expect("template");
    std::fs::write(dir.join("known_hosts"), known_hosts).expect("known_hosts");
    let inventory: String = std::iter::once("[bench]\n".to_string())
        .chain(th.hosts.iter().zip(ends).map(|(h, e)| {
            format!(
                "{} ansible_host={} ansible_port={} address={} ansible_user=root ansible_ssh_private_key_file={}\n",
                h.name,
                e.address,
                e.port,
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

/// known_hosts text naming each host as the tools dial it (`[127.0.0.1]:PORT` behind a
/// proxy), with the host's own key: checking stays strict through the proxy.
fn known_hosts_for(th: &testhosts::TestHosts, ends: &[Endpoint]) -> String {
    th.known_hosts()
        .lines()
        .zip(ends)
        .map(|(line, e)| {
            let key = line.split_once(' ').map(|(_, k)| k).unwrap_or_default();
            if e.port == 22 {
                format!("{} {key}\n", e.address)
            } else {
                format!("[{}]:{} {key}\n", e.address, e.port)
            }
        })
        .collect()
}

struct Times {
    rtt_ms: u64,
    /// first run, re-run
    kprov: [Duration; 2],
    ansible: [Duration; 2],
}

async fn measure(
    th: &testhosts::TestHosts,
    ends: &[Endpoint],
    rtt_ms: u64,
    playbook_bin: &str,
) -> Times {
    // Both tools get the hosts' keys up front and check them strictly.
    let known_hosts = known_hosts_for(th, ends);
    let store = Arc::new(memstate::MemStore::default());
    store
        .put(
            &format!("{CLUSTER}/known_hosts"),
            Bytes::from(known_hosts.clone()),
            Precondition::Absent,
        )
        .await
        .expect("seed known hosts");
    let reset = || {
        for h in &th.hosts {
            h.exec("rm -rf /opt/kprov-bench /etc/kprov-bench /var/lib/kprov-bench")
                .expect("reset host");
        }
    };
    reset();
    let k1 = kprov_run(th, ends, &store).await;
    let k2 = kprov_run(th, ends, &store).await;

    // Fresh hosts' state for ansible: remove what kprov wrote.
    reset();
    let dir = ansible_files(th, ends, &known_hosts);
    let bin = playbook_bin.to_string();
    let (a1, a2) = tokio::task::spawn_blocking(move || {
        let a1 = ansible_run(&dir, &bin);
        ansible_close(&dir);
        let a2 = ansible_run(&dir, &bin);
        ansible_close(&dir);
        (a1, a2)
    })
    .await
    .expect("ansible runs");
    Times {
        rtt_ms,
        kprov: [k1, k2],
        ansible: [a1, a2],
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(5);
    // --rtt 20,50: through delay proxies, at 0 and at each RTT given.
    let rtts: Option<Vec<u64>> = args
        .iter()
        .position(|a| a == "--rtt")
        .and_then(|i| args.get(i + 1))
        .map(|list| {
            std::iter::once(0)
                .chain(list.split(',').filter_map(|v| v.trim().parse().ok()))
                .collect()
        });
    let playbook_bin = std::env::var("ANSIBLE_PLAYBOOK").unwrap_or("ansible-playbook".into());
    let th = testhosts::TestHosts::start(n);

    let mut results = Vec::new();
    match &rtts {
        None => {
            let ends: Vec<Endpoint> = th
                .hosts
                .iter()
                .map(|h| Endpoint {
                    address: h.address.clone(),
                    port: h.port,
                })
                .collect();
            results.push(measure(&th, &ends, 0, &playbook_bin).await);
        }
        Some(rtts) => {
            let proxies: Vec<delayproxy::DelayProxy> = th
                .hosts
                .iter()
                .map(|h| {
                    let target = format!("{}:{}", h.address, h.port)
                        .parse()
                        .expect("host address");
                    delayproxy::DelayProxy::start(target, Duration::ZERO)
                })
                .collect();
            let ends: Vec<Endpoint> = proxies
                .iter()
                .map(|p| Endpoint {
                    address: "127.0.0.1".into(),
                    port: p.port,
                })
                .collect();
            let mut seen = std::collections::BTreeSet::new();
            for &rtt in rtts {
                if !seen.insert(rtt) {
                    continue;
                }
                for p in &proxies {
                    p.set_rtt(Duration::from_millis(rtt));
                }
                results.push(measure(&th, &ends, rtt, &playbook_bin).await);
            }
        }
    }

    // One row per RTT and run under the columns scripts/bench-ssh prints (hosts rtt_ms run
    // kprov_ms ansible_ms ratio kprov_rt ansible_rt); the script adds the machine's load and
    // cores. *_rt: round trips per host, the slope of the time against the RTT from RTT 0.
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let base = results
        .iter()
        .find(|t| t.rtt_ms == 0)
        .map(|t| (t.kprov, t.ansible));
    for t in &results {
        for (i, run) in ["first", "rerun"].iter().enumerate() {
            let (k, a) = (t.kprov[i], t.ansible[i]);
            let slope = |now: Duration, zero: Duration| {
                format!("{:.1}", (ms(now) - ms(zero)) / t.rtt_ms as f64)
            };
            let (krt, art) = match base {
                Some((bk, ba)) if t.rtt_ms > 0 => (slope(k, bk[i]), slope(a, ba[i])),
                _ => ("-".to_string(), "-".to_string()),
            };
            println!(
                "{n:>5} {:>6} {run:>5} {:>8.0} {:>10.0} {:>6.1} {krt:>8} {art:>10}",
                t.rtt_ms,
                ms(k),
                ms(a),
                ms(a) / ms(k)
            );
        }
    }
}
