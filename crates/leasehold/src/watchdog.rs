//! A process-wide OS thread that fires lost signals at validity deadlines even when the
//! async runtime is starved (every worker blocked by CPU work), so user code selecting on
//! the lost signal from another runtime or thread still learns in time.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Instant as StdInstant;

use crate::lease::LeaseShared;

struct Item {
    deadline: StdInstant,
    lease: Weak<LeaseShared>,
}

impl PartialEq for Item {
    fn eq(&self, other: &Self) -> bool {
        self.deadline == other.deadline
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Item {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.deadline.cmp(&other.deadline)
    }
}

struct Watchdog {
    queue: Mutex<BinaryHeap<Reverse<Item>>>,
    wake: Condvar,
}

fn instance() -> &'static Watchdog {
    static W: OnceLock<&'static Watchdog> = OnceLock::new();
    W.get_or_init(|| {
        let w: &'static Watchdog = Box::leak(Box::new(Watchdog {
            queue: Mutex::new(BinaryHeap::new()),
            wake: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("leasehold-watchdog".into())
            .spawn(move || w.run())
            .expect("spawn the leasehold watchdog thread");
        w
    })
}

/// Watches `lease` until it ends, is lost, or passes its deadline.
pub(crate) fn watch(lease: &Arc<LeaseShared>) {
    instance().push(Item {
        deadline: lease.valid_until().into_std(),
        lease: Arc::downgrade(lease),
    });
}

impl Watchdog {
    fn push(&self, item: Item) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let earliest = q
            .peek()
            .is_none_or(|Reverse(top)| item.deadline < top.deadline);
        q.push(Reverse(item));
        drop(q);
        if earliest {
            self.wake.notify_one();
        }
    }

    fn run(&self) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = StdInstant::now();
            let Some(Reverse(top)) = q.peek() else {
                q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                continue;
            };
            if top.deadline > now {
                let wait = top.deadline - now;
                q = self
                    .wake
                    .wait_timeout(q, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                continue;
            }
            let Some(Reverse(item)) = q.pop() else {
                continue;
            };
            let Some(lease) = item.lease.upgrade() else {
                continue;
            };
            drop(q);
            if !lease.is_done() {
                let deadline = lease.valid_until().into_std();
                if deadline <= now {
                    // check() fires the lost signal with `Expired`.
                    lease.check(tokio::time::Instant::from_std(now));
                } else {
                    self.push(Item {
                        deadline,
                        lease: item.lease,
                    });
                }
            }
            q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        }
    }
}
