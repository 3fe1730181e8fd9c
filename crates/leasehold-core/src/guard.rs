//! Shared vocabulary of the storage-side guards (docs/design.md §6).
//!
//! A guard keeps, per protected resource, the highest fence it has accepted. Checking the
//! fence, writing the data and advancing the guard happen in one transaction of the
//! caller's own database. The database backend crates implement it; this module holds the
//! types they share, so callers handle every guard the same way.

use std::fmt;
use std::sync::Arc;

use crate::key::Key;
use crate::token::Fence;

/// The longest [`ResourceName`], in bytes.
pub const MAX_RESOURCE_LEN: usize = 512;

// Every key is a valid resource name (`From<&Key>` takes it unchecked).
const _: () = assert!(crate::key::MAX_KEY_LEN <= MAX_RESOURCE_LEN);

/// Why a string is not a valid [`ResourceName`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResourceNameError {
    /// The name is empty.
    #[error("the resource name is empty")]
    Empty,
    /// The name is longer than [`MAX_RESOURCE_LEN`] bytes.
    #[error("the resource name is {len} bytes long; the maximum is {MAX_RESOURCE_LEN}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The name holds a NUL character, which SQL text columns cannot store.
    #[error("the resource name contains a NUL character")]
    Nul,
}

/// The name of a protected resource in a guard (or a job id in an idempotency record):
/// 1 to [`MAX_RESOURCE_LEN`] bytes, no NUL character. Validated once, so every guard
/// takes it as it is. A [`Key`] converts into one (`ResourceName::from(&key)`): the lease's
/// key is the usual resource name. Cloning is cheap (reference counted).
///
/// ```
/// use leasehold_core::guard::ResourceName;
/// let r = ResourceName::new("invoices:2026-11")?;
/// assert_eq!(r.as_str(), "invoices:2026-11");
/// assert_eq!(r.resource_type(), "invoices");
/// assert!(ResourceName::new("").is_err());
/// # Ok::<(), leasehold_core::guard::ResourceNameError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceName(Arc<str>);

impl ResourceName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`ResourceNameError`] for an empty, over-long or NUL-carrying name.
    pub fn new(name: impl AsRef<str>) -> Result<Self, ResourceNameError> {
        let name = name.as_ref();
        if name.is_empty() {
            return Err(ResourceNameError::Empty);
        }
        if name.len() > MAX_RESOURCE_LEN {
            return Err(ResourceNameError::TooLong { len: name.len() });
        }
        if name.contains('\0') {
            return Err(ResourceNameError::Nul);
        }
        Ok(Self(name.into()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part before the first `:` (or `none`), the only part used as a metric label,
    /// as [`Key::resource_type`] computes it.
    pub fn resource_type(&self) -> &str {
        crate::key::resource_type_of(&self.0)
    }
}

impl From<&Key> for ResourceName {
    fn from(key: &Key) -> Self {
        // A key is 1..=512 bytes without control characters: a valid resource name.
        Self(key.as_str().into())
    }
}

impl From<Key> for ResourceName {
    fn from(key: Key) -> Self {
        Self::from(&key)
    }
}

impl TryFrom<&str> for ResourceName {
    type Error = ResourceNameError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl TryFrom<String> for ResourceName {
    type Error = ResourceNameError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl std::str::FromStr for ResourceName {
    type Err = ResourceNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl AsRef<str> for ResourceName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResourceName({:?})", &*self.0)
    }
}

/// The decision of a guard for one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardDecision {
    /// The fence is at least the highest accepted: the write may proceed in this
    /// transaction, and the guard now records this fence.
    Accepted {
        /// The highest fence accepted before, if any.
        previous: Option<Fence>,
    },
    /// The fence is below the highest accepted: the writer lost its lease. Roll back and
    /// stop; never retry with the same fence.
    Rejected {
        /// The highest fence accepted so far.
        current: Fence,
    },
}

impl GuardDecision {
    /// Whether the write may proceed.
    pub fn is_accepted(self) -> bool {
        matches!(self, Self::Accepted { .. })
    }

    /// `Ok(())` when accepted, otherwise [`Error::FenceRejected`](crate::Error::FenceRejected)
    /// (whose action is [`OwnershipLost`](crate::Action::OwnershipLost)).
    ///
    /// # Errors
    /// [`Error::FenceRejected`](crate::Error::FenceRejected) when rejected.
    pub fn into_result(self, resource: &ResourceName, fence: Fence) -> Result<(), crate::Error> {
        match self {
            Self::Accepted { .. } => Ok(()),
            Self::Rejected { current } => Err(crate::Error::FenceRejected {
                resource: resource.clone(),
                fence,
                current,
            }),
        }
    }
}

/// The result of recording a job id in an idempotency record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idempotency {
    /// First time: do the work in this transaction.
    FirstTime,
    /// Already recorded by a committed transaction: the work was done; skip it.
    AlreadyDone,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_name_rules() {
        assert_eq!(ResourceName::new(""), Err(ResourceNameError::Empty));
        assert_eq!(
            ResourceName::new("a".repeat(MAX_RESOURCE_LEN + 1)),
            Err(ResourceNameError::TooLong {
                len: MAX_RESOURCE_LEN + 1
            })
        );
        assert!(ResourceName::new("a".repeat(MAX_RESOURCE_LEN)).is_ok());
        assert_eq!(ResourceName::new("a\0b"), Err(ResourceNameError::Nul));
        let key = Key::new("job:x").unwrap();
        assert_eq!(ResourceName::from(&key).as_str(), "job:x");
        assert_eq!(ResourceName::new(":x").unwrap().resource_type(), "none");
        assert_eq!(
            format!("{:?}", ResourceName::new("r").unwrap()),
            "ResourceName(\"r\")"
        );
    }
}
