//! Allocation-free lookups for the per-operator steps of the IR: a linear scan while the lists
//! are short (almost always), a hash map once they are long, so that an operator with
//! thousands of inputs or outputs still costs linear time.

use super::maker::GradRef;
use crate::graph::intern::{BlobId, FxBuild, FxHashMap};
use crate::proto::OperatorDef;

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
    list: &'g [GradRef],
    map: Option<FxHashMap<&'g str, usize>>,
}

impl<'g> GradLookup<'g> {
    pub(crate) fn new(list: &'g [GradRef]) -> Self {
        let map = (list.len() > SCAN_LIMIT).then(|| {
            let mut m = FxHashMap::with_capacity_and_hasher(list.len(), FxBuild::default());
            for (k, g) in list.iter().enumerate() {
                match g {
                    GradRef::None => {}
                    GradRef::Dense(n) => {
                        m.entry(n.as_str()).or_insert(k);
                    }
                    GradRef::Sparse { indices, values } => {
                        m.entry(indices.as_str()).or_insert(k);
                        m.entry(values.as_str()).or_insert(k);
                    }
                }
            }
            m
        });
        GradLookup { list, map }
    }

    pub(crate) fn get(&self, name: &str) -> Option<usize> {
        match &self.map {
            Some(m) => m.get(name).copied(),
            None => self.list.iter().position(|g| g.names_blob(name)),
        }
    }
}

/// The blobs written by a list of gradient ops (Caffe2's `locally_generated_blobs`), with the
/// index of the first op writing each.
pub(crate) struct LocalOutputs<'g> {
    ops: &'g [OperatorDef],
    map: Option<FxHashMap<&'g str, usize>>,
}

impl<'g> LocalOutputs<'g> {
    pub(crate) fn new(ops: &'g [OperatorDef]) -> Self {
        let total: usize = ops.iter().map(|o| o.output.len()).sum();
        let map = (total > 2 * SCAN_LIMIT).then(|| {
            let mut m = FxHashMap::with_capacity_and_hasher(total, FxBuild::default());
            for (j, op) in ops.iter().enumerate() {
                for o in &op.output {
                    m.entry(o.as_str()).or_insert(j);
                }
            }
            m
        });
        LocalOutputs { ops, map }
    }

    /// Whether one of the first `j` ops writes `name`.
    pub(crate) fn written_before(&self, name: &str, j: usize) -> bool {
        match &self.map {
            Some(m) => m.get(name).is_some_and(|&w| w < j),
            None => self.ops[..j.min(self.ops.len())]
                .iter()
                .any(|op| op.output.iter().any(|o| o == name)),
        }
    }

    /// Whether any of the ops writes `name`.
    pub(crate) fn written(&self, name: &str) -> bool {
        self.written_before(name, self.ops.len())
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
        let mut list = vec![
            GradRef::None,
            GradRef::Sparse {
                indices: "i".into(),
                values: "v".into(),
            },
            GradRef::Dense("v".into()),
        ];
        assert_eq!(GradLookup::new(&list).get("v"), Some(1));
        assert_eq!(GradLookup::new(&list).get("x"), None);
        list.extend((0..30).map(|k| GradRef::Dense(format!("g{k}"))));
        let l = GradLookup::new(&list);
        assert_eq!(l.get("v"), Some(1));
        assert_eq!(l.get("g7"), Some(10));
    }

    #[test]
    fn local_outputs_by_position() {
        let ops = vec![
            OperatorDef::new("A", ["x"], ["a"]),
            OperatorDef::new("B", ["a"], ["b"]),
        ];
        let l = LocalOutputs::new(&ops);
        assert!(!l.written_before("a", 0));
        assert!(l.written_before("a", 1));
        assert!(!l.written_before("b", 1));
        assert!(l.written("b"));
        let many: Vec<OperatorDef> = (0..40)
            .map(|k| OperatorDef::new("A", ["x"], [format!("o{k}")]))
            .collect();
        let l = LocalOutputs::new(&many);
        assert!(l.written_before("o3", 4));
        assert!(!l.written_before("o3", 3));
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
