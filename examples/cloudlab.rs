//! Runs one command inside a cloud lab (`tests/it/support/cloudlab.rs`): moto and the
//! command in a network namespace whose only routes lead into the lab, every running EC2
//! instance played by an sshd test host, an artifact mirror and a fake Kubernetes API at the
//! lab's gateway. Everything it starts is stopped (by PID) and removed when the command ends.
//! `scripts/demo` runs itself through it. Needs root.
//!
//! The command gets the lab's environment (HOME and state store in a scratch directory, the
//! AWS variables pointing at moto) and:
//! - `KPROV_LAB_VPC_CIDR`: the network CIDR a cluster must use (instances get their hosts
//!   only inside it);
//! - `KPROV_LAB_ASSETS`: a YAML file with the `assets` section pointing at the lab's mirror.
//!
//! Ctrl-C reaches the command (same process group); the runner outlives it and tears the lab
//! down. If the runner is killed outright, the next lab (or test run) reaps what it left.
// The lint is for the library's surface; test support is `pub` for its own modules.
#![allow(unreachable_pub)]

#[allow(unused_imports)]
#[path = "../tests/it/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use support::cloudlab::CloudLab;

/// Survives SIGINT so that the lab is torn down after the command ends. A handler, not
/// SIG_IGN: the command must not inherit an ignored SIGINT across exec.
fn outlive_interrupts() {
    unsafe extern "C" {
        fn signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
    }
    extern "C" fn noop(_: i32) {}
    const SIGINT: i32 = 2;
    // SAFETY: installs a handler that does nothing (async-signal-safe).
    unsafe {
        signal(SIGINT, noop);
    }
}

fn main() {
    outlive_interrupts();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((program, rest)) = args.split_first() else {
        eprintln!("usage: cloudlab COMMAND [ARGS...]");
        std::process::exit(2);
    };
    let lab = Arc::new(CloudLab::start());
    eprintln!(
        "[lab] up in {:.1?}: VPC range {}, gateway {} (artifact mirror, fake API), moto at {} \
         (kprov's way in: {}, AWS as it is {}), no route out of {}",
        lab.started_in,
        lab.net.vpc_cidr(),
        lab.net.gateway,
        lab.moto_endpoint,
        lab.kprov_endpoint,
        if lab.as_it_is.is_some() {
            "on"
        } else {
            "off (KPROV_LAB_AS_IT_IS=0)"
        },
        lab.net.block
    );
    let mut assets = String::from("files:\n");
    for f in lab.mirror.asset_files() {
        assets.push_str(&format!(
            "- name: {}\n  url: {}\n  sha256: {}\n",
            f.name, f.url, f.sha256
        ));
    }
    let assets_file = lab.home.join("lab-assets.yaml");
    if let Err(e) = std::fs::write(&assets_file, assets) {
        eprintln!("[lab] {}: {e}", assets_file.display());
        std::process::exit(1);
    }
    lab.announce.store(true, Ordering::SeqCst);
    lab.watch();
    let status = lab
        .command(program)
        .args(rest)
        .env("KPROV_LAB", "1")
        .env("KPROV_LAB_VPC_CIDR", lab.net.vpc_cidr().to_string())
        .env("KPROV_LAB_ASSETS", &assets_file)
        .env(
            "TERM",
            std::env::var("TERM").unwrap_or_else(|_| "dumb".into()),
        )
        .status();
    lab.unwatch();
    let errors = lab.sync_errors();
    for e in &errors {
        eprintln!("[lab] sync error: {e}");
    }
    let hosts = lab.instances().len();
    let t = Instant::now();
    drop(lab);
    eprintln!(
        "[lab] down in {:.1?} ({hosts} hosts were still up)",
        t.elapsed()
    );
    match status {
        Ok(s) if errors.is_empty() => std::process::exit(s.code().unwrap_or(1)),
        Ok(_) => std::process::exit(1),
        Err(e) => {
            eprintln!("[lab] cannot run {program}: {e}");
            std::process::exit(1);
        }
    }
}
