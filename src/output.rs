//! The one printer all user output goes through.
//!
//! Data (tables, YAML, JSON) goes to stdout so it can be piped; progress, warnings and errors go
//! to stderr. Colour and progress bars only on a terminal; plain lines otherwise.

use std::borrow::Cow;
use std::fmt;
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use clap::ValueEnum;
use console::style;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

/// Whether a character may not reach a terminal as it is: C0 controls (newline and tab
/// included: in a single-line context a newline lets a value forge a line of kprov's own, such
/// as `error: ...`), DEL, C1 controls (U+0080..U+009F: `U+009B` is a CSI on terminals that read
/// C1 in UTF-8) and the bidi controls that reorder what is shown (Trojan Source).
pub(crate) fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{061c}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `1 thing` or `n things` (regular plurals; pass the singular).
pub(crate) fn plural(n: usize, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

/// The one escaping function for text kprov did not write itself (the state store, a spec or
/// inventory, a host's output, a cloud API's message): every character [`is_unsafe`] is
/// shown escaped (`\n`, `\t`, `\r`, `\x1b`, `\u{202e}`), so the value stays on one line and
/// no escape sequence reaches the terminal. Borrowed when nothing needs escaping.
pub(crate) fn escape(s: &str) -> Cow<'_, str> {
    escape_except(s, |_| false)
}

fn escape_except(s: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(|c| is_unsafe(c) && !keep(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !is_unsafe(c) || keep(c) {
            out.push(c);
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

/// Text kprov did not write itself. Its `Display` escapes (see [`escape`]), so formatting an
/// `Untrusted` into a message cannot pass a control character, an escape sequence or a line
/// break through; there is no way to get the raw text back out of it for printing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Untrusted<'a>(pub &'a str);

/// Wraps untrusted text for a message: `format!("held by {}", untrusted(&record.holder))`.
pub(crate) fn untrusted(s: &str) -> Untrusted<'_> {
    Untrusted(s)
}

impl fmt::Display for Untrusted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&escape(self.0))
    }
}

impl fmt::Debug for Untrusted<'_> {
    /// Quoted, for values that may be empty or padded (`".."`, `" x"`): the quotes show where
    /// the value starts and ends.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", escape(self.0))
    }
}

/// Owned text kprov did not write itself, for error types and progress events that outlive
/// the value they quote (a cloud API's message, a host's answer, an Auto Scaling failure
/// reason). Like [`Untrusted`], its only ways out are a `Display` that escapes (always one
/// line: a progress line or an error stays a line of kprov's own) and a quoted `Debug`; the raw
/// text cannot be borrowed back for printing. Escaping is idempotent, so text that was already
/// escaped (an `ExecError`'s message) passes unchanged but for its line breaks.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct UntrustedText(String);

impl UntrustedText {
    pub(crate) fn new(s: impl Into<String>) -> UntrustedText {
        UntrustedText(s.into())
    }

    /// For decisions on the text (is it a known error?), never for printing.
    pub fn contains(&self, pattern: &str) -> bool {
        self.0.contains(pattern)
    }
}

impl From<String> for UntrustedText {
    fn from(s: String) -> UntrustedText {
        UntrustedText(s)
    }
}

impl From<&str> for UntrustedText {
    fn from(s: &str) -> UntrustedText {
        UntrustedText(s.to_string())
    }
}

impl fmt::Display for UntrustedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Untrusted(self.0.trim_end_matches('\n')), f)
    }
}

impl fmt::Debug for UntrustedText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&Untrusted(&self.0), f)
    }
}

/// Several lines of untrusted text (a host's stderr): each line escaped and indented with
/// `  | `, so no line of it can pass for a line kprov wrote.
pub(crate) struct UntrustedBlock<'a>(pub &'a str);

impl fmt::Display for UntrustedBlock<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, line) in self.0.lines().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "  | {}", escape(line))?;
        }
        Ok(())
    }
}

/// The last line of defence, applied to everything the printer writes: whatever a message
/// holds, only its own line breaks pass; every other unsafe character is escaped.
pub(crate) fn sanitize_lines(s: &str) -> Cow<'_, str> {
    escape_except(s, |c| c == '\n')
}

/// JSON with every character a terminal could act on written as a `\uXXXX` escape. serde_json
/// already escapes C0 controls; DEL, C1 and bidi controls it leaves raw. They can occur only
/// inside strings, and the escape denotes the same string, so the document stays exact.
#[cfg(test)]
pub(crate) fn json_terminal_safe(json: &str) -> Cow<'_, str> {
    data_safe(json, false)
}

/// YAML for stdout that stays exact whatever its strings hold. YAML can show only some
/// characters escaped, and only inside double quotes: serde_saphyr writes DEL, C1 and bidi
/// controls (and tabs) raw, in plain scalars where the printer's `\uXXXX` would read back as
/// six characters. So a document that would carry any such character raw is written in YAML's
/// JSON form instead (JSON is YAML: every string double-quoted, where `\uXXXX` is the same
/// character), which the printer then makes terminal-safe without changing what it says.
pub(crate) fn yaml_exact(yaml: String, value: &impl Serialize) -> String {
    if !yaml.chars().any(|c| is_unsafe(c) && c != '\n') {
        return yaml;
    }
    serde_json::to_string_pretty(value)
        .map(|mut json| {
            json.push('\n');
            json
        })
        .unwrap_or(yaml)
}

/// [`yaml_exact`] of serde_saphyr's YAML: what every `-o yaml` prints.
pub(crate) fn to_yaml<T: Serialize>(value: &T) -> Result<String, serde_saphyr::ser::Error> {
    Ok(yaml_exact(serde_saphyr::to_string(value)?, value))
}

/// Like [`json_terminal_safe`] for any data; with `allow_sgr`, the colour sequences
/// (`ESC [ digits ; ... m`, which only change colours) pass, for the printer's own coloured
/// output on a terminal. No other sequence does.
fn data_safe(s: &str, allow_sgr: bool) -> Cow<'_, str> {
    if !s.chars().any(|c| is_unsafe(c) && c != '\n') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if allow_sgr
            && c == '\x1b'
            && let Some(len) = sgr_len(rest)
        {
            out.push_str(&rest[..len]);
            rest = &rest[len..];
            continue;
        }
        if is_unsafe(c) && c != '\n' {
            let mut buf = [0u16; 2];
            for unit in c.encode_utf16(&mut buf) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    Cow::Owned(out)
}

/// The length of a colour sequence at the start of `s`, if one is there.
fn sgr_len(s: &str) -> Option<usize> {
    let body = s.strip_prefix("\x1b[")?;
    let params = body
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b';')
        .count();
    (params <= 32 && body.as_bytes().get(params) == Some(&b'm')).then_some(2 + params + 1)
}

/// An error with its causes, `outer: cause: root`, each cause shown once: a message that
/// already quotes its cause (`cannot read X: permission denied` over `permission denied`) is
/// not followed by that cause again.
pub(crate) fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub(crate) enum Format {
    #[default]
    Table,
    Yaml,
    Json,
}

pub(crate) struct Printer {
    format: Format,
    /// Colour on stderr (status, warnings, errors).
    err_color: bool,
    /// Colour in data on stdout (a plan on a terminal).
    out_color: bool,
    tty: bool,
    verbosity: u8,
    out: Mutex<Box<dyn Write + Send>>,
    err: Mutex<Box<dyn Write + Send>>,
}

impl Printer {
    pub(crate) fn new(format: Format, verbosity: u8) -> Self {
        let tty = std::io::stderr().is_terminal();
        let no_color = std::env::var_os("NO_COLOR").is_some();
        let err_color = tty && !no_color;
        // Each stream by its own terminal: `kprov update cluster X > plan.txt` on a terminal
        // writes no colour codes into the file, and `2> log` none into the log.
        let out_color = std::io::stdout().is_terminal() && !no_color;
        Printer {
            format,
            err_color,
            out_color,
            tty,
            verbosity,
            out: Mutex::new(Box::new(std::io::stdout())),
            err: Mutex::new(Box::new(std::io::stderr())),
        }
    }

    /// A printer writing into buffers, for tests of command output.
    #[cfg(test)]
    pub(crate) fn to_writers(
        format: Format,
        out: Box<dyn Write + Send>,
        err: Box<dyn Write + Send>,
    ) -> Self {
        Printer {
            format,
            err_color: false,
            out_color: false,
            tty: false,
            verbosity: 0,
            out: Mutex::new(out),
            err: Mutex::new(err),
        }
    }

    pub(crate) fn format(&self) -> Format {
        self.format
    }

    /// Whether data written with [`Printer::data`] may be coloured (stdout is a terminal).
    pub(crate) fn color(&self) -> bool {
        self.out_color
    }

    pub(crate) fn is_tty(&self) -> bool {
        self.tty
    }

    /// How many `-v` were given.
    pub(crate) fn verbosity(&self) -> u8 {
        self.verbosity
    }

    /// Stdout carries data (tables, YAML, JSON) that may be piped into a file: unsafe characters
    /// become `\uXXXX`, which JSON and YAML double-quoted strings read back as the same
    /// character (serializers quote strings that hold them).
    fn write_out(&self, s: &str) {
        let s = data_safe(s, self.out_color);
        if let Ok(mut o) = self.out.lock() {
            let _ = o.write_all(s.as_bytes());
            let _ = o.flush();
        }
    }

    /// Writes a message that is already sanitized (colour codes are the printer's own).
    fn write_err_raw(&self, s: &str) {
        if let Ok(mut e) = self.err.lock() {
            let _ = e.write_all(s.as_bytes());
            let _ = e.flush();
        }
    }

    fn write_err(&self, s: &str) {
        self.write_err_raw(&sanitize_lines(s));
    }

    /// Raw text to stdout (already formatted data such as YAML streams or a preview).
    pub(crate) fn data(&self, text: &str) {
        let mut s = text.to_string();
        if !s.ends_with('\n') {
            s.push('\n');
        }
        self.write_out(&s);
    }

    /// A status line for humans (stderr).
    pub(crate) fn status(&self, msg: &str) {
        self.write_err(&format!("{msg}\n"));
    }

    pub(crate) fn success(&self, msg: &str) {
        let msg = sanitize_lines(msg);
        let m = if self.err_color {
            style(msg).green().force_styling(true).to_string()
        } else {
            msg.into_owned()
        };
        self.write_err_raw(&format!("{m}\n"));
    }

    pub(crate) fn warn(&self, msg: &str) {
        let prefix = if self.err_color {
            style("warning:")
                .yellow()
                .bold()
                .force_styling(true)
                .to_string()
        } else {
            "warning:".into()
        };
        self.write_err_raw(&format!("{prefix} {}\n", sanitize_lines(msg)));
    }

    pub(crate) fn error(&self, msg: &str) {
        let prefix = if self.err_color {
            style("error:").red().bold().force_styling(true).to_string()
        } else {
            "error:".into()
        };
        self.write_err_raw(&format!("{prefix} {}\n", sanitize_lines(msg)));
    }

    pub(crate) fn debug(&self, msg: &str) {
        if self.verbosity > 0 {
            self.write_err(&format!("{msg}\n"));
        }
    }

    /// Structured data in the chosen format; `table` renders the human table.
    pub(crate) fn value<T: Serialize>(
        &self,
        value: &T,
        table: impl FnOnce() -> Table,
    ) -> anyhow::Result<()> {
        match self.format {
            Format::Json => self.data(&serde_json::to_string_pretty(value)?),
            Format::Yaml => self.data(&to_yaml(value)?),
            Format::Table => self.data(&table().render()),
        }
        Ok(())
    }

    /// A progress bar on a terminal; on a pipe, plain lines at start and finish.
    pub(crate) fn progress(&self, len: u64, what: &str) -> Progress {
        if self.tty {
            let bar = ProgressBar::new(len);
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar.set_message(sanitize_lines(what).into_owned());
            bar.enable_steady_tick(Duration::from_millis(120));
            Progress { bar: Some(bar) }
        } else {
            self.status(&format!("{what}: started ({len} items)"));
            Progress { bar: None }
        }
    }
}

pub(crate) struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    pub(crate) fn inc(&self, printer: &Printer, line: &str) {
        match &self.bar {
            Some(b) => {
                b.println(sanitize_lines(line));
                b.inc(1);
            }
            None => printer.status(line),
        }
    }

    pub(crate) fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

/// A plain text table with left-aligned columns.
#[derive(Debug, Clone, Default)]
pub(crate) struct Table {
    pub(crate) headers: Vec<String>,
    pub(crate) rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>) -> Self {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    pub(crate) fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    pub(crate) fn render(&self) -> String {
        let cols = self.headers.len();
        let mut width = vec![0usize; cols];
        for r in std::iter::once(&self.headers).chain(self.rows.iter()) {
            for (i, c) in r.iter().enumerate().take(cols) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        for r in std::iter::once(&self.headers).chain(self.rows.iter()) {
            let line: Vec<String> = r
                .iter()
                .enumerate()
                .take(cols)
                .map(|(i, c)| {
                    if i + 1 == cols {
                        c.clone()
                    } else {
                        format!("{c:<w$}", w = width[i])
                    }
                })
                .collect();
            out.push_str(line.join("   ").trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(["NAME", "CLOUD"]);
        t.row(["a.example.com", "aws"]);
        t.row(["b", "metal"]);
        assert_eq!(
            t.render(),
            "NAME            CLOUD\na.example.com   aws\nb               metal\n"
        );
    }

    #[test]
    fn untrusted_text_is_shown_escaped() {
        // OSC 52 (writes the clipboard), clear screen, a forged line, a C1 CSI, Trojan Source.
        let osc52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07";
        assert_eq!(
            untrusted(osc52).to_string(),
            "\\x1b]52;c;ZWNobyBwd25lZA==\\x07"
        );
        assert_eq!(untrusted("\x1b[2J\x1b[H").to_string(), "\\x1b[2J\\x1b[H");
        assert_eq!(
            untrusted("alice\nerror: all nodes deleted").to_string(),
            "alice\\nerror: all nodes deleted"
        );
        assert_eq!(
            untrusted("a\u{9b}31mb\r\t\x7f").to_string(),
            "a\\x9b31mb\\r\\t\\x7f"
        );
        assert_eq!(untrusted("abc\u{202e}fed").to_string(), "abc\\u{202e}fed");
        assert_eq!(format!("{:?}", untrusted("..")), "\"..\"");
        assert_eq!(format!("{:?}", untrusted("")), "\"\"");
        assert!(matches!(escape("plain ünïcode"), Cow::Borrowed(_)));
        assert_eq!(
            UntrustedBlock("line 1\nerror: forged\x1b[2J").to_string(),
            "  | line 1\n  | error: forged\\x1b[2J"
        );
    }

    #[test]
    fn json_stays_exact_and_terminal_safe() {
        let v = serde_json::json!({"holder": "a\x1b]52;c;x\x07\u{9b}2J\u{202e}\nz"});
        let raw = serde_json::to_string(&v).unwrap();
        let safe = json_terminal_safe(&raw);
        assert!(!safe.chars().any(is_unsafe), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn only_colour_sequences_pass_and_only_as_the_printers_own() {
        assert_eq!(data_safe("\x1b[32m+\x1b[0m", true), "\x1b[32m+\x1b[0m");
        assert_eq!(data_safe("\x1b[32m+", false), "\\u001b[32m+");
        assert_eq!(
            data_safe("\x1b[2J\x1b]52;c;x\x07", true),
            "\\u001b[2J\\u001b]52;c;x\\u0007"
        );
    }

    #[test]
    fn an_error_names_each_cause_once() {
        let io = std::io::Error::other("permission denied");
        let e = anyhow::Error::new(io).context("cannot read x: permission denied");
        assert_eq!(error_chain(&e), "cannot read x: permission denied");
        let e = anyhow::anyhow!("root").context("outer");
        assert_eq!(error_chain(&e), "outer: root");
    }

    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    proptest::proptest! {
        /// `-o json` and `-o yaml` stay exact: whatever a string holds (control bytes, C1,
        /// bidi controls, newlines), the printed document parses back to the same value, and
        /// holds no unsafe character but line breaks.
        #[test]
        fn data_round_trips_exactly_through_json_and_yaml(
            value in proptest::prop_oneof![
                proptest::strategy::Strategy::prop_map(
                    proptest::collection::vec(proptest::num::u8::ANY, 0..64),
                    |b| String::from_utf8_lossy(&b).into_owned(),
                ),
                "[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}\\u{202e}\\u{2066}a: #'\"\\n-]{0,40}",
            ],
        ) {
            let v = serde_json::json!({"holder": value, "list": [value, "plain"], "n": 1});
            for format in [Format::Json, Format::Yaml] {
                let out = Buf::default();
                let p = Printer::to_writers(format, Box::new(out.clone()), Box::new(Buf::default()));
                p.value(&v, Table::default).unwrap();
                let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
                proptest::prop_assert!(
                    !text.chars().any(|c| is_unsafe(c) && c != '\n'),
                    "{format:?}: {text:?}"
                );
                let back: serde_json::Value = match format {
                    Format::Json => serde_json::from_str(&text).unwrap(),
                    _ => serde_saphyr::from_str(&text)
                        .map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{e}: {text:?}")))?,
                };
                proptest::prop_assert_eq!(&back, &v, "{:?}: {:?}", format, text);
            }
        }

        /// Whatever a message holds, the printer writes no control byte but its own line
        /// breaks, on either stream, and an untrusted value adds no line break at all.
        #[test]
        fn no_output_path_passes_a_control_character(
            value in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
        ) {
            let value = String::from_utf8_lossy(&value).into_owned();
            let (out, err) = (Buf::default(), Buf::default());
            let p = Printer::to_writers(Format::Table, Box::new(out.clone()), Box::new(err.clone()));
            let msg = format!("held by {}", untrusted(&value));
            p.status(&msg);
            p.success(&msg);
            p.warn(&msg);
            p.error(&msg);
            p.debug(&msg);
            p.status(&value);
            p.error(&value);
            p.data(&value);
            let mut t = Table::new(["A", "B"]);
            t.row([value.clone(), untrusted(&value).to_string()]);
            p.data(&t.render());
            p.value(&serde_json::json!({"v": value}), Table::default).unwrap();
            let pj = Printer::to_writers(Format::Json, Box::new(out.clone()), Box::new(err.clone()));
            pj.value(&serde_json::json!({"v": value}), Table::default).unwrap();
            let prog = p.progress(1, &value);
            prog.inc(&p, &value);
            prog.finish();
            for stream in [&out, &err] {
                let text = String::from_utf8(stream.0.lock().unwrap().clone()).unwrap();
                proptest::prop_assert!(
                    !text.chars().any(|c| is_unsafe(c) && c != '\n'),
                    "{text:?}"
                );
            }
            proptest::prop_assert!(!msg.contains('\n'));
            proptest::prop_assert!(!msg.chars().any(is_unsafe));
            proptest::prop_assert!(!UntrustedBlock(&value).to_string().chars().any(|c| is_unsafe(c) && c != '\n'));
        }
    }
}
