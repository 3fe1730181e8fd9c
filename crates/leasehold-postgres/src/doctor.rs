//! `Store::diagnose` for both PostgreSQL stores: the server, the connection's TLS and role,
//! and the settings that decide their rows of `docs/guarantees.md`.

use std::time::Duration;

use leasehold_core::tls_session::{TlsSession, bounded, io_failure, report_look};
use leasehold_core::{Diagnosis, Finding, StoreError, TlsFailure, TlsProblem, Verdict};
use sqlx::Row;
use sqlx::postgres::PgSslMode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error;
use crate::tables::Tables;

/// One simple-protocol statement (it works behind a transaction pooler too), read on one
/// connection of the pool.
const QUERY: &str = "SELECT current_setting('server_version') AS version, \
       current_setting('fsync') AS fsync, \
       current_setting('synchronous_commit') AS synchronous_commit, \
       current_setting('synchronous_standby_names') AS standbys, \
       current_user::text AS role, \
       inet_server_port() AS server_port, \
       pg_is_in_recovery() AS in_recovery, \
       (SELECT count(*) FROM pg_stat_replication) AS replicas, \
       s.ssl AS ssl, s.version AS tls_version, s.cipher AS cipher, s.client_dn AS client_dn, \
       r.rolsuper AS superuser, r.rolcreaterole AS createrole, r.rolcreatedb AS createdb, \
       r.rolbypassrls AS bypassrls, r.rolreplication AS replication \
     FROM pg_roles r \
     LEFT JOIN pg_stat_ssl s ON s.pid = pg_backend_pid() \
     WHERE r.rolname = current_user";

/// What the query read.
struct Read {
    version: String,
    fsync: String,
    synchronous_commit: String,
    standbys: String,
    role: String,
    server_port: Option<i32>,
    in_recovery: bool,
    replicas: i64,
    ssl: Option<bool>,
    tls_version: Option<String>,
    cipher: Option<String>,
    client_dn: Option<String>,
    powers: Vec<&'static str>,
}

/// The diagnosis of the store on `t`; `advisory` for the advisory-lock store.
pub(crate) async fn diagnose(t: &Tables, advisory: bool) -> Result<Diagnosis, StoreError> {
    let map = |e| error::map(t.backend, "diagnose", e);
    let row = sqlx::raw_sql(sqlx::AssertSqlSafe(QUERY))
        .fetch_one(&t.pool)
        .await
        .map_err(map)?;
    let flag = |name: &str| row.try_get::<Option<bool>, _>(name).ok().flatten() == Some(true);
    let mut powers = Vec::new();
    for (column, power) in [
        ("superuser", "SUPERUSER"),
        ("createrole", "CREATEROLE"),
        ("createdb", "CREATEDB"),
        ("bypassrls", "BYPASSRLS"),
        ("replication", "REPLICATION"),
    ] {
        if flag(column) {
            powers.push(power);
        }
    }
    let read = Read {
        version: row.try_get("version").map_err(map)?,
        fsync: row.try_get("fsync").map_err(map)?,
        synchronous_commit: row.try_get("synchronous_commit").map_err(map)?,
        standbys: row.try_get("standbys").map_err(map)?,
        role: row.try_get("role").map_err(map)?,
        server_port: row.try_get("server_port").map_err(map)?,
        in_recovery: flag("in_recovery"),
        replicas: row.try_get("replicas").map_err(map)?,
        ssl: row.try_get("ssl").map_err(map)?,
        tls_version: row.try_get("tls_version").map_err(map)?,
        cipher: row.try_get("cipher").map_err(map)?,
        client_dn: row.try_get("client_dn").map_err(map)?,
        powers,
    };
    let options = t.pool.connect_options();
    let tcp_port = (!options.get_host().starts_with('/')).then(|| options.get_port());
    let mut d = judge(&read, options.get_ssl_mode(), tcp_port, t.simple, advisory);
    if read.ssl == Some(true)
        && let Some(port) = tcp_port
    {
        let within = t.pool.options().get_acquire_timeout();
        let look = look(options.get_host(), port, within).await;
        report_look(&mut d, &look, peer_check(options.get_ssl_mode()));
    }
    Ok(d)
}

/// PostgreSQL's `SSLRequest` message: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// The TLS session the server at `host`:`port` offers, read by a connection of the
/// doctor's own: `SSLRequest`, the server's `S`, a handshake, nothing more (no startup
/// message, so no login and no credentials).
async fn look(host: &str, port: u16, within: Duration) -> Result<TlsSession, TlsFailure> {
    bounded(host, within, async {
        let io = io_failure(host);
        let mut tcp = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(&io)?;
        tcp.write_all(&SSL_REQUEST).await.map_err(&io)?;
        let mut answer = [0u8; 1];
        tcp.read_exact(&mut answer).await.map_err(&io)?;
        if answer[0] != b'S' {
            return Err(TlsFailure::new(
                TlsProblem::NotOffered,
                Some(host),
                "the server answered SSLRequest with N",
            ));
        }
        leasehold_core::tls_session::look(tcp, host, None).await
    })
    .await
}

/// What `sslmode` checks of the server's certificate.
fn peer_check(mode: PgSslMode) -> &'static str {
    match mode {
        PgSslMode::VerifyFull => "signed by a trusted CA and names the host (sslmode=verify-full)",
        PgSslMode::VerifyCa => {
            "signed by a trusted CA; the host is not checked (sslmode=verify-ca)"
        }
        _ => "not checked",
    }
}

/// The diagnosis from what was read: `mode` the URL's `sslmode`, `url_port` the TCP port
/// the URL connects to (`None` over a Unix socket), `simple` whether
/// `leasehold_pooler=transaction` is set.
fn judge(
    r: &Read,
    mode: PgSslMode,
    url_port: Option<u16>,
    simple: bool,
    advisory: bool,
) -> Diagnosis {
    let mut d = Diagnosis::new();
    d.fact("server version", format!("PostgreSQL {}", r.version));
    match (r.ssl, &r.tls_version) {
        (Some(true), Some(v)) => {
            let cipher = r.cipher.as_deref().unwrap_or("?");
            d.fact("TLS", format!("{v}, {cipher}"));
            d.fact("peer certificate", peer_check(mode));
        }
        _ => {
            d.fact("TLS", "none: the connection is plaintext");
        }
    }
    d.fact("identity", format!("role {}", r.role));
    if let Some(dn) = r.client_dn.as_deref().filter(|dn| !dn.is_empty()) {
        d.fact("client certificate", dn);
    }
    d.fact(
        "privileges beyond leasehold's",
        if r.powers.is_empty() {
            "none of SUPERUSER, CREATEROLE, CREATEDB, BYPASSRLS, REPLICATION".to_owned()
        } else {
            r.powers.join(", ")
        },
    );
    if !r.powers.is_empty() {
        d.warn(format!(
            "the role {} has {}: more than leasehold needs (SELECT, INSERT, UPDATE, DELETE on its \
             tables); give it a role of its own (docs/connections.md)",
            r.role,
            r.powers.join(", ")
        ));
    }
    match mode {
        PgSslMode::VerifyFull => {}
        PgSslMode::VerifyCa => {
            d.warn("sslmode=verify-ca does not check that the certificate names the host; use verify-full");
        }
        PgSslMode::Require => {
            d.warn(
                "sslmode=require checks no certificate: an impostor can answer; use verify-full",
            );
        }
        PgSslMode::Prefer | PgSslMode::Allow => {
            d.warn(
                "sslmode=prefer falls back to plaintext and checks no certificate; use verify-full",
            );
        }
        PgSslMode::Disable => {
            d.warn("sslmode=disable: plaintext; use verify-full");
        }
    }
    d.fact("replicas", r.replicas.to_string());

    // The lease table's restart row: commits must reach the disk before they are answered.
    let durable = r.fsync == "on" && r.synchronous_commit != "off";
    let setting = format!(
        "fsync={}, synchronous_commit={}",
        r.fsync, r.synchronous_commit
    );
    let restart = if advisory {
        Finding::new(
            "restart with persistence",
            if r.fsync == "on" {
                Verdict::FencesHold
            } else {
                Verdict::DoesNotHold
            },
            setting,
            if r.fsync == "on" {
                "a server restart ends every session (the holders learn it at once); a host crash \
                 or a partitioned restart lets a second holder in while the first believes, and \
                 the fences, in durable rows, still rise"
            } else {
                "fsync=off: a host crash may corrupt the fence rows"
            },
        )
    } else if durable {
        Finding::new(
            "restart with persistence",
            Verdict::Holds,
            setting,
            "every grant is on disk before it is answered: a restart keeps the lease and its fence",
        )
    } else {
        Finding::new(
            "restart with persistence",
            Verdict::FencesHold,
            setting,
            "a crash may lose grants already answered, so a second holder may be let in; \
             fences still rise, floored at the database clock",
        )
    };
    d.finding(restart);

    // A proxy in between: the server listens on another port than the URL names.
    let between =
        matches!((url_port, r.server_port), (Some(url), Some(server)) if i32::from(url) != server);
    let pooler_setting = format!(
        "leasehold_pooler={}, URL port {}, server port {}",
        if simple { "transaction" } else { "none" },
        url_port.map_or("(socket)".to_owned(), |p| p.to_string()),
        r.server_port
            .map_or("(socket)".to_owned(), |p| p.to_string()),
    );
    let pooler = match (advisory, simple, between) {
        (false, true, _) => Finding::new(
            "transaction pooler",
            Verdict::Holds,
            pooler_setting,
            "simple-protocol statements, each one transaction: a transaction pooler cannot split them",
        ),
        (_, false, false) => Finding::new(
            "transaction pooler",
            Verdict::Holds,
            pooler_setting,
            "a direct connection: the server answers on the port the URL names",
        ),
        (_, _, true) => Finding::new(
            "transaction pooler",
            Verdict::Unknown,
            pooler_setting,
            if advisory {
                "something in between (a proxy or pooler): session locks need a session of their \
                 own; a transaction pooler would hand it to others (use postgres:// instead)"
            } else {
                "something in between (a proxy or pooler): if it pools transactions, add \
                 leasehold_pooler=transaction to the URL"
            },
        ),
        (true, true, false) => Finding::new(
            "transaction pooler",
            Verdict::Holds,
            pooler_setting,
            "the advisory store refuses leasehold_pooler=transaction",
        ),
    };
    d.finding(pooler);

    if r.in_recovery {
        d.warn("the server is a standby (in recovery): it cannot grant leases");
    }
    if r.replicas > 0 {
        let synchronous = !r.standbys.trim().is_empty() && r.synchronous_commit != "local";
        d.finding(Finding::new(
            "fail-over",
            Verdict::FencesHold,
            format!(
                "{} replica(s), synchronous_standby_names='{}', synchronous_commit={}",
                r.replicas, r.standbys, r.synchronous_commit
            ),
            if synchronous {
                "a promoted synchronous standby has every answered grant; holders still learn of \
                 the switch only at their next renewal, so two may believe at once"
            } else {
                "asynchronous replication: a promoted replica may lack the last grants; fences \
                 hold by the clock floor"
            },
        ));
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read() -> Read {
        Read {
            version: "15.19".into(),
            fsync: "on".into(),
            synchronous_commit: "on".into(),
            standbys: String::new(),
            role: "app".into(),
            server_port: Some(5432),
            in_recovery: false,
            replicas: 0,
            ssl: Some(true),
            tls_version: Some("TLSv1.3".into()),
            cipher: Some("TLS_AES_256_GCM_SHA384".into()),
            client_dn: None,
            powers: Vec::new(),
        }
    }

    fn verdict(d: &Diagnosis, row: &str) -> Option<Verdict> {
        d.row(row).map(|f| f.verdict)
    }

    #[test]
    fn the_restart_row_follows_fsync_and_synchronous_commit() {
        let d = judge(&read(), PgSslMode::VerifyFull, Some(5432), false, false);
        assert_eq!(
            verdict(&d, "restart with persistence"),
            Some(Verdict::Holds)
        );
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        let mut r = read();
        r.synchronous_commit = "off".into();
        let d = judge(&r, PgSslMode::VerifyFull, Some(5432), false, false);
        assert_eq!(
            verdict(&d, "restart with persistence"),
            Some(Verdict::FencesHold)
        );
        let mut r = read();
        r.fsync = "off".into();
        let d = judge(&r, PgSslMode::VerifyFull, Some(5432), false, false);
        assert_eq!(
            verdict(&d, "restart with persistence"),
            Some(Verdict::FencesHold)
        );
        let d = judge(&r, PgSslMode::VerifyFull, Some(5432), false, true);
        assert_eq!(
            verdict(&d, "restart with persistence"),
            Some(Verdict::DoesNotHold)
        );
        let d = judge(&read(), PgSslMode::VerifyFull, Some(5432), false, true);
        assert_eq!(
            verdict(&d, "restart with persistence"),
            Some(Verdict::FencesHold)
        );
    }

    #[test]
    fn a_port_other_than_the_servers_is_something_in_between() {
        let d = judge(&read(), PgSslMode::VerifyFull, Some(6432), false, false);
        assert_eq!(verdict(&d, "transaction pooler"), Some(Verdict::Unknown));
        let d = judge(&read(), PgSslMode::VerifyFull, Some(6432), true, false);
        assert_eq!(verdict(&d, "transaction pooler"), Some(Verdict::Holds));
        let d = judge(&read(), PgSslMode::VerifyFull, Some(6432), false, true);
        assert_eq!(verdict(&d, "transaction pooler"), Some(Verdict::Unknown));
        let d = judge(&read(), PgSslMode::VerifyFull, None, false, false);
        assert_eq!(verdict(&d, "transaction pooler"), Some(Verdict::Holds));
        let d = judge(&read(), PgSslMode::VerifyFull, Some(5432), false, true);
        assert_eq!(verdict(&d, "transaction pooler"), Some(Verdict::Holds));
    }

    #[test]
    fn weak_tls_modes_and_powerful_roles_are_warned_about() {
        for (mode, words) in [
            (PgSslMode::Prefer, "prefer"),
            (PgSslMode::Require, "require"),
            (PgSslMode::VerifyCa, "verify-ca"),
            (PgSslMode::Disable, "disable"),
        ] {
            let d = judge(&read(), mode, Some(5432), false, false);
            assert!(
                d.warnings.iter().any(|w| w.contains(words)),
                "{mode:?}: {:?}",
                d.warnings
            );
        }
        let mut r = read();
        r.powers = vec!["SUPERUSER"];
        r.ssl = Some(false);
        let d = judge(&r, PgSslMode::VerifyFull, Some(5432), false, false);
        assert!(d.warnings.iter().any(|w| w.contains("SUPERUSER")));
        assert_eq!(
            d.fact_value("privileges beyond leasehold's"),
            Some("SUPERUSER")
        );
        assert_eq!(
            d.fact_value("TLS"),
            Some("none: the connection is plaintext")
        );
        assert_eq!(d.fact_value("peer certificate"), None);
    }

    #[test]
    fn replicas_add_the_fail_over_row() {
        assert!(
            judge(&read(), PgSslMode::VerifyFull, Some(5432), false, false)
                .row("fail-over")
                .is_none()
        );
        let mut r = read();
        r.replicas = 1;
        let d = judge(&r, PgSslMode::VerifyFull, Some(5432), false, false);
        assert_eq!(verdict(&d, "fail-over"), Some(Verdict::FencesHold));
        assert!(d.row("fail-over").unwrap().why.contains("asynchronous"));
        r.standbys = "FIRST 1 (s1)".into();
        let d = judge(&r, PgSslMode::VerifyFull, Some(5432), false, false);
        assert!(
            d.row("fail-over")
                .unwrap()
                .why
                .contains("synchronous standby")
        );
    }
}
