//! docs/faults.md rows against real `redis-server` processes: a paused holder process (1), a paused
//! server (4), a reset through the fault proxy (8), a blackhole (7), restarts without
//! persistence and `kill -9` (9, 10), cancelled acquisitions (24).
//!
//! The shared fault cases of the conformance suite (`conformance_standalone`,
//! `conformance_cluster`) cover rows 2, 4, 5, 6, 7, 8 and 24 on every networked backend;
//! the tests kept here check what they do not: the store-side expiry read with `PTTL`
//! (4), the error kinds and per-call bounds of this store, connecting, `wait_released`
//! (7, 8), no lease key left found by `SCAN` (24). Row 5 is only there.

mod common;
#[path = "support/os_crash.rs"]
mod os_crash;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::Standalone;
use leasehold_core::WaitStore;
use leasehold_core::{
    AcquireOutcome, Error, Fence, Key, LeaseClient, LeaseConfig, LostReason, OwnerToken,
    ReleaseOutcome, RenewOutcome, Store, StoreErrorKind,
};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::proof::{Backend, Fault, proves};
use leasehold_testkit::{ProxyMode, RedisOptions, WorkerProcess};
use tokio::time::{Instant, sleep, timeout};

fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

// ---------------------------------------------------------------------------------------
// The guard: a fenced write on the Redis side. The protected value and the highest fence
// accepted live in one hash; a write with a lower fence is rejected atomically.

const GUARD: &str = r#"
local cur = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
local f = tonumber(ARGV[1])
if f < cur then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
"#;

async fn guarded_write(url: &str, guard_key: &str, fence: Fence, value: &str) -> bool {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let accepted: i64 = redis::Script::new(GUARD)
        .key(guard_key)
        .arg(fence.get())
        .arg(value)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    accepted == 1
}

// ---------------------------------------------------------------------------------------
// Row 1: a worker process holding a lease is SIGSTOPped past its TTL.

const WORKER_ENV: &str = "LEASEHOLD_REDIS_TEST_WORKER";

/// The worker process of `row_01_paused_holder_process`: the test binary runs that test
/// again with the worker's settings in the environment, and the test runs this instead of
/// its body. Returns `true` in the worker, `false` in the test process.
async fn run_worker_if_child() -> bool {
    let Ok(url) = std::env::var(WORKER_ENV) else {
        return false;
    };
    let k = key(&std::env::var("LH_KEY").unwrap());
    let go = PathBuf::from(std::env::var("LH_GO").unwrap());
    let guard_key = std::env::var("LH_GUARD").unwrap();
    let ttl = Duration::from_millis(std::env::var("LH_TTL_MS").unwrap().parse().unwrap());
    let store = Arc::new(RedisStore::open(&url).await.unwrap());
    let client = LeaseClient::new(store.clone(), LeaseConfig::new(ttl).unwrap());
    let lease = client.try_acquire(&k).await.unwrap();
    println!("ACQUIRED fence={} owner={}", lease.fence(), lease.owner());
    // Work until told to write (the test pauses this process meanwhile).
    while !go.exists() {
        sleep(Duration::from_millis(20)).await;
    }
    // About to write: check the lease first, as a careful worker does.
    let valid = lease.is_valid();
    let signal_fired = lease.lost().is_lost();
    println!(
        "CHECK valid={valid} signal_fired={signal_fired} reason={:?}",
        lease.lost_reason()
    );
    // A careless worker writes anyway with its fence: the guard must reject it.
    let accepted = guarded_write(&url, &guard_key, lease.fence(), "written-by-A").await;
    println!("WRITE accepted={accepted}");
    let renew = store.renew(&k, lease.owner(), ttl).await.unwrap();
    println!("RENEW {renew:?}");
    let owner = *lease.owner();
    let held = lease.release().await.unwrap();
    println!("RELEASE held={held}");
    let raw = store.release(&k, &owner).await.unwrap();
    println!("RAWRELEASE {raw:?}");
    println!("DONE");
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_01_paused_holder_process() {
    if run_worker_if_child().await {
        return;
    }
    let _proof = proves(Backend::Redis, Fault::ProcessPause);
    let s = Standalone::start().await;
    let url = s.server.url();
    let ttl = Duration::from_secs(1);
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let k = key("job:paused-holder");
    let guard_key = "guard:paused-holder";

    let mut cmd = WorkerProcess::test_command("row_01_paused_holder_process");
    cmd.env(WORKER_ENV, &url)
        .env("LH_KEY", k.as_str())
        .env("LH_GO", &go)
        .env("LH_GUARD", guard_key)
        .env("LH_TTL_MS", ttl.as_millis().to_string());
    let worker = WorkerProcess::spawn(cmd);
    // `contains`: libtest may print its own text on the line before the worker's output.
    let line = tokio::task::block_in_place(|| {
        worker.wait_for_line(|l| l.contains("ACQUIRED "), Duration::from_secs(30))
    })
    .expect("the worker acquires");
    worker.pause();
    let fence_a: u64 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("fence="))
        .unwrap()
        .parse()
        .unwrap();
    // A is frozen past its TTL; B takes over and writes.
    sleep(ttl * 3 / 2).await;
    let client = LeaseClient::new(s.store.clone(), LeaseConfig::new(ttl).unwrap());
    let b = client.acquire(&k, ttl * 3).await.expect("B acquires");
    assert!(
        b.fence().get() > fence_a,
        "B's fence {} <= A's {fence_a}",
        b.fence()
    );
    assert!(guarded_write(&url, guard_key, b.fence(), "written-by-B").await);
    // A resumes.
    std::fs::write(&go, b"go").unwrap();
    worker.resume();
    let done = tokio::task::block_in_place(|| {
        worker.wait_for_line(|l| l.ends_with("DONE"), Duration::from_secs(30))
    });
    let lines = worker.lines();
    assert!(done.is_some(), "worker did not finish: {lines:#?}");
    let find = |p: &str| {
        lines
            .iter()
            .find_map(|l| l.find(p).map(|i| l[i..].to_owned()))
            .unwrap_or_else(|| panic!("no {p} line in {lines:#?}"))
    };
    // Its lost signal fired before it wrote; the guard rejected the write.
    let check = find("CHECK");
    assert!(check.contains("valid=false"), "{check}");
    assert!(check.contains("signal_fired=true"), "{check}");
    assert_eq!(find("WRITE"), "WRITE accepted=false");
    // Its renew and release said "not yours" and left B intact.
    assert_eq!(find("RENEW"), "RENEW NotOwner");
    assert_eq!(find("RELEASE"), "RELEASE held=false");
    assert_eq!(find("RAWRELEASE"), "RAWRELEASE NotOwner");
    let info = s.store.inspect(&k).await.unwrap().expect("B still holds");
    assert_eq!((info.owner, info.fence), (*b.owner(), b.fence()));
    assert_eq!(
        s.cli(&["HGET", guard_key, "value"]).await,
        "written-by-B",
        "the guard kept B's write"
    );
    assert!(b.is_valid());
    assert_eq!(
        s.store.renew(&k, b.owner(), ttl).await.unwrap(),
        RenewOutcome::Renewed { ttl }
    );
    assert!(b.release().await.unwrap());
}

// ---------------------------------------------------------------------------------------
// Row 4: the server is paused past the TTL.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_04_server_paused_lost_fires_before_store_expiry() {
    let _proof = proves(Backend::Redis, Fault::ServerPaused);
    let s = Standalone::start().await;
    let ttl = Duration::from_secs(2);
    let client = LeaseClient::new(s.store.clone(), LeaseConfig::new(ttl).unwrap());
    let k = key("job:server-paused");
    let lease = client.try_acquire(&k).await.unwrap();
    sleep(ttl / 2).await; // renewals happen
    assert!(lease.is_valid());
    // The store-side expiry, measured on the server just before the pause: at least
    // `asked + pttl`. If a renewal lands between the measurement and the pause, measure
    // again (the bound would be stale).
    let mut conn = redis::Client::open(s.server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let lease_key = s.store.lease_key(&k);
    let store_expiry_at_least = loop {
        let v0 = lease.valid_until();
        let asked = Instant::now();
        let pttl: u64 = redis::cmd("PTTL")
            .arg(&lease_key)
            .query_async(&mut conn)
            .await
            .unwrap();
        s.server.pause();
        sleep(Duration::from_millis(50)).await; // a reply already on its way is processed
        if lease.valid_until() == v0 {
            break asked + Duration::from_millis(pttl);
        }
        s.server.resume();
        sleep(Duration::from_millis(100)).await;
    };
    let reason = timeout(ttl * 2, lease.lost()).await;
    let lost_at = Instant::now();
    let valid_until = lease.valid_until();
    s.server.resume();
    let reason = reason.expect("lost fires while the server is paused");
    assert!(
        matches!(
            reason,
            LostReason::Expired | LostReason::RenewFailed { .. } | LostReason::StoreUnavailable
        ),
        "{reason:?}"
    );
    assert!(
        lost_at < store_expiry_at_least,
        "lost fired {:?} after the store-side expiry",
        lost_at - store_expiry_at_least
    );
    assert!(
        lost_at <= valid_until + Duration::from_millis(500),
        "lost fired {:?} after the local deadline",
        lost_at - valid_until
    );
    // The lost lease stays in the store while its holder may still run: nobody takes it
    // over, even after the store-side expiry seen before the pause, because a renewal sent
    // before the pause may have waited in the server's socket and been applied on resume.
    sleep(
        store_expiry_at_least.saturating_duration_since(Instant::now())
            + Duration::from_millis(100),
    )
    .await;
    if let Some(info) = s.store.inspect(&k).await.unwrap() {
        assert_eq!(
            info.owner,
            *lease.owner(),
            "taken over while its holder runs"
        );
        assert!(client.try_acquire(&k).await.is_err());
    }
    // The holder stops its work and lets go: the next holder gets it at once, with a
    // higher fence.
    let old_fence = lease.fence();
    let _ = lease.release().await.unwrap();
    assert_eq!(s.store.inspect(&k).await.unwrap(), None);
    let next = client.try_acquire(&k).await.unwrap();
    assert!(next.fence() > old_fence);
    next.release().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// Row 8: a reset mid-command.

/// The owner and fence recorded in Redis for `k`.
async fn raw_lease(s: &Standalone, k: &Key) -> Option<(String, u64)> {
    let v = s.cli(&["GET", &s.store.lease_key(k)]).await;
    let (o, f) = v.split_once(':')?;
    Some((o.to_owned(), f.parse().ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_08_reset_mid_command_then_idempotent_retry() {
    let s = Standalone::start().await;
    let ttl = Duration::from_secs(3);
    let k = key("job:reset");
    let owner = OwnerToken::random();
    // Connected (and the server's eviction policy checked) first, so that the acquire is
    // the first thing sent through the slow proxy.
    s.store.inspect(&k).await.unwrap();
    // Hold every chunk 300 ms: the request reaches the server at ~300 ms, its reply would
    // come back at ~600 ms; reset the connection in between.
    s.proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(300)));
    let pending = {
        let (store, k) = (s.store.clone(), k.clone());
        tokio::spawn(async move { store.acquire(&k, &owner, ttl).await })
    };
    sleep(Duration::from_millis(450)).await;
    s.proxy.reset_all();
    let e = pending
        .await
        .unwrap()
        .expect_err("the connection was reset");
    assert!(
        matches!(
            e.kind(),
            StoreErrorKind::Ambiguous | StoreErrorKind::Timeout
        ),
        "reset after send must be ambiguous: {e}"
    );
    assert!(e.is_retryable());
    s.proxy.set_mode(ProxyMode::Pass);
    let applied = raw_lease(&s, &k).await;
    // The retry reconnects and returns the same grant (or grants it, if the request was
    // lost with the connection): never a second lease.
    let fence = match s.store.acquire(&k, &owner, ttl).await.unwrap() {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("{other:?}"),
    };
    if let Some((o, f)) = applied {
        assert_eq!((o, f), (owner.to_hex(), fence.get()));
    }
    assert_eq!(raw_lease(&s, &k).await, Some((owner.to_hex(), fence.get())));
    // A reset while idle: the next calls reconnect.
    s.proxy.reset_all();
    sleep(Duration::from_millis(50)).await;
    let mut renewed = None;
    for _ in 0..3 {
        match s.store.renew(&k, &owner, ttl).await {
            Ok(r) => {
                renewed = Some(r);
                break;
            }
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
    }
    assert_eq!(renewed, Some(RenewOutcome::Renewed { ttl }));
    assert_eq!(
        s.store.release(&k, &owner).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(s.proxy.connections() >= 2, "reconnected");
}

// ---------------------------------------------------------------------------------------
// Row 7: blackhole.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_07_blackhole_every_call_returns_within_its_timeout() {
    let _proof = proves(Backend::Redis, Fault::NetworkPartition);
    let op_timeout = Duration::from_millis(500);
    let s = Standalone::start_with(RedisOptions::new(), |b| {
        b.op_timeout(op_timeout)
            .connect_timeout(Duration::from_millis(300))
    })
    .await;
    let k = key("job:blackhole");
    let owner = OwnerToken::random();
    s.store
        .acquire(&k, &owner, Duration::from_secs(60))
        .await
        .unwrap();
    s.proxy.set_mode(ProxyMode::Blackhole);
    let bound = op_timeout + Duration::from_millis(700);
    let store: &RedisStore = &s.store;
    let ttl = Duration::from_secs(5);
    macro_rules! bounded {
        ($name:literal, $call:expr) => {{
            let started = Instant::now();
            let res = timeout(Duration::from_secs(10), $call)
                .await
                .unwrap_or_else(|_| panic!("{} hung", $name));
            let took = started.elapsed();
            assert!(took <= bound, "{} took {took:?}", $name);
            let e = res.expect_err($name);
            assert!(
                matches!(
                    e.kind(),
                    StoreErrorKind::Timeout | StoreErrorKind::Unavailable
                ),
                "{}: {e}",
                $name
            );
        }};
    }
    bounded!("acquire", store.acquire(&k, &OwnerToken::random(), ttl));
    bounded!("renew", store.renew(&k, &owner, ttl));
    bounded!("release", store.release(&k, &owner));
    bounded!("inspect", store.inspect(&k));
    bounded!("list", store.list("job:"));
    bounded!("break", store.break_lease(&k));
    bounded!(
        "wait_released",
        store.wait_released(&k, &OwnerToken::random(), Duration::from_secs(5))
    );
    // Connecting is bounded too.
    let cfg = RedisConfig::from_url(&format!(
        "redis://127.0.0.1:{}/?timeout=500ms&connect_timeout=300ms",
        s.proxy.port()
    ))
    .unwrap();
    let started = Instant::now();
    let r = timeout(Duration::from_secs(10), RedisStore::connect(cfg))
        .await
        .expect("connect hung");
    assert!(started.elapsed() <= bound);
    // (A blackholed TCP accept "connects"; without AUTH nothing is asked at connect time.)
    drop(r);
    // The lease client: a waiting acquire ends by its deadline.
    let client = LeaseClient::new(
        s.store.clone(),
        LeaseConfig::new(Duration::from_secs(3)).unwrap(),
    );
    let started = Instant::now();
    let r = timeout(
        Duration::from_secs(10),
        client.acquire("job:blackhole-2", Duration::from_secs(1)),
    )
    .await
    .expect("acquire hung");
    assert!(r.is_err());
    assert!(started.elapsed() <= Duration::from_secs(1) + bound);
    // Back to normal: the suspect connection was dropped, calls work again.
    s.proxy.set_mode(ProxyMode::Pass);
    let info = s.store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.owner, owner);
    assert_eq!(
        s.store.release(&k, &owner).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// The proxy swallows the request bytes of a call that the caller then cancels; a
/// connection reused after that would hand each later call the reply of an earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swallowed_requests_never_shift_replies() {
    let s = Standalone::start().await;
    let ttl = Duration::from_secs(5);
    let (a, b) = (key("job:shift-a"), key("job:shift-b"));
    let (oa, ob) = (OwnerToken::random(), OwnerToken::random());
    s.store.acquire(&a, &oa, ttl).await.unwrap();
    s.proxy.set_mode(ProxyMode::Blackhole);
    for _ in 0..3 {
        let _ = timeout(Duration::from_millis(100), s.store.inspect(&a)).await;
    }
    s.proxy.set_mode(ProxyMode::Pass);
    for _ in 0..20 {
        let info = s.store.inspect(&a).await.unwrap().unwrap();
        assert_eq!(info.owner, oa);
        match s.store.acquire(&b, &ob, ttl).await.unwrap() {
            AcquireOutcome::Acquired { .. } => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(s.store.inspect(&b).await.unwrap().unwrap().owner, ob);
    }
}

// ---------------------------------------------------------------------------------------
// Rows 9 and 10: restarts.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_09_restart_without_persistence_holder_loses_fence_grows() {
    let _proof = proves(Backend::Redis, Fault::RestartWithoutPersistence);
    let s = Standalone::start().await;
    let ttl = Duration::from_secs(2);
    let client = LeaseClient::new(s.store.clone(), LeaseConfig::new(ttl).unwrap());
    let k = key("job:restart");
    let lease = client.try_acquire(&k).await.unwrap();
    let before = lease.fence();
    // A clean restart of a server without persistence loses everything.
    tokio::task::block_in_place(|| s.server.stop_and_restart());
    assert_eq!(
        s.cli(&["EXISTS", &s.store.fence_key(&k)]).await,
        "0",
        "data lost"
    );
    let reason = timeout(ttl * 2, lease.lost())
        .await
        .expect("the holder's renewal reports the loss");
    assert_eq!(reason, LostReason::NotOwner);
    let next = client.try_acquire(&k).await.unwrap();
    assert!(
        next.fence() > before,
        "fence went back after the restart: {} <= {before}",
        next.fence()
    );
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_09_restart_with_persistence_keeps_the_lease() {
    let _proof = proves(Backend::Redis, Fault::RestartWithPersistence);
    let s = Standalone::start_with(RedisOptions::new().appendonly(true), |b| b).await;
    let k = key("job:persisted");
    let owner = OwnerToken::random();
    let ttl = Duration::from_secs(20);
    let fence = match s.store.acquire(&k, &owner, ttl).await.unwrap() {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("{other:?}"),
    };
    tokio::task::block_in_place(|| s.server.stop_and_restart());
    let mut info = None;
    for _ in 0..5 {
        match s.store.inspect(&k).await {
            Ok(i) => {
                info = i;
                break;
            }
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
    }
    let info = info.expect("the lease survived the restart");
    assert_eq!((info.owner, info.fence), (owner, fence));
    assert_eq!(
        s.store.renew(&k, &owner, ttl).await.unwrap(),
        RenewOutcome::Renewed { ttl }
    );
    assert_eq!(
        s.store.release(&k, &owner).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// A `kill -9` of a server with the append-only file on (`appendfsync everysec`, the
/// default) right after a grant: Redis wrote the grant to the file before it replied, and
/// the kernel keeps what was written when the process dies, so the restarted server has
/// the lease with its owner and fence. Nobody else gets it, the holder's heartbeat renews
/// it, and the next fence after its release is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_09_kill_9_with_appendonly_keeps_the_lease_and_its_fence() {
    let _proof = proves(Backend::Redis, Fault::RestartWithPersistence);
    let s = Standalone::start_with(RedisOptions::new().appendonly(true), |b| b).await;
    let ttl = Duration::from_secs(6);
    let client = LeaseClient::new(s.store.clone(), LeaseConfig::new(ttl).unwrap());
    let k = key("job:kill9-persisted");
    let lease = client.try_acquire(&k).await.unwrap();
    let fence_record = s.cli(&["GET", &s.store.fence_key(&k)]).await;
    // SIGKILL at once (no time for a sync), start again on the same directory.
    tokio::task::block_in_place(|| s.server.restart());
    // The store's connection died with the server: a first call may say so (retryable).
    let mut info = None;
    for _ in 0..5 {
        match s.store.inspect(&k).await {
            Ok(i) => {
                info = Some(i.expect("the lease survived kill -9"));
                break;
            }
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
    }
    let info = info.expect("the store answers after the restart");
    assert_eq!((info.owner, info.fence), (*lease.owner(), lease.fence()));
    assert_eq!(
        s.cli(&["GET", &s.store.fence_key(&k)]).await,
        fence_record,
        "the fence record survived"
    );
    // Nobody else gets it while it is held.
    let other = OwnerToken::random();
    assert!(matches!(
        s.store.acquire(&k, &other, ttl).await.unwrap(),
        AcquireOutcome::Held { .. }
    ));
    // The holder's heartbeat renews it on the restarted server (its deadline moves on).
    let first_deadline = lease.valid_until();
    let end = Instant::now() + ttl;
    while lease.valid_until() == first_deadline {
        assert!(Instant::now() < end, "no renewal after the restart");
        sleep(Duration::from_millis(50)).await;
    }
    assert!(lease.is_valid());
    let old = lease.fence();
    assert!(lease.release().await.unwrap());
    let next = client.try_acquire(&k).await.unwrap();
    assert!(next.fence() > old);
    next.release().await.unwrap();
}

/// An operating-system crash with `appendfsync everysec` (the default) loses the
/// acknowledged writes of the last second: a grant and a renewal made just before it are
/// gone after the restart. Holder H's grant vanished, so a contender acquires at once
/// while H still believes; holder H2's renewal vanished, so the store frees its lease at
/// the expiry of the grant before, earlier than H2's deadline. Fences still rise: the
/// contender's is above H's (the clock floor). Before issue 24 the row said "holds"; this
/// test, asserting that, failed: the contender acquired while H believed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_09_os_crash_with_everysec_loses_the_last_second_fences_still_rise() {
    let _proof = proves(Backend::Redis, Fault::RestartWithPersistence);
    let s = Standalone::start_with(RedisOptions::new().appendonly(true), |b| b).await;
    let ttl = Duration::from_secs(30);
    let config = LeaseConfig::new(ttl).unwrap();
    let client = LeaseClient::new(s.store.clone(), config.clone());
    // H2's lease, granted before the window (synced by the time the window opens).
    let renew_ttl = Duration::from_secs(8);
    let (k2, h2) = (key("job:os-crash-renewed"), OwnerToken::random());
    s.store.acquire(&k2, &h2, renew_ttl).await.unwrap();
    let (k, lease, renewed_at) =
        os_crash::os_crash_after(&s.server, "lh-test:sync-marker", |round| {
            let client = client.clone();
            let (store, k2, h2) = (s.store.clone(), k2.clone(), h2);
            async move {
                let k = key(&format!("job:os-crash-{round}"));
                let lease = client.try_acquire(&k).await.unwrap();
                let renewed_at = Instant::now();
                assert_eq!(
                    store.renew(&k2, &h2, renew_ttl).await.unwrap(),
                    RenewOutcome::Renewed { ttl: renew_ttl }
                );
                (k, lease, renewed_at)
            }
        })
        .await;
    // H's grant is gone: a contender acquires at once, while H still believes (two
    // holders at once: the row says so), with a higher fence (the clock floor).
    let contender = OwnerToken::random();
    let mut got = None;
    for _ in 0..5 {
        match s.store.acquire(&k, &contender, ttl).await {
            Ok(r) => {
                got = Some(r);
                break;
            }
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
    }
    let fence = match got.expect("the store answers after the restart") {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("the lost grant is still there: {other:?}"),
    };
    assert!(
        lease.is_valid(),
        "H stopped believing before the contender's grant"
    );
    assert!(
        fence > lease.fence(),
        "fence went back: {fence} <= {}",
        lease.fence()
    );
    // H2's lease is there (its grant was synced) but its renewal is gone: the store frees
    // it before H2's deadline.
    let info = s
        .store
        .inspect(&k2)
        .await
        .unwrap()
        .expect("H2's grant was synced");
    assert_eq!(info.owner, h2);
    let store_frees_at = Instant::now() + info.remaining.unwrap();
    let h2_deadline = renewed_at + config.validity(renew_ttl);
    assert!(
        store_frees_at < h2_deadline,
        "H2's renewal survived the crash (the store frees the lease {:?} after H2's deadline)",
        store_frees_at - h2_deadline
    );
    // H learns at its next renewal.
    assert_eq!(
        s.store.renew(&k, lease.owner(), ttl).await.unwrap(),
        RenewOutcome::NotOwner
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_10_kill_9_and_immediate_restart_fences_never_go_back() {
    let _proof = proves(Backend::Redis, Fault::RestartWithoutPersistence);
    let s = Standalone::start().await;
    let ttl = Duration::from_secs(5);
    let k = key("job:kill9");
    let mut highest = Fence(0);
    for _ in 0..200 {
        let o = OwnerToken::random();
        let f = match s.store.acquire(&k, &o, ttl).await.unwrap() {
            AcquireOutcome::Acquired { fence, .. } => fence,
            other => panic!("{other:?}"),
        };
        assert!(f > highest);
        highest = f;
        s.store.release(&k, &o).await.unwrap();
    }
    // Leave one holder: its lease dies with the server.
    let holder = OwnerToken::random();
    if let AcquireOutcome::Acquired { fence, .. } = s.store.acquire(&k, &holder, ttl).await.unwrap()
    {
        highest = fence;
    }
    tokio::task::block_in_place(|| s.server.restart()); // SIGKILL, start again at once
    assert_eq!(
        s.cli(&["EXISTS", &s.store.fence_key(&k)]).await,
        "0",
        "the fence key was lost"
    );
    let mut next = None;
    for _ in 0..5 {
        match s.store.acquire(&k, &OwnerToken::random(), ttl).await {
            Ok(AcquireOutcome::Acquired { fence, .. }) => {
                next = Some(fence);
                break;
            }
            Ok(other) => panic!("{other:?}"),
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
    }
    let next = next.expect("acquire after the restart");
    assert!(next > highest, "fence went back: {next} <= {highest}");
    // The old holder's calls say it lost the lease.
    assert_eq!(
        s.store.renew(&k, &holder, ttl).await.unwrap(),
        RenewOutcome::NotOwner
    );
}

// ---------------------------------------------------------------------------------------
// Row 24: acquisitions cancelled in flight leave nothing behind after 3 × TTL.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_24_cancelled_acquires_leave_nothing_behind() {
    let s = Standalone::start().await;
    let ttl = Duration::from_millis(500);
    let client = LeaseClient::new(s.store.clone(), LeaseConfig::new(ttl).unwrap());
    // Slow the link so cancellations land at every stage of a call.
    s.proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(15)));
    let mut cancelled = 0;
    for i in 0..60u64 {
        let k = format!("job:cancel-{}", i % 10);
        let cut = Duration::from_millis(i % 40);
        let (store, client) = (s.store.clone(), client.clone());
        let r = if i % 2 == 0 {
            timeout(cut, async move { client.try_acquire(k).await.map(drop) }).await
        } else {
            timeout(cut, async move {
                store
                    .acquire(&Key::new(k).unwrap(), &OwnerToken::random(), ttl)
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
    assert!(
        cancelled > 10,
        "too few cancellations to mean anything: {cancelled}"
    );
    s.proxy.set_mode(ProxyMode::Pass);
    sleep(ttl * 3).await;
    let left = s
        .cli(&["--scan", "--pattern", "leasehold:{job:cancel-*}"])
        .await;
    assert_eq!(left.trim(), "", "leases left behind");
    assert!(s.store.list("job:cancel-").await.unwrap().is_empty());
    // And the keys are usable.
    let lease = client.try_acquire("job:cancel-0").await.unwrap();
    lease.release().await.unwrap();
}
