//! Credentials and permissions: a sentinel password never leaks; authentication and
//! permission failures are configuration errors, never "busy" and never retried until a
//! wait runs out; everything works for an ACL user limited to the key prefix and the
//! commands leasehold needs.

mod common;

use leasehold_testkit::renderings;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Standalone;
use leasehold_core::WatchStore;
use leasehold_core::{
    Action, Error, Key, LeaseClient, LeaseConfig, OwnerToken, Registry, Store, StoreErrorKind,
};
use leasehold_redis::{RedisConfig, RedisFactory, RedisStore};
use leasehold_testkit::RedisOptions;
use tokio::time::{Instant, sleep};

const SENTINEL: &str = "s3ntinel-PASSWORD-x";
const WRONG: &str = "wr0ng-s3ntinel-PASSWORD-y";

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

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn assert_clean(what: &str, text: &str) {
    for secret in [SENTINEL, WRONG] {
        assert!(!text.contains(secret), "{what} leaks a password:\n{text}");
        // Nor percent-encoded.
        assert!(
            !text.contains(&secret.replace('-', "%2D")),
            "{what}:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_password_never_leaks() {
    let log = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer({
            let log = log.clone();
            move || log.clone()
        })
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let s = Standalone::start_with(RedisOptions::new().password(SENTINEL), |b| b).await;
    let port = s.server.port();
    let mut seen = String::new();

    // The right password: works; Debug and Display of everything stay clean.
    let url = format!("redis://default:{SENTINEL}@127.0.0.1:{port}/?prefix=sec:");
    let cfg = RedisConfig::from_url(&url).unwrap();
    seen += &format!("{cfg}\n{cfg:?}\n");
    let store = Arc::new(RedisStore::connect(cfg).await.unwrap());
    seen += &format!("{store:?}\n");
    let client = LeaseClient::new(
        store.clone(),
        LeaseConfig::new(Duration::from_secs(1)).unwrap(),
    );
    seen += &format!("{client:?}\n");
    let lease = client.try_acquire("job:secret").await.unwrap();
    seen += &format!("{lease:?}\n");
    sleep(Duration::from_millis(700)).await; // a renewal or two
    assert!(lease.release().await.unwrap());

    // The wrong password: a configuration error, clean.
    let bad_url = format!("redis://default:{WRONG}@127.0.0.1:{port}/");
    let e = RedisStore::open(&bad_url).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    seen += &renderings(&e);
    let mut registry = Registry::new();
    registry.register(Arc::new(RedisFactory));
    let e = registry.open(&bad_url).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    seen += &renderings(&e);
    // ... also when it surfaces at the first operation of a lazily connected store.
    let lazy = Arc::new(RedisStore::new(RedisConfig::from_url(&bad_url).unwrap()).unwrap());
    seen += &format!("{lazy:?}\n");
    let client = LeaseClient::new(lazy, LeaseConfig::new(Duration::from_secs(1)).unwrap());
    let err = client
        .acquire("job:secret", Duration::from_secs(5))
        .await
        .unwrap_err();
    seen += &format!("{err}\n{err:?}\n");
    // Bad URLs and unreachable servers with the password in the URL.
    for url in [
        format!("redis://default:{SENTINEL}@127.0.0.1:notaport/"),
        format!("redis://default:{SENTINEL}@127.0.0.1:{port}/?bogus=1"),
        format!("rediss://default:{SENTINEL}@127.0.0.1:{port}/?tls_ca=/nonexistent.pem"),
        format!(
            "redis+cluster://default:{SENTINEL}@127.0.0.1:{},127.0.0.1:1/",
            leasehold_testkit::free_port()
        ),
        format!(
            "redis://default:{SENTINEL}@127.0.0.1:{}/",
            leasehold_testkit::free_port()
        ),
        format!("bogus://default:{SENTINEL}@127.0.0.1:{port}/"),
    ] {
        let e = registry.open(&url).await.unwrap_err();
        seen += &renderings(&e);
    }
    // The server disappears under a store that knows the password.
    s.server.kill();
    let e = store
        .inspect(&Key::new("job:secret").unwrap())
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "{e}");
    seen += &renderings(&e);

    assert_clean("Debug/Display/errors", &seen);
    let logged = log.text();
    assert!(
        logged.contains("acquire"),
        "the log captured nothing:\n{logged}"
    );
    assert_clean("the tracing log", &logged);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_failures_are_config_errors_and_not_retried() {
    let s = Standalone::start_with(RedisOptions::new().password(SENTINEL), |b| b).await;
    let port = s.server.port();
    for url in [
        // Wrong password: AUTH fails when connecting.
        format!("redis://:{WRONG}@127.0.0.1:{port}/"),
        // Unknown user.
        format!("redis://nobody:{SENTINEL}@127.0.0.1:{port}/"),
        // No password: the connection works, every command answers NOAUTH.
        format!("redis://127.0.0.1:{port}/"),
    ] {
        let store = Arc::new(RedisStore::new(RedisConfig::from_url(&url).unwrap()).unwrap());
        let e = store
            .acquire(
                &Key::new("job:auth").unwrap(),
                &OwnerToken::random(),
                Duration::from_secs(1),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config, "{url}: {e}");
        assert_eq!(e.action(), Action::Reconfigure);
        assert!(!e.is_retryable());
        let client = LeaseClient::new(store, LeaseConfig::new(Duration::from_secs(1)).unwrap());
        let started = Instant::now();
        match client.acquire("job:auth", Duration::from_secs(20)).await {
            Err(Error::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Config, "{e}"),
            other => panic!("{url}: expected a Config error, got {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "an authentication failure was retried"
        );
    }
}

/// The ACL rules leasehold needs on a standalone server, for keys and channels under
/// `prefix` (the README shows the same line).
fn acl_rules(prefix: &str) -> Vec<String> {
    [
        "on",
        ">acl-pass",
        "resetkeys",
        &format!("~{prefix}*"),
        "resetchannels",
        &format!("&{prefix}*"),
        "-@all",
        "+evalsha",
        "+script|load",
        "+get",
        "+set",
        "+pexpire",
        "+pttl",
        "+del",
        "+exists",
        "+time",
        // The waiting queue (a sorted set and a hash per key, while someone waits).
        "+zadd",
        "+zrange",
        "+zrem",
        "+zcard",
        "+hset",
        "+hget",
        "+hdel",
        "+publish",
        "+subscribe",
        "+unsubscribe",
        "+scan",
        // Reading maxmemory-policy (`INFO memory`) when connecting: docs/faults.md row 25.
        "+info",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Runs every operation as an ACL user.
async fn exercise_everything(store: Arc<RedisStore>) {
    let k = Key::new("job:acl").unwrap();
    let client = LeaseClient::new(
        store.clone(),
        LeaseConfig::new(Duration::from_secs(1)).unwrap(),
    );
    let lease = client
        .try_acquire(&k)
        .await
        .expect("acquire as the ACL user");
    sleep(Duration::from_millis(800)).await; // renewals
    assert!(lease.is_valid(), "renewals work");
    let info = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.fence, lease.fence());
    let listed = store.list("job:").await.expect("list as the ACL user");
    assert_eq!(listed.len(), 1);
    // A waiter (pub/sub) gets the lease on release.
    let waiter = {
        let client = client.clone();
        let k = k.clone();
        tokio::spawn(async move { client.acquire(&k, Duration::from_secs(10)).await })
    };
    sleep(Duration::from_millis(300)).await;
    assert!(lease.release().await.unwrap());
    let next = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("the waiter is notified")
        .unwrap()
        .unwrap();
    assert!(next.fence() > info.fence);
    let broken = store.break_lease(&k).await.unwrap();
    assert!(broken > next.fence());
    assert!(!next.release().await.unwrap());
    // A watch (SET and PUBLISH in its script, SUBSCRIBE) hears a grant.
    {
        use futures::StreamExt;
        let w = Key::new("job:acl-watch").unwrap();
        let mut changes = store.watch(&w).await.expect("watch as the ACL user");
        let me = OwnerToken::random();
        store
            .acquire(&w, &me, Duration::from_secs(5))
            .await
            .expect("acquire a watched key as the ACL user");
        let notice = tokio::time::timeout(Duration::from_secs(5), changes.next()).await;
        assert!(matches!(notice, Ok(Some(Ok(())))), "{notice:?}");
        store.release(&w, &me).await.unwrap();
    }
    // Records (GET and SET inside their scripts; EXISTS and PUBLISH for watchers).
    let r = Key::new("election/acl").unwrap();
    let stored = store
        .put_record(&r, broken, b"leader")
        .await
        .expect("put_record as the ACL user");
    assert_eq!(stored.fence, broken);
    let got = store
        .get_record(&r)
        .await
        .expect("get_record as the ACL user");
    assert_eq!(got.map(|r| r.value), Some(b"leader".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_acl_user_standalone() {
    let s = Standalone::start().await;
    let prefix = "acl-app:";
    let mut args = vec![
        "ACL".to_owned(),
        "SETUSER".to_owned(),
        "leasehold".to_owned(),
    ];
    args.extend(acl_rules(prefix));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(s.cli(&argv).await, "OK");
    // Start without cached scripts, so SCRIPT LOAD is exercised too.
    s.cli(&["SCRIPT", "FLUSH"]).await;
    let url = format!(
        "redis://leasehold:acl-pass@127.0.0.1:{}/?prefix={prefix}",
        s.server.port()
    );
    let store = Arc::new(RedisStore::open(&url).await.unwrap());
    exercise_everything(store).await;
    // The user was refused nothing (the ACL log records every denial).
    assert_eq!(s.cli(&["ACL", "LOG"]).await, "", "ACL denials");

    // Outside its prefix, the same user is refused: a configuration error.
    let url = format!(
        "redis://leasehold:acl-pass@127.0.0.1:{}/?prefix=other:",
        s.server.port()
    );
    let store = RedisStore::open(&url).await.unwrap();
    let e = store
        .acquire(
            &Key::new("job:acl").unwrap(),
            &OwnerToken::random(),
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(e.to_string().contains("permission"), "{e}");
    // Without EVALSHA (but with INFO, so that it opens): a configuration error too.
    s.cli(&[
        "ACL", "SETUSER", "noeval", "on", ">x", "~*", "&*", "-@all", "+get", "+info",
    ])
    .await;
    let url = format!("redis://noeval:x@127.0.0.1:{}/", s.server.port());
    let store = RedisStore::open(&url).await.unwrap();
    let e = store
        .inspect(&Key::new("job:acl").unwrap())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_acl_user_cluster() {
    let c = common::Cluster::start().await;
    let prefix = "acl-app:";
    let mut args = vec![
        "ACL".to_owned(),
        "SETUSER".to_owned(),
        "leasehold".to_owned(),
    ];
    args.extend(acl_rules(prefix));
    // Cluster topology discovery and its connection check; sharded release
    // notifications.
    args.extend(
        [
            "+cluster|slots",
            "+ping",
            "+spublish",
            "+ssubscribe",
            "+sunsubscribe",
        ]
        .map(str::to_owned),
    );
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    for node in c.cluster.nodes() {
        let node_argv = argv.clone();
        assert_eq!(node.cli(&node_argv), "OK");
        node.cli(&["SCRIPT", "FLUSH"]);
    }
    let cfg = c
        .config
        .clone()
        .into_builder()
        .username("leasehold")
        .password("acl-pass")
        .prefix(prefix)
        .build()
        .unwrap();
    // A wrong password on a Cluster: a configuration error too.
    let wrong = cfg.clone().into_builder().password(WRONG).build().unwrap();
    let e = RedisStore::connect(wrong).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_clean("cluster auth error", &renderings(&e));
    for node in c.cluster.nodes() {
        node.cli(&["ACL", "LOG", "RESET"]);
    }
    let store = Arc::new(RedisStore::connect(cfg).await.unwrap());
    exercise_everything(store).await;
    for node in c.cluster.nodes() {
        assert_eq!(
            node.cli(&["ACL", "LOG"]),
            "",
            "ACL denials on port {}",
            node.port()
        );
    }
}

/// A user that may not run `INFO` cannot show that the server never evicts keys: the
/// store refuses to open (fail closed) with a configuration error that names what to
/// grant, unless the URL accepts eviction explicitly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_user_without_info_is_refused_clearly() {
    let s = Standalone::start().await;
    let prefix = "acl-app:";
    let mut args = vec!["ACL".to_owned(), "SETUSER".to_owned(), "noinfo".to_owned()];
    args.extend(acl_rules(prefix));
    args.push("-info".to_owned());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(s.cli(&argv).await, "OK");
    let url = format!(
        "redis://noinfo:acl-pass@127.0.0.1:{}/?prefix={prefix}",
        s.server.port()
    );
    let e = RedisStore::open(&url).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(!e.is_retryable());
    let text = e.to_string();
    for needle in ["+info", "maxmemory-policy", "allow_eviction=true"] {
        assert!(text.contains(needle), "`{needle}` missing from: {text}");
    }
    // Accepted explicitly: works without INFO, and says it may evict.
    let store = Arc::new(
        RedisStore::open(&format!("{url}&allow_eviction=true"))
            .await
            .unwrap(),
    );
    assert!(store.capabilities().may_evict);
    let client = LeaseClient::new(store, LeaseConfig::new(Duration::from_secs(1)).unwrap());
    let lease = client.try_acquire("job:noinfo").await.unwrap();
    assert!(lease.release().await.unwrap());
}
