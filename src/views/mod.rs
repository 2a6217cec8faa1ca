//! Presentation: what a command prints for `ops`'s typed plans, events and reports (tables,
//! plan text, documents, progress lines), through the one [`crate::output::Printer`].
//!
//! A view decides nothing about the cluster: it turns an ops value into lines (or a
//! `Table`, a document) and, for a preview, says what it showed ([`Shown`]) so that the
//! command picks the exit code. Views depend on `ops`, the model and `output`, never on
//! `cli` (layers: `ops` < `views` < `cli`); text kprov did not write goes through
//! `output::untrusted` as everywhere.

pub mod addons;
pub mod bundle;
pub mod certificates;
pub mod create;
pub mod delete;
pub mod etcd;
pub mod instance;
pub mod nodes;
pub mod objects;
pub mod rolling;
pub mod signals;
pub mod toolbox;
pub mod update;

use serde::Serialize;

use crate::output::{Format, Printer};

/// What a preview showed, for the command's exit code (`cli::exit`: refused 1; changes
/// pending 2 under `--exit-code`, else 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// Nothing to do.
    UpToDate,
    /// Changes a `--yes` would make.
    Pending,
    /// The plan cannot run as it is (printed as errors).
    Refused,
}

/// `value` as the document `-o json` (pretty) or `-o yaml` prints; `table` for `-o table`.
pub fn document<T: Serialize>(
    printer: &Printer,
    value: &T,
    table: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    match printer.format() {
        Format::Json => printer.data(&serde_json::to_string_pretty(value)?),
        Format::Yaml => printer.data(&crate::output::to_yaml(value)?),
        Format::Table => printer.data(&table()),
    }
    Ok(())
}
