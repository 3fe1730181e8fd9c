//! Why a command failed: one typed value per outcome, each with one documented exit code
//! and one line on standard error, printed in one place (`main`). [`CAUSES`] is the one
//! table of causes, exit statuses and first words of that line; `docs/cli.md` ("Errors a
//! script can expect") has the same table (a test compares them).

use std::fmt;

use leasehold::{Refusal, StoreError, StoreErrorKind};
use leasehold::{TlsFailure, TlsProblem};

use crate::exit;

/// A failure of a `leasehold` command.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Bad flags, key or durations: exit 64.
    Usage(String),
    /// The store URL is wrong as written (syntax, scheme, host, port, parameters), found
    /// before the store was contacted: exit 64. The message follows `bad store URL: `.
    BadUrl(String),
    /// `memory://`, refused: exit 64.
    Memory,
    /// `--store-password-file` cannot be used (missing, unreadable, empty, or given with a
    /// URL that has a password or a store that takes none): exit 64. The message names the
    /// path, never the content.
    PasswordFile(String),
    /// The store failed or refused (see [`Cause`]): exit 69, 64 for input it refuses.
    Store(StoreError),
    /// The lease was not acquired: exit 75, or `--conflict-exit-code`.
    NotAcquired {
        /// What happened (contended, or the wait ran out).
        error: leasehold::Error,
        /// The exit code to use.
        code: u8,
    },
    /// The lease was lost while the command ran; the command was stopped: exit 70.
    LeaseLost(String),
    /// The command ran to its end, but its end was seen only after the lease was lost or
    /// its validity deadline passed: exit 71.
    CompletedAfterLoss {
        /// The command's own exit status (128+N if it was killed by signal N).
        status: u8,
        /// How the lease was lost.
        why: String,
    },
    /// The lease was lost (or had less than `--grace` left) before the command started;
    /// the command was not started: exit 72.
    LostBeforeStart(String),
    /// The command (or the guard process) could not be started: exit 126.
    CannotExecute(String),
    /// A file could not be created (`install-completions`): exit 73.
    CannotCreate(String),
    /// Standard output could not be written: exit 74.
    Output(String),
    /// leasehold itself could not run (no runtime, no signal handlers): exit 69.
    Internal(String),
    /// `doctor --require`: a row it asks for does not hold for this deployment: exit 78.
    NotHolding(String),
}

/// What went wrong, as a script sees it: one row of [`CAUSES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// Flags, key, durations, a name of another kind.
    Usage,
    /// The store URL as written.
    BadUrl,
    /// The store password file.
    PasswordFile,
    /// `memory://`.
    Memory,
    /// A store call's input the store refuses (a key too long for it).
    InvalidInput,
    /// The store rejected the credentials.
    Credentials,
    /// The database named does not exist.
    NoDatabase,
    /// The store denied a privilege.
    Permission,
    /// The SQLite file or its directory cannot be used.
    File,
    /// The server refused a connection without TLS.
    TlsPlaintextRefused,
    /// The server's certificate is not signed by a CA the client trusts.
    TlsUntrusted,
    /// The server's certificate does not name the host connected to.
    TlsWrongHost,
    /// leasehold's tables are missing.
    SchemaMissing,
    /// The store cannot be reached.
    Unavailable,
    /// The store did not answer in time.
    NoAnswer,
    /// Any other store failure.
    Store,
    /// The lease is held by another owner.
    NotAcquired,
    /// The lease was lost while the command ran.
    LeaseLost,
    /// The command's end was seen after the lease was lost.
    CompletedAfterLoss,
    /// The lease was lost before the command started.
    LostBeforeStart,
    /// The command could not be started.
    CannotExecute,
    /// A file could not be created.
    CannotCreate,
    /// Standard output could not be written.
    Output,
    /// leasehold itself could not run.
    Internal,
    /// A row `doctor --require` asks for does not hold here.
    NotHolding,
}

/// One cause: its exit status and what the line on standard error starts with after
/// `leasehold: ` (empty where the text varies: a flag's error, a path).
pub(crate) struct Row {
    /// The cause.
    pub(crate) cause: Cause,
    /// The exit status (75 is `--conflict-exit-code`'s default).
    pub(crate) status: u8,
    /// The first words of the message, after `leasehold: `; for the store's refusals they
    /// say what to do.
    pub(crate) starts: &'static str,
}

/// Every cause, its status and its message's first words: the table of `docs/cli.md`'s
/// "Errors a script can expect", row for row.
pub(crate) const CAUSES: &[Row] = &[
    Row {
        cause: Cause::Usage,
        status: exit::USAGE,
        starts: "",
    },
    Row {
        cause: Cause::BadUrl,
        status: exit::USAGE,
        starts: "bad store URL: ",
    },
    Row {
        cause: Cause::PasswordFile,
        status: exit::USAGE,
        starts: "store password file: ",
    },
    Row {
        cause: Cause::Memory,
        status: exit::USAGE,
        starts: "memory:// keeps leases inside one process",
    },
    Row {
        cause: Cause::InvalidInput,
        status: exit::USAGE,
        starts: "the store refused the input: ",
    },
    Row {
        cause: Cause::Credentials,
        status: exit::STORE,
        starts: "store error: authentication failed (check the user name and the password: in \
                 the URL, in --store-password-file, or PGPASSWORD/PGPASSFILE for postgres://): ",
    },
    Row {
        cause: Cause::NoDatabase,
        status: exit::STORE,
        starts: "store error: no such database (create it, or fix the database name in the URL): ",
    },
    Row {
        cause: Cause::Permission,
        status: exit::STORE,
        starts: "store error: permission denied (grant the user what leasehold needs; see the \
                 store's README): ",
    },
    Row {
        cause: Cause::File,
        status: exit::STORE,
        starts: "store error: cannot use the database file (its directory must exist; the file \
                 and the directory must be writable): ",
    },
    Row {
        cause: Cause::TlsPlaintextRefused,
        status: exit::STORE,
        starts: "store error: the server refused a connection without TLS (turn TLS on in the \
                 URL: sslmode=verify-full for postgres://, ssl-mode=VERIFY_IDENTITY for \
                 mysql://, rediss:// for redis://, tls=true for etcd://, zookeeper:// and \
                 redlock://): ",
    },
    Row {
        cause: Cause::TlsUntrusted,
        status: exit::STORE,
        starts: "store error: the server's TLS certificate is not signed by a trusted CA (name \
                 its CA in the URL: sslrootcert for postgres://, ssl-ca for mysql://, cacert for \
                 etcd:// and zookeeper://, tls_ca for rediss:// and redlock://): ",
    },
    Row {
        cause: Cause::TlsWrongHost,
        status: exit::STORE,
        starts: "store error: the server's TLS certificate does not name the host (connect by \
                 a name the certificate holds, or reissue it for this host): ",
    },
    Row {
        cause: Cause::SchemaMissing,
        status: exit::STORE,
        starts: "store error: leasehold's tables are missing (create them with leasehold \
                 migrate): ",
    },
    Row {
        cause: Cause::Unavailable,
        status: exit::STORE,
        starts: "store error: unavailable (is the store running, at the URL's host and port?): ",
    },
    Row {
        cause: Cause::NoAnswer,
        status: exit::STORE,
        starts: "store error: no answer in time: ",
    },
    Row {
        cause: Cause::Store,
        status: exit::STORE,
        starts: "store error: ",
    },
    Row {
        cause: Cause::NotAcquired,
        status: exit::NOT_ACQUIRED,
        starts: "lease `",
    },
    Row {
        cause: Cause::LeaseLost,
        status: exit::LEASE_LOST,
        starts: "lease lost while the command ran",
    },
    Row {
        cause: Cause::CompletedAfterLoss,
        status: exit::COMPLETED_AFTER_LOSS,
        starts: "the command ended with status ",
    },
    Row {
        cause: Cause::LostBeforeStart,
        status: exit::LOST_BEFORE_START,
        starts: "",
    },
    Row {
        cause: Cause::CannotExecute,
        status: exit::CANNOT_EXECUTE,
        starts: "",
    },
    Row {
        cause: Cause::CannotCreate,
        status: exit::CANNOT_CREATE,
        starts: "",
    },
    Row {
        cause: Cause::Output,
        status: exit::IO_ERROR,
        starts: "",
    },
    Row {
        cause: Cause::Internal,
        status: exit::STORE,
        starts: "",
    },
    Row {
        cause: Cause::NotHolding,
        status: exit::NOT_HOLDING,
        starts: "not every row required holds here (",
    },
];

/// The row of `cause`.
fn row(cause: Cause) -> &'static Row {
    CAUSES
        .iter()
        .find(|r| r.cause == cause)
        .expect("every cause has a row")
}

/// The cause of a store error: by type, never by its text.
fn store_cause(e: &StoreError) -> Cause {
    if e.kind() == StoreErrorKind::InvalidInput {
        return Cause::InvalidInput;
    }
    if e.is_schema_missing() {
        return Cause::SchemaMissing;
    }
    match TlsFailure::of(e).map(TlsFailure::problem) {
        Some(TlsProblem::PlaintextRefused) => return Cause::TlsPlaintextRefused,
        Some(TlsProblem::UntrustedCertificate) => return Cause::TlsUntrusted,
        Some(TlsProblem::WrongHost) => return Cause::TlsWrongHost,
        Some(_) | None => {}
    }
    match e.refusal() {
        Some(Refusal::Credentials) => return Cause::Credentials,
        Some(Refusal::NoDatabase) => return Cause::NoDatabase,
        Some(Refusal::Permission) => return Cause::Permission,
        Some(Refusal::File) => return Cause::File,
        Some(_) | None => {}
    }
    match e.kind() {
        StoreErrorKind::Unavailable => Cause::Unavailable,
        StoreErrorKind::Timeout => Cause::NoAnswer,
        _ => Cause::Store,
    }
}

impl Failure {
    /// A failure to open the store at a URL: a bad URL when the configuration was refused
    /// before the store was contacted; the store's failure (exit 69) when it was reached
    /// and refused (credentials, database, permission, file: [`StoreError::refusal`]; a
    /// TLS failure: [`TlsFailure`]), when leasehold's tables are missing, or when it could
    /// not be reached.
    pub(crate) fn opening(e: StoreError) -> Self {
        match e.kind() {
            StoreErrorKind::Config
                if e.is_schema_missing()
                    || e.refusal().is_some()
                    || TlsFailure::of(&e).is_some() =>
            {
                Self::Store(e)
            }
            StoreErrorKind::Config | StoreErrorKind::InvalidInput => Self::BadUrl(e.to_string()),
            _ => Self::Store(e),
        }
    }

    /// A failure of the library while acquiring or operating.
    pub(crate) fn from_lease(e: leasehold::Error, conflict_code: u8) -> Self {
        match e {
            leasehold::Error::Contended { .. } | leasehold::Error::WaitTimeout { .. } => {
                Self::NotAcquired {
                    error: e,
                    code: conflict_code,
                }
            }
            leasehold::Error::Store(e) => Self::Store(e),
            leasehold::Error::InvalidKey(_)
            | leasehold::Error::InvalidConfig(_)
            | leasehold::Error::InvalidResource(_)
            | leasehold::Error::InvalidPermits { .. }
            | leasehold::Error::PermitsMismatch { .. }
            | leasehold::Error::KindMismatch { .. }
            | leasehold::Error::ValueTooLong { .. } => Self::Usage(e.to_string()),
            other => Self::Internal(other.to_string()),
        }
    }

    /// The cause: the row of [`CAUSES`] this failure is.
    pub(crate) fn cause(&self) -> Cause {
        match self {
            Self::Usage(_) => Cause::Usage,
            Self::BadUrl(_) => Cause::BadUrl,
            Self::Memory => Cause::Memory,
            Self::PasswordFile(_) => Cause::PasswordFile,
            Self::Store(e) => store_cause(e),
            Self::NotAcquired { .. } => Cause::NotAcquired,
            Self::LeaseLost(_) => Cause::LeaseLost,
            Self::CompletedAfterLoss { .. } => Cause::CompletedAfterLoss,
            Self::LostBeforeStart(_) => Cause::LostBeforeStart,
            Self::CannotExecute(_) => Cause::CannotExecute,
            Self::CannotCreate(_) => Cause::CannotCreate,
            Self::Output(_) => Cause::Output,
            Self::Internal(_) => Cause::Internal,
            Self::NotHolding(_) => Cause::NotHolding,
        }
    }

    /// The exit code: its cause's ([`CAUSES`]), or the `--conflict-exit-code` chosen.
    pub(crate) fn code(&self) -> u8 {
        match self {
            Self::NotAcquired { code, .. } => *code,
            other => row(other.cause()).status,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(row(self.cause()).starts)?;
        match self {
            Self::Usage(m)
            | Self::BadUrl(m)
            | Self::PasswordFile(m)
            | Self::CannotExecute(m)
            | Self::CannotCreate(m)
            | Self::Output(m)
            | Self::Internal(m) => f.write_str(m),
            Self::NotHolding(m) => {
                f.write_str(m.strip_prefix(row(Cause::NotHolding).starts).unwrap_or(m))
            }
            Self::Memory => f.write_str(
                ", so separate leasehold commands would never exclude each other; use \
                 sqlite:// (the default) or a shared store",
            ),
            Self::Store(e) => write!(f, "{e}"),
            Self::NotAcquired { error, .. } => {
                // "lease `KEY` is held …": the row's first words are the error's own.
                let text = error.to_string();
                f.write_str(
                    text.strip_prefix(row(Cause::NotAcquired).starts)
                        .unwrap_or(&text),
                )
            }
            Self::LeaseLost(why) => write!(f, " ({why}); it was stopped"),
            Self::CompletedAfterLoss { status, why } => write!(
                f,
                "{status}, but leasehold saw its end only after the lease was lost ({why}): it \
                 may have run on without the lease; check its work"
            ),
            Self::LostBeforeStart(why) => {
                write!(f, "{why} before the command started; it was not started")
            }
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of `docs/cli.md`'s "Errors a script can expect": (status, the line's start).
    fn documented() -> Vec<(u8, String)> {
        let doc = include_str!("../../../docs/cli.md");
        let section = doc
            .split_once("\n## Errors a script can expect\n")
            .expect("docs/cli.md has the section")
            .1;
        let section = section.split_once("\n## ").map_or(section, |(s, _)| s);
        section
            .lines()
            .filter(|l| {
                l.starts_with("| ") && !l.starts_with("| cause |") && !l.starts_with("| ---")
            })
            .map(|l| {
                let cells: Vec<&str> = l.split(" | ").collect();
                assert_eq!(cells.len(), 3, "three cells: {l}");
                (cells[1].parse().expect("a status"), cells[2].to_owned())
            })
            .collect()
    }

    /// One table: the docs list every cause in the order of [`CAUSES`], with its status
    /// and (where it is fixed) the first words of its line.
    #[test]
    fn the_table_of_causes_is_the_one_in_docs_cli_md() {
        let docs = documented();
        assert_eq!(docs.len(), CAUSES.len(), "{docs:?}");
        for (row, (status, text)) in CAUSES.iter().zip(&docs) {
            assert_eq!(row.status, *status, "{:?}: {text}", row.cause);
            let starts = format!("leasehold: {}", row.starts.trim_end());
            assert!(
                text.contains(&starts),
                "{:?}: {starts:?} not in {text}",
                row.cause
            );
        }
    }

    #[test]
    fn every_failure_has_its_documented_code() {
        let config = StoreError::new(StoreErrorKind::Config, "redis", "bad port");
        let down = StoreError::new(StoreErrorKind::Unavailable, "redis", "refused");
        let input = StoreError::new(StoreErrorKind::InvalidInput, "redis", "bad prefix");
        assert_eq!(Failure::opening(config).code(), 64);
        assert_eq!(Failure::opening(down).code(), 69);
        let auth = StoreError::new(StoreErrorKind::Config, "postgres", "auth failed")
            .refused(Refusal::Credentials);
        let f = Failure::opening(auth);
        assert_eq!(f.code(), 69);
        assert!(
            f.to_string()
                .starts_with("store error: authentication failed (check the user name"),
            "{f}"
        );
        let down = StoreError::new(StoreErrorKind::Unavailable, "redis", "refused");
        assert_eq!(Failure::Store(down).code(), 69);
        for (problem, cause) in [
            (TlsProblem::PlaintextRefused, Cause::TlsPlaintextRefused),
            (TlsProblem::UntrustedCertificate, Cause::TlsUntrusted),
            (TlsProblem::WrongHost, Cause::TlsWrongHost),
            (TlsProblem::NotOffered, Cause::Store),
        ] {
            let tls = StoreError::new(StoreErrorKind::Config, "postgres", "connecting failed")
                .with_source(TlsFailure::new(problem, Some("db"), ""));
            let f = Failure::opening(tls);
            assert_eq!((f.cause(), f.code()), (cause, 69), "{problem:?}");
        }
        assert_eq!(Failure::Store(input).code(), 64);
        assert_eq!(Failure::Usage("x".into()).code(), 64);
        assert_eq!(Failure::LeaseLost("x".into()).code(), 70);
        let late = Failure::CompletedAfterLoss {
            status: 0,
            why: "x".into(),
        };
        assert_eq!(late.code(), 71);
        assert_eq!(Failure::LostBeforeStart("x".into()).code(), 72);
        assert_eq!(Failure::CannotExecute("x".into()).code(), 126);
        assert_eq!(Failure::CannotCreate("x".into()).code(), 73);
        let not_holding = Failure::NotHolding(
            "not every row required holds here (--require holds): eviction".into(),
        );
        assert_eq!(not_holding.code(), 78);
        assert_eq!(
            not_holding.to_string(),
            "not every row required holds here (--require holds): eviction"
        );
        assert_eq!(Failure::Output("x".into()).code(), 74);
        let contended = leasehold::Error::Contended {
            key: leasehold::Key::new("k").unwrap(),
            remaining: None,
        };
        assert_eq!(Failure::from_lease(contended, 75).code(), 75);
        let timeout = leasehold::Error::WaitTimeout {
            key: leasehold::Key::new("k").unwrap(),
            waited: std::time::Duration::ZERO,
        };
        assert_eq!(Failure::from_lease(timeout, 3).code(), 3);
    }
}
