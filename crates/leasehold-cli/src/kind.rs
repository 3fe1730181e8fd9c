//! A name is one kind of resource (`leasehold::kind`): `run --key NAME` refuses a
//! semaphore's name, `leader` and `observe` refuse it too. `run --key NAME --permits N`
//! needs nothing here: the semaphore checks its name itself.

use leasehold::{Election, Lease, LeaseClient, ResourceKind};

use crate::failure::Failure;

/// The lease `run` acquired, checked unless it is a permit (`permits`): refused (and
/// released) when its key is a semaphore's name.
pub(crate) async fn checked(
    client: &LeaseClient,
    lease: Lease,
    permits: Option<u32>,
) -> Result<Lease, Failure> {
    if permits.is_some() {
        return Ok(lease);
    }
    client
        .check_lease_kind(lease)
        .await
        .map_err(|e| Failure::from_lease(e, crate::exit::NOT_ACQUIRED))
}

/// Refuses an election whose name is a semaphore's (reading it would only ever show
/// "no leader").
pub(crate) async fn election(client: &LeaseClient, election: &Election) -> Result<(), Failure> {
    let name = election.name();
    match client.kind_of(name).await {
        Ok(Some(ResourceKind::Semaphore)) => Err(Failure::from_lease(
            leasehold::Error::KindMismatch {
                name: name.clone(),
                found: ResourceKind::Semaphore,
                asked: ResourceKind::Election,
            },
            crate::exit::NOT_ACQUIRED,
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(Failure::from_lease(e, crate::exit::NOT_ACQUIRED)),
    }
}
