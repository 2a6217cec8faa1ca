//! The cloud-controller-manager manifest, and the cluster-wide `--cloud-provider` rule every
//! other part of kprov follows.

use std::collections::BTreeMap;

use serde::Serialize;

use super::providers::{ConfigStore, Provider, provider, provider_names};
use super::{AddonError, Manifest, base64, render};
use crate::spec::Cluster;

pub(super) const TEMPLATE: &str = "ccm-v1.yaml";
/// The add-on name of the CCM manifest.
pub(crate) const ADDON: &str = "cloud-controller-manager";
const TEMPLATE_VERSION: &str = "v1";
const CONFIG_DIR: &str = "/etc/kubernetes/cloud-config";

/// The control-plane components whose flags depend on the cloud provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// The kubelet on every node.
    Kubelet,
    /// kube-apiserver on the control planes.
    KubeApiserver,
    /// kube-controller-manager on the control planes.
    KubeControllerManager,
}

impl Component {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Component::Kubelet => "kubelet",
            Component::KubeApiserver => "kube-apiserver",
            Component::KubeControllerManager => "kube-controller-manager",
        }
    }
}

/// The provider entry of the cluster's CCM, `None` when no CCM runs (plain bare metal).
pub(crate) fn cluster_provider(cluster: &Cluster) -> Result<Option<&'static Provider>, AddonError> {
    cluster
        .external_cloud_provider()
        .map(|name| {
            provider(name).ok_or_else(|| AddonError::Field {
                field: "spec.cloudControllerManager.provider".into(),
                message: format!(
                    "unknown provider {name:?}; known: {}",
                    provider_names().join(", ")
                ),
            })
        })
        .transpose()
}

/// The `--cloud-provider` flag a component runs with. With a CCM, kubelets run with
/// `--cloud-provider=external` (so they wait for the CCM to initialise their node); the API
/// server and controller manager never get the flag, or they would run the cloud loops the CCM
/// owns. Without a CCM nothing sets it: an `external` kubelet with no CCM stays tainted forever.
pub fn cloud_provider_flag(
    cluster: &Cluster,
    component: Component,
) -> Result<Option<String>, AddonError> {
    let with_ccm = cluster_provider(cluster)?.is_some();
    Ok((with_ccm && component == Component::Kubelet).then(|| "--cloud-provider=external".into()))
}

/// The same rule as kubeadm `nodeRegistration.kubeletExtraArgs` entries.
pub fn kubelet_extra_args(cluster: &Cluster) -> Result<BTreeMap<String, String>, AddonError> {
    Ok(cloud_provider_flag(cluster, Component::Kubelet)?
        .map(|_| ("cloud-provider".to_string(), "external".to_string()))
        .into_iter()
        .collect())
}

/// Checks a component's rendered arguments (`--name=value` strings) against the rule, for
/// renderers to call on what they produced.
pub fn check_cloud_provider_args(
    cluster: &Cluster,
    component: Component,
    args: &[String],
) -> Result<(), AddonError> {
    let expected = cloud_provider_flag(cluster, component)?;
    let found: Vec<&String> = args
        .iter()
        .filter(|a| a.trim_start_matches('-').starts_with("cloud-provider"))
        .collect();
    let ok = match &expected {
        Some(flag) => found.len() == 1 && found[0] == flag,
        None => found.is_empty(),
    };
    if ok {
        return Ok(());
    }
    Err(AddonError::Field {
        field: "spec.cloudControllerManager.provider".into(),
        message: format!(
            "{} must run {} but its arguments have {}",
            component.as_str(),
            expected.map_or("without --cloud-provider".to_string(), |f| format!(
                "with {f}"
            )),
            if found.is_empty() {
                "none".to_string()
            } else {
                found
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        ),
    })
}

#[derive(Serialize)]
struct Env {
    name: &'static str,
    value: Option<String>,
    secret: Option<String>,
    key: Option<&'static str>,
}

/// The CCM manifest, or `None` when the cluster runs no CCM.
pub(crate) fn render_ccm(cluster: &Cluster) -> Result<Option<Manifest>, AddonError> {
    let Some(p) = cluster_provider(cluster)? else {
        return Ok(None);
    };
    let spec = cluster
        .spec
        .cloud_controller_manager
        .as_ref()
        .ok_or_else(|| AddonError::Field {
            field: "spec.cloudControllerManager".into(),
            message: "missing".into(),
        })?;
    let image =
        match &spec.image {
            Some(image) => image.clone(),
            None => {
                let version = cluster.spec.kubernetes_version.as_deref().ok_or_else(|| {
                    AddonError::Field {
                        field: "spec.kubernetesVersion".into(),
                        message: "not set: the CCM image follows the Kubernetes minor".into(),
                    }
                })?;
                p.image_for(version)?.to_string()
            }
        };
    let config = p.check_config(&spec.config)?;

    let mut args: Vec<(String, Option<String>)> = vec![
        ("cloud-provider".into(), Some(p.name.into())),
        ("leader-elect".into(), Some("true".into())),
        (
            "use-service-account-credentials".into(),
            Some("true".into()),
        ),
        ("v".into(), Some("2".into())),
    ];
    if p.config_store != ConfigStore::None {
        args.push((
            "cloud-config".into(),
            Some(format!("{CONFIG_DIR}/{}", p.config_file)),
        ));
    }
    for flag in p.flags {
        let (k, v) = flag
            .trim_start_matches('-')
            .split_once('=')
            .map_or((flag.trim_start_matches('-'), None), |(k, v)| {
                (k, Some(v.to_string()))
            });
        args.push((k.to_string(), v));
    }
    let mut env = Vec::new();
    if p.name == "hcloud" {
        env.push(Env {
            name: "HCLOUD_TOKEN",
            value: None,
            secret: Some(
                config
                    .get("tokenSecretName")
                    .cloned()
                    .unwrap_or_else(|| "hcloud".into()),
            ),
            key: Some("token"),
        });
        if let Some(network) = config.get("network") {
            env.push(Env {
                name: "HCLOUD_NETWORK",
                value: Some(network.clone()),
                secret: None,
                key: None,
            });
            // With a private network the CCM routes pod traffic, so it allocates node CIDRs.
            let pod_cidr =
                cluster
                    .spec
                    .networking
                    .pod_cidr
                    .as_ref()
                    .ok_or_else(|| AddonError::Field {
                        field: "spec.networking.podCIDR".into(),
                        message: "required when config.network routes pod traffic".into(),
                    })?;
            args.push(("allocate-node-cidrs".into(), Some("true".into())));
            args.push(("cluster-cidr".into(), Some(pod_cidr.clone())));
        }
    }
    // What the user wrote wins: an extra arg replaces the flag of the same name.
    for (k, v) in &spec.extra_args {
        let k = k.trim_start_matches('-');
        let v = (!v.is_empty()).then(|| v.clone());
        match args.iter_mut().find(|(name, _)| name == k) {
            Some(existing) => existing.1 = v,
            None => args.push((k.to_string(), v)),
        }
    }
    let args: Vec<String> = args
        .into_iter()
        .map(|(k, v)| v.map_or(format!("--{k}"), |v| format!("--{k}={v}")))
        .collect();

    let config_text = p.render_config(&config).unwrap_or_default(); // None: this provider takes no config file
    let store = match p.config_store {
        ConfigStore::None => "None",
        ConfigStore::ConfigMap => "ConfigMap",
        ConfigStore::Secret => "Secret",
    };
    let mut ctx = tera::Context::new();
    ctx.insert("provider", p.name);
    ctx.insert("image", &image);
    ctx.insert("command", &p.command);
    ctx.insert("args", &args);
    ctx.insert("env", &env);
    ctx.insert("config_store", store);
    ctx.insert("config_file", p.config_file);
    ctx.insert("config_text", &config_text);
    ctx.insert("config_base64", &base64(config_text.as_bytes()));
    Ok(Some(Manifest {
        addon: ADDON.into(),
        version: TEMPLATE_VERSION.into(),
        yaml: render(TEMPLATE, &ctx)?,
    }))
}
