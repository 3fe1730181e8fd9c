//! Fenced records ([`Store::put_record`](leasehold_core::Store::put_record)): keys
//! `<prefix>\0records\0<key>` on no etcd lease, holding the fence and the value.

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp};
use leasehold_core::{Fence, Key, Record, StoreError, StoreErrorKind};

use crate::conn::{EtcdStore, gets};
use crate::error::{err, map_err};

/// The namespace of records under the store prefix: `<prefix>\0records\0`. Lease keys are
/// never empty and never contain a NUL byte, so no lease key, and no queue (`<lease
/// key>\0…`), starts with it; `list` skips every key holding a NUL.
const RECORDS_NS: &str = "\0records\0";

/// How many times a record write whose compare lost (another write came between the
/// read and the transaction) reads and tries again.
const RECORD_ATTEMPTS: u32 = 8;

/// Reads a record's value back (`Record::to_fenced_bytes`); `Corrupt` when it is not one.
fn decode_record(kv: &KeyValue) -> Result<Record, StoreError> {
    Record::from_fenced_bytes(kv.value()).ok_or_else(|| {
        err(
            StoreErrorKind::Corrupt,
            "an etcd record key holds no fence and value: written by something else?",
        )
    })
}

impl EtcdStore {
    /// The etcd key that holds `key`'s record (see
    /// [`Store::put_record`](leasehold_core::Store::put_record)): `<prefix>\0records\0<key>`,
    /// apart from every lease key and waiting queue.
    pub fn record_key(&self, key: &Key) -> String {
        format!("{}{RECORDS_NS}{}", self.config.key_prefix(), key.as_str())
    }

    pub(crate) async fn do_put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        let record_key = self.record_key(key);
        let ours = Record {
            fence,
            value: value.to_vec(),
        };
        let data = ours.to_fenced_bytes();
        let mut kv = self.client.kv_client();
        // What the last read (or the failed transaction's read) found.
        let mut seen = kv
            .get(record_key.as_str(), None)
            .await
            .map_err(|e| map_err("get", e))?
            .take_kvs()
            .into_iter()
            .next();
        for _ in 0..RECORD_ATTEMPTS {
            let unchanged = match &seen {
                None => Compare::create_revision(record_key.as_str(), CompareOp::Equal, 0),
                Some(stored) => {
                    let record = decode_record(stored)?;
                    if record.fence >= fence {
                        // Kept: a write at a fence as high as ours, or higher, is there.
                        return Ok(record);
                    }
                    Compare::mod_revision(
                        record_key.as_str(),
                        CompareOp::Equal,
                        stored.mod_revision(),
                    )
                }
            };
            let txn = Txn::new()
                .when([unchanged])
                // No etcd lease: records never expire.
                .and_then([TxnOp::put(record_key.as_str(), data.clone(), None)])
                .or_else([TxnOp::get(record_key.as_str(), None)]);
            let resp = kv.txn(txn).await.map_err(|e| {
                let e = map_err("txn", e);
                if e.kind() == StoreErrorKind::Unavailable {
                    // etcd answers a proposal that timed out or met a leader change with
                    // `Unavailable`, though it may still commit.
                    err(
                        StoreErrorKind::Ambiguous,
                        "etcd record write failed; it may have been applied",
                    )
                    .with_source(e)
                } else {
                    e
                }
            })?;
            if resp.succeeded() {
                return Ok(ours);
            }
            // Another write came between the read and the transaction: its value is in
            // the answer; compare again.
            seen = gets(&resp).next().flatten();
        }
        Err(err(
            StoreErrorKind::Busy,
            "etcd record write: the record kept changing under the write",
        ))
    }

    pub(crate) async fn do_get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let mut kv = self.client.kv_client();
        let mut resp = kv
            .get(self.record_key(key), None)
            .await
            .map_err(|e| map_err("get", e))?;
        resp.take_kvs().first().map(decode_record).transpose()
    }
}
