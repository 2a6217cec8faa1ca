//! kprov's layer over kube-rs: one client built from a kubeconfig, server-side apply of
//! manifests under the field manager `kprov`, rollouts, nodes, cordon, eviction and drains.
//!
//! The API is reached at the kubeconfig's server as written; reaching a private endpoint
//! through an SSH tunnel is a separate wiring step (the caller rewrites the server URL).

mod drain;
mod manifest;
mod nodes;

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::Value;

pub use drain::{
    Disposition, DrainError, DrainEvent, DrainOptions, DrainReport, SkipReason, StuckPod,
};
pub(crate) use manifest::api_resource;
pub use manifest::{Object, ObjectRef, parse_manifests};
pub(crate) use nodes::UNINITIALIZED_TAINT;
pub use nodes::{EvictOptions, NodeInfo, Taint};

/// The field manager every kprov write uses, so ownership is visible in managedFields.
pub(crate) const FIELD_MANAGER: &str = "kprov";

/// Page size for list calls: large clusters are read in pages with `continue`, never at once.
pub(crate) const PAGE_SIZE: u32 = 250;

/// A failed Kubernetes API call or kubeconfig read; each names the object or file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The kubeconfig file.
        path: String,
        /// Why it could not be used (unreadable, no such context, bad credentials).
        message: String,
    },
    /// A manifest does not parse into API objects.
    #[error("manifest {source_name}: {message}")]
    Manifest {
        /// What the manifest came from (e.g. `add-on calico`).
        source_name: String,
        /// The parse error.
        message: String,
    },
    /// Server-side apply refused: fields another manager owns would change (no
    /// `--force-conflicts`).
    #[error("{}", conflict_message(.object, .conflicts))]
    Conflict {
        /// The object applied.
        object: ObjectRef,
        /// Each field and the manager that owns it.
        conflicts: Vec<FieldConflict>,
    },
    /// The API server answered with an error status.
    #[error("{action} {object}: the API server answered {code} {reason}: {message}")]
    Api {
        /// What kprov was doing (`applying`, `cordoning`, ...).
        action: &'static str,
        /// The object it concerned.
        object: String,
        /// The HTTP status code.
        code: u16,
        /// The status's reason (`NotFound`, `Forbidden`, ...).
        reason: String,
        /// The API server's message.
        message: String,
    },
    /// The API server could not be reached or did not answer.
    #[error(
        "{action} {object}: the API server at {} did not answer: {}",
        crate::output::escape(.server),
        innermost_causes(.cause)
    )]
    Transport {
        /// What kprov was doing.
        action: &'static str,
        /// The object it concerned.
        object: String,
        /// Where the request went (the kubeconfig's server, or the tunnel's near end).
        server: String,
        // Boxed: the error stays small enough to return by value everywhere. Not the error's
        // `source`: the message already says the causes a user can act on, and a chain
        // printed with `{:#}` would end in kube-rs's "ServiceError: client error (Connect)".
        /// The client's error.
        cause: Box<kube::Error>,
    },
    /// An eviction was still refused by a PodDisruptionBudget when its deadline passed.
    #[error(
        "evicting pod {namespace}/{pod}: still blocked by a PodDisruptionBudget after {}s ({message}); \
         the disruption budget must allow one more pod to go before the node can be drained",
        .waited.as_secs()
    )]
    EvictionBlocked {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
        /// How long evictions were retried.
        waited: Duration,
        /// The API server's last refusal.
        message: String,
    },
    /// A Deployment or DaemonSet did not finish rolling out in time.
    #[error("timed out after {}s waiting for the rollout of {object}: {state}", .waited.as_secs())]
    RolloutTimeout {
        /// The workload waited for.
        object: String,
        /// How long it was waited for.
        waited: Duration,
        /// Its last observed rollout state.
        state: String,
    },
    /// Nodes still carry the uninitialised taint: the cloud-controller-manager did not initialise
    /// them in time.
    #[error(
        "timed out after {}s waiting for the cloud-controller-manager to initialise {} node(s): {}",
        .waited.as_secs(), .waiting.len(), .waiting.join("; ")
    )]
    NodesNotInitialized {
        /// How long it was waited for.
        waited: Duration,
        /// The nodes still carrying the uninitialised taint, each with why.
        waiting: Vec<String>,
    },
}

/// One field another manager owns and kprov's apply would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldConflict {
    /// The field manager that owns the field.
    pub manager: String,
    /// The field's path in the object.
    pub field: String,
}

fn conflict_message(object: &ObjectRef, conflicts: &[FieldConflict]) -> String {
    let fields: Vec<String> = conflicts
        .iter()
        .map(|c| format!("{} (owned by field manager \"{}\")", c.field, c.manager))
        .collect();
    format!(
        "applying {object} as field manager \"{FIELD_MANAGER}\": conflict on {}; someone changed \
         these fields outside kprov. Re-run with --force-conflicts to take them over, or remove \
         the change from the cluster",
        fields.join(", ")
    )
}

/// Server-side apply switches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyOptions {
    /// Take over fields other managers own (`--force-conflicts`).
    pub force: bool,
    /// `dryRun=All`: the server computes the result and persists nothing.
    pub dry_run: bool,
}

/// How long and how often to poll while waiting for the cluster to converge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Poll {
    /// Give up after this long.
    pub timeout: Duration,
    /// Time between two polls.
    pub interval: Duration,
}

/// A client for one cluster's API server (directly or through an SSH tunnel); cheap to clone.
#[derive(Clone)]
pub struct Kube {
    client: Client,
    /// Where requests go, for errors that never reached the API server: the kubeconfig's
    /// server, and the tunnel's near end when there is one.
    server: String,
}

impl Kube {
    /// Builds a client from a kubeconfig file and an optional context (default: current).
    pub async fn from_kubeconfig(path: &Path, context: Option<&str>) -> Result<Self, KubeError> {
        Self::build(path, context, None).await
    }

    /// Like [`Kube::from_kubeconfig`], but requests go to `local` (e.g. `https://127.0.0.1:16443`,
    /// the near end of an SSH tunnel to a control-plane host) while the server certificate is
    /// still checked against the kubeconfig's host name, which is what the certificate names.
    pub async fn from_kubeconfig_through(
        path: &Path,
        context: Option<&str>,
        local: &str,
    ) -> Result<Self, KubeError> {
        Self::build(path, context, Some(local)).await
    }

    async fn build(
        path: &Path,
        context: Option<&str>,
        local: Option<&str>,
    ) -> Result<Self, KubeError> {
        // kube-rs and the AWS SDK both link rustls; with two crypto providers present rustls
        // refuses to pick one, so install ours before the first connection.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let err = |message: String| KubeError::Kubeconfig {
            path: path.display().to_string(),
            message,
        };
        let text = crate::bounded::read_file_to_string(path, crate::bounded::KUBECONFIG)
            .map_err(|e| err(e.to_string()))?;
        let kubeconfig = Kubeconfig::from_yaml(&text).map_err(|e| err(e.to_string()))?;
        let options = KubeConfigOptions {
            context: context.map(str::to_string),
            ..KubeConfigOptions::default()
        };
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|e| err(e.to_string()))?;
        // kube-rs would retry 429s itself with back-off of up to 1000 s, hiding a blocked
        // eviction from kprov's own deadline and its message; kprov retries where it means to.
        config.default_retry = false;
        // A CLI must not hang on an API server that stopped answering.
        config.connect_timeout = Some(Duration::from_secs(10));
        config.read_timeout = Some(Duration::from_secs(60));
        config.reset_reader_on_write = true;
        if let Some(local) = local {
            // A bare `host:port` (what a port forward hands out) keeps the kubeconfig's
            // scheme; kube-rs panics on a URL without one.
            let text = if local.contains("://") {
                local.to_string()
            } else {
                let scheme = config.cluster_url.scheme_str().unwrap_or("https");
                format!("{scheme}://{local}")
            };
            let url: http::Uri = text
                .parse()
                .map_err(|e| err(format!("tunnel address {local:?}: {e}")))?;
            if url.scheme().is_none() || url.authority().is_none() {
                return Err(err(format!(
                    "tunnel address {local:?} is not host:port or a URL"
                )));
            }
            if config.tls_server_name.is_none() {
                config.tls_server_name = config.cluster_url.host().map(str::to_string);
            }
            config.cluster_url = url;
        }
        let server = match local {
            Some(_) => format!(
                "{} (through {})",
                config
                    .tls_server_name
                    .as_deref()
                    .unwrap_or("the kubeconfig's server"),
                config.cluster_url
            ),
            None => config.cluster_url.to_string(),
        };
        let client = Client::try_from(config).map_err(|e| err(e.to_string()))?;
        Ok(Self { client, server })
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    fn dynamic_api(&self, r: &ObjectRef) -> Result<Api<DynamicObject>, KubeError> {
        let (resource, _) =
            api_resource(&r.api_version, &r.kind).ok_or_else(|| KubeError::Manifest {
                source_name: r.to_string(),
                message: format!(
                    "kind {} ({}) is not one kprov applies",
                    r.kind, r.api_version
                ),
            })?;
        Ok(match &r.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        })
    }

    /// Server-side apply of one object as field manager `kprov`; returns the object the server
    /// stored (or, with `dry_run`, would store).
    pub(crate) async fn apply(
        &self,
        object: &Object,
        options: ApplyOptions,
    ) -> Result<Value, KubeError> {
        let api = self.dynamic_api(&object.reference)?;
        let mut params = PatchParams::apply(FIELD_MANAGER);
        params.force = options.force;
        params.dry_run = options.dry_run;
        let applied = api
            .patch(&object.reference.name, &params, &Patch::Apply(&object.body))
            .await
            .map_err(|e| apply_error(&self.server, &object.reference, e))?;
        serde_json::to_value(applied).map_err(|e| KubeError::Api {
            action: "applying",
            object: object.reference.to_string(),
            code: 0,
            reason: "unreadable answer".into(),
            message: e.to_string(),
        })
    }

    /// Applies a whole manifest in order (namespaces and CRDs come first in kprov's templates).
    pub async fn apply_all(
        &self,
        objects: &[Object],
        options: ApplyOptions,
    ) -> Result<Vec<Value>, KubeError> {
        let mut out = Vec::with_capacity(objects.len());
        for object in objects {
            out.push(self.apply(object, options).await?);
        }
        Ok(out)
    }

    /// The live object, or `None` when it does not exist.
    pub async fn get(&self, r: &ObjectRef) -> Result<Option<Value>, KubeError> {
        let api = self.dynamic_api(r)?;
        let live = api
            .get_opt(&r.name)
            .await
            .map_err(|e| api_error(&self.server, "reading", &r.to_string(), e))?;
        live.map(serde_json::to_value)
            .transpose()
            .map_err(|e| KubeError::Api {
                action: "reading",
                object: r.to_string(),
                code: 0,
                reason: "unreadable answer".into(),
                message: e.to_string(),
            })
    }

    /// The typed object `r` names, in `ns`.
    async fn read_namespaced<K>(&self, ns: &str, r: &ObjectRef) -> Result<K, KubeError>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        Api::<K>::namespaced(self.client.clone(), ns)
            .get(&r.name)
            .await
            .map_err(|e| api_error(&self.server, "reading", &r.to_string(), e))
    }

    /// Waits until a DaemonSet or Deployment has rolled out its current generation everywhere.
    pub async fn wait_rollout(&self, r: &ObjectRef, poll: Poll) -> Result<(), KubeError> {
        let ns = r.namespace.as_deref().unwrap_or("default");
        let start = tokio::time::Instant::now();
        loop {
            let state = match r.kind.as_str() {
                "DaemonSet" => daemonset_progress(&self.read_namespaced(ns, r).await?),
                "Deployment" => deployment_progress(&self.read_namespaced(ns, r).await?),
                // Other kinds have no rollout: applied is done.
                _ => return Ok(()),
            };
            match state {
                None => return Ok(()),
                Some(state) if start.elapsed() >= poll.timeout => {
                    return Err(KubeError::RolloutTimeout {
                        object: r.to_string(),
                        waited: start.elapsed(),
                        state,
                    });
                }
                Some(_) => tokio::time::sleep(poll.interval).await,
            }
        }
    }

    /// Lists every object of a typed resource, page by page.
    pub(crate) async fn list_all<K>(
        &self,
        api: &Api<K>,
        params: &ListParams,
    ) -> Result<Vec<K>, KubeError>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let mut out = Vec::new();
        let mut params = params.clone().limit(PAGE_SIZE);
        loop {
            let page = api
                .list(&params)
                .await
                .map_err(|e| api_error(&self.server, "listing", &K::plural(&()), e))?;
            out.extend(page.items);
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(out),
            }
        }
    }
}

/// `None` when rolled out, otherwise what is still missing.
fn daemonset_progress(ds: &DaemonSet) -> Option<String> {
    let status = ds.status.clone().unwrap_or_default(); // no status yet: nothing observed, still rolling out
    Rollout {
        generation: ds.metadata.generation.unwrap_or(0),
        observed: status.observed_generation.unwrap_or(0),
        desired: status.desired_number_scheduled,
        updated: status.updated_number_scheduled.unwrap_or(0),
        available: status.number_available.unwrap_or(0),
    }
    .missing("pods")
}

fn deployment_progress(d: &Deployment) -> Option<String> {
    let status = d.status.clone().unwrap_or_default(); // no status yet: nothing observed, still rolling out
    Rollout {
        generation: d.metadata.generation.unwrap_or(0),
        observed: status.observed_generation.unwrap_or(0),
        desired: d.spec.replicas.unwrap_or(1),
        updated: status.updated_replicas.unwrap_or(0),
        available: status.available_replicas.unwrap_or(0),
    }
    .missing("replicas")
}

/// A DaemonSet's or Deployment's rollout as its status counts it.
#[derive(Clone, Copy)]
struct Rollout {
    generation: i64,
    observed: i64,
    desired: i32,
    updated: i32,
    available: i32,
}

impl Rollout {
    /// `None` when the current generation is observed and every one of the `desired` (pods or
    /// replicas) is updated and available; otherwise what is still missing.
    fn missing(&self, unit: &str) -> Option<String> {
        let Rollout {
            generation,
            observed,
            desired,
            updated,
            available,
        } = *self;
        if observed >= generation && updated >= desired && available >= desired {
            None
        } else {
            Some(format!(
                "{updated} of {desired} {unit} updated, {available} available (generation {observed}/{generation} observed)"
            ))
        }
    }
}

fn apply_error(server: &str, r: &ObjectRef, e: kube::Error) -> KubeError {
    if let kube::Error::Api(status) = &e
        && status.code == 409
    {
        let conflicts: Vec<FieldConflict> = status
            .details
            .iter()
            .flat_map(|d| d.causes.iter())
            .filter(|c| c.reason == "FieldManagerConflict")
            .map(|c| FieldConflict {
                manager: c.message.split('"').nth(1).unwrap_or("unknown").to_string(),
                field: c.field.clone(),
            })
            .collect();
        if !conflicts.is_empty() {
            return KubeError::Conflict {
                object: r.clone(),
                conflicts,
            };
        }
    }
    api_error(server, "applying", &r.to_string(), e)
}

/// The last two distinct messages of an error's chain: the cause a user can act on (`tcp
/// connect error: Connection refused (os error 111)`), not the wrapper's `client error
/// (Connect)`.
fn innermost_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut chain: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        let m = c.to_string();
        if chain.last() != Some(&m) {
            chain.push(m);
        }
        cur = c.source();
    }
    let start = chain.len().saturating_sub(2);
    chain[start..].join(": ")
}

fn api_error(server: &str, action: &'static str, object: &str, e: kube::Error) -> KubeError {
    match e {
        kube::Error::Api(status) => KubeError::Api {
            action,
            object: object.to_string(),
            code: status.code,
            reason: status.reason.clone(),
            message: status.message.clone(),
        },
        other => KubeError::Transport {
            action,
            object: object.to_string(),
            server: server.to_string(),
            cause: Box::new(other),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;

    /// An API server that cannot be reached is named by its URL with the cause a user can act
    /// on, not kube-rs's wrapper ("client error (Connect)").
    #[tokio::test]
    async fn an_unreachable_api_names_its_url_and_the_cause() {
        // A loopback port this test owned and closed: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \
                 http://127.0.0.1:{port}\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n\
                 - name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
            ),
        )
        .unwrap();
        let kube = Kube::from_kubeconfig(&path, None).await.unwrap();
        let api: Api<Node> = Api::all(kube.client.clone());
        let e = kube
            .list_all(&api, &ListParams::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "listing nodes: the API server at http://127.0.0.1:{port}/ did not answer: "
            )),
            "{e}"
        );
        assert!(e.contains("onnection refused"), "{e}");
        assert!(!e.contains("client error"), "{e}");
        // Nor at the end of the chain an error is printed with (`{:#}`).
        let chained = format!(
            "{:#}",
            anyhow::Error::new(
                kube.list_all(&api, &ListParams::default())
                    .await
                    .unwrap_err()
            )
        );
        assert!(!chained.contains("client error"), "{chained}");
    }
}
