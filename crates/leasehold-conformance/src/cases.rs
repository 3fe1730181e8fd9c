//! The cases. Each takes a [`Fixture`], panics on failure, and uses its own keys.
//!
//! Each assertion's message says what went wrong in words that the broken-store tests
//! look for (`tests/broken_stores.rs`): change one and change its entry there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Error, Fence, FenceDurability, HoldEnd, Key, LeaseClient, LeaseConfig,
    LostReason, OwnerToken, ReleaseOutcome, RenewOutcome, Store, StoreErrorKind,
};
use tokio::time::{Instant, sleep, timeout};

// The cases of what is built on the lease live in their own module; listed with these.
pub use crate::coordination::{
    a_name_is_one_kind_of_resource, acquire_any_checked_takes_nothing_behind_another_value,
    acquire_any_takes_the_owners_key_or_the_first_free_one, lost_permit_returns_after_its_ttl_only,
    one_leader_at_a_time_and_terms_rise, racing_record_writes_keep_the_highest_fence,
    records_are_fenced_writes, semaphore_admits_at_most_n_holders,
    watch_notices_grants_releases_and_record_writes,
};

use crate::guard::EmbeddedGuard;
use crate::holder::Holder;
use crate::proof::Fault;
use crate::{Extensions, FencedWrites, Fixture, GuardSupport, OtherProcesses};
use leasehold_core::wrap::{FaultStore, Injection, Op, Swallowed};

fn key(name: &str) -> Key {
    Key::new(format!("conformance:{name}")).expect("valid key")
}

/// Generous slack for scheduling delays on a loaded machine.
fn slack(fx: &Fixture) -> Duration {
    fx.ttl / 2 + Duration::from_millis(200)
}

/// How long a case's store call that failed with a retryable error is tried again.
const RETRY_FOR: Duration = Duration::from_secs(10);

/// One acquire by `owner`, tried again while it fails with a retryable error (a timeout or
/// an unreachable node on a starved machine: a Redlock acquire of a quarter-TTL lease has a
/// quarter of that for each node), for up to [`RETRY_FOR`]. The store contract makes that
/// safe: a same-owner retry gets the grant the first attempt may have made, with its fence.
/// An answer (`Acquired` or `Held`) is never retried, and neither is any other error.
async fn acquire_raw(fx: &Fixture, key: &Key, owner: &OwnerToken, ttl: Duration) -> AcquireOutcome {
    let until = Instant::now() + RETRY_FOR;
    loop {
        match fx.store.acquire(key, owner, ttl).await {
            Ok(outcome) => return outcome,
            Err(e) if e.is_retryable() && Instant::now() < until => {
                eprintln!("acquire {key}: {e}; trying again (a retryable error)");
            }
            Err(e) => panic!("acquire {key}: {e}"),
        }
    }
}

fn fence_of(outcome: AcquireOutcome) -> Fence {
    match outcome {
        AcquireOutcome::Acquired { fence, .. } => fence,
        AcquireOutcome::Held { .. } => panic!("expected Acquired, got {outcome:?}"),
    }
}

/// Acquire, inspect, release; the key is then free.
pub async fn acquire_release(fx: &Fixture) {
    let k = key("acquire-release");
    let client = fx.client();
    let lease = client.try_acquire(&k).await.expect("free key is acquired");
    assert!(lease.is_valid());
    let info = fx
        .store
        .inspect(&k)
        .await
        .unwrap()
        .expect("held lease is visible");
    assert_eq!(info.owner, *lease.owner());
    assert_eq!(info.fence, lease.fence());
    let owner = *lease.owner();
    assert!(
        lease.release().await.expect("release"),
        "release of a held lease reports held"
    );
    assert_eq!(
        fx.store.inspect(&k).await.unwrap(),
        None,
        "released key is free"
    );
    assert_eq!(
        fx.store.release(&k, &owner).await.unwrap(),
        ReleaseOutcome::NotOwner,
        "a second release finds nothing"
    );
    let again = client
        .try_acquire(&k)
        .await
        .expect("re-acquire after release");
    again.release().await.unwrap();
}

/// A held key is refused to another owner with a typed error.
pub async fn contended_try_acquire(fx: &Fixture) {
    let k = key("contended");
    let client = fx.client();
    let holder = client.try_acquire(&k).await.unwrap();
    match client.try_acquire(&k).await {
        Err(Error::Contended { remaining, .. }) => {
            if fx.store.capabilities().reports_remaining {
                let r = remaining.expect("store claims to report the remaining TTL");
                assert!(r <= fx.ttl, "remaining {r:?} above ttl");
            }
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    let raw = acquire_raw(fx, &k, &OwnerToken::random(), fx.ttl).await;
    assert!(matches!(raw, AcquireOutcome::Held { .. }), "{raw:?}");
    holder.release().await.unwrap();
}

/// 32 concurrent contenders: never two holders at once, fences strictly increase in
/// grant order.
pub async fn concurrent_contenders_exclusive_and_fences_increase(fx: &Fixture) {
    const N: usize = 32;
    let k = key("contenders");
    let config = LeaseConfig::builder(fx.ttl)
        .backoff(
            leasehold_core::Backoff::new(Duration::from_millis(2), Duration::from_millis(50))
                .unwrap(),
        )
        .build()
        .unwrap();
    let client = LeaseClient::new(fx.store.clone(), config);
    let holders = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(Mutex::new(Vec::<Fence>::new()));
    // Violations are collected, not asserted in the tasks, so that the failure says which
    // rule broke first ("two holders at once" before anything it causes).
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut tasks = Vec::new();
    for _ in 0..N {
        let (client, k, holders, grants, violations) = (
            client.clone(),
            k.clone(),
            holders.clone(),
            grants.clone(),
            violations.clone(),
        );
        let wait = fx.ttl * 60;
        tasks.push(tokio::spawn(async move {
            let lease = match client.acquire(&k, wait).await {
                Ok(lease) => lease,
                Err(e) => {
                    violations
                        .lock()
                        .unwrap()
                        .push(format!("a contender got no turn: {e}"));
                    return;
                }
            };
            let before = holders.fetch_add(1, Ordering::SeqCst);
            if before != 0 {
                violations
                    .lock()
                    .unwrap()
                    .push(format!("two holders at once ({} others)", before));
            }
            grants.lock().unwrap().push(lease.fence());
            if !lease.is_valid() {
                violations
                    .lock()
                    .unwrap()
                    .push("lease invalid while held".into());
            }
            sleep(Duration::from_millis(2)).await;
            holders.fetch_sub(1, Ordering::SeqCst);
            match lease.release().await {
                Ok(true) => {}
                // A release whose reply was lost under load (a timeout): ambiguous, not a
                // sign of another holder; the lease expires if it was not applied.
                Err(Error::Store(e)) if e.is_ambiguous() => {}
                other => violations
                    .lock()
                    .unwrap()
                    .push(format!("lease not held at its release: {other:?}")),
            }
        }));
    }
    for t in tasks {
        t.await.expect("contender task");
    }
    let violations = violations.lock().unwrap();
    assert!(violations.is_empty(), "exclusion violated: {violations:?}");
    let grants = grants.lock().unwrap();
    assert_eq!(grants.len(), N);
    for w in grants.windows(2) {
        assert!(
            w[0] < w[1],
            "fences must strictly increase across grants: {grants:?}"
        );
    }
}

/// An acquire retried by the same owner (after an ambiguous reply) returns the same fence
/// and extends the lease.
pub async fn same_owner_reacquire_returns_same_fence(fx: &Fixture) {
    let k = key("same-owner");
    let owner = OwnerToken::random();
    let f1 = fence_of(acquire_raw(fx, &k, &owner, fx.ttl).await);
    sleep(fx.ttl / 2).await;
    let f2 = fence_of(acquire_raw(fx, &k, &owner, fx.ttl).await);
    assert_eq!(
        f1, f2,
        "same owner re-acquire must return the same fence (a retry after an ambiguous reply)"
    );
    sleep(fx.ttl * 3 / 4).await;
    let info = fx
        .store
        .inspect(&k)
        .await
        .unwrap()
        .expect("re-acquire extended the TTL");
    assert_eq!(info.owner, owner);
    assert_eq!(
        fx.store.release(&k, &owner).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// Fences grow across acquire/release cycles and break; none repeats.
pub async fn fence_never_reused_after_release(fx: &Fixture) {
    let k = key("fence-release");
    let mut last: Option<Fence> = None;
    for _ in 0..5 {
        let owner = OwnerToken::random();
        let f = fence_of(acquire_raw(fx, &k, &owner, fx.ttl).await);
        if let Some(l) = last {
            assert!(f > l, "fence {f} after release is not above {l}");
        }
        last = Some(f);
        assert_eq!(
            fx.store.release(&k, &owner).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}

/// After a lease expires, another owner acquires it with a higher fence.
pub async fn fence_never_reused_after_expiry(fx: &Fixture) {
    let k = key("fence-expiry");
    let short = fx.ttl / 4;
    let a = OwnerToken::random();
    let fa = fence_of(acquire_raw(fx, &k, &a, short).await);
    sleep(short + slack(fx)).await;
    let b = OwnerToken::random();
    let fb = match acquire_raw(fx, &k, &b, fx.ttl).await {
        AcquireOutcome::Acquired { fence, .. } => fence,
        held => panic!("an expired lease must be free, got {held:?}"),
    };
    assert!(fb > fa, "fence {fb} after expiry is not above {fa}");
    fx.store.release(&k, &b).await.unwrap();
}

/// A late release (and renew) by an old owner leaves the new owner's lease intact.
pub async fn late_release_leaves_new_owner_intact(fx: &Fixture) {
    let k = key("late-release");
    let short = fx.ttl / 4;
    let a = OwnerToken::random();
    fence_of(acquire_raw(fx, &k, &a, short).await);
    sleep(short + slack(fx)).await;
    let b = OwnerToken::random();
    let fb = fence_of(acquire_raw(fx, &k, &b, fx.ttl).await);
    assert_eq!(
        fx.store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::NotOwner,
        "a late release by the old owner must find nothing"
    );
    assert_eq!(
        fx.store.renew(&k, &a, fx.ttl).await.unwrap(),
        RenewOutcome::NotOwner,
        "a late renewal by the old owner must find nothing"
    );
    let info = fx.store.inspect(&k).await.unwrap().expect("B still holds");
    assert_eq!(
        (info.owner, info.fence),
        (b, fb),
        "old owner touched the new lease"
    );
    fx.store.release(&k, &b).await.unwrap();
}

/// Only the owner can renew or release.
pub async fn only_owner_renews_or_releases(fx: &Fixture) {
    let k = key("only-owner");
    let a = OwnerToken::random();
    let fa = fence_of(acquire_raw(fx, &k, &a, fx.ttl).await);
    let b = OwnerToken::random();
    assert_eq!(
        fx.store.renew(&k, &b, fx.ttl).await.unwrap(),
        RenewOutcome::NotOwner,
        "only the owner may renew"
    );
    assert_eq!(
        fx.store.release(&k, &b).await.unwrap(),
        ReleaseOutcome::NotOwner,
        "only the owner may release"
    );
    let info = fx.store.inspect(&k).await.unwrap().expect("A still holds");
    assert_eq!(
        (info.owner, info.fence),
        (a, fa),
        "another owner's calls touched the lease"
    );
    assert!(
        matches!(
            fx.store.renew(&k, &a, fx.ttl).await.unwrap(),
            RenewOutcome::Renewed { .. }
        ),
        "the owner's renewal must succeed"
    );
    assert_eq!(
        fx.store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::Released,
        "the owner's release must succeed"
    );
    assert_eq!(
        fx.store.renew(&k, &a, fx.ttl).await.unwrap(),
        RenewOutcome::NotOwner,
        "renew after release must not resurrect the lease"
    );
    assert_eq!(fx.store.inspect(&k).await.unwrap(), None);
}

/// Renewing extends the TTL and keeps the fence.
pub async fn renew_extends_ttl(fx: &Fixture) {
    let k = key("renew");
    let a = OwnerToken::random();
    let short = fx.ttl / 2;
    let fa = fence_of(acquire_raw(fx, &k, &a, short).await);
    for _ in 0..3 {
        sleep(short / 2).await;
        assert!(
            matches!(
                fx.store.renew(&k, &a, short).await.unwrap(),
                RenewOutcome::Renewed { .. }
            ),
            "the owner's renewal of a live lease must succeed"
        );
    }
    // 1.5 × the TTL has passed since the acquire: only renewals kept it.
    let info = fx
        .store
        .inspect(&k)
        .await
        .unwrap()
        .expect("renewed lease still held");
    assert_eq!(
        (info.owner, info.fence),
        (a, fa),
        "renewal must not change the fence"
    );
    fx.store.release(&k, &a).await.unwrap();
}

/// `Lease::release_after` (ShedLock's `lockAtLeastFor`): a hold that ends before the
/// minimum keeps the key from every other owner until the minimum has passed since the
/// acquire was sent, and lets it go soon after. A store that claims
/// `Capabilities::sets_expiry` leaves it in the store and answers at once
/// (`HoldEnd::LeftToExpire`); any other keeps it held and renewed until then and releases
/// it (`HoldEnd::Released`).
pub async fn release_after_keeps_the_lease_for_the_minimum_hold(fx: &Fixture) {
    let caps = fx.store.capabilities();
    let k = key("release-after");
    let client = fx.client();
    // Longer than the TTL: kept by renewals, or by an expiry longer than the TTL.
    let min = fx.ttl * 3;
    let before = Instant::now();
    let lease = client.try_acquire(&k).await.expect("acquire");
    let granted = Instant::now();
    let end = before + min;
    let releasing = tokio::spawn(lease.release_after(min));
    // Every other owner is kept out until the minimum has passed (less a margin for the
    // store's clock rate: its expiry counts from when it processed the last renewal).
    let other = OwnerToken::random();
    let margin = Duration::from_millis(100);
    while Instant::now() + margin < end {
        match acquire_raw(fx, &k, &other, fx.ttl).await {
            AcquireOutcome::Held { .. } => {}
            AcquireOutcome::Acquired { .. } => panic!(
                "release_after: taken {:?} after the acquire, before the minimum hold of {min:?}",
                granted.elapsed()
            ),
        }
        sleep(fx.ttl / 5).await;
    }
    let answered = timeout(min + slack(fx) * 2, releasing)
        .await
        .expect("release_after answers")
        .expect("the task")
        .expect("release_after");
    if caps.sets_expiry {
        match answered {
            HoldEnd::LeftToExpire { until } => {
                assert!(
                    until >= end,
                    "left until {until:?}, before the minimum {end:?}"
                );
                assert!(
                    until <= granted + min + slack(fx),
                    "left for longer than asked"
                );
            }
            other => panic!("sets_expiry: left in the store, not {other:?}"),
        }
    } else {
        assert_eq!(
            answered,
            HoldEnd::Released,
            "without sets_expiry: held, then released"
        );
        assert!(Instant::now() >= end);
    }
    // Let go soon after the minimum: the next owner gets it.
    let deadline = end + fx.ttl + slack(fx);
    loop {
        match acquire_raw(fx, &k, &other, fx.ttl).await {
            AcquireOutcome::Acquired { .. } => break,
            AcquireOutcome::Held { .. } => {
                assert!(
                    Instant::now() < deadline,
                    "release_after: still held {:?} after the minimum hold",
                    Instant::now() - end
                );
                sleep(fx.ttl / 10).await;
            }
        }
    }
    fx.store.release(&k, &other).await.unwrap();
}

/// `renew_many` (the scheduler's batch renewal: the store's batch, or each renewal on its
/// own on a store without one) answers each lease as `renew` would, in
/// the order asked: the owner's live leases are renewed (and outlive their first TTL), a
/// lease held by another owner, a free key and a released lease are not, and none of
/// those is created or taken over by the batch.
pub async fn renew_many_answers_each_lease_in_order(fx: &Fixture) {
    let a = OwnerToken::random();
    let b = OwnerToken::random();
    let short = fx.ttl / 2;
    let long = fx.ttl * 3;
    let mine: Vec<Key> = (0..3).map(|i| key(&format!("batch-mine-{i}"))).collect();
    let theirs = key("batch-theirs");
    let free = key("batch-free");
    let released = key("batch-released");
    let mut fences = Vec::new();
    for k in &mine {
        fences.push(fence_of(acquire_raw(fx, k, &a, short).await));
    }
    fence_of(acquire_raw(fx, &theirs, &b, long).await);
    fence_of(acquire_raw(fx, &released, &a, short).await);
    assert_eq!(
        fx.store.release(&released, &a).await.unwrap(),
        ReleaseOutcome::Released
    );
    // Interleaved, so that an answer given for the wrong position shows.
    let asked = vec![
        (mine[0].clone(), a),
        (theirs.clone(), a),
        (mine[1].clone(), a),
        (free.clone(), a),
        (released.clone(), a),
        (mine[2].clone(), a),
    ];
    let got = leasehold_core::renew_many(&*fx.store, &asked, long)
        .await
        .unwrap_or_else(|e| panic!("renew_many: {e}"));
    let renewed: Vec<bool> = got
        .iter()
        .map(|r| match r {
            Ok(RenewOutcome::Renewed { .. }) => true,
            Ok(RenewOutcome::NotOwner) => false,
            Err(e) => panic!("renew_many: an error for one lease: {e}"),
        })
        .collect();
    assert_eq!(
        renewed,
        vec![true, false, true, false, false, true],
        "renew_many answered another lease's result (or renewed what is not the owner's)"
    );
    // Past the first TTL: only the batch kept the owner's leases.
    sleep(short + slack(fx)).await;
    for (k, f) in mine.iter().zip(&fences) {
        let info = fx.store.inspect(k).await.unwrap();
        assert_eq!(
            info.map(|i| (i.owner, i.fence)),
            Some((a, *f)),
            "a lease renewed by renew_many expired at its first TTL"
        );
        fx.store.release(k, &a).await.unwrap();
    }
    assert_eq!(
        fx.store.inspect(&theirs).await.unwrap().map(|i| i.owner),
        Some(b),
        "renew_many took over another owner's lease"
    );
    fx.store.release(&theirs, &b).await.unwrap();
    for k in [&free, &released] {
        assert_eq!(
            fx.store.inspect(k).await.unwrap(),
            None,
            "renew_many created a lease that was not there"
        );
    }
}

/// `inspect` reports owner, fence and (when claimed) the remaining TTL; nothing for a free
/// key.
pub async fn inspect_reports_holder(fx: &Fixture) {
    let k = key("inspect");
    assert_eq!(
        fx.store.inspect(&k).await.unwrap(),
        None,
        "inspect reports a lease on a key never acquired"
    );
    let a = OwnerToken::random();
    let fa = fence_of(acquire_raw(fx, &k, &a, fx.ttl).await);
    let info = fx.store.inspect(&k).await.unwrap().expect("held");
    assert_eq!(info.key, k);
    assert_eq!((info.owner, info.fence), (a, fa));
    if fx.store.capabilities().reports_remaining {
        let r = info
            .remaining
            .expect("store claims to report remaining TTL");
        assert!(r <= fx.ttl && r > Duration::ZERO, "remaining {r:?}");
    }
    assert_eq!(
        fx.store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        fx.store.inspect(&k).await.unwrap(),
        None,
        "inspect reports a released lease"
    );
}

/// Bounded renewal: past `max_hold` the heartbeat stops and the lease is lost with
/// `MaxHoldExceeded`, and the store frees the key.
pub async fn max_hold_fires_lost(fx: &Fixture) {
    let k = key("max-hold");
    let max_hold = fx.ttl * 3 / 2;
    let config = LeaseConfig::builder(fx.ttl)
        .max_hold(max_hold)
        .build()
        .unwrap();
    let client = LeaseClient::new(fx.store.clone(), config);
    let start = Instant::now();
    let lease = client.try_acquire(&k).await.unwrap();
    let reason = timeout(max_hold + slack(fx), lease.lost())
        .await
        .expect("lost fires once max hold is exceeded");
    assert_eq!(reason, LostReason::MaxHoldExceeded);
    assert!(start.elapsed() >= max_hold, "lost fired before max hold");
    assert!(!lease.is_valid());
    let free_by = Instant::now() + fx.ttl + slack(fx);
    loop {
        if fx.store.inspect(&k).await.unwrap().is_none() {
            break;
        }
        assert!(Instant::now() < free_by, "key still held after max hold");
        sleep(fx.ttl / 10).await;
    }
    assert!(
        !lease.release().await.unwrap(),
        "release after max hold finds nothing"
    );
}

/// Time for the scheduler and a timer to run on a loaded machine, in a bound that the
/// library's own instants measure: a quarter of the renew interval, at most 100 ms — less
/// than the half renew interval a lost signal one renew interval late would add.
fn scheduling_margin(renew_interval: Duration) -> Duration {
    (renew_interval / 4).min(Duration::from_millis(100))
}

/// When the store forgets the lease, the lost signal fires (`NotOwner`, or `SessionEnded`
/// from a session-bound store that saw the lease's session end) within one renew interval
/// and one operation of the last confirmed renewal's send — measured on the library's own
/// instants (the send is the deadline less the validity window; the signal's instant is
/// when the library declared the loss), with a scheduling margin: a lost signal one renew
/// interval late fails it.
pub async fn lost_within_one_renew_interval_after_forget(fx: &Fixture) {
    let k = key("forget");
    let client = fx.client();
    let cfg = client.config().clone();
    let lease = client.try_acquire(&k).await.unwrap();
    fx.faults.forget(&k).await;
    let lost = lease.lost();
    let reason = timeout(
        cfg.renew_interval() * 2 + cfg.op_timeout() + slack(fx),
        lost.wait(),
    )
    .await
    .expect("lost fires within one renew interval of the store forgetting the lease");
    let lost_at = lost.lost_at().expect("the lost signal has its instant");
    let granted = lease.ttl();
    let last_send = lease.valid_until() - cfg.validity(granted);
    let interval = cfg.renew_interval_for(granted);
    let op = cfg.op_timeout_for(granted);
    let bound = last_send + interval + op + scheduling_margin(interval);
    assert!(
        lost_at <= bound,
        "lost fired {:?} after the last confirmed renewal's send, more than one renew interval \
         ({interval:?}) and one operation ({op:?}) and a scheduling margin ({:?})",
        lost_at - last_send,
        scheduling_margin(interval)
    );
    let session_bound = fx.store.capabilities().session_bound;
    assert!(
        reason == LostReason::NotOwner || (session_bound && reason == LostReason::SessionEnded),
        "{reason:?}"
    );
    assert!(matches!(
        lease.ensure_valid(),
        Err(Error::LeaseLost(r)) if r == reason
    ));
    // Someone else can take it, with a higher fence (a session-bound store's server frees
    // a killed session's lock as the session ends, a moment after its connection closed).
    let next = client
        .acquire(&k, slack(fx))
        .await
        .expect("forgotten key is free");
    assert!(
        next.fence() > lease.fence(),
        "the next grant's fence {} must be above the forgotten lease's {}",
        next.fence(),
        lease.fence()
    );
    assert!(!lease.release().await.unwrap());
    next.release().await.unwrap();
}

/// When the store becomes unreachable, the lost signal fires before the store-side expiry
/// (the last confirmed renewal's send time + TTL).
pub async fn lost_before_expiry_when_unreachable(fx: &Fixture) {
    let k = key("unreachable");
    let client = fx.client();
    let cfg = client.config().clone();
    let lease = client.try_acquire(&k).await.unwrap();
    sleep(cfg.renew_interval() + cfg.renew_interval() / 2).await; // at least one renewal
    assert!(lease.is_valid());
    fx.faults.make_unreachable().await;
    let reason = timeout(fx.ttl * 2, lease.lost()).await;
    let lost_at = Instant::now();
    fx.faults.restore().await;
    let reason = reason.expect("lost fires while the store is unreachable");
    assert!(
        matches!(
            reason,
            LostReason::StoreUnavailable | LostReason::RenewFailed { .. } | LostReason::Expired
        ),
        "{reason:?}"
    );
    // valid_until = last confirmed send + ttl × (1 − drift) − margin; the store keeps the
    // lease until at least last send + ttl.
    let store_expiry_at_least = lease.valid_until() + (cfg.ttl() - cfg.validity(cfg.ttl()));
    assert!(
        lost_at < store_expiry_at_least,
        "lost fired {:?} after the store-side expiry",
        lost_at - store_expiry_at_least
    );
    drop(lease);
}

/// A waiting acquire gets the lease once the holder releases it, with a higher fence, as
/// soon as docs/design.md (§3.5, §4.10) promises: a store that offers waiting for a
/// release wakes the waiter by the release, and the waiter re-checks by acquiring; a store
/// without one has the waiter sleep a backoff never longer than its cap (here one
/// operation timeout). Either way the waiter's granting acquire is sent within one
/// operation timeout (and a scheduling margin) of the release, measured on the library's
/// own instant of that send — never at the holder's expiry, four TTLs away.
pub async fn waiting_acquire_gets_released_lease(fx: &Fixture) {
    let k = key("wait");
    let long = LeaseConfig::new(fx.ttl * 4).expect("config");
    let holder = LeaseClient::new(fx.store.clone(), long)
        .try_acquire(&k)
        .await
        .unwrap();
    let fa = holder.fence();
    let base = fx.config();
    let cfg = LeaseConfig::builder(fx.ttl)
        .backoff(
            leasehold_core::Backoff::new(Duration::from_millis(5), base.op_timeout())
                .expect("backoff"),
        )
        .build()
        .expect("config");
    let client = LeaseClient::new(fx.store.clone(), cfg.clone());
    let waiter = {
        let (client, k, cfg) = (client.clone(), k.clone(), cfg.clone());
        let wait = fx.ttl * 10;
        tokio::spawn(async move {
            let lease = client.acquire(&k, wait).await?;
            // The send of the acquire that granted it, by the library's own clock.
            let sent = lease.valid_until() - cfg.validity(lease.ttl());
            Ok::<_, Error>((lease, sent))
        })
    };
    sleep(fx.ttl / 2).await;
    assert!(
        !waiter.is_finished(),
        "waiter must not acquire a held lease"
    );
    assert!(holder.release().await.unwrap());
    let released = Instant::now();
    let (lease, sent) = timeout(fx.ttl * 10, waiter)
        .await
        .expect("waiter acquires before its wait ends")
        .unwrap()
        .expect("waiter acquires");
    let wake = cfg.op_timeout() + scheduling_margin(cfg.renew_interval());
    assert!(
        sent <= released + wake,
        "the waiter was not woken by the release: its granting acquire was sent {:?} after \
         the release returned (at most {wake:?})",
        sent - released
    );
    assert!(
        lease.fence() > fa,
        "the waiter's fence {} must be above the released holder's {fa}",
        lease.fence()
    );
    // A wait that runs out reports WaitTimeout.
    let short = fx.ttl / 5;
    match client.acquire(&k, short).await {
        Err(Error::WaitTimeout { .. }) => {}
        other => panic!("expected WaitTimeout, got {other:?}"),
    }
    lease.release().await.unwrap();
}

/// A store that claims [`hands_off`](leasehold_core::Capabilities::hands_off) hands a
/// released lease to its queued waiter by its notice: `wait_turn` answers `Granted` with
/// a new fence, at most the TTL asked, valid from a request of the wait sent before the
/// release was; the store holds it for the waiter, who sent no acquire since. A store that
/// does not claim it never answers `Granted` (its waiter confirms with an acquire).
pub async fn hand_off_is_as_claimed(fx: &Fixture) {
    let caps = fx.store.capabilities();
    if fx.store.waiter().is_none() {
        assert!(
            !caps.hands_off,
            "the store claims hands_off but has no waiter (Store::waiter)"
        );
        return;
    }
    let k = key("hand-off");
    let holder = OwnerToken::random();
    let fa = fence_of(acquire_raw(fx, &k, &holder, fx.ttl * 4).await);
    let w = OwnerToken::random();
    let held = acquire_raw(fx, &k, &w, fx.ttl).await;
    assert!(
        matches!(held, AcquireOutcome::Held { .. }),
        "the waiter's acquire of a held key: {held:?}"
    );
    let started = Instant::now();
    let turn = {
        let (store, k, ttl) = (fx.store.clone(), k.clone(), fx.ttl);
        tokio::spawn(async move {
            let waiter = store.waiter().expect("a waiter");
            waiter.wait_turn(&k, &w, ttl, ttl * 8).await
        })
    };
    match &fx.queue {
        Some(queue) => crate::until_queued(&**queue, &k, 1, fx.ttl * 20, "the waiter").await,
        // No queue to see: give the wait a moment to start (a wait that starts after the
        // release answers Retry, which only a store that claims hands_off may not).
        None => sleep(fx.ttl / 4).await,
    }
    let releasing = Instant::now();
    assert_eq!(
        fx.store.release(&k, &holder).await.expect("release"),
        ReleaseOutcome::Released
    );
    let out = timeout(fx.ttl * 10, turn)
        .await
        .expect("the wait ends")
        .expect("task")
        .expect("wait_turn");
    match out {
        leasehold_core::WaitOutcome::Granted(g) => {
            assert!(
                caps.hands_off,
                "wait_turn answered Granted, but the store does not claim hands_off"
            );
            assert!(g.fence > fa, "a new fence: {} after {fa}", g.fence);
            assert!(g.ttl <= fx.ttl, "at most the TTL asked: {:?}", g.ttl);
            assert!(
                g.waiting_sent_at >= started && g.waiting_sent_at <= releasing,
                "valid from a request of the wait sent before the release"
            );
            let info = fx.store.inspect(&k).await.expect("inspect").expect("held");
            assert_eq!(
                (info.owner, info.fence),
                (w, g.fence),
                "held for the waiter"
            );
            assert_eq!(
                fx.store.release(&k, &w).await.expect("release"),
                ReleaseOutcome::Released
            );
        }
        leasehold_core::WaitOutcome::Retry => {
            assert!(
                !caps.hands_off,
                "the store claims hands_off, but a release with its waiter queued answered Retry"
            );
            let fw = fence_of(acquire_raw(fx, &k, &w, fx.ttl).await);
            assert!(fw > fa);
            assert_eq!(
                fx.store.release(&k, &w).await.expect("release"),
                ReleaseOutcome::Released
            );
        }
    }
}

/// Five waiters arrive one after another while the lease is held; once it is released
/// each gets it in turn. A store that claims `fifo_wait` must serve them in arrival order
/// — each waiter is seen queued in the store ([`Fixture::queue`]) before the next one
/// arrives — and any store must serve every one of them.
pub async fn waiters_are_served_in_arrival_order(fx: &Fixture) {
    let caps = fx.store.capabilities();
    let queue = caps.fifo_wait.then(|| {
        fx.queue.clone().expect(
            "a store that claims fifo_wait must let the suite see its queue (Fixture::queue)",
        )
    });
    let k = key("fifo");
    let holder = fx.client().try_acquire(&k).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..5usize {
        let (client, key, order) = (fx.client(), k.clone(), order.clone());
        let (wait, hold) = (fx.ttl * 30, fx.ttl / 10);
        waiters.push(tokio::spawn(async move {
            let lease = client.acquire(&key, wait).await.expect("a waiter acquires");
            order.lock().unwrap().push(i);
            sleep(hold).await;
            lease.release().await.unwrap();
        }));
        if let Some(queue) = &queue {
            crate::until_queued(&**queue, &k, i + 1, fx.ttl * 20, &format!("waiter {i}")).await;
        }
    }
    assert!(holder.release().await.unwrap());
    for w in waiters {
        timeout(fx.ttl * 40, w)
            .await
            .expect("every waiter is served")
            .unwrap();
    }
    let order = order.lock().unwrap().clone();
    if caps.fifo_wait {
        assert_eq!(
            order,
            vec![0, 1, 2, 3, 4],
            "the store claims fifo_wait, but waiters were served out of arrival order"
        );
    } else {
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 1, 2, 3, 4], "{order:?}");
    }
}

/// Bad input gets typed errors, never a panic or a silent success.
pub async fn bad_input_gets_typed_errors(fx: &Fixture) {
    let client = fx.client();
    for bad in [
        String::new(),
        "a\0b".into(),
        "x\ny".into(),
        "k".repeat(leasehold_core::MAX_KEY_LEN + 1),
    ] {
        match client.try_acquire(bad.as_str()).await {
            Err(Error::InvalidKey(_)) => {}
            other => panic!("key {bad:?}: expected InvalidKey, got {other:?}"),
        }
    }
    let owner = OwnerToken::random();
    let k = key("bad-ttl");
    for ttl in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::MAX,
        Duration::from_secs(u64::MAX / 1000 + 1),
    ] {
        match fx.store.acquire(&k, &owner, ttl).await {
            Err(e) => assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "ttl {ttl:?}: {e}"),
            Ok(o) => panic!("a bad ttl was accepted by acquire: {ttl:?} -> {o:?}"),
        }
        match fx.store.renew(&k, &owner, ttl).await {
            Err(e) => assert_eq!(
                e.kind(),
                StoreErrorKind::InvalidInput,
                "renew ttl {ttl:?}: {e}"
            ),
            Ok(o) => panic!("a bad ttl was accepted by renew: {ttl:?} -> {o:?}"),
        }
    }
    assert_eq!(
        fx.store.inspect(&k).await.unwrap(),
        None,
        "a rejected acquire left a lease"
    );
    // Keys at the edges of the rules work and stay distinct.
    let edge = [
        format!(
            "conformance:{}",
            "k".repeat(leasehold_core::MAX_KEY_LEN - 12)
        ),
        "conformance:ünïcødé ✓".to_owned(),
        "conformance:{tag}x".to_owned(),
        "conformance:}{".to_owned(),
        "}conformance:{}".to_owned(),
        "{}".to_owned(),
        "conformance:a*b?[c]".to_owned(),
        "conformance:with space/and'quote\"".to_owned(),
    ];
    let mut held = Vec::new();
    for name in &edge {
        let k = Key::new(name).unwrap();
        let lease = client
            .try_acquire(&k)
            .await
            .unwrap_or_else(|e| panic!("key {name:?}: {e}"));
        held.push(lease);
    }
    for lease in held {
        let info = fx
            .store
            .inspect(lease.key())
            .await
            .unwrap()
            .expect("edge key held");
        assert_eq!(
            info.owner,
            *lease.owner(),
            "keys collided: {:?}",
            lease.key()
        );
        assert!(lease.release().await.unwrap());
    }
}

/// `Store::diagnose` (what `leasehold doctor` prints) reaches the real server: it names
/// the server and the connection's TLS, every row it judges is a fault of this store's
/// table in `docs/guarantees.md` (never another store's words), once, with the setting
/// that decides it.
pub async fn diagnosis_names_the_server_and_judges_only_its_stores_rows(fx: &Fixture) {
    let d = fx.store.diagnose().await.expect("diagnose");
    let version = d.fact_value("server version").unwrap_or_default();
    assert!(!version.is_empty(), "no server version: {d:?}");
    assert!(d.fact_value("TLS").is_some(), "no TLS fact: {d:?}");
    assert!(!d.findings.is_empty(), "no row judged: {d:?}");
    let mut seen = std::collections::HashSet::new();
    for f in &d.findings {
        assert!(
            Fault::ALL.iter().any(|fault| fault.row_name() == f.row),
            "`{}` is not a fault of docs/guarantees.md",
            f.row
        );
        assert!(seen.insert(f.row.clone()), "`{}` judged twice", f.row);
        assert!(!f.setting.is_empty() && !f.why.is_empty(), "{f:?}");
    }
}

/// Each claim in the capabilities holds; the store offers exactly the extensions its
/// fixture declares, and its waiter (if any) is woken by a release; listing and breaking
/// work.
pub async fn capabilities_are_honest(fx: &Fixture) {
    let caps = fx.store.capabilities();
    let has = Extensions::of(&*fx.store);
    let expected = fx.extensions;
    for (what, has, expected) in [
        ("a batch (Store::batch)", has.batch, expected.batch),
        ("a watcher (Store::watcher)", has.watcher, expected.watcher),
        ("a waiter (Store::waiter)", has.waiter, expected.waiter),
    ] {
        assert!(
            has || !expected,
            "the fixture expects {what}, but the store has none"
        );
        assert!(
            !has || expected,
            "the store has {what} that its fixture does not declare (Fixture::expects_…)"
        );
    }
    let k = key("caps");
    let a = OwnerToken::random();
    let fa = fence_of(acquire_raw(fx, &k, &a, fx.ttl * 4).await);

    // Held reports the remaining TTL exactly when claimed.
    match acquire_raw(fx, &k, &OwnerToken::random(), fx.ttl).await {
        AcquireOutcome::Held { remaining } => {
            assert_eq!(
                remaining.is_some(),
                caps.reports_remaining,
                "reports_remaining claim: {remaining:?}"
            );
        }
        other => panic!("{other:?}"),
    }

    // sets_expiry: a renewal sets the expiry to the TTL asked, longer or shorter than
    // before, and answers with it.
    if caps.sets_expiry {
        // Longer than the grant, then shorter: the store keeps what each one asked.
        for asked in [fx.ttl * 20, fx.ttl * 2] {
            assert_eq!(
                fx.store.renew(&k, &a, asked).await.unwrap(),
                RenewOutcome::Renewed { ttl: asked },
                "sets_expiry: a renewal answers the TTL asked"
            );
            if caps.reports_remaining {
                let info = fx.store.inspect(&k).await.unwrap().expect("held");
                let left = info.remaining.expect("reports_remaining");
                assert!(
                    left <= asked && left > asked / 2,
                    "sets_expiry: {left:?} left of a renewal of {asked:?}"
                );
            }
        }
        fx.store.renew(&k, &a, fx.ttl * 4).await.unwrap();
    }

    // wait_released: the waiter, woken, acquires as itself (a store that queues its
    // waiters may have reserved the lease for it) and gets the lease.
    if fx.store.waiter().is_some() {
        let started = Instant::now();
        let w = OwnerToken::random();
        let wait = {
            let (store, k) = (fx.store.clone(), k.clone());
            let t = fx.ttl * 8;
            tokio::spawn(async move {
                let waiter = store.waiter().expect("the store has a waiter");
                waiter.wait_released(&k, &w, t).await
            })
        };
        sleep(fx.ttl / 4).await;
        assert!(!wait.is_finished(), "wait_released returned while held");
        assert_eq!(
            fx.store.release(&k, &a).await.unwrap(),
            ReleaseOutcome::Released
        );
        timeout(fx.ttl * 2, wait)
            .await
            .expect("wait_released returns soon after the release")
            .unwrap()
            .expect("wait_released ok");
        assert!(started.elapsed() < fx.ttl * 4, "notified only at expiry");
        fence_of(acquire_raw(fx, &k, &w, fx.ttl).await);
        assert_eq!(
            fx.store.release(&k, &w).await.unwrap(),
            ReleaseOutcome::Released
        );
    } else {
        fx.store.release(&k, &a).await.unwrap();
    }

    // list
    let b = OwnerToken::random();
    let fb = fence_of(acquire_raw(fx, &k, &b, fx.ttl * 4).await);
    assert!(fb > fa);
    let other = Key::new("elsewhere:caps").unwrap();
    let c = OwnerToken::random();
    fence_of(acquire_raw(fx, &other, &c, fx.ttl * 4).await);
    let list = fx
        .store
        .list("conformance:caps")
        .await
        .unwrap_or_else(|e| panic!("list: {e}"));
    let keys: Vec<_> = list.iter().map(|i| i.key.clone()).collect();
    assert_eq!(keys, vec![k.clone()], "list by prefix");
    assert_eq!((list[0].owner, list[0].fence), (b, fb));

    // break_lease
    let broken = fx
        .store
        .break_lease(&k)
        .await
        .unwrap_or_else(|e| panic!("break: {e}"));
    assert!(
        broken > fb,
        "break must advance the fence: {broken} vs {fb}"
    );
    assert_eq!(
        fx.store.inspect(&k).await.unwrap(),
        None,
        "break removes the lease"
    );
    assert_eq!(
        fx.store.renew(&k, &b, fx.ttl).await.unwrap(),
        RenewOutcome::NotOwner
    );
    let d = OwnerToken::random();
    let fd = fence_of(acquire_raw(fx, &k, &d, fx.ttl).await);
    assert!(
        fd > broken,
        "next grant {fd} must be above the broken fence {broken}"
    );
    fx.store.release(&k, &d).await.unwrap();
    fx.store.release(&other, &c).await.unwrap();
}

/// A renewal by an owner whose own lease expired (and nobody else took it) is refused: a
/// renewal extends a live lease, it never grants a new one (the holder would believe it
/// held the lease without a break while another owner could have held it meanwhile).
pub async fn renewal_after_own_expiry_is_refused(fx: &Fixture) {
    let k = key("renew-after-expiry");
    let short = fx.ttl / 4;
    let a = OwnerToken::random();
    let fa = fence_of(acquire_raw(fx, &k, &a, short).await);
    sleep(short + slack(fx)).await;
    assert_eq!(
        fx.store.inspect(&k).await.unwrap(),
        None,
        "an expired lease must be free"
    );
    assert_eq!(
        fx.store.renew(&k, &a, fx.ttl).await.unwrap(),
        RenewOutcome::NotOwner,
        "a renewal after the owner's own lease expired must be refused"
    );
    assert_eq!(
        fx.store.inspect(&k).await.unwrap(),
        None,
        "a refused renewal must not resurrect the lease"
    );
    let b = OwnerToken::random();
    let fb = fence_of(acquire_raw(fx, &k, &b, fx.ttl).await);
    assert!(fb > fa, "fence {fb} after expiry is not above {fa}");
    fx.store.release(&k, &b).await.unwrap();
}

/// The fence of the grant a swallowed acquire reply carried.
fn swallowed_grant(fs: &FaultStore) -> Fence {
    match fs.take_swallowed().as_slice() {
        [Swallowed::Acquire(Ok(AcquireOutcome::Acquired { fence, .. }))] => *fence,
        other => panic!("setup: the injected acquire was not granted: {other:?}"),
    }
}

/// An acquire applied by the store whose reply is lost (injected with [`FaultStore`]):
/// the retry with the same owner returns the same lease and fence, the client's own retry
/// does the same, and nothing is left behind.
pub async fn ambiguous_acquire_reply_returns_same_lease(fx: &Fixture) {
    let k = key("ambiguous");
    let fs = Arc::new(FaultStore::new(fx.store.clone()));
    // The store call itself: the reply is lost after the grant.
    let owner = OwnerToken::random();
    fs.inject(Op::Acquire, Injection::AmbiguousAfterApply);
    let err = fs
        .acquire(&k, &owner, fx.ttl)
        .await
        .expect_err("setup: the injected acquire fails");
    assert!(err.is_ambiguous(), "setup: {err}");
    let lost = swallowed_grant(&fs);
    let retried = fence_of(acquire_raw(fx, &k, &owner, fx.ttl).await);
    assert_eq!(
        retried, lost,
        "ambiguous reply: the retry must return the fence of the grant whose reply was lost"
    );
    let info = fx.store.inspect(&k).await.unwrap().expect("held");
    assert_eq!(
        (info.owner, info.fence),
        (owner, lost),
        "ambiguous reply: a second lease"
    );
    assert_eq!(
        fx.store.release(&k, &owner).await.unwrap(),
        ReleaseOutcome::Released
    );
    // The lease client: an ambiguous error, then a reply that never comes (its operation
    // timeout ends the call): each time it retries with the same owner.
    let client = LeaseClient::new(fs.clone(), fx.config());
    let mut last = lost;
    for injection in [Injection::AmbiguousAfterApply, Injection::HangAfterApply] {
        fs.inject(Op::Acquire, injection);
        let lease = client
            .try_acquire(&k)
            .await
            .unwrap_or_else(|e| panic!("{injection:?}: the client's retry fails: {e}"));
        let lost = swallowed_grant(&fs);
        assert_eq!(
            lease.fence(),
            lost,
            "ambiguous reply ({injection:?}): the client's retry must return the fence of the \
             grant whose reply was lost"
        );
        assert!(
            lost > last,
            "fence {lost} after release is not above {last}"
        );
        last = lost;
        let info = fx.store.inspect(&k).await.unwrap().expect("held");
        assert_eq!((info.owner, info.fence), (*lease.owner(), lost));
        assert!(lease.release().await.unwrap(), "release of a held lease");
        assert_eq!(
            fx.store.inspect(&k).await.unwrap(),
            None,
            "ambiguous reply ({injection:?}): a lease was left behind"
        );
    }
}

/// The stale writer (docs/design.md §8): A holds the lease and writes; A is paused past its TTL;
/// B acquires and writes; A's late write with its old fence is rejected by the storage-side
/// guard, in the same transaction as the write. The guard is in the user's database, not
/// the lease store: on every store, with the fences it issues, through the guard of the
/// store's own database when the fixture names one, else the SQLite guard in an embedded
/// database.
pub async fn stale_writer_rejected_by_guard(fx: &Fixture) {
    let embedded;
    let writes: &dyn FencedWrites = match &fx.guard {
        GuardSupport::Writes(w) => &**w,
        GuardSupport::Embedded => {
            embedded = EmbeddedGuard::open().await;
            &embedded
        }
    };
    let resource = "conformance:guarded";
    let k = key("guarded");
    let short = fx.ttl / 4;
    let a = OwnerToken::random();
    let fa = fence_of(acquire_raw(fx, &k, &a, short).await);
    assert!(
        writes.write(resource, fa, "written by A").await.unwrap(),
        "guard: the holder's first write must be accepted"
    );
    // A is paused past its TTL; B takes over and writes.
    sleep(short + slack(fx)).await;
    let b = OwnerToken::random();
    let fb = fence_of(acquire_raw(fx, &k, &b, fx.ttl).await);
    assert!(
        fb > fa,
        "guard: the new holder's fence {fb} must be above the old holder's {fa}"
    );
    assert!(
        writes.write(resource, fb, "written by B").await.unwrap(),
        "guard: the new holder's write must be accepted"
    );
    // A wakes up and writes with its old fence.
    assert!(
        !writes.write(resource, fa, "late write by A").await.unwrap(),
        "guard: the guard accepted a stale write (fence {fa} after {fb})"
    );
    assert!(
        writes
            .write(resource, fb, "written by B again")
            .await
            .unwrap(),
        "guard: equal fences (one holder writing again) must be accepted"
    );
    assert_eq!(
        writes.read(resource).await.unwrap().as_deref(),
        Some("written by B again"),
        "guard: a rejected write must leave nothing behind"
    );
    fx.store.release(&k, &b).await.unwrap();
}

/// A holder process killed with `kill -9` (docs/faults.md row 3): while it lives nobody else gets
/// the lease; after its death a waiter gets it, not before the store-side TTL has run out
/// (a session-bound store may free it when the session ends, at once), and within the
/// TTL and a generous margin, with a higher fence.
///
/// A store that only this process can open must say so, and its capabilities must then
/// say that its fences die with the process.
pub async fn holder_killed_is_taken_over_after_its_ttl(fx: &Fixture) {
    let _proof = fx.proves(Fault::HolderCrash);
    let caps = fx.store.capabilities();
    let url = match &fx.processes {
        OtherProcesses::Undeclared => panic!(
            "the fixture must declare whether another process can open its store \
             (Fixture::other_processes or Fixture::this_process_only)"
        ),
        OtherProcesses::ThisProcessOnly => {
            assert_eq!(
                caps.fence_durability,
                FenceDurability::Process,
                "a store only this process can open must say its fences live in process memory"
            );
            return;
        }
        OtherProcesses::Url(url) => url.clone(),
    };
    let k = key("kill-9");
    let cfg = fx.config();
    let holder = Holder::spawn(&url, &k, fx.ttl).await;
    let sent_after = holder.go();
    let (dead_fence, _) = holder.held().await;
    let client = fx.client();
    // Asked until it answers (a retryable error, such as a timeout on a starved machine,
    // is no answer): the live holder's lease is refused.
    let until = Instant::now() + RETRY_FOR;
    loop {
        match client.try_acquire(&k).await {
            Err(Error::Contended { .. }) => break,
            Ok(lease) => panic!(
                "kill -9: a live holder's lease was granted to another owner (fence {})",
                lease.fence()
            ),
            Err(e) if e.is_retryable() && Instant::now() < until => {
                eprintln!("kill -9: a contender's try_acquire: {e}; asking again");
            }
            Err(e) => panic!("kill -9: a contender's try_acquire failed: {e}"),
        }
    }
    holder.kill();
    let killed_at = Instant::now();
    let wait = fx.ttl * 3 + Duration::from_secs(2);
    let lease = client.acquire(&k, wait).await.unwrap_or_else(|e| {
        panic!(
            "kill -9: not taken over within {wait:?} of the holder's death (TTL {:?}): {e}",
            fx.ttl
        )
    });
    let taken_at = Instant::now();
    // The store granted the dead holder's lease after `sent_after`, for at least the TTL
    // on its clock (which may run slow by the drift the configuration allows).
    let expires_at_least = sent_after + fx.ttl.mul_f64(1.0 - cfg.drift_factor());
    if !caps.session_bound {
        assert!(
            taken_at >= expires_at_least,
            "kill -9: taken over before the TTL ran out ({:?} early)",
            expires_at_least - taken_at
        );
    }
    eprintln!(
        "kill -9: taken over {:?} after the kill (session bound: {})",
        taken_at - killed_at,
        caps.session_bound
    );
    assert!(
        lease.fence() > dead_fence,
        "kill -9: the next fence {} must be above the dead holder's {dead_fence}",
        lease.fence()
    );
    assert!(lease.release().await.unwrap());
}
