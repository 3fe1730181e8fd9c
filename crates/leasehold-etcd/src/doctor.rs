//! `Store::diagnose` for etcd: the members and their health, the connection's TLS and
//! user, what the user's roles may touch, and the rows that depend on the cluster's size.

use etcd_client::{AlarmAction, AlarmType};
use leasehold_core::{Diagnosis, Finding, StoreError, Verdict};

use crate::conn::EtcdStore;
use crate::error::map_err;

/// What the cluster said.
#[derive(Debug, Default)]
struct Read {
    version: String,
    members: Vec<String>,
    leader_known: bool,
    errors: Vec<String>,
    alarms: usize,
    /// The user's roles and, per role, its permitted key ranges (`None`: not readable).
    roles: Option<Vec<(String, Vec<String>)>>,
}

pub(crate) async fn diagnose(store: &EtcdStore) -> Result<Diagnosis, StoreError> {
    let op = "diagnose";
    let mut c = store.client.clone();
    let status = c.status().await.map_err(|e| map_err(op, e))?;
    let members = c.member_list().await.map_err(|e| map_err(op, e))?;
    let alarms = c
        .alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .map(|a| a.alarms().len())
        .unwrap_or(0);
    let mut read = Read {
        version: status.version().to_owned(),
        members: members
            .members()
            .iter()
            .map(|m| format!("{} {}", m.name(), m.client_urls().join(",")))
            .collect(),
        leader_known: status.leader() != 0,
        errors: status.errors().to_vec(),
        alarms,
        roles: None,
    };
    if let Some(user) = store.config.user()
        && let Ok(u) = c.user_get(user).await
    {
        let mut roles = Vec::new();
        for role in u.roles() {
            let ranges = match c.role_get(role.clone()).await {
                Ok(r) => r
                    .permissions()
                    .iter()
                    .map(|p| {
                        format!(
                            "{}..{}",
                            String::from_utf8_lossy(p.key()),
                            String::from_utf8_lossy(p.range_end())
                        )
                    })
                    .collect(),
                Err(_) => vec!["?".to_owned()],
            };
            roles.push((role.clone(), ranges));
        }
        read.roles = Some(roles);
    }
    Ok(judge(&read, store))
}

/// Whether the range `key..end` (as `role_get` shows it) lies within `prefix`.
fn within(range: &str, prefix: &str) -> bool {
    range
        .split_once("..")
        .is_some_and(|(key, _)| !prefix.is_empty() && key.starts_with(prefix))
}

fn judge(r: &Read, store: &EtcdStore) -> Diagnosis {
    let config = &store.config;
    let mut d = Diagnosis::new();
    d.fact("server version", format!("etcd {}", r.version));
    d.fact("members", r.members.join("; "));
    d.fact(
        "health",
        if r.errors.is_empty() && r.alarms == 0 && r.leader_known {
            "a leader, no member errors, no alarms".to_owned()
        } else {
            format!(
                "leader {}, errors: [{}], {} alarm(s)",
                if r.leader_known { "known" } else { "none" },
                r.errors.join("; "),
                r.alarms
            )
        },
    );
    d.fact(
        "clock skew",
        "unknown: etcd does not tell clients its members' clocks (leasehold's expiry runs on \
         the members' monotonic timers, so skew does not decide a row)",
    );
    if config.uses_tls() {
        d.fact(
            "TLS",
            "on (https); the version is not exposed by the etcd client",
        );
        d.fact(
            "peer certificate",
            "signed by the URL's cacert (or the system's store) and names the host",
        );
    } else {
        d.fact("TLS", "none: the connection is plaintext");
        d.warn("plaintext: use tls=true with the members' CA (docs/connections.md)");
    }
    let prefix = config.key_prefix();
    match (config.user(), &r.roles) {
        (None, _) => {
            d.fact(
                "identity",
                "none (authentication off, or a client certificate's name)",
            );
        }
        (Some(user), None) => {
            d.fact("identity", format!("user {user}"));
            d.fact(
                "privileges beyond leasehold's",
                "unknown (the user cannot read its own roles)",
            );
        }
        (Some(user), Some(roles)) => {
            d.fact("identity", format!("user {user}"));
            let beyond: Vec<String> = roles
                .iter()
                .flat_map(|(role, ranges)| {
                    let root = (role == "root").then(|| "role root (everything)".to_owned());
                    root.into_iter().chain(
                        ranges
                            .iter()
                            .filter(|range| !within(range, prefix))
                            .map(move |range| format!("role {role}: {range}")),
                    )
                })
                .collect();
            d.fact(
                "privileges beyond leasehold's",
                if beyond.is_empty() {
                    format!("none outside the prefix {prefix}")
                } else {
                    beyond.join("; ")
                },
            );
            if !beyond.is_empty() {
                d.warn(format!(
                    "the user may touch keys outside {prefix}: give it a role limited to the \
                     prefix (docs/connections.md)"
                ));
            }
        }
    }
    d.finding(Finding::new(
        "restart with persistence",
        Verdict::Holds,
        "etcd's write-ahead log",
        "etcd syncs its log before it answers (unless a member runs with --unsafe-no-fsync, \
         which clients cannot see)",
    ));
    let n = r.members.len();
    d.finding(if n >= 3 {
        Finding::new(
            "fail-over",
            Verdict::Holds,
            format!("{n} members"),
            "a majority carries every grant: losing a minority keeps leases and fences",
        )
    } else {
        Finding::new(
            "fail-over",
            Verdict::Unknown,
            format!("{n} member(s)"),
            "fewer than three members: losing one stops the cluster (it fails closed, no \
             fail-over to test)",
        )
    });
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_within_the_prefix_is_not_beyond() {
        assert!(within("leasehold/..leasehold0", "leasehold/"));
        assert!(within("leasehold/x..", "leasehold/"));
        assert!(!within("..\0", "leasehold/"));
        assert!(!within("other/..other0", "leasehold/"));
        assert!(!within("leasehold/..", ""));
        assert!(!within("no range", "leasehold/"));
    }
}
