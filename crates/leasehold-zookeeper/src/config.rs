//! [`ZkConfig`]: where the ZooKeeper ensemble is and how the store talks to it, parsed from
//! a `zookeeper://` URL.

use std::fmt;
use std::time::Duration;

use leasehold_core::StoreError;
#[cfg(doc)]
use leasehold_core::StoreErrorKind;
use leasehold_core::url::{ConfigErrors, UrlError, param_duration, percent_decode, split_url};

use crate::BACKEND;

/// The default root path: every lease lives under `/leasehold`.
pub const DEFAULT_CHROOT: &str = "/leasehold";
/// The default session timeout asked of the ensemble (it bounds every grant's TTL).
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// The default bound on each operation (all of its requests together).
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(5);
/// The default bound on establishing a session.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest root path, in bytes.
pub const MAX_CHROOT_LEN: usize = 256;

const CONFIG: ConfigErrors = ConfigErrors {
    backend: BACKEND,
    label: "zookeeper",
};

/// How to reach a ZooKeeper ensemble and how the store behaves.
///
/// Parsed from `zookeeper://host:port[,host:port…][/chroot][?params]` by
/// [`from_url`](Self::from_url). Parameters:
///
/// | parameter | meaning | default |
/// | --- | --- | --- |
/// | `session_timeout` | the session timeout asked for (the server bounds it) | 10 s |
/// | `timeout` | bound on each operation (`250ms`, `2s`, …) | 5 s |
/// | `connect_timeout` | bound on establishing a session | 5 s |
/// | `tick_time` | the ensemble's `tickTime` (see [`tick_time`](Self::tick_time)) | half the session timeout |
///
/// Unknown parameters are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkConfig {
    hosts: Vec<String>,
    chroot: String,
    session_timeout: Duration,
    op_timeout: Duration,
    connect_timeout: Duration,
    tick_time: Option<Duration>,
}

impl fmt::Display for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "zookeeper://{}{}", self.hosts.join(","), self.chroot)
    }
}

impl ZkConfig {
    /// A configuration for the servers at `hosts` (`host:port` each) with the defaults.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when there is no host or one is not `host:port`.
    pub fn new<I, S>(hosts: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Self {
            hosts: CONFIG.hosts(hosts, "host")?,
            chroot: DEFAULT_CHROOT.to_owned(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            op_timeout: DEFAULT_OP_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            tick_time: None,
        })
    }

    /// Parses `zookeeper://host:port[,host:port…][/chroot][?params]`.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for another scheme, a missing or bad `host:port`, user
    /// information (ZooKeeper authentication is not supported), a bad root path, an unknown
    /// or repeated parameter, or a bad value.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::StoreErrorKind;
    /// use leasehold_zookeeper::ZkConfig;
    ///
    /// let c = ZkConfig::from_url("zookeeper://10.0.0.1:2181,10.0.0.2:2181/app/locks?session_timeout=6s")?;
    /// assert_eq!(c.hosts(), ["10.0.0.1:2181", "10.0.0.2:2181"]);
    /// assert_eq!(c.chroot_path(), "/app/locks");
    /// assert_eq!(c.session_timeout_asked(), Duration::from_secs(6));
    /// let err = ZkConfig::from_url("zookeeper://h:2181?colour=blue").unwrap_err();
    /// assert_eq!(err.kind(), StoreErrorKind::Config);
    /// # Ok::<(), leasehold_core::StoreError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let parts = split_url(url, "zookeeper").map_err(|e| CONFIG.url(e))?;
        if parts.userinfo.is_some() {
            return Err(CONFIG.error(
                "zookeeper URLs take no user information: authentication is not supported",
            ));
        }
        let mut config = Self::new(parts.hosts.split(','))?;
        if let Some(path) = parts.path {
            let path = percent_decode(path)
                .ok_or_else(|| CONFIG.error("the zookeeper root path has a malformed %-escape"))?;
            config = config.chroot(path)?;
        }
        for (name, value) in parts.params {
            let d = param_duration(name, value).map_err(|e| CONFIG.url(e));
            match name {
                "session_timeout" => config = config.session_timeout(d?)?,
                "timeout" => config = config.op_timeout(d?)?,
                "connect_timeout" => config = config.connect_timeout(d?)?,
                "tick_time" => config = config.tick_time(d?)?,
                _ => {
                    let known = "session_timeout, timeout, connect_timeout, tick_time";
                    return Err(CONFIG.url(UrlError::unknown(name, known)));
                }
            }
        }
        Ok(config)
    }

    /// Sets the root path under which every lease lives (created if missing).
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] unless it is an absolute ZooKeeper path other than `/`
    /// (no empty, `.` or `..` component, no trailing `/`, no control character), at most
    /// [`MAX_CHROOT_LEN`] bytes, and not under `/zookeeper` (the server's own).
    pub fn chroot(mut self, path: impl Into<String>) -> Result<Self, StoreError> {
        let path = path.into();
        let path = if path.len() > 1 {
            path.strip_suffix('/').unwrap_or(&path).to_owned()
        } else {
            path
        };
        if path == "/" || path.is_empty() {
            return Err(CONFIG.error(
                "the zookeeper root path is /: leases would mix with every other node (use e.g. /leasehold)",
            ));
        }
        if path.len() > MAX_CHROOT_LEN {
            return Err(CONFIG.error(format!(
                "the zookeeper root path is longer than {MAX_CHROOT_LEN} bytes"
            )));
        }
        let bad_component = path
            .strip_prefix('/')
            .map(|p| p.split('/').any(|c| c.is_empty() || c == "." || c == ".."))
            .unwrap_or(true);
        if bad_component || path.chars().any(char::is_control) {
            return Err(CONFIG.error(
                "the zookeeper root path must be absolute, with no empty, . or .. component and no control character",
            ));
        }
        if path == "/zookeeper" || path.starts_with("/zookeeper/") {
            return Err(CONFIG
                .error("the zookeeper root path may not be under /zookeeper (the server's own)"));
        }
        self.chroot = path;
        Ok(self)
    }

    /// Sets the session timeout asked of the ensemble. The server bounds it to its
    /// `minSessionTimeout`..`maxSessionTimeout`; the store reports what it granted.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when it is under 100 ms or over an hour.
    pub fn session_timeout(mut self, timeout: Duration) -> Result<Self, StoreError> {
        if timeout < Duration::from_millis(100) || timeout > Duration::from_secs(3600) {
            return Err(CONFIG.error(format!(
                "zookeeper session_timeout must be between 100ms and 1h, not {timeout:?}"
            )));
        }
        self.session_timeout = timeout;
        Ok(self)
    }

    leasehold_core::timeout_methods!(CONFIG, "establishing a session");

    /// Sets the ensemble's `tickTime` (its `zoo.cfg`; ZooKeeper's sample configuration has
    /// 2 s). A follower reports its clients' activity to the leader every half tick, and
    /// the leader expires a session counting from the last report it received: every grant
    /// leaves that much of the session timeout out (see the crate documentation, "TTL and
    /// the session timeout"). Unset, the store assumes the longest tick the session timeout
    /// allows under ZooKeeper's default `minSessionTimeout` (two ticks): half the session
    /// timeout. Setting it lower than the ensemble's real tick breaks that bound.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when it is zero or longer than an hour.
    pub fn tick_time(mut self, tick: Duration) -> Result<Self, StoreError> {
        self.tick_time = Some(CONFIG.timeout("tick_time", tick)?);
        Ok(self)
    }

    /// The servers, `host:port` each.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The root path of the leases.
    pub fn chroot_path(&self) -> &str {
        &self.chroot
    }

    /// The session timeout asked for (the server may grant another).
    pub fn session_timeout_asked(&self) -> Duration {
        self.session_timeout
    }

    /// The ensemble's `tickTime`, if set.
    pub fn ensemble_tick(&self) -> Option<Duration> {
        self.tick_time
    }

    /// The connection timeout the store gives the client (a connection silent that long is
    /// given up): 2/5 of the session timeout asked for, but not so short that a busy
    /// server fails the connect (at least 400 ms; the server raises short session
    /// timeouts anyway).
    pub(crate) fn connection_timeout(&self) -> Duration {
        (self.session_timeout * 2 / 5).max(Duration::from_millis(400))
    }

    /// The connect string the client takes: `host:port,host:port`.
    pub(crate) fn connect_string(&self) -> String {
        self.hosts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use leasehold_core::StoreErrorKind;

    use super::*;

    #[test]
    fn parses_every_part() {
        let c = ZkConfig::from_url(
            "zookeeper://a:2181,b.example:2182/x/y%2Dz/?session_timeout=2s&timeout=1500ms&connect_timeout=3s&tick_time=250ms",
        )
        .unwrap();
        assert_eq!(c.ensemble_tick(), Some(Duration::from_millis(250)));
        assert_eq!(c.hosts(), ["a:2181", "b.example:2182"]);
        assert_eq!(c.chroot_path(), "/x/y-z");
        assert_eq!(c.session_timeout_asked(), Duration::from_secs(2));
        assert_eq!(c.op_bound(), Duration::from_millis(1500));
        assert_eq!(c.connect_bound(), Duration::from_secs(3));
        assert_eq!(c.to_string(), "zookeeper://a:2181,b.example:2182/x/y-z");
    }

    #[test]
    fn defaults() {
        let c = ZkConfig::from_url("zookeeper://127.0.0.1:2181").unwrap();
        assert_eq!(c.chroot_path(), DEFAULT_CHROOT);
        assert_eq!(c.session_timeout_asked(), DEFAULT_SESSION_TIMEOUT);
        assert_eq!(c.op_bound(), DEFAULT_OP_TIMEOUT);
        assert_eq!(c.connect_bound(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(c.ensemble_tick(), None);
    }

    /// The URL's shape is checked by the core's `split_url` (a typed `UrlError`); its
    /// sentence is the message, unchanged.
    #[test]
    fn malformed_urls_say_what_is_wrong() {
        for (bad, said) in [
            (
                "etcd://h:1",
                "zookeeper store: zookeeper: the URL must start with zookeeper://",
            ),
            (
                "zookeeper://h:1#frag",
                "zookeeper store: zookeeper: the URL has a fragment (#); this kind of URL takes none",
            ),
            (
                "zookeeper://h:1?timeout=1s&timeout=2s",
                r#"zookeeper store: zookeeper: URL parameter "timeout" is repeated"#,
            ),
        ] {
            let err = ZkConfig::from_url(bad).expect_err(bad);
            assert_eq!(err.kind(), StoreErrorKind::Config, "{bad}");
            assert_eq!(err.to_string(), said, "{bad}");
        }
    }

    #[test]
    fn rejects_bad_urls_with_config_errors() {
        for bad in [
            "etcd://h:1",
            "zookeeper://",
            "zookeeper://h",
            "zookeeper://h:",
            "zookeeper://h:0",
            "zookeeper://h:70000",
            "zookeeper://h:12x",
            "zookeeper://h:1,",
            "zookeeper://h:1/",
            "zookeeper://h:1//a",
            "zookeeper://h:1/a/../b",
            "zookeeper://h:1/a/./b",
            "zookeeper://h:1/zookeeper",
            "zookeeper://h:1/zookeeper/x",
            "zookeeper://h:1/a%00b",
            "zookeeper://h:1/a%zz",
            "zookeeper://h:1?colour=blue",
            "zookeeper://h:1?timeout=soon",
            "zookeeper://h:1?timeout=0ms",
            "zookeeper://h:1?session_timeout=10ms",
            "zookeeper://h:1?session_timeout=2h",
            "zookeeper://h:1?timeout=1s&timeout=2s",
            "zookeeper://h:1?tick_time=0ms",
            "zookeeper://h:1?tick_time=2h",
            "zookeeper://u:p@h:1",
            "zookeeper://h:1#frag",
            "zookeeper://bad host:1",
        ] {
            let err = ZkConfig::from_url(bad).expect_err(bad);
            assert_eq!(err.kind(), StoreErrorKind::Config, "{bad}: {err}");
        }
        let long = format!("zookeeper://h:1/{}", "a".repeat(MAX_CHROOT_LEN + 1));
        assert_eq!(
            ZkConfig::from_url(&long).unwrap_err().kind(),
            StoreErrorKind::Config
        );
    }
}
