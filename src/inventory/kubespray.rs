//! Kubespray inventories, read as Ansible reads them, imported as kprov hosts and settings.
//!
//! Syntaxes: `inventory.ini` (values unquoted and typed as Ansible does: host lines are split
//! like a shell line, `#` starts a comment, every value goes through Python's literal rules,
//! see [`super::literal`]), YAML (`all:` with `hosts`/`children`/`vars`, or top-level groups
//! without `all:`), and Ansible's JSON script format (`_meta.hostvars`, groups with host
//! lists). `group_vars/` and `host_vars/` beside the inventory are read (files named after the
//! group or host with no extension, `.yml`, `.yaml` or `.json`, and directories of such files).
//!
//! Precedence is Ansible's default (`VARIABLE_PRECEDENCE`): group vars from the inventory file
//! (`all`, then the host's groups from parent to child, ties by name), then `group_vars/all`,
//! then `group_vars/<group>` in the same order, then the inventory's own host vars, then
//! `host_vars/<host>`. (`host_vars/` files beat inline host vars in Ansible; kprov follows it.)
//!
//! Groups map to roles: `kube_control_plane` (old names `kube-master`, `kube-controlplane`)
//! → control-plane, `kube_node` (`kube-node`) → node, `etcd` → etcd; the hosts of an old
//! group name are in the new group too, as Kubespray's playbooks put them there, so
//! `group_vars/k8s_cluster/` applies to `[k8s-cluster:children]`. A `bastion` group's
//! host becomes every host's jump host, as Kubespray uses it. The variables kprov honours are
//! listed in [`HOST_VARS`] and [`CLUSTER_VARS`]; every other variable is reported as unused
//! with its file and line, never dropped silently.
//!
//! Caveats: Jinja templates (`{{ ... }}`) are not evaluated: a templated value in a variable
//! kprov uses is an error; elsewhere it is only listed as unused. Host ranges (`node[1:3]`)
//! are refused. In `[group:vars]` lines an unquoted value followed by ` # text` loses the
//! comment (Ansible would keep it in the value, which nobody means).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_saphyr::Spanned;

use super::{
    At, ClusterSettings, Format, Inventory, InventoryError, Located, Mapped, Problem, Unused,
    literal, read_bounded, yaml_error,
};
use crate::spec::{Cni, Host, HostRole, ProxyMode};

const CONTROL_PLANE_GROUPS: &[&str] = &["kube_control_plane", "kube-master", "kube-controlplane"];
const NODE_GROUPS: &[&str] = &["kube_node", "kube-node"];
const ETCD_GROUPS: &[&str] = &["etcd"];
const BASTION_GROUP: &str = "bastion";
/// Kubespray's old group names and the groups its playbooks put their hosts in
/// (`group_by` in `playbooks/boilerplate.yml`): an inventory that still says
/// `[k8s-cluster:children]` gets `group_vars/k8s_cluster/` as it does in Kubespray.
const LEGACY_GROUPS: &[(&str, &str)] = &[
    ("kube-master", "kube_control_plane"),
    ("kube-node", "kube_node"),
    ("k8s-cluster", "k8s_cluster"),
    ("calico-rr", "calico_rr"),
];
/// Groups nest at most this deep (Ansible has no limit; a hostile file must not recurse forever).
const MAX_GROUP_DEPTH: usize = 64;

/// Per-host variables kprov honours.
pub(crate) const HOST_VARS: &[&str] = &[
    "ansible_host",
    "ansible_ssh_host",
    "ansible_port",
    "ansible_ssh_port",
    "ansible_user",
    "ansible_ssh_user",
    "ansible_ssh_private_key_file",
    "ansible_private_key_file",
    "ansible_ssh_common_args",
    "ansible_become",
    "ansible_become_user",
    "ansible_connection",
    "ip",
    "access_ip",
    "node_labels",
    "node_taints",
];

/// Cluster-wide variables kprov honours (they must agree on every host).
pub(crate) const CLUSTER_VARS: &[&str] = &[
    "kube_version",
    "kube_network_plugin",
    "container_manager",
    "kube_pods_subnet",
    "kube_service_addresses",
    "cluster_name",
    "kube_proxy_mode",
    "kube_proxy_conntrack_max_per_core",
    "loadbalancer_apiserver",
    "apiserver_loadbalancer_domain_name",
    "supplementary_addresses_in_ssl_keys",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "additional_no_proxy",
    "containerd_registries_mirrors",
    "docker_insecure_registries",
    "docker_registry_mirrors",
];

/// A variable's value and where it was set.
#[derive(Debug, Clone)]
pub(crate) struct Var {
    value: Value,
    at: At,
}

type Vars = BTreeMap<String, Var>;

/// What every syntax reduces to before hosts are built.
#[derive(Default)]
struct Raw {
    /// Host names in order of first appearance, with that line.
    order: Vec<(String, usize)>,
    host_vars: BTreeMap<String, Vars>,
    host_file_vars: BTreeMap<String, Vars>,
    groups: BTreeMap<String, Group>,
    /// Every variable definition in the order read, for the unused-variable report.
    defs: Vec<(String, At)>,
    /// Files kprov could not read as data (ansible-vault), reported with the unused variables.
    skipped: Vec<Unused>,
    notes: Vec<String>,
    /// Problems found while reading (a bad INI line, a vars file that is not YAML).
    problems: Vec<Problem>,
}

#[derive(Default)]
struct Group {
    hosts: Vec<String>,
    children: Vec<String>,
    vars: Vars,
    file_vars: Vars,
}

impl Raw {
    fn group(&mut self, name: &str) -> &mut Group {
        self.groups.entry(name.to_string()).or_default()
    }

    fn add_child(&mut self, parent: &str, child: &str) {
        self.group(child);
        let g = self.group(parent);
        if !g.children.iter().any(|c| c == child) {
            g.children.push(child.to_string());
        }
    }

    fn set_group_var(&mut self, group: &str, name: String, value: Value, at: At) {
        self.defs.push((name.clone(), at.clone()));
        self.group(group).vars.insert(name, Var { value, at });
    }

    fn add_host(&mut self, group: &str, name: &str, line: usize, vars: Vec<(String, Var)>) {
        if !self.host_vars.contains_key(name) {
            self.order.push((name.to_string(), line));
        }
        let own = self.host_vars.entry(name.to_string()).or_default();
        for (k, v) in vars {
            self.defs.push((k.clone(), v.at.clone()));
            if let Some(old) = own.get(&k)
                && old.value != v.value
            {
                // Ansible keeps the last definition; say so, it is rarely what was meant.
                self.notes.push(format!(
                    "{}: host {name:?}: {k} is set again ({} replaces {} from line {}), as \
                     Ansible does",
                    v.at, v.value, old.value, old.at.line
                ));
            }
            own.insert(k, v);
        }
        let g = self.group(group);
        if !g.hosts.iter().any(|h| h == name) {
            g.hosts.push(name.to_string());
        }
    }

    /// Every host of `group`, following `children` (cycles are cut).
    fn members(&self, group: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let mut seen = BTreeSet::new();
        let mut stack = vec![group.to_string()];
        while let Some(g) = stack.pop() {
            if !seen.insert(g.clone()) {
                continue;
            }
            if let Some(group) = self.groups.get(&g) {
                out.extend(group.hosts.iter().cloned());
                stack.extend(group.children.iter().cloned());
            }
        }
        out
    }

    /// Ansible's group depth: `all` is 0, a child is one deeper than its deepest parent.
    fn depths(&self) -> BTreeMap<String, usize> {
        let mut depth: BTreeMap<String, usize> =
            self.groups.keys().map(|g| (g.clone(), 1)).collect();
        depth.insert("all".into(), 0);
        // Relaxation, bounded: a cycle cannot make it loop forever.
        for _ in 0..self.groups.len().min(MAX_GROUP_DEPTH) {
            let mut changed = false;
            for (name, g) in &self.groups {
                let d = depth.get(name).copied().unwrap_or(1);
                for c in &g.children {
                    if c != "all" && depth.get(c).copied().unwrap_or(1) < d + 1 {
                        depth.insert(c.clone(), d + 1);
                        changed = true;
                    }
                }
            }
            if !changed {
                break;
            }
        }
        depth
    }

    /// Puts the hosts of Kubespray's old group names in the new groups too, as Kubespray's
    /// playbooks do before anything else (a `group_by` on the old group: the new group is a
    /// top-level group of its own, so its `group_vars/` file applies as in Kubespray).
    fn add_legacy_groups(&mut self) {
        for (old, new) in LEGACY_GROUPS {
            if !self.groups.contains_key(*old) {
                continue;
            }
            let members = self.members(old);
            self.add_child("all", new);
            let g = self.group(new);
            for h in members {
                if !g.hosts.contains(&h) {
                    g.hosts.push(h);
                }
            }
        }
    }

    /// Reads `group_vars/` and `host_vars/` in `dir`, for the groups and hosts the inventory
    /// has; a file that cannot be read is a problem, the others are still read.
    fn read_var_dirs(&mut self, dir: &Path) {
        let groups: Vec<String> = self.groups.keys().cloned().collect();
        for g in groups {
            match read_vars_for(
                &dir.join("group_vars"),
                &g,
                &mut self.defs,
                &mut self.skipped,
            ) {
                Ok(vars) => self.group(&g).file_vars = vars,
                Err(e) => self.problems.extend(e.into_problems()),
            }
        }
        let hosts: Vec<String> = self.order.iter().map(|(h, _)| h.clone()).collect();
        for h in hosts {
            match read_vars_for(
                &dir.join("host_vars"),
                &h,
                &mut self.defs,
                &mut self.skipped,
            ) {
                Ok(vars) if !vars.is_empty() => {
                    self.host_file_vars.insert(h, vars);
                }
                Ok(_) => {}
                Err(e) => self.problems.extend(e.into_problems()),
            }
        }
    }

    /// The variables of one host, merged in Ansible's order.
    fn effective(&self, host: &str, sorted_groups: &[(usize, String, BTreeSet<String>)]) -> Vars {
        let mut vars = Vars::new();
        let mine: Vec<&String> = sorted_groups
            .iter()
            .filter(|(_, g, m)| g != "all" && m.contains(host))
            .map(|(_, g, _)| g)
            .collect();
        let all = self.groups.get("all");
        if let Some(a) = all {
            vars.extend(a.vars.clone());
        }
        for g in &mine {
            if let Some(g) = self.groups.get(g.as_str()) {
                vars.extend(g.vars.clone());
            }
        }
        if let Some(a) = all {
            vars.extend(a.file_vars.clone());
        }
        for g in &mine {
            if let Some(g) = self.groups.get(g.as_str()) {
                vars.extend(g.file_vars.clone());
            }
        }
        if let Some(own) = self.host_vars.get(host) {
            vars.extend(own.clone());
        }
        if let Some(own) = self.host_file_vars.get(host) {
            vars.extend(own.clone());
        }
        vars
    }

    fn finish(self, file: &str, format: Format) -> Result<Inventory, InventoryError> {
        let in_any = |names: &[&str]| -> BTreeSet<String> {
            names.iter().flat_map(|g| self.members(g)).collect()
        };
        let control_planes = in_any(CONTROL_PLANE_GROUPS);
        let nodes = in_any(NODE_GROUPS);
        let etcd = in_any(ETCD_GROUPS);
        let bastions = self.members(BASTION_GROUP);
        let depths = self.depths();
        let mut sorted: Vec<(usize, String, BTreeSet<String>)> = self
            .groups
            .keys()
            .map(|g| {
                (
                    depths.get(g).copied().unwrap_or(1),
                    g.clone(),
                    self.members(g),
                )
            })
            .collect();
        sorted.sort();
        let mut notes = self.notes.clone();
        let mut problems = self.problems.clone();
        let mut mapped = Vec::new();
        let mut jump = None;
        if bastions.len() > 1 {
            problems.push(Problem {
                file: Some(file.to_string()),
                line: bastions.iter().map(|b| self.line_of(b)).max(),
                host: None,
                message: format!(
                    "the bastion group lists {} hosts ({}); kprov uses a single jump host",
                    bastions.len(),
                    bastions.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            });
        }
        if let Some(b) = bastions.iter().next() {
            let line = self.line_of(b);
            let (h, _) = build_host(b, &self.effective(b, &sorted), file, line, &mut problems);
            let mut spec = h.address.clone();
            if let Some(user) = &h.user {
                spec = format!("{user}@{spec}");
            }
            if let Some(port) = h.port {
                spec = format!("{spec}:{port}");
            }
            notes.push(format!(
                "{file}:{line}: host {b:?} (bastion group) is the jump host {spec} of every host; \
                 it is not part of the cluster"
            ));
            jump = Some(spec);
        }
        if self.order.iter().all(|(n, _)| bastions.contains(n)) {
            if !problems.is_empty() {
                // The lines that did not parse are why there is no host: they are the news.
                return Err(InventoryError::Invalid {
                    file: file.to_string(),
                    problems,
                });
            }
            return Err(InventoryError::Format {
                file: file.to_string(),
                message: "the inventory lists no hosts (is every line commented out? Kubespray's \
                          sample inventory is: uncomment the hosts and their groups)"
                    .into(),
            });
        }
        let mut out = Vec::new();
        let mut effective_of = Vec::new();
        for (name, line) in &self.order {
            if bastions.contains(name) {
                continue;
            }
            let in_cluster =
                control_planes.contains(name) || nodes.contains(name) || etcd.contains(name);
            if !in_cluster {
                // Kubespray's playbooks run on its groups only: a host in none of them (a
                // `localhost ansible_connection=local` line, a `[gluster]` host) is not part of
                // the cluster, and kprov leaves it out the same way.
                let groups: Vec<&str> = sorted
                    .iter()
                    .filter(|(_, g, m)| g != "all" && g != "ungrouped" && m.contains(name))
                    .map(|(_, g, _)| g.as_str())
                    .collect();
                notes.push(format!(
                    "{file}:{line}: host {name:?} is in no Kubespray cluster group \
                     (kube_control_plane, kube_node, etcd){}: not part of the cluster, as in \
                     Kubespray",
                    if groups.is_empty() {
                        String::new()
                    } else {
                        format!("; its groups: {}", groups.join(", "))
                    }
                ));
                continue;
            }
            let vars = self.effective(name, &sorted);
            let (mut host, host_notes) = build_host(name, &vars, file, *line, &mut problems);
            notes.extend(host_notes);
            if control_planes.contains(name) {
                host.roles.push(HostRole::ControlPlane);
            }
            if nodes.contains(name) {
                host.roles.push(HostRole::Node);
            }
            if etcd.contains(name) {
                host.roles.push(HostRole::Etcd);
            }
            if host.bastion.is_none() {
                host.bastion = jump.clone();
            }
            effective_of.push((name.clone(), vars));
            out.push(Located { host, line: *line });
        }
        notes.extend(public_without_ip(file, &out));
        let with_password: Vec<&str> = effective_of
            .iter()
            .filter(|(_, vars)| {
                ["ansible_password", "ansible_ssh_pass"]
                    .iter()
                    .any(|v| vars.contains_key(*v))
            })
            .map(|(name, _)| name.as_str())
            .collect();
        if !with_password.is_empty() {
            // The value is a secret: named, never shown.
            notes.push(format!(
                "{file}: ansible_password is set for {}: kprov logs in with keys only (your ssh \
                 agent, ~/.ssh/config, ansible_ssh_private_key_file) and does not use it; the \
                 host must accept your key",
                with_password.join(", ")
            ));
        }
        let settings = cluster_settings(&effective_of, &mut mapped, &mut notes, &mut problems);
        // Settings that change what the cluster does: honoured (mapped above) or refused at
        // their line; never a line lost in the unused-variable warning.
        let mut refused: BTreeSet<(String, At)> = BTreeSet::new();
        for (_, vars) in &effective_of {
            for (name, var) in vars {
                if refused.contains(&(name.clone(), var.at.clone())) {
                    continue;
                }
                if let Some(why) = refusal(name, &var.value) {
                    refused.insert((name.clone(), var.at.clone()));
                    problems.push(Problem::located(&var.at, format!("{name}: {why}")));
                }
            }
        }
        let mut unused: Vec<Unused> = self.skipped;
        let mut seen = BTreeSet::new();
        for (name, at) in self.defs {
            if HOST_VARS.contains(&name.as_str())
                || CLUSTER_VARS.contains(&name.as_str())
                || refused.contains(&(name.clone(), at.clone()))
            {
                continue;
            }
            if seen.insert((name.clone(), at.clone())) {
                unused.push(Unused {
                    var: name,
                    at,
                    why: None,
                });
            }
        }
        Ok(Inventory {
            file: file.to_string(),
            format,
            hosts: out,
            settings,
            mapped,
            unused,
            notes,
            problems,
        })
    }

    fn line_of(&self, name: &str) -> usize {
        self.order
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, l)| *l)
            .unwrap_or(0)
    }
}

/// A note naming the hosts without `ip` whose address is a public IPv4 address. Kubespray binds
/// such a host to the address of its default route (`ansible_default_ipv4`, a fact it gathers);
/// kprov binds it to the address it reaches it at, which a cloud's NAT keeps off the host.
fn public_without_ip(file: &str, hosts: &[Located]) -> Option<String> {
    let public: Vec<String> = hosts
        .iter()
        .filter(|l| l.host.ip.is_none())
        .filter(|l| {
            l.host
                .address
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(is_public)
        })
        .map(|l| format!("{} ({}, line {})", l.host.name, l.host.address, l.line))
        .collect();
    if public.is_empty() {
        return None;
    }
    Some(format!(
        "{file}: no ip for {}: Kubernetes binds to these public addresses; Kubespray would bind \
         to the address of each host's default route, which differs behind NAT (a cloud's public \
         address is not on the host): set ip to the host's own address if so",
        public.join(", ")
    ))
}

/// Not private, loopback, link-local, shared (100.64.0.0/10), benchmarking (198.18.0.0/15),
/// documentation, multicast or reserved.
fn is_public(a: std::net::Ipv4Addr) -> bool {
    let [o0, o1, o2, _] = a.octets();
    !(a.is_private()
        || a.is_loopback()
        || a.is_link_local()
        || a.is_unspecified()
        || a.is_broadcast()
        || a.is_documentation()
        || a.is_multicast()
        || o0 == 0
        || o0 >= 240
        || (o0 == 100 && (64..128).contains(&o1))
        || (o0 == 198 && (o1 == 18 || o1 == 19))
        || (o0 == 192 && o1 == 0 && o2 == 0))
}

fn bad(at: &At, message: String) -> InventoryError {
    InventoryError::Syntax {
        file: at.file.clone(),
        line: at.line,
        column: 0,
        message,
    }
}

/// The text of a scalar variable; a template or a structure is an error at its line.
fn text_of(name: &str, var: &Var, who: &str) -> Result<String, InventoryError> {
    let s = match &var.value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => {
            return Err(bad(
                &var.at,
                format!("{who}{name}: expected a single value"),
            ));
        }
    };
    if s.contains("{{") || s.contains("{%") {
        return Err(bad(
            &var.at,
            format!(
                "{who}{name}: {s:?} is a Jinja template; kprov does not evaluate templates, \
                 write the value itself"
            ),
        ));
    }
    Ok(s)
}

/// Ansible's `boolean()`.
fn truthy(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => n.as_i64().map(|n| n != 0),
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "yes" | "on" | "1" | "true" | "y" | "t" => Some(true),
            "no" | "off" | "0" | "false" | "n" | "f" | "" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// A dict or list that INI or a quoted YAML string carries as Python literal text.
fn structured(var: &Var) -> Value {
    match &var.value {
        Value::String(s) if s.trim_start().starts_with(['{', '[', '(']) => {
            literal::parse(s).unwrap_or_else(|| var.value.clone())
        }
        v => v.clone(),
    }
}

/// Builds a host from its variables; a variable kprov cannot use is a problem at its line
/// (pushed to `problems`) and the host is built without it, so every problem of an
/// inventory shows in one run.
fn build_host(
    name: &str,
    vars: &Vars,
    file: &str,
    line: usize,
    problems: &mut Vec<Problem>,
) -> (Host, Vec<String>) {
    let who = format!("host {name:?}: ");
    let mut notes = Vec::new();
    let mut fail = |e: InventoryError| problems.extend(e.into_problems());
    let text = |var: &str, fail: &mut dyn FnMut(InventoryError)| -> Option<String> {
        match vars.get(var) {
            None => None,
            Some(Var {
                value: Value::Null, ..
            }) => None,
            Some(v) => text_of(var, v, &who).map_err(fail).ok(),
        }
    };
    // Ansible before 2.0 spelled these ansible_ssh_*; old Kubespray inventories still do.
    let either = |new: &str, old: &str, fail: &mut dyn FnMut(InventoryError)| {
        text(new, fail).or_else(|| text(old, fail))
    };
    let port = match either("ansible_port", "ansible_ssh_port", &mut fail) {
        None => None,
        Some(p) => {
            let at = vars
                .get("ansible_port")
                .or(vars.get("ansible_ssh_port"))
                .map(|v| v.at.clone())
                .unwrap_or(At {
                    file: file.into(),
                    line,
                });
            p.parse::<u16>()
                .map_err(|_| {
                    fail(bad(
                        &at,
                        format!("{who}ansible_port: {p:?} is not a port number"),
                    ))
                })
                .ok()
        }
    };
    let labels = match vars.get("node_labels") {
        None => BTreeMap::new(),
        Some(v) => match structured(v) {
            Value::Null => BTreeMap::new(),
            Value::Object(map) => {
                let mut labels = BTreeMap::new();
                for (k, val) in &map {
                    match val {
                        Value::String(s) => {
                            labels.insert(k.clone(), s.clone());
                        }
                        Value::Number(_) | Value::Bool(_) => {
                            labels.insert(k.clone(), val.to_string());
                        }
                        _ => fail(bad(
                            &v.at,
                            format!("{who}node_labels: label {k:?} must be a string"),
                        )),
                    }
                }
                labels
            }
            other => {
                fail(bad(
                    &v.at,
                    format!(
                        "{who}node_labels: expected a mapping such as {{'disk': 'ssd'}}, got {other}"
                    ),
                ));
                BTreeMap::new()
            }
        },
    };
    let taints = match vars.get("node_taints") {
        None => vec![],
        Some(v) => match structured(v) {
            Value::Null => vec![],
            Value::Array(items) => {
                let mut taints = vec![];
                for i in &items {
                    match i {
                        Value::String(s) => taints.push(s.clone()),
                        _ => fail(bad(
                            &v.at,
                            format!("{who}node_taints: taints must be strings"),
                        )),
                    }
                }
                taints
            }
            other => {
                fail(bad(
                    &v.at,
                    format!(
                        "{who}node_taints: expected a list such as ['key=value:NoSchedule'], got {other}"
                    ),
                ));
                vec![]
            }
        },
    };
    let mut address = either("ansible_host", "ansible_ssh_host", &mut fail);
    if let Some(v) = vars.get("ansible_connection") {
        match text_of("ansible_connection", v, &who)
            .map_err(&mut fail)
            .ok()
            .as_deref()
        {
            None | Some("ssh" | "smart" | "paramiko" | "paramiko_ssh") => {}
            Some("local") => {
                if address.is_none() {
                    address = Some("127.0.0.1".into());
                }
                notes.push(format!(
                    "{}:{}: host {name:?}: ansible_connection=local: kprov reaches every host \
                     over ssh, this one at {}; this machine must run sshd and accept your key",
                    v.at.file,
                    v.at.line,
                    address.as_deref().unwrap_or_default() // set to 127.0.0.1 just above when absent
                ));
            }
            Some(other) => fail(bad(
                &v.at,
                format!(
                    "{who}ansible_connection={other} is not supported: kprov reaches hosts \
                     over ssh (ssh or local)"
                ),
            )),
        }
    }
    let become_ = match vars.get("ansible_become") {
        None => None,
        Some(v) => {
            let b = truthy(&v.value);
            if b.is_none() {
                fail(bad(
                    &v.at,
                    format!("{who}ansible_become: {} is not a boolean", v.value),
                ));
            }
            b
        }
    };
    if let Some(v) = vars.get("ansible_become_user")
        && let Ok(u) = text_of("ansible_become_user", v, &who).map_err(&mut fail)
        && u != "root"
    {
        fail(bad(
            &v.at,
            format!(
                "{who}ansible_become_user={u} is not supported: kprov runs every step as \
                 root (through sudo -n when the ssh user is not root)"
            ),
        ));
    }
    let user = either("ansible_user", "ansible_ssh_user", &mut fail);
    if become_ == Some(false)
        && let Some(user) = user.as_deref().filter(|u| *u != "root")
        && let Some(v) = vars.get("ansible_become")
    {
        notes.push(format!(
            "{}:{}: host {name:?}: ansible_become is false, but kprov needs root: it runs its \
             steps through sudo -n as {user}",
            v.at.file, v.at.line,
        ));
    }
    let mut bastion = None;
    if let Some(v) = vars.get("ansible_ssh_common_args")
        && let Ok(args) = text_of("ansible_ssh_common_args", v, &who).map_err(&mut fail)
    {
        match proxy_of(&args) {
            Err(e) => fail(bad(&v.at, format!("{who}ansible_ssh_common_args: {e}"))),
            Ok((jump, extra)) => {
                bastion = jump;
                if !extra.is_empty() {
                    notes.push(format!(
                        "{}:{}: host {name:?}: ansible_ssh_common_args: kprov does not pass {} \
                         to ssh (it keeps strict host keys in the state store and uses your key \
                         and agent)",
                        v.at.file,
                        v.at.line,
                        extra.join(" ")
                    ));
                }
            }
        }
    }
    let ip = text("ip", &mut fail);
    let access_ip = text("access_ip", &mut fail);
    let key_path = either(
        "ansible_ssh_private_key_file",
        "ansible_private_key_file",
        &mut fail,
    );
    let host = Host {
        name: name.to_string(),
        address: address.unwrap_or_else(|| name.to_string()),
        ip,
        access_ip,
        user,
        port,
        key_path,
        bastion,
        roles: vec![],
        labels,
        taints,
    };
    (host, notes)
}

/// The jump host in `ansible_ssh_common_args` (`-o ProxyCommand="ssh -W %h:%p user@host"`,
/// `-o ProxyJump=...`, `-J ...`) as `[user@]host[:port]`, and the arguments kprov does not use.
pub(crate) fn proxy_of(args: &str) -> Result<(Option<String>, Vec<String>), String> {
    let words = split_words(args)?;
    let mut jump = None;
    let mut extra = Vec::new();
    let mut it = words.into_iter();
    while let Some(w) = it.next() {
        let option = if w == "-o" {
            it.next().ok_or("-o without an option")?
        } else if let Some(o) = w.strip_prefix("-o") {
            o.to_string()
        } else if w == "-J" {
            format!("ProxyJump={}", it.next().ok_or("-J without a host")?)
        } else if let Some(j) = w.strip_prefix("-J") {
            format!("ProxyJump={j}")
        } else {
            extra.push(w);
            continue;
        };
        let (key, value) = option
            .split_once('=')
            .or_else(|| option.split_once(' '))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .unwrap_or((option.clone(), String::new()));
        match key.to_ascii_lowercase().as_str() {
            "proxyjump" => {
                if value.contains(',') {
                    return Err(format!(
                        "ProxyJump {value:?} chains jump hosts; kprov supports one"
                    ));
                }
                jump = Some(value.trim_start_matches("ssh://").to_string());
            }
            "proxycommand" => jump = Some(jump_of_proxy_command(&value)?),
            _ => extra.push(format!("-o {option}")),
        }
    }
    Ok((jump, extra))
}

fn jump_of_proxy_command(cmd: &str) -> Result<String, String> {
    let words = split_words(cmd)?;
    let unsupported = || {
        format!(
            "ProxyCommand {cmd:?} is not of the form `ssh -W %h:%p [-p PORT] [-l USER] \
             [user@]HOST`; write the jump host with ProxyJump"
        )
    };
    let mut it = words.into_iter();
    if it.next().as_deref() != Some("ssh") {
        return Err(unsupported());
    }
    let (mut user, mut port, mut dest, mut forwards) = (None, None, None, false);
    while let Some(w) = it.next() {
        match w.as_str() {
            "-W" => forwards = it.next().as_deref() == Some("%h:%p"),
            "-p" => port = it.next(),
            "-l" => user = it.next(),
            // Options that do not change where the jump goes; kprov keeps its own host keys.
            "-o" | "-i" | "-F" => {
                it.next();
            }
            "-q" | "-A" | "-T" | "-N" | "-4" | "-6" | "-C" | "-v" => {}
            w if w.starts_with('-') => return Err(unsupported()),
            w => {
                if dest.replace(w.to_string()).is_some() {
                    return Err(unsupported());
                }
            }
        }
    }
    let dest = dest.filter(|_| forwards).ok_or_else(unsupported)?;
    let mut spec = match (user, dest.contains('@')) {
        (Some(u), false) => format!("{u}@{dest}"),
        _ => dest,
    };
    if let Some(p) = port {
        if p.parse::<u16>().is_err() {
            return Err(format!("ProxyCommand port {p:?} is not a port number"));
        }
        spec = format!("{spec}:{p}");
    }
    Ok(spec)
}

/// Kubespray's add-on switches (`addons.yml`, `k8s-cluster.yml`) for what kprov does not
/// deploy: switched on, the cluster would lack it; refused at their line.
const ADDONS: &[(&str, &str)] = &[
    ("helm_enabled", "Helm"),
    ("registry_enabled", "an in-cluster registry"),
    ("metrics_server_enabled", "metrics-server"),
    (
        "local_path_provisioner_enabled",
        "the local-path provisioner",
    ),
    (
        "local_volume_provisioner_enabled",
        "the local volume provisioner",
    ),
    ("cephfs_provisioner_enabled", "the CephFS provisioner"),
    ("rbd_provisioner_enabled", "the RBD provisioner"),
    ("gateway_api_enabled", "the Gateway API CRDs"),
    ("ingress_nginx_enabled", "ingress-nginx"),
    ("ingress_alb_enabled", "the ALB ingress controller"),
    ("cert_manager_enabled", "cert-manager"),
    ("argocd_enabled", "Argo CD"),
    ("node_feature_discovery_enabled", "node-feature-discovery"),
    ("dashboard_enabled", "the Kubernetes dashboard"),
    (
        "nvidia_accelerator_enabled",
        "NVIDIA's GPU drivers and device plugin",
    ),
    ("deploy_netchecker", "netchecker"),
];

/// Why kprov refuses a behaviour-changing Kubespray setting with this value, if it does.
/// Values that ask for nothing (`false`, `""`, `[]`) are harmless and stay among the unused
/// variables; a value that asks for something kprov does not do is refused at its line.
pub(crate) fn refusal(name: &str, value: &Value) -> Option<String> {
    let empty = match value {
        Value::Null => true,
        Value::String(s) => s.trim().is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    };
    let on = truthy(value) == Some(true);
    let off = truthy(value) == Some(false);
    let why = match name {
        "containerd_registry_auth" if !empty => {
            "registry passwords are not kept in the spec: store each one in the cluster's \
             secrets with `kprov create registry-credentials NAME --host HOST --username USER` \
             (password on standard input) and remove it here"
        }
        "containerd_registries" | "containerd_insecure_registries" if !empty => {
            "the old registry settings are not supported: write the mirrors as \
             containerd_registries_mirrors (prefix, mirrors: host, capabilities, skip_verify, \
             override_path), which kprov maps to spec.containerd.registries"
        }
        "kube_encrypt_secret_data" if on => {
            "encrypting Secrets at rest is not supported yet: kprov's API server would keep them \
             unencrypted in etcd; set it to false to accept that"
        }
        "kubernetes_audit" if on => {
            "API server audit logging is not supported yet: kprov's API server would write no \
             audit log; set it to false to accept that"
        }
        "metallb_enabled" if on => {
            "kprov does not deploy MetalLB: Services of type LoadBalancer would stay pending; \
             deploy it yourself after the cluster is up and set this to false"
        }
        "kube_vip_enabled" if on => {
            "kprov does not deploy kube-vip: the API virtual IP (kube_vip_address) would not \
             exist; run your own VIP or load balancer and name it in loadbalancer_apiserver, or \
             set this to false to use kprov's local API proxy on every node"
        }
        "upstream_dns_servers" if !empty => {
            "CoreDNS upstream servers are not configurable yet: kprov's CoreDNS forwards to each \
             node's /etc/resolv.conf; put the servers there and remove this"
        }
        "kube_proxy_strict_arp" if on => {
            "kube-proxy's strictARP (ipvs mode; MetalLB's layer 2 needs it) is not configurable \
             yet: kube-proxy would answer ARP for every Service address; set it to false to \
             accept that"
        }
        _ if on && ADDONS.iter().any(|(flag, _)| *flag == name) => {
            let what = ADDONS
                .iter()
                .find(|(flag, _)| *flag == name)
                .map_or("", |(_, what)| *what);
            return Some(format!(
                "kprov does not deploy {what}: the cluster would come up without it; deploy it \
                 yourself after the cluster is up and set this to false"
            ));
        }
        "kubelet_fail_swap_on" if off => {
            "a kubelet running with swap on is not supported yet: kprov turns swap off on every \
             host (swapoff -a) and keeps the kubelet's failSwapOn; remove this to accept that"
        }
        _ => return None,
    };
    Some(why.to_string())
}

/// The cluster-wide variables, which must agree on every host; a value kprov cannot use is a
/// problem at its line.
fn cluster_settings(
    hosts: &[(String, Vars)],
    mapped: &mut Vec<Mapped>,
    notes: &mut Vec<String>,
    problems: &mut Vec<Problem>,
) -> ClusterSettings {
    let mut fail = |e: InventoryError| problems.extend(e.into_problems());
    let mut one: BTreeMap<&str, Var> = BTreeMap::new();
    for name in CLUSTER_VARS {
        let mut first: Option<(&str, &Var)> = None;
        let mut differs = false;
        for (host, vars) in hosts {
            let Some(v) = vars.get(*name) else { continue };
            match first {
                None => first = Some((host, v)),
                Some((h0, v0)) if v0.value != v.value && !differs => {
                    differs = true;
                    fail(bad(
                        &v.at,
                        format!(
                            "{name} is {} for host {host:?} but {} for host {h0:?} ({}): a \
                             cluster-wide setting must be the same on every host",
                            v.value, v0.value, v0.at
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        if let Some((_, v)) = first
            && !differs
        {
            one.insert(name, v.clone());
        }
    }
    let mut s = ClusterSettings::default();
    let mut map = |var: &str, at: &At, field: &str, value: String| {
        mapped.push(Mapped {
            var: var.to_string(),
            at: at.clone(),
            field: field.to_string(),
            value,
        });
    };
    let mut text = |name: &str, v: &Var| text_of(name, v, "").map_err(&mut fail).ok();
    if let Some(v) = one.get("kube_version")
        && let Some(t) = text("kube_version", v)
    {
        let t = t.strip_prefix('v').unwrap_or(&t).to_string();
        map("kube_version", &v.at, "spec.kubernetesVersion", t.clone());
        s.kubernetes_version = Some((t, v.at.clone()));
    }
    let mut refuse: Vec<(At, String)> = Vec::new();
    if let Some(v) = one.get("kube_network_plugin")
        && let Some(t) = text("kube_network_plugin", v)
    {
        let cni = match t.as_str() {
            "calico" => Some(Cni::Calico),
            "cilium" => Some(Cni::Cilium),
            "flannel" => Some(Cni::Flannel),
            "cni" => Some(Cni::None),
            other => {
                refuse.push((
                    v.at.clone(),
                    format!(
                        "kube_network_plugin: {other:?} is not supported by kprov (calico, \
                         cilium, flannel, or cni to install your own)"
                    ),
                ));
                None
            }
        };
        if let Some(cni) = cni {
            map(
                "kube_network_plugin",
                &v.at,
                "spec.networking.cni",
                cni.as_str().to_string(),
            );
            s.cni = Some((cni, v.at.clone()));
        }
    }
    if let Some(v) = one.get("container_manager")
        && let Some(t) = text("container_manager", v)
    {
        match t.as_str() {
            "containerd" => notes.push(format!(
                "{}: container_manager: containerd is what kprov installs",
                v.at
            )),
            // Kubespray's default before 2.18; the kubelet has not spoken to Docker since
            // Kubernetes 1.24, so no cluster kprov installs could use it. Answered, not refused:
            // the user's files stay as they are.
            "docker" => notes.push(format!(
                "{}: container_manager: docker: kprov installs containerd instead (the kubelet \
                 has no Docker support since Kubernetes 1.24); docker_* settings do not apply",
                v.at
            )),
            other => refuse.push((
                v.at.clone(),
                format!(
                    "container_manager: {other:?} is not supported: kprov installs containerd; \
                     set container_manager: containerd or remove it"
                ),
            )),
        }
    }
    for (var, field, slot) in [
        (
            "kube_pods_subnet",
            "spec.networking.podCIDR",
            &mut s.pod_cidr,
        ),
        (
            "kube_service_addresses",
            "spec.networking.serviceCIDR",
            &mut s.service_cidr,
        ),
    ] {
        if let Some(v) = one.get(var)
            && let Some(t) = text(var, v)
        {
            map(var, &v.at, field, t.clone());
            *slot = Some((t, v.at.clone()));
        }
    }
    if let Some(v) = one.get("cluster_name")
        && let Some(t) = text("cluster_name", v)
    {
        if t != "cluster.local" {
            refuse.push((
                v.at.clone(),
                format!(
                    "cluster_name: {t:?} is Kubespray's cluster DNS domain; kprov uses \
                     cluster.local (kubeadm's default) and cannot change it yet. The kprov \
                     cluster name is the NAME given to `create cluster`"
                ),
            ));
        } else {
            notes.push(format!(
                "{}: cluster_name: cluster.local is the DNS domain kprov uses",
                v.at
            ));
        }
    }
    if let Some(v) = one.get("kube_proxy_mode")
        && let Some(t) = text("kube_proxy_mode", v)
    {
        let mode = match t.as_str() {
            "iptables" => Some(ProxyMode::Iptables),
            "ipvs" => Some(ProxyMode::Ipvs),
            "nftables" => Some(ProxyMode::Nftables),
            other => {
                refuse.push((
                    v.at.clone(),
                    format!(
                        "kube_proxy_mode: {other:?} is not a kube-proxy mode (iptables, ipvs or \
                         nftables)"
                    ),
                ));
                None
            }
        };
        if let Some(mode) = mode {
            map(
                "kube_proxy_mode",
                &v.at,
                "spec.kubeProxy.proxyMode",
                mode.as_str().to_string(),
            );
            s.proxy_mode = Some((mode, v.at.clone()));
        }
    }
    if let Some(v) = one.get("kube_proxy_conntrack_max_per_core")
        && let Some(t) = text("kube_proxy_conntrack_max_per_core", v)
    {
        match t.parse::<u32>() {
            Ok(n) => {
                map(
                    "kube_proxy_conntrack_max_per_core",
                    &v.at,
                    "spec.kubeProxy.conntrackMaxPerCore",
                    n.to_string(),
                );
                s.conntrack_max_per_core = Some((n, v.at.clone()));
            }
            Err(_) => refuse.push((
                v.at.clone(),
                format!(
                    "kube_proxy_conntrack_max_per_core: {t:?} is not a whole number (0 leaves \
                     the kernel's nf_conntrack_max alone)"
                ),
            )),
        }
    }
    let domain = one
        .get("apiserver_loadbalancer_domain_name")
        .and_then(|v| Some((text("apiserver_loadbalancer_domain_name", v)?, v.at.clone())));
    if let Some(v) = one.get("loadbalancer_apiserver") {
        let lb = structured(v);
        match lb.as_object() {
            None => refuse.push((
                v.at.clone(),
                format!("loadbalancer_apiserver: expected {{address: ..., port: ...}}, got {lb}"),
            )),
            Some(obj) => {
                let mut field = |k: &str| -> Option<String> {
                    match obj.get(k) {
                        None | Some(Value::Null) => None,
                        Some(x) => text(
                            &format!("loadbalancer_apiserver.{k}"),
                            &Var {
                                value: x.clone(),
                                at: v.at.clone(),
                            },
                        ),
                    }
                };
                let address = field("address");
                let port = field("port").unwrap_or_else(|| "6443".into());
                let host = match (&domain, &address) {
                    (Some((d, _)), _) => Some(d.clone()),
                    (None, Some(a)) => Some(a.clone()),
                    (None, None) => {
                        refuse.push((
                            v.at.clone(),
                            "loadbalancer_apiserver has no address (and no \
                             apiserver_loadbalancer_domain_name names it)"
                                .into(),
                        ));
                        None
                    }
                };
                if let Some(host) = host {
                    let endpoint = format!("{host}:{port}");
                    map(
                        "loadbalancer_apiserver",
                        &v.at,
                        "spec.api.endpoint",
                        endpoint.clone(),
                    );
                    s.api_endpoint = Some((endpoint, v.at.clone()));
                    // Kubespray points the domain name at the address in every host's
                    // /etc/hosts and puts both in the certificate: kept, not dropped.
                    if let (Some(_), Some(a)) = (&domain, &address) {
                        map(
                            "loadbalancer_apiserver.address",
                            &v.at,
                            "spec.api.endpointAddress",
                            a.clone(),
                        );
                        s.api_endpoint_address = Some((a.clone(), v.at.clone()));
                        map(
                            "loadbalancer_apiserver.address",
                            &v.at,
                            "spec.api.additionalSANs",
                            a.clone(),
                        );
                        s.extra_sans.push((a.clone(), v.at.clone()));
                    }
                }
            }
        }
    }
    if let Some((d, at)) = domain {
        map(
            "apiserver_loadbalancer_domain_name",
            &at,
            "spec.api.additionalSANs",
            d.clone(),
        );
        s.extra_sans.push((d, at));
    }
    if let Some(v) = one.get("supplementary_addresses_in_ssl_keys") {
        let list = match structured(v) {
            Value::Array(items) => items,
            Value::Null => vec![],
            Value::String(one) => one
                .split(',')
                .map(|s| Value::String(s.trim().into()))
                .collect(),
            other => {
                refuse.push((
                    v.at.clone(),
                    format!("supplementary_addresses_in_ssl_keys: expected a list, got {other}"),
                ));
                vec![]
            }
        };
        for item in list {
            let Some(t) = text(
                "supplementary_addresses_in_ssl_keys",
                &Var {
                    value: item,
                    at: v.at.clone(),
                },
            ) else {
                continue;
            };
            map(
                "supplementary_addresses_in_ssl_keys",
                &v.at,
                "spec.api.additionalSANs",
                t.clone(),
            );
            s.extra_sans.push((t, v.at.clone()));
        }
    }
    proxy_settings(&one, &mut s, &mut map, &mut text, &mut refuse, notes);
    if let Some(v) = one.get("containerd_registries_mirrors") {
        registry_mirrors(v, &mut s, &mut map, &mut refuse);
    }
    docker_registries(&one, &mut s, &mut map, &mut refuse);
    for (at, message) in refuse {
        fail(bad(&at, message));
    }
    s
}

/// Kubespray's `http_proxy`, `https_proxy`, `no_proxy` and `additional_no_proxy` as
/// `spec.proxy`. Kubespray builds its own no-proxy list (hosts, API endpoint, service
/// domains) unless `no_proxy` replaces it; kprov always adds that part, so both lists only
/// add entries here.
fn proxy_settings(
    one: &BTreeMap<&str, Var>,
    s: &mut ClusterSettings,
    map: &mut impl FnMut(&str, &At, &str, String),
    text: &mut impl FnMut(&str, &Var) -> Option<String>,
    refuse: &mut Vec<(At, String)>,
    notes: &mut Vec<String>,
) {
    let mut proxy = crate::spec::Proxy::default();
    let mut first_at: Option<At> = None;
    for (var, field) in [
        ("http_proxy", "spec.proxy.http"),
        ("https_proxy", "spec.proxy.https"),
    ] {
        let Some(v) = one.get(var) else { continue };
        let Some(t) = text(var, v).filter(|t| !t.trim().is_empty()) else {
            continue;
        };
        let t = t.trim().to_string();
        if let Err(e) = crate::spec::mirrors::check_endpoint(&t) {
            refuse.push((v.at.clone(), format!("{var}: {e}")));
            continue;
        }
        map(var, &v.at, field, t.clone());
        first_at.get_or_insert_with(|| v.at.clone());
        if var == "http_proxy" {
            proxy.http = Some(t);
        } else {
            proxy.https = Some(t);
        }
    }
    for var in ["no_proxy", "additional_no_proxy"] {
        let Some(v) = one.get(var) else { continue };
        let list: Vec<String> = match structured(v) {
            Value::Array(items) => items
                .iter()
                .filter_map(|i| i.as_str().map(str::to_string))
                .collect(),
            Value::Null => vec![],
            _ => match text(var, v) {
                Some(t) => t.split(',').map(|x| x.trim().to_string()).collect(),
                None => continue,
            },
        };
        let list: Vec<String> = list.into_iter().filter(|x| !x.is_empty()).collect();
        if list.is_empty() {
            continue;
        }
        if proxy.http.is_none() && proxy.https.is_none() {
            notes.push(format!(
                "{}: {var}: without http_proxy or https_proxy nothing goes through a proxy",
                v.at
            ));
            continue;
        }
        for x in &list {
            map(var, &v.at, "spec.proxy.noProxy", x.clone());
        }
        proxy.no_proxy.extend(list);
    }
    if let Some(at) = first_at {
        s.proxy = Some((proxy, at));
    }
}

/// Kubespray's `containerd_registries_mirrors` (a list of `prefix` and `mirrors` of `host`,
/// `capabilities`, `skip_verify`, `override_path`) as `spec.containerd.registries`. A key
/// kprov cannot honour is refused at the variable's line.
fn registry_mirrors(
    v: &Var,
    s: &mut ClusterSettings,
    map: &mut impl FnMut(&str, &At, &str, String),
    refuse: &mut Vec<(At, String)>,
) {
    const VAR: &str = "containerd_registries_mirrors";
    let mut refuse_here = |msg: String| refuse.push((v.at.clone(), format!("{VAR}: {msg}")));
    let items = match structured(v) {
        Value::Array(items) => items,
        Value::Null => return,
        other => {
            refuse_here(format!(
                "expected a list of {{prefix, mirrors}}, got {other}"
            ));
            return;
        }
    };
    for (i, item) in items.iter().enumerate() {
        let Some(obj) = item.as_object() else {
            refuse_here(format!(
                "entry {i}: expected {{prefix, mirrors}}, got {item}"
            ));
            continue;
        };
        let Some(prefix) = obj.get("prefix").and_then(Value::as_str) else {
            refuse_here(format!(
                "entry {i}: has no prefix (the registry it mirrors)"
            ));
            continue;
        };
        let mut registry = crate::spec::Registry {
            name: prefix.to_string(),
            ..Default::default()
        };
        for key in obj.keys() {
            match key.as_str() {
                "prefix" | "mirrors" => {}
                "server" => {
                    let Some(server) = obj["server"].as_str() else {
                        refuse_here(format!(
                            "{prefix}: server {} is not a URL (a string)",
                            obj["server"]
                        ));
                        continue;
                    };
                    let upstream = match prefix {
                        "docker.io" => "https://registry-1.docker.io".to_string(),
                        p => format!("https://{p}"),
                    };
                    if server.trim_end_matches('/') != upstream {
                        refuse_here(format!(
                            "{prefix}: server {server:?} is not the registry's own server \
                             ({upstream}); kprov keeps the upstream as the last resort \
                             (or none: spec.containerd.registries[].fallback: false)"
                        ));
                    }
                }
                other => refuse_here(format!(
                    "{prefix}: key {other:?} is not one kprov maps (prefix, mirrors, server)"
                )),
            }
        }
        let mirrors = match obj.get("mirrors") {
            Some(Value::Array(m)) => m.clone(),
            _ => {
                refuse_here(format!("{prefix}: mirrors must be a list of {{host, ...}}"));
                continue;
            }
        };
        for (j, m) in mirrors.iter().enumerate() {
            let Some(mo) = m.as_object() else {
                refuse_here(format!(
                    "{prefix}: mirror {j}: expected {{host, ...}}, got {m}"
                ));
                continue;
            };
            let mut mirror = crate::spec::RegistryMirror::default();
            let mut ok = true;
            for (k, val) in mo {
                match (k.as_str(), val) {
                    ("host", Value::String(h)) => mirror.endpoint = h.clone(),
                    ("capabilities", Value::Array(c)) => {
                        mirror.capabilities = c
                            .iter()
                            .filter_map(|x| x.as_str().map(str::to_string))
                            .collect();
                    }
                    ("skip_verify", b) => mirror.skip_verify = truthy(b).filter(|b| *b),
                    ("override_path", b) => mirror.override_path = truthy(b).filter(|b| *b),
                    (other, val) => {
                        ok = false;
                        refuse_here(format!(
                            "{prefix}: mirror {j}: {other}: {val} is not something kprov maps \
                             (host, capabilities, skip_verify, override_path)"
                        ));
                    }
                }
            }
            if let Err(e) = crate::spec::mirrors::check_endpoint(&mirror.endpoint) {
                refuse_here(format!("{prefix}: mirror {j}: host {e}"));
                continue;
            }
            if ok {
                map(
                    VAR,
                    &v.at,
                    "spec.containerd.registries",
                    format!("{prefix} -> {}", mirror.endpoint),
                );
                registry.mirrors.push(mirror);
            }
        }
        if let Err(e) = crate::spec::mirrors::check_registry_name(prefix) {
            refuse_here(format!("prefix {e}"));
            continue;
        }
        if !registry.mirrors.is_empty() {
            s.registries.push((registry, v.at.clone()));
        }
    }
}

/// Docker's registry settings (older Kubespray copies, `container_manager: docker`) as
/// containerd's, which kprov installs: `docker_insecure_registries` (`host[:port]` Docker
/// reaches over https without verifying, else over http) as that registry's hosts in the
/// same order; `docker_registry_mirrors` (URLs Docker tries for docker.io) as docker.io's
/// mirrors. The registry itself stays the last resort, as in Docker.
fn docker_registries(
    one: &BTreeMap<&str, Var>,
    s: &mut ClusterSettings,
    map: &mut impl FnMut(&str, &At, &str, String),
    refuse: &mut Vec<(At, String)>,
) {
    let add = |s: &mut ClusterSettings,
               at: &At,
               name: &str,
               mirror: crate::spec::RegistryMirror| {
        match s.registries.iter_mut().find(|(r, _)| r.name == name) {
            Some((r, _)) => {
                if !r.mirrors.iter().any(|m| m.endpoint == mirror.endpoint) {
                    r.mirrors.push(mirror);
                }
            }
            None => s.registries.push((
                crate::spec::Registry {
                    name: name.to_string(),
                    mirrors: vec![mirror],
                    ..Default::default()
                },
                at.clone(),
            )),
        }
    };
    for var in ["docker_insecure_registries", "docker_registry_mirrors"] {
        let Some(v) = one.get(var) else { continue };
        let items = match structured(v) {
            Value::Array(items) => items,
            Value::Null => continue,
            other => {
                refuse.push((v.at.clone(), format!("{var}: expected a list, got {other}")));
                continue;
            }
        };
        for item in items {
            let Some(entry) = item.as_str().map(str::trim).filter(|e| !e.is_empty()) else {
                refuse.push((v.at.clone(), format!("{var}: {item} is not a registry")));
                continue;
            };
            if var == "docker_insecure_registries" {
                if let Err(e) = crate::spec::mirrors::check_registry_name(entry) {
                    refuse.push((v.at.clone(), format!("{var}: {e}")));
                    continue;
                }
                for (scheme, skip_verify) in [("https", Some(true)), ("http", None)] {
                    let endpoint = format!("{scheme}://{entry}");
                    map(
                        var,
                        &v.at,
                        "spec.containerd.registries",
                        format!("{entry} -> {endpoint}"),
                    );
                    add(
                        s,
                        &v.at,
                        entry,
                        crate::spec::RegistryMirror {
                            endpoint,
                            skip_verify,
                            ..Default::default()
                        },
                    );
                }
            } else {
                let endpoint = entry.trim_end_matches('/').to_string();
                if let Err(e) = crate::spec::mirrors::check_endpoint(&endpoint) {
                    refuse.push((v.at.clone(), format!("{var}: {e}")));
                    continue;
                }
                map(
                    var,
                    &v.at,
                    "spec.containerd.registries",
                    format!("docker.io -> {endpoint}"),
                );
                add(
                    s,
                    &v.at,
                    "docker.io",
                    crate::spec::RegistryMirror {
                        endpoint,
                        ..Default::default()
                    },
                );
            }
        }
    }
}

// ---- YAML and JSON ----

/// A YAML/JSON value that keeps the line of every mapping key and document order.
#[derive(Debug, Clone)]
enum Node {
    Scalar(Value),
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(Spanned<String>, Node)>),
}

impl Node {
    fn to_value(&self) -> Value {
        match self {
            Node::Scalar(v) => v.clone(),
            Node::Seq(items) => Value::Array(items.iter().map(|i| i.value.to_value()).collect()),
            Node::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.value.clone(), v.to_value()))
                    .collect(),
            ),
        }
    }

    fn is_null(&self) -> bool {
        matches!(self, Node::Scalar(Value::Null))
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NodeVisitor;
        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a YAML value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Scalar(Value::Null))
            }
            fn visit_none<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Scalar(Value::Null))
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                Node::deserialize(d)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
                Ok(Node::Scalar(Value::Bool(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
                Ok(Node::Scalar(Value::Number(v.into())))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
                Ok(Node::Scalar(Value::Number(v.into())))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
                Ok(Node::Scalar(
                    serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number),
                ))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
                Ok(Node::Scalar(Value::String(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
                Ok(Node::Scalar(Value::String(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut out = Vec::new();
                while let Some(item) = seq.next_element::<Spanned<Node>>()? {
                    out.push(item);
                }
                Ok(Node::Seq(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = map.next_key::<Spanned<String>>()? {
                    out.push((k, map.next_value()?));
                }
                Ok(Node::Map(out))
            }
        }
        d.deserialize_any(NodeVisitor)
    }
}

fn line(s: &Spanned<impl Sized>) -> usize {
    s.referenced.line() as usize
}

fn vars_of_map(
    node: &Node,
    file: &str,
    what: &str,
    at_line: usize,
) -> Result<Vec<(String, Var)>, InventoryError> {
    match node {
        Node::Scalar(Value::Null) => Ok(vec![]),
        Node::Map(entries) => Ok(entries
            .iter()
            .map(|(k, v)| {
                (
                    k.value.clone(),
                    Var {
                        value: v.to_value(),
                        at: At {
                            file: file.to_string(),
                            line: line(k),
                        },
                    },
                )
            })
            .collect()),
        _ => Err(InventoryError::Syntax {
            file: file.to_string(),
            line: at_line,
            column: 0,
            message: format!("{what} must be a mapping of variable: value"),
        }),
    }
}

fn walk_yaml(
    raw: &mut Raw,
    name: &str,
    node: &Node,
    file: &str,
    depth: usize,
) -> Result<(), InventoryError> {
    if depth > MAX_GROUP_DEPTH {
        return Err(InventoryError::Format {
            file: file.to_string(),
            message: format!("groups nest more than {MAX_GROUP_DEPTH} deep (at group {name:?})"),
        });
    }
    raw.group(name);
    let entries = match node {
        Node::Scalar(Value::Null) => return Ok(()),
        Node::Map(entries) => entries,
        _ => {
            return Err(InventoryError::Format {
                file: file.to_string(),
                message: format!("group {name:?} must be a mapping with hosts, children or vars"),
            });
        }
    };
    for (key, value) in entries {
        let err = |message: String| InventoryError::Syntax {
            file: file.to_string(),
            line: line(key),
            column: 0,
            message,
        };
        match key.value.as_str() {
            "vars" => {
                for (k, v) in
                    vars_of_map(value, file, &format!("vars of group {name:?}"), line(key))?
                {
                    raw.set_group_var(name, k, v.value, v.at);
                }
            }
            "hosts" => match value {
                Node::Scalar(Value::Null) => {}
                Node::Map(hosts) => {
                    for (h, vars) in hosts {
                        let vars =
                            vars_of_map(vars, file, &format!("host {:?}", h.value), line(h))?;
                        raw.add_host(name, &h.value, line(h), vars);
                    }
                }
                Node::Scalar(v) => {
                    return Err(err(format!(
                        "hosts of group {name:?} is the text {v}, not a mapping: write each host \
                         as `name:` on its own line (YAML reads indented bare names as one text)"
                    )));
                }
                Node::Seq(_) => {
                    return Err(err(format!(
                        "hosts of group {name:?} must be a mapping (host: vars), not a list"
                    )));
                }
            },
            "children" => match value {
                Node::Scalar(Value::Null) => {}
                Node::Map(children) => {
                    for (c, sub) in children {
                        raw.add_child(name, &c.value);
                        walk_yaml(raw, &c.value, sub, file, depth + 1)?;
                    }
                }
                _ => {
                    return Err(err(format!(
                        "children of group {name:?} must be a mapping of groups"
                    )));
                }
            },
            other => {
                return Err(err(format!(
                    "unknown key {other:?} in group {name:?} (expected hosts, children or vars)"
                )));
            }
        }
    }
    Ok(())
}

/// Ansible's script (JSON) format: groups as host lists, host vars under `_meta.hostvars`.
fn is_script_format(top: &[(Spanned<String>, Node)]) -> bool {
    top.iter().any(|(k, v)| {
        k.value == "_meta"
            || matches!(v, Node::Seq(_))
            || matches!(v, Node::Map(e) if e.iter().any(|(k, v)| k.value == "hosts" && matches!(v, Node::Seq(_))))
    })
}

fn walk_script(
    raw: &mut Raw,
    top: &[(Spanned<String>, Node)],
    file: &str,
) -> Result<(), InventoryError> {
    let err = |l: usize, message: String| InventoryError::Syntax {
        file: file.to_string(),
        line: l,
        column: 0,
        message,
    };
    let names =
        |node: &Node, what: &str, l: usize| -> Result<Vec<(String, usize)>, InventoryError> {
            match node {
                Node::Scalar(Value::Null) => Ok(vec![]),
                Node::Seq(items) => items
                    .iter()
                    .map(|i| match &i.value {
                        Node::Scalar(Value::String(s)) => Ok((s.clone(), line(i))),
                        _ => Err(err(line(i), format!("{what} must be a list of names"))),
                    })
                    .collect(),
                _ => Err(err(l, format!("{what} must be a list of names"))),
            }
        };
    let mut meta: BTreeMap<String, (usize, Vec<(String, Var)>)> = BTreeMap::new();
    let mut children_seen = BTreeSet::new();
    for (g, node) in top {
        if g.value == "_meta" {
            let Node::Map(entries) = node else {
                return Err(err(line(g), "_meta must be a mapping".into()));
            };
            for (k, v) in entries {
                if k.value != "hostvars" {
                    continue;
                }
                let Node::Map(hosts) = v else {
                    return Err(err(line(k), "_meta.hostvars must be a mapping".into()));
                };
                for (h, vars) in hosts {
                    let vars =
                        vars_of_map(vars, file, &format!("hostvars of {:?}", h.value), line(h))?;
                    meta.insert(h.value.clone(), (line(h), vars));
                }
            }
            continue;
        }
        raw.group(&g.value);
        match node {
            Node::Seq(_) => {
                for (h, l) in names(node, &format!("group {:?}", g.value), line(g))? {
                    raw.add_host(&g.value, &h, l, vec![]);
                }
            }
            Node::Map(entries) => {
                for (k, v) in entries {
                    match k.value.as_str() {
                        "hosts" => {
                            for (h, l) in names(v, "hosts", line(k))? {
                                raw.add_host(&g.value, &h, l, vec![]);
                            }
                        }
                        "children" => {
                            for (c, _) in names(v, "children", line(k))? {
                                children_seen.insert(c.clone());
                                raw.add_child(&g.value, &c);
                            }
                        }
                        "vars" => {
                            for (name, var) in vars_of_map(v, file, "vars", line(k))? {
                                raw.set_group_var(&g.value, name, var.value, var.at);
                            }
                        }
                        other => {
                            return Err(err(
                                line(k),
                                format!(
                                    "unknown key {other:?} in group {:?} (expected hosts, children or vars)",
                                    g.value
                                ),
                            ));
                        }
                    }
                }
            }
            Node::Scalar(Value::Null) => {}
            _ => {
                return Err(err(
                    line(g),
                    format!("group {:?} must be a list or a mapping", g.value),
                ));
            }
        }
    }
    let groups: Vec<String> = raw.groups.keys().cloned().collect();
    for g in groups {
        if g != "all" && !children_seen.contains(&g) {
            raw.add_child("all", &g);
        }
    }
    for (h, (l, vars)) in meta {
        if raw.host_vars.contains_key(&h) {
            let own = raw.host_vars.entry(h.clone()).or_default();
            for (k, v) in vars {
                raw.defs.push((k.clone(), v.at.clone()));
                own.insert(k, v);
            }
        } else {
            // A host with vars but no group is in `all` (Ansible's `ungrouped`).
            raw.add_host("ungrouped", &h, l, vars);
            raw.add_child("all", "ungrouped");
        }
    }
    Ok(())
}

/// YAML (with or without a top-level `all:`) and JSON inventories.
fn parse_structured(text: &str, file: &str) -> Result<Raw, InventoryError> {
    let node: Node = serde_saphyr::from_str(text).map_err(|e| yaml_error(file, &e))?;
    let mut raw = Raw::default();
    raw.group("all");
    let top = match node {
        Node::Map(top) => top,
        Node::Scalar(Value::Null) => vec![],
        _ => {
            return Err(InventoryError::Format {
                file: file.to_string(),
                message: "an inventory must be a mapping of groups (all: ...)".into(),
            });
        }
    };
    if is_script_format(&top) {
        walk_script(&mut raw, &top, file)?;
        return Ok(raw);
    }
    for (g, sub) in &top {
        if g.value != "all" {
            raw.add_child("all", &g.value);
        }
        walk_yaml(&mut raw, &g.value, sub, file, 0)?;
    }
    Ok(raw)
}

/// Reads inventory text of a Kubespray format; `vars_dir` is where `group_vars/` and
/// `host_vars/` are looked for (the inventory's directory), if anywhere.
pub(crate) fn import_text(
    text: &str,
    file: &str,
    format: Format,
    vars_dir: Option<&Path>,
) -> Result<Inventory, InventoryError> {
    let mut raw = match format {
        Format::KubesprayIni => ini(text, file)?,
        _ => parse_structured(text, file)?,
    };
    raw.add_legacy_groups();
    if let Some(dir) = vars_dir {
        raw.read_var_dirs(dir);
    }
    raw.finish(file, format)
}

// ---- group_vars/ and host_vars/ ----

const VAR_EXTENSIONS: &[&str] = &["", "yml", "yaml", "json"];

/// The vars files for one group or host in `dir`, in Ansible's order (the file, then a
/// directory's files sorted by path; later files win).
fn read_vars_for(
    dir: &Path,
    name: &str,
    defs: &mut Vec<(String, At)>,
    skipped: &mut Vec<Unused>,
) -> Result<Vars, InventoryError> {
    let mut files = Vec::new();
    for ext in VAR_EXTENSIONS {
        let p = if ext.is_empty() {
            dir.join(name)
        } else {
            dir.join(format!("{name}.{ext}"))
        };
        if p.is_file() {
            files.push(p);
        }
    }
    let sub = dir.join(name);
    if sub.is_dir() {
        collect_var_files(&sub, &mut files, 0)?;
    }
    let mut vars = Vars::new();
    for f in files {
        let shown = f.display().to_string();
        let text = read_bounded(&f)?;
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        if text.trim_start().starts_with("$ANSIBLE_VAULT") {
            skipped.push(Unused {
                var: "(whole file)".into(),
                at: At {
                    file: shown,
                    line: 1,
                },
                why: Some("encrypted with ansible-vault; kprov does not read it".into()),
            });
            continue;
        }
        let node: Node = serde_saphyr::from_str(text).map_err(|e| yaml_error(&shown, &e))?;
        if node.is_null() {
            continue;
        }
        for (k, v) in vars_of_map(&node, &shown, "a vars file", 1)? {
            defs.push((k.clone(), v.at.clone()));
            vars.insert(k, v);
        }
    }
    Ok(vars)
}

fn collect_var_files(
    dir: &Path,
    out: &mut Vec<std::path::PathBuf>,
    depth: usize,
) -> Result<(), InventoryError> {
    if depth > 8 {
        return Ok(());
    }
    let io = |source| InventoryError::Io {
        file: dir.display().to_string(),
        source,
    };
    let mut entries: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io)?;
    entries.sort();
    for p in entries {
        let hidden = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_none_or(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        if p.is_dir() {
            collect_var_files(&p, out, depth + 1)?;
        } else if VAR_EXTENSIONS
            .iter()
            .any(|e| p.extension().and_then(|x| x.to_str()).unwrap_or("") == *e)
        {
            out.push(p);
        }
    }
    Ok(())
}

// ---- inventory.ini ----

enum Section {
    Hosts(String),
    Children(String),
    Vars(String),
}

/// An INI value as Ansible types it: a Python literal when it is one, else the text.
fn ini_value(v: &str) -> Value {
    literal::parse(v).unwrap_or_else(|| Value::String(v.to_string()))
}

/// `value # comment` in a `[group:vars]` line: the comment goes (outside quotes, after space).
fn strip_comment(v: &str) -> &str {
    let mut quote = None;
    let mut prev_space = true;
    for (i, c) in v.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '#' && prev_space => return v[..i].trim_end(),
            None => {}
        }
        prev_space = c.is_whitespace();
    }
    v
}

fn ini(text: &str, file: &str) -> Result<Raw, InventoryError> {
    let mut raw = Raw::default();
    let mut section = Section::Hosts("ungrouped".to_string());
    raw.add_child("all", "ungrouped");
    for (idx, full) in text.lines().enumerate() {
        // A bad line is a problem at its line; the next lines are still read, so one run
        // lists every problem of the file.
        if let Err(e) = ini_line(&mut raw, &mut section, idx + 1, full, file) {
            raw.problems.extend(e.into_problems());
        }
    }
    Ok(raw)
}

fn ini_line(
    raw: &mut Raw,
    section: &mut Section,
    line_no: usize,
    full: &str,
    file: &str,
) -> Result<(), InventoryError> {
    let at = At {
        file: file.to_string(),
        line: line_no,
    };
    let err = |message: String| InventoryError::Syntax {
        file: file.to_string(),
        line: line_no,
        column: 1,
        message,
    };
    let line = full.trim();
    if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
        return Ok(());
    }
    if let Some(header) = line.strip_prefix('[') {
        let header = strip_comment(header);
        let header = header
            .strip_suffix(']')
            .ok_or_else(|| err(format!("section header {line:?} has no closing ']'")))?
            .trim();
        let (name, kind) = match header.split_once(':') {
            Some((n, k)) => (n.trim(), Some(k.trim())),
            None => (header, None),
        };
        if name.is_empty() {
            return Err(err("empty group name".into()));
        }
        *section = match kind {
            None => Section::Hosts(name.into()),
            Some("children") => Section::Children(name.into()),
            Some("vars") => Section::Vars(name.into()),
            Some(other) => {
                return Err(err(format!(
                    "unknown section kind {other:?} (expected [{name}], [{name}:children] \
                     or [{name}:vars])"
                )));
            }
        };
        if name != "all" {
            raw.add_child("all", name);
        }
        return Ok(());
    }
    match &*section {
        Section::Hosts(group) => {
            let words = split_words(line).map_err(err)?;
            let Some((first, rest)) = words.split_first() else {
                return Ok(());
            };
            if first.contains('[') {
                return Err(err(format!(
                    "host pattern {first:?}: ranges are not supported, list each host"
                )));
            }
            let mut vars = Vec::new();
            for w in rest {
                let (k, v) = w
                    .split_once('=')
                    .ok_or_else(|| err(format!("{w:?} is not a key=value host variable")))?;
                vars.push((
                    k.to_string(),
                    Var {
                        value: ini_value(v),
                        at: at.clone(),
                    },
                ));
            }
            let group = group.clone();
            raw.add_host(&group, first, line_no, vars);
        }
        Section::Children(group) => {
            let words = split_words(line).map_err(err)?;
            let Some((first, rest)) = words.split_first() else {
                return Ok(());
            };
            if !rest.is_empty() {
                return Err(err(format!(
                    "a [{group}:children] line names one group, got {line:?}"
                )));
            }
            let group = group.clone();
            raw.add_child(&group, first);
        }
        Section::Vars(group) => {
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| err(format!("{line:?} is not a key=value variable")))?;
            let group = group.clone();
            let v = strip_comment(v.trim());
            raw.set_group_var(&group, k.trim().to_string(), ini_value(v), at);
        }
    }
    Ok(())
}

/// Splits a line as Python's `shlex.split(line, comments=True)` does (Ansible's INI host
/// lines): whitespace separates words, quotes group, `\` escapes, `#` starts a comment.
fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) if c == q => quote = None,
            Some('"') if c == '\\' => match chars.next() {
                Some(n @ ('"' | '\\' | '$' | '`')) => cur.push(n),
                Some(n) => {
                    cur.push('\\');
                    cur.push(n);
                }
                None => return Err("unterminated \" quote".into()),
            },
            Some(_) => cur.push(c),
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                in_word = true;
            }
            None if c == '\\' => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            None if c == '#' => break,
            None => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if let Some(q) = quote {
        return Err(format!("unterminated {q} quote"));
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_yaml(text: &str, file: &str) -> Result<Vec<Located>, InventoryError> {
        Ok(import_text(text, file, Format::KubesprayYaml, None)?
            .checked()?
            .hosts)
    }

    fn parse_ini(text: &str, file: &str) -> Result<Vec<Located>, InventoryError> {
        Ok(import_text(text, file, Format::KubesprayIni, None)?
            .checked()?
            .hosts)
    }
    use proptest::prelude::*;

    const YAML: &str = "\
all:
  hosts:
    node1:
      ansible_host: 95.54.0.12
      ip: 10.3.0.1
      access_ip: 10.3.0.1
    node2:
      ansible_host: 95.54.0.13
      ansible_port: 2222
      ansible_user: ubuntu
      ip: 10.3.0.2
    node3:
      ansible_host: 95.54.0.14
      ansible_ssh_private_key_file: ~/.ssh/k8s
      node_labels:
        disk: ssd
      node_taints: [\"dedicated=db:NoSchedule\"]
  children:
    kube_control_plane:
      hosts:
        node1:
    kube_node:
      hosts:
        node2:
        node3:
    etcd:
      hosts:
        node1:
    k8s_cluster:
      children:
        kube_control_plane:
        kube_node:
    calico_rr:
      hosts: {}
";

    #[test]
    fn yaml_hosts_and_roles() {
        let hosts = parse_yaml(YAML, "hosts.yaml").unwrap();
        let names: Vec<_> = hosts
            .iter()
            .map(|l| (l.host.name.as_str(), l.line))
            .collect();
        assert_eq!(names, vec![("node1", 3), ("node2", 7), ("node3", 12)]);
        assert_eq!(
            hosts[0].host.roles,
            vec![HostRole::ControlPlane, HostRole::Etcd]
        );
        assert_eq!(hosts[1].host.roles, vec![HostRole::Node]);
        assert_eq!(hosts[1].host.port, Some(2222));
        assert_eq!(hosts[1].host.user.as_deref(), Some("ubuntu"));
        assert_eq!(hosts[1].host.address, "95.54.0.13");
        assert_eq!(hosts[1].host.ip.as_deref(), Some("10.3.0.2"));
        assert_eq!(hosts[2].host.key_path.as_deref(), Some("~/.ssh/k8s"));
        assert_eq!(hosts[2].host.taints, vec!["dedicated=db:NoSchedule"]);
        assert_eq!(hosts[2].host.labels.get("disk").unwrap(), "ssd");
    }

    #[test]
    fn yaml_old_group_names() {
        let text = "all:\n  hosts:\n    a: {ansible_host: 1.1.1.1}\n    b: {ansible_host: 1.1.1.2}\n  children:\n    kube-master:\n      hosts: {a: }\n    kube-node:\n      hosts: {b: }\n    k8s-cluster:\n      children: {kube-master: , kube-node: }\n";
        let hosts = parse_yaml(text, "h.yaml").unwrap();
        assert_eq!(hosts[0].host.roles, vec![HostRole::ControlPlane]);
        assert_eq!(hosts[1].host.roles, vec![HostRole::Node]);
    }

    #[test]
    fn yaml_bad_port_names_host_and_line() {
        let text = "all:\n  hosts:\n    a:\n      ansible_port: ssh\n  children:\n    kube_control_plane:\n      hosts: {a: }\n";
        let err = parse_yaml(text, "h.yaml").unwrap_err().to_string();
        assert_eq!(
            err,
            "h.yaml: invalid inventory:\n  h.yaml:4: host \"a\": ansible_port: \"ssh\" is not a port number"
        );
    }

    const INI: &str = "\
# Kubespray sample
[all]
node1 ansible_host=95.54.0.12 ip=10.3.0.1 etcd_member_name=etcd1
node2 ansible_host=95.54.0.13  ip=10.3.0.2 ansible_user=\"ubuntu\"
node3 ansible_host=95.54.0.14 ansible_port=2200
bastion ansible_host=203.0.113.1 ansible_user=jump

[bastion]
bastion

[kube_control_plane]
node1

[etcd]
node1

[kube_node]
node2
node3

[k8s_cluster:children]
kube_control_plane
kube_node

[k8s_cluster:vars]
ansible_user=admin
";

    #[test]
    fn ini_hosts_roles_vars_and_bastion() {
        let hosts = parse_ini(INI, "inventory.ini").unwrap();
        let names: Vec<_> = hosts
            .iter()
            .map(|l| (l.host.name.as_str(), l.line))
            .collect();
        assert_eq!(names, vec![("node1", 3), ("node2", 4), ("node3", 5)]);
        assert_eq!(
            hosts[0].host.roles,
            vec![HostRole::ControlPlane, HostRole::Etcd]
        );
        // Host vars beat group vars; group vars fill the rest.
        assert_eq!(hosts[1].host.user.as_deref(), Some("ubuntu"));
        assert_eq!(hosts[0].host.user.as_deref(), Some("admin"));
        assert_eq!(hosts[2].host.port, Some(2200));
        assert_eq!(hosts[2].host.bastion.as_deref(), Some("jump@203.0.113.1"));
    }

    #[test]
    fn ini_old_group_names() {
        let text = "[kube-master]\na ansible_host=1.1.1.1\n[kube-node]\nb ansible_host=1.1.1.2\n[k8s-cluster:children]\nkube-master\nkube-node\n[kube-controlplane]\nc\n";
        let hosts = parse_ini(text, "i.ini").unwrap();
        assert_eq!(hosts[0].host.roles, vec![HostRole::ControlPlane]);
        assert_eq!(hosts[1].host.roles, vec![HostRole::Node]);
        assert_eq!(hosts[2].host.roles, vec![HostRole::ControlPlane]);
        assert_eq!(hosts[2].host.address, "c");
    }

    #[test]
    fn ini_errors_name_line() {
        let err = parse_ini("[all]\nnode1 ansible_host\n", "i.ini")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "i.ini: invalid inventory:\n  i.ini:2: \"ansible_host\" is not a key=value host variable"
        );
        // Every bad line of a file in one run, each at its line; good lines still count.
        let err = parse_ini(
            "[all]\nn1 ansible_port=x\nn2 oops\n[kube_control_plane]\nn1\n[etcd:weird]\n[kube_control_plane:vars]\nkube_proxy_mode=userspace\n",
            "i.ini",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "i.ini: invalid inventory:\n  i.ini:3: \"oops\" is not a key=value host variable\n  \
             i.ini:6: unknown section kind \"weird\" (expected [etcd], [etcd:children] or \
             [etcd:vars])\n  i.ini:2: host \"n1\": ansible_port: \"x\" is not a port number\n  \
             i.ini:8: kube_proxy_mode: \"userspace\" is not a kube-proxy mode (iptables, ipvs or \
             nftables)"
        );
        let err = parse_ini("[all]\nnode[1:3]\n", "i.ini")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\n  i.ini:2: host pattern"), "{err}");
        let err = parse_ini("[all:weird]\n", "i.ini").unwrap_err().to_string();
        assert!(err.contains("unknown section kind"), "{err}");
    }

    #[test]
    fn quoted_words() {
        assert_eq!(
            split_words("a b='c d' e=\"f\" # comment").unwrap(),
            vec!["a", "b=c d", "e=f"]
        );
        assert!(split_words("a b='c").is_err());
    }

    /// tests/fixtures/kubespray/fresh/01-flyer-dm/inventory.ini: `[k8s-cluster:children]`
    /// beside `group_vars/k8s_cluster/` (Kubespray's playbooks put the old group's hosts in
    /// the new one, so its settings apply); `group_vars/kube_node.yml` reaches `[kube-node]`.
    #[test]
    fn old_group_names_get_the_new_groups_vars() {
        let d = crate::test_files::tree(&[
            (
                "group_vars/k8s_cluster/k8s-cluster.yml",
                "kube_network_plugin: cilium\nkube_proxy_mode: nftables\n",
            ),
            ("group_vars/kube_node.yml", "ansible_user: core\n"),
        ]);
        let text = "[all]\nm ansible_host=198.18.0.1\nw ansible_host=198.18.0.2\n\
                    [kube-master]\nm\n[etcd]\nm\n[kube-node]\nm\nw\n\
                    [k8s-cluster:children]\nkube-master\nkube-node\n";
        let inv = import_text(text, "inventory.ini", Format::KubesprayIni, Some(d.path())).unwrap();
        assert!(inv.problems.is_empty(), "{:?}", inv.problems);
        assert_eq!(inv.settings.cni.as_ref().map(|c| c.0), Some(Cni::Cilium));
        assert_eq!(
            inv.settings.proxy_mode.as_ref().map(|m| m.0),
            Some(ProxyMode::Nftables)
        );
        let users: Vec<Option<&str>> = inv.hosts.iter().map(|l| l.host.user.as_deref()).collect();
        assert_eq!(users, [Some("core"), Some("core")]);
        assert_eq!(
            inv.hosts[0].host.roles,
            [HostRole::ControlPlane, HostRole::Node, HostRole::Etcd]
        );
        assert!(inv.unused.is_empty(), "{:?}", inv.unused);
    }

    /// tests/fixtures/kubespray/fresh/25-nabarunsen: Docker's insecure registry (an older
    /// Kubespray copy) becomes containerd's hosts for it, https unverified then http, as
    /// Docker tries it; Docker's docker.io mirrors become docker.io's.
    #[test]
    fn docker_registry_settings_become_containerds() {
        let text = "all:\n  vars:\n    docker_insecure_registries:\n      - 172.42.42.60:5000\n    \
                    docker_registry_mirrors: ['https://mirror.example.com/']\n  hosts:\n    \
                    m1: {ansible_host: 198.18.0.1}\n  children:\n    kube_control_plane:\n      \
                    hosts: {m1: }\n";
        let inv = import_text(text, "hosts.yaml", Format::KubesprayYaml, None).unwrap();
        assert!(inv.problems.is_empty(), "{:?}", inv.problems);
        type Hosts = Vec<(String, Option<bool>)>;
        let regs: Vec<(String, Hosts)> = inv
            .settings
            .registries
            .iter()
            .map(|(r, _)| {
                (
                    r.name.clone(),
                    r.mirrors
                        .iter()
                        .map(|m| (m.endpoint.clone(), m.skip_verify))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            regs,
            [
                (
                    "172.42.42.60:5000".to_string(),
                    vec![
                        ("https://172.42.42.60:5000".to_string(), Some(true)),
                        ("http://172.42.42.60:5000".to_string(), None)
                    ]
                ),
                (
                    "docker.io".to_string(),
                    vec![("https://mirror.example.com".to_string(), None)]
                )
            ]
        );
        assert!(inv.unused.is_empty(), "{:?}", inv.unused);
        let bad = "all:\n  vars:\n    docker_insecure_registries: ['-oops:x']\n  hosts:\n    \
                   m1: {ansible_host: 198.18.0.1}\n  children:\n    kube_control_plane:\n      \
                   hosts: {m1: }\n";
        let inv = import_text(bad, "hosts.yaml", Format::KubesprayYaml, None).unwrap();
        assert!(
            inv.problems.iter().any(|p| p.line == Some(3)
                && p.message
                    .starts_with("docker_insecure_registries: \"-oops:x\"")),
            "{:?}",
            inv.problems
        );
    }

    /// tests/fixtures/kubespray/fresh/02-mohammadbnei: add-ons switched on that kprov does not
    /// deploy, and strictARP, are refused each at its line; switched off they are harmless.
    #[test]
    fn addon_switches_on_are_refused_at_their_line() {
        let text = "all:\n  vars:\n    gateway_api_enabled: true\n    \
                    nvidia_accelerator_enabled: true\n    deploy_netchecker: true\n    \
                    kube_proxy_strict_arp: true\n    helm_enabled: false\n    krew_enabled: true\n  \
                    hosts:\n    m1: {ansible_host: 198.18.0.1}\n  children:\n    \
                    kube_control_plane:\n      hosts: {m1: }\n";
        let inv = import_text(text, "hosts.yaml", Format::KubesprayYaml, None).unwrap();
        let refused: Vec<(Option<usize>, &str)> = inv
            .problems
            .iter()
            .map(|p| (p.line, p.message.split(':').next().unwrap_or_default()))
            .collect();
        assert_eq!(
            refused,
            [
                (Some(5), "deploy_netchecker"),
                (Some(3), "gateway_api_enabled"),
                (Some(6), "kube_proxy_strict_arp"),
                (Some(4), "nvidia_accelerator_enabled"),
            ]
        );
        assert!(
            inv.problems[1]
                .message
                .contains("kprov does not deploy the Gateway API CRDs"),
            "{:?}",
            inv.problems
        );
        let unused: Vec<&str> = inv.unused.iter().map(|u| u.var.as_str()).collect();
        assert_eq!(unused, ["helm_enabled", "krew_enabled"]);
    }

    /// tests/fixtures/kubespray/fresh/15-yavuzerkal: a cloud's public addresses and no `ip`.
    #[test]
    fn public_addresses_without_ip_get_a_note() {
        let text = "[all]\nnode1 ansible_host=34.32.82.12\nnode2 ansible_host=10.0.0.2\n\
                    node3 ansible_host=198.18.0.3\nnode4 ansible_host=34.32.4.170 ip=10.0.0.4\n\
                    [kube_control_plane]\nnode1\n[etcd]\nnode1\n[kube_node]\nnode2\nnode3\nnode4\n";
        let inv = import_text(text, "inventory.ini", Format::KubesprayIni, None).unwrap();
        let said: Vec<&String> = inv
            .notes
            .iter()
            .filter(|n| n.contains("no ip for"))
            .collect();
        assert_eq!(said.len(), 1, "{:?}", inv.notes);
        assert!(
            said[0].contains("no ip for node1 (34.32.82.12, line 2): ")
                && said[0].contains("set ip to the host's own address"),
            "{}",
            said[0]
        );
        for private in ["10.0.0.2", "198.18.0.3", "34.32.4.170"] {
            assert!(!said[0].contains(private), "{}", said[0]);
        }
        for (a, public) in [
            ("34.32.82.12", true),
            ("95.54.0.12", true),
            ("100.64.0.1", false),
            ("172.31.2.224", false),
            ("192.0.2.1", false),
            ("169.254.1.1", false),
        ] {
            assert_eq!(is_public(a.parse().unwrap()), public, "{a}");
        }
    }

    /// tests/fixtures/kubespray/fresh/02-mohammadbnei: `ansible_password` is named in a note,
    /// its value never shown.
    #[test]
    fn a_password_is_named_never_shown() {
        let text = "all:\n  hosts:\n    node1:\n      ansible_host: 198.18.0.1\n      \
                    ansible_password: s3cret-vagrant\n  children:\n    kube_control_plane:\n      \
                    hosts:\n        node1:\n";
        let inv = import_text(text, "hosts.yaml", Format::KubesprayYaml, None).unwrap();
        let all = format!("{:?} {:?}", inv.notes, inv.unused);
        assert!(!all.contains("s3cret"), "{all}");
        inv.assert_note("ansible_password is set for node1: kprov logs in with keys");
    }

    proptest! {
        #[test]
        fn ini_never_panics(text in "\\PC{0,300}") {
            let _ = parse_ini(&text, "x");
        }

        #[test]
        fn ini_never_panics_structured(lines in proptest::collection::vec(
            prop_oneof![
                "\\[[a-z_:-]{0,12}\\]?",
                "[a-z0-9]{1,6}( [a-z_]{1,8}=[a-z0-9'\"]{0,6}){0,3}",
                "[a-z_]{1,8}=[a-z0-9]{0,5}",
            ], 0..12)) {
            let _ = parse_ini(&lines.join("\n"), "x");
        }

        #[test]
        fn yaml_never_panics(text in "\\PC{0,300}") {
            let _ = parse_yaml(&text, "x");
        }
    }
}
