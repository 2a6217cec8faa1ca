//! Property tests: parsing never panics on any input, and what kprov writes it reads back
//! unchanged, including strings YAML would otherwise reinterpret (`yes`, `1.20`, `~`, `0x1F`).

use std::collections::BTreeMap;

use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;

use super::*;

fn tricky_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9-]{0,12}",
        Just("yes".to_string()),
        Just("no".to_string()),
        Just("null".to_string()),
        Just("~".to_string()),
        Just("1.20".to_string()),
        Just("0x1F".to_string()),
        Just("010".to_string()),
        Just("".to_string()),
        Just(" padded ".to_string()),
        Just("a: b".to_string()),
        Just("#not-a-comment".to_string()),
        Just("- dash".to_string()),
        Just("it's \"quoted\"".to_string()),
        Just("multi\nline\n".to_string()),
        Just("ünïcødé ✓".to_string()),
        Just("---".to_string()),
        "\\PC{0,20}",
    ]
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        tricky_string().prop_map(serde_json::Value::String),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i32>().prop_map(|n| serde_json::Value::Number(n.into())),
    ]
}

fn host() -> impl Strategy<Value = Host> {
    (
        "[a-z][a-z0-9-]{0,10}",
        "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}",
        option::of(tricky_string()),
        option::of(any::<u16>()),
        vec(
            prop_oneof![
                Just(HostRole::ControlPlane),
                Just(HostRole::Node),
                Just(HostRole::Etcd)
            ],
            0..3,
        ),
        btree_map("[a-z]{1,8}", tricky_string(), 0..3),
        vec(tricky_string(), 0..2),
    )
        .prop_map(|(name, address, user, port, roles, labels, taints)| Host {
            name,
            address,
            ip: None,
            access_ip: None,
            user,
            port,
            key_path: None,
            bastion: None,
            roles,
            labels,
            taints,
        })
}

fn cluster() -> impl Strategy<Value = Cluster> {
    (
        "[a-z][a-z0-9-]{0,10}(\\.[a-z]{2,6}){0,2}",
        prop_oneof![Just(CloudProvider::Aws), Just(CloudProvider::Metal)],
        option::of(tricky_string()),
        vec(
            (
                "[a-z0-9-]{1,10}",
                tricky_string(),
                tricky_string(),
                prop_oneof![
                    Just(SubnetType::Public),
                    Just(SubnetType::Private),
                    Just(SubnetType::Utility)
                ],
            ),
            0..4,
        ),
        option::of(prop_oneof![
            Just(Cni::Calico),
            Just(Cni::Cilium),
            Just(Cni::Flannel),
            Just(Cni::None)
        ]),
        option::of(btree_map("[a-zA-Z]{1,8}", json_value(), 0..4)),
        vec(host(), 0..4),
        btree_map("[a-z./]{1,12}", tricky_string(), 0..3),
    )
        .prop_map(
            |(name, cloud, version, subnets, cni, ccm, hosts, annotations)| Cluster {
                api_version: API_VERSION.into(),
                kind: KIND_CLUSTER.into(),
                metadata: ObjectMeta {
                    name,
                    labels: BTreeMap::new(),
                    annotations,
                },
                spec: ClusterSpec {
                    kubernetes_version: version,
                    networking: Networking {
                        subnets: subnets
                            .into_iter()
                            .map(|(name, zone, cidr, kind)| Subnet {
                                name,
                                zone,
                                cidr,
                                kind,
                                id: None,
                            })
                            .collect(),
                        cni,
                        ..Default::default()
                    },
                    cloud_controller_manager: ccm.map(|config| CloudControllerManager {
                        provider: Some("openstack".into()),
                        config,
                        ..Default::default()
                    }),
                    hosts,
                    ..ClusterSpec::new(cloud)
                },
            },
        )
}

fn group() -> impl Strategy<Value = InstanceGroup> {
    (
        "[a-z][a-z0-9-]{0,10}",
        prop_oneof![
            Just(InstanceGroupRole::ControlPlane),
            Just(InstanceGroupRole::Node),
            Just(InstanceGroupRole::Bastion)
        ],
        option::of(tricky_string()),
        option::of(any::<u32>()),
        option::of(prop_oneof![
            any::<u32>().prop_map(IntOrPercent::Int),
            "[0-9]{1,3}%".prop_map(IntOrPercent::Percent)
        ]),
        btree_map("[a-z./-]{1,12}", tricky_string(), 0..3),
    )
        .prop_map(|(name, role, machine_type, min, surge, node_labels)| {
            defaults::new_instance_group(
                "c.example.com",
                &name,
                InstanceGroupSpec {
                    role,
                    machine_type,
                    image: None,
                    min_size: min,
                    max_size: None,
                    subnets: vec![],
                    rolling_update: surge.map(|s| RollingUpdate {
                        max_surge: Some(s),
                        max_unavailable: None,
                    }),
                    node_labels,
                    taints: vec![],
                    ssh_user: None,
                },
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn loading_arbitrary_text_never_panics(text in "\\PC{0,400}") {
        let _ = load_objects("fuzz.yaml", &text);
    }

    #[test]
    fn loading_yaml_like_text_never_panics(lines in vec(prop_oneof![
        Just("apiVersion: kprov.dev/v1alpha1".to_string()), Just("kind: Cluster".to_string()), Just("kind: InstanceGroup".to_string()),
        Just("---".to_string()), Just("metadata:".to_string()), Just("  name: x".to_string()), Just("spec:".to_string()),
        Just("  cloudProvider: aws".to_string()), Just("  role: Node".to_string()), Just("  - a".to_string()), Just("  minSize: -1".to_string()),
        "[ a-z:{}\\[\\],-]{0,20}",
    ], 0..30)) {
        let text = lines.join("\n");
        if let Err(e) = load_objects("fuzz.yaml", &text) {
            // Every diagnostic names its source, and positions stay inside the input.
            for d in &e.0 {
                prop_assert_eq!(&d.source, "fuzz.yaml");
                if let Some(p) = d.pos {
                    prop_assert!(p.line >= 1 && p.line <= lines.len().max(1) + 1, "line {} of {}", p.line, lines.len());
                }
            }
        }
    }

    #[test]
    fn cluster_and_groups_round_trip(c in cluster(), gs in vec(group(), 0..4)) {
        let objs = std::iter::once(ObjectRef::Cluster(&c)).chain(gs.iter().map(ObjectRef::InstanceGroup));
        let text = to_yaml_stream(objs).expect("serialises");
        let back = load_objects("rt.yaml", &text).map_err(|e| TestCaseError::fail(format!("{e}\n---\n{text}")))?;
        prop_assert_eq!(back.len(), 1 + gs.len());
        match &back[0].value {
            Object::Cluster(b) => prop_assert_eq!(b, &c, "{}", text),
            other => prop_assert!(false, "expected a Cluster, got {:?}", other),
        }
        for (loaded, g) in back[1..].iter().zip(&gs) {
            match &loaded.value {
                Object::InstanceGroup(b) => prop_assert_eq!(b, g, "{}", text),
                other => prop_assert!(false, "expected an InstanceGroup, got {:?}", other),
            }
        }
    }

    #[test]
    fn completion_is_idempotent(c in cluster(), gs in vec(group(), 0..3)) {
        let (c1, g1) = defaults::complete(&c, &gs);
        let (c2, g2) = defaults::complete(&c1, &g1);
        prop_assert_eq!(c1, c2);
        prop_assert_eq!(g1, g2);
    }

    #[test]
    fn validation_never_panics(c in cluster(), gs in vec(group(), 0..3)) {
        let (c, g) = defaults::complete(&c, &gs);
        let _ = validate::validate(&c, &g);
    }

    /// Resolving never panics, and the completed objects resolve to the same cluster as the
    /// user's: defaults are applied once, so applying them first changes nothing.
    #[test]
    fn resolving_the_completed_spec_is_resolving_the_spec(
        c in cluster(),
        gs in vec(group(), 0..3),
    ) {
        let direct = crate::spec::resolve(&c, &gs);
        let (cc, cg) = defaults::complete(&c, &gs);
        let again = crate::spec::resolve(&cc, &cg);
        match (direct, again) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
            (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
            (a, b) => prop_assert!(false, "{:?} vs {:?}", a.is_ok(), b.is_ok()),
        }
    }
}
