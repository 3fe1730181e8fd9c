//! The clean-up of the SQL stores' rows (issue 14.5), one check for every store that
//! offers it. Not a case of the suite: pruning is each store's own method, not part of the
//! `Store` trait.

use std::time::Duration;

use leasehold_core::{AcquireOutcome, Fence, Key, OwnerToken, Store};
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(30);

async fn grant(store: &dyn Store, k: &Key, owner: &OwnerToken) -> Fence {
    match store.acquire(k, owner, TTL).await.unwrap() {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("{other:?}"),
    }
}

/// `prune(older_than)` deletes the rows of leases that ended (or whose fence was issued)
/// longer ago than `older_than`, never a held lease's row, and the next grant on a pruned
/// key has a higher fence than any before. `rows` lists the keys that have a row, sorted.
pub async fn prune_deletes_only_ended_leases_and_fences_still_rise(
    store: &dyn Store,
    prune: impl AsyncFn(Duration) -> u64,
    rows: impl AsyncFn() -> Vec<String>,
) {
    let (old, recent, held) = (
        Key::new("prune:old").unwrap(),
        Key::new("prune:recent").unwrap(),
        Key::new("prune:held").unwrap(),
    );
    let (a, b, c) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let f_old = grant(store, &old, &a).await;
    store.release(&old, &a).await.unwrap();
    let f_held = grant(store, &held, &c).await;
    sleep(Duration::from_millis(1500)).await;
    grant(store, &recent, &b).await;
    store.release(&recent, &b).await.unwrap();
    // No bound is too long: the longest deletes nothing and fails nothing.
    assert_eq!(prune(Duration::MAX).await, 0, "prune(Duration::MAX)");
    // Longer ago than a second: only `old`.
    assert_eq!(prune(Duration::from_secs(1)).await, 1, "prune(1 s)");
    assert_eq!(rows().await, vec!["prune:held", "prune:recent"]);
    // Everything that ended: `recent` too; the held lease stays, whatever the bound.
    assert_eq!(prune(Duration::ZERO).await, 1, "prune(0)");
    assert_eq!(rows().await, vec!["prune:held"]);
    let info = store.inspect(&held).await.unwrap().expect("still held");
    assert_eq!((info.owner, info.fence), (c, f_held));
    // Fences keep rising on the pruned key (the clock floor).
    let f_again = grant(store, &old, &OwnerToken::random()).await;
    assert!(f_again > f_old, "{f_old:?} then {f_again:?}");
}
