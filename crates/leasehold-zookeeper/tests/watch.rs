//! `Store::watch` on ZooKeeper beyond the shared case: notices of changes another
//! session makes, what does not notify (a waiter joining the queue, a renewal), a server
//! restart and a silent connection reported rather than a silent hang, and a dropped
//! stream (or store) removing its watches from the server.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Servers, Setup};
use futures::StreamExt;
use leasehold_conformance::watching::{granted, notice, quiet, waiter};
use leasehold_core::WatchStore;
use leasehold_core::{Changes, Fence, Key, OwnerToken, Store};
use leasehold_testkit::ProxyMode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn key(name: &str) -> Key {
    Key::new(format!("zk-watch:{name}")).unwrap()
}

/// How long the tests wait to see that something does not notify.
const QUIET_FOR: Duration = Duration::from_millis(1500);

/// The changes a second store (its own session, straight to the server) makes are
/// noticed by the watching store, and so is an expiry; a waiter joining the queue behind the holder and a
/// renewal are not. A release with a waiter hands the lease to it: its node becomes
/// first, which is noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_another_sessions_changes_but_not_waiters_or_renewals() {
    let s = Setup::start(Servers::solo().await).await;
    let other = s.direct().await;
    let k = key("other");
    let mut changes = s.store.watch(&k).await.expect("watch");

    let a = OwnerToken::random();
    granted(&other, &k, &a, Duration::from_secs(6)).await;
    notice(&mut changes, "another session's grant").await;

    // A waiter takes a place in the queue (a node behind the holder's): no notice.
    let w = OwnerToken::random();
    let waiting = Arc::new(s.direct().await);
    let waiter = waiter(waiting.clone(), &k, w);
    quiet(&mut changes, QUIET_FOR, "a waiter joining the queue").await;
    assert!(!waiter.is_finished(), "the waiter stopped waiting");
    let queue = common::raw(&s.servers.connect_string())
        .await
        .list_children(&s.store.lease_dir(&k))
        .await
        .unwrap();
    assert_eq!(
        queue.len(),
        2,
        "the waiter's node is in the queue: {queue:?}"
    );

    other.renew(&k, &a, Duration::from_secs(6)).await.unwrap();
    quiet(&mut changes, QUIET_FOR, "a renewal").await;

    other.release(&k, &a).await.unwrap();
    notice(&mut changes, "another session's release (to the waiter)").await;
    waiter.await.unwrap().unwrap();
    granted(&*waiting, &k, &w, Duration::from_secs(6)).await;
    waiting.release(&k, &w).await.unwrap();
    notice(&mut changes, "the waiter's release").await;

    other
        .put_record(&k, Fence(7), b"value")
        .await
        .expect("put_record");
    notice(&mut changes, "another session's record write").await;
    other
        .put_record(&k, Fence(8), b"again")
        .await
        .expect("put_record");
    notice(&mut changes, "another record write").await;

    // A lease nobody renews: its store deletes the node at its deadline.
    granted(&other, &k, &OwnerToken::random(), Duration::from_secs(1)).await;
    notice(&mut changes, "a grant").await;
    notice(&mut changes, "an expiry").await;
}

/// A watcher that reads the lease again after each notice (as `Election::observe` does)
/// ends with what is there after a burst of grants and releases by another session: the
/// one-shot watch is re-armed by the read that tells what changed, so a change between
/// an event and the re-arming is not lost. Repeated, for the races to happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_reads_on_each_notice_ends_with_the_last_change_of_a_burst() {
    let s = Setup::start(Servers::solo().await).await;
    let other = s.direct().await;
    for round in 0..5 {
        let k = key(&format!("burst-{round}"));
        let mut changes = s.store.watch(&k).await.expect("watch");
        let burst = {
            let (other, k) = (other.clone(), k.clone());
            tokio::spawn(async move {
                let mut last = None;
                for i in 0..20 {
                    let owner = OwnerToken::random();
                    granted(&other, &k, &owner, Duration::from_secs(6)).await;
                    if i < 19 {
                        other.release(&k, &owner).await.unwrap();
                    }
                    last = Some(owner);
                }
                last
            })
        };
        let mut seen = None;
        loop {
            match tokio::time::timeout(Duration::from_secs(2), changes.next()).await {
                Ok(Some(Ok(()))) => {
                    seen = s.store.inspect(&k).await.unwrap().map(|i| i.owner);
                }
                Ok(other) => panic!("the watch failed or ended: {other:?}"),
                Err(_) if burst.is_finished() => break,
                Err(_) => {}
            }
        }
        let last = burst.await.unwrap();
        assert_eq!(
            seen, last,
            "round {round}: the last read after a notice is stale"
        );
    }
}

/// Whether the watch reports within `within` that notices may be lost: an `Err` item or
/// the end (notices of changes before the fault are passed over).
async fn report(changes: &mut Changes, within: Duration) -> bool {
    let started = tokio::time::Instant::now();
    loop {
        match tokio::time::timeout_at(started + within, changes.next()).await {
            Ok(Some(Err(_)) | None) => return true,
            Ok(Some(Ok(()))) => {}
            Err(_) => return false,
        }
    }
}

/// Waits for the watch to report that notices may be lost; panics if it does not within
/// `within`.
async fn reported(changes: &mut Changes, within: Duration, what: &str) {
    assert!(
        report(changes, within).await,
        "the watch hung silently for {within:?} after {what}"
    );
}

/// Acquires `k` for `owner` through `store`, retrying while it reconnects (up to 30 s).
async fn granted_once_reachable(store: &dyn Store, k: &Key, owner: &OwnerToken) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match store.acquire(k, owner, Duration::from_secs(6)).await {
            Ok(leasehold_core::AcquireOutcome::Acquired { .. }) => return,
            Ok(held) => panic!("the key was not granted: {held:?}"),
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("acquire after the restart: {e}"),
        }
    }
}

/// Watches again, while the store reconnects.
async fn watch_again(s: &Setup, k: &Key) -> Changes {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match s.store.watch(k).await {
            Ok(c) => return c,
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("watch again: {e}"),
        }
    }
}

/// A server crash-restart while a change is made that the watching session cannot hear:
/// the watching store's connection is held silent (its proxy blackholed) while the server
/// restarts and another session takes the key, then let through. The stream must report
/// that notices may be lost (an `Err` item or its end), or, when the client got its
/// session back (the client re-registers its watches with the last change it saw, and the
/// server sends what changed since), notice the grant made while it was away. Either way
/// nothing is missed silently: a stream that stays quiet fails, whichever of the two the
/// client did. A connection that goes silent for good (every packet dropped: the client
/// gives it up after its connection timeout) is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_or_a_silent_connection_is_reported_not_a_silent_hang() {
    let s = Setup::start(Servers::solo().await).await;
    let Servers::Solo(server) = &s.servers else {
        unreachable!()
    };
    let k = key("restart");
    let mut changes = s.store.watch(&k).await.expect("watch");
    // The watching session hears nothing from here until the grant below is made.
    s.proxies[0].set_mode(ProxyMode::Blackhole);
    let restarted = server.clone();
    tokio::task::spawn_blocking(move || restarted.restart())
        .await
        .unwrap();
    let a = OwnerToken::random();
    let other = s.direct().await;
    granted_once_reachable(&other, &k, &a).await;
    s.proxies[0].set_mode(ProxyMode::Pass);
    match tokio::time::timeout(Duration::from_secs(20), changes.next()).await {
        // Told of the grant made while it was away: nothing was missed.
        Ok(Some(Ok(()))) => eprintln!("the restart: the grant made meanwhile was noticed"),
        // Told that notices may have been lost: a new watch notices from now on.
        Ok(Some(Err(e))) => {
            eprintln!("the restart: reported ({e})");
            changes = watch_again(&s, &k).await;
            other.release(&k, &a).await.unwrap();
            notice(&mut changes, "a release after the restart was reported").await;
        }
        Ok(None) => {
            eprintln!("the restart: reported (the stream ended)");
            changes = watch_again(&s, &k).await;
            other.release(&k, &a).await.unwrap();
            notice(&mut changes, "a release after the restart was reported").await;
        }
        Err(_) => panic!(
            "the watch neither reported the restart nor noticed the grant made while its \
             connection was silent, within 20 s: a change was missed silently"
        ),
    }

    s.proxies[0].set_mode(ProxyMode::Blackhole);
    reported(
        &mut changes,
        Duration::from_secs(20),
        "the connection went silent",
    )
    .await;
    s.proxies[0].set_mode(ProxyMode::Pass);
}

/// The server's count of watches (`zk_watch_count` from `mntr`).
async fn watches(port: u16) -> u64 {
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to zookeeper");
    conn.write_all(b"mntr").await.unwrap();
    let mut out = String::new();
    conn.read_to_string(&mut out).await.unwrap();
    out.lines()
        .find_map(|l| l.strip_prefix("zk_watch_count"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no zk_watch_count in mntr: {out}"))
}

async fn watches_come_back_to(port: u16, before: u64, after: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = watches(port).await;
        if now == before {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{now} watches on the server 10 s after {after}, {before} before"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Watching sets two watches on the server (the key's queue or its directory's creation,
/// and the record node); dropping the stream removes them. Dropping the store ends its
/// session even while a stream watches (the stream does not keep it open): the stream
/// then ends or reports an error, and the watches are gone. No task of the store's keeps
/// running for a watch (the stream runs only when polled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_stream_or_the_store_removes_its_watches() {
    let s = Setup::start(Servers::solo().await).await;
    let Servers::Solo(server) = &s.servers else {
        unreachable!()
    };
    let port = server.port();
    let store = s.direct().await;
    let before = watches(port).await;
    let changes = store.watch(&key("drop")).await.expect("watch");
    assert_eq!(watches(port).await, before + 2, "two watches per key");
    drop(changes);
    watches_come_back_to(port, before, "the stream was dropped").await;

    let k = key("drop-store");
    let mut changes = store.watch(&k).await.expect("watch");
    granted(&store, &k, &OwnerToken::random(), Duration::from_secs(6)).await;
    notice(&mut changes, "a grant").await;
    assert_eq!(watches(port).await, before + 2, "re-armed: two watches");
    drop(store);
    reported(
        &mut changes,
        Duration::from_secs(10),
        "the store was dropped",
    )
    .await;
    watches_come_back_to(port, before, "the store was dropped").await;
}
