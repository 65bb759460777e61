//! Interned names: every distinct blob name (or op type) gets a dense [`BlobId`], so the graph
//! algorithms index vectors instead of hashing strings.
//!
//! Names live in one arena string; the lookup table is a small open-addressing hash table of
//! ids. Interning 100k names costs a few milliseconds and one allocation per growth step.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A dense id for an interned name, valid for the [`Names`] table that issued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobId(pub u32);

impl BlobId {
    /// The id as a vector index.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A table of interned names. Ids are issued in first-seen order, starting at 0.
///
/// ```
/// use ferrocaffe::graph::Names;
///
/// let mut names = Names::default();
/// let a = names.intern("a");
/// let b = names.intern("b");
/// assert_eq!(names.intern("a"), a);
/// assert_eq!(names.get("b"), Some(b));
/// assert_eq!(names.get("c"), None);
/// assert_eq!(names.name(b), "b");
/// assert_eq!(names.len(), 2);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Names {
    arena: String,
    /// End offset in `arena` of each name; name `i` spans `ends[i-1]..ends[i]`.
    ends: Vec<usize>,
    /// Open-addressing table (length a power of two), in two arrays: a one-byte tag per slot
    /// (0 = empty, else `0x80 |` the top 7 bits of the hash) that probes scan, and the id in
    /// each slot, read only when the tag matches. The tags of a 500k-slot table fit in cache.
    tags: Vec<u8>,
    slots: Vec<u32>,
}

impl Names {
    /// An empty table with room for about `n` names (of `bytes` bytes in all) before it grows.
    pub fn with_capacity(n: usize, bytes: usize) -> Self {
        let mut names = Names {
            arena: String::with_capacity(bytes),
            ends: Vec::with_capacity(n),
            tags: Vec::new(),
            slots: Vec::new(),
        };
        names.rehash(Self::table_size(n));
        names
    }

    /// Number of interned names.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether no name was interned.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The name of `id`.
    ///
    /// # Panics
    /// If `id` was not issued by this table (a programming error, not a data error).
    #[inline]
    pub fn name(&self, id: BlobId) -> &str {
        let i = id.index();
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.arena[start..self.ends[i]]
    }

    /// Slots for `n` names at a load of at most 7/8 (probes scan one-byte tags, so long runs
    /// are cheap, and a small table stays in cache).
    fn table_size(n: usize) -> usize {
        (n + n / 7 + 1).next_power_of_two().max(16)
    }

    #[inline]
    fn tag(h: u64) -> u8 {
        0x80 | (h >> 57) as u8
    }

    /// Finds `name`: `Ok(id)` if interned, else `Err(slot)` where it would go.
    #[inline]
    fn find(&self, name: &str, h: u64) -> Result<BlobId, usize> {
        let mask = self.tags.len() - 1;
        let tag = Self::tag(h);
        let mut slot = (h as usize) & mask;
        loop {
            let t = self.tags[slot];
            if t == 0 {
                return Err(slot);
            }
            if t == tag {
                let id = BlobId(self.slots[slot]);
                if self.name(id) == name {
                    return Ok(id);
                }
            }
            slot = (slot + 1) & mask;
        }
    }

    /// The id of `name`, if it was interned.
    pub fn get(&self, name: &str) -> Option<BlobId> {
        if self.tags.is_empty() {
            return None;
        }
        self.find(name, hash_str(name)).ok()
    }

    /// The id of `name`, interning it if it is new.
    pub fn intern(&mut self, name: &str) -> BlobId {
        if self.tags.is_empty() {
            self.rehash(16);
        }
        self.intern_hashed(name, hash_str(name))
    }

    /// Interns the names of `batch` in order and appends their ids to `ids`: the same as
    /// [`Names::intern`] on each, with the table slots of the whole batch read first, so that
    /// their cache misses overlap instead of following one another.
    ///
    /// ```
    /// use ferrocaffe::graph::Names;
    ///
    /// let mut names = Names::default();
    /// let a = names.intern("a");
    /// let mut ids = Vec::new();
    /// names.intern_batch(&["b", "a", "b"], &mut ids);
    /// assert_eq!(ids, [names.intern("b"), a, names.intern("b")]);
    /// ```
    pub fn intern_batch(&mut self, batch: &[&str], ids: &mut Vec<BlobId>) {
        if self.tags.is_empty() {
            self.rehash(16);
        }
        let hashes: Vec<u64> = batch.iter().map(|s| hash_str(s)).collect();
        let mask = self.tags.len() - 1;
        let mut touched = 0u32;
        for &h in &hashes {
            let slot = (h as usize) & mask;
            touched ^= u32::from(self.tags[slot]) ^ self.slots[slot];
        }
        std::hint::black_box(touched);
        ids.reserve(batch.len());
        for (name, &h) in batch.iter().zip(&hashes) {
            ids.push(self.intern_hashed(name, h));
        }
    }

    #[inline]
    fn intern_hashed(&mut self, name: &str, h: u64) -> BlobId {
        let slot = match self.find(name, h) {
            Ok(id) => return id,
            Err(slot) => slot,
        };
        let id = BlobId(self.ends.len() as u32);
        self.arena.push_str(name);
        self.ends.push(self.arena.len());
        self.tags[slot] = Self::tag(h);
        self.slots[slot] = id.0;
        if self.ends.len() * 8 > self.tags.len() * 7 {
            self.rehash(self.tags.len() * 2);
        }
        id
    }

    /// The id of the name of `base` followed by `suffix` (`<base><suffix>`), interning it if it
    /// is new: [`Names::intern`] of the concatenation, built in place at the end of the arena
    /// (no allocation of its own).
    ///
    /// ```
    /// use ferrocaffe::graph::Names;
    ///
    /// let mut names = Names::default();
    /// let x = names.intern("x");
    /// let g = names.intern_suffixed(x, "_grad");
    /// assert_eq!(names.name(g), "x_grad");
    /// assert_eq!(names.intern_suffixed(x, "_grad"), g);
    /// assert_eq!(names.intern("x_grad"), g);
    /// ```
    pub fn intern_suffixed(&mut self, base: BlobId, suffix: &str) -> BlobId {
        if self.tags.is_empty() {
            self.rehash(16);
        }
        let i = base.index();
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        let end = self.ends[i];
        let tail = self.arena.len();
        // Appended after the last name: `[tail, arena.len())` is the candidate.
        self.arena.extend_from_within(start..end);
        self.arena.push_str(suffix);
        let h = hash_str(&self.arena[tail..]);
        let slot = self.find(&self.arena[tail..], h);
        match slot {
            Ok(id) => {
                self.arena.truncate(tail);
                id
            }
            Err(slot) => {
                let id = BlobId(self.ends.len() as u32);
                self.ends.push(self.arena.len());
                self.tags[slot] = Self::tag(h);
                self.slots[slot] = id.0;
                if self.ends.len() * 8 > self.tags.len() * 7 {
                    self.rehash(self.tags.len() * 2);
                }
                id
            }
        }
    }

    /// Whether the table is large enough for [`Names::prefetch_suffixed`] to pay (its slots
    /// no longer fit in a core's cache).
    pub fn prefetch_pays(&self) -> bool {
        self.tags.len() >= 1 << 18
    }

    /// Starts loading the table slot where [`Names::intern_suffixed`]`(base, suffix)` will
    /// look, so that a call a little later finds it in cache (a hint: nothing changes; names
    /// longer than 64 bytes are skipped).
    #[inline]
    pub fn prefetch_suffixed(&self, base: BlobId, suffix: &str) {
        if self.tags.is_empty() {
            return;
        }
        let name = self.name(base).as_bytes();
        let mut buf = [0u8; 64];
        let n = name.len() + suffix.len();
        if n > buf.len() {
            return;
        }
        buf[..name.len()].copy_from_slice(name);
        buf[name.len()..n].copy_from_slice(suffix.as_bytes());
        let h = hash_bytes(&buf[..n]);
        let slot = (h as usize) & (self.tags.len() - 1);
        prefetch(self.tags[slot..].as_ptr());
        prefetch(self.slots[slot..].as_ptr().cast());
    }

    /// All `(id, name)` pairs in id order.
    pub fn iter(&self) -> impl Iterator<Item = (BlobId, &str)> + '_ {
        (0..self.len()).map(|i| {
            let id = BlobId(i as u32);
            (id, self.name(id))
        })
    }

    fn rehash(&mut self, size: usize) {
        let mut tags = vec![0u8; size];
        let mut slots = vec![0u32; size];
        let mask = size - 1;
        for i in 0..self.len() {
            let h = hash_str(self.name(BlobId(i as u32)));
            let mut slot = (h as usize) & mask;
            while tags[slot] != 0 {
                slot = (slot + 1) & mask;
            }
            tags[slot] = Self::tag(h);
            slots[slot] = i as u32;
        }
        self.tags = tags;
        self.slots = slots;
    }
}

/// A fast non-cryptographic hash (the "Fx" multiply-rotate scheme), for small keys that are not
/// chosen by an adversary: blob names, ids, `(id, version)` pairs.
#[derive(Debug, Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

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
    fn write_i64(&mut self, i: i64) {
        self.add(i as u64);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // Final avalanche so that the low bits (used for table slots) depend on every input bit.
        let mut h = self.hash;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h
    }
}

/// `BuildHasher` for [`FxHasher`].
pub type FxBuild = BuildHasherDefault<FxHasher>;
/// `HashMap` with [`FxHasher`].
pub type FxHashMap<K, V> = HashMap<K, V, FxBuild>;
/// `HashSet` with [`FxHasher`].
pub type FxHashSet<K> = HashSet<K, FxBuild>;

#[inline]
fn hash_str(s: &str) -> u64 {
    hash_bytes(s.as_bytes())
}

#[inline]
fn hash_bytes(s: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(s);
    h.add(s.len() as u64);
    h.finish()
}

/// Hints the CPU to bring the cache line at `p` in (no effect on other targets).
#[inline]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints the cache, for any address; SSE, which the intrinsic
    // needs, is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dense_and_stable_across_growth() {
        let mut names = Names::default();
        let ids: Vec<BlobId> = (0..10_000)
            .map(|i| names.intern(&format!("blob_{i}")))
            .collect();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(id.index(), i);
            assert_eq!(names.name(*id), format!("blob_{i}"));
            assert_eq!(names.get(&format!("blob_{i}")), Some(*id));
            assert_eq!(names.intern(&format!("blob_{i}")), *id);
        }
        assert_eq!(names.len(), 10_000);
        assert_eq!(names.get("blob_10000"), None);
    }

    #[test]
    fn empty_and_prefix_names_are_distinct() {
        let mut names = Names::with_capacity(4, 16);
        let e = names.intern("");
        let a = names.intern("a");
        let aa = names.intern("aa");
        let a0 = names.intern("a\0");
        assert_eq!(names.len(), 4);
        assert_eq!(names.name(e), "");
        assert_ne!(a, aa);
        assert_ne!(a, a0);
        assert_eq!(names.get(""), Some(e));
        let collected: Vec<&str> = names.iter().map(|(_, n)| n).collect();
        assert_eq!(collected, ["", "a", "aa", "a\0"]);
    }

    #[test]
    fn suffixed_names_intern_as_their_concatenation() {
        let mut names = Names::default();
        let ids: Vec<BlobId> = (0..2000).map(|i| names.intern(&format!("b{i}"))).collect();
        let pre = names.intern("b7_grad");
        for (i, &id) in ids.iter().enumerate() {
            let g = names.intern_suffixed(id, "_grad");
            assert_eq!(names.name(g), format!("b{i}_grad"));
            assert_eq!(names.get(&format!("b{i}_grad")), Some(g));
            assert_eq!(names.intern_suffixed(id, "_grad"), g);
        }
        assert_eq!(names.intern_suffixed(ids[7], "_grad"), pre);
        names.prefetch_suffixed(ids[3], "_grad");
        names.prefetch_suffixed(ids[3], &"x".repeat(100));
        assert_eq!(names.len(), 4000);
        let e = names.intern("");
        assert_eq!(names.intern_suffixed(e, ""), e);
        let mut empty = Names::default();
        let a = empty.intern("a");
        let same = empty.intern_suffixed(a, "");
        assert_eq!(same, a);
        assert_eq!(empty.len(), 1);
    }

    #[test]
    fn empty_table_lookups() {
        let names = Names::default();
        assert!(names.is_empty());
        assert_eq!(names.get("x"), None);
    }

    #[test]
    fn fx_hash_map_works_with_tuples() {
        let mut m: FxHashMap<(BlobId, i64), usize> = FxHashMap::default();
        m.insert((BlobId(1), 2), 3);
        m.insert((BlobId(2), 1), 4);
        assert_eq!(m.get(&(BlobId(1), 2)), Some(&3));
        assert_eq!(m.get(&(BlobId(2), 1)), Some(&4));
        assert_eq!(m.get(&(BlobId(1), 1)), None);
    }

    #[test]
    fn fx_hash_differs_for_different_strings() {
        use std::hash::BuildHasher;
        let b = FxBuild::default();
        let h = |s: &str| b.hash_one(s);
        assert_ne!(h("abc"), h("abd"));
        assert_ne!(h("a"), h("a\0"));
        let set: FxHashSet<&str> = ["x", "y", "x"].into_iter().collect();
        assert_eq!(set.len(), 2);
    }
}
