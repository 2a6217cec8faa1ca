//! `create sshpublickey` and `toolbox dump`'s views.

use crate::ops::sshkey::{KeyChange, PublicKey};
use crate::ops::toolbox::Dump;
use crate::output::{Format, Printer};

/// What `create sshpublickey` stored.
pub(crate) fn key_stored(printer: &Printer, name: &str, key: &PublicKey, change: &KeyChange) {
    match change {
        KeyChange::Unchanged => printer.success(&format!(
            "{name} already has this SSH public key ({}).",
            key.fingerprint
        )),
        KeyChange::Stored { replaced } => {
            printer.success(&format!(
                "Stored the SSH public key of {name} ({}){}.",
                key.fingerprint,
                replaced
                    .as_ref()
                    .map(|r| format!(", replacing {r}"))
                    .unwrap_or_default() // nothing replaced: no suffix
            ));
            printer.status(&format!(
                "AWS: `kprov update cluster {name} --yes` writes it into the key pair and launch templates; running instances get it when `kprov rolling-update cluster {name} --yes` replaces them."
            ));
        }
    }
}

/// `toolbox dump`: the parts not read warned of, then the document (`-o json`, else YAML).
pub(crate) fn dump(printer: &Printer, name: &str, d: &Dump) -> anyhow::Result<()> {
    for (part, e) in [
        ("cloud resources", &d.resources_error),
        ("machines", &d.machines_error),
        ("nodes", &d.nodes_error),
    ] {
        if let Some(e) = e {
            printer.warn(&format!(
                "{part} of {name} not read: {}",
                crate::output::untrusted(e)
            ));
        }
    }
    match printer.format() {
        Format::Json => printer.data(&serde_json::to_string_pretty(d)?),
        _ => printer.data(&crate::output::to_yaml(d)?),
    }
    Ok(())
}
