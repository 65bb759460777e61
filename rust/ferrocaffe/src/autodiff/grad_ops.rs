//! The gradient ops of a backward pass as they are made, by index (gradient generators refer
//! to them by index, and gradient accumulation may rename their outputs).
//!
//! Kept as `OperatorDef`s, or streamed: an op that no recorded generator refers to can never
//! change again, so it is serialized as soon as it is made and dropped; only the others stay
//! decoded until the end. A large backward pass then holds its gradient ops as bytes.

use prost::Message;

use crate::error::{Error, Result};
use crate::graph::intern::{BlobId, Names};
use crate::proto::OperatorDef;

/// Mutable access to gradient ops by index, for gradient accumulation.
pub trait GradOpsAccess {
    /// The gradient op at `k`, if it can still be changed.
    fn op_mut(&mut self, k: usize) -> Option<&mut OperatorDef>;
    /// The gradient op at `k`, if it can still be changed.
    fn op(&self, k: usize) -> Option<&OperatorDef>;
}

impl GradOpsAccess for [OperatorDef] {
    fn op_mut(&mut self, k: usize) -> Option<&mut OperatorDef> {
        self.get_mut(k)
    }
    fn op(&self, k: usize) -> Option<&OperatorDef> {
        self.get(k)
    }
}

impl GradOpsAccess for Vec<OperatorDef> {
    fn op_mut(&mut self, k: usize) -> Option<&mut OperatorDef> {
        self.get_mut(k)
    }
    fn op(&self, k: usize) -> Option<&OperatorDef> {
        self.get(k)
    }
}

#[derive(Clone, Copy)]
enum Entry {
    /// Serialized: the byte range in `buf` (the whole `op` entry of a NetDef).
    Done(u32, u32),
    /// Kept: the index in `kept`.
    Kept(u32),
}

/// The gradient ops made so far.
pub(crate) struct GradOps {
    stream: bool,
    entries: Vec<Entry>,
    kept: Vec<OperatorDef>,
    /// `op` entries (field 2 of a NetDef) of the serialized ops.
    buf: Vec<u8>,
    /// Output names of the serialized ops, concatenated, and where each ends.
    names: Option<(String, Vec<usize>)>,
}

impl GradOps {
    /// Every op kept as an `OperatorDef`.
    pub(crate) fn kept(capacity: usize) -> Self {
        GradOps {
            stream: false,
            entries: Vec::new(),
            kept: Vec::with_capacity(capacity),
            buf: Vec::new(),
            names: None,
        }
    }

    /// Ops serialized as soon as nothing can change them; with `names`, their output names
    /// are collected too.
    pub(crate) fn streamed(capacity: usize, names: bool) -> Self {
        GradOps {
            stream: true,
            entries: Vec::with_capacity(capacity),
            kept: Vec::new(),
            buf: Vec::with_capacity(capacity * 64),
            names: names.then(|| (String::new(), Vec::with_capacity(capacity * 2))),
        }
    }

    /// Number of ops.
    pub(crate) fn len(&self) -> usize {
        if self.stream {
            self.entries.len()
        } else {
            self.kept.len()
        }
    }

    /// Appends `op`; `pinned` when a recorded generator refers to it (it may be renamed).
    pub(crate) fn push(&mut self, op: OperatorDef, pinned: bool) {
        if !self.stream {
            self.kept.push(op);
            return;
        }
        if pinned {
            self.entries.push(Entry::Kept(self.kept.len() as u32));
            self.kept.push(op);
            return;
        }
        let start = self.buf.len();
        write_entry(&op, &mut self.buf);
        self.entries
            .push(Entry::Done(start as u32, self.buf.len() as u32));
        if let Some((text, ends)) = &mut self.names {
            for o in &op.output {
                text.push_str(o);
                ends.push(text.len());
            }
        }
    }

    /// Appends a gradient op made over ids ([`super::interned`]): type `op_type`, empty name,
    /// the given inputs and outputs, the arguments, device option and engine of the forward
    /// op `fwd` (when given), and `is_gradient_op` set. A streamed op that nothing can change
    /// is serialized straight from the names, without an `OperatorDef`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push_interned(
        &mut self,
        names: &Names,
        op_type: &str,
        inputs: &[BlobId],
        outputs: &[BlobId],
        fwd: Option<&OperatorDef>,
        pinned: bool,
    ) {
        if !self.stream || pinned {
            let op = interned_op(names, op_type, inputs, outputs, fwd);
            self.push(op, pinned);
            return;
        }
        // The op is written in place after its tag and a one-byte length, which is patched
        // (and widened, for an op of 128 bytes or more) once the length is known.
        let start = self.buf.len();
        self.buf.push(0x12);
        self.buf.push(0);
        let body = &mut self.buf;
        for &id in inputs {
            put_str(body, 1, names.name(id));
        }
        for &id in outputs {
            put_str(body, 2, names.name(id));
        }
        put_str(body, 3, "");
        put_str(body, 4, op_type);
        if let Some(fwd) = fwd {
            for a in &fwd.arg {
                prost::encoding::message::encode(5, a, body);
            }
            if let Some(d) = &fwd.device_option {
                prost::encoding::message::encode(6, d, body);
            }
            if let Some(e) = &fwd.engine {
                put_str(body, 7, e);
            }
        }
        // Field 9 (`is_gradient_op`), varint: true.
        body.extend_from_slice(&[0x48, 0x01]);
        let len = self.buf.len() - start - 2;
        if len < 0x80 {
            self.buf[start + 1] = len as u8;
        } else {
            let mut prefix = Vec::with_capacity(10);
            prost::encoding::encode_varint(len as u64, &mut prefix);
            self.buf
                .splice(start + 1..start + 2, prefix.iter().copied());
        }
        self.entries
            .push(Entry::Done(start as u32, self.buf.len() as u32));
        if let Some((text, ends)) = &mut self.names {
            for &o in outputs {
                text.push_str(names.name(o));
                ends.push(text.len());
            }
        }
    }

    /// The ops, when they were all kept.
    pub(crate) fn into_ops(self) -> Result<Vec<OperatorDef>> {
        if self.stream {
            return Err(Error::Runtime(
                "internal error: streamed gradient ops asked for as operators".into(),
            ));
        }
        Ok(self.kept)
    }

    /// The serialized `caffe2.NetDef` holding the ops (only its `op` field set, as
    /// [`super::net_bytes::encode_ops_as_net`] writes it), and the output names of the ops
    /// (every write, in no particular order) when they were asked for.
    pub(crate) fn finish(self) -> (Vec<u8>, Option<(String, Vec<usize>)>) {
        let GradOps {
            stream,
            entries,
            kept,
            buf,
            mut names,
        } = self;
        let mut add_names = |op: &OperatorDef| {
            if let Some((text, ends)) = &mut names {
                for o in &op.output {
                    text.push_str(o);
                    ends.push(text.len());
                }
            }
        };
        if !stream {
            kept.iter().for_each(&mut add_names);
            return (super::net_bytes::encode_ops_as_net(&kept), names);
        }
        if kept.is_empty() {
            // Every op was serialized in order: the buffer is the net.
            return (buf, names);
        }
        let mut out = Vec::with_capacity(buf.len() + kept.len() * 64);
        for e in entries {
            match e {
                Entry::Done(a, b) => out.extend_from_slice(&buf[a as usize..b as usize]),
                Entry::Kept(i) => {
                    let op = &kept[i as usize];
                    write_entry(op, &mut out);
                    add_names(op);
                }
            }
        }
        (out, names)
    }
}

impl GradOpsAccess for GradOps {
    fn op_mut(&mut self, k: usize) -> Option<&mut OperatorDef> {
        if !self.stream {
            return self.kept.get_mut(k);
        }
        match self.entries.get(k)? {
            Entry::Kept(i) => self.kept.get_mut(*i as usize),
            Entry::Done(..) => None,
        }
    }

    fn op(&self, k: usize) -> Option<&OperatorDef> {
        if !self.stream {
            return self.kept.get(k);
        }
        match self.entries.get(k)? {
            Entry::Kept(i) => self.kept.get(*i as usize),
            Entry::Done(..) => None,
        }
    }
}

/// The `OperatorDef` of a gradient op made over ids (see [`GradOps::push_interned`]).
pub(crate) fn interned_op(
    names: &Names,
    op_type: &str,
    inputs: &[BlobId],
    outputs: &[BlobId],
    fwd: Option<&OperatorDef>,
) -> OperatorDef {
    let name = |&id: &BlobId| names.name(id).to_string();
    let mut op = OperatorDef {
        input: inputs.iter().map(name).collect(),
        output: outputs.iter().map(name).collect(),
        name: Some(String::new()),
        r#type: Some(op_type.to_string()),
        is_gradient_op: Some(true),
        ..Default::default()
    };
    if let Some(fwd) = fwd {
        op.arg.clone_from(&fwd.arg);
        op.device_option.clone_from(&fwd.device_option);
        op.engine.clone_from(&fwd.engine);
    }
    op
}

/// Appends string field `tag` (length-delimited) with value `s`, as prost writes it.
fn put_str(out: &mut Vec<u8>, tag: u32, s: &str) {
    prost::encoding::encode_key(tag, prost::encoding::WireType::LengthDelimited, out);
    prost::encoding::encode_varint(s.len() as u64, out);
    out.extend_from_slice(s.as_bytes());
}

/// Appends `op` as an `op` entry of a NetDef: field 2, length-delimited.
pub(crate) fn write_entry(op: &OperatorDef, out: &mut Vec<u8>) {
    let len = op.encoded_len();
    out.push(0x12);
    prost::encoding::encode_varint(len as u64, out);
    op.encode_raw(out);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::autodiff::net_bytes::encode_ops_as_net;

    fn op(k: usize) -> OperatorDef {
        OperatorDef::new("Relu", [format!("x{k}")], [format!("y{k}")])
    }

    #[test]
    fn streamed_and_kept_ops_serialize_in_order() {
        let ops: Vec<OperatorDef> = (0..5).map(op).collect();
        let mut g = GradOps::streamed(4, true);
        for (k, o) in ops.iter().enumerate() {
            g.push(o.clone(), k % 2 == 1);
        }
        assert_eq!(g.len(), 5);
        // Kept ops can still be changed, serialized ones not.
        g.op_mut(1).unwrap().output[0] = "renamed".into();
        assert!(g.op_mut(0).is_none());
        assert!(g.op_mut(9).is_none());
        let mut expected = ops.clone();
        expected[1].output[0] = "renamed".into();
        let (bytes, names) = g.finish();
        assert_eq!(bytes, encode_ops_as_net(&expected));
        let (text, ends) = names.unwrap();
        assert_eq!(ends.len(), 5);
        assert!(text.contains("renamed") && text.contains("y4"));
    }

    #[test]
    fn interned_ops_serialize_as_their_operator_defs() {
        use crate::proto::{Argument, DeviceOption};
        let mut names = Names::default();
        let ids: Vec<BlobId> = ["x", "w", "y_grad", "x_grad", "é"]
            .iter()
            .map(|n| names.intern(n))
            .collect();
        let mut fwd = OperatorDef::new("FC", ["x", "w"], ["y"]);
        let plain = fwd.clone();
        fwd.arg.push(Argument::int("axis", 2));
        fwd.arg.push(Argument::float("alpha", 0.5));
        fwd.device_option = Some(DeviceOption {
            device_type: Some(1),
            extra_info: vec!["a:1".into()],
            ..Default::default()
        });
        fwd.engine = Some("CUDNN".into());
        let long: Vec<BlobId> = (0..40).map(|k| names.intern(&format!("in{k}"))).collect();
        let cases: Vec<(&[BlobId], &[BlobId], Option<&OperatorDef>)> = vec![
            (&ids[..3], &ids[3..4], None),
            (&ids[..3], &ids[3..], Some(&plain)),
            (&ids[..1], &ids[3..4], Some(&fwd)),
            (&long, &ids[4..], Some(&fwd)),
            (&[], &[], None),
        ];
        let mut streamed = GradOps::streamed(4, true);
        let mut kept = GradOps::kept(4);
        let mut expected = Vec::new();
        for (k, (ins, outs, f)) in cases.iter().enumerate() {
            streamed.push_interned(&names, "FCGradient", ins, outs, *f, k == 1);
            kept.push_interned(&names, "FCGradient", ins, outs, *f, false);
            let op = interned_op(&names, "FCGradient", ins, outs, *f);
            assert_eq!(op.is_gradient_op, Some(true));
            expected.push(op);
        }
        assert_eq!(expected[2].arg, fwd.arg);
        assert_eq!(kept.into_ops().unwrap(), expected);
        let (bytes, out_names) = streamed.finish();
        assert_eq!(bytes, encode_ops_as_net(&expected));
        assert_eq!(out_names.unwrap().1.len(), 1 + 2 + 1 + 1);
    }

    #[test]
    fn kept_ops_come_back() {
        let mut g = GradOps::kept(2);
        g.push(op(0), false);
        g.push(op(1), true);
        assert_eq!(g.op_mut(0).unwrap().r#type(), "Relu");
        assert_eq!(g.into_ops().unwrap(), vec![op(0), op(1)]);
        let mut s = GradOps::streamed(1, false);
        s.push(op(0), false);
        assert!(s.into_ops().is_err());
        let (bytes, names) = GradOps::streamed(0, false).finish();
        assert!(bytes.is_empty() && names.is_none());
    }
}
