//! Graph surgery for deployment and export code: producer and consumer maps over versioned
//! blobs, renames that keep a predict net, its init net and its external inputs/outputs
//! consistent, removal of dead-end ops, sub-graph boundaries and chains of one op type.
//!
//! A [`Graph`] reads a net (a `NetDef` or its serialized bytes, plus optionally the init net
//! that fills its parameters), keeps its SSA form up to date across edits, and writes the
//! edited nets back with [`EditedNet::to_net_def`] or [`EditedNet::to_bytes`]. Writing back from
//! bytes copies every untouched op byte for byte.
//!
//! Versions follow `core.get_ssa`; with an init net, the predict net's versions start from the
//! init net's final versions (a parameter filled by the init net is read at version 1, not 0).

use super::intern::BlobId;
use super::netio::NetIo;
use super::ssa::{Ssa, ValueId, Version};
use super::wire::{self, NetLayout};
use crate::error::{Error, Result};
use crate::proto::{self, NetDef, OperatorDef};
use std::sync::OnceLock;

/// An op and the position of one of its inputs or outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpSlot {
    /// Op index in the net.
    pub op: usize,
    /// Input (or output) index in that op.
    pub index: usize,
}

/// The boundary of a sub-graph, as versioned blobs of the whole net.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubGraphIo {
    /// Blob versions the sub-graph reads but does not produce, in order of first read.
    pub inputs: Vec<(String, Version)>,
    /// Blob versions the sub-graph produces that ops outside it read, or that are the final
    /// versions of the net's external outputs, in order of production.
    pub outputs: Vec<(String, Version)>,
}

#[derive(Debug, Clone)]
enum Source<'a> {
    Net(&'a NetDef),
    Bytes { bytes: &'a [u8], layout: NetLayout },
}

/// A net being edited: its source, its current shape, and what changed.
#[derive(Debug, Clone)]
struct Editable<'a> {
    source: Source<'a>,
    io: NetIo,
    /// Source op index of each current op.
    origin: Vec<usize>,
    /// Whether each current op's inputs or outputs changed.
    dirty: Vec<bool>,
    ext_in_dirty: bool,
    ext_out_dirty: bool,
}

impl<'a> Editable<'a> {
    fn new(source: Source<'a>, io: NetIo) -> Self {
        let n = io.num_ops();
        Editable {
            source,
            io,
            origin: (0..n).collect(),
            dirty: vec![false; n],
            ext_in_dirty: false,
            ext_out_dirty: false,
        }
    }

    fn from_net(net: &'a NetDef) -> Self {
        Self::new(Source::Net(net), NetIo::from_net(net))
    }

    fn from_bytes(bytes: &'a [u8]) -> Result<Self> {
        let (io, layout) = NetIo::from_bytes_with_layout(bytes)?;
        Ok(Self::new(Source::Bytes { bytes, layout }, io))
    }

    fn names(&self, ids: &[BlobId]) -> Vec<String> {
        ids.iter().map(|&b| self.io.name(b).to_string()).collect()
    }

    /// Renames the version `version` of blob `old_name` to `new_name`: every slot holding it
    /// (`value`, per `ssa` computed on this net, if some op touches it), and the external
    /// input/output entries when it is the version the net starts/ends with.
    #[allow(clippy::too_many_arguments)]
    fn rename_version(
        &mut self,
        ssa: &Ssa,
        old_name: &str,
        version: Version,
        value: Option<ValueId>,
        new_name: &str,
        start: Version,
        end: Version,
    ) {
        let new = self.io.intern(new_name);
        if let Some(value) = value {
            for op in 0..ssa.len() {
                let mut touched = false;
                for (j, s) in ssa.inputs(op).iter().enumerate() {
                    if s.value == value {
                        self.io.op_inputs_mut(op)[j] = new;
                        touched = true;
                    }
                }
                for (j, s) in ssa.outputs(op).iter().enumerate() {
                    if s.value == value {
                        self.io.op_outputs_mut(op)[j] = new;
                        touched = true;
                    }
                }
                self.dirty[op] |= touched;
            }
        }
        let Some(old) = self.io.names().get(old_name) else {
            return;
        };
        if version == start {
            self.ext_in_dirty |= replace_entry(self.io.external_inputs_mut(), old, new);
        }
        if version == end {
            self.ext_out_dirty |= replace_entry(self.io.external_outputs_mut(), old, new);
        }
    }

    fn retain_ops(&mut self, keep: &[bool]) {
        self.io.retain_ops(keep);
        let mut k = keep.iter();
        self.origin.retain(|_| k.next().copied().unwrap_or(false));
        let mut k = keep.iter();
        self.dirty.retain(|_| k.next().copied().unwrap_or(false));
    }

    /// The edited net as a message.
    fn to_net_def(&self) -> Result<NetDef> {
        match &self.source {
            Source::Net(net) => Ok(self.apply_to(net)),
            Source::Bytes { bytes, .. } => {
                let net: NetDef = proto::decode(bytes)?;
                Ok(self.apply_to(&net))
            }
        }
    }

    fn apply_to(&self, src: &NetDef) -> NetDef {
        let op = self
            .origin
            .iter()
            .enumerate()
            .map(|(cur, &o)| {
                let mut op: OperatorDef = src.op[o].clone();
                if self.dirty[cur] {
                    op.input = self.names(self.io.op_inputs(cur));
                    op.output = self.names(self.io.op_outputs(cur));
                }
                op
            })
            .collect();
        let external_input = if self.ext_in_dirty {
            self.names(self.io.external_inputs())
        } else {
            src.external_input.clone()
        };
        let external_output = if self.ext_out_dirty {
            self.names(self.io.external_outputs())
        } else {
            src.external_output.clone()
        };
        NetDef {
            name: src.name.clone(),
            op,
            r#type: src.r#type.clone(),
            num_workers: src.num_workers,
            device_option: src.device_option.clone(),
            arg: src.arg.clone(),
            external_input,
            external_output,
            partition_info: src.partition_info.clone(),
        }
    }

    /// The edited net, serialized. From bytes, untouched fields and ops are copied verbatim
    /// (unknown fields included); edited external lists are written after the other fields.
    fn to_bytes(&self) -> Result<Vec<u8>> {
        let (bytes, layout) = match &self.source {
            Source::Net(net) => return Ok(proto::encode(&self.apply_to(net))),
            Source::Bytes { bytes, layout } => (bytes, layout),
        };
        let mut current = vec![usize::MAX; layout.ops.len()];
        for (cur, &o) in self.origin.iter().enumerate() {
            current[o] = cur;
        }
        let mut out = Vec::with_capacity(bytes.len() + 64);
        let mut src_op = 0;
        let mut payload = Vec::new();
        for (field, range) in &layout.fields {
            let range = range.start as usize..range.end as usize;
            match *field {
                wire::NET_OP => {
                    // A run of ops: copy the kept, untouched ones, rewrite the edited ones.
                    while src_op < layout.ops.len()
                        && (layout.ops[src_op].end as usize) <= range.end
                    {
                        let cur = current[src_op];
                        let op_range = layout.op(src_op);
                        src_op += 1;
                        if cur == usize::MAX {
                            continue;
                        }
                        if self.dirty[cur] {
                            payload.clear();
                            wire::rewrite_op(
                                bytes,
                                op_range,
                                self.io.op_inputs(cur).iter().map(|&b| self.io.name(b)),
                                self.io.op_outputs(cur).iter().map(|&b| self.io.name(b)),
                                &mut payload,
                            )?;
                            wire::put_len_field(&mut out, wire::NET_OP, &payload);
                        } else {
                            wire::put_len_field(&mut out, wire::NET_OP, &bytes[op_range]);
                        }
                    }
                }
                wire::NET_EXTERNAL_INPUT if self.ext_in_dirty => {}
                wire::NET_EXTERNAL_OUTPUT if self.ext_out_dirty => {}
                _ => out.extend_from_slice(&bytes[range]),
            }
        }
        if self.ext_in_dirty {
            for &b in self.io.external_inputs() {
                wire::put_len_field(
                    &mut out,
                    wire::NET_EXTERNAL_INPUT,
                    self.io.name(b).as_bytes(),
                );
            }
        }
        if self.ext_out_dirty {
            for &b in self.io.external_outputs() {
                wire::put_len_field(
                    &mut out,
                    wire::NET_EXTERNAL_OUTPUT,
                    self.io.name(b).as_bytes(),
                );
            }
        }
        Ok(out)
    }
}

/// Replaces `old` by `new` in an external input/output list without creating a duplicate
/// entry (if `new` is already listed, `old` is dropped). Returns whether the list changed.
fn replace_entry(list: &mut Vec<BlobId>, old: BlobId, new: BlobId) -> bool {
    if old == new || !list.contains(&old) {
        return false;
    }
    if list.contains(&new) {
        list.retain(|&b| b != old);
    } else {
        for b in list.iter_mut() {
            if *b == old {
                *b = new;
            }
        }
    }
    true
}

/// A predict net (and optionally its init net) under surgery.
///
/// ```
/// use ferrocaffe::graph::Graph;
/// use ferrocaffe::proto::{NetDef, OperatorDef};
///
/// let mut net = NetDef::default();
/// net.external_input = vec!["data".into(), "w".into()];
/// net.external_output = vec!["prob".into()];
/// net.op.push(OperatorDef::new("FC", ["data", "w"], ["fc"]));
/// net.op.push(OperatorDef::new("Softmax", ["fc"], ["prob"]));
/// net.op.push(OperatorDef::new("Print", ["fc"], ["debug"]));
///
/// let mut g = Graph::new(&net);
/// // `fc` (version 1) is read by ops 1 and 2.
/// assert_eq!(g.consumers("fc", 1).len(), 2);
/// // Renaming the Softmax input alone would disconnect it from the Print op's value...
/// assert!(g.rename_op_input(1, 0, "logits", false).is_err());
/// // ...renaming at the producer renames the value everywhere.
/// g.rename_op_input(1, 0, "logits", true).unwrap();
/// assert_eq!(g.remove_dead_end_ops(), vec![2]); // Print reaches no external output
///
/// let out = g.net().to_net_def().unwrap();
/// assert_eq!(out.op.len(), 2);
/// assert_eq!(out.op[0].output, ["logits"]);
/// assert_eq!(out.op[1].input, ["logits"]);
/// ```
#[derive(Debug, Clone)]
pub struct Graph<'a> {
    net: Editable<'a>,
    init: Option<Editable<'a>>,
    /// Built on first use after each edit, so a single edit followed by writing the net out
    /// computes the SSA form once.
    index: OnceLock<Index>,
}

/// The SSA forms of the nets and the producer/consumer maps of the predict net.
#[derive(Debug, Clone)]
struct Index {
    ssa: Ssa,
    init_ssa: Option<Ssa>,
    /// Producer slot of each value (the last one if an op lists an output twice).
    producers: Vec<Option<OpSlot>>,
    /// Consumers of each value, CSR: value `v` has `consumers[cons_off[v]..cons_off[v+1]]`.
    cons_off: Vec<u32>,
    consumers: Vec<OpSlot>,
}

impl Index {
    fn build(net: &NetIo, init: Option<&NetIo>) -> Self {
        let init_ssa = init.map(|init| Ssa::compute_unchecked(init, None));
        let start: Vec<(&str, Version)> = match &init_ssa {
            Some(s) => s.blob_versions().collect(),
            None => Vec::new(),
        };
        let ssa = Ssa::compute_unchecked(net, Some(&start));
        let nv = ssa.num_values();
        let mut producers = vec![None; nv];
        let mut count = vec![0u32; nv + 1];
        for op in 0..ssa.len() {
            for (index, s) in ssa.outputs(op).iter().enumerate() {
                producers[s.value.index()] = Some(OpSlot { op, index });
            }
            for s in ssa.inputs(op) {
                count[s.value.index() + 1] += 1;
            }
        }
        for i in 0..nv {
            count[i + 1] += count[i];
        }
        let mut fill = count.clone();
        let mut consumers = vec![OpSlot { op: 0, index: 0 }; count[nv] as usize];
        for op in 0..ssa.len() {
            for (index, s) in ssa.inputs(op).iter().enumerate() {
                let at = &mut fill[s.value.index()];
                consumers[*at as usize] = OpSlot { op, index };
                *at += 1;
            }
        }
        Index {
            ssa,
            init_ssa,
            producers,
            cons_off: count,
            consumers,
        }
    }

    fn value_consumers(&self, v: ValueId) -> &[OpSlot] {
        &self.consumers[self.cons_off[v.index()] as usize..self.cons_off[v.index() + 1] as usize]
    }
}

/// One edited net of a [`Graph`], ready to be written out.
#[derive(Debug, Clone, Copy)]
pub struct EditedNet<'g, 'a> {
    net: &'g Editable<'a>,
}

impl EditedNet<'_, '_> {
    /// The edited net as a message.
    pub fn to_net_def(&self) -> Result<NetDef> {
        self.net.to_net_def()
    }

    /// The edited net, serialized.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.net.to_bytes()
    }

    /// Its current shape.
    pub fn io(&self) -> &NetIo {
        &self.net.io
    }
}

impl<'a> Graph<'a> {
    /// A graph over `net`.
    pub fn new(net: &'a NetDef) -> Self {
        Self::build(Editable::from_net(net), None)
    }

    /// A graph over a serialized `caffe2.NetDef`.
    pub fn from_bytes(bytes: &'a [u8]) -> Result<Self> {
        Ok(Self::build(Editable::from_bytes(bytes)?, None))
    }

    /// Adds the init net that fills the predict net's parameters (renames keep it in step).
    pub fn with_init_net(self, init: &'a NetDef) -> Self {
        Self::build(self.net, Some(Editable::from_net(init)))
    }

    /// [`Graph::with_init_net`] from a serialized `caffe2.NetDef`.
    pub fn with_init_net_bytes(self, init: &'a [u8]) -> Result<Self> {
        Ok(Self::build(self.net, Some(Editable::from_bytes(init)?)))
    }

    fn build(net: Editable<'a>, init: Option<Editable<'a>>) -> Self {
        Graph {
            net,
            init,
            index: OnceLock::new(),
        }
    }

    fn ix(&self) -> &Index {
        self.index
            .get_or_init(|| Index::build(&self.net.io, self.init.as_ref().map(|e| &e.io)))
    }

    /// The index, taken out for an edit (the graph is re-indexed on next use).
    fn take_index(&mut self) -> Index {
        match self.index.take() {
            Some(ix) => ix,
            None => Index::build(&self.net.io, self.init.as_ref().map(|e| &e.io)),
        }
    }

    /// The predict net.
    pub fn net(&self) -> EditedNet<'_, 'a> {
        EditedNet { net: &self.net }
    }

    /// The init net, if one was given.
    pub fn init_net(&self) -> Option<EditedNet<'_, 'a>> {
        self.init.as_ref().map(|net| EditedNet { net })
    }

    /// The SSA form of the predict net (versions start from the init net's, if any).
    pub fn ssa(&self) -> &Ssa {
        &self.ix().ssa
    }

    /// Number of ops in the predict net.
    pub fn num_ops(&self) -> usize {
        self.net.io.num_ops()
    }

    /// The type of op `op`.
    pub fn op_type(&self, op: usize) -> &str {
        self.net.io.op_type(op)
    }

    /// The op output that produces `(name, version)`, if an op of the net does. (One lookup
    /// scans the values; use [`Graph::producer_map`] for many.)
    pub fn producer(&self, name: &str, version: Version) -> Option<OpSlot> {
        self.ix()
            .ssa
            .find_value(name, version)
            .and_then(|v| self.ix().producers[v.index()])
    }

    /// The op inputs that read `(name, version)`, in op order. (One lookup scans the values;
    /// use [`Graph::consumer_map`] for many.)
    pub fn consumers(&self, name: &str, version: Version) -> &[OpSlot] {
        match self.ix().ssa.find_value(name, version) {
            Some(v) => self.ix().value_consumers(v),
            None => &[],
        }
    }

    /// Every produced `(name, version)` with its producer, ordered by first production.
    pub fn producer_map(&self) -> Vec<((&str, Version), OpSlot)> {
        let ssa = &self.ix().ssa;
        self.producer_map_by_value()
            .into_iter()
            .map(|(v, p)| {
                let (b, ver) = ssa.value(v);
                ((ssa.name(b), ver), p)
            })
            .collect()
    }

    /// [`Graph::producer_map`] keyed by value id (resolve with `graph.ssa().value(v)`).
    pub fn producer_map_by_value(&self) -> Vec<(ValueId, OpSlot)> {
        self.ix()
            .ssa
            .output_producers()
            .into_iter()
            .filter_map(|(v, _)| self.ix().producers[v.index()].map(|p| (v, p)))
            .collect()
    }

    /// Every read `(name, version)` with its consumers (in op order), ordered by first read.
    pub fn consumer_map(&self) -> Vec<((&str, Version), &[OpSlot])> {
        let ssa = &self.ix().ssa;
        self.consumer_map_by_value()
            .into_iter()
            .map(|(v, c)| {
                let (b, ver) = ssa.value(v);
                ((ssa.name(b), ver), c)
            })
            .collect()
    }

    /// [`Graph::consumer_map`] keyed by value id (resolve with `graph.ssa().value(v)`).
    pub fn consumer_map_by_value(&self) -> Vec<(ValueId, &[OpSlot])> {
        let ssa = &self.ix().ssa;
        let mut seen = vec![false; ssa.num_values()];
        let mut out = Vec::new();
        for op in 0..ssa.len() {
            for s in ssa.inputs(op) {
                if !std::mem::replace(&mut seen[s.value.index()], true) {
                    out.push((s.value, self.ix().value_consumers(s.value)));
                }
            }
        }
        out
    }

    /// The final version of each external output, as Caffe2 export code versions them.
    /// Entries that no op reads or writes are left out.
    pub fn versioned_external_outputs(&self) -> Vec<(&str, Version)> {
        let ssa = &self.ix().ssa;
        self.external_output_values()
            .into_iter()
            .map(|v| {
                let (b, ver) = ssa.value(v);
                (ssa.name(b), ver)
            })
            .collect()
    }

    fn external_output_values(&self) -> Vec<ValueId> {
        let mut out = Vec::new();
        for &b in self.net.io.external_outputs() {
            let name = self.net.io.name(b);
            let version = self.ix().ssa.version(name).unwrap_or(0);
            if let Some(v) = self.final_value(b, version) {
                if !out.contains(&v) {
                    out.push(v);
                }
            }
        }
        out
    }

    /// The value of `blob` at `version` (its final version), if any op touches it.
    fn final_value(&self, blob: BlobId, version: Version) -> Option<ValueId> {
        let ssa = &self.ix().ssa;
        // The final version is written by the last op that outputs the blob, or (if none
        // does) read by some op at its starting version.
        for op in (0..ssa.len()).rev() {
            if let Some(s) = ssa.outputs(op).iter().find(|s| s.blob == blob) {
                return Some(s.value);
            }
        }
        (0..ssa.len())
            .flat_map(|op| ssa.inputs(op).iter())
            .find(|s| s.blob == blob && s.version == version)
            .map(|s| s.value)
    }

    fn check_op(&self, op: usize) -> Result<()> {
        if op < self.num_ops() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "op index {op} is out of range: the net has {} ops",
                self.num_ops()
            )))
        }
    }

    fn check_name(new_name: &str) -> Result<()> {
        if new_name.is_empty() {
            Err(Error::InvalidArgument(
                "the new blob name must not be empty".into(),
            ))
        } else {
            Ok(())
        }
    }

    /// Renames input `input` of op `op` to `new_name`, as a versioned blob: the op that
    /// produces that version (in the predict net, or in the init net when the version is the
    /// one the predict net starts with), every op that reads it, and the external input and
    /// output entries that stand for it are renamed together, so the net computes the same.
    ///
    /// Unless `at_producer` is set, this is refused with [`Error::IllegalGraphTransform`]
    /// when other ops read the same version (they would be renamed too).
    pub fn rename_op_input(
        &mut self,
        op: usize,
        input: usize,
        new_name: &str,
        at_producer: bool,
    ) -> Result<()> {
        self.check_op(op)?;
        Self::check_name(new_name)?;
        let ix = self.ix();
        let Some(&slot) = ix.ssa.inputs(op).get(input) else {
            return Err(Error::InvalidArgument(format!(
                "op #{op} ({}) has {} inputs; there is no input {input}",
                self.op_type(op),
                ix.ssa.inputs(op).len()
            )));
        };
        let old_name = ix.ssa.name(slot.blob).to_string();
        if !at_producer {
            let mut others: Vec<usize> = ix
                .value_consumers(slot.value)
                .iter()
                .map(|c| c.op)
                .filter(|&o| o != op)
                .collect();
            others.dedup();
            if !others.is_empty() {
                let list: Vec<String> = others
                    .iter()
                    .map(|&o| format!("#{o} ({})", self.op_type(o)))
                    .collect();
                return Err(Error::IllegalGraphTransform(format!(
                    "input {input} of op #{op} ({}) is blob '{old_name}' at version {}, which \
                     op(s) {} also read; rename it at its producer instead",
                    self.op_type(op),
                    slot.version,
                    list.join(", ")
                )));
            }
        }
        if old_name == new_name {
            return Ok(());
        }
        let ix = self.take_index();
        let start = ix
            .init_ssa
            .as_ref()
            .and_then(|s| s.version(&old_name))
            .unwrap_or(0);
        let end = ix.ssa.version(&old_name).unwrap_or(0);
        if slot.version == start {
            if let (Some(init), Some(init_ssa)) = (self.init.as_mut(), ix.init_ssa.as_ref()) {
                let iv = init_ssa.find_value(&old_name, slot.version);
                let init_end = init_ssa.version(&old_name).unwrap_or(0);
                init.rename_version(init_ssa, &old_name, slot.version, iv, new_name, 0, init_end);
            }
        }
        self.net.rename_version(
            &ix.ssa,
            &old_name,
            slot.version,
            Some(slot.value),
            new_name,
            start,
            end,
        );
        Ok(())
    }

    /// Renames output `output` of op `op` to `new_name`, with every op that reads that version
    /// and the external output entry if it is the net's final version of the blob.
    pub fn rename_op_output(&mut self, op: usize, output: usize, new_name: &str) -> Result<()> {
        self.check_op(op)?;
        Self::check_name(new_name)?;
        let ix = self.ix();
        let Some(&slot) = ix.ssa.outputs(op).get(output) else {
            return Err(Error::InvalidArgument(format!(
                "op #{op} ({}) has {} outputs; there is no output {output}",
                self.op_type(op),
                ix.ssa.outputs(op).len()
            )));
        };
        if ix.ssa.name(slot.blob) == new_name {
            return Ok(());
        }
        let ix = self.take_index();
        let old_name = ix.ssa.name(slot.blob);
        let end = ix.ssa.version(old_name).unwrap_or(0);
        self.net.rename_version(
            &ix.ssa,
            old_name,
            slot.version,
            Some(slot.value),
            new_name,
            Version::MIN,
            end,
        );
        Ok(())
    }

    /// Removes the given ops (indices before the call; duplicates are fine).
    pub fn remove_ops(&mut self, ops: &[usize]) -> Result<()> {
        let mut keep = vec![true; self.num_ops()];
        for &op in ops {
            self.check_op(op)?;
            keep[op] = false;
        }
        self.index.take();
        self.net.retain_ops(&keep);
        Ok(())
    }

    /// Removes the ops none of whose outputs reach the external outputs (directly, or through
    /// ops that are kept), and returns their indices (before removal), ascending. Ops without
    /// outputs are removed too; a net without external outputs loses every op.
    pub fn remove_dead_end_ops(&mut self) -> Vec<usize> {
        let n = self.num_ops();
        let ix = self.ix();
        let mut live = vec![false; ix.ssa.num_values()];
        for v in self.external_output_values() {
            live[v.index()] = true;
        }
        let mut keep = vec![false; n];
        for op in (0..n).rev() {
            if ix.ssa.outputs(op).iter().any(|s| live[s.value.index()]) {
                keep[op] = true;
                for s in ix.ssa.inputs(op) {
                    live[s.value.index()] = true;
                }
            }
        }
        let removed: Vec<usize> = (0..n).filter(|&i| !keep[i]).collect();
        if !removed.is_empty() {
            self.index.take();
            self.net.retain_ops(&keep);
        }
        removed
    }

    /// The external inputs and outputs of the sub-graph made of `ops` (in the order given;
    /// repeated indices count once).
    pub fn sub_graph_io(&self, ops: &[usize]) -> Result<SubGraphIo> {
        let ssa = &self.ix().ssa;
        let mut inside = vec![false; self.num_ops()];
        let mut order = Vec::with_capacity(ops.len());
        for &op in ops {
            self.check_op(op)?;
            if !std::mem::replace(&mut inside[op], true) {
                order.push(op);
            }
        }
        let nv = ssa.num_values();
        let mut produced = vec![false; nv];
        for &op in &order {
            for s in ssa.outputs(op) {
                produced[s.value.index()] = true;
            }
        }
        let mut external = vec![false; nv];
        for v in self.external_output_values() {
            external[v.index()] = true;
        }
        let named = |v: ValueId| {
            let (b, ver) = ssa.value(v);
            (ssa.name(b).to_string(), ver)
        };
        let mut seen = vec![false; nv];
        let mut io = SubGraphIo::default();
        for &op in &order {
            for s in ssa.inputs(op) {
                let v = s.value.index();
                if !produced[v] && !std::mem::replace(&mut seen[v], true) {
                    io.inputs.push(named(s.value));
                }
            }
        }
        for &op in &order {
            for s in ssa.outputs(op) {
                let v = s.value.index();
                if seen[v] {
                    continue;
                }
                let read_outside = self
                    .ix()
                    .value_consumers(s.value)
                    .iter()
                    .any(|c| !inside[c.op]);
                if external[v] || read_outside {
                    seen[v] = true;
                    io.outputs.push(named(s.value));
                }
            }
        }
        Ok(io)
    }

    /// Maximal chains of ops of type `op_type` in which each op feeds the next one and nothing
    /// else: every output of an op that anything reads is read only by the next op of the
    /// chain, none is a final external output, and the next op has no other such predecessor.
    /// Chains shorter than `min_length` are left out; chains are ordered by their first op.
    ///
    /// ```
    /// use ferrocaffe::graph::Graph;
    /// use ferrocaffe::proto::{NetDef, OperatorDef};
    ///
    /// let mut net = NetDef::default();
    /// net.external_output.push("out".into());
    /// for (t, i, o) in [("Relu", "x", "a"), ("Relu", "a", "a"), ("Relu", "a", "b"),
    ///                   ("Sigmoid", "b", "c"), ("Relu", "c", "out")] {
    ///     net.op.push(OperatorDef::new(t, [i], [o]));
    /// }
    /// let g = Graph::new(&net);
    /// assert_eq!(g.find_chains("Relu", 2), vec![vec![0, 1, 2]]);
    /// assert_eq!(g.find_chains("Relu", 1), vec![vec![0, 1, 2], vec![4]]);
    /// ```
    pub fn find_chains(&self, op_type: &str, min_length: usize) -> Vec<Vec<usize>> {
        let ssa = &self.ix().ssa;
        let Some(t) = self.net.io.type_id(op_type) else {
            return Vec::new();
        };
        let n = self.num_ops();
        let is_t: Vec<bool> = (0..n).map(|op| self.net.io.op_type_id(op) == t).collect();
        let mut external = vec![false; ssa.num_values()];
        for v in self.external_output_values() {
            external[v.index()] = true;
        }
        const NO: usize = usize::MAX;
        let mut next = vec![NO; n];
        let mut preds = vec![0u32; n];
        for a in (0..n).filter(|&a| is_t[a]) {
            let mut succ = NO;
            let mut ok = true;
            for s in ssa.outputs(a) {
                if external[s.value.index()] {
                    ok = false;
                    break;
                }
                for c in self.ix().value_consumers(s.value) {
                    if succ == NO {
                        succ = c.op;
                    } else if succ != c.op {
                        ok = false;
                    }
                }
            }
            if ok && succ != NO && is_t[succ] {
                next[a] = succ;
                preds[succ] += 1;
            }
        }
        let mut chains = Vec::new();
        for a in (0..n).filter(|&a| is_t[a]) {
            if preds[a] == 1 {
                continue;
            }
            let mut chain = vec![a];
            let mut cur = a;
            while next[cur] != NO && preds[next[cur]] == 1 {
                cur = next[cur];
                chain.push(cur);
            }
            if chain.len() >= min_length.max(1) {
                chains.push(chain);
            }
        }
        chains
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::proto::{encode, Argument};

    fn op(t: &str, i: &[&str], o: &[&str]) -> OperatorDef {
        OperatorDef::new(t, i.iter().copied(), o.iter().copied())
    }

    fn net(ops: Vec<OperatorDef>, ext_in: &[&str], ext_out: &[&str]) -> NetDef {
        NetDef {
            name: Some("predict".into()),
            op: ops,
            external_input: ext_in.iter().map(|s| s.to_string()).collect(),
            external_output: ext_out.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    /// Both sources must produce the same edited net.
    fn both<F: Fn(&mut Graph) -> R, R: PartialEq + std::fmt::Debug>(
        net: &NetDef,
        f: F,
    ) -> (NetDef, R) {
        let bytes = encode(net);
        let mut a = Graph::new(net);
        let mut b = Graph::from_bytes(&bytes).unwrap();
        let ra = f(&mut a);
        let rb = f(&mut b);
        assert_eq!(ra, rb);
        let na = a.net().to_net_def().unwrap();
        let nb: NetDef = proto::decode(&b.net().to_bytes().unwrap()).unwrap();
        assert_eq!(na, nb);
        assert_eq!(na, b.net().to_net_def().unwrap());
        assert_eq!(
            na,
            proto::decode::<NetDef>(&a.net().to_bytes().unwrap()).unwrap()
        );
        (na, ra)
    }

    fn model() -> NetDef {
        let mut fc = op("FC", &["data", "w", "b"], &["fc"]);
        fc.arg.push(Argument {
            name: Some("axis".into()),
            i: Some(1),
            ..Default::default()
        });
        net(
            vec![
                fc,
                op("Relu", &["fc"], &["fc"]),
                op("Softmax", &["fc"], &["prob"]),
                op("Print", &["fc"], &[]),
            ],
            &["data", "w", "b"],
            &["prob"],
        )
    }

    #[test]
    fn producer_and_consumer_maps() {
        let m = model();
        let g = Graph::new(&m);
        assert_eq!(g.producer("fc", 1), Some(OpSlot { op: 0, index: 0 }));
        assert_eq!(g.producer("fc", 2), Some(OpSlot { op: 1, index: 0 }));
        assert_eq!(g.producer("data", 0), None);
        assert_eq!(
            g.consumers("fc", 2),
            [OpSlot { op: 2, index: 0 }, OpSlot { op: 3, index: 0 }]
        );
        assert_eq!(g.consumers("fc", 9), []);
        let pm: Vec<_> = g
            .producer_map()
            .into_iter()
            .map(|((n, v), p)| (n.to_string(), v, p.op))
            .collect();
        assert_eq!(
            pm,
            [
                ("fc".to_string(), 1, 0),
                ("fc".into(), 2, 1),
                ("prob".into(), 1, 2)
            ]
        );
        let cm: Vec<_> = g
            .consumer_map()
            .into_iter()
            .map(|((n, v), c)| (n.to_string(), v, c.len()))
            .collect();
        assert_eq!(
            cm,
            [
                ("data".to_string(), 0, 1),
                ("w".into(), 0, 1),
                ("b".into(), 0, 1),
                ("fc".into(), 1, 1),
                ("fc".into(), 2, 2)
            ]
        );
        assert_eq!(g.versioned_external_outputs(), [("prob", 1)]);
    }

    #[test]
    fn rename_input_refuses_shared_versions() {
        let m = model();
        let (_, r) = both(&m, |g| {
            let e = g.rename_op_input(2, 0, "x", false).unwrap_err();
            assert!(matches!(e, Error::IllegalGraphTransform(_)));
            let msg = e.to_string();
            assert!(msg.contains("'fc'") && msg.contains("#3 (Print)"), "{msg}");
            true
        });
        assert!(r);
    }

    #[test]
    fn rename_input_at_producer_renames_the_version_only() {
        let m = model();
        let (out, _) = both(&m, |g| g.rename_op_input(2, 0, "relu_out", true).unwrap());
        assert_eq!(out.op[0].output, ["fc"]);
        assert_eq!(out.op[1].input, ["fc"]);
        assert_eq!(out.op[1].output, ["relu_out"]);
        assert_eq!(out.op[2].input, ["relu_out"]);
        assert_eq!(out.op[3].input, ["relu_out"]);
        // Untouched fields survive.
        assert_eq!(out.op[0].arg, m.op[0].arg);
        assert_eq!(out.name.as_deref(), Some("predict"));
    }

    #[test]
    fn rename_sole_consumer_updates_external_input_and_init_net() {
        let predict = net(
            vec![op("FC", &["data", "w", "b"], &["y"])],
            &["data", "w", "b"],
            &["y"],
        );
        let init = net(
            vec![
                op("GivenTensorFill", &[], &["w"]),
                op("GivenTensorFill", &[], &["b"]),
            ],
            &[],
            &["w", "b"],
        );
        let pb = encode(&predict);
        let ib = encode(&init);
        for from_bytes in [false, true] {
            let mut g = if from_bytes {
                Graph::from_bytes(&pb)
                    .unwrap()
                    .with_init_net_bytes(&ib)
                    .unwrap()
            } else {
                Graph::new(&predict).with_init_net(&init)
            };
            // Parameters are read at the init net's version.
            assert_eq!(
                g.ssa().versioned_inputs(0).collect::<Vec<_>>(),
                [("data", 0), ("w", 1), ("b", 1)]
            );
            g.rename_op_input(0, 1, "fc_w", false).unwrap();
            g.rename_op_input(0, 0, "input", false).unwrap();
            let p = g.net().to_net_def().unwrap();
            let i = g.init_net().unwrap().to_net_def().unwrap();
            let pi: NetDef = proto::decode(&g.net().to_bytes().unwrap()).unwrap();
            assert_eq!(p, pi);
            assert_eq!(p.op[0].input, ["input", "fc_w", "b"]);
            assert_eq!(p.external_input, ["input", "fc_w", "b"]);
            assert_eq!(i.op[0].output, ["fc_w"]);
            assert_eq!(i.op[1].output, ["b"]);
            assert_eq!(i.external_output, ["fc_w", "b"]);
            assert_eq!(
                g.ssa().versioned_inputs(0).collect::<Vec<_>>(),
                [("input", 0), ("fc_w", 1), ("b", 1)]
            );
        }
    }

    #[test]
    fn rename_output_and_in_place_reshape_removal() {
        // data -> Reshape -> r -> FC, renamed so Reshape becomes in place.
        let m = net(
            vec![
                op("Reshape", &["data", "shape"], &["r", "old_shape"]),
                op("FC", &["r", "w"], &["y"]),
            ],
            &["data", "shape", "w"],
            &["y"],
        );
        let (out, _) = both(&m, |g| {
            g.rename_op_output(0, 0, "data").unwrap();
            assert_eq!(
                g.ssa().versioned_inputs(1).collect::<Vec<_>>(),
                [("data", 1), ("w", 0)]
            );
        });
        assert_eq!(out.op[0].output, ["data", "old_shape"]);
        assert_eq!(out.op[1].input, ["data", "w"]);
        // External output renamed when it is the final version.
        let (out, _) = both(&m, |g| g.rename_op_output(1, 0, "logits").unwrap());
        assert_eq!(out.external_output, ["logits"]);
        let mut g = Graph::new(&m);
        assert!(g.rename_op_output(0, 5, "z").is_err());
        assert!(g.rename_op_output(7, 0, "z").is_err());
        assert!(g.rename_op_output(0, 0, "").is_err());
        assert!(g.rename_op_input(0, 2, "z", true).is_err());
        // Renaming to the same name is a no-op.
        g.rename_op_output(0, 0, "r").unwrap();
        assert_eq!(g.net().to_net_def().unwrap(), m);
    }

    #[test]
    fn renaming_a_non_final_version_keeps_external_output() {
        let m = net(
            vec![op("Relu", &["x"], &["y"]), op("Relu", &["y"], &["y"])],
            &["x"],
            &["y"],
        );
        let (out, _) = both(&m, |g| g.rename_op_output(0, 0, "t").unwrap());
        assert_eq!(out.op[0].output, ["t"]);
        assert_eq!(out.op[1].input, ["t"]);
        assert_eq!(out.op[1].output, ["y"]);
        assert_eq!(out.external_output, ["y"]);
    }

    #[test]
    fn dead_ends_are_removed() {
        let m = net(
            vec![
                op("Relu", &["x"], &["a"]),
                op("Print", &["a"], &[]),
                op("Relu", &["a"], &["dead"]),
                op("Relu", &["dead"], &["dead2"]),
                op("Relu", &["a"], &["y"]),
                op("Relu", &["y"], &["y"]),
            ],
            &["x"],
            &["y"],
        );
        let (out, removed) = both(&m, |g| g.remove_dead_end_ops());
        assert_eq!(removed, [1, 2, 3]);
        let types: Vec<_> = out.op.iter().map(|o| o.output.clone()).collect();
        assert_eq!(
            types,
            [vec!["a".to_string()], vec!["y".into()], vec!["y".into()]]
        );
        // Nothing left to remove the second time; no external outputs removes everything.
        let mut g = Graph::new(&out);
        assert!(g.remove_dead_end_ops().is_empty());
        let mut bare = m.clone();
        bare.external_output.clear();
        let mut g = Graph::new(&bare);
        assert_eq!(g.remove_dead_end_ops().len(), 6);
        assert_eq!(g.num_ops(), 0);
    }

    #[test]
    fn remove_ops_then_rename_maps_indices() {
        let m = model();
        let (out, _) = both(&m, |g| {
            g.remove_ops(&[3, 3]).unwrap();
            g.rename_op_input(2, 0, "z", false).unwrap();
        });
        assert_eq!(out.op.len(), 3);
        assert_eq!(out.op[1].output, ["z"]);
        assert_eq!(out.op[2].input, ["z"]);
        assert!(Graph::new(&m).remove_ops(&[4]).is_err());
    }

    #[test]
    fn sub_graph_boundaries() {
        let m = net(
            vec![
                op("Shape", &["x"], &["s"]),
                op("Slice", &["s"], &["s2"]),
                op("Reshape", &["x", "s2"], &["r", "old"]),
                op("FC", &["r", "w"], &["y"]),
            ],
            &["x", "w"],
            &["y", "old"],
        );
        let g = Graph::new(&m);
        let io = g.sub_graph_io(&[0, 1, 2, 1]).unwrap();
        assert_eq!(io.inputs, [("x".to_string(), 0)]);
        assert_eq!(io.outputs, [("r".to_string(), 1), ("old".to_string(), 1)]);
        let io = g.sub_graph_io(&[1]).unwrap();
        assert_eq!(io.inputs, [("s".to_string(), 1)]);
        assert_eq!(io.outputs, [("s2".to_string(), 1)]);
        assert!(g.sub_graph_io(&[9]).is_err());
        assert_eq!(g.sub_graph_io(&[]).unwrap(), SubGraphIo::default());
    }

    #[test]
    fn chains_stop_at_branches_and_external_outputs() {
        let m = net(
            vec![
                op("Copy", &["a"], &["b"]),      // 0
                op("Copy", &["b"], &["c"]),      // 1: c read by 2 and 3 -> chain ends here
                op("Copy", &["c"], &["d"]),      // 2
                op("Copy", &["c"], &["e"]),      // 3
                op("Copy", &["e"], &["f"]),      // 4
                op("Copy", &["f"], &["g"]),      // 5: g is an external output
                op("Copy", &["g"], &["h"]),      // 6
                op("Sum", &["d", "h"], &["s"]),  // 7
                op("Copy", &["p"], &["q"]),      // 8 \ both feed 10
                op("Copy", &["p"], &["r"]),      // 9 /
                op("Copy", &["q", "r"], &["t"]), // 10
            ],
            &["a", "p"],
            &["g", "s", "t"],
        );
        let g = Graph::new(&m);
        assert_eq!(
            g.find_chains("Copy", 1),
            vec![
                vec![0, 1],
                vec![2],
                vec![3, 4, 5],
                vec![6],
                vec![8],
                vec![9],
                vec![10]
            ]
        );
        assert_eq!(g.find_chains("Copy", 2), vec![vec![0, 1], vec![3, 4, 5]]);
        assert!(g.find_chains("Nope", 1).is_empty());
    }

    #[test]
    fn unknown_fields_survive_a_byte_level_edit() {
        let m = model();
        let mut bytes = encode(&m);
        bytes.extend_from_slice(&[0xa0, 0x06, 0x05]); // unknown top-level field 100
        let mut g = Graph::from_bytes(&bytes).unwrap();
        g.rename_op_output(2, 0, "p").unwrap();
        let out = g.net().to_bytes().unwrap();
        assert!(out.windows(3).any(|w| w == [0xa0, 0x06, 0x05]));
        let back: NetDef = proto::decode(&out).unwrap();
        assert_eq!(back.external_output, ["p"]);
        assert!(Graph::from_bytes(&[0x12, 0x09]).is_err());
    }
}
