//! A hook that sees the client's own renewals, for histories and audits (the chaos
//! harness records them and checks that no renewal is sent after the holder's deadline or
//! accepted after its lost signal).

use std::fmt;
use std::time::Duration;

use crate::key::Key;
use crate::token::{Fence, OwnerToken};

/// What happened to a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenewalPhase {
    /// The renewal is about to be sent.
    Sent,
    /// The store answered that the lease was renewed, and the client extended the
    /// holder's deadline.
    Accepted,
    /// The store answered that the lease was renewed, but the client did not extend the
    /// deadline: the reply came after the deadline, or the lease had been lost, released
    /// or shut down meanwhile.
    Refused,
    /// The store answered `NotOwner`.
    NotOwner,
    /// The renewal failed (error or timeout).
    Failed,
}

/// One renewal event, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RenewalEvent<'a> {
    /// The lease's key.
    pub key: &'a Key,
    /// The holder's owner token.
    pub owner: &'a OwnerToken,
    /// The lease's fence.
    pub fence: Fence,
    /// What happened.
    pub phase: RenewalPhase,
    /// The validity left at this moment, after the event took effect (zero once the
    /// deadline has passed).
    pub remaining: Duration,
    /// Whether the lease's lost signal had fired before this event.
    pub lost: bool,
}

/// Sees the client's renewals. Called on the renewal scheduler's task, synchronously:
/// keep it quick (append to a buffer or a file), never block on the network.
pub trait LeaseObserver: Send + Sync + fmt::Debug + 'static {
    /// A renewal event.
    fn renewal(&self, event: &RenewalEvent<'_>);
}
