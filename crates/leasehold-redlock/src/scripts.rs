//! The Lua scripts run on each node, and strict parsing of their replies.
//!
//! Every script takes a request id as `ARGV[1]` and returns it first, so that a reply is
//! never taken for another request's. Scripts raise errors starting `LHCORRUPT` when a
//! key holds something that is not a leasehold lease, `LHFORMAT` for one written in a
//! newer store format.
//!
//! The Lua helpers that read and write lease and fence keys, the renew and inspect
//! scripts, the record scripts and the reply parsing are `leasehold-redis`'s
//! (`leasehold_redis::wire`, `leasehold_redis::records`): a node holds leases in the
//! single-server format, read and written by the same code.

use std::sync::LazyLock;
use std::time::Duration;

use leasehold_core::{Fence, Record};
use leasehold_redis::records;
pub(crate) use leasehold_redis::wire::{
    Armed, CORRUPT_CODE, FORMAT_CODE, LeaseView as NodeView, ReplyError, eval, eval_cmd, scan_step,
};
use leasehold_redis::wire::{
    INSPECT, LEASE_PRELUDE, RENEW, as_int, as_str, items, ms, parse_fence, parse_fence_reply,
    parse_flag, parse_inspect,
};
use redis::{Script, Value};

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
local f, nerr = next_fence(last)
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

/// Round one of a break. KEYS: lease, fence. ARGV: id. Deletes whatever lease is here
/// and advances the fence key past it: `max(last, held) + 1`, floored at TIME µs.
/// → `{id, fence}`. A corrupt lease value is reported, not deleted.
const BREAK: &str = r#"
local lease, err = read_lease(KEYS[1])
if err then return redis.error_reply(err) end
local last, ferr = read_fence(KEYS[2])
if ferr then return redis.error_reply(ferr) end
if lease and tonumber(lease[2]) > last then last = tonumber(lease[2]) end
local f, nerr = next_fence(last)
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

/// A script, compiled once (its SHA1 computed once), and the parser of its reply.
#[derive(Debug)]
pub(crate) struct Lua<T> {
    pub(crate) script: Script,
    pub(crate) parse: fn(&Value, &str) -> Result<T, ReplyError>,
}

impl<T> Lua<T> {
    fn new(text: &str, parse: fn(&Value, &str) -> Result<T, ReplyError>) -> Self {
        Self {
            script: Script::new(text),
            parse,
        }
    }
}

/// The scripts.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire: Lua<NodeGrant>,
    pub(crate) commit: Lua<bool>,
    pub(crate) renew: Lua<bool>,
    pub(crate) release: Lua<bool>,
    pub(crate) inspect: Lua<NodeView>,
    pub(crate) break_lease: Lua<Fence>,
    pub(crate) raise: Lua<bool>,
    /// `leasehold-redis`'s record scripts (see `leasehold_redis::records`).
    pub(crate) put_record: Lua<Record>,
    pub(crate) get_record: Lua<Option<Record>>,
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: Lua::new(&format!("{LEASE_PRELUDE}{ACQUIRE}"), parse_acquire),
    commit: Lua::new(&format!("{LEASE_PRELUDE}{COMMIT}"), parse_flag),
    renew: Lua::new(&format!("{LEASE_PRELUDE}{RENEW}"), parse_flag),
    release: Lua::new(&format!("{LEASE_PRELUDE}{RELEASE}"), parse_flag),
    inspect: Lua::new(&format!("{LEASE_PRELUDE}{INSPECT}"), parse_inspect),
    break_lease: Lua::new(&format!("{LEASE_PRELUDE}{BREAK}"), parse_fence_reply),
    raise: Lua::new(&format!("{LEASE_PRELUDE}{RAISE}"), parse_flag),
    put_record: Lua::new(&records::put_script(), records::parse_put_reply),
    get_record: Lua::new(&records::get_script(), records::parse_reply),
});

/// One node's answer to round one of an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeGrant {
    /// Granted (or extended) with this fence.
    Granted(Fence),
    /// Held by another owner for this long.
    Held(Duration),
}

fn parse_acquire(v: &Value, id: &str) -> Result<NodeGrant, ReplyError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn acquire_replies_are_strict_and_echo_the_id() {
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
    }
}
