//! Node paths: a key's directory `<chroot>/<key, escaped>` holding its queue of
//! `<owner token hex>-<sequence>` nodes, and the records directory `<chroot>/%2erecords`.

use leasehold_core::{Key, OwnerToken, StoreError, StoreErrorKind};

use crate::error::err;
use crate::session::ZkStore;

/// A key as one ZooKeeper path component: ASCII letters, digits, `:`, `_` and `-` stay,
/// every other byte (`/`, `.`, `%`, spaces, non-ASCII) becomes `%XX`. Reversible.
pub(crate) fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b == b':' || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(crate) fn decode_key(name: &str) -> Option<Key> {
    let decoded = leasehold_core::url::percent_decode(name)?;
    Key::new(decoded).ok()
}

/// The name of the records directory under the root path. [`encode_key`] writes its escapes
/// in upper case (`%2E`), so no key's directory is ever named this; a client of an earlier
/// version reads the name as the key `.records` in `list` and looks for that key's lease in
/// `%2Erecords`, so it finds none and its `list` keeps working.
pub(crate) const RECORDS_DIR: &str = "%2erecords";

/// A queue node's name: `<owner token hex>-<sequence>`.
fn parse_node(name: &str) -> Option<(OwnerToken, i64)> {
    let (owner, seq) = name.rsplit_once('-')?;
    Some((owner.parse().ok()?, seq.parse().ok()?))
}

/// The queue of `dir`, lowest sequence first. Names that are not queue nodes are `Corrupt`.
pub(crate) fn sorted_queue(
    children: Vec<String>,
) -> Result<Vec<(OwnerToken, i64, String)>, StoreError> {
    let mut queue = children
        .into_iter()
        .map(|name| {
            parse_node(&name).map(|(o, s)| (o, s, name)).ok_or_else(|| {
                err(
                    StoreErrorKind::Corrupt,
                    "a node in a lease directory is not a lease node",
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    queue.sort_by_key(|(_, seq, _)| *seq);
    Ok(queue)
}

impl ZkStore {
    /// The directory of `key`'s queue: `<chroot>/<key, escaped>`.
    pub fn lease_dir(&self, key: &Key) -> String {
        format!(
            "{}/{}",
            self.inner.config.chroot_path(),
            encode_key(key.as_str())
        )
    }

    /// The directory of the records (see
    /// [`Store::put_record`](leasehold_core::Store::put_record)): `<chroot>/%2erecords`,
    /// apart from every lease directory (created on the first record written).
    pub fn records_dir(&self) -> String {
        format!("{}/{RECORDS_DIR}", self.inner.config.chroot_path())
    }

    /// The persistent node that holds `key`'s record: `<chroot>/%2erecords/<key,
    /// escaped>`.
    pub fn record_path(&self, key: &Key) -> String {
        format!("{}/{}", self.records_dir(), encode_key(key.as_str()))
    }

    /// The node name prefix of `owner`'s grants: `<owner token hex>-`.
    pub fn node_prefix(owner: &OwnerToken) -> String {
        format!("{owner}-")
    }
}
