//! GET_LOCK session faults.
//!
//! - `killed_session_loses_lease_and_another_acquires` (FAULTS 19): `KILL` of the holder's
//!   connection fires its lost signal within one renew interval and another store takes
//!   the lease with a higher fence; then a break from another store (which `KILL`s the
//!   holder's session) does the same.
//! - `holder_process_paused_then_killed` (FAULTS 1 and 3 for a session-bound store): a
//!   frozen holder process keeps its session, so the lock outlives the TTL until it wakes,
//!   then its lost signal fires and the lock is free; a `kill -9`ed holder frees it at once.
//!
//! Child processes are this test binary run again with `LEASEHOLD_MYSQL_WORKER` set (see
//! `worker_entry`, an empty test otherwise).

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use leasehold::{Error, Key, LeaseClient, LeaseConfig, LostReason, Store};
use leasehold_mysql::{MySqlGetLockStore, lock_name};
use leasehold_testkit::WorkerProcess;
use tokio::time::{Instant, sleep, timeout};

const WORKER_ENV: &str = "LEASEHOLD_MYSQL_WORKER";
const LONG: Duration = Duration::from_secs(60);

fn config() -> LeaseConfig {
    LeaseConfig::new(common::TTL).unwrap()
}

async fn open(url: &str) -> Arc<MySqlGetLockStore> {
    Arc::new(
        MySqlGetLockStore::open(&format!("{url}?timeout=1s&connect_timeout=2s"))
            .await
            .expect("open the store"),
    )
}

fn getlock_url(db: &common::Server) -> String {
    db.url().replacen("mysql://", "mysql+getlock://", 1)
}

/// Entry point of the child processes; an empty test when not a child.
#[test]
fn worker_entry() {
    let Ok(url) = std::env::var(WORKER_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let store = open(&url).await;
        let client = LeaseClient::new(store, config());
        let lease = client.try_acquire("gl:held").await.expect("acquire");
        println!("@held {}", lease.fence().get());
        let reason = lease.lost().await;
        println!("@lost {}", reason.as_str());
        sleep(LONG).await;
    });
}

fn worker(url: &str) -> WorkerProcess {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "worker_entry",
        "--exact",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ])
    .env(WORKER_ENV, url);
    WorkerProcess::spawn(cmd)
}

fn wait_line(w: &WorkerProcess, prefix: &str) -> String {
    let prefixed = format!("@{prefix}");
    tokio::task::block_in_place(|| w.wait_for_line(|l| l.starts_with(&prefixed), LONG))
        .unwrap_or_else(|| panic!("no `{prefix}` line from the worker: {:?}", w.lines()))
        .trim_start_matches('@')
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_session_loses_lease_and_another_acquires() {
    let db = common::start_db();
    let admin = common::admin(&db).await;
    let url = getlock_url(&db);
    let a = open(&url).await;
    let b = open(&url).await;
    let key = Key::new("job:killed").unwrap();

    let client_a = LeaseClient::new(a.clone(), config());
    let lease = client_a.try_acquire(&key).await.unwrap();
    let id = a.connection_id(&key).expect("A holds a session");
    let used: Option<u64> = sqlx::query_scalar("SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED)")
        .bind(lock_name(&key))
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(
        used,
        Some(id),
        "the store reports the session holding the lock"
    );
    // B cannot take it while A's session lives.
    let client_b = LeaseClient::new(b.clone(), config());
    assert!(matches!(
        client_b.try_acquire(&key).await,
        Err(Error::Contended {
            remaining: None,
            ..
        })
    ));

    let killed = common::kill_lock_holder(&admin, &key).await;
    assert_eq!(killed, id);
    let bound = config().renew_interval() + config().op_timeout() + Duration::from_secs(1);
    let reason = timeout(bound, lease.lost())
        .await
        .expect("lost fires within one renew interval after the KILL");
    assert!(
        matches!(
            reason,
            LostReason::NotOwner | LostReason::RenewFailed { .. }
        ),
        "{reason:?}"
    );
    assert_eq!(a.held_count(), 0, "the dead session is forgotten");
    let taken = client_b
        .acquire(&key, common::TTL * 2)
        .await
        .expect("another store acquires after the KILL");
    assert!(taken.fence() > lease.fence());
    assert!(!lease.release().await.unwrap(), "A's release finds nothing");
    let info = b.inspect(&key).await.unwrap().expect("B holds");
    assert_eq!((info.owner, info.fence), (*taken.owner(), taken.fence()));

    // An operator breaks B's lease from A's store: B's session is KILLed, the fence moves.
    let broken = a.break_lease(&key).await.expect("break through KILL");
    assert!(broken > taken.fence());
    let reason = timeout(bound, taken.lost())
        .await
        .expect("B's lost fires after the break");
    assert!(
        matches!(
            reason,
            LostReason::NotOwner | LostReason::RenewFailed { .. }
        ),
        "{reason:?}"
    );
    assert_eq!(a.inspect(&key).await.unwrap(), None);
    let next = client_a
        .try_acquire(&key)
        .await
        .expect("free after the break");
    assert!(next.fence() > broken);
    assert!(next.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_process_paused_then_killed() {
    let db = common::start_db();
    let url = getlock_url(&db);
    let store = open(&url).await;
    let client = LeaseClient::new(store.clone(), config());
    let key = Key::new("gl:held").unwrap();

    // Paused past its TTL: the session (and the lock) outlive the TTL while it is frozen.
    let holder = worker(&url);
    let held: u64 = wait_line(&holder, "held")[5..].parse().unwrap();
    holder.pause();
    sleep(common::TTL * 2).await;
    assert!(
        matches!(client.try_acquire(&key).await, Err(Error::Contended { .. })),
        "a frozen holder's session still holds the lock"
    );
    let info = store.inspect(&key).await.unwrap().expect("visible as held");
    assert_eq!(info.fence.get(), held);
    holder.resume();
    let lost = wait_line(&holder, "lost");
    assert!(
        ["lost expired", "lost not_owner", "lost renew_failed"].contains(&lost.as_str()),
        "{lost}"
    );
    // Its keeper saw the TTL pass without renewal and let the lock go.
    let lease = client
        .acquire(&key, common::TTL * 3)
        .await
        .expect("free once the holder woke up");
    assert!(lease.fence().get() > held);
    assert!(lease.release().await.unwrap());
    drop(holder);

    // Killed: the server ends its session and the lock at once.
    let holder = worker(&url);
    let held: u64 = wait_line(&holder, "held")[5..].parse().unwrap();
    holder.kill();
    let killed_at = Instant::now();
    let lease = client
        .acquire(&key, common::TTL * 3)
        .await
        .expect("free after kill -9");
    assert!(lease.fence().get() > held);
    assert!(
        killed_at.elapsed() < common::TTL * 2,
        "takeover took {:?}",
        killed_at.elapsed()
    );
    assert!(lease.release().await.unwrap());
}
