//! The one way a value reaches a shell script that runs as root on a node.
//!
//! Two paths, both quoting with [`sh_quote`] (POSIX single quotes, the only quoting in which
//! no character is special):
//!
//! - Templates named `*.sh.tera` are rendered with tera's autoescape on and [`sh_quote`] as
//!   the escape function, so `{{ x }}` always yields one quoted word. A template must use
//!   `{{ x }}` only in an unquoted position and never with a filter (`| safe` would turn the
//!   quoting off, and tera does not escape `~` concatenations); `template_lint` in the tests
//!   enforces this for every shell template.
//! - Scripts built in Rust use [`script!`], which quotes every argument. `format!` is not used
//!   for `run` or `check` strings in `render` (also enforced by a test).
//!
//! Caveat: a NUL byte cannot be part of a shell word at all. Validation refuses control
//! characters in every field that reaches a node, and the quoting drops NULs rather than let a
//! script be cut short.

use std::fmt;

use tera::Tera;

/// Suffix of the templates rendered with shell quoting.
pub(crate) const SH_SUFFIX: &str = ".sh.tera";

/// Quotes `s` as one POSIX shell word: `it's` becomes `'it'\''s'`.
pub(crate) fn sh_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\'' => out.push_str(r"'\''"),
            '\0' => {}
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// Turns on shell quoting for every `*.sh.tera` template of `tera` (and no other: YAML, TOML
/// and haproxy templates quote their own way).
pub(crate) fn enable_template_quoting(tera: &mut Tera) {
    tera.set_escape_fn(sh_quote);
    tera.autoescape_on(vec![SH_SUFFIX]);
}

/// A value displayed as one quoted shell word (see [`script!`]).
pub(crate) struct Quoted<'a>(pub &'a str);

impl<'a> Quoted<'a> {
    pub(crate) fn new<S: AsRef<str> + ?Sized>(s: &'a S) -> Self {
        Quoted(s.as_ref())
    }
}

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&sh_quote(self.0))
    }
}

/// `format!` for shell scripts: every argument is quoted as one shell word.
///
/// `script!("test -f {} && cat {}", path, other)`. The literal is code; arguments are data.
#[macro_export]
macro_rules! script {
    ($fmt:literal $(, $arg:expr)* $(,)?) => {
        format!($fmt $(, $crate::provision::shell::Quoted::new(&$arg))*)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote("a\0b"), "'ab'");
        assert_eq!(script!("x {} y", "$(z)"), "x '$(z)' y");
        let owned = String::from("a b");
        assert_eq!(script!("{} {}", owned, "c"), "'a b' 'c'");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Whatever the string, `sh` reads it back as exactly one argument, unchanged.
        #[test]
        fn quoted_word_round_trips(s in "[^\\x00]{0,40}") {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf '%s\\0' {}", sh_quote(&s)))
                .output()
                .expect("sh runs");
            proptest::prop_assert!(out.status.success());
            let mut want = s.clone().into_bytes();
            want.push(0);
            proptest::prop_assert_eq!(out.stdout, want);
        }
    }
}
