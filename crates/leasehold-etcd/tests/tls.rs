//! The etcd store against a private etcd with TLS on the client port
//! (`--cert-file/--key-file/--trusted-ca-file/--client-cert-auth`, `https` only) and
//! authentication enabled: a least-privilege user (role `leasehold`: read and write on the
//! prefix `leasehold/` only) grants, renews, releases and writes fenced; every refusal
//! (plaintext, a wrong CA, a certificate for another host, no client certificate, a wrong
//! password, a user without the role) is a typed error that shows no secret. The whole
//! conformance suite over TLS and authentication is in the full tier.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{Certificate, Client, ConnectOptions, Identity, Permission, TlsOptions};
use leasehold_conformance::{Faults, FencedWrites, Fixture, Network};
use leasehold_core::{
    AcquireOutcome, Fence, Key, OwnerToken, Refusal, ReleaseOutcome, RenewOutcome, Store,
    StoreError, StoreErrorKind,
};
use leasehold_etcd::{EtcdStore, TlsFailure, TlsProblem};
use leasehold_testkit::tls::WRONG_HOST;
use leasehold_testkit::{EtcdOptions, EtcdServer, FaultProxy, ProxyMode, ServerCert, TlsFiles};

/// The least-privilege user (role `leasehold`) and its password.
const APP_USER: &str = "app";
const APP_PASSWORD: &str = "sentinel-app-pw-7c1e";
/// A user with no role.
const STRANGER: &str = "stranger";
const STRANGER_PASSWORD: &str = "sentinel-stranger-pw-3b9d";
const ROOT_PASSWORD: &str = "sentinel-root-pw-91aa";
/// The bound on each store call in these tests.
const OP_TIMEOUT: &str = "2s";

fn key(name: &str) -> Key {
    Key::new(format!("etcd-tls:{name}")).unwrap()
}

/// A private etcd with TLS and client certificates required, and authentication on.
struct Secured {
    server: Arc<EtcdServer>,
    tls: TlsFiles,
}

impl Secured {
    async fn start(options: EtcdOptions) -> Self {
        let server = Arc::new(
            tokio::task::spawn_blocking(move || EtcdServer::start_with(options.client_cert_auth()))
                .await
                .unwrap(),
        );
        let tls = server.tls().expect("TLS files").clone();
        let s = Self { server, tls };
        s.enable_auth().await;
        s
    }

    /// A raw client over TLS with the client certificate (and no user: before auth is
    /// enabled, or as root after).
    async fn raw(&self, user: Option<(&str, &str)>) -> Client {
        let tls = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(
                std::fs::read(self.tls.ca_cert()).unwrap(),
            ))
            .identity(Identity::from_pem(
                std::fs::read(self.tls.client_cert()).unwrap(),
                std::fs::read(self.tls.client_key()).unwrap(),
            ));
        let mut options = ConnectOptions::new().with_tls(tls);
        if let Some((u, p)) = user {
            options = options.with_user(u, p);
        }
        Client::connect(
            [format!("https://127.0.0.1:{}", self.server.port())],
            Some(options),
        )
        .await
        .expect("raw etcd client over TLS")
    }

    /// etcdctl's `user add root`, `role add leasehold`, `role grant-permission leasehold
    /// readwrite leasehold/ --prefix`, `user add app`, `user grant-role app leasehold`,
    /// `user add stranger`, `auth enable`, through etcd-client.
    async fn enable_auth(&self) {
        let mut raw = self.raw(None).await;
        raw.user_add("root", ROOT_PASSWORD, None).await.unwrap();
        raw.user_grant_role("root", "root").await.unwrap();
        raw.role_add("leasehold").await.unwrap();
        raw.role_grant_permission(
            "leasehold",
            Permission::read_write("leasehold/").with_prefix(),
        )
        .await
        .unwrap();
        raw.user_add(APP_USER, APP_PASSWORD, None).await.unwrap();
        raw.user_grant_role(APP_USER, "leasehold").await.unwrap();
        raw.user_add(STRANGER, STRANGER_PASSWORD, None)
            .await
            .unwrap();
        raw.auth_enable().await.unwrap();
    }

    /// `etcd://user:password@127.0.0.1:port?tls=true&cacert=…&cert=…&key=…`.
    fn url(&self, user: &str, password: &str) -> String {
        self.url_with(user, password, &self.tls.ca_cert(), true)
    }

    fn url_with(
        &self,
        user: &str,
        password: &str,
        ca: &std::path::Path,
        client_cert: bool,
    ) -> String {
        let mut url = format!(
            "etcd://{user}:{password}@127.0.0.1:{}?timeout={OP_TIMEOUT}&connect_timeout=1s&tls=true&cacert={}",
            self.server.port(),
            ca.display()
        );
        if client_cert {
            url.push_str(&format!(
                "&cert={}&key={}",
                self.tls.client_cert().display(),
                self.tls.client_key().display()
            ));
        }
        url
    }
}

/// Asserts that nothing of `e` shown shows a secret: the passwords, the client key.
fn assert_no_secret(e: &StoreError, tls: &TlsFiles) {
    let shown = format!("{e} {e:?} {:?}", std::error::Error::source(e));
    for secret in [APP_PASSWORD, STRANGER_PASSWORD, ROOT_PASSWORD, "sentinel-"] {
        assert!(!shown.contains(secret), "a password in: {shown}");
    }
    let key = std::fs::read_to_string(tls.client_key()).unwrap();
    for line in key.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!shown.contains(line), "the client key in: {shown}");
    }
}

/// The least-privilege user grants, holds across a renewal, writes a record and a guarded
/// write with its fence, and releases, all over TLS with a client certificate.
#[tokio::test]
async fn least_privilege_user_grants_renews_writes_fenced_and_releases_over_tls() {
    let s = Secured::start(EtcdOptions::new()).await;
    let store = EtcdStore::open(&s.url(APP_USER, APP_PASSWORD))
        .await
        .expect("open as the least-privilege user over TLS");
    assert!(store.config().uses_tls());
    let shown = format!("{store:?} {}", store.config());
    assert!(!shown.contains(APP_PASSWORD), "{shown}");

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
    // Held across the renewal: a second acquire by us returns the same fence, another
    // owner is refused.
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

    // The fenced writes: a record in etcd (under the prefix), and the guard's write.
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

/// A user without the role is refused at open, with a typed permission refusal, at once
/// (not retried until a deadline), and the password is not shown.
#[tokio::test]
async fn a_user_without_the_role_is_refused_with_a_permission_error() {
    let s = Secured::start(EtcdOptions::new()).await;
    let started = Instant::now();
    let e = EtcdStore::open(&s.url(STRANGER, STRANGER_PASSWORD))
        .await
        .expect_err("a user without the role opened the store");
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_eq!(e.refusal(), Some(Refusal::Permission), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the refusal took {:?}: retried?",
        started.elapsed()
    );
    assert_no_secret(&e, &s.tls);
}

/// A wrong password is refused with a typed credentials refusal that shows no password.
#[tokio::test]
async fn a_wrong_password_is_refused_and_never_shown() {
    let s = Secured::start(EtcdOptions::new()).await;
    let e = EtcdStore::open(&s.url(APP_USER, "sentinel-wrong-pw"))
        .await
        .expect_err("a wrong password opened the store");
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_eq!(e.refusal(), Some(Refusal::Credentials), "{e}");
    assert!(!format!("{e} {e:?}").contains("sentinel-wrong-pw"), "{e:?}");
    assert_no_secret(&e, &s.tls);
}

/// A store without TLS cannot talk to a member that serves only TLS.
#[tokio::test]
async fn a_plaintext_connection_is_refused() {
    let s = Secured::start(EtcdOptions::new()).await;
    let url = format!(
        "etcd://{APP_USER}:{APP_PASSWORD}@127.0.0.1:{}?timeout={OP_TIMEOUT}&connect_timeout=1s",
        s.server.port()
    );
    let e = EtcdStore::open(&url)
        .await
        .expect_err("a plaintext connection was accepted");
    // The member drops it; the store finds that the member speaks TLS and says so, typed.
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let tls = TlsFailure::of(&e).unwrap_or_else(|| panic!("not a TLS failure: {e:?}"));
    assert_eq!(tls.problem(), TlsProblem::PlaintextRefused, "{e}");
    assert_eq!(tls.host(), Some("127.0.0.1"), "{e}");
    assert!(e.to_string().contains("(tls=true)"), "{e}");
    assert_no_secret(&e, &s.tls);
}

/// A CA that did not sign the member's certificate: refused, typed as an untrusted
/// certificate; the key file's content is not shown.
#[tokio::test]
async fn a_wrong_ca_is_refused_as_an_untrusted_certificate() {
    let s = Secured::start(EtcdOptions::new()).await;
    let url = s.url_with(APP_USER, APP_PASSWORD, &s.tls.wrong_ca_cert(), true);
    let e = EtcdStore::open(&url)
        .await
        .expect_err("a member was trusted through a CA that did not sign it");
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let tls = TlsFailure::of(&e).unwrap_or_else(|| panic!("not a TLS failure: {e:?}"));
    assert_eq!(tls.problem(), TlsProblem::UntrustedCertificate, "{e}");
    assert_no_secret(&e, &s.tls);
}

/// A member started with `--client-cert-auth` refuses a client without a certificate.
/// (With TLS 1.3 the member closes the connection after the handshake, so the client
/// sees a closed connection, not a TLS error: the kind is not `Config`.)
#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let s = Secured::start(EtcdOptions::new()).await;
    let url = s.url_with(APP_USER, APP_PASSWORD, &s.tls.ca_cert(), false);
    let e = EtcdStore::open(&url)
        .await
        .expect_err("a client without a certificate was accepted");
    assert_no_secret(&e, &s.tls);
}

/// A member whose certificate names another host: refused, typed as a wrong host, the
/// host connected to named in the error.
#[tokio::test]
async fn a_certificate_for_another_host_is_refused_naming_the_host() {
    let server = tokio::task::spawn_blocking(|| {
        EtcdServer::start_with(EtcdOptions::new().tls(ServerCert::WrongHost))
    })
    .await
    .unwrap();
    let tls = server.tls().unwrap();
    let url = format!(
        "etcd://127.0.0.1:{}?timeout={OP_TIMEOUT}&connect_timeout=1s&tls=true&cacert={}",
        server.port(),
        tls.ca_cert().display()
    );
    let e = EtcdStore::open(&url)
        .await
        .expect_err("a certificate for another host was accepted");
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let failure = TlsFailure::of(&e).unwrap_or_else(|| panic!("not a TLS failure: {e:?}"));
    assert_eq!(failure.problem(), TlsProblem::WrongHost, "{e}");
    assert_eq!(failure.host(), Some("127.0.0.1"), "{e}");
    assert!(e.to_string().contains("host `127.0.0.1`"), "{e}");
    assert!(e.to_string().contains(WRONG_HOST), "{e}");
}

/// A lease held across the expiry of the store's auth token (`--auth-token-ttl 1`): the
/// server drops the token (its log says so), and the renewal and release after it
/// succeed (the client authenticates again and retries).
#[tokio::test]
async fn a_lease_is_held_across_an_auth_token_expiry() {
    let s = Secured::start(EtcdOptions::new().auth_token_ttl_secs(1).info_log()).await;
    let store = EtcdStore::open(&s.url(APP_USER, APP_PASSWORD))
        .await
        .expect("open");
    let k = key("token-expiry");
    let me = OwnerToken::random();
    let ttl = Duration::from_secs(10);
    let AcquireOutcome::Acquired { fence, .. } = store.acquire(&k, &me, ttl).await.unwrap() else {
        panic!("a free key was not granted");
    };
    // Wait until the server has dropped the store's token (nobody else uses `app`).
    let deadline = Instant::now() + Duration::from_secs(8);
    let dropped = |log: &str| {
        log.lines()
            .any(|l| l.contains("deleted a simple token") && l.contains("\"app\""))
    };
    while !dropped(&s.server.log()) {
        assert!(
            Instant::now() < deadline,
            "the server did not drop the token\n{}",
            s.server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        matches!(
            store.renew(&k, &me, ttl).await.unwrap(),
            RenewOutcome::Renewed { .. }
        ),
        "the renewal after the token expired failed"
    );
    let again = store.acquire(&k, &me, ttl).await.unwrap();
    assert!(
        matches!(again, AcquireOutcome::Acquired { fence: f, .. } if f == fence),
        "{again:?}"
    );
    assert_eq!(
        store.release(&k, &me).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// Conformance fault hooks over TLS and authentication: `forget` revokes the etcd lease
/// as root; `make_unreachable` blackholes the proxy.
struct SecuredFaults {
    store: Arc<EtcdStore>,
    proxy: Arc<FaultProxy>,
    raw: Client,
}

#[async_trait]
impl leasehold_conformance::Queue for SecuredFaults {
    async fn waiting(&self, key: &Key) -> usize {
        let prefix = format!("{}\0", self.store.lease_key(key));
        let resp = self
            .raw
            .clone()
            .get(
                prefix,
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_count_only(),
                ),
            )
            .await
            .expect("read the queue");
        usize::try_from(resp.count()).expect("a count")
    }
}

#[async_trait]
impl Faults for SecuredFaults {
    async fn forget(&self, key: &Key) {
        let mut raw = self.raw.clone();
        let resp = raw.get(self.store.lease_key(key), None).await.unwrap();
        let kv = resp.kvs().first().expect("forget: no lease key");
        raw.lease_revoke(kv.lease()).await.unwrap();
    }

    async fn make_unreachable(&self) {
        self.proxy.set_mode(ProxyMode::Blackhole);
    }

    async fn restore(&self) {
        self.proxy.set_mode(ProxyMode::Pass);
    }
}

/// The conformance fixture over TLS with a client certificate, as the least-privilege
/// user, through a fault proxy (the member's certificate names 127.0.0.1, the proxy's
/// address too).
async fn secured_fixture() -> Fixture {
    let s = Secured::start(EtcdOptions::new()).await;
    let proxy = Arc::new(FaultProxy::start(s.server.addr()));
    let direct_url = s.url(APP_USER, APP_PASSWORD);
    let proxied_url = direct_url.replace(
        &format!("127.0.0.1:{}", s.server.port()),
        &format!("127.0.0.1:{}", proxy.port()),
    );
    let store = Arc::new(EtcdStore::open(&proxied_url).await.expect("open"));
    let faults = Arc::new(SecuredFaults {
        store: store.clone(),
        proxy: proxy.clone(),
        raw: s.raw(Some(("root", ROOT_PASSWORD))).await,
    });
    let direct = common::open_store(direct_url.clone()).await;
    let network = Network::new(vec![proxy.clone()], direct, s.server.clone())
        .op_bound(common::OP_TIMEOUT)
        .lost_reply_applies(false)
        .remaining_resolution(Duration::from_secs(1));
    Fixture::new(store, faults.clone(), common::FIXTURE_TTL)
        .queue(faults)
        .other_processes(direct_url)
        .network(network)
        .expects_watcher()
        .expects_waiter()
        .keep_alive((s.server.clone(), proxy))
}

mod full {
    use super::common;

    leasehold_conformance::conformance_suite!(
        super::secured_fixture,
        backend = Etcd,
        holder = common::open_store,
        ignore = "full tier: conformance over TLS"
    );
}
