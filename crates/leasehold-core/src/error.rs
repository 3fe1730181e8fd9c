//! Typed errors that say what to do next.

use std::fmt;
use std::time::Duration;

use crate::config::ConfigError;
use crate::key::{Key, KeyError};
use crate::lease::LostReason;

/// What the caller should do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// A transient condition: retry, preferably with backoff.
    Retry,
    /// The resource is held by someone else: wait or try later.
    TryLater,
    /// The configuration or the input is wrong (URL, credentials, permissions, key, TTL):
    /// retrying will not help, fix it.
    Reconfigure,
    /// The lease is no longer held: stop the protected work, do not write with its fence.
    OwnershipLost,
    /// The store holds data leasehold cannot interpret (a key of the wrong type, a
    /// corrupted value): an operator must look; it is never treated as free.
    Investigate,
    /// The client is shutting down: stop, do not retry.
    Stop,
}

/// The kind of a [`StoreError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The request was not delivered (connection refused, not connected): nothing happened
    /// on the store. Retryable.
    Unavailable,
    /// The request may have been applied but no reply came in time. Retry with the same
    /// owner token.
    Timeout,
    /// The connection broke after the request was sent: the outcome is unknown. Retry with
    /// the same owner token.
    Ambiguous,
    /// A transient refusal by the store (busy, serialization failure, loading). Retryable.
    Busy,
    /// Authentication, permission, URL or schema problems. Not retryable: reconfigure.
    Config,
    /// The call's arguments are invalid for this store (a TTL out of range, a key the
    /// backend cannot hold). Not retryable: fix the input.
    InvalidInput,
    /// The store holds something that is not a leasehold lease at this key (wrong type,
    /// corrupted value). Not retryable; never treated as free.
    Corrupt,
    /// The backend does not support the operation (see its capabilities).
    Unsupported,
    /// Anything else.
    Other,
}

impl StoreErrorKind {
    /// Whether retrying the same call may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::Unavailable | Self::Timeout | Self::Ambiguous | Self::Busy
        )
    }

    /// Whether the request may have been applied although no success was seen.
    pub fn is_ambiguous(self) -> bool {
        matches!(self, Self::Timeout | Self::Ambiguous)
    }

    /// A short stable name, used in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unavailable => "unavailable",
            Self::Timeout => "timeout",
            Self::Ambiguous => "ambiguous",
            Self::Busy => "busy",
            Self::Config => "config",
            Self::InvalidInput => "invalid_input",
            Self::Corrupt => "corrupt",
            Self::Unsupported => "unsupported",
            Self::Other => "other",
        }
    }
}

/// Why a store that was reached refused a [`StoreErrorKind::Config`] error's request: the
/// store's own answer, as opposed to a configuration error found in the URL or the
/// settings before anything was contacted (see [`StoreError::refusal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// The store rejected the credentials (a wrong or missing user name or password, an
    /// authentication method the client does not offer).
    Credentials,
    /// The database (PostgreSQL, MariaDB/MySQL) the URL names does not exist.
    NoDatabase,
    /// The user is authenticated but lacks a privilege (a grant, an ACL rule).
    Permission,
    /// An embedded store's database file cannot be opened or written: its directory is
    /// missing, or the file or directory is not writable.
    File,
}

impl Refusal {
    /// A short stable name, used in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Credentials => "credentials",
            Self::NoDatabase => "no_database",
            Self::Permission => "permission",
            Self::File => "file",
        }
    }
}

/// An error from a store, mapped by the backend into one shape so that every backend
/// can be tested for the same outcome.
///
/// Backends must never put credentials into the message.
///
/// Programs decide by type, never by the message's text: the [`kind`](Self::kind) (and so
/// the [`action`](Self::action)), [`is_schema_missing`](Self::is_schema_missing) for a
/// database that leasehold's tables were never created in, and [`refusal`](Self::refusal)
/// for a store that refused the credentials, has no such database, denies a privilege or
/// cannot open its file.
pub struct StoreError {
    kind: StoreErrorKind,
    backend: &'static str,
    message: String,
    schema_missing: bool,
    refusal: Option<Refusal>,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl StoreError {
    /// A new error of `kind` from `backend`, with a message that says what happened.
    pub fn new(kind: StoreErrorKind, backend: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            backend,
            message: message.into(),
            schema_missing: false,
            refusal: None,
            source: None,
        }
    }

    /// Marks the error as the store's own refusal, `why` (see [`Refusal`]); it becomes a
    /// [`StoreErrorKind::Config`] error if it was not one. Backends mark what the server
    /// (or, for an embedded store, the file system) answered, never a URL they refused to
    /// parse, so that a caller can tell "fix the URL" from "fix the account, the grants or
    /// the file".
    pub fn refused(mut self, why: Refusal) -> Self {
        self.kind = StoreErrorKind::Config;
        self.refusal = Some(why);
        self
    }

    /// A [`StoreErrorKind::Config`] error saying that leasehold's schema is missing on a
    /// store that answered: a table, the schema that should hold it, or the SQL guard's
    /// routine was never created. The cure is to migrate (`leasehold migrate`, the store's
    /// `migrate()`, or its URL parameter), which the message should say;
    /// [`is_schema_missing`](Self::is_schema_missing) tells it apart from the other
    /// configuration errors by type.
    pub fn schema_missing(backend: &'static str, message: impl Into<String>) -> Self {
        Self {
            schema_missing: true,
            ..Self::new(StoreErrorKind::Config, backend, message)
        }
    }

    /// The same error (kind, backend, [`is_schema_missing`](Self::is_schema_missing),
    /// [`refusal`](Self::refusal)) with another message and no source: for a copy (the
    /// source is not `Clone`, so fold its text into `message`), or a message rewritten for
    /// its reader.
    pub fn reworded(&self, message: impl Into<String>) -> Self {
        Self {
            schema_missing: self.schema_missing,
            refusal: self.refusal,
            ..Self::new(self.kind, self.backend, message)
        }
    }

    /// Attaches the underlying error. Its `Display` must not contain credentials.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// A [`StoreErrorKind::Timeout`] after `after`.
    pub fn timeout(backend: &'static str, op: &str, after: Duration) -> Self {
        Self::new(
            StoreErrorKind::Timeout,
            backend,
            format!("{op} got no reply within {after:?}; it may have been applied"),
        )
    }

    /// Checks a TTL passed to a store call: it must lie in
    /// [`MIN_TTL`](crate::config::MIN_TTL)..=[`MAX_TTL`](crate::config::MAX_TTL), so no
    /// store ever sees a zero, negative or overflowing expiry.
    ///
    /// # Errors
    /// [`StoreErrorKind::InvalidInput`] when it does not.
    pub fn check_ttl(backend: &'static str, ttl: Duration) -> Result<(), Self> {
        if (crate::config::MIN_TTL..=crate::config::MAX_TTL).contains(&ttl) {
            Ok(())
        } else {
            Err(Self::new(
                StoreErrorKind::InvalidInput,
                backend,
                format!("ttl {ttl:?} is outside 10ms..=24h"),
            ))
        }
    }

    /// Refuses a record value longer than [`MAX_RECORD_LEN`](crate::MAX_RECORD_LEN)
    /// bytes, before anything is sent ([`Store::put_record`](crate::Store::put_record)).
    ///
    /// # Errors
    /// [`StoreErrorKind::InvalidInput`] for a longer value.
    pub fn check_record_value(backend: &'static str, value: &[u8]) -> Result<(), Self> {
        if value.len() > crate::MAX_RECORD_LEN {
            return Err(Self::new(
                StoreErrorKind::InvalidInput,
                backend,
                format!(
                    "a record value of {} bytes is longer than {}",
                    value.len(),
                    crate::MAX_RECORD_LEN
                ),
            ));
        }
        Ok(())
    }

    /// Awaits a store call for at most `limit`; past it, a [`StoreErrorKind::Timeout`]
    /// (the call may still have been applied, so it is [ambiguous](Self::is_ambiguous)).
    ///
    /// # Errors
    /// The error of `call`, or [`StoreError::timeout`] when `limit` ran out.
    pub async fn bounded<T>(
        backend: &'static str,
        op: &str,
        limit: Duration,
        call: impl std::future::Future<Output = Result<T, Self>>,
    ) -> Result<T, Self> {
        tokio::time::timeout(limit, call)
            .await
            .unwrap_or_else(|_| Err(Self::timeout(backend, op, limit)))
    }

    /// The same error again (kind, backend, the message with its source's text), for each
    /// lease of a batch that failed as a whole.
    pub(crate) fn copy_for_batch(&self) -> Self {
        let message = match &self.source {
            Some(src) => format!("{} (batch): {src}", self.message),
            None => format!("{} (batch)", self.message),
        };
        self.reworded(message)
    }

    /// A [`StoreErrorKind::Unsupported`] for `what`.
    pub fn unsupported(backend: &'static str, what: &str) -> Self {
        Self::new(
            StoreErrorKind::Unsupported,
            backend,
            format!("{what} is not supported by this store"),
        )
    }

    /// The kind.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
    /// The backend's name (`"memory"`, `"redis"`, ...).
    pub fn backend(&self) -> &'static str {
        self.backend
    }
    /// The message, without the source.
    pub fn message(&self) -> &str {
        &self.message
    }
    /// Whether retrying may succeed.
    pub fn is_retryable(&self) -> bool {
        self.kind.is_retryable()
    }
    /// Whether the request may have been applied.
    pub fn is_ambiguous(&self) -> bool {
        self.kind.is_ambiguous()
    }
    /// Whether the store says leasehold's schema is missing (see
    /// [`schema_missing`](Self::schema_missing)): a [`StoreErrorKind::Config`] error whose
    /// cure is to migrate. Set by the SQL stores where the database reports a missing
    /// table, schema or routine of leasehold's.
    pub fn is_schema_missing(&self) -> bool {
        self.schema_missing
    }
    /// Why the store refused, when it was reached and refused (see [`Refusal`] and
    /// [`refused`](Self::refused)); `None` for every other error, including a
    /// configuration error found in the URL before the store was contacted.
    pub fn refusal(&self) -> Option<Refusal> {
        self.refusal
    }
    /// What to do about it.
    pub fn action(&self) -> Action {
        match self.kind {
            StoreErrorKind::Unavailable
            | StoreErrorKind::Timeout
            | StoreErrorKind::Ambiguous
            | StoreErrorKind::Busy
            | StoreErrorKind::Other => Action::Retry,
            StoreErrorKind::Config | StoreErrorKind::InvalidInput | StoreErrorKind::Unsupported => {
                Action::Reconfigure
            }
            StoreErrorKind::Corrupt => Action::Investigate,
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} store: {}", self.backend, self.message)?;
        if let Some(src) = &self.source {
            write!(f, ": {src}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreError")
            .field("kind", &self.kind)
            .field("backend", &self.backend)
            .field("message", &self.message)
            .field("schema_missing", &self.schema_missing)
            .field("refusal", &self.refusal)
            .field("source", &self.source.as_ref().map(|s| s.to_string()))
            .finish()
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// Every error of the lease API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key breaks a rule.
    #[error("invalid key: {0}")]
    InvalidKey(#[from] KeyError),
    /// A guard's resource name (or an idempotency record's job id) breaks a rule.
    #[error("invalid resource name: {0}")]
    InvalidResource(#[from] crate::guard::ResourceNameError),
    /// The configuration breaks a rule.
    #[error("invalid lease configuration: {0}")]
    InvalidConfig(#[from] ConfigError),
    /// `try_acquire`: the lease is held by another owner.
    #[error("lease `{key}` is held by another owner{}", fmt_remaining(*.remaining))]
    Contended {
        /// The key.
        key: Key,
        /// The holder's remaining TTL, when the store reports it.
        remaining: Option<Duration>,
    },
    /// `acquire` with a wait: still held by another owner when the wait ran out.
    #[error("lease `{key}` was not acquired within {waited:?}: held by another owner")]
    WaitTimeout {
        /// The key.
        key: Key,
        /// How long the call waited.
        waited: Duration,
    },
    /// The lease was lost (or had been lost) before the operation.
    #[error("lease lost: {0}")]
    LeaseLost(LostReason),
    /// A guard rejected a write: its fence is below the highest accepted for the resource,
    /// so the writer lost its lease. Roll back; never retry with the same fence.
    #[error(
        "write to `{resource}` with fence {fence} rejected: fence {current} was already accepted (ownership lost)"
    )]
    FenceRejected {
        /// The protected resource.
        resource: crate::guard::ResourceName,
        /// The rejected fence.
        fence: crate::Fence,
        /// The highest fence accepted.
        current: crate::Fence,
    },
    /// A leader's value (or another record) is longer than
    /// [`MAX_RECORD_LEN`](crate::MAX_RECORD_LEN) bytes.
    #[error("value of {len} bytes is longer than the {max} bytes a store keeps")]
    ValueTooLong {
        /// The value's length.
        len: usize,
        /// The longest accepted.
        max: usize,
    },
    /// A semaphore's number of permits is 0 or above
    /// [`MAX_PERMITS`](crate::recipes::semaphore::MAX_PERMITS).
    #[error("a semaphore needs 1 to {max} permits, not {permits}")]
    InvalidPermits {
        /// The number asked for.
        permits: u32,
        /// The largest accepted.
        max: u32,
    },
    /// The semaphore exists in the store with another number of permits: every user of
    /// one name must ask for the same number (to change it, use a new name).
    #[error("semaphore `{name}` has {stored} permits in the store; this caller asked for {asked}")]
    PermitsMismatch {
        /// The semaphore's name.
        name: Key,
        /// The number the store holds.
        stored: u32,
        /// The number this caller asked for.
        asked: u32,
    },
    /// The name is used as another kind of resource (see [`kind`](crate::recipes::kind)): a
    /// semaphore and a lease (or an election) cannot share a name. Nothing was left held.
    #[error("{}", crate::recipes::kind::mismatch_message(name, *found, *asked))]
    KindMismatch {
        /// The name.
        name: Key,
        /// What the store records the name as.
        found: crate::recipes::kind::ResourceKind,
        /// What this caller asked for.
        asked: crate::recipes::kind::ResourceKind,
    },
    /// The client is shutting down ([`LeaseClient::shutdown`](crate::LeaseClient::shutdown)):
    /// it grants no new leases.
    #[error("the lease client is shutting down: no new leases")]
    ShuttingDown,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn fmt_remaining(remaining: Option<Duration>) -> String {
    remaining
        .map(|r| format!(" for another {r:?}"))
        .unwrap_or_default()
}

impl Error {
    /// What to do about it.
    pub fn action(&self) -> Action {
        match self {
            Self::InvalidKey(_)
            | Self::InvalidResource(_)
            | Self::InvalidConfig(_)
            | Self::ValueTooLong { .. }
            | Self::InvalidPermits { .. }
            | Self::PermitsMismatch { .. }
            | Self::KindMismatch { .. } => Action::Reconfigure,
            Self::Contended { .. } | Self::WaitTimeout { .. } => Action::TryLater,
            Self::LeaseLost(_) | Self::FenceRejected { .. } => Action::OwnershipLost,
            Self::ShuttingDown => Action::Stop,
            Self::Store(e) => e.action(),
        }
    }

    /// Whether retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self.action(), Action::Retry | Action::TryLater)
    }

    /// The store error, if this is one.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            Self::Store(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions() {
        let e = Error::from(StoreError::new(StoreErrorKind::Config, "x", "bad password"));
        assert_eq!(e.action(), Action::Reconfigure);
        assert!(!e.is_retryable());
        let e = Error::from(StoreError::timeout("x", "acquire", Duration::from_secs(1)));
        assert_eq!(e.action(), Action::Retry);
        assert!(e.store_error().unwrap().is_ambiguous());
        assert_eq!(
            Error::LeaseLost(LostReason::NotOwner).action(),
            Action::OwnershipLost
        );
        let e = StoreError::new(StoreErrorKind::Corrupt, "x", "wrong type");
        assert_eq!(e.action(), Action::Investigate);
        assert!(!e.is_retryable());
    }

    #[test]
    fn a_missing_schema_is_a_config_error_known_by_type() {
        let e = StoreError::schema_missing("postgres", "no table: migrate");
        assert!(e.is_schema_missing());
        assert_eq!(e.kind(), StoreErrorKind::Config);
        assert_eq!(e.action(), Action::Reconfigure);
        assert!(!e.is_retryable());
        assert_eq!(e.to_string(), "postgres store: no table: migrate");
        // Copies keep the mark; no other error has it, whatever its text.
        let e = e.with_source(std::io::Error::other("relation does not exist"));
        let copy = e.copy_for_batch();
        assert!(copy.is_schema_missing());
        assert_eq!(
            copy.message(),
            "no table: migrate (batch): relation does not exist"
        );
        let reworded = e.reworded("run `leasehold migrate`");
        assert!(reworded.is_schema_missing());
        assert_eq!(reworded.kind(), StoreErrorKind::Config);
        assert_eq!(reworded.backend(), "postgres");
        assert!(std::error::Error::source(&reworded).is_none());
        let other = StoreError::new(StoreErrorKind::Config, "postgres", "no table: migrate");
        assert!(!other.is_schema_missing());
        assert!(!other.reworded("x").is_schema_missing());
        assert!(format!("{e:?}").contains("schema_missing: true"));
    }

    /// A refusal is marked by type, makes the error a configuration error, and survives
    /// copies; an error built without the mark has none, whatever its text.
    #[test]
    fn a_refusal_is_marked_by_type_and_kept_by_copies() {
        let e = StoreError::new(StoreErrorKind::Other, "postgres", "auth failed")
            .refused(Refusal::Credentials);
        assert_eq!(e.kind(), StoreErrorKind::Config);
        assert_eq!(e.refusal(), Some(Refusal::Credentials));
        assert_eq!(e.reworded("x").refusal(), Some(Refusal::Credentials));
        assert_eq!(e.copy_for_batch().refusal(), Some(Refusal::Credentials));
        assert!(format!("{e:?}").contains("refusal: Some(Credentials)"));
        let url = StoreError::new(StoreErrorKind::Config, "postgres", "authentication failed");
        assert_eq!(url.refusal(), None);
        assert_eq!(Refusal::NoDatabase.as_str(), "no_database");
    }

    // The two tests below were leasehold-sql's, for its copy of `bounded`; they moved
    // here with the one `bounded` left.
    #[tokio::test(start_paused = true)]
    async fn bounded_times_out_as_timeout() {
        let e = StoreError::bounded("test", "acquire", Duration::from_secs(2), async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Ok(())
        })
        .await
        .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Timeout);
        assert!(e.is_ambiguous());
        assert_eq!(e.backend(), "test");
        assert!(e.message().starts_with("acquire "), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_passes_results_through() {
        let bound = Duration::from_secs(1);
        assert_eq!(
            StoreError::bounded("test", "op", bound, async { Ok(5) })
                .await
                .unwrap(),
            5
        );
        let e = StoreError::bounded::<()>("test", "op", bound, async {
            Err(StoreError::new(StoreErrorKind::Busy, "test", "locked"))
        })
        .await
        .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Busy);
    }

    #[test]
    fn display_includes_source() {
        let e = StoreError::new(StoreErrorKind::Unavailable, "redis", "connect failed")
            .with_source(std::io::Error::other("refused"));
        assert_eq!(e.to_string(), "redis store: connect failed: refused");
        assert!(std::error::Error::source(&e).is_some());
    }
}
