//! An SDK interceptor that records the name of every operation the AWS clients send (and when
//! each started and ended, for the dependent-wave count of `scripts/bench-plan`) and can refuse
//! writes after the k-th interruption point (to interrupt an apply at an exact point).
//!
//! An interruption point is a write that is not a retry: a write sent after a failed write
//! (AWS's "not found yet" or a refused profile, retried by kprov) repeats that change and is
//! no new point. So the points of an apply are its distinct changes, one per write that
//! succeeded, however often the as-it-is policy made kprov retry, and "stop at the k-th
//! point" is the same place in every run.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeSerializationInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_smithy_runtime_api::client::interceptors::{Intercept, SharedInterceptor};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};

#[derive(Debug, Default)]
struct State {
    ops: Vec<String>,
    /// (start, end) of each operation in `ops`, same index; end is None while in flight.
    spans: Vec<(Instant, Option<Instant>)>,
    /// Interruption points passed since `limit_writes`.
    writes: usize,
    write_limit: Option<usize>,
    /// The last write failed: the next one is its retry, not a new point.
    retrying: bool,
    /// Writes sent (retries included), for the figures.
    sent_writes: usize,
    /// Writes that succeeded: the interruption points of a run that completed, also when its
    /// writes overlapped (parallelism above 1, where "the previous write" means nothing).
    ok_writes: usize,
    /// The template ID of each DescribeLaunchTemplateVersions sent (None: no ID, which asks
    /// about every template of the account).
    template_reads: Vec<Option<String>>,
}

#[derive(Debug, Clone, Default)]
pub struct Recorder {
    state: Arc<Mutex<State>>,
}

/// Reads are the Describe/List/Get calls; everything else changes the cloud.
pub fn is_write(op: &str) -> bool {
    let name = op.rsplit(':').next().unwrap_or(op);
    !(name.starts_with("Describe") || name.starts_with("List") || name.starts_with("Get"))
}

impl Recorder {
    pub fn shared(&self) -> SharedInterceptor {
        SharedInterceptor::new(self.clone())
    }

    /// `service:Operation` names sent since the last `take`.
    pub fn take(&self) -> Vec<String> {
        let mut s = self.state.lock().unwrap();
        s.spans.clear();
        s.template_reads.clear();
        std::mem::take(&mut s.ops)
    }

    /// The template each DescribeLaunchTemplateVersions sent since the last `take` named
    /// (None: it named none, so it read the account's templates, other clusters' too).
    pub fn template_reads(&self) -> Vec<Option<String>> {
        self.state.lock().unwrap().template_reads.clone()
    }

    /// The number of dependent waves among the operations sent since the last `take`: an
    /// operation is one wave deeper than the deepest one that had ENDED before it started (it
    /// could have waited for it); operations sent together share a wave. A run that sends its
    /// requests one after another has as many waves as requests.
    pub fn waves(&self) -> usize {
        self.wave_of_each()
            .into_iter()
            .map(|(d, ..)| d)
            .max()
            .unwrap_or(0)
    }

    /// Each operation sent since the last `take` with its wave (see [`Self::waves`]), in the
    /// order they were sent.
    pub fn wave_of_each(&self) -> Vec<(usize, String, Option<std::time::Duration>)> {
        let s = self.state.lock().unwrap();
        let mut order: Vec<usize> = (0..s.spans.len()).collect();
        order.sort_by_key(|&i| s.spans[i].0);
        let mut depth = vec![0usize; s.spans.len()];
        for (k, &i) in order.iter().enumerate() {
            let start = s.spans[i].0;
            let before = order[..k]
                .iter()
                .filter(|&&j| s.spans[j].1.is_some_and(|end| end <= start))
                .map(|&j| depth[j])
                .max()
                .unwrap_or(0);
            depth[i] = before + 1;
        }
        order
            .into_iter()
            .map(|i| {
                let (start, end) = s.spans[i];
                (depth[i], s.ops[i].clone(), end.map(|e| e - start))
            })
            .collect()
    }

    /// Writes at interruption points after the first `k` fail before they are sent (`None`
    /// lifts the limit); retries of a failed write still go out.
    pub fn limit_writes(&self, k: Option<usize>) {
        let mut s = self.state.lock().unwrap();
        s.writes = 0;
        s.sent_writes = 0;
        s.ok_writes = 0;
        s.retrying = false;
        s.write_limit = k;
    }

    /// Interruption points (distinct changes) since `limit_writes`.
    pub fn writes(&self) -> usize {
        self.state.lock().unwrap().writes
    }

    /// Writes that succeeded since `limit_writes`: a completed run's interruption points.
    pub fn ok_writes(&self) -> usize {
        self.state.lock().unwrap().ok_writes
    }

    /// Writes sent since `limit_writes`, retries included.
    pub fn sent_writes(&self) -> usize {
        self.state.lock().unwrap().sent_writes
    }
}

impl Intercept for Recorder {
    fn name(&self) -> &'static str {
        "kprov-test-recorder"
    }

    fn read_before_serialization(
        &self,
        ctx: &BeforeSerializationInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        use aws_sdk_ec2::operation::describe_launch_template_versions::DescribeLaunchTemplateVersionsInput;
        let op = cfg
            .load::<Metadata>()
            .map(|m| format!("{}:{}", m.service(), m.name()))
            .unwrap_or_else(|| "unknown:unknown".into());
        let mut s = self.state.lock().unwrap();
        let write = is_write(&op);
        if write {
            if !s.retrying {
                if s.write_limit.is_some_and(|k| s.writes >= k) {
                    return Err(format!(
                        "test interrupt: refusing {op} after {} interruption points",
                        s.writes
                    )
                    .into());
                }
                s.writes += 1;
            }
            s.sent_writes += 1;
        }
        if let Some(i) = ctx
            .input()
            .downcast_ref::<DescribeLaunchTemplateVersionsInput>()
        {
            s.template_reads
                .push(i.launch_template_id().map(str::to_string));
        }
        cfg.interceptor_state().store_put(Sent(s.ops.len(), write));
        s.ops.push(op);
        s.spans.push((Instant::now(), None));
        Ok(())
    }

    fn read_after_execution(
        &self,
        ctx: &FinalizerInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(Sent(i, write)) = cfg.load::<Sent>() {
            let mut s = self.state.lock().unwrap();
            if *write {
                let ok = matches!(ctx.output_or_error(), Some(Ok(_)));
                s.retrying = !ok;
                s.ok_writes += usize::from(ok);
            }
            // A `take` between start and end leaves nothing to close.
            if let Some(span) = s.spans.get_mut(*i) {
                span.1 = Some(Instant::now());
            }
        }
        Ok(())
    }
}

/// The index of an operation in the recorder's list, and whether it is a write, kept in its
/// request's config bag.
#[derive(Debug, Clone)]
struct Sent(usize, bool);

impl Storable for Sent {
    type Storer = StoreReplace<Self>;
}
