//! The tier gate itself (support/tiers.rs), through this test binary run as a child: a tier
//! that cannot run is skipped and named once, unless tiers are required (CI), where the same
//! test fails. The tier is made unavailable with `KPROV_SKIP_TIERS`, so this runs anywhere.

use std::process::Command;

/// This binary, running only the moto smoke test, with the environment's tier settings
/// replaced by `env`.
fn smoke_with(env: &[(&str, &str)]) -> (bool, String) {
    let mut c = Command::new(std::env::current_exe().expect("test binary"));
    c.args(["--exact", "smoke::moto_answers_the_sdk", "--test-threads=1"])
        .env_remove("CI")
        .env_remove("KPROV_REQUIRE_TIERS")
        .env("KPROV_SKIP_TIERS", "moto")
        .envs(env.iter().copied());
    let out = c.output().expect("runs the test binary");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), all)
}

#[test]
fn a_missing_tier_is_skipped_and_named_once() {
    let (ok, out) = smoke_with(&[]);
    assert!(ok, "{out}");
    assert_eq!(
        out.matches("skipped tier moto: KPROV_SKIP_TIERS names it")
            .count(),
        1,
        "{out}"
    );
    assert!(out.contains("1 passed"), "{out}");
}

#[test]
fn a_missing_tier_fails_under_ci_or_when_required() {
    for env in [("CI", "true"), ("KPROV_REQUIRE_TIERS", "1")] {
        let (ok, out) = smoke_with(&[env]);
        assert!(!ok, "{env:?}: {out}");
        assert!(
            out.contains("tier moto is required here") && out.contains("1 failed"),
            "{env:?}: {out}"
        );
        assert!(!out.contains("skipped tier"), "{env:?}: {out}");
    }
}
