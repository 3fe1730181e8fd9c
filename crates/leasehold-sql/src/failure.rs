//! [`Failure`], an error inside an operation, and [`ErrorModel`], the backend's reading of
//! its driver's errors.

use leasehold_core::StoreError;

/// Whether the request had been sent when an error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Getting a connection: nothing was sent.
    Connect,
    /// A statement was (or may have been) sent.
    Statement,
}

/// How one backend reads the errors of its sqlx driver. Each backend implements it with its
/// own tables (SQLite result codes, MariaDB/MySQL error numbers, PostgreSQL SQLSTATEs); the
/// shared layer only asks the two questions below.
pub trait ErrorModel {
    /// Whether `err`, raised by a statement, may have left its connection broken or out of
    /// step with the server. Such a connection is closed rather than pooled again.
    fn breaks_connection(&self, err: &sqlx::Error) -> bool;

    /// `err`, raised by the operation `op` in `phase`, as a [`StoreError`] of this backend.
    fn store_error(&self, err: sqlx::Error, op: &str, phase: Phase) -> StoreError;
}

/// An error inside an operation: from the driver, or already decided by the store (a
/// corrupt row, a clock that cannot be read, …).
#[derive(Debug)]
pub enum Failure {
    /// The driver or the server failed.
    Sql(sqlx::Error),
    /// The store decided.
    Store(StoreError),
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl Failure {
    /// Whether the connection that saw this failure must not be used again: a driver error
    /// that `model` says breaks it, or a store error that leaves the outcome unknown
    /// ([`StoreError::is_ambiguous`]: the connection may be mid-request).
    pub fn breaks_connection<M: ErrorModel + ?Sized>(&self, model: &M) -> bool {
        match self {
            Self::Store(e) => e.is_ambiguous(),
            Self::Sql(e) => model.breaks_connection(e),
        }
    }

    /// The [`StoreError`] to report: a store error as it is, a driver error as `model` maps
    /// it.
    pub fn into_store<M: ErrorModel + ?Sized>(
        self,
        model: &M,
        op: &str,
        phase: Phase,
    ) -> StoreError {
        match self {
            Self::Store(e) => e,
            Self::Sql(e) => model.store_error(e, op, phase),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use leasehold_core::StoreErrorKind;

    use super::*;

    /// A model for tests: I/O errors break the connection; every driver error maps to
    /// `Busy` while connecting and `Other` after, with the operation in the message.
    #[derive(Debug)]
    pub(crate) struct TestModel;

    impl ErrorModel for TestModel {
        fn breaks_connection(&self, err: &sqlx::Error) -> bool {
            matches!(err, sqlx::Error::Io(_))
        }
        fn store_error(&self, err: sqlx::Error, op: &str, phase: Phase) -> StoreError {
            let kind = match phase {
                Phase::Connect => StoreErrorKind::Busy,
                Phase::Statement => StoreErrorKind::Other,
            };
            StoreError::new(kind, "test", format!("{op}: {err}"))
        }
    }

    fn io() -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
    }

    #[test]
    fn driver_errors_follow_the_model() {
        assert!(Failure::from(io()).breaks_connection(&TestModel));
        assert!(!Failure::from(sqlx::Error::RowNotFound).breaks_connection(&TestModel));
        let e = Failure::from(sqlx::Error::RowNotFound).into_store(
            &TestModel,
            "read",
            Phase::Statement,
        );
        assert_eq!(e.kind(), StoreErrorKind::Other);
        assert_eq!(e.backend(), "test");
        assert!(e.message().starts_with("read: "), "{e}");
        let e = Failure::from(io()).into_store(&TestModel, "checkout", Phase::Connect);
        assert_eq!(e.kind(), StoreErrorKind::Busy);
    }

    #[test]
    fn store_errors_pass_through_and_break_only_when_ambiguous() {
        let corrupt = StoreError::new(StoreErrorKind::Corrupt, "test", "bad row");
        let f = Failure::from(corrupt);
        assert!(!f.breaks_connection(&TestModel));
        let e = f.into_store(&TestModel, "read", Phase::Statement);
        assert_eq!(e.kind(), StoreErrorKind::Corrupt);
        assert_eq!(e.message(), "bad row");
        for kind in [StoreErrorKind::Ambiguous, StoreErrorKind::Timeout] {
            let f = Failure::from(StoreError::new(kind, "test", "unknown outcome"));
            assert!(f.breaks_connection(&TestModel), "{kind:?}");
        }
    }
}
