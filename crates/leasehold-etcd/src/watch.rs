//! [`WatchStore`] for etcd: one gRPC watch stream with watches on exactly the lease key
//! and exactly the record key.

use async_trait::async_trait;
use etcd_client::{Event, WatchOptions, WatchResponse, WatchStream};
use futures::StreamExt;
use leasehold_core::{Changes, Key, StoreError, StoreErrorKind, WatchStore};

use crate::conn::EtcdStore;
use crate::error::{err, map_err};

/// Whether a watch event of [`WatchStore::watch`] tells of a change the contract notifies: on
/// the lease key, a creation (`version` 1: a grant) or a deletion (a delete event's key
/// carries `version` 0: a release, a break, an expiry), not a put on a live key (a higher
/// `version`: its holder moved it onto a longer etcd lease, same holder, same fence);
/// on the record key, every write.
fn notifies(event: &Event, lease_key: &[u8]) -> bool {
    match event.kv() {
        Some(kv) if kv.key() == lease_key => kv.version() <= 1,
        _ => true,
    }
}

/// Whether a watch answer tells of a change [`notifies`] keeps.
fn answer_notifies(resp: &WatchResponse, lease_key: &[u8]) -> bool {
    resp.events().iter().any(|e| notifies(e, lease_key))
}

/// The error of a watch etcd cancelled: its start revision was compacted away (or the
/// watcher fell too far behind), or it was refused (permission denied).
pub(crate) fn cancelled(resp: &WatchResponse) -> StoreError {
    let reason = resp.cancel_reason();
    let kind = if reason.contains("permission") {
        StoreErrorKind::Config
    } else {
        StoreErrorKind::Unavailable
    };
    err(
        kind,
        format!(
            "etcd cancelled a watch (compact revision {}): {reason}; notices may have been missed",
            resp.compact_revision()
        ),
    )
}

/// The error of a watch stream etcd ended.
pub(crate) fn watch_ended() -> StoreError {
    err(StoreErrorKind::Unavailable, "etcd ended a watch")
}

/// The state of a [`WatchStore::watch`] stream: the gRPC watch stream (dropping it closes the
/// stream, and etcd removes its watches with it), and whether a notice is due before the
/// next read (a change seen while the watch was set up).
struct Watching {
    stream: WatchStream,
    lease_key: Vec<u8>,
    due: bool,
}

impl Watching {
    /// The next notice: `Ok` after a change [`notifies`] keeps; an error (and then the
    /// end) when etcd cancelled or ended the watch or the connection broke (the client's
    /// HTTP/2 keep-alive gives a silent connection up).
    async fn next(mut self) -> Option<(Result<(), StoreError>, Option<Self>)> {
        if std::mem::take(&mut self.due) {
            return Some((Ok(()), Some(self)));
        }
        loop {
            match self.stream.message().await {
                Ok(Some(resp)) if resp.canceled() => return Some((Err(cancelled(&resp)), None)),
                Ok(Some(resp)) if answer_notifies(&resp, &self.lease_key) => {
                    return Some((Ok(()), Some(self)));
                }
                // A put that moved the holder's key onto a longer lease, or a progress
                // notice.
                Ok(Some(_)) => {}
                Ok(None) => return Some((Err(watch_ended()), None)),
                Err(e) => return Some((Err(map_err("watch", e)), None)),
            }
        }
    }
}

impl EtcdStore {
    /// Sets up [`WatchStore::watch`]: one gRPC watch stream with two watches, of exactly the
    /// lease key (not its queue, `<lease key>\0…`, nor other keys it is a prefix of) and
    /// of exactly the record key, both from the revision etcd created the first at.
    async fn start_watch(&self, key: &Key) -> Result<Watching, StoreError> {
        let lease_key = self.lease_key(key).into_bytes();
        let record_key = self.record_key(key).into_bytes();
        let mut watch = self.client.watch_client();
        let mut stream = watch
            .watch(lease_key.clone(), None)
            .await
            .map_err(|e| map_err("watch", e))?;
        let mut due = false;
        // etcd answers a watch's creation first, with the revision it watches after.
        let revision = loop {
            match stream.message().await.map_err(|e| map_err("watch", e))? {
                Some(resp) if resp.canceled() => return Err(cancelled(&resp)),
                Some(resp) if resp.created() => break resp.header().map_or(0, |h| h.revision()),
                Some(resp) => due |= answer_notifies(&resp, &lease_key),
                None => return Err(watch_ended()),
            }
        };
        // The record's watch from the same revision: nothing written to it after the
        // lease key's watch began is missed.
        stream
            .watch(
                record_key,
                Some(WatchOptions::new().with_start_revision(revision + 1)),
            )
            .await
            .map_err(|e| map_err("watch", e))?;
        loop {
            match stream.message().await.map_err(|e| map_err("watch", e))? {
                Some(resp) if resp.canceled() => return Err(cancelled(&resp)),
                Some(resp) => {
                    // The lease key's changes may come before the record's watch is
                    // created: notify them first thing.
                    due |= answer_notifies(&resp, &lease_key);
                    if resp.created() {
                        break;
                    }
                }
                None => return Err(watch_ended()),
            }
        }
        Ok(Watching {
            stream,
            lease_key,
            due,
        })
    }
}

#[async_trait]
impl WatchStore for EtcdStore {
    /// One gRPC watch stream on the connection the store already has, with two watches:
    /// exactly the lease key and exactly the record key (two messages on the stream
    /// before this returns; nothing is written, no queue entry is made). An item follows
    /// a grant (the key created), a release, a break or an expiry (the key deleted) and
    /// every record write; not a renewal (a keep-alive writes no key; a renewal asking
    /// for a longer TTL moves the key onto a new lease, a put on the live key, which is
    /// filtered out) and not the waiters' queue entries (other keys). A watch etcd
    /// cancels (its revision compacted away) or ends, or a connection that breaks
    /// (HTTP/2 keep-alive every 10 s, given up after the operation timeout), yields an
    /// `Err` item and the end. The hot path (acquire, renew, release) is unchanged.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped setup, or a dropped stream, closes the gRPC stream, and
    /// etcd removes its watches with it.
    async fn watch(&self, key: &Key) -> Result<Changes, StoreError> {
        let watching = self.bounded("watch", self.start_watch(key)).await?;
        Ok(futures::stream::unfold(Some(watching), |w| async move { w?.next().await }).boxed())
    }
}
