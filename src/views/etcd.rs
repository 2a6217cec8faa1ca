//! `get backups`' table: the etcd snapshots of a cluster, damaged records named.

use crate::ops::etcd::{BackupRecord, Backups, DamagedRecord};
use crate::ops::etcd_backup::Restore;
use crate::output::{Printer, Table, untrusted};

/// `backup etcd`: the record (`location`: where the snapshot is stored).
pub(crate) fn backed_up(
    printer: &Printer,
    name: &str,
    record: &BackupRecord,
    location: &str,
) -> anyhow::Result<()> {
    printer.value(record, || backups_table(std::slice::from_ref(record), &[]))?;
    printer.success(&format!(
        "Backed up etcd of {name} from {} to {location} ({} bytes, sha256 {}).",
        record.host, record.size, record.sha256
    ));
    Ok(())
}

/// `get backups`: the table (or the records' document), each damaged record warned of.
pub(crate) fn backups(printer: &Printer, name: &str, backups: &Backups) -> anyhow::Result<()> {
    printer.value(&backups.records, || {
        backups_table(&backups.records, &backups.damaged)
    })?;
    for d in &backups.damaged {
        printer.warn(&format!(
            "backup record {} is damaged: {}; it is not a backup kprov can use and `restore \
             etcd` refuses it. If you did not put it there, find out who can write the state \
             store; then `kprov delete damaged {name} --yes` removes it",
            untrusted(&d.key),
            untrusted(&d.reason)
        ));
    }
    Ok(())
}

/// `restore etcd`'s plan: the snapshot (checksum verified) and the steps per host.
pub(crate) fn restore_plan(printer: &Printer, name: &str, restore: &Restore) {
    let (plan, record) = (&restore.plan, &restore.plan.backup);
    let mut t = Table::new(["HOST", "STEPS"]);
    for (h, what) in &plan.hosts {
        t.row([h.clone(), what.join("; ")]);
    }
    printer.data(&format!(
        "Restore etcd of {name} ({} etcd) from snapshot {} taken {} on {} ({} bytes, sha256 {} verified):\n{}",
        plan.etcd,
        untrusted(&record.id),
        untrusted(&record.taken_at),
        untrusted(&record.host),
        record.size,
        untrusted(&record.sha256),
        t.render()
    ));
}

/// A restore's preview ends here.
pub(crate) fn restore_pending(printer: &Printer, record: &BackupRecord) {
    printer.status(&format!(
        "Everything written to the cluster after {} is lost. Must specify --yes to restore.",
        untrusted(&record.taken_at)
    ));
}

/// `restore etcd --yes` succeeded.
pub(crate) fn restored(printer: &Printer, name: &str, record: &BackupRecord) {
    printer.success(&format!(
        "Restored etcd of {name} from snapshot {}: every member healthy, API servers started.",
        untrusted(&record.id)
    ));
}

/// The snapshots, newest first as listed, and the records that failed their check.
pub(crate) fn backups_table(records: &[BackupRecord], damaged: &[DamagedRecord]) -> Table {
    let mut t = Table::new(["SNAPSHOT", "TAKEN", "MEMBER", "ETCD", "SIZE", "SHA256"]);
    // Checked on read (`BackupRecord::check`), and escaped all the same: the table is the
    // one place these values meet a terminal.
    for r in records {
        t.row([
            untrusted(&r.id).to_string(),
            untrusted(&r.taken_at).to_string(),
            untrusted(&r.host).to_string(),
            untrusted(&r.etcd).to_string(),
            r.size.to_string(),
            untrusted(&r.sha256).to_string(),
        ]);
    }
    for d in damaged {
        let name = d.key.rsplit('/').next().unwrap_or(&d.key);
        t.row([
            untrusted(name.trim_end_matches(".json")).to_string(),
            "DAMAGED".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
        ]);
    }
    t
}
