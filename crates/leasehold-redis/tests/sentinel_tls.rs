//! Sentinel over TLS (`rediss+sentinel://`) and password-protected sentinels, against a
//! private primary, replica and three sentinels that listen with TLS only (no plaintext
//! port; replication and the sentinels' own connections over TLS too):
//!
//! - grant, renew, release and a record through the sentinels over verified TLS, with a
//!   client certificate, and across a fail-over;
//! - refusals: a plaintext client, a client trusting another CA (typed
//!   [`TlsProblem::UntrustedCertificate`]), a client without the required client
//!   certificate, servers whose certificate names another host (typed
//!   [`TlsProblem::WrongHost`], naming the host);
//! - sentinels with `requirepass` and an ACL user: the sentinels' credentials apart from the
//!   data servers' (`sentinel_password`, `sentinel_username`) or the same
//!   (`sentinel_auth=same`); a wrong or missing sentinel password is a typed credentials
//!   error; no password shows in an error, a `Debug`, a `Display` or a log line.

use leasehold_testkit::renderings;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Fence, Key, OwnerToken, Refusal, ReleaseOutcome, RenewOutcome, Store,
    StoreError, StoreErrorKind,
};
use leasehold_redis::{RedisConfig, RedisStore, TlsFailure, TlsProblem};
use leasehold_testkit::tls::WRONG_HOST;
use leasehold_testkit::{RedisSentinelSet, ServerCert};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(30);
const DATA_PW: &str = "d4ta-PASSWORD-x";
const SENTINEL_PW: &str = "s3ntinel-PASSWORD-x";
const SENTINEL_USER_PW: &str = "acl-s3ntinel-PASSWORD-z";
const WRONG_PW: &str = "wr0ng-s3ntinel-PASSWORD-y";

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

async fn tls_set(name: &'static str, cert: ServerCert, client_auth: bool) -> Arc<RedisSentinelSet> {
    Arc::new(blocking(move || RedisSentinelSet::start_tls(name, cert, client_auth)).await)
}

/// `set`'s URL with `params` added (the URL has a query already when it is a TLS set).
fn url_with(set: &RedisSentinelSet, params: &str) -> String {
    let url = set.url();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}timeout=3s&connect_timeout=2s{params}")
}

/// Timeouts far above what a refusal may take: an error that comes well before them was
/// not waited for (`REFUSED_WITHIN`).
const PATIENT: &str = "timeout=20s&connect_timeout=20s";
/// How soon a refusal (a failed handshake, a refused password) must come, even on a
/// loaded machine: well below the `PATIENT` timeouts.
const REFUSED_WITHIN: Duration = Duration::from_secs(8);

/// `set`'s URL with the `PATIENT` timeouts and `params`.
fn patient_url(set: &RedisSentinelSet, params: &str) -> String {
    let url = set.url();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{PATIENT}{params}")
}

/// `url` with `userinfo@` put in front of its hosts.
fn with_userinfo(url: &str, userinfo: &str) -> String {
    url.replacen("://", &format!("://{userinfo}@"), 1)
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

fn assert_no_password(what: &str, text: &str) {
    for secret in [DATA_PW, SENTINEL_PW, SENTINEL_USER_PW, WRONG_PW] {
        assert!(!text.contains(secret), "{what} shows a password:\n{text}");
        assert!(
            !text.contains(&secret.replace('-', "%2D")),
            "{what} shows a password:\n{text}"
        );
    }
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

/// The TLS failure of `e`, which must be a configuration error.
fn tls_failure(e: &StoreError) -> &TlsFailure {
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(!e.is_retryable(), "{e}");
    TlsFailure::of(e).unwrap_or_else(|| panic!("no TlsFailure behind: {e}"))
}

/// Grant, renew, release and a record through the sentinels, everything over verified TLS
/// with a client certificate (the servers require one); then a fail-over, after which
/// the store reaches the new primary over TLS and fences keep rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_renew_release_record_and_failover_over_tls() {
    let set = tls_set("tlsgrant", ServerCert::Localhost, true).await;
    assert!(set.url().starts_with("rediss+sentinel://"), "{}", set.url());
    let store = RedisStore::open(&url_with(&set, "&prefix=stls:&policy_check=60s"))
        .await
        .unwrap();
    let k = Key::new("job:sentinel-tls").unwrap();
    let o = OwnerToken::random();
    let f1 = acquire(&store, &k, &o).await;
    assert!(matches!(
        store.renew(&k, &o, TTL).await.unwrap(),
        RenewOutcome::Renewed { .. }
    ));
    // The grant is on the primary the sentinels name (read over TLS by redis-cli).
    let lease_key = store.lease_key(&k);
    let on_primary = {
        let (set, lk) = (set.clone(), lease_key.clone());
        blocking(move || set.primary().cli(&["GET", &lk])).await
    };
    assert_eq!(on_primary, format!("{}:{f1}", o.to_hex()));
    // A record, written with the lease's fence and read back.
    let rk = Key::new("config:sentinel-tls").unwrap();
    let rec = store.put_record(&rk, f1, b"over tls").await.unwrap();
    assert_eq!(rec.fence, f1);
    let read = store.get_record(&rk).await.unwrap().expect("the record");
    assert_eq!((read.fence, read.value.as_slice()), (f1, &b"over tls"[..]));
    assert!(matches!(
        store.release(&k, &o).await.unwrap(),
        ReleaseOutcome::Released
    ));
    assert!(store.inspect(&k).await.unwrap().is_none());

    // A fail-over over TLS: the new primary is found and used.
    let first = set.primary_port();
    let second = {
        let set = set.clone();
        blocking(move || set.failover()).await
    };
    assert_ne!(first, second);
    let k2 = Key::new("job:sentinel-tls-2").unwrap();
    let f2 = acquire(&store, &k2, &OwnerToken::random()).await;
    assert!(f2 > f1, "{f2} after {f1}");
    let lk2 = store.lease_key(&k2);
    let on_new = blocking(move || set.server_on(second).cli(&["EXISTS", &lk2])).await;
    assert_eq!(on_new, "1");
}

/// Against TLS-only sentinels and servers: a plaintext client gets nothing it could take
/// for an answer; a client trusting another CA is refused with a typed, non-retryable
/// error naming the host; so is one that lacks the client certificate the servers require.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_wrong_ca_and_missing_client_certificate_are_refused() {
    let set = tls_set("tlsrefuse", ServerCert::Localhost, true).await;
    let tls = set.tls().unwrap().clone();
    let hosts_and_master = set
        .url()
        .split_once("://")
        .map(|(_, rest)| rest.split('?').next().unwrap().to_owned())
        .unwrap();

    // Plaintext to TLS-only sentinels.
    let plain = format!(
        "redis+sentinel://{hosts_and_master}?timeout=1s&connect_timeout=500ms&sentinel_password={SENTINEL_PW}"
    );
    let e = RedisStore::open(&plain).await.map(|_| ()).unwrap_err();
    // The sentinels drop it; the store finds that they speak TLS and says so, typed.
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let t = TlsFailure::of(&e).unwrap_or_else(|| panic!("no TlsFailure: {e}"));
    assert_eq!(t.problem(), TlsProblem::PlaintextRefused, "{e}");
    assert!(e.message().contains("rediss+sentinel://"), "{e}");
    assert_no_password("a plaintext connect's error", &renderings(&e));

    // Another CA: the sentinels' certificates are not trusted.
    let other_ca = format!(
        "rediss+sentinel://{hosts_and_master}?{PATIENT}&tls_ca={}&tls_cert={}&tls_key={}&sentinel_password={SENTINEL_PW}",
        tls.wrong_ca_cert().display(),
        tls.client_cert().display(),
        tls.client_key().display(),
    );
    let started = Instant::now();
    let e = RedisStore::open(&other_ca).await.map(|_| ()).unwrap_err();
    let t = tls_failure(&e);
    assert_eq!(t.problem(), TlsProblem::UntrustedCertificate, "{e}");
    assert_eq!(t.host(), Some("127.0.0.1"), "{e}");
    assert!(e.to_string().contains("sentinel 127.0.0.1:"), "{e}");
    assert!(e.to_string().contains("tls_ca"), "what to do: {e}");
    assert!(
        started.elapsed() < REFUSED_WITHIN,
        "refused at once, not after the timeout"
    );
    // No credentials and no key material in it.
    let text = renderings(&e);
    assert_no_password("a failed TLS handshake to a sentinel", &text);
    let key = std::fs::read_to_string(tls.client_key()).unwrap();
    for line in key.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!text.contains(line), "the key shows: {text}");
    }

    // No client certificate, where the servers require one.
    let no_cert = format!(
        "rediss+sentinel://{hosts_and_master}?tls_ca={}&timeout=2s&connect_timeout=1s",
        tls.ca_cert().display(),
    );
    let e = RedisStore::open(&no_cert).await.map(|_| ()).unwrap_err();
    assert!(
        e.kind() == StoreErrorKind::Config || e.kind() == StoreErrorKind::Unavailable,
        "{e}"
    );
    // Typed when the client reads the server's alert first; else (it wrote first: a
    // broken pipe) the message says what may be missing.
    match TlsFailure::of(&e) {
        Some(t) => assert_eq!(t.problem(), TlsProblem::Other, "{e}"),
        None => assert!(e.message().contains("tls_cert="), "{e}"),
    }
    // A CA file that does not exist: a configuration error before any connection.
    let e = RedisStore::open(&format!(
        "rediss+sentinel://{hosts_and_master}?tls_ca=/nonexistent/ca.pem"
    ))
    .await
    .map(|_| ())
    .unwrap_err();
    assert_eq!(tls_failure(&e).problem(), TlsProblem::Files, "{e}");
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
}

/// Sentinels (and servers) whose certificate names only another host: refused with a
/// typed error naming the host connected to, and what the certificate names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_host_is_refused_naming_the_host() {
    let set = tls_set("tlshost", ServerCert::WrongHost, false).await;
    let e = RedisStore::open(&url_with(&set, ""))
        .await
        .map(|_| ())
        .unwrap_err();
    let t = tls_failure(&e);
    assert_eq!(t.problem(), TlsProblem::WrongHost, "{e}");
    assert_eq!(t.host(), Some("127.0.0.1"), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("does not name the host") && text.contains("`127.0.0.1`"),
        "{text}"
    );
    assert!(
        text.contains(WRONG_HOST),
        "what the certificate names: {text}"
    );
}

/// Sentinels with `requirepass` and an ACL user, data servers with a password of their
/// own, all over TLS: the store works with the sentinels' password and with the ACL
/// user's; a wrong or missing sentinel password is a typed credentials error that shows
/// no password, in the error, the configuration's `Debug`/`Display` or the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_protected_sentinels_take_their_own_credentials() {
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

    let set = Arc::new(
        blocking(|| {
            RedisSentinelSet::start_with_passwords(
                "pwset",
                DATA_PW,
                SENTINEL_PW,
                Some(("watcher", SENTINEL_USER_PW)),
                true,
            )
        })
        .await,
    );
    let base = with_userinfo(&patient_url(&set, "&prefix=spw:"), &format!(":{DATA_PW}"));

    // The sentinels' password (their `default` user).
    let right = format!("{base}&sentinel_password={SENTINEL_PW}");
    let cfg = RedisConfig::from_url(&right).unwrap();
    for shown in [format!("{cfg:?}"), cfg.to_string()] {
        assert_no_password("the configuration", &shown);
    }
    let store = RedisStore::open(&right).await.unwrap();
    let k = Key::new("job:sentinel-pw").unwrap();
    let o = OwnerToken::random();
    acquire(&store, &k, &o).await;
    assert!(matches!(
        store.release(&k, &o).await.unwrap(),
        ReleaseOutcome::Released
    ));
    assert_no_password("the store's Debug", &format!("{store:?}"));
    drop(store);

    // The sentinels' ACL user.
    let acl = format!("{base}&sentinel_username=watcher&sentinel_password={SENTINEL_USER_PW}");
    let store = RedisStore::open(&acl).await.unwrap();
    acquire(&store, &k, &o).await;
    store.release(&k, &o).await.unwrap();
    drop(store);

    // A wrong sentinel password, a missing one, the data password sent to the sentinels
    // (sentinel_auth=same, where they differ): refused, typed, never retried.
    for (what, url) in [
        ("wrong", format!("{base}&sentinel_password={WRONG_PW}")),
        ("missing", base.clone()),
        ("the data password", format!("{base}&sentinel_auth=same")),
        (
            "wrong for the ACL user",
            format!("{base}&sentinel_username=watcher&sentinel_password={WRONG_PW}"),
        ),
    ] {
        let started = Instant::now();
        let e = RedisStore::open(&url).await.map(|_| ()).unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config, "{what}: {e}");
        assert_eq!(e.refusal(), Some(Refusal::Credentials), "{what}: {e}");
        assert!(!e.is_retryable(), "{what}: {e}");
        assert!(e.to_string().contains("sentinel"), "{what}: {e}");
        assert!(started.elapsed() < REFUSED_WITHIN, "{what}: not at once");
        assert_no_password(what, &renderings(&e));
    }
    // The data servers' password, wrong, with the right sentinel password: a credentials
    // error too, naming the primary.
    let wrong_data = format!(
        "{}&sentinel_password={SENTINEL_PW}",
        with_userinfo(&url_with(&set, ""), &format!(":{WRONG_PW}"))
    );
    let e = RedisStore::open(&wrong_data).await.map(|_| ()).unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::Credentials), "{e}");
    assert!(e.to_string().contains("primary"), "{e}");
    assert_no_password("a wrong data password", &renderings(&e));

    let log = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
    assert!(!log.is_empty(), "the log was captured");
    // The replica was reached too (over TLS, with the data password): its clock measured.
    assert!(
        log.contains("redis replica clock measured"),
        "no replica clock measured:\n{log}"
    );
    assert_no_password("the log", &log);
}

/// One secret for every server of the set (sentinels and data servers share the
/// password): `sentinel_auth=same` sends the URL's password to the sentinels too, the
/// form the CLI's `--store-password-file` fills in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_password_for_sentinels_and_servers_with_sentinel_auth_same() {
    let set = Arc::new(
        blocking(|| {
            RedisSentinelSet::start_with_passwords("sameset", DATA_PW, DATA_PW, None, false)
        })
        .await,
    );
    assert!(set.url().starts_with("redis+sentinel://"));
    let base = with_userinfo(&url_with(&set, "&prefix=same:"), &format!(":{DATA_PW}"));
    let store = RedisStore::open(&format!("{base}&sentinel_auth=same"))
        .await
        .unwrap();
    let k = Key::new("job:same").unwrap();
    let o = OwnerToken::random();
    acquire(&store, &k, &o).await;
    store.release(&k, &o).await.unwrap();
    // Without it, the sentinels are asked without a password and refuse.
    let e = RedisStore::open(&base).await.map(|_| ()).unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::Credentials), "{e}");
    assert_no_password("a missing sentinel password", &renderings(&e));
}
