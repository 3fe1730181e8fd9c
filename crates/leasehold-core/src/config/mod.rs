//! Lease configuration and its validation.

pub mod backoff;
mod error;

pub use error::ConfigError;

use std::time::Duration;

use crate::config::backoff::Backoff;

/// The longest TTL accepted: one day. Longer leases defeat the purpose of a TTL (a crashed
/// holder would block the resource for longer) and overflow some stores' millisecond fields.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The shortest TTL accepted: 10 ms (stores count TTLs in milliseconds).
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// `name: Type;` → `pub fn name(&self) -> Type { self.name }`, with the docs given.
macro_rules! getters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty;)*) => {
        $($(#[$doc])* pub fn $name(&self) -> $ty { self.$name })*
    };
}

/// `name(arg: Type);` → a builder method setting the field `name` to `arg` (`=> Some`:
/// to `Some(arg)`), with the docs given.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($arg:ident: $ty:ty) $(=> $wrap:ident)?;)*) => {
        $($(#[$doc])* pub fn $name(mut self, $arg: $ty) -> Self {
            self.$name = $($wrap)?($arg);
            self
        })*
    };
}

/// How a lease is held: TTL, renewal cadence, safety margins, bounds and retry policy.
///
/// Build one with [`LeaseConfig::builder`]; every value is validated by
/// [`LeaseConfigBuilder::build`].
///
/// ## Behavior
/// - The holder believes it holds the lease until
///   `sent_at + ttl × (1 − drift_factor) − margin` on the monotonic clock, where `sent_at`
///   is when the acquire or the last successful renew was *sent*.
/// - The heartbeat renews every `renew_interval` (default `ttl / 3`); each store call is
///   bounded by `op_timeout` (default `ttl / 6`, at most 5 s).
/// - Every schedule of a lease follows the TTL the store **granted**, not the TTL asked:
///   a store may grant less (ZooKeeper grants at most its session timeout). The validity
///   deadline counts from the TTL granted (never from more than the TTL asked), and the
///   renew interval, the bound on each renewal and the retry delay after a failed one are
///   the configured ones scaled by `granted / ttl`
///   ([`renew_interval_for`](Self::renew_interval_for),
///   [`op_timeout_for`](Self::op_timeout_for)): with the defaults, a 30 s lease granted
///   6 s is renewed every 2 s. The same follows each renewal's reply, which reports the
///   TTL that renewal granted. [`Lease::ttl`](crate::Lease::ttl) says what was granted.
/// - A grant too short for the configuration to renew in time (its own rule, applied to
///   the scaled values: [`check_grant`](Self::check_grant)) is refused with
///   [`ConfigError::GrantTooShort`], naming both TTLs, and released; it is never handed
///   out to be lost before its first renewal. With the defaults only grants of about
///   10 ms fail; a configuration with a large fixed `margin` fails sooner.
/// - `max_hold` is an absolute duration from the acquire's send: the TTL granted does not
///   change it.
/// - The lease is lost after `renew_failures_before_lost` consecutive failed renewals
///   (default 2), at the validity deadline, on `NotOwner`, or past `max_hold` /
///   `max_renewals`.
/// - Waiting acquisitions retry with full-jitter exponential [`Backoff`].
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseConfig {
    ttl: Duration,
    renew_interval: Duration,
    op_timeout: Duration,
    drift_factor: f64,
    margin: Duration,
    renew_failures_before_lost: u32,
    max_hold: Option<Duration>,
    max_renewals: Option<u64>,
    backoff: Backoff,
    ambiguous_retries: u32,
    watchdog_thread: bool,
}

impl LeaseConfig {
    /// A builder starting from the defaults for `ttl`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::{Backoff, ConfigError, LeaseConfig};
    ///
    /// # fn main() -> Result<(), ConfigError> {
    /// let config = LeaseConfig::builder(Duration::from_secs(30))
    ///     .renew_interval(Duration::from_secs(5))
    ///     .op_timeout(Duration::from_secs(2))
    ///     .max_hold(Duration::from_secs(3600)) // give up after an hour, whatever happens
    ///     .backoff(Backoff::new(Duration::from_millis(20), Duration::from_secs(1))?)
    ///     .build()?;
    /// assert_eq!(config.renew_interval(), Duration::from_secs(5));
    ///
    /// // Every value is checked by `build`: a renewal must fit in the TTL.
    /// let err = LeaseConfig::builder(Duration::from_secs(10))
    ///     .renew_interval(Duration::from_secs(6))
    ///     .op_timeout(Duration::from_secs(5))
    ///     .build()
    ///     .unwrap_err();
    /// assert!(matches!(err, ConfigError::NoRoomToRenew { .. }));
    /// println!("{err}"); // operation timeout 5s + renew interval 6s + … must be below the ttl 10s
    /// # Ok(()) }
    /// ```
    pub fn builder(ttl: Duration) -> LeaseConfigBuilder {
        LeaseConfigBuilder {
            ttl,
            renew_interval: None,
            op_timeout: None,
            drift_factor: 0.01,
            margin: None,
            renew_failures_before_lost: 2,
            max_hold: None,
            max_renewals: None,
            backoff: Backoff::default(),
            ambiguous_retries: 2,
            watchdog_thread: true,
        }
    }

    /// The defaults for `ttl`.
    ///
    /// # Errors
    /// [`ConfigError`] when `ttl` is out of range.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::{ConfigError, LeaseConfig};
    ///
    /// let config = LeaseConfig::new(Duration::from_secs(10))?;
    /// assert_eq!(config.renew_interval(), config.ttl() / 3); // the defaults follow the TTL
    /// assert!(config.validity(config.ttl()) < config.ttl()); // drift and margin taken off
    ///
    /// assert_eq!(
    ///     LeaseConfig::new(Duration::from_millis(5)),
    ///     Err(ConfigError::TtlTooShort(Duration::from_millis(5))),
    /// );
    /// assert!(matches!(LeaseConfig::new(Duration::from_secs(2 * 86_400)), Err(ConfigError::TtlTooLong(_))));
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn new(ttl: Duration) -> Result<Self, ConfigError> {
        Self::builder(ttl).build()
    }

    getters! {
        /// The time to live requested from the store (which may grant less: see
        /// [`Lease::ttl`](crate::Lease::ttl)).
        ttl: Duration;
        /// How often the heartbeat renews a lease granted the full TTL (see
        /// [`renew_interval_for`](Self::renew_interval_for) for a shorter grant).
        renew_interval: Duration;
        /// The bound on every single store call (a renewal of a lease granted less than the
        /// TTL: [`op_timeout_for`](Self::op_timeout_for)).
        op_timeout: Duration;
        /// The assumed bound on clock-rate drift between holder and store.
        drift_factor: f64;
        /// The fixed safety margin subtracted from the validity window.
        margin: Duration;
        /// Consecutive failed renewals after which the lease is lost.
        renew_failures_before_lost: u32;
        /// The maximum time a lease may be held, if bounded.
        max_hold: Option<Duration>;
        /// The maximum number of renewals, if bounded.
        max_renewals: Option<u64>;
        /// The retry policy of waiting acquisitions.
        backoff: Backoff;
        /// How many times an acquire with an ambiguous reply is retried with the same owner.
        ambiguous_retries: u32;
        /// Whether an OS thread watches validity deadlines (see
        /// [`LeaseConfigBuilder::watchdog_thread`]).
        watchdog_thread: bool;
    }

    /// The validity window of a grant of `ttl`: `ttl × (1 − drift) − margin`, counted from
    /// the moment the request was sent.
    pub fn validity(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(1.0 - self.drift_factor)
            .saturating_sub(self.margin)
    }

    /// The renew interval of a lease the store granted `granted` (by the acquire or by
    /// its last renewal): [`renew_interval`](Self::renew_interval) scaled by
    /// `granted / ttl`. A grant of the TTL asked (or more: the holder never counts on
    /// more than it asked) keeps the configured interval; with the defaults, a shorter
    /// grant is renewed every third of it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::LeaseConfig;
    ///
    /// let config = LeaseConfig::new(Duration::from_secs(30))?; // renews every 10 s
    /// // ZooKeeper with a 6 s session timeout grants 6 s: renewed every 2 s.
    /// assert_eq!(config.renew_interval_for(Duration::from_secs(6)), Duration::from_secs(2));
    /// assert_eq!(config.op_timeout_for(Duration::from_secs(6)), Duration::from_secs(1));
    /// assert_eq!(config.renew_interval_for(Duration::from_secs(60)), Duration::from_secs(10));
    /// # Ok::<(), leasehold_core::ConfigError>(())
    /// ```
    pub fn renew_interval_for(&self, granted: Duration) -> Duration {
        self.scaled(self.renew_interval, granted)
    }

    /// The bound on each renewal of a lease the store granted `granted`:
    /// [`op_timeout`](Self::op_timeout) scaled by `granted / ttl`, as the renew interval
    /// is, so a shorter grant keeps the configuration's proportions (and its fit check).
    pub fn op_timeout_for(&self, granted: Duration) -> Duration {
        self.scaled(self.op_timeout, granted)
    }

    /// `d × granted / ttl`, exactly (in nanoseconds), with `granted` capped at the TTL.
    fn scaled(&self, d: Duration, granted: Duration) -> Duration {
        let granted = granted.min(self.ttl);
        if granted == self.ttl {
            return d;
        }
        // d ≤ 24 h and granted < ttl ≤ 24 h: the product fits in u128, the quotient
        // (below d) in u64.
        let nanos = d.as_nanos() * granted.as_nanos() / self.ttl.as_nanos();
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Checks that a lease the store granted `granted` can be renewed in time: the
    /// configuration's own rule ([`ConfigError::NoRoomToRenew`]) applied to the grant,
    /// with the operation timeout and the renew interval scaled to it
    /// ([`op_timeout_for`](Self::op_timeout_for),
    /// [`renew_interval_for`](Self::renew_interval_for)):
    /// `op_timeout + renew_interval + drift × granted + margin < granted`. Only the fixed
    /// margin does not scale, so only a grant far shorter than the TTL asked fails.
    ///
    /// # Errors
    /// [`ConfigError::GrantTooShort`], naming both TTLs, when it does not fit (or the
    /// grant is below [`MIN_TTL`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::{ConfigError, LeaseConfig};
    ///
    /// let config = LeaseConfig::builder(Duration::from_secs(30))
    ///     .margin(Duration::from_secs(5))
    ///     .build()?;
    /// assert!(config.check_grant(Duration::from_secs(30)).is_ok());
    /// assert!(config.check_grant(Duration::from_secs(20)).is_ok());
    /// // 2 s of 6 s go to renewing, 1 s to the call, 5 s to the margin: no room.
    /// let err = config.check_grant(Duration::from_secs(6)).unwrap_err();
    /// assert!(matches!(err, ConfigError::GrantTooShort { .. }));
    /// assert!(err.to_string().contains("granted a ttl of 6s where 30s was asked"));
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn check_grant(&self, granted: Duration) -> Result<(), ConfigError> {
        let granted = granted.min(self.ttl);
        let op_timeout = self.op_timeout_for(granted);
        let renew_interval = self.renew_interval_for(granted);
        let drift = granted.mul_f64(self.drift_factor);
        let needed = op_timeout + renew_interval + drift + self.margin;
        if granted < MIN_TTL
            || op_timeout.is_zero()
            || renew_interval.is_zero()
            || needed >= granted
        {
            return Err(ConfigError::GrantTooShort {
                asked: self.ttl,
                granted,
                op_timeout,
                renew_interval,
                drift,
                margin: self.margin,
            });
        }
        Ok(())
    }
}

/// Builder of a [`LeaseConfig`]: consuming setters, validated by [`build`](Self::build).
#[derive(Debug, Clone)]
pub struct LeaseConfigBuilder {
    ttl: Duration,
    renew_interval: Option<Duration>,
    op_timeout: Option<Duration>,
    drift_factor: f64,
    margin: Option<Duration>,
    renew_failures_before_lost: u32,
    max_hold: Option<Duration>,
    max_renewals: Option<u64>,
    backoff: Backoff,
    ambiguous_retries: u32,
    watchdog_thread: bool,
}

impl LeaseConfigBuilder {
    setters! {
        /// Renew every `d` (default `ttl / 3`). A lease granted a shorter TTL than `ttl` is
        /// renewed every `d × granted / ttl` ([`LeaseConfig::renew_interval_for`]).
        renew_interval(d: Duration) => Some;
        /// Bound every store call by `d` (default `ttl / 6`, at most 5 s). The renewals of a
        /// lease granted a shorter TTL than `ttl` are bounded by `d × granted / ttl`
        /// ([`LeaseConfig::op_timeout_for`]).
        op_timeout(d: Duration) => Some;
        /// Assumed clock-rate drift, as a fraction of the TTL (default 0.01).
        drift_factor(f: f64);
        /// Fixed safety margin subtracted from the validity window (default 5 ms, or
        /// `ttl / 20` for TTLs under 100 ms).
        margin(d: Duration) => Some;
        /// Lose the lease after `n` consecutive failed renewals (default 2).
        renew_failures_before_lost(n: u32);
        /// Stop renewing and lose the lease `d` after it was acquired (default: unbounded).
        max_hold(d: Duration) => Some;
        /// Stop renewing and lose the lease after `n` renewals (default: unbounded).
        max_renewals(n: u64) => Some;
        /// Retry policy of waiting acquisitions (default 50 ms base, 2 s cap).
        backoff(b: Backoff);
        /// Retries, with the same owner token, of an acquire whose reply was ambiguous
        /// (timeout or reset after send). Default 2.
        ambiguous_retries(n: u32);
        /// Whether a process-wide OS thread watches validity deadlines (default `true`).
        ///
        /// With it, the lost signal fires at the deadline even when the async runtime is
        /// starved (every worker blocked by CPU work). Turn it off only in tests that run on
        /// tokio's paused clock, which that thread cannot see.
        watchdog_thread(on: bool);
    }

    /// Validates and builds.
    ///
    /// # Errors
    /// - [`ConfigError::TtlTooShort`] / [`ConfigError::TtlTooLong`]: `ttl` outside
    ///   [`MIN_TTL`]..=[`MAX_TTL`];
    /// - [`ConfigError::RenewInterval`]: interval zero or not below `ttl`;
    /// - [`ConfigError::OpTimeoutZero`];
    /// - [`ConfigError::DriftFactor`]: drift not in `0.0..0.5`;
    /// - [`ConfigError::NoRoomToRenew`]: `op_timeout + renew_interval + drift × ttl +
    ///   margin ≥ ttl`;
    /// - [`ConfigError::RenewFailuresZero`], [`ConfigError::MaxHoldZero`].
    pub fn build(self) -> Result<LeaseConfig, ConfigError> {
        let ttl = self.ttl;
        if ttl < MIN_TTL {
            return Err(ConfigError::TtlTooShort(ttl));
        }
        if ttl > MAX_TTL {
            return Err(ConfigError::TtlTooLong(ttl));
        }
        let renew_interval = self.renew_interval.unwrap_or(ttl / 3);
        if renew_interval.is_zero() || renew_interval >= ttl {
            return Err(ConfigError::RenewInterval {
                renew_interval,
                ttl,
            });
        }
        let op_timeout = self
            .op_timeout
            .unwrap_or_else(|| (ttl / 6).min(Duration::from_secs(5)));
        if op_timeout.is_zero() {
            return Err(ConfigError::OpTimeoutZero);
        }
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err(ConfigError::DriftFactor(self.drift_factor));
        }
        let drift = ttl.mul_f64(self.drift_factor);
        let margin = self
            .margin
            .unwrap_or_else(|| Duration::from_millis(5).min(ttl / 20));
        let needed = op_timeout
            .checked_add(renew_interval)
            .and_then(|d| d.checked_add(drift))
            .and_then(|d| d.checked_add(margin));
        if needed.is_none_or(|n| n >= ttl) {
            return Err(ConfigError::NoRoomToRenew {
                op_timeout,
                renew_interval,
                drift,
                margin,
                ttl,
            });
        }
        if self.renew_failures_before_lost == 0 {
            return Err(ConfigError::RenewFailuresZero);
        }
        if self.max_hold.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::MaxHoldZero);
        }
        Ok(LeaseConfig {
            ttl,
            renew_interval,
            op_timeout,
            drift_factor: self.drift_factor,
            margin,
            renew_failures_before_lost: self.renew_failures_before_lost,
            max_hold: self.max_hold,
            max_renewals: self.max_renewals,
            backoff: self.backoff,
            ambiguous_retries: self.ambiguous_retries,
            watchdog_thread: self.watchdog_thread,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// Each of the grant check's four reasons refuses a grant on its own, with the other
    /// three satisfied, and each stops at its edge.
    #[test]
    fn each_reason_of_the_grant_check_refuses_alone() {
        let us = Duration::from_micros(1);
        let ms = Duration::from_millis(1);
        let b = |renew: Duration, op: Duration| {
            LeaseConfig::builder(3600 * S)
                .renew_interval(renew)
                .op_timeout(op)
                .drift_factor(0.0)
                .margin(Duration::ZERO)
                .build()
                .unwrap()
        };
        let too_short = |c: &LeaseConfig, g: Duration| {
            matches!(c.check_grant(g), Err(ConfigError::GrantTooShort { .. }))
        };
        // Below MIN_TTL only: 9 ms of a 1 h lease renewed every 20 min within 10 min
        // scales to 3 ms and 1.5 ms, which fit in 9 ms.
        let c = b(1200 * S, 600 * S);
        assert!(too_short(&c, MIN_TTL - ms));
        assert!(c.check_grant(MIN_TTL).is_ok());
        // The scaled operation timeout is zero only: 1 µs of a 1 h lease scales to 0 ns
        // for a 1 s grant, whose renew interval (333 ms) fits.
        let c = b(1200 * S, us);
        assert_eq!(c.op_timeout_for(S), Duration::ZERO);
        assert!(too_short(&c, S));
        assert!(c.check_grant(4 * S).is_ok(), "1 ns of timeout at 4 s");
        // The scaled renew interval is zero only.
        let c = b(us, 600 * S);
        assert_eq!(c.renew_interval_for(S), Duration::ZERO);
        assert!(too_short(&c, S));
        assert!(c.check_grant(4 * S).is_ok(), "1 ns of interval at 4 s");
        // No room only: the margin does not scale. A 1.8 s grant needs 0.6 s + 0.3 s +
        // 1 s; a 2.1 s grant needs 0.7 s + 0.35 s + 1 s.
        let c = LeaseConfig::builder(3600 * S)
            .renew_interval(1200 * S)
            .op_timeout(600 * S)
            .drift_factor(0.0)
            .margin(S)
            .build()
            .unwrap();
        assert!(too_short(&c, 1800 * ms));
        assert!(c.check_grant(2100 * ms).is_ok());
    }

    #[test]
    fn defaults_are_valid_across_the_range() {
        for ttl in [MIN_TTL, Duration::from_millis(300), 10 * S, MAX_TTL] {
            let c = LeaseConfig::new(ttl).unwrap();
            assert_eq!(c.renew_interval(), ttl / 3);
            assert!(c.op_timeout() <= 5 * S);
            assert!(c.validity(ttl) < ttl);
        }
    }

    #[test]
    fn the_ttl_range_is_10_ms_to_24_h() {
        assert_eq!(MAX_TTL, Duration::from_secs(86_400));
        assert!(LeaseConfig::new(Duration::from_secs(86_400)).is_ok());
        assert!(matches!(
            LeaseConfig::new(Duration::from_secs(86_400) + Duration::from_millis(1)),
            Err(ConfigError::TtlTooLong(_))
        ));
        assert_eq!(MIN_TTL, Duration::from_millis(10));
    }

    #[test]
    fn every_setting_is_kept() {
        let backoff = Backoff::new(Duration::from_millis(3), Duration::from_millis(9)).unwrap();
        let c = LeaseConfig::builder(10 * S)
            .renew_interval(2 * S)
            .op_timeout(S)
            .drift_factor(0.02)
            .margin(Duration::from_millis(7))
            .renew_failures_before_lost(4)
            .max_hold(60 * S)
            .max_renewals(9)
            .backoff(backoff)
            .ambiguous_retries(5)
            .watchdog_thread(false)
            .build()
            .unwrap();
        assert_eq!(c.ttl(), 10 * S);
        assert_eq!(c.renew_interval(), 2 * S);
        assert_eq!(c.op_timeout(), S);
        assert_eq!(c.drift_factor(), 0.02);
        assert_eq!(c.margin(), Duration::from_millis(7));
        assert_eq!(c.renew_failures_before_lost(), 4);
        assert_eq!(c.max_hold(), Some(60 * S));
        assert_eq!(c.max_renewals(), Some(9));
        assert_eq!(c.backoff(), backoff);
        assert_eq!(c.ambiguous_retries(), 5);
        assert!(!c.watchdog_thread());
        let d = LeaseConfig::new(10 * S).unwrap();
        assert_eq!(d.ambiguous_retries(), 2);
        assert!(d.watchdog_thread());
        assert_eq!(d.max_hold(), None);
        assert_eq!(d.max_renewals(), None);
    }

    #[test]
    fn rules() {
        assert_eq!(
            LeaseConfig::new(Duration::ZERO),
            Err(ConfigError::TtlTooShort(Duration::ZERO))
        );
        assert!(matches!(
            LeaseConfig::new(MAX_TTL + S),
            Err(ConfigError::TtlTooLong(_))
        ));
        assert!(matches!(
            LeaseConfig::new(Duration::MAX),
            Err(ConfigError::TtlTooLong(_))
        ));
        let b = || LeaseConfig::builder(10 * S);
        assert!(matches!(
            b().renew_interval(10 * S).build(),
            Err(ConfigError::RenewInterval { .. })
        ));
        assert!(matches!(
            b().renew_interval(Duration::ZERO).build(),
            Err(ConfigError::RenewInterval { .. })
        ));
        assert_eq!(
            b().op_timeout(Duration::ZERO).build(),
            Err(ConfigError::OpTimeoutZero)
        );
        assert!(matches!(
            b().renew_interval(5 * S).op_timeout(5 * S).build(),
            Err(ConfigError::NoRoomToRenew { .. })
        ));
        assert!(matches!(
            b().op_timeout(Duration::MAX).build(),
            Err(ConfigError::NoRoomToRenew { .. })
        ));
        assert!(matches!(
            b().drift_factor(f64::NAN).build(),
            Err(ConfigError::DriftFactor(_))
        ));
        assert!(matches!(
            b().drift_factor(-0.1).build(),
            Err(ConfigError::DriftFactor(_))
        ));
        assert_eq!(
            b().renew_failures_before_lost(0).build(),
            Err(ConfigError::RenewFailuresZero)
        );
        assert_eq!(
            b().max_hold(Duration::ZERO).build(),
            Err(ConfigError::MaxHoldZero)
        );
    }

    #[test]
    fn validity_subtracts_drift_and_margin() {
        let c = LeaseConfig::builder(10 * S)
            .drift_factor(0.01)
            .margin(Duration::from_millis(5))
            .build()
            .unwrap();
        assert_eq!(c.validity(10 * S), Duration::from_millis(9895));
    }
}
