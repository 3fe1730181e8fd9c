//! Small, strict helpers for backends that parse their own store URLs, so every backend
//! decodes credentials, reads hosts and parameters, and redacts passwords the same way.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::{StoreError, StoreErrorKind};

/// A password (or other secret) that `Debug` shows as `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl Secret {
    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How one backend's configuration errors read: [`StoreErrorKind::Config`] errors of
/// `backend` whose messages name it `label` (`etcd`, `zookeeper`).
#[derive(Debug, Clone, Copy)]
pub struct ConfigErrors {
    /// The backend the errors are of.
    pub backend: &'static str,
    /// The backend's name in the messages.
    pub label: &'static str,
}

impl ConfigErrors {
    /// A configuration error saying `msg`.
    pub fn error(self, msg: impl Into<String>) -> StoreError {
        StoreError::new(StoreErrorKind::Config, self.backend, msg)
    }

    /// The configuration error for `e`: its sentence after the label (`etcd: the URL …`).
    pub fn url(self, e: UrlError) -> StoreError {
        self.error(format!("{}: {e}", self.label))
    }

    /// The host list `entries` ([`host_list`]), at least one; a bad one is named
    /// `<label> <entry> <number>` (`etcd endpoint 2`). The messages never repeat an entry:
    /// in a malformed URL it may hold part of a password.
    pub fn hosts<I, S>(self, entries: I, entry: &str) -> Result<Vec<String>, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let label = self.label;
        match host_list(entries) {
            Err((n, e)) => Err(self.error(format!("{label} {entry} {n} {e}"))),
            Ok(hosts) if hosts.is_empty() => {
                Err(self.error(format!("the {label} URL needs at least one host:port")))
            }
            Ok(hosts) => Ok(hosts),
        }
    }

    /// Timeout setting `name`'s value `d`, unless it is zero or longer than an hour.
    pub fn timeout(self, name: &str, d: Duration) -> Result<Duration, StoreError> {
        if d.is_zero() || d > Duration::from_secs(3600) {
            let label = self.label;
            let msg = format!("{label} {name} must be above zero and at most 1h, not {d:?}");
            return Err(self.error(msg));
        }
        Ok(d)
    }
}

/// Expands, inside the `impl` block of a store configuration with `op_timeout` and
/// `connect_timeout` fields (and `Duration`, `StoreError` in scope), to their setters (each
/// checked by `$errors`, a [`ConfigErrors`]: above zero, at most an hour) and getters, so
/// every store offers the same two bounds; `$connect` says what the connect bound bounds.
#[macro_export]
macro_rules! timeout_methods {
    ($errors:expr, $connect:literal) => {
        /// Sets the bound on each operation.
        ///
        /// # Errors
        /// [`StoreErrorKind::Config`] when it is zero or longer than an hour.
        pub fn op_timeout(mut self, timeout: Duration) -> Result<Self, StoreError> {
            self.op_timeout = $errors.timeout("timeout", timeout)?;
            Ok(self)
        }

        #[doc = concat!("Sets the bound on ", $connect, ".")]
        ///
        /// # Errors
        /// [`StoreErrorKind::Config`] when it is zero or longer than an hour.
        pub fn connect_timeout(mut self, timeout: Duration) -> Result<Self, StoreError> {
            self.connect_timeout = $errors.timeout("connect_timeout", timeout)?;
            Ok(self)
        }

        /// The bound on each operation.
        pub fn op_bound(&self) -> Duration {
            self.op_timeout
        }

        #[doc = concat!("The bound on ", $connect, ".")]
        pub fn connect_bound(&self) -> Duration {
            self.connect_timeout
        }
    };
}

/// Decodes `%XX` escapes. `None` for a malformed escape or a result that is not UTF-8
/// (a strict decoder: a password is never silently altered).
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Parses a duration parameter: `250ms`, `2s`, `1m`, `6h`, `7d`, or a bare number of
/// milliseconds.
/// `None` when it is none of these or overflows.
pub fn parse_duration(v: &str) -> Option<Duration> {
    let (digits, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => v.split_at(i),
        None => (v, "ms"),
    };
    let n: u64 = digits.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        "d" => n.checked_mul(24 * 3600).map(Duration::from_secs),
        _ => None,
    }
}

/// Checks every entry of a host list with [`host_port`]: `host:port` each (the port as a
/// number), or the number (from 1) of the first bad entry and what is wrong with it.
pub fn host_list<I, S>(entries: I) -> Result<Vec<String>, (usize, HostPortError)>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let check = |(i, e): (usize, S)| match host_port(e.as_ref()) {
        Ok((host, port)) => Ok(format!("{host}:{port}")),
        Err(e) => Err((i + 1, e)),
    };
    entries.into_iter().enumerate().map(check).collect()
}

/// A store URL `scheme://[userinfo@]hosts[/path][?name=value&…]` split into its parts,
/// nothing decoded: each backend decodes and checks the parts it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlParts<'a> {
    /// What stands before the last `@` of the authority, if anything.
    pub userinfo: Option<&'a str>,
    /// The host list (`host:port[,host:port…]`), as written.
    pub hosts: &'a str,
    /// The path with its leading `/`; `None` when the URL has none (a lone `/` is a path).
    pub path: Option<&'a str>,
    /// The query's `name=value` pairs in order (a pair without `=` has an empty value);
    /// empty pairs (`a=1&&b=2`) are skipped.
    pub params: Vec<(&'a str, &'a str)>,
}

/// Why [`split_url`] refused a store URL. Its text is a sentence that never holds the URL
/// (which may hold a password); a backend puts it into its configuration error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// The URL does not start with `<scheme>://` of the backend that parses it.
    #[error("the URL must start with {expected}://")]
    WrongScheme {
        /// The scheme the backend takes, without `://`.
        expected: String,
    },
    /// The URL has a fragment (`#…`): no store URL takes one.
    #[error("the URL has a fragment (#); this kind of URL takes none")]
    Fragment,
    /// A query parameter is given twice.
    #[error("URL parameter {name:?} is repeated")]
    RepeatedParameter {
        /// The parameter's name, cut to its first 32 characters.
        name: String,
    },
    /// A query parameter the backend does not take.
    #[error("unknown URL parameter {name:?} (known: {known})")]
    UnknownParameter {
        /// The parameter's name, cut to its first 32 characters.
        name: String,
        /// The parameters the backend takes, comma-separated.
        known: &'static str,
    },
    /// A query parameter's value is not what it takes ([`param_value`] and the like).
    #[error("URL parameter {name:?} {problem}")]
    BadValue {
        /// The parameter's name, cut to its first 32 characters.
        name: String,
        /// What is wrong, a sentence's end: `is not a number`.
        problem: &'static str,
    },
}

/// A parameter's name as an error shows it: its first 32 characters.
fn shown(name: &str) -> String {
    name.chars().take(32).collect()
}

impl UrlError {
    /// The error for parameter `name`, not one of `known` (comma-separated).
    pub fn unknown(name: &str, known: &'static str) -> Self {
        Self::UnknownParameter {
            name: shown(name),
            known,
        }
    }

    fn bad_value(name: &str, problem: &'static str) -> Self {
        Self::BadValue {
            name: shown(name),
            problem,
        }
    }
}

/// Parameter `name`'s value, percent-decoded ([`percent_decode`]); else a
/// [`UrlError::BadValue`] (as the other `param_` functions).
pub fn param_value(name: &str, value: &str) -> Result<String, UrlError> {
    percent_decode(value).ok_or_else(|| UrlError::bad_value(name, "has a malformed %-escape"))
}

/// Parameter `name`'s value as a duration ([`parse_duration`]).
pub fn param_duration(name: &str, value: &str) -> Result<Duration, UrlError> {
    let problem = "is not a duration (500ms, 5s, 1m or a number of milliseconds)";
    parse_duration(value).ok_or_else(|| UrlError::bad_value(name, problem))
}

/// Parameter `name`'s value as a number (or anything else [`FromStr`] reads).
pub fn param_number<T: FromStr>(name: &str, value: &str) -> Result<T, UrlError> {
    value
        .parse()
        .map_err(|_| UrlError::bad_value(name, "is not a number"))
}

/// Why [`host_port`] refused an entry of a host list. Its text follows the entry's name
/// (`etcd endpoint 2 has a bad port`) and never repeats the entry, which in a malformed URL
/// may hold part of the credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostPortError {
    /// No `:` separates a port.
    #[error("is not host:port")]
    NotHostPort,
    /// The host is empty, or neither `[…]` nor letters, digits, `.`, `-` and `_`.
    #[error("has a bad host")]
    BadHost,
    /// The port is not a number from 1 to 65535.
    #[error("has a bad port")]
    BadPort,
}

/// Splits one `host:port` of a host list: the host as written (an IPv6 address in its
/// brackets, their content unchecked) and the port; else a [`HostPortError`].
pub fn host_port(entry: &str) -> Result<(&str, u16), HostPortError> {
    let (host, port) = entry.rsplit_once(':').ok_or(HostPortError::NotHostPort)?;
    let bracketed = host.starts_with('[') && host.ends_with(']');
    let host_ok = !host.is_empty()
        && (bracketed
            || host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_'));
    if !host_ok {
        return Err(HostPortError::BadHost);
    }
    match port.parse::<u16>() {
        Ok(p) if p != 0 && port.chars().all(|c| c.is_ascii_digit()) => Ok((host, p)),
        _ => Err(HostPortError::BadPort),
    }
}

/// Splits a store URL of `scheme` (given without `://`).
///
/// # Errors
/// A [`UrlError`] saying what is wrong: another scheme, a fragment (`#`), or a repeated
/// parameter.
///
/// ```
/// use leasehold_core::url::split_url;
/// let p = split_url("etcd://u:p@a:1,b:2/x?timeout=2s&prefix=y", "etcd").unwrap();
/// assert_eq!((p.userinfo, p.hosts, p.path), (Some("u:p"), "a:1,b:2", Some("/x")));
/// assert_eq!(p.params, [("timeout", "2s"), ("prefix", "y")]);
/// use leasehold_core::url::UrlError;
/// assert!(matches!(
///     split_url("etcd://a:1?t=1&t=2", "etcd"),
///     Err(UrlError::RepeatedParameter { .. })
/// ));
/// assert!(matches!(split_url("redis://a:1", "etcd"), Err(UrlError::WrongScheme { .. })));
/// ```
pub fn split_url<'a>(url: &'a str, scheme: &str) -> Result<UrlParts<'a>, UrlError> {
    let rest = url
        .strip_prefix(scheme)
        .and_then(|r| r.strip_prefix("://"))
        .ok_or_else(|| UrlError::WrongScheme {
            expected: scheme.to_owned(),
        })?;
    if rest.contains('#') {
        return Err(UrlError::Fragment);
    }
    let (authority_and_path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = match authority_and_path.find('/') {
        Some(i) => (&authority_and_path[..i], Some(&authority_and_path[i..])),
        None => (authority_and_path, None),
    };
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let mut params: Vec<(&str, &str)> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if params.iter().any(|(n, _)| *n == name) {
            return Err(UrlError::RepeatedParameter { name: shown(name) });
        }
        params.push((name, value));
    }
    Ok(UrlParts {
        userinfo,
        hosts,
        path,
        params,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists() {
        assert_eq!(host_port("db-1.example:2379"), Ok(("db-1.example", 2379)));
        assert_eq!(host_port("[::1]:2181"), Ok(("[::1]", 2181)));
        for (bad, why) in [
            ("h", HostPortError::NotHostPort),
            ("bad host:1", HostPortError::BadHost),
            (":1", HostPortError::BadHost),
            ("h:0", HostPortError::BadPort),
            ("h:+1", HostPortError::BadPort),
            ("h:70000", HostPortError::BadPort),
        ] {
            assert_eq!(host_port(bad), Err(why), "{bad}");
        }
        assert_eq!(
            host_list(["a:01", "b:2"]),
            Ok(vec!["a:1".into(), "b:2".into()])
        );
        assert_eq!(
            host_list(["a:1", "b"]),
            Err((2, HostPortError::NotHostPort))
        );
        let e = param_duration("timeout", "soon").unwrap_err();
        let said = "URL parameter \"timeout\" is not a duration (500ms, 5s, 1m or a number of milliseconds)";
        assert_eq!(e.to_string(), said);
        assert_eq!(
            param_number::<u32>("n", "x").unwrap_err().to_string(),
            "URL parameter \"n\" is not a number"
        );
        assert_eq!(
            param_value("p", "%zz").unwrap_err().to_string(),
            "URL parameter \"p\" has a malformed %-escape"
        );
        assert_eq!(format!("{:?}", Secret("pw".to_owned())), "<redacted>");
    }

    #[test]
    fn decoding_is_strict() {
        assert_eq!(percent_decode("p%40ss%2F%25").as_deref(), Some("p@ss/%"));
        assert_eq!(percent_decode("caf%C3%A9").as_deref(), Some("café"));
        assert_eq!(percent_decode("bad%zz"), None);
        assert_eq!(percent_decode("cut%4"), None);
        assert_eq!(percent_decode("%FF"), None);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Some(Duration::from_secs(60)));
        assert_eq!(parse_duration("6h"), Some(Duration::from_secs(6 * 3600)));
        assert_eq!(parse_duration("7d"), Some(Duration::from_secs(7 * 86400)));
        assert_eq!(parse_duration(&format!("{}d", u64::MAX)), None);
        assert_eq!(parse_duration("750"), Some(Duration::from_millis(750)));
        for bad in ["", "s", "1w", "1H", "-1s", "1.5s", "99999999999999999999ms"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        assert_eq!(parse_duration(&format!("{}m", u64::MAX)), None);
    }

    #[test]
    fn each_refusal_is_its_own_variant_with_the_same_sentence() {
        let e = split_url("redis://a:1", "etcd").unwrap_err();
        assert_eq!(
            e,
            UrlError::WrongScheme {
                expected: "etcd".into()
            }
        );
        assert_eq!(e.to_string(), "the URL must start with etcd://");
        // A scheme that only starts like the expected one is another scheme.
        assert!(matches!(
            split_url("etcdx://a:1", "etcd"),
            Err(UrlError::WrongScheme { .. })
        ));
        assert!(matches!(
            split_url("etcd:/a:1", "etcd"),
            Err(UrlError::WrongScheme { .. })
        ));

        let e = split_url("etcd://u:p@a:1/#x", "etcd").unwrap_err();
        assert_eq!(e, UrlError::Fragment);
        assert_eq!(
            e.to_string(),
            "the URL has a fragment (#); this kind of URL takes none"
        );
        assert!(!e.to_string().contains("u:p"), "no URL in the text");

        let e = split_url("etcd://a:1?timeout=1s&prefix=x&timeout=2s", "etcd").unwrap_err();
        assert_eq!(
            e,
            UrlError::RepeatedParameter {
                name: "timeout".into()
            }
        );
        assert_eq!(e.to_string(), r#"URL parameter "timeout" is repeated"#);
        // A long (or hostile) name is cut to 32 characters.
        let long = "n".repeat(100);
        let e = split_url(&format!("etcd://a:1?{long}=1&{long}=2"), "etcd").unwrap_err();
        assert_eq!(
            e,
            UrlError::RepeatedParameter {
                name: "n".repeat(32)
            }
        );
        let e = split_url("etcd://a:1?caf\u{e9}=1&caf\u{e9}=2", "etcd").unwrap_err();
        assert_eq!(e.to_string(), "URL parameter \"caf\u{e9}\" is repeated");
    }
}
