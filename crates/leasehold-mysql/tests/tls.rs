//! TLS against a private MariaDB that requires it (`require_secure_transport=ON`), with
//! certificates made at test time (docs/connections.md, "MariaDB / MySQL"): full
//! verification carries grants, renewals, releases and guarded writes for a user with only
//! the grants leasehold needs; a plaintext connect, a client trusting another CA and a
//! certificate for another host are refused with a typed error ([`TlsFailure`]); client
//! certificates (`REQUIRE X509`) authenticate; no password or key material shows in any
//! error or Debug output.

use std::path::Path;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Key, OwnerToken, Refusal, ReleaseOutcome, RenewOutcome, ResourceName, Store,
    StoreError, StoreErrorKind,
};
use leasehold_mysql::sqlx::MySqlPool;
use leasehold_mysql::sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
use leasehold_mysql::{MySqlConfig, MySqlLeaseStore, TlsFailure, TlsProblem, guard};
use leasehold_testkit::tls::WRONG_HOST;
use leasehold_testkit::{FaultProxy, MariaDb, MariaDbOptions, ProxyMode, ServerCert, TlsFiles};

const TTL: Duration = Duration::from_secs(5);

/// A private MariaDB that requires TLS, presenting `cert`.
fn start(cert: ServerCert) -> MariaDb {
    tokio::task::block_in_place(|| {
        MariaDb::start_with(
            MariaDbOptions::new()
                .arg("--innodb-buffer-pool-size=32M")
                .tls(cert),
        )
    })
}

/// Runs `stmt` as root (over TLS) without stalling the runtime.
fn sql(db: &MariaDb, stmt: &str) -> String {
    tokio::task::block_in_place(|| db.sql(stmt))
}

fn files(db: &MariaDb) -> &TlsFiles {
    db.tls().expect("a TLS server")
}

/// `mysql://USER@127.0.0.1:PORT/test?PARAMS`.
fn url(db: &MariaDb, user: &str, params: &str) -> String {
    format!("mysql://{user}@127.0.0.1:{}/test?{params}", db.port())
}

/// Full verification against the test CA.
fn verify_identity(db: &MariaDb) -> String {
    format!(
        "ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        files(db).ca_cert().display()
    )
}

async fn connect(url: &str) -> Result<MySqlLeaseStore, StoreError> {
    MySqlLeaseStore::connect(MySqlConfig::from_url(url)?).await
}

fn tls_problem(e: &StoreError) -> Option<TlsProblem> {
    TlsFailure::of(e).map(TlsFailure::problem)
}

/// The base64 lines of a PEM key file: none may show anywhere.
fn key_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .expect("read the key")
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() > 16)
        .map(str::to_owned)
        .collect()
}

fn assert_hidden(texts: &[String], secrets: &[String]) {
    for t in texts {
        for s in secrets {
            assert!(!t.contains(s.as_str()), "{s:?} shows in {t}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_identity_grants_renews_releases_and_fences_a_guarded_write_with_least_privilege() {
    let db = start(ServerCert::Localhost);
    // The tables made by an administrator; the application user gets only what leasehold
    // needs (crates/leasehold-mysql/README.md, "Schema"; docs/connections.md).
    // Root's store creates the lease and records tables (migrate=true, the default).
    drop(
        connect(&url(&db, "root", &verify_identity(&db)))
            .await
            .expect("root over TLS"),
    );
    let admin_opts = MySqlConnectOptions::new()
        .host("127.0.0.1")
        .port(db.port())
        .username("root")
        .database("test")
        .ssl_mode(MySqlSslMode::VerifyIdentity)
        .ssl_ca(files(&db).ca_cert());
    let admin = MySqlPool::connect_with(admin_opts)
        .await
        .expect("admin pool");
    guard::migrate(&admin).await.expect("guard tables");
    sql(
        &db,
        "CREATE USER 'app'@'127.0.0.1' IDENTIFIED BY 'app-pw'; \
         GRANT SELECT, INSERT, UPDATE ON test.* TO 'app'@'127.0.0.1'",
    );
    let app = url(&db, "app:app-pw", &verify_identity(&db));
    // The server admits no plaintext session (require_secure_transport), so the store's
    // sessions are encrypted.
    let store = connect(&app).await.expect("the app user over TLS");

    let key = Key::new("tls:job").unwrap();
    let owner = OwnerToken::random();
    let AcquireOutcome::Acquired { fence, .. } = store.acquire(&key, &owner, TTL).await.unwrap()
    else {
        panic!("a free key is granted");
    };
    assert!(matches!(
        store.renew(&key, &owner, TTL).await.unwrap(),
        RenewOutcome::Renewed { .. }
    ));
    assert_eq!(
        store.inspect(&key).await.unwrap().expect("held").fence,
        fence
    );

    // The guard's fenced write, as the app user, on a TLS pool of its own.
    let app_opts = MySqlConnectOptions::new()
        .host("127.0.0.1")
        .port(db.port())
        .username("app")
        .password("app-pw")
        .database("test")
        .ssl_mode(MySqlSslMode::VerifyIdentity)
        .ssl_ca(files(&db).ca_cert());
    let pool = MySqlPool::connect_with(app_opts).await.expect("app pool");
    let ssl: (String, String) = sqlx_ssl_cipher(&pool).await;
    assert!(!ssl.1.is_empty(), "the session is encrypted: {ssl:?}");
    let resource = ResourceName::new("tls:ledger").unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(
        guard::check_and_advance(&mut tx, &resource, fence)
            .await
            .unwrap()
            .is_accepted()
    );
    tx.commit().await.unwrap();

    assert_eq!(
        store.release(&key, &owner).await.unwrap(),
        ReleaseOutcome::Released
    );
    let next = OwnerToken::random();
    let AcquireOutcome::Acquired { fence: newer, .. } =
        store.acquire(&key, &next, TTL).await.unwrap()
    else {
        panic!("a released key is granted");
    };
    assert!(newer > fence);
    let mut tx = pool.begin().await.unwrap();
    assert!(
        guard::check_and_advance(&mut tx, &resource, newer)
            .await
            .unwrap()
            .is_accepted()
    );
    tx.commit().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(
        !guard::check_and_advance(&mut tx, &resource, fence)
            .await
            .unwrap()
            .is_accepted(),
        "a stale fence is refused over TLS too"
    );
    tx.rollback().await.unwrap();
}

/// A TLS connect slower than the operation's bound (here every chunk on the way held
/// 100 ms: the handshake, login and session set-up are ≥ 9 chunks, ≥ 900 ms, against a
/// 700 ms bound; a statement on a pooled connection, prepared and run, is 4 chunks)
/// times the operation out, but the connect finishes and the next operations use its
/// connection. Before, each operation started a new connect and cut it off at its bound:
/// under load (the full tier's conformance over TLS) the store stopped completing
/// operations at all — 32 contenders got no reply for 90 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_slower_than_the_operations_bound_is_pooled_for_the_next_one() {
    let db = start(ServerCert::Localhost);
    let proxy = FaultProxy::start(db.addr());
    let through = format!(
        "mysql://root@127.0.0.1:{}/test?timeout=700ms&connect_timeout=20s&max_connections=1&{}",
        proxy.port(),
        verify_identity(&db)
    );
    let store = connect(&through).await.expect("connect over TLS");
    let key = Key::new("tls:slow-connect").unwrap();
    // Its one pooled connection broken.
    proxy.reset_all();
    let reset = tokio::time::timeout(Duration::from_secs(10), async {
        while proxy.active_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    assert!(reset.await.is_ok(), "the proxy reset its connections");
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(100)));
    let before = proxy.connections();
    // The next operation finds its pooled connection broken: either its statement meets the
    // reset (a broken-connection error; the connection is closed) and the one after needs
    // a new connection, or the pool replaces the connection at once. Either way, the
    // operation that makes the new connection times out.
    let mut e = store.inspect(&key).await.unwrap_err();
    if e.kind() != StoreErrorKind::Timeout {
        assert!(
            matches!(
                e.kind(),
                StoreErrorKind::Ambiguous | StoreErrorKind::Unavailable
            ),
            "{e}"
        );
        assert_eq!(proxy.connections(), before, "no connect yet: {e}");
        e = store.inspect(&key).await.unwrap_err();
    }
    assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e}");
    let pooled = tokio::time::timeout(Duration::from_secs(20), async {
        while store.pool().num_idle() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        pooled.is_ok(),
        "the connect the operation gave up on was thrown away"
    );
    for _ in 0..3 {
        assert_eq!(store.inspect(&key).await.unwrap(), None);
    }
    assert_eq!(
        proxy.connections() - before,
        1,
        "one connect served the timed-out operation's successors"
    );
}

/// `SHOW SESSION STATUS LIKE 'Ssl_cipher'` on one of `pool`'s sessions.
async fn sqlx_ssl_cipher(pool: &MySqlPool) -> (String, String) {
    leasehold_mysql::sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .fetch_one(pool)
        .await
        .expect("Ssl_cipher")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_naming_no_tls_parameter_uses_tls_when_the_server_offers_it() {
    // ssl-mode's default is PREFERRED: TLS when offered, without verification.
    let db = start(ServerCert::Localhost);
    connect(&url(&db, "root", "")).await.expect("connect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_connect_is_refused_by_the_server_with_a_typed_error() {
    let db = start(ServerCert::Localhost);
    let e = connect(&url(&db, "root", "ssl-mode=DISABLED"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_eq!(tls_problem(&e), Some(TlsProblem::PlaintextRefused), "{e}");
    assert_eq!(e.refusal(), None, "not a credentials problem: {e}");
    assert_eq!(TlsFailure::of(&e).unwrap().host(), Some("127.0.0.1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_another_ca_refuses_the_server() {
    let db = start(ServerCert::Localhost);
    let wrong_ca = files(&db).wrong_ca_cert();
    for mode in ["VERIFY_IDENTITY", "VERIFY_CA"] {
        let params = format!("ssl-mode={mode}&ssl-ca={}", wrong_ca.display());
        let e = connect(&url(&db, "root", &params)).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config, "{mode}: {e}");
        assert_eq!(
            tls_problem(&e),
            Some(TlsProblem::UntrustedCertificate),
            "{mode}: {e}"
        );
        assert!(e.to_string().contains("127.0.0.1"), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_host_is_refused_with_an_error_naming_the_host() {
    let db = start(ServerCert::WrongHost);
    let e = connect(&url(&db, "root", &verify_identity(&db)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_eq!(tls_problem(&e), Some(TlsProblem::WrongHost), "{e}");
    assert_eq!(TlsFailure::of(&e).unwrap().host(), Some("127.0.0.1"));
    let text = e.to_string();
    assert!(
        text.contains("`127.0.0.1`") && text.contains("does not name the host"),
        "{text}"
    );
    assert!(
        text.contains(WRONG_HOST),
        "what the certificate names: {text}"
    );
    // The CA is right: VERIFY_CA (no name check) accepts the same server.
    let params = format!(
        "ssl-mode=VERIFY_CA&ssl-ca={}",
        files(&db).ca_cert().display()
    );
    connect(&url(&db, "root", &params))
        .await
        .expect("VERIFY_CA checks the CA only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_authentication_admits_the_certificate_and_refuses_without_it() {
    let db = start(ServerCert::Localhost);
    sql(
        &db,
        "CREATE USER 'certuser'@'127.0.0.1' REQUIRE X509; \
         GRANT ALL ON test.* TO 'certuser'@'127.0.0.1'",
    );
    let tls = files(&db);
    let with_cert = format!(
        "{}&ssl-cert={}&ssl-key={}",
        verify_identity(&db),
        tls.client_cert().display(),
        tls.client_key().display()
    );
    let store = connect(&url(&db, "certuser", &with_cert))
        .await
        .expect("the client certificate logs in");
    let key = Key::new("tls:cert").unwrap();
    assert!(matches!(
        store
            .acquire(&key, &OwnerToken::random(), TTL)
            .await
            .unwrap(),
        AcquireOutcome::Acquired { .. }
    ));

    let e = connect(&url(&db, "certuser", &verify_identity(&db)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_eq!(e.refusal(), Some(Refusal::Credentials), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_or_key_material_shows_in_errors_or_debug_output() {
    let password = "s3ntinel-Pw-9f2c";
    let db = start(ServerCert::Localhost);
    sql(
        &db,
        &format!(
            "CREATE USER 'app'@'127.0.0.1' IDENTIFIED BY '{password}'; \
             GRANT ALL ON test.* TO 'app'@'127.0.0.1'"
        ),
    );
    let tls = files(&db);
    let mut secrets = key_lines(&tls.client_key());
    assert!(!secrets.is_empty());
    secrets.push(password.to_owned());
    let client = format!(
        "ssl-cert={}&ssl-key={}",
        tls.client_cert().display(),
        tls.client_key().display()
    );

    let good = url(
        &db,
        &format!("app:{password}"),
        &format!("{}&{client}", verify_identity(&db)),
    );
    let store = connect(&good).await.expect("the right password");
    let config = MySqlConfig::from_url(&good).unwrap();
    assert_hidden(
        &[
            format!("{store:?}"),
            format!("{config:?}"),
            config.to_string(),
        ],
        &secrets,
    );

    // A wrong password, over verified TLS with a client key.
    let wrong = url(
        &db,
        "app:not-the-s3ntinel",
        &format!("{}&{client}", verify_identity(&db)),
    );
    let e = connect(&wrong).await.unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::Credentials), "{e}");
    assert_hidden(&[e.to_string(), format!("{e:?}")], &secrets);

    // A failed handshake (another CA), with the password and the client key in the URL.
    let failed = url(
        &db,
        &format!("app:{password}"),
        &format!(
            "ssl-mode=VERIFY_IDENTITY&ssl-ca={}&{client}",
            tls.wrong_ca_cert().display()
        ),
    );
    let e = connect(&failed).await.unwrap_err();
    assert_eq!(
        tls_problem(&e),
        Some(TlsProblem::UntrustedCertificate),
        "{e}"
    );
    assert_hidden(&[e.to_string(), format!("{e:?}")], &secrets);

    // A key file that does not parse: the parser's message quotes the offending line
    // (as bytes); it is not passed on.
    let bad_key = tls.dir().join("not-a-key.pem");
    std::fs::write(&bad_key, "-----BEGIN s3ntinel-key-line\nAAAA\n").unwrap();
    let bad = url(
        &db,
        &format!("app:{password}"),
        &format!(
            "{}&ssl-cert={}&ssl-key={}",
            verify_identity(&db),
            tls.client_cert().display(),
            bad_key.display()
        ),
    );
    let e = connect(&bad).await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_hidden(
        &[e.to_string(), format!("{e:?}")],
        &[
            "s3ntinel-key-line".to_owned(),
            // The line as the parser prints it: its bytes in decimal.
            "s3ntinel"
                .bytes()
                .map(|b| b.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            password.to_owned(),
        ],
    );
}
