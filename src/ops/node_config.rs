//! The cluster-wide copies of the node settings: kubeadm's `kubelet-config` and `kube-proxy`
//! ConfigMaps in kube-system, which `kubeadm join` (the kubelet's /var/lib/kubelet/config.yaml),
//! `kubeadm upgrade` and every kube-proxy pod read. `update cluster --yes` rewrites them from
//! `spec.kubelet` and `spec.kubeProxy` so that nodes joining later, upgrades and restarted
//! kube-proxies see what the spec says; running kubelets get it from `rolling-update`
//! (`ops::rolling_metal`).
//!
//! Only the fields kprov owns change ([`NodeSettings::edit_component_config`]); everything
//! else stays as kubeadm wrote it, keys sorted as kubeadm marshals them. A ConfigMap already
//! saying what the spec says is not written (compared as data).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;

use crate::kube::{FIELD_MANAGER, Kube};
use crate::provision::render::{ComponentConfig, NodeSettings};

/// The ConfigMaps, their data key, and what the key holds.
pub(crate) const CONFIG_MAPS: [(&str, &str, ComponentConfig); 2] = [
    ("kubelet-config", "kubelet", ComponentConfig::Kubelet),
    ("kube-proxy", "config.conf", ComponentConfig::KubeProxy),
];

/// What [`sync`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Synced {
    /// `kube-system/NAME` of each ConfigMap rewritten.
    pub rewritten: Vec<String>,
    /// Those not found (kubeadm makes both at `init`; a cluster without them is told).
    pub missing: Vec<String>,
}

/// Rewrites the ConfigMaps that differ from the spec. A write is a replace at the version
/// read: a concurrent change fails it (named) instead of being overwritten.
pub(crate) async fn sync(kube: &Kube, settings: &NodeSettings) -> Result<Synced, String> {
    let api: Api<ConfigMap> = Api::namespaced(kube.client().clone(), "kube-system");
    let mut out = Synced::default();
    for (name, key, which) in CONFIG_MAPS {
        let full = format!("kube-system/{name}");
        let Some(mut cm) = api
            .get_opt(name)
            .await
            .map_err(|e| format!("reading ConfigMap {full}: {e}"))?
        else {
            out.missing.push(full);
            continue;
        };
        let Some(text) = cm.data.as_ref().and_then(|d| d.get(key)) else {
            return Err(format!(
                "ConfigMap {full} has no data key {key:?} (kubeadm writes the {} there)",
                which.kind()
            ));
        };
        let origin = format!("ConfigMap {full} (data key {key:?})");
        let Some(new) = settings.edit_component_config(which, &origin, text)? else {
            continue;
        };
        cm.data.get_or_insert_default().insert(key.to_string(), new);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        api.replace(name, &params, &cm)
            .await
            .map_err(|e| format!("rewriting ConfigMap {full}: {e}"))?;
        out.rewritten.push(full);
    }
    Ok(out)
}
