//! The connection every role of [`EtcdStore`] shares: the store itself (its gRPC client
//! and configuration), its etcd lease calls, and how a lease key's value reads back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, KeyValue, TxnOpResponse, TxnResponse};
use leasehold_core::clock::boottime;
use leasehold_core::{Key, OwnerToken, StoreError, StoreErrorKind};

use crate::BACKEND;
use crate::config::EtcdConfig;
use crate::error::{err, map_err};
use crate::wait::Waits;

/// A lease store on an etcd cluster (v3 API).
///
/// Each grant gets **its own etcd lease**, with the TTL rounded up to whole seconds (etcd
/// may raise it further to its minimum; the store reports the TTL etcd granted). The
/// lease key `<prefix><key>` holds `<owner token hex> <granted TTL in seconds>` and is
/// attached to that etcd lease, so etcd deletes it when the lease expires. The fence is
/// the key's create revision: cluster-wide, monotonic across leader changes and restarts,
/// with no extra write. Waiters queue in arrival order under `<prefix><key>\0` (each on
/// its own short etcd lease), as etcd's `concurrency.Mutex` does. Records (see
/// [`put_record`](leasehold_core::Store::put_record)) are keys `<prefix>\0records\0<key>`
/// on no etcd lease, holding the fence (8 bytes, big-endian) and the value.
///
/// Cloning is cheap: clones share one gRPC channel.
#[derive(Clone)]
pub struct EtcdStore {
    pub(crate) client: Client,
    pub(crate) config: EtcdConfig,
    /// The grants this store made and has not released yet, so that a release needs no
    /// read first (see [`Grants`]).
    pub(crate) grants: Arc<Grants>,
    /// What this store's waits left for the acquires that confirm them (see [`Waits`]).
    pub(crate) waits: Arc<Waits>,
}

/// The most grants [`Grants`] remembers; a grant made while it is full is released by
/// reading the key first, as one made by another process would be.
const GRANTS_REMEMBERED: usize = 1 << 16;

/// What this store knows of the grants it made: lease key → (owner, etcd lease, the
/// key's mod revision when written). Only a hint: a release by it deletes the key only if
/// its mod revision is still the one remembered (so the key is exactly as written, on
/// that etcd lease), and falls back to reading the key when anything differs.
#[derive(Debug, Default)]
pub(crate) struct Grants(Mutex<HashMap<String, Grant>>);

/// One remembered grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) owner: OwnerToken,
    /// The etcd lease the key is attached to.
    pub(crate) lease: i64,
    /// The key's mod revision when this store wrote it (0: not known, the write's
    /// outcome is; a release then reads the key).
    pub(crate) mod_revision: i64,
    /// Until when (on [`boottime`], so a host suspend counts) the etcd lease certainly
    /// has time left on etcd's clock: half its granted TTL after the send of the request
    /// that granted or last renewed it (etcd counts the TTL from when it processed that
    /// request, later, and only ever extends a lease, at a leader change). `None` where
    /// the platform has no boot clock: never certain.
    pub(crate) alive_until: Option<Duration>,
}

impl Grant {
    /// `alive_until` for an etcd lease granted or renewed for `granted_secs` by a request
    /// sent at `sent` (a [`boottime`] reading taken before it was sent).
    pub(crate) fn alive_until(sent: Option<Duration>, granted_secs: i64) -> Option<Duration> {
        let half = Duration::from_secs(u64::try_from(granted_secs).unwrap_or(0)) / 2;
        sent.map(|t| t.saturating_add(half))
    }

    /// Whether the etcd lease certainly has time left now.
    pub(crate) fn certainly_alive(&self) -> bool {
        self.alive_until
            .zip(boottime())
            .is_some_and(|(until, now)| now < until)
    }
}

impl Grants {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Grant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers that `lease_key` was written as `grant` (replacing what was remembered).
    pub(crate) fn remember(&self, lease_key: &str, grant: Grant) {
        let mut map = self.lock();
        if let Some(g) = map.get_mut(lease_key) {
            *g = grant;
        } else if map.len() < GRANTS_REMEMBERED {
            map.insert(lease_key.to_owned(), grant);
        }
    }

    /// Records a renewal of `lease_key`'s etcd lease `lease` (sent at `sent`, granted
    /// `granted_secs`), if that is the lease remembered for it.
    pub(crate) fn renewed(
        &self,
        lease_key: &str,
        lease: i64,
        sent: Option<Duration>,
        granted_secs: i64,
    ) {
        if let Some(g) = self.lock().get_mut(lease_key)
            && g.lease == lease
        {
            g.alive_until = Grant::alive_until(sent, granted_secs).max(g.alive_until);
        }
    }

    /// Whether something is remembered of `lease_key` for `owner`.
    pub(crate) fn holds(&self, lease_key: &str, owner: &OwnerToken) -> bool {
        self.lock()
            .get(lease_key)
            .is_some_and(|g| g.owner == *owner)
    }

    /// Takes what is remembered of `lease_key`, if it was granted to `owner`.
    pub(crate) fn take(&self, lease_key: &str, owner: &OwnerToken) -> Option<Grant> {
        let mut map = self.lock();
        match map.get(lease_key) {
            Some(g) if g.owner == *owner => map.remove(lease_key),
            _ => None,
        }
    }

    /// How many grants are remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A grant whose transaction is out. If the call ends before the transaction's answer
/// (an error, or the caller's bound dropping the call), the outcome is unknown and the key
/// may be this owner's now, on that etcd lease, at a revision not known: the grant is
/// remembered (with mod revision 0), so that a retry by the owner reads the key first and
/// a release reads it too. An answer, granted or not, disarms it.
pub(crate) struct Unanswered<'a> {
    grants: &'a Grants,
    lease_key: &'a str,
    grant: Option<Grant>,
}

impl<'a> Unanswered<'a> {
    /// Arms for `owner`'s write of `lease_key` on etcd lease `lease`.
    pub(crate) fn new(
        grants: &'a Grants,
        lease_key: &'a str,
        owner: OwnerToken,
        lease: i64,
    ) -> Self {
        Self {
            grants,
            lease_key,
            grant: Some(Grant {
                owner,
                lease,
                mod_revision: 0,
                alive_until: None,
            }),
        }
    }

    /// The transaction answered: its outcome is known.
    pub(crate) fn answered(mut self) {
        self.grant = None;
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(grant) = self.grant.take() {
            self.grants.remember(self.lease_key, grant);
        }
    }
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What the lease key's value says.
pub(crate) struct Holder {
    pub(crate) owner: OwnerToken,
    pub(crate) granted_secs: i64,
    pub(crate) kv: KeyValue,
}

impl EtcdStore {
    /// The etcd key that holds `key`'s lease: `<prefix><key>`.
    pub fn lease_key(&self, key: &Key) -> String {
        format!("{}{}", self.config.key_prefix(), key.as_str())
    }

    pub(crate) async fn bounded<T>(
        &self,
        op: &str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        StoreError::bounded(BACKEND, op, self.config.op_bound(), call).await
    }

    /// Grants a fresh etcd lease of `ttl_secs`: its id and the TTL etcd granted.
    pub(crate) async fn grant(&self, ttl_secs: i64) -> Result<(i64, i64), StoreError> {
        let mut lease = self.client.lease_client();
        let resp = lease
            .grant(ttl_secs, None)
            .await
            .map_err(|e| map_err("lease grant", e))?;
        if !resp.error().is_empty() || resp.ttl() <= 0 {
            return Err(err(
                StoreErrorKind::Other,
                format!("etcd refused a lease of {ttl_secs}s: {}", resp.error()),
            ));
        }
        Ok((resp.id(), resp.ttl()))
    }

    /// Revokes an etcd lease, best effort: a lease that could not be revoked expires by
    /// itself within its TTL (and then holds no key).
    pub(crate) async fn revoke_quietly(&self, id: i64) {
        let mut lease = self.client.lease_client();
        if let Err(e) = lease.revoke(id).await {
            tracing::debug!(lease = id, error = %e, "etcd lease revoke failed; it expires by itself");
        }
    }

    /// Revokes an etcd lease that holds no key any more, on a task of its own so that
    /// the caller does not wait for it (best effort, as [`revoke_quietly`]; outside a
    /// tokio runtime it is left to expire).
    ///
    /// [`revoke_quietly`]: Self::revoke_quietly
    pub(crate) fn revoke_later(&self, id: i64) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let store = self.clone();
            rt.spawn(async move { store.revoke_quietly(id).await });
        }
    }

    /// Keeps lease `id` alive once. `Ok(false)` when etcd no longer has it (expired or
    /// revoked).
    pub(crate) async fn keep_alive_once(&self, id: i64) -> Result<bool, StoreError> {
        let mut lease = self.client.lease_client();
        match lease.keep_alive(id).await {
            // The client sends one request and reads its answer before it returns; the
            // stream is closed when the keeper and stream are dropped here.
            Ok(_) => Ok(true),
            Err(etcd_client::Error::LeaseKeepAliveError(m)) if m.contains("not found") => Ok(false),
            Err(e) => Err(map_err("lease keep-alive", e)),
        }
    }
}

/// The first key each get of a transaction found, in order (`None` for a get that found
/// nothing).
pub(crate) fn gets(resp: &TxnResponse) -> impl Iterator<Item = Option<KeyValue>> {
    resp.op_responses().into_iter().filter_map(|r| match r {
        TxnOpResponse::Get(mut g) => Some(g.take_kvs().into_iter().next()),
        _ => None,
    })
}

pub(crate) fn decode(kv: KeyValue) -> Result<Holder, StoreError> {
    let corrupt = || {
        err(
            StoreErrorKind::Corrupt,
            "an etcd lease key does not hold `<owner> <ttl>`: written by something else?",
        )
    };
    let text = std::str::from_utf8(kv.value()).map_err(|_| corrupt())?;
    let (owner, granted) = text.split_once(' ').ok_or_else(corrupt)?;
    let owner: OwnerToken = owner.parse().map_err(|_| corrupt())?;
    let granted_secs: i64 = granted.parse().map_err(|_| corrupt())?;
    if granted_secs <= 0 || kv.lease() == 0 {
        return Err(corrupt());
    }
    Ok(Holder {
        owner,
        granted_secs,
        kv,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(owner: OwnerToken, lease: i64) -> Grant {
        Grant {
            owner,
            lease,
            mod_revision: lease * 10,
            alive_until: None,
        }
    }

    #[test]
    fn a_grant_is_taken_once_and_only_by_its_owner() {
        let grants = Grants::default();
        let (a, b) = (OwnerToken::random(), OwnerToken::random());
        grants.remember("k", grant(a, 1));
        assert!(grants.holds("k", &a) && !grants.holds("k", &b) && !grants.holds("j", &a));
        assert_eq!(grants.take("k", &b), None, "another owner's");
        assert_eq!(grants.take("other", &a), None, "another key's");
        // A renewal that moved the key replaces what was remembered.
        grants.remember("k", grant(a, 2));
        assert_eq!(grants.take("k", &a), Some(grant(a, 2)));
        assert_eq!(grants.take("k", &a), None, "taken once");
        assert_eq!(grants.len(), 0);
    }

    #[test]
    fn grants_beyond_the_bound_are_not_remembered_but_known_ones_are_updated() {
        let grants = Grants::default();
        let a = OwnerToken::random();
        for i in 0..GRANTS_REMEMBERED {
            grants.remember(&format!("k{i}"), grant(a, 1));
        }
        grants.remember("one more", grant(a, 1));
        assert_eq!(grants.len(), GRANTS_REMEMBERED);
        assert_eq!(grants.take("one more", &a), None);
        grants.remember("k0", grant(a, 7));
        assert_eq!(grants.take("k0", &a), Some(grant(a, 7)));
    }

    #[test]
    fn a_lease_is_certainly_alive_for_half_its_ttl_from_the_send() {
        assert_eq!(
            Grant::alive_until(Some(Duration::from_secs(100)), 5),
            Some(Duration::from_millis(102_500))
        );
        assert_eq!(Grant::alive_until(None, 5), None);
        let now = boottime().expect("this platform has a boot clock");
        let a = OwnerToken::random();
        let at = |alive_until| Grant {
            alive_until,
            ..grant(a, 1)
        };
        assert!(at(Some(now + Duration::from_secs(60))).certainly_alive());
        assert!(!at(Some(now)).certainly_alive(), "the bound itself is not");
        assert!(!at(None).certainly_alive());
        // A renewal moves the bound on, never back; another lease's renewal does not.
        let grants = Grants::default();
        grants.remember("k", at(Some(Duration::from_secs(10))));
        grants.renewed("k", 2, Some(Duration::from_secs(50)), 10);
        assert_eq!(
            grants.take("k", &a).unwrap().alive_until,
            Some(Duration::from_secs(10))
        );
        grants.remember("k", at(Some(Duration::from_secs(10))));
        grants.renewed("k", 1, Some(Duration::from_secs(50)), 10);
        assert_eq!(
            grants.take("k", &a).unwrap().alive_until,
            Some(Duration::from_secs(55))
        );
        grants.remember("k", at(Some(Duration::from_secs(90))));
        grants.renewed("k", 1, Some(Duration::from_secs(50)), 10);
        assert_eq!(
            grants.take("k", &a).unwrap().alive_until,
            Some(Duration::from_secs(90))
        );
    }
}
