//! What an acquire and a release send to etcd, counted by the server itself (its gRPC
//! request counters in `/metrics`): an uncontended pair is a lease grant and a transaction,
//! then a transaction and a revoke, with no read (issue 29: a read before each, and a
//! keep-alive before the release, made seven requests of a pair). Each fallback (a read,
//! a keep-alive) is checked to be taken where the short path cannot be trusted, and no
//! etcd lease to be left behind.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::Solo;
use leasehold_core::{AcquireOutcome, Key, OwnerToken, ReleaseOutcome, RenewOutcome, Store};
use leasehold_testkit::{EtcdServer, ProxyMode};

const METHODS: [&str; 6] = [
    "Range",
    "Txn",
    "LeaseGrant",
    "LeaseRevoke",
    "LeaseKeepAlive",
    "LeaseTimeToLive",
];

fn key(name: &str) -> Key {
    Key::new(format!("etcd-requests:{name}")).unwrap()
}

/// The server's request counts of [`METHODS`].
fn counts(server: &EtcdServer) -> BTreeMap<&'static str, u64> {
    METHODS
        .iter()
        .map(|m| (*m, server.grpc_requests(m)))
        .collect()
}

/// What was sent between two [`counts`], without the methods not sent.
fn sent(
    before: &BTreeMap<&'static str, u64>,
    after: &BTreeMap<&'static str, u64>,
) -> BTreeMap<&'static str, u64> {
    after
        .iter()
        .map(|(m, n)| (*m, n - before[m]))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn expect(pairs: &[(&'static str, u64)]) -> BTreeMap<&'static str, u64> {
    pairs.iter().copied().collect()
}

/// Acquires `k` for `owner` (it must be free).
async fn acquire(s: &Solo, k: &Key, owner: &OwnerToken, ttl: Duration) {
    let got = s.store.acquire(k, owner, ttl).await;
    assert!(
        matches!(got, Ok(AcquireOutcome::Acquired { .. })),
        "{got:?}"
    );
}

/// Releases `k` as `owner` (it must be held by it): what the release sent.
async fn release(s: &Solo, k: &Key, owner: &OwnerToken) -> BTreeMap<&'static str, u64> {
    let before = counts(&s.server);
    assert_eq!(
        s.store.release(k, owner).await.unwrap(),
        ReleaseOutcome::Released
    );
    sent(&before, &counts(&s.server))
}

/// The etcd leases the server has.
async fn leases(s: &Solo) -> Vec<i64> {
    let mut raw = s.raw().await;
    let resp = raw.leases().await.unwrap();
    resp.leases().iter().map(|l| l.id()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_pair_is_a_grant_and_a_transaction_then_a_transaction_and_a_revoke() {
    let s = Solo::start().await;
    let k = key("pair");
    let a = OwnerToken::random();
    let c0 = counts(&s.server);
    acquire(&s, &k, &a, Duration::from_secs(5)).await;
    assert_eq!(
        sent(&c0, &counts(&s.server)),
        expect(&[("LeaseGrant", 1), ("Txn", 1)]),
        "acquire"
    );
    assert_eq!(
        release(&s, &k, &a).await,
        expect(&[("LeaseRevoke", 1), ("Txn", 1)]),
        "release"
    );
    assert!(leases(&s).await.is_empty(), "no etcd lease is left");
    let mut raw = s.raw().await;
    let resp = raw.get(s.store.lease_key(&k), None).await.unwrap();
    assert!(resp.kvs().is_empty(), "the key is gone");
}

/// A renewal that moves the key onto a longer etcd lease (a TTL longer than granted)
/// updates what the store remembers: the release needs no read (nor keep-alive, within
/// half the new TTL), and revokes the new lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_renewal_moved_the_key_needs_no_read() {
    let s = Solo::start().await;
    let k = key("moved");
    let a = OwnerToken::random();
    acquire(&s, &k, &a, Duration::from_secs(2)).await;
    let renewed = s.store.renew(&k, &a, Duration::from_secs(6)).await.unwrap();
    assert_eq!(
        renewed,
        RenewOutcome::Renewed {
            ttl: Duration::from_secs(6)
        }
    );
    assert_eq!(
        release(&s, &k, &a).await,
        expect(&[("LeaseRevoke", 1), ("Txn", 1)]),
        "release"
    );
    assert!(leases(&s).await.is_empty(), "no etcd lease is left");
}

/// Past half the TTL since the grant's send, the etcd lease might have run out on etcd's
/// clock (whose expiry loop deletes the key up to 500 ms late): the release asks etcd with
/// a keep-alive before it deletes (`tests/store.rs::a_release_after_the_ttl_ran_out_…`
/// checks the answer past the TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_past_half_the_ttl_keeps_the_lease_alive_first() {
    let s = Solo::start().await;
    let k = key("half");
    let a = OwnerToken::random();
    acquire(&s, &k, &a, Duration::from_secs(2)).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        release(&s, &k, &a).await,
        expect(&[("LeaseKeepAlive", 1), ("LeaseRevoke", 1), ("Txn", 1)]),
        "release"
    );
}

/// Half the TTL counts on the boot clock: a host suspend (which the monotonic clock does
/// not see) right after the grant makes the release ask etcd too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_host_suspend_keeps_the_lease_alive_first() {
    let s = Solo::start().await;
    let k = key("suspended");
    let a = OwnerToken::random();
    acquire(&s, &k, &a, Duration::from_secs(10)).await;
    leasehold_conformance::suspend_host(Duration::from_secs(6));
    assert_eq!(
        release(&s, &k, &a).await,
        expect(&[("LeaseKeepAlive", 1), ("LeaseRevoke", 1), ("Txn", 1)]),
        "release"
    );
}

/// A lease broken while held (the key deleted, whatever its owner): the remembered grant
/// no longer matches the key, so the release reads it and answers `NotOwner`, as a release
/// by a store that never saw the grant does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_a_broken_lease_reads_the_key_and_is_not_owner() {
    let s = Solo::start().await;
    let k = key("broken");
    let a = OwnerToken::random();
    acquire(&s, &k, &a, Duration::from_secs(5)).await;
    s.direct().await.break_lease(&k).await.unwrap();
    let c0 = counts(&s.server);
    assert_eq!(
        s.store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::NotOwner
    );
    let read = sent(&c0, &counts(&s.server));
    assert_eq!(
        read.get("Range"),
        Some(&1),
        "the release read the key: {read:?}"
    );
    // Taken again by another owner: the first owner's release still finds it not its own.
    let b = OwnerToken::random();
    acquire(&s, &k, &b, Duration::from_secs(5)).await;
    assert_eq!(
        s.store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::NotOwner
    );
    assert_eq!(
        s.store.release(&k, &b).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// An acquire of a key someone else holds grants an etcd lease before it knows (the
/// transaction that finds the holder is the one that would have taken the key): that
/// lease is revoked, never left to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_that_finds_the_key_held_revokes_the_lease_it_granted() {
    let s = Solo::start().await;
    let k = key("held");
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    acquire(&s, &k, &a, Duration::from_secs(5)).await;
    let held = leases(&s).await;
    assert_eq!(held.len(), 1);
    let c0 = counts(&s.server);
    match s.store.acquire(&k, &b, Duration::from_secs(5)).await {
        Ok(AcquireOutcome::Held { remaining: Some(r) }) => {
            assert!(
                r >= Duration::from_secs(1) && r <= Duration::from_secs(5),
                "{r:?}"
            )
        }
        other => panic!("expected Held, got {other:?}"),
    }
    assert_eq!(
        sent(&c0, &counts(&s.server)),
        expect(&[
            ("LeaseGrant", 1),
            ("LeaseRevoke", 1),
            ("LeaseTimeToLive", 1),
            ("Txn", 1)
        ]),
        "an acquire of a held key"
    );
    assert_eq!(
        leases(&s).await,
        held,
        "only the holder's etcd lease is left"
    );
}

/// A retry after a transaction whose reply was lost (the acquire failed with its outcome
/// unknown, the key in fact taken) reads the key first, finds this owner holding it and
/// keeps that grant with one keep-alive: the same fence, and no second etcd lease granted.
/// The read is the one request the four-request pair adds, and only after such a failure
/// (the store remembers the grant it could not confirm).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_transaction_reply_reads_first_and_keeps_the_grant() {
    let s = Solo::start().await;
    let direct = s.direct().await;
    let ttl = Duration::from_secs(20);
    let delay = Duration::from_millis(300);
    // Each try holds every chunk on the link for `delay`, watches past the proxy for the
    // key, and drops the replies once it shows: the transaction's reply is then still
    // held in the proxy. On a loaded machine the reply may slip out first: try again.
    let mut tries = Vec::new();
    let (k, a, applied, resets_before) = 'lost: {
        for n in 0..5 {
            let k = key(&format!("lost-txn-{n}"));
            let a = OwnerToken::random();
            // Warm: the connection is open before the delay holds anything.
            s.store.inspect(&k).await.unwrap();
            s.proxy.set_mode(ProxyMode::Delay(delay));
            let pending = {
                let (store, k) = (s.store.clone(), k.clone());
                tokio::spawn(async move { store.acquire(&k, &a, ttl).await })
            };
            let mut seen = None;
            while !pending.is_finished() {
                if let Some(info) = direct.inspect(&k).await.unwrap() {
                    s.proxy.set_mode(ProxyMode::DropReplies);
                    seen = Some(info);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let first = pending.await.unwrap();
            let resets = s.proxy.resets();
            s.proxy.set_mode(ProxyMode::Pass);
            match (first, seen) {
                (Err(e), Some(info)) => {
                    assert!(e.is_ambiguous(), "the lost reply's error: {e:?}");
                    assert_eq!(info.owner, a, "the applied grant is another owner's");
                    break 'lost (k, a, info, resets);
                }
                (first, seen) => {
                    tries.push(format!("{first:?} (seen: {seen:?})"));
                    if first.is_ok() {
                        s.store.release(&k, &a).await.unwrap();
                    }
                }
            }
        }
        panic!("setup: no try lost the reply of an applied transaction: {tries:?}");
    };
    assert_eq!(leases(&s).await.len(), 1, "the first call's etcd lease");
    // The first call's connection must be gone before the retry, or a retry sent on it
    // could reach the server and lose its reply (and be counted twice). The proxy resets
    // it by itself if it lost the reply; if the reply reached a call the bound had
    // already dropped, it lost nothing and lives on: reset every connection, and wait
    // for a reset to be counted. A retry that meets the closed connection sends nothing
    // (the server counts only what it received).
    s.proxy.reset_all();
    let reset_by = Instant::now() + Duration::from_secs(5);
    while s.proxy.resets() == resets_before {
        assert!(
            Instant::now() < reset_by,
            "the first call's connection was not reset"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let c0 = counts(&s.server);
    let mut retried = None;
    for _ in 0..5 {
        match s.store.acquire(&k, &a, ttl).await {
            Ok(got) => {
                retried = Some(got);
                break;
            }
            Err(e) => assert!(e.is_retryable(), "{e:?}"),
        }
    }
    match retried {
        Some(AcquireOutcome::Acquired { fence, .. }) => {
            assert_eq!(fence, applied.fence, "the retry returns the applied grant")
        }
        other => panic!("the retry: {other:?}"),
    }
    assert_eq!(
        sent(&c0, &counts(&s.server)),
        expect(&[("LeaseKeepAlive", 1), ("Txn", 1)]),
        "the retry: a read (a transaction of two gets) and a keep-alive"
    );
    assert_eq!(leases(&s).await.len(), 1, "no second etcd lease");
    assert_eq!(
        s.store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(leases(&s).await.is_empty(), "no etcd lease is left");
}

/// A waiter's confirming acquire, after its wait in line saw the release: a keep-alive of
/// the etcd lease the wait granted for it (its spare, granted as it joined and kept alive
/// while it waited) and one transaction that takes the key at the waiter's place in line,
/// so no lease grant and no transaction that fails on the waiter's own queue entry (the
/// acquire after a wait used to send a grant and two transactions). The queue entry's
/// etcd lease is revoked off the hand-off's path. The key is on the spare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_after_a_wait_in_line_is_a_keep_alive_and_one_transaction() {
    use leasehold_core::WaitOutcome;
    let ttl = Duration::from_secs(5);
    let InLine {
        s,
        k,
        a,
        w,
        waiter: before_release,
        wait,
        ..
    } = held_with_a_waiter_in_line("after-wait", ttl, ttl).await;
    assert_eq!(release(&s, &k, &a).await.get("Txn"), Some(&1));
    let woke = tokio::time::timeout(Duration::from_secs(10), wait).await;
    assert!(
        matches!(woke, Ok(Ok(Ok(WaitOutcome::Retry)))),
        "the release did not wake the waiter: {woke:?}"
    );
    let c0 = counts(&s.server);
    acquire(&s, &k, &w, ttl).await;
    let left = only_lease(&s).await;
    assert_eq!(
        sent(&c0, &counts(&s.server)),
        expect(&[("LeaseKeepAlive", 1), ("LeaseRevoke", 1), ("Txn", 1)]),
        "an acquire after a wait in line"
    );
    assert!(
        before_release.contains(&left),
        "the key is on the lease the wait granted: {left} not in {before_release:?}"
    );
    release(&s, &k, &w).await;
    assert!(leases(&s).await.is_empty(), "no etcd lease is left");
}

/// A waiter's spare etcd lease that ran out (its waiter stopped waiting and came back
/// after the spare's TTL: paused, slow) is not used: the acquire finds it gone with its
/// keep-alive and grants a lease of its own, so the grant's validity never counts from
/// a lease etcd let lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_after_the_waits_spare_lapsed_grants_anew() {
    let ttl = Duration::from_secs(1);
    let InLine {
        s,
        k,
        a,
        w,
        holder,
        wait,
        ..
    } = held_with_a_waiter_in_line("spare-lapsed", Duration::from_secs(30), ttl).await;
    // A wait that stops once it is in line with its entry and its spare.
    wait.abort();
    // With no keep-alives, the entry's and the spare's etcd leases expire.
    let lapsed = until(|| async { (leases(&s).await == holder).then_some(()) }).await;
    assert!(lapsed.is_some(), "the waiter's etcd leases never expired");
    release(&s, &k, &a).await;
    let c0 = counts(&s.server);
    let got = s.store.acquire(&k, &w, ttl).await;
    assert!(
        matches!(got, Ok(AcquireOutcome::Acquired { .. })),
        "{got:?}"
    );
    let sent = sent(&c0, &counts(&s.server));
    assert_eq!(
        sent.get("LeaseKeepAlive"),
        Some(&1),
        "the spare is checked: {sent:?}"
    );
    assert_eq!(
        sent.get("LeaseGrant"),
        Some(&1),
        "a lease of its own: {sent:?}"
    );
    release(&s, &k, &w).await;
    assert!(leases(&s).await.is_empty(), "no etcd lease is left");
}

/// A waiter whose wait ended (its bound ran out at the holder's remaining TTL) and that
/// waits again keeps its queue entry and its spare etcd lease: the second wait grants
/// nothing, and the key goes onto the first wait's spare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_wait_of_the_same_owner_keeps_its_spare() {
    let ttl = Duration::from_secs(5);
    let InLine {
        s,
        k,
        a,
        w,
        waiter: first,
        wait,
        ..
    } = held_with_a_waiter_in_line("second-wait", ttl, ttl).await;
    wait.abort();
    let c0 = counts(&s.server);
    let wait = spawn_wait(&s, &k, w, ttl);
    // In line again once both etcd leases are kept alive by the second wait.
    let again = until(|| async {
        let n = sent(&c0, &counts(&s.server));
        (n.get("LeaseKeepAlive").copied().unwrap_or(0) >= 2).then_some(n)
    })
    .await
    .expect("the second wait kept its etcd leases alive");
    assert_eq!(
        again.get("LeaseGrant"),
        None,
        "the second wait granted: {again:?}"
    );
    release(&s, &k, &a).await;
    let woke = tokio::time::timeout(Duration::from_secs(10), wait).await;
    assert!(matches!(woke, Ok(Ok(Ok(_)))), "{woke:?}");
    acquire(&s, &k, &w, ttl).await;
    let left = only_lease(&s).await;
    assert!(
        first.contains(&left),
        "the key is on the first wait's spare: {left} not in {first:?}"
    );
    release(&s, &k, &w).await;
}

type Wait =
    tokio::task::JoinHandle<Result<leasehold_core::WaitOutcome, leasehold_core::StoreError>>;

/// A key held by `a` and `w` waiting in line for it: the server, the key, both owners, the
/// holder's etcd leases, the waiter's (its queue entry's and its spare's) and its wait.
struct InLine {
    s: Solo,
    k: Key,
    a: OwnerToken,
    w: OwnerToken,
    holder: Vec<i64>,
    waiter: Vec<i64>,
    wait: Wait,
}

/// [`InLine`] on a fresh server: `a` acquires key `name` for `holder_ttl`, `w`'s acquire
/// (for `ttl`) is answered `Held`, and `w` waits in line on a task of its own, returned
/// once its queue entry's and its spare's etcd leases are there beside the holder's.
async fn held_with_a_waiter_in_line(name: &str, holder_ttl: Duration, ttl: Duration) -> InLine {
    let s = Solo::start().await;
    let k = key(name);
    let (a, w) = (OwnerToken::random(), OwnerToken::random());
    acquire(&s, &k, &a, holder_ttl).await;
    let holder = leases(&s).await;
    assert!(matches!(
        s.store.acquire(&k, &w, ttl).await,
        Ok(AcquireOutcome::Held { .. })
    ));
    let wait = spawn_wait(&s, &k, w, ttl);
    let in_line = until(|| async { (leases(&s).await.len() == 3).then_some(()) }).await;
    assert!(in_line.is_some(), "the waiter never got in line");
    let mut waiter = leases(&s).await;
    waiter.retain(|l| !holder.contains(l));
    InLine {
        s,
        k,
        a,
        w,
        holder,
        waiter,
        wait,
    }
}

/// `w`'s wait in line for `k` (asking for `ttl`), on a task of its own.
fn spawn_wait(s: &Solo, k: &Key, w: OwnerToken, ttl: Duration) -> Wait {
    use leasehold_core::WaitStore;
    let (store, k) = (s.store.clone(), k.clone());
    tokio::spawn(async move { store.wait_turn(&k, &w, ttl, Duration::from_secs(30)).await })
}

/// The one etcd lease left (the key's), once the others (a queue entry's, revoked on a
/// task of its own) are gone.
async fn only_lease(s: &Solo) -> i64 {
    until(|| async {
        let l = leases(s).await;
        (l.len() == 1).then(|| l[0])
    })
    .await
    .expect("the queue entry's etcd lease was revoked")
}

/// Polls `f` every 20 ms for up to 20 s until it gives a value.
async fn until<T, F, Fut>(mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if let Some(v) = f().await {
            return Some(v);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
