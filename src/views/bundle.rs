//! `get assets` and `create bundle`'s views: the artifact list, and what the bundle holds.

use std::path::Path;
use std::time::Duration;

use crate::bundle::artifacts::{self, Artifacts};
use crate::bundle::fetch::Made;
use crate::output::{Format, Printer};

/// `get assets`: every binary and image the cluster's nodes need (`-o json|yaml`: the list).
pub(crate) fn assets(printer: &Printer, list: &Artifacts) -> anyhow::Result<()> {
    match printer.format() {
        Format::Json => printer.data(&serde_json::to_string_pretty(list)?),
        Format::Yaml => printer.data(&crate::output::to_yaml(list)?),
        Format::Table => printer.data(&artifacts::table(list)),
    }
    Ok(())
}

/// `create bundle` wrote `out`.
pub(crate) fn made(printer: &Printer, out: &Path, cluster: &str, made: &Made, took: Duration) {
    printer.status(&format!(
        "Wrote bundle {} for {cluster} ({}, Kubernetes {}): {} entries, {} bytes, in {:.1}s.",
        out.display(),
        made.manifest.arch,
        made.manifest.kubernetes_version,
        made.manifest.entries.len(),
        made.bytes,
        took.as_secs_f64()
    ));
}
