//! `Store::watch` on Redis, beyond the conformance case: notices of changes made by
//! another store (another connection), a watch that reports a server restart and a
//! connection gone silent instead of hanging, what dropping a watch leaves behind, the
//! exact server commands of an acquire/release pair with and without a watcher, and
//! waiters that a notice does not wake.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::Standalone;
use futures::StreamExt;
use leasehold_conformance::watching::{granted, noticed, quiet};
use leasehold_core::{AcquireOutcome, Changes, Fence, Key, OwnerToken, ReleaseOutcome, Store};
use leasehold_core::{BatchStore, WaitStore, WatchStore};
use leasehold_redis::{RedisStore, WATCH_MARK_TTL, WATCH_REFRESH};
use leasehold_testkit::ProxyMode;
use tokio::time::{Instant, sleep, timeout};

const TTL: Duration = Duration::from_secs(30);

fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

/// The next item of `changes` within `within`: `Some(Ok(()))` a notice, `Some(Err)` a
/// failed watch, `None` an ended one; panics when nothing comes.
async fn next_within(
    changes: &mut Changes,
    within: Duration,
    what: &str,
) -> Option<Result<(), leasehold_core::StoreError>> {
    timeout(within, changes.next())
        .await
        .unwrap_or_else(|_| panic!("nothing from the watch within {within:?}: {what}"))
}

/// A second store on the same server, on connections of its own (not through the proxy).
async fn other_store(s: &Standalone) -> RedisStore {
    RedisStore::open(&s.server.authed_url()).await.unwrap()
}

/// The key's channel (`p{e}:released`), as `PUBSUB NUMSUB` names it.
fn channel(store: &RedisStore, k: &Key) -> String {
    format!("{}:released", store.lease_key(k))
}

async fn subscribers(s: &Standalone, channel: &str) -> u64 {
    s.cli(&["PUBSUB", "NUMSUB", channel])
        .await
        .lines()
        .nth(1)
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// Changes made by another store — a grant, a release, the next grant, a record write,
/// a break — are each noticed by the watching store; a renewal and a re-acquire by the
/// holder (extensions), a write of the record refused for its lower fence, and changes
/// of another key are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_hears_the_changes_another_store_makes() {
    let s = Standalone::start().await;
    let other = other_store(&s).await;
    let k = key("watch/other");
    let mut changes = s.store.watch(&k).await.unwrap();
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    granted(&other, &k, &a, TTL).await;
    noticed(&mut changes, "a grant").await;
    granted(&other, &k, &a, TTL).await;
    other.renew(&k, &a, TTL).await.unwrap();
    other.put_record(&k, Fence(5), b"v5").await.unwrap();
    noticed(&mut changes, "a record write").await;
    other.put_record(&k, Fence(4), b"v4").await.unwrap();
    quiet(
        &mut changes,
        Duration::from_millis(700),
        "a re-acquire, a renewal, a refused record write",
    )
    .await;
    assert_eq!(
        other.release(&k, &a).await.unwrap(),
        ReleaseOutcome::Released
    );
    noticed(&mut changes, "a release").await;
    granted(&other, &k, &b, TTL).await;
    noticed(&mut changes, "the next grant").await;
    other.break_lease(&k).await.unwrap();
    noticed(&mut changes, "a break").await;
    let elsewhere = key("watch/elsewhere");
    granted(&other, &elsewhere, &a, TTL).await;
    other.release(&elsewhere, &a).await.unwrap();
    other.put_record(&elsewhere, Fence(1), b"x").await.unwrap();
    quiet(&mut changes, Duration::from_millis(700), "another key").await;
}

/// A permit taken by `acquire_any` (one script over the slots) is a grant like any other:
/// the watcher of the slot it took hears it; a slot it did not take stays silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_by_acquire_any_is_noticed_on_its_slot() {
    let s = Standalone::start().await;
    let other = other_store(&s).await;
    let slots = [key("watch/any#0"), key("watch/any#1")];
    let mut first = s.store.watch(&slots[0]).await.unwrap();
    let mut second = s.store.watch(&slots[1]).await.unwrap();
    granted(&other, &slots[0], &OwnerToken::random(), TTL).await;
    noticed(&mut first, "the first slot's grant").await;
    match other
        .acquire_any(&slots, &OwnerToken::random(), TTL)
        .await
        .unwrap()
    {
        leasehold_core::AcquireAnyOutcome::Acquired { index: 1, .. } => {}
        other => panic!("expected the second slot, got {other:?}"),
    }
    noticed(&mut second, "a grant by acquire_any").await;
    quiet(
        &mut first,
        Duration::from_millis(700),
        "a slot acquire_any found held",
    )
    .await;
}

/// A server restart (the pub/sub connection closes) ends the watch with the error of a
/// lost connection, at once (not at the next refresh); a new watch then works (the
/// restart lost the mark, and the new watch sets it again). A connection gone silent (the proxy swallows everything, no
/// close) is found by the next refresh: an error within `WATCH_REFRESH` plus two
/// operation timeouts, never a silent hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_reports_a_restart_and_a_silent_connection() {
    let s = Standalone::start().await;
    let other = other_store(&s).await;
    let k = key("watch/restart");
    let mut changes = s.store.watch(&k).await.unwrap();
    let server = s.server.clone();
    tokio::task::spawn_blocking(move || server.stop_and_restart())
        .await
        .unwrap();
    // The closed connection says it (not the next refresh, which would fail otherwise).
    loop {
        match next_within(&mut changes, Duration::from_secs(10), "a restart").await {
            Some(Err(e)) => {
                assert!(e.kind().is_retryable(), "{e}");
                assert!(e.to_string().contains("pub/sub connection was lost"), "{e}");
                break;
            }
            None => panic!("the watch ended without an error"),
            // A notice is allowed (spurious), but the error must follow.
            Some(Ok(())) => {}
        }
    }
    let mut changes = timeout(Duration::from_secs(10), async {
        loop {
            match s.store.watch(&k).await {
                Ok(c) => return c,
                Err(_) => sleep(Duration::from_millis(200)).await,
            }
        }
    })
    .await
    .expect("watching again after the restart");
    // The other store's connection broke with the restart: its first call may fail.
    let owner = OwnerToken::random();
    let mut tries = 0;
    while !matches!(
        other.acquire(&k, &owner, TTL).await,
        Ok(AcquireOutcome::Acquired { .. })
    ) {
        tries += 1;
        assert!(tries < 5, "acquire after the restart");
    }
    noticed(&mut changes, "a grant after the restart").await;

    s.proxy.set_mode(ProxyMode::Blackhole);
    let started = Instant::now();
    let bound = WATCH_REFRESH + s.store.config().op_timeout() * 2 + Duration::from_secs(2);
    // Notices may come (spurious ones are allowed); the error or the end must follow.
    while let Some(Ok(())) = next_within(&mut changes, bound, "a silent connection").await {}
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());
    s.proxy.set_mode(ProxyMode::Pass);
}

/// Dropping the stream unsubscribes the channel (checked on the server) and stops the
/// refreshes (no more script calls); the mark lives on for at most `WATCH_MARK_TTL`
/// and then lapses. A waiter on the same key keeps the channel subscribed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_watch_unsubscribes_and_stops_refreshing() {
    let s = Standalone::start().await;
    let k = key("watch/drop");
    let chan = channel(&s.store, &k);
    let mark = s.store.watch_key(&k);
    let changes = s.store.watch(&k).await.unwrap();
    assert_eq!(subscribers(&s, &chan).await, 1);
    let pttl: u128 = s.cli(&["PTTL", &mark]).await.trim().parse().unwrap();
    assert!(pttl > 0 && pttl <= WATCH_MARK_TTL.as_millis(), "{pttl}");
    // The refreshes run while the watch lives.
    let before = s.evalsha_calls().await;
    sleep(WATCH_REFRESH + Duration::from_secs(1)).await;
    assert!(
        s.evalsha_calls().await > before,
        "the watch refreshed nothing"
    );
    drop(changes);
    sleep(Duration::from_millis(300)).await;
    assert_eq!(subscribers(&s, &chan).await, 0, "still subscribed");
    let before = s.evalsha_calls().await;
    let pttl_then: i64 = s.cli(&["PTTL", &mark]).await.trim().parse().unwrap();
    sleep(WATCH_REFRESH + Duration::from_secs(1)).await;
    assert_eq!(s.evalsha_calls().await, before, "refreshed after the drop");
    let pttl_now: i64 = s.cli(&["PTTL", &mark]).await.trim().parse().unwrap();
    assert!(
        (0..pttl_then).contains(&pttl_now),
        "the mark must lapse: {pttl_then} then {pttl_now}"
    );

    // A waiter and a watcher on one key: dropping the watch keeps the waiter's
    // subscription.
    let holder = OwnerToken::random();
    granted(&*s.store, &k, &holder, TTL).await;
    let changes = s.store.watch(&k).await.unwrap();
    let waiter = {
        let (store, k) = (s.store.clone(), k.clone());
        tokio::spawn(async move {
            store
                .wait_released(&k, &OwnerToken::random(), Duration::from_secs(30))
                .await
        })
    };
    sleep(Duration::from_millis(300)).await;
    drop(changes);
    sleep(Duration::from_millis(300)).await;
    assert_eq!(
        subscribers(&s, &chan).await,
        1,
        "the waiter lost its channel"
    );
    s.store.release(&k, &holder).await.unwrap();
    timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the waiter is woken by the release")
        .unwrap()
        .unwrap();
}

/// `INFO commandstats` as a map command → calls, without what the test itself runs.
async fn command_calls(s: &Standalone) -> BTreeMap<String, u64> {
    let info = s.cli(&["INFO", "commandstats"]).await;
    info.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .filter(|(name, _)| !matches!(name.as_str(), "info" | "config|resetstat" | "pubsub|numsub"))
        .collect()
}

/// The server commands of one acquire and one release (a grant of a free key, its
/// release, nobody queued), counted with `INFO commandstats` on a private server:
/// with nobody watching, exactly what they ran before watching existed (`EXISTS q w w`
/// is one command, as `EXISTS q` was); with a watcher, one `PUBLISH` more each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_and_release_run_the_same_commands_unless_watched() {
    let s = Standalone::start().await;
    // Connect (and check the eviction policy) and load the scripts before counting.
    let warm = OwnerToken::random();
    granted(&*s.store, &key("warm-up"), &warm, TTL).await;
    s.store.release(&key("warm-up"), &warm).await.unwrap();
    let pair = async |k: &Key| {
        let owner = OwnerToken::random();
        s.cli(&["CONFIG", "RESETSTAT"]).await;
        granted(&*s.store, k, &owner, TTL).await;
        assert_eq!(
            s.store.release(k, &owner).await.unwrap(),
            ReleaseOutcome::Released
        );
        command_calls(&s).await
    };
    let expected = |publish: u64| {
        let mut m: BTreeMap<String, u64> = [
            // acquire: GET lease, GET fence, EXISTS, TIME, SET fence, SET lease;
            // release: GET lease, EXISTS, DEL.
            ("evalsha", 2),
            ("get", 3),
            ("exists", 2),
            ("time", 1),
            ("set", 2),
            ("del", 1),
        ]
        .into_iter()
        .map(|(n, c)| (n.to_owned(), c))
        .collect();
        if publish > 0 {
            m.insert("publish".into(), publish);
        }
        m
    };
    let k = key("watch/cost");
    assert_eq!(pair(&k).await, expected(0), "nobody watching");
    // Watched by another store (its refreshes come every few seconds, not now).
    let other = other_store(&s).await;
    let changes = other.watch(&k).await.unwrap();
    // The watch's own first refresh ran just before: what follows is the pair's.
    assert_eq!(pair(&k).await, expected(2), "watched");
    // Another key is not watched.
    assert_eq!(pair(&key("watch/cost2")).await, expected(0), "another key");
    drop(changes);
}

/// A notice wakes no waiter: with a waiter queued on a held key, a record write and a
/// re-acquire by the holder reach the watcher, and the waiter sleeps on; the release
/// then wakes the waiter (the lease reserved for it) and the watcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_wake_no_waiter() {
    let s = Standalone::start().await;
    let other = Arc::new(other_store(&s).await);
    let k = key("watch/waiters");
    let holder = OwnerToken::random();
    granted(&*other, &k, &holder, TTL).await;
    let mut changes = s.store.watch(&k).await.unwrap();
    let next = OwnerToken::random();
    let waiter = {
        let (store, k) = (s.store.clone(), k.clone());
        tokio::spawn(async move {
            store
                .wait_released(&k, &next, Duration::from_secs(30))
                .await
        })
    };
    sleep(Duration::from_millis(300)).await;
    other.put_record(&k, Fence(1), b"leader").await.unwrap();
    noticed(&mut changes, "a record write").await;
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "a notice woke the waiter");
    other.release(&k, &holder).await.unwrap();
    noticed(&mut changes, "a release that reserves for the waiter").await;
    timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the waiter is woken by the release")
        .unwrap()
        .unwrap();
    assert_eq!(s.store.inspect(&k).await.unwrap().unwrap().owner, next);
}

/// `Election::observe` on Redis follows the store's notices: with an interval of an hour,
/// a new leader (elected through another store), its value and its resignation are each
/// seen within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_follows_the_notices_not_the_interval() {
    use leasehold_core::{LeaseClient, LeaseConfig};
    let s = Standalone::start().await;
    let config = LeaseConfig::new(Duration::from_secs(10)).unwrap();
    let observer = LeaseClient::new(s.store.clone(), config.clone());
    let campaigner = LeaseClient::new(Arc::new(other_store(&s).await), config);
    let e = observer.election("leader:watched").unwrap();
    let mut changes = Box::pin(e.observe(Duration::from_secs(3600)));
    let mut next = async || {
        timeout(Duration::from_secs(5), changes.next())
            .await
            .expect("a change is seen at once, not at the next poll")
            .unwrap()
            .unwrap()
    };
    assert_eq!(next().await, None);
    let a = campaigner
        .election("leader:watched")
        .unwrap()
        .campaign("a", Duration::ZERO)
        .await
        .unwrap();
    let mut seen = next().await.expect("a leader");
    if seen.value.is_none() {
        // The grant, then the value published a moment later.
        seen = next().await.expect("a leader");
    }
    assert_eq!((seen.term, seen.value), (a.term(), Some(b"a".to_vec())));
    assert!(a.resign().await.unwrap());
    assert_eq!(next().await, None);
}
