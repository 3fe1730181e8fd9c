//! The clocks of a Sentinel primary's replicas, against the primary's (issue 24 item 5).
//!
//! Redis gives a replica each key's expiry as an absolute time of the primary's clock
//! (`PEXPIREAT`, `SET … PXAT`), and a replica promoted by a fail-over expires keys by its
//! own clock. A replica whose clock is ahead of the primary's by `d` therefore ends every
//! lease `d` early once promoted, while its holder, counting on its own monotonic clock
//! from the TTL the primary granted, still believes. The drift factor of the lease
//! configuration covers clock *rates*, not an offset between hosts.
//!
//! So the store measures, for each replica the primary lists (`ROLE`), an upper bound of
//! how far its clock is ahead: `TIME` on the primary and on the replica, sent at once,
//! each timed on the client's monotonic clock. With `P` and `R` the two answers, the
//! replica's offset is `R − P − (r − p)` where `r` and `p` are the (unknown) moments each
//! server read its clock, `r` within the replica's round trip and `p` within the
//! primary's; its largest value is `R − P + (p_received − r_sent)`. The smallest of a few
//! rounds is kept. It is measured on every new connection to a primary (before the
//! connection is used) and every `clock_check` by a task of the store.
//!
//! Every grant (acquire, renewal) reports the TTL the primary granted less the largest
//! positive offset, so the holder's deadline comes before the lease's end on any replica;
//! an offset above `max_clock_offset` is refused (a [`ClockOffset`](crate::ClockOffset)
//! error). A replica that cannot be reached keeps the offset last measured for it under
//! the same primary (none: it is not counted, and a warning says so).

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, Value};
use tokio::time::{Instant, timeout};

use leasehold_core::StoreError;

use crate::config::{NodeAddr, RedisConfig};

/// Rounds of `TIME` per replica and measurement; the smallest bound is kept.
const ROUNDS: usize = 3;

/// The measured offsets of the current primary's replicas.
#[derive(Debug, Default)]
struct State {
    /// The primary they were measured against.
    primary: Option<NodeAddr>,
    /// Per replica, the upper bound of how far its clock is ahead of the primary's, in
    /// µs (negative: behind).
    offsets: Vec<(NodeAddr, i64)>,
}

/// The replicas' clock offsets of a Sentinel store, and the largest one it accepts.
#[derive(Debug)]
pub(crate) struct ReplicaClocks {
    limit: Duration,
    state: Mutex<State>,
}

impl ReplicaClocks {
    pub(crate) fn new(limit: Duration) -> Self {
        Self {
            limit,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The largest positive offset (zero when every replica is behind or none is known),
    /// with the replica it belongs to.
    fn largest(&self) -> (Duration, Option<NodeAddr>, Option<NodeAddr>) {
        let st = self.state();
        let worst = st.offsets.iter().max_by_key(|(_, us)| *us);
        match worst {
            Some((node, us)) if *us > 0 => (
                Duration::from_micros(u64::try_from(*us).unwrap_or(u64::MAX)),
                Some(node.clone()),
                st.primary.clone(),
            ),
            _ => (Duration::ZERO, None, st.primary.clone()),
        }
    }

    /// How much to take off every TTL the primary grants: the largest positive offset.
    /// Refused ([`StoreErrorKind::Config`](leasehold_core::StoreErrorKind::Config), with a
    /// [`ClockOffset`](crate::ClockOffset) source) when it is above the limit.
    pub(crate) fn allowance(&self, op: &str) -> Result<Duration, StoreError> {
        let (ahead, replica, primary) = self.largest();
        if ahead <= self.limit {
            return Ok(ahead);
        }
        let show = |n: Option<NodeAddr>| n.map_or_else(|| "?".to_owned(), |n| n.to_string());
        Err(crate::error::clock_offset(
            op,
            crate::ClockOffset::new(show(replica), show(primary), ahead, self.limit),
        ))
    }

    /// [`allowance`](Self::allowance) without the limit: for a grant already made.
    pub(crate) fn current(&self) -> Duration {
        self.largest().0
    }

    /// Records the measurement of `replicas` against `primary`: a replica that could not
    /// be measured keeps its last offset under the same primary.
    fn record(&self, primary: &NodeAddr, measured: Vec<(NodeAddr, Result<i64, String>)>) {
        let mut st = self.state();
        let same_primary = st.primary.as_ref() == Some(primary);
        let mut offsets = Vec::with_capacity(measured.len());
        for (node, got) in measured {
            match got {
                Ok(us) => {
                    tracing::debug!(replica = %node, primary = %primary, offset_us = us, "redis replica clock measured");
                    offsets.push((node, us));
                }
                Err(why) => {
                    let last = same_primary
                        .then(|| {
                            st.offsets
                                .iter()
                                .find(|(n, _)| *n == node)
                                .map(|(_, us)| *us)
                        })
                        .flatten();
                    match last {
                        Some(us) => {
                            tracing::warn!(replica = %node, error = %why, offset_us = us, "cannot read a redis replica's clock; its last measured offset stays in force");
                            offsets.push((node, us));
                        }
                        None => {
                            tracing::warn!(replica = %node, error = %why, "cannot read a redis replica's clock and none was measured before: a lease may end early on it after a fail-over if its clock is ahead");
                        }
                    }
                }
            }
        }
        st.primary = Some(primary.clone());
        st.offsets = offsets;
    }

    /// Measures every replica in `replicas` against the primary on `primary_conn`, each
    /// within the connect timeout, all at once, and records the result.
    pub(crate) async fn measure(
        &self,
        cfg: &RedisConfig,
        primary: &NodeAddr,
        primary_conn: &MultiplexedConnection,
        replicas: Vec<NodeAddr>,
    ) {
        let measured = futures::future::join_all(replicas.into_iter().map(|node| async move {
            let got = timeout(
                cfg.connect_timeout(),
                offset_of(cfg, primary_conn.clone(), &node),
            )
            .await
            .unwrap_or_else(|_| Err("no answer within the connect timeout".to_owned()));
            (node, got)
        }))
        .await;
        self.record(primary, measured);
    }
}

/// The replicas a `ROLE` reply of a primary lists: `["master", offset, [[ip, port,
/// offset], ...]]`.
pub(crate) fn replicas_in_role(role: &Value) -> Vec<NodeAddr> {
    let Value::Array(items) = role else {
        return Vec::new();
    };
    let Some(Value::Array(replicas)) = items.get(2) else {
        return Vec::new();
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_owned),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    };
    replicas
        .iter()
        .filter_map(|r| match r {
            Value::Array(f) if f.len() >= 2 => {
                let host = text(&f[0])?;
                let port = text(&f[1])?.parse().ok()?;
                Some(NodeAddr::new(host, port))
            }
            _ => None,
        })
        .collect()
}

/// A connection of its own to `node` and its answer to `ROLE` (errors as text, unscrubbed).
async fn ask_role(
    cfg: &RedisConfig,
    node: &NodeAddr,
) -> Result<(MultiplexedConnection, Value), String> {
    let client = crate::discovery::client_for(cfg, node).map_err(|e| e.to_string())?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(cfg.connect_timeout()))
        .set_response_timeout(None);
    let mut c = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| e.to_string())?;
    let role = redis::cmd("ROLE")
        .query_async::<Value>(&mut c)
        .await
        .map_err(|e| e.to_string())?;
    Ok((c, role))
}

/// The clock offsets of the replicas of the primary at `node`, measured now on
/// connections of their own (for `Store::diagnose`): per replica `ROLE` lists, the upper
/// bound of how far its clock is ahead of the primary's in µs, or why it could not be
/// read. An error when the primary cannot be asked, or is not a primary.
pub(crate) async fn measure_once(
    cfg: &RedisConfig,
    node: &NodeAddr,
) -> Result<Vec<(NodeAddr, Result<i64, String>)>, String> {
    let scrub = |e: String| crate::error::scrub(&e, cfg.password().map(|p| p.expose()));
    let (primary, role) = timeout(cfg.connect_timeout(), ask_role(cfg, node))
        .await
        .map_err(|_| format!("{node} did not answer ROLE within the connect timeout"))?
        .map_err(scrub)?;
    if !crate::discovery::is_primary(&role) {
        return Err(format!("{node} is not a primary"));
    }
    Ok(
        futures::future::join_all(replicas_in_role(&role).into_iter().map(|replica| {
            let primary = primary.clone();
            async move {
                let got = timeout(cfg.connect_timeout(), offset_of(cfg, primary, &replica))
                    .await
                    .unwrap_or_else(|_| Err("no answer within the connect timeout".to_owned()));
                (replica, got)
            }
        }))
        .await,
    )
}

/// `TIME` in µs.
async fn time_us(c: &mut MultiplexedConnection) -> Result<i128, RedisError> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(c).await?;
    Ok(i128::from(secs) * 1_000_000 + i128::from(micros))
}

/// `a − b` in µs, signed.
fn signed_us(a: Instant, b: Instant) -> i128 {
    if a >= b {
        i128::try_from((a - b).as_micros()).unwrap_or(i128::MAX)
    } else {
        -i128::try_from((b - a).as_micros()).unwrap_or(i128::MAX)
    }
}

/// The upper bound of how far `node`'s clock is ahead of the primary's, in µs: the
/// smallest of [`ROUNDS`] rounds.
async fn offset_of(
    cfg: &RedisConfig,
    mut primary: MultiplexedConnection,
    node: &NodeAddr,
) -> Result<i64, String> {
    let client = crate::discovery::client_for(cfg, node).map_err(|e| e.to_string())?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(cfg.connect_timeout()))
        .set_response_timeout(None);
    let scrub =
        |e: RedisError| crate::error::scrub(&e.to_string(), cfg.password().map(|p| p.expose()));
    let mut replica = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(scrub)?;
    let mut best: Option<i128> = None;
    for _ in 0..ROUNDS {
        let (p, r) = tokio::join!(
            async {
                let v = time_us(&mut primary).await;
                (Instant::now(), v)
            },
            async {
                let sent = Instant::now();
                (sent, time_us(&mut replica).await)
            },
        );
        let (p_received, p_time) = p;
        let (r_sent, r_time) = r;
        let bound = r_time.map_err(scrub)? - p_time.map_err(scrub)? + signed_us(p_received, r_sent);
        best = Some(best.map_or(bound, |b| b.min(bound)));
    }
    let best = best.unwrap_or(0);
    Ok(i64::try_from(best).unwrap_or(if best > 0 { i64::MAX } else { i64::MIN }))
}

/// Measures the replicas of the current primary every `every`, on connections of its
/// own, until the store is gone. The primary is the one the store's connection last
/// reached (`primary`); a server that no longer answers `ROLE` as a primary is skipped
/// (the store reconnects and measures on its own).
pub(crate) async fn watch(
    clocks: Weak<ReplicaClocks>,
    cfg: RedisConfig,
    primary: Arc<Mutex<Option<NodeAddr>>>,
    every: Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        let Some(clocks) = clocks.upgrade() else {
            return;
        };
        let Some(node) = primary.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
            continue;
        };
        match timeout(cfg.connect_timeout(), ask_role(&cfg, &node)).await {
            Ok(Ok((c, role))) if crate::discovery::is_primary(&role) => {
                clocks
                    .measure(&cfg, &node, &c, replicas_in_role(&role))
                    .await;
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let e = crate::error::scrub(&e, cfg.password().map(|p| p.expose()));
                tracing::debug!(primary = %node, error = %e, "cannot reach the redis primary to measure its replicas' clocks");
            }
            Err(_) => {
                tracing::debug!(primary = %node, "the redis primary did not answer in time to measure its replicas' clocks");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_replicas() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let role = Value::Array(vec![
            b("master"),
            Value::Int(10),
            Value::Array(vec![
                Value::Array(vec![b("10.0.0.2"), b("6380"), b("10")]),
                Value::Array(vec![b("10.0.0.3"), b("6381"), b("9")]),
                Value::Array(vec![b("bad")]),
            ]),
        ]);
        assert_eq!(
            replicas_in_role(&role),
            vec![
                NodeAddr::new("10.0.0.2", 6380),
                NodeAddr::new("10.0.0.3", 6381)
            ]
        );
        assert!(replicas_in_role(&Value::Array(vec![b("slave")])).is_empty());
        assert!(replicas_in_role(&Value::Nil).is_empty());
    }

    #[test]
    fn the_allowance_is_the_largest_positive_offset_and_refused_above_the_limit() {
        let c = ReplicaClocks::new(Duration::from_millis(500));
        assert_eq!(c.allowance("acquire").unwrap(), Duration::ZERO);
        let p = NodeAddr::new("p", 1);
        let (a, b) = (NodeAddr::new("a", 2), NodeAddr::new("b", 3));
        c.record(
            &p,
            vec![(a.clone(), Ok(-3_000_000)), (b.clone(), Ok(1_200))],
        );
        assert_eq!(
            c.allowance("acquire").unwrap(),
            Duration::from_micros(1_200)
        );
        // A replica that cannot be read keeps its offset under the same primary...
        c.record(
            &p,
            vec![(a.clone(), Ok(-5)), (b.clone(), Err("down".into()))],
        );
        assert_eq!(c.current(), Duration::from_micros(1_200));
        // ... but not under another one.
        c.record(
            &NodeAddr::new("q", 4),
            vec![(b.clone(), Err("down".into()))],
        );
        assert_eq!(c.current(), Duration::ZERO);
        // Above the limit: refused, naming the replica, the primary, both durations.
        c.record(&p, vec![(b.clone(), Ok(5_000_000))]);
        let e = c.allowance("acquire").unwrap_err();
        assert_eq!(e.kind(), leasehold_core::StoreErrorKind::Config);
        let text = e.to_string();
        assert!(text.contains("b:3") && text.contains("p:1"), "{text}");
        assert!(text.contains("max_clock_offset"), "{text}");
        let source = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<crate::ClockOffset>())
            .expect("a ClockOffset source");
        assert_eq!(source.offset(), Duration::from_secs(5));
        assert_eq!(source.limit(), Duration::from_millis(500));
        assert_eq!(c.current(), Duration::from_secs(5));
    }

    #[test]
    fn signed_differences() {
        let t = Instant::now();
        let later = t + Duration::from_micros(250);
        assert_eq!(signed_us(later, t), 250);
        assert_eq!(signed_us(t, later), -250);
    }
}
