//! What `leasehold-redis` and `leasehold-redlock` share of the store format: the Lua
//! helpers that read and write lease and fence keys, the scripts both run unchanged, the
//! error codes the scripts raise, and the strict parsing of their replies; and the guard
//! both put on a request in flight ([`Armed`]).
//!
//! Public so that `leasehold-redlock` runs the very same code on each of its nodes (one
//! format, one parser, one set of error texts); not meant for other callers.
//!
//! A lease key `k` is the Redis key `<prefix>{<encode_key(k)>}` (see [`encode_key`]), which
//! `list` finds with `SCAN MATCH` and names back with [`decode_key`].
//!
//! A lease key holds `<owner>:<fence>` (32 lowercase hex digits, a decimal fence) with a
//! millisecond expiry; a fence key holds the last fence granted. Fences stay below 2^53 so
//! that Lua's doubles hold them exactly (the clock floor is about 1.8e15 today; 2^53 µs is
//! in the year 2255); a larger stored value is reported as corrupt rather than rounded.
//!
//! Every script takes a request id as `ARGV[1]` and returns it as the first element of its
//! reply; the parsers check it, so a reply is never taken for the reply to another request.

use std::time::Duration;

use leasehold_core::{Fence, Key, OwnerToken};
use redis::{Script, Value};

/// Percent-encodes `%`, `{` and `}` of a lease key: the part of its Redis key between the
/// braces, so that it is exactly the Cluster hash tag and no user key can make two Redis
/// keys collide. Injective and prefix-preserving.
pub fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 8);
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

/// Reverses [`encode_key`]; `None` for anything `encode_key` cannot produce.
pub fn decode_key(enc: &str) -> Option<String> {
    let mut out = String::with_capacity(enc.len());
    let mut rest = enc;
    while let Some(i) = rest.find(['%', '{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let c = match tail.get(..3) {
            Some("%25") => '%',
            Some("%7B") => '{',
            Some("%7D") => '}',
            _ => return None,
        };
        out.push(c);
        rest = &tail[3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The lease key of `key` in the namespace `prefix`: `<prefix>{<encode_key(key)>}`.
pub fn lease_key(prefix: &str, key: &Key) -> String {
    format!("{prefix}{{{}}}", encode_key(key.as_str()))
}

/// The `SCAN MATCH` pattern of the lease keys in the namespace `prefix` whose key starts
/// with `key_prefix`.
pub fn scan_pattern(prefix: &str, key_prefix: &str) -> String {
    format!(
        "{}{{{}*",
        glob_escape(prefix),
        glob_escape(&encode_key(key_prefix))
    )
}

/// The key whose [`lease_key`] in the namespace `prefix` is `redis_key` (found by a scan),
/// if it is a lease key: not a fence or record key beside one, not a foreign key that
/// happens to match.
pub fn parse_lease_key(prefix: &str, redis_key: &str) -> Option<Key> {
    let inner = redis_key
        .strip_prefix(prefix)?
        .strip_prefix('{')?
        .strip_suffix('}')?;
    if inner.contains('}') {
        return None;
    }
    Key::new(decode_key(inner)?).ok()
}

/// Escapes the glob characters of `SCAN MATCH` (`*?[]\`).
pub fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The error code of a script that found something that is not a leasehold lease, fence
/// or record.
pub const CORRUPT_CODE: &str = "LHCORRUPT";

/// The error code of a script that found a key written in a newer store format (a value
/// starting `v<N>|`): this client must be upgraded.
pub const FORMAT_CODE: &str = "LHFORMAT";

/// The Lua helpers of every script that reads or writes a lease or fence key:
///
/// * `get_string(k, what)` → the string at `k`, `false` (no key), or `nil, err`: another
///   type is `LHCORRUPT`, a value written in a newer store format (`v<N>|…`) `LHFORMAT`,
///   any other error of `GET` (`NOPERM`, …) passed through. `what` names the key in the
///   error (`lease`, `fence`, `record`).
/// * `read_lease(k)` → `false` (no lease), `{owner, fence}`, or `nil, err`.
/// * `read_fence(k)` → the last fence as a number (0 if none), or `nil, err`.
/// * `next_fence(last)` → `max(last + 1, TIME in µs)`, or `nil, err`.
pub const LEASE_PRELUDE: &str = r#"
local MAXF = 9007199254740992
local function get_string(k, what)
  local v = redis.pcall('GET', k)
  if not v then return false end
  if type(v) == 'table' and v.err then
    if string.sub(v.err, 1, 9) == 'WRONGTYPE' then
      return nil, 'LHCORRUPT the ' .. what .. ' key holds a value of another type (not a string), not a leasehold ' .. what
    end
    return nil, v.err
  end
  -- Only a value that starts with 'v' (byte 118) can be a newer format's.
  local ver = string.byte(v) == 118 and string.match(v, '^v([0-9]+)|')
  if ver then
    return nil, 'LHFORMAT the ' .. what .. ' key was written in leasehold store format ' .. ver .. ', newer than this client (format 1): upgrade this client, or keep older and newer clients off the same keys'
  end
  return v
end
local function read_lease(k)
  local v, err = get_string(k, 'lease')
  if not v then return v, err end
  local owner, fence = string.match(v, '^([0-9a-f]+):([1-9][0-9]*)$')
  if owner == nil or #owner ~= 32 or #fence > 16 or tonumber(fence) >= MAXF then
    return nil, 'LHCORRUPT the lease key holds a string that is not a leasehold lease (owner:fence)'
  end
  return {owner, fence}
end
local function read_fence(k)
  local v, err = get_string(k, 'fence')
  if err then return nil, err end
  if not v then return 0 end
  if not string.match(v, '^[1-9][0-9]*$') or #v > 16 or tonumber(v) >= MAXF then
    return nil, 'LHCORRUPT the fence key holds a value that is not a fence (a positive integer below 2^53)'
  end
  return tonumber(v)
end
local function next_fence(last)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local f = last + 1
  if now > f then f = now end
  if f >= MAXF then return nil, 'LHCORRUPT the fence would pass 2^53' end
  return f
end
"#;

/// Renew, after [`LEASE_PRELUDE`]. KEYS: lease. ARGV: id, owner, ttl ms. → `{id, 1}`
/// extended, `{id, 0}` not the owner. Parse with [`parse_flag`].
pub const RENEW: &str = r#"
local lease, err = read_lease(KEYS[1])
if err then return redis.error_reply(err) end
if lease and lease[1] == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {ARGV[1], 1}
end
return {ARGV[1], 0}
"#;

/// Inspect, after [`LEASE_PRELUDE`]. KEYS: lease. ARGV: id. → `{id}` free, `{id, owner,
/// fence, pttl}` held. Parse with [`parse_inspect`].
pub const INSPECT: &str = r#"
local lease, err = read_lease(KEYS[1])
if err then return redis.error_reply(err) end
if not lease then return {ARGV[1]} end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then return redis.error_reply('LHCORRUPT the lease key has no expiry') end
return {ARGV[1], lease[1], lease[2], pttl}
"#;

/// The `EVALSHA` of `script` with `keys` and `[id] + args` (every script takes its request
/// id first): the command `ScriptInvocation::invoke_async` sends, byte for byte, built at
/// once (an invocation first copies each key and argument into a vector of its own, then
/// all of them again into the command: a dozen allocations per operation, issue 29). Send
/// it with [`eval`].
pub fn eval_cmd<A: AsRef<[u8]>>(
    script: &Script,
    keys: &[&str],
    id: &str,
    args: &[A],
) -> redis::Cmd {
    let hash = script.get_hash();
    let data = keys.iter().map(|k| k.len()).sum::<usize>()
        + id.len()
        + args.iter().map(|a| a.as_ref().len()).sum::<usize>()
        + "EVALSHA".len()
        + hash.len()
        + 4; // the number of keys
    let mut cmd = redis::Cmd::with_capacity(3 + keys.len() + 1 + args.len(), data);
    cmd.arg("EVALSHA").arg(hash.as_bytes()).arg(keys.len());
    for k in keys {
        cmd.arg(*k);
    }
    cmd.arg(id);
    for a in args {
        cmd.arg(a.as_ref());
    }
    cmd
}

/// Sends `cmd` (an [`eval_cmd`] of `script`) as `ScriptInvocation::invoke_async` does: on
/// `NOSCRIPT` (the server lost its script cache), `SCRIPT LOAD` and the same call again.
///
/// # Cancel safety
/// As the command's: a dropped call may have been applied.
pub async fn eval(
    script: &Script,
    cmd: &redis::Cmd,
    con: &mut impl redis::aio::ConnectionLike,
) -> redis::RedisResult<Value> {
    match cmd.query_async(con).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(con).await?;
            cmd.query_async(con).await
        }
        other => other,
    }
}

/// One step of a scan for the keys matching `pattern` (see [`glob_escape`]), from `cursor`.
pub fn scan_step(cursor: u64, pattern: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(500);
    cmd
}

/// Runs its action when dropped, unless disarmed first. The guard of a request in flight:
/// a request future dropped (cancelled by its caller) between sending and its reply leaves
/// the connection suspect (a reply still on its way would be taken for the next
/// request's), so the action drops the connection; the request's end disarms it.
pub struct Armed<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Armed<F> {
    /// A guard that runs `action` if it is dropped armed.
    pub fn new(action: F) -> Self {
        Self(Some(action))
    }

    /// Ends the guard without running its action.
    pub fn disarm(mut self) {
        self.0 = None;
    }
}

impl<F: FnOnce()> Drop for Armed<F> {
    fn drop(&mut self) {
        if let Some(action) = self.0.take() {
            action();
        }
    }
}

impl<F: FnOnce()> std::fmt::Debug for Armed<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Armed").field(&self.0.is_some()).finish()
    }
}

/// Why a script's reply was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyError {
    /// The reply does not carry this request's id: it belongs to another request.
    WrongId,
    /// The reply does not have the shape the script returns (what is wrong).
    Shape(&'static str),
}

/// A parsed reply, or why it was refused.
pub type Reply<T> = Result<T, ReplyError>;

/// An integer reply, or a string holding one.
pub fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// A UTF-8 string reply.
pub fn as_str(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// A lease's fence as the scripts write it: a positive decimal below 2^53, no leading
/// zero.
pub fn parse_fence(s: &str) -> Option<Fence> {
    if s.is_empty() || s.len() > 16 || s.starts_with('0') || !s.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let n: u64 = s.parse().ok()?;
    (n < (1u64 << 53)).then_some(Fence(n))
}

/// An owner as the scripts write it: 32 lowercase hex digits.
pub fn parse_owner(s: &str) -> Option<OwnerToken> {
    if s.len() != 32 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    s.parse().ok()
}

/// Milliseconds (a `PTTL`, a TTL), never negative.
pub fn ms(i: i64) -> Option<Duration> {
    u64::try_from(i).ok().map(Duration::from_millis)
}

/// Splits `{id, rest...}`, checking the id.
///
/// # Errors
/// [`ReplyError::WrongId`] for another request's reply, [`ReplyError::Shape`] for a reply
/// that is not an array.
pub fn items<'v>(v: &'v Value, id: &str) -> Reply<&'v [Value]> {
    let Value::Array(items) = v else {
        return Err(ReplyError::Shape("not an array"));
    };
    match items.first().and_then(as_str) {
        Some(got) if got == id => Ok(&items[1..]),
        _ => Err(ReplyError::WrongId),
    }
}

/// `{id, 1}` → `true`, `{id, 0}` → `false` (renew, release).
///
/// # Errors
/// As [`items`], and [`ReplyError::Shape`] for any other reply.
pub fn parse_flag(v: &Value, id: &str) -> Reply<bool> {
    match items(v, id)? {
        [flag] if as_int(flag) == Some(1) => Ok(true),
        [flag] if as_int(flag) == Some(0) => Ok(false),
        _ => Err(ReplyError::Shape("unexpected flag reply")),
    }
}

/// A lease as [`INSPECT`] reports it: `None` when free, else owner, fence, remaining.
pub type LeaseView = Option<(OwnerToken, Fence, Duration)>;

/// [`INSPECT`]'s reply.
///
/// # Errors
/// As [`items`], and [`ReplyError::Shape`] for a bad owner, fence or pttl.
pub fn parse_inspect(v: &Value, id: &str) -> Reply<LeaseView> {
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

/// `{id, fence}` (a break).
///
/// # Errors
/// As [`items`], and [`ReplyError::Shape`] for any other reply.
pub fn parse_fence_reply(v: &Value, id: &str) -> Reply<Fence> {
    match items(v, id)? {
        [f] => as_str(f)
            .and_then(parse_fence)
            .ok_or(ReplyError::Shape("bad fence")),
        _ => Err(ReplyError::Shape("unexpected fence reply")),
    }
}

/// The value of `field` in the text of an `INFO` reply (`field:value` lines), trimmed.
pub fn info_field<'t>(text: &'t str, field: &str) -> Option<&'t str> {
    text.lines().find_map(|l| {
        l.trim_end_matches('\r')
            .strip_prefix(field)?
            .strip_prefix(':')
            .map(str::trim)
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A bulk string reply (the tests of the crate's reply parsers build replies of these).
    pub(crate) fn bulk(s: impl AsRef<[u8]>) -> Value {
        Value::BulkString(s.as_ref().to_vec())
    }

    #[test]
    fn fences_are_strict() {
        assert_eq!(parse_fence("1"), Some(Fence(1)));
        assert_eq!(
            parse_fence("1764000000000000"),
            Some(Fence(1_764_000_000_000_000))
        );
        assert_eq!(parse_fence("9007199254740991"), Some(Fence((1 << 53) - 1)));
        for bad in [
            "",
            "0",
            "01",
            "-1",
            "+1",
            "1.5",
            "1e5",
            " 1",
            "9007199254740992",
            "99999999999999999",
        ] {
            assert_eq!(parse_fence(bad), None, "{bad}");
        }
    }

    #[test]
    fn owners_are_strict() {
        let owner = OwnerToken::random();
        assert_eq!(parse_owner(&owner.to_hex()), Some(owner));
        assert_eq!(parse_owner(&owner.to_hex().to_uppercase()), None);
        assert_eq!(parse_owner(&owner.to_hex()[1..]), None);
        assert_eq!(parse_owner(&format!("{}0", owner.to_hex())), None);
    }

    #[test]
    fn replies_echo_the_id_and_have_their_shape() {
        let flag = |f| Value::Array(vec![bulk("7"), Value::Int(f)]);
        assert_eq!(parse_flag(&flag(1), "7"), Ok(true));
        assert_eq!(parse_flag(&flag(0), "7"), Ok(false));
        assert_eq!(parse_flag(&flag(1), "8"), Err(ReplyError::WrongId));
        assert!(parse_flag(&flag(2), "7").is_err());
        assert!(parse_flag(&Value::Int(1), "7").is_err());
        assert!(parse_flag(&Value::Array(vec![bulk("7")]), "7").is_err());

        let owner = OwnerToken::random();
        let held = |pttl| {
            Value::Array(vec![
                bulk("1"),
                bulk(owner.to_hex()),
                bulk("5"),
                Value::Int(pttl),
            ])
        };
        assert_eq!(
            parse_inspect(&held(10), "1"),
            Ok(Some((owner, Fence(5), Duration::from_millis(10))))
        );
        assert_eq!(parse_inspect(&held(10), "2"), Err(ReplyError::WrongId));
        assert!(parse_inspect(&held(-1), "1").is_err());
        assert_eq!(parse_inspect(&Value::Array(vec![bulk("1")]), "1"), Ok(None));
        let two = Value::Array(vec![bulk("1"), bulk(owner.to_hex()), bulk("5")]);
        assert!(parse_inspect(&two, "1").is_err());

        let fence = |f: &str| Value::Array(vec![bulk("3"), bulk(f)]);
        assert_eq!(parse_fence_reply(&fence("42"), "3"), Ok(Fence(42)));
        assert_eq!(
            parse_fence_reply(&fence("42"), "4"),
            Err(ReplyError::WrongId)
        );
        assert!(parse_fence_reply(&fence("0"), "3").is_err());
    }
}

#[cfg(test)]
mod eval_tests {
    use super::*;

    /// The command is the one an invocation sends, byte for byte (`ScriptInvocation`'s
    /// `eval_cmd`, private to the redis crate: `EVALSHA`, the hash, the number of keys,
    /// the keys, the arguments).
    #[test]
    fn eval_cmd_is_the_invocations_command() {
        let script = Script::new("return KEYS[1]");
        let keys = ["p{a}", "p{a}:fence", ""];
        let args: [&[u8]; 3] = [b"x", b"", b"\x00\xff"];
        let ours = eval_cmd(&script, &keys, "17", &args);
        let mut theirs = redis::cmd("EVALSHA");
        theirs
            .arg(script.get_hash())
            .arg(keys.len())
            .arg(&keys[..])
            .arg("17")
            .arg(&args[..]);
        assert_eq!(ours.get_packed_command(), theirs.get_packed_command());
    }
}
