//! The output side of the trust boundary as one property (issue 21): arbitrary bytes in every
//! field kprov did not write itself (a lock, a backup record, the rolling-update journal, a
//! record of a provisioned host, the known host keys, names in specs and inventories, a host's
//! output, a cloud API's error) give messages in which no control character, escape sequence
//! or bidi control appears and no line starts but one of kprov's own (indented continuation
//! lines); and through the printer nothing the user sees holds any but its line breaks.

use std::io::Write;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;

use crate::nodes::journal::{Journal, JournalError};
use crate::output::{Format, Printer, is_unsafe};
use crate::ssh::task::ExecError;
use crate::state::lock::{LockError, LockRecord};

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("buffer").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Arbitrary bytes (as text, the way kprov reads them: lossy where it must), or text dense in
/// controls, newlines and forged lines.
fn hostile() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..48)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        "[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}\\u{202e}\\u{2066}a\\n]{0,40}",
        Just("x\nerror: all nodes were deleted\u{1b}]52;c;eA==\u{7}".to_string()),
    ]
}

fn json_with(mut base: serde_json::Value, path: &str, v: &str) -> Vec<u8> {
    if let Some(slot) = base.pointer_mut(path) {
        *slot = serde_json::Value::String(v.to_string());
    }
    serde_json::to_vec(&base).expect("json")
}

/// Every message kprov builds around `v`, one per untrusted field.
fn messages(v: &str) -> Vec<String> {
    let mut out = Vec::new();
    // The lock: held by, and unreadable.
    let t = chrono::Utc::now();
    let record = LockRecord {
        holder: v.into(),
        host: v.into(),
        pid: 1,
        command: v.into(),
        acquired_at: t,
        renewed_at: t,
        expires_at: t,
        id: "ff".into(),
    };
    out.push(
        LockError::Held {
            cluster: "c".into(),
            record: Box::new(record),
        }
        .to_string(),
    );
    if let Err(reason) = LockRecord::parse(v.as_bytes()) {
        out.push(
            LockError::Corrupt {
                cluster: "c".into(),
                key: "c/lock".into(),
                reason,
            }
            .to_string(),
        );
    }
    // A backup record, each field in turn.
    let backup = serde_json::json!({
        "id": "20261122T213500Z", "key": "c/backups/etcd/20261122T213500Z.db",
        "sha256": "0".repeat(64), "size": 8, "host": "cp1",
        "takenAt": "2026-11-22T21:35:00Z", "etcd": "Stacked",
    });
    for field in ["/id", "/key", "/sha256", "/host", "/takenAt", "/etcd"] {
        let data = json_with(backup.clone(), field, v);
        if let Err(reason) = crate::ops::etcd::check_record(
            "c/backups/etcd/",
            "c/backups/etcd/20261122T213500Z.json",
            &data,
        ) {
            out.push(reason);
        }
    }
    // The rolling-update journal, each text field in turn, and raw bytes.
    let journal = serde_json::json!({
        "cluster": "c", "startedAt": "2026-11-22T21:00:00Z",
        "updatedAt": "2026-11-22T21:05:00Z", "startedBy": "a", "kubernetesVersion": "1.36.4",
        "cloudOnly": false, "finished": false, "leftAlone": ["x"],
        "nodes": [{"target": "w1", "nodeName": "w1", "group": "nodes",
                   "action": "reprovision", "batch": 0, "step": "drained", "stopped": "s"}],
    });
    let mut journals: Vec<Vec<u8>> = [
        "/cluster",
        "/startedAt",
        "/kubernetesVersion",
        "/leftAlone/0",
        "/nodes/0/target",
        "/nodes/0/nodeName",
        "/nodes/0/group",
        "/nodes/0/step",
        "/nodes/0/action",
    ]
    .iter()
    .map(|f| json_with(journal.clone(), f, v))
    .collect();
    journals.push(v.as_bytes().to_vec());
    for data in journals {
        if let Err(reason) = Journal::parse(&data, "c") {
            out.push(
                JournalError::Corrupt {
                    cluster: "c".into(),
                    key: "c/journal/rolling-update.json".into(),
                    reason,
                }
                .to_string(),
            );
        }
    }
    // A record of a provisioned host, each field in turn.
    let host = serde_json::json!({
        "name": "w1", "address": "198.18.0.11", "user": "debian", "keyPath": "k",
        "bastion": "b", "ip": "198.18.0.11", "roles": ["node"], "taints": ["a:NoSchedule"],
    });
    for field in [
        "/name",
        "/address",
        "/user",
        "/keyPath",
        "/bastion",
        "/ip",
        "/roles/0",
        "/taints/0",
    ] {
        if let Err(reason) =
            crate::ops::host_records::check_host_record("w1", &json_with(host.clone(), field, v))
        {
            out.push(reason);
        }
    }
    // The known host keys: the raw bytes, and a line whose name is them.
    for text in [v.to_string(), format!("{v} ssh-ed25519 AAAA\n")] {
        let (_, damaged) = crate::ssh::hostkeys::parse_checked(text.as_bytes());
        if !damaged.is_empty() {
            out.push(crate::ssh::hostkeys::damaged_message(
                "c/known_hosts",
                "c",
                &damaged,
            ));
        }
    }
    // Names in a spec (a group's name, quoted as YAML would), raw bytes in a spec file.
    let quoted = serde_json::to_string(v).expect("json");
    for text in [
        format!(
            "apiVersion: kprov.dev/v1alpha1\nkind: InstanceGroup\nmetadata:\n  name: {quoted}\n  \
             labels: {{kprov.dev/cluster: c}}\nspec:\n  role: Node\n  minSize: {quoted}\n"
        ),
        format!("apiVersion: kprov.dev/v1alpha1\nkind: {v}\n"),
    ] {
        if let Err(e) = crate::spec::load_objects("spec.yaml", &text) {
            out.push(e.to_string());
        }
    }
    // Names in inventories: kprov's YAML and Kubespray's INI.
    for text in [
        format!("hosts:\n- name: {quoted}\n  address: 198.18.0.1\n  roles: [node]\n"),
        format!("[all]\n{v} ansible_host=198.18.0.1\n[kube_node]\n{v}\n"),
    ] {
        if let Err(e) = crate::inventory::parse(&text, "hosts") {
            out.push(e.to_string());
        }
    }
    // A host's output: a failed step's stderr, ssh's messages, progress lines.
    out.push(
        ExecError::Step {
            host: "w1".into(),
            step: "s".into(),
            code: Some(1),
            stderr: v.into(),
        }
        .to_string(),
    );
    out.push(
        ExecError::Connect {
            host: "w1".into(),
            message: v.into(),
        }
        .to_string(),
    );
    out.push(
        crate::ssh::Event::StepFinished {
            host: "w1".into(),
            step: "s".into(),
            result: Err(v.into()),
            duration: std::time::Duration::ZERO,
            remote: None,
        }
        .to_string(),
    );
    out.push(format!(
        "w1: init FAILED: {}",
        crate::output::UntrustedText::new(v)
    ));
    // A cloud API's error: code, message and cause.
    out.extend(crate::cloud::aws::tests_support::cloud_errors(v));
    out
}

proptest! {
    #[test]
    fn no_untrusted_field_reaches_the_user_with_a_control_character(v in hostile()) {
        let (out, err) = (Buf::default(), Buf::default());
        let p = Printer::to_writers(Format::Table, Box::new(out.clone()), Box::new(err.clone()));
        for m in messages(&v) {
            // At the source: no unsafe character but kprov's own line breaks, and every line
            // after the first is one of kprov's indented continuation lines.
            prop_assert!(!m.chars().any(|c| is_unsafe(c) && c != '\n'), "{m:?}");
            prop_assert!(
                m.lines().skip(1).all(|l| l.is_empty() || l.starts_with(' ')),
                "a value started a line of its own: {m:?}"
            );
            p.error(&m);
            p.warn(&m);
            p.status(&m);
        }
        for stream in [&out, &err] {
            let text = String::from_utf8(stream.0.lock().expect("buffer").clone()).expect("utf-8");
            prop_assert!(!text.chars().any(|c| is_unsafe(c) && c != '\n'), "{text:?}");
        }
    }
}
