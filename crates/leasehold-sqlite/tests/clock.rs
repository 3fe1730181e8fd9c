//! SQLite's expiry clock, on an injected clock (`ManualHostClock`): expiry runs on
//! `CLOCK_BOOTTIME` tagged with the boot id, never on the wall clock. A wall-clock step
//! changes nothing; the boot clock passing the TTL expires the lease; another boot id (a
//! reboot: SQLite's "restart with persistence", recorded for its proof) expires it; fences
//! keep growing across all of it. And a file of the old format (expiry on the wall clock)
//! is converted, never misread. An injected clock is not the system clock: the clock-jump
//! and host-suspend rows are proven on it by the shared `row_14` and `row_33` cases
//! (`conformance.rs`) and by `processes.rs`.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Key, OwnerToken, ReleaseOutcome, RenewOutcome, Store, StoreErrorKind,
};
use leasehold_sqlite::{HostClock, ManualHostClock, SqliteConfig, SqliteStore};
use leasehold_testkit::proof::{self, Backend, Fault, proves};

const TTL: Duration = Duration::from_secs(10);
const HOUR_US: i64 = 3_600_000_000;

fn fence_of(o: AcquireOutcome) -> u64 {
    match o {
        AcquireOutcome::Acquired { fence, .. } => fence.get(),
        held => panic!("expected Acquired, got {held:?}"),
    }
}

fn remaining_of(o: AcquireOutcome) -> Duration {
    match o {
        AcquireOutcome::Held { remaining } => remaining.expect("SQLite reports it"),
        acquired => panic!("expected Held, got {acquired:?}"),
    }
}

/// The host reboots (another boot id), as its clock says; recorded for the test's proof
/// (SQLite's "restart with persistence": the file outlives the host's boot).
fn reboot(clock: &ManualHostClock) {
    clock.reboot();
    proof::record(proof::Injected::HostRebooted);
}

async fn store_with(clock: &Arc<ManualHostClock>) -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store =
        SqliteStore::connect(SqliteConfig::new(dir.path().join("l.db")).clock(clock.clone()))
            .await
            .unwrap();
    (dir, store)
}

#[tokio::test]
async fn a_wall_clock_step_changes_nothing() {
    let clock = Arc::new(ManualHostClock::new());
    let (_dir, store) = store_with(&clock).await;
    let k = Key::new("job:wall").unwrap();
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    let f1 = fence_of(store.acquire(&k, &a, TTL).await.unwrap());
    assert!(
        f1 >= clock.wall_clock_us() as u64,
        "fence floored at the wall clock"
    );

    for step in [HOUR_US, -2 * HOUR_US, 30 * 24 * HOUR_US, -60 * 24 * HOUR_US] {
        clock.step_wall(step);
        // Still held, with exactly the time it had: the expiry clock did not move.
        assert_eq!(remaining_of(store.acquire(&k, &b, TTL).await.unwrap()), TTL);
        let info = store.inspect(&k).await.unwrap().expect("held");
        assert_eq!((info.owner, info.fence.get()), (a, f1));
        assert_eq!(info.remaining, Some(TTL));
        assert_eq!(store.list("job:").await.unwrap().len(), 1);
        assert_eq!(
            store.renew(&k, &a, TTL).await.unwrap(),
            RenewOutcome::Renewed { ttl: TTL }
        );
        assert_eq!(
            store.renew(&k, &b, TTL).await.unwrap(),
            RenewOutcome::NotOwner
        );
    }
    // Fences still grow after the wall clock went back (by a month, net): last + 1.
    assert_eq!(
        store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::Released
    );
    let f2 = fence_of(store.acquire(&k, &b, TTL).await.unwrap());
    assert!(f2 > f1, "{f2} > {f1}");
    let f3 = store.break_lease(&k).await.unwrap().get();
    assert!(f3 > f2);
}

#[tokio::test]
async fn the_boot_clock_passing_the_ttl_expires_the_lease() {
    let clock = Arc::new(ManualHostClock::new());
    let (_dir, store) = store_with(&clock).await;
    let k = Key::new("job:expire").unwrap();
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    let f1 = fence_of(store.acquire(&k, &a, TTL).await.unwrap());
    clock.advance(TTL - Duration::from_micros(1));
    assert_eq!(
        remaining_of(store.acquire(&k, &b, TTL).await.unwrap()),
        Duration::from_micros(1)
    );
    clock.advance(Duration::from_micros(1));
    assert_eq!(store.inspect(&k).await.unwrap(), None, "expired");
    assert!(store.list("job:").await.unwrap().is_empty());
    assert_eq!(
        store.renew(&k, &a, TTL).await.unwrap(),
        RenewOutcome::NotOwner
    );
    let f2 = fence_of(store.acquire(&k, &b, TTL).await.unwrap());
    assert!(f2 > f1);
    assert_eq!(
        store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::NotOwner
    );
    assert_eq!(store.inspect(&k).await.unwrap().unwrap().owner, b);
}

#[tokio::test]
async fn another_boot_id_expires_the_lease_and_fences_still_grow() {
    let _proof = proves(Backend::Sqlite, Fault::RestartWithPersistence);
    let clock = Arc::new(ManualHostClock::new());
    let (_dir, store) = store_with(&clock).await;
    let k = Key::new("job:reboot").unwrap();
    let (a, b) = (OwnerToken::random(), OwnerToken::random());
    let f1 = fence_of(
        store
            .acquire(&k, &a, Duration::from_secs(3600))
            .await
            .unwrap(),
    );
    // Half an hour on, renewed: it expires 1.5 h into the boot.
    clock.advance(Duration::from_secs(1800));
    assert_eq!(
        store
            .renew(&k, &a, Duration::from_secs(3600))
            .await
            .unwrap(),
        RenewOutcome::Renewed {
            ttl: Duration::from_secs(3600)
        }
    );
    // The host reboots: its boot clock starts again at 1 s, far below that expiry, and
    // the process that held the lease is gone. The row is from another boot: expired.
    reboot(&clock);
    assert_eq!(store.inspect(&k).await.unwrap(), None);
    assert!(store.list("").await.unwrap().is_empty());
    assert_eq!(
        store.renew(&k, &a, TTL).await.unwrap(),
        RenewOutcome::NotOwner
    );
    let f2 = fence_of(store.acquire(&k, &b, TTL).await.unwrap());
    assert!(f2 > f1, "fences grow across reboots: {f2} > {f1}");
    assert_eq!(
        store.release(&k, &a).await.unwrap(),
        ReleaseOutcome::NotOwner
    );
    let info = store.inspect(&k).await.unwrap().expect("b holds it");
    assert_eq!((info.owner, info.remaining), (b, Some(TTL)));
}

/// The table as leasehold-sqlite wrote it before (format 1: expiry on the wall clock).
const FORMAT_1: &str = "\
CREATE TABLE leasehold_leases (
    lease_key     TEXT    NOT NULL PRIMARY KEY,
    owner         TEXT,
    fence         INTEGER NOT NULL,
    expires_at_us INTEGER
) STRICT";

#[tokio::test]
async fn a_file_of_the_old_format_is_converted_never_misread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let clock = Arc::new(ManualHostClock::new());
    let wall = clock.wall_clock_us();
    let held_by = OwnerToken::random();
    let owner = |o: &OwnerToken| Some(o.to_hex());
    let rows: [(&str, Option<String>, i64, Option<i64>); 6] = [
        // Held for 30 more minutes on the wall clock.
        ("old:held", owner(&held_by), 1_000, Some(wall + HOUR_US / 2)),
        // Ran out a minute ago.
        (
            "old:expired",
            owner(&OwnerToken::random()),
            2_000,
            Some(wall - 60_000_000),
        ),
        // Released.
        ("old:free", None, 3_000, None),
        // Ten years ahead (the wall clock went back since): at most the longest TTL.
        (
            "old:far",
            owner(&OwnerToken::random()),
            4_000,
            Some(wall + 87_600 * HOUR_US),
        ),
        // Not leases: stay corrupt.
        (
            "old:bad-owner",
            Some("not-hex".into()),
            5_000,
            Some(wall + HOUR_US),
        ),
        ("old:no-expiry", owner(&OwnerToken::random()), 6_000, None),
    ];
    {
        let old = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .unwrap();
        sqlx::raw_sql(FORMAT_1).execute(&old).await.unwrap();
        for (k, o, f, e) in &rows {
            sqlx::query(
                "INSERT INTO leasehold_leases (lease_key, owner, fence, expires_at_us) VALUES (?1, ?2, ?3, ?4)",
            )
            .bind(k)
            .bind(o)
            .bind(f)
            .bind(e)
            .execute(&old)
            .await
            .unwrap();
        }
        old.close().await;
    }

    let store = SqliteStore::connect(SqliteConfig::new(&path).clock(clock.clone()))
        .await
        .unwrap();
    let key = |s: &str| Key::new(s).unwrap();
    let other = OwnerToken::random();
    // Held: exactly the 30 minutes it had left, now on the boot clock; its owner renews.
    let r = remaining_of(store.acquire(&key("old:held"), &other, TTL).await.unwrap());
    assert_eq!(r, Duration::from_secs(1800), "not years, not free");
    let info = store.inspect(&key("old:held")).await.unwrap().unwrap();
    assert_eq!((info.owner, info.fence.get()), (held_by, 1_000));
    // A wall-clock step after the conversion changes nothing.
    clock.step_wall(2 * HOUR_US);
    assert_eq!(
        remaining_of(store.acquire(&key("old:held"), &other, TTL).await.unwrap()),
        Duration::from_secs(1800)
    );
    assert_eq!(
        store.renew(&key("old:held"), &held_by, TTL).await.unwrap(),
        RenewOutcome::Renewed { ttl: TTL }
    );
    // Far: held for the longest TTL at most.
    let far = remaining_of(store.acquire(&key("old:far"), &other, TTL).await.unwrap());
    assert_eq!(far, Duration::from_secs(24 * 3600));
    // Expired and free: taken, with a fence above the old one.
    for (k, old_fence) in [("old:expired", 2_000), ("old:free", 3_000)] {
        assert_eq!(store.inspect(&key(k)).await.unwrap(), None, "{k}");
        let f = fence_of(store.acquire(&key(k), &other, TTL).await.unwrap());
        assert!(f > old_fence, "{k}: {f}");
    }
    // Not leases: still corrupt.
    for k in ["old:bad-owner", "old:no-expiry"] {
        let e = store.inspect(&key(k)).await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Corrupt, "{k}: {e}");
    }
    // Opening the file again (another process of the new version) converts nothing twice.
    let again = SqliteStore::connect(SqliteConfig::new(&path).clock(clock.clone()))
        .await
        .unwrap();
    let info = again.inspect(&key("old:held")).await.unwrap().unwrap();
    assert_eq!((info.owner, info.remaining), (held_by, Some(TTL)));
    // A leasehold of the old format still running on the file fails every statement: it
    // can never read a lease of the new format as expired.
    for old_sql in [
        "SELECT owner, fence, expires_at_us FROM leasehold_leases WHERE lease_key = 'old:held'",
        "UPDATE leasehold_leases SET expires_at_us = 1 WHERE lease_key = 'old:held'",
        "INSERT INTO leasehold_leases (lease_key, owner, fence, expires_at_us) VALUES ('x', NULL, 1, NULL)",
    ] {
        let e = sqlx::raw_sql(old_sql)
            .execute(store.pool())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("expires_at_us"), "{old_sql}: {e}");
    }
}

#[tokio::test]
async fn a_lease_table_of_unknown_shape_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap();
    sqlx::raw_sql("CREATE TABLE leasehold_leases (lease_key TEXT PRIMARY KEY, whatever INTEGER)")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let e = SqliteStore::connect(SqliteConfig::new(&path))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
}
