//! Sending the concurrent acquires and releases of a client's tasks as one script call
//! per Cluster slot.
//!
//! A plain lock sends one command per operation. A store shared by many tasks can do
//! better: while [`IN_FLIGHT`] calls for a slot are on the wire, further operations on
//! that slot wait in a queue, and the call that finishes next hands the whole queue (up to
//! [`MAX_ITEMS`]) to one `MANY` script call. With one task nothing ever waits (each
//! operation goes out at once, as its own script); with many, Redis runs one script call
//! for many operations instead of one each, which is what bounds throughput on a busy
//! server. Each operation in a batch is applied on its own, exactly as its single script
//! would apply it; a call that fails fails for each of its operations, as ambiguous as
//! the same failure of a single call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use leasehold_core::{StoreError, StoreErrorKind};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::BACKEND;
use crate::conn::Conn;
use crate::scripts::{self, Acquired, Item, SCRIPTS, parse_acquire, parse_flag};

/// Calls on the wire per slot before operations queue for a batch.
pub(crate) const IN_FLIGHT: usize = 2;

/// The most operations in one batch call.
pub(crate) const MAX_ITEMS: usize = 256;

/// One operation's arguments, as the `MANY` script takes them: five keys (lease, fence,
/// queue, queue deadlines, watch mark), then six arguments (`a` or `r`, owner, ttl ms
/// (`''` for a release), fence expiry, grace, channel).
///
/// The eleven parts are written one after the other into one string, so that an
/// operation costs one allocation instead of one per part (issue 29: allocation was most
/// of the client CPU of an acquire + release pair).
#[derive(Debug, Clone)]
pub(crate) struct Op {
    /// The parts, concatenated.
    buf: String,
    /// Where each part ends in `buf` (a part starts where the one before ends).
    ends: [usize; Op::PARTS],
    /// Parts written so far.
    len: usize,
}

impl Op {
    const PARTS: usize = 11;

    /// An operation with no part yet, room for `capacity` bytes of parts.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            buf: String::with_capacity(capacity),
            ends: [0; Self::PARTS],
            len: 0,
        }
    }

    /// The string the next part is written to ([`end_part`](Self::end_part) ends it).
    pub(crate) fn buf(&mut self) -> &mut String {
        &mut self.buf
    }

    /// Ends the part written since the last call: the next one starts here.
    pub(crate) fn end_part(&mut self) {
        self.ends[self.len] = self.buf.len();
        self.len += 1;
    }

    /// Writes `part` whole as the next part.
    pub(crate) fn push(&mut self, part: &str) {
        self.buf.push_str(part);
        self.end_part();
    }

    fn part(&self, i: usize) -> &str {
        debug_assert_eq!(self.len, Self::PARTS, "an operation has all its parts");
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.buf[start..self.ends[i]]
    }

    /// The five keys.
    pub(crate) fn keys(&self) -> [&str; 5] {
        std::array::from_fn(|i| self.part(i))
    }

    /// The six arguments.
    pub(crate) fn args(&self) -> [&str; 6] {
        std::array::from_fn(|i| self.part(5 + i))
    }

    fn is_acquire(&self) -> bool {
        self.part(5) == "a"
    }

    /// Runs the operation on its own: its single script, `ACQUIRE` or `RELEASE`.
    async fn run_alone(&self, conn: &Conn) -> Result<Answer, StoreError> {
        let keys = self.keys();
        let [_, owner, ms, keep, grace, channel] = self.args();
        if self.is_acquire() {
            let args = [owner, ms, keep, grace, channel];
            let got = conn.run("acquire", &SCRIPTS.acquire, &keys, &args, parse_acquire);
            got.await.map(Answer::Acquired)
        } else {
            let args = [owner, channel, grace, keep];
            let got = conn.run("release", &SCRIPTS.release, &keys, &args, parse_flag);
            got.await.map(Answer::Released)
        }
    }
}

/// An operation's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    Acquired(Acquired),
    Released(bool),
}

type Reply = oneshot::Sender<Result<Answer, StoreError>>;

/// A queued operation: its arguments, when its caller stops waiting, where its answer goes.
type Queued = (Op, Instant, Reply);

#[derive(Default)]
struct SlotState {
    in_flight: usize,
    queued: Vec<Queued>,
}

/// The queues of one store, by slot (one slot on a single server).
pub(crate) struct Batcher {
    conn: Arc<Conn>,
    slots: Mutex<HashMap<u16, SlotState>>,
    /// Calls on the wire per slot before operations queue: [`IN_FLIGHT`], or no limit
    /// when batching is off.
    in_flight: usize,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("slots", &self.lock().len())
            .finish()
    }
}

/// What a caller does with its operation.
enum Way {
    /// Send it now, on its own; the turn is handed on when dropped.
    Direct(Turn),
    /// It waits in the queue for a batch.
    Queued(oneshot::Receiver<Result<Answer, StoreError>>),
}

/// One call's place on the wire for a slot. Dropped (the call answered, failed or was
/// cancelled), it hands the slot's queue to a batch call, or frees the place.
struct Turn {
    batcher: Arc<Batcher>,
    slot: u16,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let batch = {
            let mut slots = self.batcher.lock();
            let Some(st) = slots.get_mut(&self.slot) else {
                return;
            };
            // Operations whose caller gave up (timed out, cancelled) are not sent.
            st.queued.retain(|(_, _, reply)| !reply.is_closed());
            if st.queued.is_empty() {
                st.in_flight -= 1;
                if st.in_flight == 0 {
                    slots.remove(&self.slot);
                }
                return;
            }
            let n = st.queued.len().min(MAX_ITEMS);
            st.queued.drain(..n).collect::<Vec<_>>()
        };
        let turn = Turn {
            batcher: self.batcher.clone(),
            slot: self.slot,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(run_batch(turn, batch));
            }
            // No runtime to send from: the queued callers see their operation dropped
            // (ambiguous), and the turn is handed on again (or freed).
            Err(_) => drop((batch, turn)),
        }
    }
}

async fn run_batch(turn: Turn, batch: Vec<Queued>) {
    let conn = turn.batcher.conn.clone();
    // The call ends when the first of its callers stops waiting, as that caller's own
    // call would have: nothing is applied later than a single call could be.
    let Some(deadline) = batch.iter().map(|(_, d, _)| *d).min() else {
        return;
    };
    let (ops, replies): (Vec<Op>, Vec<Reply>) =
        batch.into_iter().map(|(op, _, reply)| (op, reply)).unzip();
    let kinds: Vec<bool> = ops.iter().map(Op::is_acquire).collect();
    let keys: Vec<&str> = ops.iter().flat_map(Op::keys).collect();
    let args: Vec<&str> = ops.iter().flat_map(Op::args).collect();
    let got = conn
        .run_until(
            deadline,
            true,
            "acquire or release (batch)",
            &SCRIPTS.many,
            &keys,
            &args,
            |v, id| scripts::parse_many(v, id, &kinds),
        )
        .await;
    drop(turn);
    match got {
        Ok(items) => {
            for (reply, item) in replies.into_iter().zip(items) {
                let answer = match item {
                    Item::Acquired(a) => Ok(Answer::Acquired(a)),
                    Item::Released(r) => Ok(Answer::Released(r)),
                    Item::Failed(text) => Err(scripts::item_error("batch", &text)),
                };
                let _ = reply.send(answer);
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(StoreError::new(e.kind(), BACKEND, e.message())));
            }
        }
    }
}

impl Batcher {
    /// A batcher on `conn`; with `batch` off, every operation goes out at once.
    pub(crate) fn new(conn: Arc<Conn>, batch: bool) -> Self {
        Self {
            conn,
            in_flight: if batch { IN_FLIGHT } else { usize::MAX },
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u16, SlotState>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn way(self: &Arc<Self>, slot: u16, op: &Op, deadline: Instant) -> Way {
        let mut slots = self.lock();
        let st = slots.entry(slot).or_default();
        if st.in_flight < self.in_flight {
            st.in_flight += 1;
            Way::Direct(Turn {
                batcher: self.clone(),
                slot,
            })
        } else {
            let (tx, rx) = oneshot::channel();
            st.queued.push((op.clone(), deadline, tx));
            Way::Queued(rx)
        }
    }

    /// Runs `op` on `slot`: at once on its own when fewer than [`IN_FLIGHT`] calls are on
    /// the wire for the slot, else in the next batch call. Either way the answer comes
    /// within the operation timeout of this call (a queued operation waits for its batch
    /// no longer; one whose caller has given up by the time its batch is sent is left out
    /// of it).
    ///
    /// # Cancel safety
    /// As a single call: a dropped call may still be applied (in its batch).
    pub(crate) async fn submit(self: &Arc<Self>, slot: u16, op: Op) -> Result<Answer, StoreError> {
        let limit = self.conn.op_timeout();
        let deadline = Instant::now() + limit;
        match self.way(slot, &op, deadline) {
            Way::Direct(turn) => {
                let res = op.run_alone(&self.conn).await;
                drop(turn);
                res
            }
            Way::Queued(rx) => match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => Err(StoreError::new(
                    StoreErrorKind::Ambiguous,
                    BACKEND,
                    "the batch this operation was queued in was dropped (the runtime is shutting down); it may have been applied",
                )),
                Err(_) => Err(StoreError::timeout(
                    BACKEND,
                    "acquire or release (queued for a batch)",
                    limit,
                )),
            },
        }
    }
}
