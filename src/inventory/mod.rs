//! Inventories: the list of bare-metal hosts a `metal` cluster is provisioned on.
//!
//! Formats, detected by content: kprov's own YAML (`hosts:` list, fields as `spec::Host`),
//! and Kubespray's inventories as Ansible reads them (INI, YAML with or without `all:`,
//! Ansible's JSON script format), with `group_vars/` and `host_vars/` beside the file; see
//! [`kubespray`]. `--inventory` may name a directory (Kubespray's `inventory/mycluster/`), in
//! which the inventory file is found by its usual names. A UTF-8 byte order mark is skipped.
//! Every host keeps the line it was defined on so validation errors can point at it, and
//! every variable the file and line it was set on.

pub(crate) mod kprov;
pub(crate) mod kubespray;
pub(crate) mod literal;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::spec::{Cni, EtcdType, Host, HostRole};

/// Inventory and vars files larger than this are refused (a real inventory is a few KiB).
pub const MAX_INVENTORY_BYTES: u64 = crate::bounded::INVENTORY;

/// The names Kubespray users give the inventory file in `inventory/NAME/`, in the order tried.
pub const DIRECTORY_FILES: &[&str] = &[
    "hosts.yaml",
    "hosts.yml",
    "inventory.ini",
    "hosts.ini",
    "inventory.yaml",
    "inventory.yml",
];

/// A host together with the line of the inventory file it was defined on (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The host as the inventory defines it.
    pub host: Host,
    /// The 1-based line of its definition.
    pub line: usize,
}

/// Where a variable was set: file and 1-based line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct At {
    /// The file as named to the user (the inventory, or a `group_vars/`/`host_vars/` file).
    pub file: String,
    /// The 1-based line.
    pub line: usize,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// A variable kprov turned into a spec field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    /// The Kubespray variable, e.g. `kube_pods_subnet`.
    pub var: String,
    /// Where it was set.
    pub at: At,
    /// The spec field, e.g. `spec.networking.podCIDR`.
    pub field: String,
    /// The value the field gets, as text.
    pub value: String,
}

/// A variable (or file) kprov does not use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unused {
    /// The variable's (or file's) name.
    pub var: String,
    /// Where it was set.
    pub at: At,
    /// Why kprov does not use it, when there is more to say than "not a kprov setting".
    pub why: Option<String>,
}

impl fmt::Display for Unused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.var, self.at)?;
        if let Some(why) = &self.why {
            write!(f, ": {why}")?;
        }
        Ok(())
    }
}

/// Cluster-wide settings an inventory's variables set, each with where it was set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSettings {
    /// `kube_version`, without a leading `v` (`spec.kubernetesVersion`).
    pub kubernetes_version: Option<(String, At)>,
    /// `kube_network_plugin` (`spec.networking.cni`; Kubespray's `cni` is kprov's `none`).
    pub cni: Option<(Cni, At)>,
    /// `kube_pods_subnet` (`spec.networking.podCIDR`).
    pub pod_cidr: Option<(String, At)>,
    /// `kube_service_addresses` (`spec.networking.serviceCIDR`).
    pub service_cidr: Option<(String, At)>,
    /// `loadbalancer_apiserver` as `HOST:PORT` (`spec.api.endpoint`), the host being
    /// `apiserver_loadbalancer_domain_name` when set.
    pub api_endpoint: Option<(String, At)>,
    /// `loadbalancer_apiserver.address` when `apiserver_loadbalancer_domain_name` names the
    /// endpoint: the address the name resolves to on every host.
    pub api_endpoint_address: Option<(String, At)>,
    /// `supplementary_addresses_in_ssl_keys` and the load balancer's name and address: extra
    /// names in the API server's certificate.
    pub extra_sans: Vec<(String, At)>,
    /// `kube_proxy_mode`.
    pub proxy_mode: Option<(crate::spec::ProxyMode, At)>,
    /// `kube_proxy_conntrack_max_per_core`.
    pub conntrack_max_per_core: Option<(u32, At)>,
    /// `http_proxy`, `https_proxy`, `no_proxy`, `additional_no_proxy` (at the first proxy).
    pub proxy: Option<(crate::spec::Proxy, At)>,
    /// `containerd_registries_mirrors`, one per prefix.
    pub registries: Vec<(crate::spec::Registry, At)>,
}

/// Everything kprov understood from an inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// The inventory file read (inside the directory, when a directory was given).
    pub file: String,
    /// The format it was detected as.
    pub format: Format,
    /// Every host, in the order defined.
    pub hosts: Vec<Located>,
    /// The cluster-wide settings its variables set.
    pub settings: ClusterSettings,
    /// Every variable that became a spec field.
    pub mapped: Vec<Mapped>,
    /// Every variable or file kprov does not use (listed in one warning).
    pub unused: Vec<Unused>,
    /// What kprov does with settings it honours without a spec field (file:line first).
    pub notes: Vec<String>,
    /// Every problem found, each at its file and line: [`import`] refuses an inventory with
    /// any, all listed at once (one run shows them all, not one per run).
    pub problems: Vec<Problem>,
}

impl Inventory {
    /// The inventory, or the error listing all its problems.
    pub fn checked(self) -> Result<Inventory, InventoryError> {
        if self.problems.is_empty() {
            Ok(self)
        } else {
            Err(InventoryError::Invalid {
                file: self.file,
                problems: self.problems,
            })
        }
    }

    /// The hosts without their lines, as the spec's `hosts` takes them.
    pub fn plain_hosts(&self) -> Vec<Host> {
        self.hosts.iter().map(|l| l.host.clone()).collect()
    }

    /// The one warning that lists every variable kprov does not use, if any.
    pub fn unused_warning(&self) -> Option<String> {
        if self.unused.is_empty() {
            return None;
        }
        let mut s = format!(
            "{}: {} inventory variable(s) not used by kprov:",
            self.file,
            self.unused.len()
        );
        for u in &self.unused {
            s.push_str(&format!("\n  {}", crate::output::untrusted(&u.to_string())));
        }
        Some(s)
    }
}

/// The inventory formats kprov reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// kprov's own YAML: a `hosts:` list of spec hosts.
    Kprov,
    /// A Kubespray YAML inventory (`hosts.yaml`, with or without `all:`).
    KubesprayYaml,
    /// A Kubespray INI inventory (`inventory.ini`).
    KubesprayIni,
    /// Ansible's JSON inventory (script output or the YAML layout written as JSON).
    AnsibleJson,
}

/// One validation finding, positioned where possible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file it is in, when not the inventory file itself (a `group_vars/` file).
    pub file: Option<String>,
    /// The 1-based line, when the finding has one.
    pub line: Option<usize>,
    /// The host it concerns, when it concerns one.
    pub host: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl Problem {
    /// A problem at `at` (file and line).
    pub fn located(at: &At, message: String) -> Problem {
        Problem {
            file: Some(at.file.clone()),
            line: Some(at.line),
            host: None,
            message,
        }
    }

    /// The problem as `file:line: host "x": message`.
    pub fn at(&self, file: &str) -> String {
        let mut s = self.file.clone().unwrap_or_else(|| file.to_string());
        if let Some(line) = self.line {
            s.push_str(&format!(":{line}"));
        }
        if let Some(host) = &self.host {
            s.push_str(&format!(": host {host:?}"));
        }
        format!("{s}: {}", self.message)
    }
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

/// Why an inventory could not be read or imported.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// A directory beside the inventory (`group_vars/`, `host_vars/`) could not be listed.
    #[error("{file}: cannot read inventory: {source}")]
    Io {
        /// The directory.
        file: String,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The inventory or a variables file could not be read, or is over its size limit.
    #[error("inventory {source}")]
    Read {
        /// The bounded reader's error, naming the file.
        #[source]
        source: crate::bounded::ReadError,
    },
    /// The file is not well-formed in its format (YAML syntax, unknown field or role, bad INI
    /// line), or a variable's value is wrong or not supported.
    #[error("{file}:{line}:{column}: {}", crate::output::untrusted(message))]
    Syntax {
        /// The file it is in.
        file: String,
        /// The 1-based line; 0 when unknown.
        line: usize,
        /// The 1-based column; 0 when unknown (INI errors name the line only).
        column: usize,
        /// What is wrong (inventory text: printed escaped).
        message: String,
    },
    /// The file as a whole is not a usable inventory: no hosts, no or several inventory files
    /// in a directory, groups nested too deep, a group that is not a mapping.
    #[error("{file}: {}", crate::output::untrusted(message))]
    Format {
        /// The file or directory.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// The hosts parse but do not form a valid cluster; every problem is listed.
    #[error("{file}: invalid inventory:{}", problems.iter().map(|p| format!("\n  {}", crate::output::untrusted(&p.at(file)))).collect::<String>())]
    Invalid {
        /// The inventory file.
        file: String,
        /// Every problem, each at its file and line where known.
        problems: Vec<Problem>,
    },
}

impl InventoryError {
    /// The error as one problem among others, at its file and line where it has them.
    pub fn into_problems(self) -> Vec<Problem> {
        match self {
            InventoryError::Syntax {
                file,
                line,
                message,
                ..
            } => vec![Problem {
                file: Some(file),
                line: (line > 0).then_some(line),
                host: None,
                message,
            }],
            InventoryError::Format { file, message } => vec![Problem {
                file: Some(file),
                line: None,
                host: None,
                message,
            }],
            InventoryError::Invalid { file, problems } => problems
                .into_iter()
                .map(|p| Problem {
                    file: p.file.or_else(|| Some(file.clone())),
                    ..p
                })
                .collect(),
            other => vec![Problem {
                file: None,
                line: None,
                host: None,
                message: other.to_string(),
            }],
        }
    }
}

/// Reads an inventory or variables file of at most [`MAX_INVENTORY_BYTES`], through the one
/// bounded reader every input goes through.
pub(crate) fn read_bounded(path: &Path) -> Result<String, InventoryError> {
    crate::bounded::read_file_to_string(path, MAX_INVENTORY_BYTES)
        .map_err(|source| InventoryError::Read { source })
}

/// The inventory file `path` names: the path itself, or inside a directory the one file with
/// a usual inventory name.
pub fn resolve_path(path: &Path) -> Result<PathBuf, InventoryError> {
    if !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    let found: Vec<PathBuf> = DIRECTORY_FILES
        .iter()
        .map(|n| path.join(n))
        .filter(|p| p.is_file())
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(InventoryError::Format {
            file: path.display().to_string(),
            message: format!(
                "a directory without an inventory file (looked for {})",
                DIRECTORY_FILES.join(", ")
            ),
        }),
        many => Err(InventoryError::Format {
            file: path.display().to_string(),
            message: format!(
                "holds several inventory files ({}); name the one to use",
                many.iter()
                    .filter_map(|p| p.file_name().and_then(|n| n.to_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

/// Reads, parses and validates an inventory file or directory, with its `group_vars/` and
/// `host_vars/`; refused with every problem found.
pub fn import(path: &Path) -> Result<Inventory, InventoryError> {
    import_collecting(path)?.checked()
}

/// Like [`import`], but an inventory with problems is returned with them in
/// [`Inventory::problems`], so a caller can add its own before refusing it once.
pub fn import_collecting(path: &Path) -> Result<Inventory, InventoryError> {
    let file_path = resolve_path(path)?;
    let file = file_path.display().to_string();
    let text = read_bounded(&file_path)?;
    let dir = file_path.parent().map(|d| {
        if d.as_os_str().is_empty() {
            Path::new(".")
        } else {
            d
        }
    });
    import_text_collecting(&text, &file, dir)
}

/// Parses and validates inventory text; `file` names the source in errors; `vars_dir`, if
/// given, is where `group_vars/` and `host_vars/` are read from.
pub fn import_text(
    text: &str,
    file: &str,
    vars_dir: Option<&Path>,
) -> Result<Inventory, InventoryError> {
    import_text_collecting(text, file, vars_dir)?.checked()
}

/// [`import_text`] keeping the problems in the inventory (see [`import_collecting`]).
pub fn import_text_collecting(
    text: &str,
    file: &str,
    vars_dir: Option<&Path>,
) -> Result<Inventory, InventoryError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let significant = text
        .lines()
        .map(str::trim)
        .any(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';') && l != "---");
    if !significant {
        return Err(InventoryError::Format {
            file: file.to_string(),
            message: "the inventory lists no hosts: every line is a comment or blank \
                      (Kubespray's sample inventories are: uncomment the hosts and their groups)"
                .into(),
        });
    }
    let inventory = match detect(text) {
        Format::Kprov => Inventory {
            file: file.to_string(),
            format: Format::Kprov,
            hosts: kprov::parse(text, file)?,
            settings: ClusterSettings::default(),
            mapped: vec![],
            unused: vec![],
            notes: vec![],
            problems: vec![],
        },
        f => kubespray::import_text(text, file, f, vars_dir)?,
    };
    let mut inventory = inventory;
    let problems = validate(&inventory.hosts);
    inventory.problems.extend(problems);
    Ok(inventory)
}

/// Reads, parses and validates an inventory; the hosts only.
pub fn load(path: &Path) -> Result<Vec<Host>, InventoryError> {
    Ok(import(path)?.plain_hosts())
}

/// Parses and validates inventory text; `file` names the source in errors.
pub fn parse(text: &str, file: &str) -> Result<Vec<Host>, InventoryError> {
    Ok(import_text(text, file, None)?.plain_hosts())
}

/// Detects the format by content: INI files open with a `[group]` header (or a bare host
/// line), JSON with `{`, kprov's YAML has a top-level `hosts:` key, any other YAML mapping is
/// an Ansible YAML inventory (`all:` or top-level groups).
pub fn detect(text: &str) -> Format {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut saw_yaml_key = false;
    let mut saw_indented_ini = false;
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') || line == "---" {
            continue;
        }
        if raw.starts_with(' ') || raw.starts_with('\t') {
            // Ansible reads INI lines with leading blanks as if they had none; an indented
            // `[group]` header or `host key=value` line is INI, not YAML.
            let ini_like = (line.starts_with('[') && line.ends_with(']') && !line.contains(", "))
                || (!line.contains(": ") && !line.ends_with(':') && !line.starts_with('-'));
            if !saw_yaml_key && ini_like {
                saw_indented_ini = true;
            }
            continue;
        }
        if line.starts_with('{') && !saw_yaml_key {
            return Format::AnsibleJson;
        }
        if line.starts_with('[') {
            return Format::KubesprayIni;
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
    if saw_yaml_key {
        Format::KubesprayYaml
    } else if saw_indented_ini {
        Format::KubesprayIni
    } else {
        Format::Kprov
    }
}

/// Which etcd topology valid hosts describe: stacked (kubeadm's default) when the etcd
/// hosts are exactly the control planes or there is no etcd host; external otherwise, with
/// etcd as a host service on the etcd hosts whatever other roles they have (Kubespray's
/// host-deployed etcd, e.g. the inventory builder's 2 control planes + 3 etcd hosts).
pub fn etcd_topology(hosts: &[Host]) -> EtcdType {
    let with = |r: HostRole| -> BTreeSet<&str> {
        hosts
            .iter()
            .filter(|h| h.roles.contains(&r))
            .map(|h| h.name.as_str())
            .collect()
    };
    let etcd = with(HostRole::Etcd);
    if etcd.is_empty() || etcd == with(HostRole::ControlPlane) {
        EtcdType::Stacked
    } else {
        EtcdType::External
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
            file: None,
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
            file: None,
            line: None,
            host: None,
            message: "no host has the control-plane role; at least one is required".into(),
        });
    }
    if hosts.is_empty() {
        problems.push(Problem {
            file: None,
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
            file: None,
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
    /// The taint's key (not empty).
    pub key: String,
    /// The value after `=`; `None` when the taint has none.
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// Parses `key[=value]:Effect`; the error says which part is wrong.
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
    use crate::spec::test_host as host;

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
        // Every line indented, headers too: still INI (Ansible strips the blanks).
        assert_eq!(
            detect("  [all]\n  node1 ansible_host=1.2.3.4\n  [kube_control_plane]\n  node1\n"),
            Format::KubesprayIni
        );
        assert_eq!(detect("  - name: a\n"), Format::Kprov);
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

#[cfg(test)]
pub(crate) use real::line_of as real_line_of;

#[cfg(test)]
impl Inventory {
    /// Asserts that one of the notes says `needle`.
    pub(crate) fn assert_note(&self, needle: &str) {
        assert!(
            self.notes.iter().any(|n| n.contains(needle)),
            "{needle:?} is in none of {:?}",
            self.notes
        );
    }
}

#[cfg(test)]
mod real {
    //! The 30 real inventories in `tests/fixtures/kubespray/real/` (origins in its ORIGIN.tsv).
    use super::*;

    /// `name roles address ip user port key bastion` of a host, `-` for unset.
    pub(crate) fn line_of(h: &Host) -> String {
        let roles: Vec<&str> = h
            .roles
            .iter()
            .map(|r| match r {
                HostRole::ControlPlane => "cp",
                HostRole::Node => "node",
                HostRole::Etcd => "etcd",
            })
            .collect();
        let o = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        let mut s = format!(
            "{} {} {} ip={} u={} p={} k={} b={}",
            h.name,
            roles.join(","),
            h.address,
            o(&h.ip),
            o(&h.user),
            h.port.map_or("-".into(), |p| p.to_string()),
            o(&h.key_path),
            o(&h.bastion)
        );
        if !h.labels.is_empty() {
            let l: Vec<String> = h.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push_str(&format!(" l={}", l.join(",")));
        }
        if !h.taints.is_empty() {
            s.push_str(&format!(" t={}", h.taints.join(",")));
        }
        s
    }

    enum Want {
        /// Host lines, then `var field value` of every mapped variable.
        Ok(&'static [&'static str], &'static [&'static str]),
        /// A substring of the error.
        Refused(&'static str),
    }

    #[test]
    fn every_real_inventory() {
        use Want::*;
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kubespray/real");
        const COMMENTED: &str = "the inventory lists no hosts";
        let table: &[(&str, Want)] = &[
            ("01-sample-inventory-HEAD.ini", Refused(COMMENTED)),
            (
                "02-sample-inventory-uncommented-fork.ini",
                Ok(
                    &[
                        "node1 cp,etcd 95.54.0.12 ip=- u=- p=- k=- b=-",
                        "node2 cp,etcd 95.54.0.13 ip=- u=- p=- k=- b=-",
                        "node3 cp,etcd 95.54.0.14 ip=- u=- p=- k=- b=-",
                        "node4 node 95.54.0.15 ip=- u=- p=- k=- b=-",
                        "node5 node 95.54.0.16 ip=- u=- p=- k=- b=-",
                        "node6 node 95.54.0.17 ip=- u=- p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "03-fork-user-inventory-kube_master.ini",
                Ok(
                    &[
                        "m1 etcd 192.168.14.221 ip=- u=root p=- k=/home/ihusyainov/.ssh/id_rsa b=-",
                        "m2 etcd 192.168.14.222 ip=- u=root p=- k=/home/ihusyainov/.ssh/id_rsa b=-",
                        "m3 etcd 192.168.14.223 ip=- u=root p=- k=/home/ihusyainov/.ssh/id_rsa b=-",
                        "n1 cp,node 192.168.14.224 ip=- u=root p=- k=/home/ihusyainov/.ssh/id_rsa b=-",
                        "n2 cp,node 192.168.14.225 ip=- u=root p=- k=/home/ihusyainov/.ssh/id_rsa b=-",
                    ],
                    &[],
                ),
            ),
            ("04-sample-inventory-2021.ini", Refused(COMMENTED)),
            ("05-sample-hosts-2019.ini", Refused(COMMENTED)),
            ("06-sample-hosts-2020.yaml", Refused(COMMENTED)),
            (
                "07-sample-inventory-2020.yml",
                Refused("hosts of group \"etcd\" is the text"),
            ),
            ("08-inventory-example-2018.ini", Refused(COMMENTED)),
            (
                "09-local-hosts.ini",
                Ok(&["node1 cp,node,etcd 127.0.0.1 ip=- u=- p=- k=- b=-"], &[]),
            ),
            (
                "10-mycluster-hosts.yaml",
                Ok(
                    &[
                        "node1 cp,node,etcd 10.200.10.50 ip=10.200.10.50 u=- p=- k=- b=-",
                        "node2 cp,node,etcd 10.200.10.51 ip=10.200.10.51 u=- p=- k=- b=-",
                        "node3 cp,node,etcd 10.200.10.52 ip=10.200.10.52 u=- p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "11-local-tests.cfg",
                Ok(&["node1 cp,node,etcd 127.0.0.1 ip=- u=- p=- k=- b=-"], &[]),
            ),
            (
                "12-inventory-builder-1-hosts.yaml",
                Ok(
                    &["node1 cp,node,etcd 10.10.1.3 ip=10.10.1.3 u=- p=- k=- b=-"],
                    &[],
                ),
            ),
            (
                "12-inventory-builder-2-hosts.yaml",
                Ok(
                    &[
                        "node1 cp,node,etcd 10.10.1.3 ip=10.10.1.3 u=- p=- k=- b=-",
                        "node2 cp,node 10.10.1.4 ip=10.10.1.4 u=- p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "12-inventory-builder-3-hosts.yaml",
                Ok(
                    &[
                        "node1 cp,node,etcd 10.10.1.3 ip=10.10.1.3 u=- p=- k=- b=-",
                        "node2 cp,node,etcd 10.10.1.4 ip=10.10.1.4 u=- p=- k=- b=-",
                        "node3 node,etcd 10.10.1.5 ip=10.10.1.5 u=- p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "12-inventory-builder-5-hosts.yaml",
                Ok(
                    &[
                        "node1 cp,node,etcd 10.10.1.3 ip=10.10.1.3 u=- p=- k=- b=-",
                        "node2 cp,node,etcd 10.10.1.4 ip=10.10.1.4 u=- p=- k=- b=-",
                        "node3 node,etcd 10.10.1.5 ip=10.10.1.5 u=- p=- k=- b=-",
                        "node4 node 10.10.1.6 ip=10.10.1.6 u=- p=- k=- b=-",
                        "node5 node 10.10.1.7 ip=10.10.1.7 u=- p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "13-python-discord-hosts.yaml",
                Ok(
                    &[
                        "hopper cp,node,etcd hopper.box.pydis.wtf ip=89.58.24.117 u=- p=- k=- b=-",
                        "turing cp,node,etcd turing.box.pydis.wtf ip=89.58.25.151 u=- p=- k=- b=-",
                        "lovelace node,etcd lovelace.box.pydis.wtf ip=89.58.26.118 u=- p=- k=- b=-",
                        "neumann node neumann.box.pydis.wtf ip=89.58.12.244 u=- p=- k=- b=-",
                        "ritchie node ritchie.box.pydis.wtf ip=89.58.25.224 u=- p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "14-ska-telescope-hosts.yaml",
                Ok(
                    &[
                        "node1 cp,node,etcd 192.168.100.23 ip=192.168.93.13 u=- p=- k=- b=-",
                        "node2 cp,node 192.168.100.26 ip=192.168.93.30 u=- p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "15-moabukar-hosts.yaml",
                Ok(
                    &[
                        "node1 cp,node,etcd 192.168.50.11 ip=192.168.50.11 u=- p=- k=- b=-",
                        "node2 node 192.168.50.21 ip=192.168.50.21 u=- p=- k=- b=-",
                        "node3 node 192.168.50.22 ip=192.168.50.22 u=- p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "16-llaoj-inventory.ini",
                Ok(
                    &[
                        "hde-ceno-1 cp,node,etcd 10.206.65.152 ip=- u=- p=- k=- b=-",
                        "hde-ceno-2 cp,node,etcd 10.206.65.153 ip=- u=- p=- k=- b=-",
                        "hde-ceno-3 node,etcd 10.206.65.154 ip=- u=- p=- k=- b=-",
                        "hde-ceno-4 node 10.206.65.155 ip=- u=- p=- k=- b=-",
                        "hde-ceno-5 node 10.206.65.156 ip=- u=- p=- k=- b=-",
                        "hde-ceno-6 node 10.206.65.157 ip=- u=- p=- k=- b=-",
                        "hde-ceno-7 node 10.206.65.193 ip=- u=- p=- k=- b=-",
                        "hde-ceno-8 node 10.206.65.194 ip=- u=- p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "17-basilelt-inventory.ini",
                Ok(
                    &[
                        "master1 cp,node,etcd master1.basile.local ip=10.30.1.12 u=root p=- k=- b=-",
                        "master2 cp,node,etcd master2.basile.local ip=10.30.1.13 u=root p=- k=- b=-",
                        "master3 cp,node,etcd master3.basile.local ip=10.30.1.14 u=root p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "18-kosenuel-hosts.yaml",
                Ok(
                    &[
                        "k8s-cp-1 cp,etcd 10.0.1.143 ip=10.0.1.143 u=- p=- k=- b=-",
                        "k8s-cp-2 cp,etcd 10.0.1.58 ip=10.0.1.58 u=- p=- k=- b=-",
                        "k8s-cp-3 cp,etcd 10.0.1.185 ip=10.0.1.185 u=- p=- k=- b=-",
                        "k8s-worker-1 node 10.0.1.44 ip=10.0.1.44 u=- p=- k=- b=-",
                        "k8s-worker-2 node 10.0.1.169 ip=10.0.1.169 u=- p=- k=- b=-",
                        "k8s-worker-3 node 10.0.1.19 ip=10.0.1.19 u=- p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "19-egorvit-inventory.ini",
                Ok(
                    &[
                        "master cp,etcd 192.168.64.8 ip=192.168.64.8 u=- p=- k=- b=-",
                        "work1 node 192.168.64.9 ip=192.168.64.9 u=- p=- k=- b=-",
                        "work2 node 192.168.64.10 ip=192.168.64.10 u=- p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "20-dmitriy-py-hosts.yaml",
                Ok(
                    &[
                        "master cp,etcd 93.77.180.95 ip=10.10.1.21 u=- p=- k=- b=-",
                        "worker-0 node 10.10.2.14 ip=10.10.2.14 u=- p=- k=- b=-",
                        "worker-1 node 10.10.3.28 ip=10.10.3.28 u=- p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "21-kariyer-node-labels.ini",
                Ok(
                    &[
                        "master cp,etcd 172.24.34.20 ip=- u=<your-user> p=22 k=- b=- l=type=master",
                        "worker node 172.24.34.21 ip=- u=<your-user> p=22 k=- b=- l=type=worker",
                    ],
                    &[],
                ),
            ),
            (
                "22-netology-inline-comments.ini",
                Ok(
                    &[
                        "control-node-subnet-a cp,etcd 158.160.110.213 ip=- u=- p=- k=- b=-",
                        "control-node-subnet-b cp,etcd 51.250.19.103 ip=- u=- p=- k=- b=-",
                        "control-node-subnet-d cp,etcd 51.250.34.28 ip=- u=- p=- k=- b=-",
                        "worker-node-1 node 84.201.175.124 ip=- u=- p=- k=- b=-",
                        "worker-node-2 node 89.169.182.144 ip=- u=- p=- k=- b=-",
                    ],
                    &[
                        "supplementary_addresses_in_ssl_keys spec.api.additionalSANs 158.160.110.213",
                    ],
                ),
            ),
            (
                "23-terraform-aws-output-bastion.ini",
                Ok(
                    &[
                        "kubernetes-production-master0 cp 10.250.192.138 ip=- u=- p=- k=- b=54.209.28.146",
                        "kubernetes-production-worker0 node 10.250.195.240 ip=- u=- p=- k=- b=54.209.28.146",
                        "kubernetes-production-worker1 node 10.250.217.196 ip=- u=- p=- k=- b=54.209.28.146",
                        "kubernetes-production-worker2 node 10.250.202.109 ip=- u=- p=- k=- b=54.209.28.146",
                        "kubernetes-production-etcd0 etcd 10.250.203.28 ip=- u=- p=- k=- b=54.209.28.146",
                    ],
                    &[
                        "apiserver_loadbalancer_domain_name spec.api.additionalSANs kubernetes-elb-production-1927665643.us-east-1.elb.amazonaws.com",
                    ],
                ),
            ),
            (
                "24-cn-doc-bastion.ini",
                Ok(
                    &[
                        "kube-master01 cp,etcd 192.168.10.41 ip=- u=- p=- k=- b=root@192.168.10.40",
                        "kube-master02 cp,etcd 192.168.10.42 ip=- u=- p=- k=- b=root@192.168.10.40",
                        "kube-master03 cp,etcd 192.168.10.43 ip=- u=- p=- k=- b=root@192.168.10.40",
                        "kube-node01 node 192.168.10.44 ip=- u=- p=- k=- b=root@192.168.10.40",
                        "kube-node02 node 192.168.10.45 ip=- u=- p=- k=- b=root@192.168.10.40",
                        "kube-node03 node 192.168.10.46 ip=- u=- p=- k=- b=root@192.168.10.40",
                        "kube-node04 node 192.168.10.47 ip=- u=- p=- k=- b=root@192.168.10.40",
                    ],
                    &[],
                ),
            ),
            (
                "25-kubespray-docs-inventory-md-example.ini",
                Ok(
                    &[
                        "node1 cp,etcd 95.54.0.12 ip=10.3.0.1 u=- p=- k=- b=-",
                        "node2 cp,node,etcd 95.54.0.13 ip=10.3.0.2 u=- p=- k=- b=-",
                        "node3 node,etcd 95.54.0.14 ip=10.3.0.3 u=- p=- k=- b=-",
                        "node4 node 95.54.0.15 ip=10.3.0.4 u=- p=- k=- b=-",
                        "node5 node 95.54.0.16 ip=10.3.0.5 u=- p=- k=- b=-",
                        "node6 node 95.54.0.17 ip=10.3.0.6 u=- p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "26-kubespray-docs-nodes-md-example.yaml",
                Ok(
                    &[
                        "node-1 cp,node,etcd node-1 ip=- u=- p=- k=- b=-",
                        "node-2 cp,node,etcd node-2 ip=- u=- p=- k=- b=-",
                        "node-3 cp,node,etcd node-3 ip=- u=- p=- k=- b=-",
                    ],
                    &[],
                ),
            ),
            (
                "27-circleci-node-role-labels.ini",
                Ok(
                    &[
                        "k8s-master-01 cp,node,etcd 192.168.1.49 ip=- u=root p=- k=- b=-",
                        "k8s-worker-01 node 192.168.2.8 ip=- u=root p=- k=- b=- l=node-role.kubernetes.io/worker=",
                        "k8s-worker-02 node 192.168.1.48 ip=- u=root p=- k=- b=- l=node-role.kubernetes.io/worker=",
                    ],
                    &[],
                ),
            ),
        ];
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".tsv") && !n.ends_with(".md"))
            .collect();
        files.sort();
        let bastion = import(&dir.join("23-terraform-aws-output-bastion.ini")).unwrap();
        bastion.assert_note("host \"bastion\": ansible_host is set again (\"54.209.28.146\" replaces \"54.89.80.238\"");
        let listed: Vec<String> = table.iter().map(|(f, _)| f.to_string()).collect();
        assert_eq!(files, listed, "every fixture has a row");
        for (file, want) in table {
            let got = import(&dir.join(file));
            match (want, got) {
                (Ok(hosts, mapped), Result::Ok(inv)) => {
                    let lines: Vec<String> = inv.hosts.iter().map(|l| line_of(&l.host)).collect();
                    assert_eq!(lines, *hosts, "{file}");
                    let m: Vec<String> = inv
                        .mapped
                        .iter()
                        .map(|m| format!("{} {} {}", m.var, m.field, m.value))
                        .collect();
                    assert_eq!(m, *mapped, "{file}");
                }
                (Refused(what), Err(e)) => {
                    let e = e.to_string();
                    assert!(e.contains(what), "{file}: {e}");
                    assert!(e.contains(file), "{file}: the error names the file: {e}");
                }
                (Ok(..), Err(e)) => panic!("{file}: refused: {e}"),
                (Refused(what), Result::Ok(_)) => panic!("{file}: accepted, expected {what:?}"),
            }
        }
    }
}

#[cfg(test)]
mod corpus {
    //! Kubespray-style inventories written for these tests (`tests/fixtures/kubespray/corpus/`)
    //! and the inventory builder's layouts for 1 to 5 hosts.
    use super::real::line_of;
    use super::*;
    use crate::test_files::{tree, write};

    fn dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kubespray/corpus")
    }

    fn lines(inv: &Inventory) -> Vec<String> {
        inv.hosts.iter().map(|l| line_of(&l.host)).collect()
    }

    fn mapped(inv: &Inventory) -> Vec<String> {
        inv.mapped
            .iter()
            .map(|m| format!("{} {} {}", m.var, m.field, m.value))
            .collect()
    }

    /// Imports `file` of the corpus, checks its format, host lines and mapped variables, and
    /// returns it for the test's own checks.
    fn import_as(
        file: &str,
        format: Format,
        want_lines: &[impl AsRef<str>],
        want_mapped: &[&str],
    ) -> Inventory {
        let inv = import(&dir().join(file)).unwrap();
        assert_eq!(inv.format, format);
        let want_lines: Vec<&str> = want_lines.iter().map(AsRef::as_ref).collect();
        assert_eq!(lines(&inv), want_lines);
        assert_eq!(mapped(&inv), want_mapped);
        inv
    }

    #[test]
    fn directory_with_group_vars_and_host_vars_in_ansible_order() {
        let inv = import_as(
            "mycluster",
            Format::KubesprayYaml,
            &[
                "node1 cp,etcd 198.18.10.1 ip=10.0.0.1 u=from-k8s-cluster p=2201 k=~/.ssh/cluster_key b=-",
                "node2 cp,etcd 198.18.10.2 ip=10.0.0.2 u=from-k8s-cluster p=2201 k=~/.ssh/cluster_key b=-",
                "node3 cp,etcd 198.18.10.3 ip=10.0.0.3 u=from-host-vars p=2203 k=~/.ssh/cluster_key b=-",
                "node4 node 198.18.10.4 ip=10.0.0.4 u=from-kube-node p=2201 k=~/.ssh/cluster_key b=- \
                 l=disk=ssd t=from-inventory=group:NoSchedule",
            ],
            &[
                "kube_version spec.kubernetesVersion 1.35.1",
                "kube_network_plugin spec.networking.cni cilium",
                "kube_pods_subnet spec.networking.podCIDR 10.244.0.0/16",
                "kube_service_addresses spec.networking.serviceCIDR 10.96.0.0/16",
                "kube_proxy_mode spec.kubeProxy.proxyMode iptables",
                "supplementary_addresses_in_ssl_keys spec.api.additionalSANs k8s.example.com",
                "supplementary_addresses_in_ssl_keys spec.api.additionalSANs 203.0.113.10",
            ],
        );
        assert!(inv.file.ends_with("mycluster/hosts.yaml"), "{}", inv.file);
        let k8s = "group_vars/k8s_cluster/k8s-cluster.yml";
        let at = |v: &str| {
            inv.mapped
                .iter()
                .find(|m| m.var == v)
                .map(|m| (m.at.file.ends_with(k8s), m.at.line))
        };
        assert_eq!(at("kube_version"), Some((true, 1)));
        assert_eq!(at("kube_pods_subnet"), Some((true, 4)));
        let unused: Vec<String> = inv
            .unused
            .iter()
            .map(|u| {
                let file = u.at.file.rsplit("mycluster/").next().unwrap_or_default();
                format!("{} {file}:{}", u.var, u.at.line)
            })
            .collect();
        assert_eq!(
            unused,
            vec![
                "bin_dir group_vars/all/all.yml:5",
                "loadbalancer_apiserver_port group_vars/all/all.yml:6",
            ]
        );
        let warning = inv.unused_warning().unwrap();
        assert!(
            warning.contains("2 inventory variable(s) not used by kprov"),
            "{warning}"
        );
        assert_eq!(
            inv.settings.proxy_mode.as_ref().map(|m| m.0),
            Some(crate::spec::ProxyMode::Iptables)
        );
        assert!(
            inv.mapped
                .iter()
                .any(|m| m.var == "kube_proxy_mode" && m.field == "spec.kubeProxy.proxyMode")
        );
        inv.assert_note("container_manager: containerd");
    }

    #[test]
    fn ini_quotes_bom_comments_literals_and_proxycommand() {
        let b = "b=jump@203.0.113.5:2022";
        let inv = import_as(
            "quotes-bom.ini",
            Format::KubesprayIni,
            &[
                format!("cp1 cp,etcd 198.18.11.1 ip=10.1.0.1 u=ubuntu p=- k=- {b}"),
                format!("w1 node 198.18.11.2 ip=- u=ops p=- k=- {b} l=disk=nvme,zone=a"),
                format!("w2 node 198.18.11.3 ip=- u=ubuntu p=- k=- {b} l=role=worker"),
                format!(
                    "w3 node 198.18.11.4 ip=- u=ubuntu p=2222 k=- {b} l=role=worker \
                     t=gpu=true:NoSchedule"
                ),
            ],
            &["kube_network_plugin spec.networking.cni flannel"],
        );
        inv.assert_note("does not pass -o StrictHostKeyChecking=no");
        assert!(inv.unused.is_empty(), "{:?}", inv.unused);
    }

    #[test]
    fn yaml_without_all_and_proxyjump_and_api_load_balancer() {
        import_as(
            "no-all.yaml",
            Format::KubesprayYaml,
            &[
                "cp1 cp,etcd 198.18.12.1 ip=- u=admin p=- k=- b=-",
                "w1 node 198.18.12.2 ip=- u=- p=- k=- b=bastion@203.0.113.6:2200",
            ],
            &[
                "loadbalancer_apiserver spec.api.endpoint api.example.com:8443",
                // Kubespray's /etc/hosts line and SAN for the address: kept (issue 20).
                "loadbalancer_apiserver.address spec.api.endpointAddress 10.2.0.100",
                "loadbalancer_apiserver.address spec.api.additionalSANs 10.2.0.100",
                "apiserver_loadbalancer_domain_name spec.api.additionalSANs api.example.com",
            ],
        );
    }

    #[test]
    fn ansible_json_script_format() {
        import_as(
            "script.json",
            Format::AnsibleJson,
            &[
                "cp1 cp,etcd 198.18.13.1 ip=- u=core p=- k=- b=-",
                "w1 node 198.18.13.2 ip=- u=debian p=2200 k=- b=-",
                "w2 node 198.18.13.3 ip=- u=debian p=- k=/keys/w2 b=-",
            ],
            &["kube_version spec.kubernetesVersion 1.35.1"],
        );
    }

    /// What Kubespray's `contrib/inventory_builder/inventory.py` writes for `n` hosts: one
    /// control plane for 1 host, two for 2 or more; etcd on the first host, then on three.
    fn builder(n: usize) -> String {
        let names: Vec<String> = (1..=n).map(|i| format!("node{i}")).collect();
        let mut s = String::from("all:\n  hosts:\n");
        for (i, h) in names.iter().enumerate() {
            let ip = format!("10.10.1.{}", i + 3);
            s.push_str(&format!(
                "    {h}:\n      ansible_host: {ip}\n      ip: {ip}\n      access_ip: {ip}\n"
            ));
        }
        let group = |s: &mut String, name: &str, hosts: &[String]| {
            s.push_str(&format!("    {name}:\n      hosts:\n"));
            for h in hosts {
                s.push_str(&format!("        {h}:\n"));
            }
        };
        s.push_str("  children:\n");
        group(&mut s, "kube_control_plane", &names[..n.min(2)]);
        group(&mut s, "kube_node", &names);
        group(&mut s, "etcd", &names[..if n >= 3 { 3 } else { 1 }]);
        s.push_str(
            "    k8s_cluster:\n      children:\n        kube_control_plane:\n        kube_node:\n    calico_rr:\n      hosts: {}\n",
        );
        s
    }

    #[test]
    fn inventory_builder_layouts_1_to_5_hosts() {
        let one = import_text(&builder(1), "b1.yaml", None).unwrap();
        assert_eq!(
            lines(&one),
            vec!["node1 cp,node,etcd 10.10.1.3 ip=10.10.1.3 u=- p=- k=- b=-"]
        );
        // Two control planes with one etcd member, and 2 control planes + 3 etcd hosts (etcd
        // on the first three hosts): external etcd, a host service beside the other roles.
        for n in 2..=5 {
            let inv = import_text(&builder(n), "b.yaml", None).unwrap();
            assert_eq!(etcd_topology(&inv.plain_hosts()), EtcdType::External, "{n}");
            let etcd: Vec<&str> = inv
                .hosts
                .iter()
                .filter(|l| l.host.roles.contains(&HostRole::Etcd))
                .map(|l| l.host.name.as_str())
                .collect();
            let want: &[&str] = if n >= 3 {
                &["node1", "node2", "node3"]
            } else {
                &["node1"]
            };
            assert_eq!(etcd, want, "{n}");
            assert_eq!(inv.hosts.len(), n);
        }
        // An even etcd group is refused naming its members (quorum).
        let even = builder(4).replace(
            "    etcd:\n      hosts:\n        node1:\n        node2:\n        node3:\n",
            "    etcd:\n      hosts:\n        node1:\n        node2:\n        node3:\n        node4:\n",
        );
        let err = import_text(&even, "b4.yaml", None).unwrap_err().to_string();
        assert!(
            err.contains("external etcd runs on the etcd hosts and there are 4: node1 (line"),
            "{err}"
        );
        // The builder's 3-host layout with node3 made a control plane imports: stacked etcd.
        let fixed = builder(3).replace(
            "    kube_control_plane:\n      hosts:\n        node1:\n        node2:\n",
            "    kube_control_plane:\n      hosts:\n        node1:\n        node2:\n        node3:\n",
        );
        let inv = import_text(&fixed, "b3.yaml", None).unwrap();
        assert_eq!(etcd_topology(&inv.plain_hosts()), EtcdType::Stacked);
        assert_eq!(inv.hosts.len(), 3);
    }

    #[test]
    fn errors_point_at_the_variable_line() {
        let text = "[all]\nn1 ansible_host=198.18.0.1\n[kube_control_plane]\nn1\n[etcd]\nn1\n\
                    [all:vars]\nansible_user=root\nansible_port='ssh'\n";
        let err = import_text(text, "i.ini", None).unwrap_err().to_string();
        assert_eq!(
            err,
            "i.ini: invalid inventory:\n  i.ini:9: host \"n1\": ansible_port: \"ssh\" is not a port number"
        );
        let text = "[all]\nn1\n[kube_control_plane]\nn1\n[all:vars]\nansible_host={{ lookup('env', 'IP') }}\n";
        let err = import_text(text, "i.ini", None).unwrap_err().to_string();
        assert!(
            err.contains("\n  i.ini:6: host \"n1\": ansible_host:"),
            "{err}"
        );
        assert!(err.contains("Jinja template"), "{err}");
        let text = "[all]\nn1\n[kube_control_plane]\nn1\n[k8s_cluster:children]\nkube_control_plane\n\
                    [k8s_cluster:vars]\nkube_proxy_mode=ipvs\nkube_proxy_conntrack_max_per_core=0\n";
        let inv = import_text(text, "i.ini", None).unwrap();
        assert_eq!(
            inv.settings.proxy_mode.as_ref().map(|m| (m.0, m.1.line)),
            Some((crate::spec::ProxyMode::Ipvs, 8))
        );
        assert_eq!(
            inv.settings.conntrack_max_per_core.as_ref().map(|m| m.0),
            Some(0)
        );
        // Each refused at its line, the variable named.
        for (text, needle) in [
            (
                "[all]\nn1\n[kube_control_plane]\nn1\n[k8s_cluster:children]\nkube_control_plane\n\
                 [k8s_cluster:vars]\nkube_proxy_mode=userspace\n",
                "\n  i.ini:8: kube_proxy_mode: \"userspace\" is not a kube-proxy mode",
            ),
            (
                "[all]\nn1\n[kube_control_plane]\nn1\n[all:vars]\nkube_proxy_conntrack_max_per_core=lots\n",
                "\n  i.ini:6: kube_proxy_conntrack_max_per_core: \"lots\"",
            ),
            (
                "[all]\nn1\n[kube_control_plane]\nn1\n[all:vars]\ncontainer_manager=crio\n",
                "\n  i.ini:6: container_manager",
            ),
            (
                "[all]\nn1 kube_version=1.35.1\nn2 kube_version=1.34.0\n[kube_control_plane]\nn1\nn2\nn3\n",
                "must be the same on every host",
            ),
            (
                "[all]\nn1 ansible_connection=docker\n[kube_control_plane]\nn1\n",
                "ansible_connection=docker is not supported",
            ),
            (
                "[all]\nn1 ansible_become_user=deploy\n[kube_control_plane]\nn1\n",
                "\n  i.ini:2: host \"n1\": ansible_become_user",
            ),
        ] {
            let err = import_text(text, "i.ini", None).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn directory_lookup() {
        let tmp = tempfile::tempdir().unwrap();
        let err = import(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("without an inventory file"), "{err}");
        write(tmp.path(), "inventory.ini", "[kube_control_plane]\nn1\n");
        let inv = import(tmp.path()).unwrap();
        assert!(inv.file.ends_with("inventory.ini"));
        write(tmp.path(), "hosts.yaml", "all: {}\n");
        let err = import(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("several inventory files"), "{err}");
        write(
            tmp.path(),
            "big.ini",
            vec![b'#'; (MAX_INVENTORY_BYTES + 1) as usize],
        );
        let err = import(&tmp.path().join("big.ini")).unwrap_err().to_string();
        assert!(err.contains("larger than"), "{err}");
    }

    #[test]
    fn vault_files_are_reported_not_read() {
        let tmp = tree(&[
            ("group_vars/all.yml", "$ANSIBLE_VAULT;1.1;AES256\n6162\n"),
            ("hosts.ini", "[kube_control_plane]\nn1\n"),
        ]);
        let inv = import(tmp.path()).unwrap();
        assert_eq!(inv.unused.len(), 1);
        assert!(inv.unused[0].to_string().contains("ansible-vault"));
    }

    /// Kubespray's proxy and mirror variables, with its own semantics: `no_proxy` and
    /// `additional_no_proxy` add to the list kprov completes; `containerd_registries_mirrors`
    /// becomes spec.containerd.registries; what cannot be honoured is refused at its line.
    #[test]
    fn kubespray_proxy_and_mirrors_map_to_the_spec() {
        let text = "all:\n  hosts:\n    n1: {ansible_host: 198.18.0.1}\n  children:\n    kube_control_plane:\n      hosts: {n1: }\n  vars:\n    \
                    http_proxy: http://proxy.corp:3128\n    https_proxy: http://proxy.corp:3128\n    no_proxy: .corp,10.0.0.0/8\n    \
                    additional_no_proxy: registry.corp\n    containerd_registries_mirrors:\n      - prefix: docker.io\n        mirrors:\n          \
                    - host: https://mirror.corp\n            capabilities: [pull, resolve]\n            skip_verify: false\n          \
                    - host: https://cache.corp/v2/hub\n            capabilities: [pull]\n            skip_verify: true\n            override_path: true\n      \
                    - prefix: registry.k8s.io\n        mirrors:\n          - host: https://mirror.corp\n";
        let inv = import_text(text, "i.yaml", None).unwrap();
        let (proxy, at) = inv.settings.proxy.clone().unwrap();
        assert_eq!(at.line, 8);
        assert_eq!(proxy.http.as_deref(), Some("http://proxy.corp:3128"));
        assert_eq!(proxy.https.as_deref(), Some("http://proxy.corp:3128"));
        assert_eq!(proxy.no_proxy, [".corp", "10.0.0.0/8", "registry.corp"]);
        let regs: Vec<&crate::spec::Registry> =
            inv.settings.registries.iter().map(|r| &r.0).collect();
        assert_eq!(regs.len(), 2);
        assert_eq!(regs[0].name, "docker.io");
        assert_eq!(regs[0].mirrors[0].endpoint, "https://mirror.corp");
        assert_eq!(regs[0].mirrors[0].skip_verify, None);
        assert_eq!(regs[0].mirrors[1].capabilities, ["pull"]);
        assert_eq!(regs[0].mirrors[1].skip_verify, Some(true));
        assert_eq!(regs[0].mirrors[1].override_path, Some(true));
        assert_eq!(regs[1].name, "registry.k8s.io");
        assert_eq!(inv.settings.registries[0].1.line, 12);
        assert!(
            inv.mapped
                .iter()
                .any(|m| m.var == "containerd_registries_mirrors"
                    && m.field == "spec.containerd.registries")
        );
        assert!(
            inv.unused.iter().all(|u| !u.var.contains("proxy")),
            "{:?}",
            inv.unused
        );

        // What kprov cannot honour, at the variable's line: a foreign server, an unknown
        // mirror key, a proxy that is not a URL, credentials in the inventory.
        let text = "all:\n  hosts:\n    n1: {ansible_host: 198.18.0.1}\n  children:\n    kube_control_plane:\n      hosts: {n1: }\n  vars:\n    \
                    http_proxy: proxy.corp:3128\n    containerd_registries_mirrors:\n      - prefix: quay.io\n        server: https://elsewhere.corp\n        \
                    mirrors:\n          - host: https://mirror.corp\n            header: {X: y}\n    \
                    containerd_registry_auth:\n      - registry: mirror.corp\n        username: u\n        password: hunter2\n";
        let err = import_text(text, "i.yaml", None).unwrap_err().to_string();
        assert!(
            err.contains("\n  i.yaml:8: http_proxy: \"proxy.corp:3128\" is not an http://"),
            "{err}"
        );
        // The whole sentence, in one line: continuation lines once leaked 30 spaces into it.
        assert!(
            err.contains(
                "\n  i.yaml:9: containerd_registries_mirrors: quay.io: server \
                 \"https://elsewhere.corp\" is not the registry's own server (https://quay.io); \
                 kprov keeps the upstream as the last resort (or none: \
                 spec.containerd.registries[].fallback: false)\n"
            ),
            "{err}"
        );
        assert!(
            err.contains(
                "\n  i.yaml:9: containerd_registries_mirrors: quay.io: mirror 0: header: \
                 {\"X\":true} is not something kprov maps (host, capabilities, skip_verify, \
                 override_path)"
            ),
            "{err}"
        );
        assert!(
            err.contains(
                "\n  i.yaml:15: containerd_registry_auth: registry passwords are not kept"
            ),
            "{err}"
        );
        assert!(!err.contains("hunter2"), "{err}");
        // A server that is not a string is named as such, not compared as an empty one.
        let text = "all:\n  hosts:\n    n1: {ansible_host: 198.18.0.1}\n  children:\n    kube_control_plane:\n      hosts: {n1: }\n  vars:\n    \
                    containerd_registries_mirrors:\n      - prefix: quay.io\n        server: 5\n";
        let err = import_text(text, "i.yaml", None).unwrap_err().to_string();
        assert!(
            err.contains(
                "i.yaml:8: containerd_registries_mirrors: quay.io: server 5 is not a URL (a string)"
            ),
            "{err}"
        );

        // no_proxy without a proxy asks for nothing: a note, no spec field.
        let text = "[all]\nn1\n[kube_control_plane]\nn1\n[all:vars]\nno_proxy=.corp\n";
        let inv = import_text(text, "i.ini", None).unwrap();
        assert!(inv.settings.proxy.is_none());
        inv.assert_note("i.ini:6: no_proxy: without http_proxy");
    }
}
