//! ZooKeeper-specific behaviour: URLs, the negotiated session timeout reported as the
//! granted TTL, fences across a server restart, a node left by a cut acquire found by the
//! same owner's retry, the root path (chroot).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Servers, Setup, raw};
use leasehold_core::{
    AcquireOutcome, Key, LeaseClient, LeaseConfig, OwnerToken, ReleaseOutcome, RenewOutcome, Store,
    StoreErrorKind,
};
use leasehold_core::{BatchStore, WaitStore};
use leasehold_testkit::proof::{Backend, Fault, proves};
use leasehold_testkit::{ProxyMode, ZK_MAX_SESSION_TIMEOUT, ZK_MIN_SESSION_TIMEOUT, ZkServer};
use leasehold_zookeeper::{ZkConfig, ZkStore};
use tokio::time::Instant;

fn key(name: &str) -> Key {
    Key::new(format!("zk:{name}")).unwrap()
}

async fn acquired(store: &ZkStore, k: &Key, owner: &OwnerToken, ttl: Duration) -> (u64, Duration) {
    match store.acquire(k, owner, ttl).await.expect("acquire") {
        AcquireOutcome::Acquired { fence, ttl } => (fence.get(), ttl),
        held => panic!("expected a grant, got {held:?}"),
    }
}

async fn start_solo() -> ZkServer {
    tokio::task::spawn_blocking(ZkServer::start).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_are_config_errors_and_a_dead_address_is_not() {
    for bad in [
        "zookeeper://h:0/x",
        "zookeeper://h:1/",
        "zookeeper://h:1?session_timeout=1ms",
        // User information without a password (user:password@ is a digest identity).
        "zookeeper://u@h:1/x",
        "zookeeper://h:1/x?cacert=/ca.pem",
        "etcd://h:1",
    ] {
        let e = ZkStore::open(bad).await.expect_err(bad);
        assert_eq!(e.kind(), StoreErrorKind::Config, "{bad}: {e}");
    }
    // Nobody listens on this port: retryable, not a configuration error.
    let port = leasehold_testkit::free_port();
    let url = format!("zookeeper://127.0.0.1:{port}/x?connect_timeout=2s");
    let e = ZkStore::open(&url).await.expect_err("nothing listens");
    assert_ne!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(e.is_retryable(), "{e}");
}

/// Checks a grant of `asked` by a call that took `took`, on a session whose longest grant
/// is `longest`: the TTL asked for, at most `longest` less the call's round trip (which
/// `took` bounds from above).
fn assert_granted(granted: Duration, asked: Duration, longest: Duration, took: Duration) {
    let most = asked.min(longest);
    let least = asked.min(longest.saturating_sub(took));
    assert!(
        least <= granted && granted <= most,
        "granted {granted:?} for {asked:?} asked: must lie in {least:?}..={most:?} (the \
         session's longest grant {longest:?} less a round trip of at most {took:?})"
    );
}

/// The session timeout asked for is bounded by the server's min and max; every grant and
/// renewal reports what the session can back: the TTL asked for, at most the negotiated
/// timeout less the time the leader may take to hear of the session (half the ensemble's
/// tick — given, or half the session timeout when not — plus the client's ping interval)
/// and less the call's round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_negotiated_session_timeout_bounds_and_is_reported_as_the_ttl() {
    let zk = start_solo().await;
    let base = format!("zookeeper://127.0.0.1:{}/ttl", zk.port());
    let a = OwnerToken::random();

    // Asked for less than the server's minimum (500 ms): raised to it. (The client gives its
    // first connect the session timeout asked for, so ask for one a busy server can meet.)
    let low = ZkStore::open(&format!("{base}?session_timeout=300ms"))
        .await
        .unwrap();
    assert_eq!(
        low.negotiated_session_timeout().await.unwrap(),
        ZK_MIN_SESSION_TIMEOUT
    );
    // No tick given: half of 500 ms assumed, reports every 125 ms; the client's tick is
    // 25 ms (its 400 ms connection timeout is over 3/5 of the session's), a ping after 3.
    let lag = low.report_lag().await.unwrap();
    assert_eq!(lag, Duration::from_millis(125 + 4 * 25));
    let longest = ZK_MIN_SESSION_TIMEOUT - lag;
    let k = key("low");
    let asked = Duration::from_millis(100);
    let t = std::time::Instant::now();
    let (_, granted) = acquired(&low, &k, &a, asked).await;
    assert_granted(granted, asked, longest, t.elapsed());
    low.release(&k, &a).await.unwrap();

    // The ensemble's tick given: a quarter of a second, reports every 125 ms; the client's
    // tick is 1/8 of its 1.6 s connection timeout.
    let ticked = ZkStore::open(&format!("{base}?session_timeout=4s&tick_time=250ms"))
        .await
        .unwrap();
    let lag = ticked.report_lag().await.unwrap();
    assert_eq!(lag, Duration::from_millis(125 + 4 * 200));
    let longest = Duration::from_secs(4) - lag;
    let k = key("ticked");
    let asked = Duration::from_secs(4);
    let t = std::time::Instant::now();
    let (_, granted) = acquired(&ticked, &k, &a, asked).await;
    assert_granted(granted, asked, longest, t.elapsed());
    let t = std::time::Instant::now();
    let RenewOutcome::Renewed { ttl: renewed } = ticked.renew(&k, &a, asked).await.unwrap() else {
        panic!("the holder's renewal must be granted");
    };
    assert_granted(renewed, asked, longest, t.elapsed());
    // What a waiter sees: the longest the holder's grant can be.
    let info = ticked.inspect(&k).await.unwrap().expect("held");
    assert_eq!(info.remaining, Some(longest));
    ticked.release(&k, &a).await.unwrap();

    // Asked for more than the server's maximum: lowered to it; a longer TTL is cut to it
    // less the lag (no tick given: 30 s assumed, reports every 15 s; the client's tick is
    // 3 s, 1/20 of the session timeout, a ping after 3).
    let high = ZkStore::open(&format!("{base}?session_timeout=120s"))
        .await
        .unwrap();
    assert_eq!(
        high.negotiated_session_timeout().await.unwrap(),
        ZK_MAX_SESSION_TIMEOUT
    );
    let lag = high.report_lag().await.unwrap();
    assert_eq!(lag, Duration::from_secs(15 + 4 * 3));
    let longest = ZK_MAX_SESSION_TIMEOUT - lag;
    let k = key("high");
    let asked = Duration::from_secs(90);
    let t = std::time::Instant::now();
    let (_, granted) = acquired(&high, &k, &a, asked).await;
    assert_granted(granted, asked, longest, t.elapsed());
    let t = std::time::Instant::now();
    let RenewOutcome::Renewed { ttl: renewed } = high.renew(&k, &a, asked).await.unwrap() else {
        panic!("the holder's renewal must be granted");
    };
    assert_granted(renewed, asked, longest, t.elapsed());
    let info = high.inspect(&k).await.unwrap().expect("held");
    assert_eq!(info.remaining, Some(longest));
    high.release(&k, &a).await.unwrap();

    // A tick so long that nothing of the session timeout is left: refused when opening.
    let e = ZkStore::open(&format!("{base}?session_timeout=4s&tick_time=10s"))
        .await
        .expect_err("nothing left to grant");
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
}

/// A restarted ZooKeeper server gives every session it restores a fresh timeout: the lease
/// of a holder that went silent before the restart (its pings dropped by a proxy, as if it
/// had died) outlives its own session's expiry by the time already run, so a contender
/// waits for it from the restart on. The chaos checker's C9 takeover bound counts on it
/// (docs/chaos.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_gives_a_silent_holders_session_a_fresh_timeout() {
    let zk = std::sync::Arc::new(start_solo().await);
    let proxy = leasehold_testkit::FaultProxy::start(([127, 0, 0, 1], zk.port()).into());
    let session = Duration::from_secs(3);
    let url = |port: u16| {
        format!(
            "zookeeper://127.0.0.1:{port}/renewed?session_timeout={}ms&timeout=2s",
            session.as_millis()
        )
    };
    let holder = ZkStore::open(&url(proxy.port())).await.unwrap();
    let k = key("silent-holder-restart");
    acquired(&holder, &k, &OwnerToken::random(), session).await;
    // Its last ping is before this: its session ends a session timeout after, at the latest.
    proxy.set_mode(ProxyMode::Blackhole);
    let silent = Instant::now();
    tokio::time::sleep_until(silent + Duration::from_millis(1500)).await;
    let killed = Instant::now();
    let z = zk.clone();
    tokio::task::spawn_blocking(move || z.restart())
        .await
        .unwrap();
    let back = Instant::now();
    let contender = ZkStore::open(&url(zk.port())).await.unwrap();
    let freed = loop {
        match contender.inspect(&k).await {
            Ok(None) => break Instant::now(),
            Ok(Some(_)) => {}
            Err(e) => assert!(e.is_retryable(), "inspect after the restart: {e}"),
        }
        assert!(
            back.elapsed() < session + Duration::from_secs(10),
            "the lease outlived the restart by far more than a session timeout"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // From the restart, however long the server took to come back (a restart longer than
    // the session timeout alone would pass the first check): the session's new timeout
    // starts when the server loads it, moments before it serves.
    assert!(
        freed >= killed + session && freed + Duration::from_secs(1) >= back + session,
        "freed {:?} after the kill, {:?} after the server was back, {:?} after the holder \
         went silent: the restart renewed nothing (its session ended {session:?} after its \
         last ping at the latest)",
        freed - killed,
        freed - back,
        freed - silent
    );
    drop(holder);
}

/// A delete that never reaches the server is tried again until the node is gone. The
/// holder's connection loses every byte (a blackhole) from before its release to after
/// its lease's deadline: the release times out, so does the store's own delete of the
/// lease nobody renewed, at the deadline, and neither request is ever applied. Then the
/// connection is reset and the client reconnects within the session timeout, keeping its
/// session, which therefore keeps the node alive: left alone, the node would hold the
/// lease for as long as the holder's store lives. A contender gets the lease soon after
/// the connection is back, long before the holder's session could end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_that_never_reached_the_server_is_tried_again_until_the_node_is_gone() {
    let zk = start_solo().await;
    let proxy = leasehold_testkit::FaultProxy::start(([127, 0, 0, 1], zk.port()).into());
    let session = Duration::from_secs(10);
    let url = |port: u16| {
        format!(
            "zookeeper://127.0.0.1:{port}/undeleted?session_timeout={}ms&timeout=500ms",
            session.as_millis()
        )
    };
    let holder = ZkStore::open(&url(proxy.port())).await.unwrap();
    let k = key("delete-lost");
    let owner = OwnerToken::random();
    let sent = Instant::now();
    let (_, granted) = acquired(&holder, &k, &owner, Duration::from_secs(1)).await;
    let id = holder.session_id().await.unwrap();
    proxy.set_mode(ProxyMode::Blackhole);
    let release = holder.release(&k, &owner).await;
    assert!(
        matches!(&release, Err(e) if e.is_retryable()),
        "a release whose bytes are lost: {release:?}"
    );
    // The store's delete at the lease's deadline is lost too, and its bound passes.
    tokio::time::sleep_until(sent + granted + Duration::from_millis(800)).await;
    proxy.set_mode(ProxyMode::Reset);
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.set_mode(ProxyMode::Pass);
    let back = Instant::now();
    let contender = ZkStore::open(&url(zk.port())).await.unwrap();
    let limit = Duration::from_secs(4);
    loop {
        match contender.acquire(&k, &OwnerToken::random(), session).await {
            Ok(AcquireOutcome::Acquired { .. }) => break,
            Ok(AcquireOutcome::Held { .. }) => {}
            Err(e) => assert!(e.is_retryable(), "acquire after the reset: {e}"),
        }
        assert!(
            back.elapsed() < limit,
            "the lease whose deletes were lost was still held {limit:?} after the \
             connection was back: its node was never deleted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The holder kept its session: the node went by the store's delete, not with an
    // ended session.
    assert_eq!(
        holder.session_id().await.unwrap(),
        id,
        "setup: the holder's session ended"
    );
    drop(holder);
}

/// Fences are czxids, and ZooKeeper logs every transaction before it answers: after a
/// `kill -9` and restart of the server, a new grant's fence is above every fence before
/// it. The lease held across the restart by a lease client is kept (its session survived:
/// the restarted server restores sessions from its log, and the client reconnected within
/// the session timeout) or lost in time: a contender trying every 100 ms from the restart
/// until a session timeout and more after it never gets the lease while the holder still
/// believes (the holder's deadline passed before the contender's grant was answered), and
/// a kept lease is renewed after the restart and still the holder's in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_rise_across_a_server_restart() {
    let _proof = proves(Backend::Zookeeper, Fault::RestartWithPersistence);
    let zk = std::sync::Arc::new(start_solo().await);
    let session = Duration::from_secs(8);
    let url = format!(
        "zookeeper://127.0.0.1:{}/restart?session_timeout={}ms&timeout=2s",
        zk.port(),
        session.as_millis()
    );
    let store = ZkStore::open(&url).await.unwrap();
    let k = key("restart");
    let mut last = 0;
    for _ in 0..3 {
        let o = OwnerToken::random();
        let (f, _) = acquired(&store, &k, &o, session).await;
        assert!(f > last);
        last = f;
        store.release(&k, &o).await.unwrap();
    }
    let holder_store = Arc::new(ZkStore::open(&url).await.unwrap());
    let config = LeaseConfig::new(session).unwrap();
    let client = LeaseClient::new(holder_store, config.clone());
    let lease = client.try_acquire(&k).await.unwrap();
    let held_fence = lease.fence().get();
    assert!(held_fence > last);
    let z = zk.clone();
    tokio::task::spawn_blocking(move || z.restart())
        .await
        .unwrap();
    let back = Instant::now();
    // The contender (the first store, its own session) tries until a session timeout and
    // more after the restart; whenever it gets the lease, the holder must not believe.
    let contender = OwnerToken::random();
    let mut taken = None;
    while back.elapsed() < session + Duration::from_secs(2) {
        match store.acquire(&k, &contender, session).await {
            Ok(AcquireOutcome::Acquired { fence, .. }) => {
                let replied = Instant::now();
                assert!(
                    !lease.is_valid(),
                    "a second holder while the first still believes it holds the lease"
                );
                assert!(
                    lease.valid_until() <= replied,
                    "the holder's deadline is {:?} after the contender's grant reply",
                    lease.valid_until() - replied
                );
                taken = Some(fence.get());
                break;
            }
            Ok(AcquireOutcome::Held { .. }) => {}
            // The client reconnects by itself after the restart.
            Err(e) => assert!(e.is_retryable(), "contender: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let other = key("restart-other");
    let b = OwnerToken::random();
    let (after, _) = loop {
        match store.acquire(&other, &b, session).await {
            Ok(AcquireOutcome::Acquired { fence, ttl }) => break (fence.get(), ttl),
            Ok(held) => panic!("a fresh key is held: {held:?}"),
            Err(e) if e.is_retryable() && back.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("acquire after the restart: {e}"),
        }
    };
    assert!(
        after > held_fence,
        "fence {after} after the restart is not above {held_fence}"
    );
    eprintln!(
        "restart: kept {}, taken {taken:?}, lost {:?}",
        lease.is_valid(),
        lease.lost_reason()
    );
    match taken {
        None if lease.is_valid() => {
            // Kept: renewed after the restart (a deadline past `back` plus the validity
            // of its last grant comes from a renewal sent after it), still its own.
            assert!(
                lease.valid_until() > back + config.validity(lease.ttl()),
                "kept, but not renewed since the restart"
            );
            let info = store.inspect(&k).await.unwrap().expect("kept");
            assert_eq!((info.owner, info.fence.get()), (*lease.owner(), held_fence));
            assert!(lease.release().await.unwrap());
        }
        None => {
            // Lost, and nobody has it yet: the next grant's fence is higher.
            let _ = lease.release().await;
            let c = OwnerToken::random();
            let (f, _) = acquired(&store, &k, &c, session).await;
            assert!(f > held_fence);
        }
        Some(f) => {
            assert!(f > held_fence, "fence {f} after {held_fence}");
            assert!(
                !lease.release().await.unwrap_or(false),
                "the lost holder's release ended the new lease"
            );
            let info = store.inspect(&k).await.unwrap().expect("taken");
            assert_eq!((info.owner, info.fence.get()), (contender, f));
        }
    }
}

/// An acquire cut after its `create` was sent (its reply never read) leaves a node named
/// with the owner token; the same owner's retry finds it and returns its czxid as the
/// fence, with no second node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_left_by_a_cut_acquire_is_found_by_the_retry() {
    let setup = Setup::start(Servers::solo().await).await;
    let raw = raw(&setup.servers.connect_string()).await;
    let store = setup.store.clone();
    let proxy = setup.proxies[0].clone();
    let k = key("orphan");
    let dir = store.lease_dir(&k);
    let ttl = Duration::from_secs(8);
    // Warm up, then slow every reply so that an acquire can be cut between its requests.
    let w = OwnerToken::random();
    acquired(&store, &k, &w, ttl).await;
    store.release(&k, &w).await.unwrap();
    let delay = Duration::from_millis(150);
    proxy.set_mode(ProxyMode::Delay(delay));
    let mut found = false;
    for step in 2..24u32 {
        let owner = OwnerToken::random();
        let cut = delay * step / 2;
        let _ = tokio::time::timeout(cut, store.acquire(&k, &owner, ttl)).await;
        tokio::time::sleep(delay * 3).await;
        let prefix = ZkStore::node_prefix(&owner);
        let nodes: Vec<String> = raw
            .list_children(&dir)
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n.starts_with(&prefix))
            .collect();
        if let [node] = nodes.as_slice() {
            let stat = raw
                .check_stat(&format!("{dir}/{node}"))
                .await
                .unwrap()
                .expect("the orphan node");
            proxy.set_mode(ProxyMode::Pass);
            let (fence, _) = acquired(&store, &k, &owner, ttl).await;
            assert_eq!(
                fence, stat.czxid as u64,
                "the retry must return the fence of the node the cut acquire created"
            );
            let all = raw.list_children(&dir).await.unwrap();
            assert_eq!(all, vec![node.clone()], "the retry created a second node");
            assert_eq!(
                store.release(&k, &owner).await.unwrap(),
                ReleaseOutcome::Released
            );
            found = true;
            break;
        }
        // Cut before the create was sent (or after it completed): clean up.
        proxy.set_mode(ProxyMode::Pass);
        let _ = store.release(&k, &owner).await;
        proxy.set_mode(ProxyMode::Delay(delay));
    }
    assert!(found, "setup: no cut left an orphan node to find");
}

/// The URL's path is the root of every lease: two roots on one server are two
/// namespaces, and the nodes live under the root given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_path_is_a_namespace() {
    let zk = start_solo().await;
    let one = ZkStore::open(&format!("zookeeper://127.0.0.1:{}/apps/one", zk.port()))
        .await
        .unwrap();
    let two = ZkStore::open(&format!("zookeeper://127.0.0.1:{}/apps/two", zk.port()))
        .await
        .unwrap();
    let k = Key::new("job:a/b.c").unwrap();
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    acquired(&one, &k, &a, Duration::from_secs(5)).await;
    acquired(&two, &k, &b, Duration::from_secs(5)).await;
    assert_eq!(one.inspect(&k).await.unwrap().unwrap().owner, a);
    assert_eq!(two.inspect(&k).await.unwrap().unwrap().owner, b);
    let listed: Vec<_> = one
        .list("job:")
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.key)
        .collect();
    assert_eq!(listed, vec![k.clone()]);
    let raw = raw(&zk.connect_string()).await;
    let children = raw.list_children("/apps/one").await.unwrap();
    assert_eq!(children, vec!["job:a%2Fb%2Ec".to_owned()]);
    let queue = raw.list_children("/apps/one/job:a%2Fb%2Ec").await.unwrap();
    assert_eq!(queue.len(), 1);
    assert!(queue[0].starts_with(&a.to_string()), "{queue:?}");
    one.release(&k, &a).await.unwrap();
    two.release(&k, &b).await.unwrap();
    // A config with the root set programmatically.
    let c = ZkConfig::new([zk.connect_string()])
        .unwrap()
        .chroot("/apps/three")
        .unwrap();
    let three = ZkStore::connect(c).await.unwrap();
    assert_eq!(three.inspect(&k).await.unwrap(), None);
}

/// Waiters queue in the order they start waiting and each watches only its predecessor:
/// a release wakes the next waiter alone (no herd), and the lease is kept for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_next_waiter() {
    let zk = start_solo().await;
    let url = format!(
        "zookeeper://127.0.0.1:{}/fifo?session_timeout=10s",
        zk.port()
    );
    let store = std::sync::Arc::new(ZkStore::open(&url).await.unwrap());
    let k = key("fifo");
    let ttl = Duration::from_secs(10);
    let holder = OwnerToken::random();
    let (mut last, _) = acquired(&store, &k, &holder, ttl).await;
    let waiters: Vec<OwnerToken> = (0..3).map(|_| OwnerToken::random()).collect();
    let mut waits = Vec::new();
    for w in &waiters {
        let (store, k, w) = (store.clone(), k.clone(), *w);
        waits.push(tokio::spawn(async move {
            store.wait_released(&k, &w, Duration::from_secs(60)).await
        }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let raw = raw(&zk.connect_string()).await;
    let dir = store.lease_dir(&k);
    let mut queue = raw.list_children(&dir).await.unwrap();
    queue.sort_by_key(|n| n.rsplit_once('-').map(|(_, s)| s.to_owned()));
    let owners: Vec<String> = queue.iter().map(|n| n[..32].to_owned()).collect();
    let expected: Vec<String> = std::iter::once(&holder)
        .chain(&waiters)
        .map(|o| o.to_string())
        .collect();
    assert_eq!(owners, expected, "the queue is in arrival order");
    let mut releaser = holder;
    for (i, w) in waiters.iter().enumerate() {
        assert!(!waits[i].is_finished(), "waiter {i} woken before its turn");
        assert_eq!(
            store.release(&k, &releaser).await.unwrap(),
            ReleaseOutcome::Released
        );
        tokio::time::timeout(Duration::from_secs(5), &mut waits[i])
            .await
            .expect("the next waiter is woken")
            .unwrap()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        for (j, later) in waits.iter().enumerate().skip(i + 1) {
            assert!(
                !later.is_finished(),
                "waiter {j} woken by a release meant for waiter {i}"
            );
        }
        // Reserved: someone else is told Held; the waiter gets it.
        assert!(matches!(
            store.acquire(&k, &OwnerToken::random(), ttl).await.unwrap(),
            AcquireOutcome::Held { .. }
        ));
        let (f, _) = acquired(&store, &k, w, ttl).await;
        assert!(f > last, "fence {f} of waiter {i} is not above {last}");
        last = f;
        releaser = *w;
    }
    assert_eq!(
        store.release(&k, &releaser).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// The zxid of a marker node created (and then deleted) by `raw`: between two markers, the
/// difference less 2 (the first's delete, the second's create) is the number of other
/// transactions.
async fn last_zxid(raw: &zookeeper_client::Client) -> i64 {
    let options =
        zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    let (stat, _) = raw.create("/zxid-marker", &[], &options).await.unwrap();
    raw.delete("/zxid-marker", None).await.unwrap();
    stat.czxid
}

/// `renew_many` confirms a batch with **one** check `multi` (one transaction through the
/// leader, whatever the batch's size); a lease whose node is gone fails that `multi`, is
/// answered `NotOwner`, and the rest are confirmed by one more: a lost lease costs one
/// transaction and fails no other lease's renewal, wherever it sits in the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_many_confirms_a_batch_in_one_multi_and_a_lost_lease_fails_no_other() {
    let zk = start_solo().await;
    let store = ZkStore::open(&format!(
        "zookeeper://127.0.0.1:{}/batch?session_timeout=10s&tick_time=250ms",
        zk.port()
    ))
    .await
    .unwrap();
    let raw = raw(&zk.connect_string()).await;
    let ttl = Duration::from_secs(8);
    let owner = OwnerToken::random();
    let keys: Vec<Key> = (0..5).map(|i| key(&format!("batch-{i}"))).collect();
    for k in &keys {
        acquired(&store, k, &owner, ttl).await;
    }
    let batch: Vec<(Key, OwnerToken)> = keys.iter().map(|k| (k.clone(), owner)).collect();
    let renewed = |got: Vec<Result<RenewOutcome, leasehold_core::StoreError>>| -> Vec<bool> {
        got.into_iter()
            .map(|r| match r.expect("no error for one lease") {
                RenewOutcome::Renewed { .. } => true,
                RenewOutcome::NotOwner => false,
            })
            .collect()
    };

    // All live: one transaction.
    let before = last_zxid(&raw).await;
    let got = store.renew_many(&batch, ttl).await.unwrap();
    let after = last_zxid(&raw).await;
    assert_eq!(renewed(got), vec![true; 5]);
    assert_eq!(
        after - before - 2,
        1,
        "a batch of five must be confirmed by one transaction"
    );

    // The first and the fourth lost (their nodes deleted behind the store's back): one
    // failed multi per lost lease, then the rest in one.
    for k in [&keys[0], &keys[3]] {
        let dir = store.lease_dir(k);
        let children = raw.list_children(&dir).await.unwrap();
        assert_eq!(children.len(), 1, "{children:?}");
        raw.delete(&format!("{dir}/{}", children[0]), None)
            .await
            .unwrap();
    }
    let before = last_zxid(&raw).await;
    let got = store.renew_many(&batch, ttl).await.unwrap();
    let after = last_zxid(&raw).await;
    assert_eq!(renewed(got), vec![false, true, true, false, true]);
    let multis = after - before - 2;
    eprintln!("two lost leases in a batch of five: {multis} transactions");
    assert!(
        multis <= 3,
        "two lost leases must cost at most one more transaction each, not one per lease \
         ({multis} in all)"
    );
    for k in [&keys[1], &keys[2], &keys[4]] {
        let info = store.inspect(k).await.unwrap().expect("still held");
        assert_eq!(info.owner, owner);
        assert_eq!(
            store.release(k, &owner).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    // The lost ones stay lost.
    for k in [&keys[0], &keys[3]] {
        assert_eq!(
            store.renew(k, &owner, ttl).await.unwrap(),
            RenewOutcome::NotOwner
        );
        assert_eq!(store.inspect(k).await.unwrap(), None);
    }
}
