//! Kubespray inventories (`hosts.yaml` and `inventory.ini`), imported as kprov hosts.
//!
//! Groups map to roles: `kube_control_plane` (old names `kube-master`, `kube-controlplane`)
//! → control-plane, `kube_node` (`kube-node`) → node, `etcd` → etcd. `k8s_cluster`
//! (`k8s-cluster`) and any other group only carry membership and vars. A `bastion` group's
//! host becomes every host's jump host, as Kubespray uses it. Host vars: `ansible_host`,
//! `ansible_port`, `ansible_user` (or their pre-2.0 `ansible_ssh_*` spellings), `ip`,
//! `access_ip`, `ansible_ssh_private_key_file`,
//! `node_labels`, `node_taints`; group vars apply with host vars taking precedence.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use serde_saphyr::Spanned;

use super::{InventoryError, Located, yaml_error};
use crate::spec::{Host, HostRole};

type Vars = BTreeMap<String, Value>;

const CONTROL_PLANE_GROUPS: &[&str] = &["kube_control_plane", "kube-master", "kube-controlplane"];
const NODE_GROUPS: &[&str] = &["kube_node", "kube-node"];
const ETCD_GROUPS: &[&str] = &["etcd"];
const BASTION_GROUP: &str = "bastion";

/// What both syntaxes reduce to before hosts are built.
#[derive(Default)]
struct Raw {
    /// Host names in order of first appearance, with that line.
    order: Vec<(String, usize)>,
    host_vars: BTreeMap<String, Vars>,
    groups: BTreeMap<String, Group>,
    /// Groups in order of first appearance: vars of later (deeper) groups win.
    group_order: Vec<String>,
}

#[derive(Default)]
struct Group {
    hosts: Vec<String>,
    children: Vec<String>,
    vars: Vars,
}

impl Raw {
    fn group(&mut self, name: &str) -> &mut Group {
        if !self.groups.contains_key(name) {
            self.group_order.push(name.to_string());
        }
        self.groups.entry(name.to_string()).or_default()
    }

    fn add_host(&mut self, group: &str, name: &str, line: usize, vars: Vars) {
        if !self.host_vars.contains_key(name) {
            self.order.push((name.to_string(), line));
        }
        self.host_vars
            .entry(name.to_string())
            .or_default()
            .extend(vars);
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

    fn into_hosts(self, file: &str) -> Result<Vec<Located>, InventoryError> {
        let in_any = |names: &[&str]| -> BTreeSet<String> {
            names.iter().flat_map(|g| self.members(g)).collect()
        };
        let control_planes = in_any(CONTROL_PLANE_GROUPS);
        let nodes = in_any(NODE_GROUPS);
        let etcd = in_any(ETCD_GROUPS);
        let bastions = self.members(BASTION_GROUP);
        let memberships: Vec<(&String, BTreeSet<String>)> = self
            .group_order
            .iter()
            .map(|g| (g, self.members(g)))
            .collect();
        let vars_of = |name: &str| -> Vars {
            let mut vars = self
                .groups
                .get("all")
                .map(|g| g.vars.clone())
                .unwrap_or_default();
            for (group, members) in &memberships {
                if group.as_str() != "all"
                    && members.contains(name)
                    && let Some(g) = self.groups.get(group.as_str())
                {
                    vars.extend(g.vars.clone());
                }
            }
            if let Some(own) = self.host_vars.get(name) {
                vars.extend(own.clone());
            }
            vars
        };
        let mut jump = None;
        if bastions.len() > 1 {
            return Err(InventoryError::Format {
                file: file.to_string(),
                message: format!(
                    "the bastion group lists {} hosts ({}); kprov uses a single jump host",
                    bastions.len(),
                    bastions.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            });
        }
        if let Some(b) = bastions.iter().next() {
            let line = self.line_of(b);
            let h = build_host(b, &vars_of(b), file, line)?;
            let mut spec = h.address.clone();
            if let Some(user) = &h.user {
                spec = format!("{user}@{spec}");
            }
            if let Some(port) = h.port {
                spec = format!("{spec}:{port}");
            }
            jump = Some(spec);
        }
        let mut out = Vec::new();
        for (name, line) in &self.order {
            if bastions.contains(name) {
                continue;
            }
            let mut host = build_host(name, &vars_of(name), file, *line)?;
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
            out.push(Located { host, line: *line });
        }
        Ok(out)
    }

    fn line_of(&self, name: &str) -> usize {
        self.order
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, l)| *l)
            .unwrap_or(0)
    }
}

fn build_host(name: &str, vars: &Vars, file: &str, line: usize) -> Result<Host, InventoryError> {
    let bad = |var: &str, why: &str| InventoryError::Syntax {
        file: file.to_string(),
        line,
        column: 0,
        message: format!("host {name:?}: {var}: {why}"),
    };
    let text = |var: &str| -> Result<Option<String>, InventoryError> {
        match vars.get(var) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err(bad(var, "expected a string")),
        }
    };
    // Ansible before 2.0 spelled these ansible_ssh_*; old Kubespray inventories still do.
    let either = |new: &str, old: &str| -> Result<Option<String>, InventoryError> {
        Ok(text(new)?.or(text(old)?))
    };
    let port = match either("ansible_port", "ansible_ssh_port")? {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .map_err(|_| bad("ansible_port", &format!("{p:?} is not a port number")))?,
        ),
    };
    let labels = match vars.get("node_labels") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                Value::Number(_) | Value::Bool(_) => Ok((k.clone(), v.to_string())),
                _ => Err(bad("node_labels", "label values must be strings")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("node_labels", "expected a mapping")),
    };
    let taints = match vars.get("node_taints") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                _ => Err(bad("node_taints", "taints must be strings")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("node_taints", "expected a list")),
    };
    Ok(Host {
        name: name.to_string(),
        address: either("ansible_host", "ansible_ssh_host")?.unwrap_or_else(|| name.to_string()),
        ip: text("ip")?,
        access_ip: text("access_ip")?,
        user: either("ansible_user", "ansible_ssh_user")?,
        port,
        key_path: text("ansible_ssh_private_key_file")?,
        bastion: None,
        roles: vec![],
        labels,
        taints,
    })
}

// ---- hosts.yaml ----

/// A YAML mapping that keeps document order (host order decides the first control plane).
struct Ordered<V>(Vec<(Spanned<String>, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Ordered<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V_<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for V_<V> {
            type Value = Ordered<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Ordered(vec![]))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = map.next_key::<Spanned<String>>()? {
                    out.push((k, map.next_value()?));
                }
                Ok(Ordered(out))
            }
        }
        d.deserialize_any(V_(PhantomData))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlFile {
    all: YamlGroup,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct YamlGroup {
    #[serde(default)]
    hosts: Option<Ordered<Option<Vars>>>,
    #[serde(default)]
    children: Option<Ordered<Option<YamlGroup>>>,
    #[serde(default)]
    vars: Option<Vars>,
}

fn walk_yaml(raw: &mut Raw, name: &str, group: YamlGroup) {
    raw.group(name).vars.extend(group.vars.unwrap_or_default());
    for (host, vars) in group.hosts.map(|o| o.0).unwrap_or_default() {
        let line = host.referenced.line() as usize;
        raw.add_host(name, &host.value, line, vars.unwrap_or_default());
    }
    for (child, sub) in group.children.map(|o| o.0).unwrap_or_default() {
        let g = raw.group(name);
        if !g.children.contains(&child.value) {
            g.children.push(child.value.clone());
        }
        walk_yaml(raw, &child.value, sub.unwrap_or_default());
    }
}

pub fn parse_yaml(text: &str, file: &str) -> Result<Vec<Located>, InventoryError> {
    let parsed: YamlFile = serde_saphyr::from_str(text).map_err(|e| yaml_error(file, &e))?;
    let mut raw = Raw::default();
    walk_yaml(&mut raw, "all", parsed.all);
    raw.into_hosts(file)
}

// ---- inventory.ini ----

enum Section {
    Hosts(String),
    Children(String),
    Vars(String),
}

pub fn parse_ini(text: &str, file: &str) -> Result<Vec<Located>, InventoryError> {
    let mut raw = Raw::default();
    let mut section = Section::Hosts("ungrouped".to_string());
    raw.group("all").children.push("ungrouped".into());
    for (idx, full) in text.lines().enumerate() {
        let line_no = idx + 1;
        let err = |message: String| InventoryError::Syntax {
            file: file.to_string(),
            line: line_no,
            column: 1,
            message,
        };
        let line = full.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(header) = line.strip_prefix('[') {
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
            section = match kind {
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
            if name != "all" && name != "ungrouped" {
                let all = raw.group("all");
                if !all.children.iter().any(|c| c == name) {
                    all.children.push(name.into());
                }
            }
            raw.group(name);
            continue;
        }
        let words = split_words(line).map_err(err)?;
        let Some((first, rest)) = words.split_first() else {
            continue;
        };
        match &section {
            Section::Hosts(group) => {
                if first.contains('[') {
                    return Err(err(format!(
                        "host pattern {first:?}: ranges are not supported, list each host"
                    )));
                }
                let mut vars = Vars::new();
                for w in rest {
                    let (k, v) = w
                        .split_once('=')
                        .ok_or_else(|| err(format!("{w:?} is not a key=value host variable")))?;
                    vars.insert(k.to_string(), ini_value(v));
                }
                let group = group.clone();
                raw.add_host(&group, first, line_no, vars);
            }
            Section::Children(group) => {
                if !rest.is_empty() {
                    return Err(err(format!(
                        "a [{group}:children] line names one group, got {line:?}"
                    )));
                }
                let group = group.clone();
                raw.group(first);
                let g = raw.group(&group);
                if !g.children.contains(first) {
                    g.children.push(first.clone());
                }
            }
            Section::Vars(group) => {
                let (k, v) = line
                    .split_once('=')
                    .ok_or_else(|| err(format!("{line:?} is not a key=value variable")))?;
                let group = group.clone();
                raw.group(&group)
                    .vars
                    .insert(k.trim().to_string(), ini_value(v.trim()));
            }
        }
    }
    raw.into_hosts(file)
}

/// INI values are strings, except that Kubespray users write dicts and lists for
/// `node_labels` / `node_taints` as JSON-ish literals; accept those when they parse.
fn ini_value(v: &str) -> Value {
    if (v.starts_with('{') || v.starts_with('['))
        && let Ok(parsed) = serde_json::from_str(v)
    {
        return parsed;
    }
    Value::String(v.to_string())
}

/// Splits on whitespace, honouring single and double quotes (Ansible's INI host lines).
fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut in_word = false;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            None if c == '#' && !in_word => break,
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
        let text = "all:\n  hosts:\n    a:\n      ansible_port: ssh\n";
        let err = parse_yaml(text, "h.yaml").unwrap_err().to_string();
        assert_eq!(
            err,
            "h.yaml:3:0: host \"a\": ansible_port: \"ssh\" is not a port number"
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
            "i.ini:2:1: \"ansible_host\" is not a key=value host variable"
        );
        let err = parse_ini("[all]\nnode[1:3]\n", "i.ini")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("i.ini:2:1: host pattern"), "{err}");
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
