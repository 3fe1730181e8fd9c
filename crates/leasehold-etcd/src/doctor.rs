//! `Store::diagnose` for etcd: the members and their health, the connection's TLS and
//! user, what the user's roles may touch, and the rows that depend on the cluster's size.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{AlarmAction, AlarmType};
use leasehold_core::tls_session::{ClientIdentity, TlsSession, look_and_ask, read_to_close};
use leasehold_core::{Diagnosis, Finding, StoreError, TlsFailure, Verdict};
use tokio::io::AsyncWriteExt;

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
    /// Each member's own answer to `GET /health`, by name and client URL.
    asked: Vec<(String, Result<Member, String>)>,
}

/// What one member said over HTTP on its client URL.
#[derive(Debug, Clone, PartialEq)]
struct Member {
    /// `/health`'s verdict: `true`, `false` (with its reason), or what else it answered.
    health: String,
    /// Its clock less this host's, in seconds: the interval the `Date` header (whole
    /// seconds) and the round trip allow. `None` without a `Date` header.
    skew: Option<(f64, f64)>,
    /// The TLS session (over TLS).
    tls: Option<TlsSession>,
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
    let mut asked = Vec::new();
    let pair = store.config.tls_settings().and_then(|t| t.client.as_ref());
    let identity = ClientIdentity::from_pair(pair).map_err(|e| {
        StoreError::new(leasehold_core::StoreErrorKind::Config, "etcd", op).with_source(e)
    })?;
    for m in members.members() {
        let Some(url) = m.client_urls().first() else {
            continue;
        };
        let got = ask_health(url, identity.as_ref(), store.config.connect_bound()).await;
        asked.push((format!("{} {url}", m.name()), got));
    }
    let mut read = Read {
        asked,
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

/// Seconds since the Unix epoch of an HTTP `Date` header's value (IMF-fixdate:
/// `Fri, 04 Dec 2026 10:25:34 GMT`); `None` for anything else.
fn http_date(value: &str) -> Option<i64> {
    use time::{Date, Month};
    let mut parts = value.split_whitespace().skip(1);
    let day: i64 = parts.next()?.parse().ok()?;
    let month = match parts.next()? {
        "Jan" => Month::January,
        "Feb" => Month::February,
        "Mar" => Month::March,
        "Apr" => Month::April,
        "May" => Month::May,
        "Jun" => Month::June,
        "Jul" => Month::July,
        "Aug" => Month::August,
        "Sep" => Month::September,
        "Oct" => Month::October,
        "Nov" => Month::November,
        "Dec" => Month::December,
        _ => return None,
    };
    let year: i64 = parts.next()?.parse().ok()?;
    let mut hms = parts.next()?.split(':').map(|p| p.parse::<i64>().ok());
    let (h, m, sec) = (hms.next()??, hms.next()??, hms.next()??);
    if parts.next()? != "GMT" || !(1..=31).contains(&day) || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    // Counted on from the month's first day (a day past the month's end runs on into the
    // next), and the time of day likewise (a leap second is the next minute's first).
    let first = Date::from_calendar_date(i32::try_from(year).ok()?, month, 1).ok()?;
    let midnight = first.midnight().assume_utc().unix_timestamp();
    Some(midnight + (day - 1) * 86_400 + h * 3600 + m * 60 + sec)
}

fn unix_secs(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// A member's answer to `GET /health` (status line, headers, body), sent at `sent` and
/// complete at `received` by this host's clock, read as a [`Member`].
fn member_answer(answer: &[u8], sent: SystemTime, received: SystemTime) -> Member {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let date = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("date")
            .then(|| value.trim())
    });
    // The server read its clock at some moment between the send and the answer, and the
    // header drops the fraction: its clock was in [D, D + 1) then.
    let skew = date.and_then(http_date).map(|d| {
        #[allow(clippy::cast_precision_loss)]
        let d = d as f64;
        (d - unix_secs(received), d + 1.0 - unix_secs(sent))
    });
    let health = if body.contains("\"health\":\"true\"") {
        "healthy".to_owned()
    } else if body.contains("\"health\":\"false\"") {
        format!("unhealthy ({})", body.trim())
    } else {
        format!(
            "unknown answer ({})",
            head.lines().next().unwrap_or("nothing")
        )
    };
    Member {
        health,
        skew,
        tls: None,
    }
}

/// `GET /health` on a member's client URL (`http://` or `https://host:port`), over TLS
/// with the URL's client certificate for `https`, within `within`.
#[allow(
    clippy::disallowed_methods,
    reason = "a member's clock is compared with this host's wall clock"
)]
async fn ask_health(
    url: &str,
    client: Option<&ClientIdentity>,
    within: Duration,
) -> Result<Member, String> {
    let (tls, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(format!("not an http(s) URL: {url}"));
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    let (host, port) = authority
        .rsplit_once(':')
        .and_then(|(h, p)| {
            Some((
                h.trim_start_matches('[').trim_end_matches(']'),
                p.parse::<u16>().ok()?,
            ))
        })
        .ok_or_else(|| format!("no port in {url}"))?;
    let request = format!("GET /health HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    let attempt = async {
        let failed = |e: std::io::Error| e.to_string();
        let tcp = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(failed)?;
        let sent = SystemTime::now();
        if tls {
            let (session, answer) = look_and_ask(tcp, host, client, request.as_bytes(), 64 * 1024)
                .await
                .map_err(|e: TlsFailure| e.to_string())?;
            let mut m = member_answer(&answer, sent, SystemTime::now());
            m.tls = Some(session);
            Ok(m)
        } else {
            let mut tcp = tcp;
            tcp.write_all(request.as_bytes()).await.map_err(failed)?;
            let answer = read_to_close(&mut tcp, 64 * 1024).await.map_err(failed)?;
            Ok(member_answer(&answer, sent, SystemTime::now()))
        }
    };
    tokio::time::timeout(within, attempt)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {within:?}")))
}

/// A skew interval in words: `+0.4 s (between -0.1 and +0.9 s)`.
fn skew_words((low, high): (f64, f64)) -> String {
    format!(
        "{:+.1} s (between {low:+.1} and {high:+.1} s)",
        f64::midpoint(low, high)
    )
}

/// A member whose clock is surely further than this from this host's is warned about.
const SKEW_WARNING_SECS: f64 = 2.0;

/// Whether the range `key..end` (as `role_get` shows it) lies within `prefix`.
fn within(range: &str, prefix: &str) -> bool {
    range
        .split_once("..")
        .is_some_and(|(key, _)| !prefix.is_empty() && key.starts_with(prefix))
}

/// The facts `member health` and `clock skew` from each member's own answer, and a warning
/// for an unhealthy member or a clock surely more than [`SKEW_WARNING_SECS`] off.
fn members_asked(d: &mut Diagnosis, r: &Read) {
    if r.asked.is_empty() {
        return;
    }
    let mut health = Vec::new();
    let mut skews = Vec::new();
    for (member, got) in &r.asked {
        match got {
            Ok(m) => {
                health.push(format!("{member}: {}", m.health));
                if !m.health.starts_with("healthy") {
                    d.warn(format!("member {member} answers /health: {}", m.health));
                }
                match m.skew {
                    Some(skew) => {
                        skews.push(format!("{member}: {}", skew_words(skew)));
                        let surely = if skew.0 > 0.0 {
                            skew.0
                        } else if skew.1 < 0.0 {
                            -skew.1
                        } else {
                            0.0
                        };
                        if surely > SKEW_WARNING_SECS {
                            d.warn(format!(
                                "member {member}'s clock is at least {surely:.1} s off this \
                                 host's: leases do not depend on it (they run on the leader's \
                                 monotonic timer), but logs and the times `inspect` shows \
                                 disagree; synchronise the clocks (NTP)"
                            ));
                        }
                    }
                    None => skews.push(format!("{member}: unknown (no Date header)")),
                }
            }
            Err(why) => {
                health.push(format!("{member}: not reachable from here ({why})"));
                skews.push(format!("{member}: unknown"));
            }
        }
    }
    d.fact("member health", health.join("; "));
    d.fact(
        "clock skew",
        format!(
            "{} (each member's clock less this host's, from its Date header; leases run on \
             the members' monotonic timers, so skew decides no row)",
            skews.join("; ")
        ),
    );
}

#[allow(
    clippy::disallowed_methods,
    reason = "a certificate's validity is a wall-clock date"
)]
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
    members_asked(&mut d, r);
    if config.uses_tls() {
        let checked = "the store checks it against the URL's cacert (or the system's CAs) \
                       and the host";
        match r
            .asked
            .iter()
            .find_map(|(_, m)| m.as_ref().ok()?.tls.clone())
        {
            Some(session) => session.report(&mut d, checked, SystemTime::now()),
            None => {
                d.fact("TLS", "on (https); no member's session could be read");
                d.fact("peer certificate", checked);
            }
        }
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
    fn http_dates_are_read_to_the_second() {
        assert_eq!(
            http_date("Fri, 04 Dec 2026 00:00:00 GMT"),
            Some(1_796_342_400)
        );
        assert_eq!(
            http_date("Tue, 29 Feb 2000 00:00:00 GMT"),
            Some(951_782_400)
        );
        assert_eq!(http_date("Thu, 01 Jan 1970 00:00:01 GMT"), Some(1));
        for bad in [
            "",
            "Fri, 04 Foo 2026 00:00:00 GMT",
            "Fri, 04 Dec 2026 00:00 GMT",
            "Fri, 04 Dec 2026 24:00:00 GMT",
            "Fri, 04 Dec 2026 00:00:00 CET",
            "Fri, 32 Dec 2026 00:00:00 GMT",
        ] {
            assert_eq!(http_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_members_answer_gives_its_health_and_the_skew_interval() {
        let at = |s: f64| UNIX_EPOCH + Duration::from_secs_f64(s);
        let ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ndate: Fri, 04 Dec 2026 00:00:10 GMT\r\n\r\n{\"health\":\"true\",\"reason\":\"\"}";
        let m = member_answer(ok, at(1_796_342_400.0), at(1_796_342_400.5));
        assert_eq!(m.health, "healthy");
        // The member's clock read 10 s within [10, 11) while this host's went from 0 to 0.5.
        assert_eq!(m.skew, Some((9.5, 11.0)));
        let bad = b"HTTP/1.1 503 Service Unavailable\r\n\r\n{\"health\":\"false\",\"reason\":\"NOSPACE\"}";
        let m = member_answer(bad, at(0.0), at(0.0));
        assert!(
            m.health.starts_with("unhealthy") && m.health.contains("NOSPACE"),
            "{}",
            m.health
        );
        assert_eq!(m.skew, None);
        let odd = member_answer(b"HTTP/1.1 404 Not Found\r\n\r\n", at(0.0), at(0.0));
        assert_eq!(odd.health, "unknown answer (HTTP/1.1 404 Not Found)");
        assert_eq!(
            member_answer(b"", at(0.0), at(0.0)).health,
            "unknown answer (nothing)"
        );
    }

    #[test]
    fn only_a_skew_surely_above_the_bound_is_warned_about() {
        let member = |skew| Member {
            health: "healthy".into(),
            skew: Some(skew),
            tls: None,
        };
        let r = Read {
            asked: vec![
                ("a http://a:1".into(), Ok(member((1.5, 2.5)))),
                ("b http://b:1".into(), Ok(member((2.1, 3.0)))),
                ("c http://c:1".into(), Ok(member((-4.0, -2.5)))),
                ("d http://d:1".into(), Err("refused".into())),
            ],
            ..Read::default()
        };
        let mut d = Diagnosis::new();
        members_asked(&mut d, &r);
        let warned: Vec<_> = d.warnings.iter().map(|w| &w[..9]).collect();
        assert_eq!(warned, ["member b ", "member c "], "{:?}", d.warnings);
        assert!(d.warnings[0].contains("at least 2.1 s"));
        assert!(d.warnings[1].contains("at least 2.5 s"));
        let skew = d.fact_value("clock skew").unwrap();
        assert!(
            skew.starts_with("a http://a:1: +2.0 s (between +1.5 and +2.5 s); "),
            "{skew}"
        );
        assert!(skew.contains("d http://d:1: unknown"), "{skew}");
        assert!(
            d.fact_value("member health")
                .unwrap()
                .contains("d http://d:1: not reachable from here (refused)")
        );
    }

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
