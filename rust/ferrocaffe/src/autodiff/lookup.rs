//! Allocation-free lookups for the per-operator steps of the IR: a linear scan while the lists
//! are short (almost always), a hash map once they are long, so that an operator with
//! thousands of inputs or outputs still costs linear time.

use super::interned::IdGrad;
use crate::graph::intern::{BlobId, FxBuild, FxHashMap};

const SCAN_LIMIT: usize = 16;

/// Versions of the blobs one op reads or writes, looked up by id.
pub(crate) struct VersionIndex<'s> {
    pairs: &'s [(BlobId, u32)],
    map: Option<FxHashMap<BlobId, u32>>,
}

impl<'s> VersionIndex<'s> {
    pub(crate) fn new(pairs: &'s [(BlobId, u32)]) -> Self {
        let map = (pairs.len() > SCAN_LIMIT).then(|| {
            let mut m = FxHashMap::with_capacity_and_hasher(pairs.len(), FxBuild::default());
            for &(id, v) in pairs {
                m.insert(id, v);
            }
            m
        });
        VersionIndex { pairs, map }
    }

    /// The version of `id` (the last occurrence's, as a Python dict would keep).
    pub(crate) fn get(&self, id: BlobId) -> Option<u32> {
        match &self.map {
            Some(m) => m.get(&id).copied(),
            None => self.pairs.iter().rev().find(|p| p.0 == id).map(|p| p.1),
        }
    }
}

/// Caffe2's `GetIndexFromGradientList`: the first gradient of a list that is a given blob, or
/// whose indices or values are.
pub(crate) struct GradLookup<'g> {
    list: &'g [IdGrad],
    map: Option<FxHashMap<BlobId, usize>>,
}

impl<'g> GradLookup<'g> {
    pub(crate) fn new(list: &'g [IdGrad]) -> Self {
        let map = (list.len() > SCAN_LIMIT).then(|| {
            let mut m = FxHashMap::with_capacity_and_hasher(list.len(), FxBuild::default());
            for (k, g) in list.iter().enumerate() {
                match *g {
                    IdGrad::None => {}
                    IdGrad::Dense(n) => {
                        m.entry(n).or_insert(k);
                    }
                    IdGrad::Sparse(indices, values) => {
                        m.entry(indices).or_insert(k);
                        m.entry(values).or_insert(k);
                    }
                }
            }
            m
        });
        GradLookup { list, map }
    }

    pub(crate) fn get(&self, id: BlobId) -> Option<usize> {
        match &self.map {
            Some(m) => m.get(&id).copied(),
            None => self.list.iter().position(|g| g.names_blob(id)),
        }
    }
}

/// Lists keyed by a dense index (a blob version's slot), stored in one vector of linked nodes
/// (no allocation per key), with the keys in first-insertion order.
pub(crate) struct Lists<T> {
    heads: Vec<(u32, u32, u32)>,
    nodes: Vec<(T, u32)>,
    keys: Vec<u32>,
}

const END: u32 = u32::MAX;

impl<T> Lists<T> {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Lists {
            heads: Vec::with_capacity(n),
            nodes: Vec::with_capacity(n),
            keys: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, key: u32, value: T) {
        let at = self.nodes.len() as u32;
        self.nodes.push((value, END));
        let k = key as usize;
        if self.heads.len() <= k {
            self.heads.resize(k + 1, (END, END, 0));
        }
        let (first, last, len) = &mut self.heads[k];
        if *len == 0 {
            *first = at;
            self.keys.push(key);
        } else {
            self.nodes[*last as usize].1 = at;
        }
        *last = at;
        *len += 1;
    }

    pub(crate) fn iter(&self, key: u32) -> ListIter<'_, T> {
        ListIter {
            nodes: &self.nodes,
            at: self.heads.get(key as usize).map_or(END, |h| h.0),
        }
    }

    pub(crate) fn keys(&self) -> &[u32] {
        &self.keys
    }
}

pub(crate) struct ListIter<'l, T> {
    nodes: &'l [(T, u32)],
    at: u32,
}

impl<'l, T> Iterator for ListIter<'l, T> {
    type Item = &'l T;

    fn next(&mut self) -> Option<&'l T> {
        let (v, next) = self.nodes.get(self.at as usize)?;
        self.at = *next;
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_index_small_and_large_agree() {
        let pairs: Vec<(BlobId, u32)> = (0..40).map(|k| (BlobId(k % 30), k)).collect();
        let big = VersionIndex::new(&pairs);
        let small = VersionIndex::new(&pairs[..10]);
        assert_eq!(big.get(BlobId(3)), Some(33));
        assert_eq!(big.get(BlobId(35)), None);
        assert_eq!(small.get(BlobId(3)), Some(3));
    }

    #[test]
    fn grad_lookup_finds_the_first_match() {
        let (i, v) = (BlobId(100), BlobId(101));
        let mut list = vec![IdGrad::None, IdGrad::Sparse(i, v), IdGrad::Dense(v)];
        assert_eq!(GradLookup::new(&list).get(v), Some(1));
        assert_eq!(GradLookup::new(&list).get(BlobId(7)), None);
        list.extend((0..30).map(|k| IdGrad::Dense(BlobId(k))));
        let l = GradLookup::new(&list);
        assert_eq!(l.get(v), Some(1));
        assert_eq!(l.get(BlobId(7)), Some(10));
    }

    #[test]
    fn lists_keep_order() {
        let mut l = Lists::with_capacity(4);
        l.push(1, 'a');
        l.push(5, 'b');
        l.push(1, 'c');
        assert_eq!(l.iter(1).collect::<String>(), "ac");
        assert_eq!(l.iter(3).count(), 0);
        assert_eq!(l.iter(9).count(), 0);
        assert_eq!(l.keys(), &[1, 5]);
    }
}
