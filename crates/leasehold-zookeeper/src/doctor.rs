//! `Store::diagnose` for ZooKeeper: the ensemble, the session the client was granted, and
//! the settings (where the server tells them) that decide the ZooKeeper rows.

use std::time::Duration;

use leasehold_core::{Diagnosis, Finding, StoreError, Verdict};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zookeeper_client as zk;

use crate::error::map_err;
use crate::session::ZkStore;

/// How long the `srvr` four-letter word may take.
const SRVR_BOUND: Duration = Duration::from_secs(2);

/// The answer of `srvr` on `host` (`host:port`), if the server allows it (its
/// `4lw.commands.whitelist`) on a plaintext port.
async fn srvr(host: &str) -> Option<String> {
    let asked = async {
        let mut s = tokio::net::TcpStream::connect(host).await.ok()?;
        s.write_all(b"srvr").await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out)
    };
    tokio::time::timeout(SRVR_BOUND, asked)
        .await
        .ok()
        .flatten()
        .filter(|t| t.starts_with("Zookeeper version"))
}

/// The members listed in the ensemble's `/zookeeper/config` (`server.N=…` lines).
fn members(config: &str) -> Vec<String> {
    config
        .lines()
        .filter(|l| l.starts_with("server."))
        .map(str::to_owned)
        .collect()
}

pub(crate) async fn diagnose(store: &ZkStore) -> Result<Diagnosis, StoreError> {
    let session = store.session().await?;
    let config = match session.client.get_data("/zookeeper/config").await {
        Ok((data, _)) => String::from_utf8_lossy(&data).into_owned(),
        Err(zk::Error::NoNode | zk::Error::NoAuth) => String::new(),
        Err(e) => return Err(map_err("diagnose", e)),
    };
    let c = &store.inner.config;
    // `srvr` is a plaintext four-letter word: a TLS-only server does not answer it.
    let version = match c.hosts().first() {
        Some(h) if !c.uses_tls() => srvr(h).await,
        _ => None,
    };
    let mut d = judge(
        version.as_deref(),
        &members(&config),
        session.timeout,
        c.session_timeout_asked(),
        c.ensemble_tick(),
        c.hosts().len(),
    );
    connection(&mut d, c.uses_tls(), c.user());
    if let Some(tls) = c.tls_settings() {
        let look = look(c.hosts(), tls, c.connect_bound()).await;
        leasehold_core::tls_session::report_look(&mut d, &look, CHECKED);
    }
    Ok(d)
}

/// How the store's own connections check a server's certificate.
const CHECKED: &str =
    "the store checks it against the URL's cacert (or the system's CAs) and the host";

/// The TLS session of the first of `hosts` (`host:port` each) that completes a handshake
/// of leasehold's own, with the URL's client certificate (a secure port with
/// `ssl.clientAuth=need` requires one).
async fn look(
    hosts: &[String],
    tls: &crate::config::TlsSettings,
    within: Duration,
) -> Result<leasehold_core::tls_session::TlsSession, leasehold_core::TlsFailure> {
    use leasehold_core::tls_session::{ClientIdentity, look_at};
    use leasehold_core::{TlsFailure, TlsProblem};
    let identity = ClientIdentity::from_pair(tls.client.as_ref())?;
    let mut last = TlsFailure::new(TlsProblem::Other, None, "no host in the URL");
    for h in hosts {
        let Some((host, port)) = h.rsplit_once(':').and_then(|(host, p)| {
            Some((
                host.trim_start_matches('[').trim_end_matches(']'),
                p.parse().ok()?,
            ))
        }) else {
            continue;
        };
        match look_at(host, port, identity.as_ref(), within).await {
            Ok(session) => return Ok(session),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The connection's TLS and identity, and what an identity's ACLs let others do.
fn connection(d: &mut Diagnosis, tls: bool, user: Option<&str>) {
    if tls {
        d.fact("TLS", "on (the secure client port)");
        d.fact("peer certificate", CHECKED);
    } else {
        d.fact("TLS", "none: the connection is plaintext");
        d.warn(
            "plaintext: use tls=true on the ensemble's secure client port (docs/connections.md)",
        );
    }
    match user {
        Some(u) => {
            d.fact(
                "identity",
                format!("digest user {u}: every node leasehold creates is this identity's only"),
            );
        }
        None => {
            d.fact("identity", "none (no digest credentials)");
            d.warn(
                "no credentials: every node leasehold creates is open to any client, which can \
                 delete a holder's node or a fence record; give the URL user:password@",
            );
        }
    }
}

fn judge(
    srvr: Option<&str>,
    members: &[String],
    granted: Duration,
    asked: Duration,
    tick: Option<Duration>,
    hosts: usize,
) -> Diagnosis {
    let mut d = Diagnosis::new();
    let version = srvr
        .and_then(|t| t.lines().next())
        .and_then(|l| l.strip_prefix("Zookeeper version: "))
        .map(|v| v.split(',').next().unwrap_or(v).trim().to_owned());
    d.fact(
        "server version",
        match version {
            Some(v) => format!("ZooKeeper {v}"),
            None => "ZooKeeper (version unknown: the four-letter word srvr is not allowed on \
                     this port)"
                .to_owned(),
        },
    );
    d.fact(
        "session timeout",
        format!(
            "{} ms granted ({} ms asked): leases are at most this long",
            granted.as_millis(),
            asked.as_millis()
        ),
    );
    d.fact(
        "tickTime",
        match tick {
            Some(t) => format!("{} ms (from the URL's tick_time)", t.as_millis()),
            None => "unknown (clients cannot read it; give tick_time in the URL)".to_owned(),
        },
    );
    d.fact("syncLimit", "unknown (clients cannot read it)");
    let n = if members.is_empty() {
        hosts
    } else {
        members.len()
    };
    d.fact(
        "members",
        if members.is_empty() {
            format!("{hosts} in the URL (/zookeeper/config is empty)")
        } else {
            members.join("; ")
        },
    );
    d.finding(Finding::new(
        "restart with persistence",
        Verdict::Holds,
        "the transaction log (forceSync=yes unless changed, which clients cannot see)",
        "ZooKeeper logs every transaction before it answers: a restart keeps the lease and its \
         fence",
    ));
    d.finding(if n >= 3 {
        Finding::new(
            "fail-over",
            Verdict::Holds,
            format!("{n} members"),
            "a quorum carries every grant: losing a minority keeps leases and fences",
        )
    } else {
        Finding::new(
            "fail-over",
            Verdict::Unknown,
            format!("{n} member(s)"),
            "fewer than three members: losing one stops the ensemble (it fails closed)",
        )
    });
    if granted < asked {
        d.warn(format!(
            "the ensemble granted a {} ms session, less than the {} ms asked: its \
             maxSessionTimeout bounds every lease",
            granted.as_millis(),
            asked.as_millis()
        ));
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ensemble_size_decides_the_fail_over_row() {
        let s = Duration::from_secs(10);
        let three = [
            "server.1=a:1:2:participant;0.0.0.0:2181".to_owned(),
            "server.2=b:1:2:participant;0.0.0.0:2181".to_owned(),
            "server.3=c:1:2:participant;0.0.0.0:2181".to_owned(),
        ];
        let d = judge(
            Some("Zookeeper version: 3.8.0-x, built on y\nLatency"),
            &three,
            s,
            s,
            None,
            1,
        );
        assert_eq!(d.row("fail-over").unwrap().verdict, Verdict::Holds);
        assert_eq!(d.fact_value("server version"), Some("ZooKeeper 3.8.0-x"));
        assert!(d.warnings.is_empty());
        let d = judge(
            None,
            &[],
            Duration::from_secs(4),
            s,
            Some(Duration::from_secs(2)),
            1,
        );
        assert_eq!(d.row("fail-over").unwrap().verdict, Verdict::Unknown);
        assert!(d.fact_value("server version").unwrap().contains("unknown"));
        assert_eq!(
            d.fact_value("tickTime"),
            Some("2000 ms (from the URL's tick_time)")
        );
        assert_eq!(d.warnings.len(), 1);
        assert_eq!(
            members("version=1\nserver.1=a\nserver.2=b\n"),
            ["server.1=a", "server.2=b"]
        );
    }
}
