//! Inventories: the list of bare-metal hosts a `metal` cluster is provisioned on.
//!
//! Three formats are read, detected by content: kprov's own YAML (`hosts:` list, fields as
//! `spec::Host`), Kubespray's `hosts.yaml` (`all:` with `hosts` and `children`) and Kubespray's
//! `inventory.ini`. Every host keeps the line it was defined on so validation errors can point
//! at it.

pub mod kprov;
pub mod kubespray;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use crate::spec::{EtcdType, Host, HostRole};

/// A host together with the line of the inventory file it was defined on (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub host: Host,
    pub line: usize,
}

/// The inventory formats kprov reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Kprov,
    KubesprayYaml,
    KubesprayIni,
}

/// One validation finding, positioned where possible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub line: Option<usize>,
    pub host: Option<String>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "line {line}: ")?;
        }
        if let Some(host) = &self.host {
            write!(f, "host {host:?}: ")?;
        }
        f.write_str(&self.message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("inventory {source}")]
    Read {
        #[source]
        source: crate::bounded::ReadError,
    },
    /// The file is not well-formed in its format (YAML syntax, unknown field or role, bad INI
    /// line).
    #[error("{file}:{line}:{column}: {message}")]
    Syntax {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{file}: {message}")]
    Format { file: String, message: String },
    /// The hosts parse but do not form a valid cluster; every problem is listed.
    #[error("{file}: invalid inventory:{}", problems.iter().map(|p| format!("\n  {file}:{p}")).collect::<String>())]
    Invalid {
        file: String,
        problems: Vec<Problem>,
    },
}

/// Reads, parses and validates an inventory file.
pub fn load(path: &Path) -> Result<Vec<Host>, InventoryError> {
    let file = path.display().to_string();
    let text = crate::bounded::read_file_to_string(path, crate::bounded::INVENTORY)
        .map_err(|source| InventoryError::Read { source })?;
    parse(&text, &file)
}

/// Parses and validates inventory text; `file` names the source in errors.
pub fn parse(text: &str, file: &str) -> Result<Vec<Host>, InventoryError> {
    let located = parse_located(text, file)?;
    let problems = validate(&located);
    if !problems.is_empty() {
        return Err(InventoryError::Invalid {
            file: file.to_string(),
            problems,
        });
    }
    Ok(located.into_iter().map(|l| l.host).collect())
}

/// Parses without validating (validation needs the whole host list).
pub fn parse_located(text: &str, file: &str) -> Result<Vec<Located>, InventoryError> {
    match detect(text) {
        Format::Kprov => kprov::parse(text, file),
        Format::KubesprayYaml => kubespray::parse_yaml(text, file),
        Format::KubesprayIni => kubespray::parse_ini(text, file),
    }
}

/// Detects the format by content: INI files open with a `[group]` header (or a bare host
/// line), YAML inventories with a top-level `all:` (Kubespray) or `hosts:` (kprov) key.
pub fn detect(text: &str) -> Format {
    let mut saw_yaml_key = false;
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') || line == "---" {
            continue;
        }
        if raw.starts_with(' ') || raw.starts_with('\t') {
            continue;
        }
        if line.starts_with('[') {
            return Format::KubesprayIni;
        }
        if line.starts_with("all:") {
            return Format::KubesprayYaml;
        }
        if line.starts_with("hosts:") {
            return Format::Kprov;
        }
        if line.contains(": ") || line.ends_with(':') {
            saw_yaml_key = true;
        } else if !saw_yaml_key {
            // `host1 ansible_host=…` before any section is an ungrouped INI host.
            return Format::KubesprayIni;
        }
    }
    Format::Kprov
}

/// Which etcd topology the hosts describe: external when some `etcd` host is not a control
/// plane (dedicated etcd machines), stacked otherwise (kubeadm's default, etcd on the control
/// planes, which is also how Kubespray inventories usually list the `etcd` group).
pub fn etcd_topology(hosts: &[Host]) -> EtcdType {
    let dedicated = hosts
        .iter()
        .any(|h| h.roles.contains(&HostRole::Etcd) && !h.roles.contains(&HostRole::ControlPlane));
    if dedicated {
        EtcdType::External
    } else {
        EtcdType::Stacked
    }
}

/// Checks the rules a cluster's host list must follow; returns every problem found.
pub fn validate(hosts: &[Located]) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    let mut addresses: BTreeMap<&str, (&str, usize)> = BTreeMap::new();
    for l in hosts {
        let h = &l.host;
        let at = |message: String| Problem {
            line: Some(l.line),
            host: Some(h.name.clone()),
            message,
        };
        if let Err(why) = check_node_name(&h.name) {
            problems.push(at(why));
        }
        if let Some(first) = names.insert(&h.name, l.line) {
            problems.push(at(format!(
                "duplicate host name (first defined on line {first})"
            )));
            names.insert(&h.name, first);
        }
        if h.address.trim().is_empty() {
            problems.push(at("address is empty".into()));
        }
        let mut own: Vec<&str> = vec![h.address.as_str()];
        if let Some(ip) = h.ip.as_deref().filter(|ip| *ip != h.address) {
            own.push(ip);
        }
        for addr in own {
            if let Some((other, line)) = addresses.get(addr) {
                problems.push(at(format!(
                    "address {addr} is already used by host {other:?} (line {line})"
                )));
            } else {
                addresses.insert(addr, (&h.name, l.line));
            }
        }
        if h.roles.is_empty() {
            problems.push(at(
                "host has no role (expected control-plane, node or etcd)".into(),
            ));
        }
        if h.port == Some(0) {
            problems.push(at("port 0 is not a valid ssh port".into()));
        }
        for taint in &h.taints {
            if let Err(why) = parse_taint(taint) {
                problems.push(at(why));
            }
        }
    }
    let control_planes: Vec<&Located> = hosts
        .iter()
        .filter(|l| l.host.roles.contains(&HostRole::ControlPlane))
        .collect();
    if control_planes.is_empty() && !hosts.is_empty() {
        problems.push(Problem {
            line: None,
            host: None,
            message: "no host has the control-plane role; at least one is required".into(),
        });
    }
    if hosts.is_empty() {
        problems.push(Problem {
            line: None,
            host: None,
            message: "the inventory lists no hosts".into(),
        });
    }
    let plain: Vec<Host> = hosts.iter().map(|l| l.host.clone()).collect();
    let (kind, members): (&str, Vec<&Located>) = match etcd_topology(&plain) {
        EtcdType::Stacked => ("stacked etcd runs on the control planes", control_planes),
        EtcdType::External => (
            "external etcd runs on the etcd hosts",
            hosts
                .iter()
                .filter(|l| l.host.roles.contains(&HostRole::Etcd))
                .collect(),
        ),
    };
    if members.len() % 2 == 0 && !members.is_empty() {
        let listed: Vec<String> = members
            .iter()
            .map(|l| format!("{} (line {})", l.host.name, l.line))
            .collect();
        problems.push(Problem {
            line: members.last().map(|l| l.line),
            host: None,
            message: format!(
                "etcd needs an odd number of members for quorum, but {kind} and there are {}: {}",
                members.len(),
                listed.join(", ")
            ),
        });
    }
    problems
}

/// Kubernetes node names are lowercase RFC 1123 subdomains.
fn check_node_name(name: &str) -> Result<(), String> {
    let ok_label = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(ok_label) {
        return Err(format!(
            "name {name:?} is not a valid Kubernetes node name (lowercase letters, digits, '-' \
             and '.', at most 253 characters)"
        ));
    }
    Ok(())
}

/// A taint as written by `kubectl taint`: `key[=value]:Effect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: Option<String>,
    pub effect: String,
}

pub fn parse_taint(text: &str) -> Result<Taint, String> {
    let (kv, effect) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("taint {text:?} has no effect (expected key[=value]:Effect)"))?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(format!(
            "taint {text:?}: effect {effect:?} is not NoSchedule, PreferNoSchedule or NoExecute"
        ));
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (kv, None),
    };
    if key.is_empty() {
        return Err(format!("taint {text:?} has an empty key"));
    }
    Ok(Taint {
        key: key.to_string(),
        value,
        effect: effect.to_string(),
    })
}

/// Turns a serde-saphyr error into a positioned syntax error.
pub(crate) fn yaml_error(file: &str, err: &serde_saphyr::Error) -> InventoryError {
    let (line, column) = err
        .location()
        .map(|l| (l.line() as usize, l.column() as usize))
        .unwrap_or((0, 0));
    InventoryError::Syntax {
        file: file.to_string(),
        line,
        column,
        message: err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, addr: &str, roles: &[HostRole]) -> Host {
        Host {
            name: name.into(),
            address: addr.into(),
            ip: None,
            access_ip: None,
            user: None,
            port: None,
            key_path: None,
            bastion: None,
            roles: roles.to_vec(),
            labels: Default::default(),
            taints: vec![],
        }
    }

    fn located(hosts: Vec<Host>) -> Vec<Located> {
        hosts
            .into_iter()
            .enumerate()
            .map(|(i, host)| Located {
                host,
                line: i * 3 + 2,
            })
            .collect()
    }

    #[test]
    fn valid_three_control_planes() {
        let hosts = located(vec![
            host("cp1", "10.0.0.1", &[HostRole::ControlPlane, HostRole::Etcd]),
            host("cp2", "10.0.0.2", &[HostRole::ControlPlane, HostRole::Etcd]),
            host("cp3", "10.0.0.3", &[HostRole::ControlPlane, HostRole::Etcd]),
            host("w1", "10.0.0.4", &[HostRole::Node]),
        ]);
        assert_eq!(validate(&hosts), vec![]);
    }

    #[test]
    fn every_rule_reports_host_and_line() {
        let hosts = located(vec![
            host("cp1", "10.0.0.1", &[HostRole::ControlPlane]),
            host("cp2", "10.0.0.2", &[HostRole::ControlPlane]),
            host("cp1", "10.0.0.3", &[HostRole::Node]),
            host("Bad_Name", "10.0.0.2", &[]),
        ]);
        let text: Vec<String> = validate(&hosts).iter().map(|p| p.to_string()).collect();
        assert_eq!(
            text,
            vec![
                "line 8: host \"cp1\": duplicate host name (first defined on line 2)".to_string(),
                "line 11: host \"Bad_Name\": name \"Bad_Name\" is not a valid Kubernetes node \
                 name (lowercase letters, digits, '-' and '.', at most 253 characters)"
                    .to_string(),
                "line 11: host \"Bad_Name\": address 10.0.0.2 is already used by host \"cp2\" \
                 (line 5)"
                    .to_string(),
                "line 11: host \"Bad_Name\": host has no role (expected control-plane, node or \
                 etcd)"
                    .to_string(),
                "line 5: etcd needs an odd number of members for quorum, but stacked etcd runs \
                 on the control planes and there are 2: cp1 (line 2), cp2 (line 5)"
                    .to_string(),
            ]
        );
    }

    #[test]
    fn no_control_plane_is_refused() {
        let hosts = located(vec![host("w1", "10.0.0.4", &[HostRole::Node])]);
        let problems = validate(&hosts);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].message.contains("control-plane role"));
    }

    #[test]
    fn external_etcd_counts_etcd_hosts() {
        let mut hosts = vec![
            host("cp1", "10.0.0.1", &[HostRole::ControlPlane]),
            host("e1", "10.0.0.5", &[HostRole::Etcd]),
            host("e2", "10.0.0.6", &[HostRole::Etcd]),
        ];
        assert_eq!(etcd_topology(&hosts), EtcdType::External);
        let problems = validate(&located(hosts.clone()));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].message.contains("external etcd"));
        hosts.push(host("e3", "10.0.0.7", &[HostRole::Etcd]));
        assert_eq!(validate(&located(hosts)), vec![]);
    }

    #[test]
    fn taints_parse() {
        assert_eq!(
            parse_taint("dedicated=gpu:NoSchedule"),
            Ok(Taint {
                key: "dedicated".into(),
                value: Some("gpu".into()),
                effect: "NoSchedule".into()
            })
        );
        assert!(parse_taint("x:Sometimes").is_err());
        assert!(parse_taint("novalue").is_err());
    }

    #[test]
    fn detects_formats() {
        assert_eq!(detect("hosts:\n  - name: a\n"), Format::Kprov);
        assert_eq!(detect("---\nall:\n  hosts: {}\n"), Format::KubesprayYaml);
        assert_eq!(
            detect("# c\n[all]\nnode1 ansible_host=1.2.3.4\n"),
            Format::KubesprayIni
        );
        assert_eq!(detect("node1 ansible_host=1.2.3.4\n"), Format::KubesprayIni);
    }
}

#[cfg(test)]
mod samples {
    use super::*;

    fn roles(hosts: &[Host]) -> Vec<(String, Vec<HostRole>)> {
        hosts
            .iter()
            .map(|h| (h.name.clone(), h.roles.clone()))
            .collect()
    }

    #[test]
    fn every_sample_loads_and_validates() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("inventories");
        let cp = HostRole::ControlPlane;
        let etcd = HostRole::Etcd;
        let node = HostRole::Node;
        let expect: &[(&str, Format, usize, usize)] = &[
            ("kprov-ha.yaml", Format::Kprov, 5, 3),
            ("kprov-single.yaml", Format::Kprov, 3, 1),
            ("kubespray-hosts.yaml", Format::KubesprayYaml, 4, 3),
            ("kubespray-inventory.ini", Format::KubesprayIni, 3, 1),
            ("kubespray-old.ini", Format::KubesprayIni, 4, 3),
        ];
        for (file, format, count, cps) in expect {
            let path = dir.join(file);
            let text = std::fs::read_to_string(&path).unwrap();
            assert_eq!(detect(&text), *format, "{file}");
            let hosts = load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(hosts.len(), *count, "{file}");
            let n = hosts.iter().filter(|h| h.roles.contains(&cp)).count();
            assert_eq!(n, *cps, "{file}");
        }
        let old = load(&dir.join("kubespray-old.ini")).unwrap();
        assert_eq!(roles(&old)[0], ("master1".to_string(), vec![cp, etcd]));
        assert_eq!(roles(&old)[3], ("worker1".to_string(), vec![node]));
        assert_eq!(old[3].address, "198.18.0.14");
        assert_eq!(old[3].user.as_deref(), Some("core"));
    }
}
