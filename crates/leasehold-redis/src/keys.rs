//! Redis key layout: namespace prefix, hash tag, escaping.
//!
//! For a lease key `k` and the namespace prefix `p`:
//!
//! | what | Redis key / channel |
//! | --- | --- |
//! | lease | `p{e}` |
//! | fence | `p{e}:fence` |
//! | release notifications | `p{e}:released` (a pub/sub channel) |
//! | waiting queue (owners in arrival order) | `p{e}:q` (a sorted set) |
//! | waiting queue entries' deadlines | `p{e}:qd` (a hash) |
//! | record (see [`put_record`](leasehold_core::Store::put_record)) | `p{e}:record` |
//!
//! where `e` is `k` with `%`, `{` and `}` percent-encoded (`%25`, `%7B`, `%7D`). The prefix
//! may not contain braces, so the first `{` of both keys is the one we put there, and `e`
//! contains no `}`, so the hash tag is exactly `e`, which is never empty: the lease key and
//! the fence key always hash to the same Cluster slot, whatever the user's key looks like
//! (`{a}x`, `}`, `{}`, `a}{b}`...). The encoding is injective and prefix-preserving, so
//! [`list`](leasehold_core::Store::list) can scan by a key prefix and decode what it finds.

use leasehold_core::{Key, StoreError, StoreErrorKind};

use crate::BACKEND;
use crate::wire::{encode_key as encode, lease_key, parse_lease_key, scan_pattern};

/// The longest namespace prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 128;

/// The default namespace prefix.
pub const DEFAULT_PREFIX: &str = "leasehold:";

/// Checks a namespace prefix: at most [`MAX_PREFIX_LEN`] bytes, no `{` or `}` (they would
/// change the hash tag), no control characters, no whitespace, no glob characters
/// (`*?[]\`, which would make `SCAN MATCH` and ACL key patterns ambiguous). May be empty.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), StoreError> {
    let bad = |why: &str| {
        Err(StoreError::new(
            StoreErrorKind::Config,
            BACKEND,
            format!("invalid key prefix: {why}"),
        ))
    };
    if prefix.len() > MAX_PREFIX_LEN {
        return bad(&format!(
            "{} bytes long, the maximum is {MAX_PREFIX_LEN}",
            prefix.len()
        ));
    }
    if let Some(c) = prefix.chars().find(|c| {
        matches!(c, '{' | '}' | '*' | '?' | '[' | ']' | '\\') || c.is_control() || c.is_whitespace()
    }) {
        return bad(&format!(
            "it contains {c:?}; braces, glob characters, whitespace and control characters are not allowed"
        ));
    }
    Ok(())
}

/// The Redis names used for one lease key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyNames {
    pub(crate) lease: String,
    pub(crate) fence: String,
    pub(crate) channel: String,
    pub(crate) queue: String,
    pub(crate) queue_deadlines: String,
    /// `p{e}:w`: the key is watched while it exists (see `WatchStore::watch`); it covers the
    /// lease and the record of the key, which share its hash tag.
    pub(crate) watch: String,
}

/// The namespace: a validated prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    prefix: String,
}

impl Layout {
    pub(crate) fn new(prefix: &str) -> Result<Self, StoreError> {
        validate_prefix(prefix)?;
        Ok(Self {
            prefix: prefix.to_owned(),
        })
    }

    /// The Cluster slot of `key`'s lease and fence keys: CRC16 (XMODEM) of the hash tag,
    /// modulo 16384, as Redis computes it (`CLUSTER KEYSLOT`).
    pub(crate) fn slot(&self, key: &Key) -> u16 {
        crc16::State::<crc16::XMODEM>::calculate(encode(key.as_str()).as_bytes()) % 16384
    }

    /// The lease key alone (`p{e}`), for the operations that need no other name.
    pub(crate) fn lease_name(&self, key: &Key) -> String {
        lease_key(&self.prefix, key)
    }

    pub(crate) fn names(&self, key: &Key) -> KeyNames {
        let lease = lease_key(&self.prefix, key);
        KeyNames {
            fence: format!("{lease}:fence"),
            channel: format!("{lease}:released"),
            queue: format!("{lease}:q"),
            queue_deadlines: format!("{lease}:qd"),
            watch: format!("{lease}:w"),
            lease,
        }
    }

    /// Writes the lease key of `key` (`p{e}`, as [`names`](Self::names)' `lease`) at the
    /// end of `out`, without a string of its own: the per-operation path builds each of
    /// its names into one buffer (see `batch::Op`).
    pub(crate) fn push_lease_name(&self, out: &mut String, key: &Key) {
        out.push_str(&self.prefix);
        out.push('{');
        for c in key.as_str().chars() {
            match c {
                '%' => out.push_str("%25"),
                '{' => out.push_str("%7B"),
                '}' => out.push_str("%7D"),
                c => out.push(c),
            }
        }
        out.push('}');
    }

    /// The length in bytes of the lease key of `key`.
    pub(crate) fn lease_name_len(&self, key: &Key) -> usize {
        let k = key.as_str();
        let escaped = k
            .bytes()
            .filter(|b| matches!(b, b'%' | b'{' | b'}'))
            .count();
        self.prefix.len() + 2 + k.len() + 2 * escaped
    }

    /// The Redis key of the record named `key` (`p{e}:record`): records live beside
    /// leases, in a namespace of their own (it never ends with `}`, so it is never taken
    /// for a lease key, and `list` skips it).
    pub(crate) fn record_name(&self, key: &Key) -> String {
        format!("{}:record", lease_key(&self.prefix, key))
    }

    /// The `SCAN MATCH` pattern of the lease keys whose lease key starts with `key_prefix`.
    pub(crate) fn scan_pattern(&self, key_prefix: &str) -> String {
        scan_pattern(&self.prefix, key_prefix)
    }

    /// The lease key named by a Redis key found by `SCAN`, if it is a lease key (not a
    /// fence key, not a foreign key that happens to match).
    pub(crate) fn parse_lease_name(&self, redis_key: &str) -> Option<Key> {
        parse_lease_key(&self.prefix, redis_key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::decode_key as decode;

    /// The slot is `CLUSTER KEYSLOT` of the lease key: values from the Redis Cluster
    /// specification (`123456789` → 0x31C3) and from `redis-cli CLUSTER KEYSLOT` (`foo`
    /// → 12182, `somekey` → 11058); a key that gets encoded hashes by its encoding, which
    /// is what the hash tag holds.
    #[test]
    fn slots_are_redis_key_slots() {
        let layout = Layout::new(DEFAULT_PREFIX).unwrap();
        let slot = |k: &str| layout.slot(&Key::new(k).unwrap());
        assert_eq!(slot("123456789"), 0x31C3);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("somekey"), 11058);
        let raw = |s: &str| crc16::State::<crc16::XMODEM>::calculate(s.as_bytes()) % 16384;
        assert_eq!(slot("a{b}"), raw("a%7Bb%7D"));
        assert_ne!(slot("a{b}"), slot("b"));
    }

    /// Redis Cluster's hash tag rule: the part between the first `{` and the first `}`
    /// after it, if non-empty; otherwise the whole key.
    fn hash_tag(k: &str) -> &str {
        if let Some(open) = k.find('{')
            && let Some(len) = k[open + 1..].find('}')
            && len > 0
        {
            return &k[open + 1..open + 1 + len];
        }
        k
    }

    #[test]
    fn lease_and_fence_share_the_hash_tag() {
        let l = Layout::new("leasehold:").unwrap();
        for k in [
            "a",
            "{a}x",
            "x{a}",
            "{}a",
            "{}{a}",
            "{{a}}",
            "a}{b}",
            "}",
            "}a",
            "{",
            "{}",
            "%",
            "%7D",
            "job:é{ü}",
            "a%7Db",
        ] {
            let key = Key::new(k).unwrap();
            let n = l.names(&key);
            assert_eq!(hash_tag(&n.lease), hash_tag(&n.fence), "{k}");
            assert!(!hash_tag(&n.lease).is_empty());
            assert_eq!(hash_tag(&n.lease), encode(k), "{k}");
            assert_eq!(l.parse_lease_name(&n.lease), Some(key.clone()), "{k}");
            assert_eq!(l.parse_lease_name(&n.fence), None, "{k}");
            assert_eq!(hash_tag(&n.watch), hash_tag(&n.lease), "{k}");
            assert_eq!(l.parse_lease_name(&n.watch), None, "{k}");
            let mut pushed = String::from("x");
            l.push_lease_name(&mut pushed, &key);
            assert_eq!(pushed[1..], n.lease, "{k}");
            assert_eq!(l.lease_name_len(&key), n.lease.len(), "{k}");
            let record = l.record_name(&key);
            assert_eq!(hash_tag(&record), hash_tag(&n.lease), "{k}");
            assert_eq!(l.parse_lease_name(&record), None, "{k}");
        }
    }

    #[test]
    fn encoding_is_injective_and_prefix_preserving() {
        for k in ["a%b", "a{b", "a}b", "%7B", "{", "%", "plain", "%%{{}}"] {
            assert_eq!(decode(&encode(k)).as_deref(), Some(k));
            assert!(!encode(k).contains('}'));
            assert!(encode(&format!("{k}tail")).starts_with(&encode(k)));
        }
        assert_eq!(decode("%7"), None);
        assert_eq!(decode("a}"), None);
        assert_eq!(decode("%41"), None);
    }

    #[test]
    fn prefix_rules() {
        assert!(Layout::new("").is_ok());
        assert!(Layout::new("app:leases:").is_ok());
        for bad in ["{x}", "a}", "a*", "a b", "a\nb", "a?", "a[", "a\\"] {
            let e = Layout::new(bad).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Config, "{bad}");
        }
        assert!(Layout::new(&"x".repeat(MAX_PREFIX_LEN + 1)).is_err());
    }

    #[test]
    fn scan_pattern_escapes_globs() {
        let l = Layout::new("ns:").unwrap();
        assert_eq!(l.scan_pattern("job:"), "ns:{job:*");
        assert_eq!(l.scan_pattern("a*[?]\\{"), "ns:{a\\*\\[\\?\\]\\\\%7B*");
        assert_eq!(l.scan_pattern(""), "ns:{*");
    }
}
