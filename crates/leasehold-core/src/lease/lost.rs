//! Why a lease was lost.

use std::fmt;

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
    /// The client is shutting down ([`LeaseClient::shutdown`](crate::LeaseClient::shutdown)):
    /// renewal stopped on purpose. Not counted as a lost lease in metrics.
    Shutdown,
    /// The store saw the server session that held the lease end (a server restart, a
    /// killed session), and the lease with it ([`EndedGrants`](crate::EndedGrants)).
    SessionEnded,
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
            Self::Shutdown => "shutdown",
            Self::SessionEnded => "session_ended",
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
            Self::Shutdown => f.write_str("the client is shutting down"),
            Self::SessionEnded => f.write_str("the store's session holding the lease ended"),
        }
    }
}
