//! [`EtcdConfig`]: where the etcd cluster is and how the store talks to it, parsed from an
//! `etcd://` URL.

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

/// The default key prefix: every lease key is `leasehold/<key>`.
pub const DEFAULT_PREFIX: &str = "leasehold/";
/// The default bound on each operation (all of its requests together).
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(5);
/// The default bound on connecting to a member.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest a prefix may be, in bytes.
pub const MAX_PREFIX_LEN: usize = 256;

const CONFIG: ConfigErrors = ConfigErrors {
    backend: BACKEND,
    label: "etcd",
};

/// A user name and password for etcd's authentication. The password is never shown by
/// `Debug` or anywhere else.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Credentials {
    user: String,
    password: Secret,
}

/// TLS settings: the CA to verify the members with and the client certificate, if any.
/// Verification of the members' certificates (CA and host name) is always on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct TlsSettings {
    /// `cacert`: the PEM file of the CA(s) to trust; `None`: the system's CA store.
    pub(crate) ca_file: Option<PathBuf>,
    /// `cert` and `key`: the client certificate and its private key (PEM files).
    pub(crate) client: Option<(PathBuf, PathBuf)>,
}

/// How to reach an etcd cluster (v3 API) and how the store behaves.
///
/// Parsed from `etcd://[user:password@]host:port[,host:port…][?params]` by
/// [`from_url`](Self::from_url). Parameters:
///
/// | parameter | meaning | default |
/// | --- | --- | --- |
/// | `prefix` | prepended to every lease key (a namespace) | `leasehold/` |
/// | `timeout` | bound on each operation (`250ms`, `2s`, …) | 5 s |
/// | `connect_timeout` | bound on connecting to a member | 2 s |
/// | `tls` | `true`: talk to the members over TLS (`https`), verifying their certificates | `false` |
/// | `cacert` | with `tls=true`: PEM file of the CA that signed the members' certificates | the system's CA store |
/// | `cert`, `key` | with `tls=true`: PEM files of a client certificate and its key (etcd's `--client-cert-auth`) | none |
///
/// `cacert`, `cert` and `key` are etcdctl's `--cacert`, `--cert` and `--key`. With TLS the
/// members' certificates are always verified: signed by the CA, naming the host of the
/// endpoint. Unknown parameters are refused. `Debug` never shows the password, and the
/// key file is read only when connecting (its content is never shown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    endpoints: Vec<String>,
    prefix: String,
    op_timeout: Duration,
    connect_timeout: Duration,
    credentials: Option<Credentials>,
    tls: Option<TlsSettings>,
}

impl fmt::Display for EtcdConfig {
    /// The URL without the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("etcd://")?;
        if let Some(c) = &self.credentials {
            write!(f, "{}:***@", c.user)?;
        }
        f.write_str(&self.endpoints.join(","))?;
        if self.tls.is_some() {
            f.write_str("?tls=true")?;
        }
        Ok(())
    }
}

impl EtcdConfig {
    /// A configuration for the members at `endpoints` (`host:port` each) with the
    /// defaults.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when there is no endpoint or one is not `host:port`.
    pub fn new<I, S>(endpoints: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Self {
            endpoints: CONFIG.hosts(endpoints, "endpoint")?,
            prefix: DEFAULT_PREFIX.to_owned(),
            op_timeout: DEFAULT_OP_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            credentials: None,
            tls: None,
        })
    }

    /// Parses `etcd://[user:password@]host:port[,host:port…][/][?params]`.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for another scheme, a missing or bad `host:port`, a
    /// path, an unknown or repeated parameter, a bad value, or a malformed
    /// percent-escape in the credentials. The message never contains the password.
    ///
    /// ```
    /// use leasehold_core::StoreErrorKind;
    /// use leasehold_etcd::EtcdConfig;
    ///
    /// let c = EtcdConfig::from_url("etcd://10.0.0.1:2379,10.0.0.2:2379?prefix=app/&timeout=2s")?;
    /// assert_eq!(c.endpoints(), ["10.0.0.1:2379", "10.0.0.2:2379"]);
    /// assert_eq!(c.key_prefix(), "app/");
    /// let err = EtcdConfig::from_url("etcd://h:2379?colour=blue").unwrap_err();
    /// assert_eq!(err.kind(), StoreErrorKind::Config);
    /// # Ok::<(), leasehold_core::StoreError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let parts = split_url(url, "etcd").map_err(|e| CONFIG.url(e))?;
        if parts.path.is_some_and(|p| p != "/") {
            return Err(
                CONFIG.error("an etcd URL has no path: use the prefix parameter for a namespace")
            );
        }
        let mut config = Self::new(parts.hosts.split(','))?;
        if let Some(userinfo) = parts.userinfo {
            let (user, password) = userinfo.split_once(':').ok_or_else(|| {
                CONFIG.error(
                    "etcd credentials in the URL are user:password (the password is missing)",
                )
            })?;
            let user = percent_decode(user)
                .ok_or_else(|| CONFIG.error("the etcd user name has a malformed %-escape"))?;
            let password = percent_decode(password)
                .ok_or_else(|| CONFIG.error("the etcd password has a malformed %-escape"))?;
            if user.is_empty() {
                return Err(CONFIG.error("the etcd user name is empty"));
            }
            config = config.credentials(user, password);
        }
        let mut tls = None;
        let (mut ca_file, mut cert, mut key) = (None, None, None);
        for (name, value) in parts.params {
            let value = param_value(name, value).map_err(|e| CONFIG.url(e))?;
            let duration = || param_duration(name, &value).map_err(|e| CONFIG.url(e));
            let path = || {
                if value.is_empty() {
                    Err(CONFIG.error(format!("the etcd parameter {name} names no file")))
                } else {
                    Ok(PathBuf::from(&value))
                }
            };
            match name {
                "prefix" => config = config.prefix(value)?,
                "timeout" => config.op_timeout = CONFIG.timeout(name, duration()?)?,
                "connect_timeout" => config.connect_timeout = CONFIG.timeout(name, duration()?)?,
                "tls" => {
                    tls = Some(match value.as_str() {
                        "true" => true,
                        "false" => false,
                        _ => return Err(CONFIG.error("the etcd parameter tls is true or false")),
                    });
                }
                "cacert" => ca_file = Some(path()?),
                "cert" => cert = Some(path()?),
                "key" => key = Some(path()?),
                _ => {
                    let known = "prefix, timeout, connect_timeout, tls, cacert, cert, key";
                    return Err(CONFIG.url(UrlError::unknown(name, known)));
                }
            }
        }
        if tls == Some(true) {
            config = config.tls();
            if let Some(ca) = ca_file {
                config = config.ca_file(ca);
            }
            match (cert, key) {
                (Some(cert), Some(key)) => config = config.client_cert(cert, key),
                (None, None) => {}
                _ => {
                    return Err(CONFIG
                        .error("an etcd client certificate needs both cert and key (PEM files)"));
                }
            }
        } else if ca_file.is_some() || cert.is_some() || key.is_some() {
            return Err(
                CONFIG.error("the etcd parameters cacert, cert and key need tls=true (TLS is off)")
            );
        }
        Ok(config)
    }

    /// Sets the key prefix (the namespace of every lease key).
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when it is empty, longer than [`MAX_PREFIX_LEN`] bytes
    /// or holds a control character.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Result<Self, StoreError> {
        let prefix = prefix.into();
        if prefix.is_empty() {
            return Err(
                CONFIG.error("the etcd key prefix is empty: leases would mix with every other key")
            );
        }
        if prefix.len() > MAX_PREFIX_LEN {
            return Err(CONFIG.error(format!(
                "the etcd key prefix is longer than {MAX_PREFIX_LEN} bytes"
            )));
        }
        if prefix.chars().any(char::is_control) {
            return Err(CONFIG.error("the etcd key prefix holds a control character"));
        }
        self.prefix = prefix;
        Ok(self)
    }

    leasehold_core::timeout_methods!(CONFIG, "connecting to a member");

    /// Authenticates as `user` with `password` (etcd's own user accounts).
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials {
            user: user.into(),
            password: Secret(password.into()),
        });
        self
    }

    /// Talks to the members over TLS (`https`), verifying their certificates against the
    /// system's CA store (or the [`ca_file`](Self::ca_file)) and the endpoint's host name.
    #[must_use]
    pub fn tls(mut self) -> Self {
        self.tls.get_or_insert_with(TlsSettings::default);
        self
    }

    /// Verifies the members' certificates against the CA(s) in this PEM file instead of
    /// the system's CA store (etcdctl's `--cacert`); turns TLS on.
    #[must_use]
    pub fn ca_file(mut self, path: impl AsRef<Path>) -> Self {
        self.tls.get_or_insert_with(TlsSettings::default).ca_file = Some(path.as_ref().into());
        self
    }

    /// Presents this client certificate and key (PEM files; etcdctl's `--cert` and
    /// `--key`), for members started with `--client-cert-auth`; turns TLS on. The files
    /// are read when connecting.
    #[must_use]
    pub fn client_cert(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Self {
        self.tls.get_or_insert_with(TlsSettings::default).client =
            Some((cert.as_ref().into(), key.as_ref().into()));
        self
    }

    /// Whether the store talks to the members over TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub(crate) fn tls_settings(&self) -> Option<&TlsSettings> {
        self.tls.as_ref()
    }

    /// The members, `host:port` each.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The user name, if the store authenticates.
    pub fn user(&self) -> Option<&str> {
        self.credentials.as_ref().map(|c| c.user.as_str())
    }

    pub(crate) fn user_and_password(&self) -> Option<(&str, &str)> {
        self.credentials
            .as_ref()
            .map(|c| (c.user.as_str(), c.password.expose()))
    }
}

#[cfg(test)]
mod tests {
    use leasehold_core::StoreErrorKind;

    use super::*;

    #[test]
    fn parses_every_part() {
        let c = EtcdConfig::from_url(
            "etcd://bob:p%40ss@a:2379,b.example:2380/?prefix=x%2F&timeout=2s&connect_timeout=500ms",
        )
        .unwrap();
        assert_eq!(c.endpoints(), ["a:2379", "b.example:2380"]);
        assert_eq!(c.key_prefix(), "x/");
        assert_eq!(c.op_bound(), Duration::from_secs(2));
        assert_eq!(c.connect_bound(), Duration::from_millis(500));
        assert_eq!(c.user_and_password(), Some(("bob", "p@ss")));
        let shown = format!("{c:?} {c}");
        assert!(
            !shown.contains("p@ss") && !shown.contains("p%40ss"),
            "{shown}"
        );
    }

    #[test]
    fn parses_tls() {
        let c = EtcdConfig::from_url(
            "etcd://u:pw@h:2379?tls=true&cacert=/etc/ca.pem&cert=/c.pem&key=%2Fk.pem",
        )
        .unwrap();
        let tls = c.tls_settings().unwrap();
        assert_eq!(tls.ca_file.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(
            tls.client,
            Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")))
        );
        assert_eq!(c.to_string(), "etcd://u:***@h:2379?tls=true");
        let system_roots = EtcdConfig::from_url("etcd://h:2379?tls=true").unwrap();
        assert_eq!(system_roots.tls_settings(), Some(&TlsSettings::default()));
        let off = EtcdConfig::from_url("etcd://h:2379?tls=false").unwrap();
        assert!(!off.uses_tls());
    }

    #[test]
    fn refuses_tls_files_without_tls_and_half_a_client_certificate() {
        for (bad, said) in [
            ("etcd://h:1?cacert=/ca.pem", "need tls=true"),
            ("etcd://h:1?tls=false&cert=/c&key=/k", "need tls=true"),
            ("etcd://h:1?tls=true&cert=/c", "both cert and key"),
            ("etcd://h:1?tls=true&key=/k", "both cert and key"),
            ("etcd://h:1?tls=yes", "true or false"),
            ("etcd://h:1?tls=true&cacert=", "names no file"),
        ] {
            let err = EtcdConfig::from_url(bad).expect_err(bad);
            assert_eq!(err.kind(), StoreErrorKind::Config, "{bad}");
            assert!(err.to_string().contains(said), "{bad}: {err}");
        }
    }

    #[test]
    fn defaults() {
        let c = EtcdConfig::from_url("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(c.key_prefix(), DEFAULT_PREFIX);
        assert_eq!(c.op_bound(), DEFAULT_OP_TIMEOUT);
        assert_eq!(c.user(), None);
    }

    #[test]
    fn rejects_bad_urls_with_config_errors() {
        for bad in [
            "redis://h:1",
            "etcd://",
            "etcd://h",
            "etcd://h:",
            "etcd://h:0",
            "etcd://h:70000",
            "etcd://h:12x",
            "etcd://h:1,",
            "etcd://h:1/path",
            "etcd://h:1?colour=blue",
            "etcd://h:1?timeout=soon",
            "etcd://h:1?timeout=0ms",
            "etcd://h:1?prefix=",
            "etcd://h:1?prefix=a&prefix=b",
            "etcd://u@h:1",
            "etcd://u:p%zz@h:1",
            "etcd://h:1#frag",
            "etcd://bad host:1",
        ] {
            let err = EtcdConfig::from_url(bad).expect_err(bad);
            assert_eq!(err.kind(), StoreErrorKind::Config, "{bad}: {err}");
        }
    }

    /// The URL's shape is checked by the core's `split_url` (a typed `UrlError`); its
    /// sentence is the message, unchanged.
    #[test]
    fn malformed_urls_say_what_is_wrong() {
        for (bad, said) in [
            (
                "redis://h:1",
                "etcd store: etcd: the URL must start with etcd://",
            ),
            (
                "etcd://h:1#frag",
                "etcd store: etcd: the URL has a fragment (#); this kind of URL takes none",
            ),
            (
                "etcd://h:1?prefix=a&prefix=b",
                r#"etcd store: etcd: URL parameter "prefix" is repeated"#,
            ),
        ] {
            let err = EtcdConfig::from_url(bad).expect_err(bad);
            assert_eq!(err.kind(), StoreErrorKind::Config, "{bad}");
            assert_eq!(err.to_string(), said, "{bad}");
        }
    }

    #[test]
    fn errors_never_show_the_password() {
        let err = EtcdConfig::from_url("etcd://u:sentinel-pw@h:1?colour=blue").unwrap_err();
        assert!(!err.to_string().contains("sentinel-pw"), "{err}");
        for url in [
            "etcd://u:sentinel-pw@h:0",
            "etcd://u:sentinel-pw?@h:1",
            "etcd://u:sentinel-pw#@h:1",
            "etcd://u:sentinel-pw/@h:1",
            "etcd://u:sentinel-pw",
        ] {
            let err = EtcdConfig::from_url(url).unwrap_err();
            assert!(
                !format!("{err} {err:?}").contains("sentinel-pw"),
                "{url}: {err}"
            );
        }
    }
}
