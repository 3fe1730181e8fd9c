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

/// Splits a store URL of `scheme` (given without `://`). The error (a sentence without the
/// URL, which may hold a password) says what is wrong: another scheme, a fragment (`#`),
/// or a repeated parameter.
///
/// ```
/// use leasehold_core::url::split_url;
/// let p = split_url("etcd://u:p@a:1,b:2/x?timeout=2s&prefix=y", "etcd").unwrap();
/// assert_eq!((p.userinfo, p.hosts, p.path), (Some("u:p"), "a:1,b:2", Some("/x")));
/// assert_eq!(p.params, [("timeout", "2s"), ("prefix", "y")]);
/// assert!(split_url("etcd://a:1?t=1&t=2", "etcd").is_err());
/// assert!(split_url("redis://a:1", "etcd").is_err());
/// ```
pub fn split_url<'a>(url: &'a str, scheme: &str) -> Result<UrlParts<'a>, String> {
    let rest = url
        .strip_prefix(scheme)
        .and_then(|r| r.strip_prefix("://"))
        .ok_or_else(|| format!("the URL must start with {scheme}://"))?;
    if rest.contains('#') {
        return Err("the URL has a fragment (#); this kind of URL takes none".into());
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
            let shown: String = name.chars().take(32).collect();
            return Err(format!("URL parameter {shown:?} is repeated"));
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
}
