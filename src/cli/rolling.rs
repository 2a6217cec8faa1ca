//! `rolling-update cluster` and `get instances`: the flags read into
//! `ops::rolling_update::RollingOptions`, the preview printed (kops's table per group, then per
//! node: replace, re-provision in place or leave alone, and why), and with `--yes` the roll
//! (`RollingUpdate::apply`) under `Session::with_lock`, its progress (a spinner line per node
//! on a terminal, plain lines otherwise), the journal and the exit code from how it ended.
//! Every decision (the platform, the rollers, the etcd backup, the journal) is in `ops`.
//!
//! Ctrl-C (or SIGTERM), caught before the lock is taken, asks the engine to stop at a safe
//! point (exit 130, or 143 for SIGTERM; lock released); a second one exits at once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::ctx::Ctx;
use super::exit;
use crate::ops::interrupt::Caught;
use crate::ops::model::{Journal, RollPlan, Selection, parse_roles};
use crate::ops::rolling_update::{
    self as ops_roll, RollingError, RollingEvent, RollingOptions, RollingPlan, RollingUpdate,
};
use crate::ops::session::Session;
use crate::output::Format;
use crate::views::rolling::{self as view, Ended};

#[derive(Debug, Args, Clone)]
pub(crate) struct RollingUpdateClusterArgs {
    pub(crate) name: String,
    /// Roll (without it: preview only)
    #[arg(long, short)]
    pub(crate) yes: bool,
    /// Exit 2 when something would roll
    #[arg(long)]
    pub(crate) exit_code: bool,
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    pub(crate) output: Format,
    /// Only these instance groups (repeat, or comma-separated)
    #[arg(long = "instance-group", value_delimiter = ',', value_name = "GROUP")]
    pub(crate) instance_groups: Vec<String>,
    /// Only groups of these roles: Bastion, ControlPlane (or Master), Node
    #[arg(
        long = "instance-group-roles",
        value_delimiter = ',',
        value_name = "ROLE"
    )]
    pub(crate) instance_group_roles: Vec<String>,
    /// Roll every selected node, up to date or not
    #[arg(long)]
    pub(crate) force: bool,
    /// Give up on a node's drain after this long; the roll stops, the node stays cordoned
    #[arg(long, value_parser = super::addons::parse_duration, default_value = "15m")]
    pub(crate) drain_timeout: Duration,
    /// How long the cluster may take to pass validation after each batch
    #[arg(long, value_parser = super::addons::parse_duration, default_value = "15m")]
    pub(crate) validation_timeout: Duration,
    /// Consecutive validation passes needed after each batch
    #[arg(long, default_value_t = 2)]
    pub(crate) validate_count: u32,
    /// Replace without draining or validating (for a cluster whose API is down)
    #[arg(long = "cloudonly", visible_alias = "cloud-only")]
    pub(crate) cloud_only: bool,
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    #[arg(long, default_value_t = 20)]
    pub(crate) concurrency: usize,
    /// AWS: reach instances at their private addresses (as `update cluster --ssh-private-address`)
    #[arg(long)]
    pub(crate) ssh_private_address: bool,
    /// Upload every binary and image from this bundle (`kprov create bundle`), as
    /// `update cluster --bundle` does: checked in full before the preview (air-gapped sites)
    #[arg(long, value_name = "FILE")]
    pub(crate) bundle: Option<PathBuf>,
}

impl RollingUpdateClusterArgs {
    fn options(&self) -> anyhow::Result<RollingOptions> {
        Ok(RollingOptions {
            selection: Selection {
                groups: self.instance_groups.clone(),
                roles: parse_roles(&self.instance_group_roles).map_err(anyhow::Error::msg)?,
                force: self.force,
            },
            drain_timeout: self.drain_timeout,
            validation_timeout: self.validation_timeout,
            validate_count: self.validate_count,
            cloud_only: self.cloud_only,
            kubeconfig: self.kubeconfig.clone(),
            concurrency: self.concurrency,
            ssh_private_address: self.ssh_private_address,
            bundle: self.bundle.clone(),
        })
    }
}

/// The roll opened on the stored cluster and its preview made (the API's route shown at
/// debug level, READY's absence warned of after the data).
async fn planned(
    ctx: &Ctx,
    name: &str,
    options: RollingOptions,
) -> anyhow::Result<(RollingUpdate, RollingPlan)> {
    let resolved = super::addons::resolved(ctx, name).await?;
    let store = ctx.repo().await?.store().clone();
    let roll = ops_roll::open(store, resolved, options)
        .await
        .map_err(failed)?;
    let plan = roll.plan().await.map_err(failed)?;
    if let Some(route) = &plan.route {
        ctx.printer.debug(route);
    }
    Ok((roll, plan))
}

/// An ops error as the command reports it: its cause kept as it is, so that the exit code
/// (`exit_code_of`: 4 for a held lock) reads it.
fn failed(e: RollingError) -> anyhow::Error {
    match e {
        RollingError::Lock(e) => e.into(),
        RollingError::Other(e) => e,
        e => e.into(),
    }
}

pub(super) async fn cluster(ctx: &Ctx, a: &RollingUpdateClusterArgs) -> anyhow::Result<i32> {
    let (roll, o) = planned(ctx, &a.name, a.options()?).await?;
    let name = roll.cluster().name().to_string();
    let plan = &o.plan;
    if !view::preview(&ctx.printer, &name, &o)? {
        return Ok(exit::ERROR);
    }
    if a.yes {
        // A journal left unfinished is resumed even when the preview finds nothing to roll.
        return apply(ctx, &name, roll, plan).await;
    }
    Ok(exit::of_preview(
        view::to_roll(&ctx.printer, &name, plan),
        a.exit_code,
    ))
}

/// `--yes`: [`RollingUpdate::apply`] under the cluster lock, its events and report printed.
async fn apply(ctx: &Ctx, name: &str, roll: RollingUpdate, plan: &RollPlan) -> anyhow::Result<i32> {
    let session = Session::new(ctx.repo().await?.store().clone());
    // Ctrl-C is caught before the lock is taken, so none that comes while it is held can end
    // the process with the lock left behind: the first asks the roll to stop at a safe point
    // (then the lock is released), a second exits at once.
    let resume = format!("kprov rolling-update cluster {name} --yes");
    let ints = super::ctx::catch_interrupts(name, &resume);
    let multi = std::sync::Mutex::new(None);
    let say = |e: RollingEvent<'_>| view::say(&ctx.printer, name, e);
    let events = |j: &Journal| {
        let names: Vec<String> = j.nodes.iter().map(|n| n.node_name.clone()).collect();
        let (events, bars) = view::roll_events(ctx.printer.is_tty(), &names);
        *multi.lock().unwrap_or_else(|p| p.into_inner()) = bars;
        events
    };
    let code = session
        .with_lock(name, "rolling-update cluster --yes", async |guard| {
            let report = roll.apply(plan, guard, &ints, &say, events).await;
            if let Some(m) = multi.lock().unwrap_or_else(|p| p.into_inner()).take() {
                let _ = m.clear();
            }
            Ok(match view::report(&ctx.printer, name, report)? {
                Ended::Rolled => exit::OK,
                Ended::Failed => exit::ERROR,
                Ended::Interrupted => exit::INTERRUPTED,
                Ended::Stopped => ints.caught().unwrap_or(Caught::Interrupt).exit_code(),
            })
        })
        .await
        .map_err(failed)?;
    if let Some(c) = ints.caught()
        && code == c.exit_code()
    {
        ctx.printer.status(&format!(
            "The lock of {name} is released. Resume with `{resume}`."
        ));
    }
    Ok(code)
}

/// `get instances NAME`: every host with its group, status and Ready.
pub(super) async fn get_instances(
    ctx: &Ctx,
    name: &str,
    kubeconfig: Option<&Path>,
) -> anyhow::Result<i32> {
    let options = RollingOptions {
        kubeconfig: kubeconfig.map(Path::to_path_buf),
        ..RollingOptions::default()
    };
    let (_, o) = planned(ctx, name, options).await?;
    Ok(if view::instances(&ctx.printer, name, &o)? {
        exit::OK
    } else {
        exit::ERROR
    })
}
