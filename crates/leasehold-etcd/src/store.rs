//! [`EtcdStore`] and its [`Store`] impl: each grant one etcd lease and one transaction,
//! the key's create revision as the fence.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::clock::boottime;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, PutOptions, Txn, TxnOp,
};
use futures::{StreamExt, TryStreamExt};
use leasehold_core::{
    AcquireOutcome, Capabilities, Fence, FenceDurability, Key, LeaseInfo, OwnerToken, Record,
    ReleaseOutcome, RenewOutcome, Store, StoreError, StoreErrorKind, WaitStore, WatchStore,
};

use crate::BACKEND;
use crate::config::EtcdConfig;
use crate::conn::{EtcdStore, Grant, Holder, Unanswered, decode, gets};
use crate::error::{err, map_err, tonic_code};
use crate::wait::{Ahead, Place, head_options, queue_entry, queue_prefix};

/// How many times a renewal answered `Unavailable` is tried again (within its bound).
const RENEW_RETRIES: u32 = 3;
/// The pause before such a retry.
const RENEW_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// The TTL in whole seconds, rounded up (etcd leases have one-second resolution).
pub(crate) fn ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    // check_ttl bounds the TTL to 24 h, so this never saturates.
    i64::try_from(secs).unwrap_or(i64::MAX)
}

fn secs(n: i64) -> Duration {
    Duration::from_secs(u64::try_from(n).unwrap_or(0))
}

fn encode_value(owner: &OwnerToken, granted_secs: i64) -> String {
    format!("{owner} {granted_secs}")
}

fn fence(revision: i64) -> Result<Fence, StoreError> {
    u64::try_from(revision)
        .ok()
        .filter(|r| *r > 0)
        .map(Fence)
        .ok_or_else(|| err(StoreErrorKind::Corrupt, "etcd reported a revision below 1"))
}

impl EtcdStore {
    /// Opens the store from an `etcd://` URL (see [`EtcdConfig::from_url`]) and checks
    /// that the cluster answers.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for a bad URL or refused credentials; `Unavailable` or
    /// `Timeout` when no member answers within the connect timeout; `Config` with a
    /// [`TlsFailure`](leasehold_core::TlsFailure) of problem `PlaintextRefused` when the
    /// URL has no `tls=true` and a member speaks only TLS.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::connect(EtcdConfig::from_url(url)?).await
    }

    /// Connects with `config` and checks that the cluster answers (one read of the
    /// prefix's first key, so least-privilege users need nothing beyond their prefix).
    ///
    /// # Errors
    /// As [`open`](Self::open).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written.
    pub async fn connect(config: EtcdConfig) -> Result<Self, StoreError> {
        let client = match Self::connect_client(&config).await {
            Ok(client) => client,
            Err(e) => return Err(crate::tls::plaintext_refused(&config, e).await),
        };
        let store = Self {
            client,
            config,
            grants: Arc::default(),
            waits: Arc::default(),
        };
        let probe = store.config.key_prefix().as_bytes().to_vec();
        let checked = store
            .bounded("connect", async {
                let mut kv = store.client.kv_client();
                kv.get(probe, Some(GetOptions::new().with_keys_only()))
                    .await
                    .map_err(|e| map_err("connect check", e))
            })
            .await;
        match checked {
            Ok(_) => Ok(store),
            Err(e) => Err(crate::tls::plaintext_refused(&store.config, e).await),
        }
    }

    /// Connects without the check that the cluster answers.
    async fn connect_client(config: &EtcdConfig) -> Result<Client, StoreError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_bound())
            .with_timeout(config.op_bound())
            .with_keep_alive(Duration::from_secs(10), config.op_bound());
        if let Some((user, password)) = config.user_and_password() {
            // etcd's auth tokens expire (`--auth-token-ttl`, 5 min by default, counted
            // from the token's last use): the client authenticates again and retries a
            // call refused for an expired token.
            options = options
                .with_user(user, password)
                .with_auto_token_refresh(true);
        }
        let scheme = match config.tls_settings() {
            Some(settings) => {
                options = options.with_tls(crate::tls::options(settings)?);
                "https"
            }
            None => "http",
        };
        let endpoints: Vec<String> = config
            .endpoints()
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect();
        let bound = config.connect_bound() + config.op_bound();
        StoreError::bounded(BACKEND, "connect", bound, async {
            // Authentication happens here: a refusal is a configuration error (the
            // client's error never holds the password).
            Client::connect(endpoints, Some(options))
                .await
                .map_err(|e| map_err("connect", e))
        })
        .await
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// Reads the lease key: its holder, if any.
    async fn read(&self, lease_key: &str) -> Result<(Option<Holder>, i64), StoreError> {
        let mut kv = self.client.kv_client();
        let mut resp = kv
            .get(lease_key, None)
            .await
            .map_err(|e| map_err("get", e))?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let holder = resp.take_kvs().into_iter().next().map(decode).transpose()?;
        Ok((holder, revision))
    }

    /// Extends `holder`'s lease for at least `want_secs`: a keep-alive of its etcd lease,
    /// and when the lease was granted for less than `want_secs`, a move of the key (same
    /// create revision, so the same fence) onto a new lease of `want_secs`. The granted
    /// TTL, or `None` when the lease is gone or the key changed meanwhile.
    async fn extend(
        &self,
        lease_key: &str,
        holder: &Holder,
        want_secs: i64,
    ) -> Result<Option<i64>, StoreError> {
        let old = holder.kv.lease();
        let sent = boottime();
        if !self.keep_alive_once(old).await? {
            return Ok(None);
        }
        self.grants
            .renewed(lease_key, old, sent, holder.granted_secs);
        if want_secs <= holder.granted_secs {
            return Ok(Some(holder.granted_secs));
        }
        // A longer TTL than the lease was granted with: etcd cannot change a lease's TTL,
        // so move the key onto a new lease, if nothing touched it since it was read.
        let (new, granted) = self.grant(want_secs).await?;
        let txn = Txn::new()
            .when([Compare::mod_revision(
                lease_key,
                CompareOp::Equal,
                holder.kv.mod_revision(),
            )])
            .and_then([TxnOp::put(
                lease_key,
                encode_value(&holder.owner, granted),
                Some(PutOptions::new().with_lease(new)),
            )]);
        let mut kv = self.client.kv_client();
        let resp = kv.txn(txn).await.map_err(|e| map_err("txn", e))?;
        if resp.succeeded() {
            self.grants.remember(
                lease_key,
                Grant {
                    owner: holder.owner,
                    lease: new,
                    mod_revision: resp.header().map_or(0, |h| h.revision()),
                    alive_until: Grant::alive_until(sent, granted),
                },
            );
            self.revoke_quietly(old).await;
            Ok(Some(granted))
        } else {
            self.revoke_quietly(new).await;
            Ok(None)
        }
    }

    /// Acquires `key`: first as if it were free and nobody waited (the usual case), with
    /// a lease grant and one transaction, which reports what it found when it was not so;
    /// then by what that transaction (or a read) found. An etcd lease granted and left
    /// unused is revoked.
    async fn do_acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        let lease_key = self.lease_key(key);
        let want = ttl_secs(ttl);
        // Before anything is sent: etcd counts each grant's TTL from later than this.
        let sent = boottime();
        // After a wait in line: its place, and its spare etcd lease once a keep-alive
        // (sent after `sent`, so etcd's TTL counts from later still) finds it alive.
        let waited = self.waits.take(&lease_key, owner);
        let mut spare = None;
        if let Some(s) = waited.and_then(|w| w.spare) {
            if s.asked != want {
                self.revoke_later(s.lease);
            } else {
                match self.keep_alive_once(s.lease).await {
                    Ok(true) => spare = Some((s.lease, s.granted)),
                    // Gone (it lapsed: the waiter came back late): grant anew.
                    Ok(false) => {}
                    Err(_) => self.revoke_later(s.lease),
                }
            }
        }
        let place = waited.map(|w| w.place);
        let got = self
            .acquire_on(&lease_key, owner, want, sent, place, &mut spare)
            .await;
        if let Some((id, _)) = spare {
            self.revoke_quietly(id).await;
        }
        got
    }

    /// The body of [`do_acquire`](Self::do_acquire). `waited` is the owner's place in
    /// line after a wait of this store (the first transaction assumes it first in line
    /// there). `spare` is an etcd lease granted for `want` seconds that holds no key yet: a grant takes it (or grants anew when there is
    /// none) and a failed transaction gives it back; whatever is left in it afterwards
    /// holds no key. A transaction or read that failed leaves it empty (its outcome is
    /// unknown: the lease may hold the key), so nothing is revoked then.
    async fn acquire_on(
        &self,
        lease_key: &str,
        owner: &OwnerToken,
        want: i64,
        sent: Option<Duration>,
        waited: Option<Place>,
        spare: &mut Option<(i64, i64)>,
    ) -> Result<AcquireOutcome, StoreError> {
        let queue = queue_prefix(lease_key);
        let entry = queue_entry(lease_key, owner);
        // The first attempt assumes the key free and nobody in line; later ones know
        // what the last transaction found, or read it. A key this store may have granted
        // to this owner already (an earlier call's transaction failed with its outcome
        // unknown: this is a retry) is read first.
        let mut found = (!self.grants.holds(lease_key, owner))
            .then_some((None, waited.map_or(Ahead::Nobody, Ahead::Us)));
        // A waiter whose own entry lapsed between the read and the transaction retries
        // once as a newcomer.
        for _ in 0..3 {
            let (holder, ahead) = match found.take() {
                Some(f) => f,
                None => {
                    let line = self.read_line(lease_key, None).await?;
                    (line.holder, Ahead::of(line.ahead, &entry))
                }
            };
            let holder = match holder {
                Some(h) => h,
                None => {
                    // Free. Nobody gets past a live waiter: only the first in line (or
                    // anyone, when nobody waits) may take it.
                    let ours = match ahead {
                        Ahead::Other(head) => return self.held_by_queue(&head).await,
                        Ahead::Us(place) => Some(place),
                        Ahead::Nobody => None,
                    };
                    let (id, granted) = match spare.take() {
                        Some(lease) => lease,
                        None => self.grant(want).await?,
                    };
                    let mut when = vec![Compare::create_revision(lease_key, CompareOp::Equal, 0)];
                    let mut then = vec![TxnOp::put(
                        lease_key,
                        encode_value(owner, granted),
                        Some(PutOptions::new().with_lease(id)),
                    )];
                    match ours {
                        Some(place) => {
                            // Our entry is still there, at its place, and every entry
                            // left is ours or behind it.
                            when.push(Compare::create_revision(
                                entry.as_str(),
                                CompareOp::Equal,
                                place.revision,
                            ));
                            when.push(
                                Compare::create_revision(
                                    queue.as_str(),
                                    CompareOp::Greater,
                                    place.revision - 1,
                                )
                                .with_prefix(),
                            );
                            then.push(TxnOp::delete(entry.as_str(), None));
                        }
                        None => when.push(
                            Compare::version(queue.as_str(), CompareOp::Equal, 0).with_prefix(),
                        ),
                    }
                    let txn = Txn::new().when(when).and_then(then).or_else([
                        TxnOp::get(lease_key, None),
                        TxnOp::get(queue.as_str(), Some(head_options())),
                    ]);
                    let mut kv = self.client.kv_client();
                    // Until it answers, the key may be ours on etcd lease `id`: a failed
                    // or dropped call leaves that remembered for a retry to read first.
                    let unanswered = Unanswered::new(&self.grants, lease_key, *owner, id);
                    let resp = kv.txn(txn).await.map_err(|e| map_err("txn", e))?;
                    unanswered.answered();
                    if resp.succeeded() {
                        if let Some(place) = ours {
                            // Our queue entry went with the grant; its etcd lease now
                            // holds nothing (revoked off the hand-off's path).
                            self.revoke_later(place.lease);
                        }
                        // The put's revision is the key's create (and mod) revision.
                        let revision = resp.header().map_or(0, |h| h.revision());
                        self.grants.remember(
                            lease_key,
                            Grant {
                                owner: *owner,
                                lease: id,
                                mod_revision: revision,
                                alive_until: Grant::alive_until(sent, granted),
                            },
                        );
                        return Ok(AcquireOutcome::Acquired {
                            fence: fence(revision)?,
                            ttl: secs(granted),
                        });
                    }
                    // Nothing was written: the etcd lease is still unused.
                    *spare = Some((id, granted));
                    let mut gets = gets(&resp);
                    let (current, head) = (gets.next().flatten(), gets.next().flatten());
                    match current {
                        Some(kv) => decode(kv)?,
                        None => {
                            // Free, with someone in line (perhaps us): decide again
                            // from what the transaction saw, unless we took ourselves
                            // for first in line and were not (our entry lapsed, or
                            // changed): read again then.
                            let seen = Ahead::of(head, &entry);
                            if ours.is_none() || !matches!(seen, Ahead::Us(_)) {
                                found = Some((None, seen));
                            }
                            continue;
                        }
                    }
                }
            };
            if holder.owner == *owner {
                // A retry after an ambiguous reply: extend, same fence.
                return match self.extend(lease_key, &holder, want).await? {
                    Some(granted) => Ok(AcquireOutcome::Acquired {
                        fence: fence(holder.kv.create_revision())?,
                        ttl: secs(granted),
                    }),
                    // Our own lease expired and its key is about to go: not ours any more.
                    None => Ok(AcquireOutcome::Held {
                        remaining: Some(Duration::ZERO),
                    }),
                };
            }
            // etcd reports whole seconds, rounded down: a holder in its last second (or
            // whose key is about to go with its expired lease) still holds it for up to a
            // second plus etcd's expiry delay. Saying at least 1 s lets a waiter join the
            // queue and watch, rather than spin on zero.
            let remaining = self.remaining(holder.kv.lease()).await?;
            return Ok(AcquireOutcome::Held {
                remaining: Some(
                    remaining
                        .unwrap_or(Duration::ZERO)
                        .max(Duration::from_secs(1)),
                ),
            });
        }
        Err(err(
            StoreErrorKind::Busy,
            "etcd acquire: the waiting queue kept changing under the acquire",
        ))
    }

    /// `Held` for a free lease with a live waiter ahead: the remaining TTL is how long
    /// that waiter's entry lives without its keep-alives (at least a second: etcd's
    /// resolution), the longest it can hold the queue up.
    async fn held_by_queue(&self, head: &KeyValue) -> Result<AcquireOutcome, StoreError> {
        let remaining = self
            .remaining(head.lease())
            .await?
            .unwrap_or(Duration::ZERO);
        Ok(AcquireOutcome::Held {
            remaining: Some(remaining.max(Duration::from_secs(1))),
        })
    }
    /// The remaining TTL of etcd lease `id` in whole seconds (rounded down by etcd), or
    /// `None` when etcd no longer has it.
    pub(crate) async fn remaining(&self, id: i64) -> Result<Option<Duration>, StoreError> {
        let mut lease = self.client.lease_client();
        let resp = lease
            .time_to_live(id, None)
            .await
            .map_err(|e| map_err("lease time-to-live", e))?;
        Ok((resp.ttl() >= 0).then(|| secs(resp.ttl())))
    }

    async fn do_renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let lease_key = self.lease_key(key);
        let (existing, _) = self.read(&lease_key).await?;
        let Some(holder) = existing.filter(|h| h.owner == *owner) else {
            return Ok(RenewOutcome::NotOwner);
        };
        Ok(
            match self.extend(&lease_key, &holder, ttl_secs(ttl)).await? {
                Some(granted) => RenewOutcome::Renewed { ttl: secs(granted) },
                None => RenewOutcome::NotOwner,
            },
        )
    }

    async fn do_release(
        &self,
        key: &Key,
        owner: &OwnerToken,
    ) -> Result<ReleaseOutcome, StoreError> {
        let lease_key = self.lease_key(key);
        // The key outlives its etcd lease by up to etcd's expiry delay (its expiry loop
        // runs every 500 ms): a lease whose TTL has run out is as expired as on the other
        // stores, whether or not etcd has deleted its key yet. A keep-alive is etcd's own
        // answer on its own clock (an expired lease is never renewed: etcd waits for its
        // revocation and answers "not found"); a renewed one cannot expire between here
        // and the delete, so `Released` is true when answered.
        //
        // A grant this store made needs no read: the delete checks that the key is still
        // exactly as written (its mod revision), so on the remembered etcd lease. Anything
        // else (the key changed, the lease is gone) is decided by reading the key. Within
        // half its TTL of the send that granted or last renewed it, the etcd lease cannot
        // have run out (etcd counts from later, and a revoke would have deleted the key,
        // failing the delete's check): no keep-alive is needed either.
        if let Some(grant) = self.grants.take(&lease_key, owner)
            && (grant.certainly_alive() || self.keep_alive_once(grant.lease).await?)
            && self
                .delete_if_unchanged(&lease_key, grant.mod_revision, grant.lease)
                .await?
                .is_some()
        {
            return Ok(ReleaseOutcome::Released);
        }
        // A concurrent renewal by the same owner may move the key to a new lease between
        // the read and the delete: read again then.
        for _ in 0..3 {
            let (existing, _) = self.read(&lease_key).await?;
            let Some(holder) = existing.filter(|h| h.owner == *owner) else {
                return Ok(ReleaseOutcome::NotOwner);
            };
            if !self.keep_alive_once(holder.kv.lease()).await? {
                return Ok(ReleaseOutcome::NotOwner);
            }
            if self
                .delete_if_unchanged(&lease_key, holder.kv.mod_revision(), holder.kv.lease())
                .await?
                .is_some()
            {
                return Ok(ReleaseOutcome::Released);
            }
        }
        Err(err(
            StoreErrorKind::Busy,
            "etcd release: the lease key kept changing under the release",
        ))
    }

    /// Deletes the key if its mod revision is still `mod_revision`, then revokes its etcd
    /// lease `lease`. The revision of the delete, or `None` when the key had changed.
    async fn delete_if_unchanged(
        &self,
        lease_key: &str,
        mod_revision: i64,
        lease: i64,
    ) -> Result<Option<i64>, StoreError> {
        let txn = Txn::new()
            .when([Compare::mod_revision(
                lease_key,
                CompareOp::Equal,
                mod_revision,
            )])
            .and_then([TxnOp::delete(lease_key, None)]);
        let mut kv = self.client.kv_client();
        let resp = kv.txn(txn).await.map_err(|e| map_err("txn", e))?;
        if !resp.succeeded() {
            return Ok(None);
        }
        self.revoke_quietly(lease).await;
        Ok(Some(resp.header().map_or(0, |h| h.revision())))
    }

    async fn info(&self, key: Key, holder: Holder) -> Result<Option<LeaseInfo>, StoreError> {
        let Some(remaining) = self.remaining(holder.kv.lease()).await? else {
            // The etcd lease is gone: the key is being deleted with it.
            return Ok(None);
        };
        Ok(Some(LeaseInfo {
            key,
            owner: holder.owner,
            fence: fence(holder.kv.create_revision())?,
            remaining: Some(remaining),
        }))
    }
}

#[async_trait]
impl Store for EtcdStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::minimal();
        caps.fifo_wait = true;
        caps.reports_remaining = true;
        caps.fence_durability = FenceDurability::Consensus;
        caps
    }

    fn waiter(&self) -> Option<&dyn WaitStore> {
        Some(self)
    }

    fn watcher(&self) -> Option<&dyn WatchStore> {
        Some(self)
    }

    /// A lease grant, then one transaction that creates the key on that lease only if it
    /// does not exist (`create_revision == 0`) and nobody is queued, and otherwise reads the
    /// key and the first entry of its waiting queue: two requests when the key is free and
    /// nobody waits. When this owner is first in line, the same lease goes into a second
    /// transaction that checks nobody is queued ahead of it (deleting its queue entry). A
    /// free key with another waiter first in line is `Held` (see
    /// [`wait_released`](WaitStore::wait_released)). When the key is ours already, a
    /// keep-alive (and a move to a longer lease when asked for a longer TTL); when it is
    /// another's, a time-to-live query for `Held { remaining }`. An etcd lease granted and
    /// not used is revoked. After a wait of this store
    /// ([`wait_turn`](WaitStore::wait_turn)): a keep-alive of the etcd lease the wait
    /// granted for this owner (found gone: a grant anew) and one transaction that takes the
    /// key at the owner's place in line; its queue entry's etcd lease is revoked on a task
    /// of its own.
    ///
    /// # Cancel safety
    /// A dropped call may have granted an etcd lease (it expires by itself, holding no
    /// key) or created the key (a retry by the same owner finds it and gets the same
    /// fence; left alone, it expires at its TTL).
    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        StoreError::check_ttl(BACKEND, ttl)?;
        self.bounded("acquire", self.do_acquire(key, owner, ttl))
            .await
    }

    /// A read of the key (owner check), then one keep-alive of its etcd lease; when the
    /// TTL asked for is longer than the lease was granted with, the key moves onto a new
    /// lease in a transaction that checks the key did not change. A member answering
    /// `Unavailable` is left for another: the renewal is tried again, up to 3 times.
    ///
    /// # Cancel safety
    /// A dropped call may have extended the lease.
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        StoreError::check_ttl(BACKEND, ttl)?;
        self.bounded("renew", async {
            // A renewal is a read and a keep-alive, both safe to repeat: a member that
            // went away (killed, partitioned) answers `Unavailable` at once, and the
            // client's next call goes to another member.
            let mut attempt = 0;
            loop {
                match self.do_renew(key, owner, ttl).await {
                    Err(e)
                        if e.kind() == StoreErrorKind::Unavailable && attempt < RENEW_RETRIES =>
                    {
                        attempt += 1;
                        tokio::time::sleep(RENEW_RETRY_PAUSE).await;
                    }
                    outcome => return outcome,
                }
            }
        })
        .await
    }

    /// A keep-alive of its etcd lease (an expired lease is `NotOwner`, even before etcd
    /// deleted the key), a transaction that deletes the key only if it is unchanged since
    /// written, then a revoke of its etcd lease. A grant this store made is remembered
    /// (its etcd lease, the key's mod revision, when the grant or last renewal was sent),
    /// so no read comes first, and no keep-alive within half the granted TTL of that send
    /// (the lease cannot have run out on etcd's clock yet); when it is not
    /// remembered, or the key is not as remembered (broken, moved by another client, or
    /// its lease gone), the key is read and the same steps are taken on what was read.
    ///
    /// # Cancel safety
    /// A dropped call may have renewed the lease once, or deleted the key (and then the
    /// lease expires by itself).
    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        self.bounded("release", self.do_release(key, owner)).await
    }

    /// A read of the key and a time-to-live query of its etcd lease.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written.
    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        self.bounded("inspect", async {
            let (existing, _) = self.read(&self.lease_key(key)).await?;
            match existing {
                Some(holder) => self.info(key.clone(), holder).await,
                None => Ok(None),
            }
        })
        .await
    }

    /// A range read of `<store prefix><prefix>`, then one time-to-live query per lease
    /// (at most 32 at a time). Keys under the store prefix that are not valid lease keys are
    /// reported as `Corrupt`.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written.
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        self.bounded("list", async {
            let store_prefix = self.config.key_prefix();
            let mut kv = self.client.kv_client();
            let mut resp = kv
                .get(
                    format!("{store_prefix}{prefix}"),
                    Some(GetOptions::new().with_prefix()),
                )
                .await
                .map_err(|e| map_err("range", e))?;
            let mut entries = Vec::new();
            for kv in resp.take_kvs() {
                if kv.key().contains(&0) {
                    // A waiter's queue entry, not a lease.
                    continue;
                }
                let name = std::str::from_utf8(kv.key())
                    .ok()
                    .and_then(|k| k.strip_prefix(store_prefix))
                    .and_then(|k| Key::new(k).ok())
                    .ok_or_else(|| {
                        err(
                            StoreErrorKind::Corrupt,
                            "a key under the etcd prefix is not a lease key",
                        )
                    })?;
                entries.push((name, decode(kv)?));
            }
            // At most 32 time-to-live queries in flight, in key order.
            let infos: Vec<Option<LeaseInfo>> = futures::stream::iter(entries)
                .map(|(name, holder)| self.info(name, holder))
                .buffered(32)
                .try_collect()
                .await?;
            Ok(infos.into_iter().flatten().collect())
        })
        .await
    }

    /// Revokes the key's etcd lease, whatever its owner: etcd deletes the key with it
    /// in the same step, so a renewal is either before the break or finds nothing. Returns
    /// the revision of a read that found the key gone (for a free key, the cluster's
    /// current revision): the next grant's create revision is higher.
    ///
    /// # Cancel safety
    /// A dropped call may have removed the lease.
    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        self.bounded("break", async {
            let lease_key = self.lease_key(key);
            // Read, revoke, read again: the owner may have moved the key onto a new lease
            // (a renewal for a longer TTL) between the read and the revoke.
            for _ in 0..4 {
                let (existing, revision) = self.read(&lease_key).await?;
                let Some(holder) = existing else {
                    return fence(revision);
                };
                let mut lease = self.client.lease_client();
                match lease.revoke(holder.kv.lease()).await {
                    Ok(_) => {}
                    // Expired or revoked meanwhile: read again.
                    Err(etcd_client::Error::GRpcStatus(status))
                        if i32::from(status.code()) == tonic_code::NOT_FOUND => {}
                    Err(e) => return Err(map_err("lease revoke", e)),
                }
            }
            Err(err(
                StoreErrorKind::Busy,
                "etcd break: the lease key kept moving to new leases under the break",
            ))
        })
        .await
    }

    /// A read of the record key (`<prefix>\0records\0<key>`, no etcd lease: records never
    /// expire), then, unless the stored fence is as high as ours, one transaction: *if the
    /// key is still as read (`create_revision == 0` for an absent one, else the same
    /// `mod_revision`), put fence and value, else get it*. A lost compare compares again
    /// with what the transaction read (up to 8 times, then `Busy`). The value is the fence
    /// (8 bytes, big-endian) followed by the bytes.
    ///
    /// # Cancel safety
    /// A dropped call may have written the record. A write error etcd answers with
    /// `Unavailable` is `Ambiguous` (a proposal that timed out may still commit).
    async fn put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        StoreError::check_record_value(BACKEND, value)?;
        self.bounded("put record", self.do_put_record(key, fence, value))
            .await
    }

    /// One (linearizable) read of the record key.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written.
    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.bounded("get record", self.do_get_record(key)).await
    }

    async fn diagnose(&self) -> Result<leasehold_core::Diagnosis, StoreError> {
        self.bounded("diagnose", crate::doctor::diagnose(self))
            .await
    }
}
