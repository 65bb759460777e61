//! The backward-pass IR: Caffe2's `core.IR`, with the same semantics, in linear time.
//!
//! Playing the forward ops gives every blob a version per write (the first write of a blob is
//! version 0; a blob read before it is written is version 0 and its first write version 1), the
//! *frontier* (latest version of each blob) and the *input usages* (which ops read each blob
//! version). The backward pass then walks the ops in reverse, asks each op's gradient maker for
//! gradient ops, checks that those ops only read blob versions that still exist, records which
//! gradient op output produces the gradient of which input version (the *generators*), and sums
//! the gradients of blob versions read by several ops once the first reader is reached.
//!
//! Blob names are interned to dense ids; per-blob and per-version state lives in vectors, so a
//! pass is linear in the size of the graph. Gradients are ids too ([`IdGrad`]), and so are the
//! gradient ops of the makers that can make them over ids (see [`super::interned`]: the table
//! makers of most op types); the ops of other makers are interned as they come. Every check
//! and update of the pass compares ids; names are read back only to write the gradient ops
//! and the gradient map out, once. The forward ops may be decoded `OperatorDef`s or serialized
//! ones read in place (see `forward`: names borrowed from the bytes; an op with more than
//! names decoded while its gradient is made), and the gradient ops are serialized as soon as
//! nothing can change them any more (see `grad_ops`), which keeps large passes small in memory.

use std::borrow::Cow;
use std::sync::OnceLock;

use super::accumulate::{self, Generator};
use super::dispatch::{self, Resolved};
use super::forward::{ForwardOps, WireOps};
use super::grad_ops::GradOps;
use super::interned::{verify_counts, IdGrad, IdOps, InternedCtx, LocalIds};
use super::lookup::{GradLookup, Lists, VersionIndex};
use super::maker::{GradRef, GradientContext};
use super::registry::Registry;
use super::scope::float_arg;
use super::text;
use crate::error::{Error, Result};
use crate::graph::intern::{BlobId, FxBuild, FxHashMap, FxHashSet};
use crate::graph::Names;
use crate::proto::{DeviceOption, OperatorDef};

/// Suffix of the gradient seeds generated for `ys` without a given gradient.
pub const AUTOGEN_GRAD_SUFFIX: &str = "_autogen_grad";

/// The gradient of every blob that has one, in the order Caffe2's dict had them.
///
/// Held compactly (every name in one string); the entries as `String`s are made only when
/// asked for ([`GradMap::entries`], [`GradMap::get`]). [`GradMap::iter`] reads the names in
/// place.
#[derive(Clone, Default)]
pub struct GradMap {
    text: String,
    items: Vec<(Span, SpanGrad)>,
    entries: OnceLock<Vec<(String, GradRef)>>,
    index: OnceLock<FxHashMap<String, usize>>,
}

/// A name in [`GradMap::text`].
#[derive(Debug, Clone, Copy)]
struct Span(u32, u32);

#[derive(Debug, Clone, Copy)]
enum SpanGrad {
    None,
    Dense(Span),
    Sparse(Span, Span),
}

/// A gradient of a [`GradMap`], its names borrowed from the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradName<'m> {
    /// No gradient.
    None,
    /// A dense gradient blob.
    Dense(&'m str),
    /// A sparse gradient: indices and values.
    Sparse(&'m str, &'m str),
}

impl GradName<'_> {
    /// The gradient as a [`GradRef`].
    pub fn to_ref(self) -> GradRef {
        match self {
            GradName::None => GradRef::None,
            GradName::Dense(d) => GradRef::Dense(d.to_string()),
            GradName::Sparse(i, v) => GradRef::Sparse {
                indices: i.to_string(),
                values: v.to_string(),
            },
        }
    }
}

impl PartialEq for GradMap {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl std::fmt::Debug for GradMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Builds a [`GradMap`] entry by entry.
struct GradMapBuilder {
    text: String,
    items: Vec<(Span, SpanGrad)>,
}

impl GradMapBuilder {
    fn with_capacity(n: usize, bytes: usize) -> Self {
        GradMapBuilder {
            text: String::with_capacity(bytes),
            items: Vec::with_capacity(n),
        }
    }

    fn span(&mut self, s: &str) -> Span {
        let start = self.text.len() as u32;
        self.text.push_str(s);
        Span(start, self.text.len() as u32)
    }

    fn push(&mut self, blob: &str, g: GradName<'_>) {
        let key = self.span(blob);
        let g = match g {
            GradName::None => SpanGrad::None,
            GradName::Dense(d) => SpanGrad::Dense(self.span(d)),
            GradName::Sparse(i, v) => SpanGrad::Sparse(self.span(i), self.span(v)),
        };
        self.items.push((key, g));
    }

    fn build(self) -> GradMap {
        GradMap {
            text: self.text,
            items: self.items,
            entries: OnceLock::new(),
            index: OnceLock::new(),
        }
    }
}

impl GradMap {
    /// A map with the given entries (blob, gradient), in order.
    pub fn from_entries(entries: Vec<(String, GradRef)>) -> Self {
        let bytes = entries
            .iter()
            .map(|(b, g)| {
                b.len()
                    + match g {
                        GradRef::None => 0,
                        GradRef::Dense(d) => d.len(),
                        GradRef::Sparse { indices, values } => indices.len() + values.len(),
                    }
            })
            .sum();
        let mut m = GradMapBuilder::with_capacity(entries.len(), bytes);
        for (b, g) in &entries {
            let g = match g {
                GradRef::None => GradName::None,
                GradRef::Dense(d) => GradName::Dense(d),
                GradRef::Sparse { indices, values } => GradName::Sparse(indices, values),
            };
            m.push(b, g);
        }
        let map = m.build();
        let _ = map.entries.set(entries);
        map
    }

    fn at(&self, s: Span) -> &str {
        &self.text[s.0 as usize..s.1 as usize]
    }

    /// The entries (blob, gradient) in order, their names borrowed from the map.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, GradName<'_>)> + '_ {
        self.items.iter().map(|&(key, g)| {
            let g = match g {
                SpanGrad::None => GradName::None,
                SpanGrad::Dense(d) => GradName::Dense(self.at(d)),
                SpanGrad::Sparse(i, v) => GradName::Sparse(self.at(i), self.at(v)),
            };
            (self.at(key), g)
        })
    }

    /// The gradient of `blob`, if it has one.
    pub fn get(&self, blob: &str) -> Option<&GradRef> {
        let index = self.index.get_or_init(|| {
            let mut m = FxHashMap::with_capacity_and_hasher(self.items.len(), FxBuild::default());
            for (k, (name, _)) in self.iter().enumerate() {
                m.insert(name.to_string(), k);
            }
            m
        });
        index.get(blob).map(|&k| &self.entries()[k].1)
    }

    /// The entries, in order.
    pub fn entries(&self) -> &[(String, GradRef)] {
        self.entries.get_or_init(|| {
            self.iter()
                .map(|(b, g)| (b.to_string(), g.to_ref()))
                .collect()
        })
    }

    /// The entries, in order, by value.
    pub fn into_entries(mut self) -> Vec<(String, GradRef)> {
        match self.entries.take() {
            Some(e) => e,
            None => self
                .iter()
                .map(|(b, g)| (b.to_string(), g.to_ref()))
                .collect(),
        }
    }

    /// Number of blobs with a gradient.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether no blob has a gradient.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// `(blob, version)` pairs in dict order.
pub type Versions = Vec<(String, u32)>;
/// `(op index, version)` pairs.
pub type History = Vec<(usize, u32)>;

/// The IR's state in Caffe2's shapes (names instead of ids), for inspection.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IrState {
    /// Per forward op: `(in_versions, out_versions)`, each a dict (first occurrence order).
    pub ssa: Vec<(Versions, Versions)>,
    /// Latest version of every blob seen.
    pub frontier: Vec<(String, u32)>,
    /// `(blob, version, indices of the ops that read it)`; the backward pass adds one use at
    /// index `ops.len()` for every `y`.
    pub input_usages: Vec<(String, u32, Vec<u32>)>,
    /// The version each known gradient corresponds to.
    pub gradient_frontier: Vec<(String, u32)>,
    /// `(blob, version, generators)`; generator op slots index the backward pass's ops.
    pub gradient_generators: Vec<(String, u32, Vec<Generator>)>,
    /// Per blob: `(op index, version)` of every read.
    pub in_version_history: Vec<(String, History)>,
    /// Per blob: `(op index, version)` of every write.
    pub out_version_history: Vec<(String, History)>,
}

/// `input_to_grad` of Caffe2: absent, explicitly `None`, or a gradient; plus insertion order.
struct GradTable {
    vals: Vec<Option<IdGrad>>,
    order: Vec<BlobId>,
}

impl GradTable {
    fn new(n: usize) -> Self {
        GradTable {
            vals: vec![None; n],
            order: Vec::with_capacity(n),
        }
    }

    /// The entry of `id`: `None` if absent (an entry may be present with no gradient).
    fn get(&self, id: BlobId) -> Option<IdGrad> {
        self.vals.get(id.index()).copied().flatten()
    }

    /// The gradient of `id` (no gradient if absent).
    fn value(&self, id: BlobId) -> IdGrad {
        self.get(id).unwrap_or_default()
    }

    fn set(&mut self, id: BlobId, g: IdGrad) {
        if self.vals.len() <= id.index() {
            self.vals.resize(id.index() + 1, None);
        }
        let slot = &mut self.vals[id.index()];
        if slot.is_none() {
            self.order.push(id);
        }
        *slot = Some(g);
    }
}

/// Caffe2's `IR`: the forward ops played into SSA form, ready for a backward pass.
pub struct Ir<'a> {
    ops: ForwardOps<'a>,
    /// Serialized ops only: which ops were decoded (every op must be, once, to be checked).
    decoded: Vec<bool>,
    names: Names,
    /// Per input position of every op (flattened): (blob, version read).
    ins: Vec<(BlobId, u32)>,
    /// Per input position: the slot of the version read.
    in_slots: Vec<u32>,
    in_start: Vec<usize>,
    /// Per output position of every op (flattened): (blob, version of the blob after the op).
    outs: Vec<(BlobId, u32)>,
    out_start: Vec<usize>,
    frontier: Vec<Option<u32>>,
    read: Vec<bool>,
    /// Per blob: the slot of its latest version. Every blob version gets a dense slot index,
    /// so per-version state lives in vectors.
    cur_slot: Vec<u32>,
    /// Per slot: (blob, version).
    slots: Vec<(BlobId, u32)>,
    /// Per slot: the first op that reads the version and how many reads there are (Caffe2's
    /// `input_usages[blob][version][0]` and its length).
    usage_first: Vec<u32>,
    usage_count: Vec<u32>,
    /// Slots of the `ys` of the backward pass (each counts as one more read).
    ys_slots: Vec<u32>,
    gradient_frontier: Vec<Option<u32>>,
    gf_order: Vec<BlobId>,
    /// Where the gradient of each blob version comes from (Caffe2's `gradient_generators`).
    generators: Lists<Generator>,
    /// Reused per op: which input gradients update the gradient table.
    apply: Vec<bool>,
    /// Reused per op: the gradients of its outputs.
    g_output: Vec<IdGrad>,
    /// Reused per op: the gradients of its inputs that its maker gives.
    g_input: Vec<IdGrad>,
    /// Reused per op: the gradient ops its maker gives, over ids.
    id_ops: IdOps,
    /// Reused per op: its input and output ids.
    in_ids: Vec<BlobId>,
    out_ids: Vec<BlobId>,
    /// Reused per op: the gradient ops that recorded generators refer to.
    pins: Vec<usize>,
    /// Whether every generator is recorded (for [`Ir::state`]), or only those of blob
    /// versions that several ops read (all that gradient accumulation looks at).
    all_generators: bool,
    /// The registry entries and schema of each op type met, looked up once per type.
    types: TypeCache<'a>,
}

impl<'a> Ir<'a> {
    /// Plays `ops` (Caffe2's `IR(operators)`) and checks that every `StopGradient` output is
    /// read by some op.
    pub fn new(ops: &'a [OperatorDef]) -> Result<Self> {
        let ir = Self::unchecked(ops);
        ir.sanity_check()?;
        Ok(ir)
    }

    /// Plays `ops` without the `StopGradient` check (Caffe2's `IR.Play` of each op).
    pub fn unchecked(ops: &'a [OperatorDef]) -> Self {
        let n_ins: usize = ops.iter().map(|o| o.input.len()).sum();
        let n_outs: usize = ops.iter().map(|o| o.output.len()).sum();
        let mut ir = Self::empty(ForwardOps::Decoded(ops), n_ins, n_outs);
        let (mut ins, mut outs) = (Vec::new(), Vec::new());
        for (k, op) in ops.iter().enumerate() {
            ins.clear();
            outs.clear();
            for s in &op.input {
                ins.push(ir.id(s));
            }
            for s in &op.output {
                outs.push(ir.id(s));
            }
            ir.play_ids(k, &ins, &outs);
        }
        ir.in_start.push(ir.ins.len());
        ir.out_start.push(ir.outs.len());
        ir
    }

    /// Plays serialized ops read in place (names borrowed from the bytes), with the
    /// `StopGradient` check; `None` if an op is not plainly well-formed or the check fails
    /// (the caller then decodes the ops and plays those, for the exact errors).
    pub(crate) fn from_wire(mut wire: WireOps<'a>, size_hint: usize) -> Option<Self> {
        // About 2.5 inputs and 1.5 outputs per op in typical nets (a hint only).
        let n = wire.len();
        let mut ir = Self::empty(ForwardOps::Decoded(&[]), n * 5 / 2, n * 3 / 2 + size_hint);
        // Names are interned a batch of ops at a time (in the same order as one by one), so
        // that the cache misses of the name table overlap.
        const BATCH: usize = 32;
        let (mut ins, mut outs) = (Vec::new(), Vec::new());
        let (mut batch, mut counts, mut ids) = (Vec::new(), Vec::new(), Vec::new());
        for first in (0..n).step_by(BATCH) {
            batch.clear();
            counts.clear();
            for k in first..(first + BATCH).min(n) {
                ins.clear();
                outs.clear();
                wire.scan(k, &mut ins, &mut outs)?;
                batch.extend_from_slice(&ins);
                batch.extend_from_slice(&outs);
                counts.push((ins.len(), outs.len()));
            }
            ids.clear();
            ir.names.intern_batch(&batch, &mut ids);
            ir.register_blobs();
            let mut at = 0;
            for (j, &(n_in, n_out)) in counts.iter().enumerate() {
                let (i_ids, o_ids) = ids[at..at + n_in + n_out].split_at(n_in);
                ir.play_ids(first + j, i_ids, o_ids);
                at += n_in + n_out;
            }
        }
        ir.in_start.push(ir.ins.len());
        ir.out_start.push(ir.outs.len());
        ir.decoded = vec![false; n];
        ir.ops = ForwardOps::Wire(wire);
        ir.sanity_check().ok()?;
        Some(ir)
    }

    /// Decodes every serialized op that the backward pass did not decode, as decoding the
    /// whole net would have (an error for a malformed one).
    pub(crate) fn check_undecoded(&self) -> Result<()> {
        let ForwardOps::Wire(wire) = &self.ops else {
            return Ok(());
        };
        for (k, &done) in self.decoded.iter().enumerate() {
            if !done && !wire.names_only(k) {
                self.ops.op(k)?;
            }
        }
        Ok(())
    }

    fn empty(ops: ForwardOps<'a>, n_ins: usize, n_outs: usize) -> Self {
        // The forward blobs, and about as many gradient names.
        let n_names = 2 * (n_outs + n_ins / 2) + 8;
        let n_ops = ops.len();
        Ir {
            ops,
            decoded: Vec::new(),
            names: Names::with_capacity(n_names, n_names * 12),
            ins: Vec::with_capacity(n_ins),
            in_slots: Vec::with_capacity(n_ins),
            in_start: Vec::with_capacity(n_ops + 1),
            outs: Vec::with_capacity(n_outs),
            out_start: Vec::with_capacity(n_ops + 1),
            frontier: Vec::with_capacity(n_names),
            read: Vec::with_capacity(n_names),
            cur_slot: Vec::with_capacity(n_names),
            slots: Vec::with_capacity(n_outs + 8),
            usage_first: Vec::with_capacity(n_outs + 8),
            usage_count: Vec::with_capacity(n_outs + 8),
            ys_slots: Vec::new(),
            gradient_frontier: Vec::new(),
            gf_order: Vec::new(),
            generators: Lists::with_capacity(n_outs + 8),
            apply: Vec::new(),
            g_output: Vec::new(),
            g_input: Vec::new(),
            id_ops: IdOps::default(),
            in_ids: Vec::new(),
            out_ids: Vec::new(),
            pins: Vec::new(),
            all_generators: true,
            types: TypeCache::default(),
        }
    }

    fn id(&mut self, name: &str) -> BlobId {
        let id = self.names.intern(name);
        if id.index() >= self.frontier.len() {
            self.register_blobs();
        }
        id
    }

    /// Makes version `v` the latest version of `id`, with a new slot.
    fn new_version(&mut self, id: BlobId, v: u32) -> u32 {
        let slot = self.slots.len() as u32;
        self.slots.push((id, v));
        self.usage_first.push(u32::MAX);
        self.usage_count.push(0);
        self.frontier[id.index()] = Some(v);
        self.cur_slot[id.index()] = slot;
        slot
    }

    /// The latest version of `id` and its slot; a blob never seen gets version 0 (Caffe2's
    /// `defaultdict(int)`).
    fn current(&mut self, id: BlobId) -> (u32, u32) {
        match self.frontier[id.index()] {
            Some(v) => (v, self.cur_slot[id.index()]),
            None => (0, self.new_version(id, 0)),
        }
    }

    fn push_usage(&mut self, id: BlobId, slot: u32, op_idx: u32) {
        let s = slot as usize;
        if self.usage_count[s] == 0 {
            self.usage_first[s] = op_idx;
        }
        self.usage_count[s] += 1;
        self.read[id.index()] = true;
    }

    /// Per-blob state for every interned name.
    fn register_blobs(&mut self) {
        while self.frontier.len() < self.names.len() {
            self.frontier.push(None);
            self.read.push(false);
            self.cur_slot.push(u32::MAX);
        }
    }

    /// Caffe2's `IR.Play` of op `k`, with its inputs and outputs interned (and registered).
    fn play_ids(&mut self, k: usize, inputs: &[BlobId], outputs: &[BlobId]) {
        self.in_start.push(self.ins.len());
        for &id in inputs {
            let (v, slot) = self.current(id);
            self.ins.push((id, v));
            self.in_slots.push(slot);
            self.push_usage(id, slot, k as u32);
        }
        let start = self.outs.len();
        self.out_start.push(start);
        for &id in outputs {
            let v = self.frontier[id.index()].map_or(0, |v| v + 1);
            self.new_version(id, v);
            self.outs.push((id, v));
        }
        // `out_versions` is a dict: a blob written twice by the op keeps its last version.
        for p in start..self.outs.len() {
            let id = self.outs[p].0;
            self.outs[p].1 = self.frontier[id.index()].unwrap_or(0);
        }
    }

    /// Caffe2's `IR.SanityCheck`: a `StopGradient` output that nothing reads is an error.
    pub fn sanity_check(&self) -> Result<()> {
        for k in 0..self.ops.len() {
            if self.ops.op_type(k) != "StopGradient" {
                continue;
            }
            let Some(&(id, _)) = self.outs_of(k).first() else {
                return Err(Error::InvalidArgument(format!(
                    "StopGradient op has no output. Op:\n\n{}",
                    self.op_text(k)
                )));
            };
            if !self.read[id.index()] {
                return Err(Error::InvalidArgument(format!(
                    "StopGradient's output '{}' is orphan.\nYou typically want to specify \
                     same input and output for\nStopGradient. Op:\n\n{}",
                    self.names.name(id),
                    self.op_text(k)
                )));
            }
        }
        Ok(())
    }

    /// Op `k` as text, for error messages.
    fn op_text(&self, k: usize) -> String {
        match self.ops.op(k) {
            Ok(op) => text::op_text(&op),
            Err(e) => format!("<operator {k}: {e}>"),
        }
    }

    /// Number of forward ops.
    pub fn num_ops(&self) -> usize {
        self.ops.len()
    }

    /// Whether the type of some forward op has a gradient function in `registry` (one that
    /// may call back into user code).
    pub(crate) fn any_gradient_function(&mut self, registry: &Registry) -> bool {
        (0..self.ops.len()).any(|k| self.types.get(self.ops.op_type(k), registry).has_function())
    }

    /// The type of forward op `k` (`""` when unset).
    pub fn op_type(&self, k: usize) -> &'a str {
        self.ops.op_type(k)
    }

    fn ins_of(&self, k: usize) -> &[(BlobId, u32)] {
        &self.ins[self.in_start[k]..self.in_start[k + 1]]
    }

    fn outs_of(&self, k: usize) -> &[(BlobId, u32)] {
        &self.outs[self.out_start[k]..self.out_start[k + 1]]
    }

    fn frontier_of(&self, id: BlobId) -> u32 {
        self.frontier[id.index()].unwrap_or(0)
    }

    fn set_gradient_frontier(&mut self, id: BlobId, v: u32) {
        let i = id.index();
        if self.gradient_frontier.len() <= i {
            self.gradient_frontier
                .resize(self.names.len().max(i + 1), None);
        }
        if self.gradient_frontier[i].is_none() {
            self.gf_order.push(id);
        }
        self.gradient_frontier[i] = Some(v);
    }

    fn push_generator(&mut self, slot: u32, g: Generator) {
        // The gradient ops a recorded generator refers to stay changeable.
        match &g {
            Generator::Dense {
                op: Some((j, _)), ..
            } => self.pins.push(*j),
            Generator::Sparse {
                indices_op,
                values_op,
                ..
            } => self
                .pins
                .extend(indices_op.iter().chain(values_op).map(|s| s.0)),
            Generator::Dense { op: None, .. } => {}
        }
        self.generators.push(slot, g);
    }

    /// Records only the gradient generators that the backward pass itself needs (those of
    /// blob versions read by several ops, which gradient accumulation sums), not all of them:
    /// for a backward pass whose [`Ir::state`] is not looked at. The gradient ops and the
    /// gradient map are the same either way.
    pub fn skip_unused_generators(&mut self) {
        self.all_generators = false;
    }

    /// Whether a dense generator of `slot` is recorded.
    fn keeps_generator(&self, slot: u32) -> bool {
        self.all_generators || self.usage_count[slot as usize] > 1
    }

    /// Caffe2's `IR.GetBackwardPass(ys)`: the gradient ops and the gradient of every blob.
    ///
    /// `ys` are the blobs to differentiate, each with its given gradient, or `GradRef::None`
    /// to seed it with ones (a `ConstantFill` named `<y>_autogen_grad`). A blob listed twice
    /// keeps its first position and its last gradient, as a Python dict would.
    pub fn backward(
        &mut self,
        ys: &'a [(String, GradRef)],
        cx: &mut GradientContext<'_>,
    ) -> Result<(Vec<OperatorDef>, GradMap)> {
        let mut ops = GradOps::kept(self.ops.len() * 2 + ys.len());
        let grads = self.backward_into(ys, cx, &mut ops)?;
        Ok((ops.into_ops()?, grads))
    }

    /// [`Ir::backward`] with the gradient ops serialized as they are made: the serialized
    /// `caffe2.NetDef` holding them (only its `op` field set), the gradient map, and with
    /// `output_names` the output names of the gradient ops (every write, in no particular
    /// order; the concatenated names and where each ends).
    #[allow(clippy::type_complexity)]
    pub fn backward_serialized(
        &mut self,
        ys: &'a [(String, GradRef)],
        cx: &mut GradientContext<'_>,
        output_names: bool,
    ) -> Result<(Vec<u8>, GradMap, Option<(String, Vec<usize>)>)> {
        let mut ops = GradOps::streamed(self.ops.len() + ys.len(), output_names);
        let grads = self.backward_into(ys, cx, &mut ops)?;
        let (bytes, names) = ops.finish();
        Ok((bytes, grads, names))
    }

    fn backward_into(
        &mut self,
        ys: &'a [(String, GradRef)],
        cx: &mut GradientContext<'_>,
        all_ops: &mut GradOps,
    ) -> Result<GradMap> {
        let mut uniq: Vec<(BlobId, &'a GradRef)> = Vec::with_capacity(ys.len());
        let mut pos: FxHashMap<BlobId, usize> = FxHashMap::default();
        for (y, g) in ys {
            let id = self.id(y);
            match pos.get(&id) {
                Some(&p) => uniq[p].1 = g,
                None => {
                    pos.insert(id, uniq.len());
                    uniq.push((id, g));
                }
            }
        }
        let n = self.ops.len() as u32;
        for &(id, _) in &uniq {
            let (v, slot) = self.current(id);
            self.set_gradient_frontier(id, v);
            self.push_usage(id, slot, n);
            self.ys_slots.push(slot);
        }
        self.gradient_frontier.resize(self.names.len(), None);

        let mut grads = GradTable::new(self.names.len());
        for &(id, g) in &uniq {
            if g.is_some() {
                let g = IdGrad::intern(g, &mut self.names);
                grads.set(id, g);
                continue;
            }
            let y = self.names.name(id);
            let op = cx.options.create_operator(
                "ConstantFill",
                vec![y.to_string()],
                vec![cx.options.scoped(&format!("{y}{AUTOGEN_GRAD_SUFFIX}"))],
                vec![float_arg("value", 1.0)],
            );
            let gname = op.output[0].clone();
            let device_option = op.device_option.clone().unwrap_or_default();
            // Its generator is recorded: the op may be renamed by an accumulation.
            all_ops.push(op, true);
            let gid = self.names.intern(&gname);
            grads.set(id, IdGrad::Dense(gid));
            let slot = self.cur_slot[id.index()];
            self.push_generator(
                slot,
                Generator::Dense {
                    op: Some((all_ops.len() - 1, 0)),
                    gradient: gname,
                    device_option,
                },
            );
        }

        // Gradient names get ids past the forward blobs' (unless a forward blob has the same
        // name): the per-blob state, which only forward blobs need, is not grown for them.

        // The gradient names a maker makes (`<input>_grad`) are new names, whose table slots
        // are cache misses in a large net: there, they are asked for a few ops ahead.
        const AHEAD: usize = 6;
        let prefetch = self.names.prefetch_pays();
        for k in (0..self.ops.len()).rev() {
            if let Some(j) = k.checked_sub(AHEAD).filter(|_| prefetch) {
                for p in self.in_start[j]..self.in_start[j + 1] {
                    self.names.prefetch_suffixed(self.ins[p].0, "_grad");
                }
            }
            self.generate_for_op(k, &mut grads, all_ops, cx)?;
            self.accumulate(k, &mut grads, all_ops, cx)?;
        }

        let name = |g: BlobId| self.names.name(g);
        let bytes = grads
            .order
            .iter()
            .map(|&id| {
                name(id).len()
                    + match grads.value(id) {
                        IdGrad::None => 0,
                        IdGrad::Dense(d) => name(d).len(),
                        IdGrad::Sparse(i, v) => name(i).len() + name(v).len(),
                    }
            })
            .sum();
        let mut map = GradMapBuilder::with_capacity(grads.order.len(), bytes);
        for &id in &grads.order {
            let g = match grads.value(id) {
                IdGrad::None => continue,
                IdGrad::Dense(d) => GradName::Dense(name(d)),
                IdGrad::Sparse(i, v) => GradName::Sparse(name(i), name(v)),
            };
            map.push(name(id), g);
        }
        Ok(map.build())
    }

    /// The forward op `k` when its gradient may need more than its names: a decoded op as it
    /// is, a serialized one decoded unless it has nothing but names (checked here, as decoding
    /// would check it). `None` for a serialized op with only names.
    fn forward_op(&mut self, k: usize) -> Result<Option<Cow<'a, OperatorDef>>> {
        let names_only = match &self.ops {
            ForwardOps::Decoded(ops) => return Ok(Some(Cow::Borrowed(&ops[k]))),
            ForwardOps::Wire(w) => w.names_only(k),
        };
        let op = if names_only {
            None
        } else {
            Some(self.ops.op(k)?)
        };
        if let Some(d) = self.decoded.get_mut(k) {
            *d = true;
        }
        Ok(op)
    }

    /// The gradient of op `k` made over ids, if its type has an interned maker that makes
    /// it; the ops are left in `id_ops` and the input gradients in `g_input`.
    fn make_interned(&mut self, k: usize, type_index: usize) -> bool {
        let resolved = &self.types.resolved[type_index];
        let Some(kind) = resolved.interned() else {
            return false;
        };
        if self.g_output.iter().any(|g| g.needs_wrapping(&self.names)) {
            return false;
        }
        let (i0, i1) = (self.in_start[k], self.in_start[k + 1]);
        let (o0, o1) = (self.out_start[k], self.out_start[k + 1]);
        self.in_ids.clear();
        self.in_ids.extend(self.ins[i0..i1].iter().map(|p| p.0));
        self.out_ids.clear();
        self.out_ids.extend(self.outs[o0..o1].iter().map(|p| p.0));
        if verify_counts(resolved.schema(), &self.in_ids, &self.out_ids) != Some(true) {
            return false;
        }
        self.id_ops.clear();
        self.g_input.clear();
        self.g_input.resize(self.in_ids.len(), IdGrad::None);
        let Some(maker) = kind else {
            // No gradient: none for the inputs, no ops.
            return true;
        };
        let mut cx = InternedCtx {
            names: &mut self.names,
            inputs: &self.in_ids,
            outputs: &self.out_ids,
            g_output: &self.g_output,
            g_input: &mut self.g_input,
            ops: &mut self.id_ops,
        };
        maker.make_interned(&mut cx).is_some()
    }

    /// Caffe2's `_GenerateGradientsForForwardOp` (+ `BuildGradientGenerators`).
    fn generate_for_op(
        &mut self,
        k: usize,
        grads: &mut GradTable,
        all_ops: &mut GradOps,
        cx: &mut GradientContext<'_>,
    ) -> Result<()> {
        let mut g_output = std::mem::take(&mut self.g_output);
        g_output.clear();
        let (o0, o1) = (self.out_start[k], self.out_start[k + 1]);
        g_output.extend(self.outs[o0..o1].iter().map(|p| grads.value(p.0)));
        let any = g_output.iter().any(|g| g.is_some());
        self.g_output = g_output;
        let op_type = self.ops.op_type(k);
        if !any && op_type != "ZeroGradient" {
            return Ok(());
        }
        let fwd = self.forward_op(k)?;
        let type_index = self.types.index(op_type, cx.registry);
        let made = if self.make_interned(k, type_index) {
            None
        } else {
            Some(self.make_named(k, fwd.as_deref(), type_index, cx)?)
        };

        let base = all_ops.len();
        self.pins.clear();
        let id_ops = std::mem::take(&mut self.id_ops);
        let g_input = std::mem::take(&mut self.g_input);
        let generated = match &made {
            Some(ops) => self.build_generators(
                k,
                &id_ops,
                &g_input,
                |j| ops[j].device_option.clone().unwrap_or_default(),
                fwd.as_deref(),
                base,
            ),
            None => {
                let dev = fwd.as_deref().and_then(|f| f.device_option.as_ref());
                self.build_generators(
                    k,
                    &id_ops,
                    &g_input,
                    |_| dev.cloned().unwrap_or_default(),
                    fwd.as_deref(),
                    base,
                )
            }
        };
        if let Err(e) = generated {
            self.id_ops = id_ops;
            self.g_input = g_input;
            return Err(e);
        }

        // Caffe2 decides every update against the table as it was before this op.
        let mut apply = std::mem::take(&mut self.apply);
        apply.clear();
        {
            let outs = VersionIndex::new(self.outs_of(k));
            for (&(id, _), g) in self.ins_of(k).iter().zip(&g_input) {
                apply.push(g.is_some() || grads.get(id).is_none() || outs.get(id).is_some());
            }
        }
        for (p, &yes) in apply.iter().enumerate() {
            if yes {
                let id = self.ins[self.in_start[k] + p].0;
                grads.set(id, g_input[p]);
            }
        }
        self.apply = apply;
        match made {
            Some(ops) => {
                for (j, gop) in ops.into_iter().enumerate() {
                    let pinned = self.pins.contains(&(base + j));
                    all_ops.push(gop, pinned);
                }
            }
            None => {
                for (j, op) in id_ops.ops.iter().enumerate() {
                    let pinned = self.pins.contains(&(base + j));
                    all_ops.push_interned(
                        &self.names,
                        op.op_type,
                        id_ops.inputs(j),
                        id_ops.outputs(j),
                        fwd.as_deref(),
                        pinned,
                    );
                }
            }
        }
        self.id_ops = id_ops;
        self.g_input = g_input;
        Ok(())
    }

    /// The gradient of op `k` made with names (the maker's `make`, or a gradient function):
    /// the gradient ops, which are also left over ids in `id_ops`, and the input gradients
    /// (interned) in `g_input`.
    fn make_named(
        &mut self,
        k: usize,
        fwd: Option<&OperatorDef>,
        type_index: usize,
        cx: &mut GradientContext<'_>,
    ) -> Result<Vec<OperatorDef>> {
        let decoded;
        let op = match fwd {
            Some(op) => op,
            None => {
                decoded = self.ops.op(k)?;
                &*decoded
            }
        };
        let g_output: Vec<GradRef> = self
            .g_output
            .iter()
            .map(|g| g.to_ref(&self.names))
            .collect();
        let op_type = self.ops.op_type(k);
        let out = if op.r#type() == op_type {
            dispatch::gradient_for_op_resolved(op, &self.types.resolved[type_index], &g_output, cx)?
        } else {
            dispatch::gradient_for_op(op, &g_output, cx)?
        };
        if out.input_grads.len() > op.input.len() {
            return Err(Error::Type(format!(
                "the gradient of operator {} has {} input gradients for {} inputs",
                op.r#type(),
                out.input_grads.len(),
                op.input.len()
            )));
        }
        self.id_ops.clear();
        for gop in &out.ops {
            self.id_ops.push_names(gop, &mut self.names);
        }
        self.g_input.clear();
        for g in &out.input_grads {
            let g = IdGrad::intern(g, &mut self.names);
            self.g_input.push(g);
        }
        Ok(out.ops)
    }

    /// Caffe2's `BuildGradientGenerators`: checks the gradient ops' inputs and records the
    /// generators of the input gradients. `base` is the index the first gradient op will have
    /// in the backward net; `op_device(j)` is the device option of gradient op `j`, `fwd` the
    /// forward op (when more than its names is known).
    fn build_generators(
        &mut self,
        k: usize,
        grad_ops: &IdOps,
        g_input: &[IdGrad],
        op_device: impl Fn(usize) -> DeviceOption,
        fwd: Option<&OperatorDef>,
        base: usize,
    ) -> Result<()> {
        let local = grad_ops.local();
        {
            let go = GradLookup::new(&self.g_output);
            let ins = VersionIndex::new(self.ins_of(k));
            let outs = VersionIndex::new(self.outs_of(k));
            for j in 0..grad_ops.len() {
                for &s in grad_ops.inputs(j) {
                    self.check_grad_input(s, &go, k, &ins, &outs, &local, j)?;
                }
            }
        }
        let gi = GradLookup::new(g_input);
        let mut sparse: Vec<(BlobId, u32, Vec<Generator>)> = Vec::new();
        let start = self.in_start[k];
        for j in 0..grad_ops.len() {
            for (i, &o) in grad_ops.outputs(j).iter().enumerate() {
                let Some(ii) = gi.get(o) else { continue };
                let id = self.ins[start + ii].0;
                let slot = self.in_slots[start + ii];
                let at = Some((base + j, i));
                match g_input[ii] {
                    IdGrad::Sparse(indices, values) => {
                        let (indices_op, values_op) =
                            if indices == o { (at, None) } else { (None, at) };
                        let gen = Generator::Sparse {
                            indices_op,
                            values_op,
                            indices: self.names.name(indices).to_string(),
                            values: self.names.name(values).to_string(),
                            device_option: op_device(j),
                        };
                        match sparse.iter_mut().find(|e| e.0 == id) {
                            Some(e) => e.2.push(gen),
                            None => sparse.push((id, slot, vec![gen])),
                        }
                    }
                    IdGrad::Dense(g) => {
                        if self.keeps_generator(slot) {
                            let gen = Generator::Dense {
                                op: at,
                                gradient: self.names.name(g).to_string(),
                                device_option: op_device(j),
                            };
                            self.push_generator(slot, gen);
                        }
                    }
                    IdGrad::None => {}
                }
            }
        }
        for (id, slot, gens) in sparse {
            let merged = merge_sparse(gens, self.names.name(id))?;
            self.push_generator(slot, merged);
        }
        let fwd_device = || {
            fwd.and_then(|op| op.device_option.clone())
                .unwrap_or_default()
        };
        for (ii, &g) in g_input.iter().enumerate() {
            if !g.is_truthy(&self.names) {
                continue;
            }
            let slot = self.in_slots[start + ii];
            match g {
                IdGrad::Sparse(indices, values) => {
                    if !local.written(indices) && !local.written(values) {
                        let gen = Generator::Sparse {
                            indices_op: None,
                            values_op: None,
                            indices: self.names.name(indices).to_string(),
                            values: self.names.name(values).to_string(),
                            device_option: fwd_device(),
                        };
                        self.push_generator(slot, gen);
                    }
                }
                IdGrad::Dense(d) => {
                    if !local.written(d) && self.keeps_generator(slot) {
                        let gen = Generator::Dense {
                            op: None,
                            gradient: self.names.name(d).to_string(),
                            device_option: fwd_device(),
                        };
                        self.push_generator(slot, gen);
                    }
                }
                IdGrad::None => {}
            }
        }
        for (ii, g) in g_input.iter().enumerate() {
            if g.is_some() {
                let (id, v) = self.ins[start + ii];
                self.set_gradient_frontier(id, v);
            }
        }
        Ok(())
    }

    /// Caffe2's `CheckGradientOperatorInput` for input `s` of gradient op `j`.
    #[allow(clippy::too_many_arguments)]
    fn check_grad_input(
        &self,
        s: BlobId,
        go: &GradLookup<'_>,
        k: usize,
        ins: &VersionIndex<'_>,
        outs: &VersionIndex<'_>,
        local: &LocalIds<'_>,
        j: usize,
    ) -> Result<()> {
        let name = || self.names.name(s);
        if let Some(oi) = go.get(s) {
            let (oid, over) = self.outs_of(k)[oi];
            let original = self.names.name(oid);
            let gf = self
                .gradient_frontier
                .get(oid.index())
                .copied()
                .flatten()
                .ok_or_else(|| {
                    Error::Runtime(format!(
                        "Gradient name \"{}\" refers to blob \"{original}\", which has no \
                         gradient version",
                        name()
                    ))
                })?;
            if over != gf {
                return Err(Error::Runtime(format!(
                    "Gradient name \"{}\" is expected to correspond to version {over} of \
                     \"{original}\", but currently we have version {gf}.\n\n{}",
                    name(),
                    self.history_out(original)
                )));
            }
            return Ok(());
        }
        if let Some(over) = find_version(s, self.outs_of(k), outs) {
            let cur = self.frontier_of(s);
            if cur != over {
                return Err(Error::Runtime(format!(
                    "Gradient operator needs output \"{}\" at version {over}, but currently \
                     we have version {cur}.\n\n{}",
                    name(),
                    self.history_out(name())
                )));
            }
            return Ok(());
        }
        if let Some(iv) = find_version(s, self.ins_of(k), ins) {
            let cur = self.frontier_of(s);
            if cur != iv {
                return Err(Error::Runtime(format!(
                    "Gradient operator needs input \"{}\" at version {iv}, but currently we \
                     have version {cur}.\n\n{}",
                    name(),
                    self.history_in(name())
                )));
            }
            return Ok(());
        }
        if !local.written_before(s, j) {
            return Err(Error::Runtime(format!(
                "Blob name \"{}\" not in the scope of operator: {}\nand is not generated by \
                 any of the local gradient operators.",
                name(),
                self.op_text(k)
            )));
        }
        Ok(())
    }

    /// `(op index, version)` of every read and write of `name` by the forward ops, replaying
    /// the versioning for that one blob.
    fn history(&self, name: &str) -> (History, History) {
        let (mut reads, mut writes) = (Vec::new(), Vec::new());
        let Some(id) = self.names.get(name) else {
            return (reads, writes);
        };
        let mut v: Option<u32> = None;
        for k in 0..self.ops.len() {
            for &(i, _) in self.ins_of(k) {
                if i == id {
                    reads.push((k, *v.get_or_insert(0)));
                }
            }
            for &(o, _) in self.outs_of(k) {
                if o == id {
                    let nv = v.map_or(0, |x| x + 1);
                    v = Some(nv);
                    writes.push((k, nv));
                }
            }
        }
        (reads, writes)
    }

    fn history_out(&self, name: &str) -> String {
        let mut s = format!(
            "DEBUG HELP:\nMaybe you use same output blob twice for different ops?\n\
             == Version history of blob [{name}]\n"
        );
        for (k, v) in self.history(name).1 {
            s.push_str(&format!("Version (out) {v} <-- {}\n", self.op_text(k)));
        }
        s
    }

    fn history_in(&self, name: &str) -> String {
        let mut s = format!(
            "DEBUG HELP:\nMaybe the blob was overwritten by another op?\n\
             == Version history of blob [{name}]\n"
        );
        for (k, v) in self.history(name).0 {
            s.push_str(&format!("version (in) {v} <-- {}\n", self.op_text(k)));
        }
        s
    }

    /// Caffe2's `DoGradientAccumulation`: sums the gradients of the input versions of op `k`
    /// that several ops read, once `k` (their first reader) is reached.
    fn accumulate(
        &mut self,
        k: usize,
        grads: &mut GradTable,
        all_ops: &mut GradOps,
        cx: &mut GradientContext<'_>,
    ) -> Result<()> {
        let start = self.in_start[k];
        let n = self.in_start[k + 1] - start;
        let mut seen: Option<FxHashSet<BlobId>> = (n > 16).then(FxHashSet::default);
        for p in 0..n {
            let ins = &self.ins[start..start + n];
            let id = ins[p].0;
            let first_time = match seen.as_mut() {
                Some(set) => set.insert(id),
                None => !ins[..p].iter().any(|q| q.0 == id),
            };
            let slot = self.in_slots[start + p] as usize;
            if !first_time || self.usage_count[slot] <= 1 || self.usage_first[slot] != k as u32 {
                continue;
            }
            let gens: Vec<Generator> = self.generators.iter(slot as u32).cloned().collect();
            let name = self.names.name(id);
            if !accumulate::needs_sum(&gens, name)? {
                continue;
            }
            let (sum_ops, g) = accumulate::make_sum_ops(&gens, name, all_ops, cx.options)?;
            // Generators refer to maker ops only: nothing renames an accumulation op.
            for op in sum_ops {
                all_ops.push(op, false);
            }
            let g = IdGrad::intern(&g, &mut self.names);
            grads.set(id, g);
        }
        Ok(())
    }

    /// The IR's state in Caffe2's shapes.
    pub fn state(&self) -> IrState {
        let name = |id: BlobId| self.names.name(id).to_string();
        let dict = |pairs: &[(BlobId, u32)]| {
            let mut out: Vec<(String, u32)> = Vec::with_capacity(pairs.len());
            let mut seen: FxHashMap<BlobId, usize> = FxHashMap::default();
            for &(id, v) in pairs {
                match seen.get(&id) {
                    Some(&p) => out[p].1 = v,
                    None => {
                        seen.insert(id, out.len());
                        out.push((name(id), v));
                    }
                }
            }
            out
        };
        let ssa = (0..self.ops.len())
            .map(|k| (dict(self.ins_of(k)), dict(self.outs_of(k))))
            .collect();
        let frontier = (0..self.names.len() as u32)
            .map(BlobId)
            .filter_map(|id| {
                let v = self.frontier.get(id.index()).copied().flatten();
                v.map(|v| (name(id), v))
            })
            .collect();
        let mut users: Vec<Vec<u32>> = vec![Vec::new(); self.slots.len()];
        let mut order: Vec<u32> = Vec::new();
        let reads = (0..self.ops.len()).flat_map(|k| {
            self.in_slots[self.in_start[k]..self.in_start[k + 1]]
                .iter()
                .map(move |&s| (s, k as u32))
        });
        let n = self.ops.len() as u32;
        for (s, k) in reads.chain(self.ys_slots.iter().map(|&s| (s, n))) {
            if users[s as usize].is_empty() {
                order.push(s);
            }
            users[s as usize].push(k);
        }
        let input_usages = order
            .iter()
            .map(|&s| {
                let (id, v) = self.slots[s as usize];
                (name(id), v, std::mem::take(&mut users[s as usize]))
            })
            .collect();
        let gradient_frontier = self
            .gf_order
            .iter()
            .filter_map(|&id| {
                self.gradient_frontier
                    .get(id.index())
                    .copied()
                    .flatten()
                    .map(|v| (name(id), v))
            })
            .collect();
        let gradient_generators = self
            .generators
            .keys()
            .iter()
            .map(|&s| {
                let (id, v) = self.slots[s as usize];
                (name(id), v, self.generators.iter(s).cloned().collect())
            })
            .collect();
        // Version histories, replayed per blob as Caffe2 recorded them (an op writing a blob
        // twice records two versions).
        let n_names = self.names.len();
        let mut current: Vec<Option<u32>> = vec![None; n_names];
        let mut reads: Vec<Vec<(usize, u32)>> = vec![Vec::new(); n_names];
        let mut writes: Vec<Vec<(usize, u32)>> = vec![Vec::new(); n_names];
        let (mut read_order, mut write_order) = (Vec::new(), Vec::new());
        for k in 0..self.ops.len() {
            for &(i, _) in self.ins_of(k) {
                let v = *current[i.index()].get_or_insert(0);
                if reads[i.index()].is_empty() {
                    read_order.push(i);
                }
                reads[i.index()].push((k, v));
            }
            for &(o, _) in self.outs_of(k) {
                let v = current[o.index()].map_or(0, |v| v + 1);
                current[o.index()] = Some(v);
                if writes[o.index()].is_empty() {
                    write_order.push(o);
                }
                writes[o.index()].push((k, v));
            }
        }
        let hist = |order: Vec<BlobId>, mut m: Vec<Vec<(usize, u32)>>| {
            order
                .into_iter()
                .map(|id| (name(id), std::mem::take(&mut m[id.index()])))
                .collect()
        };
        IrState {
            ssa,
            frontier,
            input_usages,
            gradient_frontier,
            gradient_generators,
            in_version_history: hist(read_order, reads),
            out_version_history: hist(write_order, writes),
        }
    }
}

/// The [`Resolved`] registry entries and schema of each op type, by type name: a scan of the
/// types met so far (a net has few types), and a hash index once there are many.
#[derive(Default)]
struct TypeCache<'a> {
    names: Vec<&'a str>,
    resolved: Vec<Resolved>,
    index: FxHashMap<&'a str, usize>,
    /// The type asked for last (ops of one type often come in runs).
    last: usize,
}

impl<'a> TypeCache<'a> {
    const SCAN: usize = 8;

    fn get(&mut self, op_type: &'a str, registry: &Registry) -> &Resolved {
        let k = self.index(op_type, registry);
        &self.resolved[k]
    }

    /// The index in `resolved` of `op_type`'s entries.
    fn index(&mut self, op_type: &'a str, registry: &Registry) -> usize {
        let k = match self.names.get(self.last) {
            Some(&t) if t == op_type => self.last,
            _ => self.find_or_add(op_type, registry),
        };
        self.last = k;
        k
    }

    fn find_or_add(&mut self, op_type: &'a str, registry: &Registry) -> usize {
        let found = if self.names.len() <= Self::SCAN {
            self.names.iter().position(|&t| t == op_type)
        } else {
            self.index.get(op_type).copied()
        };
        if let Some(k) = found {
            return k;
        }
        let k = self.names.len();
        self.names.push(op_type);
        self.resolved.push(Resolved::new(registry, op_type));
        if self.names.len() > Self::SCAN {
            if self.index.is_empty() {
                self.index
                    .extend(self.names.iter().enumerate().map(|(j, &t)| (t, j)));
            } else {
                self.index.insert(op_type, k);
            }
        }
        k
    }
}

/// The version of blob `id` among one op's inputs or outputs (their ids and versions in
/// `pairs`): a scan for small ops, the id index for large ones. A blob listed twice has the
/// same version at both places.
fn find_version(id: BlobId, pairs: &[(BlobId, u32)], index: &VersionIndex<'_>) -> Option<u32> {
    if pairs.len() <= 16 {
        return pairs.iter().find(|p| p.0 == id).map(|p| p.1);
    }
    index.get(id)
}

/// Caffe2's `AppendSparseGenerators`: an op that writes both halves of a sparse gradient gives
/// one generator with both slots.
fn merge_sparse(mut gens: Vec<Generator>, name: &str) -> Result<Generator> {
    match gens.len() {
        1 => Ok(gens.remove(0)),
        2 => {
            let b = gens.remove(1);
            let a = gens.remove(0);
            let (
                Generator::Sparse {
                    indices_op: ai,
                    values_op: av,
                    indices,
                    values,
                    device_option: da,
                },
                Generator::Sparse {
                    indices_op: bi,
                    values_op: bv,
                    indices: bind,
                    values: bval,
                    device_option: db,
                },
            ) = (a, b)
            else {
                return Err(Error::Assertion(format!(
                    "sparse gradient generators of '{name}' are not sparse"
                )));
            };
            if indices != bind || values != bval {
                return Err(Error::Assertion(format!(
                    "the two halves of the sparse gradient of '{name}' belong to different \
                     gradients"
                )));
            }
            if da != db {
                return Err(Error::Assertion(format!(
                    "Unequal devices for sparse generators: {} and {}",
                    text::device_text(&da),
                    text::device_text(&db)
                )));
            }
            if (ai.is_some() && bi.is_some()) || (av.is_some() && bv.is_some()) {
                return Err(Error::Assertion(format!(
                    "the sparse gradient of '{name}' is written twice by one operator"
                )));
            }
            Ok(Generator::Sparse {
                indices_op: ai.or(bi),
                values_op: av.or(bv),
                indices,
                values,
                device_option: da,
            })
        }
        n => Err(Error::Assertion(format!(
            "{n} gradient ops of one operator write the sparse gradient of '{name}'"
        ))),
    }
}
