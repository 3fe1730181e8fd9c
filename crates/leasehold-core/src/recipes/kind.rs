//! One kind of resource per name: a name is either a **lease** (taken with
//! [`LeaseClient::acquire`](crate::LeaseClient::acquire); an [election](crate::recipes::election)'s leader holds the lease of the
//! election's name, so a lease and an election are one kind and exclude each other through
//! that one lease) or a **semaphore** (its permits are the slot leases `NAME#i`, which do
//! not exclude the lease `NAME`). Without a check, `leasehold run --key exports` would run
//! beside the `--permits 2` holders of `exports`.
//!
//! What marks a name:
//!
//! - a semaphore: its record `semaphore/NAME` (its number of permits), written by its
//!   first acquire and never removed;
//! - an election: its record `election/NAME` (the leader's value), written by its first
//!   leader and never removed;
//! - a plain lease: nothing but the lease `NAME` itself while it is held (a lease writes no
//!   record).
//!
//! Who checks, each **after** its own mark is in the store:
//!
//! - a semaphore ([`Semaphore::acquire`](crate::Semaphore::acquire)), once a permit is
//!   granted (its record is written by then): the lease `NAME` must be free and the record
//!   `election/NAME` absent; else the permit is released and the caller gets
//!   [`Error::KindMismatch`](crate::Error::KindMismatch). A handle's first acquire reads the same before its first
//!   store call too, so that a semaphore refused on a lease's or an election's name does
//!   not write the record that would make the name its own;
//! - an election ([`Election::campaign`](crate::Election::campaign)) and a lease taken
//!   through [`LeaseClient::check_lease_kind`](crate::LeaseClient::check_lease_kind) (`leasehold run --key`), once the lease
//!   `NAME` is granted: the record `semaphore/NAME` must be absent; else the lease is
//!   released and the caller gets [`Error::KindMismatch`](crate::Error::KindMismatch).
//!
//! Because each side reads after its own mark is written, two callers racing on a fresh
//! name cannot both miss each other on a store whose reads see every write that completed
//! before them (if the semaphore's read missed the lease, the lease was granted after
//! that read, so after the semaphore's record was written, and the lease's read comes
//! later still). Both may be refused; neither then holds the name (the semaphore's record
//! may stay: the name is then a semaphore's). Costs: one round trip (two reads at once)
//! per permit granted, and one more on a semaphore handle's first acquire; one read per
//! campaign and per checked lease.
//!
//! What is not checked, and what remains:
//!
//! - The plain [`LeaseClient::acquire`](crate::LeaseClient::acquire) and [`LeaseClient::try_acquire`](crate::LeaseClient::try_acquire) check nothing (no
//!   extra round trip on the hot path): a library caller that shares names with
//!   semaphores passes the lease it got through [`LeaseClient::check_lease_kind`](crate::LeaseClient::check_lease_kind). A
//!   lease taken unchecked beside a semaphore's permits is seen by the semaphore's next
//!   grant (refused), never by the permits already held: nothing held is revoked.
//! - A plain lease marks its name only while it is held: a name used only by plain leases
//!   can be taken by a semaphore whenever its lease is free, and is a semaphore's from
//!   then on (records never expire). Use distinct names for distinct resources.
//! - The argument above needs reads that see every write completed before them. Where a
//!   store can lose acknowledged writes (a Redis fail-over, a restart without
//!   persistence) it loses the records with them, and the kind of the name with them, as
//!   it can lose leases; a ZooKeeper member cut off from the quorum answers reads from its
//!   own copy until it gives up.
//! - A lease named like a slot (`NAME#0`) is not checked: it takes that permit's place.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use leasehold_core::{Error, LeaseClient, LeaseConfig, ResourceKind, memory::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let client = LeaseClient::new(Arc::new(MemoryStore::new()), LeaseConfig::new(Duration::from_secs(10))?);
//! let permit = client.semaphore("exports", 2)?.try_acquire().await?;
//! let lease = client.try_acquire("exports").await?; // the plain acquire does not check
//! match client.check_lease_kind(lease).await {
//!     Err(Error::KindMismatch { found: ResourceKind::Semaphore, asked: ResourceKind::Lease, .. }) => {}
//!     other => panic!("a lease on a semaphore's name: {other:?}"),
//! }
//! assert_eq!(client.kind_of("exports").await?, Some(ResourceKind::Semaphore));
//! # drop(permit); Ok(()) }
//! ```

use std::fmt;

use crate::key::Key;

/// What a name is used as. A name is one kind of resource (see [the module](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResourceKind {
    /// A lease of the name (the plain [`LeaseClient::acquire`](crate::LeaseClient::acquire), `leasehold run --key`).
    Lease,
    /// An election: its leader holds the lease of the name (so it is one kind with a
    /// lease), and its value is kept in the record `election/NAME`.
    Election,
    /// A semaphore: slot leases `NAME#0` … and the record `semaphore/NAME`.
    Semaphore,
}

impl ResourceKind {
    /// `"lease"`, `"election"` or `"semaphore"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lease => "lease",
            Self::Election => "election",
            Self::Semaphore => "semaphore",
        }
    }

    /// Whether a name of kind `self` may be used as `other`: a lease and an election are
    /// one kind (the election's leader holds the lease); a semaphore is its own.
    pub fn shares_names_with(self, other: Self) -> bool {
        (self == Self::Semaphore) == (other == Self::Semaphore)
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The message of [`Error::KindMismatch`](crate::Error::KindMismatch): the name, what marks it as `found`, and what to
/// do.
pub(crate) fn mismatch_message(name: &Key, found: ResourceKind, asked: ResourceKind) -> String {
    let evidence = match found {
        ResourceKind::Semaphore => format!("the store holds its record `semaphore/{name}`"),
        ResourceKind::Election => format!("the store holds its record `election/{name}`"),
        ResourceKind::Lease => format!("another owner holds the lease `{name}`"),
    };
    let instead = match found {
        ResourceKind::Semaphore => ", or take one of its permits",
        ResourceKind::Lease | ResourceKind::Election => "",
    };
    let article = |kind: ResourceKind| match kind {
        ResourceKind::Election => "an",
        ResourceKind::Lease | ResourceKind::Semaphore => "a",
    };
    format!(
        "`{name}` is {} {found} ({evidence}), so it cannot be used as {} {asked}: a name is one \
         kind of resource; use another name for the {asked}{instead}",
        article(found),
        article(asked),
    )
}

/// The record that marks `name` as a semaphore, `semaphore/NAME`; `None` when that is too
/// long to be a key (no semaphore can have the name).
pub(crate) fn semaphore_record(name: &Key) -> Option<Key> {
    Key::new(format!("semaphore/{name}")).ok()
}

/// The record that marks `name` as an election, `election/NAME`; `None` when that is too
/// long to be a key (no election can have the name).
pub(crate) fn election_record(name: &Key) -> Option<Key> {
    Key::new(format!("election/{name}")).ok()
}
