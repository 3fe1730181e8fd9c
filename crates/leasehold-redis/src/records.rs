//! Fenced records ([`Store::put_record`](leasehold_core::Store::put_record)): the Lua
//! scripts and the strict parsing of their replies.
//!
//! The scripts and the parser are public so that `leasehold-redlock` runs the very same
//! scripts on each of its nodes; they are not meant for other callers.
//!
//! A record is one Redis string, `<fence>:<value>`, where `<fence>` is the fence in
//! decimal without leading zeros (`0` ..= `18446744073709551615`) and `<value>` the
//! value's bytes as given (any bytes, at most [`MAX_RECORD_LEN`]). It never expires.
//! Fences are compared as decimal strings (by length, then byte by byte), never with
//! `tonumber`: Lua numbers are doubles and lose exactness above 2^53, and Lua's string
//! `<` follows the server's collation locale.
//!
//! Like the lease scripts, both scripts take a request id as `ARGV[1]` and return it
//! first. Errors: `LHCORRUPT ...` for a key of another type or a string that is not a
//! record, `LHFORMAT ...` for a record written in a newer store format (`v<N>|...`).

use leasehold_core::{Fence, MAX_RECORD_LEN, Record};
use redis::Value;

use crate::wire::LEASE_PRELUDE;

/// Helpers of both record scripts, after [`LEASE_PRELUDE`] (`get_string`): `dec_lt(a, b)`
/// (a < b for canonical decimals), `is_fence(s)`, `read_record(k)` → `false` (none),
/// `{fence, value}`, or `nil, err`.
pub(crate) const PRELUDE: &str = r#"
local MAXREC = 4096
local U64MAX = '18446744073709551615'
local function dec_lt(a, b)
  if #a ~= #b then return #a < #b end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return false
end
local function is_fence(s)
  if s == '0' then return true end
  if #s > 20 or not string.match(s, '^[1-9][0-9]*$') then return false end
  return not dec_lt(U64MAX, s)
end
local function read_record(k)
  local v, err = get_string(k, 'record')
  if not v then return v, err end
  local f = string.match(v, '^([0-9]+):')
  if f == nil or not is_fence(f) or #v - #f - 1 > MAXREC then
    return nil, 'LHCORRUPT the record key holds a string that is not a leasehold record (fence:value)'
  end
  return {f, string.sub(v, #f + 2)}
end
"#;

/// KEYS: record, and optionally the key's watch mark. ARGV: id, fence (canonical decimal),
/// value, and with the watch mark the channel (`S <channel>` for `SPUBLISH`).
/// → `{id, fence, value}`: the record stored after the call — ours when none was stored
/// or the stored fence is lower (then written), else the stored one, unchanged. A write
/// while the watch mark exists is told on the channel as `~` (`leasehold-redis`'s
/// watchers; see its crate docs).
const PUT: &str = r#"
if not is_fence(ARGV[2]) or #ARGV[3] > MAXREC then
  return redis.error_reply('ERR leasehold put_record: the fence is not a canonical decimal u64 or the value is longer than 4096 bytes')
end
local rec, err = read_record(KEYS[1])
if err then return redis.error_reply(err) end
if rec and not dec_lt(rec[1], ARGV[2]) then
  return {ARGV[1], rec[1], rec[2]}
end
redis.call('SET', KEYS[1], ARGV[2] .. ':' .. ARGV[3])
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then
  local chan = ARGV[4]
  if string.sub(chan, 1, 2) == 'S ' then
    redis.call('SPUBLISH', string.sub(chan, 3), '~')
  else
    redis.call('PUBLISH', chan, '~')
  end
end
return {ARGV[1], ARGV[2], ARGV[3]}
"#;

/// KEYS: record. ARGV: id. → `{id}` none, `{id, fence, value}` stored.
const GET: &str = r#"
local rec, err = read_record(KEYS[1])
if err then return redis.error_reply(err) end
if not rec then return {ARGV[1]} end
return {ARGV[1], rec[1], rec[2]}
"#;

/// The whole Lua source of the put script (`EVALSHA` it with the record key as `KEYS[1]`
/// and `id, fence, value` as `ARGV`; see the module docs). Writes one key: `GET` and
/// `SET` are the only commands it runs when called so. (`leasehold-redis` also passes
/// the key's watch mark as `KEYS[2]` and its channel as `ARGV[4]`: a write then also runs
/// `EXISTS` on the mark, and `PUBLISH` or `SPUBLISH` while it exists.)
pub fn put_script() -> String {
    format!("{LEASE_PRELUDE}{PRELUDE}{PUT}")
}

/// The whole Lua source of the get script (`KEYS[1]`: the record key; `ARGV`: `id`).
/// Writes nothing: `GET` is the only command it runs.
pub fn get_script() -> String {
    format!("{LEASE_PRELUDE}{PRELUDE}{GET}")
}

/// The fence as the scripts take it: decimal, no leading zeros.
pub fn fence_arg(fence: Fence) -> String {
    fence.0.to_string()
}

pub use crate::wire::ReplyError;

/// A fence as the scripts write it: `0`, or a decimal without leading zeros, within u64.
fn parse_fence(b: &[u8]) -> Option<Fence> {
    if b.is_empty() || b.len() > 20 || (b.len() > 1 && b[0] == b'0') {
        return None;
    }
    if !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse::<u64>().ok().map(Fence)
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// Parses the reply of either script sent with request id `id`: `{id}` → `None`,
/// `{id, fence, value}` → the record.
///
/// # Errors
/// [`ReplyError::WrongId`] for another request's reply, [`ReplyError::Shape`] for
/// anything the scripts do not return (a bad fence, a value over [`MAX_RECORD_LEN`]).
pub fn parse_reply(v: &Value, id: &str) -> Result<Option<Record>, ReplyError> {
    let Value::Array(items) = v else {
        return Err(ReplyError::Shape("not an array"));
    };
    match items.first().and_then(bytes) {
        Some(got) if got == id.as_bytes() => {}
        _ => return Err(ReplyError::WrongId),
    }
    match &items[1..] {
        [] => Ok(None),
        [f, value] => parse_record(f, value).map(Some),
        _ => Err(ReplyError::Shape("unexpected record reply")),
    }
}

/// A record as the scripts return it: its fence and its value.
pub(crate) fn parse_record(f: &Value, value: &Value) -> Result<Record, ReplyError> {
    let fence = bytes(f)
        .and_then(parse_fence)
        .ok_or(ReplyError::Shape("bad record fence"))?;
    let value = bytes(value).ok_or(ReplyError::Shape("bad record value"))?;
    if value.len() > MAX_RECORD_LEN {
        return Err(ReplyError::Shape("record value too long"));
    }
    Ok(Record {
        fence,
        value: value.to_vec(),
    })
}

/// Parses a put's reply: always a record.
///
/// # Errors
/// As [`parse_reply`], and [`ReplyError::Shape`] for a reply without a record.
pub fn parse_put_reply(v: &Value, id: &str) -> Result<Record, ReplyError> {
    parse_reply(v, id)?.ok_or(ReplyError::Shape("a put returned no record"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::bulk;

    #[test]
    fn fences_are_canonical_u64() {
        assert_eq!(parse_fence(b"0"), Some(Fence(0)));
        assert_eq!(parse_fence(b"7"), Some(Fence(7)));
        assert_eq!(parse_fence(b"18446744073709551615"), Some(Fence(u64::MAX)));
        for bad in [
            &b""[..],
            b"00",
            b"07",
            b"-1",
            b"1.5",
            b"1e5",
            b" 1",
            b"18446744073709551616",
            b"99999999999999999999",
            b"100000000000000000000",
        ] {
            assert_eq!(parse_fence(bad), None, "{bad:?}");
        }
        assert_eq!(fence_arg(Fence(u64::MAX >> 1)), "9223372036854775807");
    }

    #[test]
    fn replies_are_strict() {
        let ok = Value::Array(vec![bulk(b"4"), bulk(b"9"), bulk(b"\0\xff")]);
        assert_eq!(
            parse_reply(&ok, "4"),
            Ok(Some(Record {
                fence: Fence(9),
                value: vec![0, 255]
            }))
        );
        assert_eq!(parse_reply(&ok, "5"), Err(ReplyError::WrongId));
        assert_eq!(parse_reply(&Value::Array(vec![bulk(b"4")]), "4"), Ok(None));
        assert!(parse_put_reply(&Value::Array(vec![bulk(b"4")]), "4").is_err());
        let empty = Value::Array(vec![bulk(b"4"), bulk(b"1"), bulk(b"")]);
        assert_eq!(
            parse_put_reply(&empty, "4").map(|r| r.value),
            Ok(Vec::new())
        );
        let long = Value::Array(vec![
            bulk(b"4"),
            bulk(b"1"),
            bulk(vec![b'x'; MAX_RECORD_LEN + 1]),
        ]);
        assert!(parse_reply(&long, "4").is_err());
        let three = Value::Array(vec![bulk(b"4"), bulk(b"1"), bulk(b""), bulk(b"")]);
        assert!(parse_reply(&three, "4").is_err());
        assert!(parse_reply(&Value::Int(1), "4").is_err());
        let int_fence = Value::Array(vec![bulk(b"4"), Value::Int(1), bulk(b"")]);
        assert!(parse_reply(&int_fence, "4").is_err());
    }
}
