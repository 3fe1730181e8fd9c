//! `Store::diagnose` for Redis: the server, the connection's TLS and ACL user, and the
//! settings that decide the Redis rows of `docs/guarantees.md` (persistence, eviction,
//! replicas). On a cluster, the node the command lands on answers for all of them.

use leasehold_core::{Diagnosis, Finding, StoreError, Verdict};
use redis::Value;

use crate::config::{NodeAddr, RedisConfig, Topology};
use crate::conn::Conn;
use crate::policy;

/// A replica and the upper bound of how far its clock is ahead of the primary's, in µs,
/// or why it could not be read.
type Measured = (NodeAddr, Result<i64, String>);

/// What the server said; `None` where it refused to say (an ACL without `CONFIG`).
#[derive(Debug, Default)]
struct Read {
    info: String,
    appendfsync: Option<String>,
    min_replicas_to_write: Option<String>,
    whoami: Option<String>,
    /// `ACL GETUSER` of that user: its flags, commands and key patterns.
    rights: Option<String>,
    /// The replicas' clock offsets against the primary (µs ahead, upper bound), measured
    /// now; `None` on a Cluster (not measured), `Err` when the primary could not be asked.
    replica_clocks: Option<Result<Vec<Measured>, String>>,
    /// The TLS session of a handshake of the doctor's own with the data server.
    #[cfg(feature = "tls")]
    tls: Option<Result<leasehold_core::tls_session::TlsSession, leasehold_core::TlsFailure>>,
}

impl Read {
    /// The value of `field` in the `INFO` text.
    fn info(&self, field: &str) -> Option<&str> {
        crate::wire::info_field(&self.info, field)
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// The value of a one-parameter `CONFIG GET` reply (an array, or a map in RESP3).
fn config_value(v: &Value) -> Option<String> {
    match v {
        Value::Array(items) => items.get(1).and_then(text),
        Value::Map(pairs) => pairs.first().and_then(|(_, v)| text(v)),
        _ => None,
    }
}

/// A flat rendering of an `ACL GETUSER` reply.
fn flatten(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Array(items) | Value::Set(items) => items.iter().for_each(|i| flatten(i, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            flatten(k, out);
            flatten(v, out);
        }),
        other => out.extend(text(other)),
    }
}

/// On a cluster, one node answers (any: their settings should agree); a command the
/// client would otherwise send to every node answers as one map per node.
fn one_node() -> Option<redis::cluster_routing::RoutingInfo> {
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    Some(RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
}

/// The diagnosis of the store behind `conn`.
pub(crate) async fn diagnose(conn: &Conn, config: &RedisConfig) -> Result<Diagnosis, StoreError> {
    let op = "diagnose";
    let mut info = redis::cmd("INFO");
    info.arg("server")
        .arg("persistence")
        .arg("memory")
        .arg("replication");
    let info = conn.command(op, &info, one_node()).await?;
    let mut read = Read {
        info: text(&info).unwrap_or_default(),
        ..Read::default()
    };
    // The rest is optional: a least-privilege user may not run them.
    let config_get = |name: &str| {
        let mut c = redis::cmd("CONFIG");
        c.arg("GET").arg(name);
        c
    };
    read.appendfsync = conn
        .command(op, &config_get("appendfsync"), one_node())
        .await
        .ok()
        .as_ref()
        .and_then(config_value);
    read.min_replicas_to_write = conn
        .command(op, &config_get("min-replicas-to-write"), one_node())
        .await
        .ok()
        .as_ref()
        .and_then(config_value);
    let mut whoami = redis::cmd("ACL");
    whoami.arg("WHOAMI");
    read.whoami = conn
        .command(op, &whoami, one_node())
        .await
        .ok()
        .as_ref()
        .and_then(text);
    if let Some(user) = &read.whoami {
        let mut getuser = redis::cmd("ACL");
        getuser.arg("GETUSER").arg(user);
        if let Ok(v) = conn.command(op, &getuser, one_node()).await {
            let mut words = Vec::new();
            flatten(&v, &mut words);
            read.rights = Some(words.join(" "));
        }
    }
    let node = conn.data_node();
    if let Some(node) = &node
        && !matches!(config.topology(), Topology::Cluster { .. })
    {
        read.replica_clocks = Some(crate::clocks::measure_once(config, node).await);
    }
    #[cfg(feature = "tls")]
    if let (Some(tls), Some(node)) = (config.tls(), &node) {
        read.tls = Some(look(tls, &config.map_addr(node), config.connect_timeout()).await);
    }
    Ok(judge(&read, config))
}

/// The TLS session of `node`, read by a handshake of leasehold's own (with the URL's
/// client certificate, which a server with `tls-auth-clients yes` requires).
#[cfg(feature = "tls")]
async fn look(
    tls: &crate::config::TlsSettings,
    node: &NodeAddr,
    within: std::time::Duration,
) -> Result<leasehold_core::tls_session::TlsSession, leasehold_core::TlsFailure> {
    use leasehold_core::tls_session::{ClientIdentity, look_at};
    let identity = ClientIdentity::from_pair(tls.client_cert.as_ref())?;
    look_at(&node.host, node.port, identity.as_ref(), within).await
}

fn judge(r: &Read, config: &RedisConfig) -> Diagnosis {
    let mut d = Diagnosis::new();
    d.fact(
        "server version",
        format!("Redis {}", r.info("redis_version").unwrap_or("unknown")),
    );
    d.fact(
        "topology",
        match config.topology() {
            Topology::Standalone { .. } => "one server",
            Topology::Cluster { .. } => "cluster (settings read on one node)",
            Topology::Sentinel { .. } => "a primary found through Sentinel",
        },
    );
    match config.tls() {
        Some(tls) => {
            let checked = if tls.ca_file.is_some() {
                "the store checks it against the URL's CA file (tls_ca) and the host"
            } else {
                "the store checks it against the system's CAs and the host"
            };
            #[cfg(feature = "tls")]
            match &r.tls {
                Some(look) => leasehold_core::tls_session::report_look(&mut d, look, checked),
                None => {
                    d.fact("TLS", "on (rediss)");
                    d.fact("peer certificate", checked);
                }
            }
            #[cfg(not(feature = "tls"))]
            {
                d.fact("TLS", "on (rediss)");
                d.fact("peer certificate", checked);
            }
        }
        None => {
            d.fact("TLS", "none: the connection is plaintext");
            d.warn("plaintext: use rediss:// with the server's CA (docs/connections.md)");
        }
    }
    d.fact(
        "identity",
        match &r.whoami {
            Some(user) => format!("ACL user {user}"),
            None => "unknown (ACL WHOAMI refused)".to_owned(),
        },
    );
    match &r.rights {
        Some(rights) => {
            let all_commands = rights.contains("+@all") || rights.contains("allcommands");
            let all_keys = rights
                .split_whitespace()
                .any(|w| w == "~*" || w == "allkeys");
            let mut beyond = Vec::new();
            if all_commands {
                beyond.push("every command (+@all)");
            }
            if all_keys {
                beyond.push("every key (~*)");
            }
            d.fact(
                "privileges beyond leasehold's",
                if beyond.is_empty() {
                    "none found".to_owned()
                } else {
                    beyond.join(", ")
                },
            );
            if !beyond.is_empty() {
                d.warn(format!(
                    "the user may use {}: more than leasehold needs (its scripts on keys under \
                     its prefix); give it an ACL user of its own (docs/connections.md)",
                    beyond.join(" and ")
                ));
            }
        }
        None => {
            d.fact(
                "privileges beyond leasehold's",
                "unknown (ACL GETUSER refused: the user cannot read ACLs)",
            );
        }
    }

    // Persistence.
    let aof = r.info("aof_enabled") == Some("1");
    if aof {
        let (verdict, why) = match r.appendfsync.as_deref() {
            Some("always") => (
                Verdict::Holds,
                "every write is on disk before it is answered: a restart or crash keeps the \
                 lease and its fence",
            ),
            Some(_) => (
                Verdict::FencesHold,
                "a clean restart or a process crash keeps the lease; a host crash may lose up to \
                 a second of grants, so a second holder may be let in; fences still rise, \
                 floored at the server clock",
            ),
            None => (
                Verdict::Unknown,
                "appendfsync not readable (CONFIG GET refused for this user)",
            ),
        };
        d.finding(Finding::new(
            "restart with persistence",
            verdict,
            format!(
                "appendonly=yes, appendfsync={}",
                r.appendfsync.as_deref().unwrap_or("?")
            ),
            why,
        ));
    } else {
        d.finding(Finding::new(
            "restart without persistence",
            Verdict::FencesHold,
            "appendonly=no",
            "a restart loses every lease (a second holder may be let in before the first learns \
             it at its renewal); fences, floored at the server clock, still rise",
        ));
    }

    // Eviction.
    let eviction = match r.info("maxmemory_policy") {
        Some(p) if policy::is_safe(p) => Finding::new(
            "eviction",
            Verdict::Holds,
            format!("maxmemory-policy={p}"),
            "no key is ever evicted",
        ),
        Some(p) if config.allow_eviction() => Finding::new(
            "eviction",
            Verdict::FencesHold,
            format!("maxmemory-policy={p}, allow_eviction=true"),
            "a held lease may be evicted before its TTL; only the fence protects the data",
        ),
        Some(p) => Finding::new(
            "eviction",
            Verdict::Holds,
            format!("maxmemory-policy={p}, allow_eviction=false"),
            "the store refuses an evicting server: it fails closed",
        ),
        None => Finding::new(
            "eviction",
            Verdict::Unknown,
            "maxmemory-policy=?",
            "INFO memory does not report the policy",
        ),
    };
    d.finding(eviction);

    // Replicas.
    let replicas: u32 = r
        .info("connected_slaves")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    d.fact("replicas", replicas.to_string());
    replica_clocks(&mut d, r, config);
    if replicas > 0 || matches!(config.topology(), Topology::Sentinel { .. }) {
        let waits = config.min_replicas() > 0;
        d.finding(Finding::new(
            "fail-over",
            Verdict::FencesHold,
            format!(
                "{replicas} replica(s), min_replicas={} (URL), min-replicas-to-write={}",
                config.min_replicas(),
                r.min_replicas_to_write.as_deref().unwrap_or("?")
            ),
            if waits {
                "a grant the replica did not acknowledge is never reported; holders learn of a \
                 fail-over at their next renewal, so two may believe at once; fences rise"
            } else {
                "replication is asynchronous: a promoted replica may lack the last grants \
                 (set min_replicas=1 in the URL); fences still rise, floored at the clock"
            },
        ));
    }
    d
}

/// `µs` as a signed duration in words: `+1.2 ms`, `-3.000 s`.
fn offset_words(us: i64) -> String {
    let sign = if us < 0 { '-' } else { '+' };
    let abs = us.unsigned_abs();
    if abs >= 1_000_000 {
        format!(
            "{sign}{}.{:03} s",
            abs / 1_000_000,
            (abs % 1_000_000) / 1000
        )
    } else {
        format!("{sign}{}.{} ms", abs / 1000, (abs % 1000) / 100)
    }
}

/// A replica clock ahead of its primary's by more than this is warned about on a store
/// that does not correct for it (one without Sentinel).
const AHEAD_WARNING_US: i64 = 50_000;

/// The fact `replica clocks` and its warnings: a replica whose clock is ahead of the
/// primary's ends every lease that much early once promoted (crate docs, "Replica
/// clocks"). A Sentinel store takes the largest offset off every grant and refuses one
/// above `max_clock_offset`; a store without Sentinel (a fail-over by hand) corrects
/// nothing.
fn replica_clocks(d: &mut Diagnosis, r: &Read, config: &RedisConfig) {
    let sentinel = matches!(config.topology(), Topology::Sentinel { .. });
    match &r.replica_clocks {
        None if matches!(config.topology(), Topology::Cluster { .. }) => {
            d.fact(
                "replica clocks",
                "not measured on a cluster (each shard's replicas against their primary)",
            );
        }
        None => {}
        Some(Err(why)) => {
            d.fact("replica clocks", format!("unknown: {why}"));
        }
        Some(Ok(measured))
            if measured.is_empty()
                && r.info("connected_slaves").is_some_and(|n| n.trim() != "0") =>
        {
            d.fact(
                "replica clocks",
                "not measured: ROLE lists no replica yet (still synchronising)",
            );
        }
        Some(Ok(measured)) if measured.is_empty() => {}
        Some(Ok(measured)) => {
            let words: Vec<String> = measured
                .iter()
                .map(|(node, got)| match got {
                    Ok(us) => format!("{node} {} (ahead by at most)", offset_words(*us)),
                    Err(why) => format!("{node} unknown ({why})"),
                })
                .collect();
            d.fact("replica clocks", words.join("; "));
            let limit = i64::try_from(config.max_clock_offset().as_micros()).unwrap_or(i64::MAX);
            for (node, got) in measured {
                let Ok(us) = got else { continue };
                if sentinel && *us > limit {
                    d.warn(format!(
                        "replica {node}'s clock is ahead of the primary's by up to {}, above \
                         max_clock_offset ({:?}): the store refuses grants until it is fixed; \
                         synchronise the hosts' clocks (NTP)",
                        offset_words(*us),
                        config.max_clock_offset()
                    ));
                } else if !sentinel && *us > AHEAD_WARNING_US {
                    d.warn(format!(
                        "replica {node}'s clock is ahead of the primary's by up to {}: promoted \
                         by hand, it would end every lease that much early while its holder \
                         still believes; synchronise the hosts' clocks (NTP)",
                        offset_words(*us)
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(info: &str) -> Read {
        Read {
            info: info.replace('|', "\r\n"),
            appendfsync: Some("everysec".into()),
            min_replicas_to_write: Some("0".into()),
            whoami: Some("default".into()),
            rights: Some("flags on allkeys allchannels commands +@all keys ~*".into()),
            replica_clocks: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    fn config(url: &str) -> RedisConfig {
        RedisConfig::from_url(url).unwrap()
    }

    fn verdict(d: &Diagnosis, row: &str) -> Option<Verdict> {
        d.row(row).map(|f| f.verdict)
    }

    #[test]
    fn persistence_decides_the_restart_row() {
        let plain = config("redis://h:1/");
        let info =
            "redis_version:7.0.15|aof_enabled:1|maxmemory_policy:noeviction|connected_slaves:0";
        let d = judge(&read(info), &plain);
        assert_eq!(d.fact_value("server version"), Some("Redis 7.0.15"));
        assert_eq!(
            verdict(&d, "restart with persistence"),
            Some(Verdict::FencesHold)
        );
        let mut r = read(info);
        r.appendfsync = Some("always".into());
        assert_eq!(
            verdict(&judge(&r, &plain), "restart with persistence"),
            Some(Verdict::Holds)
        );
        r.appendfsync = None;
        assert_eq!(
            verdict(&judge(&r, &plain), "restart with persistence"),
            Some(Verdict::Unknown)
        );
        let d = judge(&read("aof_enabled:0"), &plain);
        assert_eq!(
            verdict(&d, "restart without persistence"),
            Some(Verdict::FencesHold)
        );
        assert!(d.row("restart with persistence").is_none());
    }

    #[test]
    fn eviction_and_replicas_rows() {
        let plain = config("redis://h:1/");
        let d = judge(&read("maxmemory_policy:noeviction"), &plain);
        assert_eq!(verdict(&d, "eviction"), Some(Verdict::Holds));
        assert!(d.row("fail-over").is_none());
        let d = judge(
            &read("maxmemory_policy:allkeys-lru|connected_slaves:1"),
            &plain,
        );
        assert_eq!(
            d.row("eviction").unwrap().why,
            "the store refuses an evicting server: it fails closed"
        );
        assert!(d.row("fail-over").unwrap().why.contains("asynchronous"));
        let allow = config("redis://h:1/?allow_eviction=true&min_replicas=1");
        let d = judge(
            &read("maxmemory_policy:volatile-lru|connected_slaves:2"),
            &allow,
        );
        assert_eq!(verdict(&d, "eviction"), Some(Verdict::FencesHold));
        assert!(d.row("fail-over").unwrap().why.contains("never reported"));
        assert_eq!(
            verdict(&judge(&read(""), &plain), "eviction"),
            Some(Verdict::Unknown)
        );
    }

    #[test]
    fn the_default_user_and_plaintext_are_warned_about() {
        let d = judge(&read(""), &config("redis://h:1/"));
        assert_eq!(
            d.fact_value("privileges beyond leasehold's"),
            Some("every command (+@all), every key (~*)")
        );
        assert_eq!(d.warnings.len(), 2, "{:?}", d.warnings);
        let mut r = read("");
        r.rights = Some("flags on commands -@all +evalsha keys ~lh:*".into());
        let d = judge(&r, &config("rediss://h:1/"));
        assert_eq!(
            d.fact_value("privileges beyond leasehold's"),
            Some("none found")
        );
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        r.rights = None;
        r.whoami = None;
        let d = judge(&r, &config("rediss://h:1/"));
        assert_eq!(
            d.fact_value("identity"),
            Some("unknown (ACL WHOAMI refused)")
        );
    }

    #[test]
    fn replica_clocks_ahead_are_warned_about_where_nothing_corrects_them() {
        let plain = config("redis://h:1/");
        let mut r = read("connected_slaves:2");
        r.replica_clocks = Some(Ok(vec![
            (NodeAddr::new("a", 1), Ok(50_001)),
            (NodeAddr::new("b", 2), Err("refused".into())),
        ]));
        let d = judge(&r, &plain);
        assert_eq!(
            d.fact_value("replica clocks"),
            Some("a:1 +50.0 ms (ahead by at most); b:2 unknown (refused)")
        );
        let clocks: Vec<_> = d
            .warnings
            .iter()
            .filter(|w| w.contains("replica a:1"))
            .collect();
        assert_eq!(clocks.len(), 1, "{:?}", d.warnings);
        assert!(clocks[0].contains("promoted by hand"));
        // At the bound: no warning.
        r.replica_clocks = Some(Ok(vec![(NodeAddr::new("a", 1), Ok(50_000))]));
        let d = judge(&r, &plain);
        assert!(
            !d.warnings.iter().any(|w| w.contains("replica a:1")),
            "{:?}",
            d.warnings
        );
        // Sentinel corrects up to max_clock_offset (500 ms by default) and refuses above.
        let sentinel = config("redis+sentinel://s:1/m");
        r.replica_clocks = Some(Ok(vec![(NodeAddr::new("a", 1), Ok(400_000))]));
        assert!(
            !judge(&r, &sentinel)
                .warnings
                .iter()
                .any(|w| w.contains("replica a:1"))
        );
        r.replica_clocks = Some(Ok(vec![(NodeAddr::new("a", 1), Ok(-2_500_000))]));
        let d = judge(&r, &sentinel);
        assert_eq!(
            d.fact_value("replica clocks"),
            Some("a:1 -2.500 s (ahead by at most)")
        );
        r.replica_clocks = Some(Ok(vec![(NodeAddr::new("a", 1), Ok(500_001))]));
        let d = judge(&r, &sentinel);
        assert!(
            d.warnings
                .iter()
                .any(|w| w.contains("above max_clock_offset")),
            "{:?}",
            d.warnings
        );
        r.replica_clocks = Some(Err("p:1 is not a primary".into()));
        assert_eq!(
            judge(&r, &sentinel).fact_value("replica clocks"),
            Some("unknown: p:1 is not a primary")
        );
        r.replica_clocks = Some(Ok(Vec::new()));
        assert!(
            judge(&r, &plain)
                .fact_value("replica clocks")
                .unwrap()
                .contains("still synchronising")
        );
        assert_eq!(
            judge(&read("connected_slaves:0"), &plain).fact_value("replica clocks"),
            None
        );
        r.replica_clocks = None;
        assert!(
            judge(&r, &config("redis+cluster://h:1/"))
                .fact_value("replica clocks")
                .unwrap()
                .starts_with("not measured")
        );
        assert_eq!(judge(&r, &plain).fact_value("replica clocks"), None);
    }

    #[test]
    fn config_get_replies_in_both_protocols() {
        let resp2 = Value::Array(vec![
            Value::BulkString(b"appendfsync".to_vec()),
            Value::BulkString(b"always".to_vec()),
        ]);
        assert_eq!(config_value(&resp2).as_deref(), Some("always"));
        let resp3 = Value::Map(vec![(
            Value::BulkString(b"appendfsync".to_vec()),
            Value::BulkString(b"no".to_vec()),
        )]);
        assert_eq!(config_value(&resp3).as_deref(), Some("no"));
        assert_eq!(config_value(&Value::Nil), None);
    }
}
