//! SQL text helpers both stores share.

/// The server clock in microseconds since the Unix epoch, constant within one statement.
/// (`UNIX_TIMESTAMP(NOW(6))` with the session time zone at UTC, which the stores set.)
macro_rules! now_us {
    () => {
        "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"
    };
}
pub(crate) use now_us;

/// Escapes `%`, `_` and the escape character `!` for `LIKE … ESCAPE '!'`.
pub(crate) fn like_prefix(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '%' | '_' | '!') {
            out.push('!');
        }
        out.push(c);
    }
    out.push('%');
    out
}
