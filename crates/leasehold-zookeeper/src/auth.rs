//! Digest authentication and the ACL of every node the store creates.
//!
//! With credentials, every node the store creates (the root path and its missing
//! ancestors, each key's directory, each lease and waiter node, the records directory and
//! each record) carries one ACL entry: all permissions (`cdrwa`) to the store's digest
//! identity `digest:user:base64(sha1(user:password))`, and nothing to anyone else — not
//! even reading. ZooKeeper checks `DELETE` on a node's parent, so the directories carry it
//! too: another identity can neither delete a lease node nor a record, nor create one, nor
//! list a queue. Without credentials every node is open (`world:anyone:cdrwa`), as before.

use base64::Engine;
use leasehold_core::{Refusal, StoreError, StoreErrorKind};
use zookeeper_client as zk;

use crate::config::Credentials;
use crate::error::{err, map_err};
use crate::session::Session;

/// The store's digest identity: its user name and ZooKeeper's id for it.
pub(crate) struct Identity {
    pub(crate) user: String,
    /// `user:base64(sha1(user:password))`, as ZooKeeper's `DigestAuthenticationProvider`
    /// makes it. Derived from the password: never shown.
    pub(crate) id: String,
    /// The ACL of every node the store creates: all permissions to `id` only.
    pub(crate) acl: Vec<zk::Acl>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// ZooKeeper's digest id of `user` with `password`.
pub(crate) fn digest_id(user: &str, password: &str) -> String {
    let mut sha1 = sha1_smol::Sha1::new();
    sha1.update(user.as_bytes());
    sha1.update(b":");
    sha1.update(password.as_bytes());
    let hash = base64::engine::general_purpose::STANDARD.encode(sha1.digest().bytes());
    format!("{user}:{hash}")
}

impl Identity {
    pub(crate) fn new(credentials: &Credentials) -> Self {
        let id = digest_id(&credentials.user, credentials.password.expose());
        let acl = vec![zk::Acl::new(
            zk::Permission::ALL,
            zk::AuthId::new("digest", &id),
        )];
        Self {
            user: credentials.user.clone(),
            id,
            acl,
        }
    }

    /// The `auth` request's data: `user:password`.
    pub(crate) fn auth_data(credentials: &Credentials) -> Vec<u8> {
        format!("{}:{}", credentials.user, credentials.password.expose()).into_bytes()
    }
}

/// The permissions `acl` gives `identity` (`None`: unauthenticated): the entries for
/// anyone (`world:anyone`) and for its digest id.
fn granted(acl: &[zk::Acl], identity: Option<&Identity>) -> zk::Permission {
    acl.iter()
        .filter(|a| {
            (a.scheme() == "world" && a.id() == "anyone")
                || identity.is_some_and(|me| a.scheme() == "digest" && a.id() == me.id)
        })
        .fold(zk::Permission::NONE, |p, a| p | a.permission())
}

/// Checks that the root path's ACL gives the store's identity every permission, so that a
/// store opened with a wrong password or another identity is refused at `open`, typed,
/// rather than at its first lease.
///
/// ZooKeeper accepts any digest password (it only computes the identity from it): a wrong
/// one is an identity the root's ACL does not name, and the server then refuses even to
/// show the ACL (`NoAuth`), so a wrong password cannot be told from another user's root.
/// Both are a [`Refusal::Credentials`] (fix the user or the password in the URL), as is a
/// store without credentials on a root that requires them. A root whose ACL the identity
/// may read but which does not give it every permission is a [`Refusal::Permission`].
pub(crate) async fn check_root(
    s: &Session,
    root: &str,
    identity: Option<&Identity>,
) -> Result<(), StoreError> {
    let acl = match s.client.get_acl(root).await {
        Ok((acl, _)) => acl,
        Err(zk::Error::NoAuth) => {
            let msg = match identity {
                Some(me) => format!(
                    "zookeeper: user `{}` is refused on the root path {root}: wrong password \
                     for `{}`, or the root was made by another identity (then use that \
                     identity, or another root path)",
                    me.user, me.user
                ),
                None => format!(
                    "zookeeper: the root path {root}'s ACL admits only authenticated \
                     identities: give the credentials (zookeeper://user:password@host:port/…)"
                ),
            };
            return Err(err(StoreErrorKind::Config, msg).refused(Refusal::Credentials));
        }
        Err(e) => return Err(map_err("read the root path's ACL", e)),
    };
    if granted(&acl, identity).has(zk::Permission::ALL) {
        return Ok(());
    }
    let who = identity.map_or_else(
        || "an unauthenticated client".to_owned(),
        |me| format!("user `{}`", me.user),
    );
    Err(err(
        StoreErrorKind::Config,
        format!(
            "zookeeper: permission denied: the root path {root}'s ACL does not give {who} all \
             permissions (cdrwa): have an administrator grant them, or use another root path"
        ),
    )
    .refused(Refusal::Permission))
}

#[cfg(test)]
mod tests {
    use leasehold_core::url::Secret;

    use super::*;

    /// The id ZooKeeper's `DigestAuthenticationProvider.generateDigest` makes
    /// (`echo -n super:superpw | openssl dgst -binary -sha1 | base64`).
    #[test]
    fn the_digest_id_is_zookeepers() {
        assert_eq!(
            digest_id("super", "superpw"),
            "super:g9oN2HttPfn8MMWJZ2r45Np/LIA="
        );
    }

    #[test]
    fn the_identity_shows_no_secret_and_its_acl_names_it() {
        let me = Identity::new(&Credentials {
            user: "app".into(),
            password: Secret("sentinel-pw".into()),
        });
        let shown = format!("{me:?}");
        assert!(
            !shown.contains("sentinel-pw") && !shown.contains(&me.id[4..]),
            "{shown}"
        );
        let anyone = zk::Acl::new(zk::Permission::ALL, zk::AuthId::anyone());
        let ours = me.acl[0].clone();
        let other = zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("digest", "app:x"));
        assert!(granted(&[anyone], Some(&me)).has(zk::Permission::ALL));
        assert!(granted(&[ours], Some(&me)).has(zk::Permission::ALL));
        assert!(!granted(std::slice::from_ref(&other), Some(&me)).has(zk::Permission::ALL));
        assert!(!granted(&[other], None).has(zk::Permission::READ));
    }
}
