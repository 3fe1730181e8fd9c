//! `Store::diagnose` for both MariaDB/MySQL stores: the server, the connection's TLS and
//! account, and the settings that decide their rows of `docs/guarantees.md`.

use std::time::Duration;

use leasehold_core::tls_session::{TlsSession, bounded, io_failure, report_look};
use leasehold_core::{Diagnosis, Finding, StoreError, TlsFailure, TlsProblem, Verdict};
use sqlx::Row;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::SslMode;
use crate::conn::Db;

/// What the server said.
struct Read {
    version: String,
    flush_at_commit: String,
    sync_binlog: String,
    log_bin: String,
    account: String,
    tls_version: String,
    cipher: String,
    grants: Vec<String>,
}

/// The diagnosis of the store on `db`; `getlock` for the `GET_LOCK` store.
pub(crate) async fn diagnose(db: &Db, getlock: bool) -> Result<Diagnosis, StoreError> {
    let read = db
        .run("diagnose", async |conn| {
            let row = sqlx::query(
                "SELECT CAST(VERSION() AS CHAR) AS version, \
                   CAST(@@GLOBAL.innodb_flush_log_at_trx_commit AS CHAR) AS flush, \
                   CAST(@@GLOBAL.sync_binlog AS CHAR) AS sync_binlog, \
                   CAST(@@GLOBAL.log_bin AS CHAR) AS log_bin, \
                   CAST(CURRENT_USER() AS CHAR) AS account",
            )
            .fetch_one(&mut *conn)
            .await?;
            let status: Vec<(String, String)> = sqlx::query_as(
                "SHOW SESSION STATUS WHERE Variable_name IN ('Ssl_version', 'Ssl_cipher')",
            )
            .fetch_all(&mut *conn)
            .await?;
            let grants: Vec<String> = sqlx::query_scalar("SHOW GRANTS")
                .fetch_all(&mut *conn)
                .await?;
            let of = |name: &str| {
                status
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            Ok(Read {
                version: row.try_get("version")?,
                flush_at_commit: row.try_get("flush")?,
                sync_binlog: row.try_get("sync_binlog")?,
                log_bin: row.try_get("log_bin")?,
                account: row.try_get("account")?,
                tls_version: of("Ssl_version"),
                cipher: of("Ssl_cipher"),
                grants,
            })
        })
        .await?;
    let mut d = judge(&read, db.config.get_ssl_mode(), getlock);
    if !read.tls_version.is_empty() && !db.config.uses_socket() {
        let c = &db.config;
        let look = look(c.get_host(), c.get_port(), c.get_connect_timeout()).await;
        report_look(&mut d, &look, peer_check(c.get_ssl_mode()));
    }
    Ok(d)
}

/// The capability flag a server sets when it offers TLS, and the client sets to ask for it.
const CLIENT_SSL: u32 = 0x0800;
/// The capabilities of the doctor's `SSLRequest`: 4.1 protocol, secure connection, TLS.
const SSL_REQUEST_CAPABILITIES: u32 = 0x0200 | 0x8000 | CLIENT_SSL;

/// The server's capability flags from its initial handshake packet (protocol 10): after
/// the protocol version, the NUL-terminated server version, the connection id and the
/// first 8 bytes of the scramble and a filler come the lower 16 bits, and after the
/// character set and status the upper 16. `None` if the packet is not such a handshake.
fn capabilities(payload: &[u8]) -> Option<u32> {
    if payload.first() != Some(&10) {
        return None;
    }
    let version_end = 1 + payload.get(1..)?.iter().position(|b| *b == 0)?;
    let at = version_end + 1 + 4 + 8 + 1;
    let lower = u16::from_le_bytes(payload.get(at..at + 2)?.try_into().ok()?);
    let upper = payload
        .get(at + 5..at + 7)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u16::from_le_bytes);
    Some(u32::from(lower) | (u32::from(upper) << 16))
}

/// The TLS session the server at `host`:`port` offers, read by a connection of the
/// doctor's own: the server's greeting, an `SSLRequest` packet, a handshake, nothing more
/// (no login packet, so no credentials; the server counts an aborted connection).
async fn look(host: &str, port: u16, within: Duration) -> Result<TlsSession, TlsFailure> {
    bounded(host, within, async {
        let io = io_failure(host);
        let mut tcp = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(&io)?;
        let mut header = [0u8; 4];
        tcp.read_exact(&mut header).await.map_err(&io)?;
        let len =
            usize::from(header[0]) | usize::from(header[1]) << 8 | usize::from(header[2]) << 16;
        if len > 64 * 1024 {
            return Err(TlsFailure::new(
                TlsProblem::Other,
                Some(host),
                "not a MySQL greeting",
            ));
        }
        let mut greeting = vec![0u8; len];
        tcp.read_exact(&mut greeting).await.map_err(&io)?;
        let caps = capabilities(&greeting).ok_or_else(|| {
            TlsFailure::new(
                TlsProblem::Other,
                Some(host),
                "not a MySQL protocol 10 greeting",
            )
        })?;
        if caps & CLIENT_SSL == 0 {
            return Err(TlsFailure::new(
                TlsProblem::NotOffered,
                Some(host),
                "the server's greeting does not offer TLS",
            ));
        }
        let mut request = vec![32, 0, 0, header[3].wrapping_add(1)];
        request.extend_from_slice(&SSL_REQUEST_CAPABILITIES.to_le_bytes());
        request.extend_from_slice(&(16u32 << 20).to_le_bytes());
        request.push(45); // utf8mb4_general_ci
        request.extend_from_slice(&[0u8; 23]);
        tcp.write_all(&request).await.map_err(&io)?;
        leasehold_core::tls_session::look(tcp, host, None).await
    })
    .await
}

/// What `ssl-mode` checks of the server's certificate.
fn peer_check(mode: SslMode) -> &'static str {
    match mode {
        SslMode::VerifyIdentity => {
            "signed by a trusted CA and names the host (ssl-mode=VERIFY_IDENTITY)"
        }
        SslMode::VerifyCa => "signed by a trusted CA; the host is not checked (ssl-mode=VERIFY_CA)",
        _ => "not checked",
    }
}

/// The grants that give more than leasehold needs (its tables' SELECT, INSERT, UPDATE,
/// DELETE, and CREATE for `migrate`): on every database, or administrative privileges.
fn beyond_needs(grants: &[String]) -> Vec<&str> {
    grants
        .iter()
        .map(String::as_str)
        .filter(|g| {
            let upper = g.to_ascii_uppercase();
            upper.contains(" ON *.*")
                && !upper.starts_with("GRANT USAGE ON *.*")
                && !upper.contains("GRANT PROXY")
        })
        .collect()
}

fn judge(r: &Read, mode: SslMode, getlock: bool) -> Diagnosis {
    let mut d = Diagnosis::new();
    d.fact("server version", r.version.clone());
    if r.tls_version.is_empty() {
        d.fact("TLS", "none: the connection is plaintext");
    } else {
        d.fact("TLS", format!("{}, {}", r.tls_version, r.cipher));
        d.fact("peer certificate", peer_check(mode));
    }
    d.fact("identity", format!("account {}", r.account));
    let beyond = beyond_needs(&r.grants);
    d.fact(
        "privileges beyond leasehold's",
        if beyond.is_empty() {
            "none on every database (*.*)".to_owned()
        } else {
            beyond.join("; ")
        },
    );
    if !beyond.is_empty() {
        d.warn(format!(
            "the account {} holds privileges on every database: more than leasehold needs \
             (SELECT, INSERT, UPDATE, DELETE on its tables); give it an account of its own \
             (docs/connections.md)",
            r.account
        ));
    }
    match mode {
        SslMode::VerifyIdentity => {}
        SslMode::VerifyCa => {
            d.warn("ssl-mode=VERIFY_CA does not check that the certificate names the host; use VERIFY_IDENTITY");
        }
        SslMode::Required => {
            d.warn("ssl-mode=REQUIRED checks no certificate: an impostor can answer; use VERIFY_IDENTITY");
        }
        SslMode::Preferred => {
            d.warn("ssl-mode=PREFERRED falls back to plaintext and checks no certificate; use VERIFY_IDENTITY");
        }
        SslMode::Disabled => {
            d.warn("ssl-mode=DISABLED: plaintext; use VERIFY_IDENTITY");
        }
    }
    let setting = format!(
        "innodb_flush_log_at_trx_commit={}, sync_binlog={}, log_bin={}",
        r.flush_at_commit, r.sync_binlog, r.log_bin
    );
    let durable = r.flush_at_commit == "1";
    let restart = if getlock {
        Finding::new(
            "restart with persistence",
            if durable {
                Verdict::FencesHold
            } else {
                Verdict::DoesNotHold
            },
            setting.clone(),
            if durable {
                "a server restart ends every session (the holders learn it at once); a host crash \
                 or a partitioned restart lets a second holder in while the first believes, and \
                 the fences, in durable rows, still rise"
            } else {
                "a crash may lose the last fence rows: the next grant may repeat a fence"
            },
        )
    } else if durable {
        Finding::new(
            "restart with persistence",
            Verdict::Holds,
            setting.clone(),
            "every grant is in the redo log on disk before it is answered: a crash keeps the \
             lease and its fence",
        )
    } else {
        Finding::new(
            "restart with persistence",
            Verdict::FencesHold,
            setting.clone(),
            "a crash may lose up to a second of answered grants, so a second holder may be let \
             in; fences still rise, floored at the server clock",
        )
    };
    d.finding(restart);
    if r.log_bin == "1" || r.log_bin.eq_ignore_ascii_case("ON") {
        let synced = r.sync_binlog == "1";
        d.finding(Finding::new(
            "fail-over",
            Verdict::FencesHold,
            setting,
            if synced {
                "the binary log is on disk at each commit; a replica promoted after a fail-over \
                 may still lack grants it had not received"
            } else {
                "sync_binlog is not 1: a crash may lose grants from the binary log that \
                 replicas read; fences still rise, floored at the server clock"
            },
        ));
    }
    d
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_greeting_says_whether_tls_is_offered() {
        // Protocol 10, version "5.5.5-10.11", id, scramble, filler, lower caps with SSL,
        // charset, status, upper caps.
        let mut g = vec![10];
        g.extend_from_slice(b"5.5.5-10.11\0");
        g.extend_from_slice(&[1, 0, 0, 0]);
        g.extend_from_slice(&[7; 8]);
        g.push(0);
        g.extend_from_slice(&0xfffeu16.to_le_bytes());
        g.push(45);
        g.extend_from_slice(&[2, 0]);
        g.extend_from_slice(&0x81bfu16.to_le_bytes());
        assert_eq!(super::capabilities(&g), Some(0x81bf_fffe));
        assert_ne!(super::capabilities(&g).unwrap() & super::CLIENT_SSL, 0);
        // The lower half alone (an old server's short greeting).
        let short = &g[..g.len() - 5];
        assert_eq!(super::capabilities(short), Some(0xfffe));
        // A server without TLS (MariaDB's usual 0xf7fe) clears the flag.
        let at = g.len() - 7;
        g[at..at + 2].copy_from_slice(&0xf7feu16.to_le_bytes());
        assert_eq!(super::capabilities(&g).unwrap() & super::CLIENT_SSL, 0);
        g[0] = 9;
        assert_eq!(super::capabilities(&g), None);
        assert_eq!(super::capabilities(&[10, b'x']), None);
        assert_eq!(super::capabilities(&[]), None);
    }

    use super::*;

    fn read() -> Read {
        Read {
            version: "10.11.19-MariaDB".into(),
            flush_at_commit: "1".into(),
            sync_binlog: "0".into(),
            log_bin: "0".into(),
            account: "app@%".into(),
            tls_version: "TLSv1.3".into(),
            cipher: "TLS_AES_256_GCM_SHA384".into(),
            grants: vec!["GRANT USAGE ON *.* TO `app`@`%`".into()],
        }
    }

    fn verdict(d: &Diagnosis, row: &str) -> Option<Verdict> {
        d.row(row).map(|f| f.verdict)
    }

    #[test]
    fn the_restart_row_follows_the_redo_log_flush() {
        let d = judge(&read(), SslMode::VerifyIdentity, false);
        assert_eq!(
            verdict(&d, "restart with persistence"),
            Some(Verdict::Holds)
        );
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        assert!(d.row("fail-over").is_none());
        let mut r = read();
        r.flush_at_commit = "2".into();
        let d = judge(&r, SslMode::VerifyIdentity, false);
        assert_eq!(
            verdict(&d, "restart with persistence"),
            Some(Verdict::FencesHold)
        );
        let d = judge(&r, SslMode::VerifyIdentity, true);
        assert_eq!(
            verdict(&d, "restart with persistence"),
            Some(Verdict::DoesNotHold)
        );
        let d = judge(&read(), SslMode::VerifyIdentity, true);
        assert_eq!(
            verdict(&d, "restart with persistence"),
            Some(Verdict::FencesHold)
        );
    }

    #[test]
    fn a_binary_log_adds_the_fail_over_row() {
        let mut r = read();
        r.log_bin = "1".into();
        let d = judge(&r, SslMode::VerifyIdentity, false);
        assert!(
            d.row("fail-over")
                .unwrap()
                .why
                .contains("sync_binlog is not 1")
        );
        r.sync_binlog = "1".into();
        let d = judge(&r, SslMode::VerifyIdentity, false);
        assert!(
            d.row("fail-over")
                .unwrap()
                .why
                .contains("on disk at each commit")
        );
    }

    #[test]
    fn grants_on_every_database_and_weak_tls_are_warned_about() {
        let mut r = read();
        r.grants
            .push("GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost`".into());
        r.grants
            .push("GRANT PROXY ON ''@'%' TO 'root'@'localhost' WITH GRANT OPTION".into());
        r.tls_version.clear();
        let d = judge(&r, SslMode::Preferred, false);
        assert_eq!(
            d.fact_value("privileges beyond leasehold's"),
            Some("GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost`")
        );
        assert_eq!(
            d.fact_value("TLS"),
            Some("none: the connection is plaintext")
        );
        assert_eq!(d.warnings.len(), 2, "{:?}", d.warnings);
        for mode in [SslMode::VerifyCa, SslMode::Required, SslMode::Disabled] {
            assert_eq!(judge(&read(), mode, false).warnings.len(), 1, "{mode:?}");
        }
    }
}
