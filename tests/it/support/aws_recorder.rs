//! An SDK interceptor that records the name of every operation the AWS clients send and can
//! refuse writes after the k-th one (to interrupt an apply at an exact point).

use std::sync::{Arc, Mutex};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::BeforeSerializationInterceptorContextRef;
use aws_smithy_runtime_api::client::interceptors::{Intercept, SharedInterceptor};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

#[derive(Debug, Default)]
struct State {
    ops: Vec<String>,
    writes: usize,
    write_limit: Option<usize>,
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
        std::mem::take(&mut self.state.lock().unwrap().ops)
    }

    /// Writes after the first `k` fail before they are sent (`None` lifts the limit).
    pub fn limit_writes(&self, k: Option<usize>) {
        let mut s = self.state.lock().unwrap();
        s.writes = 0;
        s.write_limit = k;
    }

    pub fn writes(&self) -> usize {
        self.state.lock().unwrap().writes
    }
}

impl Intercept for Recorder {
    fn name(&self) -> &'static str {
        "kprov-test-recorder"
    }

    fn read_before_serialization(
        &self,
        _ctx: &BeforeSerializationInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let op = cfg
            .load::<Metadata>()
            .map(|m| format!("{}:{}", m.service(), m.name()))
            .unwrap_or_else(|| "unknown:unknown".into());
        let mut s = self.state.lock().unwrap();
        if is_write(&op) {
            if s.write_limit.is_some_and(|k| s.writes >= k) {
                return Err(
                    format!("test interrupt: refusing {op} after {} writes", s.writes).into(),
                );
            }
            s.writes += 1;
        }
        s.ops.push(op);
        Ok(())
    }
}
