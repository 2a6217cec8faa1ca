//! The one printer all user output goes through.
//!
//! Data (tables, YAML, JSON) goes to stdout so it can be piped; progress, warnings and errors go
//! to stderr. Colour and progress bars only on a terminal; plain lines otherwise.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use clap::ValueEnum;
use console::style;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Format {
    #[default]
    Table,
    Yaml,
    Json,
}

pub struct Printer {
    format: Format,
    color: bool,
    tty: bool,
    verbosity: u8,
    out: Mutex<Box<dyn Write + Send>>,
    err: Mutex<Box<dyn Write + Send>>,
}

impl Printer {
    pub fn new(format: Format, verbosity: u8) -> Self {
        let tty = std::io::stderr().is_terminal();
        let color = tty && std::env::var_os("NO_COLOR").is_none();
        Printer {
            format,
            color,
            tty,
            verbosity,
            out: Mutex::new(Box::new(std::io::stdout())),
            err: Mutex::new(Box::new(std::io::stderr())),
        }
    }

    /// A printer writing into buffers, for tests of command output.
    pub fn to_writers(
        format: Format,
        out: Box<dyn Write + Send>,
        err: Box<dyn Write + Send>,
    ) -> Self {
        Printer {
            format,
            color: false,
            tty: false,
            verbosity: 0,
            out: Mutex::new(out),
            err: Mutex::new(err),
        }
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn color(&self) -> bool {
        self.color
    }

    pub fn is_tty(&self) -> bool {
        self.tty
    }

    fn write_out(&self, s: &str) {
        if let Ok(mut o) = self.out.lock() {
            let _ = o.write_all(s.as_bytes());
            let _ = o.flush();
        }
    }

    fn write_err(&self, s: &str) {
        if let Ok(mut e) = self.err.lock() {
            let _ = e.write_all(s.as_bytes());
            let _ = e.flush();
        }
    }

    /// Raw text to stdout (already formatted data such as YAML streams or a preview).
    pub fn data(&self, text: &str) {
        let mut s = text.to_string();
        if !s.ends_with('\n') {
            s.push('\n');
        }
        self.write_out(&s);
    }

    /// A status line for humans (stderr).
    pub fn status(&self, msg: &str) {
        self.write_err(&format!("{msg}\n"));
    }

    pub fn success(&self, msg: &str) {
        let m = if self.color {
            style(msg).green().to_string()
        } else {
            msg.to_string()
        };
        self.status(&m);
    }

    pub fn warn(&self, msg: &str) {
        let prefix = if self.color {
            style("warning:").yellow().bold().to_string()
        } else {
            "warning:".into()
        };
        self.write_err(&format!("{prefix} {msg}\n"));
    }

    pub fn error(&self, msg: &str) {
        let prefix = if self.color {
            style("error:").red().bold().to_string()
        } else {
            "error:".into()
        };
        self.write_err(&format!("{prefix} {msg}\n"));
    }

    pub fn debug(&self, msg: &str) {
        if self.verbosity > 0 {
            self.write_err(&format!("{msg}\n"));
        }
    }

    /// Structured data in the chosen format; `table` renders the human table.
    pub fn value<T: Serialize>(
        &self,
        value: &T,
        table: impl FnOnce() -> Table,
    ) -> anyhow::Result<()> {
        match self.format {
            Format::Json => self.data(&serde_json::to_string_pretty(value)?),
            Format::Yaml => self.data(&serde_saphyr::to_string(value)?),
            Format::Table => self.data(&table().render()),
        }
        Ok(())
    }

    /// A progress bar on a terminal; on a pipe, plain lines at start and finish.
    pub fn progress(&self, len: u64, what: &str) -> Progress {
        if self.tty {
            let bar = ProgressBar::new(len);
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar.set_message(what.to_string());
            bar.enable_steady_tick(Duration::from_millis(120));
            Progress { bar: Some(bar) }
        } else {
            self.status(&format!("{what}: started ({len} items)"));
            Progress { bar: None }
        }
    }
}

pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    pub fn inc(&self, printer: &Printer, line: &str) {
        match &self.bar {
            Some(b) => {
                b.println(line);
                b.inc(1);
            }
            None => printer.status(line),
        }
    }

    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

/// A plain text table with left-aligned columns.
#[derive(Debug, Clone, Default)]
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>) -> Self {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    pub fn render(&self) -> String {
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
}
