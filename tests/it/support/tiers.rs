//! The test tiers and their one gate (docs/testing.md "Tiers and skips").
//!
//! A test that needs more than the plain `cargo test` tier (unit, golden, property, fake-API)
//! starts with `crate::needs_tier!(X);` (`if support::skip(Tier::X) { return; }`). Where the tier's prerequisites are
//! missing the test returns at once and the harness says so once per tier on stderr (written
//! past libtest's capture, so a passing run shows it). Under CI (`CI=true`) or
//! `KPROV_REQUIRE_TIERS=1` (which `scripts/test` sets) a missing prerequisite fails the test
//! instead: CI cannot skip a tier silently. `KPROV_SKIP_TIERS=sshd-hosts,moto,...` (or `all`)
//! skips tiers on purpose (a fast run as root); required tiers still fail.
//!
//! The tiers' constructors (`TestHosts::start`, `Network::start`, moto, `RealLab::start`) call
//! [`require`], so a test that forgot its gate fails with a message naming the gate.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Once;

/// A test's first line: `crate::needs_tier!(SshdHosts);` returns from the test when that tier
/// cannot run here ([`skip`]).
#[macro_export]
macro_rules! needs_tier {
    ($tier:ident) => {
        if $crate::support::skip($crate::support::Tier::$tier) {
            return;
        }
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// sshd test hosts in network namespaces (support/testhosts.rs): root, sshd, iproute2,
    /// util-linux.
    SshdHosts,
    /// moto_server on loopback (support/moto.rs).
    Moto,
    /// The cloud lab (support/cloudlab.rs): moto and sshd test hosts together.
    CloudLab,
    /// Real Kubernetes on machine-like hosts (support/realhosts.rs).
    RealHosts,
    /// Root alone, for tests that mount or unshare without test hosts (a node script in a
    /// mount namespace, a full tmpfs).
    Root,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::SshdHosts => "sshd-hosts",
            Tier::Moto => "moto",
            Tier::CloudLab => "cloud-lab",
            Tier::RealHosts => "real-hosts",
            Tier::Root => "root",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// Why the tier cannot run here, or `None` when it can.
    pub fn unavailable(self) -> Option<String> {
        if skipped_on_purpose(self) {
            return Some("KPROV_SKIP_TIERS names it".into());
        }
        match self {
            Tier::SshdHosts => sshd_hosts_unavailable(),
            Tier::Moto => moto_unavailable(),
            Tier::CloudLab => sshd_hosts_unavailable().or_else(moto_unavailable),
            Tier::RealHosts => super::realhosts::unavailable(),
            Tier::Root => (!running_as_root()).then(|| "needs root (mounts, namespaces)".into()),
        }
    }
}

/// Whether a missing prerequisite fails instead of skipping (CI, `scripts/test`).
pub fn required() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
        || std::env::var("KPROV_REQUIRE_TIERS").as_deref() == Ok("1")
}

/// For a test's first line: `true` (the test returns) when `tier` cannot run here. Panics
/// instead when tiers are required (CI, `KPROV_REQUIRE_TIERS=1`).
pub fn skip(tier: Tier) -> bool {
    let Some(why) = tier.unavailable() else {
        return false;
    };
    assert!(
        !required(),
        "tier {} is required here (CI=true or KPROV_REQUIRE_TIERS=1) but cannot run: {why}",
        tier.name()
    );
    static SAID: [Once; 5] = [const { Once::new() }; 5];
    SAID[tier.index()].call_once(|| {
        // Past libtest's capture (it captures the print macros only), once per tier.
        let _ = writeln!(
            std::io::stderr(),
            "skipped tier {}: {why} (its tests pass without running; docs/testing.md)",
            tier.name()
        );
    });
    true
}

/// For the tiers' constructors: panics naming the gate when `tier` cannot run, so a test that
/// forgot `if support::skip(..) { return; }` says so instead of failing deep in the harness.
pub fn require(tier: Tier) {
    if let Some(why) = tier.unavailable() {
        panic!(
            "this test needs tier {} ({why}); its first line must be \
             `crate::needs_tier!({tier:?});`",
            tier.name()
        );
    }
}

fn skipped_on_purpose(tier: Tier) -> bool {
    let Ok(list) = std::env::var("KPROV_SKIP_TIERS") else {
        return false;
    };
    let named = |t: Tier| {
        list.split(',')
            .map(str::trim)
            .any(|n| n == "all" || n == t.name())
    };
    match tier {
        Tier::CloudLab => named(Tier::CloudLab) || named(Tier::SshdHosts) || named(Tier::Moto),
        t => named(t),
    }
}

pub fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

fn sshd_hosts_unavailable() -> Option<String> {
    if !running_as_root() {
        return Some("needs root (network namespaces)".into());
    }
    for tool in ["/usr/sbin/sshd", "unshare", "nsenter", "ip"] {
        if !on_path_or_absolute(tool) {
            return Some(format!("needs {tool}: run scripts/install-test-deps"));
        }
    }
    None
}

fn moto_unavailable() -> Option<String> {
    let moto = super::moto::moto_binary();
    if on_path_or_absolute(&moto.to_string_lossy()) {
        return None;
    }
    Some(if moto.is_absolute() {
        format!("needs {}: run scripts/install-test-deps", moto.display())
    } else {
        "needs moto_server (in .venv or on PATH): run scripts/install-test-deps".into()
    })
}

/// An absolute path that is an executable file, or a name found on PATH.
fn on_path_or_absolute(program: &str) -> bool {
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if program.contains('/') {
        return executable(Path::new(program));
    }
    std::env::var_os("PATH")
        .map(|path| {
            std::env::split_paths(&path)
                .map(|dir: PathBuf| dir.join(program))
                .any(|p| executable(&p))
        })
        .unwrap_or(false)
}
