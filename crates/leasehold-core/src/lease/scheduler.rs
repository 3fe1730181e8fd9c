//! The renewal scheduler: one task per client renews every lease of that client.
//!
//! Each lease has its next renewal in one ordered index and its next check (its validity
//! deadline or its maximum hold, whichever is first) in another, both exact (an entry is
//! moved, never left behind stale), so the work per event is `O(log n)` in the number of
//! leases the client holds, never a walk over all of them, and the memory is fixed per
//! lease (an entry of 64 bytes in a hash table and an item of 24 bytes in each index,
//! about 200 bytes with the tables' room to grow): a client holding 100,000 leases does
//! the same work per renewal as one holding ten.
//!
//! Renewals go to the store in batches ([`renew_many`](crate::renew_many): the store's
//! [`BatchStore`](crate::BatchStore), or each renewal on its own at once, at most [`RENEW_BATCH`]
//! leases each). The renewals due at one wake-up form a batch; a batch with room left takes
//! the renewals due within the next [`COALESCE`] of the renew interval too (renewing a
//! lease a little early is always safe: its deadline counts from the batch's send). So
//! leases acquired at scattered instants fall into step, and a client holding `n` leases
//! sends about `n / RENEW_BATCH` batches per renew interval, plus a few.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::clock::{At, LeaseClock, SUSPEND_CHECK};
use crate::config::LeaseConfig;
use crate::error::{StoreError, StoreErrorKind};
use crate::key::Key;
use crate::lease::lost::LostReason;
use crate::lease::observer::{LeaseObserver, RenewalEvent, RenewalPhase};
use crate::lease::shared::LeaseShared;
use crate::metrics as m;
use crate::store::RENEW_BATCH;
use crate::store::{RenewOutcome, Store};
use crate::token::OwnerToken;

/// The longest the scheduler sleeps when it holds no lease.
const IDLE: Duration = Duration::from_secs(1);

/// A batch with room left takes renewals due within this fraction (1 / `COALESCE`) of the
/// renew interval after its own.
const COALESCE: u32 = 8;

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
            spare: Vec::new(),
            entries: HashMap::new(),
            checks: BTreeSet::new(),
            due: BTreeSet::new(),
            batch: Vec::new(),
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

/// One lease the scheduler renews. Kept small (a client may hold 100,000): what the
/// lease's shared state already has (the TTL granted last, the acquire's send, so the
/// maximum hold) is read from there.
struct Entry {
    shared: Arc<LeaseShared>,
    /// Its place in `Scheduler::due` while no renewal is in flight.
    next_renew: At,
    /// Its place in `Scheduler::checks`: the deadline or the maximum hold, whichever is
    /// first, as it was when the entry was last indexed.
    check_at: At,
    in_flight: bool,
    failures: u32,
    unreachable_failures: u32,
    renewals: u64,
}

impl Entry {
    /// The TTL the store granted last (at most the TTL asked): the renew interval, the
    /// bound on a renewal and the retry delay are the configuration's, scaled to it. Only
    /// the scheduler's accepted renewals change it.
    fn ttl(&self) -> Duration {
        self.shared.ttl()
    }

    /// When the lease must be given up whatever its renewals: the maximum hold, counted
    /// from the acquire's send.
    fn max_hold_at(&self, config: &LeaseConfig) -> Option<At> {
        config.max_hold().map(|d| self.shared.acquired_at.add(d))
    }

    /// When this entry's deadline or maximum hold must next be looked at.
    fn next_check(&self, config: &LeaseConfig) -> At {
        let t = self.shared.valid_until();
        self.max_hold_at(config).map_or(t, |mh| t.min(mh))
    }
}

enum Done {
    /// A batch of renewals, all sent at `sent_at`.
    Renew {
        sent_at: At,
        /// The leases renewed, and the store's answer: one result per lease, or one error
        /// for the whole batch.
        sent: Vec<(u64, Arc<LeaseShared>)>,
        result: Result<Vec<Result<RenewOutcome, StoreError>>, StoreError>,
        /// Renewals not sent: the lease was past its deadline, lost or let go by then.
        skipped: Vec<u64>,
    },
    Release,
}

struct Scheduler {
    store: Arc<dyn Store>,
    config: LeaseConfig,
    clock: LeaseClock,
    observer: Option<Arc<dyn LeaseObserver>>,
    rx: mpsc::UnboundedReceiver<Command>,
    inbox: Arc<Inbox>,
    /// The inbox's last batch of new leases, emptied: swapped back in at the next drain,
    /// so the inbox keeps its capacity instead of growing from nothing every time.
    spare: Vec<Arc<LeaseShared>>,
    entries: HashMap<u64, Entry>,
    /// `(deadline or maximum hold, lease id)` of every entry, earliest first.
    checks: BTreeSet<(At, u64)>,
    /// `(next renewal, lease id)` of every entry with no renewal in flight, earliest
    /// first: where a batch finds the renewals due soon.
    due: BTreeSet<(At, u64)>,
    /// Entries whose renewal came due at this wake-up, sent as batches when it ends.
    batch: Vec<u64>,
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
            let mut new = std::mem::take(&mut self.spare);
            std::mem::swap(&mut new, &mut self.inbox.lock().new);
            for shared in new.drain(..) {
                self.add(shared);
            }
            self.spare = new;
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
            for first in [self.checks.first(), self.due.first()]
                .into_iter()
                .flatten()
            {
                wake = wake.min(first.0);
            }
            {
                let mut st = self.inbox.lock();
                if st.new.is_empty() {
                    st.planned = Some(wake);
                } else {
                    // More leases arrived meanwhile: take them at once, but only after
                    // polling the requests in flight (never `continue` past them: while
                    // leases keep arriving, the renewals would never be sent).
                    wake = now;
                }
            }
            let sleep_until = self.clock.to_tokio(wake);
            tokio::select! {
                // Replies first: a renewal's answer is what keeps a lease.
                biased;
                Some(done) = self.inflight.next(), if !self.inflight.is_empty() => self.done(done),
                cmd = self.rx.recv(), if open => match cmd {
                    Some(cmd) => self.command(cmd),
                    None => open = false,
                },
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
        // Released, being released or lost before the task got to it (a short hold):
        // nothing to renew or watch; a drop's release comes as its own command.
        if shared.is_done() {
            return;
        }
        // Every schedule counts from the send of the request that granted the lease, and
        // follows the TTL it granted; the maximum hold is absolute.
        let acquired_at = shared.acquired_at;
        let ttl = shared.ttl();
        let mut entry = Entry {
            next_renew: acquired_at.add(self.config.renew_interval_for(ttl)),
            check_at: acquired_at,
            shared: shared.clone(),
            in_flight: false,
            failures: 0,
            unreachable_failures: 0,
            renewals: 0,
        };
        entry.check_at = entry.next_check(&self.config);
        self.due.insert((entry.next_renew, shared.id));
        self.checks.insert((entry.check_at, shared.id));
        self.entries.insert(shared.id, entry);
    }

    /// Moves entry `id` in the check index to its current deadline or maximum hold.
    fn recheck(&mut self, id: u64) {
        if let Some(e) = self.entries.get_mut(&id) {
            let at = e.next_check(&self.config);
            if at != e.check_at {
                self.checks.remove(&(e.check_at, id));
                e.check_at = at;
                self.checks.insert((at, id));
            }
        }
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Drop(shared) => {
                self.forget(shared.id);
                self.release(shared.key.clone(), shared.owner);
            }
            Command::ReleaseOrphan(key, owner) => self.release(key, owner),
            Command::Shutdown(reply) => {
                self.shutting_down = true;
                for (_, e) in self.entries.drain() {
                    e.shared.mark_lost(LostReason::Shutdown);
                }
                self.checks.clear();
                self.due.clear();
                self.batch.clear();
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
        if let Some(e) = self.forget(id) {
            e.shared.mark_lost(reason);
        }
    }

    /// Removes entry `id` (and its places in the indexes).
    fn forget(&mut self, id: u64) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        self.checks.remove(&(e.check_at, id));
        if !e.in_flight {
            self.due.remove(&(e.next_renew, id));
        }
        Some(e)
    }

    /// Handles every deadline, maximum hold and renewal due at `now`, then sends the
    /// renewals that came due.
    fn run_due(&mut self, now: At) {
        while let Some(&(t, id)) = self.checks.first() {
            if t > now {
                break;
            }
            self.check(id, now);
        }
        while let Some(&(t, id)) = self.due.first() {
            if t > now {
                break;
            }
            self.renewal_due(id);
        }
        self.send_batches(now);
    }

    /// Sends the renewals due at `now` in batches of at most [`RENEW_BATCH`], the last one
    /// filled with renewals due within the coalescing window.
    fn send_batches(&mut self, now: At) {
        if self.batch.is_empty() {
            return;
        }
        let mut ids = std::mem::take(&mut self.batch);
        let room = ids.len().div_ceil(RENEW_BATCH) * RENEW_BATCH - ids.len();
        // The window follows the renew interval of the batch's own leases (scaled to the
        // TTL granted; the longest of them when grants differ, which only renews a lease
        // of a shorter grant a little earlier).
        let interval = ids
            .iter()
            .filter_map(|id| self.entries.get(id))
            .map(|e| self.config.renew_interval_for(e.ttl()))
            .max()
            .unwrap_or_else(|| self.config.renew_interval());
        let horizon = now.add(interval / COALESCE);
        let soon: Vec<(At, u64)> = self
            .due
            .range(..=(horizon, u64::MAX))
            .take(room)
            .copied()
            .collect();
        for (t, id) in soon {
            let Some(e) = self.entries.get_mut(&id) else {
                continue;
            };
            if e.shared.is_done() || self.config.max_renewals().is_some_and(|m| e.renewals >= m) {
                // Left to its own event, which ends it.
                continue;
            }
            self.due.remove(&(t, id));
            e.in_flight = true;
            ids.push(id);
        }
        for chunk in ids.chunks(RENEW_BATCH) {
            self.start_batch(chunk, now);
        }
    }

    /// Entry `id`'s deadline or maximum hold came: loses it if either has passed (else its
    /// deadline moved meanwhile, and so does its place in the index).
    fn check(&mut self, id: u64, now: At) {
        #[cfg(test)]
        self.visits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(e) = self.entries.get(&id) else {
            // Not indexed without an entry; drop the stray item all the same.
            self.checks.pop_first();
            return;
        };
        if e.shared.is_done() {
            self.forget(id);
        } else if e.max_hold_at(&self.config).is_some_and(|t| now >= t) {
            self.lose(id, LostReason::MaxHoldExceeded);
        } else if now >= e.shared.valid_until() {
            let reason = if e.unreachable_failures > 0 {
                LostReason::StoreUnavailable
            } else {
                LostReason::Expired
            };
            self.lose(id, reason);
        } else {
            self.recheck(id);
        }
    }

    /// Entry `id`'s renewal came due (it has none in flight): joins this wake-up's batch.
    fn renewal_due(&mut self, id: u64) {
        #[cfg(test)]
        self.visits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(e) = self.entries.get_mut(&id) else {
            self.due.pop_first();
            return;
        };
        if e.shared.is_done() {
            self.forget(id);
            return;
        }
        if self.config.max_renewals().is_some_and(|m| e.renewals >= m) {
            return self.lose(id, LostReason::MaxHoldExceeded);
        }
        self.due.remove(&(e.next_renew, id));
        e.in_flight = true;
        self.batch.push(id);
    }

    /// Sends one batch of renewals (entries already marked in flight).
    fn start_batch(&mut self, ids: &[u64], now: At) {
        let mut op_timeout = Duration::ZERO;
        let leases: Vec<(u64, Arc<LeaseShared>)> = ids
            .iter()
            .filter_map(|id| {
                let e = self.entries.get(id)?;
                op_timeout = op_timeout.max(self.config.op_timeout_for(e.ttl()));
                Some((*id, e.shared.clone()))
            })
            .collect();
        let store = self.store.clone();
        // Always the TTL asked: the store grants what it can.
        let ttl = self.config.ttl();
        let clock = self.clock.clone();
        let observer = self.observer.clone();
        // Never wait for a reply past the last deadline in the batch: useless then.
        let last_deadline = leases
            .iter()
            .map(|(_, s)| s.valid_until())
            .max()
            .unwrap_or(now);
        let budget = op_timeout.min(last_deadline.since(now));
        self.inflight.push(Box::pin(async move {
            let sent_at = clock.now();
            // Marked on its way before the look below: a holder that lets go of the lease
            // meanwhile (`Lease::release_after`) either sees the mark and waits for the
            // answer, or is seen letting go and the renewal is not sent.
            for (_, shared) in &leases {
                shared
                    .renewing
                    .store(true, std::sync::atomic::Ordering::SeqCst);
            }
            // Looked at again when the request is really about to go (the task may have
            // been preempted or the process frozen since the scheduler decided to renew):
            // a renewal is never sent for a lease past its deadline, lost or let go.
            let (sent, skipped): (Vec<_>, Vec<_>) =
                leases.into_iter().partition(|(_, s)| s.is_held_at(sent_at));
            for (_, shared) in &skipped {
                shared
                    .renewing
                    .store(false, std::sync::atomic::Ordering::SeqCst);
            }
            let skipped = skipped.into_iter().map(|(id, _)| id).collect();
            if sent.is_empty() {
                return Done::Renew {
                    sent_at,
                    sent,
                    result: Ok(Vec::new()),
                    skipped,
                };
            }
            if let Some(o) = &observer {
                for (_, shared) in &sent {
                    observe(o.as_ref(), shared, RenewalPhase::Sent, sent_at);
                }
            }
            let request: Vec<(crate::Key, OwnerToken)> =
                sent.iter().map(|(_, s)| (s.key.clone(), s.owner)).collect();
            let backend = store.backend();
            let result = StoreError::bounded(
                backend,
                "renew",
                budget,
                crate::store::renew_many(&*store, &request, ttl),
            )
            .await
            .and_then(|results| {
                if results.len() == request.len() {
                    Ok(results)
                } else {
                    Err(StoreError::new(
                        StoreErrorKind::Corrupt,
                        backend,
                        format!(
                            "renew: {} results for a batch of {} leases",
                            results.len(),
                            request.len()
                        ),
                    ))
                }
            });
            Done::Renew {
                sent_at,
                sent,
                result,
                skipped,
            }
        }));
    }

    fn done(&mut self, done: Done) {
        match done {
            Done::Renew {
                sent_at,
                sent,
                result,
                skipped,
            } => {
                for id in skipped {
                    if let Some(e) = self.entries.get_mut(&id) {
                        // Not back in the renewal index: its deadline (past or near) loses
                        // it, unless it ended.
                        e.in_flight = false;
                    }
                }
                let mut tally = Tally::default();
                match result {
                    Ok(results) => {
                        for ((id, shared), result) in sent.into_iter().zip(results) {
                            self.renewed(id, shared, sent_at, result, &mut tally);
                        }
                    }
                    Err(err) => {
                        for (id, shared) in sent {
                            let err = Err(err.copy_for_batch());
                            self.renewed(id, shared, sent_at, err, &mut tally);
                        }
                    }
                }
                tally.record(self.store.backend(), self.clock.now().since(sent_at));
            }
            Done::Release => {
                self.releases_in_flight -= 1;
                if self.releases_in_flight == 0 {
                    for w in self.flush_waiters.drain(..) {
                        let _ = w.send(());
                    }
                }
            }
        }
    }

    /// Handles the store's answer to the renewal of entry `id`, sent at `sent_at`.
    fn renewed(
        &mut self,
        id: u64,
        shared: Arc<LeaseShared>,
        sent_at: At,
        result: Result<RenewOutcome, StoreError>,
        tally: &mut Tally,
    ) {
        shared
            .renewing
            .store(false, std::sync::atomic::Ordering::SeqCst);
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
                tally.add(rt, "renewed");
                // The deadline and the next renewal follow the TTL this renewal granted.
                let ttl = ttl.min(self.config.ttl());
                let until = sent_at.add(self.config.validity(ttl));
                // The TTL granted before (an accepted extend replaces it).
                let ttl_before = e.ttl();
                let replaced = if now < until {
                    e.shared.extend(until, ttl, now)
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
                    if ttl != ttl_before
                        && let Err(err) = self.config.check_grant(ttl)
                    {
                        // Held until its deadline, which is right for the grant; the
                        // next renewal may not make it in time.
                        tracing::warn!(key = %e.shared.key, fence = e.shared.fence.get(), error = %err, "a renewal granted a ttl too short to renew in time");
                    }
                    e.failures = 0;
                    e.unreachable_failures = 0;
                    e.renewals += 1;
                    e.next_renew = sent_at.add(self.config.renew_interval_for(ttl));
                    tracing::trace!(key = %e.shared.key, fence = e.shared.fence.get(), latency_us = latency.as_micros() as u64, "renewed");
                } else {
                    // The reply came after the deadline (a frozen process, a starved
                    // runtime): the lease was not provably held in between.
                    return self.lose(id, LostReason::Expired);
                }
            }
            Ok(RenewOutcome::NotOwner) => {
                tally.add(rt, "not_owner");
                report(&e.shared, RenewalPhase::NotOwner);
                return self.lose(id, LostReason::NotOwner);
            }
            Err(err) => {
                tally.add(rt, "error");
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
                e.shared.at_risk(now);
                e.next_renew = now.add(retry_delay(&self.config, e.ttl()));
            }
        }
        let next_renew = e.next_renew;
        self.due.insert((next_renew, id));
        self.recheck(id);
    }
}

/// The renewal results of one batch, by resource type and result, recorded as one counter
/// increment and one latency per pair (the batch's leases share one request, so one
/// latency): the metrics cost per batch, not per lease.
#[derive(Default)]
struct Tally(Vec<(String, &'static str, u64)>);

impl Tally {
    fn add(&mut self, resource_type: &str, result: &'static str) {
        match self
            .0
            .iter_mut()
            .find(|(rt, r, _)| *r == result && rt == resource_type)
        {
            Some((_, _, n)) => *n += 1,
            None => self.0.push((resource_type.to_owned(), result, 1)),
        }
    }

    fn record(self, backend: &'static str, latency: Duration) {
        for (rt, result, n) in self.0 {
            m::renewed(backend, &rt, result, n, latency);
        }
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

/// Delay before retrying a failed renewal of a lease granted `ttl`: a quarter of its
/// renew interval.
fn retry_delay(config: &LeaseConfig, ttl: Duration) -> Duration {
    config.renew_interval_for(ttl) / 4
}

/// Registers a lease with the scheduler and, if configured, the watchdog thread.
pub(crate) fn track(sched: &SchedulerHandle, shared: &Arc<LeaseShared>, config: &LeaseConfig) {
    sched.register(shared.clone(), first_event(shared, config));
    if config.watchdog_thread() {
        shared.watch();
    }
}

/// The first instant a new lease needs the scheduler: its first renewal (timed from the
/// TTL granted), its deadline or its maximum hold, whichever is first, all counted from
/// the acquire's send.
fn first_event(shared: &LeaseShared, config: &LeaseConfig) -> At {
    let mut t = shared
        .acquired_at
        .add(config.renew_interval_for(shared.ttl()))
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

    use crate::store::memory::MemoryStore;
    use crate::{LeaseClient, LeaseConfig};

    /// A client on the memory store, without the watchdog thread (paused time).
    fn client(ttl: Duration) -> LeaseClient {
        let cfg = LeaseConfig::builder(ttl)
            .watchdog_thread(false)
            .build()
            .unwrap();
        LeaseClient::new(Arc::new(MemoryStore::new()), cfg)
    }

    /// The scheduler looks at one entry per renewal (and a few more per lease), however
    /// many leases it holds: 10,000 leases with renewals spread over the interval cost
    /// about one visit per renewal. A scheduler that walks every lease at each wake-up
    /// would make about 10,000 visits per renewal here.
    #[tokio::test(start_paused = true)]
    async fn work_per_renewal_does_not_grow_with_the_number_of_leases() {
        const N: u64 = 10_000;
        let ttl = Duration::from_secs(3);
        let client = client(ttl);
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

    /// A lease its holder dropped leaves nothing behind in the scheduler: no renewal of it
    /// comes due later to be looked at (and thrown away) while the scheduler runs for the
    /// leases still held.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_lease_leaves_no_renewal_to_visit() {
        const N: u64 = 100;
        let ttl = Duration::from_secs(3);
        let client = client(ttl);
        let kept = client.try_acquire("d:kept").await.unwrap();
        let mut leases = Vec::new();
        for i in 0..N {
            leases.push(client.try_acquire(format!("d:{i}")).await.unwrap());
        }
        // The scheduler takes the new leases in (a lease dropped before that is never
        // scheduled), then they are dropped.
        tokio::time::sleep(Duration::from_millis(1)).await;
        drop(leases);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let before = client.scheduler_visits();
        // Three TTLs: the kept lease is renewed every ttl / 3, about 9 visits; each dropped
        // lease's renewal would have come due in the first of them.
        tokio::time::sleep(3 * ttl).await;
        assert!(kept.is_valid());
        let visits = client.scheduler_visits() - before;
        assert!(
            (1..=12).contains(&visits),
            "{visits} visits for one lease renewed about 9 times ({N} dropped)"
        );
    }
}
