//! The futures users hold across threads are `Send` (and `'static` where they own what
//! they need), checked at compile time on futures that are built but never awaited.
//!
//! `Send` on the types alone (`LeaseClient`, `Lease`) says nothing about the futures of
//! their async methods: a future that keeps a `MutexGuard`, an `Rc` or a non-`Sync`
//! reference across an await is not `Send`, and `tokio::spawn` refuses it. If one of these
//! stops compiling, a change made a future unusable in a multi-threaded runtime.

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::memory::MemoryStore;
use leasehold_core::wrap::{FaultStore, TimeoutStore};
use leasehold_core::{
    Key, Lease, LeaseClient, LeaseConfig, LostSignal, OwnerToken, Registry, Store,
};

fn assert_send<T: Send>(_: &T) {}
fn assert_send_static<T: Send + 'static>(_: &T) {}

fn client() -> LeaseClient {
    LeaseClient::new(
        Arc::new(MemoryStore::new()),
        LeaseConfig::new(Duration::from_secs(10)).unwrap(),
    )
}

/// Futures of `LeaseClient`: `Send`, borrowing the client (not `'static`).
#[test]
fn client_futures_are_send() {
    let client = client();
    let key = Key::new("job:x").unwrap();
    assert_send(&client.acquire("job:x", Duration::from_secs(1)));
    assert_send(&client.acquire(String::from("job:x"), Duration::from_secs(1)));
    assert_send(&client.acquire(&key, Duration::from_secs(1)));
    assert_send(&client.try_acquire("job:x"));
    assert_send(&client.try_acquire(key.clone()));
    assert_send(&client.shutdown(Duration::from_secs(1)));
}

/// What `tokio::spawn` needs: an `async move` block that owns a clone of the client.
#[test]
fn spawnable_client_futures() {
    let client = client();
    assert_send_static(&{
        let client = client.clone();
        async move { client.acquire("job:x", Duration::from_secs(1)).await }
    });
    assert_send_static(&{
        let client = client.clone();
        async move { client.try_acquire(String::from("job:x")).await }
    });
    assert_send_static(&{
        let client = client.clone();
        async move { client.shutdown(Duration::from_secs(1)).await }
    });
    // And the lease it yields can be moved into another task and released there.
    assert_send_static(&async move {
        let lease = client.try_acquire("job:x").await?;
        tokio::spawn(lease.release()).await.unwrap()
    });
}

/// Futures of `Lease` and of its lost signal.
#[tokio::test]
async fn lease_futures_are_send() {
    let client = client();
    let lease: Lease = client.try_acquire("job:x").await.unwrap();

    // `run` with `Send` work is `Send` (it borrows the lease).
    assert_send(&lease.run(async { 1 }));
    assert_send(&lease.run(tokio::time::sleep(Duration::from_millis(1))));

    // The lost signal owns what it needs: `'static`, so it can be spawned.
    let lost: LostSignal = lease.lost();
    assert_send_static(&lost.wait());
    assert_send_static(&lost.clone().into_future());
    assert_send(&lease.lost().into_future()); // `lease.lost().await`

    // `release` takes the lease by value: `'static`.
    let release = lease.release();
    assert_send_static(&release);
    assert!(tokio::spawn(release).await.unwrap().unwrap());
}

/// `Registry::open`, and the `OpenFuture` a factory returns.
#[test]
fn registry_open_is_send() {
    let registry = Registry::new();
    assert_send(&registry.open("memory://"));
    assert_send_static(&async move { registry.open("memory://").await });
}

fn store_futures_are_send(store: Arc<dyn Store>) {
    let key = Key::new("job:x").unwrap();
    let owner = OwnerToken::random();
    let ttl = Duration::from_secs(1);
    assert_send(&store.acquire(&key, &owner, ttl));
    assert_send(&store.renew(&key, &owner, ttl));
    assert_send(&store.release(&key, &owner));
    assert_send(&store.inspect(&key));
    assert_send(&store.list("job:"));
    assert_send(&store.break_lease(&key));
    assert_send(&store.put_record(&key, leasehold_core::Fence(1), b"v"));
    assert_send(&store.get_record(&key));
    // The extensions, and the helpers that choose between a store's batch and the default.
    let waiter = store.waiter().expect("every store here has a waiter");
    assert_send(&waiter.wait_released(&key, &owner, ttl));
    let watcher = store.watcher().expect("every store here has a watcher");
    assert_send(&watcher.watch(&key));
    if let Some(batch) = store.batch() {
        assert_send(&batch.renew_many(&[], ttl));
        assert_send(&batch.acquire_any(&[], &owner, ttl));
    }
    assert_send(&leasehold_core::renew_many(&*store, &[], ttl));
    assert_send(&leasehold_core::acquire_any(&*store, &[], &owner, ttl));
    // Spawnable when the task owns the store and the arguments.
    assert_send_static(&async move { store.acquire(&key, &owner, ttl).await });
}

/// Every `Store` method on an `Arc<dyn Store>` (the `async_trait` futures are boxed
/// `Send` futures by the trait's declaration; this keeps it so).
#[test]
fn store_trait_futures_are_send() {
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    store_futures_are_send(memory.clone());
    store_futures_are_send(Arc::new(TimeoutStore::new(
        memory.clone(),
        Duration::from_secs(1),
    )));
    store_futures_are_send(Arc::new(FaultStore::new(memory)));
}

/// A generic helper a user would write compiles: spawn any `Send` work under a lease.
#[allow(dead_code)]
async fn spawn_under_lease<F>(
    client: LeaseClient,
    work: F,
) -> Result<F::Output, leasehold_core::Error>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(async move {
        let lease = client.acquire("job:x", Duration::from_secs(1)).await?;
        let out = lease.run(work).await?;
        lease.release().await?;
        Ok(out)
    })
    .await
    .expect("the task panicked")
}
