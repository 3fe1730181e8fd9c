//! [`SqliteConfig`]: where the database file is and how it is opened.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::url::{UrlError, param_duration, param_number};
use leasehold_core::{StoreError, StoreErrorKind};

use crate::BACKEND;
use crate::clock::{ClockHandle, HostClock, SystemHostClock};

/// The default bound on waiting for SQLite's write lock: 5 s.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest busy timeout accepted: 10 minutes.
pub const MAX_BUSY_TIMEOUT: Duration = Duration::from_secs(600);
/// The default number of pooled connections per store: 4.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 4;
/// The largest pool accepted: 64 connections.
pub const MAX_CONNECTIONS: u32 = 64;

/// How hard SQLite pushes a commit to disk (`PRAGMA synchronous`), in WAL mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Synchronous {
    /// `FULL` (the default): every commit is synced to disk (`fsync` of the WAL) before it
    /// returns. A commit that returned survives an OS crash or a power loss.
    #[default]
    Full,
    /// `NORMAL`: the WAL is synced only at checkpoints. A commit that returned survives a
    /// crash of the *process* (`kill -9`) but the last commits may be rolled back by an OS
    /// crash or a power loss. Fences stay above every earlier fence after such a loss as
    /// long as the wall clock did not move back by more than the outage (they are floored
    /// at it), but a lease granted just before the loss is forgotten.
    Normal,
}

impl Synchronous {
    fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Normal => "normal",
        }
    }
}

/// Where the SQLite database file is and how it is opened.
///
/// Built from a URL ([`from_url`](Self::from_url)) or from a path ([`new`](Self::new)) and
/// consuming setters. Validated when the store connects.
///
/// ```
/// # use std::time::Duration;
/// use leasehold_sqlite::{SqliteConfig, Synchronous};
/// let a = SqliteConfig::from_url("sqlite:///var/lib/app/leases.db?busy_timeout=2s")?;
/// let b = SqliteConfig::new("/var/lib/app/leases.db").busy_timeout(Duration::from_secs(2));
/// assert_eq!(a, b);
/// assert_eq!(a.get_synchronous(), Synchronous::Full);
/// # Ok::<(), leasehold_core::StoreError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteConfig {
    path: PathBuf,
    busy_timeout: Duration,
    synchronous: Synchronous,
    max_connections: u32,
    clock: Option<ClockHandle>,
}

fn config_error(msg: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Config, BACKEND, msg)
}

fn url_error(e: UrlError) -> StoreError {
    config_error(format!("SQLite: {e}"))
}

impl SqliteConfig {
    /// A configuration for the database file at `path` with the defaults: busy timeout
    /// [`DEFAULT_BUSY_TIMEOUT`], [`Synchronous::Full`], [`DEFAULT_MAX_CONNECTIONS`].
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            synchronous: Synchronous::Full,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            clock: None,
        }
    }

    /// Parses a URL:
    ///
    /// ```text
    /// sqlite:///absolute/path/leases.db[?param=value&...]
    /// sqlite://relative/path/leases.db[?...]        relative to the working directory
    /// ```
    ///
    /// The path is percent-decoded (`%20` for a space, `%3F` for `?`). Parameters:
    /// `busy_timeout` (`500ms`, `5s`, `1m` or a number of milliseconds; 1 ms..=10 min),
    /// `synchronous` (`full` or `normal`), `max_connections` (1..=64). Unknown parameters
    /// are rejected.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for another scheme, an empty path, `:memory:`, a
    /// fragment, an unknown parameter or a bad value.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let rest = url
            .strip_prefix("sqlite://")
            .ok_or_else(|| config_error("a SQLite URL starts with sqlite://"))?;
        if rest.contains('#') {
            return Err(config_error("a SQLite URL has no #fragment"));
        }
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        let path = percent_decode(path)?;
        if path.is_empty() {
            return Err(config_error(
                "the SQLite URL has no file path: use sqlite:///absolute/path.db or sqlite://relative.db",
            ));
        }
        if path == ":memory:" || path.starts_with("file:") {
            return Err(config_error(
                "an in-memory or `file:` SQLite database is not supported: leases must be shared \
                 by processes through a file (use memory:// for a single process)",
            ));
        }
        let mut config = Self::new(path);
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| config_error(format!("URL parameter `{pair}` has no value")))?;
            let value = percent_decode(value)?;
            let duration = || param_duration(name, &value).map_err(url_error);
            match name {
                "busy_timeout" => config.busy_timeout = duration()?,
                "synchronous" => {
                    config.synchronous = match value.to_ascii_lowercase().as_str() {
                        "full" => Synchronous::Full,
                        "normal" => Synchronous::Normal,
                        _ => {
                            return Err(config_error(format!(
                                "synchronous must be `full` or `normal`, not `{value}`"
                            )));
                        }
                    }
                }
                "max_connections" => {
                    config.max_connections = param_number(name, &value).map_err(url_error)?;
                }
                _ => {
                    let known = "busy_timeout, synchronous, max_connections";
                    return Err(url_error(UrlError::unknown(name, known)));
                }
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// Bound on waiting for the database's write lock (SQLite's busy timeout). An operation
    /// that cannot get the lock within it fails with [`StoreErrorKind::Busy`].
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// How commits are synced (see [`Synchronous`]).
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.synchronous = synchronous;
        self
    }

    /// The number of pooled connections (1..=64).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// The clock leases expire on (default [`SystemHostClock`]: `CLOCK_BOOTTIME` and the
    /// boot id). For tests: inject a [`ManualHostClock`](crate::ManualHostClock). Every
    /// process sharing the file must read clocks that agree. Not part of the URL.
    pub fn clock(mut self, clock: Arc<dyn HostClock>) -> Self {
        self.clock = Some(ClockHandle(clock));
        self
    }

    /// The clock leases expire on.
    pub fn get_clock(&self) -> Arc<dyn HostClock> {
        match &self.clock {
            Some(c) => c.0.clone(),
            None => Arc::new(SystemHostClock),
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The busy timeout.
    pub fn get_busy_timeout(&self) -> Duration {
        self.busy_timeout
    }

    /// The sync mode.
    pub fn get_synchronous(&self) -> Synchronous {
        self.synchronous
    }

    /// The pool size.
    pub fn get_max_connections(&self) -> u32 {
        self.max_connections
    }

    /// Checks every value.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for an empty path, a busy timeout outside 1 ms..=10 min or
    /// a pool size outside 1..=64.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.path.as_os_str().is_empty() {
            return Err(config_error("the SQLite database path is empty"));
        }
        if self.busy_timeout < Duration::from_millis(1) || self.busy_timeout > MAX_BUSY_TIMEOUT {
            return Err(config_error(format!(
                "busy_timeout {:?} must be within 1ms..=10min",
                self.busy_timeout
            )));
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.max_connections) {
            return Err(config_error(format!(
                "max_connections {} must be within 1..={MAX_CONNECTIONS}",
                self.max_connections
            )));
        }
        Ok(())
    }
}

impl fmt::Display for SqliteConfig {
    /// The configuration as a URL that [`SqliteConfig::from_url`] parses back (without an
    /// injected clock).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sqlite://")?;
        let mut buf = [0u8; 4];
        for c in self.path.to_string_lossy().chars() {
            if !c.is_ascii() || c.is_ascii_alphanumeric() || "/._-~+,:@".contains(c) {
                f.write_str(c.encode_utf8(&mut buf))?;
            } else {
                write!(f, "%{:02X}", c as u32)?;
            }
        }
        write!(
            f,
            "?busy_timeout={}ms&synchronous={}&max_connections={}",
            self.busy_timeout.as_millis(),
            self.synchronous.as_str(),
            self.max_connections
        )
    }
}

fn percent_decode(s: &str) -> Result<String, StoreError> {
    leasehold_core::url::percent_decode(s)
        .ok_or_else(|| config_error("the SQLite URL is not valid percent-encoded UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_forms() {
        let c = SqliteConfig::from_url("sqlite:///tmp/x/leases.db").unwrap();
        assert_eq!(c.path(), Path::new("/tmp/x/leases.db"));
        assert_eq!(c.get_busy_timeout(), DEFAULT_BUSY_TIMEOUT);
        let c = SqliteConfig::from_url("sqlite://rel/leases.db?busy_timeout=250").unwrap();
        assert_eq!(c.path(), Path::new("rel/leases.db"));
        assert_eq!(c.get_busy_timeout(), Duration::from_millis(250));
        let c = SqliteConfig::from_url(
            "sqlite:///a%20b/c%3Fd.db?synchronous=NORMAL&busy_timeout=2s&max_connections=2",
        )
        .unwrap();
        assert_eq!(c.path(), Path::new("/a b/c?d.db"));
        assert_eq!(c.get_synchronous(), Synchronous::Normal);
        assert_eq!(c.get_max_connections(), 2);
        assert_eq!(SqliteConfig::from_url(&c.to_string()).unwrap(), c);
        let c =
            SqliteConfig::from_url("sqlite:///tmp/é x#.db".replace('#', "%23").as_str()).unwrap();
        assert_eq!(SqliteConfig::from_url(&c.to_string()).unwrap(), c);
    }

    #[test]
    fn bad_urls() {
        for bad in [
            "sqlite://",
            "sqlite://?busy_timeout=1s",
            "sqlite://:memory:",
            "sqlite://file:x.db",
            "sqlite:x.db",
            "postgres://x",
            "sqlite:///x.db?busy_timeout=0",
            "sqlite:///x.db?busy_timeout=11m",
            "sqlite:///x.db?busy_timeout=fast",
            "sqlite:///x.db?synchronous=off",
            "sqlite:///x.db?max_connections=0",
            "sqlite:///x.db?max_connections=65",
            "sqlite:///x.db?busytimeout=1s",
            "sqlite:///x.db?busy_timeout",
            "sqlite:///x.db#frag",
            "sqlite:///x%zz.db",
        ] {
            let e = SqliteConfig::from_url(bad).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Config, "{bad}: {e}");
        }
    }
}
