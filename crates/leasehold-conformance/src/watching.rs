//! Helpers for tests of [`WatchStore::watch`](leasehold_core::WatchStore::watch) (the shared case
//! [`watch_notices_grants_releases_and_record_writes`](crate::coordination::watch_notices_grants_releases_and_record_writes)
//! and each store's own watch tests): a notice expected, silence expected, a grant.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use leasehold_core::{AcquireOutcome, Changes, Fence, Key, OwnerToken, Store, StoreError};
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// How long a change may take to be noticed by a watch: generous, for a loaded machine.
pub const NOTICE_WITHIN: Duration = Duration::from_secs(10);

/// Waits for the next notice of `changes`, at most [`NOTICE_WITHIN`]; panics, naming
/// `what` was expected, when the watch fails, ends or says nothing.
pub async fn notice(changes: &mut Changes, what: &str) {
    match timeout(NOTICE_WITHIN, changes.next()).await {
        Ok(Some(Ok(()))) => {}
        Ok(Some(Err(e))) => panic!("the watch failed instead of noticing {what}: {e}"),
        Ok(None) => panic!("the watch ended instead of noticing {what}"),
        Err(_) => panic!("no notice of {what} within {NOTICE_WITHIN:?}"),
    }
}

/// [`notice`], then takes whatever else comes within 200 ms: several notices may tell of
/// one change, and the next step should wait for a notice of its own.
pub async fn noticed(changes: &mut Changes, what: &str) {
    notice(changes, what).await;
    while let Ok(Some(_)) = timeout(Duration::from_millis(200), changes.next()).await {}
}

/// Panics if `changes` yields anything (a notice, an error, its end) within `quiet_for`:
/// `what` was expected not to notify.
pub async fn quiet(changes: &mut Changes, quiet_for: Duration, what: &str) {
    if let Ok(item) = timeout(quiet_for, changes.next()).await {
        panic!("{what} was notified: {item:?}");
    }
}

/// Acquires `key` for `owner`; panics unless it is granted. Returns the fence.
pub async fn granted(store: &dyn Store, key: &Key, owner: &OwnerToken, ttl: Duration) -> Fence {
    match store.acquire(key, owner, ttl).await.expect("acquire") {
        AcquireOutcome::Acquired { fence, .. } => fence,
        held => panic!("the key was not granted: {held:?} (does a watch hold it up?)"),
    }
}

/// A waiter for `key`'s release (owner `owner`, waiting up to 30 s) in a task of its own:
/// it joins the store's queue, which a watch must not notice.
pub fn waiter<S: Store + ?Sized + 'static>(
    store: Arc<S>,
    key: &Key,
    owner: OwnerToken,
) -> JoinHandle<Result<(), StoreError>> {
    let key = key.clone();
    tokio::spawn(async move {
        let waiter = store
            .waiter()
            .expect("the store has a waiter (Store::waiter)");
        waiter
            .wait_released(&key, &owner, Duration::from_secs(30))
            .await
    })
}
