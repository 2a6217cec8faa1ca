//! Ctrl-C (SIGINT) and SIGTERM for every command that waits: one listener per process,
//! installed by the command before it takes the cluster lock, and an [`Interrupts`] handle
//! that the long waits (SSH, bastion, Auto Scaling launches, etcd members, drains, the API)
//! race against, so that each of them ends within a poll of the first signal instead of
//! running to its own deadline.
//!
//! ```text
//! let ints = ops::interrupt::listen(|c| warn(c), |c| exit(c.exit_code()))?;
//! ints.or(wait_for_ssh(..)).await?;        // Err(Caught) as soon as a signal came
//! ints.sleep(poll).await?;                 // a wait loop's pause, cut by a signal
//! ```
//!
//! Caveat: once [`listen`] ran, the signals no longer end the process by themselves: the
//! command must return (its lock released) and exit with [`Caught::exit_code`]. The second
//! signal is the escape hatch (`on_second`, which exits at once).

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

/// Which signal stopped the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caught {
    /// SIGINT: Ctrl-C on a terminal.
    Interrupt,
    /// SIGTERM: a supervisor, `kill`, a CI job's timeout.
    Terminate,
}

impl Caught {
    /// As shells report a process ended by the signal: 128 + its number.
    pub(crate) fn exit_code(self) -> i32 {
        match self {
            Caught::Interrupt => 130,
            Caught::Terminate => 143,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Caught::Interrupt => "SIGINT",
            Caught::Terminate => "SIGTERM",
        }
    }
}

impl std::fmt::Display for Caught {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A wait ended by a signal, and what it was waiting for (for the journal and the message).
#[derive(Debug, Clone, thiserror::Error)]
#[error("interrupted by {signal} while {what}")]
pub(crate) struct Interrupted {
    pub signal: Caught,
    pub what: String,
}

impl Interrupted {
    /// The text of an interrupted wait, for callers whose errors are strings.
    pub(crate) fn message(signal: Caught, what: &str) -> String {
        Interrupted {
            signal,
            what: what.to_string(),
        }
        .to_string()
    }
}

/// The first signal caught, as a value every wait can race against. Cheap to clone; the
/// default never fires (library callers and tests that send no signal).
#[derive(Debug, Clone)]
pub(crate) struct Interrupts(watch::Receiver<Option<Caught>>);

impl Default for Interrupts {
    fn default() -> Self {
        Self::never()
    }
}

impl Interrupts {
    /// Never interrupted.
    pub(crate) fn never() -> Self {
        let (_tx, rx) = watch::channel(None);
        Interrupts(rx)
    }

    /// Interrupted when the caller sends `Some`.
    #[cfg(test)]
    pub(crate) fn manual() -> (watch::Sender<Option<Caught>>, Self) {
        let (tx, rx) = watch::channel(None);
        (tx, Interrupts(rx))
    }

    /// The signal caught so far, if any.
    pub(crate) fn caught(&self) -> Option<Caught> {
        *self.0.borrow()
    }

    /// Resolves with the first signal; never when none comes (or no listener exists).
    pub(crate) async fn wait(&self) -> Caught {
        let mut rx = self.0.clone();
        loop {
            if let Some(c) = *rx.borrow_and_update() {
                return c;
            }
            if rx.changed().await.is_err() {
                // The sender is gone: no signal can come any more.
                return std::future::pending().await;
            }
        }
    }

    /// `fut`, unless a signal comes first (then `fut` is dropped, cut where it waited).
    pub(crate) async fn or<T>(&self, fut: impl Future<Output = T>) -> Result<T, Caught> {
        if let Some(c) = self.caught() {
            return Err(c);
        }
        tokio::select! {
            r = fut => Ok(r),
            c = self.wait() => Err(c),
        }
    }

    /// A fallible `fut`, unless a signal comes first: its error outside, the signal inside,
    /// as a `Session::with_lock` closure returns them (the lock is released either way).
    pub(crate) async fn or_try<T, E>(
        &self,
        fut: impl Future<Output = Result<T, E>>,
    ) -> Result<Result<T, Caught>, E> {
        match self.or(fut).await {
            Err(c) => Ok(Err(c)),
            Ok(r) => r.map(Ok),
        }
    }

    /// A wait loop's pause, ended early by a signal.
    pub(crate) async fn sleep(&self, d: Duration) -> Result<(), Caught> {
        self.or(tokio::time::sleep(d)).await
    }

    /// A `watch::Receiver<bool>` that turns true with the first signal (the rolling engine's
    /// cancel flag).
    pub(crate) fn flag(&self) -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(self.caught().is_some());
        let me = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = me.wait() => { let _ = tx.send(true); }
                _ = tx.closed() => {}
            }
        });
        rx
    }
}

/// Catches SIGINT and SIGTERM from now on: the first one calls `on_first` and fires the
/// returned [`Interrupts`]; any later one calls `on_second` (which should exit the process:
/// the operator insists).
pub(crate) fn listen(
    on_first: impl Fn(Caught) + Send + 'static,
    on_second: impl Fn(Caught) + Send + 'static,
) -> std::io::Result<Interrupts> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut first = true;
        loop {
            let c = tokio::select! {
                s = int.recv() => match s { Some(()) => Caught::Interrupt, None => return },
                s = term.recv() => match s { Some(()) => Caught::Terminate, None => return },
            };
            if first {
                first = false;
                on_first(c);
                let _ = tx.send(Some(c));
            } else {
                on_second(c);
            }
        }
    });
    Ok(Interrupts(rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_signal_cuts_a_wait_at_once_and_later_waits_do_not_start() {
        let (tx, ints) = Interrupts::manual();
        let t = tokio::time::Instant::now();
        let waiting = ints.clone();
        let h = tokio::spawn(async move { waiting.sleep(Duration::from_secs(30)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        tx.send(Some(Caught::Terminate)).unwrap();
        assert_eq!(h.await.unwrap(), Err(Caught::Terminate));
        assert!(t.elapsed() < Duration::from_secs(2));
        assert_eq!(ints.or(async { 1 }).await, Err(Caught::Terminate));
        assert_eq!(Caught::Terminate.exit_code(), 143);
        assert_eq!(Caught::Interrupt.exit_code(), 130);
    }

    #[tokio::test]
    async fn never_lets_every_wait_finish() {
        let ints = Interrupts::never();
        assert_eq!(ints.or(async { 7 }).await, Ok(7));
        assert_eq!(ints.sleep(Duration::from_millis(1)).await, Ok(()));
        assert!(!*ints.flag().borrow());
    }

    #[tokio::test]
    async fn the_flag_follows_the_first_signal() {
        let (tx, ints) = Interrupts::manual();
        let mut flag = ints.flag();
        tx.send(Some(Caught::Interrupt)).unwrap();
        flag.changed().await.unwrap();
        assert!(*flag.borrow());
    }
}
