//! `scripts/bench-real`: time from `update cluster --yes` to every node Ready on real hosts,
//! for 1, 3 and 5 hosts (1 control plane + N-1 workers), split three ways:
//!
//! - **kubeadm/kubelet**: the wall time during which any host is in kprov's `init`, `join
//!   control plane`, `join worker` or `settle` phase (kubeadm's phases and the API server
//!   coming up), plus the wait for Ready after kprov returns;
//! - **node work**: outside those, the wall time during which any host runs a command of
//!   kprov's (installs, image imports, preflight, configuration: each step's check and run,
//!   timed from its start marker to its end marker, the `M ms on the host` of `-v`);
//! - **kprov**: the rest, kprov's own overhead: connecting, host keys, SSH round trips,
//!   comparing and uploading files, orchestration, the state store.
//!
//! The split comes from kprov's own `-v` lines on a non-terminal stderr, timestamped here as
//! they arrive: `HOST: PHASE (N steps)` / `HOST: PHASE done (...)` and `HOST: STEP:
//! changed|unchanged (N ms[, M ms on the host])`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::realcluster::RealCluster;
use crate::support::realhosts::{self, RealLab};

const KUBEADM_PHASES: &[&str] = &["init", "join control plane", "join worker", "settle"];

/// One `HOST: PHASE (N steps)` / `HOST: PHASE done|FAILED` line: (host, phase, is_start).
fn phase_event(line: &str) -> Option<(String, String, bool)> {
    let (host, rest) = line.split_once(": ")?;
    if let Some(p) = rest.strip_suffix(" steps)") {
        let (phase, _) = p.rsplit_once(" (")?;
        return Some((host.to_string(), phase.to_string(), true));
    }
    let (phase, _) = rest
        .split_once(" done (")
        .or_else(|| rest.split_once(" FAILED"))?;
    Some((host.to_string(), phase.to_string(), false))
}

/// The time one `HOST: STEP: changed|unchanged (N ms[, M ms on the host])` line reports the
/// step ran on the host (M, else N: a step whose files were not compared first).
fn step_ms(line: &str) -> Option<u64> {
    let inner = line.strip_suffix(')')?;
    let (_, took) = inner
        .rsplit_once(": changed (")
        .or_else(|| inner.rsplit_once(": unchanged ("))?;
    let ms = match took.split_once(", ") {
        Some((_, host)) => host.strip_suffix(" ms on the host")?,
        None => took.strip_suffix(" ms")?,
    };
    ms.parse().ok()
}

/// Length of the union of intervals.
fn union(mut spans: Vec<(Duration, Duration)>) -> Duration {
    spans.sort();
    let mut total = Duration::ZERO;
    let mut cur: Option<(Duration, Duration)> = None;
    for (a, b) in spans {
        cur = match cur {
            Some((s, e)) if a <= e => Some((s, e.max(b))),
            Some((s, e)) => {
                total += e - s;
                Some((a, b))
            }
            None => Some((a, b)),
        };
    }
    if let Some((s, e)) = cur {
        total += e - s;
    }
    total
}

struct Row {
    hosts: usize,
    update: Duration,
    ready: Duration,
    kubeadm: Duration,
    /// Remote command time outside the kubeadm/kubelet spans (the module doc).
    node: Duration,
}

fn run(n: usize) -> Row {
    let mut lab = RealLab::start();
    let names: Vec<String> = std::iter::once("cp1".to_string())
        .chain((1..n).map(|i| format!("worker{i}")))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    lab.boot(&refs);
    lab.route_pods();
    let name = format!("bench{n}.real.example");
    let endpoint = format!("{}:6443", lab.host("cp1").address);
    let roles: Vec<(&str, &[&str])> = refs
        .iter()
        .map(|h| {
            (
                *h,
                if *h == "cp1" {
                    &["control-plane"][..]
                } else {
                    &["node"][..]
                },
            )
        })
        .collect();
    let c = RealCluster::create(&lab, &name, &roles, |c| {
        c.spec.api.get_or_insert_with(Default::default).endpoint = Some(endpoint.clone());
    });

    let t0 = Instant::now();
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("kprov"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", lab.dir())
        .env(
            "KPROV_STATE_STORE",
            format!("file://{}", lab.dir().join("state").display()),
        )
        .env("NO_COLOR", "1")
        // -v: each connection and step with its time (the breakdown below).
        .args([
            "-v",
            "update",
            "cluster",
            &name,
            "--yes",
            "--accept-new-host-keys",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kprov");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines: Vec<(Duration, String)> = Vec::new();
    for line in BufReader::new(stderr).lines() {
        let line = line.expect("kprov stderr");
        lines.push((t0.elapsed(), line));
    }
    let out = child.wait_with_output().expect("kprov");
    let update = t0.elapsed();
    let text: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    assert!(
        out.status.success(),
        "update --yes ({n} hosts): {:?}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        text.join("\n")
    );
    c.kprov_ok(&[
        "export",
        "kubeconfig",
        &name,
        "--kubeconfig",
        c.kubeconfig.to_str().expect("utf-8"),
    ]);
    c.wait_nodes_ready(&refs, Duration::from_secs(600));
    let ready = t0.elapsed();

    // Before preflight: what kprov said while resolving, scanning and recording host keys,
    // connecting and observing (each connection's parts in its `connected` line).
    for (at, l) in lines
        .iter()
        .take_while(|(_, l)| !matches!(phase_event(l), Some((_, p, true)) if p == "preflight"))
    {
        eprintln!(
            "# {n} hosts: before preflight: {:.2} s {l}",
            at.as_secs_f64()
        );
    }
    if let Some((at, _)) = lines
        .iter()
        .find(|(_, l)| matches!(phase_event(l), Some((_, p, true)) if p == "preflight"))
    {
        eprintln!("# {n} hosts: preflight starts at {:.2} s", at.as_secs_f64());
    }
    let mut open: std::collections::HashMap<(String, String), Duration> = Default::default();
    let mut spans = Vec::new();
    let mut steps: Vec<(u64, String)> = Vec::new();
    let mut remote = Vec::new();
    for (at, l) in &lines {
        if let Some(ms) = step_ms(l) {
            steps.push((ms, l.clone()));
            // The step ran on the host for `ms` up to its end marker's arrival.
            remote.push((at.saturating_sub(Duration::from_millis(ms)), *at));
        }
        let Some((host, phase, start)) = phase_event(l) else {
            continue;
        };
        if start {
            open.insert((host, phase), *at);
        } else if let Some(s) = open.remove(&(host.clone(), phase.clone())) {
            // Where the time goes, on stderr (scripts/bench-real passes `#` lines through).
            eprintln!(
                "# {n} hosts: {host} {phase}: {:.1} s .. {:.1} s",
                s.as_secs_f64(),
                at.as_secs_f64()
            );
            if KUBEADM_PHASES.contains(&phase.as_str()) {
                spans.push((s, *at));
            }
        }
    }
    steps.sort_by_key(|s| std::cmp::Reverse(s.0));
    for (_, l) in steps.iter().take(12) {
        eprintln!("# {n} hosts: step {l}");
    }
    assert!(
        !spans.is_empty(),
        "no kubeadm phase events in kprov's output:\n{}",
        text.join("\n")
    );
    // After kprov returns, the remaining wait for Ready is the kubelets'.
    spans.push((update, ready));
    let kubeadm = union(spans.clone());
    // Remote commands outside kubeadm's spans: the union of both less kubeadm's.
    let node = union(spans.into_iter().chain(remote).collect()).saturating_sub(kubeadm);
    eprintln!(
        "# {n} hosts: update {:.1} s, Ready {:.1} s: kubeadm/kubelet {:.1} s, node work {:.1} s, kprov {:.1} s",
        update.as_secs_f64(),
        ready.as_secs_f64(),
        kubeadm.as_secs_f64(),
        node.as_secs_f64(),
        ready.saturating_sub(kubeadm + node).as_secs_f64()
    );
    drop(c);
    let left = lab.teardown_and_check();
    assert!(left.is_empty(), "left after teardown: {left:#?}");
    Row {
        hosts: n,
        update,
        ready,
        kubeadm,
        node,
    }
}

/// `scripts/bench-real`: prints one row per cluster size.
#[test]
#[ignore = "a benchmark (minutes): scripts/bench-real"]
fn bench_update_to_ready() {
    if realhosts::skip() {
        return;
    }
    let sizes: Vec<usize> = std::env::var("KPROV_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 3, 5]);
    // Shares of ready_s (update to every node Ready): kubeadm_s kubeadm/kubelet, node_s
    // kprov's commands on the hosts, kprov_s kprov's own overhead (the module doc).
    println!("hosts update_s ready_s kubeadm_s node_s kprov_s kubeadm_pct node_pct kprov_pct");
    // Each row as soon as its cluster is measured (a long run keeps what it has).
    for n in sizes {
        let r = run(n);
        let kprov = r.ready.saturating_sub(r.kubeadm + r.node);
        let pct = |d: Duration| 100.0 * d.as_secs_f64() / r.ready.as_secs_f64();
        println!(
            "{:>5} {:>8.1} {:>7.1} {:>9.1} {:>6.1} {:>7.1} {:>11.0} {:>8.0} {:>9.0}",
            r.hosts,
            r.update.as_secs_f64(),
            r.ready.as_secs_f64(),
            r.kubeadm.as_secs_f64(),
            r.node.as_secs_f64(),
            kprov.as_secs_f64(),
            pct(r.kubeadm),
            pct(r.node),
            pct(kprov)
        );
    }
}

#[test]
fn phase_lines_parse() {
    assert_eq!(
        phase_event("cp1: join worker (4 steps)"),
        Some(("cp1".into(), "join worker".into(), true))
    );
    assert_eq!(
        phase_event("w1: init done (3 changed, 0 unchanged)"),
        Some(("w1".into(), "init".into(), false))
    );
    assert_eq!(phase_event("w1: new host key recorded: SHA256:x"), None);
    assert_eq!(
        step_ms("cp1: images: import etcd.tar: changed (2150 ms)"),
        Some(2150)
    );
    assert_eq!(
        step_ms("cp1: images: import a, b: changed (3150 ms, 2100 ms on the host)"),
        Some(2100)
    );
    assert_eq!(step_ms("cp1: x: FAILED (3 ms): boom (1 ms)"), None);
    assert_eq!(step_ms("cp1: kubelet: service: unchanged (3 ms)"), Some(3));
    assert_eq!(step_ms("cp1: connected (40 ms)"), None);
    let s = |a, b| (Duration::from_secs(a), Duration::from_secs(b));
    assert_eq!(
        union(vec![s(0, 2), s(1, 3), s(5, 6)]),
        Duration::from_secs(4)
    );
}
