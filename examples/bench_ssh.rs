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
//!
//! Each kprov run is a process of its own (this binary again, `--kprov-run FILE`), as each
//! `kprov update` is: its peak RSS (`VmHWM`), its highest count of open descriptors and its CPU
//! time (user + sys) are kprov's alone, not the test hosts' or ansible's; the CPU of its `ssh`
//! processes (the `ssh -G` it waited for, and the masters, which `ssh -f` detaches: read from
//! /proc just before they are closed) is reported beside it. `--no-ansible`: kprov only (the
//! ansible columns read `-`), for sizes where ansible's run takes many minutes.
// The lint is for the library's surface; test support is `pub` for its own modules.
#![allow(unreachable_pub)]

// The whole harness, as examples/cloudlab.rs takes it: testhosts.rs asks its tier gate.
#[allow(unused_imports)]
#[path = "../tests/it/support/mod.rs"]
mod support;
use support::{delayproxy, memstate, testhosts};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// `blob` is one buffer shared by every host, as kprov's renderers share an asset's bytes.
fn steps(name: &str, address: &str, blob: &Bytes) -> Result<Vec<Step>, tera::Error> {
    let mut ctx = tera::Context::new();
    ctx.insert("name", name);
    ctx.insert("address", address);
    let rendered = tera::Tera::one_off(TEMPLATE, &ctx, false)?;
    let file = |path: &str, content: Bytes, mode| RemoteFile {
        path: path.into(),
        content,
        mode,
        resumable: false,
        on_arrival: None,
        sha256: None,
    };
    let mut steps = vec![Step {
        name: "files".into(),
        files: vec![
            file("/opt/kprov-bench/blob", blob.clone(), 0o644),
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

/// What a kprov run measured of itself.
#[derive(Debug, Clone, Copy, Default)]
struct KprovRun {
    took: Duration,
    /// Peak resident set of the kprov process (`VmHWM`), KiB.
    hwm_kib: u64,
    /// Most descriptors open at once in the kprov process (sampled every 20 ms).
    fds: usize,
    /// user + sys of the kprov process.
    cpu: Duration,
    /// user + sys of its ssh processes (`ssh -G`, the masters).
    ssh_cpu: Duration,
}

/// The kprov run's input, written by the parent for `--kprov-run FILE`.
#[derive(serde::Serialize, serde::Deserialize)]
struct RunSpec {
    /// (name, address dialled, port dialled, the host's own address)
    hosts: Vec<(String, String, u16, String)>,
    client_key: String,
    known_hosts: String,
}

/// Runs kprov once in a process of its own and reads what it measured.
async fn kprov_run(th: &testhosts::TestHosts, ends: &[Endpoint], known_hosts: &str) -> KprovRun {
    let spec = RunSpec {
        hosts: th
            .hosts
            .iter()
            .zip(ends)
            .map(|(h, e)| (h.name.clone(), e.address.clone(), e.port, h.address.clone()))
            .collect(),
        client_key: th.client_key.display().to_string(),
        known_hosts: known_hosts.to_string(),
    };
    let file = th.dir().join("kprov-run.json");
    std::fs::write(&file, serde_json::to_vec(&spec).expect("run spec")).expect("write run spec");
    let me = std::env::current_exe().expect("own path");
    // tokio's: the delay proxies run on this process's runtime meanwhile.
    let out = tokio::process::Command::new(me)
        .arg("--kprov-run")
        .arg(&file)
        .stderr(std::process::Stdio::inherit())
        .output()
        .await
        .expect("run kprov");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "kprov run failed: {text}");
    let v: Vec<u64> = text
        .lines()
        .find_map(|l| l.strip_prefix("kprov-run "))
        .expect("the kprov run's figures")
        .split_whitespace()
        .map(|w| w.parse().expect("a figure"))
        .collect();
    KprovRun {
        took: Duration::from_micros(v[0]),
        hwm_kib: v[1],
        fds: v[2] as usize,
        cpu: Duration::from_micros(v[3]),
        ssh_cpu: Duration::from_micros(v[4]),
    }
}

/// utime + stime of /proc/PID/stat (`self` too), and the waited-for children's (cutime +
/// cstime). Linux reports them in USER_HZ, 100 per second on every architecture it exports.
fn proc_cpu(pid: &str) -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold blanks: count fields after its closing ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|w| w.parse().ok())
        .collect();
    let tick = |t: u64| Duration::from_millis(t * 10);
    Some((tick(f.first()? + f.get(1)?), tick(f.get(2)? + f.get(3)?)))
}

/// CPU of the ssh masters of `control_dir` (detached by `ssh -f`, so no child of ours).
fn masters_cpu(control_dir: &std::path::Path) -> Duration {
    let dir = control_dir.display().to_string();
    let mut total = Duration::ZERO;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = e.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmd).contains(&dir)
            && let Some((own, _)) = proc_cpu(&pid)
        {
            total += own;
        }
    }
    total
}

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// The kprov side of one run, in this process (`--kprov-run FILE`): prints
/// `kprov-run MICROS HWM_KIB FDS CPU_MICROS SSH_CPU_MICROS`.
async fn kprov_child(file: &str) {
    let spec: RunSpec =
        serde_json::from_slice(&std::fs::read(file).expect("read run spec")).expect("run spec");
    let store = Arc::new(memstate::MemStore::default());
    store
        .put(
            &format!("{CLUSTER}/known_hosts"),
            Bytes::from(spec.known_hosts.clone()),
            Precondition::Absent,
        )
        .await
        .expect("seed known hosts");
    let hosts: Vec<Host> = spec
        .hosts
        .iter()
        .map(|(name, address, port, _)| Host {
            name: name.clone(),
            address: address.clone(),
            ip: None,
            access_ip: None,
            user: Some("root".into()),
            port: Some(*port),
            key_path: Some(spec.client_key.clone()),
            bastion: None,
            roles: vec![HostRole::Node],
            labels: Default::default(),
            taints: Vec::new(),
        })
        .collect();
    let blob = blob();
    let work: Vec<(String, Vec<Step>)> = spec
        .hosts
        .iter()
        .map(|(name, _, _, address)| (name.clone(), steps(name, address, &blob).expect("template")))
        .collect();
    // KPROV_BENCH_SSH_CONFIG=FILE: kprov's connections read that ssh config (`-F`) instead
    // of the user's, to measure what a setting costs (a key exchange, a cipher).
    let options = SshOptions {
        concurrency: hosts.len(),
        config_file: std::env::var_os("KPROV_BENCH_SSH_CONFIG").map(Into::into),
        ..SshOptions::default()
    };
    // KPROV_BENCH_VERBOSE=FILE appends the engine's per-step events there (where the time
    // goes): the test hosts' harness does not hand this process's stderr on.
    let progress: Arc<dyn Progress> = match std::env::var_os("KPROV_BENCH_VERBOSE") {
        Some(path) => Arc::new(PlainProgress::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .expect("KPROV_BENCH_VERBOSE file"),
        )),
        None => Arc::new(NoProgress),
    };
    let fds = Arc::new(AtomicUsize::new(open_fds()));
    let sampler = {
        let fds = fds.clone();
        tokio::spawn(async move {
            loop {
                fds.fetch_max(open_fds(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let started = Instant::now();
    let fleet = SshFleet::new(CLUSTER, hosts, store, options, progress).expect("fleet");
    let summary = fleet.run_all(&work).await;
    let masters = masters_cpu(fleet.control_dir());
    fleet.close().await;
    let took = started.elapsed();
    sampler.abort();
    assert!(summary.ok(), "{summary}");
    let (own, children) = proc_cpu("self").expect("/proc/self/stat");
    println!(
        "kprov-run {} {} {} {} {}",
        took.as_micros(),
        vm_hwm_kib(),
        fds.load(Ordering::Relaxed),
        own.as_micros(),
        (children + masters).as_micros()
    );
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
    kprov: [KprovRun; 2],
    /// None: not run (`--no-ansible`)
    ansible: Option<[Duration; 2]>,
}

async fn measure(
    th: &testhosts::TestHosts,
    ends: &[Endpoint],
    rtt_ms: u64,
    playbook_bin: Option<&str>,
) -> Times {
    // Both tools get the hosts' keys up front and check them strictly.
    let known_hosts = known_hosts_for(th, ends);
    let reset = || {
        for h in &th.hosts {
            h.exec("rm -rf /opt/kprov-bench /etc/kprov-bench /var/lib/kprov-bench")
                .expect("reset host");
        }
    };
    reset();
    let k1 = kprov_run(th, ends, &known_hosts).await;
    let k2 = kprov_run(th, ends, &known_hosts).await;
    let Some(playbook_bin) = playbook_bin else {
        return Times {
            rtt_ms,
            kprov: [k1, k2],
            ansible: None,
        };
    };

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
        ansible: Some([a1, a2]),
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--kprov-run") {
        kprov_child(args.get(1).expect("--kprov-run FILE")).await;
        return;
    }
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
    let playbook_bin = (!args.iter().any(|a| a == "--no-ansible")).then_some(playbook_bin.as_str());
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
            results.push(measure(&th, &ends, 0, playbook_bin).await);
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
                results.push(measure(&th, &ends, rtt, playbook_bin).await);
            }
        }
    }

    // One row per RTT and run under the columns scripts/bench-ssh prints (hosts rtt_ms run
    // kprov_ms ansible_ms ratio kprov_rt ansible_rt rss_mib fds kprov_cpu_ms_host
    // ssh_cpu_ms_host); the script adds the machine's load and cores. *_rt: round trips per
    // host, the slope of the time against the RTT from RTT 0.
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let base = results
        .iter()
        .find(|t| t.rtt_ms == 0)
        .map(|t| (t.kprov, t.ansible));
    let per_host = |d: Duration| ms(d) / n as f64;
    for t in &results {
        for (i, run) in ["first", "rerun"].iter().enumerate() {
            let k = t.kprov[i];
            let a = t.ansible.map(|a| a[i]);
            let slope = |now: Duration, zero: Duration| {
                format!("{:.1}", (ms(now) - ms(zero)) / t.rtt_ms as f64)
            };
            let (krt, art) = match base {
                Some((bk, ba)) if t.rtt_ms > 0 => (
                    slope(k.took, bk[i].took),
                    match (a, ba) {
                        (Some(a), Some(ba)) => slope(a, ba[i]),
                        _ => "-".to_string(),
                    },
                ),
                _ => ("-".to_string(), "-".to_string()),
            };
            let (ams, ratio) = match a {
                Some(a) => (
                    format!("{:.0}", ms(a)),
                    format!("{:.1}", ms(a) / ms(k.took)),
                ),
                None => ("-".to_string(), "-".to_string()),
            };
            println!(
                "{n:>5} {:>6} {run:>5} {:>8.0} {ams:>10} {ratio:>6} {krt:>8} {art:>10} {:>7.1} {:>4} {:>8.1} {:>8.1}",
                t.rtt_ms,
                ms(k.took),
                k.hwm_kib as f64 / 1024.0,
                k.fds,
                per_host(k.cpu),
                per_host(k.ssh_cpu),
            );
        }
    }
}
