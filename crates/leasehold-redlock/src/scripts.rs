//! The Lua scripts run on each node, and strict parsing of their replies.
//!
//! Every script takes a request id as `ARGV[1]` and returns it first, so that a reply is
//! never taken for another request's. Scripts raise errors starting `LHCORRUPT` when a
//! key holds something that is not a leasehold lease.

use std::sync::LazyLock;
use std::time::Duration;

use leasehold_core::{Fence, OwnerToken, Record};
use redis::{Script, Value};

/// The error code of a script that found something that is not a leasehold lease.
pub(crate) const CORRUPT_CODE: &str = "LHCORRUPT";

/// Shared helpers. `read_lease(k)` → `false`, `{owner, fence}` or `nil, err`;
/// `read_fence(k)` → the node's last fence (0 if none) or `nil, err`; `clock_floor(last)`
/// → `max(last + 1, TIME in µs)`. Fences stay below 2^53 (exact in Lua's doubles).
const PRELUDE: &str = r#"
local MAXF = 9007199254740992
local function read_lease(k)
  local v = redis.pcall('GET', k)
  if type(v) == 'table' and v.err then
    if string.sub(v.err, 1, 9) == 'WRONGTYPE' then
      return nil, 'LHCORRUPT the lease key holds a value of another type, not a leasehold lease'
    end
    return nil, v.err
  end
  if not v then return false end
  local owner, fence = string.match(v, '^([0-9a-f]+):([1-9][0-9]*)$')
  if owner == nil or #owner ~= 32 or #fence > 16 or tonumber(fence) >= MAXF then
    return nil, 'LHCORRUPT the lease key holds a string that is not a leasehold lease (owner:fence)'
  end
  return {owner, fence}
end
local function read_fence(k)
  local v = redis.pcall('GET', k)
  if type(v) == 'table' and v.err then
    if string.sub(v.err, 1, 9) == 'WRONGTYPE' then
      return nil, 'LHCORRUPT the fence key holds a value of another type'
    end
    return nil, v.err
  end
  if not v then return 0 end
  if not string.match(v, '^[1-9][0-9]*$') or #v > 16 or tonumber(v) >= MAXF then
    return nil, 'LHCORRUPT the fence key holds a value that is not a fence'
  end
  return tonumber(v)
end
local function clock_floor(last)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local f = last + 1
  if now > f then f = now end
  if f >= MAXF then return nil, 'LHCORRUPT the fence would pass 2^53' end
  return f
end
"#;

/// Round one of an acquire. KEYS: lease, fence. ARGV: id, owner, ttl ms.
/// → `{id, 1, fence}`: granted on this node (free: a new candidate fence, `max(last + 1,
/// TIME µs)`, recorded in the lease and the fence key; held by this owner: extended,
/// its recorded fence); `{id, 0, pttl}`: held by another owner.
const ACQUIRE: &str = r#"
local lease, err = read_lease(KEYS[1])
if err then return redis.error_reply(err) end
if lease then
  if lease[1] == ARGV[2] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {ARGV[1], 1, lease[2]}
  end
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then return redis.error_reply('LHCORRUPT the lease key has no expiry') end
  return {ARGV[1], 0, pttl}
end
local last, ferr = read_fence(KEYS[2])
if ferr then return redis.error_reply(ferr) end
local f, nerr = clock_floor(last)
if nerr then return redis.error_reply(nerr) end
local fs = string.format('%d', f)
redis.call('SET', KEYS[2], fs)
redis.call('SET', KEYS[1], ARGV[2] .. ':' .. fs, 'PX', ARGV[3])
return {ARGV[1], 1, fs}
"#;

/// Round two of an acquire: records the chosen fence. KEYS: lease, fence. ARGV: id,
/// owner, fence. → `{id, 1}`: the owner holds the lease here; its lease now carries the
/// fence and the fence key is at least the fence; `{id, 0}`: the owner does not hold it
/// here (nothing changed).
const COMMIT: &str = r#"
local lease, err = read_lease(KEYS[1])
if err then return redis.error_reply(err) end
if not (lease and lease[1] == ARGV[2]) then return {ARGV[1], 0} end
local last, ferr = read_fence(KEYS[2])
if ferr then return redis.error_reply(ferr) end
if tonumber(ARGV[3]) > last then redis.call('SET', KEYS[2], ARGV[3]) end
redis.call('SET', KEYS[1], ARGV[2] .. ':' .. ARGV[3], 'KEEPTTL')
return {ARGV[1], 1}
"#;

/// KEYS: lease. ARGV: id, owner, ttl ms. → `{id, 1}` extended, `{id, 0}` not the owner.
const RENEW: &str = r#"
local lease, err = read_lease(KEYS[1])
if err then return redis.error_reply(err) end
if lease and lease[1] == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {ARGV[1], 1}
end
return {ARGV[1], 0}
"#;

/// KEYS: lease. ARGV: id, owner. → `{id, 1}` deleted, `{id, 0}` not the owner.
const RELEASE: &str = r#"
local lease, err = read_lease(KEYS[1])
if err then return redis.error_reply(err) end
if lease and lease[1] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return {ARGV[1], 1}
end
return {ARGV[1], 0}
"#;

/// KEYS: lease. ARGV: id. → `{id}` free, `{id, owner, fence, pttl}` held.
const INSPECT: &str = r#"
local lease, err = read_lease(KEYS[1])
if err then return redis.error_reply(err) end
if not lease then return {ARGV[1]} end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then return redis.error_reply('LHCORRUPT the lease key has no expiry') end
return {ARGV[1], lease[1], lease[2], pttl}
"#;

/// Round one of a break. KEYS: lease, fence. ARGV: id. Deletes whatever lease is here
/// and advances the fence key past it: `max(last, held) + 1`, floored at TIME µs.
/// → `{id, fence}`. A corrupt lease value is reported, not deleted.
const BREAK: &str = r#"
local lease, err = read_lease(KEYS[1])
if err then return redis.error_reply(err) end
local last, ferr = read_fence(KEYS[2])
if ferr then return redis.error_reply(ferr) end
if lease and tonumber(lease[2]) > last then last = tonumber(lease[2]) end
local f, nerr = clock_floor(last)
if nerr then return redis.error_reply(nerr) end
local fs = string.format('%d', f)
redis.call('SET', KEYS[2], fs)
if lease then redis.call('DEL', KEYS[1]) end
return {ARGV[1], fs}
"#;

/// Round two of a break: raises the fence key to at least the fence. KEYS: fence. ARGV:
/// id, fence. → `{id, 1}`.
const RAISE: &str = r#"
local last, ferr = read_fence(KEYS[1])
if ferr then return redis.error_reply(ferr) end
if tonumber(ARGV[2]) > last then redis.call('SET', KEYS[1], ARGV[2]) end
return {ARGV[1], 1}
"#;

/// The scripts, compiled once.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) commit: Script,
    pub(crate) renew: Script,
    pub(crate) release: Script,
    pub(crate) inspect: Script,
    pub(crate) break_lease: Script,
    pub(crate) raise: Script,
    /// `leasehold-redis`'s record scripts (see `leasehold_redis::records`).
    pub(crate) put_record: Script,
    pub(crate) get_record: Script,
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Script::new(&format!("{PRELUDE}{ACQUIRE}")),
    commit: Script::new(&format!("{PRELUDE}{COMMIT}")),
    renew: Script::new(&format!("{PRELUDE}{RENEW}")),
    release: Script::new(&format!("{PRELUDE}{RELEASE}")),
    inspect: Script::new(&format!("{PRELUDE}{INSPECT}")),
    break_lease: Script::new(&format!("{PRELUDE}{BREAK}")),
    raise: Script::new(&format!("{PRELUDE}{RAISE}")),
    put_record: Script::new(&leasehold_redis::records::put_script()),
    get_record: Script::new(&leasehold_redis::records::get_script()),
});

/// The error code of a script that found a key written in a newer store format.
pub(crate) const FORMAT_CODE: &str = "LHFORMAT";

/// A record script's reply (`leasehold_redis::records::parse_reply`), with its error as
/// this crate's.
pub(crate) fn parse_record(v: &Value, id: &str) -> Result<Option<Record>, ReplyError> {
    leasehold_redis::records::parse_reply(v, id).map_err(record_error)
}

/// A put's reply: always a record.
pub(crate) fn parse_put_record(v: &Value, id: &str) -> Result<Record, ReplyError> {
    leasehold_redis::records::parse_put_reply(v, id).map_err(record_error)
}

fn record_error(e: leasehold_redis::records::ReplyError) -> ReplyError {
    match e {
        leasehold_redis::records::ReplyError::WrongId => ReplyError::WrongId,
        leasehold_redis::records::ReplyError::Shape(what) => ReplyError::Shape(what),
        _ => ReplyError::Shape("unexpected record reply"),
    }
}

/// Why a reply could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReplyError {
    /// The reply does not carry this request's id.
    WrongId,
    /// The reply does not have the script's shape.
    Shape(&'static str),
}

/// One node's answer to round one of an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeGrant {
    /// Granted (or extended) with this fence.
    Granted(Fence),
    /// Held by another owner for this long.
    Held(Duration),
}

fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn as_str(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// A fence as the scripts write it: a positive decimal below 2^53, no leading zero.
pub(crate) fn parse_fence(s: &str) -> Option<Fence> {
    if s.is_empty() || s.len() > 16 || s.starts_with('0') || !s.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let n: u64 = s.parse().ok()?;
    (n < (1u64 << 53)).then_some(Fence(n))
}

fn parse_owner(s: &str) -> Option<OwnerToken> {
    if s.len() != 32 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    s.parse().ok()
}

fn ms(i: i64) -> Option<Duration> {
    u64::try_from(i).ok().map(Duration::from_millis)
}

fn items<'v>(v: &'v Value, id: &str) -> Result<&'v [Value], ReplyError> {
    let Value::Array(items) = v else {
        return Err(ReplyError::Shape("not an array"));
    };
    match items.first().and_then(as_str) {
        Some(got) if got == id => Ok(&items[1..]),
        _ => Err(ReplyError::WrongId),
    }
}

pub(crate) fn parse_acquire(v: &Value, id: &str) -> Result<NodeGrant, ReplyError> {
    match items(v, id)? {
        [flag, f] if as_int(flag) == Some(1) => as_str(f)
            .and_then(parse_fence)
            .map(NodeGrant::Granted)
            .ok_or(ReplyError::Shape("bad fence")),
        [flag, pttl] if as_int(flag) == Some(0) => as_int(pttl)
            .and_then(ms)
            .map(NodeGrant::Held)
            .ok_or(ReplyError::Shape("bad pttl")),
        _ => Err(ReplyError::Shape("unexpected acquire reply")),
    }
}

/// `{id, 1}` or `{id, 0}`.
pub(crate) fn parse_flag(v: &Value, id: &str) -> Result<bool, ReplyError> {
    match items(v, id)? {
        [Value::Int(1)] => Ok(true),
        [Value::Int(0)] => Ok(false),
        _ => Err(ReplyError::Shape("unexpected flag reply")),
    }
}

/// A node's view of a lease: `None` when free, else owner, fence, remaining.
pub(crate) type NodeView = Option<(OwnerToken, Fence, Duration)>;

pub(crate) fn parse_inspect(v: &Value, id: &str) -> Result<NodeView, ReplyError> {
    match items(v, id)? {
        [] => Ok(None),
        [o, f, p] => {
            let owner = as_str(o)
                .and_then(parse_owner)
                .ok_or(ReplyError::Shape("bad owner"))?;
            let fence = as_str(f)
                .and_then(parse_fence)
                .ok_or(ReplyError::Shape("bad fence"))?;
            let remaining = as_int(p)
                .and_then(ms)
                .ok_or(ReplyError::Shape("bad pttl"))?;
            Ok(Some((owner, fence, remaining)))
        }
        _ => Err(ReplyError::Shape("unexpected inspect reply")),
    }
}

pub(crate) fn parse_fence_reply(v: &Value, id: &str) -> Result<Fence, ReplyError> {
    match items(v, id)? {
        [f] => as_str(f)
            .and_then(parse_fence)
            .ok_or(ReplyError::Shape("bad fence")),
        _ => Err(ReplyError::Shape("unexpected fence reply")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn replies_are_strict_and_echo_the_id() {
        let granted = Value::Array(vec![bulk("7"), Value::Int(1), bulk("42")]);
        assert_eq!(
            parse_acquire(&granted, "7"),
            Ok(NodeGrant::Granted(Fence(42)))
        );
        assert_eq!(parse_acquire(&granted, "8"), Err(ReplyError::WrongId));
        let held = Value::Array(vec![bulk("7"), Value::Int(0), Value::Int(250)]);
        assert_eq!(
            parse_acquire(&held, "7"),
            Ok(NodeGrant::Held(Duration::from_millis(250)))
        );
        let neg = Value::Array(vec![bulk("7"), Value::Int(0), Value::Int(-1)]);
        assert!(parse_acquire(&neg, "7").is_err());
        let zero_fence = Value::Array(vec![bulk("7"), Value::Int(1), bulk("0")]);
        assert!(parse_acquire(&zero_fence, "7").is_err());
        assert_eq!(
            parse_flag(&Value::Array(vec![bulk("1"), Value::Int(1)]), "1"),
            Ok(true)
        );
        assert!(parse_flag(&Value::Array(vec![bulk("1"), Value::Int(2)]), "1").is_err());
        assert!(parse_flag(&Value::Int(1), "1").is_err());
        let owner = OwnerToken::random();
        let v = Value::Array(vec![
            bulk("1"),
            bulk(&owner.to_hex()),
            bulk("5"),
            Value::Int(10),
        ]);
        assert_eq!(
            parse_inspect(&v, "1"),
            Ok(Some((owner, Fence(5), Duration::from_millis(10))))
        );
        assert_eq!(parse_inspect(&Value::Array(vec![bulk("1")]), "1"), Ok(None));
        for bad in ["", "0", "01", "-1", "1.5", "9007199254740992"] {
            assert_eq!(parse_fence(bad), None, "{bad}");
        }
    }
}
