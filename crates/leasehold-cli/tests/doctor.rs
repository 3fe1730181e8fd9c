//! `leasehold doctor` against real servers started each way (own port, own data
//! directory, killed on drop): the same store under two settings gives two verdicts, and
//! `--require` turns a row that does not hold into exit 78. No password shows.

mod common;

use common::{Env, stderr, stdout};
use leasehold_testkit::{
    MariaDb, MariaDbOptions, PgBouncer, PoolMode, Postgres, PostgresOptions, RedisOptions,
    RedisServer,
};

/// `doctor --json` on `url`: the exit status and the report.
fn doctor(env: &Env, url: &str, extra: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let mut args = vec!["--store", url, "doctor", "--json"];
    args.extend_from_slice(extra);
    let out = env.run(&args);
    let printed = stdout(&out);
    let json = serde_json::from_str(printed.trim())
        .unwrap_or_else(|e| panic!("{e}: {printed:?} {}", stderr(&out)));
    (out.status.code(), json, stderr(&out))
}

/// The verdict of `row` in a report.
fn verdict<'a>(report: &'a serde_json::Value, row: &str) -> Option<&'a str> {
    report["rows"]
        .as_array()?
        .iter()
        .find(|r| r["row"] == row)?["verdict"]
        .as_str()
}

fn setting<'a>(report: &'a serde_json::Value, row: &str) -> &'a str {
    report["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["row"] == row))
        .and_then(|r| r["setting"].as_str())
        .unwrap_or_default()
}

#[test]
fn postgres_commits_decide_the_restart_row_and_require_holds_exits_78_when_they_do_not() {
    let env = Env::new();
    let durable = Postgres::start_with(PostgresOptions::new().fsync(true));
    let (code, report, err) = doctor(&env, &durable.url(), &["--require", "holds"]);
    assert_eq!(code, Some(0), "{report} {err}");
    assert_eq!(verdict(&report, "restart with persistence"), Some("holds"));
    assert_eq!(verdict(&report, "transaction pooler"), Some("holds"));
    assert!(
        report["facts"]["server version"]
            .as_str()
            .unwrap()
            .starts_with("PostgreSQL ")
    );
    assert_eq!(report["facts"]["identity"], "role postgres");
    assert_eq!(report["ok"], true);
    // The superuser the test kit connects as is more than leasehold needs.
    assert!(
        report["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("SUPERUSER")),
        "{report}"
    );

    let lax = Postgres::start_with(
        PostgresOptions::new()
            .fsync(true)
            .setting("synchronous_commit", "off"),
    );
    let (code, report, err) = doctor(&env, &lax.url(), &["--require", "holds"]);
    assert_eq!(code, Some(78), "{report}");
    assert_eq!(
        verdict(&report, "restart with persistence"),
        Some("fences hold")
    );
    assert_eq!(
        setting(&report, "restart with persistence"),
        "fsync=on, synchronous_commit=off"
    );
    assert!(
        err.starts_with(
            "leasehold: not every row required holds here (--require holds): restart with persistence"
        ),
        "{err}"
    );
    assert_eq!(report["ok"], false);
    let (code, ..) = doctor(&env, &lax.url(), &["--require", "fences-hold"]);
    assert_eq!(code, Some(0));
    let only = ["--require", "holds", "--row", "transaction pooler"];
    assert_eq!(doctor(&env, &lax.url(), &only).0, Some(0));
}

#[test]
fn postgres_behind_a_pooler_is_seen_by_its_port() {
    let env = Env::new();
    let pg = Postgres::start();
    let bouncer = PgBouncer::start(&pg, PoolMode::Transaction, 4);
    let url = format!(
        "{}?leasehold_pooler=transaction",
        bouncer.url_for_db("postgres")
    );
    let (code, report, err) = doctor(&env, &url, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(verdict(&report, "transaction pooler"), Some("holds"));
    assert!(
        setting(&report, "transaction pooler").starts_with("leasehold_pooler=transaction"),
        "{report}"
    );
    // The advisory store through a session pooler: something in between, undecided.
    let session = PgBouncer::start(&pg, PoolMode::Session, 4);
    let advisory =
        session
            .url_for_db("postgres")
            .replacen("postgres://", "postgres+advisory://", 1);
    let (code, report, err) = doctor(&env, &advisory, &["--require", "holds"]);
    assert_eq!(code, Some(78), "{report} {err}");
    assert_eq!(verdict(&report, "transaction pooler"), Some("unknown"));
}

#[test]
fn mariadb_redo_log_flush_decides_the_restart_row() {
    let env = Env::new();
    let durable =
        MariaDb::start_with(MariaDbOptions::new().arg("--innodb-flush-log-at-trx-commit=1"));
    let (code, report, err) = doctor(&env, &durable.url(), &["--require", "holds"]);
    assert_eq!(code, Some(0), "{report} {err}");
    assert_eq!(verdict(&report, "restart with persistence"), Some("holds"));
    assert!(
        report["facts"]["server version"]
            .as_str()
            .unwrap()
            .contains("MariaDB"),
        "{report}"
    );
    let lax = MariaDb::start_with(MariaDbOptions::new().arg("--innodb-flush-log-at-trx-commit=2"));
    let (code, report, _) = doctor(&env, &lax.url(), &["--require", "holds"]);
    assert_eq!(code, Some(78));
    assert_eq!(
        verdict(&report, "restart with persistence"),
        Some("fences hold")
    );
    let getlock = lax.url().replacen("mysql://", "mysql+getlock://", 1);
    let (_, report, _) = doctor(&env, &getlock, &[]);
    assert_eq!(
        verdict(&report, "restart with persistence"),
        Some("does not hold")
    );
}

#[test]
fn redis_persistence_and_eviction_decide_their_rows_and_no_password_shows() {
    let env = Env::new();
    let secret = "doctor-s3cret-pw";
    let bare = RedisServer::start_with(RedisOptions::new().password(secret));
    let (code, report, err) = doctor(&env, &bare.authed_url(), &["--require", "holds"]);
    assert_eq!(code, Some(78), "{report} {err}");
    assert_eq!(
        verdict(&report, "restart without persistence"),
        Some("fences hold")
    );
    assert_eq!(verdict(&report, "eviction"), Some("holds"));
    assert_eq!(report["facts"]["identity"], "ACL user default");
    assert!(!report.to_string().contains(secret) && !err.contains(secret));
    let text = env.run(&["--store", &bare.authed_url(), "doctor"]);
    assert!(!stdout(&text).contains(secret) && !stderr(&text).contains(secret));

    let always = RedisServer::start_with(
        RedisOptions::new()
            .appendonly(true)
            .args(["--appendfsync", "always"]),
    );
    let (code, report, err) = doctor(&env, &always.url(), &["--require", "holds"]);
    assert_eq!(code, Some(0), "{report} {err}");
    assert_eq!(verdict(&report, "restart with persistence"), Some("holds"));

    let evicting = RedisServer::start_with(
        RedisOptions::new()
            .appendonly(true)
            .args(["--maxmemory-policy", "allkeys-lru"]),
    );
    let url = format!("{}?allow_eviction=true", evicting.url());
    let (code, report, _) = doctor(&env, &url, &["--require", "fences-hold"]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(verdict(&report, "eviction"), Some("fences hold"));
    assert_eq!(
        verdict(&report, "restart with persistence"),
        Some("fences hold")
    );
    assert_eq!(
        setting(&report, "restart with persistence"),
        "appendonly=yes, appendfsync=everysec"
    );
}

#[test]
fn the_embedded_store_holds_with_its_defaults() {
    let env = Env::new();
    let out = env.run(&["doctor", "--require", "holds"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("store\tsqlite\n"), "{text}");
    assert!(
        text.contains("row\trestart with persistence\tholds\tsynchronous=full\t"),
        "{text}"
    );
}

#[test]
fn zookeeper_ensemble_size_decides_the_fail_over_row() {
    let env = Env::new();
    let solo = leasehold_testkit::ZkServer::start();
    let (code, report, err) = doctor(&env, &solo.url(), &["--require", "holds"]);
    assert_eq!(code, Some(78), "{report} {err}");
    assert_eq!(verdict(&report, "fail-over"), Some("unknown"));
    assert_eq!(verdict(&report, "restart with persistence"), Some("holds"));
    assert!(
        report["facts"]["session timeout"]
            .as_str()
            .unwrap()
            .contains("ms granted"),
        "{report}"
    );
    let ensemble = leasehold_testkit::ZkEnsemble::start();
    let (code, report, err) = doctor(&env, &ensemble.url(), &["--require", "holds"]);
    assert_eq!(code, Some(0), "{report} {err}");
    assert_eq!(verdict(&report, "fail-over"), Some("holds"));
}

#[test]
fn redlock_nodes_are_each_reported() {
    let env = Env::new();
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let url = format!(
        "redlock://{}/",
        nodes
            .iter()
            .map(|n| n
                .url()
                .trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned())
            .collect::<Vec<_>>()
            .join(",")
    );
    let (code, report, err) = doctor(&env, &url, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        verdict(&report, "restart without persistence"),
        Some("fences hold")
    );
    assert_eq!(verdict(&report, "eviction"), Some("holds"));
    let facts = report["facts"].as_object().unwrap();
    assert_eq!(
        facts.keys().filter(|k| k.starts_with("node ")).count(),
        3,
        "{report}"
    );
}

/// ZooKeeper over TLS with digest credentials: doctor reports the secure port and the
/// identity, and no warning about either; the password never shows.
#[test]
fn zookeeper_over_tls_with_credentials_is_reported_so() {
    let env = Env::new();
    let zk =
        leasehold_testkit::ZkServer::start_tls(leasehold_testkit::ServerCert::Localhost, false);
    let tls = zk.tls().unwrap();
    let secret = "zk-doctor-s3cret";
    let url = format!(
        "zookeeper://app:{secret}@127.0.0.1:{}/leasehold?tls=true&cacert={}",
        zk.port(),
        tls.ca_cert().display()
    );
    let (code, report, err) = doctor(&env, &url, &[]);
    assert_eq!(code, Some(0), "{report} {err}");
    assert!(
        report["facts"]["TLS"]
            .as_str()
            .unwrap()
            .starts_with("TLSv1."),
        "{report}"
    );
    assert!(
        report["facts"]["identity"]
            .as_str()
            .unwrap()
            .starts_with("digest user app"),
        "{report}"
    );
    assert!(
        report["warnings"].as_array().unwrap().is_empty(),
        "{report}"
    );
    assert!(!report.to_string().contains(secret) && !err.contains(secret));
    // A client trusting another CA: the TLS line of the exit-status table.
    let wrong = format!(
        "zookeeper://127.0.0.1:{}/leasehold?tls=true&cacert={}&connect_timeout=2s",
        zk.port(),
        tls.wrong_ca_cert().display()
    );
    let out = env.run(&["--store", &wrong, "doctor"]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with(
            "leasehold: store error: the server's TLS certificate is not signed by a trusted CA"
        ),
        "{}",
        stderr(&out)
    );
}

// ---------------------------------------------------------------------------------------
// What the server shows over TLS: the protocol version, the cipher and its certificate,
// read by a handshake of leasehold's own (the stores' clients do not expose their
// sessions), on every store that speaks TLS.

/// The report names TLS 1.2 or 1.3 with a cipher, and the test kit's server certificate:
/// its subject, the test CA that issued it, its names, the end of its validity, and how the
/// store checks it (`checked`).
fn assert_session(report: &serde_json::Value, checked: &str) {
    let tls = report["facts"]["TLS"].as_str().unwrap_or_default();
    assert!(
        tls.starts_with("TLSv1.3, TLS13_") || tls.starts_with("TLSv1.2, TLS_"),
        "{report}"
    );
    let peer = report["facts"]["peer certificate"]
        .as_str()
        .unwrap_or_default();
    assert!(
        peer.starts_with(
            "CN=localhost, issued by CN=leasehold test CA; names localhost, 127.0.0.1; valid \
             until "
        ),
        "{report}"
    );
    assert!(peer.ends_with(checked), "{report}");
}

#[test]
fn postgres_over_tls_names_the_protocol_and_the_servers_certificate() {
    use leasehold_testkit::ServerCert;
    let env = Env::new();
    let pg = Postgres::start_with(PostgresOptions::new().tls(ServerCert::Localhost));
    let tls = pg.tls().unwrap();
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
        pg.port(),
        tls.ca_cert().display()
    );
    let (code, report, err) = doctor(&env, &url, &[]);
    assert_eq!(code, Some(0), "{report} {err}");
    assert_session(
        &report,
        "signed by a trusted CA and names the host (sslmode=verify-full)",
    );
    // sslmode=require checks nothing: the certificate is still shown, and said unchecked.
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=require",
        pg.port()
    );
    let (_, report, err) = doctor(&env, &url, &[]);
    assert_session(&report, "not checked");
    assert!(err.is_empty() || !err.contains("panic"), "{err}");
}

#[test]
fn mariadb_over_tls_names_the_protocol_and_the_servers_certificate() {
    use leasehold_testkit::ServerCert;
    let env = Env::new();
    let db = MariaDb::start_with(MariaDbOptions::new().tls(ServerCert::Localhost));
    let tls = db.tls().unwrap();
    let url = format!(
        "mysql://root@127.0.0.1:{}/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        db.port(),
        tls.ca_cert().display()
    );
    let (code, report, err) = doctor(&env, &url, &[]);
    assert_eq!(code, Some(0), "{report} {err}");
    assert_session(
        &report,
        "signed by a trusted CA and names the host (ssl-mode=VERIFY_IDENTITY)",
    );
}

#[test]
fn redis_and_redlock_over_tls_name_the_protocol_and_the_servers_certificate() {
    use leasehold_testkit::{ServerCert, TlsFiles};
    let env = Env::new();
    let dir = tempfile::tempdir().unwrap();
    let files = TlsFiles::create(dir.path());
    // Client certificates required (tls-auth-clients yes): the doctor's own handshake
    // presents the URL's.
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| {
            RedisServer::start_with(
                RedisOptions::new()
                    .tls(files.clone(), ServerCert::Localhost)
                    .tls_client_auth(),
            )
        })
        .collect();
    let params = format!(
        "tls_ca={}&tls_cert={}&tls_key={}",
        files.ca_cert().display(),
        files.client_cert().display(),
        files.client_key().display()
    );
    let url = format!("rediss://127.0.0.1:{}/?{params}", servers[0].port());
    let (code, report, err) = doctor(&env, &url, &[]);
    assert_eq!(code, Some(0), "{report} {err}");
    assert_session(
        &report,
        "the store checks it against the URL's CA file (tls_ca) and the host",
    );
    let redlock = format!(
        "redlock://{}/?tls=true&{params}",
        servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect::<Vec<_>>()
            .join(",")
    );
    let (code, report, err) = doctor(&env, &redlock, &[]);
    assert_eq!(code, Some(0), "{report} {err}");
    assert_session(
        &report,
        "the store checks every node's against the URL's CA (tls_ca) and the node's host",
    );
    assert!(
        !report["facts"]
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.starts_with("TLS of node")),
        "the nodes agree: {report}"
    );
}

#[test]
fn zookeeper_over_tls_names_the_protocol_and_the_servers_certificate() {
    let env = Env::new();
    // The secure port requires a client certificate: the doctor presents the URL's.
    let zk = leasehold_testkit::ZkServer::start_tls(leasehold_testkit::ServerCert::Localhost, true);
    let tls = zk.tls().unwrap();
    let url = format!(
        "zookeeper://127.0.0.1:{}/leasehold?tls=true&cacert={}&cert={}&key={}",
        zk.port(),
        tls.ca_cert().display(),
        tls.client_cert().display(),
        tls.client_key().display()
    );
    let (_, report, err) = doctor(&env, &url, &[]);
    assert!(err.is_empty() || !err.contains("panic"), "{err}");
    assert_session(
        &report,
        "the store checks it against the URL's cacert (or the system's CAs) and the host",
    );
}

/// A replica's clock is measured against its primary's (`TIME` on both at once, the
/// round trip counted against it): one 2 s ahead, with no Sentinel to take it off every
/// grant, is named and warned about; a replica with the primary's clock is not.
#[test]
fn redis_replica_clocks_are_measured_and_one_ahead_is_warned_about() {
    use std::sync::Arc;
    let env = Env::new();
    let primary = RedisServer::start();
    let clock = Arc::new(leasehold_testkit::FakeWallClock::new());
    clock.set("+2s");
    let port = primary.port().to_string();
    let ahead = RedisServer::start_with(RedisOptions::new().wall_clock(clock).args([
        "--replicaof",
        "127.0.0.1",
        port.as_str(),
    ]));
    let level = RedisServer::start_with(RedisOptions::new().args([
        "--replicaof",
        "127.0.0.1",
        port.as_str(),
    ]));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // Both online (ROLE lists a replica once its first synchronisation has begun).
    while primary
        .cli(&["INFO", "replication"])
        .matches("state=online")
        .count()
        < 2
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the replicas did not connect"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (code, report, err) = doctor(&env, &primary.url(), &[]);
    assert_eq!(code, Some(0), "{report} {err}");
    let clocks = report["facts"]["replica clocks"]
        .as_str()
        .unwrap_or_else(|| panic!("{report}"));
    let of = |port: u16| {
        let at = format!("127.0.0.1:{port} ");
        let rest = &clocks[clocks.find(&at).unwrap_or_else(|| panic!("{clocks}")) + at.len()..];
        rest.split(" (").next().unwrap().to_owned()
    };
    // The bound is the true offset plus at most the round trip: 2 s and a little.
    let ahead_words = of(ahead.port());
    let secs: f64 = ahead_words
        .strip_prefix('+')
        .and_then(|w| w.strip_suffix(" s"))
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("{clocks}"));
    assert!((2.0..3.0).contains(&secs), "{clocks}");
    let level_words = of(level.port());
    assert!(level_words.ends_with(" ms"), "{clocks}");
    let warned: Vec<&str> = report["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .filter(|w| w.contains("promoted by hand"))
        .collect();
    assert_eq!(warned.len(), 1, "{report}");
    assert!(warned[0].contains(&format!("127.0.0.1:{}", ahead.port())));
}
