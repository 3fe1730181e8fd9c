//! Store format and upgrades: clients of the previous release (store format 1, before
//! the waiting queue) and of this one share keys safely, and a key written in a newer
//! format is refused with a clear error.
//!
//! The "old client" runs the previous release's acquire and release scripts, exactly as
//! that release shipped them (below), against the same server.

mod common;

use std::time::Duration;

use common::Standalone;
use leasehold_core::{
    AcquireOutcome, Fence, Key, OwnerToken, ReleaseOutcome, Store, StoreErrorKind,
};
use leasehold_core::{WaitStore, WatchStore};
use tokio::time::{Instant, sleep, timeout};

/// The previous release's shared Lua helpers (format 1).
const OLD_PRELUDE: &str = r#"
local MAXF = 9007199254740992
local function read_lease(k)
  local v = redis.pcall('GET', k)
  if type(v) == 'table' and v.err then
    if string.sub(v.err, 1, 9) == 'WRONGTYPE' then
      return nil, 'LHCORRUPT the lease key holds a value of another type (not a string), not a leasehold lease'
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
      return nil, 'LHCORRUPT the fence key holds a value of another type (not a string)'
    end
    return nil, v.err
  end
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

/// The previous release's acquire. KEYS: lease, fence. ARGV: id, owner, ttl ms, fence
/// record expiry ms.
const OLD_ACQUIRE: &str = r#"
local lease, err = read_lease(KEYS[1])
if err then return redis.error_reply(err) end
if lease then
  if lease[1] == ARGV[2] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {ARGV[1], 1, lease[2], tonumber(ARGV[3])}
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
if ARGV[4] == '' then
  redis.call('SET', KEYS[2], fs)
else
  redis.call('SET', KEYS[2], fs, 'PX', ARGV[4])
end
redis.call('SET', KEYS[1], ARGV[2] .. ':' .. fs, 'PX', ARGV[3])
return {ARGV[1], 1, fs, tonumber(ARGV[3])}
"#;

/// The previous release's release. KEYS: lease. ARGV: id, owner, channel.
const OLD_RELEASE: &str = r#"
local lease, err = read_lease(KEYS[1])
if err then return redis.error_reply(err) end
if lease and lease[1] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], lease[2]) end
  return {ARGV[1], 1}
end
return {ARGV[1], 0}
"#;

/// An old client on the server (directly, not through the proxy).
struct Old {
    conn: redis::aio::MultiplexedConnection,
    acquire: redis::Script,
    release: redis::Script,
}

impl Old {
    async fn new(s: &Standalone) -> Self {
        let client = redis::Client::open(s.server.url()).unwrap();
        Self {
            conn: client.get_multiplexed_async_connection().await.unwrap(),
            acquire: redis::Script::new(&format!("{OLD_PRELUDE}{OLD_ACQUIRE}")),
            release: redis::Script::new(&format!("{OLD_PRELUDE}{OLD_RELEASE}")),
        }
    }

    /// `Some(fence)` granted, `None` held by another owner.
    async fn acquire(&mut self, s: &Standalone, k: &Key, owner: &OwnerToken) -> Option<Fence> {
        let v: redis::Value = self
            .acquire
            .key(s.store.lease_key(k))
            .key(s.store.fence_key(k))
            .arg("1")
            .arg(owner.to_hex())
            .arg(5000)
            .arg("")
            .invoke_async(&mut self.conn)
            .await
            .unwrap();
        let redis::Value::Array(items) = v else {
            panic!("{v:?}")
        };
        match &items[1] {
            redis::Value::Int(1) => match &items[2] {
                redis::Value::BulkString(b) => {
                    Some(Fence(std::str::from_utf8(b).unwrap().parse().unwrap()))
                }
                other => panic!("{other:?}"),
            },
            redis::Value::Int(0) => None,
            other => panic!("{other:?}"),
        }
    }

    async fn release(&mut self, s: &Standalone, k: &Key, owner: &OwnerToken) -> bool {
        let channel = format!("{}:released", s.store.lease_key(k));
        let v: redis::Value = self
            .release
            .key(s.store.lease_key(k))
            .arg("2")
            .arg(owner.to_hex())
            .arg(channel)
            .invoke_async(&mut self.conn)
            .await
            .unwrap();
        let redis::Value::Array(items) = v else {
            panic!("{v:?}")
        };
        items[1] == redis::Value::Int(1)
    }
}

fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

const TTL: Duration = Duration::from_secs(5);

/// An old and a new client on the same key exclude each other, both ways; fences keep
/// rising across them; a waiter of the new release is woken by an old client's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_and_new_clients_exclude_each_other_on_the_same_key() {
    let s = Standalone::start().await;
    let mut old = Old::new(&s).await;
    let k = key("upgrade:shared");
    let (a, b) = (OwnerToken::random(), OwnerToken::random());

    // Old holds: the new client is turned away.
    let f_old = old
        .acquire(&s, &k, &a)
        .await
        .expect("old grants on a free key");
    match s.store.acquire(&k, &b, TTL).await.unwrap() {
        AcquireOutcome::Held { .. } => {}
        other => panic!("the new client got past an old holder: {other:?}"),
    }
    let info = s.store.inspect(&k).await.unwrap().expect("held");
    assert_eq!((info.owner, info.fence), (a, f_old));

    // A new waiter is woken by the old client's release (it publishes a fence).
    let waiter = {
        let (store, k) = (s.store.clone(), k.clone());
        tokio::spawn(async move {
            store
                .wait_released(&k, &b, Duration::from_secs(30))
                .await
                .unwrap();
            Instant::now()
        })
    };
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    let released_at = Instant::now();
    assert!(old.release(&s, &k, &a).await);
    let woke = timeout(Duration::from_secs(3), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(woke >= released_at);

    // New holds, with a fence above the old one: the old client is turned away.
    let f_new = match s.store.acquire(&k, &b, TTL).await.unwrap() {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("{other:?}"),
    };
    assert!(
        f_new > f_old,
        "fences rise across clients: {f_old:?} then {f_new:?}"
    );
    assert_eq!(
        old.acquire(&s, &k, &a).await,
        None,
        "the old client got past a new holder"
    );
    assert!(!old.release(&s, &k, &a).await);
    assert_eq!(
        s.store.release(&k, &b).await.unwrap(),
        ReleaseOutcome::Released
    );

    // And the old client after the new one: its fence rises too.
    let f_again = old.acquire(&s, &k, &a).await.expect("free again");
    assert!(f_again > f_new);
}

/// A watched key and an old client, which does not know the watch mark: it acquires
/// the watched key as on any other (the mark changes nothing it reads), and its grant is
/// not notified — an observer sees it at its next read (`observe`'s interval); the new
/// client is still turned away while it holds. Its release publishes its fence (that
/// release's own message), which the watcher takes as a notice; the new client's grant
/// after it is notified as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_clients_grant_on_a_watched_key_is_not_notified_and_still_excludes() {
    use futures::StreamExt;
    let s = Standalone::start().await;
    let mut old = Old::new(&s).await;
    let k = key("upgrade:watched");
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    let mut changes = s.store.watch(&k).await.unwrap();
    let f_old = old
        .acquire(&s, &k, &a)
        .await
        .expect("old grants on a watched key");
    assert!(
        timeout(Duration::from_millis(700), changes.next())
            .await
            .is_err(),
        "an old client's grant was notified"
    );
    match s.store.acquire(&k, &b, TTL).await.unwrap() {
        AcquireOutcome::Held { .. } => {}
        other => panic!("the new client got past an old holder: {other:?}"),
    }
    assert!(old.release(&s, &k, &a).await);
    let notice = timeout(Duration::from_secs(5), changes.next()).await;
    assert!(matches!(notice, Ok(Some(Ok(())))), "{notice:?}");
    let f_new = match s.store.acquire(&k, &b, TTL).await.unwrap() {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("{other:?}"),
    };
    assert!(f_new > f_old);
    let notice = timeout(Duration::from_secs(5), changes.next()).await;
    assert!(matches!(notice, Ok(Some(Ok(())))), "{notice:?}");
}

/// A lease, fence or record written in a newer store format (a value starting `v<N>|`) is
/// refused with a `Config` error that says to upgrade, and left as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_a_newer_format_is_refused_clearly() {
    let s = Standalone::start().await;
    let k = key("upgrade:newer");
    let lk = s.store.lease_key(&k);
    let value = "v2|H|0123456789abcdef0123456789abcdef|42|1764000000000";
    s.cli(&["SET", &lk, value, "PX", "60000"]).await;
    let me = OwnerToken::random();
    for e in [
        s.store.acquire(&k, &me, TTL).await.map(|_| ()).unwrap_err(),
        s.store.release(&k, &me).await.map(|_| ()).unwrap_err(),
        s.store.renew(&k, &me, TTL).await.map(|_| ()).unwrap_err(),
    ] {
        assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
        assert!(
            e.to_string().contains("newer leasehold store format"),
            "{e}"
        );
    }
    assert_eq!(leasehold_redis::STORE_FORMAT, 1);
    assert_eq!(s.cli(&["GET", &lk]).await, value);

    // The same for a fence key and a record key (they are read through one helper): a
    // grant on a key whose fence is in a newer format, and a record read or write, are
    // refused and change nothing.
    let k2 = key("upgrade:newer-fence");
    let fk = s.store.fence_key(&k2);
    s.cli(&["SET", &fk, "v2|1764000000000001"]).await;
    let e = s
        .store
        .acquire(&k2, &me, TTL)
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert_eq!(s.store.inspect(&k2).await.unwrap(), None);
    assert_eq!(s.cli(&["GET", &fk]).await, "v2|1764000000000001");
    let rk = s.store.record_key(&k2);
    s.cli(&["SET", &rk, "v2|7|value"]).await;
    for e in [
        s.store.get_record(&k2).await.map(|_| ()).unwrap_err(),
        s.store
            .put_record(&k2, Fence(9), b"mine")
            .await
            .map(|_| ())
            .unwrap_err(),
    ] {
        assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    }
    assert_eq!(s.cli(&["GET", &rk]).await, "v2|7|value");
}
