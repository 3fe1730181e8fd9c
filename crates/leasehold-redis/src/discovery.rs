//! How the store reaches a node: a client for one address (credentials, TLS, address
//! map), whether a `ROLE` reply is a primary's, and finding the primary through the
//! sentinels. The connection (`conn.rs`), the replica clocks and the notices all build
//! on it.

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo,
    RedisConnectionInfo, RedisError, Value,
};
use tokio::time::timeout;

use leasehold_core::{StoreError, StoreErrorKind};

use crate::BACKEND;
use crate::config::{NodeAddr, RedisConfig};
use crate::error::{self, Phase};

/// Whether a `ROLE` reply is a primary's.
pub(crate) fn is_primary(role: &Value) -> bool {
    matches!(role, Value::Array(items)
        if matches!(items.first(), Some(Value::BulkString(r)) if r == b"master"))
}

/// Finds the current primary through the sentinels (see [`Discovery::primary`]).
pub(crate) struct Discovery {
    pub(crate) sentinels: Vec<(NodeAddr, Client)>,
    pub(crate) master: String,
    pub(crate) cfg: RedisConfig,
}

impl Discovery {
    pub(crate) fn new(
        cfg: &RedisConfig,
        sentinels: &[NodeAddr],
        master: &str,
    ) -> Result<Self, StoreError> {
        // The sentinels are reached like the data servers (TLS and its files alike), with
        // the sentinels' own credentials, if any, and no database.
        let (user, password) = cfg.sentinel_credentials();
        let sentinels = sentinels
            .iter()
            .map(|s| {
                let s = cfg.map_addr(s);
                crate::tls::client(
                    &s.host,
                    s.port,
                    cfg.tls(),
                    0,
                    user,
                    password.map(|p| p.expose()),
                )
                .map(|c| (s, c))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            sentinels,
            master: master.to_owned(),
            cfg: cfg.clone(),
        })
    }

    /// The primary's possible addresses, best first: every sentinel is asked (its
    /// `GET-MASTER-ADDR-BY-NAME` and the `config-epoch` of its `SENTINEL MASTER`, each
    /// within the connect timeout); an address named with a higher epoch, then by more
    /// sentinels, comes first. Right after a fail-over the sentinels that did not run it
    /// still name the old primary for a moment; the caller connects to the first candidate
    /// that answers `ROLE` as a primary.
    pub(crate) async fn candidates(&self) -> Result<Vec<NodeAddr>, StoreError> {
        let answers = futures::future::join_all(self.sentinels.iter().map(|(addr, client)| async move {
            let ask = async {
                let mut c = client.get_multiplexed_async_connection().await?;
                let named: Option<(String, u16)> = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.master)
                    .query_async(&mut c)
                    .await?;
                let fields: Vec<String> = redis::cmd("SENTINEL")
                    .arg("MASTER")
                    .arg(&self.master)
                    .query_async(&mut c)
                    .await
                    .unwrap_or_default();
                Ok::<_, RedisError>((named, config_epoch(&fields)))
            };
            match timeout(self.cfg.connect_timeout(), ask).await {
                Ok(Ok((Some((host, port)), epoch))) => Ok((epoch, NodeAddr::new(host, port))),
                Ok(Ok((None, _))) => Err(StoreError::new(
                    StoreErrorKind::Config,
                    BACKEND,
                    format!(
                        "sentinel {addr} does not monitor a primary named `{}`: check the URL's path",
                        self.master
                    ),
                )),
                Ok(Err(e)) => Err(error::map_at(
                    &if error::is_auth_failure(&e) {
                        format!(
                            "asking sentinel {addr} for the primary (the sentinels' own credentials: URL parameters sentinel_password and sentinel_username, or sentinel_auth=same for the URL's)"
                        )
                    } else {
                        format!("asking sentinel {addr} for the primary")
                    },
                    Phase::Connect,
                    &e,
                    &self.cfg.secrets(),
                    Some(&addr.host),
                    self.cfg.tls_without_client_cert(),
                )),
                Err(_) => Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    BACKEND,
                    format!("sentinel {addr} did not answer in time"),
                )),
            }
        }))
        .await;
        // address → (highest epoch, votes)
        let mut ranked: Vec<(NodeAddr, u64, usize)> = Vec::new();
        let mut last = None;
        for a in answers {
            match a {
                Ok((epoch, node)) => match ranked.iter_mut().find(|(n, _, _)| *n == node) {
                    Some(r) => {
                        r.1 = r.1.max(epoch);
                        r.2 += 1;
                    }
                    None => ranked.push((node, epoch, 1)),
                },
                Err(e) => last = Some(e),
            }
        }
        if ranked.is_empty() {
            return Err(last.unwrap_or_else(|| {
                StoreError::new(StoreErrorKind::Config, BACKEND, "no sentinel to ask")
            }));
        }
        ranked.sort_by_key(|r| std::cmp::Reverse((r.1, r.2)));
        Ok(ranked.into_iter().map(|(n, _, _)| n).collect())
    }

    /// Connects to the first candidate that answers `ROLE` as a primary.
    pub(crate) async fn connect_primary(
        &self,
        config: &AsyncConnectionConfig,
    ) -> Result<(NodeAddr, MultiplexedConnection), StoreError> {
        let mut last = None;
        for node in self.candidates().await? {
            let client = client_for(&self.cfg, &node)?;
            let attempt = async {
                let mut c = client
                    .get_multiplexed_async_connection_with_config(config)
                    .await?;
                let role = redis::cmd("ROLE").query_async::<Value>(&mut c).await?;
                Ok::<_, RedisError>((c, is_primary(&role)))
            };
            match timeout(self.cfg.connect_timeout(), attempt).await {
                Ok(Ok((c, true))) => return Ok((node, c)),
                Ok(Ok((_, false))) => {
                    last = Some(StoreError::new(
                        StoreErrorKind::Unavailable,
                        BACKEND,
                        format!(
                            "{node}, named primary by Sentinel, is not a primary (a fail-over is under way); ask again"
                        ),
                    ))
                }
                Ok(Err(e)) => {
                    last = Some(error::map_at(
                        &format!("connecting to the primary {node} (named by Sentinel)"),
                        Phase::Connect,
                        &e,
                        &self.cfg.secrets(),
                        Some(&node.host),
                        self.cfg.tls_without_client_cert(),
                    ))
                }
                Err(_) => {
                    last = Some(StoreError::new(
                        StoreErrorKind::Unavailable,
                        BACKEND,
                        format!("connecting to {node}: no answer in time"),
                    ))
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            StoreError::new(StoreErrorKind::Unavailable, BACKEND, "no primary found")
        }))
    }

    /// A client for the most likely primary (for pub/sub: a `PUBLISH` on the primary
    /// reaches its replicas' subscribers too).
    pub(crate) async fn client(&self) -> Result<(NodeAddr, Client), StoreError> {
        let node = self.candidates().await?.into_iter().next().ok_or_else(|| {
            StoreError::new(StoreErrorKind::Unavailable, BACKEND, "no primary found")
        })?;
        let client = client_for(&self.cfg, &node)?;
        Ok((node, client))
    }
}

fn config_err(msg: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Config, BACKEND, msg)
}

#[cfg(feature = "tls")]
pub(crate) fn tls_certificates(
    cfg: &RedisConfig,
) -> Result<Option<redis::TlsCertificates>, StoreError> {
    cfg.tls().map(crate::tls::certificates).transpose()
}

pub(crate) fn node_info(cfg: &RedisConfig, node: &NodeAddr) -> Result<ConnectionInfo, StoreError> {
    let node = cfg.map_addr(node);
    let addr = if cfg.tls().is_some() {
        if !cfg!(feature = "tls") {
            return Err(config_err(
                "TLS (rediss) needs leasehold-redis built with its `tls` feature",
            ));
        }
        ConnectionAddr::TcpTls {
            host: node.host,
            port: node.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(node.host, node.port)
    };
    let mut redis = RedisConnectionInfo::default()
        .set_db(i64::from(cfg.db()))
        .set_skip_set_lib_name();
    if let Some(u) = cfg.username() {
        redis = redis.set_username(u);
    }
    if let Some(p) = cfg.password() {
        redis = redis.set_password(p.expose());
    }
    let info = addr
        .into_connection_info()
        .map_err(|e| error::map("configuring", Phase::Connect, &e, None))?;
    Ok(info.set_redis_settings(redis))
}

pub(crate) fn client_for(cfg: &RedisConfig, node: &NodeAddr) -> Result<Client, StoreError> {
    let node = cfg.map_addr(node);
    crate::tls::client(
        &node.host,
        node.port,
        cfg.tls(),
        i64::from(cfg.db()),
        cfg.username(),
        cfg.password().map(|p| p.expose()),
    )
}

/// The `config-epoch` of a `SENTINEL MASTER` reply (field, value, field, ...); 0 if absent.
fn config_epoch(fields: &[String]) -> u64 {
    fields
        .chunks_exact(2)
        .find(|kv| kv[0] == "config-epoch")
        .and_then(|kv| kv[1].parse().ok())
        .unwrap_or(0)
}
