//! `Store::diagnose` for SQLite: the file, and the setting that decides its restart row.

use leasehold_core::{Diagnosis, Finding, Verdict};

use crate::config::{SqliteConfig, Synchronous};

/// The diagnosis of a store opened with `config` on SQLite `version` in `journal` mode.
pub(crate) fn judge(config: &SqliteConfig, version: &str, journal: &str) -> Diagnosis {
    let mut d = Diagnosis::new();
    d.fact("server version", format!("SQLite {version} (embedded)"));
    d.fact("file", config.path().display().to_string());
    d.fact("journal", journal.to_owned());
    d.fact("TLS", "not applicable: a file on this host");
    d.fact(
        "identity",
        "this process's user (the file's permissions decide)",
    );
    let restart = match config.get_synchronous() {
        Synchronous::Full => Finding::new(
            "restart with persistence",
            Verdict::Holds,
            "synchronous=full",
            "every commit is synced before it returns: a crash or power loss keeps the lease \
             and its fence",
        ),
        _ => Finding::new(
            "restart with persistence",
            Verdict::FencesHold,
            "synchronous=normal",
            "an OS crash or power loss may roll back the last grants, so a second holder may \
             be let in; fences, floored at the wall clock, still rise",
        ),
    };
    d.finding(restart);
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synchronous_decides_the_restart_row() {
        let full = SqliteConfig::new("/tmp/x.db");
        let d = judge(&full, "3.46.0", "wal");
        let row = d.row("restart with persistence").unwrap();
        assert_eq!(
            (row.verdict, row.setting.as_str()),
            (Verdict::Holds, "synchronous=full")
        );
        assert_eq!(d.fact_value("file"), Some("/tmp/x.db"));
        assert_eq!(
            d.fact_value("server version"),
            Some("SQLite 3.46.0 (embedded)")
        );
        let normal = SqliteConfig::from_url("sqlite:///tmp/x.db?synchronous=normal").unwrap();
        let row = judge(&normal, "3", "wal")
            .row("restart with persistence")
            .unwrap()
            .clone();
        assert_eq!(row.verdict, Verdict::FencesHold);
    }
}
