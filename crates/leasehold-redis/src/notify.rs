//! Release notifications over pub/sub.
//!
//! A script that grants or reserves a lease for the first waiter in its queue `PUBLISH`es
//! that waiter's owner token on the key's channel (`<owner>:<fence>:<ttl ms>` for a grant
//! to a waiter that heartbeats, which holds the lease from this notice: see
//! [`Wake::granted`]); the break script publishes the new fence. A
//! store that waits keeps one dedicated pub/sub connection, subscribed to the channels of
//! the keys some caller is waiting on (and only those: a channel is unsubscribed when its
//! last waiter leaves). A message naming an owner (`<owner>[:<fence>:<ttl>]`, then
//! optionally ` <next owner>`)
//! wakes only that owner's waiters, and tells the next owner's waiters that they are next;
//! any other message wakes every waiter on the channel (they re-check). Subscribe and
//! unsubscribe decisions are made under one async lock, so the order on the wire always
//! matches the latest decision.
//!
//! On a Cluster the scripts `SPUBLISH` (sharded pub/sub, Redis 7.0+) unless
//! `sharded_pubsub=false`: the key's channel shares its hash tag, so a message goes to the
//! key's shard only, and the waiting store `SSUBSCRIBE`s through a Cluster connection of
//! its own (RESP3), which follows the slot to its node and subscribes again after a
//! reconnect; messages arrive as RESP3 pushes.
//!
//! Notifications are a hint, never a guarantee: a lost message (a broken pub/sub connection)
//! only means the waiter wakes at the holder's expiry or its own deadline instead.
//!
//! Watchers ([`WatchStore::watch`](leasehold_core::WatchStore::watch)) share the connection and the
//! channels: a watcher registered on a channel keeps it subscribed like a waiter does,
//! hears every message on it as a change except heartbeats (`~<token>`, the watch script's
//! proof that the subscription still hears the key; its own wakes it on `heard`, others'
//! are ignored), and is told when the connection is lost (`lost`), since messages may
//! have been missed then. Messages starting with `~` (a change notice `~`, a heartbeat)
//! are for watchers only: waiters ignore them, so watching wakes no waiter.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::PubSubSink;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, PushInfo, PushKind, Value};
use tokio::sync::Notify;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::AbortHandle;

use leasehold_core::{Fence, StoreError, StoreErrorKind};

use crate::BACKEND;
use crate::error::{self, Phase};
use crate::wire::Armed;

#[derive(Default)]
struct Inner {
    /// Waiters per channel: registration id → (owner token in hex, its wake-ups).
    waiters: HashMap<String, HashMap<u64, (String, Arc<Wake>)>>,
    /// Watchers per channel: registration id → its signals.
    watchers: HashMap<String, HashMap<u64, Arc<Watcher>>>,
    /// The id of the next registration.
    next_id: u64,
    /// Channels the current connection is subscribed to.
    subscribed: HashSet<String>,
    /// The current pub/sub connection: generation, sink, its reader task (classic).
    conn: Option<(u64, Sink, Option<AbortHandle>)>,
    /// The reader of the sharded client's pushes (for the store's life).
    push_reader: Option<AbortHandle>,
}

/// How waiters hear releases.
pub(crate) enum Transport {
    /// Classic pub/sub on a dedicated connection to one of these nodes (the server; each
    /// seed of a Cluster in turn: classic messages reach every node).
    Classic(Vec<Client>),
    /// Sharded pub/sub through a Cluster connection of this (RESP3) client, whose pushes
    /// arrive on `pushes` (taken by the first connection's reader).
    /// Classic pub/sub on a dedicated connection to the primary Sentinel names at each
    /// connection (a `PUBLISH` on the primary reaches its replicas' subscribers too).
    Sentinel(Arc<crate::discovery::Discovery>),
    Sharded {
        client: Box<ClusterClient>,
        pushes: Mutex<Option<UnboundedReceiver<PushInfo>>>,
    },
}

/// The subscribing side of a connection.
#[derive(Clone)]
enum Sink {
    Classic(PubSubSink),
    Sharded(ClusterConnection),
}

impl Sink {
    async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Sink::Classic(s) => s.subscribe(channel).await,
            Sink::Sharded(c) => c.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Sink::Classic(s) => s.unsubscribe(channel).await,
            Sink::Sharded(c) => c.sunsubscribe(channel).await,
        }
    }
}

/// The pub/sub side of a store.
pub(crate) struct Notifier {
    transport: Transport,
    next_client: AtomicUsize,
    connect_timeout: Duration,
    op_timeout: Duration,
    secret: Option<String>,
    inner: Mutex<Inner>,
    ops: tokio::sync::Mutex<()>,
    generation: AtomicU64,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.lock();
        f.debug_struct("Notifier")
            .field("waiting_channels", &i.waiters.len())
            .field("watched_channels", &i.watchers.len())
            .field("subscribed", &i.subscribed.len())
            .field("connected", &i.conn.is_some())
            .finish()
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        let mut i = self.lock();
        if let Some((_, _, Some(task))) = i.conn.take() {
            task.abort();
        }
        if let Some(task) = i.push_reader.take() {
            task.abort();
        }
    }
}

/// A registered waiter on a channel; unregisters on drop (cancel safe).
pub(crate) struct Registration {
    notifier: Arc<Notifier>,
    channel: String,
    id: u64,
    wake: Arc<Wake>,
}

/// A waiter's wake-ups.
#[derive(Default)]
pub(crate) struct Wake {
    /// The lease was reserved for this owner (or anything else happened that calls for
    /// a re-check).
    pub(crate) go: Notify,
    /// The lease was reserved for the owner just ahead of this one.
    pub(crate) next: Notify,
    /// The last grant a message said was made for this owner (`<owner>:<fence>:<ttl>`):
    /// its fence and TTL. Set before `go` is notified.
    pub(crate) granted: Mutex<Option<(Fence, Duration)>>,
}

impl Wake {
    /// Takes the grant a message told of, if any.
    pub(crate) fn take_granted(&self) -> Option<(Fence, Duration)> {
        self.granted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

impl Registration {
    pub(crate) fn wake(&self) -> &Wake {
        &self.wake
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        unregister(&self.notifier, &mut self.channel, self.id, |i| {
            &mut i.waiters
        });
    }
}

/// Removes registration `id` of `channel` from the notifier's waiters or watchers (`regs`
/// picks which); once nobody waits on or watches the channel, it is unsubscribed in the
/// background.
fn unregister<T>(
    notifier: &Arc<Notifier>,
    channel: &mut String,
    id: u64,
    regs: fn(&mut Inner) -> &mut HashMap<String, HashMap<u64, T>>,
) {
    let unused = {
        let mut i = notifier.lock();
        let map = regs(&mut i);
        match map.get_mut(channel.as_str()) {
            Some(r) => {
                r.remove(&id);
                if r.is_empty() {
                    map.remove(channel.as_str());
                }
                !i.waiters.contains_key(channel.as_str())
                    && !i.watchers.contains_key(channel.as_str())
            }
            None => false,
        }
    };
    if unused {
        notifier.reconcile_later(std::mem::take(channel));
    }
}

/// A watcher's signals.
pub(crate) struct Watcher {
    /// The heartbeat message this watcher's watch script publishes.
    beat: Vec<u8>,
    /// A message that may tell of a change (or the connection was lost: see `lost`).
    pub(crate) changed: Notify,
    /// This watcher's own heartbeat came back.
    pub(crate) heard: Notify,
    /// The connection the channel was subscribed on was lost: messages may be missed.
    lost: AtomicBool,
}

impl Watcher {
    /// Whether the connection was lost since the watcher registered.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    fn deliver(&self, payload: &[u8]) {
        if payload == self.beat.as_slice() {
            self.heard.notify_one();
        } else if payload.len() > 1 && payload[0] == b'~' {
            // Another watcher's heartbeat.
        } else {
            self.changed.notify_one();
        }
    }

    fn lose(&self) {
        self.lost.store(true, Ordering::Release);
        self.changed.notify_one();
    }
}

/// A registered watcher of a channel; unregisters on drop (the channel is unsubscribed in
/// the background once nobody waits on or watches it).
pub(crate) struct WatchRegistration {
    notifier: Arc<Notifier>,
    channel: String,
    id: u64,
    watcher: Arc<Watcher>,
}

impl WatchRegistration {
    pub(crate) fn watcher(&self) -> &Watcher {
        &self.watcher
    }

    pub(crate) fn notifier(&self) -> &Notifier {
        &self.notifier
    }
}

impl Drop for WatchRegistration {
    fn drop(&mut self) {
        unregister(&self.notifier, &mut self.channel, self.id, |i| {
            &mut i.watchers
        });
    }
}

impl Notifier {
    pub(crate) fn new(
        transport: Transport,
        connect_timeout: Duration,
        op_timeout: Duration,
        secret: Option<String>,
    ) -> Self {
        Self {
            transport,
            next_client: AtomicUsize::new(0),
            connect_timeout,
            op_timeout,
            secret,
            inner: Mutex::new(Inner::default()),
            ops: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `owner` (hex) as waiting on `channel`. Create the `Notified` future from
    /// the returned registration *before* calling [`subscribe`](Self::subscribe), so that
    /// nothing published after the subscription is missed.
    pub(crate) fn register(self: &Arc<Self>, channel: &str, owner: &str) -> Registration {
        let wake = Arc::new(Wake::default());
        let id = {
            let mut i = self.lock();
            let id = i.next_id;
            i.next_id += 1;
            i.waiters
                .entry(channel.to_owned())
                .or_default()
                .insert(id, (owner.to_owned(), wake.clone()));
            id
        };
        Registration {
            notifier: self.clone(),
            channel: channel.to_owned(),
            id,
            wake,
        }
    }

    /// Makes sure the pub/sub connection is subscribed to the registration's channel.
    pub(crate) async fn subscribe(self: &Arc<Self>, reg: &Registration) -> Result<(), StoreError> {
        self.reconcile(&reg.channel).await
    }

    /// Registers a watcher of `channel` whose heartbeat message is `beat` (it must start
    /// with `~` and be longer than that). Then [`subscribe_watcher`](Self::subscribe_watcher).
    pub(crate) fn watch(self: &Arc<Self>, channel: &str, beat: &str) -> WatchRegistration {
        let watcher = Arc::new(Watcher {
            beat: beat.as_bytes().to_vec(),
            changed: Notify::new(),
            heard: Notify::new(),
            lost: AtomicBool::new(false),
        });
        let id = {
            let mut i = self.lock();
            let id = i.next_id;
            i.next_id += 1;
            i.watchers
                .entry(channel.to_owned())
                .or_default()
                .insert(id, watcher.clone());
            id
        };
        WatchRegistration {
            notifier: self.clone(),
            channel: channel.to_owned(),
            id,
            watcher,
        }
    }

    /// Makes sure the pub/sub connection is subscribed to the watcher's channel.
    pub(crate) async fn subscribe_watcher(
        self: &Arc<Self>,
        reg: &WatchRegistration,
    ) -> Result<(), StoreError> {
        self.reconcile(&reg.channel).await
    }

    /// Drops the current pub/sub connection (as a broken one is dropped): a watcher found
    /// that it no longer hears its channel (a heartbeat that did not come back; after a
    /// Sentinel fail-over that left the old primary running, the connection is alive but
    /// on a server that no longer gets the key's messages). The next subscription
    /// connects afresh.
    pub(crate) fn reset(&self) {
        let current = self.lock().conn.as_ref().map(|(g, _, _)| *g);
        if let Some(g) = current {
            self.disconnect(g);
        }
    }

    /// Reconciles `channel` in the background (from a `Drop`, outside async code).
    fn reconcile_later(self: &Arc<Self>, channel: String) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let notifier = self.clone();
            rt.spawn(async move {
                let _ = notifier.reconcile(&channel).await;
            });
        }
    }

    fn unavailable(&self, what: &str) -> StoreError {
        StoreError::new(
            StoreErrorKind::Unavailable,
            BACKEND,
            format!("waiting for a release: {what}"),
        )
    }

    /// Brings the subscription of `channel` in line with whether anyone waits on it.
    async fn reconcile(self: &Arc<Self>, channel: &str) -> Result<(), StoreError> {
        let _serial = tokio::time::timeout(self.op_timeout, self.ops.lock())
            .await
            .map_err(|_| self.unavailable("the pub/sub connection is busy"))?;
        let (want, have) = {
            let i = self.lock();
            (
                i.waiters.get(channel).is_some_and(|regs| !regs.is_empty())
                    || i.watchers.get(channel).is_some_and(|regs| !regs.is_empty()),
                i.conn.is_some() && i.subscribed.contains(channel),
            )
        };
        if want == have {
            return Ok(());
        }
        if !want && self.lock().conn.is_none() {
            return Ok(());
        }
        let (generation, mut sink) = self.connection().await?;
        // Cancelled between request and confirmation: the connection is suspect.
        let in_flight = Armed::new(|| self.disconnect(generation));
        let res = if want {
            tokio::time::timeout(self.op_timeout, sink.subscribe(channel)).await
        } else {
            tokio::time::timeout(self.op_timeout, sink.unsubscribe(channel)).await
        };
        in_flight.disarm();
        match res {
            Ok(Ok(())) => {
                let mut i = self.lock();
                if want {
                    i.subscribed.insert(channel.to_owned());
                } else {
                    i.subscribed.remove(channel);
                }
                Ok(())
            }
            Ok(Err(e)) => {
                self.disconnect(generation);
                Err(error::map(
                    "subscribing to release notifications",
                    Phase::Request,
                    &e,
                    self.secret.as_deref(),
                ))
            }
            Err(_) => {
                self.disconnect(generation);
                Err(StoreError::timeout(
                    BACKEND,
                    "subscribing to release notifications",
                    self.op_timeout,
                ))
            }
        }
    }

    /// The current pub/sub connection, connecting if needed. Called under `ops`.
    async fn connection(self: &Arc<Self>) -> Result<(u64, Sink), StoreError> {
        if let Some((g, sink, _)) = &self.lock().conn {
            return Ok((*g, sink.clone()));
        }
        match &self.transport {
            Transport::Classic(clients) => self.connect_classic(clients).await,
            Transport::Sentinel(discovery) => {
                let (_, client) = discovery.client().await?;
                self.connect_classic(&[client]).await
            }
            Transport::Sharded { client, pushes } => {
                let conn =
                    match tokio::time::timeout(self.connect_timeout, client.get_async_connection())
                        .await
                    {
                        Ok(Ok(c)) => c,
                        Ok(Err(e)) => {
                            return Err(error::map(
                                "connecting for release notifications",
                                Phase::Connect,
                                &e,
                                self.secret.as_deref(),
                            ));
                        }
                        Err(_) => return Err(self.unavailable("connecting timed out")),
                    };
                let reader = pushes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .map(|rx| tokio::spawn(read_pushes(Arc::downgrade(self), rx)).abort_handle());
                let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
                let sink = Sink::Sharded(conn);
                let mut i = self.lock();
                if reader.is_some() {
                    i.push_reader = reader;
                }
                i.subscribed.clear();
                i.conn = Some((generation, sink.clone(), None));
                Ok((generation, sink))
            }
        }
    }

    /// A classic pub/sub connection to one of `clients`, each tried in turn.
    async fn connect_classic(
        self: &Arc<Self>,
        clients: &[Client],
    ) -> Result<(u64, Sink), StoreError> {
        if clients.is_empty() {
            return Err(self.unavailable("no node to subscribe on"));
        }
        let start = self.next_client.fetch_add(1, Ordering::Relaxed);
        let mut last_err = None;
        for n in 0..clients.len() {
            let client = &clients[(start + n) % clients.len()];
            match tokio::time::timeout(self.connect_timeout, client.get_async_pubsub()).await {
                Ok(Ok(pubsub)) => {
                    let (sink, stream) = pubsub.split();
                    let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
                    let weak = Arc::downgrade(self);
                    let task = tokio::spawn(read_messages(weak, generation, stream));
                    let sink = Sink::Classic(sink);
                    let mut i = self.lock();
                    i.subscribed.clear();
                    i.conn = Some((generation, sink.clone(), Some(task.abort_handle())));
                    return Ok((generation, sink));
                }
                Ok(Err(e)) => {
                    last_err = Some(error::map(
                        "connecting for release notifications",
                        Phase::Connect,
                        &e,
                        self.secret.as_deref(),
                    ));
                }
                Err(_) => last_err = Some(self.unavailable("connecting timed out")),
            }
        }
        Err(last_err.unwrap_or_else(|| self.unavailable("no node to subscribe on")))
    }

    /// Drops the pub/sub connection of `generation`, wakes every waiter (they re-check) and
    /// tells every watcher that messages may have been lost.
    fn disconnect(&self, generation: u64) {
        let mut i = self.lock();
        if i.conn.as_ref().is_some_and(|(g, _, _)| *g == generation) {
            if let Some((_, _, Some(task))) = i.conn.take() {
                task.abort();
            }
            i.subscribed.clear();
            wake_all(&i);
            lose_all(&i);
            tracing::debug!(generation, "redis pub/sub connection dropped");
        }
    }

    /// A message on `channel`: `<owner>` or `<owner> <next>` wakes that owner's waiters
    /// only (the lease was reserved for it) and tells `next`'s waiters they are next; a
    /// message for watchers (starting with `~`) wakes no waiter; anything else (a break's
    /// fence) wakes every waiter. Every watcher hears every message (see [`Watcher`]).
    fn deliver(&self, channel: &str, payload: &[u8]) {
        let i = self.lock();
        if let Some(watchers) = i.watchers.get(channel) {
            for w in watchers.values() {
                w.deliver(payload);
            }
        }
        if payload.first() == Some(&b'~') {
            return;
        }
        let Some(regs) = i.waiters.get(channel) else {
            return;
        };
        let parsed = parse_reservation(payload);
        for (owner, wake) in regs.values() {
            let owner = owner.as_bytes();
            match parsed {
                None => wake.go.notify_waiters(),
                Some(r) if r.to == owner => {
                    if let Some(g) = r.granted {
                        *wake
                            .granted
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(g);
                    }
                    wake.go.notify_waiters();
                }
                Some(r) if r.next == Some(owner) => wake.next.notify_waiters(),
                Some(_) => {}
            }
        }
    }
}

/// Wakes every waiter (they re-check): messages may have been missed.
fn wake_all(i: &Inner) {
    for (_, wake) in i.waiters.values().flat_map(HashMap::values) {
        wake.go.notify_waiters();
    }
}

/// Tells every watcher that messages may have been missed.
fn lose_all(i: &Inner) {
    for w in i.watchers.values().flat_map(HashMap::values) {
        w.lose();
    }
}

/// An owner token as the scripts write it: 32 lower-case hex digits.
fn is_owner(s: &[u8]) -> bool {
    s.len() == 32 && s.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A reservation message, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reservation<'a> {
    /// The owner the lease was reserved for.
    to: &'a [u8],
    /// The grant's fence and TTL, when the reservation is a grant of its own (a waiter
    /// that heartbeats, `<owner>:<fence>:<ttl ms>`).
    granted: Option<(Fence, Duration)>,
    /// The owner now first in the queue.
    next: Option<&'a [u8]>,
}

/// `<to>` or `<to>:<fence>:<ttl ms>`, then optionally ` <next owner>`; `None` for any
/// other message.
fn parse_reservation(payload: &[u8]) -> Option<Reservation<'_>> {
    let mut parts = payload.split(|&b| b == b' ');
    let first = parts.next()?;
    let mut fields = first.split(|&b| b == b':');
    let to = fields.next().filter(|p| is_owner(p))?;
    let granted = match (fields.next(), fields.next(), fields.next()) {
        (None, _, _) => None,
        (Some(f), Some(t), None) => {
            let fence = std::str::from_utf8(f)
                .ok()
                .and_then(crate::wire::parse_fence)?;
            let ttl = std::str::from_utf8(t)
                .ok()
                .filter(|t| !t.is_empty() && t.len() <= 9 && t.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|t| t.parse::<u64>().ok())
                .filter(|ms| *ms > 0)?;
            Some((fence, Duration::from_millis(ttl)))
        }
        _ => return None,
    };
    let next = match (parts.next(), parts.next()) {
        (None, _) => None,
        (Some(n), None) if is_owner(n) => Some(n),
        _ => return None,
    };
    Some(Reservation { to, granted, next })
}

async fn read_messages(
    notifier: Weak<Notifier>,
    generation: u64,
    mut stream: redis::aio::PubSubStream,
) {
    while let Some(msg) = stream.next().await {
        let Some(n) = notifier.upgrade() else { return };
        n.deliver(msg.get_channel_name(), msg.get_payload_bytes());
    }
    if let Some(n) = notifier.upgrade() {
        n.disconnect(generation);
    }
}

/// Reads the sharded client's pushes: a sharded message is delivered; a dropped node
/// connection wakes every waiter (a message may have been missed meanwhile; the Cluster
/// connection reconnects and subscribes again by itself).
async fn read_pushes(notifier: Weak<Notifier>, mut pushes: UnboundedReceiver<PushInfo>) {
    while let Some(push) = pushes.recv().await {
        let Some(n) = notifier.upgrade() else { return };
        match (push.kind, push.data.as_slice()) {
            (PushKind::SMessage, [Value::BulkString(channel), Value::BulkString(payload)]) => {
                if let Ok(channel) = std::str::from_utf8(channel) {
                    n.deliver(channel, payload);
                }
            }
            (PushKind::Disconnection, _) => {
                let i = n.lock();
                wake_all(&i);
                lose_all(&i);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use leasehold_core::Fence;

    use super::{Reservation, parse_reservation};

    #[test]
    fn reservation_messages_are_strict() {
        let a = "0123456789abcdef0123456789abcdef";
        let b = "fedcba9876543210fedcba9876543210";
        let plain = |to: &'static str, next: Option<&'static str>| {
            Some(Reservation {
                to: to.as_bytes(),
                granted: None,
                next: next.map(str::as_bytes),
            })
        };
        assert_eq!(parse_reservation(a.as_bytes()), plain(a, None));
        let both = format!("{a} {b}");
        assert_eq!(parse_reservation(both.as_bytes()), plain(a, Some(b)));
        let granted = Some((Fence(42), Duration::from_millis(1500)));
        assert_eq!(
            parse_reservation(format!("{a}:42:1500").as_bytes()),
            Some(Reservation {
                to: a.as_bytes(),
                granted,
                next: None
            })
        );
        assert_eq!(
            parse_reservation(format!("{a}:42:1500 {b}").as_bytes()),
            Some(Reservation {
                to: a.as_bytes(),
                granted,
                next: Some(b.as_bytes())
            })
        );
        for bad in [
            "1764000000000000".to_owned(),
            String::new(),
            a.to_uppercase(),
            format!("{a} "),
            format!("{a} {b} {b}"),
            format!("{a} 12"),
            format!("{a}:"),
            format!("{a}:42"),
            format!("{a}:42:"),
            format!("{a}:042:1500"),
            format!("{a}:0:1500"),
            format!("{a}:42:0"),
            format!("{a}:42:-5"),
            format!("{a}:42:1500:1"),
            format!("{a}:42:1000000000"),
            format!("{a}:x:1500"),
        ] {
            assert_eq!(parse_reservation(bad.as_bytes()), None, "{bad:?}");
        }
    }
}
