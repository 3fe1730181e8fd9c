//! A process-wide OS thread that fires lost signals at validity deadlines even when the
//! async runtime is starved (every worker blocked by CPU work), so user code selecting on
//! the lost signal from another runtime or thread still learns in time.
//!
//! Leases are removed when they end, so the thread only ever holds live leases and wakes
//! only at real deadlines.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant as StdInstant};

use crate::lease::LeaseShared;

/// The longest the thread sleeps when it has nothing earlier to do; a lease whose
/// deadline is later than the thread's planned wake-up is added without waking it.
const IDLE: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Queue {
    by_deadline: BTreeSet<(StdInstant, u64)>,
    leases: HashMap<u64, (StdInstant, Weak<LeaseShared>)>,
    /// When the thread wakes up by itself; `None` while it is awake.
    sleeping_until: Option<StdInstant>,
}

struct Watchdog {
    queue: Mutex<Queue>,
    wake: Condvar,
}

fn instance() -> &'static Watchdog {
    static W: OnceLock<&'static Watchdog> = OnceLock::new();
    W.get_or_init(|| {
        let w: &'static Watchdog = Box::leak(Box::new(Watchdog {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("leasehold-watchdog".into())
            .spawn(move || w.run())
            .expect("spawn the leasehold watchdog thread");
        w
    })
}

/// Watches `lease` until [`unwatch`] or its deadline passes without a renewal.
pub(crate) fn watch(lease: &Arc<LeaseShared>) {
    let w = instance();
    let deadline = lease.valid_until().into_std();
    let mut q = w.lock();
    // Wake the thread only if it would otherwise sleep past this deadline.
    let earliest = q.sleeping_until.is_some_and(|until| deadline < until);
    q.by_deadline.insert((deadline, lease.id));
    q.leases.insert(lease.id, (deadline, Arc::downgrade(lease)));
    drop(q);
    if earliest {
        w.wake.notify_one();
    }
}

/// Stops watching lease `id` (it ended).
pub(crate) fn unwatch(id: u64) {
    let w = instance();
    let mut q = w.lock();
    if let Some((deadline, _)) = q.leases.remove(&id) {
        q.by_deadline.remove(&(deadline, id));
    }
}

impl Watchdog {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run(&self) {
        let mut q = self.lock();
        loop {
            let now = StdInstant::now();
            let first = q.by_deadline.first().copied();
            let (deadline, id) = match first {
                Some((deadline, id)) if deadline <= now => (deadline, id),
                _ => {
                    let until = first.map_or(now + IDLE, |(d, _)| d.min(now + IDLE));
                    q.sleeping_until = Some(until);
                    q = self
                        .wake
                        .wait_timeout(q, until - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    q.sleeping_until = None;
                    continue;
                }
            };
            q.by_deadline.remove(&(deadline, id));
            let Some((_, weak)) = q.leases.remove(&id) else {
                continue;
            };
            let Some(lease) = weak.upgrade() else {
                continue;
            };
            drop(q);
            if !lease.is_done() {
                let current = lease.valid_until().into_std();
                if current <= now {
                    // check() fires the lost signal with `Expired`.
                    lease.check(tokio::time::Instant::from_std(now));
                } else {
                    // Renewed meanwhile: watch the new deadline.
                    let mut q = self.lock();
                    q.by_deadline.insert((current, id));
                    q.leases.insert(id, (current, weak));
                }
            }
            q = self.lock();
        }
    }
}

#[cfg(test)]
pub(crate) fn is_watched(id: u64) -> bool {
    instance().lock().leases.contains_key(&id)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::memory::MemoryStore;
    use crate::{LeaseClient, LeaseConfig};

    #[tokio::test]
    async fn ended_leases_leave_the_watchdog() {
        let client = LeaseClient::new(
            Arc::new(MemoryStore::new()),
            LeaseConfig::new(Duration::from_secs(30)).unwrap(),
        );
        for i in 0..100 {
            let lease = client.try_acquire(format!("w:{i}")).await.unwrap();
            let id = lease.shared_id();
            assert!(super::is_watched(id));
            if i % 2 == 0 {
                lease.release().await.unwrap();
            } else {
                drop(lease);
            }
            assert!(
                !super::is_watched(id),
                "lease {i} still watched after it ended"
            );
        }
    }
}
