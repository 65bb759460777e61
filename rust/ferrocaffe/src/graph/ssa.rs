//! Static single assignment view of a net, with the exact semantics of Caffe2's
//! `core.get_ssa`, `get_undefined_blobs`, `get_output_producers` and `get_op_ids_in_path`.
//!
//! Versioning rules (`get_ssa(net, blob_versions)`):
//! * `blob_versions` starts as the given map (empty by default).
//! * Every `external_input` not yet in the map is added at version 0.
//! * If the net declares no external input at all, every op input not yet in the map is added
//!   at version 0 when its op is reached. (With declared external inputs, undeclared inputs are
//!   read at version 0 but never added to the map.)
//! * An op reads each input at its current version (0 if unknown), then bumps the version of
//!   each output by one, in order (so the first write of a blob is version 1); the versions it
//!   reports for its outputs are read after all the bumps, so an output listed twice shows
//!   the same, final version twice.
//!
//! Each distinct `(blob, version)` pair is also given a dense [`ValueId`], so the algorithms
//! here index vectors rather than hash tuples.

use super::intern::{BlobId, FxHashMap, Names};
use super::netio::NetIo;
use crate::error::{Error, Result};
use crate::proto::NetDef;

/// A blob version. Caffe2's are Python ints; starting versions may be any `i64`.
pub type Version = i64;

/// A dense id for one `(blob, version)` pair of an [`Ssa`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    /// The id as a vector index.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One input or output of an op: the blob, its version, and the id of that pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The blob.
    pub blob: BlobId,
    /// Its version at this point of the net.
    pub version: Version,
    /// The id of `(blob, version)`.
    pub value: ValueId,
}

const NONE: u32 = u32::MAX;

/// The SSA form of a net: per op, the versioned inputs and outputs, and the final version of
/// every blob (`blob_versions`, in Caffe2's insertion order).
///
/// ```
/// use ferrocaffe::graph::Ssa;
/// use ferrocaffe::proto::{NetDef, OperatorDef};
///
/// let mut net = NetDef::default();
/// net.op.push(OperatorDef::new("Relu", ["a"], ["b"]));
/// net.op.push(OperatorDef::new("Relu", ["b"], ["a"]));
/// let ssa = Ssa::of(&net);
/// assert_eq!(ssa.versioned_inputs(1).collect::<Vec<_>>(), [("b", 1)]);
/// assert_eq!(ssa.versioned_outputs(1).collect::<Vec<_>>(), [("a", 1)]);
/// assert_eq!(ssa.blob_versions().collect::<Vec<_>>(), [("a", 1), ("b", 1)]);
/// assert_eq!(ssa.undefined_blobs().iter().map(|&b| ssa.name(b)).collect::<Vec<_>>(), ["a"]);
/// ```
#[derive(Debug, Clone)]
pub struct Ssa {
    names: Names,
    in_off: Vec<u32>,
    inputs: Vec<Slot>,
    out_off: Vec<u32>,
    outputs: Vec<Slot>,
    /// `(blob, version)` of each value id.
    values: Vec<(BlobId, Version)>,
    /// Final version of each blob that is in `blob_versions`.
    version: Vec<Option<Version>>,
    /// The keys of `blob_versions` in insertion order.
    order: Vec<BlobId>,
}

impl Ssa {
    /// `core.get_ssa(net)`.
    pub fn of(net: &NetDef) -> Ssa {
        let mut io = NetIo::from_net(net);
        let names = io.take_names();
        Self::compute_with_names(&io, names, None)
    }

    /// `core.get_ssa(net, blob_versions)` with a starting map (later duplicates of a name
    /// override earlier ones, as dict assignment would). Fails only if a version would
    /// overflow `i64`.
    ///
    /// ```
    /// use ferrocaffe::graph::Ssa;
    /// use ferrocaffe::proto::{NetDef, OperatorDef};
    ///
    /// let mut net = NetDef::default();
    /// net.op.push(OperatorDef::new("Relu", ["x"], ["y"]));
    /// net.op.push(OperatorDef::new("Relu", ["y"], ["x"]));
    /// let ssa = Ssa::with_versions(&net, [("x", 5), ("q", 2)]).unwrap();
    /// assert_eq!(ssa.versioned_inputs(0).collect::<Vec<_>>(), [("x", 5)]);
    /// assert_eq!(ssa.blob_versions().collect::<Vec<_>>(), [("x", 6), ("q", 2), ("y", 1)]);
    /// ```
    pub fn with_versions<S: AsRef<str>>(
        net: &NetDef,
        start: impl IntoIterator<Item = (S, Version)>,
    ) -> Result<Ssa> {
        Self::from_io(&NetIo::from_net(net), start)
    }

    /// `core.get_ssa` of a serialized `caffe2.NetDef`, read without decoding it fully.
    pub fn from_bytes<S: AsRef<str>>(
        bytes: &[u8],
        start: impl IntoIterator<Item = (S, Version)>,
    ) -> Result<Ssa> {
        let start: Vec<(S, Version)> = start.into_iter().collect();
        let start_ref: Vec<(&str, Version)> = start.iter().map(|(s, v)| (s.as_ref(), *v)).collect();
        if let Some(ssa) = super::ssa_wire::ssa_from_bytes(bytes, &start_ref) {
            return Ok(ssa);
        }
        Self::from_net_io(NetIo::from_bytes(bytes)?, start_ref)
    }

    /// An SSA from its parts (see the fields).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
        names: Names,
        in_off: Vec<u32>,
        inputs: Vec<Slot>,
        out_off: Vec<u32>,
        outputs: Vec<Slot>,
        values: Vec<(BlobId, Version)>,
        version: Vec<Option<Version>>,
        order: Vec<BlobId>,
    ) -> Ssa {
        Ssa {
            names,
            in_off,
            inputs,
            out_off,
            outputs,
            values,
            version,
            order,
        }
    }

    /// [`Ssa::from_io`] consuming the [`NetIo`] (its name table moves into the result).
    pub fn from_net_io<S: AsRef<str>>(
        mut io: NetIo,
        start: impl IntoIterator<Item = (S, Version)>,
    ) -> Result<Ssa> {
        let start: Vec<(S, Version)> = start.into_iter().collect();
        Self::check_start(&io, start.iter().map(|(_, v)| *v))?;
        let start_ref: Vec<(&str, Version)> = start.iter().map(|(s, v)| (s.as_ref(), *v)).collect();
        let names = io.take_names();
        Ok(Self::compute_with_names(&io, names, Some(&start_ref)))
    }

    fn check_start(io: &NetIo, versions: impl Iterator<Item = Version>) -> Result<()> {
        let max_start = versions.max().unwrap_or(0);
        // Each output bumps one version by one.
        if max_start
            .checked_add(io.op_outputs_total() as i64)
            .is_none()
        {
            return Err(Error::InvalidArgument(format!(
                "get_ssa: starting version {max_start} would overflow a 64-bit version"
            )));
        }
        Ok(())
    }

    /// `core.get_ssa` of a net already read into a [`NetIo`]. Blob ids of `io` stay valid in
    /// the result.
    pub fn from_io<S: AsRef<str>>(
        io: &NetIo,
        start: impl IntoIterator<Item = (S, Version)>,
    ) -> Result<Ssa> {
        let start: Vec<(S, Version)> = start.into_iter().collect();
        Self::check_start(io, start.iter().map(|(_, v)| *v))?;
        let start_ref: Vec<(&str, Version)> = start.iter().map(|(s, v)| (s.as_ref(), *v)).collect();
        Ok(Self::compute_unchecked(io, Some(&start_ref)))
    }

    /// The computation behind `get_ssa`; the caller guarantees no version overflows.
    pub(crate) fn compute_unchecked(io: &NetIo, start: Option<&[(&str, Version)]>) -> Ssa {
        Self::compute_with_names(io, io.names().clone(), start)
    }

    /// [`Ssa::compute_unchecked`] with `io`'s name table given (moved out of a temporary `io`).
    fn compute_with_names(io: &NetIo, mut names: Names, start: Option<&[(&str, Version)]>) -> Ssa {
        let mut order = Vec::new();
        let mut pending: Vec<(BlobId, Version)> = Vec::new();
        if let Some(start) = start {
            for &(name, v) in start {
                pending.push((names.intern(name), v));
            }
        }
        let n = names.len();
        let mut version: Vec<Option<Version>> = vec![None; n];
        let mut current: Vec<u32> = vec![NONE; n];
        for (id, v) in pending {
            if version[id.index()].is_none() {
                order.push(id);
            }
            version[id.index()] = Some(v);
        }
        for &b in io.external_inputs() {
            if version[b.index()].is_none() {
                version[b.index()] = Some(0);
                order.push(b);
            }
        }
        let declared = !io.external_inputs().is_empty();
        let num_ops = io.num_ops();
        let mut in_off = Vec::with_capacity(num_ops + 1);
        let mut out_off = Vec::with_capacity(num_ops + 1);
        in_off.push(0u32);
        out_off.push(0u32);
        let mut inputs = Vec::with_capacity(io.op_inputs_total());
        let mut outputs = Vec::with_capacity(io.op_outputs_total());
        let mut values: Vec<(BlobId, Version)> = Vec::with_capacity(n + io.op_outputs_total());
        for op in 0..num_ops {
            for &b in io.op_inputs(op) {
                let i = b.index();
                if !declared && version[i].is_none() {
                    version[i] = Some(0);
                    order.push(b);
                }
                let v = version[i].unwrap_or(0);
                if current[i] == NONE {
                    current[i] = values.len() as u32;
                    values.push((b, v));
                }
                inputs.push(Slot {
                    blob: b,
                    version: v,
                    value: ValueId(current[i]),
                });
            }
            for &b in io.op_outputs(op) {
                let i = b.index();
                let v = match version[i] {
                    Some(v) => v + 1,
                    None => {
                        order.push(b);
                        1
                    }
                };
                version[i] = Some(v);
                current[i] = values.len() as u32;
                values.push((b, v));
            }
            for &b in io.op_outputs(op) {
                let i = b.index();
                outputs.push(Slot {
                    blob: b,
                    version: version[i].unwrap_or(0),
                    value: ValueId(current[i]),
                });
            }
            in_off.push(inputs.len() as u32);
            out_off.push(outputs.len() as u32);
        }
        Self::from_parts(
            names, in_off, inputs, out_off, outputs, values, version, order,
        )
    }

    /// Builds an SSA from explicit versioned inputs and outputs, as a Caffe2 `ssa` list may be
    /// given to `get_undefined_blobs` and friends. Its `blob_versions` are empty.
    pub fn builder() -> SsaBuilder {
        SsaBuilder::default()
    }

    /// [`Ssa::builder`] with room for about `num_ops` ops.
    pub fn builder_with_capacity(num_ops: usize) -> SsaBuilder {
        let mut ids = FxHashMap::default();
        ids.reserve(num_ops * 2);
        SsaBuilder {
            names: Names::with_capacity(num_ops * 2, num_ops * 16),
            in_off: Vec::with_capacity(num_ops + 1),
            inputs: Vec::with_capacity(num_ops * 3),
            out_off: Vec::with_capacity(num_ops + 1),
            outputs: Vec::with_capacity(num_ops * 2),
            values: Vec::with_capacity(num_ops * 2),
            ids,
        }
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.in_off.len() - 1
    }

    /// Whether the net has no op.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The name table (a superset of the net's names: starting versions may add names).
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// The name of a blob.
    pub fn name(&self, id: BlobId) -> &str {
        self.names.name(id)
    }

    /// The versioned inputs of op `op`.
    pub fn inputs(&self, op: usize) -> &[Slot] {
        &self.inputs[self.in_off[op] as usize..self.in_off[op + 1] as usize]
    }

    /// The versioned outputs of op `op`.
    pub fn outputs(&self, op: usize) -> &[Slot] {
        &self.outputs[self.out_off[op] as usize..self.out_off[op + 1] as usize]
    }

    /// The inputs of op `op` as `(name, version)` pairs.
    pub fn versioned_inputs(&self, op: usize) -> impl Iterator<Item = (&str, Version)> + '_ {
        self.inputs(op)
            .iter()
            .map(|s| (self.name(s.blob), s.version))
    }

    /// The outputs of op `op` as `(name, version)` pairs.
    pub fn versioned_outputs(&self, op: usize) -> impl Iterator<Item = (&str, Version)> + '_ {
        self.outputs(op)
            .iter()
            .map(|s| (self.name(s.blob), s.version))
    }

    /// Number of distinct `(blob, version)` pairs.
    pub fn num_values(&self) -> usize {
        self.values.len()
    }

    /// The `(blob, version)` pair of a value.
    pub fn value(&self, v: ValueId) -> (BlobId, Version) {
        self.values[v.index()]
    }

    /// The value id of `(name, version)`, if some op reads or writes it.
    pub fn find_value(&self, name: &str, version: Version) -> Option<ValueId> {
        let b = self.names.get(name)?;
        self.values
            .iter()
            .position(|&(vb, vv)| vb == b && vv == version)
            .map(|i| ValueId(i as u32))
    }

    /// `blob_versions`: the final version of each blob, in Caffe2's insertion order.
    pub fn blob_versions(&self) -> impl Iterator<Item = (&str, Version)> + '_ {
        self.order
            .iter()
            .map(|&b| (self.name(b), self.version[b.index()].unwrap_or(0)))
    }

    /// The keys of `blob_versions` as ids, in insertion order, with their final versions.
    pub fn blob_version_ids(&self) -> impl Iterator<Item = (BlobId, Version)> + '_ {
        self.order
            .iter()
            .map(|&b| (b, self.version[b.index()].unwrap_or(0)))
    }

    /// Number of entries of `blob_versions`.
    pub fn num_blob_versions(&self) -> usize {
        self.order.len()
    }

    /// `blob_versions[name]`, if present.
    pub fn version(&self, name: &str) -> Option<Version> {
        self.names.get(name).and_then(|b| self.version_of(b))
    }

    /// `blob_versions[blob]`, if present.
    pub fn version_of(&self, blob: BlobId) -> Option<Version> {
        self.version.get(blob.index()).copied().flatten()
    }

    /// `core.get_undefined_blobs(ssa)`: blobs read at version 0, in order of first read.
    pub fn undefined_blobs(&self) -> Vec<BlobId> {
        let mut seen = vec![false; self.names.len()];
        let mut out = Vec::new();
        for s in &self.inputs {
            if s.version == 0 && !seen[s.blob.index()] {
                seen[s.blob.index()] = true;
                out.push(s.blob);
            }
        }
        out
    }

    /// The op that produces each value (the last one, if several claim it), indexed by value.
    pub fn producers(&self) -> Vec<Option<usize>> {
        let mut prod = vec![None; self.values.len()];
        for op in 0..self.len() {
            for s in self.outputs(op) {
                prod[s.value.index()] = Some(op);
            }
        }
        prod
    }

    /// `core.get_output_producers(ssa)`: `(value, op)` in the order the Python dict holds them
    /// (first appearance of each output; the op is the last one that outputs it).
    pub fn output_producers(&self) -> Vec<(ValueId, usize)> {
        let mut pos = vec![NONE; self.values.len()];
        let mut out: Vec<(ValueId, usize)> = Vec::new();
        for op in 0..self.len() {
            for s in self.outputs(op) {
                let p = &mut pos[s.value.index()];
                if *p == NONE {
                    *p = out.len() as u32;
                    out.push((s.value, op));
                } else {
                    out[*p as usize].1 = op;
                }
            }
        }
        out
    }

    /// `core.get_op_ids_in_path(ssa, blob_versions, inputs, outputs)` with the versions already
    /// looked up: the sorted ids of the ops needed to compute `outputs` from `inputs`.
    ///
    /// Walks back from `outputs` through producers, stopping at `inputs` and at values no op
    /// produces. Pairs that do not occur in the net are ignored.
    pub fn op_ids_in_path(
        &self,
        inputs: &[(&str, Version)],
        outputs: &[(&str, Version)],
    ) -> Vec<usize> {
        let find = self.value_finder(inputs.iter().chain(outputs));
        let mut stop = vec![false; self.values.len()];
        for &(name, v) in inputs {
            if let Some(id) = find(name, v) {
                stop[id.index()] = true;
            }
        }
        let targets: Vec<ValueId> = outputs.iter().filter_map(|&(n, v)| find(n, v)).collect();
        self.ops_in_path_values(&stop, targets)
    }

    /// [`Ssa::op_ids_in_path`] with the latest versions of the named blobs, as Caffe2 reads them
    /// from `blob_versions`; a name missing there is an error (Caffe2's `KeyError`).
    ///
    /// ```
    /// use ferrocaffe::graph::Ssa;
    /// use ferrocaffe::proto::{NetDef, OperatorDef};
    ///
    /// let mut net = NetDef::default();
    /// net.external_input.push("x".into());
    /// for (i, o) in [("x", "y"), ("y", "y"), ("y", "z")] {
    ///     net.op.push(OperatorDef::new("Relu", [i], [o]));
    /// }
    /// let ssa = Ssa::of(&net);
    /// assert_eq!(ssa.op_ids_between(&["x"], &["z"]).unwrap(), [0, 1, 2]);
    /// assert_eq!(ssa.op_ids_between(&["y"], &["z"]).unwrap(), [2]);
    /// assert!(ssa.op_ids_between(&[], &["nope"]).is_err());
    /// ```
    pub fn op_ids_between(&self, inputs: &[&str], outputs: &[&str]) -> Result<Vec<usize>> {
        let latest = |names: &[&str]| -> Result<Vec<(String, Version)>> {
            names
                .iter()
                .map(|&n| {
                    self.version(n).map(|v| (n.to_string(), v)).ok_or_else(|| {
                        Error::NotFound(format!("blob '{n}' is not in blob_versions"))
                    })
                })
                .collect()
        };
        let ins = latest(inputs)?;
        let outs = latest(outputs)?;
        let ins: Vec<(&str, Version)> = ins.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        let outs: Vec<(&str, Version)> = outs.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        Ok(self.op_ids_in_path(&ins, &outs))
    }

    /// Backward walk from `targets`, not crossing values marked in `stop`.
    pub(crate) fn ops_in_path_values(&self, stop: &[bool], mut queue: Vec<ValueId>) -> Vec<usize> {
        let producers = self.producers();
        let mut used = vec![false; self.len()];
        while let Some(v) = queue.pop() {
            if stop[v.index()] {
                continue;
            }
            if let Some(op) = producers[v.index()] {
                if !used[op] {
                    used[op] = true;
                    queue.extend(self.inputs(op).iter().map(|s| s.value));
                }
            }
        }
        used.iter()
            .enumerate()
            .filter_map(|(i, &u)| u.then_some(i))
            .collect()
    }

    /// A lookup from `(name, version)` to value id for the given pairs (one pass over values).
    fn value_finder<'q>(
        &self,
        queries: impl Iterator<Item = &'q (&'q str, Version)>,
    ) -> impl Fn(&str, Version) -> Option<ValueId> + '_ {
        let mut wanted: FxHashMap<(BlobId, Version), Option<ValueId>> = FxHashMap::default();
        for &(name, v) in queries {
            if let Some(b) = self.names.get(name) {
                wanted.insert((b, v), None);
            }
        }
        if !wanted.is_empty() {
            for (i, key) in self.values.iter().enumerate() {
                if let Some(slot) = wanted.get_mut(key) {
                    if slot.is_none() {
                        *slot = Some(ValueId(i as u32));
                    }
                }
            }
        }
        move |name: &str, v: Version| {
            let b = self.names.get(name)?;
            wanted.get(&(b, v)).copied().flatten()
        }
    }
}

impl NetIo {
    pub(crate) fn op_inputs_total(&self) -> usize {
        (0..self.num_ops()).map(|i| self.op_inputs(i).len()).sum()
    }
    pub(crate) fn op_outputs_total(&self) -> usize {
        (0..self.num_ops()).map(|i| self.op_outputs(i).len()).sum()
    }
}

/// Builds an [`Ssa`] from explicit `(name, version)` pairs, op by op.
///
/// ```
/// use ferrocaffe::graph::Ssa;
///
/// let mut b = Ssa::builder();
/// b.output("y", 1);
/// b.end_op();
/// b.input("y", 1);
/// b.input("w", 0);
/// b.output("z", 1);
/// b.end_op();
/// let ssa = b.build();
/// assert_eq!(ssa.len(), 2);
/// assert_eq!(ssa.undefined_blobs().iter().map(|&b| ssa.name(b)).collect::<Vec<_>>(), ["w"]);
/// assert_eq!(ssa.op_ids_in_path(&[], &[("z", 1)]), [0, 1]);
/// ```
#[derive(Debug, Default)]
pub struct SsaBuilder {
    names: Names,
    in_off: Vec<u32>,
    inputs: Vec<Slot>,
    out_off: Vec<u32>,
    outputs: Vec<Slot>,
    values: Vec<(BlobId, Version)>,
    ids: FxHashMap<(BlobId, Version), ValueId>,
}

impl SsaBuilder {
    /// The id of blob `name` (interned on first use).
    pub fn blob(&mut self, name: &str) -> BlobId {
        self.names.intern(name)
    }

    /// The value id of `(blob, version)` (created on first use).
    pub fn value(&mut self, blob: BlobId, version: Version) -> ValueId {
        let next = ValueId(self.values.len() as u32);
        let value = *self.ids.entry((blob, version)).or_insert(next);
        if value == next {
            self.values.push((blob, version));
        }
        value
    }

    fn slot_of(&self, value: ValueId) -> Slot {
        let (blob, version) = self.values[value.index()];
        Slot {
            blob,
            version,
            value,
        }
    }

    /// Adds an input to the current op.
    pub fn input(&mut self, name: &str, version: Version) {
        let blob = self.blob(name);
        let v = self.value(blob, version);
        self.input_value(v);
    }

    /// Adds an output to the current op.
    pub fn output(&mut self, name: &str, version: Version) {
        let blob = self.blob(name);
        let v = self.value(blob, version);
        self.output_value(v);
    }

    /// Adds an input given by the id [`SsaBuilder::value`] returned.
    pub fn input_value(&mut self, value: ValueId) {
        let s = self.slot_of(value);
        self.inputs.push(s);
    }

    /// Adds an output given by the id [`SsaBuilder::value`] returned.
    pub fn output_value(&mut self, value: ValueId) {
        let s = self.slot_of(value);
        self.outputs.push(s);
    }

    /// Ends the current op.
    pub fn end_op(&mut self) {
        if self.in_off.is_empty() {
            self.in_off.push(0);
            self.out_off.push(0);
        }
        self.in_off.push(self.inputs.len() as u32);
        self.out_off.push(self.outputs.len() as u32);
    }

    /// The SSA. Inputs or outputs added after the last `end_op` are dropped.
    pub fn build(mut self) -> Ssa {
        if self.in_off.is_empty() {
            self.in_off.push(0);
            self.out_off.push(0);
        }
        let ni = *self.in_off.last().unwrap_or(&0) as usize;
        let no = *self.out_off.last().unwrap_or(&0) as usize;
        self.inputs.truncate(ni);
        self.outputs.truncate(no);
        let n = self.names.len();
        Ssa {
            names: self.names,
            in_off: self.in_off,
            inputs: self.inputs,
            out_off: self.out_off,
            outputs: self.outputs,
            values: self.values,
            version: vec![None; n],
            order: Vec::new(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::proto::OperatorDef;

    fn net(ops: &[(&[&str], &[&str])], ext: &[&str]) -> NetDef {
        let mut net = NetDef::default();
        for (i, o) in ops {
            net.op
                .push(OperatorDef::new("Op", i.iter().copied(), o.iter().copied()));
        }
        net.external_input = ext.iter().map(|s| s.to_string()).collect();
        net
    }

    type Named<'a> = Vec<(&'a str, Version)>;

    fn ops(ssa: &Ssa) -> Vec<(Named<'_>, Named<'_>)> {
        (0..ssa.len())
            .map(|i| {
                (
                    ssa.versioned_inputs(i).collect(),
                    ssa.versioned_outputs(i).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn without_external_inputs_every_input_enters_at_zero() {
        let ssa = Ssa::of(&net(&[(&["a"], &["b"]), (&["b"], &["a"])], &[]));
        assert_eq!(
            ops(&ssa),
            [
                (vec![("a", 0)], vec![("b", 1)]),
                (vec![("b", 1)], vec![("a", 1)])
            ]
        );
        assert_eq!(
            ssa.blob_versions().collect::<Vec<_>>(),
            [("a", 1), ("b", 1)]
        );
    }

    #[test]
    fn declared_external_inputs_hide_undeclared_ones() {
        let ssa = Ssa::of(&net(&[(&["a", "undeclared"], &["s"])], &["a"]));
        assert_eq!(
            ops(&ssa),
            [(vec![("a", 0), ("undeclared", 0)], vec![("s", 1)])]
        );
        assert_eq!(
            ssa.blob_versions().collect::<Vec<_>>(),
            [("a", 0), ("s", 1)]
        );
        assert_eq!(ssa.version("undeclared"), None);
        let und: Vec<&str> = ssa.undefined_blobs().iter().map(|&b| ssa.name(b)).collect();
        assert_eq!(und, ["a", "undeclared"]);
    }

    #[test]
    fn in_place_and_repeated_outputs() {
        let ssa = Ssa::of(&net(
            &[(&["x"], &["y"]), (&["y"], &["y"]), (&["y"], &["a", "a"])],
            &[],
        ));
        assert_eq!(
            ops(&ssa),
            [
                (vec![("x", 0)], vec![("y", 1)]),
                (vec![("y", 1)], vec![("y", 2)]),
                (vec![("y", 2)], vec![("a", 2), ("a", 2)]),
            ]
        );
        // Both slots share the final value; the skipped version 1 of `a` has no producer.
        let outs = ssa.outputs(2);
        assert_eq!(outs[0].value, outs[1].value);
        let prod = ssa.output_producers();
        let named: Vec<((&str, Version), usize)> = prod
            .iter()
            .map(|&(v, op)| {
                let (b, ver) = ssa.value(v);
                ((ssa.name(b), ver), op)
            })
            .collect();
        assert_eq!(named, [(("y", 1), 0), (("y", 2), 1), (("a", 2), 2)]);
    }

    #[test]
    fn starting_versions_keep_their_order_and_are_updated() {
        let n = net(&[(&["x"], &["y"]), (&["y"], &["x"])], &[]);
        let ssa = Ssa::with_versions(&n, [("x", 5), ("q", 2), ("x", 7)]).unwrap();
        assert_eq!(
            ops(&ssa),
            [
                (vec![("x", 7)], vec![("y", 1)]),
                (vec![("y", 1)], vec![("x", 8)])
            ]
        );
        assert_eq!(
            ssa.blob_versions().collect::<Vec<_>>(),
            [("x", 8), ("q", 2), ("y", 1)]
        );
        assert!(Ssa::with_versions(&n, [("x", i64::MAX)]).is_err());
        let neg = Ssa::with_versions(&n, [("x", -1)]).unwrap();
        assert_eq!(ops(&neg)[1].1, [("x", 0)]);
    }

    #[test]
    fn external_inputs_with_starting_versions() {
        let n = net(&[(&["w", "x"], &["w"])], &["w", "x"]);
        let ssa = Ssa::with_versions(&n, [("w", 3)]).unwrap();
        assert_eq!(ops(&ssa), [(vec![("w", 3), ("x", 0)], vec![("w", 4)])]);
        assert_eq!(
            ssa.blob_versions().collect::<Vec<_>>(),
            [("w", 4), ("x", 0)]
        );
    }

    #[test]
    fn empty_net() {
        let ssa = Ssa::of(&NetDef::default());
        assert!(ssa.is_empty());
        assert_eq!(ssa.blob_versions().count(), 0);
        assert!(ssa.undefined_blobs().is_empty());
        assert!(ssa.output_producers().is_empty());
    }

    #[test]
    fn op_ids_in_path_follows_caffe2() {
        let n = net(
            &[
                (&["x"], &["y"]),
                (&["y"], &["y"]),
                (&["y"], &["y"]),
                (&["y"], &["z"]),
                (&["q"], &["r"]),
            ],
            &["x"],
        );
        let ssa = Ssa::of(&n);
        assert_eq!(ssa.op_ids_between(&["x"], &["z"]).unwrap(), [0, 1, 2, 3]);
        assert_eq!(ssa.op_ids_between(&["y"], &["z"]).unwrap(), [3]);
        assert_eq!(
            ssa.op_ids_between(&["z"], &["z"]).unwrap(),
            Vec::<usize>::new()
        );
        assert_eq!(
            ssa.op_ids_between(&[], &["z", "r"]).unwrap(),
            [0, 1, 2, 3, 4]
        );
        let err = ssa.op_ids_between(&[], &["nope"]).unwrap_err();
        assert!(err.to_string().contains("nope"));
        // Explicit versions: an intermediate version of y as the target.
        assert_eq!(ssa.op_ids_in_path(&[("x", 0)], &[("y", 2)]), [0, 1]);
        // Unknown pairs are ignored.
        assert_eq!(
            ssa.op_ids_in_path(&[("nope", 3)], &[("y", 9)]),
            Vec::<usize>::new()
        );
    }

    #[test]
    fn builder_matches_computed() {
        let n = net(
            &[
                (&["a", "b"], &["c"]),
                (&["c"], &["c"]),
                (&["c", "a"], &["d"]),
            ],
            &[],
        );
        let ssa = Ssa::of(&n);
        let mut b = Ssa::builder();
        for op in 0..ssa.len() {
            for (name, v) in ssa.versioned_inputs(op) {
                b.input(name, v);
            }
            for (name, v) in ssa.versioned_outputs(op) {
                b.output(name, v);
            }
            b.end_op();
        }
        let built = b.build();
        assert_eq!(ops(&built), ops(&ssa));
        assert_eq!(built.num_values(), ssa.num_values());
        assert_eq!(built.undefined_blobs().len(), 2);
        assert_eq!(
            built.op_ids_in_path(&[], &[("d", 1)]),
            ssa.op_ids_in_path(&[], &[("d", 1)])
        );
        assert_eq!(built.blob_versions().count(), 0);
        assert!(Ssa::builder().build().is_empty());
        let mut dangling = Ssa::builder();
        dangling.input("a", 0);
        dangling.end_op();
        dangling.input("dangling", 0);
        let d = dangling.build();
        assert_eq!(d.len(), 1);
        assert_eq!(d.undefined_blobs().len(), 1);
    }

    #[test]
    fn from_bytes_agrees_with_message() {
        let n = net(&[(&["a"], &["b"]), (&["b", "k"], &["a"])], &["a"]);
        let bytes = crate::proto::encode(&n);
        let a = Ssa::from_bytes(&bytes, [("k", 4)]).unwrap();
        let b = Ssa::with_versions(&n, [("k", 4)]).unwrap();
        assert_eq!(ops(&a), ops(&b));
        assert_eq!(
            a.blob_versions().collect::<Vec<_>>(),
            b.blob_versions().collect::<Vec<_>>()
        );
        assert_eq!(a.find_value("b", 1), b.find_value("b", 1));
        assert!(a.find_value("b", 2).is_none());
        assert!(Ssa::from_bytes(&[0x12, 0x05], None::<(&str, Version)>).is_err());
    }

    #[test]
    fn large_chain_is_linear() {
        let mut n = NetDef::default();
        for i in 0..20_000 {
            n.op.push(OperatorDef::new(
                "Relu",
                [format!("b{i}")],
                [format!("b{}", i + 1)],
            ));
        }
        let ssa = Ssa::of(&n);
        assert_eq!(
            ssa.op_ids_between(&["b0"], &["b20000"]).unwrap().len(),
            20_000
        );
        assert_eq!(ssa.undefined_blobs().len(), 1);
    }
}
