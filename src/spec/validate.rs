//! Validation in the spirit of kops's: every rule yields a violation naming the field path;
//! the loader's source documents turn paths into file, line and column.

use std::collections::{BTreeMap, HashMap, HashSet};

use ipnet::Ipv4Net;

use super::cidr::overlaps;
use super::defaults::{is_gossip_name, region_of_zone};
use super::load::{Diagnostic, SourceDoc, SpecErrors};
use super::locate::FieldPath;
use super::types::*;
use super::versions;

/// Providers with a known cloud-controller-manager.
pub const CCM_PROVIDERS: &[&str] = &["aws", "gce", "azure", "openstack", "vsphere", "hcloud"];

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ObjectKey {
    Cluster,
    InstanceGroup(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub object: ObjectKey,
    pub path: FieldPath,
    pub message: String,
}

struct Check<'a> {
    out: Vec<Violation>,
    object: ObjectKey,
    _p: std::marker::PhantomData<&'a ()>,
}

impl Check<'_> {
    fn err(&mut self, path: FieldPath, message: impl Into<String>) {
        self.out.push(Violation {
            object: self.object.clone(),
            path,
            message: message.into(),
        });
    }
}

fn p(s: &str) -> FieldPath {
    FieldPath::parse(s)
}

/// RFC 1123 label: lowercase alphanumerics and '-', 1..=63, alphanumeric at both ends.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// `key[=value]:Effect`, as `kubectl taint` writes them.
pub fn check_taint(t: &str) -> Result<(), String> {
    let (kv, effect) = t
        .rsplit_once(':')
        .ok_or_else(|| format!("taint {t:?} must be key[=value]:Effect"))?;
    if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
        return Err(format!(
            "taint {t:?} has effect {effect:?}; expected NoSchedule, PreferNoSchedule or NoExecute"
        ));
    }
    let key = kv.split_once('=').map_or(kv, |(k, _)| k);
    check_label_key(key).map_err(|e| format!("taint {t:?}: {e}"))
}

/// Kubernetes label key: optional DNS-subdomain prefix and '/', then a name of up to 63
/// alphanumerics, '-', '_' or '.'.
pub fn check_label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = k.rsplit_once('/').map_or((None, k), |(p, n)| (Some(p), n));
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Err(format!("key prefix {prefix:?} is not a DNS subdomain"));
    }
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!("key {k:?} is not a valid label key"))
    }
}

fn parse_cidr(c: &mut Check, path: FieldPath, v: &str) -> Option<Ipv4Net> {
    match v.parse::<Ipv4Net>() {
        Ok(n) if n.trunc() == n => Some(n),
        Ok(n) => {
            c.err(
                path,
                format!("{v} has host bits set; did you mean {}?", n.trunc()),
            );
            None
        }
        Err(_) => {
            c.err(
                path,
                format!("{v:?} is not an IPv4 CIDR (like 10.0.0.0/16)"),
            );
            None
        }
    }
}

/// Validates a completed cluster and its groups. Returns every violation found.
pub fn validate(cluster: &Cluster, igs: &[InstanceGroup]) -> Vec<Violation> {
    let mut c = Check {
        out: Vec::new(),
        object: ObjectKey::Cluster,
        _p: Default::default(),
    };
    validate_cluster(&mut c, cluster, igs);
    let mut names = HashSet::new();
    for ig in igs {
        c.object = ObjectKey::InstanceGroup(ig.metadata.name.clone());
        if !names.insert(ig.metadata.name.as_str()) {
            c.err(
                p("metadata.name"),
                format!("duplicate instance group name {:?}", ig.metadata.name),
            );
        }
        validate_ig(&mut c, cluster, ig);
    }
    c.out
}

fn validate_cluster(c: &mut Check, cl: &Cluster, igs: &[InstanceGroup]) {
    let s = &cl.spec;
    let name = &cl.metadata.name;
    let aws = s.cloud_provider == CloudProvider::Aws;
    if cl.api_version != API_VERSION {
        c.err(p("apiVersion"), format!("must be {API_VERSION}"));
    }
    if cl.kind != KIND_CLUSTER {
        c.err(p("kind"), "must be Cluster");
    }
    if !is_dns_subdomain(name) {
        c.err(
            p("metadata.name"),
            format!("{name:?} is not a valid DNS name (lowercase letters, digits, '-' and '.')"),
        );
    } else if aws && !name.contains('.') {
        c.err(p("metadata.name"), format!("{name:?} must be a fully qualified DNS name like {name}.example.com (or {name}.k8s.local without DNS)"));
    }

    match s.kubernetes_version.as_deref() {
        None => c.err(p("spec.kubernetesVersion"), "is required"),
        Some(v) if versions::parse(v).is_none() => c.err(
            p("spec.kubernetesVersion"),
            format!("{v:?} is not a version like 1.35.1"),
        ),
        Some(v) if !versions::is_supported(v) => c.err(
            p("spec.kubernetesVersion"),
            format!(
                "{v} is not supported; supported versions (pinned checksums): {}",
                versions::supported_list()
            ),
        ),
        _ => {}
    }

    // Networks.
    let n = &s.networking;
    let net = n
        .network_cidr
        .as_deref()
        .and_then(|v| parse_cidr(c, p("spec.networking.networkCIDR"), v));
    let pod = n
        .pod_cidr
        .as_deref()
        .and_then(|v| parse_cidr(c, p("spec.networking.podCIDR"), v));
    let svc = n
        .service_cidr
        .as_deref()
        .and_then(|v| parse_cidr(c, p("spec.networking.serviceCIDR"), v));
    if let (Some(a), Some(b)) = (pod, svc)
        && overlaps(a, b)
    {
        c.err(
            p("spec.networking.serviceCIDR"),
            format!("{b} overlaps podCIDR {a}"),
        );
    }
    if let Some(net) = net {
        for (field, other) in [("podCIDR", pod), ("serviceCIDR", svc)] {
            if let Some(o) = other
                && overlaps(net, o)
            {
                c.err(
                    p(&format!("spec.networking.{field}")),
                    format!("{o} overlaps networkCIDR {net}"),
                );
            }
        }
    }
    if aws {
        if n.network_cidr.is_none() {
            c.err(
                p("spec.networking.networkCIDR"),
                "is required for cloudProvider aws",
            );
        }
        if n.subnets.is_empty() {
            c.err(p("spec.networking.subnets"), "at least one subnet is required for cloudProvider aws (create cluster --zones makes one per zone)");
        }
    } else if !n.subnets.is_empty() {
        c.err(
            p("spec.networking.subnets"),
            "subnets are only used with cloudProvider aws",
        );
    }
    let region = s.region.clone();
    if aws && region.is_none() {
        c.err(
            p("spec.region"),
            "is required for cloudProvider aws (or give subnets zones like us-east-1a)",
        );
    }
    let mut seen_names = HashSet::new();
    let mut parsed: Vec<(usize, Ipv4Net)> = Vec::new();
    for (i, sn) in n.subnets.iter().enumerate() {
        let base = p("spec.networking.subnets").index(i);
        if !is_dns_label(&sn.name) {
            c.err(
                base.key("name"),
                format!(
                    "{:?} is not a valid name (lowercase letters, digits, '-')",
                    sn.name
                ),
            );
        }
        if !seen_names.insert(sn.name.as_str()) {
            c.err(
                base.key("name"),
                format!("duplicate subnet name {:?}", sn.name),
            );
        }
        match (region_of_zone(&sn.zone), &region) {
            (None, _) => c.err(base.key("zone"), format!("{:?} is not an AWS availability zone like us-east-1a", sn.zone)),
            (Some(r), Some(want)) if &r != want => c.err(base.key("zone"), format!("zone {} is in region {r}, but the cluster is in {want}; all zones must be in one region", sn.zone)),
            _ => {}
        }
        let Some(cidr) = parse_cidr(c, base.key("cidr"), &sn.cidr) else {
            continue;
        };
        if let Some(net) = net
            && !net.contains(&cidr)
        {
            c.err(
                base.key("cidr"),
                format!("{cidr} is not inside networkCIDR {net}"),
            );
        }
        for (j, other) in &parsed {
            if overlaps(cidr, *other) {
                c.err(
                    base.key("cidr"),
                    format!("{cidr} overlaps subnet {:?} ({other})", n.subnets[*j].name),
                );
            }
        }
        for (field, o) in [("podCIDR", pod), ("serviceCIDR", svc)] {
            if let Some(o) = o
                && overlaps(cidr, o)
            {
                c.err(base.key("cidr"), format!("{cidr} overlaps {field} {o}"));
            }
        }
        parsed.push((i, cidr));
    }

    // Topology.
    let private = s
        .topology
        .as_ref()
        .is_some_and(|t| t.kind == TopologyType::Private);
    if aws && private {
        for (kind, why) in [
            (SubnetType::Private, "nodes"),
            (SubnetType::Utility, "NAT gateways and load balancers"),
        ] {
            if !n.subnets.iter().any(|sn| sn.kind == kind) {
                c.err(
                    p("spec.networking.subnets"),
                    format!("Private topology needs {kind:?} subnets for {why}"),
                );
            }
        }
    }
    if let Some(b) = s.topology.as_ref().and_then(|t| t.bastion.as_ref())
        && let Some(pn) = &b.public_name
        && !is_dns_subdomain(pn)
    {
        c.err(
            p("spec.topology.bastion.publicName"),
            format!("{pn:?} is not a valid DNS name"),
        );
    }

    if private && s.topology.as_ref().and_then(|t| t.ssh_address) == Some(SshAddress::Public) {
        c.err(
            p("spec.topology.sshAddress"),
            "Public: instances in Private topology have no public address; use Bastion or Private",
        );
    }

    if !aws && s.topology.is_some() {
        c.err(p("spec.topology"), "topology (public/private subnets, bastion) is only for cloudProvider aws; metal hosts set `bastion` per host");
    }

    // DNS.
    if let Some(d) = &s.dns {
        match (d.kind, &d.zone) {
            (DnsType::None, Some(_)) => {
                c.err(p("spec.dns.zone"), "a zone is set but dns type is None")
            }
            (DnsType::Public | DnsType::Private, None) => c.err(
                p("spec.dns.zone"),
                "is required when dns type is Public or Private",
            ),
            (DnsType::Public | DnsType::Private, Some(z)) => {
                let zone = z.trim_end_matches('.');
                if !is_dns_subdomain(zone) {
                    c.err(
                        p("spec.dns.zone"),
                        format!("{z:?} is not a valid DNS zone name"),
                    );
                } else if !name.ends_with(&format!(".{zone}")) {
                    c.err(
                        p("spec.dns.zone"),
                        format!("cluster name {name} is not inside zone {zone}"),
                    );
                }
                if is_gossip_name(name) {
                    c.err(
                        p("spec.dns"),
                        "names ending in .k8s.local use no DNS; set dns type None",
                    );
                }
                if !aws {
                    c.err(
                        p("spec.dns"),
                        "DNS records are only managed for cloudProvider aws",
                    );
                }
            }
            (DnsType::None, None) => {}
        }
    }

    // Control plane and etcd.
    let etcd = s.etcd.as_ref().map_or(EtcdType::Stacked, |e| e.kind);
    let cp_count: u64 = if aws {
        total_min_size(igs, InstanceGroupRole::ControlPlane)
    } else {
        s.hosts
            .iter()
            .filter(|h| h.roles.contains(&HostRole::ControlPlane))
            .count() as u64
    };
    let where_cp = if aws { p("spec") } else { p("spec.hosts") };
    if cp_count == 0 {
        let msg = if aws {
            "no ControlPlane instance group; add one (role: ControlPlane)"
        } else {
            "no host has the control-plane role"
        };
        c.err(where_cp.clone(), msg);
    }
    if etcd == EtcdType::Stacked && cp_count > 0 && cp_count.is_multiple_of(2) {
        c.err(where_cp, format!("{cp_count} control-plane members with stacked etcd: use an odd number (1, 3, 5) so etcd keeps quorum"));
    }
    if etcd == EtcdType::External {
        if aws {
            c.err(p("spec.etcd.type"), "External etcd is only supported with cloudProvider metal (hosts with the etcd role)");
        } else {
            let members = s
                .hosts
                .iter()
                .filter(|h| h.roles.contains(&HostRole::Etcd))
                .count();
            if members == 0 || members.is_multiple_of(2) {
                c.err(p("spec.hosts"), format!("External etcd needs an odd number of hosts with the etcd role, found {members}"));
            }
            // External etcd members run under a standalone kubelet, which cannot also be a
            // control plane's or a worker's kubelet: refused here so `create` never stores
            // what `update` cannot run.
            for (i, h) in s.hosts.iter().enumerate() {
                if h.roles.contains(&HostRole::Etcd)
                    && (h.roles.contains(&HostRole::ControlPlane)
                        || h.roles.contains(&HostRole::Node))
                {
                    c.err(
                        p("spec.hosts").index(i).key("roles"),
                        format!("host {} has the etcd role and another role, but External etcd runs on dedicated hosts (etcd role only)", h.name),
                    );
                }
            }
        }
    } else if let Some(i) = s.hosts.iter().position(|h| {
        h.roles.contains(&HostRole::Etcd) && !h.roles.contains(&HostRole::ControlPlane)
    }) {
        c.err(
            p("spec.hosts").index(i).key("roles"),
            "the etcd role on a non-control-plane host needs etcd type External",
        );
    }

    // API endpoint.
    if let Some(api) = &s.api {
        let lb = api
            .load_balancer
            .as_ref()
            .map_or(LoadBalancerType::None, |l| l.kind);
        if aws && lb == LoadBalancerType::None && cp_count > 1 {
            c.err(
                p("spec.api.loadBalancer.type"),
                "more than one control plane needs a load balancer in front of the API",
            );
        }
        if !aws && lb != LoadBalancerType::None {
            c.err(p("spec.api.loadBalancer.type"), "cloud load balancers exist only for cloudProvider aws; on metal use api.endpoint or the built-in local proxy (type None)");
        }
        if let Some(pn) = &api.public_name
            && !is_dns_subdomain(pn)
        {
            c.err(
                p("spec.api.publicName"),
                format!("{pn:?} is not a valid DNS name"),
            );
        }
        for (i, san) in api.additional_sans.iter().enumerate() {
            if san.parse::<std::net::IpAddr>().is_err() && !is_dns_subdomain(san) {
                c.err(
                    p("spec.api.additionalSANs").index(i),
                    format!("{san:?} is neither an IP address nor a valid DNS name"),
                );
            }
        }
        if let Some(ep) = &api.endpoint {
            let host = ep
                .rsplit_once(':')
                .filter(|(_, port)| port.parse::<u16>().is_ok())
                .map_or(ep.as_str(), |(h, _)| h);
            if host.parse::<std::net::IpAddr>().is_err() && !is_dns_subdomain(host) {
                c.err(p("spec.api.endpoint"), format!("{ep:?} is not host[:port]"));
            }
        }
    }

    // Cloud controller manager.
    if let Some(ccm) = &s.cloud_controller_manager
        && let Some(pv) = ccm.provider.as_deref()
    {
        if pv != "none" && !CCM_PROVIDERS.contains(&pv) {
            c.err(
                p("spec.cloudControllerManager.provider"),
                format!(
                    "unknown provider {pv:?}; known: {}",
                    CCM_PROVIDERS.join(", ")
                ),
            );
        }
        if aws && pv != "aws" {
            c.err(
                p("spec.cloudControllerManager.provider"),
                format!("a cluster on aws runs the aws cloud-controller-manager, not {pv:?}"),
            );
        }
    }

    // SSH key.
    if let Some(k) = s.ssh_key.as_ref().and_then(|k| k.public_key.as_deref()) {
        let mut parts = k.split_whitespace();
        let ok = matches!(parts.next(), Some(t) if t.starts_with("ssh-") || t.starts_with("ecdsa-") || t.starts_with("sk-"))
            && parts.next().is_some_and(|b| {
                b.len() > 16
                    && b.bytes()
                        .all(|c| c.is_ascii_alphanumeric() || b"+/=".contains(&c))
            });
        if !ok {
            c.err(
                p("spec.sshKey.publicKey"),
                "is not an OpenSSH public key (expected 'ssh-ed25519 AAAA... comment')",
            );
        }
    }

    // Assets.
    if let Some(a) = &s.assets {
        if let Some(m) = &a.mirror
            && !(m.starts_with("http://") || m.starts_with("https://") || m.starts_with("file://"))
        {
            c.err(
                p("spec.assets.mirror"),
                format!("{m:?} must be an http(s):// URL or a file:// directory"),
            );
        }
        for (i, f) in a.files.iter().enumerate() {
            let base = p("spec.assets.files").index(i);
            if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                c.err(
                    base.key("sha256"),
                    format!("{:?} is not a sha256 (64 hex digits)", f.sha256),
                );
            }
            if !(f.url.starts_with("http://")
                || f.url.starts_with("https://")
                || f.url.starts_with("file://"))
            {
                c.err(
                    base.key("url"),
                    format!("{:?} must be an http(s):// or file:// URL", f.url),
                );
            }
        }
    }

    // Hosts.
    if aws && !s.hosts.is_empty() {
        c.err(
            p("spec.hosts"),
            "hosts are only for cloudProvider metal; aws nodes come from instance groups",
        );
    }
    if !aws && s.hosts.is_empty() {
        c.err(
            p("spec.hosts"),
            "a metal cluster needs hosts (create cluster --cloud metal --inventory FILE)",
        );
    }
    let mut host_names = HashSet::new();
    let mut addresses = HashSet::new();
    for (i, h) in s.hosts.iter().enumerate() {
        let base = p("spec.hosts").index(i);
        if !is_dns_subdomain(&h.name) {
            c.err(
                base.key("name"),
                format!("{:?} is not a valid host name", h.name),
            );
        }
        if !host_names.insert(h.name.as_str()) {
            c.err(
                base.key("name"),
                format!("duplicate host name {:?}", h.name),
            );
        }
        if !addresses.insert((h.address.as_str(), h.port.unwrap_or(22))) {
            c.err(
                base.key("address"),
                format!("address {} is used by another host", h.address),
            );
        }
        if h.roles.is_empty() {
            c.err(
                base.key("roles"),
                "a host needs at least one role (control-plane, node, etcd)",
            );
        }
        for (field, ip) in [("ip", &h.ip), ("accessIP", &h.access_ip)] {
            if let Some(ip) = ip {
                match ip.parse::<std::net::Ipv4Addr>() {
                    Err(_) => c.err(base.key(field), format!("{ip:?} is not an IPv4 address")),
                    Ok(addr) => {
                        for (cf, net) in [("podCIDR", pod), ("serviceCIDR", svc)] {
                            if net.is_some_and(|n| n.contains(&addr)) {
                                c.err(base.key(field), format!("{addr} is inside {cf}; pick a {cf} that does not overlap host addresses"));
                            }
                        }
                    }
                }
            }
        }
        // Kubernetes binds to an IP: a host known only by name needs `ip` (Kubespray's rule).
        if h.ip.is_none() && h.address.parse::<std::net::IpAddr>().is_err() {
            c.err(
                base.key("address"),
                format!(
                    "{:?} is not an IP address; set `ip` to the address Kubernetes should bind to",
                    h.address
                ),
            );
        }
        check_labels_and_taints(c, &base, &h.labels, &h.taints, "labels");
    }
}

fn check_labels_and_taints(
    c: &mut Check,
    base: &FieldPath,
    labels: &BTreeMap<String, String>,
    taints: &[String],
    labels_field: &str,
) {
    for k in labels.keys() {
        if let Err(e) = check_label_key(k) {
            c.err(base.key(labels_field).key(k), e);
        }
    }
    for (i, t) in taints.iter().enumerate() {
        if let Err(e) = check_taint(t) {
            c.err(base.key("taints").index(i), e);
        }
    }
}

fn validate_ig(c: &mut Check, cl: &Cluster, ig: &InstanceGroup) {
    let s = &ig.spec;
    if ig.api_version != API_VERSION {
        c.err(p("apiVersion"), format!("must be {API_VERSION}"));
    }
    if ig.kind != KIND_INSTANCE_GROUP {
        c.err(p("kind"), "must be InstanceGroup");
    }
    if !is_dns_label(&ig.metadata.name) {
        c.err(
            p("metadata.name"),
            format!(
                "{:?} is not a valid name (lowercase letters, digits, '-', at most 63)",
                ig.metadata.name
            ),
        );
    }
    if let Some(owner) = ig.metadata.labels.get(CLUSTER_LABEL)
        && owner != &cl.metadata.name
    {
        c.err(
            p("metadata.labels").key(CLUSTER_LABEL),
            format!("belongs to cluster {owner:?}, not {:?}", cl.metadata.name),
        );
    }
    if let (Some(min), Some(max)) = (s.min_size, s.max_size)
        && min > max
    {
        c.err(
            p("spec.minSize"),
            format!("minSize {min} is larger than maxSize {max}"),
        );
    }
    if s.role == InstanceGroupRole::ControlPlane && s.min_size != s.max_size {
        c.err(
            p("spec.maxSize"),
            "a ControlPlane group has a fixed size: set minSize equal to maxSize",
        );
    }
    if cl.spec.cloud_provider == CloudProvider::Aws {
        if s.machine_type.as_deref().is_none_or(str::is_empty) {
            c.err(p("spec.machineType"), "is required for cloudProvider aws");
        }
        if s.subnets.is_empty() {
            c.err(p("spec.subnets"), "at least one subnet is required");
        }
        for (i, sn) in s.subnets.iter().enumerate() {
            if !cl.spec.networking.subnets.iter().any(|x| &x.name == sn) {
                let known: Vec<&str> = cl
                    .spec
                    .networking
                    .subnets
                    .iter()
                    .map(|x| x.name.as_str())
                    .collect();
                c.err(
                    p("spec.subnets").index(i),
                    format!(
                        "unknown subnet {sn:?}; the cluster has: {}",
                        known.join(", ")
                    ),
                );
            }
        }
    } else if s.role == InstanceGroupRole::Bastion {
        c.err(
            p("spec.role"),
            "Bastion groups are only for cloudProvider aws; metal hosts set `bastion` per host",
        );
    }
    if let Some(ru) = &s.rolling_update {
        let total = s.max_size.unwrap_or(1).max(1);
        let mut resolved = [None, None];
        for (k, (field, v)) in [
            ("maxSurge", &ru.max_surge),
            ("maxUnavailable", &ru.max_unavailable),
        ]
        .into_iter()
        .enumerate()
        {
            if let Some(v) = v {
                match v.resolve(total, k == 0) {
                    Some(n) => resolved[k] = Some(n),
                    None => c.err(
                        p("spec.rollingUpdate").key(field),
                        format!("{v:?} must be a count or a percentage like 25%"),
                    ),
                }
            }
        }
        if resolved == [Some(0), Some(0)] {
            c.err(
                p("spec.rollingUpdate"),
                "maxSurge and maxUnavailable cannot both be 0: nothing could be replaced",
            );
        }
    }
    if let Some(u) = &s.ssh_user {
        // A POSIX login name: it reaches ssh's command line and `user@host` strings.
        let ok = u.len() <= 32
            && u.starts_with(|ch: char| ch.is_ascii_lowercase() || ch == '_')
            && u.chars()
                .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_' || ch == '-');
        if !ok {
            c.err(
                p("spec.sshUser"),
                format!(
                    "{u:?} is not a login name (lowercase letters, digits, '_', '-', at most 32, \
                     starting with a letter or '_')"
                ),
            );
        }
        if cl.spec.cloud_provider != CloudProvider::Aws {
            c.err(
                p("spec.sshUser"),
                "is only for cloudProvider aws; metal hosts set `user` per host",
            );
        }
    }
    let base = FieldPath::root().key("spec");
    check_labels_and_taints(c, &base, &s.node_labels, &s.taints, "nodeLabels");
}

/// Turns violations into located diagnostics using the documents objects were read from.
/// Objects without a document (built from flags) are reported against `fallback_source`.
pub fn locate(
    violations: &[Violation],
    cluster_doc: Option<&SourceDoc>,
    ig_docs: &HashMap<String, std::sync::Arc<SourceDoc>>,
    fallback_source: &str,
) -> SpecErrors {
    let diags = violations
        .iter()
        .map(|v| {
            let doc = match &v.object {
                ObjectKey::Cluster => cluster_doc,
                ObjectKey::InstanceGroup(n) => ig_docs.get(n).map(|d| d.as_ref()),
            };
            let prefix = match &v.object {
                ObjectKey::Cluster => String::new(),
                ObjectKey::InstanceGroup(n) => format!("InstanceGroup {n}: "),
            };
            match doc {
                Some(d) => {
                    let mut diag = d.diagnostic(&v.path, v.message.clone());
                    diag.message = format!("{prefix}{}", diag.message);
                    diag
                }
                None => Diagnostic {
                    source: fallback_source.to_string(),
                    pos: None,
                    path: Some(v.path.to_string()),
                    message: format!("{prefix}{}", v.message),
                },
            }
        })
        .collect();
    SpecErrors(diags)
}

#[cfg(test)]
mod tests {
    use super::super::defaults::complete;
    use super::super::load::{Object, load_objects};
    use super::*;

    const BASE: &str = r#"apiVersion: kprov.dev/v1alpha1
kind: Cluster
metadata:
  name: demo.example.com
spec:
  cloudProvider: aws
  kubernetesVersion: 1.35.1
  networking:
    networkCIDR: 172.20.0.0/16
    subnets:
    - {name: us-east-1a, zone: us-east-1a, cidr: 172.20.32.0/19, type: Public}
    - {name: us-east-1b, zone: us-east-1b, cidr: 172.20.64.0/19, type: Public}
---
apiVersion: kprov.dev/v1alpha1
kind: InstanceGroup
metadata:
  name: control-plane-us-east-1a
spec:
  role: ControlPlane
  minSize: 1
  maxSize: 1
---
apiVersion: kprov.dev/v1alpha1
kind: InstanceGroup
metadata:
  name: nodes
spec:
  role: Node
  minSize: 2
  maxSize: 3
"#;

    /// Loads, completes and validates; returns the located messages.
    fn check(text: &str) -> Vec<String> {
        let objs = load_objects("c.yaml", text).expect("parses");
        let mut cluster = None;
        let mut igs = Vec::new();
        let mut docs = HashMap::new();
        for o in objs {
            match o.value {
                Object::Cluster(c) => cluster = Some((c, o.doc)),
                Object::InstanceGroup(g) => {
                    docs.insert(g.metadata.name.clone(), o.doc);
                    igs.push(g);
                }
            }
        }
        let (c, doc) = cluster.expect("cluster");
        let (c, igs) = complete(&c, &igs);
        let v = validate(&c, &igs);
        locate(&v, Some(&doc), &docs, "c.yaml")
            .0
            .iter()
            .map(|d| d.to_string())
            .collect()
    }

    fn expect_one(text: &str, needle: &str) {
        let errs = check(text);
        assert!(
            errs.iter().any(|e| e.contains(needle)),
            "expected {needle:?} in {errs:#?}"
        );
    }

    #[test]
    fn base_spec_is_valid() {
        assert_eq!(check(BASE), Vec::<String>::new());
    }

    #[test]
    fn subnet_outside_network_points_at_its_line() {
        let t = BASE.replace("cidr: 172.20.64.0/19", "cidr: 10.9.0.0/24");
        expect_one(&t, "c.yaml:12:");
        expect_one(
            &t,
            "spec.networking.subnets[1].cidr: 10.9.0.0/24 is not inside networkCIDR 172.20.0.0/16",
        );
    }

    #[test]
    fn overlapping_subnets() {
        expect_one(
            &BASE.replace("172.20.64.0/19", "172.20.40.0/21"),
            "overlaps subnet \"us-east-1a\"",
        );
    }

    #[test]
    fn subnet_overlapping_pod_cidr() {
        let t = BASE.replace(
            "networkCIDR: 172.20.0.0/16",
            "networkCIDR: 172.20.0.0/16\n    podCIDR: 172.20.32.0/20",
        );
        expect_one(&t, "overlaps podCIDR 172.20.32.0/20");
    }

    #[test]
    fn pod_and_service_cidr_overlap() {
        let t = BASE.replace(
            "networkCIDR: 172.20.0.0/16",
            "networkCIDR: 172.20.0.0/16\n    podCIDR: 100.64.0.0/10",
        );
        expect_one(
            &t,
            "spec.networking.serviceCIDR: 100.64.0.0/13 overlaps podCIDR 100.64.0.0/10",
        );
    }

    #[test]
    fn host_bits_set() {
        expect_one(
            &BASE.replace("networkCIDR: 172.20.0.0/16", "networkCIDR: 172.20.1.0/16"),
            "did you mean 172.20.0.0/16",
        );
    }

    #[test]
    fn zones_of_two_regions() {
        expect_one(
            &BASE.replace("zone: us-east-1b", "zone: eu-west-1b"),
            "zone eu-west-1b is in region eu-west-1, but the cluster is in us-east-1",
        );
    }

    #[test]
    fn even_control_plane_count_with_stacked_etcd() {
        let t = BASE.replace("  minSize: 1\n  maxSize: 1", "  minSize: 2\n  maxSize: 2");
        expect_one(&t, "2 control-plane members with stacked etcd");
    }

    #[test]
    fn unsupported_kubernetes_version() {
        expect_one(
            &BASE.replace("1.35.1", "1.20.0"),
            "c.yaml:7:22: spec.kubernetesVersion: 1.20.0 is not supported",
        );
        expect_one(
            &BASE.replace("1.35.1", "latest"),
            "is not a version like 1.35.1",
        );
    }

    #[test]
    fn min_larger_than_max_names_the_group() {
        let t = BASE.replace("  minSize: 2\n  maxSize: 3", "  minSize: 4\n  maxSize: 3");
        expect_one(
            &t,
            "c.yaml:29:12: spec.minSize: InstanceGroup nodes: minSize 4 is larger than maxSize 3",
        );
    }

    #[test]
    fn invalid_names() {
        expect_one(
            &BASE.replace("name: demo.example.com", "name: Demo_Cluster.example.com"),
            "is not a valid DNS name",
        );
        expect_one(
            &BASE.replace("name: demo.example.com", "name: demo"),
            "must be a fully qualified DNS name",
        );
        expect_one(
            &BASE.replace("name: nodes", "name: Nodes!"),
            "metadata.name: InstanceGroup Nodes!: \"Nodes!\" is not a valid name",
        );
    }

    #[test]
    fn ssh_user_and_address() {
        let t = BASE.replace("  minSize: 2\n", "  minSize: 2\n  sshUser: \"root;id\"\n");
        expect_one(
            &t,
            "spec.sshUser: InstanceGroup nodes: \"root;id\" is not a login name",
        );
        let ok = BASE.replace("  minSize: 2\n", "  minSize: 2\n  sshUser: ec2-user\n");
        assert!(check(&ok).is_empty(), "{:?}", check(&ok));
        let t = BASE.replace(
            "  kubernetesVersion: 1.35.1",
            "  kubernetesVersion: 1.35.1\n  topology: {type: Private, sshAddress: Public}",
        );
        assert!(
            check(&t)
                .iter()
                .any(|m| m.contains("spec.topology.sshAddress") && m.contains("no public address")),
            "{:?}",
            check(&t)
        );
    }

    #[test]
    fn unknown_subnet_in_group() {
        let t = BASE.replace("  minSize: 2\n", "  minSize: 2\n  subnets: [us-east-1z]\n");
        expect_one(&t, "unknown subnet \"us-east-1z\"");
    }

    #[test]
    fn dns_zone_must_contain_cluster() {
        let t = BASE.replace(
            "  kubernetesVersion: 1.35.1",
            "  kubernetesVersion: 1.35.1\n  dns: {type: Public, zone: other.org}",
        );
        expect_one(
            &t,
            "cluster name demo.example.com is not inside zone other.org",
        );
    }

    #[test]
    fn bad_taints_and_labels() {
        let t = BASE.replace("  minSize: 2\n", "  minSize: 2\n  taints: [\"dedicated=gpu:NoWhere\"]\n  nodeLabels: {\"bad key!\": x}\n");
        expect_one(
            &t,
            "spec.taints[0]: InstanceGroup nodes: taint \"dedicated=gpu:NoWhere\" has effect",
        );
        expect_one(&t, "is not a valid label key");
    }

    #[test]
    fn ha_without_load_balancer() {
        let t = BASE
            .replace("  minSize: 1\n  maxSize: 1", "  minSize: 3\n  maxSize: 3")
            .replace(
                "  kubernetesVersion: 1.35.1",
                "  kubernetesVersion: 1.35.1\n  api: {loadBalancer: {type: None}}",
            );
        expect_one(&t, "more than one control plane needs a load balancer");
    }

    #[test]
    fn private_topology_needs_utility_subnets() {
        let t = BASE.replace("type: Public}", "type: Private}").replace(
            "  kubernetesVersion: 1.35.1",
            "  kubernetesVersion: 1.35.1\n  topology: {type: Private}",
        );
        expect_one(&t, "Private topology needs Utility subnets");
    }

    #[test]
    fn rolling_update_bounds() {
        let t = BASE.replace(
            "  minSize: 2\n",
            "  minSize: 2\n  rollingUpdate: {maxSurge: 0, maxUnavailable: \"0%\"}\n",
        );
        expect_one(&t, "cannot both be 0");
        let t = BASE.replace(
            "  minSize: 2\n",
            "  minSize: 2\n  rollingUpdate: {maxSurge: \"lots\"}\n",
        );
        expect_one(&t, "must be a count or a percentage");
    }

    const METAL: &str = r#"apiVersion: kprov.dev/v1alpha1
kind: Cluster
metadata:
  name: lab
spec:
  cloudProvider: metal
  kubernetesVersion: 1.35.1
  hosts:
  - {name: cp1, address: 198.18.0.11, roles: [control-plane]}
  - {name: cp2, address: 198.18.0.12, roles: [control-plane]}
  - {name: w1, address: 198.18.0.13, ip: 100.96.0.5, roles: [node]}
"#;

    #[test]
    fn metal_rules() {
        let errs = check(METAL);
        assert!(
            errs.iter()
                .any(|e| e.contains("2 control-plane members with stacked etcd")),
            "{errs:#?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("c.yaml:11:") && e.contains("100.96.0.5 is inside podCIDR")),
            "{errs:#?}"
        );
        let dup = METAL.replace("address: 198.18.0.12", "address: 198.18.0.11");
        assert!(
            check(&dup)
                .iter()
                .any(|e| e.contains("address 198.18.0.11 is used by another host"))
        );
        let none = METAL.replace("roles: [control-plane]}", "roles: [node]}");
        assert!(
            check(&none)
                .iter()
                .any(|e| e.contains("no host has the control-plane role"))
        );
        let ext = METAL.replace("  hosts:", "  etcd: {type: External}\n  hosts:");
        assert!(check(&ext).iter().any(|e| {
            e.contains("External etcd needs an odd number of hosts with the etcd role, found 0")
        }));
    }

    #[test]
    fn huge_group_sizes_do_not_overflow() {
        // Found by validation_never_panics: two groups near u32::MAX overflowed a u32 sum.
        let t = BASE.replace(
            "  minSize: 1\n  maxSize: 1",
            "  minSize: 4294967295\n  maxSize: 4294967295",
        ) + "---\napiVersion: kprov.dev/v1alpha1\nkind: InstanceGroup\nmetadata:\n  name: cp-b\nspec:\n  role: ControlPlane\n  minSize: 4294967295\n  maxSize: 4294967295\n";
        expect_one(&t, "8589934590 control-plane members with stacked etcd");
    }

    #[test]
    fn unknown_ccm_provider() {
        let t = METAL.replace(
            "  hosts:",
            "  cloudControllerManager: {provider: digitalocean}\n  hosts:",
        );
        assert!(
            check(&t)
                .iter()
                .any(|e| e.contains("unknown provider \"digitalocean\""))
        );
    }
}
