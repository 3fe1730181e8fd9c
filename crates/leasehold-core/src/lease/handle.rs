//! The holder's handle: fence, validity deadline, lost signal, release.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::error::{Error, StoreError};
use crate::key::Key;
use crate::lease::health::{Health, HealthChanges};
use crate::lease::live::LiveGuard;
use crate::lease::lost::LostReason;
use crate::lease::scheduler::SchedulerHandle;
use crate::lease::shared::LeaseShared;
use crate::store::{ReleaseOutcome, RenewOutcome, Store};
use crate::token::{Fence, OwnerToken};

/// A held lease: the proof, for as long as it is valid, that this process may act on the
/// resource named by its key.
///
/// A background scheduler (one per [`LeaseClient`](crate::LeaseClient)) renews it. Check
/// [`is_valid`](Self::is_valid) or [`ensure_valid`](Self::ensure_valid) right before a
/// protected write, pass [`fence`](Self::fence) with the write so the storage can reject
/// it if the lease was lost meanwhile, and select on [`lost`](Self::lost) to stop work
/// as soon as the lease is lost.
///
/// Dropping a lease stops its renewal and queues a best-effort release in the background
/// (release-on-drop is not immediate); call [`release`](Self::release) to know the result.
#[must_use = "dropping a Lease releases it"]
#[clippy::has_significant_drop]
pub struct Lease {
    shared: Arc<LeaseShared>,
    sched: SchedulerHandle,
    store: Arc<dyn Store>,
    op_timeout: Duration,
    /// Counts this handle among its client's live leases until it is gone.
    _live: LiveGuard,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.fmt(f)
    }
}

impl Lease {
    pub(crate) fn new(
        shared: Arc<LeaseShared>,
        sched: SchedulerHandle,
        store: Arc<dyn Store>,
        op_timeout: Duration,
        live: LiveGuard,
    ) -> Self {
        Self {
            shared,
            sched,
            store,
            op_timeout,
            _live: live,
        }
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.shared.key
    }

    #[cfg(test)]
    pub(crate) fn shared_id(&self) -> u64 {
        self.shared.id
    }

    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Arc<LeaseShared> {
        &self.shared
    }

    /// This holder's owner token.
    pub fn owner(&self) -> &OwnerToken {
        &self.shared.owner
    }

    /// The fencing token of this grant. Pass it with every protected write.
    ///
    /// Every grant of a key gets a fence above every earlier grant's, so the storage can
    /// keep the highest fence it has accepted and refuse a lower one: the write of a holder
    /// that lost the lease while it was paused. The SQL stores' guards do this in the
    /// write's own transaction.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{LeaseClient, LeaseConfig, memory::MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), leasehold_core::Error> {
    /// let client = LeaseClient::new(Arc::new(MemoryStore::new()), LeaseConfig::new(Duration::from_secs(10))?);
    /// let first = client.try_acquire("ledger:invoices").await?;
    /// let old = first.fence();
    /// first.release().await?;
    /// let second = client.try_acquire("ledger:invoices").await?;
    /// // The storage accepts fences at least as high as the highest it saw.
    /// assert!(second.fence() > old);
    /// println!("UPDATE ledger SET … WHERE last_fence <= {}", second.fence().get());
    /// # Ok(()) }
    /// ```
    pub fn fence(&self) -> Fence {
        self.shared.fence
    }

    /// The TTL the store granted, which every schedule of the lease follows: that of the
    /// acquire, then that of the last renewal. Never above the TTL asked
    /// ([`LeaseConfig::ttl`](crate::LeaseConfig::ttl)): a store that grants more (etcd
    /// rounds up to whole seconds) is counted on for the TTL asked only. A store may grant
    /// less (ZooKeeper grants at most its session timeout): the lease is then renewed
    /// every [`LeaseConfig::renew_interval_for`](crate::LeaseConfig::renew_interval_for)
    /// this TTL, and its validity deadline counts from it.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl()
    }

    /// The local validity deadline, as an instant on tokio's clock: the lease is believed
    /// held until then, and is lost if no renewal is confirmed before it.
    ///
    /// The deadline itself is kept on a clock that also counts host suspension
    /// (`CLOCK_BOOTTIME` on Linux, see [`clock`](crate::clock)); this converts it with the
    /// suspension seen so far, so a later suspend brings the real deadline earlier than
    /// the instant returned here. Ask [`remaining`](Self::remaining) or
    /// [`is_valid`](Self::is_valid) for the truth at a given moment.
    pub fn valid_until(&self) -> Instant {
        self.shared.clock.to_tokio(self.shared.valid_until())
    }

    /// Time left before the validity deadline (zero once passed), on the clock that
    /// counts host suspension.
    pub fn remaining(&self) -> Duration {
        self.shared.valid_until().since(self.shared.clock.now())
    }

    /// How long since the acquire that granted the lease was sent (the moment every
    /// schedule of the lease counts from), on the clock that counts host suspension.
    pub fn held_for(&self) -> Duration {
        self.shared.clock.now().since(self.shared.acquired_at)
    }

    /// Whether the lease is still believed held. Checks the deadline on the spot, so a
    /// process that was frozen or suspended past it sees `false` (and the lost signal
    /// fires) as soon as it runs again, before any background task does.
    pub fn is_valid(&self) -> bool {
        self.shared.check(self.shared.clock.now())
    }

    /// The fence, if the lease is still valid; otherwise [`Error::LeaseLost`].
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the lease was lost or its deadline has passed.
    pub fn ensure_valid(&self) -> Result<Fence, Error> {
        if self.is_valid() {
            Ok(self.shared.fence)
        } else {
            Err(Error::LeaseLost(
                self.shared.lost_reason().unwrap_or(LostReason::Expired),
            ))
        }
    }

    /// Why the lease was lost, once it was. Checks the deadline on the spot, as
    /// [`is_valid`](Self::is_valid) does.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.reason_now()
    }

    /// How the lease is doing: [`Health::Held`], [`Health::AtRisk`] from the first
    /// renewal that failed until one is confirmed or the deadline passes, or
    /// [`Health::Lost`]. Checks the deadline on the spot, as [`is_valid`](Self::is_valid)
    /// does.
    ///
    /// # Examples
    ///
    /// Finish the unit of work in hand, but start no new one while the lease is at risk:
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{Health, LeaseClient, LeaseConfig, memory::MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), leasehold_core::Error> {
    /// let client = LeaseClient::new(Arc::new(MemoryStore::new()), LeaseConfig::new(Duration::from_secs(10))?);
    /// let lease = client.try_acquire("job:export").await?;
    /// let mut changes = lease.health_changes();
    /// for unit in 0..3 {
    ///     match lease.health() {
    ///         Health::Held => { /* start unit */ }
    ///         Health::AtRisk { .. } => {
    ///             // Wait until it is held again (or lost) before starting another.
    ///             if !changes.next().await.is_held() { break; }
    ///         }
    ///         _ => break, // lost: stop
    ///     }
    ///     # let _ = unit;
    /// }
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn health(&self) -> Health {
        self.shared.health()
    }

    /// The changes of [`health`](Self::health) from now on: `next().await` resolves at
    /// each one (cancel safe; see [`HealthChanges::next`]).
    pub fn health_changes(&self) -> HealthChanges {
        HealthChanges::new(self.shared.clone())
    }

    /// The lost signal: a cloneable, `'static` handle that resolves with the reason when
    /// the lease is lost. Never resolves for a lease that is released while held.
    ///
    /// # Examples
    ///
    /// Select on it to stop the work the moment the lease is lost (here an operator breaks
    /// the lease, so the next renewal answers `NotOwner`):
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{LeaseClient, LeaseConfig, LostReason, Store, memory::MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), leasehold_core::Error> {
    /// let store = Arc::new(MemoryStore::new());
    /// let client = LeaseClient::new(store.clone(), LeaseConfig::new(Duration::from_millis(300))?);
    /// let lease = client.try_acquire("job:export").await?;
    /// store.break_lease(lease.key()).await?; // an operator breaks the lease
    ///
    /// let work = async {
    ///     loop {
    ///         tokio::time::sleep(Duration::from_millis(10)).await; // one batch of work
    ///     }
    /// };
    /// tokio::select! {
    ///     reason = lease.lost() => {
    ///         // Stop, roll back what is not committed, and never write with this fence again.
    ///         assert_eq!(reason, LostReason::NotOwner);
    ///     }
    ///     _ = work => unreachable!("the work never ends on its own"),
    /// }
    /// assert!(!lease.is_valid());
    /// // The store no longer lists us: release says so.
    /// assert!(!lease.release().await?);
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> LostSignal {
        LostSignal {
            shared: self.shared.clone(),
        }
    }

    /// The lost signal as a [`CancellationToken`] (a child token: cancelling it does not
    /// affect the lease), for code that already selects on tokens.
    ///
    /// A token cannot look at a clock: it is cancelled by the background tasks (the
    /// renewal scheduler, and the watchdog thread at the deadline), so after a process
    /// freeze it may lag the deadline by the time those take to run again. Right before a
    /// protected write, ask [`is_valid`](Self::is_valid) (or select on
    /// [`lost`](Self::lost), which checks the clock each time it is polled).
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.lost_token().child_token()
    }

    /// Runs `work` under the lease: returns its output, or [`Error::LeaseLost`] as soon as
    /// the lease is lost, dropping (cancelling) `work` at that point.
    ///
    /// Each time it is polled it checks the deadline on the clock before polling `work`,
    /// so `work` is never polled again once the deadline has passed, even if no
    /// background task has run since (a process resumed after a freeze).
    ///
    /// # Cancel safety
    /// Cancel safe as far as this method goes: dropping it drops `work`.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the lease is lost before `work` completes (or was lost
    /// already, in which case `work` is not polled).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{Error, LeaseClient, LeaseConfig, LostReason, Store, memory::MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Error> {
    /// let store = Arc::new(MemoryStore::new());
    /// let client = LeaseClient::new(store.clone(), LeaseConfig::new(Duration::from_millis(300))?);
    /// let lease = client.try_acquire("job:nightly-invoices").await?;
    ///
    /// // Work that ends while the lease is held returns its output.
    /// let written = lease.run(async { 3 }).await?;
    /// assert_eq!(written, 3);
    ///
    /// // Work still running when the lease is lost is dropped at that point.
    /// store.break_lease(lease.key()).await?;
    /// let endless = lease.run(std::future::pending::<()>()).await;
    /// assert!(matches!(endless, Err(Error::LeaseLost(LostReason::NotOwner))));
    /// # Ok(()) }
    /// ```
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        self.ensure_valid()?;
        let mut lost = std::pin::pin!(self.lost().wait());
        let mut work = std::pin::pin!(work);
        std::future::poll_fn(move |cx| {
            if let Poll::Ready(reason) = lost.as_mut().poll(cx) {
                return Poll::Ready(Err(Error::LeaseLost(reason)));
            }
            work.as_mut().poll(cx).map(Ok)
        })
        .await
    }

    /// Stops renewing and releases the lease (compare-and-delete on the store).
    ///
    /// Returns `true` if the store still listed this owner as the holder, `false` if it
    /// did not (the lease had expired or been taken over: check your fenced writes).
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped, a best-effort release is queued, as on drop.
    ///
    /// # Errors
    /// [`Error::Store`] when the store could not be reached in time; the lease then expires
    /// store-side after its TTL.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{LeaseClient, LeaseConfig, memory::MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), leasehold_core::Error> {
    /// let client = LeaseClient::new(Arc::new(MemoryStore::new()), LeaseConfig::new(Duration::from_secs(10))?);
    /// let lease = client.try_acquire("job:backup").await?;
    /// // ... the work, its writes fenced with lease.fence() ...
    /// if !lease.release().await? {
    ///     // It had expired or been taken over meanwhile: check the fenced writes.
    ///     eprintln!("lease was lost before release");
    /// }
    /// // Released: the next holder gets it at once.
    /// let next = client.try_acquire("job:backup").await?;
    /// # drop(next); Ok(()) }
    /// ```
    pub async fn release(self) -> Result<bool, Error> {
        // From here on the lease never reports lost: its holder let go of it.
        self.shared.begin_release();
        let res = StoreError::bounded(
            self.store.backend(),
            "release",
            self.op_timeout,
            self.store.release(&self.shared.key, &self.shared.owner),
        )
        .await;
        if res.is_ok() {
            // Ended only once the store answered; otherwise Drop retries the release.
            self.shared.end();
        }
        tracing::debug!(
            key = %self.shared.key,
            owner = %self.shared.owner,
            fence = self.shared.fence.get(),
            result = ?res,
            "lease released"
        );
        match res {
            Ok(ReleaseOutcome::Released) => Ok(true),
            Ok(ReleaseOutcome::NotOwner) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// How [`Lease::release_after`] ended the hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldEnd {
    /// Released: the minimum hold had passed (at the call, or after waiting for it).
    Released,
    /// Left in the store, which keeps it until at least `until` (on tokio's clock; the
    /// store counts from when it processed the request, which is later) and then expires
    /// it. Nothing renews it any more.
    LeftToExpire {
        /// The earliest moment the store may let another holder in.
        until: Instant,
    },
    /// The store no longer listed this owner as the holder: it had expired or been taken
    /// over (a release answered `NotOwner`).
    NotHeld,
}

impl Lease {
    /// Ends the hold, but not before `min_hold` after the grant (ShedLock's
    /// `lockAtLeastFor`): a job that finishes early still keeps its siblings out for the
    /// period, so a replica whose timer fires a little later does not run it again.
    ///
    /// The period counts from when the acquire was sent (never later than the store's
    /// grant, so the lease is never kept for less than `min_hold` because of it). If it
    /// has passed, this is [`release`](Self::release). Otherwise:
    ///
    /// - On a store whose renewal sets the expiry to the TTL asked
    ///   ([`Capabilities::sets_expiry`](crate::Capabilities::sets_expiry): Redis not
    ///   through Sentinel, the SQL lease tables, SQLite) the lease's renewals stop, one last renewal sets its
    ///   store-side expiry to the rest of the period, and this returns at once
    ///   ([`HoldEnd::LeftToExpire`]). A renewal already on its way when this is called is
    ///   waited for first (at most the operation timeout), so that it cannot shorten the
    ///   expiry after; one whose reply timed out might still reach the store later.
    /// - On any other store (etcd's fixed lease TTL, ZooKeeper's session, advisory locks
    ///   and `GET_LOCK`, Redlock, Redis through Sentinel) the lease stays held and renewed in this process until
    ///   the period has passed, then is released ([`HoldEnd::Released`]).
    ///
    /// Waiters of a Redis lease may wake later than the new expiry (at the remaining time
    /// they were told before), never earlier.
    ///
    /// # Errors
    /// - [`Error::LeaseLost`] if the lease was lost (before the call or while waiting);
    /// - a store error of the last renewal or of the release: the lease was not released;
    ///   after a failed last renewal it is left to expire (at the end of that renewal if
    ///   the store applied it, else at the end of the one before, which may be earlier).
    ///
    /// Cancel safety: not cancel safe. Dropping the future while it waits drops the
    /// lease, which releases it before the period has passed.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{HoldEnd, LeaseClient, LeaseConfig, memory::MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), leasehold_core::Error> {
    /// let client = LeaseClient::new(Arc::new(MemoryStore::new()), LeaseConfig::new(Duration::from_secs(10))?);
    /// let lease = client.try_acquire("job:nightly").await?;
    /// // ... the job, done in a second ...
    /// let end = lease.release_after(Duration::from_secs(60)).await?;
    /// assert!(matches!(end, HoldEnd::LeftToExpire { .. }));
    /// // Another replica's timer, firing a few seconds later, finds it held.
    /// assert!(client.try_acquire("job:nightly").await.is_err());
    /// # Ok(()) }
    /// ```
    pub async fn release_after(self, min_hold: Duration) -> Result<HoldEnd, Error> {
        let clock = self.shared.clock.clone();
        let end = self.shared.acquired_at.add(min_hold);
        if let Some(reason) = self.shared.reason_now() {
            return Err(Error::LeaseLost(reason));
        }
        let remaining = end.since(clock.now());
        if remaining.is_zero() {
            return self.release_now().await;
        }
        if self.held_in_process_for(min_hold).is_none() {
            return self.leave_until(end).await;
        }
        tracing::info!(
            key = %self.shared.key,
            fence = self.shared.fence.get(),
            left_ms = remaining.as_millis() as u64,
            "held until the minimum hold has passed (the store keeps no lease for a set time after its holder stops renewing)"
        );
        let lost = self.lost();
        tokio::select! {
            reason = lost.wait() => return Err(Error::LeaseLost(reason)),
            () = tokio::time::sleep_until(clock.to_tokio(end)) => {}
        }
        self.release_now().await
    }

    /// How long [`release_after(min_hold)`](Self::release_after) called now would keep
    /// this process holding the lease before it releases it: `None` when it would return
    /// at once (the minimum has passed, or the store keeps the lease for the rest of it).
    pub fn held_in_process_for(&self, min_hold: Duration) -> Option<Duration> {
        let remaining = min_hold.saturating_sub(self.held_for());
        let store_keeps_it =
            self.store.capabilities().sets_expiry && remaining <= crate::config::MAX_TTL;
        (!remaining.is_zero() && !store_keeps_it).then_some(remaining)
    }

    async fn release_now(self) -> Result<HoldEnd, Error> {
        Ok(if self.release().await? {
            HoldEnd::Released
        } else {
            HoldEnd::NotHeld
        })
    }

    /// Stops renewing and sets the store-side expiry to `end` (a store that
    /// [`sets_expiry`](crate::Capabilities::sets_expiry)).
    async fn leave_until(self, end: crate::clock::At) -> Result<HoldEnd, Error> {
        use std::sync::atomic::Ordering;
        let clock = self.shared.clock.clone();
        // From here on the scheduler sends no renewal; one already sent is waited for, so
        // that its TTL cannot replace the one set below.
        self.shared.begin_release();
        let answered = async {
            while self.shared.renewing.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        // Bounded: a scheduler shut down meanwhile never clears the mark.
        let _ = tokio::time::timeout(self.op_timeout, answered).await;
        let sent = clock.now();
        // In whole milliseconds, rounded up: the unit every store with a set expiry keeps.
        let ms = end.since(sent).as_nanos().div_ceil(1_000_000);
        let ttl = Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
            .max(crate::config::MIN_TTL);
        let res = StoreError::bounded(
            self.store.backend(),
            "renew",
            self.op_timeout,
            self.store.renew(&self.shared.key, &self.shared.owner, ttl),
        )
        .await;
        // Never released from here: the store expires it.
        self.shared.end();
        match res {
            Ok(RenewOutcome::Renewed { ttl: granted }) if granted >= ttl => {
                let until = clock.to_tokio(sent.add(ttl));
                tracing::info!(key = %self.shared.key, fence = self.shared.fence.get(), ttl_ms = ttl.as_millis() as u64, "left in the store until the minimum hold has passed");
                Ok(HoldEnd::LeftToExpire { until })
            }
            Ok(RenewOutcome::Renewed { ttl: granted }) => Err(StoreError::new(
                crate::StoreErrorKind::Corrupt,
                self.store.backend(),
                format!(
                    "release_after: the store claims to set the expiry asked but granted {granted:?} of {ttl:?}; the lease is left to expire then"
                ),
            )
            .into()),
            Ok(RenewOutcome::NotOwner) => Ok(HoldEnd::NotHeld),
            Err(e) => Err(e.into()),
        }
    }

    /// Stops renewing the lease **without** releasing it: it stays in the store until it
    /// expires there, one TTL after its last renewal at most.
    ///
    /// For a holder that cannot be sure its work has stopped (`leasehold run` when a
    /// process of the command may still be running): releasing, or dropping (which
    /// releases), would let the next holder in while that work may still act. The lost
    /// signal does not fire; the hold is recorded with the `end` label `abandoned`.
    pub fn abandon(self) {
        self.shared.begin_release();
        self.shared.end_as("abandoned");
        tracing::warn!(
            key = %self.shared.key,
            owner = %self.shared.owner,
            fence = self.shared.fence.get(),
            "lease abandoned: not renewed, not released; it expires in the store"
        );
        // Drop sees the lease ended and queues no release.
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // `end` is false only when `release` already completed.
        if self.shared.end() {
            self.sched.drop_lease(self.shared.clone());
        }
    }
}

/// Resolves with the [`LostReason`] when its lease is lost. Cloneable and `'static`, so it
/// can move into spawned tasks. `.await` it directly or call [`wait`](Self::wait).
///
/// # Examples
///
/// Hand the signal to a task that cancels a side job when the lease is lost, and ask it
/// on the spot before a write:
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use leasehold_core::{LeaseClient, LeaseConfig, LostReason, Store, memory::MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), leasehold_core::Error> {
/// let store = Arc::new(MemoryStore::new());
/// let client = LeaseClient::new(store.clone(), LeaseConfig::new(Duration::from_millis(300))?);
/// let lease = client.try_acquire("job:sync").await?;
/// let lost = lease.lost();
/// assert!(!lost.is_lost());
/// assert_eq!(lost.reason(), None);
///
/// let watcher = tokio::spawn({
///     let lost = lost.clone();
///     async move { lost.wait().await } // or `lost.await`
/// });
/// store.break_lease(lease.key()).await?; // broken: the next renewal says NotOwner
/// assert_eq!(watcher.await.unwrap(), LostReason::NotOwner);
/// assert!(lost.is_lost());
/// assert_eq!(lost.reason(), Some(LostReason::NotOwner));
/// assert!(lost.lost_at().is_some());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LostSignal {
    shared: Arc<LeaseShared>,
}

impl fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostSignal")
            .field("key", &self.shared.key)
            .field("lost", &self.shared.lost_reason())
            .finish()
    }
}

impl LostSignal {
    /// A future that resolves with the reason when the lease is lost.
    ///
    /// Each time it is polled it first compares the deadline with the clock, so it
    /// resolves as soon as it is polled after the deadline, even if no background task
    /// has run since (a process resumed after a freeze). It never resolves for a lease
    /// its holder released.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub fn wait(&self) -> LostFuture {
        LostFuture {
            shared: self.shared.clone(),
            cancelled: Box::pin(self.shared.lost_token().cancelled_owned()),
        }
    }

    /// The reason, if already lost. Checks the deadline on the spot.
    pub fn reason(&self) -> Option<LostReason> {
        self.shared.reason_now()
    }

    /// Whether the lease has been lost. Checks the deadline on the spot.
    pub fn is_lost(&self) -> bool {
        self.reason().is_some()
    }

    /// When the lost signal fired, as an instant on tokio's clock (converted with the
    /// host suspension seen so far, as [`Lease::valid_until`] is): the moment the library
    /// — the watchdog thread, the renewal scheduler, or a question asked on the spot —
    /// declared the lease lost, whenever the code waiting on the signal wakes up. `None`
    /// while it has not fired.
    pub fn lost_at(&self) -> Option<Instant> {
        let at = self.shared.lost_at()?;
        Some(self.shared.clock.to_tokio(at))
    }
}

/// The future of [`LostSignal::wait`]: resolves with the [`LostReason`] when the lease is
/// lost, checking the deadline against the clock each time it is polled.
#[must_use = "futures do nothing unless polled"]
pub struct LostFuture {
    shared: Arc<LeaseShared>,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl fmt::Debug for LostFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostFuture")
            .field("key", &self.shared.key)
            .finish_non_exhaustive()
    }
}

impl Future for LostFuture {
    type Output = LostReason;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LostReason> {
        if let Some(reason) = self.shared.reason_now() {
            return Poll::Ready(reason);
        }
        if self.cancelled.as_mut().poll(cx).is_ready() {
            // Cancelled only by mark_lost, which set the reason first.
            return Poll::Ready(self.shared.lost_reason().unwrap_or(LostReason::Expired));
        }
        Poll::Pending
    }
}

impl IntoFuture for LostSignal {
    type Output = LostReason;
    type IntoFuture = LostFuture;
    fn into_future(self) -> Self::IntoFuture {
        self.wait()
    }
}
