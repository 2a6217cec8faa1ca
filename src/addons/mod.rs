//! Cluster add-ons: the cloud-controller-manager of the cluster's provider and the pod
//! network, rendered from versioned templates, previewed with a server-side apply dry run and
//! applied with server-side apply; and `validate cluster`.

pub mod ccm;
pub(crate) mod cni;
pub mod providers;
pub mod validate;

use std::sync::OnceLock;

use serde::Serialize;
use serde_json::Value;
use sha2::Digest;
use tera::Tera;

use crate::kube::{ApplyOptions, Kube, KubeError, Object, ObjectRef, Poll, parse_manifests};
use crate::spec::Cluster;

/// Why the add-ons could not be rendered, diffed or applied.
#[derive(Debug, thiserror::Error)]
pub enum AddonError {
    /// A spec field an add-on needs holds a value it cannot take.
    #[error("{field}: {message}")]
    Field {
        /// The field's path in the spec.
        field: String,
        /// What is wrong with its value.
        message: String,
    },
    /// An add-on template failed to render.
    #[error("rendering add-on template {template}: {message}")]
    Template {
        /// The template's name.
        template: String,
        /// Tera's error.
        message: String,
    },
    /// An API call failed, or a rendered manifest does not parse.
    #[error(transparent)]
    Kube(#[from] KubeError),
}

/// One add-on's manifest, exactly as kprov applies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Manifest {
    /// `cloud-controller-manager`, `calico`, `cilium`, `flannel`.
    pub addon: String,
    /// The template's version (the upstream release it was trimmed from).
    pub(crate) version: String,
    /// The manifest: YAML documents separated by `---`.
    pub yaml: String,
}

impl Manifest {
    /// The manifest parsed into API objects; a document that does not parse is an error naming the
    /// add-on.
    pub fn objects(&self) -> Result<Vec<Object>, AddonError> {
        Ok(parse_manifests(
            &self.yaml,
            &format!("add-on {}", self.addon),
        )?)
    }
}

/// Every add-on the cluster gets, in the order they are applied.
pub fn render_addons(cluster: &Cluster) -> Result<Vec<Manifest>, AddonError> {
    Ok([ccm::render_ccm(cluster)?, cni::render_cni(cluster)?]
        .into_iter()
        .flatten()
        .collect())
}

/// The text `kprov get addons NAME -o yaml` prints: every manifest, one YAML stream.
pub fn manifests_yaml(manifests: &[Manifest]) -> String {
    manifests
        .iter()
        .map(|m| format!("# add-on: {} {}\n{}", m.addon, m.version, m.yaml.trim_end()))
        .collect::<Vec<_>>()
        .join("\n---\n")
        + "\n"
}

/// What applying an object would do, as the preview shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// The object does not exist yet.
    Create,
    /// The object exists and applying changes it.
    Update,
    /// The object exists as it would be applied.
    Unchanged,
}

/// What applying one object changes: the unified diff of live → would-be, noise removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObjectDiff {
    pub(crate) addon: String,
    /// The object, as `Kind namespace/name` (`Kind name` when cluster-scoped).
    pub object: String,
    /// What applying it does.
    pub change: Change,
    /// The unified diff (empty when nothing changes).
    pub diff: String,
}

/// Counts for the one-line summary after a preview or an apply.
pub fn summary(diffs: &[ObjectDiff]) -> String {
    let count = |c: Change| diffs.iter().filter(|d| d.change == c).count();
    format!(
        "{} to create, {} to update, {} unchanged",
        count(Change::Create),
        count(Change::Update),
        count(Change::Unchanged)
    )
}

/// The preview as plain text: what will be created or modified (with the diff of each
/// modification), then the summary. New objects are listed, not dumped: `get addons -o yaml`
/// shows them whole. The CLI's printer may add colour on a terminal.
pub fn preview_text(diffs: &[ObjectDiff]) -> String {
    let mut out = String::new();
    for d in diffs {
        match d.change {
            Change::Create => out.push_str(&format!("Will create {} ({})\n", d.object, d.addon)),
            Change::Update => {
                out.push_str(&format!("Will modify {} ({})\n", d.object, d.addon));
                for line in d.diff.lines() {
                    out.push_str(&format!("    {line}\n"));
                }
            }
            Change::Unchanged => {}
        }
    }
    out.push_str(&summary(diffs));
    out.push('\n');
    out
}

/// Fields the server owns; they differ between any two reads and say nothing about the spec.
const NOISE: &[&str] = &[
    "managedFields",
    "resourceVersion",
    "generation",
    "uid",
    "creationTimestamp",
    "selfLink",
];

fn normalized_yaml(object: &Value) -> String {
    let mut v = object.clone();
    if let Some(map) = v.as_object_mut() {
        map.remove("status");
        // Previews are printed and pasted into reviews: show that a Secret value changed, never
        // the value itself.
        if map.get("kind").and_then(Value::as_str) == Some("Secret") {
            for field in ["data", "stringData"] {
                if let Some(data) = map.get_mut(field).and_then(Value::as_object_mut) {
                    for value in data.values_mut() {
                        // A non-string value is digested as its JSON text, not as "".
                        let text = match value.as_str() {
                            Some(s) => s.to_owned(),
                            None => value.to_string(),
                        };
                        let digest = sha2::Sha256::digest(text.as_bytes());
                        *value = Value::String(format!(
                            "<redacted, sha256 {}>",
                            &hex::encode(digest)[..12]
                        ));
                    }
                }
            }
        }
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for key in NOISE {
                meta.remove(*key);
            }
        }
    }
    serde_saphyr::to_string(&v).unwrap_or_else(|_| v.to_string())
}

async fn diff_object(
    kube: &Kube,
    addon: &str,
    object: &Object,
    force: bool,
) -> Result<ObjectDiff, AddonError> {
    let live = kube.get(&object.reference).await?;
    let would = kube
        .apply(
            object,
            ApplyOptions {
                force,
                dry_run: true,
            },
        )
        .await?;
    let new = normalized_yaml(&would);
    let (change, old) = match &live {
        None => (Change::Create, String::new()),
        Some(live) => {
            let old = normalized_yaml(live);
            (
                if old == new {
                    Change::Unchanged
                } else {
                    Change::Update
                },
                old,
            )
        }
    };
    let diff = if change == Change::Unchanged {
        String::new()
    } else {
        similar::TextDiff::from_lines(&old, &new)
            .unified_diff()
            .context_radius(3)
            .header("live", "kprov")
            .to_string()
    };
    Ok(ObjectDiff {
        addon: addon.to_string(),
        object: object.reference.to_string(),
        change,
        diff,
    })
}

/// Previews the add-ons against the live cluster: a server-side apply dry run per object,
/// compared with the live object. Writes nothing.
pub async fn preview_addons(kube: &Kube, manifests: &[Manifest], force: bool) -> Diffs {
    diff_addons(kube, manifests, force, false).await
}

/// Applies the add-ons with server-side apply. Objects the dry run shows unchanged are not
/// written at all, so re-applying an unchanged add-on is a no-op (and reported as such).
pub async fn apply_addons(kube: &Kube, manifests: &[Manifest], force: bool) -> Diffs {
    diff_addons(kube, manifests, force, true).await
}

type Diffs = Result<Vec<ObjectDiff>, AddonError>;

/// Every object of `manifests` compared with the live one (a server-side apply dry run);
/// with `apply`, each changed object is then applied.
async fn diff_addons(kube: &Kube, manifests: &[Manifest], force: bool, apply: bool) -> Diffs {
    let mut out = Vec::new();
    for m in manifests {
        for object in m.objects()? {
            let diff = diff_object(kube, &m.addon, &object, force).await?;
            if apply && diff.change != Change::Unchanged {
                kube.apply(
                    &object,
                    ApplyOptions {
                        force,
                        dry_run: false,
                    },
                )
                .await?;
            }
            out.push(diff);
        }
    }
    Ok(out)
}

/// The add-on step after provisioning (`update cluster --yes`, `update addons --yes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeployOptions {
    /// `--force-conflicts`.
    pub force: bool,
    /// Wait for the CCM to roll out and initialise every node (each stage gets the timeout).
    pub wait: Option<Poll>,
}

/// Renders and applies every add-on; with `wait`, then waits until the CCM runs and has
/// initialised every node, since nothing else schedules on an uninitialised node.
pub async fn deploy_addons(
    kube: &Kube,
    cluster: &Cluster,
    options: DeployOptions,
) -> Result<Vec<ObjectDiff>, AddonError> {
    let manifests = render_addons(cluster)?;
    let report = apply_addons(kube, &manifests, options.force).await?;
    if let Some(poll) = options.wait
        && ccm::cluster_provider(cluster)?.is_some()
    {
        let ccm: Vec<Manifest> = manifests
            .into_iter()
            .filter(|m| m.addon == ccm::ADDON)
            .collect();
        for workload in workloads(&ccm)? {
            kube.wait_rollout(&workload, poll).await?;
        }
        kube.wait_nodes_initialized(poll).await?;
    }
    Ok(report)
}

/// The workloads (DaemonSets, Deployments) of the manifests, to wait for their rollout.
pub fn workloads(manifests: &[Manifest]) -> Result<Vec<ObjectRef>, AddonError> {
    let mut out = Vec::new();
    for m in manifests {
        out.extend(
            m.objects()?
                .into_iter()
                .map(|o| o.reference)
                .filter(|r| r.kind == "DaemonSet" || r.kind == "Deployment"),
        );
    }
    Ok(out)
}

fn templates() -> Result<&'static Tera, AddonError> {
    static TERA: OnceLock<Result<Tera, String>> = OnceLock::new();
    TERA.get_or_init(|| {
        let mut tera = Tera::default();
        tera.add_raw_templates([
            (
                ccm::TEMPLATE,
                include_str!("../../templates/addons/ccm/ccm-v1.yaml"),
            ),
            (
                cni::CALICO_TEMPLATE,
                include_str!("../../templates/addons/cni/calico-v3.29.yaml"),
            ),
            (
                cni::CILIUM_TEMPLATE,
                include_str!("../../templates/addons/cni/cilium-v1.16.yaml"),
            ),
            (
                cni::FLANNEL_TEMPLATE,
                include_str!("../../templates/addons/cni/flannel-v0.26.yaml"),
            ),
        ])
        .map_err(|e| format!("{e:?}"))?;
        Ok(tera)
    })
    .as_ref()
    .map_err(|message| AddonError::Template {
        template: "templates/addons".into(),
        message: message.clone(),
    })
}

fn render(template: &str, context: &tera::Context) -> Result<String, AddonError> {
    templates()?
        .render(template, context)
        .map_err(|e| AddonError::Template {
            template: template.to_string(),
            // tera's Display hides the cause; the chain names the missing variable.
            message: std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(": "),
        })
}

/// Standard base64, as Secret `data` values are encoded.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), expected);
        }
    }

    /// A Secret's values are shown as digests only, and two different values (strings or
    /// not) never share one: a non-string was once digested as "", hiding its change.
    #[test]
    fn secret_values_are_digests_that_differ_when_the_values_do() {
        let secret = |v: Value| {
            normalized_yaml(&serde_json::json!({
                "kind": "Secret", "metadata": {"name": "s"}, "data": {"k": v}
            }))
        };
        let (a, b, n1, n2) = (
            secret("aHVudGVyMg==".into()),
            secret("b3RoZXI=".into()),
            secret(1.into()),
            secret(2.into()),
        );
        for shown in [&a, &b, &n1, &n2] {
            assert!(shown.contains("<redacted, sha256 "), "{shown}");
            assert!(
                !shown.contains("aHVudGVyMg") && !shown.contains(": 1\n"),
                "{shown}"
            );
        }
        assert_ne!(a, b);
        assert_ne!(n1, n2);
        assert_ne!(n1, secret("".into()));
    }
}
