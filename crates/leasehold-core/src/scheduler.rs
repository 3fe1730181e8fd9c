//! The renewal scheduler: one task per client renews every lease of that client.
//!
//! Each lease has one next event (its next renewal, its validity deadline or its maximum
//! hold, whichever is first) in a min-heap, so the work per event is `O(log n)` in the
//! number of leases the client holds, never a walk over all of them: a client holding
//! 100,000 leases does the same work per renewal as one holding ten.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::clock::{At, LeaseClock, SUSPEND_CHECK};
use crate::config::LeaseConfig;
use crate::error::{StoreError, StoreErrorKind};
use crate::key::Key;
use crate::lease::{LeaseShared, LostReason};
use crate::metrics as m;
use crate::observer::{LeaseObserver, RenewalEvent, RenewalPhase};
use crate::store::{RenewOutcome, Store};
use crate::token::OwnerToken;

/// The longest the scheduler sleeps when it holds no lease.
const IDLE: Duration = Duration::from_secs(1);

pub(crate) enum Command {
    /// Stop renewing and release best-effort (the handle was dropped).
    Drop(Arc<LeaseShared>),
    /// Release a grant whose acquire was cancelled or whose reply was ambiguous.
    ReleaseOrphan(Key, OwnerToken),
    /// Stop renewing every lease and fire its lost signal with `Shutdown`; leases
    /// registered later get the same at once.
    Shutdown(oneshot::Sender<()>),
    /// Answer once no release is in flight.
    Flush(oneshot::Sender<()>),
}

/// The sending side; cheap to clone. The task ends when every handle is gone and its
/// in-flight work is done.
///
/// New leases go through an inbox that wakes the task only when the lease needs attention
/// before the task's planned wake-up; ended leases are dropped when the task next looks.
/// So an acquire/release pair costs the scheduler no wake-up at all on the hot path.
#[derive(Clone, Debug)]
pub(crate) struct SchedulerHandle {
    tx: mpsc::UnboundedSender<Command>,
    inbox: Arc<Inbox>,
    #[cfg(test)]
    pub(crate) visits: Arc<std::sync::atomic::AtomicU64>,
}

#[derive(Debug, Default)]
struct Inbox {
    state: Mutex<InboxState>,
    wake: Notify,
}

#[derive(Debug, Default)]
struct InboxState {
    new: Vec<Arc<LeaseShared>>,
    /// When the task will wake up by itself; `None` while it is awake (it drains the inbox
    /// before sleeping again).
    planned: Option<At>,
}

impl Inbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, InboxState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SchedulerHandle {
    /// Spawns the scheduler on the current tokio runtime.
    pub(crate) fn spawn(
        store: Arc<dyn Store>,
        config: LeaseConfig,
        clock: LeaseClock,
        observer: Option<Arc<dyn LeaseObserver>>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let inbox = Arc::new(Inbox::default());
        let sched = Scheduler {
            store,
            config,
            clock,
            observer,
            rx,
            inbox: inbox.clone(),
            entries: HashMap::new(),
            heap: BinaryHeap::new(),
            inflight: FuturesUnordered::new(),
            releases_in_flight: 0,
            flush_waiters: Vec::new(),
            shutting_down: false,
            #[cfg(test)]
            visits: Default::default(),
        };
        #[cfg(test)]
        let visits = sched.visits.clone();
        tokio::spawn(sched.run());
        Self {
            tx,
            inbox,
            #[cfg(test)]
            visits,
        }
    }

    /// Starts renewing `lease`, whose first event is at `first_event`.
    pub(crate) fn register(&self, lease: Arc<LeaseShared>, first_event: At) {
        let wake = {
            let mut st = self.inbox.lock();
            st.new.push(lease);
            st.planned.is_some_and(|planned| first_event < planned)
        };
        if wake {
            self.inbox.wake.notify_one();
        }
    }
    pub(crate) fn drop_lease(&self, lease: Arc<LeaseShared>) {
        let _ = self.tx.send(Command::Drop(lease));
    }
    pub(crate) fn release_orphan(&self, key: Key, owner: OwnerToken) {
        let _ = self.tx.send(Command::ReleaseOrphan(key, owner));
    }
    /// Stops every renewal; resolves once the scheduler has fired every lost signal.
    pub(crate) async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::Shutdown(tx)).is_ok() {
            let _ = rx.await;
        }
    }
    /// Resolves once every release queued so far has been answered or timed out.
    pub(crate) async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

struct Entry {
    shared: Arc<LeaseShared>,
    next_renew: At,
    max_hold_at: Option<At>,
    in_flight: bool,
    failures: u32,
    unreachable_failures: u32,
    renewals: u64,
    /// Bumped whenever the entry is rescheduled: heap items of older generations are
    /// stale and skipped.
    generation: u64,
}

impl Entry {
    /// The next instant at which this entry needs attention.
    fn next_event(&self) -> At {
        let mut t = self.shared.valid_until();
        if !self.in_flight {
            t = t.min(self.next_renew);
        }
        if let Some(mh) = self.max_hold_at {
            t = t.min(mh);
        }
        t
    }
}

enum Done {
    Renew {
        id: u64,
        shared: Arc<LeaseShared>,
        sent_at: At,
        result: Result<RenewOutcome, StoreError>,
    },
    Release,
    /// A renewal not sent: the lease was past its deadline, lost or let go by then.
    Skipped {
        id: u64,
    },
}

struct Scheduler {
    store: Arc<dyn Store>,
    config: LeaseConfig,
    clock: LeaseClock,
    observer: Option<Arc<dyn LeaseObserver>>,
    rx: mpsc::UnboundedReceiver<Command>,
    inbox: Arc<Inbox>,
    entries: HashMap<u64, Entry>,
    /// `(when, lease id, generation)`, earliest first.
    heap: BinaryHeap<Reverse<(At, u64, u64)>>,
    inflight: FuturesUnordered<BoxFuture<'static, Done>>,
    releases_in_flight: usize,
    flush_waiters: Vec<oneshot::Sender<()>>,
    shutting_down: bool,
    /// Entries looked at, for the test that bounds the work per event.
    #[cfg(test)]
    visits: Arc<std::sync::atomic::AtomicU64>,
}

impl Scheduler {
    async fn run(mut self) {
        let mut open = true;
        loop {
            let new = std::mem::take(&mut self.inbox.lock().new);
            for shared in new {
                self.add(shared);
            }
            self.run_due(self.clock.now());
            if !open && self.entries.is_empty() && self.inflight.is_empty() {
                // Every handle is gone, so nothing can arrive in the inbox any more.
                return;
            }
            let now = self.clock.now();
            // While leases are held, look at the clock often enough to notice a host
            // suspend (timers sleep on the monotonic clock, which stops meanwhile).
            let cap = if self.entries.is_empty() {
                IDLE
            } else {
                SUSPEND_CHECK
            };
            let mut wake = now.add(cap);
            if let Some(Reverse((t, _, _))) = self.heap.peek() {
                wake = wake.min(*t);
            }
            {
                let mut st = self.inbox.lock();
                if !st.new.is_empty() {
                    continue;
                }
                st.planned = Some(wake);
            }
            let sleep_until = self.clock.to_tokio(wake);
            tokio::select! {
                cmd = self.rx.recv(), if open => match cmd {
                    Some(cmd) => self.command(cmd),
                    None => open = false,
                },
                Some(done) = self.inflight.next(), if !self.inflight.is_empty() => self.done(done),
                () = self.inbox.wake.notified() => {}
                () = tokio::time::sleep_until(sleep_until) => {}
            }
            self.inbox.lock().planned = None;
        }
    }

    fn add(&mut self, shared: Arc<LeaseShared>) {
        if self.shutting_down {
            shared.mark_lost(LostReason::Shutdown);
            return;
        }
        // Every schedule counts from the send of the request that granted the lease.
        let acquired_at = shared.acquired_at;
        let entry = Entry {
            next_renew: acquired_at.add(self.config.renew_interval()),
            max_hold_at: self.config.max_hold().map(|d| acquired_at.add(d)),
            shared: shared.clone(),
            in_flight: false,
            failures: 0,
            unreachable_failures: 0,
            renewals: 0,
            generation: 0,
        };
        self.entries.insert(shared.id, entry);
        self.schedule(shared.id);
    }

    /// Pushes entry `id`'s next event onto the heap (making older items stale).
    fn schedule(&mut self, id: u64) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.generation += 1;
            self.heap.push(Reverse((e.next_event(), id, e.generation)));
        }
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Drop(shared) => {
                self.entries.remove(&shared.id);
                self.release(shared.key.clone(), shared.owner);
            }
            Command::ReleaseOrphan(key, owner) => self.release(key, owner),
            Command::Shutdown(reply) => {
                self.shutting_down = true;
                for (_, e) in self.entries.drain() {
                    e.shared.mark_lost(LostReason::Shutdown);
                }
                self.heap.clear();
                let _ = reply.send(());
            }
            Command::Flush(reply) => {
                if self.releases_in_flight == 0 {
                    let _ = reply.send(());
                } else {
                    self.flush_waiters.push(reply);
                }
            }
        }
    }

    fn release(&mut self, key: Key, owner: OwnerToken) {
        let store = self.store.clone();
        let timeout = self.config.op_timeout();
        self.releases_in_flight += 1;
        self.inflight.push(Box::pin(async move {
            let res = tokio::time::timeout(timeout, store.release(&key, &owner)).await;
            tracing::debug!(%key, %owner, result = ?res, "background release");
            Done::Release
        }));
    }

    /// Loses the lease of entry `id` and forgets the entry.
    ///
    /// The lease stays in the store: the holder's code may still be running, so only the
    /// holder frees it (by releasing or dropping its handle), or the store expires it.
    fn lose(&mut self, id: u64, reason: LostReason) {
        if let Some(e) = self.entries.remove(&id) {
            e.shared.mark_lost(reason);
        }
    }

    /// Handles every heap item due at `now`.
    fn run_due(&mut self, now: At) {
        while let Some(&Reverse((t, id, generation))) = self.heap.peek() {
            if t > now {
                break;
            }
            self.heap.pop();
            self.visit(id, generation, now);
        }
    }

    /// Does whatever is due for entry `id` at `now`: bounded-hold checks, the deadline,
    /// the renewal.
    fn visit(&mut self, id: u64, generation: u64, now: At) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        if e.generation != generation {
            return;
        }
        #[cfg(test)]
        self.visits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if e.shared.is_done() {
            self.entries.remove(&id);
            return;
        }
        if e.max_hold_at.is_some_and(|t| now >= t) {
            return self.lose(id, LostReason::MaxHoldExceeded);
        }
        if now >= e.shared.valid_until() {
            let reason = if e.unreachable_failures > 0 {
                LostReason::StoreUnavailable
            } else {
                LostReason::Expired
            };
            return self.lose(id, reason);
        }
        if !e.in_flight && now >= e.next_renew {
            if self.config.max_renewals().is_some_and(|m| e.renewals >= m) {
                return self.lose(id, LostReason::MaxHoldExceeded);
            }
            e.in_flight = true;
            let shared = e.shared.clone();
            self.start_renewal(id, shared, now);
        }
        self.schedule(id);
    }

    fn start_renewal(&mut self, id: u64, shared: Arc<LeaseShared>, now: At) {
        let store = self.store.clone();
        let ttl = self.config.ttl();
        let clock = self.clock.clone();
        let observer = self.observer.clone();
        // Never wait for a reply past the deadline: it would be useless then.
        let budget = self
            .config
            .op_timeout()
            .min(shared.valid_until().since(now));
        self.inflight.push(Box::pin(async move {
            let sent_at = clock.now();
            // Looked at again when the request is really about to go (the task may have
            // been preempted or the process frozen since the scheduler decided to renew):
            // a renewal is never sent for a lease past its deadline, lost or let go.
            if !shared.is_held_at(sent_at) {
                return Done::Skipped { id };
            }
            if let Some(o) = &observer {
                observe(o.as_ref(), &shared, RenewalPhase::Sent, sent_at);
            }
            let result = StoreError::bounded(
                store.backend(),
                "renew",
                budget,
                store.renew(&shared.key, &shared.owner, ttl),
            )
            .await;
            Done::Renew {
                id,
                shared,
                sent_at,
                result,
            }
        }));
    }

    fn done(&mut self, done: Done) {
        let (id, shared, sent_at, result) = match done {
            Done::Renew {
                id,
                shared,
                sent_at,
                result,
            } => (id, shared, sent_at, result),
            Done::Skipped { id } => {
                if let Some(e) = self.entries.get_mut(&id) {
                    e.in_flight = false;
                    // Its next event (the deadline, now past) loses it, unless it ended.
                    self.schedule(id);
                }
                return;
            }
            Done::Release => {
                self.releases_in_flight -= 1;
                if self.releases_in_flight == 0 {
                    for w in self.flush_waiters.drain(..) {
                        let _ = w.send(());
                    }
                }
                return;
            }
        };
        let now = self.clock.now();
        let Some(e) = self.entries.get_mut(&id) else {
            // Released, lost or shut down meanwhile: the reply changes nothing.
            if let Some(o) = &self.observer {
                let phase = match result {
                    Ok(RenewOutcome::Renewed { .. }) => RenewalPhase::Refused,
                    Ok(RenewOutcome::NotOwner) => RenewalPhase::NotOwner,
                    Err(_) => RenewalPhase::Failed,
                };
                observe(o.as_ref(), &shared, phase, now);
            }
            return;
        };
        e.in_flight = false;
        let latency = now.since(sent_at);
        let backend = self.store.backend();
        let rt = e.shared.key.resource_type();
        let observer = self.observer.clone();
        let report = |shared: &LeaseShared, phase| {
            if let Some(o) = &observer {
                observe(o.as_ref(), shared, phase, now);
            }
        };
        match result {
            Ok(RenewOutcome::Renewed { ttl }) => {
                m::renewed(backend, rt, "renewed", latency);
                let until = sent_at.add(self.config.validity(ttl.min(self.config.ttl())));
                let replaced = if now < until {
                    e.shared.extend(until, now)
                } else {
                    None
                };
                if let Some(old_deadline) = replaced {
                    m::renewal_slack(backend, rt, old_deadline.since(now));
                }
                let accepted = replaced.is_some();
                report(
                    &e.shared,
                    if accepted {
                        RenewalPhase::Accepted
                    } else {
                        RenewalPhase::Refused
                    },
                );
                if accepted {
                    e.failures = 0;
                    e.unreachable_failures = 0;
                    e.renewals += 1;
                    e.next_renew = sent_at.add(self.config.renew_interval());
                    tracing::trace!(key = %e.shared.key, fence = e.shared.fence.get(), latency_us = latency.as_micros() as u64, "renewed");
                } else {
                    // The reply came after the deadline (a frozen process, a starved
                    // runtime): the lease was not provably held in between.
                    return self.lose(id, LostReason::Expired);
                }
            }
            Ok(RenewOutcome::NotOwner) => {
                m::renewed(backend, rt, "not_owner", latency);
                report(&e.shared, RenewalPhase::NotOwner);
                return self.lose(id, LostReason::NotOwner);
            }
            Err(err) => {
                m::renewed(backend, rt, "error", latency);
                report(&e.shared, RenewalPhase::Failed);
                e.failures += 1;
                if matches!(
                    err.kind(),
                    StoreErrorKind::Unavailable
                        | StoreErrorKind::Timeout
                        | StoreErrorKind::Ambiguous
                ) {
                    e.unreachable_failures += 1;
                }
                tracing::warn!(key = %e.shared.key, owner = %e.shared.owner, fence = e.shared.fence.get(), failures = e.failures, error = %err, "renewal failed");
                if e.failures >= self.config.renew_failures_before_lost() {
                    let reason = if e.unreachable_failures == e.failures {
                        LostReason::StoreUnavailable
                    } else {
                        LostReason::RenewFailed {
                            attempts: e.failures,
                        }
                    };
                    return self.lose(id, reason);
                }
                e.next_renew = now.add(retry_delay(&self.config));
            }
        }
        self.schedule(id);
    }
}

/// Reports a renewal event of `shared` at `now` to `observer`.
fn observe(observer: &dyn LeaseObserver, shared: &LeaseShared, phase: RenewalPhase, now: At) {
    observer.renewal(&RenewalEvent {
        key: &shared.key,
        owner: &shared.owner,
        fence: shared.fence,
        phase,
        remaining: shared.valid_until().since(now),
        lost: shared.lost_reason().is_some(),
    });
}

/// Delay before retrying a failed renewal: a quarter of the renew interval.
fn retry_delay(config: &LeaseConfig) -> Duration {
    config.renew_interval() / 4
}

/// Registers a lease with the scheduler and, if configured, the watchdog thread.
pub(crate) fn track(sched: &SchedulerHandle, shared: &Arc<LeaseShared>, config: &LeaseConfig) {
    sched.register(shared.clone(), first_event(shared, config));
    if config.watchdog_thread() {
        shared.watch();
    }
}

/// The first instant a new lease needs the scheduler: its first renewal, its deadline or
/// its maximum hold, whichever is first, all counted from the acquire's send.
fn first_event(shared: &LeaseShared, config: &LeaseConfig) -> At {
    let mut t = shared
        .acquired_at
        .add(config.renew_interval())
        .min(shared.valid_until());
    if let Some(mh) = config.max_hold() {
        t = t.min(shared.acquired_at.add(mh));
    }
    t
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::memory::MemoryStore;
    use crate::{LeaseClient, LeaseConfig};

    /// The scheduler looks at one entry per renewal (and a few more per lease), however
    /// many leases it holds: 10,000 leases with renewals spread over the interval cost
    /// about one visit per renewal. A scheduler that walks every lease at each wake-up
    /// would make about 10,000 visits per renewal here.
    #[tokio::test(start_paused = true)]
    async fn work_per_renewal_does_not_grow_with_the_number_of_leases() {
        const N: u64 = 10_000;
        let ttl = Duration::from_secs(3);
        let cfg = LeaseConfig::builder(ttl)
            .watchdog_thread(false)
            .build()
            .unwrap();
        let client = LeaseClient::new(Arc::new(MemoryStore::new()), cfg);
        let mut leases = Vec::new();
        for i in 0..N {
            leases.push(client.try_acquire(format!("w:{i}")).await.unwrap());
            tokio::time::sleep(Duration::from_micros(100)).await;
        }
        let hold = Duration::from_secs(30);
        tokio::time::sleep(hold).await;
        assert!(leases.iter().all(|l| l.is_valid()));
        // Renewals every ttl / 3 = 1 s, over ~31 s.
        let renewals = N * 31;
        let visits = client.scheduler_visits();
        assert!(visits >= renewals / 2, "{visits} visits: not renewing?");
        assert!(
            visits <= 2 * renewals + 3 * N,
            "{visits} visits for about {renewals} renewals of {N} leases"
        );
    }
}
