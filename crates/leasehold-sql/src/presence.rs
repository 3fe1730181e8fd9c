//! Whether the owner behind a waiting-queue entry is still around: the bookkeeping the
//! PostgreSQL and MariaDB/MySQL wait queues share. An entry counts its owner's calls in
//! progress (waits and acquires); once it has had none for a grace period, the owner is
//! taken to have gone and the entry leaves the queue.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

struct Activity {
    waiting: usize,
    acquiring: usize,
    last: Instant,
}

/// The calls in progress of one queue entry's owner, and when the last one ended.
pub struct Presence {
    activity: Mutex<Activity>,
    changed: Notify,
}

impl Default for Presence {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Presence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = self.activity();
        f.debug_struct("Presence")
            .field("waiting", &a.waiting)
            .field("acquiring", &a.acquiring)
            .finish()
    }
}

impl Presence {
    /// No call in progress, the last one ended now.
    pub fn new() -> Self {
        Self {
            activity: Mutex::new(Activity {
                waiting: 0,
                acquiring: 0,
                last: Instant::now(),
            }),
            changed: Notify::new(),
        }
    }

    fn activity(&self) -> MutexGuard<'_, Activity> {
        self.activity.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn touch(&self, f: impl FnOnce(&mut Activity)) {
        {
            let mut a = self.activity();
            f(&mut a);
            a.last = Instant::now();
        }
        self.changed.notify_waiters();
    }

    /// Resolves once no wait or acquire of the owner has been in progress for `grace`.
    ///
    /// # Cancel safety
    /// Cancel safe: it only watches.
    pub async fn abandoned(&self, grace: Duration) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let until = {
                let a = self.activity();
                if a.waiting > 0 || a.acquiring > 0 {
                    None
                } else {
                    Some(a.last + grace)
                }
            };
            match until {
                None => changed.await,
                Some(t) if Instant::now() >= t => return,
                Some(t) => {
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep_until(t.into()) => {}
                    }
                }
            }
        }
    }
}

/// A queue entry with a [`Presence`].
pub trait HasPresence {
    /// The entry's presence.
    fn presence(&self) -> &Presence;
}

/// Marks an entry's owner as waiting (or acquiring) while alive, and keeps the entry.
pub struct Active<E: HasPresence> {
    entry: Arc<E>,
    waiting: bool,
}

impl<E: HasPresence> std::fmt::Debug for Active<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Active")
            .field("waiting", &self.waiting)
            .finish_non_exhaustive()
    }
}

impl<E: HasPresence> Active<E> {
    /// A wait (`waiting`) or an acquire of the entry's owner, in progress until dropped.
    pub fn new(entry: Arc<E>, waiting: bool) -> Self {
        entry.presence().touch(|a| {
            if waiting {
                a.waiting += 1;
            } else {
                a.acquiring += 1;
            }
        });
        Self { entry, waiting }
    }
}

impl<E: HasPresence> Drop for Active<E> {
    fn drop(&mut self) {
        let waiting = self.waiting;
        self.entry.presence().touch(|a| {
            if waiting {
                a.waiting -= 1;
            } else {
                a.acquiring -= 1;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct E(Presence);
    impl HasPresence for E {
        fn presence(&self) -> &Presence {
            &self.0
        }
    }

    /// Not abandoned while a call is in progress; abandoned a grace after the last one
    /// ended, not before.
    #[tokio::test]
    async fn abandoned_only_a_grace_after_the_last_call() {
        let e = Arc::new(E(Presence::new()));
        let grace = Duration::from_millis(100);
        let active = Active::new(e.clone(), true);
        let gone = tokio::time::timeout(Duration::from_millis(400), e.0.abandoned(grace)).await;
        assert!(gone.is_err(), "abandoned while a wait is in progress");
        drop(active);
        let ended = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), e.0.abandoned(grace))
            .await
            .expect("abandoned once the grace is over");
        assert!(ended.elapsed() >= grace - Duration::from_millis(5));
    }
}
