//! The tasks' typed fields against the engine's field maps: what the diff compares and prints
//! is what it was before the move (the goldens say so too), and decoding refuses what the
//! types cannot hold, naming the resource and field.

use std::collections::HashMap;

use aws_sdk_ec2::types::{
    InternetGatewayAttachment, Route as Ec2Route, RouteTable as Ec2RouteTable,
    RouteTableAssociation,
};

use super::*;
use crate::cloud::aws::kinds::{
    ELASTIC_IP, IAM_ROLE, IAM_ROLE_POLICY, INSTANCE_PROFILE, INTERNET_GATEWAY, KEY_PAIR,
    LAUNCH_TEMPLATE, NAT_GATEWAY, ROUTE_TABLE, SECURITY_GROUP, SECURITY_GROUP_RULES, SUBNET, VPC,
};
use crate::cloud::engine::FieldRule;

fn cid(s: &str) -> CloudId {
    CloudId::new(s).expect("a test ID is not empty")
}

fn reader(refs: &[(&str, ResourceId)]) -> Reader<'static> {
    Reader {
        desired: &[],
        refs: refs
            .iter()
            .map(|(c, id)| (c.to_string(), id.clone()))
            .collect::<HashMap<_, _>>(),
        out: Vec::new(),
        warnings: Vec::new(),
        conflicts: Vec::new(),
    }
}

/// `task` as the engine's resource, which must be `want` and decode back to `task`: the
/// round trip every kind's field map makes. Returns the resource for the kind's own checks.
fn round_trip<T: Fields + PartialEq + std::fmt::Debug>(task: &T, want: Resource) -> Resource {
    let r = task.resource();
    assert_eq!(r, want);
    assert_eq!(&T::from_resource(&r).expect("decodes"), task);
    r
}

/// `r` decoded as a `T`, which makes `r` again (a set field keeps its sorted order): what
/// apply decodes is what the plan showed.
fn remade<T: Fields>(r: &Resource) -> T {
    let back = T::from_resource(r).unwrap_or_else(|e| panic!("{}: {e}", r.id));
    assert_eq!(back.resource(), *r);
    back
}

/// What decoding `r` as a `T` is refused with.
fn refusal<T: Fields + std::fmt::Debug>(r: &Resource) -> String {
    T::from_resource(r)
        .expect_err("decoding refuses it")
        .to_string()
}

/// `r` without its field `field`.
fn without(r: &Resource, field: &str) -> Resource {
    let mut r = r.clone();
    r.fields.remove(field);
    r
}

/// What the plan orders before `r`.
fn deps(r: &Resource) -> Vec<String> {
    r.dependencies().iter().map(ToString::to_string).collect()
}

/// A task's head as a read lists it, at cloud ID `c`.
fn listed_head(name: &str, c: &str) -> Head {
    Head::listed(name, cid(c))
}

fn public_table() -> RouteTable {
    RouteTable {
        head: Head::owned("public"),
        vpc: Ref::named("main"),
        routes: vec![Route {
            destination: "0.0.0.0/0".into(),
            target: RouteTarget::InternetGateway(Ref::named("main")),
        }],
        subnets: vec![Ref::named("b"), Ref::named("a")],
        associations: None,
    }
}

#[test]
fn a_task_is_the_field_map_the_diff_always_compared() {
    let vpc = Vpc {
        head: Head::owned("main"),
        cidr: "10.0.0.0/16".into(),
        dns: Some(VpcDns {
            support: true,
            hostnames: true,
        }),
    };
    let want = Resource::new(VPC, "main")
        .field("cidr", Value::str("10.0.0.0/16"))
        .rule("cidr", FieldRule::Immutable)
        .field("dnsSupport", Value::Bool(true))
        .field("dnsHostnames", Value::Bool(true));
    round_trip(&vpc, want);

    let subnet = Subnet {
        head: Head::adopted("a", Some(cid("subnet-1"))),
        vpc: Ref::named("main"),
        zone: "us-east-1a".into(),
        cidr: "10.0.1.0/24".into(),
        map_public_ip: false,
    };
    let r = subnet.resource();
    assert_eq!(r.id, ResourceId::new(SUBNET, "a"));
    assert_eq!(r.lifecycle, Lifecycle::ExistsAndValidates);
    assert_eq!(r.cloud_id.as_deref(), Some("subnet-1"));
    assert_eq!(r.get("vpc"), Some(&Value::reference(VPC, "main")));
    assert_eq!(r.field_rule("zone"), FieldRule::Immutable);
    assert_eq!(r.field_rule("mapPublicIp"), FieldRule::Mutable);
    assert_eq!(Subnet::from_resource(&r).expect("decodes"), subnet);

    let igw = InternetGateway {
        head: Head::owned("main"),
        vpc: Some(Ref::named("main")),
    };
    round_trip(
        &igw,
        Resource::new(INTERNET_GATEWAY, "main").field("vpc", Value::reference(VPC, "main")),
    );

    let table = public_table();
    let r = table.resource();
    assert_eq!(
        r,
        Resource::new(ROUTE_TABLE, "public")
            .field("vpc", Value::reference(VPC, "main"))
            .field(
                "routes",
                Value::set(vec![Value::List(vec![
                    Value::str("0.0.0.0/0"),
                    Value::reference(INTERNET_GATEWAY, "main"),
                ])])
            )
            .field(
                "subnets",
                Value::set(vec![
                    Value::reference(SUBNET, "a"),
                    Value::reference(SUBNET, "b")
                ])
            )
    );
    // The set is sorted: decoded, the subnets come back in its order.
    let back = RouteTable::from_resource(&r).expect("decodes");
    assert_eq!(back.subnets, vec![Ref::named("a"), Ref::named("b")]);
    assert_eq!(back.routes, table.routes);
    // What the diff orders by: the table needs its VPC, gateway and subnets first.
    assert_eq!(
        deps(&r),
        ["InternetGateway/main", "Subnet/a", "Subnet/b", "Vpc/main"]
    );
}

/// A route the model lists without a destination is a model error naming it, never a route
/// to "" sent to EC2; a reference of the wrong kind is refused naming the field.
#[test]
fn decoding_refuses_what_the_types_cannot_hold() {
    let route = |dest: &str| {
        Value::List(vec![Value::List(vec![
            Value::str(dest),
            Value::reference(INTERNET_GATEWAY, "main"),
        ])])
    };
    let r = public_table().resource().field("routes", route(""));
    assert_eq!(
        refusal::<RouteTable>(&r),
        "resource model: RouteTable/public: route [\"\", InternetGateway/main]: no destination"
    );

    let r = Resource::new(SUBNET, "a")
        .field("vpc", Value::reference(SUBNET, "b"))
        .field("zone", Value::str("z"))
        .field("cidr", Value::str("10.0.0.0/24"))
        .field("mapPublicIp", Value::Bool(true));
    assert_eq!(
        refusal::<Subnet>(&r),
        "resource model: Subnet/a: field vpc: expected a reference to a Vpc, found Subnet/b"
    );
    let e = refusal::<Subnet>(
        &r.clone()
            .field("vpc", Value::reference(VPC, "main"))
            .field("cidr", Value::Int(1)),
    );
    assert!(e.contains("Subnet/a: field cidr is not set"), "{e}");

    let half = Resource::new(VPC, "main")
        .field("cidr", Value::str("10.0.0.0/16"))
        .field("dnsSupport", Value::Bool(true));
    let e = refusal::<Vpc>(&half);
    assert!(e.contains("go together"), "{e}");

    let no_routes = Resource::new(ROUTE_TABLE, "t")
        .field("vpc", Value::reference(VPC, "main"))
        .field("subnets", Value::List(vec![]));
    let e = refusal::<RouteTable>(&no_routes);
    assert!(
        e.contains("RouteTable/t: field routes is not a list"),
        "{e}"
    );
}

#[test]
fn a_reference_resolves_to_the_recorded_cloud_id_or_is_one() {
    let ids: IdMap = [(ResourceId::new(VPC, "main"), cid("vpc-1"))].into();
    assert_eq!(Ref::<Vpc>::named("main").resolve(&ids).ok(), Some("vpc-1"));
    assert_eq!(Ref::<Vpc>::cloud("vpc-9").resolve(&ids).ok(), Some("vpc-9"));
    let e = Ref::<Vpc>::named("other")
        .resolve(&ids)
        .expect_err("not made yet");
    assert_eq!(
        e.to_string(),
        "resource model: Vpc/other has no cloud ID yet"
    );
    assert_eq!(
        Ref::<Vpc>::named("main").value(),
        Value::reference(VPC, "main")
    );
    assert_eq!(Ref::<Vpc>::cloud("vpc-9").value(), Value::str("vpc-9"));
}

/// The read tasks: references the reader knows become logical ones, others stay raw IDs (a
/// foreign gateway shows as itself); the route table keeps its associations for apply, and
/// EC2's local route and main association are not kprov's.
#[test]
fn a_read_route_table_names_what_the_reader_knows() {
    let rd = reader(&[
        ("vpc-1", ResourceId::new(VPC, "main")),
        ("igw-1", ResourceId::new(INTERNET_GATEWAY, "main")),
        ("nat-1", ResourceId::new(NAT_GATEWAY, "us-east-1a")),
        ("subnet-1", ResourceId::new(SUBNET, "a")),
    ]);
    let listed = Ec2RouteTable::builder()
        .vpc_id("vpc-1")
        .routes(
            Ec2Route::builder()
                .destination_cidr_block("10.0.0.0/16")
                .gateway_id("local")
                .build(),
        )
        .routes(
            Ec2Route::builder()
                .destination_cidr_block("0.0.0.0/0")
                .gateway_id("igw-1")
                .build(),
        )
        .routes(
            Ec2Route::builder()
                .destination_cidr_block("10.9.0.0/16")
                .nat_gateway_id("nat-1")
                .build(),
        )
        .routes(
            Ec2Route::builder()
                .destination_cidr_block("10.8.0.0/16")
                .nat_gateway_id("nat-foreign")
                .build(),
        )
        .associations(
            RouteTableAssociation::builder()
                .main(true)
                .route_table_association_id("rtbassoc-0")
                .build(),
        )
        .associations(
            RouteTableAssociation::builder()
                .subnet_id("subnet-1")
                .route_table_association_id("rtbassoc-1")
                .build(),
        )
        .associations(
            RouteTableAssociation::builder()
                .subnet_id("subnet-x")
                .route_table_association_id("rtbassoc-2")
                .build(),
        )
        .build();
    let head = listed_head("public", "rtb-1");
    let t = RouteTable::read(head, &listed, &rd);
    assert_eq!(t.vpc, Ref::named("main"));
    assert_eq!(
        t.routes,
        vec![
            Route {
                destination: "0.0.0.0/0".into(),
                target: RouteTarget::InternetGateway(Ref::named("main")),
            },
            Route {
                destination: "10.9.0.0/16".into(),
                target: RouteTarget::NatGateway(Ref::named("us-east-1a")),
            },
            Route {
                destination: "10.8.0.0/16".into(),
                target: RouteTarget::NatGateway(Ref::cloud("nat-foreign")),
            },
        ]
    );
    assert_eq!(t.subnets, vec![Ref::named("a"), Ref::cloud("subnet-x")]);
    let r = t.resource();
    assert_eq!(
        r.get("subnets"),
        Some(&Value::set(vec![
            Value::reference(SUBNET, "a"),
            Value::str("subnet-x")
        ]))
    );
    // Through the engine's map and back (what apply decodes), the associations survive.
    let back = RouteTable::from_resource(&r).expect("decodes");
    assert_eq!(back.associations, t.associations);
    assert_eq!(
        back.read_associations().expect("read").len(),
        2,
        "the main association is EC2's"
    );
    // A desired table has none to act on.
    let e = public_table().read_associations().expect_err("desired");
    assert!(
        e.to_string().contains("not a table read from the cloud"),
        "{e}"
    );

    let gw = InternetGateway::read(
        Head::owned("main"),
        &aws_sdk_ec2::types::InternetGateway::builder()
            .attachments(
                InternetGatewayAttachment::builder()
                    .vpc_id("vpc-other")
                    .build(),
            )
            .build(),
        &rd,
    );
    assert_eq!(gw.vpc, Some(Ref::cloud("vpc-other")));
    let detached = InternetGateway::read(
        Head::owned("main"),
        &aws_sdk_ec2::types::InternetGateway::builder().build(),
        &rd,
    );
    assert_eq!(detached.resource().get("vpc"), None);
}

/// The zone's NAT gateway and its address: the field map the diff always compared (both
/// references fixed once made), read back through the reader's logical names, and a
/// reference of the wrong kind refused naming the field.
#[test]
fn a_nat_gateway_and_its_address_are_the_field_maps_they_were() {
    let eip = ElasticIp::vpc(Head::owned("nat-us-east-1a"));
    round_trip(
        &eip,
        Resource::new(ELASTIC_IP, "nat-us-east-1a").field("domain", Value::str("vpc")),
    );

    let nat = NatGateway {
        head: Head::owned("us-east-1a"),
        subnet: Ref::named("utility-a"),
        allocation: Ref::named("nat-us-east-1a"),
    };
    let r = round_trip(
        &nat,
        Resource::new(NAT_GATEWAY, "us-east-1a")
            .field("subnet", Value::reference(SUBNET, "utility-a"))
            .field("allocation", Value::reference(ELASTIC_IP, "nat-us-east-1a"))
            .rule("subnet", FieldRule::Immutable)
            .rule("allocation", FieldRule::Immutable),
    );
    assert_eq!(deps(&r), ["ElasticIp/nat-us-east-1a", "Subnet/utility-a"]);

    let wrong = r
        .clone()
        .field("allocation", Value::reference(SUBNET, "utility-a"));
    assert_eq!(
        refusal::<NatGateway>(&wrong),
        "resource model: NatGateway/us-east-1a: field allocation: expected a reference to a \
         ElasticIp, found Subnet/utility-a"
    );

    let rd = reader(&[
        ("subnet-1", ResourceId::new(SUBNET, "utility-a")),
        ("eipalloc-1", ResourceId::new(ELASTIC_IP, "nat-us-east-1a")),
    ]);
    let listed = aws_sdk_ec2::types::NatGateway::builder()
        .subnet_id("subnet-1")
        .nat_gateway_addresses(
            aws_sdk_ec2::types::NatGatewayAddress::builder()
                .allocation_id("eipalloc-1")
                .build(),
        )
        .build();
    let head = listed_head("us-east-1a", "nat-1");
    let read = NatGateway::read(head.clone(), &listed, &rd);
    assert_eq!(read.subnet, Ref::named("utility-a"));
    assert_eq!(read.allocation, Ref::named("nat-us-east-1a"));
    // A gateway listed without an address shows none (a change the plan names), never the
    // desired one.
    let bare = NatGateway::read(
        head,
        &aws_sdk_ec2::types::NatGateway::builder()
            .subnet_id("subnet-x")
            .build(),
        &rd,
    );
    assert_eq!(bare.subnet, Ref::cloud("subnet-x"));
    assert_eq!(bare.resource().get("allocation"), Some(&Value::str("")));

    let addr = ElasticIp::read(
        Head::owned("nat-us-east-1a"),
        &aws_sdk_ec2::types::Address::builder().build(),
        &rd,
    );
    assert_eq!(
        addr.domain, "vpc",
        "an address without a domain is a VPC one"
    );
}

/// A security group: the field map the diff always compared (all three fields fixed once
/// made), read back with its VPC by the reader's logical name (another VPC as its raw ID), and
/// decoding refuses a group that lost a field or points at something not a VPC.
#[test]
fn a_security_group_is_the_field_map_it_was() {
    let group = SecurityGroup {
        head: Head::owned("nodes"),
        vpc: Ref::named("main"),
        group_name: "nodes.k.example.com".into(),
        description: "kprov nodes of cluster k.example.com".into(),
    };
    let r = round_trip(
        &group,
        Resource::new(SECURITY_GROUP, "nodes")
            .field("vpc", Value::reference(VPC, "main"))
            .field("groupName", Value::str("nodes.k.example.com"))
            .field(
                "description",
                Value::str("kprov nodes of cluster k.example.com"),
            )
            .rule("vpc", FieldRule::Immutable)
            .rule("groupName", FieldRule::Immutable)
            .rule("description", FieldRule::Immutable),
    );
    assert_eq!(deps(&r), ["Vpc/main"]);

    let nameless = without(&r, "groupName");
    assert_eq!(
        refusal::<SecurityGroup>(&nameless),
        "resource model: SecurityGroup/nodes: field groupName is not set"
    );
    assert_eq!(
        refusal::<SecurityGroup>(&r.clone().field("vpc", Value::reference(SUBNET, "a"))),
        "resource model: SecurityGroup/nodes: field vpc: expected a reference to a Vpc, found \
         Subnet/a"
    );

    let rd = reader(&[("vpc-1", ResourceId::new(VPC, "main"))]);
    let head = listed_head("nodes", "sg-1");
    let listed = aws_sdk_ec2::types::SecurityGroup::builder()
        .vpc_id("vpc-1")
        .group_name("nodes.k.example.com")
        .description("kprov nodes of cluster k.example.com")
        .build();
    let read = SecurityGroup::read(head.clone(), &listed, &rd);
    assert_eq!(read.vpc, Ref::named("main"));
    assert_eq!(
        read.resource().fields,
        r.fields,
        "in sync: nothing to change"
    );
    assert_eq!(read.resource().cloud_id.as_deref(), Some("sg-1"));
    // In another VPC, listed without a description: both show as changes, never as the
    // desired values.
    let moved = SecurityGroup::read(
        head,
        &aws_sdk_ec2::types::SecurityGroup::builder()
            .vpc_id("vpc-other")
            .group_name("nodes.k.example.com")
            .build(),
        &rd,
    );
    assert_eq!(moved.resource().get("vpc"), Some(&Value::str("vpc-other")));
    assert_eq!(moved.description, "");
}

fn rule_value(proto: &str, ports: &str, src: Value) -> Value {
    Value::List(vec![Value::str(proto), Value::str(ports), src])
}

/// A group's ingress rules: the field map the diff always compared (`[protocol, ports,
/// source]`, a set), decoded back in the set's order, ordered after the groups they name;
/// a rule that is not three texts and a source is a model error naming the resource.
#[test]
fn security_group_rules_are_the_field_map_they_were() {
    use super::security_group_rules::Ports;

    let rules = SecurityGroupRules {
        head: Head::owned("nodes"),
        group: Ref::named("nodes"),
        ingress: vec![
            Rule::all(Source::Group(Ref::named("nodes"))),
            Rule::all(Source::Group(Ref::named("control-plane"))),
            Rule::tcp(22, Source::Cidr("203.0.113.0/24".into())),
            Rule::tcp(6443, Source::Group(Ref::named("api-lb"))),
        ],
    };
    let r = rules.resource();
    assert_eq!(
        r,
        Resource::new(SECURITY_GROUP_RULES, "nodes")
            .field("group", Value::reference(SECURITY_GROUP, "nodes"))
            .field(
                "ingress",
                Value::set(vec![
                    rule_value("-1", "all", Value::reference(SECURITY_GROUP, "nodes")),
                    rule_value(
                        "-1",
                        "all",
                        Value::reference(SECURITY_GROUP, "control-plane")
                    ),
                    rule_value("tcp", "22", Value::str("203.0.113.0/24")),
                    rule_value("tcp", "6443", Value::reference(SECURITY_GROUP, "api-lb")),
                ])
            )
    );
    let back: SecurityGroupRules = remade(&r);
    assert_eq!(back.ingress.len(), 4);
    assert_eq!(
        deps(&r),
        [
            "SecurityGroup/api-lb",
            "SecurityGroup/control-plane",
            "SecurityGroup/nodes"
        ]
    );
    assert!(!rules.open_to_anywhere(22), "SSH only from one network");
    let open = SecurityGroupRules {
        ingress: vec![Rule::tcp(22, Source::Cidr("0.0.0.0/0".into()))],
        ..rules.clone()
    };
    assert!(open.open_to_anywhere(22));
    assert!(!open.open_to_anywhere(6443));

    // Port ranges, ICMP's lone -1 and a group by raw ID decode; each says what it is.
    let r = r.field(
        "ingress",
        Value::set(vec![
            rule_value("tcp", "30000-32767", Value::str("10.0.0.0/16")),
            rule_value("icmp", "-1", Value::str("10.0.0.0/16")),
            rule_value("tcp", "443", Value::str("sg-9")),
        ]),
    );
    let back: SecurityGroupRules = remade(&r);
    assert_eq!(
        back.ingress,
        [
            Rule {
                protocol: "icmp".into(),
                ports: Ports::Range(-1, -1),
                source: Source::Cidr("10.0.0.0/16".into()),
            },
            Rule {
                protocol: "tcp".into(),
                ports: Ports::Range(30000, 32767),
                source: Source::Cidr("10.0.0.0/16".into()),
            },
            Rule {
                protocol: "tcp".into(),
                ports: Ports::Range(443, 443),
                source: Source::Group(Ref::cloud("sg-9")),
            },
        ]
    );

    for bad in [
        rule_value("tcp", "22-", Value::str("10.0.0.0/16")),
        rule_value("tcp", "ssh", Value::str("10.0.0.0/16")),
        rule_value("tcp", "22", Value::Int(1)),
        rule_value("tcp", "22", Value::reference(SUBNET, "a")),
        Value::List(vec![Value::str("tcp"), Value::str("22")]),
    ] {
        let r = r.clone().field("ingress", Value::List(vec![bad.clone()]));
        assert_eq!(
            refusal::<SecurityGroupRules>(&r),
            format!(
                "resource model: SecurityGroupRules/nodes: malformed security group rule {bad}"
            )
        );
    }
}

/// The request a rule becomes: a group source resolved to its cloud ID as a group pair, a
/// CIDR as an address range, every port as no port range at all.
#[test]
fn a_rule_is_sent_as_the_permission_ec2_expects() {
    let ids: IdMap = [(ResourceId::new(SECURITY_GROUP, "nodes"), cid("sg-1"))].into();
    let p = Rule::all(Source::Group(Ref::named("nodes")))
        .permission(&ids)
        .expect("resolves");
    assert_eq!(p.ip_protocol(), Some("-1"));
    assert_eq!((p.from_port(), p.to_port()), (None, None));
    assert_eq!(p.user_id_group_pairs()[0].group_id(), Some("sg-1"));
    assert!(p.ip_ranges().is_empty());

    let p = Rule::tcp(22, Source::Cidr("203.0.113.0/24".into()))
        .permission(&ids)
        .expect("a CIDR needs nothing resolved");
    assert_eq!((p.from_port(), p.to_port()), (Some(22), Some(22)));
    assert_eq!(p.ip_ranges()[0].cidr_ip(), Some("203.0.113.0/24"));
    assert!(p.user_id_group_pairs().is_empty());

    let e = Rule::all(Source::Group(Ref::named("bastion")))
        .permission(&ids)
        .expect_err("not made yet");
    assert_eq!(
        e.to_string(),
        "resource model: SecurityGroup/bastion has no cloud ID yet"
    );
}

/// What a read keeps: kprov's rules, from addresses and from kprov's own groups (named as the
/// reader knows them). The cloud-controller-manager's rules, and those from a group that is
/// not kprov's (unknown, or one of the cluster's that lost its identity tag), are not kprov's
/// to compare or revoke.
#[test]
fn read_rules_are_kprovs_own() {
    use aws_sdk_ec2::types::{IpPermission, IpRange, UserIdGroupPair};

    let rd = reader(&[
        ("sg-1", ResourceId::new(SECURITY_GROUP, "nodes")),
        ("sg-2", ResourceId::new(SECURITY_GROUP, "control-plane")),
        ("sg-3", ResourceId::new(SECURITY_GROUP, "untracked-sg-3")),
        ("subnet-1", ResourceId::new(SUBNET, "a")),
    ]);
    let pair = |g: &str| UserIdGroupPair::builder().group_id(g).build();
    let listed = aws_sdk_ec2::types::SecurityGroup::builder()
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("-1")
                .user_id_group_pairs(pair("sg-1"))
                .user_id_group_pairs(pair("sg-2"))
                .user_id_group_pairs(pair("sg-3"))
                .user_id_group_pairs(pair("sg-foreign"))
                .user_id_group_pairs(pair("subnet-1"))
                .user_id_group_pairs(
                    UserIdGroupPair::builder()
                        .group_id("sg-2")
                        .description("kubernetes.io/rule/nlb/health=a1")
                        .build(),
                )
                .build(),
        )
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(22)
                .to_port(22)
                .ip_ranges(IpRange::builder().cidr_ip("0.0.0.0/0").build())
                .build(),
        )
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(30000)
                .to_port(32767)
                .ip_ranges(
                    IpRange::builder()
                        .cidr_ip("0.0.0.0/0")
                        .description("kubernetes.io/rule/nlb/client=a1")
                        .build(),
                )
                .ip_ranges(IpRange::builder().cidr_ip("10.0.0.0/16").build())
                .build(),
        )
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("icmp")
                .from_port(-1)
                .to_port(-1)
                .ip_ranges(IpRange::builder().cidr_ip("10.0.0.0/16").build())
                .build(),
        )
        .build();
    let head = listed_head("nodes", "sg-1");
    let read = SecurityGroupRules::read(head, &listed, &rd);
    assert_eq!(read.group, Ref::named("nodes"));
    let r = read.resource();
    assert_eq!(r.cloud_id.as_deref(), Some("sg-1"), "its group's cloud ID");
    assert_eq!(
        r.get("ingress"),
        Some(&Value::set(vec![
            rule_value("-1", "all", Value::reference(SECURITY_GROUP, "nodes")),
            rule_value(
                "-1",
                "all",
                Value::reference(SECURITY_GROUP, "control-plane")
            ),
            rule_value("tcp", "22", Value::str("0.0.0.0/0")),
            rule_value("tcp", "30000-32767", Value::str("10.0.0.0/16")),
            rule_value("icmp", "-1", Value::str("10.0.0.0/16")),
        ]))
    );
    // Apply decodes what it read: every rule it may have to revoke.
    assert_eq!(
        SecurityGroupRules::from_resource(&r)
            .expect("decodes")
            .ingress
            .len(),
        5
    );
}

fn iam_role(name: &str, doc: Option<&str>) -> aws_sdk_iam::types::Role {
    aws_sdk_iam::types::Role::builder()
        .path("/kprov/c.example.com/")
        .role_name(name)
        .role_id("AROA1")
        .arn(format!("arn:aws:iam::1:role/kprov/c.example.com/{name}"))
        .create_date(aws_smithy_types::DateTime::from_secs(0))
        .set_assume_role_policy_document(doc.map(str::to_string))
        .build()
        .expect("a test role has every required field")
}

/// An instance-group role: its name fixed once made, its trust policy a document the diff
/// shows line by line. Read back, IAM's URL-encoded policy is the canonical JSON the desired
/// one is (or every plan would show every role changed); a role listed without one reads as
/// empty, a change the plan names, never the desired policy.
#[test]
fn an_iam_role_is_the_field_map_it_was() {
    let policy = "{\n  \"Version\": \"2012-10-17\"\n}";
    let role = IamRole {
        head: Head::owned("nodes"),
        role_name: "nodes.c.example.com".into(),
        assume_role_policy: policy.into(),
    };
    let r = round_trip(
        &role,
        Resource::new(IAM_ROLE, "nodes")
            .field("roleName", Value::str("nodes.c.example.com"))
            .field("assumeRolePolicy", Value::Doc(policy.into()))
            .rule("roleName", FieldRule::Immutable),
    );

    let missing = without(&r, "assumeRolePolicy");
    assert_eq!(
        refusal::<IamRole>(&missing),
        "resource model: IamRole/nodes: field assumeRolePolicy is not set"
    );

    let rd = reader(&[]);
    let head = listed_head("nodes", "nodes.c.example.com");
    let listed = iam_role(
        "nodes.c.example.com",
        Some("%7B%22Version%22%3A+%222012-10-17%22%7D"),
    );
    let read = IamRole::read(head.clone(), &listed, &rd);
    assert_eq!(read.role_name, "nodes.c.example.com");
    assert_eq!(read.assume_role_policy, policy);
    assert_eq!(
        read.resource().cloud_id.as_deref(),
        Some("nodes.c.example.com")
    );

    let bare = IamRole::read(head, &iam_role("nodes.c.example.com", None), &rd);
    assert_eq!(bare.assume_role_policy, "");
}

/// A role's inline policy: the field map the diff always compared (its name fixed once made,
/// its document a document), decoded back; read through the reader's logical name for its
/// role with IAM's URL-encoded document made canonical; a reference of the wrong kind refused
/// naming the field.
#[test]
fn an_iam_role_policy_is_the_field_map_it_was() {
    let doc = "{\n  \"Version\": \"2012-10-17\"\n}";
    let policy = IamRolePolicy {
        head: Head::owned("nodes"),
        role: Ref::named("nodes"),
        policy_name: "kprov-nodes".into(),
        document: doc.into(),
    };
    let r = round_trip(
        &policy,
        Resource::new(IAM_ROLE_POLICY, "nodes")
            .field("role", Value::reference(IAM_ROLE, "nodes"))
            .field("policyName", Value::str("kprov-nodes"))
            .field("document", Value::Doc(doc.into()))
            .rule("policyName", FieldRule::Immutable),
    );
    assert_eq!(deps(&r), ["IamRole/nodes"]);

    let wrong = r
        .clone()
        .field("role", Value::reference(INSTANCE_PROFILE, "nodes"));
    assert_eq!(
        refusal::<IamRolePolicy>(&wrong),
        "resource model: IamRolePolicy/nodes: field role: expected a reference to a IamRole, \
         found IamInstanceProfile/nodes"
    );

    let rd = reader(&[("nodes.c.example.com", ResourceId::new(IAM_ROLE, "nodes"))]);
    let head = listed_head("nodes", "nodes.c.example.com:kprov-nodes");
    let listed = ListedPolicy {
        role: "nodes.c.example.com".into(),
        name: "kprov-nodes".into(),
        document: "%7B%22Version%22%3A+%222012-10-17%22%7D".into(),
    };
    let read = IamRolePolicy::read(head.clone(), &listed, &rd);
    assert_eq!(read, IamRolePolicy { head, ..policy });
    // A role the reader does not know shows as its name.
    let foreign = IamRolePolicy::read(
        Head::owned("x"),
        &ListedPolicy {
            role: "other".into(),
            ..listed
        },
        &rd,
    );
    assert_eq!(foreign.role, Ref::cloud("other"));
}

/// The API's network load balancer: the field map the diff always compared (name, scheme and
/// security groups fixed once made, subnets set in place); read back with its subnets and
/// groups by the reader's logical names and its DNS name as clients use it (lower case, no
/// trailing dot), which the desired one leaves out so the diff never compares it.
#[test]
fn a_load_balancer_is_the_field_map_it_was() {
    use crate::cloud::aws::kinds::LOAD_BALANCER;
    use aws_sdk_elasticloadbalancingv2::types::{AvailabilityZone, LoadBalancerSchemeEnum};

    let lb = LoadBalancer {
        head: Head::owned("api"),
        lb_name: "api-k".into(),
        scheme: "internal".into(),
        subnets: vec![Ref::named("b"), Ref::named("a")],
        security_groups: vec![Ref::named("api-lb")],
        dns_name: None,
        canonical_zone: None,
    };
    let r = lb.resource();
    assert_eq!(
        r,
        Resource::new(LOAD_BALANCER, "api")
            .field("lbName", Value::str("api-k"))
            .field("scheme", Value::str("internal"))
            .field(
                "subnets",
                Value::set(vec![
                    Value::reference(SUBNET, "a"),
                    Value::reference(SUBNET, "b")
                ])
            )
            .field(
                "securityGroups",
                Value::set(vec![Value::reference(SECURITY_GROUP, "api-lb")])
            )
            .rule("lbName", FieldRule::Immutable)
            .rule("scheme", FieldRule::Immutable)
            .rule("securityGroups", FieldRule::Immutable)
    );
    let back: LoadBalancer = remade(&r);
    assert_eq!(back.subnets, [Ref::named("a"), Ref::named("b")]);

    assert_eq!(
        refusal::<LoadBalancer>(&r.clone().field("subnets", Value::str("subnet-1"))),
        "resource model: LoadBalancer/api: field subnets is not a list"
    );

    let rd = reader(&[
        ("subnet-a", ResourceId::new(SUBNET, "a")),
        ("sg-1", ResourceId::new(SECURITY_GROUP, "api-lb")),
    ]);
    let listed = aws_sdk_elasticloadbalancingv2::types::LoadBalancer::builder()
        .load_balancer_name("api-k")
        .scheme(LoadBalancerSchemeEnum::Internal)
        .availability_zones(AvailabilityZone::builder().subnet_id("subnet-a").build())
        .availability_zones(AvailabilityZone::builder().subnet_id("subnet-x").build())
        .security_groups("sg-1")
        .dns_name("API-K-1.elb.amazonaws.com.")
        .canonical_hosted_zone_id("Z26")
        .build();
    let read = LoadBalancer::read(listed_head("api", "arn:lb"), &listed, &rd);
    assert_eq!(read.subnets, [Ref::named("a"), Ref::cloud("subnet-x")]);
    assert_eq!(read.security_groups, [Ref::named("api-lb")]);
    let have = read.resource();
    assert_eq!(have.get_str("dnsName"), Some("api-k-1.elb.amazonaws.com"));
    assert_eq!(have.get_str("canonicalZone"), Some("Z26"));
    let changed: Vec<String> = crate::cloud::engine::field_changes(&r, &have)
        .into_iter()
        .map(|c| c.field)
        .collect();
    assert_eq!(changed, ["subnets"], "only the foreign subnet differs");
}

/// A target group: the field map the diff always compared (the port an integer), decoded
/// back; a port that is not a number is refused naming the field; read back with its
/// attributes, where an attribute ELB did not send is AWS's default (client IPs preserved,
/// 300 s), never the desired value.
#[test]
fn a_target_group_is_the_field_map_it_was() {
    use crate::cloud::aws::kinds::TARGET_GROUP;
    use aws_sdk_elasticloadbalancingv2::types::ProtocolEnum;

    let tg = TargetGroup {
        head: Head::owned("api"),
        tg_name: "tcp-k".into(),
        port: 6443,
        protocol: "TCP".into(),
        vpc: Ref::named("main"),
        preserve_client_ip: false,
        deregistration_delay: 30,
    };
    let r = round_trip(
        &tg,
        Resource::new(TARGET_GROUP, "api")
            .field("tgName", Value::str("tcp-k"))
            .field("port", Value::Int(6443))
            .field("protocol", Value::str("TCP"))
            .field("vpc", Value::reference(VPC, "main"))
            .field("preserveClientIp", Value::Bool(false))
            .field("deregistrationDelay", Value::Int(30))
            .rule("tgName", FieldRule::Immutable)
            .rule("port", FieldRule::Immutable)
            .rule("protocol", FieldRule::Immutable)
            .rule("vpc", FieldRule::Immutable),
    );
    assert_eq!(
        refusal::<TargetGroup>(&r.clone().field("port", Value::str("6443"))),
        "resource model: TargetGroup/api: field port is not set"
    );

    let rd = reader(&[("vpc-1", ResourceId::new(VPC, "main"))]);
    let group = aws_sdk_elasticloadbalancingv2::types::TargetGroup::builder()
        .target_group_name("tcp-k")
        .port(6443)
        .protocol(ProtocolEnum::Tcp)
        .vpc_id("vpc-1")
        .build();
    let listed = ListedTargetGroup {
        group: group.clone(),
        attributes: [
            ("preserve_client_ip.enabled", "false"),
            ("deregistration_delay.timeout_seconds", "30"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    };
    let head = listed_head("api", "arn:tg");
    let read = TargetGroup::read(head.clone(), &listed, &rd);
    assert_eq!(read, TargetGroup { head, ..tg });
    let defaults = TargetGroup::read(
        Head::owned("api"),
        &ListedTargetGroup {
            group,
            attributes: Default::default(),
        },
        &rd,
    );
    assert!(defaults.preserve_client_ip);
    assert_eq!(defaults.deregistration_delay, 300);
}

/// A listener: the field map the diff always compared (its load balancer fixed once made),
/// decoded back; a target group reference of another kind is refused naming the field; read
/// back with its load balancer and target group by the reader's logical names.
#[test]
fn a_listener_is_the_field_map_it_was() {
    use crate::cloud::aws::kinds::{LISTENER, LOAD_BALANCER, TARGET_GROUP};
    use aws_sdk_elasticloadbalancingv2::types::{Action, ActionTypeEnum, ProtocolEnum};

    let listener = Listener {
        head: Head::owned("api"),
        load_balancer: Ref::named("api"),
        port: 6443,
        protocol: "TCP".into(),
        target_group: Ref::named("api"),
    };
    let r = round_trip(
        &listener,
        Resource::new(LISTENER, "api")
            .field("loadBalancer", Value::reference(LOAD_BALANCER, "api"))
            .field("port", Value::Int(6443))
            .field("protocol", Value::str("TCP"))
            .field("targetGroup", Value::reference(TARGET_GROUP, "api"))
            .rule("loadBalancer", FieldRule::Immutable),
    );
    assert_eq!(deps(&r), ["LoadBalancer/api", "TargetGroup/api"]);
    assert_eq!(
        refusal::<Listener>(
            &r.clone()
                .field("targetGroup", Value::reference(LOAD_BALANCER, "api")),
        ),
        "resource model: Listener/api: field targetGroup: expected a reference to a \
         TargetGroup, found LoadBalancer/api"
    );

    let rd = reader(&[
        ("arn:lb", ResourceId::new(LOAD_BALANCER, "api")),
        ("arn:tg", ResourceId::new(TARGET_GROUP, "api")),
    ]);
    let listed = ListedListener {
        load_balancer: "arn:lb".into(),
        listener: aws_sdk_elasticloadbalancingv2::types::Listener::builder()
            .port(6443)
            .protocol(ProtocolEnum::Tcp)
            .default_actions(
                Action::builder()
                    .r#type(ActionTypeEnum::Forward)
                    .target_group_arn("arn:tg")
                    .build(),
            )
            .build(),
    };
    let head = listed_head("api", "arn:l");
    let read = Listener::read(head.clone(), &listed, &rd);
    assert_eq!(read, Listener { head, ..listener });
    // Forwarding nowhere kprov knows: the raw ARN, a change the diff shows.
    let bare = Listener::read(
        Head::owned("api"),
        &ListedListener {
            load_balancer: "arn:lb".into(),
            listener: aws_sdk_elasticloadbalancingv2::types::Listener::builder()
                .port(6443)
                .build(),
        },
        &rd,
    );
    assert_eq!(bare.target_group, Ref::cloud(""));
    assert_eq!(bare.protocol, "");
}

/// A Classic ELB the cloud-controller-manager made: read with its VPC, subnets and groups by
/// the reader's logical names (the references that order `delete cluster`), its DNS name in
/// lower case, and decoded back from the read resource as delete does; one without its VPC
/// reads as an empty ID, never as a guess.
#[test]
fn a_classic_load_balancer_is_the_field_map_it_was() {
    use crate::cloud::aws::kinds::CLASSIC_LOAD_BALANCER;
    use aws_sdk_elasticloadbalancing::types::LoadBalancerDescription;

    let rd = reader(&[
        ("vpc-1", ResourceId::new(VPC, "main")),
        ("subnet-a", ResourceId::new(SUBNET, "a")),
        ("sg-1", ResourceId::new(SECURITY_GROUP, "nodes")),
    ]);
    let listed = LoadBalancerDescription::builder()
        .vpc_id("vpc-1")
        .subnets("subnet-a")
        .subnets("subnet-x")
        .security_groups("sg-1")
        .dns_name("A1B2-123.US-EAST-1.elb.amazonaws.com")
        .build();
    let head = listed_head("untracked-a1b2", "a1b2");
    let read = ClassicLoadBalancer::read(head, &listed, &rd);
    let r = read.resource();
    assert_eq!(
        r,
        Resource::new(CLASSIC_LOAD_BALANCER, "untracked-a1b2")
            .cloud_id(cid("a1b2"))
            .field("vpc", Value::reference(VPC, "main"))
            .field(
                "subnets",
                Value::set(vec![Value::reference(SUBNET, "a"), Value::str("subnet-x")])
            )
            .field(
                "securityGroups",
                Value::set(vec![Value::reference(SECURITY_GROUP, "nodes")])
            )
            .field(
                "dnsName",
                Value::str("a1b2-123.us-east-1.elb.amazonaws.com")
            )
    );
    assert_eq!(deps(&r), ["SecurityGroup/nodes", "Subnet/a", "Vpc/main"]);
    // Decoded as delete does: the same resource (a set keeps its own order).
    remade::<ClassicLoadBalancer>(&r);
    assert_eq!(read.cloud_id().expect("read"), "a1b2");

    let no_dns = without(&r, "dnsName");
    assert_eq!(
        refusal::<ClassicLoadBalancer>(&no_dns),
        "resource model: ClassicLoadBalancer/untracked-a1b2: field dnsName is not set"
    );
    let bare = ClassicLoadBalancer::read(
        Head::owned("x"),
        &LoadBalancerDescription::builder().build(),
        &rd,
    );
    assert_eq!(bare.vpc, Ref::cloud(""));
}

/// The zone is adopted (no rules: the plan refuses any difference); its private association
/// is replaced, never changed; both are the field maps the diff always compared, decoded back.
/// Read, the association names the zone and VPC the reader knows; a VPC it does not know
/// shows as its ID.
#[test]
fn a_dns_zone_and_its_vpc_association_are_the_field_maps_they_were() {
    use crate::cloud::aws::kinds::{DNS_ZONE, DNS_ZONE_VPC};

    let zone = DnsZone {
        head: Head::adopted("main", None),
        zone_name: "example.com.".into(),
        private: true,
    };
    let r = round_trip(
        &zone,
        Resource::new(DNS_ZONE, "main")
            .lifecycle(Lifecycle::ExistsAndValidates)
            .field("zoneName", Value::str("example.com."))
            .field("private", Value::Bool(true)),
    );
    assert_eq!(
        refusal::<DnsZone>(&r.clone().field("private", Value::str("yes"))),
        "resource model: DnsZone/main: field private is not set"
    );

    let assoc = DnsZoneVpc {
        head: Head::owned("main"),
        zone: Ref::named("main"),
        vpc: Ref::named("main"),
    };
    let r = round_trip(
        &assoc,
        Resource::new(DNS_ZONE_VPC, "main")
            .field("zone", Value::reference(DNS_ZONE, "main"))
            .field("vpc", Value::reference(VPC, "main"))
            .rule("zone", FieldRule::Replace)
            .rule("vpc", FieldRule::Replace),
    );
    assert_eq!(deps(&r), ["DnsZone/main", "Vpc/main"]);
    assert_eq!(
        refusal::<DnsZoneVpc>(&r.clone().field("zone", Value::reference(VPC, "main"))),
        "resource model: DnsZoneVpcAssociation/main: field zone: expected a reference to a \
         DnsZone, found Vpc/main"
    );

    let rd = reader(&[
        ("Z1", ResourceId::new(DNS_ZONE, "main")),
        ("vpc-1", ResourceId::new(VPC, "main")),
    ]);
    let head = Head::adopted("main", Some(cid("Z1/vpc-1")));
    let listed = ListedAssociation {
        zone: cid("Z1"),
        vpc: cid("vpc-1"),
    };
    let read = DnsZoneVpc::read(head.clone(), &listed, &rd);
    assert_eq!(read, DnsZoneVpc { head, ..assoc });
    let foreign = DnsZoneVpc::read(
        Head::owned("main"),
        &ListedAssociation {
            zone: cid("Z1"),
            vpc: cid("vpc-9"),
        },
        &rd,
    );
    assert_eq!(foreign.vpc, Ref::cloud("vpc-9"));
}

/// The API's record as desired: an alias to its load balancer, nothing read yet.
fn api_record() -> DnsRecord {
    DnsRecord {
        head: Head::owned("api"),
        zone: Ref::named("main"),
        record_name: "api.example.com.".into(),
        record_type: Some("A".into()),
        alias: Some(Ref::named("api")),
        txt: None,
        alias_dns: None,
        alias_zone: None,
    }
}

/// An API or bastion record: the field map the diff always compared (a new name replaces the
/// record), decoded back; the alias must be a load balancer. Read, its owner record's text and
/// the alias target come along for the delete, which names both exactly; the alias names the
/// load balancer the reader knows by DNS name (with or without `dualstack.`). An owner record
/// whose A record is gone reads without type or alias: a change the plan makes.
#[test]
fn a_dns_record_is_the_field_map_it_was() {
    use crate::cloud::aws::dns::{alias_set, txt_set};
    use crate::cloud::aws::kinds::{DNS_RECORD, DNS_ZONE, LOAD_BALANCER};

    let record = api_record();
    let r = round_trip(
        &record,
        Resource::new(DNS_RECORD, "api")
            .field("zone", Value::reference(DNS_ZONE, "main"))
            .field("recordName", Value::str("api.example.com."))
            .field("type", Value::str("A"))
            .field("alias", Value::reference(LOAD_BALANCER, "api"))
            .rule("recordName", FieldRule::Replace),
    );
    assert_eq!(deps(&r), ["DnsZone/main", "LoadBalancer/api"]);

    let missing = without(&r, "recordName");
    assert_eq!(
        refusal::<DnsRecord>(&missing),
        "resource model: DnsRecord/api: field recordName is not set"
    );
    assert_eq!(
        refusal::<DnsRecord>(&r.clone().field("alias", Value::reference(VPC, "main"))),
        "resource model: DnsRecord/api: field alias: expected a reference to a LoadBalancer, \
         found Vpc/main"
    );

    let rd = reader(&[
        ("Z1", ResourceId::new(DNS_ZONE, "main")),
        (
            "api-1.elb.us-east-1.amazonaws.com",
            ResourceId::new(LOAD_BALANCER, "api"),
        ),
    ]);
    let owner = "\"heritage=kprov,kprov.dev/cluster=c,kprov.dev/id=DnsRecord/api\"";
    let head = listed_head("api", "Z1/api.example.com.");
    let listed = ListedRecord {
        zone: cid("Z1"),
        owner: txt_set("api.example.com.", owner).expect("a TXT set"),
        a: Some(
            alias_set(
                "api.example.com.",
                "dualstack.API-1.elb.us-east-1.amazonaws.com.",
                "Z35",
            )
            .expect("an alias set"),
        ),
    };
    let read = DnsRecord::read(head.clone(), &listed, &rd);
    assert_eq!(
        read,
        DnsRecord {
            head: head.clone(),
            txt: Some(owner.into()),
            alias_dns: Some("dualstack.API-1.elb.us-east-1.amazonaws.com.".into()),
            alias_zone: Some("Z35".into()),
            ..record.clone()
        }
    );
    // What the read carries for the delete survives the engine's resource.
    assert_eq!(
        DnsRecord::from_resource(&read.resource()).expect("decodes"),
        read
    );

    let orphan = DnsRecord::read(head, &ListedRecord { a: None, ..listed }, &rd);
    assert_eq!((orphan.record_type, orphan.alias), (None, None));
    assert_eq!(orphan.txt.as_deref(), Some(owner));
}

/// The key pair: its name and the key's hash are the compared fields (a new one of either is
/// a new key pair); the key itself is an input apply gets back and the diff never sees, and
/// the task never shows it. Read, the hash comes from its tag (none reads as empty, a change).
#[test]
fn a_key_pair_is_the_field_map_it_was_and_never_shows_its_key() {
    use crate::cloud::aws::kinds::KEY_PAIR;

    let material = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKprovSecretish ops@example";
    let key = KeyPair {
        head: Head::owned("main"),
        key_name: "ops key".into(),
        public_key_sha256: "ab12".into(),
        public_key: Some(PublicKey(material.into())),
    };
    let r = round_trip(
        &key,
        Resource::new(KEY_PAIR, "main")
            .field("keyName", Value::str("ops key"))
            .field("publicKeySha256", Value::str("ab12"))
            .input("publicKey", material)
            .rule("keyName", FieldRule::Replace)
            .rule("publicKeySha256", FieldRule::Replace),
    );
    assert!(r.fields.values().all(|v| !v.to_string().contains("AAAA")));
    assert!(!format!("{key:?}").contains("AAAA"), "{key:?}");

    let missing = without(&r, "publicKeySha256");
    assert_eq!(
        refusal::<KeyPair>(&missing),
        "resource model: KeyPair/main: field publicKeySha256 is not set"
    );

    let tag = |k: &str, v: &str| aws_sdk_ec2::types::Tag::builder().key(k).value(v).build();
    let listed = aws_sdk_ec2::types::KeyPairInfo::builder()
        .key_name("ops key")
        .tags(tag("kprov.dev/public-key-sha256", "ab12"))
        .tags(tag("kprov.dev/id", "KeyPair/main"))
        .build();
    let head = listed_head("main", "ops key");
    let rd = reader(&[]);
    let read = KeyPair::read(head.clone(), &listed, &rd);
    assert_eq!(
        read,
        KeyPair {
            head: head.clone(),
            public_key: None,
            ..key
        }
    );
    assert!(read.resource().inputs.is_empty());
    let untagged = aws_sdk_ec2::types::KeyPairInfo::builder()
        .key_name("ops key")
        .build();
    assert_eq!(KeyPair::read(head, &untagged, &rd).public_key_sha256, "");
}

/// An instance profile: its name fixed once made, its role a reference to the role task;
/// read, the role IAM lists in it is the role the reader knows, or its name; a profile
/// holding no role reads without one.
#[test]
fn an_instance_profile_is_the_field_map_it_was() {
    let profile = IamInstanceProfile {
        head: Head::owned("nodes"),
        profile_name: "nodes.c.example.com".into(),
        role: Some(Ref::named("nodes")),
    };
    let r = round_trip(
        &profile,
        Resource::new(INSTANCE_PROFILE, "nodes")
            .field("profileName", Value::str("nodes.c.example.com"))
            .field("role", Value::reference(IAM_ROLE, "nodes"))
            .rule("profileName", FieldRule::Immutable),
    );
    assert_eq!(deps(&r), ["IamRole/nodes"]);
    assert_eq!(
        refusal::<IamInstanceProfile>(
            &r.clone()
                .field("role", Value::reference(IAM_ROLE_POLICY, "nodes")),
        ),
        "resource model: IamInstanceProfile/nodes: field role: expected a reference to a \
         IamRole, found IamRolePolicy/nodes"
    );

    let listed = |roles: &[&str]| {
        aws_sdk_iam::types::InstanceProfile::builder()
            .path("/kprov/c.example.com/")
            .instance_profile_name("nodes.c.example.com")
            .instance_profile_id("AIPA1")
            .arn("arn:aws:iam::1:instance-profile/kprov/c.example.com/nodes.c.example.com")
            .create_date(aws_smithy_types::DateTime::from_secs(0))
            .set_roles(Some(
                roles.iter().map(|n| iam_role(n, Some("%7B%7D"))).collect(),
            ))
            .build()
            .expect("a test profile has every required field")
    };
    let rd = reader(&[("nodes.c.example.com", ResourceId::new(IAM_ROLE, "nodes"))]);
    let head = listed_head("nodes", "nodes.c.example.com");
    let read = IamInstanceProfile::read(head.clone(), &listed(&["nodes.c.example.com"]), &rd);
    assert_eq!(
        read,
        IamInstanceProfile {
            head: head.clone(),
            ..profile
        }
    );
    let foreign = IamInstanceProfile::read(head.clone(), &listed(&["other"]), &rd);
    assert_eq!(foreign.role, Some(Ref::cloud("other")));
    let empty = IamInstanceProfile::read(head, &listed(&[]), &rd);
    assert_eq!(empty.role, None);
    assert_eq!(empty.resource().get("role"), None);
}

fn ec2_template(tags: &[(String, String)], latest: i64) -> aws_sdk_ec2::types::LaunchTemplate {
    aws_sdk_ec2::types::LaunchTemplate::builder()
        .launch_template_id("lt-1")
        .launch_template_name("nodes.c.example.com")
        .latest_version_number(latest)
        .set_tags(Some(
            tags.iter()
                .map(|(k, v)| aws_sdk_ec2::types::Tag::builder().key(k).value(v).build())
                .collect(),
        ))
        .build()
}

fn want_template(image: &str, machine: &str) -> LaunchTemplate {
    LaunchTemplate {
        head: Head::owned("nodes"),
        template_name: "nodes.c.example.com".into(),
        launch: Some(Launch {
            image_id: image.into(),
            instance_type: machine.into(),
            key_name: Ref::named("main"),
            security_groups: vec![Ref::named("nodes")],
            instance_profile: Ref::named("nodes"),
            user_data: "#cloud-config\nssh_keys: (redacted)\n".into(),
            boot: Some(BootData("#cloud-config\nssh_keys: SECRET\n".into())),
            http_endpoint: "enabled".into(),
            http_tokens: "required".into(),
            hop_limit: 1,
        }),
        latest_version: None,
    }
}

fn template_ids() -> IdMap {
    [
        (ResourceId::new(KEY_PAIR, "main"), "ops key"),
        (ResourceId::new(SECURITY_GROUP, "nodes"), "sg-1"),
        (
            ResourceId::new(INSTANCE_PROFILE, "nodes"),
            "nodes.c.example.com",
        ),
    ]
    .into_iter()
    .map(|(id, c)| (id, cid(c)))
    .collect()
}

/// The desired template is the field map desired.rs always built (the complete user-data an
/// input, never a field), decoded back; a read with no version decodes too; a field of the
/// version missing, or a reference of the wrong kind, is refused naming it; the private key
/// never shows in the task's Debug.
#[test]
fn a_launch_template_is_the_field_map_it_was() {
    let t = want_template("ami-1", "t3.medium");
    let want = Resource::new(LAUNCH_TEMPLATE, "nodes")
        .field("templateName", Value::str("nodes.c.example.com"))
        .field("imageId", Value::str("ami-1"))
        .field("instanceType", Value::str("t3.medium"))
        .field("keyName", Value::reference(KEY_PAIR, "main"))
        .field(
            "securityGroups",
            Value::set(vec![Value::reference(SECURITY_GROUP, "nodes")]),
        )
        .field(
            "instanceProfile",
            Value::reference(INSTANCE_PROFILE, "nodes"),
        )
        .field(
            "userData",
            Value::Doc("#cloud-config\nssh_keys: (redacted)\n".into()),
        )
        .field("metadataHttpEndpoint", Value::str("enabled"))
        .field("metadataHttpTokens", Value::str("required"))
        .field("metadataHopLimit", Value::Int(1))
        .rule("templateName", FieldRule::Immutable)
        .input("userData", "#cloud-config\nssh_keys: SECRET\n");
    let r = round_trip(&t, want.clone());
    assert!(!format!("{t:?}").contains("SECRET"), "{t:?}");
    assert_eq!(
        deps(&r),
        [
            "IamInstanceProfile/nodes",
            "KeyPair/main",
            "SecurityGroup/nodes"
        ]
    );

    let gone = LaunchTemplate {
        head: Head::owned("nodes"),
        template_name: "nodes.c.example.com".into(),
        launch: None,
        latest_version: Some(4),
    };
    let r = gone.resource();
    assert_eq!(r.get("latestVersion"), Some(&Value::Int(4)));
    assert_eq!(r.get("imageId"), None);
    assert_eq!(LaunchTemplate::from_resource(&r).expect("decodes"), gone);

    let half = without(&want, "metadataHopLimit");
    assert_eq!(
        refusal::<LaunchTemplate>(&half),
        "resource model: LaunchTemplate/nodes: field metadataHopLimit is not set"
    );
    let wrong = want.field("keyName", Value::reference(SECURITY_GROUP, "nodes"));
    assert_eq!(
        refusal::<LaunchTemplate>(&wrong),
        "resource model: LaunchTemplate/nodes: field keyName: expected a reference to a \
         KeyPair, found SecurityGroup/nodes"
    );
}

#[test]
fn a_template_is_as_written_only_at_the_recorded_version_and_digest() {
    let w = want_template("ami-1", "t3.medium");
    let tags = w.written_tags(&template_ids(), 3).unwrap();
    assert!(w.as_written(&ec2_template(&tags, 3)));
    // The preview's read has image names standing in for IDs: the image is recorded, not
    // compared.
    assert!(want_template("ubuntu/*", "t3.medium").as_written(&ec2_template(&tags, 3)));
    // A version made since (by anyone), a spec that changed, a template without the tags.
    assert!(!w.as_written(&ec2_template(&tags, 4)));
    assert!(!want_template("ami-1", "t3.large").as_written(&ec2_template(&tags, 3)));
    assert!(!w.as_written(&ec2_template(&[], 3)));
    let without_sgs: Vec<_> = tags
        .iter()
        .filter(|(k, _)| !k.ends_with("securityGroups"))
        .cloned()
        .collect();
    assert!(!w.as_written(&ec2_template(&without_sgs, 3)));
    // The digest templates already carry: a change to what it covers makes every cluster's
    // preview read every template once.
    assert_eq!(
        w.digest(),
        "2551df7df7b7a22690772503012a36358db1b8915000af0a7bcdfa7f6d9185ab"
    );
}

#[test]
fn a_template_as_written_reads_back_as_its_version_would() {
    let w = want_template("ami-1", "t3.medium");
    let t = ec2_template(&w.written_tags(&template_ids(), 3).unwrap(), 3);
    // The security group is read (a ref); the key pair is not (its raw name, as a version
    // read shows a reference to something the read did not find).
    let rd = reader(&[("sg-1", ResourceId::new(SECURITY_GROUP, "nodes"))]);
    let head = listed_head("nodes", "lt-1");
    let have = LaunchTemplate::read(head, &ListedTemplate::Written(t, Box::new(w.clone())), &rd);
    let (got, wanted) = (have.resource(), w.resource());
    assert_eq!(got.get("imageId"), Some(&Value::str("ami-1")));
    assert_eq!(got.get("keyName"), Some(&Value::str("ops key")));
    assert_eq!(
        got.get("instanceProfile"),
        Some(&Value::str("nodes.c.example.com"))
    );
    for f in ["securityGroups", "instanceType", "userData", "templateName"] {
        assert_eq!(got.get(f), wanted.get(f), "{f}");
    }
    assert_eq!(got.get("latestVersion"), Some(&Value::Int(3)));
    assert!(got.inputs.is_empty(), "a read carries no user-data input");
}

#[test]
fn a_resolved_value_too_long_for_a_tag_records_nothing() {
    let mut ids = template_ids();
    ids.insert(
        ResourceId::new(KEY_PAIR, "main"),
        cid(&"k".repeat(launch_template::TAG_VALUE_MAX + 1)),
    );
    assert_eq!(
        want_template("ami-1", "t3.medium")
            .written_tags(&ids, 1)
            .unwrap(),
        Vec::new()
    );
}

/// A version as EC2 lists it: references the reader knows become logical ones, the user-data
/// is decoded and its private key redacted, what the cloud left out reads as empty.
#[test]
fn a_read_launch_template_version_names_what_the_reader_knows() {
    use aws_sdk_ec2::types::{
        LaunchTemplateIamInstanceProfileSpecification, LaunchTemplateInstanceMetadataOptions,
        LaunchTemplateVersion, ResponseLaunchTemplateData,
    };
    let key =
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXkt\n-----END OPENSSH PRIVATE KEY-----";
    let boot = format!(
        "#cloud-config\nssh_keys:\n  ed25519_private: |\n    {}\n",
        key.replace('\n', "\n    ")
    );
    let v = LaunchTemplateVersion::builder()
        .launch_template_id("lt-1")
        .launch_template_name("nodes.c.example.com")
        .version_number(7)
        .launch_template_data(
            ResponseLaunchTemplateData::builder()
                .image_id("ami-2")
                .instance_type("t3.large".into())
                .key_name("ops key")
                .security_group_ids("sg-1")
                .security_group_ids("sg-foreign")
                .iam_instance_profile(
                    LaunchTemplateIamInstanceProfileSpecification::builder()
                        .name("nodes.c.example.com")
                        .build(),
                )
                .user_data(aws_smithy_types::base64::encode(&boot))
                .metadata_options(
                    LaunchTemplateInstanceMetadataOptions::builder()
                        .http_tokens("optional".into())
                        .http_put_response_hop_limit(2)
                        .build(),
                )
                .build(),
        )
        .build();
    let rd = reader(&[
        ("sg-1", ResourceId::new(SECURITY_GROUP, "nodes")),
        (
            "nodes.c.example.com",
            ResourceId::new(INSTANCE_PROFILE, "nodes"),
        ),
    ]);
    let have = LaunchTemplate::read(
        Head::owned("nodes"),
        &ListedTemplate::Version(Box::new(v)),
        &rd,
    );
    let l = have.launch.clone().expect("a version read");
    assert_eq!(have.latest_version, Some(7));
    assert_eq!(have.template_name, "nodes.c.example.com");
    assert_eq!(l.image_id, "ami-2");
    assert_eq!(l.instance_type, "t3.large");
    assert_eq!(l.key_name, Ref::cloud("ops key"));
    assert_eq!(
        l.security_groups,
        vec![Ref::named("nodes"), Ref::cloud("sg-foreign")]
    );
    assert_eq!(l.instance_profile, Ref::named("nodes"));
    assert!(!l.user_data.contains("b3BlbnNzaC1rZXkt"), "{}", l.user_data);
    assert_eq!(l.user_data, crate::cloud::aws::hostkeys::redact(&boot));
    assert_eq!(l.boot, None);
    assert_eq!(
        (l.http_endpoint.as_str(), l.http_tokens.as_str()),
        ("", "optional")
    );
    assert_eq!(l.hop_limit, 2);
    // The set is sorted: decoded, the groups come back in its order, the rest as read.
    remade::<LaunchTemplate>(&have.resource());
}

/// Removing a private zone's VPC association: done, already gone (Route 53's
/// `VPCAssociationNotFound`, classified as the SDK path classifies it) and the zone's last
/// association (`LastVPCAssociation`) are success; any other answer fails the delete.
#[test]
fn a_vpc_disassociation_already_gone_or_the_zones_last_is_success() {
    use super::dns_zone_vpc::disassociated;
    const OP: &str = "DisassociateVPCFromHostedZone";
    let answer = |code: &str| -> Result<(), CloudError> {
        Err(CloudError::Api {
            operation: OP.into(),
            class: crate::cloud::aws::class_of(OP, code, None),
            code: Some(code.into()),
            message: format!("{code} (test)"),
        })
    };
    assert!(disassociated(Ok(())).is_ok());
    assert!(disassociated(answer("VPCAssociationNotFound")).is_ok());
    assert!(disassociated(answer("LastVPCAssociation")).is_ok());
    for code in ["AccessDenied", "InvalidVPCId", "Throttling", "InvalidInput"] {
        let e = disassociated(answer(code)).expect_err(code);
        assert_eq!(
            e.code(),
            Some(code),
            "{code}: the error is passed on as it came"
        );
    }
}

/// A record's delete names its owner TXT record exactly; one without it (never so when read)
/// is a model error naming the record and field, not an empty TXT record sent to Route 53.
#[test]
fn a_dns_record_without_its_owner_text_is_not_deleted() {
    let record = api_record();
    let e = record.owner_text().expect_err("no owner text");
    assert_eq!(
        e.to_string(),
        "resource model: DnsRecord/api: field txt is not set"
    );
    let owned = DnsRecord {
        txt: Some("\"heritage=kprov,cluster=c\"".into()),
        ..record
    };
    assert_eq!(
        owned.owner_text().expect("owner text"),
        "\"heritage=kprov,cluster=c\""
    );
}

fn nodes_group() -> AutoScalingGroup {
    AutoScalingGroup {
        head: Head::owned("nodes"),
        group_name: "nodes.c.example.com".into(),
        launch_template: Ref::named("nodes"),
        launch_template_version: "$Latest".into(),
        min_size: 2,
        max_size: 5,
        desired_capacity: 2,
        subnets: vec![Ref::named("a"), Ref::named("b")],
        target_groups: vec![Ref::named("api")],
        role: "Node".into(),
    }
}

/// An Auto Scaling group: the field map the diff always compared (its name fixed once made,
/// the subnets and target groups compared as sets), decoded back; a size that is not a number
/// or a template reference of another kind is refused naming the field, and a size Auto
/// Scaling cannot take is a model error naming it, never a truncated number sent to AWS.
#[test]
fn an_auto_scaling_group_is_the_field_map_it_was() {
    use crate::cloud::aws::kinds::{AUTOSCALING_GROUP, TARGET_GROUP};

    let group = nodes_group();
    let r = round_trip(
        &group,
        Resource::new(AUTOSCALING_GROUP, "nodes")
            .field("groupName", Value::str("nodes.c.example.com"))
            .field("launchTemplate", Value::reference(LAUNCH_TEMPLATE, "nodes"))
            .field("launchTemplateVersion", Value::str("$Latest"))
            .field("minSize", Value::Int(2))
            .field("maxSize", Value::Int(5))
            .field("desiredCapacity", Value::Int(2))
            .field(
                "subnets",
                Value::set(vec![
                    Value::reference(SUBNET, "a"),
                    Value::reference(SUBNET, "b"),
                ]),
            )
            .field(
                "targetGroups",
                Value::set(vec![Value::reference(TARGET_GROUP, "api")]),
            )
            .field("role", Value::str("Node"))
            .rule("groupName", FieldRule::Immutable),
    );

    assert_eq!(
        refusal::<AutoScalingGroup>(&r.clone().field("minSize", Value::str("2"))),
        "resource model: AutoScalingGroup/nodes: field minSize is not set"
    );
    assert_eq!(
        refusal::<AutoScalingGroup>(
            &r.clone()
                .field("launchTemplate", Value::reference(SUBNET, "nodes")),
        ),
        "resource model: AutoScalingGroup/nodes: field launchTemplate: expected a reference to \
         a LaunchTemplate, found Subnet/nodes"
    );
    let e = group
        .size("maxSize", i64::from(i32::MAX) + 1)
        .expect_err("out of range");
    assert_eq!(
        e.to_string(),
        "resource model: AutoScalingGroup/nodes: field maxSize: 2147483648 is out of range"
    );
    assert_eq!(group.size("maxSize", 5).expect("in range"), 5);
    // A desired group has no cloud ID to update or delete by; a read one has its name.
    let e = group.cloud_id().expect_err("none");
    assert_eq!(
        e.to_string(),
        "resource model: AutoScalingGroup/nodes: no cloud ID recorded"
    );
}

/// A group read back: its template, subnets and target groups by the reader's logical names
/// (a foreign ID as itself), its role from its tag; the desired capacity is the spec's while
/// the group's (an autoscaler's) is within the spec's [min, max], and the group's otherwise.
#[test]
fn a_read_auto_scaling_group_leaves_the_capacity_to_its_scaler() {
    use crate::cloud::aws::kinds::TARGET_GROUP;
    use aws_sdk_autoscaling::types::{
        AutoScalingGroup as AsgGroup, LaunchTemplateSpecification, TagDescription,
    };

    let listed = |desired: i32| {
        AsgGroup::builder()
            .auto_scaling_group_name("nodes.c.example.com")
            .launch_template(
                LaunchTemplateSpecification::builder()
                    .launch_template_id("lt-1")
                    .version("$Latest")
                    .build(),
            )
            .min_size(2)
            .max_size(5)
            .desired_capacity(desired)
            .vpc_zone_identifier("subnet-a, subnet-b,")
            .target_group_arns("arn:tg")
            .tags(
                TagDescription::builder()
                    .key("kprov.dev/role")
                    .value("Node")
                    .build(),
            )
            .build()
    };
    let desired = [nodes_group().resource()];
    let rd = Reader {
        desired: &desired,
        ..reader(&[
            ("lt-1", ResourceId::new(LAUNCH_TEMPLATE, "nodes")),
            ("subnet-a", ResourceId::new(SUBNET, "a")),
            ("arn:tg", ResourceId::new(TARGET_GROUP, "api")),
        ])
    };
    let head = listed_head("nodes", "nodes.c.example.com");
    let scaled = AutoScalingGroup::read(head.clone(), &listed(4), &rd);
    assert_eq!(
        scaled,
        AutoScalingGroup {
            head: head.clone(),
            subnets: vec![Ref::named("a"), Ref::cloud("subnet-b")],
            ..nodes_group()
        }
    );
    let beyond = AutoScalingGroup::read(head.clone(), &listed(7), &rd);
    assert_eq!(beyond.desired_capacity, 7);
    let unplanned = AutoScalingGroup::read(head, &listed(4), &reader(&[]));
    assert_eq!(unplanned.desired_capacity, 4);
    assert_eq!(unplanned.launch_template, Ref::cloud("lt-1"));
    // Update and delete decode the group as read: every read one decodes again, a group
    // listed with nothing but its name (no template, no sizes) included, so a gap in what
    // AWS lists can never keep `delete cluster` from ending the group.
    let bare = AsgGroup::builder()
        .auto_scaling_group_name("bare.c.example.com")
        .build();
    let bare = AutoScalingGroup::read(
        listed_head("bare", "bare.c.example.com"),
        &bare,
        &reader(&[]),
    );
    for read in [&scaled, &beyond, &unplanned, &bare] {
        // The same field map (the subnets are a set: the map keeps them sorted).
        remade::<AutoScalingGroup>(&read.resource());
    }
}

/// A delete refused on a group already being deleted waits for it instead of failing
/// (`delete cluster` retried after a throttled describe); any other status is a refusal.
#[test]
fn a_group_pending_delete_is_waited_for_not_refused() {
    use super::auto_scaling_group::already_deleting;

    assert!(already_deleting(Some("Delete in progress")));
    assert!(!already_deleting(None));
    assert!(!already_deleting(Some("")));
    assert!(!already_deleting(Some("InService")));
}
