//! Owner tokens and fencing tokens.

use std::fmt;

use rand::RngCore;

/// 128 random bits that prove who holds a lease.
///
/// A new token is drawn from a CSPRNG (the thread-local ChaCha generator seeded by the
/// operating system) for every acquisition call; it is never a worker id. Only the holder
/// of the token can renew or release the lease. Displayed as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerToken([u8; 16]);

impl OwnerToken {
    /// A fresh random token.
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        rand::rng().fill_bytes(&mut bytes);
        Self(bytes)
    }

    /// A token from raw bytes (for stores that read tokens back).
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The token as 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.hex_str(|s| s.to_owned())
    }

    /// Calls `f` with the 32 lowercase hex digits, written on the stack (the token is
    /// written into every store call: a formatter call per byte was a measurable share of
    /// a Redis acquire's client CPU, issue 29).
    fn hex_str<T>(&self, f: impl FnOnce(&str) -> T) -> T {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (pair, b) in out.chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0x0f)];
        }
        // Hex digits are ASCII: always valid UTF-8.
        f(std::str::from_utf8(&out).unwrap_or_default())
    }
}

/// A string that is not 32 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an owner token is 32 hex digits")]
pub struct ParseOwnerTokenError;

impl std::str::FromStr for OwnerToken {
    type Err = ParseOwnerTokenError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.as_bytes();
        if s.len() != 32 {
            return Err(ParseOwnerTokenError);
        }
        let mut out = [0u8; 16];
        for (i, pair) in s.chunks_exact(2).enumerate() {
            let hi = hex_val(pair[0]).ok_or(ParseOwnerTokenError)?;
            let lo = hex_val(pair[1]).ok_or(ParseOwnerTokenError)?;
            out[i] = (hi << 4) | lo;
        }
        Ok(Self(out))
    }
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.hex_str(|s| f.write_str(s))
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({self})")
    }
}

/// A fencing token: grows strictly with every new grant of the same key, never repeats
/// and never goes down. Renewal does not change it.
///
/// Pass it with every write to the protected storage, which must reject a write whose
/// fence is lower than the highest it has accepted (see the guard in the backend crates).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Fence(pub u64);

impl Fence {
    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<Fence> for u64 {
    fn from(f: Fence) -> u64 {
        f.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_roundtrip_and_uniqueness() {
        let a = OwnerToken::random();
        let b = OwnerToken::random();
        assert_ne!(a, b);
        let s = a.to_hex();
        assert_eq!(s.len(), 32);
        assert_eq!(s.parse::<OwnerToken>().unwrap(), a);
        assert!("xyz".parse::<OwnerToken>().is_err());
        assert!("zz".repeat(16).parse::<OwnerToken>().is_err());
    }

    #[test]
    fn token_digits_are_lowercase_hex_high_nibble_first() {
        let t = OwnerToken::from_bytes([
            0x00, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xf0, 0x0f, 0x10, 0x9a, 0xbc,
            0xde, 0xff,
        ]);
        let want = "000123456789abcdeff00f109abcdeff";
        assert_eq!(t.to_hex(), want);
        assert_eq!(t.to_string(), want);
        assert_eq!(format!("{t:?}"), format!("OwnerToken({want})"));
    }
}
