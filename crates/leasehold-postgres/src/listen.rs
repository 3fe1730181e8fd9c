//! Release notifications of the lease-table store: one `LISTEN` connection per store.
//!
//! The release and break statements of the lease-table store `NOTIFY` the table's channel
//! with the key's wait-queue lock id as payload, but only when a waiter holds that lock
//! (the head of the key's queue, see [`crate::wait`]): an uncontended release notifies
//! nobody and takes no notification lock. A store that has waiters keeps one dedicated
//! connection listening on the channel and wakes the local waiters of the key named in
//! each notification.
//!
//! Notifications are a hint: after a lost connection every waiter is woken to re-check,
//! and a waiter never waits past the holder's remaining TTL without re-checking.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::{Notify, watch};
use tokio::task::AbortHandle;

/// How long to wait before reconnecting a failed listener.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

struct Shared {
    connect: PgConnectOptions,
    channel: String,
    /// Local waiters per wait-queue lock id (the notification's payload).
    waiters: Mutex<HashMap<u64, (usize, Arc<Notify>)>>,
    /// `Some(generation)` while the channel is listened on.
    ready: watch::Sender<Option<u64>>,
    task: Mutex<Option<AbortHandle>>,
}

impl Shared {
    fn waiters(&self) -> MutexGuard<'_, HashMap<u64, (usize, Arc<Notify>)>> {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deliver(&self, payload: &str) {
        let Ok(id) = u64::from_str_radix(payload, 16) else {
            return;
        };
        if let Some((_, n)) = self.waiters().get(&id) {
            n.notify_waiters();
        }
    }

    fn wake_all(&self) {
        for (_, n) in self.waiters().values() {
            n.notify_waiters();
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

/// The listening side of a lease-table store. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Listener {
    shared: Arc<Shared>,
}

/// Interest in one key's notifications; unregisters on drop.
pub(crate) struct Registration {
    shared: Arc<Shared>,
    id: u64,
    notify: Arc<Notify>,
}

impl Registration {
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut w = self.shared.waiters();
        if let Some((n, _)) = w.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                w.remove(&self.id);
            }
        }
    }
}

impl Listener {
    pub(crate) fn new(connect: PgConnectOptions, channel: String) -> Self {
        Self {
            shared: Arc::new(Shared {
                connect,
                channel,
                waiters: Mutex::new(HashMap::new()),
                ready: watch::Sender::new(None),
                task: Mutex::new(None),
            }),
        }
    }

    /// Registers interest in the key whose wait-queue lock id is `id`. Create the
    /// `Notified` future from the registration *before* checking the lease, then call
    /// [`listening`](Self::listening), so that no notification after the check is missed.
    pub(crate) fn register(&self, id: u64) -> Registration {
        let notify = {
            let mut w = self.shared.waiters();
            let e = w.entry(id).or_insert_with(|| (0, Arc::new(Notify::new())));
            e.0 += 1;
            e.1.clone()
        };
        Registration {
            shared: self.shared.clone(),
            id,
            notify,
        }
    }

    /// Wakes this process's waiters on `id` at once: a release made by this store, whose
    /// notification is on its way through the server too.
    pub(crate) fn wake_local(&self, id: u64) {
        if let Some((_, n)) = self.shared.waiters().get(&id) {
            n.notify_waiters();
        }
    }

    /// Starts the listening connection if needed and waits up to `within` until the channel
    /// is listened on. `false`: not listening (the server is unreachable); the caller must
    /// not rely on notifications.
    pub(crate) async fn listening(&self, within: Duration) -> bool {
        self.start();
        let mut rx = self.shared.ready.subscribe();
        matches!(
            tokio::time::timeout(within, rx.wait_for(Option::is_some)).await,
            Ok(Ok(_))
        )
    }

    fn start(&self) {
        let mut task = self.shared.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let weak = Arc::downgrade(&self.shared);
        let handle = tokio::spawn(run(
            weak,
            self.shared.connect.clone(),
            self.shared.channel.clone(),
        ));
        *task = Some(handle.abort_handle());
    }
}

/// A pool of the one session a `PgListener` listens on, opened within `open`, never
/// closed for being idle or old.
pub(crate) fn listener_pool(options: PgConnectOptions, open: Duration) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(open)
        .connect_lazy_with(options)
}

async fn run(weak: Weak<Shared>, connect: PgConnectOptions, channel: String) {
    let pool = listener_pool(connect, Duration::from_secs(10));
    let mut generation = 0u64;
    loop {
        let listener = async {
            let mut l = PgListener::connect_with(&pool).await?;
            l.ignore_pool_close_event(true);
            l.listen(&channel).await?;
            Ok::<_, sqlx::Error>(l)
        }
        .await;
        let Some(shared) = weak.upgrade() else { return };
        let mut listener = match listener {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %crate::error::map(crate::BACKEND_TABLE, "listening for releases", e), "release listener not connected");
                shared.ready.send_replace(None);
                shared.wake_all();
                drop(shared);
                tokio::time::sleep(RECONNECT_PAUSE).await;
                continue;
            }
        };
        generation += 1;
        shared.ready.send_replace(Some(generation));
        // Anything sent before the channel was listened on is lost: re-check.
        shared.wake_all();
        drop(shared);
        loop {
            let got = listener.try_recv().await;
            let Some(shared) = weak.upgrade() else { return };
            match got {
                Ok(Some(n)) => shared.deliver(n.payload()),
                Ok(None) => {
                    // The connection was lost and re-established (listening again):
                    // notifications in between are lost.
                    generation += 1;
                    shared.ready.send_replace(Some(generation));
                    shared.wake_all();
                }
                Err(e) => {
                    tracing::debug!(error = %crate::error::map(crate::BACKEND_TABLE, "listening for releases", e), "release listener lost");
                    shared.ready.send_replace(None);
                    shared.wake_all();
                    break;
                }
            }
        }
        drop(listener);
        tokio::time::sleep(RECONNECT_PAUSE).await;
    }
}
