//! Which stores the command can reach, and the default one.

use std::path::PathBuf;

/// The store URL when neither `--store` nor `LEASEHOLD_STORE` names one: the embedded
/// SQLite database in the user's state directory.
pub fn default_url() -> String {
    // SqliteConfig's Display is a URL that encodes awkward path characters.
    leasehold::sqlite::SqliteConfig::new(state_dir().join("leases.db")).to_string()
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
