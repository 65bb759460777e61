//! The orders that Caffe2's C++ memonger observed from its standard library containers.
//!
//! Caffe2 built its memonger with GCC's libstdc++ and named the shared blobs while iterating an
//! `std::unordered_map<std::string, std::string>`, and released blobs while iterating an
//! `std::unordered_set<std::string>`. Those iteration orders are a function of libstdc++'s
//! string hash, its prime bucket policy and its node list; the free list was a binary heap
//! built with `std::push_heap` / `std::pop_heap`, whose layout also decides results when a
//! free blob is taken from the middle. This module reproduces those three mechanisms so that
//! the names and choices come out as Caffe2's did (checked in the tests against orders
//! recorded from a libstdc++ build).

use std::collections::HashMap;

/// libstdc++'s `std::hash<std::string>` on a 64-bit target (`std::_Hash_bytes` with the seed
/// `0xc70f6907`, a MurmurHash2 variant).
pub(crate) fn std_string_hash(bytes: &[u8]) -> u64 {
    const MUL: u64 = (0xc6a4_a793_u64 << 32).wrapping_add(0x5bd1_e995);
    const SEED: u64 = 0xc70f_6907;
    fn shift_mix(v: u64) -> u64 {
        v ^ (v >> 47)
    }
    let len = bytes.len() as u64;
    let mut hash = SEED ^ len.wrapping_mul(MUL);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let data = shift_mix(u64::from_le_bytes(word).wrapping_mul(MUL)).wrapping_mul(MUL);
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let data = rest
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8).wrapping_add(u64::from(b)));
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    hash = shift_mix(hash).wrapping_mul(MUL);
    shift_mix(hash)
}

/// Bucket counts of libstdc++'s `_Prime_rehash_policy` past its small-size table.
const PRIMES: &[u64] = &[
    17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 103, 109, 113, 127,
    137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257, 277, 293, 313, 337, 359, 383, 409,
    439, 467, 503, 541, 577, 619, 661, 709, 761, 823, 887, 953, 1031, 1109, 1193, 1289, 1381, 1493,
    1613, 1741, 1879, 2029, 2179, 2357, 2549, 2753, 2971, 3209, 3469, 3739, 4027, 4349, 4703, 5087,
    5503, 5953, 6427, 6949, 7517, 8123, 8783, 9497, 10273, 11113, 12011, 12983, 14033, 15173,
    16411, 17749, 19183, 20753, 22447, 24281, 26267, 28411, 30727, 33223, 35933, 38873, 42043,
    45481, 49201, 53201, 57557, 62233, 67307, 72817, 78779, 85229, 92203, 99733, 107897, 116731,
    126271, 136607, 147793, 159871, 172933, 187091, 202409, 218971, 236897, 256279, 277261, 299951,
    324503, 351061, 379787, 410857, 444487, 480881, 520241, 562841, 608903, 658753, 712697, 771049,
    834181, 902483, 976369, 1056323, 1142821, 1236397, 1337629, 1447153, 1565659, 1693859, 1832561,
    1982627, 2144977, 2320627, 2510653, 2716249, 2938679, 3179303, 3439651, 3721303, 4026031,
    4355707, 4712381, 5098259, 5515729, 5967347, 6456007, 6984629, 7556579, 8175383, 8844859,
    9569143, 10352717, 11200489, 12117689, 13109983, 14183539, 15345007, 16601593, 17961079,
    19431899, 21023161, 22744717, 24607243, 26622317, 28802401, 31160981, 33712729, 36473443,
    39460231, 42691603, 46187573, 49969847, 54061849, 58488943, 63278561, 68460391, 74066549,
    80131819, 86693767, 93793069, 101473717, 109783337, 118773397, 128499677, 139022417, 150406843,
    162723577, 176048909, 190465427, 206062531, 222936881, 241193053, 260944219, 282312799,
    305431229, 330442829, 357502601, 386778277, 418451333, 452718089, 489790921, 529899637,
    573292817, 620239453, 671030513, 725980837, 785430967, 849749479, 919334987, 994618837,
    1076067617, 1164186217, 1259520799, 1362662261, 1474249943, 1594975441, 1725587117, 1866894511,
    2019773507, 2185171673, 2364114217, 2557710269, 2767159799, 2993761039, 3238918481, 3504151727,
    3791104843, 4101556399, 4294967291,
];

/// Bucket counts for hints below 14.
const FAST_BUCKETS: [u64; 14] = [2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13];

/// The node before a bucket's first node: the list head or a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Before {
    Head,
    Node(usize),
}

/// The order in which an `std::unordered_map<std::string, _>` (or `unordered_set`) of
/// libstdc++ iterates its keys, for a table that is only ever inserted into.
///
/// Keys are kept in the table's singly linked node list; each bucket remembers the node before
/// its first node, exactly as `_Hashtable` does, and rehashes follow `_Prime_rehash_policy`
/// (maximum load factor 1, growth factor 2, a default-constructed table with one bucket).
#[derive(Debug, Default)]
pub(crate) struct StdKeyOrder {
    keys: Vec<String>,
    hashes: Vec<u64>,
    next: Vec<Option<usize>>,
    head: Option<usize>,
    buckets: Vec<Option<Before>>,
    next_resize: u64,
    index: HashMap<String, usize>,
}

impl StdKeyOrder {
    pub(crate) fn new() -> Self {
        StdKeyOrder {
            buckets: vec![None],
            ..Default::default()
        }
    }

    pub(crate) fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    fn bucket_count(&self) -> u64 {
        self.buckets.len() as u64
    }

    /// `_Prime_rehash_policy::_M_next_bkt`.
    fn next_bucket_count(&mut self, n: u64) -> u64 {
        if let Some(&b) = usize::try_from(n).ok().and_then(|i| FAST_BUCKETS.get(i)) {
            if n == 0 {
                return 1;
            }
            self.next_resize = b;
            return b;
        }
        let last = PRIMES.len() - 1;
        let i = PRIMES[..last].partition_point(|&p| p < n);
        self.next_resize = if i == last { u64::MAX } else { PRIMES[i] };
        PRIMES[i]
    }

    /// `_Prime_rehash_policy::_M_need_rehash`: the new bucket count, if one is needed before
    /// `n_ins` more elements go in.
    fn need_rehash(&mut self, n_ins: u64) -> Option<u64> {
        let n_elt = self.keys.len() as u64;
        let n_bkt = self.bucket_count();
        let wanted = n_elt.saturating_add(n_ins);
        if wanted > self.next_resize {
            // A table that has allocated nothing yet starts with at least 11 buckets' worth.
            let min_buckets = wanted.max(if self.next_resize == 0 { 11 } else { 0 });
            if min_buckets >= n_bkt {
                let hint = min_buckets.saturating_add(1).max(n_bkt.saturating_mul(2));
                return Some(self.next_bucket_count(hint));
            }
            self.next_resize = n_bkt;
        }
        None
    }

    fn after(&self, before: Before) -> Option<usize> {
        match before {
            Before::Head => self.head,
            Before::Node(i) => self.next[i],
        }
    }

    fn set_after(&mut self, before: Before, node: Option<usize>) {
        match before {
            Before::Head => self.head = node,
            Before::Node(i) => self.next[i] = node,
        }
    }

    fn bucket_of(&self, node: usize, count: u64) -> usize {
        // `count` is the length of `self.buckets` (or of the table being built), so the
        // remainder indexes it.
        (self.hashes[node] % count) as usize
    }

    /// `_Hashtable::_M_rehash_aux` for unique keys.
    fn rehash(&mut self, count: u64) {
        let Ok(len) = usize::try_from(count) else {
            return;
        };
        let mut buckets: Vec<Option<Before>> = vec![None; len];
        let mut p = self.head.take();
        let mut head_bucket = 0usize;
        while let Some(node) = p {
            p = self.next[node];
            let b = self.bucket_of(node, count);
            match buckets[b] {
                None => {
                    self.next[node] = self.head;
                    self.head = Some(node);
                    buckets[b] = Some(Before::Head);
                    if self.next[node].is_some() {
                        buckets[head_bucket] = Some(Before::Node(node));
                    }
                    head_bucket = b;
                }
                Some(before) => {
                    self.next[node] = self.after(before);
                    self.set_after(before, Some(node));
                }
            }
        }
        self.buckets = buckets;
    }

    /// `_Hashtable::_M_insert_bucket_begin`.
    fn link(&mut self, node: usize) {
        let count = self.bucket_count();
        let b = self.bucket_of(node, count);
        match self.buckets[b] {
            Some(before) => {
                self.next[node] = self.after(before);
                self.set_after(before, Some(node));
            }
            None => {
                self.next[node] = self.head;
                self.head = Some(node);
                if let Some(n) = self.next[node] {
                    let nb = self.bucket_of(n, count);
                    self.buckets[nb] = Some(Before::Node(node));
                }
                self.buckets[b] = Some(Before::Head);
            }
        }
    }

    /// Inserts `key` (as `operator[]`, `insert` or `emplace` of a single element); returns
    /// whether it was new.
    pub(crate) fn insert(&mut self, key: &str) -> bool {
        self.insert_with_hint(key, 1)
    }

    /// `_M_insert_unique_node` with `n_ins` elements announced (the rehash check is made for
    /// that many).
    fn insert_with_hint(&mut self, key: &str, n_ins: u64) -> bool {
        if self.contains(key) {
            return false;
        }
        if let Some(count) = self.need_rehash(n_ins) {
            self.rehash(count);
        }
        let node = self.keys.len();
        self.keys.push(key.to_string());
        self.hashes.push(std_string_hash(key.as_bytes()));
        self.next.push(None);
        self.index.insert(key.to_string(), node);
        self.link(node);
        true
    }

    /// `insert(first, last)` of the keys `keys`, as the libstdc++ of GCC 7 to 10 (which built
    /// Caffe2's releases) did it: the first new key is inserted announcing the whole remaining
    /// range, each key already present shortens the announcement by one, and after a new key
    /// the announcement is one.
    pub(crate) fn insert_range<'k>(&mut self, keys: impl IntoIterator<Item = &'k str>) {
        let keys: Vec<&str> = keys.into_iter().collect();
        let mut hint = keys.len() as u64;
        for key in keys {
            if self.insert_with_hint(key, hint) {
                hint = 1;
            } else if hint != 1 {
                hint -= 1;
            }
        }
    }

    /// The keys in iteration order.
    pub(crate) fn iter(&self) -> StdKeyIter<'_> {
        StdKeyIter {
            order: self,
            at: self.head,
        }
    }
}

pub(crate) struct StdKeyIter<'a> {
    order: &'a StdKeyOrder,
    at: Option<usize>,
}

impl<'a> Iterator for StdKeyIter<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let node = self.at?;
        self.at = self.order.next[node];
        Some(self.order.keys[node].as_str())
    }
}

/// `std::push_heap` with `std::greater` (a min-heap): sifts the last element up.
pub(crate) fn push_heap_min<T: Ord>(v: &mut [T]) {
    let Some(mut hole) = v.len().checked_sub(1) else {
        return;
    };
    while hole > 0 {
        let parent = (hole - 1) / 2;
        // `comp(parent, value)` with `greater`: the parent is larger than the value.
        if v[parent] > v[hole] {
            v.swap(parent, hole);
            hole = parent;
        } else {
            break;
        }
    }
}

/// `std::pop_heap` with `std::greater`: moves the smallest element to the end, with
/// libstdc++'s `__adjust_heap` (sift the hole down to a leaf, then the value up).
pub(crate) fn pop_heap_min<T: Ord>(v: &mut [T]) {
    let n = v.len();
    if n < 2 {
        return;
    }
    let len = n - 1;
    // The smallest goes to the end; the value formerly last takes the hole at 0 and travels
    // with it while the hole moves down, always to the smaller child (`comp(right, left)`
    // picks the left one when the right one is larger).
    v.swap(0, len);
    let mut hole = 0usize;
    let mut second = 0usize;
    while second < len.saturating_sub(1) / 2 {
        second = 2 * (second + 1);
        if v[second] > v[second - 1] {
            second -= 1;
        }
        v.swap(hole, second);
        hole = second;
    }
    if len.is_multiple_of(2) && len >= 2 && second == (len - 2) / 2 {
        second = 2 * (second + 1);
        v.swap(hole, second - 1);
        hole = second - 1;
    }
    // The value travelled with the hole; sift it up (`__push_heap` from the hole to the top).
    while hole > 0 {
        let parent = (hole - 1) / 2;
        if v[parent] > v[hole] {
            v.swap(parent, hole);
            hole = parent;
        } else {
            break;
        }
    }
}
