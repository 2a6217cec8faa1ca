//! The cluster's running instances as node-layer [`Target`]s: one paginated DescribeInstances
//! filtered by the ownership tag, mapped to targets by their Auto Scaling group.
//!
//! How kprov reaches an instance over SSH ([`SshReach`]): its public address (public topology),
//! its private address through the bastion group's instance (private topology, ProxyJump), or
//! its private address directly (`spec.topology.sshAddress: Private` or
//! `update cluster --ssh-private-address`, for operators on a VPN or peered network).
//!
//! Caveats:
//! - Instances are a snapshot: a group may replace one at any moment, so callers find them at
//!   the start of every run.
//! - An instance counts only when it carries this cluster's ownership tag
//!   (`kubernetes.io/cluster/NAME=owned`, re-checked on every item) and belongs to an Auto
//!   Scaling group of one of the cluster's instance groups.
//! - The login user follows the image family when the image is given by name; an `ami-` ID
//!   says nothing about its family, so such groups need `spec.sshUser`.

use std::collections::BTreeMap;

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, Instance};

use super::{AwsCloud, owned_by, owned_tag_key};
use crate::cloud::engine::{CloudError, Plan, ResourceId};
use crate::nodes::{CloudInstance, Target, TargetError, TargetSource};
use crate::provision::render::CloudApi;
use crate::spec::{
    Cluster, DnsType, Host, HostRole, InstanceGroup, InstanceGroupRole, SshAddress, TopologyType,
};

/// The API endpoint kubeadm uses on AWS: the API record (`spec.api.publicName`, default
/// `api.NAME`) that points at the load balancer, or the load balancer's own DNS name when the
/// cluster has no DNS (`spec.dns.type: None`). The load balancer's name is always among the
/// certificate names, so clients may use either. The port is [`api_port`].
pub(crate) fn cloud_api(cluster: &Cluster, lb_dns: &str) -> CloudApi {
    CloudApi {
        endpoint: api_record(cluster).unwrap_or_else(|| lb_dns.to_string()),
        port: api_port(),
        sans: vec![lb_dns.to_string()],
    }
}

/// The one port of the API on AWS: the port the API load balancer's listener
/// (`Listener/api`, [`super::desired`]) declares, which is also its target group's port and
/// the port the API servers listen on behind it. kprov's load balancer listens on 6443, not
/// on 443 as kops's does (kops moves the API servers to 443 too): every client of the API —
/// kubeadm's `controlPlaneEndpoint`, the admin kubeconfig kubeadm writes and kprov stores,
/// `export kubeconfig`, `validate`, the add-ons, rolling updates, `delete instance` — takes
/// its port from here.
pub(crate) fn api_port() -> u16 {
    super::desired::API_PORT
}

/// The API record clients use (`spec.api.publicName`, default `api.NAME`); None when the
/// cluster has no DNS (clients then use the load balancer's own name).
fn api_record(cluster: &Cluster) -> Option<String> {
    let spec = &cluster.spec;
    if spec.dns.as_ref().is_none_or(|d| d.kind == DnsType::None) {
        return None;
    }
    Some(
        spec.api
            .as_ref()
            .and_then(|a| a.public_name.clone())
            .unwrap_or_else(|| format!("api.{}", cluster.name())),
    )
}

/// The server URL of an AWS cluster's API as its clients use it (`export kubeconfig` and
/// every command that talks to the API through `ops::credentials::kube_client`): the API
/// record on [`api_port`], exactly the `controlPlaneEndpoint` kubeadm was given, so the
/// kubeconfig kprov stores and the one it exports name the same server. None for a metal
/// cluster (its kubeconfig carries the endpoint kubeadm was given) and for an AWS cluster
/// without DNS (its stored kubeconfig already names the load balancer, on the same port).
pub(crate) fn api_server_url(cluster: &Cluster) -> Option<String> {
    if cluster.spec.cloud_provider != crate::spec::CloudProvider::Aws {
        return None;
    }
    api_record(cluster).map(|host| format!("https://{host}:{}", api_port()))
}

/// The API load balancer's DNS name, as the cloud read found it (after an apply, read again).
pub(crate) fn load_balancer_dns(plan: &Plan) -> Option<String> {
    lb_dns(plan, "api")
}

/// The name kprov jumps through in private topology: the bastion record
/// (`spec.topology.bastion.publicName`, default `bastion.NAME`), or the bastion load
/// balancer's own DNS name when the cluster has no DNS. None before the load balancer exists.
pub(crate) fn jump_name(cluster: &Cluster, plan: &Plan) -> Option<String> {
    let no_dns = cluster
        .spec
        .dns
        .as_ref()
        .is_none_or(|d| d.kind == DnsType::None);
    if no_dns {
        lb_dns(plan, "bastion")
    } else {
        Some(crate::spec::resolve::bastion_name(cluster))
    }
}

fn lb_dns(plan: &Plan, name: &str) -> Option<String> {
    plan.actual
        .get(&ResourceId::new(super::kinds::LOAD_BALANCER, name))
        .and_then(|r| r.get_str("dnsName"))
        .filter(|d| !d.is_empty())
        .map(str::to_string)
}

/// The tag Auto Scaling puts on the instances it starts.
const TAG_ASG_NAME: &str = "aws:autoscaling:groupName";

/// Which address kprov connects to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SshReach {
    /// The instance's public address (public topology).
    Public,
    /// The private address, through the bastion's DNS name (its load balancer) as ProxyJump.
    Bastion,
    /// The private address directly (VPN, peered network, a test network).
    Private,
}

impl SshReach {
    /// From the spec (`spec.topology.sshAddress`) and the `--ssh-private-address` flag.
    pub(crate) fn of(cluster: &Cluster, private_flag: bool) -> SshReach {
        let topology = cluster.spec.topology.as_ref();
        let chosen = topology.and_then(|t| t.ssh_address);
        match (private_flag, chosen) {
            (true, _) | (false, Some(SshAddress::Private)) => SshReach::Private,
            (false, Some(SshAddress::Public)) => SshReach::Public,
            (false, Some(SshAddress::Bastion)) => SshReach::Bastion,
            (false, None) => match topology.map(|t| t.kind) {
                Some(TopologyType::Private) => SshReach::Bastion,
                _ => SshReach::Public,
            },
        }
    }
}

/// The login user of an image family, from the image's name (`ubuntu/images/...`,
/// `099720109477/ubuntu-...`, `al2023-ami-...`, `amzn2-ami-...`, `debian-12-...`).
pub(crate) fn login_user_of_image(image: &str) -> Option<&'static str> {
    let name = image.to_ascii_lowercase();
    if name.starts_with("ami-") {
        return None;
    }
    if name.contains("ubuntu") {
        Some("ubuntu")
    } else if name.contains("amzn") || name.contains("al2023") || name.contains("amazon") {
        Some("ec2-user")
    } else if name.contains("debian") {
        Some("admin")
    } else {
        None
    }
}

/// The login user of an instance group: `spec.sshUser`, else the image family's.
pub(crate) fn login_user(ig: &InstanceGroup) -> Result<String, String> {
    if let Some(u) = &ig.spec.ssh_user {
        return Ok(u.clone());
    }
    // why: a group without an image gets no login-user guess from it
    let image = ig.spec.image.as_deref().unwrap_or_default();
    login_user_of_image(image)
        .map(str::to_string)
        .ok_or_else(|| {
            format!(
                "instance group {}: cannot tell the login user of image {image:?} (known families: \
             ubuntu, Amazon Linux, Debian); set spec.sshUser",
                ig.metadata.name
            )
        })
}

/// What one DescribeInstances item says, before it becomes a target (kept apart from the SDK
/// type so the mapping is unit-tested without a cloud).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceFacts {
    pub(crate) id: String,
    pub(crate) zone: String,
    pub(crate) private_ip: String,
    pub(crate) public_ip: Option<String>,
    pub(crate) private_dns: String,
    pub(crate) launch_template_version: Option<String>,
    /// The instance's Auto Scaling group name (`NAME.CLUSTER`).
    pub(crate) asg: String,
    /// RFC 3339 launch time, to order instances stably (oldest first).
    pub(crate) launched: String,
}

/// The cluster's nodes and its jump hosts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Discovered {
    /// Kubernetes nodes (control planes first, then workers; oldest first within a group).
    pub targets: Vec<Target>,
    /// Instances of bastion groups: reached like nodes, never provisioned.
    pub jump_hosts: Vec<Target>,
    /// Owned instances kprov could not place (no group of the spec): named, not provisioned.
    pub strays: Vec<String>,
}

/// Maps instances to targets. `groups` are the cluster's instance groups; `jump_name` is the
/// name nodes are reached through in [`SshReach::Bastion`] (see [`jump_name`]).
pub(crate) fn map_instances(
    cluster: &str,
    groups: &[InstanceGroup],
    reach: SshReach,
    jump_name: Option<&str>,
    mut found: Vec<InstanceFacts>,
) -> Result<Discovered, String> {
    found.sort_by(|a, b| (&a.launched, &a.id).cmp(&(&b.launched, &b.id)));
    let by_asg: BTreeMap<String, &InstanceGroup> = groups
        .iter()
        .map(|g| (format!("{}.{cluster}", g.metadata.name), g))
        .collect();
    let mut out = Discovered::default();
    let mut users = BTreeMap::new();
    for g in groups {
        // Only groups that have instances need a user; the error is raised below.
        users.insert(g.metadata.name.clone(), login_user(g));
    }
    let target = |f: &InstanceFacts, ig: &InstanceGroup| -> Result<Target, String> {
        let user = users
            .get(&ig.metadata.name)
            .cloned()
            .unwrap_or_else(|| Err(format!("instance group {} unknown", ig.metadata.name)))?;
        let address = match reach {
            SshReach::Public => f.public_ip.clone().ok_or_else(|| {
                format!(
                    "instance {} of group {} has no public address (private subnet?): reach it \
                     through a bastion or set spec.topology.sshAddress: Private",
                    f.id, ig.metadata.name
                )
            })?,
            SshReach::Bastion | SshReach::Private => f.private_ip.clone(),
        };
        let roles = match ig.spec.role {
            InstanceGroupRole::ControlPlane => vec![HostRole::ControlPlane],
            InstanceGroupRole::Node => vec![HostRole::Node],
            InstanceGroupRole::Bastion => vec![],
        };
        Ok(Target {
            host: Host {
                name: f.id.clone(),
                address,
                ip: Some(f.private_ip.clone()),
                access_ip: None,
                user: Some(user),
                port: None,
                key_path: None,
                bastion: None,
                roles,
                labels: ig.spec.node_labels.clone(),
                taints: ig.spec.taints.clone(),
            },
            node_name: f.private_dns.clone(),
            group: Some(ig.metadata.name.clone()),
            instance: Some(CloudInstance {
                id: f.id.clone(),
                zone: f.zone.clone(),
                private_ip: f.private_ip.clone(),
                public_ip: f.public_ip.clone(),
                private_dns: f.private_dns.clone(),
                provider_id: format!("aws:///{}/{}", f.zone, f.id),
                launch_template_version: f.launch_template_version.clone(),
                group_template_version: None,
            }),
        })
    };
    let mut nodes = Vec::new();
    for f in &found {
        let Some(ig) = by_asg.get(&f.asg) else {
            out.strays.push(format!("{} (group {})", f.id, f.asg));
            continue;
        };
        if ig.spec.role == InstanceGroupRole::Bastion {
            let mut t = target(f, ig)?;
            // The way in is the bastion's name (its load balancer, whichever instance the
            // group runs now), unless private addresses were asked for.
            if reach == SshReach::Bastion {
                t.host.address = jump_name
                    .ok_or_else(|| {
                        format!(
                            "the bastion load balancer of {cluster} has no DNS name yet; re-run \
                             `kprov update cluster {cluster} --yes`"
                        )
                    })?
                    .to_string();
            }
            out.jump_hosts.push(t);
        } else {
            nodes.push((f, *ig));
        }
    }
    let jump = match reach {
        SshReach::Bastion if !nodes.is_empty() => {
            let b = out.jump_hosts.first().ok_or_else(|| {
                "private topology: the nodes are reached through a bastion, and no bastion \
                 instance is running (add a Bastion instance group, or set \
                 spec.topology.sshAddress: Private when this machine reaches private addresses)"
                    .to_string()
            })?;
            Some(format!(
                "{}@{}",
                b.host.user.as_deref().unwrap_or("root"),
                b.host.address
            ))
        }
        _ => None,
    };
    let mut targets = Vec::new();
    for (f, ig) in nodes {
        let mut t = target(f, ig)?;
        t.host.bastion = jump.clone();
        targets.push(t);
    }
    // Control planes first: the first one runs `kubeadm init`.
    targets.sort_by_key(|t| !t.is_control_plane());
    out.targets = targets;
    Ok(out)
}

fn facts(i: &Instance) -> Option<InstanceFacts> {
    let tags = || {
        i.tags()
            .iter()
            // why: a tag without key or value matches no ownership or identity key
            .map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default()))
    };
    let asg = tags().find(|(k, _)| *k == TAG_ASG_NAME).map(|(_, v)| v)?;
    let lt_version = tags()
        .find(|(k, _)| *k == "aws:ec2launchtemplate:version")
        .map(|(_, v)| v.to_string());
    Some(InstanceFacts {
        id: i.instance_id()?.to_string(),
        zone: i.placement()?.availability_zone()?.to_string(),
        private_ip: i.private_ip_address()?.to_string(),
        public_ip: i.public_ip_address().map(str::to_string),
        private_dns: i.private_dns_name()?.to_string(),
        launch_template_version: lt_version,
        asg: asg.to_string(),
        // why: shown only
        launched: i.launch_time().map(|t| t.to_string()).unwrap_or_default(),
    })
}

/// The running (and starting) instances of a cluster's groups, as targets.
#[derive(Clone)]
pub struct AwsInstances {
    ec2: aws_sdk_ec2::Client,
    cluster: String,
    groups: Vec<InstanceGroup>,
    reach: SshReach,
    jump_name: Option<String>,
}

impl AwsInstances {
    /// The instances of `groups` (the cluster's instance groups) in `cloud`'s cluster, reached
    /// over SSH as `reach` says.
    pub fn new(cloud: &AwsCloud, groups: &[InstanceGroup], reach: SshReach) -> AwsInstances {
        AwsInstances {
            ec2: cloud.ec2.clone(),
            cluster: cloud.cluster.clone(),
            groups: groups.to_vec(),
            reach,
            jump_name: None,
        }
    }

    /// The name nodes are reached through in private topology ([`jump_name`]).
    pub(crate) fn through(mut self, jump_name: Option<String>) -> AwsInstances {
        self.jump_name = jump_name;
        self
    }

    /// One paginated DescribeInstances for the whole cluster.
    pub async fn instances(&self) -> Result<Vec<InstanceFacts>, CloudError> {
        let reservations: Vec<_> = all_items!(
            self.ec2
                .describe_instances()
                .filters(
                    Filter::builder()
                        .name(format!("tag:{}", owned_tag_key(&self.cluster)))
                        .values("owned")
                        .build(),
                )
                .filters(
                    Filter::builder()
                        .name("instance-state-name")
                        .values("running")
                        .values("pending")
                        .build(),
                )
                .max_results(1000),
            "DescribeInstances"
        )?;
        Ok(reservations
            .iter()
            .flat_map(|r| r.instances())
            .filter(|i| {
                owned_by(
                    &self.cluster,
                    i.tags()
                        .iter()
                        // why: a tag without key or value matches no ownership or identity key
                        .map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default())),
                )
            })
            .filter_map(facts)
            .collect())
    }

    /// Nodes, jump hosts and strays.
    pub async fn discover(&self) -> Result<Discovered, TargetError> {
        let err = |message: String| TargetError::Discovery {
            cluster: self.cluster.clone(),
            message,
        };
        let found = self.instances().await.map_err(|e| err(e.to_string()))?;
        map_instances(
            &self.cluster,
            &self.groups,
            self.reach,
            self.jump_name.as_deref(),
            found,
        )
        .map_err(err)
    }
}

#[async_trait]
impl TargetSource for AwsInstances {
    async fn targets(&self) -> Result<Vec<Target>, TargetError> {
        Ok(self.discover().await?.targets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ig(name: &str, role: &str, image: &str, extra: &str) -> InstanceGroup {
        serde_saphyr::from_str(&format!(
            "apiVersion: kprov.dev/v1alpha1
kind: InstanceGroup
metadata: {{name: {name}}}
spec: {{role: {role}, image: {image:?}, minSize: 1, maxSize: 1{extra}}}
"
        ))
        .unwrap()
    }

    fn inst(id: &str, asg: &str, last: u8, public: bool, launched: &str) -> InstanceFacts {
        InstanceFacts {
            id: id.into(),
            zone: "us-east-1a".into(),
            private_ip: format!("198.18.32.{last}"),
            public_ip: public.then(|| format!("54.0.0.{last}")),
            private_dns: format!("ip-198-18-32-{last}.ec2.internal"),
            launch_template_version: Some("1".into()),
            asg: asg.into(),
            launched: launched.into(),
        }
    }

    const C: &str = "c.example.com";

    fn groups() -> Vec<InstanceGroup> {
        vec![
            ig("cp", "ControlPlane", "ubuntu/images/noble", ""),
            ig("nodes", "Node", "al2023-ami-2023", ""),
            ig("bastions", "Bastion", "debian-12-amd64", ""),
        ]
    }

    #[test]
    fn public_topology_reaches_public_addresses() {
        let found = vec![
            inst("i-2", "nodes.c.example.com", 5, true, "2"),
            inst("i-1", "cp.c.example.com", 4, true, "1"),
            inst("i-9", "other.c.example.com", 9, true, "1"),
        ];
        let d = map_instances(C, &groups(), SshReach::Public, None, found).unwrap();
        let cp = &d.targets[0];
        assert_eq!(cp.name(), "i-1");
        assert_eq!(cp.node_name, "ip-198-18-32-4.ec2.internal");
        assert_eq!(cp.host.address, "54.0.0.4");
        assert_eq!(cp.host.ip.as_deref(), Some("198.18.32.4"));
        assert_eq!(cp.host.user.as_deref(), Some("ubuntu"));
        assert_eq!(cp.host.roles, vec![HostRole::ControlPlane]);
        assert_eq!(cp.host.bastion, None);
        let i = cp.instance.as_ref().unwrap();
        assert_eq!(i.provider_id, "aws:///us-east-1a/i-1");
        assert_eq!(i.launch_template_version.as_deref(), Some("1"));
        assert_eq!(cp.group.as_deref(), Some("cp"));
        let n = &d.targets[1];
        assert_eq!(n.host.user.as_deref(), Some("ec2-user"));
        assert_eq!(n.host.roles, vec![HostRole::Node]);
        assert_eq!(d.strays, vec!["i-9 (group other.c.example.com)"]);
    }

    #[test]
    fn private_topology_jumps_through_the_bastion() {
        let found = vec![
            inst("i-1", "cp.c.example.com", 4, false, "1"),
            inst("i-b", "bastions.c.example.com", 10, true, "1"),
        ];
        let jump = Some("bastion.c.example.com");
        let d = map_instances(C, &groups(), SshReach::Bastion, jump, found.clone()).unwrap();
        assert_eq!(d.targets.len(), 1, "a bastion is not a Kubernetes node");
        assert_eq!(d.jump_hosts.len(), 1);
        // The way in is the bastion's name, never an address of one instance.
        assert_eq!(d.jump_hosts[0].host.address, "bastion.c.example.com");
        assert_eq!(d.jump_hosts[0].host.user.as_deref(), Some("admin"));
        assert!(d.jump_hosts[0].host.roles.is_empty());
        assert_eq!(d.targets[0].host.address, "198.18.32.4");
        assert_eq!(
            d.targets[0].host.bastion.as_deref(),
            Some("admin@bastion.c.example.com")
        );

        // Private addresses directly: no jump, even for the bastion itself.
        let d = map_instances(C, &groups(), SshReach::Private, None, found.clone()).unwrap();
        assert_eq!(d.targets[0].host.bastion, None);
        assert_eq!(d.jump_hosts[0].host.address, "198.18.32.10");

        // No bastion running: said, not guessed.
        let e =
            map_instances(C, &groups(), SshReach::Bastion, jump, found[..1].to_vec()).unwrap_err();
        assert!(e.contains("no bastion instance is running"), "{e}");
        // No name to jump through yet (the load balancer is not made): said.
        let e = map_instances(C, &groups(), SshReach::Bastion, None, found.clone()).unwrap_err();
        assert!(e.contains("has no DNS name yet"), "{e}");
        // Public reach of an instance without a public address: said, naming it.
        let e = map_instances(C, &groups(), SshReach::Public, None, found).unwrap_err();
        assert!(
            e.contains("instance i-1 of group cp has no public address"),
            "{e}"
        );
    }

    #[test]
    fn api_endpoint_is_the_record_or_the_load_balancer() {
        let c = |dns: &str| -> Cluster {
            serde_saphyr::from_str(&format!(
                "apiVersion: kprov.dev/v1alpha1
kind: Cluster
metadata: {{name: c.example.com}}
spec: {{cloudProvider: aws, dns: {dns}}}
"
            ))
            .unwrap()
        };
        let lb = "api-c-1.elb.us-east-1.amazonaws.com";
        let a = cloud_api(&c("{type: Public, zone: example.com}"), lb);
        assert_eq!(a.endpoint, "api.c.example.com");
        assert_eq!(a.port, 6443);
        assert_eq!(a.sans, vec![lb.to_string()]);
        let a = cloud_api(&c("{type: None}"), lb);
        assert_eq!(a.endpoint, lb);
    }

    /// Clients use kubeadm's `controlPlaneEndpoint`: the record on the listener's port (not
    /// `https://api.NAME`, port 443, where kprov's load balancer does not listen).
    #[test]
    fn api_clients_use_the_record_on_the_listener_port() {
        let c = |provider: &str, dns: &str| -> Cluster {
            serde_saphyr::from_str(&format!(
                "apiVersion: kprov.dev/v1alpha1
kind: Cluster
metadata: {{name: c.example.com}}
spec: {{cloudProvider: {provider}, dns: {dns}, api: {{publicName: k8s.c.example.com}}}}
"
            ))
            .unwrap()
        };
        let lb = "api-c-1.elb.us-east-1.amazonaws.com";
        let aws = c("aws", "{type: Public, zone: example.com}");
        let api = cloud_api(&aws, lb);
        assert_eq!(
            api_server_url(&aws).as_deref(),
            Some("https://k8s.c.example.com:6443")
        );
        assert_eq!(
            api_server_url(&aws),
            Some(format!("https://{}:{}", api.endpoint, api.port))
        );
        // Without DNS the stored kubeconfig (the load balancer's name) is kept; metal
        // kubeconfigs carry their own endpoint.
        assert_eq!(api_server_url(&c("aws", "{type: None}")), None);
        assert_eq!(api_server_url(&c("metal", "{type: None}")), None);
    }

    #[test]
    fn login_users_follow_the_image_or_the_group() {
        assert_eq!(
            login_user_of_image("099720109477/ubuntu/images/hvm-ssd/x"),
            Some("ubuntu")
        );
        assert_eq!(login_user_of_image("amzn2-ami-hvm-2.0"), Some("ec2-user"));
        assert_eq!(login_user_of_image("al2023-ami-2023.6"), Some("ec2-user"));
        assert_eq!(login_user_of_image("debian-12-amd64-2024"), Some("admin"));
        assert_eq!(login_user_of_image("ami-0123456789"), None);
        let by_id = ig("x", "Node", "ami-1", "");
        let e = login_user(&by_id).unwrap_err();
        assert!(
            e.contains("instance group x") && e.contains("spec.sshUser"),
            "{e}"
        );
        let set = ig("x", "Node", "ami-1", ", sshUser: core");
        assert_eq!(login_user(&set).unwrap(), "core");
        let over = ig("x", "Node", "ubuntu/images/noble", ", sshUser: ops");
        assert_eq!(login_user(&over).unwrap(), "ops");
    }
}
