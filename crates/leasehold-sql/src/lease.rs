//! The steps every SQL store's lease operations take the same way, whatever its SQL.

use std::time::Duration;

use leasehold_core::{ReleaseOutcome, RenewOutcome, StoreError};

/// `ttl` in whole microseconds, once [`StoreError::check_ttl`] accepted it (or its error).
pub fn ttl_us(backend: &'static str, ttl: Duration) -> Result<i64, StoreError> {
    StoreError::check_ttl(backend, ttl)?;
    // check_ttl bounds it to 24 h, far below i64::MAX µs.
    Ok(i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX))
}

/// `us` microseconds as a duration; a negative count is zero.
pub fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// What is left from `now_us` until `expires_us` (µs on one clock): zero once passed.
pub fn remaining(expires_us: i64, now_us: i64) -> Duration {
    micros(expires_us.saturating_sub(now_us))
}

/// A renewal's answer: `Renewed` if it matched the caller's live lease.
pub fn renewed(matched: bool, ttl: Duration) -> RenewOutcome {
    if matched {
        RenewOutcome::Renewed { ttl }
    } else {
        RenewOutcome::NotOwner
    }
}

/// A release's answer: `Released` if it matched the caller's live lease.
pub fn released(matched: bool) -> ReleaseOutcome {
    if matched {
        ReleaseOutcome::Released
    } else {
        ReleaseOutcome::NotOwner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_and_durations() {
        assert_eq!(ttl_us("test", Duration::from_millis(15)).unwrap(), 15_000);
        assert!(ttl_us("test", Duration::from_millis(1)).is_err());
        assert_eq!(micros(-5), Duration::ZERO);
        assert_eq!(remaining(10, 4), Duration::from_micros(6));
        assert_eq!(remaining(4, 10), Duration::ZERO);
        assert_eq!(remaining(i64::MIN, i64::MAX), Duration::ZERO);
    }

    #[test]
    fn outcomes() {
        let ttl = Duration::from_secs(1);
        assert_eq!(renewed(true, ttl), RenewOutcome::Renewed { ttl });
        assert_eq!(renewed(false, ttl), RenewOutcome::NotOwner);
        assert_eq!(released(true), ReleaseOutcome::Released);
        assert_eq!(released(false), ReleaseOutcome::NotOwner);
    }
}
