//! `create cluster`: the Cluster and InstanceGroups a request (the flags, an inventory)
//! stands for, checked as a whole ([`plan`]), then stored once under the cluster's lock
//! ([`apply`]). The choices are made here: the kops layout on AWS (a subnet per zone, a
//! control-plane group per instance), the groups an inventory's hosts make on metal, which
//! inventory variables become spec fields and which flags override them, Kubespray's own
//! defaults for a Kubespray inventory, and every refusal (naming the flag, or the inventory
//! file and line).

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::bounded;
use crate::inventory::Inventory;
use crate::repo::{Repo, resolve_with_docs};
use crate::spec::defaults::{
    DEFAULT_NETWORK_CIDR, DEFAULT_POD_CIDR, DEFAULT_SERVICE_CIDR, new_instance_group,
    region_of_zone,
};
use crate::spec::*;

/// Reads `create cluster --inventory`'s file (kprov's or Kubespray's), every problem found
/// in it reported at once.
pub(crate) fn import_inventory(path: &Path) -> Result<Inventory, crate::inventory::InventoryError> {
    crate::inventory::import_collecting(path)
}

/// What `create cluster` is asked for, in the model's terms (the command line's flags
/// without their parsing). `None` leaves a choice to kprov's default.
#[derive(Debug, Clone)]
pub(crate) struct ClusterRequest {
    pub name: String,
    pub cloud: CloudProvider,
    pub zones: Vec<String>,
    pub control_plane_zones: Vec<String>,
    pub control_plane_count: u32,
    pub control_plane_size: Option<String>,
    pub node_count: u32,
    pub node_size: Option<String>,
    pub image: Option<String>,
    pub kubernetes_version: Option<String>,
    pub networking: Option<Cni>,
    pub topology: TopologyType,
    pub bastion: bool,
    pub dns_zone: Option<String>,
    pub dns: Option<DnsType>,
    pub api_loadbalancer_type: Option<LoadBalancerType>,
    pub etcd: Option<EtcdType>,
    pub network_cidr: Option<String>,
    pub network_id: Option<String>,
    pub pod_cidr: Option<String>,
    pub service_cidr: Option<String>,
    /// The inventory's path (metal): given or not decides what is refused.
    pub inventory: Option<PathBuf>,
}

/// A flag problem, reported like a spec error against the flag name.
#[derive(Debug, thiserror::Error)]
#[error("--{flag}: {message}")]
pub(crate) struct FlagError {
    pub flag: &'static str,
    pub message: String,
}

fn flag_err(flag: &'static str, message: impl Into<String>) -> FlagError {
    FlagError {
        flag,
        message: message.into(),
    }
}

/// The zones of `--zones`, trimmed and de-duplicated: each an availability zone name
/// (`REGION` and one letter, like us-east-1a), all in one region. Whether a zone really exists
/// is asked of EC2 when the cluster is planned (`update cluster`), before anything is created.
fn check_zones(given: &[String]) -> Result<Vec<String>, FlagError> {
    let mut zones: Vec<String> = Vec::new();
    let mut region: Option<(String, String)> = None;
    for z in given {
        let z = z.trim().to_string();
        let r = region_of_zone(&z)
            .filter(|r| {
                let rest = &z[r.len()..];
                rest.len() == 1 && rest.bytes().all(|b| b.is_ascii_lowercase())
            })
            .filter(|r| {
                r.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            })
            .ok_or_else(|| {
                flag_err(
                    "zones",
                    format!("{z:?} is not an availability zone like us-east-1a"),
                )
            })?;
        match &region {
            Some((first, fz)) if *first != r => {
                return Err(flag_err(
                    "zones",
                    format!(
                        "{z} is in region {r} but {fz} is in {first}: a cluster's zones are all \
                         in one region"
                    ),
                ));
            }
            Some(_) => {}
            None => region = Some((r, z.clone())),
        }
        if !zones.contains(&z) {
            zones.push(z);
        }
    }
    Ok(zones)
}

fn ig_spec(
    role: InstanceGroupRole,
    machine_type: Option<String>,
    image: Option<String>,
    size: u32,
    subnets: Vec<String>,
) -> InstanceGroupSpec {
    InstanceGroupSpec {
        role,
        machine_type,
        image,
        min_size: Some(size),
        max_size: Some(size),
        subnets,
        rolling_update: None,
        node_labels: BTreeMap::new(),
        taints: Vec::new(),
        ssh_user: None,
    }
}

/// Builds the objects `create cluster` stores. `hosts` is the parsed inventory for metal.
/// `ssh_public_key` is the key text already read from disk.
pub(crate) fn build_cluster_objects(
    a: &ClusterRequest,
    hosts: Vec<Host>,
    ssh_public_key: Option<String>,
) -> Result<(Cluster, Vec<InstanceGroup>), FlagError> {
    // The one dot of a fully qualified name (`demo.example.com.`) is dropped; anything else
    // stays as given, so `..` is refused as `..`, not as an empty name.
    let name = match a.name.strip_suffix('.') {
        Some(n) if !n.is_empty() && !n.ends_with('.') => n.to_string(),
        _ => a.name.clone(),
    };
    let aws = a.cloud == CloudProvider::Aws;
    let has_key = ssh_public_key.is_some();
    let mut spec = ClusterSpec {
        // Choices made at creation are pinned in the user's spec, so a newer kprov with newer
        // defaults never changes an existing cluster behind its owner's back.
        kubernetes_version: Some(
            a.kubernetes_version
                .clone()
                .unwrap_or_else(|| crate::spec::versions::DEFAULT_KUBERNETES_VERSION.into()),
        ),
        networking: Networking {
            network_cidr: a.network_cidr.clone(),
            network_id: a.network_id.clone(),
            subnets: Vec::new(),
            pod_cidr: Some(
                a.pod_cidr
                    .clone()
                    .unwrap_or_else(|| DEFAULT_POD_CIDR.into()),
            ),
            service_cidr: Some(
                a.service_cidr
                    .clone()
                    .unwrap_or_else(|| DEFAULT_SERVICE_CIDR.into()),
            ),
            cni: Some(a.networking.unwrap_or(Cni::Calico)),
        },
        // Public/private subnets and bastions are cloud networking; metal hosts have neither.
        topology: aws.then(|| Topology {
            kind: a.topology,
            bastion: a.bastion.then(Bastion::default),
            ssh_address: None,
        }),
        etcd: a.etcd.map(|kind| Etcd { kind }),
        ssh_key: ssh_public_key.map(|k| SshKey {
            name: None,
            public_key: Some(k.trim().to_string()),
        }),
        // The rest is what the create flags do not choose: absent in the written spec, so
        // the user's own edits (or `resolve`'s defaults) decide it. A new flag sets its field
        // above.
        ..ClusterSpec::new(a.cloud)
    };
    if a.dns.is_some() || a.dns_zone.is_some() {
        spec.dns = Some(Dns {
            kind: a.dns.unwrap_or(DnsType::Public),
            zone: a
                .dns_zone
                .clone()
                .map(|z| z.trim_end_matches('.').to_string()),
        });
    }
    if let Some(kind) = a.api_loadbalancer_type {
        spec.api = Some(Api {
            load_balancer: Some(LoadBalancer { kind }),
            ..Default::default()
        });
    }

    let mut groups = Vec::new();
    if aws {
        if !hosts.is_empty() || a.inventory.is_some() {
            return Err(flag_err(
                "inventory",
                "an inventory is only for --cloud metal",
            ));
        }
        if a.zones.is_empty() {
            return Err(flag_err(
                "zones",
                "at least one zone is required for --cloud aws (e.g. --zones us-east-1a,us-east-1b)",
            ));
        }
        let zones = check_zones(&a.zones)?;
        let net_text = a
            .network_cidr
            .clone()
            .unwrap_or_else(|| DEFAULT_NETWORK_CIDR.to_string());
        spec.networking.network_cidr = Some(net_text.clone());
        let net: ipnet::Ipv4Net = net_text
            .parse()
            .map_err(|_| flag_err("network-cidr", format!("{net_text:?} is not an IPv4 CIDR")))?;
        let private = a.topology == TopologyType::Private;
        let (node_cidrs, util_cidrs) = cidr::kops_layout(net.trunc(), zones.len(), private)
            .map_err(|e| flag_err("network-cidr", e.to_string()))?;
        for (z, c) in zones.iter().zip(&node_cidrs) {
            spec.networking.subnets.push(Subnet {
                name: z.clone(),
                zone: z.clone(),
                cidr: c.to_string(),
                kind: if private {
                    SubnetType::Private
                } else {
                    SubnetType::Public
                },
                id: None,
            });
        }
        for (z, c) in zones.iter().zip(&util_cidrs) {
            spec.networking.subnets.push(Subnet {
                name: format!("utility-{z}"),
                zone: z.clone(),
                cidr: c.to_string(),
                kind: SubnetType::Utility,
                id: None,
            });
        }
        if !has_key {
            return Err(flag_err(
                "ssh-public-key",
                "no SSH public key: --cloud aws installs one on every instance, and none was \
                 given nor found at ~/.ssh/id_ed25519.pub or ~/.ssh/id_rsa.pub. Pass \
                 --ssh-public-key FILE, or make a key with `ssh-keygen -t ed25519` and run \
                 create again",
            ));
        }
        if a.bastion && !private {
            return Err(flag_err(
                "bastion",
                "a bastion is only useful with --topology private",
            ));
        }

        // One control-plane group per instance, spread over the zones (kops's layout: etcd
        // members and their volumes stay tied to one zone each).
        let cp_zones: Vec<String> = if a.control_plane_zones.is_empty() {
            zones.clone()
        } else {
            a.control_plane_zones
                .iter()
                .map(|z| z.trim().to_string())
                .collect()
        };
        for z in &cp_zones {
            if !zones.contains(z) {
                return Err(flag_err(
                    "control-plane-zones",
                    format!("{z} is not one of --zones"),
                ));
            }
        }
        if a.control_plane_count == 0 {
            return Err(flag_err("control-plane-count", "must be at least 1"));
        }
        let per_zone_multiple = a.control_plane_count as usize > cp_zones.len();
        for i in 0..a.control_plane_count as usize {
            let z = &cp_zones[i % cp_zones.len()];
            let subnet = spec
                .networking
                .subnets
                .iter()
                .find(|s| &s.zone == z && s.kind != SubnetType::Utility)
                .map(|s| s.name.clone())
                .ok_or_else(|| {
                    flag_err(
                        "control-plane-zones",
                        format!("{z}: no private or public subnet in that zone"),
                    )
                })?;
            let ig_name = if per_zone_multiple {
                format!("control-plane-{z}-{}", i / cp_zones.len() + 1)
            } else {
                format!("control-plane-{z}")
            };
            groups.push(new_instance_group(
                &name,
                &ig_name,
                ig_spec(
                    InstanceGroupRole::ControlPlane,
                    a.control_plane_size.clone(),
                    a.image.clone(),
                    1,
                    vec![subnet],
                ),
            ));
        }
        let node_subnets: Vec<String> = spec
            .networking
            .subnets
            .iter()
            .filter(|s| s.kind != SubnetType::Utility)
            .map(|s| s.name.clone())
            .collect();
        groups.push(new_instance_group(
            &name,
            "nodes",
            ig_spec(
                InstanceGroupRole::Node,
                a.node_size.clone(),
                a.image.clone(),
                a.node_count,
                node_subnets,
            ),
        ));
        if a.bastion {
            let util: Vec<String> = spec
                .networking
                .subnets
                .iter()
                .filter(|s| s.kind == SubnetType::Utility)
                .map(|s| s.name.clone())
                .collect();
            groups.push(new_instance_group(
                &name,
                "bastions",
                ig_spec(InstanceGroupRole::Bastion, None, a.image.clone(), 1, util),
            ));
        }
    } else {
        if !a.zones.is_empty() {
            return Err(flag_err(
                "zones",
                "zones are only for --cloud aws; metal hosts come from --inventory",
            ));
        }
        if a.inventory.is_none() {
            return Err(flag_err(
                "inventory",
                "--cloud metal needs an inventory of hosts (kprov YAML, Kubespray hosts.yaml or inventory.ini)",
            ));
        }
        if a.control_plane_size.is_some() || a.node_size.is_some() {
            return Err(flag_err(
                "node-size",
                "machine sizes do not apply to metal hosts",
            ));
        }
        // The same rule the dry run reports: external whenever the etcd hosts are not
        // exactly the control planes (e.g. 2 control planes with etcd on one of them).
        if a.etcd.is_none() && crate::inventory::etcd_topology(&hosts) == EtcdType::External {
            spec.etcd = Some(Etcd {
                kind: EtcdType::External,
            });
        }
        let cps = hosts
            .iter()
            .filter(|h| h.in_group_of(InstanceGroupRole::ControlPlane))
            .count() as u32;
        let nodes = hosts
            .iter()
            .filter(|h| h.in_group_of(InstanceGroupRole::Node))
            .count() as u32;
        groups.push(new_instance_group(
            &name,
            "control-plane",
            ig_spec(InstanceGroupRole::ControlPlane, None, None, cps, vec![]),
        ));
        if nodes > 0 {
            groups.push(new_instance_group(
                &name,
                "nodes",
                ig_spec(InstanceGroupRole::Node, None, None, nodes, vec![]),
            ));
        }
        spec.hosts = hosts;
    }
    let cluster = Cluster {
        api_version: API_VERSION.into(),
        kind: KIND_CLUSTER.into(),
        metadata: ObjectMeta {
            name,
            ..Default::default()
        },
        spec,
    };
    Ok((cluster, groups))
}

/// Kubespray's own pod and service networks (`kube_pods_subnet`, `kube_service_addresses`
/// in its defaults): a Kubespray inventory that does not set them gets them, as Kubespray
/// would give it, not kprov's (kops's) defaults.
pub(crate) const KUBESPRAY_POD_CIDR: &str = "10.233.64.0/18";
pub(crate) const KUBESPRAY_SERVICE_CIDR: &str = "10.233.0.0/18";

/// Applies the cluster-wide settings an inventory's variables carry (Kubespray's
/// `kube_version`, `kube_pods_subnet`, ...). A flag given on the command line wins; each such
/// override is returned as a note so the user sees it. A value kprov cannot install (a
/// `kube_version` outside its table, when `--kubernetes-version` does not choose another) is
/// added to the inventory's problems at its line, naming the flag.
pub(crate) fn apply_inventory(
    cluster: &mut Cluster,
    inv: &mut crate::inventory::Inventory,
    a: &ClusterRequest,
) -> Vec<String> {
    use crate::inventory::Format;
    let mut notes = Vec::new();
    let s = &inv.settings;
    let spec = &mut cluster.spec;
    let mut set = |flag: Option<String>,
                   var: &Option<(String, crate::inventory::At)>,
                   name: &str,
                   field: &mut Option<String>| {
        if let Some((value, at)) = var {
            match flag {
                Some(f) if f != *value => {
                    notes.push(format!("--{name} {f} overrides {value} set at {at}"))
                }
                Some(_) => {}
                None => *field = Some(value.clone()),
            }
        }
    };
    let mut version_problem = None;
    match (&a.kubernetes_version, &s.kubernetes_version) {
        (None, Some((v, at))) if !crate::spec::versions::is_supported(v) => {
            version_problem = Some(crate::inventory::Problem::located(
                at,
                format!(
                    "kube_version: {v} is not a version kprov can install (pinned checksums: {}); \
                     pass --kubernetes-version VERSION to choose one (it overrides kube_version, \
                     your file stays as it is)",
                    crate::spec::versions::supported_list()
                ),
            ));
        }
        _ => set(
            a.kubernetes_version.clone(),
            &s.kubernetes_version,
            "kubernetes-version",
            &mut spec.kubernetes_version,
        ),
    }
    set(
        a.pod_cidr.clone(),
        &s.pod_cidr,
        "pod-cidr",
        &mut spec.networking.pod_cidr,
    );
    set(
        a.service_cidr.clone(),
        &s.service_cidr,
        "service-cidr",
        &mut spec.networking.service_cidr,
    );
    if inv.format != Format::Kprov {
        if a.pod_cidr.is_none() && s.pod_cidr.is_none() {
            spec.networking.pod_cidr = Some(KUBESPRAY_POD_CIDR.into());
            notes.push(format!(
                "pod CIDR {KUBESPRAY_POD_CIDR}: Kubespray's default, as kube_pods_subnet is not \
                 set (--pod-cidr chooses another)"
            ));
        }
        if a.service_cidr.is_none() && s.service_cidr.is_none() {
            spec.networking.service_cidr = Some(KUBESPRAY_SERVICE_CIDR.into());
            notes.push(format!(
                "service CIDR {KUBESPRAY_SERVICE_CIDR}: Kubespray's default, as \
                 kube_service_addresses is not set (--service-cidr chooses another)"
            ));
        }
    }
    if let Some((cni, at)) = &s.cni {
        if a.networking.is_some() {
            notes.push(format!(
                "--networking overrides kube_network_plugin set at {at}"
            ));
        } else {
            spec.networking.cni = Some(*cni);
        }
    }
    if let Some((mode, _)) = &s.proxy_mode {
        spec.kube_proxy
            .get_or_insert_with(Default::default)
            .proxy_mode = Some(*mode);
    } else if inv.format != Format::Kprov {
        // Kubespray's default (kube_proxy_mode in kubespray-defaults), not kubeadm's
        // iptables: the cluster Kubespray would have built from the same inventory.
        spec.kube_proxy
            .get_or_insert_with(Default::default)
            .proxy_mode = Some(crate::spec::ProxyMode::Ipvs);
        notes.push(
            "kube-proxy mode ipvs: Kubespray's default, as kube_proxy_mode is not set (kprov \
             loads the IPVS modules; kube_proxy_mode: iptables or nftables chooses another)"
                .into(),
        );
    }
    if let Some((n, _)) = &s.conntrack_max_per_core {
        spec.kube_proxy
            .get_or_insert_with(Default::default)
            .conntrack_max_per_core = Some(*n);
    }
    if let Some((proxy, _)) = &s.proxy {
        spec.proxy = Some(proxy.clone());
    }
    if !s.registries.is_empty() {
        spec.containerd
            .get_or_insert_with(Default::default)
            .registries = s.registries.iter().map(|(r, _)| r.clone()).collect();
    }
    if s.api_endpoint.is_some() || !s.extra_sans.is_empty() {
        let api = spec.api.get_or_insert_with(Api::default);
        if let Some((endpoint, _)) = &s.api_endpoint {
            api.endpoint = Some(endpoint.clone());
        }
        if let Some((address, _)) = &s.api_endpoint_address {
            api.endpoint_address = Some(address.clone());
        }
        for (san, _) in &s.extra_sans {
            if !api.additional_sans.contains(san) {
                api.additional_sans.push(san.clone());
            }
        }
    }
    inv.problems.extend(version_problem);
    notes
}

/// Validates what `create` built from flags and an inventory; problems about hosts point at
/// the inventory line that defined the host, problems about a field an inventory variable set
/// at that variable's line, and the rest at the command line.
pub(crate) fn validate_with_inventory(
    cluster: &Cluster,
    groups: &[InstanceGroup],
    inv: &crate::inventory::Inventory,
) -> Result<(), SpecErrors> {
    use crate::spec::validate::ObjectKey;
    let (c, g) = crate::spec::defaults::complete(cluster, groups);
    let violations = crate::spec::validate::validate(&c, &g);
    if violations.is_empty() {
        return Ok(());
    }
    let diags = violations
        .iter()
        .map(|v| {
            let path = v.path.to_string();
            let host = (v.object == ObjectKey::Cluster)
                .then(|| path.strip_prefix("spec.hosts["))
                .flatten()
                .and_then(|rest| rest.split(']').next())
                .and_then(|i| i.parse::<usize>().ok())
                .and_then(|i| inv.hosts.get(i));
            if let Some(l) = host {
                return Diagnostic {
                    source: inv.file.clone(),
                    pos: Some(Pos {
                        line: l.line,
                        column: 1,
                    }),
                    path: Some(path),
                    message: format!("host {}: {}", l.host.name, v.message),
                };
            }
            if v.object == ObjectKey::Cluster
                && let Some(m) = inv.mapped.iter().find(|m| path.starts_with(&m.field))
            {
                return Diagnostic {
                    source: m.at.file.clone(),
                    pos: Some(Pos {
                        line: m.at.line,
                        column: 1,
                    }),
                    path: Some(path),
                    message: format!("{} (from {}): {}", m.var, m.at, v.message),
                };
            }
            Diagnostic {
                source: "command line".into(),
                pos: None,
                path: Some(path),
                message: v.message.clone(),
            }
        })
        .collect();
    Err(SpecErrors(diags))
}

/// `create cluster --inventory`: the objects built from the flags and the inventory, its
/// settings applied. An inventory with problems is refused once with all of them: its own,
/// its settings' (e.g. a `kube_version` kprov cannot install) and the spec's they lead to,
/// each at its file and line. (`create` itself runs the two halves with the checksum pin in
/// between.)
#[cfg(test)]
pub(crate) fn objects_from_inventory(
    a: &ClusterRequest,
    inv: &mut crate::inventory::Inventory,
    ssh_public_key: Option<String>,
) -> anyhow::Result<(Cluster, Vec<InstanceGroup>, Vec<String>)> {
    let (cluster, groups, notes) = inventory_objects(a, inv, ssh_public_key)?;
    check_inventory_objects(&cluster, &groups, inv)?;
    Ok((cluster, groups, notes))
}

/// The first half of [`objects_from_inventory`]: the objects, not yet validated (`create`
/// pins a newer patch release's checksums in between).
pub(crate) fn inventory_objects(
    a: &ClusterRequest,
    inv: &mut crate::inventory::Inventory,
    ssh_public_key: Option<String>,
) -> anyhow::Result<(Cluster, Vec<InstanceGroup>, Vec<String>)> {
    let (mut cluster, groups) = build_cluster_objects(a, inv.plain_hosts(), ssh_public_key)?;
    let notes = apply_inventory(&mut cluster, inv, a);
    Ok((cluster, groups, notes))
}

/// The second half of [`objects_from_inventory`]: every problem of the inventory and of the
/// spec it led to, at once.
pub(crate) fn check_inventory_objects(
    cluster: &Cluster,
    groups: &[InstanceGroup],
    inv: &mut crate::inventory::Inventory,
) -> anyhow::Result<()> {
    if !inv.problems.is_empty() {
        if let Err(spec) = validate_with_inventory(cluster, groups, inv) {
            // The inventory's own check of the host list (control planes, etcd quorum) said
            // it already, naming the hosts and their lines: the spec's `spec.hosts` line
            // would repeat it, pointing at no line.
            let host_list_said = inv
                .problems
                .iter()
                .any(|p| p.file.is_none() && p.host.is_none());
            inv.problems.extend(
                spec.0
                    .into_iter()
                    .filter(|d| !(host_list_said && d.path.as_deref() == Some("spec.hosts")))
                    .map(problem_of),
            );
        }
        return Err(crate::inventory::InventoryError::Invalid {
            file: inv.file.clone(),
            problems: std::mem::take(&mut inv.problems),
        }
        .into());
    }
    validate_with_inventory(cluster, groups, inv)?;
    Ok(())
}

/// A spec problem (from [`validate_with_inventory`]) among an inventory's problems.
pub(crate) fn problem_of(d: Diagnostic) -> crate::inventory::Problem {
    crate::inventory::Problem {
        file: Some(d.source),
        line: d.pos.map(|p| p.line),
        host: None,
        message: match d.path {
            Some(path) => format!("{path}: {}", d.message),
            None => d.message,
        },
    }
}

/// The SSH public key `create cluster` installs: `flag` (`--ssh-public-key FILE`), else the
/// user's usual default key in `home`. A default key that exists but cannot be used (too
/// large, unreadable, not text, empty) is skipped with a warning (returned) naming the file
/// and why; an absent one silently.
pub(crate) fn ssh_public_key(
    flag: Option<&Path>,
    home: Option<&Path>,
) -> anyhow::Result<(Option<String>, Vec<String>)> {
    use anyhow::Context;
    if let Some(p) = flag {
        let text =
            bounded::read_file_to_string(p, bounded::SSH_PUBLIC_KEY).context("--ssh-public-key")?;
        if text.trim().is_empty() {
            return Err(flag_err("ssh-public-key", format!("{} is empty", p.display())).into());
        }
        return Ok((Some(text.trim().to_string()), Vec::new()));
    }
    let mut warnings = Vec::new();
    let Some(home) = home else {
        return Ok((None, warnings));
    };
    for f in [".ssh/id_ed25519.pub", ".ssh/id_rsa.pub"] {
        let path = home.join(f);
        match bounded::read_file_to_string(&path, bounded::SSH_PUBLIC_KEY) {
            Ok(t) if !t.trim().is_empty() => return Ok((Some(t.trim().to_string()), warnings)),
            Ok(_) => warnings.push(format!(
                "skipped the SSH public key {}: it is empty",
                path.display()
            )),
            Err(e) if e.io_kind() == Some(std::io::ErrorKind::NotFound) => {}
            // The error names the file.
            Err(e) => warnings.push(format!("skipped a default SSH public key: {e}")),
        }
    }
    Ok((None, warnings))
}

/// What `create cluster` stores, built and checked: nothing is written yet.
pub(crate) struct CreatePlan {
    pub cluster: Cluster,
    pub groups: Vec<InstanceGroup>,
    /// The inventory the hosts came from (metal), its problems all answered.
    pub inventory: Option<Inventory>,
    /// The flags that overrode an inventory's variables, and Kubespray's defaults applied,
    /// one note each.
    pub overrides: Vec<String>,
}

/// The objects `req` stands for, with an imported `inventory` (metal) and the SSH public
/// key's text, checked as a whole before anything is written. Problems are collected, not
/// returned one at a time: an inventory is refused once, with every problem it has (its own,
/// its settings', and the spec's they lead to). A newer patch release's checksums are read
/// here and pinned in the spec (`pinned` hears one line per pinned binary as it happens).
pub(crate) async fn plan(
    req: &ClusterRequest,
    mut inventory: Option<Inventory>,
    ssh_public_key: Option<String>,
    pinned: &mut dyn FnMut(String),
) -> anyhow::Result<CreatePlan> {
    let mut overrides = Vec::new();
    let (cluster, groups) = match &mut inventory {
        Some(inv) => {
            let (mut cluster, groups, notes) = inventory_objects(req, inv, ssh_public_key)?;
            if inv.problems.is_empty() {
                for n in super::release::pin_checksums(&mut cluster).await? {
                    pinned(n);
                }
            }
            check_inventory_objects(&cluster, &groups, inv)?;
            overrides = notes;
            (cluster, groups)
        }
        None => {
            let (mut cluster, groups) = build_cluster_objects(req, Vec::new(), ssh_public_key)?;
            for n in super::release::pin_checksums(&mut cluster).await? {
                pinned(n);
            }
            resolve_with_docs(&cluster, &groups, None, &HashMap::new(), "command line")?;
            (cluster, groups)
        }
    };
    Ok(CreatePlan {
        cluster,
        groups,
        inventory,
        overrides,
    })
}

/// Stores `plan`'s objects: refused before the lock is taken when the cluster exists (so a
/// refused create writes nothing), then created if absent under the cluster's lock.
pub(crate) async fn apply(repo: &Repo, plan: &CreatePlan) -> anyhow::Result<()> {
    let name = plan.cluster.name();
    super::objects::refuse_existing(repo, name).await?;
    super::session::Session::new(repo.store().clone())
        .with_lock(name, "create cluster", async |_| {
            anyhow::Ok(repo.create(&plan.cluster, &plan.groups).await?)
        })
        .await
}

#[cfg(test)]
impl ClusterRequest {
    /// `create cluster NAME --cloud CLOUD` with the command line's defaults, for tests.
    pub(crate) fn defaults(name: &str, cloud: CloudProvider) -> Self {
        ClusterRequest {
            name: name.into(),
            cloud,
            zones: vec![],
            control_plane_zones: vec![],
            control_plane_count: 1,
            control_plane_size: None,
            node_count: 2,
            node_size: None,
            image: None,
            kubernetes_version: None,
            networking: None,
            topology: TopologyType::Public,
            bastion: false,
            dns_zone: None,
            dns: None,
            api_loadbalancer_type: None,
            etcd: None,
            network_cidr: None,
            network_id: None,
            pod_cidr: None,
            service_cidr: None,
            inventory: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_files::write;
    use std::path::Path;

    /// `create cluster lab.example.com --cloud metal` and the flags these tests give.
    fn args(extra: &[&str]) -> ClusterRequest {
        let mut a = ClusterRequest::defaults("lab.example.com", CloudProvider::Metal);
        for flag in extra.chunks(2) {
            let value = flag[1].to_string();
            match (flag[0], flag[1]) {
                ("--inventory", _) => a.inventory = Some(value.into()),
                ("--kubernetes-version", _) => a.kubernetes_version = Some(value),
                ("--pod-cidr", _) => a.pod_cidr = Some(value),
                ("--networking", "calico") => a.networking = Some(Cni::Calico),
                ("--etcd", "external") => a.etcd = Some(EtcdType::External),
                (f, v) => panic!("{f} {v}: not a flag these tests give"),
            }
        }
        a
    }

    #[test]
    fn only_the_dot_of_a_fully_qualified_name_is_dropped() {
        for (given, kept) in [
            ("demo.example.com.", "demo.example.com"),
            ("..", ".."),
            (".", "."),
            ("a..", "a.."),
        ] {
            let mut a = ClusterRequest::defaults(given, CloudProvider::Aws);
            a.zones = vec!["eu-west-1a".into()];
            let (c, _) =
                build_cluster_objects(&a, Vec::new(), Some("ssh-ed25519 AAAA".into())).unwrap();
            assert_eq!(c.metadata.name, kept, "{given}");
        }
    }

    fn build(
        path: &Path,
        extra: &[&str],
    ) -> (
        Cluster,
        Vec<InstanceGroup>,
        crate::inventory::Inventory,
        Vec<String>,
    ) {
        let p = path.to_str().unwrap();
        let mut all = vec!["--inventory", p];
        all.extend_from_slice(extra);
        let a = args(&all);
        let mut inv = crate::inventory::import(path).unwrap();
        let (mut c, g) = build_cluster_objects(&a, inv.plain_hosts(), None).unwrap();
        let notes = apply_inventory(&mut c, &mut inv, &a);
        (c, g, inv, notes)
    }

    fn corpus(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/kubespray/corpus")
            .join(name)
    }

    #[test]
    fn inventory_variables_become_spec_fields() {
        let (c, g, inv, notes) = build(&corpus("mycluster"), &[]);
        assert!(notes.is_empty(), "{notes:?}");
        let s = &c.spec;
        assert_eq!(s.kubernetes_version.as_deref(), Some("1.35.1"));
        assert_eq!(s.networking.cni, Some(Cni::Cilium));
        assert_eq!(s.networking.pod_cidr.as_deref(), Some("10.244.0.0/16"));
        assert_eq!(s.networking.service_cidr.as_deref(), Some("10.96.0.0/16"));
        let api = s.api.as_ref().unwrap();
        assert_eq!(api.additional_sans, vec!["k8s.example.com", "203.0.113.10"]);
        assert_eq!(
            s.etcd, None,
            "etcd group = control planes: stacked, the default"
        );
        validate_with_inventory(&c, &g, &inv).unwrap();

        let (lb, g, inv, _) = build(&corpus("no-all.yaml"), &[]);
        let api = lb.spec.api.as_ref().unwrap();
        assert_eq!(api.endpoint.as_deref(), Some("api.example.com:8443"));
        validate_with_inventory(&lb, &g, &inv).unwrap();
    }

    #[test]
    fn flags_win_over_inventory_variables_and_say_so() {
        let (c, _, _, notes) = build(
            &corpus("mycluster"),
            &["--pod-cidr", "10.32.0.0/16", "--networking", "calico"],
        );
        assert_eq!(c.spec.networking.pod_cidr.as_deref(), Some("10.32.0.0/16"));
        assert_eq!(c.spec.networking.cni, Some(Cni::Calico));
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].starts_with("--pod-cidr 10.32.0.0/16 overrides 10.244.0.0/16 set at "));
        assert!(notes[1].starts_with("--networking overrides kube_network_plugin set at "));
    }

    #[test]
    fn spec_errors_point_at_inventory_lines_not_the_command_line() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("inventory.ini");
        std::fs::write(
            &path,
            "[all]\ncp1 ansible_host=198.18.0.1 ip=10.244.0.5\n[kube_control_plane]\ncp1\n\
             [all:vars]\nkube_pods_subnet=10.244.0.0/16\nkube_version=1.20.0\n",
        )
        .unwrap();
        // Every problem in one run: the version kprov cannot install (naming the flag that
        // chooses another) and the spec problem the pod CIDR leads to, each at its line.
        let a = args(&["--inventory", path.to_str().unwrap()]);
        let mut inv = crate::inventory::import_collecting(&path).unwrap();
        let err = objects_from_inventory(&a, &mut inv, None)
            .unwrap_err()
            .to_string();
        let file = path.display().to_string();
        assert!(!err.contains("command line"), "{err}");
        assert!(
            err.contains(&format!("{file}:2: spec.hosts[0]")) && err.contains("host cp1: "),
            "{err}"
        );
        assert!(
            err.contains(&format!(
                "{file}:7: kube_version: 1.20.0 is not a version kprov can install"
            )) && err.contains("pass --kubernetes-version VERSION"),
            "{err}"
        );
        // With the flag, the version problem is gone and the other one stays.
        let a = args(&[
            "--inventory",
            path.to_str().unwrap(),
            "--kubernetes-version",
            "1.35.1",
        ]);
        let mut inv = crate::inventory::import_collecting(&path).unwrap();
        let err = objects_from_inventory(&a, &mut inv, None)
            .unwrap_err()
            .to_string();
        assert!(!err.contains("kube_version"), "{err}");
        assert!(err.contains(&format!("{file}:2:1: spec.hosts[0]")), "{err}");
    }

    /// Kubespray's behaviour-changing settings: honoured, answered with a note (docker), or
    /// refused each at its own file and line, all in one run; the harmless ones (`false`,
    /// `""`, `[]`) stay in the one grouped warning; Kubespray's own pod and service networks
    /// when the inventory does not set them.
    #[test]
    fn behaviour_changing_settings_are_honoured_or_refused_at_their_line() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write(
            d,
            "hosts.yaml",
            "all:\n  hosts:\n    cp1: {ansible_host: 198.18.0.1}\n    w1: {ansible_host: 198.18.0.2}\n  \
             children:\n    kube_control_plane:\n      hosts: {cp1: }\n    etcd:\n      hosts: {cp1: }\n    \
             kube_node:\n      hosts: {w1: }\n    k8s_cluster:\n      children: {kube_control_plane: , kube_node: }\n",
        );
        write(
            d,
            "group_vars/all/all.yml",
            "http_proxy: \"http://proxy.example.com:3128\"\nhttps_proxy: \"\"\nno_proxy: \"\"\n\
             upstream_dns_servers:\n  - 8.8.8.8\nkubelet_fail_swap_on: true\n",
        );
        write(
            d,
            "group_vars/k8s_cluster/k8s-cluster.yml",
            "kube_proxy_mode: ipvs\ncontainer_manager: docker\nkube_encrypt_secret_data: true\n\
             kubernetes_audit: false\nkube_vip_enabled: true\nkube_vip_address: 10.0.0.9\n\
             metallb_enabled: false\n",
        );
        write(
            d,
            "group_vars/all/containerd.yml",
            "containerd_registries_mirrors:\n  - prefix: docker.io\n    mirrors:\n      - host: https://mirror.example.com\n\
             containerd_registry_auth:\n  - registry: mirror.example.com\n    username: u\n    password: p\n",
        );
        let a = args(&[
            "--inventory",
            d.to_str().unwrap(),
            "--kubernetes-version",
            "1.35.1",
        ]);
        let mut inv = crate::inventory::import_collecting(d).unwrap();
        let err = objects_from_inventory(&a, &mut inv, None)
            .unwrap_err()
            .to_string();
        let at =
            |f: &str, line: usize, var: &str| format!("{}:{line}: {var}: ", d.join(f).display());
        for (f, line, var, says) in [
            (
                "group_vars/all/all.yml",
                4,
                "upstream_dns_servers",
                "not configurable yet",
            ),
            (
                "group_vars/all/containerd.yml",
                5,
                "containerd_registry_auth",
                "kprov create registry-credentials",
            ),
            (
                "group_vars/k8s_cluster/k8s-cluster.yml",
                3,
                "kube_encrypt_secret_data",
                "not supported yet",
            ),
            (
                "group_vars/k8s_cluster/k8s-cluster.yml",
                5,
                "kube_vip_enabled",
                "kube-vip",
            ),
        ] {
            let want = at(f, line, var);
            let found = err.lines().find(|l| l.contains(&want));
            assert!(
                found.is_some_and(|l| l.contains(says)),
                "{want} ... {says} in:\n{err}"
            );
        }
        assert_eq!(
            err.lines().count(),
            5,
            "one line per refused setting:\n{err}"
        );
        for harmless in [
            "http_proxy",
            "containerd_registries_mirrors",
            "https_proxy",
            "no_proxy",
            "kubernetes_audit",
            "metallb_enabled",
            "kubelet_fail_swap_on",
            "container_manager",
        ] {
            assert!(
                !err.contains(&format!("{harmless}:")),
                "{harmless} refused:\n{err}"
            );
        }
        // The same directory without the refused settings: created, ipvs honoured, docker
        // answered with containerd in a note, Kubespray's networks, harmless ones grouped.
        write(
            d,
            "group_vars/all/all.yml",
            "https_proxy: \"\"\nkubelet_fail_swap_on: true\n",
        );
        write(
            d,
            "group_vars/all/containerd.yml",
            "containerd_registries_mirrors:\n  - prefix: docker.io\n    mirrors:\n      - host: https://mirror.example.com\n",
        );
        write(
            d,
            "group_vars/k8s_cluster/k8s-cluster.yml",
            "kube_proxy_mode: ipvs\ncontainer_manager: docker\nkube_encrypt_secret_data: false\n",
        );
        let mut inv = crate::inventory::import_collecting(d).unwrap();
        let (c, _, notes) = objects_from_inventory(&a, &mut inv, None).unwrap();
        assert_eq!(
            c.spec.kube_proxy.as_ref().and_then(|k| k.proxy_mode),
            Some(ProxyMode::Ipvs)
        );
        assert_eq!(
            c.spec.networking.pod_cidr.as_deref(),
            Some(KUBESPRAY_POD_CIDR)
        );
        assert_eq!(
            c.spec.networking.service_cidr.as_deref(),
            Some(KUBESPRAY_SERVICE_CIDR)
        );
        assert!(
            inv.notes.iter().any(|n| n.contains("container_manager: docker: kprov installs containerd instead")),
            "{:?}",
            inv.notes
        );
        assert!(
            notes
                .iter()
                .any(|n| n.contains("pod CIDR 10.233.64.0/18: Kubespray's default"))
        );
        let unused: Vec<&str> = inv.unused.iter().map(|u| u.var.as_str()).collect();
        assert_eq!(unused, ["kubelet_fail_swap_on", "kube_encrypt_secret_data"]);
        assert!(
            inv.unused_warning()
                .unwrap()
                .contains("2 inventory variable(s) not used")
        );
        let registries = &c.spec.containerd.as_ref().unwrap().registries;
        assert_eq!(registries.len(), 1);
        assert_eq!(registries[0].name, "docker.io");
        assert_eq!(
            registries[0].mirrors[0].endpoint,
            "https://mirror.example.com"
        );
    }

    #[test]
    fn external_etcd_hosts_with_other_roles_are_valid() {
        // 2 control planes + 3 etcd hosts: External etcd with etcd on control planes and a
        // worker, run as a host service (what `create` stores, `update` runs).
        use crate::spec::test_host as host;
        use HostRole::*;
        let hosts = vec![
            host("node1", "198.18.0.1", &[ControlPlane, Node, Etcd]),
            host("node2", "198.18.0.2", &[ControlPlane, Node, Etcd]),
            host("node3", "198.18.0.3", &[Node, Etcd]),
        ];
        let a = args(&["--inventory", "x", "--etcd", "external"]);
        let (c, g) = build_cluster_objects(&a, hosts.clone(), None).unwrap();
        crate::repo::resolve_with_docs(&c, &g, None, &Default::default(), "flags").unwrap();
        // An even number of etcd hosts is still refused (quorum).
        let (c, g) = build_cluster_objects(&a, hosts[..2].to_vec(), None).unwrap();
        let err = crate::repo::resolve_with_docs(&c, &g, None, &Default::default(), "flags")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("External etcd needs an odd number of hosts with the etcd role, found 2"),
            "{err}"
        );
    }

    #[test]
    fn zones_are_names_of_one_region() {
        let z = |v: &[&str]| check_zones(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            z(&["us-east-1a", " us-east-1b", "us-east-1a"]).unwrap(),
            ["us-east-1a", "us-east-1b"]
        );
        let e = z(&["us-east-1a", "eu-west-1b"]).unwrap_err().to_string();
        assert!(
            e.contains("eu-west-1b is in region eu-west-1 but us-east-1a is in us-east-1"),
            "{e}"
        );
        for bad in [
            "us-east-1",
            "us-east-1ab",
            "us-east-1-",
            "US-east-1a",
            "us-east-1A",
            "mars-1a",
        ] {
            assert!(z(&[bad]).is_err(), "{bad}");
        }
    }

    /// A Kubespray inventory without kube_proxy_mode gets Kubespray's ipvs, said in a note;
    /// one that sets it keeps its mode; kprov's own inventory format keeps kubeadm's default.
    #[test]
    fn kubespray_import_without_kube_proxy_mode_gets_kubesprays_ipvs() {
        let tmp = tempfile::tempdir().unwrap();
        let mode_of = |name: &str, text: &str| {
            let path = tmp.path().join(name);
            std::fs::write(&path, text).unwrap();
            let a = args(&["--inventory", path.to_str().unwrap()]);
            let mut inv = crate::inventory::import_collecting(&path).unwrap();
            let (c, _, notes) = objects_from_inventory(&a, &mut inv, None).unwrap();
            let said = notes
                .iter()
                .any(|n| n.starts_with("kube-proxy mode ipvs: Kubespray's default"));
            (c.spec.kube_proxy.and_then(|k| k.proxy_mode), said)
        };
        let ini = "[all]\ncp1 ansible_host=198.18.0.1\n[kube_control_plane]\ncp1\n[etcd]\ncp1\n";
        assert_eq!(mode_of("a.ini", ini), (Some(ProxyMode::Ipvs), true));
        assert_eq!(
            mode_of(
                "b.ini",
                &format!("{ini}[all:vars]\nkube_proxy_mode=iptables\n")
            ),
            (Some(ProxyMode::Iptables), false)
        );
        let own = "hosts:\n  - name: cp1\n    address: 198.18.0.1\n    roles: [control-plane]\n";
        assert_eq!(mode_of("c.yaml", own), (None, false));
    }

    /// tests/fixtures/kubespray/fresh/09-b0ud (2 etcd hosts) and 11-danilenka (`<IP_master1>`
    /// placeholders): each problem said once, at its inventory line.
    #[test]
    fn inventory_problems_are_said_once() {
        let tmp = tempfile::tempdir().unwrap();
        let refusal = |name: &str, text: &str| {
            let path = tmp.path().join(name);
            std::fs::write(&path, text).unwrap();
            let a = args(&["--inventory", path.to_str().unwrap()]);
            let mut inv = crate::inventory::import_collecting(&path).unwrap();
            objects_from_inventory(&a, &mut inv, None)
                .unwrap_err()
                .to_string()
        };
        let even = refusal(
            "even.ini",
            "[all]\nn1 ansible_host=198.18.0.1\nn2 ansible_host=198.18.0.2\n\
             [kube_control_plane]\nn1\n[etcd]\nn1\nn2\n[kube_node]\nn2\n",
        );
        assert!(
            even.contains("even.ini:3: etcd needs an odd number of members"),
            "{even}"
        );
        assert!(!even.contains("command line"), "{even}");
        assert_eq!(even.matches("odd number").count(), 1, "{even}");
        let placeholder = refusal(
            "placeholder.ini",
            "[all]\nmaster1 ansible_host=<IP_master1> ansible_user=k8s\n\
             [kube_control_plane]\nmaster1\n[etcd]\nmaster1\n",
        );
        assert_eq!(
            placeholder.matches("<IP_master1>").count(),
            1,
            "{placeholder}"
        );
        assert!(
            placeholder.contains("placeholder.ini:2:1: spec.hosts[0].address: host master1: \"<IP_master1>\" is not a host name or IP address"),
            "{placeholder}"
        );
    }

    /// What `create cluster NAME --cloud metal --inventory FILE` (no other flag) makes of an
    /// inventory: the objects' fields that came from it, or every problem it is refused for.
    fn create_report(path: &Path, extra: &[&str]) -> (bool, String) {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/");
        let rel = |t: &str| t.replace(root, "");
        let p = path.to_str().unwrap();
        let mut all = vec!["--inventory", p];
        all.extend_from_slice(extra);
        let a = args(&all);
        let mut inv = match crate::inventory::import_collecting(path) {
            Ok(inv) => inv,
            Err(e) => return (false, rel(&format!("refused: {e}\n"))),
        };
        let mut out = String::new();
        match objects_from_inventory(&a, &mut inv, None) {
            Err(e) => {
                out.push_str(&format!("refused: {e}\n"));
                (false, rel(&out))
            }
            Ok((c, g, notes)) => {
                let s = &c.spec;
                out.push_str("created\n");
                for l in &inv.hosts {
                    out.push_str(&format!(
                        "  host (line {}) {}\n",
                        l.line,
                        crate::inventory::real_line_of(&l.host)
                    ));
                }
                let api = s.api.clone().unwrap_or_default();
                out.push_str(&format!(
                    "  spec: version {} cni {:?} podCIDR {} serviceCIDR {} etcd {:?} \
                     proxyMode {:?} endpoint {:?} endpointAddress {:?} SANs {:?}\n",
                    s.kubernetes_version.as_deref().unwrap_or("-"),
                    s.networking.cni,
                    s.networking.pod_cidr.as_deref().unwrap_or("-"),
                    s.networking.service_cidr.as_deref().unwrap_or("-"),
                    s.etcd.as_ref().map(|e| e.kind),
                    s.kube_proxy.as_ref().and_then(|k| k.proxy_mode),
                    api.endpoint,
                    api.endpoint_address,
                    api.additional_sans,
                ));
                out.push_str(&format!(
                    "  groups: {}\n",
                    g.iter()
                        .map(|g| format!("{}={}", g.metadata.name, g.spec.min_size.unwrap_or(0)))
                        .collect::<Vec<_>>()
                        .join(" ")
                ));
                for n in inv.notes.iter().chain(&notes) {
                    out.push_str(&format!("  note: {n}\n"));
                }
                let unused: Vec<&str> = inv.unused.iter().map(|u| u.var.as_str()).collect();
                out.push_str(&format!(
                    "  unused ({}): {}\n",
                    unused.len(),
                    unused.join(" ")
                ));
                (true, rel(&out))
            }
        }
    }

    /// Issue 20's done-when: the fresh real inventories in tests/fixtures/kubespray/fresh/
    /// (origins in its ORIGIN.tsv), each imported as it is, checked field by field against the
    /// golden file; at least 20 of them are created as they are.
    #[test]
    fn every_fresh_kubespray_inventory() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kubespray/fresh");
        let mut dirs: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir())
            .collect();
        dirs.sort();
        let mut golden = String::new();
        let mut created = vec![];
        for d in &dirs {
            let name = d.file_name().unwrap().to_string_lossy().into_owned();
            let files: Vec<&str> = ["hosts.yaml", "inventory.ini"]
                .into_iter()
                .filter(|f| d.join(f).is_file())
                .collect();
            assert!(!files.is_empty(), "{name}: no inventory file");
            for (i, f) in files.iter().enumerate() {
                let (ok, report) = create_report(&d.join(f), &[]);
                golden.push_str(&format!("== {name}/{f}\n{report}"));
                // A directory counts once, by its first inventory file (hosts.yaml).
                if ok && i == 0 {
                    created.push(name.clone());
                }
                if !ok && report.contains("--kubernetes-version") {
                    let (_, again) = create_report(&d.join(f), &["--kubernetes-version", "1.35.1"]);
                    golden.push_str(&format!("-- with --kubernetes-version 1.35.1: {again}"));
                }
            }
        }
        golden.push_str(&format!(
            "\n{} of {} directories created as they are: {}\n",
            created.len(),
            dirs.len(),
            created.join(" ")
        ));
        insta::assert_snapshot!("fresh_kubespray_inventories", golden);
        assert!(created.len() >= 20, "{}", golden);
    }
}
