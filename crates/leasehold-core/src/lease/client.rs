//! The client: acquires leases on one store and renews them with one scheduler.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use tokio::time::Instant;

use crate::clock::{At, Clock, LeaseClock};
use crate::config::LeaseConfig;
use crate::error::{Error, StoreError, StoreErrorKind};
use crate::key::{IntoKey, Key};
use crate::lease::Lease;
use crate::lease::live::{Live, LiveGuard};
use crate::lease::observer::LeaseObserver;
use crate::lease::scheduler::{self, SchedulerHandle};
use crate::lease::shared::{Grant, LeaseShared};
use crate::lease::step::{AcquireStep, OneKey, StepCall};
use crate::metrics as m;
use crate::store::{AcquireAnyOutcome, Capabilities, HandedGrant, Store, WaitOutcome};
use crate::token::OwnerToken;

/// Acquires leases on one [`Store`] and renews them with one background scheduler.
///
/// Cheap to clone (reference counted); clones share the scheduler. The scheduler task is
/// spawned on the tokio runtime of the first acquisition and ends when the client and
/// all its leases are gone.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use leasehold_core::{LeaseClient, LeaseConfig, memory::MemoryStore};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), leasehold_core::Error> {
/// let client = LeaseClient::new(Arc::new(MemoryStore::new()), LeaseConfig::new(Duration::from_secs(10))?);
/// let lease = client.acquire("job:nightly-invoices", Duration::from_secs(30)).await?;
/// let fence = lease.fence(); // send it with every protected write
/// let result = lease.run(async { /* the work */ 42 }).await?; // cancelled if the lease is lost
/// assert!(lease.release().await?);
/// # let _ = (fence, result); Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeaseClient {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    config: LeaseConfig,
    capabilities: Capabilities,
    clock: LeaseClock,
    observer: Option<Arc<dyn LeaseObserver>>,
    sched: OnceLock<SchedulerHandle>,
    rng: Mutex<Box<dyn RngCore + Send>>,
    /// Lease handles alive (not yet released or dropped).
    live: Arc<Live>,
    /// Set by [`LeaseClient::shutdown`]: no new leases.
    closing: AtomicBool,
}

/// What [`LeaseClient::shutdown`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Lease handles alive when the shutdown began.
    pub held: usize,
    /// Lease handles still alive when the deadline passed: their work did not stop in
    /// time. They are not released (their code may still be running); renewal has
    /// stopped, so the store expires them after their TTL, and dropping them later still
    /// queues a release.
    pub still_held: usize,
    /// Whether every release was answered (or timed out) before the deadline.
    pub releases_done: bool,
}

/// Builder of a [`LeaseClient`], for the optional parts: the random source of retry jitter
/// and the clock leases are timed on.
pub struct LeaseClientBuilder {
    store: Arc<dyn Store>,
    config: LeaseConfig,
    rng: Option<Box<dyn RngCore + Send>>,
    clock: Option<Arc<dyn Clock>>,
    observer: Option<Arc<dyn LeaseObserver>>,
}

impl fmt::Debug for LeaseClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseClientBuilder")
            .field("store", &self.store)
            .field("config", &self.config)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl LeaseClientBuilder {
    /// Retry jitter from `rng` (for deterministic tests). Default: seeded from the OS.
    pub fn rng(mut self, rng: impl RngCore + Send + 'static) -> Self {
        self.rng = Some(Box::new(rng));
        self
    }

    /// Time leases on `clock` (for tests that model a host suspend with a
    /// [`ManualClock`](crate::clock::ManualClock)). Default:
    /// [`SystemClock`](crate::clock::SystemClock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Report every renewal to `observer` (for histories and audits).
    pub fn observer(mut self, observer: Arc<dyn LeaseObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The client.
    pub fn build(self) -> LeaseClient {
        let capabilities = self.store.capabilities();
        let rng = self.rng.unwrap_or_else(|| Box::new(StdRng::from_os_rng()));
        let clock: LeaseClock = self.clock.map(LeaseClock::new).unwrap_or_default();
        let ended =
            (self.store.ended_grants()).map(|e| e.subscribe(clock.clone(), self.config.ttl()));
        LeaseClient {
            inner: Arc::new(Inner {
                store: self.store,
                config: self.config,
                capabilities,
                clock,
                observer: self.observer,
                sched: OnceLock::new(),
                rng: Mutex::new(rng),
                live: Arc::new(Live {
                    ended,
                    ..Live::default()
                }),
                closing: AtomicBool::new(false),
            }),
        }
    }
}

impl fmt::Debug for LeaseClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseClient")
            .field("store", &self.inner.store)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl LeaseClient {
    /// A client of `store` with `config`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{LeaseClient, LeaseConfig, memory::MemoryStore};
    ///
    /// # fn main() -> Result<(), leasehold_core::ConfigError> {
    /// let store = Arc::new(MemoryStore::new());
    /// let client = LeaseClient::new(store, LeaseConfig::new(Duration::from_secs(10))?);
    /// assert_eq!(client.store().backend(), "memory");
    /// // Clones share the store and the renewal scheduler.
    /// let for_another_task = client.clone();
    /// # let _ = for_another_task; Ok(()) }
    /// ```
    pub fn new(store: Arc<dyn Store>, config: LeaseConfig) -> Self {
        Self::builder(store, config).build()
    }

    /// A builder, for a client with an injected random source, clock or observer.
    ///
    /// # Examples
    ///
    /// A client with deterministic retry jitter and a manual clock, for a test:
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{LeaseClient, LeaseConfig, clock::ManualClock, memory::MemoryStore};
    /// use rand::{SeedableRng, rngs::StdRng};
    ///
    /// # fn main() -> Result<(), leasehold_core::ConfigError> {
    /// let clock = Arc::new(ManualClock::new());
    /// let client = LeaseClient::builder(Arc::new(MemoryStore::new()), LeaseConfig::new(Duration::from_secs(10))?)
    ///     .rng(StdRng::seed_from_u64(7))
    ///     .clock(clock.clone())
    ///     .build();
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn builder(store: Arc<dyn Store>, config: LeaseConfig) -> LeaseClientBuilder {
        LeaseClientBuilder {
            store,
            config,
            rng: None,
            clock: None,
            observer: None,
        }
    }

    /// A client whose retry jitter comes from `rng` (for deterministic tests).
    pub fn with_rng(
        store: Arc<dyn Store>,
        config: LeaseConfig,
        rng: impl RngCore + Send + 'static,
    ) -> Self {
        Self::builder(store, config).rng(rng).build()
    }

    /// Shuts the client down gracefully, within `timeout` (for a process that received
    /// SIGTERM):
    ///
    /// 1. no new leases are granted ([`Error::ShuttingDown`]);
    /// 2. every renewal stops, and every held lease's lost signal fires with
    ///    [`LostReason::Shutdown`](crate::LostReason::Shutdown) (not counted as a lost
    ///    lease in metrics), so the work under it stops — [`Lease::run`] cancels its
    ///    future, code selecting on [`Lease::lost`] wakes up;
    /// 3. it waits until every lease handle has been released or dropped (the work has
    ///    stopped), and until those releases have been answered;
    /// 4. it returns when all that is done, or when `timeout` has passed.
    ///
    /// Releasing stays the holder's act: a lease whose handle is still alive at the
    /// deadline is **not** released behind its code's back; it expires in the store after
    /// its TTL (see [`ShutdownReport::still_held`]). Drop or release the lease as soon
    /// as the work under it has stopped and rolled back, and the next holder gets it at
    /// once.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future stops only the waiting; renewal stays stopped and
    /// the client keeps refusing new leases.
    ///
    /// # Examples
    ///
    /// On SIGTERM, stop the work under every lease and let go within 10 s:
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{Error, LeaseClient, LeaseConfig, LostReason, memory::MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Error> {
    /// let client = LeaseClient::new(Arc::new(MemoryStore::new()), LeaseConfig::new(Duration::from_secs(10))?);
    /// let lease = client.try_acquire("job:reindex").await?;
    /// let worker = tokio::spawn(async move {
    ///     // The work ends when the lease is lost, shutdown included; then let go.
    ///     let result = lease.run(std::future::pending::<()>()).await;
    ///     drop(lease);
    ///     result
    /// });
    /// // In a real program: tokio::signal::ctrl_c().await, or a SIGTERM handler.
    /// let report = client.shutdown(Duration::from_secs(10)).await;
    /// assert_eq!((report.held, report.still_held), (1, 0));
    /// assert!(matches!(worker.await.unwrap(), Err(Error::LeaseLost(LostReason::Shutdown))));
    /// // No new leases after a shutdown.
    /// assert!(matches!(client.try_acquire("job:other").await, Err(Error::ShuttingDown)));
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(&self, timeout: Duration) -> ShutdownReport {
        let deadline = crate::clock::saturating_add(Instant::now(), timeout);
        self.inner.closing.store(true, Ordering::Release);
        let live = &self.inner.live;
        let held = live.count.load(Ordering::Acquire);
        let Some(sched) = self.inner.sched.get() else {
            // Never acquired anything: nothing to stop.
            return ShutdownReport {
                held,
                still_held: 0,
                releases_done: true,
            };
        };
        let _ = tokio::time::timeout_at(deadline, sched.shutdown()).await;
        let stopped = tokio::time::timeout_at(deadline, async {
            loop {
                let zero = live.zero.notified();
                tokio::pin!(zero);
                zero.as_mut().enable();
                if live.count.load(Ordering::Acquire) == 0 {
                    return;
                }
                zero.await;
            }
        })
        .await;
        let still_held = if stopped.is_ok() {
            0
        } else {
            live.count.load(Ordering::Acquire)
        };
        // Drops queued their releases before their count went down: a flush after them
        // waits for those releases to be answered.
        let releases_done = tokio::time::timeout_at(deadline, sched.flush())
            .await
            .is_ok();
        tracing::info!(held, still_held, releases_done, "lease client shut down");
        ShutdownReport {
            held,
            still_held,
            releases_done,
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The configuration.
    pub fn config(&self) -> &LeaseConfig {
        &self.inner.config
    }

    fn scheduler(&self) -> &SchedulerHandle {
        self.inner.sched.get_or_init(|| {
            SchedulerHandle::spawn(
                self.inner.store.clone(),
                self.inner.config.clone(),
                self.inner.clock.clone(),
                self.inner.observer.clone(),
            )
        })
    }

    #[cfg(test)]
    pub(crate) fn scheduler_visits(&self) -> u64 {
        self.inner
            .sched
            .get()
            .map_or(0, |s| s.visits.load(Ordering::Relaxed))
    }

    /// Tries once: the lease, or [`Error::Contended`] if another owner holds it.
    ///
    /// An ambiguous reply (timeout or reset after the request was sent) is retried with
    /// the same owner token up to `ambiguous_retries` times, so a grant whose reply was
    /// lost is picked up with its fence instead of being left orphaned.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped while a request is in flight, a best-effort
    /// release of that owner token is queued, and at worst the grant expires after its TTL.
    ///
    /// # Errors
    /// [`Error::InvalidKey`], [`Error::Contended`], [`Error::ShuttingDown`], or
    /// [`Error::Store`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{Error, LeaseClient, LeaseConfig, memory::MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Error> {
    /// let store = Arc::new(MemoryStore::new());
    /// let config = LeaseConfig::new(Duration::from_secs(10))?;
    /// let (a, b) = (LeaseClient::new(store.clone(), config.clone()), LeaseClient::new(store, config));
    ///
    /// let lease = a.try_acquire("job:compaction").await?;
    /// match b.try_acquire("job:compaction").await {
    ///     Err(Error::Contended { remaining, .. }) => {
    ///         // Someone else is on it; skip this round.
    ///         assert!(remaining.is_some_and(|r| r <= Duration::from_secs(10)));
    ///     }
    ///     other => panic!("expected Contended, got {other:?}"),
    /// }
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(&self, key: impl IntoKey) -> Result<Lease, Error> {
        self.acquire_inner(key.into_key()?, None).await
    }

    /// Acquires, waiting up to `wait` while another owner holds the lease. Any `wait` is
    /// accepted: `Duration::MAX` waits as long as it takes.
    ///
    /// Between attempts it sleeps with full-jitter exponential backoff, never longer than
    /// the holder's remaining TTL when the store reports it, and waits on the store's
    /// release notification instead where the store offers one. Retryable store errors
    /// are retried until the wait ends.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`try_acquire`](Self::try_acquire).
    ///
    /// # Errors
    /// [`Error::InvalidKey`], [`Error::WaitTimeout`] (still held when the wait ended),
    /// [`Error::ShuttingDown`], or [`Error::Store`] (a non-retryable error, or the last
    /// error when the wait ended).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{Error, LeaseClient, LeaseConfig, memory::MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Error> {
    /// let client = LeaseClient::new(Arc::new(MemoryStore::new()), LeaseConfig::new(Duration::from_secs(10))?);
    /// // Waits up to 30 s while another owner holds it.
    /// let first = client.acquire("job:nightly-invoices", Duration::from_secs(30)).await?;
    ///
    /// // A second holder waits; here it gives up after 50 ms.
    /// match client.acquire("job:nightly-invoices", Duration::from_millis(50)).await {
    ///     Err(Error::WaitTimeout { waited, .. }) => assert!(waited >= Duration::from_millis(50)),
    ///     other => panic!("expected WaitTimeout, got {other:?}"),
    /// }
    ///
    /// // Once the first one is released, the waiter gets the lease, with a higher fence.
    /// let fence = first.fence();
    /// first.release().await?;
    /// let second = client.acquire("job:nightly-invoices", Duration::from_secs(30)).await?;
    /// assert!(second.fence() > fence);
    /// # Ok(()) }
    /// ```
    pub async fn acquire(&self, key: impl IntoKey, wait: Duration) -> Result<Lease, Error> {
        self.acquire_inner(key.into_key()?, Some(wait)).await
    }

    async fn acquire_inner(&self, key: Key, wait: Option<Duration>) -> Result<Lease, Error> {
        let step = OneKey(&key);
        self.acquire_with(&step, wait).await.map(|(lease, _)| lease)
    }

    /// Takes a lease of one of `step`'s keys, attempt by attempt, with the guarantees of
    /// [`acquire`](Self::acquire): the building block of the recipes (a semaphore's
    /// permit is a step over its slots), as etcd's `concurrency` builds on its client.
    /// Each attempt is one [`AcquireStep::attempt`] with this acquire's owner token;
    /// ambiguous replies are retried with the same owner, and the owner is released on
    /// every key of the step when the call may have been granted one but hands out no
    /// lease. While every key is held it waits up to `wait` (`None`: answers
    /// [`Error::Contended`] at once) with jittered backoff bounded by the shortest
    /// remaining TTL reported. Returns the lease and the position of its key in
    /// [`AcquireStep::keys`].
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire): a dropped call queues the release of its
    /// owner on every key of the step.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), and any error of the step's own that is not an
    /// [`Error::Store`].
    pub async fn acquire_with(
        &self,
        step: &dyn AcquireStep,
        wait: Option<Duration>,
    ) -> Result<(Lease, usize), Error> {
        let started = Instant::now();
        let backend = self.inner.store.backend();
        let key = step.name();
        let span = tracing::debug_span!("leasehold.acquire", %key, backend);
        let res =
            tracing::Instrument::instrument(self.acquire_loop(step, started, wait), span).await;
        let took = started.elapsed();
        let result = match &res {
            Ok(_) => "acquired",
            Err(Error::Contended { .. }) => "contended",
            Err(Error::WaitTimeout { .. }) => "timeout",
            Err(_) => "error",
        };
        m::acquire(backend, key.resource_type(), result, took);
        match &res {
            Ok((lease, _)) => tracing::debug!(
                key = %lease.key(),
                owner = %lease.owner(),
                fence = lease.fence().get(),
                ttl_ms = lease.ttl().as_millis() as u64,
                result,
                duration_us = took.as_micros() as u64,
                "acquire"
            ),
            Err(e) => {
                tracing::debug!(%key, result, duration_us = took.as_micros() as u64, error = %e, "acquire")
            }
        }
        res
    }

    async fn acquire_loop(
        &self,
        step: &dyn AcquireStep,
        started: Instant,
        wait: Option<Duration>,
    ) -> Result<(Lease, usize), Error> {
        let cfg = &self.inner.config;
        let store = &self.inner.store;
        let clock = &self.inner.clock;
        let key = step.name();
        let deadline = wait.map(|w| crate::clock::saturating_add(started, w));
        let owner = OwnerToken::random();
        let mut orphan = OrphanGuard {
            client: self,
            keys: step.keys(),
            owner,
            maybe_granted: false,
        };
        let mut attempt: u32 = 0;
        let mut ambiguous: u32 = 0;
        // The host's suspended time as of before any request of this call was sent: a
        // send instant the store reports (a hand-off's) is put on the lease clock with
        // it, which can only place it earlier than it was.
        let suspended_floor = clock.suspended();
        let mut handed: Option<HandedGrant> = None;
        loop {
            if self.inner.closing.load(Ordering::Acquire) {
                return Err(Error::ShuttingDown);
            }
            let may_hold = std::mem::replace(&mut orphan.maybe_granted, true);
            let (sent_at, reply): (At, _) = match handed.take() {
                // The store handed the lease to this owner while it waited, and said so
                // (docs/design.md, "Hand-off without a confirming acquire"): validity
                // counts from the send of the last request it answered "still waiting"
                // before the grant. Too late to leave any validity, it is confirmed by
                // an acquire as this owner instead (below).
                Some(g) => (
                    LeaseClock::at(g.waiting_sent_at, suspended_floor),
                    Ok(AcquireAnyOutcome::Acquired {
                        index: 0,
                        fence: g.fence,
                        ttl: g.ttl,
                    }),
                ),
                None => {
                    let sent_at = clock.now();
                    let call = StepCall {
                        store,
                        owner,
                        ttl: cfg.ttl(),
                        limit: cfg.op_timeout(),
                        may_hold,
                        waits: deadline.is_some(),
                    };
                    (sent_at, step.attempt(&call).await)
                }
            };
            let err = match reply {
                Ok(AcquireAnyOutcome::Acquired { index, fence, ttl }) => {
                    // The holder never counts on more than it asked; on less, every
                    // schedule of the lease follows the TTL granted, and a grant too
                    // short to be renewed in time is refused (and released by the
                    // guard: `maybe_granted` is set while an attempt is out).
                    let ttl = ttl.min(cfg.ttl());
                    if let Err(e) = cfg.check_grant(ttl) {
                        tracing::warn!(%key, %owner, error = %e, "grant refused: too short to renew in time; releasing it");
                        return Err(e.into());
                    }
                    let valid_until = sent_at.add(cfg.validity(ttl));
                    match step.keys().get(index) {
                        Some(granted) if clock.now() < valid_until => {
                            orphan.maybe_granted = false;
                            let grant = Grant {
                                key: granted.clone(),
                                owner,
                                fence,
                                ttl,
                                sent_at,
                                valid_until,
                            };
                            let shared =
                                Arc::new(LeaseShared::new(grant, store.backend(), clock.clone()));
                            if let Some(ended) = &self.inner.live.ended {
                                ended.track(&shared);
                            }
                            let sched = self.scheduler();
                            scheduler::track(sched, &shared, cfg);
                            let lease = Lease::new(
                                shared,
                                sched.clone(),
                                store.clone(),
                                cfg.op_timeout(),
                                LiveGuard::new(&self.inner.live),
                            );
                            return Ok((lease, index));
                        }
                        // The reply came too late to leave any validity: treat it as lost.
                        Some(_) => {
                            StoreError::timeout(store.backend(), "acquire", cfg.op_timeout())
                        }
                        None => StoreError::new(
                            StoreErrorKind::Corrupt,
                            store.backend(),
                            format!(
                                "acquire: the store granted key {index} of {}",
                                step.keys().len()
                            ),
                        ),
                    }
                }
                Ok(AcquireAnyOutcome::Held { remaining }) => {
                    // A grant to this owner from an earlier ambiguous attempt would have
                    // been returned as `Acquired`: nothing of ours is held.
                    orphan.maybe_granted = false;
                    m::contention(store.backend(), key.resource_type());
                    let Some(deadline) = deadline else {
                        return Err(Error::Contended {
                            key: key.clone(),
                            remaining,
                        });
                    };
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(Error::WaitTimeout {
                            key: key.clone(),
                            waited: now - started,
                        });
                    }
                    // A store that hands off may grant this owner the lease while it
                    // waits: if this call is dropped meanwhile, the guard releases it.
                    orphan.maybe_granted = self.inner.capabilities.hands_off;
                    handed = self.pause(step, &owner, attempt, remaining, deadline).await;
                    attempt = attempt.saturating_add(1);
                    continue;
                }
                Err(Error::Store(e)) => e,
                Err(e) => {
                    // A refusal of the step's own: this attempt took nothing; one that
                    // may have been granted earlier is released by the guard.
                    orphan.maybe_granted = may_hold;
                    return Err(e);
                }
            };
            // A failed attempt. Ambiguous replies are retried at once with the same owner.
            if err.is_ambiguous() && ambiguous < cfg.ambiguous_retries() {
                ambiguous += 1;
                tracing::debug!(%key, %owner, error = %err, "ambiguous acquire reply; retrying with the same owner");
                continue;
            }
            let retry_until = deadline.filter(|d| err.is_retryable() && Instant::now() < *d);
            let Some(deadline) = retry_until else {
                return Err(err.into());
            };
            tracing::debug!(%key, error = %err, "acquire failed; retrying");
            handed = self.pause(step, &owner, attempt, None, deadline).await;
            attempt = attempt.saturating_add(1);
        }
    }

    /// Sleeps before the next attempt: a full-jitter backoff delay bounded by the holder's
    /// remaining TTL and the caller's deadline, or until the store notifies a release.
    /// Returns the lease when the store handed it to `owner` meanwhile.
    async fn pause(
        &self,
        step: &dyn AcquireStep,
        owner: &OwnerToken,
        attempt: u32,
        remaining: Option<Duration>,
        deadline: Instant,
    ) -> Option<HandedGrant> {
        let until_deadline = deadline.saturating_duration_since(Instant::now());
        let caps = self.inner.capabilities;
        // A session-bound store's lease ends only through the server (a release, the
        // holder's session ending), which wakes its waiters: with the holder's remaining
        // TTL unknown, wait on it until the deadline.
        let holder_left = if caps.session_bound {
            remaining.or(Some(until_deadline))
        } else {
            remaining
        };
        // Only a single key is waited on: the notification is per key.
        let notified = match (step.keys(), self.inner.store.waiter()) {
            ([key], Some(waiter)) if step.waits_for_release() => {
                holder_left.map(|h| (key, h, waiter))
            }
            _ => None,
        };
        if let Some((key, holder_left, waiter)) = notified {
            let bound = holder_left
                .min(until_deadline)
                .max(Duration::from_millis(1));
            let wait = waiter.wait_turn(key, owner, self.inner.config.ttl(), bound);
            let limit = bound.saturating_add(self.inner.config.op_timeout());
            match tokio::time::timeout(limit, wait).await {
                Ok(Ok(WaitOutcome::Granted(g))) => return Some(g),
                Ok(Ok(WaitOutcome::Retry)) => return None,
                Ok(Err(_)) | Err(_) => {}
            }
        }
        let mut delay = self.backoff_delay(attempt);
        if let Some(r) = remaining {
            delay = delay.min(r);
        }
        tokio::time::sleep(delay.min(until_deadline)).await;
        None
    }
}

/// The client's retry policy and random source, for recipes that wait or spread callers on
/// their own (a semaphore retries its permit-count check and starts at a random slot), so
/// that they follow the configured backoff and a test's injected generator.
impl LeaseClient {
    /// A full-jitter backoff delay for retry `attempt` (from 0) of the configured
    /// [`Backoff`](crate::Backoff), drawn from the client's random source.
    pub fn backoff_delay(&self, attempt: u32) -> Duration {
        let mut rng = self.inner.rng.lock().unwrap_or_else(|e| e.into_inner());
        self.inner.config.backoff().delay(attempt, &mut **rng)
    }

    /// A random number below `n` (0 when `n` is 0), from the client's random source.
    pub fn random_below(&self, n: u32) -> u32 {
        let mut rng = self.inner.rng.lock().unwrap_or_else(|e| e.into_inner());
        rand::Rng::random_range(&mut **rng, 0..n.max(1))
    }
}

/// Queues a release of the owner token, on every key of the call, when an acquire that
/// may have been granted ends without handing out a lease (cancelled, or failed after an
/// ambiguous reply).
struct OrphanGuard<'a> {
    client: &'a LeaseClient,
    keys: &'a [Key],
    owner: OwnerToken,
    maybe_granted: bool,
}

impl Drop for OrphanGuard<'_> {
    fn drop(&mut self) {
        if self.maybe_granted && tokio::runtime::Handle::try_current().is_ok() {
            let sched = self.client.scheduler();
            for key in self.keys {
                sched.release_orphan(key.clone(), self.owner);
            }
        }
    }
}
