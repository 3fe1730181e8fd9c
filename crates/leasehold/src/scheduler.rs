//! The renewal scheduler: one task per client renews every lease of that client.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use crate::config::LeaseConfig;
use crate::error::{StoreError, StoreErrorKind};
use crate::key::Key;
use crate::lease::{LeaseShared, LostReason};
use crate::metrics as m;
use crate::store::{RenewOutcome, Store};
use crate::token::OwnerToken;

/// The longest the scheduler sleeps without looking at new and ended leases.
const IDLE: Duration = Duration::from_secs(1);

pub(crate) enum Command {
    /// Stop renewing and release best-effort (the handle was dropped).
    Drop(Arc<LeaseShared>),
    /// Release a grant whose acquire was cancelled or whose reply was ambiguous.
    ReleaseOrphan(Key, OwnerToken),
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
    planned: Option<Instant>,
}

impl Inbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, InboxState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SchedulerHandle {
    /// Spawns the scheduler on the current tokio runtime.
    pub(crate) fn spawn(store: Arc<dyn Store>, config: LeaseConfig) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let inbox = Arc::new(Inbox::default());
        tokio::spawn(Scheduler::new(store, config, rx, inbox.clone()).run());
        Self { tx, inbox }
    }

    /// Starts renewing `lease`, whose first event is at `first_event`.
    pub(crate) fn register(&self, lease: Arc<LeaseShared>, first_event: Instant) {
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
}

struct Entry {
    shared: Arc<LeaseShared>,
    next_renew: Instant,
    max_hold_at: Option<Instant>,
    in_flight: bool,
    failures: u32,
    unreachable_failures: u32,
    renewals: u64,
}

impl Entry {
    /// The next instant at which this entry needs attention.
    fn next_event(&self) -> Instant {
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
        sent_at: Instant,
        result: Result<RenewOutcome, StoreError>,
    },
    Release,
}

struct Scheduler {
    store: Arc<dyn Store>,
    config: LeaseConfig,
    rx: mpsc::UnboundedReceiver<Command>,
    inbox: Arc<Inbox>,
    entries: HashMap<u64, Entry>,
    inflight: FuturesUnordered<BoxFuture<'static, Done>>,
}

impl Scheduler {
    fn new(
        store: Arc<dyn Store>,
        config: LeaseConfig,
        rx: mpsc::UnboundedReceiver<Command>,
        inbox: Arc<Inbox>,
    ) -> Self {
        Self {
            store,
            config,
            rx,
            inbox,
            entries: HashMap::new(),
            inflight: FuturesUnordered::new(),
        }
    }

    async fn run(mut self) {
        let mut open = true;
        loop {
            let new = std::mem::take(&mut self.inbox.lock().new);
            for shared in new {
                self.add(shared);
            }
            self.tick(Instant::now());
            if !open && self.entries.is_empty() && self.inflight.is_empty() {
                // Every handle is gone, so nothing can arrive in the inbox any more.
                return;
            }
            let wake = self
                .entries
                .values()
                .map(Entry::next_event)
                .min()
                .unwrap_or_else(|| Instant::now() + IDLE)
                .min(Instant::now() + IDLE);
            {
                let mut st = self.inbox.lock();
                if !st.new.is_empty() {
                    continue;
                }
                st.planned = Some(wake);
            }
            tokio::select! {
                cmd = self.rx.recv(), if open => match cmd {
                    Some(cmd) => self.command(cmd),
                    None => open = false,
                },
                Some(done) = self.inflight.next(), if !self.inflight.is_empty() => self.done(done),
                () = self.inbox.wake.notified() => {}
                () = tokio::time::sleep_until(wake) => {}
            }
            self.inbox.lock().planned = None;
        }
    }

    fn add(&mut self, shared: Arc<LeaseShared>) {
        let acquired_at = shared.acquired_at;
        let entry = Entry {
            next_renew: acquired_at + self.config.renew_interval(),
            max_hold_at: self.config.max_hold().map(|d| acquired_at + d),
            shared: shared.clone(),
            in_flight: false,
            failures: 0,
            unreachable_failures: 0,
            renewals: 0,
        };
        self.entries.insert(shared.id, entry);
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Drop(shared) => {
                self.entries.remove(&shared.id);
                self.release(shared.key.clone(), shared.owner);
            }
            Command::ReleaseOrphan(key, owner) => self.release(key, owner),
        }
    }

    fn release(&mut self, key: Key, owner: OwnerToken) {
        let store = self.store.clone();
        let timeout = self.config.op_timeout();
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

    /// Does whatever is due at `now`: bounded-hold checks, deadlines, renewals.
    fn tick(&mut self, now: Instant) {
        let mut lost = Vec::new();
        let mut renew = Vec::new();
        for (&id, e) in &mut self.entries {
            if e.shared.is_done() {
                lost.push((id, None));
                continue;
            }
            if e.max_hold_at.is_some_and(|t| now >= t) {
                lost.push((id, Some(LostReason::MaxHoldExceeded)));
                continue;
            }
            if now >= e.shared.valid_until() {
                let reason = if e.unreachable_failures > 0 {
                    LostReason::StoreUnavailable
                } else {
                    LostReason::Expired
                };
                lost.push((id, Some(reason)));
                continue;
            }
            if !e.in_flight && now >= e.next_renew {
                if self.config.max_renewals().is_some_and(|m| e.renewals >= m) {
                    lost.push((id, Some(LostReason::MaxHoldExceeded)));
                    continue;
                }
                e.in_flight = true;
                renew.push((id, e.shared.clone()));
            }
        }
        for (id, reason) in lost {
            match reason {
                Some(r) => self.lose(id, r),
                None => {
                    self.entries.remove(&id);
                }
            }
        }
        for (id, shared) in renew {
            self.start_renewal(id, shared, now);
        }
    }

    fn start_renewal(&mut self, id: u64, shared: Arc<LeaseShared>, now: Instant) {
        let store = self.store.clone();
        let ttl = self.config.ttl();
        // Never wait for a reply past the deadline: it would be useless then.
        let budget = self
            .config
            .op_timeout()
            .min(shared.valid_until().saturating_duration_since(now));
        self.inflight.push(Box::pin(async move {
            let sent_at = Instant::now();
            let result = StoreError::bounded(
                store.backend(),
                "renew",
                budget,
                store.renew(&shared.key, &shared.owner, ttl),
            )
            .await;
            Done::Renew {
                id,
                sent_at,
                result,
            }
        }));
    }

    fn done(&mut self, done: Done) {
        let Done::Renew {
            id,
            sent_at,
            result,
        } = done
        else {
            return;
        };
        let now = Instant::now();
        let Some(e) = self.entries.get_mut(&id) else {
            return; // released or lost meanwhile
        };
        e.in_flight = false;
        let latency = now.saturating_duration_since(sent_at);
        let backend = self.store.backend();
        let rt = e.shared.key.resource_type().to_owned();
        match result {
            Ok(RenewOutcome::Renewed { ttl }) => {
                m::renewed(backend, &rt, "renewed", latency);
                let until = sent_at + self.config.validity(ttl.min(self.config.ttl()));
                if now < until && e.shared.extend(until, now) {
                    e.failures = 0;
                    e.unreachable_failures = 0;
                    e.renewals += 1;
                    e.next_renew = sent_at + self.config.renew_interval();
                    tracing::trace!(key = %e.shared.key, fence = e.shared.fence.get(), latency_us = latency.as_micros() as u64, "renewed");
                } else {
                    // The reply came after the deadline (a frozen process, a starved
                    // runtime): the lease was not provably held in between.
                    self.lose(id, LostReason::Expired);
                }
            }
            Ok(RenewOutcome::NotOwner) => {
                m::renewed(backend, &rt, "not_owner", latency);
                self.lose(id, LostReason::NotOwner);
            }
            Err(err) => {
                m::renewed(backend, &rt, "error", latency);
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
                    self.lose(id, reason);
                } else {
                    e.next_renew = now + retry_delay(&self.config);
                }
            }
        }
    }
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
/// its maximum hold, whichever is first.
fn first_event(shared: &LeaseShared, config: &LeaseConfig) -> Instant {
    let mut t = (shared.acquired_at + config.renew_interval()).min(shared.valid_until());
    if let Some(mh) = config.max_hold() {
        t = t.min(shared.acquired_at + mh);
    }
    t
}
