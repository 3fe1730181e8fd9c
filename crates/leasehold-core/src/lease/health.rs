//! A held lease's health: held, at risk (a renewal failed, the deadline has not passed),
//! or lost; and a stream of its changes.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::lease::lost::LostReason;
use crate::lease::shared::LeaseShared;

/// How a held lease is doing, as its holder sees it ([`Lease::health`](crate::Lease::health)).
///
/// A lease is **at risk** from the first renewal that failed (a store error, or no reply
/// within the operation timeout) until a renewal is confirmed (back to
/// [`Held`](Self::Held)) or its validity deadline passes ([`Lost`](Self::Lost)). It is
/// still held while at risk: the work in hand may finish, but a job that can should not
/// start new units of work until the lease is held again. A lease whose renewal is merely
/// in flight is not at risk; one lost at once (the store answered that another owner has
/// it, or `renew_failures_before_lost` is 1) goes straight to `Lost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Health {
    /// Held, and its last renewal (or the acquire) was confirmed.
    Held,
    /// Still held, but a renewal failed at `since`; unless one is confirmed first, the
    /// lease is lost at `deadline` (its validity deadline, on tokio's clock).
    AtRisk {
        /// When the first failed renewal of this spell was seen.
        since: Instant,
        /// The validity deadline: lost then, unless a renewal is confirmed first.
        deadline: Instant,
    },
    /// Lost, with why. Final.
    Lost(LostReason),
}

impl Health {
    /// `held`, `at_risk` or `lost`: a stable name for logs, files and labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Health::Held => "held",
            Health::AtRisk { .. } => "at_risk",
            Health::Lost(_) => "lost",
        }
    }

    /// Whether the lease is still held (held or at risk).
    pub fn is_held(&self) -> bool {
        !matches!(self, Health::Lost(_))
    }
}

/// The changes of one lease's health ([`Lease::health_changes`](crate::Lease::health_changes)):
/// [`next`](Self::next) resolves at each change after the one last returned (or after the
/// stream was made). `'static` and `Send`: it may outlive the lease handle, and then
/// resolves no more unless the lease was lost.
#[derive(Debug)]
pub struct HealthChanges {
    shared: Arc<LeaseShared>,
    rx: watch::Receiver<u64>,
}

impl HealthChanges {
    pub(crate) fn new(shared: Arc<LeaseShared>) -> Self {
        let rx = shared.health_subscribe();
        Self { shared, rx }
    }

    /// The health now (the deadline checked on the spot, as
    /// [`Lease::health`](crate::Lease::health) does).
    pub fn current(&self) -> Health {
        self.shared.health()
    }

    /// Waits for the next change and returns the health after it. Changes that came while
    /// nobody waited are not lost: the first call after them returns at once with the
    /// health now (several changes in between are seen as one). Once the lease is lost,
    /// every call returns `Lost` at once. A lease released, or dropped, while held never
    /// changes again: the future then stays pending.
    ///
    /// Cancel safe: dropping the future loses no change.
    pub async fn next(&mut self) -> Health {
        let lost = self.shared.health();
        if !lost.is_held() {
            return lost;
        }
        if self.rx.changed().await.is_err() {
            // The lease state is gone with every handle: nothing changes any more.
            std::future::pending::<()>().await;
        }
        self.rx.borrow_and_update();
        self.shared.health()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_state_has_its_name_and_only_lost_is_not_held() {
        let at = Instant::now();
        let risk = Health::AtRisk {
            since: at,
            deadline: at,
        };
        let lost = Health::Lost(LostReason::Expired);
        assert_eq!(
            [Health::Held.as_str(), risk.as_str(), lost.as_str()],
            ["held", "at_risk", "lost"]
        );
        assert!(Health::Held.is_held());
        assert!(risk.is_held());
        assert!(!lost.is_held());
    }
}
