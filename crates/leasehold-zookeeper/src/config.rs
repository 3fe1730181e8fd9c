//! [`ZkConfig`]: where the ZooKeeper ensemble is and how the store talks to it, parsed from
//! a `zookeeper://` URL.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold_core::StoreError;
#[cfg(doc)]
use leasehold_core::StoreErrorKind;
use leasehold_core::url::{
    ConfigErrors, Secret, UrlError, param_duration, param_value, percent_decode, split_url,
};

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

/// A digest user name and password (ZooKeeper's `addauth digest user:password`). The
/// password is never shown by `Debug` or anywhere else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: Secret,
}

/// TLS settings: the CA to verify the servers with and the client certificate, if any.
/// Verification of the servers' certificates (CA and host name) is always on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct TlsSettings {
    /// `cacert`: the PEM file of the CA(s) to trust; `None`: the system's CA store.
    pub(crate) ca_file: Option<PathBuf>,
    /// `cert` and `key`: the client certificate and its private key (PEM files).
    pub(crate) client: Option<(PathBuf, PathBuf)>,
}

/// How to reach a ZooKeeper ensemble and how the store behaves.
///
/// Parsed from `zookeeper://[user:password@]host:port[,host:port…][/chroot][?params]` by
/// [`from_url`](Self::from_url). Parameters:
///
/// | parameter | meaning | default |
/// | --- | --- | --- |
/// | `session_timeout` | the session timeout asked for (the server bounds it) | 10 s |
/// | `timeout` | bound on each operation (`250ms`, `2s`, …) | 5 s |
/// | `connect_timeout` | bound on establishing a session | 5 s |
/// | `tick_time` | the ensemble's `tickTime` (see [`tick_time`](Self::tick_time)) | half the session timeout |
/// | `tls` | `true`: talk to the servers' secure client port (`secureClientPort`) over TLS, verifying their certificates | `false` |
/// | `cacert` | with `tls=true`: PEM file of the CA that signed the servers' certificates | the system's CA store |
/// | `cert`, `key` | with `tls=true`: PEM files of a client certificate and its key (servers with `ssl.clientAuth=need`) | none |
///
/// `user:password@` is a digest identity (ZooKeeper's `addauth digest user:password`):
/// the store authenticates every session with it and creates every node with an ACL
/// giving all permissions to that identity only (see the crate documentation,
/// "Authentication and ACLs"). With TLS the servers' certificates are always verified:
/// signed by the CA, naming the host of the server. Unknown parameters are refused.
/// `Debug` and `Display` never show the password, and the key file is read only when
/// connecting (its content is never shown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkConfig {
    hosts: Vec<String>,
    chroot: String,
    session_timeout: Duration,
    op_timeout: Duration,
    connect_timeout: Duration,
    tick_time: Option<Duration>,
    credentials: Option<Credentials>,
    tls: Option<TlsSettings>,
}

impl fmt::Display for ZkConfig {
    /// The URL without the password and the other parameters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("zookeeper://")?;
        if let Some(c) = &self.credentials {
            write!(f, "{}:***@", c.user)?;
        }
        write!(f, "{}{}", self.hosts.join(","), self.chroot)?;
        if self.tls.is_some() {
            f.write_str("?tls=true")?;
        }
        Ok(())
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
            credentials: None,
            tls: None,
        })
    }

    /// Parses `zookeeper://[user:password@]host:port[,host:port…][/chroot][?params]`.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for another scheme, a missing or bad `host:port`, user
    /// information that is not `user:password` (or a user name with `:`), a bad root path,
    /// an unknown or repeated parameter, a bad value, `cacert`, `cert` or `key` without
    /// `tls=true`, `cert` without `key` (or the reverse), or with TLS a host that is no
    /// DNS name or IP address. The message never contains the password.
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
        let mut config = Self::new(parts.hosts.split(','))?;
        if let Some(userinfo) = parts.userinfo {
            let (user, password) = userinfo.split_once(':').ok_or_else(|| {
                CONFIG.error(
                    "zookeeper credentials in the URL are user:password (the password is missing)",
                )
            })?;
            let user = percent_decode(user)
                .ok_or_else(|| CONFIG.error("the zookeeper user name has a malformed %-escape"))?;
            let password = percent_decode(password)
                .ok_or_else(|| CONFIG.error("the zookeeper password has a malformed %-escape"))?;
            config = config.credentials(user, password)?;
        }
        if let Some(path) = parts.path {
            let path = percent_decode(path)
                .ok_or_else(|| CONFIG.error("the zookeeper root path has a malformed %-escape"))?;
            config = config.chroot(path)?;
        }
        let mut tls = None;
        let (mut ca_file, mut cert, mut key) = (None, None, None);
        for (name, value) in parts.params {
            let d = || param_duration(name, value).map_err(|e| CONFIG.url(e));
            let path = || {
                let value = param_value(name, value).map_err(|e| CONFIG.url(e))?;
                if value.is_empty() {
                    Err(CONFIG.error(format!("the zookeeper parameter {name} names no file")))
                } else {
                    Ok(PathBuf::from(value))
                }
            };
            match name {
                "session_timeout" => config = config.session_timeout(d()?)?,
                "timeout" => config = config.op_timeout(d()?)?,
                "connect_timeout" => config = config.connect_timeout(d()?)?,
                "tick_time" => config = config.tick_time(d()?)?,
                "tls" => {
                    tls = Some(match value {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(
                                CONFIG.error("the zookeeper parameter tls is true or false")
                            );
                        }
                    });
                }
                "cacert" => ca_file = Some(path()?),
                "cert" => cert = Some(path()?),
                "key" => key = Some(path()?),
                _ => {
                    let known = "session_timeout, timeout, connect_timeout, tick_time, tls, \
                                 cacert, cert, key";
                    return Err(CONFIG.url(UrlError::unknown(name, known)));
                }
            }
        }
        if tls == Some(true) {
            config = config.tls()?;
            if let Some(ca) = ca_file {
                config = config.ca_file(ca)?;
            }
            match (cert, key) {
                (Some(cert), Some(key)) => config = config.client_cert(cert, key)?,
                (None, None) => {}
                _ => {
                    return Err(CONFIG.error(
                        "a zookeeper client certificate needs both cert and key (PEM files)",
                    ));
                }
            }
        } else if ca_file.is_some() || cert.is_some() || key.is_some() {
            return Err(CONFIG.error(
                "the zookeeper parameters cacert, cert and key need tls=true (TLS is off)",
            ));
        }
        Ok(config)
    }

    /// Authenticates every session as the digest identity `user` with `password`
    /// (ZooKeeper's `addauth digest user:password`), and creates every node with an ACL
    /// giving all permissions to that identity only.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when the user name is empty, holds `:` (ZooKeeper's
    /// digest identity is `user:hash`, split at the first `:`) or a control character.
    pub fn credentials(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Result<Self, StoreError> {
        let user = user.into();
        if user.is_empty() {
            return Err(CONFIG.error("the zookeeper user name is empty"));
        }
        if user.contains(':') || user.chars().any(char::is_control) {
            return Err(
                CONFIG.error("the zookeeper user name may not hold ':' or a control character")
            );
        }
        self.credentials = Some(Credentials {
            user,
            password: Secret(password.into()),
        });
        Ok(self)
    }

    /// Talks to the servers' secure client port over TLS, verifying their certificates
    /// against the system's CA store (or the [`ca_file`](Self::ca_file)) and the server's
    /// host name.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when a host is no DNS name or IP address (a certificate
    /// cannot name it).
    pub fn tls(mut self) -> Result<Self, StoreError> {
        for host in &self.hosts {
            let name = host.rsplit_once(':').map_or(host.as_str(), |(h, _)| h);
            let name = name
                .strip_prefix('[')
                .and_then(|n| n.strip_suffix(']'))
                .unwrap_or(name);
            if rustls::pki_types::ServerName::try_from(name).is_err() {
                return Err(CONFIG.error(format!(
                    "zookeeper host {name} is no DNS name or IP address: a TLS certificate \
                     cannot name it"
                )));
            }
        }
        self.tls.get_or_insert_with(TlsSettings::default);
        Ok(self)
    }

    /// Verifies the servers' certificates against the CA(s) in this PEM file instead of
    /// the system's CA store; turns TLS on.
    ///
    /// # Errors
    /// As [`tls`](Self::tls).
    pub fn ca_file(self, path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let mut config = self.tls()?;
        if let Some(tls) = config.tls.as_mut() {
            tls.ca_file = Some(path.as_ref().into());
        }
        Ok(config)
    }

    /// Presents this client certificate and key (PEM files), for servers with
    /// `ssl.clientAuth=need`; turns TLS on. The files are read when connecting.
    ///
    /// # Errors
    /// As [`tls`](Self::tls).
    pub fn client_cert(
        self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Self, StoreError> {
        let mut config = self.tls()?;
        if let Some(tls) = config.tls.as_mut() {
            tls.client = Some((cert.as_ref().into(), key.as_ref().into()));
        }
        Ok(config)
    }

    /// Whether the store talks to the servers over TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub(crate) fn tls_settings(&self) -> Option<&TlsSettings> {
        self.tls.as_ref()
    }

    /// The digest user name, if the store authenticates.
    pub fn user(&self) -> Option<&str> {
        self.credentials.as_ref().map(|c| c.user.as_str())
    }

    pub(crate) fn credentials_ref(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
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
            "zookeeper://u@h:1",
            "zookeeper://:p@h:1",
            "zookeeper://u%3Ax:p@h:1",
            "zookeeper://u:p%zz@h:1",
            "zookeeper://h:1?tls=yes",
            "zookeeper://h:1?cacert=/ca.pem",
            "zookeeper://h:1?tls=true&cert=/c",
            "zookeeper://h:1?tls=true&cacert=",
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
        let long = format!("zookeeper://h:1/{}", "a".repeat(MAX_CHROOT_LEN + 1));
        assert_eq!(
            ZkConfig::from_url(&long).unwrap_err().kind(),
            StoreErrorKind::Config
        );
    }
}

#[cfg(test)]
mod secrets {
    use leasehold_core::StoreErrorKind;

    use super::*;

    #[test]
    fn parses_credentials_and_tls() {
        let c = ZkConfig::from_url(
            "zookeeper://bob:p%40ss:w@a:2181,b:2182/app?tls=true&cacert=/etc/ca.pem&cert=/c.pem&key=%2Fk.pem",
        )
        .unwrap();
        let creds = c.credentials_ref().unwrap();
        assert_eq!(
            (creds.user.as_str(), creds.password.expose()),
            ("bob", "p@ss:w")
        );
        assert_eq!(c.user(), Some("bob"));
        let tls = c.tls_settings().unwrap();
        assert_eq!(tls.ca_file.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(
            tls.client,
            Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")))
        );
        assert_eq!(
            c.to_string(),
            "zookeeper://bob:***@a:2181,b:2182/app?tls=true"
        );
        let system_roots = ZkConfig::from_url("zookeeper://h:2181?tls=true").unwrap();
        assert_eq!(system_roots.tls_settings(), Some(&TlsSettings::default()));
        assert!(
            !ZkConfig::from_url("zookeeper://h:1?tls=false")
                .unwrap()
                .uses_tls()
        );
        assert!(
            ZkConfig::from_url("zookeeper://[::1]:1?tls=true")
                .unwrap()
                .uses_tls()
        );
    }

    /// Neither `Debug` nor `Display` of a configuration shows the password; no error of a
    /// malformed URL with a password shows it.
    #[test]
    fn the_password_is_never_shown() {
        let c = ZkConfig::from_url("zookeeper://u:sentinel-pw-1@h:1/x?tls=true&key=/k&cert=/c")
            .unwrap();
        let shown = format!("{c:?} {c} {c:#?}");
        assert!(!shown.contains("sentinel-pw-1"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        for url in [
            "zookeeper://u:sentinel-pw@h:0",
            "zookeeper://u:sentinel-pw@h:1?colour=blue",
            "zookeeper://u:sentinel-pw@h:1?cacert=/x",
            "zookeeper://u:sentinel-pw?@h:1",
            "zookeeper://u:sentinel-pw#@h:1",
            "zookeeper://u:sentinel-pw/@h:1",
            "zookeeper://u:sentinel-pw",
            "zookeeper://u:sentinel-pw%zz@h:1",
        ] {
            let err = ZkConfig::from_url(url).unwrap_err();
            assert_eq!(err.kind(), StoreErrorKind::Config, "{url}");
            assert!(
                !format!("{err} {err:?}").contains("sentinel-pw"),
                "{url}: {err}"
            );
        }
    }

    #[test]
    fn refuses_tls_files_without_tls_and_half_a_client_certificate() {
        for (bad, said) in [
            ("zookeeper://h:1?cacert=/ca.pem", "need tls=true"),
            ("zookeeper://h:1?tls=false&cert=/c&key=/k", "need tls=true"),
            ("zookeeper://h:1?tls=true&cert=/c", "both cert and key"),
            ("zookeeper://h:1?tls=true&key=/k", "both cert and key"),
            ("zookeeper://h:1?tls=yes", "true or false"),
            ("zookeeper://h:1?tls=true&cacert=", "names no file"),
            ("zookeeper://u@h:1", "password is missing"),
            ("zookeeper://u%3Av:p@h:1", "may not hold ':'"),
        ] {
            let err = ZkConfig::from_url(bad).expect_err(bad);
            assert_eq!(err.kind(), StoreErrorKind::Config, "{bad}");
            assert!(err.to_string().contains(said), "{bad}: {err}");
        }
    }
}
