//! Reading the server's `maxmemory-policy` (docs/faults.md row 25).
//!
//! Every policy except `noeviction` may evict a held lease key before its TTL:
//! `volatile-lru`, `volatile-lfu`, `volatile-random` and `volatile-ttl` evict keys that
//! have a TTL (every lease key has one), `allkeys-*` evict any key. `INFO memory` reports
//! the policy and needs only `+info` in an ACL, where `CONFIG GET` is usually forbidden.

use redis::Value;

use crate::config::NodeAddr;

/// The only policy that never evicts a key.
const SAFE: &str = "noeviction";

/// `INFO memory`.
pub(crate) fn info_memory() -> redis::Cmd {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("memory");
    cmd
}

/// The `maxmemory_policy` field of an `INFO` reply, if it has one.
pub(crate) fn policy_from_info(v: &Value) -> Option<String> {
    let text = match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::VerbatimString { text, .. } => text.clone(),
        _ => return None,
    };
    crate::wire::info_field(&text, "maxmemory_policy")
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
}

/// Whether `policy` never evicts keys. Anything else, including a policy this code does
/// not know, is taken as evicting.
pub(crate) fn is_safe(policy: &str) -> bool {
    policy.eq_ignore_ascii_case(SAFE)
}

/// The primaries named by a `CLUSTER SLOTS` reply, each once, in order of first mention.
pub(crate) fn cluster_primaries(v: &Value) -> Option<Vec<NodeAddr>> {
    let Value::Array(ranges) = v else {
        return None;
    };
    let mut out: Vec<NodeAddr> = Vec::new();
    for r in ranges {
        let Value::Array(parts) = r else {
            return None;
        };
        let Some(Value::Array(master)) = parts.get(2) else {
            return None;
        };
        let host = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return None,
        };
        let port = match master.get(1) {
            Some(Value::Int(p)) => u16::try_from(*p).ok()?,
            _ => return None,
        };
        let node = NodeAddr::new(host, port);
        if !out.contains(&node) {
            out.push(node);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::bulk;

    #[test]
    fn reads_the_policy() {
        let info = "# Memory\r\nused_memory:914792\r\nmaxmemory:4194304\r\nmaxmemory_human:4.00M\r\nmaxmemory_policy:allkeys-lru\r\nallocator_frag_ratio:1.00\r\n";
        assert_eq!(
            policy_from_info(&bulk(info)).as_deref(),
            Some("allkeys-lru")
        );
        let v = Value::VerbatimString {
            format: redis::VerbatimFormat::Text,
            text: "maxmemory_policy:noeviction\n".into(),
        };
        assert_eq!(policy_from_info(&v).as_deref(), Some("noeviction"));
        // Missing, empty, or not text: unknown.
        assert_eq!(
            policy_from_info(&bulk("# Memory\r\nused_memory:1\r\n")),
            None
        );
        assert_eq!(policy_from_info(&bulk("maxmemory_policy:\r\n")), None);
        assert_eq!(policy_from_info(&Value::Int(1)), None);
        // A field that merely ends with the name is not it.
        assert_eq!(
            policy_from_info(&bulk("x_maxmemory_policy:noeviction\r\n")),
            None
        );
    }

    #[test]
    fn only_noeviction_is_safe() {
        assert!(is_safe("noeviction"));
        assert!(is_safe("NOEVICTION"));
        for p in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
            "some-future-policy",
            "",
        ] {
            assert!(!is_safe(p), "{p}");
        }
    }

    #[test]
    fn primaries_from_cluster_slots() {
        let range = |lo: i64, hi: i64, host: &str, port: i64| {
            Value::Array(vec![
                Value::Int(lo),
                Value::Int(hi),
                Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
                Value::Array(vec![bulk("replica"), Value::Int(1), bulk("id2")]),
            ])
        };
        let v = Value::Array(vec![
            range(0, 100, "10.0.0.1", 7000),
            range(101, 200, "10.0.0.2", 7001),
            range(201, 300, "10.0.0.1", 7000),
        ]);
        assert_eq!(
            cluster_primaries(&v).unwrap(),
            vec![
                NodeAddr::new("10.0.0.1", 7000),
                NodeAddr::new("10.0.0.2", 7001)
            ]
        );
        assert_eq!(cluster_primaries(&Value::Int(1)), None);
        assert_eq!(
            cluster_primaries(&Value::Array(vec![range(0, 1, "h", 70000)])),
            None
        );
    }
}
