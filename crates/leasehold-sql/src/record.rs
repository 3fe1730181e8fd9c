//! The steps every SQL store's fenced records ([`Store::put_record`]) take the same way,
//! whatever its SQL: checking a value before it is sent, and reading a stored record back.
//!
//! The statements stay in each backend (one table per database: the record's key, the
//! fence it was written at, the value).
//!
//! [`Store::put_record`]: leasehold_core::Store::put_record

use leasehold_core::{Fence, Key, MAX_RECORD_LEN, Record, StoreError, StoreErrorKind};

/// Refuses a value longer than [`MAX_RECORD_LEN`] before anything is sent (the column
/// could not hold it, or a database would cut it silently).
///
/// # Errors
/// [`StoreErrorKind::InvalidInput`] for a value longer than [`MAX_RECORD_LEN`] bytes.
pub fn check_value(backend: &'static str, value: &[u8]) -> Result<(), StoreError> {
    if value.len() > MAX_RECORD_LEN {
        return Err(StoreError::new(
            StoreErrorKind::InvalidInput,
            backend,
            format!(
                "a record value of {} bytes is longer than {MAX_RECORD_LEN}",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// A record read back from a row whose fence column is a signed 64-bit integer (SQLite
/// `INTEGER`, PostgreSQL `bigint`).
///
/// # Errors
/// [`StoreErrorKind::Corrupt`] for a negative fence or a value longer than
/// [`MAX_RECORD_LEN`]: the row was not written by leasehold, and is never read as if it
/// were.
pub fn from_i64(
    backend: &'static str,
    key: &Key,
    fence: i64,
    value: Vec<u8>,
) -> Result<Record, StoreError> {
    let fence = u64::try_from(fence)
        .map_err(|_| corrupt(backend, key, format!("its fence column holds {fence}")))?;
    from_u64(backend, key, fence, value)
}

/// A record read back from a row whose fence column is unsigned (MariaDB/MySQL
/// `BIGINT UNSIGNED`).
///
/// # Errors
/// [`StoreErrorKind::Corrupt`] for a value longer than [`MAX_RECORD_LEN`].
pub fn from_u64(
    backend: &'static str,
    key: &Key,
    fence: u64,
    value: Vec<u8>,
) -> Result<Record, StoreError> {
    if value.len() > MAX_RECORD_LEN {
        return Err(corrupt(
            backend,
            key,
            format!("its value holds {} bytes", value.len()),
        ));
    }
    Ok(Record {
        fence: Fence(fence),
        value,
    })
}

fn corrupt(backend: &'static str, key: &Key, what: String) -> StoreError {
    StoreError::new(
        StoreErrorKind::Corrupt,
        backend,
        format!("the record `{key}` is not a leasehold record: {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new("election:a").unwrap()
    }

    #[test]
    fn values_up_to_the_limit_pass() {
        assert!(check_value("test", b"").is_ok());
        assert!(check_value("test", &[0; MAX_RECORD_LEN]).is_ok());
        let e = check_value("test", &[0; MAX_RECORD_LEN + 1]).unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::InvalidInput);
        assert_eq!(e.backend(), "test");
    }

    #[test]
    fn rows_read_back_or_are_corrupt() {
        assert_eq!(
            from_i64("test", &key(), 7, b"v".to_vec()).unwrap(),
            Record {
                fence: Fence(7),
                value: b"v".to_vec()
            }
        );
        assert_eq!(
            from_i64("test", &key(), i64::MAX, vec![]).unwrap().fence,
            Fence(i64::MAX as u64)
        );
        assert_eq!(
            from_u64("test", &key(), u64::MAX, vec![]).unwrap().fence,
            Fence(u64::MAX)
        );
        for e in [
            from_i64("test", &key(), -1, vec![]).unwrap_err(),
            from_i64("test", &key(), 1, vec![0; MAX_RECORD_LEN + 1]).unwrap_err(),
            from_u64("test", &key(), 1, vec![0; MAX_RECORD_LEN + 1]).unwrap_err(),
        ] {
            assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{e}");
            assert!(e.to_string().contains("election:a"), "{e}");
        }
    }
}
