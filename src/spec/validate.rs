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

/// AWS's limit on tag keys (EC2, ELB, Auto Scaling, IAM).
pub const AWS_TAG_KEY_MAX: usize = 128;
/// The longest cluster name: a label value (the instance groups' kprov.dev/cluster label).
/// Every name kprov derives for AWS from it then fits (`kubernetes.io/cluster/NAME` is at most
/// 85 characters, `GROUP.NAME` launch templates at most 127); IAM names are hashed to 64.
pub const CLUSTER_NAME_MAX: usize = 63;

/// Providers with a known cloud-controller-manager.
pub const CCM_PROVIDERS: &[&str] = &["aws", "gce", "azure", "openstack", "vsphere", "hcloud"];

/// Which object a violation is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ObjectKey {
    /// The Cluster object (there is one per spec).
    Cluster,
    /// The InstanceGroup of that name.
    InstanceGroup(String),
}

/// One broken rule, before it is placed in a file ([`locate`] makes it a diagnostic).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The object it is in.
    pub object: ObjectKey,
    /// The field, from the object's root (`spec.networking.podCIDR`).
    pub path: FieldPath,
    /// What is wrong.
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

/// `key[=value]:Effect`, as `kubectl taint` writes them; key and value follow the label
/// rules (Kubernetes validates taints the same way).
pub fn check_taint(t: &str) -> Result<(), String> {
    let shown = shorten(t);
    let (kv, effect) = t
        .rsplit_once(':')
        .ok_or_else(|| format!("taint {shown:?} must be key[=value]:Effect"))?;
    if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
        return Err(format!(
            "taint {shown:?} has effect {:?}; expected NoSchedule, PreferNoSchedule or NoExecute",
            shorten(effect)
        ));
    }
    let (key, value) = kv.split_once('=').map_or((kv, None), |(k, v)| (k, Some(v)));
    check_label_key(key).map_err(|e| format!("taint {shown:?}: {e}"))?;
    if let Some(v) = value {
        check_label_value(v).map_err(|e| format!("taint {shown:?}: {e}"))?;
    }
    Ok(())
}

/// At most 60 characters of `s`, for messages about values that may be megabytes long.
fn shorten(s: &str) -> std::borrow::Cow<'_, str> {
    match s.char_indices().nth(60) {
        Some((i, _)) => format!("{}... ({} bytes)", &s[..i], s.len()).into(),
        None => s.into(),
    }
}

/// Kubernetes label value: empty, or at most 63 of `[A-Za-z0-9._-]`, alphanumeric at both
/// ends. This is also what keeps `--node-labels=k=v,k2=v2` unambiguous: a value cannot hold
/// `,`, `=` or a newline.
pub fn check_label_value(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Ok(());
    }
    let ok = v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && v.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "value {:?} is not a valid label value (at most 63 letters, digits, '-', '_' or \
             '.', starting and ending with a letter or digit)",
            shorten(v)
        ))
    }
}

/// Annotations: qualified-name keys, all values together at most 256 KiB (Kubernetes'
/// `TotalAnnotationSizeLimitB`).
pub fn check_annotations(a: &BTreeMap<String, String>) -> Result<(), String> {
    for k in a.keys() {
        check_label_key(k)?;
    }
    let total: usize = a.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > 256 * 1024 {
        return Err(format!(
            "annotations are {total} bytes; Kubernetes allows at most 262144 in total"
        ));
    }
    Ok(())
}

/// Labels in the `kubernetes.io` and `k8s.io` namespaces a kubelet may set on its own node
/// (`--node-labels`); any other label in those namespaces makes the kubelet exit at start.
const KUBELET_WELL_KNOWN_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.kubernetes.io/zone",
    "failure-domain.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
];

fn in_namespace(ns: &str, domain: &str) -> bool {
    ns == domain || ns.ends_with(&format!(".{domain}"))
}

/// Whether a kubelet accepts `key` in `--node-labels` (the kubelet's own rule).
pub fn check_kubelet_label(key: &str) -> Result<(), String> {
    let Some((ns, _)) = key.rsplit_once('/') else {
        return Ok(());
    };
    let reserved = in_namespace(ns, "kubernetes.io") || in_namespace(ns, "k8s.io");
    let allowed = in_namespace(ns, "kubelet.kubernetes.io")
        || in_namespace(ns, "node.kubernetes.io")
        || KUBELET_WELL_KNOWN_LABELS.contains(&key);
    if !reserved || allowed {
        return Ok(());
    }
    let hint = if ns == "node-role.kubernetes.io" {
        " Node roles are shown by `kubectl get nodes` from these labels, which an \
         administrator sets after the node joins (`kubectl label node NAME \
         node-role.kubernetes.io/worker=`); or use a label of your own, like \
         node.kubernetes.io/role=worker."
    } else {
        " Use a prefix of your own (like example.com/), or node.kubernetes.io/ or \
         kubelet.kubernetes.io/."
    };
    Err(format!(
        "label {key:?} is in the reserved {ns} namespace: a kubelet refuses to start with it \
         (kubelets may set only node.kubernetes.io/, kubelet.kubernetes.io/ and a few \
         well-known labels on their node).{hint}"
    ))
}

/// Kubernetes label key: optional DNS-subdomain prefix and '/', then a name of up to 63
/// alphanumerics, '-', '_' or '.'.
pub fn check_label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = k.split_once('/').map_or((None, k), |(p, n)| (Some(p), n));
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Err(format!(
            "key prefix {:?} is not a DNS subdomain",
            shorten(prefix)
        ));
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
        Err(format!(
            "key {:?} is not a valid label key (optional DNS prefix and '/', then at most 63 \
             letters, digits, '-', '_' or '.', starting and ending with a letter or digit)",
            shorten(k)
        ))
    }
}

/// A download URL (`spec.assets`): scheme http, https or file, then no whitespace or control
/// characters (the URL reaches curl on every node; it is quoted there, but a URL with a space
/// or a newline is never what was meant).
pub fn check_url(u: &str) -> Result<(), String> {
    let shown = shorten(u);
    if u.len() > 2048 {
        return Err(format!("URL {shown:?} is longer than 2048 characters"));
    }
    if let Some(c) = u.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "URL {shown:?} contains {c:?}; whitespace and control characters are not allowed \
             (percent-encode them, e.g. %20)"
        ));
    }
    let rest = ["http://", "https://", "file://"]
        .iter()
        .find_map(|s| u.strip_prefix(s))
        .ok_or_else(|| {
            format!("URL {shown:?} must start with http://, https:// or file:// (lowercase)")
        })?;
    if rest.is_empty() || (!u.starts_with("file://") && rest.starts_with('/')) {
        return Err(format!("URL {shown:?} has no host"));
    }
    Ok(())
}

/// Characters of a host name as ssh takes it (letters, digits, '-', '_', '.'), never starting
/// with '-' (ssh would read an option); or an IPv4/IPv6 address.
pub fn check_ssh_host(h: &str) -> Result<(), String> {
    if h.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    let ok = !h.is_empty()
        && h.len() <= 253
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && h.split('.')
            .all(|l| !l.is_empty() && !l.starts_with('-') && !l.ends_with('-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not a host name or IP address (letters, digits, '-', '_' and '.'; no \
             label may start or end with '-')",
            shorten(h)
        ))
    }
}

/// A login name for ssh: letters, digits, '.', '_', '-', not starting with '-', at most 64.
pub fn check_ssh_user(u: &str) -> Result<(), String> {
    let ok = !u.is_empty()
        && u.len() <= 64
        && !u.starts_with('-')
        && u.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not a user name (letters, digits, '.', '_' and '-', not starting with '-')",
            shorten(u)
        ))
    }
}

/// A port for ssh, 1..=65535.
pub fn check_ssh_port(p: u32) -> Result<(), String> {
    if (1..=65535).contains(&p) {
        Ok(())
    } else {
        Err(format!("port {p} is not in 1..65535"))
    }
}

/// A private key path for `ssh -i`: not starting with '-', no whitespace or control
/// characters.
pub fn check_key_path(k: &str) -> Result<(), String> {
    if k.is_empty() || k.starts_with('-') || k.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "{:?} is not a usable key path (it must not be empty, start with '-', or contain \
             whitespace or control characters)",
            shorten(k)
        ));
    }
    Ok(())
}

/// A jump host for ssh's ProxyJump: `[user@]host[:port]`, host a name, an IPv4 address or
/// `[IPv6]`.
pub fn check_bastion(b: &str) -> Result<(), String> {
    let shown = shorten(b);
    let (user, hostport) = match b.split_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, b),
    };
    if let Some(u) = user {
        check_ssh_user(u).map_err(|e| format!("bastion {shown:?}: {e}"))?;
    }
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("bastion {shown:?}: unclosed '['"))?;
        if h.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("bastion {shown:?}: {h:?} is not an IPv6 address"));
        }
        match after.strip_prefix(':') {
            Some(p) => (None, Some(p)),
            None if after.is_empty() => (None, None),
            None => return Err(format!("bastion {shown:?} is not [user@]host[:port]")),
        }
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(hostport), None),
        }
    };
    if let Some(h) = host {
        check_ssh_host(h).map_err(|e| format!("bastion {shown:?}: {e}"))?;
    }
    if let Some(p) = port {
        let n: u32 = p
            .parse()
            .map_err(|_| format!("bastion {shown:?}: port {:?} is not a number", shorten(p)))?;
        check_ssh_port(n).map_err(|e| format!("bastion {shown:?}: {e}"))?;
    }
    Ok(())
}

/// What every object starts with: apiVersion, kind, and its metadata.
fn check_header(c: &mut Check, api_version: &str, kind: &str, want_kind: &str, meta: &ObjectMeta) {
    if api_version != API_VERSION {
        c.err(p("apiVersion"), format!("must be {API_VERSION}"));
    }
    if kind != want_kind {
        c.err(p("kind"), format!("must be {want_kind}"));
    }
    check_metadata(c, meta);
}

/// Labels (keys and values) and annotations of an object's metadata.
fn check_metadata(c: &mut Check, meta: &ObjectMeta) {
    for (k, v) in &meta.labels {
        if let Err(e) = check_label_key(k).and_then(|()| check_label_value(v)) {
            c.err(p("metadata.labels").key(k), e);
        }
    }
    if let Err(e) = check_annotations(&meta.annotations) {
        c.err(p("metadata.annotations"), e);
    }
}

/// A sha256 as `spec.assets` gives it: 64 hex digits.
fn check_sha256(s: &str) -> Result<(), String> {
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(format!("{s:?} is not a sha256 (64 hex digits)"))
    }
}

/// The host of `host[:port]`.
fn endpoint_host(ep: &str) -> &str {
    ep.rsplit_once(':')
        .filter(|(_, port)| port.parse::<u16>().is_ok())
        .map_or(ep, |(h, _)| h)
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
    check_header(c, &cl.api_version, &cl.kind, KIND_CLUSTER, &cl.metadata);
    if !is_dns_subdomain(name) {
        c.err(
            p("metadata.name"),
            format!("{name:?} is not a valid DNS name (lowercase letters, digits, '-' and '.')"),
        );
    } else if aws && !name.contains('.') {
        c.err(p("metadata.name"), format!("{name:?} must be a fully qualified DNS name like {name}.example.com (or {name}.k8s.local without DNS)"));
    } else if name.len() > CLUSTER_NAME_MAX {
        // Said here, at the name's line, at create and at every load: the same limit otherwise
        // surfaces only as a bad label value on every instance group.
        c.err(
            p("metadata.name"),
            format!(
                "is {} characters; a cluster name has at most {CLUSTER_NAME_MAX} (it is the \
                 {CLUSTER_LABEL} label of its instance groups, and on AWS part of tag keys \
                 kubernetes.io/cluster/NAME, at most {AWS_TAG_KEY_MAX} characters; IAM and load \
                 balancer names longer than AWS allows are shortened with a hash)",
                name.len()
            ),
        );
    }

    match s.kubernetes_version.as_deref() {
        None => c.err(p("spec.kubernetesVersion"), "is required"),
        Some(v) if versions::parse(v).is_none() => c.err(
            p("spec.kubernetesVersion"),
            format!("{v:?} is not a version like 1.35.1"),
        ),
        Some(v) if !versions::is_installable(v, s.assets.as_ref()) => c.err(
            p("spec.kubernetesVersion"),
            if crate::spec::assets::minor_known(v) {
                format!(
                    "{v} is newer than kprov's checksum table ({}); `kprov create cluster \
                     --kubernetes-version {v}` (or `create -f`) pins the release's published \
                     checksums in spec.assets.checksums",
                    versions::supported_list()
                )
            } else {
                format!(
                    "{v} is not supported; supported versions (pinned checksums): {}",
                    versions::supported_list()
                )
            },
        ),
        _ => {}
    }

    // kube-proxy reads maxPerCore as an int32.
    if let Some(n) = s.kube_proxy.as_ref().and_then(|k| k.conntrack_max_per_core)
        && n > i32::MAX as u32
    {
        c.err(
            p("spec.kubeProxy.conntrackMaxPerCore"),
            format!("{n} is larger than kube-proxy accepts ({})", i32::MAX),
        );
    }

    if let Err(e) = super::mirrors::check_spec(s) {
        c.err(p(&e.field), e.message);
    }
    if let Some(k) = &s.kubelet
        && let Err(e) = k.eviction_hard()
    {
        c.err(p("spec.kubelet.evictionHard"), e);
    }
    // The kubelet reads maxPods as an int32 and refuses a node that can run no pod.
    if let Some(n) = s.kubelet.as_ref().and_then(|k| k.max_pods)
        && (n == 0 || n > i32::MAX as u32)
    {
        c.err(
            p("spec.kubelet.maxPods"),
            format!(
                "{n} is not a pod count the kubelet accepts (1 to {})",
                i32::MAX
            ),
        );
    }
    if let Some(image) = s.api.as_ref().and_then(|a| a.local_proxy_image.as_deref())
        && (image.is_empty()
            || !image
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "./:_@-".contains(ch)))
    {
        c.err(
            p("spec.api.localProxyImage"),
            format!("{image:?} is not an image reference (REGISTRY/NAME:TAG or NAME@sha256:...)"),
        );
    }

    // Who may reach SSH and the API (AWS security group sources).
    for (field, list) in [
        ("spec.sshAccess", &s.ssh_access),
        ("spec.kubernetesApiAccess", &s.kubernetes_api_access),
    ] {
        let Some(list) = list else { continue };
        if !aws {
            c.err(
                p(field),
                "applies to AWS clusters only (a metal cluster's firewall is its own)",
            );
            continue;
        }
        if list.is_empty() {
            c.err(
                p(field),
                "lists no CIDR: kprov itself needs to reach it (leave it out for 0.0.0.0/0)",
            );
        }
        for (i, v) in list.iter().enumerate() {
            parse_cidr(c, p(field).index(i), v);
        }
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
            // etcd runs as a host service beside any other role (Kubespray's host-deployed
            // etcd), so co-located etcd hosts need no rule here.
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
            let host = endpoint_host(ep);
            if host.parse::<std::net::IpAddr>().is_err() && !is_dns_subdomain(host) {
                c.err(p("spec.api.endpoint"), format!("{ep:?} is not host[:port]"));
            }
        }
        if let Some(addr) = &api.endpoint_address {
            // It becomes a line of every host's /etc/hosts: an IP address, for a name.
            let named = api.endpoint.as_deref().is_some_and(|ep| {
                let host = endpoint_host(ep);
                host.parse::<std::net::IpAddr>().is_err() && is_dns_subdomain(host)
            });
            if addr.parse::<std::net::IpAddr>().is_err() {
                c.err(
                    p("spec.api.endpointAddress"),
                    format!("{addr:?} is not an IP address"),
                );
            } else if aws || !named {
                c.err(
                    p("spec.api.endpointAddress"),
                    "is the address of spec.api.endpoint's DNS name on metal hosts: set \
                     spec.api.endpoint to a name (name:port) on a metal cluster",
                );
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
            && let Err(e) = check_url(m)
        {
            c.err(p("spec.assets.mirror"), e);
        }
        for (i, f) in a.files.iter().enumerate() {
            let base = p("spec.assets.files").index(i);
            if let Err(e) = check_sha256(&f.sha256) {
                c.err(base.key("sha256"), e);
            }
            if let Err(e) = check_url(&f.url) {
                c.err(base.key("url"), e);
            }
        }
        let mut urls = HashSet::new();
        let mut shas = HashSet::new();
        for (i, img) in a.images.iter().enumerate() {
            let base = p("spec.assets.images").index(i);
            if let Err(e) = check_sha256(&img.sha256) {
                c.err(base.key("sha256"), e);
            } else if !shas.insert(img.sha256.to_ascii_lowercase()) {
                c.err(
                    base.key("sha256"),
                    "duplicate image archive: an earlier entry has the same sha256",
                );
            }
            if let Err(e) = check_url(&img.url) {
                c.err(base.key("url"), e);
            } else if !urls.insert(img.url.as_str()) {
                c.err(
                    base.key("url"),
                    format!("duplicate image archive: {:?} is listed twice", img.url),
                );
            } else if img.url.ends_with('/') {
                c.err(
                    base.key("url"),
                    format!("{:?} names a directory; give the archive file", img.url),
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
        // These reach ssh's command line: kprov checks them itself rather than trusting ssh
        // to refuse an address like `-oProxyCommand=...`.
        let address_ok = check_ssh_host(&h.address);
        if let Err(e) = &address_ok {
            c.err(base.key("address"), e.clone());
        }
        if let Some(Err(e)) = h.user.as_deref().map(check_ssh_user) {
            c.err(base.key("user"), e);
        }
        if let Some(Err(e)) = h.port.map(|p| check_ssh_port(p.into())) {
            c.err(base.key("port"), e);
        }
        if let Some(Err(e)) = h.key_path.as_deref().map(check_key_path) {
            c.err(base.key("keyPath"), e);
        }
        if let Some(Err(e)) = h.bastion.as_deref().map(check_bastion) {
            c.err(base.key("bastion"), e);
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
        // (Not said of an address that is not even a host name: that one problem is enough.)
        if h.ip.is_none() && address_ok.is_ok() && h.address.parse::<std::net::IpAddr>().is_err() {
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

/// Node labels (they reach the kubelet's `--node-labels`) and taints.
fn check_labels_and_taints(
    c: &mut Check,
    base: &FieldPath,
    labels: &BTreeMap<String, String>,
    taints: &[String],
    labels_field: &str,
) {
    for (k, v) in labels {
        let path = base.key(labels_field).key(k);
        if let Err(e) = check_label_key(k)
            .and_then(|()| check_label_value(v))
            .and_then(|()| check_kubelet_label(k))
        {
            c.err(path, e);
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
    check_header(
        c,
        &ig.api_version,
        &ig.kind,
        KIND_INSTANCE_GROUP,
        &ig.metadata,
    );
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
        if s.image.as_deref().is_some_and(|i| i.trim().is_empty()) {
            c.err(
                p("spec.image"),
                "is empty: name an AMI (ami-...) or a name pattern, or remove it for the default image",
            );
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
    use std::sync::LazyLock;

    use super::super::defaults::complete;
    use super::super::fixtures::aws_stream;
    use super::super::load::{Object, load_objects};
    use super::*;

    /// A valid AWS cluster; each test changes one thing in it.
    static BASE: LazyLock<String> = LazyLock::new(|| {
        aws_stream(
            "  kubernetesVersion: 1.35.1
  networking:
    networkCIDR: 172.20.0.0/16
    subnets:
    - {name: us-east-1a, zone: us-east-1a, cidr: 172.20.32.0/19, type: Public}
    - {name: us-east-1b, zone: us-east-1b, cidr: 172.20.64.0/19, type: Public}
",
            &[
                ("control-plane-us-east-1a", "ControlPlane", Some((1, 1))),
                ("nodes", "Node", Some((2, 3))),
            ],
        )
    });

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

    /// BASE with `extra` (whole lines) in the cluster's spec.
    fn with_spec(extra: &str) -> String {
        BASE.replace(
            "  kubernetesVersion: 1.35.1\n",
            &format!("  kubernetesVersion: 1.35.1\n{extra}"),
        )
    }

    /// BASE with `extra` (whole lines) in the `nodes` group's spec.
    fn with_nodes(extra: &str) -> String {
        BASE.replace("  minSize: 2\n", &format!("  minSize: 2\n{extra}"))
    }

    fn expect_one(text: &str, needle: &str) {
        expect_all(&check(text), &[needle]);
    }

    /// Each needle is in one of the messages.
    fn expect_all(errs: &[String], needles: &[&str]) {
        for needle in needles {
            assert!(
                errs.iter().any(|e| e.contains(needle)),
                "expected {needle:?} in {errs:#?}"
            );
        }
    }

    /// `check` takes every value of `ok` and refuses every value of `bad`.
    fn table(check: fn(&str) -> Result<(), String>, ok: &[&str], bad: &[&str]) {
        for v in ok {
            assert_eq!(check(v), Ok(()), "{v}");
        }
        for v in bad {
            assert!(check(v).is_err(), "{v:?}");
        }
    }

    #[test]
    fn base_spec_is_valid() {
        assert_eq!(check(&BASE), Vec::<String>::new());
    }

    #[test]
    fn an_empty_image_is_refused_at_its_line() {
        let t = with_nodes("  image: \"\"\n");
        expect_one(&t, "c.yaml:30:10:");
        expect_one(&t, "is empty: name an AMI");
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
        for (version, needle) in [
            (
                "1.20.0",
                "c.yaml:7:22: spec.kubernetesVersion: 1.20.0 is not supported",
            ),
            ("latest", "is not a version like 1.35.1"),
            // The supported versions as ranges per minor, not 26 patches.
            (
                "1.37.0",
                "c.yaml:7:22: spec.kubernetesVersion: 1.37.0 is not supported; supported versions \
                 (pinned checksums): 1.34.0-1.34.11, 1.35.0-1.35.8, 1.36.0-1.36.4",
            ),
        ] {
            expect_one(&BASE.replace("1.35.1", version), needle);
        }
        assert!(check(&BASE.replace("1.35.1", "1.36.4")).is_empty());
        assert!(check(&BASE.replace("1.35.1", "v1.34.0")).is_empty());
    }

    #[test]
    fn conntrack_max_per_core_fits_kube_proxy() {
        let t = with_spec("  kubeProxy:\n    conntrackMaxPerCore: 4294967295\n");
        expect_one(
            &t,
            "c.yaml:9:26: spec.kubeProxy.conntrackMaxPerCore: 4294967295 is larger than kube-proxy \
             accepts (2147483647)",
        );
        let t = with_spec(
            "  kubeProxy: {proxyMode: nftables, conntrackMaxPerCore: 0}\n  \
             kubelet: {failCgroupV1: false}\n  containerd: {restrictOOMScoreAdj: true}\n  \
             preflight: {requireClockSync: false}\n",
        );
        assert!(check(&t).is_empty(), "{:?}", check(&t));
        let t = with_spec("  kubelet:\n    evictionHard: memory.available<100Mi,disk.free<1Gi\n");
        expect_one(
            &t,
            "c.yaml:9:19: spec.kubelet.evictionHard: \"disk.free\" is not a kubelet eviction signal \
             (one of memory.available, nodefs.available, nodefs.inodesFree, imagefs.available, \
             imagefs.inodesFree, containerfs.available, containerfs.inodesFree, pid.available)",
        );
        let t = with_spec("  kubelet:\n    maxPods: 0\n");
        expect_one(
            &t,
            "c.yaml:9:14: spec.kubelet.maxPods: 0 is not a pod count the kubelet accepts (1 to 2147483647)",
        );
        let t = with_spec("  kubelet:\n    maxPods: 250\n");
        assert!(check(&t).is_empty(), "{:?}", check(&t));
        for bad in [
            "nodefs.available<ten",
            "nodefs.available",
            "nodefs.available<101%",
        ] {
            let t = with_spec(&format!("  kubelet: {{evictionHard: \"{bad}\"}}\n"));
            assert_eq!(check(&t).len(), 1, "{bad}: {:?}", check(&t));
        }
        let t = with_spec("  api: {localProxyImage: \"x; rm -rf /\"}\n");
        assert_eq!(check(&t).len(), 1, "{:?}", check(&t));
        // A mode kube-proxy does not have is a load error at its line.
        let t = with_spec("  kubeProxy: {proxyMode: userspace}\n");
        let e = load_objects("c.yaml", &t).unwrap_err().to_string();
        assert!(e.contains("c.yaml:8") && e.contains("userspace"), "{e}");
    }

    /// A cluster name's limit (63, the instance groups' label value) is said at the name's
    /// line, at create and at every load; 63 itself is fine.
    #[test]
    fn long_cluster_names_are_refused_at_their_line() {
        let long = format!("{}.example.com", "a".repeat(52)); // 64 characters
        let errs = check(&BASE.replace("name: demo.example.com", &format!("name: {long}")));
        assert!(
            errs.iter().any(|e| e.starts_with("c.yaml:4:")
                && e.contains("metadata.name: is 64 characters")
                && e.contains("at most 63")),
            "{errs:#?}"
        );
        let ok = format!("{}.example.com", "a".repeat(51));
        assert_eq!(
            check(&BASE.replace("name: demo.example.com", &format!("name: {ok}"))),
            Vec::<String>::new()
        );
    }

    /// sshAccess and kubernetesApiAccess are CIDR lists, refused at the bad entry's line.
    #[test]
    fn access_lists_are_checked_at_their_lines() {
        let t = with_spec(
            "  sshAccess:\n  - 203.0.113.0/24\n  - 203.0.113.7\n  kubernetesApiAccess: [10.0.0.1/8]\n",
        );
        let errs = check(&t);
        assert!(
            errs.iter().any(|e| e.starts_with("c.yaml:10:")
                && e.contains("spec.sshAccess[1]")
                && e.contains("not an IPv4 CIDR")),
            "{errs:#?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("spec.kubernetesApiAccess[0]") && e.contains("host bits")),
            "{errs:#?}"
        );
        assert_eq!(errs.len(), 2, "{errs:#?}");
        let t = with_spec("  sshAccess: []\n");
        expect_one(&t, "spec.sshAccess: lists no CIDR");
        let t = with_spec("  sshAccess: [203.0.113.0/24]\n  kubernetesApiAccess: [192.0.2.0/24]\n");
        assert_eq!(check(&t), Vec::<String>::new());
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
        for (from, to, needle) in [
            (
                "name: demo.example.com",
                "name: Demo_Cluster.example.com",
                "is not a valid DNS name",
            ),
            (
                "name: demo.example.com",
                "name: demo",
                "must be a fully qualified DNS name",
            ),
            (
                "name: nodes",
                "name: Nodes!",
                "metadata.name: InstanceGroup Nodes!: \"Nodes!\" is not a valid name",
            ),
        ] {
            expect_one(&BASE.replace(from, to), needle);
        }
    }

    #[test]
    fn ssh_user_and_address() {
        let t = with_nodes("  sshUser: \"root;id\"\n");
        expect_one(
            &t,
            "spec.sshUser: InstanceGroup nodes: \"root;id\" is not a login name",
        );
        let ok = with_nodes("  sshUser: ec2-user\n");
        assert!(check(&ok).is_empty(), "{:?}", check(&ok));
        let t = with_spec("  topology: {type: Private, sshAddress: Public}\n");
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
        let t = with_nodes("  subnets: [us-east-1z]\n");
        expect_one(&t, "unknown subnet \"us-east-1z\"");
    }

    #[test]
    fn dns_zone_must_contain_cluster() {
        let t = with_spec("  dns: {type: Public, zone: other.org}\n");
        expect_one(
            &t,
            "cluster name demo.example.com is not inside zone other.org",
        );
    }

    #[test]
    fn urls_table() {
        table(
            check_url,
            &[
                "https://mirror.example.com/files",
                "http://10.0.0.1:8080/k8s",
                "file:///srv/mirror",
                "https://h/a%20b?x=1&y=2#f",
            ],
            &[
                "ftp://x/y",
                "HTTPS://x",
                "https://",
                "https:///path",
                "https://x/a b",
                "https://x/a\nb",
                "https://x/a\tb",
                "https://x/\u{7f}",
                "-https://x",
                " https://x",
                "javascript:alert(1)",
            ],
        );
        assert!(check_url(&format!("https://x/{}", "a".repeat(3000))).is_err());
    }

    #[test]
    fn ssh_fields_table() {
        table(
            check_ssh_host,
            &[
                "cp1",
                "cp1.example.com",
                "10.0.0.1",
                "fd00::1",
                "host_1.lan",
            ],
            &[
                "",
                "-oProxyCommand=touch /x",
                "-J",
                "a b",
                "a\nb",
                "a;b",
                "a$(b)",
                "host:22",
                "user@host",
                "-host.example.com",
                "a..b",
            ],
        );
        table(
            check_ssh_user,
            &["root", "ubuntu", "core", "svc.deploy", "a-b_c"],
            &[
                "",
                "-oProxyCommand=x",
                "a b",
                "a@b",
                "a\n",
                "a;b",
                &"u".repeat(65),
            ],
        );
        table(
            check_key_path,
            &["~/.ssh/id_ed25519", "/home/me/.ssh/id_rsa", "keys/id"],
            &["", "-oProxyCommand=x", "/a b", "/a\n", "/a\u{0}"],
        );
        table(
            check_bastion,
            &[
                "bastion",
                "ops@bastion.example.com:2222",
                "10.0.0.1",
                "[fd00::1]:22",
                "u@[fd00::1]",
            ],
            &[
                "-oProxyCommand=touch /x",
                "u@-oProxyCommand=x",
                "-u@host",
                "host:0",
                "host:65536",
                "host:x",
                "host:22:23",
                "[fd00::1",
                "[nothost]:22",
                "a b",
                "a,b",
                "host\n",
            ],
        );
        assert!(check_ssh_port(0).is_err() && check_ssh_port(65536).is_err());
        assert!(check_ssh_port(1).is_ok() && check_ssh_port(65535).is_ok());
    }

    #[test]
    fn hostile_host_fields_point_at_their_lines() {
        let t = METAL
            .replace("198.18.0.12, roles", "\"-oProxyCommand=touch /x\", roles")
            .replace(
                "{name: w1, address: 198.18.0.13,",
                "{name: w1, address: 198.18.0.13, user: \"-x\", bastion: \"b;touch /x\", keyPath: \"-i\",",
            )
            .replace(
                "  hosts:",
                "  assets: {mirror: \"https://m.example/$(touch /x) x\"}\n  hosts:",
            );
        let errs = check(&t);
        expect_all(
            &errs,
            &[
                "c.yaml:11:", // the assets line
                "spec.assets.mirror: URL",
                "spec.hosts[1].address: \"-oProxyCommand=touch /x\" is not a host name",
                "spec.hosts[2].user:",
                "spec.hosts[2].bastion:",
                "spec.hosts[2].keyPath:",
            ],
        );
    }

    #[test]
    fn labels_table() {
        table(
            check_label_value,
            &["", "a", "ssd", "v1.2_x-y", &"a".repeat(63)],
            &[
                "-a",
                "a-",
                "a,b=c",
                "a\nb",
                "a b",
                "a=b",
                "é",
                &"a".repeat(64),
            ],
        );
        table(
            check_label_key,
            &[
                "disk",
                "example.com/disk",
                "node.kubernetes.io/role",
                "a.b-c_d",
            ],
            &[
                "",
                "/a",
                "a/",
                "Example.com/a",
                "a/b/c",
                "-a",
                &"k".repeat(64),
                &format!("{}/a", "p".repeat(254)),
            ],
        );
        table(
            check_kubelet_label,
            &[
                "disk",
                "example.com/disk",
                "node.kubernetes.io/role",
                "x.node.kubernetes.io/a",
                "kubelet.kubernetes.io/a",
                "topology.kubernetes.io/zone",
                "kubernetes.io/os",
            ],
            &[
                "node-role.kubernetes.io/worker",
                "node-role.kubernetes.io/control-plane",
                "kubernetes.io/role",
                "example.k8s.io/x",
                "k8s.io/x",
                "node-restriction.kubernetes.io/x",
            ],
        );
        let e = check_kubelet_label("node-role.kubernetes.io/worker").unwrap_err();
        assert!(
            e.contains("kubelet refuses to start") && e.contains("kubectl label node"),
            "{e}"
        );
        table(
            check_taint,
            &[
                "k:NoSchedule",
                "k=v:NoExecute",
                "example.com/k=:PreferNoSchedule",
            ],
            &[
                "k",
                "k=v:Never",
                "k=a,b:NoSchedule",
                "k=a\nb:NoSchedule",
                "bad key:NoSchedule",
            ],
        );
    }

    #[test]
    fn huge_and_reserved_labels_are_refused_at_load() {
        let big = "a".repeat(10 * 1024 * 1024);
        let t = METAL.replace(
            "{name: w1, address: 198.18.0.13, ip: 100.96.0.5, roles: [node]}",
            &format!(
                "{{name: w1, address: 198.18.0.13, roles: [node], labels: {{team: {big}, \"node-role.kubernetes.io/worker\": \"\"}}, taints: [\"k=a,b:NoSchedule\"]}}"
            ),
        );
        let errs = check(&t);
        assert!(
            errs.iter()
                .any(|e| e.contains("spec.hosts[2].labels.team: value \"aaaa")
                    && e.contains("(10485760 bytes)")),
            "{errs:#?}"
        );
        assert!(
            errs.iter().all(|e| e.len() < 2000),
            "messages quote huge values in full"
        );
        expect_all(
            &errs,
            &["kubelet refuses to start", "spec.hosts[2].taints[0]"],
        );
        let t = BASE.replace(
            "  name: nodes\n",
            "  name: nodes\n  labels: {team: \"a b\"}\n  annotations: {\"bad key\": x}\n",
        );
        expect_all(&check(&t), &["metadata.labels", "metadata.annotations"]);
    }

    #[test]
    fn bad_taints_and_labels() {
        let t =
            with_nodes("  taints: [\"dedicated=gpu:NoWhere\"]\n  nodeLabels: {\"bad key!\": x}\n");
        expect_one(
            &t,
            "spec.taints[0]: InstanceGroup nodes: taint \"dedicated=gpu:NoWhere\" has effect",
        );
        expect_one(&t, "is not a valid label key");
    }

    #[test]
    fn ha_without_load_balancer() {
        let t = with_spec("  api: {loadBalancer: {type: None}}\n")
            .replace("  minSize: 1\n  maxSize: 1", "  minSize: 3\n  maxSize: 3");
        expect_one(&t, "more than one control plane needs a load balancer");
    }

    #[test]
    fn private_topology_needs_utility_subnets() {
        let t =
            with_spec("  topology: {type: Private}\n").replace("type: Public}", "type: Private}");
        expect_one(&t, "Private topology needs Utility subnets");
    }

    #[test]
    fn rolling_update_bounds() {
        let t = with_nodes("  rollingUpdate: {maxSurge: 0, maxUnavailable: \"0%\"}\n");
        expect_one(&t, "cannot both be 0");
        let t = with_nodes("  rollingUpdate: {maxSurge: \"lots\"}\n");
        expect_one(&t, "must be a count or a percentage");
    }

    #[test]
    fn image_archives_are_checked_at_their_lines() {
        let sha = "ab".repeat(32);
        let t = METAL.replace(
            "  hosts:",
            &format!(
                "  assets:\n    images:\n    - url: file:///srv/images/apiserver.tar\n      sha256: {sha}\n    \
                 - url: ftp://mirror/x.tar\n      sha256: nothex\n    \
                 - url: https://m.example/images/apiserver.tar\n      sha256: {}\n    \
                 - url: file:///srv/images/apiserver.tar\n      sha256: {}\n    \
                 - url: https://m.example/images/\n      sha256: {}\n  hosts:",
                sha.to_uppercase(),
                "cd".repeat(32),
                "ef".repeat(32),
            ),
        );
        let errs = check(&t);
        expect_all(
            &errs,
            &[
                // The second entry's url and sha256 lines.
                "c.yaml:12:12: spec.assets.images[1].url: URL \"ftp://mirror/x.tar\" must start with http://, https:// or file://",
                "c.yaml:13:15: spec.assets.images[1].sha256: \"nothex\" is not a sha256 (64 hex digits)",
                "spec.assets.images[2].sha256: duplicate image archive: an earlier entry has the same sha256",
                "spec.assets.images[3].url: duplicate image archive: \"file:///srv/images/apiserver.tar\" is listed twice",
                "spec.assets.images[4].url: \"https://m.example/images/\" names a directory",
            ],
        );
        assert!(!errs.iter().any(|e| e.contains("images[0]")), "{errs:#?}");
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
        expect_all(&errs, &["2 control-plane members with stacked etcd"]);
        assert!(
            errs.iter()
                .any(|e| e.contains("c.yaml:11:") && e.contains("100.96.0.5 is inside podCIDR")),
            "{errs:#?}"
        );
        let dup = METAL.replace("address: 198.18.0.12", "address: 198.18.0.11");
        expect_one(&dup, "address 198.18.0.11 is used by another host");
        let none = METAL.replace("roles: [control-plane]}", "roles: [node]}");
        expect_one(&none, "no host has the control-plane role");
        let ext = METAL.replace("  hosts:", "  etcd: {type: External}\n  hosts:");
        expect_one(
            &ext,
            "External etcd needs an odd number of hosts with the etcd role, found 0",
        );
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
        expect_one(&t, "unknown provider \"digitalocean\"");
    }
}
