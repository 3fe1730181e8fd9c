//! The clock that leases are timed on.
//!
//! A holder's validity deadline must pass while the host is suspended: a VM or laptop that
//! sleeps for longer than the TTL wakes up with its lease expired in the store. tokio's and
//! std's `Instant` run on `CLOCK_MONOTONIC`, which stops during a suspend. So leasehold
//! times leases on *monotonic time plus the time the host spent suspended* — on Linux
//! that is `CLOCK_BOOTTIME` — while still sleeping on tokio's timers (so tests on tokio's
//! paused clock stay exact).
//!
//! | platform | what the deadline counts |
//! | --- | --- |
//! | Linux, Android | `CLOCK_BOOTTIME`: running time and suspended time |
//! | other Unix | `CLOCK_MONOTONIC` only: a suspend longer than the validity window is **not** seen; the fence is the protection there |
//!
//! Timers sleep on the monotonic clock, so after a resume the background tasks notice a
//! suspend within [`SUSPEND_CHECK`]; every question asked of a lease
//! ([`Lease::is_valid`](crate::Lease::is_valid), [`LostSignal::is_lost`](crate::LostSignal::is_lost),
//! …) reads the clock on the spot and is right at once.
//!
//! The wall clock (`SystemTime`) is never used for deadlines: NTP or an operator stepping
//! it changes nothing.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// How often the background tasks (the renewal scheduler and the watchdog thread) look
/// at the clock at the least while they hold leases, so that a host suspend is noticed
/// this long after the resume at the latest.
pub const SUSPEND_CHECK: Duration = Duration::from_millis(250);

/// The source of suspended time. Leases are timed on tokio's (monotonic) clock plus
/// [`suspended`](Clock::suspended).
///
/// The default is [`SystemClock`]; tests inject a [`ManualClock`] through
/// [`LeaseClientBuilder::clock`](crate::LeaseClientBuilder::clock) to model a host
/// suspend.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// How long the host has been suspended since a fixed origin. Must never decrease.
    fn suspended(&self) -> Duration;
}

/// The host's clock: on Linux and Android, `CLOCK_BOOTTIME − CLOCK_MONOTONIC` (the time
/// spent suspended since boot); elsewhere zero (suspends are not seen).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn suspended(&self) -> Duration {
        system_suspended()
    }
}

/// The largest suspended time read so far, in ns: readings never go back.
static SUSPENDED_NS: AtomicU64 = AtomicU64::new(0);

/// `CLOCK_BOOTTIME − CLOCK_MONOTONIC`, never decreasing.
pub(crate) fn system_suspended() -> Duration {
    let read = read_suspended_ns();
    let prev = SUSPENDED_NS.fetch_max(read, Ordering::Relaxed);
    Duration::from_nanos(prev.max(read))
}

/// `CLOCK_BOOTTIME − CLOCK_MONOTONIC` in ns, zero where the platform has no boot clock.
/// One function for every platform, as [`boottime`]: its mutants are those of the code
/// this machine compiles.
fn read_suspended_ns() -> u64 {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use nix::time::{ClockId, clock_gettime};
        // BOOTTIME first: the difference can only come out slightly low (by the time
        // between the two reads), never high.
        let boot = boottime();
        let mono = clock_gettime(ClockId::CLOCK_MONOTONIC);
        match (boot, mono) {
            (Some(b), Ok(m)) => suspended_ns(b, m.into()),
            _ => 0,
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    0
}

/// The host's `CLOCK_BOOTTIME` (time since boot, suspended time included), `None` where
/// the platform has none or it cannot be read. Every reading of it in leasehold goes
/// through here, so that a test can suspend the host at this layer
/// ([`suspend_host`], feature `test-util`).
///
/// One function for every platform (not a stub per platform): its mutants are then those
/// of the code this machine compiles, which its tests can catch.
pub fn boottime() -> Option<Duration> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use nix::time::{ClockId, clock_gettime};
        let read: Duration = clock_gettime(ClockId::CLOCK_BOOTTIME).ok()?.into();
        Some(read.saturating_add(injected_suspend()))
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    None
}

/// Suspended time a test added to `CLOCK_BOOTTIME` ([`suspend_host`]), in ns.
#[cfg(feature = "test-util")]
static INJECTED_SUSPEND_NS: AtomicU64 = AtomicU64::new(0);

/// The suspended time a test injected ([`suspend_host`]); zero in a build without
/// `test-util`. One function for both builds, so that its mutants are those of the build
/// the tests run.
fn injected_suspend() -> Duration {
    #[cfg(feature = "test-util")]
    {
        Duration::from_nanos(INJECTED_SUSPEND_NS.load(Ordering::Acquire))
    }
    #[cfg(not(feature = "test-util"))]
    Duration::ZERO
}

/// Models a host suspend of `d` where the host's clock is read: from now on every
/// `CLOCK_BOOTTIME` reading of this process ([`boottime`], and so [`SystemClock`] and
/// every lease timed on it) is `d` further on, while `CLOCK_MONOTONIC` (what timers sleep
/// on) did not move — exactly what a resume from a suspend of `d` looks like to a
/// process. Nothing is told: the background tasks notice as after a real resume, within
/// [`SUSPEND_CHECK`]. Process-wide and for good. Feature `test-util`: for tests only
/// (`leasehold_conformance::suspend_host` records it for the test's proof).
#[cfg(feature = "test-util")]
pub fn suspend_host(d: Duration) {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let _ = INJECTED_SUSPEND_NS.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
        Some(v.saturating_add(ns))
    });
}

/// The suspended time, in ns, from a `CLOCK_BOOTTIME` and a `CLOCK_MONOTONIC` reading:
/// their difference, zero if the readings came out in the other order.
fn suspended_ns(boot: Duration, mono: Duration) -> u64 {
    u64::try_from(boot.saturating_sub(mono).as_nanos()).unwrap_or(u64::MAX)
}

/// A clock for tests: [`suspend`](Self::suspend) moves the lease clock forward without
/// moving tokio's clock, as a host suspend does.
#[derive(Debug, Default)]
pub struct ManualClock {
    suspended: Mutex<Duration>,
}

impl ManualClock {
    /// A clock that has never been suspended.
    pub fn new() -> Self {
        Self::default()
    }

    /// Models a host suspend of `d`: every lease timed on this clock is `d` closer to its
    /// deadline at once, while no timer fired in between.
    pub fn suspend(&self, d: Duration) {
        {
            let mut s = self.suspended.lock().unwrap_or_else(|e| e.into_inner());
            *s = s.saturating_add(d);
        }
        if let Some(moved) = ON_MOVE.get() {
            moved();
        }
    }
}

impl Clock for ManualClock {
    fn suspended(&self) -> Duration {
        *self.suspended.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Far enough in the future to mean "never", close enough not to overflow an `Instant`.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// Adds `d` to `t`, saturating at a far future instead of overflowing.
pub(crate) fn saturating_add(t: Instant, d: Duration) -> Instant {
    t.checked_add(d).or_else(|| t.checked_add(FAR)).unwrap_or(t)
}

/// An instant on the lease clock: tokio's clock plus the time suspended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct At(Instant);

impl At {
    /// `self + d`, saturating.
    pub(crate) fn add(self, d: Duration) -> At {
        At(saturating_add(self.0, d))
    }

    /// `self − earlier`, zero if `earlier` is later.
    pub(crate) fn since(self, earlier: At) -> Duration {
        self.0.saturating_duration_since(earlier.0)
    }
}

/// A shared [`Clock`] with the conversions the core needs.
#[derive(Debug, Clone)]
pub(crate) struct LeaseClock(std::sync::Arc<dyn Clock>);

impl Default for LeaseClock {
    fn default() -> Self {
        Self(std::sync::Arc::new(SystemClock))
    }
}

impl LeaseClock {
    pub(crate) fn new(clock: std::sync::Arc<dyn Clock>) -> Self {
        Self(clock)
    }

    /// How long the host has been suspended, as of now (never decreases).
    pub(crate) fn suspended(&self) -> Duration {
        self.0.suspended()
    }

    /// Instant `t` of tokio's clock on the lease clock, given a suspended time read no
    /// later than `t`: never later than `t`'s place on the lease clock.
    pub(crate) fn at(t: Instant, suspended_before: Duration) -> At {
        At(saturating_add(t, suspended_before))
    }

    /// Now, on the lease clock.
    pub(crate) fn now(&self) -> At {
        At(saturating_add(Instant::now(), self.0.suspended()))
    }

    /// The tokio instant at which `at` will be reached if the host is not suspended in
    /// between (what to sleep until).
    pub(crate) fn to_tokio(&self, at: At) -> Instant {
        at.0.checked_sub(self.0.suspended())
            .unwrap_or_else(Instant::now)
    }
}

/// Told when a clock moves forward at once (a [`ManualClock`]'s suspend): the deadline
/// watchdog registers itself here when it starts, and converts its deadlines again.
static ON_MOVE: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Registers the one listener of clock moves.
pub(crate) fn on_move(listener: fn()) {
    let _ = ON_MOVE.set(listener);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_suspended_never_decreases() {
        let mut last = Duration::ZERO;
        for _ in 0..1000 {
            let s = system_suspended();
            assert!(s >= last);
            last = s;
        }
    }

    #[test]
    fn suspended_time_is_boottime_minus_monotonic() {
        let s = Duration::from_secs;
        assert_eq!(suspended_ns(s(10), s(7)), 3_000_000_000);
        assert_eq!(suspended_ns(s(7), s(10)), 0);
        assert_eq!(suspended_ns(Duration::MAX, Duration::ZERO), u64::MAX);
    }

    #[test]
    fn far_means_a_century() {
        let t = Instant::now();
        let far = saturating_add(t, Duration::MAX) - t;
        assert_eq!(far, Duration::from_secs(100 * 365 * 24 * 60 * 60));
    }

    #[test]
    fn saturating_add_never_panics() {
        let t = Instant::now();
        for d in [Duration::ZERO, Duration::from_secs(1), FAR, Duration::MAX] {
            let u = saturating_add(t, d);
            assert!(u >= t);
            let _ = saturating_add(u, Duration::MAX);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn manual_suspend_moves_the_lease_clock_not_tokio() {
        let clock = std::sync::Arc::new(ManualClock::new());
        let lc = LeaseClock::new(clock.clone());
        let t0 = lc.now();
        let tokio0 = Instant::now();
        clock.suspend(Duration::from_secs(5));
        assert_eq!(lc.now().since(t0), Duration::from_secs(5));
        assert_eq!(Instant::now(), tokio0);
        // A deadline 10 s after t0 is now 5 s of tokio sleep away.
        assert_eq!(
            lc.to_tokio(t0.add(Duration::from_secs(10))) - tokio0,
            Duration::from_secs(5)
        );
    }
}
