//! [`WatchStore`] for ZooKeeper: one-shot watches of the key's queue and of its record,
//! re-armed after each event.

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use leasehold_core::{Changes, Key, StoreError, StoreErrorKind, WatchStore};
use zookeeper_client as zk;

use crate::error::{err, map_err};
use crate::paths::sorted_queue;
use crate::session::{Inner, ZkStore};

/// A one-shot ZooKeeper watch, waiting for its event (dropping it removes the watch,
/// on the server too).
type Armed = BoxFuture<'static, zk::WatchedEvent>;

/// Reads the first node of the queue in `dir` (the holder, or the first waiter the lease
/// is reserved for) and watches the queue: its children, or, when the directory does not
/// exist, its creation.
async fn watch_queue(
    client: &zk::Client,
    dir: &str,
) -> Result<(Option<String>, Armed), StoreError> {
    for _ in 0..8 {
        match client.list_and_watch_children(dir).await {
            Ok((children, watcher)) => {
                let head = sorted_queue(children)?
                    .into_iter()
                    .next()
                    .map(|(_, _, name)| name);
                return Ok((head, watcher.changed().boxed()));
            }
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(map_err("watch the queue", e)),
        }
        match client.check_and_watch_stat(dir).await {
            Ok((None, watcher)) => return Ok((None, watcher.changed().boxed())),
            // Created between the two requests: list it.
            Ok((Some(_), _)) => {}
            Err(e) => return Err(map_err("watch the queue", e)),
        }
    }
    Err(err(
        StoreErrorKind::Busy,
        "zookeeper watch: the key's directory kept appearing and going",
    ))
}

/// Reads the record node's `mzxid` (`None` when it does not exist) and watches it: its
/// data and deletion, or its creation.
async fn watch_record(client: &zk::Client, path: &str) -> Result<(Option<i64>, Armed), StoreError> {
    let (stat, watcher) = client
        .check_and_watch_stat(path)
        .await
        .map_err(|e| map_err("watch the record", e))?;
    Ok((stat.map(|s| s.mzxid), watcher.changed().boxed()))
}

/// The error of a watch whose session broke.
fn session_broke(state: zk::SessionState) -> StoreError {
    err(
        StoreErrorKind::Unavailable,
        format!("zookeeper session {state} while watching: notices may have been missed"),
    )
}

/// What woke a [`WatchStore::watch`] stream.
enum Woken {
    Queue(zk::WatchedEvent),
    Record(zk::WatchedEvent),
    State(zk::SessionState),
}

/// The state of a [`WatchStore::watch`] stream: a one-shot watch of the key's queue and one of
/// its record, re-armed after each event (the re-arming read tells what changed).
struct ZkWatching {
    /// The store, not kept alive by the watch (its session ends with it).
    store: Weak<Inner>,
    /// The session the watches are on.
    session: i64,
    state: zk::StateWatcher,
    dir: String,
    record: String,
    head: Option<String>,
    record_zxid: Option<i64>,
    queue: Armed,
    record_watch: Armed,
}

impl ZkWatching {
    /// The next notice: `Ok` when the queue's first node (the holder) or the record
    /// changed; an error (and then the end) when the session disconnected, ended or was
    /// replaced, or a re-arming read failed; the end when the store is gone.
    async fn next(mut self) -> Option<(Result<(), StoreError>, Option<Self>)> {
        loop {
            let woken = tokio::select! {
                event = &mut self.queue => Woken::Queue(event),
                event = &mut self.record_watch => Woken::Record(event),
                state = self.state.changed() => Woken::State(state),
            };
            let changed = match woken {
                Woken::State(
                    zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly,
                ) => {
                    continue;
                }
                Woken::State(state) => Err(session_broke(state)),
                Woken::Queue(e) | Woken::Record(e) if e.event_type == zk::EventType::Session => {
                    Err(session_broke(e.session_state))
                }
                Woken::Queue(_) => self.rearm(true).await?,
                Woken::Record(_) => self.rearm(false).await?,
            };
            match changed {
                Ok(true) => return Some((Ok(()), Some(self))),
                Ok(false) => {}
                Err(e) => return Some((Err(e), None)),
            }
        }
    }

    /// Watches the queue (`queue`) or the record again and reads it: whether it changed
    /// since last read. `None` when the store is gone.
    async fn rearm(&mut self, queue: bool) -> Option<Result<bool, StoreError>> {
        let store = ZkStore {
            inner: self.store.upgrade()?,
        };
        Some(
            store
                .bounded("watch", async {
                    // The session's slot is locked while a new session is being made.
                    let current = store.inner.session.lock().await.clone();
                    let Some(s) = current.filter(|s| s.id == self.session) else {
                        return Err(err(
                            StoreErrorKind::Unavailable,
                            "zookeeper: the watch's session ended: notices may have been missed",
                        ));
                    };
                    if queue {
                        let (head, armed) = watch_queue(&s.client, &self.dir).await?;
                        self.queue = armed;
                        let before = std::mem::replace(&mut self.head, head);
                        Ok(before != self.head)
                    } else {
                        let (zxid, armed) = watch_record(&s.client, &self.record).await?;
                        self.record_watch = armed;
                        let before = std::mem::replace(&mut self.record_zxid, zxid);
                        Ok(before != self.record_zxid)
                    }
                })
                .await,
        )
    }
}

#[async_trait]
impl WatchStore for ZkStore {
    /// Two one-shot watches on the store's session, set up by two pipelined requests
    /// (one round trip; three requests when the key's directory does not exist): the
    /// key's queue (its children, or the directory's creation) and its record node (its
    /// data, or its creation). Each is re-armed by the read that follows its event, so no
    /// change between the event and the re-arming goes unseen. An item follows a change
    /// of the queue's first node (a grant, a release, a break, a holder's session ending;
    /// the lease handed to the first waiter is notified when its node becomes first) and
    /// every record write; not a waiter joining or leaving the queue behind the holder,
    /// and not a renewal (nothing is written). A session that disconnects, ends or is
    /// replaced yields an `Err` item and the end, and so does dropping the store (the
    /// stream does not keep the session open). The hot path (acquire, renew, release)
    /// is unchanged.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the setup or the stream drops its watches, and the client
    /// removes them from the server.
    async fn watch(&self, key: &Key) -> Result<Changes, StoreError> {
        let watching = self
            .bounded("watch", async {
                let s = self.session().await?;
                let state = s.client.state_watcher();
                let dir = self.lease_dir(key);
                let record = self.record_path(key);
                let ((head, queue), (record_zxid, record_watch)) = futures::try_join!(
                    watch_queue(&s.client, &dir),
                    watch_record(&s.client, &record)
                )?;
                Ok(ZkWatching {
                    store: Arc::downgrade(&self.inner),
                    session: s.id,
                    state,
                    dir,
                    record,
                    head,
                    record_zxid,
                    queue,
                    record_watch,
                })
            })
            .await?;
        Ok(futures::stream::unfold(Some(watching), |w| async move { w?.next().await }).boxed())
    }
}
