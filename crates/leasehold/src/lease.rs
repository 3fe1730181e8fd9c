//! The holder's handle: fence, validity deadline, lost signal, release.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, StoreError};
use crate::key::Key;
use crate::metrics as m;
use crate::scheduler::SchedulerHandle;
use crate::store::{ReleaseOutcome, Store};
use crate::token::{Fence, OwnerToken};

/// Why a lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The store said this owner no longer holds the lease (it expired store-side, was
    /// broken by an admin, or was taken by another owner).
    NotOwner,
    /// Renewals failed this many times in a row with errors from the store.
    RenewFailed {
        /// Consecutive failed renewals.
        attempts: u32,
    },
    /// The validity deadline passed without a confirmed renewal: the process was frozen
    /// or starved, or renewals were too slow.
    Expired,
    /// The maximum hold time or number of renewals was reached; the heartbeat stopped.
    MaxHoldExceeded,
    /// The store could not be reached (timeouts, refused connections) until the lease
    /// could no longer be proven.
    StoreUnavailable,
}

impl LostReason {
    /// A short stable name, used as the `reason` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotOwner => "not_owner",
            Self::RenewFailed { .. } => "renew_failed",
            Self::Expired => "expired",
            Self::MaxHoldExceeded => "max_hold_exceeded",
            Self::StoreUnavailable => "store_unavailable",
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotOwner => f.write_str("the store no longer lists this owner as the holder"),
            Self::RenewFailed { attempts } => write!(f, "{attempts} consecutive renewals failed"),
            Self::Expired => f.write_str("the validity deadline passed without a renewal"),
            Self::MaxHoldExceeded => f.write_str("the maximum hold time or renewals was reached"),
            Self::StoreUnavailable => f.write_str("the store was unreachable"),
        }
    }
}

#[derive(Debug)]
struct State {
    valid_until: Instant,
    lost: Option<LostReason>,
    /// The holder is releasing it: stop renewing.
    releasing: bool,
    /// Released, dropped or lost: no more metrics or lost signals.
    ended: bool,
}

/// State shared by the handle, the renewal scheduler and the deadline watchdog.
pub(crate) struct LeaseShared {
    /// Process-wide unique id.
    pub(crate) id: u64,
    /// Whether the watchdog thread watches it.
    watched: std::sync::atomic::AtomicBool,
    pub(crate) key: Key,
    pub(crate) owner: OwnerToken,
    pub(crate) fence: Fence,
    pub(crate) ttl: Duration,
    pub(crate) acquired_at: Instant,
    pub(crate) backend: &'static str,
    state: Mutex<State>,
    lost: CancellationToken,
}

impl fmt::Debug for LeaseShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("fence", &self.fence)
            .field("ttl", &self.ttl)
            .field("state", &*self.lock())
            .finish()
    }
}

impl LeaseShared {
    pub(crate) fn new(
        key: Key,
        owner: OwnerToken,
        fence: Fence,
        ttl: Duration,
        valid_until: Instant,
        backend: &'static str,
    ) -> Self {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            watched: std::sync::atomic::AtomicBool::new(false),
            key,
            owner,
            fence,
            ttl,
            acquired_at: Instant::now(),
            backend,
            state: Mutex::new(State {
                valid_until,
                lost: None,
                releasing: false,
                ended: false,
            }),
            lost: CancellationToken::new(),
        }
    }

    /// Hands the lease to the watchdog thread until it ends.
    pub(crate) fn watch(self: &Arc<Self>) {
        self.watched
            .store(true, std::sync::atomic::Ordering::Release);
        crate::watchdog::watch(self);
    }

    fn unwatch(&self) {
        if self
            .watched
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            crate::watchdog::unwatch(self.id);
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent even if a holder of the lock panicked.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.lock().valid_until
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        self.lock().lost
    }

    /// Lost or ended: the scheduler and the watchdog can forget it.
    pub(crate) fn is_done(&self) -> bool {
        let s = self.lock();
        s.ended || s.releasing || s.lost.is_some()
    }

    /// The holder started releasing: the scheduler stops renewing it (lazily, at its next
    /// look) without being sent a message.
    pub(crate) fn begin_release(&self) {
        self.lock().releasing = true;
    }

    /// Moves the deadline to `until` after a confirmed renewal; refuses (false) once the
    /// lease is lost or ended, or when the old deadline has already passed: a lease past its
    /// deadline is lost, whatever a late reply says.
    pub(crate) fn extend(&self, until: Instant, now: Instant) -> bool {
        let mut s = self.lock();
        if s.ended || s.lost.is_some() || now >= s.valid_until {
            return false;
        }
        s.valid_until = s.valid_until.max(until);
        true
    }

    /// Checks the deadline at `now`; fires the lost signal when it has passed.
    /// Returns whether the lease is still valid.
    pub(crate) fn check(&self, now: Instant) -> bool {
        let (expired, lost) = {
            let s = self.lock();
            (now >= s.valid_until, s.lost.is_some() || s.ended)
        };
        if lost {
            return false;
        }
        if expired {
            self.mark_lost(LostReason::Expired);
            return false;
        }
        true
    }

    /// Fires the lost signal with `reason`, once. Returns whether this call fired it.
    pub(crate) fn mark_lost(&self, reason: LostReason) -> bool {
        {
            let mut s = self.lock();
            if s.lost.is_some() || s.ended {
                return false;
            }
            s.lost = Some(reason);
        }
        self.lost.cancel();
        self.unwatch();
        let held = self.acquired_at.elapsed();
        m::lease_lost(self.backend, self.key.resource_type(), reason, held);
        tracing::warn!(
            key = %self.key,
            owner = %self.owner,
            fence = self.fence.get(),
            ttl_ms = self.ttl.as_millis() as u64,
            reason = reason.as_str(),
            held_ms = held.as_millis() as u64,
            "lease lost"
        );
        true
    }

    /// Marks the lease ended by its holder (released or dropped). Returns false if it had
    /// already ended.
    pub(crate) fn end(&self) -> bool {
        let lost = {
            let mut s = self.lock();
            if s.ended {
                return false;
            }
            s.ended = true;
            s.lost.is_some()
        };
        self.unwatch();
        if !lost {
            m::hold_ended(
                self.backend,
                self.key.resource_type(),
                self.acquired_at.elapsed(),
            );
        }
        true
    }
}

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
    ) -> Self {
        Self {
            shared,
            sched,
            store,
            op_timeout,
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

    /// This holder's owner token.
    pub fn owner(&self) -> &OwnerToken {
        &self.shared.owner
    }

    /// The fencing token of this grant. Pass it with every protected write.
    pub fn fence(&self) -> Fence {
        self.shared.fence
    }

    /// The TTL granted by the store.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// The local validity deadline on the monotonic clock: the lease is believed held
    /// until then, and is lost if no renewal is confirmed before it.
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// Time left before the validity deadline (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.shared
            .valid_until()
            .saturating_duration_since(Instant::now())
    }

    /// Whether the lease is still believed held. Checks the deadline on the spot, so a
    /// process that was frozen past it sees `false` (and the lost signal fires) as soon as
    /// it runs again, before any background task does.
    pub fn is_valid(&self) -> bool {
        self.shared.check(Instant::now())
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

    /// Why the lease was lost, once it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason()
    }

    /// The lost signal: a cloneable, `'static` handle that resolves with the reason when
    /// the lease is lost. Never resolves for a lease that is released while held.
    pub fn lost(&self) -> LostSignal {
        LostSignal {
            shared: self.shared.clone(),
        }
    }

    /// The lost signal as a [`CancellationToken`] (a child token: cancelling it does not
    /// affect the lease).
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.lost.child_token()
    }

    /// Runs `work` under the lease: returns its output, or [`Error::LeaseLost`] as soon as
    /// the lease is lost, dropping (cancelling) `work` at that point.
    ///
    /// # Cancel safety
    /// Cancel safe as far as this method goes: dropping it drops `work`.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when the lease is lost before `work` completes (or was lost
    /// already, in which case `work` is not polled).
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        self.ensure_valid()?;
        let lost = self.lost();
        tokio::select! {
            biased;
            reason = lost.wait() => Err(Error::LeaseLost(reason)),
            out = work => Ok(out),
        }
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
    pub async fn release(self) -> Result<bool, Error> {
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
    /// Waits until the lease is lost.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn wait(&self) -> LostReason {
        self.shared.lost.cancelled().await;
        self.shared.lost_reason().unwrap_or(LostReason::Expired)
    }

    /// The reason, if already lost.
    pub fn reason(&self) -> Option<LostReason> {
        self.shared.lost_reason()
    }

    /// Whether the lease has been lost.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.is_cancelled()
    }
}

impl IntoFuture for LostSignal {
    type Output = LostReason;
    type IntoFuture = Pin<Box<dyn Future<Output = LostReason> + Send>>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.wait().await })
    }
}
