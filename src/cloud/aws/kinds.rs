//! The AWS resource kinds (the first half of every `ResourceId`).

pub const VPC: &str = "Vpc";
pub const SUBNET: &str = "Subnet";
pub const INTERNET_GATEWAY: &str = "InternetGateway";
pub const ROUTE_TABLE: &str = "RouteTable";
pub const ELASTIC_IP: &str = "ElasticIp";
pub const NAT_GATEWAY: &str = "NatGateway";
pub const SECURITY_GROUP: &str = "SecurityGroup";
pub const SECURITY_GROUP_RULES: &str = "SecurityGroupRules";
pub const KEY_PAIR: &str = "KeyPair";
pub const IAM_ROLE: &str = "IamRole";
pub const IAM_ROLE_POLICY: &str = "IamRolePolicy";
pub const INSTANCE_PROFILE: &str = "IamInstanceProfile";
pub const LAUNCH_TEMPLATE: &str = "LaunchTemplate";
pub const AUTOSCALING_GROUP: &str = "AutoScalingGroup";
pub const LOAD_BALANCER: &str = "LoadBalancer";
pub const TARGET_GROUP: &str = "TargetGroup";
pub const LISTENER: &str = "Listener";
/// A Classic ELB: only ever someone else's (the cloud-controller-manager's), read for `delete`.
pub const CLASSIC_LOAD_BALANCER: &str = "ClassicLoadBalancer";
pub const DNS_ZONE: &str = "DnsZone";
pub const DNS_RECORD: &str = "DnsRecord";
pub const DNS_ZONE_VPC: &str = "DnsZoneVpcAssociation";
