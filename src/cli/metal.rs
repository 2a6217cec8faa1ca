//! Bare-metal clusters: provisioning the inventory's hosts over SSH.
// Transitional: the metal helper replaces this file with the real implementation.

use super::UpdateClusterArgs;
use super::commands::Ctx;
use crate::spec::{Cluster, InstanceGroup};

pub async fn update(
    _ctx: &Ctx,
    cluster: &Cluster,
    _groups: &[InstanceGroup],
    _a: &UpdateClusterArgs,
) -> anyhow::Result<i32> {
    anyhow::bail!(
        "update cluster for metal cluster {} is not wired yet",
        cluster.name()
    )
}
