//! The steps every SQL guard (docs/design.md §6) takes the same way, whatever its SQL: converting
//! fences to and from their column, reporting a rejection, reading an idempotency insert.
//!
//! The statements themselves stay in each backend: they differ in SQL, in locking and in
//! column types (SQLite and PostgreSQL store a fence as a signed 64-bit integer,
//! MariaDB/MySQL as `BIGINT UNSIGNED`).

use leasehold_core::{Fence, GuardDecision, Idempotency, ResourceName, StoreError, StoreErrorKind};

/// `fence` as a signed 64-bit column value (SQLite `INTEGER`, PostgreSQL `bigint`).
///
/// # Errors
/// [`StoreErrorKind::InvalidInput`] for a fence above `i64::MAX`, which such a column
/// cannot hold (no store issues one).
pub fn fence_to_i64(backend: &'static str, fence: Fence) -> Result<i64, StoreError> {
    i64::try_from(fence.get()).map_err(|_| {
        StoreError::new(
            StoreErrorKind::InvalidInput,
            backend,
            format!(
                "fence {fence} is above {}, the largest fence a signed 64-bit column holds",
                i64::MAX
            ),
        )
    })
}

/// A fence read back from a signed 64-bit column. The guard never writes a negative
/// value; one written by hand reads as fence 0, below every real fence.
pub fn fence_from_i64(value: i64) -> Fence {
    Fence(u64::try_from(value).unwrap_or(0))
}

/// Reports that `backend`'s guard rejected `fence` for `resource` because `current` was
/// accepted before: counts it in `leasehold_fence_rejected_total{resource_type}`, logs it
/// (warning), and returns the decision, [`GuardDecision::Rejected`].
pub fn rejected(
    backend: &'static str,
    resource: &ResourceName,
    fence: Fence,
    current: Fence,
) -> GuardDecision {
    leasehold_core::metrics::fence_rejected(resource.resource_type());
    tracing::warn!(
        backend,
        resource = resource.as_str(),
        fence = fence.get(),
        current = current.get(),
        "stale fence rejected by the guard"
    );
    GuardDecision::Rejected { current }
}

/// The answer of an idempotency record from whether its insert wrote the row
/// (`rows_affected() == 1` of an `INSERT … ON CONFLICT DO NOTHING`, or no duplicate-key
/// error): [`Idempotency::FirstTime`] if it did, [`Idempotency::AlreadyDone`] if the job
/// id was there.
pub fn idempotency(inserted: bool) -> Idempotency {
    if inserted {
        Idempotency::FirstTime
    } else {
        Idempotency::AlreadyDone
    }
}

#[cfg(test)]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;

    #[test]
    fn fences_round_trip_and_overflow_is_invalid_input() {
        assert_eq!(fence_to_i64("test", Fence(7)).unwrap(), 7);
        assert_eq!(
            fence_to_i64("test", Fence(i64::MAX as u64)).unwrap(),
            i64::MAX
        );
        let e = fence_to_i64("test", Fence(i64::MAX as u64 + 1)).unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::InvalidInput);
        assert_eq!(e.backend(), "test");
        let e = fence_to_i64("test", Fence(u64::MAX)).unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::InvalidInput);
        assert_eq!(fence_from_i64(7), Fence(7));
        assert_eq!(fence_from_i64(i64::MAX), Fence(i64::MAX as u64));
        assert_eq!(fence_from_i64(-1), Fence(0));
    }

    #[test]
    fn a_rejection_is_counted_by_resource_type() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let resource = ResourceName::new("ledger:invoices").unwrap();
        let decision = metrics::with_local_recorder(&recorder, || {
            rejected("test", &resource, Fence(3), Fence(5))
        });
        assert_eq!(decision, GuardDecision::Rejected { current: Fence(5) });
        let counted: Vec<_> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, ..)| k.key().name() == "leasehold_fence_rejected_total")
            .map(|(k, _, _, v)| {
                let label: Vec<_> = k
                    .key()
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                (label, v)
            })
            .collect();
        assert_eq!(
            counted,
            vec![(
                vec![("resource_type".to_owned(), "ledger".to_owned())],
                DebugValue::Counter(1)
            )]
        );
    }

    #[test]
    fn idempotency_follows_the_insert() {
        assert_eq!(idempotency(true), Idempotency::FirstTime);
        assert_eq!(idempotency(false), Idempotency::AlreadyDone);
    }
}
