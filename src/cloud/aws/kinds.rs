//! The AWS resource kinds (the first half of every `ResourceId`), as one enum.
//!
//! The engine is cloud-agnostic and carries a kind as an opaque [`Kind`], which only
//! [`AwsKind::kind`] makes (and [`AwsKind::parse_tag`] from a tag, checked against this set);
//! the provider turns it back into an [`AwsKind`] where a call enters it ([`AwsKind::of`]) and
//! dispatches from there (typed tasks through `resource::AwsResource`, whose table's
//! exhaustive match names a kind it forgot): adding a kind is one variant here, one row of
//! the `kinds!` table below (its name, and its constant) and one line of that table.

use crate::cloud::engine::{CloudError, Kind, ResourceId};

/// The EC2 kinds (networking, security groups, key pair, launch templates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Ec2Kind {
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
pub(crate) enum ElbKind {
    LoadBalancer,
    TargetGroup,
    Listener,
}

/// The IAM kinds, under the path `/kprov/CLUSTER/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum IamKind {
    Role,
    RolePolicy,
    InstanceProfile,
}

/// The Route53 kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum DnsKind {
    Zone,
    Record,
    ZoneVpc,
}

/// Every kind the AWS provider knows, grouped by the service that makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum AwsKind {
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

/// The kinds as one table, each with the name written into `kprov.dev/id` tags and shown in plans
/// (never change one: owned resources are found by it) and, where the code builds IDs of it, the
/// engine's kind as a constant (`#[cfg(test)]` where only tests do): [`AwsKind::ALL`],
/// [`AwsKind::name`] and the constants all come from it, so a new variant is one row here.
macro_rules! kinds {
    ($(
        $variant:ident $(($group:ident::$inner:ident))? => $name:literal
            $(, $(#[$attr:meta])* $konst:ident)?;
    )*) => {
        impl AwsKind {
            /// Every kind: [`AwsKind::of`] parses by it (the test below checks that each has
            /// its own name).
            pub(crate) const ALL: [AwsKind; [$($name),*].len()] =
                [$( AwsKind::$variant $(($group::$inner))? ),*];

            /// The name written into `kprov.dev/id` tags and shown in plans.
            pub(crate) const fn name(self) -> &'static str {
                match self {
                    $( AwsKind::$variant $(($group::$inner))? => $name, )*
                }
            }
        }

        // The engine's kinds, for building `ResourceId`s and comparing them (typed: a `Kind`
        // is made only by `AwsKind::kind`).
        $( kinds!(@const [$($(#[$attr])* $konst)?] AwsKind::$variant $(($group::$inner))?); )*
    };
    (@const [] $($kind:tt)*) => {};
    (@const [$(#[$attr:meta])* $konst:ident] $($kind:tt)*) => {
        $(#[$attr])*
        pub(crate) const $konst: Kind = $($kind)*.kind();
    };
}

kinds! {
    Ec2(Ec2Kind::Vpc) => "Vpc", VPC;
    Ec2(Ec2Kind::Subnet) => "Subnet", SUBNET;
    Ec2(Ec2Kind::InternetGateway) => "InternetGateway", INTERNET_GATEWAY;
    Ec2(Ec2Kind::RouteTable) => "RouteTable", #[cfg(test)] ROUTE_TABLE;
    Ec2(Ec2Kind::ElasticIp) => "ElasticIp", ELASTIC_IP;
    Ec2(Ec2Kind::NatGateway) => "NatGateway", #[cfg(test)] NAT_GATEWAY;
    Ec2(Ec2Kind::SecurityGroup) => "SecurityGroup", #[cfg(test)] SECURITY_GROUP;
    Ec2(Ec2Kind::SecurityGroupRules) => "SecurityGroupRules", SECURITY_GROUP_RULES;
    Ec2(Ec2Kind::KeyPair) => "KeyPair", #[cfg(test)] KEY_PAIR;
    Ec2(Ec2Kind::LaunchTemplate) => "LaunchTemplate", LAUNCH_TEMPLATE;
    AutoScalingGroup => "AutoScalingGroup", AUTOSCALING_GROUP;
    Elb(ElbKind::LoadBalancer) => "LoadBalancer", LOAD_BALANCER;
    Elb(ElbKind::TargetGroup) => "TargetGroup", TARGET_GROUP;
    Elb(ElbKind::Listener) => "Listener", LISTENER;
    ClassicLoadBalancer => "ClassicLoadBalancer", CLASSIC_LOAD_BALANCER;
    Iam(IamKind::Role) => "IamRole", IAM_ROLE;
    Iam(IamKind::RolePolicy) => "IamRolePolicy", #[cfg(test)] IAM_ROLE_POLICY;
    Iam(IamKind::InstanceProfile) => "IamInstanceProfile", INSTANCE_PROFILE;
    Dns(DnsKind::Zone) => "DnsZone", DNS_ZONE;
    Dns(DnsKind::Record) => "DnsRecord", DNS_RECORD;
    Dns(DnsKind::ZoneVpc) => "DnsZoneVpcAssociation", #[cfg(test)] DNS_ZONE_VPC;
    Instance => "Instance";
}

impl AwsKind {
    /// The engine's kind: the one maker of a [`Kind`] outside the engine.
    pub(crate) const fn kind(self) -> Kind {
        Kind::new(self.name())
    }

    /// Every kind of this provider, as the engine's kinds (what a tag may name).
    pub(crate) fn kinds() -> [Kind; AwsKind::ALL.len()] {
        AwsKind::ALL.map(AwsKind::kind)
    }

    /// The identity a `kprov.dev/id` tag (or a Route53 owner record) names; a kind this
    /// provider does not know is an error naming the tag.
    pub(crate) fn parse_tag(tag: &str) -> Result<ResourceId, CloudError> {
        ResourceId::parse(tag, &AwsKind::kinds())
    }

    /// The kind of `id`; a kind this provider does not know is a model error naming the
    /// resource (the engine only hands back resources the provider made or read).
    pub(crate) fn of(id: &ResourceId) -> Result<AwsKind, CloudError> {
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
