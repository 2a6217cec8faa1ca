//! The cloud lab's own test: instances an Auto Scaling group starts in moto are played by
//! sshd test hosts holding the host key from their user-data, reachable only the way an
//! operator would reach them, and nothing in the lab reaches an address outside it.
//! Needs root.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use aws_sdk_autoscaling::types::LaunchTemplateSpecification;
use aws_sdk_ec2::types::{
    Filter, LaunchTemplateInstanceNetworkInterfaceSpecificationRequest, RequestLaunchTemplateData,
};
use aws_smithy_types::base64;

use crate::support::awscloud;
use crate::support::cli::says;
use crate::support::cli::{show, text};
use crate::support::cloudlab::{CloudLab, parse_cloud_init};

fn keygen(path: &Path) -> (String, String) {
    let st = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "lab", "-f"])
        .arg(path)
        .status()
        .expect("ssh-keygen");
    assert!(st.success());
    (
        std::fs::read_to_string(path).unwrap(),
        std::fs::read_to_string(path.with_extension("pub")).unwrap(),
    )
}

/// ssh from the operator namespace, strict host keys against `known_hosts` only.
fn ssh(lab: &CloudLab, key: &Path, known_hosts: &Path, target: &str, cmd: &str) -> Output {
    lab.command("ssh")
        .args(["-F", "/dev/null", "-i"])
        .arg(key)
        .args(["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"])
        .args(["-o", "ConnectTimeout=5", "-o"])
        .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
        .args([target, cmd])
        .output()
        .expect("ssh")
}

#[test]
fn cloud_init_documents_are_read_like_cloud_init() {
    let doc = "#cloud-config\nssh_keys:\n  ed25519_private: |\n    -----BEGIN OPENSSH PRIVATE KEY-----\n    abc\n    -----END OPENSSH PRIVATE KEY-----\n  ed25519_public: ssh-ed25519 AAAA host\nssh_authorized_keys:\n  - ssh-ed25519 BBBB op\nusers:\n  - default\n  - name: admin2\n    ssh_authorized_keys: [ssh-ed25519 CCCC other]\n";
    let init = parse_cloud_init(doc).expect("parses");
    assert_eq!(
        init.host_key.as_deref(),
        Some("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----\n")
    );
    assert_eq!(
        init.authorized_keys,
        ["ssh-ed25519 BBBB op", "ssh-ed25519 CCCC other"]
    );
    assert_eq!(init.user.as_deref(), Some("admin2"));
    assert!(
        parse_cloud_init("#!/bin/sh\necho hi\n")
            .unwrap_err()
            .contains("not a #cloud-config")
    );
}

#[test]
fn instances_are_played_by_hosts_with_their_user_data_host_keys() {
    crate::needs_tier!(CloudLab);
    let lab = CloudLab::start();
    let dir = lab.net.dir().join("selftest");
    std::fs::create_dir_all(&dir).unwrap();
    let (host_private, host_public) = keygen(&dir.join("host_key"));
    let (_, client_public) = keygen(&dir.join("client_key"));
    let client_key = dir.join("client_key");
    let user_data = format!(
        "#cloud-config\nssh_keys:\n  ed25519_private: |\n{}  ed25519_public: {}ssh_authorized_keys:\n  - {}",
        host_private
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>(),
        host_public,
        client_public
    );
    // known_hosts holds only the user-data's public host key, for every address.
    let known_hosts = dir.join("known_hosts");
    let vpc_cidr = lab.net.vpc_cidr();
    let subnet_cidr = vpc_cidr.subnets(26).unwrap().nth(1).unwrap();

    let sdk = lab.block_on(lab.sdk_config());
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let asg = aws_sdk_autoscaling::Client::new(&sdk);
    let subnet_id = lab.block_on(async {
        let vpc_id = awscloud::create_vpc(&ec2, &vpc_cidr.to_string()).await;
        let subnet_id =
            awscloud::create_subnet(&ec2, &vpc_id, &subnet_cidr.to_string(), Some("us-east-1a"))
                .await;
        awscloud::map_public_ip_on_launch(&ec2, &subnet_id).await;
        // Public: its route table sends 0.0.0.0/0 to an internet gateway.
        let igw_id = awscloud::create_internet_gateway(&ec2, &vpc_id).await;
        awscloud::route_to_internet(&ec2, &vpc_id, &subnet_id, &igw_id).await;
        let images = ec2
            .describe_images()
            .owners("099720109477")
            .filters(
                Filter::builder()
                    .name("name")
                    .values("ubuntu/images/hvm-ssd/ubuntu-xenial-16.04-amd64-server-*")
                    .build(),
            )
            .send()
            .await
            .expect("images");
        let image = images.images()[0].image_id().unwrap().to_string();
        ec2.create_launch_template()
            .launch_template_name("lab-nodes")
            .launch_template_data(
                RequestLaunchTemplateData::builder()
                    .image_id(image)
                    .instance_type(aws_sdk_ec2::types::InstanceType::T3Medium)
                    .user_data(base64::encode(&user_data))
                    .network_interfaces(
                        LaunchTemplateInstanceNetworkInterfaceSpecificationRequest::builder()
                            .device_index(0)
                            .associate_public_ip_address(true)
                            .build(),
                    )
                    .build(),
            )
            .send()
            .await
            .expect("launch template");
        asg.create_auto_scaling_group()
            .auto_scaling_group_name("lab-nodes")
            .launch_template(
                LaunchTemplateSpecification::builder()
                    .launch_template_name("lab-nodes")
                    .version("$Latest")
                    .build(),
            )
            .min_size(0)
            .max_size(5)
            .desired_capacity(2)
            .vpc_zone_identifier(&subnet_id)
            .send()
            .await
            .expect("asg");
        subnet_id
    });

    let t = Instant::now();
    let synced = lab.sync();
    let two_up = t.elapsed();
    assert_eq!(synced.started.len(), 2, "{synced:?}");
    let hosts = lab.instances();
    let mut kh = String::new();
    for h in hosts.values() {
        let mut parts = host_public.split_whitespace();
        kh.push_str(&format!(
            "{} {} {}\n",
            h.address,
            parts.next().unwrap(),
            parts.next().unwrap()
        ));
    }
    std::fs::write(&known_hosts, &kh).unwrap();

    // Each instance answers at its private address with the user-data's host key, lets the
    // authorised key in as the image's login user, with passwordless sudo.
    let describe = |ids: Vec<String>| {
        lab.block_on(ec2.describe_instances().set_instance_ids(Some(ids)).send())
            .expect("describe")
            .reservations()
            .iter()
            .flat_map(|r| r.instances().to_vec())
            .collect::<Vec<_>>()
    };
    let described = describe(hosts.keys().cloned().collect());
    for i in &described {
        let addr = i.private_ip_address().unwrap();
        assert!(subnet_cidr.contains(&addr.parse::<std::net::Ipv4Addr>().unwrap()));
        assert_eq!(i.subnet_id(), Some(subnet_id.as_str()));
        let o = ssh(
            &lab,
            &client_key,
            &known_hosts,
            &format!("ubuntu@{addr}"),
            "sudo -n id -u; hostname",
        );
        assert!(o.status.success(), "{addr}: {}", show(&o));
        assert_eq!(
            text(&o.stdout),
            format!("0\n{}\n", i.private_dns_name().unwrap()),
            "{addr}"
        );
        // Root is not let in, as on a cloud image.
        let o = ssh(
            &lab,
            &client_key,
            &known_hosts,
            &format!("root@{addr}"),
            "true",
        );
        assert!(!o.status.success(), "{}", show(&o));
    }

    // Nothing in the lab reaches an address outside it: the public address moto invented
    // is unreachable at once from the operator namespace, the router and a host.
    let public = described[0]
        .public_ip_address()
        .expect("moto gave the instance a public address")
        .to_string();
    assert!(
        !lab.net
            .block
            .contains(&public.parse::<std::net::Ipv4Addr>().unwrap())
    );
    let t = Instant::now();
    let o = lab
        .command("bash")
        .args(["-c", &format!("exec 3<>/dev/tcp/{public}/22")])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", show(&o));
    says(&o, "Network is unreachable");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let router = std::process::Command::new("ip")
        .args(["netns", "exec", &lab.net.router_ns, "bash", "-c"])
        .arg(format!("exec 3<>/dev/tcp/{public}/22"))
        .output()
        .unwrap();
    says(&router, "Network is unreachable");
    // From a host the packet dies at the router (which has no route out); Linux's TCP
    // treats the ICMP error as soft, so the connect only gives up at the timeout.
    let first = hosts.values().next().unwrap();
    let err = first
        .exec(&format!("timeout 2 bash -c 'exec 3<>/dev/tcp/{public}/22'"))
        .unwrap_err();
    assert!(
        err.contains("exit status: 124") || err.contains("unreachable"),
        "{err}"
    );
    let route = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.net.router_ns,
            "ip",
            "route",
            "get",
            &public,
        ])
        .output()
        .unwrap();
    says(&route, "Network is unreachable");
    // Names do not resolve either (no name server in the lab).
    let o = lab
        .command("getent")
        .args([
            "hosts",
            described[0].public_dns_name().unwrap_or("example.com"),
        ])
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", show(&o));

    // The hosts reach the lab's services at the gateway: the mirror, the fake API (TLS, its
    // certificate signed by the lab CA the host holds).
    let url = lab.mirror.asset_files()[0].url.clone();
    first
        .exec(&format!("curl -fsS -o /dev/null {url}"))
        .unwrap_or_else(|e| panic!("mirror from a host: {e}"));
    // The fake API answers only on the ports a load balancer in moto listens on: none before
    // a listener exists, then that listener's port and no other.
    let api = |port: u16| {
        first.exec(&format!(
            "curl -sS --max-time 5 --cacert /etc/kprov-standins/ca.crt https://{}:{port}/api/v1/namespaces",
            lab.net.gateway
        ))
    };
    assert!(lab.api_ports().is_empty(), "{:?}", lab.api_ports());
    let refused = api(6443).expect_err("no listener yet");
    assert!(refused.contains("Couldn't connect"), "{refused}");
    let elb = aws_sdk_elasticloadbalancingv2::Client::new(&sdk);
    let listener = lab.block_on(async {
        let lb = elb
            .create_load_balancer()
            .name("lab-api")
            .r#type(aws_sdk_elasticloadbalancingv2::types::LoadBalancerTypeEnum::Network)
            .subnets(&subnet_id)
            .send()
            .await
            .expect("load balancer");
        let lb_arn = lb.load_balancers()[0]
            .load_balancer_arn()
            .unwrap()
            .to_string();
        let vpc_id = lb.load_balancers()[0].vpc_id().unwrap().to_string();
        let tg = elb
            .create_target_group()
            .name("lab-api")
            .protocol(aws_sdk_elasticloadbalancingv2::types::ProtocolEnum::Tcp)
            .port(6443)
            .vpc_id(vpc_id)
            .send()
            .await
            .expect("target group");
        let tg_arn = tg.target_groups()[0]
            .target_group_arn()
            .unwrap()
            .to_string();
        elb.create_listener()
            .load_balancer_arn(lb_arn)
            .protocol(aws_sdk_elasticloadbalancingv2::types::ProtocolEnum::Tcp)
            .port(6443)
            .default_actions(
                aws_sdk_elasticloadbalancingv2::types::Action::builder()
                    .r#type(aws_sdk_elasticloadbalancingv2::types::ActionTypeEnum::Forward)
                    .target_group_arn(tg_arn)
                    .build(),
            )
            .send()
            .await
            .expect("listener")
            .listeners()[0]
            .listener_arn()
            .unwrap()
            .to_string()
    });
    lab.sync();
    assert_eq!(lab.api_ports(), vec![6443]);
    let out = api(6443).unwrap_or_else(|e| panic!("fake API from a host: {e}"));
    assert!(out.contains("NamespaceList"), "{out}");
    let refused = api(443).expect_err("no listener on 443");
    assert!(refused.contains("Couldn't connect"), "{refused}");
    // The listener gone, its port closes.
    lab.block_on(elb.delete_listener().listener_arn(listener).send())
        .expect("delete listener");
    lab.sync();
    assert!(lab.api_ports().is_empty(), "{:?}", lab.api_ports());
    let refused = api(6443).expect_err("listener deleted");
    assert!(refused.contains("Couldn't connect"), "{refused}");

    // A kubelet kubeadm set up registers its node in the fake API (the lab plays kubelets),
    // with the provider ID the CCM expects and the uninitialized taint (no CCM applied).
    let (first_id, _) = hosts
        .iter()
        .find(|(_, h)| h.address == first.address)
        .unwrap();
    assert!(lab.fake.list("Node").is_empty());
    first
        .exec("mkdir -p /etc/kubernetes && printf 'users:\n- name: system:node:node-a\n' > /etc/kubernetes/kubelet.conf")
        .unwrap();
    lab.sync();
    let node = lab
        .fake
        .get("Node", None, "node-a")
        .expect("node registered");
    assert_eq!(
        node["spec"]["providerID"],
        format!("aws:///us-east-1a/{first_id}")
    );
    assert!(
        node["spec"]["taints"].to_string().contains("uninitialized"),
        "{node}"
    );

    // A host presenting a different key is refused.
    first.new_host_key();
    let o = ssh(
        &lab,
        &client_key,
        &known_hosts,
        &format!("ubuntu@{}", first.address),
        "true",
    );
    assert!(!o.status.success(), "{}", show(&o));
    says(&o, "REMOTE HOST IDENTIFICATION HAS CHANGED");

    // A third instance, after the group grows, gets its host on the next sync.
    lab.block_on(
        asg.set_desired_capacity()
            .auto_scaling_group_name("lab-nodes")
            .desired_capacity(3)
            .send(),
    )
    .expect("grow");
    let synced = lab.sync();
    assert_eq!(synced.started.len(), 1, "{synced:?}");
    let third = lab.instances()[&synced.started[0]].clone();
    let mut parts = host_public.split_whitespace();
    kh.push_str(&format!(
        "{} {} {}\n",
        third.address,
        parts.next().unwrap(),
        parts.next().unwrap()
    ));
    std::fs::write(&known_hosts, &kh).unwrap();
    let o = ssh(
        &lab,
        &client_key,
        &known_hosts,
        &format!("ubuntu@{}", third.address),
        "true",
    );
    assert!(o.status.success(), "{}", show(&o));
    assert_eq!(lab.sync().started.len(), 0, "a second sync starts nothing");

    // A terminated instance loses its host.
    let gone = synced.started[0].clone();
    lab.block_on(
        asg.terminate_instance_in_auto_scaling_group()
            .instance_id(&gone)
            .should_decrement_desired_capacity(true)
            .send(),
    )
    .expect("terminate");
    let synced = lab.sync();
    assert_eq!(synced.stopped, std::slice::from_ref(&gone), "{synced:?}");
    assert!(!lab.instances().contains_key(&gone));
    assert!(lab.net.host(&third.address).is_none());
    let o = ssh(
        &lab,
        &client_key,
        &known_hosts,
        &format!("ubuntu@{}", third.address),
        "true",
    );
    assert!(!o.status.success(), "{}", show(&o));

    let netns_before: Vec<String> = lab.net.hosts().iter().map(|h| h.name.clone()).collect();
    assert_eq!(netns_before.len(), 2);
    let (router_ns, dir) = (lab.net.router_ns.clone(), lab.net.dir().to_path_buf());
    let started_in = lab.started_in;
    let t = Instant::now();
    drop(lab);
    let down = t.elapsed();
    eprintln!("cloud lab: up {started_in:?}, 2 instances synced in {two_up:?}, down {down:?}");
    let namespaces = String::from_utf8_lossy(
        &std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(!namespaces.contains(&router_ns), "{namespaces}");
    assert!(!dir.exists(), "{} left behind", dir.display());
}
