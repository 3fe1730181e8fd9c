//! `Store::diagnose` for Redlock: each node's version, persistence and eviction policy,
//! held against the Redlock rows of `docs/guarantees.md`.

use leasehold_core::{Diagnosis, Finding, StoreError, Verdict};
use tokio::time::Instant;

use crate::config::RedlockConfig;
use leasehold_redis::wire::info_field;

use crate::node::NodeConn;

/// One node's answer: its name and `INFO` text, or why it gave none.
type Answer = (String, Result<String, String>);

pub(crate) async fn diagnose(
    nodes: &[NodeConn],
    config: &RedlockConfig,
) -> Result<Diagnosis, StoreError> {
    let deadline = Instant::now() + config.node_bound();
    let asked = nodes.iter().map(|n| async move {
        let text = n
            .info("diagnose", deadline, &["server", "persistence", "memory"])
            .await;
        (n.name().to_owned(), text.map_err(|e| e.to_string()))
    });
    let answers: Vec<Answer> = futures::future::join_all(asked).await;
    #[allow(unused_mut)]
    let mut d = judge(&answers, config);
    #[cfg(feature = "tls")]
    if let Some(tls) = config.tls_settings() {
        sessions(&mut d, config, tls).await;
    }
    Ok(d)
}

/// Each node's TLS session, read by a handshake of leasehold's own: the first node's
/// gives the facts `TLS` and `peer certificate`, every node's certificate is warned about
/// if it ends soon, and a node whose version or cipher differs from the first's is named.
#[cfg(feature = "tls")]
async fn sessions(d: &mut Diagnosis, config: &RedlockConfig, tls: &leasehold_redis::TlsSettings) {
    use leasehold_core::tls_session::{ClientIdentity, look_at, report_look};
    let identity = match ClientIdentity::from_pair(tls.client_cert.as_ref()) {
        Ok(identity) => identity,
        Err(e) => {
            report_look(d, &Err(e), CHECKED);
            return;
        }
    };
    let within = config.connect_bound();
    let looks = futures::future::join_all(config.nodes().iter().map(|n| {
        let identity = identity.as_ref();
        async move {
            let name = format!("{}:{}", n.host(), n.port());
            (name, look_at(n.host(), n.port(), identity, within).await)
        }
    }))
    .await;
    let Some((_, first)) = looks.first() else {
        return;
    };
    report_look(d, first, CHECKED);
    let first_tls = d.fact_value("TLS").map(str::to_owned);
    for (name, look) in &looks[1..] {
        let mut other = Diagnosis::new();
        report_look(&mut other, look, CHECKED);
        for w in std::mem::take(&mut other.warnings) {
            if !d.warnings.contains(&w) {
                d.warn(w);
            }
        }
        if other.fact_value("TLS").map(str::to_owned) != first_tls {
            d.fact(
                format!("TLS of node {name}"),
                other.fact_value("TLS").unwrap_or("?"),
            );
        }
    }
}

/// How the store's own connections check a node's certificate.
#[cfg(feature = "tls")]
const CHECKED: &str = "the store checks every node's against the URL's CA (tls_ca) and the \
                       node's host";

fn judge(answers: &[Answer], config: &RedlockConfig) -> Diagnosis {
    let mut d = Diagnosis::new();
    let mut aof = 0;
    let mut evicting = Vec::new();
    let mut reached = 0;
    for (name, answer) in answers {
        match answer {
            Ok(text) => {
                reached += 1;
                let persist = info_field(text, "aof_enabled") == Some("1");
                aof += usize::from(persist);
                let policy = info_field(text, "maxmemory_policy").unwrap_or("?");
                if policy != "noeviction" {
                    evicting.push(format!("{name} ({policy})"));
                }
                d.fact(
                    format!("node {name}"),
                    format!(
                        "Redis {}, appendonly={}, maxmemory-policy={policy}",
                        info_field(text, "redis_version").unwrap_or("?"),
                        if persist { "yes" } else { "no" },
                    ),
                );
            }
            Err(e) => {
                d.fact(format!("node {name}"), format!("unreachable: {e}"));
            }
        }
    }
    let mut versions: Vec<&str> = answers
        .iter()
        .filter_map(|(_, a)| a.as_ref().ok())
        .map(|t| info_field(t, "redis_version").unwrap_or("?"))
        .collect();
    versions.sort_unstable();
    versions.dedup();
    d.fact(
        "server version",
        format!(
            "Redis {} on {reached} of {} nodes",
            versions.join(", "),
            answers.len()
        ),
    );
    d.fact(
        "TLS",
        if config.tls_settings().is_some() {
            "on (tls=true) to every node, each certificate checked against the CA and the node's \
             host"
        } else {
            "none: the connections are plaintext"
        },
    );
    d.fact(
        "quorum",
        format!(
            "{} of {} nodes ({reached} answered)",
            config.quorum(),
            answers.len()
        ),
    );
    if config.user().is_none() {
        d.fact("identity", "the default user");
    } else {
        d.fact(
            "identity",
            format!("ACL user {}", config.user().unwrap_or_default()),
        );
    }
    if reached < answers.len() {
        d.warn(format!(
            "{} node(s) did not answer: the rows below count only the nodes that did",
            answers.len() - reached
        ));
    }
    d.finding(if aof == reached && reached > 0 {
        Finding::new(
            "restart with persistence",
            Verdict::FencesHold,
            "appendonly=yes on every node",
            "as on a single Redis, which crash and which appendfsync decide; fences rise",
        )
    } else {
        Finding::new(
            "restart without persistence",
            Verdict::FencesHold,
            format!("appendonly=yes on {aof} of {reached} nodes"),
            "a node restarted empty under a bare-majority holder lets a second holder in; \
             fences, floored at the clocks, still rise",
        )
    });
    d.finding(match (evicting.is_empty(), config.eviction_allowed()) {
        (true, _) => Finding::new(
            "eviction",
            Verdict::Holds,
            "maxmemory-policy=noeviction on every node",
            "no key is ever evicted",
        ),
        (false, true) => Finding::new(
            "eviction",
            Verdict::FencesHold,
            format!("evicting: {}; allow_eviction=true", evicting.join(", ")),
            "a held key may be evicted before its TTL; only the fence protects the data",
        ),
        (false, false) => Finding::new(
            "eviction",
            Verdict::Holds,
            format!("evicting: {}; allow_eviction=false", evicting.join(", ")),
            "the store refuses an evicting node: it fails closed",
        ),
    });
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> RedlockConfig {
        RedlockConfig::from_url(&format!("redlock://a:1,b:2,c:3/{extra}")).unwrap()
    }

    fn node(name: &str, aof: bool, policy: &str) -> Answer {
        (
            name.into(),
            Ok(format!(
                "redis_version:7.0.15\r\naof_enabled:{}\r\nmaxmemory_policy:{policy}\r\n",
                u8::from(aof)
            )),
        )
    }

    #[test]
    fn every_node_must_persist_and_never_evict() {
        let all = [node("a", true, "noeviction"), node("b", true, "noeviction")];
        let d = judge(&all, &config(""));
        assert_eq!(
            d.row("restart with persistence").unwrap().verdict,
            Verdict::FencesHold
        );
        assert_eq!(d.row("eviction").unwrap().verdict, Verdict::Holds);
        assert_eq!(
            d.fact_value("node a"),
            Some("Redis 7.0.15, appendonly=yes, maxmemory-policy=noeviction")
        );
        assert!(d.warnings.is_empty());
        assert_eq!(
            d.fact_value("server version"),
            Some("Redis 7.0.15 on 2 of 2 nodes")
        );
        let mixed = [
            node("a", true, "noeviction"),
            node("b", false, "allkeys-lru"),
            ("c".into(), Err("refused".into())),
        ];
        let d = judge(&mixed, &config(""));
        assert!(d.row("restart with persistence").is_none());
        assert_eq!(
            d.row("restart without persistence").unwrap().setting,
            "appendonly=yes on 1 of 2 nodes"
        );
        assert!(d.row("eviction").unwrap().why.contains("fails closed"));
        assert_eq!(d.warnings.len(), 1);
        assert_eq!(d.fact_value("node c"), Some("unreachable: refused"));
        let d = judge(&mixed, &config("?allow_eviction=true"));
        assert_eq!(d.row("eviction").unwrap().verdict, Verdict::FencesHold);
    }
}
