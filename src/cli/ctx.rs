//! What every command of the cli shares: the context (`Ctx`: the printer, the store opened
//! once), the lock and signal handling, and the map from errors to exit codes. Below the
//! command files (`commands.rs` dispatches to them; they name only this).

use std::sync::Arc;

use super::exit;
use crate::ops::interrupt::{self, Caught, Interrupts};
use crate::ops::model::{LockError, Repo, RepoError, StateError, StateStore};
use crate::ops::session::Session;
use crate::output::Printer;
use crate::spec::SpecErrors;
use crate::views::signals;

pub(super) struct Ctx {
    pub(super) printer: Printer,
    pub(super) store_url: String,
    /// The store, opened once, at the first command that needs it.
    session: tokio::sync::OnceCell<Session>,
}

impl Ctx {
    pub(super) fn new(printer: Printer, store_url: String) -> Self {
        Ctx {
            printer,
            store_url,
            session: tokio::sync::OnceCell::new(),
        }
    }

    /// The command's session with the state store (opened at the first call).
    pub(super) async fn session(&self) -> anyhow::Result<&Session> {
        Ok(self
            .session
            .get_or_try_init(|| Session::open(&self.store_url))
            .await?)
    }

    pub(super) async fn store(&self) -> anyhow::Result<Arc<dyn StateStore>> {
        Ok(self.session().await?.store().clone())
    }

    pub(super) async fn repo(&self) -> anyhow::Result<Repo> {
        Ok(self.session().await?.repo())
    }

    pub(super) async fn warn_versioning(&self) -> anyhow::Result<()> {
        if let Some(w) = self.session().await?.versioning_warning().await {
            self.printer.warn(&w);
        }
        Ok(())
    }
}

/// Runs `work` holding the cluster's lock. The lock is released whatever happens; when both
/// the work and the release fail, the work's error is the one reported.
pub(super) async fn locked<T>(
    store: &Arc<dyn StateStore>,
    cluster: &str,
    command: &str,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    Session::new(store.clone())
        .with_lock(cluster, command, async |_| work.await)
        .await
}

/// Catches SIGINT and SIGTERM for a command about to take `cluster`'s lock (installed before
/// the lock is taken, so that no signal ends the process with the lock left behind): the
/// first ends the wait in flight, after which the command releases the lock and says how to
/// resume (`resume`); a second exits at once.
pub(super) fn catch_interrupts(cluster: &str, resume: &str) -> Interrupts {
    let first = {
        let cluster = cluster.to_string();
        move |c: Caught| signals::first(&cluster, c)
    };
    let second = {
        let (cluster, resume) = (cluster.to_string(), resume.to_string());
        move |c: Caught| {
            signals::second(&cluster, c, &resume);
            std::process::exit(c.exit_code());
        }
    };
    interrupt::listen(first, second).unwrap_or_else(|e| {
        signals::not_caught(&e.to_string());
        Interrupts::never()
    })
}

/// After a command stopped for signal `c` with its lock released: what was in flight, how to
/// resume; returns the exit code (128 + the signal's number, as shells report it).
pub(super) fn interrupted(
    ctx: &Ctx,
    cluster: &str,
    c: Caught,
    in_flight: &str,
    resume: &str,
) -> i32 {
    signals::interrupted(&ctx.printer, cluster, c, in_flight, resume);
    c.exit_code()
}

/// Maps an error to the documented exit code: the first cause in its chain that means one.
pub(super) fn exit_code_of(e: &anyhow::Error) -> i32 {
    e.chain().find_map(code_of).unwrap_or(exit::ERROR)
}

/// The exit code an error of this kind means, if any (ops's error enums by their variant).
fn code_of(cause: &(dyn std::error::Error + 'static)) -> Option<i32> {
    use crate::ops::{damaged::DamagedError, objects::GroupDeleteError};
    if cause.is::<SpecErrors>()
        || cause.is::<crate::ops::create::FlagError>()
        || cause.is::<crate::ops::model::InventoryError>()
    {
        return Some(exit::INVALID_SPEC);
    }
    let repo = |r: &RepoError| match r {
        RepoError::Spec(_) => Some(exit::INVALID_SPEC),
        RepoError::State(StateError::Conflict { .. }) | RepoError::Exists { .. } => {
            Some(exit::CONFLICT)
        }
        _ => None,
    };
    let lock = |l: &LockError| matches!(l, LockError::Held { .. }).then_some(exit::CONFLICT);
    if let Some(r) = cause.downcast_ref::<RepoError>() {
        return repo(r);
    }
    if let Some(StateError::Conflict { .. }) = cause.downcast_ref::<StateError>() {
        return Some(exit::CONFLICT);
    }
    if let Some(l) = cause.downcast_ref::<LockError>() {
        return lock(l);
    }
    match cause.downcast_ref::<GroupDeleteError>() {
        Some(GroupDeleteError::Repo(r)) => return repo(r),
        Some(GroupDeleteError::Lock(l)) => return lock(l),
        Some(GroupDeleteError::WouldBeInvalid { .. }) => return Some(exit::INVALID_SPEC),
        None => {}
    }
    match cause.downcast_ref::<DamagedError>() {
        Some(DamagedError::Lock(l)) => lock(l),
        // Transparent: the wrapped error's own chain says what it means (a conflicting
        // removal is CONFLICT, as before the enum).
        Some(DamagedError::Store(e)) => e.chain().find_map(code_of),
        None => None,
    }
}
