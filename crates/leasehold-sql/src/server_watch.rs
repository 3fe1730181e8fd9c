//! A session a session-bound store keeps open to its server only to see the server end
//! its sessions.
//!
//! A session-bound lease (an advisory lock, `GET_LOCK`) dies with the session that holds
//! it. When the server restarts it ends every session at once, and grants the lock again as
//! soon as it accepts connections; the holder must not learn of it at its next renewal
//! (up to a renew interval later). The driver gives no way to read an idle connection, so
//! the store cannot watch the lock's own session without a statement on it (which would
//! hold up the renewals, and on PostgreSQL stop the idle timeout that enforces the TTL).
//! Instead it keeps one more session to the same server, doing nothing but waiting on it
//! (a `LISTEN`ing connection that is only read, or a long `SLEEP`): when that session
//! ends, the server that held the locks has ended its sessions (or the network to it
//! broke), and every lease the store holds there is reported ended at once
//! ([`EndedGrants`]). When only the watching session was
//! ended (an operator killed it), the leases are reported lost although their locks are
//! held: that fails closed.
//!
//! The watch is up before a lock is taken ([`ServerWatch::up`]) and a grant is installed
//! only while the same watch is still up ([`ServerWatch::while_up`]), atomically with the
//! watch's end, so no lease the store holds escapes the report.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use leasehold_core::{EndedGrants, Fence, Key, OwnerToken, StoreError, StoreErrorKind};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// Watches one server through one session; see the module documentation.
#[derive(Debug)]
pub struct ServerWatch {
    backend: &'static str,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// `Some(term)` while the watching session is open.
    up: watch::Sender<Option<u64>>,
}

#[derive(Debug, Default)]
struct State {
    /// Counts the watching sessions opened.
    term: u64,
    up: bool,
    /// Counts the watching tasks started.
    started: u64,
    /// The watching task (its number and handle), while it runs.
    task: Option<(u64, AbortHandle)>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The watching task's side: says when its session is open, and ends the watch.
#[derive(Debug)]
pub struct Watching {
    backend: &'static str,
    shared: Arc<Shared>,
    /// Its number among the tasks started.
    id: u64,
    /// Its term once its session is open, until it ends.
    term: Option<u64>,
    done: bool,
}

impl Watching {
    /// The watching session is open: the watch is up, with a new term.
    pub fn opened(&mut self) {
        let term = {
            let mut s = self.shared.lock();
            s.term += 1;
            s.up = true;
            s.term
        };
        self.term = Some(term);
        self.shared.up.send_replace(Some(term));
    }

    /// The watching session ended (or could not be opened): the watch is down, and `ended`
    /// runs while no grant can be installed under the term that ends (it lists the leases
    /// to report). Returns what `ended` returned, or `None` if the watch was never up.
    pub fn ended<T>(mut self, ended: impl FnOnce() -> T) -> Option<T> {
        self.down(ended)
    }

    /// The watching session ended because of `why`: [`ended`](Self::ended), with `held`
    /// listing the leases the store holds, each then reported ended to `grants`.
    pub fn report_ended(
        self,
        grants: &EndedGrants,
        why: &dyn std::fmt::Display,
        held: impl FnOnce() -> Vec<(Key, OwnerToken, Fence)>,
    ) {
        let backend = self.backend;
        let lost = self.ended(held).unwrap_or_default();
        if !lost.is_empty() {
            tracing::warn!(
                backend,
                held = lost.len(),
                error = %why,
                "the server ended its sessions: every session-bound lease held here is lost"
            );
        }
        for (key, owner, fence) in lost {
            grants.report(&key, &owner, fence);
        }
    }

    fn down<T>(&mut self, ended: impl FnOnce() -> T) -> Option<T> {
        self.done = true;
        let term = self.term.take();
        let out = {
            let mut s = self.shared.lock();
            if s.task.as_ref().is_some_and(|(id, _)| *id == self.id) {
                s.task = None;
            }
            match term {
                Some(t) if s.up && s.term == t => {
                    s.up = false;
                    Some(ended())
                }
                _ => None,
            }
        };
        self.shared.up.send_replace(None);
        out
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        // The task ended without saying so (a panic, or aborted with the store): the watch
        // is down.
        if !self.done {
            self.down(|| ());
        }
    }
}

impl ServerWatch {
    /// A watch for a store of `backend`, not started.
    pub fn new(backend: &'static str) -> Self {
        Self {
            backend,
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                up: watch::Sender::new(None),
            }),
        }
    }

    /// The current term if the watch is up.
    pub fn term(&self) -> Option<u64> {
        let s = self.shared.lock();
        s.up.then_some(s.term)
    }

    /// Starts the watch if it is not running (`start` spawns the watching task, which calls
    /// [`Watching::opened`] once its session is open and [`Watching::ended`] when it
    /// ends), and waits up to `within` until it is up. Returns its term.
    ///
    /// Wait for it right before sending the statement that takes the lock (or the first
    /// statement on a session that holds it already): the watching session is then open
    /// before the lock's session last answered, so both were sessions of the same server
    /// at that moment, and an end of that server ends the watch too.
    ///
    /// # Cancel safety
    /// Cancel safe: the task runs on.
    ///
    /// # Errors
    /// [`StoreErrorKind::Unavailable`] when the watching session is not open within
    /// `within` (the server cannot be reached).
    pub async fn up(
        &self,
        within: Duration,
        start: impl FnOnce(Watching) -> tokio::task::JoinHandle<()>,
    ) -> Result<u64, StoreError> {
        let mut rx = self.shared.up.subscribe();
        if let Some(term) = self.start(start) {
            return Ok(term);
        }
        let started = tokio::time::timeout(within, async {
            loop {
                if let Some(term) = *rx.borrow_and_update() {
                    return Some(term);
                }
                // None: the task ended without opening its session.
                self.shared.lock().task.as_ref()?;
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await;
        match started {
            Ok(Some(term)) => Ok(term),
            _ => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                self.backend,
                format!(
                    "the session that watches the server for the end of its lock sessions \
                     could not be opened within {within:?}; is the server up?"
                ),
            )),
        }
    }

    /// Starts the watch if it is not running, without waiting (so that its session opens
    /// while the caller does other work; [`up`](Self::up) then waits less). Its term if it
    /// is up.
    pub fn start(
        &self,
        start: impl FnOnce(Watching) -> tokio::task::JoinHandle<()>,
    ) -> Option<u64> {
        let mut s = self.shared.lock();
        if s.up {
            return Some(s.term);
        }
        if s.task.as_ref().is_none_or(|(_, t)| t.is_finished()) {
            s.started += 1;
            let watching = Watching {
                backend: self.backend,
                shared: self.shared.clone(),
                id: s.started,
                term: None,
                done: false,
            };
            s.task = Some((s.started, start(watching).abort_handle()));
        }
        None
    }

    /// Runs `f` (install a grant) if the watch is still up at `term`, atomically with the
    /// watch's end; `None` (not run) when it went down or another session took over
    /// meanwhile: the server may have ended the grant's session unseen.
    pub fn while_up<T>(&self, term: u64, f: impl FnOnce() -> T) -> Option<T> {
        let s = self.shared.lock();
        (s.up && s.term == term).then(f)
    }

    /// The error of an acquire whose grant came while the watch went down.
    pub fn went_down(&self, op: &str) -> StoreError {
        StoreError::new(
            StoreErrorKind::Unavailable,
            self.backend,
            format!(
                "{op}: the server ended its sessions (or the connection to it broke) while \
                 the lock was being taken; it was let go: try again"
            ),
        )
    }
}

impl Drop for ServerWatch {
    fn drop(&mut self) {
        if let Some((_, task)) = self.shared.lock().task.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn up_while_the_session_is_open_and_installs_refused_after_it_ended() {
        let watch = ServerWatch::new("test");
        let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
        let (ended_tx, ended_rx) = tokio::sync::oneshot::channel::<Option<u32>>();
        let term = watch
            .up(Duration::from_secs(1), |mut w| {
                tokio::spawn(async move {
                    w.opened();
                    let _ = end_rx.await;
                    let _ = ended_tx.send(w.ended(|| 7));
                })
            })
            .await
            .unwrap();
        assert_eq!(watch.term(), Some(term));
        assert_eq!(watch.while_up(term, || 1), Some(1));
        // Up already: `start` is not called again.
        let again = watch.up(Duration::from_secs(1), |_| unreachable!()).await;
        assert_eq!(again.unwrap(), term);
        end_tx.send(()).unwrap();
        assert_eq!(ended_rx.await.unwrap(), Some(7));
        assert_eq!(watch.term(), None);
        assert_eq!(watch.while_up(term, || 1), None, "ended: no install");
        // A new session, a new term; an install under the old one is refused.
        let next = watch
            .up(Duration::from_secs(1), |mut w| {
                tokio::spawn(async move {
                    w.opened();
                    std::future::pending::<()>().await;
                })
            })
            .await
            .unwrap();
        assert_ne!(next, term);
        assert_eq!(watch.while_up(term, || 1), None);
        assert_eq!(watch.while_up(next, || 2), Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_that_cannot_be_opened_is_unavailable() {
        let watch = ServerWatch::new("test");
        let err = watch
            .up(Duration::from_secs(1), |w| {
                tokio::spawn(async move {
                    assert_eq!(w.ended(|| 1), None, "never up");
                })
            })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Unavailable);
        let err = watch
            .up(Duration::from_secs(1), |w| {
                tokio::spawn(async move {
                    let _w = w;
                    std::future::pending::<()>().await;
                })
            })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Unavailable, "slow to open");
    }
}
