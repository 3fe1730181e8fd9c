//! Shared vocabulary of the storage-side guards (DESIGN §6).
//!
//! A guard keeps, per protected resource, the highest fence it has accepted. Checking the
//! fence, writing the data and advancing the guard happen in one transaction of the
//! caller's own database. The database backend crates implement it; this module holds the
//! types they share, so callers handle every guard the same way.

use crate::token::Fence;

/// The decision of a guard for one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardDecision {
    /// The fence is at least the highest accepted: the write may proceed in this
    /// transaction, and the guard now records this fence.
    Accepted {
        /// The highest fence accepted before, if any.
        previous: Option<Fence>,
    },
    /// The fence is below the highest accepted: the writer lost its lease. Roll back and
    /// stop; never retry with the same fence.
    Rejected {
        /// The highest fence accepted so far.
        current: Fence,
    },
}

impl GuardDecision {
    /// Whether the write may proceed.
    pub fn is_accepted(self) -> bool {
        matches!(self, Self::Accepted { .. })
    }

    /// `Ok(())` when accepted, otherwise [`Error::FenceRejected`](crate::Error::FenceRejected)
    /// (whose action is [`OwnershipLost`](crate::Action::OwnershipLost)).
    ///
    /// # Errors
    /// [`Error::FenceRejected`](crate::Error::FenceRejected) when rejected.
    pub fn into_result(self, resource: &str, fence: Fence) -> Result<(), crate::Error> {
        match self {
            Self::Accepted { .. } => Ok(()),
            Self::Rejected { current } => Err(crate::Error::FenceRejected {
                resource: resource.to_owned(),
                fence,
                current,
            }),
        }
    }
}

/// The result of recording a job id in an idempotency record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idempotency {
    /// First time: do the work in this transaction.
    FirstTime,
    /// Already recorded by a committed transaction: the work was done; skip it.
    AlreadyDone,
}
