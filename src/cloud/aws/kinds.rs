//! The AWS resource kinds (the first half of every `ResourceId`), as one enum.
//!
//! The engine is cloud-agnostic and carries a kind as an opaque [`Kind`], which only
//! [`AwsKind::kind`] makes (and [`AwsKind::parse_tag`] from a tag, checked against this set);
//! the provider turns it back into an [`AwsKind`] where a call enters it ([`AwsKind::of`]) and
//! dispatches from there (typed tasks through `resource::AwsResource`, whose table's
//! exhaustive match names a kind it forgot): adding a kind is one variant here and one line
//! of that table.

use crate::cloud::engine::{CloudError, Kind, ResourceId};

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
    /// An instance an Auto Scaling group launched: only its identity tag (its group's name,
    /// written by the launch template); never planned, created or deleted as a resource.
    Instance,
}

impl AwsKind {
    /// Every kind: [`AwsKind::of`] parses by it (a new variant goes here too; the test below
    /// checks that each has its own name).
    pub const ALL: [AwsKind; 22] = [
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
        AwsKind::Instance,
    ];

    /// The name written into `kprov.dev/id` tags and shown in plans: never change one (owned
    /// resources are found by it).
    pub const fn name(self) -> &'static str {
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
            AwsKind::Instance => "Instance",
        }
    }

    /// The engine's kind: the one maker of a [`Kind`] outside the engine.
    pub const fn kind(self) -> Kind {
        Kind::new(self.name())
    }

    /// Every kind of this provider, as the engine's kinds (what a tag may name).
    pub fn kinds() -> [Kind; 22] {
        AwsKind::ALL.map(AwsKind::kind)
    }

    /// The identity a `kprov.dev/id` tag (or a Route53 owner record) names; a kind this
    /// provider does not know is an error naming the tag.
    pub fn parse_tag(tag: &str) -> Result<ResourceId, CloudError> {
        ResourceId::parse(tag, &AwsKind::kinds())
    }

    /// The kind of `id`; a kind this provider does not know is a model error naming the
    /// resource (the engine only hands back resources the provider made or read).
    pub fn of(id: &ResourceId) -> Result<AwsKind, CloudError> {
        AwsKind::ALL
            .into_iter()
            .find(|k| k.kind() == id.kind)
            .ok_or_else(|| CloudError::Model(format!("{id}: not an AWS resource kind")))
    }
}

impl std::fmt::Display for AwsKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

// The engine's kinds, for building `ResourceId`s and comparing them (typed: a `Kind` is made
// only by `AwsKind::kind`); one source, the enum.
pub const VPC: Kind = AwsKind::Ec2(Ec2Kind::Vpc).kind();
pub const SUBNET: Kind = AwsKind::Ec2(Ec2Kind::Subnet).kind();
pub const INTERNET_GATEWAY: Kind = AwsKind::Ec2(Ec2Kind::InternetGateway).kind();
pub const ROUTE_TABLE: Kind = AwsKind::Ec2(Ec2Kind::RouteTable).kind();
pub const ELASTIC_IP: Kind = AwsKind::Ec2(Ec2Kind::ElasticIp).kind();
pub const NAT_GATEWAY: Kind = AwsKind::Ec2(Ec2Kind::NatGateway).kind();
pub const SECURITY_GROUP: Kind = AwsKind::Ec2(Ec2Kind::SecurityGroup).kind();
pub const SECURITY_GROUP_RULES: Kind = AwsKind::Ec2(Ec2Kind::SecurityGroupRules).kind();
pub const KEY_PAIR: Kind = AwsKind::Ec2(Ec2Kind::KeyPair).kind();
pub const IAM_ROLE: Kind = AwsKind::Iam(IamKind::Role).kind();
pub const IAM_ROLE_POLICY: Kind = AwsKind::Iam(IamKind::RolePolicy).kind();
pub const INSTANCE_PROFILE: Kind = AwsKind::Iam(IamKind::InstanceProfile).kind();
pub const LAUNCH_TEMPLATE: Kind = AwsKind::Ec2(Ec2Kind::LaunchTemplate).kind();
pub const AUTOSCALING_GROUP: Kind = AwsKind::AutoScalingGroup.kind();
pub const LOAD_BALANCER: Kind = AwsKind::Elb(ElbKind::LoadBalancer).kind();
pub const TARGET_GROUP: Kind = AwsKind::Elb(ElbKind::TargetGroup).kind();
pub const LISTENER: Kind = AwsKind::Elb(ElbKind::Listener).kind();
/// A Classic ELB: only ever someone else's (the cloud-controller-manager's), read for `delete`.
pub const CLASSIC_LOAD_BALANCER: Kind = AwsKind::ClassicLoadBalancer.kind();
pub const DNS_ZONE: Kind = AwsKind::Dns(DnsKind::Zone).kind();
pub const DNS_RECORD: Kind = AwsKind::Dns(DnsKind::Record).kind();
pub const DNS_ZONE_VPC: Kind = AwsKind::Dns(DnsKind::ZoneVpc).kind();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_one_name_and_parses_back() {
        let names: std::collections::BTreeSet<&str> =
            AwsKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), AwsKind::ALL.len(), "two kinds share a name");
        for k in AwsKind::ALL {
            let id = AwsKind::parse_tag(&format!("{}/x", k.name())).expect("a known kind");
            assert_eq!(id, ResourceId::new(k.kind(), "x"));
            assert_eq!(AwsKind::of(&id).ok(), Some(k));
        }
        let e = AwsKind::parse_tag("Bucket/logs").expect_err("unknown");
        assert!(
            e.to_string()
                .contains("identity tag \"Bucket/logs\": not a resource kind of this provider"),
            "{e}"
        );
        // Another provider's kind (the engine's test kinds) is not an AWS one.
        let e = AwsKind::of(&ResourceId::new(Kind::new("Bucket"), "logs")).expect_err("unknown");
        assert!(
            e.to_string()
                .contains("Bucket/logs: not an AWS resource kind"),
            "{e}"
        );
    }
}
