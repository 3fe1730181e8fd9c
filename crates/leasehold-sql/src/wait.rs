//! Waiting for a lease without polling, in a fair order: a queue kept in the server, the
//! design the PostgreSQL and MariaDB/MySQL lease stores share. A backend supplies its
//! [`Dialect`] (its SQL and sessions) and its [`Policy`]; the entries, turns, timeouts and
//! hand-off are here.
//!
//! A waiter ([`Queue::wait`]) joins the key's queue on a session of its own: the session
//! asks the server for a lock derived from the key ([`Dialect::join`]), which the server
//! grants one at a time, in the order asked. Holding it makes the waiter the *head*; once
//! the lease is free ([`Dialect::until_free`]) the head is *ready* and the wait returns.
//! The owner then acquires with its own request, past every newcomer (the backend's
//! acquire refuses a grant while another session holds the queue lock), either on the
//! head's session, taken from the queue ([`Queue::claim`]), or naming it ([`Queue::turn`];
//! granted, the queue passes the turn on with [`Dialect::pass`]). Found held, the head
//! goes back to waiting, still first.
//!
//! Each waiting owner has its own entry and session, so the order is per waiter across
//! every process. The turn is kept for an owner whose acquire of the key answered `Held`
//! on this store ([`Queue::note_held`]), whichever task makes the calls; a wait by anyone
//! else (a *bystander*, who may acquire as someone else) passes the turn on as soon as it
//! comes, then returns. An entry whose owner is neither waiting nor acquiring for
//! [`GRACE`] leaves the queue, its session ended (which lets go of a lock it holds). At
//! most [`Policy::max_sessions`] owners wait at once; one more is refused with
//! [`StoreErrorKind::Busy`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use leasehold_core::{Key, OwnerToken, StoreError, StoreErrorKind};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::presence::{Active, Presence};

/// How long an entry is kept while its owner is neither waiting nor acquiring.
pub const GRACE: Duration = Duration::from_millis(500);

/// Owners whose acquire answered `Held` are forgotten at their grant; once this many are
/// noted, also those noted longer than [`CONTENDER_FRESH`] ago (owners that stopped trying).
const CONTENDERS_KEPT: usize = 4096;
const CONTENDER_FRESH: Duration = Duration::from_secs(5);

/// What a backend supplies: its SQL, its sessions and how it ends them.
///
/// Each hook's future is raced with the entry's abandonment (the owner gone for
/// [`GRACE`]): dropped then, and the session it was using is given to
/// [`abandon`](Self::abandon).
pub trait Dialect: Send + Sync + 'static {
    /// A session dedicated to one waiter (a connection, and what the backend knows of it).
    type Session: Send + 'static;

    /// A session kept from an earlier waiter, if any.
    fn take_idle(&self) -> Option<Self::Session>;

    /// A new session, set up for waiting.
    fn connect(&self) -> impl Future<Output = Result<Self::Session, StoreError>> + Send;

    /// Joins `key`'s queue on `session`; resolves once the session holds the queue lock.
    fn join(&self, session: &mut Self::Session, key: &Key) -> impl Future<Output = Joined> + Send;

    /// As head of `key`'s queue: resolves with `true` once the lease is free for `owner`
    /// (or the owner's own acquire should look, when `claims`), `false` when the session
    /// was lost.
    fn until_free(
        &self,
        session: &mut Self::Session,
        key: &Key,
        owner: &OwnerToken,
        claims: bool,
    ) -> impl Future<Output = bool> + Send;

    /// Passes the turn on (lets `key`'s queue lock go) and keeps the session for the next
    /// waiter if it is still sound.
    fn pass(&self, session: Self::Session, key: &Key) -> impl Future<Output = ()> + Send;

    /// Leaves the queue with a session whose statement may still be running (queued, or
    /// waiting as head): its request leaves the queue, or the lock it holds is let go.
    fn abandon(&self, session: Self::Session);

    /// Leaves the queue with an idle session that holds the turn (unclaimed, or a claim
    /// dropped without an outcome): the turn passes on when the session ends.
    fn leave(&self, session: Self::Session);

    /// What a [`Turn`] tells its owner's acquire about the ready head's session (for a
    /// backend whose acquire names the head's session; not 0 then). 0 by default.
    fn ticket(&self, session: &Self::Session) -> u64 {
        let _ = session;
        0
    }
}

/// How joining a queue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// The session holds the queue lock: the waiter is the head.
    Head,
    /// The session, kept from an earlier waiter, had ended: join again on a new one.
    Stale,
    /// The session was lost: the entry leaves the queue (the wait returns).
    Lost,
}

/// The choices a backend makes where its queue behaves its own way.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The backend's name, in errors.
    pub backend: &'static str,
    /// How many owners may wait at once, each on a session of its own.
    pub max_sessions: usize,
    /// The message of the [`StoreErrorKind::Busy`] error one more is refused with.
    pub busy: String,
    /// A bystander's entry is kept like a contender's (`true`: found by the owner's next
    /// wait and acquire, and kept for [`GRACE`] after its wait ends) or is its own (`false`:
    /// found by nobody, it leaves the queue as soon as its wait ends).
    pub bystanders_keep_place: bool,
    /// For how long after its acquire answered `Held` an owner's wait claims the turn;
    /// `None`: until the owner's acquire is granted (or it is pruned among many).
    pub contender_for: Option<Duration>,
    /// How long a wait whose timeout overflows the clock lasts; `None`: until its turn.
    pub overflow_wait: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting in the server's queue, or, as head, for the lease to be free.
    Queued,
    /// Holds the turn (on the session with this ticket) while the lease is free.
    Ready(u64),
    /// Granted to an acquire naming the head's session: the turn is being passed on.
    Claimed,
    Done(End),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The owner's acquire took the head's session.
    Claimed,
    /// Passed the turn on (a bystander's turn, or after a grant naming the session).
    Passed,
    /// Left the queue: owner gone, session lost, or the turn went unclaimed.
    Left,
    /// No session could be had; `failure` says why.
    Failed,
}

struct Entry<S> {
    key: Key,
    owner: OwnerToken,
    /// The turn is kept for the owner (a contender); else a bystander's, passed on.
    claims: bool,
    /// How long the entry outlives its owner's last call.
    grace: Duration,
    state: watch::Sender<State>,
    /// The head's session while it is ready (taken by a claim).
    parked: Mutex<Option<S>>,
    presence: Arc<Presence>,
    failure: Mutex<Option<(StoreErrorKind, String)>>,
}

/// A lock of `m`, also after a panic in another holder (the data stays consistent: every
/// update is one assignment or map operation).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<S> Entry<S> {
    fn parked(&self) -> MutexGuard<'_, Option<S>> {
        lock(&self.parked)
    }

    fn state(&self) -> State {
        *self.state.borrow()
    }

    /// Resolves once no wait or acquire of the owner has been under way for its grace.
    async fn abandoned(&self) {
        self.presence.abandoned(self.grace).await;
    }

    /// No session could be had: `e` is what the wait answers.
    fn fail(&self, e: &StoreError) -> End {
        *lock(&self.failure) = Some((e.kind(), e.message().to_owned()));
        End::Failed
    }

    /// Moves to state `to` if the state is one `from` accepts.
    fn advance(&self, from: impl Fn(&State) -> bool, to: State) {
        self.state.send_if_modified(|s| {
            let go = from(s);
            if go {
                *s = to;
            }
            go
        });
    }
}

type Entries<S> = HashMap<(Key, OwnerToken), Arc<Entry<S>>>;

/// An entry and its caller's presence as a waiter.
type Waiting<S> = (Arc<Entry<S>>, Active);

struct Shared<D: Dialect> {
    dialect: D,
    policy: Policy,
    permits: Arc<Semaphore>,
    entries: Mutex<Entries<D::Session>>,
    /// Contenders: the owners whose acquire of a key answered `Held` (and has not been
    /// granted since), with when.
    contenders: Mutex<HashMap<(Key, OwnerToken), Instant>>,
}

/// A store's wait queues, one per key, kept in the server. Cheap to clone.
pub struct Queue<D: Dialect> {
    shared: Arc<Shared<D>>,
}

impl<D: Dialect> Clone for Queue<D> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<D: Dialect> std::fmt::Debug for Queue<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("waiting", &self.entries().len())
            .field("max_sessions", &self.shared.policy.max_sessions)
            .finish()
    }
}

/// A ready head's session, taken by its owner's acquire. Report the outcome with
/// [`granted`](Self::granted) or [`held`](Self::held); dropped otherwise, the entry ends
/// and the session is left ([`Dialect::leave`], which lets go of the lock it holds).
pub struct Claim<D: Dialect> {
    queue: Queue<D>,
    entry: Arc<Entry<D::Session>>,
    session: Option<D::Session>,
    _active: Active,
}

impl<D: Dialect> std::fmt::Debug for Claim<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim")
            .field("key", &self.entry.key)
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> Claim<D> {
    /// The head's session, to acquire on.
    pub fn conn(&mut self) -> &mut D::Session {
        self.session.as_mut().expect("claimed session")
    }

    /// The owner acquired: the session is the caller's now.
    pub fn granted(mut self) -> D::Session {
        let session = self.session.take().expect("claimed session");
        self.queue.finish(&self.entry, End::Claimed);
        session
    }

    /// Still held (the lease was taken meanwhile): the head goes back to waiting.
    pub fn held(mut self) {
        let session = self.session.take().expect("claimed session");
        *self.entry.parked() = Some(session);
        self.entry.state.send_replace(State::Queued);
    }
}

impl<D: Dialect> Drop for Claim<D> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.queue.shared.dialect.leave(session);
            self.queue.finish(&self.entry, End::Left);
        }
    }
}

/// An owner's acquire of a key: keeps its entry (if any) alive while under way and, when
/// the owner is the ready head, tells the acquire which session to name
/// ([`head`](Self::head)) and the queue the outcome ([`outcome`](Self::outcome)).
pub struct Turn<D: Dialect> {
    head: Option<(Arc<Entry<D::Session>>, u64)>,
    _active: Option<Active>,
}

impl<D: Dialect> std::fmt::Debug for Turn<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn")
            .field("head", &self.head())
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> Turn<D> {
    /// The [ticket](Dialect::ticket) of the owner's ready head; 0 if it is not one.
    pub fn head(&self) -> u64 {
        self.head.as_ref().map_or(0, |(_, t)| *t)
    }

    /// The acquire was granted (`true`: the queue passes the turn on) or found the lease
    /// held (the head goes back to waiting). Not told (dropped), the head stays ready.
    pub fn outcome(self, granted: bool) {
        if let Some((entry, ticket)) = &self.head {
            let next = if granted {
                State::Claimed
            } else {
                State::Queued
            };
            entry.advance(|s| *s == State::Ready(*ticket), next);
        }
    }
}

impl<D: Dialect> Queue<D> {
    /// A store's queues, waiting on `dialect`'s sessions as `policy` says.
    pub fn new(dialect: D, policy: Policy) -> Self {
        Self {
            shared: Arc::new(Shared {
                permits: Arc::new(Semaphore::new(policy.max_sessions)),
                dialect,
                policy,
                entries: Mutex::new(HashMap::new()),
                contenders: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The backend's part.
    pub fn dialect(&self) -> &D {
        &self.shared.dialect
    }

    fn entries(&self) -> MutexGuard<'_, Entries<D::Session>> {
        lock(&self.shared.entries)
    }

    fn contenders(&self) -> MutexGuard<'_, HashMap<(Key, OwnerToken), Instant>> {
        lock(&self.shared.contenders)
    }

    /// Notes that `owner`'s acquire of `key` answered `Held`: `owner`'s next wait for `key`
    /// claims the turn.
    pub fn note_held(&self, key: &Key, owner: &OwnerToken) {
        let now = Instant::now();
        let mut contenders = self.contenders();
        if contenders.len() >= CONTENDERS_KEPT {
            contenders.retain(|_, at| now.duration_since(*at) < CONTENDER_FRESH);
        }
        contenders.insert((key.clone(), *owner), now);
    }

    /// Forgets `owner` as a contender for `key` (its acquire was granted).
    pub fn note_granted(&self, key: &Key, owner: &OwnerToken) {
        self.contenders().remove(&(key.clone(), *owner));
    }

    /// The session of `owner`'s ready head for `key`, if any, taken for its acquire.
    pub fn claim(&self, key: &Key, owner: &OwnerToken) -> Option<Claim<D>> {
        let entry = self.entries().get(&(key.clone(), *owner)).cloned()?;
        if !matches!(entry.state(), State::Ready(_)) {
            return None;
        }
        let active = Active::new(entry.presence.clone(), false);
        let session = entry.parked().take()?;
        Some(Claim {
            queue: self.clone(),
            entry,
            session: Some(session),
            _active: active,
        })
    }

    /// `owner`'s turn at acquiring `key`: see [`Turn`].
    pub fn turn(&self, key: &Key, owner: &OwnerToken) -> Turn<D> {
        let entry = self.entries().get(&(key.clone(), *owner)).cloned();
        let _active = entry
            .as_ref()
            .map(|e| Active::new(e.presence.clone(), false));
        let head = entry.and_then(|e| match e.state() {
            State::Ready(ticket) => Some((e, ticket)),
            _ => None,
        });
        Turn { head, _active }
    }

    /// Waits until `owner`'s turn has come and the lease is free, or for `timeout`.
    ///
    /// # Cancel safety
    /// Cancel safe: the place in the queue is kept for [`GRACE`] (for the next call or
    /// the owner's acquire), then given up.
    ///
    /// # Errors
    /// [`StoreErrorKind::Busy`] when [`Policy::max_sessions`] owners wait already; as the
    /// backend answered when no waiting session can be opened.
    pub async fn wait(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let now = tokio::time::Instant::now();
        let deadline = now
            .checked_add(timeout)
            .or_else(|| self.shared.policy.overflow_wait.map(|d| now + d));
        let (entry, _active) = self.entry(key, owner)?;
        let mut rx = entry.state.subscribe();
        let ready = rx.wait_for(|s| !matches!(s, State::Queued | State::Claimed));
        let _ = match deadline {
            Some(at) => tokio::time::timeout_at(at, ready).await.ok(),
            None => Some(ready.await),
        };
        if entry.state() == State::Done(End::Failed) {
            let (kind, message) = lock(&entry.failure)
                .clone()
                .unwrap_or((StoreErrorKind::Unavailable, "waiting failed".to_owned()));
            return Err(StoreError::new(kind, self.shared.policy.backend, message));
        }
        Ok(())
    }

    /// `owner`'s entry for `key`, joining the queue if it has none, and the caller's
    /// presence as its waiter: counted before the entry's task starts, so that the task
    /// never finds a new entry without a waiter and leaves the queue at once.
    fn entry(&self, key: &Key, owner: &OwnerToken) -> Result<Waiting<D::Session>, StoreError> {
        let mut entries = self.entries();
        if let Some(e) = entries.get(&(key.clone(), *owner))
            && !matches!(e.state(), State::Done(_))
        {
            return Ok((e.clone(), Active::new(e.presence.clone(), true)));
        }
        let policy = &self.shared.policy;
        let permit = self
            .shared
            .permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| StoreError::new(StoreErrorKind::Busy, policy.backend, &policy.busy))?;
        // A contender: its acquire answered `Held` (lately enough, if the policy says).
        let claims = self
            .contenders()
            .get(&(key.clone(), *owner))
            .is_some_and(|at| {
                policy
                    .contender_for
                    .is_none_or(|fresh| at.elapsed() < fresh)
            });
        let kept = claims || policy.bystanders_keep_place;
        let entry = Arc::new(Entry {
            key: key.clone(),
            owner: *owner,
            claims,
            grace: if kept { GRACE } else { Duration::ZERO },
            state: watch::Sender::new(State::Queued),
            parked: Mutex::new(None),
            presence: Arc::default(),
            failure: Mutex::new(None),
        });
        if kept {
            entries.insert((key.clone(), *owner), entry.clone());
        }
        drop(entries);
        let waiter = Active::new(entry.presence.clone(), true);
        tokio::spawn(run(self.clone(), entry.clone(), permit));
        Ok((entry, waiter))
    }

    /// Ends `entry` with `end` unless it has ended already, and forgets it.
    fn finish(&self, entry: &Arc<Entry<D::Session>>, end: End) {
        entry.advance(|s| !matches!(s, State::Done(_)), State::Done(end));
        let mut entries = self.entries();
        let k = (entry.key.clone(), entry.owner);
        if entries.get(&k).is_some_and(|e| Arc::ptr_eq(e, entry)) {
            entries.remove(&k);
        }
    }
}

/// The life of one entry, then its end recorded.
async fn run<D: Dialect>(
    queue: Queue<D>,
    entry: Arc<Entry<D::Session>>,
    permit: OwnedSemaphorePermit,
) {
    let end = life(&queue, &entry).await;
    drop(permit);
    queue.finish(&entry, end);
}

async fn life<D: Dialect>(queue: &Queue<D>, entry: &Arc<Entry<D::Session>>) -> End {
    let dialect = &queue.shared.dialect;
    let mut session = match dialect.take_idle() {
        Some(s) => s,
        None => match connect(dialect, entry).await {
            Ok(s) => s,
            Err(end) => return end,
        },
    };
    // Join the queue; the server grants its lock to its waiters in arrival order.
    loop {
        let joined = tokio::select! {
            biased;
            j = dialect.join(&mut session, &entry.key) => j,
            () = entry.abandoned() => {
                dialect.abandon(session);
                return End::Left;
            }
        };
        match joined {
            Joined::Head => break,
            Joined::Lost => return End::Left,
            Joined::Stale => {
                drop(session);
                session = match connect(dialect, entry).await {
                    Ok(s) => s,
                    Err(end) => return end,
                };
            }
        }
    }
    loop {
        // Head: until the lease is free.
        let free = tokio::select! {
            biased;
            f = dialect.until_free(&mut session, &entry.key, &entry.owner, entry.claims) => f,
            () = entry.abandoned() => {
                dialect.abandon(session);
                return End::Left;
            }
        };
        if !free {
            return End::Left;
        }
        if !entry.claims {
            // A bystander's wait: pass the turn on before the waiter is told, so that its
            // own next request does not find the lock held by this session.
            dialect.pass(session, &entry.key).await;
            return End::Passed;
        }
        let ticket = dialect.ticket(&session);
        *entry.parked() = Some(session);
        entry.state.send_replace(State::Ready(ticket));
        let mut rx = entry.state.subscribe();
        let next = loop {
            let abandoned = tokio::select! {
                _ = rx.wait_for(|s| *s != State::Ready(ticket)) => false,
                () = entry.abandoned() => true,
            };
            if abandoned {
                if let Some(s) = entry.parked().take() {
                    // Unclaimed: ending the session passes the turn on.
                    dialect.leave(s);
                    return End::Left;
                }
                // A claim is under way: wait for its outcome.
                let _ = rx.wait_for(|s| *s != State::Ready(ticket)).await;
            }
            match entry.state() {
                State::Ready(_) => continue,
                State::Done(end) => return end,
                next => break next,
            }
        };
        // The owner's acquire found the lease held (wait for it again, as head), or was
        // granted naming this session (pass the turn on).
        session = match entry.parked().take() {
            Some(s) => s,
            None => return End::Left,
        };
        if next == State::Claimed {
            dialect.pass(session, &entry.key).await;
            return End::Passed;
        }
    }
}

/// A new session for `entry`; `Err`: how the entry ends (abandoned, or no session).
async fn connect<D: Dialect>(dialect: &D, entry: &Entry<D::Session>) -> Result<D::Session, End> {
    tokio::select! {
        biased;
        r = dialect.connect() => r.map_err(|e| entry.fail(&e)),
        () = entry.abandoned() => Err(End::Left),
    }
}

/// Sessions kept for the next waiter (or holder): a few, the rest closed.
pub struct Idle<S> {
    sessions: Mutex<Vec<S>>,
    keep: usize,
    close: fn(S),
}

impl<S> std::fmt::Debug for Idle<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idle")
            .field("kept", &lock(&self.sessions).len())
            .field("keep", &self.keep)
            .finish()
    }
}

impl<S> Idle<S> {
    /// Keeps up to `keep` sessions; `close` ends one that is not kept.
    pub fn new(keep: usize, close: fn(S)) -> Self {
        Self {
            sessions: Mutex::new(Vec::new()),
            keep,
            close,
        }
    }

    /// A kept session, if any.
    pub fn take(&self) -> Option<S> {
        lock(&self.sessions).pop()
    }

    /// Keeps `session` for reuse, or closes it when enough are kept.
    pub fn put(&self, session: S) {
        let mut kept = lock(&self.sessions);
        if kept.len() < self.keep {
            kept.push(session);
        } else {
            drop(kept);
            (self.close)(session);
        }
    }
}

impl<S> Drop for Idle<S> {
    fn drop(&mut self) {
        for s in std::mem::take(self.sessions.get_mut().unwrap_or_else(|e| e.into_inner())) {
            (self.close)(s);
        }
    }
}

/// Closes `conn` in the background (gracefully, within `within`); outside a runtime, drops it.
pub fn close_later<C: sqlx::Connection + 'static>(conn: C, within: Duration) {
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::spawn(async move {
            let _ = tokio::time::timeout(within, conn.close()).await;
        });
    }
}
