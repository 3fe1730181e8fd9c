//! Release notifications over pub/sub.
//!
//! The release (and break) scripts `PUBLISH` to the key's channel. A store that waits for a
//! release keeps one dedicated pub/sub connection, subscribed to the channels of the keys
//! some caller is waiting on (and only those: a channel is unsubscribed when its last
//! waiter leaves). Subscribe and unsubscribe decisions are made under one async lock, so
//! the order on the wire always matches the latest decision.
//!
//! Notifications are a hint, never a guarantee: a lost message (a broken pub/sub connection)
//! only means the waiter wakes at the holder's expiry or its own deadline instead.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::Client;
use redis::aio::PubSubSink;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use leasehold_core::{StoreError, StoreErrorKind};

use crate::BACKEND;
use crate::error::{self, Phase};

#[derive(Default)]
struct Inner {
    /// Waiters per channel.
    waiters: HashMap<String, (usize, Arc<Notify>)>,
    /// Channels the current connection is subscribed to.
    subscribed: HashSet<String>,
    /// The current pub/sub connection: generation, sink, reader task.
    conn: Option<(u64, PubSubSink, AbortHandle)>,
}

/// The pub/sub side of a store.
pub(crate) struct Notifier {
    clients: Vec<Client>,
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
            .field("subscribed", &i.subscribed.len())
            .field("connected", &i.conn.is_some())
            .finish()
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        if let Some((_, _, task)) = self.lock().conn.take() {
            task.abort();
        }
    }
}

/// A registered waiter on a channel; unregisters on drop (cancel safe).
pub(crate) struct Registration {
    notifier: Arc<Notifier>,
    channel: String,
    notify: Arc<Notify>,
}

impl Registration {
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let last = {
            let mut i = self.notifier.lock();
            match i.waiters.get_mut(&self.channel) {
                Some((n, _)) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    i.waiters.remove(&self.channel);
                    true
                }
                None => false,
            }
        };
        if last && let Ok(rt) = tokio::runtime::Handle::try_current() {
            let notifier = self.notifier.clone();
            let channel = std::mem::take(&mut self.channel);
            rt.spawn(async move {
                let _ = notifier.reconcile(&channel).await;
            });
        }
    }
}

impl Notifier {
    pub(crate) fn new(
        clients: Vec<Client>,
        connect_timeout: Duration,
        op_timeout: Duration,
        secret: Option<String>,
    ) -> Self {
        Self {
            clients,
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

    /// Registers interest in `channel`. Create the `Notified` future from the returned
    /// registration *before* calling [`subscribe`](Self::subscribe), so that nothing
    /// published after the subscription is missed.
    pub(crate) fn register(self: &Arc<Self>, channel: &str) -> Registration {
        let notify = {
            let mut i = self.lock();
            let e = i
                .waiters
                .entry(channel.to_owned())
                .or_insert_with(|| (0, Arc::new(Notify::new())));
            e.0 += 1;
            e.1.clone()
        };
        Registration {
            notifier: self.clone(),
            channel: channel.to_owned(),
            notify,
        }
    }

    /// Makes sure the pub/sub connection is subscribed to the registration's channel.
    pub(crate) async fn subscribe(self: &Arc<Self>, reg: &Registration) -> Result<(), StoreError> {
        self.reconcile(&reg.channel).await
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
                i.waiters.get(channel).is_some_and(|(n, _)| *n > 0),
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
        let in_flight = DisconnectOnDrop {
            notifier: self,
            generation: Some(generation),
        };
        let res = if want {
            tokio::time::timeout(self.op_timeout, sink.subscribe(channel)).await
        } else {
            tokio::time::timeout(self.op_timeout, sink.unsubscribe(channel)).await
        };
        let mut in_flight = in_flight;
        in_flight.generation = None;
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
    async fn connection(self: &Arc<Self>) -> Result<(u64, PubSubSink), StoreError> {
        if let Some((g, sink, _)) = &self.lock().conn {
            return Ok((*g, sink.clone()));
        }
        if self.clients.is_empty() {
            return Err(self.unavailable("no node to subscribe on"));
        }
        let start = self.next_client.fetch_add(1, Ordering::Relaxed);
        let mut last_err = None;
        for n in 0..self.clients.len() {
            let client = &self.clients[(start + n) % self.clients.len()];
            match tokio::time::timeout(self.connect_timeout, client.get_async_pubsub()).await {
                Ok(Ok(pubsub)) => {
                    let (sink, stream) = pubsub.split();
                    let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
                    let weak = Arc::downgrade(self);
                    let task = tokio::spawn(read_messages(weak, generation, stream));
                    let mut i = self.lock();
                    i.subscribed.clear();
                    i.conn = Some((generation, sink.clone(), task.abort_handle()));
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

    /// Drops the pub/sub connection of `generation` and wakes every waiter (they re-check).
    fn disconnect(&self, generation: u64) {
        let mut i = self.lock();
        if i.conn.as_ref().is_some_and(|(g, _, _)| *g == generation) {
            if let Some((_, _, task)) = i.conn.take() {
                task.abort();
            }
            i.subscribed.clear();
            for (_, notify) in i.waiters.values() {
                notify.notify_waiters();
            }
            tracing::debug!(generation, "redis pub/sub connection dropped");
        }
    }

    fn deliver(&self, channel: &str) {
        if let Some((_, notify)) = self.lock().waiters.get(channel) {
            notify.notify_waiters();
        }
    }
}

struct DisconnectOnDrop<'a> {
    notifier: &'a Notifier,
    generation: Option<u64>,
}

impl Drop for DisconnectOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(g) = self.generation {
            self.notifier.disconnect(g);
        }
    }
}

async fn read_messages(
    notifier: Weak<Notifier>,
    generation: u64,
    mut stream: redis::aio::PubSubStream,
) {
    while let Some(msg) = stream.next().await {
        let Some(n) = notifier.upgrade() else { return };
        n.deliver(msg.get_channel_name());
    }
    if let Some(n) = notifier.upgrade() {
        n.disconnect(generation);
    }
}
