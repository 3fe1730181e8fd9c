//! Counts a client's live lease handles, so that a shutdown knows when the last is gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

use crate::lease::ended::Tracked;

/// Counts a client's live lease handles; wakes [`LeaseClient::shutdown`] at zero.
#[derive(Debug, Default)]
pub(crate) struct Live {
    pub(crate) count: AtomicUsize,
    pub(crate) zero: Notify,
    /// The leases the store may report ended ([`Store::ended_grants`]), told as long as a
    /// lease handle or the client lives.
    pub(crate) ended: Option<Arc<Tracked>>,
}

/// One live lease handle, counted until it is dropped.
#[derive(Debug)]
pub(crate) struct LiveGuard(Arc<Live>);

impl LiveGuard {
    pub(crate) fn new(live: &Arc<Live>) -> Self {
        live.count.fetch_add(1, Ordering::AcqRel);
        Self(live.clone())
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.zero.notify_waiters();
        }
    }
}
