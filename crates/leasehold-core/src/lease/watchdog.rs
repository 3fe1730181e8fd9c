//! A process-wide OS thread that fires lost signals at validity deadlines even when the
//! async runtime is starved (every worker blocked by CPU work), so user code selecting on
//! the lost signal from another runtime or thread still learns in time.
//!
//! Leases are removed when they end, so the thread only ever holds live leases and wakes
//! only at real deadlines — and, while it holds leases, every
//! [`SUSPEND_CHECK`](crate::clock::SUSPEND_CHECK) to notice a host suspend (deadlines
//! count suspended time; its sleep does not).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant as StdInstant};

use crate::clock::SUSPEND_CHECK;

/// The longest the thread sleeps when it watches no lease; a lease whose deadline is
/// later than the thread's planned wake-up is added without waking it.
const IDLE: Duration = Duration::from_secs(1);

/// What the thread watches: a lease's deadline, and the check that fires its lost signal.
pub(crate) trait Watched: Send + Sync {
    /// Process-wide unique id.
    fn id(&self) -> u64;
    /// The monotonic instant at which the deadline passes, given the suspension so far.
    fn monotonic_deadline(&self) -> StdInstant;
    /// Checks the deadline now, firing the lost signal once it has passed: `true` while
    /// the lease is still held (renewed meanwhile).
    fn check_now(&self) -> bool;
}

/// Set when a clock moved by a suspend, so every deadline must be converted again.
static CLOCK_MOVED: AtomicBool = AtomicBool::new(false);

#[derive(Default)]
struct Queue {
    /// Deadlines converted to the monotonic clock with the suspension known when they
    /// were queued.
    by_deadline: BTreeSet<(StdInstant, u64)>,
    leases: HashMap<u64, (StdInstant, Weak<dyn Watched>)>,
    /// When the thread wakes up by itself; `None` while it is awake.
    sleeping_until: Option<StdInstant>,
    /// The host's suspended time when the deadlines were last converted.
    suspended: Duration,
}

/// A clock moved forward by a suspend (a [`ManualClock`](crate::clock::ManualClock) in
/// tests): convert every deadline again at once.
fn clock_moved() {
    CLOCK_MOVED.store(true, Ordering::Release);
    if let Some(w) = INSTANCE.get() {
        w.wake.notify_one();
    }
}

struct Watchdog {
    queue: Mutex<Queue>,
    wake: Condvar,
}

static INSTANCE: OnceLock<&'static Watchdog> = OnceLock::new();

fn instance() -> &'static Watchdog {
    INSTANCE.get_or_init(|| {
        let w: &'static Watchdog = Box::leak(Box::new(Watchdog {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("leasehold-watchdog".into())
            .spawn(move || w.run())
            .expect("spawn the leasehold watchdog thread");
        crate::clock::on_move(clock_moved);
        w
    })
}

/// Watches `lease` until [`unwatch`] or its deadline passes without a renewal.
pub(crate) fn watch(lease: Arc<dyn Watched>) {
    let w = instance();
    let deadline = lease.monotonic_deadline();
    let mut q = w.lock();
    // Wake the thread only if it would otherwise sleep past this deadline.
    let earliest = q.sleeping_until.is_some_and(|until| deadline < until);
    q.by_deadline.insert((deadline, lease.id()));
    q.leases
        .insert(lease.id(), (deadline, Arc::downgrade(&lease)));
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

    /// Converts every queued deadline again after a suspend moved the clocks.
    fn rekey(q: &mut Queue) {
        let leases = std::mem::take(&mut q.leases);
        q.by_deadline.clear();
        for (id, (old, weak)) in leases {
            let deadline = weak.upgrade().map_or(old, |l| l.monotonic_deadline());
            q.by_deadline.insert((deadline, id));
            q.leases.insert(id, (deadline, weak));
        }
    }

    fn run(&self) {
        let mut q = self.lock();
        loop {
            let suspended = crate::clock::system_suspended();
            if CLOCK_MOVED.swap(false, Ordering::AcqRel) || suspended != q.suspended {
                q.suspended = suspended;
                Self::rekey(&mut q);
            }
            let now = StdInstant::now();
            let first = q.by_deadline.first().copied();
            let (deadline, id) = match first {
                Some((deadline, id)) if deadline <= now => (deadline, id),
                _ => {
                    let cap = if q.leases.is_empty() {
                        IDLE
                    } else {
                        SUSPEND_CHECK
                    };
                    let until = first.map_or(now + cap, |(d, _)| d.min(now + cap));
                    q.sleeping_until = Some(until);
                    q = self
                        .wake
                        .wait_timeout(q, until - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    q.sleeping_until = None;
                    #[cfg(test)]
                    WAKES.fetch_add(1, Ordering::Relaxed);
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
            // check() fires the lost signal with `Expired` once the deadline has passed.
            if lease.check_now() {
                // Renewed meanwhile: watch the new deadline (never in the past, so a
                // rounding difference between the clocks cannot make the thread spin).
                let current = lease
                    .monotonic_deadline()
                    .max(now + Duration::from_millis(1));
                let mut q = self.lock();
                q.by_deadline.insert((current, id));
                q.leases.insert(id, (current, weak));
            }
            q = self.lock();
        }
    }
}

/// How often the thread woke from a sleep, for the test that bounds it.
#[cfg(test)]
static WAKES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[cfg(test)]
pub(crate) fn is_watched(id: u64) -> bool {
    instance().lock().leases.contains_key(&id)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::store::memory::MemoryStore;
    use crate::{LeaseClient, LeaseConfig};

    /// The thread sleeps until the next deadline, looking at the clock every
    /// `SUSPEND_CHECK` at the most while it holds leases: a lease of 30 s watched for
    /// 1.5 s costs a handful of wake-ups, never a busy loop.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn the_thread_does_not_spin() {
        use std::sync::atomic::Ordering;
        let client = LeaseClient::new(
            Arc::new(MemoryStore::new()),
            LeaseConfig::new(Duration::from_secs(30)).unwrap(),
        );
        let lease = client.try_acquire("w:spin").await.unwrap();
        let before = super::WAKES.load(Ordering::Relaxed);
        let start = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // A loaded machine may run the thread late: look longer (up to 10 s) for the
        // three wake-ups that show it checks for suspends, and judge spinning by the rate.
        while super::WAKES.load(Ordering::Relaxed) - before < 3
            && start.elapsed() < Duration::from_secs(10)
        {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let wakes = super::WAKES.load(Ordering::Relaxed) - before;
        let secs = start.elapsed().as_secs_f64();
        // About 4 a second (every 250 ms); other tests' leases in this process add a few.
        assert!(
            (wakes as f64) < 130.0 * secs,
            "{wakes} wake-ups in {secs:.1} s"
        );
        assert!(
            wakes >= 3,
            "{wakes} wake-ups in {secs:.1} s: not checking for suspends"
        );
        drop(lease);
    }

    /// Records when the thread checked it, and is past its deadline then.
    struct Probe {
        deadline: std::time::Instant,
        checked: std::sync::Mutex<std::sync::mpsc::Sender<std::time::Instant>>,
    }

    impl super::Watched for Probe {
        fn id(&self) -> u64 {
            // Far from the ids of the leases of other tests in this process.
            u64::MAX - 26
        }
        fn monotonic_deadline(&self) -> std::time::Instant {
            self.deadline
        }
        fn check_now(&self) -> bool {
            let _ = self.checked.lock().unwrap().send(std::time::Instant::now());
            false
        }
    }

    /// A lease due before the thread's planned wake-up wakes it: its deadline is checked
    /// (its lost signal fired) at once, not when the thread would have looked anyway — a
    /// second later while it watches nothing, `SUSPEND_CHECK` later while it watches leases.
    #[test]
    fn a_lease_due_before_the_planned_wake_up_is_checked_at_once() {
        use std::time::Instant;
        let w = super::instance();
        // Wait until the thread sleeps with at least 200 ms to go (it sleeps a second
        // when it watches nothing, as in a process of its own).
        let start = Instant::now();
        let planned = loop {
            let now = Instant::now();
            if let Some(until) = w.lock().sleeping_until
                && until > now + Duration::from_millis(200)
            {
                break until;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the watchdog thread never slept"
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        let (tx, rx) = std::sync::mpsc::channel();
        // The thread holds a weak reference: the probe lives as long as the test.
        let probe = Arc::new(Probe {
            deadline: Instant::now(),
            checked: std::sync::Mutex::new(tx),
        });
        super::watch(probe.clone());
        let checked = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the deadline is checked");
        assert!(
            checked < planned,
            "checked {:?} after the planned wake-up, not at the deadline",
            checked - planned
        );
        drop(probe);
    }

    /// Found still held at each of its first 20 checks, with a deadline that does not move
    /// on (the lease clock and the thread's rounding apart): records whether the thread
    /// slept between two checks.
    struct Stuck {
        deadline: std::time::Instant,
        checks: std::sync::atomic::AtomicU64,
        wakes_at_last_check: std::sync::atomic::AtomicU64,
        slept_between_checks: std::sync::atomic::AtomicBool,
    }

    impl super::Watched for Stuck {
        fn id(&self) -> u64 {
            u64::MAX - 27
        }
        fn monotonic_deadline(&self) -> std::time::Instant {
            self.deadline
        }
        fn check_now(&self) -> bool {
            use std::sync::atomic::Ordering;
            let wakes = super::WAKES.load(Ordering::Relaxed);
            let before = self.wakes_at_last_check.swap(wakes, Ordering::Relaxed);
            let n = self.checks.fetch_add(1, Ordering::Relaxed);
            if n > 0 && wakes != before {
                self.slept_between_checks.store(true, Ordering::Relaxed);
            }
            n < 20
        }
    }

    /// A lease found still held whose deadline has not moved past the thread's clock is
    /// looked at again after a sleep, never in a busy loop: the thread queues it at least
    /// a millisecond ahead.
    #[test]
    fn a_held_lease_with_a_deadline_not_ahead_does_not_make_the_thread_spin() {
        use std::sync::atomic::Ordering;
        let stuck = Arc::new(Stuck {
            deadline: std::time::Instant::now(),
            checks: Default::default(),
            wakes_at_last_check: Default::default(),
            slept_between_checks: Default::default(),
        });
        super::watch(stuck.clone());
        let start = std::time::Instant::now();
        while stuck.checks.load(Ordering::Relaxed) <= 20 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "checked {} times",
                stuck.checks.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            stuck.slept_between_checks.load(Ordering::Relaxed),
            "20 checks with no sleep in between: the thread spins"
        );
    }

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

    /// A renewal that moves a deadline earlier hands the new deadline to the watchdog only
    /// for a lease it watches: a client built without the watchdog thread never gets its
    /// leases watched that way; a watched lease stays watched.
    #[tokio::test(start_paused = true)]
    async fn a_deadline_moved_earlier_is_watched_only_if_the_lease_was() {
        let store = Arc::new(MemoryStore::new());
        for watchdog in [false, true] {
            let cfg = LeaseConfig::builder(Duration::from_secs(30))
                .watchdog_thread(watchdog)
                .build()
                .unwrap();
            let client = LeaseClient::new(store.clone(), cfg);
            let lease = client
                .try_acquire(format!("moved:{watchdog}"))
                .await
                .unwrap();
            let id = lease.shared_id();
            assert_eq!(super::is_watched(id), watchdog);
            let shared = lease.shared();
            let now = shared.clock.now();
            let earlier = now.add(Duration::from_secs(5));
            assert!(
                shared
                    .extend(earlier, Duration::from_secs(6), now)
                    .is_some()
            );
            assert_eq!(super::is_watched(id), watchdog, "watchdog {watchdog}");
            drop(lease);
        }
    }
}
