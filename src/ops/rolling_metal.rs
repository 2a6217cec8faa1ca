//! The machine side of a roll in place: a member re-provisioned over SSH. Every metal node, and
//! AWS control planes (`ops::rolling_aws::AwsRoller` hands them over, targets being the
//! cluster's instances and the renderer's endpoint the API load balancer).
//!
//! Per node, in order: the host is claimed again (a host whose ownership marker names another
//! cluster is refused before anything changes); for a Kubernetes version change kubeadm's
//! upgrade (the new kubeadm from the pinned assets, `kubeadm upgrade apply vX` on the first
//! control plane or `kubeadm upgrade node`, the new kubelet and kubectl, the kubelet
//! restarted); what a member's settle runs (API endpoint line, local proxy); the kubelet's
//! flags and its /var/lib/kubelet/config.yaml (the fields kprov owns set from the spec, the
//! rest as kubeadm wrote it) rewritten, the kubelet restarted when either changed; the node's
//! kube-proxy pod restarted when `spec.kubeProxy` changed (kube-proxy reads its ConfigMap,
//! which `update cluster --yes` rewrote, only when it starts); the labels and taints the spec gives it
//! applied to its Node through the API (the kubelet only sets them when it registers); and the
//! provisioning record rewritten last, so it never claims more than was done.
//!
//! Every step checks before it acts, so the engine may call [`MetalRoller::roll`] again for a
//! node whose previous attempt was cut.
//!
//! Caveat: labels and taints need the cluster's API; under `--cloudonly` (no API) a node
//! whose labels or taints changed fails with that reason instead of being recorded as done.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Map, Value};

use super::rolling::{NodeRoller, Rolled, RollerError};
use crate::inventory::parse_taint;
use crate::kube::{Kube, Taint};
use crate::nodes::Target;
use crate::nodes::journal::JournalNode;
use crate::nodes::model::Facts;
use crate::nodes::owner::Owner;
use crate::nodes::roll::{PROVISIONED_FILE, Provisioned, kube_proxy_changed};
use crate::provision::render::{self, ComponentConfig, KUBELET_CONFIG, Renderer};
use crate::ssh::task::{HostExecutor, Step, StepOutcome};

pub(crate) struct MetalRoller {
    exec: Arc<dyn HostExecutor>,
    renderer: Renderer,
    targets: Vec<Target>,
    owner: Owner,
    /// `None` under `--cloudonly`.
    kube: Option<Kube>,
}

/// Why [`MetalRoller::stage_images`] stopped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Staging {
    /// A host failed (named in the message).
    Failed(String),
    /// Ctrl-C: the uploads and imports in flight were abandoned.
    Interrupted,
}

impl MetalRoller {
    pub(crate) fn new(
        exec: Arc<dyn HostExecutor>,
        renderer: Renderer,
        targets: Vec<Target>,
        owner: Owner,
        kube: Option<Kube>,
    ) -> MetalRoller {
        MetalRoller {
            exec,
            renderer,
            targets,
            owner,
            kube,
        }
    }

    /// Brings the spec's image archives to every host before a version roll: the first
    /// `kubeadm upgrade apply` moves cluster-wide workloads (kube-proxy's DaemonSet) to the new
    /// version's images on every node at once, so a node rolled later would otherwise have no
    /// image for them (nothing to pull from where there is no registry) and the validation gate
    /// between batches would wait for a kube-proxy that cannot start. Hosts already holding
    /// an archive skip it (its marker).
    ///
    /// `cancel` turning true (the roll's first Ctrl-C) abandons the uploads and imports in
    /// flight at once: nothing was rolled yet, and an import cut short leaves no marker, so
    /// the next run brings that archive again.
    pub(crate) async fn stage_images(
        &self,
        mut cancel: tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), Staging> {
        let mut work = Vec::new();
        for t in &self.targets {
            let images = self
                .renderer
                .images(&t.host.roles)
                .map_err(|e| Staging::Failed(format!("{}: {e}", t.name())))?;
            if !images.is_empty() {
                let mut steps = vec![self.renderer.claim(&self.owner)];
                steps.extend(images);
                work.push((t, steps));
            }
        }
        if work.is_empty() {
            return Ok(());
        }
        let runs = work.iter().map(|(t, steps)| async move {
            self.exec
                .run_steps(t.name(), steps)
                .await
                .map_err(|e| format!("{}: image archives before the roll: {e}", t.name()))
        });
        let interrupted = async {
            while !*cancel.borrow_and_update() {
                if cancel.changed().await.is_err() {
                    // No sender left: no interrupt can come.
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            results = futures::future::join_all(runs) => {
                for r in results {
                    r.map_err(Staging::Failed)?;
                }
                Ok(())
            }
            () = interrupted => Err(Staging::Interrupted),
        }
    }

    /// The steps of `node` on `target`, record excluded (it goes last, after the API).
    async fn steps(
        &self,
        node: &JournalNode,
        target: &Target,
        kubelet_config: Option<String>,
    ) -> Result<Vec<Step>, String> {
        let mut steps = vec![self.renderer.claim(&self.owner)];
        // The spec's image archives before kubeadm runs (an upgrade's new images among them).
        steps.extend(
            self.renderer
                .images(&target.host.roles)
                .map_err(|e| e.to_string())?,
        );
        if let Some(how) = node.upgrade {
            let facts = self
                .exec
                .read_file(target.name(), render::FACTS_FILE)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| {
                    format!(
                        "{}: no {} (it was never provisioned by kprov)",
                        target.name(),
                        render::FACTS_FILE
                    )
                })?;
            let facts = Facts::parse(&String::from_utf8_lossy(&facts));
            let arch = facts.arch().ok_or_else(|| {
                format!(
                    "{}: unsupported architecture {:?}",
                    target.name(),
                    facts.machine
                )
            })?;
            steps.extend(
                self.renderer
                    .upgrade(arch, how)
                    .map_err(|e| e.to_string())?,
            );
        }
        steps.extend(self.renderer.settle(target).map_err(|e| e.to_string())?);
        steps.push(
            self.renderer
                .kubelet_flags_and_config(target, kubelet_config)
                .map_err(|e| e.to_string())?,
        );
        Ok(steps)
    }

    /// The node's /var/lib/kubelet/config.yaml as the spec wants it (`None`: no such file, or
    /// a version change, whose `kubeadm upgrade` writes it from the `kubelet-config`
    /// ConfigMap that `update cluster --yes` rewrote). An unreadable file is refused, naming
    /// host and file, before anything changes.
    async fn kubelet_config(
        &self,
        node: &JournalNode,
        target: &Target,
    ) -> Result<Option<String>, String> {
        if node.upgrade.is_some() {
            return Ok(None);
        }
        let Some(bytes) = self
            .exec
            .read_file(target.name(), KUBELET_CONFIG)
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        let origin = format!("{}: {KUBELET_CONFIG}", target.name());
        let text = String::from_utf8(bytes.to_vec())
            .map_err(|_| format!("{origin}: not UTF-8; nothing was changed on it"))?;
        let edited = self
            .renderer
            .node_settings()
            .edit_component_config(ComponentConfig::Kubelet, &origin, &text)
            .map_err(|e| format!("{e}; nothing was changed on it"))?;
        Ok(Some(edited.unwrap_or(text)))
    }

    /// Deletes the node's kube-proxy pod: its DaemonSet starts a new one, which reads the
    /// `kube-proxy` ConfigMap afresh. The node is drained and cordoned here.
    async fn restart_kube_proxy(&self, node: &str) -> Result<(), String> {
        let Some(kube) = &self.kube else {
            return Err(format!(
                "node {node}: spec.kubeProxy changed and restarting its kube-proxy needs the cluster's API, which --cloudonly does not use"
            ));
        };
        let api: Api<Pod> = Api::namespaced(kube.client().clone(), "kube-system");
        let params = ListParams::default()
            .labels("k8s-app=kube-proxy")
            .fields(&format!("spec.nodeName={node}"));
        let pods = api
            .list(&params)
            .await
            .map_err(|e| format!("node {node}: listing its kube-proxy pod: {e}"))?;
        for pod in pods.items {
            let Some(name) = pod.metadata.name else {
                continue;
            };
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    return Err(format!(
                        "node {node}: restarting kube-proxy (deleting pod kube-system/{name}): {e}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Makes the Node carry the spec's labels and taints, removing those a previous
    /// provisioning set that the spec no longer gives (others' labels and taints are kept).
    async fn labels_and_taints(
        &self,
        node: &str,
        old: Option<&Provisioned>,
        new: &Provisioned,
    ) -> Result<(), String> {
        let (old_labels, old_taints) = match old {
            Some(o) => (o.labels.clone(), o.taints.clone()),
            None => Default::default(),
        };
        let mut labels = Map::new();
        for k in old_labels.keys().filter(|k| !new.labels.contains_key(*k)) {
            labels.insert(k.clone(), Value::Null);
        }
        for (k, v) in &new.labels {
            if old_labels.get(k) != Some(v) {
                labels.insert(k.clone(), Value::String(v.clone()));
            }
        }
        let parse = |t: &String| parse_taint(t).map_err(|e| format!("taint {t:?}: {e}"));
        let new_taints = new
            .taints
            .iter()
            .map(parse)
            .collect::<Result<Vec<_>, _>>()?;
        let gone: Vec<String> = old_taints
            .iter()
            .filter(|t| !new.taints.contains(t))
            .map(parse)
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .map(|t| t.key)
            .filter(|k| !new_taints.iter().any(|n| &n.key == k))
            .collect();
        let changed_taints = new.taints.iter().any(|t| !old_taints.contains(t)) || !gone.is_empty();
        if labels.is_empty() && !changed_taints {
            return Ok(());
        }
        let Some(kube) = &self.kube else {
            return Err(format!(
                "node {node}: its labels or taints changed and applying them needs the cluster's API, which --cloudonly does not use"
            ));
        };
        if !labels.is_empty() {
            let api: Api<Node> = Api::all(kube.client().clone());
            let patch = serde_json::json!({ "metadata": { "labels": labels } });
            api.patch(
                node,
                &PatchParams::apply(crate::kube::FIELD_MANAGER),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| format!("labelling node {node}: {e}"))?;
        }
        for key in &gone {
            kube.remove_taint(node, key)
                .await
                .map_err(|e| e.to_string())?;
        }
        for t in new_taints {
            let taint = Taint {
                key: t.key,
                value: t.value,
                effect: t.effect,
            };
            kube.add_taint(node, &taint)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

#[async_trait]
impl NodeRoller for MetalRoller {
    async fn roll(&self, node: &JournalNode) -> Result<Rolled, RollerError> {
        let failed = |e: String| RollerError::failed(&node.node_name, e);
        // Only hosts of this cluster's spec; the claim step below refuses another cluster's.
        let target = self
            .targets
            .iter()
            .find(|t| t.name() == node.target)
            .ok_or_else(|| {
                RollerError::refused(
                    &node.node_name,
                    format!(
                        "{}: not a host of this cluster (its spec, or its instances when the roll started) any more; nothing was changed on it",
                        node.target
                    ),
                )
            })?;
        // The record says which labels and taints a previous provisioning set, so that the
        // roll can remove those the spec dropped: one that does not parse is refused (as the
        // preview refuses it), not taken for "no record", before anything changes on the node.
        let old = match self.exec.read_file(target.name(), PROVISIONED_FILE).await {
            Ok(Some(bytes)) => Some(Provisioned::parse(&bytes).map_err(|e| {
                RollerError::refused(
                    &node.node_name,
                    format!(
                        "{}: cannot read its provisioning record: {e}; nothing was changed on it",
                        target.name()
                    ),
                )
            })?),
            Ok(None) => None,
            Err(e) => return Err(failed(e.to_string())),
        };
        let new = self
            .renderer
            .provisioned(target)
            .map_err(|e| failed(e.to_string()))?;
        let kubelet_config = self.kubelet_config(node, target).await.map_err(failed)?;
        let steps = self
            .steps(node, target, kubelet_config)
            .await
            .map_err(failed)?;
        // The Ready heartbeat is read right before the first step that restarts the kubelet
        // (see `Rolled::ready_before`); the steps before it run first, as one batch.
        let first_restart = steps.iter().position(restarts_kubelet);
        let (outcomes, ready_before) = match (first_restart, &self.kube) {
            (Some(k), Some(kube)) if k > 0 => {
                let mut outcomes = self
                    .exec
                    .run_steps(target.name(), &steps[..k])
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                let before = super::rolling::node_ready_heartbeat(kube, &target.node_name)
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                outcomes.extend(
                    self.exec
                        .run_steps(target.name(), &steps[k..])
                        .await
                        .map_err(|e| failed(e.to_string()))?,
                );
                (outcomes, before)
            }
            _ => (
                self.exec
                    .run_steps(target.name(), &steps)
                    .await
                    .map_err(|e| failed(e.to_string()))?,
                None,
            ),
        };
        let kubelet_restarted = steps
            .iter()
            .zip(&outcomes)
            .any(|(s, o)| restarts_kubelet(s) && matches!(o, StepOutcome::Changed));
        self.labels_and_taints(&target.node_name, old.as_ref(), &new)
            .await
            .map_err(failed)?;
        if kube_proxy_changed(old.as_ref(), &new) {
            self.restart_kube_proxy(&target.node_name)
                .await
                .map_err(failed)?;
        }
        let record = self
            .renderer
            .record(target)
            .map_err(|e| failed(e.to_string()))?;
        self.exec
            .run_steps(target.name(), &[record])
            .await
            .map_err(|e| failed(e.to_string()))?;
        Ok(Rolled {
            replacement: None,
            kubelet_restarted,
            ready_before,
        })
    }
}

/// Whether `step`, when it runs (is not already converged), restarts the kubelet: every
/// kubelet step does (its install, unit, flags, configuration, the restart after an upgrade);
/// no other step of a roll does. The renderer's test below holds them to it.
fn restarts_kubelet(step: &Step) -> bool {
    step.name.starts_with("kubelet: ")
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use bytes::Bytes;

    use super::*;
    use crate::nodes::journal::NodeStep;
    use crate::nodes::roll::{RollAction, Upgrade};
    use crate::provision::orchestrate::tests::{cluster, hosts, owner, resolved, targets};
    use crate::spec::Cluster;
    use crate::ssh::task::fake::{Files, StepByStep, on_host, step_failed};
    use crate::ssh::task::{ExecError, StepOutcome};

    /// Hosts that keep uploaded files, record the steps run, and fail a named step while
    /// `fail` holds it (a cut).
    #[derive(Default)]
    struct Hosts {
        files: Files,
        ran: Mutex<Vec<(String, Step)>>,
        fail: Mutex<Option<String>>,
        /// Every step answers already converged (nothing ran).
        converged: Mutex<bool>,
    }

    impl Hosts {
        /// The facts of an x86_64 machine on each of `ts`, as preflight leaves them.
        fn x86_64(&self, ts: &[Target]) {
            for t in ts {
                self.files
                    .put(t.name(), render::FACTS_FILE, "machine=x86_64\n");
            }
        }

        fn names(&self, host: &str) -> Vec<String> {
            on_host(&self.ran, host, |s| s.name.clone())
        }

        /// Whether `host` ran the step that writes its provisioning record.
        fn recorded(&self, host: &str) -> bool {
            self.names(host)
                .iter()
                .any(|n| n == "kprov: provisioning record")
        }
    }

    #[async_trait]
    impl StepByStep for Hosts {
        async fn step(&self, host: &str, s: &Step) -> Result<StepOutcome, ExecError> {
            if self.fail.lock().unwrap().as_deref() == Some(s.name.as_str()) {
                return Err(step_failed(host, s, "cut"));
            }
            self.ran.lock().unwrap().push((host.into(), s.clone()));
            for f in &s.files {
                self.files.put(host, &f.path, f.content.clone());
            }
            Ok(if *self.converged.lock().unwrap() {
                StepOutcome::Unchanged
            } else {
                StepOutcome::Changed
            })
        }

        async fn read(&self, host: &str, path: &str) -> Result<Option<Bytes>, ExecError> {
            Ok(self.files.get(host, path))
        }
    }

    fn journal_node(target: &str, upgrade: Option<Upgrade>) -> JournalNode {
        JournalNode {
            target: target.into(),
            node_name: target.into(),
            group: "g".into(),
            action: RollAction::Reprovision,
            upgrade,
            batch: 0,
            step: NodeStep::Drained,
            replacement: None,
            stopped: None,
        }
    }

    /// The roller over the test hosts (the third one labelled `tier: web` when `labels`), and
    /// the fake hosts its steps run on.
    fn roller(labels: bool) -> (MetalRoller, Arc<Hosts>) {
        let exec = Arc::new(Hosts::default());
        let mut hs = hosts(2, 1);
        if labels {
            hs[2].labels.insert("tier".into(), "web".into());
        }
        let ts = targets(&hs);
        exec.x86_64(&ts);
        (roller_of(exec.clone(), &cluster(""), ts), exec)
    }

    /// The roller of `c` over `ts`, its steps run by `exec`.
    fn roller_of(exec: Arc<dyn HostExecutor>, c: &Cluster, ts: Vec<Target>) -> MetalRoller {
        let renderer = Renderer::new(&resolved(c), &ts).unwrap();
        MetalRoller::new(exec, renderer, ts, owner(), None)
    }

    /// The test cluster with one image archive in its spec.
    fn with_an_image_archive() -> Cluster {
        cluster(&format!(
            "  assets:\n    images:\n    - url: https://m.example/kube-v1.35.1.tar\n      sha256: {}\n",
            "ab".repeat(32)
        ))
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn an_upgrade_runs_kubeadm_first_then_the_kubelet_and_the_record_last() {
        let (r, exec) = roller(false);
        rt().block_on(async {
            r.roll(&journal_node("cp1", Some(Upgrade::Apply)))
                .await
                .unwrap();
            r.roll(&journal_node("cp2", Some(Upgrade::Node)))
                .await
                .unwrap();
            r.roll(&journal_node("w1", Some(Upgrade::Node)))
                .await
                .unwrap();
        });
        let cp1 = exec.names("cp1");
        let pos = |names: &[String], prefix: &str| {
            names
                .iter()
                .position(|n| n.starts_with(prefix))
                .unwrap_or_else(|| panic!("{prefix}: {names:?}"))
        };
        assert_eq!(cp1[0], "ownership: claim");
        assert!(pos(&cp1, "kubeadm: install") < pos(&cp1, "kubeadm: upgrade apply v1.35.1"));
        assert!(pos(&cp1, "kubeadm: upgrade apply") < pos(&cp1, "kubelet: install"));
        assert!(pos(&cp1, "kubelet: install") < pos(&cp1, "kubelet: restart on v1.35.1"));
        assert_eq!(cp1.last().unwrap(), "kprov: provisioning record");
        assert!(!cp1.iter().any(|n| n.starts_with("kubeadm: upgrade node")));
        for h in ["cp2", "w1"] {
            let names = exec.names(h);
            assert!(pos(&names, "kubeadm: upgrade node") < pos(&names, "kubelet: install"));
            assert!(
                !names
                    .iter()
                    .any(|n| n.starts_with("kubeadm: upgrade apply"))
            );
            assert_eq!(names.last().unwrap(), "kprov: provisioning record");
        }
        let ran = exec.ran.lock().unwrap();
        let script = |host: &str, prefix: &str| {
            ran.iter()
                .find(|(h, s)| h == host && s.name.starts_with(prefix))
                .map(|(_, s)| s.run.clone())
                .unwrap()
        };
        // The health-check Job of `upgrade apply` cannot run on a drained control plane
        // (real kubeadm, real hosts); `upgrade node` has no such check.
        let apply = script("cp1", "kubeadm: upgrade apply");
        assert!(
            apply.contains("kubeadm upgrade apply 'v1.35.1' --yes")
                && apply.contains("--ignore-preflight-errors=CreateJob"),
            "{apply}"
        );
        assert!(script("w1", "kubeadm: upgrade node").contains("kubeadm upgrade node\n"));
        assert!(script("w1", "kubelet: restart").contains("systemctl restart kubelet"));
    }

    /// The roll says whether it restarted the kubelet (the engine then waits for a Ready the
    /// new kubelet posted): every step whose script restarts it is one `restarts_kubelet`
    /// names, and no other; a node whose steps were all converged was not restarted.
    #[test]
    fn the_roll_says_whether_it_restarted_the_kubelet() {
        let (r, exec) = roller(false);
        let upgraded = rt()
            .block_on(r.roll(&journal_node("w1", Some(Upgrade::Node))))
            .unwrap();
        assert!(upgraded.kubelet_restarted && upgraded.replacement.is_none());
        let relabelled = rt().block_on(r.roll(&journal_node("cp1", None))).unwrap();
        assert!(relabelled.kubelet_restarted);
        let ran = exec.ran.lock().unwrap().clone();
        let mut restarting = 0;
        for (h, s) in &ran {
            let restarts = s.run.contains("restart kubelet") || s.run.contains("restart 'kubelet'");
            restarting += usize::from(restarts);
            assert_eq!(restarts_kubelet(s), restarts, "{h}: {}:\n{}", s.name, s.run);
        }
        assert!(restarting >= 3, "{ran:?}");
        *exec.converged.lock().unwrap() = true;
        let again = rt().block_on(r.roll(&journal_node("cp1", None))).unwrap();
        assert!(
            !again.kubelet_restarted,
            "nothing ran, yet a restart is claimed"
        );
    }

    /// Image archives of the spec reach a rolled node right after the claim: before
    /// `kubeadm upgrade` (which wants the new version's images) and on a re-provision without
    /// an upgrade too.
    #[test]
    fn image_archives_come_before_kubeadm_upgrade() {
        let exec = Arc::new(Hosts::default());
        let ts = targets(&hosts(1, 1));
        exec.x86_64(&ts);
        let r = roller_of(exec.clone(), &with_an_image_archive(), ts);
        rt().block_on(async {
            r.roll(&journal_node("cp1", Some(Upgrade::Apply)))
                .await
                .unwrap();
            r.roll(&journal_node("w1", None)).await.unwrap();
        });
        let cp1 = exec.names("cp1");
        assert_eq!(
            cp1[..3],
            [
                "ownership: claim",
                "images: import kube-v1.35.1.tar",
                "kubeadm: install 1.35.1"
            ]
        );
        let w1 = exec.names("w1");
        assert_eq!(
            w1[..2],
            ["ownership: claim", "images: import kube-v1.35.1.tar"]
        );
    }

    /// Hosts whose steps never finish (an import on a slow host), counting the runs started.
    #[derive(Default)]
    struct Stuck {
        started: std::sync::atomic::AtomicUsize,
    }

    #[async_trait]
    impl HostExecutor for Stuck {
        async fn run_steps(&self, _: &str, _: &[Step]) -> Result<Vec<StepOutcome>, ExecError> {
            self.started
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::pending().await
        }

        async fn read_file(&self, _: &str, _: &str) -> Result<Option<Bytes>, ExecError> {
            Ok(None)
        }
    }

    /// Ctrl-C while the image archives are staged before a version roll ends the wait at once
    /// (the rest of the roll stops at its safe points; here nothing was rolled yet), while
    /// every host's staging is in flight; with no Ctrl-C the wait goes on.
    #[test]
    fn ctrl_c_while_staging_images_ends_the_wait_at_once() {
        let exec = Arc::new(Stuck::default());
        let r = roller_of(
            exec.clone(),
            &with_an_image_archive(),
            targets(&hosts(1, 2)),
        );
        rt().block_on(async {
            let (tx, rx) = tokio::sync::watch::channel(false);
            // Not interrupted: still waiting after a while.
            let waited = tokio::time::timeout(
                std::time::Duration::from_millis(300),
                r.stage_images(rx.clone()),
            )
            .await;
            assert!(waited.is_err(), "{waited:?}");
            let t = std::time::Instant::now();
            let staged = tokio::join!(r.stage_images(rx), async {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                tx.send(true).unwrap();
            })
            .0;
            assert_eq!(staged, Err(Staging::Interrupted));
            assert!(
                t.elapsed() < std::time::Duration::from_secs(1),
                "{:?}",
                t.elapsed()
            );
        });
        // Both runs had started on all three hosts before the interrupt.
        assert_eq!(exec.started.load(std::sync::atomic::Ordering::SeqCst), 6);
    }

    #[test]
    fn a_configuration_change_touches_no_binary_and_rewrites_the_kubelet_flags() {
        let (r, exec) = roller(false);
        rt().block_on(r.roll(&journal_node("w1", None))).unwrap();
        let names = exec.names("w1");
        assert!(
            !names
                .iter()
                .any(|n| n.contains("install") || n.contains("upgrade")),
            "{names:?}"
        );
        assert!(names.contains(&"kubelet: flags".to_string()), "{names:?}");
        assert_eq!(names.last().unwrap(), "kprov: provisioning record");
        let flags = exec.files.get("w1", render::KUBELET_FLAGS).unwrap();
        let flags = String::from_utf8_lossy(&flags);
        assert!(
            flags.starts_with("KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint="),
            "{flags}"
        );
        assert!(flags.contains("--node-ip=198.18.0.13"), "{flags}");
    }

    /// A node carrying kubeadm's /var/lib/kubelet/config.yaml: the roll writes it back with
    /// the spec's fields (here the kubelet's defaults again: the lab's evictionHard and
    /// failCgroupV1 gone) in the step that restarts the kubelet, all else kept; one that does
    /// not parse is refused naming host and file before any step ran; a version change
    /// leaves it to `kubeadm upgrade`.
    #[test]
    fn the_kubelet_configuration_is_rewritten_with_the_flags() {
        let (r, exec) = roller(false);
        let key = ("w1".to_string(), render::KUBELET_CONFIG.to_string());
        let kubeadm = include_str!("../provision/testdata/kubelet-config.yaml");
        exec.files
            .lock()
            .unwrap()
            .insert(key.clone(), Bytes::from_static(kubeadm.as_bytes()));
        rt().block_on(r.roll(&journal_node("w1", None))).unwrap();
        let step = exec
            .ran
            .lock()
            .unwrap()
            .iter()
            .find(|(h, s)| h == "w1" && s.name == "kubelet: flags and configuration")
            .map(|(_, s)| s.clone())
            .expect("the kubelet step");
        assert!(
            step.run.contains("systemctl restart kubelet")
                && step
                    .check
                    .as_deref()
                    .unwrap_or_default()
                    .contains(render::KUBELET_CONFIG),
            "{step:?}"
        );
        let written = exec.files.lock().unwrap().get(&key).cloned().unwrap();
        let written = String::from_utf8_lossy(&written);
        assert!(!written.contains("evictionHard") && !written.contains("failCgroupV1"));
        assert!(
            written.contains("clientCAFile: /etc/kubernetes/pki/ca.crt"),
            "{written}"
        );

        // A host whose config.yaml is not YAML.
        let broken = || {
            let (r, exec) = roller(false);
            exec.files
                .lock()
                .unwrap()
                .insert(key.clone(), Bytes::from_static(b"kind: [broken"));
            (r, exec)
        };
        let (r, exec) = broken();
        let e = rt()
            .block_on(r.roll(&journal_node("w1", None)))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("w1: /var/lib/kubelet/config.yaml: not YAML")
                && e.ends_with("nothing was changed on it"),
            "{e}"
        );
        assert!(exec.ran.lock().unwrap().is_empty());

        let (r, exec) = broken();
        rt().block_on(r.roll(&journal_node("w1", Some(Upgrade::Node))))
            .unwrap();
        assert!(exec.names("w1").contains(&"kubelet: flags".to_string()));
    }

    #[test]
    fn a_cut_leaves_no_record_and_the_next_call_finishes() {
        let (r, exec) = roller(false);
        *exec.fail.lock().unwrap() = Some("kubeadm: upgrade node v1.35.1".into());
        let e = rt()
            .block_on(r.roll(&journal_node("w1", Some(Upgrade::Node))))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cut"), "{e}");
        assert!(!exec.recorded("w1"));
        *exec.fail.lock().unwrap() = None;
        rt().block_on(r.roll(&journal_node("w1", Some(Upgrade::Node))))
            .unwrap();
        assert_eq!(
            exec.names("w1").last().unwrap(),
            "kprov: provisioning record"
        );
    }

    #[test]
    fn a_host_outside_the_spec_is_refused_untouched() {
        let (r, exec) = roller(false);
        let e = rt()
            .block_on(r.roll(&journal_node("stranger", None)))
            .unwrap_err();
        assert!(matches!(e, RollerError::Refused { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("not a host of this cluster"), "{e}");
        assert!(exec.ran.lock().unwrap().is_empty());
    }

    #[test]
    fn an_unparsable_record_is_refused_naming_host_file_and_error_before_any_change() {
        let (r, exec) = roller(false);
        let key = ("w1".to_string(), PROVISIONED_FILE.to_string());
        let garbage = Bytes::from_static(b"{\"labels\": [not json");
        exec.files
            .lock()
            .unwrap()
            .insert(key.clone(), garbage.clone());
        let e = rt()
            .block_on(r.roll(&journal_node("w1", None)))
            .unwrap_err();
        assert!(
            matches!(&e, RollerError::Refused { node, .. } if node == "w1"),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(e.starts_with("w1: "), "{e}");
        assert!(e.contains(PROVISIONED_FILE), "{e}");
        // serde_json's own words, with the position.
        assert!(
            e.contains("invalid type: sequence, expected a map at line 1 column 11"),
            "{e}"
        );
        assert!(e.contains("nothing was changed on it"), "{e}");
        assert!(exec.names("w1").is_empty(), "{:?}", exec.names("w1"));
        assert_eq!(exec.files.lock().unwrap().get(&key), Some(&garbage));
    }

    #[test]
    fn a_label_change_without_the_api_fails_before_the_record() {
        let (r, exec) = roller(true);
        let e = rt()
            .block_on(r.roll(&journal_node("w1", None)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--cloudonly"), "{e}");
        assert!(!exec.recorded("w1"));
    }
}
