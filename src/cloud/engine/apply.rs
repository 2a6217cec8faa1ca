//! Executes a `Plan`: dependency order, bounded parallelism, retries with back-off, a deadline
//! per resource.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;

use super::model::{CloudId, IdMap, ResourceId};
use super::plan::{Action, Plan};
use super::{CloudError, ErrorClass};
use crate::cloud::Provider;

/// How [`apply`] works through a plan: how many resources at once, how long each may take, how
/// it backs off, whether it deletes, and its progress hooks (`Default`: 8 at once, 600 s a
/// resource, 60 s of propagation, back-off from 0.5 s to 20 s, no prune, no hooks).
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// Resources worked on at once.
    pub parallelism: usize,
    /// How long one resource may take, retries and waits included.
    pub resource_deadline: Duration,
    /// How long a resource keeps retrying a "not found" answer about something it names
    /// (an ID returned moments before, not yet propagated through AWS); after that the
    /// answer is taken as final.
    pub propagation: Duration,
    /// First back-off after a retryable error; doubles up to `max_backoff`.
    pub initial_backoff: Duration,
    /// The longest back-off between two tries.
    pub max_backoff: Duration,
    /// Delete owned resources the spec no longer wants (`--prune`, and `delete cluster`).
    pub prune: bool,
    /// Called as each resource is done, for live progress.
    pub on_done: Option<DoneHook>,
    /// Called when a resource got through only after waiting for AWS (a "not found yet"
    /// or throttling answer retried): the resource, how long, and the first answer waited on.
    pub on_wait: Option<WaitHook>,
}

/// A callback per resource that had to wait (the CLI prints what and how long).
#[derive(Clone)]
pub struct WaitHook(pub(crate) std::sync::Arc<WaitFn>);

pub(super) type WaitFn = dyn Fn(&ResourceId, Duration, &str) + Send + Sync;

impl std::fmt::Debug for WaitHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WaitHook")
    }
}

/// A callback per finished resource (the CLI advances its progress bar with it).
#[derive(Clone)]
pub struct DoneHook(pub(crate) std::sync::Arc<DoneFn>);

pub(super) type DoneFn = dyn Fn(Action, &ResourceId) + Send + Sync;

impl std::fmt::Debug for DoneHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DoneHook")
    }
}

impl Default for ApplyOptions {
    fn default() -> Self {
        ApplyOptions {
            parallelism: 8,
            resource_deadline: Duration::from_secs(600),
            propagation: Duration::from_secs(60),
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(20),
            prune: false,
            on_done: None,
            on_wait: None,
        }
    }
}

/// What [`apply`] did.
#[derive(Debug, Default, Clone)]
pub struct ApplyReport {
    /// Changes done, in completion order.
    pub done: Vec<(Action, ResourceId)>,
    /// Logical → cloud ID after the run.
    pub(crate) ids: IdMap,
}

/// Applies `plan`. Refuses a plan with errors. On failure the resources already done stay
/// done: a re-plan picks up from there (every create is found by tags before it is repeated).
pub async fn apply(
    provider: &dyn Provider,
    plan: &Plan,
    opts: &ApplyOptions,
) -> Result<ApplyReport, CloudError> {
    if !plan.errors.is_empty() {
        return Err(CloudError::Refused(plan.errors.clone()));
    }
    let mut report = ApplyReport {
        done: Vec::new(),
        ids: plan
            .actual
            .iter()
            .filter_map(|(id, r)| Some((id.clone(), r.cloud_id.clone()?)))
            .collect(),
    };

    let forward: BTreeMap<ResourceId, Action> = plan
        .changes
        .iter()
        .filter(|c| c.action != Action::Delete)
        .map(|c| (c.id.clone(), c.action))
        .collect();
    let waits = forward
        .keys()
        .map(|id| {
            let deps = plan.desired[id]
                .dependencies()
                .into_iter()
                .filter(|d| forward.contains_key(d))
                .collect();
            (id.clone(), deps)
        })
        .collect();
    schedule(waits, opts, &mut report, |id, ids| {
        let action = forward[&id];
        async move {
            let want = &plan.desired[&id];
            let cloud_id = match action {
                Action::Create => Some(retry(&id, opts, || provider.create(want, &ids)).await?),
                Action::Replace => {
                    let have = &plan.actual[&id];
                    retry(&id, opts, || provider.delete(have, &ids)).await?;
                    Some(retry(&id, opts, || provider.create(want, &ids)).await?)
                }
                _ => {
                    let have = &plan.actual[&id];
                    let changes = plan
                        .changes
                        .iter()
                        .find(|c| c.id == id)
                        .map(|c| c.fields.as_slice())
                        // why: an update with no field changes (an adopted resource) passes none
                        .unwrap_or_default();
                    retry(&id, opts, || provider.update(want, have, changes, &ids)).await?;
                    None
                }
            };
            Ok((action, cloud_id))
        }
    })
    .await?;

    if !opts.prune {
        return Ok(report);
    }
    // A resource goes only after everything (being deleted) that points at it is gone.
    let doomed: BTreeSet<ResourceId> = plan
        .changes
        .iter()
        .filter(|c| c.action == Action::Delete)
        .map(|c| c.id.clone())
        .collect();
    let mut waits: BTreeMap<ResourceId, BTreeSet<ResourceId>> = doomed
        .iter()
        .map(|id| (id.clone(), BTreeSet::new()))
        .collect();
    for id in &doomed {
        for dep in plan.actual[id].dependencies() {
            if let Some(w) = waits.get_mut(&dep) {
                w.insert(id.clone());
            }
        }
    }
    schedule(waits, opts, &mut report, |id, ids| async move {
        let have = &plan.actual[&id];
        retry(&id, opts, || provider.delete(have, &ids)).await?;
        Ok((Action::Delete, None))
    })
    .await?;
    Ok(report)
}

/// Runs `op` for every node once all it waits for are done, at most `parallelism` at a time.
/// After the first failure nothing new starts; running work finishes and all failures are
/// reported together.
async fn schedule<'a, F, Fut>(
    mut waits: BTreeMap<ResourceId, BTreeSet<ResourceId>>,
    opts: &ApplyOptions,
    report: &mut ApplyReport,
    op: F,
) -> Result<(), CloudError>
where
    F: Fn(ResourceId, IdMap) -> Fut,
    Fut: Future<Output = Result<(Action, Option<CloudId>), CloudError>> + 'a,
{
    let mut running = FuturesUnordered::new();
    let mut failures = Vec::new();
    let mut finished: BTreeSet<ResourceId> = BTreeSet::new();
    loop {
        if failures.is_empty() {
            let ready: Vec<ResourceId> = waits
                .iter()
                .filter(|(_, w)| w.iter().all(|d| finished.contains(d)))
                .map(|(id, _)| id.clone())
                .take(opts.parallelism.max(1).saturating_sub(running.len()))
                .collect();
            for id in ready {
                waits.remove(&id);
                let fut = op(id.clone(), report.ids.clone());
                running.push(async move { (id, fut.await) });
            }
        }
        let Some((id, result)) = running.next().await else {
            break;
        };
        match result {
            Ok((action, cloud_id)) => {
                match (action, cloud_id) {
                    (Action::Delete, _) => {
                        report.ids.remove(&id);
                    }
                    (_, Some(cid)) => {
                        report.ids.insert(id.clone(), cid);
                    }
                    _ => {}
                }
                tracing::info!(resource = %id, ?action, "done");
                if let Some(hook) = &opts.on_done {
                    (hook.0)(action, &id);
                }
                report.done.push((action, id.clone()));
                finished.insert(id);
            }
            Err(e) => failures.push(e),
        }
    }
    if !failures.is_empty() {
        return Err(CloudError::Failed(failures));
    }
    if !waits.is_empty() {
        // Only reachable if the plan had a cycle, which `diff` already refuses.
        let stuck: Vec<String> = waits.keys().map(ToString::to_string).collect();
        return Err(CloudError::Model(format!(
            "could not order: {}",
            stuck.join(", ")
        )));
    }
    Ok(())
}

/// Retries retryable errors with exponential back-off and jitter until the resource deadline.
async fn retry<T, F, Fut>(id: &ResourceId, opts: &ApplyOptions, mut f: F) -> Result<T, CloudError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, CloudError>>,
{
    let start = Instant::now();
    let mut delay = opts.initial_backoff;
    let mut first_wait: Option<String> = None;
    loop {
        let remaining = opts.resource_deadline.saturating_sub(start.elapsed());
        let attempt = tokio::time::timeout(remaining, f()).await;
        let err = match attempt {
            Ok(Ok(v)) => {
                if let (Some(why), Some(hook)) = (&first_wait, &opts.on_wait) {
                    (hook.0)(id, start.elapsed(), why);
                }
                return Ok(v);
            }
            Ok(Err(e))
                if e.class() == ErrorClass::Fatal
                    || (e.class() == ErrorClass::NotFound
                        && start.elapsed() >= opts.propagation) =>
            {
                return Err(CloudError::Resource {
                    id: id.clone(),
                    source: Box::new(e),
                });
            }
            // Say why it was retried: a deadline reached while throttled reads differently
            // from one reached while the service failed.
            Ok(Err(e)) => match e.class() {
                ErrorClass::Throttled => format!("throttled by the API: {e}"),
                ErrorClass::Transient => format!("the API failed: {e}"),
                ErrorClass::NotFound => format!("not found (yet): {e}"),
                _ => e.to_string(),
            },
            Err(_) => "call did not return".to_string(),
        };
        let jitter = Duration::from_millis(rand::random_range(0..=delay.as_millis() as u64 / 4));
        if start.elapsed() + delay + jitter >= opts.resource_deadline {
            return Err(CloudError::Deadline {
                id: id.clone(),
                after: opts.resource_deadline,
                last: err,
            });
        }
        tracing::debug!(resource = %id, error = %err, ?delay, "retrying");
        first_wait.get_or_insert(err);
        tokio::time::sleep(delay + jitter).await;
        delay = (delay * 2).min(opts.max_backoff);
    }
}
