//! [`RedlockConfig`]: which independent Redis servers form the Redlock set and how the
//! store talks to them, parsed from a `redlock://` URL.

use std::fmt;
use std::time::Duration;

use leasehold_core::url::{
    HostPortError, Secret, UrlError, host_port, param_duration, param_number, param_value,
    percent_decode, split_url,
};
use leasehold_core::{StoreError, StoreErrorKind};
pub use leasehold_redis::TlsSettings;

use crate::BACKEND;

/// The default key prefix: the lease of key `k` is the Redis key `leasehold:{k}`.
pub const DEFAULT_PREFIX: &str = "leasehold:";
/// The longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 128;
/// The default bound on each request to one node. An acquire or a renewal also never
/// waits longer than a third of its TTL for one node.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(500);
/// The default bound on connecting to one node.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The default clock drift factor: the drift allowance is `ttl × factor + drift_min`.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// The default fixed part of the drift allowance.
pub const DEFAULT_DRIFT_MIN: Duration = Duration::from_millis(2);
/// The fewest nodes a Redlock set may have (with fewer, a majority is every node).
pub const MIN_NODES: usize = 3;
/// The most nodes a Redlock set may have.
pub const MAX_NODES: usize = 15;

fn config_error(msg: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Config, BACKEND, msg)
}

fn url_error(e: UrlError) -> StoreError {
    config_error(format!("Redlock: {e}"))
}

/// A Redis user name (optional, for ACL users) and password, the same on every node. The
/// password is never shown by `Debug`, `Display` or an error.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Credentials {
    user: Option<String>,
    password: Secret,
}

/// One node of the set: host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    host: String,
    port: u16,
}

impl Node {
    /// The host name or address (an IPv6 address without its brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// How to reach the independent Redis servers of a Redlock set and how the store
/// behaves.
///
/// Parsed from `redlock://[[user]:password@]host:port,host:port,host:port[,…][/][?params]`
/// by [`from_url`](Self::from_url): at least [`MIN_NODES`], at most [`MAX_NODES`]
/// distinct nodes, each an independent server (not replicas of one another). The
/// credentials, if any, are the same on every node. Parameters:
///
/// | parameter | meaning | default |
/// | --- | --- | --- |
/// | `prefix` | prepended to every Redis key (a namespace) | `leasehold:` |
/// | `node_timeout` | bound on one request to one node (an acquire or renewal also waits at most TTL/3) | 500 ms |
/// | `connect_timeout` | bound on connecting to one node | 1 s |
/// | `drift_factor` | clock drift factor: the allowance is `ttl × factor + drift_min` | 0.01 |
/// | `drift_min` | fixed part of the drift allowance | 2 ms |
/// | `allow_eviction` | open even if a node's `maxmemory-policy` may evict keys (exclusion then breaks; only fences hold) | `false` |
/// | `tls` | `true`: every node over verified TLS (server name checked); `false`: plain TCP | `false` |
/// | `tls_ca` | with `tls=true`: PEM file with the CA certificate(s) to trust | system roots |
/// | `tls_cert`, `tls_key` | with `tls=true`: PEM files with a client certificate chain and its key (mutual TLS) | none |
///
/// TLS is one setting for the whole set, with the same parameters as a `rediss://` URL of
/// the Redis store: every node is reached over TLS, or none (a set mixing TLS and plain
/// nodes cannot be written, so that no majority can be formed by nodes an attacker on
/// the network could impersonate). A failed handshake is a [`StoreErrorKind::Config`]
/// error with a [`leasehold_redis::TlsFailure`] source naming the node's host.
///
/// Unknown or repeated parameters are refused. `Debug` and `Display` never show the
/// password.
#[derive(Clone, PartialEq)]
pub struct RedlockConfig {
    nodes: Vec<Node>,
    prefix: String,
    node_timeout: Duration,
    connect_timeout: Duration,
    drift_factor: f64,
    drift_min: Duration,
    credentials: Option<Credentials>,
    allow_eviction: bool,
    tls: Option<TlsSettings>,
}

impl fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockConfig")
            .field("nodes", &self.nodes)
            .field("prefix", &self.prefix)
            .field("node_timeout", &self.node_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("drift_factor", &self.drift_factor)
            .field("drift_min", &self.drift_min)
            .field("credentials", &self.credentials)
            .field("allow_eviction", &self.allow_eviction)
            .field("tls", &self.tls)
            .finish()
    }
}

impl fmt::Display for RedlockConfig {
    /// The URL of the nodes, without the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("redlock://")?;
        if let Some(c) = &self.credentials {
            write!(f, "{}:***@", c.user.as_deref().unwrap_or(""))?;
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{n}")?;
        }
        if self.tls.is_some() {
            f.write_str("?tls=true")?;
        }
        Ok(())
    }
}

impl RedlockConfig {
    /// A configuration for the nodes at `nodes` (`host:port` each) with the defaults.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for fewer than [`MIN_NODES`] or more than
    /// [`MAX_NODES`] nodes, a node that is not `host:port`, or a node named twice.
    pub fn new<I, S>(nodes: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nodes = nodes
            .into_iter()
            .enumerate()
            .map(|(i, e)| parse_node(i + 1, e.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if nodes.len() < MIN_NODES || nodes.len() > MAX_NODES {
            return Err(config_error(format!(
                "a Redlock set has {MIN_NODES} to {MAX_NODES} independent Redis nodes, not {}",
                nodes.len()
            )));
        }
        for (i, n) in nodes.iter().enumerate() {
            if nodes[..i].contains(n) {
                return Err(config_error(format!(
                    "Redlock node {} is named twice: every node must be a different server",
                    i + 1
                )));
            }
        }
        Ok(Self {
            nodes,
            prefix: DEFAULT_PREFIX.to_owned(),
            node_timeout: DEFAULT_NODE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            drift_factor: DEFAULT_DRIFT_FACTOR,
            drift_min: DEFAULT_DRIFT_MIN,
            credentials: None,
            allow_eviction: false,
            tls: None,
        })
    }

    /// Parses `redlock://[[user]:password@]host:port,host:port,host:port[,…][/][?params]`.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for another scheme, too few or too many nodes, a bad
    /// `host:port`, a path, an unknown or repeated parameter, a bad value, or a malformed
    /// percent-escape in the credentials. The message never contains the password.
    ///
    /// ```
    /// use leasehold_core::StoreErrorKind;
    /// use leasehold_redlock::RedlockConfig;
    ///
    /// let c = RedlockConfig::from_url("redlock://a:6379,b:6379,c:6379?node_timeout=50ms")?;
    /// assert_eq!(c.nodes().len(), 3);
    /// assert_eq!(c.quorum(), 2);
    /// let err = RedlockConfig::from_url("redlock://a:6379,b:6379").unwrap_err();
    /// assert_eq!(err.kind(), StoreErrorKind::Config);
    /// # Ok::<(), leasehold_core::StoreError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let parts = split_url(url, "redlock").map_err(url_error)?;
        if parts.path.is_some_and(|p| p != "/") {
            return Err(config_error(
                "a Redlock URL has no path (no database index): use the prefix parameter for a namespace",
            ));
        }
        let (userinfo, hosts) = (parts.userinfo, parts.hosts);
        let mut config = Self::new(hosts.split(','))?;
        if let Some(userinfo) = userinfo {
            let (user, password) = userinfo.split_once(':').ok_or_else(|| {
                config_error(
                    "Redis credentials in a Redlock URL are [user]:password (the password is missing)",
                )
            })?;
            let user = percent_decode(user)
                .ok_or_else(|| config_error("the Redis user name has a malformed %-escape"))?;
            let password = percent_decode(password)
                .ok_or_else(|| config_error("the Redis password has a malformed %-escape"))?;
            if password.is_empty() {
                return Err(config_error("the Redis password in the URL is empty"));
            }
            config = config.credentials((!user.is_empty()).then_some(&user), password);
        }
        let mut tls: Option<bool> = None;
        let mut tls_settings = TlsSettings::default();
        let (mut tls_cert, mut tls_key) = (None, None);
        for (name, value) in parts.params {
            let value = param_value(name, value).map_err(url_error)?;
            let duration = || param_duration(name, &value).map_err(url_error);
            match name {
                "prefix" => config = config.prefix(value)?,
                "node_timeout" => config = config.node_timeout(duration()?)?,
                "connect_timeout" => config = config.connect_timeout(duration()?)?,
                "drift_min" => config = config.drift_min(duration()?)?,
                "allow_eviction" => {
                    config.allow_eviction = match value.as_str() {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(config_error(
                                "Redlock URL parameter \"allow_eviction\" is true or false",
                            ));
                        }
                    }
                }
                "drift_factor" => {
                    config = config.drift_factor(param_number(name, &value).map_err(url_error)?)?;
                }
                "tls" => {
                    tls = Some(match value.as_str() {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(config_error(
                                "Redlock URL parameter \"tls\" is true or false",
                            ));
                        }
                    });
                }
                "tls_ca" => tls_settings.ca_file = Some(value.into()),
                "tls_cert" => tls_cert = Some(value.into()),
                "tls_key" => tls_key = Some(value.into()),
                _ => {
                    let known = "prefix, node_timeout, connect_timeout, drift_factor, drift_min, \
                                 allow_eviction, tls, tls_ca, tls_cert, tls_key";
                    return Err(url_error(UrlError::unknown(name, known)));
                }
            }
        }
        match (tls_cert, tls_key) {
            (Some(c), Some(k)) => tls_settings.client_cert = Some((c, k)),
            (None, None) => {}
            _ => {
                return Err(config_error(
                    "Redlock URL parameters \"tls_cert\" and \"tls_key\" go together",
                ));
            }
        }
        if tls == Some(true) {
            config = config.tls(Some(tls_settings))?;
        } else if tls_settings != TlsSettings::default() {
            return Err(config_error(
                "Redlock URL parameters tls_ca, tls_cert and tls_key need tls=true (every node over TLS)",
            ));
        }
        Ok(config)
    }

    /// Sets the key prefix (the namespace of every Redis key). May be empty.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when it is longer than [`MAX_PREFIX_LEN`] bytes or holds
    /// a brace, a glob character (`*?[]\`), whitespace or a control character.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Result<Self, StoreError> {
        let prefix = prefix.into();
        if prefix.len() > MAX_PREFIX_LEN {
            return Err(config_error(format!(
                "the Redlock key prefix is longer than {MAX_PREFIX_LEN} bytes"
            )));
        }
        if prefix.chars().any(|c| {
            matches!(c, '{' | '}' | '*' | '?' | '[' | ']' | '\\')
                || c.is_control()
                || c.is_whitespace()
        }) {
            return Err(config_error(
                "the Redlock key prefix holds a brace, a glob character, whitespace or a control character",
            ));
        }
        self.prefix = prefix;
        Ok(self)
    }

    /// Sets the bound on one request to one node.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when it is zero or longer than a minute.
    pub fn node_timeout(mut self, timeout: Duration) -> Result<Self, StoreError> {
        self.node_timeout = check_dur("node_timeout", timeout, false)?;
        Ok(self)
    }

    /// Sets the bound on connecting to one node.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when it is zero or longer than a minute.
    pub fn connect_timeout(mut self, timeout: Duration) -> Result<Self, StoreError> {
        self.connect_timeout = check_dur("connect_timeout", timeout, false)?;
        Ok(self)
    }

    /// Sets the clock drift factor (`0 ≤ factor < 0.5`).
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when it is out of range or not finite.
    pub fn drift_factor(mut self, factor: f64) -> Result<Self, StoreError> {
        if !(0.0..0.5).contains(&factor) {
            return Err(config_error(
                "the Redlock drift_factor must be at least 0 and below 0.5",
            ));
        }
        self.drift_factor = factor;
        Ok(self)
    }

    /// Sets the fixed part of the drift allowance (may be zero, at most a minute).
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when it is longer than a minute.
    pub fn drift_min(mut self, drift: Duration) -> Result<Self, StoreError> {
        self.drift_min = check_dur("drift_min", drift, true)?;
        Ok(self)
    }

    /// Accepts nodes whose `maxmemory-policy` may evict keys (default: refused at open).
    /// An evicting node is a node that forgets leases early: exclusion can break, and only
    /// the fences protect the data.
    pub fn allow_eviction(mut self, on: bool) -> Self {
        self.allow_eviction = on;
        self
    }

    /// Every node over verified TLS with these settings (`None`: plain TCP, the default).
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when TLS is asked for but the crate was built without
    /// its `tls` feature.
    pub fn tls(mut self, tls: Option<TlsSettings>) -> Result<Self, StoreError> {
        if tls.is_some() && !cfg!(feature = "tls") {
            return Err(config_error(
                "Redlock over TLS needs leasehold-redlock built with its `tls` feature",
            ));
        }
        self.tls = tls;
        Ok(self)
    }

    /// The TLS settings, when every node is reached over TLS.
    pub fn tls_settings(&self) -> Option<&TlsSettings> {
        self.tls.as_ref()
    }

    /// Whether nodes that may evict keys are accepted.
    pub fn eviction_allowed(&self) -> bool {
        self.allow_eviction
    }

    /// Authenticates on every node with `password` (and `user`, for an ACL user).
    pub fn credentials(mut self, user: Option<&str>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials {
            user: user.map(str::to_owned),
            password: Secret(password.into()),
        });
        self
    }

    /// The nodes.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// How many nodes make a majority: `n / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The bound on one request to one node.
    pub fn node_bound(&self) -> Duration {
        self.node_timeout
    }

    /// The bound on connecting to one node.
    pub fn connect_bound(&self) -> Duration {
        self.connect_timeout
    }

    /// The drift allowance for a lease of `ttl`: `ttl × drift_factor + drift_min`.
    pub fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor)
            .saturating_add(self.drift_min)
    }

    /// The user name, if the store authenticates as an ACL user.
    pub fn user(&self) -> Option<&str> {
        self.credentials.as_ref().and_then(|c| c.user.as_deref())
    }

    pub(crate) fn password(&self) -> Option<&str> {
        self.credentials.as_ref().map(|c| c.password.expose())
    }
}

fn check_dur(name: &str, d: Duration, zero_ok: bool) -> Result<Duration, StoreError> {
    if (d.is_zero() && !zero_ok) || d > Duration::from_secs(60) {
        return Err(config_error(format!(
            "Redlock {name} must be {} and at most 1m, not {d:?}",
            if zero_ok {
                "at least zero"
            } else {
                "above zero"
            }
        )));
    }
    Ok(d)
}

/// Checks node number `n`. The messages do not repeat the text: in a malformed URL it may
/// hold part of the credentials.
fn parse_node(n: usize, e: &str) -> Result<Node, StoreError> {
    let bad = |e: HostPortError| config_error(format!("Redlock node {n} {e}"));
    let (host, port) = host_port(e).map_err(bad)?;
    let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        // An IPv6 address, kept without its brackets.
        Some(ip)
            if !ip.is_empty()
                && ip
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.') =>
        {
            ip.to_owned()
        }
        Some(_) => return Err(bad(HostPortError::BadHost)),
        None => host.to_ascii_lowercase(),
    };
    Ok(Node { host, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_part() {
        let c = RedlockConfig::from_url(
            "redlock://bob:p%40ss@a:1,B.example:2,[::1]:3/?prefix=x:&node_timeout=50ms\
             &connect_timeout=2s&drift_factor=0.02&drift_min=5ms",
        )
        .unwrap();
        let nodes: Vec<String> = c.nodes().iter().map(ToString::to_string).collect();
        assert_eq!(nodes, ["a:1", "b.example:2", "[::1]:3"]);
        assert_eq!(c.nodes()[2].host(), "::1");
        assert_eq!(c.quorum(), 2);
        assert_eq!(c.key_prefix(), "x:");
        assert_eq!(c.node_bound(), Duration::from_millis(50));
        assert_eq!(c.connect_bound(), Duration::from_secs(2));
        assert_eq!(c.drift(Duration::from_secs(10)), Duration::from_millis(205));
        assert_eq!(c.user(), Some("bob"));
        assert_eq!(c.password(), Some("p@ss"));
        let shown = format!("{c:?} {c}");
        assert!(
            !shown.contains("p@ss") && !shown.contains("p%40ss"),
            "{shown}"
        );
        assert!(shown.contains("redlock://bob:***@a:1,"), "{shown}");
    }

    #[test]
    fn defaults_and_quorums() {
        let c = RedlockConfig::from_url("redlock://h:1,h:2,h:3").unwrap();
        assert_eq!(c.key_prefix(), DEFAULT_PREFIX);
        assert_eq!(c.node_bound(), DEFAULT_NODE_TIMEOUT);
        assert_eq!(c.user(), None);
        assert_eq!(c.password(), None);
        // The algorithm's allowance: 1 % of the TTL plus 2 ms.
        assert_eq!(c.drift(Duration::from_secs(1)), Duration::from_millis(12));
        let five = RedlockConfig::new(["h:1", "h:2", "h:3", "h:4", "h:5"]).unwrap();
        assert_eq!(five.quorum(), 3);
        let four = RedlockConfig::new(["h:1", "h:2", "h:3", "h:4"]).unwrap();
        assert_eq!(four.quorum(), 3);
        let pw_only = RedlockConfig::from_url("redlock://:pw@h:1,h:2,h:3").unwrap();
        assert_eq!((pw_only.user(), pw_only.password()), (None, Some("pw")));
    }

    #[test]
    fn rejects_bad_urls_with_config_errors() {
        for bad in [
            "redis://h:1,h:2,h:3",
            "redlock://",
            "redlock://h:1",
            "redlock://h:1,h:2",
            "redlock://h:1,h:2,h:1",
            "redlock://h:1,H:2,h:2",
            "redlock://h:1,h:2,h",
            "redlock://h:1,h:2,h:",
            "redlock://h:1,h:2,h:0",
            "redlock://h:1,h:2,h:70000",
            "redlock://h:1,h:2,h:12x",
            "redlock://h:1,h:2,h:+3",
            "redlock://h:1,h:2,h:3,",
            "redlock://h:1,h:2,h:3/0",
            "redlock://h:1,h:2,h:3?colour=blue",
            "redlock://h:1,h:2,h:3?node_timeout=soon",
            "redlock://h:1,h:2,h:3?node_timeout=0ms",
            "redlock://h:1,h:2,h:3?node_timeout=2h",
            "redlock://h:1,h:2,h:3?connect_timeout=0s",
            "redlock://h:1,h:2,h:3?drift_factor=0.5",
            "redlock://h:1,h:2,h:3?drift_factor=-0.1",
            "redlock://h:1,h:2,h:3?drift_factor=NaN",
            "redlock://h:1,h:2,h:3?drift_factor=inf",
            "redlock://h:1,h:2,h:3?drift_min=1h",
            "redlock://h:1,h:2,h:3?prefix=a{b",
            "redlock://h:1,h:2,h:3?prefix=a*",
            "redlock://h:1,h:2,h:3?prefix=a%20b",
            "redlock://h:1,h:2,h:3?prefix=a&prefix=b",
            "redlock://u@h:1,h:2,h:3",
            "redlock://u:@h:1,h:2,h:3",
            "redlock://u:p%zz@h:1,h:2,h:3",
            "redlock://h:1,h:2,h:3#frag",
            "redlock://bad host:1,h:2,h:3",
            "redlock://[zz]:1,h:2,h:3",
            "redlock://[]:1,h:2,h:3",
        ] {
            let err = RedlockConfig::from_url(bad).expect_err(bad);
            assert_eq!(err.kind(), StoreErrorKind::Config, "{bad}: {err}");
        }
        let many: Vec<String> = (1..=16).map(|p| format!("h:{p}")).collect();
        assert!(RedlockConfig::new(&many).is_err());
        assert!(RedlockConfig::new(&many[..15]).is_ok());
    }

    /// The URL's shape is checked by the core's `split_url` (a typed `UrlError`); its
    /// sentence is the message, unchanged.
    #[test]
    fn malformed_urls_say_what_is_wrong() {
        for (bad, said) in [
            (
                "redis://h:1,h:2,h:3",
                "redlock store: Redlock: the URL must start with redlock://",
            ),
            (
                "redlock://h:1,h:2,h:3#frag",
                "redlock store: Redlock: the URL has a fragment (#); this kind of URL takes none",
            ),
            (
                "redlock://h:1,h:2,h:3?prefix=a&prefix=b",
                r#"redlock store: Redlock: URL parameter "prefix" is repeated"#,
            ),
        ] {
            let err = RedlockConfig::from_url(bad).expect_err(bad);
            assert_eq!(err.kind(), StoreErrorKind::Config, "{bad}");
            assert_eq!(err.to_string(), said, "{bad}");
        }
    }

    #[test]
    fn errors_never_show_the_password() {
        for url in [
            "redlock://u:sentinel-pw@h:1,h:2,h:3?colour=blue",
            "redlock://u:sentinel-pw@h:0,h:2,h:3",
            "redlock://u:sentinel-pw?@h:1,h:2,h:3",
            "redlock://u:sentinel-pw#@h:1,h:2,h:3",
            "redlock://u:sentinel-pw/@h:1,h:2,h:3",
            "redlock://u:sentinel-pw",
            "redlock://u:sentinel-pw@h:1",
        ] {
            let err = RedlockConfig::from_url(url).unwrap_err();
            assert!(
                !format!("{err} {err:?}").contains("sentinel-pw"),
                "{url}: {err}"
            );
        }
    }
}
