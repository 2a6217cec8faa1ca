//! The import-cycle check as a test (issue 19: "no import cycle anywhere in `src/`"), so a
//! cycle cannot come back unnoticed. It runs `scripts/import-cycles` (the one reader of the
//! `use` lines) on this crate's `src/`; needs `python3`, no root.
//!
//! Both depths must be free of cycles: top-level modules (`spec`, `nodes`, `provision`, ...)
//! and their submodules (`provision::plan`, `provision::orchestrate`, ...). A `use` that closes
//! a cycle fails `cargo test`, naming every edge of the cycle with its `file:line`.

use std::path::Path;
use std::process::Command;

fn run(depth: &str) -> (bool, String) {
    run_on(depth, &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

fn run_on(depth: &str, src: &Path) -> (bool, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(root.join("scripts/import-cycles"))
        .args(["--depth", depth])
        .arg(src)
        .output()
        .expect("python3 runs scripts/import-cycles (python3 is a test dependency)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "scripts/import-cycles failed: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn no_cycle_between_top_level_modules() {
    let (clean, text) = run("1");
    assert!(clean, "{text}");
}

#[test]
fn no_cycle_between_submodules() {
    let (clean, text) = run("2");
    assert!(clean, "{text}");
}

/// The reader finds a cycle where there is one (else the two tests above could not fail): two
/// modules whose `use` items (one inside a brace group) name each other.
#[test]
fn a_cycle_is_reported_with_its_edges() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    std::fs::write(dir.path().join("a.rs"), "use crate::b::inner::X;\n").unwrap();
    std::fs::write(dir.path().join("b/mod.rs"), "pub mod inner;\n").unwrap();
    std::fs::write(
        dir.path().join("b/inner.rs"),
        "use std::fmt;\nuse crate::{a::Y, b::other};\n",
    )
    .unwrap();
    for depth in ["1", "2"] {
        let (clean, text) = run_on(depth, dir.path());
        assert!(!clean, "depth {depth}: {text}");
        assert!(text.contains("a.rs:1"), "depth {depth}: {text}");
        assert!(text.contains("b/inner.rs:2"), "depth {depth}: {text}");
    }
}

/// A test module another module's tests reach (`pub(crate) mod tests`) is cut off like any
/// test module: its `use` items make no cycle (found when the render and plan tests began
/// sharing a helper).
#[test]
fn a_pub_crate_test_module_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.rs"), "use crate::b::X;\n").unwrap();
    std::fs::write(
        dir.path().join("b.rs"),
        "pub struct X;\n#[cfg(test)]\npub(crate) mod tests {\n    use crate::a::Y;\n}\n",
    )
    .unwrap();
    let (clean, text) = run_on("1", dir.path());
    assert!(clean, "{text}");
}
