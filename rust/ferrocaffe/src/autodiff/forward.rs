//! The forward ops an [`super::Ir`] plays: decoded `OperatorDef`s, or serialized ops read in
//! place. Serialized ops lend their names straight from the bytes, and an op is decoded only
//! when its gradient is made, so a backward pass over a large serialized net keeps one
//! decoded op at a time instead of the whole net.

use std::borrow::Cow;

use prost::Message;

use crate::error::{Error, Result};
use crate::graph::wire::quick::{len_delimited, skip, string, varint};
use crate::proto::OperatorDef;

/// Where the forward ops come from.
pub(crate) enum ForwardOps<'a> {
    /// Ops decoded by the caller.
    Decoded(&'a [OperatorDef]),
    /// Serialized ops, read in place.
    Wire(WireOps<'a>),
}

/// Serialized ops: per op the bytes to decode and its type.
pub(crate) struct WireOps<'a> {
    /// Per op: an `op` entry of a `NetDef` (tag and length included) when `in_net`, else a
    /// serialized `OperatorDef`.
    items: Vec<&'a [u8]>,
    in_net: bool,
    types: Vec<&'a str>,
    /// Per scanned op: whether it has only names, all well-formed (see
    /// [`WireOps::names_only`]).
    plain: Vec<bool>,
}

const LEN: u64 = 2;
const OP_INPUT: u64 = 1;
const OP_OUTPUT: u64 = 2;
const OP_NAME: u64 = 3;
const OP_TYPE: u64 = 4;

impl<'a> WireOps<'a> {
    /// Ops given as `op` entries of a serialized `NetDef` (see
    /// [`crate::graph::wire::op_entries`]).
    pub(crate) fn net_entries(items: Vec<&'a [u8]>) -> Self {
        WireOps {
            types: Vec::with_capacity(items.len()),
            plain: Vec::with_capacity(items.len()),
            items,
            in_net: true,
        }
    }

    /// Ops given as serialized `OperatorDef`s.
    pub(crate) fn operators(items: Vec<&'a [u8]>) -> Self {
        WireOps {
            types: Vec::with_capacity(items.len()),
            plain: Vec::with_capacity(items.len()),
            items,
            in_net: false,
        }
    }

    /// Number of ops.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    fn payload(&self, k: usize) -> Option<&'a [u8]> {
        let item = self.items[k];
        if !self.in_net {
            return Some(item);
        }
        let mut pos = 0;
        varint(item, &mut pos)?; // the tag: field 2, length-delimited
        len_delimited(item, &mut pos)
    }

    /// Reads the inputs, outputs and type of op `k` (the type is remembered); `None` if the
    /// op is not plainly well-formed (the caller then decodes the whole net instead).
    pub(crate) fn scan(
        &mut self,
        k: usize,
        ins: &mut Vec<&'a str>,
        outs: &mut Vec<&'a str>,
    ) -> Option<()> {
        let op = self.payload(k)?;
        let mut op_type = "";
        let mut plain = true;
        let mut pos = 0;
        while pos < op.len() {
            let key = varint(op, &mut pos)?;
            let (field, wire) = (key >> 3, key & 7);
            if matches!(field, OP_INPUT | OP_OUTPUT | OP_TYPE) {
                if wire != LEN {
                    return None;
                }
                let s = string(op, &mut pos)?;
                match field {
                    OP_INPUT => ins.push(s),
                    OP_OUTPUT => outs.push(s),
                    _ => op_type = s,
                }
            } else if field == OP_NAME && wire == LEN {
                let name = len_delimited(op, &mut pos)?;
                plain &= name.is_ascii() || std::str::from_utf8(name).is_ok();
            } else {
                if field == 0 {
                    return None;
                }
                plain = false;
                skip(op, &mut pos, wire)?;
            }
        }
        self.types.push(op_type);
        self.plain.push(plain);
        Some(())
    }

    /// Whether op `k` has only names (inputs, outputs, name, type), all well-formed: it then
    /// decodes, and to nothing more than its names, which the IR already has.
    pub(crate) fn names_only(&self, k: usize) -> bool {
        if let Some(&plain) = self.plain.get(k) {
            return plain;
        }
        let Some(op) = self.payload(k) else {
            return false;
        };
        let mut pos = 0;
        while pos < op.len() {
            let Some(key) = varint(op, &mut pos) else {
                return false;
            };
            if key & 7 != LEN || !(1..=4).contains(&(key >> 3)) || string(op, &mut pos).is_none() {
                return false;
            }
        }
        true
    }

    /// Decodes op `k` strictly (no lenient fallback: a failure sends the caller to the
    /// decoding path, which reports it as decoding the whole net does).
    pub(crate) fn decode(&self, k: usize) -> Result<OperatorDef> {
        if let Some(op) = self.payload(k).and_then(decode_names_only) {
            return Ok(op);
        }
        let item = self.items[k];
        let strict = |e: prost::DecodeError| Error::Decode {
            message: "caffe2.OperatorDef",
            reason: format!("operator {k}: {e}"),
        };
        if self.in_net {
            // Decoded as the net's decoder decodes an `op` entry (the same nesting depth).
            let mut buf = item;
            let key = prost::encoding::decode_varint(&mut buf).map_err(strict)?;
            let wire = prost::encoding::WireType::try_from(key & 7).map_err(strict)?;
            let mut op = OperatorDef::default();
            prost::encoding::message::merge(
                wire,
                &mut op,
                &mut buf,
                prost::encoding::DecodeContext::default(),
            )
            .map_err(strict)?;
            Ok(op)
        } else {
            OperatorDef::decode(item).map_err(strict)
        }
    }
}

/// An op whose only fields are inputs, outputs, name and type (most ops of large nets),
/// decoded directly: the same `OperatorDef` as protobuf decoding gives (repeated fields in
/// order, the last value of a singular one). `None` for any other op.
fn decode_names_only(op: &[u8]) -> Option<OperatorDef> {
    let (mut n_in, mut n_out) = (0, 0);
    let mut pos = 0;
    while pos < op.len() {
        let key = varint(op, &mut pos)?;
        if key & 7 != LEN || !(1..=4).contains(&(key >> 3)) {
            return None;
        }
        len_delimited(op, &mut pos)?;
        match key >> 3 {
            OP_INPUT => n_in += 1,
            OP_OUTPUT => n_out += 1,
            _ => {}
        }
    }
    let mut out = OperatorDef {
        input: Vec::with_capacity(n_in),
        output: Vec::with_capacity(n_out),
        ..Default::default()
    };
    pos = 0;
    while pos < op.len() {
        let key = varint(op, &mut pos)?;
        let s = string(op, &mut pos)?.to_string();
        match key >> 3 {
            OP_INPUT => out.input.push(s),
            OP_OUTPUT => out.output.push(s),
            OP_TYPE => out.r#type = Some(s),
            _ => out.name = Some(s),
        }
    }
    Some(out)
}

impl<'a> ForwardOps<'a> {
    pub(crate) fn len(&self) -> usize {
        match self {
            ForwardOps::Decoded(ops) => ops.len(),
            ForwardOps::Wire(w) => w.len(),
        }
    }

    /// The type of op `k` (`""` when unset).
    pub(crate) fn op_type(&self, k: usize) -> &'a str {
        match self {
            ForwardOps::Decoded(ops) => ops[k].r#type(),
            ForwardOps::Wire(w) => w.types[k],
        }
    }

    /// Op `k` as an `OperatorDef`.
    pub(crate) fn op(&self, k: usize) -> Result<Cow<'a, OperatorDef>> {
        match self {
            ForwardOps::Decoded(ops) => Ok(Cow::Borrowed(&ops[k])),
            ForwardOps::Wire(w) => w.decode(k).map(Cow::Owned),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::proto::{encode, Argument, NetDef};

    #[test]
    fn scan_reads_names_and_the_last_type() {
        let mut op = OperatorDef::new("FC", ["x", "w", "b"], ["y"]);
        op.arg.push(Argument {
            name: Some("axis".into()),
            i: Some(1),
            ..Default::default()
        });
        let mut bytes = encode(&op);
        // A second `type` field: the last one wins, as when decoding.
        bytes.extend_from_slice(&[0x22, 0x01, b'Z']);
        let mut w = WireOps::operators(vec![&bytes]);
        let (mut ins, mut outs) = (Vec::new(), Vec::new());
        w.scan(0, &mut ins, &mut outs).unwrap();
        assert_eq!(ins, ["x", "w", "b"]);
        assert_eq!(outs, ["y"]);
        assert!(!w.names_only(0));
        let ops = ForwardOps::Wire(w);
        assert_eq!(ops.op_type(0), "Z");
        assert_eq!(ops.op(0).unwrap().r#type(), "Z");
    }

    #[test]
    fn names_only_ops_decode_as_protobuf_does() {
        let mut op = OperatorDef::new("Sum", ["a", "b", "é"], ["c"]);
        op.name = Some(String::new());
        let mut bytes = encode(&op);
        bytes.extend_from_slice(&[0x1a, 0x01, b'n', 0x0a, 0x01, b'd']); // name "n", input "d"
        let direct = decode_names_only(&bytes).unwrap();
        assert_eq!(direct, OperatorDef::decode(bytes.as_slice()).unwrap());
        assert_eq!(direct.input, ["a", "b", "é", "d"]);
        assert_eq!(direct.name(), "n");
        assert!(WireOps::operators(vec![&bytes]).names_only(0));
        for bad in [&[0x0a, 0x01, 0xff][..], &[0x08, 0x01], &[0x0a, 0x02, b'a']] {
            assert!(!WireOps::operators(vec![bad]).names_only(0));
        }
        // Anything else (an argument, a mistyped or malformed field) is left to protobuf.
        op.arg.push(Argument::default());
        assert!(decode_names_only(&encode(&op)).is_none());
        assert!(decode_names_only(&[0x08, 0x01]).is_none());
        assert!(decode_names_only(&[0x0a, 0x01, 0xff]).is_none());
        assert!(decode_names_only(&[0x0a, 0x02, b'a']).is_none());
        assert_eq!(decode_names_only(&[]), Some(OperatorDef::default()));
    }

    #[test]
    fn irregular_ops_are_not_scanned() {
        // `input` as a varint, invalid UTF-8, a truncated length, a group.
        for bad in [
            &[0x08, 0x01][..],
            &[0x0a, 0x01, 0xff],
            &[0x0a, 0x05, b'a'],
            &[0x2b, 0x2c],
        ] {
            let mut w = WireOps::operators(vec![bad]);
            assert!(w.scan(0, &mut Vec::new(), &mut Vec::new()).is_none());
        }
    }

    #[test]
    fn net_entries_decode_as_in_the_net() {
        let net = NetDef {
            op: vec![
                OperatorDef::new("Relu", ["a"], ["b"]),
                OperatorDef::new("Relu", ["b"], ["c"]),
            ],
            ..Default::default()
        };
        let bytes = encode(&net);
        let split = crate::graph::wire::op_entries(&bytes).unwrap();
        let items = split.ops.iter().map(|r| &bytes[r.clone()]).collect();
        let mut w = WireOps::net_entries(items);
        for k in 0..2 {
            let (mut ins, mut outs) = (Vec::new(), Vec::new());
            w.scan(k, &mut ins, &mut outs).unwrap();
            assert_eq!(outs.len(), 1);
        }
        let ops = ForwardOps::Wire(w);
        assert_eq!(ops.op(1).unwrap().into_owned(), net.op[1]);
        assert_eq!(ops.len(), 2);
    }
}
