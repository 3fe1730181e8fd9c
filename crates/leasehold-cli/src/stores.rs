//! Which stores the command can reach, and the default one.

use std::path::PathBuf;
use std::sync::Arc;

use leasehold::{Registry, Store, StoreError};

/// The registry of every store linked into the command.
pub fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(Arc::new(leasehold_sqlite::SqliteFactory));
    r.register(Arc::new(leasehold_redis::RedisFactory));
    r.register(Arc::new(leasehold_postgres::PgFactory));
    r.register(Arc::new(leasehold_mysql::MySqlFactory));
    r
}

/// The store URL when neither `--store` nor `LEASEHOLD_STORE` names one: the embedded
/// SQLite database in the user's state directory.
pub fn default_url() -> String {
    // SqliteConfig's Display is a URL that encodes awkward path characters.
    leasehold_sqlite::SqliteConfig::new(state_dir().join("leases.db")).to_string()
}

/// `$XDG_STATE_HOME/leasehold`, or `~/.local/state/leasehold`.
pub fn state_dir() -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("leasehold")
}

/// Whether `url` names the in-memory store, which the library keeps for tests and
/// single-process programs: useless across processes, so the command refuses it.
pub fn is_memory(url: &str) -> bool {
    url.split_once("://")
        .is_some_and(|(scheme, _)| scheme == "memory")
}

/// Opens the store named by `url`.
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    registry().open(url).await
}
