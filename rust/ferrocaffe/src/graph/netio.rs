//! [`NetIo`]: the blob-level shape of a net (per op its type, inputs and outputs; the net's
//! external inputs and outputs) with every name interned, read from a `NetDef` or straight
//! from its serialized bytes.

use super::intern::{BlobId, Names};
use super::wire::{self, NetLayout, NetVisitor};
use crate::error::Result;
use crate::proto::NetDef;

/// The blob-level shape of a net, with interned names.
///
/// Op types are interned in their own table ([`NetIo::op_type`] resolves them).
///
/// ```
/// use ferrocaffe::graph::NetIo;
/// use ferrocaffe::proto::{NetDef, OperatorDef};
///
/// let mut net = NetDef::default();
/// net.external_input.push("x".into());
/// net.op.push(OperatorDef::new("Relu", ["x"], ["y"]));
/// net.op.push(OperatorDef::new("Sum", ["x", "y"], ["z"]));
/// let io = NetIo::from_net(&net);
/// assert_eq!(io.num_ops(), 2);
/// assert_eq!(io.op_type(1), "Sum");
/// let inputs: Vec<&str> = io.op_inputs(1).iter().map(|&b| io.name(b)).collect();
/// assert_eq!(inputs, ["x", "y"]);
/// assert_eq!(io.external_inputs().len(), 1);
/// ```
#[derive(Debug, Clone, Default)]
pub struct NetIo {
    names: Names,
    types: Names,
    op_type: Vec<BlobId>,
    in_off: Vec<u32>,
    inputs: Vec<BlobId>,
    out_off: Vec<u32>,
    outputs: Vec<BlobId>,
    external_input: Vec<BlobId>,
    external_output: Vec<BlobId>,
}

impl NetIo {
    fn empty() -> Self {
        NetIo {
            in_off: vec![0],
            out_off: vec![0],
            ..Default::default()
        }
    }

    /// Reads the shape of `net`.
    pub fn from_net(net: &NetDef) -> Self {
        let mut io = NetIo::empty();
        io.names = Names::with_capacity(net.op.len() * 2, net.op.len() * 16);
        for (i, op) in net.op.iter().enumerate() {
            NetVisitor::begin_op(&mut io, i);
            for s in &op.input {
                io.op_input(s);
            }
            for s in &op.output {
                io.op_output(s);
            }
            NetVisitor::op_type(&mut io, op.r#type.as_deref().unwrap_or(""));
            io.end_op();
        }
        for s in &net.external_input {
            NetVisitor::external_input(&mut io, s);
        }
        for s in &net.external_output {
            NetVisitor::external_output(&mut io, s);
        }
        io
    }

    /// Reads the shape of a serialized `caffe2.NetDef`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut io = Self::for_bytes(bytes);
        wire::visit_net(bytes, &mut io)?;
        Ok(io)
    }

    /// Reads the shape of a serialized `caffe2.NetDef`, and where its fields lie.
    pub fn from_bytes_with_layout(bytes: &[u8]) -> Result<(Self, NetLayout)> {
        let mut io = Self::for_bytes(bytes);
        let layout = wire::scan_net(bytes, &mut io)?;
        Ok((io, layout))
    }

    /// An empty shape with room for what `bytes` probably hold (a hint: about 30 bytes per
    /// op; reserving more than is used costs address space, not memory).
    fn for_bytes(bytes: &[u8]) -> Self {
        let mut io = NetIo::empty();
        let ops_hint = bytes.len() / 16;
        io.names = Names::with_capacity(bytes.len() / 24, bytes.len() / 2);
        io.op_type.reserve(ops_hint);
        io.in_off.reserve(ops_hint);
        io.out_off.reserve(ops_hint);
        io.inputs.reserve(ops_hint * 3);
        io.outputs.reserve(ops_hint * 2);
        io
    }

    /// Number of ops.
    pub fn num_ops(&self) -> usize {
        self.op_type.len()
    }

    /// The blob-name table.
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// Moves the blob-name table out (leaving an empty one); the ids stay meaningful for it.
    pub(crate) fn take_names(&mut self) -> Names {
        std::mem::take(&mut self.names)
    }

    /// Interns a blob name (for edits).
    pub fn intern(&mut self, name: &str) -> BlobId {
        self.names.intern(name)
    }

    /// The name of a blob.
    pub fn name(&self, id: BlobId) -> &str {
        self.names.name(id)
    }

    /// The type of op `op` (`""` when unset).
    pub fn op_type(&self, op: usize) -> &str {
        self.types.name(self.op_type[op])
    }

    /// The id of op type `t` in this net, if any op has it.
    pub fn type_id(&self, t: &str) -> Option<BlobId> {
        self.types.get(t)
    }

    /// The interned type of op `op` (compare with [`NetIo::type_id`]).
    pub fn op_type_id(&self, op: usize) -> BlobId {
        self.op_type[op]
    }

    /// The inputs of op `op`.
    pub fn op_inputs(&self, op: usize) -> &[BlobId] {
        &self.inputs[self.in_off[op] as usize..self.in_off[op + 1] as usize]
    }

    /// The outputs of op `op`.
    pub fn op_outputs(&self, op: usize) -> &[BlobId] {
        &self.outputs[self.out_off[op] as usize..self.out_off[op + 1] as usize]
    }

    pub(crate) fn op_inputs_mut(&mut self, op: usize) -> &mut [BlobId] {
        &mut self.inputs[self.in_off[op] as usize..self.in_off[op + 1] as usize]
    }

    pub(crate) fn op_outputs_mut(&mut self, op: usize) -> &mut [BlobId] {
        &mut self.outputs[self.out_off[op] as usize..self.out_off[op + 1] as usize]
    }

    /// The net's `external_input` list.
    pub fn external_inputs(&self) -> &[BlobId] {
        &self.external_input
    }

    /// The net's `external_output` list.
    pub fn external_outputs(&self) -> &[BlobId] {
        &self.external_output
    }

    pub(crate) fn external_inputs_mut(&mut self) -> &mut Vec<BlobId> {
        &mut self.external_input
    }

    pub(crate) fn external_outputs_mut(&mut self) -> &mut Vec<BlobId> {
        &mut self.external_output
    }

    /// Keeps only the ops for which `keep(index)` is true (indices are those before the call).
    pub(crate) fn retain_ops(&mut self, keep: &[bool]) {
        let mut io = NetIo::empty();
        for (op, _) in keep.iter().enumerate().filter(|(_, &k)| k) {
            io.op_type.push(self.op_type[op]);
            io.inputs.extend_from_slice(self.op_inputs(op));
            io.in_off.push(io.inputs.len() as u32);
            io.outputs.extend_from_slice(self.op_outputs(op));
            io.out_off.push(io.outputs.len() as u32);
        }
        self.op_type = io.op_type;
        self.inputs = io.inputs;
        self.in_off = io.in_off;
        self.outputs = io.outputs;
        self.out_off = io.out_off;
    }
}

impl NetVisitor for NetIo {
    #[inline]
    fn begin_op(&mut self, _index: usize) {
        self.op_type.push(BlobId(u32::MAX));
    }
    #[inline]
    fn op_input(&mut self, name: &str) {
        let id = self.names.intern(name);
        self.inputs.push(id);
    }
    #[inline]
    fn op_output(&mut self, name: &str) {
        let id = self.names.intern(name);
        self.outputs.push(id);
    }
    #[inline]
    fn op_type(&mut self, name: &str) {
        let id = self.types.intern(name);
        if let Some(t) = self.op_type.last_mut() {
            *t = id;
        }
    }
    #[inline]
    fn end_op(&mut self) {
        if let Some(t) = self.op_type.last_mut() {
            if t.0 == u32::MAX {
                *t = self.types.intern("");
            }
        }
        self.in_off.push(self.inputs.len() as u32);
        self.out_off.push(self.outputs.len() as u32);
    }
    fn external_input(&mut self, name: &str) {
        let id = self.names.intern(name);
        self.external_input.push(id);
    }
    fn external_output(&mut self, name: &str) {
        let id = self.names.intern(name);
        self.external_output.push(id);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::proto::{encode, OperatorDef};

    fn net() -> NetDef {
        let mut net = NetDef::default();
        net.external_input.push("x".into());
        net.external_output.push("z".into());
        net.op.push(OperatorDef::new("Relu", ["x"], ["y"]));
        let mut untyped = OperatorDef::new("", ["y", "x"], ["z"]);
        untyped.r#type = None;
        net.op.push(untyped);
        net
    }

    #[test]
    fn bytes_and_message_agree() {
        let net = net();
        let a = NetIo::from_net(&net);
        let (b, layout) = NetIo::from_bytes_with_layout(&encode(&net)).unwrap();
        assert_eq!(NetIo::from_bytes(&encode(&net)).unwrap().num_ops(), 2);
        assert_eq!(layout.ops.len(), 2);
        for io in [&a, &b] {
            assert_eq!(io.num_ops(), 2);
            assert_eq!(io.op_type(0), "Relu");
            assert_eq!(io.op_type(1), "");
            let names = |ids: &[BlobId]| {
                ids.iter()
                    .map(|&i| io.name(i).to_string())
                    .collect::<Vec<_>>()
            };
            assert_eq!(names(io.op_inputs(1)), ["y", "x"]);
            assert_eq!(names(io.op_outputs(0)), ["y"]);
            assert_eq!(names(io.external_inputs()), ["x"]);
            assert_eq!(names(io.external_outputs()), ["z"]);
            assert_eq!(io.type_id("Relu"), Some(io.op_type_id(0)));
        }
    }

    #[test]
    fn retain_drops_ops() {
        let mut io = NetIo::from_net(&net());
        io.retain_ops(&[false, true]);
        assert_eq!(io.num_ops(), 1);
        assert_eq!(io.op_inputs(0).len(), 2);
        assert_eq!(io.op_type(0), "");
    }
}
