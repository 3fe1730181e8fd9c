//! The rules a configuration can break.

use std::time::Duration;

/// A configuration that breaks a rule. Each variant says which rule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// TTL below [`MIN_TTL`](crate::config::MIN_TTL) (including zero).
    #[error("ttl {0:?} is below the minimum of 10ms")]
    TtlTooShort(Duration),
    /// TTL above [`MAX_TTL`](crate::config::MAX_TTL).
    #[error("ttl {0:?} is above the maximum of 24h")]
    TtlTooLong(Duration),
    /// The renew interval is zero or not below the TTL.
    #[error("renew interval {renew_interval:?} must be above zero and below the ttl {ttl:?}")]
    RenewInterval {
        /// The configured interval.
        renew_interval: Duration,
        /// The configured TTL.
        ttl: Duration,
    },
    /// The operation timeout is zero.
    #[error("operation timeout must be above zero")]
    OpTimeoutZero,
    /// `op_timeout + renew_interval + drift × ttl + margin` does not fit in the TTL, so a
    /// renewal could not complete before the lease expires.
    #[error(
        "operation timeout {op_timeout:?} + renew interval {renew_interval:?} + drift allowance {drift:?} + margin {margin:?} must be below the ttl {ttl:?}"
    )]
    NoRoomToRenew {
        /// The operation timeout.
        op_timeout: Duration,
        /// The renew interval.
        renew_interval: Duration,
        /// `drift_factor × ttl`.
        drift: Duration,
        /// The safety margin.
        margin: Duration,
        /// The TTL.
        ttl: Duration,
    },
    /// The store granted a shorter TTL than the one asked, and the configuration scaled
    /// to it (see [`LeaseConfig::renew_interval_for`](crate::LeaseConfig::renew_interval_for)) leaves no room to renew: the
    /// grant is refused and released. Ask for a TTL the store grants in full
    /// (ZooKeeper grants at most its session timeout), or make the margin smaller.
    #[error(
        "the store granted a ttl of {granted:?} where {asked:?} was asked, and scaled to it operation timeout {op_timeout:?} + renew interval {renew_interval:?} + drift allowance {drift:?} + margin {margin:?} do not fit below {granted:?}: ask for a ttl the store grants in full (ZooKeeper grants at most its session timeout) or lower the margin"
    )]
    GrantTooShort {
        /// The TTL asked for (the configured one).
        asked: Duration,
        /// The TTL the store granted.
        granted: Duration,
        /// The operation timeout scaled to the grant.
        op_timeout: Duration,
        /// The renew interval scaled to the grant.
        renew_interval: Duration,
        /// `drift_factor × granted`.
        drift: Duration,
        /// The safety margin (not scaled).
        margin: Duration,
    },
    /// The drift factor is not in `0.0..0.5` (or is not a number).
    #[error("clock drift factor {0} must be in 0.0..0.5")]
    DriftFactor(f64),
    /// `renew_failures_before_lost` is zero.
    #[error("renew failures before lost must be at least 1")]
    RenewFailuresZero,
    /// `max_hold` is zero.
    #[error("max hold must be above zero")]
    MaxHoldZero,
    /// The backoff base is zero.
    #[error("backoff base must be above zero")]
    BackoffBaseZero,
    /// The backoff cap is below its base.
    #[error("backoff cap {cap:?} is below its base {base:?}")]
    BackoffCapBelowBase {
        /// The base.
        base: Duration,
        /// The cap.
        cap: Duration,
    },
}
