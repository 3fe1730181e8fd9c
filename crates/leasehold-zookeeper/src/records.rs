//! Fenced records ([`Store::put_record`](leasehold_core::Store::put_record)): persistent
//! nodes `<chroot>/%2erecords/<key>` holding the fence and the value.

use leasehold_core::{Fence, Key, Record, StoreError, StoreErrorKind};
use zookeeper_client as zk;

use crate::error::{err, map_err};
use crate::session::ZkStore;

/// How many times a record write that lost a race (another write came between its read
/// and its conditional write) reads and tries again.
const RECORD_ATTEMPTS: u32 = 8;

/// Reads a record node's data back (`Record::to_fenced_bytes`); `Corrupt` when it is
/// not one.
pub(crate) fn decode_record(data: &[u8]) -> Result<Record, StoreError> {
    Record::from_fenced_bytes(data).ok_or_else(|| {
        err(
            StoreErrorKind::Corrupt,
            "a zookeeper record node holds no fence and value: written by something else?",
        )
    })
}

impl ZkStore {
    pub(crate) async fn do_put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        let s = self.session().await?;
        let path = self.record_path(key);
        let ours = Record {
            fence,
            value: value.to_vec(),
        };
        let data = ours.to_fenced_bytes();
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        for _ in 0..RECORD_ATTEMPTS {
            match s.client.create(&path, &data, &options).await {
                Ok(_) => return Ok(ours),
                Err(zk::Error::NoNode) => {
                    // The first record under this root: its directory (persistent).
                    s.client
                        .mkdir(&self.records_dir(), &options)
                        .await
                        .map_err(|e| map_err("create the records directory", e))?;
                    continue;
                }
                Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(map_err("create", e)),
            }
            let (stored, stat) = match s.client.get_data(&path).await {
                Ok(found) => found,
                // Deleted meanwhile (by hand: the store never deletes a record).
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(map_err("get data", e)),
            };
            let record = decode_record(&stored)?;
            if record.fence >= fence {
                // Kept: a write at a fence as high as ours, or higher, is there.
                return Ok(record);
            }
            match s.client.set_data(&path, &data, Some(stat.version)).await {
                Ok(_) => return Ok(ours),
                // Another write came between the read and ours: compare again.
                Err(zk::Error::BadVersion | zk::Error::NoNode) => {}
                Err(e) => return Err(map_err("set data", e)),
            }
        }
        Err(err(
            StoreErrorKind::Busy,
            "zookeeper record write: the record kept changing under the write",
        ))
    }
}
