//! The add-ons' views: `update addons`' preview (the server's dry-run diffs) or what was
//! applied, and `validate cluster`'s result.

use super::Shown;
use crate::addons::validate::ValidationResult;
use crate::addons::{self, Manifest};
use crate::ops::addons::AddonReport;
use crate::output::{Format, Printer};

/// `get addons`: the manifests, exactly as they are applied (`-o json`: their document).
pub(crate) fn manifests(printer: &Printer, manifests: &[Manifest]) -> anyhow::Result<()> {
    match printer.format() {
        Format::Json => printer.data(&serde_json::to_string_pretty(manifests)?),
        // The manifests are the review artefact: print them exactly as they are applied.
        Format::Yaml | Format::Table => printer.data(&addons::manifests_yaml(manifests)),
    }
    Ok(())
}

/// The add-ons' preview (what would change) or what was applied.
pub(crate) fn report(printer: &Printer, name: &str, report: &AddonReport) -> Shown {
    if let Some(route) = &report.route {
        printer.debug(route);
    }
    printer.data(&addons::preview_text(&report.diffs));
    if !report.applied {
        let pending = report.pending();
        if pending {
            printer.status(&format!(
                "Must specify --yes to apply these add-on changes to {}.",
                name
            ));
        }
        return if pending {
            Shown::Pending
        } else {
            Shown::UpToDate
        };
    }
    printer.success(&format!(
        "Add-ons of {}: {}",
        name,
        addons::summary(&report.diffs)
    ));
    Shown::UpToDate
}

/// `validate cluster`'s result (the document, or the text); false when it did not pass.
pub(crate) fn validated(
    printer: &Printer,
    name: &str,
    result: &ValidationResult,
) -> anyhow::Result<bool> {
    match printer.format() {
        Format::Json => printer.data(&serde_json::to_string_pretty(result)?),
        Format::Yaml => printer.data(&crate::output::to_yaml(result)?),
        Format::Table => printer.data(&result.render_text()),
    }
    if result.ok {
        printer.success(&format!("Your cluster {name} is ready."));
        Ok(true)
    } else {
        printer.error(&format!("cluster {name} did not pass validation"));
        Ok(false)
    }
}
