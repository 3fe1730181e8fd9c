//! [`WaitStore`] for etcd: waiters queue in arrival order under `<lease key>\0`, each
//! entry on its own short etcd lease, as etcd's `concurrency.Mutex` does.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    WatchFilterType, WatchOptions, WatchStream,
};
use leasehold_core::{Key, OwnerToken, StoreError, StoreErrorKind, WaitOutcome, WaitStore};

use crate::conn::{EtcdStore, Holder, decode, gets};
use crate::error::{err, map_err};
use crate::watch::{cancelled, watch_ended};

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

/// An etcd lease a waiter granted for the TTL it asked for, to hold the lease key once its
/// turn comes (so that its confirming acquire needs no lease grant). It holds no key
/// while the waiter waits; the wait keeps it alive with the queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spare {
    pub(crate) lease: i64,
    /// The TTL (whole seconds) asked for.
    pub(crate) asked: i64,
    /// The TTL etcd granted.
    pub(crate) granted: i64,
}

/// What a wait in line left for the acquire that confirms it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waited {
    /// The waiter's place in line when it last looked.
    pub(crate) place: Place,
    /// Its spare etcd lease, if the wait knew the TTL ([`WaitStore::wait_turn`]).
    pub(crate) spare: Option<Spare>,
}

/// Entries of [`Waits`] beyond which old ones are dropped.
const WAITS_KEPT: usize = 1 << 12;

/// How long [`Waits`] keeps an entry that no acquire took (its waiter gave up): the spare
/// etcd lease expires by itself, and the place is only a first guess.
const WAITED_KEPT_FOR: Duration = Duration::from_secs(60);

/// What each wait of this store left for the acquire that follows it, by lease key and
/// owner: the acquire's first transaction then assumes the owner first in line at its
/// place (not "nobody waits", which a waiter's own entry always fails), and takes the
/// spare etcd lease instead of granting one. Only a hint: the transaction checks the
/// place, and the spare is kept alive (sent after the acquire began) before it is used.
#[derive(Debug, Default)]
pub(crate) struct Waits(Mutex<HashMap<(String, OwnerToken), (Waited, Instant)>>);

impl Waits {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, OwnerToken), (Waited, Instant)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records what `owner`'s wait on `lease_key` left (replacing an earlier entry).
    pub(crate) fn put(&self, lease_key: &str, owner: OwnerToken, waited: Waited) {
        let mut map = self.lock();
        let now = Instant::now();
        if map.len() >= WAITS_KEPT {
            map.retain(|_, (_, at)| now.duration_since(*at) < WAITED_KEPT_FOR);
        }
        if map.len() < WAITS_KEPT {
            map.insert((lease_key.to_owned(), owner), (waited, now));
        }
    }

    /// Takes what `owner`'s last wait on `lease_key` left, if anything.
    pub(crate) fn take(&self, lease_key: &str, owner: &OwnerToken) -> Option<Waited> {
        let mut map = self.lock();
        // Every acquire asks: one that follows no wait builds no key for the lookup.
        if map.is_empty() {
            return None;
        }
        map.remove(&(lease_key.to_owned(), *owner)).map(|(w, _)| w)
    }

    /// What `owner`'s last wait on `lease_key` left, without taking it.
    fn spare(&self, lease_key: &str, owner: &OwnerToken) -> Option<Spare> {
        self.lock()
            .get(&(lease_key.to_owned(), *owner))
            .and_then(|(w, _)| w.spare)
    }

    /// How many entries are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
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
    /// until there is none, then (first in line) the deletion of the lease key. A waiter
    /// that says the TTL it will ask for (`want`, whole seconds) also grants an etcd lease
    /// of that TTL as it joins, kept alive with its entry: its confirming acquire puts the
    /// key on it (see [`Waits`]).
    async fn wait_in_line(
        &self,
        lease_key: &str,
        owner: &OwnerToken,
        want: Option<i64>,
    ) -> Result<(), StoreError> {
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
        // A spare left by this owner's last wait is kept (kept alive below, or found gone
        // by the acquire); one of another TTL is left to expire.
        let kept = self
            .waits
            .spare(lease_key, owner)
            .filter(|s| Some(s.asked) == want);
        let join = self.bounded("join queue", self.join_queue(lease_key, owner));
        // The line's watch is set up beside the join, before the line is read again.
        let watching = self.bounded("watch", self.watch_line(lease_key));
        let grant = async {
            match (want, kept) {
                (Some(asked), None) => {
                    Some(self.bounded("lease grant", self.grant(asked)).await.map(
                        |(lease, granted)| Spare {
                            lease,
                            asked,
                            granted,
                        },
                    ))
                }
                _ => None,
            }
        };
        let (joined, watching, granted) = tokio::join!(join, watching, grant);
        // A failed grant costs only the acquire its own grant.
        let spare = match granted {
            Some(g) => g.ok(),
            None => kept,
        };
        let (((place, entry_lease), mut stream), spare) =
            match joined.and_then(|j| Ok((j, watching?))) {
                Ok(j) => (j, spare),
                Err(e) => {
                    if let (Some(s), None) = (spare, kept) {
                        self.revoke_quietly(s.lease).await;
                    }
                    return Err(e);
                }
            };
        self.waits.put(
            lease_key,
            *owner,
            Waited {
                place: Place {
                    revision: place,
                    lease: entry_lease,
                },
                spare,
            },
        );
        let watch = async {
            loop {
                let line = self
                    .bounded("read", self.read_line(lease_key, Some(place)))
                    .await?;
                // Only the predecessor's deletion can move this waiter up; the first in
                // line waits for the lease key's.
                let (target, head) = match (&line.ahead, &line.holder) {
                    (Some(before), _) => (before.key(), false),
                    (None, Some(_)) => (lease_key.as_bytes(), true),
                    (None, None) => return Ok(()),
                };
                let seen = deleted(&mut stream, target, line.revision).await?;
                if head || !seen {
                    return Ok(());
                }
            }
        };
        // The spare's keep-alives never end the wait: a spare gone is granted anew.
        let keep_spare = async {
            if let Some(s) = spare {
                let _ = self.keep_entry_alive(s.lease).await;
            }
            std::future::pending().await
        };
        tokio::select! {
            r = watch => r,
            r = self.keep_entry_alive(entry_lease) => r,
            r = keep_spare => r,
        }
    }

    /// A watch of every deletion in `lease_key`'s line: the lease key itself and its
    /// whole queue (the range `[<lease key>, <lease key>\x01)`, which holds nothing else:
    /// lease keys never hold a NUL), returned once etcd has created it.
    ///
    /// One watch serves a whole wait, and it starts at the revision etcd is at when it
    /// creates it, before the line is read: etcd hands the events of a watch that starts
    /// at a past revision (an "unsynced" watcher) only on its sync loop, every 100 ms,
    /// where one that starts at its current revision gets each event as it is written. A
    /// watch per step from the revision of the step's read (as this store did) waited up
    /// to 100 ms whenever anything was written between the read and the watch, which
    /// under contention was most hand-offs.
    async fn watch_line(&self, lease_key: &str) -> Result<WatchStream, StoreError> {
        let mut end = lease_key.as_bytes().to_vec();
        end.push(1);
        let options = WatchOptions::new()
            .with_range(end)
            .with_filters([WatchFilterType::NoPut]);
        let mut watch = self.client.watch_client();
        let mut stream = watch
            .watch(lease_key, Some(options))
            .await
            .map_err(|e| map_err("watch", e))?;
        loop {
            match stream.message().await.map_err(|e| map_err("watch", e))? {
                Some(resp) if resp.created() && !resp.canceled() => return Ok(stream),
                Some(resp) if resp.canceled() => return Err(cancelled(&resp)),
                Some(_) => {}
                None => return Err(watch_ended()),
            }
        }
    }
}

/// Waits on `stream` (a [`watch_line`](EtcdStore::watch_line)) for the deletion of `key`
/// after revision `after`: `true` when seen, `false` when etcd cancelled the watch (the
/// caller re-checks by acquiring).
async fn deleted(stream: &mut WatchStream, key: &[u8], after: i64) -> Result<bool, StoreError> {
    loop {
        match stream.message().await {
            Ok(Some(resp)) if resp.canceled() => return Ok(false),
            // Puts are filtered out: every event is a deletion, its key's mod revision
            // the deletion's. One from before the read is old news.
            Ok(Some(resp)) => {
                let gone = resp.events().iter().any(|e| {
                    e.kv()
                        .is_some_and(|kv| kv.key() == key && kv.mod_revision() > after)
                });
                if gone {
                    return Ok(true);
                }
            }
            Ok(None) => return Err(watch_ended()),
            Err(e) => return Err(map_err("watch", e)),
        }
    }
}

#[async_trait]
impl WaitStore for EtcdStore {
    /// Waits in line, as etcd's own `concurrency.Mutex` does: returns at once when the
    /// key is free for `owner` (nobody holds it and nobody else waits ahead); otherwise
    /// joins the key's queue (or keeps its place there) with an entry on its own short
    /// etcd lease, kept alive while waiting, and watches the deletions in the key's line,
    /// acting only on that of the entry just ahead of it; the first in line acts on the
    /// lease key's deletion (a release, a break or the holder's expiry: no polling).
    /// `owner` confirms with `acquire`.
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
        tokio::time::timeout(timeout, self.wait_in_line(&lease_key, owner, None))
            .await
            .unwrap_or(Ok(()))
    }

    /// As [`wait_released`](WaitStore::wait_released), and the waiter also grants the
    /// etcd lease its confirming acquire will put the key on (of `ttl`, rounded up to
    /// whole seconds), kept alive while it waits: that acquire then sends a keep-alive
    /// and one transaction, not a lease grant first. Always [`WaitOutcome::Retry`]: etcd
    /// keeps the confirming acquire, because a grant by the release would have to move
    /// the key to the waiter's etcd lease in one transaction that also gives it a new
    /// create revision (the fence), and etcd refuses a delete and a put of one key in one
    /// transaction (docs/design.md, section 11).
    ///
    /// # Cancel safety
    /// As [`wait_released`](WaitStore::wait_released); the spare etcd lease, no longer
    /// kept alive, expires by itself within `ttl` holding no key.
    async fn wait_turn(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<WaitOutcome, StoreError> {
        let lease_key = self.lease_key(key);
        let want = crate::store::ttl_secs(ttl);
        tokio::time::timeout(timeout, self.wait_in_line(&lease_key, owner, Some(want)))
            .await
            .unwrap_or(Ok(()))
            .map(|()| WaitOutcome::Retry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waited(revision: i64, spare: Option<i64>) -> Waited {
        Waited {
            place: Place { revision, lease: 1 },
            spare: spare.map(|lease| Spare {
                lease,
                asked: 5,
                granted: 5,
            }),
        }
    }

    #[test]
    fn a_wait_is_taken_once_by_its_owner_on_its_key() {
        let waits = Waits::default();
        let (a, b) = (OwnerToken::random(), OwnerToken::random());
        waits.put("k", a, waited(7, Some(70)));
        waits.put("k", b, waited(8, None));
        assert_eq!(waits.spare("k", &a).map(|s| s.lease), Some(70));
        assert_eq!(waits.spare("k", &b), None);
        assert_eq!(waits.take("j", &a), None, "another key's");
        // A later wait of the same owner replaces the earlier one.
        waits.put("k", a, waited(9, Some(71)));
        assert_eq!(waits.take("k", &a), Some(waited(9, Some(71))));
        assert_eq!(waits.take("k", &a), None, "taken once");
        assert_eq!(waits.len(), 1);
    }

    #[test]
    fn waits_beyond_the_bound_are_not_kept_while_the_kept_ones_are_recent() {
        let waits = Waits::default();
        for _ in 0..WAITS_KEPT {
            waits.put("k", OwnerToken::random(), waited(1, None));
        }
        let late = OwnerToken::random();
        waits.put("k", late, waited(2, None));
        assert_eq!(waits.len(), WAITS_KEPT);
        assert_eq!(waits.take("k", &late), None);
    }
}
