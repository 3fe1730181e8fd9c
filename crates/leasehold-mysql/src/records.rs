//! Fenced records ([`Store::put_record`](leasehold_core::Store::put_record)) in the table
//! both stores share, `leasehold_records`.

use std::time::Duration;

use leasehold_core::{Fence, Key, Record, StoreError};
use leasehold_sql::{Failure, record};
use sqlx::Connection;

use crate::conn::Db;
use crate::error::is_deadlock;

/// How many times a put that lost a deadlock (rolled back whole) is retried.
const DEADLOCK_RETRIES: u32 = 5;

/// Stores the value at the fence unless the row's fence is as high. Assignments run left
/// to right, each seeing the ones before: `value` is compared with the old fence before
/// `fence` is changed. The row is locked (exclusively) either way until the transaction
/// ends. Parameters: key, fence, value, fence, value, fence, fence.
const PUT: &str = "INSERT INTO leasehold_records (record_key, fence, value) VALUES (?, ?, ?) \
     ON DUPLICATE KEY UPDATE value = IF(fence < ?, ?, value), fence = IF(fence < ?, ?, fence)";

/// The row of a key.
const GET: &str = "SELECT fence, value FROM leasehold_records WHERE record_key = ?";

/// [`Store::put_record`](leasehold_core::Store::put_record) on `db`: one transaction, the
/// conditional upsert then the read of the row (which the upsert locked, so the read sees
/// what stays until commit).
pub(crate) async fn put(
    db: &Db,
    key: &Key,
    fence: Fence,
    value: &[u8],
) -> Result<Record, StoreError> {
    record::check_value(db.backend, value)?;
    let f = fence.get();
    let (fence, value) = db
        .run("put record", async |conn| {
            let mut attempt = 0;
            loop {
                let mut tx = conn.begin().await?;
                let r = sqlx::query(PUT)
                    .bind(key.as_str())
                    .bind(f)
                    .bind(value)
                    .bind(f)
                    .bind(value)
                    .bind(f)
                    .bind(f)
                    .execute(&mut *tx)
                    .await;
                match r {
                    Ok(_) => {}
                    // A deadlock rolled the transaction back: nothing was written.
                    Err(e) if is_deadlock(&e) && attempt < DEADLOCK_RETRIES => {
                        drop(tx);
                        attempt += 1;
                        tokio::time::sleep(Duration::from_millis(u64::from(attempt) * 3)).await;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
                let row: Option<(u64, Vec<u8>)> = sqlx::query_as(GET)
                    .bind(key.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
                tx.commit().await?;
                return row.ok_or_else(|| {
                    Failure::Store(StoreError::new(
                        leasehold_core::StoreErrorKind::Other,
                        db.backend,
                        format!("the record `{key}` was not there right after it was written"),
                    ))
                });
            }
        })
        .await?;
    record::from_u64(db.backend, key, fence, value)
}

/// [`Store::get_record`](leasehold_core::Store::get_record) on `db`: one read.
pub(crate) async fn get(db: &Db, key: &Key) -> Result<Option<Record>, StoreError> {
    let row: Option<(u64, Vec<u8>)> = db
        .run("get record", async |conn| {
            Ok(sqlx::query_as(GET)
                .bind(key.as_str())
                .fetch_optional(conn)
                .await?)
        })
        .await?;
    row.map(|(fence, value)| record::from_u64(db.backend, key, fence, value))
        .transpose()
}
