//! [`WaitStore`] for ZooKeeper: a place in the key's queue, watching only the
//! predecessor node.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{Key, OwnerToken, StoreError, WaitStore};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::error::map_err;
use crate::session::{Inner, Presence, ZkStore};

/// How long a waiter's place in the queue outlives its owner's last call: the lease client
/// calls `acquire` right after `wait_released` returns, and `wait_released` again right
/// after an acquire answers `Held`.
pub(crate) const WAITER_GRACE: Duration = Duration::from_secs(1);

/// Marks a call of a waiter in progress; the mark ends when it is dropped (also when the
/// call is cancelled).
pub(crate) struct InProgress {
    inner: Arc<Inner>,
    slot: (String, OwnerToken),
}

impl Drop for InProgress {
    fn drop(&mut self) {
        let mut waiting = self.inner.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = waiting.get_mut(&self.slot) {
            p.calls = p.calls.saturating_sub(1);
            p.last = Instant::now();
        }
        drop(waiting);
        self.inner.reaper.due(Instant::now() + WAITER_GRACE);
    }
}

impl ZkStore {
    pub(crate) fn waiting(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, OwnerToken), Presence>> {
        self.inner.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks a call of `owner` as a waiter of `dir` in progress (its place is kept).
    pub(crate) fn in_progress(&self, dir: &str, owner: &OwnerToken) -> InProgress {
        let slot = (dir.to_owned(), *owner);
        let now = Instant::now();
        self.waiting()
            .entry(slot.clone())
            .and_modify(|p| {
                p.calls += 1;
                p.last = now;
            })
            .or_insert(Presence {
                calls: 1,
                last: now,
            });
        InProgress {
            inner: self.inner.clone(),
            slot,
        }
    }
}

#[async_trait]
impl WaitStore for ZkStore {
    /// Takes a place in the key's queue: an ephemeral sequential node named with `owner`
    /// (kept across this owner's calls, deleted a second after its last one), then
    /// watches **only its predecessor** (no herd). Returns when the predecessor is gone
    /// (released, broken, its session ended) or the key is free; when `owner`'s node is
    /// first, the lease is reserved for `owner`'s next `acquire` (others are answered
    /// `Held`), so waiters are served in the order they started waiting.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped wait keeps its place for a second (the owner's next call
    /// finds it), then the store deletes it.
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let dir = self.lease_dir(key);
        let _mark = self.in_progress(&dir, owner);
        let wait = async {
            let (s, watcher) = self
                .bounded("watch", async {
                    let s = self.session().await?;
                    for _ in 0..8 {
                        let queue = self.queue(&s, &dir).await?;
                        let mine = queue.iter().position(|(o, _, _)| o == owner);
                        let predecessor = match mine {
                            // First: reserved for us (or ours already).
                            Some(0) => return Ok((s, None)),
                            Some(i) => queue[i - 1].2.clone(),
                            // Free: nothing to wait for.
                            None if queue.is_empty() => return Ok((s, None)),
                            None => {
                                // Queue up behind everyone there.
                                let options =
                                    zk::CreateMode::EphemeralSequential.with_acls(self.acls());
                                let data = s.longest_ttl().as_millis().to_string();
                                let path = format!("{dir}/{}", Self::node_prefix(owner));
                                match s.client.create(&path, data.as_bytes(), &options).await {
                                    Ok(_) => continue,
                                    // The directory went with its last node: free.
                                    Err(zk::Error::NoNode) => return Ok((s, None)),
                                    Err(e) => return Err(map_err("create", e)),
                                }
                            }
                        };
                        match s
                            .client
                            .check_and_watch_stat(&format!("{dir}/{predecessor}"))
                            .await
                        {
                            Ok((Some(_), w)) => return Ok((s, Some(w))),
                            Ok((None, _)) => continue,
                            Err(e) => return Err(map_err("watch", e)),
                        }
                    }
                    Ok((s, None))
                })
                .await?;
            let _keep = s;
            if let Some(w) = watcher {
                w.changed().await;
            }
            Ok(())
        };
        tokio::time::timeout(timeout, wait).await.unwrap_or(Ok(()))
    }
}
