//! Presentation: what a command prints for `ops`'s typed plans, events and reports (tables,
//! plan text, documents, progress lines), through the one [`crate::output::Printer`].
//!
//! A view decides nothing about the cluster: it turns an ops value into lines (or a
//! `Table`, a document) and, for a preview, says what it showed ([`Shown`]) so that the
//! command picks the exit code. Views depend on `ops`, the model and `output`, never on
//! `cli` (layers: `ops` < `views` < `cli`); text kprov did not write goes through
//! `output::untrusted` as everywhere.

pub(crate) mod addons;
pub(crate) mod bundle;
pub(crate) mod certificates;
pub(crate) mod create;
pub(crate) mod delete;
pub(crate) mod etcd;
pub(crate) mod instance;
pub(crate) mod nodes;
pub(crate) mod objects;
pub(crate) mod rolling;
pub(crate) mod signals;
pub(crate) mod toolbox;
pub(crate) mod update;

/// What a preview showed, for the command's exit code (`cli::exit`: refused 1; changes
/// pending 2 under `--exit-code`, else 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shown {
    /// Nothing to do.
    UpToDate,
    /// Changes a `--yes` would make.
    Pending,
    /// The plan cannot run as it is (printed as errors).
    Refused,
}
