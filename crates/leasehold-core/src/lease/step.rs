//! One attempt of an acquire, as a public step: the client runs the loop around it (the
//! owner token, the wait, ambiguous replies, backoff, the lease handle, orphan releases),
//! and a step says what one attempt asks of the store. The plain acquire is the step of
//! one key; the recipes build on the same public API as a user could (a semaphore's
//! permit is a step over its slots, with the check of its number of permits).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Error, StoreError};
use crate::key::Key;
use crate::store::{AcquireAnyOutcome, Store};
use crate::token::OwnerToken;

/// What one attempt of [`LeaseClient::acquire_with`](crate::LeaseClient::acquire_with)
/// asks of the store: to take one of [`keys`](Self::keys) for the call's owner.
///
/// The client draws the owner token once per acquire, retries ambiguous replies with the
/// same owner, waits with jittered backoff (bounded by the remaining TTL reported) while
/// every key is held, turns a grant into a renewed [`Lease`](crate::Lease) whose validity
/// counts from the send of the attempt, and releases the owner on every key when a call
/// that may have been granted one ends without handing out a lease.
#[async_trait]
pub trait AcquireStep: Send + Sync {
    /// The name errors, logs and metrics give the call.
    fn name(&self) -> &Key;

    /// Every key an attempt may be granted; a grant's `index` refers to this slice.
    fn keys(&self) -> &[Key];

    /// Whether, while its one key is held, the client may wait for the store's release
    /// notice ([`Store::waiter`]) instead of backing off blindly. Default: `false`.
    fn waits_for_release(&self) -> bool {
        false
    }

    /// One attempt. It answers as [`BatchStore::acquire_any`](crate::BatchStore::acquire_any)
    /// does for [`keys`](Self::keys): the owner's key or a newly granted one, else
    /// `Held`. An [`Error::Store`] is treated as a store call's error (an ambiguous one is
    /// retried with the same owner, a retryable one waited out until the deadline); any
    /// other error ends the acquire at once, as a refusal in which this attempt took
    /// nothing.
    ///
    /// # Cancel safety
    /// Need not be: the client releases the owner on every key when a call is dropped.
    async fn attempt(&self, call: &StepCall<'_>) -> Result<AcquireAnyOutcome, Error>;
}

/// What an [`AcquireStep`] is given for one attempt: the store, the owner, the TTL to
/// ask and the operation timeout that bounds each store call.
#[derive(Debug)]
pub struct StepCall<'a> {
    pub(crate) store: &'a Arc<dyn Store>,
    pub(crate) owner: OwnerToken,
    pub(crate) ttl: Duration,
    pub(crate) limit: Duration,
    pub(crate) may_hold: bool,
    pub(crate) waits: bool,
}

impl StepCall<'_> {
    /// The client's store.
    pub fn store(&self) -> &dyn Store {
        &**self.store
    }

    /// The owner token of this acquire (the same for every attempt of it).
    pub fn owner(&self) -> &OwnerToken {
        &self.owner
    }

    /// The TTL to ask for.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether an earlier attempt of this acquire may have been granted one of the keys
    /// (its reply was lost): the owner's key must then be looked for first
    /// ([`acquire_any`](crate::acquire_any) does).
    pub fn may_hold(&self) -> bool {
        self.may_hold
    }

    /// Whether this acquire waits when the key is held (it was given a wait): when it does
    /// not, a step may ask with [`Store::acquire_no_wait`] (where the store
    /// [has one](Store::has_acquire_no_wait)).
    pub fn waits(&self) -> bool {
        self.waits
    }

    /// `call` bounded by the client's operation timeout: on expiry a
    /// [`StoreErrorKind::Timeout`](crate::StoreErrorKind::Timeout) naming `op`.
    ///
    /// # Cancel safety
    /// As `call`.
    pub async fn bounded<T>(
        &self,
        op: &str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        StoreError::bounded(self.store.backend(), op, self.limit, call).await
    }
}

/// The plain acquire's step: one [`Store::acquire`] of one key.
pub(crate) struct OneKey<'a>(pub(crate) &'a Key);

#[async_trait]
impl AcquireStep for OneKey<'_> {
    fn name(&self) -> &Key {
        self.0
    }

    fn keys(&self) -> &[Key] {
        std::slice::from_ref(self.0)
    }

    fn waits_for_release(&self) -> bool {
        true
    }

    async fn attempt(&self, call: &StepCall<'_>) -> Result<AcquireAnyOutcome, Error> {
        let (store, owner, ttl) = (call.store(), call.owner(), call.ttl());
        let acquire = if call.waits() || !store.has_acquire_no_wait() {
            store.acquire(self.0, owner, ttl)
        } else {
            store.acquire_no_wait(self.0, owner, ttl)
        };
        Ok(call.bounded("acquire", acquire).await?.into())
    }
}
