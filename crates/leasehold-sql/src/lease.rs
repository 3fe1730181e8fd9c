//! The steps every SQL store's lease operations take the same way, whatever its SQL: a TTL
//! in microseconds, a remaining TTL from microseconds, the outcome of a renewal or a
//! release from whether its statement matched the caller's lease, and the keys a `list`
//! keeps.

use std::time::Duration;

use leasehold_core::{Key, KeyError, ReleaseOutcome, RenewOutcome, StoreError};

/// `ttl` in whole microseconds, once [`StoreError::check_ttl`] accepted it.
///
/// # Errors
/// [`StoreErrorKind::InvalidInput`](leasehold_core::StoreErrorKind::InvalidInput) for a TTL
/// outside 10 ms ..= 24 h.
pub fn ttl_us(backend: &'static str, ttl: Duration) -> Result<i64, StoreError> {
    StoreError::check_ttl(backend, ttl)?;
    // check_ttl bounds it to 24 h, far below i64::MAX µs.
    Ok(i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX))
}

/// `us` microseconds as a duration; a negative count is zero.
pub fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// What is left from `now_us` until `expires_us` (both on one clock, in µs): zero once
/// passed.
pub fn remaining(expires_us: i64, now_us: i64) -> Duration {
    micros(expires_us.saturating_sub(now_us))
}

/// A renewal's answer: `Renewed` for `ttl` if its statement matched the caller's live
/// lease, `NotOwner` otherwise.
pub fn renewed(matched: bool, ttl: Duration) -> RenewOutcome {
    if matched {
        RenewOutcome::Renewed { ttl }
    } else {
        RenewOutcome::NotOwner
    }
}

/// A release's answer: `Released` if its statement matched the caller's live lease,
/// `NotOwner` otherwise.
pub fn released(matched: bool) -> ReleaseOutcome {
    if matched {
        ReleaseOutcome::Released
    } else {
        ReleaseOutcome::NotOwner
    }
}

/// The key of a row that a `list` of `prefix` read: `None` when the stored key does not
/// start with `prefix` byte for byte (a `LIKE` may match more, e.g. under a collation that
/// folds case); `invalid` reports a stored key that is not a valid [`Key`].
///
/// # Errors
/// What `invalid` makes of the key's error.
pub fn listed_key(
    name: &str,
    prefix: &str,
    invalid: impl FnOnce(KeyError) -> StoreError,
) -> Result<Option<Key>, StoreError> {
    if !name.starts_with(prefix) {
        return Ok(None);
    }
    Key::new(name).map(Some).map_err(invalid)
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
    fn outcomes_and_listed_keys() {
        let ttl = Duration::from_secs(1);
        assert_eq!(renewed(true, ttl), RenewOutcome::Renewed { ttl });
        assert_eq!(renewed(false, ttl), RenewOutcome::NotOwner);
        assert_eq!(released(true), ReleaseOutcome::Released);
        assert_eq!(released(false), ReleaseOutcome::NotOwner);
        let bad = |_| StoreError::new(leasehold_core::StoreErrorKind::Corrupt, "test", "bad");
        assert_eq!(
            listed_key("job:a", "job:", bad).unwrap(),
            Some(Key::new("job:a").unwrap())
        );
        assert_eq!(listed_key("Job:a", "job:", bad).unwrap(), None);
        assert!(listed_key("", "", bad).is_err());
    }
}
