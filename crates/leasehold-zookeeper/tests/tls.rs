//! The ZooKeeper store against a private ZooKeeper that serves only TLS (a Netty
//! `secureClientPort` with `ssl.clientAuth=need`, no plaintext `clientPort`, no port
//! unification): grants, renewals, releases and fenced writes over TLS with a client
//! certificate; every refusal (plaintext, a wrong CA, a certificate for another host, no
//! client certificate) is an error that shows no secret, typed where the client can tell.

use std::time::Duration;

use leasehold_conformance::FencedWrites;
use leasehold_core::{
    AcquireOutcome, Fence, Key, OwnerToken, ReleaseOutcome, RenewOutcome, Store, StoreError,
    StoreErrorKind,
};
use leasehold_testkit::tls::WRONG_HOST;
use leasehold_testkit::{ServerCert, TlsFiles, ZkServer};
use leasehold_zookeeper::{TlsFailure, TlsProblem, ZkStore};

/// The bound on each store call, and on establishing a session, in these tests. The
/// session's bound is patient: a refusal (a wrong CA, a missing client certificate, a
/// plaintext client) comes back as soon as the server answers the handshake, well inside
/// it, but under a loaded machine (several Java servers starting at once) a 3 s bound let
/// the session attempt time out first, and the test saw `Unavailable` instead of the
/// refusal.
const BOUNDS: &str = "session_timeout=8s&timeout=2s&connect_timeout=15s&tick_time=250ms";
const PASSWORD: &str = "sentinel-zk-tls-pw-5e1f";

fn key(name: &str) -> Key {
    Key::new(format!("zk-tls:{name}")).unwrap()
}

async fn start(cert: ServerCert, client_cert_auth: bool) -> ZkServer {
    tokio::task::spawn_blocking(move || ZkServer::start_tls(cert, client_cert_auth))
        .await
        .unwrap()
}

/// `zookeeper://app:PASSWORD@127.0.0.1:port/leasehold?…&tls=true&cacert=…[&cert=…&key=…]`.
fn url(zk: &ZkServer, ca: &std::path::Path, client_cert: bool) -> String {
    let tls = zk.tls().expect("TLS files");
    let mut url = format!(
        "zookeeper://app:{PASSWORD}@127.0.0.1:{}/leasehold?{BOUNDS}&tls=true&cacert={}",
        zk.port(),
        ca.display()
    );
    if client_cert {
        url.push_str(&format!(
            "&cert={}&key={}",
            tls.client_cert().display(),
            tls.client_key().display()
        ));
    }
    url
}

/// Asserts that nothing of `e` shown shows a secret: the password, a key.
fn assert_no_secret(e: &StoreError, tls: &TlsFiles) {
    let shown = format!("{e} {e:?} {:?}", std::error::Error::source(e));
    assert!(!shown.contains(PASSWORD), "the password in: {shown}");
    for file in [tls.client_key(), tls.server_key()] {
        let key = std::fs::read_to_string(file).unwrap();
        for line in key.lines().filter(|l| !l.starts_with("-----")) {
            assert!(!shown.contains(line), "a key in: {shown}");
        }
    }
}

/// Grants, holds across a renewal, refuses another owner, writes a record and a guarded
/// write with its fence, releases: all over TLS with a client certificate, with digest
/// credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_renews_releases_and_writes_fenced_over_tls() {
    let zk = start(ServerCert::Localhost, true).await;
    let tls = zk.tls().unwrap().clone();
    let store = ZkStore::open(&url(&zk, &tls.ca_cert(), true))
        .await
        .expect("open over TLS with a client certificate");
    assert!(store.config().uses_tls());
    let shown = format!("{store:?} {}", store.config());
    assert!(!shown.contains(PASSWORD), "{shown}");

    let k = key("smoke");
    let me = OwnerToken::random();
    let ttl = Duration::from_secs(3);
    let AcquireOutcome::Acquired { fence, .. } = store.acquire(&k, &me, ttl).await.unwrap() else {
        panic!("a free key was not granted");
    };
    assert!(matches!(
        store.renew(&k, &me, ttl).await.unwrap(),
        RenewOutcome::Renewed { .. }
    ));
    let again = store.acquire(&k, &me, ttl).await.unwrap();
    assert!(
        matches!(again, AcquireOutcome::Acquired { fence: f, .. } if f == fence),
        "{again:?}"
    );
    let other = OwnerToken::random();
    assert!(matches!(
        store.acquire(&k, &other, ttl).await.unwrap(),
        AcquireOutcome::Held { .. }
    ));

    let rec = key("smoke-record");
    let record = store.put_record(&rec, fence, b"v1").await.unwrap();
    assert_eq!(record.fence, fence);
    assert_eq!(
        store.get_record(&rec).await.unwrap().map(|r| r.value),
        Some(b"v1".to_vec())
    );
    let guard = leasehold_conformance::guard::EmbeddedGuard::open().await;
    assert!(guard.write("res", fence, "new").await.unwrap());
    assert!(
        !guard
            .write("res", Fence(fence.0 - 1), "stale")
            .await
            .unwrap(),
        "a lower fence was accepted"
    );

    assert_eq!(
        store.release(&k, &me).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(matches!(
        store.acquire(&k, &other, ttl).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
}

/// A store without TLS cannot talk to a server that serves only TLS: the server drops the
/// plaintext connection, and no session is established.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_connect_is_refused_by_the_server() {
    let zk = start(ServerCert::Localhost, true).await;
    let tls = zk.tls().unwrap().clone();
    let url = format!(
        "zookeeper://app:{PASSWORD}@127.0.0.1:{}/leasehold?{BOUNDS}",
        zk.port()
    );
    let e = ZkStore::open(&url)
        .await
        .expect_err("a plaintext connection was accepted");
    // The server drops it; the store finds that the port speaks TLS and says so, typed.
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e:?}");
    let failure = TlsFailure::of(&e).unwrap_or_else(|| panic!("not a TLS failure: {e:?}"));
    assert_eq!(failure.problem(), TlsProblem::PlaintextRefused, "{e}");
    assert_eq!(failure.host(), Some("127.0.0.1"), "{e}");
    assert!(e.to_string().contains("(tls=true)"), "{e}");
    assert_no_secret(&e, &tls);
}

/// A CA that did not sign the server's certificate: refused by the client, typed as an
/// untrusted certificate; no key content is shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_refused_as_an_untrusted_certificate() {
    let zk = start(ServerCert::Localhost, true).await;
    let tls = zk.tls().unwrap().clone();
    let e = ZkStore::open(&url(&zk, &tls.wrong_ca_cert(), true))
        .await
        .expect_err("a server was trusted through a CA that did not sign it");
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let failure = TlsFailure::of(&e).unwrap_or_else(|| panic!("not a TLS failure: {e:?}"));
    assert_eq!(failure.problem(), TlsProblem::UntrustedCertificate, "{e}");
    assert_no_secret(&e, &tls);
}

/// A server whose certificate names another host: refused, typed as a wrong host, the
/// host connected to named in the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_host_is_refused_naming_the_host() {
    let zk = start(ServerCert::WrongHost, false).await;
    let tls = zk.tls().unwrap().clone();
    let e = ZkStore::open(&url(&zk, &tls.ca_cert(), false))
        .await
        .expect_err("a certificate for another host was accepted");
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let failure = TlsFailure::of(&e).unwrap_or_else(|| panic!("not a TLS failure: {e:?}"));
    assert_eq!(failure.problem(), TlsProblem::WrongHost, "{e}");
    assert_eq!(failure.host(), Some("127.0.0.1"), "{e}");
    assert!(e.to_string().contains("host `127.0.0.1`"), "{e}");
    assert!(e.to_string().contains(WRONG_HOST), "{e}");
    assert_no_secret(&e, &tls);
}

/// A server with `ssl.clientAuth=need` refuses a client without a certificate; the store's
/// own handshake reads the server's alert and reports a TLS failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_certificate_is_refused() {
    let zk = start(ServerCert::Localhost, true).await;
    let tls = zk.tls().unwrap().clone();
    let e = ZkStore::open(&url(&zk, &tls.ca_cert(), false))
        .await
        .expect_err("a client without a certificate was accepted");
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let failure = TlsFailure::of(&e).unwrap_or_else(|| panic!("not a TLS failure: {e:?}"));
    assert_eq!(failure.problem(), TlsProblem::Other, "{e}");
    assert_no_secret(&e, &tls);
}
