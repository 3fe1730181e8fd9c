//! A least-privilege ACL user on the sentinels, over TLS: a private primary, replica and
//! three TLS-only sentinels whose `default` user is off (they reach each other as an
//! administrative user of the test kit's), with ACL users allowed only what the store
//! sends to a sentinel:
//!
//! - the store works through [`LEAST_PRIVILEGE`] — grants, renewals, records, releases, a
//!   fail-over heard on `+switch-master` — and no sentinel's `ACL LOG` records a denial;
//! - a user without `SENTINEL GET-MASTER-ADDR-BY-NAME` is refused at once with a typed
//!   permission error naming the command, and no password shows.
//!
//! docs/connections.md, "The least-privilege sentinel user", documents the rule.

use leasehold_testkit::renderings;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Fence, Key, OwnerToken, Refusal, ReleaseOutcome, RenewOutcome, Store,
    StoreErrorKind,
};
use leasehold_redis::RedisStore;
use leasehold_testkit::RedisSentinelSet;
use tokio::time::{Instant, sleep};

/// What the store sends to a sentinel: `AUTH`, `SENTINEL GET-MASTER-ADDR-BY-NAME` and
/// `SENTINEL MASTER` (the primary and its `config-epoch`, on every connection), and
/// `SUBSCRIBE +switch-master` (to drop its connection to a demoted primary at once).
/// `AUTH` and `HELLO` need no rule.
const LEAST_PRIVILEGE: &str = "resetchannels &+switch-master -@all \
     +sentinel|get-master-addr-by-name +sentinel|master +subscribe";
/// [`LEAST_PRIVILEGE`] without `SENTINEL GET-MASTER-ADDR-BY-NAME`.
const WITHOUT_ADDR: &str = "resetchannels &+switch-master -@all +sentinel|master +subscribe";
const USER: &str = "leasehold";
const USER_PW: &str = "lease-s3ntinel-ACL-pw";
const NO_ADDR_USER: &str = "no-addr";
const NO_ADDR_PW: &str = "no-addr-s3ntinel-ACL-pw";

const TTL: Duration = Duration::from_secs(30);
/// Timeouts far above what a refusal may take: an error that comes well before them was
/// not waited for (`REFUSED_WITHIN`).
const PATIENT: &str = "timeout=20s&connect_timeout=20s";
/// How soon a refusal must come, even on a loaded machine: well below `PATIENT`.
const REFUSED_WITHIN: Duration = Duration::from_secs(8);

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

/// A TLS set whose sentinels have the two users above, and no usable `default` user.
async fn acl_set(name: &'static str) -> Arc<RedisSentinelSet> {
    Arc::new(
        blocking(move || {
            RedisSentinelSet::start_with_sentinel_users(
                name,
                &[
                    (USER, USER_PW, LEAST_PRIVILEGE),
                    (NO_ADDR_USER, NO_ADDR_PW, WITHOUT_ADDR),
                ],
                true,
            )
        })
        .await,
    )
}

/// `set`'s URL (`rediss+sentinel://…?tls_ca=…`) with `params` added.
fn url_with(set: &RedisSentinelSet, params: &str) -> String {
    format!("{}&{params}", set.url())
}

fn assert_no_password(what: &str, text: &str) {
    for secret in [USER_PW, NO_ADDR_PW] {
        assert!(!text.contains(secret), "{what} shows a password:\n{text}");
    }
}

/// Acquires, retrying retryable errors (a fail-over in progress) for up to 20 s.
async fn acquire(store: &RedisStore, k: &Key, o: &OwnerToken) -> Fence {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match store.acquire(k, o, TTL).await {
            Ok(AcquireOutcome::Acquired { fence, .. }) => return fence,
            Ok(other) => panic!("expected a grant of {k}, got {other:?}"),
            Err(e) if e.is_retryable() && Instant::now() < end => {
                sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("acquire {k}: {e}"),
        }
    }
}

/// Waits (10 s at most) until a sentinel lists a client of `user` subscribed to a channel
/// (`CLIENT LIST`: `user=NAME … sub=1`).
async fn wait_subscribed(set: &Arc<RedisSentinelSet>, user: &'static str) {
    let set = set.clone();
    let seen = blocking(move || {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let subscribed = (0..3).any(|i| {
                set.sentinel_cli(i, &["CLIENT", "LIST"]).lines().any(|l| {
                    l.split(' ').any(|f| f == format!("user={user}"))
                        && l.split(' ').any(|f| f == "sub=1")
                })
            });
            if subscribed || std::time::Instant::now() > end {
                return subscribed;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await;
    assert!(seen, "no sentinel has a subscriber as {user}");
}

/// Every sentinel's `ACL LOG` (empty when nothing was denied).
async fn acl_logs(set: &Arc<RedisSentinelSet>) -> Vec<String> {
    let set = set.clone();
    blocking(move || {
        (0..3)
            .map(|i| set.sentinel_cli(i, &["ACL", "LOG"]))
            .collect()
    })
    .await
}

/// The store through sentinels that allow it only [`LEAST_PRIVILEGE`]: grant, renew, a
/// record, release; a fail-over, after which the new primary is found and fences keep
/// rising; the `+switch-master` subscription was made as that user; and no sentinel
/// denied it anything. Without sentinel credentials (the `default` user is off) the store
/// is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_sentinel_user_is_enough() {
    let set = acl_set("aclok").await;
    let url = url_with(
        &set,
        &format!(
            "timeout=3s&connect_timeout=3s&prefix=sacl:&sentinel_username={USER}&sentinel_password={USER_PW}"
        ),
    );
    let store = RedisStore::open(&url)
        .await
        .expect("open as the narrow user");
    let k = Key::new("job:sentinel-acl").unwrap();
    let o = OwnerToken::random();
    let f1 = acquire(&store, &k, &o).await;
    assert!(matches!(
        store.renew(&k, &o, TTL).await.unwrap(),
        RenewOutcome::Renewed { .. }
    ));
    let rec = store.put_record(&k, f1, b"narrow").await.unwrap();
    assert_eq!((rec.fence, rec.value.as_slice()), (f1, &b"narrow"[..]));
    assert_eq!(
        store.release(&k, &o).await.unwrap(),
        ReleaseOutcome::Released
    );
    wait_subscribed(&set, USER).await;

    // A fail-over: the store hears of it and finds the new primary, as the narrow user.
    let first = set.primary_port();
    let second = {
        let set = set.clone();
        blocking(move || set.failover()).await
    };
    assert_ne!(first, second);
    let f2 = acquire(&store, &k, &o).await;
    assert!(f2 > f1, "{f2} after {f1}");
    let lease_key = store.lease_key(&k);
    let on_new = {
        let set = set.clone();
        blocking(move || set.server_on(second).cli(&["EXISTS", &lease_key])).await
    };
    assert_eq!(
        on_new, "1",
        "the grant after the fail-over is on the new primary"
    );
    store.release(&k, &o).await.unwrap();
    drop(store);

    // Nothing the store sent was denied (a refused SENTINEL MASTER or SUBSCRIBE would not
    // fail the store, only show here).
    for (i, log) in acl_logs(&set).await.iter().enumerate() {
        assert!(log.is_empty(), "sentinel {i} denied something:\n{log}");
    }

    // The `default` user is off: without the sentinel credentials the store is refused.
    let started = Instant::now();
    let e = RedisStore::open(&url_with(&set, PATIENT))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::Credentials), "{e}");
    assert!(started.elapsed() < REFUSED_WITHIN, "not at once: {e}");
}

/// A sentinel user lacking `SENTINEL GET-MASTER-ADDR-BY-NAME`: refused at once with a
/// non-retryable permission error that names the sentinel and the command denied, and
/// shows no password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_user_without_get_master_addr_is_refused_naming_it() {
    let set = acl_set("aclno").await;
    let url = url_with(
        &set,
        &format!("{PATIENT}&sentinel_username={NO_ADDR_USER}&sentinel_password={NO_ADDR_PW}"),
    );
    let started = Instant::now();
    let e = RedisStore::open(&url).await.map(|_| ()).unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_eq!(e.refusal(), Some(Refusal::Permission), "{e}");
    assert!(!e.is_retryable(), "{e}");
    let text = e.to_string();
    assert!(text.contains("sentinel 127.0.0.1:"), "{text}");
    assert!(text.contains("ACL"), "{text}");
    assert!(
        text.contains("sentinel|get-master-addr-by-name"),
        "the command denied is not named: {text}"
    );
    assert!(
        took < REFUSED_WITHIN,
        "refused after {took:?}, not at once: {e}"
    );
    assert_no_password("a sentinel's ACL refusal", &renderings(&e));
    // The sentinels logged the denial (their `ACL LOG` is read as the kit's admin user).
    let logs = acl_logs(&set).await.join("\n");
    assert!(
        logs.contains(NO_ADDR_USER) && logs.contains("sentinel|get-master-addr-by-name"),
        "{logs}"
    );
}
