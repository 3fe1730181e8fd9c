//! Which stores the command can reach, the default one, and the store password file.

use std::path::{Path, PathBuf};

use leasehold::{Refusal, StoreError, StoreErrorKind};

use crate::failure::Failure;

/// The store URL when neither `--store` nor `LEASEHOLD_STORE` names one: the embedded
/// SQLite database in the user's state directory.
pub fn default_url() -> String {
    // SqliteConfig's Display is a URL that encodes awkward path characters.
    leasehold::sqlite::SqliteConfig::new(state_dir().join("leases.db")).to_string()
}

/// `$XDG_STATE_HOME/leasehold`, or `~/.local/state/leasehold`.
pub fn state_dir() -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("leasehold")
}

/// The store URL to use: `given` (`--store`, `LEASEHOLD_STORE`), or, when it is missing or
/// empty (`LEASEHOLD_STORE=` in a script's environment), the [default](default_url), with
/// its directory created (the SQLite store never creates directories: a mistyped path in a
/// URL must fail).
pub(crate) fn resolve(given: Option<&str>) -> Result<String, Failure> {
    if let Some(url) = given.filter(|u| !u.is_empty()) {
        return Ok(url.to_owned());
    }
    let dir = state_dir();
    std::fs::create_dir_all(&dir).map_err(|e| {
        Failure::Store(
            StoreError::new(
                StoreErrorKind::Config,
                "sqlite",
                format!(
                    "cannot create the directory {} of the default store",
                    dir.display()
                ),
            )
            .refused(Refusal::File)
            .with_source(e),
        )
    })?;
    Ok(default_url())
}

/// Whether `url` names the in-memory store, which the library keeps for tests and
/// single-process programs: useless across processes, so the command refuses it.
pub fn is_memory(url: &str) -> bool {
    url.split_once("://")
        .is_some_and(|(scheme, _)| scheme == "memory")
}

/// The URL schemes whose stores take a password, in the URL's user information: where
/// `--store-password-file` puts it.
pub(crate) const PASSWORD_SCHEMES: &[&str] = &[
    "postgres",
    "postgresql",
    "postgres+advisory",
    "postgresql+advisory",
    "mysql",
    "mariadb",
    "mysql+getlock",
    "mariadb+getlock",
    "redis",
    "rediss",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
    "redlock",
    "etcd",
    "zookeeper",
];

/// `url` with the password read from the file at `path` in its user information
/// (`scheme://user:PASSWORD@host…`, percent-encoded), so that the password is neither on
/// the command line nor in the environment. The file's content is the password, without
/// its trailing newline (`\n` or `\r\n`).
///
/// # Errors
/// [`Failure::PasswordFile`] (exit 64) when the file cannot be read, is empty or not
/// UTF-8, when the store takes no password, or when the URL has a password already. The
/// message names the path, never the content.
pub(crate) fn with_password_file(url: &str, path: &Path) -> Result<String, Failure> {
    let shown = path.display();
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    if !PASSWORD_SCHEMES.contains(&scheme) {
        let scheme: String = scheme.chars().take(32).collect();
        return Err(Failure::PasswordFile(format!(
            "{shown} is given, but a {scheme}:// store takes no password (stores with one: \
             postgres, mysql, mariadb, redis, rediss, redlock, etcd, zookeeper)"
        )));
    }
    let bytes = std::fs::read(path)
        .map_err(|e| Failure::PasswordFile(format!("cannot read {shown}: {e}")))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| Failure::PasswordFile(format!("{shown} is not UTF-8 text")))?;
    let password = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    if password.is_empty() {
        return Err(Failure::PasswordFile(format!("{shown} is empty")));
    }
    let rest = &url[scheme.len() + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(authority_end);
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, _)) if userinfo.contains(':') => {
            return Err(Failure::PasswordFile(format!(
                "{shown} is given, but the store URL has a password too: give it in one \
                 place only"
            )));
        }
        Some((user, hosts)) => (user, hosts),
        None => ("", authority),
    };
    Ok(format!(
        "{scheme}://{user}:{}@{hosts}{after}",
        percent_encode(password)
    ))
}

/// `s` with every byte but the unreserved ones (letters, digits, `-._~`) as `%XX`: safe
/// in any part of a URL, and decoded back by every store's URL parser.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(content: &[u8]) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), content).unwrap();
        f
    }

    #[test]
    fn the_password_goes_into_the_user_information_encoded() {
        let f = file(b"p@ss:w/rd %\xc3\xa9\n");
        let url = |u: &str| with_password_file(u, f.path()).unwrap();
        assert_eq!(
            url("postgres://app@db:5432/app?sslmode=disable"),
            "postgres://app:p%40ss%3Aw%2Frd%20%25%C3%A9@db:5432/app?sslmode=disable"
        );
        assert_eq!(
            url("redis://h:6379/"),
            "redis://:p%40ss%3Aw%2Frd%20%25%C3%A9@h:6379/"
        );
        assert_eq!(
            url("redlock://h1:1,h2:2,h3:3"),
            "redlock://:p%40ss%3Aw%2Frd%20%25%C3%A9@h1:1,h2:2,h3:3"
        );
        assert_eq!(
            url("zookeeper://alice@h:2181/app?tls=true"),
            "zookeeper://alice:p%40ss%3Aw%2Frd%20%25%C3%A9@h:2181/app?tls=true"
        );
        #[cfg(feature = "zookeeper")]
        {
            let zk =
                leasehold::zookeeper::ZkConfig::from_url(&url("zookeeper://alice@h:2181")).unwrap();
            assert_eq!(zk.user(), Some("alice"), "{zk:?}");
        }
        // The store's own parser reads it back.
        let config =
            leasehold::postgres::PgConfig::from_url(&url("postgres://app@db/app")).unwrap();
        assert_eq!(config.connect_options().get_username(), "app", "{config:?}");
        let crlf = file(b"secret\r\n");
        assert_eq!(
            with_password_file("mysql://root@h/test", crlf.path()).unwrap(),
            "mysql://root:secret@h/test"
        );
    }

    #[test]
    fn refusals_name_the_path_never_the_content() {
        let f = file(b"s3cret-content\n");
        let path = f.path().display().to_string();
        for (url, says) in [
            ("postgres://app:other@db/app", "has a password too"),
            ("sqlite:///x.db", "a sqlite:// store takes no password"),
            ("nats://h:4222", "a nats:// store takes no password"),
        ] {
            let e = with_password_file(url, f.path()).unwrap_err();
            let text = e.to_string();
            assert_eq!(e.code(), 64, "{text}");
            assert!(text.starts_with("store password file: "), "{text}");
            assert!(text.contains(says) && text.contains(&path), "{text}");
            assert!(!text.contains("s3cret-content"), "{text}");
        }
        let e = with_password_file("redis://h/", Path::new("/nonexistent/pw")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("store password file: cannot read /nonexistent/pw: "),
            "{e}"
        );
        let empty = file(b"\n");
        let e = with_password_file("redis://h/", empty.path()).unwrap_err();
        assert!(e.to_string().ends_with("is empty"), "{e}");
    }

    /// A URL given is used as it is (an empty one is the default: `exit_statuses.rs`).
    #[test]
    fn a_url_given_is_used_as_it_is() {
        assert_eq!(resolve(Some("redis://h/")).unwrap(), "redis://h/");
    }
}
