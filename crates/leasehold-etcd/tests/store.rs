//! etcd-specific behaviour beyond the shared suite: granted TTLs, the fence as the key's
//! create revision (across deletes, re-creates and restarts), typed errors for bad URLs
//! and a corrupt value, and credentials that never show.

mod common;

use std::time::Duration;

use common::Solo;
use leasehold_core::WaitStore;
use leasehold_core::{
    AcquireOutcome, Fence, Key, OwnerToken, ReleaseOutcome, RenewOutcome, Store, StoreErrorKind,
};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::EtcdServer;
use leasehold_testkit::proof::{Backend, Fault, proves};

fn key(name: &str) -> Key {
    Key::new(format!("etcd-test:{name}")).unwrap()
}

fn acquired(o: AcquireOutcome) -> (Fence, Duration) {
    match o {
        AcquireOutcome::Acquired { fence, ttl } => (fence, ttl),
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// The key's create revision and lease id, read with a raw client.
async fn raw_kv(s: &Solo, k: &Key) -> Option<(i64, i64)> {
    let mut raw = s.raw().await;
    let resp = raw.get(s.store.lease_key(k), None).await.unwrap();
    resp.kvs()
        .first()
        .map(|kv| (kv.create_revision(), kv.lease()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_ttl_is_rounded_up_to_whole_seconds_and_reported() {
    let s = Solo::start().await;
    let k = key("rounding");
    let a = OwnerToken::random();
    // 1.2 s is granted as 2 s (the test server's minimum is 1 s).
    let (fa, ttl) = acquired(
        s.store
            .acquire(&k, &a, Duration::from_millis(1200))
            .await
            .unwrap(),
    );
    assert_eq!(ttl, Duration::from_secs(2));
    let mut raw = s.raw().await;
    let (_, lease) = raw_kv(&s, &k).await.unwrap();
    let ttl_resp = raw.lease_time_to_live(lease, None).await.unwrap();
    assert_eq!(
        ttl_resp.granted_ttl(),
        2,
        "etcd granted what the store reported"
    );
    // A renewal asking for more moves the key onto a longer lease: same fence.
    match s
        .store
        .renew(&k, &a, Duration::from_millis(2500))
        .await
        .unwrap()
    {
        RenewOutcome::Renewed { ttl } => assert_eq!(ttl, Duration::from_secs(3)),
        other => panic!("{other:?}"),
    }
    let (_, lease2) = raw_kv(&s, &k).await.unwrap();
    assert_ne!(lease, lease2, "a longer TTL needs a new etcd lease");
    assert_eq!(
        raw.lease_time_to_live(lease, None).await.unwrap().ttl(),
        -1,
        "the old etcd lease is revoked"
    );
    // Asking for less keeps the longer grant and says so.
    match s.store.renew(&k, &a, Duration::from_secs(1)).await.unwrap() {
        RenewOutcome::Renewed { ttl } => assert_eq!(ttl, Duration::from_secs(3)),
        other => panic!("{other:?}"),
    }
    let info = s.store.inspect(&k).await.unwrap().expect("held");
    assert_eq!((info.owner, info.fence), (a, fa), "renewals keep the fence");
    assert!(info.remaining.unwrap() <= Duration::from_secs(3));
    // A same-owner re-acquire (a retry after an ambiguous reply) keeps the fence too.
    let (again, ttl) = acquired(
        s.store
            .acquire(&k, &a, Duration::from_secs(3))
            .await
            .unwrap(),
    );
    assert_eq!((again, ttl), (fa, Duration::from_secs(3)));
    assert_eq!(
        s.store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_is_the_create_revision_and_rises_across_delete_and_recreate() {
    let s = Solo::start().await;
    let k = key("revision");
    let mut last = Fence(0);
    for _ in 0..3 {
        let a = OwnerToken::random();
        let (f, _) = acquired(
            s.store
                .acquire(&k, &a, Duration::from_secs(5))
                .await
                .unwrap(),
        );
        let (create_revision, _) = raw_kv(&s, &k).await.unwrap();
        assert_eq!(f.get(), u64::try_from(create_revision).unwrap());
        assert!(f > last, "{f} after {last}");
        last = f;
        // Writes to other keys advance the cluster revision in between.
        let other = key("revision-other");
        let o = OwnerToken::random();
        s.store
            .acquire(&other, &o, Duration::from_secs(5))
            .await
            .unwrap();
        s.store.release(&other, &o).await.unwrap();
        s.store.release(&k, &a).await.unwrap();
    }
    // A break returns a fence above the broken one, and the next grant is above that.
    let a = OwnerToken::random();
    let (f, _) = acquired(
        s.store
            .acquire(&k, &a, Duration::from_secs(5))
            .await
            .unwrap(),
    );
    let broken = s.store.break_lease(&k).await.unwrap();
    assert!(broken > f);
    assert_eq!(
        s.store.renew(&k, &a, Duration::from_secs(5)).await.unwrap(),
        RenewOutcome::NotOwner
    );
    let b = OwnerToken::random();
    let (fb, _) = acquired(
        s.store
            .acquire(&k, &b, Duration::from_secs(5))
            .await
            .unwrap(),
    );
    assert!(fb > broken);
}

/// Retries `f` while the store reconnects after a restart.
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, leasehold_core::StoreError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_lease_and_fences_survive_an_etcd_crash_restart() {
    let _proof = proves(Backend::Etcd, Fault::RestartWithPersistence);
    let s = Solo::start().await;
    let k = key("restart");
    let a = OwnerToken::random();
    let (fa, _) = acquired(
        s.store
            .acquire(&k, &a, Duration::from_secs(30))
            .await
            .unwrap(),
    );
    let freed = key("restart-freed");
    let b = OwnerToken::random();
    let (fb, _) = acquired(
        s.store
            .acquire(&freed, &b, Duration::from_secs(30))
            .await
            .unwrap(),
    );
    s.store.release(&freed, &b).await.unwrap();

    let server = s.server.clone();
    tokio::task::spawn_blocking(move || server.restart())
        .await
        .unwrap(); // kill -9, start

    // The same store reconnects by itself; the held lease is still there, same fence.
    let info = eventually("inspect after restart", || s.store.inspect(&k)).await;
    let info = info.expect("a held lease survives the restart");
    assert_eq!((info.owner, info.fence), (a, fa));
    // Held: nobody else gets it.
    let other = OwnerToken::random();
    match eventually("contend after restart", || {
        s.store.acquire(&k, &other, Duration::from_secs(5))
    })
    .await
    {
        AcquireOutcome::Held { .. } => {}
        other => panic!("a second owner got the held lease after the restart: {other:?}"),
    }
    match eventually("renew after restart", || {
        s.store.renew(&k, &a, Duration::from_secs(30))
    })
    .await
    {
        RenewOutcome::Renewed { .. } => {}
        other => panic!("{other:?}"),
    }
    // A new grant after the restart gets a higher fence than any before it.
    let c = OwnerToken::random();
    let (fc, _) = acquired(
        eventually("acquire after restart", || {
            s.store.acquire(&freed, &c, Duration::from_secs(5))
        })
        .await,
    );
    assert!(fc > fb && fc > fa, "{fc} after {fb} and {fa}");
}

/// etcd's leader renews every lease by its whole TTL when it takes office, a restarted
/// single server included (the lessor's promotion): the lease of a holder that died before
/// the restart outlives its own expiry by the time already run, so a contender waits for
/// it from the restart on. The chaos checker's C9 takeover bound counts on it (docs/chaos.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_gives_a_dead_holders_lease_a_fresh_ttl() {
    let s = Solo::start().await;
    let k = key("dead-holder-restart");
    let ttl = Duration::from_secs(3);
    let sent = tokio::time::Instant::now();
    // A bare store call: nothing renews it, as if its holder had died.
    acquired(
        s.store
            .acquire(&k, &OwnerToken::random(), ttl)
            .await
            .unwrap(),
    );
    tokio::time::sleep_until(sent + Duration::from_secs(2)).await;
    let killed = tokio::time::Instant::now();
    let server = s.server.clone();
    tokio::task::spawn_blocking(move || server.restart())
        .await
        .unwrap(); // kill -9, start, healthy
    let back = tokio::time::Instant::now();
    let freed = loop {
        let info = eventually("inspect after restart", || s.store.inspect(&k)).await;
        if info.is_none() {
            break tokio::time::Instant::now();
        }
        assert!(
            back.elapsed() < ttl + Duration::from_secs(5),
            "the lease outlived the restart by far more than a TTL"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // From the restart, however long etcd took to come back (a restart longer than the TTL
    // alone would pass the first check): the renewal is made when the restarted member
    // takes office, moments before it reports healthy.
    assert!(
        freed >= killed + ttl && freed + Duration::from_secs(1) >= back + ttl,
        "freed {:?} after the kill, {:?} after etcd was back, {:?} after the grant: the \
         restart renewed nothing (its own expiry was {:?} after the grant)",
        freed - killed,
        freed - back,
        freed - sent,
        ttl
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_value_is_a_typed_error_never_free() {
    let s = Solo::start().await;
    let k = key("corrupt");
    let mut raw = s.raw().await;
    raw.put(s.store.lease_key(&k), "not a lease", None)
        .await
        .unwrap();
    let a = OwnerToken::random();
    let e = s
        .store
        .acquire(&k, &a, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
    let e = s.store.inspect(&k).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
    let resp = raw.get(s.store.lease_key(&k), None).await.unwrap();
    assert_eq!(resp.kvs()[0].value(), b"not a lease", "never overwritten");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_are_config_errors_and_a_dead_address_is_not() {
    for bad in [
        "etcd://",
        "etcd://127.0.0.1",
        "etcd://127.0.0.1:0",
        "etcd://127.0.0.1:99999",
        "etcd://127.0.0.1:2379?nope=1",
        "etcd://127.0.0.1:2379?timeout=forever",
        "etcd://127.0.0.1:2379/path",
        "etcds://127.0.0.1:2379",
    ] {
        let e = EtcdStore::open(bad).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config, "{bad}: {e}");
    }
    // Nothing listens there: unreachable, retryable, not a configuration error.
    let port = leasehold_testkit::free_port();
    let e = EtcdStore::open(&format!(
        "etcd://127.0.0.1:{port}?timeout=1s&connect_timeout=500ms"
    ))
    .await
    .unwrap_err();
    assert!(e.is_retryable(), "{:?}: {e}", e.kind());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_work_and_never_show() {
    const SENTINEL: &str = "sentinel-pw-5d1c";
    let server = tokio::task::spawn_blocking(EtcdServer::start)
        .await
        .unwrap();
    let mut raw =
        etcd_client::Client::connect([format!("http://127.0.0.1:{}", server.port())], None)
            .await
            .unwrap();
    let _ = raw.role_add("root").await;
    raw.user_add("root", SENTINEL, None).await.unwrap();
    raw.user_grant_role("root", "root").await.unwrap();
    raw.auth_enable().await.unwrap();

    let url = format!("etcd://root:{SENTINEL}@127.0.0.1:{}", server.port());
    let store = EtcdStore::open(&url).await.expect("open with credentials");
    let shown = format!("{store:?} {:?} {}", store.config(), store.config());
    assert!(!shown.contains(SENTINEL), "{shown}");
    let k = key("auth");
    let a = OwnerToken::random();
    acquired(store.acquire(&k, &a, Duration::from_secs(5)).await.unwrap());
    assert_eq!(
        store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::Released
    );

    // A wrong password: a configuration error that names neither password.
    let wrong = format!("etcd://root:{SENTINEL}-wrong@127.0.0.1:{}", server.port());
    let e = EtcdStore::open(&wrong).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let text = format!(
        "{e} {e:?} {}",
        std::error::Error::source(&e)
            .map(|s| s.to_string())
            .unwrap_or_default()
    );
    assert!(!text.contains(SENTINEL), "{text}");
    // No credentials at all: also a configuration error.
    let e = EtcdStore::open(&server.url()).await.map(|_| ());
    let e = match e {
        Err(e) => e,
        // Connecting without credentials may succeed; the first operation is refused.
        Ok(()) => {
            let store = EtcdStore::connect(EtcdConfig::from_url(&server.url()).unwrap())
                .await
                .unwrap();
            store
                .acquire(&k, &a, Duration::from_secs(5))
                .await
                .unwrap_err()
        }
    };
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_released_is_woken_by_release_break_and_expiry_not_by_renewal() {
    let s = Solo::start().await;
    let k = key("wait");
    let w = OwnerToken::random();
    let long = Duration::from_secs(30);
    // A free key: at once.
    let started = tokio::time::Instant::now();
    s.store.wait_released(&k, &w, long).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));

    // Held: renewals (including a move to a longer lease) do not wake it; the timeout
    // ends it with Ok.
    let a = OwnerToken::random();
    acquired(
        s.store
            .acquire(&k, &a, Duration::from_secs(5))
            .await
            .unwrap(),
    );
    let waiter = {
        let (store, k) = (s.store.clone(), k.clone());
        tokio::spawn(async move {
            store
                .wait_released(&k, &w, Duration::from_millis(1500))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.store.renew(&k, &a, Duration::from_secs(5)).await.unwrap();
    s.store.renew(&k, &a, Duration::from_secs(8)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "a renewal woke the waiter");
    waiter.await.unwrap().unwrap();
    assert!(s.store.inspect(&k).await.unwrap().is_some());

    // Woken by a release, long before the TTL.
    for how in ["release", "break"] {
        if s.store.inspect(&k).await.unwrap().is_none() {
            acquired(
                s.store
                    .acquire(&k, &a, Duration::from_secs(20))
                    .await
                    .unwrap(),
            );
        }
        let started = tokio::time::Instant::now();
        let waiter = {
            let (store, k) = (s.store.clone(), k.clone());
            tokio::spawn(async move { store.wait_released(&k, &w, long).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "{how}: returned while held");
        match how {
            "release" => {
                s.store.release(&k, &a).await.unwrap();
            }
            _ => {
                s.store.break_lease(&k).await.unwrap();
            }
        }
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap_or_else(|_| panic!("{how}: the waiter was not woken"))
            .unwrap()
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(6), "{how}");
        // The woken waiter is first in line: it confirms with its own acquire (nobody
        // else would get past its queue entry), then lets go.
        acquired(
            s.store
                .acquire(&k, &w, Duration::from_secs(5))
                .await
                .unwrap(),
        );
        s.store.release(&k, &w).await.unwrap();
    }

    // Woken by the expiry of the holder's etcd lease.
    acquired(
        s.store
            .acquire(&k, &a, Duration::from_secs(1))
            .await
            .unwrap(),
    );
    let started = tokio::time::Instant::now();
    s.store.wait_released(&k, &w, long).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "expiry took {:?}",
        started.elapsed()
    );
    assert_eq!(s.store.inspect(&k).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_released_outlives_the_operation_timeout() {
    let s = Solo::start().await;
    let k = key("wait-long");
    let a = OwnerToken::random();
    let w = OwnerToken::random();
    acquired(
        s.store
            .acquire(&k, &a, Duration::from_secs(20))
            .await
            .unwrap(),
    );
    let started = tokio::time::Instant::now();
    let waiter = {
        let (store, k) = (s.store.clone(), k.clone());
        tokio::spawn(async move { store.wait_released(&k, &w, Duration::from_secs(30)).await })
    };
    // Longer than the store's operation timeout (2 s): the watch must still be there.
    tokio::time::sleep(common::OP_TIMEOUT + Duration::from_secs(1)).await;
    assert!(
        !waiter.is_finished(),
        "the watch ended with the operation timeout: {:?}",
        waiter.await
    );
    s.store.release(&k, &a).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// A release after the lease's TTL ran out answers `NotOwner` (as on the other stores),
/// also while etcd has not yet deleted the key (its expiry loop runs every 500 ms). Each
/// trial releases at a different point after the TTL; the test checks with a raw read
/// that some releases did land in that window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_ttl_ran_out_is_not_owner_even_before_etcd_deletes_the_key() {
    let s = Solo::start().await;
    let store = s.direct().await;
    let mut in_window = 0;
    for trial in 0..12u64 {
        let k = key(&format!("late-{trial}"));
        let a = OwnerToken::random();
        let (_, granted) = acquired(store.acquire(&k, &a, Duration::from_secs(1)).await.unwrap());
        // Past the TTL on etcd's clock (the grant was sent before this point), by 50 to
        // 600 ms: before or after etcd's expiry loop has run.
        tokio::time::sleep(granted + Duration::from_millis(50 + 50 * trial)).await;
        let key_still_there = raw_kv(&s, &k).await.is_some();
        let outcome = store.release(&k, &a).await.unwrap();
        assert_eq!(
            outcome,
            ReleaseOutcome::NotOwner,
            "trial {trial}: released after its TTL (key still in etcd: {key_still_there})"
        );
        in_window += u32::from(key_still_there);
    }
    assert!(
        in_window > 0,
        "no release landed between the TTL and etcd's deletion of the key: the test proved nothing"
    );
}

/// `Held { remaining }` is never zero while the key is there: etcd reports whole seconds
/// rounded down, and a holder in its last second holds the key up to a second longer (plus
/// etcd's expiry delay). A zero would make a waiting client spin instead of queueing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_in_its_last_second_reports_at_least_a_second() {
    let s = Solo::start().await;
    let k = key("last-second");
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    let (_, granted) = acquired(
        s.store
            .acquire(&k, &a, Duration::from_secs(1))
            .await
            .unwrap(),
    );
    assert_eq!(granted, Duration::from_secs(1));
    // Less than a second left: etcd's time-to-live answers 0.
    match s
        .store
        .acquire(&k, &b, Duration::from_secs(5))
        .await
        .unwrap()
    {
        AcquireOutcome::Held { remaining: Some(r) } => {
            assert!(r >= Duration::from_secs(1), "remaining {r:?}")
        }
        other => panic!("expected Held with a remaining TTL, got {other:?}"),
    }
}
