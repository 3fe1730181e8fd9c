//! The Lua scripts, one per operation, and strict parsing of their replies.
//!
//! Every script takes a request id as `ARGV[1]` and returns it as the first element of
//! its reply. The store checks it, so a reply can never be taken for the reply to another
//! request, even on a connection that lost bytes (a middlebox that swallowed a request
//! would otherwise shift every later reply by one).
//!
//! Errors raised by the scripts start with `LHCORRUPT` (mapped to
//! [`StoreErrorKind::Corrupt`](leasehold_core::StoreErrorKind::Corrupt)); other errors of the
//! commands they call (`NOPERM`, `OOM`, ...) are passed through unchanged.

use std::sync::LazyLock;
use std::time::Duration;

use leasehold_core::{AcquireAnyOutcome, CheckedAcquire, Fence};
use redis::{Script, Value};

pub(crate) use crate::wire::{
    Armed, CORRUPT_CODE, FORMAT_CODE, Reply, ReplyError, parse_fence_reply as parse_break,
    parse_flag, parse_inspect, scan_step,
};
use crate::wire::{INSPECT, LEASE_PRELUDE, RENEW, as_int, as_str, items, ms, parse_fence};

/// The store format these scripts read and write (see the crate docs, "Store format").
pub const STORE_FORMAT: u32 = 1;

/// Helpers shared by the scripts, after [`LEASE_PRELUDE`] (`read_lease`,
/// `read_fence`, `next_fence`):
///
/// * `publish(chan, msg)` → `SPUBLISH` on the rest of `chan` if it starts with `S ` (a
///   Cluster with sharded pub/sub; a channel name never has a space), else `PUBLISH`.
/// * `queue_watch(q, w)` → whether the key's queue `q` exists and whether its watch key
///   `w` does (`w` nil: a caller that does not pass it; never watched), in one command.
const PRELUDE: &str = r#"
local function publish(chan, msg)
  if string.sub(chan, 1, 2) == 'S ' then
    redis.call('SPUBLISH', string.sub(chan, 3), msg)
  else
    redis.call('PUBLISH', chan, msg)
  end
end
-- One command for what used to be `EXISTS q`: EXISTS counts a key named twice twice, so
-- the count is q + 2 w. A change of a watched key is told on its channel as '~' (a
-- message that names no owner, which waiters of this version ignore; see notify.rs).
local function queue_watch(q, w)
  if not w then return redis.call('EXISTS', q) == 1, false end
  local n = redis.call('EXISTS', q, w, w)
  return n % 2 == 1, n >= 2
end
-- The queue's helpers (now_ms, dequeue, live_head, enqueue, reserve), made only by a
-- call that meets a queue: most calls never do, and a closure made per call is what a
-- script's prelude costs the server (issue 29 item 4).
local function queue_ops()
  local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  -- The waiting queue of a key: q (ZSET owner -> arrival in ms, FIFO), qd (HASH owner ->
  -- the entry's own deadline in ms; and 't' .. owner -> the TTL in ms a waiter that
  -- heartbeats asked for, see WAIT_TURN). The first entry whose deadline has not passed,
  -- after dropping the ones whose deadline has.
  local function dequeue(q, qd, owner)
    redis.call('ZREM', q, owner)
    redis.call('HDEL', qd, owner, 't' .. owner)
  end
  local function live_head(q, qd, now)
    while true do
      local h = redis.call('ZRANGE', q, 0, 0)
      if #h == 0 then return nil end
      local d = tonumber(redis.call('HGET', qd, h[1]) or '0') or 0
      if d > now then return h[1] end
      dequeue(q, qd, h[1])
    end
  end
  -- Adds (or keeps the place of) owner in the queue, its entry living until `untl` (ms).
  local function enqueue(q, qd, owner, now, untl)
    redis.call('ZADD', q, 'NX', now, owner)
    redis.call('HSET', qd, owner, untl)
    local want = untl - now + 1000
    if redis.call('PTTL', q) < want then redis.call('PEXPIRE', q, want) end
    if redis.call('PTTL', qd) < want then redis.call('PEXPIRE', qd, want) end
  end
  -- Reserves the free lease for the waiter `head`: a new fence, the lease held by head,
  -- head leaves the queue and is told on `chan`. A waiter that heartbeats (its entry has
  -- the TTL it asked for, 't' .. head) is granted that TTL and told "<head>:<fence>:<ttl>":
  -- the grant is its, no acquire needed (docs/design.md section 11; its entry lives one
  -- heartbeat interval, so only a waiter heard from that recently is granted). Any other
  -- waiter gets `grace` ms and is told "<head>", and confirms with an acquire of its own,
  -- which extends the lease to its TTL. " <next>" follows when someone else is queued: the
  -- waiter now first learns it is next, and re-checks when the reservation would lapse.
  -- Returns an error's text, or nil and the new fence.
  local function reserve(kl, kf, q, qd, last, head, grace, keep, chan)
    local f, nerr = next_fence(last)
    if nerr then return nerr end
    local fs = string.format('%d', f)
    local ttl = redis.call('HGET', qd, 't' .. head)
    local hold, told = grace, head
    if ttl then hold, told = ttl, head .. ':' .. fs .. ':' .. ttl end
    if keep == '' then
      redis.call('SET', kf, fs)
    else
      redis.call('SET', kf, fs, 'PX', tonumber(keep) + tonumber(hold))
    end
    redis.call('SET', kl, head .. ':' .. fs, 'PX', hold)
    dequeue(q, qd, head)
    local nxt = redis.call('ZRANGE', q, 0, 0)
    if #nxt == 0 then
      redis.call('DEL', q, qd)
      publish(chan, told)
    else
      publish(chan, told .. ' ' .. nxt[1])
    end
    return nil, f
  end
  return now_ms, dequeue, live_head, enqueue, reserve
end
-- Acquire (see ACQUIRE): a table {1, fence, ttl} or {0, pttl}, or an error's text. A
-- fresh grant of a watched key (`w`, optional) is told on `chan`.
local function acquire_one(kl, kf, q, qd, owner, ttl, keep, grace, chan, w)
  local lease, err = read_lease(kl)
  if err then return err end
  if lease then
    if lease[1] == owner then
      redis.call('PEXPIRE', kl, ttl)
      return {1, lease[2], tonumber(ttl)}
    end
    local pttl = redis.call('PTTL', kl)
    if pttl < 0 then return 'LHCORRUPT the lease key has no expiry' end
    return {0, pttl}
  end
  local last, ferr = read_fence(kf)
  if ferr then return ferr end
  local queued, watched = false, false
  if grace ~= '' then queued, watched = queue_watch(q, w) end
  if queued then
    local now_ms, dequeue, live_head, _, reserve = queue_ops()
    local head = live_head(q, qd, now_ms())
    if head and head ~= owner then
      local rerr = reserve(kl, kf, q, qd, last, head, grace, keep, chan)
      if rerr then return rerr end
      return {0, tonumber(grace)}
    end
    if head then dequeue(q, qd, head) end
  end
  local f, nerr = next_fence(last)
  if nerr then return nerr end
  local fs = string.format('%d', f)
  if keep == '' then
    redis.call('SET', kf, fs)
  else
    redis.call('SET', kf, fs, 'PX', keep)
  end
  redis.call('SET', kl, owner .. ':' .. fs, 'PX', ttl)
  if watched then publish(chan, '~') end
  return {1, fs, tonumber(ttl)}
end
-- Release (see RELEASE): 1 released, 0 not the owner, or an error's text. With a live
-- waiter in the queue the lease is not deleted but reserved for the first one (see
-- `reserve`); with nobody queued nothing is published unless the key is watched (`w`,
-- optional).
local function release_one(kl, kf, q, qd, owner, chan, grace, keep, w)
  local lease, err = read_lease(kl)
  if err then return err end
  if not (lease and lease[1] == owner) then return 0 end
  local queued, watched = false, false
  if grace ~= '' then queued, watched = queue_watch(q, w) end
  if queued then
    local now_ms, _, live_head, _, reserve = queue_ops()
    local head = live_head(q, qd, now_ms())
    if head then
      local last, ferr = read_fence(kf)
      if ferr then return ferr end
      local held = tonumber(lease[2])
      if held > last then last = held end
      local rerr = reserve(kl, kf, q, qd, last, head, grace, keep, chan)
      if rerr then return rerr end
      return 1
    end
  end
  redis.call('DEL', kl)
  if watched then publish(chan, '~') end
  return 1
end
"#;

/// KEYS: lease, fence, queue, queue deadlines, watch. ARGV: id, owner, ttl ms, fence record
/// expiry ms ('' = never), reservation grace ms ('' = no queue), channel.
/// → `{id, 1, fence, ttl}` acquired (fresh, reserved for this owner, or same owner:
///   extended, same fence); `{id, 0, pttl}` held by another owner (or, while the lease is
///   free, reserved now for the first live waiter in the queue). See `acquire_one`.
const ACQUIRE: &str = r#"
local r = acquire_one(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], KEYS[5])
if type(r) == 'string' then return redis.error_reply(r) end
table.insert(r, 1, ARGV[1])
return r
"#;

/// Acquire of any one of n leases (a semaphore's slots), on one server.
/// KEYS: per lease, lease, fence, queue, queue deadlines, watch mark (a grant is
/// published to the watchers of a watched lease, as ACQUIRE does). ARGV: id, owner, ttl ms, fence
/// record expiry ms ('' = never), reservation grace ms ('' = no queue), then one channel
/// per lease.
/// → `{id, 1, i, fence, ttl}`: lease i (1-based) acquired, as ACQUIRE would answer for it:
///   the first lease held by this owner (extended, same fence), else the first, in order,
///   that ACQUIRE grants; `{id, 0, pttl}`: none, with the shortest pttl ACQUIRE answered.
/// Each lease is acquired with `acquire_one`, as its own ACQUIRE would (its queue and
/// reservations included); leases after the one granted are not touched. A lease key
/// that holds something else is skipped by the owner's search and reported by
/// `acquire_one` if the search in order reaches it.
const ACQUIRE_ANY: &str = r#"
local r = acquire_any(0, 0)
if type(r) == 'string' then return redis.error_reply(r) end
return r
"#;

/// The body of [`ACQUIRE_ANY`] for leases whose keys start after `KEYS[k0]` and whose
/// channels start after `ARGV[5 + a0]` (ARGV[1..5]: id, owner, ttl ms, fence record
/// expiry, grace), so that a script with more arguments in front can call it; the reply
/// as ACQUIRE_ANY's, or an error's text.
const ACQUIRE_ANY_FN: &str = r#"
local function acquire_any(k0, a0)
  local n = (#KEYS - k0) / 5
  local function one(i)
    local k = k0 + (i - 1) * 5
    return acquire_one(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[5 + a0 + i], KEYS[k + 5])
  end
  local pick = nil
  for i = 1, n do
    local lease = read_lease(KEYS[k0 + (i - 1) * 5 + 1])
    if lease and lease[1] == ARGV[2] then pick = i break end
  end
  local shortest = nil
  for i = pick or 1, pick or n do
    local r = one(i)
    if type(r) == 'string' then return r end
    if r[1] == 1 then return {ARGV[1], 1, i, r[2], r[3]} end
    if shortest == nil or r[2] < shortest then shortest = r[2] end
  end
  return {ARGV[1], 0, shortest}
end
"#;

/// Acquire of any one of n leases behind a check of a record (a semaphore's number of
/// permits), in one call. KEYS: the record, the record's watch mark, then per lease as
/// ACQUIRE_ANY. ARGV: id, owner, ttl ms, fence record expiry ms, grace ms, the value the
/// record must hold, the record's channel, then one channel per lease.
/// The record is written with the value at fence 0 if absent (as the record put script
/// at fence 0 would, telling its watchers); if it then holds another value, nothing is
/// acquired: → `{id, 2, fence, value}`, the stored record. Else ACQUIRE_ANY's reply.
const ACQUIRE_ANY_CHECKED: &str = r#"
local rec, err = read_record(KEYS[1])
if err then return redis.error_reply(err) end
if not rec then
  redis.call('SET', KEYS[1], '0:' .. ARGV[6])
  if redis.call('EXISTS', KEYS[2]) == 1 then publish(ARGV[7], '~') end
  rec = {'0', ARGV[6]}
end
if rec[2] ~= ARGV[6] then return {ARGV[1], 2, rec[1], rec[2]} end
local r = acquire_any(2, 2)
if type(r) == 'string' then return redis.error_reply(r) end
return r
"#;

/// KEYS: lease₁ … leaseₙ (one Cluster slot). ARGV: id, ttl ms, owner₁ … ownerₙ.
/// → `{id, r₁ … rₙ}`: `1` renewed, `0` not the owner, or the error's text (a string) for
/// a key that holds something else. Each key is renewed (or not) as RENEW would.
const RENEW_MANY: &str = r#"
local out = {ARGV[1]}
for i = 1, #KEYS do
  local lease, err = read_lease(KEYS[i])
  if err then
    out[i + 1] = err
  elseif lease and lease[1] == ARGV[i + 2] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
    out[i + 1] = 1
  else
    out[i + 1] = 0
  end
end
return out
"#;

/// KEYS: lease, fence, queue, queue deadlines, watch. ARGV: id, owner, channel, reservation
/// grace ms ('' = no queue), fence record expiry ms ('' = never).
/// → `{id, 1}` released, `{id, 0}` not the owner. See `release_one`.
const RELEASE: &str = r#"
local r = release_one(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[3], ARGV[4], ARGV[5], KEYS[5])
if type(r) == 'string' then return redis.error_reply(r) end
return {ARGV[1], r}
"#;

/// Many acquires and releases, of leases of one Cluster slot, in one call: the
/// concurrent operations of a client's tasks. KEYS: per item, lease, fence, queue, queue
/// deadlines, watch. ARGV: id, then per item: `a` or `r`, owner, ttl ms (acquire) or '',
/// fence record expiry ms ('' = never), reservation grace ms ('' = no queue), channel.
/// → `{id, r₁ … rₙ}`, each as ACQUIRE (`{1, fence, ttl}` or `{0, pttl}`) or RELEASE (`1`
/// or `0`) would answer without the id, or the error's text (a string). Each item is
/// applied on its own, in order, as its single script would.
const MANY: &str = r#"
local out = {ARGV[1]}
local n = (#ARGV - 1) / 6
for i = 1, n do
  local k, a = (i - 1) * 5, 1 + (i - 1) * 6
  local r
  if ARGV[a + 1] == 'a' then
    r = acquire_one(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], KEYS[k + 5])
  else
    r = release_one(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], ARGV[a + 2], ARGV[a + 6], ARGV[a + 5], ARGV[a + 4], KEYS[k + 5])
  end
  out[i + 1] = r
end
return out
"#;

/// KEYS: lease, fence, queue, queue deadlines. ARGV: id, owner, longest wait ms,
/// reservation grace ms, fence record expiry ms ('' = never), channel.
/// Run by a waiter after it has subscribed to the channel:
/// → `{id, 0}` go and acquire (the lease is free and nobody is ahead in the queue, or it
///   is reserved for this owner); `{id, 1, pttl}` wait (this owner is now in the queue,
///   its entry living until the wait ends plus the grace; if the lease was free with
///   someone ahead, it has been reserved for them).
const WAIT: &str = r#"
local now_ms, _, live_head, enqueue, reserve = queue_ops()
local lease, err = read_lease(KEYS[1])
if err then return redis.error_reply(err) end
local now = now_ms()
local grace = tonumber(ARGV[4])
if lease then
  if lease[1] == ARGV[2] then return {ARGV[1], 0} end
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then return redis.error_reply('LHCORRUPT the lease key has no expiry') end
  local w = tonumber(ARGV[3])
  if pttl < w then w = pttl end
  enqueue(KEYS[3], KEYS[4], ARGV[2], now, now + w + grace)
  return {ARGV[1], 1, pttl}
end
if redis.call('EXISTS', KEYS[3]) == 0 then return {ARGV[1], 0} end
local head = live_head(KEYS[3], KEYS[4], now)
if head == nil or head == ARGV[2] then return {ARGV[1], 0} end
local last, ferr = read_fence(KEYS[2])
if ferr then return redis.error_reply(ferr) end
local rerr = reserve(KEYS[1], KEYS[2], KEYS[3], KEYS[4], last, head, ARGV[4], ARGV[5], ARGV[6])
if rerr then return redis.error_reply(rerr) end
enqueue(KEYS[3], KEYS[4], ARGV[2], now, now + 2 * grace)
return {ARGV[1], 1, grace}
"#;

/// KEYS: lease, fence, queue, queue deadlines. ARGV: id, owner, ttl ms, entry life ms,
/// reservation grace ms, fence record expiry ms ('' = never), channel.
/// A waiter's heartbeat (docs/design.md section 11), run after it has subscribed to the
/// channel and then every half entry life while it waits:
/// → `{id, 0}` go and acquire (the lease is free and nobody is ahead in the queue);
///   `{id, 1, pttl, last}` still waiting: this owner is in the queue (its place kept, its
///   entry living `life` ms from now, with the TTL it asks for), the key's last fence
///   issued is `last` (a grant made for this owner after this answer has a higher one);
///   `{id, 2}` the lease is this owner's (a grant made before this request was
///   processed: confirm it with an acquire).
const WAIT_TURN: &str = r#"
local now_ms, _, live_head, enqueue, reserve = queue_ops()
local lease, err = read_lease(KEYS[1])
if err then return redis.error_reply(err) end
local now = now_ms()
local last, ferr = read_fence(KEYS[2])
if ferr then return redis.error_reply(ferr) end
if lease then
  if lease[1] == ARGV[2] then return {ARGV[1], 2} end
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then return redis.error_reply('LHCORRUPT the lease key has no expiry') end
  local held = tonumber(lease[2])
  if held > last then last = held end
  enqueue(KEYS[3], KEYS[4], ARGV[2], now, now + tonumber(ARGV[4]))
  redis.call('HSET', KEYS[4], 't' .. ARGV[2], ARGV[3])
  return {ARGV[1], 1, pttl, string.format('%d', last)}
end
if redis.call('EXISTS', KEYS[3]) == 0 then return {ARGV[1], 0} end
local head = live_head(KEYS[3], KEYS[4], now)
if head == nil or head == ARGV[2] then return {ARGV[1], 0} end
local rerr, reserved = reserve(KEYS[1], KEYS[2], KEYS[3], KEYS[4], last, head, ARGV[5], ARGV[6], ARGV[7])
if rerr then return redis.error_reply(rerr) end
enqueue(KEYS[3], KEYS[4], ARGV[2], now, now + tonumber(ARGV[4]))
redis.call('HSET', KEYS[4], 't' .. ARGV[2], ARGV[3])
return {ARGV[1], 1, redis.call('PTTL', KEYS[1]), string.format('%d', reserved)}
"#;

/// KEYS: lease, fence. ARGV: id, channel ('' = don't publish), fence record expiry ms
/// ('' = never). → `{id, fence}`.
/// A corrupt lease value is reported, not deleted: it may be someone else's data.
const BREAK: &str = r#"
local lease, err = read_lease(KEYS[1])
if err then return redis.error_reply(err) end
local last, ferr = read_fence(KEYS[2])
if ferr then return redis.error_reply(ferr) end
if lease then
  local held = tonumber(lease[2])
  if held > last then last = held end
end
local f, nerr = next_fence(last)
if nerr then return redis.error_reply(nerr) end
local fs = string.format('%d', f)
if ARGV[3] == '' then
  redis.call('SET', KEYS[2], fs)
else
  redis.call('SET', KEYS[2], fs, 'PX', ARGV[3])
end
if lease then
  redis.call('DEL', KEYS[1])
  if ARGV[2] ~= '' then publish(ARGV[2], fs) end
end
return {ARGV[1], fs}
"#;

/// KEYS: watch. ARGV: id, mark's lifetime ms, channel, heartbeat.
/// Marks the key watched (the scripts above then publish its changes) until the mark
/// lapses, and publishes the watcher's heartbeat on the channel, by which the watcher
/// knows that its subscription still hears the key. → `{id}`.
const WATCH: &str = r#"
redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
publish(ARGV[3], ARGV[4])
return {ARGV[1]}
"#;

/// The scripts, compiled once (their SHA1 computed once).
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) acquire_any: Script,
    pub(crate) acquire_any_checked: Script,
    pub(crate) renew: Script,
    pub(crate) renew_many: Script,
    pub(crate) release: Script,
    pub(crate) many: Script,
    pub(crate) wait: Script,
    pub(crate) wait_turn: Script,
    pub(crate) inspect: Script,
    pub(crate) break_lease: Script,
    pub(crate) put_record: Script,
    pub(crate) get_record: Script,
    pub(crate) watch: Script,
}

/// The scripts, built on first use.
pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(&format!("{LEASE_PRELUDE}{PRELUDE}{ACQUIRE}")),
    acquire_any: Script::new(&format!(
        "{LEASE_PRELUDE}{PRELUDE}{ACQUIRE_ANY_FN}{ACQUIRE_ANY}"
    )),
    acquire_any_checked: Script::new(&format!(
        "{LEASE_PRELUDE}{PRELUDE}{}{ACQUIRE_ANY_FN}{ACQUIRE_ANY_CHECKED}",
        crate::records::PRELUDE
    )),
    renew: Script::new(&format!("{LEASE_PRELUDE}{RENEW}")),
    renew_many: Script::new(&format!("{LEASE_PRELUDE}{PRELUDE}{RENEW_MANY}")),
    release: Script::new(&format!("{LEASE_PRELUDE}{PRELUDE}{RELEASE}")),
    many: Script::new(&format!("{LEASE_PRELUDE}{PRELUDE}{MANY}")),
    wait: Script::new(&format!("{LEASE_PRELUDE}{PRELUDE}{WAIT}")),
    wait_turn: Script::new(&format!("{LEASE_PRELUDE}{PRELUDE}{WAIT_TURN}")),
    inspect: Script::new(&format!("{LEASE_PRELUDE}{INSPECT}")),
    break_lease: Script::new(&format!("{LEASE_PRELUDE}{PRELUDE}{BREAK}")),
    put_record: Script::new(&crate::records::put_script()),
    get_record: Script::new(&crate::records::get_script()),
    watch: Script::new(&format!("{LEASE_PRELUDE}{PRELUDE}{WATCH}")),
});

/// A parsed acquire reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    Granted { fence: Fence, ttl: Duration },
    Held { remaining: Duration },
}

pub(crate) fn parse_acquire(v: &Value, id: &str) -> Reply<Acquired> {
    parse_acquired(items(v, id)?)
}

/// Acquire of any of `n` leases: `{id, 1, i, fence, ttl}` → lease `i - 1` acquired, with
/// `1 <= i <= n`; `{id, 0, pttl}` → all held.
pub(crate) fn parse_acquire_any(v: &Value, id: &str, n: usize) -> Reply<AcquireAnyOutcome> {
    let it = items(v, id)?;
    match (it.first().and_then(as_int), it.len()) {
        (Some(1), 4) => {
            let index = as_int(&it[1])
                .and_then(|i| usize::try_from(i).ok())
                .filter(|i| (1..=n).contains(i))
                .ok_or(ReplyError::Shape("bad lease index"))?;
            match parse_acquired(&[it[0].clone(), it[2].clone(), it[3].clone()])? {
                Acquired::Granted { fence, ttl } => Ok(AcquireAnyOutcome::Acquired {
                    index: index - 1,
                    fence,
                    ttl,
                }),
                Acquired::Held { .. } => Err(ReplyError::Shape("unexpected acquire reply")),
            }
        }
        (Some(0), 2) => match parse_acquired(it)? {
            Acquired::Held { remaining } => Ok(AcquireAnyOutcome::Held {
                remaining: Some(remaining),
            }),
            Acquired::Granted { .. } => Err(ReplyError::Shape("unexpected acquire reply")),
        },
        _ => Err(ReplyError::Shape("unexpected acquire reply")),
    }
}

/// Acquire of any behind a record check: `{id, 2, fence, value}` → refused, with the
/// stored record; else as [`parse_acquire_any`].
pub(crate) fn parse_acquire_any_checked(v: &Value, id: &str, n: usize) -> Reply<CheckedAcquire> {
    match items(v, id)? {
        [flag, f, value] if as_int(flag) == Some(2) => {
            crate::records::parse_record(f, value).map(CheckedAcquire::Refused)
        }
        _ => parse_acquire_any(v, id, n).map(CheckedAcquire::Passed),
    }
}

/// The wait script: `{id, 0}` → `None` (go and acquire), `{id, 1, pttl}` → `Some(pttl)`
/// (queued; wait at most that long for the lease's holder).
pub(crate) fn parse_wait(v: &Value, id: &str) -> Reply<Option<Duration>> {
    let it = items(v, id)?;
    match (it.first().and_then(as_int), it.len()) {
        (Some(0), 1) => Ok(None),
        (Some(1), 2) => as_int(&it[1])
            .and_then(ms)
            .map(Some)
            .ok_or(ReplyError::Shape("bad pttl")),
        _ => Err(ReplyError::Shape("unexpected wait reply")),
    }
}

/// A heartbeat's answer ([`WAIT_TURN`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Go and acquire.
    Go,
    /// Still waiting; the key's last fence issued when the store processed it.
    Waiting { last: Fence },
    /// The lease is this owner's already: confirm it with an acquire.
    Mine,
}

/// The heartbeat script: `{id, 0}` → [`Turn::Go`], `{id, 1, pttl, last}` →
/// [`Turn::Waiting`], `{id, 2}` → [`Turn::Mine`].
pub(crate) fn parse_turn(v: &Value, id: &str) -> Reply<Turn> {
    let it = items(v, id)?;
    match (it.first().and_then(as_int), it.len()) {
        (Some(0), 1) => Ok(Turn::Go),
        (Some(2), 1) => Ok(Turn::Mine),
        (Some(1), 3) => {
            let last = as_str(&it[2])
                .and_then(parse_fence)
                .ok_or(ReplyError::Shape("bad fence"))?;
            Ok(Turn::Waiting { last })
        }
        _ => Err(ReplyError::Shape("unexpected wait reply")),
    }
}

/// One operation's answer in a batch of acquires and releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Item {
    Acquired(Acquired),
    Released(bool),
    /// The script's error for this operation (its text).
    Failed(String),
}

fn parse_acquired(it: &[Value]) -> Reply<Acquired> {
    match (it.first().and_then(as_int), it.len()) {
        (Some(1), 3) => {
            let fence = as_str(&it[1])
                .and_then(parse_fence)
                .ok_or(ReplyError::Shape("bad fence"))?;
            let ttl = as_int(&it[2])
                .and_then(ms)
                .ok_or(ReplyError::Shape("bad ttl"))?;
            Ok(Acquired::Granted { fence, ttl })
        }
        (Some(0), 2) => {
            let remaining = as_int(&it[1])
                .and_then(ms)
                .ok_or(ReplyError::Shape("bad pttl"))?;
            Ok(Acquired::Held { remaining })
        }
        _ => Err(ReplyError::Shape("unexpected acquire reply")),
    }
}

/// A batch of acquires (`true`) and releases (`false`), in the order of `kinds`:
/// `{id, r₁ … rₙ}`, exactly `n` results, each of its operation's shape or an error text.
pub(crate) fn parse_many(v: &Value, id: &str, kinds: &[bool]) -> Reply<Vec<Item>> {
    let it = items(v, id)?;
    if it.len() != kinds.len() {
        return Err(ReplyError::Shape("wrong number of results in a batch"));
    }
    it.iter()
        .zip(kinds)
        .map(|(r, &acquire)| match r {
            Value::Array(a) if acquire => parse_acquired(a).map(Item::Acquired),
            Value::Int(1) if !acquire => Ok(Item::Released(true)),
            Value::Int(0) if !acquire => Ok(Item::Released(false)),
            _ => as_str(r)
                .filter(|s| !s.is_empty())
                .map(|s| Item::Failed(s.to_owned()))
                .ok_or(ReplyError::Shape("unexpected result in a batch")),
        })
        .collect()
}

/// One lease's answer in a batch renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Renewed {
    Yes,
    NotOwner,
    /// The script's error for this key (its text).
    Failed(String),
}

/// The error of one lease in a batch whose script reported `text` for it: `Corrupt` for
/// the scripts' own `LHCORRUPT` findings, `Other` for anything else.
pub(crate) fn item_error(op: &str, text: &str) -> leasehold_core::StoreError {
    use leasehold_core::{StoreError, StoreErrorKind};
    let kind = if text.starts_with(CORRUPT_CODE) {
        StoreErrorKind::Corrupt
    } else if text.starts_with(FORMAT_CODE) {
        StoreErrorKind::Config
    } else {
        StoreErrorKind::Other
    };
    let text = text
        .strip_prefix(CORRUPT_CODE)
        .or_else(|| text.strip_prefix(FORMAT_CODE))
        .unwrap_or(text)
        .trim_start();
    StoreError::new(kind, crate::BACKEND, format!("{op}: {text}"))
}

/// Batch renewal: `{id, r₁ … rₙ}`, exactly `n` results.
pub(crate) fn parse_renew_many(v: &Value, id: &str, n: usize) -> Reply<Vec<Renewed>> {
    let it = items(v, id)?;
    if it.len() != n {
        return Err(ReplyError::Shape(
            "wrong number of results in a batch renewal",
        ));
    }
    it.iter()
        .map(|r| match (as_int(r), r) {
            (Some(1), Value::Int(_)) => Ok(Renewed::Yes),
            (Some(0), Value::Int(_)) => Ok(Renewed::NotOwner),
            _ => as_str(r)
                .filter(|s| !s.is_empty())
                .map(|s| Renewed::Failed(s.to_owned()))
                .ok_or(ReplyError::Shape("unexpected result in a batch renewal")),
        })
        .collect()
}

/// The watch script: `{id}`.
pub(crate) fn parse_watch(v: &Value, id: &str) -> Reply<()> {
    match items(v, id)? {
        [] => Ok(()),
        _ => Err(ReplyError::Shape("unexpected watch reply")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::bulk;

    /// The reply `{"id", items...}`.
    fn reply(items: Vec<Value>) -> Value {
        let mut v = vec![bulk("id")];
        v.extend(items);
        Value::Array(v)
    }

    #[test]
    fn batch_renewal_replies_are_strict() {
        let ok = reply(vec![
            Value::Int(1),
            Value::Int(0),
            bulk("LHCORRUPT not a lease"),
        ]);
        assert_eq!(
            parse_renew_many(&ok, "id", 3),
            Ok(vec![
                Renewed::Yes,
                Renewed::NotOwner,
                Renewed::Failed("LHCORRUPT not a lease".into())
            ])
        );
        // Another request's reply, a wrong count, a number that is no answer.
        assert_eq!(parse_renew_many(&ok, "other", 3), Err(ReplyError::WrongId));
        assert!(parse_renew_many(&ok, "id", 2).is_err());
        assert!(parse_renew_many(&reply(vec![Value::Int(2)]), "id", 1).is_err());
        assert!(parse_renew_many(&reply(vec![bulk("")]), "id", 1).is_err());
        let e = item_error("renew", "LHCORRUPT the lease key holds a string");
        assert_eq!(e.kind(), leasehold_core::StoreErrorKind::Corrupt);
        assert_eq!(
            item_error("renew", "NOPERM no").kind(),
            leasehold_core::StoreErrorKind::Other
        );
    }

    #[test]
    fn replies_must_echo_the_request_id() {
        let ok = Value::Array(vec![bulk("7"), Value::Int(1)]);
        assert_eq!(parse_flag(&ok, "7"), Ok(true));
        assert_eq!(parse_flag(&ok, "8"), Err(ReplyError::WrongId));
        assert_eq!(
            parse_flag(&Value::Int(1), "7"),
            Err(ReplyError::Shape("not an array"))
        );
        let acq = Value::Array(vec![bulk("9"), Value::Int(1), bulk("42"), Value::Int(1000)]);
        assert_eq!(
            parse_acquire(&acq, "9"),
            Ok(Acquired::Granted {
                fence: Fence(42),
                ttl: Duration::from_secs(1)
            })
        );
        assert_eq!(parse_acquire(&acq, "1"), Err(ReplyError::WrongId));
        let held = Value::Array(vec![bulk("9"), Value::Int(0), Value::Int(250)]);
        assert_eq!(
            parse_acquire(&held, "9"),
            Ok(Acquired::Held {
                remaining: Duration::from_millis(250)
            })
        );
        let held_neg = Value::Array(vec![bulk("9"), Value::Int(0), Value::Int(-1)]);
        assert!(parse_acquire(&held_neg, "9").is_err());
    }

    #[test]
    fn acquire_any_replies_are_strict() {
        let granted = reply(vec![
            Value::Int(1),
            Value::Int(3),
            bulk("42"),
            Value::Int(1000),
        ]);
        assert_eq!(
            parse_acquire_any(&granted, "id", 3),
            Ok(AcquireAnyOutcome::Acquired {
                index: 2,
                fence: Fence(42),
                ttl: Duration::from_secs(1)
            })
        );
        assert_eq!(
            parse_acquire_any(&granted, "other", 3),
            Err(ReplyError::WrongId)
        );
        // An index past the keys sent, or 0 (Lua counts from 1), is no answer.
        assert!(parse_acquire_any(&granted, "id", 2).is_err());
        let zero = reply(vec![
            Value::Int(1),
            Value::Int(0),
            bulk("42"),
            Value::Int(1000),
        ]);
        assert!(parse_acquire_any(&zero, "id", 3).is_err());
        let held = reply(vec![Value::Int(0), Value::Int(250)]);
        assert_eq!(
            parse_acquire_any(&held, "id", 3),
            Ok(AcquireAnyOutcome::Held {
                remaining: Some(Duration::from_millis(250))
            })
        );
        // A single-lease acquire's reply is not an acquire of any.
        let single = reply(vec![Value::Int(1), bulk("42"), Value::Int(1000)]);
        assert!(parse_acquire_any(&single, "id", 3).is_err());
        // Behind a record check: refused with the stored record, or acquire_any's reply.
        let refused = reply(vec![Value::Int(2), bulk("0"), bulk("3")]);
        assert_eq!(
            parse_acquire_any_checked(&refused, "id", 3),
            Ok(CheckedAcquire::Refused(leasehold_core::Record {
                fence: Fence(0),
                value: b"3".to_vec()
            }))
        );
        assert_eq!(
            parse_acquire_any_checked(&refused, "other", 3),
            Err(ReplyError::WrongId)
        );
        assert_eq!(
            parse_acquire_any_checked(&held, "id", 3),
            Ok(CheckedAcquire::Passed(AcquireAnyOutcome::Held {
                remaining: Some(Duration::from_millis(250))
            }))
        );
        let bad_fence = reply(vec![Value::Int(2), bulk("-1"), bulk("3")]);
        assert!(parse_acquire_any_checked(&bad_fence, "id", 3).is_err());
        let short = reply(vec![Value::Int(2), bulk("0")]);
        assert!(parse_acquire_any_checked(&short, "id", 3).is_err());
    }
}
