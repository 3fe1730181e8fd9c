//! [`MySqlConfig`]: where the server is and how to talk to it. The password is a secret.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use leasehold_core::url::{Secret, UrlError, param_duration, param_number};
use leasehold_core::{StoreError, StoreErrorKind};
use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};

/// The default bound on each operation: 5 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The default bound on opening a connection: 5 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The default size of the connection pool: 8.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;
/// The default MySQL port.
pub const DEFAULT_PORT: u16 = 3306;

const SCHEMES: &[&str] = &["mysql", "mariadb", "mysql+getlock", "mariadb+getlock"];

/// Whether and how the connection uses TLS: the `ssl-mode` URL parameter, with the values
/// of MySQL's and MariaDB's clients (case-insensitive in the URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum SslMode {
    /// `DISABLED`: never TLS.
    Disabled,
    /// `PREFERRED` (the default, as in MySQL's own client): TLS when the server offers it,
    /// without checking its certificate; plaintext when it does not. Protects against
    /// eavesdropping only, not against a server impersonated on the path.
    #[default]
    Preferred,
    /// `REQUIRED`: TLS or no connection, without checking the certificate.
    Required,
    /// `VERIFY_CA`: TLS, and the certificate must be signed by a trusted CA (`ssl-ca`, or
    /// the system's CA store); the host name is not checked.
    VerifyCa,
    /// `VERIFY_IDENTITY`: as `VERIFY_CA`, and the certificate must name the host the URL
    /// connects to. Use this in production.
    VerifyIdentity,
}

impl SslMode {
    /// The URL value: `DISABLED`, `PREFERRED`, `REQUIRED`, `VERIFY_CA` or
    /// `VERIFY_IDENTITY`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "DISABLED",
            Self::Preferred => "PREFERRED",
            Self::Required => "REQUIRED",
            Self::VerifyCa => "VERIFY_CA",
            Self::VerifyIdentity => "VERIFY_IDENTITY",
        }
    }

    /// Parses a URL value, ignoring case.
    fn parse(value: &str) -> Option<Self> {
        [
            Self::Disabled,
            Self::Preferred,
            Self::Required,
            Self::VerifyCa,
            Self::VerifyIdentity,
        ]
        .into_iter()
        .find(|m| m.as_str().eq_ignore_ascii_case(value))
    }

    fn sqlx(self) -> MySqlSslMode {
        match self {
            Self::Disabled => MySqlSslMode::Disabled,
            Self::Preferred => MySqlSslMode::Preferred,
            Self::Required => MySqlSslMode::Required,
            Self::VerifyCa => MySqlSslMode::VerifyCa,
            Self::VerifyIdentity => MySqlSslMode::VerifyIdentity,
        }
    }
}

/// Where a MariaDB/MySQL server is and how the stores use it.
///
/// Built from a URL ([`from_url`](Self::from_url)) or with [`new`](Self::new) and consuming
/// setters. The password never appears in `Debug`, `Display` (which prints the URL with
/// `<redacted>` in its place) or in errors.
///
/// ```
/// let c = leasehold_mysql::MySqlConfig::from_url("mysql://app:s3cret@db.internal:3307/leases?timeout=2s")?;
/// assert_eq!(c.to_string(), "mysql://app:<redacted>@db.internal:3307/leases?timeout=2000ms&connect_timeout=5000ms&max_connections=8&migrate=true");
/// assert!(!format!("{c:?}").contains("s3cret"));
/// # Ok::<(), leasehold_core::StoreError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MySqlConfig {
    host: String,
    port: u16,
    socket: Option<PathBuf>,
    user: String,
    password: Option<Secret>,
    database: String,
    timeout: Duration,
    connect_timeout: Duration,
    max_connections: u32,
    migrate: bool,
    ssl_mode: SslMode,
    ssl_ca: Option<PathBuf>,
    ssl_cert: Option<PathBuf>,
    ssl_key: Option<PathBuf>,
}

fn config_error(msg: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Config, crate::BACKEND, msg)
}

fn url_error(e: UrlError) -> StoreError {
    config_error(format!("MySQL: {e}"))
}

impl MySqlConfig {
    /// A configuration for `database` on `host` (port 3306, user `root`, no password) with
    /// the default bounds.
    pub fn new(host: impl Into<String>, database: impl Into<String>) -> Self {
        Self {
            host: host.into(),
            port: DEFAULT_PORT,
            socket: None,
            user: "root".into(),
            password: None,
            database: database.into(),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            migrate: true,
            ssl_mode: SslMode::default(),
            ssl_ca: None,
            ssl_cert: None,
            ssl_key: None,
        }
    }

    /// Parses a URL:
    ///
    /// ```text
    /// mysql://[user[:password]@]host[:port]/database[?param=value&...]
    /// mariadb://...                  the same
    /// mysql+getlock://...            the same, for the GET_LOCK store (see the factory)
    /// ```
    ///
    /// User and password are percent-decoded; IPv6 hosts go in brackets. Parameters:
    /// `timeout` (bound on each operation, default `5s`), `connect_timeout` (default `5s`),
    /// `max_connections` (pool size, default 8), `migrate` (`true`: create missing tables at
    /// connect, the default; `false`: never issue DDL), `socket` (a Unix socket path, used
    /// instead of host and port). Durations: `500ms`, `5s`, `1m` or a number of ms.
    ///
    /// TLS, with the names of MySQL's and MariaDB's clients: `ssl-mode` (`DISABLED`,
    /// `PREFERRED` — the default —, `REQUIRED`, `VERIFY_CA`, `VERIFY_IDENTITY`; any case;
    /// see [`SslMode`]), `ssl-ca` (a PEM file of CA certificates to trust besides the
    /// system's), `ssl-cert` and `ssl-key` (a client certificate and its key, PEM, given
    /// together). Unknown parameters are rejected.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`], whose message never contains the password.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            config_error("a MySQL URL looks like mysql://user:password@host:port/database")
        })?;
        if !SCHEMES.contains(&scheme) {
            return Err(config_error(format!(
                "URL scheme `{scheme}` is not one of {}",
                SCHEMES.join(", ")
            )));
        }
        if rest.contains('#') {
            return Err(config_error("a MySQL URL has no #fragment"));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, database) = rest
            .split_once('/')
            .ok_or_else(|| config_error("the MySQL URL names no database (…/database)"))?;
        let database = percent_decode(database, "database")?;
        if database.is_empty() || database.contains('/') {
            return Err(config_error("the MySQL URL names no database (…/database)"));
        }
        // The password may contain '@' (percent-encoded or not): split at the last '@'.
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let mut config = Self::new(String::new(), database);
        if let Some(userinfo) = userinfo {
            let (user, password) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            config.user = percent_decode(user, "user name")?;
            config.password = password
                .map(|p| percent_decode(p, "password").map(Secret))
                .transpose()
                .map_err(|_| {
                    config_error("the password in the MySQL URL is badly percent-encoded")
                })?;
        }
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| config_error("unclosed [ in the MySQL URL's host"))?;
            match after {
                "" => (h, None),
                p => (
                    h,
                    Some(p.strip_prefix(':').ok_or_else(|| {
                        config_error("garbage after the IPv6 host in the MySQL URL")
                    })?),
                ),
            }
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        config.host = percent_decode(host, "host")?;
        if let Some(p) = port {
            config.port = p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| config_error(format!("bad port `{p}` in the MySQL URL")))?;
        }
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| config_error(format!("URL parameter `{pair}` has no value")))?;
            let value = percent_decode(value, name)?;
            let duration = || param_duration(name, &value).map_err(url_error);
            match name {
                "timeout" => config.timeout = duration()?,
                "connect_timeout" => config.connect_timeout = duration()?,
                "max_connections" => {
                    config.max_connections = param_number(name, &value).map_err(url_error)?;
                }
                "migrate" => {
                    config.migrate = match value.as_str() {
                        "true" | "1" | "yes" => true,
                        "false" | "0" | "no" => false,
                        _ => {
                            return Err(config_error(format!(
                                "migrate must be true or false, not `{value}`"
                            )));
                        }
                    }
                }
                "socket" => config.socket = Some(PathBuf::from(value)),
                "ssl-mode" => {
                    config.ssl_mode = SslMode::parse(&value).ok_or_else(|| {
                        config_error(format!(
                            "ssl-mode must be DISABLED, PREFERRED, REQUIRED, VERIFY_CA or \
                             VERIFY_IDENTITY, not `{}`",
                            value.chars().take(32).collect::<String>()
                        ))
                    })?;
                }
                "ssl-ca" => config.ssl_ca = Some(PathBuf::from(value)),
                "ssl-cert" => config.ssl_cert = Some(PathBuf::from(value)),
                "ssl-key" => config.ssl_key = Some(PathBuf::from(value)),
                _ => {
                    let known = "timeout, connect_timeout, max_connections, migrate, socket, \
                                 ssl-mode, ssl-ca, ssl-cert, ssl-key";
                    return Err(url_error(UrlError::unknown(name, known)));
                }
            }
        }
        if config.host.is_empty() && config.socket.is_none() {
            return Err(config_error("the MySQL URL names no host"));
        }
        config.validate()?;
        Ok(config)
    }

    /// The TCP port (default 3306).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Connect through this Unix socket instead of host and port.
    pub fn socket(mut self, path: impl Into<PathBuf>) -> Self {
        self.socket = Some(path.into());
        self
    }

    /// The user name (default `root`).
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = user.into();
        self
    }

    /// The password (default none).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(Secret(password.into()));
        self
    }

    /// Bound on each operation (default 5 s). An operation past it fails with
    /// [`StoreErrorKind::Timeout`] and its connection is closed. It is also the server-side
    /// bound on waiting for a row lock (`innodb_lock_wait_timeout`, whole seconds, at
    /// least 1).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Bound on opening a connection (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The pool size (default 8; the GET_LOCK store opens one more connection per held
    /// lease).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// Whether connecting creates missing tables (default `true`). With `false` the stores
    /// never issue DDL: create the tables from the published schema first.
    pub fn migrate(mut self, on: bool) -> Self {
        self.migrate = on;
        self
    }

    /// Whether and how to use TLS (default [`SslMode::Preferred`]).
    pub fn ssl_mode(mut self, mode: SslMode) -> Self {
        self.ssl_mode = mode;
        self
    }

    /// A PEM file of CA certificates to trust, besides the system's CA store.
    pub fn ssl_ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.ssl_ca = Some(path.into());
        self
    }

    /// A client certificate and its private key (PEM files), for accounts that
    /// `REQUIRE X509` (or `SUBJECT`/`ISSUER`). The key's content never appears in errors.
    pub fn ssl_client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.ssl_cert = Some(cert.into());
        self.ssl_key = Some(key.into());
        self
    }

    /// The TLS mode.
    pub fn get_ssl_mode(&self) -> SslMode {
        self.ssl_mode
    }
    /// The CA file, if one is named.
    pub fn get_ssl_ca(&self) -> Option<&std::path::Path> {
        self.ssl_ca.as_deref()
    }

    /// The host.
    pub fn get_host(&self) -> &str {
        &self.host
    }
    /// The port.
    pub fn get_port(&self) -> u16 {
        self.port
    }
    /// The user.
    pub fn get_user(&self) -> &str {
        &self.user
    }
    /// The database.
    pub fn get_database(&self) -> &str {
        &self.database
    }
    /// The operation bound.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }
    /// The connect bound.
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
    /// The pool size.
    pub fn get_max_connections(&self) -> u32 {
        self.max_connections
    }
    /// Whether connecting creates missing tables.
    pub fn get_migrate(&self) -> bool {
        self.migrate
    }

    /// Checks every value.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for an empty database name, bounds outside 1 ms..=10 min
    /// or a pool size outside 1..=1000.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.database.is_empty() {
            return Err(config_error("no database"));
        }
        for (name, d) in [
            ("timeout", self.timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if d < Duration::from_millis(1) || d > Duration::from_secs(600) {
                return Err(config_error(format!(
                    "{name} {d:?} must be within 1ms..=10min"
                )));
            }
        }
        if self.ssl_cert.is_some() != self.ssl_key.is_some() {
            return Err(config_error(
                "ssl-cert and ssl-key are given together (the client certificate and its key)",
            ));
        }
        if self.ssl_mode == SslMode::Disabled && (self.ssl_ca.is_some() || self.ssl_cert.is_some())
        {
            return Err(config_error(
                "ssl-ca, ssl-cert and ssl-key need TLS, but ssl-mode is DISABLED",
            ));
        }
        if !(1..=1000).contains(&self.max_connections) {
            return Err(config_error(format!(
                "max_connections {} must be within 1..=1000",
                self.max_connections
            )));
        }
        Ok(())
    }

    /// The password, for scrubbing error texts.
    pub(crate) fn secret(&self) -> Option<&str> {
        self.password
            .as_ref()
            .map(Secret::expose)
            .filter(|s| !s.is_empty())
    }

    /// Whether a client key is configured (a driver configuration error may then quote it).
    pub(crate) fn uses_socket(&self) -> bool {
        self.socket.is_some()
    }

    pub(crate) fn has_client_key(&self) -> bool {
        self.ssl_key.is_some()
    }

    /// `innodb_lock_wait_timeout` for the session: the operation bound in whole seconds.
    pub(crate) fn lock_wait_secs(&self) -> u64 {
        self.timeout.as_secs().max(1)
    }

    pub(crate) fn connect_options(&self) -> MySqlConnectOptions {
        let mut o = MySqlConnectOptions::new()
            .username(&self.user)
            .database(&self.database)
            .ssl_mode(self.ssl_mode.sqlx())
            .timezone(Some("+00:00".to_owned()))
            .charset("utf8mb4");
        if let Some(socket) = &self.socket {
            o = o.socket(socket);
        } else {
            o = o.host(&self.host).port(self.port);
        }
        if let Some(p) = &self.password {
            o = o.password(p.expose());
        }
        if let Some(ca) = &self.ssl_ca {
            o = o.ssl_ca(ca);
        }
        if let (Some(cert), Some(key)) = (&self.ssl_cert, &self.ssl_key) {
            o = o.ssl_client_cert(cert).ssl_client_key(key);
        }
        o
    }
}

impl fmt::Display for MySqlConfig {
    /// The URL, with `<redacted>` for the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mysql://{}", encode(&self.user))?;
        if self.password.is_some() {
            f.write_str(":<redacted>")?;
        }
        if self.host.contains(':') {
            write!(f, "@[{}]", self.host)?;
        } else {
            write!(f, "@{}", encode(&self.host))?;
        }
        write!(
            f,
            ":{}/{}?timeout={}ms&connect_timeout={}ms&max_connections={}&migrate={}",
            self.port,
            encode(&self.database),
            self.timeout.as_millis(),
            self.connect_timeout.as_millis(),
            self.max_connections,
            self.migrate
        )?;
        if let Some(s) = &self.socket {
            write!(f, "&socket={}", encode(&s.to_string_lossy()))?;
        }
        if self.ssl_mode != SslMode::default() {
            write!(f, "&ssl-mode={}", self.ssl_mode.as_str())?;
        }
        for (name, path) in [
            ("ssl-ca", &self.ssl_ca),
            ("ssl-cert", &self.ssl_cert),
            ("ssl-key", &self.ssl_key),
        ] {
            if let Some(p) = path {
                write!(f, "&{name}={}", encode(&p.to_string_lossy()))?;
            }
        }
        Ok(())
    }
}

fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(s: &str, what: &str) -> Result<String, StoreError> {
    leasehold_core::url::percent_decode(s).ok_or_else(|| {
        config_error(format!(
            "the URL's {what} is not valid percent-encoded UTF-8"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_forms() {
        let c = MySqlConfig::from_url("mysql://root@127.0.0.1:3310/test").unwrap();
        assert_eq!(
            (c.get_host(), c.get_port(), c.get_user(), c.get_database()),
            ("127.0.0.1", 3310, "root", "test")
        );
        assert_eq!(c.secret(), None);
        let c = MySqlConfig::from_url(
            "mariadb+getlock://u%40x:p%3Aw%40d@[::1]/db?timeout=250ms&connect_timeout=1s&max_connections=3&migrate=false",
        )
        .unwrap();
        assert_eq!((c.get_host(), c.get_port()), ("::1", 3306));
        assert_eq!(c.get_user(), "u@x");
        assert_eq!(c.secret(), Some("p:w@d"));
        assert_eq!(c.get_timeout(), Duration::from_millis(250));
        assert_eq!(c.get_connect_timeout(), Duration::from_secs(1));
        assert_eq!(c.get_max_connections(), 3);
        assert!(!c.get_migrate());
        let shown = c.to_string();
        assert!(
            !shown.contains("p:w@d") && !shown.contains("p%3Aw%40d"),
            "{shown}"
        );
        let again = MySqlConfig::from_url(&shown.replace("<redacted>", "p%3Aw%40d")).unwrap();
        assert_eq!(again, c);
        let c = MySqlConfig::from_url("mysql://h/d?socket=%2Ftmp%2Fmy.sock").unwrap();
        assert_eq!(
            c.socket.as_deref(),
            Some(std::path::Path::new("/tmp/my.sock"))
        );
        // '@' in a raw password: the last '@' ends the user info.
        let c = MySqlConfig::from_url("mysql://u:a@b@h/d").unwrap();
        assert_eq!((c.secret(), c.get_host()), (Some("a@b"), "h"));
    }

    #[test]
    fn tls_parameters() {
        let c = MySqlConfig::from_url("mysql://u@h/d").unwrap();
        assert_eq!(c.get_ssl_mode(), SslMode::Preferred);
        let c = MySqlConfig::from_url(
            "mysql://u:pw@h/d?ssl-mode=verify_identity&ssl-ca=%2Fca.pem&ssl-cert=%2Fc.pem&ssl-key=%2Fk.pem",
        )
        .unwrap();
        assert_eq!(c.get_ssl_mode(), SslMode::VerifyIdentity);
        assert_eq!(c.get_ssl_ca(), Some(std::path::Path::new("/ca.pem")));
        assert!(c.has_client_key());
        let shown = c.to_string();
        assert!(
            shown.contains("&ssl-mode=VERIFY_IDENTITY&ssl-ca=%2Fca.pem"),
            "{shown}"
        );
        let again = MySqlConfig::from_url(&shown.replace("<redacted>", "pw")).unwrap();
        assert_eq!(again, c);
        for (value, mode) in [
            ("DISABLED", SslMode::Disabled),
            ("Preferred", SslMode::Preferred),
            ("required", SslMode::Required),
            ("VERIFY_CA", SslMode::VerifyCa),
        ] {
            let c = MySqlConfig::from_url(&format!("mysql://u@h/d?ssl-mode={value}")).unwrap();
            assert_eq!(c.get_ssl_mode(), mode, "{value}");
        }
        for bad in [
            "mysql://u@h/d?ssl-mode=verify-full",
            "mysql://u@h/d?ssl-cert=%2Fc.pem",
            "mysql://u@h/d?ssl-key=%2Fk.pem",
            "mysql://u@h/d?ssl-mode=DISABLED&ssl-ca=%2Fca.pem",
            "mysql://u@h/d?sslmode=require",
        ] {
            let e = MySqlConfig::from_url(bad).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Config, "{bad}: {e}");
        }
    }

    #[test]
    fn bad_urls_never_echo_the_password() {
        for bad in [
            "postgres://u:SENTINEL@h/d",
            "mysql://u:SENTINEL@h",
            "mysql://u:SENTINEL@h/",
            "mysql://u:SENTINEL@h:99999/d",
            "mysql://u:SENTINEL@h:0/d",
            "mysql://u:SENTINEL@h:x/d",
            "mysql://u:SENTINEL@/d",
            "mysql://u:SENTINEL@[::1/d",
            "mysql://u:SENTINEL@h/d?timeout=0",
            "mysql://u:SENTINEL@h/d?timeout=fast",
            "mysql://u:SENTINEL@h/d?max_connections=0",
            "mysql://u:SENTINEL@h/d?migrate=maybe",
            "mysql://u:SENTINEL@h/d?password=x",
            "mysql://u:SENTINEL%zz@h/d",
            "mysql://u:SENTINEL@h/d#x",
        ] {
            let e = MySqlConfig::from_url(bad).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Config, "{bad}: {e}");
            assert!(!e.to_string().contains("SENTINEL"), "{e}");
            assert!(!format!("{e:?}").contains("SENTINEL"), "{e:?}");
        }
    }
}
