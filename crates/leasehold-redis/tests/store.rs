//! Redis-specific behaviour of the store against a private `redis-server`: fences floored
//! at the server clock, typed errors for foreign data at the lease and fence keys, script
//! reloading, listing, breaking, release notifications, URLs.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Standalone;
use leasehold_core::{
    AcquireAnyOutcome, AcquireOutcome, Action, Error, Fence, Key, LeaseClient, LeaseConfig,
    OwnerToken, ReleaseOutcome, RenewOutcome, Store, StoreErrorKind,
};
use leasehold_core::{BatchStore, WaitStore};
use leasehold_redis::{RedisConfig, RedisFactory, RedisStore};
use tokio::time::{Instant, sleep, timeout};

const TTL: Duration = Duration::from_secs(5);

fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

async fn fence_of(store: &dyn Store, k: &Key, owner: &OwnerToken) -> Fence {
    match store.acquire(k, owner, TTL).await.unwrap() {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// Server `TIME` in microseconds.
async fn server_time_us(s: &Standalone) -> u64 {
    let t = s.cli(&["TIME"]).await;
    let mut it = t.lines();
    let secs: u64 = it.next().unwrap().trim().parse().unwrap();
    let us: u64 = it.next().unwrap().trim().parse().unwrap();
    secs * 1_000_000 + us
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_are_floored_at_server_time_and_strictly_grow() {
    let s = Standalone::start().await;
    let k = key("job:floor");
    let before = server_time_us(&s).await;
    let a = OwnerToken::random();
    let f1 = fence_of(&*s.store, &k, &a).await;
    let after = server_time_us(&s).await;
    assert!(
        (before..=after).contains(&f1.get()),
        "{before} <= {f1} <= {after}"
    );
    // The fence key holds the last fence; it outlives the lease by the fence retention
    // (see `fence_records_expire_after_their_retention_and_fences_still_rise`).
    let fence_key = s.store.fence_key(&k);
    assert_eq!(s.cli(&["GET", &fence_key]).await, f1.to_string());
    let left: u128 = s.cli(&["PTTL", &fence_key]).await.trim().parse().unwrap();
    assert!(left > leasehold_redis::DEFAULT_FENCE_RETENTION.as_millis());
    // The lease value is owner:fence with an expiry.
    let lease_key = s.store.lease_key(&k);
    assert_eq!(
        s.cli(&["GET", &lease_key]).await,
        format!("{}:{}", a.to_hex(), f1)
    );
    let pttl: i64 = s.cli(&["PTTL", &lease_key]).await.parse().unwrap();
    assert!(pttl > 0 && pttl <= 5000, "{pttl}");
    // Same owner: same fence, TTL extended.
    assert_eq!(fence_of(&*s.store, &k, &a).await, f1);
    assert_eq!(
        s.store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::Released
    );
    let mut last = f1;
    for _ in 0..50 {
        let o = OwnerToken::random();
        let f = fence_of(&*s.store, &k, &o).await;
        assert!(f > last, "{f} after {last}");
        last = f;
        s.store.release(&k, &o).await.unwrap();
    }
    // A fence key ahead of the clock wins: last + 1.
    s.cli(&["SET", &fence_key, "9000000000000000"]).await;
    let o = OwnerToken::random();
    assert_eq!(
        fence_of(&*s.store, &k, &o).await,
        Fence(9_000_000_000_000_001)
    );
}

/// Checks that `op` on a lease whose Redis data was replaced by a foreign value fails with
/// `Corrupt` and leaves the value alone.
async fn assert_all_ops_corrupt(s: &Standalone, k: &Key, what: &str) {
    let o = OwnerToken::random();
    let e = s.store.acquire(k, &o, TTL).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{what}: acquire: {e}");
    assert_eq!(e.action(), Action::Investigate);
    let e = s.store.renew(k, &o, TTL).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{what}: renew: {e}");
    let e = s.store.release(k, &o).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{what}: release: {e}");
    let e = s.store.inspect(k).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{what}: inspect: {e}");
    let e = s.store.break_lease(k).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{what}: break: {e}");
    // Through the lease client: a typed error, not "held", not retried until the wait ends.
    let client = LeaseClient::new(s.store.clone(), LeaseConfig::new(TTL).unwrap());
    let started = Instant::now();
    match client.acquire(k, Duration::from_secs(10)).await {
        Err(Error::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{what}: {e}"),
        other => panic!("{what}: expected a Corrupt store error, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{what}: retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_type_at_the_lease_key_is_corrupt_and_untouched() {
    let s = Standalone::start().await;
    let k = key("job:wrongtype");
    let lk = s.store.lease_key(&k);
    // `SET NX` on a list answers nil; leasehold must not mistake the key for free or held.
    s.cli(&["RPUSH", &lk, "someone", "else's", "list"]).await;
    assert_all_ops_corrupt(&s, &k, "list").await;
    assert_eq!(s.cli(&["TYPE", &lk]).await, "list");
    assert_eq!(s.cli(&["LLEN", &lk]).await, "3");
    s.cli(&["DEL", &lk]).await;
    s.cli(&["HSET", &lk, "f", "v"]).await;
    assert_all_ops_corrupt(&s, &k, "hash").await;
    assert_eq!(s.cli(&["TYPE", &lk]).await, "hash");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_lease_values_are_corrupt_and_untouched() {
    let s = Standalone::start().await;
    let hex = OwnerToken::random().to_hex();
    let bad = [
        "garbage".to_owned(),
        String::new(),
        hex.clone(),
        format!("{hex}:"),
        format!("{hex}:0"),
        format!("{hex}:-5"),
        format!("{hex}:007"),
        format!("{hex}:1.5"),
        format!("{hex}:5:extra"),
        format!("{}:5", hex.to_uppercase()),
        format!("{}:5", &hex[..31]),
        format!("{hex}0:5"),
        format!("{hex}:99999999999999999"),
        format!("{hex}:9007199254740992"),
    ];
    for (i, v) in bad.iter().enumerate() {
        let k = key(&format!("job:corrupt-{i}"));
        let lk = s.store.lease_key(&k);
        s.cli(&["SET", &lk, v, "PX", "60000"]).await;
        assert_all_ops_corrupt(&s, &k, &format!("value {v:?}")).await;
        assert_eq!(s.cli(&["GET", &lk]).await, *v, "value was overwritten");
    }
    // A well-formed value without an expiry would never free itself: corrupt too (but its
    // owner may still renew, which sets an expiry).
    let k = key("job:no-expiry");
    let lk = s.store.lease_key(&k);
    s.cli(&["SET", &lk, &format!("{hex}:5")]).await;
    let o = OwnerToken::random();
    let e = s.store.acquire(&k, &o, TTL).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
    let e = s.store.inspect(&k).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
    assert_eq!(s.cli(&["PTTL", &lk]).await, "-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_fence_key_is_corrupt_and_untouched() {
    let s = Standalone::start().await;
    for (i, v) in ["abc", "0", "-5", "1.5", "01", "9007199254740992", " 7"]
        .iter()
        .enumerate()
    {
        let k = key(&format!("job:fence-{i}"));
        let fk = s.store.fence_key(&k);
        s.cli(&["SET", &fk, v]).await;
        let e = s
            .store
            .acquire(&k, &OwnerToken::random(), TTL)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Corrupt, "fence {v:?}: {e}");
        let e = s.store.break_lease(&k).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Corrupt, "fence {v:?}: {e}");
        assert_eq!(s.cli(&["GET", &fk]).await, *v);
        assert_eq!(
            s.store.inspect(&k).await.unwrap(),
            None,
            "no lease was created"
        );
    }
    let k = key("job:fence-list");
    let fk = s.store.fence_key(&k);
    s.cli(&["RPUSH", &fk, "x"]).await;
    let e = s
        .store
        .acquire(&k, &OwnerToken::random(), TTL)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
    assert_eq!(s.cli(&["TYPE", &fk]).await, "list");
    assert_eq!(s.cli(&["EXISTS", &s.store.lease_key(&k)]).await, "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_script_flush() {
    let s = Standalone::start().await;
    let k = key("job:noscript");
    let o = OwnerToken::random();
    let f = fence_of(&*s.store, &k, &o).await;
    assert_eq!(s.cli(&["SCRIPT", "FLUSH"]).await, "OK");
    assert_eq!(
        s.store.renew(&k, &o, TTL).await.unwrap(),
        RenewOutcome::Renewed { ttl: TTL }
    );
    s.cli(&["SCRIPT", "FLUSH"]).await;
    assert_eq!(s.store.inspect(&k).await.unwrap().unwrap().fence, f);
    s.cli(&["SCRIPT", "FLUSH"]).await;
    assert_eq!(
        s.store.release(&k, &o).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_finds_only_leases_under_the_prefix() {
    let s = Standalone::start().await;
    let mut held = Vec::new();
    for name in ["job:a", "job:b{x}", "job:*glob?", "other:c"] {
        let k = key(name);
        let o = OwnerToken::random();
        let f = fence_of(&*s.store, &k, &o).await;
        held.push((k, o, f));
    }
    // Foreign keys in the namespace are ignored, not misparsed.
    s.cli(&["SET", "leasehold:{job:%zz}", "x"]).await;
    s.cli(&["SET", "leasehold:{job:foreign", "x"]).await;
    let list = s.store.list("job:").await.unwrap();
    let keys: Vec<&str> = list.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["job:*glob?", "job:a", "job:b{x}"]);
    for info in &list {
        let (_, o, f) = held.iter().find(|(k, _, _)| *k == info.key).unwrap();
        assert_eq!((info.owner, info.fence), (*o, *f));
        assert!(info.remaining.unwrap() <= TTL);
    }
    // A glob character in the prefix is literal.
    let list = s.store.list("job:*").await.unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(s.store.list("").await.unwrap().len(), 4);
    assert!(s.store.list("nothing:").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_advances_the_fence_and_frees_the_key() {
    let s = Standalone::start().await;
    let k = key("job:break");
    // Breaking a free key still advances the fence (stale holders of older grants lose).
    let f0 = s.store.break_lease(&k).await.unwrap();
    let o = OwnerToken::random();
    let f1 = fence_of(&*s.store, &k, &o).await;
    assert!(f1 > f0);
    let f2 = s.store.break_lease(&k).await.unwrap();
    assert!(f2 > f1);
    assert_eq!(s.store.inspect(&k).await.unwrap(), None);
    assert_eq!(
        s.store.renew(&k, &o, TTL).await.unwrap(),
        RenewOutcome::NotOwner
    );
    assert_eq!(
        s.store.release(&k, &o).await.unwrap(),
        ReleaseOutcome::NotOwner
    );
    assert!(fence_of(&*s.store, &k, &OwnerToken::random()).await > f2);
}

/// `wait_released` as a queue: returns at once on a free key; waiters are handed the
/// lease one at a time, in arrival order, each by a reservation (a new fence) that it
/// confirms with an acquire of its own; nobody else gets past a reservation; a waiter
/// that never confirms holds the queue up for the grace only; a lease that expires wakes
/// its waiters at the expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_released_hands_the_lease_to_waiters_in_arrival_order() {
    let s = Standalone::start().await;
    let k = key("job:wait");
    // Free: returns at once.
    let started = Instant::now();
    s.store
        .wait_released(&k, &OwnerToken::random(), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    // Held: four waiters, arriving in order.
    let o = OwnerToken::random();
    let mut last = fence_of(&*s.store, &k, &o).await;
    let owners: Vec<OwnerToken> = (0..4).map(|_| OwnerToken::random()).collect();
    let mut waiters = Vec::new();
    for w in &owners {
        let (store, k, w) = (s.store.clone(), k.clone(), *w);
        waiters.push(tokio::spawn(async move {
            store
                .wait_released(&k, &w, Duration::from_secs(30))
                .await
                .unwrap();
            Instant::now()
        }));
        sleep(Duration::from_millis(100)).await;
    }
    sleep(Duration::from_millis(200)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()));
    let mut holder = o;
    for (i, w) in owners.iter().enumerate() {
        let released_at = Instant::now();
        assert_eq!(
            s.store.release(&k, &holder).await.unwrap(),
            ReleaseOutcome::Released
        );
        let woke = timeout(Duration::from_secs(3), &mut waiters[i])
            .await
            .expect("the first waiter is woken by the release")
            .unwrap();
        assert!(woke >= released_at);
        sleep(Duration::from_millis(100)).await;
        for later in &waiters[i + 1..] {
            assert!(!later.is_finished(), "a waiter behind was woken too");
        }
        // Reserved for the waiter: a newcomer is turned away...
        let info = s.store.inspect(&k).await.unwrap().expect("reserved");
        assert_eq!(info.owner, *w, "reserved for the waiter first in line");
        assert!(info.fence > last, "a reservation carries a new fence");
        match s
            .store
            .acquire(&k, &OwnerToken::random(), TTL)
            .await
            .unwrap()
        {
            AcquireOutcome::Held { .. } => {}
            other => panic!("a newcomer got past the reservation: {other:?}"),
        }
        // ... and the waiter confirms it with its own request: the reserved fence.
        let f = fence_of(&*s.store, &k, w).await;
        assert_eq!(f, info.fence);
        last = f;
        holder = *w;
    }
    assert!(s.store.release(&k, &holder).await.unwrap() == ReleaseOutcome::Released);

    // A waiter that never confirms: the next one gets the lease once the grace (1 s) is
    // over, told it is next by the reservation's message, not at the holder's expiry.
    let o = OwnerToken::random();
    s.store
        .acquire(&k, &o, Duration::from_secs(20))
        .await
        .unwrap();
    let (gone, next) = (OwnerToken::random(), OwnerToken::random());
    let gone_wait = {
        let (store, k) = (s.store.clone(), k.clone());
        tokio::spawn(async move {
            store
                .wait_released(&k, &gone, Duration::from_secs(30))
                .await
        })
    };
    sleep(Duration::from_millis(100)).await;
    let next_wait = {
        let (store, k) = (s.store.clone(), k.clone());
        tokio::spawn(async move {
            store
                .wait_released(&k, &next, Duration::from_secs(30))
                .await
        })
    };
    sleep(Duration::from_millis(200)).await;
    let released_at = Instant::now();
    s.store.release(&k, &o).await.unwrap();
    timeout(Duration::from_secs(3), gone_wait)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // `gone` does not confirm.
    timeout(Duration::from_secs(5), next_wait)
        .await
        .expect("the next waiter re-checks when the reservation lapses")
        .unwrap()
        .unwrap();
    let waited = released_at.elapsed();
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    let f = fence_of(&*s.store, &k, &next).await;
    assert!(f > last);
    s.store.release(&k, &next).await.unwrap();

    // Held, never released: wakes at the holder's expiry.
    let o = OwnerToken::random();
    s.store
        .acquire(&k, &o, Duration::from_millis(600))
        .await
        .unwrap();
    let started = Instant::now();
    s.store
        .wait_released(&k, &OwnerToken::random(), Duration::from_secs(30))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    // The channel is unsubscribed once nobody waits (checked on the server).
    sleep(Duration::from_millis(200)).await;
    assert_eq!(
        s.cli(&["PUBSUB", "NUMSUB", "leasehold:{job:wait}:released"])
            .await
            .lines()
            .nth(1),
        Some("0")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_off_means_wait_released_is_unsupported() {
    let s = Standalone::start_with(leasehold_testkit::RedisOptions::new(), |b| {
        b.notifications(false)
    })
    .await;
    assert!(s.store.waiter().is_none() && s.store.watcher().is_none());
    let e = s
        .store
        .wait_released(&key("job:x"), &OwnerToken::random(), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unsupported);
    // Waiting acquisitions still work (by backoff).
    let client = LeaseClient::new(s.store.clone(), LeaseConfig::new(TTL).unwrap());
    let a = client.try_acquire("job:x").await.unwrap();
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move { client.acquire("job:x", Duration::from_secs(10)).await })
    };
    sleep(Duration::from_millis(200)).await;
    assert!(a.release().await.unwrap());
    let b = timeout(Duration::from_secs(8), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_open_through_the_registry_with_prefix_and_db() {
    let s = Standalone::start().await;
    let mut registry = leasehold_core::Registry::new();
    registry.register(Arc::new(RedisFactory));
    let url = format!(
        "redis://127.0.0.1:{}/3?prefix=app%3Aleases%3A&timeout=1s",
        s.server.port()
    );
    let store = registry.open(&url).await.unwrap();
    assert_eq!(store.backend(), "redis");
    let k = key("job:url");
    let o = OwnerToken::random();
    fence_of(&*store, &k, &o).await;
    // In database 3, under the prefix.
    assert_eq!(
        s.cli(&["-n", "3", "EXISTS", "app:leases:{job:url}"]).await,
        "1"
    );
    assert_eq!(
        s.cli(&["-n", "3", "EXISTS", "app:leases:{job:url}:fence"])
            .await,
        "1"
    );
    assert_eq!(s.cli(&["EXISTS", "app:leases:{job:url}"]).await, "0");
    // Config Display round-trips through the URL parser.
    let cfg = RedisConfig::from_url(&url).unwrap();
    assert_eq!(RedisConfig::from_url(&cfg.to_string()).unwrap(), cfg);
    // Bad URLs and unreachable servers: typed errors, quickly.
    let e = registry
        .open(&format!(
            "redis://127.0.0.1:{}/?prefix=%7Bx",
            s.server.port()
        ))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let closed = leasehold_testkit::free_port();
    let started = Instant::now();
    let e = registry
        .open(&format!("redis://127.0.0.1:{closed}/"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
    assert!(e.is_retryable());
    assert!(started.elapsed() < Duration::from_secs(3));
    // A store opened lazily reports the same at its first operation.
    let lazy =
        RedisStore::new(RedisConfig::from_url(&format!("redis://127.0.0.1:{closed}/")).unwrap())
            .unwrap();
    let e = lazy.inspect(&k).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_share_one_connection() {
    let s = Standalone::start().await;
    let client = LeaseClient::new(s.store.clone(), LeaseConfig::new(TTL).unwrap());
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                for j in 0..10 {
                    let lease = client
                        .try_acquire(format!("job:many-{i}-{j}"))
                        .await
                        .unwrap();
                    assert!(lease.release().await.unwrap());
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(s.proxy.connections(), 1, "one multiplexed connection");
}

/// Issue 14.5: fence records do not pile up. A grant (and a break) writes the key's fence
/// record with an expiry of the lease's TTL plus the retention (7 days by default); once
/// the record is gone the next grant's fence, floored at the server clock, is still above
/// every fence issued before. `fence_retention=forever` keeps the old behaviour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_records_expire_after_their_retention_and_fences_still_rise() {
    async fn pttl(s: &Standalone, name: String) -> i64 {
        s.cli(&["PTTL", &name]).await.trim().parse().unwrap()
    }
    // The default: a week after the grant.
    let s = Standalone::start().await;
    let k = key("job:retained");
    let fk = format!("{}:fence", s.store.lease_key(&k));
    let o = OwnerToken::random();
    fence_of(&*s.store, &k, &o).await;
    let week = 7 * 24 * 3600 * 1000;
    let left = pttl(&s, fk.clone()).await;
    assert!(
        left > week && left <= week + TTL.as_millis() as i64,
        "the fence record expires in {left} ms, not a week after the lease's TTL"
    );
    // Forever, on request.
    let s = Standalone::start_with(leasehold_testkit::RedisOptions::new(), |b| {
        b.fence_retention(None)
    })
    .await;
    fence_of(&*s.store, &k, &o).await;
    assert_eq!(pttl(&s, fk.clone()).await, -1, "fence_retention=forever");
    // A short retention: the record goes, the fences still rise (a grant, then a break).
    let s = Standalone::start_with(leasehold_testkit::RedisOptions::new(), |b| {
        b.fence_retention(Some(Duration::from_secs(1)))
    })
    .await;
    let short = Duration::from_millis(200);
    let mut last = Fence(0);
    for round in 0..2 {
        let got = match s.store.acquire(&k, &o, short).await.unwrap() {
            AcquireOutcome::Acquired { fence, .. } => fence,
            other => panic!("{other:?}"),
        };
        assert!(got > last, "round {round}: fence {got:?} after {last:?}");
        last = got;
        assert_eq!(
            s.store.release(&k, &o).await.unwrap(),
            ReleaseOutcome::Released
        );
        let gone = Instant::now() + Duration::from_secs(5);
        while pttl(&s, fk.clone()).await != -2 {
            assert!(Instant::now() < gone, "the fence record did not expire");
            sleep(Duration::from_millis(100)).await;
        }
    }
    let broken = s.store.break_lease(&k).await.unwrap();
    assert!(
        broken > last,
        "break after expiry: {broken:?} after {last:?}"
    );
    let left = pttl(&s, fk).await;
    assert!(
        (0..=1000).contains(&left),
        "a break writes the record with the retention too ({left} ms)"
    );
    // Bad values are refused, not clamped.
    for bad in [
        "fence_retention=0",
        "fence_retention=500ms",
        "fence_retention=4000d",
    ] {
        let url = format!("redis://127.0.0.1:1/?{bad}");
        let e = RedisConfig::from_url(&url).unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config, "{bad}: {e}");
    }
    for good in ["fence_retention=forever", "fence_retention=1d"] {
        let url = format!("redis://127.0.0.1:1/?{good}");
        let cfg = RedisConfig::from_url(&url).unwrap();
        let again = RedisConfig::from_url(&cfg.to_string().replace("<redacted>", "x")).unwrap();
        assert_eq!(again.fence_retention(), cfg.fence_retention(), "{good}");
    }
}

/// The concurrent acquires and releases of one store go out in batches — far fewer script
/// calls than operations — and each operation answers as its own call would, whatever
/// else is in its batch: grants with their own fences, `Held` for a held key, `NotOwner`
/// for a stranger's release, `Corrupt` for a key that holds something else, and the held
/// lease untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_operations_are_batched_and_each_answered_on_its_own() {
    let s = Standalone::start().await;
    let corrupt = key("batch:corrupt");
    s.cli(&["SET", &s.store.lease_key(&corrupt), "not a lease"])
        .await;
    let held = key("batch:held");
    let holder = OwnerToken::random();
    let held_fence = fence_of(&*s.store, &held, &holder).await;
    let before = s.evalsha_calls().await;
    const N: usize = 400;
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let (store, corrupt, held) = (s.store.clone(), corrupt.clone(), held.clone());
            tokio::spawn(async move {
                let me = OwnerToken::random();
                match i % 4 {
                    0 => {
                        let k = key(&format!("batch:{i}"));
                        let f = match store.acquire(&k, &me, TTL).await.unwrap() {
                            AcquireOutcome::Acquired { fence, .. } => fence,
                            other => panic!("a free key: {other:?}"),
                        };
                        assert!(f.get() > 0);
                        assert_eq!(
                            store.release(&k, &me).await.unwrap(),
                            ReleaseOutcome::Released
                        );
                        2
                    }
                    1 => {
                        match store.acquire(&held, &me, TTL).await.unwrap() {
                            AcquireOutcome::Held { remaining } => {
                                assert!(remaining.is_some_and(|r| r > Duration::ZERO))
                            }
                            other => panic!("a held key: {other:?}"),
                        }
                        1
                    }
                    2 => {
                        assert_eq!(
                            store.release(&held, &me).await.unwrap(),
                            ReleaseOutcome::NotOwner
                        );
                        1
                    }
                    _ => {
                        let e = store.acquire(&corrupt, &me, TTL).await.unwrap_err();
                        assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
                        1
                    }
                }
            })
        })
        .collect();
    let mut ops = 0u64;
    for t in tasks {
        ops += t.await.unwrap();
    }
    let calls = s.evalsha_calls().await - before;
    assert!(
        calls * 2 < ops,
        "{calls} script calls for {ops} operations: not batched"
    );
    let info = s.store.inspect(&held).await.unwrap().expect("still held");
    assert_eq!((info.owner, info.fence), (holder, held_fence));
    assert_eq!(
        s.cli(&["GET", &s.store.lease_key(&corrupt)]).await,
        "not a lease"
    );
}

/// With `batch=false` every acquire and release is a script call of its own: as many
/// calls as operations, however many run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_batching_off_each_operation_is_its_own_call() {
    let s =
        Standalone::start_with(leasehold_testkit::RedisOptions::new(), |b| b.batch(false)).await;
    // The scripts loaded first (a first call answered NOSCRIPT is sent again).
    let (warm, me) = (key("nobatch:warm"), OwnerToken::random());
    fence_of(&*s.store, &warm, &me).await;
    s.store.release(&warm, &me).await.unwrap();
    let before = s.evalsha_calls().await;
    const N: usize = 200;
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            let store = s.store.clone();
            tokio::spawn(async move {
                let (k, me) = (key(&format!("nobatch:{i}")), OwnerToken::random());
                assert!(matches!(
                    store.acquire(&k, &me, TTL).await.unwrap(),
                    AcquireOutcome::Acquired { .. }
                ));
                assert_eq!(
                    store.release(&k, &me).await.unwrap(),
                    ReleaseOutcome::Released
                );
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let calls = s.evalsha_calls().await - before;
    assert_eq!(calls, 2 * N as u64, "one script call per operation");
}

/// Records: one string `<fence>:<value>` at `p{e}:record`, no expiry, apart from the
/// lease of the same name; fences compared exactly above 2^53 (where Lua's doubles would
/// take 2^53 and 2^53 + 1 for equal) up to `u64::MAX`; a value over the limit refused
/// before sending; foreign data at the record key `Corrupt` (a newer format `Config`) and
/// left untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_fence_colon_value_exact_and_foreign_data_is_corrupt() {
    let s = Standalone::start().await;
    let store = &s.store;
    let k = key("election/records");
    let rk = store.record_key(&k);
    assert!(rk.ends_with("}:record"), "{rk}");
    let kr = &k;
    let put = |fence: u64, value: &'static [u8]| async move {
        store
            .put_record(kr, Fence(fence), value)
            .await
            .unwrap_or_else(|e| panic!("put {fence}: {e}"))
    };
    let two53 = 1u64 << 53;
    assert_eq!(put(two53, b"a").await.value, b"a");
    assert_eq!(s.cli(&["GET", &rk]).await, format!("{two53}:a"));
    assert_eq!(s.cli(&["PTTL", &rk]).await, "-1", "records never expire");
    let r = put(two53 + 1, b"b").await;
    assert_eq!((r.fence, r.value.as_slice()), (Fence(two53 + 1), &b"b"[..]));
    let r = put(two53, b"c").await;
    assert_eq!(r.fence, Fence(two53 + 1), "2^53 is below 2^53 + 1");
    let r = put(10_000_000_000_000_000_000, b"d").await;
    assert_eq!(r.value, b"d", "20 digits above 17");
    let r = put(9_999_999_999_999_999_999, b"e").await;
    assert_eq!(r.value, b"d", "same length, compared digit by digit");
    let r = put(u64::MAX, b"max").await;
    assert_eq!(
        (r.fence, r.value.as_slice()),
        (Fence(u64::MAX), &b"max"[..])
    );
    assert_eq!(put(u64::MAX, b"again").await.value, b"max");
    assert_eq!(
        store.get_record(&k).await.unwrap().map(|r| r.fence),
        Some(Fence(u64::MAX))
    );
    // Leases and records are apart: a lease on the same name, listed without the record.
    let o = OwnerToken::random();
    let f = fence_of(&**store, &k, &o).await;
    assert!(f < Fence(u64::MAX));
    let listed = store.list("election/").await.unwrap();
    assert_eq!(listed.iter().map(|l| &l.key).collect::<Vec<_>>(), [&k]);
    store.release(&k, &o).await.unwrap();
    assert_eq!(
        store.get_record(&k).await.unwrap().map(|r| r.value),
        Some(b"max".to_vec())
    );
    // Too long: refused before anything is sent.
    let long = vec![b'x'; leasehold_core::MAX_RECORD_LEN + 1];
    let e = store.put_record(&k, Fence(1), &long).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "{e}");

    // Foreign data at a record key.
    for (i, v) in [
        "garbage",
        "",
        ":x",
        "01:x",
        "-1:x",
        "1.5:x",
        "18446744073709551616:x",
        "99999999999999999999:x",
    ]
    .iter()
    .enumerate()
    {
        let k = key(&format!("election/corrupt-{i}"));
        let rk = store.record_key(&k);
        s.cli(&["SET", &rk, v]).await;
        let e = store.get_record(&k).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{v:?}: {e}");
        let e = store
            .put_record(&k, Fence(u64::MAX), b"x")
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{v:?}: {e}");
        assert_eq!(s.cli(&["GET", &rk]).await, *v, "overwritten");
    }
    let k = key("election/list");
    let rk = store.record_key(&k);
    s.cli(&["RPUSH", &rk, "x"]).await;
    let e = store.put_record(&k, Fence(5), b"x").await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
    assert_eq!(s.cli(&["TYPE", &rk]).await, "list");
    let k = key("election/newer");
    let rk = store.record_key(&k);
    s.cli(&["SET", &rk, "v2|5:x"]).await;
    let e = store.get_record(&k).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(e.to_string().contains("upgrade"), "{e}");
    let e = store.put_record(&k, Fence(9), b"y").await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_eq!(s.cli(&["GET", &rk]).await, "v2|5:x");
}

/// `acquire_any` of `keys` as `owner`: the index and fence granted.
async fn any_of(store: &dyn Store, keys: &[Key], owner: &OwnerToken) -> (usize, Fence) {
    match leasehold_core::acquire_any(store, keys, owner, TTL)
        .await
        .unwrap()
    {
        AcquireAnyOutcome::Acquired { index, fence, .. } => (index, fence),
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_is_one_acquire_script_call_on_one_server() {
    let s = Standalone::start().await;
    assert!(s.store.atomic_acquire_any());
    let cfg = LeaseConfig::new(Duration::from_secs(30)).unwrap();
    let client = LeaseClient::new(s.store.clone(), cfg);
    const N: u32 = 8;
    let sem = client.semaphore("export:one-call", N).unwrap();
    // Scripts loaded, permit count stored.
    sem.try_acquire().await.unwrap().release().await.unwrap();
    // Seven of the eight slots held by someone else: trying them one by one would be up
    // to eight acquires.
    let other = OwnerToken::random();
    for slot in 0..N - 1 {
        fence_of(&*s.store, sem.slot_key(slot).unwrap(), &other).await;
    }
    let before = s.evalsha_calls().await;
    let p = sem.try_acquire().await.unwrap();
    let calls = s.evalsha_calls().await - before;
    assert_eq!(p.slot(), N - 1, "the one free slot");
    assert_eq!(
        calls, 3,
        "a permit is one acquire script call (the permit-count check and the acquire), then \
         the two reads of the name's kind once it is granted (the lease NAME, the record \
         election/NAME)"
    );
    // All held: one call answers with the shortest remaining TTL.
    let before = s.evalsha_calls().await;
    let err = sem.try_acquire().await.unwrap_err();
    assert!(matches!(err, Error::WaitTimeout { .. }), "{err}");
    assert_eq!(s.evalsha_calls().await - before, 1);
    p.release().await.unwrap();
    // The record lost and taken by a caller with another N (a server restarted without
    // persistence): the same one call refuses, and takes no slot.
    let record = s
        .store
        .record_key(&Key::new("semaphore/export:one-call").unwrap());
    assert_eq!(s.cli(&["GET", &record]).await, "0:8");
    s.cli(&["SET", &record, "0:3"]).await;
    let before = s.evalsha_calls().await;
    let err = sem.try_acquire().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::PermitsMismatch {
                stored: 3,
                asked: 8,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(s.evalsha_calls().await - before, 1);
    let free = sem.slot_key(N - 1).unwrap();
    assert_eq!(s.store.inspect(free).await.unwrap(), None, "no slot taken");
    // Absent, the record is written by the acquire that needs it.
    s.cli(&["DEL", &record]).await;
    sem.try_acquire().await.unwrap().release().await.unwrap();
    assert_eq!(s.cli(&["GET", &record]).await, "0:8");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_any_script_keeps_acquire_semantics_per_key() {
    let s = Standalone::start().await;
    let keys: Vec<Key> = (0..3).map(|i| key(&format!("any:sem#{i}"))).collect();
    let (me, other) = (OwnerToken::random(), OwnerToken::random());
    // The first free key in order, fence floored at the server clock like `acquire`.
    let f0 = fence_of(&*s.store, &keys[0], &other).await;
    let before = server_time_us(&s).await;
    let (i, f1) = any_of(&*s.store, &keys, &me).await;
    assert_eq!(i, 1, "key 0 is held: the first free one in order");
    assert!(f1.get() >= before, "fence floored at the server clock");
    assert_eq!(
        s.cli(&["GET", &s.store.lease_key(&keys[1])]).await,
        format!("{}:{f1}", me.to_hex()),
        "the same lease value as `acquire` writes"
    );
    assert_eq!(
        s.cli(&["GET", &s.store.fence_key(&keys[1])]).await,
        f1.to_string()
    );
    // Key 0 freed: the owner's key 1 is still the answer, extended, with its fence.
    assert_eq!(
        s.store.release(&keys[0], &other).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(any_of(&*s.store, &keys, &me).await, (1, f1));
    assert_eq!(s.store.inspect(&keys[0]).await.unwrap(), None, "not taken");
    // All held: the shortest remaining TTL.
    fence_of(&*s.store, &keys[0], &other).await;
    let short = OwnerToken::random();
    s.store
        .acquire(&keys[2], &short, Duration::from_millis(1500))
        .await
        .unwrap();
    match s
        .store
        .acquire_any(&keys, &OwnerToken::random(), TTL)
        .await
        .unwrap()
    {
        AcquireAnyOutcome::Held { remaining: Some(r) } => {
            assert!(r <= Duration::from_millis(1500), "{r:?}")
        }
        other => panic!("all held: {other:?}"),
    }
    // A key reserved for a queued waiter: a newcomer is turned away from it as by
    // `acquire`, and the waiter's `acquire_any` confirms its reservation (same fence).
    let waiter = OwnerToken::random();
    let wait = {
        let (store, k) = (s.store.clone(), keys[0].clone());
        tokio::spawn(async move {
            store
                .wait_released(&k, &waiter, Duration::from_secs(30))
                .await
        })
    };
    sleep(Duration::from_millis(200)).await;
    assert!(!wait.is_finished(), "queued behind the holder");
    s.store.release(&keys[0], &other).await.unwrap();
    timeout(Duration::from_secs(3), wait)
        .await
        .expect("woken")
        .unwrap()
        .unwrap();
    let reserved = s.store.inspect(&keys[0]).await.unwrap().expect("reserved");
    assert_eq!(reserved.owner, waiter);
    assert!(reserved.fence > f0, "a reservation carries a new fence");
    s.store.release(&keys[1], &me).await.unwrap();
    let newcomer = OwnerToken::random();
    assert_eq!(
        any_of(&*s.store, &keys, &newcomer).await.0,
        1,
        "the reserved key is skipped, the next free one granted"
    );
    assert_eq!(
        any_of(&*s.store, &keys, &waiter).await,
        (0, reserved.fence),
        "the waiter takes its reservation"
    );
    // Foreign data at a key is reported when the search in order reaches it, as by
    // `acquire`, and is left untouched.
    let corrupt = vec![key("any:bad#0"), key("any:bad#1")];
    s.cli(&["SET", &s.store.lease_key(&corrupt[0]), "not a lease"])
        .await;
    let err = s.store.acquire_any(&corrupt, &me, TTL).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{err}");
    assert_eq!(
        s.cli(&["GET", &s.store.lease_key(&corrupt[0])]).await,
        "not a lease"
    );
}
