//! The cloud-controller-manager provider table: image per Kubernetes minor, flags, the cloud
//! configuration each provider reads and the credentials it expects.
//!
//! Image tags are the providers' releases for each Kubernetes minor (a CCM follows the minor of
//! the cluster it runs in), one entry for exactly the minors of
//! `spec::assets::SUPPORTED_KUBERNETES_VERSIONS` (a unit test holds the two tables together);
//! docs/addons.md says where each tag was taken from.

use std::collections::BTreeMap;

use serde_json::Value;

use super::AddonError;

/// How the provider's configuration reaches the CCM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConfigStore {
    /// No cloud config file: the CCM uses instance metadata / IAM.
    None,
    /// A ConfigMap (nothing secret in it).
    ConfigMap,
    /// A Secret (the file holds credentials).
    Secret,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyType {
    String,
    Bool,
}

/// One key of `spec.cloudControllerManager.config`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConfigKey {
    pub(crate) name: &'static str,
    pub(crate) required: bool,
    pub(crate) kind: KeyType,
}

const fn req(name: &'static str) -> ConfigKey {
    ConfigKey {
        name,
        required: true,
        kind: KeyType::String,
    }
}
const fn opt(name: &'static str) -> ConfigKey {
    ConfigKey {
        name,
        required: false,
        kind: KeyType::String,
    }
}
const fn opt_bool(name: &'static str) -> ConfigKey {
    ConfigKey {
        name,
        required: false,
        kind: KeyType::Bool,
    }
}

/// A cloud-controller-manager kprov can deploy: its images per Kubernetes minor, flags and cloud
/// config.
#[derive(Debug)]
pub struct Provider {
    /// The name `--cloud-provider` takes and `spec.cloudControllerManager.provider` names.
    pub name: &'static str,
    /// (Kubernetes minor, image).
    pub(crate) images: &'static [(u32, &'static str)],
    /// Set when the image has no usable entrypoint and the binary must be named.
    pub(crate) command: Option<&'static str>,
    /// Flags beyond the common ones (`--cloud-provider`, leader election, credentials).
    pub(crate) flags: &'static [&'static str],
    pub(crate) config_store: ConfigStore,
    /// File name of the cloud config inside the mounted ConfigMap/Secret.
    pub(crate) config_file: &'static str,
    pub(crate) keys: &'static [ConfigKey],
}

/// Every provider `spec.cloudControllerManager.provider` may name.
pub const PROVIDERS: &[Provider] = &[
    Provider {
        name: "aws",
        images: &[
            (
                34,
                "registry.k8s.io/provider-aws/cloud-controller-manager:v1.34.0",
            ),
            (
                35,
                "registry.k8s.io/provider-aws/cloud-controller-manager:v1.35.0",
            ),
            // No v1.36 release of the AWS CCM is published (v1.36.1 is a tag without an
            // image): the 1.35 CCM, one minor older than the API server as the skew policy
            // allows for controller managers.
            (
                36,
                "registry.k8s.io/provider-aws/cloud-controller-manager:v1.35.0",
            ),
        ],
        command: None,
        flags: &["--configure-cloud-routes=false"],
        config_store: ConfigStore::None,
        config_file: "",
        keys: &[],
        // What the CCM needs from the cloud (checked by nobody but the cloud): The control-plane
        // instance profile grants the CCM policy (EC2 describe/tag, ELB and ELBv2 management,
        // autoscaling describe); kprov's IAM role for the control plane carries it. Nodes must be
        // tagged kubernetes.io/cluster/NAME.
    },
    Provider {
        name: "gce",
        images: &[
            (
                34,
                "registry.k8s.io/cloud-provider-gcp/cloud-controller-manager:v34.2.0",
            ),
            (
                35,
                "registry.k8s.io/cloud-provider-gcp/cloud-controller-manager:v35.0.2",
            ),
            (
                36,
                "registry.k8s.io/cloud-provider-gcp/cloud-controller-manager:v36.0.7",
            ),
        ],
        command: Some("/cloud-controller-manager"),
        flags: &["--configure-cloud-routes=false"],
        config_store: ConfigStore::ConfigMap,
        config_file: "gce.conf",
        keys: &[
            req("projectID"),
            opt("networkName"),
            opt("subnetworkName"),
            opt("nodeTags"),
            opt_bool("multizone"),
        ],
        // What the CCM needs from the cloud (checked by nobody but the cloud): The control-plane
        // VMs' service account needs roles/compute.admin (instances, forwarding rules, firewalls,
        // target pools) and the cloud-platform scope.
    },
    Provider {
        name: "azure",
        // From 1.32 upstream publishes under oss/v2; the old oss/kubernetes path stopped at v1.34.3.
        images: &[
            (
                34,
                "mcr.microsoft.com/oss/v2/kubernetes/azure-cloud-controller-manager:v1.34.13",
            ),
            (
                35,
                "mcr.microsoft.com/oss/v2/kubernetes/azure-cloud-controller-manager:v1.35.8",
            ),
            (
                36,
                "mcr.microsoft.com/oss/v2/kubernetes/azure-cloud-controller-manager:v1.36.1",
            ),
        ],
        command: Some("cloud-controller-manager"),
        flags: &["--configure-cloud-routes=false"],
        config_store: ConfigStore::Secret,
        config_file: "azure.json",
        keys: &[
            req("tenantId"),
            req("subscriptionId"),
            req("resourceGroup"),
            req("location"),
            req("vnetName"),
            req("subnetName"),
            req("securityGroupName"),
            opt("vnetResourceGroup"),
            opt("routeTableName"),
            opt("vmType"),
            opt("loadBalancerSku"),
            opt("aadClientId"),
            opt("aadClientSecret"),
            opt_bool("useManagedIdentityExtension"),
            opt("userAssignedIdentityID"),
        ],
        // What the CCM needs from the cloud (checked by nobody but the cloud): Either a service
        // principal (aadClientId/aadClientSecret) or a managed identity
        // (useManagedIdentityExtension) with Contributor on the resource group (network and VM read,
        // load balancer and public IP management).
    },
    Provider {
        name: "openstack",
        images: &[
            (
                34,
                "registry.k8s.io/provider-os/openstack-cloud-controller-manager:v1.34.1",
            ),
            (
                35,
                "registry.k8s.io/provider-os/openstack-cloud-controller-manager:v1.35.0",
            ),
            (
                36,
                "registry.k8s.io/provider-os/openstack-cloud-controller-manager:v1.36.0",
            ),
        ],
        command: Some("/bin/openstack-cloud-controller-manager"),
        flags: &[],
        config_store: ConfigStore::Secret,
        config_file: "cloud.conf",
        keys: &[
            req("authURL"),
            req("region"),
            opt("applicationCredentialID"),
            opt("applicationCredentialSecret"),
            opt("username"),
            opt("password"),
            opt("projectID"),
            opt("userDomainName"),
            opt("domainName"),
            opt_bool("tlsInsecure"),
            opt("floatingNetworkID"),
            opt("subnetID"),
        ],
        // What the CCM needs from the cloud (checked by nobody but the cloud): Keystone credentials:
        // an application credential (preferred) or a user with the member role in the project;
        // Octavia for Services of type LoadBalancer.
    },
    Provider {
        name: "vsphere",
        images: &[
            (
                34,
                "registry.k8s.io/cloud-pv-vsphere/cloud-provider-vsphere:v1.34.0",
            ),
            (
                35,
                "registry.k8s.io/cloud-pv-vsphere/cloud-provider-vsphere:v1.35.1",
            ),
            (
                36,
                "registry.k8s.io/cloud-pv-vsphere/cloud-provider-vsphere:v1.36.0",
            ),
        ],
        command: None,
        flags: &[],
        config_store: ConfigStore::Secret,
        config_file: "vsphere.conf",
        keys: &[
            req("server"),
            req("datacenters"),
            req("username"),
            req("password"),
            opt("port"),
            opt_bool("insecureFlag"),
        ],
        // What the CCM needs from the cloud (checked by nobody but the cloud): A vCenter user with
        // read access to the datacenters' VMs (the CPI only reads inventory: System.Read,
        // System.View on the datacenter).
    },
    Provider {
        name: "hcloud",
        // One release serves the three newest minors; releases before v1.30.1 crash since
        // Hetzner dropped `server.datacenter` from its API (July 2026).
        images: &[
            (
                34,
                "docker.io/hetznercloud/hcloud-cloud-controller-manager:v1.34.0",
            ),
            (
                35,
                "docker.io/hetznercloud/hcloud-cloud-controller-manager:v1.34.0",
            ),
            (
                36,
                "docker.io/hetznercloud/hcloud-cloud-controller-manager:v1.34.0",
            ),
        ],
        command: None,
        flags: &[
            "--allow-untagged-cloud",
            "--route-reconciliation-period=30s",
            "--webhook-secure-port=0",
        ],
        config_store: ConfigStore::None,
        config_file: "",
        keys: &[opt("tokenSecretName"), opt("network")],
        // What the CCM needs from the cloud (checked by nobody but the cloud): An API token with
        // read/write scope, in a Secret in kube-system (key `token`) the operator creates; its name
        // is config.tokenSecretName (default `hcloud`). kprov never stores the token in the spec.
    },
];

pub(crate) fn provider(name: &str) -> Option<&'static Provider> {
    PROVIDERS.iter().find(|p| p.name == name)
}

/// The names the table knows, for error messages.
pub(crate) fn provider_names() -> Vec<&'static str> {
    PROVIDERS.iter().map(|p| p.name).collect()
}

/// `1.33.2`, `v1.33` → 33.
pub(crate) fn kubernetes_minor(version: &str) -> Option<u32> {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split('.');
    (parts.next()? == "1").then_some(())?;
    parts.next()?.parse().ok()
}

impl Provider {
    /// The CCM image for the cluster's `kubernetesVersion`; an error when the version does not
    /// parse or no image is pinned for its minor.
    pub fn image_for(&self, version: &str) -> Result<&'static str, AddonError> {
        let minor = kubernetes_minor(version).ok_or_else(|| AddonError::Field {
            field: "spec.kubernetesVersion".into(),
            message: format!("{version:?} is not a Kubernetes version like 1.33.2"),
        })?;
        self.images
            .iter()
            .find(|(m, _)| *m == minor)
            .map(|(_, image)| *image)
            .ok_or_else(|| AddonError::Field {
                field: "spec.kubernetesVersion".into(),
                message: format!(
                    "the {} cloud-controller-manager has no image for Kubernetes 1.{minor} \
                     (known: {}); set spec.cloudControllerManager.image",
                    self.name,
                    self.images
                        .iter()
                        .map(|(m, _)| format!("1.{m}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
    }

    /// Checks the config against this provider's keys; returns the values as strings.
    pub fn check_config(
        &self,
        config: &BTreeMap<String, Value>,
    ) -> Result<BTreeMap<&'static str, String>, AddonError> {
        let field = |k: &str| format!("spec.cloudControllerManager.config.{k}");
        if let Some(unknown) = config
            .keys()
            .find(|k| !self.keys.iter().any(|c| c.name == *k))
        {
            let known: Vec<&str> = self.keys.iter().map(|k| k.name).collect();
            return Err(AddonError::Field {
                field: field(unknown),
                message: if known.is_empty() {
                    format!("the {} provider takes no configuration", self.name)
                } else {
                    format!(
                        "unknown key for {}; known keys: {}",
                        self.name,
                        known.join(", ")
                    )
                },
            });
        }
        let mut out = BTreeMap::new();
        for key in self.keys {
            let value = match (config.get(key.name), key.kind) {
                (None, _) if key.required => {
                    return Err(AddonError::Field {
                        field: field(key.name),
                        message: format!("required by the {} cloud-controller-manager", self.name),
                    });
                }
                (None, _) => continue,
                // A line break would let a value open a new section of the INI file.
                (Some(Value::String(s)), KeyType::String)
                    if !s.trim().is_empty() && !s.contains(['\n', '\r']) =>
                {
                    s.clone()
                }
                (Some(Value::Number(n)), KeyType::String) => n.to_string(),
                (Some(Value::Bool(b)), KeyType::Bool) => b.to_string(),
                (Some(_), KeyType::String) => {
                    return Err(AddonError::Field {
                        field: field(key.name),
                        message: "must be a non-empty string on one line".into(),
                    });
                }
                (Some(_), KeyType::Bool) => {
                    return Err(AddonError::Field {
                        field: field(key.name),
                        message: "must be true or false".into(),
                    });
                }
            };
            out.insert(key.name, value);
        }
        self.check_combinations(&out)?;
        Ok(out)
    }

    fn check_combinations(&self, c: &BTreeMap<&'static str, String>) -> Result<(), AddonError> {
        let missing = |key: &str, message: &str| AddonError::Field {
            field: format!("spec.cloudControllerManager.config.{key}"),
            message: message.to_string(),
        };
        match self.name {
            "openstack" => {
                let app = c.contains_key("applicationCredentialID")
                    || c.contains_key("applicationCredentialSecret");
                if app {
                    for k in ["applicationCredentialID", "applicationCredentialSecret"] {
                        if !c.contains_key(k) {
                            return Err(missing(
                                k,
                                "an application credential needs both its ID and its secret",
                            ));
                        }
                    }
                } else {
                    for k in ["username", "password", "projectID"] {
                        if !c.contains_key(k) {
                            return Err(missing(
                                k,
                                "give applicationCredentialID and applicationCredentialSecret, or username, password and projectID",
                            ));
                        }
                    }
                }
            }
            "azure" => {
                let managed =
                    c.get("useManagedIdentityExtension").map(String::as_str) == Some("true");
                if !managed {
                    for k in ["aadClientId", "aadClientSecret"] {
                        if !c.contains_key(k) {
                            return Err(missing(
                                k,
                                "give a service principal (aadClientId, aadClientSecret) or set useManagedIdentityExtension: true",
                            ));
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The cloud config file's content, or `None` for providers without one.
    pub fn render_config(&self, c: &BTreeMap<&'static str, String>) -> Option<String> {
        let q = |v: &str| format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""));
        let mut out = String::new();
        let mut line = |k: &str, v: String| out.push_str(&format!("{k} = {v}\n"));
        match self.name {
            "gce" => {
                line("[global]", String::new());
                for (key, ini) in [
                    ("projectID", "project-id"),
                    ("networkName", "network-name"),
                    ("subnetworkName", "subnetwork-name"),
                    ("nodeTags", "node-tags"),
                    ("multizone", "multizone"),
                ] {
                    if let Some(v) = c.get(key) {
                        line(ini, v.clone());
                    }
                }
            }
            "openstack" => {
                line("[Global]", String::new());
                for (key, ini) in [
                    ("authURL", "auth-url"),
                    ("region", "region"),
                    ("applicationCredentialID", "application-credential-id"),
                    (
                        "applicationCredentialSecret",
                        "application-credential-secret",
                    ),
                    ("username", "username"),
                    ("password", "password"),
                    ("projectID", "tenant-id"),
                    ("userDomainName", "user-domain-name"),
                    ("domainName", "domain-name"),
                    ("tlsInsecure", "tls-insecure"),
                ] {
                    if let Some(v) = c.get(key) {
                        line(ini, q(v));
                    }
                }
                if c.contains_key("floatingNetworkID") || c.contains_key("subnetID") {
                    line("\n[LoadBalancer]", String::new());
                    for (key, ini) in [
                        ("floatingNetworkID", "floating-network-id"),
                        ("subnetID", "subnet-id"),
                    ] {
                        if let Some(v) = c.get(key) {
                            line(ini, q(v));
                        }
                    }
                }
            }
            "vsphere" => {
                line("[Global]", String::new());
                line("port", q(c.get("port").map_or("443", String::as_str)));
                line(
                    "insecure-flag",
                    q(c.get("insecureFlag").map_or("false", String::as_str)),
                );
                let server = c.get("server").map_or(String::new(), |s| q(s));
                line(&format!("\n[VirtualCenter {server}]"), String::new());
                for (key, ini) in [
                    ("username", "user"),
                    ("password", "password"),
                    ("datacenters", "datacenters"),
                ] {
                    if let Some(v) = c.get(key) {
                        line(ini, q(v));
                    }
                }
            }
            "azure" => {
                let mut json = serde_json::Map::new();
                json.insert("cloud".into(), Value::String("AzurePublicCloud".into()));
                for (k, v) in c {
                    let value = match v.as_str() {
                        "true" => Value::Bool(true),
                        "false" => Value::Bool(false),
                        _ => Value::String(v.clone()),
                    };
                    json.insert((*k).to_string(), value);
                }
                // Written to a Secret: pretty JSON keeps `kubectl get secret` readable.
                return serde_json::to_string_pretty(&Value::Object(json))
                    .ok()
                    .map(|s| s + "\n");
            }
            _ => return None,
        }
        // Section headers were written through the same helper; drop their " = ".
        Some(out.replace("] = \n", "]\n"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::spec::assets::SUPPORTED_KUBERNETES_VERSIONS;
    use proptest::prelude::*;

    /// The minors kprov can install, from the pinned-checksum table.
    fn supported_minors() -> BTreeSet<u32> {
        SUPPORTED_KUBERNETES_VERSIONS
            .iter()
            .map(|v| kubernetes_minor(v).unwrap_or_else(|| panic!("pinned version {v:?}")))
            .collect()
    }

    #[test]
    fn every_provider_has_an_image_per_supported_minor() {
        for p in PROVIDERS {
            for v in SUPPORTED_KUBERNETES_VERSIONS {
                let image = p
                    .image_for(v)
                    .unwrap_or_else(|e| panic!("{} on {v}: {e}", p.name));
                let (_, tag) = image
                    .rsplit_once(':')
                    .unwrap_or_else(|| panic!("{image} has no tag"));
                assert!(tag.starts_with('v') && !tag.contains("latest"), "{image}");
            }
            let e = p.image_for("1.20.0").unwrap_err().to_string();
            assert!(
                e.contains("spec.kubernetesVersion") && e.contains("1.20"),
                "{e}"
            );
        }
    }

    /// An entry for a minor kprov cannot install is dead data that nobody re-checks upstream;
    /// one missing breaks every cluster of that minor. Either way the tables have drifted.
    #[test]
    fn provider_minors_are_exactly_the_supported_minors() {
        let supported = supported_minors();
        for p in PROVIDERS {
            let minors: BTreeSet<u32> = p.images.iter().map(|(m, _)| *m).collect();
            assert_eq!(minors, supported, "{}", p.name);
            assert_eq!(minors.len(), p.images.len(), "{}: duplicate minor", p.name);
        }
    }

    /// A CCM image of another minor would run against an API server it was not built for.
    #[test]
    fn per_minor_images_carry_their_minor() {
        for p in PROVIDERS.iter().filter(|p| p.name != "hcloud") {
            for (minor, image) in p.images {
                // The one deliberate exception, commented in the table: no AWS CCM 1.36.
                if p.name == "aws" && *minor == 36 {
                    assert!(image.ends_with(":v1.35.0"), "{image}");
                    continue;
                }
                let (_, tag) = image.rsplit_once(':').unwrap_or_default();
                // cloud-provider-gcp tags are MINOR.PATCH.CCM_PATCH (v34.2.0 is Kubernetes 1.34).
                let expected = if p.name == "gce" {
                    format!("v{minor}.")
                } else {
                    format!("v1.{minor}.")
                };
                assert!(tag.starts_with(&expected), "{}: {image}", p.name);
            }
        }
    }

    #[test]
    fn config_errors_name_the_key() {
        let os = provider("openstack").unwrap();
        let mut c = BTreeMap::new();
        c.insert(
            "authURL".to_string(),
            Value::String("https://k:5000/v3".into()),
        );
        let e = os.check_config(&c).unwrap_err().to_string();
        assert!(
            e.contains("spec.cloudControllerManager.config.region"),
            "{e}"
        );
        c.insert("region".into(), Value::String("RegionOne".into()));
        c.insert("bogus".into(), Value::Bool(true));
        let e = os.check_config(&c).unwrap_err().to_string();
        assert!(
            e.contains("spec.cloudControllerManager.config.bogus"),
            "{e}"
        );
        c.remove("bogus");
        c.insert("applicationCredentialID".into(), Value::String("id".into()));
        let e = os.check_config(&c).unwrap_err().to_string();
        assert!(e.contains("config.applicationCredentialSecret"), "{e}");
        let aws = provider("aws").unwrap();
        let e = aws.check_config(&c).unwrap_err().to_string();
        assert!(e.contains("takes no configuration"), "{e}");
    }

    proptest! {
        #[test]
        fn minor_parses_any_patch(minor in 0u32..100, patch in 0u32..100, v in any::<bool>()) {
            let s = format!("{}1.{minor}.{patch}", if v { "v" } else { "" });
            prop_assert_eq!(kubernetes_minor(&s), Some(minor));
        }

        #[test]
        fn minor_never_panics(s in ".*") {
            let _ = kubernetes_minor(&s);
        }
    }
}
