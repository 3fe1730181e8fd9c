//! Redis with a replica behind Sentinel (issue 16 items 1–3, docs/faults.md row 11), against a
//! private primary, replica and three sentinels:
//!
//! - `redis+sentinel://` finds the primary through the sentinels, follows a fail-over
//!   (the demoted server answers `READONLY`, the store asks the sentinels again) and keeps
//!   no stale primary;
//! - `min_replicas=1`: every write waits for the replica; a grant the replica did not take
//!   in time is never reported (the call fails closed, ambiguous), and a lease granted that
//!   way survives a fail-over with its owner and fence;
//! - without it, a fail-over to a replica that missed the grant breaks exclusion (a second
//!   holder is let in while the first still believes it holds the lease), but the fence
//!   still rises (the clock floor), so the guard refuses the first holder's writes.
//!
//! Fail-overs are forced (`SENTINEL FAILOVER`); the sentinels' own failure detection is
//! slow on purpose (60 s) so that a paused server does not start one by itself.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::WatchStore;
use leasehold_core::guard::GuardDecision;
use leasehold_core::{
    AcquireOutcome, Fence, Key, LeaseClient, LeaseConfig, OwnerToken, RenewOutcome, ResourceName,
    Store, StoreErrorKind,
};
use leasehold_redis::{NodeAddr, RedisConfig, RedisConfigBuilder, RedisStore};
use leasehold_sqlite::guard;
use leasehold_sqlite::sqlx::{self, Connection};
use leasehold_testkit::proof::{Backend, Fault, proves};
use leasehold_testkit::{FakeWallClock, FaultProxy, ProxyMode, RedisSentinelSet};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(30);

async fn start(name: &'static str) -> Arc<RedisSentinelSet> {
    Arc::new(
        tokio::task::spawn_blocking(move || RedisSentinelSet::start(name))
            .await
            .unwrap(),
    )
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

async fn open(set: &RedisSentinelSet, params: &str) -> RedisStore {
    let url = format!("{}?timeout=3s&connect_timeout=2s{params}", set.url());
    RedisStore::open(&url).await.unwrap()
}

/// Acquires, retrying retryable errors (a fail-over in progress) for up to 20 s.
async fn acquire(store: &RedisStore, k: &Key, o: &OwnerToken) -> AcquireOutcome {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match store.acquire(k, o, TTL).await {
            Ok(r) => return r,
            Err(e) if e.is_retryable() && Instant::now() < end => {
                sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("acquire {k}: {e}"),
        }
    }
}

fn fence(o: AcquireOutcome) -> Fence {
    match o {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn sentinel_urls_parse_and_refuse_bad_input() {
    let c =
        RedisConfig::from_url("redis+sentinel://:pw@a:1,b:2/mymaster?min_replicas=1&db=2").unwrap();
    assert_eq!(c.min_replicas(), 1);
    assert_eq!(c.db(), 2);
    let shown = c.to_string();
    assert!(
        !shown.contains("pw") && shown.starts_with("redis+sentinel://"),
        "{shown}"
    );
    assert_eq!(
        RedisConfig::from_url(&shown.replace("<redacted>", "pw")).unwrap(),
        c
    );
    assert!(!format!("{c:?}").contains("pw"));
    for bad in [
        "redis+sentinel://a:1/",
        "redis+sentinel://a:1",
        "redis+sentinel://a:1/my%20master",
        "rediss+sentinel://a:1/m#insecure",
        "redis+sentinel://a:1/m?min_replicas=17",
        "redis+sentinel://a:1/m?min_replicas=-1",
        "redis+cluster://a:1/?min_replicas=1",
        "redis+sentinel://a:0/m",
    ] {
        let e = RedisConfig::from_url(bad).unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config, "{bad}: {e}");
    }
    let long = format!("redis+sentinel://a:1/{}", "m".repeat(200));
    assert!(RedisConfig::from_url(&long).is_err());
}

/// The store finds the primary through the sentinels, and after a fail-over writes to the
/// new primary (the old one, now a replica, answers `READONLY` and is dropped); a lease
/// the replica had taken keeps its owner and fence; fences keep rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_failover_to_the_new_primary() {
    let _proof = proves(Backend::Redis, Fault::FailOver);
    let set = start("follow").await;
    // The periodic re-check of the primary (`policy_check`) is out of the picture: the
    // store must move at once, on `READONLY` or the sentinels' `+switch-master`.
    let store = open(&set, "&policy_check=60s").await;
    let first = set.primary_port();
    let k = Key::new("job:sentinel").unwrap();
    let o = OwnerToken::random();
    let f1 = fence(acquire(&store, &k, &o).await);
    // The grant is on the primary the sentinels name.
    let lease_key = store.lease_key(&k);
    let on_primary = {
        let (set, lk) = (set.clone(), lease_key.clone());
        blocking(move || set.server_on(first).cli(&["GET", &lk])).await
    };
    assert_eq!(on_primary, format!("{}:{f1}", o.to_hex()));
    // Let the replica take it, then fail over.
    {
        let (set, lk) = (set.clone(), lease_key.clone());
        blocking(move || {
            let end = std::time::Instant::now() + Duration::from_secs(10);
            while set.replica().cli(&["EXISTS", &lk]) != "1" {
                assert!(
                    std::time::Instant::now() < end,
                    "the replica never got the lease"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .await;
    }
    let second = {
        let set = set.clone();
        blocking(move || set.failover()).await
    };
    assert_ne!(first, second);
    // The same lease, renewed on the new primary within moments (after at most a
    // retryable error).
    let end = Instant::now() + Duration::from_secs(3);
    loop {
        match store.renew(&k, &o, TTL).await {
            Ok(RenewOutcome::Renewed { .. }) => break,
            Err(e) if e.is_retryable() && Instant::now() < end => {
                sleep(Duration::from_millis(100)).await
            }
            other => panic!("renew after the fail-over: {other:?}"),
        }
    }
    let info = store.inspect(&k).await.unwrap().expect("still held");
    assert_eq!((info.owner, info.fence), (o, f1));
    let on_new = {
        let (set, lk) = (set.clone(), lease_key.clone());
        blocking(move || set.server_on(second).cli(&["GET", &lk])).await
    };
    assert_eq!(on_new, format!("{}:{f1}", o.to_hex()));
    // New grants go to the new primary, with higher fences.
    let k2 = Key::new("job:sentinel-2").unwrap();
    let f2 = fence(acquire(&store, &k2, &OwnerToken::random()).await);
    assert!(f2 > f1);
    let lk2 = store.lease_key(&k2);
    let (set2, lk2b) = (set.clone(), lk2.clone());
    let (old_has, new_has) = blocking(move || {
        (
            set2.server_on(first).cli(&["EXISTS", &lk2b]),
            set2.server_on(second).cli(&["EXISTS", &lk2b]),
        )
    })
    .await;
    // The old primary only has it by replication from the new one (if at all): the new
    // primary certainly does.
    assert_eq!(new_has, "1", "old primary: {old_has}");
}

/// A Sentinel set whose servers cannot be made replicas (`REPLICAOF` and `SLAVEOF`
/// renamed away): a demoted primary keeps taking writes, a split brain on demand.
async fn split_brain_set(name: &'static str) -> Arc<RedisSentinelSet> {
    Arc::new(
        blocking(move || {
            RedisSentinelSet::start_with(
                name,
                &[
                    "--rename-command",
                    "REPLICAOF",
                    "",
                    "--rename-command",
                    "SLAVEOF",
                    "",
                ],
            )
        })
        .await,
    )
}

/// A split brain: the old primary cannot be demoted (its `REPLICAOF` is disabled), so it
/// stays a primary that takes writes. The store must still move to the new primary at
/// once, on the sentinels' `+switch-master` (no `READONLY`, no broken connection tells
/// it), so that its writes are not lost when the old primary is finally reconfigured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moves_on_switch_master_even_if_the_old_primary_still_takes_writes() {
    let _proof = proves(Backend::Redis, Fault::FailOver);
    let set = split_brain_set("split").await;
    let store = open(&set, "&policy_check=60s").await;
    let first = set.primary_port();
    fence(
        acquire(
            &store,
            &Key::new("job:before").unwrap(),
            &OwnerToken::random(),
        )
        .await,
    );
    let second = {
        let set = set.clone();
        blocking(move || set.failover()).await
    };
    // The old primary still says it is one.
    let role = {
        let set = set.clone();
        blocking(move || set.server_on(first).cli(&["ROLE"])).await
    };
    assert!(role.starts_with("master"), "{role}");
    // Within moments every new grant lands on the new primary.
    let end = Instant::now() + Duration::from_secs(3);
    let mut i = 0;
    loop {
        i += 1;
        let k = Key::new(format!("job:after-{i}")).unwrap();
        fence(acquire(&store, &k, &OwnerToken::random()).await);
        let lk = store.lease_key(&k);
        let set2 = set.clone();
        let on_new = blocking(move || set2.server_on(second).cli(&["EXISTS", &lk])).await;
        if on_new == "1" {
            break;
        }
        assert!(
            Instant::now() < end,
            "still writing to the old primary {first} after the switch to {second}"
        );
        sleep(Duration::from_millis(100)).await;
    }
}

/// `min_replicas=1`: with the replica paused, an acquire fails closed (ambiguous, never a
/// grant reported) within its timeout; once the replica is back the same owner's retry is
/// granted with the same fence. A lease granted that way survives a fail-over with its
/// owner and fence (docs/faults.md row 11, replication-wait mode).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acknowledged_grants_fail_closed_and_survive_a_failover() {
    let _proof = proves(Backend::Redis, Fault::FailOver);
    let set = start("acked").await;
    let store = open(&set, "&min_replicas=1").await;
    assert_eq!(store.config().min_replicas(), 1);
    let k = Key::new("job:acked").unwrap();
    let o = OwnerToken::random();
    {
        let set = set.clone();
        blocking(move || set.replica().pause()).await;
    }
    let started = Instant::now();
    let e = store.acquire(&k, &o, TTL).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Ambiguous, "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    {
        let set = set.clone();
        blocking(move || set.replica().resume()).await;
    }
    let f1 = fence(acquire(&store, &k, &o).await);
    let info = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(
        (info.owner, info.fence),
        (o, f1),
        "the retry is the same grant"
    );
    // Acknowledged: a fail-over keeps it.
    {
        let set = set.clone();
        blocking(move || set.failover()).await;
    }
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match store.renew(&k, &o, TTL).await {
            Ok(RenewOutcome::Renewed { .. }) => break,
            Err(e)
                if Instant::now() < end
                    && (e.is_retryable() || e.kind() == StoreErrorKind::Ambiguous) =>
            {
                sleep(Duration::from_millis(100)).await
            }
            other => panic!("renew after the fail-over: {other:?}"),
        }
    }
    let info = store
        .inspect(&k)
        .await
        .unwrap()
        .expect("kept across the fail-over");
    assert_eq!((info.owner, info.fence), (o, f1));
    // Nobody else gets it.
    assert!(matches!(
        acquire(&store, &k, &OwnerToken::random()).await,
        AcquireOutcome::Held { .. }
    ));
}

/// Without `min_replicas`: the replica is paused and cut off while A is granted, the
/// primary dies,
/// the replica (which never saw A's grant) is promoted, and B is granted the same key
/// while A still believes it holds it — exclusion is broken, as the docs say. But B's fence
/// is higher (the clock floor), so the guard refuses A's write once B has written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_lost_the_grant_breaks_exclusion_but_not_the_fence() {
    let _proof = proves(Backend::Redis, Fault::FailOver);
    let set = start("lost").await;
    let a_store = open(&set, "").await;
    let k = Key::new("job:lost").unwrap();
    let a = OwnerToken::random();
    {
        let set = set.clone();
        blocking(move || {
            set.replica().pause();
            set.cut_replication();
        })
        .await;
    }
    let a_sent = Instant::now();
    let (fa, a_ttl) = match acquire(&a_store, &k, &a).await {
        AcquireOutcome::Acquired { fence, ttl } => (fence, ttl),
        other => panic!("expected a grant, got {other:?}"),
    };
    // A believes until its deadline: the validity of its grant, counted from its send.
    let a_deadline = a_sent + LeaseConfig::new(TTL).unwrap().validity(a_ttl);
    // The primary dies with A's grant; the replica, back, never saw it and is promoted.
    {
        let set = set.clone();
        blocking(move || {
            set.primary().kill();
            set.replica().resume();
            set.failover()
        })
        .await;
    }
    let b_store = open(&set, "").await;
    let b = OwnerToken::random();
    let fb = fence(acquire(&b_store, &k, &b).await);
    let b_granted = Instant::now();
    assert!(
        b_granted < a_deadline,
        "B was granted {:?} after A's deadline: A no longer believed, no broken exclusion \
         to test",
        b_granted - a_deadline
    );
    assert!(fb > fa, "fences rise across the fail-over: A {fa}, B {fb}");
    // The guard, in the database that receives the writes.
    let dir = tempfile::tempdir().unwrap();
    let pool =
        sqlx::SqlitePool::connect(&format!("sqlite://{}/g.db?mode=rwc", dir.path().display()))
            .await
            .unwrap();
    guard::migrate(&pool).await.unwrap();
    let res = ResourceName::from(&k);
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    assert!(matches!(
        guard::check_and_advance(&mut tx, &res, fb).await.unwrap(),
        GuardDecision::Accepted { .. }
    ));
    tx.commit().await.unwrap();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    assert_eq!(
        guard::check_and_advance(&mut tx, &res, fa).await.unwrap(),
        GuardDecision::Rejected { current: fb },
        "the older holder's write is refused"
    );
    tx.rollback().await.unwrap();
}

/// `min_replicas=1` applies to records too: with the replica paused, `put_record` fails
/// closed (ambiguous) within its timeout; once it is back, the same put returns the
/// record, which a fail-over keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acknowledged_records_fail_closed_and_survive_a_failover() {
    let set = start("records").await;
    let store = open(&set, "&min_replicas=1").await;
    let k = Key::new("election/acked").unwrap();
    {
        let set = set.clone();
        blocking(move || set.replica().pause()).await;
    }
    let started = Instant::now();
    let e = store
        .put_record(&k, Fence(7), b"leader-a")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Ambiguous, "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    {
        let set = set.clone();
        blocking(move || set.replica().resume()).await;
    }
    let stored = store.put_record(&k, Fence(7), b"leader-a").await.unwrap();
    assert_eq!(
        (stored.fence, stored.value.as_slice()),
        (Fence(7), &b"leader-a"[..])
    );
    {
        let set = set.clone();
        blocking(move || set.failover()).await;
    }
    let end = Instant::now() + Duration::from_secs(20);
    let got = loop {
        match store.get_record(&k).await {
            Ok(r) => break r,
            Err(e) if e.is_retryable() && Instant::now() < end => {
                sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("get_record after the fail-over: {e}"),
        }
    };
    let got = got.expect("kept across the fail-over");
    assert_eq!(
        (got.fence, got.value.as_slice()),
        (Fence(7), &b"leader-a"[..])
    );
}

/// A watch across a split brain: its subscription is on the old primary, which stays a
/// primary (its `REPLICAOF` is disabled) and so never hears what is published on the
/// new one. Nothing breaks the pub/sub connection; the watch's heartbeat, published
/// with its refresh on the new primary, does not come back, and the watch ends with an
/// error within `WATCH_REFRESH` plus the operation timeout (and a little) instead of
/// hearing nothing forever. A new watch subscribes on the new primary and hears the
/// next grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_split_off_primary_reports_it_and_a_new_watch_hears_the_new_one() {
    use futures::StreamExt;
    let set = split_brain_set("watchsplit").await;
    let store = open(&set, "&policy_check=60s").await;
    let k = Key::new("job:watched").unwrap();
    let mut changes = store.watch(&k).await.unwrap();
    let first = set.primary_port();
    let second = {
        let set = set.clone();
        blocking(move || set.failover()).await
    };
    assert_ne!(first, second);
    let other = open(&set, "").await;
    fence(acquire(&other, &k, &OwnerToken::random()).await);
    let started = Instant::now();
    let bound = leasehold_redis::WATCH_REFRESH + Duration::from_secs(3 + 3);
    loop {
        match tokio::time::timeout(bound, changes.next()).await {
            // A notice may come (the old primary's replica link, or a spurious one).
            Ok(Some(Ok(()))) => continue,
            Ok(Some(Err(_)) | None) => break,
            Err(_) => panic!("the watch heard nothing and said nothing for {bound:?}"),
        }
    }
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());
    let mut changes = {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            match store.watch(&k).await {
                Ok(c) => break c,
                Err(e) => {
                    assert!(Instant::now() < end, "watching again: {e}");
                    sleep(Duration::from_millis(200)).await;
                }
            }
        }
    };
    let holder = OwnerToken::random();
    let k2 = k.clone();
    // The key is held since the grant above: break it so that the next grant is new.
    other.break_lease(&k2).await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(1), changes.next()).await;
    fence(acquire(&other, &k, &holder).await);
    match tokio::time::timeout(Duration::from_secs(5), changes.next()).await {
        Ok(Some(Ok(()))) => {}
        other => panic!("the new watch did not hear a grant on the new primary: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Issue 24 item 5: a replica whose wall clock is ahead of the primary's.

/// A Sentinel set whose replica runs with its wall clock `offset` ahead (libfaketime).
async fn set_with_replica_clock(
    name: &'static str,
    offset: &str,
) -> (Arc<RedisSentinelSet>, Arc<FakeWallClock>) {
    let clock = Arc::new(FakeWallClock::new());
    clock.set(offset);
    let c = clock.clone();
    let set = Arc::new(blocking(move || RedisSentinelSet::start_with_replica_clock(name, c)).await);
    (set, clock)
}

/// `TIME` of a server, in µs.
fn server_time_us(server: &leasehold_testkit::RedisServer) -> i128 {
    let out = server.cli(&["TIME"]);
    let mut parts = out.lines().map(|l| l.trim().parse::<i128>().unwrap());
    parts.next().unwrap() * 1_000_000 + parts.next().unwrap()
}

/// A store for `set` whose data connections all go through fault proxies (the sentinels
/// are asked directly), so that the holder can be cut off from every data server.
fn proxied_store(
    set: &RedisSentinelSet,
    tweak: impl FnOnce(RedisConfigBuilder) -> RedisConfigBuilder,
) -> (RedisStore, Vec<Arc<FaultProxy>>) {
    let proxies: Vec<Arc<FaultProxy>> = set
        .servers()
        .iter()
        .map(|s| Arc::new(FaultProxy::start(s.addr())))
        .collect();
    let mut b = RedisConfigBuilder::sentinel(
        set.sentinel_ports()
            .into_iter()
            .map(|p| NodeAddr::new("127.0.0.1", p)),
        set.master_name(),
    )
    .op_timeout(Duration::from_secs(1))
    .connect_timeout(Duration::from_secs(1));
    for (s, p) in set.servers().iter().zip(&proxies) {
        b = b.map_address(
            NodeAddr::new("127.0.0.1", s.port()),
            NodeAddr::new("127.0.0.1", p.port()),
        );
    }
    let store = RedisStore::new(tweak(b).build().unwrap()).unwrap();
    (store, proxies)
}

/// Redis gives a replica each key's expiry as an absolute time of the primary's clock, and
/// a promoted replica expires keys by its own clock: with the replica's clock 5 s ahead, a
/// held lease disappears 5 s early at the fail-over. The holder is cut off from every data
/// server right after its grant (so no renewal resets the expiry on the new primary) and
/// believes until its deadline; a contender polls until it gets the lease. At that instant
/// the holder must no longer believe: its deadline came first, because the store took the
/// replica's measured offset off the TTL it reports as granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_clock_ahead_never_ends_a_lease_its_holder_still_believes() {
    let _proof = proves(Backend::Redis, Fault::FailOver);
    let (set, _clock) = set_with_replica_clock("ahead", "+5s").await;
    // The replica's clock really is ahead (libfaketime reached redis-server).
    let (p, r) = {
        let set = set.clone();
        blocking(move || (server_time_us(set.primary()), server_time_us(set.replica()))).await
    };
    let ahead = Duration::from_micros(u64::try_from(r - p).unwrap_or(0));
    assert!(
        ahead > Duration::from_millis(4500) && ahead < Duration::from_millis(6000),
        "the replica's clock is {ahead:?} ahead, not about 5 s"
    );
    // The offset is accepted (the default limit refuses it: see the next test), so the
    // store takes it off the TTL it reports as granted.
    let (holder_store, proxies) =
        proxied_store(&set, |b| b.max_clock_offset(Duration::from_secs(10)));
    let holder_store = Arc::new(holder_store);
    let ttl = Duration::from_secs(20);
    let config = LeaseConfig::builder(ttl)
        .op_timeout(Duration::from_secs(1))
        // The holder believes until its deadline, whatever its renewals say.
        .renew_failures_before_lost(1000)
        .build()
        .unwrap();
    let client = LeaseClient::new(holder_store.clone(), config);
    let k = Key::new("job:clock-ahead").unwrap();
    let asked_at = Instant::now();
    let lease = client.try_acquire(&k).await.expect("the holder acquires");
    // The replica has the grant (and its absolute expiry).
    let lease_key = holder_store.lease_key(&k);
    {
        let (set, lk) = (set.clone(), lease_key.clone());
        blocking(move || {
            let end = std::time::Instant::now() + Duration::from_secs(10);
            while set.replica().cli(&["EXISTS", &lk]) != "1" {
                assert!(
                    std::time::Instant::now() < end,
                    "the replica never got the lease"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .await;
    }
    // The holder is cut off from the data servers; the replica is promoted.
    for p in &proxies {
        p.set_mode(ProxyMode::Blackhole);
    }
    {
        let set = set.clone();
        blocking(move || set.failover()).await;
    }
    // A contender (the new primary's clock is the replica's) polls for the lease.
    let contender = open(&set, "").await;
    let c = OwnerToken::random();
    let end = Instant::now() + ttl * 2;
    let (granted_at, fence_c) = loop {
        match contender.acquire(&k, &c, Duration::from_secs(5)).await {
            Ok(AcquireOutcome::Acquired { fence, .. }) => break (Instant::now(), fence),
            Ok(AcquireOutcome::Held { .. }) => {}
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
        assert!(Instant::now() < end, "the contender never got the lease");
        sleep(Duration::from_millis(20)).await;
    };
    let holder_believes = lease.is_valid();
    let valid_until = lease.valid_until();
    // The scenario is the early expiry: the store freed the lease before the TTL asked.
    assert!(
        granted_at < asked_at + ttl,
        "the contender got the lease only {:?} after the grant: no early expiry to test",
        granted_at - asked_at
    );
    assert!(
        !holder_believes && valid_until <= granted_at,
        "the contender holds the lease (fence {fence_c}) while the first holder still \
         believes for another {:?} (its deadline {:?} after its request, the contender's \
         grant {:?} after it)",
        valid_until.saturating_duration_since(granted_at),
        valid_until - asked_at,
        granted_at - asked_at
    );
    assert!(fence_c > lease.fence());
    // What the store took off is the offset (about 5 s), not more.
    assert!(
        valid_until - asked_at
            > LeaseConfig::new(ttl)
                .unwrap()
                .validity(ttl - Duration::from_millis(5500)),
        "the holder's deadline came {:?} after its request: more than the offset was taken off",
        valid_until - asked_at
    );
}

/// The default `max_clock_offset` (500 ms) refuses a replica 5 s ahead, and the periodic
/// measurement (`clock_check`) finds a replica's clock stepped on a running set: grants
/// (acquires, renewals) are refused with a typed `Config` error naming the replica and the
/// offset, a release still works, a store opened now fails to open; once the clock is
/// back, grants work again. With the clocks together, the TTL reported as granted is the
/// one asked less at most a few milliseconds (the measurement's round trips).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_clock_too_far_ahead_is_refused_when_opening_and_by_the_periodic_check() {
    let (set, clock) = set_with_replica_clock("refused", "+0").await;
    let store = open(&set, "&clock_check=500ms").await;
    assert_eq!(
        store.config().max_clock_offset(),
        leasehold_redis::DEFAULT_MAX_CLOCK_OFFSET
    );
    let ttl = Duration::from_secs(10);
    let (k, o) = (Key::new("job:clock-held").unwrap(), OwnerToken::random());
    match store.acquire(&k, &o, ttl).await.unwrap() {
        AcquireOutcome::Acquired { ttl: granted, .. } => assert!(
            granted <= ttl && granted > ttl - Duration::from_millis(50),
            "granted {granted:?} of {ttl:?} with the clocks together"
        ),
        other => panic!("{other:?}"),
    }
    // The replica's clock steps 5 s ahead.
    clock.set("+5s");
    let replica_port = set.replica().port();
    let end = Instant::now() + FakeWallClock::PICKUP + Duration::from_secs(5);
    let mut i = 0;
    let refused = loop {
        i += 1;
        let fresh = Key::new(format!("job:clock-{i}")).unwrap();
        match store.acquire(&fresh, &OwnerToken::random(), ttl).await {
            Ok(AcquireOutcome::Acquired { .. }) => {}
            Ok(other) => panic!("{other:?}"),
            Err(e) => break e,
        }
        assert!(Instant::now() < end, "the stepped clock was not found");
        sleep(Duration::from_millis(100)).await;
    };
    assert_clock_refusal(&refused, replica_port);
    // The holder's renewal is refused too; its release works.
    let e = store.renew(&k, &o, ttl).await.unwrap_err();
    assert_clock_refusal(&e, replica_port);
    assert_eq!(
        store.release(&k, &o).await.unwrap(),
        leasehold_core::ReleaseOutcome::Released
    );
    // A store opened now is refused when it opens.
    let e = RedisStore::open(&format!("{}?timeout=3s&connect_timeout=2s", set.url()))
        .await
        .unwrap_err();
    assert_clock_refusal(&e, replica_port);
    // The clock is set right: grants work again.
    clock.set("+0");
    let end = Instant::now() + FakeWallClock::PICKUP + Duration::from_secs(5);
    loop {
        match store.acquire(&k, &o, ttl).await {
            Ok(AcquireOutcome::Acquired { .. }) => break,
            Ok(other) => panic!("{other:?}"),
            Err(e) => assert_eq!(e.kind(), StoreErrorKind::Config, "{e}"),
        }
        assert!(
            Instant::now() < end,
            "still refused after the clock was set right"
        );
        sleep(Duration::from_millis(100)).await;
    }
}

/// `e` is the refusal of a replica on `replica_port` about 5 s ahead.
fn assert_clock_refusal(e: &leasehold_core::StoreError, replica_port: u16) {
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let c = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<leasehold_redis::ClockOffset>())
        .unwrap_or_else(|| panic!("no ClockOffset source: {e}"));
    assert!(c.replica().ends_with(&format!(":{replica_port}")), "{c}");
    assert!(
        c.offset() > Duration::from_millis(4500) && c.offset() < Duration::from_secs(6),
        "{c}"
    );
    assert_eq!(c.limit(), leasehold_redis::DEFAULT_MAX_CLOCK_OFFSET);
    let text = e.to_string();
    assert!(
        text.contains("max_clock_offset") && text.contains("NTP"),
        "{text}"
    );
}
