//! Coordination built on the lease, each on the client's public API as a user could
//! write it (as etcd's `concurrency` package builds on `clientv3`): an [election]
//! (a leader holding the lease of the election's name, with its value in a record) and a
//! [semaphore] (N permits, each the lease of one slot, taken through
//! [`LeaseClient::acquire_with`](crate::LeaseClient::acquire_with)); [kind] keeps a name
//! one kind of resource.

pub mod election;
pub mod kind;
mod kind_check;
pub mod semaphore;

/// The recipes' tests' client: the memory store, a 3 s TTL.
#[cfg(test)]
fn test_client(store: &crate::store::memory::MemoryStore) -> crate::LeaseClient {
    let config = crate::LeaseConfig::new(std::time::Duration::from_secs(3)).unwrap();
    crate::LeaseClient::new(std::sync::Arc::new(store.clone()), config)
}
