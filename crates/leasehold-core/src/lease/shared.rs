//! The state of one lease shared by its handle, the renewal scheduler and the deadline
//! watchdog: the deadline, the TTL granted, and the lost signal.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::clock::{At, LeaseClock};
use crate::key::Key;
use crate::lease::health::Health;
use crate::lease::lost::LostReason;
use crate::lease::watchdog::Watched;
use crate::metrics as m;
use crate::token::{Fence, OwnerToken};

struct State {
    valid_until: At,
    /// The TTL the store granted, by the acquire or by the last accepted renewal (at
    /// most the TTL asked).
    ttl: Duration,
    lost: Option<LostReason>,
    /// When the lost signal fired, on the lease clock.
    lost_at: Option<At>,
    /// The holder is releasing it: stop renewing.
    releasing: bool,
    /// Released, dropped or lost: no more metrics or lost signals.
    ended: bool,
    /// The lost signal's token, made when first asked for: most leases are never waited
    /// on, and a token is a heap block of its own (about 100 bytes per held lease).
    /// Cancelled once `lost` is set.
    signal: Option<CancellationToken>,
    /// Since when the lease is at risk: its first failed renewal of this spell, cleared by
    /// a confirmed renewal, the loss or the end.
    at_risk_since: Option<At>,
    /// Told of every health change, made when first asked for (most leases are never
    /// watched): its value counts the changes.
    health: Option<watch::Sender<u64>>,
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is an implementation detail: `lost` says what it says.
        f.debug_struct("State")
            .field("valid_until", &self.valid_until)
            .field("ttl", &self.ttl)
            .field("lost", &self.lost)
            .field("lost_at", &self.lost_at)
            .field("releasing", &self.releasing)
            .field("ended", &self.ended)
            .field("at_risk_since", &self.at_risk_since)
            .finish()
    }
}

impl State {
    /// Lost, ended or being released: nothing renews it, nothing reports it lost again.
    fn done(&self) -> bool {
        self.ended || self.releasing || self.lost.is_some()
    }
}

/// What the store granted, and when the granting request was sent.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(crate) key: Key,
    pub(crate) owner: OwnerToken,
    pub(crate) fence: Fence,
    pub(crate) ttl: Duration,
    pub(crate) sent_at: At,
    pub(crate) valid_until: At,
}

/// State shared by the handle, the renewal scheduler and the deadline watchdog.
pub(crate) struct LeaseShared {
    /// Process-wide unique id.
    pub(crate) id: u64,
    /// Whether the watchdog thread watches it.
    watched: std::sync::atomic::AtomicBool,
    /// A renewal of it is on its way to the store (set by the scheduler when it sends one,
    /// cleared when the answer, or the call's timeout, is handled).
    pub(crate) renewing: std::sync::atomic::AtomicBool,
    pub(crate) key: Key,
    pub(crate) owner: OwnerToken,
    pub(crate) fence: Fence,
    /// When the request that granted the lease was sent: every schedule counts from it.
    pub(crate) acquired_at: At,
    pub(crate) backend: &'static str,
    pub(crate) clock: LeaseClock,
    state: Mutex<State>,
}

impl fmt::Debug for LeaseShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("fence", &self.fence)
            .field("state", &*self.lock())
            .finish()
    }
}

impl LeaseShared {
    pub(crate) fn new(grant: Grant, backend: &'static str, clock: LeaseClock) -> Self {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            watched: std::sync::atomic::AtomicBool::new(false),
            renewing: std::sync::atomic::AtomicBool::new(false),
            key: grant.key,
            owner: grant.owner,
            fence: grant.fence,
            acquired_at: grant.sent_at,
            backend,
            clock,
            state: Mutex::new(State {
                valid_until: grant.valid_until,
                ttl: grant.ttl,
                lost: None,
                lost_at: None,
                releasing: false,
                ended: false,
                signal: None,
                at_risk_since: None,
                health: None,
            }),
        }
    }

    /// Hands the lease to the watchdog thread until it ends.
    pub(crate) fn watch(self: &Arc<Self>) {
        self.watched
            .store(true, std::sync::atomic::Ordering::Release);
        crate::lease::watchdog::watch(self.clone());
    }

    fn unwatch(&self) {
        if self
            .watched
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            crate::lease::watchdog::unwatch(self.id);
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent even if a holder of the lock panicked.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lost signal as a token: cancelled once the lease is lost (at once if it
    /// already is), never for a lease its holder released. Every call returns the same
    /// token.
    pub(crate) fn lost_token(&self) -> CancellationToken {
        let mut s = self.lock();
        let lost = s.lost.is_some();
        s.signal
            .get_or_insert_with(|| {
                let token = CancellationToken::new();
                if lost {
                    token.cancel();
                }
                token
            })
            .clone()
    }

    /// When the lost signal fired, if it has.
    pub(crate) fn lost_at(&self) -> Option<At> {
        self.lock().lost_at
    }

    pub(crate) fn valid_until(&self) -> At {
        self.lock().valid_until
    }

    /// The TTL the store granted last (at most the TTL asked).
    pub(crate) fn ttl(&self) -> Duration {
        self.lock().ttl
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        self.lock().lost
    }

    /// The lost reason after checking the deadline on the spot (firing the signal if it
    /// has passed). `None` while held, and for a lease its holder released or is
    /// releasing.
    pub(crate) fn reason_now(&self) -> Option<LostReason> {
        self.check(self.clock.now());
        self.lock().lost
    }

    /// Lost or ended: the scheduler and the watchdog can forget it.
    pub(crate) fn is_done(&self) -> bool {
        self.lock().done()
    }

    /// Still held at `now`: not done, and its deadline not passed.
    pub(crate) fn is_held_at(&self, now: At) -> bool {
        let s = self.lock();
        !s.done() && now < s.valid_until
    }

    /// The holder started releasing: the scheduler stops renewing it (lazily, at its next
    /// look) without being sent a message.
    pub(crate) fn begin_release(&self) {
        self.lock().releasing = true;
    }

    /// Moves the deadline to `until` after a confirmed renewal that granted `ttl`, and
    /// returns the deadline it replaced; refuses (`None`) once the lease is lost, ended
    /// or being released, or when the old deadline has already passed: a lease past its
    /// deadline is lost, whatever a late reply says.
    ///
    /// The new deadline replaces the old one even when it is earlier: a renewal that
    /// granted a shorter TTL than the grant before it set the store's expiry earlier too.
    /// The watchdog thread is then pointed at the earlier deadline.
    pub(crate) fn extend(self: &Arc<Self>, until: At, ttl: Duration, now: At) -> Option<At> {
        let (old, recovered) = {
            let mut s = self.lock();
            if s.done() || now >= s.valid_until {
                return None;
            }
            let old = s.valid_until;
            s.valid_until = until;
            s.ttl = ttl;
            let recovered = s.at_risk_since.take().map(|_| s.health.clone());
            (old, recovered)
        };
        if let Some(tx) = recovered {
            m::at_risk_ended(self.backend, self.key.resource_type());
            tracing::info!(key = %self.key, owner = %self.owner, fence = self.fence.get(), "renewal confirmed: the lease is no longer at risk");
            notify(tx);
        }
        if until < old && self.watched.load(std::sync::atomic::Ordering::Acquire) {
            // The watchdog queued the old deadline: queue the new one instead. A lease
            // that ended meanwhile is dropped by the watchdog when it looks.
            crate::lease::watchdog::unwatch(self.id);
            crate::lease::watchdog::watch(self.clone());
        }
        Some(old)
    }

    /// A renewal failed at `now` and the lease is not lost for it: the lease is at risk
    /// from now until a renewal is confirmed or its deadline passes (a second failure in
    /// one spell changes nothing).
    pub(crate) fn at_risk(&self, now: At) {
        let (tx, deadline) = {
            let mut s = self.lock();
            if s.done() || s.at_risk_since.is_some() || now >= s.valid_until {
                return;
            }
            s.at_risk_since = Some(now);
            (s.health.clone(), s.valid_until)
        };
        m::at_risk_began(self.backend, self.key.resource_type());
        tracing::warn!(
            key = %self.key,
            owner = %self.owner,
            fence = self.fence.get(),
            left_ms = deadline.since(now).as_millis() as u64,
            "a renewal failed: the lease is at risk until a renewal is confirmed or its deadline passes"
        );
        notify(tx);
    }

    /// The health now, after checking the deadline on the spot.
    pub(crate) fn health(&self) -> Health {
        self.check(self.clock.now());
        let s = self.lock();
        if let Some(reason) = s.lost {
            return Health::Lost(reason);
        }
        match s.at_risk_since {
            Some(since) => Health::AtRisk {
                since: self.clock.to_tokio(since),
                deadline: self.clock.to_tokio(s.valid_until),
            },
            None => Health::Held,
        }
    }

    /// A receiver told of every health change from now on.
    pub(crate) fn health_subscribe(&self) -> watch::Receiver<u64> {
        self.lock()
            .health
            .get_or_insert_with(|| watch::Sender::new(0))
            .subscribe()
    }

    /// Checks the deadline at `now`; fires the lost signal when it has passed.
    /// Returns whether the lease is still valid.
    pub(crate) fn check(&self, now: At) -> bool {
        let (expired, lost) = {
            let s = self.lock();
            (now >= s.valid_until, s.done())
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
    ///
    /// A lease its holder is releasing (or has released) is never reported lost: the
    /// holder let go of it, whatever a late renewal reply or the deadline says.
    pub(crate) fn mark_lost(&self, reason: LostReason) -> bool {
        let now = self.clock.now();
        let (signal, health) = {
            let mut s = self.lock();
            if s.done() {
                return false;
            }
            s.lost = Some(reason);
            s.lost_at = Some(now);
            // A spell at risk ends with the loss.
            if s.at_risk_since.take().is_some() {
                m::at_risk_ended(self.backend, self.key.resource_type());
            }
            (s.signal.clone(), s.health.clone())
        };
        // A token asked for from now on is made cancelled.
        if let Some(signal) = signal {
            signal.cancel();
        }
        notify(health);
        self.unwatch();
        let held = now.since(self.acquired_at);
        if reason == LostReason::Shutdown {
            m::hold_ended(self.backend, self.key.resource_type(), "shutdown", held);
            tracing::info!(key = %self.key, owner = %self.owner, fence = self.fence.get(), "renewal stopped: client shutting down");
            return true;
        }
        m::lease_lost(self.backend, self.key.resource_type(), reason, held);
        tracing::warn!(
            key = %self.key,
            owner = %self.owner,
            fence = self.fence.get(),
            ttl_ms = self.ttl().as_millis() as u64,
            reason = reason.as_str(),
            held_ms = held.as_millis() as u64,
            "lease lost"
        );
        true
    }

    /// Marks the lease ended by its holder (released or dropped). Returns false if it had
    /// already ended.
    pub(crate) fn end(&self) -> bool {
        self.end_as("released")
    }

    /// [`end`](Self::end), recording `how` as the `end` label of the hold duration.
    pub(crate) fn end_as(&self, how: &'static str) -> bool {
        let lost = {
            let mut s = self.lock();
            if s.ended {
                return false;
            }
            s.ended = true;
            // A spell at risk ends with the hold.
            if s.at_risk_since.take().is_some() {
                m::at_risk_ended(self.backend, self.key.resource_type());
            }
            s.lost.is_some()
        };
        self.unwatch();
        if !lost {
            m::hold_ended(
                self.backend,
                self.key.resource_type(),
                how,
                self.clock.now().since(self.acquired_at),
            );
        }
        true
    }
}

/// Tells the watchers of a lease's health that it changed.
fn notify(tx: Option<watch::Sender<u64>>) {
    if let Some(tx) = tx {
        tx.send_modify(|n| *n = n.wrapping_add(1));
    }
}

impl Watched for LeaseShared {
    fn id(&self) -> u64 {
        self.id
    }

    fn monotonic_deadline(&self) -> std::time::Instant {
        self.clock.to_tokio(self.valid_until()).into_std()
    }

    fn check_now(&self) -> bool {
        !self.is_done() && self.check(self.clock.now())
    }
}
