//! A worker that shuts down gracefully on SIGTERM (docs/faults.md row 27).
//!
//! It holds a lease on the embedded SQLite store and writes batches of two rows, each
//! batch in one transaction guarded by the lease's fence. On SIGTERM it calls
//! [`LeaseClient::shutdown`]: renewal stops and the lease's lost signal fires with
//! [`LostReason::Shutdown`], so [`Lease::run`] drops the work at its next await — the open
//! transaction is dropped and rolls back, never half written. Once the work has stopped,
//! the worker releases the lease itself, so the next holder gets it at once instead of
//! after the TTL.
//!
//! ```text
//! cargo run -p leasehold-sqlite --example graceful_worker -- leases.db data.db job:batches
//! ```
//!
//! It prints one line per step (`acquired`, `in-transaction`, `committed`, `rolled-back`,
//! `released`, `shutdown`) for the test that sends it SIGTERM mid-transaction.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Error, Lease, LeaseClient, LeaseConfig, LostReason, ResourceName};
use leasehold_sqlite::{SqliteStore, guard};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use sqlx::{Connection, SqliteConnection};
use tokio::signal::unix::{SignalKind, signal};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Writes batches until the lease is lost or the shutdown stops it.
async fn work(data: &SqlitePool, lease: &Lease) -> Result<(), BoxError> {
    let fence = lease.fence();
    let resource = ResourceName::new("batches")?;
    for batch in 1i64.. {
        let mut conn = data.acquire().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        guard::check_and_advance(&mut tx, &resource, fence)
            .await?
            .into_result(&resource, fence)?;
        insert(&mut tx, batch, 1).await?;
        println!("in-transaction {batch}");
        // The rest of the batch's work; a SIGTERM here must not leave part 1 behind.
        tokio::time::sleep(Duration::from_millis(400)).await;
        insert(&mut tx, batch, 2).await?;
        tx.commit().await?;
        println!("committed {batch}");
    }
    Ok(())
}

async fn insert(conn: &mut SqliteConnection, batch: i64, part: i64) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO batches (batch, part) VALUES (?1, ?2)")
        .bind(batch)
        .bind(part)
        .execute(conn)
        .await
        .map(drop)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let [_, leases, data, key] = &args[..] else {
        return Err("usage: graceful_worker LEASES_DB DATA_DB KEY".into());
    };
    let store = SqliteStore::open(&format!("sqlite://{leases}")).await?;
    let data = SqlitePool::connect_with(
        SqliteConnectOptions::new()
            .filename(data)
            .create_if_missing(true),
    )
    .await?;
    guard::migrate(&data).await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS batches (batch INTEGER, part INTEGER, PRIMARY KEY (batch, part))",
    )
    .execute(&data)
    .await?;

    let mut sigterm = signal(SignalKind::terminate())?;
    let client = LeaseClient::new(Arc::new(store), LeaseConfig::new(Duration::from_secs(10))?);
    let lease = client
        .acquire(key.as_str(), Duration::from_secs(60))
        .await?;
    println!("acquired {}", lease.fence());

    let worker = {
        let data = data.clone();
        tokio::spawn(async move {
            let res = lease.run(work(&data, &lease)).await;
            // The work has stopped. Closing the pool waits until the dropped transaction
            // has rolled back on its connection.
            data.close().await;
            println!("rolled-back");
            match res {
                Err(Error::LeaseLost(LostReason::Shutdown)) => {}
                other => eprintln!("work ended: {other:?}"),
            }
            // Releasing is the holder's act, done once the work has stopped.
            let released = lease.release().await;
            println!("released {}", matches!(released, Ok(true)));
        })
    };

    sigterm.recv().await;
    let report = client.shutdown(Duration::from_secs(5)).await;
    worker.await?;
    println!(
        "shutdown held={} still_held={}",
        report.held, report.still_held
    );
    Ok(())
}
