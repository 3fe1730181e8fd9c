//! TLS against a private PostgreSQL that requires it (`ssl=on`, `hostnossl … reject`),
//! with certificates made at test time (docs/connections.md, "PostgreSQL"): full
//! verification carries grants, renewals, releases and guarded writes; a plaintext
//! connect, a client trusting another CA and a certificate for another host are refused
//! with a typed error ([`TlsFailure`]); client certificates authenticate; no password or
//! key material shows in any error or Debug output.

mod common;

use std::path::Path;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Key, OwnerToken, Refusal, ReleaseOutcome, RenewOutcome, ResourceName, Store,
    StoreError, StoreErrorKind,
};
use leasehold_postgres::sqlx::PgPool;
use leasehold_postgres::{PgConfig, PgLeaseStore, TlsFailure, TlsProblem, guard};
use leasehold_testkit::tls::{CLIENT_CERT_USER, WRONG_HOST};
use leasehold_testkit::{Postgres, PostgresOptions, ServerCert, TlsFiles};

const TTL: Duration = Duration::from_secs(5);

/// Runs `sql` through psql (as the superuser, over TLS) without stalling the runtime.
fn psql(pg: &Postgres, sql: &str) -> String {
    tokio::task::block_in_place(|| pg.psql(sql))
}

fn files(pg: &Postgres) -> &TlsFiles {
    pg.tls().expect("a TLS server")
}

/// `postgres://USER@127.0.0.1:PORT/postgres?PARAMS`.
fn url(pg: &Postgres, user: &str, params: &str) -> String {
    format!(
        "postgres://{user}@127.0.0.1:{}/postgres?{params}",
        pg.port()
    )
}

/// Full verification against the test CA.
fn verify_full(pg: &Postgres) -> String {
    format!(
        "sslmode=verify-full&sslrootcert={}",
        files(pg).ca_cert().display()
    )
}

async fn connect(url: &str) -> Result<PgLeaseStore, StoreError> {
    PgLeaseStore::connect(&PgConfig::from_url(url)?).await
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
async fn verify_full_grants_renews_releases_and_fences_a_guarded_write() {
    let pg = common::start_pg(PostgresOptions::new().tls(ServerCert::Localhost)).await;
    let url = url(&pg, "postgres", &verify_full(&pg));
    let store = connect(&url).await.expect("connect over TLS");
    store.migrate().await.expect("migrate");
    // The store's sessions are encrypted: the server says so for each of them.
    let plain = psql(
        &pg,
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name LIKE 'leasehold%' AND NOT s.ssl",
    );
    let encrypted = psql(
        &pg,
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name LIKE 'leasehold%' AND s.ssl",
    );
    assert_eq!(plain, "0");
    assert_ne!(encrypted, "0");

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
    let held = store
        .inspect(&key)
        .await
        .unwrap()
        .expect("held after renewing");
    assert_eq!(held.fence, fence);

    // The guard's fenced write, on a pool of its own over TLS.
    let pool = PgPool::connect(&url).await.expect("guard pool over TLS");
    guard::migrate(&pool).await.unwrap();
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
    // The next holder's fence is newer; the old one is refused by the guard.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_naming_no_tls_parameter_uses_tls_when_the_server_offers_it() {
    // sslmode's default is libpq's `prefer`: TLS when offered, without verification.
    let pg = common::start_pg(PostgresOptions::new().tls(ServerCert::Localhost)).await;
    let store = connect(&url(&pg, "postgres", "")).await.expect("connect");
    store.migrate().await.expect("migrate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_connect_is_refused_by_the_server_with_a_typed_error() {
    let pg = common::start_pg(PostgresOptions::new().tls(ServerCert::Localhost)).await;
    let e = connect(&url(&pg, "postgres", "sslmode=disable"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_eq!(tls_problem(&e), Some(TlsProblem::PlaintextRefused), "{e}");
    assert_eq!(e.refusal(), None, "not a credentials problem: {e}");
    assert_eq!(TlsFailure::of(&e).unwrap().host(), Some("127.0.0.1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_another_ca_refuses_the_server() {
    let pg = common::start_pg(PostgresOptions::new().tls(ServerCert::Localhost)).await;
    let wrong_ca = files(&pg).wrong_ca_cert();
    for mode in ["verify-full", "verify-ca"] {
        let params = format!("sslmode={mode}&sslrootcert={}", wrong_ca.display());
        let e = connect(&url(&pg, "postgres", &params)).await.unwrap_err();
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
    let pg = common::start_pg(PostgresOptions::new().tls(ServerCert::WrongHost)).await;
    let e = connect(&url(&pg, "postgres", &verify_full(&pg)))
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
    // The CA is right: verify-ca (no name check) accepts the same server.
    let params = format!(
        "sslmode=verify-ca&sslrootcert={}",
        files(&pg).ca_cert().display()
    );
    connect(&url(&pg, "postgres", &params))
        .await
        .expect("verify-ca checks the CA only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_authentication_admits_the_certificate_and_refuses_without_it() {
    let pg = common::start_pg(PostgresOptions::new().client_cert_auth()).await;
    psql(&pg, &format!("CREATE ROLE {CLIENT_CERT_USER} LOGIN"));
    psql(
        &pg,
        &format!("GRANT ALL ON SCHEMA public TO {CLIENT_CERT_USER}"),
    );
    let tls = files(&pg);
    let with_cert = format!(
        "{}&sslcert={}&sslkey={}",
        verify_full(&pg),
        tls.client_cert().display(),
        tls.client_key().display()
    );
    let store = connect(&url(&pg, CLIENT_CERT_USER, &with_cert))
        .await
        .expect("the client certificate logs in");
    store
        .migrate()
        .await
        .expect("migrate as the certificate's role");
    let key = Key::new("tls:cert").unwrap();
    let owner = OwnerToken::random();
    assert!(matches!(
        store.acquire(&key, &owner, TTL).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));

    let e = connect(&url(&pg, CLIENT_CERT_USER, &verify_full(&pg)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_eq!(e.refusal(), Some(Refusal::Credentials), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_or_key_material_shows_in_errors_or_debug_output() {
    let password = "s3ntinel-Pw-9f2c";
    let pg = common::start_pg(
        PostgresOptions::new()
            .tls(ServerCert::Localhost)
            .password_role("app"),
    )
    .await;
    psql(&pg, &format!("CREATE ROLE app LOGIN PASSWORD '{password}'"));
    let tls = files(&pg);
    let mut secrets = key_lines(&tls.client_key());
    assert!(!secrets.is_empty());
    secrets.push(password.to_owned());
    let client = format!(
        "sslcert={}&sslkey={}",
        tls.client_cert().display(),
        tls.client_key().display()
    );

    // The right password over TLS works (so the wrong one below fails for its own reason).
    let good = url(
        &pg,
        &format!("app:{password}"),
        &format!("{}&{client}", verify_full(&pg)),
    );
    let store = connect(&good).await.expect("the right password");
    let config = PgConfig::from_url(&good).unwrap();
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
        &pg,
        "app:not-the-s3ntinel",
        &format!("{}&{client}", verify_full(&pg)),
    );
    let e = connect(&wrong).await.unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::Credentials), "{e}");
    assert_hidden(&[e.to_string(), format!("{e:?}")], &secrets);

    // A failed handshake (another CA), with the password and the client key in the URL.
    let failed = url(
        &pg,
        &format!("app:{password}"),
        &format!(
            "sslmode=verify-full&sslrootcert={}&{client}",
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
    let line = "-----BEGIN s3ntinel-key-line";
    std::fs::write(&bad_key, format!("{line}\nAAAA\n")).unwrap();
    let bad = url(
        &pg,
        &format!("app:{password}"),
        &format!(
            "{}&sslcert={}&sslkey={}",
            verify_full(&pg),
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
