//! `Store::diagnose` for both MariaDB/MySQL stores: the server, the connection's TLS and
//! account, and the settings that decide their rows of `docs/guarantees.md`.

use leasehold_core::{Diagnosis, Finding, StoreError, Verdict};
use sqlx::Row;

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
    Ok(judge(&read, db.config.get_ssl_mode(), getlock))
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
        d.fact(
            "peer certificate",
            match mode {
                SslMode::VerifyIdentity => {
                    "signed by a trusted CA and names the host (ssl-mode=VERIFY_IDENTITY)"
                }
                SslMode::VerifyCa => {
                    "signed by a trusted CA; the host is not checked (ssl-mode=VERIFY_CA)"
                }
                _ => "not checked",
            },
        );
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
