//! Cases for what is built on the lease: the fenced records of [`Store::put_record`],
//! leader election and semaphores (issue 17). Part of [`CASES`](crate::CASES): every
//! backend runs them.

use leasehold_core::{Fence, Key, MAX_RECORD_LEN, Record, StoreErrorKind};

use crate::Fixture;

fn key(name: &str) -> Key {
    Key::new(format!("conformance:{name}")).expect("valid key")
}

/// `put_record` writes only with a higher fence (or when absent), returns what is stored,
/// and keeps records apart from leases; a store that says it lacks records answers
/// `Unsupported` to both calls.
pub async fn records_are_fenced_writes(fx: &Fixture) {
    let store = &fx.store;
    let k = key(&format!("record-{}", leasehold_core::OwnerToken::random()));
    if !store.capabilities().records {
        for err in [
            store.put_record(&k, Fence(1), b"v").await.map(drop),
            store.get_record(&k).await.map(drop),
        ] {
            let err = err.expect_err("records work but capabilities say they do not");
            assert_eq!(err.kind(), StoreErrorKind::Unsupported, "{err}");
        }
        return;
    }
    let get = || async { store.get_record(&k).await.expect("get_record") };
    let k2 = &k;
    let put = |fence: u64, value: &'static [u8]| async move {
        store
            .put_record(k2, Fence(fence), value)
            .await
            .expect("put_record")
    };
    let rec = |fence: u64, value: &[u8]| Record {
        fence: Fence(fence),
        value: value.to_vec(),
    };
    assert_eq!(get().await, None, "a record nobody wrote is absent");
    // Set-if-absent with fence 0, as a semaphore stores its permit count.
    assert_eq!(put(0, b"3").await, rec(0, b"3"), "absent: written");
    assert_eq!(
        put(0, b"4").await,
        rec(0, b"3"),
        "same fence: kept, not overwritten"
    );
    assert_eq!(
        put(7, b"seven").await,
        rec(7, b"seven"),
        "higher fence: written"
    );
    assert_eq!(
        put(5, b"five").await,
        rec(7, b"seven"),
        "lower fence: refused"
    );
    assert_eq!(
        put(7, b"again").await,
        rec(7, b"seven"),
        "equal fence: refused"
    );
    assert_eq!(
        get().await,
        Some(rec(7, b"seven")),
        "get returns the stored record"
    );
    // The largest fence and a value of any bytes (not UTF-8, with NUL) up to the limit.
    let big: Vec<u8> = (0..MAX_RECORD_LEN).map(|i| (i % 256) as u8).collect();
    let stored = store
        .put_record(&k, Fence(u64::MAX >> 1), &big)
        .await
        .expect("put_record of MAX_RECORD_LEN bytes");
    assert_eq!(
        stored,
        Record {
            fence: Fence(u64::MAX >> 1),
            value: big.clone()
        },
        "big value"
    );
    assert_eq!(
        store
            .get_record(&k)
            .await
            .expect("get_record")
            .map(|r| r.value),
        Some(big),
        "a value is stored byte for byte"
    );
    // An empty value is a value.
    let e = key(&format!(
        "record-empty-{}",
        leasehold_core::OwnerToken::random()
    ));
    let stored = store
        .put_record(&e, Fence(1), b"")
        .await
        .expect("put empty");
    assert_eq!(stored, rec(1, b""), "empty value");
    // Records and leases are separate: a lease on the record's key sees no lease there.
    assert_eq!(
        store.inspect(&k).await.expect("inspect"),
        None,
        "a record is not a lease"
    );
}
