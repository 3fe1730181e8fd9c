//! Small, strict helpers for backends that parse their own store URLs, so every backend
//! decodes credentials and reads duration parameters the same way.

use std::time::Duration;

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
            return Err(UrlError::RepeatedParameter {
                name: name.chars().take(32).collect(),
            });
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
