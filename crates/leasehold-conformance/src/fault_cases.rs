//! The shared fault cases: docs/faults.md rows 2, 4, 5, 6, 7, 8 and 24, for every networked
//! backend, through the fault proxies of its fixture's [`Network`].
//!
//! Each case panics on failure; its messages say what went wrong in words the broken-store
//! tests look for (`tests/broken_stores.rs`). Timing margins are generous: no case asserts
//! that anything is fast, only that bounds which protect the data hold.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use leasehold_core::{
    AcquireOutcome, Error, Fence, Health, Key, LeaseClient, LeaseConfig, LeaseInfo, LostReason,
    OwnerToken, ReleaseOutcome, RenewOutcome, Store, StoreError, StoreErrorKind,
};
use leasehold_testkit::{FaultProxy, ProxyMode};
use tokio::time::{Instant, sleep, sleep_until, timeout};

use crate::holder::Holder;
use crate::proof::Fault;
use crate::{Fixture, Network, OtherProcesses};

fn key(name: &str) -> Key {
    Key::new(format!("conformance:{name}")).expect("valid key")
}

fn net(fx: &Fixture) -> &Network {
    fx.network.as_ref().expect(
        "the fault cases need Fixture::network (the proxies, a direct store, the server processes)",
    )
}

/// How long one call may take when nothing is wrong (a loaded machine, a reconnect).
fn call_bound(fx: &Fixture) -> Duration {
    let net_bound = fx.network.as_ref().and_then(|n| n.op_bound);
    fx.ttl + net_bound.unwrap_or(Duration::ZERO) + Duration::from_secs(1)
}

/// Calls `f` until it answers: retryable errors and calls without an answer within
/// [`call_bound`] are retried for up to 15 s (a store reconnecting after a fault).
async fn until_ok<T, F, Fut>(fx: &Fixture, what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    until_ok_within(fx, what, Duration::from_secs(15), f).await
}

/// [`until_ok`], retrying for up to `within`.
async fn until_ok_within<T, F, Fut>(fx: &Fixture, what: &str, within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + within;
    let per_call = call_bound(fx);
    loop {
        let last = match timeout(per_call, f()).await {
            Ok(Ok(v)) => return v,
            Ok(Err(e)) if e.is_retryable() => e.to_string(),
            Ok(Err(e)) => panic!("{what}: {e}"),
            Err(_) => format!("no answer within {per_call:?}"),
        };
        assert!(
            Instant::now() < deadline,
            "{what}: the store did not answer once the fault was gone: {last}"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// What the server holds at `k`, seen past the proxies.
async fn direct_inspect(fx: &Fixture, k: &Key) -> Option<LeaseInfo> {
    let direct = net(fx).direct.clone();
    until_ok(fx, "inspect on the direct store", || direct.inspect(k)).await
}

/// Checks the grant a retry by `owner` got against the grant seen applied before it.
///
/// The retry must return the grant whose reply was lost, same fence. A session-bound store
/// ends a session whose call was cancelled or cut (its documented cancel behaviour), and
/// the lease with it: its retry may be a fresh grant, with a higher fence. Either way
/// there is never a second lease (checked by the caller).
fn check_retry(fx: &Fixture, what: &str, info: &LeaseInfo, owner: OwnerToken, fence: Fence) {
    assert_eq!(
        info.owner, owner,
        "{what}: the applied grant is another owner's"
    );
    if fx.store.capabilities().session_bound && fence != info.fence {
        assert!(
            fence > info.fence,
            "{what}: a fresh grant after the session ended must have a higher fence ({fence} after {})",
            info.fence
        );
        eprintln!(
            "{what}: the session of the lost reply's grant ended; the retry got a fresh grant"
        );
    } else {
        assert_eq!(
            fence, info.fence,
            "{what}: the retry must return the fence of the grant whose reply was lost"
        );
    }
}

/// The same owner retries its acquire until it is granted. A session-bound store ends the
/// session of a cancelled call asynchronously: until it has, the retry may find that
/// session's lock (the owner's own dying grant) and answer `Held`; that may last moments,
/// never the TTL.
async fn retry_same_owner(
    fx: &Fixture,
    what: &str,
    k: &Key,
    owner: OwnerToken,
    ttl: Duration,
) -> Fence {
    let session = fx.store.capabilities().session_bound;
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let outcome = until_ok(fx, what, || fx.store.acquire(k, &owner, ttl)).await;
        match outcome {
            AcquireOutcome::Acquired { fence, .. } => return fence,
            AcquireOutcome::Held { .. } if session && Instant::now() < deadline => {
                sleep(Duration::from_millis(20)).await;
            }
            held => panic!("{what}: the retry with the same owner must be granted, got {held:?}"),
        }
    }
}

fn fence_of(what: &str, outcome: AcquireOutcome) -> Fence {
    match outcome {
        AcquireOutcome::Acquired { fence, .. } => fence,
        AcquireOutcome::Held { .. } => panic!("{what}: expected Acquired, got {outcome:?}"),
    }
}

/// docs/faults.md row 2, near miss: a holder process frozen (`SIGSTOP`) for a little less than its
/// validity window keeps its lease: nobody else gets it during or after the freeze, its
/// lost signal never fires, its renewals go on, and it still holds the lease when it
/// releases it.
pub async fn row_02_near_miss_freeze_keeps_the_lease(fx: &Fixture) {
    let _proof = fx.proves(Fault::ProcessPause);
    let OtherProcesses::Url(url) = &fx.processes else {
        panic!("row 2 needs a holder process: the fixture must declare Fixture::other_processes")
    };
    let k = key("near-miss");
    let cfg = fx.config();
    let window = cfg.validity(fx.ttl);
    let holder = Holder::spawn(url, &k, fx.ttl).await;
    let sent_after = holder.go();
    let (fence, owner) = holder.held().await;
    holder.pause();
    let paused_at = Instant::now();
    // Its deadline is at least `sent_after + window` (later if it renewed before the
    // pause): resume it at 70 % of that, which leaves it time to be scheduled and renew
    // before the deadline on a loaded machine.
    let check_at = sent_after + window * 55 / 100;
    let resume_at = sent_after + window * 7 / 10;
    eprintln!(
        "near miss: frozen from {:?} to {:?} after the acquire's send (window {window:?})",
        paused_at - sent_after,
        resume_at - sent_after
    );
    sleep_until(check_at).await;
    let contender = fx.client();
    match contender.try_acquire(&k).await {
        Err(Error::Contended { .. }) => {}
        Ok(lease) => panic!(
            "near miss: two holders during a near-miss freeze (fences {fence} and {})",
            lease.fence()
        ),
        Err(e) => panic!("near miss: the contender's try_acquire failed: {e}"),
    }
    let info = direct_inspect(fx, &k).await;
    assert_eq!(
        info.map(|i| (i.owner, i.fence)),
        Some((owner, fence)),
        "near miss: the store must keep a lease frozen for less than its validity window"
    );
    sleep_until(resume_at).await;
    holder.resume();
    // The heartbeat renews at once after the freeze, then on its schedule.
    sleep(cfg.renew_interval() * 2 + cfg.op_timeout()).await;
    match contender.try_acquire(&k).await {
        Err(Error::Contended { .. }) => {}
        Ok(lease) => panic!(
            "near miss: two holders after a near-miss freeze (fences {fence} and {})",
            lease.fence()
        ),
        Err(e) => panic!("near miss: the contender's try_acquire failed: {e}"),
    }
    let (status, released, lines) = holder.finish().await;
    assert!(
        !lines.iter().any(|l| l.starts_with("LOST")),
        "near miss: the lost signal fired after a freeze shorter than the validity window: \
         {lines:?}"
    );
    assert_eq!(
        status,
        ["valid=true", "lost=None"],
        "near miss: the holder must still hold a valid lease"
    );
    assert_eq!(
        released, "true",
        "near miss: the holder no longer held the lease at its release"
    );
    let next = contender
        .acquire(&k, fx.ttl * 3)
        .await
        .expect("near miss: the released key is free");
    assert!(
        next.fence() > fence,
        "near miss: the next fence must be higher"
    );
    assert!(next.release().await.unwrap());
}

/// docs/faults.md row 4: the server is frozen (`SIGSTOP`) past the TTL. Renewals time out; the
/// lost signal fires at the local deadline, before the store-side expiry. Afterwards the
/// lost lease is not taken over while its holder keeps its handle; the holder's release
/// frees it and the next fence is higher.
pub async fn row_04_server_paused_lost_before_store_expiry(fx: &Fixture) {
    let _proof = fx.proves(Fault::ServerPaused);
    let net = net(fx);
    let caps = fx.store.capabilities();
    let k = key("server-paused");
    // A safety margin of a fifth of the TTL between the holder's deadline and the
    // store-side expiry, so that "before the expiry" is not decided by a few ms of
    // scheduling on a loaded machine.
    let cfg = LeaseConfig::builder(fx.ttl)
        .margin(fx.ttl / 5)
        .build()
        .expect("setup: config");
    let client = LeaseClient::new(fx.store.clone(), cfg.clone());
    let lease = client.try_acquire(&k).await.expect("setup: acquire");
    sleep(cfg.renew_interval() * 3 / 2).await; // at least one renewal
    assert!(
        lease.is_valid(),
        "setup: the lease is valid before the pause"
    );
    let servers = net.servers.clone();
    tokio::task::block_in_place(|| servers.pause());
    let lost = lease.lost();
    let reason = timeout(fx.ttl * 2, lost.wait()).await;
    // When the library declared it lost, not when this task woke up.
    let lost_at = lost.lost_at().unwrap_or_else(Instant::now);
    let valid_until = lease.valid_until();
    servers.resume();
    let reason = reason.unwrap_or_else(|_| {
        panic!(
            "server paused: lost fires while the server is paused (still valid after {:?})",
            fx.ttl * 2
        )
    });
    let expected = matches!(
        reason,
        LostReason::Expired | LostReason::RenewFailed { .. } | LostReason::StoreUnavailable
    ) || (caps.session_bound
        && matches!(reason, LostReason::NotOwner | LostReason::SessionEnded));
    assert!(
        expected,
        "server paused: lost for the wrong reason: {reason:?}"
    );
    // The store keeps the lease until at least the last confirmed renewal's send + TTL.
    let store_expiry_at_least = valid_until + (cfg.ttl() - cfg.validity(cfg.ttl()));
    assert!(
        lost_at < store_expiry_at_least,
        "server paused: lost fired {:?} after the store-side expiry",
        lost_at - store_expiry_at_least
    );
    // While its holder may still run, the lost lease is not given to anyone else (a
    // renewal queued in the frozen server's socket may even have extended it).
    if let Some(info) = direct_inspect(fx, &k).await {
        assert_eq!(
            info.owner,
            *lease.owner(),
            "server paused: taken over while its holder may run"
        );
        if info.remaining.is_some_and(|r| r > fx.ttl / 4) {
            match client.try_acquire(&k).await {
                Ok(other) => panic!(
                    "server paused: a second holder (fence {}) while the first holds its handle",
                    other.fence()
                ),
                Err(e) => eprintln!("server paused: a contender is refused: {e}"),
            }
        }
    }
    // The holder stops its work and lets go.
    let old = lease.fence();
    let _ = lease.release().await;
    let next = client
        .acquire(&k, fx.ttl * 3 + Duration::from_secs(5))
        .await
        .expect("server paused: the key is free once its holder let go");
    assert!(
        next.fence() > old,
        "server paused: the next fence {} must be above {old}",
        next.fence()
    );
    assert!(next.release().await.unwrap());
}

/// docs/faults.md row 5: the proxy forwards an acquire and drops its reply. The retry with the
/// same owner returns the grant that was applied (same fence), never a second lease; after
/// the release nothing is left. The same end to end through the lease client, whose
/// ambiguous-reply retry reuses its owner. Each part retries its fault until the dropped
/// reply was that of an applied grant (`lose_an_applied_reply`), so the same-fence check
/// always runs.
pub async fn row_05_lost_reply_retry_returns_same_lease(fx: &Fixture) {
    let net = net(fx);
    let ttl = fx.ttl * 5;
    let lost = lose_an_applied_reply(fx, "lost reply", "lost-reply", Cut::Drop, ttl).await;
    let (k, owner) = (lost.key.clone(), lost.owner);
    let fence = retry_same_owner(fx, "lost reply", &k, owner, ttl).await;
    check_retry(fx, "lost reply", &lost.applied, owner, fence);
    let info = direct_inspect(fx, &k).await.map(|i| (i.owner, i.fence));
    assert_eq!(info, Some((owner, fence)), "lost reply: a second lease");
    assert_eq!(
        until_ok(fx, "lost reply: release", || fx.store.release(&k, &owner)).await,
        ReleaseOutcome::Released
    );
    assert_eq!(
        direct_inspect(fx, &k).await,
        None,
        "lost reply: a lease was left behind"
    );

    // End to end: the client's first attempt is applied, its reply lost; it retries.
    let session = fx.store.capabilities().session_bound;
    let cfg = LeaseConfig::builder(ttl)
        .op_timeout(fx.ttl * 2)
        .build()
        .expect("config");
    let mut delay = lost.delay;
    let mut tried = Vec::new();
    for attempt in 0..ATTEMPTS {
        let k = key(&format!("lost-reply-client-{attempt}"));
        let warm = warm_up(fx, &k, ttl).await;
        let store = Arc::new(PassAfterFirstAcquire {
            inner: fx.store.clone(),
            direct: net.direct.clone(),
            proxies: net.proxies.clone(),
            calls: AtomicUsize::new(0),
            first: Mutex::new(None),
        });
        let client = LeaseClient::new(store.clone(), cfg.clone());
        let plain = attempt == 0;
        net.set_mode(if plain {
            ProxyMode::DropReplies
        } else {
            ProxyMode::Delay(delay)
        });
        let pending = {
            let (client, k) = (client.clone(), k.clone());
            // With a wait: the connection that lost the reply is reset once the fault
            // ends (as a real one would be), and on a store reached over several
            // connections (an etcd cluster's members) the immediate retries may each
            // meet one of them closing; the retries after them, with backoff, go out on
            // fresh ones. Each retry reuses the owner. On a session-bound store, see
            // `retry_same_owner`: a moment may pass before the cut session ends.
            tokio::spawn(async move { client.acquire(&k, ttl).await })
        };
        // The grant as the store applied it, seen past the proxy while the call was out.
        // (Not the warm-up's: the MariaDB/MySQL GET_LOCK store's inspect may read the
        // owner its row recorded last while the client's session takes the lock.)
        let seen = watch_for_grant(fx, &k, |o| *o != warm, &pending).await;
        if !plain && seen.is_some() {
            store.cut_while_first_out();
        }
        let answer = pending.await.expect("task");
        net.set_mode(ProxyMode::Pass);
        let first = store.first.lock().unwrap().take();
        let lease = match (answer, &first) {
            (Ok(lease), _) => lease,
            // Nothing was sent, so there was no reply to lose and nothing to retry: the
            // client passes the error on. The fault did not happen; try again.
            (Err(Error::Store(e)), Some(First::NotSent))
                if !e.is_ambiguous() && e.kind() == StoreErrorKind::Unavailable =>
            {
                let note = format!("attempt {attempt}: the first call sent nothing ({e})");
                eprintln!("lost reply (lease client): {note}");
                tried.push(note);
                assert_eq!(
                    direct_inspect(fx, &k).await,
                    None,
                    "lost reply: a call that sent nothing left a lease"
                );
                continue;
            }
            (Err(e), _) => {
                // Whether the store answers now, past the proxies and through them: a
                // stalled connection answers only the first, a stalled store neither.
                let t = Instant::now();
                let direct = net.direct.inspect(&k).await.map(|i| i.map(|i| i.fence));
                let direct_took = t.elapsed();
                let t = Instant::now();
                let proxied = fx.store.inspect(&k).await.map(|i| i.map(|i| i.fence));
                panic!(
                    "lost reply: the client's retry gets the lease: {e:?} (first call: {first:?}; \
                     then a read past the proxies: {direct:?} in {direct_took:?}, through \
                     them: {proxied:?} in {:?})",
                    t.elapsed()
                )
            }
        };
        // What the store held once the first call was over: the state it left (it may
        // have undone its grant when it ended the call itself), or the grant seen while
        // it was out when the client cancelled it.
        let ran_out = matches!(first, Some(First::Failed(None)));
        let applied = match first {
            Some(First::Answered) => {
                tried.push(format!(
                    "attempt {attempt}: answered before the cut ({delay:?})"
                ));
                delay = (delay * 2).min(fx.ttl / 2);
                None
            }
            Some(First::Failed(after)) => after.or(if session { seen } else { None }),
            // A waiting client (session-bound stores) tried again after the first call sent
            // nothing: nothing was applied by it.
            Some(First::NotSent) => None,
            Some(First::Cancelled) | None => seen,
        };
        let Some(applied) = applied else {
            tried.push(format!(
                "attempt {attempt}: no applied grant left ({delay:?})"
            ));
            // The first call ran out before its grant was applied (a grant seen then was a
            // retry's, and was not cut): the delay is too long for the call's bound.
            if !plain && ran_out {
                delay = (delay / 2).max(Duration::from_millis(5));
            }
            assert!(
                lease.release().await.unwrap(),
                "lost reply: release of the client's lease"
            );
            continue;
        };
        check_retry(
            fx,
            "lost reply (lease client)",
            &applied,
            *lease.owner(),
            lease.fence(),
        );
        let info = direct_inspect(fx, &k).await.map(|i| (i.owner, i.fence));
        assert_eq!(
            info,
            Some((*lease.owner(), lease.fence())),
            "lost reply: a second lease"
        );
        assert!(lease.release().await.unwrap(), "lost reply: release");
        assert_eq!(
            direct_inspect(fx, &k).await,
            None,
            "lost reply: a lease was left behind"
        );
        return;
    }
    panic!(
        "lost reply (lease client): setup: in {ATTEMPTS} attempts the client's first acquire \
         was never applied with its reply lost: {tried:?}"
    );
}

/// How an attempt of [`lose_an_applied_reply`] loses the reply of its acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// The proxy drops the reply (row 5).
    Drop,
    /// Every connection is reset while the reply is on its way (row 8).
    Reset,
}

/// The most attempts rows 5 and 8 make to lose the reply of an applied grant.
const ATTEMPTS: usize = 8;

/// An acquire whose reply was lost after the store applied it.
struct LostReply {
    key: Key,
    owner: OwnerToken,
    /// The grant the store held for `owner` once the call was over (or, on a
    /// session-bound store that ended the call's session, the grant seen while the call
    /// was out).
    applied: LeaseInfo,
    /// What the call answered, if it did (a store that retried by itself after a reset).
    answered: Option<Fence>,
    /// The delay on the link that did it.
    delay: Duration,
}

/// Warm up on `k`: connected, statements prepared, scripts loaded. Returns the warm-up's
/// owner.
async fn warm_up(fx: &Fixture, k: &Key, ttl: Duration) -> OwnerToken {
    let warm = OwnerToken::random();
    until_ok(fx, "warm-up acquire", || fx.store.acquire(k, &warm, ttl)).await;
    until_ok(fx, "warm-up release", || fx.store.release(k, &warm)).await;
    warm
}

/// Watches the store past the proxy until it holds a grant at `k` to an owner `mine`
/// accepts, or until `call` has ended.
async fn watch_for_grant<T>(
    fx: &Fixture,
    k: &Key,
    mine: impl Fn(&OwnerToken) -> bool,
    call: &tokio::task::JoinHandle<T>,
) -> Option<LeaseInfo> {
    let direct = net(fx).direct.clone();
    while !call.is_finished() {
        if let Ok(Ok(Some(info))) = timeout(call_bound(fx), direct.inspect(k)).await
            && mine(&info.owner)
        {
            return Some(info);
        }
        sleep(Duration::from_millis(2)).await;
    }
    None
}

/// An acquire by a fresh owner on a fresh key whose reply is lost (`cut`) after the store
/// applied it, retried until one is: a dropped reply or a reset may come before the last
/// request of a store whose acquire is several (then nothing is applied), and a store may
/// undo its own grant when it ends a call without a reply (Redlock releases what it was
/// granted).
///
/// The first attempt is the plain fault: every reply dropped from the start (row 5), or a
/// reset when the request has reached the server (row 8); a fixture that declares
/// [`Network::lost_reply_applies`] must see it applied. The next ones hold every chunk on
/// the link for a delay, watch the store past the proxy until it holds the grant — its
/// reply is then still held in the proxy — and cut the reply there; the delay doubles when
/// the reply got through before the cut and halves when nothing was applied. After
/// [`ATTEMPTS`] without an applied grant whose reply was lost, the case fails.
async fn lose_an_applied_reply(
    fx: &Fixture,
    what: &str,
    name: &str,
    cut: Cut,
    ttl: Duration,
) -> LostReply {
    let net = net(fx);
    let session = fx.store.capabilities().session_bound;
    let mut delay = fx.ttl / 10;
    let mut tried = Vec::new();
    for attempt in 0..ATTEMPTS {
        let k = key(&format!("{name}-{attempt}"));
        warm_up(fx, &k, ttl).await;
        let owner = OwnerToken::random();
        let plain = attempt == 0;
        // The plain reset: the request reaches the server at `held`, its reply would come
        // back at twice that; reset in between.
        let held = fx.ttl / 4;
        net.set_mode(match (plain, cut) {
            (true, Cut::Drop) => ProxyMode::DropReplies,
            (true, Cut::Reset) => ProxyMode::Delay(held),
            (false, _) => ProxyMode::Delay(delay),
        });
        let pending = {
            let (store, k) = (fx.store.clone(), k.clone());
            let bound = call_bound(fx);
            tokio::spawn(async move { timeout(bound, store.acquire(&k, &owner, ttl)).await })
        };
        let seen = if plain {
            if cut == Cut::Reset {
                sleep(held * 3 / 2).await;
                net.reset_all();
            }
            None
        } else {
            let seen = watch_for_grant(fx, &k, |o| *o == owner, &pending).await;
            if seen.is_some() {
                match cut {
                    Cut::Drop => net.set_mode(ProxyMode::DropReplies),
                    Cut::Reset => net.reset_all(),
                }
            }
            seen
        };
        let answer = pending.await.expect("task");
        net.set_mode(ProxyMode::Pass);
        let answered = match answer {
            Ok(Ok(AcquireOutcome::Acquired { fence, .. })) => Some(fence),
            Ok(Ok(held)) => panic!("{what}: the key is free, got {held:?}"),
            Ok(Err(e)) => {
                assert!(
                    e.is_retryable(),
                    "{what}: a call whose reply was lost must fail with a retryable error: {e}"
                );
                None
            }
            Err(_) => None,
        };
        if cut == Cut::Drop
            && let Some(fence) = answered
        {
            assert!(
                !plain,
                "{what}: an acquire answered through a proxy that drops replies: fence {fence}"
            );
            // The reply left the proxy before the cut.
            tried.push(format!(
                "attempt {attempt}: answered before the cut ({delay:?})"
            ));
            until_ok(fx, "release", || fx.store.release(&k, &owner)).await;
            delay = (delay * 2).min(fx.ttl / 2);
            continue;
        }
        let mut after = direct_inspect(fx, &k).await;
        // A session-bound store ends the cut call's session a moment after the call:
        // until then its inspect may read the dying session's lock with the owner the
        // key's row recorded last (the warm-up's: the MariaDB/MySQL GET_LOCK store).
        let settled = Instant::now() + Duration::from_secs(3);
        while session
            && after.as_ref().is_some_and(|i| i.owner != owner)
            && Instant::now() < settled
        {
            sleep(Duration::from_millis(20)).await;
            after = direct_inspect(fx, &k).await;
        }
        if let Some(info) = &after {
            assert_eq!(
                info.owner, owner,
                "{what}: the applied grant is another owner's"
            );
        }
        let applied = match (after, seen) {
            (Some(info), _) => info,
            // The store ended the call's session, and its lock with it.
            (None, Some(seen)) if session => seen,
            (None, seen) => {
                assert!(
                    !(plain && net.lost_reply_applies),
                    "{what}: setup: the acquire whose reply was lost was not applied"
                );
                if seen.is_some() {
                    tried.push(format!(
                        "attempt {attempt}: the store undid its grant ({delay:?})"
                    ));
                    delay = (delay * 2).min(fx.ttl / 2);
                } else {
                    tried.push(format!("attempt {attempt}: not applied ({delay:?})"));
                    if !plain {
                        delay = (delay / 2).max(Duration::from_millis(5));
                    }
                }
                continue;
            }
        };
        eprintln!("{what}: attempt {attempt} lost the reply of an applied grant: {applied:?}");
        return LostReply {
            key: k,
            owner,
            applied,
            answered,
            delay: if plain { fx.ttl / 10 } else { delay },
        };
    }
    panic!(
        "{what}: setup: in {ATTEMPTS} attempts no acquire was applied with its reply lost: \
         {tried:?}"
    );
}

/// How the first acquire call of the lease client of row 5 ended.
#[derive(Debug)]
enum First {
    /// It answered: its reply was not lost.
    Answered,
    /// It failed before it sent anything (a connection it could not open through the
    /// cut link: a pooled connection may still have been on its way back to the pool,
    /// its check's reply dropped), so the client had no ambiguous reply to retry.
    NotSent,
    /// It failed by itself, leaving the store with this lease at the key.
    Failed(Option<LeaseInfo>),
    /// The client cancelled it (its operation timeout).
    Cancelled,
}

/// The store under test, for row 5's lease client: its first acquire call, when it ends
/// (or is cancelled), puts the proxies back to passing everything before the client
/// retries, and records how it ended.
#[derive(Debug)]
struct PassAfterFirstAcquire {
    inner: Arc<dyn Store>,
    direct: Arc<dyn Store>,
    proxies: Vec<Arc<FaultProxy>>,
    calls: AtomicUsize,
    first: Mutex<Option<First>>,
}

impl PassAfterFirstAcquire {
    /// Drops every reply from now on, but only while the first call is out. The grant the
    /// harness saw may be a retry's: under load the first call can end by its own timeout
    /// (its requests held by the delay) just before the harness sees the grant, and a cut
    /// made then would drop the retries' replies until the client's wait ran out (seen:
    /// every retry timed out for 20 s). The check and the cut are one step under the lock
    /// the first call's end is recorded under, before [`Restore`] passes everything again.
    fn cut_while_first_out(&self) {
        let first = self.first.lock().unwrap();
        if first.is_none() {
            for p in &self.proxies {
                p.set_mode(ProxyMode::DropReplies);
            }
        }
    }
}

/// Puts the proxies back to passing everything, and records a cancelled first call. The
/// end is recorded before the proxies pass, under one lock, so that no cut
/// ([`PassAfterFirstAcquire::cut_while_first_out`]) comes after them.
struct Restore<'a>(&'a PassAfterFirstAcquire);

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        let mut first = self.0.first.lock().unwrap();
        first.get_or_insert(First::Cancelled);
        for p in &self.0.proxies {
            p.set_mode(ProxyMode::Pass);
        }
    }
}

#[async_trait]
impl leasehold_core::wrap::Forward for PassAfterFirstAcquire {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) > 0 {
            return self.inner.acquire(key, owner, ttl).await;
        }
        let restore = Restore(self);
        let r = self.inner.acquire(key, owner, ttl).await;
        let first = match &r {
            Ok(_) => First::Answered,
            Err(e) if !e.is_ambiguous() && e.kind() == StoreErrorKind::Unavailable => {
                First::NotSent
            }
            Err(_) => First::Failed(self.direct.inspect(key).await.ok().flatten()),
        };
        *self.first.lock().unwrap() = Some(first);
        drop(restore);
        r
    }
}

/// docs/faults.md row 6: slow replies. With every chunk held a while, an acquire still succeeds
/// and its validity window counts from the send (so it is shorter by the time the reply
/// took). With the link slower than the TTL, acquisitions fail, and whatever they were
/// granted late is gone within 3 × TTL.
pub async fn row_06_slow_replies_shorten_validity_and_too_slow_fails(fx: &Fixture) {
    let net = net(fx);
    let ttl = fx.ttl;
    // Room for slow calls: an operation may take 80 % of the TTL.
    let cfg = LeaseConfig::builder(ttl)
        .op_timeout(ttl * 4 / 5)
        .renew_interval(ttl / 10)
        .build()
        .expect("config");
    let client = LeaseClient::new(fx.store.clone(), cfg.clone());
    let k = key("slow");
    until_ok(fx, "warm up", || fx.store.inspect(&k)).await;
    // Every chunk held `delay` each way: a round trip takes at least twice that, and an
    // acquire may take a dozen (to open a dedicated session).
    let delay = ttl / 60;
    net.set_mode(ProxyMode::Delay(delay));
    let before = Instant::now();
    let lease = client
        .try_acquire(&k)
        .await
        .expect("slow replies: an acquire within its timeout succeeds");
    let after = Instant::now();
    let valid_until = lease.valid_until();
    // The store's expiry, read past the proxy while it still delays (a renewal through it
    // lands at least a renew interval and a delay after the acquire's send). A reading
    // bounds the expiry by the instant its reply is seen plus the remaining TTL it reports:
    // late by the reply's own way back, which a starved machine can stretch past the few
    // milliseconds this check turns on. The earliest of a few readings is kept.
    let mut store_expiry: Option<(Instant, Duration)> = None;
    let mut held = None;
    for _ in 0..5 {
        let info = direct_inspect(fx, &k).await;
        let seen = Instant::now();
        if let Some(remaining) = info.as_ref().and_then(|i| i.remaining)
            && store_expiry.is_none_or(|(s, r)| seen + remaining < s + r)
        {
            store_expiry = Some((seen, remaining));
        }
        held = held.or(info);
    }
    net.set_mode(ProxyMode::Pass);
    let took = after - before;
    assert!(
        took >= delay * 2,
        "setup: the proxy did not slow the acquire ({took:?})"
    );
    // The attempt that got the lease was sent at least one slowed round trip (2 × delay)
    // before its reply came: counted from that send, the window ends at least that much
    // before `after + validity`; counted from the reply, it would end about then.
    let longest = after + cfg.validity(lease.ttl()) - delay;
    assert!(
        valid_until <= longest,
        "slow replies: the validity window must count from the send, not the reply (it ends \
         {:?} after the reply, whose acquire took {took:?})",
        valid_until - after
    );
    // The same against the store's own expiry, whatever TTL it reported as granted: the
    // request reached the store at least `delay` after its send, so a window counted from
    // the send ends at least `delay` before the store's expiry (at most `seen` + the
    // remaining TTL it reports, plus its rounding).
    assert!(
        held.is_some(),
        "slow replies: the granted lease is not in the store"
    );
    if let Some((seen, remaining)) = store_expiry {
        let expiry_at_most = seen + remaining + net.remaining_resolution;
        assert!(
            valid_until + delay <= expiry_at_most,
            "slow replies: the validity window must count from the send, not the reply (it \
             ends {:?} before the store's expiry, less than the request's {delay:?} on the way; \
             the store reported {:?} granted)",
            expiry_at_most.saturating_duration_since(valid_until),
            lease.ttl()
        );
    }
    assert!(lease.release().await.unwrap(), "slow replies: release");

    // Slower than the TTL (half the fixture's, to keep the case short): the lease client
    // (default configuration) and a raw call both give up.
    let short = ttl / 2;
    let client = LeaseClient::new(fx.store.clone(), LeaseConfig::new(short).expect("config"));
    let (k2, k3) = (key("too-slow"), key("too-slow-raw"));
    let big = short * 3 / 2;
    net.set_mode(ProxyMode::Delay(big));
    let r = client.try_acquire(&k2).await;
    assert!(
        r.is_err(),
        "slow replies: an acquire slower than its TTL must fail, got {:?}",
        r.map(|l| l.fence())
    );
    let raw = timeout(short, fx.store.acquire(&k3, &OwnerToken::random(), short)).await;
    assert!(
        !matches!(raw, Ok(Ok(_))),
        "slow replies: a raw acquire answered through a link slower than the TTL: {raw:?}"
    );
    net.set_mode(ProxyMode::Pass);
    // Held bytes arrive within `big`; a late grant lives a TTL; then it must be gone.
    sleep(short * 3).await;
    for k in [&k2, &k3] {
        let left = direct_inspect(fx, k).await;
        assert_eq!(
            left, None,
            "slow replies: a too-slow acquire left a lease behind after 3 × TTL"
        );
    }
    let again = client
        .acquire(&k2, ttl * 3)
        .await
        .expect("slow replies: the key is usable afterwards");
    assert!(again.release().await.unwrap());
}

/// docs/faults.md row 7, as the holder sees it: a renewal lost in a blackhole puts the
/// lease at risk (`Lease::health`) before anything loses it, while the server (read
/// directly, not through the proxies) still lists the holder, with an expiry after the
/// holder's deadline. A session-bound store may end the session instead (`Lost`). Once
/// the network is back the lease ends held again or lost, never stuck at risk.
pub async fn row_07_blackhole_puts_the_holder_at_risk_first(fx: &Fixture) {
    let _proof = fx.proves(Fault::NetworkPartition);
    let net = net(fx);
    let caps = fx.store.capabilities();
    let k = key("at-risk");
    // Lost only at the deadline, however many renewals fail.
    let config = LeaseConfig::builder(fx.ttl)
        .renew_failures_before_lost(1000)
        .build()
        .expect("valid config");
    let client = LeaseClient::new(fx.store.clone(), config);
    let lease = client.try_acquire(&k).await.expect("at risk: acquire");
    let mut changes = lease.health_changes();
    net.set_mode(ProxyMode::Blackhole);
    let first = timeout(fx.ttl * 2, changes.next())
        .await
        .expect("at risk: no change within twice the TTL of the blackhole");
    match first {
        Health::AtRisk { deadline, .. } => {
            let asked = Instant::now();
            let info = until_ok(fx, "direct inspect", || net.direct.inspect(&k))
                .await
                .expect("at risk: the server no longer has the lease");
            assert_eq!(
                info.owner,
                *lease.owner(),
                "at risk: the server lists another holder"
            );
            if let Some(left) = info.remaining {
                assert!(
                    deadline <= asked + left + net.remaining_resolution,
                    "at risk: the holder's deadline is {:?} after the server's expiry",
                    deadline - (asked + left)
                );
            }
            assert!(lease.is_valid(), "at risk: not held while at risk");
        }
        Health::Lost(reason) if caps.session_bound => {
            eprintln!("at risk: the session-bound store ended the session first: {reason}");
        }
        other => panic!("at risk: the first change in a blackhole is to at risk, not {other:?}"),
    }
    net.set_mode(ProxyMode::Pass);
    let settled = timeout(fx.ttl * 3 + call_bound(fx), async {
        loop {
            let h = changes.next().await;
            if h == Health::Held || !h.is_held() {
                return h;
            }
        }
    })
    .await
    .expect("at risk: neither held again nor lost after the network came back");
    eprintln!("at risk: after the blackhole: {}", settled.as_str());
    if settled == Health::Held {
        let _ = lease.release().await;
    }
}

/// docs/faults.md row 7: a blackhole. No call answers through it: each fails (within the store's
/// own bound, when it declares one) or is ended by the caller; a waiting acquire ends by
/// its deadline. Once the network is back the store works again and the lease held before
/// is intact.
pub async fn row_07_blackhole_no_answer_and_recovery(fx: &Fixture) {
    let _proof = fx.proves(Fault::NetworkPartition);
    let net = net(fx);
    let caps = fx.store.capabilities();
    let k = key("blackhole");
    let owner = OwnerToken::random();
    let limit = match net.op_bound {
        Some(b) => b + Duration::from_secs(2),
        None => fx.ttl,
    };
    // Outlives the blackhole: every call below ends within `limit`, the waiting acquire
    // within 2 × TTL.
    let long = fx.ttl * 3 + limit + Duration::from_secs(2);
    fence_of(
        "setup",
        until_ok(fx, "setup acquire", || fx.store.acquire(&k, &owner, long)).await,
    );
    net.set_mode(ProxyMode::Blackhole);
    /// What a call through the blackhole may answer: nothing, an error, or — for the
    /// renewal and the release of a session-bound store, which ends the session it
    /// cannot reach and the lease with it — `NotOwner`.
    async fn check<T: std::fmt::Debug>(
        net: &Network,
        limit: Duration,
        name: &str,
        call: impl Future<Output = Result<T, StoreError>>,
        may_answer: impl Fn(&T) -> bool,
    ) {
        match timeout(limit, call).await {
            Ok(Ok(v)) if may_answer(&v) => {
                eprintln!("blackhole: {name} gave up the session: {v:?}");
            }
            Ok(Ok(v)) => panic!("blackhole: {name} answered through a blackhole: {v:?}"),
            Ok(Err(e)) => assert!(
                e.is_retryable(),
                "blackhole: {name} failed with a non-retryable error: {e}"
            ),
            Err(_) => assert!(
                net.op_bound.is_none(),
                "blackhole: {name} did not end by itself within the store's bound {:?}",
                net.op_bound
            ),
        }
    }
    let session = caps.session_bound;
    let other = OwnerToken::random();
    let fresh = key("blackhole-fresh");
    let client = fx.client();
    let wait = fx.ttl;
    // Every call runs at once: each must end (or be ended) on its own.
    let mut calls: Vec<std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>>> = vec![
        Box::pin(check(
            net,
            limit,
            "acquire",
            fx.store.acquire(&fresh, &other, fx.ttl),
            |_| false,
        )),
        Box::pin(check(
            net,
            limit,
            "contended acquire",
            fx.store.acquire(&k, &other, fx.ttl),
            |_| false,
        )),
        Box::pin(check(
            net,
            limit,
            "renew",
            fx.store.renew(&k, &owner, long),
            |r| session && *r == RenewOutcome::NotOwner,
        )),
        Box::pin(check(
            net,
            limit,
            "release",
            fx.store.release(&k, &owner),
            |r| session && *r == ReleaseOutcome::NotOwner,
        )),
        Box::pin(check(net, limit, "inspect", fx.store.inspect(&k), |_| {
            false
        })),
        // A waiting acquire ends by its deadline (plus its last attempts' bounds).
        Box::pin(async {
            let bound = wait + client.config().op_timeout() * 3 + Duration::from_secs(2);
            let r = timeout(bound, client.acquire(&fresh, wait))
                .await
                .unwrap_or_else(|_| {
                    panic!("blackhole: a waiting acquire did not end by {bound:?}")
                });
            assert!(
                r.is_err(),
                "blackhole: a waiting acquire answered through a blackhole: {:?}",
                r.map(|l| l.fence())
            );
        }),
    ];
    calls.push(Box::pin(check(
        net,
        limit,
        "list",
        fx.store.list("conformance:"),
        |_| false,
    )));
    calls.push(Box::pin(check(
        net,
        limit,
        "break",
        fx.store.break_lease(&fresh),
        |_| false,
    )));
    futures::future::join_all(calls).await;
    net.set_mode(ProxyMode::Pass);
    // The store works again. The lease held before is intact — unless the store is
    // session-bound and ended the session it could not reach.
    let info = until_ok(fx, "blackhole: inspect once the network is back", || {
        fx.store.inspect(&k)
    })
    .await;
    match info {
        Some(info) => assert_eq!(
            info.owner, owner,
            "blackhole: the lease held before the blackhole changed hands"
        ),
        None => assert!(
            session,
            "blackhole: the lease held before the blackhole is gone"
        ),
    }
    // A session-bound store may only answer once the server has ended a session whose
    // requests were lost (its TTL after the last request it received).
    let released = until_ok_within(
        fx,
        "blackhole: release",
        long + Duration::from_secs(15),
        || fx.store.release(&k, &owner),
    )
    .await;
    assert!(
        released == ReleaseOutcome::Released || session,
        "blackhole: the release of the lease held before the blackhole: {released:?}"
    );
    // A call whose caller gave up may still land once the network is back (a client
    // that queued or retried it by itself, as the Cluster client does): the grant is the
    // documented ambiguous outcome, and it lives at most the TTL that call asked for. It
    // is never the blackholed holder's, and nobody renews it.
    let asked = fx.ttl.max(client.config().ttl());
    for (what, k) in [("the held key", &k), ("the fresh key", &fresh)] {
        gone_within(fx, k, &owner, asked, what).await;
    }
}

/// Waits for `k` to be free in the store (read past the proxy). A lease found there must
/// be a late grant of a call that failed: not `holder`'s, with at most `ttl` left, and
/// gone once that has passed (plus a margin for the store's expiry).
async fn gone_within(fx: &Fixture, k: &Key, holder: &OwnerToken, ttl: Duration, what: &str) {
    let Some(late) = direct_inspect(fx, k).await else {
        return;
    };
    eprintln!("blackhole: a late grant on {what}: {late:?}");
    assert_ne!(
        &late.owner, holder,
        "blackhole: {what}: the released lease was left behind"
    );
    assert!(
        late.remaining.is_none_or(|r| r <= ttl),
        "blackhole: {what}: a late grant with more than its TTL ({ttl:?}) left: {late:?}"
    );
    let deadline = Instant::now() + ttl + Duration::from_secs(2);
    while direct_inspect(fx, k).await.is_some() {
        assert!(
            Instant::now() < deadline,
            "blackhole: {what}: a late grant outlived its TTL ({ttl:?})"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// docs/faults.md row 8: the connection is reset after the request reached the server. The call
/// fails with a retryable error (or the store retries by itself); the retry with the same
/// owner returns the same grant, never a second lease; a reset while idle makes the next
/// calls reconnect.
pub async fn row_08_reset_mid_command_idempotent_retry(fx: &Fixture) {
    let net = net(fx);
    let ttl = fx.ttl * 5;
    let lost = lose_an_applied_reply(fx, "reset", "reset", Cut::Reset, ttl).await;
    let (k, owner, first_fence) = (lost.key.clone(), lost.owner, lost.answered);
    let fence = retry_same_owner(fx, "reset", &k, owner, ttl).await;
    check_retry(fx, "reset", &lost.applied, owner, fence);
    if let Some(f) = first_fence {
        let first = LeaseInfo {
            key: k.clone(),
            owner,
            fence: f,
            remaining: None,
        };
        check_retry(fx, "reset", &first, owner, fence);
    }
    let info = direct_inspect(fx, &k).await.map(|i| (i.owner, i.fence));
    assert_eq!(info, Some((owner, fence)), "reset: a second lease");
    // A reset while idle: the next calls reconnect. A session-bound lease ends with its
    // session: its renewal must then say so, and the lease must be gone.
    let before = net.connections();
    net.reset_all();
    sleep(Duration::from_millis(50)).await;
    let renewed = until_ok(fx, "reset: renew after an idle reset", || {
        fx.store.renew(&k, &owner, ttl)
    })
    .await;
    if fx.store.capabilities().session_bound {
        assert_eq!(
            renewed,
            RenewOutcome::NotOwner,
            "reset: a session-bound lease must end with its session"
        );
        let gone_by = Instant::now() + Duration::from_secs(10);
        while let Some(info) = direct_inspect(fx, &k).await {
            assert!(
                Instant::now() < gone_by,
                "reset: a session-bound lease outlived its session: {info:?}"
            );
            sleep(Duration::from_millis(50)).await;
        }
        let next = fx
            .client()
            .try_acquire(&k)
            .await
            .expect("reset: the key is free once its session ended");
        assert!(next.fence() > fence, "reset: the next fence must be higher");
        assert!(next.release().await.unwrap());
    } else {
        assert!(
            matches!(renewed, RenewOutcome::Renewed { .. }),
            "reset: the owner's renewal after a reset: {renewed:?}"
        );
        assert_eq!(
            until_ok(fx, "reset: release", || fx.store.release(&k, &owner)).await,
            ReleaseOutcome::Released
        );
    }
    assert!(
        net.connections() > before,
        "reset: the store answered without reconnecting after every connection was reset"
    );
}

/// docs/faults.md row 24: acquisitions (through the lease client and raw store calls) cancelled at
/// every stage of a slow call leave nothing behind after 3 × TTL, and the keys stay
/// usable.
pub async fn row_24_cancelled_acquires_leave_nothing_behind(fx: &Fixture) {
    let net = net(fx);
    let ttl = fx.ttl / 2;
    let cfg = LeaseConfig::builder(ttl)
        .op_timeout(ttl * 2 / 5)
        .build()
        .expect("config");
    let client = LeaseClient::new(fx.store.clone(), cfg);
    let keys: Vec<Key> = (0..20).map(|i| key(&format!("cancel-{i}"))).collect();
    let delay = Duration::from_millis(5);
    net.set_mode(ProxyMode::Delay(delay));
    // How long one acquire takes through the slow link, once connected.
    let mut span = Duration::MAX;
    for _ in 0..3 {
        let probe = OwnerToken::random();
        let started = Instant::now();
        until_ok(fx, "probe acquire", || {
            fx.store.acquire(&keys[0], &probe, ttl)
        })
        .await;
        span = span.min(started.elapsed());
        until_ok(fx, "probe release", || fx.store.release(&keys[0], &probe)).await;
    }
    let span = span.max(delay * 2);
    let mut cancelled = 0;
    for i in 0..40u32 {
        let k = keys[i as usize % keys.len()].clone();
        let cut = span * (i % 16) / 6; // from 0 to 2.5 × an acquire
        let (store, client) = (fx.store.clone(), client.clone());
        let r = if i % 2 == 0 {
            timeout(cut, async move { client.try_acquire(k).await.map(drop) }).await
        } else {
            timeout(cut, async move {
                store
                    .acquire(&k, &OwnerToken::random(), ttl)
                    .await
                    .map(drop)
                    .map_err(Error::from)
            })
            .await
        };
        if r.is_err() {
            cancelled += 1;
        }
    }
    eprintln!("cancelled acquires: {cancelled} of 40 cut in flight (an acquire takes {span:?})");
    assert!(
        cancelled >= 8,
        "setup: too few cancellations (of 40) to mean anything: {cancelled}"
    );
    net.set_mode(ProxyMode::Pass);
    sleep(ttl * 3).await;
    for k in &keys {
        let left = direct_inspect(fx, k).await;
        assert_eq!(
            left, None,
            "cancelled acquires: a lease was left behind after 3 × TTL"
        );
    }
    let direct = net.direct.clone();
    let listed = until_ok(fx, "list", || direct.list("conformance:cancel-")).await;
    assert!(
        listed.is_empty(),
        "cancelled acquires: a lease was left behind after 3 × TTL (list): {listed:?}"
    );
    let lease = client
        .acquire(&keys[0], fx.ttl * 3)
        .await
        .expect("cancelled acquires: the keys are usable afterwards");
    assert!(lease.release().await.unwrap());
}
