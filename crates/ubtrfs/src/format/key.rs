//! The btrfs key: (objectid, type, offset), ordered field by field.

use super::le;
use crate::Result;

/// Size of a key on disk.
pub const KEY_SIZE: usize = 17;

/// A btrfs key. The derived order (objectid, type, offset) is the tree order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key {
    /// Object id: inode number, tree id, logical address, ...
    pub objectid: u64,
    /// Item type.
    pub item_type: u8,
    /// Type-dependent offset.
    pub offset: u64,
}

impl Key {
    /// The smallest key.
    pub const MIN: Key = Key::new(0, 0, 0);
    /// The largest key.
    pub const MAX: Key = Key::new(u64::MAX, u8::MAX, u64::MAX);

    /// A key from its three fields.
    pub const fn new(objectid: u64, item_type: u8, offset: u64) -> Self {
        Key {
            objectid,
            item_type,
            offset,
        }
    }

    /// Decode a key at `off` in `b`.
    pub fn parse(b: &[u8], off: usize) -> Result<Self> {
        Ok(Key {
            objectid: le::u64(b, off)?,
            item_type: le::u8(b, off + 8)?,
            offset: le::u64(b, off + 9)?,
        })
    }

    /// Encode the key into 17 bytes.
    pub fn to_bytes(&self) -> [u8; KEY_SIZE] {
        let mut out = [0u8; KEY_SIZE];
        out[0..8].copy_from_slice(&self.objectid.to_le_bytes());
        out[8] = self.item_type;
        out[9..17].copy_from_slice(&self.offset.to_le_bytes());
        out
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({} {} {})", self.objectid, self.item_type, self.offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_field_by_field() {
        assert!(Key::new(1, 200, 0) < Key::new(2, 0, 0));
        assert!(Key::new(1, 1, 500) < Key::new(1, 2, 0));
        let k = Key::new(0x0102, 84, 0xdead_beef);
        assert_eq!(Key::parse(&k.to_bytes(), 0).unwrap(), k);
        assert!(Key::parse(&[0u8; 16], 0).is_err());
    }
}
