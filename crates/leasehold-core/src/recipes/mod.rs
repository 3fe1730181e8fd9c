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
