//! The AWS resource kinds (the first half of every `ResourceId`), as one enum.
//!
//! The engine is cloud-agnostic and carries a kind as text (it is written into tags); the AWS
//! provider turns it into an [`AwsKind`] once, where a call enters it ([`AwsKind::of`]), and
//! dispatches by exhaustive matches from there: adding a kind is one variant here, and the
//! compiler then names every service's create, update and delete that must say what to do.

use crate::cloud::engine::{CloudError, ResourceId};

/// The EC2 kinds (networking, security groups, key pair, launch templates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ec2Kind {
    Vpc,
    Subnet,
    InternetGateway,
    RouteTable,
    ElasticIp,
    NatGateway,
    SecurityGroup,
    SecurityGroupRules,
    KeyPair,
    LaunchTemplate,
}

/// The Elastic Load Balancing (v2) kinds: the API's network load balancer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElbKind {
    LoadBalancer,
    TargetGroup,
    Listener,
}

/// The IAM kinds, under the path `/kprov/CLUSTER/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IamKind {
    Role,
    RolePolicy,
    InstanceProfile,
}

/// The Route53 kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DnsKind {
    Zone,
    Record,
    ZoneVpc,
}

/// Every kind the AWS provider knows, grouped by the service that makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AwsKind {
    Ec2(Ec2Kind),
    AutoScalingGroup,
    Elb(ElbKind),
    /// A Classic ELB: only ever someone else's (the cloud-controller-manager's), read for
    /// `delete cluster`.
    ClassicLoadBalancer,
    Iam(IamKind),
    Dns(DnsKind),
}

impl AwsKind {
    /// Every kind: [`AwsKind::of`] parses by it (a new variant goes here too; the test below
    /// checks that each has its own name).
    pub const ALL: [AwsKind; 21] = [
        AwsKind::Ec2(Ec2Kind::Vpc),
        AwsKind::Ec2(Ec2Kind::Subnet),
        AwsKind::Ec2(Ec2Kind::InternetGateway),
        AwsKind::Ec2(Ec2Kind::RouteTable),
        AwsKind::Ec2(Ec2Kind::ElasticIp),
        AwsKind::Ec2(Ec2Kind::NatGateway),
        AwsKind::Ec2(Ec2Kind::SecurityGroup),
        AwsKind::Ec2(Ec2Kind::SecurityGroupRules),
        AwsKind::Ec2(Ec2Kind::KeyPair),
        AwsKind::Ec2(Ec2Kind::LaunchTemplate),
        AwsKind::AutoScalingGroup,
        AwsKind::Elb(ElbKind::LoadBalancer),
        AwsKind::Elb(ElbKind::TargetGroup),
        AwsKind::Elb(ElbKind::Listener),
        AwsKind::ClassicLoadBalancer,
        AwsKind::Iam(IamKind::Role),
        AwsKind::Iam(IamKind::RolePolicy),
        AwsKind::Iam(IamKind::InstanceProfile),
        AwsKind::Dns(DnsKind::Zone),
        AwsKind::Dns(DnsKind::Record),
        AwsKind::Dns(DnsKind::ZoneVpc),
    ];

    /// The name written into `kprov.dev/id` tags and shown in plans: never change one (owned
    /// resources are found by it).
    pub const fn as_str(self) -> &'static str {
        match self {
            AwsKind::Ec2(k) => match k {
                Ec2Kind::Vpc => "Vpc",
                Ec2Kind::Subnet => "Subnet",
                Ec2Kind::InternetGateway => "InternetGateway",
                Ec2Kind::RouteTable => "RouteTable",
                Ec2Kind::ElasticIp => "ElasticIp",
                Ec2Kind::NatGateway => "NatGateway",
                Ec2Kind::SecurityGroup => "SecurityGroup",
                Ec2Kind::SecurityGroupRules => "SecurityGroupRules",
                Ec2Kind::KeyPair => "KeyPair",
                Ec2Kind::LaunchTemplate => "LaunchTemplate",
            },
            AwsKind::AutoScalingGroup => "AutoScalingGroup",
            AwsKind::Elb(k) => match k {
                ElbKind::LoadBalancer => "LoadBalancer",
                ElbKind::TargetGroup => "TargetGroup",
                ElbKind::Listener => "Listener",
            },
            AwsKind::ClassicLoadBalancer => "ClassicLoadBalancer",
            AwsKind::Iam(k) => match k {
                IamKind::Role => "IamRole",
                IamKind::RolePolicy => "IamRolePolicy",
                IamKind::InstanceProfile => "IamInstanceProfile",
            },
            AwsKind::Dns(k) => match k {
                DnsKind::Zone => "DnsZone",
                DnsKind::Record => "DnsRecord",
                DnsKind::ZoneVpc => "DnsZoneVpcAssociation",
            },
        }
    }

    /// The kind of `id`; a kind this provider does not know is a model error naming the
    /// resource (the engine only hands back resources the provider made or read).
    pub fn of(id: &ResourceId) -> Result<AwsKind, CloudError> {
        AwsKind::ALL
            .into_iter()
            .find(|k| k.as_str() == id.kind)
            .ok_or_else(|| CloudError::Model(format!("{id}: not an AWS resource kind")))
    }
}

impl std::fmt::Display for AwsKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// The names as text, for building `ResourceId`s and comparing plan lines; one source, the enum.
pub const VPC: &str = AwsKind::Ec2(Ec2Kind::Vpc).as_str();
pub const SUBNET: &str = AwsKind::Ec2(Ec2Kind::Subnet).as_str();
pub const INTERNET_GATEWAY: &str = AwsKind::Ec2(Ec2Kind::InternetGateway).as_str();
pub const ROUTE_TABLE: &str = AwsKind::Ec2(Ec2Kind::RouteTable).as_str();
pub const ELASTIC_IP: &str = AwsKind::Ec2(Ec2Kind::ElasticIp).as_str();
pub const NAT_GATEWAY: &str = AwsKind::Ec2(Ec2Kind::NatGateway).as_str();
pub const SECURITY_GROUP: &str = AwsKind::Ec2(Ec2Kind::SecurityGroup).as_str();
pub const SECURITY_GROUP_RULES: &str = AwsKind::Ec2(Ec2Kind::SecurityGroupRules).as_str();
pub const KEY_PAIR: &str = AwsKind::Ec2(Ec2Kind::KeyPair).as_str();
pub const IAM_ROLE: &str = AwsKind::Iam(IamKind::Role).as_str();
pub const IAM_ROLE_POLICY: &str = AwsKind::Iam(IamKind::RolePolicy).as_str();
pub const INSTANCE_PROFILE: &str = AwsKind::Iam(IamKind::InstanceProfile).as_str();
pub const LAUNCH_TEMPLATE: &str = AwsKind::Ec2(Ec2Kind::LaunchTemplate).as_str();
pub const AUTOSCALING_GROUP: &str = AwsKind::AutoScalingGroup.as_str();
pub const LOAD_BALANCER: &str = AwsKind::Elb(ElbKind::LoadBalancer).as_str();
pub const TARGET_GROUP: &str = AwsKind::Elb(ElbKind::TargetGroup).as_str();
pub const LISTENER: &str = AwsKind::Elb(ElbKind::Listener).as_str();
/// A Classic ELB: only ever someone else's (the cloud-controller-manager's), read for `delete`.
pub const CLASSIC_LOAD_BALANCER: &str = AwsKind::ClassicLoadBalancer.as_str();
pub const DNS_ZONE: &str = AwsKind::Dns(DnsKind::Zone).as_str();
pub const DNS_RECORD: &str = AwsKind::Dns(DnsKind::Record).as_str();
pub const DNS_ZONE_VPC: &str = AwsKind::Dns(DnsKind::ZoneVpc).as_str();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_one_name_and_parses_back() {
        let names: std::collections::BTreeSet<&str> =
            AwsKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), AwsKind::ALL.len(), "two kinds share a name");
        for k in AwsKind::ALL {
            assert_eq!(AwsKind::of(&ResourceId::new(k.as_str(), "x")).ok(), Some(k));
        }
        let e = AwsKind::of(&ResourceId::new("Bucket", "logs")).expect_err("unknown");
        assert!(
            e.to_string()
                .contains("Bucket/logs: not an AWS resource kind"),
            "{e}"
        );
    }
}
