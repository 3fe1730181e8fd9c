//! Why a command failed: one typed value per outcome, each with one documented exit code
//! and one line on standard error, printed in one place (`main`).

use std::fmt;

use leasehold::{StoreError, StoreErrorKind};

use crate::exit;

/// A failure of a `leasehold` command.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Bad flags, key, durations or URL: exit 64.
    Usage(String),
    /// The store URL could not be opened as given (scheme, host, port, parameters,
    /// credentials, `memory://`): exit 64.
    BadStore(String),
    /// The store failed while working: exit 69 (64 for input it refuses).
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
}

impl Failure {
    /// A failure to open the store at a URL: a usage error when the URL (or the
    /// configuration it names) is wrong, a store failure otherwise. A store that checks
    /// its table when it opens (mysql:// with migrate=false) and finds none is not a bad
    /// URL but a database to migrate: a store failure.
    pub(crate) fn opening(e: StoreError) -> Self {
        match e.kind() {
            StoreErrorKind::Config if e.is_schema_missing() => Self::Store(e),
            StoreErrorKind::Config | StoreErrorKind::InvalidInput => {
                Self::BadStore(format!("bad store URL: {e}"))
            }
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

    /// The exit code.
    pub(crate) fn code(&self) -> u8 {
        match self {
            Self::Usage(_) | Self::BadStore(_) => exit::USAGE,
            Self::Store(e) if e.kind() == StoreErrorKind::InvalidInput => exit::USAGE,
            Self::Store(_) | Self::Internal(_) => exit::STORE,
            Self::NotAcquired { code, .. } => *code,
            Self::LeaseLost(_) => exit::LEASE_LOST,
            Self::CompletedAfterLoss { .. } => exit::COMPLETED_AFTER_LOSS,
            Self::LostBeforeStart(_) => exit::LOST_BEFORE_START,
            Self::CannotExecute(_) => exit::CANNOT_EXECUTE,
            Self::CannotCreate(_) => exit::CANNOT_CREATE,
            Self::Output(_) => exit::IO_ERROR,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Usage(m)
            | Self::BadStore(m)
            | Self::CannotExecute(m)
            | Self::CannotCreate(m)
            | Self::Output(m)
            | Self::Internal(m) => f.write_str(m),
            Self::Store(e) => write!(f, "{e}"),
            Self::NotAcquired { error, .. } => write!(f, "{error}"),
            Self::LeaseLost(why) => write!(
                f,
                "lease lost while the command ran ({why}); it was stopped"
            ),
            Self::CompletedAfterLoss { status, why } => write!(
                f,
                "the command ended with status {status}, but leasehold saw its end only after \
                 the lease was lost ({why}): it may have run on without the lease; check its work"
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

    #[test]
    fn every_failure_has_its_documented_code() {
        let config = StoreError::new(StoreErrorKind::Config, "redis", "bad port");
        let down = StoreError::new(StoreErrorKind::Unavailable, "redis", "refused");
        let input = StoreError::new(StoreErrorKind::InvalidInput, "redis", "bad prefix");
        assert_eq!(Failure::opening(config).code(), 64);
        assert_eq!(Failure::opening(down).code(), 69);
        let down = StoreError::new(StoreErrorKind::Unavailable, "redis", "refused");
        assert_eq!(Failure::Store(down).code(), 69);
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
