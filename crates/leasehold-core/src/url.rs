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
