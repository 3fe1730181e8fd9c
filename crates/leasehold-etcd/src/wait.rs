//! [`WaitStore`] for etcd: waiters queue in arrival order under `<lease key>\0`, each
//! entry on its own short etcd lease, as etcd's `concurrency.Mutex` does.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    WatchFilterType, WatchOptions,
};
use leasehold_core::{Key, OwnerToken, StoreError, StoreErrorKind, WaitStore};

use crate::conn::{EtcdStore, Holder, decode, gets};
use crate::error::{err, map_err};
use crate::watch::watch_ended;

/// What one read of the lease key and of its queue found.
pub(crate) struct Line {
    /// The lease's holder, if any.
    pub(crate) holder: Option<Holder>,
    /// The queue entry asked for (the first in line, or a waiter's predecessor).
    pub(crate) ahead: Option<KeyValue>,
    /// The revision of the read: watches start after it.
    pub(crate) revision: i64,
}

/// Who is first in a key's queue, as a read (or a failed transaction) found it.
pub(crate) enum Ahead {
    /// Nobody waits.
    Nobody,
    /// This owner's entry is first.
    Us(Place),
    /// Another waiter's entry is first.
    Other(KeyValue),
}

impl Ahead {
    /// What the queue's first entry `head` (if any) means for the owner of `entry`.
    pub(crate) fn of(head: Option<KeyValue>, entry: &str) -> Self {
        match head {
            None => Self::Nobody,
            Some(h) if h.key() == entry.as_bytes() => Self::Us(Place {
                revision: h.create_revision(),
                lease: h.lease(),
            }),
            Some(h) => Self::Other(h),
        }
    }
}

/// A waiter's queue entry: its create revision (its place in line) and its etcd lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) revision: i64,
    pub(crate) lease: i64,
}

/// The TTL of a waiter's queue entry: how long the entry outlives its waiter's last
/// keep-alive (a waiter between two waits, or confirming with `acquire`, is covered; a
/// waiter that died or gave up holds the queue up this long at most).
const QUEUE_GRACE_SECS: i64 = 2;

/// How often a waiting waiter keeps its queue entry alive.
const QUEUE_KEEP_ALIVE_EVERY: Duration = Duration::from_millis(500);

/// The prefix of `lease_key`'s waiting queue: `<lease key>\0` (lease keys never hold a
/// NUL, so no other key's lease or queue starts with it).
pub(crate) fn queue_prefix(lease_key: &str) -> String {
    format!("{lease_key}\0")
}

/// The queue entry of `owner` waiting for `lease_key`: `<lease key>\0<owner token hex>`.
pub(crate) fn queue_entry(lease_key: &str, owner: &OwnerToken) -> String {
    format!("{lease_key}\0{owner}")
}

/// A range over a queue prefix that returns its first entry (the lowest create revision).
pub(crate) fn head_options() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

impl EtcdStore {
    /// One read of the lease key and of one queue entry: the first in line (`before`
    /// is `None`), or the last one created before revision `before` (the predecessor of
    /// the waiter whose entry was created at `before`).
    pub(crate) async fn read_line(
        &self,
        lease_key: &str,
        before: Option<i64>,
    ) -> Result<Line, StoreError> {
        let queue = queue_prefix(lease_key);
        let ahead = match before {
            None => head_options(),
            Some(rev) => GetOptions::new()
                .with_prefix()
                .with_max_create_revision(rev - 1)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(1),
        };
        let txn = Txn::new().and_then([
            TxnOp::get(lease_key, None),
            TxnOp::get(queue.as_str(), Some(ahead)),
        ]);
        let mut kv = self.client.kv_client();
        let resp = kv.txn(txn).await.map_err(|e| map_err("txn", e))?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut gets = gets(&resp);
        let holder = gets.next().flatten().map(decode).transpose()?;
        let ahead = gets.next().flatten();
        Ok(Line {
            holder,
            ahead,
            revision,
        })
    }

    /// Joins the queue of `lease_key` as `owner`, or keeps its place: an entry already
    /// there is kept alive (same create revision, so the same place). Its create
    /// revision and etcd lease.
    async fn join_queue(
        &self,
        lease_key: &str,
        owner: &OwnerToken,
    ) -> Result<(i64, i64), StoreError> {
        let entry = queue_entry(lease_key, owner);
        for _ in 0..3 {
            let mut kv = self.client.kv_client();
            let mut resp = kv
                .get(entry.as_str(), None)
                .await
                .map_err(|e| map_err("get", e))?;
            // An entry that lapsed was deleted with its etcd lease: join again at the end.
            if let Some(existing) = resp.take_kvs().into_iter().next()
                && self.keep_alive_once(existing.lease()).await?
            {
                return Ok((existing.create_revision(), existing.lease()));
            }
            let (id, _) = self.grant(QUEUE_GRACE_SECS).await?;
            let txn = Txn::new()
                .when([Compare::create_revision(
                    entry.as_str(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([TxnOp::put(
                    entry.as_str(),
                    owner.to_string(),
                    Some(PutOptions::new().with_lease(id)),
                )]);
            let resp = kv.txn(txn).await.map_err(|e| map_err("txn", e))?;
            if resp.succeeded() {
                return Ok((resp.header().map_or(0, |h| h.revision()), id));
            }
            // Another wait of the same owner created it meanwhile: use that one.
            self.revoke_quietly(id).await;
        }
        Err(err(
            StoreErrorKind::Busy,
            "etcd wait: the waiter's queue entry kept changing",
        ))
    }

    /// Keeps the queue entry's etcd lease alive while its waiter waits. Returns `Ok` when
    /// etcd no longer has the lease (the entry lapsed: the caller re-checks and joins
    /// again), an error when the keep-alives fail.
    async fn keep_entry_alive(&self, id: i64) -> Result<(), StoreError> {
        let mut lease = self.client.lease_client();
        let (mut keeper, mut stream) = match self
            .bounded("lease keep-alive", async {
                lease
                    .keep_alive(id)
                    .await
                    .map_err(|e| map_err("lease keep-alive", e))
            })
            .await
        {
            Ok(pair) => pair,
            Err(e) if e.kind() == StoreErrorKind::Ambiguous => return Ok(()),
            Err(e) => return Err(e),
        };
        loop {
            tokio::time::sleep(QUEUE_KEEP_ALIVE_EVERY).await;
            let resp = self
                .bounded("lease keep-alive", async {
                    keeper
                        .keep_alive()
                        .await
                        .map_err(|e| map_err("lease keep-alive", e))?;
                    stream
                        .message()
                        .await
                        .map_err(|e| map_err("lease keep-alive", e))
                })
                .await?;
            match resp {
                Some(r) if r.ttl() > 0 => {}
                Some(_) => return Ok(()),
                None => {
                    return Err(err(
                        StoreErrorKind::Unavailable,
                        "etcd ended the keep-alive stream of a waiter's queue entry",
                    ));
                }
            }
        }
    }

    /// Waits in line: joins the queue, watches the deletion of the predecessor's entry
    /// until there is none, then (first in line) the deletion of the lease key.
    async fn wait_in_line(&self, lease_key: &str, owner: &OwnerToken) -> Result<(), StoreError> {
        let line = self
            .bounded("read", self.read_line(lease_key, None))
            .await?;
        let entry = queue_entry(lease_key, owner);
        if line.holder.is_none()
            && line
                .ahead
                .as_ref()
                .is_none_or(|head| head.key() == entry.as_bytes())
        {
            // Free for this owner now.
            return Ok(());
        }
        let (place, entry_lease) = self
            .bounded("join queue", self.join_queue(lease_key, owner))
            .await?;
        let watch = async {
            loop {
                let line = self
                    .bounded("read", self.read_line(lease_key, Some(place)))
                    .await?;
                if let Some(before) = line.ahead {
                    // Only the predecessor's deletion can move this waiter up.
                    self.watch_deletion(before.key(), line.revision).await?;
                    continue;
                }
                if line.holder.is_some() {
                    self.watch_deletion(lease_key.as_bytes(), line.revision)
                        .await?;
                }
                return Ok(());
            }
        };
        tokio::select! {
            r = watch => r,
            r = self.keep_entry_alive(entry_lease) => r,
        }
    }

    /// Returns once the lease key is deleted (released, expired, broken) after
    /// `after_revision`, or once the watch ends (the caller re-checks either way).
    async fn watch_deletion(&self, key: &[u8], after_revision: i64) -> Result<(), StoreError> {
        let mut watch = self.client.watch_client();
        let options = WatchOptions::new()
            .with_start_revision(after_revision + 1)
            .with_filters([WatchFilterType::NoPut]);
        let mut stream = self
            .bounded("watch", async {
                watch
                    .watch(key, Some(options))
                    .await
                    .map_err(|e| map_err("watch", e))
            })
            .await?;
        loop {
            match stream.message().await {
                // Puts are filtered out: any event is a delete. A cancelled watch (the
                // start revision was compacted away) may have missed it.
                Ok(Some(resp)) if resp.canceled() || !resp.events().is_empty() => return Ok(()),
                // The creation notice, or a progress notice.
                Ok(Some(_)) => {}
                Ok(None) => return Err(watch_ended()),
                Err(e) => return Err(map_err("watch", e)),
            }
        }
    }
}

#[async_trait]
impl WaitStore for EtcdStore {
    /// Waits in line, as etcd's own `concurrency.Mutex` does: returns at once when the
    /// key is free for `owner` (nobody holds it and nobody else waits ahead); otherwise
    /// joins the key's queue (or keeps its place there) with an entry on its own short
    /// etcd lease, kept alive while waiting, and watches only the deletion of the entry
    /// just ahead of it; the first in line watches the lease key's deletion (a release,
    /// a break or the holder's expiry: no polling). `owner` confirms with `acquire`.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the call closes the watch and stops the keep-alives; the
    /// queue entry stays for `QUEUE_GRACE_SECS` (2 s), so a waiter that comes back in time
    /// keeps its place, and one that does not drops out by itself.
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let lease_key = self.lease_key(key);
        tokio::time::timeout(timeout, self.wait_in_line(&lease_key, owner))
            .await
            .unwrap_or(Ok(()))
    }
}
