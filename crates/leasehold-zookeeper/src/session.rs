//! [`ZkStore`] itself and what every role of it shares: its ZooKeeper session, how much
//! of the session's timeout a grant may use ([`report_lag`]), the leader's confirmation of
//! grants in check `multi`s, and the tables of grants and waiters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{Fence, OwnerToken, StoreError, StoreErrorKind};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::BACKEND;
use crate::auth::Identity;
use crate::config::ZkConfig;
use crate::error::{err, map_err};
use crate::tls::Material;

/// A lease this store granted and still believes live.
#[derive(Debug, Clone)]
pub(crate) struct Granted {
    pub(crate) node: String,
    /// The node's data version (never changed by the store: 0 for a node it created).
    pub(crate) version: i32,
    pub(crate) fence: Fence,
    pub(crate) session: i64,
    pub(crate) ttl: Duration,
    /// The send of the last acquire or renewal + the TTL: past it the store deletes the
    /// node (nobody renewed the lease).
    pub(crate) deadline: Instant,
}

pub(crate) struct Inner {
    pub(crate) config: ZkConfig,
    /// The digest identity every session authenticates as, and the ACL of every node the
    /// store creates; `None`: no credentials, open ACLs.
    pub(crate) identity: Option<Identity>,
    /// The CA and client certificate, read when the store opened; `None`: plaintext.
    pub(crate) tls: Option<Arc<Material>>,
    pub(crate) session: tokio::sync::Mutex<Option<Session>>,
    pub(crate) granted: Mutex<HashMap<(String, OwnerToken), Granted>>,
    /// Acquires that may have created a node this store does not know of yet (in flight,
    /// or dropped by their caller): until when the node may live unclaimed.
    pub(crate) pending: Mutex<HashMap<(String, OwnerToken), Instant>>,
    /// Owners with a place in a key's queue (a waiter node): their calls in progress,
    /// and when the last one ended.
    pub(crate) waiting: Mutex<HashMap<(String, OwnerToken), Presence>>,
    /// Nodes of ours a delete failed to remove (the server restarting, the connection
    /// lost): the store's task tries again until they are gone, adopted by their owner, or
    /// ended with their session. Without it a node the session keeps alive would hold the
    /// lease for as long as the store lives.
    pub(crate) undeleted: Mutex<Vec<Undeleted>>,
    /// Held by an acquire that adopts a node of its owner (a waiter's place, a node left by
    /// a cut acquire) from its check of the node to its record of the grant, and by the
    /// store's task while it deletes unclaimed nodes: a node is either granted or deleted,
    /// never granted while its deletion is under way.
    pub(crate) adopt: tokio::sync::Mutex<()>,
    pub(crate) reaper: Reaper,
    /// Points where a test holds a call (tests only).
    #[cfg(test)]
    pub(crate) hooks: hooks::Hooks,
}

/// A lease store on a ZooKeeper ensemble (3.5 or later).
///
/// All leases of one store share **one ZooKeeper session**. A grant is an ephemeral
/// sequential node `<chroot>/<key>/<owner token>-<sequence>`; the lowest sequence holds
/// the lease; the fence is the node's `czxid`. Records ([`leasehold_core::Store::put_record`])
/// are persistent nodes `<chroot>/%2erecords/<key>` holding the fence (8 bytes, big-endian)
/// and the value. See the crate documentation for the design and its limits.
///
/// Cloning is cheap: clones share the session and the table of granted leases.
#[derive(Clone)]
pub struct ZkStore {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for ZkStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkStore")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// A node of `slot`'s owner on session `session` that a delete failed to remove.
#[derive(Debug, Clone)]
pub(crate) struct Undeleted {
    pub(crate) slot: (String, OwnerToken),
    pub(crate) node: String,
    pub(crate) session: i64,
}

/// How the store's task is woken: by a notifier, and only for what falls due before the
/// round it would start on its own (a grant's deadline is seconds away, and the task looks
/// at least once a second: waking it for every grant cost a thread wake-up per acquire).
#[derive(Debug, Default)]
pub(crate) struct Reaper {
    notify: tokio::sync::Notify,
    /// When the task's next round starts on its own; `None` while a round runs, which may
    /// have read the tables before the latest change (every change wakes it then).
    next: Mutex<Option<Instant>>,
}

impl Reaper {
    /// Something put in the tables falls due at `due`: wakes the task unless its next
    /// round comes at or before then. Called after the change is in the tables.
    pub(crate) fn due(&self, due: Instant) {
        let next = *self.next.lock().unwrap_or_else(|p| p.into_inner());
        if next.is_none_or(|n| due < n) {
            self.notify.notify_one();
        }
    }

    /// Wakes the task now.
    pub(crate) fn wake(&self) {
        self.notify.notify_one();
    }

    /// A round starts: called before the task reads the tables.
    pub(crate) fn round(&self) {
        *self.next.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The round is over; the next starts at `at` unless woken: called before the task
    /// waits on [`notified`](Self::notified) (a wake-up in between is kept by the notifier).
    pub(crate) fn sleeps_until(&self, at: Instant) {
        *self.next.lock().unwrap_or_else(|p| p.into_inner()) = Some(at);
    }

    /// Resolves on the next wake-up (or one given since the last).
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }
}

/// A waiter's presence: its node is kept while a call of its owner is in progress and for
/// `WAITER_GRACE` after the last one; then the store deletes it (the waiter gave up).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Presence {
    pub(crate) calls: u32,
    pub(crate) last: Instant,
}

/// The store's ZooKeeper session.
#[derive(Clone)]
pub(crate) struct Session {
    pub(crate) client: zk::Client,
    pub(crate) id: i64,
    /// The session timeout the ensemble granted.
    pub(crate) timeout: Duration,
    /// How much of `timeout` no grant may use ([`report_lag`]).
    pub(crate) lag: Duration,
}

impl Session {
    /// The longest TTL a grant can have: the session timeout less the report lag (a grant
    /// is shorter still by its request's round trip, see [`ZkStore::grant`]).
    pub(crate) fn longest_ttl(&self) -> Duration {
        self.timeout.saturating_sub(self.lag)
    }
}

/// The shortest TTL the store grants (the core's shortest TTL).
const MIN_GRANT: Duration = Duration::from_millis(10);

/// How long before a request was sent the last activity of the session the leader had heard
/// of may lie, not counting the request's round trip (`docs/design.md`, "ZooKeeper: a renewal
/// confirmed by a quorum write").
///
/// The leader expires a session counting from the last activity it heard of, and it hears
/// of the activity of a session connected to a follower only through that follower's
/// answers to its pings, sent every half tick, each listing the sessions active at the
/// follower since the one before. A request the leader commits (a check `multi`, a
/// `create`) was forwarded by the follower after every answer the follower had sent
/// before it, so the leader had read them all. The last of them was sent at most half a
/// tick (and a delivery, counted in the round trip) before the follower forwarded the
/// request, and it listed the session if the session was active at the follower since the
/// answer before: the client sends a ping whenever it has sent nothing for three of its
/// ticks (checked every tick). So the leader had heard of activity no older than half a
/// tick plus four client ticks before the request was sent, and cannot expire the session
/// before that activity + the session timeout.
///
/// The client's ticks are those of `zookeeper-client` 0.11: 1/8 of the connection
/// timeout, or 1/20 of the session timeout when the connection timeout is longer than 3/5
/// of it; its ping interval is at most 10 s. The ensemble's tick is
/// [`ZkConfig::ensemble_tick`], or, unset, half the session timeout (the longest ZooKeeper's
/// default `minSessionTimeout` of two ticks allows).
pub(crate) fn report_lag(config: &ZkConfig, negotiated: Duration) -> Duration {
    let tick = config.ensemble_tick().unwrap_or(negotiated / 2);
    let reports = tick / 2;
    let conn = config.connection_timeout();
    let client_tick = if conn > negotiated * 3 / 5 {
        negotiated / 20
    } else {
        conn / 8
    }
    .max(Duration::from_millis(1));
    let quiet = (client_tick * 3).min(Duration::from_secs(10)) + client_tick;
    reports + quiet
}

/// What the leader answered about one node of a check `multi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// The node exists with the version checked, and the session was live at the leader.
    Live,
    /// The node is gone (or another), or the session ended.
    Gone,
}

/// The most bytes of node paths one check `multi` carries (the server refuses a request
/// larger than its `jute.maxbuffer`, 1 MB by default): a bigger batch is split.
const CHECK_BATCH_BYTES: usize = 256 * 1024;

impl ZkStore {
    pub(crate) async fn bounded<T>(
        &self,
        op: &str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        StoreError::bounded(BACKEND, op, self.inner.config.op_bound(), call).await
    }

    /// The ACL of every node the store creates: all permissions to its digest identity
    /// only, or, without credentials, to anyone.
    pub(crate) fn acls(&self) -> zk::Acls<'_> {
        match &self.inner.identity {
            Some(me) => zk::Acls::new(&me.acl),
            None => zk::Acls::anyone_all(),
        }
    }

    pub(crate) fn granted(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, OwnerToken), Granted>> {
        self.inner.granted.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn undeleted(&self) -> std::sync::MutexGuard<'_, Vec<Undeleted>> {
        self.inner
            .undeleted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The current session, or a new one when there is none or it ended (expired,
    /// closed): the leases of an ended session are gone with its nodes.
    pub(crate) async fn session(&self) -> Result<Session, StoreError> {
        let mut slot = self.inner.session.lock().await;
        if let Some(s) = slot.as_ref()
            && !s.client.state().is_terminated()
        {
            return Ok(s.clone());
        }
        // Boxed: the connect's state is about 9 KB, which every operation's future would
        // otherwise carry (and copy) for a path it rarely takes.
        Box::pin(self.open_session(&mut slot)).await
    }

    /// Opens a new session into `slot` (the current one ended, or there was none).
    async fn open_session(
        &self,
        slot: &mut tokio::sync::MutexGuard<'_, Option<Session>>,
    ) -> Result<Session, StoreError> {
        let config = &self.inner.config;
        let hosts = config.connect_string();
        let client = StoreError::bounded(BACKEND, "connect", config.connect_bound(), async {
            let connector = zk::Client::connector()
                .with_session_timeout(config.session_timeout_asked())
                .with_connection_timeout(config.connection_timeout())
                .with_fail_eagerly();
            let tls = self.inner.tls.as_ref();
            let connected = match tls {
                Some(m) => {
                    connector
                        .with_tls(m.client_options()?)
                        .secure_connect(&hosts)
                        .await
                }
                None => connector.connect(&hosts).await,
            };
            match connected {
                Ok(client) => {
                    // Authenticated once the session is established, not in the same
                    // packet as the connect request: ZooKeeper 3.8's TLS (Netty) server
                    // may answer such an auth before the connect, which the client takes
                    // for a malformed connect response. The client resends it with every
                    // reconnect, before any other request.
                    if let Some(c) = config.credentials_ref() {
                        client
                            .auth("digest", &Identity::auth_data(c))
                            .await
                            .map_err(|e| map_err("authenticate", e))?;
                    }
                    Ok(client)
                }
                Err(e) => {
                    // The client reports a failed handshake as a lost connection: handshake
                    // once to find out why.
                    if let Some(m) = tls
                        && !matches!(e, zk::Error::AuthFailed)
                        && let Some(failure) =
                            m.probe(config.hosts(), config.connect_bound() / 2).await
                    {
                        return Err(crate::tls::into_error(failure, "connect failed"));
                    }
                    if matches!(e, zk::Error::NoHosts) {
                        let hint = if tls.is_some() {
                            "are they up and reachable?"
                        } else {
                            "are they up and reachable? A server that serves only TLS drops \
                             a plaintext client: then add tls=true"
                        };
                        return Err(err(
                            StoreErrorKind::Unavailable,
                            format!(
                                "zookeeper connect failed: no server accepted a session: {hint}"
                            ),
                        )
                        .with_source(e));
                    }
                    Err(map_err("connect", e))
                }
            }
        })
        .await?;
        let timeout = client.session_timeout();
        let session = Session {
            id: client.session_id().0,
            timeout,
            lag: report_lag(config, timeout),
            client,
        };
        if session.longest_ttl() < MIN_GRANT {
            return Err(err(
                StoreErrorKind::Config,
                format!(
                    "zookeeper: the session timeout the ensemble granted ({timeout:?}) leaves no \
                     TTL to grant after the {:?} the leader may take to hear of the session's \
                     activity (half the ensemble's tick plus the client's ping interval): ask \
                     for a longer session_timeout, or set tick_time to the ensemble's tickTime",
                    session.lag
                ),
            ));
        }
        tracing::debug!(
            session = session.id,
            timeout_ms = session.timeout.as_millis() as u64,
            "zookeeper session established"
        );
        if let Some(old) = slot.replace(session.clone()) {
            // Every lease of the old session ended with it.
            let id = old.id;
            self.granted().retain(|_, g| g.session != id);
        }
        Ok(session)
    }

    /// Brings the server this session reads from up to date with the leader (ZooKeeper
    /// serves reads from any member, which may lag): a read after it sees every write
    /// committed before it, whoever made it.
    pub(crate) async fn sync(&self, s: &Session) -> Result<(), StoreError> {
        s.client
            .sync(self.inner.config.chroot_path())
            .await
            .map_err(|e| map_err("sync", e))
    }

    /// The TTL a request sent at `sent` and answered now grants: the TTL asked for, at
    /// most the session timeout less the report lag and the request's round trip (the
    /// leader cannot expire the session before then, see [`report_lag`]).
    ///
    /// # Errors
    /// `Timeout` when the round trip took so long that nothing of the session timeout is
    /// left to grant.
    pub(crate) fn grant(s: &Session, ttl: Duration, sent: Instant) -> Result<Duration, StoreError> {
        let round_trip = sent.elapsed();
        let granted = ttl.min(s.longest_ttl().saturating_sub(round_trip));
        if granted < MIN_GRANT {
            return Err(err(
                StoreErrorKind::Timeout,
                format!(
                    "zookeeper: the request took {round_trip:?}; of the session timeout {:?} \
                     less the {:?} the leader may take to hear of the session, nothing is \
                     left to grant",
                    s.timeout, s.lag
                ),
            ));
        }
        Ok(granted)
    }

    /// Has the leader check `nodes` (path, data version) in check `multi`s that change no
    /// data: each commits through the leader (a quorum write), which also checks that the
    /// session is live there, so the answer does not come from the copy of the member the
    /// session is connected to. One `multi` per [`CHECK_BATCH_BYTES`] of paths, sent
    /// together. A `multi` is all or nothing: when one check fails, the leader names the
    /// first failing one; that node is `Gone` and the rest are checked again, so one lost
    /// lease costs one more `multi` and fails no other. The session ended: all `Gone`.
    pub(crate) async fn confirm(
        &self,
        s: &Session,
        nodes: &[(&str, i32)],
    ) -> Result<Vec<Check>, StoreError> {
        let mut chunks = Vec::new();
        let mut start = 0;
        let mut bytes = 0;
        for (i, (path, _)) in nodes.iter().enumerate() {
            if i > start && bytes + path.len() > CHECK_BATCH_BYTES {
                chunks.push(&nodes[start..i]);
                start = i;
                bytes = 0;
            }
            bytes += path.len() + 16;
        }
        chunks.push(&nodes[start..]);
        let answers =
            futures::future::try_join_all(chunks.into_iter().map(|c| Self::confirm_chunk(s, c)))
                .await?;
        Ok(answers.concat())
    }

    async fn confirm_chunk(s: &Session, nodes: &[(&str, i32)]) -> Result<Vec<Check>, StoreError> {
        let mut answers = vec![Check::Live; nodes.len()];
        let mut left: Vec<usize> = (0..nodes.len()).collect();
        while !left.is_empty() {
            let mut multi = s.client.new_multi_writer();
            for &i in &left {
                let (path, version) = nodes[i];
                multi
                    .add_check_version(path, version)
                    .map_err(|e| map_err("check", e))?;
            }
            match multi.commit().await {
                Ok(_) => break,
                Err(zk::MultiWriteError::OperationFailed {
                    index,
                    source: zk::Error::NoNode | zk::Error::BadVersion,
                }) => {
                    if index >= left.len() {
                        return Err(err(
                            StoreErrorKind::Other,
                            "zookeeper answered a check multi about an operation it was not sent",
                        ));
                    }
                    answers[left.remove(index)] = Check::Gone;
                }
                Err(
                    zk::MultiWriteError::OperationFailed {
                        source: zk::Error::SessionExpired,
                        ..
                    }
                    | zk::MultiWriteError::RequestFailed {
                        source: zk::Error::SessionExpired,
                    },
                ) => return Ok(vec![Check::Gone; nodes.len()]),
                Err(
                    zk::MultiWriteError::OperationFailed { source, .. }
                    | zk::MultiWriteError::RequestFailed { source },
                ) => return Err(map_err("check", source)),
            }
        }
        Ok(answers)
    }
}

/// Pause points for tests: a test arms one, the call stops there until the test resumes it.
#[cfg(test)]
mod hooks {
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::sync::Notify;

    #[derive(Default)]
    pub(crate) struct Hooks {
        /// A same-owner re-acquire of a grant the store knows: after its check of the
        /// node, before it records the grant.
        pub(crate) reacquire_checked: Pause,
    }

    /// Holds the next call that reaches it (once armed) until [`resume`](Self::resume).
    #[derive(Default)]
    pub(crate) struct Pause {
        armed: AtomicBool,
        reached: Notify,
        resume: Notify,
    }

    impl Pause {
        pub(crate) fn arm(&self) {
            self.armed.store(true, Ordering::SeqCst);
        }

        pub(crate) async fn at(&self) {
            if self.armed.swap(false, Ordering::SeqCst) {
                self.reached.notify_one();
                self.resume.notified().await;
            }
        }

        pub(crate) async fn reached(&self) {
            self.reached.notified().await;
        }

        pub(crate) fn resume(&self) {
            self.resume.notify_one();
        }
    }
}
