//! Every typed AWS task as one enum: the provider decodes an engine resource once by its
//! kind ([`AwsResource::from_resource`]) and creates, updates and deletes it through the one
//! match the table below generates. A new typed kind is one line of that table (its
//! [`AwsKind`] and its task type of the same name); the compiler then asks for nothing else
//! here, and `from_resource`'s exhaustive match names a kind the table forgot.

use super::AwsCloud;
use super::kinds::*;
use super::tasks::{self, Apply, Delete, Fields, Task};
use crate::cloud::engine::{CloudError, CloudId, FieldChange, IdMap, Resource};

/// The enum, its decoding and its dispatch, from one list of `AwsKind pattern => task type`
/// (each variant is named after its type in `tasks`).
macro_rules! aws_resources {
    ($($kind:pat => $task:ident,)*) => {
        /// An engine resource as its typed task (see the module documentation).
        #[derive(Debug, Clone, PartialEq)]
        pub(crate) enum AwsResource {
            $($task(tasks::$task),)*
        }

        impl AwsResource {
            /// The typed task `r` holds, by its kind; a kind that is no typed task (an
            /// instance, never a resource) or a missing or mistyped field is a model error
            /// naming the resource.
            pub(crate) fn from_resource(r: &Resource) -> Result<AwsResource, CloudError> {
                match AwsKind::of(&r.id)? {
                    $($kind => tasks::$task::from_resource(r).map(AwsResource::$task),)*
                    k @ AwsKind::Instance => Err(
                        CloudError::Model(format!("{}: not a typed task: {k}", r.id)),
                    ),
                }
            }

            /// The engine's resource again.
            #[cfg(test)]
            fn resource(&self) -> Resource {
                match self {
                    $(AwsResource::$task(t) => t.resource(),)*
                }
            }

            pub(super) async fn create(
                &self,
                c: &AwsCloud,
                ids: &IdMap,
            ) -> Result<CloudId, CloudError> {
                match self {
                    $(AwsResource::$task(t) => t.create(Apply { c, ids }).await,)*
                }
            }

            /// Brings `have` (read, of the same kind) to `self` (desired).
            pub(super) async fn update(
                &self,
                have: &Resource,
                changes: &[FieldChange],
                c: &AwsCloud,
                ids: &IdMap,
            ) -> Result<(), CloudError> {
                match self {
                    $(AwsResource::$task(want) => {
                        want.update(&tasks::$task::from_resource(have)?, changes, Apply { c, ids }).await
                    })*
                }
            }

            pub(super) async fn delete(&self, c: &AwsCloud, ids: &IdMap) -> Result<(), CloudError> {
                match self {
                    $(AwsResource::$task(t) => t.delete(Apply { c, ids }).await,)*
                }
            }
        }
    };
}

aws_resources! {
    AwsKind::Ec2(Ec2Kind::Vpc) => Vpc,
    AwsKind::Ec2(Ec2Kind::Subnet) => Subnet,
    AwsKind::Ec2(Ec2Kind::InternetGateway) => InternetGateway,
    AwsKind::Ec2(Ec2Kind::RouteTable) => RouteTable,
    AwsKind::Ec2(Ec2Kind::ElasticIp) => ElasticIp,
    AwsKind::Ec2(Ec2Kind::NatGateway) => NatGateway,
    AwsKind::Ec2(Ec2Kind::SecurityGroup) => SecurityGroup,
    AwsKind::Ec2(Ec2Kind::SecurityGroupRules) => SecurityGroupRules,
    AwsKind::Ec2(Ec2Kind::KeyPair) => KeyPair,
    AwsKind::Ec2(Ec2Kind::LaunchTemplate) => LaunchTemplate,
    AwsKind::Elb(ElbKind::LoadBalancer) => LoadBalancer,
    AwsKind::Elb(ElbKind::TargetGroup) => TargetGroup,
    AwsKind::Elb(ElbKind::Listener) => Listener,
    AwsKind::ClassicLoadBalancer => ClassicLoadBalancer,
    AwsKind::Iam(IamKind::Role) => IamRole,
    AwsKind::Iam(IamKind::RolePolicy) => IamRolePolicy,
    AwsKind::Iam(IamKind::InstanceProfile) => IamInstanceProfile,
    AwsKind::Dns(DnsKind::Zone) => DnsZone,
    AwsKind::Dns(DnsKind::Record) => DnsRecord,
    AwsKind::Dns(DnsKind::ZoneVpc) => DnsZoneVpc,
    AwsKind::AutoScalingGroup => AutoScalingGroup,
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::cloud::aws::Reader;
    use crate::cloud::aws::tasks::{ClassicLoadBalancer, Head, Read};
    use crate::cloud::engine::{Kind, ResourceId};

    /// A private cluster with a bastion and a private DNS zone, whose desired model holds
    /// every kind kprov makes, and a Classic ELB as a read finds one (kprov makes none).
    fn one_of_each() -> Vec<Resource> {
        let cluster: crate::spec::Cluster = serde_saphyr::from_str(
            "apiVersion: kprov.dev/v1alpha1
kind: Cluster
metadata: {name: c.example.com}
spec:
  cloudProvider: aws
  region: us-east-1
  networking:
    networkCIDR: 172.20.0.0/16
    subnets:
    - {name: a, zone: us-east-1a, cidr: 172.20.32.0/19, type: Private}
    - {name: ua, zone: us-east-1a, cidr: 172.20.0.0/22, type: Utility}
  topology: {type: Private, bastion: {}}
  dns: {type: Private, zone: example.com}
  api: {loadBalancer: {type: Public}}
  sshKey: {publicKey: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIStandIn k}
",
        )
        .expect("cluster");
        let groups: Vec<crate::spec::InstanceGroup> = [
            ("cp", "ControlPlane", 1),
            ("nodes", "Node", 2),
            ("bastion", "Bastion", 1),
        ]
        .into_iter()
        .map(|(name, role, max)| {
            serde_saphyr::from_str(&format!(
                "apiVersion: kprov.dev/v1alpha1
kind: InstanceGroup
metadata: {{name: {name}}}
spec: {{role: {role}, machineType: t3.medium, image: ami-1, minSize: 1, maxSize: {max}}}
"
            ))
            .expect("instance group")
        })
        .collect();
        let resolved = crate::spec::resolve(&cluster, &groups).expect("resolved");
        let mut out =
            super::super::desired(&resolved, &BTreeMap::new(), &BTreeMap::new()).expect("model");
        let rd = Reader::new(&[]);
        let listed =
            aws_sdk_elasticloadbalancing::types::LoadBalancerDescription::builder().build();
        let cid = CloudId::new("a1b2").expect("not empty");
        out.push(
            ClassicLoadBalancer::read(Head::listed("untracked-a1b2", cid), &listed, &rd).resource(),
        );
        out
    }

    #[test]
    fn a_resource_of_each_kind_is_the_task_of_its_kind() {
        let mut seen = BTreeSet::new();
        for r in one_of_each() {
            let kind = AwsKind::of(&r.id).expect("an AWS kind");
            let task = AwsResource::from_resource(&r).unwrap_or_else(|e| panic!("{}: {e}", r.id));
            // The same resource back: the variant is the task type of the resource's kind.
            // The ordering edges desired.rs adds beside a task's references (a group waits
            // for its subnets' route tables) are the engine's, not the task's.
            let mut back = task.resource();
            back.deps.extend(r.deps.iter().cloned());
            assert_eq!(back, r, "{}", r.id);
            seen.insert(kind);
        }
        let typed: BTreeSet<AwsKind> = AwsKind::ALL
            .into_iter()
            .filter(|k| *k != AwsKind::Instance)
            .collect();
        assert_eq!(seen, typed);
        assert_eq!(seen.len(), 21);
    }

    #[test]
    fn a_resource_of_a_wrong_kind_is_a_model_error() {
        let rs = one_of_each();
        let subnet = rs.iter().find(|r| r.id.kind == SUBNET).expect("a subnet");
        let listener = rs
            .iter()
            .find(|r| r.id.kind == LISTENER)
            .expect("a listener");
        // A listener's fields under the VPC's kind: not a VPC.
        let mut as_vpc = listener.clone();
        as_vpc.id = ResourceId::new(VPC, "main");
        let e = AwsResource::from_resource(&as_vpc).expect_err("not a VPC");
        assert!(matches!(e, CloudError::Model(_)), "{e:?}");
        assert!(e.to_string().contains("Vpc/main: field "), "{e}");
        let mut instance = subnet.clone();
        instance.id = ResourceId::new(AwsKind::Instance.kind(), "i-1");
        let e = AwsResource::from_resource(&instance).expect_err("never a resource");
        assert!(
            matches!(&e, CloudError::Model(m) if m == "Instance/i-1: not a typed task: Instance"),
            "{e:?}"
        );
        let mut other = subnet.clone();
        other.id = ResourceId::new(Kind::new("Bucket"), "logs");
        let e = AwsResource::from_resource(&other).expect_err("not AWS");
        assert!(matches!(e, CloudError::Model(_)), "{e:?}");
        assert!(
            e.to_string()
                .contains("Bucket/logs: not an AWS resource kind"),
            "{e}"
        );
    }
}
