//! The import-cycle check as a test (issue 19: "no import cycle anywhere in `src/`"), so a
//! cycle cannot come back unnoticed. It runs `scripts/import-cycles` (the one reader of the
//! `use` lines) on this crate's `src/`; needs `python3`, no root.
//!
//! Both depths must be free of cycles: top-level modules (`spec`, `nodes`, `provision`, ...)
//! and their submodules (`provision::plan`, `provision::orchestrate`, ...). A `use` that closes
//! a cycle fails `cargo test`, naming every edge of the cycle with its `file:line`.

use std::path::Path;
use std::process::Command;

use crate::test_files::tree;

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

/// The reader at `depth` on a temporary tree of `files`.
fn run_on_tree(depth: &str, files: &[(&str, &str)]) -> (bool, String) {
    run_on(depth, tree(files).path())
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
    let dir = tree(&[
        ("a.rs", "use crate::b::inner::X;\n"),
        ("b/mod.rs", "pub mod inner;\n"),
        (
            "b/inner.rs",
            "use std::fmt;\nuse crate::{a::Y, b::other};\n",
        ),
    ]);
    for depth in ["1", "2"] {
        let (clean, text) = run_on(depth, dir.path());
        assert!(!clean, "depth {depth}: {text}");
        assert!(text.contains("a.rs:1"), "depth {depth}: {text}");
        assert!(text.contains("b/inner.rs:2"), "depth {depth}: {text}");
    }
}

/// A path written inline in code is a dependency as much as a `use` item (three such edges
/// hid a cycle of nine modules until the reader read them); one in a comment is not.
#[test]
fn an_inline_path_closes_a_cycle_and_a_comment_does_not() {
    let a = ("a.rs", "use crate::b::X;\n");
    let commented = "// see crate::a::Y\n/// [`crate::a::Y`]\npub struct X;\n";
    let (clean, text) = run_on_tree("1", &[a, ("b.rs", commented)]);
    assert!(clean, "{text}");
    let inline = "pub struct X;\nfn f() -> String {\n    let _ = ('\"', \"a\n//\");\n    \
                  \"https://x\".to_string() + &crate::a::y()\n}\n";
    let (clean, text) = run_on_tree("1", &[a, ("b.rs", inline)]);
    assert!(!clean, "{text}");
    assert!(text.contains("b.rs:5"), "{text}");
}

/// A test module another module's tests reach (`pub(crate) mod tests`) is cut off like any
/// test module: its `use` items make no cycle (found when the render and plan tests began
/// sharing a helper).
#[test]
fn a_pub_crate_test_module_is_skipped() {
    let b = "pub struct X;\n#[cfg(test)]\npub(crate) mod tests {\n    use crate::a::Y;\n}\n";
    let (clean, text) = run_on_tree("1", &[("a.rs", "use crate::b::X;\n"), ("b.rs", b)]);
    assert!(clean, "{text}");
}

/// The modules `cli` may name (issue 19: "`cli/` parses and prints; it imports only `ops`, the
/// resolved model and `output`"): the use cases, their renderers, the printer, the spec.
const CLI_MAY_USE: [&str; 5] = ["cli", "ops", "views", "output", "spec"];

/// Every path into the crate that a file below `dir` (a copy of `src/cli`) writes to a module
/// outside [`CLI_MAY_USE`], as `file:line: module`: `use` items and paths written inline,
/// test modules included, brace groups expanded; comments are not read.
fn cli_foreign_paths(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("read src/cli")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    for file in files {
        let name = file
            .file_name()
            .unwrap_or_default() // a path read from a directory listing always has a name
            .to_string_lossy()
            .into_owned();
        // How many `super::` reach the crate root: one from mod.rs, two from cli's other
        // files, one more inside their test module.
        let mut root = if name == "mod.rs" { 1 } else { 2 };
        let text = std::fs::read_to_string(&file).expect("read a cli file");
        let mut after_cfg_test = false;
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if after_cfg_test && code.contains("mod ") {
                root += 1;
            }
            after_cfg_test = code.trim() == "#[cfg(test)]";
            let mut modules = Vec::new();
            let mut rest = code;
            while let Some(i) = rest
                .find("crate::")
                .into_iter()
                .chain(rest.find("super::"))
                .min()
            {
                rest = &rest[i..];
                if let Some(r) = rest.strip_prefix("crate::") {
                    rest = r;
                    modules.extend(first_segments(rest));
                    continue;
                }
                let mut supers = 0;
                while let Some(r) = rest.strip_prefix("super::") {
                    (rest, supers) = (r, supers + 1);
                }
                if supers >= root {
                    modules.extend(first_segments(rest));
                }
            }
            for module in modules {
                if !CLI_MAY_USE.contains(&module.as_str()) {
                    found.push(format!("src/cli/{name}:{}: {module}", n + 1));
                }
            }
        }
    }
    found
}

/// The first segment of a path's remainder (`ops::x` -> `ops`), or of each item of a brace
/// group (`{ops::x, state::Y}` -> `ops`, `state`; a group left open on the line ends there).
fn first_segments(rest: &str) -> Vec<String> {
    let ident = |s: &str| {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect::<String>()
    };
    let Some(group) = rest.strip_prefix('{') else {
        return vec![ident(rest)]
            .into_iter()
            .filter(|m| !m.is_empty())
            .collect();
    };
    let (mut depth, mut items, mut start) = (0, Vec::new(), 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                start = group.len();
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start.min(group.len())..]);
    items
        .into_iter()
        .map(ident)
        .filter(|m| !m.is_empty() && m != "self")
        .collect()
}

#[test]
fn cli_imports_only_ops_views_output_and_the_spec() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cli");
    let found = cli_foreign_paths(&dir);
    assert!(
        found.is_empty(),
        "cli names modules below ops (re-export them through ops::model or wrap them in an \
         ops function):\n{}",
        found.join("\n")
    );
}

/// The check finds a lower module however cli names it: a `use`, a brace group, a path
/// written inline, `super::` from mod.rs; and lets the allowed ones and comments pass.
#[test]
fn a_cli_import_of_a_lower_module_is_found() {
    let dir = tree(&[
        (
            "a.rs",
            "use crate::ops::x;\nuse crate::{views::v, state::lock::LockError};\n\
             // crate::repo in a comment\nfn f() { crate::bounded::read(); }\n\
             use super::commands::Ctx;\n#[cfg(test)]\nmod tests {\n    use super::*;\n    \
             use super::super::spec::X;\n    use super::super::super::kube::Y;\n}\n",
        ),
        (
            "mod.rs",
            "use super::inventory::X;\nuse super::output::Printer;\n",
        ),
    ]);
    assert_eq!(
        cli_foreign_paths(dir.path()),
        [
            "src/cli/a.rs:2: state",
            "src/cli/a.rs:4: bounded",
            "src/cli/a.rs:10: kube",
            "src/cli/mod.rs:1: inventory"
        ]
    );
}
