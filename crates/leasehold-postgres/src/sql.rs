//! SQL text and row helpers both stores and the records share: parameters bound or
//! inlined (behind a transaction pooler), `LIKE` escaping, columns read or reported
//! corrupt.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Fence, Key, LeaseInfo, OwnerToken, StoreError, StoreErrorKind,
};
use leasehold_sql::lease::micros;
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row};

use crate::{BACKEND_TABLE as BACKEND, error};

/// The first 8 bytes of the SHA-256 digest of `parts` joined by NUL bytes.
pub(crate) fn digest64(parts: &[&str]) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update([0u8]);
        }
        h.update(p.as_bytes());
    }
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    u64::from_be_bytes(first)
}

/// The 64-bit advisory lock id of `key`: the first 8 bytes of the SHA-256 digest of the
/// key's UTF-8 bytes, read as a big-endian signed integer.
///
/// Stable across versions, platforms and languages; in SQL it is
/// `('x' || left(encode(sha256(convert_to(key, 'UTF8')), 'hex'), 16))::bit(64)::bigint`.
/// In `pg_locks` the lock shows as `locktype = 'advisory'`, `classid` = the high 32 bits,
/// `objid` = the low 32 bits, `objsubid = 1`. Two keys share a lock only if their digests
/// share 64 bits (for a billion keys, a chance of about 3 in 100 000); they would then
/// exclude each other, which is safe, while keeping separate fences.
pub fn advisory_lock_id(key: &str) -> i64 {
    digest64(&[key]) as i64
}

/// A parameter of a statement: bound in the extended protocol, or inlined as an escaped
/// literal in the simple protocol (behind a transaction-pooling proxy).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Text(&'a str),
    Bytes(&'a [u8]),
    Int(i64),
    Int4(i32),
}

/// Renders `sql` with `$n` replaced by the literal of `args[n - 1]`, in one pass (so a
/// literal's own text is never substituted again). Text becomes an `E'…'` string with
/// backslashes and quotes escaped (its meaning does not depend on
/// `standard_conforming_strings`), bytes a `decode('…', 'hex')`, integers a `bigint`.
/// The statements are leasehold's own: they hold no `$` inside quotes.
///
/// # Errors
/// A text value with a NUL character (PostgreSQL text cannot hold one).
pub(crate) fn inline(sql: &str, args: &[Arg<'_>]) -> Result<String, StoreError> {
    use std::fmt::Write;
    let mut out = String::with_capacity(sql.len() + 64);
    let mut chars = sql.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        let mut end = i + 1;
        while let Some(&(j, d)) = chars.peek() {
            if !d.is_ascii_digit() {
                break;
            }
            end = j + 1;
            chars.next();
        }
        let Some(arg) = sql[i + 1..end]
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|n| args.get(n))
        else {
            out.push_str(&sql[i..end]);
            continue;
        };
        match arg {
            Arg::Text(t) => {
                if t.contains('\0') {
                    return Err(StoreError::new(
                        StoreErrorKind::InvalidInput,
                        BACKEND,
                        "a text value contains a NUL character",
                    ));
                }
                out.push_str("E'");
                for ch in t.chars() {
                    match ch {
                        '\\' => out.push_str("\\\\"),
                        '\'' => out.push_str("''"),
                        _ => out.push(ch),
                    }
                }
                out.push('\'');
            }
            Arg::Bytes(b) => {
                out.push_str("decode('");
                for byte in *b {
                    let _ = write!(out, "{byte:02x}");
                }
                out.push_str("', 'hex')");
            }
            Arg::Int(n) => {
                let _ = write!(out, "({n})::bigint");
            }
            Arg::Int4(n) => {
                let _ = write!(out, "({n})::int4");
            }
        }
    }
    Ok(out)
}

/// `sql` as a prepared statement with `args` bound.
pub(crate) fn bound<'q>(
    sql: &Arc<str>,
    args: &[Arg<'q>],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let mut q = sqlx::query(AssertSqlSafe(sql.clone()));
    for a in args {
        q = match *a {
            Arg::Text(t) => q.bind(t),
            Arg::Bytes(b) => q.bind(b),
            Arg::Int(n) => q.bind(n),
            Arg::Int4(n) => q.bind(n),
        };
    }
    q
}

/// Escapes `prefix` for `LIKE … ESCAPE` (backslash) and appends `%`.
pub(crate) fn like_prefix(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '\\' | '%' | '_') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// A TTL in whole microseconds (checked to lie in 10 ms ..= 24 h by the caller).
pub(crate) fn ttl_us(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX)
}

/// Reads an owner token column (16 bytes) or reports the row corrupt.
pub(crate) fn owner_of(backend: &'static str, bytes: &[u8]) -> Result<OwnerToken, StoreError> {
    <[u8; 16]>::try_from(bytes)
        .map(OwnerToken::from_bytes)
        .map_err(|_| {
            StoreError::new(
                StoreErrorKind::Corrupt,
                backend,
                format!(
                    "owner column holds {} bytes instead of 16: not a leasehold lease",
                    bytes.len()
                ),
            )
        })
}

/// Reads a fence column or reports the row corrupt.
pub(crate) fn fence_of(backend: &'static str, v: i64) -> Result<Fence, StoreError> {
    u64::try_from(v)
        .ok()
        .filter(|f| *f > 0)
        .map(Fence)
        .ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::Corrupt,
                backend,
                format!("fence column holds {v}: not a leasehold fence"),
            )
        })
}

pub(crate) fn col<'r, T>(backend: &'static str, row: &'r PgRow, name: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(name)
        .map_err(|e| error::map(backend, "decoding a row", e))
}

pub(crate) fn info_of(backend: &'static str, row: &PgRow) -> Result<LeaseInfo, StoreError> {
    let key: String = col(backend, row, "key")?;
    let key = Key::new(key).map_err(|e| {
        StoreError::new(
            StoreErrorKind::Corrupt,
            backend,
            format!("key column holds an invalid key: {e}"),
        )
    })?;
    let owner: Vec<u8> = col(backend, row, "owner")?;
    let fence: i64 = col(backend, row, "fence")?;
    let remaining: i64 = col(backend, row, "remaining_us")?;
    Ok(LeaseInfo {
        key,
        owner: owner_of(backend, &owner)?,
        fence: fence_of(backend, fence)?,
        remaining: Some(micros(remaining)),
    })
}

/// The floor of a reported remaining TTL, so that a waiter never spins on a zero.
const MIN_REMAINING: Duration = Duration::from_millis(1);

/// An acquire's `Held`, with the holder's remaining TTL in µs (unknown: none left), at
/// least [`MIN_REMAINING`].
pub(crate) fn held(remaining_us: Option<i64>) -> AcquireOutcome {
    AcquireOutcome::Held {
        remaining: Some(micros(remaining_us.unwrap_or(0)).max(MIN_REMAINING)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inlined_literals_are_escaped_in_one_pass() {
        let out = inline(
            "SELECT $1, $2, $3, $4, $5",
            &[
                Arg::Text("a'b\\c$2"),
                Arg::Bytes(&[0, 0xab]),
                Arg::Int(-7),
                Arg::Int4(-8),
            ],
        )
        .unwrap();
        assert_eq!(
            out,
            r"SELECT E'a''b\\c$2', decode('00ab', 'hex'), (-7)::bigint, (-8)::int4, $5"
        );
        assert!(inline("SELECT $1", &[Arg::Text("a\0b")]).is_err());
    }

    #[test]
    fn like_escaping() {
        assert_eq!(like_prefix("a_b%c\\d"), "a\\_b\\%c\\\\d%");
        assert_eq!(like_prefix(""), "%");
    }
}
