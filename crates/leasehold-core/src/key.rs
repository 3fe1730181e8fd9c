//! Lease keys: the validated name of a protected resource.

use std::fmt;
use std::sync::Arc;

/// The longest key accepted, in bytes (UTF-8).
///
/// Chosen to fit every backend: PostgreSQL index entries (~2.7 KB), Redis keys and
/// ZooKeeper paths hold it comfortably; backends with smaller limits (MySQL `GET_LOCK`
/// names) hash longer keys themselves.
pub const MAX_KEY_LEN: usize = 512;

/// Why a string is not a valid [`Key`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is the empty string.
    #[error("key is empty; give the protected resource a name such as `job:invoices`")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`] bytes.
    #[error("key is {len} bytes long; the maximum is {max} bytes")]
    TooLong {
        /// Length of the rejected key in bytes.
        len: usize,
        /// The maximum allowed length.
        max: usize,
    },
    /// The key contains a control character (including NUL, newlines and tabs).
    #[error("key contains the control character U+{code:04X} at byte {index}")]
    ControlCharacter {
        /// Byte offset of the offending character.
        index: usize,
        /// The character's code point.
        code: u32,
    },
}

/// The validated name of a protected resource, e.g. `job:invoice-generation`.
///
/// Rules: non-empty, at most [`MAX_KEY_LEN`] bytes, no control characters. The part
/// before the first `:` is the *resource type*, the only part of a key that is ever used
/// as a metric label. Cloning is cheap (reference counted).
///
/// Methods that take a key accept anything [`IntoKey`] (`&str`, `String`, `Key`), and
/// report a bad one as [`Error::InvalidKey`](crate::Error::InvalidKey); make a `Key` to
/// validate a name once, up front.
///
/// # Examples
///
/// ```
/// use leasehold_core::{Key, KeyError};
///
/// let key = Key::new("job:invoice-generation")?;
/// assert_eq!(key.as_str(), "job:invoice-generation");
/// assert_eq!(key.resource_type(), "job"); // the metric label
///
/// let parsed: Key = "tenant:42/export".parse()?;
/// assert_eq!(parsed.resource_type(), "tenant");
///
/// assert_eq!(Key::new(""), Err(KeyError::Empty));
/// assert!(matches!(Key::new("a\nb"), Err(KeyError::ControlCharacter { index: 1, .. })));
/// assert!(matches!("x".repeat(513).parse::<Key>(), Err(KeyError::TooLong { .. })));
/// # Ok::<(), KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Arc<str>);

impl Key {
    /// Validates `name` and makes a key of it.
    ///
    /// # Errors
    /// [`KeyError`] when the name is empty, too long or contains a control character.
    pub fn new(name: impl AsRef<str>) -> Result<Self, KeyError> {
        let name = name.as_ref();
        if name.is_empty() {
            return Err(KeyError::Empty);
        }
        if name.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong {
                len: name.len(),
                max: MAX_KEY_LEN,
            });
        }
        if let Some((index, c)) = name.char_indices().find(|(_, c)| c.is_control()) {
            return Err(KeyError::ControlCharacter {
                index,
                code: c as u32,
            });
        }
        Ok(Self(Arc::from(name)))
    }

    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The resource type: the part before the first `:`, or `"none"` when the key has no
    /// `:`. Used as the `resource_type` metric label, so a full key never becomes a label.
    pub fn resource_type(&self) -> &str {
        resource_type_of(&self.0)
    }
}

/// The part of `name` before the first `:`, or `"none"` when there is none (or it is
/// empty): the `resource_type` label of keys and of guards' resource names alike.
pub(crate) fn resource_type_of(name: &str) -> &str {
    match name.split_once(':') {
        Some((prefix, _)) if !prefix.is_empty() => prefix,
        _ => "none",
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", &*self.0)
    }
}

impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Key {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// Anything that can be turned into a validated [`Key`]: `&str`, `String`, `Key`, `&Key`.
pub trait IntoKey {
    /// Validates and converts.
    ///
    /// # Errors
    /// [`KeyError`] when the key breaks a rule of [`Key::new`].
    fn into_key(self) -> Result<Key, KeyError>;
}

impl IntoKey for Key {
    fn into_key(self) -> Result<Key, KeyError> {
        Ok(self)
    }
}
impl IntoKey for &Key {
    fn into_key(self) -> Result<Key, KeyError> {
        Ok(self.clone())
    }
}
impl IntoKey for &str {
    fn into_key(self) -> Result<Key, KeyError> {
        Key::new(self)
    }
}
impl IntoKey for String {
    fn into_key(self) -> Result<Key, KeyError> {
        Key::new(self)
    }
}
impl IntoKey for &String {
    fn into_key(self) -> Result<Key, KeyError> {
        Key::new(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert_eq!(Key::new(""), Err(KeyError::Empty));
        assert!(matches!(
            Key::new("x".repeat(MAX_KEY_LEN + 1)),
            Err(KeyError::TooLong { .. })
        ));
        assert!(Key::new("x".repeat(MAX_KEY_LEN)).is_ok());
        assert_eq!(
            Key::new("a\0b"),
            Err(KeyError::ControlCharacter { index: 1, code: 0 })
        );
        assert!(matches!(
            Key::new("a\nb"),
            Err(KeyError::ControlCharacter { .. })
        ));
        assert!(Key::new("job:élan/{tag}").is_ok());
    }

    #[test]
    fn resource_type() {
        assert_eq!(Key::new("job:x:y").unwrap().resource_type(), "job");
        assert_eq!(Key::new("plain").unwrap().resource_type(), "none");
        assert_eq!(Key::new(":x").unwrap().resource_type(), "none");
    }
}
