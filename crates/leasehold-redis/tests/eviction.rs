//! docs/faults.md row 25: Redis under an evicting `maxmemory-policy` can drop a held lease key and
//! let a second holder in. The store reads the policy (`INFO memory`) when it connects, on
//! every Cluster primary, after every reconnect and every `policy_check`, and refuses an
//! evicting policy unless the URL accepts it with `allow_eviction=true`.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Action, Error, Key, LeaseClient, LeaseConfig, LostReason, OwnerToken, Registry,
    RenewOutcome, Store, StoreError, StoreErrorKind,
};
use leasehold_redis::{EvictingPolicy, RedisConfig, RedisFactory, RedisStore};
use leasehold_testkit::proof::{Backend, Fault, proves};
use leasehold_testkit::{RedisOptions, RedisServer};
use tokio::time::{Instant, sleep, timeout};

/// Every policy Redis has except `noeviction`: all of them may evict a lease key
/// (`volatile-*` evict keys with a TTL, which every lease has; `allkeys-*` evict anything).
const EVICTING: [&str; 7] = [
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
];

fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

async fn start(opts: RedisOptions) -> Arc<RedisServer> {
    Arc::new(
        tokio::task::spawn_blocking(move || RedisServer::start_with(opts))
            .await
            .unwrap(),
    )
}

/// A private server with a small `maxmemory` and `allkeys-lru`.
async fn evicting_server() -> Arc<RedisServer> {
    start(RedisOptions::new().args(["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"]))
        .await
}

async fn cli(server: &Arc<RedisServer>, args: &[&str]) -> String {
    let server = server.clone();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        server.cli(&args)
    })
    .await
    .unwrap()
}

/// The refusal: a configuration error (never retried) that names the policy and the two
/// ways out, with a typed source.
fn assert_eviction_error(e: &StoreError, policy: &str) {
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_eq!(e.action(), Action::Reconfigure, "{e}");
    assert!(!e.is_retryable(), "{e}");
    let text = e.to_string();
    for needle in [
        policy,
        "maxmemory-policy",
        "noeviction",
        "allow_eviction=true",
        "fence",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from: {text}");
    }
    let typed = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<EvictingPolicy>())
        .unwrap_or_else(|| panic!("no EvictingPolicy source in {e:?}"));
    assert_eq!(typed.policy(), policy, "{e}");
}

fn is_eviction_error(e: &StoreError) -> bool {
    std::error::Error::source(e).is_some_and(|s| s.is::<EvictingPolicy>())
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_25_evicting_policy_is_refused_when_opening() {
    let _proof = proves(Backend::Redis, Fault::Eviction);
    let s = evicting_server().await;
    let url = format!("{}?prefix=ev:", s.url());

    let e = RedisStore::open(&url).await.unwrap_err();
    assert_eviction_error(&e, "allkeys-lru");
    // Through a registry, as the CLI opens stores.
    let mut registry = Registry::new();
    registry.register(Arc::new(RedisFactory));
    let e = registry.open(&url).await.unwrap_err();
    assert_eviction_error(&e, "allkeys-lru");

    // A lazily connected store refuses at its first operation, and a waiting acquire
    // gives up at once instead of retrying until its wait runs out.
    let lazy = Arc::new(RedisStore::new(RedisConfig::from_url(&url).unwrap()).unwrap());
    let e = lazy
        .acquire(
            &key("job:ev"),
            &OwnerToken::random(),
            Duration::from_secs(10),
        )
        .await
        .unwrap_err();
    assert_eviction_error(&e, "allkeys-lru");
    let client = LeaseClient::new(lazy, LeaseConfig::new(Duration::from_secs(1)).unwrap());
    let started = Instant::now();
    match client.acquire("job:ev", Duration::from_secs(20)).await {
        Err(Error::Store(e)) => assert_eviction_error(&e, "allkeys-lru"),
        other => panic!("expected the eviction error, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the refusal was retried"
    );
    // Nothing was written.
    assert_eq!(cli(&s, &["DBSIZE"]).await, "0");

    // Every policy but noeviction is refused.
    for policy in EVICTING {
        assert_eq!(
            cli(&s, &["CONFIG", "SET", "maxmemory-policy", policy]).await,
            "OK"
        );
        let e = RedisStore::open(&url).await.unwrap_err();
        assert_eviction_error(&e, policy);
    }
    assert_eq!(
        cli(&s, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).await,
        "OK"
    );
    let store = Arc::new(RedisStore::open(&url).await.unwrap());
    assert!(!store.capabilities().may_evict);
    let client = LeaseClient::new(store, LeaseConfig::new(Duration::from_secs(1)).unwrap());
    let lease = client.try_acquire("job:ev").await.unwrap();
    assert!(lease.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_25_accepting_eviction_explicitly_opens_warns_and_says_may_evict() {
    let log = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer({
            let log = log.clone();
            move || log.clone()
        })
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let s = evicting_server().await;
    let url = format!("{}?prefix=ev:&allow_eviction=true", s.url());
    let store = Arc::new(RedisStore::open(&url).await.unwrap());
    assert!(store.capabilities().may_evict);
    assert!(store.config().allow_eviction());
    let logged = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
    assert!(
        logged.contains("WARN")
            && logged.contains("allkeys-lru")
            && logged.contains("allow_eviction"),
        "no warning about the accepted policy:\n{logged}"
    );
    let client = LeaseClient::new(
        store.clone(),
        LeaseConfig::new(Duration::from_secs(1)).unwrap(),
    );
    let lease = client.try_acquire("job:ev").await.unwrap();
    assert!(lease.release().await.unwrap());

    // The parameter is checked like every other one.
    for bad in ["allow_eviction=maybe", "allow_eviction=", "allow_eviction"] {
        let e = RedisConfig::from_url(&format!("{}?{bad}", s.url())).unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config, "{bad}: {e}");
        assert!(e.to_string().contains("allow_eviction"), "{bad}: {e}");
    }
    let off = RedisConfig::from_url(&format!("{}?allow_eviction=false", s.url())).unwrap();
    assert!(!off.allow_eviction());
    assert!(!RedisStore::new(off).unwrap().capabilities().may_evict);
}

/// The danger is real: under `allkeys-lru`, filling memory evicts a held lease key and a
/// second owner acquires while the first still holds it (by its own clock). Only the fence
/// tells them apart: the second fence is higher, even if the fence key was evicted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_25_eviction_lets_a_second_holder_in_only_the_fence_protects() {
    let _proof = proves(Backend::Redis, Fault::Eviction);
    let s = evicting_server().await;
    let url = format!("{}?prefix=ev:&allow_eviction=true", s.url());
    let store = RedisStore::open(&url).await.unwrap();
    let k = key("job:evicted");
    let a = OwnerToken::random();
    let ttl = Duration::from_secs(60);
    let fence_a = match store.acquire(&k, &a, ttl).await.unwrap() {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("{other:?}"),
    };
    // Fill memory with other keys until the lease key is gone.
    let mut conn = redis::Client::open(s.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let lease_key = store.lease_key(&k);
    let junk = vec![b'x'; 8 * 1024];
    let mut evicted = false;
    for i in 0..20_000u32 {
        let _: () = redis::cmd("SET")
            .arg(format!("junk:{i}"))
            .arg(&junk)
            .query_async(&mut conn)
            .await
            .unwrap();
        if i % 16 == 0 {
            let exists: i64 = redis::cmd("EXISTS")
                .arg(&lease_key)
                .query_async(&mut conn)
                .await
                .unwrap();
            if exists == 0 {
                evicted = true;
                break;
            }
        }
    }
    assert!(evicted, "the lease key was never evicted");
    // A's TTL has not run out, yet B gets the lease: two holders.
    let b = OwnerToken::random();
    let fence_b = match store.acquire(&k, &b, ttl).await.unwrap() {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("expected a second grant after eviction, got {other:?}"),
    };
    assert!(
        fence_b > fence_a,
        "fences went back: {fence_b} after {fence_a}"
    );
    // A learns only at its next renewal.
    assert_eq!(
        store.renew(&k, &a, ttl).await.unwrap(),
        RenewOutcome::NotOwner
    );
}

/// Someone switches the policy on a running server and the store reconnects: the new
/// connection is refused, so renewals fail closed and the lease is lost by its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_25_policy_changed_then_reconnect_fails_closed() {
    let _proof = proves(Backend::Redis, Fault::Eviction);
    let s = start(RedisOptions::new()).await;
    let url = format!("{}?prefix=ev:", s.url());
    let store = Arc::new(RedisStore::open(&url).await.unwrap());
    let ttl = Duration::from_secs(2);
    let client = LeaseClient::new(store.clone(), LeaseConfig::new(ttl).unwrap());
    let k = key("job:reconnect");
    let lease = client.try_acquire(&k).await.unwrap();
    sleep(ttl / 2).await; // a renewal or two
    assert!(lease.is_valid());

    assert_eq!(
        cli(&s, &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]).await,
        "OK"
    );
    // Kill the store's connection (redis-cli skips its own).
    cli(&s, &["CLIENT", "KILL", "TYPE", "normal"]).await;

    // The call that finds the broken connection may fail as such (retryable); every call
    // after it gets the eviction error, at once.
    let mut errors = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        match store.inspect(&k).await {
            Ok(v) => panic!("an operation succeeded after the policy changed: {v:?}"),
            Err(e) => {
                assert!(started.elapsed() < Duration::from_secs(1), "{e}");
                errors.push(e);
            }
        }
    }
    assert!(
        is_eviction_error(&errors[0]) || errors[0].is_retryable(),
        "{}",
        errors[0]
    );
    for e in &errors[1..] {
        assert_eviction_error(e, "allkeys-lru");
    }
    let e = store
        .acquire(&key("job:other"), &OwnerToken::random(), ttl)
        .await
        .unwrap_err();
    assert_eviction_error(&e, "allkeys-lru");

    // The holder's renewals fail closed: lost by its deadline.
    let reason = timeout(ttl * 2, lease.lost())
        .await
        .expect("the lease is lost");
    let lost_at = Instant::now();
    assert!(
        lost_at <= lease.valid_until() + Duration::from_millis(500),
        "lost {:?} after the deadline",
        lost_at - lease.valid_until()
    );
    assert!(
        matches!(reason, LostReason::RenewFailed { .. } | LostReason::Expired),
        "{reason:?}"
    );

    // Fixed on the server: once the refusal is no longer remembered (1 s, so that a
    // burst of calls does not reconnect once each), the next call reconnects, checks
    // again and works.
    assert_eq!(
        cli(&s, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).await,
        "OK"
    );
    sleep(Duration::from_millis(1100)).await;
    store.inspect(&k).await.unwrap();
}

/// A policy switched under a live connection is found by the periodic check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_25_policy_changed_on_a_live_connection_is_found_within_policy_check() {
    let s = start(RedisOptions::new()).await;
    let url = format!("{}?prefix=ev:&policy_check=300ms", s.url());
    let store = RedisStore::open(&url).await.unwrap();
    let k = key("job:live");
    store.inspect(&k).await.unwrap();
    assert_eq!(
        cli(&s, &["CONFIG", "SET", "maxmemory-policy", "volatile-ttl"]).await,
        "OK"
    );
    sleep(Duration::from_millis(400)).await;
    let e = store.inspect(&k).await.unwrap_err();
    assert_eviction_error(&e, "volatile-ttl");
    let e = store
        .acquire(&k, &OwnerToken::random(), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eviction_error(&e, "volatile-ttl");
}

/// On a Cluster every primary is checked: one evicting primary is enough to refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_25_cluster_with_one_evicting_primary_is_refused() {
    let _proof = proves(Backend::RedisCluster, Fault::Eviction);
    let c = common::Cluster::start().await;
    let seeds: Vec<String> = c
        .cluster
        .ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let url = format!("redis+cluster://{}/?prefix=ev:", seeds.join(","));
    let node = |i: usize, policy: &str| {
        let out = c
            .cluster
            .node(i)
            .cli(&["CONFIG", "SET", "maxmemory-policy", policy]);
        assert_eq!(out, "OK");
    };

    // The seed the client asks first is fine; another primary is not.
    tokio::task::block_in_place(|| node(1, "allkeys-lru"));
    let e = RedisStore::connect(c.config.clone()).await.unwrap_err();
    assert_eviction_error(&e, "allkeys-lru");
    let e = RedisStore::open(&url).await.unwrap_err();
    assert_eviction_error(&e, "allkeys-lru");
    assert!(
        e.to_string()
            .contains(&c.cluster.node(1).port().to_string()),
        "the error does not name the node: {e}"
    );

    // Accepted explicitly: opens, says so.
    let store = Arc::new(
        RedisStore::open(&format!("{url}&allow_eviction=true"))
            .await
            .unwrap(),
    );
    assert!(store.capabilities().may_evict);
    let client = LeaseClient::new(store, LeaseConfig::new(Duration::from_secs(1)).unwrap());
    let lease = client.try_acquire("job:cluster").await.unwrap();
    assert!(lease.release().await.unwrap());

    // All primaries fixed: opens; a primary switched later is found by the periodic check.
    tokio::task::block_in_place(|| node(1, "noeviction"));
    let store = RedisStore::open(&format!("{url}&policy_check=300ms"))
        .await
        .unwrap();
    assert!(!store.capabilities().may_evict);
    let k = key("job:cluster");
    store.inspect(&k).await.unwrap();
    tokio::task::block_in_place(|| node(2, "allkeys-lfu"));
    sleep(Duration::from_millis(400)).await;
    let e = store.inspect(&k).await.unwrap_err();
    assert_eviction_error(&e, "allkeys-lfu");
}
