//! Fast hashing and blob-name interning for the gradient IR.
//!
//! Blob names are hashed a handful of times per operator; the default SipHash would dominate
//! the cost of a large backward pass. `FxHasher` is the multiply-rotate hash used inside rustc:
//! not DoS-resistant, which is fine for names that come from the caller's own graph.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// A small, fast, non-cryptographic hasher (rustc's "Fx" hash).
#[derive(Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // The multiply leaves the entropy in the high bits, while hash tables index by the
        // low ones: rotate them down (names that differ only in their last bytes would
        // otherwise all land in one bucket).
        self.hash.rotate_left(26)
    }
}

/// `BuildHasher` for [`FxHasher`].
pub type FxBuild = BuildHasherDefault<FxHasher>;
/// A `HashMap` with [`FxHasher`].
pub type FxMap<K, V> = HashMap<K, V, FxBuild>;
/// A `HashSet` with [`FxHasher`].
pub type FxSet<K> = HashSet<K, FxBuild>;

/// An interned blob name: the index of the name in its [`Interner`].
pub type BlobId = u32;

/// Maps blob names (borrowed from the graph being differentiated) to dense ids, in order of
/// first appearance.
#[derive(Default)]
pub struct Interner<'a> {
    ids: FxMap<&'a str, BlobId>,
    names: Vec<&'a str>,
}

impl<'a> Interner<'a> {
    /// An interner with room for about `n` names.
    pub fn with_capacity(n: usize) -> Self {
        Interner {
            ids: FxMap::with_capacity_and_hasher(n, FxBuild::default()),
            names: Vec::with_capacity(n),
        }
    }

    /// The id of `name`, assigning the next id when the name is new.
    #[inline]
    pub fn intern(&mut self, name: &'a str) -> BlobId {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as BlobId;
        self.ids.insert(name, id);
        self.names.push(name);
        id
    }

    /// The id of `name`, if it was interned.
    #[inline]
    pub fn get(&self, name: &str) -> Option<BlobId> {
        self.ids.get(name).copied()
    }

    /// The name of `id`.
    #[inline]
    pub fn name(&self, id: BlobId) -> &'a str {
        self.names[id as usize]
    }

    /// Number of interned names.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no name was interned.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interner_assigns_ids_in_order() {
        let mut i = Interner::default();
        assert_eq!(i.intern("a"), 0);
        assert_eq!(i.intern("b"), 1);
        assert_eq!(i.intern("a"), 0);
        assert_eq!(i.get("b"), Some(1));
        assert_eq!(i.get("c"), None);
        assert_eq!(i.name(1), "b");
        assert_eq!(i.len(), 2);
    }

    #[test]
    fn fx_hash_differs_for_different_strings() {
        use std::hash::BuildHasher;
        let b = FxBuild::default();
        let h = |s: &str| b.hash_one(s);
        assert_ne!(h("abc"), h("abd"));
        assert_ne!(h("a"), h("a\0"));
    }
}
