//! The pod network add-ons: Calico, Cilium, Flannel, templated with the cluster's pod CIDR.

use serde::Serialize;

use super::{AddonError, Manifest, render};
use crate::spec::{Cluster, Cni};

pub(super) const CALICO_TEMPLATE: &str = "calico-v3.29.yaml";
pub(super) const CILIUM_TEMPLATE: &str = "cilium-v1.16.yaml";
pub(super) const FLANNEL_TEMPLATE: &str = "flannel-v0.26.yaml";

const CALICO_VERSION: &str = "v3.29.1";
const CILIUM_VERSION: &str = "v1.16.5";
const FLANNEL_VERSION: &str = "v0.26.1";

/// The CRDs Calico's Kubernetes datastore needs before calico-node starts.
const CALICO_CRDS: &[(&str, &str, &str)] = &[
    ("bgpconfigurations", "BGPConfiguration", "Cluster"),
    ("bgpfilters", "BGPFilter", "Cluster"),
    ("bgppeers", "BGPPeer", "Cluster"),
    ("blockaffinities", "BlockAffinity", "Cluster"),
    ("caliconodestatuses", "CalicoNodeStatus", "Cluster"),
    ("clusterinformations", "ClusterInformation", "Cluster"),
    ("felixconfigurations", "FelixConfiguration", "Cluster"),
    ("globalnetworkpolicies", "GlobalNetworkPolicy", "Cluster"),
    ("globalnetworksets", "GlobalNetworkSet", "Cluster"),
    ("hostendpoints", "HostEndpoint", "Cluster"),
    ("ipamblocks", "IPAMBlock", "Cluster"),
    ("ipamconfigs", "IPAMConfig", "Cluster"),
    ("ipamhandles", "IPAMHandle", "Cluster"),
    ("ippools", "IPPool", "Cluster"),
    ("ipreservations", "IPReservation", "Cluster"),
    (
        "kubecontrollersconfigurations",
        "KubeControllersConfiguration",
        "Cluster",
    ),
    ("networkpolicies", "NetworkPolicy", "Namespaced"),
    ("networksets", "NetworkSet", "Namespaced"),
    ("tiers", "Tier", "Cluster"),
];

#[derive(Serialize)]
struct Crd {
    plural: &'static str,
    kind: &'static str,
    scope: &'static str,
}

/// The CNI manifest, or `None` with `cni: none` (the user brings their own).
pub(crate) fn render_cni(cluster: &Cluster) -> Result<Option<Manifest>, AddonError> {
    let cni = cluster
        .spec
        .networking
        .cni
        .ok_or_else(|| AddonError::Field {
            field: "spec.networking.cni".into(),
            message: "not set (the completed spec names the pod network)".into(),
        })?;
    if cni == Cni::None {
        return Ok(None);
    }
    let pod_cidr =
        cluster
            .spec
            .networking
            .pod_cidr
            .as_deref()
            .ok_or_else(|| AddonError::Field {
                field: "spec.networking.podCIDR".into(),
                message: format!("required by {}", cni.as_str()),
            })?;
    let net: ipnet::IpNet = pod_cidr.parse().map_err(|_| AddonError::Field {
        field: "spec.networking.podCIDR".into(),
        message: format!("{pod_cidr:?} is not a CIDR like 100.96.0.0/11"),
    })?;
    let mut ctx = tera::Context::new();
    ctx.insert("pod_cidr", &net.to_string());
    ctx.insert("cluster_name", cluster.name());
    let (template, version) = match cni {
        Cni::Calico => {
            let crds: Vec<Crd> = CALICO_CRDS
                .iter()
                .map(|(plural, kind, scope)| Crd {
                    plural,
                    kind,
                    scope,
                })
                .collect();
            ctx.insert("crds", &crds);
            ctx.insert(
                "images",
                &serde_json::json!({
                    "cni": format!("docker.io/calico/cni:{CALICO_VERSION}"),
                    "node": format!("docker.io/calico/node:{CALICO_VERSION}"),
                    "kube_controllers": format!("docker.io/calico/kube-controllers:{CALICO_VERSION}"),
                }),
            );
            (CALICO_TEMPLATE, CALICO_VERSION)
        }
        Cni::Cilium => {
            ctx.insert(
                "images",
                &serde_json::json!({
                    "agent": format!("quay.io/cilium/cilium:{CILIUM_VERSION}"),
                    "operator": format!("quay.io/cilium/operator-generic:{CILIUM_VERSION}"),
                }),
            );
            (CILIUM_TEMPLATE, CILIUM_VERSION)
        }
        Cni::Flannel => {
            let net_conf = serde_json::json!({
                "Network": net.to_string(),
                "EnableNFTables": false,
                "Backend": { "Type": "vxlan" },
            });
            ctx.insert(
                "net_conf",
                &serde_json::to_string_pretty(&net_conf).unwrap_or_default(), // a JSON value always serialises
            );
            ctx.insert(
                "images",
                &serde_json::json!({
                    "flannel": format!("docker.io/flannel/flannel:{FLANNEL_VERSION}"),
                    "cni_plugin": "docker.io/flannel/flannel-cni-plugin:v1.5.1-flannel2",
                }),
            );
            (FLANNEL_TEMPLATE, FLANNEL_VERSION)
        }
        Cni::None => return Ok(None),
    };
    ctx.insert("version", version);
    Ok(Some(Manifest {
        addon: cni.as_str().to_string(),
        version: version.to_string(),
        yaml: render(template, &ctx)?,
    }))
}
