//! Full-jitter exponential backoff for acquisition retries.

use std::time::Duration;

use rand::Rng;

use crate::config::error::ConfigError;

/// Full-jitter exponential backoff: the delay before retry `attempt` (0-based) is drawn
/// uniformly from `0..=min(cap, base × 2^attempt)`.
///
/// Full jitter spreads contenders out so that a released lease is not stormed by every
/// waiter at the same instant. The random source is passed in, so tests are deterministic.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{Backoff, ConfigError, LeaseConfig};
/// use rand::{SeedableRng, rngs::StdRng};
///
/// let backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(100))?;
/// assert_eq!(backoff.ceiling(0), Duration::from_millis(10));
/// assert_eq!(backoff.ceiling(2), Duration::from_millis(40));
/// assert_eq!(backoff.ceiling(10), Duration::from_millis(100)); // capped
///
/// let mut rng = StdRng::seed_from_u64(1);
/// let delay = backoff.delay(2, &mut rng);
/// assert!(delay <= Duration::from_millis(40));
///
/// // The acquire policy of a client's waiting acquisitions:
/// let config = LeaseConfig::builder(Duration::from_secs(10)).backoff(backoff).build()?;
/// assert_eq!(config.backoff(), backoff);
///
/// // A zero base, or a cap below the base, is refused.
/// assert_eq!(Backoff::new(Duration::ZERO, Duration::from_secs(1)), Err(ConfigError::BackoffBaseZero));
/// # Ok::<(), ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
}

impl Backoff {
    /// A backoff starting at `base` and never exceeding `cap`.
    ///
    /// # Errors
    /// - [`ConfigError::BackoffBaseZero`] when `base` is zero;
    /// - [`ConfigError::BackoffCapBelowBase`] when `cap < base`.
    pub fn new(base: Duration, cap: Duration) -> Result<Self, ConfigError> {
        if base.is_zero() {
            return Err(ConfigError::BackoffBaseZero);
        }
        if cap < base {
            return Err(ConfigError::BackoffCapBelowBase { base, cap });
        }
        Ok(Self { base, cap })
    }

    /// The first (smallest) ceiling.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The largest ceiling.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The ceiling for retry `attempt`: `min(cap, base × 2^attempt)`, without overflow.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.base
            .checked_mul(factor)
            .unwrap_or(self.cap)
            .min(self.cap)
    }

    /// A random delay for retry `attempt`, uniform in `0..=ceiling(attempt)`.
    pub fn delay<R: Rng + ?Sized>(&self, attempt: u32, rng: &mut R) -> Duration {
        // Saturates at u64::MAX ns (584 years) instead of truncating a huge ceiling.
        let ceiling = u64::try_from(self.ceiling(attempt).as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rng.random_range(0..=ceiling))
    }
}

impl Default for Backoff {
    /// 50 ms base, 2 s cap.
    fn default() -> Self {
        Self {
            base: Duration::from_millis(50),
            cap: Duration::from_secs(2),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn getters_return_what_was_given() {
        let b = Backoff::new(Duration::from_millis(7), Duration::from_millis(70)).unwrap();
        assert_eq!(
            (b.base(), b.cap()),
            (Duration::from_millis(7), Duration::from_millis(70))
        );
    }

    #[test]
    fn validation() {
        assert_eq!(
            Backoff::new(Duration::ZERO, Duration::from_secs(1)),
            Err(ConfigError::BackoffBaseZero)
        );
        assert!(matches!(
            Backoff::new(Duration::from_secs(2), Duration::from_secs(1)),
            Err(ConfigError::BackoffCapBelowBase { .. })
        ));
    }

    #[test]
    fn ceiling_grows_then_caps_without_overflow() {
        let b = Backoff::new(Duration::from_millis(10), Duration::from_millis(100)).unwrap();
        assert_eq!(b.ceiling(0), Duration::from_millis(10));
        assert_eq!(b.ceiling(1), Duration::from_millis(20));
        assert_eq!(b.ceiling(3), Duration::from_millis(80));
        assert_eq!(b.ceiling(4), Duration::from_millis(100));
        assert_eq!(b.ceiling(u32::MAX), Duration::from_millis(100));
        let huge = Backoff::new(Duration::from_secs(u64::MAX / 4), Duration::MAX).unwrap();
        assert_eq!(huge.ceiling(40), Duration::MAX);
    }

    #[test]
    fn delays_are_full_jitter_and_deterministic_with_a_seed() {
        let b = Backoff::new(Duration::from_millis(10), Duration::from_secs(1)).unwrap();
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..64)
                .map(|a| b.delay(a % 8, &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let mut rng = StdRng::seed_from_u64(1);
        let mut below_half = 0;
        for _ in 0..1000 {
            let d = b.delay(2, &mut rng);
            assert!(d <= Duration::from_millis(40));
            if d < Duration::from_millis(20) {
                below_half += 1;
            }
        }
        // Full jitter: about half the draws fall below half the ceiling.
        assert!((350..650).contains(&below_half), "{below_half}");
    }
}
