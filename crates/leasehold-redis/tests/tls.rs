//! `rediss://` against a private TLS `redis-server` with a throw-away CA.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Key, LeaseClient, LeaseConfig, OwnerToken, Store, StoreErrorKind};
use leasehold_redis::{RedisStore, TlsFailure, TlsProblem};
use leasehold_testkit::{RedisOptions, RedisServer, free_port};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl is installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate for localhost / 127.0.0.1, in `dir`.
fn make_certs(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec![
        "req",
        "-x509",
        "-days",
        "2",
        "-subj",
        "/CN=leasehold test CA",
    ];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(dir, &ca);
    let mut csr = vec![
        "req",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ];
    csr.extend(ec);
    openssl(dir, &csr);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let tls_port = free_port();
    let d = dir.path().to_path_buf();
    let server = tokio::task::spawn_blocking(move || {
        RedisServer::start_with(RedisOptions::new().args([
            "--tls-port".to_owned(),
            tls_port.to_string(),
            "--tls-cert-file".to_owned(),
            d.join("server.pem").display().to_string(),
            "--tls-key-file".to_owned(),
            d.join("server.key").display().to_string(),
            "--tls-ca-cert-file".to_owned(),
            d.join("ca.pem").display().to_string(),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ]))
    })
    .await
    .unwrap();
    let ca = dir.path().join("ca.pem");
    for host in ["localhost", "127.0.0.1"] {
        let url = format!(
            "rediss://{host}:{tls_port}/?tls_ca={}&prefix=tls:",
            ca.display()
        );
        let store = Arc::new(RedisStore::open(&url).await.unwrap());
        let client = LeaseClient::new(
            store.clone(),
            LeaseConfig::new(Duration::from_secs(2)).unwrap(),
        );
        let lease = client.try_acquire("job:tls").await.unwrap();
        let first = lease.fence();
        // A waiter over the TLS pub/sub connection.
        let waiter = {
            let client = client.clone();
            tokio::spawn(async move { client.acquire("job:tls", Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(lease.release().await.unwrap());
        let next = tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(next.fence() > first);
        next.release().await.unwrap();
    }
    assert_eq!(server.cli(&["EXISTS", "tls:{job:tls}:fence"]), "1");

    // Without the CA the certificate is not trusted: a configuration error, not retried.
    let store = RedisStore::new(
        leasehold_redis::RedisConfig::from_url(&format!("rediss://localhost:{tls_port}/")).unwrap(),
    )
    .unwrap();
    let e = store
        .acquire(
            &Key::new("job:tls").unwrap(),
            &OwnerToken::random(),
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let tls = TlsFailure::of(&e).unwrap_or_else(|| panic!("no TlsFailure: {e}"));
    assert_eq!(tls.problem(), TlsProblem::UntrustedCertificate, "{e}");
    assert_eq!(tls.host(), Some("localhost"), "{e}");
    // A CA file that does not exist: a configuration error at once.
    let e = RedisStore::open(&format!(
        "rediss://localhost:{tls_port}/?tls_ca=/nonexistent/ca.pem"
    ))
    .await
    .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let tls = TlsFailure::of(&e).unwrap_or_else(|| panic!("no TlsFailure: {e}"));
    assert_eq!(tls.problem(), TlsProblem::Files, "{e}");
    // Plain text to the TLS port: the server drops it; the store finds the port speaks
    // TLS and says so, typed, naming the scheme to use.
    let e = RedisStore::open(&format!("redis://127.0.0.1:{tls_port}/?timeout=500ms"))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let tls = TlsFailure::of(&e).unwrap_or_else(|| panic!("no TlsFailure: {e}"));
    assert_eq!(tls.problem(), TlsProblem::PlaintextRefused, "{e}");
    assert_eq!(tls.host(), Some("127.0.0.1"), "{e}");
    assert!(e.to_string().contains("(rediss://)"), "{e}");
    // A plaintext server whose port is closed stays what it is: unreachable.
    let closed = free_port();
    let e = RedisStore::open(&format!(
        "redis://127.0.0.1:{closed}/?timeout=500ms&connect_timeout=500ms"
    ))
    .await
    .map(|_| ())
    .unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(TlsFailure::of(&e).is_none(), "{e}");
}
