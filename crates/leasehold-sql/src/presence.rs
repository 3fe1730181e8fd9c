//! Whether the owner behind a waiting-queue entry ([`crate::wait`]) is still around. An
//! entry counts its owner's calls in progress (waits and acquires); once it has had none
//! for a grace period, the owner is taken to have gone and the entry leaves the queue.

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

/// Marks an entry's owner as waiting (or acquiring) while alive.
pub struct Active {
    presence: Arc<Presence>,
    waiting: bool,
}

impl Active {
    /// A wait (`waiting`) or an acquire of the entry's owner, in progress until dropped.
    pub fn new(presence: Arc<Presence>, waiting: bool) -> Self {
        presence.touch(|a| {
            if waiting {
                a.waiting += 1;
            } else {
                a.acquiring += 1;
            }
        });
        Self { presence, waiting }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        let waiting = self.waiting;
        self.presence.touch(|a| {
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

    /// Not abandoned while a call is in progress; abandoned a grace after the last one
    /// ended, not before.
    #[tokio::test]
    async fn abandoned_only_a_grace_after_the_last_call() {
        let e = Arc::new(Presence::new());
        let grace = Duration::from_millis(100);
        let active = Active::new(e.clone(), true);
        let gone = tokio::time::timeout(Duration::from_millis(400), e.abandoned(grace)).await;
        assert!(gone.is_err(), "abandoned while a wait is in progress");
        drop(active);
        let ended = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), e.abandoned(grace))
            .await
            .expect("abandoned once the grace is over");
        assert!(ended.elapsed() >= grace - Duration::from_millis(5));
    }
}
