//! The connection every role of [`EtcdStore`] shares: the store itself (its gRPC client
//! and configuration), its etcd lease calls, and how a lease key's value reads back.

use etcd_client::{Client, KeyValue, TxnOpResponse, TxnResponse};
use leasehold_core::{Key, OwnerToken, StoreError, StoreErrorKind};

use crate::BACKEND;
use crate::config::EtcdConfig;
use crate::error::{err, map_err};

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
