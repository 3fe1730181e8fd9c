//! Redlock over TLS (`redlock://…?tls=true&tls_ca=…`): three private Redis servers that
//! listen with TLS only (no plaintext port), one CA. Grant, renew, release and a record
//! over verified TLS with a password; a client trusting another CA, servers whose
//! certificate names another host, a plaintext client and a wrong password are refused,
//! typed, without a password or key line in any rendering.

use leasehold_testkit::renderings;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Key, OwnerToken, Refusal, ReleaseOutcome, RenewOutcome, Store, StoreErrorKind,
};
use leasehold_redlock::{RedlockConfig, RedlockStore, TlsFailure, TlsProblem};
use leasehold_testkit::tls::WRONG_HOST;
use leasehold_testkit::{RedisOptions, RedisServer, ServerCert, TlsFiles};

const TTL: Duration = Duration::from_secs(10);
const PW: &str = "r3dlock-PASSWORD-x";
const WRONG_PW: &str = "wr0ng-r3dlock-PASSWORD-y";

/// Three TLS-only servers presenting `cert`, requiring `PW`, sharing fresh certificates.
struct Nodes {
    servers: Vec<RedisServer>,
    tls: TlsFiles,
    _dir: tempfile::TempDir,
}

impl Nodes {
    async fn start(cert: ServerCert) -> Arc<Self> {
        tokio::task::spawn_blocking(move || {
            let dir = tempfile::tempdir().unwrap();
            let tls = TlsFiles::create(dir.path());
            let servers = (0..3)
                .map(|_| {
                    RedisServer::start_with(
                        RedisOptions::new()
                            .tls(tls.clone(), cert)
                            .password(PW)
                            .tls_client_auth(),
                    )
                })
                .collect();
            Arc::new(Self {
                servers,
                tls,
                _dir: dir,
            })
        })
        .await
        .unwrap()
    }

    fn hosts(&self) -> String {
        self.servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `redlock://:PASSWORD@hosts?tls=true&tls_ca=CA&tls_cert=…&tls_key=…` (a connect bound
    /// far above what a refusal may take).
    fn url(&self, password: &str, ca: &std::path::Path) -> String {
        format!(
            "redlock://:{password}@{}?tls=true&tls_ca={}&tls_cert={}&tls_key={}&connect_timeout=20s",
            self.hosts(),
            ca.display(),
            self.tls.client_cert().display(),
            self.tls.client_key().display(),
        )
    }
}

fn assert_clean(what: &str, text: &str, tls: &TlsFiles) {
    for secret in [PW, WRONG_PW] {
        assert!(!text.contains(secret), "{what} shows a password:\n{text}");
    }
    let key = std::fs::read_to_string(tls.client_key()).unwrap();
    for line in key.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!text.contains(line), "{what} shows the key:\n{text}");
    }
}

/// Grant, renew, release and a record on three TLS-only nodes (mutual TLS, a password):
/// the lease is on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_renew_release_and_a_record_over_tls() {
    let nodes = Nodes::start(ServerCert::Localhost).await;
    let url = nodes.url(PW, &nodes.tls.ca_cert());
    let config = RedlockConfig::from_url(&url).unwrap();
    assert!(config.tls_settings().is_some());
    for shown in [config.to_string(), format!("{config:?}")] {
        assert_clean("the configuration", &shown, &nodes.tls);
    }
    assert!(config.to_string().ends_with("?tls=true"), "{config}");
    let store = RedlockStore::connect(config).await.unwrap();
    let k = Key::new("job:redlock-tls").unwrap();
    let o = OwnerToken::random();
    let fence = match store.acquire(&k, &o, TTL).await.unwrap() {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("a grant: {other:?}"),
    };
    assert!(matches!(
        store.renew(&k, &o, TTL).await.unwrap(),
        RenewOutcome::Renewed { .. }
    ));
    let lk = store.lease_key(&k);
    let held = {
        let (nodes, lk) = (nodes.clone(), lk.clone());
        tokio::task::spawn_blocking(move || {
            nodes
                .servers
                .iter()
                .filter(|s| s.cli(&["EXISTS", &lk]) == "1")
                .count()
        })
        .await
        .unwrap()
    };
    assert!(held >= 2, "the lease is on a majority: {held}");
    let rk = Key::new("config:redlock-tls").unwrap();
    store.put_record(&rk, fence, b"over tls").await.unwrap();
    let rec = store.get_record(&rk).await.unwrap().expect("the record");
    assert_eq!((rec.fence, rec.value.as_slice()), (fence, &b"over tls"[..]));
    assert!(matches!(
        store.release(&k, &o).await.unwrap(),
        ReleaseOutcome::Released
    ));
    assert!(store.inspect(&k).await.unwrap().is_none());
    assert_clean("the store's Debug", &format!("{store:?}"), &nodes.tls);

    // A wrong password over TLS: a credentials error, without the passwords.
    let e = RedlockStore::open(&nodes.url(WRONG_PW, &nodes.tls.ca_cert()))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_eq!(e.refusal(), Some(Refusal::Credentials), "{e}");
    assert_clean("a wrong password's error", &renderings(&e), &nodes.tls);

    // Plaintext to the TLS-only nodes: no majority, nothing granted, and said so.
    let plain = format!(
        "redlock://:{PW}@{}?connect_timeout=500ms&node_timeout=200ms",
        nodes.hosts()
    );
    let e = RedlockStore::open(&plain).await.map(|_| ()).unwrap_err();
    // The nodes drop it; the store then finds that they speak TLS and says so, typed.
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let t = leasehold_core::TlsFailure::of(&e).unwrap_or_else(|| panic!("no TlsFailure: {e}"));
    assert_eq!(
        t.problem(),
        leasehold_core::TlsProblem::PlaintextRefused,
        "{e}"
    );
    assert!(e.to_string().contains("(tls=true)"), "{e}");
    assert_clean("a plaintext connect's error", &renderings(&e), &nodes.tls);
}

/// A client trusting another CA: a typed, non-retryable error naming the node's host,
/// reported by `open` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_ca_is_refused_typed() {
    let nodes = Nodes::start(ServerCert::Localhost).await;
    let started = tokio::time::Instant::now();
    let e = RedlockStore::open(&nodes.url(PW, &nodes.tls.wrong_ca_cert()))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(!e.is_retryable(), "{e}");
    let t = TlsFailure::of(&e).unwrap_or_else(|| panic!("no TlsFailure: {e}"));
    assert_eq!(t.problem(), TlsProblem::UntrustedCertificate, "{e}");
    assert_eq!(t.host(), Some("127.0.0.1"), "{e}");
    assert!(e.to_string().contains("tls_ca"), "what to do: {e}");
    // Refused at once (the connect bound is 20 s), even on a loaded machine.
    assert!(started.elapsed() < Duration::from_secs(8));
    assert_clean("a failed handshake's error", &renderings(&e), &nodes.tls);

    // The right CA but no client certificate, where the nodes require one: refused; typed
    // when the client reads the node's alert first, else the message says what may be
    // missing (with TLS 1.3 the node closes the connection after the handshake).
    let no_cert = format!(
        "redlock://:{PW}@{}?tls=true&tls_ca={}&connect_timeout=20s",
        nodes.hosts(),
        nodes.tls.ca_cert().display()
    );
    let e = RedlockStore::open(&no_cert).await.map(|_| ()).unwrap_err();
    match TlsFailure::of(&e) {
        Some(t) => assert_eq!(t.problem(), TlsProblem::Other, "{e}"),
        None => assert!(e.to_string().contains("tls_cert="), "{e}"),
    }
    assert_clean("a refused client's error", &renderings(&e), &nodes.tls);
}

/// Nodes whose certificate names only another host: refused, naming the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_host_is_refused_naming_the_host() {
    let nodes = Nodes::start(ServerCert::WrongHost).await;
    let e = RedlockStore::open(&nodes.url(PW, &nodes.tls.ca_cert()))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let t = TlsFailure::of(&e).unwrap_or_else(|| panic!("no TlsFailure: {e}"));
    assert_eq!(t.problem(), TlsProblem::WrongHost, "{e}");
    assert_eq!(t.host(), Some("127.0.0.1"), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("`127.0.0.1`") && text.contains(WRONG_HOST),
        "{text}"
    );
}

#[test]
fn tls_parameters_parse_and_refuse_bad_input() {
    let c = RedlockConfig::from_url(
        "redlock://a:1,b:2,c:3?tls=true&tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem",
    )
    .unwrap();
    let tls = c.tls_settings().unwrap();
    assert_eq!(
        tls.ca_file.as_deref(),
        Some(std::path::Path::new("/ca.pem"))
    );
    assert!(tls.client_cert.is_some());
    assert!(
        RedlockConfig::from_url("redlock://a:1,b:2,c:3?tls=true")
            .unwrap()
            .tls_settings()
            .is_some()
    );
    assert!(
        RedlockConfig::from_url("redlock://a:1,b:2,c:3?tls=false")
            .unwrap()
            .tls_settings()
            .is_none()
    );
    for bad in [
        "redlock://a:1,b:2,c:3?tls_ca=/ca.pem",
        "redlock://a:1,b:2,c:3?tls=false&tls_ca=/ca.pem",
        "redlock://a:1,b:2,c:3?tls=yes",
        "redlock://a:1,b:2,c:3?tls=true&tls_cert=/c.pem",
        "redlock://a:1,b:2,c:3?tls=true&tls=true",
    ] {
        let e = RedlockConfig::from_url(bad).unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config, "{bad}: {e}");
    }
}
