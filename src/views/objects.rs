//! The store's objects as `get`, `create -f`, `replace -f`, `lock` and `delete damaged`
//! print them.

use crate::ops::credentials::{RegistryStored, SecretEntry};
use crate::ops::damaged::DamagedPlan;
use crate::ops::locks::Broken;
use crate::ops::objects::{self, ClusterList, Written};
use crate::output::{Format, Printer, Table, plural, untrusted};
use crate::spec::{self, InstanceGroup, ObjectRef};
use crate::state::lock::LockRecord;

/// `get clusters`: the readable clusters' table, the unreadable and deleted ones named (`-o
/// yaml|json`: the objects as `create -f` takes them).
pub(crate) fn clusters(
    printer: &Printer,
    list: &ClusterList,
    full: bool,
    location: &str,
) -> anyhow::Result<()> {
    for u in &list.unreadable {
        printer.warn(&format!(
            "cluster {} is unreadable: {}{}",
            u.name,
            u.error,
            if u.delete_removes_it() {
                format!(
                    ". Fix it, or remove it with `kprov delete cluster {} --yes`",
                    u.name
                )
            } else {
                String::new()
            }
        ));
    }
    for n in &list.backups_only {
        printer.status(&format!(
            "cluster {n} was deleted; its etcd backups are kept: `kprov get backups {n}` lists them, `kprov delete cluster {n} --yes --delete-backups` deletes them"
        ));
    }
    if printer.format() != Format::Table {
        // -o yaml/json prints objects that `create -f` / `replace -f` accept as they are.
        return objects(printer, &list.objects(full));
    }
    if list.empty {
        printer.status(&format!("No clusters in {}.", location));
        return Ok(());
    }
    let mut t = Table::new([
        "NAME",
        "CLOUD",
        "ZONES",
        "VERSION",
        "CONTROL PLANES",
        "NODES",
    ]);
    for r in list.clusters.iter().map(objects::Listed::summary) {
        t.row([
            r.name,
            r.cloud,
            if r.zones.is_empty() {
                "-".into()
            } else {
                r.zones.join(",")
            },
            r.kubernetes_version,
            r.control_planes.to_string(),
            r.nodes.to_string(),
        ]);
    }
    for u in &list.unreadable {
        t.row([u.name.as_str(), "UNREADABLE", "-", "-", "-", "-"].map(String::from));
    }
    for n in &list.backups_only {
        t.row([n.as_str(), "DELETED (backups kept)", "-", "-", "-", "-"].map(String::from));
    }
    printer.data(&t.render());
    Ok(())
}

/// Objects as `create -f` / `replace -f` take them (`-o json`: a `List`, else YAML).
pub(crate) fn objects(printer: &Printer, objs: &[ObjectRef]) -> anyhow::Result<()> {
    objects_as(printer, objs, printer.format() == Format::Json)
}

/// Objects as YAML documents, or (`json`) one `List`, whatever the printer's format (`create
/// cluster --dry-run` has a format flag of its own).
pub(crate) fn objects_as(printer: &Printer, objs: &[ObjectRef], json: bool) -> anyhow::Result<()> {
    if json {
        let items: Vec<serde_json::Value> = objs
            .iter()
            .map(|o| match o {
                ObjectRef::Cluster(c) => serde_json::to_value(c),
                ObjectRef::InstanceGroup(g) => serde_json::to_value(g),
            })
            .collect::<Result<_, _>>()?;
        printer.data(&serde_json::to_string_pretty(
            &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}),
        )?);
    } else {
        printer.data(&spec::to_yaml_stream(objs.iter().copied())?);
    }
    Ok(())
}

/// `get instancegroups`: the table (`-o yaml|json`: the user's objects).
pub(crate) fn groups(
    printer: &Printer,
    user: &[InstanceGroup],
    groups: &[InstanceGroup],
) -> anyhow::Result<()> {
    if printer.format() != Format::Table {
        let objs: Vec<ObjectRef> = user.iter().map(ObjectRef::InstanceGroup).collect();
        return objects(printer, &objs);
    }
    let mut t = Table::new(["NAME", "ROLE", "MACHINETYPE", "MIN", "MAX", "SUBNETS"]);
    for g in groups {
        let s = &g.spec;
        t.row([
            g.metadata.name.clone(),
            s.role.as_str().to_string(),
            s.machine_type.clone().unwrap_or_else(|| "-".into()),
            s.min_size.map_or("-".into(), |n| n.to_string()),
            s.max_size.map_or("-".into(), |n| n.to_string()),
            if s.subnets.is_empty() {
                "-".into()
            } else {
                s.subnets.join(",")
            },
        ]);
    }
    printer.data(&t.render());
    Ok(())
}

/// `get secrets`: each secret by its digest, never its bytes.
pub(crate) fn secrets(printer: &Printer, rows: &[SecretEntry]) -> anyhow::Result<()> {
    let items: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let (kind, key, len, digest) = (r.kind, &r.name, r.bytes, &r.digest);
            if kind == "sshpublickey" {
                serde_json::json!({"type": kind, "name": key, "bytes": len, "fingerprint": digest})
            } else {
                serde_json::json!({"type": kind, "name": key, "bytes": len, "sha256": digest})
            }
        })
        .collect();
    printer.value(&serde_json::json!({ "items": items }), || {
        let mut t = Table::new(["TYPE", "NAME", "BYTES", "SHA256 / FINGERPRINT"]);
        for r in rows {
            t.row([
                r.kind.to_string(),
                untrusted(&r.name).to_string(),
                r.bytes.to_string(),
                r.digest.clone(),
            ]);
        }
        t
    })?;
    Ok(())
}

/// What `create -f` / `replace -f` wrote, as it writes it.
pub(crate) fn written(printer: &Printer, w: Written) {
    match w {
        Written::Pinned(n) => printer.status(&n),
        Written::ClusterCreated { name, groups } => printer.success(&format!(
            "Created cluster {name} with {}.",
            plural(groups, "instance group")
        )),
        Written::GroupCreated { cluster, group } => printer.success(&format!(
            "Created instance group {group} in cluster {cluster}."
        )),
        Written::ClusterReplaced {
            name,
            changed: true,
        } => printer.success(&format!("Replaced cluster {name}.")),
        Written::ClusterReplaced { name, .. } => {
            printer.status(&format!("Cluster {name} unchanged."))
        }
        Written::GroupReplaced {
            group,
            changed: false,
            ..
        } => printer.status(&format!("Instance group {group} unchanged.")),
        Written::GroupReplaced { group, existed, .. } => printer.success(&format!(
            "{} instance group {group}.",
            if existed { "Replaced" } else { "Created" }
        )),
    }
}

/// `lock status`: the lock's record, or that there is none.
pub(crate) fn lock_status(
    printer: &Printer,
    cluster: &str,
    status: Option<&LockRecord>,
) -> anyhow::Result<()> {
    match status {
        None => printer.data(&format!("cluster {cluster} is not locked")),
        Some(r) => printer.data(&serde_json::to_string_pretty(r)?),
    }
    Ok(())
}

/// `lock break`: what was removed.
pub(crate) fn lock_broken(printer: &Printer, cluster: &str, broken: Broken) {
    match broken {
        Broken::NotLocked => printer
            .status(&format!("cluster {cluster} was not locked")),
        Broken::Lock(r) => printer.success(&format!(
            "broke the lock of cluster {cluster} held by {}@{} running `{}`",
            untrusted(&r.holder),
            untrusted(&r.host),
            untrusted(&r.command)
        )),
        Broken::Unreadable => printer
            .success(&format!("removed the unreadable lock of cluster {cluster}")),
        Broken::Obstruction {
            what,
            location,
            removed,
        } => printer.success(&format!(
            "removed what sat at the lock {location} of cluster {cluster} ({what}; {removed} key{} deleted)",
            if removed == 1 { "" } else { "s" }
        )),
    }
}

/// `delete damaged` without a damaged record.
pub(crate) fn no_damaged(printer: &Printer, name: &str) {
    printer.status(&format!("cluster {name} has no damaged records"));
}

/// `delete damaged`'s preview: the damaged records.
pub(crate) fn damaged(printer: &Printer, name: &str, plan: &DamagedPlan) {
    let n = plan.found.len();
    printer.data(&format!(
        "Will remove {n} damaged record{} of cluster {name} (from known host keys only the \
         damaged lines):\n{}",
        if n == 1 { "" } else { "s" },
        plan.lines
            .iter()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    ));
    printer.status(&format!(
        "Run `kprov delete damaged {name} --yes` to remove them."
    ));
}

/// Which JSON schema `kprov schema` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Schema {
    Cluster,
    InstanceGroup,
    /// One schema for multi-document files holding either kind.
    All,
}

/// The JSON schema of the objects (`kprov schema`), for editors and CI checks.
pub(crate) fn schema(kind: Schema) -> anyhow::Result<String> {
    let cluster = schemars::schema_for!(spec::Cluster);
    let ig = schemars::schema_for!(InstanceGroup);
    let value = match kind {
        Schema::Cluster => serde_json::to_value(&cluster)?,
        Schema::InstanceGroup => serde_json::to_value(&ig)?,
        Schema::All => {
            // One schema for multi-document files holding either kind; `kind` picks the branch.
            let mut c = serde_json::to_value(&cluster)?;
            let mut g = serde_json::to_value(&ig)?;
            let mut defs = serde_json::Map::new();
            for v in [&mut c, &mut g] {
                if let Some(serde_json::Value::Object(d)) =
                    v.as_object_mut().and_then(|o| o.remove("$defs"))
                {
                    defs.extend(d);
                }
                if let Some(o) = v.as_object_mut() {
                    o.remove("$schema");
                }
            }
            for (v, k) in [
                (&mut c, spec::KIND_CLUSTER),
                (&mut g, spec::KIND_INSTANCE_GROUP),
            ] {
                if let Some(props) = v.get_mut("properties").and_then(|p| p.as_object_mut()) {
                    props.insert("kind".into(), serde_json::json!({"const": k}));
                    props.insert(
                        "apiVersion".into(),
                        serde_json::json!({"const": spec::API_VERSION}),
                    );
                }
            }
            serde_json::json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "title": "kprov objects",
                "oneOf": [c, g],
                "$defs": defs,
            })
        }
    };
    Ok(serde_json::to_string_pretty(&value)?)
}

/// `create registry-credentials`: where they are kept, and whether a mirror uses them.
pub(crate) fn registry_credentials(
    printer: &Printer,
    name: &str,
    host: &str,
    stored: &RegistryStored,
) {
    if !stored.used {
        printer.warn(&format!(
            "no mirror in spec.containerd.registries has host {host}: the credentials are kept \
             but not used until one does"
        ));
    }
    printer.success(&format!(
        "registry credentials for {host} stored in the secrets of {name} as {} ({}); \
         `kprov update cluster {name}` writes them to the nodes",
        stored.secret, stored.digest
    ));
}

/// `kprov version` (`-o json|yaml`: `{"kprov": VERSION}`).
pub(crate) fn version(printer: &Printer, version: &str) -> anyhow::Result<()> {
    if printer.format() == Format::Table {
        printer.data(&format!("kprov {version}"));
    } else {
        printer.value(&serde_json::json!({ "kprov": version }), || {
            Table::new(["VERSION"])
        })?;
    }
    Ok(())
}
