//! `Store::watch` on etcd beyond the shared case: notices of changes another client
//! makes, what does not notify (a waiter's queue entry, a renewal that moves the key onto
//! a longer lease), a server restart and a silent connection reported rather than a
//! silent hang, and a dropped stream removing its watches from etcd.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Solo;
use futures::StreamExt;
use leasehold_conformance::watching::{granted, notice, quiet, waiter};
use leasehold_core::WatchStore;
use leasehold_core::{Changes, Fence, Key, OwnerToken, Store};
use leasehold_testkit::ProxyMode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn key(name: &str) -> Key {
    Key::new(format!("etcd-watch:{name}")).unwrap()
}

/// How long the tests wait to see that something does not notify.
const QUIET_FOR: Duration = Duration::from_millis(1500);

/// The lease key's version (1 when created, +1 per put), read with a raw client.
async fn version(s: &Solo, k: &Key) -> i64 {
    let mut raw = s.raw().await;
    let resp = raw.get(s.store.lease_key(k), None).await.unwrap();
    resp.kvs().first().map_or(0, |kv| kv.version())
}

/// The changes a second store (its own client and connection, straight to the server)
/// makes are noticed by the watching store, and so is an expiry; a waiter joining the
/// queue and a renewal that moves the key onto a longer etcd lease (a put on the live
/// key) are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_another_clients_changes_but_not_queue_entries_or_renewals() {
    let s = Solo::start().await;
    let other = s.direct().await;
    let k = key("other");
    let mut changes = s.store.watch(&k).await.expect("watch");

    let a = OwnerToken::random();
    granted(&other, &k, &a, Duration::from_secs(4)).await;
    notice(&mut changes, "another client's grant").await;

    // A waiter queues up under the key (`<lease key>\0<owner>`): no notice.
    let w = OwnerToken::random();
    let waiting = Arc::new(s.direct().await);
    let waiter = waiter(waiting.clone(), &k, w);
    quiet(&mut changes, QUIET_FOR, "a waiter's queue entry").await;
    assert!(!waiter.is_finished(), "the waiter stopped waiting");

    // A renewal for a longer TTL than granted moves the key onto a new lease.
    other.renew(&k, &a, Duration::from_secs(9)).await.unwrap();
    assert_eq!(version(&s, &k).await, 2, "the renewal put the key again");
    quiet(&mut changes, QUIET_FOR, "a renewal").await;

    other.release(&k, &a).await.unwrap();
    notice(&mut changes, "another client's release").await;
    waiter.await.unwrap().unwrap();
    // The waiter takes its turn (its grant deletes its queue entry: one notice).
    granted(&*waiting, &k, &w, Duration::from_secs(4)).await;
    notice(&mut changes, "the waiter's grant").await;
    waiting.release(&k, &w).await.unwrap();
    notice(&mut changes, "the waiter's release").await;

    other
        .put_record(&k, Fence(7), b"value")
        .await
        .expect("put_record");
    notice(&mut changes, "another client's record write").await;

    // A lease nobody renews: etcd deletes the key when its lease expires.
    granted(&other, &k, &OwnerToken::random(), Duration::from_secs(1)).await;
    notice(&mut changes, "a grant").await;
    notice(&mut changes, "an expiry").await;
}

/// Waits for the watch to report that notices may be lost: an `Err` item or the end.
async fn reported(changes: &mut Changes, within: Duration, what: &str) {
    let started = tokio::time::Instant::now();
    loop {
        match tokio::time::timeout_at(started + within, changes.next()).await {
            Ok(Some(Err(_)) | None) => return,
            // A notice of a change before the fault; keep waiting for the report.
            Ok(Some(Ok(()))) => {}
            Err(_) => panic!("the watch hung silently for {within:?} after {what}"),
        }
    }
}

/// A server crash-restart breaks the watch's connection: the stream says so (an `Err`
/// item or its end) instead of hanging; a connection that goes silent (every packet
/// dropped) is given up by the client's HTTP/2 keep-alive (every 10 s, answer within
/// the operation timeout) and reported too. A watch set up again afterwards notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_or_a_silent_connection_is_reported_not_a_silent_hang() {
    let s = Solo::start().await;
    let k = key("restart");
    let mut changes = s.store.watch(&k).await.expect("watch");
    let server = s.server.clone();
    tokio::task::spawn_blocking(move || server.restart())
        .await
        .unwrap();
    reported(&mut changes, Duration::from_secs(20), "a server restart").await;

    // Watch again once the store has reconnected; it notices.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut changes = loop {
        match s.store.watch(&k).await {
            Ok(c) => break c,
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("watch after the restart: {e}"),
        }
    };
    let a = OwnerToken::random();
    granted(&*s.store, &k, &a, Duration::from_secs(30)).await;
    notice(&mut changes, "a grant after the restart").await;

    // The connection goes silent: no reset, no answer.
    s.proxy.set_mode(ProxyMode::Blackhole);
    reported(
        &mut changes,
        Duration::from_secs(30),
        "the connection went silent",
    )
    .await;
    s.proxy.set_mode(ProxyMode::Pass);
}

/// etcd's count of watchers (`etcd_debugging_mvcc_watcher_total` on `/metrics`).
async fn watchers(s: &Solo) -> u64 {
    let mut conn = tokio::net::TcpStream::connect(s.server.addr())
        .await
        .expect("connect to etcd's client port");
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).await.unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watcher_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .expect("etcd reports its watcher count")
}

/// Watching registers two watchers in etcd (the lease key and the record key); dropping
/// the stream removes them (the gRPC stream closes, and etcd cancels its watches). No
/// task of the store's keeps running for it (the stream runs only when polled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_stream_removes_its_watchers_from_etcd() {
    let s = Solo::start().await;
    let before = watchers(&s).await;
    let changes = s.store.watch(&key("drop")).await.expect("watch");
    assert_eq!(watchers(&s).await, before + 2, "one watcher per key");
    drop(changes);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = watchers(&s).await;
        if now == before {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{now} watchers 10 s after the stream was dropped, {before} before"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
