//! SQL text and row helpers both stores share.

use std::str::FromStr;

use leasehold_core::{Key, OwnerToken, StoreError};

/// The server clock in microseconds since the Unix epoch, constant within one statement.
/// (`UNIX_TIMESTAMP(NOW(6))` with the session time zone at UTC, which the stores set.)
macro_rules! now_us {
    () => {
        "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"
    };
}
pub(crate) use now_us;

/// Escapes `%`, `_` and the escape character `!` for `LIKE … ESCAPE '!'`.
pub(crate) fn like_prefix(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '%' | '_' | '!') {
            out.push('!');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// An owner column (32 hex digits), or `corrupt` (the store's report of the row of `key`).
pub(crate) fn parse_owner(
    key: &str,
    owner: &str,
    corrupt: fn(&str, &str) -> StoreError,
) -> Result<OwnerToken, StoreError> {
    OwnerToken::from_str(owner).map_err(|_| corrupt(key, "the owner is not 32 hex digits"))
}

/// The key of a row that a `list` of `prefix` read (its `lease_key` bytes): `None` when it
/// does not start with `prefix` (the `LIKE` folds case), `corrupt` (the store's report of
/// a row, by key and what is wrong) when it is not a valid key.
pub(crate) fn listed_key(
    name: Vec<u8>,
    prefix: &str,
    corrupt: fn(&str, &str) -> StoreError,
) -> Result<Option<Key>, StoreError> {
    let name = String::from_utf8(name).map_err(|_| corrupt("?", "the key is not UTF-8"))?;
    if !name.starts_with(prefix) {
        return Ok(None);
    }
    Key::new(&name)
        .map(Some)
        .map_err(|_| corrupt(&name, "not a valid key"))
}
